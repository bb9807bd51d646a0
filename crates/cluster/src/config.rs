//! The `[cluster]` section: where etcd is, who this node is, and the
//! secret the nodes share.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// `[cluster]`. Without it the server is a single host.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// etcd's client URLs (`http://` or `https://`), any member of one etcd
    /// cluster.
    pub etcd_endpoints: Vec<String>,
    /// The CA that signed etcd's certificates, for `https://` endpoints.
    #[serde(default)]
    pub etcd_ca_file: Option<PathBuf>,
    /// This node's client certificate and key for etcd (PEM), where etcd
    /// asks clients for one.
    #[serde(default)]
    pub etcd_cert_file: Option<PathBuf>,
    #[serde(default)]
    pub etcd_key_file: Option<PathBuf>,
    /// This node's name in the cluster: unique, lower-case letters, digits
    /// and `-`, at most 63.
    pub node_name: String,
    /// The base URL at which the other nodes reach this one.
    pub advertise_url: String,
    /// The secret every node of the cluster shares: it authenticates the
    /// node-to-node channel (at least 32 characters).
    pub secret: String,
    /// Seconds a node's lease lives without renewal: a node that stops
    /// renewing is down this long after its last renewal.
    #[serde(default = "default_lease")]
    pub lease_seconds: u64,
    /// Where in etcd this cluster keeps its keys.
    #[serde(default = "default_prefix")]
    pub prefix: String,
}

fn default_lease() -> u64 {
    5
}

fn default_prefix() -> String {
    "/mcp-sandbox/".into()
}

/// A `[cluster]` value that cannot work.
#[derive(Debug, thiserror::Error)]
#[error("cluster.{key}: {why}")]
pub struct InvalidCluster {
    pub key: &'static str,
    pub why: String,
}

/// Whether `name` can name a node: what a DNS label allows.
pub fn valid_node_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
}

impl ClusterConfig {
    /// A secret for one `purpose`, derived from the shared secret: every
    /// node derives the same, and one purpose's secret says nothing of
    /// another's or of the shared secret.
    pub fn derived_secret(&self, purpose: &str) -> String {
        let digest = Sha256::digest(format!("mcp-sandbox {purpose}\0{}", self.secret).as_bytes());
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn lease(&self) -> Duration {
        Duration::from_secs(self.lease_seconds)
    }

    pub fn validate(&self) -> Result<(), InvalidCluster> {
        let invalid = |key, why: &str| {
            Err(InvalidCluster {
                key,
                why: why.to_string(),
            })
        };
        let is_url = |u: &str| u.starts_with("http://") || u.starts_with("https://");
        if self.etcd_endpoints.is_empty() || !self.etcd_endpoints.iter().all(|e| is_url(e)) {
            return invalid("etcd_endpoints", "one or more http:// or https:// URLs of etcd members");
        }
        if !valid_node_name(&self.node_name) {
            return invalid("node_name", "1 to 63 lower-case letters, digits and '-', not first");
        }
        if !is_url(&self.advertise_url) {
            return invalid(
                "advertise_url",
                "the http:// or https:// URL the other nodes reach this one at",
            );
        }
        if self.secret.len() < 32 {
            return invalid("secret", "at least 32 characters, the same on every node");
        }
        // One attempt at an etcd member may take 2 s: a lease renewed every
        // third of its life outlives one slow member.
        if !(3..=60).contains(&self.lease_seconds) {
            return invalid("lease_seconds", "from 3 to 60");
        }
        if !self.prefix.starts_with('/') || !self.prefix.ends_with('/') {
            return invalid("prefix", "a key prefix that starts and ends with '/'");
        }
        if self.etcd_cert_file.is_some() != self.etcd_key_file.is_some() {
            return invalid("etcd_cert_file", "given with etcd_key_file, or neither");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ClusterConfig {
        toml_like(
            r#"{"etcd_endpoints": ["http://127.0.0.1:2379"], "node_name": "n1",
                "advertise_url": "http://10.0.0.1:8080", "secret": "0123456789abcdef0123456789abcdef"}"#,
        )
    }

    fn toml_like(json: &str) -> ClusterConfig {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_plain_section_is_valid_with_its_defaults() {
        let c = config();
        c.validate().unwrap();
        assert_eq!((c.lease_seconds, c.prefix.as_str()), (5, "/mcp-sandbox/"));
    }

    #[test]
    fn each_bad_value_is_named() {
        type Spoil = fn(&mut ClusterConfig);
        let cases: [(Spoil, &str); 6] = [
            (|c| c.etcd_endpoints.clear(), "etcd_endpoints"),
            (|c| c.node_name = "N1".into(), "node_name"),
            (|c| c.advertise_url = "10.0.0.1:8080".into(), "advertise_url"),
            (|c| c.secret = "short".into(), "secret"),
            (|c| c.lease_seconds = 2, "lease_seconds"),
            (|c| c.etcd_cert_file = Some("c.pem".into()), "etcd_cert_file"),
        ];
        for (spoil, key) in cases {
            let mut c = config();
            spoil(&mut c);
            assert_eq!(c.validate().unwrap_err().key, key);
        }
    }
}
