//! What every HTTP route shares: the server's state ([`AppState`]) and the
//! request guard's settings ([`Guard`]: which `Host` and `Origin` values are
//! accepted, and which proxies are trusted).

use std::sync::Arc;

use axum::http::{header, HeaderMap};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::StreamableHttpService;
use tokio_util::sync::CancellationToken;

use crate::access::client_ip::ClientAddresses;
use crate::access::sessions::Sessions;
use crate::access::signer::LinkSigner;
use crate::config::Config;
use crate::http::health::Health;
use crate::http::sse_sessions::SseSessions;
use crate::mcp::sessions::CappedSessions;
use crate::mcp::tasks::Tasks;
use crate::mcp::tools::SandboxServer;
use crate::ops::Ops;

/// The Streamable HTTP service, with sessions under the server's caps.
pub type McpService = StreamableHttpService<SandboxServer, CappedSessions<LocalSessionManager>>;

#[derive(Clone)]
pub struct AppState {
    pub ops: Ops,
    /// Long MCP calls that became tasks, across all sessions.
    pub tasks: Tasks,
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
    pub guard: Arc<Guard>,
}

impl AppState {
    pub fn auth(&self) -> bool {
        self.guard.auth
    }
}

/// DNS-rebinding protection (which `Host` and `Origin` values are
/// accepted), and who the client is behind trusted proxies.
#[derive(Debug)]
pub struct Guard {
    /// Host names accepted besides IP literals and `localhost`, which a
    /// rebinding attack cannot use (it needs a name its attacker resolves).
    hosts: Vec<String>,
    origins: Vec<String>,
    pub auth: bool,
    pub addresses: ClientAddresses,
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
    pub fn new(config: &Config, addresses: ClientAddresses) -> Self {
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
            addresses,
        }
    }

    pub fn check_host_and_origin(&self, headers: &HeaderMap) -> Result<(), &'static str> {
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
