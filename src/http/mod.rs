//! The HTTP front end on one port: MCP over Streamable HTTP (`/mcp`) and the
//! legacy HTTP+SSE transport (`/sse`, `/messages`), the REST API (`/api`)
//! and the web UI (`/ui`) on top of it, artifacts (`/results`), `/health`
//! and `/metrics`, guest keys (`/api/guest`). Every request passes one
//! guard (Host and Origin, the client's address behind trusted proxies, who
//! is asking, CSRF for browser sessions, rate limits); handlers then only
//! parse and call the shared operations.
//!
//! This folder: JSON error answers (`error`), request bodies under a cap
//! and a deadline (`bodies`), the engine check (`health`), the legacy SSE
//! transport's sessions (`sse_sessions`), what every route shares
//! (`state`), the routes `sse`, `artifacts`, `api` and `ui`, calls other
//! nodes of a cluster forward here (`node`), and here the router and the
//! request guard. May import `mcp`, `ops`, `access`,
//! `config` and `metrics`.

pub(crate) mod api;
pub(crate) mod artifacts;
pub(crate) mod bodies;
pub(crate) mod error;
pub(crate) mod health;
pub(crate) mod node;
pub(crate) mod preview;
pub(crate) mod process_api;
pub(crate) mod sse;
pub(crate) mod sse_sessions;
pub(crate) mod state;
pub(crate) mod ui;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Extension, Json, Router};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;
use tower::Service;

