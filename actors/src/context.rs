//! What every actor of one server shares: the runtime, the records and the
//! settings, plus where each sandbox's host folders are.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use uuid::Uuid;

use crate::config::{PackagesConfig, PoolConfig, SandboxConfig, UploadsConfig};
use crate::egress::Egress;
use crate::records::RecordStore;
use crate::runtime::disk::Disks;
use crate::runtime::{ContainerRuntime, SandboxPaths};

/// Settings of the sandbox domain, from the server's configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    pub sandbox: SandboxConfig,
    pub packages: PackagesConfig,
    pub uploads: UploadsConfig,
    pub pool: PoolConfig,
    /// The server's own folder: records and agent sockets. Never uploadable.
    pub state_dir: PathBuf,
    /// Host folder holding each sandbox's `/app/results`.
    pub results_dir: PathBuf,
    /// Files that must never be uploaded into a sandbox (the config file).
    pub protected: Vec<PathBuf>,
    /// New sandboxes and installs are refused while the state or results
    /// folder's file system has less free space than this (0: never).
    pub min_free_disk_mb: u64,
}

impl Settings {
    /// The defaults, with the state and results folders under `root`: no
    /// warm pool, no uploads, no free-disk guard (tests and benchmarks).
    pub fn under(root: &std::path::Path) -> Self {
        Self {
            sandbox: SandboxConfig::default(),
            packages: PackagesConfig::default(),
            uploads: UploadsConfig::default(),
            pool: PoolConfig { size: 0 },
            state_dir: root.join("state"),
            results_dir: root.join("results"),
            protected: vec![],
            min_free_disk_mb: 0,
        }
    }
}

pub struct Context {
    pub runtime: Arc<dyn ContainerRuntime>,
    pub store: RecordStore,
    pub settings: Settings,
    pub counters: Counters,
    pub egress: Egress,
    pub disks: Disks,
}

/// Events counted since the server started, for its metrics.
#[derive(Debug, Default)]
pub struct Counters {
    /// Containers started again, re-created or restarted (after a crash, a
    /// hang, or on request).
    pub container_restarts: AtomicU64,
    pub installs_succeeded: AtomicU64,
    pub installs_failed: AtomicU64,
}

impl Counters {
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

impl Context {
    pub fn paths(&self, id: Uuid) -> SandboxPaths {
        SandboxPaths {
            id,
            results: self.settings.results_dir.join(id.to_string()),
            agent: self.settings.state_dir.join("agents").join(id.to_string()),
            egress: self.egress.socket_dir(id),
            packages: self.disks.packages_dir(id),
        }
    }
}
