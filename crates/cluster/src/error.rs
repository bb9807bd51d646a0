//! The cluster layer's error.

use uuid::Uuid;

use crate::etcd::EtcdError;

impl From<EtcdError> for ClusterError {
    fn from(e: EtcdError) -> Self {
        tracing::warn!(error = %e, "etcd did not answer");
        ClusterError::Etcd(e)
    }
}

/// Why the cluster could not do what was asked. Messages are written for
/// the caller and say what to do next.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// etcd did not answer or has no quorum: nothing was changed. (Which
    /// members failed, and how, is the server's log's to say.)
    #[error("the cluster's directory (etcd) is unavailable, so nothing was changed. Try again in a few seconds.")]
    Etcd(#[source] EtcdError),
    /// Another sandbox already has this id (never for a new one).
    #[error("sandbox {0} is already in the cluster's directory")]
    Taken(Uuid),
    /// This node has not renewed its membership within its lease: it may be
    /// cut off, and another node may count it gone.
    #[error(
        "this node could not renew its membership of the cluster for {seconds} s (etcd unreachable from it, or \
         without quorum), so it takes no new sandboxes until it can; try again shortly, or through another node"
    )]
    Detached { seconds: u64 },
    /// Every node that is up drains.
    #[error("no node of the cluster takes new sandboxes now (every node that is up drains); try again later")]
    AllDraining,
    #[error(transparent)]
    Invalid(#[from] crate::config::InvalidCluster),
}
