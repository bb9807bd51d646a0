//! Load generator: starts the release server, then drives it with MCP
//! clients speaking raw JSON-RPC over HTTP, so the figures are the server's
//! and not a client library's:
//!
//! 1. one client, `print(1)` in a loop, over `/mcp` (session-based
//!    Streamable HTTP, 2025-06-18) and over the legacy `/sse` transport;
//! 2. N concurrent clients, each with its own sandbox: create, `print(1)` for
//!    S seconds, delete; calls per second, p50/p95/p99 and errors.
//!
//! `cargo build --release && cargo bench --bench load [-- --clients 10 --seconds 10 --n 300]`

mod common;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{arg, header, row, Series};
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::sync::oneshot;

const PROTOCOL: &str = "2025-06-18";

fn rpc(id: u64, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

fn init_params() -> Value {
    json!({"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "mcp-sandbox-load", "version": "1"}})
}

/// The JSON-RPC response with `id` among the `data:` lines of an SSE body.
fn find_response(body: &str, id: u64) -> Option<Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|v| v.get("id").and_then(Value::as_u64) == Some(id))
}

enum Transport {
    /// Streamable HTTP with a session.
    Http { url: String, session: String },
    /// Legacy SSE: POSTs to `post_url`, answers through the event stream.
    Sse {
        post_url: String,
        pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>,
        _reader: tokio::task::JoinHandle<()>,
    },
}

struct McpClient {
    http: reqwest::Client,
    transport: Transport,
    next: AtomicU64,
}

impl McpClient {
    async fn http(http: reqwest::Client, base: &str) -> Self {
        let url = format!("{base}/mcp");
        let resp = http
            .post(&url)
            .header("Accept", "application/json, text/event-stream")
            .json(&rpc(1, "initialize", init_params()))
            .send()
            .await
            .expect("initialize");
        let session = resp
            .headers()
            .get("mcp-session-id")
            .expect("session id")
            .to_str()
            .unwrap()
            .to_string();
        let _ = resp.text().await;
        let me = Self {
            http,
            transport: Transport::Http { url, session },
            next: AtomicU64::new(2),
        };
        me.notify_initialized().await;
        me
    }

    async fn sse(http: reqwest::Client, base: &str) -> Self {
        let resp = http.get(format!("{base}/sse")).send().await.expect("open /sse");
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
        });
        let path = endpoint_rx.await.expect("endpoint event");
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
        me.request("initialize", init_params()).await;
        me.notify_initialized().await;
        me
    }

    async fn notify_initialized(&self) {
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        match &self.transport {
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
                    .expect("initialized");
            }
            Transport::Sse { post_url, .. } => {
                self.http.post(post_url).json(&note).send().await.expect("initialized");
            }
        }
    }

    async fn request(&self, method: &str, params: Value) -> Value {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let body = rpc(id, method, params);
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
                    .expect("POST /mcp");
                let text = resp.text().await.expect("body");
                if let Ok(v) = serde_json::from_str::<Value>(&text) {
                    return v;
                }
                find_response(&text, id).unwrap_or_else(|| panic!("no response in {text:?}"))
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
                    .expect("POST /messages")
                    .status();
                assert_eq!(status.as_u16(), 202);
                rx.await.expect("response event")
            }
        }
    }

    /// Calls a tool; `Err` for a protocol or tool error.
    async fn tool(&self, name: &str, args: Value) -> Result<Value, String> {
        let v = self
            .request("tools/call", json!({"name": name, "arguments": args}))
            .await;
        let result = v.get("result").ok_or_else(|| v.to_string())?;
        if result.get("isError").and_then(Value::as_bool) == Some(true) {
            return Err(result.to_string());
        }
        Ok(result["structuredContent"].clone())
    }
}

struct Server {
    child: Child,
    base: String,
    _root: tempfile::TempDir,
}

