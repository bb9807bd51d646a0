//! Preview links served: a request for `{label}.{preview_domain}` (on the
//! main listener or the preview port) or for `/{label}/…` on the preview
//! port reaches the sandbox's port through its agent
//! ([`sandbox_runtime::ports`]), once its token is checked. The first
//! request of a link trades the token in its query for a cookie of the
//! preview's own origin (and a redirect to the same address without it),
//! so that the page's own links and scripts work.
//!
//! A preview page is the sandbox's code: it is served from an origin that
//! is not the server's, and the server's own cookies (the web UI's key)
//! never reach it. In a cluster, a preview of a sandbox another node holds
//! is relayed to that node as it came.

mod caps;
mod kept;
mod relay;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sandbox_actors::SandboxError;
use tracing::debug;

use crate::access::preview_links::{PreviewBase, PreviewLinks, Target, COOKIE, TOKEN_PARAM};
use crate::access::signer::TokenError;
use crate::config::PreviewConfig;
use crate::http::ui::SESSION_COOKIE;
use crate::ops::route::Holder;
use crate::ops::Ops;
use caps::Caps;
use relay::{connect, drop_hop_by_hop, is_upgrade, relay, Connection, Exchange, Failure};

/// Marks a preview relayed from the node a client reached to the node that
/// holds the sandbox: that node serves it and never relays it again.
const HOP: &str = "x-mcp-sandbox-preview-hop";

/// What serving previews needs.
pub(crate) struct Previews {
    ops: Ops,
    links: PreviewLinks,
    config: PreviewConfig,
    caps: Caps,
    /// The token cookie gets `Secure` when links are HTTPS.
    secure: bool,
    /// This node's preview port, for relaying to another node's.
    preview_port: Option<u16>,
}

impl Previews {
    pub(crate) fn new(ops: Ops, links: PreviewLinks, config: &PreviewConfig, preview_port: Option<u16>) -> Arc<Self> {
        let secure = match links.base() {
            PreviewBase::Domain { scheme, .. } => scheme == "https",
            PreviewBase::Port { origin } => origin.starts_with("https://"),
        };
        Arc::new(Self {
            ops,
            links,
            config: config.clone(),
            caps: Caps::new(config),
            secure,
            preview_port,
        })
    }
}

/// The main listener's first layer: a request for a host under the
/// preview domain is a preview, which no other route or check of the
/// server's sees.
pub(crate) async fn dispatch(State(previews): State<Option<Arc<Previews>>>, req: Request, next: Next) -> Response {
    match previews {
        Some(p) if p.links.is_preview_host(host_of(&req)) => serve(State(p), req).await,
        _ => next.run(req).await,
    }
}

/// Serves one preview request.
pub(crate) async fn serve(State(p): State<Arc<Previews>>, req: Request) -> Response {
    let path = req.uri().path_and_query().map_or("/", |pq| pq.as_str()).to_string();
    let Some((target, inner)) = p.links.target(host_of(&req), &path) else {
        return page(
            StatusCode::NOT_FOUND,
            "No preview here. A preview link comes from expose_port and carries its own token.",
        );
    };
    let (query_token, inner) = take_token(&inner);
    let token = match &query_token {
        Some(t) => Some(t.clone()),
        None => cookie_tokens(&req)
            .into_iter()
            .find(|t| p.links.verify(target, t).is_ok()),
    };
    let Some(token) = token else {
        return page(
            StatusCode::UNAUTHORIZED,
            "This preview needs its link's token: open the link expose_port gave (it ends in ?mcp_preview_token=…).",
        );
    };
    let expiry = match p.links.verify(target, &token) {
        Ok(expiry) => expiry,
        Err(TokenError::Expired) => {
            return page(
                StatusCode::FORBIDDEN,
                "This preview link has expired. Ask for a new one (expose_port gives a fresh link).",
            )
        }
        Err(_) => {
            return page(
                StatusCode::FORBIDDEN,
                "This link's token is not for this sandbox and port.",
            )
        }
    };
    // A browser opening the link: the token becomes the origin's cookie,
    // and the address loses it (it would leak through history and Referer).
    if query_token.is_some() && req.method() == axum::http::Method::GET && !is_upgrade(req.headers()) {
        // One leading slash: `//host` or `/\host` would leave the origin.
        let inner = format!("/{}", inner.trim_start_matches(['/', '\\']));
        let location = match p.links.base() {
            PreviewBase::Domain { .. } => inner,
            PreviewBase::Port { .. } => format!("/{}{inner}", target.label()),
        };
        let max_age = expiry.saturating_sub(crate::access::signer::unix_now());
        let cookie = format!(
            "{COOKIE}={token}; Path={}; HttpOnly; SameSite=Lax; Max-Age={max_age}{}",
            p.links.cookie_path(target),
            if p.secure { "; Secure" } else { "" }
        );
        let mut r = StatusCode::SEE_OTHER.into_response();
        let h = r.headers_mut();
        h.insert(
            header::LOCATION,
            HeaderValue::from_str(&location).unwrap_or(HeaderValue::from_static("/")),
        );
        h.insert(
            header::SET_COOKIE,
            HeaderValue::from_str(&cookie).expect("a token is header-safe"),
        );
        h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        return r;
    }
    forward(&p, target, inner, req).await
}

