//! Accepting HTTP connections under caps: in total and per client address
//! (`limits.max_connections`, `limits.max_connections_per_ip`; a trusted
//! proxy carries many clients and counts only in the total), with a deadline
//! for each request's headers (`limits.header_timeout_seconds`, which also
//! closes idle kept-alive connections), so slow or silent clients cannot
//! hold descriptors. A connection over a cap is answered 429 or 503 with
//! `Retry-After` and closed. `axum::serve` has neither deadline nor caps,
//! hence this loop over hyper.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::http::StatusCode;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio_util::sync::CancellationToken;
use tower::Service;
use tracing::{debug, warn};

use crate::access::client_ip::{canonical, ClientAddresses};
use crate::access::limits::LimitsConfig;
use crate::metrics::{ConnectionRefusal, Metrics};

/// Refusals being written at once; connections beyond are just closed.
const REFUSALS_IN_FLIGHT: usize = 64;
/// How long a refusal may take to write, and how long a closing connection
/// drains what the client still sends.
const LINGER: Duration = Duration::from_secs(2);
/// Descriptors kept free for the engine, agents, records and logs.
const RESERVED_DESCRIPTORS: u64 = 256;
/// Descriptors one sandbox may take (its agent's socket, inotify, Docker
/// calls), besides its egress proxy's (see [`descriptors_needed`]).
const DESCRIPTORS_PER_SANDBOX: u64 = 4;

#[derive(Default)]
struct Counts {
    total: usize,
    per_ip: HashMap<IpAddr, usize>,
}

struct Caps {
    total: usize,
    per_ip: usize,
    addresses: ClientAddresses,
    counts: Mutex<Counts>,
    metrics: Arc<Metrics>,
    /// Tells the loop when the last connection closed.
    open: watch::Sender<usize>,
}

/// A connection's place under the caps, freed when dropped.
struct Place {
    caps: Arc<Caps>,
    ip: Option<IpAddr>,
}

/// A connection's place under the caps, in each of its requests: a handler
/// that takes over the connection (a preview's WebSocket) keeps it until
/// it is done, so an upgraded connection still counts.
#[derive(Clone)]
pub struct ConnectionPlace {
    _held: Arc<Place>,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut counts = self.caps.counts.lock().expect("connections lock");
        counts.total -= 1;
        if let Some(ip) = self.ip {
            if let Some(n) = counts.per_ip.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    counts.per_ip.remove(&ip);
                }
            }
        }
        let _ = self.caps.open.send(counts.total);
        self.caps.metrics.connection_closed();
    }
}

impl Caps {
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Place, ConnectionRefusal> {
        let mut counts = self.counts.lock().expect("connections lock");
        if counts.total >= self.total {
            return Err(ConnectionRefusal::Total);
        }
        // A trusted proxy brings everybody's connections: only the total
        // holds. Others count by address, IPv6 by prefix.
        let counted = (!self.addresses.trusts(ip)).then(|| self.addresses.group(ip));
        if let Some(ip) = counted {
            let n = counts.per_ip.entry(ip).or_default();
            if *n >= self.per_ip {
                return Err(ConnectionRefusal::PerIp);
            }
            *n += 1;
        }
        counts.total += 1;
        let _ = self.open.send(counts.total);
        self.metrics.connection_opened();
        Ok(Place {
            caps: self.clone(),
            ip: counted,
        })
    }
}

