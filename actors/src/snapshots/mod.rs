//! Snapshots of a live sandbox: saved, listed, restored, dropped.
//!
//! A snapshot has two halves that live in different places:
//! - the Python state: a parked copy-on-write fork of the sandbox's Python
//!   worker, inside the container (`docker/agent.py`), so its memory is
//!   charged to the sandbox's own limit and it ends with the container,
//!   unless written out to the store when the sandbox goes to sleep
//!   ([`python`]);
//! - the files and packages: copies of `/app/results` and of the package
//!   volume on the host ([`copy`]), each saved once per content in
//!   `state_dir/snapshots/<sandbox>/trees/<fingerprint>/` and shared by every
//!   snapshot that held the same; a snapshot itself is
//!   `state_dir/snapshots/<sandbox>/<snapshot>/meta.json`, written last, so
//!   a save that never finished leaves no snapshot, only a folder that the
//!   next removal collects.
//!
//! `state_dir/snapshots/<sandbox>` is a file system of its own of
//! `sandbox.snapshots_mb` (see [`sandbox_host::disk`]), so the kernel holds
//! a sandbox's snapshots to that size whatever its folders hold, and a
//! tenant's to its sandboxes' count times that. Beside the cap, saves
//! reserve what they may write ([`reserve`]), so that saves side by side
//! cannot take the state folder's file system below
//! `limits.min_free_disk_mb`, where the server's records live.
//!
//! The sandbox actor queues snapshot work with its other calls
//! ([`crate::sandbox`]); this module holds the host side and its bounds.

mod copy;
mod fork;
mod python;
mod reserve;

use std::collections::HashSet;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::warn;
use uuid::Uuid;

use crate::config::Settings;
pub use crate::error::{CopyError, SnapshotError};
use copy::{CopyBudget, Saved};
pub(crate) use fork::merge;
pub use fork::{Export, ExportHold};
use reserve::{DiskReserve, Reserved};
use sandbox_host::disk::Disks;
use sandbox_host::figures::free_disk_bytes;
use sandbox_host::SANDBOX_UID;
pub use sandbox_runtime::agent::{Carried, CarriedState, PythonState};
use sandbox_runtime::SandboxPaths;

/// How long copying a snapshot's files (either way) may take.
const COPY_DEADLINE: Duration = Duration::from_secs(300);
/// A save's bound on a folder whose file system is not capped.
const UNCAPPED_MB: u64 = 4096;
const UNCAPPED_FILES: u64 = 1_000_000;
/// The longest label a snapshot may carry, in characters.
pub const MAX_LABEL: usize = 200;
const META: &str = "meta.json";
/// The folder of a sandbox's saved folders, beside its snapshots.
const TREES: &str = "trees";
/// Beside them: the disk they take ([`Snapshots::measure`]).
const USAGE: &str = "usage.json";

/// A snapshot as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    pub snapshot_id: Uuid,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(with = "crate::moment")]
    pub created_at: OffsetDateTime,
    /// `parked`: the Python namespace was kept; `fresh`: no Python had run,
    /// so a restore starts Python afresh.
    pub python: PythonState,
    /// Files, folders and links saved.
    pub files: u64,
    /// Bytes this snapshot added to the host's disk (files unchanged since
    /// the snapshot before it, and folders unchanged since any snapshot the
    /// sandbox keeps, are shared with those).
    pub bytes: u64,
    /// The saved folders it holds, by fingerprint.
    pub trees: Trees,
}

impl SnapshotInfo {
    /// Whether the packages were saved (only where the package volume is a
    /// capped file system of the server's; see `sandbox.packages_mb`).
    pub fn packages(&self) -> bool {
        self.trees.packages.is_some()
    }
}

/// The saved folders of a snapshot: `trees/<fingerprint>` beside the
/// snapshots, shared by every snapshot whose folder had that fingerprint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trees {
    pub results: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packages: Option<String>,
}

impl Trees {
    fn get(&self, folder: Folder) -> Option<&str> {
        match folder {
            Folder::Results => Some(&self.results).filter(|t| !t.is_empty()).map(String::as_str),
            Folder::Packages => self.packages.as_deref(),
        }
    }

