//! Disk quotas and bounded logs against the real engine: a sandbox that
//! fills its folders, bombs them with files or floods its container log
//! takes at most its caps from the host, and the caps hold across a killed
//! container, a server restart and a host reboot (mounts gone).

mod common;

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{docker, eventually, unmount_under, Harness, OWNER};
use sandbox_host::figures as host;

use sandbox_actors::snapshots::SnapshotError;
use sandbox_actors::{Quota, SandboxError, Settings};
use uuid::Uuid;

const RESULTS_MB: u64 = 64;
const PACKAGES_MB: u64 = 96;
const RESULTS_INODES: u64 = 2000;

fn small_disks(s: &mut Settings) {
    s.sandbox.results_mb = RESULTS_MB;
    s.sandbox.results_inodes = RESULTS_INODES;
    s.sandbox.packages_mb = PACKAGES_MB;
    s.sandbox.packages_inodes = 4000;
}

/// Bytes the host really gave a (sparse) file.
fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.blocks() * 512).unwrap_or(0)
}

fn image(h: &Harness, id: Uuid, name: &str) -> std::path::PathBuf {
    h.settings.state_dir.join("disks").join(id.to_string()).join(name)
}

/// `dd` of 3 GB into `dir`: its output and exit code.
async fn fill(h: &Harness, id: Uuid, dir: &str) -> sandbox_actors::Ran {
    let cmd = format!("dd if=/dev/zero of={dir}/big bs=1M count=3000 2>&1");
    h.sh(id, &cmd, Some(120)).await
}

fn assert_refused(ran: &sandbox_actors::Ran, what: &str) {
    let out = format!("{}{}", ran.output.stdout, ran.output.stderr);
    assert_ne!(ran.output.exit_code, 0, "{what}: {out}");
    assert!(out.contains("No space left on device"), "{what}: {out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn writes_stop_at_the_caps_and_the_host_keeps_its_space() {
    let h = Harness::with(small_disks).await;
    let (a, b) = (h.create().await, h.create().await);
    h.sh(a, "echo kept > /app/results/early.txt", None).await;
    let free_before = host::space(&h.settings.state_dir).unwrap().free_bytes;

    let ran = fill(&h, a, "/app/results").await;
    assert_refused(&ran, "results");
    let notice = ran.notice.clone().unwrap_or_default();
    assert!(
        notice.contains("Disk quota reached") && notice.contains("/app/results"),
        "a full sandbox says so: {notice:?}"
    );
    assert_refused(&fill(&h, a, "/app/.venv").await, "packages");

    // The host gave each image at most its cap, and lost far less than 3 GB.
    assert!(allocated(&image(&h, a, "results.img")) <= RESULTS_MB << 20);
    assert!(allocated(&image(&h, a, "packages.img")) <= PACKAGES_MB << 20);
    let free_after = host::space(&h.settings.state_dir).unwrap().free_bytes;
    assert!(
        free_before.saturating_sub(free_after) < 1 << 30,
        "the host lost {} MB",
        (free_before - free_after) >> 20
    );

    // Use is visible against the quota.
    let info = h.sb().info(OWNER, a).await.unwrap();
    let results = info.disk.unwrap().results.unwrap();
    assert!(
        results.is_full() && results.limit_bytes <= RESULTS_MB << 20,
        "{results:?}"
    );

    // The sandbox, its earlier files and the other tenant keep working.
    assert_eq!(
        h.sh(a, "cat /app/results/early.txt", None).await.output.stdout,
        "kept\n"
    );
    assert_eq!(h.py(a, "print(6 * 7)").await.output.stdout, "42\n");
    let other = h
        .sh(
            b,
            "dd if=/dev/zero of=/app/results/ok bs=1M count=20 2>&1 && echo done",
            None,
        )
        .await;
    assert!(other.output.stdout.ends_with("done\n"), "{:?}", other.output);
    let freed = h.sh(a, "rm /app/results/big /app/.venv/big", None).await;
    assert_eq!(freed.output.exit_code, 0);
    assert!(
        freed.notice.is_none(),
        "no notice once space is free: {:?}",
        freed.notice
    );

    // A file-count bomb stops at the inode cap.
    let bomb = "import os\nos.mkdir('bomb')\nn = 0\ntry:\n    for i in range(10**6):\n        open(f'bomb/{i}', 'w').close()\n        n += 1\nexcept OSError as e:\n    print(n, e.errno)";
    let out = h.py_t(a, bomb, Some(120)).await.output;
    let (made, errno) = out.stdout.trim().split_once(' ').expect("the bomb was stopped");
    assert_eq!(errno, "28", "ENOSPC");
    assert!(made.parse::<u64>().unwrap() < RESULTS_INODES, "{made} files");

    // The delete removes mounts and images.
    h.sb().delete(OWNER, a).await.unwrap();
    assert!(!image(&h, a, "results.img").exists());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&a.to_string()), "nothing of the sandbox stays mounted");
}

