//! `check_package_installation_status`: where an install stands, or
//! whether the package is there at all.

use sandbox_actors::InstallStatusKind;

use crate::access::caller::Caller;
use crate::ops::args::PackageRef;
use crate::ops::error::OpsError;
use crate::ops::results::InstallResult;
use crate::ops::route::forward_if_elsewhere;
use crate::ops::Ops;

impl Ops {
    pub async fn check_package_installation_status(
        &self,
        caller: &Caller,
        args: PackageRef,
    ) -> Result<InstallResult, OpsError> {
        forward_if_elsewhere!(self, caller, "check_package_installation_status", args, None);
        self.on_sandbox("check_package_installation_status", &args.sandbox_id, |id| async move {
            let mut status = self
                .sandboxes
                .install_status(caller.scope(), id, &args.package_name)
                .await?;
            if status.status == InstallStatusKind::NotFound {
                status.message.push_str(" Install it with install_package_in_sandbox.");
            }
            Ok(InstallResult::from(status))
        })
        .await
    }
}