/// Sends the request on to the sandbox's port (or the node holding it).
async fn forward(p: &Previews, target: Target, inner: String, mut req: Request) -> Response {
    let max_request = p.config.max_request_mb * 1024 * 1024;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_request) {
        return page(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("Requests to a preview carry at most {} MB.", p.config.max_request_mb),
        );
    }
    let Some((permit, share)) = p.caps.open(target.sandbox) else {
        return page(
            StatusCode::TOO_MANY_REQUESTS,
            &format!(
                "This sandbox already has {} preview connections open; try again when some have finished.",
                p.config.max_connections_per_sandbox
            ),
        );
    };
    let exchange = Exchange {
        share,
        permit,
        response_timeout: Duration::from_secs(p.config.response_timeout_seconds),
        idle: Duration::from_secs(p.config.idle_timeout_seconds),
        max_request,
    };
    let relayed = req.headers().contains_key(HOP);
    let holder = match relayed {
        true => Holder::Here,
        false => p.ops.holder_of(target.sandbox, |_| true).await.unwrap_or(Holder::Here),
    };
    if let Holder::Node { name, url } = holder {
        // As it came (its token, its path); the holder checks it again.
        req.headers_mut().insert(HOP, HeaderValue::from_static("1"));
        let address = node_address(&url, p.preview_port);
        let io = match tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(&address)).await {
            Ok(Ok(io)) => io,
            _ => {
                return page(
                    StatusCode::BAD_GATEWAY,
                    &format!("Node {name}, which holds this sandbox, does not answer; try again in a minute."),
                )
            }
        };
        return answer(match connect(io).await {
            Ok(sender) => relay(sender, Connection::Once, req, exchange).await,
            Err(e) => Err(e.into()),
        });
    }
    let upgrade = is_upgrade(req.headers());
    let (scheme, prefix) = match p.links.base() {
        PreviewBase::Domain { scheme, .. } => (scheme.as_str(), None),
        PreviewBase::Port { origin } => (origin.split("://").next().unwrap_or("http"), Some(target.label())),
    };
    prepare(&mut req, &inner, upgrade, scheme, prefix);
    let (req, exchange) = match exchange.share.kept.take(target.port).filter(|_| !upgrade) {
        Some(sender) => {
            // A kept connection skips the agent, not the sandbox's say:
            // the port still exposed, the sandbox not going.
            if let Err(e) = p.ops.sandboxes.let_preview_through(target.sandbox, target.port).await {
                return refused(target, &e);
            }
            match relay(sender, Connection::Kept(target.port), req, exchange).await {
                Err(Failure::Stale(back)) => *back,
                done => return answer(done),
            }
        }
        None => (req, exchange),
    };
    let opened = {
        let _turn = exchange.share.opening.acquire().await;
        p.ops.sandboxes.open_preview(target.sandbox, target.port).await
    };
    let io = match opened {
        Ok(io) => io,
        Err(e) => return refused(target, &e),
    };
    let connection = match upgrade {
        true => Connection::Once,
        false => Connection::Fresh(target.port),
    };
    answer(match connect(io).await {
        Ok(sender) => relay(sender, connection, req, exchange).await,
        Err(e) => Err(e.into()),
    })
}

/// The request as the app receives it: its path without the preview's
/// prefix and token, no hop-by-hop header, none of the server's cookies,
/// and where it came from in `X-Forwarded-*`.
fn prepare(req: &mut Request, inner: &str, upgrade: bool, scheme: &str, prefix: Option<String>) {
    let client = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    let host = host_of(req).to_string();
    if let Ok(uri) = inner.parse() {
        *req.uri_mut() = uri;
    }
    let headers = req.headers_mut();
    drop_hop_by_hop(headers, upgrade);
    let kept: Vec<String> = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|c| {
            let name = c.split('=').next().unwrap_or_default();
            !c.is_empty() && name != COOKIE && name != SESSION_COOKIE
        })
        .map(str::to_string)
        .collect();
    headers.remove(header::COOKIE);
    if let Ok(v) = HeaderValue::from_str(&kept.join("; ")) {
        if !kept.is_empty() {
            headers.insert(header::COOKIE, v);
        }
    }
    for name in [
        "x-forwarded-for",
        "x-forwarded-host",
        "x-forwarded-proto",
        "x-forwarded-prefix",
        "forwarded",
    ] {
        headers.remove(name);
    }
    let forwarded = [
        ("x-forwarded-for", client.map(|ip| ip.to_string())),
        ("x-forwarded-host", Some(host)),
        ("x-forwarded-proto", Some(scheme.to_string())),
        ("x-forwarded-prefix", prefix.map(|label| format!("/{label}"))),
    ];
    for (name, value) in forwarded {
        if let Some(v) = value.and_then(|v| HeaderValue::from_str(&v).ok()) {
            headers.insert(name, v);
        }
    }
}

