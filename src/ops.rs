//! The operations on sandboxes that callers may ask for, shared by the MCP
//! tools and the REST API (and through it the web UI): one code path checks
//! arguments and limits, reaches the domain in the caller's scope, counts and
//! logs the call, and builds the typed result. Front ends only translate.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sandbox_actors::{CreateOptions, Progress, Quota, Ran, SandboxError, SandboxInfo, Sandboxes, Work};
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::caller::Caller;
use crate::inline_images::{Inliner, RunImages};
use crate::limits::Limits;
use crate::links::Links;
use crate::metrics::Metrics;
use crate::results::{CommandResult, CreatedSandbox, DeleteResult, InstallResult, PythonResult, UploadResult};

/// Largest `code` and `command` accepted.
pub const MAX_CODE_BYTES: usize = 1024 * 1024;
pub const MAX_COMMAND_BYTES: usize = 64 * 1024;
/// How long an install request waits before answering `installing`.
const INSTALL_WAIT: Duration = Duration::from_secs(5);

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
    pub links: Links,
    pub limits: Arc<Limits>,
    pub metrics: Arc<Metrics>,
    pub images: Inliner,
}

pub fn parse_id(raw: &str) -> Result<Uuid> {
    Uuid::parse_str(raw.trim()).map_err(|_| {
        SandboxError::InvalidArgument(format!(
            "sandbox_id {raw:?} is not a sandbox id; use the sandbox_id from create_sandbox or list_sandboxes"
        ))
    })
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
    pub async fn create(&self, caller: &Caller, name: Option<String>) -> Result<CreatedSandbox> {
        self.metrics
            .observe("create_sandbox", None, async {
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
        let key_left = expires_at.saturating_sub(crate::auth::unix_now()).max(1);
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
        finish: fn(Ran, &Links, Uuid) -> T,
    ) -> Result<T> {
        self.on_sandbox(tool, run.raw_id, |id| async move {
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
            Ok(root) => self.images.run(&root, files).await,
            Err(_) => RunImages::default(),
        }
    }

    pub async fn install(&self, caller: &Caller, raw_id: &str, package: &str) -> Result<InstallResult> {
        self.on_sandbox("install_package_in_sandbox", raw_id, |id| async move {
            let status = self
                .sandboxes
                .install(caller.scope(), id, package, INSTALL_WAIT)
                .await?;
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

    pub async fn restart(&self, caller: &Caller, raw_id: &str) -> Result<SandboxInfo> {
        self.on_sandbox("restart_sandbox", raw_id, |id| {
            self.sandboxes.restart(caller.scope(), id)
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
