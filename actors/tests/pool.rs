//! The warm pool against the real engine (idle pausing is among the
//! runtime checks of `checks/`).

mod common;

use std::time::Duration;

use common::{docker, eventually, within, Harness, OWNER};
use sandbox_actors::Quota;

#[tokio::test(flavor = "multi_thread")]
async fn sandboxes_come_from_the_warm_pool_which_refills() {
    let mut h = Harness::with(|s| s.pool = sandbox_actors::config::PoolConfig::fixed(2)).await;
    eventually("the pool fills", || h.own_objects() == (2, 2)).await;
    // Pooled sandboxes belong to nobody and count against no quota.
    assert!(h.sb().list(OWNER).await.is_empty());
    let quota = Quota { per_owner: 1, total: 1 };
    let id = h
        .sb()
        .create(OWNER, Some("pooled".into()), quota, Default::default())
        .await
        .unwrap()
        .sandbox_id;
    let r = h.py(id, "print('warm')").await.output;
    assert_eq!(r.stdout, "warm\n");
    eventually("the pool refills", || h.own_objects() == (3, 3)).await;
    assert_eq!(h.sb().list(OWNER).await.len(), 1);
    assert!(
        h.sb().list("someone-else").await.is_empty(),
        "a claimed sandbox is its owner's alone"
    );

    // A stopped server removes what it pooled and keeps what it handed out.
    h.sandboxes.take().unwrap().shutdown().await;
    assert_eq!(h.own_objects(), (1, 1));
    // Without a pool now, so that nothing refills after the test has cleaned up.
    h.settings.pool = sandbox_actors::config::PoolConfig::fixed(0);
    h.restart().await;
    assert_eq!(h.sb().list(OWNER).await[0].sandbox_id, id);
}

