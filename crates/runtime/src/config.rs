//! The `[sandbox]` section of `config.toml`: the image, the OCI runtime and
//! the limits of every container (the server embeds it in its own
//! configuration), and the error every section's check answers with.

use std::path::PathBuf;

use sandbox_egress::{EgressPolicy, RuleError, Rules};
use serde::Deserialize;

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

/// An [`InvalidConfig::Value`] for `key`.
pub fn invalid(key: impl Into<String>, detail: impl Into<String>) -> InvalidConfig {
    InvalidConfig::Value {
        key: key.into(),
        detail: detail.into(),
    }
}

/// The OCI runtimes a sandbox may run under. `runc` and `crun` confine a
/// container with the same kernel features (namespaces, cgroups, seccomp,
/// capabilities); `runsc` puts gVisor's user-space kernel in between. Each
/// but `runc` must be registered with Docker under this name.
pub const OCI_RUNTIMES: [&str; 3] = ["runc", "crun", "runsc"];

/// `sandbox.runtime = "auto"`: crun where the engine has it registered and
/// it starts a container, runc otherwise (see `DockerRuntime::choose_oci_runtime`).
pub const AUTO_OCI_RUNTIME: &str = "auto";

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
    /// OCI runtime, one of [`OCI_RUNTIMES`]: `runc`, `crun` or `runsc`
    /// (gVisor); or [`AUTO_OCI_RUNTIME`], which the runtime replaces with its
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
    /// An idle sandbox sleeps on disk after this long without calls (its
    /// Python namespace written out, its container removed, its disks
    /// unmounted), and wakes with its next call (0: never).
    pub hibernate_after_seconds: u64,
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
    /// Size of each sandbox's snapshot store on the host, the file system
    /// its snapshots' saved folders live in (0: not capped).
    pub snapshots_mb: u64,
    /// Files and folders the snapshot store may hold.
    pub snapshots_inodes: u64,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            image: "mcp-sandbox-python".into(),
            runtime: AUTO_OCI_RUNTIME.into(),
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
            hibernate_after_seconds: 1800,
            results_mb: 1024,
            results_inodes: 100_000,
            packages_mb: 2048,
            packages_inodes: 200_000,
            snapshots_per_sandbox: 3,
            snapshots_mb: 4096,
            snapshots_inodes: 400_000,
        }
    }
}

impl SandboxConfig {
    /// Checks what serde cannot; each message names the offending key.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        if self.image.trim().is_empty() || self.image.contains(':') {
            return Err(invalid("sandbox.image", "a repository name without a tag"));
        }
        if self.runtime != AUTO_OCI_RUNTIME && !OCI_RUNTIMES.contains(&self.runtime.as_str()) {
            return Err(invalid(
                "sandbox.runtime",
                format!(
                    "\"{AUTO_OCI_RUNTIME}\" or one of {OCI_RUNTIMES:?}, not {:?}",
                    self.runtime
                ),
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
            (
                "snapshots_mb",
                self.snapshots_mb,
                "snapshots_inodes",
                self.snapshots_inodes,
            ),
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
