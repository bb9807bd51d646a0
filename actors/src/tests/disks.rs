//! A sandbox's capped disks through the host's recorded system calls: made
//! and mounted before its container exists, unmounted once it is gone, and
//! nothing left mounted or running when a creation fails halfway.

use std::time::Duration;

use super::{pass, Server, OWNER};
use crate::{Quota, Settings};
use sandbox_host::recording::Call;

fn capped(s: &mut Settings) {
    s.sandbox.results_mb = 64;
    s.sandbox.results_inodes = 4096;
    s.sandbox.packages_mb = 128;
    s.sandbox.packages_inodes = 8192;
}

#[tokio::test(start_paused = true)]
async fn a_sandbox_s_disks_are_mounted_for_its_life_and_unmounted_when_it_is_deleted() {
    let s = Server::with(capped).await;
    let id = s.create().await;
    let own: Vec<_> = s
        .host
        .mounted()
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(&id.to_string()))
        .collect();
    assert_eq!(own.len(), 3, "results, packages and the agent's folder: {own:?}");
    s.sb().delete(OWNER, id).await.unwrap();
    pass(Duration::from_secs(10)).await;
    assert!(s.fake.containers().is_empty());
    assert!(s.host.mounted().is_empty(), "{:?}", s.host.mounted());
    let unmounts = s
        .host
        .calls()
        .iter()
        .filter(|c| matches!(c, Call::Unmount { lazily: true, .. }))
        .count();
    assert_eq!(unmounts, 3);
}

#[tokio::test(start_paused = true)]
async fn a_creation_whose_disk_cannot_be_mounted_makes_no_container_and_leaves_nothing_mounted() {
    let s = Server::with(capped).await;
    s.host.fail("mount_ext4", "packages.img");
    let err = s
        .sb()
        .create(OWNER, None, Quota::UNLIMITED, Default::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("sandbox disk") && err.contains("packages.img"), "{err}");
    pass(Duration::from_secs(10)).await;
    assert!(s.fake.containers().is_empty(), "the disks come before the container");
    assert!(s.host.mounted().is_empty(), "{:?}", s.host.mounted());
    let left: Vec<_> = std::fs::read_dir(s.settings.state_dir.join("disks"))
        .unwrap()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with("template-"))
        .collect();
    assert!(left.is_empty(), "only the templates stay: {left:?}");
}
