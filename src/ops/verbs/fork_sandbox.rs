//! `fork_sandbox`: new sandboxes made from one as it is, or from one of its
//! snapshots; counted as that many creations.

use sandbox_actors::MAX_FORKS;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::access::caller::Caller;
use crate::ops::args::{in_range, parse_snapshot_id};
use crate::ops::error::OpsError;
use crate::ops::results::ForkResult;
use crate::ops::route::forward_if_elsewhere;
use crate::ops::Ops;

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ForkSandbox {
    /// The sandbox_id of the sandbox to copy.
    pub sandbox_id: String,
    /// How many new sandboxes to make (1 to 16; default 1). Each counts
    /// against your sandbox quota.
    #[serde(default)]
    #[schemars(with = "u64")]
    pub count: Option<u64>,
    /// Copy this snapshot of the sandbox (from snapshot_sandbox or
    /// list_snapshots) instead of the sandbox as it is now.
    #[serde(default)]
    #[schemars(with = "String")]
    pub snapshot_id: Option<String>,
}

impl Ops {
    pub async fn fork_sandbox(&self, caller: &Caller, args: ForkSandbox) -> Result<ForkResult, OpsError> {
        forward_if_elsewhere!(self, caller, "fork_sandbox", args, None);
        self.on_sandbox("fork_sandbox", &args.sandbox_id, |id| async move {
            let count = in_range("count", args.count, 1, MAX_FORKS)?;
            let from = args.snapshot_id.as_deref().map(parse_snapshot_id).transpose()?;
            self.check_budget(caller)?;
            let owner = &caller.owner;
            if let Err(wait) = self.limits.check_creations(owner, count) {
                return Err(match wait {
                    Some(wait) => OpsError::RateLimited {
                        message: format!(
                            "a fork of {count} would pass the sandboxes you may create per minute; wait {} s, or fork fewer",
                            wait.seconds()
                        ),
                        retry_after: wait.seconds(),
                    },
                    None => OpsError::Refused(format!(
                        "a fork of {count} is more sandboxes than you may create in a minute; fork fewer"
                    )),
                });
            }
            self.check_cluster_room(caller, count as usize).await?;
            let started = std::time::Instant::now();
            let forked = self
                .sandboxes
                .fork(owner, id, count, from, self.quota(caller), self.create_options(caller))
                .await?;
            let ids: Vec<_> = forked.forks.iter().map(|f| f.info.sandbox_id).collect();
            self.enter_directory(caller, &ids).await?;
            Ok(ForkResult::new(id, from, forked, started.elapsed()))
        })
        .await
    }
}
