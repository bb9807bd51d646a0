//! [`Sandboxes`]: the face of the domain that the front end calls. Each
//! method checks who asks, finds the sandbox's actor and sends it a message;
//! only creation, start-up reconciliation and the reading of CPU and memory
//! figures talk to the runtime directly, and only the file tools' reads
//! (bounded, see [`crate::files`]) touch a sandbox's results folder.
//!
//! Every question to an actor (info, history, install status, usage) has a
//! deadline, so no sandbox can stall a listing, the metrics or the UI, and
//! a creation runs to its end in a task of its own: a caller that hangs up
//! midway leaves no container that nobody counts.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ractor::{Actor, ActorRef};
use time::OffsetDateTime;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use uuid::Uuid;

use crate::census::Census;
use crate::config::Settings;
use crate::context::{Context, EventCounts};
use crate::error::{DockerError, Result, SandboxError, StoreError};
use sandbox_egress::Egress;
use sandbox_host::syscalls::Syscalls;
use sandbox_runtime::agent::{Progress, Work};

use crate::agent_connection::Ran;
use crate::history::CallRecord;
use crate::messages::{Queued, RunRequest, SandboxMsg};
use crate::packages;
use crate::pool::PoolStats;
use crate::pools::Pools;
use crate::processes::{self, ProcessAnswer, ProcessOp};
use crate::records::{InstallRecord, InstallState, RecordStore, SandboxRecord};
use crate::registry::Registry;
use crate::resources::{self, Resources};
use crate::results::{InstallStatus, SandboxInfo, Slept};
use crate::sandbox::Started;
use crate::scope::Scope;
use crate::snapshots::Snapshots;
use crate::status::SandboxStatus;
use crate::supervisor::{Supervisor, SupervisorMsg};
use crate::templates::{TemplateInfo, Templates};
use crate::usage::{Meter, Row, Totals};
use sampler::Sampler;
use sandbox_runtime::ports::{PortError, PortStream};
use sandbox_runtime::{ContainerRuntime, DockerRuntime, Usage};

mod creation;
mod files;
mod fork;
mod reach;
mod reconcile;
mod sampler;
mod snapshots;

pub use creation::{CreateOptions, Quota};
pub use fork::{Fork, Forked, MAX_FORKS};

use creation::{Creation, Pending};
use reach::{answer, Reach, Seen};
use snapshots::unexpected;

/// How long a question to a sandbox's actor may take (it answers from its
/// own state; an install status may ask the agent, within its own deadline).
const QUERY_DEADLINE: Duration = Duration::from_secs(5);
const STATUS_DEADLINE: Duration = Duration::from_secs(15);
/// How long a stop may spend removing what no record explains: a stop must
/// end, and the next start does the same work.
const SWEEP_DEADLINE: Duration = Duration::from_secs(15);

/// Figures about the sandboxes of this server, for its metrics.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub by_status: BTreeMap<SandboxStatus, usize>,
    /// Hibernated sandboxes whose actors rested: they cost the server their
    /// registry entry only.
    pub dormant: usize,
    pub pool: PoolStats,
    pub container_restarts: u64,
    pub installs_succeeded: u64,
    pub installs_failed: u64,
    /// Connections the egress proxy refused, by reason.
    pub egress_denied: BTreeMap<&'static str, u64>,
    pub resources: Resources,
    /// This month's figures of the tenants that used the most CPU (at most
    /// [`TOP_TENANTS`]), so that per-tenant series stay few.
    pub top_tenants: Vec<(String, Totals)>,
}

/// Tenants whose month's usage the metrics show.
pub const TOP_TENANTS: usize = 10;

/// A sandbox that belongs to someone, as the cluster's directory lists it.
#[derive(Debug, Clone)]
pub struct Held {
    pub id: Uuid,
    pub owner: String,
    /// Hibernated: it holds no memory, and the quotas of live sandboxes
    /// leave it out.
    pub asleep: bool,
}

pub struct Sandboxes {
    ctx: Arc<Context>,
    registry: Registry,
    reach: Reach,
    pending: Pending,
    pools: Pools,
    supervisor: ActorRef<SupervisorMsg>,
    server_id: String,
    /// Taken (and stopped) at shutdown.
    sampler: Mutex<Option<Sampler>>,
}

