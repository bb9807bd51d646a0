//! The operations on sandboxes that callers may ask for, shared by the MCP
//! tools and the REST API (and through it the web UI): one code path checks
//! arguments and limits, reaches the domain in the caller's scope, counts and
//! logs the call, and builds the typed result. Front ends only translate.
//!
//! This folder: the operations (here), the neutral result types
//! (`results`, `files`), images shown inline (`inline_images`), long calls
//! as MCP tasks (`tasks`), how a result goes over MCP (`mcp_results`) and
//! usage reports (`usage`).
//! May import `access` and `metrics`; nothing of `config`, `mcp` or `http`.

pub(crate) mod files;
pub(crate) mod inline_images;
pub(crate) mod mcp_results;
pub(crate) mod results;
pub(crate) mod tasks;
pub(crate) mod timestamps;
pub(crate) mod usage;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sandbox_actors::{CreateOptions, Progress, Quota, Ran, SandboxError, SandboxInfo, Sandboxes, Work, MAX_FORKS};
use tokio::sync::mpsc;
use tracing::Instrument;
use uuid::Uuid;

use sandbox_actors::files::{ListOptions, ResultsPath, Window, MAX_LIST_DEPTH, MAX_LIST_ENTRIES, MAX_READ_BYTES};
use sandbox_actors::snapshots::PythonState;

use crate::access::artifact_links::ArtifactLinks;
use crate::access::budgets::Budget;
use crate::access::caller::Caller;
use crate::access::limits::Limits;
use crate::metrics::Metrics;
use crate::ops::files::{FileListing, Read, WriteResult};
use crate::ops::inline_images::{Inliner, RunImages};
use crate::ops::results::{
    CommandResult, CreatedSandbox, DeleteResult, ForkResult, InstallResult, PythonResult, ResetResult, RestoreResult,
    SandboxView, SnapshotDeleted, SnapshotList, SnapshotResult, UploadResult,
};
use crate::ops::tasks::Tasks;

/// Largest `code` and `command` accepted.
pub const MAX_CODE_BYTES: usize = 1024 * 1024;
pub const MAX_COMMAND_BYTES: usize = 64 * 1024;
/// How long an install request waits before answering `installing`
/// (unless it may become a task, which waits for the end).
pub const INSTALL_WAIT: Duration = Duration::from_secs(5);
/// What `list_files` and `read_file` do unless asked otherwise: enough to
/// see a folder's layout or a screenful of text, few tokens.
pub const DEFAULT_LIST_DEPTH: u64 = 2;
pub const DEFAULT_LIST_ENTRIES: u64 = 200;
pub const DEFAULT_READ_BYTES: u64 = 16 * 1024;

type Result<T> = std::result::Result<T, SandboxError>;

/// Who runs what where, for one execution.
struct Run<'a> {
    caller: &'a Caller,
    raw_id: &'a str,
    timeout: Option<u64>,
    progress: Option<mpsc::Sender<Progress>>,
}

#[derive(Clone)]
pub struct Ops {
    pub sandboxes: Arc<Sandboxes>,
    pub links: ArtifactLinks,
    pub limits: Arc<Limits>,
    pub metrics: Arc<Metrics>,
    pub images: Inliner,
    /// Long calls that became tasks, across all sessions.
    pub tasks: Tasks,
}

pub fn parse_id(raw: &str) -> Result<Uuid> {
    Uuid::parse_str(raw.trim()).map_err(|_| {
        SandboxError::InvalidArgument(format!(
            "sandbox_id {raw:?} is not a sandbox id; use the sandbox_id from create_sandbox or list_sandboxes"
        ))
    })
}

fn parse_snapshot_id(raw: &str) -> Result<Uuid> {
    Uuid::parse_str(raw.trim()).map_err(|_| {
        SandboxError::InvalidArgument(format!(
            "snapshot_id {raw:?} is not a snapshot id; use the snapshot_id from snapshot_sandbox or list_snapshots"
        ))
    })
}

/// `value` (default `default`) when it lies in `1..=max`.
fn in_range(what: &str, value: Option<u64>, default: u64, max: usize) -> Result<usize> {
    match value.unwrap_or(default) {
        v @ 1.. if v <= max as u64 => Ok(v as usize),
        v => Err(SandboxError::InvalidArgument(format!("{what} is {v}; give 1 to {max}"))),
    }
}

