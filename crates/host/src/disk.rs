//! Per-sandbox disk quotas, enforced by the kernel.
//!
//! Everything a sandbox can write that lives on the host gets a file system
//! of its own with a fixed size and a fixed number of inodes, so a write past
//! the cap fails inside the sandbox with "No space left on device" and the
//! host loses at most the cap:
//! - `/app/results`: a sparse ext4 image of `sandbox.results_mb`, loop-mounted
//!   at the sandbox's results folder (the bind source the artifacts route,
//!   uploads and the file listing already use); what the sandbox deletes is
//!   given back to the host (see [`mount_image`]);
//! - `/app/.venv`: a second image of `sandbox.packages_mb`, mounted under the
//!   state folder; the package volume is a local-driver volume bound to it,
//!   so Docker still fills it from the image on first use;
//! - the agent's socket folder: a tiny tmpfs.
//!
//! The sandbox's snapshot store (`state_dir/snapshots/<sandbox id>`, where
//! the server keeps the copies of those folders that its snapshots hold) is
//! a third image, of `sandbox.snapshots_mb`, made and mounted at the first
//! snapshot ([`Disks::open_snapshots`]): a save that would take more fails
//! with "No space left on device" in the store, not on the host's disk.
//!
//! Each image starts as a sparse copy of an empty file system made once per
//! start for its cap (`state_dir/disks/template-*.img`): a copy costs a
//! fraction of a millisecond where `mkfs.ext4` and the removal of
//! `lost+found` cost a process and a mount per image.
//!
//! Images live in `state_dir/disks/<sandbox id>/`. Mounts belong to the host,
//! so they outlive container restarts and a server restart; after a host
//! reboot [`Disks::ensure`] mounts them again before an adopted sandbox's
//! container starts. This needs root (mount) and `mkfs.ext4` (e2fsprogs);
//! with both caps at 0 the folders are plain directories as before.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;
use tracing::warn;
use uuid::Uuid;

use crate::syscalls::Syscalls;
use crate::{agent_dir, figures, SANDBOX_UID};

/// How long one `mkfs.ext4` or `mount` may take.
const TOOL_DEADLINE: Duration = Duration::from_secs(30);
/// The agent's folder holds one socket; this is all it may ever hold.
const AGENT_TMPFS: &str = "size=1m,nr_inodes=64,mode=0755";
const AGENT_TMPFS_FLAGS: libc::c_ulong = libc::MS_NODEV | libc::MS_NOSUID | libc::MS_NOEXEC;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DiskError + '_ {
    move |source| DiskError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Why a sandbox's capped file systems could not be made, mounted or removed.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// A tool (`mkfs.ext4`, `mount`) failed or did not answer; `what` says
    /// what was being done.
    #[error("{what}: {detail}")]
    Tool { what: String, detail: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// One capped file system: its size in MiB and inode count (0 MiB: uncapped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cap {
    pub mb: u64,
    pub inodes: u64,
}

/// A sandbox's own sizes of its capped file systems, in MiB, where they
/// differ from the server's (a template's); a folder the server does not
/// cap stays uncapped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sizes {
    pub results_mb: Option<u64>,
    pub packages_mb: Option<u64>,
}

/// `base` at `mb` MiB, with as many inodes per MiB as `base` has (within
/// what ext4 takes), or `base` itself.
fn resized(base: Cap, mb: Option<u64>) -> Cap {
    match mb {
        Some(mb) if base.mb > 0 && mb > 0 => Cap {
            mb,
            inodes: (u128::from(base.inodes) * u128::from(mb) / u128::from(base.mb)).clamp(256, u128::from(mb) * 1024)
                as u64,
        },
        _ => base,
    }
}

/// Where the disks of this server's sandboxes live.
#[derive(Debug, Clone)]
pub struct Layout {
    /// `state_dir/disks`: one folder of images per sandbox.
    pub root: PathBuf,
    /// The server's results folder: a sandbox's results image is mounted
    /// on its folder there.
    pub results_dir: PathBuf,
    /// The server's folder of agent sockets (see [`agent_dir`]).
    pub agents_dir: PathBuf,
    /// `state_dir/snapshots`: a sandbox's snapshot store is mounted on its
    /// folder there.
    pub snapshots_dir: PathBuf,
}

/// A capped folder's use against its cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskUse {
    pub used_bytes: u64,
    pub limit_bytes: u64,
    pub used_files: u64,
    pub limit_files: u64,
}

impl DiskUse {
    fn of(space: figures::Space) -> Self {
        Self {
            used_bytes: space.total_bytes.saturating_sub(space.free_bytes),
            limit_bytes: space.total_bytes,
            used_files: space.total_files.saturating_sub(space.free_files),
            limit_files: space.total_files,
        }
    }

