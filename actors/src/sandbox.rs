//! The sandbox actor: one per sandbox, owner of its container.
//!
//! Runs, installs, uploads (file writes among them), Python resets and
//! restarts are queued and carried out strictly in arrival order, each in a
//! task (or the install-task actor) that holds the sandbox's [`Link`] while
//! it works; the actor itself only queues and answers, so queries (info,
//! install status) never wait behind a long run, and no sandbox ever waits
//! on another.
//!
//! Deleting and expiring never wait on the sandbox: the link is retired (the
//! job in flight ends at once with the reason), queued calls are answered,
//! and after a short grace the container is removed. A sandbox that misses
//! a deadline is restarted in turn with its calls.

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
use crate::error::{DockerError, Result, SandboxError};
use crate::files::{self, ResultsPath};
use crate::history::{CallKind, CallRecord, History};
use crate::install::{InstallArgs, InstallTask};
use crate::link::{Link, Ran, Retirement};
use crate::packages;
use crate::records::{InstallRecord, InstallState, SandboxRecord};
use crate::runtime::disk::DiskUsage;
use crate::runtime::ContainerState;
use crate::status::SandboxStatus;
use crate::uploads::{self, UploadSource};

/// How long a delete waits for the job in flight to hand its link back
/// before it removes the container anyway.
const DELETE_GRACE: Duration = Duration::from_secs(2);
/// Requirement strings whose last install a sandbox remembers; past it the
/// oldest finished ones are forgotten.
pub const MAX_INSTALL_RECORDS: usize = 100;

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
    pub status: SandboxStatus,
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
    /// Gives Python a fresh namespace (files, packages and the container
    /// stay), in turn with the other calls; answers with a notice, if any.
    ResetPython {
        reply: RpcReplyPort<Result<Option<String>>>,
    },
    Delete {
        reply: RpcReplyPort<Result<()>>,
    },
    Info(RpcReplyPort<SandboxInfo>),
    History(RpcReplyPort<Vec<CallRecord>>),
    /// Periodic: deletes the sandbox if its lifetime is over, pauses it if
    /// it has been idle long enough, and notices a container that died.
    Tick,
    /// A job ended and hands the link back.
    Done(Box<Finished>),
    /// A job's task panicked: its link is gone and must be rebuilt.
    JobPanicked(String),
    /// The sandbox missed a deadline outside a job (a query over a second
    /// connection): restart its container in turn with its calls.
    Unhealthy,
    /// The removal of a deleted or expired sandbox ended.
    Removed(Result<(), Arc<SandboxError>>),
}

pub struct Finished {
    link: Link,
    install: Option<(InstallRecord, Option<Vec<Package>>)>,
    /// The call, for the sandbox's history.
    call: Option<CallRecord>,
    /// Told with the next result (the container had to be brought back).
    notice: Option<String>,
    /// The container is still dead (it could not be brought back yet).
    still_stopped: bool,
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
            call,
            notice: None,
            still_stopped: false,
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
    ResetPython {
        reply: RpcReplyPort<Result<Option<String>>>,
    },
    /// Restarts a container that missed a deadline.
    Recover,
    /// Brings back a container that died while the sandbox was idle.
    Revive,
}

impl Job {
    /// Answers the caller of a job that will not run.
    fn refuse(self, error: SandboxError) {
        match self {
            Job::Run(req) => {
                let _ = req.reply.send(Err(error));
            }
            Job::Upload { reply, .. } => {
                let _ = reply.send(Err(error));
            }
            Job::Restart { reply } => {
                let _ = reply.send(Err(error));
            }
            Job::ResetPython { reply } => {
                let _ = reply.send(Err(error));
            }
            Job::Install { .. } | Job::Recover | Job::Revive => {}
        }
    }
}

