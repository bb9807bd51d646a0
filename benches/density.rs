//! Live sandboxes on one host: how many one server holds, and what each
//! costs. Creates `--n` sandboxes in steps of `--step`, `--parallel` at a
//! time over Streamable HTTP, each running `print(1)` once as an agent's
//! first call would (so its Python worker is up); idle sandboxes pause after
//! `--pause-after` seconds. After each step it prints the host's memory in
//! use and per sandbox, the server's RSS and descriptors, the loop devices
//! and mounts the disk quotas hold, the firewall's rule count, the time of
//! `list_sandboxes` and of a `/metrics` scrape, and `print(1)` on
//! `--probes` sandboxes picked at random (most of them paused). It stops
//! early, and says why, when the host's available memory falls below
//! `--min-available-mb` or a step's creations fail: that is the measured
//! ceiling and what bounds it. Every sandbox is deleted at the end.
//!
//! With `--hibernate-after S` (and `--awake A`, default 200), idle
//! sandboxes sleep on disk after S seconds instead of pausing, at most A
//! are awake at once (`limits.max_sandboxes_total`; hibernated ones have a
//! cap of their own, set past `--n`), and each step waits until its
//! sandboxes sleep: the rows then show what sleeping sandboxes cost (kernel
//! objects should follow the awake ones only, the server's RSS stay small)
//! and the probes' `print(1)` is mostly a wake. The figures are read
//! [`REST_WAIT`] after the sleeps, once the actors of sandboxes left asleep
//! have stopped (an older server's, compared with `--bin`, keep theirs).
//! Sandboxes live `--lifetime-seconds` (6 hours by default): longer than
//! the run, or the oldest are deleted under it.
//!
//! `cargo build --release && cargo bench --bench density [-- --n 1000 --step 100 --parallel 4]`
//! `cargo bench --bench density -- --n 10000 --step 200 --hibernate-after 5`

mod common;

use std::time::{Duration, Instant};

use common::mcp::{load_limits, McpClient, Server};
use common::{arg, Series};
use futures_util::StreamExt;
use rand::seq::IndexedRandom;
use serde_json::json;

/// A kilobyte figure of `/proc/meminfo`, in MiB.
fn meminfo_mb(key: &str) -> f64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

fn used_mb() -> f64 {
    meminfo_mb("MemTotal") - meminfo_mb("MemAvailable")
}

fn loop_devices() -> usize {
    std::fs::read_dir("/sys/block")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("loop"))
                .filter(|e| std::fs::metadata(e.path().join("loop/backing_file")).is_ok())
                .count()
        })
        .unwrap_or(0)
}

