//! The HTTP front end on one port: MCP over Streamable HTTP (`/mcp`) and the
//! legacy HTTP+SSE transport (`/sse`, `/messages`), the REST API (`/api`)
//! and the web UI (`/ui`) on top of it, artifacts (`/results`), `/health`
//! and `/metrics`, guest keys (`/api/guest`). Every request passes one
//! guard (Host and Origin, the client's address behind trusted proxies, who
//! is asking, CSRF for browser sessions, rate limits); handlers then only
//! parse and call the shared operations.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Json, Router};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use crate::auth::{Identified, LinkSigner};
use crate::caller::Caller;
use crate::client_ip::{is_forwarded, ClientIp, TrustedProxies};
use crate::config::Config;
use crate::health::Health;
use crate::mcp_sessions::{self, CappedSessions};
use crate::ops::{Ops, MAX_CODE_BYTES};
use crate::sessions::Sessions;
use crate::sse::{self, SseSessions};
use crate::tools::SandboxServer;
use crate::{api, artifacts, guest, health, ui};

/// Largest request body: the largest `code`, JSON-escaped, with room to spare.
pub const MAX_BODY_BYTES: usize = 8 * MAX_CODE_BYTES;

/// The Streamable HTTP service, with sessions under the server's caps.
pub type McpService = StreamableHttpService<SandboxServer, CappedSessions<LocalSessionManager>>;

#[derive(Clone)]
pub struct AppState {
    pub ops: Ops,
    pub sse: SseSessions,
    /// Open MCP sessions of both transports, under their caps.
    pub sessions: Sessions,
    pub mcp: McpService,
    pub health: Arc<Health>,
    /// Cancelled when the server stops: long-lived streams end with it.
    pub shutdown: CancellationToken,
    /// Set when authentication is on: artifact links must carry its tokens.
    pub signer: Option<LinkSigner>,
    /// Session cookies get `Secure` when the public URL is HTTPS.
    pub secure_cookies: bool,
    guard: Arc<Guard>,
}

impl AppState {
    pub fn auth(&self) -> bool {
        self.guard.auth
    }
}

/// DNS-rebinding protection (which `Host` and `Origin` values are
/// accepted), and who the client is behind trusted proxies.
#[derive(Debug)]
struct Guard {
    /// Host names accepted besides IP literals and `localhost`, which a
    /// rebinding attack cannot use (it needs a name its attacker resolves).
    hosts: Vec<String>,
    origins: Vec<String>,
    auth: bool,
    proxies: TrustedProxies,
}

/// `host:port` → `host` (IPv6 literals keep their brackets).
fn host_only(authority: &str) -> &str {
    if authority.starts_with('[') {
        return authority.split_inclusive(']').next().unwrap_or(authority);
    }
    authority.split(':').next().unwrap_or(authority)
}

/// Whether `host` (from a `Host` header) is an IP literal or `localhost`.
fn is_address_host(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost") || bare.parse::<std::net::IpAddr>().is_ok()
}

impl Guard {
    fn new(config: &Config, proxies: TrustedProxies) -> Self {
        let port = config.server.port;
        let public = config.public_url();
        let public_host = public
            .split("://")
            .nth(1)
            .unwrap_or("")
            .split('/')
            .next()
            .unwrap_or("")
            .to_string();
        let mut hosts: Vec<String> = config
            .server
            .allowed_hosts
            .iter()
            .map(|h| host_only(h).to_string())
            .collect();
        hosts.push(host_only(&public_host).to_string());
        let mut origins = config.server.allowed_origins.clone();
        origins.extend([
            public.clone(),
            format!("http://localhost:{port}"),
            format!("http://127.0.0.1:{port}"),
        ]);
        Self {
            hosts,
            origins,
            auth: config.auth.enabled,
            proxies,
        }
    }

    fn check_host_and_origin(&self, headers: &HeaderMap) -> Result<(), &'static str> {
        let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
        let host = header(header::HOST).map(host_only).unwrap_or("");
        if !is_address_host(host) && !self.hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) {
            return Err("this Host is not served here (DNS-rebinding protection); add it to server.allowed_hosts");
        }
        if let Some(origin) = header(header::ORIGIN) {
            if !self
                .origins
                .iter()
                .any(|o| o.trim_end_matches('/').eq_ignore_ascii_case(origin))
            {
                return Err("this Origin is not allowed; add it to server.allowed_origins");
            }
        }
        Ok(())
    }
}

