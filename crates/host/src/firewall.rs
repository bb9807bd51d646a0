//! Host firewall rules for the server's bridge network (`open` sandboxes and
//! installer containers): nothing from its subnet reaches the host itself,
//! another container of the subnet (whether or not the engine's
//! inter-container option holds: with `br_netfilter`, traffic between two
//! ports of one bridge passes `FORWARD` too), link-local addresses (where
//! cloud metadata services live), private ranges or the networks the host
//! sits on, except the host's name servers on port 53 and CIDRs listed in
//! `sandbox.egress_allow`. What such a sandbox may reach is bounded too, as
//! the egress proxy bounds proxied ones: at most `egress_max_connections`
//! flows of any protocol at once per sandbox address (conntrack's count, so
//! closed ones free their slot), a bounded number of new flows a second,
//! and `egress_mb_per_minute` per sandbox in each
//! direction (a kernel token bucket refilled at that rate; packets beyond
//! it are dropped, so TCP slows down to the rate; the bucket holds one
//! second of the rate and charges a larger packet as one second, which is
//! why the rate may not be lower than the largest packet, 64 KiB, a
//! second), so a
//! sandbox cannot flood a third party from the host's address. Rules are tagged with the server id and a
//! generation, so a server replaces its own on start (the new generation
//! above the old, then the old removed) and touches no other rule. Applied
//! with `iptables` where the host allows it; where the host has no firewall
//! for this process (no iptables, not root), the server says so and carries
//! on; where it has one that refuses a rule, the server does not start.

use std::net::IpAddr;
use std::process::Command;
use std::time::Duration;

use ipnet::IpNet;

use crate::addresses::{name_servers, PRIVATE_V4};
use crate::syscalls::Syscalls;

/// Link-local range holding the cloud metadata address 169.254.169.254.
const LINK_LOCAL: &str = "169.254.0.0/16";

/// The comment on this server's rules of one generation. Each application
/// of the rules is a new generation (`a`, then `b`, then `a`…), so that the
/// old rules, removed once the new ones are in, never match a new one.
fn tag(server_id: &str, generation: char) -> String {
    format!("mcp-sandbox:{server_id}:{generation}")
}

/// Whether an `iptables -S` line is one of this server's rules (of any
/// generation, or of versions that tagged without one).
fn is_ours(line: &str, server_id: &str) -> bool {
    let tag = format!("mcp-sandbox:{server_id}");
    line.match_indices(&tag)
        .any(|(at, _)| matches!(line[at + tag.len()..].chars().next(), None | Some(':' | ' ' | '"')))
}

/// The generation after the one `old` rules carry.
fn next_generation(old: &[(Chain, Vec<String>)], server_id: &str) -> char {
    let a = tag(server_id, 'a');
    match old.iter().any(|(_, rule)| rule.contains(&a)) {
        true => 'b',
        false => 'a',
    }
}

/// Why the host firewall rules could not be set or removed.
#[derive(Debug, thiserror::Error)]
pub enum FirewallError {
    #[error("iptables: {0}")]
    Run(#[source] std::io::Error),
    /// iptables ran and refused; `stderr` says why.
    #[error("iptables {args}: {stderr}")]
    Refused { args: String, stderr: String },
}

impl FirewallError {
    /// Whether the host offers no firewall to this process at all (no
    /// iptables, not root, no kernel tables), as on a development machine,
    /// rather than refusing a rule it could have taken.
    pub fn unavailable(&self) -> bool {
        match self {
            FirewallError::Run(_) => true,
            FirewallError::Refused { stderr, .. } => ["Permission denied", "must be root", "can't initialize"]
                .iter()
                .any(|s| stderr.contains(s)),
        }
    }
}

/// Attempts at one iptables command: another program changing the tables
/// at the same moment (the engine, another server) can make one fail.
const ATTEMPTS: u32 = 5;

fn iptables(host: &dyn Syscalls, args: &[&str]) -> Result<String, FirewallError> {
    let mut attempt = 1;
    loop {
        let out = host.iptables(args).map_err(FirewallError::Run)?;
        if out.success {
            return Ok(out.stdout);
        }
        let refused = FirewallError::Refused {
            args: args.join(" "),
            stderr: out.stderr,
        };
        if attempt == ATTEMPTS || refused.unavailable() {
            return Err(refused);
        }
        std::thread::sleep(Duration::from_millis(50 << attempt));
        attempt += 1;
    }
}

/// What one sandbox may use of the network (`sandbox.egress_max_connections`
/// and `sandbox.egress_mb_per_minute`).
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Flows of any protocol at once.
    pub connections: usize,
    /// Bytes a minute in each direction.
    pub bytes_per_minute: u64,
}

