//! Several mcp-sandbox servers serving as one, coordinated through etcd.
//!
//! Each node is a whole server on its own host and engine; what they share
//! lives in etcd: each node's membership (a lease carrying its figures,
//! [`membership`]) and the directory of sandboxes (which node holds each,
//! whose it is, [`directory`]). etcd is reached through its JSON gateway
//! ([`etcd`]). Without a `[cluster]` section none of this runs.
//!
//! This crate knows nothing of sandboxes beyond their ids and tenants: the
//! server asks it before acknowledging a creation, tells it of deletions,
//! and reads from it where a sandbox lives.

pub mod channel;
pub mod config;
pub mod directory;
mod error;
pub mod etcd;
mod keys;
pub mod membership;
pub mod placement;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use uuid::Uuid;

use channel::Channel;

pub use config::ClusterConfig;
pub use directory::{Directory, Entry};
pub use error::ClusterError;
use etcd::{Etcd, Tls};
use keys::Keys;
pub use membership::{Capacity, Membership, NodeFigures};

/// This node's part in the cluster.
pub struct Cluster {
    pub config: ClusterConfig,
    pub membership: Arc<Membership>,
    pub directory: Directory,
    /// Calls to the other nodes.
    pub channel: Channel,
    etcd: Arc<Etcd>,
    keys: Keys,
    /// Where sandboxes were found: a sandbox never changes node, so a found
    /// entry stays true while the sandbox lives (and a stale one only sends
    /// a call to the node that answers "not found").
    located: Mutex<HashMap<Uuid, Entry>>,
    /// Each node's URL, as it joined.
    urls: Mutex<HashMap<String, String>>,
    /// The creations this node placed lately.
    pub recent: placement::Recent,
}

/// The most sandbox locations kept; past it the cache starts again.
const MOST_LOCATED: usize = 100_000;

/// A node as `cluster status` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct NodeStatus {
    pub name: String,
    /// `up` while its lease lives, `down` once it has expired.
    pub state: &'static str,
    /// New sandboxes are not placed on it.
    pub draining: bool,
    /// Sandboxes the directory says it holds.
    pub sandboxes: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub figures: Option<NodeFigures>,
}

/// The nodes that are up (their leases live), with their figures.
async fn nodes_up(etcd: &Etcd, keys: &Keys) -> Result<Vec<NodeFigures>, ClusterError> {
    let up = etcd.prefix(&keys.nodes()).await?;
    Ok(up
        .iter()
        .filter_map(|kv| serde_json::from_slice(&kv.value).ok())
        .collect())
}

/// etcd as a `[cluster]` section names it.
fn connect(config: &ClusterConfig) -> Result<Etcd, ClusterError> {
    config.validate()?;
    let tls = Tls {
        ca: config.etcd_ca_file.as_deref(),
        cert: config.etcd_cert_file.as_deref().zip(config.etcd_key_file.as_deref()),
    };
    Ok(Etcd::new(&config.etcd_endpoints, tls)?)
}

impl Cluster {
    /// Joins the cluster: membership is renewed in the background from now
    /// on, with the figures `capacity` reads.
    pub fn join(
        config: ClusterConfig,
        capacity: Arc<dyn Fn() -> Capacity + Send + Sync>,
    ) -> Result<Self, ClusterError> {
        let etcd = Arc::new(connect(&config)?);
        let keys = Keys::new(&config.prefix);
        let membership = Membership::start(
            etcd.clone(),
            keys.clone(),
            config.node_name.clone(),
            config.advertise_url.clone(),
            config.lease(),
            capacity,
        );
        // Figures are renewed every third of a lease.
        let recent = placement::Recent::new(config.lease() * 2 / 3);
        Ok(Self {
            directory: Directory::new(etcd.clone(), keys.clone()),
            membership,
            channel: Channel::new(&config),
            etcd,
            keys,
            config,
            located: Mutex::default(),
            urls: Mutex::default(),
            recent,
        })
    }

    /// Where sandbox `id` lives and whose it is, if the directory has it.
    pub async fn locate(&self, id: Uuid) -> Result<Option<Entry>, ClusterError> {
        if let Some(found) = self.located.lock().expect("never poisoned").get(&id) {
            return Ok(Some(found.clone()));
        }
        let found = self.directory.lookup(id).await?;
        if let Some(entry) = &found {
            let mut located = self.located.lock().expect("never poisoned");
            if located.len() >= MOST_LOCATED {
                located.clear();
            }
            located.insert(id, entry.clone());
        }
        Ok(found)
    }

    /// The URL node `name` joined with (`None`: never joined, or
    /// forgotten).
    pub async fn url_of(&self, name: &str) -> Result<Option<String>, ClusterError> {
        if let Some(url) = self.urls.lock().expect("never poisoned").get(name) {
            return Ok(Some(url.clone()));
        }
        let found = self.etcd.get(&self.keys.known(name)).await?;
        let url = found.and_then(|kv| String::from_utf8(kv.value).ok());
        if let Some(url) = &url {
            self.urls
                .lock()
                .expect("never poisoned")
                .insert(name.to_string(), url.clone());
        }
        Ok(url)
    }

    /// Whether node `name` is up: its lease lives.
    pub async fn is_up(&self, name: &str) -> Result<bool, ClusterError> {
        Ok(self.etcd.get(&self.keys.node(name)).await?.is_some())
    }

    /// Every node that joined and was not forgotten.
    pub async fn known_nodes(&self) -> Result<Vec<String>, ClusterError> {
        Ok(self.etcd.names(&self.keys.known_nodes()).await?)
    }

