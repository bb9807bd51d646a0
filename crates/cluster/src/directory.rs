//! The directory of sandboxes: which node holds each and whose it is.
//!
//! An entry is written in one transaction with its two index keys, and only
//! if the id is new, before a creation is acknowledged; it is removed with
//! them, and only by the node that holds it (or by `cluster forget` for a
//! node that will not return). Entries are not bound to a lease: a node
//! that dies leaves its sandboxes in the directory, `unreachable` until it
//! comes back, because their files are on its disks. A hibernated sandbox
//! keeps its entry and is marked asleep beside it: the quotas count live
//! sandboxes only, as one node's do.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::error::ClusterError;
use crate::etcd::{Etcd, Txn};
use crate::keys::Keys;

type Result<T> = std::result::Result<T, ClusterError>;

/// Where a sandbox lives and whose it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub node: String,
    pub tenant: String,
}

#[derive(Clone)]
pub struct Directory {
    etcd: Arc<Etcd>,
    keys: Keys,
}

impl Directory {
    pub(crate) fn new(etcd: Arc<Etcd>, keys: Keys) -> Self {
        Self { etcd, keys }
    }

    /// Writes `entry` for `id`, which must be new. A claim retried after
    /// an answer that was lost finds its own entry and succeeds.
    pub async fn claim(&self, id: Uuid, entry: &Entry) -> Result<()> {
        let key = self.keys.sandbox(id);
        let value = serde_json::to_vec(entry).expect("serialisable");
        let txn = Txn::new()
            .if_absent(&key)
            .put(&key, &value)
            .put(&format!("{}{id}", self.keys.tenant(&entry.tenant)), b"")
            .put(&format!("{}{id}", self.keys.held(&entry.node)), b"");
        if self.etcd.txn(txn).await? {
            return Ok(());
        }
        match self.lookup(id).await? {
            Some(found) if &found == entry => Ok(()),
            _ => Err(ClusterError::Taken(id)),
        }
    }

    /// Removes `id`'s entry if `node` holds it; false if there was none to
    /// remove (already gone, or another node's).
    pub async fn release(&self, id: Uuid, node: &str) -> Result<bool> {
        let key = self.keys.sandbox(id);
        let Some(found) = self.etcd.get(&key).await? else {
            return Ok(false);
        };
        let entry: Entry = match serde_json::from_slice(&found.value) {
            Ok(entry) => entry,
            Err(_) => return Ok(false),
        };
        if entry.node != node {
            return Ok(false);
        }
        let txn = Txn::new()
            .if_value(&key, &found.value)
            .delete(&key)
            .delete(&format!("{}{id}", self.keys.tenant(&entry.tenant)))
            .delete(&format!("{}{id}", self.keys.held(node)))
            .delete(&format!("{}{id}", self.keys.asleep(&entry.tenant)));
        Ok(self.etcd.txn(txn).await?)
    }

    /// Marks `id`, whose entry is `entry`, asleep (hibernated) or awake in
    /// the index the quotas of live sandboxes leave out; only while that
    /// entry stands, so that no mark outlives it. False when it did not.
    pub async fn mark_asleep(&self, id: Uuid, entry: &Entry, asleep: bool) -> Result<bool> {
        let key = format!("{}{id}", self.keys.asleep(&entry.tenant));
        let txn = Txn::new().if_value(
            &self.keys.sandbox(id),
            &serde_json::to_vec(entry).expect("serialisable"),
        );
        let txn = match asleep {
            true => txn.put(&key, entry.node.as_bytes()),
            false => txn.delete(&key),
        };
        Ok(self.etcd.txn(txn).await?)
    }

    /// The sandboxes `node` marked asleep.
    pub async fn asleep_on(&self, node: &str) -> Result<Vec<Uuid>> {
        let all = self.etcd.prefix(&self.keys.asleep_all()).await?;
        Ok(all
            .iter()
            .filter(|kv| kv.value == node.as_bytes())
            .filter_map(|kv| Uuid::parse_str(kv.key.rsplit('/').next()?).ok())
            .collect())
    }

    pub async fn lookup(&self, id: Uuid) -> Result<Option<Entry>> {
        let found = self.etcd.get(&self.keys.sandbox(id)).await?;
        Ok(found.and_then(|kv| serde_json::from_slice(&kv.value).ok()))
    }

    /// The sandboxes of `tenant` on every node.
    pub async fn of_tenant(&self, tenant: &str) -> Result<Vec<Uuid>> {
        self.ids(&self.keys.tenant(tenant)).await
    }

    /// The sandboxes an index under `prefix` lists.
    async fn ids(&self, prefix: &str) -> Result<Vec<Uuid>> {
        let names = self.etcd.names(prefix).await?;
        Ok(names.iter().filter_map(|n| Uuid::parse_str(n).ok()).collect())
    }

    /// How many live (not hibernated) sandboxes `tenant` has on every node.
    pub async fn count_of_tenant(&self, tenant: &str) -> Result<u64> {
        let all = self.etcd.count(&self.keys.tenant(tenant)).await?;
        Ok(all.saturating_sub(self.etcd.count(&self.keys.asleep(tenant)).await?))
    }

    /// How many live (not hibernated) sandboxes the cluster holds.
    pub async fn count(&self) -> Result<u64> {
        let all = self.etcd.count(&self.keys.sandboxes()).await?;
        Ok(all.saturating_sub(self.etcd.count(&self.keys.asleep_all()).await?))
    }

    /// The sandboxes `node` holds.
    pub async fn held_by(&self, node: &str) -> Result<Vec<Uuid>> {
        self.ids(&self.keys.held(node)).await
    }

    /// Every entry, by id.
    pub async fn all(&self) -> Result<Vec<(Uuid, Entry)>> {
        let prefix = self.keys.sandboxes();
        let all = self.etcd.prefix(&prefix).await?;
        Ok(all
            .iter()
            .filter_map(|kv| {
                let id = Uuid::parse_str(kv.key.strip_prefix(&prefix)?).ok()?;
                Some((id, serde_json::from_slice(&kv.value).ok()?))
            })
            .collect())
    }
}
