//! `delete_sandbox`: the container, its packages and its files removed.

use crate::access::caller::Caller;
use crate::ops::args::SandboxRef;
use crate::ops::error::OpsError;
use crate::ops::results::DeleteResult;
use crate::ops::route::forward_if_elsewhere;
use crate::ops::Ops;

impl Ops {
    pub async fn delete_sandbox(&self, caller: &Caller, args: SandboxRef) -> Result<DeleteResult, OpsError> {
        forward_if_elsewhere!(self, caller, "delete_sandbox", args, None);
        self.on_sandbox("delete_sandbox", &args.sandbox_id, |id| async move {
            self.sandboxes.delete(caller.scope(), id).await?;
            self.leave_directory(id).await;
            Ok(DeleteResult {
                success: true,
                sandbox_id: id.to_string(),
                message: format!("Sandbox {id} deleted"),
            })
        })
        .await
    }
}
