//! Guest keys for a public demo (`[guest]`): `POST /api/guest` (and the
//! UI's "Try without a key") hands anyone a fresh key, limited in number per
//! client address. A guest key is signed, not stored: `msg_{id}.{expiry}.
//! {HMAC}` under the server's link secret, so it needs no state and survives
//! a restart. Each is a tenant of its own (`guest:{id}`) with the guest
//! tier's limits; once expired it gets 401, and its sandboxes, whose
//! lifetime was capped at the key's expiry when they were created, are
//! removed by the domain.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::Mac;
use rand::RngCore;
use sandbox_actors::config::EgressPolicy;
use serde::Deserialize;

use crate::access::budgets::Budget;
use crate::access::caller::{Caller, GUEST_PREFIX};
use crate::access::signer::{LinkSigner, TokenError};

const PREFIX: &str = "msg_";

/// `[guest]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GuestConfig {
    /// Whether `POST /api/guest` hands out keys (needs `auth.enabled`).
    pub enabled: bool,
    /// How long a guest key works.
    pub key_ttl_seconds: u64,
    /// Keys one client address may get per hour.
    pub keys_per_ip_per_hour: u32,
    /// Sandboxes one guest may hold.
    pub max_sandboxes: usize,
    /// Requests per second of one guest (burst: twice that).
    pub requests_per_second: u32,
    /// A guest's sandbox is deleted this long after creation, and at the
    /// latest when its key expires.
    pub sandbox_lifetime_seconds: u64,
    /// Egress policy of guests' sandboxes; unset: `sandbox.network`.
    pub network: Option<EgressPolicy>,
    /// The `[[templates]]` guests may create sandboxes from (absent: all).
    pub templates: Option<Vec<String>>,
    /// Monthly budgets of each guest (see [`crate::access::budgets`]).
    pub cpu_hours_per_month: Option<f64>,
    pub sandbox_hours_per_month: Option<f64>,
    pub egress_mb_per_month: Option<f64>,
}

impl Default for GuestConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            key_ttl_seconds: 3600,
            keys_per_ip_per_hour: 5,
            max_sandboxes: 1,
            requests_per_second: 5,
            sandbox_lifetime_seconds: 1800,
            network: None,
            templates: None,
            cpu_hours_per_month: None,
            sandbox_hours_per_month: None,
            egress_mb_per_month: None,
        }
    }
}

/// A bad `[guest]` section; the message names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuestError {
    #[error("guest.enabled: guest keys need auth.enabled = true")]
    WithoutAuth,
    #[error("guest.{0}: at least 1")]
    Zero(&'static str),
    #[error("guest.{0}: a number above 0")]
    Budget(&'static str),
}

impl GuestConfig {
    pub fn validate(&self, auth_enabled: bool) -> Result<(), GuestError> {
        if self.enabled && !auth_enabled {
            return Err(GuestError::WithoutAuth);
        }
        for (key, v) in [
            ("key_ttl_seconds", self.key_ttl_seconds),
            ("keys_per_ip_per_hour", self.keys_per_ip_per_hour.into()),
            ("max_sandboxes", self.max_sandboxes as u64),
            ("requests_per_second", self.requests_per_second.into()),
            ("sandbox_lifetime_seconds", self.sandbox_lifetime_seconds),
        ] {
            if v == 0 {
                return Err(GuestError::Zero(key));
            }
        }
        match self.budget().invalid_key() {
            Some(key) => Err(GuestError::Budget(key)),
            None => Ok(()),
        }
    }

    /// Each guest's monthly budget.
    pub fn budget(&self) -> Budget {
        Budget {
            cpu_hours: self.cpu_hours_per_month,
            sandbox_hours: self.sandbox_hours_per_month,
            egress_mb: self.egress_mb_per_month,
        }
    }
}

/// A valid guest key: its tenant and expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guest {
    pub owner: String,
    pub expires_at: u64,
}

/// Issues and checks guest keys.
#[derive(Clone)]
pub struct GuestKeys {
    signer: LinkSigner,
    ttl_seconds: u64,
}

impl std::fmt::Debug for GuestKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The signer holds the secret: never printed.
        f.debug_struct("GuestKeys")
            .field("ttl_seconds", &self.ttl_seconds)
            .finish_non_exhaustive()
    }
}