    fn set(&mut self, folder: Folder, tree: String) {
        match folder {
            Folder::Results => self.results = tree,
            Folder::Packages => self.packages = Some(tree),
        }
    }

    fn all(&self) -> impl Iterator<Item = &str> {
        [Folder::Results, Folder::Packages]
            .into_iter()
            .filter_map(|f| self.get(f))
    }
}

/// The sandbox folders a snapshot saves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Folder {
    Results,
    Packages,
}

impl Folder {
    /// The sandbox's folders a snapshot saves and restores, with their
    /// host paths: the results, and the packages where they are a capped
    /// disk of the server's.
    fn of(paths: &SandboxPaths) -> impl Iterator<Item = (Folder, &Path)> {
        let packages = paths.packages.as_deref().map(|p| (Folder::Packages, p));
        std::iter::once((Folder::Results, paths.results.as_path())).chain(packages)
    }
}

/// What a sandbox's saved folders take on the host.
#[derive(Debug, Serialize, Deserialize)]
struct StoreUse {
    bytes: u64,
}

/// What a restore brought back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Restored {
    pub snapshot_id: Uuid,
    /// `restored`, `fresh` (the snapshot held a fresh namespace) or `lost`
    /// (its parked copy was gone: Python starts afresh).
    pub python: PythonState,
    pub packages: bool,
}

/// A sandbox's snapshots, counted for its listing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotTotals {
    pub count: usize,
    pub bytes: u64,
}

/// The snapshot work a sandbox actor queues.
#[derive(Debug)]
pub enum SnapshotOp {
    Take {
        label: Option<String>,
    },
    Restore {
        snapshot: Uuid,
    },
    Delete {
        snapshot: Uuid,
    },
    /// Gives the new sandboxes `into` what fork `fork` carries: the
    /// sandbox as it is, or snapshot `from`.
    Export {
        fork: Uuid,
        from: Option<Uuid>,
        into: Vec<SandboxPaths>,
        hold: ExportHold,
    },
    /// Gives a new sandbox of fork `fork` the namespace its export carries,
    /// once the source has made it (the job holds the queue till then).
    Seed {
        fork: Uuid,
        /// The sandbox forked, as the new sandbox's history names it.
        source: Uuid,
        export: watch::Receiver<Option<Arc<Export>>>,
    },
}

impl std::fmt::Display for SnapshotOp {
    /// As the sandbox's history shows it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SnapshotOp::Take { label: Some(label) } => write!(f, "snapshot {label:?}"),
            SnapshotOp::Take { label: None } => write!(f, "snapshot"),
            SnapshotOp::Restore { snapshot } => write!(f, "restore {snapshot}"),
            SnapshotOp::Delete { snapshot } => write!(f, "delete snapshot {snapshot}"),
            SnapshotOp::Export {
                from: Some(snapshot), ..
            } => write!(f, "fork from snapshot {snapshot}"),
            SnapshotOp::Export { from: None, .. } => write!(f, "fork"),
            SnapshotOp::Seed { source, .. } => write!(f, "made as a fork of sandbox {source}"),
        }
    }
}

/// How a [`SnapshotOp`] ended.
#[derive(Debug)]
pub enum SnapshotDone {
    Taken(SnapshotInfo),
    Restored(Restored),
    Deleted,
    Exported(Export),
    /// How much of the Python namespace the new sandbox holds.
    Seeded(Carried),
}

/// The name under which the agent parks a snapshot's Python state.
pub(crate) fn slot(snapshot: Uuid) -> String {
    snapshot.simple().to_string()
}

/// The snapshots of this server's sandboxes, on the host.
#[derive(Clone)]
pub struct Snapshots {
    /// `state_dir/snapshots`: one folder per sandbox, one inside per snapshot.
    root: PathBuf,
    limit: usize,
    results: CopyBudget,
    packages: CopyBudget,
    /// Makes and mounts each sandbox's store, and tells how full the
    /// sandbox's folders and its store are.
    disks: Disks,
    /// What saves in flight may still write.
    reserve: Arc<DiskReserve>,
    /// `limits.min_free_disk_mb`, in bytes.
    keep_free: u64,
    /// `sandbox.snapshots_mb`.
    store_mb: u64,
}

