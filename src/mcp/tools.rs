//! The MCP tools. Each handler works out who is asking and routes its
//! arguments (the verb's own type, see `ops::verbs`) to the shared
//! operations ([`Ops`]); the domain's actors do the rest; `results` says how
//! the outcome goes over MCP. Runs and reads come back with their files as links and their images
//! inline. Seven tools keep the names and parameters of python-mcp-sandbox;
//! `delete_sandbox`, the file tools and `reset_python` follow their ways.

use std::future::Future;

use rmcp::handler::server::common::schema_for_output;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, GetTaskParams,
    GetTaskResult, Implementation, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    ResultType, ServerCapabilities, ServerConfig, UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, ErrorData as McpError, RoleServer, ServerHandler};
use sandbox_actors::Progress;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::access::caller::Caller;
use crate::mcp::app;
use crate::mcp::results::{failure, read_reply, reply, run_reply, success};
use crate::mcp::schemas::portable_tools;
use crate::mcp::tasks::Tasks;
use crate::ops::args::{PackageRef, SandboxRef, SnapshotRef};
use crate::ops::files::{FileListing, ReadResult, WriteResult};
use crate::ops::results::{
    CommandResult, CreatedSandbox, DeleteResult, ForkResult, HibernateResult, InstallResult, ListedSandbox,
    PythonResult, ResetResult, RestoreResult, SandboxList, SnapshotDeleted, SnapshotList, SnapshotResult, TemplateList,
    UploadResult,
};
use crate::ops::verbs::create_sandbox::CreateSandbox;
use crate::ops::verbs::execute_python_code::ExecutePythonCode;
use crate::ops::verbs::execute_terminal_command::ExecuteTerminalCommand;
use crate::ops::verbs::fork_sandbox::ForkSandbox;
use crate::ops::verbs::install_package_in_sandbox::INSTALL_WAIT;
use crate::ops::verbs::list_files::ListFiles;
use crate::ops::verbs::read_file::ReadFile;
use crate::ops::verbs::snapshot_sandbox::SnapshotSandbox;
use crate::ops::verbs::upload_file_to_sandbox::UploadFileToSandbox;
use crate::ops::verbs::write_file::WriteFile;
use crate::ops::Ops;
use crate::telemetry;

