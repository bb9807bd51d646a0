//! Usage by tenant against the real engine: the CPU a run burns is read
//! from its container's cgroup and goes to its tenant alone; a paused
//! sandbox accrues paused time and no CPU.

mod common;

use std::time::Duration;

use common::{within, Harness, OWNER};
use sandbox_actors::{Quota, SandboxStatus};

#[tokio::test(flavor = "multi_thread")]
async fn a_busy_run_is_billed_to_its_tenant_and_a_paused_sandbox_burns_no_cpu() {
    let h = Harness::with(|s| {
        s.usage.sample_seconds = 5;
        s.sandbox.pause_after_seconds = 4;
    })
    .await;
    let id = h.create().await;
    let other = h
        .sb()
        .create("other", None, Quota::UNLIMITED, Default::default())
        .await
        .unwrap()
        .sandbox_id;
    // Five seconds of CPU, however long a busy host takes to give them.
    let busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 5: pass";
    h.py_t(id, busy, Some(120)).await;
    let cpu = |tenant: &str| h.sb().usage_this_month(tenant).0.cpu_seconds;
    within("the run's CPU and call are counted", Duration::from_secs(30), || {
        let (mine, _) = h.sb().usage_this_month(OWNER);
        mine.cpu_seconds >= 4.5 && mine.calls == 1
    })
    .await;
    let (mine, _) = h.sb().usage_this_month(OWNER);
    assert!(mine.cpu_seconds <= 8.0, "{mine:?}");
    assert!(mine.calls == 1 && mine.exec_seconds >= 4.5, "{mine:?}");
    assert!(cpu("other") < 1.0, "the other tenant idled: {}", cpu("other"));

    // Idle past `pause_after_seconds`, the sandbox is paused: its time
    // accrues as paused, and its CPU stands still.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while h.sb().info(OWNER, id).await.unwrap().status != SandboxStatus::Paused {
        assert!(std::time::Instant::now() < deadline, "never paused");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let before = h.sb().usage_this_month(OWNER).0;
    tokio::time::sleep(Duration::from_secs(11)).await;
    let after = h.sb().usage_this_month(OWNER).0;
    assert!(
        after.paused_seconds - before.paused_seconds >= 5.0,
        "{before:?} {after:?}"
    );
    assert!(after.cpu_seconds - before.cpu_seconds < 0.5, "{before:?} {after:?}");
    h.sb().delete("other", other).await.unwrap();
}