impl Sandboxes {
    /// Opens the records, connects to Docker, builds the sandbox image if it
    /// is missing, and adopts or cleans up what an earlier run left.
    pub async fn start(settings: Settings) -> Result<Self> {
        let store = open_store(&settings)?;
        let server_id = server_id(&settings.state_dir)?;
        let host = sandbox_host::syscalls::linux();
        let mut runtime = DockerRuntime::connect(
            &server_id,
            &settings.sandbox,
            &settings.state_dir,
            settings.agents_dir(),
            host.clone(),
        )
        .await?;
        runtime.ensure_image(&settings.state_dir).await?;
        runtime.choose_oci_runtime().await?;
        let sandbox_net = runtime.isolate_network().await?;
        let egress = Egress::new(settings.egress(), sandbox_net.into_iter().collect())?;
        Self::with_runtime(settings, store, server_id, Arc::new(runtime), egress, host).await
    }

    /// Builds the sandbox image unless present, and returns its tag.
    pub async fn build_image(settings: &Settings) -> Result<String> {
        let runtime = Self::builder(settings, Some("image-build")).await?;
        Ok(runtime.ensure_image(&settings.state_dir).await?)
    }

    /// Builds the sandbox image and the templates (or template `only`)
    /// unless present, labelled as this state folder's server's (whose
    /// start removes them once unused), and returns them as listed.
    pub async fn build_templates(settings: &Settings, only: Option<&str>) -> Result<Vec<TemplateInfo>> {
        let configs: Vec<_> = settings
            .templates
            .iter()
            .filter(|t| only.is_none_or(|n| n == t.name))
            .cloned()
            .collect();
        if let (Some(name), true) = (only, configs.is_empty()) {
            return Err(crate::templates::TemplateError::unknown(name).into());
        }
        let runtime = Self::builder(settings, None).await?;
        runtime.ensure_image(&settings.state_dir).await?;
        Ok(Templates::build(&runtime, &configs, settings.sandbox.results_mb)
            .await
            .list())
    }

    /// A runtime for building images, with the state folder made, as
    /// server `name` (none: the state folder's server).
    async fn builder(settings: &Settings, name: Option<&str>) -> Result<DockerRuntime> {
        std::fs::create_dir_all(&settings.state_dir)
            .map_err(|e| SandboxError::Internal(format!("creating the state folder: {e}")))?;
        let name = match name {
            Some(n) => n.to_string(),
            None => server_id(&settings.state_dir)?,
        };
        Ok(DockerRuntime::connect(
            &name,
            &settings.sandbox,
            &settings.state_dir,
            settings.agents_dir(),
            sandbox_host::syscalls::linux(),
        )
        .await?)
    }

    pub async fn with_runtime(
        settings: Settings,
        store: RecordStore,
        server_id: String,
        runtime: Arc<dyn ContainerRuntime>,
        egress: Egress,
        host: Arc<dyn Syscalls>,
    ) -> Result<Self> {
        let meter = Meter::open(store.clone(), &settings.usage).await?;
        let disks = settings.disks(host);
        let registry = Registry::default();
        let templates = Templates::build(runtime.as_ref(), &settings.templates, settings.sandbox.results_mb).await;
        let ctx = Arc::new(Context {
            templates,
            census: Census::new(registry.clone()),
            calls: Arc::default(),
            runtime,
            store,
            meter,
            forks: Default::default(),
            counters: EventCounts::default(),
            egress,
            snapshots: Snapshots::new(&settings, disks.clone()),
            disks,
            settings,
        });
        ctx.disks.check().await?;
        let (supervisor, _) = Actor::spawn(None, Supervisor, (ctx.clone(), registry.clone()))
            .await
            .map_err(|e| SandboxError::Internal(e.to_string()))?;
        let most_waiting = ctx.settings.sandbox.max_queued_calls;
        let me = Self {
            pools: Pools::off(ctx.clone()),
            ctx,
            reach: Reach {
                registry: registry.clone(),
                supervisor: supervisor.clone(),
                most_waiting,
            },
            registry,
            pending: Pending::default(),
            supervisor,
            server_id,
            sampler: Mutex::new(None),
        };
        me.reconcile().await?;
        me.remove_unused_templates().await;
        // Filled only now: reconciling would remove pooled sandboxes, which
        // have no record.
        let (ctx, pending) = (me.ctx.clone(), me.pending.clone());
        let total = me.ctx.settings.max_sandboxes_total;
        let room = Arc::new(move || {
            let live = ctx.census.count(None, false);
            let creating: usize = pending.lock().expect("pending lock").values().sum();
            total.saturating_sub(live + creating)
        });
        let me = Self {
            pools: Pools::start(me.ctx.clone(), &me.ctx.settings.pool, room),
            ..me
        };
        *me.sampler.lock().expect("sampler lock") = Some(Sampler::start(me.ctx.clone(), me.registry.clone()));
        Ok(me)
    }

