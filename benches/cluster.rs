//! The cluster on this machine (`scripts/cluster up 3`, each node with its
//! own engine in its own network namespace, three etcd members), measured:
//!
//! - forwarding: `print(1)` through the node that holds the sandbox and
//!   through another node, interleaved in one run: p50/p99 of each and what
//!   forwarding adds;
//! - a burst of creations spread over the three entry nodes, against the
//!   same burst through one node of the same cluster: p50/p99 time to a
//!   created (interactive) sandbox, and how many succeeded;
//! - failover: after SIGKILL of a node, how long until a creation through
//!   another node succeeds, and until the killed node shows `down`;
//! - a soak: writers append numbered lines to files in sandboxes on every
//!   node, through every node, and a creator makes and deletes sandboxes,
//!   while a node is killed and started, etcd members are killed and
//!   started and a node is partitioned by its link; then every
//!   acknowledged line must be in its file (0 lost), no sandbox may have a
//!   container on two nodes, every sandbox in the directory must have its
//!   container on its node, and `scripts/cluster down` must leave nothing.
//!
//! `cargo bench --bench cluster -- [--n 300] [--burst 300] [--soak 150]
//! [--only forwarding,burst,failover,soak] [--bin PATH]` (default binary:
//! target/release/mcp-sandbox; build it first). Needs root; it starts the
//! cluster with `benches/cluster.toml` and removes it at the end.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The cluster's administration file (`scripts/cluster` writes it): its
/// `[cluster]` section holds the secret the node channel is signed with.
const CLUSTER_ADMIN: &str = "/var/lib/mcp-sandbox-cluster/admin.toml";

/// The key whose hash benches/cluster.toml holds.
const KEY: &str = "msk_BPa4p3y_RdfvB4Au1uXvlciU5flhcCJFZZYUt5lVgLI";

struct Args {
    n: usize,
    burst: usize,
    soak_seconds: u64,
    only: Vec<String>,
    bin: PathBuf,
}

fn args() -> Args {
    let mut a = Args {
        n: 300,
        burst: 300,
        soak_seconds: 150,
        only: ["forwarding", "burst", "failover", "soak"].map(String::from).to_vec(),
        bin: PathBuf::from("target/release/mcp-sandbox"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--n" => a.n = it.next().and_then(|v| v.parse().ok()).expect("--n N"),
            "--burst" => a.burst = it.next().and_then(|v| v.parse().ok()).expect("--burst N"),
            "--bin" => a.bin = it.next().expect("--bin PATH").into(),
            "--soak" => a.soak_seconds = it.next().and_then(|v| v.parse().ok()).expect("--soak SECONDS"),
            "--only" => a.only = it.next().expect("--only PHASES").split(',').map(String::from).collect(),
            _ => {}
        }
    }
    a
}

fn script(args: &[&str], bin: &PathBuf) -> String {
    let out = Command::new("scripts/cluster")
        .args(args)
        .env("CLUSTER_BIN", bin)
        .output()
        .expect("scripts/cluster runs");
    assert!(
        out.status.success(),
        "scripts/cluster {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn figures(mut ms: Vec<f64>) -> (f64, f64) {
    ms.sort_by(|a, b| a.total_cmp(b));
    (percentile(&ms, 0.5), percentile(&ms, 0.99))
}

struct Cluster {
    http: reqwest::Client,
    nodes: Vec<(String, String)>,
    bin: PathBuf,
}

impl Cluster {
    fn url(&self, i: usize) -> &str {
        &self.nodes[i].1
    }

    async fn post(&self, i: usize, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.url(i)))
            .bearer_auth(KEY)
            .json(&body)
            .send()
            .await
            .expect("the node answers");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// As [`Cluster::post`], for a node that may be down or cut off: `None`
    /// when no answer came.
    async fn try_post(&self, i: usize, path: &str, body: Value) -> Option<(u16, Value)> {
        let r = self
            .http
            .post(format!("{}{path}", self.url(i)))
            .bearer_auth(KEY)
            .json(&body)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .ok()?;
        let status = r.status().as_u16();
        Some((status, r.json().await.unwrap_or(Value::Null)))
    }

    async fn delete(&self, i: usize, id: &str) {
        let _ = self
            .http
            .delete(format!("{}/api/sandboxes/{id}", self.url(i)))
            .bearer_auth(KEY)
            .send()
            .await;
    }

    /// A sandbox placed on node `i` (the others drain meanwhile).
    async fn create_on(&self, i: usize) -> String {
        let others: Vec<String> = (0..self.nodes.len())
            .filter(|&j| j != i)
            .map(|j| self.nodes[j].0.clone())
            .collect();
        for name in &others {
            script(&["ctl", "drain", name], &self.bin);
        }
        let (status, created) = self.post(i, "/api/sandboxes", json!({})).await;
        for name in &others {
            script(&["ctl", "drain", name, "--undo"], &self.bin);
        }
        assert!(status == 201, "{created}");
        created["sandbox_id"].as_str().unwrap().to_string()
    }
}

