//! API keys.
//!
//! With `[auth] enabled = true` every request names a key (Bearer,
//! `X-API-Key`, or `?api_key=` for clients that can only set a URL); each key
//! is a tenant, and the tenant is the owner of the sandboxes it creates. Keys
//! are compared as SHA-256 digests in constant time and never logged.
//! Artifact links carry an expiring HMAC token ([`crate::access::signer`]) instead of any key, so they
//! work in a plain browser and leak nothing that grants more.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use rand::RngCore;
use sandbox_actors::EgressPolicy;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::access::budgets::Budget;
use crate::access::caller::Caller;
use crate::access::guest::{Guest, GuestKeys};
use crate::access::signer::{unix_now, TokenError};

/// `[auth]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    pub enabled: bool,
    pub keys: Vec<KeyConfig>,
    /// Secret for artifact link tokens; generated once and kept in the state
    /// folder when not set.
    pub link_secret: Option<String>,
    /// How long an artifact link works.
    pub link_ttl_seconds: u64,
    /// Names of keys that see and manage every tenant's sandboxes (and may
    /// read `/metrics`).
    pub admin_keys: Vec<String>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            keys: vec![],
            link_secret: None,
            link_ttl_seconds: 24 * 3600,
            admin_keys: vec![],
        }
    }
}

/// `[[auth.keys]]`: one tenant.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KeyConfig {
    pub name: String,
    /// The key in clear, for local use.
    pub key: Option<String>,
    /// Hex SHA-256 of the key, so the configuration holds no secret.
    pub key_sha256: Option<String>,
    /// A revoked key is refused (401) with a message saying so.
    pub revoked: bool,
    /// Per-key overrides of `[limits]`.
    pub max_sandboxes: Option<usize>,
    pub requests_per_second: Option<u32>,
    /// Egress policy of this key's sandboxes instead of `sandbox.network`.
    pub egress: Option<EgressPolicy>,
    /// The `[[templates]]` this key may create sandboxes from (absent: all).
    pub templates: Option<Vec<String>>,
    /// Monthly budgets (see [`crate::access::budgets`]).
    pub cpu_hours_per_month: Option<f64>,
    pub sandbox_hours_per_month: Option<f64>,
    pub egress_mb_per_month: Option<f64>,
}

/// A key as the server holds it.
#[derive(Debug, Clone)]
pub struct Tenant {
    pub name: String,
    digest: [u8; 32],
    pub revoked: bool,
    pub admin: bool,
    pub max_sandboxes: Option<usize>,
    pub requests_per_second: Option<u32>,
    pub egress: Option<EgressPolicy>,
    pub templates: Option<Vec<String>>,
    pub budget: Budget,
}

#[derive(Debug, Clone)]
pub enum Identified<'a> {
    Tenant(&'a Tenant),
    Guest(Guest),
    Revoked,
    /// A guest key past its expiry.
    Expired,
    Unknown,
}

impl Identified<'_> {
    /// The caller a usable key stands for.
    pub fn caller(&self) -> Option<Caller> {
        match self {
            Identified::Tenant(t) => Some(Caller::tenant(&t.name, t.admin)),
            Identified::Guest(g) => Some(crate::access::guest::caller(g.clone())),
            _ => None,
        }
    }
}

/// A bad `[auth]` section; the message names the key (`auth.keys[i]` is
/// the i-th `[[auth.keys]]` entry).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeysError {
    #[error("auth.keys[{0}].name: 1-64 characters of letters, digits, - _ . @")]
    Name(usize),
    #[error("auth.keys[{0}].key: at least 16 characters (use `mcp-sandbox key new`)")]
    ShortKey(usize),
    #[error("auth.keys[{0}].key_sha256: 64 hexadecimal digits")]
    Digest(usize),
    #[error("auth.keys[{0}]: exactly one of key or key_sha256")]
    KeyOrDigest(usize),
    #[error("auth.keys[{0}].name: {1:?} is used twice")]
    NameTwice(usize, String),
    #[error("auth.keys[{0}]: limits must be at least 1")]
    ZeroLimit(usize),
    #[error("auth.keys[{0}].{1}: a number above 0")]
    Budget(usize, &'static str),
    #[error("auth.admin_keys: {0:?} is not the name of a key in [[auth.keys]]")]
    UnknownAdmin(String),
    #[error("auth.keys: authentication is enabled but no usable key is configured")]
    NoUsableKey,
}

