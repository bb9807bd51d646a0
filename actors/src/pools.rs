//! The warm pools: one of the sandbox image's sandboxes (`[pool]`), and one
//! per built template, each adapting to its own claims ([`Pool`]) within
//! `pool.max` ready sandboxes over all of them, and all within the room
//! the live sandboxes leave under the server's cap.

use std::sync::{Arc, OnceLock, Weak};

use crate::config::{EgressPolicy, PoolConfig, PoolMin};
use crate::context::Context;
use crate::pool::{Pool, PoolStats, Recipe, Room};

/// The free places under the server's cap, shared by every pool.
pub type SharedRoom = Arc<dyn Fn() -> usize + Send + Sync>;

pub struct Pools {
    /// The sandbox image's first, then the templates' by name.
    all: Vec<Arc<Pool>>,
}

impl Pools {
    /// Pools that never fill (before the records are reconciled).
    pub fn off(ctx: Arc<Context>) -> Self {
        Self {
            all: vec![Pool::off(ctx)],
        }
    }

    /// Starts the sandbox image's pool under `config` and one for each
    /// built template, which keeps its `pool_min` always and grows with
    /// its claims up to `config.max`; the ready sandboxes of all of them
    /// stay within `config.max` (or the pools' `min`s added up, when more).
    pub fn start(ctx: Arc<Context>, config: &PoolConfig, room: SharedRoom) -> Self {
        let others: Arc<OnceLock<Vec<Weak<Pool>>>> = Arc::default();
        let mins = config.min.resolve(sandbox_host::figures::memory_bytes())
            + ctx.templates.built().map(|o| o.config.pool_min).sum::<usize>();
        let most = config.max.max(mins);
        let room_of = |index: usize| -> Room {
            let (room, others) = (room.clone(), others.clone());
            Box::new(move || {
                let taken: usize = others
                    .get()
                    .into_iter()
                    .flatten()
                    .enumerate()
                    .filter(|(i, _)| *i != index)
                    .filter_map(|(_, p)| p.upgrade())
                    .map(|p| p.ready())
                    .sum();
                // The others' ready sandboxes take places under both bounds.
                room().saturating_sub(taken).min(most.saturating_sub(taken))
            })
        };
        let default = ctx.egress.default_policy();
        let mut all = vec![Pool::start(ctx.clone(), config, room_of(0), Recipe::default(), default)];
        for offered in ctx.templates.built() {
            let own = PoolConfig {
                min: PoolMin::Fixed(offered.config.pool_min),
                ..config.clone()
            };
            let egress = offered.config.network.unwrap_or(default);
            let recipe = Recipe::of(offered);
            all.push(Pool::start(ctx.clone(), &own, room_of(all.len()), recipe, egress));
        }
        let _ = others.set(all.iter().map(Arc::downgrade).collect());
        Self { all }
    }

    /// The pool whose sandboxes a creation by `recipe` under `egress` may
    /// claim, if one does.
    pub fn serving(&self, recipe: &Recipe, egress: EgressPolicy) -> Option<Arc<Pool>> {
        self.all.iter().find(|p| p.serves(recipe, egress)).cloned()
    }

    /// Sandboxes ready to be claimed, in all pools.
    pub fn ready(&self) -> usize {
        self.all.iter().map(|p| p.ready()).sum()
    }

    /// The memory all ready sandboxes may take, in MB (see
    /// [`Pool::ready_memory_mb`]).
    pub fn ready_memory_mb(&self, default: u64) -> u64 {
        self.all.iter().map(|p| p.ready_memory_mb(default)).sum()
    }

    /// The figures of all pools together.
    pub fn stats(&self) -> PoolStats {
        self.all
            .iter()
            .map(|p| p.stats())
            .fold(PoolStats::default(), |a, b| PoolStats {
                ready: a.ready + b.ready,
                target: a.target + b.target,
                claims: a.claims + b.claims,
                misses: a.misses + b.misses,
                refills: a.refills + b.refills,
                refill_seconds: a.refill_seconds + b.refill_seconds,
            })
    }

    /// How many pools hold the context.
    pub fn count(&self) -> usize {
        self.all.len()
    }

    /// Stops refilling and removes the sandboxes nobody claimed.
    pub async fn drain(&self) {
        futures_util::future::join_all(self.all.iter().map(|p| p.drain())).await;
    }
}