/// New flows (connections, UDP exchanges) one `open` sandbox may start per
/// second, after a burst: each holds a conntrack entry for up to two
/// minutes once closed, and the host's table is shared by everyone.
const NEW_FLOWS_PER_SECOND: u32 = 20;
const NEW_FLOWS_BURST: u32 = 50;

/// The name of one of this server's kernel rate tables (bytes each way, new
/// flows) in one generation. Short enough for the oldest table revision's
/// 15 characters. A generation has tables of its own: the kernel gives a
/// new rule the table already bearing its name, with that table's rate,
/// so a changed rate would not take effect while an old rule still held it.
fn bucket(server_id: &str, generation: char, direction: &str) -> String {
    let id: String = server_id.chars().filter(char::is_ascii_alphanumeric).take(11).collect();
    format!("m{id}{generation}{direction}")
}

/// A chain: its table and name.
type Chain = (&'static str, &'static str);

const INPUT: Chain = ("filter", "INPUT");
const DOCKER_USER: Chain = ("filter", "DOCKER-USER");
/// Where the rules on where a sandbox may go are kept a second time. The
/// engine moves its jump to `DOCKER-USER` (deletes it, inserts it again at
/// the top of `FORWARD`) whenever a network is made or removed, and a
/// connection begun in that moment passes none of `DOCKER-USER`'s rules:
/// under network churn a sandbox reached the metadata address hundreds of
/// times a minute. The engine never touches `raw`'s `PREROUTING`, which
/// every packet from the subnet crosses first. (Its bounds need conntrack,
/// which `raw` runs before; they stay in `DOCKER-USER` alone.)
const RAW: Chain = ("raw", "PREROUTING");
/// Where the bounds are kept a second time, for the same reason: the
/// engine never touches `mangle`'s `FORWARD`, which runs after conntrack
/// (so the replies of established flows are told apart) and before
/// `DOCKER-USER`. Bytes past a bound are dropped there as in `DOCKER-USER`,
/// so a moment without `DOCKER-USER` lets no more through. The flow bounds
/// answer with `REJECT`, which only the filter table has: `mangle` holds
/// them at [`BACKSTOP`] times their rate and count, dropping, so that in
/// that moment a sandbox gets no further than that, and otherwise the
/// filter table's refusal comes first.
const MANGLE: Chain = ("mangle", "FORWARD");
const CHAINS: [Chain; 4] = [INPUT, DOCKER_USER, RAW, MANGLE];
/// The chains a host may lack (a kernel without the table): the rules go
/// on without their second copy there.
const OPTIONAL: [Chain; 2] = [RAW, MANGLE];
/// How far past its flow bounds `mangle` lets a sandbox go.
const BACKSTOP: u32 = 2;

