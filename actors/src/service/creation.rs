//! Creating sandboxes: the quota check that holds places for creations
//! under way, and the work of one creation, which runs in a task of its own.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::ActorRef;
use tracing::{info, warn, Instrument};
use uuid::Uuid;

use crate::config::EgressPolicy;
use crate::context::Context;
use crate::error::{Result, SandboxError};
use crate::messages::SandboxMsg;
use crate::moment;
use crate::pool::{self, Pool, Recipe};
use crate::records::SandboxRecord;
use crate::registry::Registry;
use crate::resources;
use crate::results::SandboxInfo;
use crate::sandbox::{remove_everything, Started};
use crate::supervisor::SupervisorMsg;

use super::{answer, spawn_actor, Sandboxes, QUERY_DEADLINE};

/// How many sandboxes one owner, and the server in total, may hold.
#[derive(Debug, Clone, Copy)]
pub struct Quota {
    pub per_owner: usize,
    pub total: usize,
}

/// Choices made when a sandbox is created, beyond the server's settings.
#[derive(Debug, Clone, Default)]
pub struct CreateOptions {
    /// The sandbox is deleted this long after creation, or earlier when
    /// `sandbox.max_lifetime_seconds` says so (a short-lived tenant's
    /// sandboxes end with it).
    pub lifetime: Option<Duration>,
    /// The egress policy (the caller's key may set one); `None`: the server's.
    pub egress: Option<EgressPolicy>,
    /// The template it starts from (`None`: the sandbox image).
    pub template: Option<String>,
}

impl Quota {
    pub const UNLIMITED: Quota = Quota {
        per_owner: usize::MAX,
        total: usize::MAX,
    };
}

pub(super) type Pending = Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>;

/// Places held for sandboxes being created.
pub(super) struct Reservation {
    pending: Pending,
    owner: String,
    places: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut pending = self.pending.lock().expect("pending lock");
        if let Some(n) = pending.get_mut(&self.owner) {
            *n -= self.places;
            if *n == 0 {
                pending.remove(&self.owner);
            }
        }
    }
}

impl Sandboxes {
    /// How many sandboxes `owner` has.
    pub(super) fn count(&self, owner: &str) -> usize {
        let registry = self.registry.read().expect("registry lock");
        registry.values().filter(|e| e.owner == owner).count()
    }

    /// Counts `owner`'s live sandboxes (and those being created) against
    /// `quota` and holds `places` more until the returned guard is dropped,
    /// so concurrent creations cannot exceed it. Hibernated sandboxes count
    /// against caps of their own (see [`crate::census`]).
    pub(super) fn reserve(&self, owner: &str, quota: Quota, places: usize) -> Result<Reservation> {
        let mut pending = self.pending.lock().expect("pending lock");
        let census = &self.ctx.census;
        let mine = census.count(Some(owner), false) + pending.get(owner).copied().unwrap_or(0);
        let total = census.count(None, false) + pending.values().sum::<usize>();
        if mine + places > quota.per_owner {
            return Err(SandboxError::TooMany {
                have: mine,
                most: quota.per_owner,
                asked: places,
            });
        }
        if total + places > quota.total {
            return Err(SandboxError::Quota(format!(
                "the server holds its maximum of {} sandboxes; try again later",
                quota.total
            )));
        }
        *pending.entry(owner.to_string()).or_default() += places;
        Ok(Reservation {
            pending: self.pending.clone(),
            owner: owner.to_string(),
            places,
        })
    }

    /// The work of creating a sandbox for `owner`, which lives `lifetime`
    /// (or less, when `sandbox.max_lifetime_seconds` says so).
    pub(super) fn creation(
        &self,
        owner: &str,
        name: String,
        egress: EgressPolicy,
        lifetime: Option<Duration>,
        recipe: Recipe,
    ) -> Creation {
        let configured = self.ctx.settings.sandbox.max_lifetime_seconds;
        let configured = (configured > 0).then(|| Duration::from_secs(configured));
        let lifetime = match (configured, lifetime) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Creation {
            ctx: self.ctx.clone(),
            pool: self.pools.serving(&recipe, egress),
            recipe,
            supervisor: self.supervisor.clone(),
            registry: self.registry.clone(),
            owner: owner.to_string(),
            name,
            egress,
            lifetime,
            seeding: None,
        }
    }

