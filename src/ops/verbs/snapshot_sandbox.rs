//! `snapshot_sandbox`: the sandbox's Python state, files and packages
//! saved, in turn with its other calls.

use sandbox_actors::snapshots::PythonState;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::access::caller::Caller;
use crate::ops::error::OpsError;
use crate::ops::results::SnapshotResult;
use crate::ops::route::forward_if_elsewhere;
use crate::ops::timestamps::millis;
use crate::ops::Ops;

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct SnapshotSandbox {
    /// The sandbox_id returned by create_sandbox.
    pub sandbox_id: String,
    /// A few words to recognise the snapshot by (optional).
    #[serde(default)]
    #[schemars(with = "String")]
    pub label: Option<String>,
}

impl Ops {
    pub async fn snapshot_sandbox(&self, caller: &Caller, args: SnapshotSandbox) -> Result<SnapshotResult, OpsError> {
        forward_if_elsewhere!(self, caller, "snapshot_sandbox", args, None);
        self.on_sandbox("snapshot_sandbox", &args.sandbox_id, |id| async move {
            self.check_budget(caller)?;
            let started = std::time::Instant::now();
            let (info, notice) = self.sandboxes.snapshot(caller.scope(), id, args.label).await?;
            let message = match info.python {
                PythonState::Parked => "Saved the Python state, the files in /app/results",
                _ => "No Python had run yet (a restore starts Python afresh); saved the files in /app/results",
            };
            let packages = if info.packages() {
                " and the installed packages"
            } else {
                ""
            };
            Ok(SnapshotResult {
                success: true,
                sandbox_id: id.to_string(),
                message: format!("{message}{packages}. restore_snapshot with this snapshot_id brings them back."),
                snapshot: info.into(),
                duration_ms: millis(started.elapsed()),
                notice,
            })
        })
        .await
    }
}
