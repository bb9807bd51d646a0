//! One connection through the egress proxy: an HTTP CONNECT tunnel or a
//! plain-HTTP request in absolute form, checked against the sandbox's
//! policy (CONNECT host, TLS server name, `Host`), resolved by the proxy
//! itself, connected only to an address the guard admits, and copied under
//! the sandbox's byte budget. Refusals are answered at once with a status
//! and a reason.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

use super::sni::{self, Hello};
use super::{Attached, Policies};
use crate::EgressPolicy;

/// Largest request head accepted.
const MAX_HEAD: usize = 16 * 1024;
/// Time a client has to send its request head.
const HEAD_DEADLINE: Duration = Duration::from_secs(10);
/// Time for resolving a name and for connecting to it.
const DIAL_DEADLINE: Duration = Duration::from_secs(10);
/// A connection with no bytes in either direction for this long is closed.
const IDLE: Duration = Duration::from_secs(300);

/// A refused connection: the status answered and why.
#[derive(Debug)]
pub struct Denial {
    pub status: u16,
    /// Metric label: `policy`, `address`, `sni`, `limit`, `malformed`.
    pub kind: &'static str,
    pub reason: String,
}

impl Denial {
    fn new(status: u16, kind: &'static str, reason: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            reason: reason.into(),
        }
    }
}

/// Bytes a sandbox may move per minute, shared by its connections, and
/// the bytes it moved in all (for its tenant's usage).
pub struct ByteBudget {
    per_minute: u64,
    window: Mutex<(Instant, u64)>,
    moved: AtomicU64,
}

impl ByteBudget {
    pub fn new(per_minute: u64) -> Self {
        Self {
            per_minute,
            window: Mutex::new((Instant::now(), 0)),
            moved: AtomicU64::new(0),
        }
    }

    /// Bytes charged since the budget was made.
    pub fn moved(&self) -> u64 {
        self.moved.load(Ordering::Relaxed)
    }

    /// Counts `n` bytes; when over the budget, how long until the next window.
    pub fn charge(&self, n: u64) -> Option<Duration> {
        self.moved.fetch_add(n, Ordering::Relaxed);
        let mut w = self.window.lock().expect("budget lock");
        let now = Instant::now();
        if now.duration_since(w.0) >= Duration::from_secs(60) {
            *w = (now, 0);
        }
        w.1 += n;
        (w.1 > self.per_minute).then(|| (w.0 + Duration::from_secs(60)).saturating_duration_since(now))
    }
}

