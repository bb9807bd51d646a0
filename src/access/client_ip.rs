//! Who the client is on the network: the TCP peer, or, when the peer is a
//! proxy listed in `server.trusted_proxies`, the address that proxy says it
//! forwarded for. Only a trusted peer's headers are read, only the one
//! header `server.forwarded_header` names (a proxy that appends to
//! `X-Forwarded-For` passes the client's own `Forwarded` through untouched,
//! so reading whichever is present would let the client pick), and only its
//! right-most untrusted entry counts: every entry left of it was written by
//! whoever connected to the proxy, so a client can put anything there.
//!
//! An IPv6 subscriber holds a whole prefix (a /64 at least), so per-address
//! limits count IPv6 clients by `limits.ipv6_prefix` ([`ClientAddresses::group`]).

use std::net::IpAddr;

use axum::http::HeaderMap;
use serde::Deserialize;

/// The client address a request was attributed to (in its extensions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientIp(pub IpAddr);

/// An IPv4-mapped IPv6 address is the IPv4 address it maps.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

/// One `address/prefix` network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cidr {
    net: IpAddr,
    prefix: u32,
}

impl Cidr {
    fn parse(text: &str) -> Option<Self> {
        let (addr, prefix) = match text.trim().split_once('/') {
            Some((a, p)) => (a, Some(p.parse::<u32>().ok()?)),
            None => (text.trim(), None),
        };
        let net = canonical(addr.parse().ok()?);
        let bits = if net.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(bits);
        (prefix <= bits).then_some(Self { net, prefix })
    }

    fn contains(&self, ip: IpAddr) -> bool {
        let masked = |a: u128, bits: u32| match self.prefix {
            0 => 0,
            p => a >> (bits - p),
        };
        match (self.net, canonical(ip)) {
            (IpAddr::V4(n), IpAddr::V4(a)) => masked(u32::from(n).into(), 32) == masked(u32::from(a).into(), 32),
            (IpAddr::V6(n), IpAddr::V6(a)) => masked(n.into(), 128) == masked(a.into(), 128),
            _ => false,
        }
    }
}

/// A forwarded-for entry that is not an IP address (`unknown`, an
/// obfuscated name): the chain cannot be followed past it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the forwarding headers name no client address the server can use ({0:?})")]
pub struct UnusableHop(pub String);

/// An entry of `server.trusted_proxies` that is no network.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("server.trusted_proxies: {0:?} is not an address or address/prefix (such as 10.0.0.0/8)")]
pub struct NotANetwork(pub String);

/// `server.forwarded_header`: the one header trusted proxies name the
/// client in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, …` (nginx, most load balancers).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for=proxy1`.
    Forwarded,
    /// `X-Real-IP: client`, set (not appended) by the proxy.
    XRealIp,
}

/// Shortest `limits.ipv6_prefix`: shorter prefixes would put whole
/// providers' customers in one bucket.
pub const SHORTEST_IPV6_PREFIX: u8 = 32;

/// How a request's client address is found and grouped: the trusted
/// proxies (`server.trusted_proxies`), the header they name the client in,
/// and the IPv6 prefix by which addresses are counted.
#[derive(Debug, Clone)]
pub struct ClientAddresses {
    proxies: Vec<Cidr>,
    header: ForwardedHeader,
    ipv6_prefix: u8,
}

impl Default for ClientAddresses {
    fn default() -> Self {
        Self {
            proxies: vec![],
            header: ForwardedHeader::default(),
            ipv6_prefix: 64,
        }
    }
}

/// Headers by which proxies name the client they forward for.
const FORWARDING_HEADERS: [&str; 3] = ["forwarded", "x-forwarded-for", "x-real-ip"];

/// Whether a request says it came through a proxy.
pub fn is_forwarded(headers: &HeaderMap) -> bool {
    FORWARDING_HEADERS.iter().any(|h| headers.contains_key(*h))
}

/// `1.2.3.4`, `1.2.3.4:80`, `[::1]:80`, `::1`, optionally quoted.
fn parse_hop(text: &str) -> Result<IpAddr, UnusableHop> {
    let t = text.trim().trim_matches('"');
    let unusable = || UnusableHop(t.chars().take(64).collect());
    if let Some(rest) = t.strip_prefix('[') {
        let inner = rest.split(']').next().unwrap_or("");
        return inner.parse().map(canonical).map_err(|_| unusable());
    }
    if let Ok(ip) = t.parse() {
        return Ok(canonical(ip));
    }
    match t.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) && !host.contains(':') => {
            host.parse().map(canonical).map_err(|_| unusable())
        }
        _ => Err(unusable()),
    }
}