fn answer(relayed: Result<Response<Body>, Failure>) -> Response {
    match relayed {
        Ok(r) => r,
        Err(Failure::Relay(e)) => page(e.status(), &format!("The app in the sandbox did not answer: {e}.")),
        // Only a kept connection gives its request back, and its caller
        // opens a fresh one for it.
        Err(Failure::Stale(..)) => page(
            StatusCode::BAD_GATEWAY,
            "The app in the sandbox closed the connection; try again.",
        ),
    }
}

/// Why no connection to the port could be made, for a person.
fn refused(target: Target, e: &SandboxError) -> Response {
    let (status, message) = match e {
        SandboxError::Asleep { why, .. } => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("Sandbox {} is hibernated: {why}", target.sandbox),
        ),
        SandboxError::NotFound(_) | SandboxError::Ended { .. } => (
            StatusCode::NOT_FOUND,
            format!("Sandbox {} no longer exists.", target.sandbox),
        ),
        SandboxError::InvalidArgument(why) if why.contains("not exposed") => (
            StatusCode::NOT_FOUND,
            format!(
                "Port {} of sandbox {} is not exposed (any more).",
                target.port, target.sandbox
            ),
        ),
        SandboxError::InvalidArgument(why) => (
            StatusCode::BAD_GATEWAY,
            format!(
                "Nothing answers on port {} in sandbox {} ({why}): the app is not running or listens on another \
                 port. Start it with start_process.",
                target.port, target.sandbox
            ),
        ),
        other => (
            StatusCode::BAD_GATEWAY,
            format!("Sandbox {} could not be reached: {other}.", target.sandbox),
        ),
    };
    debug!(sandbox = %target.sandbox, port = target.port, %message, "preview refused");
    page(status, &message)
}

/// A short plain-text page: what a person opening a link reads.
fn page(status: StatusCode, message: &str) -> Response {
    let mut r = (status, format!("{message}\n")).into_response();
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn host_of(req: &Request) -> &str {
    req.headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().host())
        .unwrap_or_default()
}

/// The token a link's query carries, and the path and query without it.
fn take_token(path: &str) -> (Option<String>, String) {
    let Some((path_only, query)) = path.split_once('?') else {
        return (None, path.to_string());
    };
    let mut token = None;
    let rest: Vec<&str> = query
        .split('&')
        .filter(
            |pair| match pair.strip_prefix(TOKEN_PARAM).and_then(|r| r.strip_prefix('=')) {
                Some(t) => {
                    token = Some(t.to_string());
                    false
                }
                None => true,
            },
        )
        .collect();
    match rest.is_empty() {
        true => (token, path_only.to_string()),
        false => (token, format!("{path_only}?{}", rest.join("&"))),
    }
}

/// Every value of the token cookie the request carries.
fn cookie_tokens(req: &Request) -> Vec<String> {
    req.headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().strip_prefix(COOKIE)?.strip_prefix('='))
        .map(str::to_string)
        .collect()
}

/// Where another node serves previews: its own listener for a preview
/// domain (the node channel's address), or its preview port.
fn node_address(url: &str, preview_port: Option<u16>) -> String {
    let authority = url
        .split("://")
        .nth(1)
        .unwrap_or(url)
        .split('/')
        .next()
        .unwrap_or_default();
    match preview_port {
        Some(port) => {
            let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
            format!("{host}:{port}")
        }
        None => authority.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_leaves_the_query_and_the_rest_stays() {
        assert_eq!(
            take_token("/a?mcp_preview_token=1.x"),
            (Some("1.x".into()), "/a".into())
        );
        assert_eq!(
            take_token("/a?b=1&mcp_preview_token=1.x&c=2"),
            (Some("1.x".into()), "/a?b=1&c=2".into())
        );
        assert_eq!(take_token("/a?b=1"), (None, "/a?b=1".into()));
        assert_eq!(
            take_token("/a?mcp_preview_token_x=1"),
            (None, "/a?mcp_preview_token_x=1".into())
        );
    }

    #[test]
    fn another_node_is_reached_at_its_preview_listener() {
        assert_eq!(node_address("http://10.0.0.2:8181", Some(8182)), "10.0.0.2:8182");
        assert_eq!(node_address("http://10.0.0.2:8181/", None), "10.0.0.2:8181");
    }
}
