//! A small client of etcd's v3 API through its JSON gateway (`POST
//! /v3/kv/range`, `/v3/kv/txn`, `/v3/lease/grant`...; keys and values in
//! base64, 64-bit numbers as strings).
//!
//! The gateway is served by every etcd 3.4 member beside gRPC, so the
//! server needs neither protobuf nor a gRPC stack, only the HTTP client it
//! has. Every call has a deadline and goes to the next endpoint when one
//! does not answer: a member that is down or cut off costs one attempt, and
//! a cluster without quorum answers no write (etcd refuses it), which the
//! caller hears as [`EtcdError::Unavailable`].

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};

/// How long one attempt at one endpoint may take.
const ATTEMPT: Duration = Duration::from_secs(2);
/// The longest answer read from etcd (a range over every sandbox of a big
/// cluster stays far below it).
const MAX_ANSWER: usize = 64 << 20;

/// Why etcd could not be used.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// No endpoint answered, or none could complete the request (no
    /// quorum, a member cut off).
    #[error("etcd is unavailable ({0})")]
    Unavailable(String),
    /// An answer that is not what the API says.
    #[error("etcd answered unexpectedly: {0}")]
    Protocol(String),
    /// The TLS files could not be read.
    #[error("{path}: {source}")]
    Tls { path: String, source: std::io::Error },
    #[error("the etcd client: {0}")]
    Client(String),
}

type Result<T> = std::result::Result<T, EtcdError>;

/// Files of a TLS connection to etcd.
#[derive(Debug, Clone, Default)]
pub struct Tls<'a> {
    /// The CA that signed the members' certificates.
    pub ca: Option<&'a Path>,
    /// This node's client certificate and key (PEM), where etcd asks for
    /// one.
    pub cert: Option<(&'a Path, &'a Path)>,
}

/// A key and its value as etcd holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kv {
    pub key: String,
    pub value: Vec<u8>,
    pub lease: i64,
}

/// A transaction: `compare` all true runs `success`, otherwise `failure`.
#[derive(Debug, Default, Clone)]
pub struct Txn {
    compare: Vec<Value>,
    success: Vec<Value>,
}

impl Txn {
    pub fn new() -> Self {
        Self::default()
    }

