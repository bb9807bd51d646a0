//! `open` sandboxes joined to the server's bridge network by the server
//! itself rather than by the engine's network controller.
//!
//! Why: on a container it networks, the engine runs its own binary three
//! times (an OCI prestart hook, the IPv6 setting, the embedded resolver)
//! and iptables ten times; that is about two thirds of the CPU of an `open`
//! creation, and what bounds a burst of them on a small host
//! (docs/benchmarks.md). The container is made with networking disabled,
//! as a proxied one is, and the server does by netlink requests of its own
//! (veth.rs, no program started) what the engine would: a veth pair, one end a port of the bridge and the other
//! `eth0` in the container's namespace; IPv6 off on both (a sandbox could
//! otherwise talk link-local IPv6 to another port of the bridge, which the
//! IPv4 firewall does not see); an address from the half of the subnet that
//! the engine's address range leaves to the server; a default route through
//! the bridge's gateway; and a `resolv.conf` naming the host's name servers,
//! which the firewall lets the subnet reach on port 53. Everything else (the
//! engine's NAT and forwarding rules, the server's firewall rules and
//! bounds) is written per bridge or per subnet and applies unchanged.

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipnet::Ipv4Net;
use uuid::Uuid;

use crate::syscalls::{forget_flows_off_thread, Syscalls};

/// How long making a pair, or joining its port, may take.
const STEP_DEADLINE: Duration = Duration::from_secs(10);
/// How long the port of a container's earlier run may take to go with its
/// namespace, which the kernel destroys in the background.
const STALE_PORT_WAIT: Duration = Duration::from_secs(3);

