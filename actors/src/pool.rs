//! Making sandboxes, and keeping a few made ahead of demand.
//!
//! [`provision`] makes the container of a new sandbox (folders, package
//! volume, container). The warm [`Pool`] keeps some of them with the agent
//! answering and the Python worker started, owned by nobody: `[pool] min`
//! always, up to `max` as bursts of claims show ([`Target`]), and never more
//! than the room the live sandboxes leave under `limits.max_sandboxes_total`.
//! `create_sandbox` claims one (recording owner and name only then: Docker
//! cannot relabel a container) and the pool refills in the background,
//! `creations_at_once` at a time. A claim that finds the pool empty waits for
//! the next sandbox the pool finishes, first come first served, and the pool
//! makes one more for each claim waiting: every creation under way serves
//! the oldest waiting claim when it ends, so no claim waits behind refills
//! queued before it, and a burst's creations run at the pace the engine
//! sustains instead of all at once (a hundred creations started together
//! all end late; started a few at a time, the first end early).
//! While the first calls of claimed sandboxes are to come or under way,
//! refills give way to them for a moment ([`Yield`]); while any calls run,
//! they go one at a time and take at most a quarter of the time ([`Pace`]).
//! Pooled sandboxes are made under the server's egress policy; a claim may
//! switch a proxied one to another proxied policy (the proxy looks the
//! policy up per connection), anything else is created cold.
//! Pooled sandboxes have no record, so a restarted server removes them like
//! any unexplained container, and a stopped server removes them itself.

use std::collections::{HashMap, VecDeque};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use uuid::Uuid;

use crate::agent_connection::wait_for_agent;
use crate::config::{EgressPolicy, PoolConfig};
use crate::context::Context;
use crate::error::{AgentFailure, Result, SandboxError};
use crate::pool_pace::Pace;
use crate::pool_target::Target;
use crate::pool_yield::{Yield, MAX_YIELD};
use crate::templates::{disk_sizes, place_files, Offered};
use sandbox_host::SANDBOX_UID;
use sandbox_runtime::agent::{AgentClient, Work};
use sandbox_runtime::template::Template;
use sandbox_runtime::ContainerRef;

/// A sandbox's container before it has an owner.
pub struct Provisioned {
    pub id: Uuid,
    pub container: ContainerRef,
    /// The warm pool's connection to the agent: it tells that the
    /// container died while it waited (an engine restart, a kill), and is
    /// handed to the sandbox's actor when claimed, whose first call then
    /// needs no connection of its own.
    warm: Option<AgentClient>,
    /// Whether its Python worker was started ahead (not for a sandbox
    /// handed straight to a waiting claim).
    warmed: bool,
    /// Set when claimed: its owner's first call is still to come.
    first_call: Option<FirstCall>,
}

impl Provisioned {
    fn is_dead(&self) -> bool {
        self.warm.as_ref().is_some_and(AgentClient::is_closed)
    }

    /// The open connection to its agent, when it has one.
    pub fn take_agent(&mut self) -> Option<AgentClient> {
        self.warm.take()
    }

    /// What tells the pool that its first call ended, when it was claimed.
    pub fn take_first_call(&mut self) -> Option<FirstCall> {
        self.first_call.take()
    }
}

/// The first calls of claimed sandboxes that have not ended, by when
/// their sandbox was claimed. One that has not ended [`MAX_YIELD`] after
/// its claim no longer counts (its caller may never call), so a sandbox
/// claimed and left alone holds up no refill later.
#[derive(Default)]
struct FirstCalls {
    claimed: Mutex<HashMap<u64, Instant>>,
    next: AtomicU64,
    /// Told when the last of them ends.
    ended: Notify,
}

impl FirstCalls {
    /// Until when a first call of a claim of the last [`MAX_YIELD`] that
    /// has not ended counts (the latest claim's), if one does; the older
    /// ones are forgotten here.
    fn pending(&self, now: Instant) -> Option<Instant> {
        let mut claimed = self.claimed.lock().expect("pool lock");
        forget_old(&mut claimed, now);
        claimed.values().max().map(|at| *at + MAX_YIELD)
    }
}

