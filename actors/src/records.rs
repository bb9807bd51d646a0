//! Sandbox records in an embedded database (redb) in the server's state
//! folder: who owns a sandbox, its container, its times and its installs.
//! The records, never Docker labels, are the truth about ownership.
//!
//! A sandbox's installs live in a table of their own, one row per
//! requirement, so that an install changes one small row instead of
//! rewriting the whole record, however many installs the sandbox made.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::config::EgressPolicy;
use crate::error::{Result, SandboxError, StoreError};
use crate::snapshots::SnapshotTotals;
use sandbox_runtime::agent::{Carried, Package};
use sandbox_runtime::template::Template;

const SANDBOXES: TableDefinition<&str, &[u8]> = TableDefinition::new("sandboxes");
/// `"{sandbox id}/{requirement}"` → [`InstallRecord`].
const INSTALLS: TableDefinition<&str, &[u8]> = TableDefinition::new("installs");

fn install_key(id: Uuid, package: &str) -> String {
    format!("{id}/{package}")
}

/// The key range holding one sandbox's installs (`'0'` follows `'/'`).
fn installs_of(id: Uuid) -> std::ops::Range<String> {
    format!("{id}/")..format!("{id}0")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InstallState {
    Installing,
    Success,
    Failed,
}

/// The last install of one package spec in a sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstallRecord {
    pub package: String,
    pub status: InstallState,
    pub message: String,
    /// The installer's output, kept for failures.
    pub output: Option<String>,
    #[serde(with = "crate::moment")]
    pub started_at: OffsetDateTime,
    #[serde(with = "crate::moment::option")]
    pub finished_at: Option<OffsetDateTime>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub id: Uuid,
    /// The tenant (API key name) that owns the sandbox.
    pub owner: String,
    pub name: String,
    pub container_id: String,
    pub volume: String,
    #[serde(with = "crate::moment")]
    pub created_at: OffsetDateTime,
    #[serde(with = "crate::moment::option")]
    pub expires_at: Option<OffsetDateTime>,
    /// Loaded from, and written to, the installs table; records written by
    /// earlier versions carry them inline and are moved on first load.
    #[serde(default, skip_serializing)]
    pub installs: BTreeMap<String, InstallRecord>,
    /// Distributions in the sandbox's venv, as of the last install.
    pub packages: Vec<Package>,
    /// Its removal has begun: a server that stopped meanwhile finishes it
    /// at its next start instead of adopting the sandbox.
    #[serde(default)]
    pub deleting: bool,
    /// The egress policy it was created with (absent in records older than
    /// per-sandbox policies: the server's policy applies).
    #[serde(default)]
    pub egress: Option<EgressPolicy>,
    /// A fork not yet seeded from its source (the fork's id): a server that
    /// stopped meanwhile removes it at its next start, as the fork it was
    /// made for never answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seeding: Option<Uuid>,
    /// Ports reachable through preview links, until unexposed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exposed_ports: Vec<u16>,
    /// Set while the sandbox sleeps on disk (see `sandbox::hibernation`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hibernated: Option<Hibernated>,
    /// The template it was made from (none: the sandbox image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<Template>,
}

/// A sandbox asleep on disk: no container, its disks unmounted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hibernated {
    #[serde(with = "crate::moment")]
    pub since: OffsetDateTime,
    /// The fork file, on the sandbox's own results disk, that holds its
    /// Python namespace.
    pub slot: String,
    /// What of the namespace was written.
    pub python: Carried,
    /// Its snapshots, as counted when it went to sleep: their store is not
    /// mounted to be counted while it sleeps.
    #[serde(default)]
    pub snapshots: SnapshotTotals,
}

/// Handle on the database; cheap to clone. Calls block briefly (a write
/// commits to disk) and are made from `spawn_blocking`.
#[derive(Clone)]
pub struct RecordStore {
    pub(crate) db: Arc<Database>,
    /// Records waiting for the next write: concurrent writes (a burst of
    /// creations) share one transaction and one commit instead of queueing
    /// for a commit each.
    waiting: Arc<Mutex<Vec<PendingWrite>>>,
}

/// A record to write, and who waits for it to be durable.
type PendingWrite = (SandboxRecord, oneshot::Sender<Result<()>>);

