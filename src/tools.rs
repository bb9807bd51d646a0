//! The MCP tools. Each handler validates its arguments, works out who is
//! asking, and hands the work to the sandbox domain; the domain's actors do
//! the rest. Tool names and parameters are those of python-mcp-sandbox.

use std::sync::Arc;
use std::time::Duration;

use rmcp::handler::server::common::schema_for_output;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, Implementation, ProgressNotificationParam, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, RoleServer, ServerHandler};
use sandbox_actors::{Quota, Ran, SandboxError, Sandboxes, Work};
use schemars::JsonSchema;
use serde::Deserialize;
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::caller::Caller;
use crate::limits::Limits;
use crate::links::Links;
use crate::results::{
    failure, success, CommandResult, CreatedSandbox, DeleteResult, InstallResult, ListedSandbox, PythonResult,
    SandboxList, UploadResult,
};

/// Largest `code` and `command` accepted.
pub const MAX_CODE_BYTES: usize = 1024 * 1024;
pub const MAX_COMMAND_BYTES: usize = 64 * 1024;
/// How long `install_package_in_sandbox` waits before answering `installing`.
const INSTALL_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, Deserialize, JsonSchema)]
pub struct CreateParams {
    /// A name to recognise the sandbox by (optional).
    #[serde(default)]
    #[schemars(with = "String")]
    pub name: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SandboxParams {
    /// The sandbox_id returned by create_sandbox.
    pub sandbox_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ExecParams {
    /// The sandbox_id returned by create_sandbox.
    pub sandbox_id: String,
    /// Python source to run. Variables and imports persist between calls.
    pub code: String,
    /// Seconds before the run is interrupted (default and maximum set by the server).
    #[serde(default)]
    #[schemars(with = "u64")]
    pub timeout_seconds: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct TerminalParams {
    /// The sandbox_id returned by create_sandbox.
    pub sandbox_id: String,
    /// A shell command, run with `sh -c` in /app/results (pipes, && and redirects work).
    pub command: String,
    /// Seconds before the command is stopped (default and maximum set by the server).
    #[serde(default)]
    #[schemars(with = "u64")]
    pub timeout_seconds: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct PackageParams {
    /// The sandbox_id returned by create_sandbox.
    pub sandbox_id: String,
    /// A requirement such as "numpy" or "pandas==2.2.2"; several may be separated by spaces.
    pub package_name: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct UploadParams {
    /// The sandbox_id returned by create_sandbox.
    pub sandbox_id: String,
    /// Absolute path of a file or folder on the server's host, inside a folder the server allows uploads from.
    pub local_file_path: String,
    /// Folder in the sandbox to copy into (default /app/results).
    #[serde(default = "default_dest")]
    pub dest_path: String,
}

fn default_dest() -> String {
    "/app/results".into()
}

#[derive(Clone)]
pub struct SandboxServer {
    sandboxes: Arc<Sandboxes>,
    links: Links,
    limits: Arc<Limits>,
    /// Who calls when the transport decides it once for the connection
    /// (stdio, a legacy SSE session); Streamable HTTP carries it per request.
    connection_caller: Option<Caller>,
    tool_router: ToolRouter<Self>,
}

fn parse_id(raw: &str) -> Result<Uuid, SandboxError> {
    Uuid::parse_str(raw.trim()).map_err(|_| {
        SandboxError::InvalidArgument(format!(
            "sandbox_id {raw:?} is not a sandbox id; use the sandbox_id from create_sandbox or list_sandboxes"
        ))
    })
}

fn check_len(what: &str, value: &str, max: usize) -> Result<(), SandboxError> {
    match value.len() {
        len if len > max => Err(SandboxError::InvalidArgument(format!(
            "{what} is {len} bytes; at most {max} are accepted"
        ))),
        _ => Ok(()),
    }
}

/// A tool's outcome as the model reads it: a failure of the tool itself
/// becomes an `isError` result with the error's message.
fn reply(outcome: Result<CallToolResult, SandboxError>) -> CallToolResult {
    outcome.unwrap_or_else(|e| failure(&e))
}

#[tool_router]
impl SandboxServer {
    pub fn new(
        sandboxes: Arc<Sandboxes>,
        links: Links,
        limits: Arc<Limits>,
        connection_caller: Option<Caller>,
    ) -> Self {
        Self {
            sandboxes,
            links,
            limits,
            connection_caller,
            tool_router: Self::tool_router(),
        }
    }

    fn caller(&self, ctx: &RequestContext<RoleServer>) -> Caller {
        Caller::of_request(ctx)
            .or_else(|| self.connection_caller.clone())
            .unwrap_or_else(Caller::local)
    }

    /// Runs work, forwarding output as progress notifications when the
    /// request carries a progress token; a cancelled request interrupts it.
    async fn run(
        &self,
        ctx: &RequestContext<RoleServer>,
        id: Uuid,
        work: Work,
        timeout: Option<u64>,
    ) -> Result<Ran, SandboxError> {
        let owner = self.caller(ctx).owner;
        let (tx, forwarder) = match ctx.meta.get_progress_token() {
            Some(token) => {
                let (tx, mut rx) = mpsc::channel::<sandbox_actors::Progress>(16);
                let peer = ctx.peer.clone();
                let task = tokio::spawn(async move {
                    let mut bytes = 0usize;
                    while let Some(p) = rx.recv().await {
                        let text = format!("{}{}", p.stdout, p.stderr);
                        bytes += text.len();
                        let param = ProgressNotificationParam::new(token.clone(), bytes as f64).with_message(text);
                        let _ = peer.notify_progress(param).await;
                    }
                });
                (Some(tx), Some(task))
            }
            None => (None, None),
        };
        let result = tokio::select! {
            r = self.sandboxes.run(&owner, id, work, timeout, tx) => r,
            _ = ctx.ct.cancelled() => Err(SandboxError::InvalidArgument("the request was cancelled".into())),
        };
        if let Some(task) = forwarder {
            let _ = task.await;
        }
        result
    }

    #[tool(
        description = "Create a new isolated Python sandbox (a container) and return its sandbox_id. \
            Call list_sandboxes first and reuse a sandbox you already have; each caller may hold only a few.",
        output_schema = schema_for_output::<CreatedSandbox>(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = false)
    )]
    async fn create_sandbox(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(p): Parameters<CreateParams>,
    ) -> CallToolResult {
        reply(
            async {
                let owner = self.caller(&ctx).owner;
                if let Err(wait) = self.limits.check_creation(&owner) {
                    return Err(SandboxError::Quota(format!(
                        "too many sandboxes created in the last minute; wait {} s, or reuse one from list_sandboxes",
                        wait.seconds()
                    )));
                }
                let quota = Quota {
                    per_owner: self.limits.max_sandboxes(&owner),
                    total: self.limits.max_sandboxes_total(),
                };
                let info = self.sandboxes.create(&owner, p.name, quota).await?;
                Ok(success(&CreatedSandbox::from(info), None, vec![]))
            }
            .await,
        )
    }

    #[tool(
        description = "List your sandboxes with their sandbox_id, name, status, creation time and installed packages. \
            Start here: reuse an existing sandbox before creating one.",
        output_schema = schema_for_output::<SandboxList>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_sandboxes(&self, ctx: RequestContext<RoleServer>) -> CallToolResult {
        let list: Vec<ListedSandbox> = self
            .sandboxes
            .list(&self.caller(&ctx).owner)
            .await
            .into_iter()
            .map(Into::into)
            .collect();
        let text = serde_json::to_value(&list).expect("serialisable");
        success(&SandboxList { sandboxes: list }, Some(text), vec![])
    }

    #[tool(
        description = "Run Python code in a sandbox. State persists between calls like a notebook: variables, imports and \
            files stay. The working folder is /app/results; files the code writes there are returned as download links \
            (file_links). Save plots with plt.savefig('plot.png'), never plt.show(). Print what you want to see. \
            Install missing packages first with install_package_in_sandbox. A failing program is not a tool error: \
            read exit_code and stderr.",
        output_schema = schema_for_output::<PythonResult>(),
        annotations(read_only_hint = false, destructive_hint = false, open_world_hint = true)
    )]
    async fn execute_python_code(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(p): Parameters<ExecParams>,
    ) -> CallToolResult {
        reply(
            async {
                let id = parse_id(&p.sandbox_id)?;
                check_len("code", &p.code, MAX_CODE_BYTES)?;
                let ran = self.run(&ctx, id, Work::Python(p.code), p.timeout_seconds).await?;
                let result = PythonResult::new(ran, &self.links, id);
                let links = result
                    .file_links
                    .iter()
                    .cloned()
                    .zip(result.files.iter().map(|f| file_name(f)))
                    .collect();
                Ok(success(&result, None, links))
            }
            .await,
        )
    }

    #[tool(
        description = "Run a shell command in a sandbox with sh -c, in /app/results (pipes, &&, redirects work). \
            Returns stdout, stderr and exit_code. Processes the command starts end with it unless started with setsid.",
        output_schema = schema_for_output::<CommandResult>(),
        annotations(read_only_hint = false, destructive_hint = true, open_world_hint = true)
    )]
    async fn execute_terminal_command(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(p): Parameters<TerminalParams>,
    ) -> CallToolResult {
        reply(
            async {
                let id = parse_id(&p.sandbox_id)?;
                check_len("command", &p.command, MAX_COMMAND_BYTES)?;
                let argv = vec!["sh".to_string(), "-c".to_string(), p.command];
                let ran = self.run(&ctx, id, Work::Program(argv), p.timeout_seconds).await?;
                Ok(success(&CommandResult::new(ran, &self.links, id), None, vec![]))
            }
            .await,
        )
    }

    #[tool(
        description = "Install a Python package (pip requirement, e.g. \"numpy\" or \"pandas==2.2.2\") into a sandbox. \
            Waits a few seconds: status is success, failed (with the installer's output) or installing. If installing, \
            poll check_package_installation_status. Code you run afterwards waits for the install to finish.",
        output_schema = schema_for_output::<InstallResult>(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = true, open_world_hint = true)
    )]
    async fn install_package_in_sandbox(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(p): Parameters<PackageParams>,
    ) -> CallToolResult {
        reply(
            async {
                let id = parse_id(&p.sandbox_id)?;
                let owner = self.caller(&ctx).owner;
                let status = self
                    .sandboxes
                    .install(&owner, id, &p.package_name, INSTALL_WAIT)
                    .await?;
                Ok(success(&InstallResult::from(status), None, vec![]))
            }
            .await,
        )
    }

    #[tool(
        description = "Check a package installation in a sandbox: installing, success, failed or not_found. \
            Also reports success for a package installed another way (for example from the terminal).",
        output_schema = schema_for_output::<InstallResult>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn check_package_installation_status(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(p): Parameters<PackageParams>,
    ) -> CallToolResult {
        reply(
            async {
                let id = parse_id(&p.sandbox_id)?;
                let status = self
                    .sandboxes
                    .install_status(&self.caller(&ctx).owner, id, &p.package_name)
                    .await?;
                Ok(success(&InstallResult::from(status), None, vec![]))
            }
            .await,
        )
    }

    #[tool(
        description = "Copy a file or folder from the server's host (only from the folders the server allows) into a \
            folder of the sandbox (default /app/results), keeping its name.",
        output_schema = schema_for_output::<UploadResult>(),
        annotations(read_only_hint = false, destructive_hint = false, open_world_hint = false)
    )]
    async fn upload_file_to_sandbox(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(p): Parameters<UploadParams>,
    ) -> CallToolResult {
        reply(
            async {
                let id = parse_id(&p.sandbox_id)?;
                let owner = self.caller(&ctx).owner;
                let up = self
                    .sandboxes
                    .upload(&owner, id, &p.local_file_path, &p.dest_path)
                    .await?;
                let message = format!("{} in sandbox {id}", up.message);
                Ok(success(
                    &UploadResult {
                        success: true,
                        message,
                        path: up.path,
                    },
                    None,
                    vec![],
                ))
            }
            .await,
        )
    }

    #[tool(
        description = "Delete a sandbox: its container, installed packages and files are removed for good.",
        output_schema = schema_for_output::<DeleteResult>(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn delete_sandbox(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(p): Parameters<SandboxParams>,
    ) -> CallToolResult {
        reply(
            async {
                let id = parse_id(&p.sandbox_id)?;
                self.sandboxes.delete(&self.caller(&ctx).owner, id).await?;
                let message = format!("Sandbox {id} deleted");
                Ok(success(
                    &DeleteResult {
                        success: true,
                        sandbox_id: id.to_string(),
                        message,
                    },
                    None,
                    vec![],
                ))
            }
            .await,
        )
    }
}

fn file_name(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).to_string()
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SandboxServer {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        info.server_info = Implementation::new("mcp-sandbox", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(
            "Isolated Python sandboxes. Workflow: list_sandboxes -> create_sandbox if you have none -> \
             install_package_in_sandbox -> check_package_installation_status -> execute_python_code. \
             Files written to /app/results come back as download links."
                .into(),
        );
        info
    }
}
