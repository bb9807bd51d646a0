//! The link to the agent: each recovery branch (stopped, frozen, removed
//! container), each deadline, and an agent that answers slowly, never,
//! wrongly or hugely.

use std::time::Duration;

use super::{Server, OWNER};
use crate::error::SandboxError;
use crate::Work;
use sandbox_runtime::fake::{Behaviour, Event};
use sandbox_runtime::{ContainerRuntime, ContainerState};

#[tokio::test(start_paused = true)]
async fn python_state_lives_across_calls() {
    let s = Server::start().await;
    let id = s.create().await;
    s.run(id, "set x 41").await.unwrap();
    assert_eq!(s.stdout(id, "get x").await, "41\n");
}

/// A creation whose agent starts slowly (a loaded host) tries the agent's
/// socket every 10 ms but asks the engine whether the container ended only
/// a few times a second: each ask is an inspection by the engine.
#[tokio::test(start_paused = true)]
async fn a_slow_agent_start_asks_the_engine_a_few_times_a_second() {
    let s = Server::start().await;
    s.fake.set_agent_start(Duration::from_secs(5));
    let (before, started) = (s.fake.inspections(), tokio::time::Instant::now());
    let id = s.create().await;
    // The first call waits for the agent.
    assert_eq!(s.stdout(id, "echo up").await, "echo up\n");
    assert!(started.elapsed() >= Duration::from_secs(5));
    let asked = s.fake.inspections() - before;
    assert!(
        (10..=30).contains(&asked),
        "{asked} inspections while the agent started"
    );
}

#[tokio::test(start_paused = true)]
async fn a_stopped_container_is_started_again_and_the_caller_told() {
    let s = Server::start().await;
    let id = s.create().await;
    let container = s.container(id);
    s.run(id, "set x 1").await.unwrap();
    s.fake.kill(&container, false);
    let ran = s.run(id, "get x").await.unwrap();
    assert_eq!(ran.output.exit_code, 1, "a restart loses the namespace");
    assert!(ran.output.state_lost, "and the run says so");
    let notice = ran.notice.expect("a notice");
    assert!(notice.contains("had stopped (exit code 137)"), "{notice}");
    assert_eq!(s.fake.count(|e| *e == Event::Started(container.clone())), 1);
    assert_eq!(s.container(id), container);
}

#[tokio::test(start_paused = true)]
async fn a_container_the_memory_limit_stopped_is_named_so() {
    let s = Server::start().await;
    let id = s.create().await;
    s.run(id, "echo warm").await.unwrap();
    s.fake.kill(&s.container(id), true);
    let notice = s.run(id, "echo back").await.unwrap().notice.unwrap();
    assert!(notice.contains("ran out of memory"), "{notice}");
}

#[tokio::test(start_paused = true)]
async fn a_run_the_memory_limit_ends_answers_137_and_the_sandbox_comes_back() {
    let s = Server::start().await;
    let id = s.create().await;
    let ran = s.run(id, "oom").await.unwrap();
    assert_eq!(ran.output.exit_code, 137);
    assert!(ran.output.state_lost);
    assert!(ran.output.stderr.contains("ran out of memory"), "{}", ran.output.stderr);
    assert_eq!(s.fake.state_of(&s.container(id)), ContainerState::Running);
    assert_eq!(s.stdout(id, "echo again").await, "echo again\n");
}

#[tokio::test(start_paused = true)]
async fn a_removed_container_is_made_again_on_the_same_volume() {
    let s = Server::start().await;
    let id = s.create().await;
    let old = s.container(id);
    let volume = s.fake.volume_of(&old).unwrap();
    s.run(id, "echo warm").await.unwrap();
    s.fake.vanish(&old);
    let ran = s.run(id, "echo back").await.unwrap();
    assert!(ran.notice.unwrap().contains("re-created"));
    let new = s.container(id);
    assert_ne!(new, old);
    assert_eq!(s.fake.volume_of(&new).unwrap(), volume, "packages are kept");
    // The record follows: a restarted server adopts the new container.
    assert_eq!(s.sb().info(OWNER, id).await.unwrap().container_id, new);
}

#[tokio::test(start_paused = true)]
async fn a_container_frozen_behind_the_servers_back_is_thawed() {
    let s = Server::start().await;
    let id = s.create().await;
    let container = s.container(id);
    s.fake.freeze(&container);
    assert_eq!(s.stdout(id, "echo thawed").await, "echo thawed\n");
    assert_eq!(s.fake.state_of(&container), ContainerState::Running);
    assert_eq!(s.fake.count(|e| *e == Event::Unpaused(container.clone())), 1);
}

