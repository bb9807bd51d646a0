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
        let digest = Sha256::digest(tenant.as_bytes());
        let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        format!("{}tenants/{hex}/", self.prefix)
    }

    /// The guest keys issued to one client address in the last hour (the
    /// address hashed, as a tenant's name is).
    pub(crate) fn guests(&self, address: &str) -> String {
        let digest = Sha256::digest(address.as_bytes());
        let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        format!("{}guests/{hex}/", self.prefix)
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
