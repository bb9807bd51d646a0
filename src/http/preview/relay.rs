//! One preview exchange over a connection to the sandbox's port (fresh or
//! kept from an earlier exchange) or to the node that holds the sandbox:
//! the request sent, the answer streamed back, and an upgraded connection
//! (a WebSocket) carried both ways. Every body is pumped through the sandbox's byte bucket a frame at
//! a time, so nothing large sits in memory, and every wait on the sandbox
//! has a deadline: the answer's head, and each frame (the idle timeout).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, Request, Response, StatusCode};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio_stream::wrappers::ReceiverStream;

use crate::access::connections::ConnectionPlace;
use crate::http::preview::caps::Sandbox;
use crate::http::preview::kept::{keep_when_ready, Sender};

/// What a frame of a body may be at most when relayed as an upgraded
/// connection's chunk.
const CHUNK: usize = 64 * 1024;

/// What an exchange may use.
pub(crate) struct Exchange {
    pub share: Arc<Sandbox>,
    /// Held until the exchange ends (its answer's body, or the upgraded
    /// connection, is over).
    pub permit: OwnedSemaphorePermit,
    pub response_timeout: Duration,
    pub idle: Duration,
    pub max_request: u64,
}

/// Why an exchange failed before an answer came.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RelayError {
    #[error("the connection to the app failed: {0}")]
    Handshake(#[source] hyper::Error),
    #[error("the app closed the connection or sent something other than HTTP: {0}")]
    Exchange(#[source] hyper::Error),
    #[error("the app did not begin its answer within {0:?}")]
    TimedOut(Duration),
}

impl RelayError {
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            RelayError::TimedOut(_) => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::BAD_GATEWAY,
        }
    }
}

/// What a connection is to an exchange, and becomes after it.
#[derive(Clone, Copy)]
pub(crate) enum Connection {
    /// Used for this exchange only (to another node, or for an upgrade).
    Once,
    /// Opened for this exchange with the port, and kept after it.
    Fresh(u16),
    /// Kept from an earlier exchange with the port, and kept again: a
    /// request it turns out unable to carry is given back for a fresh one.
    Kept(u16),
}

/// Why an exchange ended without an answer.
pub(crate) enum Failure {
    Relay(RelayError),
    /// The kept connection had closed before it carried the request (or
    /// under a request that may be sent again): here they are back.
    Stale(Box<(Request<Body>, Exchange)>),
}

impl From<RelayError> for Failure {
    fn from(e: RelayError) -> Self {
        Failure::Relay(e)
    }
}

/// HTTP/1.1 over a fresh connection to an app or a node.
pub(crate) async fn connect<S>(io: S) -> Result<Sender, RelayError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(RelayError::Handshake)?;
    // Ends when the sender is dropped and its last exchange is over (the
    // answer read, or the upgraded connection handed over), or the app closes.
    tokio::spawn(conn.with_upgrades());
    Ok(sender)
}

/// Sends `req` over `sender` and answers with the app's response.
pub(crate) async fn relay(
    mut sender: Sender,
    connection: Connection,
    mut req: Request<Body>,
    ex: Exchange,
) -> Result<Response<Body>, Failure> {
    let again = match connection {
        Connection::Kept(_) => resendable(&req),
        _ => None,
    };
    let upgrade = is_upgrade(req.headers()).then(|| hyper::upgrade::on(&mut req));
    let place = req.extensions().get::<ConnectionPlace>().cloned();
    let (parts, body) = req.into_parts();
    let body = match http_body::Body::is_end_stream(&body) {
        true => Body::empty(),
        false => pump(body, ex.share.clone(), ex.idle, Some(ex.max_request), None),
    };
    let sent = sender.try_send_request(Request::from_parts(parts, body));
    let mut answer = match tokio::time::timeout(ex.response_timeout, sent).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(mut e)) => {
            let closed = e.error().is_canceled() || e.error().is_incomplete_message();
            return match (connection, e.take_message().or(again.filter(|_| closed))) {
                (Connection::Kept(_), Some(req)) => Err(Failure::Stale(Box::new((req, ex)))),
                _ => Err(RelayError::Exchange(e.into_error()).into()),
            };
        }
        Err(_) => return Err(RelayError::TimedOut(ex.response_timeout).into()),
    };
    if answer.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client) = upgrade {
            let app = hyper::upgrade::on(&mut answer);
            let Exchange {
                share, permit, idle, ..
            } = ex;
            tokio::spawn(async move {
                let (_permit, _place) = (permit, place);
                if let (Ok(client), Ok(app)) = (client.await, app.await) {
                    splice(TokioIo::new(client), TokioIo::new(app), &share, idle).await;
                }
            });
            let (parts, _) = answer.into_parts();
            return Ok(Response::from_parts(parts, Body::empty()));
        }
    }
    let (mut parts, body) = answer.into_parts();
    drop_hop_by_hop(&mut parts.headers, false);
    drop_server_cookies(&mut parts.headers);
    let after = match connection {
        Connection::Fresh(port) | Connection::Kept(port) => Some(After {
            share: ex.share.clone(),
            port,
            sender,
        }),
        Connection::Once => None,
    };
    let body = pump(body, ex.share, ex.idle, None, Some((ex.permit, after)));
    Ok(Response::from_parts(parts, body))
}

