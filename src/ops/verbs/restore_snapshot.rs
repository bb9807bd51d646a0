//! `restore_snapshot`: a snapshot brought back, in turn with the sandbox's
//! other calls.

use sandbox_actors::snapshots::PythonState;

use crate::access::caller::Caller;
use crate::ops::args::{parse_snapshot_id, SnapshotRef};
use crate::ops::error::OpsError;
use crate::ops::results::RestoreResult;
use crate::ops::route::forward_if_elsewhere;
use crate::ops::timestamps::millis;
use crate::ops::Ops;

impl Ops {
    pub async fn restore_snapshot(&self, caller: &Caller, args: SnapshotRef) -> Result<RestoreResult, OpsError> {
        forward_if_elsewhere!(self, caller, "restore_snapshot", args, None);
        self.on_sandbox("restore_snapshot", &args.sandbox_id, |id| async move {
            let snapshot = parse_snapshot_id(&args.snapshot_id)?;
            self.check_budget(caller)?;
            let started = std::time::Instant::now();
            let (restored, notice) = self.sandboxes.restore_snapshot(caller.scope(), id, snapshot).await?;
            let (python, message) = match restored.python {
                PythonState::Restored => ("restored", "Python variables and imports,"),
                PythonState::Lost => ("lost", "Python starts afresh (see notice);"),
                _ => ("fresh", "Python starts afresh, as it was when the snapshot was taken;"),
            };
            let packages = match restored.packages {
                true => "files in /app/results and installed packages are",
                false => "files in /app/results are",
            };
            Ok(RestoreResult {
                success: true,
                sandbox_id: id.to_string(),
                snapshot_id: snapshot.to_string(),
                python: python.into(),
                packages_restored: restored.packages,
                message: format!("{message} {packages} as they were at the snapshot."),
                duration_ms: millis(started.elapsed()),
                notice,
            })
        })
        .await
    }
}
