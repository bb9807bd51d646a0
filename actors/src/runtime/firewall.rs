//! Host firewall rules that keep bridged sandboxes away from the host's own
//! services and from link-local addresses (where cloud metadata services
//! live). Rules are tagged with the server id, so a server replaces its own
//! on start and touches no other rule. Applied with `iptables` where the host
//! allows it; where it does not, the server says so and carries on.

use std::process::Command;

/// Link-local range holding the cloud metadata address 169.254.169.254.
const LINK_LOCAL: &str = "169.254.0.0/16";

fn tag(server_id: &str) -> String {
    format!("mcp-sandbox:{server_id}")
}

fn iptables(args: &[&str]) -> Result<String, String> {
    let out = Command::new("iptables")
        .arg("-w")
        .args(args)
        .output()
        .map_err(|e| format!("iptables: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "iptables {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The rules (as `iptables -S` prints them, without `-A`) for `subnet`.
fn rules(server_id: &str, subnet: &str) -> Vec<(&'static str, Vec<String>)> {
    let tag = tag(server_id);
    let rule = |chain: &'static str, extra: &[&str]| {
        let mut r: Vec<String> = vec!["-s".into(), subnet.into()];
        r.extend(extra.iter().map(|s| s.to_string()));
        r.extend(["-m", "comment", "--comment", &tag, "-j", "DROP"].map(String::from));
        (chain, r)
    };
    // INPUT: anything addressed to the host itself, whichever of its
    // addresses. DOCKER-USER: forwarded traffic to link-local addresses.
    vec![rule("INPUT", &[]), rule("DOCKER-USER", &["-d", LINK_LOCAL])]
}

/// Removes every rule this server added.
pub fn remove(server_id: &str) -> Result<(), String> {
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

/// Replaces this server's rules with fresh ones for `subnet`.
pub fn apply(server_id: &str, subnet: &str) -> Result<(), String> {
    remove(server_id)?;
    for (chain, rule) in rules(server_id, subnet) {
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
        let r = rules("abc", "172.30.0.0/16");
        assert_eq!(r.len(), 2);
        assert!(r.iter().all(|(_, args)| args.contains(&"mcp-sandbox:abc".to_string())));
        assert_eq!(
            split_rule("-s 1.2.3.4/32 -m comment --comment \"a b\" -j DROP")[5],
            "a b"
        );
    }
}