    /// Holds only if `key` does not exist.
    pub fn if_absent(mut self, key: &str) -> Self {
        self.compare.push(json!({
            "key": B64.encode(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"
        }));
        self
    }

    /// Holds only if `key` holds `value`.
    pub fn if_value(mut self, key: &str, value: &[u8]) -> Self {
        self.compare.push(json!({
            "key": B64.encode(key), "target": "VALUE", "result": "EQUAL", "value": B64.encode(value)
        }));
        self
    }

    pub fn put(mut self, key: &str, value: &[u8]) -> Self {
        self.success.push(json!({
            "request_put": { "key": B64.encode(key), "value": B64.encode(value) }
        }));
        self
    }

    /// Puts `value` at `key`, bound to `lease`.
    pub fn put_leased(mut self, key: &str, value: &[u8], lease: i64) -> Self {
        self.success.push(json!({
            "request_put": { "key": B64.encode(key), "value": B64.encode(value), "lease": lease.to_string() }
        }));
        self
    }

    pub fn delete(mut self, key: &str) -> Self {
        self.success
            .push(json!({ "request_delete_range": { "key": B64.encode(key) } }));
        self
    }
}

/// A client of one etcd cluster.
pub struct Etcd {
    http: reqwest::Client,
    endpoints: Vec<String>,
    /// The endpoint tried first: the last one that answered.
    current: AtomicUsize,
}

impl Etcd {
    pub fn new(endpoints: &[String], tls: Tls<'_>) -> Result<Self> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| EtcdError::Tls {
                path: path.display().to_string(),
                source,
            })
        };
        let mut http = reqwest::Client::builder()
            .timeout(ATTEMPT)
            .connect_timeout(ATTEMPT)
            .no_proxy();
        if let Some(ca) = tls.ca {
            let ca = reqwest::Certificate::from_pem(&read(ca)?).map_err(|e| EtcdError::Client(e.to_string()))?;
            http = http.add_root_certificate(ca);
        }
        if let Some((cert, key)) = tls.cert {
            let identity = reqwest::Identity::from_pkcs8_pem(&read(cert)?, &read(key)?)
                .map_err(|e| EtcdError::Client(format!("the client certificate: {e}")))?;
            http = http.identity(identity);
        }
        let http = http.build().map_err(|e| EtcdError::Client(e.to_string()))?;
        Ok(Self {
            http,
            endpoints: endpoints.iter().map(|e| e.trim_end_matches('/').to_string()).collect(),
            current: AtomicUsize::new(0),
        })
    }

    /// Posts `body` to `path` at each endpoint in turn, from the last one
    /// that answered, until one answers.
    async fn call<T: DeserializeOwned>(&self, path: &str, body: &Value) -> Result<T> {
        let first = self.current.load(Ordering::Relaxed);
        let mut failures = Vec::new();
        for i in 0..self.endpoints.len() {
            let at = (first + i) % self.endpoints.len();
            let url = format!("{}{path}", self.endpoints[at]);
            match self.attempt(&url, body).await {
                Ok(answer) => {
                    self.current.store(at, Ordering::Relaxed);
                    return serde_json::from_slice(&answer).map_err(|e| EtcdError::Protocol(format!("{path}: {e}")));
                }
                Err(why) => failures.push(format!("{}: {why}", self.endpoints[at])),
            }
        }
        Err(EtcdError::Unavailable(failures.join("; ")))
    }

    async fn attempt(&self, url: &str, body: &Value) -> std::result::Result<Vec<u8>, String> {
        let mut answer = self.http.post(url).json(body).send().await.map_err(|e| e.to_string())?;
        let status = answer.status();
        let mut bytes = Vec::new();
        while let Some(chunk) = answer.chunk().await.map_err(|e| e.to_string())? {
            if bytes.len() + chunk.len() > MAX_ANSWER {
                return Err(format!("an answer over {MAX_ANSWER} bytes"));
            }
            bytes.extend_from_slice(&chunk);
        }
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes);
            return Err(format!("{status}: {}", text.chars().take(300).collect::<String>()));
        }
        Ok(bytes)
    }

    pub async fn get(&self, key: &str) -> Result<Option<Kv>> {
        let range: Range = self.call("/v3/kv/range", &json!({ "key": B64.encode(key) })).await?;
        range.kvs.into_iter().next().map(RawKv::decode).transpose()
    }

    /// Every key under `prefix`.
    pub async fn prefix(&self, prefix: &str) -> Result<Vec<Kv>> {
        let body = json!({ "key": B64.encode(prefix), "range_end": B64.encode(range_end(prefix)) });
        let range: Range = self.call("/v3/kv/range", &body).await?;
        range.kvs.into_iter().map(RawKv::decode).collect()
    }

    /// The keys under `prefix`, the prefix taken off each.
    pub async fn names(&self, prefix: &str) -> Result<Vec<String>> {
        let kvs = self.prefix(prefix).await?;
        Ok(kvs
            .into_iter()
            .filter_map(|kv| kv.key.strip_prefix(prefix).map(String::from))
            .collect())
    }

    /// How many keys are under `prefix`.
    pub async fn count(&self, prefix: &str) -> Result<u64> {
        let body = json!({
            "key": B64.encode(prefix), "range_end": B64.encode(range_end(prefix)), "count_only": true
        });
        let range: Range = self.call("/v3/kv/range", &body).await?;
        Ok(range.count)
    }

    /// Puts `value` at `key`, bound to `lease` (gone with it) if given.
    pub async fn put(&self, key: &str, value: &[u8], lease: Option<i64>) -> Result<()> {
        let mut body = json!({ "key": B64.encode(key), "value": B64.encode(value) });
        if let Some(lease) = lease {
            body["lease"] = json!(lease.to_string());
        }
        let _: Value = self.call("/v3/kv/put", &body).await?;
        Ok(())
    }

    /// Runs `txn`; true when its comparisons held (and its requests ran).
    pub async fn txn(&self, txn: Txn) -> Result<bool> {
        let body = json!({ "compare": txn.compare, "success": txn.success });
        let done: TxnAnswer = self.call("/v3/kv/txn", &body).await?;
        Ok(done.succeeded)
    }

    /// Deletes every key under `prefix`; how many there were.
    pub async fn delete_prefix(&self, prefix: &str) -> Result<u64> {
        let body = json!({ "key": B64.encode(prefix), "range_end": B64.encode(range_end(prefix)) });
        let done: Deleted = self.call("/v3/kv/deleterange", &body).await?;
        Ok(done.deleted)
    }

    pub async fn delete(&self, key: &str) -> Result<u64> {
        let done: Deleted = self
            .call("/v3/kv/deleterange", &json!({ "key": B64.encode(key) }))
            .await?;
        Ok(done.deleted)
    }

    /// A new lease of `ttl` seconds.
    pub async fn grant(&self, ttl: u64) -> Result<i64> {
        let granted: Granted = self.call("/v3/lease/grant", &json!({ "TTL": ttl.to_string() })).await?;
        match granted.id {
            0 => Err(EtcdError::Protocol(format!("no lease granted: {}", granted.error))),
            id => Ok(id),
        }
    }

    /// Renews `lease`; `None` when it has expired (or never was).
    pub async fn keep_alive(&self, lease: i64) -> Result<Option<u64>> {
        let kept: KeptAlive = self
            .call("/v3/lease/keepalive", &json!({ "ID": lease.to_string() }))
            .await?;
        Ok((kept.result.ttl > 0).then_some(kept.result.ttl as u64))
    }

    pub async fn revoke(&self, lease: i64) -> Result<()> {
        let _: Value = self
            .call("/v3/lease/revoke", &json!({ "ID": lease.to_string() }))
            .await?;
        Ok(())
    }
}

