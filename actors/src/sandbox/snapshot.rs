//! A sandbox's snapshot work, carried out while its job holds the link: the
//! agent parks, resumes or ends a copy of the Python worker, and the host
//! saves or brings back the files and packages ([`crate::snapshots`]).

use std::time::{Duration, Instant};

use tracing::{info, warn};
use uuid::Uuid;

use super::hibernation::reasons;
use super::join_notices;
use crate::agent_connection::AgentConnection;
use crate::error::{Result, SandboxError};
use crate::moment;
use crate::resources;
use crate::snapshots::{
    merge, slot, Carried, CarriedState, PythonState, Restored, SnapshotDone, SnapshotInfo, SnapshotOp,
};

/// The longest a fork's new sandbox waits for its turn to load: past the
/// fork's own wait for its source (15 minutes) and, in any ordinary run,
/// the loads of the new sandboxes released before it (four at a time). A
/// new sandbox whose wait runs out fails its fork, which is then undone.
const SEED_WAIT: Duration = Duration::from_secs(20 * 60);

/// Said with a restore whose Python state did not survive.
const PYTHON_LOST: &str = "The Python state saved in this snapshot is gone: a saved Python state lives as long as \
     the sandbox's container, which was restarted since (or the sandbox's code ended it). Files and packages were \
     restored; Python starts with a fresh namespace.";

pub(super) async fn carry_out(link: &mut AgentConnection, op: SnapshotOp) -> Result<(SnapshotDone, Option<String>)> {
    let ctx = link.ctx().clone();
    let store = &ctx.snapshots;
    let id = link.paths.id;
    match op {
        SnapshotOp::Take { label } => {
            store.check_room(id)?;
            resources::check_free_disk(&ctx.settings)?;
            let snapshot = Uuid::new_v4();
            let started = Instant::now();
            let (python, notice) = link.snapshot_python(&slot(snapshot)).await?;
            let parked = started.elapsed();
            let info = SnapshotInfo {
                snapshot_id: snapshot,
                label,
                created_at: moment::now(),
                python,
                trees: Default::default(),
                files: 0,
                bytes: 0,
            };
            match store.save(&link.paths, info).await {
                Ok(info) => {
                    info!(
                        sandbox = %id, %snapshot, python_ms = parked.as_millis() as u64,
                        files_ms = (started.elapsed() - parked).as_millis() as u64,
                        files = info.files, bytes = info.bytes, "snapshot saved"
                    );
                    Ok((SnapshotDone::Taken(info), notice))
                }
                Err(e) => {
                    forget(link, snapshot, python).await;
                    Err(e.into())
                }
            }
        }
        SnapshotOp::Restore { snapshot } => {
            let info = store.find(id, snapshot)?;
            let started = Instant::now();
            let (python, notice) = match info.python {
                PythonState::Saved => load_saved(link, &info).await?,
                state => {
                    link.restore_python(&slot(snapshot), state == PythonState::Parked)
                        .await?
                }
            };
            let resumed = started.elapsed();
            store.restore(&link.paths, &info).await?;
            info!(
                sandbox = %id, %snapshot, python_ms = resumed.as_millis() as u64,
                files_ms = (started.elapsed() - resumed).as_millis() as u64, ?python, "snapshot restored"
            );
            let lost = (python == PythonState::Lost).then(|| PYTHON_LOST.to_string());
            let restored = Restored {
                snapshot_id: snapshot,
                python,
                packages: info.packages(),
            };
            Ok((SnapshotDone::Restored(restored), join_notices(notice, lost)))
        }
        SnapshotOp::Export { fork, from, into, hold } => {
            let Some(_running) = hold.begin().await else {
                return Err(SandboxError::Internal(format!(
                    "fork {fork} was given up before its copy began"
                )));
            };
            resources::check_free_disk(&ctx.settings)?;
            let from = from.map(|s| store.find(id, s)).transpose()?;
            let started = Instant::now();
            let (python, notice) = match &from {
                // Its namespace is in its store: the export copies it.
                Some(s) if s.python == PythonState::Saved => (Carried::whole(), None),
                Some(s) if s.python != PythonState::Parked => (Carried::fresh(), None),
                _ => {
                    let parked = from.as_ref().map(|s| slot(s.snapshot_id));
                    link.dump_python(&slot(fork), parked.as_deref()).await?
                }
            };
            let dumped = started.elapsed();
            let count = into.len();
            let export = store
                .export(&link.paths, from.as_ref(), fork, python, into, &hold)
                .await?;
            info!(
                sandbox = %id, %fork, count, python_ms = dumped.as_millis() as u64,
                files_ms = (started.elapsed() - dumped).as_millis() as u64,
                python = ?export.python.python, files = export.files, bytes = export.bytes, "fork exported"
            );
            Ok((SnapshotDone::Exported(export), notice))
        }
        SnapshotOp::Seed { fork, mut export, .. } => {
            let export = match tokio::time::timeout(SEED_WAIT, export.wait_for(Option::is_some)).await {
                Ok(Ok(export)) => export.clone().expect("waited for"),
                _ => {
                    return Err(SandboxError::Internal(format!(
                        "the sandbox of fork {fork} could not be copied into this one, which the fork removes"
                    )))
                }
            };
            let started = Instant::now();
            let (python, notice) = match store.seed(&link.paths, &export).await? {
                true => {
                    let (read, notice) = link.load_python(&slot(export.fork)).await?;
                    (merge(&export.python, read), notice)
                }
                false => (export.python.clone(), None),
            };
            info!(
                sandbox = %id, fork = %export.fork, python_ms = started.elapsed().as_millis() as u64,
                python = ?python.python, "fork seeded"
            );
            Ok((SnapshotDone::Seeded(python), notice))
        }
        SnapshotOp::Delete { snapshot } => {
            let info = store.find(id, snapshot)?;
            forget(link, snapshot, info.python).await;
            store.remove(id, snapshot).await?;
            Ok((SnapshotDone::Deleted, None))
        }
    }
}