/// Waits (at most three minutes) until the pool holds `n` warm sandboxes.
async fn pool_ready(h: &Harness, n: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    while h.sb().stats().await.pool.ready < n {
        assert!(std::time::Instant::now() < deadline, "the pool did not fill");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `n` creations at once by the test's tenant, named after `what`.
async fn burst(h: &Harness, n: usize, what: &str) -> Vec<uuid::Uuid> {
    let creations = (0..n).map(|i| {
        h.sb()
            .create(OWNER, Some(format!("{what} {i}")), Quota::UNLIMITED, Default::default())
    });
    futures_util::future::join_all(creations)
        .await
        .into_iter()
        .map(|r| r.expect("created").sandbox_id)
        .collect()
}

/// Checks that `ids` are distinct sandboxes, each running its own code.
async fn distinct_and_working(h: &Harness, ids: &[uuid::Uuid]) {
    let mut distinct = ids.to_vec();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), ids.len(), "a sandbox was handed out twice");
    let codes: Vec<String> = ids.iter().map(|id| format!("print('{id}')")).collect();
    let runs = ids.iter().zip(&codes).map(|(id, code)| h.py(*id, code));
    for (id, ran) in ids.iter().zip(futures_util::future::join_all(runs).await) {
        assert_eq!(ran.output.stdout, format!("{id}\n"), "{}", ran.output.stderr);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn thirty_concurrent_creations_from_a_pool_of_thirty_get_distinct_working_sandboxes() {
    const N: usize = 30;
    let mut h = Harness::with(|s| s.pool = sandbox_actors::config::PoolConfig::fixed(N)).await;
    pool_ready(&h, N).await;
    assert_eq!(h.own_objects(), (N, N));
    let ids = burst(&h, N, "burst").await;
    let stats = h.sb().stats().await.pool;
    assert_eq!(
        stats.claims as usize, N,
        "every creation was served from the pool: {stats:?}"
    );
    distinct_and_working(&h, &ids).await;
    within("the pool refills", Duration::from_secs(180), || {
        h.own_objects() == (2 * N, 2 * N)
    })
    .await;
    h.sandboxes.take().unwrap().shutdown().await;
    assert_eq!(h.own_objects(), (N, N), "a stopped server removes what it pooled");
    h.settings.pool = sandbox_actors::config::PoolConfig::off();
    h.restart().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_burst_past_the_pool_waits_for_the_pool_s_own_creations_and_gets_distinct_working_sandboxes() {
    const N: usize = 8;
    let mut h = Harness::with(|s| s.pool = sandbox_actors::config::PoolConfig::fixed(2)).await;
    pool_ready(&h, 2).await;
    let ids = burst(&h, N, "past the pool").await;
    let stats = h.sb().stats().await.pool;
    assert_eq!((stats.claims, stats.misses), (2, N as u64 - 2), "{stats:?}");
    // The claims that found it empty were served by the pool's creations:
    // the two it started with, one for each such claim.
    assert!(stats.refills as usize >= N, "{stats:?}");
    distinct_and_working(&h, &ids).await;
    within("the pool refills", Duration::from_secs(60), || {
        h.own_objects() == (N + 2, N + 2)
    })
    .await;
    h.sandboxes.take().unwrap().shutdown().await;
    assert_eq!(h.own_objects(), (N, N), "a stopped server removes what it pooled");
    h.settings.pool = sandbox_actors::config::PoolConfig::off();
    h.restart().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pooled_sandbox_that_died_is_never_handed_out() {
    let h = Harness::with(|s| s.pool = sandbox_actors::config::PoolConfig::fixed(1)).await;
    for _ in 0..600 {
        if h.sb().stats().await.pool.ready == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(h.sb().stats().await.pool.ready, 1, "the pool holds a ready sandbox");
    let filter = format!("label={}={}", sandbox_runtime::labels::SERVER, h.server_id);
    let pooled = docker(&["ps", "-q", "--no-trunc", "--filter", &filter])
        .trim()
        .to_string();
    let killed = std::process::Command::new("docker")
        .args(["kill", &pooled])
        .output()
        .unwrap();
    assert!(
        killed.status.success(),
        "{pooled:?}: {}",
        String::from_utf8_lossy(&killed.stderr)
    );
    eventually("the pooled container is dead", || {
        docker(&["inspect", "-f", "{{.State.Running}}", &pooled]).trim() != "true"
    })
    .await;
    // Before the pool's own periodic look: the claim must notice, throw the
    // dead one away and make a working sandbox instead.
    let id = h.create().await;
    let ran = h.py(id, "print('alive')").await;
    assert_eq!(ran.output.stdout, "alive\n");
    assert!(
        ran.notice.is_none(),
        "a fresh sandbox has nothing to report: {:?}",
        ran.notice
    );
    assert_ne!(h.container_of(id), pooled);
    eventually("the dead pooled sandbox is removed", || {
        docker(&["ps", "-aq", "--no-trunc", "--filter", &format!("id={pooled}")])
            .trim()
            .is_empty()
    })
    .await;
}

/// Frozen behind the server's back while it waited in the pool, a claimed
/// sandbox is seen as paused (its cgroup is read, the engine not asked) and
/// its first call thaws it.
#[tokio::test(flavor = "multi_thread")]
async fn a_pooled_sandbox_frozen_while_it_waited_is_seen_paused_and_thawed_by_its_first_call() {
    let h = Harness::with(|s| s.pool = sandbox_actors::config::PoolConfig::fixed(1)).await;
    pool_ready(&h, 1).await;
    let filter = format!("label={}={}", sandbox_runtime::labels::SERVER, h.server_id);
    let pooled = docker(&["ps", "-q", "--no-trunc", "--filter", &filter])
        .trim()
        .to_string();
    docker(&["pause", &pooled]);
    assert_eq!(docker(&["inspect", "-f", "{{.State.Paused}}", &pooled]).trim(), "true");
    let id = h.create().await;
    assert!(
        pooled.starts_with(&h.container_of(id)),
        "the pooled sandbox was claimed"
    );
    let listed = h.sb().list(OWNER).await;
    assert_eq!(listed[0].status.to_string(), "paused");
    let ran = tokio::time::timeout(Duration::from_secs(20), h.py(id, "print('thawed')"))
        .await
        .expect("the first call answers");
    assert_eq!(ran.output.stdout, "thawed\n", "{}", ran.output.stderr);
    assert_eq!(docker(&["inspect", "-f", "{{.State.Paused}}", &pooled]).trim(), "false");
}
