//! Running the server: `serve` (HTTP on one port) and `stdio` (MCP over
//! standard input and output, for clients that launch the server).

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use rmcp::ServiceExt;
use sandbox_actors::Sandboxes;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::access::artifact_links::ArtifactLinks;
use crate::access::auth::Keys;
use crate::access::caller::Caller;
use crate::access::connections;
use crate::access::guest::GuestKeys;
use crate::access::limits::Limits;
use crate::access::preview_links::{PreviewBase, PreviewLinks};
use crate::access::signer::LinkSigner;
use crate::config::Config;
use crate::http::preview::Previews;
use crate::mcp::tasks::Tasks;
use crate::mcp::tools::SandboxServer;
use crate::metrics::Metrics;
use crate::ops::directory::keep_in_step;
use crate::ops::inline_images::Inliner;
use crate::ops::shared_usage::share_usage;
use crate::ops::Ops;
use sandbox_cluster::{Capacity, Cluster};

/// OOM score of the server: far below the sandboxes' 0, so that on a host
/// out of memory the kernel ends a sandbox first.
const SERVER_OOM_SCORE_ADJ: i32 = -900;

/// Protects the server from the OOM killer and warns when the configured
/// sandboxes may together take more memory than the host has.
fn guard_host(config: &Config) {
    if let Err(e) = sandbox_host::figures::protect_from_oom_killer(SERVER_OOM_SCORE_ADJ) {
        tracing::warn!(error = %e, "could not lower the server's OOM score (this needs CAP_SYS_RESOURCE); sandboxes still score higher");
    }
    let wanted = memory_wanted(config);
    if let Some(host) = sandbox_host::figures::memory_bytes().filter(|&m| wanted > m) {
        tracing::warn!(
            sandboxes = config.limits.max_sandboxes_total,
            memory_mb = config.sandbox.memory_mb,
            host_memory_mb = host >> 20,
            "limits.max_sandboxes_total x sandbox.memory_mb exceeds the host's memory: full sandboxes together can push the host into its OOM killer; lower one of them"
        );
    }
}

/// Bytes of memory the live sandboxes may take together, each at its limit.
fn memory_wanted(config: &Config) -> u64 {
    config.limits.max_sandboxes_total as u64 * (config.sandbox.memory_mb << 20)
}

/// Starts the domain; `egress_total`: the connections its egress proxy may
/// hold for all sandboxes together.
async fn start_sandboxes(
    config: &Config,
    config_path: Option<&Path>,
    egress_total: usize,
    limits: &Arc<Limits>,
) -> anyhow::Result<Arc<Sandboxes>> {
    guard_host(config);
    let mut settings = config.settings(config_path)?;
    settings.egress_total_connections = egress_total;
    settings.live_cap = live_cap(limits);
    let sandboxes = Sandboxes::start(settings)
        .await
        .context("starting the sandbox service")?;
    Ok(Arc::new(sandboxes))
}

/// The shared operations, over a started domain (and in a cluster, this
/// node's part in it).
pub(crate) fn ops(
    config: &Config,
    sandboxes: Arc<Sandboxes>,
    limits: Arc<Limits>,
    signer: Option<LinkSigner>,
    previews: Option<PreviewLinks>,
    cluster: Option<Arc<Cluster>>,
) -> anyhow::Result<Ops> {
    Ok(Ops {
        sandboxes,
        limits,
        links: ArtifactLinks::new(&config.public_url(), signer),
        previews,
        metrics: Arc::new(Metrics::default()),
        images: Inliner::new(config.results.inline_budgets()),
        routing: cluster.is_some(),
        cluster,
        others_usage: Default::default(),
    })
}

/// Joins the cluster when `[cluster]` says so; the node's figures are read
/// from the domain at each renewal of its membership.
fn join_cluster(config: &Config, sandboxes: &Arc<Sandboxes>) -> anyhow::Result<Option<Arc<Cluster>>> {
    let Some(cluster) = &config.cluster else {
        return Ok(None);
    };
    let (domain, runtime) = (sandboxes.clone(), config.sandbox.runtime.clone());
    let capacity = Arc::new(move || {
        let resources = domain.resources();
        let host = resources.host_memory_bytes.unwrap_or(0);
        Capacity {
            ready: domain.pool_ready(),
            live: domain.awake(),
            free_memory_mb: host.saturating_sub(resources.memory_limits_bytes) >> 20,
            runtimes: vec![runtime.clone()],
        }
    });
    let joined = Cluster::join(cluster.clone(), capacity).context("joining the cluster")?;
    info!(node = %cluster.node_name, etcd = ?cluster.etcd_endpoints, "cluster node");
    Ok(Some(Arc::new(joined)))
}