    /// Less than 1% (at least 1 MiB, 16 files) is left: the next write fails.
    pub fn is_full(&self) -> bool {
        let free = self.limit_bytes - self.used_bytes.min(self.limit_bytes);
        let free_files = self.limit_files - self.used_files.min(self.limit_files);
        free < (self.limit_bytes / 100).max(1 << 20) || free_files < (self.limit_files / 100).max(16)
    }
}

/// A sandbox's disk use, per capped folder (absent: not capped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskUsage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub results: Option<DiskUse>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packages: Option<DiskUse>,
    /// The snapshot store, once the sandbox's first snapshot made it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshots: Option<DiskUse>,
}

/// The capped file systems of this server's sandboxes.
#[derive(Clone)]
pub struct Disks {
    /// Every mount, `mkfs` and unmount goes through it.
    host: Arc<dyn Syscalls>,
    /// `state_dir/disks`: one folder of images per sandbox.
    root: PathBuf,
    results_dir: PathBuf,
    agents_dir: PathBuf,
    snapshots_dir: PathBuf,
    results: Cap,
    packages: Cap,
    snapshots: Cap,
    /// The empty image of each cap, made at its first use (and again if
    /// it went missing).
    templates: Arc<Mutex<HashMap<Cap, PathBuf>>>,
}

impl Disks {
    pub fn new(host: Arc<dyn Syscalls>, layout: Layout, results: Cap, packages: Cap, snapshots: Cap) -> Self {
        Self {
            host,
            root: layout.root,
            results_dir: layout.results_dir,
            agents_dir: layout.agents_dir,
            snapshots_dir: layout.snapshots_dir,
            results,
            packages,
            snapshots,
            templates: Arc::default(),
        }
    }

    /// The template of `cap`, made if this is its first use or it went
    /// missing.
    async fn template(&self, cap: Cap) -> Result<PathBuf, DiskError> {
        let mut made = self.templates.lock().await;
        match made.get(&cap) {
            Some(path) if path.is_file() => Ok(path.clone()),
            _ => {
                let path = make_template(&self.host, &self.root, cap).await?;
                made.insert(cap, path.clone());
                Ok(path)
            }
        }
    }

    /// A new empty image of `cap` at `image`, copied from the cap's template.
    async fn fresh_image(&self, image: &Path, cap: Cap) -> Result<(), DiskError> {
        let template = self.template(cap).await?;
        let target = image.to_path_buf();
        tokio::task::spawn_blocking(move || crate::sparse::copy(&template, &target))
            .await
            .map_err(|e| DiskError::Tool {
                what: format!("copying an empty image to {}", image.display()),
                detail: e.to_string(),
            })?
            .map_err(io(image))
    }

    async fn fresh_and_mount(&self, image: &Path, mount: &Path, cap: Cap) -> Result<(), DiskError> {
        self.fresh_image(image, cap).await?;
        mount_image(&self.host, image, mount).await
    }

    fn enabled(&self) -> bool {
        self.results.mb > 0 || self.packages.mb > 0
    }

    /// The host folder the package volume is bound to, when capped.
    pub fn packages_dir(&self, id: Uuid) -> Option<PathBuf> {
        (self.packages.mb > 0).then(|| self.root.join(id.to_string()).join("packages"))
    }

    /// The image and mount point of a sandbox's snapshot store, when capped.
    fn snapshots_image(&self, id: Uuid) -> Option<(PathBuf, PathBuf)> {
        (self.snapshots.mb > 0).then(|| {
            (
                self.root.join(id.to_string()).join("snapshots.img"),
                self.snapshots_dir.join(id.to_string()),
            )
        })
    }

    /// Makes the sandbox's snapshot store ready to be written: its folder,
    /// and where capped its file system, made at the first snapshot and
    /// mounted again after a reboot. Returns the store's folder.
    ///
    /// A folder that already holds snapshots without an image (kept from
    /// before the cap, or from a time it was off) stays as it is, uncapped:
    /// mounted over, they would be hidden, neither listed nor billed.
    pub async fn open_snapshots(&self, id: Uuid) -> Result<PathBuf, DiskError> {
        let dir = self.snapshots_dir.join(id.to_string());
        let uncapped = |dir: PathBuf| {
            std::fs::create_dir_all(&dir).map_err(io(&dir))?;
            Ok(dir)
        };
        let Some((image, mount)) = self.snapshots_image(id) else {
            return uncapped(dir);
        };
        let kept = std::fs::read_dir(&mount).is_ok_and(|mut entries| entries.next().is_some());
        if !image.is_file() && kept && !self.host.is_mount_point(&mount) {
            warn!(sandbox = %id, "the sandbox's snapshots predate its store's cap; they stay uncapped until it is deleted");
            return uncapped(dir);
        }
        if !self.host.is_mount_point(&mount) {
            std::fs::create_dir_all(&mount).map_err(io(&mount))?;
            let dir = image.parent().expect("in a folder");
            std::fs::create_dir_all(dir).map_err(io(dir))?;
            match image.is_file() {
                true => mount_image(&self.host, &image, &mount).await?,
                false => self.fresh_and_mount(&image, &mount, self.snapshots).await?,
            }
        }
        Ok(mount)
    }

