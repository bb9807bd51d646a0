//! The warm pool: claims, refills, pooled containers that die while they
//! wait, and removals that meet an engine that is down.

use std::time::Duration;

use super::{pass, until, Server, OWNER};
use crate::config::{PoolConfig, PoolMin};
use crate::{CreateOptions, EgressPolicy, Quota};
use sandbox_runtime::fake::Event;

fn creations(s: &Server) -> usize {
    s.fake.count(|e| matches!(e, Event::Created { .. }))
}

#[tokio::test(start_paused = true)]
async fn a_claim_takes_a_warm_sandbox_and_the_pool_refills() {
    let s = Server::with(|st| st.pool = PoolConfig::fixed(2)).await;
    until("the pool is full", || s.sb().pool_ready() == 2).await;
    assert_eq!(creations(&s), 2);
    // Every pooled sandbox ran its warm-up before it was counted ready.
    let pooled: Vec<_> = s.fake.containers();
    for (_, sandbox) in &pooled {
        assert_eq!(s.fake.execs(*sandbox).first().map(|(w, _)| w.as_str()), Some("pass"));
    }
    let id = s.create().await;
    assert!(pooled.iter().any(|(_, sb)| *sb == id), "the claim made a new container");
    until("the pool refills", || s.sb().pool_ready() == 2).await;
    assert_eq!(creations(&s), 3);
    assert_eq!(s.stdout(id, "echo mine").await, "echo mine\n");
}

/// A claim is a few steps in the server only: the sandbox's actor neither
/// asks the engine about the container its creation just started nor opens
/// a connection of its own to the agent (it takes the pool's).
#[tokio::test(start_paused = true)]
async fn a_claimed_sandbox_s_first_call_asks_the_engine_nothing_and_reuses_the_pool_s_connection() {
    let s = Server::with(|st| st.pool = PoolConfig::fixed(1)).await;
    until("the pool is full", || s.sb().pool_ready() == 1).await;
    let (_, pooled) = s.fake.containers().remove(0);
    let connections = |sandbox| s.fake.count(|e| *e == Event::AgentConnected(sandbox));
    assert_eq!(connections(pooled), 1, "the pool's own connection");
    let inspections = s.fake.inspections();
    let id = s.create().await;
    assert_eq!(id, pooled);
    assert_eq!(s.stdout(id, "echo mine").await, "echo mine\n");
    assert_eq!(connections(id), 1, "the first call made a connection of its own");
    assert_eq!(
        s.fake.inspections(),
        inspections,
        "the claim asked the engine about its container"
    );
}

/// Frozen behind the server's back while it waited in the pool (`docker
/// pause`), a claimed sandbox is found so without an inspection, and its
/// first call thaws it.
#[tokio::test(start_paused = true)]
async fn a_pooled_container_frozen_while_it_waited_is_thawed_by_its_first_call() {
    let s = Server::with(|st| st.pool = PoolConfig::fixed(1)).await;
    until("the pool is full", || s.sb().pool_ready() == 1).await;
    let (container, pooled) = s.fake.containers().remove(0);
    s.fake.freeze(&container);
    let id = s.create().await;
    assert_eq!(id, pooled);
    let listed = s.sb().list(OWNER).await;
    assert_eq!(listed[0].status, crate::status::SandboxStatus::Paused, "seen as it is");
    assert_eq!(s.stdout(id, "echo thawed").await, "echo thawed\n");
    assert_eq!(s.fake.count(|e| *e == Event::Unpaused(container.clone())), 1);
}

#[tokio::test(start_paused = true)]
async fn a_pooled_container_that_died_is_never_handed_out() {
    let s = Server::with(|st| st.pool = PoolConfig::fixed(1)).await;
    until("the pool is full", || s.sb().pool_ready() == 1).await;
    let (dead, dead_sandbox) = s.fake.containers().remove(0);
    s.fake.kill(&dead, false);
    let id = s.create().await;
    assert_ne!(id, dead_sandbox);
    until("the dead one is removed", || {
        !s.fake.containers().iter().any(|(c, _)| *c == dead)
    })
    .await;
    assert_eq!(s.stdout(id, "echo fresh").await, "echo fresh\n");
}

