//! Engine-free tests of the front end: the real operations, MCP tool
//! handler, task store, router and connection handling over the domain's
//! in-memory runtime (`sandbox-actors` with its `test-runtime` feature), so
//! that what the tools, the REST API and tasks answer is tested in seconds.
//! The same paths against the real engine, over Streamable HTTP and with
//! the Python SDK's clients, are in `tests/e2e/`.
//!
//! The fake agent reads each run as one directive (`set x 1`, `get x`,
//! `sleep 90`; see `sandbox_runtime::fake`). MCP tests run the rmcp
//! client against the tool handler over an in-memory pipe, on tokio's
//! paused clock where they wait; REST tests talk HTTP to a loopback port on
//! the real clock.

mod app;
mod mcp;
mod rest;
mod tasks;
mod templates;
mod usage;

use std::sync::Arc;

use rmcp::model::{CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, Implementation};
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use sandbox_actors::Sandboxes;
use sandbox_runtime::fake::FakeRuntime;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use crate::access::caller::Caller;
use crate::access::connections;
use crate::access::signer::LinkSigner;
use crate::config::Config;
use crate::mcp::tasks::Tasks;
use crate::mcp::tools::SandboxServer;
use crate::ops::Ops;

/// Two tenants' API keys, as `[[auth.keys]]` in the environment's syntax.
pub const KEYS: &str =
    r#"[{name = "alice", key = "alice-key-0123456789abcdef"}, {name = "bob", key = "bob-key-0123456789abcdef"}]"#;
pub const ALICE: &str = "alice-key-0123456789abcdef";
pub const BOB: &str = "bob-key-0123456789abcdef";

/// A server on the fake runtime, with its own folders.
pub struct App {
    pub config: Config,
    pub ops: Ops,
    pub tasks: Tasks,
    signer: Option<LinkSigner>,
    pub fake: FakeRuntime,
    _root: tempfile::TempDir,
}

impl App {
    /// Starts the domain and the operations under the shipped defaults,
    /// changed by `vars` (`MCP_SANDBOX_*` pairs, as the environment gives
    /// them): no pool, no capped disks, no pausing unless a test asks.
    pub async fn start(vars: &[(&str, &str)]) -> Self {
        Self::start_with(vars, |_| {}).await
    }

    /// [`App::start`], with the configuration then changed by `tweak` (for
    /// what the environment cannot set, such as `[[templates]]`).
    pub async fn start_with(vars: &[(&str, &str)], tweak: impl FnOnce(&mut Config)) -> Self {
        let root = tempfile::tempdir().unwrap();
        let dir = |name: &str| root.path().join(name).to_string_lossy().into_owned();
        let mut env = vec![
            ("MCP_SANDBOX_SERVER_STATE_DIR".to_string(), dir("state")),
            ("MCP_SANDBOX_RESULTS_DIR".to_string(), dir("results")),
        ];
        let defaults = [
            ("MCP_SANDBOX_SANDBOX_RESULTS_MB", "0"),
            ("MCP_SANDBOX_SANDBOX_PACKAGES_MB", "0"),
            ("MCP_SANDBOX_SANDBOX_PAUSE_AFTER_SECONDS", "0"),
            ("MCP_SANDBOX_POOL_MIN", "0"),
        ];
        env.extend(defaults.iter().chain(vars).map(|(k, v)| (k.to_string(), v.to_string())));
        let mut config = Config::load(None, env.into_iter()).expect("a valid configuration");
        tweak(&mut config);
        config.validate().expect("a valid configuration");
        let signer = crate::serve::signer(&config, None).unwrap();
        let limits = crate::serve::limits(&config, signer.as_ref()).unwrap();
        let mut settings = config.settings(None).unwrap();
        settings.live_cap = crate::serve::live_cap(&limits);
        let fake = FakeRuntime::new(settings.sandbox.output_cap_bytes);
        let host = Arc::new(sandbox_host::recording::Recorder::new());
        let sandboxes = Sandboxes::on_fake(settings, &fake, host)
            .await
            .expect("start on the fake runtime");
        let ops = crate::serve::ops(&config, Arc::new(sandboxes), limits, signer.clone(), None, None).unwrap();
        let tasks = Tasks::new(config.tasks.clone());
        Self {
            config,
            ops,
            tasks,
            signer,
            fake,
            _root: root,
        }
    }

    /// An rmcp client speaking for `caller` to the tool handler over an
    /// in-memory pipe; `tasks`: it declares the tasks extension.
    pub async fn client(&self, caller: Caller, tasks: bool) -> Client {
        let capabilities = match tasks {
            true => ClientCapabilities::builder().enable_tasks().build(),
            false => ClientCapabilities::default(),
        };
        self.client_with(caller, capabilities).await
    }

    /// An rmcp client for `caller` that declares `capabilities`.
    pub async fn client_with(&self, caller: Caller, capabilities: ClientCapabilities) -> Client {
        let (server_end, client_end) = tokio::io::duplex(1 << 20);
        let handler = SandboxServer::new(self.ops.clone(), self.tasks.clone(), Some(caller));
        tokio::spawn(async move {
            if let Ok(running) = handler.serve(server_end).await {
                let _ = running.waiting().await;
            }
        });
        let info = ClientConfig::new(capabilities, Implementation::new("engine-free-tests", "1"));
        Client(info.serve(client_end).await.expect("initialize"))
    }

    /// Serves the HTTP front end on a loopback port, as `serve` does, until
    /// the returned token is cancelled. Real clock only: a paused clock
    /// jumps ahead while the runtime waits for the socket.
    pub async fn http(&self) -> (String, CancellationToken) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        let app = crate::http::router(
            &self.config,
            self.ops.clone(),
            self.tasks.clone(),
            self.signer.clone(),
            None,
            shutdown.clone(),
        );
        let (limits, addresses) = (self.config.limits.clone(), self.config.client_addresses().unwrap());
        let (metrics, stop) = (self.ops.metrics.clone(), shutdown.clone());
        tokio::spawn(async move { connections::serve(listener, app, &limits, addresses, metrics, stop).await });
        (base, shutdown)
    }
}

/// A connected MCP client.
pub struct Client(pub RunningService<RoleClient, ClientConfig>);

impl Client {
    /// Calls a tool; the result whether or not it is an error.
    pub async fn call(&self, tool: &str, arguments: Value) -> CallToolResult {
        self.0
            .call_tool(params(tool, arguments))
            .await
            .expect("a tools/call answer")
    }

    /// Calls a tool that must succeed; its structured content.
    pub async fn ok(&self, tool: &str, arguments: Value) -> Value {
        let result = self.call(tool, arguments).await;
        assert_ne!(result.is_error, Some(true), "{tool} failed: {}", text(&result));
        result.structured_content.expect("structured content")
    }

    /// Calls a tool that must fail; its message.
    pub async fn error(&self, tool: &str, arguments: Value) -> String {
        let result = self.call(tool, arguments).await;
        assert_eq!(result.is_error, Some(true), "{tool} did not fail: {result:?}");
        text(&result)
    }

    /// Creates a sandbox; its id.
    pub async fn create(&self) -> String {
        let made = self.ok("create_sandbox", serde_json::json!({})).await;
        made["sandbox_id"].as_str().expect("an id").to_string()
    }
}

pub fn params(tool: &str, arguments: Value) -> CallToolRequestParams {
    let arguments: Map<String, Value> = match arguments {
        Value::Object(m) => m,
        other => panic!("arguments must be an object, not {other}"),
    };
    CallToolRequestParams::new(tool.to_string()).with_arguments(arguments)
}

/// The text items of a result, joined.
pub fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}
