//! The host side of a fork: what a sandbox (or one of its snapshots) gives
//! the new sandboxes made from it.
//!
//! The new sandboxes are made first; the export then clones the source's
//! results and package folders (live, or a snapshot's saved ones) straight
//! into each new sandbox's, one copy from disk to disk, in the source's job
//! (its calls wait; processes it left running may still write). The Python
//! namespace the agent wrote for the fork (`docker/agent.py`, `dump`) is
//! moved out of the source's results to `state_dir/forks/<fork>/python.pickle`,
//! and each new sandbox is then seeded from it: the file placed in its
//! results for its agent to load.
//! The export goes when the last holder drops it; one left by a server that
//! stopped mid-fork is removed at the next start.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use tracing::warn;
use uuid::Uuid;

use super::copy;
use super::{bounded, bounded_until, Bounded, Folder, SnapshotError, SnapshotInfo, Snapshots};
use crate::error::CopyError;
use sandbox_host::SANDBOX_UID;
use sandbox_runtime::agent::{Carried, CarriedState, PythonState};
use sandbox_runtime::SandboxPaths;

/// The agent's fork file of a slot (a fork's, or a snapshot's Python state
/// carried out of or into the sandbox), beneath the results folder.
pub(super) struct ForkFile(String);

impl ForkFile {
    pub(super) fn of(slot: Uuid) -> Self {
        Self(format!("{}.pickle", super::slot(slot)))
    }

    /// Its path beneath the results folder, one name at a time.
    pub(super) fn rel(&self) -> [&str; 3] {
        [".mcp-sandbox", "fork", &self.0]
    }
}

/// A namespace on the host: a fork's, or a snapshot's written out.
pub(super) const PYTHON: &str = "python.pickle";

/// What a fork carries, on the host until the last new sandbox is seeded.
#[derive(Debug)]
pub struct Export {
    pub fork: Uuid,
    dir: PathBuf,
    /// How much of the namespace the source wrote (and whether the file
    /// came out of its sandbox: `Lost` otherwise).
    pub python: Carried,
    /// Files, folders and links each new sandbox received, and their bytes.
    pub files: u64,
    pub bytes: u64,
    /// Whether the packages were carried (only where the package volume is
    /// a capped disk of the server's).
    pub packages: bool,
}

/// A fork's hold on the export it queued at its source. Once given up (the
/// caller hung up, or the source's queue kept the export too long), an
/// export not yet begun never begins and one under way stops at its next
/// entry, so that the new sandboxes can be removed with nothing writing
/// into them.
#[derive(Debug, Clone)]
pub struct ExportHold {
    given_up: CancellationToken,
    running: Arc<tokio::sync::Mutex<()>>,
}

impl ExportHold {
    /// Given up as well when `token` is cancelled.
    pub fn child_of(token: &CancellationToken) -> Self {
        Self {
            given_up: token.child_token(),
            running: Default::default(),
        }
    }

    /// Gives the export up; returns once none of it runs.
    pub async fn give_up(&self) {
        self.given_up.cancel();
        drop(self.running.lock().await);
    }

    /// Held by the export while it runs; none once it was given up.
    pub(crate) async fn begin(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        let running = self.running.lock().await;
        (!self.given_up.is_cancelled()).then_some(running)
    }
}

impl Export {
    fn pickled(&self) -> bool {
        matches!(self.python.python, CarriedState::Carried | CarriedState::Partial)
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        let dir = std::mem::take(&mut self.dir);
        let remove = move || {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    warn!(dir = %dir.display(), error = %e, "could not remove a fork's export");
                }
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(remove)),
            Err(_) => remove(),
        }
    }
}

impl Snapshots {
    fn forks(&self) -> PathBuf {
        self.root.with_file_name("forks")
    }