fn budget(mb: u64, inodes: u64) -> CopyBudget {
    match mb {
        0 => CopyBudget {
            bytes: UNCAPPED_MB << 20,
            files: UNCAPPED_FILES,
        },
        mb => CopyBudget {
            bytes: mb << 20,
            files: inodes,
        },
    }
}

impl Snapshots {
    pub fn new(settings: &Settings, disks: Disks) -> Self {
        let s = &settings.sandbox;
        Self {
            root: settings.snapshots_dir(),
            limit: s.snapshots_per_sandbox,
            results: budget(s.results_mb, s.results_inodes),
            packages: budget(s.packages_mb, s.packages_inodes),
            disks,
            reserve: Arc::default(),
            keep_free: settings.min_free_disk_mb << 20,
            store_mb: s.snapshots_mb,
        }
    }

    fn dir(&self, sandbox: Uuid) -> PathBuf {
        self.root.join(sandbox.to_string())
    }

    fn trees(&self, sandbox: Uuid) -> PathBuf {
        self.dir(sandbox).join(TREES)
    }

    fn budget(&self, folder: Folder) -> CopyBudget {
        match folder {
            Folder::Results => self.results,
            Folder::Packages => self.packages,
        }
    }

    /// A sandbox's finished snapshots, oldest first.
    pub fn list(&self, sandbox: Uuid) -> Vec<SnapshotInfo> {
        let Ok(entries) = std::fs::read_dir(self.dir(sandbox)) else {
            return vec![];
        };
        let mut found: Vec<SnapshotInfo> = entries
            .flatten()
            .filter_map(|e| std::fs::read(e.path().join(META)).ok())
            .filter_map(|bytes| serde_json::from_slice(&bytes).ok())
            .collect();
        found.sort_by_key(|s| (s.created_at, s.snapshot_id));
        found
    }

    pub fn find(&self, sandbox: Uuid, snapshot: Uuid) -> Result<SnapshotInfo, SnapshotError> {
        let bytes = std::fs::read(self.dir(sandbox).join(snapshot.to_string()).join(META))
            .map_err(|_| SnapshotError::NotFound(snapshot))?;
        serde_json::from_slice(&bytes).map_err(|e| SnapshotError::Store(e.into()))
    }

    /// The count of a sandbox's snapshots and the bytes of the saved
    /// folders they hold (each counted once, however many share it).
    pub fn totals(&self, sandbox: Uuid) -> SnapshotTotals {
        let bytes = std::fs::read(self.dir(sandbox).join(USAGE))
            .ok()
            .and_then(|b| serde_json::from_slice::<StoreUse>(&b).ok())
            .map_or(0, |u| u.bytes);
        SnapshotTotals {
            count: self.list(sandbox).len(),
            bytes,
        }
    }

    /// Refuses a new snapshot when snapshots are off or the sandbox keeps
    /// as many as it may.
    pub(crate) fn check_room(&self, sandbox: Uuid) -> Result<(), SnapshotError> {
        match self.limit {
            0 => Err(SnapshotError::Disabled),
            limit if self.list(sandbox).len() >= limit => Err(SnapshotError::TooMany(limit)),
            _ => Ok(()),
        }
    }

    /// Reserves the most a save of the sandbox's folders may write: their
    /// budgets (what the sandbox holds now is no bound: a file linked
    /// under many names is copied once per name, and the sandbox writes on
    /// while the copy runs), with a margin for the store's own metadata,
    /// and at most what the store's image can still take from the host.
    /// Refused when the state folder's free space, less what saves in
    /// flight hold, would not keep `limits.min_free_disk_mb` beside it.
    fn reserve_room(&self, paths: &SandboxPaths) -> Result<Reserved, SnapshotError> {
        let budgets: u64 = Folder::of(paths).map(|(folder, _)| self.budget(folder).bytes).sum();
        let mut need = budgets + budgets / 16;
        if let Some(room) = self.disks.snapshots_room(paths.id) {
            need = need.min(room);
        }
        let Some(free) = free_disk_bytes([self.root.as_path()]) else {
            return Ok(self.reserve.nothing());
        };
        self.reserve.take(free, self.keep_free, need).map_err(|held| {
            warn!(
                sandbox = %paths.id, need_mb = need >> 20, free_mb = free >> 20,
                keep_mb = self.keep_free >> 20, held_mb = held >> 20,
                "a snapshot was refused: the state folder's disk has no room for it beside limits.min_free_disk_mb"
            );
            SnapshotError::NoRoom
        })
    }

