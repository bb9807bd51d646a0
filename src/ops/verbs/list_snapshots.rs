//! `list_snapshots`: a sandbox's snapshots, oldest first.

use crate::access::caller::Caller;
use crate::ops::args::SandboxRef;
use crate::ops::error::OpsError;
use crate::ops::results::SnapshotList;
use crate::ops::route::forward_if_elsewhere;
use crate::ops::Ops;

impl Ops {
    pub async fn list_snapshots(&self, caller: &Caller, args: SandboxRef) -> Result<SnapshotList, OpsError> {
        forward_if_elsewhere!(self, caller, "list_snapshots", args, None);
        self.on_sandbox("list_snapshots", &args.sandbox_id, |id| async move {
            let snapshots = self.sandboxes.list_snapshots(caller.scope(), id).await?;
            Ok(SnapshotList {
                sandbox_id: id.to_string(),
                snapshots: snapshots.into_iter().map(Into::into).collect(),
                limit: self.sandboxes.snapshot_limit(),
            })
        })
        .await
    }
}