impl GuestKeys {
    pub fn new(signer: LinkSigner, config: &GuestConfig) -> Self {
        Self {
            signer,
            ttl_seconds: config.key_ttl_seconds,
        }
    }

    fn signature(&self, id: &str, expiry: u64) -> String {
        // "guest" is never a sandbox id: these never collide with link tokens.
        URL_SAFE_NO_PAD.encode(self.signer.mac("guest", id, expiry).finalize().into_bytes())
    }

    /// A fresh key valid from `now` for the configured time.
    pub fn issue(&self, now: u64) -> (String, Guest) {
        let mut bytes = [0u8; 16];
        rand::rng().fill_bytes(&mut bytes);
        let id = URL_SAFE_NO_PAD.encode(bytes);
        let expires_at = now + self.ttl_seconds;
        let key = format!("{PREFIX}{id}.{expires_at}.{}", self.signature(&id, expires_at));
        (
            key,
            Guest {
                owner: format!("{GUEST_PREFIX}{id}"),
                expires_at,
            },
        )
    }

    /// Whether `presented` looks like a guest key at all.
    pub fn is_guest_key(presented: &str) -> bool {
        presented.starts_with(PREFIX)
    }

    pub fn verify(&self, presented: &str, now: u64) -> Result<Guest, TokenError> {
        let rest = presented.strip_prefix(PREFIX).ok_or(TokenError::Malformed)?;
        let mut parts = rest.split('.');
        let (Some(id), Some(expiry), Some(sig), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return Err(TokenError::Malformed);
        };
        let expires_at: u64 = expiry.parse().map_err(|_| TokenError::Malformed)?;
        let sig = URL_SAFE_NO_PAD.decode(sig).map_err(|_| TokenError::Malformed)?;
        self.signer
            .mac("guest", id, expires_at)
            .verify_slice(&sig)
            .map_err(|_| TokenError::BadSignature)?;
        if now >= expires_at {
            return Err(TokenError::Expired);
        }
        Ok(Guest {
            owner: format!("{GUEST_PREFIX}{id}"),
            expires_at,
        })
    }
}

/// The caller a valid guest key is.
pub fn caller(guest: Guest) -> Caller {
    Caller::guest(guest.owner, guest.expires_at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(ttl: u64) -> GuestKeys {
        let dir = tempfile::tempdir().unwrap();
        let signer = LinkSigner::load(None, 3600, dir.path()).unwrap();
        GuestKeys::new(
            signer,
            &GuestConfig {
                key_ttl_seconds: ttl,
                ..Default::default()
            },
        )
    }

    #[test]
    fn guest_keys_are_distinct_tenants_that_expire_and_cannot_be_altered() {
        let k = keys(60);
        let (a, ga) = k.issue(1000);
        let (b, gb) = k.issue(1000);
        assert_ne!(ga.owner, gb.owner);
        assert!(ga.owner.starts_with(GUEST_PREFIX));
        assert_eq!(k.verify(&a, 1030), Ok(ga.clone()));
        assert_eq!(k.verify(&b, 1059).map(|g| g.owner), Ok(gb.owner));
        assert_eq!(k.verify(&a, 1060), Err(TokenError::Expired));
        let (id_exp, sig) = a.rsplit_once('.').unwrap();
        let (id, _) = id_exp.rsplit_once('.').unwrap();
        assert_eq!(
            k.verify(&format!("{id}.99999.{sig}"), 1030),
            Err(TokenError::BadSignature)
        );
        assert_eq!(k.verify("msg_x", 1030), Err(TokenError::Malformed));
        assert_eq!(
            keys(60).verify(&a, 1030),
            Err(TokenError::BadSignature),
            "another secret"
        );
    }

    #[test]
    fn the_guest_section_is_checked() {
        let on = GuestConfig {
            enabled: true,
            ..Default::default()
        };
        assert!(on.validate(false).unwrap_err().to_string().contains("guest.enabled"));
        assert!(on.validate(true).is_ok());
        let zero = GuestConfig {
            key_ttl_seconds: 0,
            ..on
        };
        assert!(zero
            .validate(true)
            .unwrap_err()
            .to_string()
            .contains("guest.key_ttl_seconds"));
    }
}