/// A copy of a request that may be sent again when a kept connection
/// closed under it: one that changes nothing and carries no body.
fn resendable(req: &Request<Body>) -> Option<Request<Body>> {
    let safe = matches!(req.method().as_str(), "GET" | "HEAD" | "OPTIONS");
    if !safe || !http_body::Body::is_end_stream(req.body()) || is_upgrade(req.headers()) {
        return None;
    }
    let mut copy = Request::new(Body::empty());
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.version_mut() = req.version();
    *copy.headers_mut() = req.headers().clone();
    if let Some(place) = req.extensions().get::<ConnectionPlace>() {
        copy.extensions_mut().insert(place.clone());
    }
    Some(copy)
}

/// The connection an answer came over, kept for the port once the answer
/// has been read to its end.
struct After {
    share: Arc<Sandbox>,
    port: u16,
    sender: Sender,
}

/// A body passed on a frame at a time through the sandbox's bucket, ending
/// with an error when no frame comes for `idle` or, for a request, when it
/// grows past `limit`. An answer's exchange holds its permit until the body
/// ends, and leaves its connection to be kept when it ended whole.
fn pump<B>(
    body: B,
    share: Arc<Sandbox>,
    idle: Duration,
    limit: Option<u64>,
    exchange: Option<(OwnedSemaphorePermit, Option<After>)>,
) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::fmt::Display + Send,
{
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(2);
    tokio::spawn(async move {
        let (_permit, after) = exchange.map_or((None, None), |(p, a)| (Some(p), a));
        let mut body = std::pin::pin!(body);
        let mut total = 0u64;
        let fail = |why: String| Err(std::io::Error::other(why));
        loop {
            let frame = match tokio::time::timeout(idle, body.frame()).await {
                Err(_) => {
                    let _ = tx.send(fail(format!("no data for {} s", idle.as_secs()))).await;
                    return;
                }
                Ok(None) => {
                    if let Some(After { share, port, sender }) = after {
                        keep_when_ready(share, port, sender);
                    }
                    return;
                }
                Ok(Some(Err(e))) => {
                    let _ = tx.send(fail(e.to_string())).await;
                    return;
                }
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else { continue };
            total += data.len() as u64;
            if limit.is_some_and(|l| total > l) {
                let _ = tx
                    .send(fail("the request body is larger than preview.max_request_mb".into()))
                    .await;
                return;
            }
            share.pass(data.len()).await;
            // A reader that takes nothing for `idle` is gone.
            if !matches!(tokio::time::timeout(idle, tx.send(Ok(data))).await, Ok(Ok(()))) {
                return;
            }
        }
    });
    Body::from_stream(ReceiverStream::new(rx))
}

/// Carries bytes both ways until both ends closed, nothing passed either
/// way for `idle`, or one end took nothing written to it for `idle`.
async fn splice<A, B>(a: A, b: B, share: &Sandbox, idle: Duration)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut ar, mut aw) = tokio::io::split(a);
    let (mut br, mut bw) = tokio::io::split(b);
    let (mut ab, mut ba) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
    let (mut a_open, mut b_open) = (true, true);
    while a_open || b_open {
        tokio::select! {
            read = ar.read(&mut ab), if a_open => match read {
                Ok(n) if n > 0 => {
                    share.pass(n).await;
                    if !matches!(tokio::time::timeout(idle, bw.write_all(&ab[..n])).await, Ok(Ok(()))) { return; }
                }
                _ => { a_open = false; let _ = bw.shutdown().await; }
            },
            read = br.read(&mut ba), if b_open => match read {
                Ok(n) if n > 0 => {
                    share.pass(n).await;
                    if !matches!(tokio::time::timeout(idle, aw.write_all(&ba[..n])).await, Ok(Ok(()))) { return; }
                }
                _ => { b_open = false; let _ = aw.shutdown().await; }
            },
            () = tokio::time::sleep(idle) => return,
        }
    }
}