/// Where a delete (or an expiry) stands.
#[derive(Default)]
struct Deletion {
    /// Callers waiting for the removal.
    waiters: Vec<RpcReplyPort<Result<()>>>,
    /// A removal task is running.
    removing: bool,
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
    /// Set once the sandbox is being deleted or has expired.
    deletion: Option<Deletion>,
    retirement: Retirement,
    /// A restart is under way (asked for, or after a missed deadline).
    restarting: bool,
    /// The container was found dead while idle and is being brought back.
    stopped: bool,
    /// A package check over a second connection to the agent is running.
    checking_venv: Arc<std::sync::atomic::AtomicBool>,
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
            ctx.store.put_install(record.id, install.clone(), vec![]).await?;
        }
        let retirement = Retirement::default();
        // A delete that an earlier server began is finished by this actor.
        let deletion = record.deleting.then(|| {
            retirement.retire("was deleted");
            Deletion::default()
        });
        let mut link = new_link(&ctx, &record, &retirement);
        let mut queue = VecDeque::new();
        // An adopted sandbox may have been paused by the previous server, or
        // its container may have died meanwhile.
        let found = ctx.runtime.state(&record.container_id).await;
        let stopped = matches!(found, Ok(ContainerState::Stopped { .. } | ContainerState::Missing));
        if let Ok(ContainerState::Paused) = found {
            link.found_paused();
        }
        if stopped && !record.deleting {
            queue.push_back(Job::Revive);
        }
        Ok(SandboxState {
            ctx,
            record,
            link: Some(link),
            queue,
            installs: HashMap::new(),
            notice,
            deletion,
            retirement,
            restarting: false,
            stopped,
            checking_venv: Arc::default(),
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
                    let forget = forget_oldest_installs(state, &package);
                    state.installs.insert(package.clone(), tx);
                    state.record.installs.insert(package.clone(), record.clone());
                    state.ctx.store.put_install(state.record.id, record, forget).await?;
                    let _ = reply.send(Ok(rx));
                    state.queue.push_back(Job::Install { package, specs });
                }
            }
            SandboxMsg::InstallStatus { package, reply } => {
                if let Some(record) = state.record.installs.get(&package) {
                    let _ = reply.send(Ok(record.into()));
                } else if state.deletion.is_some() {
                    let _ = reply.send(Err(state.retirement_error()));
                } else {
                    if let Some(link) = state.link.as_mut() {
                        // The fallback below asks the agent, which must be
                        // awake; if it cannot be woken, that query says so.
                        let _ = link.wake().await;
                    }
                    // Never installed through the tool: ask the sandbox what
                    // its venv holds (installed from the shell, say); one
                    // such question at a time, so no flood of them holds
                    // the server's descriptors.
                    if state.checking_venv.load(std::sync::atomic::Ordering::SeqCst) {
                        let _ = reply.send(Err(SandboxError::Quota(
                            "another package check of this sandbox is running; try again in a few seconds".into(),
                        )));
                        return Ok(());
                    }
                    state.checking_venv.store(true, std::sync::atomic::Ordering::SeqCst);
                    let checking = state.checking_venv.clone();
                    let ctx = state.ctx.clone();
                    let paths = ctx.paths(state.record.id);
                    let me = myself.clone();
                    tokio::spawn(async move {
                        let answer = Link::packages(&ctx, &paths)
                            .await
                            .map(|list| status_from_venv(&package, &list));
                        checking.store(false, std::sync::atomic::Ordering::SeqCst);
                        if let Err(SandboxError::Unresponsive { .. }) = &answer {
                            let _ = me.cast(SandboxMsg::Unhealthy);
                        }
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
            SandboxMsg::ResetPython { reply } => match admit(state) {
                Ok(()) => state.queue.push_back(Job::ResetPython { reply }),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            SandboxMsg::History(reply) => {
                let _ = reply.send(state.history.to_vec());
            }
            SandboxMsg::Delete { reply } => begin_deletion(&myself, state, "was deleted", Some(reply)),
            SandboxMsg::Info(reply) => {
                let _ = reply.send(info(state));
            }
            SandboxMsg::Tick => self.tick(&myself, state).await,
            SandboxMsg::Done(finished) => self.finished(state, *finished).await?,
            SandboxMsg::JobPanicked(why) => {
                warn!(sandbox = %state.record.id, error = %why, "a sandbox job panicked; rebuilding its link");
                state.restarting = false;
                state.link = Some(new_link(&state.ctx, &state.record, &state.retirement));
                state.notice = Some(
                    "An internal error ended an earlier call on this sandbox; if its result is missing, run it again."
                        .into(),
                );
            }
            SandboxMsg::Unhealthy => {
                let queued = state.queue.iter().any(|j| matches!(j, Job::Recover));
                if state.deletion.is_none() && !queued && !state.restarting {
                    warn!(sandbox = %state.record.id, "the sandbox missed a deadline; restarting its container");
                    state.queue.push_back(Job::Recover);
                }
            }
            SandboxMsg::Removed(result) => {
                let deletion = state.deletion.as_mut().expect("a removal follows a deletion");
                deletion.removing = false;
                match result {
                    Ok(()) => {
                        for waiter in deletion.waiters.drain(..) {
                            let _ = waiter.send(Ok(()));
                        }
                        myself.stop(Some("deleted".into()));
                        return Ok(());
                    }
                    // The removal is retried at every tick until Docker
                    // answers; the sandbox stays deleted meanwhile.
                    Err(e) => {
                        warn!(sandbox = %state.record.id, error = %e, "could not remove a deleted sandbox; retrying");
                        for waiter in deletion.waiters.drain(..) {
                            let _ = waiter.send(Err(DockerError::RemovalRetried(e.clone()).into()));
                        }
                    }
                }
            }
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
            let link = new_link(&state.ctx, &state.record, &state.retirement);
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
            self.finished(state, finished).await?;
            self.pump(&myself, state).await?;
        }
        Ok(())
    }
}

fn new_link(ctx: &Arc<Context>, record: &SandboxRecord, retirement: &Retirement) -> Link {
    Link::new(
        ctx.clone(),
        ctx.paths(record.id),
        record.container_id.clone(),
        record.volume.clone(),
        retirement.clone(),
    )
}

impl SandboxState {
    fn retirement_error(&self) -> SandboxError {
        SandboxError::Ended {
            id: self.record.id,
            why: "was deleted".into(),
        }
    }
}

/// Whether another call may join the queue.
fn admit(state: &SandboxState) -> Result<()> {
    if state.deletion.is_some() {
        return Err(state.retirement_error());
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

/// Forgets the oldest finished installs so that, with `package` added, no
/// more than [`MAX_INSTALL_RECORDS`] are remembered; returns the forgotten.
fn forget_oldest_installs(state: &mut SandboxState, package: &str) -> Vec<String> {
    let installs = &state.record.installs;
    let count = installs.len() + usize::from(!installs.contains_key(package));
    let excess = count.saturating_sub(MAX_INSTALL_RECORDS);
    let mut finished: Vec<(&String, OffsetDateTime)> = installs
        .iter()
        .filter(|(p, r)| r.status != InstallState::Installing && p.as_str() != package)
        .map(|(p, r)| (p, r.finished_at.unwrap_or(r.started_at)))
        .collect();
    finished.sort_by_key(|(_, t)| *t);
    let forget: Vec<String> = finished.into_iter().take(excess).map(|(p, _)| p.clone()).collect();
    for p in &forget {
        state.record.installs.remove(p);
        state.installs.remove(p);
    }
    forget
}

/// Marks the sandbox deleted and starts its removal: the job in flight ends
/// at once (its link is retired), queued calls are refused with `why`, and
/// the container goes after a short grace, whatever its agent does.
fn begin_deletion(
    myself: &ActorRef<SandboxMsg>,
    state: &mut SandboxState,
    why: &str,
    reply: Option<RpcReplyPort<Result<()>>>,
) {
    let deletion = state.deletion.get_or_insert_with(Deletion::default);
    deletion.waiters.extend(reply);
    if deletion.removing {
        return;
    }
    if !state.retirement.is_retired() {
        tracing::info!(sandbox = %state.record.id, why, "deleting the sandbox");
        state.retirement.retire(why);
        let error = SandboxError::Ended {
            id: state.record.id,
            why: why.to_string(),
        };
        for job in state.queue.drain(..) {
            job.refuse(SandboxError::Ended {
                id: state.record.id,
                why: why.to_string(),
            });
        }
        for tx in state.installs.values() {
            if tx.borrow().status == InstallState::Installing {
                tx.send_modify(|r| {
                    r.status = InstallState::Failed;
                    r.message = error.to_string();
                });
            }
        }
    }
    deletion.removing = true;
    state.record.deleting = true;
    let ctx = state.ctx.clone();
    let record = state.record.clone();
    let link_home = state.link.is_some();
    let me = myself.clone();
    tokio::spawn(async move {
        // Durable first: a server killed during the removal finishes it at
        // its next start.
        let marked = ctx.store.put(record.clone()).await;
        if !link_home {
            tokio::time::sleep(DELETE_GRACE).await;
        }
        let result = match marked {
            Ok(()) => remove_everything(&ctx, &record).await,
            Err(e) => Err(e),
        };
        let _ = me.send_message(SandboxMsg::Removed(result.map_err(Arc::new)));
    });
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

/// Spawns a job's task; if it panics, the actor hears of it (the link the
/// task held is gone with it) instead of waiting for it forever.
fn spawn_job(me: ActorRef<SandboxMsg>, job: impl std::future::Future<Output = ()> + Send + 'static) {
    let task = tokio::spawn(job);
    tokio::spawn(async move {
        if let Err(e) = task.await {
            if e.is_panic() {
                let _ = me.send_message(SandboxMsg::JobPanicked(e.to_string()));
            }
        }
    });
}

impl SandboxActor {
    /// Starts the next job when none is running. Each job hands its link
    /// back (`Done`) before it answers, so that a query the caller sends
    /// once answered queues behind it in the mailbox and finds the job over
    /// and in the history.
    async fn pump(&self, myself: &ActorRef<SandboxMsg>, state: &mut SandboxState) -> Result<(), ActorProcessingErr> {
        while state.link.is_some() && state.deletion.is_none() {
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
                    spawn_job(me.clone(), async move {
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
                    spawn_job(me.clone(), async move {
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
                    spawn_job(me.clone(), async move {
                        let started = OffsetDateTime::now_utc();
                        let result = link.restart().await;
                        let call = outcome_record(started, CallKind::Restart, "restart", &result, "restarted");
                        let _ = me.send_message(SandboxMsg::Done(Box::new(Finished::job(link, Some(call)))));
                        let _ = reply.send(result);
                    });
                }
                Job::ResetPython { reply } => {
                    let notice = state.notice.take();
                    spawn_job(me.clone(), async move {
                        let started = OffsetDateTime::now_utc();
                        let result = link.reset_python().await.map(|n| join_notices(notice, n));
                        let call = outcome_record(started, CallKind::ResetPython, "reset_python", &result, "reset");
                        let _ = me.send_message(SandboxMsg::Done(Box::new(Finished::job(link, Some(call)))));
                        let _ = reply.send(result);
                    });
                }
                Job::Recover => {
                    state.restarting = true;
                    spawn_job(me.clone(), async move {
                        link.restart_unresponsive().await;
                        let _ = me.send_message(SandboxMsg::Done(Box::new(Finished::job(link, None))));
                    });
                }
                Job::Revive => {
                    spawn_job(me.clone(), async move {
                        let revived = link.revive().await;
                        if let Err(e) = &revived {
                            warn!(sandbox = %link.paths.id, error = %e, "could not bring a stopped sandbox back; retrying");
                        }
                        let _ = me.send_message(SandboxMsg::Done(Box::new(Finished {
                            still_stopped: revived.is_err(),
                            notice: revived.ok().flatten(),
                            ..Finished::job(link, None)
                        })));
                    });
                }
            }
        }
        Ok(())
    }

    /// Periodic upkeep: lifetime (busy or not), idle expiry, pausing, and a
    /// container that died while nobody was calling.
    async fn tick(&self, myself: &ActorRef<SandboxMsg>, state: &mut SandboxState) {
        let now = OffsetDateTime::now_utc();
        if let Some(removing) = state.deletion.as_ref().map(|d| d.removing) {
            if !removing {
                begin_deletion(myself, state, "was deleted", None);
            }
            return;
        }
        if state.record.expires_at.is_some_and(|t| t <= now) {
            begin_deletion(
                myself,
                state,
                "reached the end of its lifetime (sandbox.max_lifetime_seconds)",
                None,
            );
            return;
        }
        let idle = state.link.is_some() && state.queue.is_empty();
        if !idle {
            return;
        }
        if expires_at(state).is_some_and(|t| t <= now) {
            begin_deletion(
                myself,
                state,
                "was idle for longer than sandbox.idle_timeout_seconds",
                None,
            );
            return;
        }
        let link = state.link.as_mut().expect("idle");
        if state.stopped && link.is_disconnected() {
            // An earlier attempt failed (the engine was down, say): retry.
            state.queue.push_back(Job::Revive);
            return;
        }
        if link.agent_gone() {
            tracing::info!(sandbox = %state.record.id, "the sandbox's agent went away while idle; bringing it back");
            state.stopped = true;
            state.queue.push_back(Job::Revive);
            return;
        }
        let pause_after = state.ctx.settings.sandbox.pause_after_seconds;
        if pause_after > 0 && now - state.last_used >= Duration::from_secs(pause_after) && !link.is_paused() {
            if let Err(e) = link.pause().await {
                warn!(sandbox = %state.record.id, error = %e, "could not pause an idle sandbox");
            }
        }
    }

    async fn finished(&self, state: &mut SandboxState, f: Finished) -> Result<(), ActorProcessingErr> {
        state.restarting = false;
        // Still dead if the job said so, or if it could not reconnect either.
        state.stopped = f.still_stopped || (state.stopped && f.link.is_disconnected());
        // Idle time counts from the last call, not from upkeep.
        if f.call.is_some() || f.install.is_some() {
            state.last_used = OffsetDateTime::now_utc();
        }
        state.notice = join_notices(state.notice.take(), f.notice);
        let container_changed = f.link.container_id != state.record.container_id;
        if container_changed {
            state.record.container_id = f.link.container_id.clone();
        }
        state.link = Some(f.link);
        if let Some(call) = f.call {
            if call.kind == CallKind::Restart && call.ok {
                state.notice = Some(
                    "The sandbox was restarted on request: Python variables were lost; files and packages are kept."
                        .into(),
                );
            }
            state.history.push(call);
        }
        // A deleted sandbox writes nothing more: its records are going.
        if state.deletion.is_some() {
            return Ok(());
        }
        let mut packages_changed = false;
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
            state.record.installs.insert(install.package.clone(), install.clone());
            state.ctx.store.put_install(state.record.id, install, vec![]).await?;
            if let Some(p) = packages {
                state.record.packages = p;
                packages_changed = true;
            }
        }
        if container_changed || packages_changed {
            state.ctx.store.put(state.record.clone()).await?;
        }
        Ok(())
    }
}

fn info(state: &SandboxState) -> SandboxInfo {
    let r = &state.record;
    let status = if state.deletion.is_some() {
        SandboxStatus::Deleting
    } else if state.restarting {
        SandboxStatus::Restarting
    } else if state.stopped {
        SandboxStatus::Stopped
    } else if state.link.as_ref().is_some_and(Link::is_paused) {
        SandboxStatus::Paused
    } else {
        SandboxStatus::Running
    };
    SandboxInfo {
        sandbox_id: r.id,
        name: r.name.clone(),
        owner: r.owner.clone(),
        container_id: r.container_id.clone(),
        status,
        created_at: r.created_at,
        expires_at: expires_at(state),
        installed_packages: r.packages.clone(),
        disk: state.ctx.disks.usage(r.id),
    }
}

/// Notices for the next result: each said once, and only so many kept,
/// however often a sandbox dies while nobody calls.
fn join_notices(a: Option<String>, b: Option<String>) -> Option<String> {
    const MAX_NOTICE: usize = 2048;
    match (a, b) {
        (Some(a), Some(b)) if a.contains(&b) => Some(a),
        (Some(a), Some(b)) if a.len() + b.len() < MAX_NOTICE => Some(format!("{a} {b}")),
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
    if let UploadSource::Bytes { name, .. } = &source {
        let target = ResultsPath::parse(&format!("{dest}/{name}"))?;
        files::bounded(link.paths.results.clone(), "checking the path", move |root| {
            files::check_writable(root, &target)
        })
        .await?;
    }
    let (tar, name) = tokio::task::spawn_blocking(move || uploads::pack(source))
        .await
        .map_err(|e| SandboxError::Internal(e.to_string()))??;
    // The folder must exist for the archive API; mkdir runs as the sandbox
    // user, inside the sandbox.
    let mkdir = Work::Program(vec!["/bin/mkdir".into(), "-p".into(), "--".into(), dest.to_string()]);
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

/// Removes the sandbox's containers (its own and any installer, found by
/// their label, so a re-created container is never missed), its package
/// volume, its disks, its folders and its record. Removal kills: it never waits on
/// anything inside the sandbox.
pub async fn remove_everything(ctx: &Context, record: &SandboxRecord) -> Result<()> {
    let mut containers: Vec<String> = ctx
        .runtime
        .list_containers()
        .await?
        .into_iter()
        .filter(|c| c.sandbox == Some(record.id))
        .map(|c| c.id)
        .collect();
    if !containers.contains(&record.container_id) {
        containers.push(record.container_id.clone());
    }
    for container in &containers {
        ctx.runtime.remove(container, None).await?;
    }
    ctx.runtime.remove_volume(&record.volume).await?;
    ctx.egress.detach(record.id);
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    /// Stands in for a sandbox actor: passes on what the job guard reports.
    struct Relay;

    impl Actor for Relay {
        type Msg = SandboxMsg;
        type State = Option<oneshot::Sender<String>>;
        type Arguments = oneshot::Sender<String>;

        async fn pre_start(
            &self,
            _: ActorRef<SandboxMsg>,
            tx: oneshot::Sender<String>,
        ) -> Result<Self::State, ActorProcessingErr> {
            Ok(Some(tx))
        }

        async fn handle(
            &self,
            _: ActorRef<SandboxMsg>,
            msg: SandboxMsg,
            state: &mut Self::State,
        ) -> Result<(), ActorProcessingErr> {
            if let (SandboxMsg::JobPanicked(why), Some(tx)) = (msg, state.take()) {
                let _ = tx.send(why);
            }
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_panicking_job_is_reported_instead_of_lost() {
        let (tx, rx) = oneshot::channel();
        let (relay, handle) = Actor::spawn(None, Relay, tx).await.unwrap();
        spawn_job(relay.clone(), async { panic!("job exploded") });
        let why = tokio::time::timeout(Duration::from_secs(10), rx)
            .await
            .unwrap()
            .unwrap();
        assert!(why.contains("job exploded"), "{why}");
        relay.stop(None);
        handle.await.unwrap();
    }
}