    /// How much more the sandbox's snapshot store can take from the host:
    /// its image's size less the blocks the host already gave it (`None`
    /// when the store is not capped).
    pub fn snapshots_room(&self, id: Uuid) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        let (image, _) = self.snapshots_image(id)?;
        let given = std::fs::metadata(&image).map_or(0, |m| m.blocks() * 512);
        Some((self.snapshots.mb << 20).saturating_sub(given))
    }

    /// (image, mount point, cap) of each capped file system of a sandbox
    /// of `sizes`.
    fn images(&self, id: Uuid, sizes: Sizes) -> Vec<(PathBuf, PathBuf, Cap)> {
        let dir = self.root.join(id.to_string());
        let mut out = vec![];
        if self.results.mb > 0 {
            out.push((
                dir.join("results.img"),
                self.results_dir.join(id.to_string()),
                resized(self.results, sizes.results_mb),
            ));
        }
        if let Some(mount) = self.packages_dir(id) {
            out.push((
                dir.join("packages.img"),
                mount,
                resized(self.packages, sizes.packages_mb),
            ));
        }
        out
    }

    /// Checks at start that images can be made and mounted here, so that a
    /// server that cannot enforce its quotas says so instead of running
    /// without them: making each cap's template (an image made, mounted
    /// and unmounted) is the check.
    /// The snapshot store's template is made at the first snapshot, or here
    /// when it is the only cap.
    pub async fn check(&self) -> Result<(), DiskError> {
        let store = (!self.enabled()).then_some(self.snapshots);
        for cap in [Some(self.results), Some(self.packages), store].into_iter().flatten() {
            if cap.mb > 0 {
                self.template(cap).await.map_err(|e| DiskError::Tool {
                    what: "disk quotas need root and mkfs.ext4 (e2fsprogs); set sandbox.results_mb, sandbox.packages_mb and sandbox.snapshots_mb to 0 to run without them".into(),
                    detail: e.to_string(),
                })?;
            }
        }
        Ok(())
    }

    /// Makes and mounts the capped file systems of a new sandbox of
    /// `sizes`; its results and agent folders must exist (empty) already.
    pub async fn prepare(&self, id: Uuid, sizes: Sizes) -> Result<(), DiskError> {
        if !self.enabled() {
            return Ok(());
        }
        let dir = self.root.join(id.to_string());
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let images = self.images(id, sizes);
        for (_, mount, _) in &images {
            std::fs::create_dir_all(mount).map_err(io(mount))?;
        }
        // Side by side: each is a wait on the kernel or a tool.
        let mounted = images
            .iter()
            .map(|(image, mount, cap)| self.fresh_and_mount(image, mount, *cap));
        let agent = agent_dir(&self.agents_dir, id);
        let (images, agent) = tokio::join!(
            futures_util::future::join_all(mounted),
            mount_agent_tmpfs(&self.host, &agent)
        );
        images.into_iter().collect::<Result<(), _>>()?;
        agent
    }

    /// Mounts what is missing (after a host reboot, say) of a sandbox of
    /// `sizes`; true when anything had to be mounted again.
    pub async fn ensure(&self, id: Uuid, sizes: Sizes) -> Result<bool, DiskError> {
        // The snapshot store, where the sandbox has one: its snapshots are
        // listed from it. The container does not see it, so it is not
        // counted as remounted (which restarts a running container).
        if let Some((image, mount)) = self.snapshots_image(id) {
            if image.is_file() && !self.host.is_mount_point(&mount) {
                self.open_snapshots(id).await?;
            }
        }
        if !self.enabled() {
            return Ok(false);
        }
        let mut remounted = false;
        for (image, mount, cap) in self.images(id, sizes) {
            if !self.host.is_mount_point(&mount) {
                std::fs::create_dir_all(&mount).map_err(io(&mount))?;
                if !image.is_file() {
                    // Its files went with the image; the cap must not.
                    warn!(sandbox = %id, image = %image.display(), "a sandbox's disk image is missing; making an empty one");
                    std::fs::create_dir_all(image.parent().expect("in a folder")).map_err(io(&image))?;
                    self.fresh_and_mount(&image, &mount, cap).await?;
                } else {
                    mount_image(&self.host, &image, &mount).await?;
                }
                remounted = true;
            }
        }
        let agent = agent_dir(&self.agents_dir, id);
        if !self.host.is_mount_point(&agent) {
            std::fs::create_dir_all(&agent).map_err(io(&agent))?;
            mount_agent_tmpfs(&self.host, &agent).await?;
            remounted = true;
        }
        Ok(remounted)
    }

    /// Unmounts a sandbox's file systems and keeps their images (its
    /// container must be gone): a sandbox asleep on disk holds no mount and
    /// no loop device. Never lazily: a file system still in use (by a
    /// container the engine failed to remove) stays mounted, so that it is
    /// never mounted twice. [`Disks::ensure`] mounts them again.
    pub async fn release(&self, id: Uuid) -> Result<(), DiskError> {
        for mount in self.mounts(id) {
            unmount_now(&self.host, &mount).await?;
        }
        Ok(())
    }

    /// Where a sandbox's file systems are mounted: its images, its agent
    /// folder, and its snapshot store whatever the cap is now (it may have
    /// been made under another setting).
    fn mounts(&self, id: Uuid) -> Vec<PathBuf> {
        let mut mounts: Vec<PathBuf> = self
            .images(id, Sizes::default())
            .into_iter()
            .map(|(_, m, _)| m)
            .collect();
        mounts.push(agent_dir(&self.agents_dir, id));
        mounts.push(self.snapshots_dir.join(id.to_string()));
        mounts
    }

    /// Unmounts and deletes a sandbox's file systems (its container must be
    /// gone). The emptied mount points are left for the caller to remove.
    pub async fn remove(&self, id: Uuid) -> Result<(), DiskError> {
        for mount in self.mounts(id) {
            unmount(&self.host, &mount).await?;
        }
        let dir = self.root.join(id.to_string());
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(&dir)(e)),
            _ => Ok(()),
        }
    }

    /// Removes the file systems of every sandbox not in `known` (pooled
    /// sandboxes of an earlier run, leftovers of a crash).
    pub async fn remove_orphans(&self, known: &HashSet<Uuid>) {
        let mut ids = HashSet::new();
        for dir in [&self.root, &self.results_dir, &self.agents_dir, &self.snapshots_dir] {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if let Ok(id) = Uuid::parse_str(&entry.file_name().to_string_lossy()) {
                    ids.insert(id);
                }
            }
        }
        for id in ids.difference(known) {
            if let Err(e) = self.remove(*id).await {
                warn!(sandbox = %id, error = %e, "could not remove the disks of a sandbox no record explains");
            }
        }
        // Probes of a start that was killed, and templates of caps no
        // longer configured.
        let templates = [self.results, self.packages, self.snapshots].map(template_name);
        for entry in std::fs::read_dir(&self.root).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("probe-") {
                let _ = unmount(&self.host, &entry.path().join("mnt")).await;
                let _ = std::fs::remove_dir_all(entry.path());
            } else if name.starts_with("template-") && !templates.contains(&name) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    /// The use of each capped folder; `None` when nothing is capped.
    pub fn usage(&self, id: Uuid) -> Option<DiskUsage> {
        if !self.enabled() && self.snapshots.mb == 0 {
            return None;
        }
        let of = |mb: u64, mount: PathBuf| {
            (mb > 0 && self.host.is_mount_point(&mount))
                .then(|| figures::space(&mount).map(DiskUse::of))
                .flatten()
        };
        Some(DiskUsage {
            results: of(self.results.mb, self.results_dir.join(id.to_string())),
            packages: self.packages_dir(id).and_then(|m| of(self.packages.mb, m)),
            snapshots: self.snapshots_image(id).and_then(|(_, m)| of(self.snapshots.mb, m)),
        })
    }

    /// What the next result says when a folder of the sandbox is full.
    pub fn full_notice(&self, id: Uuid) -> Option<String> {
        let usage = self.usage(id)?;
        let full: Vec<String> = [
            ("/app/results", usage.results),
            ("/app/.venv (installed packages)", usage.packages),
        ]
        .into_iter()
        .filter_map(|(name, u)| {
            let u = u.filter(DiskUse::is_full)?;
            Some(format!(
                "{name} is at its quota ({} of {} MB, {} of {} files)",
                u.used_bytes >> 20,
                u.limit_bytes >> 20,
                u.used_files,
                u.limit_files
            ))
        })
        .collect();
        (!full.is_empty()).then(|| {
            format!(
                "Disk quota reached: {}. Writes there fail with \"No space left on device\"; delete files you no longer need.",
                full.join("; ")
            )
        })
    }
}

