//! The HTTP front end on one port: MCP over Streamable HTTP (`/mcp`) and the
//! legacy HTTP+SSE transport (`/sse`, `/messages`), artifacts (`/results`),
//! and `/health`. Handlers only parse, check who asks, and call the domain.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use sandbox_actors::Sandboxes;
use tokio_util::sync::CancellationToken;

use crate::artifacts;
use crate::caller::Caller;
use crate::config::Config;
use crate::links::Links;
use crate::sse::{self, SseSessions};
use crate::tools::{SandboxServer, MAX_CODE_BYTES};

/// Largest request body: the largest `code`, JSON-escaped, with room to spare.
pub const MAX_BODY_BYTES: usize = 8 * MAX_CODE_BYTES;

#[derive(Clone)]
pub struct AppState {
    pub sandboxes: Arc<Sandboxes>,
    pub links: Links,
    pub sse: SseSessions,
    guard: Arc<Guard>,
}

/// DNS-rebinding protection: which `Host` and `Origin` values are accepted.
#[derive(Debug)]
struct Guard {
    /// `None`: any host (the server listens beyond loopback).
    hosts: Option<Vec<String>>,
    origins: Vec<String>,
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
        Self { hosts, origins }
    }

    fn check(&self, req: &Request) -> Result<(), &'static str> {
        let header = |name| req.headers().get(name).and_then(|v| v.to_str().ok());
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

/// `host:port` → `host` (IPv6 literals keep their brackets).
fn host_only(authority: &str) -> &str {
    if authority.starts_with('[') {
        return authority.split_inclusive(']').next().unwrap_or(authority);
    }
    authority.split(':').next().unwrap_or(authority)
}

async fn guard(State(app): State<AppState>, mut req: Request, next: Next) -> Response {
    if let Err(why) = app.guard.check(&req) {
        return (
            StatusCode::FORBIDDEN,
            Json(serde_json::json!({ "error": why })),
        )
            .into_response();
    }
    req.extensions_mut().insert(Caller::local());
    next.run(req).await
}

async fn health(State(app): State<AppState>) -> Response {
    match app.sandboxes.ping().await {
        Ok(()) => Json(serde_json::json!({ "status": "ok", "docker": "ok" })).into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({ "status": "unavailable", "docker": e.to_string() })),
        )
            .into_response(),
    }
}

pub fn router(config: &Config, sandboxes: Arc<Sandboxes>, shutdown: CancellationToken) -> Router {
    let links = Links::new(&config.public_url());
    let state = AppState {
        sandboxes: sandboxes.clone(),
        links: links.clone(),
        sse: SseSessions::default(),
        guard: Arc::new(Guard::new(config)),
    };
    let mut mcp_config = StreamableHttpServerConfig::default();
    mcp_config.cancellation_token = shutdown;
    mcp_config.max_request_body_bytes = MAX_BODY_BYTES;
    // Host and Origin are checked for every route by `guard`.
    mcp_config.allowed_hosts = vec![];
    let mcp = StreamableHttpService::new(
        move || Ok(SandboxServer::new(sandboxes.clone(), links.clone(), None)),
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
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}
