//! The cluster's directory as the operations use it (only with a
//! `[cluster]` section): a new sandbox enters it before its creation is
//! acknowledged, within its tenant's and the cluster's quotas counted over
//! every node (hibernated sandboxes left out); a deleted one leaves it; and
//! [`keep_in_step`] brings it back in line with the sandboxes this node
//! holds (those that expired or went idle leave it, any this node holds that
//! it lacks enter it, and each is marked asleep or awake as it is).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use sandbox_actors::{Held, SandboxError, Scope};
use sandbox_cluster::{Cluster, ClusterError, Entry};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use uuid::Uuid;

use crate::access::caller::Caller;
use crate::ops::error::OpsError;
use crate::ops::Ops;

/// How often the directory is checked against this node's sandboxes.
const IN_STEP_EVERY: Duration = Duration::from_secs(5);

impl Ops {
    /// Refuses a creation of `asked` sandboxes this node may not make now:
    /// it is cut off from the cluster, or the tenant or the cluster is at
    /// its quota on every node together.
    pub(super) async fn check_cluster_room(&self, caller: &Caller, asked: usize) -> Result<(), OpsError> {
        let Some(cluster) = &self.cluster else {
            return Ok(());
        };
        cluster.check_held()?;
        self.check_counts(cluster, caller, asked, 0).await
    }

    /// Refuses `asked` sandboxes of `caller`'s past its quota or the
    /// cluster's, counted in the directory, which holds `claimed` of them
    /// already.
    async fn check_counts(
        &self,
        cluster: &Cluster,
        caller: &Caller,
        asked: usize,
        claimed: usize,
    ) -> Result<(), OpsError> {
        let quota = self.quota(caller);
        let have = (cluster.directory.count_of_tenant(&caller.owner).await? as usize).saturating_sub(claimed);
        if have + asked > quota.per_owner {
            return Err(SandboxError::TooMany {
                have,
                most: quota.per_owner,
                asked,
            }
            .into());
        }
        let all = (cluster.directory.count().await? as usize).saturating_sub(claimed);
        if all + asked > quota.total {
            return Err(SandboxError::Quota(format!(
                "the cluster holds the most sandboxes it may ({}, limits.max_sandboxes_total); try again later",
                quota.total
            ))
            .into());
        }
        Ok(())
    }

    /// Enters new sandboxes in the directory. Past the quotas (creations on
    /// other nodes at the same moment) or without etcd, they are deleted
    /// and the creation is refused: nothing unacknowledged stays.
    pub(super) async fn enter_directory(&self, caller: &Caller, ids: &[Uuid]) -> Result<(), OpsError> {
        let Some(cluster) = &self.cluster else {
            return Ok(());
        };
        let entered = self.claim_all(cluster, caller, ids).await;
        if entered.is_err() {
            for &id in ids {
                if let Err(e) = cluster.directory.release(id, &cluster.config.node_name).await {
                    warn!(sandbox = %id, error = %e, "could not take a refused sandbox out of the directory; it is retried");
                }
                if let Err(e) = self.sandboxes.delete(Scope::Everyone, id).await {
                    warn!(sandbox = %id, error = %e, "could not delete a sandbox the directory refused");
                }
            }
        }
        entered
    }

    async fn claim_all(&self, cluster: &Cluster, caller: &Caller, ids: &[Uuid]) -> Result<(), OpsError> {
        let entry = Entry {
            node: cluster.config.node_name.clone(),
            tenant: caller.owner.clone(),
        };
        for &id in ids {
            cluster.directory.claim(id, &entry).await?;
        }
        // Counted again after the claims: two nodes creating at once both
        // see the other's, so neither passes the quota.
        self.check_counts(cluster, caller, ids.len(), ids.len()).await
    }

