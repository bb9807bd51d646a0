//! `view_sandbox`: one sandbox as the sandbox view (an MCP App) shows it.

use crate::access::caller::Caller;
use crate::ops::args::SandboxRef;
use crate::ops::error::OpsError;
use crate::ops::results::SandboxView;
use crate::ops::route::forward_if_elsewhere;
use crate::ops::Ops;

impl Ops {
    /// Its listing, its files (two levels, the default number of entries)
    /// and its recent calls.
    pub async fn view_sandbox(&self, caller: &Caller, args: SandboxRef) -> Result<SandboxView, OpsError> {
        forward_if_elsewhere!(self, caller, "view_sandbox", args, None);
        self.on_sandbox("view_sandbox", &args.sandbox_id, |id| async move {
            let (info, files, history) = tokio::try_join!(
                async { Ok(self.sandboxes.info(caller.scope(), id).await?) },
                self.listing(caller, id, "/app/results", None, None),
                async { Ok(self.sandboxes.history(caller.scope(), id).await?) },
            )?;
            Ok(SandboxView {
                sandbox: info.into(),
                files,
                history,
            })
        })
        .await
    }
}