/// Restores a snapshot's namespace written out at a sleep: the file placed
/// in the results, a fresh worker, the file loaded into it. A file that
/// cannot be placed or read leaves Python fresh, and the notice says why.
async fn load_saved(link: &mut AgentConnection, info: &SnapshotInfo) -> Result<(PythonState, Option<String>)> {
    let store = link.ctx().snapshots.clone();
    let file = Uuid::new_v4();
    let placed = store.place_python(&link.paths, info, file).await;
    let (_, notice) = link.restore_python(&slot(info.snapshot_id), false).await?;
    let loaded = match placed {
        Ok(()) => link.load_python(&slot(file)).await.map(|(carried, _)| carried),
        Err(e) => Err(e.into()),
    };
    let lost = |why: String| {
        let said = format!("The Python state saved in this snapshot could not be loaded ({why}); Python starts with a fresh namespace.");
        Ok((PythonState::Lost, join_notices(notice.clone(), Some(said))))
    };
    match loaded {
        Ok(c) if c.python == CarriedState::Lost => lost(reasons(&c.skipped)),
        Ok(_) => Ok((PythonState::Restored, notice)),
        Err(e) => {
            store.discard_python(&link.paths, file).await;
            lost(e.to_string())
        }
    }
}

/// Writes the Python copy each snapshot parked out to the snapshot's store,
/// before the sandbox goes to sleep (its container, with the copies, goes);
/// answers what became of each. Each file is moved out as soon as it is
/// written (the agent clears fork files before each dump). With
/// `only_whole`, a copy that would not be written whole stops it: the
/// snapshots written out before it stay so (restored the same), the others
/// keep their copies.
pub(super) async fn write_out(link: &mut AgentConnection, only_whole: bool) -> Result<Vec<(Uuid, Carried)>> {
    let store = link.ctx().snapshots.clone();
    let id = link.paths.id;
    let parked: Vec<Uuid> = store
        .list(id)
        .into_iter()
        .filter(|s| s.python == PythonState::Parked)
        .map(|s| s.snapshot_id)
        .collect();
    let mut kept = Vec::with_capacity(parked.len());
    for snapshot in parked {
        let file = Uuid::new_v4();
        let (mut python, _) = link.dump_python(&slot(file), Some(&slot(snapshot))).await?;
        if python.python == CarriedState::Fresh {
            // No copy answered: its sandbox's code or a restart ended it.
            python = Carried::lost("its parked copy was gone".into());
        }
        let written = match python.python {
            CarriedState::Partial if only_whole => {
                store.discard_python(&link.paths, file).await;
                return Err(SandboxError::Asleep {
                    id,
                    why: format!(
                        "not put to sleep: the Python state of snapshot {snapshot} could not be saved whole ({}); \
                         its other Python states stay as they were",
                        reasons(&python.skipped)
                    ),
                });
            }
            CarriedState::Carried | CarriedState::Partial => store.keep_python(&link.paths, snapshot, file).await,
            CarriedState::Fresh | CarriedState::Lost => store.set_python(id, snapshot, PythonState::Lost),
        };
        match written {
            // Its namespace is on disk: the copy's memory is given back.
            Ok(()) if python.python != CarriedState::Lost => forget(link, snapshot, PythonState::Parked).await,
            Ok(()) => {}
            Err(e) => python = Carried::lost(e.to_string()),
        }
        kept.push((snapshot, python));
    }
    Ok(kept)
}

/// Ends a snapshot's parked Python copy. One that cannot be reached is left
/// to end with the container (its memory stays charged to the sandbox).
async fn forget(link: &mut AgentConnection, snapshot: Uuid, python: PythonState) {
    if python != PythonState::Parked {
        return;
    }
    if let Err(e) = link.forget_python(&slot(snapshot)).await {
        warn!(sandbox = %link.paths.id, %snapshot, error = %e, "could not end a snapshot's parked Python copy");
    }
}
