//! The interfaces of a sandbox's join to the server's bridge, made over
//! route netlink: a veth pair with `eth0` (address, default route, up) in
//! the container's network namespace and its other end an isolated port of
//! the bridge. These are `ip` and `nsenter` commands' requests, sent by the
//! server itself: starting those programs (four executions and two forks a
//! join) cost more CPU than the requests do, in a burst of creations where
//! every core is the engine's.
//!
//! The calls block (the kernel handles each request within its send, which
//! waits for the kernel's lock on network settings, however long another
//! holder keeps it): async callers run them on a blocking thread and bound
//! them with a [`Deadline`], which the steps check between requests.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};

use super::netlink::{attribute, string, Netlink, NETLINK_ROUTE, NLM_F_CREATE, NLM_F_EXCL};

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_NEWADDR: u16 = 20;
const RTM_NEWROUTE: u16 = 24;
const IFLA_IFNAME: u16 = 3;
const IFLA_MTU: u16 = 4;
const IFLA_MASTER: u16 = 10;
const IFLA_LINKINFO: u16 = 18;
const IFLA_NET_NS_FD: u16 = 28;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const IFLA_INFO_SLAVE_KIND: u16 = 4;
const IFLA_INFO_SLAVE_DATA: u16 = 5;
const VETH_INFO_PEER: u16 = 1;
const IFLA_BRPORT_ISOLATED: u16 = 33;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const RTA_GATEWAY: u16 = 5;
const RT_TABLE_MAIN: u8 = 254;
const RTPROT_BOOT: u8 = 3;
const RTN_UNICAST: u8 = 1;
/// The interface's name inside the sandbox.
const INSIDE: &str = "eth0";

/// A failed step of a join: what was asked, and the kernel's answer.
#[derive(Debug, thiserror::Error)]
#[error("{step}: {source}")]
pub struct StepError {
    pub step: String,
    #[source]
    pub source: io::Error,
}

/// A step's deadline, shared by the step's thread and its waiter: whichever
/// comes first, the step's end or the deadline, decides whether the step
/// counts. A step that misses it stops before its next request and undoes
/// what it made; one that ends first is waited for.
#[derive(Debug, Default)]
pub struct Deadline(AtomicU8);

const RUNNING: u8 = 0;
const DONE: u8 = 1;
const MISSED: u8 = 2;

impl Deadline {
    /// For the waiter, at the deadline: false when the step ended first.
    pub fn miss(&self) -> bool {
        self.0
            .compare_exchange(RUNNING, MISSED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// For the step, between requests: an error once the deadline passed.
    fn check(&self) -> Result<(), StepError> {
        match self.0.load(Ordering::Acquire) {
            MISSED => Err(missed()),
            _ => Ok(()),
        }
    }

    /// For the step, at its end: an error when the deadline passed first.
    fn finish(&self) -> Result<(), StepError> {
        self.0
            .compare_exchange(RUNNING, DONE, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| ())
            .map_err(|_| missed())
    }
}

fn missed() -> StepError {
    StepError {
        step: "the join's deadline passed".into(),
        source: io::Error::from(io::ErrorKind::TimedOut),
    }
}

fn step<T>(what: impl Into<String>, result: io::Result<T>) -> Result<T, StepError> {
    result.map_err(|source| StepError {
        step: what.into(),
        source,
    })
}

/// One request and its acknowledgement, unless the deadline has passed.
fn ask(
    route: &Netlink,
    deadline: &Deadline,
    what: impl Into<String>,
    message: u16,
    flags: u16,
    body: &[u8],
) -> Result<(), StepError> {
    deadline.check()?;
    step(what, route.request(message, flags, body))
}

/// What `eth0` is given: its address and the subnet's prefix length, the
/// gateway of its default route, and the bridge's MTU (both ends').
#[derive(Debug, Clone, Copy)]
pub struct Addressing {
    pub address: Ipv4Addr,
    pub prefix: u8,
    pub gateway: Ipv4Addr,
    pub mtu: u32,
}

/// Makes the pair: `eth0` in `namespace` (a network namespace held open)
/// as `addressing` says, up; the other end, `host`, in `server` (this
/// process's namespace, held open by the caller), down and on no bridge.
/// IPv6 is turned off in the namespace first (it is off
/// for interfaces made after the setting), so `eth0` never has an address
/// of that family, which the IPv4 firewall would not see. A pair made but
/// not finished (a request refused, the deadline missed) is deleted again;
/// on an error nothing of this call's is left.
pub fn make_pair(
    namespace: &File,
    server: &File,
    host: &str,
    addressing: Addressing,
    deadline: &Deadline,
) -> Result<(), StepError> {
    // On a thread of its own, which ends with the namespace it entered: no
    // thread of the server's pools ever runs in a sandbox's namespace.
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: setns(2) with a descriptor of a network namespace;
                // it changes this thread's namespace only.
                let entered = unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) };
                step("entering the container's network namespace", errno(entered))?;
                deadline.check()?;
                if Path::new("/proc/sys/net/ipv6").exists() {
                    for which in ["default", "all"] {
                        let setting = format!("/proc/sys/net/ipv6/conf/{which}/disable_ipv6");
                        step(format!("writing {setting}"), std::fs::write(&setting, "1"))?;
                    }
                }
                let route = step("opening route netlink", Netlink::open(NETLINK_ROUTE))?;
                let pair = new_veth(host, addressing.mtu, server.as_raw_fd());
                let flags = NLM_F_CREATE | NLM_F_EXCL;
                ask(
                    &route,
                    deadline,
                    format!("making the pair {INSIDE}/{host}"),
                    RTM_NEWLINK,
                    flags,
                    &pair,
                )?;
                let made = configure(&route, addressing, deadline).and_then(|()| deadline.finish());
                if made.is_err() {
                    // Both ends go with the one inside.
                    if let Ok(inside) = index_of(INSIDE) {
                        let _ = route.request(RTM_DELLINK, 0, &link(inside, 0));
                    }
                }
                made
            })
            .join()
            .unwrap_or_else(|_| {
                step(
                    "joining the namespace's thread",
                    Err(io::Error::other("the thread panicked")),
                )
            })
    })
}

