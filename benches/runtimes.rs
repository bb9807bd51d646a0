//! Cold creation of a real sandbox under each OCI runtime (runc, crun,
//! runsc), side by side: through the sandbox domain with the pool off (its
//! folders, capped disks, package volume and hardened container, created and
//! started), until its agent answers `echo ok`; and, as the baseline, the
//! engine's bare create + start of the same container configuration (read
//! back from a sandbox's own container, with a command that does nothing).
//! The runtimes take turns, one creation each, so that a machine whose load
//! drifts during the run weighs on all of them alike.
//!
//! `cargo bench --bench runtimes [-- --n 20 --runtimes runc,crun,runsc --network open]`
//! (Docker must run, with crun and runsc registered: `scripts/test` does it.)

mod common;

use std::time::{Duration, Instant};

use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder};
use bollard::Docker;
use common::{arg, Series};
use sandbox_actors::config::EgressPolicy;
use sandbox_actors::{Quota, Sandboxes, Settings, Work};

const OWNER: &str = "bench";
/// Marks the baseline containers of this run, which no server owns.
const BENCH_LABEL: &str = "io.mcp-sandbox.bench";

/// One runtime's server and what was measured with it.
struct Runtime {
    name: String,
    sandboxes: Sandboxes,
    _root: tempfile::TempDir,
    /// `create` answered (container created and started).
    created: Vec<Duration>,
    /// ... and the agent answered the first `echo ok`.
    answered: Vec<Duration>,
    /// Engine API create + start of the same configuration.
    engine: Vec<Duration>,
    failures: Vec<String>,
}

impl Runtime {
    /// A sandbox made cold, timed until created and until `echo ok` came
    /// back, then deleted (untimed).
    async fn sandbox(&mut self) {
        let t = Instant::now();
        let created = self
            .sandboxes
            .create(OWNER, None, Quota::UNLIMITED, Default::default())
            .await;
        let id = match created {
            Ok(info) => info.sandbox_id,
            Err(e) => return self.failures.push(format!("create: {e}")),
        };
        let created = t.elapsed();
        let echo = Work::Program(vec!["sh".into(), "-c".into(), "echo ok".into()]);
        match self.sandboxes.run(OWNER, id, echo, Some(60), None).await {
            Ok(ran) if ran.output.stdout == "ok\n" => {
                self.answered.push(t.elapsed());
                self.created.push(created);
            }
            Ok(ran) => self.failures.push(format!("echo ok: {:?}", ran.output)),
            Err(e) => self.failures.push(format!("echo ok: {e}")),
        }
        if let Err(e) = self.sandboxes.delete(OWNER, id).await {
            self.failures.push(format!("delete: {e}"));
        }
    }

    /// The configuration of a live sandbox's container, to make bare
    /// copies of: its image, user, environment, mounts, limits, network
    /// (networking disabled included) and runtime, with a command that only waits and this run's label instead
    /// of the server's (so that no server takes it for one of its own).
    async fn template(&mut self, docker: &Docker) -> Option<(ContainerCreateBody, uuid::Uuid)> {
        let info = self
            .sandboxes
            .create(OWNER, None, Quota::UNLIMITED, Default::default())
            .await
            .map_err(|e| self.failures.push(format!("template: {e}")))
            .ok()?;
        let inspect = docker
            .inspect_container(&format!("mcp-sandbox-{}", info.sandbox_id), None)
            .await
            .ok()?;
        let config = inspect.config?;
        let label = format!("runtimes-{}", std::process::id());
        let body = ContainerCreateBody {
            image: config.image,
            user: config.user,
            env: config.env,
            working_dir: config.working_dir,
            network_disabled: config.network_disabled,
            entrypoint: Some(vec!["sleep".into()]),
            cmd: Some(vec!["600".into()]),
            labels: Some([(BENCH_LABEL.to_string(), label)].into()),
            host_config: inspect.host_config,
            ..Default::default()
        };
        Some((body, info.sandbox_id))
    }