    /// Records a guest key issued to `address` if fewer than `most` were
    /// in the last hour over the whole cluster; false (nothing recorded)
    /// otherwise. Recorded first and counted after, so that nodes issuing
    /// at once never pass `most` together.
    pub async fn take_guest_issue(&self, address: &str, most: u32) -> Result<bool, ClusterError> {
        let prefix = self.keys.guests(address);
        let key = format!("{prefix}{}", Uuid::new_v4().simple());
        let lease = self.etcd.grant(3600).await?;
        self.etcd.put(&key, b"", Some(lease)).await?;
        if self.etcd.count(&prefix).await? <= u64::from(most) {
            return Ok(true);
        }
        let _ = self.etcd.revoke(lease).await;
        Ok(false)
    }

    /// Publishes this node's tenants' usage this month (the server's own
    /// encoding), which the other nodes add to theirs for budgets.
    pub async fn publish_usage(&self, value: &[u8]) -> Result<(), ClusterError> {
        Ok(self
            .etcd
            .put(&self.keys.usage(&self.config.node_name), value, None)
            .await?)
    }

    /// What the other nodes published of their tenants' usage.
    pub async fn others_usage(&self) -> Result<Vec<Vec<u8>>, ClusterError> {
        let own = self.keys.usage(&self.config.node_name);
        let all = self.etcd.prefix(&self.keys.usages()).await?;
        Ok(all.into_iter().filter(|kv| kv.key != own).map(|kv| kv.value).collect())
    }

    /// Forgets the URL kept for node `name` (it did not answer there; it
    /// may have come back elsewhere).
    pub fn forget_url(&self, name: &str) {
        self.urls.lock().expect("never poisoned").remove(name);
    }

    /// The nodes that drain: they take no new sandboxes.
    pub async fn draining_nodes(&self) -> Result<HashSet<String>, ClusterError> {
        Ok(self.etcd.names(&self.keys.drains()).await?.into_iter().collect())
    }

    /// The nodes that are up, with their figures.
    pub async fn nodes_up(&self) -> Result<Vec<NodeFigures>, ClusterError> {
        nodes_up(&self.etcd, &self.keys).await
    }

    /// The cluster's administration, for `mcp-sandbox cluster`: no
    /// membership of its own.
    pub fn admin(config: &ClusterConfig) -> Result<Admin, ClusterError> {
        let etcd = Arc::new(connect(config)?);
        let keys = Keys::new(&config.prefix);
        Ok(Admin {
            directory: Directory::new(etcd.clone(), keys.clone()),
            etcd,
            keys,
        })
    }

    /// Refuses new work while this node cannot be sure of its lease.
    pub fn check_held(&self) -> Result<(), ClusterError> {
        match self.membership.holds() {
            true => Ok(()),
            false => Err(ClusterError::Detached {
                seconds: self.membership.detached_for().as_secs().max(1),
            }),
        }
    }

    /// Leaves the cluster: the lease is given back, so the others see this
    /// node gone at once. The directory keeps its sandboxes.
    pub async fn leave(&self) {
        self.membership.leave().await;
    }
}

/// What `mcp-sandbox cluster` does.
pub struct Admin {
    pub directory: Directory,
    etcd: Arc<Etcd>,
    keys: Keys,
}

impl Admin {
    /// Every node that joined and was not forgotten, by name.
    pub async fn status(&self) -> Result<Vec<NodeStatus>, ClusterError> {
        let up = nodes_up(&self.etcd, &self.keys).await?;
        let drains: HashSet<String> = self.etcd.names(&self.keys.drains()).await?.into_iter().collect();
        let known = self.etcd.names(&self.keys.known_nodes()).await?;
        let entries = self.directory.all().await?;
        let mut names: Vec<String> = up.iter().map(|n| n.name.clone()).collect();
        names.extend(entries.iter().map(|(_, e)| e.node.clone()));
        names.extend(drains.iter().cloned());
        names.extend(known);
        names.sort();
        names.dedup();
        Ok(names
            .into_iter()
            .map(|name| {
                let figures = up.iter().find(|n| n.name == name).cloned();
                NodeStatus {
                    state: if figures.is_some() { "up" } else { "down" },
                    draining: drains.contains(&name),
                    sandboxes: entries.iter().filter(|(_, e)| e.node == name).count(),
                    figures,
                    name,
                }
            })
            .collect())
    }

    /// Stops (or with `on = false` resumes) placing new sandboxes on `node`.
    pub async fn drain(&self, node: &str, on: bool) -> Result<(), ClusterError> {
        match on {
            true => self.etcd.put(&self.keys.drain(node), b"", None).await?,
            false => {
                self.etcd.delete(&self.keys.drain(node)).await?;
            }
        }
        Ok(())
    }

    /// Removes a node that will not return: its sandboxes leave the
    /// directory (and so the quotas). Refused while the node is up.
    pub async fn forget(&self, node: &str) -> Result<usize, ForgetError> {
        if self
            .etcd
            .get(&self.keys.node(node))
            .await
            .map_err(ClusterError::from)?
            .is_some()
        {
            return Err(ForgetError::Up(node.to_string()));
        }
        let mut removed = 0;
        for id in self.directory.held_by(node).await? {
            if self.directory.release(id, node).await? {
                removed += 1;
            }
        }
        self.etcd
            .delete(&self.keys.known(node))
            .await
            .map_err(ClusterError::from)?;
        self.etcd
            .delete(&self.keys.drain(node))
            .await
            .map_err(ClusterError::from)?;
        Ok(removed)
    }
}

/// Why a node could not be forgotten.
#[derive(Debug, thiserror::Error)]
pub enum ForgetError {
    #[error("node {0} is up: stop it first (its lease must have expired)")]
    Up(String),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}
