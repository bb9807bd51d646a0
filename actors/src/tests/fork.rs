//! Forks on the fake runtime: what the new sandboxes start with, from a
//! live sandbox and from a snapshot, the bounds, tenancy and cleanup.

use std::fs;
use std::time::Duration;

use uuid::Uuid;

use super::{pass, until, Server, OWNER};
use crate::config::PoolMin;
use crate::snapshots::CarriedState;
use crate::{Forked, Quota, SandboxError, Work};

const FOR_ALL: Quota = Quota::UNLIMITED;

async fn fork(s: &Server, id: Uuid, count: usize, from: Option<Uuid>) -> crate::Result<Forked> {
    s.sb().fork(OWNER, id, count, from, FOR_ALL, Default::default()).await
}

#[tokio::test(start_paused = true)]
async fn forks_start_with_the_variables_and_files_then_go_their_own_way() {
    let s = Server::start().await;
    let id = s.create().await;
    let results = |id: Uuid| s.settings.results_dir.join(id.to_string());
    s.run(id, "set x 1").await.unwrap();
    fs::write(results(id).join("data.csv"), "a,b\n1,2\n").unwrap();

    let forked = fork(&s, id, 2, None).await.unwrap();
    assert_eq!(forked.forks.len(), 2);
    let ids: Vec<Uuid> = forked.forks.iter().map(|f| f.info.sandbox_id).collect();
    assert_ne!(ids[0], ids[1]);
    for f in &forked.forks {
        assert_eq!(f.python.python, CarriedState::Carried, "{f:?}");
        assert_eq!(f.info.owner, OWNER);
        assert!(f.info.name.ends_with(&format!(
            "fork {}",
            1 + ids.iter().position(|i| *i == f.info.sandbox_id).unwrap()
        )));
        let fork = f.info.sandbox_id;
        // Its history names the sandbox it was forked from, an id its
        // owner knows.
        let history = s.sb().history(OWNER, fork).await.unwrap();
        let made = format!("made as a fork of sandbox {id}");
        assert!(history.iter().any(|c| c.summary == made), "{history:?}");
        assert_eq!(s.stdout(fork, "get x").await.trim(), "1");
        assert_eq!(
            fs::read_to_string(results(fork).join("data.csv")).unwrap(),
            "a,b\n1,2\n"
        );
        assert!(
            !results(fork)
                .join(".mcp-sandbox/fork")
                .read_dir()
                .unwrap()
                .any(|_| true),
            "the namespace's file is gone once read"
        );
    }
    // Each goes its own way; the source is untouched.
    s.run(ids[0], "set x 2").await.unwrap();
    assert_eq!(s.stdout(ids[1], "get x").await.trim(), "1");
    assert_eq!(s.stdout(id, "get x").await.trim(), "1");
    assert!(
        !results(id).join(".mcp-sandbox").exists(),
        "nothing of the fork is left in the source"
    );
    let forks = s.settings.state_dir.join("forks");
    until("the export is removed", || {
        forks.read_dir().map_or(true, |mut d| d.next().is_none())
    })
    .await;
    assert_eq!(s.sb().list(OWNER).await.len(), 3);
}

#[tokio::test(start_paused = true)]
async fn sixteen_forks_load_a_few_at_a_time_and_all_hold_the_namespace() {
    let s = Server::with(|c| c.pool.min = PoolMin::Fixed(0)).await;
    let id = s.create().await;
    s.run(id, "set x 1").await.unwrap();
    let forked = fork(&s, id, crate::MAX_FORKS, None).await.unwrap();
    assert_eq!(forked.forks.len(), crate::MAX_FORKS);
    for f in &forked.forks {
        assert_eq!(f.python.python, CarriedState::Carried, "{f:?}");
        assert_eq!(s.stdout(f.info.sandbox_id, "get x").await.trim(), "1");
    }
}

