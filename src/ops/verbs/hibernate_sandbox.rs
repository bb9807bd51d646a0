//! `hibernate_sandbox`: the sandbox sleeps on disk at once, in turn with
//! its other calls, as it would after `sandbox.hibernate_after_seconds`
//! idle; its next call wakes it.

use crate::access::caller::Caller;
use crate::ops::args::SandboxRef;
use crate::ops::error::OpsError;
use crate::ops::results::HibernateResult;
use crate::ops::route::forward_if_elsewhere;
use crate::ops::Ops;

impl Ops {
    pub async fn hibernate_sandbox(&self, caller: &Caller, args: SandboxRef) -> Result<HibernateResult, OpsError> {
        forward_if_elsewhere!(self, caller, "hibernate_sandbox", args, None);
        self.on_sandbox("hibernate_sandbox", &args.sandbox_id, |id| async move {
            let started = std::time::Instant::now();
            let slept = self.sandboxes.hibernate(caller.scope(), id).await?;
            Ok(HibernateResult::new(id, slept, started.elapsed()))
        })
        .await
    }
}
