//! The operations on sandboxes that callers may ask for, shared by the MCP
//! tools and the REST API (and through it the web UI): one code path checks
//! arguments and limits, reaches the domain in the caller's scope, counts and
//! logs the call, and builds the typed result. Front ends only route.
//!
//! This folder: what every verb shares (here: [`Ops`], the budget check,
//! observed calls), the verbs one file each (`verbs/`) and the argument
//! types and checks they share (`args`), the layer's error (`error`), the
//! neutral result types (`results`, `files`, `timestamps`), images shown
//! inline (`inline_images`), usage reports (`usage`), the cluster's
//! directory of sandboxes (`directory`), calls forwarded to the node that
//! holds their sandbox (`route`) and usage shared for budgets
//! (`shared_usage`).
//! May import `access` and `metrics`; nothing of `config`, `mcp` or `http`,
//! nor of the MCP library.

pub(crate) mod args;
pub(crate) mod directory;
pub(crate) mod error;
pub(crate) mod files;
pub(crate) mod inline_images;
pub(crate) mod outputs;
pub(crate) mod processes;
pub(crate) mod results;
pub(crate) mod route;
pub(crate) mod shared_usage;
pub(crate) mod timestamps;
pub(crate) mod usage;
pub(crate) mod verbs;

use std::future::Future;
use std::sync::Arc;

use sandbox_actors::{Progress, Ran, Sandboxes, Work};
use sandbox_cluster::Cluster;
use tokio::sync::mpsc;
use tracing::Instrument;
use uuid::Uuid;

use crate::access::artifact_links::ArtifactLinks;
use crate::access::budgets::Budget;
use crate::access::caller::Caller;
use crate::access::limits::Limits;
use crate::access::preview_links::PreviewLinks;
use crate::metrics::Metrics;
use crate::ops::args::parse_id;
use crate::ops::error::OpsError;
use crate::ops::inline_images::{Inliner, RunImages};
use crate::ops::route::Holder;

type Result<T> = std::result::Result<T, OpsError>;

/// A run's shown images and files, whose images another node shows
/// (`run_images`).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct RunFiles {
    pub sandbox_id: String,
    #[serde(default)]
    pub shown: Vec<String>,
    pub files: Vec<String>,
}

/// Who runs what where, for one execution.
struct Run<'a> {
    caller: &'a Caller,
    raw_id: &'a str,
    timeout: Option<u64>,
    progress: Option<mpsc::Sender<Progress>>,
}

#[derive(Clone)]
pub struct Ops {
    pub sandboxes: Arc<Sandboxes>,
    pub links: ArtifactLinks,
    /// Preview links (none over stdio, which serves no HTTP).
    pub previews: Option<PreviewLinks>,
    pub limits: Arc<Limits>,
    pub metrics: Arc<Metrics>,
    pub images: Inliner,
    /// This node's part in a cluster (`[cluster]`); `None` on a single host.
    pub cluster: Option<Arc<Cluster>>,
    /// Calls for sandboxes other nodes hold are forwarded to them (off for
    /// calls forwarded here).
    pub routing: bool,
    /// In a cluster, what tenants used this month on the other nodes.
    pub others_usage: Arc<std::sync::Mutex<shared_usage::OthersUsage>>,
}

impl Ops {
    /// Refuses new work (runs, installs, creations, forks, restarts,
    /// snapshots and restores) to a tenant past one of its monthly budgets.
    fn check_budget(&self, caller: &Caller) -> Result<()> {
        let budget = self.limits.budget(&caller.owner);
        if budget == Budget::default() {
            return Ok(());
        }
        let (mut used, renews) = self.sandboxes.usage_this_month(&caller.owner);
        if let Some(elsewhere) = self.used_elsewhere(&caller.owner) {
            used.add(&elsewhere);
        }
        budget.check(&used, renews).map_err(OpsError::Refused)
    }

    /// One execution as `tool`: `work` is the checked argument, `finish`
    /// builds the tool's result from what ran.
    async fn execute<T>(
        &self,
        tool: &'static str,
        run: Run<'_>,
        work: Result<Work>,
        finish: fn(Ran, &ArtifactLinks, Uuid) -> T,
    ) -> Result<T> {
        self.on_sandbox(tool, run.raw_id, |id| async move {
            self.check_budget(run.caller)?;
            let ran = self
                .sandboxes
                .run(run.caller.scope(), id, work?, run.timeout, run.progress)
                .await?;
            Ok(finish(ran, &self.links, id))
        })
        .await
    }

    /// A call as `tool` on the sandbox named by `raw_id`, observed (a
    /// malformed id counts as an `invalid_argument` call).
    async fn on_sandbox<T, F>(&self, tool: &'static str, raw_id: &str, call: impl FnOnce(Uuid) -> F) -> Result<T>
    where
        F: Future<Output = Result<T>>,
    {
        let id = parse_id(raw_id);
        let span_id = id.as_ref().ok().copied();
        self.metrics.observe(tool, span_id, async { call(id?).await }).await
    }

    /// The images a run showed (`shown`) and those among its `files` as
    /// the caller's result shows them (none when the sandbox is gone or
    /// inline images are off).
    pub async fn run_images(&self, caller: &Caller, raw_id: &str, shown: &[String], files: &[String]) -> RunImages {
        if let Ok(Holder::Node { name, url }) = self.holder(caller, raw_id).await {
            // Nothing to ask the holder for when none may be shown.
            if !self.images.may_show_any(shown) && !self.images.may_show_any(files) {
                return RunImages::default();
            }
            let args = RunFiles {
                sandbox_id: raw_id.to_string(),
                shown: shown.to_vec(),
                files: files.to_vec(),
            };
            return self
                .forward((&name, &url), "run_images", caller, &args, None)
                .await
                .unwrap_or_default();
        }
        let root = match parse_id(raw_id) {
            Ok(id) => self
                .sandboxes
                .results_dir(caller.scope(), id)
                .await
                .map_err(OpsError::from),
            Err(e) => Err(e),
        };
        match root {
            Ok(root) => {
                let span = tracing::info_span!("inline_images", files = files.len() + shown.len());
                self.images.run(&root, shown, files).instrument(span).await
            }
            Err(_) => RunImages::default(),
        }
    }
}