impl Server {
    async fn start(bin: &str) -> Self {
        let root = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(bin)
            .args(["serve", "--port", &port.to_string()])
            .current_dir(root.path())
            .env("RUST_LOG", "warn")
            .env("MCP_SANDBOX_SANDBOX_MAX_LIFETIME_SECONDS", "3600")
            // The load generator is one tenant calling far faster than an agent.
            .env("MCP_SANDBOX_LIMITS_REQUESTS_PER_SECOND", "1000000")
            .env("MCP_SANDBOX_LIMITS_BURST", "1000000")
            .env("MCP_SANDBOX_LIMITS_IP_REQUESTS_PER_SECOND", "1000000")
            .env("MCP_SANDBOX_LIMITS_CREATIONS_PER_MINUTE", "10000")
            .env("MCP_SANDBOX_LIMITS_MAX_SANDBOXES_PER_TENANT", "200")
            .env("MCP_SANDBOX_LIMITS_MAX_SANDBOXES_TOTAL", "200")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the server (build it with cargo build --release)");
        let base = format!("http://127.0.0.1:{port}");
        for _ in 0..600 {
            if reqwest::get(format!("{base}/health"))
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                return Self {
                    child,
                    base,
                    _root: root,
                };
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("server did not start");
    }

    fn rss_mb(&self) -> f64 {
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
        // SIGTERM: a clean stop; the sandboxes were deleted by the clients.
        let _ = Command::new("kill").arg(self.child.id().to_string()).status();
        let _ = self.child.wait();
    }
}

async fn sequential(client: &McpClient, n: usize) -> Vec<Duration> {
    let sid = client.tool("create_sandbox", json!({})).await.unwrap()["sandbox_id"]
        .as_str()
        .unwrap()
        .to_string();
    let args = json!({"sandbox_id": sid, "code": "print(1)"});
    for _ in 0..20 {
        client.tool("execute_python_code", args.clone()).await.unwrap();
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = client.tool("execute_python_code", args.clone()).await.unwrap();
        out.push(t.elapsed());
        assert_eq!(r["stdout"], "1\n");
    }
    client.tool("delete_sandbox", json!({"sandbox_id": sid})).await.unwrap();
    out
}

/// `clients` clients, each with a sandbox, looping `print(1)` for `secs`.
async fn concurrent(base: &str, sse: bool, clients: usize, secs: u64) -> (Vec<Duration>, usize, f64) {
    let http = reqwest::Client::new();
    let mut handles = vec![];
    let start = Instant::now() + Duration::from_secs(2);
    for _ in 0..clients {
        let (http, base) = (http.clone(), base.to_string());
        handles.push(tokio::spawn(async move {
            let c = if sse {
                McpClient::sse(http, &base).await
            } else {
                McpClient::http(http, &base).await
            };
            let sid = c.tool("create_sandbox", json!({})).await.unwrap()["sandbox_id"]
                .as_str()
                .unwrap()
                .to_string();
            let args = json!({"sandbox_id": sid, "code": "print(1)"});
            c.tool("execute_python_code", args.clone()).await.unwrap();
            tokio::time::sleep_until(start.into()).await;
            let end = start + Duration::from_secs(secs);
            let (mut lat, mut errors) = (vec![], 0usize);
            while Instant::now() < end {
                let t = Instant::now();
                match c.tool("execute_python_code", args.clone()).await {
                    Ok(r) if r["stdout"] == "1\n" => lat.push(t.elapsed()),
                    _ => errors += 1,
                }
            }
            c.tool("delete_sandbox", json!({"sandbox_id": sid})).await.unwrap();
            (lat, errors)
        }));
    }
    let (mut all, mut errors) = (vec![], 0);
    for h in handles {
        let (lat, e) = h.await.unwrap();
        all.extend(lat);
        errors += e;
    }
    let rate = all.len() as f64 / secs as f64;
    (all, errors, rate)
}

#[tokio::main]
async fn main() {
    let bin: String = arg("--bin", "target/release/mcp-sandbox".to_string());
    let n: usize = arg("--n", 300);
    let clients: usize = arg("--clients", 10);
    let secs: u64 = arg("--seconds", 10);
    let bin = std::fs::canonicalize(&bin).expect("the release binary (cargo build --release)");
    let server = Server::start(bin.to_str().unwrap()).await;
    let rss_idle = server.rss_mb();
    let http = reqwest::Client::new();

    let mcp = Series::new(
        "print(1) via /mcp, 1 client",
        sequential(&McpClient::http(http.clone(), &server.base).await, n).await,
    );
    let sse = Series::new(
        "print(1) via /sse, 1 client",
        sequential(&McpClient::sse(http.clone(), &server.base).await, n).await,
    );
    let (lat, mcp_errors, mcp_rate) = concurrent(&server.base, false, clients, secs).await;
    let mcp_load = Series::new(format!("print(1) via /mcp, {clients} clients x {secs} s"), lat);
    let rss_load = server.rss_mb();
    let (lat, sse_errors, sse_rate) = concurrent(&server.base, true, clients, secs).await;
    let sse_load = Series::new(format!("print(1) via /sse, {clients} clients x {secs} s"), lat);

    println!();
    header();
    for s in [&mcp, &sse, &mcp_load, &sse_load] {
        row(s);
    }
    println!("/mcp with {clients} clients: {mcp_rate:.0} calls/s, {mcp_errors} errors");
    println!("/sse with {clients} clients: {sse_rate:.0} calls/s, {sse_errors} errors");
    println!("server RSS: {rss_idle:.1} MB idle, {rss_load:.1} MB after {clients} sandboxes");
}
