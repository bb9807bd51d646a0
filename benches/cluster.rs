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
//!   another node succeeds, and until the killed node shows `down`.
//!
//! `cargo bench --bench cluster -- [--n 300] [--burst 60] [--bin PATH]`
//! (default: target/release/mcp-sandbox; build it first). Needs root; it
//! starts the cluster with `benches/cluster.toml` and removes it at the end.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The key whose hash benches/cluster.toml holds.
const KEY: &str = "msk_BPa4p3y_RdfvB4Au1uXvlciU5flhcCJFZZYUt5lVgLI";

struct Args {
    n: usize,
    burst: usize,
    bin: PathBuf,
}

fn args() -> Args {
    let mut a = Args {
        n: 300,
        burst: 60,
        bin: PathBuf::from("target/release/mcp-sandbox"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--n" => a.n = it.next().and_then(|v| v.parse().ok()).expect("--n N"),
            "--burst" => a.burst = it.next().and_then(|v| v.parse().ok()).expect("--burst N"),
            "--bin" => a.bin = it.next().expect("--bin PATH").into(),
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
    let (mut direct, mut forwarded) = (vec![], vec![]);
    for _ in 0..n {
        for (i, into) in [(0, &mut direct), (1, &mut forwarded)] {
            let t = Instant::now();
            let (status, ran) = c.post(i, &path, json!({"code": "print(1)"})).await;
            assert!(status == 200 && ran["stdout"] == "1\n", "{ran}");
            into.push(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    let (d50, d99) = figures(direct);
    let (f50, f99) = figures(forwarded);
    println!("forwarding: print(1) x {n} each, interleaved");
    println!("  through the holder      p50 {d50:7.2} ms  p99 {d99:7.2} ms");
    println!("  through another node    p50 {f50:7.2} ms  p99 {f99:7.2} ms");
    println!(
        "  forwarding adds         p50 {:7.2} ms  p99 {:7.2} ms",
        f50 - d50,
        f99 - d99
    );
    c.delete(0, &id).await;
}

/// `count` creations at once, through the entry nodes `entries` in turn.
async fn burst(c: &Cluster, count: usize, entries: &[usize]) -> (Vec<f64>, Vec<(usize, String)>) {
    let tasks = (0..count).map(|k| {
        let entry = entries[k % entries.len()];
        async move {
            let t = Instant::now();
            let (status, created) = c.post(entry, "/api/sandboxes", json!({})).await;
            let ms = t.elapsed().as_secs_f64() * 1000.0;
            (status == 201).then(|| {
                (
                    ms,
                    entry,
                    created["sandbox_id"].as_str().unwrap_or_default().to_string(),
                )
            })
        }
    });
    let done = futures_util::future::join_all(tasks).await;
    let made: Vec<(f64, usize, String)> = done.into_iter().flatten().collect();
    let ms = made.iter().map(|(ms, _, _)| *ms).collect();
    (ms, made.into_iter().map(|(_, e, id)| (e, id)).collect())
}

async fn bursts(c: &Cluster, count: usize) {
    println!("burst: {count} creations at once (pools at the shipped size)");
    for (label, entries) in [("through one node", vec![0]), ("over three entry nodes", vec![0, 1, 2])] {
        let (ms, made) = burst(c, count, &entries).await;
        let ok = ms.len();
        let (p50, p99) = figures(ms);
        println!("  {label:<24} p50 {p50:8.1} ms  p99 {p99:8.1} ms  {ok}/{count} succeeded");
        for (entry, id) in made {
            c.delete(entry, &id).await;
        }
        // The pools refill before the next burst.
        tokio::time::sleep(Duration::from_secs(20)).await;
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
    let c = Cluster {
        http: reqwest::Client::new(),
        nodes,
        bin,
    };
    // Pools of the shipped size fill first.
    tokio::time::sleep(Duration::from_secs(30)).await;
    forwarding(&c, a.n).await;
    bursts(&c, a.burst).await;
    failover(&c).await;
    script(&["down"], &c.bin);
}
