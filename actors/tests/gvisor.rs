//! A sandbox under runsc runs code on gVisor's kernel, against the real
//! engine. A test binary of its own, so that it runs alone: under the load
//! of other tests' sandboxes, gVisor's ptrace platform has been seen to end
//! a sandbox (exit code 2), which the server then restarts, losing the test's
//! Python state.

mod common;

use common::{Harness, OWNER};
use sandbox_actors::config::EgressPolicy;

#[tokio::test(flavor = "multi_thread")]
async fn a_gvisor_sandbox_runs_code_on_the_gvisor_kernel() {
    if !common::runtime_available("runsc") {
        return;
    }
    let h = Harness::on("runsc", |s| s.sandbox.network = EgressPolicy::None).await;
    let id = h.create().await;
    let r = h
        .py(id, "import platform\nx = 21\nprint(platform.release())")
        .await
        .output;
    assert_eq!(r.stdout.trim(), "4.4.0", "gVisor reports its own kernel: {r:?}");
    let r = h.sh(id, "dmesg 2>/dev/null | head -1; echo done", None).await.output;
    assert!(r.stdout.contains("done"));
    let r = h.py(id, "print(x * 2)").await;
    assert_eq!(r.output.stdout, "42\n", "state persists under gVisor: {r:?}");
    let made = h.py(id, "open('g.txt', 'w').write('1')").await.output;
    assert_eq!(
        made.files,
        vec!["/app/results/g.txt"],
        "changed files are reported under gVisor too"
    );
    h.install_ok(id, "six").await;
    let r = h.py(id, "import six; print('ok')").await;
    assert_eq!(r.output.stdout, "ok\n", "the package is importable: {r:?}");
    h.sb().delete(OWNER, id).await.unwrap();
    assert_eq!(h.own_objects(), (0, 0));
}
