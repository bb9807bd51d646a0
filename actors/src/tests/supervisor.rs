//! The supervisor and the actors' upkeep: containers that die while idle,
//! actors that fail, lifetimes that end.

use std::time::Duration;

use super::{pass, until, Server};
use crate::error::SandboxError;
use sandbox_runtime::agent::Work;
use sandbox_runtime::fake::Event;
use sandbox_runtime::ContainerState;

#[tokio::test(start_paused = true)]
async fn a_container_that_dies_while_idle_is_brought_back_without_a_call() {
    let s = Server::start().await;
    let id = s.create().await;
    let container = s.container(id);
    s.run(id, "echo warm").await.unwrap();
    s.fake.kill(&container, true);
    until("the upkeep starts it again", || {
        s.fake.state_of(&container) == ContainerState::Running
    })
    .await;
    // The next caller hears what happened in between.
    let notice = s.run(id, "echo back").await.unwrap().notice.unwrap();
    assert!(notice.contains("ran out of memory"), "{notice}");
}

#[tokio::test(start_paused = true)]
async fn revival_is_retried_while_the_engine_is_down() {
    let s = Server::start().await;
    let id = s.create().await;
    let container = s.container(id);
    s.run(id, "echo warm").await.unwrap();
    s.fake.set_engine_down(true);
    s.fake.kill(&container, false);
    pass(Duration::from_secs(10)).await;
    assert!(matches!(s.fake.state_of(&container), ContainerState::Stopped { .. }));
    s.fake.set_engine_down(false);
    until("started once the engine is back", || {
        s.fake.state_of(&container) == ContainerState::Running
    })
    .await;
    assert_eq!(s.stdout(id, "echo back").await, "echo back\n");
}

#[tokio::test(start_paused = true)]
async fn an_actor_that_stops_unasked_is_started_again_from_its_record() {
    let s = Server::start().await;
    let id = s.create().await;
    s.run(id, "set x 1").await.unwrap();
    let old = s.sb().actor_of(id).unwrap();
    old.stop(Some("crashed".into()));
    until("a new actor is registered", || {
        s.sb().actor_of(id).is_some_and(|a| a.get_id() != old.get_id())
    })
    .await;
    let ran = s.run(id, "get x").await.unwrap();
    assert_eq!(ran.output.stdout, "1\n", "the container and its worker are kept");
    let notice = ran.notice.unwrap();
    assert!(notice.contains("restarted inside the server"), "{notice}");
}

#[tokio::test(start_paused = true)]
async fn calls_waiting_for_an_actor_that_fails_while_asked_to_rest_go_to_its_successor_in_order() {
    let s = Server::start().await;
    let id = s.create().await;
    s.run(id, "set x 1").await.unwrap();
    let old = s.sb().actor_of(id).unwrap();
    let sb = s.sb();
    // It fails with the question in its mailbox: the mailbox, and the
    // question's reply port, go before its supervisor hears.
    old.stop(Some("crashed".into()));
    sb.ask_to_rest(id);
    let calls = futures_util::future::join_all(
        (0..4).map(|i| sb.run(super::OWNER, id, Work::Python(format!("set y {i}")), None, None)),
    );
    let answers = calls.await;
    let first = answers[0].as_ref().expect("answered by the restarted actor");
    let notice = first.notice.clone().unwrap_or_default();
    assert!(notice.contains("restarted inside the server"), "{notice}");
    for ran in answers {
        ran.expect("answered by the restarted actor");
    }
    let sent: Vec<String> = (0..4).map(|i| format!("set y {i}")).collect();
    assert_eq!(s.ran_starting(id, "set y"), sent, "the calls ran in the order sent");
    assert_eq!(
        s.stdout(id, "get x").await,
        "1\n",
        "the container and its worker are kept"
    );
}

#[tokio::test(start_paused = true)]
async fn a_sandbox_past_its_lifetime_is_deleted_with_everything() {
    let s = Server::start().await;
    // Over by the first upkeep, whatever the paused clock says.
    let id = s.create_for(Duration::from_millis(1)).await;
    let container = s.container(id);
    std::thread::sleep(Duration::from_millis(5));
    until("the sandbox is gone", || {
        s.fake.state_of(&container) == ContainerState::Missing
    })
    .await;
    assert!(s.fake.volumes().is_empty());
    let err = s.run(id, "echo late").await.unwrap_err();
    assert!(
        matches!(err, SandboxError::NotFound(_) | SandboxError::Ended { .. }),
        "{err}"
    );
    assert_eq!(s.fake.count(|e| matches!(e, Event::Removed(_))), 1);
}
