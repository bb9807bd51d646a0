//! The `cluster` command: the state of the cluster this configuration's
//! `[cluster]` section names, read from etcd, and the operator's changes to
//! it (draining a node, forgetting one that will not return).

use anyhow::Context as _;
use sandbox_cluster::{Cluster, NodeStatus};

use crate::config::Config;

/// What `mcp-sandbox cluster` was asked.
#[derive(Debug, clap::Subcommand)]
pub enum Ask {
    /// List the nodes: up or down, draining, the sandboxes each holds and
    /// what it can take.
    Status {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Place no new sandboxes on NODE (for an upgrade); its sandboxes keep
    /// working. `--undo` places them there again.
    Drain {
        node: String,
        #[arg(long)]
        undo: bool,
    },
    /// Remove NODE, which will not return, from the cluster: its sandboxes
    /// leave the directory and the quotas (their files were on its disks).
    Forget { node: String },
}

pub async fn run(config: &Config, ask: Ask) -> anyhow::Result<String> {
    let section = config
        .cluster
        .as_ref()
        .context("this configuration has no [cluster] section (see docs/cluster.md)")?;
    let admin = Cluster::admin(section)?;
    match ask {
        Ask::Status { json } => {
            let nodes = admin.status().await?;
            Ok(match json {
                true => serde_json::to_string_pretty(&nodes)? + "\n",
                false => table(&nodes),
            })
        }
        Ask::Drain { node, undo } => {
            admin.drain(&node, !undo).await?;
            Ok(match undo {
                true => format!("node {node} takes new sandboxes again\n"),
                false => format!("node {node} takes no new sandboxes; its sandboxes keep working\n"),
            })
        }
        Ask::Forget { node } => {
            let removed = admin.forget(&node).await?;
            Ok(format!(
                "node {node} forgotten: {removed} sandboxes left the directory\n"
            ))
        }
    }
}

fn table(nodes: &[NodeStatus]) -> String {
    let mut out = format!(
        "{:<20} {:<5} {:<8} {:>9} {:>5} {:>5} {:>14}  {:<12} {}\n",
        "NODE", "STATE", "DRAINING", "SANDBOXES", "READY", "LIVE", "FREE_MEMORY_MB", "RUNTIMES", "URL"
    );
    for n in nodes {
        let f = n.figures.as_ref();
        let figure = |v: Option<String>| v.unwrap_or_else(|| "-".into());
        out += &format!(
            "{:<20} {:<5} {:<8} {:>9} {:>5} {:>5} {:>14}  {:<12} {}\n",
            n.name,
            n.state,
            if n.draining { "yes" } else { "no" },
            n.sandboxes,
            figure(f.map(|f| f.capacity.ready.to_string())),
            figure(f.map(|f| f.capacity.live.to_string())),
            figure(f.map(|f| f.capacity.free_memory_mb.to_string())),
            figure(f.map(|f| f.capacity.runtimes.join(","))),
            figure(f.map(|f| f.url.clone())),
        );
    }
    out
}
