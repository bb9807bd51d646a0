//! `GET /api/sandboxes[/{id}]` (REST and the web UI): the caller's
//! sandboxes as `list_sandboxes` lists them, with their owner for
//! administrators and what they use; one of them with its recent calls.

use sandbox_actors::{CallRecord, SandboxInfo, Usage};
use serde::{Deserialize, Serialize};

use crate::access::caller::Caller;
use crate::ops::args::{parse_id, SandboxRef};
use crate::ops::error::OpsError;
use crate::ops::results::ListedSandbox;
use crate::ops::route::forward_if_elsewhere;
use crate::ops::Ops;

/// A sandbox as the API shows it: what `list_sandboxes` says, its owner for
/// administrators, and its CPU and memory use (absent when Docker could
/// not say).
#[derive(Serialize, Deserialize)]
pub struct ShownSandbox {
    #[serde(flatten)]
    pub(crate) listed: ListedSandbox,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
    usage: Option<Usage>,
}

#[derive(Serialize)]
pub struct SandboxPage {
    /// Whether the caller is an administrator (and sees every tenant).
    admin: bool,
    sandboxes: Vec<ShownSandbox>,
}

#[derive(Serialize, Deserialize)]
pub struct SandboxDetail {
    #[serde(flatten)]
    sandbox: ShownSandbox,
    /// The most recent calls on it, oldest first.
    history: Vec<CallRecord>,
}

impl Ops {
    /// `info` as the API shows it to `caller`.
    pub async fn shown(&self, caller: &Caller, info: SandboxInfo) -> ShownSandbox {
        let usage = self.sandboxes.usage(caller.scope(), info.sandbox_id).await.ok();
        ShownSandbox {
            owner: caller.admin.then(|| info.owner.clone()),
            listed: info.into(),
            usage,
        }
    }

    /// The caller's sandboxes on every node of a cluster: those of the
    /// nodes that are up as they show them, and those of the nodes that
    /// are not, `unreachable`.
    pub async fn show_sandboxes(&self, caller: &Caller) -> SandboxPage {
        let mut sandboxes = self.show_sandboxes_here(caller).await;
        let (theirs, unreachable) = self
            .listed_on_other_nodes::<Vec<ShownSandbox>>("show_sandboxes", caller)
            .await;
        sandboxes.extend(theirs.into_iter().flatten());
        let listed: Vec<&str> = sandboxes.iter().map(|s| s.listed.sandbox_id.as_str()).collect();
        let missing = self.unreachable_of(caller, &listed, unreachable).await;
        sandboxes.extend(missing.into_iter().map(|listed| ShownSandbox {
            listed,
            owner: None,
            usage: None,
        }));
        SandboxPage {
            admin: caller.admin,
            sandboxes,
        }
    }

    /// The caller's sandboxes on this node, as the API shows them.
    pub(crate) async fn show_sandboxes_here(&self, caller: &Caller) -> Vec<ShownSandbox> {
        let infos = self.list_sandboxes(caller).await;
        futures_util::future::join_all(infos.into_iter().map(|i| self.shown(caller, i))).await
    }

    pub async fn show_sandbox(&self, caller: &Caller, args: SandboxRef) -> Result<SandboxDetail, OpsError> {
        forward_if_elsewhere!(self, caller, "show_sandbox", args, None);
        let id = parse_id(&args.sandbox_id)?;
        let info = self.sandboxes.info(caller.scope(), id).await?;
        let history = self.sandboxes.history(caller.scope(), id).await?;
        Ok(SandboxDetail {
            sandbox: self.shown(caller, info).await,
            history,
        })
    }
}