fn check_len(what: &str, value: &str, max: usize) -> Result<()> {
    match value.len() {
        len if len > max => Err(SandboxError::InvalidArgument(format!(
            "{what} is {len} bytes; at most {max} are accepted"
        ))),
        _ => Ok(()),
    }
}

impl Ops {
    /// Refuses new work (runs, installs, creations, forks, restarts,
    /// snapshots and restores) to a tenant past one of its monthly budgets.
    fn check_budget(&self, caller: &Caller) -> Result<()> {
        let budget = self.limits.budget(&caller.owner);
        if budget == Budget::default() {
            return Ok(());
        }
        let (used, renews) = self.sandboxes.usage_this_month(&caller.owner);
        budget.check(&used, renews).map_err(SandboxError::Quota)
    }

    pub async fn create(&self, caller: &Caller, name: Option<String>) -> Result<CreatedSandbox> {
        self.metrics
            .observe("create_sandbox", None, async {
                self.check_budget(caller)?;
                let owner = &caller.owner;
                if let Err(wait) = self.limits.check_creation(owner) {
                    return Err(SandboxError::Quota(format!(
                        "too many sandboxes created in the last minute; wait {} s, or reuse one from list_sandboxes",
                        wait.seconds()
                    )));
                }
                let quota = Quota {
                    per_owner: self.limits.max_sandboxes(owner),
                    total: self.limits.max_sandboxes_total(),
                };
                let info = self
                    .sandboxes
                    .create(owner, name, quota, self.create_options(caller))
                    .await?;
                tracing::Span::current().record("sandbox_id", tracing::field::display(info.sandbox_id));
                Ok(CreatedSandbox::from(info))
            })
            .await
    }

    /// A guest's sandboxes end with its key, and after the guest tier's
    /// lifetime at the latest.
    /// A guest's sandboxes end with its key (or the tier's lifetime) and
    /// take the tier's egress policy; a configured key's, its own policy.
    fn create_options(&self, caller: &Caller) -> CreateOptions {
        let Some(expires_at) = caller.expires_at else {
            return CreateOptions {
                egress: self.limits.egress(&caller.owner),
                ..Default::default()
            };
        };
        let key_left = expires_at.saturating_sub(crate::access::signer::unix_now()).max(1);
        let guest = self.limits.guest();
        CreateOptions {
            lifetime: Some(Duration::from_secs(key_left.min(guest.sandbox_lifetime_seconds))),
            egress: guest.network,
        }
    }

    /// The caller's sandboxes (every tenant's for an administrator).
    pub async fn list(&self, caller: &Caller) -> Vec<SandboxInfo> {
        let listed = self
            .metrics
            .observe("list_sandboxes", None, async {
                Ok(self.sandboxes.list(caller.scope()).await)
            })
            .await;
        listed.unwrap_or_default()
    }

    /// Runs Python code; output so far goes to `progress` while it runs.
    pub async fn python(
        &self,
        caller: &Caller,
        raw_id: &str,
        code: String,
        timeout: Option<u64>,
        progress: Option<mpsc::Sender<Progress>>,
    ) -> Result<PythonResult> {
        let work = check_len("code", &code, MAX_CODE_BYTES).map(|()| Work::Python(code));
        let run = Run {
            caller,
            raw_id,
            timeout,
            progress,
        };
        self.execute("execute_python_code", run, work, PythonResult::new).await
    }

    /// Runs a shell command under `sh -c`; the command is one argument,
    /// never spliced into another shell line.
    pub async fn shell(
        &self,
        caller: &Caller,
        raw_id: &str,
        command: String,
        timeout: Option<u64>,
        progress: Option<mpsc::Sender<Progress>>,
    ) -> Result<CommandResult> {
        let argv = |command| vec!["sh".to_string(), "-c".to_string(), command];
        let work = check_len("command", &command, MAX_COMMAND_BYTES).map(|()| Work::Program(argv(command)));
        let run = Run {
            caller,
            raw_id,
            timeout,
            progress,
        };
        self.execute("execute_terminal_command", run, work, CommandResult::new)
            .await
    }