/// The rules, in order, as (chain, arguments after the chain);
/// `host_networks`: the host's own (see [`Syscalls::host_networks`]).
fn rules(
    host_networks: Vec<IpNet>,
    server_id: &str,
    generation: char,
    subnet: &str,
    listed: &[IpNet],
    bounds: Bounds,
) -> Vec<(Chain, Vec<String>)> {
    let tag = tag(server_id, generation);
    let rule = |chain: Chain, mut r: Vec<String>, target: &[&str]| {
        r.extend(["-m", "comment", "--comment", &tag, "-j"].map(String::from));
        r.extend(target.iter().map(|s| s.to_string()));
        (chain, r)
    };
    let from = |extra: &[&str]| {
        let mut r = vec!["-s".to_string(), subnet.to_string()];
        r.extend(extra.iter().map(|s| s.to_string()));
        r
    };
    // Bytes per second, the kernel's unit, within what its table holds
    // (beyond, the rate wraps around). The kernel's own burst stays: in
    // byte mode it is not a byte count (a fresh entry starts with about a
    // MiB whatever is asked), so the bound promised is the sustained rate.
    let rate = format!("{}b/s", (bounds.bytes_per_minute / 60).clamp(1, 1_000_000_000));
    let bytes = |matches: &[&str], mode: &str, direction: &str| {
        let mut r: Vec<String> = matches.iter().map(|s| s.to_string()).collect();
        r.extend(
            [
                "-m",
                "hashlimit",
                "--hashlimit-above",
                &rate,
                "--hashlimit-mode",
                mode,
                "--hashlimit-name",
            ]
            .map(String::from),
        );
        r.push(bucket(server_id, generation, direction));
        r
    };
    // New flows past `most` at once, or past `per_second` (after a burst
    // of `burst`) in the table `name`; `before`: matches that come first.
    let new = ["-m", "conntrack", "--ctstate", "NEW"];
    let too_many = |before: &[&str], most: u64| {
        let most = most.to_string();
        let tail = ["-m", "connlimit", "--connlimit-above", &most, "--connlimit-mask", "32"];
        from(&[before, &new[..], &tail[..]].concat())
    };
    let too_fast = |before: &[&str], per_second: u32, burst: u32, name: &str| {
        let (rate, burst) = (format!("{per_second}/sec"), burst.to_string());
        let tail = [
            "-m",
            "hashlimit",
            "--hashlimit-above",
            &rate,
            "--hashlimit-burst",
            &burst,
            "--hashlimit-mode",
            "srcip",
            "--hashlimit-name",
            &bucket(server_id, generation, name),
        ];
        from(&[before, &new[..], &tail[..]].concat())
    };
    let connections = bounds.connections as u64;
    // INPUT: anything addressed to the host itself, whichever of its
    // addresses. DOCKER-USER (forwarded traffic, replies included), first
    // match wins: other sandboxes first, so that no sandbox can spend
    // another's budget by sending to it; then the bounds, so they count
    // every packet that may pass (new flows of any protocol — a UDP flow
    // holds a conntrack entry as a connection does —, bytes out, and bytes
    // back on established flows); then link-local always dropped; the host's
    // name servers (the engine's resolver forwards from the sandbox) and
    // listed CIDRs handed back to Docker's own rules; private ranges and
    // on-link networks dropped.
    let mut out = vec![
        rule(INPUT, from(&[]), &["DROP"]),
        rule(DOCKER_USER, from(&["-d", subnet]), &["DROP"]),
        rule(DOCKER_USER, too_many(&[], connections), &["REJECT"]),
        rule(
            DOCKER_USER,
            too_fast(&[], NEW_FLOWS_PER_SECOND, NEW_FLOWS_BURST, "nw"),
            &["REJECT"],
        ),
        rule(DOCKER_USER, bytes(&["-s", subnet], "srcip", "up"), &["DROP"]),
        rule(
            DOCKER_USER,
            bytes(
                &["-d", subnet, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED"],
                "dstip",
                "dn",
            ),
            &["DROP"],
        ),
        rule(DOCKER_USER, from(&["-d", LINK_LOCAL]), &["DROP"]),
    ];
    let closed: Vec<IpNet> = PRIVATE_V4
        .iter()
        .map(|n| n.parse().expect("valid range"))
        .chain(
            host_networks
                .into_iter()
                .filter(|n| n.addr().is_ipv4() && n.prefix_len() < 32),
        )
        .filter(|n| !n.addr().is_loopback())
        .collect();
    for ns in name_servers()
        .into_iter()
        .filter(|ns| closed.iter().any(|n| n.contains(ns)))
    {
        if let IpAddr::V4(ns) = ns {
            let dest = format!("{ns}/32");
            for proto in ["udp", "tcp"] {
                out.push(rule(
                    DOCKER_USER,
                    from(&["-d", &dest, "-p", proto, "--dport", "53"]),
                    &["RETURN"],
                ));
            }
        }
    }
    for net in listed.iter().filter(|n| n.addr().is_ipv4()) {
        out.push(rule(DOCKER_USER, from(&["-d", &net.to_string()]), &["RETURN"]));
    }
    for net in closed {
        out.push(rule(DOCKER_USER, from(&["-d", &net.to_string()]), &["DROP"]));
    }
    let bound = |r: &[String]| r.iter().any(|a| a == "connlimit" || a == "hashlimit");
    let mirrored: Vec<_> = out
        .iter()
        .filter(|(chain, r)| *chain == DOCKER_USER && !bound(r))
        .map(|(_, r)| (RAW, r.clone()))
        .collect();
    out.extend(mirrored);
    // The bounds in mangle, with tables of their own; traffic between two
    // sandboxes (dropped in DOCKER-USER) spends no budget there either.
    let others = ["!", "-d", subnet];
    out.push(rule(
        MANGLE,
        too_many(&others, connections * BACKSTOP as u64),
        &["DROP"],
    ));
    out.push(rule(
        MANGLE,
        too_fast(
            &others,
            NEW_FLOWS_PER_SECOND * BACKSTOP,
            NEW_FLOWS_BURST * BACKSTOP,
            "mn",
        ),
        &["DROP"],
    ));
    out.push(rule(
        MANGLE,
        bytes(&["-s", subnet, "!", "-d", subnet], "srcip", "mu"),
        &["DROP"],
    ));
    out.push(rule(
        MANGLE,
        bytes(
            &["-d", subnet, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED"],
            "dstip",
            "md",
        ),
        &["DROP"],
    ));
    out
}

/// `iptables -t TABLE VERB CHAIN` and the rest.
fn on(host: &dyn Syscalls, chain: Chain, verb: &str, rest: &[&str]) -> Result<String, FirewallError> {
    let mut args = vec!["-t", chain.0, verb, chain.1];
    args.extend(rest);
    iptables(host, &args)
}

/// The chains this host offers: all of [`CHAINS`], or, on a kernel without
/// the `raw` or `mangle` table, the others (with a warning: the rules kept
/// there then depend on `DOCKER-USER` alone). An error when the filter
/// table itself is refused.
fn chains(host: &dyn Syscalls) -> Result<Vec<Chain>, FirewallError> {
    on(host, DOCKER_USER, "-S", &[])?;
    let mut missing = vec![];
    for chain in OPTIONAL {
        if let Err(e) = on(host, chain, "-S", &[]) {
            tracing::warn!(error = %e, table = chain.0, "a table is missing: sandboxes' rules there live in DOCKER-USER alone, which the engine skips for a moment whenever a network is made or removed");
            missing.push(chain);
        }
    }
    Ok(CHAINS.into_iter().filter(|c| !missing.contains(c)).collect())
}

/// This server's rules in place in `chains`, as (chain, arguments after
/// the chain).
fn tagged(host: &dyn Syscalls, server_id: &str, chains: &[Chain]) -> Result<Vec<(Chain, Vec<String>)>, FirewallError> {
    let mut out = vec![];
    for &chain in chains {
        let listing = on(host, chain, "-S", &[])?;
        let prefix = format!("-A {} ", chain.1);
        for line in listing.lines().filter(|l| is_ours(l, server_id)) {
            if let Some(spec) = line.strip_prefix(&prefix) {
                out.push((chain, split_rule(spec)));
            }
        }
    }
    Ok(out)
}

/// Deletes the first rule of `chain` with these arguments.
fn delete(host: &dyn Syscalls, chain: Chain, rule: &[String]) -> Result<(), FirewallError> {
    let rule: Vec<&str> = rule.iter().map(String::as_str).collect();
    on(host, chain, "-D", &rule).map(drop)
}

/// Removes every rule this server added.
pub fn remove(host: &dyn Syscalls, server_id: &str) -> Result<(), FirewallError> {
    for (chain, rule) in tagged(host, server_id, &chains(host)?)? {
        delete(host, chain, &rule)?;
    }
    Ok(())
}

/// The largest packet, in bytes, that receive or send offloads may hand the
/// rules on any of the host's links (`gro_max_size`, `gso_max_size` and
/// their IPv4 variants of `ip -d link`): 64 KiB unless BIG TCP raised it.
fn largest_offload() -> u64 {
    const KEYS: [&str; 4] = ["gro_max_size", "gso_max_size", "gro_ipv4_max_size", "gso_ipv4_max_size"];
    let out = Command::new("ip").args(["-d", "-o", "link", "show"]).output();
    let text = out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let words: Vec<&str> = text.split_whitespace().collect();
    words
        .windows(2)
        .filter(|w| KEYS.contains(&w[0]))
        .filter_map(|w| w[1].parse().ok())
        .fold(64 * 1024, u64::max)
}

/// Splits an `iptables -S` rule, keeping quoted comments whole.
fn split_rule(spec: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    for c in spec.chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !current.is_empty() {
                    out.push(std::mem::take(&mut current));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// Replaces this server's rules with fresh ones for `subnet`: the CIDRs of
/// `listed` (the allow-list's) stay reachable, and every sandbox address is
/// held to `bounds`. Blocks (iptables runs, and retries): call it off the
/// async threads.
pub fn apply(
    host: &dyn Syscalls,
    server_id: &str,
    subnet: &str,
    listed: &[IpNet],
    bounds: Bounds,
) -> Result<(), FirewallError> {
    let bridged = std::fs::read_to_string("/proc/sys/net/bridge/bridge-nf-call-iptables").unwrap_or_default();
    if bridged.trim() != "1" {
        tracing::warn!("net.bridge.bridge-nf-call-iptables is not 1: traffic between two sandboxes of one bridge bypasses iptables, and only the engine's inter-container option keeps them apart");
    }
    let largest = largest_offload();
    if bounds.bytes_per_minute / 60 < largest {
        tracing::warn!(
            largest,
            "a link of the host aggregates packets of up to {largest} bytes (BIG TCP): the byte-rate rule charges a packet larger than one second of egress_mb_per_minute as one second, so the cap holds only from {} MiB a minute",
            (largest * 60).div_ceil(1024 * 1024)
        );
    }
    // The new generation goes in above the old one, which is removed only
    // then: running sandboxes (adopted at a restart) are never without
    // rules, and the new ones keep their order at the top (a rule deleted by
    // its arguments is the first that has them, and the old generation's
    // comment differs from the new one's).
    let chains = chains(host)?;
    let old = tagged(host, server_id, &chains)?;
    let generation = next_generation(&old, server_id);
    let new = rules(host.host_networks(), server_id, generation, subnet, listed, bounds);
    // Each rule is inserted first, so they go in last to first.
    for (chain, rule) in new.into_iter().rev().filter(|(c, _)| chains.contains(c)) {
        let mut args = vec!["1"];
        args.extend(rule.iter().map(String::as_str));
        on(host, chain, "-I", &args)?;
    }
    for (chain, rule) in old {
        delete(host, chain, &rule)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::Recorder;

    const SUBNET: &str = "172.30.0.0/16";
    const BOUNDS: Bounds = Bounds {
        connections: 6,
        bytes_per_minute: 60 * 1024 * 1024,
    };

    /// The comments of the rules of `chain` that have one.
    fn comments(host: &Recorder, chain: Chain) -> Vec<String> {
        host.rules(chain.0, chain.1)
            .iter()
            .filter_map(|r| {
                let at = r.iter().position(|w| w == "--comment")?;
                r.get(at + 1).cloned()
            })
            .collect()
    }

    #[test]
    fn a_new_generation_goes_in_above_the_old_which_then_goes_and_others_rules_stay() {
        let host = Recorder::new();
        let foreign = [
            "-s",
            "10.9.0.0/16",
            "-m",
            "comment",
            "--comment",
            "mcp-sandbox:other:a",
            "-j",
            "DROP",
        ];
        host.append_rule("filter", "DOCKER-USER", &foreign);
        host.append_rule("filter", "DOCKER-USER", &["-j", "RETURN"]);
        let listed: Vec<IpNet> = vec!["10.1.0.0/16".parse().unwrap()];
        apply(&host, "abc", SUBNET, &listed, BOUNDS).unwrap();
        // Ours first, in the order the rules are made.
        let made = rules(host.host_networks(), "abc", 'a', SUBNET, &listed, BOUNDS);
        for chain in CHAINS {
            let ours: Vec<Vec<String>> = made
                .iter()
                .filter(|(c, _)| *c == chain)
                .map(|(_, r)| r.clone())
                .collect();
            assert!(!ours.is_empty(), "{chain:?}");
            assert_eq!(
                host.rules(chain.0, chain.1)[..ours.len()],
                ours[..],
                "{chain:?}: ours first, in order"
            );
        }
        let top = host.rules(DOCKER_USER.0, DOCKER_USER.1);
        assert!(
            top[0].join(" ").contains("-s 172.30.0.0/16 -d 172.30.0.0/16"),
            "sandbox to sandbox first"
        );
        assert!(top[1].join(" ").contains("--connlimit-above 6"), "then the flow cap");
        let user = host.rules(DOCKER_USER.0, DOCKER_USER.1);
        assert_eq!(
            user[user.len() - 2..],
            [foreign.map(String::from).to_vec(), vec!["-j".into(), "RETURN".into()]]
        );

        // Again (a restart): generation b in, a out, the foreign rules kept.
        apply(&host, "abc", SUBNET, &listed, BOUNDS).unwrap();
        let ours = comments(&host, DOCKER_USER);
        assert!(ours
            .iter()
            .filter(|c| c.starts_with("mcp-sandbox:abc"))
            .all(|c| c == "mcp-sandbox:abc:b"));
        assert_eq!(host.rules(DOCKER_USER.0, DOCKER_USER.1).len(), user.len());
        assert!(comments(&host, RAW).iter().all(|c| c == "mcp-sandbox:abc:b"));
        // The old generation was deleted only after the new one was in.
        let calls: Vec<String> = host
            .calls()
            .iter()
            .filter_map(|c| match c {
                crate::recording::Call::Iptables(args) => Some(args.join(" ")),
                _ => None,
            })
            .collect();
        let last_insert = calls.iter().rposition(|c| c.contains(" -I ")).unwrap();
        let first_delete = calls.iter().position(|c| c.contains(" -D ")).unwrap();
        assert!(last_insert < first_delete);

        remove(&host, "abc").unwrap();
        assert_eq!(
            host.rules(DOCKER_USER.0, DOCKER_USER.1).len(),
            2,
            "only the others' rules stay"
        );
        assert!(host.rules(INPUT.0, INPUT.1).is_empty() && host.rules(RAW.0, RAW.1).is_empty());
    }

    #[test]
    fn without_a_raw_table_the_rules_live_in_the_filter_table_alone() {
        let host = Recorder::new();
        host.without_raw_table();
        apply(&host, "abc", SUBNET, &[], BOUNDS).unwrap();
        assert!(!host.rules(DOCKER_USER.0, DOCKER_USER.1).is_empty());
        assert!(host.rules(RAW.0, RAW.1).is_empty());
        remove(&host, "abc").unwrap();
        assert!(host.rules(DOCKER_USER.0, DOCKER_USER.1).is_empty());
    }

    #[test]
    fn a_refused_rule_is_tried_again_then_reported_and_no_firewall_is_told_apart() {
        let host = Recorder::new();
        host.fail("iptables", "-I DOCKER-USER");
        let err = apply(&host, "abc", SUBNET, &[], BOUNDS).unwrap_err();
        assert!(!err.unavailable(), "a host with a firewall that refuses a rule: {err}");
        let tries = host
            .calls()
            .iter()
            .filter(|c| matches!(c, crate::recording::Call::Iptables(a) if a.join(" ").contains("-I DOCKER-USER")))
            .count();
        assert_eq!(tries, ATTEMPTS as usize);
        let none = FirewallError::Refused {
            args: "-S".into(),
            stderr: "iptables v1.8.9: can't initialize iptables table `filter': Permission denied (you must be root)"
                .into(),
        };
        assert!(none.unavailable());
    }

    #[test]
    fn rules_are_tagged_and_split_back_whole() {
        let listed = vec!["10.1.0.0/16".parse().unwrap()];
        let bounds = Bounds {
            connections: 6,
            bytes_per_minute: 60 * 1024 * 1024,
        };
        let r = rules(
            Recorder::new().host_networks(),
            "abc",
            'b',
            "172.30.0.0/16",
            &listed,
            bounds,
        );
        assert!(r
            .iter()
            .all(|(_, args)| args.contains(&"mcp-sandbox:abc:b".to_string())));
        let has = |i: usize, words: &[&str]| words.iter().all(|w| r[i].1.contains(&w.to_string()));
        assert_eq!((r[0].0, r[1].0), (INPUT, DOCKER_USER));
        let raw: Vec<&Vec<String>> = r.iter().filter(|(c, _)| *c == RAW).map(|(_, a)| a).collect();
        let filtered: Vec<&Vec<String>> = r
            .iter()
            .filter(|(c, a)| *c == DOCKER_USER && !a.iter().any(|w| w.ends_with("limit")))
            .map(|(_, a)| a)
            .collect();
        assert_eq!(
            raw, filtered,
            "where a sandbox may go is kept in raw too, in order, bounds aside"
        );
        assert!(
            has(1, &["-s", "-d", "172.30.0.0/16", "DROP"]),
            "sandbox to sandbox first"
        );
        assert!(
            has(2, &["NEW", "--connlimit-above", "6", "REJECT"]),
            "then the flow cap, any protocol"
        );
        assert!(!r[2].1.contains(&"tcp".to_string()));
        assert!(
            has(3, &["NEW", "20/sec", "50", "mabcbnw", "REJECT"]),
            "new flows per second"
        );
        assert!(has(4, &["-s", "--hashlimit-above", "1048576b/s", "srcip", "mabcbup"]));
        assert!(
            has(5, &["-d", "ESTABLISHED,RELATED", "dstip", "mabcbdn"]),
            "replies are bounded too"
        );
        assert!(bucket("0123456789abcdef", 'a', "nw").len() <= 15);
        let returned = r
            .iter()
            .position(|(_, a)| a.contains(&"10.1.0.0/16".to_string()))
            .unwrap();
        let dropped = r
            .iter()
            .position(|(_, a)| a.contains(&"10.0.0.0/8".to_string()))
            .unwrap();
        assert!(
            returned < dropped,
            "a listed CIDR is handed back before its range is dropped"
        );
        assert_eq!(
            split_rule("-s 1.2.3.4/32 -m comment --comment \"a b\" -j DROP")[5],
            "a b"
        );
    }

    #[test]
    fn generations_alternate_and_rules_are_told_apart_by_server() {
        let line = |comment: &str| format!("-A DOCKER-USER -s 10.0.0.0/8 -m comment --comment \"{comment}\" -j DROP");
        assert!(is_ours(&line("mcp-sandbox:abc:a"), "abc"));
        assert!(is_ours(&line("mcp-sandbox:abc"), "abc"), "rules of earlier versions");
        assert!(!is_ours(&line("mcp-sandbox:abcd:a"), "abc"), "another server's");
        assert!(!is_ours(&line("mcp-sandbox:ab:a"), "abc"));
        let rule = |comment: &str| (DOCKER_USER, split_rule(&line(comment)[14..]));
        assert_eq!(next_generation(&[], "abc"), 'a');
        assert_eq!(next_generation(&[rule("mcp-sandbox:abc:a")], "abc"), 'b');
        assert_eq!(next_generation(&[rule("mcp-sandbox:abc:b")], "abc"), 'a');
        assert_ne!(bucket("abc", 'a', "up"), bucket("abc", 'b', "up"));
    }
}
