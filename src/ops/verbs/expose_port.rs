//! `expose_port`: a link that reaches a port inside the sandbox, through
//! the server and the sandbox's agent (see `http::preview`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::access::caller::Caller;
use crate::access::preview_links::Target;
use crate::ops::error::OpsError;
use crate::ops::processes::PreviewResult;
use crate::ops::route::forward_if_elsewhere;
use crate::ops::timestamps::rfc3339;
use crate::ops::Ops;

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ExposePort {
    /// The sandbox_id returned by create_sandbox.
    pub sandbox_id: String,
    /// The TCP port a server inside the sandbox listens on (on any address, 127.0.0.1 included).
    pub port: u16,
}

impl Ops {
    pub async fn expose_port(&self, caller: &Caller, args: ExposePort) -> Result<PreviewResult, OpsError> {
        forward_if_elsewhere!(self, caller, "expose_port", args, None);
        self.on_sandbox("expose_port", &args.sandbox_id, |id| async move {
            let Some(previews) = &self.previews else {
                return Err(OpsError::Refused(
                    "preview links are served by the HTTP server; this one (stdio) has none".into(),
                ));
            };
            // A public demo's guests would make the operator's domain a free
            // host of anything.
            if caller.expires_at.is_some() {
                return Err(OpsError::Refused("guest keys get no preview links".into()));
            }
            if args.port == 0 {
                return Err(OpsError::InvalidArgument("port must be from 1 to 65535".into()));
            }
            let exposed_ports = self.sandboxes.expose_port(caller.scope(), id, args.port, true).await?;
            let link = previews.link(Target {
                sandbox: id,
                port: args.port,
            });
            Ok(PreviewResult {
                success: true,
                sandbox_id: id.to_string(),
                port: args.port,
                message: format!(
                    "Port {} is reachable at the url until {} (expose_port again for a fresh link); it answers 502 \
                     while nothing listens there. unexpose_port ends it.",
                    args.port,
                    rfc3339(link.expires_at)
                ),
                url: Some(link.url),
                expires_at: Some(rfc3339(link.expires_at)),
                exposed_ports,
            })
        })
        .await
    }
}