fn forget_old(claimed: &mut HashMap<u64, Instant>, now: Instant) {
    claimed.retain(|_, at| now.duration_since(*at) < MAX_YIELD);
}

/// A claimed sandbox's first call, to come or under way: refills give way
/// while any is ([`Yield`]). Its sandbox's actor drops it when its first
/// job ends; a claim that fails drops it with the sandbox.
pub struct FirstCall {
    calls: Arc<FirstCalls>,
    key: u64,
}

impl FirstCall {
    fn new(calls: &Arc<FirstCalls>) -> Self {
        let key = calls.next.fetch_add(1, Ordering::Relaxed);
        calls.claimed.lock().expect("pool lock").insert(key, Instant::now());
        Self {
            calls: calls.clone(),
            key,
        }
    }
}

impl Drop for FirstCall {
    fn drop(&mut self) {
        // A poisoned lock (a panic while it was held) still holds the map.
        let mut claimed = self
            .calls
            .claimed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let ended = claimed.remove(&self.key).is_some();
        forget_old(&mut claimed, Instant::now());
        if ended && claimed.is_empty() {
            self.calls.ended.notify_one();
        }
    }
}

/// Creates a host folder that the sandbox user (not root) must write.
fn prepare_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    if let Err(e) = std::os::unix::fs::chown(dir, Some(SANDBOX_UID), Some(SANDBOX_UID)) {
        warn!(dir = %dir.display(), error = %e, "cannot hand a sandbox folder to the sandbox user (is the server root?)");
    }
    Ok(())
}

/// What a new sandbox is made from: the sandbox image, or a template's
/// image, with the template's files placed in its results folder (none
/// for a fork, which carries its source's files instead).
#[derive(Clone, Default)]
pub struct Recipe {
    pub template: Option<Arc<Template>>,
    pub files: Option<Arc<Offered>>,
}

impl Recipe {
    /// A new sandbox of the offered template `offered`.
    pub fn of(offered: &Arc<Offered>) -> Self {
        Self {
            template: Some(offered.template.clone()),
            files: Some(offered.clone()),
        }
    }

    /// Whether a sandbox made by `other` is one this recipe makes (a
    /// template's without its files, for a fork, is not).
    fn same(&self, other: &Recipe) -> bool {
        self.template.as_ref().map(|t| &t.image) == other.template.as_ref().map(|t| &t.image)
            && self.files.is_some() == other.files.is_some()
    }
}

/// Makes the folders, egress proxy socket, capped file systems, package
/// volume and running container of a new sandbox under `egress`, as
/// `recipe` says.
pub async fn provision(ctx: &Context, egress: EgressPolicy, recipe: &Recipe) -> Result<Provisioned> {
    // The pool does not refill while the host's disk is nearly full.
    crate::resources::check_free_disk(&ctx.settings)?;
    let id = Uuid::new_v4();
    ctx.egress.attach(id, egress)?;
    ctx.templates.attach(id, recipe.template.clone());
    let paths = ctx.paths(id);
    let made = async {
        for dir in [&paths.results, &paths.agent] {
            prepare_dir(dir).map_err(|e| SandboxError::Internal(format!("preparing {}: {e}", dir.display())))?;
        }
        ctx.disks.prepare(id, disk_sizes(recipe.template.as_deref())).await?;
        if let Some(offered) = &recipe.files {
            place_files(offered.clone(), paths.results.clone()).await.map_err(|e| {
                SandboxError::Internal(format!("placing template {:?}'s files: {e}", offered.config.name))
            })?;
        }
        Ok::<_, SandboxError>(ctx.runtime.create(&paths, None).await?)
    };
    match made.await {
        Ok(container) => Ok(Provisioned {
            id,
            container,
            warm: None,
            warmed: false,
            first_call: None,
        }),
        Err(e) => {
            remove_host_side(ctx, id).await;
            Err(e)
        }
    }
}

