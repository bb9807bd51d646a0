//! A raw JSON-RPC MCP client (Streamable HTTP with a session, and legacy
//! SSE) and a launcher for the release server, so benchmarks measure the
//! server and not a client library.

#![allow(dead_code)]

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::sync::oneshot;

const PROTOCOL: &str = "2025-06-18";

pub fn rpc(id: u64, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

pub fn init_params() -> Value {
    json!({"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "mcp-sandbox-load", "version": "1"}})
}

/// The JSON-RPC response with `id` among the `data:` lines of an SSE body.
fn find_response(body: &str, id: u64) -> Option<Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|v| v.get("id").and_then(Value::as_u64) == Some(id))
}

pub enum Transport {
    /// Streamable HTTP with a session.
    Http { url: String, session: String },
    /// Legacy SSE: POSTs to `post_url`, answers through the event stream.
    Sse {
        post_url: String,
        pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>,
        _reader: tokio::task::JoinHandle<()>,
    },
}

pub struct McpClient {
    http: reqwest::Client,
    transport: Transport,
    next: AtomicU64,
}

/// What a call came to, for clients that must survive a failing server.
#[derive(Debug)]
pub enum CallError {
    /// The tool answered with `isError`: its message.
    Tool(String),
    /// A JSON-RPC error or an answer that is not the protocol.
    Protocol(String),
    /// An HTTP status other than success.
    Status(u16),
    /// No answer: the connection failed or the stream ended.
    Transport(String),
}

impl McpClient {
    pub async fn http(http: reqwest::Client, base: &str) -> Self {
        Self::try_http(http, base).await.expect("initialize over /mcp")
    }

    pub async fn try_http(http: reqwest::Client, base: &str) -> Result<Self, CallError> {
        let url = format!("{base}/mcp");
        let resp = http
            .post(&url)
            .header("Accept", "application/json, text/event-stream")
            .json(&rpc(1, "initialize", init_params()))
            .send()
            .await
            .map_err(|e| CallError::Transport(e.to_string()))?;
        if !resp.status().is_success() {
            return Err(CallError::Status(resp.status().as_u16()));
        }
        let session = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| CallError::Protocol("no session id".into()))?
            .to_string();
        let _ = resp.text().await;
        let me = Self {
            http,
            transport: Transport::Http { url, session },
            next: AtomicU64::new(2),
        };
        me.notify_initialized().await?;
        Ok(me)
    }

    pub async fn sse(http: reqwest::Client, base: &str) -> Self {
        Self::try_sse(http, base).await.expect("initialize over /sse")
    }

    pub async fn try_sse(http: reqwest::Client, base: &str) -> Result<Self, CallError> {
        let resp = http
            .get(format!("{base}/sse"))
            .send()
            .await
            .map_err(|e| CallError::Transport(e.to_string()))?;
        if !resp.status().is_success() {
            return Err(CallError::Status(resp.status().as_u16()));
        }
        let mut body = resp.bytes_stream();
        let pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>> = Arc::default();
        let mut buf = String::new();
        let (endpoint_tx, endpoint_rx) = oneshot::channel::<String>();
        let waiting = pending.clone();
        let reader = tokio::spawn(async move {
            let mut endpoint_tx = Some(endpoint_tx);
            while let Some(Ok(chunk)) = body.next().await {
                buf.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(end) = buf.find("\n\n") {
                    let event: String = buf.drain(..end + 2).collect();
                    let kind = event
                        .lines()
                        .find_map(|l| l.strip_prefix("event:"))
                        .map(str::trim)
                        .unwrap_or("message");
                    let data: String = event
                        .lines()
                        .filter_map(|l| l.strip_prefix("data:"))
                        .map(str::trim)
                        .collect();
                    if kind == "endpoint" {
                        if let Some(tx) = endpoint_tx.take() {
                            let _ = tx.send(data);
                        }
                    } else if let Ok(v) = serde_json::from_str::<Value>(&data) {
                        if let Some(id) = v.get("id").and_then(Value::as_u64) {
                            if let Some(tx) = waiting.lock().unwrap().remove(&id) {
                                let _ = tx.send(v);
                            }
                        }
                    }
                }
            }
            // The stream ended (the server went away): no answer will come
            // for what is still waiting.
            waiting.lock().unwrap().clear();
        });
        let path = endpoint_rx
            .await
            .map_err(|_| CallError::Transport("the stream ended before its endpoint event".into()))?;
        let transport = Transport::Sse {
            post_url: format!("{base}{path}"),
            pending,
            _reader: reader,
        };
        let me = Self {
            http,
            transport,
            next: AtomicU64::new(1),
        };
        me.try_request("initialize", init_params()).await?;
        me.notify_initialized().await?;
        Ok(me)
    }

    async fn notify_initialized(&self) -> Result<(), CallError> {
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let sent = match &self.transport {
            Transport::Http { url, session } => {
                let r = self
                    .http
                    .post(url)
                    .header("mcp-session-id", session)
                    .header("mcp-protocol-version", PROTOCOL);
                r.header("Accept", "application/json, text/event-stream")
                    .json(&note)
                    .send()
                    .await
            }
            Transport::Sse { post_url, .. } => self.http.post(post_url).json(&note).send().await,
        };
        sent.map(drop).map_err(|e| CallError::Transport(e.to_string()))
    }

    async fn try_request(&self, method: &str, params: Value) -> Result<Value, CallError> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let body = rpc(id, method, params);
        let transport = |e: reqwest::Error| CallError::Transport(e.to_string());
        match &self.transport {
            Transport::Http { url, session } => {
                let resp = self
                    .http
                    .post(url)
                    .header("mcp-session-id", session)
                    .header("mcp-protocol-version", PROTOCOL)
                    .header("Accept", "application/json, text/event-stream")
                    .json(&body)
                    .send()
                    .await
                    .map_err(transport)?;
                if !resp.status().is_success() {
                    return Err(CallError::Status(resp.status().as_u16()));
                }
                let text = resp.text().await.map_err(transport)?;
                if let Ok(v) = serde_json::from_str::<Value>(&text) {
                    return Ok(v);
                }
                find_response(&text, id).ok_or_else(|| CallError::Transport(format!("no response in {text:?}")))
            }
            Transport::Sse { post_url, pending, .. } => {
                let (tx, rx) = oneshot::channel();
                pending.lock().unwrap().insert(id, tx);
                let status = self
                    .http
                    .post(post_url)
                    .json(&body)
                    .send()
                    .await
                    .map_err(transport)?
                    .status();
                if status.as_u16() != 202 {
                    pending.lock().unwrap().remove(&id);
                    return Err(CallError::Status(status.as_u16()));
                }
                rx.await
                    .map_err(|_| CallError::Transport("the event stream ended".into()))
            }
        }
    }

    async fn request(&self, method: &str, params: Value) -> Value {
        self.try_request(method, params)
            .await
            .unwrap_or_else(|e| panic!("{method}: {e:?}"))
    }

    /// Calls a tool; `Err` for a protocol or tool error.
    pub async fn tool(&self, name: &str, args: Value) -> Result<Value, String> {
        self.try_tool(name, args).await.map_err(|e| match e {
            CallError::Tool(m) | CallError::Protocol(m) => m,
            other => panic!("{name}: {other:?}"),
        })
    }

    /// Calls a tool and says what it came to, whatever happens.
    pub async fn try_tool(&self, name: &str, args: Value) -> Result<Value, CallError> {
        let mut result = self.try_call(name, args).await?;
        Ok(result["structuredContent"].take())
    }

    /// Creates a sandbox named `name`: its id, or what the call came to.
    pub async fn try_create(&self, name: &str) -> Result<String, String> {
        self.try_create_from(name, None).await
    }

    /// A sandbox named `name` of `template` (none: the default).
    pub async fn try_create_from(&self, name: &str, template: Option<&str>) -> Result<String, String> {
        let created = self
            .try_tool("create_sandbox", json!({"name": name, "template": template}))
            .await
            .map_err(|e| format!("create_sandbox: {e:?}"))?;
        created["sandbox_id"]
            .as_str()
            .map(String::from)
            .ok_or_else(|| format!("create_sandbox answered {created}"))
    }

    /// Calls a tool that must work, and times it.
    pub async fn timed(&self, name: &str, args: Value) -> (Value, Duration) {
        let t = std::time::Instant::now();
        let v = self.tool(name, args).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        (v, t.elapsed())
    }

    /// Runs Python code that must exit 0 (timeout 300 s); its result.
    pub async fn py(&self, sid: &str, code: &str) -> Value {
        let args = json!({"sandbox_id": sid, "code": code, "timeout_seconds": 300});
        let (v, _) = self.timed("execute_python_code", args).await;
        assert_eq!(v["exit_code"], 0, "{code}: {v}");
        v
    }

    /// Installs a package and waits (up to 300 s) for the install to end;
    /// its last status.
    pub async fn install(&self, sid: &str, package: &str) -> Value {
        let args = json!({"sandbox_id": sid, "package_name": package});
        let (mut status, _) = self.timed("install_package_in_sandbox", args.clone()).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(300);
        while status["status"] == "installing" && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_secs(1)).await;
            status = self.timed("check_package_installation_status", args.clone()).await.0;
        }
        status
    }

    /// A new sandbox named `name` whose namespace holds `size_mb` MB of
    /// numpy arrays in `state` (bytearrays where numpy does not install) and
    /// whose `/app/results/data` holds `files_mb` one-MB files. Its id, the
    /// code that fills `state` again, and what `state` holds.
    pub async fn loaded_sandbox(&self, name: &str, size_mb: usize, files_mb: usize) -> (String, String, &'static str) {
        let (created, _) = self.timed("create_sandbox", json!({"name": name})).await;
        let sid = created["sandbox_id"].as_str().unwrap().to_string();
        let installed = self.install(&sid, "numpy").await;
        let probe = "try:\n import numpy\n print('yes')\nexcept ImportError:\n print('no')";
        let numpy = self.py(&sid, probe).await["stdout"] == "yes\n";
        let (fill, kind) = match numpy {
            true => (
                format!(
                    "import numpy as np\nstate = [np.random.rand({}) for _ in range({size_mb})]",
                    (1 << 20) / 8
                ),
                "numpy",
            ),
            false => (
                format!("import os\nstate = [bytearray(os.urandom(1 << 20)) for _ in range({size_mb})]"),
                "bytearray",
            ),
        };
        println!(
            "{size_mb} MB namespace of {kind} arrays (numpy install: {})",
            installed["status"]
        );
        self.py(&sid, &fill).await;
        let files = format!(
            "import os\nos.makedirs('data', exist_ok=True)\nfor i in range({files_mb}):\n    open(f'data/{{i}}.bin', 'wb').write(os.urandom(1 << 20))"
        );
        self.py(&sid, &files).await;
        (sid, fill, kind)
    }

    /// Calls a tool; the whole result (`content` and `structuredContent`).
    pub async fn try_call(&self, name: &str, args: Value) -> Result<Value, CallError> {
        let mut v = self
            .try_request("tools/call", json!({"name": name, "arguments": args}))
            .await?;
        let result = v
            .get_mut("result")
            .map(Value::take)
            .ok_or_else(|| CallError::Protocol(v.to_string()))?;
        if result.get("isError").and_then(Value::as_bool) == Some(true) {
            let text = result["content"][0]["text"].as_str().unwrap_or_default().to_string();
            return Err(CallError::Tool(text));
        }
        Ok(result)
    }
}

