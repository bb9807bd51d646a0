//! What an egress policy lets through: host names, `*.suffix` wildcards and
//! CIDRs, and which addresses are never a public destination (private
//! ranges, the host's own addresses and the networks it sits on, link-local,
//! loopback). The configuration check, the egress proxy and the host
//! firewall all read allow-lists this way.

use std::net::IpAddr;

use ipnet::IpNet;

/// One entry of an allow-list.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// Exactly this host.
    Host(String),
    /// `*.example.com`: any name ending in `.example.com`, not the bare suffix.
    Suffix(String),
    Net(IpNet),
}

/// An allow-list entry that is none of the forms [`Rules::parse`] takes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("{0:?}: a wildcard is *. followed by a domain with a dot")]
    Wildcard(String),
    #[error("{0:?} is neither a host name, a *.suffix wildcard nor a CIDR")]
    Unknown(String),
}

/// A parsed allow-list.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    entries: Vec<Entry>,
}

/// Whether `name` is a DNS host name (letters, digits, `-`, dots).
pub fn is_host_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

impl Rules {
    /// Parses entries as configured; the error names the bad entry.
    pub fn parse<S: AsRef<str>>(list: &[S]) -> Result<Self, RuleError> {
        let mut entries = Vec::with_capacity(list.len());
        for raw in list {
            let raw = raw.as_ref().trim();
            let lower = raw.to_ascii_lowercase();
            let entry = if let Ok(net) = lower.parse::<IpNet>() {
                Entry::Net(net.trunc())
            } else if let Ok(ip) = lower.parse::<IpAddr>() {
                Entry::Net(IpNet::from(ip))
            } else if let Some(suffix) = lower.strip_prefix("*.") {
                if !is_host_name(suffix) || !suffix.contains('.') {
                    return Err(RuleError::Wildcard(raw.to_string()));
                }
                Entry::Suffix(suffix.to_string())
            } else if is_host_name(&lower) {
                Entry::Host(lower)
            } else {
                return Err(RuleError::Unknown(raw.to_string()));
            };
            entries.push(entry);
        }
        Ok(Self { entries })
    }

    /// Whether the name (lower-cased) is listed, exactly or under a wildcard.
    pub fn admits_name(&self, name: &str) -> bool {
        self.entries.iter().any(|e| match e {
            Entry::Host(h) => h == name,
            Entry::Suffix(s) => {
                name.len() > s.len() + 1 && name.ends_with(s.as_str()) && {
                    name.as_bytes()[name.len() - s.len() - 1] == b'.'
                }
            }
            Entry::Net(_) => false,
        })
    }

    /// Whether a listed CIDR holds the address.
    pub fn lists_address(&self, ip: IpAddr) -> bool {
        self.entries
            .iter()
            .any(|e| matches!(e, Entry::Net(n) if n.contains(&ip)))
    }

    /// The listed CIDRs.
    pub fn nets(&self) -> impl Iterator<Item = &IpNet> {
        self.entries.iter().filter_map(|e| match e {
            Entry::Net(n) => Some(n),
            _ => None,
        })
    }
}

/// Ranges that are never a public destination: private, shared (CGNAT),
/// loopback, link-local, multicast, reserved, and their IPv6 kin.
pub const NON_PUBLIC: [&str; 16] = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/3",
    "::/127",
    "::ffff:0:0/96",
    "64:ff9b::/96",
    "fc00::/7",
    "fe80::/10",
    "ff00::/8",
];

/// Addresses a proxied connection may not go to unless a listed CIDR holds
/// them, and those it may never go to.
#[derive(Debug, Clone)]
pub struct AddressGuard {
    /// Non-public ranges plus the host's own addresses and on-link networks.
    closed: Vec<IpNet>,
    /// The server's sandbox network: no sandbox reaches another, listed or not.
    never: Vec<IpNet>,
}

impl AddressGuard {
    pub fn new(host_networks: Vec<IpNet>, never: Vec<IpNet>) -> Self {
        let mut closed: Vec<IpNet> = NON_PUBLIC.iter().map(|n| n.parse().expect("valid range")).collect();
        closed.extend(host_networks);
        Self { closed, never }
    }

    /// Why `ip` may not be reached under `rules`, if it may not.
    pub fn refuses(&self, ip: IpAddr, rules: &Rules) -> Option<&'static str> {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        if self.never.iter().any(|n| n.contains(&ip)) {
            return Some("the address belongs to the sandbox network");
        }
        if self.closed.iter().any(|n| n.contains(&ip)) && !rules.lists_address(ip) {
            return Some("the address is private, link-local or the host's own");
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_match_subdomains_only() {
        let r = Rules::parse(&["*.npmjs.org", "deb.debian.org", "10.1.0.0/16", "192.0.2.7"]).unwrap();
        assert!(r.admits_name("registry.npmjs.org"));
        assert!(r.admits_name("a.b.npmjs.org"));
        assert!(!r.admits_name("npmjs.org"), "the bare suffix is not a subdomain");
        assert!(!r.admits_name("evilnpmjs.org"));
        assert!(r.admits_name("deb.debian.org"));
        assert!(!r.admits_name("x.deb.debian.org"));
        assert!(r.lists_address("10.1.2.3".parse().unwrap()));
        assert!(r.lists_address("192.0.2.7".parse().unwrap()));
        assert!(!r.lists_address("10.2.0.1".parse().unwrap()));
        for bad in ["*.org", "http://x", "a b", "*", "1.2.3.4/40"] {
            assert!(Rules::parse(&[bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn private_host_and_sandbox_addresses_are_refused_unless_listed() {
        let never: Vec<IpNet> = vec!["172.30.0.0/16".parse().unwrap()];
        let g = AddressGuard::new(vec!["192.0.2.0/24".parse().unwrap()], never);
        let none = Rules::default();
        for ip in [
            "10.0.0.1",
            "127.0.0.1",
            "169.254.169.254",
            "192.0.2.2",
            "::1",
            "::ffff:10.0.0.1",
            "fe80::1",
        ] {
            assert!(g.refuses(ip.parse().unwrap(), &none).is_some(), "{ip}");
        }
        assert!(g.refuses("203.0.113.80".parse().unwrap(), &none).is_none());
        let listed = Rules::parse(&["10.0.0.0/8", "172.16.0.0/12"]).unwrap();
        assert!(g.refuses("10.0.0.1".parse().unwrap(), &listed).is_none());
        assert!(
            g.refuses("172.30.0.5".parse().unwrap(), &listed).is_some(),
            "another sandbox stays out of reach even when its range is listed"
        );
    }
}