/// Writes a short refusal and closes.
pub async fn refuse(stream: &mut UnixStream, denial: &Denial) {
    let text = match denial.status {
        400 => "Bad Request",
        403 => "Forbidden",
        429 => "Too Many Requests",
        411 => "Length Required",
        431 => "Request Header Fields Too Large",
        _ => "Bad Gateway",
    };
    let body = format!("mcp-sandbox egress proxy: {}\n", denial.reason);
    let reply = format!(
        "HTTP/1.1 {} {text}\r\nContent-Type: text/plain; charset=utf-8\r\nX-Mcp-Sandbox-Egress: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        denial.status,
        denial.kind,
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let _ = stream.write_all(reply.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
    // A lingering close: what the client still sends is read and dropped
    // (a little, briefly) so that its relay, writing the request it has not
    // yet passed on, never finds the socket closed and drops the answer.
    let _ = tokio::time::timeout(LINGER, async {
        let mut sink = [0u8; 4096];
        let mut left = LINGER_BYTES;
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

/// How long, and for how many bytes, a refused connection is read after
/// its answer (see [`refuse`]).
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 64 * 1024;

/// Serves one connection of the sandbox `sb`; refusals are reported to the
/// caller (which counts and logs them) after being answered.
pub async fn serve(mut client: UnixStream, sb: &Attached, shared: &Policies) -> Result<(), Denial> {
    let (head, rest) = match tokio::time::timeout(HEAD_DEADLINE, read_head(&mut client)).await {
        Ok(Ok(v)) => v,
        Ok(Err(d)) => return answer(&mut client, d).await,
        Err(_) => return Ok(()), // the client sent nothing in time: nothing to tell it
    };
    let request = match ProxyRequest::parse(&head) {
        Ok(r) => r,
        Err(d) => return answer(&mut client, d).await,
    };
    let policy = sb.policy();
    let addrs = match dial_targets(policy, &request.host, request.port, shared).await {
        Ok(a) => a,
        Err(d) => return answer(&mut client, d).await,
    };
    let upstream = match tokio::time::timeout(DIAL_DEADLINE, connect_any(&addrs)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return answer_unreachable(&mut client, format!("connecting to {}: {e}", request.host)).await,
        Err(_) => return answer_unreachable(&mut client, format!("connecting to {} timed out", request.host)).await,
    };
    let _ = upstream.set_nodelay(true);
    let (first, more) = if request.connect {
        if client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .is_err()
        {
            return Ok(());
        }
        (rest, None)
    } else {
        // The checked request and its body, and not a byte more.
        let now = rest.len().min(request.body as usize);
        let mut first = request.origin_form_head();
        first.extend_from_slice(&rest[..now]);
        (first, Some(request.body - now as u64))
    };
    let tunnel = request.connect.then_some(request.host.as_str());
    splice(client, upstream, first, more, tunnel, &sb.budget).await
}

async fn answer(client: &mut UnixStream, d: Denial) -> Result<(), Denial> {
    refuse(client, &d).await;
    Err(d)
}

/// The destination could not be reached: answered, but not a denial.
async fn answer_unreachable(client: &mut UnixStream, reason: String) -> Result<(), Denial> {
    refuse(client, &Denial::new(502, "unreachable", reason)).await;
    Ok(())
}

async fn read_head(client: &mut UnixStream) -> Result<(Vec<u8>, Vec<u8>), Denial> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = client
            .read(&mut chunk)
            .await
            .map_err(|e| Denial::new(400, "malformed", e.to_string()))?;
        if n == 0 {
            return Err(Denial::new(400, "malformed", "the request ended before its head"));
        }
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf[from..].windows(4).position(|w| w == b"\r\n\r\n") {
            let end = from + end + 4;
            let rest = buf.split_off(end);
            return Ok((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(Denial::new(431, "malformed", "the request head is too large"));
        }
    }
}

/// A parsed proxy request.
#[derive(Debug)]
struct ProxyRequest {
    connect: bool,
    /// Lower-cased, without brackets.
    host: String,
    port: u16,
    method: String,
    /// Origin-form target (plain HTTP only).
    path: String,
    headers: Vec<(String, Vec<u8>)>,
    /// The bytes of the request's body (plain HTTP only): nothing past
    /// them goes upstream, so no second request rides on the one checked.
    body: u64,
}

impl ProxyRequest {
    fn parse(head: &[u8]) -> Result<Self, Denial> {
        let mut headers = [httparse::EMPTY_HEADER; 96];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(head) {
            Ok(httparse::Status::Complete(_)) => {}
            _ => return Err(Denial::new(400, "malformed", "not an HTTP proxy request")),
        }
        let method = req.method.unwrap_or_default().to_string();
        let target = req.path.unwrap_or_default();
        let headers: Vec<(String, Vec<u8>)> = req
            .headers
            .iter()
            .map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec()))
            .collect();
        if method == "CONNECT" {
            let (host, port) = split_authority(target, None)?;
            return Ok(Self {
                connect: true,
                host,
                port,
                method,
                path: String::new(),
                headers,
                body: 0,
            });
        }
        let Some(rest) = target.strip_prefix("http://") else {
            return Err(Denial::new(
                400,
                "malformed",
                "only CONNECT and absolute http:// requests go through this proxy",
            ));
        };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let (host, port) = split_authority(authority, Some(80))?;
        // One Host header, naming the same host as the request line: a
        // front end that took another one (the last, say) would serve a
        // site the policy does not admit.
        let values = |name: &'static str| headers.iter().filter(move |(n, _)| n == name).map(|(_, v)| v);
        if values("host").count() > 1 {
            return Err(Denial::new(
                400,
                "malformed",
                "a request with more than one Host header",
            ));
        }
        if let Some(value) = values("host").next() {
            let named = String::from_utf8_lossy(value);
            let (named_host, _) = split_authority(named.trim(), Some(80))?;
            if named_host != host {
                return Err(Denial::new(
                    403,
                    "policy",
                    format!("the Host header names {named_host}, the request {host}"),
                ));
            }
        }
        let path = if path.starts_with('/') {
            path.to_string()
        } else {
            format!("/{path}")
        };
        // A body's end must be known before it is sent on: a chunked one
        // could carry a second request the proxy never checked.
        if values("transfer-encoding").next().is_some() {
            return Err(Denial::new(
                411,
                "malformed",
                "a request body needs a Content-Length here (no Transfer-Encoding)",
            ));
        }
        let lengths: Vec<&Vec<u8>> = values("content-length").collect();
        let body = match lengths[..] {
            [] => 0,
            [value] => std::str::from_utf8(value)
                .ok()
                .map(str::trim)
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| Denial::new(400, "malformed", "the Content-Length is not a number"))?,
            _ => {
                return Err(Denial::new(
                    400,
                    "malformed",
                    "a request with more than one Content-Length",
                ))
            }
        };
        Ok(Self {
            connect: false,
            host,
            port,
            method,
            path,
            headers,
            body,
        })
    }

    /// The head sent upstream: origin-form, proxy headers dropped, one
    /// request per connection (a second request could name another host).
    fn origin_form_head(&self) -> Vec<u8> {
        let mut out = format!("{} {} HTTP/1.1\r\n", self.method, self.path).into_bytes();
        // Hop-by-hop headers, and those a front end may route by instead
        // of `Host`.
        let hop = [
            "connection",
            "proxy-connection",
            "keep-alive",
            "proxy-authorization",
            "te",
            "upgrade",
            "forwarded",
            "x-forwarded-host",
            "x-forwarded-server",
            "x-original-host",
            "x-host",
        ];
        for (name, value) in &self.headers {
            if hop.contains(&name.as_str()) {
                continue;
            }
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        if !self.headers.iter().any(|(n, _)| n == "host") {
            out.extend_from_slice(format!("host: {}\r\n", self.host).as_bytes());
        }
        out.extend_from_slice(b"connection: close\r\n\r\n");
        out
    }
}

/// `host:port` (or `[v6]:port`); `default` when the port may be left out.
fn split_authority(authority: &str, default: Option<u16>) -> Result<(String, u16), Denial> {
    let bad = || Denial::new(400, "malformed", format!("{authority:?} is not host:port"));
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, tail) = v6.split_once(']').ok_or_else(bad)?;
        (h, tail.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(p) => p.parse::<u16>().map_err(|_| bad())?,
        None => default.ok_or_else(bad)?,
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if host.is_empty() || port == 0 {
        return Err(bad());
    }
    Ok((host, port))
}

/// Connects to the first of `addrs` that answers.
async fn connect_any(addrs: &[SocketAddr]) -> std::io::Result<TcpStream> {
    let mut last = std::io::Error::from(std::io::ErrorKind::AddrNotAvailable);
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// The addresses a request for `host:port` may go to under `policy`, or why none.
async fn dial_targets(
    policy: EgressPolicy,
    host: &str,
    port: u16,
    shared: &Policies,
) -> Result<Vec<SocketAddr>, Denial> {
    let rules = match policy {
        EgressPolicy::Packages => &shared.packages,
        EgressPolicy::Allowlist => &shared.allow,
        EgressPolicy::None | EgressPolicy::Open => {
            return Err(Denial::new(
                403,
                "policy",
                "this sandbox's egress policy admits no connection",
            ))
        }
    };
    let name = policy.name();
    if let Ok(ip) = host.parse::<IpAddr>() {
        if !rules.lists_address(ip) {
            return Err(Denial::new(
                403,
                "policy",
                format!("{host} is not allowed by the {name} policy"),
            ));
        }
        return match shared.guard.refuses(ip, rules) {
            Some(why) => Err(Denial::new(403, "address", format!("{host}: {why}"))),
            None => Ok(vec![SocketAddr::new(ip, port)]),
        };
    }
    if !super::is_host_name(host) || !rules.admits_name(host) {
        return Err(Denial::new(
            403,
            "policy",
            format!("{host} is not allowed by the {name} policy"),
        ));
    }
    let resolved: Vec<SocketAddr> =
        match tokio::time::timeout(DIAL_DEADLINE, tokio::net::lookup_host((host, port))).await {
            Ok(Ok(addrs)) => addrs.collect(),
            _ => return Err(Denial::new(502, "unreachable", format!("{host} does not resolve"))),
        };
    // Every address must pass: a name that also resolves to a refused
    // address is refused, so rebinding between answers gains nothing.
    if let Some(why) = resolved.iter().find_map(|a| shared.guard.refuses(a.ip(), rules)) {
        return Err(Denial::new(
            403,
            "address",
            format!("{host} resolves to an address refused here: {why}"),
        ));
    }
    if resolved.is_empty() {
        return Err(Denial::new(502, "unreachable", format!("{host} has no address")));
    }
    Ok(resolved)
}

/// Copies both ways until both sides are done, the connection idles past
/// [`IDLE`], or the first bytes of a `tunnel` (to its host) fail
/// [`check_server_name`]. `first` goes upstream first (after that check);
/// then at most `more` bytes of the client's (all of them when none).
async fn splice(
    client: UnixStream,
    upstream: TcpStream,
    first: Vec<u8>,
    more: Option<u64>,
    tunnel: Option<&str>,
    budget: &ByteBudget,
) -> Result<(), Denial> {
    let (mut cr, mut cw) = client.into_split();
    let (mut ur, mut uw) = upstream.into_split();
    let activity = AtomicU64::new(0);
    let epoch = Instant::now();
    let up = async {
        let mut pending = first;
        if let Some(host) = tunnel {
            pending = check_server_name(&mut cr, pending, host).await?;
        }
        if !pending.is_empty() {
            charge(budget, pending.len()).await;
            uw.write_all(&pending).await.map_err(gone)?;
        }
        match more {
            // The rest of the body; past it the client's bytes stay unread
            // (the upstream side is left open for its answer), unless the
            // client ends first.
            Some(n) => {
                let mut body = (&mut cr).take(n);
                pump(&mut body, &mut uw, budget, &activity, epoch, false).await?;
                if body.limit() > 0 {
                    let _ = uw.shutdown().await;
                }
                Ok(())
            }
            None => pump(&mut cr, &mut uw, budget, &activity, epoch, true).await,
        }
    };
    let down = pump(&mut ur, &mut cw, budget, &activity, epoch, true);
    tokio::try_join!(up, down).map(|_| ())
}

fn gone(_: std::io::Error) -> Denial {
    Denial::new(0, "closed", "")
}

/// Reads the start of a tunnel to `host` until its TLS ClientHello is
/// whole (see [`sni::client_hello`]) and refuses the tunnel unless that
/// hello asks for `host`. Nothing goes upstream before the verdict, and what
/// was read is returned to be sent on.
///
/// On every port the tunnel must open with a well-formed ClientHello: any
/// other bytes, a broken or oversized hello, are refused. A tunnel of
/// plain bytes to an admitted host could otherwise ask a shared front end
/// (a CDN that routes plain HTTP by its `Host` header) for any site it
/// serves; plain HTTP goes through the proxy as absolute-form requests,
/// whose `Host` is checked. Protocols that are not TLS (SSH) do not pass.
///
/// A hello without a server name passes only when `host` is an address
/// (clients send no SNI for addresses, RFC 6066); for a host name it is
/// refused, as clients always name a host (pip, uv, requests, curl do),
/// and a server would answer a nameless hello with a default site of its
/// own choosing. The whole hello must arrive within [`IDLE`]; at most
/// [`sni::MAX_BUFFERED`] bytes (and one read) are held meanwhile.
async fn check_server_name(r: &mut (impl AsyncRead + Unpin), mut buf: Vec<u8>, host: &str) -> Result<Vec<u8>, Denial> {
    let refused = |why: String| Denial::new(403, "sni", format!("the tunnel to {host} {why}"));
    let hello = async {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(hello) = sni::client_hello(&buf).map_err(|e| refused(e.to_string()))? {
                return Ok(hello);
            }
            debug_assert!(
                buf.len() <= sni::MAX_BUFFERED,
                "the hello's bounds hold what is buffered"
            );
            let n = r.read(&mut chunk).await.map_err(gone)?;
            if n == 0 {
                return Err(gone(std::io::ErrorKind::UnexpectedEof.into()));
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    let hello = match tokio::time::timeout(IDLE, hello).await {
        Ok(read) => read?,
        Err(_) => return Err(gone(std::io::ErrorKind::TimedOut.into())),
    };
    match hello {
        Hello::Name(name) if name == host => Ok(buf),
        Hello::Name(name) => Err(refused(format!("asked for the server {name}"))),
        Hello::NoName if host.parse::<IpAddr>().is_ok() => Ok(buf),
        Hello::NoName => Err(refused("sent a TLS ClientHello without a server name".into())),
    }
}

async fn charge(budget: &ByteBudget, n: usize) {
    if let Some(wait) = budget.charge(n as u64) {
        tokio::time::sleep(wait).await;
    }
}

/// One direction of a connection; ends at EOF, half-closing the writer
/// when `shutdown`.
async fn pump(
    r: &mut (impl AsyncRead + Unpin),
    w: &mut (impl AsyncWrite + Unpin),
    budget: &ByteBudget,
    activity: &AtomicU64,
    epoch: Instant,
    shutdown: bool,
) -> Result<(), Denial> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match tokio::time::timeout(Duration::from_secs(30), r.read(&mut buf)).await {
            Ok(Ok(0)) => break,
            Ok(Ok(n)) => n,
            Ok(Err(e)) => return Err(gone(e)),
            Err(_) => {
                let last = Duration::from_millis(activity.load(Ordering::Relaxed));
                if epoch.elapsed().saturating_sub(last) >= IDLE {
                    return Err(gone(std::io::ErrorKind::TimedOut.into()));
                }
                continue;
            }
        };
        activity.store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        charge(budget, n).await;
        // A reader that takes nothing (a sandbox that never reads its
        // socket) holds the connection no longer than an idle one.
        match tokio::time::timeout(IDLE, w.write_all(&buf[..n])).await {
            Ok(written) => written.map_err(gone)?,
            Err(_) => return Err(gone(std::io::ErrorKind::TimedOut.into())),
        }
        activity.store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
    if shutdown {
        let _ = w.shutdown().await;
    }
    Ok(())
}

/// Whether an outcome of [`serve`] is a refusal worth counting (closed and
/// unreachable connections are not).
pub fn is_denial(d: &Denial) -> bool {
    matches!(d.status, 400 | 403 | 411 | 429 | 431)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attack: a request with an admitted first `Host` and another
    /// after it, or a header a front end routes by, or a body whose end
    /// the proxy cannot know. One `Host` only, the routing headers dropped,
    /// and a body only with its length.
    #[test]
    fn a_request_names_one_host_and_a_body_of_known_length() {
        let two =
            ProxyRequest::parse(b"GET http://pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\nHost: acc-evil.example\r\n\r\n")
                .unwrap_err();
        assert_eq!(two.status, 400, "{}", two.reason);
        let chunked = ProxyRequest::parse(
            b"POST http://pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\nTransfer-Encoding: chunked\r\n\r\n",
        )
        .unwrap_err();
        assert_eq!(chunked.status, 411);
        for lengths in [
            "Content-Length: 3\r\nContent-Length: 4\r\n",
            "Content-Length: -1\r\n",
            "Content-Length: 0x10\r\n",
        ] {
            let head = format!("POST http://pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\n{lengths}\r\n");
            assert_eq!(
                ProxyRequest::parse(head.as_bytes()).unwrap_err().status,
                400,
                "{lengths}"
            );
        }
        let r = ProxyRequest::parse(
            b"POST http://pypi.org/x HTTP/1.1\r\nHost: pypi.org\r\nContent-Length: 12\r\nX-Forwarded-Host: acc-evil.example\r\nForwarded: host=acc-evil.example\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.body, 12);
        let head = String::from_utf8(r.origin_form_head()).unwrap().to_ascii_lowercase();
        assert!(!head.contains("evil"), "{head}");
        assert_eq!(
            ProxyRequest::parse(b"GET http://pypi.org/ HTTP/1.1\r\n\r\n")
                .unwrap()
                .body,
            0
        );
    }

    #[test]
    fn requests_parse_and_lose_their_proxy_headers() {
        let r = ProxyRequest::parse(b"CONNECT PyPI.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n").unwrap();
        assert!(r.connect && r.host == "pypi.org" && r.port == 443);
        let r = ProxyRequest::parse(
            b"GET http://deb.debian.org/debian/ HTTP/1.1\r\nHost: deb.debian.org\r\nProxy-Connection: keep-alive\r\n\r\n",
        )
        .unwrap();
        assert_eq!(
            (r.host.as_str(), r.port, r.path.as_str()),
            ("deb.debian.org", 80, "/debian/")
        );
        let head = String::from_utf8(r.origin_form_head()).unwrap();
        assert!(head.starts_with("GET /debian/ HTTP/1.1\r\n") && head.ends_with("connection: close\r\n\r\n"));
        assert!(!head.to_ascii_lowercase().contains("proxy-connection"));
        let spoofed = ProxyRequest::parse(b"GET http://pypi.org/ HTTP/1.1\r\nHost: evil.example\r\n\r\n").unwrap_err();
        assert_eq!(spoofed.status, 403);
        assert_eq!(ProxyRequest::parse(b"GET / HTTP/1.1\r\n\r\n").unwrap_err().status, 400);
        assert_eq!(split_authority("[::1]:8080", None).unwrap(), ("::1".to_string(), 8080));
    }

    use super::sni::tests::{records, Builder, BEFORE_EXTENSIONS};

    /// `check_server_name` for a tunnel to `host:port` whose client sends
    /// `bytes` in small writes and then waits.
    async fn check(host: &str, bytes: Vec<u8>) -> Result<Vec<u8>, Denial> {
        let (mut client, mut proxy) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            for piece in bytes.chunks(7) {
                if client.write_all(piece).await.is_err() {
                    break; // refused before the end
                }
            }
            client // kept open: the verdict may not wait for EOF
        });
        let verdict = check_server_name(&mut proxy, vec![], host).await;
        drop(proxy);
        let _ = writer.await;
        verdict
    }

    #[tokio::test]
    async fn a_split_hello_cannot_hide_a_fronted_name() {
        let message = Builder::new(Some("evil.example")).message();
        let split = records(&message, &[BEFORE_EXTENSIONS], 3);
        let denial = check("pypi.org", split).await.unwrap_err();
        assert_eq!((denial.status, denial.kind), (403, "sni"));
        assert!(denial.reason.contains("evil.example"), "{}", denial.reason);
        // The same cut naming the tunnel's host passes, every byte returned.
        let own = records(&Builder::new(Some("pypi.org")).message(), &[BEFORE_EXTENSIONS], 3);
        assert_eq!(check("pypi.org", own.clone()).await.unwrap(), own);
    }

    #[tokio::test]
    async fn port_443_takes_nothing_but_a_named_client_hello() {
        for bytes in [
            b"GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n".to_vec(),
            records(&Builder::new(Some("pypi.org")).message(), &[], 2),
            Builder::new(None).record(),
        ] {
            let denial = check("pypi.org", bytes).await.unwrap_err();
            assert_eq!((denial.status, denial.kind), (403, "sni"), "{}", denial.reason);
        }
        // Clients name no address.
        let nameless = Builder::new(None).record();
        assert_eq!(check("203.0.113.7", nameless.clone()).await.unwrap(), nameless);
    }

    #[tokio::test]
    async fn a_tunnel_of_plain_bytes_cannot_front_for_another_site() {
        // Plain HTTP on a tunnel to an admitted host, naming another site.
        let fronted = b"GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n".to_vec();
        assert_eq!(check("files.pythonhosted.org", fronted).await.unwrap_err().kind, "sni");
        let ssh = b"SSH-2.0-OpenSSH_9.2\r\n".to_vec();
        assert_eq!(check("github.com", ssh).await.unwrap_err().kind, "sni");
        let message = Builder::new(Some("evil.example")).message();
        let denial = check("pypi.org", records(&message, &[BEFORE_EXTENSIONS], 3))
            .await
            .unwrap_err();
        assert_eq!(denial.kind, "sni");
        let denial = check("pypi.org", records(&message, &[], 2)).await.unwrap_err();
        assert_eq!(denial.kind, "sni");
    }

    #[test]
    fn the_budget_holds_back_what_exceeds_a_minute() {
        let b = ByteBudget::new(1000);
        assert!(b.charge(600).is_none());
        let wait = b.charge(600).expect("over the budget");
        assert!(wait <= Duration::from_secs(60) && wait > Duration::from_secs(50));
    }
}