async fn forwarding(c: &Cluster, n: usize) {
    let id = c.create_on(0).await;
    let path = format!("/api/sandboxes/{id}/python");
    for i in [0, 1] {
        // Warm: connections, caches.
        for _ in 0..10 {
            c.post(i, &path, json!({"code": "print(1)"})).await;
        }
    }
    // The node channel itself, from here to the holder, as an entry node
    // calls it (signed with the cluster's secret, answered in JSON lines).
    let admin: toml::Value = toml::from_str(&std::fs::read_to_string(CLUSTER_ADMIN).unwrap()).unwrap();
    let config: sandbox_cluster::ClusterConfig = admin["cluster"].clone().try_into().unwrap();
    let channel = sandbox_cluster::channel::Channel::new(&config);
    let call = json!({
        "caller": {"owner": "bench", "admin": false, "expires_at": null},
        "args": {"sandbox_id": id, "code": "print(1)"},
    });
    let (mut direct, mut forwarded, mut channelled) = (vec![], vec![], vec![]);
    for _ in 0..n {
        for (i, into) in [(0, &mut direct), (1, &mut forwarded)] {
            let t = Instant::now();
            let (status, ran) = c.post(i, &path, json!({"code": "print(1)"})).await;
            assert!(status == 200 && ran["stdout"] == "1\n", "{ran}");
            into.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let t = Instant::now();
        let mut ok = false;
        channel
            .call(&c.nodes[0].0, c.url(0), "execute_python_code", &call, |line| {
                ok |= line["ok"]["stdout"] == "1\n";
            })
            .await
            .unwrap();
        assert!(ok, "the channel's call ran");
        channelled.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let (d50, d99) = figures(direct);
    let (f50, f99) = figures(forwarded);
    let (c50, c99) = figures(channelled);
    println!("forwarding: print(1) x {n} each, interleaved");
    println!("  through the holder      p50 {d50:7.2} ms  p99 {d99:7.2} ms");
    println!("  the node channel alone  p50 {c50:7.2} ms  p99 {c99:7.2} ms  (from here to the holder)");
    println!("  through another node    p50 {f50:7.2} ms  p99 {f99:7.2} ms");
    println!(
        "  forwarding adds         p50 {:7.2} ms  p99 {:7.2} ms",
        f50 - d50,
        f99 - d99
    );
    c.delete(0, &id).await;
}

/// What a burst made: each success's time, entry node and sandbox, and
/// the failures by status (0: no answer within 30 s).
#[derive(Default)]
struct Burst {
    ms: Vec<f64>,
    made: Vec<(usize, String)>,
    failed: BTreeMap<u16, u64>,
}

/// `count` creations at once, through the entry nodes `entries` in turn.
async fn burst(c: &Cluster, count: usize, entries: &[usize]) -> Burst {
    let tasks = (0..count).map(|k| {
        let entry = entries[k % entries.len()];
        async move {
            let t = Instant::now();
            let (status, created) = c
                .try_post(entry, "/api/sandboxes", json!({}))
                .await
                .unwrap_or((0, Value::Null));
            let id = created["sandbox_id"].as_str().unwrap_or_default().to_string();
            (status, t.elapsed().as_secs_f64() * 1000.0, entry, id)
        }
    });
    let mut out = Burst::default();
    for (status, ms, entry, id) in futures_util::future::join_all(tasks).await {
        match status {
            201 => {
                out.ms.push(ms);
                out.made.push((entry, id));
            }
            _ => *out.failed.entry(status).or_default() += 1,
        }
    }
    out
}

/// Waits until the nodes' pools hold `want` ready sandboxes (or stop
/// growing for 30 s, or 4 minutes pass): how many are ready.
async fn pools_full(bin: &PathBuf, want: u64) -> u64 {
    let ready = || {
        let status: Value = serde_json::from_str(&script(&["status", "--json"], bin)).unwrap();
        let nodes = status.as_array().cloned().unwrap_or_default();
        nodes.iter().filter_map(|n| n["figures"]["ready"].as_u64()).sum::<u64>()
    };
    let (started, mut last, mut since) = (Instant::now(), ready(), Instant::now());
    while last < want && since.elapsed() < Duration::from_secs(30) && started.elapsed() < Duration::from_secs(240) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = ready();
        if now > last {
            (last, since) = (now, Instant::now());
        }
    }
    last
}

async fn bursts(c: &Cluster, count: usize) {
    println!("burst: {count} creations at once (pools at the shipped size)");
    for (label, entries) in [("through one node", vec![0]), ("over three entry nodes", vec![0, 1, 2])] {
        let ready = pools_full(&c.bin, count as u64).await;
        let b = burst(c, count, &entries).await;
        let ok = b.ms.len();
        let (p50, p99) = figures(b.ms);
        println!("  {label:<24} p50 {p50:8.1} ms  p99 {p99:8.1} ms  {ok}/{count} succeeded ({ready} pooled before)");
        if !b.failed.is_empty() {
            println!("    failed by status (0: no answer within 30 s): {:?}", b.failed);
        }
        futures_util::future::join_all(b.made.iter().map(|(entry, id)| c.delete(*entry, id))).await;
    }
}

async fn failover(c: &Cluster) {
    let bin = &c.bin;
    let killed = Instant::now();
    script(&["kill", "3"], bin);
    let mut first_creation = None;
    let mut down = None;
    let mut made = vec![];
    while (first_creation.is_none() || down.is_none()) && killed.elapsed() < Duration::from_secs(60) {
        if first_creation.is_none() {
            let (status, created) = c.post(0, "/api/sandboxes", json!({})).await;
            if status == 201 {
                first_creation = Some(killed.elapsed());
                made.push(created["sandbox_id"].as_str().unwrap_or_default().to_string());
            }
        }
        if down.is_none() {
            let status: Value = serde_json::from_str(&script(&["status", "--json"], bin)).unwrap();
            let n3 = status.as_array().unwrap().iter().find(|n| n["name"] == "n3").cloned();
            if n3.is_some_and(|n| n["state"] == "down") {
                down = Some(killed.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("failover: SIGKILL of n3 (lease 5 s)");
    println!("  a creation through n1 succeeds after {:?}", first_creation.unwrap());
    println!("  n3 shows down after                  {:?}", down.unwrap());
    for id in made {
        c.delete(0, &id).await;
    }
    script(&["start", "3"], bin);
}

/// What the soak's clients saw.
#[derive(Default)]
struct Seen {
    /// Lines acknowledged, by sandbox.
    acked: BTreeMap<String, Vec<u64>>,
    /// Sandboxes whose creation was acknowledged and not yet deleted.
    live: BTreeSet<String>,
    /// Answers by status (0: no answer).
    answers: BTreeMap<u16, u64>,
    /// The creator's deletions, by status (0: no answer).
    deletions: BTreeMap<u16, u64>,
    /// Deletions that may or may not have run.
    maybe_deleted: u64,
}

/// Runs `scripts/cluster ARGS` off the async threads.
async fn chaos(bin: &Path, args: &[&str]) {
    let (bin, args) = (
        bin.to_path_buf(),
        args.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
    );
    println!("  chaos: {}", args.join(" "));
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        script(&args, &bin)
    })
    .await
    .unwrap();
}

fn ip_link(name: &str, state: &str) {
    let ok = Command::new("ip").args(["link", "set", name, state]).status().unwrap();
    assert!(ok.success(), "ip link set {name} {state}");
}

/// The lines of `command`'s output, or nothing when it fails.
fn lines_of(program: &str, args: &[&str]) -> Vec<String> {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().map(String::from).collect())
        .unwrap_or_default()
}

async fn soak(c: &Arc<Cluster>, seconds: u64) {
    println!("soak: {seconds} s of writers and a creator, through every node, under failures");
    let mut sandboxes = vec![];
    for i in 0..3 {
        for _ in 0..2 {
            sandboxes.push(c.create_on(i).await);
        }
    }
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = vec![];
    for (w, id) in sandboxes.iter().enumerate() {
        let (c, seen, stop, id) = (c.clone(), seen.clone(), stop.clone(), id.clone());
        clients.push(tokio::spawn(async move {
            let mut seq = 0u64;
            while !stop.load(Ordering::Relaxed) {
                seq += 1;
                let entry = (w + seq as usize) % 3;
                let command = format!("echo {seq} >> /app/results/soak.log");
                let answer = c
                    .try_post(
                        entry,
                        &format!("/api/sandboxes/{id}/shell"),
                        json!({"command": command}),
                    )
                    .await;
                {
                    let mut s = seen.lock().unwrap();
                    *s.answers.entry(answer.as_ref().map_or(0, |a| a.0)).or_default() += 1;
                    if let Some((200, ran)) = &answer {
                        if ran["exit_code"] == 0 {
                            s.acked.entry(id.clone()).or_default().push(seq);
                        }
                    }
                }
                if answer.as_ref().is_none_or(|a| a.0 != 200) {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }));
    }
    {
        let (c, seen, stop) = (c.clone(), seen.clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            let mut k = 0usize;
            while !stop.load(Ordering::Relaxed) {
                k += 1;
                if let Some((201, made)) = c.try_post(k % 3, "/api/sandboxes", json!({})).await {
                    let id = made["sandbox_id"].as_str().unwrap_or_default().to_string();
                    seen.lock().unwrap().live.insert(id.clone());
                    let deleted = c
                        .http
                        .delete(format!("{}/api/sandboxes/{id}", c.url((k + 1) % 3)))
                        .bearer_auth(KEY)
                        .timeout(Duration::from_secs(30))
                        .send()
                        .await;
                    // A deletion that may have run (no answer once sent,
                    // or "may not have run") leaves the sandbox unknown.
                    let (status, maybe) = match deleted {
                        Ok(r) => {
                            let status = r.status().as_u16();
                            let body = r.text().await.unwrap_or_default();
                            (status, status == 503 && body.contains("may not have run"))
                        }
                        Err(e) => (0, !e.is_connect()),
                    };
                    let mut s = seen.lock().unwrap();
                    *s.deletions.entry(status).or_default() += 1;
                    if status == 200 || maybe {
                        s.live.remove(&id);
                    }
                    s.maybe_deleted += u64::from(maybe);
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }));
    }
    let bin = &c.bin;
    let started = Instant::now();
    let step = Duration::from_secs(seconds / 8);
    tokio::time::sleep(step).await;
    chaos(bin, &["kill", "3"]).await;
    tokio::time::sleep(step).await;
    chaos(bin, &["start", "3"]).await;
    chaos(bin, &["kill-etcd", "1"]).await;
    tokio::time::sleep(step).await;
    chaos(bin, &["start-etcd", "1"]).await;
    println!("  chaos: n2's link down");
    ip_link("mcpsbx-h2", "down");
    tokio::time::sleep(step).await;
    ip_link("mcpsbx-h2", "up");
    println!("  chaos: n2's link up");
    tokio::time::sleep(step).await;
    chaos(bin, &["kill-etcd", "2"]).await;
    chaos(bin, &["kill", "1"]).await;
    tokio::time::sleep(step).await;
    chaos(bin, &["start-etcd", "2"]).await;
    chaos(bin, &["start", "1"]).await;
    let rest = Duration::from_secs(seconds).saturating_sub(started.elapsed());
    tokio::time::sleep(rest).await;
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    // Every node up, then what was acknowledged is checked.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status: Value = serde_json::from_str(&script(&["status", "--json"], bin)).unwrap();
        let up = status.as_array().unwrap().iter().filter(|n| n["state"] == "up").count();
        if up == 3 {
            break;
        }
        assert!(Instant::now() < deadline, "every node up again: {status}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let (mut acked, mut lost) = (0, 0);
    for (id, seqs) in &seen.acked {
        let (status, ran) = c
            .post(
                0,
                &format!("/api/sandboxes/{id}/shell"),
                json!({"command": "cat /app/results/soak.log"}),
            )
            .await;
        assert_eq!(status, 200, "{ran}");
        let kept: BTreeSet<u64> = ran["stdout"]
            .as_str()
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.parse().ok())
            .collect();
        acked += seqs.len();
        lost += seqs.iter().filter(|s| !kept.contains(s)).count();
    }
    // The directory against the nodes' engines, right away and once every
    // node has taken its step with the directory (every 5 s): a node
    // killed between a deletion's removal of the container and its
    // directory entry takes the entry out at that step.
    let homeless_at_once = placed(c).homeless.len();
    tokio::time::sleep(Duration::from_secs(12)).await;
    let Placed {
        homeless: homeless_entries,
        directory,
        holders,
    } = placed(c);
    let homeless = homeless_entries.len();
    let double = holders.values().filter(|h| h.len() > 1).count();
    let missing_live = seen.live.iter().filter(|id| !directory.contains_key(*id)).count();
    let unlisted = holders.keys().filter(|id| !directory.contains_key(*id)).count();
    println!("  writes by status (0: no answer): {:?}", seen.answers);
    println!(
        "  deletions by status (0: no answer): {:?}, {} of which may have run",
        seen.deletions, seen.maybe_deleted
    );
    let status: Value = serde_json::from_str(&script(&["status", "--json"], bin)).unwrap();
    let ready: u64 = status
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["figures"]["ready"].as_u64())
        .sum();
    println!("  the nodes' ready pooled sandboxes {ready}");
    println!("  acknowledged lines          {acked:6}   lost {lost}");
    println!("  sandboxes held by two nodes {double:6}");
    println!(
        "  directory entries           {:6}   without their container {homeless} ({homeless_at_once} before the nodes' step with the directory) {homeless_entries:?}",
        directory.len()
    );
    println!(
        "  acknowledged creations kept {:6}   missing from the directory {missing_live}",
        seen.live.len()
    );
    println!("  containers outside the directory {unlisted} (pooled: ready, or still warming)");
    assert!(acked > 0 && lost == 0 && double == 0 && homeless == 0 && missing_live == 0);
}

/// Where the sandboxes are.
struct Placed {
    /// The directory's entries (sandbox, node) without their container.
    homeless: Vec<(String, String)>,
    /// The directory (etcd): each sandbox's node.
    directory: BTreeMap<String, String>,
    /// The nodes whose engines hold each sandbox's container.
    holders: BTreeMap<String, Vec<String>>,
}

/// The directory against the nodes' engines.
fn placed(c: &Cluster) -> Placed {
    let dir = lines_of(
        "etcdctl",
        &[
            "--endpoints",
            "http://127.0.0.1:23791,http://127.0.0.1:23792,http://127.0.0.1:23793",
            "get",
            "--prefix",
            "/mcp-sandbox/sandboxes/",
        ],
    );
    let directory: BTreeMap<String, String> = dir
        .chunks(2)
        .filter_map(|kv| {
            let id = kv[0].rsplit('/').next()?.to_string();
            let node = serde_json::from_str::<Value>(kv.get(1)?).ok()?["node"]
                .as_str()?
                .to_string();
            Some((id, node))
        })
        .collect();
    let mut holders: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, _) in &c.nodes {
        let sock = format!("unix:///run/mcpsbx-{name}/docker.sock");
        let format = "{{.Label \"io.mcp-sandbox.sandbox\"}}";
        for id in lines_of(
            "docker",
            &[
                "-H",
                &sock,
                "ps",
                "-a",
                "--filter",
                "label=io.mcp-sandbox.sandbox",
                "--format",
                format,
            ],
        ) {
            holders.entry(id).or_default().push(name.clone());
        }
    }
    let homeless = directory
        .iter()
        .filter(|(id, node)| !holders.get(*id).is_some_and(|h| h.contains(node)))
        .map(|(id, node)| (id.clone(), node.clone()))
        .collect();
    Placed {
        homeless,
        directory,
        holders,
    }
}

/// What `scripts/cluster down` left behind: namespaces, engines, mounts,
/// loop devices, cgroups and the cluster's folder.
fn leftovers() -> Vec<String> {
    let root = "/var/lib/mcp-sandbox-cluster";
    let mut left = vec![];
    left.extend(
        lines_of("ip", &["netns", "list"])
            .into_iter()
            .filter(|l| l.contains("mcpsbx")),
    );
    left.extend(lines_of("pgrep", &["-af", "mcpsbx-n"]));
    left.extend(
        lines_of("findmnt", &["-rn", "-o", "TARGET"])
            .into_iter()
            .filter(|m| m.starts_with(root) || m.starts_with("/run/mcpsbx")),
    );
    left.extend(
        lines_of("losetup", &["-nO", "BACK-FILE"])
            .into_iter()
            .filter(|f| f.trim().starts_with(root)),
    );
    left.extend(lines_of("ls", &["-d", root]));
    left.extend(lines_of("sh", &["-c", "ls -d /sys/fs/cgroup/mcpsbx-n* 2>/dev/null"]));
    left
}

#[tokio::main]
async fn main() {
    let a = args();
    std::env::set_current_dir(env!("CARGO_MANIFEST_DIR")).unwrap();
    assert!(
        a.bin.is_file(),
        "{} is missing: cargo build --release first",
        a.bin.display()
    );
    let bin = std::fs::canonicalize(&a.bin).unwrap();
    script(&["down"], &bin);
    let up = Instant::now();
    let lines = script(&["up", "3", "--config", "benches/cluster.toml"], &bin);
    println!("scripts/cluster up 3: {:.1} s", up.elapsed().as_secs_f64());
    let nodes = lines
        .lines()
        .map(|l| {
            let (name, url) = l.split_once(' ').unwrap();
            (name.to_string(), url.to_string())
        })
        .collect();
    let c = Arc::new(Cluster {
        http: reqwest::Client::new(),
        nodes,
        bin,
    });
    // Pools of the shipped size fill first: forwarding is measured on a
    // machine that no longer starts sandboxes.
    pools_full(&c.bin, u64::MAX).await;
    let only = |phase: &str| a.only.iter().any(|p| p == phase);
    if only("forwarding") {
        forwarding(&c, a.n).await;
    }
    if only("burst") {
        bursts(&c, a.burst).await;
    }
    if only("failover") {
        failover(&c).await;
    }
    if only("soak") {
        soak(&c, a.soak_seconds).await;
    }
    script(&["down"], &c.bin);
    let left = leftovers();
    println!("scripts/cluster down: {} things left behind {left:?}", left.len());
    assert!(left.is_empty());
}