/// A test's folder, with whatever was mounted under it detached before it
/// is removed, even when the test panics.
struct Mounted(tempfile::TempDir);

impl Drop for Mounted {
    fn drop(&mut self) {
        unmount_under(self.0.path());
    }
}

/// The disk module on its own (root and mkfs.ext4, no engine): 50 MB written
/// to a sandbox's results and deleted there no longer occupy the host.
#[tokio::test(flavor = "multi_thread")]
async fn files_deleted_in_a_sandbox_give_their_blocks_back_to_the_host() {
    let root = Mounted(tempfile::tempdir().unwrap());
    let mut s = Settings::under(root.0.path());
    small_disks(&mut s);
    let id = Uuid::new_v4();
    let results = s.results_dir.join(id.to_string());
    std::fs::create_dir_all(&results).unwrap();
    std::fs::create_dir_all(s.agents_dir().join(id.to_string())).unwrap();
    let disks = s.disks(sandbox_host::syscalls::linux());
    disks.prepare(id, sandbox_host::disk::Sizes::default()).await.unwrap();
    let image = s.state_dir.join("disks").join(id.to_string()).join("results.img");
    let fresh = allocated(&image);

    let big = results.join("big");
    let mut file = std::fs::File::create(&big).unwrap();
    for _ in 0..50 {
        file.write_all(&[0x5a; 1 << 20]).unwrap();
    }
    file.sync_all().unwrap();
    drop(file);
    let written = allocated(&image);
    assert!(
        written >= fresh + (45 << 20),
        "the image holds the file: {written} bytes"
    );

    std::fs::remove_file(&big).unwrap();
    // The blocks go back when the journal commits the delete (a folder's
    // fsync commits it now) and the loop device has punched the holes.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        std::fs::File::open(&results).unwrap().sync_all().unwrap();
        let now = allocated(&image);
        if now < fresh + (8 << 20) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the image still holds {} MB after the delete ({} MB fresh)",
            now >> 20,
            fresh >> 20
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    disks.remove(id).await.unwrap();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&id.to_string()),
        "nothing of the sandbox stays mounted"
    );
    // A loop device mounted with autoclear is detached by the kernel once
    // its last user is gone, a moment after the unmount returns.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let backing: Vec<String> = std::fs::read_dir("/sys/block")
            .unwrap()
            .flatten()
            .filter_map(|d| std::fs::read_to_string(d.path().join("loop/backing_file")).ok())
            .collect();
        if !backing.iter().any(|b| b.contains(&id.to_string())) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no loop device is left on the image: {backing:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_container_log_stays_within_its_cap_and_sandboxes_die_first_when_memory_runs_out() {
    let h = Harness::with(small_disks).await;
    let id = h.create().await;
    let score = h
        .sh(id, "cat /proc/1/oom_score_adj /proc/self/oom_score_adj", None)
        .await;
    assert_eq!(
        score.output.stdout, "500\n500\n",
        "the OOM killer picks sandboxes first"
    );
    let flood = "python3 -c \"import sys\nline = b'x' * 1023 + b'\\n'\nfor _ in range(300): sys.stdout.buffer.write(line * 1024)\" > /proc/1/fd/1; echo $?";
    let ran = h.sh(id, flood, Some(300)).await;
    assert_eq!(
        ran.output.stdout, "0\n",
        "300 MB reached the container's log: {:?}",
        ran.output
    );
    let container = h.container_of(id);
    let tail = std::process::Command::new("docker")
        .args(["logs", "--tail", "1", &container])
        .output()
        .unwrap();
    assert!(
        tail.stdout.starts_with(b"xxxx"),
        "the flood went to the container's log"
    );
    let log = docker(&["inspect", "-f", "{{.LogPath}}", &container]);
    let size = std::fs::metadata(log.trim()).map(|m| m.len()).unwrap_or(0);
    assert!(size <= 2 << 20, "the container log holds {size} bytes");
}

#[tokio::test(flavor = "multi_thread")]
async fn caps_hold_after_a_killed_container_a_server_restart_and_a_reboot() {
    let mut h = Harness::with(small_disks).await;
    let id = h.create().await;
    let lost = h.create().await;
    h.sh(
        id,
        "echo kept > /app/results/early.txt && echo pkg > /app/.venv/marker",
        None,
    )
    .await;

    docker(&["kill", &h.container_of(id)]);
    assert_refused(&fill(&h, id, "/app/results").await, "after docker kill");
    h.sh(id, "rm /app/results/big", None).await;

    h.restart().await;
    assert_refused(&fill(&h, id, "/app/results").await, "after a server restart");
    h.sh(id, "rm /app/results/big", None).await;

    // A host reboot: the server and the container stop, every mount goes.
    // Meanwhile a pooled sandbox of the old run left its disks behind.
    // One sandbox's results image is lost with it.
    h.sandboxes.take().unwrap().shutdown().await;
    docker(&["stop", "-t", "0", &h.container_of(id), &h.container_of(lost)]);
    let orphan = Uuid::new_v4();
    let disks = h.settings.disks(sandbox_host::syscalls::linux());
    for dir in [
        h.settings.results_dir.join(orphan.to_string()),
        h.settings.state_dir.join("agents").join(orphan.to_string()),
    ] {
        std::fs::create_dir_all(dir).unwrap();
    }
    disks
        .prepare(orphan, sandbox_host::disk::Sizes::default())
        .await
        .unwrap();
    for sandbox in [id, lost] {
        unmount_under(&h.settings.results_dir.join(sandbox.to_string()));
        unmount_under(&h.settings.state_dir.join("disks").join(sandbox.to_string()));
        unmount_under(&h.settings.state_dir.join("agents").join(sandbox.to_string()));
    }
    std::fs::remove_file(image(&h, lost, "results.img")).unwrap();
    h.restart().await;
    assert_refused(&fill(&h, lost, "/app/results").await, "with a lost image");
    let r = h.sh(id, "cat /app/results/early.txt /app/.venv/marker", None).await;
    assert_eq!(
        r.output.stdout, "kept\npkg\n",
        "files and packages are back: {:?}",
        r.output
    );
    assert_refused(&fill(&h, id, "/app/results").await, "after a reboot");
    assert_refused(&fill(&h, id, "/app/.venv").await, "packages after a reboot");
    assert!(!image(&h, orphan, "results.img").exists(), "orphan disks are removed");
    assert!(!std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .contains(&orphan.to_string()));

    // With the host's disk below limits.min_free_disk_mb, nothing new starts.
    h.settings.min_free_disk_mb = 1 << 40;
    h.restart().await;
    let refused = h
        .sb()
        .create(OWNER, None, Quota::UNLIMITED, Default::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, SandboxError::Quota(m) if m.contains("limits.min_free_disk_mb")),
        "{refused}"
    );
    let refused = h
        .sb()
        .install(OWNER, id, "six", std::time::Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("disk is nearly full"), "{refused}");
    assert_eq!(
        h.sh(id, "echo still", None).await.output.stdout,
        "still\n",
        "running sandboxes keep working"
    );
}