#[tokio::test(start_paused = true)]
async fn the_removal_of_a_dead_pooled_container_outlasts_an_engine_restart() {
    let s = Server::with(|st| st.pool = PoolConfig::fixed(1)).await;
    until("the pool is full", || s.sb().pool_ready() == 1).await;
    let (dead, _) = s.fake.containers().remove(0);
    s.fake.kill(&dead, false);
    s.fake.set_engine_down(true);
    // The pool's prune finds it dead and fails to remove it while down.
    pass(Duration::from_secs(20)).await;
    assert!(s.fake.containers().iter().any(|(c, _)| *c == dead));
    s.fake.set_engine_down(false);
    until("removed once the engine is back", || {
        !s.fake.containers().iter().any(|(c, _)| *c == dead)
    })
    .await;
    let volumes = s.fake.volumes();
    assert!(volumes.len() <= 1, "the dead one's volume is left: {volumes:?}");
}

#[tokio::test(start_paused = true)]
async fn a_policy_the_pool_cannot_serve_is_created_cold() {
    let s = Server::with(|st| st.pool = PoolConfig::fixed(1)).await;
    until("the pool is full", || s.sb().pool_ready() == 1).await;
    let options = CreateOptions {
        egress: Some(EgressPolicy::None),
        ..Default::default()
    };
    let info = s.sb().create(OWNER, None, Quota::UNLIMITED, options).await.unwrap();
    assert_eq!(
        s.sb().pool_ready(),
        1,
        "the pooled one was kept for the server's policy"
    );
    assert_eq!(creations(&s), 2);
    assert_eq!(s.stdout(info.sandbox_id, "echo cold").await, "echo cold\n");
}

#[tokio::test(start_paused = true)]
async fn a_stop_removes_what_nobody_claimed() {
    let mut s = Server::with(|st| st.pool = PoolConfig::fixed(2)).await;
    until("the pool is full", || s.sb().pool_ready() == 2).await;
    let id = s.create().await;
    s.sandboxes.take().unwrap().shutdown().await;
    let left: Vec<_> = s.fake.containers().into_iter().map(|(_, sb)| sb).collect();
    assert_eq!(left, vec![id], "only the claimed sandbox outlives the stop");
    assert_eq!(s.fake.volumes().len(), 1);
    s.restart().await;
    assert_eq!(s.stdout(id, "echo adopted").await, "echo adopted\n");
}

#[tokio::test(start_paused = true)]
async fn concurrent_claims_each_get_a_sandbox_of_their_own() {
    let s = Server::with(|st| st.pool = PoolConfig::fixed(2)).await;
    until("the pool is full", || s.sb().pool_ready() == 2).await;
    let claims = (0..6).map(|_| s.sb().create(OWNER, None, Quota::UNLIMITED, Default::default()));
    let ids: Vec<_> = futures_util::future::join_all(claims)
        .await
        .into_iter()
        .map(|r| r.unwrap().sandbox_id)
        .collect();
    let mut distinct = ids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 6, "a pooled sandbox was handed out twice");
    let mut containers: Vec<_> = ids.iter().map(|id| s.container(*id)).collect();
    containers.sort();
    containers.dedup();
    assert_eq!(containers.len(), 6);
    until("the pool refills", || s.sb().pool_ready() == 2).await;
    assert_eq!(s.fake.containers().len(), 8);
    for id in ids {
        assert_eq!(s.stdout(id, "echo own").await, "echo own\n");
    }
}

/// `n` creations at once by the test's tenant.
async fn burst(s: &Server, n: usize) -> Vec<uuid::Uuid> {
    let claims = (0..n).map(|_| s.sb().create(OWNER, None, Quota::UNLIMITED, Default::default()));
    futures_util::future::join_all(claims)
        .await
        .into_iter()
        .map(|r| r.unwrap().sandbox_id)
        .collect()
}

fn adaptive(min: usize, max: usize) -> PoolConfig {
    PoolConfig {
        min: PoolMin::Fixed(min),
        max,
        shrink_after_seconds: 120,
        ..PoolConfig::default()
    }
}

