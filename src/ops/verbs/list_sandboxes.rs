//! `list_sandboxes`: the caller's sandboxes (every tenant's for an
//! administrator).

use sandbox_actors::SandboxInfo;

use crate::access::caller::Caller;
use crate::ops::Ops;

impl Ops {
    pub async fn list_sandboxes(&self, caller: &Caller) -> Vec<SandboxInfo> {
        let listed = self
            .metrics
            .observe("list_sandboxes", None, async {
                Ok::<_, crate::ops::error::OpsError>(self.sandboxes.list(caller.scope()).await)
            })
            .await;
        listed.unwrap_or_default()
    }
}