/// The fixed answer to a connection over a cap.
fn refusal_bytes(why: ConnectionRefusal, caps: &Caps) -> Vec<u8> {
    let (status, message) = match why {
        ConnectionRefusal::PerIp => (
            "429 Too Many Requests",
            format!(
                "too many open connections from your address (at most {}); close some and retry",
                caps.per_ip
            ),
        ),
        ConnectionRefusal::Total => (
            "503 Service Unavailable",
            format!(
                "the server holds its maximum of {} connections; retry later",
                caps.total
            ),
        ),
    };
    let body = serde_json::json!({ "error": message }).to_string();
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Writes the refusal and closes as [`discard`] says, all within [`LINGER`].
async fn refuse(mut tcp: TcpStream, answer: Vec<u8>) {
    let _ = tokio::time::timeout(LINGER, async {
        tcp.write_all(&answer).await?;
        tcp.shutdown().await?;
        discard(&mut tcp).await
    })
    .await;
}

/// Reads and drops what the client still sends on a connection whose
/// answer is written and whose sending side is shut (the rest of a body
/// refused at its size, say), until the client closes; the caller bounds
/// how long. Closed at once, a socket with unread bytes is reset, and a
/// client still sending sees a broken pipe instead of the answer waiting
/// for it.
async fn discard(tcp: &mut TcpStream) -> std::io::Result<()> {
    let mut sink = vec![0u8; 4096];
    while tcp.read(&mut sink).await? > 0 {}
    Ok(())
}

/// Why the open-file limit cannot hold the configured connections.
#[derive(Debug, thiserror::Error)]
pub enum OpenFilesError {
    #[error("reading the open-file limit: {0}")]
    Read(#[source] std::io::Error),
    #[error(
        "limits.max_connections ({connections}), limits.max_sandboxes_total ({sandboxes}) and \
         sandbox.egress_max_connections ({egress_connections}) need about {need} open files, but the open-file \
         limit is {have}: lower them or raise the hard limit (ulimit -Hn)"
    )]
    TooLow {
        connections: usize,
        sandboxes: usize,
        egress_connections: usize,
        need: u64,
        have: u64,
    },
}

/// The open-file limit, and the part of it the egress proxy may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    pub limit: u64,
    /// Connections the egress proxy may hold for all sandboxes together.
    pub egress_connections: usize,
}

/// Descriptors the server holds whatever its sandboxes do: its HTTP
/// connections and the refusals it writes, every sandbox's own and, where a
/// policy in force is proxied, its proxy's listener and refusals, and a
/// reserve. Connections of the proxies are budgeted apart, together.
fn descriptors_fixed(limits: &LimitsConfig, proxied: bool) -> u64 {
    let proxy = match proxied {
        true => sandbox_egress::DESCRIPTORS_PER_PROXY,
        false => 0,
    };
    limits.max_connections as u64
        + REFUSALS_IN_FLIGHT as u64
        + limits.max_sandboxes_total as u64 * (DESCRIPTORS_PER_SANDBOX + proxy)
        + RESERVED_DESCRIPTORS
}

/// The egress connections all sandboxes may hold together within `limit`
/// open files: what the fixed needs leave (two descriptors each), at most
/// every sandbox's whole share; an error when it is less than one
/// sandbox's `egress_max_connections` (0 when no policy is proxied).
fn egress_budget(limits: &LimitsConfig, egress_max_connections: usize, limit: u64) -> Result<usize, u64> {
    let proxied = egress_max_connections > 0;
    let fixed = descriptors_fixed(limits, proxied);
    let per = sandbox_egress::DESCRIPTORS_PER_CONNECTION;
    let one_sandbox = fixed + per * egress_max_connections as u64;
    if limit < one_sandbox {
        return Err(one_sandbox);
    }
    let most = limits.max_sandboxes_total.saturating_mul(egress_max_connections);
    Ok((((limit - fixed) / per) as usize).min(most))
}

/// Raises the open-file soft limit to the hard limit and checks that the
/// connection cap and the sandboxes, with room for at least one sandbox's
/// `egress_max_connections` proxied connections, fit in it; the rest goes
/// to the egress proxy's connections, which all sandboxes share.
pub fn raise_open_file_limit(
    limits: &LimitsConfig,
    egress_max_connections: usize,
) -> Result<OpenFiles, OpenFilesError> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return Err(OpenFilesError::Read(std::io::Error::last_os_error()));
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim = raised;
            }
        }
    }
    let have = lim.rlim_cur;
    match egress_budget(limits, egress_max_connections, have) {
        Ok(egress_connections) => Ok(OpenFiles {
            limit: have,
            egress_connections,
        }),
        Err(need) => Err(OpenFilesError::TooLow {
            connections: limits.max_connections,
            sandboxes: limits.max_sandboxes_total,
            egress_connections: egress_max_connections,
            need,
            have,
        }),
    }
}