/// The first sandbox listed beside the source `id`: a fork's new sandbox,
/// listed from its creation on.
async fn listed_fork(s: &Server, id: Uuid) -> Uuid {
    loop {
        if let Some(info) = s.sb().list(OWNER).await.into_iter().find(|i| i.sandbox_id != id) {
            return info.sandbox_id;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_fork_refuses_calls_and_deletes_until_it_is_seeded() {
    let s = Server::start().await;
    let id = s.create().await;
    s.run(id, "set x 1").await.unwrap();
    // The source is busy, so the fork's copy waits in its queue while the
    // new sandbox is already listed.
    let busy = s.run(id, "sleep 10");
    let forked = fork(&s, id, 1, None);
    let early = async {
        let fork = listed_fork(&s, id).await;
        (fork, s.run(fork, "set x 2").await, s.sb().delete(OWNER, fork).await)
    };
    let (busy, forked, (fork, early, deleted)) = tokio::join!(busy, forked, early);
    busy.unwrap();
    assert_eq!(forked.unwrap().forks[0].info.sandbox_id, fork);
    // Neither a run nor a delete while the copy goes into it.
    for err in [early.unwrap_err(), deleted.unwrap_err()] {
        assert!(matches!(err, SandboxError::Seeding { id, .. } if id == fork), "{err}");
    }
    assert_eq!(
        s.stdout(fork, "get x").await.trim(),
        "1",
        "the fork holds the source's namespace"
    );
}

/// The attack: a fork made with seconds left on its owner's key (a guest's
/// sandboxes end with the key), whose lifetime ends while the server still
/// copies into it. It is deleted once the copy stops, never under it, and
/// nothing of it is left.
#[tokio::test(start_paused = true)]
async fn a_fork_whose_lifetime_ends_while_it_is_copied_into_is_deleted_after_the_copy() {
    let s = Server::start().await;
    let id = s.create().await;
    let results = |id: Uuid| s.settings.results_dir.join(id.to_string());
    s.run(id, "set x 1").await.unwrap();
    fs::write(results(id).join("data.csv"), "a,b\n1,2\n").unwrap();
    // The source is busy, so the copy waits while the fork's lifetime ends.
    let busy = s.run(id, "sleep 10");
    let options = crate::CreateOptions {
        lifetime: Some(Duration::ZERO),
        ..Default::default()
    };
    let forked = s.sb().fork(OWNER, id, 1, None, FOR_ALL, options);
    let (busy, forked) = tokio::join!(busy, forked);
    busy.unwrap();
    let fork = forked.expect("the copy was not cut short").forks[0].info.sandbox_id;
    pass(Duration::from_secs(30)).await;
    assert!(
        s.sb().list(OWNER).await.iter().all(|i| i.sandbox_id != fork),
        "its lifetime ended"
    );
    assert!(!results(fork).exists(), "nothing of it is left");
}

#[tokio::test(start_paused = true)]
async fn a_fork_whose_actor_died_while_it_waited_is_never_locked_once_the_fork_answered() {
    let mut s = Server::start().await;
    let id = s.create().await;
    s.run(id, "set x 1").await.unwrap();
    let busy = s.run(id, "sleep 10");
    let forked = fork(&s, id, 1, None);
    // The new sandbox's actor dies while its seed waits for the source;
    // the supervisor starts it again from its record, still marked as being
    // seeded, and the seed ends without it (the mark is never cleared).
    let killed = async {
        let fork = listed_fork(&s, id).await;
        s.sb().actor_of(fork).expect("its actor").kill();
        fork
    };
    let (busy, forked, fork) = tokio::join!(busy, forked, killed);
    busy.unwrap();
    assert_eq!(forked.unwrap().forks[0].info.sandbox_id, fork);
    // No fork is under way any more: its owner's calls and delete go through.
    assert_eq!(s.stdout(fork, "get x").await.trim(), "1");
    // The answered fork is kept by a restarted server.
    s.restart().await;
    assert_eq!(s.stdout(fork, "get x").await.trim(), "1");
    s.sb().delete(OWNER, fork).await.unwrap();
    assert!(s.sb().list(OWNER).await.iter().all(|i| i.sandbox_id != fork));
}

/// The fork given up left no sandbox and no copy, and its source (holding
/// `x = 1`) serves on.
async fn nothing_was_forked(s: &Server, id: Uuid) {
    until("the forks made are removed", || s.fake.containers().len() == 1).await;
    assert_eq!(s.sb().list(OWNER).await.len(), 1);
    assert_eq!(s.stdout(id, "get x").await.trim(), "1", "the source serves on");
    assert!(!s.settings.state_dir.join("forks").exists(), "the copy never began");
}

#[tokio::test(start_paused = true)]
async fn a_fork_behind_a_long_queue_gives_up_and_leaves_no_sandbox() {
    let s = Server::with(|c| c.pool.min = PoolMin::Fixed(0)).await;
    let id = s.create().await;
    s.run(id, "set x 1").await.unwrap();
    // Ten minutes each: the fork's copy would wait behind both.
    let sleep = || s.sb().run(OWNER, id, Work::Python("sleep 600".into()), Some(600), None);
    let (first, second, forked) = tokio::join!(sleep(), sleep(), fork(&s, id, 2, None));
    let err = forked.unwrap_err();
    assert!(err.to_string().contains("was busy for 15 minutes"), "{err}");
    assert!(first.is_ok() && second.is_ok());
    nothing_was_forked(&s, id).await;
}

#[tokio::test(start_paused = true)]
async fn a_fork_whose_caller_hangs_up_while_its_source_is_busy_leaves_no_sandbox() {
    let s = Server::with(|c| c.pool.min = PoolMin::Fixed(0)).await;
    let id = s.create().await;
    s.run(id, "set x 1").await.unwrap();
    let busy = s.run(id, "sleep 20");
    let hung_up = tokio::time::timeout(Duration::from_secs(5), fork(&s, id, 2, None));
    let (busy, hung_up) = tokio::join!(busy, hung_up);
    assert!(busy.is_ok() && hung_up.is_err());
    nothing_was_forked(&s, id).await;
}

#[tokio::test(start_paused = true)]
async fn a_fork_from_a_snapshot_starts_where_the_snapshot_was() {
    let s = Server::start().await;
    let id = s.create().await;
    let results = |id: Uuid| s.settings.results_dir.join(id.to_string());
    s.run(id, "set x 1").await.unwrap();
    fs::write(results(id).join("kept.txt"), "kept").unwrap();
    let (snap, _) = s.sb().snapshot(OWNER, id, None).await.unwrap();
    s.run(id, "set x 2").await.unwrap();
    fs::write(results(id).join("later.txt"), "later").unwrap();

    let forked = fork(&s, id, 1, Some(snap.snapshot_id)).await.unwrap();
    let fork = forked.forks[0].info.sandbox_id;
    assert_eq!(forked.forks[0].python.python, CarriedState::Carried);
    assert_eq!(s.stdout(fork, "get x").await.trim(), "1");
    assert!(results(fork).join("kept.txt").exists());
    assert!(!results(fork).join("later.txt").exists());
    assert_eq!(s.stdout(id, "get x").await.trim(), "2", "the source is untouched");

    let err = fork_err(&s, id, 1, Some(Uuid::new_v4())).await;
    assert!(err.to_string().contains("not found"), "{err}");
}

async fn fork_err(s: &Server, id: Uuid, count: usize, from: Option<Uuid>) -> SandboxError {
    fork(s, id, count, from).await.map(drop).unwrap_err()
}

#[tokio::test(start_paused = true)]
async fn forks_count_against_the_quota_all_or_none() {
    let s = Server::start().await;
    let id = s.create().await;
    let quota = Quota {
        per_owner: 3,
        total: 100,
    };
    let err = s
        .sb()
        .fork(OWNER, id, 3, None, quota, Default::default())
        .await
        .map(drop)
        .unwrap_err();
    assert!(matches!(err, SandboxError::TooMany { most: 3, asked: 3, .. }), "{err}");
    assert!(err.to_string().contains("may have 3, so 3 more do not fit"), "{err}");
    assert_eq!(s.sb().list(OWNER).await.len(), 1, "no fork was made");
    s.sb()
        .fork(OWNER, id, 2, None, quota, Default::default())
        .await
        .unwrap();
    assert_eq!(s.sb().list(OWNER).await.len(), 3);

    for count in [0, crate::MAX_FORKS + 1] {
        let err = fork_err(&s, id, count, None).await;
        assert!(matches!(err, SandboxError::InvalidArgument(_)), "{err}");
    }
}

#[tokio::test(start_paused = true)]
async fn another_tenant_cannot_fork_a_sandbox_or_its_snapshots() {
    let s = Server::start().await;
    let id = s.create().await;
    let (snap, _) = s.sb().snapshot(OWNER, id, None).await.unwrap();
    for from in [None, Some(snap.snapshot_id)] {
        let err = s
            .sb()
            .fork("someone-else", id, 1, from, FOR_ALL, Default::default())
            .await
            .map(drop)
            .unwrap_err();
        assert!(matches!(err, SandboxError::NotFound(_)), "{err}");
    }
    assert!(s.sb().list("someone-else").await.is_empty());
    assert_eq!(s.sb().list(OWNER).await.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_fork_that_fails_midway_leaves_no_sandbox() {
    let s = Server::with(|c| c.pool.min = PoolMin::Fixed(0)).await;
    let id = s.create().await;
    s.run(id, "set x 1").await.unwrap();
    s.fake.fail_creates(1);
    let err = fork_err(&s, id, 3, None).await;
    assert!(err.to_string().contains("refused"), "{err}");
    until("the forks made are removed", || s.fake.containers().len() == 1).await;
    assert_eq!(s.sb().list(OWNER).await.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_fork_whose_caller_hangs_up_leaves_no_sandbox() {
    let s = Server::with(|c| c.pool.min = PoolMin::Fixed(0)).await;
    let id = s.create().await;
    s.run(id, "set x 1").await.unwrap();
    s.fake.set_create_delay(std::time::Duration::from_secs(5));
    let hung_up = tokio::time::timeout(std::time::Duration::from_secs(2), fork(&s, id, 3, None)).await;
    assert!(hung_up.is_err(), "the caller gave up first");
    until("the forks made are removed", || s.fake.containers().len() == 1).await;
    super::pass(std::time::Duration::from_secs(30)).await;
    assert_eq!(s.fake.containers().len(), 1);
    assert_eq!(s.sb().list(OWNER).await.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_fork_never_seeded_is_removed_when_the_server_starts_again() {
    let mut s = Server::start().await;
    let id = s.create().await;
    let forked = fork(&s, id, 1, None).await.unwrap();
    let done = forked.forks[0].info.sandbox_id;
    let unseeded = s.create().await;
    // As a server killed mid-fork leaves it: a record still marked.
    s.sandboxes.take().unwrap().shutdown().await;
    let store = crate::records::RecordStore::open(&s.settings.state_dir.join("records.redb")).unwrap();
    let mut record = store
        .all()
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.id == unseeded)
        .unwrap();
    record.seeding = Some(Uuid::new_v4());
    store.put(record).await.unwrap();
    drop(store);
    s.sandboxes = Some(super::open(&s.settings, &s.fake, &s.host).await.unwrap());
    let mut left: Vec<Uuid> = s.sb().list(OWNER).await.into_iter().map(|i| i.sandbox_id).collect();
    left.sort();
    let mut expected = vec![id, done];
    expected.sort();
    assert_eq!(left, expected, "the seeded fork stays, the unseeded one goes");
}

#[tokio::test(start_paused = true)]
async fn a_fork_never_runs_under_another_network_policy() {
    let s = Server::start().await;
    let id = s.create().await;
    let other = crate::CreateOptions {
        egress: Some(crate::EgressPolicy::Allowlist),
        ..Default::default()
    };
    assert_ne!(s.settings.sandbox.network, crate::EgressPolicy::Allowlist);
    let err = s
        .sb()
        .fork(OWNER, id, 1, None, FOR_ALL, other)
        .await
        .map(drop)
        .unwrap_err();
    assert!(err.to_string().contains("network policy"), "{err}");
    assert_eq!(s.sb().list(OWNER).await.len(), 1);
}
