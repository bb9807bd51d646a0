//! Calls while the warm pool refills: right after `--clients` claims, as
//! many clients loop `print(1)` in the sandboxes they claimed for
//! `--seconds`, while the pool (the shipped `min = "auto"`) makes up for
//! the claims; then, once the pool is full again, the same loop in the same
//! sandboxes, with nothing to refill: the baseline, in the same run. Each
//! of `--rounds` rounds claims new sandboxes. Prints, for both, the calls
//! per second, p50 and p99, and the refills done during the loop.
//!
//! `cargo build --release && cargo bench --bench refill [-- --clients 10 --seconds 10 --rounds 3]`

mod common;

use std::time::{Duration, Instant};

use common::mcp::{loop_print, metric, pool_full, McpClient, Server};
use common::{arg, Series};
use serde_json::json;

/// Loops `print(1)` in `ids` (one client each) for `secs`: the calls' times,
/// the failed calls, and the refills the pool finished meanwhile.
async fn measure(http: &reqwest::Client, base: &str, ids: &[String], secs: u64) -> (Vec<Duration>, usize, f64) {
    let mut pairs = vec![];
    for id in ids {
        pairs.push((McpClient::http(http.clone(), base).await, id.clone()));
    }
    let refills = || metric(http, base, "mcp_sandbox_pool_refills_total");
    let before = refills().await.unwrap_or(0.0);
    let (lat, errors) = loop_print(pairs, Duration::ZERO, Duration::from_secs(secs)).await;
    (lat, errors, refills().await.unwrap_or(0.0) - before)
}

#[tokio::main]
async fn main() {
    let bin: String = arg("--bin", "target/release/mcp-sandbox".to_string());
    let clients: usize = arg("--clients", 10).max(1);
    let secs: u64 = arg("--seconds", 10).max(1);
    let rounds: usize = arg("--rounds", 3).max(1);
    // The shipped pool; the limits of a load generator (200 sandboxes).
    let server = Server::start(&bin, &[]).await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let c = McpClient::http(http.clone(), &server.base).await;
    println!("refill: {clients} clients, {secs} s loops, {rounds} rounds; server {bin}");
    let (mut refilling, mut full) = (vec![], vec![]);
    let (mut refilling_calls, mut full_calls, mut errors) = (0usize, 0usize, 0usize);
    let (mut refills_during, mut refills_full) = (0.0, 0.0);
    for round in 1..=rounds {
        let filled = pool_full(&http, &server.base, Duration::from_secs(300)).await;
        let size = metric(&http, &server.base, "mcp_sandbox_pool_size")
            .await
            .unwrap_or(0.0);
        println!(
            "round {round}: the pool was full ({size} ready) after {:.1} s",
            filled.as_secs_f64()
        );
        // The claims, each with its first call, as agents make them.
        let t = Instant::now();
        let mut ids = vec![];
        for _ in 0..clients {
            let id = c.try_create("refill").await.expect("create_sandbox");
            c.tool("execute_python_code", json!({"sandbox_id": id, "code": "print(1)"}))
                .await
                .expect("first call");
            ids.push(id);
        }
        println!(
            "round {round}: {clients} claims and first calls in {:.2} s",
            t.elapsed().as_secs_f64()
        );
        let (lat, e, refills) = measure(&http, &server.base, &ids, secs).await;
        refilling_calls += lat.len();
        refilling.extend(lat);
        (errors, refills_during) = (errors + e, refills_during + refills);
        pool_full(&http, &server.base, Duration::from_secs(300)).await;
        let (lat, e, refills) = measure(&http, &server.base, &ids, secs).await;
        full_calls += lat.len();
        full.extend(lat);
        (errors, refills_full) = (errors + e, refills_full + refills);
        for id in &ids {
            c.tool("delete_sandbox", json!({"sandbox_id": id}))
                .await
                .expect("delete_sandbox");
        }
    }
    let seconds = (rounds as u64 * secs) as f64;
    let refilling = Series::new("", refilling);
    let full = Series::new("", full);
    println!();
    println!("| {clients} clients looping print(1) | calls/s | p50 ms | p99 ms | refills during the loops |");
    println!("|---|---|---|---|---|");
    println!(
        "| right after {clients} claims, the pool refilling | {:.0} | {:.1} | {:.1} | {refills_during:.0} |",
        refilling_calls as f64 / seconds,
        refilling.pct(50.0),
        refilling.pct(99.0)
    );
    println!(
        "| the pool full (baseline) | {:.0} | {:.1} | {:.1} | {refills_full:.0} |",
        full_calls as f64 / seconds,
        full.pct(50.0),
        full.pct(99.0)
    );
    println!(
        "| refilling / full | {:.2} | {:.2} | {:.2} | |",
        refilling_calls as f64 / full_calls.max(1) as f64,
        refilling.pct(50.0) / full.pct(50.0),
        refilling.pct(99.0) / full.pct(99.0)
    );
    println!("failed calls: {errors}");
}
