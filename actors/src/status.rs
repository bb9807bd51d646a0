//! What state a sandbox is in, as listings, metrics and the UI show it.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxStatus {
    Running,
    /// Frozen while idle; the next call thaws it.
    Paused,
    /// A restart is under way (asked for, or after a missed deadline).
    Restarting,
    /// Its container stopped (killed, out of memory); the next call or the
    /// supervisor starts it again.
    Stopped,
    /// Asleep on disk: no container; the next call wakes it.
    Hibernated,
    Deleting,
}

impl SandboxStatus {
    pub const ALL: [SandboxStatus; 6] = [
        SandboxStatus::Running,
        SandboxStatus::Paused,
        SandboxStatus::Restarting,
        SandboxStatus::Stopped,
        SandboxStatus::Hibernated,
        SandboxStatus::Deleting,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SandboxStatus::Running => "running",
            SandboxStatus::Paused => "paused",
            SandboxStatus::Restarting => "restarting",
            SandboxStatus::Stopped => "stopped",
            SandboxStatus::Hibernated => "hibernated",
            SandboxStatus::Deleting => "deleting",
        }
    }
}

impl std::fmt::Display for SandboxStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
