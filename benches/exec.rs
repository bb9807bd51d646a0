//! `print(1)` through the sandbox actor and the in-container agent, against
//! the baseline of a raw `docker exec <container> python3 -c 'print(1)'`
//! (Engine API) in the same container, in the same run.
//!
//! `cargo bench --bench exec [-- --n 500 --baseline-n 100]` (Docker must run;
//! `scripts/bench` provisions it).

mod common;

use std::time::Instant;

use bollard::Docker;
use common::{arg, docker_exec, header, row, Series};
use sandbox_actors::{Sandboxes, Settings, Work};

const OWNER: &str = "bench";

#[tokio::main]
async fn main() {
    let n: usize = arg("--n", 500);
    let baseline_n: usize = arg("--baseline-n", 100);
    let root = tempfile::tempdir().unwrap();
    let settings = Settings::under(root.path());
    let sandboxes = Sandboxes::start(settings).await.expect("start (is Docker running?)");
    let id = sandboxes
        .create(
            OWNER,
            Some("bench".into()),
            sandbox_actors::Quota::UNLIMITED,
            Default::default(),
        )
        .await
        .unwrap()
        .sandbox_id;
    let run = || sandboxes.run(OWNER, id, Work::Python("print(1)".into()), None, None);
    for _ in 0..20 {
        run().await.unwrap();
    }
    let mut ours = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let out = run().await.unwrap();
        ours.push(t.elapsed());
        assert_eq!(out.output.stdout, "1\n");
    }

    // The artifact scan with thousands of files in /app/results.
    let files: usize = arg("--files", 5000);
    let make = format!(
        "import os\nos.makedirs('many', exist_ok=True)\nfor i in range({files}):\n    open(f'many/f{{i}}.txt', 'w').write('x')"
    );
    let made = sandboxes
        .run(OWNER, id, Work::Python(make), Some(120), None)
        .await
        .unwrap();
    assert_eq!(made.output.exit_code, 0, "{}", made.output.stderr);
    let mut crowded = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        run().await.unwrap();
        crowded.push(t.elapsed());
    }

    let docker = Docker::connect_with_local_defaults()
        .unwrap()
        .negotiate_version()
        .await
        .unwrap();
    let container = format!("mcp-sandbox-{id}");
    docker_exec(&docker, &container).await;
    let mut baseline = Vec::with_capacity(baseline_n);
    for _ in 0..baseline_n {
        baseline.push(docker_exec(&docker, &container).await);
    }
    sandboxes.delete(OWNER, id).await.unwrap();
    sandboxes.shutdown().await;

    let ours = Series::new("execute print(1): actor + agent", ours);
    let crowded = Series::new(format!("the same with {files} files in /app/results"), crowded);
    let base = Series::new("baseline: docker exec python3 -c 'print(1)'", baseline);
    println!();
    header();
    row(&ours);
    row(&crowded);
    row(&base);
    println!("p50 speed-up over docker exec: {:.0}x", base.pct(50.0) / ours.pct(50.0));
}
