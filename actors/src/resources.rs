//! What the sandboxes take from the host, and the free-disk guard that
//! refuses new work which writes to the host's disk when it is nearly full.

use sandbox_host::figures::free_disk_bytes;

use crate::config::Settings;
use crate::error::{Result, SandboxError};

/// What the sandboxes take from the host.
#[derive(Debug, Clone, Copy, Default)]
pub struct Resources {
    /// Free space where sandbox data lives (see [`sandbox_disk_free_bytes`]).
    pub disk_free_bytes: Option<u64>,
    /// Memory limits of every sandbox container, pooled ones included, added up.
    pub memory_limits_bytes: u64,
    pub host_memory_bytes: Option<u64>,
}

/// The free disk space that decides the guard: the fuller of the state
/// folder's (sandbox disk images) and the results folder's file systems.
pub fn sandbox_disk_free_bytes(settings: &Settings) -> Option<u64> {
    free_disk_bytes([settings.state_dir.as_path(), settings.results_dir.as_path()])
}

/// Refuses new work that writes to the host's disk (a sandbox, an
/// install) while free space is below `min_free_disk_mb`.
pub fn check_free_disk(settings: &Settings) -> Result<()> {
    let min = settings.min_free_disk_mb;
    match sandbox_disk_free_bytes(settings) {
        Some(free) if min > 0 && free < min << 20 => Err(SandboxError::Quota(format!(
            "the server's disk is nearly full ({} MB free, {min} MB required by limits.min_free_disk_mb): no new sandboxes or installs until space is freed; try again later",
            free >> 20
        ))),
        _ => Ok(()),
    }
}
