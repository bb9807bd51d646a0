//! Forks: how long `fork_sandbox` takes for 1 and for `--many` copies,
//! against the size of the Python namespace, beside what it is made of.
//!
//! For each namespace size in `--sizes-mb` (numpy arrays when numpy
//! installs, bytearrays otherwise) with `--files-mb` of files in
//! `/app/results`, one source sandbox, then `--n` forks of 1 and `--n`
//! forks of `--many`, each checked (an array element in every fork) and
//! deleted before the next. The baselines, in the same run: the namespace's
//! serialisation alone (cloudpickle to the results disk and back, inside the
//! source), and `create_sandbox` with the same pool (`--pool-min`, 0: every
//! sandbox made cold), which a fork pays once per copy.
//!
//! `cargo build --release && cargo bench --bench fork [-- --runtime runc --sizes-mb 10,200 --files-mb 50 --n 5 --many 8 --pool-min 0 --log info]`

mod common;

use std::time::Duration;

use common::mcp::{McpClient, Server};
use common::{arg, header, row, Series};
use serde_json::json;

/// Times cloudpickle's dump and load of `state` inside the sandbox, as the
/// agent does them: to a file on the results disk and back.
/// (In a function of its own, deleted after: the namespace the forks carry
/// stays as it was.)
const SERIALISE: &str = r#"def _measure(state):
    import sys, time, os
    sys.path.insert(0, '/opt/mcp-agent/lib')
    import cloudpickle, pickle
    t = time.perf_counter()
    with open('/app/results/bench.pickle', 'wb') as f:
        cloudpickle.dump({'state': state}, f, protocol=5)
    d = time.perf_counter() - t
    t = time.perf_counter()
    with open('/app/results/bench.pickle', 'rb') as f:
        pickle.load(f)
    os.remove('/app/results/bench.pickle')
    return d, time.perf_counter() - t
print(*_measure(state))
del _measure"#;

#[tokio::main]
async fn main() {
    let bin: String = arg("--bin", "target/release/mcp-sandbox".to_string());
    let runtime: String = arg("--runtime", "runc".to_string());
    let sizes: String = arg("--sizes-mb", "10,200".to_string());
    let files_mb: usize = arg("--files-mb", 50);
    let n: usize = arg("--n", 5).max(1);
    let many: usize = arg("--many", 8).clamp(1, 16);
    let pool_min: usize = arg("--pool-min", 0);
    // `--log info` shows the server's own split of each fork (the export
    // out of the source, each seed into a new sandbox).
    let log: String = arg("--log", "warn".to_string());
    let sizes: Vec<usize> = sizes.split(',').filter_map(|s| s.trim().parse().ok()).collect();

    let server = Server::start(
        &bin,
        &[
            ("MCP_SANDBOX_SANDBOX_RUNTIME", runtime.clone()),
            ("MCP_SANDBOX_SANDBOX_MEMORY_MB", "2048".into()),
            ("MCP_SANDBOX_SANDBOX_RESULTS_MB", "2048".into()),
            ("MCP_SANDBOX_POOL_MIN", pool_min.to_string()),
            ("MCP_SANDBOX_POOL_MAX", pool_min.max(many).to_string()),
            ("MCP_SANDBOX_LIMITS_MAX_SANDBOXES_PER_TENANT", (many + 2).to_string()),
            ("MCP_SANDBOX_LIMITS_CREATIONS_PER_MINUTE", "10000".into()),
            ("RUST_LOG", log),
        ],
    )
    .await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(900))
        .build()
        .unwrap();
    let c = McpClient::http(http, &server.base).await;
    println!(
        "fork: runtime {runtime}, namespaces {sizes:?} MB, {files_mb} MB of files, {n} rounds of 1 and of {many}, pool.min {pool_min}; server {bin}"
    );

    let mut series = vec![];
    for &size in &sizes {
        let (sid, _, _) = c.loaded_sandbox(&format!("fork-{size}"), size, files_mb).await;
        c.py(&sid, "state[0][0] = 7").await;
        let (mut dumps, mut loads) = (vec![], vec![]);
        for _ in 0..n {
            let out = c.py(&sid, SERIALISE).await["stdout"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let secs: Vec<f64> = out.split_whitespace().filter_map(|s| s.parse().ok()).collect();
            dumps.push(Duration::from_secs_f64(secs[0]));
            loads.push(Duration::from_secs_f64(secs[1]));
        }
        let mut creates = vec![];
        for _ in 0..n {
            let (made, t) = c.timed("create_sandbox", json!({"name": "baseline"})).await;
            creates.push(t);
            c.timed("delete_sandbox", json!({"sandbox_id": made["sandbox_id"]}))
                .await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        for count in [1, many] {
            let mut times = vec![];
            for _ in 0..n {
                let (forked, t) = c
                    .timed("fork_sandbox", json!({"sandbox_id": sid, "count": count}))
                    .await;
                times.push(t);
                for f in forked["forks"].as_array().unwrap() {
                    assert_eq!(f["python"], "carried", "{f}");
                    let fork = f["sandbox_id"].as_str().unwrap();
                    let check = c.py(fork, "print(state[0][0] == 7, len(os.listdir('data')))").await;
                    assert_eq!(check["stdout"], format!("True {files_mb}\n"), "{forked}");
                    c.timed("delete_sandbox", json!({"sandbox_id": fork})).await;
                }
                // The pool refills (and the host flushes) before the next round.
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            series.push(Series::new(format!("{size} MB: fork_sandbox count {count}"), times));
        }
        series.push(Series::new(format!("{size} MB: cloudpickle dump (baseline)"), dumps));
        series.push(Series::new(format!("{size} MB: cloudpickle load (baseline)"), loads));
        series.push(Series::new(format!("{size} MB: create_sandbox (baseline)"), creates));
        c.timed("delete_sandbox", json!({"sandbox_id": sid})).await;
    }
    println!();
    header();
    for s in &series {
        row(s);
    }
}
