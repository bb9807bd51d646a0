//! `restart_sandbox` (REST and the web UI): the sandbox's container
//! started afresh, its files and packages kept.

use sandbox_actors::SandboxInfo;

use crate::access::caller::Caller;
use crate::ops::args::SandboxRef;
use crate::ops::error::OpsError;
use crate::ops::route::forward_if_elsewhere;
use crate::ops::Ops;

impl Ops {
    pub async fn restart_sandbox(&self, caller: &Caller, args: SandboxRef) -> Result<SandboxInfo, OpsError> {
        forward_if_elsewhere!(self, caller, "restart_sandbox", args, None);
        self.on_sandbox("restart_sandbox", &args.sandbox_id, |id| async move {
            self.check_budget(caller)?;
            Ok(self.sandboxes.restart(caller.scope(), id).await?)
        })
        .await
    }
}
