//! The fault-injection soak: the release server with authentication and
//! several keys, many sandboxes driven over `/mcp` and `/sse` with a mixed
//! workload (Python writing files of known checksums, shell commands,
//! installs, uploads, artifact downloads, deletes and creates), and faults
//! injected on a seeded schedule: `docker kill` and `docker pause` of
//! sandbox containers, SIGKILL of the agent and of the Python worker inside
//! a sandbox, memory and fork bombs, output floods, a full `/tmp`, SIGKILL of
//! the server followed by a restart, and a restart of the Docker engine.
//!
//! Checked throughout and at the end: every acknowledged write is intact
//! unless its sandbox was deleted on purpose; a sandbox asleep on disk
//! through the engine's restart wakes with its variables and files; every call is answered within
//! its deadline with a result or a tool error (no hang, no protocol error,
//! no HTTP 5xx but 503 while the engine is down); `/health` answers within
//! 1 s whenever the server runs; after the final deletes nothing of the
//! server is left; RSS and descriptors return to their baseline. Prints one
//! table and exits non-zero when an invariant fails.
//!
//! `cargo build --release && cargo bench --bench soak -- --minutes 2 --seed 1`
//! (`--sandboxes N`, `--faults kill,pause,agent,worker,memory,fork,flood,tmp,server,engine`,
//! `--gap-seconds 4-9` before each fault; `--rounds N` ends the run once
//! every chosen fault was injected N times, and fails it when `--minutes`
//! pass first)

mod common;

use std::collections::{BTreeMap, HashMap};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::arg;
use common::mcp::{CallError, McpClient, Server};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::sync::RwLock;

/// Longest a call may take: the exec timeout, the watchdog's slack and a
/// container's recovery, with room for a loaded machine.
const CALL_DEADLINE: Duration = Duration::from_secs(120);
const EXEC_TIMEOUT: u64 = 10;
const KEYS: [&str; 3] = [
    "soak-tenant-a-0123456789",
    "soak-tenant-b-0123456789",
    "soak-tenant-c-0123456789",
];
const FAULTS: [&str; 10] = [
    "kill", "pause", "agent", "worker", "memory", "fork", "flood", "tmp", "server", "engine",
];

/// What the run saw, shared by the workers, the injector and the prober.
#[derive(Default)]
struct Ledger {
    calls: BTreeMap<String, u64>,
    violations: Vec<String>,
    /// (sandbox, path) → sha256 of an acknowledged write.
    writes: HashMap<(String, String), String>,
    acknowledged: u64,
    /// Faults by kind: injected, recovered, recovery times.
    faults: BTreeMap<&'static str, FaultStats>,
    health_worst: Duration,
    /// Sandboxes whose delete was asked for, answered or not: they owe nothing.
    deleted: std::collections::HashSet<String>,
    /// RSS and descriptors of the current server process once it settled.
    baseline: (f64, usize),
}

#[derive(Default)]
struct FaultStats {
    injected: u64,
    recovered: u64,
    times: Vec<Duration>,
}

impl Ledger {
    fn count(&mut self, outcome: &str) {
        *self.calls.entry(outcome.to_string()).or_default() += 1;
    }
}

/// A call that did not work: whether the sandbox is gone (not found, or
/// ended by its deletion) and whether any answer came at all.
#[derive(Debug, Clone, Copy)]
struct Failure {
    gone: bool,
    answered: bool,
}

/// What became of one step of a worker.
enum Step {
    Done,
    /// Its sandbox no longer exists.
    Gone,
    /// No answer: the session may be gone with a restarted server.
    NoAnswer,
}

fn step<T>(r: &Result<T, Failure>) -> Step {
    match r {
        Err(f) if f.gone => Step::Gone,
        Err(f) if !f.answered => Step::NoAnswer,
        _ => Step::Done,
    }
}

/// Shared state of one soak run.
struct Soak {
    server: RwLock<Server>,
    ledger: Mutex<Ledger>,
    /// The server is being killed and restarted: connection failures are expected.
    server_down: AtomicBool,
    /// The engine is being restarted, or came back less than a minute ago:
    /// 503s are expected.
    engine_down: AtomicBool,
    engine_back: Mutex<Option<Instant>>,
    stop: AtomicBool,
    base: String,
}

fn http_client(key: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("authorization", format!("Bearer {key}").parse().unwrap());
    reqwest::Client::builder()
        .default_headers(headers)
        .tcp_nodelay(true)
        .build()
        .unwrap()
}

impl Soak {
    fn engine_unsettled(&self) -> bool {
        self.engine_down.load(Ordering::SeqCst)
            || self
                .engine_back
                .lock()
                .unwrap()
                .is_some_and(|t| t.elapsed() < Duration::from_secs(60))
    }