/// `n` timed `print(1)` runs (after 20 untimed ones), each checked.
pub async fn print_series(c: &McpClient, sid: &str, n: usize) -> Vec<Duration> {
    let args = json!({"sandbox_id": sid, "code": "print(1)"});
    for _ in 0..20 {
        c.tool("execute_python_code", args.clone()).await.unwrap();
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = std::time::Instant::now();
        let r = c.tool("execute_python_code", args.clone()).await.unwrap();
        out.push(t.elapsed());
        assert_eq!(r["stdout"], "1\n");
    }
    out
}

/// The `[limits]` of a server driven by a load generator: one tenant
/// calling far faster than an agent, holding as many sessions and
/// connections as it has clients and up to `sandboxes` sandboxes.
pub fn load_limits(sandboxes: usize, sessions: usize) -> Vec<(&'static str, String)> {
    let (sandboxes, sessions) = (sandboxes.to_string(), sessions.to_string());
    vec![
        ("requests_per_second", "1000000".into()),
        ("burst", "1000000".into()),
        ("ip_requests_per_second", "1000000".into()),
        ("creations_per_minute", "10000".into()),
        ("max_sandboxes_per_tenant", sandboxes.clone()),
        ("max_sandboxes_total", sandboxes),
        ("max_sessions_per_tenant", sessions.clone()),
        ("max_sessions_total", sessions.clone()),
        ("max_connections_per_ip", sessions),
    ]
}

