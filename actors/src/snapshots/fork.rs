//! The host side of a fork: what a sandbox (or one of its snapshots) gives
//! the new sandboxes made from it.
//!
//! An export is `state_dir/forks/<fork>/`: the results and package folders
//! copied from the sandbox's live folders or from a snapshot's saved ones
//! (files unchanged since that snapshot are hard-linked, not copied), and
//! `python.pickle`, the Python namespace the agent wrote for the fork
//! (`docker/agent.py`, `dump`), moved out of the sandbox's results. Each
//! new sandbox is then seeded from it: its folders made those of the
//! export, and the namespace placed in its results for its agent to load.
//! The export goes when the last holder drops it; one left by a server that
//! stopped mid-fork is removed at the next start.

use std::path::PathBuf;

use tracing::warn;
use uuid::Uuid;

use super::copy;
use super::{bounded, slot, Bounded, Folder, SnapshotError, SnapshotInfo, Snapshots};
use crate::agent::{Carried, CarriedState};
use crate::error::CopyError;
use crate::runtime::{SandboxPaths, SANDBOX_UID};

/// The agent's fork file of `fork`, beneath the results folder.
fn fork_file(fork: Uuid) -> [String; 3] {
    [".mcp-sandbox".into(), "fork".into(), format!("{}.pickle", slot(fork))]
}

const PYTHON: &str = "python.pickle";

/// What a fork carries, on the host until the last new sandbox is seeded.
#[derive(Debug)]
pub struct Export {
    pub fork: Uuid,
    dir: PathBuf,
    /// How much of the namespace the source wrote (and whether the file
    /// came out of its sandbox: `Lost` otherwise).
    pub python: Carried,
    /// Files, folders and links carried, and the bytes newly copied for them.
    pub files: u64,
    pub bytes: u64,
    /// Whether the packages were carried (only where the package volume is
    /// a capped disk of the server's).
    pub packages: bool,
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

    /// Copies what a fork of the sandbox carries: its folders as they are
    /// now, or those of the snapshot `from`; and the namespace the agent
    /// wrote for fork `fork` (`python` says how much), moved out of the
    /// sandbox's results.
    pub(crate) async fn export(
        &self,
        paths: &SandboxPaths,
        from: Option<&SnapshotInfo>,
        fork: Uuid,
        python: Carried,
    ) -> Result<Export, SnapshotError> {
        let (store, paths, from) = (self.clone(), paths.clone(), from.cloned());
        bounded(move |stop| {
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
                let rel = fork_file(fork);
                let rel: Vec<&str> = rel.iter().map(String::as_str).collect();
                let max = store.budget(Folder::Results).bytes;
                if let Err(e) = copy::take_file(&paths.results, &rel, &export.dir.join(PYTHON), max) {
                    export.python = Carried::lost(format!("could not take the namespace out of the sandbox: {e}"));
                }
            }
            let latest = store.list(paths.id).pop();
            for (folder, live) in Folder::of(&paths) {
                let tree = |s: &SnapshotInfo| s.trees.get(folder).map(|t| store.trees(paths.id).join(t));
                let source = match &from {
                    Some(snapshot) => match tree(snapshot) {
                        Some(tree) => tree,
                        None => continue,
                    },
                    None => live.to_path_buf(),
                };
                // Unchanged files are linked from the snapshot's tree.
                let previous = from.as_ref().or(latest.as_ref()).and_then(tree);
                let saved = copy::save(
                    &source,
                    &export.dir.join(format!("{folder:?}")),
                    previous.as_deref(),
                    store.budget(folder),
                    stop,
                )
                .map_err(SnapshotError::Export)?;
                export.files += saved.files;
                export.bytes += saved.bytes;
                export.packages |= matches!(folder, Folder::Packages);
            }
            Ok(export)
        })
        .await
        .map_err(|e| match e {
            Bounded::Failed(e) => e,
            Bounded::Late => SnapshotError::Export(CopyError::Stopped),
        })
    }

    /// Makes a new sandbox's folders those of `export`, and places the
    /// namespace in its results for its agent to load; says whether it did.
    pub(crate) async fn seed(&self, paths: &SandboxPaths, export: &Export) -> Result<bool, SnapshotError> {
        let (paths, dir, fork, pickled) = (paths.clone(), export.dir.clone(), export.fork, export.pickled());
        bounded(move |stop| {
            for (folder, live) in Folder::of(&paths) {
                let saved = dir.join(format!("{folder:?}"));
                if saved.is_dir() {
                    copy::restore(&saved, live, SANDBOX_UID, stop)?;
                }
            }
            if !pickled || !dir.join(PYTHON).is_file() {
                return Ok(false);
            }
            let rel = fork_file(fork);
            let rel: Vec<&str> = rel.iter().map(String::as_str).collect();
            copy::place_file(&dir.join(PYTHON), &paths.results, &rel, SANDBOX_UID)?;
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
