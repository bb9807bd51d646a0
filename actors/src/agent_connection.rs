//! A sandbox's connection to its agent, with recovery: when the connection is
//! gone, the container is inspected and started, unpaused or re-created (its
//! package volume and results folder are kept), and the run is sent again
//! only when it provably never reached the agent.
//!
//! Every exchange with the agent has a deadline (the agent is the sandbox's
//! to replace), and a link whose sandbox is being deleted or has expired
//! stops at once and never brings the container back.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use uuid::Uuid;

use crate::context::{Context, EventCounts};
use crate::error::{AgentFailure, Result, SandboxError};
use crate::receipt::Receipt;
use sandbox_runtime::agent::{AgentClient, AgentError, Carried, Progress, PythonState, RunOutput, Work};
use sandbox_runtime::spans;
use sandbox_runtime::{ContainerState, SandboxPaths};

/// How long a (re)started container may take until its agent answers.
const AGENT_START: Duration = Duration::from_secs(30);
/// Slack beyond the agent's own timeout and grace before the host gives up.
const WATCHDOG_SLACK: Duration = Duration::from_secs(15);
/// How long to wait for an agent that still finishes an abandoned run.
const BUSY_WAIT: Duration = Duration::from_secs(10);
/// Opening a connection to the agent, and a short question to it (a ping,
/// the package listing): a well-behaved agent answers in milliseconds.
pub const AGENT_CONNECT: Duration = Duration::from_secs(5);
pub const AGENT_QUERY: Duration = Duration::from_secs(10);
/// How long the agent may take to write a Python namespace to a fork file,
/// or to read one (a namespace of gigabytes takes seconds).
pub const CARRY_TIMEOUT: Duration = Duration::from_secs(60);
/// When a run is first checked for a container frozen behind the server's
/// back (`docker pause`); the checks then come at doubling intervals up to
/// [`FROZEN_CHECK_MAX`]: a short run costs the engine an inspection or two,
/// and a freeze however late is found within the watchdog's slack.
const FROZEN_CHECK: Duration = Duration::from_secs(2);
const FROZEN_CHECK_MAX: Duration = Duration::from_secs(10);

/// Set once when a sandbox is deleted or expires: the link's work ends at
/// once, with the reason, and no recovery brings the container back.
#[derive(Clone, Default)]
pub struct Retirement {
    token: CancellationToken,
    why: Arc<OnceLock<String>>,
}

impl Retirement {
    pub fn retire(&self, why: impl Into<String>) {
        let _ = self.why.set(why.into());
        self.token.cancel();
    }

    pub fn is_retired(&self) -> bool {
        self.token.is_cancelled()
    }

    fn error(&self, id: uuid::Uuid) -> SandboxError {
        SandboxError::Ended {
            id,
            why: self.why.get().cloned().unwrap_or_else(|| "was deleted".into()),
        }
    }
}

pub struct AgentConnection {
    ctx: Arc<Context>,
    pub paths: SandboxPaths,
    pub container_id: String,
    pub volume: String,
    client: Option<AgentClient>,
    /// Whether this link has talked to the agent: losing a connection after
    /// that means the Python state went with it.
    connected_before: bool,
    /// The container is frozen (idle parking); the next call thaws it.
    paused: bool,
    retirement: Retirement,
}

/// A run's output and what happened to the sandbox on the way.
#[derive(Debug)]
pub struct Ran {
    pub output: RunOutput,
    pub notice: Option<String>,
    /// What the run cost (the sandbox's job sets it).
    pub receipt: Option<Receipt>,
}

impl AgentConnection {
    pub fn new(
        ctx: Arc<Context>,
        paths: SandboxPaths,
        container_id: String,
        volume: String,
        retirement: Retirement,
    ) -> Self {
        Self {
            ctx,
            paths,
            container_id,
            volume,
            client: None,
            connected_before: false,
            paused: false,
            retirement,
        }
    }

    /// Takes the connection its creation made to the agent (the warm
    /// pool's), for the first call. Should it have closed meanwhile, that
    /// call's request provably never reached the agent and is sent again
    /// over a new one.
    pub fn hand_over(&mut self, client: AgentClient) {
        self.client = Some(client);
    }

    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Freezes the idle container: memory stays, CPU use drops to zero.
    pub async fn pause(&mut self) -> Result<()> {
        if !self.paused {
            self.ctx.runtime.pause(&self.container_id).await?;
            self.paused = true;
        }
        Ok(())
    }

