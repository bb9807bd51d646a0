//! The sandbox actor: one per sandbox, owner of its container.
//!
//! Runs, installs, uploads and the delete are queued and carried out strictly
//! in arrival order, each in a task (or the install-task actor) that holds
//! the sandbox's [`Link`] while it works; the actor itself only queues and
//! answers, so queries (info, install status) never wait behind a long run,
//! and no sandbox ever waits on another.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use serde::Serialize;
use time::OffsetDateTime;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::warn;
use uuid::Uuid;

use crate::agent::{Package, Progress, Work};
use crate::context::{Context, Counters};
use crate::error::{Result, SandboxError};
use crate::history::{CallKind, CallRecord, History};
use crate::install::{InstallArgs, InstallTask};
use crate::link::{Link, Ran};
use crate::packages;
use crate::records::{InstallRecord, InstallState, SandboxRecord};
use crate::runtime::disk::DiskUsage;
use crate::runtime::ContainerState;
use crate::uploads::{self, UploadSource};

/// A run of Python code or of a shell command.
pub struct RunRequest {
    pub work: Work,
    pub timeout: Duration,
    pub progress: Option<mpsc::Sender<Progress>>,
    /// Cancelled when the caller gives up: a queued run is skipped, a
    /// running one interrupted.
    pub cancel: CancellationToken,
    pub reply: RpcReplyPort<Result<Ran>>,
}

/// What an install status query finds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InstallStatusKind {
    Installing,
    Success,
    Failed,
    NotFound,
}

#[derive(Debug, Clone, Serialize)]
pub struct InstallStatus {
    pub package: String,
    pub status: InstallStatusKind,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
}