    /// What a save that failed with `e` tells: a full store (`ENOSPC` in a
    /// capped store) is said as such.
    fn save_failure(&self, sandbox: Uuid, e: SnapshotError) -> SnapshotError {
        let full = matches!(&e, SnapshotError::Save(CopyError::Io(io)) | SnapshotError::Store(io)
            if io.raw_os_error() == Some(libc::ENOSPC));
        match self.disks.snapshots_room(sandbox) {
            Some(_) if full => SnapshotError::StoreFull { cap_mb: self.store_mb },
            _ => e,
        }
    }

    /// Saves the sandbox's files and packages as snapshot `info` (whose
    /// sizes and folders it fills in). A save that fails leaves nothing
    /// behind.
    pub(crate) async fn save(&self, paths: &SandboxPaths, info: SnapshotInfo) -> Result<SnapshotInfo, SnapshotError> {
        self.disks.open_snapshots(paths.id).await.map_err(SnapshotError::Disk)?;
        let reserved = self.reserve_room(paths)?;
        let saved = self.save_files(paths, info).await;
        drop(reserved);
        saved.map_err(|e| self.save_failure(paths.id, e))
    }

    async fn save_files(&self, paths: &SandboxPaths, mut info: SnapshotInfo) -> Result<SnapshotInfo, SnapshotError> {
        let store = self.clone();
        let paths = paths.clone();
        bounded(move |stop| {
            let id = paths.id;
            let latest = store.list(id).pop();
            let (mut files, mut bytes, mut trees) = (0, 0, Trees::default());
            for (folder, live) in Folder::of(&paths) {
                let previous = latest.as_ref().and_then(|s| s.trees.get(folder));
                let (tree, saved) = store
                    .save_tree(id, info.snapshot_id, folder, live, previous, stop)
                    .inspect_err(|_| store.collect_garbage(id))?;
                trees.set(folder, tree);
                files += saved.files;
                bytes += saved.bytes;
            }
            (info.files, info.bytes, info.trees) = (files, bytes, trees);
            if stop.load(Ordering::Relaxed) {
                // Past the deadline: the caller hears that nothing was kept.
                store.collect_garbage(id);
                return Err(SnapshotError::Save(CopyError::Stopped));
            }
            let dir = store.dir(id).join(info.snapshot_id.to_string());
            let written = std::fs::create_dir(&dir).and_then(|()| store.write_meta(id, &info));
            if let Err(e) = written {
                let _ = std::fs::remove_dir_all(&dir);
                store.collect_garbage(id);
                return Err(SnapshotError::Store(e));
            }
            store.measure(id);
            Ok(info)
        })
        .await
        .map_err(|e| match e {
            Bounded::Failed(e) => e,
            Bounded::Late => SnapshotError::Save(CopyError::Stopped),
        })
    }