#[tokio::test(start_paused = true)]
async fn a_container_frozen_under_a_connected_link_is_thawed_and_the_run_goes_on() {
    let s = Server::start().await;
    let id = s.create().await;
    let container = s.container(id);
    s.run(id, "echo connected").await.unwrap();
    s.fake.freeze(&container);
    let started = tokio::time::Instant::now();
    assert_eq!(s.stdout(id, "echo thawed").await, "echo thawed\n");
    // Found at the first check, not at the watchdog (the exec timeout and
    // 15 s), and without a restart: the run itself went on.
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert_eq!(s.fake.count(|e| *e == Event::Unpaused(container.clone())), 1);
    assert_eq!(s.fake.count(|e| *e == Event::Restarted(container.clone())), 0);
    assert_eq!(s.fake.state_of(&container), ContainerState::Running);
}

#[tokio::test(start_paused = true)]
async fn a_container_frozen_in_the_middle_of_a_run_is_thawed_and_the_run_answers() {
    let s = Server::start().await;
    let id = s.create().await;
    let container = s.container(id);
    s.run(id, "echo connected").await.unwrap();
    let started = tokio::time::Instant::now();
    let run = s.sb().run(OWNER, id, Work::Python("sleep 20".into()), Some(30), None);
    let freeze = async {
        // Late in the run: past the checks' doubling, within their 10 s.
        tokio::time::sleep(Duration::from_secs(17)).await;
        s.fake.freeze(&container);
    };
    let (ran, ()) = tokio::join!(run, freeze);
    assert_eq!(ran.unwrap().output.exit_code, 0);
    // Thawed at the check after the freeze (at 24 s: 2, 6, 14, then every
    // 10 s), far from the watchdog (30 s and 15 s), and without a restart.
    assert!(started.elapsed() < Duration::from_secs(26), "{:?}", started.elapsed());
    assert_eq!(s.fake.count(|e| *e == Event::Unpaused(container.clone())), 1);
    assert_eq!(s.fake.count(|e| *e == Event::Restarted(container.clone())), 0);
}

#[tokio::test(start_paused = true)]
async fn a_run_past_its_timeout_and_grace_restarts_the_container() {
    let s = Server::start().await;
    let id = s.create().await;
    let container = s.container(id);
    let started = tokio::time::Instant::now();
    let err = s
        .sb()
        .run(OWNER, id, Work::Python("hang".into()), Some(20), None)
        .await
        .unwrap_err();
    assert!(matches!(err, SandboxError::Unresponsive { .. }), "{err}");
    assert!(err.to_string().contains("within 35 s"), "{err}");
    // The watchdog fired at the timeout plus its slack, not before.
    assert!(started.elapsed() >= Duration::from_secs(35));
    assert_eq!(s.fake.count(|e| *e == Event::Restarted(container.clone())), 1);
    assert_eq!(s.stdout(id, "echo back").await, "echo back\n");
}

#[tokio::test(start_paused = true)]
async fn a_timeout_the_agent_keeps_is_a_result_not_an_error() {
    let s = Server::start().await;
    let id = s.create().await;
    let ran = s
        .sb()
        .run(OWNER, id, Work::Python("sleep 100".into()), Some(3), None)
        .await
        .unwrap();
    assert!(ran.output.timed_out);
    assert_eq!(ran.output.exit_code, 124);
    assert_eq!(s.fake.count(|e| matches!(e, Event::Restarted(_))), 0);
}

#[tokio::test(start_paused = true)]
async fn an_agent_that_accepts_and_never_answers_is_restarted_after_its_start_deadline() {
    let s = Server::start().await;
    let id = s.create().await;
    let container = s.container(id);
    s.run(id, "echo warm").await.unwrap();
    // The sandbox's user replaces the agent by a listener that never answers.
    s.fake.set_behaviour(id, Behaviour::Silent);
    s.fake.kill(&container, false);
    let started = tokio::time::Instant::now();
    let err = s.run(id, "echo lost").await.unwrap_err();
    assert!(matches!(err, SandboxError::Unresponsive { .. }), "{err}");
    assert!(err.to_string().contains("did not answer after a start"), "{err}");
    assert!(started.elapsed() >= Duration::from_secs(30));
    assert!(s.fake.count(|e| *e == Event::Restarted(container.clone())) >= 1);
    // Once the agent answers again, so does the sandbox.
    s.fake.set_behaviour(id, Behaviour::Normal);
    let ran = s.run(id, "echo back").await.unwrap();
    assert_eq!(ran.output.stdout, "echo back\n");
}

#[tokio::test(start_paused = true)]
async fn a_reply_that_is_not_the_protocol_is_an_agent_error() {
    let s = Server::start().await;
    let id = s.create().await;
    s.run(id, "echo warm").await.unwrap();
    s.fake.set_behaviour(id, Behaviour::Garbage);
    let err = s.run(id, "echo x").await.unwrap_err();
    assert!(matches!(err, SandboxError::Agent(_)), "{err}");
    assert!(err.to_string().contains("broke the protocol"), "{err}");
    s.fake.set_behaviour(id, Behaviour::Normal);
    assert_eq!(s.stdout(id, "echo y").await, "echo y\n");
}

