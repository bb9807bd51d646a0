//! A netlink socket to the kernel: requests, acknowledgements, dumps, and
//! the attributes messages carry. Used for the kernel's connection table
//! ([`super::conntrack`]) and for the interfaces, addresses and routes of
//! a sandbox's join to the bridge ([`super::veth`]), without starting a
//! program for either.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

pub const NETLINK_ROUTE: libc::c_int = 0;
pub const NETLINK_NETFILTER: libc::c_int = 12;
pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_EXCL: u16 = 0x200;
pub const NLM_F_CREATE: u16 = 0x400;
pub const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
/// Attribute type bits that are flags (nested, byte order), not the type.
const NLA_TYPE_MASK: u16 = 0x3fff;
const HEADER: usize = 16;
/// How long a read may wait for the kernel's answer (the kernel handles a
/// request within its send, which can wait for its locks: callers bound
/// that).
const READ_DEADLINE: Duration = Duration::from_secs(5);

pub struct Netlink {
    fd: OwnedFd,
    seq: std::cell::Cell<u32>,
}

impl Netlink {
    /// A socket of `protocol` in the calling thread's network namespace.
    pub fn open(protocol: libc::c_int) -> io::Result<Self> {
        // SAFETY: a plain socket(2) call; the descriptor is owned at once.
        let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, protocol) };
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

    /// Sends one message of type `message`: `body` is its family's header
    /// followed by its attributes. Its sequence number: the kernel's
    /// answers to it carry it.
    pub fn send(&self, message: u16, flags: u16, body: &[u8]) -> io::Result<u32> {
        let len = HEADER + body.len();
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(&(len as u32).to_ne_bytes());
        out.extend_from_slice(&message.to_ne_bytes());
        out.extend_from_slice(&flags.to_ne_bytes());
        out.extend_from_slice(&seq.to_ne_bytes());
        out.extend_from_slice(&0u32.to_ne_bytes());
        out.extend_from_slice(body);
        // SAFETY: `out` is valid for its length; the kernel is the
        // destination of a netlink socket that is not connected elsewhere.
        let sent = unsafe { libc::send(self.fd.as_raw_fd(), out.as_ptr() as *const libc::c_void, out.len(), 0) };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(seq)
    }

    /// Sends a request and waits for its acknowledgement.
    pub fn request(&self, message: u16, flags: u16, body: &[u8]) -> io::Result<()> {
        let seq = self.send(message, flags | NLM_F_REQUEST | NLM_F_ACK, body)?;
        self.read_ack(seq)
    }

    /// Reads the messages answering `seq`, giving each payload to `each`,
    /// until the dump ends.
    pub fn read_until_done(&self, seq: u32, mut each: impl FnMut(&[u8])) -> io::Result<()> {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            let n = self.receive(&mut buffer)?;
            for (kind, payload) in answers(&buffer[..n], seq) {
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

    /// The acknowledgement (or error) of the request `seq`; anything else
    /// read meanwhile (an answer to an earlier request) is passed over.
    fn read_ack(&self, seq: u32) -> io::Result<()> {
        let mut buffer = vec![0u8; 8 * 1024];
        loop {
            let n = self.receive(&mut buffer)?;
            if let Some((_, payload)) = answers(&buffer[..n], seq).find(|(kind, _)| *kind == NLMSG_ERROR) {
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

/// The messages of one read that answer the request `seq` (the kernel
/// copies a request's sequence number into its answers): (type, payload
/// after the header).
fn answers(data: &[u8], seq: u32) -> impl Iterator<Item = (u16, &[u8])> {
    let mut rest = data;
    std::iter::from_fn(move || {
        let len = u32::from_ne_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        let kind = u16::from_ne_bytes(rest.get(4..6)?.try_into().ok()?);
        let their_seq = u32::from_ne_bytes(rest.get(8..12)?.try_into().ok()?);
        if len < HEADER || len > rest.len() {
            return None;
        }
        let payload = &rest[HEADER..len];
        rest = &rest[((len + 3) & !3).min(rest.len())..];
        Some((kind, payload, their_seq == seq))
    })
    .filter(|(_, _, ours)| *ours)
    .map(|(kind, payload, _)| (kind, payload))
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

/// The netlink attributes of `data`: (type, the whole attribute padded to
/// four bytes, its value). Stops at the first malformed one.
pub fn attributes(data: &[u8]) -> impl Iterator<Item = (u16, &[u8], &[u8])> {
    let mut rest = data;
    std::iter::from_fn(move || {
        let len = u16::from_ne_bytes(rest.get(..2)?.try_into().ok()?) as usize;
        let kind = u16::from_ne_bytes(rest.get(2..4)?.try_into().ok()?) & NLA_TYPE_MASK;
        if len < 4 || len > rest.len() {
            return None;
        }
        let whole = &rest[..((len + 3) & !3).min(rest.len())];
        let value = &rest[4..len];
        rest = &rest[whole.len()..];
        Some((kind, whole, value))
    })
}

/// One attribute: its header, `value`, padding to four bytes.
pub fn attribute(kind: u16, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + value.len() + 3);
    out.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(value);
    while out.len() % 4 != 0 {
        out.push(0);
    }
    out
}

/// A string attribute, with the terminating zero the kernel expects.
pub fn string(kind: u16, value: &str) -> Vec<u8> {
    attribute(kind, &[value.as_bytes(), &[0]].concat())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u16, seq: u32, port: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&((HEADER + payload.len()) as u32).to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(&0u16.to_ne_bytes());
        out.extend_from_slice(&seq.to_ne_bytes());
        out.extend_from_slice(&port.to_ne_bytes());
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn only_the_answers_to_the_request_are_read() {
        let data = [
            message(NLMSG_ERROR, 6, 4242, &(-libc::EEXIST).to_ne_bytes()),
            message(NLMSG_ERROR, 7, 4242, &0i32.to_ne_bytes()),
        ]
        .concat();
        let read: Vec<_> = answers(&data, 7).collect();
        assert_eq!(read.len(), 1);
        assert!(error_of(read[0].1).is_ok());
        let earlier = answers(&data, 6).next().unwrap();
        assert_eq!(error_of(earlier.1).unwrap_err().raw_os_error(), Some(libc::EEXIST));
    }

    #[test]
    fn attributes_are_padded_and_read_back_and_malformed_ones_end_the_walk() {
        let data = [
            string(3, "eth0"),
            attribute(4, &1500u32.to_ne_bytes()),
            attribute(9, &[1]),
        ]
        .concat();
        assert_eq!(data.len(), 12 + 8 + 8);
        let read: Vec<_> = attributes(&data)
            .map(|(kind, _, value)| (kind, value.to_vec()))
            .collect();
        assert_eq!(
            read,
            vec![
                (3, b"eth0\0".to_vec()),
                (4, 1500u32.to_ne_bytes().to_vec()),
                (9, vec![1])
            ]
        );
        assert_eq!(attributes(&data[..6]).count(), 0);
        let mut short = data.clone();
        short[12] = 200;
        assert_eq!(attributes(&short).count(), 1, "a length past the end stops the walk");
    }
}