/// Removes a sandbox's capped file systems and folders (its container gone).
async fn remove_host_side(ctx: &Context, id: Uuid) {
    if let Err(e) = ctx.disks.remove(id).await {
        warn!(sandbox = %id, error = %e, "could not remove a sandbox's disks");
    }
    let paths = ctx.paths(id);
    let _ = std::fs::remove_dir_all(&paths.results);
    let _ = std::fs::remove_dir_all(&paths.agent);
    ctx.egress.detach(id);
    ctx.templates.detach(id);
}

/// How long the removal of a sandbox that was never handed out is retried
/// while the engine does not answer (it may be restarting): given up at
/// once, the container and its volume would outlive the server's stop.
const DISCARD_RETRY_FOR: Duration = Duration::from_secs(90);
const DISCARD_RETRY_EVERY: Duration = Duration::from_secs(2);

/// Removes a provisioned sandbox that was never handed out.
pub async fn discard(ctx: &Context, p: &Provisioned) {
    let until = tokio::time::Instant::now() + DISCARD_RETRY_FOR;
    loop {
        let removed = ctx
            .runtime
            .remove(&p.container.container_id, Some(&p.container.volume))
            .await;
        match removed {
            Ok(()) => break,
            Err(e) if tokio::time::Instant::now() + DISCARD_RETRY_EVERY < until => {
                warn!(sandbox = %p.id, error = %e, "could not remove a pooled sandbox; retrying");
                tokio::time::sleep(DISCARD_RETRY_EVERY).await;
            }
            Err(e) => {
                warn!(sandbox = %p.id, error = %e, "could not remove a pooled sandbox; the next start removes it");
                break;
            }
        }
    }
    remove_host_side(ctx, p.id).await;
}

/// Provisions a sandbox and waits until its worker is up, so that the first
/// call of its owner costs what any later call costs; unless, once its
/// agent answers, more claims wait than sandboxes are ready or on their way
/// to them: then it is handed over at once, and its worker starts with its
/// first Python call, as a cold sandbox's does (claims that wait want an
/// answer, and a worker's start is a second interpreter's start-up, of the
/// CPU a burst's creations share).
async fn provision_warm(
    ctx: &Context,
    recipe: &Recipe,
    egress: EgressPolicy,
    for_a_waiting_claim: impl Fn() -> bool,
) -> Result<Provisioned> {
    let mut p = provision(ctx, egress, recipe).await?;
    let warmed = async {
        let mut client = wait_for_agent(ctx, p.id, &p.container.container_id).await?;
        if for_a_waiting_claim() {
            return Ok((client, false));
        }
        let warm_up = Work::Python("pass".into());
        tokio::time::timeout(WARM_DEADLINE, client.run(&warm_up, 30.0, 1024, None))
            .await
            .map_err(|_| AgentFailure::WorkerDidNotStart)?
            .map_err(AgentFailure::from)?;
        Ok((client, true))
    };
    match warmed.await {
        Ok((client, warmed)) => {
            p.warm = Some(client);
            p.warmed = warmed;
            Ok(p)
        }
        Err(e) => {
            discard(ctx, &p).await;
            Err(e)
        }
    }
}

/// How long a pooled sandbox's Python worker may take to start.
const WARM_DEADLINE: Duration = Duration::from_secs(30);
/// How often the pool looks for pooled sandboxes that died while waiting
/// (and steps its target down when quiet).
const PRUNE_EVERY: Duration = Duration::from_secs(5);
/// How long refills pause after one failed.
const REFILL_BACKOFF: Duration = Duration::from_secs(5);

/// The free places under the server's cap of sandboxes (the live ones and
/// those being created taken off), which the pool may fill.
pub type Room = Box<dyn Fn() -> usize + Send + Sync>;

/// What the pool has done since start, for the metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct PoolStats {
    /// Sandboxes ready to be claimed.
    pub ready: usize,
    /// How many it aims to hold now.
    pub target: usize,
    /// Claims served from the pool, and claims that found it empty.
    pub claims: u64,
    pub misses: u64,
    /// Refills made, and their time added up (create to warm worker).
    pub refills: u64,
    pub refill_seconds: f64,
}

#[derive(Default)]
struct PoolCounts {
    claims: AtomicU64,
    misses: AtomicU64,
    refills: AtomicU64,
    refill_micros: AtomicU64,
}

