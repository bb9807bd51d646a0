//! Usage by tenant: accrued from the runtime's counters every sample, kept
//! across a restart and the sandbox's deletion. (Pausing runs on the wall
//! clock: paused time is tested against the engine, `actors/tests/usage.rs`.)

use std::time::Duration;

use super::{pass, Server, OWNER};
use crate::moment;
use crate::Quota;
use sandbox_runtime::Usage;

const OTHER: &str = "other";

fn busy(cpu_seconds: f64) -> Usage {
    Usage {
        cpu_seconds,
        memory_bytes: 500_000_000,
        memory_limit_bytes: 0,
        network_bytes: Some(4_000),
    }
}

#[tokio::test(start_paused = true)]
async fn usage_goes_to_its_tenant_by_state_and_outlives_restarts_and_deletion() {
    let mut s = Server::start().await;
    let mine = s.create().await;
    let theirs = s
        .sb()
        .create(OTHER, None, Quota::UNLIMITED, Default::default())
        .await
        .unwrap()
        .sandbox_id;
    s.stdout(mine, "set x 1").await;
    s.fake.set_usage(mine, busy(5.0));
    // Two samples (15 s apart) while both run.
    pass(Duration::from_secs(31)).await;
    let (used, renews) = s.sb().usage_this_month(OWNER);
    assert!(renews > moment::now());
    assert_eq!(
        (used.cpu_seconds, used.egress_bytes, used.calls),
        (5.0, 4_000, 1),
        "{used:?}"
    );
    // A new sandbox counts from its creation, on the wall clock, which the
    // paused clock leaves behind: one interval at least, two at most.
    assert!((14.0..=31.0).contains(&used.running_seconds), "{used:?}");
    assert!((7.0..=16.0).contains(&used.memory_gb_seconds), "{used:?}");
    let (other, _) = s.sb().usage_this_month(OTHER);
    assert_eq!(
        other.cpu_seconds, 0.0,
        "another tenant's CPU is not counted here: {other:?}"
    );
    assert!(other.running_seconds >= 14.0, "{other:?}");

    // A restarted server keeps the figures, and counts an adopted sandbox
    // from its counters as they stand (the earlier server counted up to its
    // last sample).
    s.restart().await;
    assert_eq!(s.sb().usage_this_month(OWNER).0.cpu_seconds, 5.0);
    s.fake.set_usage(mine, busy(6.0));
    pass(Duration::from_secs(16)).await;
    s.fake.set_usage(mine, busy(8.0));
    pass(Duration::from_secs(16)).await;
    assert_eq!(s.sb().usage_this_month(OWNER).0.cpu_seconds, 7.0);

    // Deleting the sandbox keeps what it used; the report shows each
    // tenant its own rows only.
    s.sb().delete(OWNER, mine).await.unwrap();
    s.sb().delete(OTHER, theirs).await.unwrap();
    assert_eq!(s.sb().usage_this_month(OWNER).0.cpu_seconds, 7.0);
    let rows = s.sb().usage_report(OWNER, 0, u64::MAX / 2).await.unwrap();
    assert!(!rows.is_empty() && rows.iter().all(|r| r.tenant == OWNER), "{rows:?}");
    let everyone = s
        .sb()
        .usage_report(crate::Scope::Everyone, 0, u64::MAX / 2)
        .await
        .unwrap();
    assert!(everyone.iter().any(|r| r.tenant == OTHER), "{everyone:?}");
}

/// The attack: a sandbox restarted (by its owner, an OOM kill, or its first
/// process ending) just before each sample keeps its container id while the
/// cgroup's and the interface's counters start again from zero. What the
/// counters show after such a drop was used since it, and is billed.
#[tokio::test(start_paused = true)]
async fn counters_that_start_again_from_zero_are_billed_not_lost() {
    let s = Server::start().await;
    let id = s.create().await;
    s.fake.set_usage(id, busy(10.0));
    pass(Duration::from_secs(16)).await;
    assert_eq!(s.sb().usage_this_month(OWNER).0.cpu_seconds, 10.0);
    let restarted = Usage {
        network_bytes: Some(1_000),
        ..busy(4.0)
    };
    s.fake.set_usage(id, restarted);
    pass(Duration::from_secs(16)).await;
    let (used, _) = s.sb().usage_this_month(OWNER);
    assert_eq!((used.cpu_seconds, used.egress_bytes), (14.0, 5_000), "{used:?}");
}

/// A restart asked for just before each sample: what the sandbox used up
/// to it is read before its counters start again.
#[tokio::test(start_paused = true)]
async fn a_restart_reads_the_counters_before_they_start_again() {
    let s = Server::start().await;
    let id = s.create().await;
    s.fake.set_usage(id, busy(10.0));
    s.sb().restart(OWNER, id).await.unwrap();
    s.fake.set_usage(id, busy(1.0));
    pass(Duration::from_secs(16)).await;
    assert_eq!(s.sb().usage_this_month(OWNER).0.cpu_seconds, 11.0);
}

/// What a sandbox's snapshots hold on the host's disk is billed as its
/// disk is.
#[tokio::test(start_paused = true)]
async fn the_disk_its_snapshots_hold_is_billed() {
    let s = Server::start().await;
    let id = s.create().await;
    let results = s.settings.results_dir.join(id.to_string());
    std::fs::write(results.join("data.bin"), vec![7u8; 4 << 20]).unwrap();
    pass(Duration::from_secs(16)).await;
    assert_eq!(
        s.sb().usage_this_month(OWNER).0.disk_gb_hours,
        0.0,
        "no capped disks here"
    );
    s.sb().snapshot(OWNER, id, None).await.unwrap();
    pass(Duration::from_secs(32)).await;
    let billed = s.sb().usage_this_month(OWNER).0.disk_gb_hours;
    assert!(billed > 0.0, "{billed}");
}

/// The attack: installs run (source builds included) in an installer
/// container when the sandbox's policy does not reach the index, outside
/// the sandbox's cgroup and interface. What that container used is billed
/// to the sandbox's tenant.
#[tokio::test(start_paused = true)]
async fn an_installer_container_s_use_is_billed_to_its_sandbox_s_tenant() {
    let s = Server::with(|st| st.sandbox.network = crate::EgressPolicy::None).await;
    let id = s.create().await;
    let used = Usage {
        cpu_seconds: 7.0,
        network_bytes: Some(9_000),
        ..Usage::default()
    };
    s.fake.set_installer_usage(id, used);
    let status = s.sb().install(OWNER, id, "six", Duration::from_secs(60)).await.unwrap();
    assert_eq!(status.status, crate::InstallStatusKind::Success, "{status:?}");
    let (billed, _) = s.sb().usage_this_month(OWNER);
    assert_eq!((billed.cpu_seconds, billed.egress_bytes), (7.0, 9_000), "{billed:?}");
}

/// A sandbox made, worked and deleted between two samples is read once
/// more as it goes: a tenant cannot dodge the meter (and its budgets) by
/// keeping each sandbox shorter than the sampling interval.
#[tokio::test(start_paused = true)]
async fn a_sandbox_deleted_between_samples_is_still_counted() {
    let s = Server::start().await;
    let id = s.create().await;
    s.fake.set_usage(id, busy(2.5));
    s.sb().delete(OWNER, id).await.unwrap();
    let (used, _) = s.sb().usage_this_month(OWNER);
    assert_eq!((used.cpu_seconds, used.egress_bytes), (2.5, 4_000), "{used:?}");
}