    /// Thaws the container if this link froze it (or found it frozen).
    pub async fn wake(&mut self) -> Result<()> {
        if self.paused {
            if let Err(e) = self.ctx.runtime.unpause(&self.container_id).await {
                // It may have died (or been thawed) meanwhile: only a
                // container that is still frozen is an error here.
                if let Ok(ContainerState::Paused) = self.ctx.runtime.state(&self.container_id).await {
                    return Err(e.into());
                }
            }
            self.paused = false;
        }
        Ok(())
    }

    /// Records that the container was found frozen (by an earlier server).
    pub fn found_paused(&mut self) {
        self.paused = true;
    }

    pub fn ctx(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Runs `work`; a cancelled `cancel` interrupts it (the agent answers
    /// with what ran so far).
    pub async fn run(
        &mut self,
        work: &Work,
        timeout: Duration,
        progress: Option<&mpsc::Sender<Progress>>,
        cancel: &CancellationToken,
    ) -> Result<Ran> {
        let cap = self.ctx.settings.sandbox.output_cap_bytes;
        let mut attempts = self.attempts().await?;
        let retired = attempts.retired.clone();
        loop {
            self.attempt(&mut attempts).await?;
            let result = {
                let client = self.client.as_mut().expect("connected");
                let interrupter = client.interrupter();
                let watchdog = tokio::time::Instant::now() + timeout + WATCHDOG_SLACK;
                let run = spans::agent("run", client.run(work, timeout.as_secs_f64(), cap, progress));
                tokio::pin!(run);
                let mut interrupted = false;
                let mut frozen_check = FROZEN_CHECK;
                let check = tokio::time::sleep(frozen_check);
                tokio::pin!(check);
                // Beside the run, so that the run's answer, a cancel and a
                // delete are never held up by a slow engine.
                let mut thawing: Option<tokio::task::JoinHandle<()>> = None;
                let outcome = loop {
                    tokio::select! {
                        r = tokio::time::timeout_at(watchdog, &mut run) => break Some(r),
                        _ = retired.cancelled() => break None,
                        _ = cancel.cancelled(), if !interrupted => {
                            interrupted = true;
                            // The agent's own socket may be full; never wait on it.
                            let _ = tokio::time::timeout(AGENT_CONNECT, interrupter.interrupt()).await;
                        }
                        () = &mut check => {
                            if thawing.as_ref().is_none_or(tokio::task::JoinHandle::is_finished) {
                                thawing = Some(tokio::spawn(thaw_if_frozen(self.ctx.clone(), self.paths.id, self.container_id.clone())));
                            }
                            frozen_check = (frozen_check * 2).min(FROZEN_CHECK_MAX);
                            check.as_mut().reset(tokio::time::Instant::now() + frozen_check);
                        }
                    }
                };
                if let Some(thawing) = thawing {
                    thawing.abort();
                }
                outcome
            };
            let Some(result) = result else {
                self.drop_client();
                return Err(self.retirement.error(self.paths.id));
            };
            match result {
                Ok(Ok(mut output)) => {
                    self.connected_before = true;
                    output.state_lost |= attempts.python_lost;
                    return Ok(Ran {
                        output,
                        notice: join(attempts.notices),
                        receipt: None,
                    });
                }
                Ok(Err(e)) if attempts.retry.allows(&e) => attempts.retry.prepare(self, e).await,
                Ok(Err(AgentError::Receive(e))) => {
                    warn!(sandbox = %self.paths.id, error = %e, "the sandbox stopped during a run");
                    self.drop_client();
                    return self.died_during_run(attempts.notices).await;
                }
                Ok(Err(e)) => return Err(self.agent_failed(e)),
                Err(_elapsed) => {
                    let what = "the run did not end when its timeout and grace were over";
                    return Err(self.missed_deadline(what, timeout + WATCHDOG_SLACK).await);
                }
            }
        }
    }

    /// Gives the sandbox a fresh Python namespace: the agent replaces its
    /// worker, and files, packages and the container stay. Answers with what
    /// had to be done to reach the agent, for the caller.
    pub async fn reset_python(&mut self) -> Result<Option<String>> {
        let ((), notice) = self
            .ask_agent("reset Python", AGENT_QUERY, |c| Box::pin(c.reset()))
            .await?;
        Ok(notice)
    }

    /// Parks a copy of the Python worker under `slot` (a snapshot's Python
    /// state); says whether there was a namespace to keep.
    pub async fn snapshot_python(&mut self, slot: &str) -> Result<(PythonState, Option<String>)> {
        let slot = slot.to_string();
        self.ask_agent("save the Python state", AGENT_QUERY, move |c| {
            let slot = slot.clone();
            Box::pin(async move { c.snapshot(&slot).await })
        })
        .await
    }

    /// Replaces the Python worker with one resumed from the copy parked
    /// under `slot` (or a fresh one, when `python` is false).
    pub async fn restore_python(&mut self, slot: &str, python: bool) -> Result<(PythonState, Option<String>)> {
        let slot = slot.to_string();
        self.ask_agent("restore the Python state", AGENT_QUERY, move |c| {
            let slot = slot.clone();
            Box::pin(async move { c.restore(&slot, python).await })
        })
        .await
    }

    /// Ends the copy of the worker parked under `slot`.
    pub async fn forget_python(&mut self, slot: &str) -> Result<()> {
        let slot = slot.to_string();
        self.ask_agent("drop a saved Python state", AGENT_QUERY, move |c| {
            let slot = slot.clone();
            Box::pin(async move { c.forget(&slot).await })
        })
        .await
        .map(drop)
    }

    /// Writes the Python namespace (or that of the copy parked under
    /// `from`) to the fork file of `slot`, for [`crate::snapshots`] to carry
    /// into forks; says how much of it was written.
    pub async fn dump_python(&mut self, slot: &str, from: Option<&str>) -> Result<(Carried, Option<String>)> {
        let (slot, from) = (slot.to_string(), from.map(str::to_string));
        self.ask_agent(
            "write the Python state for a fork",
            CARRY_TIMEOUT + WATCHDOG_SLACK,
            move |c| {
                let (slot, from) = (slot.clone(), from.clone());
                Box::pin(async move { c.dump(&slot, from.as_deref(), CARRY_TIMEOUT).await })
            },
        )
        .await
    }

    /// Reads the fork file of `slot`, placed in this sandbox's results, into
    /// its Python namespace.
    pub async fn load_python(&mut self, slot: &str) -> Result<(Carried, Option<String>)> {
        let slot = slot.to_string();
        self.ask_agent(
            "read the Python state of a fork",
            CARRY_TIMEOUT + WATCHDOG_SLACK,
            move |c| {
                let slot = slot.clone();
                Box::pin(async move { c.load(&slot, CARRY_TIMEOUT).await })
            },
        )
        .await
    }

    /// A request to the agent, answered within `deadline` ([`AGENT_QUERY`]
    /// for the short ones): sent again, as a run is, only when it provably
    /// never reached the agent; an agent that misses the deadline has its
    /// container restarted.
    /// `what` names the request in errors. Answers with what had to be done
    /// to reach the agent, for the caller.
    pub(crate) async fn ask_agent<T>(
        &mut self,
        what: &'static str,
        deadline: Duration,
        op: impl for<'c> Fn(&'c mut AgentClient) -> BoxFuture<'c, Result<T, AgentError>>,
    ) -> Result<(T, Option<String>)> {
        let mut attempts = self.attempts().await?;
        let retired = attempts.retired.clone();
        loop {
            self.attempt(&mut attempts).await?;
            let client = self.client.as_mut().expect("connected");
            let answer = tokio::select! {
                r = tokio::time::timeout(deadline, spans::agent(what, op(client))) => r,
                _ = retired.cancelled() => {
                    self.drop_client();
                    return Err(self.retirement.error(self.paths.id));
                }
            };
            match answer {
                Ok(Ok(value)) => {
                    self.connected_before = true;
                    return Ok((value, join(attempts.notices)));
                }
                Ok(Err(e)) if attempts.retry.allows(&e) => attempts.retry.prepare(self, e).await,
                Ok(Err(AgentError::Refused(why))) => return Err(SandboxError::InvalidArgument(why)),
                Ok(Err(AgentError::Unsupported(_))) => {
                    return Err(SandboxError::Outdated {
                        id: self.paths.id,
                        what,
                    })
                }
                Ok(Err(e)) => return Err(self.agent_failed(e)),
                Err(_elapsed) => return Err(self.missed_deadline(what, deadline).await),
            }
        }
    }

    /// Wakes the sandbox for a request and starts counting its attempts.
    async fn attempts(&mut self) -> Result<Attempts> {
        self.wake().await?;
        Ok(Attempts {
            notices: Vec::new(),
            python_lost: false,
            retry: Retry::new(),
            retired: self.retirement.token.clone(),
        })
    }

    /// Connects for a request's next attempt, noting what that took.
    async fn attempt(&mut self, attempts: &mut Attempts) -> Result<()> {
        if let Some(n) = self.connect().await? {
            attempts.notices.push(n);
            attempts.python_lost = true;
        }
        Ok(())
    }

    /// The error of an agent that broke the protocol; the connection is dropped.
    fn agent_failed(&mut self, e: AgentError) -> SandboxError {
        self.drop_client();
        AgentFailure::from(e).into()
    }

    /// Restarts the container of an agent that missed a deadline of
    /// `allowed` while doing `what`, and says so.
    async fn missed_deadline(&mut self, what: &'static str, allowed: Duration) -> SandboxError {
        warn!(sandbox = %self.paths.id, what, "agent unresponsive past its deadline; restarting the container");
        self.restart_unresponsive().await;
        SandboxError::Unresponsive {
            id: self.paths.id,
            what,
            seconds: allowed.as_secs(),
        }
    }

    /// Restarts the container on request: processes and Python state go,
    /// files and packages stay. Answers once the agent is back.
    pub async fn restart(&mut self) -> Result<()> {
        self.check_retired()?;
        self.wake().await?;
        self.drop_client();
        EventCounts::bump(&self.ctx.counters.container_restarts);
        self.ctx.runtime.restart(&self.container_id).await?;
        self.client = Some(wait_for_agent(&self.ctx, self.paths.id, &self.container_id).await?);
        Ok(())
    }

    /// Restarts a container whose agent missed a deadline, which also ends
    /// whatever the sandbox left running; the next call reconnects.
    pub async fn restart_unresponsive(&mut self) {
        self.drop_client();
        if self.retirement.is_retired() {
            return;
        }
        self.paused = false;
        // Frozen behind the server's back (`docker pause`): thaw it first.
        if let Ok(ContainerState::Paused) = self.ctx.runtime.state(&self.container_id).await {
            let _ = self.ctx.runtime.unpause(&self.container_id).await;
        }
        EventCounts::bump(&self.ctx.counters.container_restarts);
        if let Err(e) = self.ctx.runtime.restart(&self.container_id).await {
            warn!(sandbox = %self.paths.id, error = %e, "could not restart an unresponsive sandbox");
        }
    }

    /// Lists the venv's distributions over a short-lived second connection,
    /// so it works while a run holds the main one; within [`AGENT_QUERY`].
    pub async fn packages(ctx: &Context, sandbox: Uuid) -> Result<Vec<sandbox_runtime::agent::Package>> {
        let unresponsive = || SandboxError::Unresponsive {
            id: sandbox,
            what: "listing its packages",
            seconds: AGENT_QUERY.as_secs(),
        };
        let ask = async {
            let mut client = connect_agent(ctx, sandbox).await.map_err(AgentFailure::Unreachable)?;
            client.packages().await.map_err(|e| AgentFailure::from(e).into())
        };
        tokio::time::timeout(AGENT_QUERY, ask)
            .await
            .unwrap_or_else(|_| Err(unresponsive()))
    }

    /// Whether the connection the link holds was closed by the other end
    /// (the agent or its container died while nobody was calling).
    pub fn agent_gone(&self) -> bool {
        self.client.as_ref().is_some_and(AgentClient::is_closed)
    }

    /// Brings back a container found dead while idle; says what was done,
    /// for the next caller.
    pub async fn revive(&mut self) -> Result<Option<String>> {
        self.drop_client();
        self.connect().await
    }

    /// Removes the container and keeps its package volume: a sandbox going
    /// to sleep on disk. The link holds no connection after.
    pub async fn remove_container(&mut self) -> Result<()> {
        self.drop_client();
        self.paused = false;
        Ok(self.ctx.runtime.remove(&self.container_id, None).await?)
    }

    /// Gives a sandbox woken from sleep (its old container removed) a new
    /// container on its kept disks and package volume, and waits for its
    /// agent.
    pub async fn recreate(&mut self) -> Result<()> {
        self.check_retired()?;
        self.drop_client();
        self.paused = false;
        // Its egress socket folder exists again only now.
        self.paths = self.ctx.paths(self.paths.id);
        self.create_container().await?;
        self.connect().await.map(drop)
    }

    /// Creates the sandbox's container anew on its volume.
    async fn create_container(&mut self) -> Result<()> {
        let runtime = &self.ctx.runtime;
        let created = runtime.create(&self.paths, Some(&self.volume)).await?;
        if self.retirement.is_retired() {
            // Deleted while it was being made: it must not outlive the removal.
            let _ = runtime.remove(&created.container_id, Some(&created.volume)).await;
            return Err(self.retirement.error(self.paths.id));
        }
        self.container_id = created.container_id;
        Ok(())
    }

    /// Whether the link holds no connection (none made yet, or one dropped).
    pub fn is_disconnected(&self) -> bool {
        self.client.is_none()
    }

    pub(crate) fn check_retired(&self) -> Result<()> {
        match self.retirement.is_retired() {
            true => Err(self.retirement.error(self.paths.id)),
            false => Ok(()),
        }
    }

    fn drop_client(&mut self) {
        self.client = None;
    }

    /// The result of a run whose container stopped under it (the memory
    /// limit killed the agent, or someone killed the container). The sandbox
    /// is brought back so that the next call works.
    async fn died_during_run(&mut self, mut notices: Vec<String>) -> Result<Ran> {
        let state = self.ctx.runtime.state(&self.container_id).await?;
        let (exit_code, why) = match state {
            ContainerState::Stopped { oom_killed: true, .. } => (137, "it ran out of memory"),
            ContainerState::Stopped { exit_code, .. } => (exit_code.max(1), "it stopped"),
            _ => (137, "it stopped answering"),
        };
        if let Some(n) = self.connect().await? {
            notices.push(n);
        }
        let output = RunOutput {
            stderr: format!(
                "[mcp-sandbox] The sandbox's container was restarted during this run because {why}. \
                 Files in /app/results and installed packages are kept; Python variables were lost.\n"
            ),
            exit_code,
            state_lost: true,
            ..Default::default()
        };
        Ok(Ran {
            output,
            notice: join(notices),
            receipt: None,
        })
    }

    /// Makes sure a connection is open; says what had to be done for it.
    async fn connect(&mut self) -> Result<Option<String>> {
        self.check_retired()?;
        if self.client.is_some() {
            return Ok(None);
        }
        let lost_state = self.connected_before.then(|| {
            "The sandbox's agent was restarted since your last call: Python variables were lost; files and packages are kept.".to_string()
        });
        if let Ok(client) = ready_agent(&self.ctx, self.paths.id).await {
            self.client = Some(client);
            return Ok(lost_state);
        }
        let runtime = self.ctx.runtime.clone();
        // Whatever the branch, the container is left running, not frozen.
        self.paused = false;
        let notice = match runtime.state(&self.container_id).await? {
            ContainerState::Running => lost_state,
            ContainerState::Paused => {
                runtime.unpause(&self.container_id).await?;
                lost_state
            }
            ContainerState::Stopped { exit_code, oom_killed } => {
                info!(sandbox = %self.paths.id, exit_code, oom_killed, "restarting a stopped sandbox container");
                runtime.start(&self.container_id).await?;
                self.check_retired()?;
                EventCounts::bump(&self.ctx.counters.container_restarts);
                let why = if oom_killed {
                    "it ran out of memory".to_string()
                } else {
                    format!("it had stopped (exit code {exit_code})")
                };
                Some(format!(
                    "The sandbox's container was restarted because {why}. Files in /app/results and installed packages are kept; Python variables were lost."
                ))
            }
            ContainerState::Missing => {
                info!(sandbox = %self.paths.id, "re-creating a removed sandbox container");
                self.create_container().await?;
                EventCounts::bump(&self.ctx.counters.container_restarts);
                Some("The sandbox's container had been removed and was re-created. Files in /app/results and installed packages are kept; Python variables were lost.".to_string())
            }
        };
        let waited = tokio::select! {
            waited = wait_for_agent(&self.ctx, self.paths.id, &self.container_id) => waited,
            _ = self.retirement.token.cancelled() => return Err(self.retirement.error(self.paths.id)),
        };
        match waited {
            Ok(client) => {
                self.client = Some(client);
                Ok(notice)
            }
            // A running container whose agent never answers: restart it,
            // which ends whatever took the agent's place.
            Err(SandboxError::Agent(why))
                if matches!(runtime.state(&self.container_id).await, Ok(ContainerState::Running)) =>
            {
                warn!(sandbox = %self.paths.id, error = %why, "the agent of a running container does not answer; restarting it");
                self.restart_unresponsive().await;
                Err(SandboxError::Unresponsive {
                    id: self.paths.id,
                    what: "its agent did not answer after a start",
                    seconds: AGENT_START.as_secs(),
                })
            }
            Err(e) => Err(e),
        }
    }
}

/// One request's attempts to reach the agent: what had to be done for it
/// (told to the caller), whether it may be sent again, and the token that
/// ends it when the sandbox is deleted.
struct Attempts {
    notices: Vec<String>,
    /// A connection had to be made anew: every notice of one says the
    /// Python variables were lost.
    python_lost: bool,
    retry: Retry,
    retired: CancellationToken,
}

/// When a request the agent did not take is sent again: once after the
/// connection was found lost (nothing reached the agent: reconnecting
/// restarts the container if it died), and for [`BUSY_WAIT`] while the agent
/// still finishes an abandoned run.
struct Retry {
    resent: bool,
    busy_until: tokio::time::Instant,
}

impl Retry {
    fn new() -> Self {
        Self {
            resent: false,
            busy_until: tokio::time::Instant::now() + BUSY_WAIT,
        }
    }

