//! The benchmark suite: one table of figures, each baseline measured in the
//! same run, against the release server over real HTTP (raw JSON-RPC clients,
//! so the figures are the server's).
//!
//! `cargo build --release && cargo bench --bench suite [-- --n 500 --clients 50 --seconds 30 --idle 100 --creates 10]`
//! (`scripts/bench` provisions Docker and runs it.)

mod common;

use std::time::{Duration, Instant};

use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::RemoveContainerOptionsBuilder;
use bollard::Docker;
use common::mcp::{loop_print, print_series, McpClient, Server};
use common::{arg, docker_exec, Series};
use serde_json::{json, Value};

const PRINT: &str = "print(1)";

async fn create(c: &McpClient) -> (String, Duration) {
    let t = Instant::now();
    let r = c.tool("create_sandbox", json!({})).await.expect("create_sandbox");
    (r["sandbox_id"].as_str().unwrap().to_string(), t.elapsed())
}

async fn delete_all(c: &McpClient, ids: &[String]) {
    for id in ids {
        c.tool("delete_sandbox", json!({"sandbox_id": id}))
            .await
            .expect("delete_sandbox");
    }
}

/// `n` timed requests (after a few untimed ones) to the REST API or another
/// plain HTTP route, each checked for a 2xx answer.
async fn http_series(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<&Value>,
    n: usize,
) -> Vec<Duration> {
    let send = || {
        let r = http.request(method.clone(), url);
        match body {
            Some(b) => r.json(b),
            None => r,
        }
    };
    for _ in 0..5 {
        send().send().await.unwrap().error_for_status().unwrap();
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = send().send().await.unwrap().error_for_status().unwrap();
        r.bytes().await.unwrap();
        out.push(t.elapsed());
    }
    out
}

/// `creates` timed create_sandbox calls from the warm pool, each after the
/// pool had time to refill.
async fn pooled_creates(c: &McpClient, creates: usize) -> (Vec<Duration>, Vec<String>) {
    let (mut times, mut ids) = (vec![], vec![]);
    for _ in 0..creates {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let (id, t) = create(c).await;
        times.push(t);
        ids.push(id);
    }
    (times, ids)
}

/// `creates` timed create_sandbox calls on a fresh server started with `env`.
async fn cold_creates(bin: &str, env: &[(&str, String)], http: &reqwest::Client, creates: usize) -> Vec<Duration> {
    let server = Server::start(bin, env).await;
    let c = McpClient::http(http.clone(), &server.base).await;
    let (mut times, mut ids) = (vec![], vec![]);
    for _ in 0..creates {
        let (id, t) = create(&c).await;
        times.push(t);
        ids.push(id);
    }
    delete_all(&c, &ids).await;
    times
}

