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
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef};
use time::OffsetDateTime;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use uuid::Uuid;

use crate::agent::{Progress, Work};
use crate::config::{EgressPolicy, Settings};
use crate::context::{Context, Counters};
use crate::egress::Egress;
use crate::error::{DockerError, Result, SandboxError, StoreError};
use crate::files::{self, FileError, FileRead, ListOptions, Listing, ResultsPath, Window, MAX_WRITE_BYTES};
use crate::history::CallRecord;
use crate::host::{self, Resources};
use crate::link::Ran;
use crate::messages::{Queued, RunRequest, SandboxMsg};
use crate::packages;
use crate::pool::{self, Pool, PoolStats};
use crate::records::{InstallRecord, InstallState, RecordStore, SandboxRecord};
use crate::results::{InstallStatus, SandboxInfo, Uploaded};
use crate::runtime::disk::Disks;
use crate::runtime::{ContainerRuntime, ContainerState, DockerRuntime, Usage};
use crate::sandbox::remove_everything;
use crate::scope::Scope;
use crate::snapshots::{Restored, SnapshotDone, SnapshotInfo, SnapshotOp, Snapshots, MAX_LABEL};
use crate::status::SandboxStatus;
use crate::supervisor::{Registry, Supervisor, SupervisorMsg};
use crate::uploads::{self, UploadSource};

mod fork;

pub use fork::{Fork, Forked, MAX_FORKS};

/// How long a question to a sandbox's actor may take (it answers from its
/// own state; an install status may ask the agent, within its own deadline).
const QUERY_DEADLINE: Duration = Duration::from_secs(5);
const STATUS_DEADLINE: Duration = Duration::from_secs(15);

/// How many sandboxes one owner, and the server in total, may hold.
#[derive(Debug, Clone, Copy)]
pub struct Quota {
    pub per_owner: usize,
    pub total: usize,
}

/// Choices made when a sandbox is created, beyond the server's settings.
#[derive(Debug, Clone, Default)]
pub struct CreateOptions {
    /// The sandbox is deleted this long after creation, or earlier when
    /// `sandbox.max_lifetime_seconds` says so (a short-lived tenant's
    /// sandboxes end with it).
    pub lifetime: Option<Duration>,
    /// The egress policy (the caller's key may set one); `None`: the server's.
    pub egress: Option<EgressPolicy>,
}

impl Quota {
    pub const UNLIMITED: Quota = Quota {
        per_owner: usize::MAX,
        total: usize::MAX,
    };
}

type Pending = Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>;

/// Places held for sandboxes being created.
struct Reservation {
    pending: Pending,
    owner: String,
    places: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut pending = self.pending.lock().expect("pending lock");
        if let Some(n) = pending.get_mut(&self.owner) {
            *n -= self.places;
            if *n == 0 {
                pending.remove(&self.owner);
            }
        }
    }
}

/// Figures about the sandboxes of this server, for its metrics.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub by_status: BTreeMap<SandboxStatus, usize>,
    pub pool: PoolStats,
    pub container_restarts: u64,
    pub installs_succeeded: u64,
    pub installs_failed: u64,
    /// Connections the egress proxy refused, by reason.
    pub egress_denied: BTreeMap<&'static str, u64>,
    pub resources: Resources,
}

pub struct Sandboxes {
    ctx: Arc<Context>,
    registry: Registry,
    pending: Pending,
    pool: Arc<Pool>,
    supervisor: ActorRef<SupervisorMsg>,
    server_id: String,
}

