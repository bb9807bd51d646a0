//! A node's membership: a lease in etcd, renewed every third of its life,
//! under which the node's figures are kept. The node is up while the lease
//! lives; a node that stops renewing (killed, cut off) is down a lease's
//! time later, for every other node, with nothing to clean up.
//!
//! The node itself counts as holding its sandboxes only while it could
//! renew: [`Membership::holds`] turns false a lease's time after the last
//! renewal etcd confirmed (counted from when that renewal was sent), which
//! is no later than when the others see it gone. A node cut off from etcd
//! thus stops taking new work before anyone could count it down.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::etcd::{Etcd, EtcdError, Txn};

/// Why a join did not happen this time.
#[derive(Debug, thiserror::Error)]
enum JoinError {
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    #[error(
        "another process holds this node's name (or this node's previous lease has not expired yet); \
         every node needs a name of its own"
    )]
    NameHeld,
}
use crate::keys::Keys;

/// What a node can take, as it says in its membership.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capacity {
    /// Pooled sandboxes ready to be claimed.
    pub ready: usize,
    /// Sandboxes that belong to someone and are awake (a hibernated one
    /// holds no memory).
    pub live: usize,
    /// The host's memory not yet promised to a sandbox.
    pub free_memory_mb: u64,
    /// The OCI runtimes its engine has.
    pub runtimes: Vec<String>,
}

/// A node as the cluster sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeFigures {
    pub name: String,
    /// Its base URL, for the other nodes.
    pub url: String,
    #[serde(flatten)]
    pub capacity: Capacity,
}

/// This node's membership, renewed in the background until stopped.
pub struct Membership {
    etcd: Arc<Etcd>,
    keys: Keys,
    name: String,
    url: String,
    ttl: Duration,
    /// Until when this node can be sure its lease lives.
    held_until: Mutex<Option<Instant>>,
    stop: CancellationToken,
    renewing: Mutex<Option<JoinHandle<()>>>,
}

impl Membership {
    /// Starts renewing; `capacity` is read at each renewal. The first
    /// renewal is tried at once; until one succeeds the node holds nothing.
    pub(crate) fn start(
        etcd: Arc<Etcd>,
        keys: Keys,
        name: String,
        url: String,
        ttl: Duration,
        capacity: Arc<dyn Fn() -> Capacity + Send + Sync>,
    ) -> Arc<Self> {
        let membership = Arc::new(Self {
            etcd,
            keys,
            name,
            url,
            ttl,
            held_until: Mutex::new(None),
            stop: CancellationToken::new(),
            renewing: Mutex::new(None),
        });
        let renewing = tokio::spawn(membership.clone().renew(capacity));
        *membership.renewing.lock().expect("never poisoned") = Some(renewing);
        membership
    }

    /// Whether this node's lease surely lives now.
    pub fn holds(&self) -> bool {
        self.held_until().is_some_and(|until| Instant::now() < until)
    }

    fn held_until(&self) -> Option<Instant> {
        *self.held_until.lock().expect("never poisoned")
    }

    /// How long the node has been unsure of its lease (zero while it
    /// holds).
    pub fn detached_for(&self) -> Duration {
        match self.held_until() {
            Some(until) => Instant::now().saturating_duration_since(until),
            None => self.ttl,
        }
    }

    /// Stops renewing and gives the lease back, so that the others see
    /// this node gone at once.
    pub async fn leave(&self) {
        self.stop.cancel();
        let renewing = self.renewing.lock().expect("never poisoned").take();
        if let Some(renewing) = renewing {
            let _ = renewing.await;
        }
    }

    async fn renew(self: Arc<Self>, capacity: Arc<dyn Fn() -> Capacity + Send + Sync>) {
        let mut lease: Option<i64> = None;
        let key = self.keys.node(&self.name);
        let period = self.ttl / 3;
        // A margin for the time between etcd's renewal and the answer's
        // arrival, which the send time already covers, and for timers.
        let margin = Duration::from_millis(200);
        loop {
            let figures = NodeFigures {
                name: self.name.clone(),
                url: self.url.clone(),
                capacity: capacity(),
            };
            let value = serde_json::to_vec(&figures).expect("serialisable");
            // When the request that renewed the lease (or granted a new
            // one) was sent: the lease lives a lease's time from no
            // earlier than that.
            let mut renewed: Option<Instant> = None;
            if let Some(id) = lease {
                let sent = Instant::now();
                match self.etcd.keep_alive(id).await {
                    Ok(Some(_)) => match self.etcd.put(&key, &value, Some(id)).await {
                        Ok(()) => renewed = Some(sent),
                        Err(e) => warn!(node = %self.name, error = %e, "could not write this node's figures"),
                    },
                    Ok(None) => {
                        warn!(node = %self.name, "the membership lease expired; joining again");
                        lease = None;
                    }
                    Err(e) => warn!(node = %self.name, error = %e, "could not renew the membership lease"),
                }
            }
            if lease.is_none() {
                let sent = Instant::now();
                match self.join(&key, &value).await {
                    Ok(id) => {
                        info!(node = %self.name, lease = id, "joined the cluster");
                        lease = Some(id);
                        renewed = Some(sent);
                    }
                    Err(e) => warn!(node = %self.name, error = %e, "could not join the cluster; trying again"),
                }
            }
            if let Some(sent) = renewed {
                *self.held_until.lock().expect("never poisoned") = Some(sent + self.ttl - margin);
            }
            tokio::select! {
                () = self.stop.cancelled() => break,
                () = tokio::time::sleep(period) => {}
            }
        }
        if let Some(lease) = lease {
            if let Err(e) = self.etcd.revoke(lease).await {
                warn!(error = %e, "could not give the membership lease back; it expires by itself");
            }
        }
    }

    /// A new lease, under which this node's key is written only if no
    /// other process holds the name (or this node's previous lease, after
    /// a crash, has not expired yet): two processes never serve one name.
    async fn join(&self, key: &str, value: &[u8]) -> Result<i64, JoinError> {
        let id = self.etcd.grant(self.ttl.as_secs()).await?;
        let txn = Txn::new().if_absent(key).put_leased(key, value, id);
        if !self.etcd.txn(txn).await? {
            let _ = self.etcd.revoke(id).await;
            return Err(JoinError::NameHeld);
        }
        self.etcd
            .put(&self.keys.known(&self.name), self.url.as_bytes(), None)
            .await?;
        Ok(id)
    }
}
