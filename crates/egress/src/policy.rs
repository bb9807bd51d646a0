//! The egress policies a sandbox can be under.

use serde::{Deserialize, Serialize};

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