impl Sandboxes {
    /// Opens the records, connects to Docker, builds the sandbox image if it
    /// is missing, and adopts or cleans up what an earlier run left.
    pub async fn start(settings: Settings) -> Result<Self> {
        let io = |what: &str, e: std::io::Error| SandboxError::Internal(format!("{what}: {e}"));
        std::fs::create_dir_all(settings.agents_dir()).map_err(|e| io("creating the state folder", e))?;
        std::fs::create_dir_all(&settings.results_dir).map_err(|e| io("creating the results folder", e))?;
        let store = RecordStore::open(&settings.state_dir.join("records.redb"))?;
        let server_id = server_id(&settings.state_dir)?;
        let mut runtime = DockerRuntime::connect(&server_id, settings.sandbox.clone(), settings.agents_dir()).await?;
        runtime.ensure_image(&settings.state_dir).await?;
        let sandbox_net = runtime.isolate_network().await?;
        let egress = Egress::new(&settings, sandbox_net.into_iter().collect())?;
        Self::with_runtime(settings, store, server_id, Arc::new(runtime), egress).await
    }

    /// Builds the sandbox image unless present, and returns its tag.
    pub async fn build_image(settings: &Settings) -> Result<String> {
        std::fs::create_dir_all(&settings.state_dir)
            .map_err(|e| SandboxError::Internal(format!("creating the state folder: {e}")))?;
        let runtime = DockerRuntime::connect("image-build", settings.sandbox.clone(), settings.agents_dir()).await?;
        runtime.ensure_image(&settings.state_dir).await
    }

    pub async fn with_runtime(
        settings: Settings,
        store: RecordStore,
        server_id: String,
        runtime: Arc<dyn ContainerRuntime>,
        egress: Egress,
    ) -> Result<Self> {
        let ctx = Arc::new(Context {
            runtime,
            store,
            counters: Counters::default(),
            egress,
            disks: Disks::new(&settings),
            snapshots: Snapshots::new(&settings),
            settings,
        });
        ctx.disks.check().await?;
        let registry = Registry::default();
        let (supervisor, _) = Actor::spawn(None, Supervisor, (ctx.clone(), registry.clone()))
            .await
            .map_err(|e| SandboxError::Internal(e.to_string()))?;
        let me = Self {
            pool: Pool::off(ctx.clone()),
            ctx,
            registry,
            pending: Pending::default(),
            supervisor,
            server_id,
        };
        me.reconcile().await?;
        // Filled only now: reconciling would remove pooled sandboxes, which
        // have no record.
        let (registry, pending) = (me.registry.clone(), me.pending.clone());
        let total = me.ctx.settings.max_sandboxes_total;
        let room = Box::new(move || {
            let live = registry.read().expect("registry lock").len();
            let creating: usize = pending.lock().expect("pending lock").values().sum();
            total.saturating_sub(live + creating)
        });
        let me = Self {
            pool: Pool::start(me.ctx.clone(), &me.ctx.settings.pool, room),
            ..me
        };
        Ok(me)
    }

    /// The value of the server label on this server's Docker objects.
    pub fn server_id(&self) -> &str {
        &self.server_id
    }

