//! Reconciliation, at start and at a clean stop: what the records say
//! against what the engine and the host's folders hold.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use tracing::{info, warn};
use uuid::Uuid;

use crate::error::Result;
use crate::moment;
use crate::records::{InstallState, SandboxRecord};
use crate::registry::{Registered, Slot};
use crate::sandbox::{remove_everything, Rested};
use crate::templates::disk_sizes;
use sandbox_runtime::ContainerState;

use super::Sandboxes;

impl Sandboxes {
    /// Adopts sandboxes of an earlier run, removes expired ones, and removes
    /// labelled containers, volumes and folders that no record explains.
    pub(super) async fn reconcile(&self) -> Result<()> {
        let now = moment::now();
        // Sandbox → its current container; anything else labelled is a
        // leftover (an installer, a container replaced by a re-creation).
        let mut known: HashMap<Uuid, String> = HashMap::new();
        // One object that cannot be removed now (the engine is still busy
        // with a removal the previous server began, say) never stops the
        // start: it is logged, and a deleted sandbox's actor retries.
        for mut record in self.ctx.store.all().await? {
            if record.deleting || record.seeding.is_some() || record.expires_at.is_some_and(|t| t <= now) {
                info!(
                    sandbox = %record.id, deleting = record.deleting, unfinished_fork = ?record.seeding,
                    "removing a deleted or expired sandbox, or a fork that never answered"
                );
                match remove_everything(&self.ctx, &record).await {
                    Ok(()) => continue,
                    Err(e) => {
                        warn!(sandbox = %record.id, error = %e, "could not remove a deleted sandbox yet; retrying");
                        record.deleting = true;
                    }
                }
            }
            known.insert(record.id, current_container(&record));
            // Made again from its own template's image, whatever the
            // configuration says by now.
            let template = record.template.as_ref().map(|t| self.ctx.templates.current(t));
            self.ctx.templates.attach(record.id, template);
            // One asleep on disk gets its proxy and its mounts when it
            // wakes; a sleep the last server did not finish is finished
            // (a container it left is one no record explains).
            match record.hibernated {
                Some(_) => self.unmount_asleep(&record).await,
                None => {
                    let egress = record.egress.unwrap_or(self.ctx.egress.default_policy());
                    self.ctx.egress.attach(record.id, egress)?;
                    self.remount(&record).await?;
                }
            }
            if dormant(&record) {
                self.registry.write().expect("registry lock").insert(
                    record.id,
                    Registered {
                        owner: record.owner,
                        asleep: Arc::new(AtomicBool::new(true)),
                        slot: Slot::Dormant(Box::new(Rested::adopted(record.expires_at))),
                    },
                );
            } else {
                self.spawn(record).await?;
            }
        }
        self.remove_unexplained(&known).await?;
        info!(
            server_id = %self.server_id,
            adopted = known.len(),
            "reconciled sandbox records with Docker"
        );
        Ok(())
    }

    /// At a clean stop, once the actors have stopped: removes what no record
    /// explains, as the next start would. A creation whose answer the
    /// engine lost (it restarted mid-call) can leave a container and volume
    /// that nothing else knows of; the server leaves nothing of its own.
    pub(super) async fn sweep(&self) -> Result<()> {
        let known = self
            .ctx
            .store
            .all()
            .await?
            .into_iter()
            .map(|r| (r.id, current_container(&r)))
            .collect();
        self.remove_unexplained(&known).await
    }

    /// Removes labelled containers, volumes, disks, snapshots and folders
    /// of sandboxes not in `known` (sandbox → its current container), and
    /// containers of known sandboxes that are not their current one.
    async fn remove_unexplained(&self, known: &HashMap<Uuid, String>) -> Result<()> {
        let runtime = &self.ctx.runtime;
        for c in runtime.list_containers().await? {
            if c.sandbox.is_none_or(|id| known.get(&id) != Some(&c.id)) {
                info!(container = %c.id, "removing a container no record explains");
                if let Err(e) = runtime.remove(&c.id, None).await {
                    warn!(container = %c.id, error = %e, "could not remove a leftover container; the next start tries again");
                }
            }
        }
        for v in runtime.list_volumes().await? {
            if !v.sandbox.is_some_and(|id| known.contains_key(&id)) {
                info!(volume = %v.id, "removing a volume no record explains");
                if let Err(e) = runtime.remove_volume(&v.id).await {
                    warn!(volume = %v.id, error = %e, "could not remove a leftover volume; the next start tries again");
                }
            }
        }
        let known_ids = known.keys().copied().collect();
        self.ctx.disks.remove_orphans(&known_ids).await;
        self.ctx.snapshots.remove_orphans(&known_ids).await;
        self.ctx.snapshots.remove_exports().await;
        let s = &self.ctx.settings;
        for dir in [s.agents_dir(), s.state_dir.join("egress"), s.results_dir.clone()] {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let orphan =
                    Uuid::parse_str(&entry.file_name().to_string_lossy()).is_ok_and(|id| !known.contains_key(&id));
                if orphan {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        Ok(())
    }

    /// Unmounts what a sleeping sandbox may still have mounted when the
    /// server that put it to sleep was killed half-way.
    async fn unmount_asleep(&self, record: &SandboxRecord) {
        if let Err(e) = self.ctx.disks.release(record.id).await {
            warn!(sandbox = %record.id, error = %e, "could not unmount a sleeping sandbox's disks");
        }
    }

    /// Mounts an adopted sandbox's capped file systems again where they are
    /// missing (after a host reboot); a container that kept running on the
    /// bare folders meanwhile is restarted onto them.
    async fn remount(&self, record: &SandboxRecord) -> Result<()> {
        let sizes = disk_sizes(record.template.as_ref());
        if self.ctx.disks.ensure(record.id, sizes).await? {
            info!(sandbox = %record.id, "mounted the sandbox's disks again");
            if self.ctx.runtime.state(&record.container_id).await? == ContainerState::Running {
                self.ctx.runtime.restart(&record.container_id).await?;
            }
        }
        Ok(())
    }
}

/// Whether an adopted sandbox needs no actor until its next call: asleep,
/// with nothing an actor must finish (a deletion, an install the last
/// server did not end).
fn dormant(record: &SandboxRecord) -> bool {
    record.hibernated.is_some()
        && !record.deleting
        && record.installs.values().all(|i| i.status != InstallState::Installing)
}

/// The container a record's sandbox runs in: none while it sleeps, so that
/// one a killed server left behind is removed as unexplained.
fn current_container(record: &SandboxRecord) -> String {
    match record.hibernated {
        Some(_) => String::new(),
        None => record.container_id.clone(),
    }
}
