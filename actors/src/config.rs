//! Settings the sandbox domain needs, deserialised straight from the
//! `[sandbox]`, `[packages]` and `[uploads]` sections of `config.toml`
//! (the server embeds these types in its own configuration), and the
//! [`Settings`] that join them with the server's folders.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::egress_rules::{is_host_name, RuleError, Rules};

/// A value serde accepted that the sandbox domain cannot use; the message
/// names the key.
#[derive(Debug, thiserror::Error)]
pub enum InvalidConfig {
    /// `detail` says what the key must hold.
    #[error("{key}: {detail}")]
    Value { key: String, detail: String },
    /// An allow-list entry is none of the accepted forms.
    #[error("{key}: {source}")]
    Rules { key: &'static str, source: RuleError },
}

fn invalid(key: impl Into<String>, detail: impl Into<String>) -> InvalidConfig {
    InvalidConfig::Value {
        key: key.into(),
        detail: detail.into(),
    }
}

/// Settings of the sandbox domain, from the server's configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    pub sandbox: SandboxConfig,
    pub packages: PackagesConfig,
    pub uploads: UploadsConfig,
    pub pool: PoolConfig,
    pub usage: UsageConfig,
    /// The server's own folder: records and agent sockets. Never uploadable.
    pub state_dir: PathBuf,
    /// Host folder holding each sandbox's `/app/results`.
    pub results_dir: PathBuf,
    /// Files that must never be uploaded into a sandbox (the config file).
    pub protected: Vec<PathBuf>,
    /// New sandboxes and installs are refused while the state or results
    /// folder's file system has less free space than this (0: never).
    pub min_free_disk_mb: u64,
    /// Sandboxes the server may hold (`limits.max_sandboxes_total`): the
    /// pool fills only the room the live ones leave under it.
    pub max_sandboxes_total: usize,
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
            max_sandboxes_total: usize::MAX,
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
}

/// The OCI runtimes a sandbox may run under. `runc` and `crun` confine a
/// container with the same kernel features (namespaces, cgroups, seccomp,
/// capabilities); `runsc` puts gVisor's user-space kernel in between. Each
/// but `runc` must be registered with Docker under this name.
pub const RUNTIMES: [&str; 3] = ["runc", "crun", "runsc"];

/// `sandbox.runtime = "auto"`: crun where the engine has it registered and
/// it starts a container, runc otherwise (see `DockerRuntime::choose_runtime`).
pub const AUTO_RUNTIME: &str = "auto";

/// The most snapshots a sandbox may be allowed to keep: each holds a parked
/// Python process and a copy of the sandbox's disks.
pub const MAX_SNAPSHOTS: usize = 16;

/// The lowest `egress_mb_per_minute` (about 70 KB a second): the kernel's
/// byte-rate match charges a packet larger than one second of the rate as
/// one second, and after receive offloads a packet it sees is up to 64 KiB,
/// so below 64 KiB a second one packet a second, whatever its size, would
/// pass.
pub const MIN_EGRESS_MB_PER_MINUTE: u64 = 4;

