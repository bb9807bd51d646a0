//! Why an operation was refused or failed: [`OpsError`], the one error
//! type of this layer, for every front end. Its message is the domain's
//! (which names no tool) followed by what to do next in the tools' terms;
//! a refusal that passes with time says after how long, so REST answers it
//! with `Retry-After`.

use sandbox_actors::files::FileError;
use sandbox_actors::snapshots::SnapshotError;
use sandbox_actors::SandboxError;

use crate::metrics::Outcome;

#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// The domain refused or failed.
    #[error("{err}{hint}", err = .0, hint = next_step(.0))]
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

/// What the caller can do next about a domain error, in the tools' terms
/// (empty where the message says it already).
fn next_step(e: &SandboxError) -> &'static str {
    match e {
        SandboxError::NotFound(_) => " Call list_sandboxes to see yours, or create_sandbox to make one.",
        SandboxError::Ended { .. } => " Create a new sandbox with create_sandbox.",
        SandboxError::Outdated { .. } => " A sandbox made now with create_sandbox has the current agent.",
        SandboxError::TooMany { asked: 1, .. } => {
            ": reuse one (list_sandboxes) or delete one with delete_sandbox, then create again"
        }
        SandboxError::TooMany { .. } => ": make fewer, or delete some with delete_sandbox",
        SandboxError::Seeding { .. } => ": call it once fork_sandbox has answered",
        SandboxError::Snapshot(SnapshotError::NotFound(_)) => " Call list_snapshots to see the sandbox's snapshots.",
        SandboxError::Snapshot(SnapshotError::TooMany(_)) => "; delete one with delete_snapshot, then try again",
        SandboxError::Snapshot(SnapshotError::StoreFull { .. }) => {
            " Call list_snapshots to see what each snapshot takes, and delete_snapshot to drop one."
        }
        SandboxError::File(FileError::NotFound(_)) => "; call list_files to see what is there",
        SandboxError::File(FileError::IsFolder(_)) => "; call list_files to see what it holds",
        _ => "",
    }
}
