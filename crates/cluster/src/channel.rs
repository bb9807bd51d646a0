//! The node-to-node channel: a call for a sandbox another node holds is
//! posted to that node (`POST {url}/cluster/v1/ops/{verb}`) and answered
//! as a stream of JSON lines: its progress as it comes, a heartbeat while
//! it runs quietly, and last its outcome.
//!
//! Each request is signed with a key derived from the cluster's shared
//! secret (which never travels): an HMAC over its method, path, a
//! timestamp and its body's digest, accepted within [`WINDOW`] of the
//! receiver's clock. A captured request opens nothing else, and is stale a
//! minute later. Every call has bounds: a connection within [`CONNECT`],
//! some line at least every [`IDLE`], lines of at most [`MAX_LINE`] bytes.

use std::time::Duration;

use bytes::Bytes;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::config::ClusterConfig;

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Where calls are posted: `{OPS_PATH}{verb}`.
pub const OPS_PATH: &str = "/cluster/v1/ops/";
/// Where calls that carry a file are posted ([`Channel::call_with_bytes`]).
pub const BYTES_PATH: &str = "/cluster/v1/bytes/";
/// The header that carries a request's signature:
/// `<unix seconds>.<body's SHA-256>.<MAC>`, all hex but the time.
pub const TOKEN_HEADER: &str = "x-mcp-sandbox-node";
/// How far a signature's time may be from the receiver's clock.
pub const WINDOW: Duration = Duration::from_secs(60);
/// The longest wait for a connection to a node.
pub const CONNECT: Duration = Duration::from_secs(2);
/// The longest silence of an answer: a node sends a heartbeat line every
/// [`HEARTBEAT`] while a call runs.
pub const IDLE: Duration = Duration::from_secs(45);
pub const HEARTBEAT: Duration = Duration::from_secs(10);
/// The longest line of an answer (a result with its inline images).
pub const MAX_LINE: usize = 32 << 20;

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
    /// The node refused the call (a status that is not success).
    #[error("node {node} refused the call (HTTP {status})")]
    Refused { node: String, status: u16 },
    /// The node answered something that is not the channel's protocol.
    #[error("node {node} answered unexpectedly: {detail}")]
    Protocol { node: String, detail: String },
}

/// This node's end of the channel.
pub struct Channel {
    http: reqwest::Client,
    /// The signing key, derived from the cluster's secret.
    key: Vec<u8>,
}