#[tokio::test(start_paused = true)]
async fn an_agent_s_long_error_texts_are_bounded_in_results_and_history() {
    let s = Server::start().await;
    let id = s.create().await;
    s.run(id, "echo warm").await.unwrap();
    // Within the line bound, so the reply is read and its text kept.
    s.fake.set_behaviour(id, Behaviour::Wordy(64 * 1024));
    for _ in 0..5 {
        let err = s.run(id, "echo x").await.unwrap_err();
        assert!(
            err.to_string().len() <= 2 * sandbox_runtime::agent::MAX_AGENT_TEXT,
            "{}",
            err.to_string().len()
        );
    }
    let history = s.sb().history(super::OWNER, id).await.unwrap();
    let failed: Vec<_> = history.iter().filter(|c| !c.ok).collect();
    assert!(failed.len() >= 5, "{history:?}");
    assert!(
        failed.iter().all(|c| c.outcome.len() <= 1024),
        "{:?}",
        failed[0].outcome.len()
    );
}

#[tokio::test(start_paused = true)]
async fn a_reply_beyond_the_line_bound_is_refused_unread() {
    let s = Server::start().await;
    let id = s.create().await;
    s.run(id, "echo warm").await.unwrap();
    s.fake.set_behaviour(id, Behaviour::Huge(4 << 20));
    let err = s.run(id, "echo x").await.unwrap_err();
    assert!(err.to_string().contains("a reply longer than"), "{err}");
}

/// Runs `directive` on a connection of the sandbox's agent other than the
/// server's (what an earlier server left running), in the background.
async fn run_elsewhere(s: &Server, id: uuid::Uuid, directive: &str) {
    let mut other = s.fake.connect_agent(id).await.unwrap();
    let work = Work::Python(directive.into());
    tokio::spawn(async move { other.run(&work, 600.0, 1024, None).await });
    super::pass(Duration::from_millis(100)).await;
}

#[tokio::test(start_paused = true)]
async fn a_busy_agent_finishing_an_earlier_run_is_waited_for() {
    let s = Server::start().await;
    let id = s.create().await;
    s.run(id, "echo warm").await.unwrap();
    run_elsewhere(&s, id, "stubborn 5").await;
    let started = tokio::time::Instant::now();
    let ran = s.run(id, "echo after").await.unwrap();
    assert_eq!(ran.output.stdout, "echo after\n");
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "answered before the agent was free"
    );
}

#[tokio::test(start_paused = true)]
async fn a_busy_agent_past_the_busy_wait_is_an_error_not_a_hang() {
    let s = Server::start().await;
    let id = s.create().await;
    s.run(id, "echo warm").await.unwrap();
    run_elsewhere(&s, id, "stubborn 60").await;
    let started = tokio::time::Instant::now();
    let err = s.run(id, "echo after").await.unwrap_err();
    assert!(err.to_string().contains("busy"), "{err}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(10),
        "gave up before the busy wait: {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(15),
        "waited past the busy wait: {waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn installed_packages_are_listed_over_a_second_connection_during_a_run() {
    let s = Server::start().await;
    let id = s.create().await;
    let (ran, status) = tokio::join!(s.run(id, "sleep 5"), async {
        super::pass(Duration::from_secs(1)).await;
        s.sb().install_status(OWNER, id, "pip").await
    });
    ran.unwrap();
    let status = status.unwrap();
    assert_eq!(status.status, crate::InstallStatusKind::Success, "{status:?}");
    assert!(status.message.contains("24.0"), "{status:?}");
}

#[tokio::test(start_paused = true)]
async fn a_reset_the_agent_never_answers_ends_at_its_deadline_with_a_restart() {
    let s = Server::start().await;
    let id = s.create().await;
    let container = s.container(id);
    s.run(id, "echo warm").await.unwrap();
    s.fake.set_behaviour(id, Behaviour::Silent);
    let started = tokio::time::Instant::now();
    let err = s.sb().reset_python(OWNER, id).await.unwrap_err();
    assert!(
        matches!(
            err,
            SandboxError::Unresponsive {
                what: "reset Python",
                ..
            }
        ),
        "{err}"
    );
    assert!(started.elapsed() >= Duration::from_secs(10));
    assert_eq!(s.fake.count(|e| *e == Event::Restarted(container.clone())), 1);
}

#[tokio::test(start_paused = true)]
async fn a_package_listing_the_agent_never_answers_ends_at_its_deadline() {
    let s = Server::start().await;
    let id = s.create().await;
    s.run(id, "echo warm").await.unwrap();
    s.fake.set_behaviour(id, Behaviour::Silent);
    let started = tokio::time::Instant::now();
    let err = s.sb().install_status(OWNER, id, "pip").await.unwrap_err();
    assert!(err.to_string().contains("listing its packages"), "{err}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(10),
        "gave up before the query deadline: {waited:?}"
    );
    assert!(waited < Duration::from_secs(16), "past the query deadline: {waited:?}");
}