/// Every `name` header's value, in order. A value that is not visible
/// ASCII is refused rather than skipped: a proxy that appends its client's
/// address to the client's own line would otherwise have that whole line,
/// the address included, dropped by a client that wrote one unreadable byte.
fn lines<'a>(headers: &'a HeaderMap, name: &str) -> Result<Vec<&'a str>, UnusableHop> {
    headers
        .get_all(name)
        .iter()
        .map(|v| {
            v.to_str()
                .map_err(|_| UnusableHop(format!("a {name} header that is not ASCII")))
        })
        .collect()
}

/// The `for=` entries of every `Forwarded` header, in order.
fn forwarded_for(headers: &HeaderMap) -> Result<Vec<String>, UnusableHop> {
    Ok(lines(headers, "forwarded")?
        .into_iter()
        .flat_map(|v| v.split(','))
        .filter_map(|element| {
            element.split(';').find_map(|pair| {
                let (k, v) = pair.split_once('=')?;
                k.trim().eq_ignore_ascii_case("for").then(|| v.trim().to_string())
            })
        })
        .collect())
}

/// The entries of every `name` header (a comma-separated list), in order.
fn listed(headers: &HeaderMap, name: &str) -> Result<Vec<String>, UnusableHop> {
    Ok(lines(headers, name)?
        .into_iter()
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect())
}