    /// One execution as `tool`: `work` is the checked argument, `finish`
    /// builds the tool's result from what ran.
    async fn execute<T>(
        &self,
        tool: &'static str,
        run: Run<'_>,
        work: Result<Work>,
        finish: fn(Ran, &ArtifactLinks, Uuid) -> T,
    ) -> Result<T> {
        self.on_sandbox(tool, run.raw_id, |id| async move {
            self.check_budget(run.caller)?;
            let ran = self
                .sandboxes
                .run(run.caller.scope(), id, work?, run.timeout, run.progress)
                .await?;
            Ok(finish(ran, &self.links, id))
        })
        .await
    }

    /// A call as `tool` on the sandbox named by `raw_id`, observed (a
    /// malformed id counts as an `invalid_argument` call).
    async fn on_sandbox<T, F>(&self, tool: &'static str, raw_id: &str, call: impl FnOnce(Uuid) -> F) -> Result<T>
    where
        F: Future<Output = Result<T>>,
    {
        let id = parse_id(raw_id);
        let span_id = id.as_ref().ok().copied();
        self.metrics.observe(tool, span_id, async { call(id?).await }).await
    }

    /// The images among a run's `files` as the caller's MCP result shows
    /// them (none when the sandbox is gone or inline images are off).
    pub async fn run_images(&self, caller: &Caller, raw_id: &str, files: &[String]) -> RunImages {
        let root = parse_id(raw_id).and_then(|id| self.sandboxes.results_dir(caller.scope(), id));
        match root {
            Ok(root) => {
                let span = tracing::info_span!("inline_images", files = files.len());
                self.images.run(&root, files).instrument(span).await
            }
            Err(_) => RunImages::default(),
        }
    }

    pub async fn install(&self, caller: &Caller, raw_id: &str, package: &str, wait: Duration) -> Result<InstallResult> {
        self.on_sandbox("install_package_in_sandbox", raw_id, |id| async move {
            self.check_budget(caller)?;
            let status = self.sandboxes.install(caller.scope(), id, package, wait).await?;
            Ok(InstallResult::from(status))
        })
        .await
    }

    pub async fn install_status(&self, caller: &Caller, raw_id: &str, package: &str) -> Result<InstallResult> {
        self.on_sandbox("check_package_installation_status", raw_id, |id| async move {
            let status = self.sandboxes.install_status(caller.scope(), id, package).await?;
            Ok(InstallResult::from(status))
        })
        .await
    }

    /// Copies a file or folder from an allowed host folder.
    pub async fn upload(&self, caller: &Caller, raw_id: &str, local: &str, dest: &str) -> Result<UploadResult> {
        self.on_sandbox("upload_file_to_sandbox", raw_id, |id| async move {
            let up = self.sandboxes.upload(caller.scope(), id, local, dest).await?;
            Ok(UploadResult::new(up, id))
        })
        .await
    }

    /// Writes bytes the caller sent (a browser upload) as a file.
    pub async fn upload_bytes(
        &self,
        caller: &Caller,
        raw_id: &str,
        name: &str,
        data: Vec<u8>,
        dest: &str,
    ) -> Result<UploadResult> {
        self.on_sandbox("upload_file_to_sandbox", raw_id, |id| async move {
            let up = self
                .sandboxes
                .upload_bytes(caller.scope(), id, name, data, dest)
                .await?;
            Ok(UploadResult::new(up, id))
        })
        .await
    }

    /// Lists a folder under `/app/results`, `depth` levels deep, at most
    /// `max_entries` entries.
    pub async fn list_files(
        &self,
        caller: &Caller,
        raw_id: &str,
        path: &str,
        depth: Option<u64>,
        max_entries: Option<u64>,
    ) -> Result<FileListing> {
        self.on_sandbox("list_files", raw_id, |id| {
            self.listing(caller, id, path, depth, max_entries)
        })
        .await
    }

    async fn listing(
        &self,
        caller: &Caller,
        id: Uuid,
        path: &str,
        depth: Option<u64>,
        max_entries: Option<u64>,
    ) -> Result<FileListing> {
        let options = ListOptions {
            depth: in_range("depth", depth, DEFAULT_LIST_DEPTH, MAX_LIST_DEPTH)?,
            max_entries: in_range("max_entries", max_entries, DEFAULT_LIST_ENTRIES, MAX_LIST_ENTRIES)?,
            files_only: false,
        };
        let folder = ResultsPath::parse(path)?;
        let listing = self
            .sandboxes
            .list_files(caller.scope(), id, folder.clone(), options)
            .await?;
        Ok(FileListing::new(&folder, listing, &self.links, id))
    }

    /// One sandbox as the sandbox view shows it: its listing, its files
    /// (two levels, the default number of entries) and its recent calls.
    pub async fn view(&self, caller: &Caller, raw_id: &str) -> Result<SandboxView> {
        self.on_sandbox("view_sandbox", raw_id, |id| async move {
            let (info, files, history) = tokio::try_join!(
                self.sandboxes.info(caller.scope(), id),
                self.listing(caller, id, "/app/results", None, None),
                self.sandboxes.history(caller.scope(), id),
            )?;
            Ok(SandboxView {
                sandbox: info.into(),
                files,
                history,
            })
        })
        .await
    }

    /// Reads a file under `/app/results`: text from `offset`, at most
    /// `max_bytes` bytes and `max_lines` lines (0 or none: no line limit).
    pub async fn read_file(
        &self,
        caller: &Caller,
        raw_id: &str,
        path: &str,
        offset: Option<u64>,
        max_bytes: Option<u64>,
        max_lines: Option<u64>,
    ) -> Result<Read> {
        self.on_sandbox("read_file", raw_id, |id| async move {
            let window = Window {
                offset: offset.unwrap_or(0),
                max_bytes: in_range("max_bytes", max_bytes, DEFAULT_READ_BYTES, MAX_READ_BYTES)?,
                max_lines: usize::try_from(max_lines.unwrap_or(0)).unwrap_or(usize::MAX),
            };
            let target = ResultsPath::parse(path)?;
            let read = self.sandboxes.read_file(caller.scope(), id, target, window).await?;
            Ok(Read::new(read, &self.links, id))
        })
        .await
    }

    /// Writes `content` as a file under `/app/results`, in turn with the
    /// sandbox's other calls.
    pub async fn write_file(&self, caller: &Caller, raw_id: &str, path: &str, content: String) -> Result<WriteResult> {
        self.on_sandbox("write_file", raw_id, |id| async move {
            let target = ResultsPath::parse(path)?;
            let size = content.len() as u64;
            let written = self
                .sandboxes
                .write_file(caller.scope(), id, target.clone(), content.into_bytes())
                .await?;
            Ok(WriteResult {
                success: true,
                link: self.links.artifact(id, &written.path),
                message: format!("Wrote {size} bytes to {}", written.path),
                path: written.path,
                size,
            })
        })
        .await
    }

    /// Gives the sandbox's Python a fresh namespace, in turn with its other calls.
    pub async fn reset_python(&self, caller: &Caller, raw_id: &str) -> Result<ResetResult> {
        self.on_sandbox("reset_python", raw_id, |id| async move {
            let started = std::time::Instant::now();
            let notice = self.sandboxes.reset_python(caller.scope(), id).await?;
            Ok(ResetResult {
                success: true,
                message: "Python was reset: variables and imports are gone; files and installed packages are kept."
                    .into(),
                duration_ms: started.elapsed().as_secs_f64() * 1000.0,
                notice,
            })
        })
        .await
    }

    /// Saves the sandbox's Python state, files and packages, in turn with its other calls.
    pub async fn snapshot(&self, caller: &Caller, raw_id: &str, label: Option<String>) -> Result<SnapshotResult> {
        self.on_sandbox("snapshot_sandbox", raw_id, |id| async move {
            self.check_budget(caller)?;
            let started = std::time::Instant::now();
            let (info, notice) = self.sandboxes.snapshot(caller.scope(), id, label).await?;
            let message = match info.python {
                PythonState::Parked => "Saved the Python state, the files in /app/results",
                _ => "No Python had run yet (a restore starts Python afresh); saved the files in /app/results",
            };
            let packages = if info.packages() {
                " and the installed packages"
            } else {
                ""
            };
            Ok(SnapshotResult {
                success: true,
                sandbox_id: id.to_string(),
                message: format!("{message}{packages}. restore_snapshot with this snapshot_id brings them back."),
                snapshot: info.into(),
                duration_ms: started.elapsed().as_secs_f64() * 1000.0,
                notice,
            })
        })
        .await
    }

    /// Brings a snapshot back, in turn with the sandbox's other calls.
    pub async fn restore_snapshot(&self, caller: &Caller, raw_id: &str, raw_snapshot: &str) -> Result<RestoreResult> {
        self.on_sandbox("restore_snapshot", raw_id, |id| async move {
            let snapshot = parse_snapshot_id(raw_snapshot)?;
            self.check_budget(caller)?;
            let started = std::time::Instant::now();
            let (restored, notice) = self.sandboxes.restore_snapshot(caller.scope(), id, snapshot).await?;
            let (python, message) = match restored.python {
                PythonState::Restored => ("restored", "Python variables and imports,"),
                PythonState::Lost => ("lost", "Python starts afresh (see notice);"),
                _ => ("fresh", "Python starts afresh, as it was when the snapshot was taken;"),
            };
            let packages = match restored.packages {
                true => "files in /app/results and installed packages are",
                false => "files in /app/results are",
            };
            Ok(RestoreResult {
                success: true,
                sandbox_id: id.to_string(),
                snapshot_id: snapshot.to_string(),
                python: python.into(),
                packages_restored: restored.packages,
                message: format!("{message} {packages} as they were at the snapshot."),
                duration_ms: started.elapsed().as_secs_f64() * 1000.0,
                notice,
            })
        })
        .await
    }

    pub async fn list_snapshots(&self, caller: &Caller, raw_id: &str) -> Result<SnapshotList> {
        self.on_sandbox("list_snapshots", raw_id, |id| async move {
            let snapshots = self.sandboxes.list_snapshots(caller.scope(), id).await?;
            Ok(SnapshotList {
                sandbox_id: id.to_string(),
                snapshots: snapshots.into_iter().map(Into::into).collect(),
                limit: self.sandboxes.snapshot_limit(),
            })
        })
        .await
    }

    /// Makes `count` new sandboxes from a sandbox as it is, or from one of
    /// its snapshots; counted as that many creations.
    pub async fn fork(
        &self,
        caller: &Caller,
        raw_id: &str,
        count: Option<u64>,
        raw_snapshot: Option<&str>,
    ) -> Result<ForkResult> {
        self.on_sandbox("fork_sandbox", raw_id, |id| async move {
            let count = in_range("count", count, 1, MAX_FORKS)?;
            let from = raw_snapshot.map(parse_snapshot_id).transpose()?;
            self.check_budget(caller)?;
            let owner = &caller.owner;
            if let Err(wait) = self.limits.check_creations(owner, count) {
                return Err(SandboxError::Quota(match wait {
                    Some(wait) => format!(
                        "a fork of {count} would pass the sandboxes you may create per minute; wait {} s, or fork fewer",
                        wait.seconds()
                    ),
                    None => format!("a fork of {count} is more sandboxes than you may create in a minute; fork fewer"),
                }));
            }
            let quota = Quota {
                per_owner: self.limits.max_sandboxes(owner),
                total: self.limits.max_sandboxes_total(),
            };
            let started = std::time::Instant::now();
            let forked = self
                .sandboxes
                .fork(owner, id, count, from, quota, self.create_options(caller))
                .await?;
            Ok(ForkResult::new(id, from, forked, started.elapsed()))
        })
        .await
    }

    pub async fn delete_snapshot(&self, caller: &Caller, raw_id: &str, raw_snapshot: &str) -> Result<SnapshotDeleted> {
        self.on_sandbox("delete_snapshot", raw_id, |id| async move {
            let snapshot = parse_snapshot_id(raw_snapshot)?;
            self.sandboxes.delete_snapshot(caller.scope(), id, snapshot).await?;
            Ok(SnapshotDeleted {
                success: true,
                snapshot_id: snapshot.to_string(),
                message: format!("Snapshot {snapshot} deleted"),
            })
        })
        .await
    }

    pub async fn restart(&self, caller: &Caller, raw_id: &str) -> Result<SandboxInfo> {
        self.on_sandbox("restart_sandbox", raw_id, |id| async move {
            self.check_budget(caller)?;
            self.sandboxes.restart(caller.scope(), id).await
        })
        .await
    }

    pub async fn delete(&self, caller: &Caller, raw_id: &str) -> Result<DeleteResult> {
        self.on_sandbox("delete_sandbox", raw_id, |id| async move {
            self.sandboxes.delete(caller.scope(), id).await?;
            Ok(DeleteResult {
                success: true,
                sandbox_id: id.to_string(),
                message: format!("Sandbox {id} deleted"),
            })
        })
        .await
    }
}
