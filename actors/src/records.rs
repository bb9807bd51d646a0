//! Sandbox records in an embedded database (redb) in the server's state
//! folder: who owns a sandbox, its container, its times and its installs.
//! The records, never Docker labels, are the truth about ownership.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::agent::Package;
use crate::config::EgressPolicy;
use crate::error::{Result, SandboxError};

const SANDBOXES: TableDefinition<&str, &[u8]> = TableDefinition::new("sandboxes");

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
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option")]
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
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option")]
    pub expires_at: Option<OffsetDateTime>,
    pub installs: BTreeMap<String, InstallRecord>,
    /// Distributions in the sandbox's venv, as of the last install.
    pub packages: Vec<Package>,
    /// The egress policy it was created with (absent in records older than
    /// per-sandbox policies: the server's policy applies).
    #[serde(default)]
    pub egress: Option<EgressPolicy>,
}

/// Handle on the database; cheap to clone. Calls block briefly (a write
/// commits to disk) and are made from `spawn_blocking`.
#[derive(Clone)]
pub struct RecordStore {
    db: Arc<Database>,
}

impl RecordStore {
    pub fn open(path: &Path) -> Result<Self> {
        let db = Database::create(path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => SandboxError::Store(format!(
                "{} is in use by another mcp-sandbox server; give each server its own server.state_dir",
                path.display()
            )),
            e => e.into(),
        })?;
        let txn = db.begin_write()?;
        txn.open_table(SANDBOXES)?;
        txn.commit()?;
        Ok(Self { db: Arc::new(db) })
    }

    pub async fn put(&self, record: SandboxRecord) -> Result<()> {
        let db = self.db.clone();
        blocking(move || {
            let bytes = serde_json::to_vec(&record).map_err(|e| SandboxError::Store(e.to_string()))?;
            let txn = db.begin_write()?;
            txn.open_table(SANDBOXES)?
                .insert(record.id.to_string().as_str(), bytes.as_slice())?;
            txn.commit()?;
            Ok(())
        })
        .await
    }

    pub async fn delete(&self, id: Uuid) -> Result<()> {
        let db = self.db.clone();
        blocking(move || {
            let txn = db.begin_write()?;
            txn.open_table(SANDBOXES)?.remove(id.to_string().as_str())?;
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
            let mut out = Vec::new();
            for entry in table.iter()? {
                let (_, value) = entry?;
                match serde_json::from_slice(value.value()) {
                    Ok(record) => out.push(record),
                    Err(e) => tracing::warn!(error = %e, "skipping an unreadable sandbox record"),
                }
            }
            Ok(out)
        })
        .await
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| SandboxError::Internal(e.to_string()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(owner: &str) -> SandboxRecord {
        SandboxRecord {
            id: Uuid::new_v4(),
            owner: owner.into(),
            name: "n".into(),
            container_id: "c".into(),
            volume: "v".into(),
            created_at: OffsetDateTime::now_utc(),
            expires_at: None,
            installs: BTreeMap::new(),
            packages: vec![],
            egress: None,
        }
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
}
