//! The supervisor: parent of every sandbox actor. It keeps the registry of
//! sandboxes (see [`crate::registry`]), restarts a sandbox actor that fails
//! (from its record, telling the next caller), forgets one that stopped
//! after a delete, puts the actors of sleeping sandboxes left alone to rest
//! and starts them again on their next call, and has sandboxes whose
//! lifetime is over deleted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SpawnErr, SupervisionEvent};
use tokio::time::Instant;
use tracing::warn;
use uuid::Uuid;

use crate::context::Context;
use crate::messages::SandboxMsg;
use crate::moment;
use crate::records::SandboxRecord;
use crate::registry::{Registered, Registry, Slot};
use crate::sandbox::{Rested, SandboxActor, SandboxArgs, Started, RESTED};

/// How often sandboxes are asked whether their lifetime is over (and
/// sleeping ones whether they rest).
const REAP_EVERY: Duration = Duration::from_secs(2);

/// The most dormant sandboxes an upkeep wakes to delete (their lifetime or
/// idle time over): many that end together (adopted at one start) are
/// deleted a few at a time, and the supervisor's other work goes on.
const DUE_PER_REAP: usize = 25;

/// How often, at most, the heap's free pages go back to the kernel after
/// actors rested (see [`sandbox_host::figures::trim_heap`]).
const TRIM_EVERY: Duration = Duration::from_secs(30);

pub enum SupervisorMsg {
    Spawn {
        /// Boxed: a record is large next to the other messages.
        record: Box<SandboxRecord>,
        /// Set by the creation that started its container a moment ago.
        started: Option<Started>,
        reply: RpcReplyPort<Result<ActorRef<SandboxMsg>, SpawnErr>>,
    },
    /// Starts the actor of a dormant sandbox again: a call came for it, and
    /// waits in its entry (now [`Slot::Waking`]).
    Rouse {
        id: Uuid,
        rested: Box<Rested>,
    },
    Reap,
}

pub struct Supervisor;

pub struct SupervisorState {
    ctx: Arc<Context>,
    registry: Registry,
    by_actor: HashMap<ActorId, Uuid>,
    /// Actors that rested since the heap was last trimmed, and when it was.
    rested: Arc<AtomicUsize>,
    trimmed_at: Instant,
}

impl Supervisor {
    async fn spawn_child(
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
        record: SandboxRecord,
        notice: Option<String>,
        started: Option<Started>,
        rested: Option<Box<Rested>>,
    ) -> Result<ActorRef<SandboxMsg>, SpawnErr> {
        let (id, owner) = (record.id, record.owner.clone());
        let asleep = Arc::new(AtomicBool::new(record.hibernated.is_some()));
        let args = SandboxArgs {
            ctx: state.ctx.clone(),
            record,
            notice,
            started,
            asleep: asleep.clone(),
            rested,
        };
        let (actor, _) = Actor::spawn_linked(None, SandboxActor, args, myself.get_cell()).await?;
        state.by_actor.insert(actor.get_id(), id);
        let entry = Registered {
            owner,
            asleep,
            slot: Slot::Actor(actor.clone()),
        };
        // The calls that waited for it go first, under the lock.
        let mut registry = state.registry.write().expect("registry lock");
        if let Some(Slot::Waking(waiting) | Slot::Resting(_, waiting)) = registry.insert(id, entry).map(|e| e.slot) {
            for msg in waiting {
                let _ = actor.cast(msg);
            }
        }
        Ok(actor)
    }

    /// Starts the actor of sandbox `id`, whose entry waits
    /// ([`Slot::Waking`]), from its record and what its last actor kept. If
    /// that fails, the sandbox stays dormant and the calls that waited are
    /// answered that it failed.
    async fn rouse(myself: &ActorRef<SupervisorMsg>, state: &mut SupervisorState, id: Uuid, rested: Box<Rested>) {
        let lifetime_ends = rested.lifetime_ends();
        let (failed, kept) = match state.ctx.store.get(id).await {
            Ok(Some(record)) => match Self::spawn_child(myself, state, record, None, None, Some(rested)).await {
                Ok(_) => return,
                // What the rested actor kept went with the failed start.
                Err(e) => (e.to_string(), Box::new(Rested::adopted(lifetime_ends))),
            },
            Ok(None) => {
                // Its record went (removed by hand, say): nothing to wake.
                state.registry.write().expect("registry lock").remove(&id);
                return;
            }
            Err(e) => (e.to_string(), rested),
        };
        warn!(sandbox = %id, error = %failed, "could not start a sleeping sandbox's actor again");
        if let Some(e) = state.registry.write().expect("registry lock").get_mut(&id) {
            // Dropped, the waiting calls' reply ports tell their callers.
            e.slot = Slot::Dormant(kept);
        }
    }

