//! `install_package_in_sandbox`: a background install, waited for a while.

use std::time::Duration;

use crate::access::caller::Caller;
use crate::ops::args::PackageRef;
use crate::ops::error::OpsError;
use crate::ops::results::InstallResult;
use crate::ops::Ops;

/// How long an install request waits before answering `installing`
/// (unless it may become a task, which waits for the end).
pub const INSTALL_WAIT: Duration = Duration::from_secs(5);

impl Ops {
    pub async fn install_package_in_sandbox(
        &self,
        caller: &Caller,
        args: PackageRef,
        wait: Duration,
    ) -> Result<InstallResult, OpsError> {
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
