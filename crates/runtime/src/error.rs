//! What went wrong in the runtime. Each message is written for the caller
//! (often an LLM): it says what went wrong and what to do next.

use sandbox_host::bridge::AttachError;
use sandbox_host::disk::DiskError;

/// Why the runtime could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The engine refused a request or could not be reached.
    #[error("Docker is unavailable: {0}. Try again later; if it persists, the server operator must check the Docker engine.")]
    Engine(#[from] bollard::errors::Error),
    /// The engine's statistics stream of a container ended without a sample.
    #[error("Docker is unavailable: no statistics for the container. Try again later; if it persists, the server operator must check the Docker engine.")]
    NoStatistics,
    #[error("sandbox image: {0}")]
    Image(#[from] ImageError),
    /// A sandbox's capped file systems could not be made or mounted.
    #[error("sandbox disk: {0}")]
    Disk(#[from] DiskError),
    /// An `open` sandbox could not be joined to the server's network.
    #[error("sandbox network: {0}. Try again; if it persists, the server operator must check the server's log.")]
    Network(#[from] AttachError),
    /// A file the runtime writes for its sandboxes could not be written.
    #[error("internal error: writing {}: {source}", .path.display())]
    File {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("internal error: {0}")]
    Internal(String),
}

impl RuntimeError {
    /// A stable name for the kind of failure (metrics labels, API clients).
    pub fn kind(&self) -> &'static str {
        match self {
            RuntimeError::Engine(_) | RuntimeError::NoStatistics => "docker",
            RuntimeError::Image(_) => "image",
            RuntimeError::Disk(_) => "disk",
            RuntimeError::Network(_) => "network",
            RuntimeError::File { .. } | RuntimeError::Internal(_) => "internal",
        }
    }
}

/// Why the sandbox image could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// A file of the build (the bootstrap script, the CA bundle) could not
    /// be written, read or run.
    #[error("{} {}: {source}", .what, .path.display())]
    File {
        what: &'static str,
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("packing the build context: {0}")]
    Context(#[source] std::io::Error),
    /// The engine failed during the build (a step that failed, as the
    /// engine's stream reports it); `hint` says what may fix it, `output`
    /// holds the last lines the build printed.
    #[error("build on {base}: {source}{hint}{}", last_lines(.output))]
    Engine {
        base: String,
        source: bollard::errors::Error,
        hint: &'static str,
        output: String,
    },
    /// A build step failed; `message` is the engine's, `output` the last
    /// lines the build printed before it.
    #[error("build on {base}: {message}{hint}{}", last_lines(.output))]
    Step {
        base: String,
        message: String,
        hint: &'static str,
        output: String,
    },
    #[error("build on {base} finished without producing {image}")]
    NotProduced { base: String, image: String },
    #[error("{} failed ({status})", .script.display())]
    Bootstrap {
        script: std::path::PathBuf,
        status: std::process::ExitStatus,
    },
    #[error("importing the root file system: {0}")]
    ImportRefused(String),
    #[error("importing the root file system: {0}")]
    Import(#[source] bollard::errors::Error),
}

/// A build's last lines, after its error.
fn last_lines(output: &str) -> String {
    match output.is_empty() {
        true => String::new(),
        false => format!("; its last lines:\n{output}"),
    }
}

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;