/// Why an `open` sandbox could not be joined to the bridge.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("no address is left in {0}, the server's half of its sandbox network: delete sandboxes and try again")]
    Exhausted(Ipv4Net),
    #[error("the container's first process {0} is gone or is not the container's (it stopped)")]
    NotRunning(u32),
    #[error("the address {0} is another sandbox's")]
    InUse(Ipv4Addr),
    #[error("the container's address {0} is not one the server hands out on its network ({1})")]
    Foreign(Ipv4Addr, Ipv4Net),
    #[error("the container was joined to the sandbox network by the server before, which it cannot now: {0}")]
    Unavailable(String),
    #[error("forgetting the connection-tracking entries of {0}: {1}")]
    Conntrack(Ipv4Addr, #[source] std::io::Error),
    #[error("joining the container: {0}")]
    Step(#[from] super::veth::StepError),
    #[error("the container has an eth0 whose other end {0} is not on this host")]
    ForeignPair(String),
    #[error("{what} did not finish within {} s", STEP_DEADLINE.as_secs())]
    Timeout { what: &'static str },
}

/// The engine's and the server's halves of a sandbox subnet: the engine's
/// address range (given at the network's creation) is the lower one, where
/// the gateway is, and the server hands out the upper one. None for a
/// subnet too small to split.
pub fn halves(subnet: Ipv4Net) -> Option<(Ipv4Net, Ipv4Net)> {
    if subnet.prefix_len() > 28 {
        return None;
    }
    let mut halves = subnet.subnets(subnet.prefix_len() + 1).ok()?;
    Some((halves.next()?, halves.next()?))
}

/// The host's name servers that a sandbox on the bridge can reach: IPv4
/// (the bridge has no IPv6), neither loopback (the host's loopback is not
/// the sandbox's), link-local (where the firewall keeps the cloud metadata
/// services out of reach) nor one of the host's own addresses (`host`: the
/// firewall keeps sandboxes from the host itself). Empty when the host
/// resolves through such a resolver only.
pub fn reachable_name_servers(servers: &[std::net::IpAddr], host: &[std::net::IpAddr]) -> Vec<Ipv4Addr> {
    servers
        .iter()
        .filter(|a| !host.contains(a))
        .filter_map(|a| match a {
            std::net::IpAddr::V4(v4) if !v4.is_loopback() && !v4.is_unspecified() && !v4.is_link_local() => Some(*v4),
            _ => None,
        })
        .collect()
}

/// A sandbox's `resolv.conf`: `servers`, and the host's search domains and
/// options (as the engine copies them for containers without its embedded
/// resolver).
pub fn resolv_conf(host: &str, servers: &[Ipv4Addr]) -> String {
    let mut out: String = host
        .lines()
        .map(str::trim)
        .filter(|l| ["search ", "domain ", "options "].iter().any(|k| l.starts_with(k)))
        .map(|l| format!("{l}\n"))
        .collect();
    for server in servers {
        out.push_str(&format!("nameserver {server}\n"));
    }
    out
}

/// The server's bridge, as [`Bridge::attach`] needs it, and the addresses
/// it handed out.
pub struct Bridge {
    /// Every link made, joined or deleted, and every flow forgotten, goes
    /// through it.
    host: Arc<dyn Syscalls>,
    /// The bridge's interface on the host.
    interface: String,
    subnet: Ipv4Net,
    gateway: Ipv4Addr,
    /// The server's half of the subnet.
    range: Ipv4Net,
    mtu: u32,
    addresses: Mutex<Addresses>,
}

/// Who holds an address: a sandbox, and its container once made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub sandbox: Uuid,
    pub container: Option<String>,
}

#[derive(Debug, Default)]
struct Addresses {
    held: HashMap<Ipv4Addr, Holder>,
    /// Where the next search for a free address begins.
    cursor: u32,
    /// Held addresses taken from the free ones and not yet joined: the
    /// kernel tracks no flow of them (a free address had its flows
    /// forgotten when it was given back, or by the sweep at start, and
    /// cannot gain one while free: no container has it, and a packet
    /// another sandbox sends it is dropped before its flow is recorded), so
    /// their first join skips the walk of the kernel's whole table.
    swept: HashSet<Ipv4Addr>,
    /// Free addresses that may have flows: forgetting them failed when they
    /// were given back, or their port (and so their last holder's
    /// namespace) was still there then or at the server's start. Their
    /// next join forgets them.
    unswept: HashSet<Ipv4Addr>,
}

impl Bridge {
    /// `held`: the addresses of this server's containers that exist (read
    /// from their labels at start), never handed out again while they do;
    /// one outside the server's range is left out and said. The caller has
    /// forgotten the kernel's tracked flows of every other address of
    /// `range` (one sweep at start): their first joins skip it.
    pub fn new(
        host: Arc<dyn Syscalls>,
        interface: String,
        subnet: Ipv4Net,
        gateway: Ipv4Addr,
        range: Ipv4Net,
        mtu: u32,
        held: impl IntoIterator<Item = (Ipv4Addr, Holder)>,
    ) -> Self {
        let held: HashMap<Ipv4Addr, Holder> = held
            .into_iter()
            .filter(|(address, holder)| {
                let ours = range.contains(address);
                if !ours {
                    tracing::warn!(%address, sandbox = %holder.sandbox, %range, "a container's address is outside the server's range; not counted");
                }
                ours
            })
            .collect();
        // Free addresses whose ports are still there (their namespaces
        // outlive a container while its sockets close) may gain flows
        // after the caller's sweep: their next joins forget them.
        let unswept = lingering_ports(host.as_ref())
            .filter(|address| range.contains(address) && !held.contains_key(address))
            .collect();
        // A random start: the addresses that the last run gave back are
        // not the first handed out again after a restart.
        let cursor = Uuid::new_v4().as_u128() as u32;
        Self {
            host,
            interface,
            subnet,
            gateway,
            range,
            mtu,
            addresses: Mutex::new(Addresses {
                held,
                cursor,
                unswept,
                ..Default::default()
            }),
        }
    }

    pub fn range(&self) -> Ipv4Net {
        self.range
    }

    fn addresses(&self) -> std::sync::MutexGuard<'_, Addresses> {
        self.addresses.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An address for `sandbox`: the one it holds already (its container
    /// went missing and is made again), or a free one of the server's range.
    /// Free ones are handed out in turn, so that an address given back is
    /// handed out again last.
    pub fn take(&self, sandbox: Uuid) -> Result<Ipv4Addr, AttachError> {
        let mut a = self.addresses();
        if let Some((address, _)) = a.held.iter().find(|(_, h)| h.sandbox == sandbox) {
            return Ok(*address);
        }
        let first = u32::from(self.range.network());
        let size = 1u32 << (32 - self.range.prefix_len());
        let reserved = [self.subnet.network(), self.subnet.broadcast(), self.gateway];
        for step in 0..size {
            let offset = a.cursor.wrapping_add(step) % size;
            let address = Ipv4Addr::from(first + offset);
            // Valid host addresses in a larger subnet, but some software
            // takes an address ending in .0 or .255 for a network's.
            let odd = matches!(address.octets()[3], 0 | 255);
            if odd || reserved.contains(&address) || a.held.contains_key(&address) {
                continue;
            }
            a.held.insert(
                address,
                Holder {
                    sandbox,
                    container: None,
                },
            );
            if !a.unswept.remove(&address) {
                a.swept.insert(address);
            }
            a.cursor = offset.wrapping_add(1);
            return Ok(address);
        }
        Err(AttachError::Exhausted(self.range))
    }

    /// Records the container made for `sandbox` at `address`. Refused when
    /// the address went to another sandbox meanwhile (the sandbox's old
    /// container was removed while this one was being made, and the
    /// address handed out again): the container must not be joined then.
    pub fn made(&self, address: Ipv4Addr, sandbox: Uuid, container: &str) -> Result<(), AttachError> {
        let mut a = self.addresses();
        match a.held.get(&address) {
            Some(holder) if holder.sandbox != sandbox => Err(AttachError::InUse(address)),
            _ => {
                let holder = Holder {
                    sandbox,
                    container: Some(container.to_string()),
                };
                a.held.insert(address, holder);
                Ok(())
            }
        }
    }

    /// The address held for the container `container`, and its sandbox.
    pub fn address_of_container(&self, container: &str) -> Option<(Ipv4Addr, Uuid)> {
        self.addresses()
            .held
            .iter()
            .find(|(_, h)| h.container.as_deref() == Some(container))
            .map(|(address, h)| (*address, h.sandbox))
    }

    /// Gives back `address` if `sandbox` still holds it. Only its own: an
    /// address given back twice never frees another holder's. `forgotten`:
    /// whether the kernel's tracked flows of the address were forgotten
    /// after its container was gone; if not, or if its port is still there
    /// (the namespace outlives the container while its sockets close, and
    /// their last segments may be tracked anew), its next join forgets them.
    pub fn give_back(&self, address: Ipv4Addr, sandbox: Uuid, forgotten: bool) {
        let lingering = self.port_exists(&Self::host_end(address));
        let mut a = self.addresses();
        if a.held.get(&address).is_some_and(|h| h.sandbox == sandbox) {
            a.held.remove(&address);
            a.swept.remove(&address);
            if !forgotten || lingering {
                a.unswept.insert(address);
            }
        }
    }

    /// Whether this join of `address` is the first since it was taken from
    /// the swept free addresses (the kernel tracks no flow of it); every
    /// later one (a restarted container's) is not.
    fn first_join_of_swept(&self, address: Ipv4Addr) -> bool {
        self.addresses().swept.remove(&address)
    }

    /// Whether the host end of `address`'s pair is a port of the bridge
    /// and up: a server stopped between making the pair and joining its
    /// host end to the bridge leaves it neither.
    pub fn has_port(&self, address: Ipv4Addr) -> bool {
        let port = self.host.port(&Self::host_end(address));
        port.is_some_and(|p| p.up && p.master.as_deref() == Some(self.interface.as_str()))
    }

    fn port_exists(&self, host_end: &str) -> bool {
        self.host.port(host_end).is_some()
    }

    /// The host end of the veth pair of `address`: unique on the host, as
    /// servers' subnets do not overlap, and within the 15 bytes of an
    /// interface name.
    fn host_end(address: Ipv4Addr) -> String {
        format!("mcps{:08x}", u32::from(address))
    }

    /// Joins the network namespace of `pid`, the first process of the
    /// running container `container_id`, to the bridge at `address`. The
    /// namespace is held open from before the check that `pid` is still the
    /// container's until the end, so a process id reused meanwhile is never
    /// given the sandbox's network. A namespace that has its `eth0` already
    /// is left as it is (the engine answers a start of a running container
    /// as done). On failure the pair is removed again.
    pub async fn attach(&self, container_id: &str, pid: u32, address: Ipv4Addr) -> Result<(), AttachError> {
        if !self.range.contains(&address) {
            return Err(AttachError::Foreign(address, self.range));
        }
        let namespace = self
            .host
            .container_namespace(container_id, pid)
            .ok_or(AttachError::NotRunning(pid))?;
        let own = self.host.own_namespace().map_err(|source| super::veth::StepError {
            step: "opening the server's network namespace".into(),
            source,
        })?;
        if same_file(&namespace, &own) {
            return Err(AttachError::NotRunning(pid));
        }
        let host = Self::host_end(address);
        if self.host.has_eth0(pid) {
            // Joined already (the engine answers a start of a running
            // container as done), or the server stopped before the pair's
            // host end was on the bridge: that end is joined again.
            if !self.port_exists(&host) {
                return Err(AttachError::ForeignPair(host));
            }
            return self.join_port(&host).await;
        }
        // The port of an earlier run of the container, whose namespace the
        // kernel is still destroying, goes with it; one that stays is
        // another container's, and is never taken from it. Flows tracked
        // while it lingered are forgotten below.
        let lingered = self.port_exists(&host);
        let deadline = std::time::Instant::now() + STALE_PORT_WAIT;
        while self.port_exists(&host) {
            if std::time::Instant::now() > deadline {
                return Err(AttachError::InUse(address));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Flows its last holder left in the kernel's table (an earlier
        // container of this sandbox, or an address given back whose flows
        // could not be forgotten then) would count against this holder's
        // bounds (the firewall counts connections per address), and their
        // replies would reach it. Forgotten while the pair is made, before
        // its port joins the bridge; an address fresh from the swept free
        // ones has none, and skips the walk of the whole table.
        let swept = self.first_join_of_swept(address) && !lingered;
        let forget = async {
            if swept {
                return Ok(0);
            }
            forget_flows_off_thread(&self.host, move |a| a == address)
                .await
                .map_err(|e| AttachError::Conntrack(address, e))
        };
        let (forgotten, paired) = tokio::join!(forget, self.make_pair(namespace, own, &host, address));
        let attached = match (forgotten, paired) {
            (Ok(_), Ok(())) => self.join_port(&host).await,
            (Err(e), Ok(())) => Err(e),
            // Nothing of this call's is left (a pair of that name that was
            // there before is another call's, and stays).
            (_, Err(e)) => return Err(e),
        };
        if attached.is_err() {
            // The pair this call made; its address is this sandbox's until
            // the call has ended.
            let (syscalls, host) = (self.host.clone(), host.clone());
            let _ = off_thread("deleting the pair", move |d| syscalls.delete_link(&host, d)).await;
        }
        attached
    }

    /// Makes the pair: `eth0` in the namespace, with its address and route,
    /// and the host end, not yet on the bridge.
    /// `server`: the server's own namespace, where the host end goes.
    async fn make_pair(
        &self,
        namespace: std::fs::File,
        server: std::fs::File,
        host: &str,
        address: Ipv4Addr,
    ) -> Result<(), AttachError> {
        let addressing = super::veth::Addressing {
            address,
            prefix: self.subnet.prefix_len(),
            gateway: self.gateway,
            mtu: self.mtu,
        };
        let (syscalls, host) = (self.host.clone(), host.to_string());
        off_thread("making the pair", move |deadline| {
            syscalls.make_veth_pair(&namespace, &server, &host, addressing, deadline)
        })
        .await
    }

    /// Makes `host` an isolated port of the bridge, up. An isolated port
    /// reaches the bridge (the gateway) but no other isolated port:
    /// sandboxes stay apart at the link layer too, broadcast and multicast
    /// included, whatever the firewall sees.
    async fn join_port(&self, host: &str) -> Result<(), AttachError> {
        let (syscalls, host, bridge) = (self.host.clone(), host.to_string(), self.interface.clone());
        off_thread("joining the port", move |deadline| {
            syscalls.join_port(&host, &bridge, deadline)
        })
        .await
    }
}

/// Runs a step of a join on a blocking thread (netlink requests wait for
/// the kernel's locks), within [`STEP_DEADLINE`]: a step that misses it
/// stops before its next request and undoes what it made; one that ends
/// just as it passes counts.
async fn off_thread(
    what: &'static str,
    step: impl FnOnce(&super::veth::Deadline) -> Result<(), super::veth::StepError> + Send + 'static,
) -> Result<(), AttachError> {
    let deadline = std::sync::Arc::new(super::veth::Deadline::default());
    let mut handle = tokio::task::spawn_blocking({
        let deadline = deadline.clone();
        move || step(&deadline)
    });
    let joined = match tokio::time::timeout(STEP_DEADLINE, &mut handle).await {
        Ok(joined) => joined,
        Err(_) if deadline.miss() => return Err(AttachError::Timeout { what }),
        Err(_) => handle.await,
    };
    match joined {
        Ok(done) => Ok(done?),
        Err(e) => Err(super::veth::StepError {
            step: what.into(),
            source: std::io::Error::other(e),
        }
        .into()),
    }
}

/// The addresses of the host ends of pairs on this host (any server's).
fn lingering_ports(host: &dyn Syscalls) -> impl Iterator<Item = Ipv4Addr> {
    host.links().into_iter().filter_map(|name| {
        let hex = name.strip_prefix("mcps")?;
        if hex.len() != 8 {
            return None;
        }
        u32::from_str_radix(hex, 16).ok().map(Ipv4Addr::from)
    })
}

fn same_file(a: &std::fs::File, b: &std::fs::File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (a.metadata(), b.metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Why this process cannot join sandboxes to the bridge, if it cannot: it
/// needs root (to enter a container's network namespace and change
/// interfaces).
pub fn cannot_join() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    (unsafe { libc::geteuid() } != 0).then(|| "the server does not run as root".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::{Call, Recorder};
    use crate::syscalls::Port;
    use crate::veth::Deadline;

    fn bridge(subnet: &str) -> Bridge {
        let subnet: Ipv4Net = subnet.parse().unwrap();
        let (_, range) = halves(subnet).unwrap();
        let gateway = Ipv4Addr::from(u32::from(subnet.network()) + 1);
        let b = Bridge::new(
            Arc::new(Recorder::new()),
            "br-test".into(),
            subnet,
            gateway,
            range,
            1500,
            [],
        );
        b.addresses().cursor = 0;
        b
    }

    const CONTAINER: &str = "0123456789abcdef0123";

    /// A bridge on the recording host, with the search for free addresses
    /// from the start of its range.
    fn recorded() -> (Arc<Recorder>, Bridge) {
        let host = Arc::new(Recorder::new());
        let subnet: Ipv4Net = "172.18.0.0/28".parse().unwrap();
        let (_, range) = halves(subnet).unwrap();
        let b = Bridge::new(
            host.clone(),
            "br-test".into(),
            subnet,
            ip("172.18.0.1"),
            range,
            1500,
            [],
        );
        b.addresses().cursor = 0;
        (host, b)
    }

    /// The link calls made since `from`.
    fn link_calls(host: &Recorder, from: usize) -> Vec<Call> {
        host.calls()[from..]
            .iter()
            .filter(|c| !matches!(c, Call::Iptables(_)))
            .cloned()
            .collect()
    }

    #[tokio::test]
    async fn a_join_makes_the_pair_then_its_port_and_a_join_that_fails_leaves_no_pair() {
        let (host, b) = recorded();
        let sandbox = Uuid::new_v4();
        let address = b.take(sandbox).unwrap();
        let end = Bridge::host_end(address);
        host.run_container(4242, CONTAINER, false);
        b.attach(CONTAINER, 4242, address).await.unwrap();
        let made = Call::MakePair {
            host_end: end.clone(),
            address,
        };
        let joined = Call::JoinPort {
            host_end: end.clone(),
            bridge: "br-test".into(),
        };
        assert_eq!(
            link_calls(&host, 0),
            [made.clone(), joined.clone()],
            "a fresh address has no flows to forget"
        );
        assert!(b.has_port(address));

        // Not the container's process, or the server's own namespace: nothing is made.
        let before = host.calls().len();
        assert!(matches!(
            b.attach(CONTAINER, 7, address).await,
            Err(AttachError::NotRunning(7))
        ));
        assert!(matches!(
            b.attach("short", 4242, address).await,
            Err(AttachError::NotRunning(_))
        ));
        assert!(link_calls(&host, before).is_empty());

        // Its container made again (its namespace went, and its port with
        // it): the flows its last run left are forgotten, no one else's.
        host.delete_link(&end, &Deadline::default()).unwrap();
        host.track_flow(address);
        host.track_flow(ip("172.18.0.12"));
        host.run_container(4243, CONTAINER, false);
        let before = host.calls().len();
        b.attach(CONTAINER, 4243, address).await.unwrap();
        assert!(link_calls(&host, before).contains(&Call::ForgetFlows));
        assert_eq!(host.flows(), [ip("172.18.0.12")]);

        // A port that cannot join the bridge: the pair made for it goes again.
        host.delete_link(&end, &Deadline::default()).unwrap();
        host.fail("join_port", &end);
        host.run_container(4244, CONTAINER, false);
        let before = host.calls().len();
        assert!(matches!(
            b.attach(CONTAINER, 4244, address).await,
            Err(AttachError::Step(_))
        ));
        assert!(link_calls(&host, before).contains(&Call::DeleteLink { host_end: end.clone() }));
        assert!(!host.link_ports().contains_key(&end), "{:?}", host.link_ports());
    }

    #[tokio::test]
    async fn a_container_joined_before_has_its_port_joined_again_and_a_pair_not_on_this_host_is_refused() {
        let (host, b) = recorded();
        let address = b.take(Uuid::new_v4()).unwrap();
        let end = Bridge::host_end(address);
        // The server stopped between making the pair and joining its port.
        host.run_container(4242, CONTAINER, true);
        host.add_link(
            &end,
            Port {
                master: None,
                up: false,
            },
        );
        b.attach(CONTAINER, 4242, address).await.unwrap();
        assert_eq!(
            link_calls(&host, 0),
            [Call::JoinPort {
                host_end: end.clone(),
                bridge: "br-test".into()
            }]
        );
        assert!(b.has_port(address));
        // An eth0 whose other end is not here is no pair of this server's.
        host.delete_link(&end, &Deadline::default()).unwrap();
        assert!(matches!(
            b.attach(CONTAINER, 4242, address).await,
            Err(AttachError::ForeignPair(e)) if e == end
        ));
    }

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    #[test]
    fn the_server_hands_out_the_upper_half_in_turn_and_never_twice() {
        let b = bridge("172.18.0.0/28");
        // 172.18.0.8 to .15, the subnet's broadcast address left out.
        let sandboxes: Vec<Uuid> = (0..7).map(|_| Uuid::new_v4()).collect();
        let taken: Vec<_> = sandboxes.iter().map(|s| b.take(*s).unwrap()).collect();
        assert_eq!(taken.first(), Some(&ip("172.18.0.8")));
        assert_eq!(taken.last(), Some(&ip("172.18.0.14")));
        assert!(matches!(b.take(Uuid::new_v4()), Err(AttachError::Exhausted(_))));
        // A sandbox whose container is made again keeps its address.
        assert_eq!(b.take(sandboxes[3]).unwrap(), taken[3]);
        b.made(taken[1], sandboxes[1], "c1").unwrap();
        assert_eq!(b.address_of_container("c1"), Some((taken[1], sandboxes[1])));
        b.give_back(taken[1], sandboxes[1], true);
        let next = Uuid::new_v4();
        assert_eq!(b.take(next).unwrap(), ip("172.18.0.9"));
        // Given back twice: the second time frees nothing of the new holder's.
        b.give_back(taken[1], sandboxes[1], true);
        assert!(matches!(b.take(Uuid::new_v4()), Err(AttachError::Exhausted(_))));
        // A container made at an address that went to another sandbox meanwhile.
        assert!(matches!(
            b.made(taken[1], sandboxes[1], "c2"),
            Err(AttachError::InUse(_))
        ));
        b.give_back(taken[2], sandboxes[2], true);
        b.give_back(taken[0], sandboxes[0], true);
        // The search goes on after the address last handed out (.9), so .10
        // comes before .8.
        assert_eq!(b.take(Uuid::new_v4()).unwrap(), ip("172.18.0.10"));
    }

    #[test]
    fn only_the_first_join_of_an_address_taken_from_the_swept_free_ones_skips_forgetting_its_flows() {
        let holder = Holder {
            sandbox: Uuid::new_v4(),
            container: Some("a".into()),
        };
        let held = [(ip("172.18.0.8"), holder)];
        let subnet: Ipv4Net = "172.18.0.0/28".parse().unwrap();
        let range: Ipv4Net = "172.18.0.8/29".parse().unwrap();
        let b = Bridge::new(
            Arc::new(Recorder::new()),
            "br".into(),
            subnet,
            ip("172.18.0.1"),
            range,
            1500,
            held,
        );
        // Held at start (its container exists): its flows were never swept.
        assert!(!b.first_join_of_swept(ip("172.18.0.8")));
        let (one, two) = (Uuid::new_v4(), Uuid::new_v4());
        let first = b.take(one).unwrap();
        assert!(b.first_join_of_swept(first));
        // A restarted container of the same sandbox: its flows are forgotten.
        assert!(!b.first_join_of_swept(first));
        // Taken again by its holder (its container made again): no sweep.
        assert_eq!(b.take(one).unwrap(), first);
        assert!(!b.first_join_of_swept(first));
        // Given back without its flows forgotten: its next holder forgets them.
        b.give_back(first, one, false);
        let taken: Vec<_> = (0..6).map(|_| b.take(Uuid::new_v4()).unwrap()).collect();
        assert!(taken.contains(&first), "the range is {taken:?}");
        assert!(!b.first_join_of_swept(first));
        // Given back with its flows forgotten, never joined: swept again.
        let second = taken[0];
        let holder_of_second = b.addresses().held[&second].sandbox;
        b.give_back(second, holder_of_second, true);
        assert_eq!(b.take(two).unwrap(), second);
        assert!(b.first_join_of_swept(second));
    }

    /// A pair's host end that outlives its container (its namespace
    /// lingers while sockets close) may see flows tracked after they were
    /// forgotten: the address's next join forgets them, whether the port
    /// was seen at the give-back or at the server's start.
    #[test]
    fn an_address_whose_port_lingers_is_not_taken_for_swept() {
        let subnet: Ipv4Net = "10.250.77.0/28".parse().unwrap();
        let range: Ipv4Net = "10.250.77.8/29".parse().unwrap();
        let others = |n: u8| Holder {
            sandbox: Uuid::from_u128(n as u128),
            container: None,
        };
        // Every address but .14 held: a take hands out .14.
        let held = || (8..14).map(|n| (Ipv4Addr::new(10, 250, 77, n), others(n)));
        let last = ip("10.250.77.14");
        let port = Bridge::host_end(last);
        let host = Arc::new(Recorder::new());
        let b = Bridge::new(
            host.clone(),
            "br".into(),
            subnet,
            ip("10.250.77.1"),
            range,
            1500,
            held(),
        );
        let sandbox = Uuid::new_v4();
        assert_eq!(b.take(sandbox).unwrap(), last);
        host.add_link(
            &port,
            Port {
                master: None,
                up: false,
            },
        );
        b.give_back(last, sandbox, true);
        assert_eq!(b.take(sandbox).unwrap(), last);
        let at_give_back = b.first_join_of_swept(last);
        let b = Bridge::new(
            host.clone(),
            "br".into(),
            subnet,
            ip("10.250.77.1"),
            range,
            1500,
            held(),
        );
        host.delete_link(&port, &Deadline::default()).unwrap();
        assert_eq!(b.take(sandbox).unwrap(), last);
        let at_start = b.first_join_of_swept(last);
        assert!(!at_give_back, "the port was there when the address was given back");
        assert!(!at_start, "the port was there when the server started");
    }

    #[test]
    fn addresses_of_existing_containers_are_not_handed_out() {
        let subnet: Ipv4Net = "10.9.0.0/16".parse().unwrap();
        let (engine, range) = halves(subnet).unwrap();
        assert_eq!(engine.to_string(), "10.9.0.0/17");
        assert_eq!(range.to_string(), "10.9.128.0/17");
        let holder = |c: &str| Holder {
            sandbox: Uuid::new_v4(),
            container: Some(c.into()),
        };
        let held = [(ip("10.9.128.1"), holder("a")), (ip("10.9.0.7"), holder("b"))];
        let b = Bridge::new(
            Arc::new(Recorder::new()),
            "br".into(),
            subnet,
            ip("10.9.0.1"),
            range,
            1500,
            held,
        );
        b.addresses().cursor = 0;
        assert_eq!(b.take(Uuid::new_v4()).unwrap(), ip("10.9.128.2"));
        // The engine's half is never the server's, whatever a label says.
        assert!(!b.addresses().held.contains_key(&ip("10.9.0.7")));
        assert!(halves("10.0.0.0/29".parse().unwrap()).is_none());
    }

    #[test]
    fn resolv_conf_names_reachable_servers_and_keeps_the_host_search_domains() {
        let servers: Vec<std::net::IpAddr> = [
            "127.0.0.53",
            "10.255.255.53",
            "::1",
            "2001:db8::1",
            "192.0.2.4",
            "169.254.169.254",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        let reachable = reachable_name_servers(&servers, &["192.0.2.4".parse().unwrap()]);
        assert_eq!(reachable, vec!["10.255.255.53".parse::<Ipv4Addr>().unwrap()]);
        let host = "# comment\nnameserver 127.0.0.53\nsearch corp.example\noptions edns0\n";
        assert_eq!(
            resolv_conf(host, &reachable),
            "search corp.example\noptions edns0\nnameserver 10.255.255.53\n"
        );
    }

    #[test]
    fn host_ends_fit_an_interface_name() {
        let name = Bridge::host_end("255.255.255.254".parse().unwrap());
        assert_eq!(name, "mcpsfffffffe");
        assert!(name.len() <= 15);
    }
}