/// The end of the range of keys that start with `prefix`.
fn range_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// etcd's 64-bit numbers, which the gateway writes as strings (and leaves
/// out when zero).
fn number<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Number {
        Text(String),
        Int(i64),
    }
    match Number::deserialize(d)? {
        Number::Int(n) => Ok(n),
        Number::Text(s) => s.parse().map_err(serde::de::Error::custom),
    }
}

fn count<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
    number(d).map(|n| n.max(0) as u64)
}

#[derive(Deserialize)]
struct RawKv {
    key: String,
    #[serde(default)]
    value: String,
    #[serde(default, deserialize_with = "number")]
    lease: i64,
}

impl RawKv {
    fn decode(self) -> Result<Kv> {
        let bad = |e: base64::DecodeError| EtcdError::Protocol(e.to_string());
        let key = String::from_utf8(B64.decode(self.key).map_err(bad)?)
            .map_err(|e| EtcdError::Protocol(format!("a key that is not UTF-8: {e}")))?;
        Ok(Kv {
            key,
            value: B64.decode(self.value).map_err(bad)?,
            lease: self.lease,
        })
    }
}

#[derive(Deserialize)]
struct Range {
    #[serde(default)]
    kvs: Vec<RawKv>,
    #[serde(default, deserialize_with = "count")]
    count: u64,
}

#[derive(Deserialize)]
struct TxnAnswer {
    #[serde(default)]
    succeeded: bool,
}

#[derive(Deserialize)]
struct Deleted {
    #[serde(default, deserialize_with = "count")]
    deleted: u64,
}

#[derive(Deserialize)]
struct Granted {
    #[serde(rename = "ID", default, deserialize_with = "number")]
    id: i64,
    #[serde(default)]
    error: String,
}

#[derive(Deserialize)]
struct KeptAlive {
    #[serde(default)]
    result: Kept,
}

#[derive(Deserialize, Default)]
struct Kept {
    #[serde(rename = "TTL", default, deserialize_with = "number")]
    ttl: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_ends_where_its_last_byte_grows() {
        assert_eq!(range_end("/a/"), b"/a0".to_vec());
        assert_eq!(range_end(""), vec![0]);
    }

    #[test]
    fn numbers_are_read_as_the_gateway_writes_them() {
        let range: Range =
            serde_json::from_str(r#"{"kvs":[{"key":"Zm9v","value":"YmFy","lease":"12"}],"count":"1"}"#).unwrap();
        assert_eq!(range.count, 1);
        let kv = range.kvs.into_iter().next().unwrap().decode().unwrap();
        assert_eq!(
            (kv.key.as_str(), kv.value.as_slice(), kv.lease),
            ("foo", &b"bar"[..], 12)
        );
        let failed: TxnAnswer = serde_json::from_str(r#"{"header":{}}"#).unwrap();
        assert!(!failed.succeeded, "a failed transaction leaves `succeeded` out");
        let expired: KeptAlive = serde_json::from_str(r#"{"result":{"ID":"1"}}"#).unwrap();
        assert_eq!(expired.result.ttl, 0);
    }
}