/// Each tenant's most live sandboxes as the domain asks for them when a
/// hibernated one wakes: what its key or tier says, as creations are checked.
pub(crate) fn live_cap(limits: &Arc<Limits>) -> sandbox_actors::config::LiveCap {
    let limits = limits.clone();
    sandbox_actors::config::LiveCap::new(move |tenant| limits.max_sandboxes(tenant))
}

pub(crate) fn limits(config: &Config, signer: Option<&LinkSigner>) -> anyhow::Result<Arc<Limits>> {
    let mut keys = Keys::from_config(&config.auth, config.guest.enabled)?;
    if let Some(signer) = signer.filter(|_| config.guest.enabled) {
        keys = keys.with_guests(GuestKeys::new(signer.clone(), &config.guest));
    }
    let rates = config
        .auth
        .keys
        .iter()
        .filter_map(|k| k.requests_per_second.map(|r| (k.name.clone(), r)));
    Ok(Arc::new(Limits::new(
        config.limits.clone(),
        config.auth.enabled,
        config.guest.clone(),
        keys,
        rates,
    )))
}

/// How often the rate limiters forget clients that have gone quiet.
const PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// How long requests in flight may finish after a stop signal.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Resolves on SIGINT or SIGTERM.
async fn stop_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// The signer of links and guest keys, when API keys are on. In a cluster
/// every node signs with the same secret (`auth.link_secret`, or one
/// derived from the cluster's), so that any node takes what another signed.
pub(crate) fn signer(config: &Config, config_path: Option<&Path>) -> anyhow::Result<Option<LinkSigner>> {
    let derived = config.cluster.as_ref().map(|c| c.derived_secret("links v1"));
    Ok(match config.auth.enabled {
        true => Some(LinkSigner::load(
            config.auth.link_secret.as_deref().or(derived.as_deref()),
            config.auth.link_ttl_seconds,
            &config.settings(config_path)?.state_dir,
        )?),
        false => None,
    })
}

/// Where preview links point, when the server serves them: under
/// `server.preview_domain`, or on `server.preview_port`, in the scheme (and
/// with the host) of the public URL; under `localhost` for a server whose
/// public URL is this machine's loopback. Their tokens are signed whether or not
/// API keys are on: a preview link is the only way to a sandbox's port.
pub(crate) fn previews(config: &Config, config_path: Option<&Path>) -> anyhow::Result<Option<PreviewLinks>> {
    let public = config.public_url();
    let (scheme, rest) = public.split_once("://").unwrap_or(("http", &public));
    let authority = rest.split('/').next().unwrap_or_default();
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !p.contains(']') => (h, Some(p)),
        _ => (authority, None),
    };
    let base = match (&config.server.preview_domain, config.server.preview_port) {
        (Some(domain), preview_port) => PreviewBase::Domain {
            scheme: scheme.to_string(),
            domain: domain.clone(),
            port: preview_port
                .map(|p| p.to_string())
                .or(port.map(str::to_string))
                .map_or(String::new(), |p| format!(":{p}")),
        },
        (None, Some(preview_port)) => PreviewBase::Port {
            origin: format!("{scheme}://{host}:{preview_port}"),
        },
        // A server on this machine only: `*.localhost` names loopback in
        // browsers (and curl), so each preview still has an origin of its
        // own, on the server's own port.
        (None, None) if ["127.0.0.1", "localhost", "[::1]"].contains(&host) => PreviewBase::Domain {
            scheme: scheme.to_string(),
            domain: "localhost".into(),
            port: port.map_or(String::new(), |p| format!(":{p}")),
        },
        (None, None) => return Ok(None),
    };
    let derived = config.cluster.as_ref().map(|c| c.derived_secret("links v1"));
    let signer = LinkSigner::load(
        config.auth.link_secret.as_deref().or(derived.as_deref()),
        config.auth.link_ttl_seconds,
        &config.settings(config_path)?.state_dir,
    )?
    .derived("preview links v1");
    Ok(Some(PreviewLinks::new(base, signer, config.auth.link_ttl_seconds)))
}