#[derive(Debug, Clone, Default)]
pub struct Keys {
    tenants: Vec<Tenant>,
    guests: Option<GuestKeys>,
}

fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// Equal in time independent of where the inputs differ.
fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Keys {
    /// The configured keys; `guests` says whether guest keys will be added
    /// (then authentication needs no configured key).
    pub fn from_config(config: &AuthConfig, guests: bool) -> Result<Self, KeysError> {
        let mut tenants: Vec<Tenant> = Vec::new();
        for (i, k) in config.keys.iter().enumerate() {
            if k.name.trim().is_empty()
                || k.name.len() > 64
                || !k.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c))
            {
                return Err(KeysError::Name(i));
            }
            let digest = match (&k.key, &k.key_sha256) {
                (Some(key), None) if key.len() >= 16 => sha256(key.as_bytes()),
                (Some(_), None) => return Err(KeysError::ShortKey(i)),
                (None, Some(hex)) => parse_hex(hex).ok_or(KeysError::Digest(i))?,
                _ => return Err(KeysError::KeyOrDigest(i)),
            };
            if tenants.iter().any(|t| t.name == k.name) {
                return Err(KeysError::NameTwice(i, k.name.clone()));
            }
            if k.max_sandboxes == Some(0) || k.requests_per_second == Some(0) {
                return Err(KeysError::ZeroLimit(i));
            }
            let budget = Budget {
                cpu_hours: k.cpu_hours_per_month,
                sandbox_hours: k.sandbox_hours_per_month,
                egress_mb: k.egress_mb_per_month,
            };
            if let Some(key) = budget.invalid_key() {
                return Err(KeysError::Budget(i, key));
            }
            tenants.push(Tenant {
                name: k.name.clone(),
                digest,
                revoked: k.revoked,
                admin: config.admin_keys.contains(&k.name),
                max_sandboxes: k.max_sandboxes,
                requests_per_second: k.requests_per_second,
                egress: k.egress,
                templates: k.templates.clone(),
                budget,
            });
        }
        if let Some(unknown) = config
            .admin_keys
            .iter()
            .find(|n| !tenants.iter().any(|t| &t.name == *n))
        {
            return Err(KeysError::UnknownAdmin(unknown.clone()));
        }
        if config.enabled && !guests && !tenants.iter().any(|t| !t.revoked) {
            return Err(KeysError::NoUsableKey);
        }
        Ok(Self { tenants, guests: None })
    }

    /// Accepts guest keys too.
    pub fn with_guests(self, guests: GuestKeys) -> Self {
        Self {
            guests: Some(guests),
            ..self
        }
    }

    pub fn guests(&self) -> Option<&GuestKeys> {
        self.guests.as_ref()
    }

    /// Looks `presented` up: a guest key by its signature, any other by
    /// comparing against every configured key.
    pub fn identify(&self, presented: &str) -> Identified<'_> {
        if let Some(guests) = self.guests.as_ref().filter(|_| GuestKeys::is_guest_key(presented)) {
            return match guests.verify(presented, unix_now()) {
                Ok(g) => Identified::Guest(g),
                Err(TokenError::Expired) => Identified::Expired,
                Err(_) => Identified::Unknown,
            };
        }
        let digest = sha256(presented.as_bytes());
        let mut found = None;
        for t in &self.tenants {
            if ct_eq(&t.digest, &digest) {
                found = Some(t);
            }
        }
        match found {
            Some(t) if t.revoked => Identified::Revoked,
            Some(t) => Identified::Tenant(t),
            None => Identified::Unknown,
        }
    }

    pub fn tenant(&self, name: &str) -> Option<&Tenant> {
        self.tenants.iter().find(|t| t.name == name)
    }
}