    /// Adopts sandboxes of an earlier run, removes expired ones, and removes
    /// labelled containers, volumes and folders that no record explains.
    async fn reconcile(&self) -> Result<()> {
        let now = OffsetDateTime::now_utc();
        // Sandbox → its current container; anything else labelled is a
        // leftover (an installer, a container replaced by a re-creation).
        let mut known: HashMap<Uuid, String> = HashMap::new();
        // One object that cannot be removed now (the engine is still busy
        // with a removal the previous server began, say) never stops the
        // start: it is logged, and a deleted sandbox's actor retries.
        for mut record in self.ctx.store.all().await? {
            if record.deleting || record.seeding.is_some() || record.expires_at.is_some_and(|t| t <= now) {
                info!(
                    sandbox = %record.id, deleting = record.deleting, unfinished_fork = ?record.seeding,
                    "removing a deleted or expired sandbox, or a fork that never answered"
                );
                match remove_everything(&self.ctx, &record).await {
                    Ok(()) => continue,
                    Err(e) => {
                        warn!(sandbox = %record.id, error = %e, "could not remove a deleted sandbox yet; retrying");
                        record.deleting = true;
                    }
                }
            }
            known.insert(record.id, record.container_id.clone());
            let egress = record.egress.unwrap_or(self.ctx.egress.default_policy());
            self.ctx.egress.attach(record.id, egress)?;
            self.remount(&record).await?;
            self.spawn(record).await?;
        }
        let runtime = &self.ctx.runtime;
        for c in runtime.list_containers().await? {
            if c.sandbox.is_none_or(|id| known.get(&id) != Some(&c.id)) {
                info!(container = %c.id, "removing a container no record explains");
                if let Err(e) = runtime.remove(&c.id, None).await {
                    warn!(container = %c.id, error = %e, "could not remove a leftover container; the next start tries again");
                }
            }
        }
        for v in runtime.list_volumes().await? {
            if !v.sandbox.is_some_and(|id| known.contains_key(&id)) {
                info!(volume = %v.id, "removing a volume no record explains");
                if let Err(e) = runtime.remove_volume(&v.id).await {
                    warn!(volume = %v.id, error = %e, "could not remove a leftover volume; the next start tries again");
                }
            }
        }
        let known_ids = known.keys().copied().collect();
        self.ctx.disks.remove_orphans(&known_ids).await;
        self.ctx.snapshots.remove_orphans(&known_ids).await;
        self.ctx.snapshots.remove_exports().await;
        let s = &self.ctx.settings;
        for dir in [s.agents_dir(), s.state_dir.join("egress"), s.results_dir.clone()] {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let orphan =
                    Uuid::parse_str(&entry.file_name().to_string_lossy()).is_ok_and(|id| !known.contains_key(&id));
                if orphan {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        info!(
            server_id = %self.server_id,
            adopted = known.len(),
            "reconciled sandbox records with Docker"
        );
        Ok(())
    }

    /// Mounts an adopted sandbox's capped file systems again where they are
    /// missing (after a host reboot); a container that kept running on the
    /// bare folders meanwhile is restarted onto them.
    async fn remount(&self, record: &SandboxRecord) -> Result<()> {
        if self.ctx.disks.ensure(record.id).await? {
            info!(sandbox = %record.id, "mounted the sandbox's disks again");
            if self.ctx.runtime.state(&record.container_id).await? == ContainerState::Running {
                self.ctx.runtime.restart(&record.container_id).await?;
            }
        }
        Ok(())
    }

    async fn spawn(&self, record: SandboxRecord) -> Result<ActorRef<SandboxMsg>> {
        spawn_actor(&self.supervisor, record).await
    }

    fn actor(&self, scope: Scope, id: Uuid) -> Result<ActorRef<SandboxMsg>> {
        let registry = self.registry.read().expect("registry lock");
        match registry.get(&id) {
            Some(e) if scope.admits(&e.owner) => Ok(e.actor.clone()),
            _ => Err(SandboxError::NotFound(id)),
        }
    }

    /// Sends a request to a sandbox's actor. A stopped actor (deleted
    /// meanwhile) reads as not found; a reply port dropped by a live actor
    /// is a failure inside the server; a query past `deadline` says so.
    async fn ask<T: Send + 'static>(
        &self,
        scope: Scope<'_>,
        id: Uuid,
        deadline: Option<Duration>,
        msg: impl FnOnce(ractor::RpcReplyPort<T>) -> SandboxMsg,
    ) -> Result<T> {
        let actor = self.actor(scope, id)?;
        answer(&actor, id, actor.call(msg, deadline).await)
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
        self.ctx.runtime.ping().await
    }

    /// The host folder holding a sandbox's `/app/results` (a signed link
    /// proves access with [`Scope::Everyone`]), for whoever opens files in
    /// it through [`files`] (the inline images).
    pub fn results_dir<'a>(&self, scope: impl Into<Scope<'a>>, id: Uuid) -> Result<PathBuf> {
        self.actor(scope.into(), id)?;
        Ok(self.ctx.paths(id).results)
    }

