//! The container runtime: everything the sandbox actors ask of a container
//! engine, behind a trait so that unit tests of actor logic can replace it
//! (`fake`, in this crate's tests and with the `test-runtime` feature).
//!
//! - [`ContainerRuntime`] (here) and its Docker implementation (`docker`),
//!   with the sandbox image's and the templates' builds (`image`) and the
//!   labels every engine object carries (`labels`);
//! - `template`: a template's definition, its image's tag and Dockerfile,
//!   and what a sandbox made from it records;
//! - `agent`: the channel to the agent inside each sandbox;
//! - `spans`: the trace spans of agent exchanges and engine calls;
//! - `config`: the `[sandbox]` section, what every container is made with;
//! - `error`: [`RuntimeError`].

pub mod agent;
pub mod config;
pub mod counters;
mod docker;
mod error;
#[cfg(any(test, feature = "test-runtime"))]
pub mod fake;
mod image;
pub mod labels;
pub mod outputs;
pub mod ports;
pub mod processes;
pub mod spans;
pub mod template;

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use uuid::Uuid;

use crate::agent::AgentClient;

pub use docker::DockerRuntime;
pub use error::{ImageError, Result, RuntimeError};

/// Host side of one sandbox: the folders bind-mounted into its container.
#[derive(Debug, Clone)]
pub struct SandboxPaths {
    pub id: Uuid,
    /// Mounted at `/app/results`; served as artifacts.
    pub results: PathBuf,
    /// Mounted at `/run/mcp-agent`; holds the agent's socket.
    pub agent: PathBuf,
    /// For a sandbox whose egress goes through the proxy: the folder of the
    /// proxy's socket, mounted read-only. Such a sandbox has no network
    /// interface; the others join the server's bridge network.
    pub egress: Option<PathBuf>,
    /// The capped file system the package volume is bound to (none: a
    /// plain Docker volume).
    pub packages: Option<PathBuf>,
    /// The template its container is made from (none: the sandbox image,
    /// under `[sandbox]`'s limits).
    pub template: Option<std::sync::Arc<template::Template>>,
}

/// A sandbox's Docker objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRef {
    pub container_id: String,
    pub volume: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerState {
    Running,
    /// Exited or killed; `oom_killed` when the memory limit ended it.
    Stopped {
        exit_code: i64,
        oom_killed: bool,
    },
    Paused,
    Missing,
}

/// What an installer container did.
#[derive(Debug, Clone)]
pub struct Installed {
    pub exit_code: i64,
    /// Its stdout and stderr, interleaved, the last 64 KiB.
    pub output: String,
    pub timed_out: bool,
    /// What it used (CPU, bytes on its interface), read while it ran: its
    /// sandbox's tenant is billed for it.
    pub usage: Usage,
}

/// What a container uses, as the engine reports it.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct Usage {
    /// CPU time used since the container started.
    pub cpu_seconds: f64,
    /// Memory in use, page cache that can be reclaimed excluded (as `docker stats` shows it).
    pub memory_bytes: u64,
    pub memory_limit_bytes: u64,
    /// Bytes received and sent on the container's own network interfaces
    /// since it started (a proxied sandbox has none: its proxy counts);
    /// none when they could not be read.
    pub network_bytes: Option<u64>,
}

/// A container or volume carrying this server's labels.
#[derive(Debug, Clone)]
pub struct Labelled {
    pub id: String,
    /// Value of the sandbox label, when present and a valid id.
    pub sandbox: Option<Uuid>,
}

