//! Connections to ports inside a sandbox, for preview links: the agent
//! connects to the port on the sandbox's own loopback and hands the server
//! the connected socket (a descriptor over its unix socket), or, where the
//! runtime cannot pass descriptors out of the sandbox (gVisor), carries the
//! bytes over that unix connection itself. Either way the traffic enters
//! the sandbox through its agent: the sandbox gains no network, and a
//! sandbox without any network is reached as well as one with.
//!
//! The agent is the sandbox's to replace, so what it passes is checked (a
//! stream socket of the internet families, nothing else), its answer is
//! bounded, and every step has a deadline.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

use crate::agent::{bounded, open_socket_nofollow, MAX_AGENT_TEXT};

/// How long the agent may take to answer (it gives a connection a second
/// at most).
pub const OPEN_DEADLINE: Duration = Duration::from_secs(5);
/// The longest answer line read.
const MAX_ANSWER: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum PortError {
    /// The agent's socket could not be reached (the sandbox is stopped).
    #[error("could not reach the sandbox's agent: {0}")]
    Unreachable(#[source] io::Error),
    /// The agent could not connect to the port (nothing listens there).
    #[error("{0}")]
    Refused(String),
    /// The agent answered something that is not the protocol.
    #[error("the agent broke the protocol: {0}")]
    Protocol(String),
    #[error("the agent did not answer within {0:?}")]
    TimedOut(Duration),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// A connection to a port inside a sandbox.
pub enum PortStream {
    /// The socket the agent connected and passed (taken only by `Drop`,
    /// which closes it on the blocking pool).
    Passed(Option<TcpStream>),
    /// The agent's connection, which carries the bytes; `early` holds those
    /// that came with its answer.
    Relayed { early: Vec<u8>, stream: UnixStream },
}

#[derive(Deserialize)]
struct Answer {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    error: Option<String>,
}

/// Opens a connection to `port` through the agent listening at `socket`.
pub async fn open_port(socket: &Path, port: u16, relay: bool) -> Result<PortStream, PortError> {
    tokio::time::timeout(OPEN_DEADLINE, open(socket, port, relay))
        .await
        .unwrap_or(Err(PortError::TimedOut(OPEN_DEADLINE)))
}

async fn open(socket: &Path, port: u16, relay: bool) -> Result<PortStream, PortError> {
    let fd = open_socket_nofollow(socket).map_err(PortError::Unreachable)?;
    let mut stream = UnixStream::connect(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .await
        .map_err(PortError::Unreachable)?;
    drop(fd);
    let line = serde_json::json!({"id": 1, "op": "open_port", "port": port, "relay": relay});
    stream.write_all(format!("{line}\n").as_bytes()).await?;
    // The answer is read, and what came with it closed, on a thread of the
    // blocking pool: a descriptor a hostile agent passed may block its
    // closer (a socket set to linger with unsent data), which must never
    // be a thread of the runtime.
    let stream = stream.into_std()?;
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(OPEN_DEADLINE))?;
    let (stream, got, end, passed) = tokio::task::spawn_blocking(move || answer(stream))
        .await
        .map_err(|e| PortError::Io(io::Error::other(e)))??;
    let text = |b: &[u8]| bounded(String::from_utf8_lossy(b).into_owned(), MAX_AGENT_TEXT);
    let parsed: Result<Answer, _> = serde_json::from_slice(&got[..end]);
    let failure = match parsed {
        Ok(a) if a.kind == "result" => None,
        Ok(a) if a.kind == "error" => Some(PortError::Refused(text(a.error.unwrap_or_default().as_bytes()))),
        _ => Some(PortError::Protocol(text(&got[..end]))),
    };
    if let Some(failure) = failure {
        close_elsewhere(passed);
        return Err(failure);
    }
    if relay {
        close_elsewhere(passed);
        stream.set_nonblocking(true)?;
        return Ok(PortStream::Relayed {
            early: got[end + 1..].to_vec(),
            stream: UnixStream::from_std(stream)?,
        });
    }
    let fd = passed.ok_or_else(|| PortError::Protocol("no connection came with the answer".into()))?;
    match checked(&fd) {
        Ok(()) => Ok(PortStream::Passed(Some(TcpStream::from_std(
            std::net::TcpStream::from(fd),
        )?))),
        Err(e) => {
            close_elsewhere(Some(fd));
            Err(e)
        }
    }
}

/// Reads the agent's answer line (blocking, within the socket's read
/// timeout): the stream, the bytes read, where the line ends, and the first
/// descriptor that came with them.
fn answer(
    stream: std::os::unix::net::UnixStream,
) -> Result<(std::os::unix::net::UnixStream, Vec<u8>, usize, Option<OwnedFd>), PortError> {
    let mut got = Vec::new();
    let mut passed = None;
    loop {
        let mut buf = [0u8; 1024];
        let (n, fd) = receive(stream.as_raw_fd(), &mut buf)?;
        // Only the first descriptor counts; another is closed here.
        if passed.is_none() {
            passed = fd.map(abortive);
        }
        if n == 0 {
            return Err(PortError::Protocol(
                "the agent closed the connection without an answer".into(),
            ));
        }
        got.extend_from_slice(&buf[..n]);
        if let Some(end) = got.iter().position(|&b| b == b'\n') {
            return Ok((stream, got, end, passed));
        }
        if got.len() > MAX_ANSWER {
            return Err(PortError::Protocol("an answer longer than 4 KiB".into()));
        }
    }
}

/// `fd` set to close at once, whatever is unsent (an abortive close).
fn abortive(fd: OwnedFd) -> OwnedFd {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: `fd` is open; `linger` is a valid option value of its size.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    fd
}

/// Closes what a hostile agent passed on the blocking pool (see [`open`]).
fn close_elsewhere(fd: Option<OwnedFd>) {
    if let Some(fd) = fd {
        let fd = abortive(fd);
        tokio::task::spawn_blocking(move || drop(fd));
    }
}

/// Whether `fd` is a stream socket of the internet families (what a
/// replaced agent passes may be anything).
fn checked(fd: &OwnedFd) -> Result<(), PortError> {
    let option = |name| -> io::Result<libc::c_int> {
        let mut value: libc::c_int = 0;
        let mut len = size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `fd` is open; `value` and `len` are valid out-pointers.
        let r = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                name,
                (&raw mut value).cast(),
                &mut len,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(value)
    };
    let refuse = || PortError::Protocol("the agent passed something other than a TCP connection".into());
    let domain = option(libc::SO_DOMAIN).map_err(|_| refuse())?;
    let kind = option(libc::SO_TYPE).map_err(|_| refuse())?;
    if !matches!(domain, libc::AF_INET | libc::AF_INET6) || kind != libc::SOCK_STREAM {
        return Err(refuse());
    }
    // SAFETY: fcntl on an open descriptor, with flags it just read.
    let nonblocking = unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        flags >= 0 && libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
    };
    match nonblocking {
        true => Ok(()),
        false => Err(PortError::Io(io::Error::last_os_error())),
    }
}

/// One `recvmsg`: the bytes read, and a descriptor that came with them.
fn receive(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // Room for one descriptor (8-byte aligned); the kernel closes any more.
    let mut control = [0u64; 4];
    // SAFETY: a zeroed msghdr is valid; its pointers are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is arithmetic.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<libc::c_int>() as u32) } as usize;
    // SAFETY: `msg` points at live buffers of the sizes given.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut passed = None;
    // SAFETY: walks the control messages the kernel wrote into `control`.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !cmsg.is_null() {
        // SAFETY: a header within `control`, as CMSG_FIRSTHDR/NXTHDR give.
        let header = unsafe { &*cmsg };
        if header.cmsg_level == libc::SOL_SOCKET && header.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: CMSG_LEN and CMSG_DATA are arithmetic on the header.
            let count = (header.cmsg_len as usize - unsafe { libc::CMSG_LEN(0) } as usize) / size_of::<libc::c_int>();
            let data = unsafe { libc::CMSG_DATA(cmsg) }.cast::<libc::c_int>();
            for i in 0..count {
                // SAFETY: `count` descriptors follow the header; each is
                // new to this process and owned (closed) here.
                let owned = unsafe { OwnedFd::from_raw_fd(data.add(i).read_unaligned()) };
                if passed.is_none() {
                    passed = Some(owned);
                }
            }
        }
        // SAFETY: as above.
        cmsg = unsafe { libc::CMSG_NXTHDR(&msg, cmsg) };
    }
    Ok((n as usize, passed))
}