/// The SHA-256 (hex) of a body made of `parts`, one after the other.
pub fn digest_of(parts: &[&[u8]]) -> String {
    let mut body = Sha256::new();
    for part in parts {
        body.update(part);
    }
    body.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Channel {
    /// The channel of the cluster `config` names.
    pub fn new(config: &ClusterConfig) -> Self {
        let key = config.derived_secret("node channel v1").into_bytes();
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT)
            .read_timeout(IDLE)
            .no_proxy()
            .build()
            .expect("a client without TLS settings builds");
        Self { http, key }
    }

    /// The MAC of a request whose body has the SHA-256 `digest` (hex).
    fn mac(&self, method: &str, path: &str, at: u64, digest: &str) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(format!("{method}\n{path}\n{at}\n{digest}").as_bytes());
        mac
    }

    /// The signature header of a request whose body is `parts`, one after
    /// the other: `<unix seconds>.<body's SHA-256>.<MAC>`, all but the
    /// body checkable as soon as the headers arrive.
    pub fn sign(&self, method: &str, path: &str, parts: &[&[u8]]) -> String {
        let at = unix_now();
        let digest = digest_of(parts);
        let tag: String = self
            .mac(method, path, at, &digest)
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("{at}.{digest}.{tag}")
    }

    /// The body's digest `header` signs for this request, if it signs it
    /// within [`WINDOW`] of now (compared in constant time): checked before
    /// any of the body is read, so that a request without the cluster's
    /// key costs no more than its headers.
    pub fn accepts(&self, header: &str, method: &str, path: &str) -> Option<String> {
        let mut fields = header.splitn(3, '.');
        let (at, digest, tag) = (fields.next()?, fields.next()?, fields.next()?);
        let (at, tag) = (at.parse::<u64>().ok()?, decode_hex(tag)?);
        if unix_now().abs_diff(at) > WINDOW.as_secs() || digest.len() != 64 {
            return None;
        }
        self.mac(method, path, at, digest).verify_slice(&tag).ok()?;
        Some(digest.to_string())
    }

    /// `GET {url}{path}` on node `node`, for a body streamed back as it
    /// comes (a sandbox's file); the caller bounds what it reads.
    pub async fn get(&self, node: &str, url: &str, path: &str) -> Result<reqwest::Response, ChannelError> {
        self.http
            .get(format!("{}{path}", url.trim_end_matches('/')))
            .header(TOKEN_HEADER, self.sign("GET", path, &[]))
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
        line: impl FnMut(Value),
    ) -> Result<(), ChannelError> {
        let body = serde_json::to_vec(body).expect("JSON values serialise");
        self.post(node, url, &format!("{OPS_PATH}{verb}"), vec![body.into()], line)
            .await
    }

    /// As [`Channel::call`], with `data` after the arguments: the body is
    /// the arguments' JSON on one line, then the bytes as they are (a file
    /// too large to travel inside JSON), posted to [`BYTES_PATH`].
    pub async fn call_with_bytes(
        &self,
        node: &str,
        url: &str,
        verb: &str,
        args: &Value,
        data: Bytes,
        line: impl FnMut(Value),
    ) -> Result<(), ChannelError> {
        let mut head = serde_json::to_vec(args).expect("JSON values serialise");
        head.push(b'\n');
        self.post(node, url, &format!("{BYTES_PATH}{verb}"), vec![head.into(), data], line)
            .await
    }

    /// Posts a body made of `parts` to `path` and reads the answer's lines.
    async fn post(
        &self,
        node: &str,
        url: &str,
        path: &str,
        parts: Vec<Bytes>,
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
        let borrowed: Vec<&[u8]> = parts.iter().map(Bytes::as_ref).collect();
        let signature = self.sign("POST", path, &borrowed);
        // Several parts go as they are, without being copied into one
        // buffer; one goes with its length.
        let body = match parts.len() {
            1 => reqwest::Body::from(parts.into_iter().next().expect("one part")),
            _ => reqwest::Body::wrap_stream(futures_util::stream::iter(
                parts.into_iter().map(Ok::<_, std::io::Error>),
            )),
        };
        let mut answer = self
            .http
            .post(format!("{}{path}", url.trim_end_matches('/')))
            .header(TOKEN_HEADER, signature)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
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
            return Err(ChannelError::Refused {
                node: node.into(),
                status: answer.status().as_u16(),
            });
        }
        let mut pending: Vec<u8> = Vec::new();
        while let Some(chunk) = answer.chunk().await.map_err(unreachable)? {
            // Only the new bytes are searched for the line's end.
            let mut from = pending.len();
            pending.extend_from_slice(&chunk);
            while let Some(at) = pending[from..].iter().position(|&b| b == b'\n') {
                let text: Vec<u8> = pending.drain(..=from + at).collect();
                let value = serde_json::from_slice(&text).map_err(|e| protocol(e.to_string()))?;
                line(value);
                from = 0;
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
    fn only_a_request_signed_with_the_cluster_s_key_is_accepted() {
        let secret = "0123456789abcdef0123456789abcdef";
        let a = Channel::new(&config(secret));
        let b = Channel::new(&config("another secret of thirty-two chars!!"));
        let path = "/cluster/v1/ops/list_sandboxes";
        let signed = a.sign("POST", path, &[b"{", b"}"]);
        let digest = a.accepts(&signed, "POST", path);
        assert_eq!(
            digest,
            Some(digest_of(&[b"{}"])),
            "the body's digest, whatever its parts"
        );
        assert!(b.accepts(&signed, "POST", path).is_none(), "another cluster's key");
        assert!(
            a.accepts(&signed, "POST", "/cluster/v1/ops/delete_sandbox").is_none(),
            "another verb"
        );
        let (at, rest) = signed.split_once('.').unwrap();
        let (_, tag) = rest.split_once('.').unwrap();
        let other_body = format!("{at}.{}.{tag}", digest_of(&[b"{\"x\":1}"]));
        assert!(a.accepts(&other_body, "POST", path).is_none(), "another body");
        assert!(a.accepts("", "POST", "/").is_none());
        assert!(!signed.contains(secret), "the secret itself never travels");
        let signed_at = |at: u64| {
            let digest = digest_of(&[]);
            let tag = a.mac("POST", "/p", at, &digest).finalize().into_bytes();
            format!(
                "{at}.{digest}.{}",
                tag.iter().map(|b| format!("{b:02x}")).collect::<String>()
            )
        };
        assert!(
            a.accepts(&signed_at(unix_now() - 30), "POST", "/p").is_some(),
            "within the window"
        );
        assert!(
            a.accepts(&signed_at(unix_now() - 120), "POST", "/p").is_none(),
            "two minutes late"
        );
    }
}
