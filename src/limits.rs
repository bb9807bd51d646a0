//! `[limits]`: request rates per tenant and per client IP (HTTP answers 429
//! with `Retry-After`), sandbox creations per minute, and how many sandboxes
//! a tenant and the whole server may hold. With authentication off the
//! tenant is the client's IP address, so a public demo is limited by
//! configuration alone.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};
use serde::Deserialize;

use crate::auth::Keys;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Requests per second per tenant (API key, or client IP without auth).
    pub requests_per_second: u32,
    /// Requests a tenant may make at once above its steady rate.
    pub burst: u32,
    /// Requests per second per client IP, whatever key it uses.
    pub ip_requests_per_second: u32,
    /// Sandbox creations per minute per tenant.
    pub creations_per_minute: u32,
    /// Sandboxes one tenant may hold (a key's `max_sandboxes` overrides it).
    pub max_sandboxes_per_tenant: usize,
    /// Sandboxes the whole server may hold.
    pub max_sandboxes_total: usize,
    /// Free disk space, in MB, below which new sandboxes and installs are
    /// refused (0: no check).
    pub min_free_disk_mb: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            requests_per_second: 20,
            burst: 40,
            ip_requests_per_second: 100,
            creations_per_minute: 10,
            max_sandboxes_per_tenant: 3,
            max_sandboxes_total: 50,
            min_free_disk_mb: 1024,
        }
    }
}

impl LimitsConfig {
    pub fn validate(&self) -> Result<(), String> {
        for (key, v) in [
            ("requests_per_second", self.requests_per_second as usize),
            ("burst", self.burst as usize),
            ("ip_requests_per_second", self.ip_requests_per_second as usize),
            ("creations_per_minute", self.creations_per_minute as usize),
            ("max_sandboxes_per_tenant", self.max_sandboxes_per_tenant),
            ("max_sandboxes_total", self.max_sandboxes_total),
        ] {
            if v == 0 {
                return Err(format!("limits.{key}: at least 1"));
            }
        }
        Ok(())
    }
}

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n.max(1)).expect("at least 1")
}

pub struct Limits {
    config: LimitsConfig,
    keys: Keys,
    per_tenant: DefaultKeyedRateLimiter<String>,
    /// Tenants whose key sets its own rate.
    per_key: HashMap<String, DefaultDirectRateLimiter>,
    per_ip: DefaultKeyedRateLimiter<IpAddr>,
    creations: DefaultKeyedRateLimiter<String>,
}

/// How long to wait before trying again.
pub struct RetryAfter(pub Duration);

impl RetryAfter {
    pub fn seconds(&self) -> u64 {
        self.0.as_secs() + u64::from(self.0.subsec_nanos() > 0)
    }
}

fn check_keyed<K: Hash + Eq + Clone>(limiter: &DefaultKeyedRateLimiter<K>, key: &K) -> Result<(), RetryAfter> {
    limiter
        .check_key(key)
        .map_err(|n| RetryAfter(n.wait_time_from(DefaultClock::default().now())))
}

impl Limits {
    pub fn new(config: LimitsConfig, keys: Keys, key_rates: impl Iterator<Item = (String, u32)>) -> Self {
        let burst = nz(config.burst.max(config.requests_per_second));
        let per_key = key_rates
            .map(|(name, rps)| {
                (
                    name,
                    RateLimiter::direct(Quota::per_second(nz(rps)).allow_burst(nz(rps.saturating_mul(2)))),
                )
            })
            .collect();
        Self {
            per_tenant: RateLimiter::keyed(Quota::per_second(nz(config.requests_per_second)).allow_burst(burst)),
            per_ip: RateLimiter::keyed(
                Quota::per_second(nz(config.ip_requests_per_second)).allow_burst(nz(config.ip_requests_per_second * 2)),
            ),
            creations: RateLimiter::keyed(Quota::per_minute(nz(config.creations_per_minute))),
            per_key,
            keys,
            config,
        }
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// One HTTP request from `ip` by `tenant`.
    pub fn check_request(&self, ip: IpAddr, tenant: &str) -> Result<(), RetryAfter> {
        check_keyed(&self.per_ip, &ip)?;
        match self.per_key.get(tenant) {
            Some(l) => l
                .check()
                .map_err(|n| RetryAfter(n.wait_time_from(DefaultClock::default().now()))),
            None => check_keyed(&self.per_tenant, &tenant.to_string()),
        }
    }

    /// One sandbox creation by `tenant`.
    pub fn check_creation(&self, tenant: &str) -> Result<(), RetryAfter> {
        check_keyed(&self.creations, &tenant.to_string())
    }

    pub fn max_sandboxes(&self, tenant: &str) -> usize {
        self.keys
            .tenant(tenant)
            .and_then(|t| t.max_sandboxes)
            .unwrap_or(self.config.max_sandboxes_per_tenant)
    }

    pub fn max_sandboxes_total(&self) -> usize {
        self.config.max_sandboxes_total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flooding_tenant_is_limited_and_others_are_not() {
        let config = LimitsConfig {
            requests_per_second: 2,
            burst: 2,
            ..Default::default()
        };
        let limits = Limits::new(config, Keys::default(), std::iter::once(("vip".to_string(), 50)));
        let ip: IpAddr = [127, 0, 0, 1].into();
        assert!(limits.check_request(ip, "a").is_ok());
        assert!(limits.check_request(ip, "a").is_ok());
        let wait = limits
            .check_request(ip, "a")
            .expect_err("third request in the same instant");
        assert!(wait.seconds() >= 1);
        assert!(limits.check_request(ip, "b").is_ok());
        for _ in 0..20 {
            assert!(limits.check_request(ip, "vip").is_ok(), "a key's own rate applies");
        }
    }
}