/// A sparse image file of the cap's size holding an empty ext4 owned by the
/// sandbox user: no reserved blocks, the cap's inode count, and inode
/// tables and journal left unwritten (the image occupies well under a
/// megabyte until the sandbox writes).
async fn make_image(host: &Arc<dyn Syscalls>, image: &Path, cap: Cap) -> Result<(), DiskError> {
    let file = std::fs::File::create(image).map_err(io(image))?;
    file.set_len(cap.mb << 20).map_err(io(image))?;
    drop(file);
    let (host, target) = (host.clone(), image.to_path_buf());
    let tool = |detail: String| DiskError::Tool {
        what: format!("mkfs.ext4 {}", image.display()),
        detail,
    };
    tokio::task::spawn_blocking(move || host.make_ext4(&target, cap.inodes, TOOL_DEADLINE))
        .await
        .map_err(|e| tool(e.to_string()))?
        .map_err(tool)
}

fn template_name(cap: Cap) -> String {
    format!("template-{}m-{}i.img", cap.mb, cap.inodes)
}

/// The template of `cap` in `root`: a fresh image, emptied (a fresh ext4
/// holds `lost+found`, which is not the sandbox's, and a non-empty volume
/// would not be filled from the image) and written out, made aside (in a
/// `probe-` folder, which a later start removes if this one was killed) and
/// then renamed into place.
async fn make_template(host: &Arc<dyn Syscalls>, root: &Path, cap: Cap) -> Result<PathBuf, DiskError> {
    let path = root.join(template_name(cap));
    let work = root.join(format!("probe-{}", Uuid::new_v4().simple()));
    let (image, mount) = (work.join("template.img"), work.join("mnt"));
    let made = async {
        std::fs::create_dir_all(&mount).map_err(io(&mount))?;
        make_image(host, &image, cap).await?;
        mount_image(host, &image, &mount).await?;
        let lost = mount.join("lost+found");
        let emptied = std::fs::remove_dir(&lost).map_err(io(&lost));
        // Not detached lazily: the file system must be written out and gone
        // before its image is copied.
        unmount_now(host, &mount).await?;
        emptied?;
        std::fs::File::open(&image)
            .and_then(|f| f.sync_all())
            .map_err(io(&image))?;
        std::fs::rename(&image, &path).map_err(io(&path))
    }
    .await;
    let _ = unmount(host, &mount).await;
    let _ = std::fs::remove_dir_all(&work);
    made.map(|()| path)
}

