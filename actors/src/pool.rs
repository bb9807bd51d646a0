//! Making sandboxes, and keeping a few made ahead of demand.
//!
//! [`provision`] makes the container of a new sandbox (folders, package
//! volume, container). The warm [`Pool`] keeps `[pool] size` of them with the
//! agent answering and the Python worker started, owned by nobody;
//! `create_sandbox` claims one (recording owner and name only then: Docker
//! cannot relabel a container) and the pool refills in the background.
//! Pooled sandboxes are made under the server's egress policy; a claim may
//! switch a proxied one to another proxied policy (the proxy looks the
//! policy up per connection), anything else is created cold.
//! Pooled sandboxes have no record, so a restarted server removes them like
//! any unexplained container, and a stopped server removes them itself.

use std::collections::VecDeque;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use uuid::Uuid;

use crate::agent::{AgentClient, Work};
use crate::config::EgressPolicy;
use crate::context::Context;
use crate::error::{AgentFailure, Result, SandboxError};
use crate::link::wait_for_agent;
use crate::runtime::{ContainerRef, SANDBOX_UID};

/// A sandbox's container before it has an owner.
pub struct Provisioned {
    pub id: Uuid,
    pub container: ContainerRef,
    /// The warm pool's connection to the agent, kept only to notice that
    /// the container died while it waited (an engine restart, a kill).
    warm: Option<AgentClient>,
}

impl Provisioned {
    fn is_dead(&self) -> bool {
        self.warm.as_ref().is_some_and(AgentClient::is_closed)
    }
}

/// Creates a host folder that the sandbox user (not root) must write.
fn prepare_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    if let Err(e) = std::os::unix::fs::chown(dir, Some(SANDBOX_UID), Some(SANDBOX_UID)) {
        warn!(dir = %dir.display(), error = %e, "cannot hand a sandbox folder to the sandbox user (is the server root?)");
    }
    Ok(())
}

/// Makes the folders, egress proxy socket, capped file systems, package
/// volume and running container of a new sandbox under `egress`.
pub async fn provision(ctx: &Context, egress: EgressPolicy) -> Result<Provisioned> {
    // The pool does not refill while the host's disk is nearly full.
    crate::host::check_free_disk(&ctx.settings)?;
    let id = Uuid::new_v4();
    ctx.egress.attach(id, egress)?;
    let paths = ctx.paths(id);
    let made = async {
        for dir in [&paths.results, &paths.agent] {
            prepare_dir(dir).map_err(|e| SandboxError::Internal(format!("preparing {}: {e}", dir.display())))?;
        }
        ctx.disks.prepare(id).await?;
        ctx.runtime.create(&paths, None).await
    };
    match made.await {
        Ok(container) => Ok(Provisioned {
            id,
            container,
            warm: None,
        }),
        Err(e) => {
            remove_host_side(ctx, id).await;
            Err(e)
        }
    }
}

/// Removes a sandbox's capped file systems and folders (its container gone).
async fn remove_host_side(ctx: &Context, id: Uuid) {
    if let Err(e) = ctx.disks.remove(id).await {
        warn!(sandbox = %id, error = %e, "could not remove a sandbox's disks");
    }
    let paths = ctx.paths(id);
    let _ = std::fs::remove_dir_all(&paths.results);
    let _ = std::fs::remove_dir_all(&paths.agent);
    ctx.egress.detach(id);
}

/// How long the removal of a sandbox that was never handed out is retried
/// while the engine does not answer (it may be restarting): given up at
/// once, the container and its volume would outlive the server's stop.
const DISCARD_RETRY_FOR: Duration = Duration::from_secs(90);
const DISCARD_RETRY_EVERY: Duration = Duration::from_secs(2);

/// Removes a provisioned sandbox that was never handed out.
pub async fn discard(ctx: &Context, p: &Provisioned) {
    let until = tokio::time::Instant::now() + DISCARD_RETRY_FOR;
    loop {
        let removed = ctx
            .runtime
            .remove(&p.container.container_id, Some(&p.container.volume))
            .await;
        match removed {
            Ok(()) => break,
            Err(e) if tokio::time::Instant::now() + DISCARD_RETRY_EVERY < until => {
                warn!(sandbox = %p.id, error = %e, "could not remove a pooled sandbox; retrying");
                tokio::time::sleep(DISCARD_RETRY_EVERY).await;
            }
            Err(e) => {
                warn!(sandbox = %p.id, error = %e, "could not remove a pooled sandbox; the next start removes it");
                break;
            }
        }
    }
    remove_host_side(ctx, p.id).await;
}