/// Engine API create + start of the sandbox image, then removal.
async fn baseline_create(docker: &Docker, image: &str, n: usize) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let body = ContainerCreateBody {
            image: Some(image.to_string()),
            cmd: Some(vec!["sleep".into(), "60".into()]),
            labels: Some([("io.mcp-sandbox.project".to_string(), "mcp-sandbox-bench".to_string())].into()),
            host_config: Some(HostConfig {
                network_mode: Some("bridge".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let name = format!("mcp-sandbox-bench-baseline-{}-{i}", std::process::id());
        let options = bollard::query_parameters::CreateContainerOptionsBuilder::default()
            .name(&name)
            .build();
        let t = Instant::now();
        let id = docker.create_container(Some(options), body).await.unwrap().id;
        docker.start_container(&id, None).await.unwrap();
        out.push(t.elapsed());
        let rm = RemoveContainerOptionsBuilder::default().force(true).build();
        docker.remove_container(&id, Some(rm)).await.unwrap();
    }
    out
}

/// N clients, each with its own sandbox, looping `print(1)` for `secs`.
async fn looping(base: &str, clients: usize, secs: u64) -> (Vec<Duration>, usize, Vec<String>) {
    let http = reqwest::Client::new();
    let mut pairs = vec![];
    for _ in 0..clients {
        let c = McpClient::http(http.clone(), base).await;
        let (sid, _) = create(&c).await;
        c.tool("execute_python_code", json!({"sandbox_id": sid, "code": PRINT}))
            .await
            .unwrap();
        pairs.push((c, sid));
    }
    let ids = pairs.iter().map(|(_, sid)| sid.clone()).collect();
    let (all, errors) = loop_print(pairs, Duration::from_secs(5), Duration::from_secs(secs)).await;
    (all, errors, ids)
}

/// Memory charged to a container's cgroup (cgroup v1 or v2), in MB.
async fn container_memory_mb(docker: &Docker, sandbox: &str) -> Option<f64> {
    let id = docker
        .inspect_container(&format!("mcp-sandbox-{sandbox}"), None)
        .await
        .ok()?
        .id?;
    let paths = [
        format!("/sys/fs/cgroup/memory/docker/{id}/memory.usage_in_bytes"),
        format!("/sys/fs/cgroup/system.slice/docker-{id}.scope/memory.current"),
    ];
    let bytes: f64 = paths
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())?
        .trim()
        .parse()
        .ok()?;
    Some(bytes / 1024.0 / 1024.0)
}

async fn install_time(c: &McpClient, sid: &str) -> Duration {
    let t = Instant::now();
    let r = c
        .tool(
            "install_package_in_sandbox",
            json!({"sandbox_id": sid, "package_name": "six"}),
        )
        .await
        .unwrap();
    assert_eq!(r["status"], "success", "{r}");
    t.elapsed()
}

fn line(name: &str, s: &Series, note: &str) {
    println!(
        "| {name} | {} | {:.2} | {:.2} | {note} |",
        s.n(),
        s.pct(50.0),
        s.pct(99.0)
    );
}

#[tokio::main]
async fn main() {
    let bin: String = arg("--bin", "target/release/mcp-sandbox".to_string());
    let n: usize = arg("--n", 500);
    let clients: usize = arg("--clients", 50);
    let secs: u64 = arg("--seconds", 30);
    let idle: usize = arg("--idle", 100);
    let creates: usize = arg("--creates", 10);
    let docker = Docker::connect_with_local_defaults()
        .unwrap()
        .negotiate_version()
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let ca = std::path::Path::new("/etc/ssl/certs/ca-certificates.crt");
    let mut env = vec![
        ("MCP_SANDBOX_POOL_MIN", "2".to_string()),
        ("MCP_SANDBOX_POOL_MAX", "2".to_string()),
        ("MCP_SANDBOX_SANDBOX_PAUSE_AFTER_SECONDS", "0".to_string()),
    ];
    if ca.is_file() {
        env.push(("MCP_SANDBOX_SANDBOX_CA_BUNDLE", ca.display().to_string()));
    }

    // The same server without disk quotas: plain folders and volumes.
    let no_quotas = [
        ("MCP_SANDBOX_SANDBOX_RESULTS_MB", "0".to_string()),
        ("MCP_SANDBOX_SANDBOX_PACKAGES_MB", "0".to_string()),
    ];
    let env_plain: Vec<(&str, String)> = env.iter().cloned().chain(no_quotas.iter().cloned()).collect();
    let plain_server = Server::start(&bin, &env_plain).await;
    let pc = McpClient::http(http.clone(), &plain_server.base).await;
    let (pooled_plain, plain_ids) = pooled_creates(&pc, creates).await;
    delete_all(&pc, &plain_ids).await;
    drop(plain_server);

    // create_sandbox from the pool (waiting for it to refill between calls).
    let server = Server::start(&bin, &env).await;
    let rss_idle = server.rss_mb();
    let c = McpClient::http(http.clone(), &server.base).await;
    let (pooled, ids) = pooled_creates(&c, creates).await;
    let image = docker
        .inspect_container(&format!("mcp-sandbox-{}", ids[0]), None)
        .await
        .unwrap()
        .config
        .unwrap()
        .image
        .unwrap();

    // Executions, and the docker exec baseline in the same container.
    let mcp = print_series(&c, &ids[0], n).await;
    let sse_client = McpClient::sse(http.clone(), &server.base).await;
    let sse = print_series(&sse_client, &ids[0], n).await;
    let rest_url = format!("{}/api/sandboxes/{}/python", server.base, ids[0]);
    let rest = http_series(
        &http,
        reqwest::Method::POST,
        &rest_url,
        Some(&json!({"code": PRINT})),
        n,
    )
    .await;
    let container = format!("mcp-sandbox-{}", ids[0]);
    docker_exec(&docker, &container).await;
    let mut dexec = vec![];
    for _ in 0..(n / 10).max(20) {
        dexec.push(docker_exec(&docker, &container).await);
    }

    // Installs: the first, the same package in a second sandbox, and again.
    let first = install_time(&c, &ids[0]).await;
    let other = install_time(&c, &ids[1]).await;
    let again = install_time(&c, &ids[0]).await;
    delete_all(&c, &ids).await;

    // Clients looping, then idle sandboxes up to `idle`.
    let (lat, errors, mut loop_ids) = looping(&server.base, clients, secs).await;
    let rate = lat.len() as f64 / secs as f64;
    let looped = Series::new("", lat);
    while loop_ids.len() < idle {
        loop_ids.push(create(&c).await.0);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_full = server.rss_mb();
    // What the web UI's list and a Prometheus scrape cost with them all.
    let list_url = format!("{}/api/sandboxes", server.base);
    let ui_list = http_series(&http, reqwest::Method::GET, &list_url, None, 20).await;
    let metrics_url = format!("{}/metrics", server.base);
    let scrape = http_series(&http, reqwest::Method::GET, &metrics_url, None, 50).await;
    let mut mem = vec![];
    for id in &loop_ids {
        if let Some(m) = container_memory_mb(&docker, id).await {
            mem.push(m);
        }
    }
    delete_all(&c, &loop_ids).await;
    drop(server);

    // Cold create_sandbox (no pool), with and without disk quotas, and the
    // Engine API baseline.
    let env_cold: Vec<(&str, String)> = vec![
        ("MCP_SANDBOX_POOL_MIN", "0".to_string()),
        ("MCP_SANDBOX_POOL_MAX", "0".to_string()),
    ];
    let cold = cold_creates(&bin, &env_cold, &http, creates).await;
    let env_cold_plain: Vec<(&str, String)> = env_cold.iter().cloned().chain(no_quotas.iter().cloned()).collect();
    let cold_plain = Series::new("", cold_creates(&bin, &env_cold_plain, &http, creates).await);
    let baseline = Series::new("", baseline_create(&docker, &image, creates).await);

    let pooled = Series::new("", pooled);
    let cold = Series::new("", cold);
    let mcp = Series::new("", mcp);
    let sse = Series::new("", sse);
    let dexec = Series::new("", dexec);
    println!();
    println!("| figure | n | p50 ms | p99 ms | notes |");
    println!("|---|---|---|---|---|");
    let pooled_plain = Series::new("", pooled_plain);
    line(
        "create_sandbox from the warm pool",
        &pooled,
        &format!(
            "disk quotas on; {:.2} x the same without (p50)",
            pooled.pct(50.0) / pooled_plain.pct(50.0)
        ),
    );
    line(
        "create_sandbox from the warm pool, no disk quotas",
        &pooled_plain,
        "results_mb = packages_mb = 0",
    );
    line(
        "create_sandbox cold (pool off)",
        &cold,
        &format!(
            "{:.2} x baseline p50; disk quotas on",
            cold.pct(50.0) / baseline.pct(50.0)
        ),
    );
    line("create_sandbox cold, no disk quotas", &cold_plain, "");
    line("baseline: Engine API create + start", &baseline, "");
    line(
        "execute_python_code print(1) via /mcp",
        &mcp,
        &format!("{:.0} x faster than docker exec (p50)", dexec.pct(50.0) / mcp.pct(50.0)),
    );
    line("execute_python_code print(1) via /sse", &sse, "");
    line(
        "REST POST /api/sandboxes/{id}/python print(1)",
        &Series::new("", rest),
        "",
    );
    line("baseline: docker exec python3 -c 'print(1)'", &dexec, "");
    line(
        &format!("{clients} clients looping print(1), {secs} s"),
        &looped,
        &format!("{rate:.0} calls/s, {errors} errors"),
    );
    println!(
        "| install six, first time | 1 | {:.0} | | |",
        first.as_secs_f64() * 1000.0
    );
    println!(
        "| install six in a second sandbox | 1 | {:.0} | | no cache shared between tenants |",
        other.as_secs_f64() * 1000.0
    );
    println!(
        "| install six again, same sandbox | 1 | {:.0} | | already installed |",
        again.as_secs_f64() * 1000.0
    );
    let with = format!("with {} sandboxes", loop_ids.len());
    line(
        "REST GET /api/sandboxes (UI list, usage from Docker)",
        &Series::new("", ui_list),
        &with,
    );
    line("GET /metrics", &Series::new("", scrape), &with);
    let per_sandbox = mem.iter().sum::<f64>() / mem.len().max(1) as f64;
    println!();
    println!(
        "server RSS: {rss_idle:.1} MB idle, {rss_full:.1} MB with {} sandboxes",
        loop_ids.len()
    );
    println!(
        "host memory per idle sandbox (container cgroup): {per_sandbox:.1} MB (mean of {})",
        mem.len()
    );
}
