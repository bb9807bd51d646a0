//! Calls for sandboxes another node holds (only with a `[cluster]`
//! section): a verb on a sandbox first asks [`Ops::holder`] where it lives,
//! and when that is another node, [`Ops::forward`]s its arguments there over
//! the node-to-node channel and answers what the holder answered, with the
//! run's progress as it comes. One actor on the holder serialises each
//! sandbox's calls, so ordering holds whichever node a client reaches.
//!
//! The holder runs the call as the entry node's caller (authenticated
//! there), with routing off ([`Ops::serving_forwarded`]), so a call is
//! forwarded at most once.

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;
use uuid::Uuid;

use sandbox_actors::Progress;
use sandbox_cluster::channel::ChannelError;
use sandbox_cluster::ClusterError;

use crate::access::caller::Caller;
use crate::ops::args::parse_id;
use crate::ops::error::{OpsError, RemoteError};
use crate::ops::results::ListedSandbox;
use crate::ops::Ops;

/// Returns from a verb with the holder's answer when another node holds
/// the sandbox that `$args.sandbox_id` names.
macro_rules! forward_if_elsewhere {
    ($ops:expr, $caller:expr, $verb:literal, $args:expr, $progress:expr) => {
        if let $crate::ops::route::Holder::Node { name, url } = $ops.holder($caller, &$args.sandbox_id).await? {
            return $ops.forward((&name, &url), $verb, $caller, &$args, $progress).await;
        }
    };
}
pub(crate) use forward_if_elsewhere;

/// Where a sandbox is served.
pub(crate) enum Holder {
    /// Here: this node holds it, or nobody does (the local call answers
    /// "not found"), or there is no cluster.
    Here,
    /// Another node, up or not.
    Node { name: String, url: String },
}

/// A forwarded call, as the entry node posts it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Forwarded {
    pub caller: Caller,
    pub args: Value,
}

/// One line of a forwarded call's answer.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Line {
    Progress(Progress),
    /// Nothing new: the call still runs.
    Alive,
    Ok(Value),
    Err(RemoteError),
}

impl Ops {
    /// Where `raw_id`'s sandbox is served for `caller`. Another tenant's
    /// sandbox elsewhere is "here", whose local lookup answers "not found"
    /// as it would for an id that does not exist.
    pub(crate) async fn holder(&self, caller: &Caller, raw_id: &str) -> Result<Holder, OpsError> {
        match parse_id(raw_id) {
            Ok(id) => {
                self.holder_of(id, |tenant| tenant == caller.owner || caller.admin)
                    .await
            }
            Err(_) => Ok(Holder::Here),
        }
    }

    /// Where sandbox `id` is served, when its tenant is one `admits`
    /// (otherwise "here").
    pub(crate) async fn holder_of(&self, id: Uuid, admits: impl Fn(&str) -> bool) -> Result<Holder, OpsError> {
        let Some(cluster) = self.cluster.as_ref().filter(|_| self.routing) else {
            return Ok(Holder::Here);
        };
        if self.sandboxes.holds(id) {
            return Ok(Holder::Here);
        }
        let entry = match cluster.locate(id).await? {
            Some(entry) if entry.node != cluster.config.node_name && admits(&entry.tenant) => entry,
            _ => return Ok(Holder::Here),
        };
        match cluster.url_of(&entry.node).await? {
            Some(url) => Ok(Holder::Node { name: entry.node, url }),
            None => Err(unreachable(id, &entry.node)),
        }
    }

    /// `verb` with `args` on the node holding the sandbox, as `caller`;
    /// its progress goes to `progress` as it comes.
    pub(crate) async fn forward<A: Serialize, T: DeserializeOwned>(
        &self,
        to: (&str, &str),
        verb: &str,
        caller: &Caller,
        args: &A,
        progress: Option<mpsc::Sender<Progress>>,
    ) -> Result<T, OpsError> {
        self.forward_body(to, verb, caller, args, None, progress).await
    }

