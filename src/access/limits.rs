//! `[limits]`: request rates per tenant and per client IP (HTTP answers 429
//! with `Retry-After`), sandbox creations per minute, how many sandboxes a
//! tenant and the whole server may hold, and the bounds on what a client can
//! make the server hold open (sessions, connections). With authentication
//! off the tenant is the client's IP address, so a public demo is limited by
//! configuration alone. The keyed limiters forget idle clients
//! ([`Limits::prune`]), so churning addresses cannot grow them.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};
use serde::Deserialize;

use crate::access::auth::Keys;
use crate::access::budgets::Budget;
use crate::access::caller::{Caller, LOCAL_OWNER};
use crate::access::client_ip::SHORTEST_IPV6_PREFIX;
use crate::access::guest::GuestConfig;

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
    /// Live sandboxes one tenant may hold (a key's `max_sandboxes`
    /// overrides it); hibernated ones count against the caps below instead.
    /// Unset, it depends on who the tenants are: see [`LimitsConfig::sandboxes_per_tenant`].
    pub max_sandboxes_per_tenant: Option<usize>,
    /// Live sandboxes the whole server may hold.
    pub max_sandboxes_total: usize,
    /// Hibernated sandboxes one tenant may hold.
    pub max_hibernated_per_tenant: usize,
    /// Hibernated sandboxes the whole server may hold.
    pub max_hibernated_total: usize,
    /// Open MCP sessions (SSE streams, Streamable HTTP sessions) per tenant.
    pub max_sessions_per_tenant: usize,
    /// Open MCP sessions on the whole server.
    pub max_sessions_total: usize,
    /// A session without a message from its client (and no call running)
    /// for this long is closed; keep-alive comments do not count.
    pub session_idle_seconds: u64,
    /// Open HTTP connections on the whole server.
    pub max_connections: usize,
    /// Open HTTP connections from one address (trusted proxies excepted).
    pub max_connections_per_ip: usize,
    /// IPv6 clients are counted by their network of this many bits (a
    /// subscriber holds a /64 or more), for every per-address limit:
    /// request rates, connections, guest keys, and the tenant without auth.
    pub ipv6_prefix: u8,
    /// A request's headers must arrive within this long; an idle kept-alive
    /// connection is closed after it too.
    pub header_timeout_seconds: u64,
    /// A request body has this long to arrive, plus a second for each
    /// `body_min_bytes_per_second` bytes it delivers (408 past it).
    pub body_timeout_seconds: u64,
    /// The rate below which a large body stops buying time.
    pub body_min_bytes_per_second: u64,
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
            max_sandboxes_per_tenant: None,
            max_sandboxes_total: 40,
            max_hibernated_per_tenant: 20,
            max_hibernated_total: 1000,
            max_sessions_per_tenant: 100,
            max_sessions_total: 2000,
            session_idle_seconds: 600,
            max_connections: 4096,
            max_connections_per_ip: 128,
            ipv6_prefix: 64,
            header_timeout_seconds: 10,
            body_timeout_seconds: 30,
            body_min_bytes_per_second: 32 * 1024,
            min_free_disk_mb: 1024,
        }
    }
}

/// A `[limits]` value out of its range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitsError {
    #[error("limits.{0}: at least 1")]
    Zero(&'static str),
    #[error("limits.ipv6_prefix: from {SHORTEST_IPV6_PREFIX} to 128 bits")]
    Ipv6Prefix,
}

/// Live sandboxes per tenant when `max_sandboxes_per_tenant` is unset: a
/// key, or a remote address without auth, shares the host with others.
pub const SHARED_SANDBOXES_PER_TENANT: usize = 3;
/// The same for this machine's own tenant without auth (clients on
/// loopback): one person, who forks, keeps a few sandboxes asleep and
/// awake, and should not meet a quota of three.
pub const LOCAL_SANDBOXES_PER_TENANT: usize = 20;

impl LimitsConfig {
    /// Live sandboxes one tenant may hold: the configured value, or the
    /// default for this machine's own tenant (`local`) or a shared one.
    pub fn sandboxes_per_tenant(&self, local: bool) -> usize {
        let default = match local {
            true => LOCAL_SANDBOXES_PER_TENANT,
            false => SHARED_SANDBOXES_PER_TENANT,
        };
        self.max_sandboxes_per_tenant.unwrap_or(default)
    }