#[derive(Clone)]
pub struct SandboxServer {
    pub(crate) ops: Ops,
    /// Long calls that became tasks, across all sessions.
    tasks: Tasks,
    /// Who calls when the transport decides it once for the connection
    /// (stdio, a legacy SSE session); Streamable HTTP carries it per request.
    connection_caller: Option<Caller>,
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl SandboxServer {
    pub fn new(ops: Ops, tasks: Tasks, connection_caller: Option<Caller>) -> Self {
        Self {
            ops,
            tasks,
            connection_caller,
            tool_router: Self::tool_router() + Self::process_tools(),
        }
    }

    pub(crate) fn caller(&self, ctx: &RequestContext<RoleServer>) -> Caller {
        Caller::of_request(ctx)
            .or_else(|| self.connection_caller.clone())
            .unwrap_or_else(Caller::local)
    }

    /// Runs a long call (an execution or an install), forwarding its output
    /// as progress notifications when the request carries a progress token;
    /// for a client that declared the tasks extension it becomes a task past
    /// the threshold ([`crate::mcp::tasks`]), its output tail the task's status. A
    /// cancelled request interrupts it (dropping the run's future interrupts
    /// the run).
    async fn executing<F>(
        &self,
        ctx: &RequestContext<RoleServer>,
        caller: &Caller,
        run: impl FnOnce(Option<mpsc::Sender<Progress>>) -> F,
    ) -> CallToolResponse
    where
        F: Future<Output = CallToolResult> + Send + 'static,
    {
        let admission = self.tasks.admit(ctx, caller);
        let output = admission.as_ref().map(|a| a.output());
        let notify = ctx.meta.get_progress_token().map(|token| (token, ctx.peer.clone()));
        let (tx, forwarder) = match (notify, output) {
            (None, None) => (None, None),
            (notify, output) => {
                let (tx, mut rx) = mpsc::channel::<Progress>(16);
                let task = tokio::spawn(async move {
                    let mut bytes = 0usize;
                    while let Some(p) = rx.recv().await {
                        let text = format!("{}{}", p.stdout, p.stderr);
                        bytes += text.len();
                        if let Some(output) = &output {
                            output.push(&text);
                        }
                        let Some((token, peer)) = notify
                            .as_ref()
                            .filter(|_| !output.as_ref().is_some_and(|o| o.detached()))
                        else {
                            continue;
                        };
                        let param = ProgressNotificationParam::new(token.clone(), bytes as f64).with_message(text);
                        let _ = peer.notify_progress(param).await;
                    }
                });
                (Some(tx), Some(task))
            }
        };
        let response = self.tasks.run(admission, &ctx.ct, run(tx)).await;
        // A plain answer follows its progress notifications; a task's run
        // goes on, and so does its forwarder.
        if let (Some(task), CallToolResponse::Complete(_)) = (forwarder, &response) {
            let _ = task.await;
        }
        response
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
        Parameters(args): Parameters<CreateSandbox>,
    ) -> CallToolResult {
        reply(self.ops.create_sandbox(&self.caller(&ctx), args).await)
    }

    #[tool(
        description = "List the prepared environments (templates) you may create sandboxes from: each one's name, \
            description, preinstalled packages and limits. Pass a name to create_sandbox as `template` to start \
            with those packages already importable, instead of installing them.",
        output_schema = schema_for_output::<TemplateList>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_templates(&self, ctx: RequestContext<RoleServer>) -> CallToolResult {
        let list = self.ops.list_templates(&self.caller(&ctx));
        let text = serde_json::to_value(&list).expect("serialisable");
        success(&list, Some(text), vec![])
    }

    #[tool(
        description = "List your sandboxes with their sandbox_id, name, status, creation time and installed packages. \
            Start here: reuse an existing sandbox before creating one.",
        output_schema = schema_for_output::<SandboxList>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_sandboxes(&self, ctx: RequestContext<RoleServer>) -> CallToolResult {
        let list: Vec<ListedSandbox> = self.ops.listed_sandboxes(&self.caller(&ctx)).await;
        let text = serde_json::to_value(&list).expect("serialisable");
        success(&SandboxList { sandboxes: list }, Some(text), vec![])
    }

    #[tool(
        description = "Run Python code in a sandbox, like a notebook cell: variables, imports and files persist between \
            calls, and the value of a last line that is an expression comes back in outputs (a pandas DataFrame as a \
            Markdown table with its shape; end the line with ; to hide it). display(a, b) adds outputs in order; \
            plt.show() and figures left open come back as inline images (saved under /app/results/outputs/). \
            Printed text is in stdout. The working folder is /app/results; files the code writes there come back as \
            download links (file_links), images among them also inline, downscaled. \
            Install missing packages first with install_package_in_sandbox. A failing program is not a tool error: \
            read exit_code, error (name, value, traceback) and stderr. receipt says what the run cost.",
        output_schema = schema_for_output::<PythonResult>(),
        annotations(read_only_hint = false, destructive_hint = false, open_world_hint = true)
    )]
    async fn execute_python_code(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<ExecutePythonCode>,
    ) -> CallToolResponse {
        let (caller, ops) = (self.caller(&ctx), self.ops.clone());
        self.executing(&ctx, &caller.clone(), |tx| async move {
            let id = args.sandbox_id.clone();
            let ran = ops.execute_python_code(&caller, args, tx).await;
            run_reply(&ops, &caller, &id, ran).await
        })
        .await
    }

    #[tool(
        description = "Run a shell command in a sandbox with sh -c, in /app/results (pipes, &&, redirects work; \
            Debian's base tools, curl and ps are there). \
            Returns stdout, stderr, exit_code and the files it wrote there (links; images also inline). \
            Processes the command starts end with it; start one that must outlive it (a server, a long job) \
            with start_process.",
        output_schema = schema_for_output::<CommandResult>(),
        annotations(read_only_hint = false, destructive_hint = true, open_world_hint = true)
    )]
    async fn execute_terminal_command(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<ExecuteTerminalCommand>,
    ) -> CallToolResponse {
        let (caller, ops) = (self.caller(&ctx), self.ops.clone());
        self.executing(&ctx, &caller.clone(), |tx| async move {
            let id = args.sandbox_id.clone();
            let ran = ops.execute_terminal_command(&caller, args, tx).await;
            run_reply(&ops, &caller, &id, ran).await
        })
        .await
    }

    #[tool(
        description = "Install a Python package (pip requirement, e.g. \"numpy\" or \"pandas==2.2.2\") into a sandbox. \
            Waits a few seconds (a tasks client: until it ends): status is success, failed (with the installer's output) \
            or installing. If installing, \
            poll check_package_installation_status. Code you run afterwards waits for the install to finish.",
        output_schema = schema_for_output::<InstallResult>(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = true, open_world_hint = true)
    )]
    async fn install_package_in_sandbox(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<PackageRef>,
    ) -> CallToolResponse {
        let (caller, ops) = (self.caller(&ctx), self.ops.clone());
        // A call that may become a task waits for the install's end.
        let wait = match self.tasks.offered(&ctx) {
            true => self.tasks.install_wait(),
            false => INSTALL_WAIT,
        };
        self.executing(&ctx, &caller.clone(), |_| async move {
            reply(ops.install_package_in_sandbox(&caller, args, wait).await)
        })
        .await
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
        Parameters(args): Parameters<PackageRef>,
    ) -> CallToolResult {
        reply(
            self.ops
                .check_package_installation_status(&self.caller(&ctx), args)
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
        Parameters(args): Parameters<UploadFileToSandbox>,
    ) -> CallToolResult {
        reply(self.ops.upload_file_to_sandbox(&self.caller(&ctx), args).await)
    }

    #[tool(
        description = "The sandbox view's own call (an MCP App): a sandbox as list_sandboxes lists it, its files \
            under /app/results with links, and its recent calls. Agents use list_sandboxes and list_files.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn view_sandbox(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<SandboxRef>,
    ) -> CallToolResult {
        reply(self.ops.view_sandbox(&self.caller(&ctx), args).await)
    }

    #[tool(
        description = "List files and folders under /app/results in a sandbox, with size, modified time and a download \
            link per file. Links are shown as links and never followed. Then read one with read_file.",
        output_schema = schema_for_output::<FileListing>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_files(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<ListFiles>,
    ) -> CallToolResult {
        reply(self.ops.list_files(&self.caller(&ctx), args).await)
    }

    #[tool(
        description = "Read a file under /app/results in a sandbox. Text comes in windows: a file larger than one window \
            also shows its last lines (tail); pass next_offset as offset to read on. An image comes back as an image, \
            downscaled to a byte budget, next to its download link; other binary files as a link with size and type. \
            With encoding base64, any file's bytes come as base64 (64 KiB a call unless max_bytes asks for up to \
            256 KiB; read on from next_offset), \
            for a client that cannot fetch the link.",
        output_schema = schema_for_output::<ReadResult>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn read_file(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<ReadFile>,
    ) -> CallToolResult {
        let read = self.ops.read_file(&self.caller(&ctx), args).await;
        match read {
            Ok(read) => read_reply(read),
            Err(e) => failure(&e),
        }
    }

    #[tool(
        description = "Write text (or, with encoding base64, any bytes: a picture, a parquet file, a zip; at most \
            1 MiB) to a file under /app/results in a sandbox, making missing folders and replacing an existing file. \
            It runs in turn with the sandbox's other calls: code sent afterwards sees the file.",
        output_schema = schema_for_output::<WriteResult>(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn write_file(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<WriteFile>,
    ) -> CallToolResult {
        reply(self.ops.write_file(&self.caller(&ctx), args).await)
    }

    #[tool(
        description = "Give a sandbox a fresh Python namespace: variables and imports are forgotten, files in \
            /app/results and installed packages are kept. Takes milliseconds; use it to start over instead of \
            creating a new sandbox.",
        output_schema = schema_for_output::<ResetResult>(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn reset_python(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<SandboxRef>,
    ) -> CallToolResult {
        reply(self.ops.reset_python(&self.caller(&ctx), args).await)
    }

    #[tool(
        description = "Put an idle sandbox to sleep on disk now: its Python variables and imports are written \
            to its disk, and its container and memory are given back. Its next call of any kind wakes it with its \
            variables, files and packages (that call's notice says what came back); background processes end. \
            Idle sandboxes sleep by themselves after a while; call this when you will not need one for some time.",
        output_schema = schema_for_output::<HibernateResult>(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn hibernate_sandbox(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<SandboxRef>,
    ) -> CallToolResult {
        reply(self.ops.hibernate_sandbox(&self.caller(&ctx), args).await)
    }

    #[tool(
        description = "Save a sandbox's state to come back to: Python variables and imports, the files in \
            /app/results and the installed packages. Take one before a risky step; restore_snapshot undoes \
            everything done since. Threads other than the main one are not saved. A sandbox keeps a few \
            snapshots (delete_snapshot frees one); they go with the sandbox.",
        output_schema = schema_for_output::<SnapshotResult>(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = false)
    )]
    async fn snapshot_sandbox(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<SnapshotSandbox>,
    ) -> CallToolResult {
        reply(self.ops.snapshot_sandbox(&self.caller(&ctx), args).await)
    }

    #[tool(
        description = "Bring a sandbox back to a snapshot: Python variables and imports, the files in \
            /app/results and the installed packages become what they were when snapshot_sandbox saved them; \
            whatever was done since is undone. The snapshot stays, so it can be restored again. If the sandbox \
            was restarted since the snapshot, files and packages come back but Python starts afresh (the \
            result says so).",
        output_schema = schema_for_output::<RestoreResult>(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn restore_snapshot(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<SnapshotRef>,
    ) -> CallToolResult {
        reply(self.ops.restore_snapshot(&self.caller(&ctx), args).await)
    }

    #[tool(
        description = "List a sandbox's snapshots, oldest first, with their labels and sizes.",
        output_schema = schema_for_output::<SnapshotList>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_snapshots(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<SandboxRef>,
    ) -> CallToolResult {
        reply(self.ops.list_snapshots(&self.caller(&ctx), args).await)
    }

    #[tool(
        description = "Copy a sandbox into new sandboxes: each fork starts with the files in /app/results, the \
            installed packages and the Python variables, functions and imports of the sandbox as it is now (or \
            of one of its snapshots), then goes its own way. Use it to try several approaches from one \
            warmed-up state. Python objects that cannot be copied (open sockets, threads, generators, ...) are \
            listed per fork in not_carried. The source is not changed; each fork counts against your sandbox \
            quota.",
        output_schema = schema_for_output::<ForkResult>(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = false)
    )]
    async fn fork_sandbox(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<ForkSandbox>,
    ) -> CallToolResult {
        reply(self.ops.fork_sandbox(&self.caller(&ctx), args).await)
    }

    #[tool(
        description = "Delete a snapshot of a sandbox, freeing its memory and disk. The sandbox itself is unchanged.",
        output_schema = schema_for_output::<SnapshotDeleted>(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn delete_snapshot(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<SnapshotRef>,
    ) -> CallToolResult {
        reply(self.ops.delete_snapshot(&self.caller(&ctx), args).await)
    }

    #[tool(
        description = "Delete a sandbox: its container, installed packages and files are removed for good.",
        output_schema = schema_for_output::<DeleteResult>(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn delete_sandbox(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<SandboxRef>,
    ) -> CallToolResult {
        reply(self.ops.delete_sandbox(&self.caller(&ctx), args).await)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SandboxServer {
    /// Every call runs in its span, a child of the caller's trace context
    /// when it sends one ([`telemetry::call_span`]). The view's own tool
    /// answers clients of MCP Apps only, as only they are offered it.
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if request.name == app::VIEW_TOOL && !app::declared(&ctx) {
            return Err(McpError::invalid_params(
                format!(
                    "{}: the sandbox view's own tool, for clients of MCP Apps",
                    app::VIEW_TOOL
                ),
                None,
            ));
        }
        let known = self.tool_router.has_route(&request.name);
        let span = telemetry::call_span(known.then_some(request.name.as_ref()), &ctx);
        let call = ToolCallContext::new(self, request, ctx);
        self.tool_router.call(call).instrument(span).await
    }

    /// The tools, with the sandbox view named on those it accompanies for a
    /// client of MCP Apps ([`app::offer`]); that list is the client's own to
    /// cache, the plain one anyone's.
    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let mut tools = portable_tools(|| self.tool_router.list_all());
        let declared = app::declared(&ctx);
        app::offer(&mut tools, declared);
        let hints = ctx
            .protocol_version()
            .is_some_and(|v| v >= ProtocolVersion::V_2026_07_28);
        let scope = match declared {
            true => CacheScope::Private,
            false => CacheScope::Public,
        };
        Ok(ListToolsResult {
            result_type: Some(ResultType::COMPLETE),
            tools,
            meta: None,
            next_cursor: None,
            ttl_ms: hints.then_some(0),
            cache_scope: hints.then_some(scope),
        })
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let mut list = ListResourcesResult::default();
        if app::declared(&ctx) {
            list.resources.push(app::resource());
        }
        Ok(list)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        match request.uri.as_str() {
            app::VIEW_URI => Ok(ReadResourceResult::new(vec![app::contents()]).into()),
            other => Err(McpError::resource_not_found(
                format!("no resource {other:?}: this server serves only {}", app::VIEW_URI),
                None,
            )),
        }
    }

    fn get_info(&self) -> ServerConfig {
        // Resources: the sandbox view, listed to clients of MCP Apps only.
        let capabilities = match self.tasks.enabled() {
            true => ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .enable_tasks()
                .build(),
            false => ServerCapabilities::builder().enable_tools().enable_resources().build(),
        };
        let mut info = ServerConfig::new(capabilities);
        info.server_info = Implementation::new("mcp-sandbox", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(
            "Isolated Python sandboxes. Workflow: list_sandboxes -> create_sandbox if you have none -> \
             install_package_in_sandbox -> check_package_installation_status -> execute_python_code. \
             Files written to /app/results come back as download links, images also inline; list_files, \
             read_file and write_file work on them, and reset_python starts Python over. snapshot_sandbox \
             saves variables, files and packages; restore_snapshot goes back to them; fork_sandbox copies a \
             sandbox into new ones. start_process runs a server or long job in the background \
             (read_process_output follows it); expose_port gives a link to a port, for a person to open."
                .into(),
        );
        info
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let task = self.tasks.get(&self.caller(&ctx), &request.task_id)?;
        Ok(GetTaskResult::new(task))
    }

    async fn cancel_task(&self, request: CancelTaskParams, ctx: RequestContext<RoleServer>) -> Result<(), McpError> {
        self.tasks.cancel(&self.caller(&ctx), &request.task_id)
    }

    async fn update_task(&self, request: UpdateTaskParams, ctx: RequestContext<RoleServer>) -> Result<(), McpError> {
        self.tasks
            .update(&self.caller(&ctx), &request.task_id, request.input_responses)
    }
}
