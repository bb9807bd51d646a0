//! `open` sandboxes joined to the server's bridge network by the server
//! itself rather than by the engine's network controller.
//!
//! Why: on a container it networks, the engine runs its own binary three
//! times (an OCI prestart hook, the IPv6 setting, the embedded resolver)
//! and iptables ten times; that is about two thirds of the CPU of an `open`
//! creation, and what bounds a burst of them on a small host
//! (docs/benchmarks.md). The container is made with networking disabled,
//! as a proxied one is, and the server does in about 15 ms of CPU what the
//! engine would: a veth pair, one end a port of the bridge and the other
//! `eth0` in the container's namespace; IPv6 off on both (a sandbox could
//! otherwise talk link-local IPv6 to another port of the bridge, which the
//! IPv4 firewall does not see); an address from the half of the subnet that
//! the engine's address range leaves to the server; a default route through
//! the bridge's gateway; and a `resolv.conf` naming the host's name servers,
//! which the firewall lets the subnet reach on port 53. Everything else (the
//! engine's NAT and forwarding rules, the server's firewall rules and
//! bounds) is written per bridge or per subnet and applies unchanged.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use ipnet::Ipv4Net;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;
use uuid::Uuid;

/// How long one `ip` or `nsenter` may take.
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
    #[error("{command}: {source}")]
    Run {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} failed: {stderr}")]
    Refused { command: String, stderr: String },
    #[error("{command} did not finish within {} s", STEP_DEADLINE.as_secs())]
    Timeout { command: String },
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
#[derive(Debug)]
pub struct Bridge {
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
}