impl RecordStore {
    pub fn open(path: &Path) -> Result<Self> {
        let db = Database::create(path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => StoreError::InUse(path.to_path_buf()),
            e => e.into(),
        })?;
        let txn = db.begin_write()?;
        move_inline_installs(&mut txn.open_table(SANDBOXES)?, &mut txn.open_table(INSTALLS)?)?;
        txn.commit()?;
        Ok(Self {
            db: Arc::new(db),
            waiting: Arc::default(),
        })
    }

    /// Writes the sandbox's own fields (its installs have rows of their own).
    /// Writes a sandbox's record; it is durable (committed) when this
    /// returns. Writes that arrive while another is being committed wait
    /// for the next commit and go in it together.
    pub async fn put(&self, record: SandboxRecord) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        let leads = {
            let mut waiting = self.waiting.lock().expect("records lock");
            waiting.push((record, tx));
            waiting.len() == 1
        };
        if leads {
            let (db, waiting) = (self.db.clone(), self.waiting.clone());
            tokio::task::spawn_blocking(move || {
                let outcomes = write_waiting(&db, &waiting);
                // The database is let go before anyone hears back, so a
                // store dropped on its answer closes the file (a restart
                // in the same process opens it again at once).
                drop(db);
                for (tx, outcome) in outcomes {
                    let _ = tx.send(outcome);
                }
            });
        }
        rx.await
            .map_err(|_| SandboxError::Internal("the record write ended inside the server; try again".into()))?
    }

    /// Writes one install of a sandbox, and forgets those in `forget`.
    pub async fn put_install(&self, id: Uuid, install: InstallRecord, forget: Vec<String>) -> Result<()> {
        let db = self.db.clone();
        blocking(move || {
            let txn = db.begin_write()?;
            let mut installs = txn.open_table(INSTALLS)?;
            installs.insert(
                install_key(id, &install.package).as_str(),
                to_json(&install)?.as_slice(),
            )?;
            for package in forget {
                installs.remove(install_key(id, &package).as_str())?;
            }
            drop(installs);
            txn.commit()?;
            Ok(())
        })
        .await
    }

    /// Removes a sandbox's record and its installs.
    pub async fn delete(&self, id: Uuid) -> Result<()> {
        let db = self.db.clone();
        blocking(move || {
            let txn = db.begin_write()?;
            txn.open_table(SANDBOXES)?.remove(id.to_string().as_str())?;
            let range = installs_of(id);
            txn.open_table(INSTALLS)?
                .retain_in::<&str, _>(range.start.as_str()..range.end.as_str(), |_, _| false)?;
            txn.commit()?;
            Ok(())
        })
        .await
    }

    /// Marks forks seeded (read and written in one commit, so nothing
    /// written meanwhile, a deletion say, is undone).
    pub async fn mark_seeded(&self, ids: Vec<Uuid>) -> Result<()> {
        self.update(ids, |record| record.seeding = None).await
    }

    /// Changes records in one commit, each read and written together, so
    /// nothing written meanwhile (a deletion, an unexposed port) is undone;
    /// ids without a record are passed over.
    pub async fn update(&self, ids: Vec<Uuid>, change: impl Fn(&mut SandboxRecord) + Send + 'static) -> Result<()> {
        let db = self.db.clone();
        blocking(move || {
            let txn = db.begin_write()?;
            let mut table = txn.open_table(SANDBOXES)?;
            for id in ids {
                let key = id.to_string();
                let record = table
                    .get(key.as_str())?
                    .map(|v| serde_json::from_slice::<SandboxRecord>(v.value()));
                if let Some(Ok(mut record)) = record {
                    change(&mut record);
                    table.insert(key.as_str(), to_json(&record)?.as_slice())?;
                }
            }
            drop(table);
            txn.commit()?;
            Ok(())
        })
        .await
    }

    pub async fn all(&self) -> Result<Vec<SandboxRecord>> {
        let db = self.db.clone();
        blocking(move || {
            let txn = db.begin_read()?;
            let table = txn.open_table(SANDBOXES)?;
            let installs = txn.open_table(INSTALLS)?;
            let mut out = Vec::new();
            for entry in table.iter()? {
                let (_, value) = entry?;
                out.extend(with_installs(value.value(), &installs)?);
            }
            Ok(out)
        })
        .await
    }

    /// The records of `ids` that exist, read in one transaction.
    pub async fn some(&self, ids: Vec<Uuid>) -> Result<Vec<SandboxRecord>> {
        let db = self.db.clone();
        blocking(move || {
            let txn = db.begin_read()?;
            let table = txn.open_table(SANDBOXES)?;
            let installs = txn.open_table(INSTALLS)?;
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                if let Some(value) = table.get(id.to_string().as_str())? {
                    out.extend(with_installs(value.value(), &installs)?);
                }
            }
            Ok(out)
        })
        .await
    }

    pub async fn get(&self, id: Uuid) -> Result<Option<SandboxRecord>> {
        Ok(self.some(vec![id]).await?.pop())
    }
}

