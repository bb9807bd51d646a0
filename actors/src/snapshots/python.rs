//! A snapshot's Python state on disk.
//!
//! A snapshot parks its Python state as a copy of the worker, in memory, in
//! the container; a sandbox that goes to sleep loses its container. Before
//! it goes, each parked copy writes its namespace to a fork file in the
//! sandbox's results (as a fork carries it), which is moved here, to
//! `state_dir/snapshots/<sandbox>/<snapshot>/python.pickle`, on the store's
//! own capped file system; the snapshot is then `saved`. A restore places
//! the file back for the agent to load into a fresh worker (it stays here
//! for the next restore); a fork of the snapshot copies it.

use std::path::PathBuf;

use uuid::Uuid;

use super::copy;
use super::fork::{ForkFile, PYTHON};
use super::{bounded, Bounded, Folder, SnapshotError, SnapshotInfo, Snapshots, META};
use crate::error::CopyError;
use sandbox_host::SANDBOX_UID;
use sandbox_runtime::agent::PythonState;
use sandbox_runtime::SandboxPaths;

impl Snapshots {
    /// Where snapshot `snapshot` of `sandbox` keeps its namespace once
    /// written out.
    pub(super) fn python_file(&self, sandbox: Uuid, snapshot: Uuid) -> PathBuf {
        self.dir(sandbox).join(snapshot.to_string()).join(PYTHON)
    }

    /// Moves the namespace the agent wrote to the fork file `file` (from
    /// snapshot `snapshot`'s parked copy) out of the sandbox's results into
    /// the snapshot's store, and marks the snapshot `saved`. A file that
    /// cannot be moved (a full store, say) is removed from the results all
    /// the same, and the snapshot marked `lost`.
    pub(crate) async fn keep_python(
        &self,
        paths: &SandboxPaths,
        snapshot: Uuid,
        file: Uuid,
    ) -> Result<(), SnapshotError> {
        let (store, paths) = (self.clone(), paths.clone());
        let kept = bounded(move |_stop| {
            let dst = store.python_file(paths.id, snapshot);
            let _ = std::fs::remove_file(&dst);
            let max = store.budget(Folder::Results).bytes;
            let taken =
                copy::take_file(&paths.results, &ForkFile::of(file).rel(), &dst, max).map_err(SnapshotError::Save);
            let state = match taken {
                Ok(_) => PythonState::Saved,
                Err(_) => PythonState::Lost,
            };
            store.set_python(paths.id, snapshot, state)?;
            store.measure(paths.id);
            taken.map(drop)
        });
        kept.await.map_err(|e| match e {
            Bounded::Failed(e) => e,
            Bounded::Late => SnapshotError::Save(CopyError::Stopped),
        })
    }

    /// Marks a snapshot's Python state `state` (its parked copy could not
    /// be written out: `lost`).
    pub(crate) fn set_python(&self, sandbox: Uuid, snapshot: Uuid, state: PythonState) -> Result<(), SnapshotError> {
        let mut info = self.find(sandbox, snapshot)?;
        info.python = state;
        self.write_meta(sandbox, &info).map_err(SnapshotError::Store)
    }

    /// Removes a fork file the agent wrote that is not kept (a sleep given
    /// up), and the folders it leaves empty.
    pub(crate) async fn discard_python(&self, paths: &SandboxPaths, file: Uuid) {
        let results = paths.results.clone();
        let _ = bounded(move |_stop| copy::remove_file(&results, &ForkFile::of(file).rel())).await;
    }

    /// Places a saved snapshot's namespace in the sandbox's results as the
    /// fork file `file`, for its agent to load.
    pub(crate) async fn place_python(
        &self,
        paths: &SandboxPaths,
        info: &SnapshotInfo,
        file: Uuid,
    ) -> Result<(), SnapshotError> {
        let (src, results) = (self.python_file(paths.id, info.snapshot_id), paths.results.clone());
        bounded(move |_stop| copy::place_file(&src, &results, &ForkFile::of(file).rel(), SANDBOX_UID))
            .await
            .map_err(|e| match e {
                Bounded::Failed(e) => SnapshotError::Restore(e),
                Bounded::Late => SnapshotError::Restore(CopyError::Stopped),
            })
    }

    /// Writes a snapshot's `meta.json` whole or not at all.
    pub(super) fn write_meta(&self, sandbox: Uuid, info: &SnapshotInfo) -> std::io::Result<()> {
        let dir = self.dir(sandbox).join(info.snapshot_id.to_string());
        let meta = serde_json::to_vec_pretty(info)?;
        std::fs::write(dir.join("meta.tmp"), meta)?;
        std::fs::rename(dir.join("meta.tmp"), dir.join(META))
    }
}