    pub fn validate(&self) -> Result<(), LimitsError> {
        if !(SHORTEST_IPV6_PREFIX..=128).contains(&self.ipv6_prefix) {
            return Err(LimitsError::Ipv6Prefix);
        }
        for (key, v) in [
            ("requests_per_second", self.requests_per_second as usize),
            ("burst", self.burst as usize),
            ("ip_requests_per_second", self.ip_requests_per_second as usize),
            ("creations_per_minute", self.creations_per_minute as usize),
            ("max_sandboxes_per_tenant", self.max_sandboxes_per_tenant.unwrap_or(1)),
            ("max_sandboxes_total", self.max_sandboxes_total),
            ("max_sessions_per_tenant", self.max_sessions_per_tenant),
            ("max_sessions_total", self.max_sessions_total),
            ("session_idle_seconds", self.session_idle_seconds as usize),
            ("max_connections", self.max_connections),
            ("max_connections_per_ip", self.max_connections_per_ip),
            ("header_timeout_seconds", self.header_timeout_seconds as usize),
            ("body_timeout_seconds", self.body_timeout_seconds as usize),
            ("body_min_bytes_per_second", self.body_min_bytes_per_second as usize),
        ] {
            if v == 0 {
                return Err(LimitsError::Zero(key));
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
    /// Whether tenants are keys: without, this machine's own tenant has a
    /// quota of its own.
    auth: bool,
    guest: GuestConfig,
    keys: Keys,
    per_tenant: DefaultKeyedRateLimiter<String>,
    /// Tenants whose key sets its own rate.
    per_key: HashMap<String, DefaultDirectRateLimiter>,
    /// Guest tenants, at the guest tier's rate.
    per_guest: DefaultKeyedRateLimiter<String>,
    per_ip: DefaultKeyedRateLimiter<IpAddr>,
    creations: DefaultKeyedRateLimiter<String>,
    /// Guest keys handed out per client address.
    guest_keys: DefaultKeyedRateLimiter<IpAddr>,
}

/// How long to wait before trying again.
#[derive(Debug)]
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
    /// `auth`: whether tenants are keys (without, this machine's own tenant
    /// has a default quota of its own).
    pub fn new(
        config: LimitsConfig,
        auth: bool,
        guest: GuestConfig,
        keys: Keys,
        key_rates: impl Iterator<Item = (String, u32)>,
    ) -> Self {
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
            auth,
            per_tenant: RateLimiter::keyed(Quota::per_second(nz(config.requests_per_second)).allow_burst(burst)),
            per_ip: RateLimiter::keyed(
                Quota::per_second(nz(config.ip_requests_per_second)).allow_burst(nz(config.ip_requests_per_second * 2)),
            ),
            creations: RateLimiter::keyed(Quota::per_minute(nz(config.creations_per_minute))),
            per_guest: RateLimiter::keyed(
                Quota::per_second(nz(guest.requests_per_second))
                    .allow_burst(nz(guest.requests_per_second.saturating_mul(2))),
            ),
            guest_keys: RateLimiter::keyed(
                Quota::with_period(Duration::from_secs(3600) / guest.keys_per_ip_per_hour.max(1))
                    .expect("a positive period")
                    .allow_burst(nz(guest.keys_per_ip_per_hour)),
            ),
            per_key,
            keys,
            config,
            guest,
        }
    }

    pub fn guest(&self) -> &GuestConfig {
        &self.guest
    }

    /// Forgets the clients whose limits have recovered fully: what a churn
    /// of addresses or guest keys leaves in the keyed limiters.
    pub fn prune(&self) {
        self.per_tenant.retain_recent();
        self.per_tenant.shrink_to_fit();
        self.per_guest.retain_recent();
        self.per_guest.shrink_to_fit();
        self.per_ip.retain_recent();
        self.per_ip.shrink_to_fit();
        self.creations.retain_recent();
        self.creations.shrink_to_fit();
        self.guest_keys.retain_recent();
        self.guest_keys.shrink_to_fit();
    }

    /// Clients the keyed limiters remember.
    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.per_tenant.len() + self.per_guest.len() + self.per_ip.len() + self.creations.len() + self.guest_keys.len()
    }