/// `[sandbox]`: the image, the OCI runtime and the limits of every container.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxConfig {
    /// Image repository; the tag is a hash of the build context, so a server
    /// only ever runs the image that matches its own agent.
    pub image: String,
    /// OCI runtime, one of [`RUNTIMES`]: `runc`, `crun` or `runsc`
    /// (gVisor); or [`AUTO_RUNTIME`], which the runtime replaces with its
    /// choice when it connects.
    pub runtime: String,
    /// Egress policy of every sandbox unless its key sets another.
    pub network: EgressPolicy,
    /// What `allowlist` lets through: host names, `*.suffix` wildcards and
    /// CIDRs. A listed CIDR is also the only way to reach a private range.
    pub egress_allow: Vec<String>,
    /// Connections one sandbox may hold open through the egress proxy.
    pub egress_max_connections: usize,
    /// Bytes (both directions, MiB) one sandbox may move through the egress
    /// proxy per minute; beyond it its connections wait for the next minute.
    /// At least [`MIN_EGRESS_MB_PER_MINUTE`].
    pub egress_mb_per_minute: u64,
    pub memory_mb: u64,
    pub cpus: f64,
    pub pids_limit: i64,
    /// Size of the `/tmp` tmpfs, which also holds run output before it is read.
    pub tmp_size_mb: u64,
    pub exec_timeout_seconds: u64,
    pub max_exec_timeout_seconds: u64,
    pub install_timeout_seconds: u64,
    /// Bytes of stdout and of stderr returned in full; beyond it head and tail.
    pub output_cap_bytes: usize,
    /// Host CA bundle mounted read-only into sandboxes (and used for the image
    /// build) so pip works behind a TLS-intercepting proxy.
    pub ca_bundle: Option<PathBuf>,
    /// A sandbox is removed this long after creation (0: never).
    pub max_lifetime_seconds: u64,
    /// A sandbox is removed after this long without calls (0: never).
    pub idle_timeout_seconds: u64,
    /// Calls that may wait in one sandbox's queue; more are refused.
    pub max_queued_calls: usize,
    /// An idle sandbox is paused (frozen: memory kept, no CPU) after this
    /// long without calls, and unpaused by the next call (0: never).
    pub pause_after_seconds: u64,
    /// Bridged sandboxes get the server's own network, and host firewall
    /// rules keep them from the host's services and link-local addresses.
    pub isolate_host: bool,
    /// Size of each sandbox's `/app/results` file system (0: not capped).
    pub results_mb: u64,
    /// Files and folders `/app/results` may hold.
    pub results_inodes: u64,
    /// Size of each sandbox's package volume, `/app/.venv` (0: not capped).
    pub packages_mb: u64,
    /// Files and folders the package volume may hold.
    pub packages_inodes: u64,
    /// Snapshots each sandbox may keep (0: snapshots are off).
    pub snapshots_per_sandbox: usize,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            image: "mcp-sandbox-python".into(),
            runtime: AUTO_RUNTIME.into(),
            network: EgressPolicy::Open,
            egress_allow: vec![],
            egress_max_connections: 64,
            egress_mb_per_minute: 512,
            memory_mb: 512,
            cpus: 1.0,
            pids_limit: 256,
            tmp_size_mb: 256,
            exec_timeout_seconds: 30,
            max_exec_timeout_seconds: 600,
            install_timeout_seconds: 300,
            output_cap_bytes: 64 * 1024,
            ca_bundle: None,
            max_lifetime_seconds: 0,
            idle_timeout_seconds: 0,
            max_queued_calls: 16,
            isolate_host: true,
            pause_after_seconds: 60,
            results_mb: 1024,
            results_inodes: 100_000,
            packages_mb: 2048,
            packages_inodes: 200_000,
            snapshots_per_sandbox: 3,
        }
    }
}

/// What a sandbox may reach beyond itself. Every policy but `open` gives the
/// sandbox no network interface at all: its only way out is the server's
/// egress proxy, which applies the policy to each connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EgressPolicy {
    /// Loopback only; installs go through an installer container.
    None,
    /// The package index and its file hosts (`[packages]`), so `pip install` works.
    Packages,
    /// The hosts and CIDRs of `sandbox.egress_allow`.
    Allowlist,
    /// The server's bridge network: anything but the host, link-local
    /// addresses, private ranges and other sandboxes.
    #[serde(alias = "bridge")]
    Open,
}