    /// As [`Ops::forward`], for a call that carries a file (`data`).
    pub(crate) async fn forward_with_bytes<A: Serialize, T: DeserializeOwned>(
        &self,
        to: (&str, &str),
        verb: &str,
        caller: &Caller,
        args: &A,
        data: Bytes,
    ) -> Result<T, OpsError> {
        self.forward_body(to, verb, caller, args, Some(data), None).await
    }

    async fn forward_body<A: Serialize, T: DeserializeOwned>(
        &self,
        (name, url): (&str, &str),
        verb: &str,
        caller: &Caller,
        args: &A,
        data: Option<Bytes>,
        progress: Option<mpsc::Sender<Progress>>,
    ) -> Result<T, OpsError> {
        let cluster = self.cluster.as_ref().expect("forwarded only in a cluster");
        let body = serde_json::to_value(Forwarded {
            caller: caller.clone(),
            args: serde_json::to_value(args).expect("arguments serialise"),
        })
        .expect("serialisable");
        let mut outcome: Option<Result<Value, RemoteError>> = None;
        let mut strange: Option<String> = None;
        let on_line = |line| match serde_json::from_value(line) {
            Ok(Line::Progress(p)) => {
                // Progress is a courtesy: the result carries all output.
                if let Some(tx) = &progress {
                    let _ = tx.try_send(p);
                }
            }
            Ok(Line::Alive) => {}
            Ok(Line::Ok(v)) => outcome = Some(Ok(v)),
            Ok(Line::Err(e)) => outcome = Some(Err(e)),
            Err(e) => strange = Some(e.to_string()),
        };
        let called = match data {
            None => cluster.channel.call(name, url, verb, &body, on_line).await,
            Some(data) => {
                cluster
                    .channel
                    .call_with_bytes(name, url, verb, &body, data, on_line)
                    .await
            }
        };
        let id = args_sandbox(&body);
        if matches!(
            called,
            Err(ChannelError::NotConnected { .. } | ChannelError::Unreachable { .. })
        ) {
            // It may have come back at another address.
            cluster.forget_url(name);
        }
        match (called, outcome, strange) {
            (_, _, Some(why)) => Err(OpsError::Internal(format!("node {name} answered unexpectedly: {why}"))),
            // An outcome that arrived stands, whatever happened after it.
            (_, Some(Ok(value)), None) => serde_json::from_value(value)
                .map_err(|e| OpsError::Internal(format!("node {name} answered unexpectedly: {e}"))),
            (_, Some(Err(remote)), None) => Err(OpsError::Forwarded(remote)),
            (Err(ChannelError::Refused { status, .. }), None, None) => Err(OpsError::Forwarded(RemoteError {
                message: format!(
                    "node {name}, which holds this sandbox, refused the forwarded call (HTTP {status}): the nodes \
                     may run different versions or configurations; the operator must check them"
                ),
                status: 502,
                retry_after: None,
            })),
            (Err(ChannelError::Protocol { detail, .. }), None, None) => Err(OpsError::Internal(format!(
                "node {name} answered unexpectedly: {detail}"
            ))),
            (Err(ChannelError::NotConnected { .. }), None, None) => Err(OpsError::Unreachable {
                sandbox: id.unwrap_or_default(),
                node: name.to_string(),
                sent: false,
            }),
            (Err(ChannelError::Unreachable { .. }), None, None) | (Ok(()), None, None) => {
                Err(unreachable(id.unwrap_or_default(), name))
            }
        }
    }