pub fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}

/// A refusal to hold more for a client: 429 or 503, `Retry-After` and a
/// JSON message.
pub fn refusal(status: StatusCode, retry_after_seconds: u64, message: &str) -> Response {
    let mut r = error(status, message);
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_seconds.max(1)));
    r
}

const HOW_TO_AUTHENTICATE: &str =
    "an API key is required: send it as 'Authorization: Bearer <key>' or 'X-API-Key: <key>' \
     (clients that can only set a URL may add ?api_key=<key> to /sse)";

/// A key a request presents, and whether it came in the browser session
/// cookie (such requests must prove they come from the UI's own pages).
struct Presented {
    key: String,
    from_cookie: bool,
}

/// The key a request presents, if any. The query form is accepted on `/sse`
/// only, where some clients cannot set headers; the session cookie on the
/// UI and its API only.
fn presented_key(req: &Request) -> Option<Presented> {
    let headers = req.headers();
    let header_key = |k: &str| {
        Some(Presented {
            key: k.trim().to_string(),
            from_cookie: false,
        })
    };
    if let Some(v) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        return v.strip_prefix("Bearer ").and_then(header_key);
    }
    if let Some(v) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return header_key(v);
    }
    let path = req.uri().path();
    if path == "/sse" {
        return req.uri().query().and_then(|q| {
            q.split('&')
                .find_map(|kv| kv.strip_prefix("api_key="))
                .map(|k| percent_encoding::percent_decode_str(k).decode_utf8_lossy().into_owned())
                .and_then(|k| header_key(&k))
        });
    }
    if is_ui(path) || path.starts_with("/api/") {
        return ui::session_key(headers).map(|key| Presented { key, from_cookie: true });
    }
    None
}

fn is_ui(path: &str) -> bool {
    path == "/ui" || path.starts_with("/ui/")
}

/// Routes a request may reach without a key when authentication is on:
/// artifacts (their links carry a token), SSE messages (the session id from
/// the authenticated stream is the capability), the liveness check, the UI
/// (whose pages offer the sign-in form), and guest key issuance.
fn keyless(path: &str) -> bool {
    path.starts_with("/results/")
        || path.starts_with("/messages")
        || path == "/health"
        || is_ui(path)
        || path == GUEST_ROUTE
}

/// Where guest keys are handed out.
const GUEST_ROUTE: &str = "/api/guest";

const UNTRUSTED_PROXY: &str = "this request came through a proxy (it carries Forwarded or X-Forwarded-For) \
     that the server does not trust, and without authentication the server would take all of that proxy's \
     visitors for one tenant: add the proxy to server.trusted_proxies, or turn on authentication";

/// Whether a request authenticated by the session cookie carries the
/// session's CSRF token. Safe methods change nothing; the UI's own forms
/// (sign-in and sign-out) check the token they post themselves.
fn csrf_ok(app: &AppState, req: &Request, key: &str) -> bool {
    if req.method().is_safe() || is_ui(req.uri().path()) {
        return true;
    }
    let token = req.headers().get(ui::CSRF_HEADER).and_then(|v| v.to_str().ok());
    match (&app.signer, token) {
        (Some(signer), Some(token)) => signer.verify_csrf(key, token),
        _ => false,
    }
}