    /// Every sandbox's upkeep: a tick to each actor, the question to rest to
    /// each sleeping one, and an actor again for each dormant sandbox whose
    /// lifetime or idle time is over, whose tick then deletes it.
    async fn reap(myself: &ActorRef<SupervisorMsg>, state: &mut SupervisorState) {
        let (now, settings) = (moment::now(), &state.ctx.settings);
        let (mut ticks, mut sleeping, mut due) = (Vec::new(), Vec::new(), Vec::new());
        for (id, entry) in state.registry.write().expect("registry lock").iter_mut() {
            match &entry.slot {
                Slot::Actor(actor) => {
                    ticks.push(actor.clone());
                    if entry.asleep.load(Ordering::Acquire) {
                        sleeping.push(*id);
                    }
                }
                Slot::Dormant(rested) if due.len() < DUE_PER_REAP && rested.due(settings, now) => {
                    // Its first message: the tick that deletes it.
                    let Slot::Dormant(rested) =
                        std::mem::replace(&mut entry.slot, Slot::Waking(vec![SandboxMsg::Tick]))
                    else {
                        unreachable!("matched above")
                    };
                    due.push((*id, rested));
                }
                _ => {}
            }
        }
        for actor in ticks {
            let _ = actor.cast(SandboxMsg::Tick);
        }
        for id in sleeping {
            ask_to_rest(&state.registry, myself, &state.rested, id);
        }
        for (id, rested) in due {
            Self::rouse(myself, state, id, rested).await;
        }
        if state.trimmed_at.elapsed() >= TRIM_EVERY && state.rested.swap(0, Ordering::Relaxed) > 0 {
            state.trimmed_at = Instant::now();
            tokio::task::spawn_blocking(sandbox_host::figures::trim_heap);
        }
    }
}

impl Actor for Supervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = (Arc<Context>, Registry);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (ctx, registry): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        myself.send_interval(REAP_EVERY, || SupervisorMsg::Reap);
        Ok(SupervisorState {
            ctx,
            registry,
            by_actor: HashMap::new(),
            rested: Arc::default(),
            trimmed_at: Instant::now(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::Spawn { record, started, reply } => {
                let _ = reply.send(Self::spawn_child(&myself, state, *record, None, started, None).await);
            }
            SupervisorMsg::Rouse { id, rested } => Self::rouse(&myself, state, id, rested).await,
            SupervisorMsg::Reap => Self::reap(&myself, state).await,
        }
        Ok(())
    }

    // The default would stop the supervisor when a child stops.
    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, failure) = match event {
            // Its entry was changed when it answered (see `settle`).
            SupervisionEvent::ActorTerminated(cell, _, Some(reason)) if reason == RESTED => {
                state.by_actor.remove(&cell.get_id());
                return Ok(());
            }
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                (cell, reason.filter(|r| r != "deleted" && r != "shutdown"))
            }
            SupervisionEvent::ActorFailed(cell, err) => (cell, Some(err.to_string())),
            _ => return Ok(()),
        };
        let Some(id) = state.by_actor.remove(&cell.get_id()) else {
            return Ok(());
        };
        let Some(why) = failure else {
            state.registry.write().expect("registry lock").remove(&id);
            return Ok(());
        };
        warn!(sandbox = %id, error = %why, "sandbox actor failed; restarting it");
        // Calls that come while it restarts, and those that waited for it to
        // answer whether it rests, wait in its entry for the new actor.
        if let Some(entry) = state.registry.write().expect("registry lock").get_mut(&id) {
            let waiting = match std::mem::replace(&mut entry.slot, Slot::Waking(Vec::new())) {
                Slot::Resting(_, waiting) | Slot::Waking(waiting) => waiting,
                Slot::Actor(_) | Slot::Dormant(_) => Vec::new(),
            };
            entry.slot = Slot::Waking(waiting);
        }
        let record = match state.ctx.store.get(id).await {
            Ok(record) => record,
            Err(e) => {
                warn!(sandbox = %id, error = %e, "could not read a failed sandbox actor's record; it is not restarted");
                None
            }
        };
        let restarted = match record {
            Some(record) => {
                let notice = Some("The sandbox was restarted inside the server after an internal error; if a call was in flight, run it again.".to_string());
                Self::spawn_child(&myself, state, record, notice, None, None)
                    .await
                    .inspect_err(|e| warn!(sandbox = %id, error = %e, "could not restart a sandbox actor"))
                    .is_ok()
            }
            None => false,
        };
        if !restarted {
            // Dropped, the waiting calls' reply ports tell their callers.
            state.registry.write().expect("registry lock").remove(&id);
        }
        Ok(())
    }
}