impl EgressPolicy {
    /// The policy's name in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            EgressPolicy::None => "none",
            EgressPolicy::Packages => "packages",
            EgressPolicy::Allowlist => "allowlist",
            EgressPolicy::Open => "open",
        }
    }

    /// Whether the sandbox has no interface and reaches out through the proxy.
    pub fn is_proxied(self) -> bool {
        self != EgressPolicy::Open
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

/// `[pool]`: sandboxes kept ready for `create_sandbox`, between `min` and
/// `max` as demand shows (see `pool_target`).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    /// Kept ready always (0: no pool), or `"auto"`: as many as
    /// [`auto_pool_min`] gives for this host. `size`, its earlier name, is
    /// renamed by the server's configuration loader.
    #[serde(deserialize_with = "pool_min")]
    pub min: usize,
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

/// `pool.min`: a number, or `"auto"` resolved for this host as it is read.
fn pool_min<'de, D: serde::Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Min {
        Fixed(usize),
        Named(String),
    }
    match Min::deserialize(d)? {
        Min::Fixed(n) => Ok(n),
        Min::Named(s) if s == "auto" => Ok(auto_pool_min(crate::host::memory_bytes())),
        Min::Named(s) => Err(serde::de::Error::custom(format!("a number or \"auto\", not {s:?}"))),
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
            min: auto_pool_min(crate::host::memory_bytes()),
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
            min: n,
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

impl SandboxConfig {
    /// Checks what serde cannot; each message names the offending key.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        if self.image.trim().is_empty() || self.image.contains(':') {
            return Err(invalid("sandbox.image", "a repository name without a tag"));
        }
        if self.runtime != AUTO_RUNTIME && !RUNTIMES.contains(&self.runtime.as_str()) {
            return Err(invalid(
                "sandbox.runtime",
                format!("\"{AUTO_RUNTIME}\" or one of {RUNTIMES:?}, not {:?}", self.runtime),
            ));
        }
        if self.memory_mb < 64 {
            return Err(invalid("sandbox.memory_mb", "at least 64"));
        }
        if !(self.cpus > 0.0 && self.cpus <= 64.0) {
            return Err(invalid("sandbox.cpus", "more than 0 and at most 64"));
        }
        if self.pids_limit < 32 {
            return Err(invalid("sandbox.pids_limit", "at least 32"));
        }
        if self.tmp_size_mb < 16 {
            return Err(invalid("sandbox.tmp_size_mb", "at least 16"));
        }
        if self.exec_timeout_seconds == 0 || self.exec_timeout_seconds > self.max_exec_timeout_seconds {
            return Err(invalid(
                "sandbox.exec_timeout_seconds",
                "at least 1 and at most sandbox.max_exec_timeout_seconds",
            ));
        }
        if self.install_timeout_seconds == 0 {
            return Err(invalid("sandbox.install_timeout_seconds", "at least 1"));
        }
        if self.output_cap_bytes < 1024 {
            return Err(invalid("sandbox.output_cap_bytes", "at least 1024"));
        }
        if self.max_queued_calls == 0 {
            return Err(invalid("sandbox.max_queued_calls", "at least 1"));
        }
        if self.snapshots_per_sandbox > MAX_SNAPSHOTS {
            return Err(invalid(
                "sandbox.snapshots_per_sandbox",
                format!("from 0 (off) to {MAX_SNAPSHOTS}"),
            ));
        }
        if let Err(source) = Rules::parse(&self.egress_allow) {
            return Err(InvalidConfig::Rules {
                key: "sandbox.egress_allow",
                source,
            });
        }
        if self.egress_max_connections == 0 {
            return Err(invalid("sandbox.egress_max_connections", "at least 1"));
        }
        if self.egress_mb_per_minute < MIN_EGRESS_MB_PER_MINUTE {
            return Err(invalid(
                "sandbox.egress_mb_per_minute",
                format!(
                    "at least {MIN_EGRESS_MB_PER_MINUTE}: the host's byte-rate rule charges a packet \
                     larger than one second of the rate as one second, and packets reach 64 KiB \
                     after the kernel's offloads, so a lower rate would not hold"
                ),
            ));
        }
        for (key, mb, inodes_key, inodes) in [
            ("results_mb", self.results_mb, "results_inodes", self.results_inodes),
            ("packages_mb", self.packages_mb, "packages_inodes", self.packages_inodes),
        ] {
            if mb != 0 && !(16..=1 << 20).contains(&mb) {
                return Err(invalid(
                    format!("sandbox.{key}"),
                    "0 (not capped) or from 16 to 1048576",
                ));
            }
            // ext4 needs a few inodes of its own and at most one per 1 KiB block.
            if mb != 0 && !(256..=mb * 1024).contains(&inodes) {
                return Err(invalid(
                    format!("sandbox.{inodes_key}"),
                    format!("from 256 to 1024 per MB of sandbox.{key}"),
                ));
            }
        }
        if let Some(path) = &self.ca_bundle {
            if !path.is_file() {
                return Err(invalid(
                    "sandbox.ca_bundle",
                    format!("{} is not a file", path.display()),
                ));
            }
        }
        Ok(())
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
