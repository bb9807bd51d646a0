//! The sandbox actor: calls in arrival order, its queue bound, restarts
//! and deletion.

use std::time::Duration;

use futures_util::future::join_all;

use super::{pass, Server, OWNER};
use crate::error::SandboxError;
use crate::status::SandboxStatus;
use sandbox_runtime::agent::Work;
use sandbox_runtime::fake::Event;
use sandbox_runtime::ContainerState;

#[tokio::test(start_paused = true)]
async fn calls_run_one_at_a_time_in_arrival_order() {
    let s = Server::start().await;
    let id = s.create().await;
    // Later calls take less time: run concurrently, they would finish first.
    let directives: Vec<String> = (0..5).map(|i| format!("sleep {}", 5 - i)).collect();
    let calls = directives.iter().map(|d| s.run(id, d));
    for ran in join_all(calls).await {
        assert_eq!(ran.unwrap().output.exit_code, 0);
    }
    let execs = s.fake.execs(id);
    let works: Vec<&str> = execs.iter().map(|(w, _)| w.as_str()).collect();
    assert_eq!(works, ["sleep 5", "sleep 4", "sleep 3", "sleep 2", "sleep 1"]);
    // Each began only when the one before had ended.
    for (pair, took) in execs.windows(2).zip([5, 4, 3, 2]) {
        assert!(
            pair[1].1 - pair[0].1 >= Duration::from_secs(took),
            "{works:?} overlapped"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_refuses_the_next_call_and_serves_the_queued_ones() {
    let s = Server::with(|st| st.sandbox.max_queued_calls = 2).await;
    let id = s.create().await;
    let running = s.run(id, "sleep 10");
    let queued = [s.run(id, "echo a"), s.run(id, "echo b")];
    let refused = s.run(id, "echo c");
    let (running, queued, refused) = tokio::join!(running, join_all(queued), async {
        // Sent once the first three are in the actor's hands.
        pass(Duration::from_secs(1)).await;
        refused.await
    });
    running.unwrap();
    for q in queued {
        q.unwrap();
    }
    let err = refused.unwrap_err();
    assert!(matches!(err, SandboxError::Quota(_)), "{err}");
    assert!(err.to_string().contains("2 calls waiting"), "{err}");
    assert!(!s.fake.execs(id).iter().any(|(w, _)| w == "echo c"));
}

#[tokio::test(start_paused = true)]
async fn a_queued_call_whose_caller_left_never_runs() {
    let s = Server::start().await;
    let id = s.create().await;
    let first = s.run(id, "sleep 5");
    let abandoned = tokio::time::timeout(Duration::from_secs(1), s.run(id, "echo never"));
    let (first, abandoned) = tokio::join!(first, abandoned);
    first.unwrap();
    assert!(abandoned.is_err(), "the second call should still have been queued");
    assert_eq!(s.stdout(id, "echo after").await, "echo after\n");
    let works: Vec<String> = s.fake.execs(id).into_iter().map(|(w, _)| w).collect();
    assert_eq!(works, ["sleep 5", "echo after"]);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_run_is_interrupted_and_the_sandbox_serves_on() {
    let s = Server::start().await;
    let id = s.create().await;
    s.run(id, "set x 1").await.unwrap();
    let cancelled = tokio::time::timeout(Duration::from_secs(2), s.run(id, "sleep 100")).await;
    assert!(cancelled.is_err());
    // The interrupt ended the run at once: the next call does not wait 100 s.
    let started = tokio::time::Instant::now();
    assert_eq!(s.stdout(id, "get x").await, "1\n", "the interrupt kept the worker");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn a_restart_on_request_loses_python_state_and_keeps_the_container() {
    let s = Server::start().await;
    let id = s.create().await;
    let container = s.container(id);
    s.run(id, "set x 1").await.unwrap();
    s.sb().restart(OWNER, id).await.unwrap();
    assert_eq!(s.fake.count(|e| *e == Event::Restarted(container.clone())), 1);
    let ran = s.run(id, "get x").await.unwrap();
    assert_eq!(ran.output.exit_code, 1, "the namespace should be fresh");
    assert!(ran.notice.is_some_and(|n| n.contains("variables were lost")));
    assert!(ran.output.state_lost, "the run that tells of the loss says it");
    let ran = s.run(id, "set x 2").await.unwrap();
    assert!(!ran.output.state_lost && ran.notice.is_none(), "told once");
    assert_eq!(s.container(id), container);
}

#[tokio::test(start_paused = true)]
async fn reset_python_clears_the_namespace_in_turn_with_other_calls() {
    let s = Server::start().await;
    let id = s.create().await;
    s.run(id, "set x 1").await.unwrap();
    let (before, reset, after) = tokio::join!(s.run(id, "get x"), s.sb().reset_python(OWNER, id), s.run(id, "get x"));
    assert_eq!(before.unwrap().output.stdout, "1\n");
    reset.unwrap();
    assert_eq!(after.unwrap().output.exit_code, 1);
}

#[tokio::test(start_paused = true)]
async fn delete_ends_a_run_in_flight_and_refuses_queued_calls() {
    let s = Server::start().await;
    let id = s.create().await;
    let container = s.container(id);
    let volume = s.fake.volume_of(&container).unwrap();
    let (running, queued, deleted) = tokio::join!(s.run(id, "hang"), s.run(id, "echo queued"), async {
        pass(Duration::from_secs(1)).await;
        s.sb().delete(OWNER, id).await
    });
    deleted.unwrap();
    for r in [running, queued] {
        let err = r.unwrap_err();
        assert!(matches!(err, SandboxError::Ended { .. }), "{err}");
    }
    assert_eq!(s.fake.state_of(&container), ContainerState::Missing);
    assert!(!s.fake.volumes().contains(&volume));
    assert!(s.sb().list(OWNER).await.is_empty());
    let err = s.run(id, "echo gone").await.unwrap_err();
    assert!(matches!(err, SandboxError::NotFound(_)), "{err}");
}

/// A deletion finds its sandbox's containers by the sandbox's label (an
/// installer's, or one made again while a removal was cut short), not by
/// listing every container, and leaves every other sandbox's alone.
#[tokio::test(start_paused = true)]
async fn a_deletion_removes_every_container_of_its_sandbox_and_no_other() {
    use sandbox_runtime::{ContainerRuntime, SandboxPaths};
    let s = Server::start().await;
    let (id, other) = (s.create().await, s.create().await);
    let (first, others) = (s.container(id), s.container(other));
    let volume = s.fake.volume_of(&first).unwrap();
    let paths = SandboxPaths {
        id,
        results: s.settings.results_dir.join(id.to_string()),
        agent: s.settings.agents_dir().join(id.to_string()),
        egress: None,
        packages: None,
        template: None,
    };
    let second = s.fake.create(&paths, Some(&volume)).await.unwrap().container_id;
    s.sb().delete(OWNER, id).await.unwrap();
    for gone in [&first, &second] {
        assert_eq!(s.fake.state_of(gone), ContainerState::Missing, "{gone}");
    }
    assert_ne!(s.fake.state_of(&others), ContainerState::Missing);
    assert_eq!(s.stdout(other, "echo still here").await, "echo still here\n");
}

#[tokio::test(start_paused = true)]
async fn a_program_runs_like_code() {
    let s = Server::start().await;
    let id = s.create().await;
    let argv = vec!["ls".to_string(), "-l".to_string()];
    let ran = s.sb().run(OWNER, id, Work::Program(argv), None, None).await.unwrap();
    assert_eq!(ran.output.stdout, "ls -l\n");
    let info = s.sb().info(OWNER, id).await.unwrap();
    assert_eq!(info.status, SandboxStatus::Running);
}