#[async_trait]
pub trait ContainerRuntime: Send + Sync + 'static {
    /// Whether the engine answers.
    async fn ping(&self) -> Result<()>;
    /// Creates and starts the container of a sandbox, with a fresh package
    /// volume unless `volume` names an existing one to keep. A failure
    /// removes what it made, where the engine still answers.
    async fn create(&self, paths: &SandboxPaths, volume: Option<&str>) -> Result<ContainerRef>;
    async fn start(&self, container_id: &str) -> Result<()>;
    async fn state(&self, container_id: &str) -> Result<ContainerState>;
    /// The state of a container the server started a moment ago, as
    /// [`ContainerRuntime::state`] but read from the host where it can be
    /// (whether its cgroup is frozen) instead of asked of the engine.
    async fn started_state(&self, container_id: &str) -> Result<ContainerState> {
        self.state(container_id).await
    }
    async fn usage(&self, container_id: &str) -> Result<Usage>;
    /// The container's counters for a run's receipt, where they can be read
    /// without the engine (which takes about a second to answer); None
    /// elsewhere, and the receipt then leaves them out.
    fn counters(&self, _container_id: &str) -> Option<counters::Counters> {
        None
    }
    /// A mark from which the container's memory peak is read, for a run's
    /// receipt; None where the kernel keeps none that can be reset.
    fn peak_mark(&self, _container_id: &str) -> Option<counters::PeakMark> {
        None
    }
    async fn pause(&self, container_id: &str) -> Result<()>;
    async fn unpause(&self, container_id: &str) -> Result<()>;
    /// Kills and starts a container whose agent stopped answering.
    async fn restart(&self, container_id: &str) -> Result<()>;
    async fn remove_volume(&self, name: &str) -> Result<()>;
    /// Removes a container (if present); `volume` too when given.
    async fn remove(&self, container_id: &str, volume: Option<&str>) -> Result<()>;
    async fn list_containers(&self) -> Result<Vec<Labelled>>;
    /// The containers labelled as `sandbox`'s (its own, and any installer).
    /// Selected by the engine: listing all of them costs the engine an
    /// image lookup per container, per deletion.
    async fn sandbox_containers(&self, sandbox: Uuid) -> Result<Vec<String>>;
    async fn list_volumes(&self) -> Result<Vec<Labelled>>;
    /// Extracts a tar archive into `dest_dir` inside the container.
    async fn upload(&self, container_id: &str, dest_dir: &str, tar: Vec<u8>) -> Result<()>;
    /// Runs `argv` (a package installer) in a short-lived container of the
    /// sandbox image that mounts the sandbox's package volume and joins the
    /// server's bridge network (under the same firewall rules as bridged
    /// sandboxes), for sandboxes whose policy does not reach the index.
    async fn run_installer(
        &self,
        paths: &SandboxPaths,
        volume: &str,
        argv: Vec<String>,
        timeout: Duration,
    ) -> Result<Installed>;
    /// Removes what the runtime set up for this server's sandboxes (their
    /// network, firewall rules), once no sandbox is left.
    async fn release(&self) -> Result<()>;
    /// Opens a connection to the sandbox's agent. The runtime knows where it
    /// listens (here a socket in a host folder; on a cluster, a pod's
    /// address), so callers name only the sandbox.
    async fn connect_agent(&self, sandbox: Uuid) -> std::io::Result<AgentClient>;
    /// Opens a connection to `port` inside the sandbox, through its agent
    /// (see [`ports`]).
    async fn open_port(&self, paths: &SandboxPaths, port: u16) -> Result<ports::PortStream, ports::PortError>;
    /// Builds the image of template `definition` on the sandbox image
    /// unless it is present; its tag, and whether it was built now.
    /// `progress` hears a line per build step.
    async fn ensure_template(
        &self,
        definition: &template::Definition,
        progress: &(dyn for<'l> Fn(&'l str) + Send + Sync),
    ) -> Result<(String, bool)>;
    /// Removes the project's template images that `keep` does not name;
    /// the tags removed.
    async fn remove_unused_templates(&self, keep: &std::collections::HashSet<String>) -> Result<Vec<String>>;
    /// The OCI runtimes the engine has registered, by name (`runc`, and
    /// `crun` or `runsc` where they were added).
    async fn oci_runtimes(&self) -> Result<Vec<String>>;
}