#[tokio::test(start_paused = true)]
async fn a_burst_grows_the_pool_to_its_size_and_quiet_shrinks_it_slowly() {
    let s = Server::with(|st| st.pool = adaptive(1, 10)).await;
    until("the pool holds its minimum", || s.sb().pool_ready() == 1).await;
    let ids = burst(&s, 6).await;
    let stats = s.sb().stats().await.pool;
    assert_eq!((stats.claims, stats.misses), (1, 5), "{stats:?}");
    assert_eq!(stats.target, 6, "the target grows at once to the burst");
    until("the pool grows to the burst", || s.sb().pool_ready() == 6).await;
    // Within the quiet period it stays; after it, it steps down a little at a time.
    pass(Duration::from_secs(100)).await;
    assert_eq!(s.sb().pool_ready(), 6);
    pass(Duration::from_secs(30)).await;
    let stepping = s.sb().pool_ready();
    assert!((2..6).contains(&stepping), "{stepping}");
    until("back at the minimum", || s.sb().pool_ready() == 1).await;
    assert_eq!(s.sb().stats().await.pool.target, 1);
    // What it gave back was removed, not leaked.
    until("the surplus is removed", || s.fake.containers().len() == ids.len() + 1).await;
    // The next burst of that size is served from the pool.
    for id in ids {
        s.sb().delete(OWNER, id).await.unwrap();
    }
    let _ = burst(&s, 1).await;
    until("the pool grows again", || s.sb().pool_ready() >= 1).await;
}

#[tokio::test(start_paused = true)]
async fn the_pool_never_holds_more_than_max_or_the_room_under_the_server_s_cap() {
    let s = Server::with(|st| {
        st.pool = adaptive(2, 4);
        st.max_sandboxes_total = 9;
    })
    .await;
    until("the pool holds its minimum", || s.sb().pool_ready() == 2).await;
    let first = burst(&s, 5).await;
    until("the pool grows to max", || s.sb().pool_ready() == 4).await;
    pass(Duration::from_secs(5)).await;
    assert_eq!(s.sb().pool_ready(), 4, "never past max");
    // Seven live sandboxes leave room for two pooled ones: the pool gives
    // back what a tenant's creation could need.
    let _more = burst(&s, 2).await;
    until("the pool fits the room", || s.sb().pool_ready() == 2).await;
    pass(Duration::from_secs(10)).await;
    assert_eq!(s.sb().pool_ready(), 2);
    assert!(s.fake.containers().len() <= 9, "{}", s.fake.containers().len());
    for id in first {
        s.sb().delete(OWNER, id).await.unwrap();
    }
    until("room again: the pool grows back", || s.sb().pool_ready() == 4).await;
}

/// A burst of `n` creations by the test's tenant, each with the paused
/// time it took to be answered, in the order the claims were made.
async fn timed_burst(s: &Server, n: usize) -> Vec<Duration> {
    let start = tokio::time::Instant::now();
    let claims = (0..n).map(|_| async {
        s.sb()
            .create(OWNER, None, Quota::UNLIMITED, Default::default())
            .await
            .unwrap();
        start.elapsed()
    });
    futures_util::future::join_all(claims).await
}

#[tokio::test(start_paused = true)]
async fn a_burst_past_the_pool_is_served_in_order_a_few_creations_at_a_time() {
    let s = Server::with(|st| st.pool = adaptive(1, 4)).await;
    until("the pool holds its minimum", || s.sb().pool_ready() == 1).await;
    s.fake.set_create_delay(Duration::from_secs(1));
    let created_before = creations(&s);
    let took = timed_burst(&s, 9).await;
    // One from the pool at once; then the pool's creations, four at a
    // time, each ending in one creation's time and serving the oldest
    // claims first: four answered within the first round, four in the
    // second. (Nine started together would all have ended together.)
    assert!(took.windows(2).all(|w| w[0] <= w[1]), "oldest claim first: {took:?}");
    assert!(took[0] < Duration::from_millis(100), "{took:?}");
    assert!(took[4] < Duration::from_secs(2), "the first round: {took:?}");
    assert!(
        took[5] >= Duration::from_secs(2) && took[8] < Duration::from_secs(3),
        "{took:?}"
    );
    // Then the pool refills to the burst's size, bounded by max.
    until("the pool refills to max", || s.sb().pool_ready() == 4).await;
    pass(Duration::from_secs(5)).await;
    assert_eq!(
        creations(&s) - created_before,
        8 + 4,
        "the claims' eight and the pool's four"
    );
}

