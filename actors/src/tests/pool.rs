//! The warm pool: claims, refills, pooled containers that die while they
//! wait, and removals that meet an engine that is down.

use std::time::Duration;

use super::{pass, until, Server, OWNER};
use crate::runtime::fake::Event;
use crate::{CreateOptions, EgressPolicy, Quota};

fn creations(s: &Server) -> usize {
    s.fake.count(|e| matches!(e, Event::Created { .. }))
}

#[tokio::test(start_paused = true)]
async fn a_claim_takes_a_warm_sandbox_and_the_pool_refills() {
    let s = Server::with(|st| st.pool.size = 2).await;
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

#[tokio::test(start_paused = true)]
async fn a_pooled_container_that_died_is_never_handed_out() {
    let s = Server::with(|st| st.pool.size = 1).await;
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
    let s = Server::with(|st| st.pool.size = 1).await;
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
    let s = Server::with(|st| st.pool.size = 1).await;
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
    let mut s = Server::with(|st| st.pool.size = 2).await;
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
    let s = Server::with(|st| st.pool.size = 2).await;
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