/// Removes the app's `Set-Cookie`s that would reach beyond its own origin
/// (a `Domain` attribute) or name a cookie of the server's (the web UI's
/// key, a preview token): cookies ignore ports, so on a preview port they
/// would land on the server's host.
fn drop_server_cookies(headers: &mut HeaderMap) {
    let kept: Vec<_> = headers
        .get_all(header::SET_COOKIE)
        .iter()
        .filter(|v| {
            let text = v.to_str().unwrap_or_default().to_ascii_lowercase();
            let name = text.split('=').next().unwrap_or_default().trim();
            let servers = name.starts_with("mcp_") || name.starts_with("__host-mcp_");
            let wider = text.split(';').any(|attr| attr.trim().starts_with("domain"));
            !(servers || wider)
        })
        .cloned()
        .collect();
    headers.remove(header::SET_COOKIE);
    for v in kept {
        headers.append(header::SET_COOKIE, v);
    }
}

/// Whether a request asks to switch protocols (a WebSocket).
pub(crate) fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("upgrade")))
}

/// Removes the headers that describe one hop, not the message (and those
/// `Connection` names), keeping an upgrade's pair when `upgrade`.
pub(crate) fn drop_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::try_from(t.trim()).ok())
        .filter(|n| !(upgrade && n == header::UPGRADE))
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "proxy-authorization",
    ] {
        headers.remove(name);
    }
    if !upgrade {
        headers.remove(header::CONNECTION);
        headers.remove(header::UPGRADE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PreviewConfig;
    use crate::http::preview::caps::Caps;

    /// An app that answers a connection's first request and closes it
    /// under the second, unanswered, as an app whose keep-alive ran out.
    async fn closes_under_the_second_request() -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut io, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = io.read(&mut buf).await;
                    let _ = io.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await;
                    let _ = io.read(&mut buf).await;
                });
            }
        });
        at
    }

    async fn used_once(at: std::net::SocketAddr) -> Sender {
        let mut sender = connect(tokio::net::TcpStream::connect(at).await.unwrap())
            .await
            .unwrap();
        drop(sender.send_request(Request::new(Body::empty())).await.unwrap());
        sender.ready().await.unwrap();
        sender
    }

    fn exchange(caps: &Caps) -> Exchange {
        let (permit, share) = caps.open(uuid::Uuid::new_v4()).unwrap();
        Exchange {
            share,
            permit,
            response_timeout: Duration::from_secs(5),
            idle: Duration::from_secs(5),
            max_request: 1024,
        }
    }

    #[tokio::test]
    async fn a_kept_connection_closed_under_a_get_gives_it_back_but_never_a_post() {
        let at = closes_under_the_second_request().await;
        let caps = Caps::new(&PreviewConfig::default());
        let get = Request::get("/page").body(Body::empty()).unwrap();
        match relay(used_once(at).await, Connection::Kept(8000), get, exchange(&caps)).await {
            Err(Failure::Stale(back)) => assert_eq!(back.0.uri(), "/page"),
            Err(Failure::Relay(e)) => panic!("not given back: {e}"),
            Ok(r) => panic!("answered: {:?}", r.status()),
        }
        // A request that may change something is never sent twice.
        let post = Request::post("/order").body(Body::from("one")).unwrap();
        assert!(matches!(
            relay(used_once(at).await, Connection::Kept(8000), post, exchange(&caps)).await,
            Err(Failure::Relay(RelayError::Exchange(_)))
        ));
        // Nor is one over a fresh connection.
        let get = Request::get("/page").body(Body::empty()).unwrap();
        assert!(matches!(
            relay(used_once(at).await, Connection::Fresh(8000), get, exchange(&caps)).await,
            Err(Failure::Relay(_))
        ));
    }

    #[test]
    fn hop_by_hop_headers_go_and_an_upgrade_keeps_its_pair() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, "keep-alive, x-secret, Upgrade".parse().unwrap());
        h.insert("x-secret", "1".parse().unwrap());
        h.insert(header::UPGRADE, "websocket".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert(header::CONTENT_TYPE, "text/plain".parse().unwrap());
        assert!(is_upgrade(&h));
        let mut upgrading = h.clone();
        drop_hop_by_hop(&mut upgrading, true);
        assert!(upgrading.contains_key(header::UPGRADE) && upgrading.contains_key(header::CONNECTION));
        assert!(!upgrading.contains_key("x-secret") && !upgrading.contains_key("keep-alive"));
        drop_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1, "{h:?}");
    }

    #[test]
    fn an_app_sets_no_cookie_of_the_servers_nor_for_a_wider_domain() {
        let mut h = HeaderMap::new();
        for c in [
            "mcp_sandbox_key=stolen; Path=/ui",
            "own=1; Path=/",
            "wide=1; Domain=example.com",
            "mcp_preview=x",
        ] {
            h.append(header::SET_COOKIE, c.parse().unwrap());
        }
        drop_server_cookies(&mut h);
        let left: Vec<_> = h.get_all(header::SET_COOKIE).iter().collect();
        assert_eq!(left, ["own=1; Path=/"]);
    }
}