    async fn engine_baseline(&mut self, docker: &Docker, body: &ContainerCreateBody, i: usize) {
        let name = format!("mcp-sandbox-bench-{}-{}-{i}", std::process::id(), self.name);
        let options = CreateContainerOptionsBuilder::default().name(&name).build();
        let t = Instant::now();
        let made = async {
            let id = docker.create_container(Some(options), body.clone()).await?.id;
            docker.start_container(&id, None).await?;
            Ok::<_, bollard::errors::Error>(())
        }
        .await;
        let took = t.elapsed();
        match made {
            Ok(()) => self.engine.push(took),
            Err(e) => self.failures.push(format!("engine create + start: {e}")),
        }
        let rm = RemoveContainerOptionsBuilder::default().force(true).v(true).build();
        let _ = docker.remove_container(&name, Some(rm)).await;
    }
}

fn registered(docker_runtimes: &str, name: &str) -> bool {
    name == "runc" || docker_runtimes.contains(&format!("\"{name}\""))
}

#[tokio::main]
async fn main() {
    let n: usize = arg("--n", 20);
    let names: String = arg("--runtimes", "runc,crun,runsc".to_string());
    let network: String = arg("--network", "open".to_string());
    let policy: EgressPolicy = serde_json::from_value(serde_json::Value::String(network.clone()))
        .expect("--network: none, packages, allowlist or open");
    let docker = Docker::connect_with_local_defaults()
        .unwrap()
        .negotiate_version()
        .await
        .unwrap();
    let info = docker.info().await.expect("docker info");
    let known = serde_json::to_string(&info.runtimes.unwrap_or_default()).unwrap();

    let mut runtimes = vec![];
    for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !registered(&known, name) {
            println!("{name}: not registered with Docker, skipped (scripts/test registers crun and runsc)");
            continue;
        }
        let root = tempfile::tempdir().unwrap();
        let mut settings = Settings::under(root.path());
        settings.sandbox.runtime = name.to_string();
        settings.sandbox.network = policy;
        let sandboxes = Sandboxes::start(settings).await.expect("start (is Docker running?)");
        runtimes.push(Runtime {
            name: name.to_string(),
            sandboxes,
            _root: root,
            created: vec![],
            answered: vec![],
            engine: vec![],
            failures: vec![],
        });
    }

    // One untimed creation each: the image's layers in the page cache.
    for r in &mut runtimes {
        r.sandbox().await;
        r.created.clear();
        r.answered.clear();
    }
    for _ in 0..n {
        for r in &mut runtimes {
            r.sandbox().await;
        }
    }
    let mut templates = vec![];
    for r in &mut runtimes {
        templates.push(r.template(&docker).await);
    }
    for i in 0..n {
        for (r, template) in runtimes.iter_mut().zip(&templates) {
            if let Some((body, _)) = template {
                r.engine_baseline(&docker, body, i).await;
            }
        }
    }
    for (r, template) in runtimes.iter().zip(&templates) {
        if let Some((_, id)) = template {
            let _ = r.sandboxes.delete(OWNER, *id).await;
        }
        r.sandboxes.shutdown().await;
    }

    println!();
    println!("cold sandbox creation per OCI runtime, network {network}, n = {n} each (ms); pool off, disk quotas on");
    println!("| runtime | series | n | p50 | p95 | p99 | failures |\n|---|---|---|---|---|---|---|");
    for r in &runtimes {
        for (what, samples) in [
            ("create_sandbox (container created and started)", &r.created),
            ("create_sandbox + first `echo ok` answered", &r.answered),
            ("baseline: engine create + start, same config", &r.engine),
        ] {
            let s = Series::new(what, samples.clone());
            println!(
                "| {} | {what} | {} | {:.1} | {:.1} | {:.1} | {} |",
                r.name,
                s.n(),
                s.pct(50.0),
                s.pct(95.0),
                s.pct(99.0),
                r.failures.len()
            );
        }
    }
    for r in &runtimes {
        for f in r.failures.iter().take(5) {
            println!("{}: {f}", r.name);
        }
    }
}