/// Asks the actor of sleeping sandbox `id` whether it rests (`rested`
/// counts those that did). Asked under the write lock, so every message
/// sent before is ahead of the question (see [`crate::registry`]); the
/// answer is taken by [`settle`] in a task of its own, so that calls held
/// meanwhile wait for the actor only, never behind the supervisor's other
/// work.
pub(crate) fn ask_to_rest(
    registry: &Registry,
    supervisor: &ActorRef<SupervisorMsg>,
    rested: &Arc<AtomicUsize>,
    id: Uuid,
) {
    let (port, answer) = ractor::concurrency::oneshot();
    let actor = {
        let mut entries = registry.write().expect("registry lock");
        let Some(entry) = entries.get_mut(&id) else { return };
        let Slot::Actor(actor) = &entry.slot else { return };
        let actor = actor.clone();
        if actor.cast(SandboxMsg::Rest(port.into())).is_err() {
            // Stopped: its supervision event follows.
            return;
        }
        entry.slot = Slot::Resting(actor.clone(), Vec::new());
        actor
    };
    let (supervisor, registry, count) = (supervisor.clone(), registry.clone(), rested.clone());
    tokio::spawn(async move {
        // Unanswered, the question went with an actor that stopped before
        // it read it (its mailbox dropped before its supervisor hears):
        // the supervision event takes the calls that wait in the entry.
        let Ok(rested) = answer.await else { return };
        if rested.is_some() {
            count.fetch_add(1, Ordering::Relaxed);
        }
        settle(&registry, &supervisor, id, actor, rested);
    });
}

/// Takes a resting actor's answer: the entry becomes dormant, or keeps its
/// actor, which gets the calls that came meanwhile; if it rested and calls
/// came, the supervisor starts a new actor for them.
fn settle(
    registry: &Registry,
    supervisor: &ActorRef<SupervisorMsg>,
    id: Uuid,
    actor: ActorRef<SandboxMsg>,
    rested: Option<Box<Rested>>,
) {
    let mut entries = registry.write().expect("registry lock");
    let Some(entry) = entries.get_mut(&id) else { return };
    if !matches!(&entry.slot, Slot::Resting(resting, _) if resting.get_id() == actor.get_id()) {
        // Failed meanwhile: its supervision event replaced the entry.
        return;
    }
    let Slot::Resting(_, waiting) = std::mem::replace(&mut entry.slot, Slot::Actor(actor.clone())) else {
        unreachable!("matched above")
    };
    match rested {
        None => {
            for msg in waiting {
                let _ = actor.cast(msg);
            }
        }
        Some(rested) if waiting.is_empty() => entry.slot = Slot::Dormant(rested),
        Some(rested) => {
            entry.slot = Slot::Waking(waiting);
            if let Err(ractor::MessagingErr::SendErr(SupervisorMsg::Rouse { rested, .. })) =
                supervisor.cast(SupervisorMsg::Rouse { id, rested })
            {
                // The server is stopping: the calls that waited hear so.
                entry.slot = Slot::Dormant(rested);
            }
        }
    }
}