    /// Takes a deleted sandbox out of the directory; if etcd does not
    /// answer now, [`keep_in_step`] does it later.
    pub(super) async fn leave_directory(&self, id: Uuid) {
        if let Some(cluster) = &self.cluster {
            if let Err(e) = cluster.directory.release(id, &cluster.config.node_name).await {
                warn!(sandbox = %id, error = %e, "could not take a deleted sandbox out of the directory; it is retried");
            }
        }
    }
}

impl From<ClusterError> for OpsError {
    fn from(e: ClusterError) -> Self {
        OpsError::Cluster(e)
    }
}

/// Keeps the directory's entries for this node in line with the sandboxes
/// it holds, until `stop`.
pub async fn keep_in_step(ops: Ops, cluster: Arc<Cluster>, stop: CancellationToken) {
    let node = cluster.config.node_name.clone();
    // What this node marked asleep, read from etcd once (and again after a
    // failure), then kept as it marks.
    let mut marked: Option<HashSet<Uuid>> = None;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(IN_STEP_EVERY) => {}
        }
        if !cluster.membership.holds() {
            continue;
        }
        let listed = match cluster.directory.held_by(&node).await {
            Ok(listed) => listed,
            Err(e) => {
                warn!(error = %e, "could not read this node's sandboxes from the directory");
                continue;
            }
        };
        // Sets, not lists: a node may hold thousands of sandboxes, most asleep.
        let listed: HashSet<Uuid> = listed.into_iter().collect();
        let held = ops.sandboxes.held();
        let ids: HashSet<Uuid> = held.iter().map(|h| h.id).collect();
        for id in listed.difference(&ids) {
            info!(sandbox = %id, "a sandbox this node no longer holds leaves the directory");
            ops.leave_directory(*id).await;
        }
        for h in held.iter().filter(|h| !listed.contains(&h.id)) {
            match cluster.directory.claim(h.id, &entry(&node, h)).await {
                Ok(()) => info!(sandbox = %h.id, "a sandbox this node holds enters the directory"),
                Err(e) => warn!(sandbox = %h.id, error = %e, "a sandbox this node holds is not in the directory"),
            }
        }
        mark_sleepers(&cluster, &node, &held, &ids, &mut marked).await;
    }
}

/// The directory's entry of a sandbox this node holds.
fn entry(node: &str, held: &Held) -> Entry {
    Entry {
        node: node.to_string(),
        tenant: held.owner.clone(),
    }
}

/// Marks this node's hibernated sandboxes asleep in the directory, and the
/// woken ones awake, so that the quotas over every node count live
/// sandboxes only (within [`IN_STEP_EVERY`] of a change). `marked` is what
/// this node marked: read from etcd when unknown, forgotten when a mark
/// fails, so that the next round reads it again. `ids`: those of `held`.
async fn mark_sleepers(
    cluster: &Cluster,
    node: &str,
    held: &[Held],
    ids: &HashSet<Uuid>,
    marked: &mut Option<HashSet<Uuid>>,
) {
    let known = match marked.take() {
        Some(known) => known,
        None => match cluster.directory.asleep_on(node).await {
            Ok(read) => read.into_iter().collect(),
            Err(e) => {
                warn!(error = %e, "could not read this node's hibernated sandboxes from the directory");
                return;
            }
        },
    };
    // A deleted sandbox's mark went with its entry.
    let mut known: HashSet<Uuid> = known.into_iter().filter(|id| ids.contains(id)).collect();
    let changed: Vec<&Held> = held.iter().filter(|h| h.asleep != known.contains(&h.id)).collect();
    for h in changed {
        match cluster.directory.mark_asleep(h.id, &entry(node, h), h.asleep).await {
            Ok(true) if h.asleep => drop(known.insert(h.id)),
            Ok(true) => drop(known.remove(&h.id)),
            // Its entry is not (yet) this node's: tried again next round.
            Ok(false) => {}
            Err(e) => {
                warn!(sandbox = %h.id, error = %e, "could not mark a sandbox asleep or awake in the directory");
                return;
            }
        }
    }
    *marked = Some(known);
}