/// Clears the queue of waiting claims when dropped.
struct ClearOnDrop(Arc<Pool>);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        // A poisoned lock (a panic while it was held) still holds the queue.
        let mut waiting = self.0.waiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        waiting.clear();
    }
}

/// The answer of a claim the pool stopped before serving.
fn stopping() -> SandboxError {
    SandboxError::Internal("the server is stopping and made no sandbox for this call; try again once it is back".into())
}

/// How a creation of the pool ended (with its time), as its task returns it.
type Refill = std::result::Result<(Result<Provisioned>, Duration), tokio::task::JoinError>;

/// A claim that found the pool empty, waiting for the next sandbox.
type Waiter = oneshot::Sender<Result<Provisioned>>;

/// The receiving end of a waiting claim. Dropped before it was read (its
/// caller went away), it gives what it was sent back to the pool, so that a
/// sandbox handed over at that moment is neither lost nor left running.
struct WaitingClaim {
    rx: oneshot::Receiver<Result<Provisioned>>,
    pool: Arc<Pool>,
}

impl Drop for WaitingClaim {
    fn drop(&mut self) {
        self.rx.close();
        if let Ok(Ok(p)) = self.rx.try_recv() {
            self.pool.give_back(p);
        }
    }
}

pub struct Pool {
    ctx: Arc<Context>,
    /// What its sandboxes are made from, and under which egress policy.
    recipe: Recipe,
    egress: EgressPolicy,
    room: Room,
    enabled: bool,
    /// Creations run at once.
    at_once: usize,
    target: Mutex<Target>,
    ready: Mutex<VecDeque<Provisioned>>,
    /// Claims waiting for a sandbox, oldest first.
    waiting: Mutex<VecDeque<Waiter>>,
    /// Creations that skipped the warm-up for a waiting claim and have not
    /// yet joined `ready`.
    for_waiting: AtomicUsize,
    counters: PoolCounts,
    wake: Notify,
    stop: CancellationToken,
    filler: Mutex<Option<tokio::task::JoinHandle<()>>>,
    first_calls: Arc<FirstCalls>,
}

impl Pool {
    /// A pool under `config` that fills at most `room()` places, of
    /// sandboxes that `recipe` makes under `egress`.
    pub fn start(
        ctx: Arc<Context>,
        config: &PoolConfig,
        room: Room,
        recipe: Recipe,
        egress: EgressPolicy,
    ) -> Arc<Self> {
        let min = config.min.resolve(sandbox_host::figures::memory_bytes());
        let target = Target::new(min, config.max, Duration::from_secs(config.shrink_after_seconds));
        let enabled = config.max.max(min) > 0;
        let pool = Arc::new(Self {
            ctx,
            recipe,
            egress,
            room,
            enabled,
            at_once: config.creations_at_once.max(1),
            target: Mutex::new(target),
            ready: Mutex::new(VecDeque::new()),
            waiting: Mutex::new(VecDeque::new()),
            for_waiting: AtomicUsize::new(0),
            counters: PoolCounts::default(),
            wake: Notify::new(),
            stop: CancellationToken::new(),
            filler: Mutex::new(None),
            first_calls: Arc::default(),
        });
        if enabled {
            let handle = tokio::spawn(pool.clone().fill());
            *pool.filler.lock().expect("pool lock") = Some(handle);
        }
        pool
    }

    /// A pool that never fills (before the records are reconciled).
    pub fn off(ctx: Arc<Context>) -> Arc<Self> {
        let egress = ctx.egress.default_policy();
        Self::start(ctx, &PoolConfig::off(), Box::new(|| 0), Recipe::default(), egress)
    }

    /// Whether its sandboxes are what `recipe` makes, under a policy that
    /// a claim may switch to `egress` (a proxied one to another proxied
    /// one: the proxy looks the policy up per connection).
    pub fn serves(&self, recipe: &Recipe, egress: EgressPolicy) -> bool {
        self.recipe.same(recipe) && self.egress.is_proxied() == egress.is_proxied()
    }