fn mounts() -> usize {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

fn firewall_rules() -> usize {
    std::process::Command::new("iptables")
        .args(["-w", "-S"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().count())
        .unwrap_or(0)
}

/// Creates a sandbox and runs `print(1)` in it; its id, or what failed.
async fn make(c: &McpClient, i: usize) -> Result<String, String> {
    let id = c.try_create(&format!("density-{i}")).await?;
    print_one(c, &id).await?;
    Ok(id)
}

async fn print_one(c: &McpClient, id: &str) -> Result<Duration, String> {
    let t = Instant::now();
    let ran = c
        .try_tool("execute_python_code", json!({"sandbox_id": id, "code": "print(1)"}))
        .await
        .map_err(|e| format!("print(1): {e:?}"))?;
    match ran["stdout"].as_str() {
        Some("1\n") => Ok(t.elapsed()),
        _ => Err(format!("print(1) answered {ran}")),
    }
}

/// How many sandboxes a `list_sandboxes` answer shows hibernated.
fn hibernated(listed: &serde_json::Value) -> usize {
    listed["sandboxes"]
        .as_array()
        .map_or(0, |all| all.iter().filter(|s| s["status"] == "hibernated").count())
}

/// How long the actor of a sleeping sandbox left alone stays (ten seconds),
/// and the upkeep period that asks it to rest, with room.
const REST_WAIT: Duration = Duration::from_secs(15);

/// Waits (at most `limit`) until all but the last step's few of `live`
/// sandboxes sleep: a step's sleeps take the time of their dumps and
/// container removals.
async fn asleep_by_now(c: &McpClient, live: usize, limit: Duration) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        match c.try_tool("list_sandboxes", json!({})).await {
            Ok(l) if hibernated(&l) + live / 50 >= live => return,
            _ => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

/// Waits (at most `limit`) until `count` more sandboxes fit under the cap
/// of awake ones: the probes' wakes of the step before fall asleep again.
/// A step larger than the cap waits for none awake (its first sandboxes
/// sleep while its last are made); it would otherwise wait out `limit`.
async fn room_for(c: &McpClient, count: usize, awake: usize, limit: Duration) {
    let deadline = Instant::now() + limit;
    let count = count.min(awake);
    while Instant::now() < deadline {
        match c.try_tool("list_sandboxes", json!({})).await {
            Ok(l) if l["sandboxes"].as_array().map_or(0, Vec::len) - hibernated(&l) + count <= awake => return,
            _ => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let bin: String = arg("--bin", "target/release/mcp-sandbox".to_string());
    let n: usize = arg("--n", 1000);
    let step: usize = arg("--step", 100).max(1);
    let parallel: usize = arg("--parallel", 4).max(1);
    let pause_after: u64 = arg("--pause-after", 5);
    let probes: usize = arg("--probes", 50);
    let floor_mb: f64 = arg("--min-available-mb", 3072.0);
    let hibernate_after: u64 = arg("--hibernate-after", 0);
    let awake: usize = arg("--awake", 200);
    // Longer than the run: a sandbox deleted at the end of its lifetime
    // would leave the count (and the probes would meet a deleted one). A
    // 10,000-sandbox run takes over two hours on two cores.
    let lifetime: u64 = arg("--lifetime-seconds", 6 * 3600);

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("density.toml");
    let mut text = String::from("# Written by benches/density.rs for one run.\n[limits]\n");
    for (key, value) in load_limits(n + 10, 200) {
        match (key, hibernate_after) {
            ("max_sandboxes_per_tenant" | "max_sandboxes_total", 1..) => text.push_str(&format!("{key} = {awake}\n")),
            _ => text.push_str(&format!("{key} = {value}\n")),
        }
    }
    if hibernate_after > 0 {
        text.push_str(&format!(
            "max_hibernated_per_tenant = {}\nmax_hibernated_total = {}\n",
            n + 10,
            n + 10
        ));
    }
    text.push_str(&format!(
        "\n[sandbox]\nmax_lifetime_seconds = {lifetime}\npause_after_seconds = {pause_after}\n\
         hibernate_after_seconds = {hibernate_after}\n\n[pool]\nmin = 0\nmax = 0\n"
    ));
    std::fs::write(&config, &text).unwrap();
    println!("density: up to {n} sandboxes, {step} a step, {parallel} at a time; server {bin}");
    println!("server configuration file:\n{text}");

    let base_used = used_mb();
    let server = Server::start_configured(&bin, &config, &[]).await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let c = McpClient::http(http.clone(), &server.base).await;
    println!(
        "host memory in use before the server: {base_used:.0} MiB; available {:.0} MiB",
        meminfo_mb("MemAvailable")
    );
    println!();
    println!("| live | asleep | created in s | host MiB in use | MiB per sandbox | server RSS MiB | server fds | loop devices | mounts | firewall rules | list ms | /metrics ms | print(1) p50 ms | p99 ms | errors |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");

    let mut live: Vec<String> = vec![];
    let mut errors: Vec<String> = vec![];
    let mut stopped = None;
    while live.len() < n {
        let count = step.min(n - live.len());
        if hibernate_after > 0 {
            room_for(&c, count, awake, Duration::from_secs(120)).await;
        }
        let t = Instant::now();
        let made: Vec<Result<String, String>> = futures_util::stream::iter(live.len()..live.len() + count)
            .map(|i| make(&c, i))
            .buffer_unordered(parallel)
            .collect()
            .await;
        let took = t.elapsed();
        let failed = made.iter().filter(|m| m.is_err()).count();
        for m in made {
            match m {
                Ok(id) => live.push(id),
                Err(e) => errors.push(e),
            }
        }
        // Let the step's sandboxes go idle and pause (or sleep), as most of
        // a full host's do.
        tokio::time::sleep(Duration::from_secs(pause_after.max(hibernate_after) + 2)).await;
        if hibernate_after > 0 {
            asleep_by_now(&c, live.len(), Duration::from_secs(120)).await;
            tokio::time::sleep(REST_WAIT).await;
        }
        let t = Instant::now();
        let listed = c.try_tool("list_sandboxes", json!({})).await;
        let list_ms = t.elapsed().as_secs_f64() * 1000.0;
        let asleep = match &listed {
            Ok(l) => hibernated(l),
            Err(e) => {
                errors.push(format!("list_sandboxes: {e:?}"));
                0
            }
        };
        let t = Instant::now();
        let scraped = http.get(format!("{}/metrics", server.base)).send().await;
        let metrics_ms = t.elapsed().as_secs_f64() * 1000.0;
        if scraped.is_err() {
            errors.push("/metrics did not answer".into());
        }
        let picked: Vec<String> = {
            let mut rng = rand::rng();
            (0..probes).filter_map(|_| live.choose(&mut rng).cloned()).collect()
        };
        let mut times = vec![];
        for id in &picked {
            match print_one(&c, id).await {
                Ok(d) => times.push(d),
                Err(e) => errors.push(e),
            }
        }
        let s = Series::new("print(1)", times);
        let used = used_mb() - base_used;
        println!(
            "| {} | {asleep} | {:.1} | {:.0} | {:.1} | {:.1} | {} | {} | {} | {} | {:.0} | {:.0} | {:.1} | {:.1} | {} |",
            live.len(),
            took.as_secs_f64(),
            used,
            used / live.len().max(1) as f64,
            server.rss_mb(),
            server.descriptors(),
            loop_devices(),
            mounts(),
            firewall_rules(),
            list_ms,
            metrics_ms,
            s.pct(50.0),
            s.pct(99.0),
            errors.len()
        );
        if failed > 0 {
            stopped = Some(format!("{failed} of {count} creations of the step failed"));
            break;
        }
        let available = meminfo_mb("MemAvailable");
        if available < floor_mb {
            stopped = Some(format!(
                "the host's available memory is down to {available:.0} MiB (floor {floor_mb:.0})"
            ));
            break;
        }
    }
    println!();
    match &stopped {
        Some(why) => println!("stopped at {} live sandboxes: {why}", live.len()),
        None => println!("all {n} sandboxes live"),
    }
    errors.sort();
    errors.dedup();
    for e in errors.iter().take(5) {
        println!("error: {e}");
    }
    let t = Instant::now();
    let c = &c;
    let deleted: Vec<Option<String>> = futures_util::stream::iter(&live)
        .map(|id| async move {
            c.try_tool("delete_sandbox", json!({"sandbox_id": id}))
                .await
                .err()
                .map(|e| format!("{e:?}"))
        })
        .buffer_unordered(8)
        .collect()
        .await;
    let failed = deleted.iter().flatten().count();
    println!(
        "deleted {} sandboxes in {:.1} s ({failed} failed)",
        live.len(),
        t.elapsed().as_secs_f64()
    );
    drop(server);
    match failed {
        0 => std::process::ExitCode::SUCCESS,
        _ => std::process::ExitCode::FAILURE,
    }
}
