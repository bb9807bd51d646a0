//! The MCP tools on background processes and preview links; routed as the
//! other tools are (see `tools`), and joined to their router.

use rmcp::handler::server::common::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};

use crate::mcp::results::reply;
use crate::mcp::tools::SandboxServer;
use crate::ops::args::SandboxRef;
use crate::ops::processes::{InputResult, PreviewResult, ProcessList, ProcessOutput, StopResult};
use crate::ops::verbs::expose_port::ExposePort;
use crate::ops::verbs::read_process_output::ReadProcessOutput;
use crate::ops::verbs::send_process_input::SendProcessInput;
use crate::ops::verbs::start_process::StartProcess;
use crate::ops::verbs::stop_process::StopProcess;

#[tool_router(router = process_tools, vis = "pub(crate)")]
impl SandboxServer {
    #[tool(
        description = "Start a command in the background of a sandbox (a web app, a server, a long job): it keeps \
            running after the call, unlike execute_terminal_command. Answers at once with its process_id and what \
            its first second printed, so a failing start shows. Follow its output with read_process_output, give \
            it input with send_process_input, end it with stop_process; expose_port makes a link to a port it \
            serves. A sandbox runs a limited number at once; they end with the sandbox's container.",
        output_schema = schema_for_output::<ProcessOutput>(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = false)
    )]
    async fn start_process(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<StartProcess>,
    ) -> CallToolResult {
        reply(self.ops.start_process(&self.caller(&ctx), args).await)
    }

    #[tool(
        description = "List a sandbox's background processes: id, name, command, state (running or exited), exit \
            code, start time and output size. Processes that ended with a restart of the sandbox say so.",
        output_schema = schema_for_output::<ProcessList>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_processes(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<SandboxRef>,
    ) -> CallToolResult {
        reply(self.ops.list_processes(&self.caller(&ctx), args).await)
    }

    #[tool(
        description = "Read a background process's output (stdout and stderr together) from an offset; pass the \
            answer's next_offset as offset to read on. wait_seconds (up to 10) waits for new output when there is \
            none yet, to follow a log without polling hard. Only the latest output is kept; skipped says how much \
            was dropped.",
        output_schema = schema_for_output::<ProcessOutput>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn read_process_output(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<ReadProcessOutput>,
    ) -> CallToolResult {
        reply(self.ops.read_process_output(&self.caller(&ctx), args).await)
    }

    #[tool(
        description = "Write text to a running background process's standard input (end lines with \\n).",
        output_schema = schema_for_output::<InputResult>(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = false)
    )]
    async fn send_process_input(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<SendProcessInput>,
    ) -> CallToolResult {
        reply(self.ops.send_process_input(&self.caller(&ctx), args).await)
    }

    #[tool(
        description = "Stop a background process: a signal (TERM by default), then, after grace_seconds, KILL of it \
            and everything it started. Answers once it ended, with its exit code.",
        output_schema = schema_for_output::<StopResult>(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn stop_process(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<StopProcess>,
    ) -> CallToolResult {
        reply(self.ops.stop_process(&self.caller(&ctx), args).await)
    }

    #[tool(
        description = "Make a link that reaches a port inside a sandbox (a web app started with start_process), \
            for a person to open in a browser or a client to call: HTTP and WebSockets, through the server, so it \
            works whatever the sandbox's network. The link carries its own expiring token. unexpose_port ends it.",
        output_schema = schema_for_output::<PreviewResult>(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn expose_port(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<ExposePort>,
    ) -> CallToolResult {
        reply(self.ops.expose_port(&self.caller(&ctx), args).await)
    }

    #[tool(
        description = "End every link to a port of a sandbox made by expose_port.",
        output_schema = schema_for_output::<PreviewResult>(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn unexpose_port(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<ExposePort>,
    ) -> CallToolResult {
        reply(self.ops.unexpose_port(&self.caller(&ctx), args).await)
    }
}