    /// A listing's `verb` on every other node that is up, as `caller`: the
    /// answers, and the names of the nodes that gave none; without the
    /// cluster's membership (etcd does not answer), this node's alone.
    pub(crate) async fn listed_on_other_nodes<T: DeserializeOwned>(
        &self,
        verb: &str,
        caller: &Caller,
    ) -> (Vec<T>, Vec<String>) {
        self.on_other_nodes(verb, caller, &()).await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, verb, "could not read which nodes are up; listing this node's only");
            (vec![], vec![])
        })
    }

    /// `verb` with `args` on every other node that is up, as `caller`: the
    /// answers, and the names of the nodes that gave none.
    pub(crate) async fn on_other_nodes<A: Serialize, T: DeserializeOwned>(
        &self,
        verb: &str,
        caller: &Caller,
        args: &A,
    ) -> Result<(Vec<T>, Vec<String>), OpsError> {
        let Some(cluster) = self.cluster.as_ref().filter(|_| self.routing) else {
            return Ok((vec![], vec![]));
        };
        let nodes = cluster.nodes_up().await?;
        let others = nodes.iter().filter(|n| n.name != cluster.config.node_name);
        let asked = others.map(|n| async move {
            let answer = self.forward::<_, T>((&n.name, &n.url), verb, caller, args, None).await;
            (n.name.clone(), answer)
        });
        let (mut answers, mut silent) = (vec![], vec![]);
        for (node, answer) in futures_util::future::join_all(asked).await {
            match answer {
                Ok(value) => answers.push(value),
                Err(e) => {
                    tracing::warn!(node = %node, error = %e, verb, "a node did not answer");
                    silent.push(node);
                }
            }
        }
        // Nodes that are not up give no answer either.
        let up: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        if let Ok(known) = cluster.known_nodes().await {
            silent.extend(known.into_iter().filter(|k| !up.contains(&k.as_str())));
        }
        Ok((answers, silent))
    }

    /// The caller's sandboxes that the directory places on `silent` nodes
    /// and that no node listed (`listed`), as `unreachable`.
    pub(crate) async fn unreachable_of(
        &self,
        caller: &Caller,
        listed: &[&str],
        silent: Vec<String>,
    ) -> Vec<ListedSandbox> {
        let Some(cluster) = self.cluster.as_ref().filter(|_| !silent.is_empty()) else {
            return vec![];
        };
        // The caller's sandboxes (one read of its index), unless it is an
        // administrator, who sees every tenant's.
        let mine = match caller.admin {
            true => None,
            false => match cluster.directory.of_tenant(&caller.owner).await {
                Ok(ids) => Some(ids),
                Err(_) => return vec![],
            },
        };
        let mut found = vec![];
        for node in &silent {
            let Ok(held) = cluster.directory.held_by(node).await else {
                continue;
            };
            found.extend(
                held.into_iter()
                    .filter(|id| mine.as_ref().is_none_or(|m| m.contains(id)))
                    .filter(|id| !listed.contains(&id.to_string().as_str()))
                    .map(|id| ListedSandbox::unreachable(id, node)),
            );
        }
        found
    }

    /// Where a new sandbox goes ([`sandbox_cluster::placement`], the
    /// figures less this node's recent placements): here without a
    /// cluster; refused while this node cannot renew its membership, or
    /// when every node drains. Nodes in `avoid` (which did not answer) take
    /// none.
    pub(crate) async fn place(&self, avoid: &[String]) -> Result<Holder, OpsError> {
        let Some(cluster) = self.cluster.as_ref().filter(|_| self.routing) else {
            return Ok(Holder::Here);
        };
        cluster.check_held()?;
        let (mut up, draining) = tokio::try_join!(cluster.nodes_up(), cluster.draining_nodes())?;
        up.retain(|n| !avoid.contains(&n.name));
        let here = &cluster.config.node_name;
        let node = cluster
            .recent
            .place(here, up, &draining, self.sandboxes.sandbox_memory_mb())
            .ok_or(ClusterError::AllDraining)?;
        match &node.name == here {
            true => Ok(Holder::Here),
            false => Ok(Holder::Node {
                name: node.name.clone(),
                url: node.url.clone(),
            }),
        }
    }

    /// These operations with routing off, for calls another node forwarded.
    pub(crate) fn serving_forwarded(&self) -> Ops {
        Ops {
            routing: false,
            ..self.clone()
        }
    }
}

fn args_sandbox(body: &Value) -> Option<Uuid> {
    body["args"]["sandbox_id"]
        .as_str()
        .and_then(|s| Uuid::parse_str(s).ok())
}

fn unreachable(id: Uuid, node: &str) -> OpsError {
    OpsError::Unreachable {
        sandbox: id,
        node: node.to_string(),
        sent: true,
    }
}
