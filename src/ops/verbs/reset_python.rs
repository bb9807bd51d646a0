//! `reset_python`: a fresh Python namespace, in turn with the sandbox's
//! other calls.

use crate::access::caller::Caller;
use crate::ops::args::SandboxRef;
use crate::ops::error::OpsError;
use crate::ops::results::ResetResult;
use crate::ops::route::forward_if_elsewhere;
use crate::ops::timestamps::millis;
use crate::ops::Ops;

impl Ops {
    pub async fn reset_python(&self, caller: &Caller, args: SandboxRef) -> Result<ResetResult, OpsError> {
        forward_if_elsewhere!(self, caller, "reset_python", args, None);
        self.on_sandbox("reset_python", &args.sandbox_id, |id| async move {
            let started = std::time::Instant::now();
            let notice = self.sandboxes.reset_python(caller.scope(), id).await?;
            Ok(ResetResult {
                success: true,
                message: "Python was reset: variables and imports are gone; files and installed packages are kept."
                    .into(),
                duration_ms: millis(started.elapsed()),
                notice,
            })
        })
        .await
    }
}