    /// Saves one folder as a tree named by its fingerprint: a tree saved
    /// before with the same fingerprint is shared instead (no copy, no
    /// link); otherwise the folder is copied, linking what the `previous`
    /// snapshot's tree holds unchanged.
    fn save_tree(
        &self,
        sandbox: Uuid,
        snapshot: Uuid,
        folder: Folder,
        live: &Path,
        previous: Option<&str>,
        stop: &AtomicBool,
    ) -> Result<(String, Saved), SnapshotError> {
        let trees = self.trees(sandbox);
        let budget = self.budget(folder);
        let (fingerprint, entries) = copy::fingerprint(live, budget, stop).map_err(SnapshotError::Save)?;
        if trees.join(fingerprint.hex()).is_dir() {
            let shared = Saved {
                files: entries,
                bytes: 0,
                fingerprint,
            };
            return Ok((fingerprint.hex(), shared));
        }
        std::fs::create_dir_all(&trees).map_err(SnapshotError::Store)?;
        let scratch = trees.join(format!("new-{snapshot}-{folder:?}"));
        let previous = previous.map(|t| trees.join(t));
        let saved = copy::save(live, &scratch, previous.as_deref(), budget, stop).map_err(SnapshotError::Save)?;
        // What was copied may differ from what was first looked at (the
        // sandbox writes as it likes): the tree is named for what it holds.
        let name = saved.fingerprint.hex();
        let stored = match trees.join(&name).is_dir() {
            true => std::fs::remove_dir_all(&scratch),
            false => std::fs::rename(&scratch, trees.join(&name)),
        };
        stored.map_err(SnapshotError::Store)?;
        Ok((name, saved))
    }

    /// Removes the trees (and unfinished copies) no snapshot of the sandbox
    /// holds, and the folders of snapshots that never finished. A
    /// `meta.json` that cannot be read stops it: what that snapshot holds is
    /// not known, so nothing is removed.
    fn collect_garbage(&self, sandbox: Uuid) {
        let Ok(entries) = std::fs::read_dir(self.dir(sandbox)) else {
            return;
        };
        let mut held: HashSet<String> = HashSet::new();
        let mut unfinished = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_name() == TREES || !path.is_dir() {
                continue;
            }
            match std::fs::read(path.join(META)) {
                Ok(bytes) => match serde_json::from_slice::<SnapshotInfo>(&bytes) {
                    Ok(info) => held.extend(info.trees.all().map(String::from)),
                    Err(e) => {
                        warn!(path = %path.display(), error = %e, "an unreadable snapshot record; its saved folders are kept");
                        return;
                    }
                },
                Err(e) if e.kind() == io::ErrorKind::NotFound => unfinished.push(path),
                Err(e) => {
                    warn!(path = %path.display(), error = %e, "an unreadable snapshot record; its saved folders are kept");
                    return;
                }
            }
        }
        let trees = std::fs::read_dir(self.trees(sandbox)).into_iter().flatten().flatten();
        let unheld = trees
            .filter(|e| !held.contains(e.file_name().to_string_lossy().as_ref()))
            .map(|e| e.path());
        for path in unfinished.into_iter().chain(unheld) {
            if let Err(e) = std::fs::remove_dir_all(&path) {
                warn!(path = %path.display(), error = %e, "could not remove a snapshot folder no snapshot holds");
            }
        }
    }

    /// Counts the bytes the sandbox's saved folders and written-out
    /// namespaces take on the host (a file linked from several counted
    /// once, by the blocks it holds) into `usage.json`, which
    /// [`Self::totals`] reads. The folders are the server's own: walked by
    /// path, links never followed.
    fn measure(&self, sandbox: Uuid) {
        fn walk(dir: &Path, seen: &mut HashSet<(u64, u64)>, bytes: &mut u64) {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let Ok(meta) = entry.metadata() else { continue };
                if meta.is_dir() {
                    walk(&entry.path(), seen, bytes);
                } else if meta.is_file() && seen.insert((meta.dev(), meta.ino())) {
                    // What the host gave it: saved files keep their holes.
                    *bytes += meta.blocks() * 512;
                }
            }
        }
        let (mut seen, mut bytes) = (HashSet::new(), 0);
        walk(&self.trees(sandbox), &mut seen, &mut bytes);
        for snapshot in self.list(sandbox) {
            if let Ok(meta) = std::fs::metadata(self.python_file(sandbox, snapshot.snapshot_id)) {
                bytes += meta.blocks() * 512;
            }
        }
        let usage = serde_json::to_vec(&StoreUse { bytes }).expect("serialisable");
        if let Err(e) = std::fs::write(self.dir(sandbox).join(USAGE), usage) {
            warn!(sandbox = %sandbox, error = %e, "could not record the disk the snapshots take");
        }
    }

    /// Makes the sandbox's files (and packages, if saved) those of `info`;
    /// a folder that already matches is left alone.
    pub(crate) async fn restore(&self, paths: &SandboxPaths, info: &SnapshotInfo) -> Result<(), SnapshotError> {
        let (store, paths, trees) = (self.clone(), paths.clone(), info.trees.clone());
        bounded(move |stop| {
            for (folder, live) in Folder::of(&paths) {
                let Some(tree) = trees.get(folder) else { continue };
                let same = copy::fingerprint(live, store.budget(folder), stop).is_ok_and(|(f, _)| f.hex() == tree);
                if !same {
                    copy::restore(&store.trees(paths.id).join(tree), live, SANDBOX_UID, stop)?;
                }
            }
            Ok(())
        })
        .await
        .map_err(|e| match e {
            Bounded::Failed(e) => SnapshotError::Restore(e),
            Bounded::Late => SnapshotError::Restore(CopyError::Stopped),
        })
    }

    /// Drops a snapshot, and the saved folders no other snapshot shares.
    pub(crate) async fn remove(&self, sandbox: Uuid, snapshot: Uuid) -> Result<(), SnapshotError> {
        remove_dir(self.dir(sandbox).join(snapshot.to_string()))
            .await
            .map_err(SnapshotError::Store)?;
        let store = self.clone();
        tokio::task::spawn_blocking(move || {
            store.collect_garbage(sandbox);
            store.measure(sandbox);
        })
        .await
        .map_err(|e| SnapshotError::Store(io::Error::other(e.to_string())))
    }

    /// Removes every snapshot of a sandbox (deleted, or gone while the
    /// server was down).
    pub(crate) async fn remove_all(&self, sandbox: Uuid) -> io::Result<()> {
        remove_dir(self.dir(sandbox)).await
    }

    /// Removes the snapshots of sandboxes no record explains.
    pub(crate) async fn remove_orphans(&self, known: &HashSet<Uuid>) {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return;
        };
        for entry in entries.flatten() {
            let orphan = Uuid::parse_str(&entry.file_name().to_string_lossy()).is_ok_and(|id| !known.contains(&id));
            if orphan {
                if let Err(e) = remove_dir(entry.path()).await {
                    warn!(dir = %entry.path().display(), error = %e, "could not remove snapshots no sandbox owns");
                }
            }
        }
    }
}

