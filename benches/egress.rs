//! A ~20 MB download (a wheel from files.pythonhosted.org) from inside a
//! sandbox through the egress proxy (policy `packages`: in-sandbox relay,
//! unix socket, the server's proxy) against the same download from a
//! sandbox under `open` (the server's bridge network), alternating, in one
//! run. The time is taken inside the sandbox around the download.
//!
//! `cargo bench --bench egress [-- --n 5 --url URL]` (Docker must run;
//! `scripts/bench` provisions it).

mod common;

use std::path::PathBuf;

use common::arg;
use sandbox_actors::config::EgressPolicy;
use sandbox_actors::{CreateOptions, Quota, Sandboxes, Settings, Work};

const OWNER: &str = "bench";
const WHEEL: &str = "https://files.pythonhosted.org/packages/9a/d7/21d890274f75ea37a8209d5519e72da3da90302e3b9fb8397a0918386a62/scipy-1.18.1-cp313-cp313-macosx_14_0_arm64.whl";

#[tokio::main]
async fn main() {
    let n: usize = arg("--n", 5);
    let url: String = arg("--url", WHEEL.to_string());
    let root = tempfile::tempdir().unwrap();
    let ca = PathBuf::from("/etc/ssl/certs/ca-certificates.crt");
    let mut settings = Settings::under(root.path());
    settings.sandbox.ca_bundle = ca.is_file().then_some(ca);
    // The cost of the path is measured, not the bytes cap (which under
    // `open` is a sustained rate the kernel holds).
    settings.sandbox.egress_mb_per_minute = 1 << 20;
    let sandboxes = Sandboxes::start(settings).await.expect("start (is Docker running?)");
    let mut ids = vec![];
    for egress in [EgressPolicy::Open, EgressPolicy::Packages] {
        let options = CreateOptions {
            egress: Some(egress),
            ..Default::default()
        };
        let info = sandboxes.create(OWNER, None, Quota::UNLIMITED, options).await.unwrap();
        ids.push((egress, info.sandbox_id));
    }
    let code = format!(
        "import time, urllib.request\nt = time.perf_counter()\nn = 0\nwith urllib.request.urlopen({url:?}, timeout=120) as r:\n    while chunk := r.read(1 << 16):\n        n += len(chunk)\nprint(n, time.perf_counter() - t)"
    );
    let mut seconds: Vec<Vec<f64>> = vec![vec![], vec![]];
    let mut bytes = 0u64;
    // One warm-up each, then alternating rounds.
    for round in 0..=n {
        for (i, (_, id)) in ids.iter().enumerate() {
            let ran = sandboxes
                .run(OWNER, *id, Work::Python(code.clone()), Some(300), None)
                .await
                .unwrap()
                .output;
            assert_eq!(ran.exit_code, 0, "{}", ran.stderr);
            let mut parts = ran.stdout.split_whitespace();
            bytes = parts.next().unwrap().parse().unwrap();
            let took: f64 = parts.next().unwrap().parse().unwrap();
            if round > 0 {
                seconds[i].push(took);
            }
        }
    }
    for (_, id) in &ids {
        sandboxes.delete(OWNER, *id).await.unwrap();
    }
    sandboxes.shutdown().await;

    println!(
        "\ndownload of {:.1} MB, {n} rounds each, alternating",
        bytes as f64 / 1e6
    );
    println!("{:<44} {:>10} {:>10} {:>10}", "series", "p50 s", "max s", "MB/s p50");
    let mut p50s = vec![];
    for (i, (egress, _)) in ids.iter().enumerate() {
        let mut s = seconds[i].clone();
        s.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let p50 = s[(s.len() - 1) / 2];
        p50s.push(p50);
        let name = match egress {
            EgressPolicy::Open => "open: the server's bridge network",
            _ => "packages: through the egress proxy",
        };
        println!(
            "{:<44} {:>10.3} {:>10.3} {:>10.1}",
            name,
            p50,
            s.last().unwrap(),
            bytes as f64 / 1e6 / p50
        );
    }
    println!("proxy / open (p50): {:.2}", p50s[1] / p50s[0]);
}
