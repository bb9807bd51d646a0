//! [`Reach`]: how a call finds a sandbox's actor, through the registry (see
//! [`crate::registry`]). A message for a dormant sandbox starts its actor
//! again and waits in the registry's entry, as do those that come while the
//! entry changes; they reach the actor in the order they came. Every
//! message goes to an actor under the registry's lock, so no actor rests
//! with one unread.

use std::collections::HashMap;
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{ActorRef, RpcReplyPort};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::error::{Result, SandboxError};
use crate::messages::SandboxMsg;
use crate::registry::{Registry, Slot};
use crate::scope::Scope;
use crate::supervisor::SupervisorMsg;

/// The registry and the supervisor, which together reach any sandbox;
/// cheap to clone (a fork's task keeps one).
#[derive(Clone)]
pub(crate) struct Reach {
    pub(super) registry: Registry,
    pub(super) supervisor: ActorRef<SupervisorMsg>,
    /// The most messages that wait in an entry that changes
    /// (`sandbox.max_queued_calls`, as its actor's queue).
    pub(super) most_waiting: usize,
}

/// How a sandbox is seen without waking it.
pub(super) enum Seen {
    Actor,
    /// Dormant; when it was last used (its idle time counts from then).
    Dormant(OffsetDateTime),
}

impl Reach {
    /// Sends `msg` to sandbox `id`'s actor, if `scope` admits its owner, and
    /// waits up to `deadline` for the answer. A sandbox gone meanwhile (its
    /// actor stopped, its entry removed) reads as not found; a reply port
    /// dropped otherwise is a failure inside the server; a query past
    /// `deadline` says so.
    pub(super) async fn ask<T: Send + 'static>(
        &self,
        scope: Scope<'_>,
        id: Uuid,
        deadline: Option<Duration>,
        msg: impl FnOnce(RpcReplyPort<T>) -> SandboxMsg,
    ) -> Result<T> {
        let (port, answer) = ractor::concurrency::oneshot();
        let msg = msg(port.into()).traced();
        let actor = self.send(scope, id, msg)?;
        let called = match deadline {
            Some(d) => match tokio::time::timeout(d, answer).await {
                Ok(answered) => answered.map_err(|_| ()),
                Err(_) => {
                    return Err(SandboxError::Internal(format!(
                        "sandbox {id} did not answer in time; try again"
                    )))
                }
            },
            None => answer.await.map_err(|_| ()),
        };
        match called {
            Ok(v) => Ok(v),
            Err(()) if actor.is_some_and(|a| a.get_status() != ractor::ActorStatus::Running) => {
                Err(SandboxError::NotFound(id))
            }
            Err(()) if !self.registry.read().expect("registry lock").contains_key(&id) => {
                Err(SandboxError::NotFound(id))
            }
            Err(()) => Err(SandboxError::Internal(
                "the call failed inside the server before it finished; run it again".into(),
            )),
        }
    }

    /// Sends `msg` to the actor (answering which), or has it wait in the
    /// entry, waking a dormant sandbox.
    fn send(&self, scope: Scope<'_>, id: Uuid, msg: SandboxMsg) -> Result<Option<ActorRef<SandboxMsg>>> {
        {
            // Most calls find an actor, under the shared lock.
            let registry = self.registry.read().expect("registry lock");
            match registry.get(&id) {
                Some(e) if scope.admits(&e.owner) => {
                    if let Slot::Actor(actor) = &e.slot {
                        return cast(actor, id, msg);
                    }
                }
                _ => return Err(SandboxError::NotFound(id)),
            }
        }
        let mut registry = self.registry.write().expect("registry lock");
        let entry = match registry.get_mut(&id) {
            Some(e) if scope.admits(&e.owner) => e,
            _ => return Err(SandboxError::NotFound(id)),
        };
        match &mut entry.slot {
            Slot::Actor(actor) => cast(actor, id, msg),
            Slot::Resting(_, waiting) | Slot::Waking(waiting) => {
                if waiting.len() >= self.most_waiting {
                    return Err(SandboxError::Quota(format!(
                        "sandbox {id} already has {} calls waiting; wait for them to finish before sending more",
                        self.most_waiting
                    )));
                }
                waiting.push(msg);
                Ok(None)
            }
            Slot::Dormant(_) => {
                let Slot::Dormant(rested) = std::mem::replace(&mut entry.slot, Slot::Waking(vec![msg])) else {
                    unreachable!("matched above")
                };
                match self.supervisor.cast(SupervisorMsg::Rouse { id, rested }) {
                    Ok(()) => Ok(None),
                    Err(ractor::MessagingErr::SendErr(SupervisorMsg::Rouse { rested, .. })) => {
                        entry.slot = Slot::Dormant(rested);
                        Err(SandboxError::Internal("the server is stopping; call again".into()))
                    }
                    Err(_) => unreachable!("a send gives back its message"),
                }
            }
        }
    }

    /// The sandboxes `scope` reaches, waking nothing: those with an actor
    /// (or whose entry changes), and the dormant ones with when each was
    /// last used.
    pub(super) fn split(&self, scope: Scope<'_>) -> (Vec<Uuid>, HashMap<Uuid, OffsetDateTime>) {
        let (mut awake, mut dormant) = (Vec::new(), HashMap::new());
        for (id, e) in self.registry.read().expect("registry lock").iter() {
            match &e.slot {
                _ if !scope.admits(&e.owner) => {}
                Slot::Dormant(rested) => {
                    dormant.insert(*id, rested.last_used());
                }
                _ => awake.push(*id),
            }
        }
        (awake, dormant)
    }

    /// Whether `scope` reaches sandbox `id`, waking nothing.
    pub(super) fn check(&self, scope: Scope<'_>, id: Uuid) -> Result<()> {
        self.seen(scope, id).map(|_| ())
    }

    /// How sandbox `id` is held, if `scope` reaches it; one whose entry
    /// changes counts as having an actor (a question to it waits).
    pub(super) fn seen(&self, scope: Scope<'_>, id: Uuid) -> Result<Seen> {
        let registry = self.registry.read().expect("registry lock");
        match registry.get(&id) {
            Some(e) if scope.admits(&e.owner) => Ok(match &e.slot {
                Slot::Dormant(rested) => Seen::Dormant(rested.last_used()),
                _ => Seen::Actor,
            }),
            _ => Err(SandboxError::NotFound(id)),
        }
    }
}

fn cast(actor: &ActorRef<SandboxMsg>, id: Uuid, msg: SandboxMsg) -> Result<Option<ActorRef<SandboxMsg>>> {
    match actor.cast(msg) {
        Ok(()) => Ok(Some(actor.clone())),
        // Stopped: deleted meanwhile, or failed and about to be restarted.
        Err(_) => Err(SandboxError::NotFound(id)),
    }
}

/// What a call to an actor came to (see [`Reach::ask`]).
pub(super) fn answer<T>(
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