    /// Runs `op` on the host folder holding a sandbox's `/app/results`, off
    /// the async threads and within a deadline ([`files::bounded`]).
    async fn on_results<T: Send + 'static>(
        &self,
        scope: Scope<'_>,
        id: Uuid,
        what: &str,
        op: impl FnOnce(&Path) -> std::result::Result<T, FileError> + Send + 'static,
    ) -> Result<T> {
        Ok(files::bounded(self.results_dir(scope, id)?, what, op).await?)
    }

    /// Opens a regular file under `/app/results` for serving.
    pub async fn open_file<'a>(&self, scope: impl Into<Scope<'a>>, id: Uuid, path: ResultsPath) -> Result<(File, u64)> {
        self.on_results(scope.into(), id, "opening the file", move |root| {
            files::open_file(root, &path)
        })
        .await
    }

    /// Lists a folder under `/app/results`.
    pub async fn list_files<'a>(
        &self,
        scope: impl Into<Scope<'a>>,
        id: Uuid,
        path: ResultsPath,
        options: ListOptions,
    ) -> Result<Listing> {
        self.on_results(scope.into(), id, "listing the folder", move |root| {
            files::list(root, &path, options)
        })
        .await
    }

    /// Reads a window of a text file under `/app/results`, or says what
    /// kind of file it is.
    pub async fn read_file<'a>(
        &self,
        scope: impl Into<Scope<'a>>,
        id: Uuid,
        path: ResultsPath,
        window: Window,
    ) -> Result<FileRead> {
        self.on_results(scope.into(), id, "reading the file", move |root| {
            files::read(root, &path, window)
        })
        .await
    }

    /// Writes `data` as the file `path` under `/app/results` (its folders
    /// are made), in turn with the sandbox's other calls: it is queued as an
    /// upload before this first awaits, so code sent afterwards sees it.
    pub async fn write_file<'a>(
        &self,
        scope: impl Into<Scope<'a>>,
        id: Uuid,
        path: ResultsPath,
        data: Vec<u8>,
    ) -> Result<Uploaded> {
        let scope = scope.into();
        self.actor(scope, id)?;
        let name = path.name().ok_or_else(|| FileError::IsFolder(path.absolute()))?;
        let name = uploads::check_file_name(name).map_err(|_| {
            SandboxError::InvalidArgument(format!(
                "{name:?} is not a file name: at most 255 bytes, no control characters"
            ))
        })?;
        if data.len() > MAX_WRITE_BYTES {
            return Err(FileError::TooLarge {
                what: "the content".into(),
                size: data.len(),
                max: MAX_WRITE_BYTES,
            }
            .into());
        }
        let dest = path.parent().absolute();
        self.send_upload(scope, id, UploadSource::Bytes { name, data }, &dest)
            .await
    }

    /// How many sandboxes `owner` has.
    fn count(&self, owner: &str) -> usize {
        let registry = self.registry.read().expect("registry lock");
        registry.values().filter(|e| e.owner == owner).count()
    }

    /// Counts `owner`'s sandboxes (and those being created) against `quota`
    /// and holds `places` more until the returned guard is dropped, so
    /// concurrent creations cannot exceed it.
    fn reserve(&self, owner: &str, quota: Quota, places: usize) -> Result<Reservation> {
        let mut pending = self.pending.lock().expect("pending lock");
        let registry = self.registry.read().expect("registry lock");
        let mine = registry.values().filter(|e| e.owner == owner).count() + pending.get(owner).copied().unwrap_or(0);
        let total = registry.len() + pending.values().sum::<usize>();
        if mine + places > quota.per_owner {
            let most = quota.per_owner;
            return Err(SandboxError::Quota(match places {
                1 => format!(
                    "you already have {mine} sandboxes, the most allowed: reuse one (list_sandboxes) or delete one with delete_sandbox, then create again"
                ),
                _ => format!(
                    "you have {mine} sandboxes and may have {most}, so {places} more do not fit: make fewer, or delete some with delete_sandbox"
                ),
            }));
        }
        if total + places > quota.total {
            return Err(SandboxError::Quota(format!(
                "the server holds its maximum of {} sandboxes; try again later",
                quota.total
            )));
        }
        *pending.entry(owner.to_string()).or_default() += places;
        Ok(Reservation {
            pending: self.pending.clone(),
            owner: owner.to_string(),
            places,
        })
    }

    /// The work of creating a sandbox for `owner`, which lives `lifetime`
    /// (or less, when `sandbox.max_lifetime_seconds` says so).
    fn creation(&self, owner: &str, name: String, egress: EgressPolicy, lifetime: Option<Duration>) -> Creation {
        let configured = self.ctx.settings.sandbox.max_lifetime_seconds;
        let configured = (configured > 0).then(|| Duration::from_secs(configured));
        let lifetime = match (configured, lifetime) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Creation {
            ctx: self.ctx.clone(),
            pool: self.pool.clone(),
            supervisor: self.supervisor.clone(),
            registry: self.registry.clone(),
            owner: owner.to_string(),
            name,
            egress,
            lifetime,
            seeding: None,
        }
    }

    /// Creates a sandbox for `owner`. The work runs in a task of its own: if
    /// the caller goes away before it ends, the new sandbox is removed, so
    /// nothing is left that nobody asked for.
    pub async fn create(
        &self,
        owner: &str,
        name: Option<String>,
        quota: Quota,
        options: CreateOptions,
    ) -> Result<SandboxInfo> {
        let name = match name.map(|n| n.trim().to_string()).filter(|n| !n.is_empty()) {
            Some(n) if n.chars().count() > 100 || n.chars().any(char::is_control) => {
                return Err(SandboxError::InvalidArgument(
                    "name: at most 100 characters, no control characters".into(),
                ))
            }
            Some(n) => n,
            // Counted in the registry: asking each of a tenant's actors for
            // its details would cost one message per sandbox per creation.
            None => format!("Sandbox {}", self.count(owner) + 1),
        };
        host::check_free_disk(&self.ctx.settings)?;
        let reservation = self.reserve(owner, quota, 1)?;
        let egress = options.egress.unwrap_or(self.ctx.egress.default_policy());
        let creation = self.creation(owner, name, egress, options.lifetime);
        let (mut tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let _reservation = reservation;
            let created = creation.run(tx.closed()).await;
            if let Err(Ok((info, actor))) = tx.send(created) {
                info!(sandbox = %info.sandbox_id, "the creator went away; removing the sandbox it asked for");
                creation.abandon(info.sandbox_id, actor).await;
            }
        });
        let (info, _) = rx
            .await
            .map_err(|_| SandboxError::Internal("the creation ended inside the server; try again".into()))??;
        Ok(info)
    }

    /// The sandboxes in `scope`, oldest first.
    pub async fn list<'a>(&self, scope: impl Into<Scope<'a>>) -> Vec<SandboxInfo> {
        let scope = scope.into();
        let actors: Vec<_> = {
            let registry = self.registry.read().expect("registry lock");
            registry
                .values()
                .filter(|e| scope.admits(&e.owner))
                .map(|e| e.actor.clone())
                .collect()
        };
        let asked = actors
            .iter()
            .map(|actor| actor.call(SandboxMsg::Info, Some(QUERY_DEADLINE)));
        let mut out: Vec<SandboxInfo> = futures_util::future::join_all(asked)
            .await
            .into_iter()
            .filter_map(|answer| match answer {
                Ok(CallResult::Success(info)) => Some(info),
                Ok(CallResult::Timeout) => {
                    warn!("a sandbox did not answer the listing in time; left out");
                    None
                }
                _ => None,
            })
            .collect();
        out.sort_by_key(|i| i.created_at);
        out
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
        host::check_free_disk(&self.ctx.settings)?;
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

    /// Copies a host file or folder (from an allowed folder) into the sandbox.
    pub async fn upload<'a>(
        &self,
        scope: impl Into<Scope<'a>>,
        id: Uuid,
        local_path: &str,
        dest: &str,
    ) -> Result<Uploaded> {
        let scope = scope.into();
        self.actor(scope, id)?;
        let source = UploadSource::Host(uploads::resolve_source(&self.ctx.settings, local_path)?);
        self.send_upload(scope, id, source, dest).await
    }

    /// Writes bytes sent by the caller as the file `name` in the sandbox.
    pub async fn upload_bytes<'a>(
        &self,
        scope: impl Into<Scope<'a>>,
        id: Uuid,
        name: &str,
        data: Vec<u8>,
        dest: &str,
    ) -> Result<Uploaded> {
        let scope = scope.into();
        self.actor(scope, id)?;
        let source = UploadSource::Bytes {
            name: uploads::check_file_name(name)?,
            data,
        };
        self.send_upload(scope, id, source, dest).await
    }

    async fn send_upload(&self, scope: Scope<'_>, id: Uuid, source: UploadSource, dest: &str) -> Result<Uploaded> {
        let dest = uploads::resolve_dest(dest)?;
        self.ask(scope, id, None, |reply| {
            SandboxMsg::Queued(Queued::Upload { source, dest, reply })
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

    /// Saves the sandbox's Python state, files and packages as a snapshot,
    /// in turn with its other calls; answers with a notice, if any.
    pub async fn snapshot<'a>(
        &self,
        scope: impl Into<Scope<'a>>,
        id: Uuid,
        label: Option<String>,
    ) -> Result<(SnapshotInfo, Option<String>)> {
        if let Some(label) = &label {
            if label.chars().count() > MAX_LABEL || label.chars().any(char::is_control) {
                return Err(SandboxError::InvalidArgument(format!(
                    "label: at most {MAX_LABEL} characters, none of them control characters"
                )));
            }
        }
        match self.snapshot_op(scope.into(), id, SnapshotOp::Take { label }).await? {
            (SnapshotDone::Taken(info), notice) => Ok((info, notice)),
            (other, _) => Err(unexpected(other)),
        }
    }

    /// Brings back a snapshot's Python state, files and packages, in turn
    /// with the sandbox's other calls.
    pub async fn restore_snapshot<'a>(
        &self,
        scope: impl Into<Scope<'a>>,
        id: Uuid,
        snapshot: Uuid,
    ) -> Result<(Restored, Option<String>)> {
        match self
            .snapshot_op(scope.into(), id, SnapshotOp::Restore { snapshot })
            .await?
        {
            (SnapshotDone::Restored(restored), notice) => Ok((restored, notice)),
            (other, _) => Err(unexpected(other)),
        }
    }

    /// Drops a snapshot: its parked Python state and its copies of the files.
    pub async fn delete_snapshot<'a>(&self, scope: impl Into<Scope<'a>>, id: Uuid, snapshot: Uuid) -> Result<()> {
        match self
            .snapshot_op(scope.into(), id, SnapshotOp::Delete { snapshot })
            .await?
        {
            (SnapshotDone::Deleted, _) => Ok(()),
            (other, _) => Err(unexpected(other)),
        }
    }

    /// A sandbox's snapshots, oldest first.
    pub async fn list_snapshots<'a>(&self, scope: impl Into<Scope<'a>>, id: Uuid) -> Result<Vec<SnapshotInfo>> {
        self.actor(scope.into(), id)?;
        let store = self.ctx.snapshots.clone();
        tokio::task::spawn_blocking(move || store.list(id))
            .await
            .map_err(|e| SandboxError::Internal(e.to_string()))
    }

    /// How many snapshots a sandbox may keep (0: snapshots are off).
    pub fn snapshot_limit(&self) -> usize {
        self.ctx.settings.sandbox.snapshots_per_sandbox
    }

    async fn snapshot_op(&self, scope: Scope<'_>, id: Uuid, op: SnapshotOp) -> Result<(SnapshotDone, Option<String>)> {
        self.ask(scope, id, None, |reply| {
            SandboxMsg::Queued(Queued::Snapshot { op, reply })
        })
        .await?
    }

    /// Restarts the sandbox's container in turn with its other calls.
    pub async fn restart<'a>(&self, scope: impl Into<Scope<'a>>, id: Uuid) -> Result<SandboxInfo> {
        let scope = scope.into();
        self.ask(scope, id, None, |reply| SandboxMsg::Queued(Queued::Restart { reply }))
            .await??;
        self.info(scope, id).await
    }

    pub async fn info<'a>(&self, scope: impl Into<Scope<'a>>, id: Uuid) -> Result<SandboxInfo> {
        self.query(scope.into(), id, SandboxMsg::Info).await
    }

    /// The recent calls on a sandbox, oldest first.
    pub async fn history<'a>(&self, scope: impl Into<Scope<'a>>, id: Uuid) -> Result<Vec<CallRecord>> {
        self.query(scope.into(), id, SandboxMsg::History).await
    }

    /// CPU and memory use of a sandbox's container.
    pub async fn usage<'a>(&self, scope: impl Into<Scope<'a>>, id: Uuid) -> Result<Usage> {
        let container = self.info(scope, id).await?.container_id;
        tokio::time::timeout(QUERY_DEADLINE, self.ctx.runtime.usage(&container))
            .await
            .map_err(|_| DockerError::UsageTimedOut)?
    }

    /// Figures for the server's metrics.
    pub async fn stats(&self) -> Stats {
        let mut by_status = BTreeMap::new();
        for info in self.list(Scope::Everyone).await {
            *by_status.entry(info.status).or_default() += 1;
        }
        let c = &self.ctx.counters;
        let read = |n: &std::sync::atomic::AtomicU64| n.load(std::sync::atomic::Ordering::Relaxed);
        Stats {
            by_status,
            pool: self.pool.stats(),
            container_restarts: read(&c.container_restarts),
            installs_succeeded: read(&c.installs_succeeded),
            installs_failed: read(&c.installs_failed),
            egress_denied: self.ctx.egress.denials(),
            resources: self.resources(),
        }
    }

    /// Free disk and the memory the sandboxes may take, for `/health` and metrics.
    pub fn resources(&self) -> Resources {
        let containers = self.registry.read().expect("registry lock").len() + self.pool.ready();
        Resources {
            disk_free_bytes: host::sandbox_disk_free_bytes(&self.ctx.settings),
            memory_limits_bytes: containers as u64 * (self.ctx.settings.sandbox.memory_mb << 20),
            host_memory_bytes: host::memory_bytes(),
        }
    }

    pub async fn delete<'a>(&self, scope: impl Into<Scope<'a>>, id: Uuid) -> Result<()> {
        self.ask(scope.into(), id, None, |reply| SandboxMsg::Delete { reply })
            .await??;
        // Gone now, not when the supervisor hears that the actor stopped.
        self.registry.write().expect("registry lock").remove(&id);
        Ok(())
    }

    /// Stops the actors; containers keep running and the next start adopts
    /// them. With no sandbox left, the server's network and firewall rules
    /// are removed too, so a stopped server leaves nothing behind.
    pub async fn shutdown(&self) {
        self.pool.drain().await;
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
        // remains is this value's own handle and the pool's.
        for _ in 0..100 {
            if Arc::strong_count(&self.ctx) <= 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if none_left {
            if let Err(e) = self.ctx.runtime.release().await {
                warn!(error = %e, "could not remove the sandbox network");
            }
        }
    }
}

