//! Snapshots of a sandbox: taken, restored and deleted in turn with its
//! other calls (queued to its actor), listed from the host's store.

use uuid::Uuid;

use crate::error::{Result, SandboxError};
use crate::messages::{Queued, SandboxMsg};
use crate::scope::Scope;
use crate::snapshots::{Restored, SnapshotDone, SnapshotInfo, SnapshotOp, MAX_LABEL};

use super::Sandboxes;

impl Sandboxes {
    /// Saves the sandbox's Python state, files and packages as a snapshot,
    /// in turn with its other calls; answers with a notice, if any.
    pub async fn snapshot<'a>(
        &self,
        scope: impl Into<Scope<'a>>,
        id: Uuid,
        label: Option<String>,
    ) -> Result<(SnapshotInfo, Option<String>)> {
        if let Some(label) = &label {
            if label.chars().count() > MAX_LABEL || label.chars().any(char::is_control) {
                return Err(SandboxError::InvalidArgument(format!(
                    "label: at most {MAX_LABEL} characters, none of them control characters"
                )));
            }
        }
        match self.snapshot_op(scope.into(), id, SnapshotOp::Take { label }).await? {
            (SnapshotDone::Taken(info), notice) => Ok((info, notice)),
            (other, _) => Err(unexpected(other)),
        }
    }

    /// Brings back a snapshot's Python state, files and packages, in turn
    /// with the sandbox's other calls.
    pub async fn restore_snapshot<'a>(
        &self,
        scope: impl Into<Scope<'a>>,
        id: Uuid,
        snapshot: Uuid,
    ) -> Result<(Restored, Option<String>)> {
        match self
            .snapshot_op(scope.into(), id, SnapshotOp::Restore { snapshot })
            .await?
        {
            (SnapshotDone::Restored(restored), notice) => Ok((restored, notice)),
            (other, _) => Err(unexpected(other)),
        }
    }

    /// Drops a snapshot: its parked Python state and its copies of the files.
    pub async fn delete_snapshot<'a>(&self, scope: impl Into<Scope<'a>>, id: Uuid, snapshot: Uuid) -> Result<()> {
        match self
            .snapshot_op(scope.into(), id, SnapshotOp::Delete { snapshot })
            .await?
        {
            (SnapshotDone::Deleted, _) => Ok(()),
            (other, _) => Err(unexpected(other)),
        }
    }

    /// A sandbox's snapshots, oldest first.
    pub async fn list_snapshots<'a>(&self, scope: impl Into<Scope<'a>>, id: Uuid) -> Result<Vec<SnapshotInfo>> {
        // A sleeping sandbox's store is unmounted: it is woken first.
        self.ask(scope.into(), id, None, SandboxMsg::Awake).await??;
        let store = self.ctx.snapshots.clone();
        tokio::task::spawn_blocking(move || store.list(id))
            .await
            .map_err(|e| SandboxError::Internal(e.to_string()))
    }

    /// How many snapshots a sandbox may keep (0: snapshots are off).
    pub fn snapshot_limit(&self) -> usize {
        self.ctx.settings.sandbox.snapshots_per_sandbox
    }

    async fn snapshot_op(&self, scope: Scope<'_>, id: Uuid, op: SnapshotOp) -> Result<(SnapshotDone, Option<String>)> {
        self.ask(scope, id, None, |reply| {
            SandboxMsg::Queued(Queued::Snapshot { op, reply })
        })
        .await?
    }
}

/// A snapshot job that answered for another operation than it was asked.
pub(super) fn unexpected(done: SnapshotDone) -> SandboxError {
    SandboxError::Internal(format!("a snapshot job answered {done:?}"))
}
