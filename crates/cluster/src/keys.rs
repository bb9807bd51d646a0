//! Where the cluster's facts live in etcd, under the configured prefix:
//!
//! - `nodes/<node>`: a node's figures, bound to its lease (gone with it);
//! - `known/<node>`: every node that ever joined, till it is forgotten (so
//!   that a node that is down is still listed);
//! - `drain/<node>`: the node takes no new sandboxes;
//! - `sandboxes/<id>`: which node holds a sandbox and whose it is;
//! - `tenants/<tenant digest>/<id>` and `held/<node>/<id>`: the same,
//!   indexed, so that a tenant's sandboxes are counted and a node's listed
//!   without reading every sandbox's entry;
//! - `asleep/<tenant digest>/<id>`: a hibernated sandbox (valued with its
//!   node), which the quotas of live sandboxes leave out;
//! - `guests/<address digest>/<key>`: a guest key issued to an address,
//!   bound to an hour's lease;
//! - `usage/<node>`: the node's tenants' usage this month, for budgets.

use sha2::{Digest, Sha256};
use uuid::Uuid;

#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    pub(crate) fn new(prefix: &str) -> Self {
        Self { prefix: prefix.into() }
    }

    pub(crate) fn nodes(&self) -> String {
        format!("{}nodes/", self.prefix)
    }

    pub(crate) fn node(&self, node: &str) -> String {
        format!("{}{node}", self.nodes())
    }

    pub(crate) fn known_nodes(&self) -> String {
        format!("{}known/", self.prefix)
    }

    pub(crate) fn known(&self, node: &str) -> String {
        format!("{}{node}", self.known_nodes())
    }

    pub(crate) fn drains(&self) -> String {
        format!("{}drain/", self.prefix)
    }

    pub(crate) fn drain(&self, node: &str) -> String {
        format!("{}{node}", self.drains())
    }

    pub(crate) fn sandboxes(&self) -> String {
        format!("{}sandboxes/", self.prefix)
    }

    pub(crate) fn sandbox(&self, id: Uuid) -> String {
        format!("{}{id}", self.sandboxes())
    }

    /// A tenant's index: its name hashed, so that any name makes one safe
    /// key.
    pub(crate) fn tenant(&self, tenant: &str) -> String {
        format!("{}tenants/{}/", self.prefix, digest(tenant))
    }

    /// Every hibernated sandbox of the cluster.
    pub(crate) fn asleep_all(&self) -> String {
        format!("{}asleep/", self.prefix)
    }

    /// A tenant's hibernated sandboxes.
    pub(crate) fn asleep(&self, tenant: &str) -> String {
        format!("{}{}/", self.asleep_all(), digest(tenant))
    }

    /// The guest keys issued to one client address in the last hour (the
    /// address hashed, as a tenant's name is).
    pub(crate) fn guests(&self, address: &str) -> String {
        format!("{}guests/{}/", self.prefix, digest(address))
    }

    pub(crate) fn usages(&self) -> String {
        format!("{}usage/", self.prefix)
    }

    pub(crate) fn usage(&self, node: &str) -> String {
        format!("{}{node}", self.usages())
    }

    pub(crate) fn held(&self, node: &str) -> String {
        format!("{}held/{node}/", self.prefix)
    }
}

/// A name hashed into one safe key segment.
fn digest(name: &str) -> String {
    let digest = Sha256::digest(name.as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_s_name_never_reaches_a_key() {
        let keys = Keys::new("/p/");
        let odd = keys.tenant("../nodes/x");
        assert!(odd.starts_with("/p/tenants/") && !odd.contains(".."), "{odd}");
        assert_ne!(keys.tenant("a"), keys.tenant("b"));
    }
}
