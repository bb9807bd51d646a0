//! The supervisor: parent of every sandbox actor. It keeps the registry of
//! sandbox id → actor, restarts a sandbox actor that fails (from its record,
//! telling the next caller), forgets one that stopped after a delete, and
//! deletes sandboxes whose lifetime is over.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SpawnErr, SupervisionEvent};
use tracing::warn;
use uuid::Uuid;

use crate::context::Context;
use crate::messages::SandboxMsg;
use crate::records::SandboxRecord;
use crate::sandbox::{SandboxActor, SandboxArgs, Started};

/// How often sandboxes are asked whether their lifetime is over.
const REAP_EVERY: Duration = Duration::from_secs(2);

#[derive(Clone)]
pub struct Registered {
    pub owner: String,
    pub actor: ActorRef<SandboxMsg>,
    /// Hibernated: turned by its actor (see [`crate::census`]).
    pub asleep: Arc<AtomicBool>,
}

/// Sandbox id → actor; written by the supervisor, read by the front end.
pub type Registry = Arc<RwLock<HashMap<Uuid, Registered>>>;

pub enum SupervisorMsg {
    Spawn {
        /// Boxed: a record is large next to the other messages.
        record: Box<SandboxRecord>,
        /// Set by the creation that started its container a moment ago.
        started: Option<Started>,
        reply: RpcReplyPort<Result<ActorRef<SandboxMsg>, SpawnErr>>,
    },
    Reap,
}

pub struct Supervisor;

pub struct SupervisorState {
    ctx: Arc<Context>,
    registry: Registry,
    by_actor: HashMap<ActorId, Uuid>,
}

impl Supervisor {
    async fn spawn_child(
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
        record: SandboxRecord,
        notice: Option<String>,
        started: Option<Started>,
    ) -> Result<ActorRef<SandboxMsg>, SpawnErr> {
        let (id, owner) = (record.id, record.owner.clone());
        let asleep = Arc::new(AtomicBool::new(record.hibernated.is_some()));
        let args = SandboxArgs {
            ctx: state.ctx.clone(),
            record,
            notice,
            started,
            asleep: asleep.clone(),
        };
        let (actor, _) = Actor::spawn_linked(None, SandboxActor, args, myself.get_cell()).await?;
        state.by_actor.insert(actor.get_id(), id);
        state.registry.write().expect("registry lock").insert(
            id,
            Registered {
                owner,
                actor: actor.clone(),
                asleep,
            },
        );
        Ok(actor)
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
                let _ = reply.send(Self::spawn_child(&myself, state, *record, None, started).await);
            }
            SupervisorMsg::Reap => {
                // Each actor knows its own lifetime and how long it has idled.
                let actors: Vec<ActorRef<SandboxMsg>> = state
                    .registry
                    .read()
                    .expect("registry lock")
                    .values()
                    .map(|e| e.actor.clone())
                    .collect();
                for actor in actors {
                    let _ = actor.cast(SandboxMsg::Tick);
                }
            }
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
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                (cell, reason.filter(|r| r != "deleted" && r != "shutdown"))
            }
            SupervisionEvent::ActorFailed(cell, err) => (cell, Some(err.to_string())),
            _ => return Ok(()),
        };
        let Some(id) = state.by_actor.remove(&cell.get_id()) else {
            return Ok(());
        };
        state.registry.write().expect("registry lock").remove(&id);
        let Some(why) = failure else { return Ok(()) };
        warn!(sandbox = %id, error = %why, "sandbox actor failed; restarting it");
        let record = state.ctx.store.all().await?.into_iter().find(|r| r.id == id);
        if let Some(record) = record {
            let notice = Some("The sandbox was restarted inside the server after an internal error; if a call was in flight, run it again.".to_string());
            if let Err(e) = Self::spawn_child(&myself, state, record, notice, None).await {
                warn!(sandbox = %id, error = %e, "could not restart a sandbox actor");
            }
        }
        Ok(())
    }
}