    /// Creates a sandbox for `owner`. The work runs in a task of its own: if
    /// the caller goes away before it ends, the new sandbox is removed, so
    /// nothing is left that nobody asked for.
    pub async fn create(
        &self,
        owner: &str,
        name: Option<String>,
        quota: Quota,
        options: CreateOptions,
    ) -> Result<SandboxInfo> {
        let name = match name.map(|n| n.trim().to_string()).filter(|n| !n.is_empty()) {
            Some(n) if n.chars().count() > 100 || n.chars().any(char::is_control) => {
                return Err(SandboxError::InvalidArgument(
                    "name: at most 100 characters, no control characters".into(),
                ))
            }
            Some(n) => n,
            // Counted in the registry: asking each of a tenant's actors for
            // its details would cost one message per sandbox per creation.
            None => format!("Sandbox {}", self.count(owner) + 1),
        };
        let (recipe, egress) = match &options.template {
            Some(t) => {
                let offered = self.ctx.templates.get(t)?;
                let egress = offered.egress(options.egress);
                let settings = &self.ctx.settings.sandbox;
                if offered
                    .config
                    .joins_the_bridge_under_gvisor(settings, egress.unwrap_or(settings.network))
                {
                    return Err(SandboxError::InvalidArgument(format!(
                        "template {t:?} runs under gVisor, which cannot join this server's network, and your \
                         sandboxes' network policy is open; ask the operator for another policy or template"
                    )));
                }
                (Recipe::of(&offered), egress)
            }
            None => (Recipe::default(), options.egress),
        };
        resources::check_free_disk(&self.ctx.settings)?;
        let reservation = self.reserve(owner, quota, 1)?;
        let egress = egress.unwrap_or(self.ctx.egress.default_policy());
        let creation = self.creation(owner, name, egress, options.lifetime, recipe);
        let (mut tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(
            async move {
                let _reservation = reservation;
                let created = creation.run(tx.closed()).await;
                if let Err(Ok((info, actor))) = tx.send(created) {
                    info!(sandbox = %info.sandbox_id, "the creator went away; removing the sandbox it asked for");
                    creation.abandon(info.sandbox_id, actor).await;
                }
            }
            .in_current_span(),
        );
        let (info, _) = rx
            .await
            .map_err(|_| SandboxError::Internal("the creation ended inside the server; try again".into()))??;
        Ok(info)
    }
}

/// The work of one creation, owned by its own task.
pub(super) struct Creation {
    pub(super) ctx: Arc<Context>,
    /// The pool that serves it, if one does.
    pub(super) pool: Option<Arc<Pool>>,
    /// What it is made from.
    pub(super) recipe: Recipe,
    pub(super) supervisor: ActorRef<SupervisorMsg>,
    pub(super) registry: Registry,
    pub(super) owner: String,
    pub(super) name: String,
    pub(super) egress: EgressPolicy,
    /// The sandbox is deleted this long after creation.
    pub(super) lifetime: Option<Duration>,
    /// The fork it is made for, which still has to seed it.
    pub(super) seeding: Option<Uuid>,
}

impl Creation {
    /// Claims a pooled sandbox or makes one, records it and starts its actor.
    /// A claim still waiting for the pool when `left` ends (the caller went
    /// away) gives up its place, so that the sandbox made for it stays in the
    /// pool for the next claim instead of being recorded and removed.
    pub(super) async fn run(
        &self,
        left: impl std::future::Future<Output = ()>,
    ) -> Result<(SandboxInfo, ActorRef<SandboxMsg>)> {
        // A pool serves only sandboxes of its recipe, and of its kind of
        // policy (bridged or proxied).
        let egress = self.egress;
        let pooled = match &self.pool {
            Some(pool) => tokio::select! {
                claimed = pool.claim() => claimed.transpose()?,
                () = left => return Err(SandboxError::Internal("the caller went away before its sandbox was ready".into())),
            },
            None => None,
        };
        let mut provisioned = match pooled {
            Some(p) if self.ctx.egress.claim(p.id, egress) => p,
            Some(mut p) => {
                // No first call of this one will come.
                drop(p.take_first_call());
                pool::discard(&self.ctx, &p).await;
                pool::provision(&self.ctx, egress, &self.recipe).await?
            }
            None => pool::provision(&self.ctx, egress, &self.recipe).await?,
        };
        let agent = provisioned.take_agent();
        let first_call = provisioned.take_first_call();
        let (id, created) = (provisioned.id, provisioned.container);
        let created_at = moment::now();
        let record = SandboxRecord {
            id,
            owner: self.owner.clone(),
            name: self.name.clone(),
            container_id: created.container_id,
            volume: created.volume,
            created_at,
            expires_at: self.lifetime.map(|l| created_at + l),
            installs: BTreeMap::new(),
            packages: vec![],
            deleting: false,
            egress: Some(egress),
            seeding: self.seeding,
            exposed_ports: Vec::new(),
            hibernated: None,
            template: self.recipe.template.as_deref().cloned(),
        };
        if let Err(e) = self.ctx.store.put(record.clone()).await {
            drop(first_call);
            let _ = remove_everything(&self.ctx, &record).await;
            return Err(e);
        }
        let actor = match spawn_actor(&self.supervisor, record.clone(), Some(Started { agent, first_call })).await {
            Ok(actor) => actor,
            Err(e) => {
                let _ = remove_everything(&self.ctx, &record).await;
                return Err(e);
            }
        };
        let info = answer(&actor, id, actor.call(SandboxMsg::Info, Some(QUERY_DEADLINE)).await)?;
        Ok((info, actor))
    }

    /// Deletes a sandbox whose creator is gone.
    pub(super) async fn abandon(&self, id: Uuid, actor: ActorRef<SandboxMsg>) {
        match actor
            .call(|reply| SandboxMsg::Delete { reply, by_owner: false }, None)
            .await
        {
            Ok(CallResult::Success(Ok(()))) => {
                self.registry.write().expect("registry lock").remove(&id);
            }
            other => {
                warn!(sandbox = %id, outcome = ?other.map(|r| matches!(r, CallResult::Success(_))), "could not remove an abandoned sandbox")
            }
        }
    }
}
