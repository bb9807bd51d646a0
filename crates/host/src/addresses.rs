//! What the host's own network looks like to its sandboxes: its addresses
//! and the networks its interfaces sit on (never a destination unless an
//! allow-list names them), the private ranges a bridged sandbox may not
//! reach, and the name servers the host resolves with (which sandboxes are
//! given and which the firewall lets through on port 53).

use std::net::IpAddr;

use ipnet::IpNet;

/// Private ranges a bridged sandbox's forwarded traffic may not reach (its
/// host, link-local and other sandboxes have rules of their own).
pub const PRIVATE_V4: [&str; 4] = ["10.0.0.0/8", "100.64.0.0/10", "172.16.0.0/12", "192.168.0.0/16"];

/// The host's own addresses and the networks its interfaces sit on.
pub fn host_networks() -> Vec<IpNet> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below and only read meanwhile.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned.
        let ifa = unsafe { &*cur };
        // SAFETY: the address pointers are null or point at sockaddrs of their family.
        if let (Some(addr), Some(mask)) = unsafe { (sockaddr_ip(ifa.ifa_addr), sockaddr_ip(ifa.ifa_netmask)) } {
            let prefix = match mask {
                IpAddr::V4(m) => u32::from(m).count_ones() as u8,
                IpAddr::V6(m) => u128::from(m).count_ones() as u8,
            };
            if let Ok(net) = IpNet::new(addr, prefix) {
                out.push(net.trunc());
            }
            out.push(IpNet::from(addr));
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out.sort();
    out.dedup();
    out
}

unsafe fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    match (*sa).sa_family as i32 {
        libc::AF_INET => {
            let sin = &*(sa as *const libc::sockaddr_in);
            Some(IpAddr::from(u32::from_be(sin.sin_addr.s_addr).to_be_bytes()))
        }
        libc::AF_INET6 => {
            let sin6 = &*(sa as *const libc::sockaddr_in6);
            Some(IpAddr::from(sin6.sin6_addr.s6_addr))
        }
        _ => None,
    }
}

/// The host's resolver configuration that names its real name servers:
/// `/etc/resolv.conf`, or where that names only a local stub (systemd-resolved's
/// 127.0.0.53), the stub's own list of upstream servers, as the engine
/// reads it for its containers.
pub fn resolver_config() -> String {
    let main = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let servers = servers_of(&main);
    if !servers.is_empty() && servers.iter().all(IpAddr::is_loopback) {
        if let Ok(upstream) = std::fs::read_to_string("/run/systemd/resolve/resolv.conf") {
            return upstream;
        }
    }
    main
}

fn servers_of(config: &str) -> Vec<IpAddr> {
    config
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|v| v.trim().parse().ok())
        .collect()
}

/// The name servers of the host's resolver configuration ([`resolver_config`]).
pub fn name_servers() -> Vec<IpAddr> {
    servers_of(&resolver_config())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_s_networks_include_loopback_and_name_servers_come_from_its_resolver() {
        assert!(host_networks()
            .iter()
            .any(|n| n.contains(&"127.0.0.1".parse::<IpAddr>().unwrap())));
        assert_eq!(
            servers_of("# comment\nnameserver 192.0.2.53\nnameserver ::1\nsearch example\n"),
            ["192.0.2.53".parse::<IpAddr>().unwrap(), "::1".parse().unwrap()]
        );
    }
}