/// A stored record with its installs; `None` (logged) if it cannot be read.
fn with_installs(
    value: &[u8],
    installs: &impl redb::ReadableTable<&'static str, &'static [u8]>,
) -> Result<Option<SandboxRecord>> {
    let mut record: SandboxRecord = match serde_json::from_slice(value) {
        Ok(record) => record,
        Err(e) => {
            tracing::warn!(error = %e, "skipping an unreadable sandbox record");
            return Ok(None);
        }
    };
    let range = installs_of(record.id);
    for entry in installs.range::<&str>(range.start.as_str()..range.end.as_str())? {
        let (_, value) = entry?;
        match serde_json::from_slice::<InstallRecord>(value.value()) {
            Ok(install) => {
                record.installs.insert(install.package.clone(), install);
            }
            Err(e) => tracing::warn!(error = %e, "skipping an unreadable install record"),
        }
    }
    Ok(Some(record))
}

/// Records written by earlier versions carry their installs inline: each
/// install moves to a row of its own and the record is rewritten without.
fn move_inline_installs(
    sandboxes: &mut redb::Table<&str, &[u8]>,
    installs: &mut redb::Table<&str, &[u8]>,
) -> Result<()> {
    let mut legacy = Vec::new();
    for entry in sandboxes.iter()? {
        let (_, value) = entry?;
        if let Ok(record) = serde_json::from_slice::<SandboxRecord>(value.value()) {
            if !record.installs.is_empty() {
                legacy.push(record);
            }
        }
    }
    for record in legacy {
        for install in record.installs.values() {
            installs.insert(
                install_key(record.id, &install.package).as_str(),
                to_json(install)?.as_slice(),
            )?;
        }
        sandboxes.insert(record.id.to_string().as_str(), to_json(&record)?.as_slice())?;
    }
    Ok(())
}

pub(crate) fn to_json(value: &impl Serialize) -> Result<Vec<u8>> {
    Ok(serde_json::to_vec(value).map_err(StoreError::Encoding)?)
}

/// Writes every waiting record in one transaction, once the previous
/// writer's commit is done (redb has one writer at a time: what arrives
/// meanwhile joins this batch). Should the batch fail, each record is
/// written alone, so each waiter gets its own record's outcome.
fn write_waiting(db: &Database, waiting: &Mutex<Vec<PendingWrite>>) -> Vec<(oneshot::Sender<Result<()>>, Result<()>)> {
    let insert = |txn: &redb::WriteTransaction, record: &SandboxRecord| -> Result<()> {
        txn.open_table(SANDBOXES)?
            .insert(record.id.to_string().as_str(), to_json(record)?.as_slice())?;
        Ok(())
    };
    let txn = db.begin_write();
    let batch = std::mem::take(&mut *waiting.lock().expect("records lock"));
    let together = txn.map_err(SandboxError::from).and_then(|txn| {
        batch.iter().try_for_each(|(record, _)| insert(&txn, record))?;
        txn.commit()?;
        Ok(())
    });
    batch
        .into_iter()
        .map(|(record, tx)| {
            let outcome = match together {
                Ok(()) => Ok(()),
                Err(_) => db
                    .begin_write()
                    .map_err(SandboxError::from)
                    .and_then(|txn| insert(&txn, &record).and_then(|()| Ok(txn.commit()?))),
            };
            (tx, outcome)
        })
        .collect()
}

pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| SandboxError::Internal(e.to_string()))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::moment;

    fn record(owner: &str) -> SandboxRecord {
        SandboxRecord {
            id: Uuid::new_v4(),
            owner: owner.into(),
            name: "n".into(),
            container_id: "c".into(),
            volume: "v".into(),
            created_at: moment::now(),
            expires_at: None,
            installs: BTreeMap::new(),
            packages: vec![],
            deleting: false,
            egress: None,
            seeding: None,
            exposed_ports: Vec::new(),
            hibernated: None,
            template: None,
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn concurrent_writes_share_commits_and_every_one_is_durable_when_answered() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.redb");
        let records: Vec<_> = (0..200).map(|i| record(&format!("tenant-{}", i % 7))).collect();
        {
            let store = RecordStore::open(&path).unwrap();
            let writes = records.iter().cloned().map(|r| {
                let store = store.clone();
                tokio::spawn(async move { store.put(r).await })
            });
            for done in futures_util::future::join_all(writes).await {
                done.unwrap().unwrap();
            }
            // Rewriting one within a burst keeps its latest version.
            let mut renamed = records[3].clone();
            renamed.name = "renamed".into();
            let (x, y) = tokio::join!(store.put(records[4].clone()), store.put(renamed));
            x.unwrap();
            y.unwrap();
        }
        let reopened = RecordStore::open(&path).unwrap();
        let mut loaded = reopened.all().await.unwrap();
        loaded.sort_by_key(|r| r.id);
        let mut expected = records.clone();
        expected[3].name = "renamed".into();
        expected.sort_by_key(|r| r.id);
        assert_eq!(loaded, expected);
    }

    #[tokio::test]
    async fn records_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.redb");
        let (a, b) = (record("alice"), record("bob"));
        {
            let store = RecordStore::open(&path).unwrap();
            store.put(a.clone()).await.unwrap();
            store.put(b.clone()).await.unwrap();
            store.delete(b.id).await.unwrap();
            assert!(RecordStore::open(&path).is_err(), "one server per state folder");
        }
        let store = RecordStore::open(&path).unwrap();
        assert_eq!(store.all().await.unwrap(), vec![a]);
    }

    fn install(package: &str) -> InstallRecord {
        InstallRecord {
            package: package.into(),
            status: InstallState::Failed,
            message: "m".into(),
            output: None,
            started_at: moment::now(),
            finished_at: None,
        }
    }

    #[tokio::test]
    async fn installs_are_rows_of_their_own_and_go_with_their_sandbox() {
        let dir = tempfile::tempdir().unwrap();
        let store = RecordStore::open(&dir.path().join("db.redb")).unwrap();
        let (a, b) = (record("alice"), record("bob"));
        store.put(a.clone()).await.unwrap();
        store.put(b.clone()).await.unwrap();
        store.put_install(a.id, install("six"), vec![]).await.unwrap();
        store
            .put_install(a.id, install("numpy"), vec!["six".into()])
            .await
            .unwrap();
        store.put_install(b.id, install("pandas"), vec![]).await.unwrap();
        let all = store.all().await.unwrap();
        let of = |id| all.iter().find(|r| r.id == id).unwrap();
        assert_eq!(of(a.id).installs.keys().collect::<Vec<_>>(), ["numpy"]);
        assert_eq!(of(b.id).installs.keys().collect::<Vec<_>>(), ["pandas"]);
        // The sandbox's own row no longer carries installs.
        store.put(of(a.id).clone()).await.unwrap();
        store.delete(a.id).await.unwrap();
        let all = store.all().await.unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].installs.keys().collect::<Vec<_>>(), ["pandas"]);
    }

    #[tokio::test]
    async fn inline_installs_of_earlier_versions_move_to_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.redb");
        let mut legacy = serde_json::to_value(record("alice")).unwrap();
        let id = legacy["id"].as_str().unwrap().to_string();
        legacy["installs"] = serde_json::json!({ "six": install("six") });
        {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            let bytes = serde_json::to_vec(&legacy).unwrap();
            txn.open_table(SANDBOXES)
                .unwrap()
                .insert(id.as_str(), bytes.as_slice())
                .unwrap();
            txn.commit().unwrap();
        }
        let store = RecordStore::open(&path).unwrap();
        let mut all = store.all().await.unwrap();
        assert_eq!(all[0].installs.keys().collect::<Vec<_>>(), ["six"]);
        all[0].installs.clear();
        store.put(all.remove(0)).await.unwrap();
        assert_eq!(store.all().await.unwrap()[0].installs.len(), 1, "kept in its own row");
    }
}
