//! Shared by the benchmarks: latency statistics and a table printer.

#![allow(dead_code)]

pub mod cpu;
pub mod mcp;

use std::time::{Duration, Instant};

use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::Docker;
use futures_util::StreamExt;

/// Latencies of one measured series.
pub struct Series {
    pub name: String,
    samples: Vec<Duration>,
}

impl Series {
    pub fn new(name: impl Into<String>, mut samples: Vec<Duration>) -> Self {
        samples.sort();
        Self {
            name: name.into(),
            samples,
        }
    }

    pub fn n(&self) -> usize {
        self.samples.len()
    }

    /// The `p`-th percentile (nearest rank), in milliseconds.
    pub fn pct(&self, p: f64) -> f64 {
        if self.samples.is_empty() {
            return f64::NAN;
        }
        let rank = ((p / 100.0) * self.samples.len() as f64).ceil().max(1.0) as usize;
        self.samples[rank.min(self.samples.len()) - 1].as_secs_f64() * 1000.0
    }
}

pub fn header() {
    println!(
        "{:<52} {:>6} {:>10} {:>10} {:>10}",
        "series", "n", "p50 ms", "p95 ms", "p99 ms"
    );
}

/// A blank line, the header, and a row per series.
pub fn table(series: &[Series]) {
    println!();
    header();
    for s in series {
        row(s);
    }
}

pub fn row(s: &Series) {
    println!(
        "{:<52} {:>6} {:>10.3} {:>10.3} {:>10.3}",
        s.name,
        s.n(),
        s.pct(50.0),
        s.pct(95.0),
        s.pct(99.0)
    );
}

/// `--name value` from the command line, or `default`.
pub fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The baseline of an exec: `docker exec <container> python3 -c 'print(1)'`
/// through the Engine API.
pub async fn docker_exec(docker: &Docker, container: &str) -> Duration {
    let t = Instant::now();
    let options = CreateExecOptions {
        cmd: Some(vec!["python3", "-c", "print(1)"]),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        ..Default::default()
    };
    let exec = docker.create_exec(container, options).await.expect("create exec");
    if let StartExecResults::Attached { mut output, .. } = docker.start_exec(&exec.id, None).await.expect("start exec")
    {
        while output.next().await.is_some() {}
    }
    let code = docker.inspect_exec(&exec.id).await.expect("inspect").exit_code;
    assert_eq!(code, Some(0));
    t.elapsed()
}