/// `eth0`'s address, its state up, and the default route, inside the
/// namespace.
fn configure(route: &Netlink, addressing: Addressing, deadline: &Deadline) -> Result<(), StepError> {
    let Addressing {
        address,
        prefix,
        gateway,
        ..
    } = addressing;
    let inside = index_of(INSIDE)?;
    let new = NLM_F_CREATE | NLM_F_EXCL;
    let addressed = new_address(inside, address, prefix);
    ask(
        route,
        deadline,
        format!("giving {INSIDE} {address}/{prefix}"),
        RTM_NEWADDR,
        new,
        &addressed,
    )?;
    let up = link(inside, libc::IFF_UP as u32);
    ask(route, deadline, format!("setting {INSIDE} up"), RTM_NEWLINK, 0, &up)?;
    let default = default_route(gateway);
    ask(
        route,
        deadline,
        format!("routing through {gateway}"),
        RTM_NEWROUTE,
        new,
        &default,
    )
}

/// Makes `host`, the host end of a pair, an isolated port of `bridge`, up,
/// with IPv6 off. An isolated port reaches the bridge (the gateway) but no
/// other isolated port. In three requests, as `ip` sends them: the kernel
/// takes a port's settings from the bridge it is on when the request
/// arrives. The caller deletes the pair if this fails.
pub fn join_port(host: &str, bridge: &str, deadline: &Deadline) -> Result<(), StepError> {
    deadline.check()?;
    let route = step("opening route netlink", Netlink::open(NETLINK_ROUTE))?;
    let (port, master) = (index_of(host)?, index_of(bridge)?);
    let ipv6 = format!("/proc/sys/net/ipv6/conf/{host}/disable_ipv6");
    if Path::new(&ipv6).exists() {
        step(format!("writing {ipv6}"), std::fs::write(&ipv6, "1"))?;
    }
    let on_bridge = [link(port, 0), attribute(IFLA_MASTER, &master.to_ne_bytes())].concat();
    ask(
        &route,
        deadline,
        format!("putting {host} on {bridge}"),
        RTM_NEWLINK,
        0,
        &on_bridge,
    )?;
    let settings = attribute(IFLA_BRPORT_ISOLATED, &[1]);
    let info = [
        string(IFLA_INFO_SLAVE_KIND, "bridge"),
        attribute(IFLA_INFO_SLAVE_DATA, &settings),
    ]
    .concat();
    let isolated = [link(port, 0), attribute(IFLA_LINKINFO, &info)].concat();
    ask(
        &route,
        deadline,
        format!("isolating the port {host}"),
        RTM_NEWLINK,
        0,
        &isolated,
    )?;
    let up = link(port, libc::IFF_UP as u32);
    ask(&route, deadline, format!("setting {host} up"), RTM_NEWLINK, 0, &up)?;
    deadline.finish()
}

/// Deletes the interface `host` (and so its pair's other end).
pub fn delete(host: &str, deadline: &Deadline) -> Result<(), StepError> {
    let route = step("opening route netlink", Netlink::open(NETLINK_ROUTE))?;
    let index = index_of(host)?;
    ask(
        &route,
        deadline,
        format!("deleting {host}"),
        RTM_DELLINK,
        0,
        &link(index, 0),
    )?;
    deadline.finish()
}

fn errno(result: libc::c_int) -> io::Result<()> {
    if result == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The index of the interface `name` in the calling thread's namespace.
fn index_of(name: &str) -> Result<u32, StepError> {
    let what = || format!("finding the interface {name}");
    let c = step(what(), CString::new(name).map_err(io::Error::other))?;
    // SAFETY: `c` is a valid NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if index == 0 {
        return step(what(), Err(io::Error::last_os_error()));
    }
    Ok(index)
}

