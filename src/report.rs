//! `mcp-sandbox usage`: asks a running server for a usage report
//! (`GET /api/usage`, with an administrator's key for every tenant) and
//! prints it as a table or as CSV. The server holds its record store open,
//! so the report comes from it rather than from the file.
//!
//! A plain HTTP/1.1 exchange over TCP: meant for the server's own address
//! on the host (its `http://host:port`); for a public `https://` address,
//! use any HTTP client against `/api/usage`.

use std::fmt::Write as _;
use std::net::IpAddr;

use anyhow::{bail, Context as _};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::config::Config;

/// The largest answer read: a report is at most 100,000 rows.
const MAX_ANSWER_BYTES: u64 = 64 << 20;
/// How long the whole exchange may take.
const DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

/// What to ask for: the command's arguments. (No `Debug`: it holds a key.)
#[derive(Default, clap::Args)]
pub struct Ask {
    /// Start: an RFC 3339 time or a date (default: the 1st of this month, UTC).
    #[arg(long)]
    pub from: Option<String>,
    /// End (default: now).
    #[arg(long)]
    pub to: Option<String>,
    /// `day` (default) or `hour`.
    #[arg(long)]
    pub granularity: Option<String>,
    /// One tenant (an administrator's key sees every tenant).
    #[arg(long)]
    pub tenant: Option<String>,
    /// CSV instead of a table.
    #[arg(long)]
    pub csv: bool,
    /// The server's `host:port` (default: the configured address, loopback
    /// if that is the unspecified address).
    #[arg(long)]
    pub address: Option<String>,
    /// API key (default: the MCP_SANDBOX_KEY variable); needed when
    /// authentication is on.
    #[arg(long, env = "MCP_SANDBOX_KEY", hide_env_values = true)]
    pub key: Option<String>,
}

/// The query string, each value percent-encoded.
fn query(ask: &Ask) -> String {
    let pairs = [
        ("from", &ask.from),
        ("to", &ask.to),
        ("granularity", &ask.granularity),
        ("tenant", &ask.tenant),
    ];
    let encoded: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| {
            v.as_ref()
                .map(|v| format!("{k}={}", utf8_percent_encode(v, NON_ALPHANUMERIC)))
        })
        .collect();
    encoded.join("&")
}

/// Fetches the report and returns what to print.
pub async fn usage(config: &Config, ask: Ask) -> anyhow::Result<String> {
    let address = match ask.address.clone() {
        Some(a) => a,
        None => {
            let host = match config.server.host {
                h if h.is_unspecified() => IpAddr::from([127, 0, 0, 1]),
                h => h,
            };
            std::net::SocketAddr::new(host, config.server.port).to_string()
        }
    };
    let exchange = async {
        let mut tcp = tokio::net::TcpStream::connect(&address)
            .await
            .with_context(|| format!("connecting to the server at {address} (is it running? --address)"))?;
        let mut head = format!(
            "GET /api/usage?{} HTTP/1.1\r\nhost: {address}\r\naccept: {}\r\nconnection: close\r\n",
            query(&ask),
            if ask.csv { "text/csv" } else { "application/json" }
        );
        if let Some(key) = &ask.key {
            let _ = write!(head, "authorization: Bearer {key}\r\n");
        }
        head.push_str("\r\n");
        tcp.write_all(head.as_bytes()).await?;
        let mut answer = Vec::new();
        tcp.take(MAX_ANSWER_BYTES + 1).read_to_end(&mut answer).await?;
        anyhow::Ok(answer)
    };
    let answer = tokio::time::timeout(DEADLINE, exchange)
        .await
        .with_context(|| format!("the server at {address} did not answer within {} s", DEADLINE.as_secs()))??;
    if answer.len() as u64 > MAX_ANSWER_BYTES {
        bail!("the report is larger than {MAX_ANSWER_BYTES} bytes; ask for a shorter period or one tenant");
    }
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .context("the server's answer has no body")?;
    let status = head.split_whitespace().nth(1).unwrap_or("");
    let head = head.to_ascii_lowercase();
    if head.contains("transfer-encoding: chunked") {
        bail!("the server answered in chunks, which this command does not read; use curl");
    }
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|n| n.trim().parse::<usize>().ok());
    if length.is_some_and(|n| n != body.len()) {
        bail!("the server's answer was cut short; try again");
    }
    if status != "200" {
        let said: Value = serde_json::from_str(body).unwrap_or(Value::String(body.to_string()));
        bail!(
            "the server answered {status}: {}",
            said["error"].as_str().unwrap_or(body)
        );
    }
    if ask.csv {
        return Ok(body.to_string());
    }
    table(&serde_json::from_str(body).context("the server's report is not JSON")?)
}

/// The report as aligned columns, in the units people read.
fn table(report: &Value) -> anyhow::Result<String> {
    let mut out = format!(
        "usage from {} to {}, by {}\n{:<21} {:<24} {:>10} {:>9} {:>10} {:>10} {:>11} {:>7} {:>8}\n",
        report["from"].as_str().unwrap_or(""),
        report["to"].as_str().unwrap_or(""),
        report["granularity"].as_str().unwrap_or(""),
        "period",
        "tenant",
        "sandbox h",
        "CPU h",
        "mem GB·h",
        "disk GB·h",
        "egress MiB",
        "calls",
        "installs"
    );
    let n = |row: &Value, k: &str| row[k].as_f64().unwrap_or(0.0);
    for row in report["rows"].as_array().context("no rows in the report")? {
        let _ = writeln!(
            out,
            "{:<21} {:<24} {:>10.2} {:>9.3} {:>10.3} {:>10.4} {:>11.1} {:>7} {:>8}",
            row["period"].as_str().unwrap_or(""),
            row["tenant"].as_str().unwrap_or(""),
            (n(row, "running_seconds") + n(row, "paused_seconds")) / 3600.0,
            n(row, "cpu_seconds") / 3600.0,
            n(row, "memory_gb_seconds") / 3600.0,
            n(row, "disk_gb_hours"),
            n(row, "egress_bytes") / (1024.0 * 1024.0),
            n(row, "calls"),
            n(row, "installs"),
        );
    }
    Ok(out)
}