use crate::access::auth::Identified;
use crate::access::caller::Caller;
use crate::access::client_ip::{is_forwarded, ClientIp};
use crate::access::sessions::Sessions;
use crate::access::signer::LinkSigner;
use crate::config::Config;
use crate::http::error::{error, refusal, session_refused};
use crate::http::health::Health;
use crate::http::state::{AppState, Guard};
use crate::mcp::sessions::{self as mcp_sessions, CappedSessions};
use crate::mcp::tasks::Tasks;
use crate::mcp::tools::SandboxServer;
use crate::ops::Ops;
use bodies::{BodyRules, MAX_BODY_BYTES};
use sse_sessions::SseSessions;

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
    // The other nodes of the cluster, with a request signed with the
    // cluster's key instead of an API key, on the node channel only; the
    // entry node applied the caller's limits. The signature is checked
    // here, before any of the body is read (the routes check the body
    // against the digest it signs).
    if path.starts_with(node::PREFIX) {
        let method = req.method().as_str().to_string();
        return match node::signed_headers(&app, req.headers(), &method, &path) {
            Some(signed) => {
                req.extensions_mut().insert(signed);
                next.run(req).await
            }
            None => error(StatusCode::UNAUTHORIZED, node::FOR_NODES),
        };
    }
    // Rates count an IPv6 client by its network (`client`); without keys
    // the tenant is the address itself (`address`): a network is many
    // clients, none of whom may reach another's sandboxes.
    let address = match app.guard.addresses.client(peer.ip(), req.headers()) {
        Ok(ip) => ip,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let client = app.guard.addresses.group(address);
    // Without keys the tenant is the address: one that stands for a whole
    // proxy's visitors would merge them silently.
    if !app.guard.auth && !app.guard.addresses.trusts(peer.ip()) && is_forwarded(req.headers()) {
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
        Some(Caller::anonymous(address))
    };
    // A message to an SSE session is charged to the tenant that opened it.
    let tenant = match &caller {
        Some(c) => c.owner.clone(),
        None => path
            .starts_with("/messages")
            .then(|| sse_sessions::session_id(req.uri().query()).and_then(|id| app.sse.caller_of(&id)))
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

/// `/mcp`: rmcp's service, run as the request's caller.
async fn streamable(State(app): State<AppState>, caller: Option<Extension<Caller>>, req: Request) -> Response {
    let mut service = app.mcp.clone();
    let (response, refused) = mcp_sessions::opened_by(caller.map(|Extension(c)| c), service.call(req)).await;
    if let Some(r) = refused {
        return session_refused(r);
    }
    match response {
        Ok(r) => r.into_response(),
        Err(never) => match never {},
    }
}

/// `/health`: whether Docker answers, and the host resources the sandboxes
/// draw on (free disk, their memory limits added up, the host's memory).
/// It is exempt from request-rate limits: a load balancer's probe must not
/// read somebody else's flood from the same address as the server being
/// down.
async fn health(State(app): State<AppState>) -> Response {
    let r = app.ops.sandboxes.resources();
    let mb = |b: u64| b >> 20;
    let resources = serde_json::json!({
        "disk_free_mb": r.disk_free_bytes.map(mb),
        "sandbox_memory_limits_mb": mb(r.memory_limits_bytes),
        "host_memory_mb": r.host_memory_bytes.map(mb),
    });
    match app.health.engine().await {
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
async fn metrics(State(app): State<AppState>, caller: Option<Extension<Caller>>) -> Response {
    if app.auth() && !caller.is_some_and(|c| c.admin) {
        return error(
            StatusCode::FORBIDDEN,
            "metrics are for administrator keys ([auth] admin_keys)",
        );
    }
    let mut stats = app.ops.sandboxes.stats().await;
    if !app.auth() {
        // Open to anyone, and tenants are then client addresses: whose
        // they are, and what they used, is nobody else's business.
        stats.top_tenants.clear();
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        app.ops.metrics.render(&stats),
    )
        .into_response()
}

pub fn router(
    config: &Config,
    ops: Ops,
    tasks: Tasks,
    signer: Option<LinkSigner>,
    previews: Option<Arc<preview::Previews>>,
    shutdown: CancellationToken,
) -> Router {
    let addresses = config.client_addresses().expect("validated with the configuration");
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
    let (handler_ops, handler_tasks) = (ops.clone(), tasks.clone());
    let mcp = StreamableHttpService::new(
        move || Ok(SandboxServer::new(handler_ops.clone(), handler_tasks.clone(), None)),
        Arc::new(CappedSessions::new(local, sessions.clone())),
        mcp_config,
    );
    let state = AppState {
        health: Arc::new(Health::new(ops.sandboxes.clone())),
        ops,
        tasks,
        sse: SseSessions::default(),
        sessions,
        mcp,
        shutdown,
        signer,
        secure_cookies: config.public_url().starts_with("https://"),
        guard: Arc::new(Guard::new(config, addresses)),
    };
    let bodies = |cap| middleware::from_fn_with_state(BodyRules::new(&config.limits, cap), bodies::guard);
    let upload_bytes = config.uploads.max_upload_mb as usize * 1024 * 1024;
    Router::new()
        .route("/mcp", any(streamable))
        .route("/sse", get(sse::open))
        .route("/messages", post(sse::post))
        .route("/messages/", post(sse::post))
        .route("/results/{sandbox_id}/{*path}", get(artifacts::get))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route(GUEST_ROUTE, post(api::guest_key))
        .route(node::ROUTE, post(node::call))
        .route("/cluster/v1/results/{sandbox_id}/{*path}", get(artifacts::for_node))
        .merge(api::routes())
        .merge(process_api::routes())
        .merge(ui::routes())
        .layer(bodies(MAX_BODY_BYTES))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        // Uploads have a cap of their own; the layers above are only on
        // the routes before them.
        .merge(
            api::upload_routes()
                .layer(bodies(upload_bytes))
                .layer(DefaultBodyLimit::max(upload_bytes)),
        )
        .merge(
            Router::new()
                .route(node::BYTES_ROUTE, post(node::call))
                .layer(bodies(upload_bytes + node::ARGS_ROOM))
                .layer(DefaultBodyLimit::max(upload_bytes + node::ARGS_ROOM)),
        )
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
        // Outermost: a preview's host is the sandbox's origin, which none of
        // the server's checks or routes serve.
        .layer(middleware::from_fn_with_state(previews, preview::dispatch))
}

/// The preview port's own listener: previews only.
pub fn preview_router(previews: Arc<preview::Previews>) -> Router {
    Router::new().fallback(preview::serve).with_state(previews)
}