/// Each client loops `print(1)` in its sandbox for `secs`, all starting
/// `after` from now: every answered call's time, and the calls that failed.
pub async fn loop_print(pairs: Vec<(McpClient, String)>, after: Duration, secs: Duration) -> (Vec<Duration>, usize) {
    let start = Instant::now() + after;
    let mut handles = vec![];
    for (c, sid) in pairs {
        handles.push(tokio::spawn(async move {
            let args = json!({"sandbox_id": sid, "code": "print(1)"});
            tokio::time::sleep_until(start.into()).await;
            let end = start + secs;
            let (mut lat, mut errors) = (vec![], 0usize);
            while Instant::now() < end {
                let t = Instant::now();
                match c.tool("execute_python_code", args.clone()).await {
                    Ok(r) if r["stdout"] == "1\n" => lat.push(t.elapsed()),
                    _ => errors += 1,
                }
            }
            (lat, errors)
        }));
    }
    let (mut all, mut errors) = (vec![], 0);
    for h in handles {
        let (lat, e) = h.await.unwrap();
        all.extend(lat);
        errors += e;
    }
    (all, errors)
}

/// A value of the server's Prometheus text, when `/metrics` answers.
pub async fn metric(http: &reqwest::Client, base: &str, name: &str) -> Option<f64> {
    let text = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Waits (at most `within`) until the warm pool holds what it aims for.
pub async fn pool_full(http: &reqwest::Client, base: &str, within: Duration) -> Duration {
    let t = Instant::now();
    while t.elapsed() < within {
        let ready = metric(http, base, "mcp_sandbox_pool_ready").await;
        let size = metric(http, base, "mcp_sandbox_pool_size").await;
        if ready.is_some() && ready >= size {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    t.elapsed()
}

/// Sandboxes outlive a load generator that died by at most this long.
pub const LOAD_SANDBOX_LIFETIME_SECONDS: u64 = 3600;

pub struct Server {
    child: Child,
    pub base: String,
    _root: tempfile::TempDir,
    bin: std::path::PathBuf,
    port: u16,
    /// The configuration file the server reads, when the caller wrote one;
    /// without one, [`load_limits`] come as environment variables.
    config: Option<std::path::PathBuf>,
    env: Vec<(String, String)>,
}

impl Server {
    /// The server on its defaults, with [`load_limits`] for 200 sandboxes
    /// and 2,000 sessions, and `env` on top.
    pub async fn start(bin: &str, env: &[(&str, String)]) -> Self {
        Self::launch(bin, None, env).await
    }

    /// The server reading the configuration file `config` (which states
    /// its limits), with `env` on top.
    pub async fn start_configured(bin: &str, config: &std::path::Path, env: &[(&str, String)]) -> Self {
        Self::launch(bin, Some(config.to_path_buf()), env).await
    }

    async fn launch(bin: &str, config: Option<std::path::PathBuf>, env: &[(&str, String)]) -> Self {
        let root = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let bin = std::fs::canonicalize(bin).expect("the release binary (cargo build --release)");
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        let child = Self::spawn(&bin, config.as_deref(), root.path(), port, &env);
        let base = format!("http://127.0.0.1:{port}");
        let me = Self {
            child,
            base,
            _root: root,
            bin,
            port,
            config,
            env,
        };
        // A start may build templates first.
        assert!(me.wait_healthy(Duration::from_secs(600)).await, "server did not start");
        me
    }

    /// The server's state folder and results folder live here.
    pub fn root(&self) -> &std::path::Path {
        self._root.path()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its open descriptors.
    pub fn descriptors(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// Kills the server outright (SIGKILL) and starts it again on the same
    /// state and port; returns once it answers `/health` (or after `within`).
    pub async fn kill_and_restart(&mut self, within: Duration) -> bool {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = Self::spawn(
            &self.bin,
            self.config.as_deref(),
            self._root.path(),
            self.port,
            &self.env,
        );
        self.wait_healthy(within).await
    }

    async fn wait_healthy(&self, within: Duration) -> bool {
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if reqwest::get(format!("{}/health", self.base))
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    fn spawn(
        bin: &std::path::Path,
        config: Option<&std::path::Path>,
        root: &std::path::Path,
        port: u16,
        env: &[(String, String)],
    ) -> Child {
        let mut command = Command::new(bin);
        match config {
            Some(path) => {
                command.arg("--config").arg(path);
            }
            None => {
                let lifetime = LOAD_SANDBOX_LIFETIME_SECONDS.to_string();
                command.env("MCP_SANDBOX_SANDBOX_MAX_LIFETIME_SECONDS", lifetime);
                for (key, value) in load_limits(200, 2000) {
                    command.env(format!("MCP_SANDBOX_LIMITS_{}", key.to_ascii_uppercase()), value);
                }
            }
        }
        command
            .args(["serve", "--host", "127.0.0.1", "--port", &port.to_string()])
            .current_dir(root)
            // In the run's folder, wherever its configuration file is.
            .env("MCP_SANDBOX_SERVER_STATE_DIR", root.join("state"))
            .env("MCP_SANDBOX_RESULTS_DIR", root.join("results"))
            .env("RUST_LOG", "warn")
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the server (build it with cargo build --release)")
    }

    /// SIGTERM, then waits for the process to end (it is reaped here, so
    /// that it does not linger as a zombie); whether it ended `within`.
    pub async fn stop(&mut self, within: Duration) -> bool {
        let _ = Command::new("kill").arg(self.child.id().to_string()).status();
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    pub fn rss_mb(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        let kb: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        kb / 1024.0
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SIGTERM: a clean stop. The clients deleted their sandboxes, unless
        // the run panicked: then whatever still carries this server's label
        // goes too (containers, volumes, its network and firewall rules).
        let _ = Command::new("kill").arg(self.child.id().to_string()).status();
        let _ = self.child.wait();
        let Ok(id) = std::fs::read_to_string(self._root.path().join("state/server-id")) else {
            return;
        };
        let label = format!("label=io.mcp-sandbox.server={}", id.trim());
        let listed = |args: &[&str]| -> Vec<String> {
            let out = Command::new("docker")
                .args(args)
                .args(["-q", "--filter", &label])
                .output();
            out.map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
        };
        let remove = |args: &[&str], ids: Vec<String>| {
            if !ids.is_empty() {
                let _ = Command::new("docker")
                    .args(args)
                    .args(&ids)
                    .stdout(Stdio::null())
                    .status();
            }
        };
        remove(&["rm", "-f", "-v"], listed(&["ps", "-a"]));
        remove(&["volume", "rm", "-f"], listed(&["volume", "ls"]));
        remove(&["network", "rm"], listed(&["network", "ls"]));
        // The template images it built.
        remove(&["image", "rm", "-f"], listed(&["images"]));
        let tag = format!("mcp-sandbox:{}", id.trim());
        for (table, chain) in [
            ("filter", "INPUT"),
            ("filter", "DOCKER-USER"),
            ("raw", "PREROUTING"),
            ("mangle", "FORWARD"),
        ] {
            let Ok(rules) = Command::new("iptables").args(["-w", "-t", table, "-S", chain]).output() else {
                continue;
            };
            for rule in String::from_utf8_lossy(&rules.stdout)
                .lines()
                .filter(|l| l.contains(&tag))
            {
                // Rules read back as `-A CHAIN … --comment "tag" …`; the tag has no spaces.
                let args: Vec<&str> = rule.split_whitespace().skip(1).map(|a| a.trim_matches('"')).collect();
                let _ = Command::new("iptables")
                    .args(["-w", "-t", table, "-D"])
                    .args(args)
                    .status();
            }
        }
        // The disk images and agent folders of sandboxes left behind.
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut mounts: Vec<&str> = mountinfo
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| std::path::Path::new(m).starts_with(self._root.path()))
            .collect();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in mounts {
            let _ = Command::new("umount").args(["-l", m]).status();
        }
    }
}