    /// The value of the server label on this server's Docker objects.
    pub fn server_id(&self) -> &str {
        &self.server_id
    }

    async fn spawn(&self, record: SandboxRecord) -> Result<ActorRef<SandboxMsg>> {
        spawn_actor(&self.supervisor, record, None).await
    }

    /// Sends a request to a sandbox's actor (see [`Reach::ask`]).
    async fn ask<T: Send + 'static>(
        &self,
        scope: Scope<'_>,
        id: Uuid,
        deadline: Option<Duration>,
        msg: impl FnOnce(ractor::RpcReplyPort<T>) -> SandboxMsg,
    ) -> Result<T> {
        self.reach.ask(scope, id, deadline, msg).await
    }

    /// A question answered from the actor's own state.
    async fn query<T: Send + 'static>(
        &self,
        scope: Scope<'_>,
        id: Uuid,
        msg: impl FnOnce(ractor::RpcReplyPort<T>) -> SandboxMsg,
    ) -> Result<T> {
        self.ask(scope, id, Some(QUERY_DEADLINE), msg).await
    }

    /// Whether Docker answers.
    pub async fn ping(&self) -> Result<()> {
        Ok(self.ctx.runtime.ping().await?)
    }

    /// The sandboxes in `scope`, oldest first. Dormant ones are described
    /// from their records, which wakes nothing.
    pub async fn list<'a>(&self, scope: impl Into<Scope<'a>>) -> Vec<SandboxInfo> {
        let (awake, dormant) = self.reach.split(scope.into());
        let asked = awake.into_iter().map(|id| self.info(Scope::Everyone, id));
        let mut out: Vec<SandboxInfo> = futures_util::future::join_all(asked)
            .await
            .into_iter()
            .filter_map(|answer| match answer {
                Ok(info) => Some(info),
                Err(SandboxError::NotFound(_)) => None,
                Err(e) => {
                    warn!(error = %e, "a sandbox did not answer the listing; left out");
                    None
                }
            })
            .collect();
        out.extend(self.describe_dormant(dormant).await);
        out.sort_by_key(|i| i.created_at);
        out
    }

    /// Dormant sandboxes as listings show them; none if their records
    /// cannot be read (logged).
    async fn describe_dormant(&self, dormant: HashMap<Uuid, OffsetDateTime>) -> Vec<SandboxInfo> {
        describe_dormant(&self.ctx, dormant).await.unwrap_or_else(|e| {
            warn!(error = %e, "could not read the records of sleeping sandboxes; left out of the listing");
            Vec::new()
        })
    }

    /// Runs Python code or a shell command; dropping the returned future
    /// (the client cancelled) interrupts the run.
    pub async fn run<'a>(
        &self,
        scope: impl Into<Scope<'a>>,
        id: Uuid,
        work: Work,
        timeout_seconds: Option<u64>,
        progress: Option<mpsc::Sender<Progress>>,
    ) -> Result<Ran> {
        let timeout = self.timeout(timeout_seconds)?;
        let cancel = CancellationToken::new();
        let _guard = cancel.clone().drop_guard();
        let result = self
            .ask(scope.into(), id, None, |reply| {
                SandboxMsg::Run(RunRequest {
                    work,
                    timeout,
                    progress,
                    cancel: cancel.clone(),
                    reply,
                })
            })
            .await?;
        let _ = _guard.disarm();
        result
    }

    fn timeout(&self, requested: Option<u64>) -> Result<Duration> {
        let s = &self.ctx.settings.sandbox;
        match requested {
            None => Ok(Duration::from_secs(s.exec_timeout_seconds)),
            Some(0) => Err(SandboxError::InvalidArgument(
                "timeout_seconds must be at least 1".into(),
            )),
            Some(t) if t > s.max_exec_timeout_seconds => Err(SandboxError::InvalidArgument(format!(
                "timeout_seconds is at most {} on this server",
                s.max_exec_timeout_seconds
            ))),
            Some(t) => Ok(Duration::from_secs(t)),
        }
    }

    /// Queues an install and waits up to `wait` for it to finish.
    pub async fn install<'a>(
        &self,
        scope: impl Into<Scope<'a>>,
        id: Uuid,
        package: &str,
        wait: Duration,
    ) -> Result<InstallStatus> {
        let specs = packages::parse_specs(package)?;
        resources::check_free_disk(&self.ctx.settings)?;
        let package = specs.join(" ");
        let mut rx: watch::Receiver<InstallRecord> = self
            .query(scope.into(), id, |reply| SandboxMsg::Install {
                package: package.clone(),
                specs,
                reply,
            })
            .await??;
        let _ = tokio::time::timeout(wait, rx.wait_for(|r| r.status != InstallState::Installing)).await;
        let record = rx.borrow().clone();
        Ok((&record).into())
    }

    pub async fn install_status<'a>(
        &self,
        scope: impl Into<Scope<'a>>,
        id: Uuid,
        package: &str,
    ) -> Result<InstallStatus> {
        let package = packages::parse_specs(package)?.join(" ");
        self.ask(scope.into(), id, Some(STATUS_DEADLINE), |reply| {
            SandboxMsg::InstallStatus { package, reply }
        })
        .await?
    }

    /// Gives the sandbox's Python a fresh namespace in turn with its other
    /// calls (files and packages stay); answers with a notice, if any.
    pub async fn reset_python<'a>(&self, scope: impl Into<Scope<'a>>, id: Uuid) -> Result<Option<String>> {
        self.ask(scope.into(), id, None, |reply| {
            SandboxMsg::Queued(Queued::ResetPython { reply })
        })
        .await?
    }

    /// Puts the sandbox to sleep on disk in turn with its other calls; its
    /// next call wakes it.
    pub async fn hibernate<'a>(&self, scope: impl Into<Scope<'a>>, id: Uuid) -> Result<Slept> {
        self.ask(scope.into(), id, None, SandboxMsg::Hibernate).await?
    }

    /// Restarts the sandbox's container in turn with its other calls.
    pub async fn restart<'a>(&self, scope: impl Into<Scope<'a>>, id: Uuid) -> Result<SandboxInfo> {
        let scope = scope.into();
        self.ask(scope, id, None, |reply| SandboxMsg::Queued(Queued::Restart { reply }))
            .await??;
        self.info(scope, id).await
    }

    /// A call on the sandbox's background processes, in turn with its other
    /// calls; answers with a notice, if any.
    pub async fn process<'a>(
        &self,
        scope: impl Into<Scope<'a>>,
        id: Uuid,
        mut op: ProcessOp,
    ) -> Result<(ProcessAnswer, Option<String>)> {
        processes::check(&op)?;
        if let ProcessOp::Start(start) = &mut op {
            let limits = &self.ctx.settings.processes;
            start.keep = limits.output_kept_kb * 1024;
            start.max_processes = limits.max_per_sandbox;
        }
        self.ask(scope.into(), id, None, |reply| {
            SandboxMsg::Queued(Queued::Process { op, reply })
        })
        .await?
    }

    /// Exposes `port` through preview links, or ends its links; answers
    /// with the ports exposed now.
    pub async fn expose_port<'a>(
        &self,
        scope: impl Into<Scope<'a>>,
        id: Uuid,
        port: u16,
        expose: bool,
    ) -> Result<Vec<u16>> {
        self.query(scope.into(), id, |reply| SandboxMsg::Expose { port, expose, reply })
            .await?
    }

    /// Whether a preview request may reach `port`: exposed, and the sandbox
    /// not being deleted (a paused one is woken). For a preview link whose
    /// token proved the right to it, so in no tenant's scope.
    pub async fn let_preview_through(&self, id: Uuid, port: u16) -> Result<()> {
        self.query(Scope::Everyone, id, |reply| SandboxMsg::Preview { port, reply })
            .await?
    }

    /// A connection to an exposed `port` inside the sandbox, for a request
    /// [`Self::let_preview_through`] lets through.
    pub async fn open_preview(&self, id: Uuid, port: u16) -> Result<PortStream> {
        self.let_preview_through(id, port).await?;
        self.ctx
            .runtime
            .open_port(&self.ctx.paths(id), port)
            .await
            .map_err(|e| match e {
                PortError::Refused(why) => SandboxError::InvalidArgument(why),
                other => SandboxError::Preview(other),
            })
    }

    /// A sandbox's listing; a dormant one's is read from its record, which
    /// wakes nothing.
    pub async fn info<'a>(&self, scope: impl Into<Scope<'a>>, id: Uuid) -> Result<SandboxInfo> {
        let scope = scope.into();
        if let Seen::Dormant(last_used) = self.reach.seen(scope, id)? {
            if let Some(info) = self.describe_dormant(HashMap::from([(id, last_used)])).await.pop() {
                return Ok(info);
            }
        }
        self.query(scope, id, SandboxMsg::Info).await
    }

    /// The recent calls on a sandbox, oldest first.
    pub async fn history<'a>(&self, scope: impl Into<Scope<'a>>, id: Uuid) -> Result<Vec<CallRecord>> {
        self.query(scope.into(), id, SandboxMsg::History).await
    }

    /// CPU and memory use of a sandbox's container.
    pub async fn usage<'a>(&self, scope: impl Into<Scope<'a>>, id: Uuid) -> Result<Usage> {
        let container = self.info(scope, id).await?.container_id;
        let usage = tokio::time::timeout(QUERY_DEADLINE, self.ctx.runtime.usage(&container))
            .await
            .map_err(|_| DockerError::UsageTimedOut)??;
        Ok(usage)
    }

    /// The hourly usage rows from `from` up to `to` (Unix seconds) of the
    /// tenants `scope` admits, written or not.
    pub async fn usage_report<'a>(&self, scope: impl Into<Scope<'a>>, from: u64, to: u64) -> Result<Vec<Row>> {
        let tenant = match scope.into() {
            Scope::Everyone => None,
            Scope::Owner(owner) => Some(owner),
        };
        self.ctx.meter.report(from, to, tenant).await
    }

    /// What `tenant` used this month (UTC), and when the month ends.
    pub fn usage_this_month(&self, tenant: &str) -> (Totals, time::OffsetDateTime) {
        self.ctx.meter.this_month(tenant)
    }

    /// This month's totals of the `most` tenants that used the most CPU
    /// here.
    pub fn month_by_tenant(&self, most: usize) -> Vec<(String, Totals)> {
        self.ctx.meter.top_this_month(most)
    }

    /// Figures for the server's metrics; dormant sandboxes are counted,
    /// not read.
    pub async fn stats(&self) -> Stats {
        let mut by_status = BTreeMap::new();
        let (awake, dormant) = self.reach.split(Scope::Everyone);
        if !dormant.is_empty() {
            by_status.insert(SandboxStatus::Hibernated, dormant.len());
        }
        let asked = awake.into_iter().map(|id| self.info(Scope::Everyone, id));
        for info in futures_util::future::join_all(asked).await.into_iter().flatten() {
            *by_status.entry(info.status).or_default() += 1;
        }
        let c = &self.ctx.counters;
        let read = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed);
        Stats {
            by_status,
            dormant: dormant.len(),
            pool: self.pools.stats(),
            container_restarts: read(&c.container_restarts),
            installs_succeeded: read(&c.installs_succeeded),
            installs_failed: read(&c.installs_failed),
            egress_denied: self.ctx.egress.denials(),
            resources: self.resources(),
            top_tenants: self.ctx.meter.top_this_month(TOP_TENANTS),
        }
    }

    /// The sandboxes that belong to someone, with their owners and whether
    /// each is hibernated.
    pub fn held(&self) -> Vec<Held> {
        let registry = self.registry.read().expect("registry lock");
        registry
            .iter()
            .map(|(id, r)| Held {
                id: *id,
                owner: r.owner.clone(),
                asleep: r.asleep.load(Ordering::Acquire),
            })
            .collect()
    }

    /// How many sandboxes are awake (those that hold memory).
    pub fn awake(&self) -> usize {
        self.ctx.census.count(None, false)
    }

    /// Whether sandbox `id` is one of this server's (anyone's).
    pub fn holds(&self, id: Uuid) -> bool {
        self.registry.read().expect("registry lock").contains_key(&id)
    }

    /// The templates in force, built or not.
    pub fn templates(&self) -> Vec<TemplateInfo> {
        self.ctx.templates.list()
    }

    /// Removes the template images that neither a template in force nor a
    /// sandbox uses (a sandbox keeps the image of the definition it was
    /// made from until it is deleted).
    async fn remove_unused_templates(&self) {
        let recorded = match self.ctx.store.all().await {
            Ok(records) => records
                .into_iter()
                .filter_map(|r| r.template.map(|t| t.image))
                .collect::<Vec<_>>(),
            Err(e) => return warn!(error = %e, "could not read the records; unused template images stay"),
        };
        let Some(keep) = self.ctx.templates.images_in_use(recorded) else {
            return info!("a template could not be built: no template image is removed at this start");
        };
        match self.ctx.runtime.remove_unused_templates(&keep).await {
            Ok(removed) if !removed.is_empty() => info!(?removed, "removed template images nothing uses"),
            Ok(_) => {}
            Err(e) => warn!(error = %e, "could not remove unused template images"),
        }
    }

    /// Pooled sandboxes ready to be claimed.
    pub fn pool_ready(&self) -> usize {
        self.pools.ready()
    }

    /// The memory one sandbox may take (`sandbox.memory_mb`).
    pub fn sandbox_memory_mb(&self) -> u64 {
        self.ctx.settings.sandbox.memory_mb
    }

    /// Free disk and the memory the sandboxes may take, for `/health`,
    /// metrics and the cluster's placement: the awake ones' and the pool's,
    /// each at its template's limit or `sandbox.memory_mb` (a sandbox asleep
    /// on disk holds none).
    pub fn resources(&self) -> Resources {
        let default = self.ctx.settings.sandbox.memory_mb;
        let awake_mb: u64 = {
            let registry = self.registry.read().expect("registry lock");
            registry
                .iter()
                .filter(|(_, e)| !e.asleep.load(Ordering::Acquire))
                .map(|(id, _)| self.ctx.templates.of(*id).and_then(|t| t.memory_mb).unwrap_or(default))
                .sum()
        };
        let limits_mb = awake_mb + self.pools.ready_memory_mb(default);
        Resources {
            disk_free_bytes: resources::sandbox_disk_free_bytes(&self.ctx.settings),
            memory_limits_bytes: limits_mb << 20,
            host_memory_bytes: sandbox_host::figures::memory_bytes(),
        }
    }

    pub async fn delete<'a>(&self, scope: impl Into<Scope<'a>>, id: Uuid) -> Result<()> {
        self.ask(scope.into(), id, None, |reply| SandboxMsg::Delete {
            reply,
            by_owner: true,
        })
        .await??;
        // Gone now, not when the supervisor hears that the actor stopped.
        self.registry.write().expect("registry lock").remove(&id);
        Ok(())
    }

    /// Stops the actors; containers keep running and the next start adopts
    /// them. What no record explains is removed; with no sandbox left, the
    /// server's network and firewall rules are removed too, so a stopped
    /// server leaves nothing behind.
    pub async fn shutdown(&self) {
        let sampler = self.sampler.lock().expect("sampler lock").take();
        if let Some(sampler) = sampler {
            sampler.stop().await;
        }
        self.pools.drain().await;
        let none_left = self.registry.read().expect("registry lock").is_empty();
        self.supervisor
            .stop_children_and_wait(Some("shutdown".into()), Some(Duration::from_secs(10)))
            .await;
        let _ = self
            .supervisor
            .stop_and_wait(Some("shutdown".into()), Some(Duration::from_secs(10)))
            .await;
        // Work still finishing (a run's task, a status query) holds the
        // context and with it the record store; let it end, briefly. What
        // remains is this value's own handle, the pools' and the room they
        // share.
        for _ in 0..100 {
            if Arc::strong_count(&self.ctx) <= 2 + self.pools.count() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Not while creations are under way (their records may still come):
        // the next start removes what they leave, as it does after a crash.
        let creating: usize = self.pending.lock().expect("pending lock").values().sum();
        if creating > 0 {
            info!(
                creating,
                "creations still under way at the stop; the next start removes what they leave"
            );
        } else {
            match tokio::time::timeout(SWEEP_DEADLINE, self.sweep()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    warn!(error = %e, "could not look for leftovers at the stop; the next start removes them")
                }
                Err(_) => {
                    warn!("the engine was too slow to look for leftovers at the stop; the next start removes them")
                }
            }
        }
        if none_left {
            if let Err(e) = self.ctx.runtime.release().await {
                warn!(error = %e, "could not remove the sandbox network");
            }
        }
    }
}

