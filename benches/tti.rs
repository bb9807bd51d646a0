//! Time to interactive: from sending `create_sandbox` to the answer of the
//! first `execute_terminal_command` `echo ok` in that sandbox, over
//! Streamable HTTP, for `--n` sandboxes each created by an agent of its own
//! (an MCP session opened before its clock starts), in four modes:
//! sequential (one after another), staggered (one started every
//! `--stagger-ms`), burst (all at once), and a second burst after
//! `--second-burst-after-seconds` of quiet. Each mode starts with the warm
//! pool full and ends by deleting every sandbox it made. `--modes` picks
//! some of them, in this order (`--modes burst,second-burst`: the first
//! burst meets a freshly started server, before any demand raised its pool).
//!
//! Per mode it prints p50/p95/p99/max, the success rate, and the ComputeSDK
//! score: per statistic 100 × (1 − value / 10 s), clamped to [0, 100],
//! weighted median 60 %, p95 25 %, p99 15 %, times the success rate; and
//! the split: when `create_sandbox` answered, and how long the first call
//! then took (p50 and p99 of each); and where the host's CPU went while
//! the mode ran (server, containers, this benchmark, the rest) and how much
//! of it per attempt: a burst that keeps every core busy cannot answer its
//! last attempt sooner than that CPU divided by the cores.
//!
//! The server (`--bin`) reads a configuration file written for the run,
//! printed at the start: `[limits]` raised so that one tenant's `--n`
//! concurrent agents are never refused, and `[pool] min = --pool-min`,
//! `max = --pool-max` (the shipped `auto` and 100 by default, `auto`
//! resolved for this host as the server resolves it; `--pool-min 100
//! --pool-max 100` for a pool filled to 100 from the start).
//! Every `MCP_SANDBOX_*` variable of the benchmark's environment reaches the
//! server and overrides the file. The server listens on 127.0.0.1 only.
//!
//! With `--template NAME`, the server also offers template NAME with
//! `--template-packages` (pandas and matplotlib by default), whose pool
//! keeps `--pool-min` too (`pool.max` is raised by as much); each mode then
//! runs a second time creating sandboxes of the template, so that the two
//! rows compare in one run. After the modes it times, in `--imports`
//! fresh sandboxes of each kind, the first `import` of those packages: in
//! one of the template (nothing to install), and in a default one after
//! `install_package_in_sandbox` of each, one after the other.
//!
//! `cargo build --release && cargo bench --bench tti [-- --n 100 --pool-min auto --pool-max 100 --second-burst-after-seconds 60 --modes sequential,staggered,burst,second-burst] [--template data --template-packages pandas,matplotlib --imports 3]`

mod common;

use std::time::{Duration, Instant};

use common::cpu::{CpuMark, CpuSplit};
use common::mcp::{load_limits, pool_full, McpClient, Server, LOAD_SANDBOX_LIFETIME_SECONDS};
use common::{arg, Series};
use futures_util::StreamExt;
use serde_json::json;

/// A run past this counts for nothing in the score.
const SCORE_CEILING_SECONDS: f64 = 10.0;
/// Deletes running at once when a mode cleans up.
const DELETES_AT_ONCE: usize = 4;

/// What one agent's attempt came to.
struct Attempt {
    /// Time to interactive, when the echo answered `ok`.
    tti: Option<Duration>,
    /// Until `create_sandbox` answered, when it did.
    created: Option<Duration>,
    /// The sandbox, when `create_sandbox` answered.
    sandbox: Option<String>,
    error: Option<String>,
}

/// Creates a sandbox (of `template`) and runs `echo ok` in it, timed from
/// the sending of `create_sandbox`; gives up after `deadline`.
async fn attempt(c: &McpClient, name: String, template: Option<&str>, deadline: Duration) -> Attempt {
    let mut sandbox = None;
    let mut created = None;
    let t = Instant::now();
    let work = async {
        let id = c.try_create_from(&name, template).await?;
        created = Some(t.elapsed());
        sandbox = Some(id.clone());
        let ran = c
            .try_tool(
                "execute_terminal_command",
                json!({"sandbox_id": id, "command": "echo ok"}),
            )
            .await
            .map_err(|e| format!("execute_terminal_command: {e:?}"))?;
        match ran["stdout"].as_str() {
            Some("ok\n") => Ok(t.elapsed()),
            _ => Err(format!("echo ok answered {ran}")),
        }
    };
    let outcome = tokio::time::timeout(deadline, work).await;
    let (tti, error) = match outcome {
        Ok(Ok(tti)) => (Some(tti), None),
        Ok(Err(e)) => (None, Some(e)),
        Err(_) => (None, Some(format!("no answer within {deadline:?}"))),
    };
    Attempt {
        tti,
        created,
        sandbox,
        error,
    }
}

