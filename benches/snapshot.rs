//! Snapshots: how long `snapshot_sandbox` and `restore_snapshot` take
//! against the size of the Python namespace, and what a snapshot costs in
//! memory and disk.
//!
//! For each namespace size in `--sizes-mb` (numpy arrays when numpy
//! installs, bytearrays otherwise) with `--files-mb` of files in
//! `/app/results`, one sandbox: a first snapshot (every file copied), then
//! `--n` rounds of: change one variable and one 1 MB file, take a snapshot
//! (unchanged files are linked to the one before), change the whole
//! namespace and delete most files, restore. Times are as the client sees
//! them over Streamable HTTP; `reset_python` is the baseline of a call that
//! replaces the worker in the same queue. The container's memory (cgroup,
//! from the REST API) is read before and after the snapshot rounds, and each
//! snapshot's disk from its result.
//!
//! `cargo build --release && cargo bench --bench snapshot [-- --runtime runc --sizes-mb 10,200 --files-mb 50 --n 20 --log info]`

mod common;

use std::time::Duration;

use common::mcp::{McpClient, Server};
use common::{arg, header, row, Series};
use serde_json::{json, Value};

async fn memory_mb(http: &reqwest::Client, base: &str, sid: &str) -> f64 {
    let v: Value = http
        .get(format!("{base}/api/sandboxes/{sid}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["usage"]["memory_bytes"].as_f64().unwrap_or(f64::NAN) / f64::from(1 << 20)
}

#[tokio::main]
async fn main() {
    let bin: String = arg("--bin", "target/release/mcp-sandbox".to_string());
    let runtime: String = arg("--runtime", "runc".to_string());
    let sizes: String = arg("--sizes-mb", "10,200".to_string());
    let files_mb: usize = arg("--files-mb", 50);
    let n: usize = arg("--n", 20).max(1);
    // `--log info` shows the server's own split of each snapshot and
    // restore (Python state against files).
    let log: String = arg("--log", "warn".to_string());
    let sizes: Vec<usize> = sizes.split(',').filter_map(|s| s.trim().parse().ok()).collect();

    let server = Server::start(
        &bin,
        &[
            ("MCP_SANDBOX_SANDBOX_RUNTIME", runtime.clone()),
            ("MCP_SANDBOX_SANDBOX_MEMORY_MB", "2048".into()),
            ("MCP_SANDBOX_POOL_MIN", "0".into()),
            ("MCP_SANDBOX_POOL_MAX", "0".into()),
            ("RUST_LOG", log),
        ],
    )
    .await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()
        .unwrap();
    let c = McpClient::http(http.clone(), &server.base).await;
    println!("snapshot: runtime {runtime}, namespaces {sizes:?} MB, {files_mb} MB of files, {n} rounds; server {bin}");

    let mut series = vec![];
    let mut costs = vec![];
    for &size in &sizes {
        let (sid, fill, kind) = c.loaded_sandbox(&format!("snap-{size}"), size, files_mb).await;
        let numpy = kind == "numpy";
        let before = memory_mb(&http, &server.base, &sid).await;
        let (first, first_t) = c
            .timed("snapshot_sandbox", json!({"sandbox_id": sid, "label": "first"}))
            .await;
        // The first copy's writeback (and the last sandbox's removal) is
        // flushed before the timed rounds, so they measure snapshots alone.
        let _ = std::process::Command::new("sync").status();
        let (mut snaps, mut restores, mut resets) = (vec![], vec![], vec![]);
        let mut disk = vec![];
        let mut kept: Vec<String> = vec![first["snapshot_id"].as_str().unwrap().into()];
        for round in 0..n {
            c.py(
                &sid,
                &format!("state[0][0] = {round}\nopen('data/changed.bin', 'wb').write(os.urandom(1 << 20))"),
            )
            .await;
            let (snap, t) = c.timed("snapshot_sandbox", json!({"sandbox_id": sid})).await;
            snaps.push(t);
            disk.push(snap["disk_bytes"].as_u64().unwrap_or(0));
            let snap_id = snap["snapshot_id"].as_str().unwrap().to_string();
            let mangle = if numpy {
                "for a in state: a[:] = 0"
            } else {
                "for a in state: a[:] = bytes(len(a))"
            };
            c.py(
                &sid,
                &format!("{mangle}\nimport glob\nfor p in glob.glob('data/*.bin')[:-5]: os.remove(p)"),
            )
            .await;
            let (restored, t) = c
                .timed("restore_snapshot", json!({"sandbox_id": sid, "snapshot_id": snap_id}))
                .await;
            assert_eq!(restored["python"], "restored", "{restored}");
            restores.push(t);
            let check = c
                .py(&sid, &format!("print(state[0][0] == {round}, len(os.listdir('data')))"))
                .await;
            assert_eq!(check["stdout"], format!("True {}\n", files_mb + 1), "round {round}");
            kept.push(snap_id);
            if kept.len() >= 3 {
                let old = kept.remove(1);
                c.timed("delete_snapshot", json!({"sandbox_id": sid, "snapshot_id": old}))
                    .await;
            }
            let (_, t) = c.timed("reset_python", json!({"sandbox_id": sid})).await;
            resets.push(t);
            c.py(&sid, &format!("import os\n{fill}")).await;
        }
        let after = memory_mb(&http, &server.base, &sid).await;
        series.push(Series::new(
            format!("{size} MB: first snapshot (all files copied)"),
            vec![first_t],
        ));
        series.push(Series::new(format!("{size} MB: snapshot_sandbox"), snaps));
        series.push(Series::new(format!("{size} MB: restore_snapshot"), restores));
        series.push(Series::new(format!("{size} MB: reset_python (baseline)"), resets));
        disk.sort_unstable();
        costs.push(format!(
            "| {size} MB ({kind}) | {:.0} | {:.1} | {:.1} | {before:.0} | {after:.0} |",
            first["disk_bytes"].as_f64().unwrap_or(0.0) / f64::from(1 << 20),
            disk[disk.len() / 2] as f64 / f64::from(1 << 20),
            first["files"].as_u64().unwrap_or(0) as f64,
        ));
        c.timed("delete_sandbox", json!({"sandbox_id": sid})).await;
    }
    println!();
    header();
    for s in &series {
        row(s);
    }
    println!();
    println!("| namespace | first snapshot disk MiB | later snapshot disk MiB (median) | entries saved | container MiB before | after {n} rounds (2 snapshots kept) |");
    println!("|---|---|---|---|---|---|");
    for line in costs {
        println!("{line}");
    }
}
