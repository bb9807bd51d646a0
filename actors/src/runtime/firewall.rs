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
//! it are dropped, so TCP slows down to the rate), so a
//! sandbox cannot flood a third party from the host's address. Rules are tagged with the server id, so a server
//! replaces its own on start and touches no other rule. Applied with
//! `iptables` where the host allows it; where it does not, the server says
//! so and carries on.

use std::net::IpAddr;
use std::process::Command;

use ipnet::IpNet;

use crate::config::SandboxConfig;
use crate::egress_rules::{host_networks, name_servers, RuleError, Rules, PRIVATE_V4};

/// Link-local range holding the cloud metadata address 169.254.169.254.
const LINK_LOCAL: &str = "169.254.0.0/16";

fn tag(server_id: &str) -> String {
    format!("mcp-sandbox:{server_id}")
}

/// Why the host firewall rules could not be set or removed.
#[derive(Debug, thiserror::Error)]
pub enum FirewallError {
    #[error("iptables: {0}")]
    Run(#[source] std::io::Error),
    /// iptables ran and refused; `stderr` says why.
    #[error("iptables {args}: {stderr}")]
    Refused { args: String, stderr: String },
    #[error(transparent)]
    Rules(#[from] RuleError),
}

fn iptables(args: &[&str]) -> Result<String, FirewallError> {
    let out = Command::new("iptables")
        .arg("-w")
        .args(args)
        .output()
        .map_err(FirewallError::Run)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(FirewallError::Refused {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// What one sandbox may use of the network: `egress_max_connections` and
/// `egress_mb_per_minute`.
#[derive(Debug, Clone, Copy)]
struct Bounds {
    connections: usize,
    bytes_per_minute: u64,
}

/// New flows (connections, UDP exchanges) one `open` sandbox may start per
/// second, after a burst: each holds a conntrack entry for up to two
/// minutes once closed, and the host's table is shared by everyone.
const NEW_FLOWS_PER_SECOND: u32 = 20;
const NEW_FLOWS_BURST: u32 = 50;

/// The name of one of this server's kernel rate tables (bytes each way, new
/// flows). Short enough for the oldest table revision's 15 characters.
fn bucket(server_id: &str, direction: &str) -> String {
    let id: String = server_id.chars().filter(char::is_ascii_alphanumeric).take(12).collect();
    format!("m{id}{direction}")
}

/// The rules, in order, as (chain, arguments after the chain).
fn rules(server_id: &str, subnet: &str, listed: &[IpNet], bounds: Bounds) -> Vec<(&'static str, Vec<String>)> {
    let tag = tag(server_id);
    let rule = |chain: &'static str, mut r: Vec<String>, target: &[&str]| {
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
        r.push(bucket(server_id, direction));
        r
    };
    let connections = bounds.connections.to_string();
    let new_flows = format!("{NEW_FLOWS_PER_SECOND}/sec");
    let new_flows_burst = NEW_FLOWS_BURST.to_string();
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
    let new = ["-m", "conntrack", "--ctstate", "NEW"];
    let mut out = vec![
        rule("INPUT", from(&[]), &["DROP"]),
        rule("DOCKER-USER", from(&["-d", subnet]), &["DROP"]),
        rule(
            "DOCKER-USER",
            from(
                &[
                    &new[..],
                    &[
                        "-m",
                        "connlimit",
                        "--connlimit-above",
                        &connections,
                        "--connlimit-mask",
                        "32",
                    ],
                ]
                .concat(),
            ),
            &["REJECT"],
        ),
        rule(
            "DOCKER-USER",
            from(
                &[
                    &new[..],
                    &[
                        "-m",
                        "hashlimit",
                        "--hashlimit-above",
                        &new_flows,
                        "--hashlimit-burst",
                        &new_flows_burst,
                        "--hashlimit-mode",
                        "srcip",
                        "--hashlimit-name",
                        &bucket(server_id, "nw"),
                    ],
                ]
                .concat(),
            ),
            &["REJECT"],
        ),
        rule("DOCKER-USER", bytes(&["-s", subnet], "srcip", "up"), &["DROP"]),
        rule(
            "DOCKER-USER",
            bytes(
                &["-d", subnet, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED"],
                "dstip",
                "dn",
            ),
            &["DROP"],
        ),
        rule("DOCKER-USER", from(&["-d", LINK_LOCAL]), &["DROP"]),
    ];
    let closed: Vec<IpNet> = PRIVATE_V4
        .iter()
        .map(|n| n.parse().expect("valid range"))
        .chain(
            host_networks()
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
                    "DOCKER-USER",
                    from(&["-d", &dest, "-p", proto, "--dport", "53"]),
                    &["RETURN"],
                ));
            }
        }
    }
    for net in listed.iter().filter(|n| n.addr().is_ipv4()) {
        out.push(rule("DOCKER-USER", from(&["-d", &net.to_string()]), &["RETURN"]));
    }
    for net in closed {
        out.push(rule("DOCKER-USER", from(&["-d", &net.to_string()]), &["DROP"]));
    }
    out
}

/// Removes every rule this server added.
pub fn remove(server_id: &str) -> Result<(), FirewallError> {
    let tag = tag(server_id);
    for chain in ["INPUT", "DOCKER-USER"] {
        let listing = iptables(&["-S", chain])?;
        for line in listing.lines().filter(|l| l.contains(&tag)) {
            let Some(spec) = line.strip_prefix(&format!("-A {chain} ")) else {
                continue;
            };
            let parts = split_rule(spec);
            let mut args: Vec<&str> = vec!["-D", chain];
            args.extend(parts.iter().map(String::as_str));
            iptables(&args)?;
        }
    }
    Ok(())
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

/// Replaces this server's rules with fresh ones for `subnet`, from the
/// sandbox settings: `egress_allow`, whose CIDRs stay reachable, and the
/// egress bounds.
pub fn apply(server_id: &str, subnet: &str, config: &SandboxConfig) -> Result<(), FirewallError> {
    let listed: Vec<IpNet> = Rules::parse(&config.egress_allow)?.nets().copied().collect();
    let bounds = Bounds {
        connections: config.egress_max_connections,
        bytes_per_minute: config.egress_mb_per_minute.saturating_mul(1024 * 1024),
    };
    let bridged = std::fs::read_to_string("/proc/sys/net/bridge/bridge-nf-call-iptables").unwrap_or_default();
    if bridged.trim() != "1" {
        tracing::warn!("net.bridge.bridge-nf-call-iptables is not 1: traffic between two sandboxes of one bridge bypasses iptables, and only the engine's inter-container option keeps them apart");
    }
    remove(server_id)?;
    // Each rule is inserted first, so they go in last to first.
    for (chain, rule) in rules(server_id, subnet, &listed, bounds).into_iter().rev() {
        let mut args = vec!["-I", chain, "1"];
        args.extend(rule.iter().map(String::as_str));
        iptables(&args)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_are_tagged_and_split_back_whole() {
        let listed = vec!["10.1.0.0/16".parse().unwrap()];
        let bounds = Bounds {
            connections: 6,
            bytes_per_minute: 60 * 1024 * 1024,
        };
        let r = rules("abc", "172.30.0.0/16", &listed, bounds);
        assert!(r.iter().all(|(_, args)| args.contains(&"mcp-sandbox:abc".to_string())));
        let has = |i: usize, words: &[&str]| words.iter().all(|w| r[i].1.contains(&w.to_string()));
        assert_eq!((r[0].0, r[1].0), ("INPUT", "DOCKER-USER"));
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
            has(3, &["NEW", "20/sec", "50", "mabcnw", "REJECT"]),
            "new flows per second"
        );
        assert!(has(4, &["-s", "--hashlimit-above", "1048576b/s", "srcip", "mabcup"]));
        assert!(
            has(5, &["-d", "ESTABLISHED,RELATED", "dstip", "mabcdn"]),
            "replies are bounded too"
        );
        assert!(bucket("0123456789abcdef", "nw").len() <= 15);
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
}
