//! Errors of the sandbox domain. Each message is written for the caller
//! (often an LLM) and says what went wrong; what to do next in a front
//! end's own terms (its tools, its routes) is the front end's to add, so
//! no message here names a tool.

use std::path::PathBuf;
use std::sync::Arc;

use sandbox_egress::EgressError;
use sandbox_host::disk::DiskError;
use sandbox_runtime::RuntimeError;
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("sandbox {0} not found: it does not exist or belongs to someone else.")]
    NotFound(Uuid),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A file tool's path or file was refused; the message says why.
    #[error(transparent)]
    File(#[from] crate::files::FileError),
    #[error("upload refused: {0}")]
    UploadRefused(String),
    /// A limit was reached; the message says which and what to do.
    #[error("{0}")]
    Quota(String),
    /// The owner's sandboxes, with `asked` more, would pass their quota.
    #[error("{}", too_many(*have, *most, *asked))]
    TooMany { have: usize, most: usize, asked: usize },
    /// A fork the server still copies into refuses its owner's calls.
    #[error("sandbox {id} is being made by fork {fork}, which copies into it")]
    Seeding { id: Uuid, fork: Uuid },
    /// The container runtime failed (the engine, the image, a sandbox's
    /// disks or network).
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("Docker is unavailable: {0}. Try again later; if it persists, the server operator must check the Docker engine.")]
    Docker(#[from] DockerError),
    #[error("the sandbox's agent failed: {0}")]
    Agent(#[from] AgentFailure),
    /// The sandbox missed a deadline; its container is being restarted.
    #[error("sandbox {id} did not answer within {seconds} s ({what}). Its container is being restarted: files in /app/results and installed packages are kept, Python variables are lost. Call again; the next call runs once the sandbox is back.")]
    Unresponsive { id: Uuid, what: &'static str, seconds: u64 },
    /// The sandbox went away while the call waited or ran.
    #[error("sandbox {id} {why}, so this call was ended.")]
    Ended { id: Uuid, why: String },
    /// The sandbox's agent is older than the server (a sandbox made from an
    /// earlier image and adopted since) and lacks an operation.
    #[error("sandbox {id} runs an older agent that cannot {what}; nothing was changed.")]
    Outdated { id: Uuid, what: &'static str },
    #[error("record store: {0}")]
    Store(#[from] StoreError),
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error("internal error: {0}")]
    Internal(String),
    /// The sandbox sleeps on disk, and this call could not wake it (or is
    /// not one that wakes it); `why` says which.
    #[error("sandbox {id} is hibernated: {why}")]
    Asleep { id: Uuid, why: String },
    #[error(transparent)]
    Template(#[from] crate::templates::TemplateError),
    /// A preview connection could not be opened through the agent.
    #[error("could not open a preview connection: {0}")]
    Preview(#[source] sandbox_runtime::ports::PortError),
}

impl SandboxError {
    /// A stable name for the kind of failure (metrics labels, API clients).
    pub fn kind(&self) -> &'static str {
        match self {
            SandboxError::NotFound(_) => "not_found",
            SandboxError::InvalidArgument(_) => "invalid_argument",
            SandboxError::File(_) => "file",
            SandboxError::UploadRefused(_) => "upload_refused",
            SandboxError::Quota(_) | SandboxError::TooMany { .. } | SandboxError::Seeding { .. } => "quota",
            SandboxError::Runtime(e) => e.kind(),
            SandboxError::Docker(_) => "docker",
            SandboxError::Agent(_) => "agent",
            SandboxError::Unresponsive { .. } => "unresponsive",
            SandboxError::Ended { .. } => "ended",
            SandboxError::Outdated { .. } => "outdated",
            SandboxError::Store(_) => "store",
            SandboxError::Snapshot(SnapshotError::NotFound(_)) => "not_found",
            SandboxError::Snapshot(SnapshotError::StoreFull { .. } | SnapshotError::NoRoom) => "quota",
            SandboxError::Snapshot(_) => "snapshot",
            SandboxError::Internal(_) => "internal",
            SandboxError::Asleep { .. } => "asleep",
            SandboxError::Preview(_) => "preview",
            SandboxError::Template(crate::templates::TemplateError::Unknown(_)) => "invalid_argument",
            SandboxError::Template(_) => "template_unavailable",
        }
    }
}

/// What went wrong with the Docker engine, seen from the domain.
#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    #[error("the engine did not report the container's usage in time")]
    UsageTimedOut,
    /// The removal of a deleted sandbox failed; it is retried at every tick.
    #[error("{0}; the sandbox stays deleted and its removal is retried")]
    RemovalRetried(#[source] Arc<SandboxError>),
}

/// Why a sandbox's agent could not serve a call.
#[derive(Debug, thiserror::Error)]
pub enum AgentFailure {
    /// An exchange with the agent failed; the agent error says how.
    #[error(transparent)]
    Exchange(#[from] sandbox_runtime::agent::AgentError),
    /// No connection could be opened to it.
    #[error("could not connect to the agent ({0})")]
    Unreachable(#[source] std::io::Error),
    /// It took a connection and did not answer a ping in time.
    #[error("the agent did not answer a ping")]
    NoPong,
    #[error("the container exited (code {0}) before its agent started")]
    ExitedBeforeStart(i64),
    /// Still no agent at the start deadline; `last` is the last attempt's failure.
    #[error("the agent did not start within {within:?}: {last}")]
    DidNotStart {
        within: std::time::Duration,
        #[source]
        last: Box<AgentFailure>,
    },
    #[error("the Python worker did not start in time")]
    WorkerDidNotStart,
}

/// What went wrong with the record store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Another server holds the database open.
    #[error("{0} is in use by another mcp-sandbox server; give each server its own server.state_dir")]
    InUse(PathBuf),
    #[error(transparent)]
    Database(#[from] redb::DatabaseError),
    #[error(transparent)]
    Transaction(#[from] redb::TransactionError),
    #[error(transparent)]
    Table(#[from] redb::TableError),
    #[error(transparent)]
    Storage(#[from] redb::StorageError),
    #[error(transparent)]
    Commit(#[from] redb::CommitError),
    #[error(transparent)]
    Encoding(#[from] serde_json::Error),
    /// The server id file could not be written.
    #[error("writing {path}: {source}")]
    ServerId { path: PathBuf, source: std::io::Error },
}

impl From<DiskError> for SandboxError {
    fn from(e: DiskError) -> Self {
        SandboxError::Runtime(e.into())
    }
}

impl From<EgressError> for SandboxError {
    fn from(e: EgressError) -> Self {
        match e {
            EgressError::Rules { .. } => SandboxError::InvalidArgument(e.to_string()),
            EgressError::Socket { .. } => SandboxError::Internal(e.to_string()),
        }
    }
}

macro_rules! store_error_from {
    ($($t:ty),*) => {$(
        impl From<$t> for SandboxError {
            fn from(e: $t) -> Self {
                SandboxError::Store(e.into())
            }
        }
    )*};
}
store_error_from!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

pub type Result<T, E = SandboxError> = std::result::Result<T, E>;

/// [`SandboxError::TooMany`]'s message.
fn too_many(have: usize, most: usize, asked: usize) -> String {
    match asked {
        1 => format!("you already have {have} sandboxes, the most allowed"),
        _ => format!("you have {have} sandboxes and may have {most}, so {asked} more do not fit"),
    }
}

/// Why snapshot or fork work failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot {0} not found in this sandbox.")]
    NotFound(Uuid),
    #[error("this sandbox already keeps {0} snapshots, the most it may")]
    TooMany(usize),
    #[error("snapshots are turned off on this server (sandbox.snapshots_per_sandbox = 0)")]
    Disabled,
    #[error("could not save the sandbox's files: {0}. No snapshot was kept; the sandbox is unchanged.")]
    Save(#[source] CopyError),
    #[error("could not restore the sandbox's files: {0}. They may be partly restored: restore again, or delete the sandbox.")]
    Restore(#[source] CopyError),
    #[error("could not copy the sandbox's files for a fork: {0}. The fork was undone; the sandbox is unchanged.")]
    Export(#[source] CopyError),
    #[error(
        "could not copy the files into a fork: {0}. The fork was undone; free disk space or fork fewer at once, then try again."
    )]
    Seed(#[source] CopyError),
    #[error("the snapshot store: {0}")]
    Store(#[source] std::io::Error),
    /// The store's file system (`sandbox.snapshots_mb`) is full.
    #[error(
        "the sandbox's snapshots, with this one, would hold more than their store on the host may ({cap_mb} MB, \
         or its count of files): no snapshot was kept. Delete an older snapshot if there is one, or files in \
         /app/results that need not be kept, then try again."
    )]
    StoreFull { cap_mb: u64 },
    /// The save could take the state folder's file system below
    /// `limits.min_free_disk_mb`, counting what saves in flight may write
    /// (the figures go to the server's log, not to the caller).
    #[error("the server's disk has no room for a snapshot now: no snapshot was kept; try again later.")]
    NoRoom,
    /// The store's file system could not be made or mounted.
    #[error("the snapshot store could not be made ready: {0}")]
    Disk(#[source] DiskError),
}

/// Why a copy stopped.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the files are larger than a snapshot may hold ({bytes} bytes, {files} files at most)")]
    TooLarge { bytes: u64, files: u64 },
    #[error("the copy ran past its deadline")]
    Stopped,
    #[error("folders are nested deeper than {max} levels")]
    TooDeep { max: usize },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What to call next is a front end's to say: no message of the domain
    /// names one of the tools.
    #[test]
    fn no_message_names_a_tool() {
        const TOOLS: [&str; 8] = [
            "create_sandbox",
            "list_sandboxes",
            "delete_sandbox",
            "list_snapshots",
            "delete_snapshot",
            "fork_sandbox",
            "list_files",
            "install_package_in_sandbox",
        ];
        let id = Uuid::nil();
        let errors = [
            SandboxError::NotFound(id),
            SandboxError::Ended {
                id,
                why: "was deleted".into(),
            },
            SandboxError::Outdated { id, what: "snapshot" },
            SandboxError::TooMany {
                have: 3,
                most: 3,
                asked: 1,
            },
            SandboxError::TooMany {
                have: 1,
                most: 3,
                asked: 3,
            },
            SandboxError::Seeding { id, fork: id },
            SandboxError::Snapshot(SnapshotError::NotFound(id)),
            SandboxError::Snapshot(SnapshotError::TooMany(3)),
            SandboxError::File(crate::files::FileError::NotFound("/app/results/x".into())),
            SandboxError::File(crate::files::FileError::IsFolder("/app/results/x".into())),
        ];
        for e in errors {
            let message = e.to_string();
            assert!(!TOOLS.iter().any(|t| message.contains(t)), "{message}");
        }
    }
}