impl Drop for PortStream {
    fn drop(&mut self) {
        if let PortStream::Passed(s) = self {
            if let Some(fd) = s.take().and_then(|s| s.into_std().ok()) {
                close_elsewhere(Some(OwnedFd::from(fd)));
            }
        }
    }
}

impl AsyncRead for PortStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PortStream::Passed(s) => Pin::new(s.as_mut().expect("open until dropped")).poll_read(cx, buf),
            PortStream::Relayed { early, stream } => {
                if !early.is_empty() {
                    let n = early.len().min(buf.remaining());
                    buf.put_slice(&early[..n]);
                    early.drain(..n);
                    return Poll::Ready(Ok(()));
                }
                Pin::new(stream).poll_read(cx, buf)
            }
        }
    }
}

impl AsyncWrite for PortStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            PortStream::Passed(s) => Pin::new(s.as_mut().expect("open until dropped")).poll_write(cx, buf),
            PortStream::Relayed { stream, .. } => Pin::new(stream).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PortStream::Passed(s) => Pin::new(s.as_mut().expect("open until dropped")).poll_flush(cx),
            PortStream::Relayed { stream, .. } => Pin::new(stream).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PortStream::Passed(s) => Pin::new(s.as_mut().expect("open until dropped")).poll_shutdown(cx),
            PortStream::Relayed { stream, .. } => Pin::new(stream).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream as StdUnix;

    #[test]
    fn only_a_tcp_connection_is_taken_from_the_agent() {
        let (a, _b) = StdUnix::pair().unwrap();
        let err = checked(&OwnedFd::from(a)).err().unwrap();
        assert!(err.to_string().contains("other than a TCP connection"), "{err}");
        let file = std::fs::File::open("/dev/null").unwrap();
        assert!(checked(&OwnedFd::from(file)).is_err());
    }
}