/// What the engine-free tests look at directly.
#[cfg(test)]
impl Sandboxes {
    pub(crate) fn pool_ready(&self) -> usize {
        self.pool.ready()
    }

    pub(crate) fn actor_of(&self, id: Uuid) -> Option<ActorRef<SandboxMsg>> {
        let registry = self.registry.read().expect("registry lock");
        registry.get(&id).map(|e| e.actor.clone())
    }
}

/// What a call to an actor came to (see [`Sandboxes::ask`]).
fn answer<T>(
    actor: &ActorRef<SandboxMsg>,
    id: Uuid,
    called: std::result::Result<CallResult<T>, ractor::MessagingErr<SandboxMsg>>,
) -> Result<T> {
    match called {
        Ok(CallResult::Success(v)) => Ok(v),
        Ok(CallResult::Timeout) => Err(SandboxError::Internal(format!(
            "sandbox {id} did not answer in time; try again"
        ))),
        Ok(CallResult::SenderError) if actor.get_status() == ractor::ActorStatus::Running => Err(
            SandboxError::Internal("the call failed inside the server before it finished; run it again".into()),
        ),
        _ => Err(SandboxError::NotFound(id)),
    }
}

async fn spawn_actor(supervisor: &ActorRef<SupervisorMsg>, record: SandboxRecord) -> Result<ActorRef<SandboxMsg>> {
    ractor::call!(supervisor, |reply| SupervisorMsg::Spawn {
        record: Box::new(record),
        reply,
    })
    .map_err(|e| SandboxError::Internal(e.to_string()))?
    .map_err(|e| SandboxError::Internal(e.to_string()))
}