/// Dormant sandboxes (with when each was last used) as listings show them,
/// from their records read at once.
pub(super) async fn describe_dormant(
    ctx: &Context,
    dormant: HashMap<Uuid, OffsetDateTime>,
) -> Result<Vec<SandboxInfo>> {
    if dormant.is_empty() {
        return Ok(Vec::new());
    }
    let records = ctx.store.some(dormant.keys().copied().collect()).await?;
    Ok(records
        .iter()
        .map(|r| crate::sandbox::dormant_info(ctx, r, dormant[&r.id]))
        .collect())
}

/// Makes the server's folders and opens its records.
fn open_store(settings: &Settings) -> Result<RecordStore> {
    let io = |what: &str, e: std::io::Error| SandboxError::Internal(format!("{what}: {e}"));
    std::fs::create_dir_all(settings.agents_dir()).map_err(|e| io("creating the state folder", e))?;
    std::fs::create_dir_all(&settings.results_dir).map_err(|e| io("creating the results folder", e))?;
    RecordStore::open(&settings.state_dir.join("records.redb"))
}

#[cfg(any(test, feature = "test-runtime"))]
impl Sandboxes {
    /// Starts the domain on the in-memory runtime, as [`Sandboxes::start`]
    /// does on Docker: for the engine-free tests of this crate and of the
    /// front end.
    /// Every mount and `mkfs` goes to `host` (in tests, a recording double).
    pub async fn on_fake(
        settings: Settings,
        fake: &sandbox_runtime::fake::FakeRuntime,
        host: Arc<dyn Syscalls>,
    ) -> Result<Self> {
        let store = open_store(&settings)?;
        let egress = Egress::new(settings.egress(), vec![])?;
        Self::with_runtime(settings, store, "fake".into(), Arc::new(fake.clone()), egress, host).await
    }
}

