//! Who the client is on the network: the TCP peer, or, when the peer is a
//! proxy listed in `server.trusted_proxies`, the address that proxy says it
//! forwarded for. Only a trusted peer's `Forwarded` / `X-Forwarded-For`
//! headers are read, and only their right-most untrusted entry counts: every
//! entry left of it was written by whoever connected to the proxy, so a
//! client can put anything there.

use std::net::IpAddr;

use axum::http::HeaderMap;

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

/// `server.trusted_proxies`.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Vec<Cidr>);

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

/// The `for=` entries of every `Forwarded` header, in order.
fn forwarded_for(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all("forwarded")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|element| {
            element.split(';').find_map(|pair| {
                let (k, v) = pair.split_once('=')?;
                k.trim().eq_ignore_ascii_case("for").then(|| v.trim().to_string())
            })
        })
        .collect()
}

/// The entries of every `X-Forwarded-For` header, in order.
fn x_forwarded_for(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

impl TrustedProxies {
    /// Parses the configured networks; the message names the key.
    pub fn parse(entries: &[String]) -> Result<Self, NotANetwork> {
        entries
            .iter()
            .map(|e| Cidr::parse(e).ok_or_else(|| NotANetwork(e.clone())))
            .collect::<Result<_, _>>()
            .map(Self)
    }

    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|c| c.contains(ip))
    }

    /// The client address of a request from `peer`. From an untrusted peer
    /// the headers are ignored; from a trusted one the chain (`Forwarded`
    /// when present, else `X-Forwarded-For`) is read from the right, past
    /// the trusted hops, to the first address no trusted proxy vouches for.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> Result<IpAddr, UnusableHop> {
        let peer = canonical(peer);
        if !self.trusts(peer) {
            return Ok(peer);
        }
        let mut chain = forwarded_for(headers);
        if chain.is_empty() {
            chain = x_forwarded_for(headers);
        }
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
        let p = TrustedProxies::parse(&["10.0.0.0/8".into(), "::1".into(), "192.0.2.7".into()]).unwrap();
        assert!(p.trusts(ip("10.200.1.1")));
        assert!(!p.trusts(ip("11.0.0.1")));
        assert!(p.trusts(ip("::1")));
        assert!(p.trusts(ip("::ffff:10.0.0.1")), "mapped IPv4 matches its IPv4 network");
        assert!(p.trusts(ip("192.0.2.7")) && !p.trusts(ip("192.0.2.8")));
        assert!(TrustedProxies::parse(&["0.0.0.0/0".into()])
            .unwrap()
            .trusts(ip("203.0.113.1")));
        for bad in ["10.0.0.0/33", "ten", "10.0.0.0/x", ""] {
            let err = TrustedProxies::parse(&[bad.into()]).unwrap_err().to_string();
            assert!(err.contains("server.trusted_proxies"), "{err}");
        }
    }

    #[test]
    fn only_a_trusted_peer_names_the_client_and_only_by_its_right_most_untrusted_entry() {
        let p = TrustedProxies::parse(&["127.0.0.1/32".into(), "10.0.0.0/8".into()]).unwrap();
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
        assert_eq!(p.client(ip("127.0.0.1"), &forwarded), Ok(ip("2001:db8::7")));
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
}
