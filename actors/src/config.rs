//! Settings the sandbox domain needs, deserialised straight from the
//! `[sandbox]`, `[packages]` and `[uploads]` sections of `config.toml`
//! (the server embeds these types in its own configuration), and the
//! [`Settings`] that join them with the server's folders.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use sandbox_egress::{is_host_name, EgressSettings};
use sandbox_host::disk::{Cap, Disks, Layout};
use sandbox_host::syscalls::Syscalls;

pub use sandbox_egress::EgressPolicy;
use sandbox_runtime::config::invalid;
pub use sandbox_runtime::config::{
    InvalidConfig, SandboxConfig, AUTO_OCI_RUNTIME, MAX_SNAPSHOTS, MIN_EGRESS_MB_PER_MINUTE, OCI_RUNTIMES,
};
pub use sandbox_runtime::template::TemplateConfig;

/// [`Settings::egress_total_connections`] until the server has measured
/// its open-file limit.
pub const DEFAULT_EGRESS_TOTAL: usize = 4096;

/// Settings of the sandbox domain, from the server's configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    pub sandbox: SandboxConfig,
    pub packages: PackagesConfig,
    pub uploads: UploadsConfig,
    pub pool: PoolConfig,
    pub usage: UsageConfig,
    pub processes: ProcessesConfig,
    /// `[[templates]]`: the prepared environments sandboxes may start from.
    pub templates: Vec<TemplateConfig>,
    /// The server's own folder: records and agent sockets. Never uploadable.
    pub state_dir: PathBuf,
    /// Host folder holding each sandbox's `/app/results`.
    pub results_dir: PathBuf,
    /// Files that must never be uploaded into a sandbox (the config file).
    pub protected: Vec<PathBuf>,
    /// New sandboxes and installs are refused while the state or results
    /// folder's file system has less free space than this (0: never).
    pub min_free_disk_mb: u64,
    /// Live sandboxes the server may hold (`limits.max_sandboxes_total`):
    /// the pool fills only the room the live ones leave under it, and a
    /// hibernated one wakes only into room under it.
    pub max_sandboxes_total: usize,
    /// Each tenant's most live sandboxes, which a wake may not exceed
    /// (creations are checked against the caller's quota).
    pub live_cap: LiveCap,
    /// Hibernated sandboxes the server may hold, and one tenant
    /// (`limits.max_hibernated_total`, `limits.max_hibernated_per_tenant`).
    pub max_hibernated_total: usize,
    pub max_hibernated_per_tenant: usize,
    /// Connections the egress proxy may hold for all sandboxes together:
    /// what the server's open-file limit leaves for them.
    pub egress_total_connections: usize,
}

/// A tenant's most live sandboxes, as the server's keys and tiers say
/// (they may change while it runs); unlimited by default.
#[derive(Clone)]
pub struct LiveCap(Arc<dyn Fn(&str) -> usize + Send + Sync>);

impl LiveCap {
    pub fn new(of: impl Fn(&str) -> usize + Send + Sync + 'static) -> Self {
        Self(Arc::new(of))
    }

    pub fn of(&self, tenant: &str) -> usize {
        (self.0)(tenant)
    }
}

impl Default for LiveCap {
    fn default() -> Self {
        Self::new(|_| usize::MAX)
    }
}

impl std::fmt::Debug for LiveCap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LiveCap")
    }
}

impl Settings {
    /// The defaults, with the state and results folders under `root`: no
    /// warm pool, no uploads, no free-disk guard (tests and benchmarks).
    pub fn under(root: &Path) -> Self {
        Self {
            sandbox: SandboxConfig::default(),
            packages: PackagesConfig::default(),
            uploads: UploadsConfig::default(),
            pool: PoolConfig::off(),
            usage: UsageConfig::default(),
            processes: ProcessesConfig::default(),
            templates: vec![],
            max_sandboxes_total: usize::MAX,
            live_cap: LiveCap::default(),
            max_hibernated_total: usize::MAX,
            max_hibernated_per_tenant: usize::MAX,
            egress_total_connections: DEFAULT_EGRESS_TOTAL,
            state_dir: root.join("state"),
            results_dir: root.join("results"),
            protected: vec![],
            min_free_disk_mb: 0,
        }
    }

    /// The server's folder of agent sockets, one folder per sandbox.
    pub fn agents_dir(&self) -> PathBuf {
        self.state_dir.join("agents")
    }

    /// Where the sandboxes' snapshot stores live, one folder each.
    pub fn snapshots_dir(&self) -> PathBuf {
        self.state_dir.join("snapshots")
    }

    /// The capped file systems of the sandboxes, as `[sandbox]` sizes them,
    /// made and mounted through `host`.
    pub fn disks(&self, host: Arc<dyn Syscalls>) -> Disks {
        let s = &self.sandbox;
        let layout = Layout {
            root: self.state_dir.join("disks"),
            results_dir: self.results_dir.clone(),
            agents_dir: self.agents_dir(),
            snapshots_dir: self.snapshots_dir(),
        };
        let results = Cap {
            mb: s.results_mb,
            inodes: s.results_inodes,
        };
        let packages = Cap {
            mb: s.packages_mb,
            inodes: s.packages_inodes,
        };
        let snapshots = Cap {
            mb: s.snapshots_mb,
            inodes: s.snapshots_inodes,
        };
        Disks::new(host, layout, results, packages, snapshots)
    }

