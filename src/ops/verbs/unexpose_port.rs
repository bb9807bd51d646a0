//! `unexpose_port`: every link to a port of the sandbox stops working.

use crate::access::caller::Caller;
use crate::ops::error::OpsError;
use crate::ops::processes::PreviewResult;
use crate::ops::route::forward_if_elsewhere;
use crate::ops::verbs::expose_port::ExposePort;
use crate::ops::Ops;

impl Ops {
    pub async fn unexpose_port(&self, caller: &Caller, args: ExposePort) -> Result<PreviewResult, OpsError> {
        forward_if_elsewhere!(self, caller, "unexpose_port", args, None);
        self.on_sandbox("unexpose_port", &args.sandbox_id, |id| async move {
            let exposed_ports = self.sandboxes.expose_port(caller.scope(), id, args.port, false).await?;
            Ok(PreviewResult {
                success: true,
                sandbox_id: id.to_string(),
                port: args.port,
                url: None,
                expires_at: None,
                exposed_ports,
                message: format!("Links to port {} no longer open anything.", args.port),
            })
        })
        .await
    }
}