fn parse_hex(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// A fresh key and the configuration lines that enable it.
pub fn new_key(name: &str) -> (String, String) {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let key = format!("msk_{}", URL_SAFE_NO_PAD.encode(bytes));
    let digest: String = sha256(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    let config = format!("[[auth.keys]]\nname = {name:?}\nkey_sha256 = \"{digest}\"\n# max_sandboxes = 3\n");
    (key, config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::signer::LinkSigner;

    fn config(keys: Vec<KeyConfig>) -> AuthConfig {
        AuthConfig {
            enabled: true,
            keys,
            link_secret: Some("s".repeat(32)),
            link_ttl_seconds: 60,
            admin_keys: vec![],
        }
    }

    #[test]
    fn keys_identify_tenants_in_clear_and_hashed_form() {
        let (key, lines) = new_key("bob");
        let digest = lines.split('"').nth(3).unwrap().to_string();
        let keys = Keys::from_config(
            &config(vec![
                KeyConfig {
                    name: "alice".into(),
                    key: Some("alice-key-0123456789".into()),
                    ..Default::default()
                },
                KeyConfig {
                    name: "bob".into(),
                    key_sha256: Some(digest),
                    ..Default::default()
                },
                KeyConfig {
                    name: "old".into(),
                    key: Some("old-key-0123456789ab".into()),
                    revoked: true,
                    ..Default::default()
                },
            ]),
            false,
        )
        .unwrap();
        assert!(matches!(keys.identify("alice-key-0123456789"), Identified::Tenant(t) if t.name == "alice"));
        assert!(matches!(keys.identify(&key), Identified::Tenant(t) if t.name == "bob"));
        assert!(matches!(keys.identify("old-key-0123456789ab"), Identified::Revoked));
        assert!(matches!(keys.identify("alice-key-012345678"), Identified::Unknown));
    }

    #[test]
    fn bad_key_entries_name_their_key() {
        for (k, want) in [
            (
                KeyConfig {
                    name: "a".into(),
                    key: Some("short".into()),
                    ..Default::default()
                },
                "auth.keys[0].key",
            ),
            (
                KeyConfig {
                    name: "a".into(),
                    key_sha256: Some("xyz".into()),
                    ..Default::default()
                },
                "key_sha256",
            ),
            (
                KeyConfig {
                    name: "a b".into(),
                    key: Some("k".repeat(20)),
                    ..Default::default()
                },
                "name",
            ),
            (
                KeyConfig {
                    name: "a".into(),
                    ..Default::default()
                },
                "exactly one",
            ),
        ] {
            let err = Keys::from_config(&config(vec![k]), false).unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        }
    }

    #[test]
    fn guest_keys_need_no_configured_key_and_expire_into_401() {
        assert!(Keys::from_config(&config(vec![]), false).is_err());
        let dir = tempfile::tempdir().unwrap();
        let signer = LinkSigner::load(None, 60, dir.path()).unwrap();
        let guests = GuestKeys::new(signer, &crate::access::guest::GuestConfig::default());
        let keys = Keys::from_config(&config(vec![]), true)
            .unwrap()
            .with_guests(guests.clone());
        let (key, guest) = guests.issue(unix_now());
        let caller = keys.identify(&key).caller().expect("a fresh guest key");
        assert_eq!(caller.owner, guest.owner);
        assert_eq!(caller.expires_at, Some(guest.expires_at));
        let (old, _) = guests.issue(unix_now() - 2 * 3600);
        assert!(matches!(keys.identify(&old), Identified::Expired));
        assert!(matches!(keys.identify("msg_forged.1.x"), Identified::Unknown));
    }

    #[test]
    fn admin_keys_must_name_a_key() {
        let key = |name: &str| KeyConfig {
            name: name.into(),
            key: Some(format!("{name}-0123456789abcdef")),
            ..Default::default()
        };
        let mut c = config(vec![key("ops"), key("alice")]);
        c.admin_keys = vec!["ops".into()];
        let keys = Keys::from_config(&c, false).unwrap();
        assert!(keys.tenant("ops").unwrap().admin);
        assert!(!keys.tenant("alice").unwrap().admin);
        c.admin_keys = vec!["nobody".into()];
        assert!(Keys::from_config(&c, false)
            .unwrap_err()
            .to_string()
            .contains("auth.admin_keys"));
    }
}
