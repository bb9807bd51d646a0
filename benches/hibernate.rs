//! Hibernation: how long a sandbox takes to go to sleep on disk and to wake
//! with its next call, against the size of its Python namespace, and what
//! a sleeping sandbox still holds.
//!
//! For each namespace size in `--sizes-mb` (numpy arrays when numpy
//! installs, bytearrays otherwise), one sandbox and `--n` rounds of:
//! `hibernate_sandbox`, then `print(len(state))`, which wakes it (a
//! container made on its disks, the namespace loaded) and runs; then the
//! same call awake, the baseline. Times are as the client sees them over
//! Streamable HTTP. Before and after each sleep: the host's mounts under
//! the server's folders and the sandbox's containers (kernel objects a
//! sleeping sandbox must not hold), and the server's RSS. The server's log
//! lines "woke from hibernation" (on stderr) split each wake into its
//! steps.
//!
//! `cargo build --release && cargo bench --bench hibernate [-- --runtime runc --sizes-mb 10,200 --n 5]`

mod common;

use std::time::Duration;

use common::mcp::{McpClient, Server};
use common::{arg, table, Series};
use serde_json::json;

/// Mounts under `root` (the server's state and results folders).
fn mounts_under(root: &std::path::Path) -> usize {
    let root = root.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(&root)))
        .count()
}

/// The containers labelled as `sid`'s.
fn containers_of(sid: &str) -> usize {
    let out = std::process::Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("label=io.mcp-sandbox.sandbox={sid}")])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.split_whitespace().count()
}

#[tokio::main]
async fn main() {
    let bin: String = arg("--bin", "target/release/mcp-sandbox".to_string());
    let runtime: String = arg("--runtime", "runc".to_string());
    let sizes: String = arg("--sizes-mb", "10,200".to_string());
    let n: usize = arg("--n", 5).max(1);
    let sizes: Vec<usize> = sizes.split(',').filter_map(|s| s.trim().parse().ok()).collect();
    let server = Server::start(
        &bin,
        &[
            ("MCP_SANDBOX_SANDBOX_RUNTIME", runtime.clone()),
            ("MCP_SANDBOX_SANDBOX_MEMORY_MB", "2048".into()),
            ("MCP_SANDBOX_SANDBOX_RESULTS_MB", "2048".into()),
            ("MCP_SANDBOX_POOL_MIN", "0".into()),
            ("MCP_SANDBOX_POOL_MAX", "0".into()),
            // Each wake's log line says where its time went.
            ("RUST_LOG", "warn,sandbox_actors::sandbox::hibernation=info".into()),
        ],
    )
    .await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()
        .unwrap();
    let c = McpClient::http(http, &server.base).await;
    println!("hibernate: runtime {runtime}, namespaces {sizes:?} MB, {n} rounds; server {bin}");

    let mut series = vec![];
    let mut held = vec![];
    for &size in &sizes {
        let (sid, _, kind) = c.loaded_sandbox(&format!("sleep-{size}"), size, 0).await;
        let (mut sleeps, mut wakes, mut awake) = (vec![], vec![], vec![]);
        let check = "print(len(state))";
        for _ in 0..n {
            let before = (mounts_under(server.root()), containers_of(&sid), server.rss_mb());
            let (slept, t) = c.timed("hibernate_sandbox", json!({"sandbox_id": sid})).await;
            assert_eq!(slept["python"], "carried", "{slept}");
            sleeps.push(t);
            let asleep = (mounts_under(server.root()), containers_of(&sid), server.rss_mb());
            let (woke, t) = c
                .timed("execute_python_code", json!({"sandbox_id": sid, "code": check}))
                .await;
            assert_eq!(woke["stdout"], format!("{size}\n"), "{woke}");
            assert!(
                woke["notice"].as_str().unwrap_or_default().contains("Python: carried"),
                "{woke}"
            );
            wakes.push(t);
            let (_, t) = c
                .timed("execute_python_code", json!({"sandbox_id": sid, "code": check}))
                .await;
            awake.push(t);
            held.push(format!(
                "| {size} MB ({kind}) | {} → {} | {} → {} | {:.1} → {:.1} |",
                before.0, asleep.0, before.1, asleep.1, before.2, asleep.2
            ));
        }
        series.push(Series::new(format!("{size} MB: hibernate_sandbox"), sleeps));
        series.push(Series::new(format!("{size} MB: the call that wakes it"), wakes));
        series.push(Series::new(format!("{size} MB: the same call awake (baseline)"), awake));
        c.timed("delete_sandbox", json!({"sandbox_id": sid})).await;
    }
    table(&series);
    println!("\ngoal: the waking call p50 at most 300 ms for 10 MB under runc, at most 1 s for 200 MB");
    println!("\n| namespace | mounts under the server's folders, awake → asleep | its containers | server RSS MB |");
    println!("|---|---|---|---|");
    for line in held {
        println!("{line}");
    }
}