    /// Takes a ready sandbox, or waits for the next one the pool finishes
    /// when none is ready; `None` when the pool is off (the caller makes its
    /// own). One whose container died while it waited is thrown away, never
    /// handed out. Every claim, served at once or not, counts as demand.
    pub async fn claim(self: &Arc<Self>) -> Option<Result<Provisioned>> {
        if !self.enabled {
            return None;
        }
        Some(self.take_or_wait().await)
    }

    /// A claimed sandbox, with what tells the pool of its first call.
    fn claimed(&self, mut p: Provisioned) -> Provisioned {
        p.first_call = Some(FirstCall::new(&self.first_calls));
        p
    }

    async fn take_or_wait(self: &Arc<Self>) -> Result<Provisioned> {
        self.target.lock().expect("pool lock").claimed(Instant::now());
        let waiting = {
            // Under the lock of the queue, so that a sandbox finished in
            // between is either taken here or handed to this claim.
            // Claims already waiting come first.
            let mut waiting = self.waiting.lock().expect("pool lock");
            if waiting.is_empty() {
                if let Some(p) = self.take_ready() {
                    self.counters.claims.fetch_add(1, Ordering::Relaxed);
                    // Counted before the filler hears of the claim, so
                    // that its refill gives way to the first call.
                    let p = self.claimed(p);
                    self.wake.notify_one();
                    return Ok(p);
                }
            }
            // The filler clears the queue under this lock once stopped
            // (or ended otherwise: see `fill`).
            if self.stop.is_cancelled() || self.filler_ended() {
                return Err(stopping());
            }
            let (tx, rx) = oneshot::channel();
            waiting.push_back(tx);
            WaitingClaim { rx, pool: self.clone() }
        };
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        self.wake.notify_one();
        let mut waiting = waiting;
        // Counted once handed over: the filler, which made it for this
        // claim, holds no refill while claims wait.
        let handed = (&mut waiting.rx).await.unwrap_or_else(|_| Err(stopping()));
        handed.map(|p| self.claimed(p))
    }

    fn filler_ended(&self) -> bool {
        let filler = self.filler.lock().expect("pool lock");
        filler.as_ref().is_some_and(tokio::task::JoinHandle::is_finished)
    }

