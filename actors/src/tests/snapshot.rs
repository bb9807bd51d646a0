//! Snapshots on the fake runtime: what a restore brings back, the bounds,
//! tenancy, and what is said when the Python state did not survive.

use std::fs;

use super::{Server, OWNER};
use crate::snapshots::{PythonState, SnapshotError};
use crate::SandboxError;

#[tokio::test(start_paused = true)]
async fn a_restore_brings_back_variables_and_files_however_they_changed() {
    let s = Server::start().await;
    let id = s.create().await;
    let results = s.settings.results_dir.join(id.to_string());
    s.run(id, "set x 1").await.unwrap();
    fs::write(results.join("data.csv"), "a,b\n1,2\n").unwrap();
    let (snap, _) = s.sb().snapshot(OWNER, id, Some("before".into())).await.unwrap();
    assert_eq!(snap.python, PythonState::Parked);
    assert_eq!(snap.label.as_deref(), Some("before"));
    assert!(!snap.packages(), "no capped package disk on the fake runtime");

    s.run(id, "set x 2").await.unwrap();
    fs::remove_file(results.join("data.csv")).unwrap();
    fs::write(results.join("junk.txt"), "later").unwrap();
    let (restored, notice) = s.sb().restore_snapshot(OWNER, id, snap.snapshot_id).await.unwrap();
    assert_eq!(restored.python, PythonState::Restored);
    assert_eq!(notice, None);
    assert_eq!(s.stdout(id, "get x").await.trim(), "1");
    assert_eq!(fs::read_to_string(results.join("data.csv")).unwrap(), "a,b\n1,2\n");
    assert!(!results.join("junk.txt").exists());
    // A snapshot restores any number of times.
    s.run(id, "set x 3").await.unwrap();
    s.sb().restore_snapshot(OWNER, id, snap.snapshot_id).await.unwrap();
    assert_eq!(s.stdout(id, "get x").await.trim(), "1");

    let listed = s.sb().list_snapshots(OWNER, id).await.unwrap();
    assert_eq!(listed, vec![snap.clone()]);
    let info = s.sb().info(OWNER, id).await.unwrap();
    assert_eq!(info.snapshots.count, 1);
    let history = s.sb().history(OWNER, id).await.unwrap();
    assert!(history.iter().any(|c| c.summary.starts_with("restore ")), "{history:?}");
}

#[tokio::test(start_paused = true)]
async fn a_sandbox_keeps_only_so_many_snapshots() {
    let s = Server::with(|c| c.sandbox.snapshots_per_sandbox = 2).await;
    let id = s.create().await;
    let (first, _) = s.sb().snapshot(OWNER, id, None).await.unwrap();
    s.sb().snapshot(OWNER, id, None).await.unwrap();
    let err = s.sb().snapshot(OWNER, id, None).await.unwrap_err();
    assert!(
        matches!(err, SandboxError::Snapshot(SnapshotError::TooMany(2))),
        "{err}"
    );
    s.sb().delete_snapshot(OWNER, id, first.snapshot_id).await.unwrap();
    s.sb().snapshot(OWNER, id, None).await.unwrap();
    let err = s.sb().restore_snapshot(OWNER, id, first.snapshot_id).await.unwrap_err();
    assert!(
        matches!(err, SandboxError::Snapshot(SnapshotError::NotFound(_))),
        "{err}"
    );
}

#[tokio::test(start_paused = true)]
async fn snapshots_can_be_turned_off() {
    let s = Server::with(|c| c.sandbox.snapshots_per_sandbox = 0).await;
    let id = s.create().await;
    let err = s.sb().snapshot(OWNER, id, None).await.unwrap_err();
    assert!(matches!(err, SandboxError::Snapshot(SnapshotError::Disabled)), "{err}");
}