/// What the engine-free tests look at directly.
#[cfg(test)]
impl Sandboxes {
    /// Its actor, when it has one (a dormant sandbox has none).
    pub(crate) fn actor_of(&self, id: Uuid) -> Option<ActorRef<SandboxMsg>> {
        let registry = self.registry.read().expect("registry lock");
        registry.get(&id).and_then(|e| e.actor().cloned())
    }

    /// Asks its actor whether it rests, as the upkeep asks a sleeping one.
    pub(crate) fn ask_to_rest(&self, id: Uuid) {
        crate::supervisor::ask_to_rest(&self.registry, &self.supervisor, &Default::default(), id);
    }
}

/// Starts the actor of `record`; `started` when its creation just started
/// its container.
async fn spawn_actor(
    supervisor: &ActorRef<SupervisorMsg>,
    record: SandboxRecord,
    started: Option<Started>,
) -> Result<ActorRef<SandboxMsg>> {
    ractor::call!(supervisor, |reply| SupervisorMsg::Spawn {
        record: Box::new(record),
        started,
        reply,
    })
    .map_err(|e| SandboxError::Internal(e.to_string()))?
    .map_err(|e| SandboxError::Internal(e.to_string()))
}

/// This server's id, made on first start and kept in `state_dir/server-id`:
/// it is the value of the server label on everything the server creates, so
/// a restarted server finds (and adopts) what it made before.
fn server_id(state_dir: &Path) -> Result<String> {
    let path = state_dir.join("server-id");
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => Ok(id.trim().to_string()),
        _ => {
            let id = Uuid::new_v4().simple().to_string()[..12].to_string();
            std::fs::write(&path, format!("{id}\n")).map_err(|source| StoreError::ServerId { path, source })?;
            Ok(id)
        }
    }
}