pub async fn http(config: Config, config_path: Option<&Path>) -> anyhow::Result<()> {
    let signer = signer(&config, config_path)?;
    let previews = previews(&config, config_path)?;
    let files = connections::raise_open_file_limit(&config.limits, config.proxied_connections_per_sandbox())?;
    let limits = limits(&config, signer.as_ref())?;
    let sandboxes = start_sandboxes(&config, config_path, files.egress_connections, &limits).await?;
    let (open_files, egress_connections) = (files.limit, files.egress_connections);
    let addr = std::net::SocketAddr::new(config.server.host, config.server.port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    let shutdown = CancellationToken::new();
    let cluster = join_cluster(&config, &sandboxes)?;
    let ops = ops(
        &config,
        sandboxes.clone(),
        limits,
        signer.clone(),
        previews.clone(),
        cluster.clone(),
    )?;
    let previews = previews.map(|links| Previews::new(ops.clone(), links, &config.preview, config.server.preview_port));
    if let Some(cluster) = &cluster {
        tokio::spawn(keep_in_step(ops.clone(), cluster.clone(), shutdown.clone()));
        tokio::spawn(share_usage(ops.clone(), cluster.clone(), shutdown.clone()));
    }
    let (limits, metrics) = (ops.limits.clone(), ops.metrics.clone());
    let tasks = Tasks::new(config.tasks.clone());
    let app = crate::http::router(&config, ops, tasks, signer, previews.clone(), shutdown.clone());
    info!(%addr, auth = config.auth.enabled, guests = config.guest.enabled, open_files, egress_connections, pool_min = config.pool.min.resolve(sandbox_host::figures::memory_bytes()), pool_max = config.pool.max, mcp = %format!("{}/mcp", config.public_url()), sse = %format!("{}/sse", config.public_url()), "mcp-sandbox listening");
    let pruning = shutdown.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(PRUNE_EVERY);
        while tokio::select! { _ = tick.tick() => true, _ = pruning.cancelled() => false } {
            limits.prune();
        }
    });
    let stop = shutdown.clone();
    tokio::spawn(async move {
        stop_signal().await;
        stop.cancel();
    });
    let addresses = config.client_addresses()?;
    if let (Some(previews), Some(port)) = (previews, config.server.preview_port) {
        let addr = std::net::SocketAddr::new(config.server.host, port);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr} (server.preview_port)"))?;
        let (limits, addresses, metrics, stop) = (
            config.limits.clone(),
            addresses.clone(),
            metrics.clone(),
            shutdown.clone(),
        );
        info!(%addr, "previews listening");
        tokio::spawn(async move {
            let app = crate::http::preview_router(previews);
            connections::serve(listener, app, &limits, addresses, metrics, stop).await;
        });
    }
    let serving = connections::serve(listener, app, &config.limits, addresses, metrics, shutdown.clone());
    // Requests in flight get a grace period; then the server stops anyway.
    let deadline = async {
        shutdown.cancelled().await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    tokio::select! {
        _ = serving => {}
        _ = deadline => tracing::warn!("connections still open {SHUTDOWN_GRACE:?} after the stop signal; stopping anyway"),
    }
    // The others see this node gone at once; the directory keeps its
    // sandboxes, which the next start adopts with their containers.
    if let Some(cluster) = &cluster {
        cluster.leave().await;
    }
    // Containers keep running: the next start adopts them.
    sandboxes.shutdown().await;
    info!("stopped");
    Ok(())
}

/// MCP over stdio: the client that launched the server is the only caller.
pub async fn stdio(config: Config, config_path: Option<&Path>) -> anyhow::Result<()> {
    // Over stdio the server accepts no HTTP connections to budget for.
    let limits = crate::access::limits::LimitsConfig {
        max_connections: 0,
        ..config.limits.clone()
    };
    let files = connections::raise_open_file_limit(&limits, config.proxied_connections_per_sandbox())?;
    let limits = self::limits(&config, None)?;
    let sandboxes = start_sandboxes(&config, config_path, files.egress_connections, &limits).await?;
    let tasks = Tasks::new(config.tasks.clone());
    let handler = SandboxServer::new(
        ops(&config, sandboxes.clone(), limits, None, None, None)?,
        tasks,
        Some(Caller::local()),
    );
    let running = handler.serve(rmcp::transport::stdio()).await?;
    tokio::select! {
        _ = running.waiting() => {}
        _ = stop_signal() => {}
    }
    sandboxes.shutdown().await;
    Ok(())
}

pub async fn build_image(config: Config, config_path: Option<&Path>) -> anyhow::Result<()> {
    let tag = Sandboxes::build_image(&config.settings(config_path)?).await?;
    println!("{tag}");
    Ok(())
}

/// `mcp-sandbox template build [NAME]`: builds the templates (their build
/// steps in the log), then prints each one's state; fails if one failed.
pub async fn build_templates(config: Config, config_path: Option<&Path>, only: Option<&str>) -> anyhow::Result<()> {
    let built = Sandboxes::build_templates(&config.settings(config_path)?, only).await?;
    let mut failed = 0;
    for t in &built {
        match &t.detail {
            None => println!(
                "{}: {} ({})",
                t.name,
                t.image.as_deref().unwrap_or_default(),
                if t.built_now { "built" } else { "already built" }
            ),
            Some(e) => {
                failed += 1;
                println!("{}: FAILED: {e}", t.name);
            }
        }
    }
    anyhow::ensure!(failed == 0, "{failed} of {} templates could not be built", built.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host this project is developed on has 24 GB, of which the
    /// kernel reports 23.5 GiB: the shipped defaults start there without
    /// the memory warning.
    #[test]
    fn the_shipped_defaults_fit_a_24_gb_host() {
        let host: u64 = 23 << 30;
        assert!(memory_wanted(&Config::default()) <= host);
    }
}
