//! `mcp-sandbox stdio --connect URL`: MCP over standard input and output,
//! carried to a running server's Streamable HTTP endpoint, so that a
//! desktop client that launches its servers (Claude Desktop) sees the
//! sandboxes of the server already running, the web UI's, instead of
//! starting a second server. Messages pass through unchanged in both
//! directions; the server does the work, the limits and the checks of the
//! key (`--key`, or `MCP_SANDBOX_KEY`).

use anyhow::Context;
use rmcp::service::{RoleClient, RoleServer};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{IntoTransport, StreamableHttpClientTransport, Transport};

/// Carries messages between standard input and output and the server at
/// `url` until either side ends.
pub async fn run(url: &str, key: Option<String>) -> anyhow::Result<()> {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        anyhow::bail!("--connect takes the server's MCP address, such as http://127.0.0.1:8181/mcp");
    }
    let mut config = StreamableHttpClientTransportConfig::with_uri(url);
    config.auth_header = key;
    let mut remote = StreamableHttpClientTransport::from_config(config);
    let mut local = IntoTransport::<RoleServer, _, _>::into_transport(rmcp::transport::stdio());
    loop {
        tokio::select! {
            from_client = Transport::<RoleServer>::receive(&mut local) => match from_client {
                Some(message) => Transport::<RoleClient>::send(&mut remote, message)
                    .await
                    .with_context(|| format!("sending to the server at {url}"))?,
                None => break,
            },
            from_server = Transport::<RoleClient>::receive(&mut remote) => match from_server {
                Some(message) => Transport::<RoleServer>::send(&mut local, message)
                    .await
                    .context("writing to standard output")?,
                None => anyhow::bail!("the server at {url} closed the connection"),
            },
        }
    }
    let _ = Transport::<RoleClient>::close(&mut remote).await;
    Ok(())
}
