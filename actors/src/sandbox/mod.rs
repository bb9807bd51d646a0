//! The sandbox actor: one per sandbox, owner of its container.
//!
//! Runs, installs, uploads (file writes among them), Python resets and
//! restarts are queued and carried out strictly in arrival order, each in a
//! task (or the install-task actor) that holds the sandbox's [`AgentConnection`] while
//! it works; the actor itself only queues and answers, so queries (info,
//! install status) never wait behind a long run, and no sandbox ever waits
//! on another.
//!
//! Deleting and expiring never wait on the sandbox: the link is retired (the
//! job in flight ends at once with the reason), queued calls are answered,
//! and after a short grace the container is removed. A sandbox that misses
//! a deadline is restarted in turn with its calls.

mod deletion;
mod hibernation;
mod jobs;
mod rest;
mod snapshot;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use time::OffsetDateTime;
use tokio::sync::watch;
use tracing::warn;

use crate::agent_connection::{AgentConnection, Retirement};
use crate::context::{Context, EventCounts};
use crate::error::{DockerError, Result, SandboxError};
use crate::history::{CallKind, CallRecord, History};
use crate::messages::{Finished, Queued, SandboxMsg};
use crate::moment;
use crate::packages;
use crate::pool::FirstCall;
use crate::records::{InstallRecord, InstallState, SandboxRecord};
use crate::results::{InstallStatus, InstallStatusKind, SandboxInfo};
use crate::snapshots::{SnapshotOp, SnapshotTotals};
use crate::status::SandboxStatus;
use deletion::{begin_deletion, Deletion};
use jobs::{Job, QueuedJob};
use sandbox_runtime::agent::{AgentClient, Package};
use sandbox_runtime::ContainerState;

pub use deletion::remove_everything;
pub use rest::{Rested, RESTED};

/// Requirement strings whose last install a sandbox remembers; past it the
/// oldest finished ones are forgotten.
pub const MAX_INSTALL_RECORDS: usize = 100;

pub struct SandboxActor;

pub struct SandboxArgs {
    pub ctx: Arc<Context>,
    pub record: SandboxRecord,
    /// Told with the next result (the actor was restarted by its supervisor).
    pub notice: Option<String>,
    /// Set by the creation that started its container a moment ago: how
    /// the container is (frozen while it waited in the pool, say) is then
    /// read from the host, not asked of the engine. Spawns go one at a time
    /// through the supervisor, and that question, a round trip to an engine
    /// a burst of creations keeps busy, was most of what a burst of claims
    /// from the warm pool waited on.
    pub started: Option<Started>,
    /// Its flag in the census: whether it is hibernated.
    pub asleep: Arc<AtomicBool>,
    /// What its last actor kept in memory, when it rested (see [`rest`]).
    pub rested: Option<Box<Rested>>,
}

/// What the creation of a sandbox knows of it: its container runs.
pub struct Started {
    /// The warm pool's open connection to its agent, which the first call
    /// then uses instead of making one.
    pub agent: Option<AgentClient>,
    /// Set for a sandbox claimed from the warm pool, whose refills give way
    /// until its first job ends.
    pub first_call: Option<FirstCall>,
}

pub struct SandboxState {
    ctx: Arc<Context>,
    record: SandboxRecord,
    /// `None` while a job holds it.
    link: Option<AgentConnection>,
    queue: VecDeque<QueuedJob>,
    /// The span of the call whose message is being handled (none outside
    /// [`SandboxMsg::Traced`]): the parent of the job it queues.
    caller: tracing::Span,
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
    /// The snapshots it keeps, as its listing shows them: read from the
    /// store when the actor starts and after each snapshot job, so that
    /// listings and metrics read no files.
    snapshots: SnapshotTotals,
    /// Held until the first job ends (a sandbox claimed from the pool).
    first_call: Option<FirstCall>,
    /// Background processes may run: the idle sandbox is then not paused
    /// (which would freeze them), until a listing shows none runs.
    processes_may_run: bool,
    /// When upkeep last queued a hibernation: one that failed (a namespace
    /// that could not be written) is tried again only a period later.
    slept_at: Option<OffsetDateTime>,
    /// A hibernation is the job in flight.
    sleeping: bool,
    /// Its flag in the census (see [`crate::census`]).
    asleep: Arc<AtomicBool>,
    /// `notice` says Python variables were lost (a restart on request): the
    /// run that tells it says `state_lost` too.
    python_lost: bool,
    /// When the last message other than upkeep came: a sleeping sandbox
    /// rests only a while after it (see [`rest`]).
    touched: tokio::time::Instant,
}

