//! Network policy against the real engine and the real egress proxy. One
//! server switches policy per sandbox (as per-key policies do): sandboxes of
//! two tenants never reach each other under any policy, pooled ones
//! included; the host and link-local addresses stay out of reach; `packages`
//! lets pip work and refuses other registries; an allow-list admits its
//! hosts and wildcards as documented; the connection cap holds. Targets are
//! only this machine and package-registry hosts.

mod common;

use std::time::Duration;

use common::{Harness, OWNER};
use sandbox_actors::EgressPolicy;
use sandbox_actors::{CreateOptions, Quota, RunOutput, Work};
use sandbox_host::addresses::host_networks;
use uuid::Uuid;

const ALL: [EgressPolicy; 4] = [
    EgressPolicy::Open,
    EgressPolicy::Packages,
    EgressPolicy::Allowlist,
    EgressPolicy::None,
];

/// Held by the tests of the kernel's bounds (connections, new flows,
/// bytes) and by the test that makes networks come and go: the bounds live
/// in `DOCKER-USER` alone (they need conntrack, which `raw` runs before), so
/// a connection begun while the engine re-arranges its jump to that chain
/// is not counted, and the churn would make the bounds' tests see more
/// than their bound.
static BOUNDS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn server() -> Harness {
    Harness::with(|s| {
        s.sandbox.network = EgressPolicy::Packages;
        s.sandbox.egress_allow = vec!["deb.debian.org".into(), "*.npmjs.org".into()];
        s.sandbox.egress_max_connections = 6;
    })
    .await
}

async fn create(h: &Harness, owner: &str, egress: EgressPolicy) -> Uuid {
    let options = CreateOptions {
        egress: Some(egress),
        ..Default::default()
    };
    h.sb()
        .create(owner, None, Quota::UNLIMITED, options)
        .await
        .unwrap()
        .sandbox_id
}

async fn py(h: &Harness, owner: &str, id: Uuid, code: &str) -> RunOutput {
    let out = h
        .sb()
        .run(owner, id, Work::Python(code.into()), Some(60), None)
        .await
        .unwrap()
        .output;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    out
}

/// Tries `host:port` directly (TCP), and through the proxy where there is
/// one (asked by hand: the proxy variables exempt loopback names); prints
/// one line per attempt.
fn probe_tcp(host: &str, port: u16) -> String {
    format!(
        r#"
import os, socket
try:
    socket.create_connection(("{host}", {port}), timeout=3).close()
    print("tcp reached")
except OSError as e:
    print("tcp blocked", type(e).__name__)
if os.environ.get("HTTP_PROXY"):
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
        s.sendall(b"GET http://{host}:{port}/ HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n")
        reply = s.recv(4096).decode()
        status = reply.split(" ")[1]
        print("proxy refused 403" if status == "403" else "proxy reached " + status, reply.split("\r\n\r\n")[-1].strip())
    except OSError as e:
        print("proxy failed", e)
"#
    )
}

/// Sends a datagram and waits for the echo.
fn probe_udp(host: &str, port: u16) -> String {
    format!(
        r#"
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
try:
    s.sendto(b"ping", ("{host}", {port}))
    print("udp answered", s.recv(16))
except OSError as e:
    print("udp unanswered", type(e).__name__)
"#
    )
}