impl ClientAddresses {
    /// Parses the configured networks (the message names the key); the
    /// prefix is checked with the rest of `[limits]`.
    pub fn parse(entries: &[String], header: ForwardedHeader, ipv6_prefix: u8) -> Result<Self, NotANetwork> {
        let proxies = entries
            .iter()
            .map(|e| Cidr::parse(e).ok_or_else(|| NotANetwork(e.clone())))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            proxies,
            header,
            ipv6_prefix,
        })
    }

    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.proxies.iter().any(|c| c.contains(ip))
    }

    /// The address by which `ip` is counted: itself for IPv4 and loopback
    /// (which is this machine, the local tenant without auth), its network
    /// of `limits.ipv6_prefix` bits for other IPv6 addresses.
    pub fn group(&self, ip: IpAddr) -> IpAddr {
        match canonical(ip) {
            IpAddr::V6(v6) if !v6.is_loopback() => {
                let bits = u32::from(self.ipv6_prefix.min(128));
                let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
                IpAddr::V6((u128::from(v6) & mask).into())
            }
            v4 => v4,
        }
    }

    /// The client address of a request from `peer`. From an untrusted peer
    /// the headers are ignored; from a trusted one the chain of the
    /// configured header is read from the right, past the trusted hops, to
    /// the first address no trusted proxy vouches for.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> Result<IpAddr, UnusableHop> {
        let peer = canonical(peer);
        if !self.trusts(peer) {
            return Ok(peer);
        }
        let chain = match self.header {
            ForwardedHeader::XForwardedFor => listed(headers, "x-forwarded-for")?,
            ForwardedHeader::Forwarded => forwarded_for(headers)?,
            // Set by the proxy, not appended to: a client's own is replaced,
            // and only the last one can be the proxy's.
            ForwardedHeader::XRealIp => listed(headers, "x-real-ip")?.into_iter().last().into_iter().collect(),
        };
        let mut client = peer;
        for hop in chain.iter().rev() {
            client = parse_hop(hop)?;
            if !self.trusts(client) {
                break;
            }
        }
        Ok(client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn networks_parse_and_match() {
        let p = proxies(&["10.0.0.0/8", "::1", "192.0.2.7"], ForwardedHeader::XForwardedFor);
        assert!(p.trusts(ip("10.200.1.1")));
        assert!(!p.trusts(ip("11.0.0.1")));
        assert!(p.trusts(ip("::1")));
        assert!(p.trusts(ip("::ffff:10.0.0.1")), "mapped IPv4 matches its IPv4 network");
        assert!(p.trusts(ip("192.0.2.7")) && !p.trusts(ip("192.0.2.8")));
        assert!(proxies(&["0.0.0.0/0"], ForwardedHeader::Forwarded).trusts(ip("203.0.113.1")));
        for bad in ["10.0.0.0/33", "ten", "10.0.0.0/x", ""] {
            let err = ClientAddresses::parse(&[bad.into()], ForwardedHeader::default(), 64)
                .unwrap_err()
                .to_string();
            assert!(err.contains("server.trusted_proxies"), "{err}");
        }
    }

    fn proxies(nets: &[&str], header: ForwardedHeader) -> ClientAddresses {
        let nets: Vec<String> = nets.iter().map(|n| n.to_string()).collect();
        ClientAddresses::parse(&nets, header, 64).unwrap()
    }

    #[test]
    fn only_a_trusted_peer_names_the_client_and_only_by_its_right_most_untrusted_entry() {
        let p = proxies(&["127.0.0.1/32", "10.0.0.0/8"], ForwardedHeader::XForwardedFor);
        let spoofed = headers(&[("x-forwarded-for", "198.51.100.1, 203.0.113.9")]);
        assert_eq!(p.client(ip("127.0.0.1"), &spoofed), Ok(ip("203.0.113.9")));
        assert_eq!(
            p.client(ip("192.0.2.1"), &spoofed),
            Ok(ip("192.0.2.1")),
            "an untrusted peer's headers are ignored"
        );
        let through_two = headers(&[
            ("x-forwarded-for", "198.51.100.1"),
            ("x-forwarded-for", "203.0.113.9, 10.1.2.3"),
        ]);
        assert_eq!(p.client(ip("127.0.0.1"), &through_two), Ok(ip("203.0.113.9")));
        let forwarded = headers(&[(
            "forwarded",
            r#"for=198.51.100.1, for="[2001:db8::7]:4711";proto=https, for=10.0.0.2"#,
        )]);
        let p7239 = proxies(&["127.0.0.1/32", "10.0.0.0/8"], ForwardedHeader::Forwarded);
        assert_eq!(p7239.client(ip("127.0.0.1"), &forwarded), Ok(ip("2001:db8::7")));
        assert_eq!(
            p.client(ip("127.0.0.1"), &headers(&[("x-forwarded-for", "203.0.113.9:5000")])),
            Ok(ip("203.0.113.9"))
        );
        assert_eq!(p.client(ip("127.0.0.1"), &HeaderMap::new()), Ok(ip("127.0.0.1")));
        assert!(p
            .client(
                ip("127.0.0.1"),
                &headers(&[("x-forwarded-for", "203.0.113.9, unknown")])
            )
            .is_err());
        assert!(is_forwarded(&spoofed) && !is_forwarded(&HeaderMap::new()));
    }

    #[test]
    fn only_the_configured_header_is_read() {
        // A proxy that appends X-Forwarded-For passes the client's own
        // Forwarded header through: the client must not pick its address.
        let both = headers(&[
            ("forwarded", "for=198.51.100.77"),
            ("x-real-ip", "198.51.100.88"),
            ("x-forwarded-for", "203.0.113.9"),
        ]);
        let peer = ip("127.0.0.1");
        let by_header = |h, headers: &HeaderMap| proxies(&["127.0.0.1/32"], h).client(peer, headers);
        let by = |h| by_header(h, &both);
        assert_eq!(by(ForwardedHeader::XForwardedFor), Ok(ip("203.0.113.9")));
        assert_eq!(by(ForwardedHeader::Forwarded), Ok(ip("198.51.100.77")));
        assert_eq!(by(ForwardedHeader::XRealIp), Ok(ip("198.51.100.88")));
        let only_forwarded = headers(&[("forwarded", "for=198.51.100.77")]);
        assert_eq!(
            proxies(&["127.0.0.1/32"], ForwardedHeader::XForwardedFor).client(peer, &only_forwarded),
            Ok(peer),
            "a header the proxy does not set is ignored"
        );
        let config: crate::config::ServerConfig = toml::from_str("forwarded_header = \"x-real-ip\"").expect("parses");
        assert_eq!(config.forwarded_header, ForwardedHeader::XRealIp);
        assert!(toml::from_str::<crate::config::ServerConfig>("forwarded_header = \"via\"").is_err());
        // A client's unreadable line, to which the proxy appended the real
        // address, is refused, not skipped (which would leave the proxy as
        // the client).
        let mut garbled = HeaderMap::new();
        garbled.append(
            "x-forwarded-for",
            HeaderValue::from_bytes(b"\xff, 203.0.113.9").unwrap(),
        );
        assert!(by_header(ForwardedHeader::XForwardedFor, &garbled).is_err());
    }

    #[test]
    fn ipv6_addresses_are_grouped_by_the_prefix_and_ipv4_ones_are_not() {
        let by64 = ClientAddresses::parse(&[], ForwardedHeader::default(), 64).unwrap();
        assert_eq!(by64.group(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(by64.group(ip("2001:db8:1:2:ffff:ffff:ffff:ffff")), ip("2001:db8:1:2::"));
        assert_ne!(by64.group(ip("2001:db8:1:3::1")), ip("2001:db8:1:2::"));
        assert_eq!(by64.group(ip("198.51.100.7")), ip("198.51.100.7"));
        assert_eq!(
            by64.group(ip("::ffff:198.51.100.7")),
            ip("198.51.100.7"),
            "mapped IPv4 stays itself"
        );
        assert_eq!(by64.group(ip("::1")), ip("::1"), "loopback stays the local machine");
        let by128 = ClientAddresses::parse(&[], ForwardedHeader::default(), 128).unwrap();
        assert_eq!(by128.group(ip("2001:db8::1")), ip("2001:db8::1"));
        let by48 = ClientAddresses::parse(&[], ForwardedHeader::default(), 48).unwrap();
        assert_eq!(by48.group(ip("2001:db8:1:2::1")), ip("2001:db8:1::"));
    }
}
