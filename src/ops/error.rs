//! Why an operation was refused or failed: [`OpsError`], the one error
//! type of this layer, for every front end. Its message is the domain's
//! (which names no tool) followed by what to do next in the tools' terms;
//! a refusal that passes with time says after how long, so REST answers it
//! with `Retry-After`.

use sandbox_actors::files::FileError;
use sandbox_actors::snapshots::SnapshotError;
use sandbox_actors::templates::TemplateError;
use sandbox_actors::SandboxError;

use crate::metrics::Outcome;

#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// The domain refused or failed.
    #[error("{err}{hint}", err = .0, hint = next_step(.0, Channel::Tools))]
    Sandbox(#[source] SandboxError),
    /// An argument is malformed or out of range; the message names it.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A rate was passed; the same call succeeds after `retry_after` seconds.
    #[error("{message}")]
    RateLimited { message: String, retry_after: u64 },
    /// A monthly budget is spent, or a call could never fit a rate.
    #[error("{0}")]
    Refused(String),
    /// The cluster could not take part (etcd unavailable, this node cut
    /// off): nothing was changed.
    #[error(transparent)]
    Cluster(sandbox_cluster::ClusterError),
    /// The node that holds the sandbox does not answer.
    #[error(
        "sandbox {sandbox} is unreachable: node {node}, which holds it, does not answer (it is down, restarting or \
         cut off from this node), so the call may not have run. Its files are on that node. Try again in a minute, \
         or create a new sandbox with create_sandbox."
    )]
    Unreachable {
        sandbox: uuid::Uuid,
        node: String,
        /// Whether the call reached the node (it may have run there).
        sent: bool,
    },
    /// The node that holds the sandbox refused or failed the call; its
    /// message and status are passed on.
    #[error("{}", .0.message)]
    Forwarded(RemoteError),
    /// Something that should not happen (a node's answer out of protocol).
    #[error("internal error: {0}")]
    Internal(String),
}

/// A failure on the node that holds the sandbox, as its caller would have
/// heard it there.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RemoteError {
    pub message: String,
    /// The REST API's status for it.
    pub status: u16,
    pub retry_after: Option<u64>,
}

impl From<SandboxError> for OpsError {
    fn from(e: SandboxError) -> Self {
        OpsError::Sandbox(e)
    }
}

impl From<FileError> for OpsError {
    fn from(e: FileError) -> Self {
        OpsError::Sandbox(e.into())
    }
}

impl Outcome for OpsError {
    fn kind(&self) -> &'static str {
        match self {
            OpsError::Sandbox(e) => e.kind(),
            OpsError::InvalidArgument(_) => "invalid_argument",
            OpsError::RateLimited { .. } | OpsError::Refused(_) => "quota",
            OpsError::Cluster(_) => "cluster",
            OpsError::Unreachable { .. } => "unreachable",
            OpsError::Forwarded(_) => "forwarded",
            OpsError::Internal(_) => "internal",
        }
    }
}

/// Who reads an error: an agent through the MCP tools, or a program or a
/// person through the REST API and the web UI, each told the next step in
/// its own terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    Tools,
    Web,
}

impl OpsError {
    /// The message as `channel` tells it (the `Display` is the tools').
    pub fn message_for(&self, channel: Channel) -> String {
        match (self, channel) {
            (OpsError::Sandbox(e), Channel::Web) => format!("{e}{}", next_step(e, Channel::Web)),
            _ => self.to_string(),
        }
    }
}

