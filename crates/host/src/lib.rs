//! The Linux host under mcp-sandbox's sandboxes: what the server itself
//! does to the kernel for them, without the container engine.
//!
//! - Network: `netlink` (the kernel's netlink sockets), `veth` (a pair
//!   between the bridge and a container's namespace), `bridge` (joining
//!   `open` sandboxes to the server's bridge network and handing out their
//!   addresses), `conntrack` (forgetting the flows of an address given
//!   back), `firewall` (the iptables rules and bounds of bridged
//!   sandboxes), `addresses` (the host's own networks and name servers).
//! - Disks: `disk` (the kernel-capped file systems of each sandbox),
//!   `loopdev` (loop devices and ext4 mounts), `sparse` (copies that keep
//!   holes).
//! - Files: `symlink_proof` (opening what a path names, one component at a
//!   time, never following a symbolic link).
//! - `figures`: free space, memory, the OOM score.
//! - `syscalls`: the seam every mount, `mkfs`, loop device, iptables run,
//!   network link, container namespace and tracked flow goes through
//!   ([`syscalls::Syscalls`]), with the host's own ([`syscalls::Linux`])
//!   and, for tests, a recording double that plays a small kernel
//!   (`recording`, with the `recording` feature).
//!
//! Nothing here knows of containers, actors, HTTP or MCP; each module has
//! an error type of its own, gathered in [`HostError`].

pub mod addresses;
pub mod bridge;
mod conntrack;
pub mod disk;
pub mod figures;
pub mod firewall;
mod loopdev;
mod netlink;
#[cfg(any(test, feature = "recording"))]
pub mod recording;
pub mod sparse;
pub mod symlink_proof;
pub mod syscalls;
pub mod veth;

use std::path::{Path, PathBuf};

use uuid::Uuid;

/// The sandbox user of the image (docker/Dockerfile): it owns what the
/// server makes for a sandbox on the host's disks.
pub const SANDBOX_UID: u32 = 1000;

/// The host folder of a sandbox's agent socket, in the server's folder of
/// agent sockets.
pub fn agent_dir(agents: &Path, sandbox: Uuid) -> PathBuf {
    agents.join(sandbox.to_string())
}

/// What went wrong on the host.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A sandbox's capped file systems.
    #[error(transparent)]
    Disk(#[from] disk::DiskError),
    /// Joining an `open` sandbox to the bridge.
    #[error(transparent)]
    Network(#[from] bridge::AttachError),
    /// The firewall rules of bridged sandboxes.
    #[error(transparent)]
    Firewall(#[from] firewall::FirewallError),
}