/// Loop-mounts an image: no device files, no set-uid programs, no
/// background zeroing of inode tables (which would fill the sparse image),
/// and `discard`, so that what the sandbox deletes goes back to the host.
///
/// Without it the blocks of a deleted file stay allocated in the image file,
/// which grows to its cap and stays there. With `discard`, ext4 discards the
/// freed blocks when the journal commits the delete (within its 5 s commit
/// interval, or on a sync), and the loop device turns each discard into a
/// hole punched in the image file, a moment later. The alternative, `fstrim` on a
/// schedule, frees the same blocks (measured on kernel 6.18 with ext4 on
/// ext4: 50 MB written and deleted, the image back from 50 MB to 0.4 MB
/// either way; one `fstrim` took 30 ms) but needs a timer, a process per
/// sandbox and round, and leaves the space taken until the next round.
/// Writing and deleting 15 000 small files and 500 MB in large ones took no
/// measurably longer with `discard` than without. An image mounted before
/// this option was added gets it when it is mounted again.
async fn mount_image(host: &Arc<dyn Syscalls>, image: &Path, mount: &Path) -> Result<(), DiskError> {
    let (host, source, target) = (host.clone(), image.to_path_buf(), mount.to_path_buf());
    let flags = libc::MS_NODEV | libc::MS_NOSUID;
    let mounting =
        tokio::task::spawn_blocking(move || host.mount_ext4(&source, &target, flags, "noinit_itable,discard"));
    let tool = |detail: String| DiskError::Tool {
        what: format!("mounting {}", image.display()),
        detail,
    };
    tokio::time::timeout(TOOL_DEADLINE, mounting)
        .await
        .map_err(|_| tool(format!("no answer within {TOOL_DEADLINE:?}")))?
        .map_err(|e| tool(e.to_string()))?
        .map_err(|e| tool(format!("through a loop device at {}: {e}", mount.display())))
}

/// Mounts the agent's tmpfs (a tmpfs needs no device, so no `mount`
/// process).
async fn mount_agent_tmpfs(host: &Arc<dyn Syscalls>, dir: &Path) -> Result<(), DiskError> {
    let options = format!("{AGENT_TMPFS},uid={SANDBOX_UID},gid={SANDBOX_UID}");
    let (host, target) = (host.clone(), dir.to_path_buf());
    tokio::task::spawn_blocking(move || {
        host.mount_tmpfs("mcp-sandbox-agent", &target, AGENT_TMPFS_FLAGS, &options)
            .map_err(io(&target))
    })
    .await
    .map_err(|e| DiskError::Tool {
        what: format!("mounting a tmpfs at {}", dir.display()),
        detail: e.to_string(),
    })?
}

