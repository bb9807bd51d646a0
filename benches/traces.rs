//! What tracing costs a call: `print(1)` over MCP (`/mcp`) on two release
//! servers started side by side, one without `[telemetry]` (the baseline)
//! and one exporting to an OTLP/HTTP receiver in this process (which
//! answers 200 and counts what it gets), in alternating batches so that
//! both meet the same machine. Prints p50/p95/p99 of each, the difference,
//! the bytes and requests the receiver got per call, and each server's RSS.
//!
//! `cargo build --release && cargo bench --bench traces [-- --n 300 --bin target/release/mcp-sandbox]`
//! (Docker must run; `scripts/bench` provisions it).

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use axum::Router;
use common::mcp::{print_series, McpClient, Server};
use common::{arg, header, row, Series};

/// What the receiver got.
#[derive(Default)]
struct Received {
    requests: AtomicU64,
    bytes: AtomicU64,
}

async fn receive(State(got): State<Arc<Received>>, body: Bytes) -> &'static str {
    got.requests.fetch_add(1, Ordering::Relaxed);
    got.bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
    ""
}

/// An OTLP/HTTP receiver on a loopback port: its base URL and its counts.
async fn receiver() -> (String, Arc<Received>) {
    let got = Arc::new(Received::default());
    let app = Router::new().route("/v1/traces", post(receive)).with_state(got.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, got)
}

#[tokio::main]
async fn main() {
    let n: usize = arg("--n", 300);
    let batches: usize = arg("--batches", 6);
    let bin: String = arg("--bin", "target/release/mcp-sandbox".to_string());
    let (otlp, got) = receiver().await;
    let plain = Server::start(&bin, &[]).await;
    let traced = Server::start(
        &bin,
        &[
            ("MCP_SANDBOX_TELEMETRY_OTLP_ENDPOINT", otlp),
            ("OTEL_BSP_SCHEDULE_DELAY", "1000".into()),
        ],
    )
    .await;
    let http = reqwest::Client::new();
    let mut runs = Vec::new();
    for server in [&plain, &traced] {
        let client = McpClient::http(http.clone(), &server.base).await;
        let sid = client.try_create("traces").await.expect("create");
        runs.push((client, sid));
    }
    let per_batch = n.div_ceil(batches);
    let (mut untraced, mut with_traces) = (Vec::new(), Vec::new());
    for _ in 0..batches {
        untraced.extend(print_series(&runs[0].0, &runs[0].1, per_batch).await);
        with_traces.extend(print_series(&runs[1].0, &runs[1].1, per_batch).await);
    }
    // The last batch of spans leaves within the exporter's delay.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let calls = (per_batch + 20) * batches;

    println!("print(1) over /mcp, {batches} alternating batches; release servers side by side\n");
    header();
    let base = Series::new("no [telemetry] (baseline)", untraced);
    let traced_series = Series::new("spans exported over OTLP/HTTP", with_traces);
    row(&base);
    row(&traced_series);
    println!(
        "\ndifference: p50 {:+.3} ms, p99 {:+.3} ms",
        traced_series.pct(50.0) - base.pct(50.0),
        traced_series.pct(99.0) - base.pct(99.0)
    );
    let (requests, bytes) = (got.requests.load(Ordering::Relaxed), got.bytes.load(Ordering::Relaxed));
    println!(
        "receiver: {requests} export requests, {bytes} bytes ({:.0} bytes per call)",
        bytes as f64 / calls as f64
    );
    println!(
        "server RSS: {:.1} MB without, {:.1} MB with traces",
        plain.rss_mb(),
        traced.rss_mb()
    );
    for (client, sid) in &runs {
        let _ = client
            .tool("delete_sandbox", serde_json::json!({"sandbox_id": sid}))
            .await;
    }
}