/// An ifinfomsg for the interface `index` (0: a new one) with `flags` set
/// and changed (0: none changed).
fn link(index: u32, flags: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(16);
    out.extend_from_slice(&[libc::AF_UNSPEC as u8, 0]);
    out.extend_from_slice(&0u16.to_ne_bytes());
    out.extend_from_slice(&(index as i32).to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out
}

/// A new veth pair: `eth0` here, its peer `host` moved to the namespace
/// of the descriptor `peer_namespace`.
fn new_veth(host: &str, mtu: u32, peer_namespace: libc::c_int) -> Vec<u8> {
    let peer = [
        link(0, 0),
        string(IFLA_IFNAME, host),
        attribute(IFLA_MTU, &mtu.to_ne_bytes()),
        attribute(IFLA_NET_NS_FD, &(peer_namespace as u32).to_ne_bytes()),
    ]
    .concat();
    let info = [
        string(IFLA_INFO_KIND, "veth"),
        attribute(IFLA_INFO_DATA, &attribute(VETH_INFO_PEER, &peer)),
    ]
    .concat();
    [
        link(0, 0),
        string(IFLA_IFNAME, INSIDE),
        attribute(IFLA_MTU, &mtu.to_ne_bytes()),
        attribute(IFLA_LINKINFO, &info),
    ]
    .concat()
}

/// An ifaddrmsg and its attributes: `address`/`prefix` on the interface
/// `index`, as `ip addr add` gives it (local and peer address the same).
fn new_address(index: u32, address: Ipv4Addr, prefix: u8) -> Vec<u8> {
    let mut out = vec![libc::AF_INET as u8, prefix, 0, 0];
    out.extend_from_slice(&index.to_ne_bytes());
    out.extend_from_slice(&attribute(IFA_LOCAL, &address.octets()));
    out.extend_from_slice(&attribute(IFA_ADDRESS, &address.octets()));
    out
}

/// An rtmsg and its gateway: the main table's default route through
/// `gateway`, as `ip route add default via` makes it.
fn default_route(gateway: Ipv4Addr) -> Vec<u8> {
    // family, destination and source lengths, tos, table, protocol, scope
    // (universe), type; then flags.
    let mut out = vec![libc::AF_INET as u8, 0, 0, 0, RT_TABLE_MAIN, RTPROT_BOOT, 0, RTN_UNICAST];
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(&attribute(RTA_GATEWAY, &gateway.octets()));
    out
}

#[cfg(test)]
mod tests {
    use super::super::netlink::attributes;
    use super::*;

    #[test]
    fn a_new_pair_names_both_ends_and_moves_the_peer_to_the_given_namespace() {
        let body = new_veth("mcps0a000001", 1450, 7);
        assert_eq!(&body[..16], &link(0, 0)[..]);
        let top: Vec<_> = attributes(&body[16..]).map(|(k, _, v)| (k, v)).collect();
        assert_eq!(top[0], (IFLA_IFNAME, &b"eth0\0"[..]));
        assert_eq!(top[1], (IFLA_MTU, &1450u32.to_ne_bytes()[..]));
        let (kind, info) = top[2];
        assert_eq!(kind, IFLA_LINKINFO);
        let info: Vec<_> = attributes(info).map(|(k, _, v)| (k, v)).collect();
        assert_eq!(info[0], (IFLA_INFO_KIND, &b"veth\0"[..]));
        let (_, peer, _) = attributes(info[1].1).next().unwrap();
        let peer = &peer[4..];
        let peer: Vec<_> = attributes(&peer[16..]).map(|(k, _, v)| (k, v.to_vec())).collect();
        assert_eq!(
            peer,
            vec![
                (IFLA_IFNAME, b"mcps0a000001\0".to_vec()),
                (IFLA_MTU, 1450u32.to_ne_bytes().to_vec()),
                (IFLA_NET_NS_FD, 7u32.to_ne_bytes().to_vec()),
            ]
        );
    }

    #[test]
    fn a_step_and_its_deadline_agree_on_which_came_first() {
        let ended = Deadline::default();
        assert!(ended.check().is_ok());
        assert!(ended.finish().is_ok());
        assert!(!ended.miss(), "the step ended first: it counts");
        let missed = Deadline::default();
        assert!(missed.miss());
        assert!(missed.check().is_err(), "the step stops before its next request");
        assert!(missed.finish().is_err(), "and undoes what it made");
    }

    #[test]
    fn an_address_and_a_route_are_what_ip_sends() {
        let address = new_address(3, Ipv4Addr::new(172, 18, 128, 9), 16);
        assert_eq!(&address[..8], &[libc::AF_INET as u8, 16, 0, 0, 3, 0, 0, 0]);
        let attrs: Vec<_> = attributes(&address[8..]).map(|(k, _, v)| (k, v.to_vec())).collect();
        assert_eq!(
            attrs,
            vec![(IFA_LOCAL, vec![172, 18, 128, 9]), (IFA_ADDRESS, vec![172, 18, 128, 9])]
        );
        let route = default_route(Ipv4Addr::new(172, 18, 0, 1));
        assert_eq!(route.len(), 12 + 8);
        assert_eq!(route[4], RT_TABLE_MAIN);
        assert_eq!(&route[16..], &[172, 18, 0, 1]);
        let up = link(5, libc::IFF_UP as u32);
        assert_eq!(&up[4..8], &5i32.to_ne_bytes());
        assert_eq!(&up[8..12], &up[12..16]);
    }
}