impl From<&InstallRecord> for InstallStatus {
    fn from(r: &InstallRecord) -> Self {
        Self {
            package: r.package.clone(),
            status: match r.status {
                InstallState::Installing => InstallStatusKind::Installing,
                InstallState::Success => InstallStatusKind::Success,
                InstallState::Failed => InstallStatusKind::Failed,
            },
            message: r.message.clone(),
            output: r.output.clone(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Uploaded {
    /// The uploaded file or folder inside the sandbox.
    pub path: String,
    pub message: String,
}

/// A sandbox as the front end lists it.
#[derive(Debug, Clone, Serialize)]
pub struct SandboxInfo {
    pub sandbox_id: Uuid,
    pub name: String,
    #[serde(skip)]
    pub owner: String,
    #[serde(skip)]
    pub container_id: String,
    pub status: String,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option")]
    pub expires_at: Option<OffsetDateTime>,
    pub installed_packages: Vec<Package>,
    /// Use of the sandbox's capped folders (absent when disks are not capped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskUsage>,
}

pub enum SandboxMsg {
    Run(RunRequest),
    /// Queues an install (or joins the one in progress) and answers at once
    /// with a receiver that sees its status change.
    Install {
        package: String,
        specs: Vec<String>,
        reply: RpcReplyPort<Result<watch::Receiver<InstallRecord>>>,
    },
    InstallStatus {
        package: String,
        reply: RpcReplyPort<Result<InstallStatus>>,
    },
    Upload {
        source: UploadSource,
        dest: String,
        reply: RpcReplyPort<Result<Uploaded>>,
    },
    /// Restarts the container (Python state is lost, files and packages
    /// stay), in turn with the other calls.
    Restart {
        reply: RpcReplyPort<Result<()>>,
    },
    Delete {
        reply: RpcReplyPort<Result<()>>,
    },
    Info(RpcReplyPort<SandboxInfo>),
    History(RpcReplyPort<Vec<CallRecord>>),
    /// Periodic: deletes the sandbox if its lifetime is over, or pauses it
    /// if it has been idle long enough.
    Tick,
    /// A job ended and hands the link back.
    Done(Box<Finished>),
}

pub struct Finished {
    link: Link,
    install: Option<(InstallRecord, Option<Vec<Package>>)>,
    deleted: bool,
    /// The call, for the sandbox's history.
    call: Option<CallRecord>,
}

impl Finished {
    pub fn install(link: Link, record: InstallRecord, packages: Option<Vec<Package>>) -> Self {
        Self {
            install: Some((record, packages)),
            ..Self::job(link, None)
        }
    }

    fn job(link: Link, call: Option<CallRecord>) -> Self {
        Self {
            link,
            install: None,
            deleted: false,
            call,
        }
    }
}

enum Job {
    Run(RunRequest),
    Install {
        package: String,
        specs: Vec<String>,
    },
    Upload {
        source: UploadSource,
        dest: String,
        reply: RpcReplyPort<Result<Uploaded>>,
    },
    Restart {
        reply: RpcReplyPort<Result<()>>,
    },
    Delete {
        reply: RpcReplyPort<Result<()>>,
    },
}

pub struct SandboxActor;

pub struct SandboxArgs {
    pub ctx: Arc<Context>,
    pub record: SandboxRecord,
    /// Told with the next result (the actor was restarted by its supervisor).
    pub notice: Option<String>,
}

pub struct SandboxState {
    ctx: Arc<Context>,
    record: SandboxRecord,
    /// `None` while a job holds it.
    link: Option<Link>,
    queue: VecDeque<Job>,
    installs: HashMap<String, watch::Sender<InstallRecord>>,
    notice: Option<String>,
    deleting: bool,
    /// A requested restart is under way.
    restarting: bool,
    history: History,
    /// When the last call ended (or the actor started): idle expiry counts from it.
    last_used: OffsetDateTime,
}

impl Actor for SandboxActor {
    type Msg = SandboxMsg;
    type State = SandboxState;
    type Arguments = SandboxArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: SandboxArgs,
    ) -> Result<SandboxState, ActorProcessingErr> {
        let SandboxArgs {
            ctx,
            mut record,
            notice,
        } = args;
        // An install that was running when the server (or this actor) went
        // away has no one to finish it.
        let mut changed = false;
        for install in record
            .installs
            .values_mut()
            .filter(|i| i.status == InstallState::Installing)
        {
            install.status = InstallState::Failed;
            install.message = format!(
                "Installation of {} was interrupted by a restart; install it again.",
                install.package
            );
            install.finished_at = Some(OffsetDateTime::now_utc());
            changed = true;
        }
        if changed {
            ctx.store.put(record.clone()).await?;
        }
        let mut link = Link::new(
            ctx.clone(),
            ctx.paths(record.id),
            record.container_id.clone(),
            record.volume.clone(),
        );
        // An adopted sandbox may have been paused by the previous server.
        if let Ok(ContainerState::Paused) = ctx.runtime.state(&record.container_id).await {
            link.found_paused();
        }
        Ok(SandboxState {
            ctx,
            record,
            link: Some(link),
            queue: VecDeque::new(),
            installs: HashMap::new(),
            notice,
            deleting: false,
            restarting: false,
            history: History::default(),
            last_used: OffsetDateTime::now_utc(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: SandboxMsg,
        state: &mut SandboxState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SandboxMsg::Run(req) => match admit(state) {
                Ok(()) => state.queue.push_back(Job::Run(req)),
                Err(e) => {
                    let _ = req.reply.send(Err(e));
                }
            },
            SandboxMsg::Install { package, specs, reply } => {
                if let Some(tx) = state
                    .installs
                    .get(&package)
                    .filter(|tx| tx.borrow().status == InstallState::Installing)
                {
                    let _ = reply.send(Ok(tx.subscribe()));
                } else if let Err(e) = admit(state) {
                    let _ = reply.send(Err(e));
                } else {
                    let record = InstallRecord {
                        package: package.clone(),
                        status: InstallState::Installing,
                        message: format!("Installing {package}..."),
                        output: None,
                        started_at: OffsetDateTime::now_utc(),
                        finished_at: None,
                    };
                    let (tx, rx) = watch::channel(record.clone());
                    state.installs.insert(package.clone(), tx);
                    state.record.installs.insert(package.clone(), record);
                    state.ctx.store.put(state.record.clone()).await?;
                    let _ = reply.send(Ok(rx));
                    state.queue.push_back(Job::Install { package, specs });
                }
            }
            SandboxMsg::InstallStatus { package, reply } => {
                if let Some(link) = state.link.as_mut() {
                    // The fallback below asks the agent, which must be awake;
                    // if it cannot be woken, that query reports the failure.
                    let _ = link.wake().await;
                }
                if let Some(record) = state.record.installs.get(&package) {
                    let _ = reply.send(Ok(record.into()));
                } else {
                    // Never installed through the tool: ask the sandbox what
                    // its venv holds (installed from the shell, say).
                    let ctx = state.ctx.clone();
                    let paths = ctx.paths(state.record.id);
                    tokio::spawn(async move {
                        let answer = Link::packages(&ctx, &paths)
                            .await
                            .map(|list| status_from_venv(&package, &list));
                        let _ = reply.send(answer);
                    });
                }
            }
            SandboxMsg::Upload { source, dest, reply } => match admit(state) {
                Ok(()) => state.queue.push_back(Job::Upload { source, dest, reply }),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            SandboxMsg::Restart { reply } => match admit(state) {
                Ok(()) => state.queue.push_back(Job::Restart { reply }),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            SandboxMsg::History(reply) => {
                let _ = reply.send(state.history.to_vec());
            }
            SandboxMsg::Delete { reply } => {
                state.deleting = true;
                state.queue.push_back(Job::Delete { reply });
            }
            SandboxMsg::Info(reply) => {
                let _ = reply.send(info(state));
            }
            SandboxMsg::Tick => {
                let idle = state.link.is_some() && state.queue.is_empty() && !state.deleting;
                let now = OffsetDateTime::now_utc();
                let pause_after = state.ctx.settings.sandbox.pause_after_seconds;
                if idle && expires_at(state).is_some_and(|t| t <= now) {
                    tracing::info!(sandbox = %state.record.id, "lifetime over: deleting the sandbox");
                    state.deleting = true;
                    let (tx, _) = ractor::concurrency::oneshot();
                    state.queue.push_back(Job::Delete { reply: tx.into() });
                } else if idle && pause_after > 0 && now - state.last_used >= Duration::from_secs(pause_after) {
                    let link = state.link.as_mut().expect("idle");
                    if !link.is_paused() {
                        if let Err(e) = link.pause().await {
                            tracing::warn!(sandbox = %state.record.id, error = %e, "could not pause an idle sandbox");
                        }
                    }
                }
            }
            SandboxMsg::Done(finished) => self.finished(&myself, state, *finished).await?,
        }
        self.pump(&myself, state).await?;
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut SandboxState,
    ) -> Result<(), ActorProcessingErr> {
        // The only children are install tasks. One that failed took the link
        // with it: make a new one and record the install as failed.
        if let SupervisionEvent::ActorFailed(_, err) = event {
            warn!(sandbox = %state.record.id, error = %err, "an install task failed");
            let ctx = state.ctx.clone();
            let link = Link::new(
                ctx.clone(),
                ctx.paths(state.record.id),
                state.record.container_id.clone(),
                state.record.volume.clone(),
            );
            let failed = state
                .installs
                .iter()
                .find(|(_, tx)| tx.borrow().status == InstallState::Installing)
                .map(|(_, tx)| {
                    let mut r = tx.borrow().clone();
                    r.status = InstallState::Failed;
                    r.message = format!("Installation of {} failed inside the server: {err}", r.package);
                    r.finished_at = Some(OffsetDateTime::now_utc());
                    r
                });
            let finished = match failed {
                Some(record) => Finished::install(link, record, None),
                None => Finished::job(link, None),
            };
            self.finished(&myself, state, finished).await?;
            self.pump(&myself, state).await?;
        }
        Ok(())
    }
}

/// Whether another call may join the queue.
fn admit(state: &SandboxState) -> Result<()> {
    if state.deleting {
        return Err(SandboxError::NotFound(state.record.id));
    }
    let max = state.ctx.settings.sandbox.max_queued_calls;
    if state.queue.len() >= max {
        return Err(SandboxError::Quota(format!(
            "sandbox {} already has {max} calls waiting; wait for them to finish before sending more",
            state.record.id
        )));
    }
    Ok(())
}

/// The earlier of the end of the sandbox's lifetime and of its idle time.
fn expires_at(state: &SandboxState) -> Option<OffsetDateTime> {
    let idle = state.ctx.settings.sandbox.idle_timeout_seconds;
    let idle_end = (idle > 0).then(|| state.last_used + Duration::from_secs(idle));
    match (state.record.expires_at, idle_end) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl SandboxActor {
    /// Starts the next job when none is running. Each job hands its link
    /// back (`Done`) before it answers, so that a query the caller sends
    /// once answered queues behind it in the mailbox and finds the job over
    /// and in the history.
    async fn pump(&self, myself: &ActorRef<SandboxMsg>, state: &mut SandboxState) -> Result<(), ActorProcessingErr> {
        while state.link.is_some() {
            let Some(job) = state.queue.pop_front() else {
                return Ok(());
            };
            let mut link = state.link.take().expect("checked");
            let me = myself.clone();
            match job {
                Job::Run(req) => {
                    if req.cancel.is_cancelled() {
                        state.link = Some(link);
                        continue;
                    }
                    let notice = state.notice.take();
                    tokio::spawn(async move {
                        let started = OffsetDateTime::now_utc();
                        let result = link
                            .run(&req.work, req.timeout, req.progress.as_ref(), &req.cancel)
                            .await;
                        let full = link.ctx().disks.full_notice(link.paths.id);
                        let result = result.map(|mut ran| {
                            ran.notice = join_notices(join_notices(notice, ran.notice.take()), full);
                            ran
                        });
                        let call = run_record(started, &req.work, &result);
                        let _ = me.send_message(SandboxMsg::Done(Box::new(Finished::job(link, Some(call)))));
                        let _ = req.reply.send(result);
                    });
                }
                Job::Install { package, specs } => {
                    let args = InstallArgs {
                        link,
                        package,
                        specs,
                        report: me,
                    };
                    Actor::spawn_linked(None, InstallTask, args, myself.get_cell()).await?;
                }
                Job::Upload { source, dest, reply } => {
                    tokio::spawn(async move {
                        let started = OffsetDateTime::now_utc();
                        let what = match &source {
                            UploadSource::Host(path) => format!("{} → {dest}", path.display()),
                            UploadSource::Bytes { name, .. } => format!("{name} → {dest}"),
                        };
                        let result = upload(&mut link, source, &dest).await;
                        let call = outcome_record(started, CallKind::Upload, &what, &result, "uploaded");
                        let _ = me.send_message(SandboxMsg::Done(Box::new(Finished::job(link, Some(call)))));
                        let _ = reply.send(result);
                    });
                }
                Job::Restart { reply } => {
                    state.restarting = true;
                    tokio::spawn(async move {
                        let started = OffsetDateTime::now_utc();
                        let result = link.restart().await;
                        let call = outcome_record(started, CallKind::Restart, "restart", &result, "restarted");
                        let _ = me.send_message(SandboxMsg::Done(Box::new(Finished::job(link, Some(call)))));
                        let _ = reply.send(result);
                    });
                }
                Job::Delete { reply } => {
                    let record = state.record.clone();
                    tokio::spawn(async move {
                        let result = remove_everything(link.ctx(), &record, &link.container_id).await;
                        let deleted = result.is_ok();
                        let _ = me.send_message(SandboxMsg::Done(Box::new(Finished {
                            deleted,
                            ..Finished::job(link, None)
                        })));
                        let _ = reply.send(result);
                    });
                }
            }
        }
        Ok(())
    }

    async fn finished(
        &self,
        myself: &ActorRef<SandboxMsg>,
        state: &mut SandboxState,
        f: Finished,
    ) -> Result<(), ActorProcessingErr> {
        let mut dirty = false;
        if f.link.container_id != state.record.container_id {
            state.record.container_id = f.link.container_id.clone();
            dirty = true;
        }
        if let Some(call) = f.call {
            if call.kind == CallKind::Restart {
                state.restarting = false;
                if call.ok {
                    state.notice = Some(
                        "The sandbox was restarted on request: Python variables were lost; files and packages are kept."
                            .into(),
                    );
                }
            }
            state.history.push(call);
        }
        if let Some((install, packages)) = f.install {
            let counters = &state.ctx.counters;
            let ended = match install.status {
                InstallState::Success => Some((&counters.installs_succeeded, true, "success")),
                InstallState::Failed => Some((&counters.installs_failed, false, "failed")),
                InstallState::Installing => None,
            };
            if let Some((counter, ok, outcome)) = ended {
                Counters::bump(counter);
                let call = CallRecord::ended(
                    install.started_at,
                    CallKind::Install,
                    &install.package,
                    ok,
                    outcome.into(),
                );
                state.history.push(call);
            }
            if let Some(tx) = state.installs.get(&install.package) {
                tx.send_replace(install.clone());
            }
            state.record.installs.insert(install.package.clone(), install);
            if let Some(p) = packages {
                state.record.packages = p;
            }
            dirty = true;
        }
        state.link = Some(f.link);
        state.last_used = OffsetDateTime::now_utc();
        if f.deleted {
            state.queue.clear();
            myself.stop(Some("deleted".into()));
            return Ok(());
        }
        if state.deleting && !state.queue.iter().any(|j| matches!(j, Job::Delete { .. })) {
            state.deleting = false; // the delete failed; the sandbox stays usable
        }
        if dirty {
            state.ctx.store.put(state.record.clone()).await?;
        }
        Ok(())
    }
}

fn info(state: &SandboxState) -> SandboxInfo {
    let r = &state.record;
    SandboxInfo {
        sandbox_id: r.id,
        name: r.name.clone(),
        owner: r.owner.clone(),
        container_id: r.container_id.clone(),
        status: match (&state.link, state.deleting) {
            (_, true) => "deleting",
            _ if state.restarting => "restarting",
            (Some(link), _) if link.is_paused() => "paused",
            _ => "running",
        }
        .into(),
        created_at: r.created_at,
        expires_at: expires_at(state),
        installed_packages: r.packages.clone(),
        disk: state.ctx.disks.usage(r.id),
    }
}

fn join_notices(a: Option<String>, b: Option<String>) -> Option<String> {
    match (a, b) {
        (Some(a), Some(b)) => Some(format!("{a} {b}")),
        (a, b) => a.or(b),
    }
}

fn status_from_venv(package: &str, list: &[Package]) -> InstallStatus {
    match packages::installed_versions(package, list) {
        Some(found) => {
            let versions: Vec<String> = found.iter().map(|p| format!("{} {}", p.name, p.version)).collect();
            InstallStatus {
                package: package.to_string(),
                status: InstallStatusKind::Success,
                message: format!("Package {package} is already installed ({}).", versions.join(", ")),
                output: None,
            }
        }
        None => InstallStatus {
            package: package.to_string(),
            status: InstallStatusKind::NotFound,
            message: format!("No installation of {package} was found. Install it with install_package_in_sandbox."),
            output: None,
        },
    }
}

/// A run's entry in the history.
fn run_record(started: OffsetDateTime, work: &Work, result: &Result<Ran>) -> CallRecord {
    let (kind, summary) = match work {
        Work::Python(code) => (CallKind::Python, code.as_str()),
        Work::Program(argv) => (CallKind::Shell, argv.last().map_or("", String::as_str)),
    };
    let (ok, outcome) = match result {
        Ok(ran) if ran.output.timed_out => (false, "timed out".to_string()),
        Ok(ran) => (ran.output.exit_code == 0, format!("exit {}", ran.output.exit_code)),
        Err(e) => (false, format!("error: {e}")),
    };
    CallRecord::ended(started, kind, summary, ok, outcome)
}

/// The history entry of a call that either worked or failed with an error.
fn outcome_record<T>(
    started: OffsetDateTime,
    kind: CallKind,
    what: &str,
    result: &Result<T>,
    done: &str,
) -> CallRecord {
    let (ok, outcome) = match result {
        Ok(_) => (true, done.to_string()),
        Err(e) => (false, format!("error: {e}")),
    };
    CallRecord::ended(started, kind, what, ok, outcome)
}

async fn upload(link: &mut Link, source: UploadSource, dest: &str) -> Result<Uploaded> {
    let (tar, name) = tokio::task::spawn_blocking(move || uploads::pack(source))
        .await
        .map_err(|e| SandboxError::Internal(e.to_string()))??;
    // The folder must exist for the archive API; mkdir runs as the sandbox
    // user, inside the sandbox.
    let mkdir = Work::Program(vec!["mkdir".into(), "-p".into(), "--".into(), dest.to_string()]);
    let ran = link
        .run(&mkdir, Duration::from_secs(30), None, &CancellationToken::new())
        .await?;
    if ran.output.exit_code != 0 {
        return Err(SandboxError::UploadRefused(format!(
            "cannot create {dest}: {}",
            ran.output.stderr.trim()
        )));
    }
    link.ctx().runtime.upload(&link.container_id, dest, tar).await?;
    let path = format!("{dest}/{name}");
    Ok(Uploaded {
        message: format!("Uploaded {name} to {dest}"),
        path,
    })
}

/// Removes the container, its package volume, its disks, its results and its record.
pub async fn remove_everything(ctx: &Context, record: &SandboxRecord, container_id: &str) -> Result<()> {
    ctx.runtime.remove(container_id, Some(&record.volume)).await?;
    ctx.disks.remove(record.id).await?;
    let paths = ctx.paths(record.id);
    for dir in [&paths.results, &paths.agent] {
        if let Err(e) = tokio::fs::remove_dir_all(dir).await {
            if e.kind() != std::io::ErrorKind::NotFound {
                warn!(dir = %dir.display(), error = %e, "could not remove a sandbox folder");
            }
        }
    }
    ctx.store.delete(record.id).await
}