/// A sandbox whose files outgrow its snapshot store (12 MB under four
/// names, which a save copies once per name): the save stops at the
/// store's cap, says so and keeps nothing; a snapshot that fits is saved
/// after, and the store goes with the sandbox, mount and loop device.
#[tokio::test(flavor = "multi_thread")]
async fn snapshots_stop_at_their_store_s_cap() {
    let h = Harness::with(|s| {
        small_disks(s);
        s.sandbox.snapshots_mb = 32;
        s.sandbox.snapshots_inodes = 1000;
    })
    .await;
    let id = h.create().await;
    let cmd = "cd /app/results && head -c 12000000 /dev/urandom > big.bin && ln big.bin b2 && ln big.bin b3 \
               && ln big.bin b4 && echo ok";
    let wrote = h.sh(id, cmd, None).await;
    assert_eq!(wrote.output.stdout, "ok\n", "{:?}", wrote.output);

    let err = h.sb().snapshot(OWNER, id, None).await.unwrap_err();
    assert!(
        matches!(&err, SandboxError::Snapshot(SnapshotError::StoreFull { cap_mb: 32 })),
        "{err}"
    );
    assert!(
        h.sb().list_snapshots(OWNER, id).await.unwrap().is_empty(),
        "nothing was kept"
    );
    let image = image(&h, id, "snapshots.img");
    let loops = || loop_devices_of(&image);
    assert!(
        loops().contains("snapshots.img"),
        "the store is a loop device: {}",
        loops()
    );

    h.sh(
        id,
        "rm /app/results/b* && head -c 4000000 /dev/urandom > /app/results/small.bin",
        None,
    )
    .await;
    let (kept, _) = h.sb().snapshot(OWNER, id, None).await.expect("a snapshot that fits");
    assert!(kept.bytes >= 4_000_000, "{kept:?}");

    h.sb().delete(OWNER, id).await.unwrap();
    let folder = h.settings.state_dir.join("snapshots").join(id.to_string());
    eventually("the store goes with its sandbox", || {
        !folder.exists()
            && !std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap()
                .contains(&id.to_string())
            && !loops().contains(&id.to_string())
    })
    .await;
}

