//! What the operations return, whoever asked: one typed struct per tool
//! (its `outputSchema`), which the MCP tools send as they are
//! ([`crate::mcp::results`]) and the REST API as JSON.

use sandbox_actors::snapshots::{CarriedState, PythonState, SnapshotInfo};
use sandbox_actors::{CallRecord, DiskUse, Forked, InstallStatusKind, Package, Ran, Receipt, SandboxInfo, Slept};
use sandbox_runtime::outputs::RunError;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::access::artifact_links::ArtifactLinks;
use crate::ops::files::FileListing;
use crate::ops::inline_images::ImageNote;
use crate::ops::outputs::Output;
use crate::ops::timestamps::{millis, rfc3339};

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct CreatedSandbox {
    pub sandbox_id: String,
    pub name: String,
    pub status: String,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// When the sandbox will be removed (RFC 3339, UTC); null: never.
    pub expires_at: Option<String>,
    /// The template it started from (absent: the default environment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ListedSandbox {
    pub sandbox_id: String,
    pub name: String,
    pub status: String,
    pub created_at: String,
    pub expires_at: Option<String>,
    pub installed_packages: Vec<InstalledPackage>,
    /// Disk use against the sandbox's quotas (absent when disks are not capped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskQuotas>,
    /// The snapshots the sandbox keeps (absent when it keeps none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshots: Option<SnapshotUse>,
    /// Ports reachable through preview links (expose_port); absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exposed_ports: Vec<u16>,
    /// The template it started from (absent: the default environment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
}

/// A sandbox's snapshots and the host disk they take.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct SnapshotUse {
    pub count: usize,
    pub disk_mb: u64,
}

/// Use of each capped folder; a write past a quota fails with "No space left on device".
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct DiskQuotas {
    /// `/app/results`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub results: Option<DiskQuota>,
    /// `/app/.venv`, the installed packages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packages: Option<DiskQuota>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct DiskQuota {
    pub used_mb: u64,
    pub quota_mb: u64,
    pub used_files: u64,
    pub quota_files: u64,
    /// Less than 1% is left: delete files before writing more.
    pub full: bool,
}

impl From<DiskUse> for DiskQuota {
    fn from(u: DiskUse) -> Self {
        Self {
            used_mb: u.used_bytes.div_ceil(1 << 20),
            quota_mb: u.limit_bytes >> 20,
            used_files: u.used_files,
            quota_files: u.limit_files,
            full: u.is_full(),
        }
    }
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct InstalledPackage {
    pub name: String,
    pub version: String,
}

/// `structuredContent` must be an object: the list goes under `sandboxes`
/// (the text item is the bare array, as python-mcp-sandbox returns it).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct SandboxList {
    pub sandboxes: Vec<ListedSandbox>,
}

/// The templates the caller may create sandboxes from.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct TemplateList {
    pub templates: Vec<ListedTemplate>,
}

