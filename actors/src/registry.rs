//! The registry: every sandbox this server holds, by id, with its owner,
//! whether it sleeps, and how it is reached.
//!
//! An awake sandbox has an actor. So has a sleeping one lately called; one
//! left alone asleep is **dormant**: its actor stopped to give back its
//! memory (the task, the mailboxes and its state come to most of what a
//! sandbox costs the server), and what the actor kept only in memory
//! ([`Rested`]) waits here. Its next call starts an actor again from its
//! record, as a restarted server adopts one.
//!
//! An entry between the two ([`Slot::Resting`], [`Slot::Waking`]) is being
//! changed by the supervisor: messages for it wait in the entry, in the
//! order they came, and go to the actor that comes out of the change before
//! any later one. Calls reach an actor under the registry's lock, and the
//! supervisor asks an actor to rest under the write lock, so every call sent
//! before that question is ahead of it in the actor's mailbox: an actor
//! rests only when no call waits for it. (The usage sampler's reads go
//! without the lock: one that meets a rested actor is a reading skipped.)
//!
//! Written by the supervisor (and by creations and deletions), read by the
//! front end.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};

use ractor::ActorRef;
use uuid::Uuid;

use crate::messages::SandboxMsg;
use crate::sandbox::Rested;

pub struct Registered {
    pub owner: String,
    /// Hibernated: turned by its actor (see [`crate::census`]).
    pub asleep: Arc<AtomicBool>,
    pub slot: Slot,
}

/// How a sandbox is reached.
pub enum Slot {
    Actor(ActorRef<SandboxMsg>),
    /// Asked whether it rests, with the messages that came since.
    Resting(ActorRef<SandboxMsg>, Vec<SandboxMsg>),
    /// Its actor is being started again, with the messages that came since
    /// (the first one woke it).
    Waking(Vec<SandboxMsg>),
    Dormant(Box<Rested>),
}

impl Registered {
    /// Its actor, when it has one that takes messages now.
    pub fn actor(&self) -> Option<&ActorRef<SandboxMsg>> {
        match &self.slot {
            Slot::Actor(actor) => Some(actor),
            _ => None,
        }
    }
}

/// Sandbox id → how it is reached.
pub type Registry = Arc<RwLock<HashMap<Uuid, Registered>>>;