impl SandboxState {
    /// What to tell the next call, and whether it says Python variables were
    /// lost; both are told once.
    fn take_notice(&mut self) -> (Option<String>, bool) {
        (self.notice.take(), std::mem::take(&mut self.python_lost))
    }
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
            started,
            asleep,
            rested,
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
            install.finished_at = Some(moment::now());
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
        let mut first_call = None;
        // An adopted sandbox may have been paused by the previous server, or
        // its container may have died meanwhile; a pooled one may have been
        // frozen behind the server's back while it waited.
        let found = match started {
            // Asleep: there is no container to ask about.
            _ if record.hibernated.is_some() => Ok(ContainerState::Missing),
            Some(Started {
                agent,
                first_call: held,
            }) => {
                first_call = held;
                if let Some(agent) = agent {
                    link.hand_over(agent);
                }
                ctx.runtime.started_state(&record.container_id).await
            }
            None => ctx.runtime.state(&record.container_id).await,
        };
        let stopped = matches!(found, Ok(ContainerState::Stopped { .. } | ContainerState::Missing));
        if let Ok(ContainerState::Paused) = found {
            link.found_paused();
        }
        let stopped = stopped && record.hibernated.is_none();
        if stopped && !record.deleting {
            queue.push_back(QueuedJob::own(Job::Revive));
        }
        // Asleep, its store is not mounted: its figures are those it slept with.
        let snapshots = match &record.hibernated {
            Some(asleep) => asleep.snapshots,
            None => ctx.snapshots.totals(record.id),
        };
        let Rested {
            history,
            last_used,
            notice: told,
            python_lost,
            ..
        } = match rested {
            Some(rested) => *rested,
            None => Rested::adopted(record.expires_at),
        };
        Ok(SandboxState {
            ctx,
            record,
            link: Some(link),
            queue,
            caller: tracing::Span::none(),
            installs: HashMap::new(),
            notice: join_notices(told, notice),
            deletion,
            retirement,
            restarting: false,
            stopped,
            checking_venv: Arc::default(),
            history,
            last_used,
            snapshots,
            first_call,
            processes_may_run: false,
            slept_at: None,
            sleeping: false,
            asleep,
            python_lost,
            touched: tokio::time::Instant::now(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: SandboxMsg,
        state: &mut SandboxState,
    ) -> Result<(), ActorProcessingErr> {
        let mut msg = msg;
        while let SandboxMsg::Traced(span, inner) = msg {
            state.caller = span;
            msg = *inner;
        }
        // Reads of its state (listings, metrics, the usage sampler) and
        // upkeep keep no sleeping sandbox's actor from resting.
        if !matches!(
            msg,
            SandboxMsg::Tick | SandboxMsg::Rest(_) | SandboxMsg::Info(_) | SandboxMsg::History(_)
        ) {
            state.touched = tokio::time::Instant::now();
        }
        let handled = Box::pin(self.dispatch(myself, msg, state)).await;
        // A call's span is held no longer than its message.
        state.caller = tracing::Span::none();
        handled
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut SandboxState,
    ) -> Result<(), ActorProcessingErr> {
        Box::pin(self.supervised(myself, event, state)).await
    }
}

impl SandboxActor {
    /// The only children are install tasks. One that failed took the link
    /// with it: make a new one and record the install as failed.
    async fn supervised(
        &self,
        myself: ActorRef<SandboxMsg>,
        event: SupervisionEvent,
        state: &mut SandboxState,
    ) -> Result<(), ActorProcessingErr> {
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
                    r.finished_at = Some(moment::now());
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

    /// Handles one message (unwrapped of its call's span), then starts
    /// the next job if the sandbox is free.
    async fn dispatch(
        &self,
        myself: ActorRef<SandboxMsg>,
        msg: SandboxMsg,
        state: &mut SandboxState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SandboxMsg::Run(req) => match admit(state, false) {
                Ok(()) => state.push(Job::Run(req)),
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
                } else if let Err(e) = admit(state, false) {
                    let _ = reply.send(Err(e));
                } else {
                    let record = InstallRecord {
                        package: package.clone(),
                        status: InstallState::Installing,
                        message: format!("Installing {package}..."),
                        output: None,
                        started_at: moment::now(),
                        finished_at: None,
                    };
                    let (tx, rx) = watch::channel(record.clone());
                    let forget = forget_oldest_installs(state, &package);
                    state.installs.insert(package.clone(), tx);
                    state.record.installs.insert(package.clone(), record.clone());
                    state.ctx.store.put_install(state.record.id, record, forget).await?;
                    let _ = reply.send(Ok(rx));
                    state.push(Job::Install { package, specs });
                }
            }
            SandboxMsg::InstallStatus { package, reply } => {
                if let Some(record) = state.record.installs.get(&package) {
                    let _ = reply.send(Ok(record.into()));
                } else if state.record.hibernated.is_some() && state.deletion.is_none() {
                    // Asleep, its venv is as last listed.
                    let _ = reply.send(Ok(status_from_venv(&package, &state.record.packages)));
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
                    let id = state.record.id;
                    let me = myself.clone();
                    tokio::spawn(async move {
                        let answer = AgentConnection::packages(&ctx, id)
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
            SandboxMsg::Queued(call) => enqueue(state, Job::Queued(call)),
            SandboxMsg::History(reply) => {
                let _ = reply.send(state.history.to_vec());
            }
            SandboxMsg::Hibernate(reply) => enqueue(state, Job::Hibernate(Some(reply))),
            SandboxMsg::Awake(reply) => {
                let going = state.sleeping || state.queue.iter().any(|w| matches!(w.job, Job::Hibernate(_)));
                match (&state.deletion, state.record.hibernated.is_some() || going) {
                    (Some(_), _) => {
                        let _ = reply.send(Err(state.retirement_error()));
                    }
                    // Asleep or about to be: answered once woken again.
                    (None, true) => enqueue(state, Job::Awake(reply)),
                    (None, false) => {
                        state.last_used = moment::now();
                        let _ = reply.send(Ok(()));
                    }
                }
            }
            SandboxMsg::Delete { reply, by_owner } => match seeded(state) {
                Err(e) if by_owner => {
                    let _ = reply.send(Err(e));
                }
                _ => begin_deletion(&myself, state, "was deleted", Some(reply)),
            },
            SandboxMsg::Info(reply) => {
                let _ = reply.send(info(state));
            }
            SandboxMsg::Expose { port, expose, reply } => {
                let _ = reply.send(expose_port(state, port, expose).await);
            }
            SandboxMsg::Preview { port, reply } => {
                let ready = match (&state.deletion, state.record.exposed_ports.contains(&port)) {
                    (Some(_), _) => Err(state.retirement_error()),
                    (None, true) if state.record.hibernated.is_some() => Err(SandboxError::Asleep {
                        id: state.record.id,
                        why: "its processes ended when it went to sleep, and a preview link does not wake it. \
                              Any call wakes it; then start the app again."
                            .into(),
                    }),
                    (None, false) => Err(SandboxError::InvalidArgument(format!(
                        "port {port} of sandbox {} is not exposed (expose_port makes a link to it)",
                        state.record.id
                    ))),
                    (None, true) => {
                        state.last_used = moment::now();
                        match state.link.as_mut() {
                            Some(link) => link.wake().await,
                            None => Ok(()),
                        }
                    }
                };
                let _ = reply.send(ready);
            }
            SandboxMsg::Tick => self.tick(&myself, state).await,
            SandboxMsg::Rest(reply) => {
                if rest::may_rest(state) {
                    let _ = reply.send(Some(Box::new(rest::take(state))));
                    myself.stop(Some(RESTED.into()));
                    return Ok(());
                }
                let _ = reply.send(None);
            }
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
                let queued = state.queue.iter().any(|w| matches!(w.job, Job::Recover));
                if state.deletion.is_none() && !queued && !state.restarting {
                    warn!(sandbox = %state.record.id, "the sandbox missed a deadline; restarting its container");
                    state.queue.push_back(QueuedJob::own(Job::Recover));
                }
            }
            // Unwrapped by `handle`.
            SandboxMsg::Traced(..) => {}
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
}

fn new_link(ctx: &Arc<Context>, record: &SandboxRecord, retirement: &Retirement) -> AgentConnection {
    AgentConnection::new(
        ctx.clone(),
        ctx.paths(record.id),
        record.container_id.clone(),
        record.volume.clone(),
        retirement.clone(),
    )
}

impl SandboxState {
    /// Queues `job` within the span of the call being handled.
    fn push(&mut self, job: Job) {
        let waiting = QueuedJob::new(job, &self.caller);
        self.queue.push_back(waiting);
    }

    /// A call that ended: into the history, and onto its tenant's usage.
    fn remember(&mut self, call: CallRecord) {
        let seconds = call.duration_ms as f64 / 1000.0;
        self.ctx.meter.call(&self.record.owner, call.kind, seconds);
        self.history.push(call);
    }

    fn retirement_error(&self) -> SandboxError {
        SandboxError::Ended {
            id: self.record.id,
            why: "was deleted".into(),
        }
    }
}

/// Whether another call may join the queue.
/// Queues a caller's job, or answers it at once when the sandbox takes no more.
fn enqueue(state: &mut SandboxState, job: Job) {
    let seed = matches!(
        &job,
        Job::Queued(Queued::Snapshot {
            op: SnapshotOp::Seed { .. },
            ..
        })
    );
    match admit(state, seed) {
        Ok(()) => state.push(job),
        Err(e) => job.refuse(e),
    }
}

/// Refuses the owner's calls, a delete included, to a fork the server still
/// copies into (it is listed from its creation on): a delete then would
/// leave the copy writing into folders and disks being removed.
fn seeded(state: &SandboxState) -> Result<()> {
    match state.record.seeding {
        Some(fork) if state.ctx.fork_under_way(fork) => Err(SandboxError::Seeding {
            id: state.record.id,
            fork,
        }),
        _ => Ok(()),
    }
}

/// `seed`: the job that seeds a fork, the only one a fork takes before.
fn admit(state: &SandboxState, seed: bool) -> Result<()> {
    if state.deletion.is_some() {
        return Err(state.retirement_error());
    }
    if !seed {
        seeded(state)?;
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

/// The earlier of the end of the sandbox's lifetime and of its idle time.
fn expires_at(state: &SandboxState) -> Option<OffsetDateTime> {
    rest::expiry(&state.ctx.settings, state.record.expires_at, state.last_used)
}

impl SandboxActor {
    /// Periodic upkeep: lifetime (busy or not), idle expiry, pausing, and a
    /// container that died while nobody was calling.
    async fn tick(&self, myself: &ActorRef<SandboxMsg>, state: &mut SandboxState) {
        let now = moment::now();
        if let Some(removing) = state.deletion.as_ref().map(|d| d.removing) {
            if !removing {
                begin_deletion(myself, state, "was deleted", None);
            }
            return;
        }
        // A fork the server still copies into ends only once the copy
        // stops, as its owner's delete waits: removed under the copy, its
        // folders would be written again outside their caps, and left.
        if seeded(state).is_err() {
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
        if state.record.hibernated.is_some() {
            return;
        }
        let hibernate_after = Duration::from_secs(state.ctx.settings.sandbox.hibernate_after_seconds);
        if !hibernate_after.is_zero()
            && !state.processes_may_run
            && now - state.last_used >= hibernate_after
            && state.slept_at.is_none_or(|t| now - t >= hibernate_after)
        {
            state.slept_at = Some(now);
            state.queue.push_back(QueuedJob::own(Job::Hibernate(None)));
            return;
        }
        let link = state.link.as_mut().expect("idle");
        if state.stopped && link.is_disconnected() {
            // An earlier attempt failed (the engine was down, say): retry.
            state.queue.push_back(QueuedJob::own(Job::Revive));
            return;
        }
        if link.agent_gone() {
            tracing::info!(sandbox = %state.record.id, "the sandbox's agent went away while idle; bringing it back");
            state.stopped = true;
            state.queue.push_back(QueuedJob::own(Job::Revive));
            return;
        }
        let pause_after = state.ctx.settings.sandbox.pause_after_seconds;
        if pause_after > 0
            && !state.processes_may_run
            && now - state.last_used >= Duration::from_secs(pause_after)
            && !link.is_paused()
        {
            if let Err(e) = link.pause().await {
                warn!(sandbox = %state.record.id, error = %e, "could not pause an idle sandbox");
            }
        }
    }

    async fn finished(&self, state: &mut SandboxState, f: Finished) -> Result<(), ActorProcessingErr> {
        state.first_call = None;
        state.sleeping = false;
        state.restarting = false;
        // Still dead if the job said so, or if it could not reconnect either.
        state.stopped = f.still_stopped || (state.stopped && f.link.is_disconnected());
        // Idle time counts from the last call, not from upkeep.
        if f.call.is_some() || f.install.is_some() {
            state.last_used = moment::now();
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
                state.python_lost = true;
            }
            state.remember(call);
        }
        // A deleted sandbox writes nothing more: its records are going.
        if state.deletion.is_some() {
            return Ok(());
        }
        let mut record_changed = false;
        if let Some((install, packages)) = f.install {
            let counters = &state.ctx.counters;
            let ended = match install.status {
                InstallState::Success => Some((&counters.installs_succeeded, true, "success")),
                InstallState::Failed => Some((&counters.installs_failed, false, "failed")),
                InstallState::Installing => None,
            };
            if let Some((counter, ok, outcome)) = ended {
                EventCounts::bump(counter);
                let call = CallRecord::ended(
                    install.started_at,
                    CallKind::Install,
                    &install.package,
                    ok,
                    outcome.into(),
                );
                state.remember(call);
            }
            if let Some(tx) = state.installs.get(&install.package) {
                tx.send_replace(install.clone());
            }
            state.record.installs.insert(install.package.clone(), install.clone());
            state.ctx.store.put_install(state.record.id, install, vec![]).await?;
            if let Some(p) = packages {
                state.record.packages = p;
                record_changed = true;
            }
        }
        if let Some(totals) = f.snapshots {
            state.snapshots = totals;
        }
        if let Some(p) = f.packages {
            state.record.packages = p;
            record_changed = true;
        }
        if f.seeded {
            state.record.seeding = None;
            record_changed = true;
        }
        if let Some(may_run) = f.processes_may_run {
            state.processes_may_run = may_run;
        }
        if let Some(hibernated) = f.hibernated {
            // Asleep, nothing runs; awake, the wake wrote the record and
            // mounted the snapshot store again.
            state.processes_may_run = false;
            state.stopped = false;
            if hibernated.is_none() {
                state.snapshots = state.ctx.snapshots.totals(state.record.id);
            }
            state.record.hibernated = hibernated;
        }
        if let Some(why) = f.wake_failed {
            // The calls that waited for the wake hear why; the saved state
            // stays for the next call to try again.
            let error = || SandboxError::Asleep {
                id: state.record.id,
                why: format!("it could not be woken ({why}); its saved state is kept. Call again to retry."),
            };
            let (refused, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut state.queue)
                .into_iter()
                .partition(|w| w.job.needs_waking());
            state.queue = kept.into();
            for waiting in refused {
                // An install's caller follows its record: it fails too.
                if let Job::Install { package, .. } = &waiting.job {
                    if let Some(tx) = state.installs.get(package) {
                        fail_install(tx, &error());
                        let failed = tx.borrow().clone();
                        state.record.installs.insert(package.clone(), failed.clone());
                        state.ctx.store.put_install(state.record.id, failed, vec![]).await?;
                    }
                }
                waiting.job.refuse(error());
            }
        }
        if container_changed || record_changed {
            state.ctx.store.put(state.record.clone()).await?;
        }
        Ok(())
    }
}

/// Ends an install that will never run: whoever follows it reads `why`.
fn fail_install(tx: &watch::Sender<InstallRecord>, why: &SandboxError) {
    tx.send_modify(|r| {
        r.status = InstallState::Failed;
        r.message = why.to_string();
        r.finished_at = Some(moment::now());
    });
}

/// The sandbox's state, its deletion aside.
fn live_status(state: &SandboxState) -> SandboxStatus {
    if state.record.hibernated.is_some() {
        SandboxStatus::Hibernated
    } else if state.restarting {
        SandboxStatus::Restarting
    } else if state.stopped {
        SandboxStatus::Stopped
    } else if state.link.as_ref().is_some_and(AgentConnection::is_paused) {
        SandboxStatus::Paused
    } else {
        SandboxStatus::Running
    }
}

fn info(state: &SandboxState) -> SandboxInfo {
    let status = match state.deletion {
        Some(_) => SandboxStatus::Deleting,
        None => live_status(state),
    };
    describe(&state.ctx, &state.record, status, expires_at(state), state.snapshots)
}

/// What a dormant sandbox's listing shows: its record, as its actor would
/// answer asleep.
pub(crate) fn dormant_info(ctx: &Context, record: &SandboxRecord, last_used: OffsetDateTime) -> SandboxInfo {
    let snapshots = record.hibernated.as_ref().map(|h| h.snapshots).unwrap_or_default();
    let expires_at = rest::expiry(&ctx.settings, record.expires_at, last_used);
    describe(ctx, record, SandboxStatus::Hibernated, expires_at, snapshots)
}

fn describe(
    ctx: &Context,
    r: &SandboxRecord,
    status: SandboxStatus,
    expires_at: Option<OffsetDateTime>,
    snapshots: SnapshotTotals,
) -> SandboxInfo {
    SandboxInfo {
        sandbox_id: r.id,
        name: r.name.clone(),
        owner: r.owner.clone(),
        container_id: r.container_id.clone(),
        egress: r.egress,
        status,
        created_at: r.created_at,
        expires_at,
        installed_packages: r.packages.clone(),
        disk: ctx.disks.usage(r.id),
        snapshots,
        exposed_ports: r.exposed_ports.clone(),
        hibernated_since: r.hibernated.as_ref().map(|h| h.since),
        template: r.template.as_ref().map(|t| t.name.clone()),
    }
}

/// Adds `port` to the exposed ones (or takes it away), within
/// `processes.max_exposed_ports`, and keeps the record.
async fn expose_port(state: &mut SandboxState, port: u16, expose: bool) -> Result<Vec<u16>> {
    if state.deletion.is_some() {
        return Err(state.retirement_error());
    }
    let ports = &mut state.record.exposed_ports;
    let most = state.ctx.settings.processes.max_exposed_ports;
    match (expose, ports.binary_search(&port)) {
        (true, Ok(_)) | (false, Err(_)) => return Ok(ports.clone()),
        (true, Err(_)) if ports.len() >= most => {
            return Err(SandboxError::Quota(format!(
                "sandbox {} already exposes {most} ports (processes.max_exposed_ports); unexpose one first",
                state.record.id
            )))
        }
        (true, Err(at)) => ports.insert(at, port),
        (false, Ok(at)) => {
            ports.remove(at);
        }
    }
    state.ctx.store.put(state.record.clone()).await?;
    Ok(state.record.exposed_ports.clone())
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
            message: format!("No installation of {package} was found."),
            output: None,
        },
    }
}