    /// Puts a sandbox that a claim was handed but did not take back at the
    /// head of the pool.
    fn give_back(self: &Arc<Self>, p: Provisioned) {
        if self.stop.is_cancelled() {
            // The pool is emptied already: remove it, as a stop removes
            // every sandbox nobody claimed. (Dropped where no runtime runs
            // any more, it is left to the next start, which removes every
            // container no record explains; spawning there would panic.)
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let pool = self.clone();
                runtime.spawn(async move { discard(&pool.ctx, &p).await });
            }
            return;
        }
        self.ready.lock().expect("pool lock").push_front(p);
        self.wake.notify_one();
    }

    /// The oldest ready sandbox that is still alive.
    fn take_ready(self: &Arc<Self>) -> Option<Provisioned> {
        loop {
            let next = self.ready.lock().expect("pool lock").pop_front();
            match next {
                Some(p) if p.is_dead() => self.throw_away(p),
                other => return other,
            }
        }
    }

    /// Hands ready sandboxes to waiting claims, oldest first. A claim whose
    /// caller went away gives its sandbox back to the pool.
    fn serve_waiting(self: &Arc<Self>) {
        let mut waiting = self.waiting.lock().expect("pool lock");
        while !waiting.is_empty() {
            let Some(p) = self.take_ready() else { break };
            let mut p = Some(p);
            while let Some(waiter) = waiting.pop_front() {
                match waiter.send(Ok(p.take().expect("one sandbox"))) {
                    Ok(()) => break,
                    Err(back) => p = Some(back.expect("sent a sandbox")),
                }
            }
            if let Some(p) = p {
                self.ready.lock().expect("pool lock").push_front(p);
            }
        }
    }

    /// Answers the oldest waiting claim (whose caller is still there) with
    /// a creation's failure, so that a claim never outwaits an engine that
    /// fails every creation. False when no claim was waiting.
    fn fail_oldest(&self, e: SandboxError) -> bool {
        let mut waiting = self.waiting.lock().expect("pool lock");
        let mut e = Some(e);
        while let Some(waiter) = waiting.pop_front() {
            match waiter.send(Err(e.take().expect("one error"))) {
                Ok(()) => return true,
                Err(back) => e = back.err(),
            }
        }
        false
    }

    fn waiting(&self) -> usize {
        self.waiting.lock().expect("pool lock").len()
    }

    /// Whether a creation whose agent just answered is for a waiting claim
    /// (more claims wait than sandboxes are ready or on their way to one),
    /// counting it as on its way when it is.
    fn take_waiting_place(&self) -> bool {
        let waiting = self.waiting.lock().expect("pool lock");
        let covered = self.ready() + self.for_waiting.load(Ordering::SeqCst);
        let place = waiting.len() > covered;
        if place {
            self.for_waiting.fetch_add(1, Ordering::SeqCst);
        }
        place
    }

    /// A finished creation, no longer on its way to a waiting claim.
    fn landed(&self, done: Refill) -> Refill {
        if let Ok((Ok(p), _)) = &done {
            if !p.warmed {
                self.for_waiting.fetch_sub(1, Ordering::SeqCst);
            }
        }
        done
    }

    fn throw_away(self: &Arc<Self>, p: Provisioned) {
        info!(sandbox = %p.id, "a pooled sandbox died while waiting; removing it");
        let pool = self.clone();
        tokio::spawn(async move { discard(&pool.ctx, &p).await });
    }

    /// Throws away pooled sandboxes that died while waiting.
    fn prune(self: &Arc<Self>) {
        let dead: Vec<Provisioned> = {
            let mut ready = self.ready.lock().expect("pool lock");
            let (dead, alive): (VecDeque<_>, VecDeque<_>) = ready.drain(..).partition(Provisioned::is_dead);
            *ready = alive;
            dead.into()
        };
        for p in dead {
            self.throw_away(p);
        }
    }

    pub fn ready(&self) -> usize {
        self.ready.lock().expect("pool lock").len()
    }

    /// The memory its ready sandboxes may take, in MB: `default` each, or
    /// their template's.
    pub fn ready_memory_mb(&self, default: u64) -> u64 {
        let each = self
            .recipe
            .template
            .as_ref()
            .and_then(|t| t.memory_mb)
            .unwrap_or(default);
        self.ready() as u64 * each
    }

    /// How many the pool aims to hold now: its target, within the room the
    /// live sandboxes leave (pooled ones never take a tenant's place).
    fn aim(&self) -> usize {
        let target = self.target.lock().expect("pool lock").at(Instant::now());
        target.min((self.room)())
    }

    /// How many sandboxes should be ready or under way: the aim, and one for
    /// each waiting claim (whose place under the server's cap its creation
    /// already holds, so the room does not bound it).
    fn wanted(&self) -> usize {
        self.aim() + self.waiting()
    }

    pub fn stats(&self) -> PoolStats {
        let c = &self.counters;
        PoolStats {
            ready: self.ready(),
            target: self.aim(),
            claims: c.claims.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            refills: c.refills.load(Ordering::Relaxed),
            refill_seconds: c.refill_micros.load(Ordering::Relaxed) as f64 / 1e6,
        }
    }

    /// Keeps `ready + refilling` at what is wanted, `creations_at_once` at a
    /// time, hands what ends to waiting claims first, and removes what a
    /// lowered aim leaves over.
    async fn fill(self: Arc<Self>) {
        // However the loop ends (a panic included), no claim is left
        // waiting on it: the queue's senders are dropped, which answers them.
        let _answer_waiting = ClearOnDrop(self.clone());
        let mut refilling: JoinSet<(Result<Provisioned>, Duration)> = JoinSet::new();
        let mut removing: JoinSet<()> = JoinSet::new();
        let mut paused_until: Option<Instant> = None;
        let mut yielding = Yield::default();
        let mut pace = Pace::default();
        loop {
            self.serve_waiting();
            // A failure pauses refills for the pool's own sake only, and
            // first calls hold them only while no claim waits: claims that
            // wait are still made for, and answered by a sandbox or by the
            // next failure.
            let now = Instant::now();
            let counted_until = self.first_calls.pending(now);
            let first_calls = counted_until.is_some() && self.waiting() == 0;
            let holds = yielding.holds(now, first_calls);
            let wanted = match holds || paused_until.is_some_and(|t| now < t) {
                true => self.waiting(),
                false => self.wanted(),
            };
            // A hold ends at its limit, or once no first call counts.
            let yield_ends = yielding.until().map(|end| counted_until.map_or(end, |c| c.min(end)));
            // Calls under way pace the refills, unless a claim waits.
            let busy = self.ctx.calls.busy(now) && self.waiting() == 0;
            let at_once = pace.room(now, busy, self.at_once);
            let gap_ends = pace.until(now).filter(|_| busy);
            while self.ready() + refilling.len() < wanted && refilling.len() < at_once && !self.stop.is_cancelled() {
                let pool = self.clone();
                refilling.spawn(async move {
                    let started = Instant::now();
                    let made = provision_warm(&pool.ctx, &pool.recipe, pool.egress, || pool.take_waiting_place()).await;
                    (made, started.elapsed())
                });
            }
            // Removed beside the loop: a removal retried while the engine is
            // down must not hold up the claims.
            // (What is wanted is read before the lock of `ready`: `waiting`
            // is always locked first.)
            let keep = self.wanted();
            let surplus: Vec<Provisioned> = {
                let mut ready = self.ready.lock().expect("pool lock");
                let keep = keep.min(ready.len());
                ready.drain(keep..).collect()
            };
            for p in surplus {
                let ctx = self.ctx.clone();
                removing.spawn(async move { discard(&ctx, &p).await });
            }
            tokio::select! {
                Some(done) = refilling.join_next() => match self.landed(done) {
                    Ok((Ok(p), _)) if self.stop.is_cancelled() => discard(&self.ctx, &p).await,
                    Ok((Ok(p), took)) => {
                        let now = Instant::now();
                        pace.landed(now, took, self.ctx.calls.busy(now));
                        self.counters.refills.fetch_add(1, Ordering::Relaxed);
                        self.counters.refill_micros.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
                        self.ready.lock().expect("pool lock").push_back(p);
                    }
                    Ok((Err(e), _)) => {
                        warn!(error = %e, "could not fill the warm pool; retrying");
                        if !self.fail_oldest(e) {
                            paused_until = Some(Instant::now() + REFILL_BACKOFF);
                        }
                    }
                    Err(e) => warn!(error = %e, "a refill of the warm pool ended inside the server"),
                },
                Some(_) = removing.join_next() => {}
                _ = self.wake.notified() => {}
                _ = self.first_calls.ended.notified() => {}
                _ = tokio::time::sleep_until(yield_ends.unwrap_or(now)), if yield_ends.is_some() => {}
                _ = tokio::time::sleep_until(gap_ends.unwrap_or(now)), if gap_ends.is_some() => {}
                _ = tokio::time::sleep(PRUNE_EVERY) => self.prune(),
                _ = self.stop.cancelled() => break,
            }
        }
        // Claims still waiting are answered (their senders dropped), and
        // refills still running are finished and removed, not left behind.
        drop(_answer_waiting);
        while let Some(done) = refilling.join_next().await {
            if let Ok((Ok(p), _)) = self.landed(done) {
                discard(&self.ctx, &p).await;
            }
        }
        while removing.join_next().await.is_some() {}
    }
    /// Stops refilling and removes the sandboxes nobody claimed.
    pub async fn drain(&self) {
        self.stop.cancel();
        let filler = self.filler.lock().expect("pool lock").take();
        if let Some(handle) = filler {
            let _ = handle.await;
        }
        let left: Vec<Provisioned> = self.ready.lock().expect("pool lock").drain(..).collect();
        if !left.is_empty() {
            info!(count = left.len(), "removing unclaimed pooled sandboxes");
        }
        for p in &left {
            discard(&self.ctx, p).await;
        }
    }
}