/// Provisions a sandbox and waits until its worker is up, so that the first
/// call of its owner costs what any later call costs.
async fn provision_warm(ctx: &Context) -> Result<Provisioned> {
    let mut p = provision(ctx, ctx.egress.default_policy()).await?;
    let warmed = async {
        let mut client = wait_for_agent(ctx, p.id, &p.container.container_id).await?;
        let warm_up = Work::Python("pass".into());
        tokio::time::timeout(WARM_DEADLINE, client.run(&warm_up, 30.0, 1024, None))
            .await
            .map_err(|_| AgentFailure::WorkerDidNotStart)?
            .map_err(AgentFailure::from)?;
        Ok(client)
    };
    match warmed.await {
        Ok(client) => {
            p.warm = Some(client);
            Ok(p)
        }
        Err(e) => {
            discard(ctx, &p).await;
            Err(e)
        }
    }
}

/// How long a pooled sandbox's Python worker may take to start.
const WARM_DEADLINE: Duration = Duration::from_secs(30);
/// How often the pool looks for pooled sandboxes that died while waiting.
const PRUNE_EVERY: Duration = Duration::from_secs(5);

pub struct Pool {
    ctx: Arc<Context>,
    size: usize,
    ready: Mutex<VecDeque<Provisioned>>,
    wake: Notify,
    stop: CancellationToken,
    filler: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Pool {
    pub fn start(ctx: Arc<Context>, size: usize) -> Arc<Self> {
        let pool = Arc::new(Self {
            ctx,
            size,
            ready: Mutex::new(VecDeque::new()),
            wake: Notify::new(),
            stop: CancellationToken::new(),
            filler: Mutex::new(None),
        });
        if size > 0 {
            let handle = tokio::spawn(pool.clone().fill());
            *pool.filler.lock().expect("pool lock") = Some(handle);
        }
        pool
    }

    /// Takes a ready sandbox, if any, and asks for a replacement. One whose
    /// container died while it waited is thrown away, never handed out.
    pub fn take(self: &Arc<Self>) -> Option<Provisioned> {
        let taken = loop {
            let next = self.ready.lock().expect("pool lock").pop_front();
            match next {
                Some(p) if p.is_dead() => self.throw_away(p),
                other => break other,
            }
        };
        self.wake.notify_one();
        taken
    }

    fn throw_away(self: &Arc<Self>, p: Provisioned) {
        info!(sandbox = %p.id, "a pooled sandbox died while waiting; removing it");
        let pool = self.clone();
        tokio::spawn(async move { discard(&pool.ctx, &p).await });
    }

    /// Throws away pooled sandboxes that died while waiting.
    fn prune(self: &Arc<Self>) {
        let dead: Vec<Provisioned> = {
            let mut ready = self.ready.lock().expect("pool lock");
            let (dead, alive): (VecDeque<_>, VecDeque<_>) = ready.drain(..).partition(Provisioned::is_dead);
            *ready = alive;
            dead.into()
        };
        for p in dead {
            self.throw_away(p);
        }
    }

    pub fn ready(&self) -> usize {
        self.ready.lock().expect("pool lock").len()
    }

    async fn fill(self: Arc<Self>) {
        loop {
            while self.ready() < self.size && !self.stop.is_cancelled() {
                match provision_warm(&self.ctx).await {
                    Ok(p) if self.stop.is_cancelled() => discard(&self.ctx, &p).await,
                    Ok(p) => self.ready.lock().expect("pool lock").push_back(p),
                    Err(e) => {
                        warn!(error = %e, "could not fill the warm pool; retrying");
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                            _ = self.stop.cancelled() => return,
                        }
                    }
                }
            }
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(PRUNE_EVERY) => self.prune(),
                _ = self.stop.cancelled() => return,
            }
        }
    }

    /// Stops refilling and removes the sandboxes nobody claimed.
    pub async fn drain(&self) {
        self.stop.cancel();
        let filler = self.filler.lock().expect("pool lock").take();
        if let Some(handle) = filler {
            let _ = handle.await;
        }
        let left: Vec<Provisioned> = self.ready.lock().expect("pool lock").drain(..).collect();
        if !left.is_empty() {
            info!(count = left.len(), "removing unclaimed pooled sandboxes");
        }
        for p in &left {
            discard(&self.ctx, p).await;
        }
    }
}
