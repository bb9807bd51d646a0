//! `list_sandboxes`: the caller's sandboxes (every tenant's for an
//! administrator).

use sandbox_actors::SandboxInfo;

use crate::access::caller::Caller;
use crate::ops::results::ListedSandbox;
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

    /// The caller's sandboxes on every node of a cluster (those of nodes
    /// that do not answer, `unreachable`).
    pub async fn listed_sandboxes(&self, caller: &Caller) -> Vec<ListedSandbox> {
        let mut listed: Vec<ListedSandbox> = self.list_sandboxes(caller).await.into_iter().map(Into::into).collect();
        let (theirs, silent) = self
            .listed_on_other_nodes::<Vec<ListedSandbox>>("list_sandboxes", caller)
            .await;
        listed.extend(theirs.into_iter().flatten());
        let ids: Vec<&str> = listed.iter().map(|s| s.sandbox_id.as_str()).collect();
        let missing = self.unreachable_of(caller, &ids, silent).await;
        listed.extend(missing);
        listed
    }
}