/// `n` agents, each with its MCP session open before the mode starts.
async fn agents(http: &reqwest::Client, base: &str, n: usize) -> Vec<McpClient> {
    futures_util::stream::iter(0..n)
        .map(|_| McpClient::http(http.clone(), base))
        .buffer_unordered(16)
        .collect()
        .await
}

#[derive(Clone, Copy)]
enum Mode {
    Sequential,
    /// One agent started every this long.
    Staggered(Duration),
    Burst,
}

/// Runs one mode: `n` agents, none started after `mode_deadline` (those
/// count as failures), each attempt bounded by `deadline`.
async fn run_mode(
    agents: &[McpClient],
    label: &str,
    mode: Mode,
    template: Option<&str>,
    deadline: Duration,
    mode_deadline: Duration,
) -> Vec<Attempt> {
    let start = Instant::now();
    let late = || Attempt {
        tti: None,
        created: None,
        sandbox: None,
        error: Some(format!("not started within the mode's {mode_deadline:?}")),
    };
    let name = |i: usize| format!("tti-{label}-{i}");
    match mode {
        Mode::Sequential => {
            let mut out = vec![];
            for (i, c) in agents.iter().enumerate() {
                out.push(match start.elapsed() < mode_deadline {
                    true => attempt(c, name(i), template, deadline).await,
                    false => late(),
                });
            }
            out
        }
        Mode::Staggered(every) => {
            let runs = agents.iter().enumerate().map(|(i, c)| async move {
                let slot = every * i as u32;
                if slot >= mode_deadline {
                    return late();
                }
                tokio::time::sleep_until((start + slot).into()).await;
                attempt(c, name(i), template, deadline).await
            });
            futures_util::future::join_all(runs).await
        }
        Mode::Burst => {
            let runs = agents
                .iter()
                .enumerate()
                .map(|(i, c)| attempt(c, name(i), template, deadline));
            futures_util::future::join_all(runs).await
        }
    }
}

