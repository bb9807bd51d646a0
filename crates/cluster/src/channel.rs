//! The node-to-node channel: a call for a sandbox another node holds is
//! posted to that node (`POST {url}/cluster/v1/ops/{verb}`) and answered
//! as a stream of JSON lines: its progress as it comes, a heartbeat while
//! it runs quietly, and last its outcome.
//!
//! Each request carries a token derived from the cluster's shared secret
//! (the secret itself never travels); a node accepts only that token, and
//! only on this route. Every call has bounds: a connection within
//! [`CONNECT`], some line at least every [`IDLE`], lines of at most
//! [`MAX_LINE`] bytes.

use std::time::Duration;

use serde_json::Value;

use crate::config::ClusterConfig;

/// The header that carries the token.
pub const TOKEN_HEADER: &str = "x-mcp-sandbox-node";
/// The longest wait for a connection to a node.
pub const CONNECT: Duration = Duration::from_secs(2);
/// The longest silence of an answer: a node sends a heartbeat line every
/// [`HEARTBEAT`] while a call runs.
pub const IDLE: Duration = Duration::from_secs(45);
pub const HEARTBEAT: Duration = Duration::from_secs(10);
/// The longest line of an answer (a result with its inline images).
pub const MAX_LINE: usize = 96 << 20;

/// Why a call to another node failed before it had an outcome.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// No connection could be made: the node is down or cut off, and the
    /// call was not sent.
    #[error("node {node} does not answer ({detail})")]
    NotConnected { node: String, detail: String },
    /// The connection broke before the outcome: the call may have run.
    #[error("node {node} stopped answering ({detail})")]
    Unreachable { node: String, detail: String },
    /// The node answered something that is not the channel's protocol.
    #[error("node {node} answered unexpectedly: {detail}")]
    Protocol { node: String, detail: String },
}

/// This node's end of the channel.
pub struct Channel {
    http: reqwest::Client,
    token: String,
}

impl Channel {
    /// The channel of the cluster `config` names.
    pub fn new(config: &ClusterConfig) -> Self {
        let token = config.derived_secret("node channel v1");
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT)
            .read_timeout(IDLE)
            .no_proxy()
            .build()
            .expect("a client without TLS settings builds");
        Self { http, token }
    }

    /// Whether `presented` is this cluster's token (compared in constant
    /// time).
    pub fn accepts(&self, presented: &str) -> bool {
        let (a, b) = (presented.as_bytes(), self.token.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }

    /// `GET {url}{path}` on node `node`, for a body streamed back as it
    /// comes (a sandbox's file); the caller bounds what it reads.
    pub async fn get(&self, node: &str, url: &str, path: &str) -> Result<reqwest::Response, ChannelError> {
        self.http
            .get(format!("{}{path}", url.trim_end_matches('/')))
            .header(TOKEN_HEADER, &self.token)
            .send()
            .await
            .map_err(|e| ChannelError::Unreachable {
                node: node.into(),
                detail: e.to_string(),
            })
    }

    /// Posts `body` as `verb` to the node `node` at `url` and hands each
    /// line of the answer to `line`, until the answer ends.
    pub async fn call(
        &self,
        node: &str,
        url: &str,
        verb: &str,
        body: &Value,
        mut line: impl FnMut(Value),
    ) -> Result<(), ChannelError> {
        let unreachable = |e: reqwest::Error| ChannelError::Unreachable {
            node: node.into(),
            detail: e.to_string(),
        };
        let protocol = |detail: String| ChannelError::Protocol {
            node: node.into(),
            detail,
        };
        let mut answer = self
            .http
            .post(format!("{}/cluster/v1/ops/{verb}", url.trim_end_matches('/')))
            .header(TOKEN_HEADER, &self.token)
            .json(body)
            .send()
            .await
            .map_err(|e| match e.is_connect() {
                true => ChannelError::NotConnected {
                    node: node.into(),
                    detail: e.to_string(),
                },
                false => unreachable(e),
            })?;
        if !answer.status().is_success() {
            return Err(protocol(format!("status {}", answer.status())));
        }
        let mut pending: Vec<u8> = Vec::new();
        while let Some(chunk) = answer.chunk().await.map_err(unreachable)? {
            pending.extend_from_slice(&chunk);
            while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                let text: Vec<u8> = pending.drain(..=end).collect();
                let value = serde_json::from_slice(&text).map_err(|e| protocol(e.to_string()))?;
                line(value);
            }
            if pending.len() > MAX_LINE {
                return Err(protocol(format!("a line over {MAX_LINE} bytes")));
            }
        }
        match pending.iter().all(u8::is_ascii_whitespace) {
            true => Ok(()),
            false => Err(protocol("an answer cut in a line".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(secret: &str) -> ClusterConfig {
        serde_json::from_value(serde_json::json!({
            "etcd_endpoints": ["http://127.0.0.1:2379"], "node_name": "n1",
            "advertise_url": "http://10.0.0.1:8080", "secret": secret
        }))
        .unwrap()
    }

    #[test]
    fn only_the_cluster_s_token_is_accepted() {
        let a = Channel::new(&config("0123456789abcdef0123456789abcdef"));
        let b = Channel::new(&config("another secret of thirty-two chars!!"));
        assert!(a.accepts(&a.token));
        assert!(!a.accepts(&b.token));
        assert!(!a.accepts(""));
        assert!(!a.token.contains("0123456789abcdef"), "the secret itself never travels");
    }
}