/// The loop devices backed by `image`, as `losetup` lists them.
fn loop_devices_of(image: &Path) -> String {
    let out = std::process::Command::new("losetup")
        .args(["-j"])
        .arg(image)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A save that could take the state folder's file system below
/// `limits.min_free_disk_mb` is refused before it writes, though the
/// sandbox holds little now: it may write its folders' whole caps (a file
/// linked under many names is copied once per name).
#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_that_could_eat_the_disk_s_reserve_is_refused() {
    let mut h = Harness::new().await;
    let id = h.create().await;
    h.sh(id, "echo small > /app/results/small.txt", None).await;

    // Free space leaves 512 MB above the reserve: the folders' caps
    // (3 GB by default) do not fit in it.
    let free = host::space(&h.settings.state_dir).unwrap().free_bytes;
    h.settings.min_free_disk_mb = (free >> 20) - 512;
    h.restart().await;
    let err = h.sb().snapshot(OWNER, id, None).await.unwrap_err();
    assert!(matches!(&err, SandboxError::Snapshot(SnapshotError::NoRoom)), "{err}");
    assert!(
        !err.to_string().contains("MB"),
        "no figures of the host reach the caller: {err}"
    );
    assert!(h.sb().list_snapshots(OWNER, id).await.unwrap().is_empty());
    h.sb().delete(OWNER, id).await.unwrap();
}
