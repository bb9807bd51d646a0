//! The HTTP front end on one port: MCP over Streamable HTTP (`/mcp`) and the
//! legacy HTTP+SSE transport (`/sse`, `/messages`), the REST API (`/api`)
//! and the web UI (`/ui`) on top of it, artifacts (`/results`), `/health`
//! and `/metrics`. Every request passes one guard (Host and Origin, who is
//! asking, CSRF for browser sessions, rate limits); handlers then only parse
//! and call the shared operations.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use crate::auth::{Identified, LinkSigner};
use crate::caller::Caller;
use crate::config::Config;
use crate::ops::{Ops, MAX_CODE_BYTES};
use crate::sse::{self, SseSessions};
use crate::tools::SandboxServer;
use crate::{api, artifacts, ui};

/// Largest request body: the largest `code`, JSON-escaped, with room to spare.
pub const MAX_BODY_BYTES: usize = 8 * MAX_CODE_BYTES;

#[derive(Clone)]
pub struct AppState {
    pub ops: Ops,
    pub sse: SseSessions,
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

/// DNS-rebinding protection: which `Host` and `Origin` values are accepted.
#[derive(Debug)]
struct Guard {
    /// `None`: any host (the server listens beyond loopback).
    hosts: Option<Vec<String>>,
    origins: Vec<String>,
    auth: bool,
}

/// `host:port` → `host` (IPv6 literals keep their brackets).
fn host_only(authority: &str) -> &str {
    if authority.starts_with('[') {
        return authority.split_inclusive(']').next().unwrap_or(authority);
    }
    authority.split(':').next().unwrap_or(authority)
}

impl Guard {
    fn new(config: &Config) -> Self {
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
        let hosts = config.server.host.is_loopback().then(|| {
            let mut h: Vec<String> = ["localhost", "127.0.0.1", "[::1]"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            h.push(host_only(&public_host).to_string());
            h
        });
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
        }
    }

    fn check_host_and_origin(&self, headers: &HeaderMap) -> Result<(), &'static str> {
        let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
        if let Some(hosts) = &self.hosts {
            let host = header(header::HOST).map(host_only).unwrap_or("");
            if !hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) {
                return Err("this Host is not served here (DNS-rebinding protection)");
            }
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
/// the authenticated stream is the capability), the liveness check, and the
/// UI (whose pages offer the sign-in form).
fn keyless(path: &str) -> bool {
    path.starts_with("/results/") || path.starts_with("/messages") || path == "/health" || is_ui(path)
}

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
    let path = req.uri().path();
    let caller = if app.guard.auth {
        match presented_key(&req) {
            Some(p) => match app.ops.limits.keys().identify(&p.key) {
                Identified::Tenant(_) if p.from_cookie && !csrf_ok(&app, &req, &p.key) => {
                    return error(
                        StatusCode::FORBIDDEN,
                        "this request needs the session's CSRF token (X-CSRF-Token); reload the page",
                    )
                }
                Identified::Tenant(t) => Some(Caller::tenant(&t.name, t.admin)),
                // A stale session cookie: the UI shows its sign-in form.
                _ if p.from_cookie && is_ui(path) => None,
                Identified::Revoked => return error(StatusCode::UNAUTHORIZED, "this API key has been revoked"),
                Identified::Unknown => return error(StatusCode::UNAUTHORIZED, "unknown API key"),
            },
            None if keyless(path) => None,
            None => {
                let mut r = error(StatusCode::UNAUTHORIZED, HOW_TO_AUTHENTICATE);
                r.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                return r;
            }
        }
    } else {
        Some(Caller::anonymous(peer.ip()))
    };
    let tenant = caller
        .as_ref()
        .map(|c| c.owner.clone())
        .unwrap_or_else(|| format!("ip:{}", peer.ip()));
    if let Err(wait) = app.ops.limits.check_request(peer.ip(), &tenant) {
        app.ops.metrics.rate_limited();
        let mut r = error(
            StatusCode::TOO_MANY_REQUESTS,
            &format!("rate limit reached; retry in {} s", wait.seconds()),
        );
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(wait.seconds()));
        return r;
    }
    if let Some(c) = caller {
        req.extensions_mut().insert(c);
    }
    next.run(req).await
}

/// `/health`: whether Docker answers, and the host resources the sandboxes
/// draw on (free disk, their memory limits added up, the host's memory).
async fn health(State(app): State<AppState>) -> Response {
    let r = app.ops.sandboxes.resources();
    let mb = |b: u64| b >> 20;
    let resources = serde_json::json!({
        "disk_free_mb": r.disk_free_bytes.map(mb),
        "sandbox_memory_limits_mb": mb(r.memory_limits_bytes),
        "host_memory_mb": r.host_memory_bytes.map(mb),
    });
    match app.ops.sandboxes.ping().await {
        Ok(()) => Json(serde_json::json!({ "status": "ok", "docker": "ok", "resources": resources })).into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({ "status": "unavailable", "docker": e.to_string(), "resources": resources })),
        )
            .into_response(),
    }
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
    let state = AppState {
        ops: ops.clone(),
        sse: SseSessions::default(),
        shutdown: shutdown.clone(),
        signer,
        secure_cookies: config.public_url().starts_with("https://"),
        guard: Arc::new(Guard::new(config)),
    };
    let mut mcp_config = StreamableHttpServerConfig::default();
    mcp_config.cancellation_token = shutdown;
    mcp_config.max_request_body_bytes = MAX_BODY_BYTES;
    // Host and Origin are checked for every route by `guard`.
    mcp_config.allowed_hosts = vec![];
    let mcp = StreamableHttpService::new(
        move || Ok(SandboxServer::new(ops.clone(), None)),
        Arc::new(LocalSessionManager::default()),
        mcp_config,
    );
    Router::new()
        .nest_service("/mcp", mcp)
        .route("/sse", get(sse::open))
        .route("/messages", post(sse::post))
        .route("/messages/", post(sse::post))
        .route("/results/{sandbox_id}/{*path}", get(artifacts::get))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .merge(api::routes(config.uploads.max_upload_mb as usize * 1024 * 1024))
        .merge(ui::routes())
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}