    /// One guest key handed out to `ip`.
    pub fn check_guest_issue(&self, ip: IpAddr) -> Result<(), RetryAfter> {
        check_keyed(&self.guest_keys, &ip)
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
            None if Caller::is_guest_owner(tenant) => check_keyed(&self.per_guest, &tenant.to_string()),
            None => check_keyed(&self.per_tenant, &tenant.to_string()),
        }
    }

    /// One sandbox creation by `tenant`.
    pub fn check_creation(&self, tenant: &str) -> Result<(), RetryAfter> {
        check_keyed(&self.creations, &tenant.to_string())
    }

    /// `n` creations at once (a fork), all or none: `Err(None)` when `n`
    /// is more than `creations_per_minute` allows at all.
    pub fn check_creations(&self, tenant: &str, n: usize) -> Result<(), Option<RetryAfter>> {
        let n = u32::try_from(n).ok().and_then(NonZeroU32::new).ok_or(None)?;
        match self.creations.check_key_n(&tenant.to_string(), n) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(not_until)) => Err(Some(RetryAfter(
                not_until.wait_time_from(DefaultClock::default().now()),
            ))),
            Err(_) => Err(None),
        }
    }

    pub fn max_sandboxes(&self, tenant: &str) -> usize {
        if Caller::is_guest_owner(tenant) {
            return self.guest.max_sandboxes;
        }
        self.keys
            .tenant(tenant)
            .and_then(|t| t.max_sandboxes)
            .unwrap_or_else(|| {
                let local = !self.auth && tenant == LOCAL_OWNER;
                self.config.sandboxes_per_tenant(local)
            })
    }

    /// A tenant's monthly budget: its key's, or the guest tier's.
    pub fn budget(&self, tenant: &str) -> Budget {
        if Caller::is_guest_owner(tenant) {
            return self.guest.budget();
        }
        self.keys.tenant(tenant).map(|t| t.budget).unwrap_or_default()
    }

    /// The egress policy a tenant's key sets for its sandboxes, if any.
    pub fn egress(&self, tenant: &str) -> Option<sandbox_actors::EgressPolicy> {
        self.keys.tenant(tenant).and_then(|t| t.egress)
    }

    /// Whether `tenant` (a guest when `guest`) may create sandboxes from
    /// template `name`: its key's or the guests' list, when set, names it.
    pub fn may_use_template(&self, tenant: &str, guest: bool, name: &str) -> bool {
        let list = match guest {
            true => self.guest.templates.as_ref(),
            false => self.keys.tenant(tenant).and_then(|t| t.templates.as_ref()),
        };
        list.is_none_or(|names| names.iter().any(|n| n == name))
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
        let limits = Limits::new(
            config,
            true,
            GuestConfig::default(),
            Keys::default(),
            std::iter::once(("vip".to_string(), 50)),
        );
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

    #[test]
    fn churning_addresses_leave_nothing_behind_once_pruned() {
        let limits = Limits::new(
            LimitsConfig::default(),
            true,
            GuestConfig::default(),
            Keys::default(),
            std::iter::empty(),
        );
        for i in 0..5000u32 {
            let ip = IpAddr::from(std::net::Ipv4Addr::from(0xC633_6400 + i));
            limits.check_request(ip, &format!("ip:{ip}")).unwrap();
        }
        assert!(limits.remembered() >= 10_000, "{}", limits.remembered());
        // Each address made one request: its limits recover within 1/20 s.
        std::thread::sleep(Duration::from_millis(200));
        limits.prune();
        assert_eq!(limits.remembered(), 0);
    }

    #[test]
    fn guests_get_the_guest_tier_and_keys_per_address_are_limited() {
        let guest = GuestConfig {
            requests_per_second: 1,
            keys_per_ip_per_hour: 2,
            max_sandboxes: 1,
            ..Default::default()
        };
        let limits = Limits::new(
            LimitsConfig::default(),
            true,
            guest,
            Keys::default(),
            std::iter::empty(),
        );
        let ip: IpAddr = [198, 51, 100, 7].into();
        assert!(limits.check_request(ip, "guest:a").is_ok());
        assert!(limits.check_request(ip, "guest:a").is_ok());
        assert!(limits.check_request(ip, "guest:a").is_err(), "burst of 2 at 1/s");
        assert!(limits.check_request(ip, "guest:b").is_ok(), "each guest its own");
        assert_eq!(limits.max_sandboxes("guest:a"), 1);
        assert_eq!(limits.max_sandboxes("alice"), SHARED_SANDBOXES_PER_TENANT);
        assert!(limits.check_guest_issue(ip).is_ok() && limits.check_guest_issue(ip).is_ok());
        let wait = limits.check_guest_issue(ip).expect_err("a third key in the hour");
        assert!(wait.seconds() > 60, "{}", wait.seconds());
        assert!(limits.check_guest_issue([198, 51, 100, 8].into()).is_ok());
    }

    #[test]
    fn the_quota_of_a_tenant_fits_one_person_on_this_machine_and_a_share_of_the_host_elsewhere() {
        let unset = LimitsConfig::default();
        assert_eq!(unset.sandboxes_per_tenant(false), SHARED_SANDBOXES_PER_TENANT);
        assert_eq!(unset.sandboxes_per_tenant(true), LOCAL_SANDBOXES_PER_TENANT);
        let limits = |auth| {
            Limits::new(
                unset.clone(),
                auth,
                GuestConfig::default(),
                Keys::default(),
                std::iter::empty(),
            )
        };
        let open = limits(false);
        assert_eq!(open.max_sandboxes(LOCAL_OWNER), LOCAL_SANDBOXES_PER_TENANT);
        assert_eq!(
            open.max_sandboxes("198.51.100.7"),
            SHARED_SANDBOXES_PER_TENANT,
            "a remote address"
        );
        let keyed = limits(true);
        assert_eq!(
            keyed.max_sandboxes(LOCAL_OWNER),
            SHARED_SANDBOXES_PER_TENANT,
            "a key named local"
        );
        let set = LimitsConfig {
            max_sandboxes_per_tenant: Some(5),
            ..Default::default()
        };
        assert_eq!(
            (set.sandboxes_per_tenant(true), set.sandboxes_per_tenant(false)),
            (5, 5)
        );
        let zero = LimitsConfig {
            max_sandboxes_per_tenant: Some(0),
            ..Default::default()
        };
        assert_eq!(zero.validate(), Err(LimitsError::Zero("max_sandboxes_per_tenant")));
    }
}