#[tokio::test(start_paused = true)]
async fn another_tenant_can_neither_list_restore_delete_nor_take_them() {
    let s = Server::start().await;
    let id = s.create().await;
    let (snap, _) = s.sb().snapshot(OWNER, id, None).await.unwrap();
    let intruder = "someone-else";
    let errors = [
        s.sb().list_snapshots(intruder, id).await.map(drop).unwrap_err(),
        s.sb()
            .restore_snapshot(intruder, id, snap.snapshot_id)
            .await
            .map(drop)
            .unwrap_err(),
        s.sb()
            .delete_snapshot(intruder, id, snap.snapshot_id)
            .await
            .unwrap_err(),
        s.sb().snapshot(intruder, id, None).await.map(drop).unwrap_err(),
    ];
    for err in errors {
        assert!(matches!(err, SandboxError::NotFound(_)), "{err}");
    }
    assert_eq!(s.sb().list_snapshots(OWNER, id).await.unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_restore_after_a_container_restart_says_the_python_state_is_gone() {
    let s = Server::start().await;
    let id = s.create().await;
    let results = s.settings.results_dir.join(id.to_string());
    s.run(id, "set x 1").await.unwrap();
    fs::write(results.join("kept.txt"), "kept").unwrap();
    let (snap, _) = s.sb().snapshot(OWNER, id, None).await.unwrap();
    s.sb().restart(OWNER, id).await.unwrap();
    fs::remove_file(results.join("kept.txt")).unwrap();
    let (restored, notice) = s.sb().restore_snapshot(OWNER, id, snap.snapshot_id).await.unwrap();
    assert_eq!(restored.python, PythonState::Lost);
    assert!(notice
        .unwrap_or_default()
        .contains("Python state saved in this snapshot is gone"));
    assert_eq!(fs::read_to_string(results.join("kept.txt")).unwrap(), "kept");
    assert_eq!(s.stdout(id, "get x").await.trim(), "");
}

#[tokio::test(start_paused = true)]
async fn deleting_a_sandbox_removes_its_snapshots() {
    let s = Server::start().await;
    let id = s.create().await;
    let results = s.settings.results_dir.join(id.to_string());
    fs::write(results.join("data.bin"), vec![7u8; 4096]).unwrap();
    let (snap, _) = s.sb().snapshot(OWNER, id, None).await.unwrap();
    assert!(snap.bytes >= 4096, "{snap:?}");
    let dir = s.settings.state_dir.join("snapshots").join(id.to_string());
    let tree = dir.join("trees").join(&snap.trees.results);
    assert!(tree.join("data.bin").is_file());
    s.sb().delete(OWNER, id).await.unwrap();
    assert!(!dir.exists());
}

#[tokio::test(start_paused = true)]
async fn a_label_is_bounded() {
    let s = Server::start().await;
    let id = s.create().await;
    for label in ["x".repeat(201), "line\nbreak".into()] {
        let err = s.sb().snapshot(OWNER, id, Some(label)).await.unwrap_err();
        assert!(matches!(err, SandboxError::InvalidArgument(_)), "{err}");
    }
}

#[tokio::test(start_paused = true)]
async fn snapshots_of_unchanged_files_share_one_saved_folder_until_the_last_goes() {
    let s = Server::start().await;
    let id = s.create().await;
    let results = s.settings.results_dir.join(id.to_string());
    fs::write(results.join("big.bin"), vec![1u8; 64 << 10]).unwrap();
    let (first, _) = s.sb().snapshot(OWNER, id, None).await.unwrap();
    let (second, _) = s.sb().snapshot(OWNER, id, None).await.unwrap();
    assert_eq!(first.trees, second.trees, "nothing changed: one saved folder");
    assert_eq!(second.bytes, 0, "{second:?}");
    assert_eq!(
        s.sb().info(OWNER, id).await.unwrap().snapshots.bytes,
        64 << 10,
        "counted once"
    );
    fs::write(results.join("small.txt"), "new").unwrap();
    let (third, _) = s.sb().snapshot(OWNER, id, None).await.unwrap();
    assert_ne!(third.trees, first.trees);
    assert_eq!(third.bytes, 3, "the unchanged file is linked, not copied: {third:?}");

    let trees = s
        .settings
        .state_dir
        .join("snapshots")
        .join(id.to_string())
        .join("trees");
    let saved = || {
        fs::read_dir(&trees)
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_dir())
            .count()
    };
    assert_eq!(saved(), 2);
    s.sb().delete_snapshot(OWNER, id, first.snapshot_id).await.unwrap();
    assert_eq!(saved(), 2, "the second snapshot still holds the first folder");
    s.sb().delete_snapshot(OWNER, id, second.snapshot_id).await.unwrap();
    assert_eq!(saved(), 1);
    fs::remove_file(results.join("small.txt")).unwrap();
    s.sb().restore_snapshot(OWNER, id, third.snapshot_id).await.unwrap();
    assert_eq!(fs::read_to_string(results.join("small.txt")).unwrap(), "new");
}
