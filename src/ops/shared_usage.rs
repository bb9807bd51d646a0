//! Monthly budgets over a cluster: every [`SHARE_EVERY`] each node
//! publishes its tenants' totals this month and reads the others', and a
//! budget check adds the others' to its own, so a budget holds over every
//! node within that time (a tenant whose sandboxes are spread over nodes
//! cannot use a budget once per node).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sandbox_actors::usage::{month_of, Totals};
use sandbox_cluster::Cluster;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::ops::Ops;

/// How often usage is shared.
const SHARE_EVERY: Duration = Duration::from_secs(10);
/// The most tenants a node publishes (those that used the most CPU): the
/// value stays far below etcd's request limit.
const MOST_TENANTS: usize = 4000;

/// What one node publishes.
#[derive(Serialize, Deserialize)]
struct Published {
    /// The month (its first second, Unix time).
    month: i64,
    tenants: HashMap<String, Totals>,
}

/// The other nodes' totals this month, by tenant, as last read.
#[derive(Default)]
pub struct OthersUsage {
    month: i64,
    by_tenant: HashMap<String, Totals>,
}

impl Ops {
    /// What `tenant` used this month on the other nodes, as last shared.
    pub(crate) fn used_elsewhere(&self, tenant: &str) -> Option<Totals> {
        self.cluster.as_ref()?;
        let others = self.others_usage.lock().expect("never poisoned");
        let (month, _) = month_of(time::OffsetDateTime::now_utc());
        (others.month == month.unix_timestamp())
            .then(|| others.by_tenant.get(tenant).copied())
            .flatten()
    }
}

/// Shares usage with the other nodes until `stop`.
pub async fn share_usage(ops: Ops, cluster: Arc<Cluster>, stop: CancellationToken) {
    loop {
        let month = month_of(time::OffsetDateTime::now_utc()).0.unix_timestamp();
        let mine = Published {
            month,
            tenants: ops.sandboxes.month_by_tenant(MOST_TENANTS).into_iter().collect(),
        };
        let value = serde_json::to_vec(&mine).expect("serialisable");
        if let Err(e) = cluster.publish_usage(&value).await {
            warn!(error = %e, "could not share this node's usage");
        }
        match cluster.others_usage().await {
            Ok(published) => {
                let mut by_tenant: HashMap<String, Totals> = HashMap::new();
                let theirs = published
                    .iter()
                    .filter_map(|v| serde_json::from_slice::<Published>(v).ok())
                    .filter(|p| p.month == month);
                for p in theirs {
                    for (tenant, totals) in p.tenants {
                        by_tenant.entry(tenant).or_default().add(&totals);
                    }
                }
                *ops.others_usage.lock().expect("never poisoned") = OthersUsage { month, by_tenant };
            }
            Err(e) => warn!(error = %e, "could not read the other nodes' usage"),
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(SHARE_EVERY) => {}
        }
    }
}