    fn allows(&self, e: &AgentError) -> bool {
        match e {
            AgentError::Send(_) => !self.resent,
            AgentError::Busy => tokio::time::Instant::now() < self.busy_until,
            _ => false,
        }
    }

    /// Readies `link` to send again after `e`, which [`Retry::allows`].
    async fn prepare(&mut self, link: &mut AgentConnection, e: AgentError) {
        match e {
            AgentError::Send(e) => {
                info!(sandbox = %link.paths.id, error = %e, "agent connection lost; reconnecting");
                link.drop_client();
                self.resent = true;
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Connects to the agent within [`AGENT_CONNECT`].
async fn connect_agent(ctx: &Context, sandbox: Uuid) -> std::io::Result<AgentClient> {
    tokio::time::timeout(AGENT_CONNECT, ctx.runtime.connect_agent(sandbox))
        .await
        .unwrap_or_else(|_| Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")))
}

/// A connection whose agent answered a ping within [`AGENT_CONNECT`]: a
/// socket that accepts but never answers is no agent.
async fn ready_agent(ctx: &Context, sandbox: Uuid) -> Result<AgentClient, AgentFailure> {
    let mut client = connect_agent(ctx, sandbox).await.map_err(AgentFailure::Unreachable)?;
    match tokio::time::timeout(AGENT_CONNECT, client.ping()).await {
        Ok(Ok(())) => Ok(client),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => Err(AgentFailure::NoPong),
    }
}

/// Thaws a container frozen during a run, not by the server: frozen, the
/// agent cannot answer; thawed, the run goes on (its own timeout starts when
/// the agent reads it) instead of waiting out the watchdog and a restart.
async fn thaw_if_frozen(ctx: Arc<Context>, sandbox: Uuid, container_id: String) {
    let state = tokio::time::timeout(AGENT_CONNECT, ctx.runtime.state(&container_id)).await;
    if let Ok(Ok(ContainerState::Paused)) = state {
        warn!(%sandbox, "the container was frozen during a run, not by the server; thawing it");
        let _ = tokio::time::timeout(AGENT_CONNECT, ctx.runtime.unpause(&container_id)).await;
    }
}

/// How often a wait for a starting agent asks the engine whether its
/// container ended: the agent's socket is tried every 10 ms, which costs a
/// failed `connect`, but each ask is an inspection by the engine, and a
/// burst of creations whose agents start slowly (the CPU shared by all of
/// them) would ask hundreds of times a second.
const EXIT_CHECK_EVERY: Duration = Duration::from_millis(250);

/// Waits until a (re)started container's agent answers.
pub async fn wait_for_agent(ctx: &Context, sandbox: Uuid, container_id: &str) -> Result<AgentClient> {
    let started = tokio::time::Instant::now();
    let deadline = started + AGENT_START;
    let mut next_exit_check = started + EXIT_CHECK_EVERY;
    loop {
        let last = match ready_agent(ctx, sandbox).await {
            Ok(client) => return Ok(client),
            Err(e) => e,
        };
        let now = tokio::time::Instant::now();
        if now >= next_exit_check || now >= deadline {
            if let ContainerState::Stopped { exit_code, .. } = ctx.runtime.state(container_id).await? {
                return Err(AgentFailure::ExitedBeforeStart(exit_code).into());
            }
            next_exit_check = now + EXIT_CHECK_EVERY;
        }
        if now >= deadline {
            return Err(AgentFailure::DidNotStart {
                within: AGENT_START,
                last: Box::new(last),
            }
            .into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn join(notices: Vec<String>) -> Option<String> {
    (!notices.is_empty()).then(|| notices.join(" "))
}
