//! Forgetting the kernel's connection-tracking entries of one IPv4 address,
//! over netfilter's netlink interface (as `conntrack -D -s A` and `-d A`
//! do, and as the engine does when it gives an address to a container).
//! The server hands a sandbox address out again once its holder is gone;
//! the flows the last holder left (an established TCP entry lives for days)
//! would count against the new holder's connection bound and deliver their
//! replies to it.
//!
//! The table is dumped (IPv4 entries), the entries with the address on
//! either side of either direction collected, and each deleted by its
//! original tuple, copied as the kernel sent it.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

const NETLINK_NETFILTER: libc::c_int = 12;
const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_ZONE: u16 = 18;
const CTA_TUPLE_IP: u16 = 1;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
/// Attribute type bits that are flags (nested, byte order), not the type.
const NLA_TYPE_MASK: u16 = 0x3fff;
const HEADER: usize = 16;
const NFGENMSG: usize = 4;
/// How long the kernel may take to answer one read.
const READ_DEADLINE: Duration = Duration::from_secs(5);

/// Deletes every tracked IPv4 flow with `address` as a source or a
/// destination; returns how many were deleted.
pub fn forget(address: Ipv4Addr) -> io::Result<usize> {
    let socket = Netlink::open()?;
    socket.send(IPCTNL_MSG_CT_GET, NLM_F_REQUEST | NLM_F_DUMP, &[])?;
    let mut doomed = Vec::new();
    socket.read_until_done(|payload| {
        if let Some(entry) = matching(payload, address) {
            doomed.push(entry);
        }
    })?;
    let mut deleted = 0;
    for attributes in &doomed {
        socket.send(IPCTNL_MSG_CT_DELETE, NLM_F_REQUEST | NLM_F_ACK, attributes)?;
        // Gone meanwhile (it ended, or another deletion) is as good.
        match socket.read_ack() {
            Ok(()) => deleted += 1,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(deleted)
}

/// [`forget`] on a blocking thread, for async callers (a netlink read
/// blocks for up to [`READ_DEADLINE`]).
pub async fn forget_off_thread(address: Ipv4Addr) -> io::Result<usize> {
    tokio::task::spawn_blocking(move || forget(address))
        .await
        .unwrap_or_else(|e| Err(io::Error::other(e)))
}

/// The attributes that name the entry of `payload` (its original tuple, and
/// its zone if any), when it has `address` in either tuple.
fn matching(payload: &[u8], address: Ipv4Addr) -> Option<Vec<u8>> {
    let mut named = Vec::new();
    let mut hit = false;
    let mut original = false;
    for (kind, whole, value) in attributes(payload.get(NFGENMSG..)?) {
        match kind {
            CTA_TUPLE_ORIG | CTA_TUPLE_REPLY => {
                hit |= tuple_has(value, address);
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

fn tuple_has(tuple: &[u8], address: Ipv4Addr) -> bool {
    attributes(tuple)
        .filter(|(kind, _, _)| *kind == CTA_TUPLE_IP)
        .flat_map(|(_, _, ip)| attributes(ip))
        .any(|(kind, _, value)| matches!(kind, CTA_IP_V4_SRC | CTA_IP_V4_DST) && value == address.octets())
}

/// The netlink attributes of `data`: (type, the whole attribute padded to
/// four bytes, its value). Stops at the first malformed one.
fn attributes(data: &[u8]) -> impl Iterator<Item = (u16, &[u8], &[u8])> {
    let mut rest = data;
    std::iter::from_fn(move || {
        let len = u16::from_ne_bytes(rest.get(..2)?.try_into().ok()?) as usize;
        let kind = u16::from_ne_bytes(rest.get(2..4)?.try_into().ok()?) & NLA_TYPE_MASK;
        if len < 4 || len > rest.len() {
            return None;
        }
        let padded = ((len + 3) & !3).min(rest.len());
        let (whole, value) = (&rest[..padded], &rest[4..len]);
        rest = &rest[padded..];
        Some((kind, whole, value))
    })
}

struct Netlink {
    fd: OwnedFd,
    seq: std::cell::Cell<u32>,
}

impl Netlink {
    fn open() -> io::Result<Self> {
        // SAFETY: a plain socket(2) call; the descriptor is owned at once.
        let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, NETLINK_NETFILTER) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let timeout = libc::timeval {
            tv_sec: READ_DEADLINE.as_secs() as libc::time_t,
            tv_usec: 0,
        };
        // SAFETY: `timeout` is a valid timeval of the size given.
        let set = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &timeout as *const libc::timeval as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if set != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            fd,
            seq: std::cell::Cell::new(1),
        })
    }

    fn send(&self, message: u16, flags: u16, attributes: &[u8]) -> io::Result<()> {
        let len = HEADER + NFGENMSG + attributes.len();
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(&(len as u32).to_ne_bytes());
        out.extend_from_slice(&((NFNL_SUBSYS_CTNETLINK << 8) | message).to_ne_bytes());
        out.extend_from_slice(&flags.to_ne_bytes());
        out.extend_from_slice(&seq.to_ne_bytes());
        out.extend_from_slice(&0u32.to_ne_bytes());
        // nfgenmsg: family, version 0, resource id 0 (big-endian).
        out.extend_from_slice(&[libc::AF_INET as u8, 0, 0, 0]);
        out.extend_from_slice(attributes);
        // SAFETY: `out` is valid for its length; the kernel is the
        // destination of a netlink socket that is not connected elsewhere.
        let sent = unsafe { libc::send(self.fd.as_raw_fd(), out.as_ptr() as *const libc::c_void, out.len(), 0) };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reads messages, giving each payload to `each`, until the dump ends.
    fn read_until_done(&self, mut each: impl FnMut(&[u8])) -> io::Result<()> {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            let n = self.receive(&mut buffer)?;
            for (kind, payload) in messages(&buffer[..n]) {
                match kind {
                    // A dump cut short ends with its error here.
                    NLMSG_DONE if payload.len() >= 4 => return error_of(payload),
                    NLMSG_DONE => return Ok(()),
                    NLMSG_ERROR => error_of(payload)?,
                    _ => each(payload),
                }
            }
        }
    }

    fn read_ack(&self) -> io::Result<()> {
        let mut buffer = vec![0u8; 8 * 1024];
        loop {
            let n = self.receive(&mut buffer)?;
            if let Some((_, payload)) = messages(&buffer[..n]).find(|(kind, _)| *kind == NLMSG_ERROR) {
                return error_of(payload);
            }
        }
    }

    /// One read within [`READ_DEADLINE`]; a read a signal interrupts (a
    /// socket with a receive timeout is never restarted) is tried again
    /// until then.
    fn receive(&self, buffer: &mut [u8]) -> io::Result<usize> {
        let deadline = std::time::Instant::now() + READ_DEADLINE;
        loop {
            // SAFETY: `buffer` is valid for writes of its length.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buffer.as_mut_ptr() as *mut libc::c_void,
                    buffer.len(),
                    0,
                )
            };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted || std::time::Instant::now() > deadline {
                return Err(e);
            }
        }
    }
}

/// The messages of one read: (type, payload after the header).
fn messages(data: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut rest = data;
    std::iter::from_fn(move || {
        let len = u32::from_ne_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        let kind = u16::from_ne_bytes(rest.get(4..6)?.try_into().ok()?);
        if len < HEADER || len > rest.len() {
            return None;
        }
        let payload = &rest[HEADER..len];
        rest = &rest[((len + 3) & !3).min(rest.len())..];
        Some((kind, payload))
    })
}

/// An error message's code: 0 is an acknowledgement.
fn error_of(payload: &[u8]) -> io::Result<()> {
    let code = payload
        .get(..4)
        .map(|b| i32::from_ne_bytes(b.try_into().expect("four bytes")))
        .unwrap_or(-libc::EIO);
    match code {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(-e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attribute(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(value);
        while out.len() % 4 != 0 {
            out.push(0);
        }
        out
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
            matching(&payload, Ipv4Addr::new(172, 18, 128, 5)),
            Some([orig, zone].concat())
        );
        assert!(
            matching(&payload, Ipv4Addr::new(192, 0, 2, 2)).is_some(),
            "the reply's side"
        );
        assert_eq!(matching(&payload, Ipv4Addr::new(172, 18, 128, 6)), None);
        // Malformed input ends the walk, it does not panic.
        assert_eq!(matching(&payload[..9], Ipv4Addr::new(172, 18, 128, 5)), None);
        // An entry that shows no original tuple is never named: a deletion
        // without one would flush the whole table.
        let reply_only = [
            vec![2, 0, 0, 0],
            tuple(CTA_TUPLE_REPLY, [172, 18, 128, 5], [1, 1, 1, 1]),
        ]
        .concat();
        assert_eq!(matching(&reply_only, Ipv4Addr::new(172, 18, 128, 5)), None);
    }
}