    /// What the egress proxy is set up with.
    pub fn egress(&self) -> EgressSettings {
        EgressSettings {
            root: self.state_dir.join("egress"),
            default: self.sandbox.network,
            max_connections: self.sandbox.egress_max_connections,
            max_total_connections: self.egress_total_connections,
            mb_per_minute: self.sandbox.egress_mb_per_minute,
            allow: self.sandbox.egress_allow.clone(),
            packages_hosts: self.packages.hosts(),
        }
    }
}

/// `[packages]`: where `install_package_in_sandbox` gets packages from.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PackagesConfig {
    pub index_url: Option<String>,
    pub extra_index_url: Option<String>,
    /// Lets installs for sandboxes without network build source
    /// distributions. Their build code then runs in the installer container,
    /// which has network, so it is off: such installs take wheels only.
    pub allow_source_builds: bool,
    /// Hosts the index sends its files from; with the index hosts, what the
    /// `packages` egress policy lets through.
    pub file_hosts: Vec<String>,
}

/// The index used when `index_url` is not set.
pub const DEFAULT_INDEX_URL: &str = "https://pypi.org/simple";

impl Default for PackagesConfig {
    fn default() -> Self {
        Self {
            index_url: None,
            extra_index_url: None,
            allow_source_builds: false,
            file_hosts: vec!["files.pythonhosted.org".into()],
        }
    }
}

impl PackagesConfig {
    /// The hosts installs contact: the index's, the extra index's, the file hosts.
    pub fn hosts(&self) -> Vec<String> {
        let index = self.index_url.as_deref().unwrap_or(DEFAULT_INDEX_URL);
        let mut hosts: Vec<String> = [Some(index), self.extra_index_url.as_deref()]
            .into_iter()
            .flatten()
            .filter_map(url_host)
            .chain(self.file_hosts.iter().map(|h| h.to_ascii_lowercase()))
            .collect();
        hosts.dedup();
        hosts
    }

    pub fn validate(&self) -> Result<(), InvalidConfig> {
        for (key, url) in [
            ("index_url", &self.index_url),
            ("extra_index_url", &self.extra_index_url),
        ] {
            if let Some(url) = url {
                if url_host(url).is_none() {
                    return Err(invalid(
                        format!("packages.{key}"),
                        format!("an http(s) URL with a host, not {url:?}"),
                    ));
                }
            }
        }
        if let Some(bad) = self.file_hosts.iter().find(|h| !is_host_name(h)) {
            return Err(invalid("packages.file_hosts", format!("{bad:?} is not a host name")));
        }
        Ok(())
    }
}

/// The lower-cased host of an http(s) URL.
fn url_host(url: &str) -> Option<String> {
    let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"))?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let host = authority.rsplit('@').next()?;
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next()?,
        None => host.split(':').next()?,
    };
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

/// `[usage]`: what each tenant's sandboxes use, sampled and kept by the hour
/// (see [`crate::usage`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UsageConfig {
    /// How often every sandbox's counters are read and the hour's figures
    /// written (5 to 300 s): a crash of the server loses at most this long.
    pub sample_seconds: u64,
    /// Hourly figures older than this many days are removed (1 to 3660).
    pub retention_days: u64,
}

impl Default for UsageConfig {
    fn default() -> Self {
        Self {
            sample_seconds: 15,
            retention_days: 90,
        }
    }
}

impl UsageConfig {
    /// Checks what serde cannot; each message names the offending key.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        if !(5..=300).contains(&self.sample_seconds) {
            return Err(invalid("usage.sample_seconds", "from 5 to 300"));
        }
        if !(1..=3660).contains(&self.retention_days) {
            return Err(invalid("usage.retention_days", "from 1 to 3660"));
        }
        Ok(())
    }
}

/// `[processes]`: background processes (`start_process`) and the ports a
/// sandbox exposes through preview links.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProcessesConfig {
    /// Processes one sandbox may run at once (1 to 64); as many ended ones
    /// are remembered, the oldest forgotten with their output.
    pub max_per_sandbox: usize,
    /// Output kept per process, in KiB (64 to 65536), on the sandbox's own
    /// disk: past it the oldest half is dropped, and reads say so.
    pub output_kept_kb: u64,
    /// Ports one sandbox may expose through preview links (1 to 64).
    pub max_exposed_ports: usize,
}

impl Default for ProcessesConfig {
    fn default() -> Self {
        Self {
            max_per_sandbox: 16,
            output_kept_kb: 1024,
            max_exposed_ports: 8,
        }
    }
}

impl ProcessesConfig {
    /// Checks what serde cannot; each message names the offending key.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        if !(1..=64).contains(&self.max_per_sandbox) {
            return Err(invalid("processes.max_per_sandbox", "from 1 to 64"));
        }
        if !(64..=65536).contains(&self.output_kept_kb) {
            return Err(invalid("processes.output_kept_kb", "from 64 to 65536"));
        }
        if !(1..=64).contains(&self.max_exposed_ports) {
            return Err(invalid("processes.max_exposed_ports", "from 1 to 64"));
        }
        Ok(())
    }
}