/// Deletes every sandbox of the (single) tenant: those the attempts named
/// and any whose `create_sandbox` answer never came.
async fn delete_all(c: &McpClient) -> Result<usize, String> {
    let listed = c
        .try_tool("list_sandboxes", json!({}))
        .await
        .map_err(|e| format!("list_sandboxes: {e:?}"))?;
    let ids: Vec<String> = listed["sandboxes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["sandbox_id"].as_str().map(String::from))
        .collect();
    let failed: Vec<String> = futures_util::stream::iter(&ids)
        .map(|id| async move {
            c.try_tool("delete_sandbox", json!({"sandbox_id": id}))
                .await
                .err()
                .map(|e| format!("delete_sandbox {id}: {e:?}"))
        })
        .buffer_unordered(DELETES_AT_ONCE)
        .filter_map(|e| async move { e })
        .collect()
        .await;
    match failed.first() {
        None => Ok(ids.len()),
        Some(e) => Err(format!("{} of {} deletes failed, first: {e}", failed.len(), ids.len())),
    }
}

/// 100 × (1 − value / 10 s), clamped to [0, 100].
fn sub_score(ms: f64) -> f64 {
    (100.0 * (1.0 - ms / 1000.0 / SCORE_CEILING_SECONDS)).clamp(0.0, 100.0)
}

/// The ComputeSDK score of a mode: median 60 %, p95 25 %, p99 15 %, times
/// the success rate (0 when nothing succeeded).
fn score(s: &Series, success: f64) -> f64 {
    if s.n() == 0 {
        return 0.0;
    }
    (0.60 * sub_score(s.pct(50.0)) + 0.25 * sub_score(s.pct(95.0)) + 0.15 * sub_score(s.pct(99.0))) * success
}

/// The configuration the server runs with: limits for `n` concurrent
/// agents (and the sessions of every mode), the pool, a lifetime that ends
/// whatever a killed run left behind, and the template, if any (name and
/// packages), with a pool of its own of the same `min`.
fn config_text(n: usize, pool: (usize, usize), template: Option<(&str, &[String])>) -> String {
    let sandboxes = (2 * n + pool.1).max(200);
    let sessions = (5 * n).max(2000);
    let mut text = String::from(
        "# Written by benches/tti.rs for one run: limits raised so that one tenant's\n\
         # concurrent agents are never refused.\n[limits]\n",
    );
    for (key, value) in load_limits(sandboxes, sessions) {
        text.push_str(&format!("{key} = {value}\n"));
    }
    text.push_str(&format!(
        "\n[sandbox]\nmax_lifetime_seconds = {LOAD_SANDBOX_LIFETIME_SECONDS}\n\n[pool]\nmin = {}\nmax = {}\n",
        pool.0, pool.1
    ));
    if let Some((name, packages)) = template {
        text.push_str(&format!(
            "\n[[templates]]\nname = {name:?}\npackages = {packages:?}\npool_min = {}\n",
            pool.0
        ));
    }
    text
}

/// Seconds from creating `k` fresh sandboxes (of `template`, or default
/// ones given `packages` by `install_package_in_sandbox`, one after the
/// other) to the answer of their first `import` of `packages`.
async fn first_imports(c: &McpClient, template: Option<&str>, packages: &[String], k: usize) -> Series {
    let mut took = vec![];
    for i in 0..k {
        let t = Instant::now();
        let id = c
            .try_create_from(&format!("import-{i}"), template)
            .await
            .expect("create");
        if template.is_none() {
            for p in packages {
                let status = c.install(&id, p).await;
                assert_eq!(status["status"], "success", "{p}: {status}");
            }
        }
        c.py(&id, &format!("import {}", packages.join(", "))).await;
        took.push(t.elapsed());
        c.try_tool("delete_sandbox", json!({"sandbox_id": id}))
            .await
            .expect("delete");
    }
    Series::new("first import", took)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let bin: String = arg("--bin", "target/release/mcp-sandbox".to_string());
    let n: usize = arg("--n", 100);
    let min_arg: String = arg("--pool-min", "auto".to_string());
    let min: usize = match min_arg.as_str() {
        "auto" => sandbox_actors::config::auto_pool_min(sandbox_host::figures::memory_bytes()),
        n => n.parse().expect("--pool-min: a number or auto"),
    };
    let template: String = arg("--template", String::new());
    let template = Some(template.as_str()).filter(|t| !t.is_empty());
    let packages: String = arg("--template-packages", "pandas,matplotlib".to_string());
    let packages: Vec<String> = packages.split(',').map(|p| p.trim().to_string()).collect();
    let imports: usize = arg("--imports", 3);
    // The template's pool keeps `min` as well, beside the default's.
    let max: usize = arg("--pool-max", 100).max(min) + template.map_or(0, |_| min);
    let stagger = Duration::from_millis(arg("--stagger-ms", 200));
    let pause = Duration::from_secs(arg("--second-burst-after-seconds", 60));
    let deadline = Duration::from_secs(arg("--deadline-seconds", 120));
    let mode_deadline = Duration::from_secs(arg("--mode-deadline-seconds", 600));
    let chosen: String = arg("--modes", "sequential,staggered,burst,second-burst".to_string());
    let chosen: Vec<&str> = chosen.split(',').map(str::trim).collect();

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tti.toml");
    let text = config_text(n, (min, max), template.map(|t| (t, packages.as_slice())));
    std::fs::write(&config, &text).unwrap();
    // The flags win over inherited MCP_SANDBOX_POOL_MIN/MAX/SIZE variables
    // (which would otherwise override the file).
    let env = [
        ("MCP_SANDBOX_POOL_MIN", min.to_string()),
        ("MCP_SANDBOX_POOL_MAX", max.to_string()),
    ];
    let passed: Vec<String> = std::env::vars()
        .filter(|(k, _)| {
            k.starts_with("MCP_SANDBOX_") && k != "MCP_SANDBOX_POOL_SIZE" && !env.iter().any(|(flag, _)| flag == k)
        })
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    println!("tti: n = {n}, pool min {min} ({min_arg}) max {max}, server {bin}, listening on 127.0.0.1 only");
    println!("server configuration file ({}):\n{text}", config.display());
    if !passed.is_empty() {
        println!(
            "passed to the server from the environment (over the file): {}",
            passed.join(" ")
        );
    }

    let server = Server::start_configured(&bin, &config, &env).await;
    // Every request ends: an attempt's two calls within its deadline, and
    // the set-up and clean-up calls within the same.
    let http = reqwest::Client::builder().timeout(deadline).build().unwrap();
    let admin = McpClient::http(http.clone(), &server.base).await;
    let all = [
        ("sequential", Mode::Sequential, Duration::ZERO),
        ("staggered", Mode::Staggered(stagger), Duration::ZERO),
        ("burst", Mode::Burst, Duration::ZERO),
        ("second burst", Mode::Burst, pause),
    ];
    let modes: Vec<_> = all
        .into_iter()
        .filter(|(label, ..)| chosen.iter().any(|c| *c == label.replace(' ', "-")))
        .collect();
    // Each mode with the default sandboxes, then (with --template) with
    // the template's.
    let kinds: Vec<Option<&str>> = std::iter::once(None).chain(template.map(Some)).collect();
    let modes: Vec<_> = modes
        .into_iter()
        .flat_map(|(label, mode, quiet)| {
            kinds.iter().enumerate().map(move |(i, kind)| {
                let label = match kind {
                    None => label.to_string(),
                    Some(t) => format!("{label} ({t})"),
                };
                (label, mode, if i == 0 { quiet } else { Duration::ZERO }, *kind)
            })
        })
        .collect();
    let mut rows = vec![];
    let mut problems = vec![];
    for (label, mode, quiet, kind) in modes {
        if !quiet.is_zero() {
            println!("quiet for {quiet:?} before the {label}");
            tokio::time::sleep(quiet).await;
        }
        let filled = pool_full(&http, &server.base, Duration::from_secs(120)).await;
        let clients = agents(&http, &server.base, n).await;
        let t = Instant::now();
        let before = CpuMark::now(server.pid());
        let tag: String = label.chars().filter(|c| c.is_ascii_alphanumeric()).collect();
        let attempts = run_mode(&clients, &tag, mode, kind, deadline, mode_deadline).await;
        let cpu = CpuSplit::since(&before, &CpuMark::now(server.pid()));
        let took = t.elapsed();
        let ok: Vec<Duration> = attempts.iter().filter_map(|a| a.tti).collect();
        let created = Series::new("created", attempts.iter().filter_map(|a| a.created).collect());
        let first_call = Series::new(
            "first call",
            attempts.iter().filter_map(|a| Some(a.tti? - a.created?)).collect(),
        );
        let made = attempts.iter().filter(|a| a.sandbox.is_some()).count();
        let mut errors: Vec<&str> = attempts.iter().filter_map(|a| a.error.as_deref()).collect();
        errors.sort();
        errors.dedup();
        let deleted = delete_all(&admin).await;
        println!(
            "{label}: {} of {n} interactive ({made} created) in {:.1} s, pool full after {:.1} s; deleted {}",
            ok.len(),
            took.as_secs_f64(),
            filled.as_secs_f64(),
            match &deleted {
                Ok(k) => format!("{k}"),
                Err(e) => e.clone(),
            }
        );
        println!(
            "  {label}: create_sandbox answered p50 {:.0} / p99 {:.0} ms; the first call then took p50 {:.0} / p99 {:.0} ms",
            created.pct(50.0),
            created.pct(99.0),
            first_call.pct(50.0),
            first_call.pct(99.0)
        );
        println!("  {label}: {}", cpu.line(n, "attempt"));
        for e in errors.iter().take(3) {
            println!("  {label} error: {e}");
        }
        if let Err(e) = deleted {
            problems.push(e);
        }
        rows.push((label.clone(), Series::new(&label, ok), n));
    }
    let first_import = match template {
        Some(t) if imports > 0 => {
            let import = packages.join(", ");
            println!("first `import {import}` in {imports} fresh sandboxes of each kind, one after the other");
            let templated = first_imports(&admin, Some(t), &packages, imports).await;
            let installed = first_imports(&admin, None, &packages, imports).await;
            Some((import, templated, installed))
        }
        _ => None,
    };
    let left = delete_all(&admin).await;
    drop(admin);
    drop(server);

    println!();
    println!("time to interactive (create_sandbox sent → first `echo ok` answered), ms; pool min {min} max {max}");
    println!("| mode | n | success | p50 | p95 | p99 | max | score |");
    println!("|---|---|---|---|---|---|---|---|");
    for (label, s, n) in &rows {
        let success = s.n() as f64 / *n as f64;
        println!(
            "| {label} | {n} | {:.1} % | {:.0} | {:.0} | {:.0} | {:.0} | {:.1} |",
            success * 100.0,
            s.pct(50.0),
            s.pct(95.0),
            s.pct(99.0),
            s.pct(100.0),
            score(s, success)
        );
    }
    if let (Some((import, templated, installed)), Some(t)) = (&first_import, template) {
        println!();
        println!("create_sandbox sent → first `import {import}` answered, s");
        println!("| sandbox | n | p50 | max |");
        println!("|---|---|---|---|");
        for (what, s) in [
            (format!("template {t}"), templated),
            (
                "default, install_package_in_sandbox of each first".to_string(),
                installed,
            ),
        ] {
            println!(
                "| {what} | {} | {:.2} | {:.2} |",
                s.n(),
                s.pct(50.0) / 1000.0,
                s.pct(100.0) / 1000.0
            );
        }
        println!(
            "saved by the template: {:.1} s at the median",
            (installed.pct(50.0) - templated.pct(50.0)) / 1000.0
        );
    }
    match left {
        Ok(0) => {}
        Ok(k) => println!("{k} sandboxes whose creation answered late were deleted at the end"),
        Err(e) => problems.push(e),
    }
    for p in &problems {
        println!("clean-up: {p}");
    }
    match problems.is_empty() {
        true => std::process::ExitCode::SUCCESS,
        false => std::process::ExitCode::FAILURE,
    }
}