/// Starts a TCP server (HTTP on 8000, serving a secret) and a UDP echo on
/// 9999 in sandbox B and returns B's address.
async fn listen(h: &Harness, owner: &str, id: Uuid) -> String {
    let start = r#"
import subprocess, socket, time
open("s.txt", "w").write("secret of B")
subprocess.Popen(["setsid", "python3", "-m", "http.server", "8000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
subprocess.Popen(["setsid", "python3", "-c", "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.bind(('0.0.0.0', 9999))\nwhile True:\n    d, a = s.recvfrom(64)\n    s.sendto(d, a)"])
time.sleep(1.5)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect(("192.0.2.1", 9))
print(s.getsockname()[0])
"#;
    let ip = py(h, owner, id, start).await.stdout.trim().to_string();
    // The control: B reaches its own services on that address.
    let own = py(h, owner, id, &(probe_tcp(&ip, 8000) + &probe_udp(&ip, 9999)))
        .await
        .stdout;
    assert!(own.contains("tcp reached") && own.contains("udp answered"), "{own}");
    ip
}

async fn assert_unreachable(h: &Harness, owner: &str, id: Uuid, ip: &str, policy: EgressPolicy) {
    let out = py(h, owner, id, &(probe_tcp(ip, 8000) + &probe_udp(ip, 9999)))
        .await
        .stdout;
    assert!(out.contains("tcp blocked"), "{policy:?}: {out}");
    assert!(out.contains("udp unanswered"), "{policy:?}: {out}");
    assert!(!out.contains("proxy reached"), "{policy:?}: {out}");
    if policy.is_proxied() {
        assert!(out.contains("proxy refused 403"), "{policy:?}: {out}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn no_sandbox_reaches_another_under_any_policy() {
    let h = server().await;
    let b = create(&h, "bob", EgressPolicy::Open).await;
    let ip = listen(&h, "bob", b).await;
    for policy in ALL {
        let a = create(&h, "alice", policy).await;
        assert_unreachable(&h, "alice", a, &ip, policy).await;
        h.sb().delete("alice", a).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn pooled_sandboxes_of_two_tenants_stay_apart() {
    let h = Harness::with(|s| s.pool = sandbox_actors::config::PoolConfig::fixed(2)).await;
    common::eventually("the pool fills", || h.own_objects() == (2, 2)).await;
    let b = h
        .sb()
        .create("bob", None, Quota::UNLIMITED, CreateOptions::default())
        .await
        .unwrap()
        .sandbox_id;
    let ip = listen(&h, "bob", b).await;
    let a = h
        .sb()
        .create("alice", None, Quota::UNLIMITED, CreateOptions::default())
        .await
        .unwrap()
        .sandbox_id;
    assert_unreachable(&h, "alice", a, &ip, EgressPolicy::Open).await;
    // A key's other policy cannot use the bridged pool: created cold, proxied.
    let c = create(&h, "carol", EgressPolicy::Packages).await;
    assert_unreachable(&h, "carol", c, &ip, EgressPolicy::Packages).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_host_and_link_local_addresses_are_out_of_reach_under_every_policy() {
    let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::Write;
        for mut s in listener.incoming().flatten() {
            let _ = s.write_all(b"HTTP/1.0 200 OK\r\n\r\nhost service\n");
        }
    });
    let host_ips: Vec<String> = host_networks()
        .into_iter()
        .filter(|n| n.prefix_len() == 32 && n.addr().is_ipv4() && !n.addr().is_loopback())
        .map(|n| n.addr().to_string())
        .collect();
    let h = server().await;
    for policy in ALL {
        let a = create(&h, OWNER, policy).await;
        let mut targets: Vec<(String, u16)> = host_ips.iter().map(|ip| (ip.clone(), port)).collect();
        targets.push(("169.254.169.254".into(), 80));
        // Through the proxy, loopback is the host's.
        targets.push(("localhost".into(), port));
        targets.push(("127.0.0.1".into(), port));
        for (host, p) in targets {
            let out = py(&h, OWNER, a, &probe_tcp(&host, p)).await.stdout;
            assert!(
                out.contains("tcp blocked") && !out.contains("reached"),
                "{policy:?} {host}: {out}"
            );
            if policy.is_proxied() {
                assert!(out.contains("proxy refused 403"), "{policy:?} {host}: {out}");
            }
        }
    }
}

/// A sandbox of every policy but `open` has loopback only, `localhost` and
/// its own name resolving (the proxy variables exempt loopback) from an
/// `/etc/hosts` mounted read-only, and the engine's networking off, which
/// spares its creation the engine's network hook (docs/benchmarks.md).
#[tokio::test(flavor = "multi_thread")]
async fn a_proxied_sandbox_has_loopback_only_and_resolves_localhost() {
    let h = server().await;
    let probe = r#"
import os, socket
print(sorted(os.listdir("/sys/class/net")), socket.gethostbyname("localhost"), socket.gethostbyname(socket.gethostname()))
print("hosts read-only" if os.statvfs("/etc/hosts").f_flag & os.ST_RDONLY else "hosts writable")
"#;
    for policy in [EgressPolicy::Packages, EgressPolicy::None] {
        let id = create(&h, OWNER, policy).await;
        let out = py(&h, OWNER, id, probe).await.stdout;
        assert_eq!(out.trim(), "['lo'] 127.0.0.1 127.0.1.1\nhosts read-only", "{policy:?}");
        let container = h.container_of(id);
        let disabled = common::docker(&["inspect", "-f", "{{.Config.NetworkDisabled}}", &container]);
        assert_eq!(disabled.trim(), "true", "{policy:?}");
    }
}

/// What an `open` sandbox's network looks like from inside.
const OPEN_PROBE: &str = r#"
import fcntl, os, socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect(("192.0.2.1", 9))
print(sorted(os.listdir("/sys/class/net")), s.getsockname()[0])
print([l for l in open("/proc/net/if_inet6") if l.split()[-1] != "lo"] or "no ipv6")
print(socket.gethostbyname(socket.gethostname()), "resolved" if socket.gethostbyname("pypi.org") else "")
socket.create_connection(("pypi.org", 443), timeout=10).close()
print("index reached")
try:
    ifreq = struct.pack("16sH2s4s8s", b"eth0", socket.AF_INET, b"", socket.inet_aton("10.9.9.9"), b"")
    fcntl.ioctl(s, 0x8916, ifreq)  # SIOCSIFADDR
    print("address changed")
except PermissionError:
    print("address kept")
try:
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    print("raw frames")
except PermissionError:
    print("no raw frames")
"#;

/// Runs [`OPEN_PROBE`] in `id`; returns its address, checking the rest.
async fn open_probe(h: &Harness, id: Uuid) -> std::net::Ipv4Addr {
    let out = py(h, OWNER, id, OPEN_PROBE).await.stdout;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        &lines[1..],
        &[
            "no ipv6",
            "127.0.1.1 resolved",
            "index reached",
            "address kept",
            "no raw frames"
        ],
        "{out}"
    );
    let (interfaces, address) = lines[0].rsplit_once(' ').unwrap();
    assert_eq!(interfaces, "['eth0', 'lo']");
    address.parse().unwrap()
}

/// An `open` sandbox is joined to the server's network by the server
/// (sandbox_host::bridge): the engine's networking is off for it; `eth0` has
/// an address of the half of the subnet the engine's range leaves to the
/// server, and no IPv6 (which the IPv4 firewall would not see); names
/// resolve through the host's name servers and its own name to loopback;
/// the index is reached; the sandbox can change neither its address nor
/// send frames of its own. Two sandboxes get two addresses; a restarted
/// container is joined again at its address, and so is a running one
/// whose port was lost, or left off the bridge, while the server was down;
/// after a restart of the
/// server, a new sandbox does not get a live one's address.
#[tokio::test(flavor = "multi_thread")]
async fn an_open_sandbox_is_joined_to_the_server_network_by_the_server() {
    let mut h = server().await;
    let network = format!("mcp-sandbox-{}", h.server_id);
    let ipam = common::docker(&[
        "network",
        "inspect",
        "-f",
        "{{range .IPAM.Config}}{{.Subnet}} {{.IPRange}}{{end}}",
        &network,
    ]);
    let (subnet, engine) = ipam.trim().split_once(' ').unwrap();
    let (subnet, engine): (ipnet::Ipv4Net, ipnet::Ipv4Net) = (subnet.parse().unwrap(), engine.parse().unwrap());
    assert_eq!(engine.prefix_len(), subnet.prefix_len() + 1, "{ipam}");
    let server_half = |a: std::net::Ipv4Addr| subnet.contains(&a) && !engine.contains(&a);

    let a = create(&h, OWNER, EgressPolicy::Open).await;
    let first = open_probe(&h, a).await;
    assert!(server_half(first), "{first} in {ipam}");
    let container = h.container_of(a);
    let disabled = common::docker(&["inspect", "-f", "{{.Config.NetworkDisabled}}", &container]);
    assert_eq!(disabled.trim(), "true");
    let b = create(&h, OWNER, EgressPolicy::Open).await;
    let second = open_probe(&h, b).await;
    assert_ne!(first, second);

    h.sb().restart(OWNER, a).await.unwrap();
    assert_eq!(open_probe(&h, a).await, first, "joined again at its address");

    // Its port lost while the server is down (as when the server is killed
    // between a start and the join): the next start joins it again.
    let port = format!("mcps{:08x}", u32::from(first));
    let deleted = std::process::Command::new("ip")
        .args(["link", "del", &port])
        .status()
        .unwrap();
    assert!(deleted.success(), "the port {port} of {first}");
    // A pair made whose host end never reached the bridge (the server
    // stopped between the two): the next start joins that end.
    let port = format!("mcps{:08x}", u32::from(second));
    let detached = std::process::Command::new("ip")
        .args(["link", "set", &port, "nomaster", "down"])
        .status()
        .unwrap();
    assert!(detached.success(), "the port {port} of {second}");
    h.restart().await;
    let c = create(&h, OWNER, EgressPolicy::Open).await;
    let third = open_probe(&h, c).await;
    assert!(server_half(third) && third != first && third != second, "{third}");
    assert_eq!(open_probe(&h, a).await, first);
    assert_eq!(open_probe(&h, b).await, second);
}

/// Fetches `url` with urllib (proxy variables as set for the sandbox).
fn fetch(url: &str) -> String {
    format!(
        r#"
import urllib.request
try:
    r = urllib.request.urlopen({url:?}, timeout=30)
    print("fetched", r.status)
except urllib.error.HTTPError as e:
    print("status", e.code)
except OSError as e:
    print("failed", e)
"#
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn packages_lets_pip_work_and_refuses_other_registries() {
    let h = server().await;
    let id = h.create().await; // the server's policy: packages
    let denied_before = h.sb().stats().await.egress_denied.get("policy").copied().unwrap_or(0);
    let r = h.sh(id, "pip install six 2>&1", Some(180)).await.output;
    assert_eq!(r.exit_code, 0, "{}", r.stdout);
    assert_eq!(h.py(id, "import six; print(six.__name__)").await.output.stdout, "six\n");
    h.install_ok(id, "idna").await;
    let out = h.py(id, &fetch("https://registry.npmjs.org/")).await.output.stdout;
    assert!(out.contains("Tunnel connection failed: 403"), "{out}");
    let out = h.py(id, &fetch("http://deb.debian.org/debian/")).await.output.stdout;
    assert!(out.contains("status 403"), "plain HTTP is checked too: {out}");
    // No resolver and no route: only the proxy leads out.
    let out = h
        .py(id, "import socket\ntry:\n    socket.create_connection(('203.0.113.80', 443), timeout=3)\n    print('direct')\nexcept OSError as e:\n    print('no route', e)")
        .await
        .output
        .stdout;
    assert!(out.starts_with("no route"), "{out}");
    let denied = h.sb().stats().await.egress_denied.get("policy").copied().unwrap_or(0);
    assert!(denied >= denied_before + 2, "{denied_before} -> {denied}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_allowlist_admits_its_hosts_and_wildcards_only() {
    let h = server().await;
    let id = create(&h, OWNER, EgressPolicy::Allowlist).await;
    for (url, want) in [
        ("https://deb.debian.org/debian/", "fetched"),
        ("https://registry.npmjs.org/six", "fetched"),
        ("https://npmjs.org/", "Tunnel connection failed: 403"),
        ("https://pypi.org/simple/", "Tunnel connection failed: 403"),
    ] {
        let out = py(&h, OWNER, id, &fetch(url)).await.stdout;
        assert!(
            out.contains(want) || (want == "fetched" && out.contains("status ")),
            "{url}: {out}"
        );
        assert!(!out.contains("403") || want.contains("403"), "{url}: {out}");
    }
    // A tunnel to a listed host may not ask its front end for another one.
    let fronted = r#"
import socket, ssl
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(b"CONNECT deb.debian.org:443 HTTP/1.1\r\nHost: deb.debian.org:443\r\n\r\n")
print(s.recv(100).split(b"\r\n")[0].decode())
try:
    ssl.create_default_context().wrap_socket(s, server_hostname="pypi.org").close()
    print("fronted")
except (OSError, ssl.SSLError) as e:
    print("cut", type(e).__name__)
"#;
    let out = py(&h, OWNER, id, fronted).await.stdout;
    assert!(out.starts_with("HTTP/1.1 200") && out.contains("cut"), "{out}");
    assert!(h.sb().stats().await.egress_denied.get("sni").copied().unwrap_or(0) >= 1);
    // The index is not listed: installs go through the installer container.
    h.install_ok(id, "six").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_holds_at_most_its_connection_cap() {
    let h = server().await; // at most 6 connections per sandbox
    let id = h.create().await;
    let code = r#"
import socket, time
held = [socket.create_connection(("127.0.0.1", 3128), timeout=5) for _ in range(6)]
time.sleep(0.5)
def ask():
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n")
    line = s.recv(200).split(b"\r\n")[0].decode()
    s.close()
    return line
print("over:", ask())
for s in held:
    s.close()
time.sleep(0.5)
print("after:", ask())
"#;
    let out = py(&h, OWNER, id, code).await.stdout;
    assert!(out.contains("over: HTTP/1.1 429"), "{out}");
    assert!(out.contains("after: HTTP/1.1 200"), "{out}");
    assert!(h.sb().stats().await.egress_denied.get("limit").copied().unwrap_or(0) >= 1);
}

/// A server whose network was made with inter-container traffic on (as by
/// an older version): with `isolate_host` its firewall rule alone keeps
/// sandboxes apart; without, the control shows they would meet.
async fn reaches_on_an_icc_network(isolate_host: bool) -> String {
    let server_id = format!("icc{}", &Uuid::new_v4().simple().to_string()[..9]);
    let h = Harness::with(|s| {
        std::fs::create_dir_all(&s.state_dir).unwrap();
        std::fs::write(s.state_dir.join("server-id"), &server_id).unwrap();
        let labels = [
            format!(
                "{}={}",
                sandbox_runtime::labels::PROJECT,
                sandbox_runtime::labels::PROJECT_VALUE
            ),
            format!("{}={server_id}", sandbox_runtime::labels::SERVER),
        ];
        let name = format!("mcp-sandbox-{server_id}");
        common::docker(&["network", "create", "--label", &labels[0], "--label", &labels[1], &name]);
        s.sandbox.isolate_host = isolate_host;
    })
    .await;
    assert_eq!(h.server_id, server_id);
    let b = create(&h, "bob", EgressPolicy::Open).await;
    let ip = listen(&h, "bob", b).await;
    let a = create(&h, "alice", EgressPolicy::Open).await;
    py(&h, "alice", a, &probe_tcp(&ip, 8000)).await.stdout
}

#[tokio::test(flavor = "multi_thread")]
async fn the_firewall_keeps_sandboxes_apart_even_with_inter_container_traffic_on() {
    assert!(
        reaches_on_an_icc_network(false).await.contains("tcp reached"),
        "the control"
    );
    assert!(reaches_on_an_icc_network(true).await.contains("tcp blocked"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gvisor_sandbox_reaches_the_index_through_the_proxy() {
    if !common::runtime_available("runsc") {
        return;
    }
    let h = Harness::on("runsc", |s| s.sandbox.network = EgressPolicy::Packages).await;
    let id = h.create().await;
    let out = py(&h, OWNER, id, &fetch("https://pypi.org/simple/six/")).await.stdout;
    assert!(out.contains("fetched 200"), "{out}");
    let out = py(&h, OWNER, id, &fetch("https://registry.npmjs.org/")).await.stdout;
    assert!(out.contains("Tunnel connection failed: 403"), "{out}");
}

/// Opens connections to pypi.org:443 from an `open` sandbox: the kernel
/// refuses the one past the cap and admits one again once they are closed.
#[tokio::test(flavor = "multi_thread")]
async fn an_open_sandbox_holds_at_most_its_connection_cap_too() {
    let _one_at_a_time = BOUNDS.lock().await;
    let h = server().await; // at most 6 connections per sandbox
    let id = create(&h, OWNER, EgressPolicy::Open).await;
    let code = r#"
import socket, time
ip = socket.gethostbyname("pypi.org")
def connect():
    try:
        return socket.create_connection((ip, 443), timeout=10)
    except OSError as e:
        return type(e).__name__
held = []
for _ in range(10):
    s = connect()
    if not isinstance(s, socket.socket):
        break
    held.append(s)
# The name lookup's flow may hold one of the six.
print("held:", len(held))
print("over:", s)
for s in held:
    s.close()
time.sleep(2)
print("after:", connect())
"#;
    // Connections begun while the engine re-arranges its jump to
    // `DOCKER-USER` (a network made or removed by another server: the
    // suite's other tiers start servers meanwhile) pass uncounted
    // (docs/security.md); one more attempt is not in such a moment as well.
    let mut seen = Vec::new();
    for _ in 0..2 {
        let out = py(&h, OWNER, id, code).await.stdout;
        let capped =
            (out.contains("held: 5") || out.contains("held: 6")) && out.contains("over: ConnectionRefusedError");
        if capped {
            assert!(out.contains("after: <socket.socket"), "{out}");
            return;
        }
        seen.push(out);
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
    panic!("the cap did not hold in two attempts: {seen:#?}");
}

/// New flows per second are bounded too (so short connections cannot fill
/// the host's conntrack table): of 120 connection attempts sent at once
/// from one sandbox, with the flow cap out of the way, about the kernel's
/// burst of 50 get through in the first half second (the host's registry
/// proxy answers them all within it when nothing holds them back).
#[tokio::test(flavor = "multi_thread")]
async fn an_open_sandbox_starts_a_bounded_number_of_flows_per_second() {
    let _one_at_a_time = BOUNDS.lock().await;
    let h = Harness::with(|s| {
        s.sandbox.network = EgressPolicy::Open;
        s.sandbox.egress_max_connections = 10_000;
    })
    .await;
    let id = h.create().await;
    let code = r#"
import select, socket, time
ip = socket.gethostbyname("pypi.org")
socks = []
for _ in range(120):
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex((ip, 443))
    socks.append(s)
deadline = time.time() + 0.5
pending = list(socks)
while pending and time.time() < deadline:
    _, ready, _ = select.select([], pending, [], 0.05)
    pending = [s for s in pending if s not in ready]
codes = [s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) for s in socks if s not in pending]
print("connected:", codes.count(0))
"#;
    // A burst begun while the engine re-arranges its jump to `DOCKER-USER`
    // (a network made or removed by another server: the suite's other
    // tiers start servers meanwhile) passes uncounted (docs/security.md);
    // one more attempt, once the bucket has refilled, is not in such a
    // moment as well.
    let mut seen = Vec::new();
    for _ in 0..2 {
        let out = py(&h, OWNER, id, code).await.stdout;
        let connected: u32 = out.trim().trim_start_matches("connected: ").parse().unwrap();
        if (20..=75).contains(&connected) {
            return;
        }
        seen.push(connected);
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    }
    panic!("connected at once, in two attempts: {seen:?}");
}

/// Reads a ~20 MB wheel for at most 25 s (or up to 4 MiB); prints the bytes
/// read in all and those read between 10 s and 25 s, past the start's burst.
const DOWNLOAD: &str = r#"
import socket, ssl, time
url = "/packages/9a/d7/21d890274f75ea37a8209d5519e72da3da90302e3b9fb8397a0918386a62/scipy-1.18.1-cp313-cp313-macosx_14_0_arm64.whl"
s = ssl.create_default_context().wrap_socket(socket.create_connection(("files.pythonhosted.org", 443), timeout=5), server_hostname="files.pythonhosted.org")
s.sendall(f"GET {url} HTTP/1.1\r\nHost: files.pythonhosted.org\r\nConnection: close\r\n\r\n".encode())
got, at10, start = 0, None, time.time()
while got < 4 * 1024 * 1024 and time.time() - start < 25:
    if at10 is None and time.time() - start >= 10:
        at10 = got
    try:
        chunk = s.recv(65536)
    except socket.timeout:
        continue
    if not chunk:
        break
    got += len(chunk)
print(got, got - (at10 if at10 is not None else got))
"#;

async fn download(h: &Harness, id: Uuid) -> (u64, u64) {
    let out = py(h, OWNER, id, DOWNLOAD).await.stdout;
    let mut n = out.split_whitespace().map(|n| n.parse().unwrap());
    (n.next().unwrap(), n.next().unwrap())
}

/// The bytes cap of `open` sandboxes, against a control on the default cap
/// in the same run: at the lowest cap, 4 MiB a minute (about 70 KB/s), the
/// 25 s move about 1.7 MiB and the 15 s past the first 10 about 1 MiB, where
/// the control moves its 4 MiB in all. The bounds leave half as much again.
/// (Below 64 KiB a second, one aggregated packet of up to 64 KiB passed each
/// second whatever the rate: under load, 850 KiB in those 15 s at 1 MiB a
/// minute. The configuration refuses such rates.)
#[tokio::test(flavor = "multi_thread")]
async fn an_open_sandbox_moves_at_most_its_bytes_per_minute() {
    let _one_at_a_time = BOUNDS.lock().await;
    let control = server().await;
    let id = create(&control, OWNER, EgressPolicy::Open).await;
    let (fast, _) = download(&control, id).await;
    assert!(fast >= 4 * 1024 * 1024, "the control: {fast} bytes");
    let capped = Harness::with(|s| {
        s.sandbox.network = EgressPolicy::Open;
        s.sandbox.egress_mb_per_minute = sandbox_actors::config::MIN_EGRESS_MB_PER_MINUTE;
    })
    .await;
    let id = capped.create().await;
    // Measured again once when the first download passed the cap: under
    // the whole suite's load the cap was once seen not to hold for one
    // download (4 MiB in 25 s); a cap that does not hold fails both.
    let mut seen = vec![];
    for _ in 0..2 {
        let (all, sustained) = download(&capped, id).await;
        assert!(all > 100_000, "the connection worked: {all} bytes");
        seen.push((all, sustained));
        if all < 3 * 1024 * 1024 && sustained < 1536 * 1024 {
            return;
        }
    }
    panic!("(bytes in all, bytes past 10 s) of each download: {seen:?}");
}

/// This server's rules in `DOCKER-USER`, in order.
fn rules_of(server_id: &str) -> Vec<String> {
    let out = std::process::Command::new("iptables")
        .args(["-w", "-S", "DOCKER-USER"])
        .output()
        .unwrap();
    let tag = format!("mcp-sandbox:{server_id}:");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&tag))
        .map(str::to_string)
        .collect()
}

/// Applying the rules again (a restart, with changed settings) puts a new
/// generation in above the old one and then removes the old: one set, in
/// its order (a listed CIDR handed back only after the bounds), with rate
/// tables of its own, so that the new rate holds. (Deleting the old rules
/// by their arguments once took the new copy of each rule both sets held,
/// leaving a listed CIDR above the bounds; and a rate table kept its name,
/// so the kernel kept its old rate.)
#[tokio::test(flavor = "multi_thread")]
async fn rules_applied_again_are_one_set_in_order_with_rate_tables_of_their_own() {
    let h = Harness::with(|s| s.sandbox.network = EgressPolicy::Open).await;
    let first = rules_of(&h.server_id);
    assert!(first.len() > 5 && first.iter().all(|r| r.contains(":a")), "{first:#?}");
    assert!(!first.iter().any(|r| r.contains("10.9.0.0/16")), "{first:#?}");
    let mut settings = common::settings(h.root.path());
    settings.sandbox.egress_mb_per_minute = 64;
    settings.sandbox.egress_allow = vec!["10.9.0.0/16".into()];
    let _runtime = common::docker_runtime(&h.server_id, &settings).await;
    let second = rules_of(&h.server_id);
    // One set, of the new generation alone: its bounds once each. (How
    // many ranges it drops follows the host's own networks, which other
    // tests make and remove.)
    assert!(second.iter().all(|r| r.contains(":b")), "{second:#?}");
    let count = |what: &str| second.iter().filter(|r| r.contains(what)).count();
    assert_eq!((count("connlimit"), count("hashlimit-name")), (1, 3), "{second:#?}");
    let at = |what: &str| second.iter().position(|r| r.contains(what)).unwrap();
    assert_eq!(at("DROP"), 0, "sandbox to sandbox first: {second:#?}");
    assert!(
        at("10.9.0.0/16") > at("dstip"),
        "the bounds before any hand-back: {second:#?}"
    );
    // 64 MiB a minute, in bytes a second (the kernel rounds the last digit).
    assert!(second[at("dstip")].contains("111848"), "the new rate: {second:#?}");
    assert!(
        !second.iter().any(|r| r.contains("adn ") || r.contains("aup ")),
        "{second:#?}"
    );
}

/// The engine moves its jump to `DOCKER-USER` whenever a network is made or
/// removed, and a connection begun in that moment passed none of its rules:
/// with forty threads dialling the metadata address while twenty networks
/// came and went, 615 of 20,330 attempts reached it (measured with the rules
/// in `DOCKER-USER` alone). The same rules kept in `raw`'s `PREROUTING`
/// hold through the churn. The control: the host itself reaches the address
/// (where nothing answers there, the attack proves nothing and the test
/// says so).
#[tokio::test(flavor = "multi_thread")]
async fn the_metadata_address_stays_out_of_reach_while_networks_come_and_go() {
    let _one_at_a_time = BOUNDS.lock().await;
    let reachable =
        std::net::TcpStream::connect_timeout(&"169.254.169.254:80".parse().unwrap(), Duration::from_secs(2));
    assert!(
        reachable.is_ok(),
        "nothing answers at 169.254.169.254:80 on this host: the attack cannot be measured"
    );
    let h = Harness::with(|s| s.sandbox.network = EgressPolicy::Open).await;
    let id = h.create().await;
    let dial = r#"
import socket, threading, time
reached, tries, end = [0], [0], time.time() + 12
def go():
    while time.time() < end:
        tries[0] += 1
        try:
            socket.create_connection(("169.254.169.254", 80), timeout=0.05).close()
            reached[0] += 1
        except OSError:
            pass
threads = [threading.Thread(target=go) for _ in range(40)]
[t.start() for t in threads]
[t.join() for t in threads]
print(tries[0], reached[0])
"#;
    let churn = tokio::task::spawn_blocking(|| {
        let name = format!("mcp-sandbox-test-churn-{}", Uuid::new_v4().simple());
        std::thread::sleep(Duration::from_secs(1));
        for _ in 0..20 {
            common::docker(&["network", "create", "--label", "io.mcp-sandbox.test=churn", &name]);
            common::docker(&["network", "rm", &name]);
        }
    });
    let out = h.py_t(id, dial, Some(60)).await.output.stdout;
    churn.await.unwrap();
    let counts: Vec<u64> = out.split_whitespace().map(|n| n.parse().unwrap()).collect();
    assert!(counts[0] > 1000, "the sandbox dialled: {out}");
    assert_eq!(
        counts[1], 0,
        "attempts, and those that reached the metadata address: {out}"
    );
}

/// Lines of the kernel's connection table with `address` as `side` ("src"
/// or "dst").
fn tracked(side: &str, address: std::net::Ipv4Addr) -> usize {
    let table = std::fs::read_to_string("/proc/net/nf_conntrack").unwrap_or_default();
    let needle = format!("{side}={address} ");
    table.lines().filter(|l| l.contains(&needle)).count()
}

/// The attack: a sandbox opens connections and is deleted with them open.
/// Their ends on the host are never closed, so the kernel tracks them as
/// established for days: enough such sandboxes would fill the host's
/// table, and the address's next holder would meet its connection bound
/// from the start. The server forgets an address's flows when it gives the
/// address back (and again before it hands it out).
#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_sandbox_leaves_no_tracked_flows_behind() {
    let _bounds = BOUNDS.lock().await;
    let h = server().await;
    let id = create(&h, OWNER, EgressPolicy::Open).await;
    let address = open_probe(&h, id).await;
    let hold = r#"
import subprocess, time
subprocess.Popen(["setsid", "python3", "-c", "import socket, time\nss = [socket.create_connection(('pypi.org', 443), timeout=10) for _ in range(3)]\ntime.sleep(600)"])
time.sleep(3)
"#;
    py(&h, OWNER, id, hold).await;
    assert!(tracked("src", address) >= 3, "the control: its connections are tracked");
    h.sb().delete(OWNER, id).await.unwrap();
    assert_eq!(tracked("src", address), 0, "flows of {address} left behind");
}

/// A server killed between removing a sandbox and forgetting its flows
/// leaves them on an address that is free at the next start, whose first
/// join no longer walks the kernel's table: the start forgets the flows of
/// every free address of its range in one walk. Planted here as a host
/// connection attempt to a free address (tracked for two minutes).
#[tokio::test(flavor = "multi_thread")]
async fn a_server_start_forgets_the_flows_left_on_its_free_addresses() {
    let mut h = server().await;
    // A sandbox keeps the server's network (and so its subnet) across the
    // restart; under `packages` it holds no address.
    let _kept = create(&h, OWNER, EgressPolicy::Packages).await;
    let network = format!("mcp-sandbox-{}", h.server_id);
    let ipam = common::docker(&[
        "network",
        "inspect",
        "-f",
        "{{range .IPAM.Config}}{{.Subnet}}{{end}}",
        &network,
    ]);
    let subnet: ipnet::Ipv4Net = ipam.trim().parse().unwrap();
    // In the server's half, the upper one, and held by no sandbox.
    let free = std::net::Ipv4Addr::from(u32::from(subnet.broadcast()) - 2);
    let _ = std::net::TcpStream::connect_timeout(&(free, 9).into(), Duration::from_millis(300));
    assert!(
        tracked("dst", free) >= 1,
        "the control: the attempt to {free} is tracked"
    );
    h.restart().await;
    let after = common::docker(&[
        "network",
        "inspect",
        "-f",
        "{{range .IPAM.Config}}{{.Subnet}}{{end}}",
        &network,
    ]);
    assert_eq!(after.trim(), ipam.trim(), "the same network");
    assert_eq!(
        tracked("dst", free),
        0,
        "flows of the free address {free} left at start"
    );
}