    /// Files the outcome of a call; returns its value when it worked.
    fn file(
        &self,
        tool: &str,
        outcome: Result<Result<Value, CallError>, tokio::time::error::Elapsed>,
    ) -> Result<Value, Failure> {
        let answered = Failure {
            gone: false,
            answered: true,
        };
        let unanswered = Failure {
            gone: false,
            answered: false,
        };
        let gone = Failure {
            gone: true,
            answered: true,
        };
        let mut l = self.ledger.lock().unwrap();
        match outcome {
            Err(_) => {
                l.count("hang");
                l.violations
                    .push(format!("{tool} was not answered within {CALL_DEADLINE:?}"));
                Err(unanswered)
            }
            Ok(Ok(v)) => {
                l.count("ok");
                Ok(v)
            }
            Ok(Err(CallError::Tool(m))) => {
                // A tool error names what happened; one that does not, or
                // that reports a failure inside the server, is a defect.
                if m.trim().is_empty() || m.contains("internal error") {
                    l.violations.push(format!("{tool}: tool error {m:?}"));
                }
                l.count("tool error");
                let vanished = m.contains("not found") || m.contains("so this call was ended");
                Err(if vanished { gone } else { answered })
            }
            Ok(Err(CallError::Protocol(m))) => {
                l.count("protocol error");
                l.violations.push(format!("{tool}: protocol error {m}"));
                Err(answered)
            }
            Ok(Err(CallError::Status(code))) => {
                // MCP calls: 404 is a session the restarted server no longer
                // knows (the client opens a new one). REST calls and
                // artifacts: 502 is the sandbox's failure, named in the body.
                // A REST call's 404 is a sandbox that is gone: its worker
                // judges whether that was on purpose.
                let mcp = !matches!(tool, "upload" | "artifact");
                let expected = match code {
                    503 => self.engine_unsettled(),
                    404 => true,
                    502 => !mcp,
                    429 => true,
                    _ => code < 500,
                };
                l.count(&format!("http {code}"));
                if !expected {
                    l.violations.push(format!("{tool}: HTTP {code}"));
                }
                Err(if code == 404 && !mcp {
                    gone
                } else {
                    Failure {
                        gone: false,
                        answered: code != 404,
                    }
                })
            }
            Ok(Err(CallError::Transport(e))) => {
                if self.server_down.load(Ordering::SeqCst) {
                    l.count("refused while the server restarted");
                } else {
                    l.count("connection lost");
                    l.violations
                        .push(format!("{tool}: no answer while the server ran ({e})"));
                }
                Err(unanswered)
            }
        }
    }

