//! Sleeping sandboxes whose actors rest: the actor stops, the registry keeps
//! what it needs, and the next call starts it again with nothing lost.

use std::time::Duration;

use super::{pass, until, Server, OWNER};
use crate::status::SandboxStatus;
use crate::SandboxError;
use sandbox_runtime::agent::Work;

/// Longer than an actor waits before it rests, plus a few upkeep periods.
const RESTED: Duration = Duration::from_secs(20);

/// A sandbox with `x = 1`, put to sleep, whose actor has rested while its
/// listing and the metrics were read every second (reads keep no actor).
async fn dormant(s: &Server) -> uuid::Uuid {
    let id = s.create().await;
    s.run(id, "set x 1").await.unwrap();
    s.sb().hibernate(OWNER, id).await.unwrap();
    for _ in 0..60 {
        if s.sb().actor_of(id).is_none() {
            return id;
        }
        assert_eq!(s.sb().list(OWNER).await.len(), 1);
        s.sb().stats().await;
        pass(Duration::from_secs(1)).await;
    }
    panic!("its actor never rested");
}

#[tokio::test(start_paused = true)]
async fn a_sleeping_sandbox_left_alone_keeps_no_actor_and_wakes_with_its_state() {
    let s = Server::start().await;
    let id = dormant(&s).await;
    let before = s.sb().history(OWNER, id).await.unwrap();
    // Asking for its history started an actor; it rests again.
    until("its actor rests again", || s.sb().actor_of(id).is_none()).await;
    // Listed from its record, which wakes nothing.
    let listed = s.sb().list(OWNER).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].status, SandboxStatus::Hibernated);
    assert_eq!(s.sb().info(OWNER, id).await.unwrap().status, SandboxStatus::Hibernated);
    assert_eq!(s.sb().stats().await.by_status[&SandboxStatus::Hibernated], 1);
    assert!(s.sb().actor_of(id).is_none(), "a listing started no actor");
    // The next call wakes it with its variables and its history.
    let ran = s.run(id, "get x").await.unwrap();
    assert_eq!(ran.output.stdout, "1\n");
    assert!(ran.notice.unwrap_or_default().contains("carried"));
    assert!(s.sb().actor_of(id).is_some());
    let after = s.sb().history(OWNER, id).await.unwrap();
    assert_eq!(after.len(), before.len() + 1, "the calls before the rest are kept");
    assert_eq!(after[0].summary, before[0].summary);
    // Awake, it does not rest.
    pass(RESTED).await;
    assert!(s.sb().actor_of(id).is_some());
}

#[tokio::test(start_paused = true)]
async fn calls_sent_at_once_to_a_resting_sandbox_start_one_actor_and_keep_their_order() {
    let s = Server::start().await;
    let id = dormant(&s).await;
    let sb = s.sb();
    let calls = (0..8).map(|i| sb.run(OWNER, id, Work::Python(format!("set y {i}")), None, None));
    for ran in futures_util::future::join_all(calls).await {
        ran.unwrap();
    }
    let sent: Vec<String> = (0..8).map(|i| format!("set y {i}")).collect();
    assert_eq!(s.ran_starting(id, "set y"), sent, "the calls ran in the order sent");
}

#[tokio::test(start_paused = true)]
async fn calls_past_the_queue_limit_are_refused_while_a_sandbox_wakes() {
    let s = Server::with(|settings| settings.sandbox.max_queued_calls = 3).await;
    let id = dormant(&s).await;
    let sb = s.sb();
    let calls = (0..6).map(|i| sb.run(OWNER, id, Work::Python(format!("set x {i}")), None, None));
    let answers = futures_util::future::join_all(calls).await;
    let refused = answers
        .iter()
        .filter(|a| matches!(a, Err(SandboxError::Quota(why)) if why.contains("calls waiting")))
        .count();
    assert_eq!(refused, 3, "{answers:?}");
    assert_eq!(s.stdout(id, "get x").await, "2\n");
}

#[tokio::test(start_paused = true)]
async fn a_resting_sandbox_is_deleted_whole_and_another_tenant_cannot_reach_it() {
    let s = Server::start().await;
    let id = dormant(&s).await;
    for refused in [
        s.sb().info("someone else", id).await.err(),
        s.sb().delete("someone else", id).await.err(),
        s.sb()
            .run("someone else", id, Work::Python("get x".into()), None, None)
            .await
            .err(),
    ] {
        assert!(matches!(refused, Some(SandboxError::NotFound(_))), "{refused:?}");
    }
    assert!(s.sb().actor_of(id).is_none(), "a stranger's call started no actor");
    assert!(s.sb().list("someone else").await.is_empty());
    s.sb().delete(OWNER, id).await.unwrap();
    assert!(matches!(s.sb().info(OWNER, id).await, Err(SandboxError::NotFound(_))));
    assert!(s.fake.volumes().is_empty(), "its volume went with it");
    assert!(s.sb().held().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_resting_sandbox_past_its_lifetime_is_deleted() {
    let s = Server::start().await;
    // Long enough to rest first, then waited out for real.
    let id = s.create_for(Duration::from_secs(2)).await;
    s.sb().hibernate(OWNER, id).await.unwrap();
    until("its actor rests", || s.sb().actor_of(id).is_none()).await;
    assert_eq!(s.sb().held().len(), 1, "it rested before its lifetime ended");
    std::thread::sleep(Duration::from_secs(2));
    until("the sandbox is gone", || s.sb().held().is_empty()).await;
    assert!(s.fake.volumes().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_restarted_server_adopts_a_sleeping_sandbox_without_an_actor() {
    let mut s = Server::start().await;
    let id = dormant(&s).await;
    s.restart().await;
    assert!(s.sb().actor_of(id).is_none(), "adopted asleep, it has no actor");
    assert_eq!(s.sb().info(OWNER, id).await.unwrap().status, SandboxStatus::Hibernated);
    assert_eq!(s.stdout(id, "get x").await, "1\n");
}