/// A template: what its sandboxes start with, and their limits.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ListedTemplate {
    /// What create_sandbox's `template` names it by.
    pub name: String,
    pub description: String,
    /// The pip requirements installed in it (import them without installing).
    pub packages: Vec<String>,
    /// How many files it places in /app/results.
    pub files: usize,
    /// Its sandboxes' network policy, memory, CPUs and OCI runtime, where
    /// they differ from the server's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// Sizes of /app/results and of the installed packages' volume, in MB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub results_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packages_mb: Option<u64>,
    /// False when its build failed; `error` says why.
    pub available: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl From<sandbox_actors::templates::TemplateInfo> for ListedTemplate {
    fn from(t: sandbox_actors::templates::TemplateInfo) -> Self {
        Self {
            name: t.name,
            description: t.description,
            packages: t.packages,
            files: t.files,
            network: t.network.map(|n| n.name().to_string()),
            memory_mb: t.memory_mb,
            cpus: t.cpus,
            runtime: t.runtime,
            results_mb: t.results_mb,
            packages_mb: t.packages_mb,
            available: t.available,
            error: t.error,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct PythonResult {
    pub stdout: String,
    pub stderr: String,
    /// 0 on success, 1 for an uncaught exception, n for sys.exit(n), 124 on timeout.
    pub exit_code: i64,
    /// Absolute paths (in the sandbox) of files this run created or changed.
    pub files: Vec<String>,
    /// Download links of `files`, in the same order.
    pub file_links: Vec<String>,
    /// The images among `files`, newest first: shown inline as image items
    /// (after the links, in this order), or why not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ImageNote>,
    pub duration_ms: f64,
    pub timed_out: bool,
    /// stdout or stderr was cut to head and tail; the whole is at `output_links`.
    pub truncated: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub output_links: Vec<String>,
    /// Variables and imports were lost (the worker was replaced).
    pub state_lost: bool,
    /// Something that happened to the sandbox since your last call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
    /// What the run showed besides printed text, in order, as a notebook
    /// cell shows it: the last expression's value (`main`), what it passed
    /// to `display()`, and the figures of `plt.show()` or left open.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<Output>,
    /// An uncaught exception, also printed to `stderr`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RunError>,
    /// What the run cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<Receipt>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct CommandResult {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i64,
    /// Absolute paths (in the sandbox) of files this command created or changed.
    pub files: Vec<String>,
    /// Download links of `files`, in the same order.
    pub file_links: Vec<String>,
    /// The images among `files`, as for execute_python_code.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ImageNote>,
    pub timed_out: bool,
    pub truncated: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub output_links: Vec<String>,
    pub duration_ms: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
    /// What the command cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<Receipt>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct InstallResult {
    pub package: String,
    /// installing, success, failed or not_found.
    pub status: String,
    pub message: String,
    /// The installer's output, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct UploadResult {
    pub success: bool,
    pub message: String,
    /// Where the file or folder is now, inside the sandbox.
    pub path: String,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ResetResult {
    pub success: bool,
    pub message: String,
    pub duration_ms: f64,
    /// Something that happened to the sandbox since your last call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
}

/// A snapshot as `snapshot_sandbox` and `list_snapshots` show it.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct SnapshotEntry {
    pub snapshot_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    pub created_at: String,
    /// `saved`: Python variables and imports were saved; `fresh`: no Python
    /// had run, so a restore starts Python afresh; `lost`: they could not
    /// be written to disk when the sandbox went to sleep, so a restore
    /// starts Python afresh.
    pub python: String,
    /// Whether installed packages were saved with the files.
    pub packages_saved: bool,
    /// Files, folders and links saved.
    pub files: u64,
    /// Host disk this snapshot takes (files unchanged since the snapshot
    /// before it are shared with that one).
    pub disk_bytes: u64,
}

impl From<SnapshotInfo> for SnapshotEntry {
    fn from(s: SnapshotInfo) -> Self {
        let packages_saved = s.packages();
        Self {
            snapshot_id: s.snapshot_id.to_string(),
            label: s.label,
            created_at: rfc3339(s.created_at),
            python: match s.python {
                PythonState::Parked | PythonState::Saved | PythonState::Restored => "saved",
                PythonState::Fresh => "fresh",
                PythonState::Lost => "lost",
            }
            .into(),
            packages_saved,
            files: s.files,
            disk_bytes: s.bytes,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct SnapshotResult {
    pub success: bool,
    pub sandbox_id: String,
    #[serde(flatten)]
    pub snapshot: SnapshotEntry,
    pub message: String,
    pub duration_ms: f64,
    /// Something that happened to the sandbox since your last call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct SnapshotList {
    pub sandbox_id: String,
    /// Oldest first.
    pub snapshots: Vec<SnapshotEntry>,
    /// How many snapshots a sandbox may keep.
    pub limit: usize,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct RestoreResult {
    pub success: bool,
    pub sandbox_id: String,
    pub snapshot_id: String,
    /// `restored`: variables and imports are as they were; `fresh`: the
    /// snapshot was taken before any Python ran; `lost`: the saved Python
    /// state did not survive a restart of the sandbox (see `notice`).
    pub python: String,
    pub packages_restored: bool,
    pub message: String,
    pub duration_ms: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
}

/// One new sandbox of a fork.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ForkEntry {
    pub sandbox_id: String,
    pub name: String,
    /// `carried`: every Python variable, function and import came along;
    /// `partial`: some did not (see `not_carried`); `fresh`: no Python had
    /// run in the source, so none runs here either; `lost`: none came (see
    /// `not_carried`), Python starts afresh.
    pub python: String,
    /// How many Python names the fork holds.
    pub python_names: u64,
    /// Names that could not be carried (open files, sockets, threads,
    /// generators, ...), with why; `*` stands for the whole namespace.
    pub not_carried: Vec<NotCarried>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct NotCarried {
    pub name: String,
    pub reason: String,
}

impl NotCarried {
    fn all(skipped: Vec<(String, String)>) -> Vec<Self> {
        skipped
            .into_iter()
            .map(|(name, reason)| NotCarried { name, reason })
            .collect()
    }
}

/// How a result names what became of a Python namespace.
fn carried_name(state: CarriedState) -> &'static str {
    match state {
        CarriedState::Carried => "carried",
        CarriedState::Partial => "partial",
        CarriedState::Fresh => "fresh",
        CarriedState::Lost => "lost",
    }
}

/// What `hibernate_sandbox` answers.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct HibernateResult {
    pub success: bool,
    pub sandbox_id: String,
    /// What of its Python state was saved: `carried` (every variable,
    /// function and import), `partial` (see `not_carried`) or `fresh` (no
    /// Python had run). A namespace that cannot be saved at all is refused
    /// with an error, the sandbox left awake.
    pub python: String,
    pub python_names: u64,
    /// Names that could not be saved, with why.
    pub not_carried: Vec<NotCarried>,
    /// The snapshots whose Python state was kept in memory: what of it was
    /// written to disk (a `lost` one restores files and packages, and a
    /// fresh Python).
    pub snapshots: Vec<SnapshotWritten>,
    pub message: String,
    pub duration_ms: f64,
}

/// What of a snapshot's Python state a sleep wrote to disk.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct SnapshotWritten {
    pub snapshot_id: String,
    /// `carried`, `partial` (see `not_carried`) or `lost`.
    pub python: String,
    pub not_carried: Vec<NotCarried>,
}

impl HibernateResult {
    pub fn new(id: Uuid, slept: Slept, took: std::time::Duration) -> Self {
        let python = match slept.python.python {
            CarriedState::Carried => "its Python variables, functions and imports",
            CarriedState::Partial => "most of its Python state (not what not_carried lists)",
            CarriedState::Fresh => "its Python state (none had run)",
            CarriedState::Lost => "not its Python variables (see not_carried)",
        };
        let lost = slept
            .snapshots
            .iter()
            .filter(|(_, c)| c.python == CarriedState::Lost)
            .count();
        let snapshots = match (slept.snapshots.len(), lost) {
            (0, _) => String::new(),
            (n, 0) => format!(" The Python state of its {n} snapshot(s) was written to disk as well."),
            (n, lost) => format!(
                " The Python state of {} of its {n} snapshot(s) was written to disk; {lost} lost theirs (see \
                 snapshots): restored, they bring back their files and packages and a fresh Python.",
                n - lost
            ),
        };
        let message = match slept.already {
            true => format!("Sandbox {id} was already hibernated. Its next call wakes it."),
            false => format!(
                "Sandbox {id} is hibernated: it holds no memory or container; its files, installed packages and \
                 {python} are saved on its disk. Its next call, of any kind, wakes it (that call's notice says \
                 what came back). Background processes have ended.{snapshots}"
            ),
        };
        Self {
            success: true,
            sandbox_id: id.to_string(),
            python: carried_name(slept.python.python).into(),
            python_names: slept.python.names,
            not_carried: NotCarried::all(slept.python.skipped),
            snapshots: slept
                .snapshots
                .into_iter()
                .map(|(id, c)| SnapshotWritten {
                    snapshot_id: id.to_string(),
                    python: carried_name(c.python).into(),
                    not_carried: NotCarried::all(c.skipped),
                })
                .collect(),
            message,
            duration_ms: millis(took),
        }
    }
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ForkResult {
    pub success: bool,
    /// The sandbox forked.
    pub sandbox_id: String,
    /// The snapshot forked, when the fork started from one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
    /// The new sandboxes, each the caller's own like any other.
    pub forks: Vec<ForkEntry>,
    /// Files, folders and links each fork received in /app/results (and
    /// among its packages).
    pub files: u64,
    pub packages_copied: bool,
    pub message: String,
    pub duration_ms: f64,
    /// Something that happened to the source sandbox since your last call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
}

impl ForkResult {
    pub fn new(source: Uuid, from: Option<Uuid>, forked: Forked, took: std::time::Duration) -> Self {
        let n = forked.forks.len();
        let whole = forked
            .forks
            .iter()
            .all(|f| matches!(f.python.python, CarriedState::Carried | CarriedState::Fresh));
        let what = match forked.packages {
            true => "the files in /app/results and the installed packages",
            false => "the files in /app/results",
        };
        let python = match whole {
            true => "Python variables, functions and imports came along",
            false => "some Python state did not come along (see python and not_carried)",
        };
        let forks = forked
            .forks
            .into_iter()
            .map(|f| ForkEntry {
                sandbox_id: f.info.sandbox_id.to_string(),
                name: f.info.name,
                python: carried_name(f.python.python).into(),
                python_names: f.python.names,
                not_carried: NotCarried::all(f.python.skipped),
            })
            .collect();
        Self {
            success: true,
            sandbox_id: source.to_string(),
            snapshot_id: from.map(|s| s.to_string()),
            forks,
            files: forked.files,
            packages_copied: forked.packages,
            message: format!(
                "Made {n} new sandbox{} with copies of {what}; {python}. Use their sandbox_id like any other.",
                if n == 1 { "" } else { "es" }
            ),
            duration_ms: millis(took),
            notice: forked.notice,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct SnapshotDeleted {
    pub success: bool,
    pub snapshot_id: String,
    pub message: String,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct DeleteResult {
    pub success: bool,
    pub sandbox_id: String,
    pub message: String,
}

fn packages(list: Vec<Package>) -> Vec<InstalledPackage> {
    list.into_iter()
        .map(|p| InstalledPackage {
            name: p.name,
            version: p.version,
        })
        .collect()
}

impl From<SandboxInfo> for CreatedSandbox {
    fn from(i: SandboxInfo) -> Self {
        Self {
            sandbox_id: i.sandbox_id.to_string(),
            name: i.name,
            status: i.status.to_string(),
            created_at: rfc3339(i.created_at),
            expires_at: i.expires_at.map(rfc3339),
            template: i.template,
        }
    }
}

impl ListedSandbox {
    /// A sandbox whose node does not answer: the directory knows its id and
    /// node, nothing more.
    pub(crate) fn unreachable(id: uuid::Uuid, node: &str) -> Self {
        Self {
            sandbox_id: id.to_string(),
            name: format!("(on node {node}, which does not answer)"),
            status: "unreachable".into(),
            created_at: String::new(),
            expires_at: None,
            installed_packages: vec![],
            disk: None,
            snapshots: None,
            exposed_ports: vec![],
            template: None,
        }
    }
}

impl From<SandboxInfo> for ListedSandbox {
    fn from(i: SandboxInfo) -> Self {
        Self {
            sandbox_id: i.sandbox_id.to_string(),
            name: i.name,
            status: i.status.to_string(),
            created_at: rfc3339(i.created_at),
            expires_at: i.expires_at.map(rfc3339),
            installed_packages: packages(i.installed_packages),
            disk: i.disk.map(|d| DiskQuotas {
                results: d.results.map(Into::into),
                packages: d.packages.map(Into::into),
            }),
            snapshots: (i.snapshots.count > 0).then(|| SnapshotUse {
                count: i.snapshots.count,
                disk_mb: i.snapshots.bytes.div_ceil(1 << 20),
            }),
            exposed_ports: i.exposed_ports,
            template: i.template,
        }
    }
}

impl From<sandbox_actors::InstallStatus> for InstallResult {
    fn from(s: sandbox_actors::InstallStatus) -> Self {
        let status = match s.status {
            InstallStatusKind::Installing => "installing",
            InstallStatusKind::Success => "success",
            InstallStatusKind::Failed => "failed",
            InstallStatusKind::NotFound => "not_found",
        };
        Self {
            package: s.package,
            status: status.into(),
            message: s.message,
            output: s.output,
        }
    }
}

impl UploadResult {
    pub fn new(up: sandbox_actors::Uploaded, sandbox: uuid::Uuid) -> Self {
        Self {
            success: true,
            message: format!("{} in sandbox {sandbox}", up.message),
            path: up.path,
        }
    }
}

impl PythonResult {
    pub fn new(ran: Ran, links: &ArtifactLinks, sandbox: uuid::Uuid) -> Self {
        let o = ran.output;
        Self {
            file_links: o.files.iter().map(|f| links.artifact(sandbox, f)).collect(),
            output_links: o.output_files.iter().map(|f| links.artifact(sandbox, f)).collect(),
            files: o.files,
            images: vec![],
            stdout: o.stdout,
            stderr: o.stderr,
            exit_code: o.exit_code,
            duration_ms: o.duration_ms,
            timed_out: o.timed_out,
            truncated: o.truncated,
            state_lost: o.state_lost,
            notice: ran.notice,
            outputs: Output::all(o.outputs, links, sandbox),
            error: o.error,
            receipt: ran.receipt,
        }
    }
}

impl CommandResult {
    pub fn new(ran: Ran, links: &ArtifactLinks, sandbox: uuid::Uuid) -> Self {
        let o = ran.output;
        Self {
            file_links: o.files.iter().map(|f| links.artifact(sandbox, f)).collect(),
            output_links: o.output_files.iter().map(|f| links.artifact(sandbox, f)).collect(),
            files: o.files,
            images: vec![],
            stdout: o.stdout,
            stderr: o.stderr,
            exit_code: o.exit_code,
            timed_out: o.timed_out,
            truncated: o.truncated,
            duration_ms: o.duration_ms,
            notice: ran.notice,
            receipt: ran.receipt,
        }
    }
}

/// What the sandbox view (the MCP App) shows of one sandbox: it as
/// `list_sandboxes` lists it, its files under `/app/results` with their
/// links, and its most recent calls, oldest first.
#[derive(Debug, Serialize, Deserialize)]
pub struct SandboxView {
    pub sandbox: ListedSandbox,
    pub files: FileListing,
    pub history: Vec<CallRecord>,
}
