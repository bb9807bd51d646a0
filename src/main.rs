//! The `mcp-sandbox` command: parses the command line, sets up logging and
//! hands over to the library.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use mcp_sandbox::config::Config;
use mcp_sandbox::telemetry;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

#[derive(Parser)]
#[command(
    name = "mcp-sandbox",
    version,
    about = "MCP server giving LLM agents isolated Python sandboxes in Docker"
)]
struct Cli {
    /// Configuration file (default: ./config.toml when present).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Log as JSON lines instead of text.
    #[arg(long, global = true)]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve over HTTP: /mcp (Streamable HTTP), /sse (legacy SSE), /ui, /api, /results, /health, /metrics.
    Serve {
        #[arg(long)]
        host: Option<std::net::IpAddr>,
        #[arg(long)]
        port: Option<u16>,
    },
    /// Serve MCP over standard input and output (with --connect, carried to
    /// a running server instead of serving sandboxes of its own).
    Stdio {
        /// A running server's MCP address, such as http://127.0.0.1:8181/mcp.
        #[arg(long)]
        connect: Option<String>,
        /// The API key to present to that server.
        #[arg(long, env = "MCP_SANDBOX_KEY", hide_env_values = true)]
        key: Option<String>,
    },
    /// Build the sandbox image if it is missing, and print its tag.
    BuildImage,
    /// The [[templates]] of the configuration.
    Template {
        #[command(subcommand)]
        command: TemplateCommand,
    },
    /// Print what tenants used (sandbox time, CPU, memory, disk, network,
    /// calls, installs), by day or hour, as a running server reports it.
    Usage(mcp_sandbox::report::Ask),
    /// The cluster this configuration's [cluster] section names: status,
    /// drain, forget.
    Cluster {
        #[command(subcommand)]
        command: mcp_sandbox::cluster::Ask,
    },
    /// API keys.
    Key {
        #[command(subcommand)]
        command: KeyCommand,
    },
}

#[derive(Subcommand)]
enum TemplateCommand {
    /// Build the templates' images that are missing (or template NAME's),
    /// with a line per build step; an unchanged definition is not built again.
    Build { name: Option<String> },
}

#[derive(Subcommand)]
enum KeyCommand {
    /// Print a fresh API key for tenant NAME and the config lines that enable it.
    New { name: String },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sandbox_host::figures::limit_heap_arenas();
    let cli = Cli::parse();
    if let Command::Key {
        command: KeyCommand::New { name },
    } = &cli.command
    {
        let (key, lines) = mcp_sandbox::access::auth::new_key(name);
        println!("API key for {name} (shown once; the server keeps only its hash):\n\n  {key}\n");
        println!("Add to config.toml (with [auth] enabled = true):\n\n{lines}");
        return Ok(());
    }
    let config = match Config::load(cli.config.as_deref(), std::env::vars()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mcp-sandbox: configuration error: {e}");
            std::process::exit(2);
        }
    };
    // Logs go to stderr: stdout carries the MCP stream under `stdio`.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,rmcp=warn"));
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let logs = match cli.log_json {
        true => logs.json().boxed(),
        false => logs.boxed(),
    };
    let (traces, exporter) = match telemetry::layer(&config.telemetry)? {
        Some((layer, exporter)) => (Some(layer), Some(exporter)),
        None => (None, None),
    };
    tracing_subscriber::registry()
        .with(logs.with_filter(filter))
        .with(traces)
        .init();
    let result = run(cli.command, config, cli.config.as_deref()).await;
    if let Some(exporter) = exporter {
        let _ = tokio::task::spawn_blocking(move || exporter.shutdown()).await;
    }
    result
}

async fn run(command: Command, mut config: Config, path: Option<&std::path::Path>) -> anyhow::Result<()> {
    match command {
        Command::Serve { host, port } => {
            config.server.host = host.unwrap_or(config.server.host);
            config.server.port = port.unwrap_or(config.server.port);
            mcp_sandbox::serve::http(config, path).await
        }
        Command::Stdio {
            connect: Some(url),
            key,
        } => mcp_sandbox::bridge::run(&url, key).await,
        Command::Stdio { connect: None, .. } => mcp_sandbox::serve::stdio(config, path).await,
        Command::BuildImage => mcp_sandbox::serve::build_image(config, path).await,
        Command::Template {
            command: TemplateCommand::Build { name },
        } => mcp_sandbox::serve::build_templates(config, path, name.as_deref()).await,
        Command::Usage(ask) => {
            print!("{}", mcp_sandbox::report::usage(&config, ask).await?);
            Ok(())
        }
        Command::Cluster { command } => {
            print!("{}", mcp_sandbox::cluster::run(&config, command).await?);
            Ok(())
        }
        Command::Key { .. } => unreachable!("handled before the configuration is loaded"),
    }
}