async fn remove_dir(dir: PathBuf) -> io::Result<()> {
    match tokio::fs::remove_dir_all(&dir).await {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

enum Bounded<E> {
    Failed(E),
    /// Past [`COPY_DEADLINE`], or given up: the copy was told to stop.
    Late,
}

/// Runs a copy off the async threads; past the deadline it is told to stop
/// (it checks between entries).
async fn bounded<T: Send + 'static, E: Send + 'static>(
    work: impl FnOnce(&AtomicBool) -> Result<T, E> + Send + 'static,
) -> Result<T, Bounded<E>> {
    bounded_until(&CancellationToken::new(), work).await
}

/// [`bounded`], and told to stop as well once `given_up` is cancelled.
async fn bounded_until<T: Send + 'static, E: Send + 'static>(
    given_up: &CancellationToken,
    work: impl FnOnce(&AtomicBool) -> Result<T, E> + Send + 'static,
) -> Result<T, Bounded<E>> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let mut task = tokio::task::spawn_blocking(move || work(&flag));
    let joined = tokio::select! {
        joined = tokio::time::timeout(COPY_DEADLINE, &mut task) => joined.ok(),
        () = given_up.cancelled() => None,
    };
    let joined = match joined {
        Some(joined) => joined,
        None => {
            // The copy stops at its next entry (a file in flight ends
            // first): waited for, so the sandbox's next call never runs
            // beside it.
            stop.store(true, Ordering::Relaxed);
            let _ = task.await;
            return Err(Bounded::Late);
        }
    };
    match joined {
        Ok(done) => done.map_err(Bounded::Failed),
        Err(join) => std::panic::resume_unwind(join.into_panic()),
    }
}