    /// Gives the new sandboxes `into` what a fork of the sandbox carries:
    /// its folders as they are now, or those of the snapshot `from`, cloned
    /// into theirs (all at once); and takes the namespace the agent wrote
    /// for fork `fork` (`python` says how much) out of the sandbox's results.
    pub(crate) async fn export(
        &self,
        paths: &SandboxPaths,
        from: Option<&SnapshotInfo>,
        fork: Uuid,
        python: Carried,
        into: Vec<SandboxPaths>,
        hold: &ExportHold,
    ) -> Result<Export, SnapshotError> {
        let (store, paths, from) = (self.clone(), paths.clone(), from.cloned());
        bounded_until(&hold.given_up, move |stop| {
            let dir = store.forks().join(fork.to_string());
            std::fs::create_dir_all(&dir).map_err(SnapshotError::Store)?;
            let mut export = Export {
                fork,
                dir,
                python,
                files: 0,
                bytes: 0,
                packages: false,
            };
            if export.pickled() {
                let max = store.budget(Folder::Results).bytes;
                let file = export.dir.join(PYTHON);
                // A snapshot written out at a sleep holds its namespace in
                // its store; any other was written by the agent just now.
                let taken = match from.as_ref().filter(|s| s.python == PythonState::Saved) {
                    Some(s) => std::fs::copy(store.python_file(paths.id, s.snapshot_id), &file)
                        .map(drop)
                        .map_err(CopyError::from),
                    None => copy::take_file(&paths.results, &ForkFile::of(fork).rel(), &file, max).map(drop),
                };
                if let Err(e) = taken {
                    export.python = Carried::lost(format!("could not take the namespace out of the sandbox: {e}"));
                }
            }
            let mut sources = vec![];
            for (folder, live) in Folder::of(&paths) {
                let source = match &from {
                    Some(snapshot) => match snapshot.trees.get(folder) {
                        Some(tree) => store.trees(paths.id).join(tree),
                        None => continue,
                    },
                    None => live.to_path_buf(),
                };
                sources.push((folder, source));
            }
            let cloned = std::thread::scope(|scope| {
                let clones: Vec<_> = into
                    .iter()
                    .map(|fork| {
                        let (store, sources) = (&store, &sources);
                        // The first failure stops the other copies.
                        let clone = move || {
                            store
                                .clone_folders(sources, fork, stop)
                                .inspect_err(|_| stop.store(true, Ordering::Relaxed))
                        };
                        std::thread::Builder::new()
                            .name("fork copy".into())
                            .spawn_scoped(scope, clone)
                            .inspect_err(|_| stop.store(true, Ordering::Relaxed))
                    })
                    .collect();
                let mut done = Vec::with_capacity(clones.len());
                for clone in clones {
                    let result = clone
                        .map_err(CopyError::from)
                        .and_then(|c| c.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)));
                    done.push(result);
                }
                first_failure(done)
            })?;
            if let Some(&(files, bytes, packages)) = cloned.first() {
                (export.files, export.bytes, export.packages) = (files, bytes, packages);
            }
            Ok(export)
        })
        .await
        .map_err(|e| match e {
            Bounded::Failed(e) => e,
            Bounded::Late => SnapshotError::Export(CopyError::Stopped),
        })
    }

    /// Clones each of `sources` into the same folder of the new sandbox
    /// `fork`; answers the entries and bytes it wrote, and whether the
    /// packages were among them.
    fn clone_folders(
        &self,
        sources: &[(Folder, PathBuf)],
        fork: &SandboxPaths,
        stop: &AtomicBool,
    ) -> Result<(u64, u64, bool), CopyError> {
        let (mut files, mut bytes, mut packages) = (0, 0, false);
        for (folder, live) in Folder::of(fork) {
            let Some((_, source)) = sources.iter().find(|(f, _)| *f == folder) else {
                continue;
            };
            let cloned = copy::clone_into(source, live, SANDBOX_UID, self.budget(folder), stop)?;
            files += cloned.files;
            bytes += cloned.bytes;
            packages |= folder == Folder::Packages;
        }
        Ok((files, bytes, packages))
    }

    /// Places the namespace `export` carries in a new sandbox's results for
    /// its agent to load; says whether it did.
    pub(crate) async fn seed(&self, paths: &SandboxPaths, export: &Export) -> Result<bool, SnapshotError> {
        let (paths, dir, fork, pickled) = (paths.clone(), export.dir.clone(), export.fork, export.pickled());
        bounded(move |_stop| {
            if !pickled || !dir.join(PYTHON).is_file() {
                return Ok(false);
            }
            copy::place_file(
                &dir.join(PYTHON),
                &paths.results,
                &ForkFile::of(fork).rel(),
                SANDBOX_UID,
            )?;
            Ok(true)
        })
        .await
        .map_err(|e| match e {
            Bounded::Failed(e) => SnapshotError::Seed(e),
            Bounded::Late => SnapshotError::Seed(CopyError::Stopped),
        })
    }

    /// Removes the exports of forks that never ended (the server stopped).
    pub(crate) async fn remove_exports(&self) {
        if let Err(e) = super::remove_dir(self.forks()).await {
            warn!(error = %e, "could not remove unfinished forks' exports");
        }
    }
}

/// The copies' results, or the first real failure among them (the others
/// then stopped): one that filled a new sandbox's disk is the fork's, any
/// other the source's.
fn first_failure<T>(done: Vec<Result<T, CopyError>>) -> Result<Vec<T>, SnapshotError> {
    let mut stopped = None;
    let mut ok = Vec::with_capacity(done.len());
    for result in done {
        match result {
            Ok(t) => ok.push(t),
            Err(CopyError::Stopped) => stopped = Some(CopyError::Stopped),
            Err(CopyError::Io(e)) if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) => {
                return Err(SnapshotError::Seed(CopyError::Io(e)))
            }
            Err(e) => return Err(SnapshotError::Export(e)),
        }
    }
    match stopped {
        Some(e) => Err(SnapshotError::Export(e)),
        None => Ok(ok),
    }
}

/// How much of a namespace reached a fork: what the source wrote, less what
/// the fork could not read (listed first: when the list is cut, why the
/// fork has nothing is kept).
pub(crate) fn merge(written: &Carried, read: Carried) -> Carried {
    let mut skipped = read.skipped;
    skipped.extend(written.skipped.iter().cloned());
    skipped.truncate(Carried::MAX_SKIPPED);
    let python = match (written.python, read.python) {
        (_, CarriedState::Lost) => CarriedState::Lost,
        (CarriedState::Partial, _) | (_, CarriedState::Partial) => CarriedState::Partial,
        (state, _) => state,
    };
    Carried {
        python,
        names: read.names,
        skipped,
    }
}