#[tokio::test(start_paused = true)]
async fn a_claim_whose_caller_left_gives_up_its_place_and_the_sandbox_made_stays_in_the_pool() {
    let s = Server::with(|st| st.pool = PoolConfig::fixed(1)).await;
    until("the pool is full", || s.sb().pool_ready() == 1).await;
    s.fake.set_create_delay(Duration::from_secs(1));
    let _first = s.create().await;
    // The second claim waits for a refill; its caller leaves first.
    let left = tokio::time::timeout(Duration::from_millis(500), s.create()).await;
    assert!(left.is_err(), "answered before its sandbox could be made");
    until("a sandbox waits in the pool again", || s.sb().pool_ready() == 1).await;
    pass(Duration::from_secs(5)).await;
    // The refill that ended first went to the pool: had the claim kept its
    // place, that one would have been recorded for nobody and removed, and
    // the second refill pooled instead.
    let made: Vec<uuid::Uuid> = s
        .fake
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Created { sandbox, .. } => Some(sandbox),
            _ => None,
        })
        .collect();
    assert_eq!(made.len(), 3, "the pooled one, and a refill for each claim: {made:?}");
    let left: Vec<uuid::Uuid> = s.fake.containers().into_iter().map(|(_, sb)| sb).collect();
    assert!(left.contains(&made[1]) && !left.contains(&made[2]), "{made:?} {left:?}");
    assert_eq!(
        s.sb().list(OWNER).await.len(),
        1,
        "nothing recorded for the caller that left"
    );
}

#[tokio::test(start_paused = true)]
async fn a_sandbox_made_for_a_waiting_claim_skips_the_worker_warm_up_and_one_made_for_the_pool_does_not() {
    let s = Server::with(|st| st.pool = PoolConfig::fixed(1)).await;
    until("the pool is full", || s.sb().pool_ready() == 1).await;
    s.fake.set_create_delay(Duration::from_secs(1));
    let ids = burst(&s, 3).await;
    let warmed = |id: uuid::Uuid| s.fake.execs(id).first().is_some_and(|(w, _)| w == "pass");
    let warmed_claims = ids.iter().filter(|id| warmed(**id)).count();
    assert_eq!(warmed_claims, 1, "only the one that was ready before the burst");
    until("the pool refills", || s.sb().pool_ready() == 1).await;
    let pooled: Vec<_> = s
        .fake
        .containers()
        .into_iter()
        .map(|(_, sb)| sb)
        .filter(|sb| !ids.contains(sb))
        .collect();
    assert_eq!(pooled.len(), 1);
    assert!(warmed(pooled[0]), "a sandbox made for the pool is warmed");
}

#[tokio::test(start_paused = true)]
async fn waiting_claims_are_answered_when_the_engine_fails_every_creation() {
    let s = Server::with(|st| st.pool = PoolConfig::fixed(1)).await;
    until("the pool is full", || s.sb().pool_ready() == 1).await;
    s.fake.set_engine_down(true);
    let claims = (0..3).map(|_| s.sb().create(OWNER, None, Quota::UNLIMITED, Default::default()));
    let answered = tokio::time::timeout(Duration::from_secs(60), futures_util::future::join_all(claims))
        .await
        .expect("every waiting claim is answered");
    let served = answered.iter().filter(|a| a.is_ok()).count();
    assert_eq!(served, 1, "the pooled one, and no other while the engine is down");
    s.fake.set_engine_down(false);
    let id = s.create().await;
    assert_eq!(s.stdout(id, "echo back").await, "echo back\n");
}

#[tokio::test(start_paused = true)]
async fn a_claim_waiting_when_the_server_stops_is_answered() {
    let mut s = Server::with(|st| st.pool = PoolConfig::fixed(1)).await;
    until("the pool is full", || s.sb().pool_ready() == 1).await;
    s.fake.set_create_delay(Duration::from_secs(30));
    let _first = s.create().await;
    let sandboxes = s.sandboxes.take().unwrap();
    let waiting = sandboxes.create(OWNER, None, Quota::UNLIMITED, Default::default());
    let stop = async {
        pass(Duration::from_secs(1)).await;
        sandboxes.shutdown().await;
    };
    let (answer, ()) = tokio::time::timeout(Duration::from_secs(60), async { tokio::join!(waiting, stop) })
        .await
        .expect("the waiting claim is answered");
    assert!(answer.is_err(), "a stopping server made no sandbox for it");
}

