//! Deleting a sandbox: refusing what is queued, then removing its
//! container, volume, disks, folders and record.

use std::sync::Arc;
use std::time::Duration;

use ractor::{ActorRef, RpcReplyPort};
use tracing::warn;

use super::{fail_install, info, live_status, SandboxState};
use crate::context::Context;
use crate::error::{Result, SandboxError};
use crate::messages::SandboxMsg;
use crate::records::{InstallState, SandboxRecord};
use crate::usage::reading::Subject;

/// How long a delete waits for the job in flight to hand its link back
/// before it removes the container anyway.
const DELETE_GRACE: Duration = Duration::from_secs(2);

/// Where a delete (or an expiry) stands.
#[derive(Default)]
pub(super) struct Deletion {
    /// Callers waiting for the removal.
    pub(super) waiters: Vec<RpcReplyPort<Result<()>>>,
    /// A removal task is running.
    pub(super) removing: bool,
}

/// Marks the sandbox deleted and starts its removal: the job in flight ends
/// at once (its link is retired), queued calls are refused with `why`, and
/// the container goes after a short grace, whatever its agent does.
pub(super) fn begin_deletion(
    myself: &ActorRef<SandboxMsg>,
    state: &mut SandboxState,
    why: &str,
    reply: Option<RpcReplyPort<Result<()>>>,
) {
    let deletion = state.deletion.get_or_insert_with(Deletion::default);
    deletion.waiters.extend(reply);
    if deletion.removing {
        return;
    }
    if !state.retirement.is_retired() {
        tracing::info!(sandbox = %state.record.id, why, "deleting the sandbox");
        state.retirement.retire(why);
        let error = SandboxError::Ended {
            id: state.record.id,
            why: why.to_string(),
        };
        for waiting in state.queue.drain(..) {
            waiting.job.refuse(SandboxError::Ended {
                id: state.record.id,
                why: why.to_string(),
            });
        }
        for tx in state.installs.values() {
            if tx.borrow().status == InstallState::Installing {
                fail_install(tx, &error);
            }
        }
    }
    deletion.removing = true;
    state.record.deleting = true;
    let ctx = state.ctx.clone();
    let record = state.record.clone();
    let link_home = state.link.is_some();
    let me = myself.clone();
    // What it used since its last sample, read while its container is
    // still there.
    let subject = Subject {
        status: live_status(state),
        ..Subject::from(&info(state))
    };
    tokio::spawn(async move {
        ctx.read_usage(subject, true).await;
        // Durable first: a server killed during the removal finishes it at
        // its next start.
        let marked = ctx.store.put(record.clone()).await;
        if !link_home {
            tokio::time::sleep(DELETE_GRACE).await;
        }
        let result = match marked {
            Ok(()) => remove_everything(&ctx, &record).await,
            Err(e) => Err(e),
        };
        let _ = me.send_message(SandboxMsg::Removed(result.map_err(Arc::new)));
    });
}

/// Removes the sandbox's containers (its own and any installer, found by
/// their label, so a re-created container is never missed), its package
/// volume, its disks, its folders and its record. Removal kills: it never waits on
/// anything inside the sandbox.
pub async fn remove_everything(ctx: &Context, record: &SandboxRecord) -> Result<()> {
    let mut containers = ctx.runtime.sandbox_containers(record.id).await?;
    if !containers.contains(&record.container_id) {
        containers.push(record.container_id.clone());
    }
    for container in &containers {
        ctx.runtime.remove(container, None).await?;
    }
    ctx.runtime.remove_volume(&record.volume).await?;
    ctx.egress.detach(record.id);
    ctx.templates.detach(record.id);
    ctx.disks.remove(record.id).await?;
    if let Err(e) = ctx.snapshots.remove_all(record.id).await {
        warn!(sandbox = %record.id, error = %e, "could not remove a deleted sandbox's snapshots; the next start removes them");
    }
    let paths = ctx.paths(record.id);
    for dir in [&paths.results, &paths.agent] {
        if let Err(e) = tokio::fs::remove_dir_all(dir).await {
            if e.kind() != std::io::ErrorKind::NotFound {
                warn!(dir = %dir.display(), error = %e, "could not remove a sandbox folder");
            }
        }
    }
    ctx.store.delete(record.id).await
}
