//! `install_package_in_sandbox`: a background install, waited for a while.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::access::caller::Caller;
use crate::ops::args::PackageRef;
use crate::ops::error::OpsError;
use crate::ops::results::InstallResult;
use crate::ops::route::Holder;
use crate::ops::Ops;

/// How long an install request waits before answering `installing`
/// (unless it may become a task, which waits for the end).
pub const INSTALL_WAIT: Duration = Duration::from_secs(5);

/// An install as another node forwards it: the package and how long the
/// caller waits.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ForwardedInstall {
    #[serde(flatten)]
    pub args: PackageRef,
    pub wait_ms: u64,
}

impl Ops {
    pub async fn install_package_in_sandbox(
        &self,
        caller: &Caller,
        args: PackageRef,
        wait: Duration,
    ) -> Result<InstallResult, OpsError> {
        if let Holder::Node { name, url } = self.holder(caller, &args.sandbox_id).await? {
            let forwarded = ForwardedInstall {
                args,
                wait_ms: wait.as_millis() as u64,
            };
            return self
                .forward((&name, &url), "install_package_in_sandbox", caller, &forwarded, None)
                .await;
        }
        self.on_sandbox("install_package_in_sandbox", &args.sandbox_id, |id| async move {
            self.check_budget(caller)?;
            let status = self
                .sandboxes
                .install(caller.scope(), id, &args.package_name, wait)
                .await?;
            Ok(InstallResult::from(status))
        })
        .await
    }
}