async fn guard(
    State(app): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    mut req: Request,
    next: Next,
) -> Response {
    if let Err(why) = app.guard.check_host_and_origin(req.headers()) {
        return error(StatusCode::FORBIDDEN, why);
    }
    let path = req.uri().path().to_string();
    // Probes are answered whoever sends them, however fast.
    if path == "/health" {
        return next.run(req).await;
    }
    let client = match app.guard.proxies.client(peer.ip(), req.headers()) {
        Ok(ip) => ip,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    // Without keys the tenant is the address: one that stands for a whole
    // proxy's visitors would merge them silently.
    if !app.guard.auth && !app.guard.proxies.trusts(peer.ip()) && is_forwarded(req.headers()) {
        return error(StatusCode::FORBIDDEN, UNTRUSTED_PROXY);
    }
    req.extensions_mut().insert(ClientIp(client));
    let caller = if app.guard.auth {
        match presented_key(&req) {
            Some(p) => {
                let identified = app.ops.limits.keys().identify(&p.key);
                match identified.caller() {
                    Some(_) if p.from_cookie && !csrf_ok(&app, &req, &p.key) => {
                        return error(
                            StatusCode::FORBIDDEN,
                            "this request needs the session's CSRF token (X-CSRF-Token); reload the page",
                        )
                    }
                    Some(c) => Some(c),
                    // A stale session cookie: the UI shows its sign-in form.
                    None if p.from_cookie && is_ui(&path) => None,
                    None => {
                        let why = match identified {
                            Identified::Revoked => "this API key has been revoked",
                            Identified::Expired => "this guest key has expired; get a new one with POST /api/guest",
                            _ => "unknown API key",
                        };
                        return error(StatusCode::UNAUTHORIZED, why);
                    }
                }
            }
            None if keyless(&path) => None,
            None => {
                let mut r = error(StatusCode::UNAUTHORIZED, HOW_TO_AUTHENTICATE);
                r.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                return r;
            }
        }
    } else {
        Some(Caller::anonymous(client))
    };
    // A message to an SSE session is charged to the tenant that opened it.
    let tenant = match &caller {
        Some(c) => c.owner.clone(),
        None => path
            .starts_with("/messages")
            .then(|| sse::session_id(req.uri().query()).and_then(|id| app.sse.caller_of(&id)))
            .flatten()
            .map(|c| c.owner)
            .unwrap_or_else(|| format!("ip:{client}")),
    };
    if let Err(wait) = app.ops.limits.check_request(client, &tenant) {
        app.ops.metrics.rate_limited();
        tracing::debug!(client = %client, "request rate limited");
        return refusal(
            StatusCode::TOO_MANY_REQUESTS,
            wait.seconds(),
            &format!("rate limit reached; retry in {} s", wait.seconds()),
        );
    }
    if let Some(c) = caller {
        req.extensions_mut().insert(c);
    }
    next.run(req).await
}

/// `/metrics`: open without authentication; with it, administrators only
/// (the figures span every tenant).
async fn metrics(State(app): State<AppState>, caller: Option<axum::Extension<Caller>>) -> Response {
    if app.auth() && !caller.is_some_and(|c| c.admin) {
        return error(
            StatusCode::FORBIDDEN,
            "metrics are for administrator keys ([auth] admin_keys)",
        );
    }
    let stats = app.ops.sandboxes.stats().await;
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        app.ops.metrics.render(&stats),
    )
        .into_response()
}

pub fn router(config: &Config, ops: Ops, signer: Option<LinkSigner>, shutdown: CancellationToken) -> Router {
    let proxies = TrustedProxies::parse(&config.server.trusted_proxies).expect("validated with the configuration");
    let sessions = Sessions::new(&config.limits, ops.metrics.clone());
    sessions.spawn_sweeper(shutdown.clone());
    let mut mcp_config = StreamableHttpServerConfig::default();
    mcp_config.cancellation_token = shutdown.clone();
    mcp_config.max_request_body_bytes = MAX_BODY_BYTES;
    // Host and Origin are checked for every route by `guard`.
    mcp_config.allowed_hosts = vec![];
    // Idle sessions are closed by `Sessions`, which tells a running call
    // from silence; rmcp's own idle timer would end a long call.
    let mut local = LocalSessionManager::default();
    local.session_config.keep_alive = None;
    let handler_ops = ops.clone();
    let mcp = StreamableHttpService::new(
        move || Ok(SandboxServer::new(handler_ops.clone(), None)),
        Arc::new(CappedSessions::new(local, sessions.clone())),
        mcp_config,
    );
    let state = AppState {
        health: Arc::new(Health::new(ops.sandboxes.clone())),
        ops,
        sse: SseSessions::default(),
        sessions,
        mcp,
        shutdown,
        signer,
        secure_cookies: config.public_url().starts_with("https://"),
        guard: Arc::new(Guard::new(config, proxies)),
    };
    Router::new()
        .route("/mcp", any(mcp_sessions::route))
        .route("/sse", get(sse::open))
        .route("/messages", post(sse::post))
        .route("/messages/", post(sse::post))
        .route("/results/{sandbox_id}/{*path}", get(artifacts::get))
        .route("/health", get(health::route))
        .route("/metrics", get(metrics))
        .route(GUEST_ROUTE, post(guest::issue))
        .merge(api::routes(config.uploads.max_upload_mb as usize * 1024 * 1024))
        .merge(ui::routes())
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}