/// What the caller can do next about a domain error, in its channel's terms
/// (empty where the message says it already).
fn next_step(e: &SandboxError, channel: Channel) -> &'static str {
    use Channel::{Tools, Web};
    match (e, channel) {
        (SandboxError::NotFound(_), Tools) => " Call list_sandboxes to see yours, or create_sandbox to make one.",
        (SandboxError::NotFound(_), Web) => " See yours in the sandbox list (GET /api/sandboxes), or create one.",
        (SandboxError::Template(TemplateError::Unknown(_)), Tools) => {
            ". Call list_templates to see the templates you may use, or leave template out for the default"
        }
        (SandboxError::Template(TemplateError::Unknown(_)), Web) => {
            ". See the templates you may use (GET /api/templates), or leave template out for the default"
        }
        (SandboxError::Ended { .. }, Tools) => " Create a new sandbox with create_sandbox.",
        (SandboxError::Ended { .. }, Web) => " Create a new sandbox.",
        (SandboxError::Outdated { .. }, Tools) => " A sandbox made now with create_sandbox has the current agent.",
        (SandboxError::Outdated { .. }, Web) => " A sandbox created now has the current agent.",
        (SandboxError::TooMany { asked: 1, .. }, Tools) => {
            ": reuse one (list_sandboxes) or delete one with delete_sandbox, then create again"
        }
        (SandboxError::TooMany { asked: 1, .. }, Web) => {
            ": reuse one, or delete one (its Delete button, or DELETE /api/sandboxes/{id}), then create again"
        }
        (SandboxError::TooMany { .. }, Tools) => ": make fewer, or delete some with delete_sandbox",
        (SandboxError::TooMany { .. }, Web) => ": make fewer, or delete some (DELETE /api/sandboxes/{id})",
        (SandboxError::Seeding { .. }, Tools) => ": call it once fork_sandbox has answered",
        (SandboxError::Seeding { .. }, Web) => ": try again once the fork has answered",
        (SandboxError::Snapshot(SnapshotError::NotFound(_)), Tools) => {
            " Call list_snapshots to see the sandbox's snapshots."
        }
        (SandboxError::Snapshot(SnapshotError::NotFound(_)), Web) => {
            " See the sandbox's snapshots on its page (GET /api/sandboxes/{id}/snapshots)."
        }
        (SandboxError::Snapshot(SnapshotError::TooMany(_)), Tools) => {
            "; delete one with delete_snapshot, then try again"
        }
        (SandboxError::Snapshot(SnapshotError::TooMany(_)), Web) => "; delete one, then try again",
        (SandboxError::Snapshot(SnapshotError::StoreFull { .. }), Tools) => {
            " Call list_snapshots to see what each snapshot takes, and delete_snapshot to drop one."
        }
        (SandboxError::Snapshot(SnapshotError::StoreFull { .. }), Web) => {
            " The sandbox's snapshots list what each takes; delete one to make room."
        }
        (SandboxError::File(FileError::NotFound(_)), Tools) => "; call list_files to see what is there",
        (SandboxError::File(FileError::IsFolder(_)), Tools) => "; call list_files to see what it holds",
        (SandboxError::File(FileError::NotFound(_) | FileError::IsFolder(_)), Web) => {
            "; see what is there in the sandbox's files (GET /api/sandboxes/{id}/files)"
        }
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    /// A person in a browser and a program on the REST API are told the next
    /// step in their terms, never a tool's name; an agent is told the tool.
    #[test]
    fn refusals_name_the_next_step_in_their_channel_s_terms() {
        let errors = [
            SandboxError::NotFound(Uuid::nil()),
            SandboxError::TooMany {
                have: 3,
                most: 3,
                asked: 1,
            },
            SandboxError::TooMany {
                have: 3,
                most: 3,
                asked: 2,
            },
            SandboxError::Snapshot(SnapshotError::TooMany(5)),
            SandboxError::Snapshot(SnapshotError::NotFound(Uuid::nil())),
            SandboxError::File(FileError::NotFound("x".into())),
        ];
        let tools = ["_sandbox", "_snapshot", "list_files", "list_sandboxes"];
        for e in errors {
            let ops = OpsError::Sandbox(e);
            let web = ops.message_for(Channel::Web);
            assert!(!tools.iter().any(|t| web.contains(t)), "{web}");
            let agent = ops.message_for(Channel::Tools);
            assert!(tools.iter().any(|t| agent.contains(t)), "{agent}");
            assert_eq!(agent, ops.to_string());
        }
    }
}
