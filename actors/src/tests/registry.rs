//! Creation and the registry: quotas under concurrent creations, creations
//! whose caller leaves, failed creations, and adoption after a restart.

use std::time::Duration;

use futures_util::future::join_all;

use super::{pass, Server, OWNER};
use crate::error::SandboxError;
use crate::Quota;
use sandbox_runtime::{ContainerState, RuntimeError};

const ONE_EACH: Quota = Quota { per_owner: 1, total: 3 };

#[tokio::test(start_paused = true)]
async fn concurrent_creations_cannot_pass_the_quota() {
    let s = Server::start().await;
    s.fake.set_create_delay(Duration::from_secs(2));
    let tries = (0..4).map(|_| s.sb().create(OWNER, None, ONE_EACH, Default::default()));
    let results = join_all(tries).await;
    let made = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(
        made,
        1,
        "{:?}",
        results
            .iter()
            .map(|r| r.as_ref().err().map(|e| e.to_string()))
            .collect::<Vec<_>>()
    );
    for r in results.iter().filter_map(|r| r.as_ref().err()) {
        assert!(matches!(r, SandboxError::TooMany { asked: 1, .. }), "{r}");
    }
    assert_eq!(s.fake.containers().len(), 1);
    // The server total counts places being created too.
    let others = ["a", "b", "c"].map(|o| s.sb().create(o, None, ONE_EACH, Default::default()));
    let others = join_all(others).await;
    assert_eq!(others.iter().filter(|r| r.is_ok()).count(), 2);
    assert_eq!(s.fake.containers().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_creation_whose_caller_left_leaves_nothing() {
    let s = Server::start().await;
    s.fake.set_create_delay(Duration::from_secs(10));
    let left = tokio::time::timeout(Duration::from_secs(1), s.create()).await;
    assert!(left.is_err());
    pass(Duration::from_secs(20)).await;
    assert!(s.fake.containers().is_empty(), "{:?}", s.fake.containers());
    assert!(s.fake.volumes().is_empty());
    assert!(s.sb().list(OWNER).await.is_empty());
    // Its place in the quota was given back.
    s.fake.set_create_delay(Duration::ZERO);
    s.sb().create(OWNER, None, ONE_EACH, Default::default()).await.unwrap();
}

/// A creation that must fail with an engine error.
async fn refused_by_docker(s: &Server) -> SandboxError {
    let err = s
        .sb()
        .create(OWNER, None, ONE_EACH, Default::default())
        .await
        .unwrap_err();
    assert!(matches!(err, SandboxError::Runtime(RuntimeError::Engine(_))), "{err}");
    err
}

#[tokio::test(start_paused = true)]
async fn a_failed_creation_says_so_and_gives_its_place_back() {
    let s = Server::start().await;
    s.fake.fail_creates(1);
    let err = refused_by_docker(&s).await;
    assert!(err.to_string().contains("Try again later"), "{err}");
    s.sb().create(OWNER, None, ONE_EACH, Default::default()).await.unwrap();
    assert_eq!(s.fake.containers().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_engine_that_is_down_fails_the_creation_cleanly() {
    let s = Server::start().await;
    s.fake.set_engine_down(true);
    refused_by_docker(&s).await;
    s.fake.set_engine_down(false);
    let id = s.create().await;
    assert_eq!(s.stdout(id, "echo up").await, "echo up\n");
}

#[tokio::test(start_paused = true)]
async fn other_owners_sandboxes_are_not_found() {
    let s = Server::start().await;
    let id = s.create().await;
    let err = s.sb().info("intruder", id).await.unwrap_err();
    assert!(matches!(err, SandboxError::NotFound(_)), "{err}");
    assert!(s
        .sb()
        .run("intruder", id, crate::Work::Python("echo x".into()), None, None)
        .await
        .is_err());
    assert!(s.sb().delete("intruder", id).await.is_err());
    assert!(s.sb().list("intruder").await.is_empty());
    assert_eq!(s.stdout(id, "echo still").await, "echo still\n");
}

/// A container and volume of this server that no record explains.
async fn unrecorded_container(s: &Server) -> sandbox_runtime::ContainerRef {
    let paths = sandbox_runtime::SandboxPaths {
        id: uuid::Uuid::new_v4(),
        results: Default::default(),
        agent: Default::default(),
        egress: None,
        packages: None,
        template: None,
    };
    sandbox_runtime::ContainerRuntime::create(&s.fake, &paths, None)
        .await
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_clean_stop_removes_what_no_record_explains_and_keeps_the_sandboxes() {
    let s = Server::start().await;
    let id = s.create().await;
    let container = s.container(id);
    // What a creation leaves when the engine did its work but the answer
    // was lost (the engine restarted mid-call).
    let lost = unrecorded_container(&s).await;
    s.sb().shutdown().await;
    assert!(!s.fake.containers().iter().any(|(c, _)| *c == lost.container_id));
    assert!(!s.fake.volumes().contains(&lost.volume));
    // The sandbox's own container runs on, for the next start to adopt.
    assert_eq!(s.fake.state_of(&container), ContainerState::Running);
}

#[tokio::test(start_paused = true)]
async fn a_restarted_server_adopts_its_sandboxes_and_removes_what_no_record_explains() {
    let mut s = Server::start().await;
    let id = s.create().await;
    s.run(id, "set x 1").await.unwrap();
    let stray = unrecorded_container(&s).await;
    s.restart().await;
    assert_eq!(s.stdout(id, "get x").await, "1\n", "the container kept running");
    assert!(!s.fake.containers().iter().any(|(c, _)| *c == stray.container_id));
    assert!(!s.fake.volumes().contains(&stray.volume));
}