#[tokio::test(start_paused = true)]
async fn refills_run_in_parallel_and_a_claim_that_finds_the_pool_empty_does_not_wait_behind_them() {
    let s = Server::with(|st| st.pool = adaptive(8, 8)).await;
    s.fake.set_create_delay(Duration::from_secs(1));
    let started = tokio::time::Instant::now();
    until("the pool is full", || s.sb().pool_ready() == 8).await;
    let took = started.elapsed();
    // Eight one-second creations, four at a time: two rounds.
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(4),
        "{took:?}"
    );
    let _drain = burst(&s, 8).await;
    // Past the moment refills give way to the claims' first calls (which
    // never come), the refills are under way; a claim that finds the pool
    // empty takes the first of them to end, within one creation's time,
    // not after them all (two rounds).
    tokio::time::sleep(crate::pool_yield::MAX_YIELD + Duration::from_millis(100)).await;
    let cold = tokio::time::Instant::now();
    let _mine = burst(&s, 1).await;
    let waited = cold.elapsed();
    assert!(waited < Duration::from_millis(1500), "{waited:?}");
    assert!(s.sb().stats().await.pool.misses >= 1);
}

/// The refill a claim sets off waits for the claimed sandbox's first call,
/// so that the call does not share the host with a creation; for a moment
/// only (a claim whose caller never calls holds it no longer than
/// `MAX_YIELD`), and not at all while a claim waits for a sandbox.
#[tokio::test(start_paused = true)]
async fn refills_give_way_to_a_claimed_sandbox_s_first_call_for_a_moment() {
    use crate::pool_yield::MAX_YIELD;
    use tokio::time::Instant;
    let s = Server::with(|st| st.pool = PoolConfig::fixed(2)).await;
    until("the pool is full", || s.sb().pool_ready() == 2).await;
    let made = creations(&s);
    let id = s.create().await;
    tokio::time::sleep(MAX_YIELD / 10).await;
    assert_eq!(creations(&s), made, "a refill began before the claim's first call");
    let called = Instant::now();
    assert_eq!(s.stdout(id, "echo first").await, "echo first\n");
    until("the refill after the first call", || creations(&s) == made + 1).await;
    assert!(called.elapsed() < MAX_YIELD / 2, "{:?}", called.elapsed());

    // A claim whose first call never comes.
    tokio::time::sleep(2 * MAX_YIELD).await;
    let claimed = Instant::now();
    let _silent = s.create().await;
    until("the refill after the hold", || creations(&s) == made + 2).await;
    let held = claimed.elapsed();
    assert!(held >= MAX_YIELD && held < 2 * MAX_YIELD, "{held:?}");
    // Forgotten since: the next claim's refill follows its first call.
    tokio::time::sleep(2 * MAX_YIELD).await;
    let next = s.create().await;
    tokio::time::sleep(MAX_YIELD / 10).await;
    assert_eq!(creations(&s), made + 2, "a refill began before the claim's first call");
    let called = Instant::now();
    assert_eq!(s.stdout(next, "echo first").await, "echo first\n");
    until("the refill after the first call", || creations(&s) == made + 3).await;
    assert!(called.elapsed() < MAX_YIELD / 2, "{:?}", called.elapsed());

    // Claims past the pool: while one waits nothing holds, so the pool's
    // own refills start with the creation made for it.
    until("the pool is full again", || s.sb().pool_ready() == 2).await;
    s.fake.set_create_delay(Duration::from_secs(5));
    tokio::time::sleep(2 * MAX_YIELD).await;
    let burst_at = Instant::now();
    let _three = burst(&s, 3).await;
    let waited = burst_at.elapsed();
    assert!(waited < Duration::from_secs(5) + MAX_YIELD, "{waited:?}");
    until("the pool refills", || s.sb().pool_ready() == 2).await;
    let refilled = burst_at.elapsed();
    assert!(refilled < Duration::from_secs(5) + MAX_YIELD / 2, "{refilled:?}");
}