/// Unmounts `path` if it is a mount point. A busy file system is detached
/// lazily: it disappears from the host's tree now, and its loop device is
/// freed once the last user lets go.
async fn unmount(host: &Arc<dyn Syscalls>, path: &Path) -> Result<(), DiskError> {
    unmount_with(host, path, true).await
}

/// Unmounts `path` if it is a mount point, failing if it is busy.
async fn unmount_now(host: &Arc<dyn Syscalls>, path: &Path) -> Result<(), DiskError> {
    unmount_with(host, path, false).await
}

async fn unmount_with(host: &Arc<dyn Syscalls>, path: &Path, lazily_if_busy: bool) -> Result<(), DiskError> {
    if !host.is_mount_point(path) {
        return Ok(());
    }
    let (host, target) = (host.clone(), path.to_path_buf());
    tokio::task::spawn_blocking(move || host.unmount(&target, lazily_if_busy).map_err(io(&target)))
        .await
        .map_err(|e| DiskError::Tool {
            what: format!("unmounting {}", path.display()),
            detail: e.to_string(),
        })?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::{Call, Recorder};

    const RESULTS: Cap = Cap { mb: 64, inodes: 4096 };
    const PACKAGES: Cap = Cap { mb: 128, inodes: 8192 };
    const SNAPSHOTS: Cap = Cap { mb: 256, inodes: 16384 };

    fn disks(root: &Path, host: &Arc<Recorder>) -> Disks {
        capped(root, host, [RESULTS, PACKAGES, SNAPSHOTS])
    }

    fn capped(root: &Path, host: &Arc<Recorder>, [results, packages, snapshots]: [Cap; 3]) -> Disks {
        let layout = Layout {
            root: root.join("disks"),
            results_dir: root.join("results"),
            agents_dir: root.join("agents"),
            snapshots_dir: root.join("snapshots"),
        };
        Disks::new(host.clone(), layout, results, packages, snapshots)
    }

    /// A new sandbox's folders, as the pool makes them before its disks.
    fn folders(root: &Path, id: Uuid) -> [PathBuf; 3] {
        let places = [
            root.join("results").join(id.to_string()),
            root.join("agents").join(id.to_string()),
            root.join("disks").join(id.to_string()).join("packages"),
        ];
        for dir in &places[..2] {
            std::fs::create_dir_all(dir).unwrap();
        }
        places
    }

    fn mounts(calls: &[Call]) -> Vec<(PathBuf, String)> {
        calls
            .iter()
            .filter_map(|c| match c {
                Call::MountExt4 { target, options, .. } | Call::MountTmpfs { target, options } => {
                    Some((target.clone(), options.clone()))
                }
                _ => None,
            })
            .collect()
    }

    #[tokio::test]
    async fn a_sandbox_of_its_own_sizes_gets_disks_of_them_and_keeps_them_when_remade() {
        let root = tempfile::tempdir().unwrap();
        let host = Arc::new(Recorder::new());
        let disks = disks(root.path(), &host);
        disks.check().await.unwrap();
        let id = Uuid::new_v4();
        let [results, _, _] = folders(root.path(), id);
        let sizes = Sizes {
            results_mb: Some(32),
            packages_mb: None,
        };
        let made = |from: usize| -> Vec<u64> {
            host.calls()[from..]
                .iter()
                .filter_map(|c| match c {
                    Call::MakeExt4 { inodes, .. } => Some(*inodes),
                    _ => None,
                })
                .collect()
        };
        let before = host.calls().len();
        disks.prepare(id, sizes).await.unwrap();
        // Half the server's 64 MiB: half its inodes, on an image of its own.
        assert_eq!(made(before), [2048]);
        let image = root.path().join("disks").join(id.to_string()).join("results.img");
        assert_eq!(std::fs::metadata(&image).unwrap().len(), 32 << 20);
        // Its image lost (a host reboot) is made again at its own size.
        host.unmount(&results, false).unwrap();
        std::fs::remove_file(&image).unwrap();
        assert!(disks.ensure(id, sizes).await.unwrap());
        assert_eq!(std::fs::metadata(&image).unwrap().len(), 32 << 20);
        disks.remove(id).await.unwrap();
    }

    #[tokio::test]
    async fn a_sandbox_s_disks_are_made_from_templates_mounted_and_removed_with_nothing_left() {
        let root = tempfile::tempdir().unwrap();
        let host = Arc::new(Recorder::new());
        let disks = disks(root.path(), &host);
        disks.check().await.unwrap();
        // Each cap's template: an image formatted with the cap's inodes,
        // mounted aside to empty it (lost+found), unmounted at once (not
        // lazily: it is copied next).
        let made: Vec<u64> = host
            .calls()
            .iter()
            .filter_map(|c| match c {
                Call::MakeExt4 { inodes, .. } => Some(*inodes),
                _ => None,
            })
            .collect();
        assert_eq!(made, [RESULTS.inodes, PACKAGES.inodes]);
        assert!(host
            .calls()
            .iter()
            .any(|c| matches!(c, Call::Unmount { lazily: false, .. })));
        assert!(host.mounted().is_empty(), "the templates' mounts are gone");
        let templates: Vec<_> = std::fs::read_dir(root.path().join("disks"))
            .unwrap()
            .flatten()
            .collect();
        assert_eq!(templates.len(), 2, "only the two templates stay: {templates:?}");

        let id = Uuid::new_v4();
        let [results, agent, packages] = folders(root.path(), id);
        let before = host.calls().len();
        disks.prepare(id, Sizes::default()).await.unwrap();
        let calls = host.calls()[before..].to_vec();
        assert!(
            !calls.iter().any(|c| matches!(c, Call::MakeExt4 { .. })),
            "a sandbox's images are copies of the templates, no mkfs: {calls:?}"
        );
        let mut mounted = mounts(&calls);
        mounted.sort();
        let image = "noinit_itable,discard".to_string();
        let mut expected = vec![
            (results.clone(), image.clone()),
            (
                agent.clone(),
                format!("{AGENT_TMPFS},uid={SANDBOX_UID},gid={SANDBOX_UID}"),
            ),
            (packages.clone(), image),
        ];
        expected.sort();
        assert_eq!(mounted, expected);
        assert!(!results.join("lost+found").exists(), "the template was emptied");
        assert_eq!(disks.packages_dir(id), Some(packages.clone()));

        // A mount lost (a host reboot) comes back; what is there is left alone.
        assert!(
            !disks.ensure(id, Sizes::default()).await.unwrap(),
            "nothing to mount again"
        );
        host.unmount(&results, false).unwrap();
        assert!(disks.ensure(id, Sizes::default()).await.unwrap());
        assert!(host.is_mount_point(&results));

        // Asleep: nothing mounted, the images kept; awake again: all back.
        disks.release(id).await.unwrap();
        assert!(host.mounted().is_empty());
        assert!(
            root.path()
                .join("disks")
                .join(id.to_string())
                .read_dir()
                .unwrap()
                .count()
                >= 2
        );
        assert!(disks.ensure(id, Sizes::default()).await.unwrap());
        let mut back: Vec<PathBuf> = host.mounted().into_iter().collect();
        back.sort();
        let mut all = vec![results.clone(), agent.clone(), packages.clone()];
        all.sort();
        assert_eq!(back, all);

        let before = host.calls().len();
        disks.remove(id).await.unwrap();
        let mut unmounted: Vec<PathBuf> = host.calls()[before..]
            .iter()
            .map(|c| match c {
                Call::Unmount { target, lazily: true } => target.clone(),
                other => panic!("only lazy unmounts on removal, not {other:?}"),
            })
            .collect();
        unmounted.sort();
        let mut all = vec![results, agent, packages];
        all.sort();
        assert_eq!(unmounted, all);
        assert!(host.mounted().is_empty());
        assert!(!root.path().join("disks").join(id.to_string()).exists());
    }

    #[tokio::test]
    async fn a_mount_that_fails_is_reported_and_the_removal_after_it_leaves_nothing_mounted() {
        let root = tempfile::tempdir().unwrap();
        let host = Arc::new(Recorder::new());
        let disks = disks(root.path(), &host);
        disks.check().await.unwrap();
        host.fail("mount_ext4", "packages.img");
        let id = Uuid::new_v4();
        folders(root.path(), id);
        let err = disks.prepare(id, Sizes::default()).await.unwrap_err().to_string();
        assert!(err.contains("mounting") && err.contains("packages.img"), "{err}");
        assert!(
            !host.mounted().is_empty(),
            "the results and agent mounts went in beside it"
        );
        disks.remove(id).await.unwrap();
        assert!(host.mounted().is_empty());
        assert!(!root.path().join("disks").join(id.to_string()).exists());
    }

    #[tokio::test]
    async fn a_host_that_cannot_format_images_is_told_how_to_run_without_quotas() {
        let root = tempfile::tempdir().unwrap();
        let host = Arc::new(Recorder::new());
        host.fail("make_ext4", "template.img");
        let err = disks(root.path(), &host).check().await.unwrap_err().to_string();
        assert!(err.contains("sandbox.snapshots_mb to 0"), "{err}");
        assert!(host.mounted().is_empty());
        let left: Vec<_> = std::fs::read_dir(root.path().join("disks"))
            .unwrap()
            .flatten()
            .collect();
        assert!(left.is_empty(), "the probe's folder is removed: {left:?}");
    }

    #[tokio::test]
    async fn without_caps_nothing_is_mounted() {
        let root = tempfile::tempdir().unwrap();
        let host = Arc::new(Recorder::new());
        let off = Cap { mb: 0, inodes: 0 };
        let disks = capped(root.path(), &host, [off; 3]);
        let id = Uuid::new_v4();
        disks.check().await.unwrap();
        disks.prepare(id, Sizes::default()).await.unwrap();
        assert!(disks.usage(id).is_none());
        assert!(host.calls().is_empty());
    }

    #[tokio::test]
    async fn the_snapshot_store_is_made_at_the_first_snapshot_and_goes_with_the_sandbox() {
        let root = tempfile::tempdir().unwrap();
        let host = Arc::new(Recorder::new());
        let disks = disks(root.path(), &host);
        disks.check().await.unwrap();
        let id = Uuid::new_v4();
        folders(root.path(), id);
        disks.prepare(id, Sizes::default()).await.unwrap();
        let store = root.path().join("snapshots").join(id.to_string());
        assert!(!host.is_mount_point(&store), "no store before the first snapshot");
        assert!(disks.usage(id).unwrap().snapshots.is_none());

        let before = host.calls().len();
        assert_eq!(disks.open_snapshots(id).await.unwrap(), store);
        let made: Vec<u64> = host.calls()[before..]
            .iter()
            .filter_map(|c| match c {
                Call::MakeExt4 { inodes, .. } => Some(*inodes),
                _ => None,
            })
            .collect();
        assert_eq!(made, [SNAPSHOTS.inodes], "the store's cap gets a template of its own");
        assert!(host.is_mount_point(&store));
        assert!(disks.usage(id).unwrap().snapshots.is_some());
        let before = host.calls().len();
        disks.open_snapshots(id).await.unwrap();
        assert_eq!(host.calls().len(), before, "an open store is left alone");

        // After a reboot the store comes back with the sandbox's other
        // disks, without counting as a remount of the container's.
        host.unmount(&store, false).unwrap();
        assert!(
            !disks.ensure(id, Sizes::default()).await.unwrap(),
            "the container does not see the store"
        );
        assert!(host.is_mount_point(&store));
        assert!(disks.snapshots_room(id).unwrap() <= SNAPSHOTS.mb << 20);

        disks.remove(id).await.unwrap();
        assert!(host.mounted().is_empty(), "the store is unmounted with the rest");
        assert!(!root.path().join("disks").join(id.to_string()).exists());
    }

    #[tokio::test]
    async fn snapshots_kept_before_the_cap_are_never_mounted_over() {
        let root = tempfile::tempdir().unwrap();
        let host = Arc::new(Recorder::new());
        let id = Uuid::new_v4();
        let store = root.path().join("snapshots").join(id.to_string());
        std::fs::create_dir_all(store.join("trees")).unwrap();
        let disks = disks(root.path(), &host);
        assert_eq!(disks.open_snapshots(id).await.unwrap(), store);
        assert!(!host.is_mount_point(&store), "mounted over, they would be hidden");
        assert!(store.join("trees").is_dir());
    }

    #[tokio::test]
    async fn a_store_made_under_a_cap_is_unmounted_after_the_cap_is_turned_off() {
        let root = tempfile::tempdir().unwrap();
        let host = Arc::new(Recorder::new());
        let id = Uuid::new_v4();
        let store = disks(root.path(), &host).open_snapshots(id).await.unwrap();
        assert!(host.is_mount_point(&store));
        let off = Cap { mb: 0, inodes: 0 };
        capped(root.path(), &host, [RESULTS, PACKAGES, off])
            .remove(id)
            .await
            .unwrap();
        assert!(host.mounted().is_empty());
    }

    #[tokio::test]
    async fn an_uncapped_snapshot_store_is_a_plain_folder() {
        let root = tempfile::tempdir().unwrap();
        let host = Arc::new(Recorder::new());
        let off = Cap { mb: 0, inodes: 0 };
        let disks = capped(root.path(), &host, [RESULTS, PACKAGES, off]);
        let id = Uuid::new_v4();
        let store = disks.open_snapshots(id).await.unwrap();
        assert!(store.is_dir());
        assert!(host.calls().is_empty());
    }

    #[test]
    fn a_folder_is_full_below_one_percent() {
        let u = |used_bytes, used_files| DiskUse {
            used_bytes,
            limit_bytes: 1000 << 20,
            used_files,
            limit_files: 10_000,
        };
        assert!(!u(500 << 20, 10).is_full());
        assert!(u(995 << 20, 10).is_full());
        assert!(u(10, 9_950).is_full());
        assert!(!u(0, 0).is_full());
    }
}