/// Serves `app` on `listener` until `shutdown`, then lets open connections
/// finish their requests (the caller bounds how long). A connection may
/// switch protocols (a preview's WebSocket), and is then the handler's.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: &LimitsConfig,
    addresses: ClientAddresses,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let (open_tx, mut open_rx) = watch::channel(0usize);
    let caps = Arc::new(Caps {
        total: limits.max_connections,
        per_ip: limits.max_connections_per_ip,
        addresses,
        counts: Mutex::default(),
        metrics: metrics.clone(),
        open: open_tx,
    });
    let header_timeout = Duration::from_secs(limits.header_timeout_seconds);
    let refusals = Arc::new(Semaphore::new(REFUSALS_IN_FLIGHT));
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors, most likely: wait for some to free.
                    warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let ip = canonical(peer.ip());
        let place = match caps.admit(ip) {
            Ok(p) => p,
            Err(why) => {
                metrics.connection_refused(why);
                debug!(client = %ip, ?why, "connection refused");
                if let Ok(permit) = refusals.clone().try_acquire_owned() {
                    let answer = refusal_bytes(why, &caps);
                    tokio::spawn(async move {
                        refuse(tcp, answer).await;
                        drop(permit);
                    });
                }
                continue;
            }
        };
        // Streamed responses are written in several small pieces: without
        // TCP_NODELAY, Nagle's algorithm waits for the client's delayed ACK
        // (~40 ms) before sending the rest of a response.
        let _ = tcp.set_nodelay(true);
        let app = app.clone();
        let stop = shutdown.clone();
        let metrics = metrics.clone();
        // A second descriptor of the socket, to drain it once hyper is done
        // with its own (an upgraded connection is the handler's instead).
        let Ok(spare) = tcp.as_fd().try_clone_to_owned() else {
            continue;
        };
        let place = ConnectionPlace { _held: Arc::new(place) };
        tokio::spawn(async move {
            let upgraded = Arc::new(AtomicBool::new(false));
            let switched = upgraded.clone();
            let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
                req.extensions_mut().insert(ConnectInfo::<SocketAddr>(peer));
                req.extensions_mut().insert(place.clone());
                let mut app = app.clone();
                let switched = switched.clone();
                async move {
                    let answer = app.call(req.map(axum::body::Body::new)).await;
                    if answer
                        .as_ref()
                        .is_ok_and(|r| r.status() == StatusCode::SWITCHING_PROTOCOLS)
                    {
                        switched.store(true, Ordering::SeqCst);
                    }
                    answer
                }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(header_timeout);
            let conn = builder.serve_connection(TokioIo::new(tcp), service).with_upgrades();
            tokio::pin!(conn);
            // The connection flushes its last answer and shuts its sending
            // side; the spare descriptor keeps the socket open.
            let outcome = tokio::select! {
                outcome = &mut conn => outcome,
                _ = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            let answered = match &outcome {
                Ok(()) => !stop.is_cancelled(),
                // hyper answered a malformed request (400, 431) itself.
                Err(e) => e.is_parse(),
            };
            if let Err(e) = outcome {
                if e.is_timeout() {
                    metrics.header_timeout();
                    debug!(client = %ip, "request headers too slow: connection dropped");
                }
            }
            if answered && !upgraded.load(Ordering::SeqCst) {
                let socket = std::net::TcpStream::from(spare);
                if socket.set_nonblocking(true).is_ok() {
                    if let Ok(mut tcp) = TcpStream::from_std(socket) {
                        let _ = tokio::time::timeout(LINGER, discard(&mut tcp)).await;
                    }
                }
            }
        });
    }
    // Stop accepting; wait for the connections still open.
    drop(listener);
    let _ = open_rx.wait_for(|n| *n == 0).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The densities the docs report start on a host with a 20,000-file
    /// limit: a thousand sandboxes under a proxied policy share what is
    /// left for their connections, where budgeting each its whole share
    /// needed 143,320 files.
    #[test]
    fn a_thousand_proxied_sandboxes_share_the_egress_connections_the_limit_leaves() {
        let limits = LimitsConfig {
            max_sandboxes_total: 1000,
            ..LimitsConfig::default()
        };
        let shared = egress_budget(&limits, 64, 20_000).expect("starts");
        let fixed = descriptors_fixed(&limits, true);
        assert_eq!(shared as u64, (20_000 - fixed) / 2);
        assert!(shared >= 64, "at least one sandbox's whole share: {shared}");
        // Plenty of files: every sandbox's whole share, no more.
        assert_eq!(egress_budget(&limits, 64, 1 << 20), Ok(64_000));
        // Too few for even one sandbox's connections: refused, with what it needs.
        assert_eq!(egress_budget(&limits, 64, fixed + 10), Err(fixed + 128));
        // No proxied policy: no proxy descriptors, no connections.
        assert_eq!(egress_budget(&limits, 0, 20_000), Ok(0));
        assert!(descriptors_fixed(&limits, false) < fixed);
    }
}
