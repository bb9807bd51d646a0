//! Forgetting the kernel's connection-tracking entries of IPv4 addresses
//! (one given back, or every free one of the server's range at its start),
//! over netfilter's netlink interface (as `conntrack -D -s A` and `-d A`
//! do, and as the engine does when it gives an address to a container).
//! The server hands a sandbox address out again once its holder is gone;
//! the flows the last holder left (an established TCP entry lives for days)
//! would count against the new holder's connection bound and deliver their
//! replies to it.
//!
//! The table is dumped (IPv4 entries), the entries with a chosen address
//! on either side of either direction collected, and each deleted by its
//! original tuple, copied as the kernel sent it.

use std::io;
use std::net::Ipv4Addr;

use super::netlink::{attributes, Netlink, NETLINK_NETFILTER, NLM_F_DUMP, NLM_F_REQUEST};

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_ZONE: u16 = 18;
const CTA_TUPLE_IP: u16 = 1;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const NFGENMSG: usize = 4;

/// Deletes every tracked IPv4 flow with an address that `doomed` picks as a
/// source or a destination, in one walk of the table (which costs the
/// kernel about the same whatever it picks: the walk visits every bucket);
/// returns how many were deleted.
pub fn forget_where(doomed: impl Fn(Ipv4Addr) -> bool) -> io::Result<usize> {
    let socket = Netlink::open(NETLINK_NETFILTER)?;
    let dump = socket.send(message(IPCTNL_MSG_CT_GET), NLM_F_REQUEST | NLM_F_DUMP, &body(&[]))?;
    let mut entries = Vec::new();
    socket.read_until_done(dump, |payload| {
        if let Some(entry) = matching(payload, &doomed) {
            entries.push(entry);
        }
    })?;
    let mut deleted = 0;
    for entry in &entries {
        // Gone meanwhile (it ended, or another deletion) is as good.
        match socket.request(message(IPCTNL_MSG_CT_DELETE), 0, &body(entry)) {
            Ok(()) => deleted += 1,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(deleted)
}

/// A conntrack message's type: the subsystem's, then its own.
fn message(kind: u16) -> u16 {
    (NFNL_SUBSYS_CTNETLINK << 8) | kind
}

/// A conntrack message's body: the nfgenmsg header (IPv4, version 0,
/// resource id 0), then `attributes`.
fn body(attributes: &[u8]) -> Vec<u8> {
    [&[libc::AF_INET as u8, 0, 0, 0][..], attributes].concat()
}

/// The attributes that name the entry of `payload` (its original tuple, and
/// its zone if any), when `doomed` picks an address of either tuple.
fn matching(payload: &[u8], doomed: &impl Fn(Ipv4Addr) -> bool) -> Option<Vec<u8>> {
    let mut named = Vec::new();
    let mut hit = false;
    let mut original = false;
    for (kind, whole, value) in attributes(payload.get(NFGENMSG..)?) {
        match kind {
            CTA_TUPLE_ORIG | CTA_TUPLE_REPLY => {
                hit |= tuple_has(value, doomed);
                if kind == CTA_TUPLE_ORIG {
                    original = true;
                    named.extend_from_slice(whole);
                }
            }
            CTA_ZONE => named.extend_from_slice(whole),
            _ => {}
        }
    }
    // Never without the original tuple: a deletion naming no tuple is the
    // kernel's flush of the whole table.
    (hit && original).then_some(named)
}

fn tuple_has(tuple: &[u8], doomed: &impl Fn(Ipv4Addr) -> bool) -> bool {
    attributes(tuple)
        .filter(|(kind, _, _)| *kind == CTA_TUPLE_IP)
        .flat_map(|(_, _, ip)| attributes(ip))
        .filter(|(kind, _, _)| matches!(*kind, CTA_IP_V4_SRC | CTA_IP_V4_DST))
        .filter_map(|(_, _, value)| <[u8; 4]>::try_from(value).ok())
        .any(|octets| doomed(Ipv4Addr::from(octets)))
}

#[cfg(test)]
mod tests {
    use super::super::netlink::attribute;
    use super::*;

    fn is(address: Ipv4Addr) -> impl Fn(Ipv4Addr) -> bool {
        move |a| a == address
    }

    fn tuple(kind: u16, src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
        let ip = [attribute(CTA_IP_V4_SRC, &src), attribute(CTA_IP_V4_DST, &dst)].concat();
        attribute(kind | 0x8000, &attribute(CTA_TUPLE_IP | 0x8000, &ip))
    }

    #[test]
    fn an_entry_is_named_by_its_original_tuple_and_zone_when_the_address_is_in_either() {
        let orig = tuple(CTA_TUPLE_ORIG, [172, 18, 128, 5], [203, 0, 113, 80]);
        let reply = tuple(CTA_TUPLE_REPLY, [203, 0, 113, 80], [192, 0, 2, 2]);
        let zone = attribute(CTA_ZONE, &[0, 0]);
        let payload = [
            vec![2, 0, 0, 0],
            orig.clone(),
            reply,
            zone.clone(),
            attribute(3, &[1, 2, 3, 4]),
        ]
        .concat();
        assert_eq!(
            matching(&payload, &is(Ipv4Addr::new(172, 18, 128, 5))),
            Some([orig.clone(), zone.clone()].concat())
        );
        assert!(
            matching(&payload, &is(Ipv4Addr::new(192, 0, 2, 2))).is_some(),
            "the reply's side"
        );
        assert_eq!(matching(&payload, &is(Ipv4Addr::new(172, 18, 128, 6))), None);
        // A sweep of a range picks the entry by any address in it.
        let range: ipnet::Ipv4Net = "172.18.128.0/17".parse().unwrap();
        assert_eq!(matching(&payload, &|a| range.contains(&a)), Some([orig, zone].concat()));
        let other: ipnet::Ipv4Net = "172.18.0.0/24".parse().unwrap();
        assert_eq!(matching(&payload, &|a| other.contains(&a)), None);
        // Malformed input ends the walk, it does not panic.
        assert_eq!(matching(&payload[..9], &is(Ipv4Addr::new(172, 18, 128, 5))), None);
        // An entry that shows no original tuple is never named: a deletion
        // without one would flush the whole table.
        let reply_only = [
            vec![2, 0, 0, 0],
            tuple(CTA_TUPLE_REPLY, [172, 18, 128, 5], [1, 1, 1, 1]),
        ]
        .concat();
        assert_eq!(matching(&reply_only, &is(Ipv4Addr::new(172, 18, 128, 5))), None);
    }
}