/// The work of one creation, owned by its own task.
struct Creation {
    ctx: Arc<Context>,
    pool: Arc<Pool>,
    supervisor: ActorRef<SupervisorMsg>,
    registry: Registry,
    owner: String,
    name: String,
    egress: EgressPolicy,
    /// The sandbox is deleted this long after creation.
    lifetime: Option<Duration>,
    /// The fork it is made for, which still has to seed it.
    seeding: Option<Uuid>,
}

impl Creation {
    /// Claims a pooled sandbox or makes one, records it and starts its actor.
    /// A claim still waiting for the pool when `left` ends (the caller went
    /// away) gives up its place, so that the sandbox made for it stays in the
    /// pool for the next claim instead of being recorded and removed.
    async fn run(&self, left: impl std::future::Future<Output = ()>) -> Result<(SandboxInfo, ActorRef<SandboxMsg>)> {
        // Pooled sandboxes are made under the server's policy; one of the
        // other kind (bridged or proxied) cannot serve this policy.
        let egress = self.egress;
        let pooled = match egress.is_proxied() == self.ctx.egress.default_policy().is_proxied() {
            true => tokio::select! {
                claimed = self.pool.claim() => claimed.transpose()?,
                () = left => return Err(SandboxError::Internal("the caller went away before its sandbox was ready".into())),
            },
            false => None,
        };
        let provisioned = match pooled {
            Some(p) if self.ctx.egress.claim(p.id, egress) => p,
            Some(p) => {
                pool::discard(&self.ctx, &p).await;
                pool::provision(&self.ctx, egress).await?
            }
            None => pool::provision(&self.ctx, egress).await?,
        };
        let (id, created) = (provisioned.id, provisioned.container);
        let created_at = OffsetDateTime::now_utc();
        let record = SandboxRecord {
            id,
            owner: self.owner.clone(),
            name: self.name.clone(),
            container_id: created.container_id,
            volume: created.volume,
            created_at,
            expires_at: self.lifetime.map(|l| created_at + l),
            installs: BTreeMap::new(),
            packages: vec![],
            deleting: false,
            egress: Some(egress),
            seeding: self.seeding,
        };
        if let Err(e) = self.ctx.store.put(record.clone()).await {
            let _ = remove_everything(&self.ctx, &record).await;
            return Err(e);
        }
        let actor = match spawn_actor(&self.supervisor, record.clone()).await {
            Ok(actor) => actor,
            Err(e) => {
                let _ = remove_everything(&self.ctx, &record).await;
                return Err(e);
            }
        };
        let info = answer(&actor, id, actor.call(SandboxMsg::Info, Some(QUERY_DEADLINE)).await)?;
        Ok((info, actor))
    }

    /// Deletes a sandbox whose creator is gone.
    async fn abandon(&self, id: Uuid, actor: ActorRef<SandboxMsg>) {
        match actor.call(|reply| SandboxMsg::Delete { reply }, None).await {
            Ok(CallResult::Success(Ok(()))) => {
                self.registry.write().expect("registry lock").remove(&id);
            }
            other => {
                warn!(sandbox = %id, outcome = ?other.map(|r| matches!(r, CallResult::Success(_))), "could not remove an abandoned sandbox")
            }
        }
    }
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

/// A snapshot job that answered for another operation than it was asked.
fn unexpected(done: SnapshotDone) -> SandboxError {
    SandboxError::Internal(format!("a snapshot job answered {done:?}"))
}