impl Bridge {
    /// `held`: the addresses of this server's containers that exist (read
    /// from their labels at start), never handed out again while they do;
    /// one outside the server's range is left out and said.
    pub fn new(
        interface: String,
        subnet: Ipv4Net,
        gateway: Ipv4Addr,
        range: Ipv4Net,
        mtu: u32,
        held: impl IntoIterator<Item = (Ipv4Addr, Holder)>,
    ) -> Self {
        let held = held
            .into_iter()
            .filter(|(address, holder)| {
                let ours = range.contains(address);
                if !ours {
                    tracing::warn!(%address, sandbox = %holder.sandbox, %range, "a container's address is outside the server's range; not counted");
                }
                ours
            })
            .collect();
        // A random start: the addresses that the last run gave back are
        // not the first handed out again after a restart.
        let cursor = Uuid::new_v4().as_u128() as u32;
        Self {
            interface,
            subnet,
            gateway,
            range,
            mtu,
            addresses: Mutex::new(Addresses { held, cursor }),
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
    /// address given back twice never frees another holder's.
    pub fn give_back(&self, address: Ipv4Addr, sandbox: Uuid) {
        let mut a = self.addresses();
        if a.held.get(&address).is_some_and(|h| h.sandbox == sandbox) {
            a.held.remove(&address);
        }
    }

    /// Whether the host end of `address`'s pair is a port of the bridge
    /// and up: a server stopped between making the pair and joining its
    /// host end to the bridge leaves it neither.
    pub fn has_port(&self, address: Ipv4Addr) -> bool {
        let port = port_dir(&Self::host_end(address));
        let master = std::fs::read_link(port.join("master")).ok();
        let up = std::fs::read_to_string(port.join("flags"))
            .ok()
            .and_then(|f| u32::from_str_radix(f.trim().trim_start_matches("0x"), 16).ok())
            .is_some_and(|f| f & libc::IFF_UP as u32 != 0);
        up && master.is_some_and(|m| m.file_name().is_some_and(|n| n == self.interface.as_str()))
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
        let namespace = std::fs::File::open(format!("/proc/{pid}/ns/net")).map_err(|_| AttachError::NotRunning(pid))?;
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let own = std::fs::File::open("/proc/self/ns/net").map_err(|source| AttachError::Run {
            command: "opening the server's network namespace".into(),
            source,
        })?;
        if container_id.len() < 12 || !cgroups.contains(container_id) || same_file(&namespace, &own) {
            return Err(AttachError::NotRunning(pid));
        }
        let host = Self::host_end(address);
        let interfaces = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).unwrap_or_default();
        if interfaces.lines().any(|l| l.trim_start().starts_with("eth0:")) {
            // Joined already (the engine answers a start of a running
            // container as done), or the server stopped before the pair's
            // host end was on the bridge: that end is joined again.
            if !port_exists(&host) {
                return Err(AttachError::Refused {
                    command: "joining the container".into(),
                    stderr: format!("it has an eth0 whose other end {host} is not on this host"),
                });
            }
            return self.join_port(&host).await;
        }
        // The port of an earlier run of the container, whose namespace the
        // kernel is still destroying, goes with it; one that stays is
        // another container's, and is never taken from it.
        let deadline = std::time::Instant::now() + STALE_PORT_WAIT;
        while port_exists(&host) {
            if std::time::Instant::now() > deadline {
                return Err(AttachError::InUse(address));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Flows its last holder left in the kernel's table would count
        // against this holder's bounds (the firewall counts connections per
        // address), and their replies would reach it. Forgotten while the
        // pair is made, before its port joins the bridge.
        let forget = async {
            super::conntrack::forget_off_thread(address)
                .await
                .map_err(|e| AttachError::Conntrack(address, e))
        };
        let (forgotten, paired) = tokio::join!(forget, self.make_pair(&namespace, &host, address));
        let attached = match (forgotten, paired) {
            (Ok(_), Ok(())) => self.join_port(&host).await,
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
        if attached.is_err() {
            let _ = run(&["ip", "link", "del", &host], None).await;
        }
        attached
    }

    /// Makes the pair: `eth0` in the namespace, with its address and route,
    /// and the host end, not yet on the bridge.
    async fn make_pair(&self, namespace: &std::fs::File, host: &str, address: Ipv4Addr) -> Result<(), AttachError> {
        let (mtu, server) = (self.mtu, std::process::id());
        // Made inside the container's namespace and the host end moved out
        // to the server's, so that only the server's own process id and the
        // namespace it holds open are named. IPv6 is off for interfaces made
        // after the setting, so `eth0` never has an address of that family.
        let batch = format!(
            "link add eth0 mtu {mtu} type veth peer name {host} mtu {mtu} netns {server}\n\
             addr add {address}/{len} dev eth0\n\
             link set eth0 up\n\
             route add default via {gateway}\n",
            len = self.subnet.prefix_len(),
            gateway = self.gateway,
        );
        let enter = format!("--net=/proc/{server}/fd/{}", namespace.as_raw_fd());
        const SCRIPT: &str = "set -e; if [ -e /proc/sys/net/ipv6 ]; then \
             echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6; \
             echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6; fi; exec ip -batch -";
        run(&["nsenter", &enter, "sh", "-c", SCRIPT], Some(batch)).await?;
        let ipv6 = PathBuf::from(format!("/proc/sys/net/ipv6/conf/{host}/disable_ipv6"));
        if ipv6.exists() {
            std::fs::write(&ipv6, "1").map_err(|source| AttachError::Run {
                command: format!("writing {}", ipv6.display()),
                source,
            })?;
        }
        Ok(())
    }

    /// Makes `host` an isolated port of the bridge, up. An isolated port
    /// reaches the bridge (the gateway) but no other isolated port:
    /// sandboxes stay apart at the link layer too, broadcast and multicast
    /// included, whatever the firewall sees.
    async fn join_port(&self, host: &str) -> Result<(), AttachError> {
        let port = format!(
            "link set {host} master {bridge}\nlink set {host} type bridge_slave isolated on\nlink set {host} up\n",
            bridge = self.interface
        );
        run(&["ip", "-batch", "-"], Some(port)).await
    }
}

/// The host's folder of the interface `host`.
fn port_dir(host: &str) -> PathBuf {
    Path::new("/sys/class/net").join(host)
}

fn port_exists(host: &str) -> bool {
    port_dir(host).exists()
}

fn same_file(a: &std::fs::File, b: &std::fs::File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (a.metadata(), b.metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Runs `argv` with `input` on its standard input, within [`STEP_DEADLINE`].
async fn run(argv: &[&str], input: Option<String>) -> Result<(), AttachError> {
    let command = argv.join(" ");
    let mut child = Command::new(argv[0])
        .args(&argv[1..])
        .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| AttachError::Run {
            command: command.clone(),
            source,
        })?;
    let finished = async {
        if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin.write_all(input.as_bytes()).await?;
        }
        child.wait_with_output().await
    };
    let out = match tokio::time::timeout(STEP_DEADLINE, finished).await {
        Err(_) => return Err(AttachError::Timeout { command }),
        Ok(Err(source)) => return Err(AttachError::Run { command, source }),
        Ok(Ok(out)) => out,
    };
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    Err(AttachError::Refused {
        command,
        stderr: stderr.chars().take(500).collect::<String>().trim().to_string(),
    })
}

/// Whether this process can join sandboxes to the bridge: root, with `ip`
/// and `nsenter` on its path. What is missing, otherwise.
pub fn missing_tools() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("the server does not run as root".into());
    }
    let on_path = |tool: &str| {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
            .unwrap_or(false)
    };
    ["ip", "nsenter"]
        .into_iter()
        .find(|t| !on_path(t))
        .map(|t| format!("`{t}` is not on the server's path"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bridge(subnet: &str) -> Bridge {
        let subnet: Ipv4Net = subnet.parse().unwrap();
        let (_, range) = halves(subnet).unwrap();
        let gateway = Ipv4Addr::from(u32::from(subnet.network()) + 1);
        let b = Bridge::new("br-test".into(), subnet, gateway, range, 1500, []);
        b.addresses().cursor = 0;
        b
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
        b.give_back(taken[1], sandboxes[1]);
        let next = Uuid::new_v4();
        assert_eq!(b.take(next).unwrap(), ip("172.18.0.9"));
        // Given back twice: the second time frees nothing of the new holder's.
        b.give_back(taken[1], sandboxes[1]);
        assert!(matches!(b.take(Uuid::new_v4()), Err(AttachError::Exhausted(_))));
        // A container made at an address that went to another sandbox meanwhile.
        assert!(matches!(
            b.made(taken[1], sandboxes[1], "c2"),
            Err(AttachError::InUse(_))
        ));
        b.give_back(taken[2], sandboxes[2]);
        b.give_back(taken[0], sandboxes[0]);
        // The search goes on after the address last handed out (.9), so .10
        // comes before .8.
        assert_eq!(b.take(Uuid::new_v4()).unwrap(), ip("172.18.0.10"));
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
        let b = Bridge::new("br".into(), subnet, ip("10.9.0.1"), range, 1500, held);
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
