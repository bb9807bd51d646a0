//! What the sandbox actors answer with: a sandbox as listed, an install's
//! status, an upload's outcome.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::config::EgressPolicy;
use crate::records::{InstallRecord, InstallState};
use crate::snapshots::SnapshotTotals;
use crate::status::SandboxStatus;
use sandbox_host::disk::DiskUsage;
use sandbox_runtime::agent::{Carried, Package};

/// What an install status query finds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InstallStatusKind {
    Installing,
    Success,
    Failed,
    NotFound,
}

#[derive(Debug, Clone, Serialize)]
pub struct InstallStatus {
    pub package: String,
    pub status: InstallStatusKind,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
}

impl From<&InstallRecord> for InstallStatus {
    fn from(r: &InstallRecord) -> Self {
        Self {
            package: r.package.clone(),
            status: match r.status {
                InstallState::Installing => InstallStatusKind::Installing,
                InstallState::Success => InstallStatusKind::Success,
                InstallState::Failed => InstallStatusKind::Failed,
            },
            message: r.message.clone(),
            output: r.output.clone(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Uploaded {
    /// The uploaded file or folder inside the sandbox.
    pub path: String,
    pub message: String,
}

/// A sandbox as the front end lists it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxInfo {
    pub sandbox_id: Uuid,
    pub name: String,
    #[serde(skip, default)]
    pub owner: String,
    #[serde(skip, default)]
    pub container_id: String,
    /// The egress policy it was made with (none in records older than
    /// per-sandbox policies).
    #[serde(skip, default)]
    pub egress: Option<EgressPolicy>,
    pub status: SandboxStatus,
    #[serde(with = "crate::moment")]
    pub created_at: OffsetDateTime,
    #[serde(with = "crate::moment::option")]
    pub expires_at: Option<OffsetDateTime>,
    pub installed_packages: Vec<Package>,
    /// Use of the sandbox's capped folders (absent when disks are not capped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskUsage>,
    /// The snapshots the sandbox keeps and the host disk they take.
    pub snapshots: SnapshotTotals,
    /// Ports reachable through preview links.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exposed_ports: Vec<u16>,
    /// When it went to sleep on disk, while it sleeps.
    #[serde(default, with = "crate::moment::option", skip_serializing_if = "Option::is_none")]
    pub hibernated_since: Option<OffsetDateTime>,
    /// The template it was made from (absent: the default sandbox image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
}

/// What a sandbox put to sleep kept of its state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Slept {
    /// What of its Python namespace was written to its disk.
    pub python: Carried,
    /// What of each snapshot's Python copy (parked in memory) was written
    /// out to its store; their files and packages stay.
    pub snapshots: Vec<(Uuid, Carried)>,
    /// It was asleep already.
    pub already: bool,
}
