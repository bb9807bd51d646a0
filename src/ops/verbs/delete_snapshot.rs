//! `delete_snapshot`: one snapshot freed; the sandbox itself unchanged.

use crate::access::caller::Caller;
use crate::ops::args::{parse_snapshot_id, SnapshotRef};
use crate::ops::error::OpsError;
use crate::ops::results::SnapshotDeleted;
use crate::ops::route::forward_if_elsewhere;
use crate::ops::Ops;

impl Ops {
    pub async fn delete_snapshot(&self, caller: &Caller, args: SnapshotRef) -> Result<SnapshotDeleted, OpsError> {
        forward_if_elsewhere!(self, caller, "delete_snapshot", args, None);
        self.on_sandbox("delete_snapshot", &args.sandbox_id, |id| async move {
            let snapshot = parse_snapshot_id(&args.snapshot_id)?;
            self.sandboxes.delete_snapshot(caller.scope(), id, snapshot).await?;
            Ok(SnapshotDeleted {
                success: true,
                snapshot_id: snapshot.to_string(),
                message: format!("Snapshot {snapshot} deleted"),
            })
        })
        .await
    }
}