/// `[pool]`: sandboxes kept ready for `create_sandbox`, between `min` and
/// `max` as demand shows (see `pool_target`).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    /// Kept ready always. `size`, its earlier name, is renamed by the
    /// server's configuration loader.
    pub min: PoolMin,
    /// The most ready-but-unclaimed sandboxes demand may raise the pool to.
    pub max: usize,
    /// Without a claim for this long, the pool steps back down towards `min`.
    pub shrink_after_seconds: u64,
    /// Creations the pool runs at once (1 to 64): about what the engine
    /// sustains, since creations beyond it only slow each other down.
    pub creations_at_once: usize,
}

/// The most creations the pool may run at once.
pub const MAX_CREATIONS_AT_ONCE: usize = 64;

/// What a waiting pooled sandbox holds of the host's memory: its agent's
/// and worker's interpreters and the engine's shim (docs/benchmarks.md).
pub const POOLED_SANDBOX_BYTES: u64 = 20 << 20;

/// `pool.min = "auto"`: the sandboxes that fit in a 16th of the host's
/// memory at [`POOLED_SANDBOX_BYTES`] each, from 2 to 64. Every one ready
/// is one cold creation fewer when a burst meets a fresh server (the
/// engine makes 11 to 17 a second on two cores): with 64 ready a fresh
/// server's burst of 100 ended within 3.3 s, with 2 within 8.9
/// (docs/benchmarks.md). 64 hold about 1.3 GB, 5 % of a 24 GiB host; a
/// 2 GiB host keeps 6. An unknown host size counts as none, so 2.
pub fn auto_pool_min(host_memory_bytes: Option<u64>) -> usize {
    let fit = host_memory_bytes.unwrap_or(0) / 16 / POOLED_SANDBOX_BYTES;
    (fit as usize).clamp(2, 64)
}

/// `pool.min`: a number (0: no pool), or `"auto"`, which the pool resolves
/// for the host it runs on when it starts ([`PoolMin::resolve`]), not the
/// configuration as it is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMin {
    Fixed(usize),
    Auto,
}

impl PoolMin {
    /// The number of sandboxes kept ready on a host of `host_memory_bytes`.
    pub fn resolve(self, host_memory_bytes: Option<u64>) -> usize {
        match self {
            PoolMin::Fixed(n) => n,
            PoolMin::Auto => auto_pool_min(host_memory_bytes),
        }
    }
}

impl<'de> Deserialize<'de> for PoolMin {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Min {
            Fixed(usize),
            Named(String),
        }
        match Min::deserialize(d)? {
            Min::Fixed(n) => Ok(PoolMin::Fixed(n)),
            Min::Named(s) if s == "auto" => Ok(PoolMin::Auto),
            Min::Named(s) => Err(serde::de::Error::custom(format!("a number or \"auto\", not {s:?}"))),
        }
    }
}

impl PoolConfig {
    /// Checks what serde cannot; each message names the offending key.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        if !(1..=MAX_CREATIONS_AT_ONCE).contains(&self.creations_at_once) {
            return Err(invalid(
                "pool.creations_at_once",
                format!("between 1 and {MAX_CREATIONS_AT_ONCE}"),
            ));
        }
        Ok(())
    }
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            min: PoolMin::Auto,
            max: 100,
            shrink_after_seconds: 300,
            creations_at_once: 4,
        }
    }
}

impl PoolConfig {
    /// No pool at all (tests and benchmarks that count their containers).
    pub fn off() -> Self {
        Self::fixed(0)
    }

    /// Exactly `n` kept ready, whatever the demand.
    pub fn fixed(n: usize) -> Self {
        Self {
            min: PoolMin::Fixed(n),
            max: n,
            ..Self::default()
        }
    }
}

/// `[uploads]`: host folders `upload_file_to_sandbox` may copy from, and
/// the largest file sent over HTTP (web UI, REST API).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UploadsConfig {
    /// Absolute folders. The server's configuration check refuses one that
    /// is, holds or lies inside the results or state folder: every tenant
    /// could upload from it, so every tenant could copy every tenant's
    /// files, or the server's records and link secret, into its sandbox.
    pub allowed_dirs: Vec<PathBuf>,
    pub max_upload_mb: u64,
}

impl Default for UploadsConfig {
    fn default() -> Self {
        Self {
            allowed_dirs: vec![],
            max_upload_mb: 32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_automatic_pool_minimum_follows_the_host_s_memory_within_bounds() {
        const GIB: u64 = 1 << 30;
        assert_eq!(auto_pool_min(None), 2);
        assert_eq!(auto_pool_min(Some(GIB / 2)), 2);
        assert_eq!(auto_pool_min(Some(2 * GIB)), 6);
        assert_eq!(auto_pool_min(Some(8 * GIB)), 25);
        assert_eq!(auto_pool_min(Some(24 * GIB)), 64);
        assert_eq!(auto_pool_min(Some(1024 * GIB)), 64);
    }
}
