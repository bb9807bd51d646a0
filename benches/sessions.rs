//! Idle sessions held against the server: its memory and descriptors with
//! none and with `--sessions` (default 2,000: the default
//! `limits.max_sessions_total`) idle MCP sessions held by `--holders`
//! tenants (half legacy SSE streams, each on its own connection, half
//! Streamable HTTP sessions), and the latency of another tenant's
//! `execute_python_code` meanwhile, against the same calls with none held,
//! in one run; then one more session, which the server refuses (503).
//!
//! `cargo build --release && cargo bench --bench sessions [-- --sessions 2000 --holders 20 --n 300]`

mod common;

use std::time::{Duration, Instant};

use common::mcp::{print_series, McpClient, Server};
use common::{arg, header, row, Series};
use serde_json::json;

fn client(key: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {key}").parse().unwrap());
    reqwest::Client::builder()
        .default_headers(headers)
        .tcp_nodelay(true)
        .build()
        .unwrap()
}

#[tokio::main]
async fn main() {
    let sessions: usize = arg("--sessions", 2000);
    let holders: usize = arg("--holders", 20);
    let n: usize = arg("--n", 300);
    let per_holder = sessions.div_ceil(holders);
    let key = |name: &str| format!("{name}-bench-key-0123456789");
    let keys: Vec<String> = (0..holders)
        .map(|i| format!("holder{i}"))
        .chain(["probe".to_string()])
        .map(|name| format!("{{name = \"{name}\", key = \"{}\"}}", key(&name)))
        .collect();
    let server = Server::start(
        "target/release/mcp-sandbox",
        &[
            ("MCP_SANDBOX_AUTH_ENABLED", "true".into()),
            ("MCP_SANDBOX_AUTH_KEYS", format!("[{}]", keys.join(", "))),
            ("MCP_SANDBOX_POOL_MIN", "1".into()),
            ("MCP_SANDBOX_POOL_MAX", "1".into()),
            ("MCP_SANDBOX_LIMITS_MAX_SESSIONS_PER_TENANT", per_holder.to_string()),
            // The probe's own session is one more.
            ("MCP_SANDBOX_LIMITS_MAX_SESSIONS_TOTAL", (sessions + 1).to_string()),
            // Every holder connects from 127.0.0.1.
            (
                "MCP_SANDBOX_LIMITS_MAX_CONNECTIONS_PER_IP",
                (sessions + 256).to_string(),
            ),
            ("MCP_SANDBOX_LIMITS_MAX_CONNECTIONS", (sessions + 512).to_string()),
        ],
    )
    .await;
    let probe = McpClient::http(client(&key("probe")), &server.base).await;
    let sid = probe.tool("create_sandbox", json!({})).await.unwrap()["sandbox_id"]
        .as_str()
        .unwrap()
        .to_string();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (rss_before, fds_before) = (server.rss_mb(), server.descriptors());
    let quiet = Series::new(
        "another tenant's print(1), no sessions held",
        print_series(&probe, &sid, n).await,
    );

    let opening = Instant::now();
    let mut held = Vec::with_capacity(sessions);
    for h in 0..holders {
        let http = client(&key(&format!("holder{h}")));
        for i in 0..per_holder.min(sessions - held.len()) {
            held.push(match i % 2 {
                0 => McpClient::sse(http.clone(), &server.base).await,
                _ => McpClient::http(http.clone(), &server.base).await,
            });
        }
    }
    let opened_in = opening.elapsed();
    // Streamable HTTP sessions hold no connection once initialized: let the
    // kept-alive ones idle out, as they would.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let (rss_held, fds_held) = (server.rss_mb(), server.descriptors());
    let busy = Series::new(
        format!("the same with {} idle sessions held", held.len()),
        print_series(&probe, &sid, n).await,
    );
    let refused = reqwest::Client::new()
        .get(format!("{}/sse", server.base))
        .header("authorization", format!("Bearer {}", key("probe")))
        .send()
        .await
        .unwrap()
        .status();
    probe.tool("delete_sandbox", json!({"sandbox_id": sid})).await.unwrap();

    header();
    row(&quiet);
    row(&busy);
    println!();
    println!(
        "| server | no sessions | {} idle sessions ({} SSE streams) |",
        held.len(),
        held.len().div_ceil(2)
    );
    println!("|---|---|---|");
    println!("| RSS MB | {rss_before:.1} | {rss_held:.1} |");
    println!("| open descriptors | {fds_before} | {fds_held} |");
    println!();
    println!(
        "opened {} sessions in {:.1} s; one more: HTTP {}; p50 ratio held/none {:.2}",
        held.len(),
        opened_in.as_secs_f64(),
        refused.as_u16(),
        busy.pct(50.0) / quiet.pct(50.0)
    );
    drop(held);
}