    /// A session for `key`, retried while the server restarts (a minute
    /// at most; workers give up at once when the run is over).
    async fn connect(&self, key: &str, sse: bool) -> Option<McpClient> {
        for _ in 0..240 {
            let c = match sse {
                true => McpClient::try_sse(http_client(key), &self.base).await,
                false => McpClient::try_http(http_client(key), &self.base).await,
            };
            if let Ok(c) = c {
                return Some(c);
            }
            if self.stop.load(Ordering::SeqCst) && !self.server_down.load(Ordering::SeqCst) {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        None
    }
}

/// A sandbox a worker drives, and the files it wrote there.
struct Driven {
    id: String,
    files: Vec<String>,
}

/// One worker: one key, one transport, one sandbox at a time.
async fn worker(soak: Arc<Soak>, n: usize, seed: u64) {
    let key = KEYS[n % KEYS.len()];
    let sse = n % 2 == 1;
    let mut rng = StdRng::seed_from_u64(seed ^ (n as u64).wrapping_mul(0x9e37_79b9));
    let Some(mut c) = soak.connect(key, sse).await else {
        return;
    };
    let mut sandbox: Option<Driven> = None;
    let mut seq = 0u64;
    while !soak.stop.load(Ordering::SeqCst) {
        let Some(sb) = sandbox.as_mut() else {
            let created = call(&soak, &c, "create_sandbox", json!({"name": format!("soak-{n}")})).await;
            match created.ok().and_then(|v| v["sandbox_id"].as_str().map(String::from)) {
                Some(id) => sandbox = Some(Driven { id, files: vec![] }),
                None => {
                    reconnect(&soak, &mut c, key, sse).await;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
            continue;
        };
        seq += 1;
        let id = sb.id.clone();
        let shell = json!({"sandbox_id": id, "command": "ls /app/results | wc -l && echo done", "timeout_seconds": EXEC_TIMEOUT});
        let outcome = match rng.random_range(0..100u32) {
            0..=44 => write_file(&soak, &c, sb, &mut rng, seq).await,
            45..=64 => step(&call(&soak, &c, "execute_terminal_command", shell).await),
            65..=74 => download(&soak, sb, key, &c).await,
            75..=84 => upload(&soak, sb, key, &mut rng, seq).await,
            85..=89 => step(
                &call(
                    &soak,
                    &c,
                    "install_package_in_sandbox",
                    json!({"sandbox_id": id, "package_name": "six"}),
                )
                .await,
            ),
            90..=95 => step(&call(&soak, &c, "list_sandboxes", json!({})).await),
            _ => {
                // Deleted on purpose: its files are no longer owed, even if
                // the answer is lost (a restarted server finishes the delete).
                soak.ledger.lock().unwrap().deleted.insert(id.clone());
                match step(&call(&soak, &c, "delete_sandbox", json!({"sandbox_id": id})).await) {
                    Step::Done => Step::Gone,
                    other => other,
                }
            }
        };
        match outcome {
            Step::Done => {}
            Step::NoAnswer => reconnect(&soak, &mut c, key, sse).await,
            Step::Gone => {
                let mut l = soak.ledger.lock().unwrap();
                if l.deleted.contains(&id) {
                    l.writes.retain(|(s, _), _| *s != id);
                } else {
                    l.violations.push(format!("sandbox {id} vanished while in use"));
                }
                sandbox = None;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..200))).await;
    }
}

/// A new session when the old one is gone (its server was killed).
async fn reconnect(soak: &Soak, c: &mut McpClient, key: &str, sse: bool) {
    if soak.server_down.load(Ordering::SeqCst)
        || matches!(
            c.try_tool("list_sandboxes", json!({})).await,
            Err(CallError::Transport(_) | CallError::Status(404))
        )
    {
        if let Some(fresh) = soak.connect(key, sse).await {
            *c = fresh;
        }
    }
}

async fn call(soak: &Soak, c: &McpClient, tool: &str, args: Value) -> Result<Value, Failure> {
    let outcome = tokio::time::timeout(CALL_DEADLINE, c.try_tool(tool, args)).await;
    soak.file(tool, outcome)
}

fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

async fn write_file(soak: &Soak, c: &McpClient, sb: &mut Driven, rng: &mut StdRng, seq: u64) -> Step {
    let size: usize = rng.random_range(1..64 * 1024);
    let seed: u64 = rng.random();
    let path = format!("w{seq}.bin");
    let code = format!(
        "import hashlib, random\ndata = random.Random({seed}).randbytes({size})\nopen('{path}', 'wb').write(data)\nprint(hashlib.sha256(data).hexdigest())"
    );
    let args = json!({"sandbox_id": sb.id, "code": code, "timeout_seconds": EXEC_TIMEOUT});
    let ran = call(soak, c, "execute_python_code", args).await;
    if let Ok(v) = &ran {
        let digest = v["stdout"].as_str().unwrap_or("").trim().to_string();
        if v["exit_code"] == 0 && digest.len() == 64 {
            let mut l = soak.ledger.lock().unwrap();
            l.writes.insert((sb.id.clone(), path.clone()), digest);
            l.acknowledged += 1;
            sb.files.push(path);
        }
    }
    step(&ran)
}

/// Fetches an acknowledged file through its artifact link.
async fn download(soak: &Soak, sb: &Driven, key: &str, c: &McpClient) -> Step {
    let Some(path) = sb.files.last() else { return Step::Done };
    let args =
        json!({"sandbox_id": sb.id, "code": format!("open('{path}', 'ab').close()"), "timeout_seconds": EXEC_TIMEOUT});
    let v = match call(soak, c, "execute_python_code", args).await {
        Ok(v) => v,
        failed => return step(&failed),
    };
    let Some(link) = v["file_links"][0].as_str() else {
        return Step::Done;
    };
    let got = tokio::time::timeout(CALL_DEADLINE, http_client(key).get(link).send()).await;
    let body = match got {
        Ok(Ok(r)) if r.status().is_success() => r.bytes().await.ok(),
        Ok(Ok(r)) => return step(&soak.file("artifact", Ok(Err(CallError::Status(r.status().as_u16()))))),
        Ok(Err(e)) => return step(&soak.file("artifact", Ok(Err(CallError::Transport(e.to_string()))))),
        Err(e) => return step(&soak.file("artifact", Err(e))),
    };
    let mut l = soak.ledger.lock().unwrap();
    let want = l.writes.get(&(sb.id.clone(), path.clone())).cloned();
    match (body, want) {
        (Some(b), Some(want)) if sha256_hex(&b) != want => {
            l.violations
                .push(format!("{}/{path} served other bytes than were written", sb.id));
        }
        _ => l.count("ok"),
    }
    Step::Done
}

/// Sends bytes through the REST API; acknowledged when it answers 200.
async fn upload(soak: &Soak, sb: &mut Driven, key: &str, rng: &mut StdRng, seq: u64) -> Step {
    let size: usize = rng.random_range(1..32 * 1024);
    let data: Vec<u8> = (0..size).map(|_| rng.random()).collect();
    let name = format!("u{seq}.bin");
    let url = format!("{}/api/sandboxes/{}/files?name={name}", soak.base, sb.id);
    let sent = tokio::time::timeout(CALL_DEADLINE, http_client(key).post(url).body(data.clone()).send()).await;
    match sent {
        Ok(Ok(r)) if r.status().is_success() => {
            let mut l = soak.ledger.lock().unwrap();
            l.count("ok");
            l.writes.insert((sb.id.clone(), name.clone()), sha256_hex(&data));
            l.acknowledged += 1;
            sb.files.push(name);
            Step::Done
        }
        Ok(Ok(r)) => step(&soak.file("upload", Ok(Err(CallError::Status(r.status().as_u16()))))),
        Ok(Err(e)) => step(&soak.file("upload", Ok(Err(CallError::Transport(e.to_string()))))),
        Err(e) => step(&soak.file("upload", Err(e))),
    }
}

/// Probes `/health` every 250 ms: whenever the server runs, it answers
/// within 1 s (503 with a reason while Docker is down).
async fn prober(soak: Arc<Soak>) {
    let http = reqwest::Client::new();
    while !soak.stop.load(Ordering::SeqCst) {
        let started = Instant::now();
        let answer =
            tokio::time::timeout(Duration::from_secs(5), http.get(format!("{}/health", soak.base)).send()).await;
        let took = started.elapsed();
        if !soak.server_down.load(Ordering::SeqCst) {
            let mut l = soak.ledger.lock().unwrap();
            l.health_worst = l.health_worst.max(took);
            match answer {
                Ok(Ok(r)) if r.status().is_success() || r.status().as_u16() == 503 => {
                    if took > Duration::from_secs(1) {
                        l.violations.push(format!("/health took {took:?}"));
                    }
                }
                Ok(Ok(r)) => l.violations.push(format!("/health answered {}", r.status())),
                _ => l.violations.push("/health did not answer".into()),
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Longest any command the soak runs may take: `docker exec` into a
/// container the server pauses meanwhile never returns by itself.
const COMMAND_DEADLINE: Duration = Duration::from_secs(30);

/// Runs a command off the runtime's threads (a blocked worker would stall
/// every task queued behind it), killed past [`COMMAND_DEADLINE`]; its
/// stdout when it exited with success.
async fn run(program: &str, args: &[&str]) -> Option<String> {
    let out = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(COMMAND_DEADLINE, out).await {
        Ok(Ok(o)) if o.status.success() => Some(String::from_utf8_lossy(&o.stdout).into_owned()),
        _ => None,
    }
}

async fn docker(args: &[&str]) -> String {
    run("docker", args).await.unwrap_or_default()
}

/// Running sandbox containers of this server, paused ones left out: a
/// `docker exec` into a frozen container never returns, and the engine then
/// cannot remove the container until it is thawed.
async fn sandbox_containers(server_id: &str) -> Vec<String> {
    docker(&[
        "ps",
        "-q",
        "--filter",
        "status=running",
        "--filter",
        &format!("label=io.mcp-sandbox.server={server_id}"),
        "--filter",
        "label=io.mcp-sandbox.sandbox",
    ])
    .await
    .split_whitespace()
    .map(String::from)
    .collect()
}

/// SIGKILLs the sandbox's agent, or its Python worker, from inside.
async fn kill_inside(container: &str, worker: bool) {
    let code = format!(
        "import os, signal\nfor p in os.listdir('/proc'):\n    if not p.isdigit() or int(p) == os.getpid():\n        continue\n    try:\n        argv = open(f'/proc/{{p}}/cmdline', 'rb').read().split(bytes(1))\n    except OSError:\n        continue\n    if any(a.startswith(b'/opt/mcp-agent/agent.py') for a in argv) and ((b'--worker' in argv) == {}):\n        os.kill(int(p), signal.SIGKILL)",
        if worker { "True" } else { "False" }
    );
    docker(&["exec", container, "/usr/bin/python3", "-c", &code]).await;
}

/// Stops the Docker engine and starts it again as the project's scripts do
/// (detached by `setsid -f`, so no exited engine lingers as the soak's child).
async fn restart_engine() {
    let _ = run("pkill", &["-x", "dockerd"]).await;
    for _ in 0..60 {
        if run("pgrep", &["-x", "dockerd"]).await.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let _ = std::fs::remove_file("/var/run/docker.pid");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open("/var/log/dockerd.log")
        .unwrap();
    let _ = tokio::process::Command::new("setsid")
        .args(["-f", "dockerd"])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .stdin(Stdio::null())
        .status()
        .await;
    for _ in 0..120 {
        if run("docker", &["info"]).await.is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("dockerd did not come back");
}

/// When faults come: the pause before each, and how many rounds to inject
/// (each round every chosen kind once, in a seeded order); `None` injects
/// rounds until the run's minutes are up.
struct Schedule {
    faults: Vec<&'static str>,
    gap_ms: std::ops::Range<u64>,
    rounds: Option<u64>,
}

/// Injects one fault after another on the seeded schedule, and times how
/// long the server takes to serve a probe sandbox again after each. Faults
/// come in rounds, so that every kind is injected once before any is
/// injected twice. Returns when the schedule's rounds are over.
async fn injector(soak: Arc<Soak>, seed: u64, schedule: Schedule, server_id: String) {
    let mut rng = StdRng::seed_from_u64(seed);
    let Some(c) = soak.connect(KEYS[0], false).await else {
        return;
    };
    let mut c = c;
    let mut probe: Option<String> = None;
    let mut round: Vec<&'static str> = Vec::new();
    let mut rounds_done = 0;
    let mut sleepers = Vec::new();
    while !soak.stop.load(Ordering::SeqCst) {
        if round.is_empty() {
            if schedule.rounds.is_some_and(|n| rounds_done == n) {
                break;
            }
            round = schedule.faults.clone();
            round.shuffle(&mut rng);
            rounds_done += 1;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(schedule.gap_ms.clone()))).await;
        if soak.stop.load(Ordering::SeqCst) {
            break;
        }
        if probe.is_none() {
            probe = call(&soak, &c, "create_sandbox", json!({"name": "probe"}))
                .await
                .ok()
                .and_then(|v| v["sandbox_id"].as_str().map(String::from));
        }
        let Some(probe_id) = probe.clone() else {
            reconnect(&soak, &mut c, KEYS[0], false).await;
            continue;
        };
        let fault = round.pop().expect("a round in progress");
        let containers = sandbox_containers(&server_id).await;
        let victim = containers.get(rng.random_range(0..containers.len().max(1))).cloned();
        let started = Instant::now();
        let bomb = |code: &str| json!({"sandbox_id": probe_id, "code": code, "timeout_seconds": EXEC_TIMEOUT});
        match fault {
            "kill" | "pause" | "agent" | "worker" => {
                if let Some(v) = victim {
                    match fault {
                        "kill" | "pause" => drop(docker(&[fault, &v]).await),
                        _ => kill_inside(&v, fault == "worker").await,
                    }
                }
            }
            "memory" => drop(call(&soak, &c, "execute_python_code", bomb("x = bytearray(4 * 1024 ** 3)")).await),
            "fork" => drop(
                call(
                    &soak,
                    &c,
                    "execute_terminal_command",
                    json!({"sandbox_id": probe_id, "command": "f() { f | f & }; f", "timeout_seconds": 5}),
                )
                .await,
            ),
            "flood" => drop(
                call(
                    &soak,
                    &c,
                    "execute_python_code",
                    bomb("import sys\nfor _ in range(200):\n    sys.stdout.write('x' * 1_000_000)"),
                )
                .await,
            ),
            "tmp" => {
                let _ = call(&soak, &c, "execute_terminal_command", json!({"sandbox_id": probe_id, "command": "dd if=/dev/zero of=/tmp/fill bs=1M count=2000 2>&1 | tail -1", "timeout_seconds": 30})).await;
                let _ = call(
                    &soak,
                    &c,
                    "execute_terminal_command",
                    json!({"sandbox_id": probe_id, "command": "echo still answering; rm -f /tmp/fill"}),
                )
                .await;
            }
            "server" => {
                soak.server_down.store(true, Ordering::SeqCst);
                let up = soak
                    .server
                    .write()
                    .await
                    .kill_and_restart(Duration::from_secs(120))
                    .await;
                soak.server_down.store(false, Ordering::SeqCst);
                if !up {
                    soak.ledger
                        .lock()
                        .unwrap()
                        .violations
                        .push("the server did not come back after a SIGKILL".into());
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
                let settled = rss_and_fds(&*soak.server.read().await);
                soak.ledger.lock().unwrap().baseline = settled;
                reconnect(&soak, &mut c, KEYS[0], false).await;
            }
            "engine" => {
                // A sandbox asleep on disk outlives the engine's restart.
                let sleeper = put_to_sleep(&soak, &c, rng.random()).await;
                soak.engine_down.store(true, Ordering::SeqCst);
                restart_engine().await;
                sleepers.extend(sleeper);
            }
            _ => unreachable!(),
        }
        // Recovered when the probe sandbox runs code again.
        let mut recovered = false;
        // What the probe last got, for the report when it never recovers.
        let mut last = String::new();
        // The check runs to its end even when the run stops meanwhile: a
        // fault injected last is judged like any other.
        let deadline = Instant::now() + CALL_DEADLINE;
        while Instant::now() < deadline {
            let ran = tokio::time::timeout(
                CALL_DEADLINE,
                c.try_tool(
                    "execute_python_code",
                    json!({"sandbox_id": probe_id, "code": "print(1)"}),
                ),
            )
            .await;
            if matches!(&ran, Ok(Ok(v)) if v["stdout"] == "1\n") {
                recovered = true;
                break;
            }
            last = match &ran {
                Ok(Ok(v)) => format!(
                    "exit {} stderr {:?}",
                    v["exit_code"],
                    v["stderr"].as_str().unwrap_or("")
                ),
                Ok(Err(e)) => format!("{e:?}"),
                Err(_) => "no answer".into(),
            };
            last.truncate(300);
            if matches!(ran, Ok(Err(CallError::Transport(_) | CallError::Status(404)))) {
                reconnect(&soak, &mut c, KEYS[0], false).await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if soak.engine_down.swap(false, Ordering::SeqCst) {
            *soak.engine_back.lock().unwrap() = Some(Instant::now());
        }
        for sleeper in sleepers.drain(..) {
            wakes_intact(&soak, &c, sleeper).await;
        }
        let mut l = soak.ledger.lock().unwrap();
        let stats = l.faults.entry(fault).or_default();
        stats.injected += 1;
        if recovered {
            stats.recovered += 1;
            stats.times.push(started.elapsed());
        } else {
            l.violations.push(format!(
                "the server did not serve again within {CALL_DEADLINE:?} after a {fault} fault (last: {last})"
            ));
        }
    }
}

/// A sandbox of its own, with a variable and a file of `secret`, put to
/// sleep on disk; none (and a violation) when that fails.
async fn put_to_sleep(soak: &Soak, c: &McpClient, secret: u64) -> Option<(String, u64)> {
    let made = async {
        let sid = call(soak, c, "create_sandbox", json!({"name": "sleeper"})).await.ok()?["sandbox_id"]
            .as_str()?
            .to_string();
        let code = format!("secret = {secret}\nopen('secret.txt', 'w').write(str(secret))");
        call(soak, c, "execute_python_code", json!({"sandbox_id": sid, "code": code}))
            .await
            .ok()?;
        let slept = call(soak, c, "hibernate_sandbox", json!({"sandbox_id": sid}))
            .await
            .ok()?;
        (slept["python"] == "carried").then_some((sid, secret))
    };
    let made = made.await;
    if made.is_none() {
        soak.ledger
            .lock()
            .unwrap()
            .violations
            .push("could not put a sandbox to sleep before a fault".into());
    }
    made
}

/// Wakes a sandbox [`put_to_sleep`] before a fault: its variable and its
/// file must be back. Then deletes it.
async fn wakes_intact(soak: &Soak, c: &McpClient, (sid, secret): (String, u64)) {
    let code = "print(secret, open('secret.txt').read())";
    let ran = call(soak, c, "execute_python_code", json!({"sandbox_id": sid, "code": code})).await;
    let intact = matches!(&ran, Ok(v) if v["stdout"] == format!("{secret} {secret}\n")
        && v["notice"].as_str().is_some_and(|n| n.contains("woke from hibernation")));
    if !intact {
        soak.ledger
            .lock()
            .unwrap()
            .violations
            .push(format!("a sandbox asleep through a fault did not wake intact: {ran:?}"));
    }
    let _ = call(soak, c, "delete_sandbox", json!({"sandbox_id": sid})).await;
}

/// Reads every acknowledged file of every sandbox back and checks it.
async fn verify_writes(soak: &Soak) -> (u64, Vec<String>) {
    let writes = soak.ledger.lock().unwrap().writes.clone();
    let mut by_sandbox: HashMap<String, Vec<(String, String)>> = HashMap::new();
    for ((sb, path), sha) in writes {
        by_sandbox.entry(sb).or_default().push((path, sha));
    }
    let mut lost = 0;
    let mut problems = vec![];
    for (i, key) in KEYS.iter().enumerate() {
        let Some(listed) = list(soak, key).await else {
            problems.push(format!("tenant {i}'s sandboxes could not be listed"));
            if let Ok(seconds) = std::env::var("SOAK_HOLD_ON_FAILURE").map(|s| s.parse().unwrap_or(300)) {
                println!(
                    "holding the server (pid {}) for {seconds} s",
                    soak.server.read().await.pid()
                );
                tokio::time::sleep(Duration::from_secs(seconds)).await;
            }
            continue;
        };
        let Some(c) = soak.connect(key, false).await else {
            continue;
        };
        for s in listed {
            let id = s["sandbox_id"].as_str().unwrap_or_default().to_string();
            let Some(files) = by_sandbox.remove(&id) else { continue };
            let code = "import hashlib, json, os\nprint(json.dumps({f: hashlib.sha256(open(f, 'rb').read()).hexdigest() for f in os.listdir('.') if f.endswith('.bin')}))";
            let mut got = None;
            for _ in 0..20 {
                let asked = c.try_tool(
                    "execute_python_code",
                    json!({"sandbox_id": id, "code": code, "timeout_seconds": 60}),
                );
                if let Ok(Ok(v)) = tokio::time::timeout(CALL_DEADLINE, asked).await {
                    got = serde_json::from_str::<HashMap<String, String>>(v["stdout"].as_str().unwrap_or("")).ok();
                    if got.is_some() {
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            let got = got.unwrap_or_default();
            for (path, sha) in files {
                if got.get(&path) != Some(&sha) {
                    lost += 1;
                    problems.push(format!("{id}/{path} (tenant {i})"));
                }
            }
        }
    }
    // Sandboxes that no longer exist but were never deleted on purpose.
    let deleted = soak.ledger.lock().unwrap().deleted.clone();
    for (id, files) in by_sandbox.into_iter().filter(|(id, _)| !deleted.contains(id)) {
        lost += files.len() as u64;
        problems.push(format!("sandbox {id} vanished with {} acknowledged files", files.len()));
    }
    (lost, problems)
}

/// A tenant's sandboxes, asked until the server answers (a minute at most).
async fn list(soak: &Soak, key: &str) -> Option<Vec<Value>> {
    for _ in 0..60 {
        if let Some(c) = soak.connect(key, false).await {
            if let Ok(Ok(listed)) = tokio::time::timeout(CALL_DEADLINE, c.try_tool("list_sandboxes", json!({}))).await {
                return listed["sandboxes"].as_array().cloned();
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    None
}

/// Deletes every sandbox of every key.
async fn delete_everything(soak: &Soak) {
    for key in KEYS {
        let Some(c) = soak.connect(key, false).await else {
            continue;
        };
        for s in list(soak, key).await.unwrap_or_default() {
            let deleted = tokio::time::timeout(
                CALL_DEADLINE,
                c.try_tool("delete_sandbox", json!({"sandbox_id": s["sandbox_id"]})),
            )
            .await;
            if !matches!(deleted, Ok(Ok(_))) {
                soak.ledger
                    .lock()
                    .unwrap()
                    .violations
                    .push(format!("delete of {} failed: {deleted:?}", s["sandbox_id"]));
            }
        }
    }
}

/// What of the server is left on the machine after its final stop.
async fn orphans(server_id: &str, root: &std::path::Path) -> Vec<String> {
    let label = format!("label=io.mcp-sandbox.server={server_id}");
    let mut left = vec![];
    for (what, args) in [
        ("container", vec!["ps", "-aq"]),
        ("volume", vec!["volume", "ls", "-q"]),
        ("network", vec!["network", "ls", "-q"]),
    ] {
        let mut args = args;
        args.extend(["--filter", &label]);
        for id in docker(&args).await.split_whitespace() {
            left.push(format!("{what} {id}"));
        }
    }
    let tag = format!("mcp-sandbox:{server_id}");
    for (table, chain) in [
        ("filter", "INPUT"),
        ("filter", "DOCKER-USER"),
        ("raw", "PREROUTING"),
        ("mangle", "FORWARD"),
    ] {
        let rules = run("iptables", &["-w", "-t", table, "-S", chain])
            .await
            .unwrap_or_default();
        left.extend(
            rules
                .lines()
                .filter(|l| l.contains(&tag))
                .map(|l| format!("firewall rule {l}")),
        );
    }
    for dir in ["results", "state/agents"] {
        if let Ok(entries) = std::fs::read_dir(root.join(dir)) {
            left.extend(
                entries
                    .flatten()
                    .map(|e| format!("folder {dir}/{}", e.file_name().to_string_lossy())),
            );
        }
    }
    left
}

fn rss_and_fds(server: &Server) -> (f64, usize) {
    (server.rss_mb(), server.descriptors())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let minutes: f64 = arg("--minutes", 2.0);
    let seed: u64 = arg("--seed", 1);
    let sandboxes: usize = arg("--sandboxes", 6);
    let bin: String = arg("--bin", "target/release/mcp-sandbox".to_string());
    let faults: String = arg("--faults", FAULTS.join(","));
    let faults: Vec<&'static str> = FAULTS
        .iter()
        .copied()
        .filter(|f| faults.split(',').any(|g| g == *f))
        .collect();
    let rounds: u64 = arg("--rounds", 0);
    let gap: String = arg("--gap-seconds", "4-9".to_string());
    let Some((low, high)) = gap
        .split_once('-')
        .and_then(|(a, b)| Some((a.parse::<f64>().ok()?, b.parse::<f64>().ok()?)))
        .filter(|(a, b)| 0.0 <= *a && a < b)
    else {
        eprintln!("--gap-seconds takes LOW-HIGH in seconds, LOW below HIGH (for example 4-9)");
        return std::process::ExitCode::FAILURE;
    };
    let schedule = Schedule {
        faults: faults.clone(),
        gap_ms: (low * 1000.0) as u64..(high * 1000.0) as u64,
        rounds: (rounds > 0).then_some(rounds),
    };
    let keys = KEYS
        .iter()
        .enumerate()
        .map(|(i, k)| format!("{{name = \"tenant-{i}\", key = \"{k}\"}}"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut env = vec![
        ("MCP_SANDBOX_AUTH_ENABLED", "true".to_string()),
        ("MCP_SANDBOX_AUTH_KEYS", format!("[{keys}]")),
        ("MCP_SANDBOX_POOL_MIN", "2".to_string()),
        ("MCP_SANDBOX_POOL_MAX", "2".to_string()),
        // 200 sandboxes' egress connections, two descriptors each, must fit
        // in an open-file limit of 20000 beside 4096 HTTP connections.
        ("MCP_SANDBOX_SANDBOX_EGRESS_MAX_CONNECTIONS", "16".to_string()),
        ("MCP_SANDBOX_SANDBOX_PAUSE_AFTER_SECONDS", "5".to_string()),
        ("MCP_SANDBOX_SANDBOX_EXEC_TIMEOUT_SECONDS", EXEC_TIMEOUT.to_string()),
    ];
    if let Ok(filter) = std::env::var("SOAK_SERVER_LOG") {
        env.push(("RUST_LOG", filter));
    }
    if let Ok(ca) = std::env::var("MCP_SANDBOX_SANDBOX_CA_BUNDLE") {
        env.push(("MCP_SANDBOX_SANDBOX_CA_BUNDLE", ca));
    }
    // Where the run's time goes, printed at the end.
    let mut phases: Vec<(&str, Instant)> = vec![("", Instant::now())];
    let server = Server::start(&bin, &env).await;
    let base = server.base.clone();
    let root = server.root().to_path_buf();
    let server_id = std::fs::read_to_string(root.join("state/server-id"))
        .unwrap()
        .trim()
        .to_string();
    let soak = Arc::new(Soak {
        server: RwLock::new(server),
        ledger: Mutex::default(),
        server_down: AtomicBool::new(false),
        engine_down: AtomicBool::new(false),
        engine_back: Mutex::new(None),
        stop: AtomicBool::new(false),
        base,
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    phases.push(("server started and settled", Instant::now()));
    let start = rss_and_fds(&*soak.server.read().await);
    soak.ledger.lock().unwrap().baseline = start;
    let mut peak = start;
    let length = match schedule.rounds {
        Some(n) => format!("{n} round(s) of faults {gap} s apart (within {minutes} min)"),
        None => format!("{minutes} min, faults {gap} s apart"),
    };
    println!(
        "soak: {length}, seed {seed}, {sandboxes} workers, faults {}",
        faults.join(",")
    );

    let mut tasks = vec![tokio::spawn(prober(soak.clone()))];
    tasks.extend((0..sandboxes).map(|n| tokio::spawn(worker(soak.clone(), n, seed))));
    let rounds = schedule.rounds;
    let injecting = tokio::spawn(injector(soak.clone(), seed, schedule, server_id.clone()));
    let until = Instant::now() + Duration::from_secs_f64(minutes * 60.0);
    while Instant::now() < until && !(rounds.is_some() && injecting.is_finished()) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = rss_and_fds(&*soak.server.read().await);
        peak = (peak.0.max(now.0), peak.1.max(now.1));
    }
    phases.push(("under load and faults", Instant::now()));
    soak.stop.store(true, Ordering::SeqCst);
    tasks.push(injecting);
    for t in tasks {
        let _ = tokio::time::timeout(CALL_DEADLINE * 2, t).await;
    }
    phases.push(("calls in flight ended", Instant::now()));

    // The promises at the end: writes intact, then everything removed.
    let (lost, problems) = verify_writes(&soak).await;
    phases.push(("writes read back", Instant::now()));
    delete_everything(&soak).await;
    phases.push(("sandboxes deleted", Instant::now()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let end = rss_and_fds(&*soak.server.read().await);
    let stopped = soak.server.write().await.stop(Duration::from_secs(30)).await;
    let left = orphans(&server_id, &root).await;
    phases.push(("server stopped, leftovers counted", Instant::now()));

    let l = soak.ledger.lock().unwrap();
    println!(
        "\n{:<34} {:>9} {:>9} {:>12} {:>12}",
        "fault", "injected", "recovered", "median s", "worst s"
    );
    for (kind, s) in &l.faults {
        let mut t = s.times.clone();
        t.sort();
        let med = t.get(t.len() / 2).map_or(f64::NAN, Duration::as_secs_f64);
        let worst = t.last().map_or(f64::NAN, Duration::as_secs_f64);
        println!(
            "{kind:<34} {:>9} {:>9} {med:>12.2} {worst:>12.2}",
            s.injected, s.recovered
        );
    }
    println!("\n{:<34} {:>9}", "calls by outcome", "n");
    for (outcome, n) in &l.calls {
        println!("{outcome:<34} {n:>9}");
    }
    println!("\n{:<34} {:>9}", "acknowledged writes", l.acknowledged);
    println!("{:<34} {:>9}", "lost writes (must be 0)", lost);
    println!("{:<34} {:>9}", "orphans (must be 0)", left.len());
    println!(
        "{:<34} {:>9.3}",
        "worst /health s (must be < 1)",
        l.health_worst.as_secs_f64()
    );
    println!(
        "\n{:<34} {:>9} {:>9} {:>9}\n{:<34} {:>9.1} {:>9.1} {:>9.1}\n{:<34} {:>9} {:>9} {:>9}",
        "server", "start", "peak", "end", "RSS MB", start.0, peak.0, end.0, "descriptors", start.1, peak.1, end.1
    );
    let took: Vec<String> = phases
        .windows(2)
        .map(|w| format!("{} {:.1} s", w[1].0, (w[1].1 - w[0].1).as_secs_f64()))
        .collect();
    println!("\ntime: {}", took.join(", "));
    let mut failed: Vec<String> = l.violations.clone();
    if !stopped {
        failed.push("the server did not stop within 30 s of SIGTERM".into());
    }
    failed.extend(problems.into_iter().map(|p| format!("lost: {p}")));
    failed.extend(left.into_iter().map(|o| format!("orphan: {o}")));
    if let Some(n) = rounds {
        for kind in &faults {
            let injected = l.faults.get(kind).map_or(0, |s| s.injected);
            if injected < n {
                failed.push(format!(
                    "the {kind} fault was injected {injected} of {n} times within {minutes} min"
                ));
            }
        }
    }
    // Against the baseline of the server process that ran last.
    let baseline = l.baseline;
    if end.1 > baseline.1 + 16 {
        failed.push(format!(
            "descriptors did not return to their baseline: {} → {}",
            baseline.1, end.1
        ));
    }
    if end.0 > baseline.0 * 2.0 + 20.0 {
        failed.push(format!(
            "RSS did not return near its baseline: {:.1} → {:.1} MB",
            baseline.0, end.0
        ));
    }
    if failed.is_empty() {
        println!("\nsoak: every invariant held");
        return std::process::ExitCode::SUCCESS;
    }
    println!("\nsoak: {} invariant violations:", failed.len());
    for f in failed.iter().take(40) {
        println!("  {f}");
    }
    std::process::ExitCode::FAILURE
}
