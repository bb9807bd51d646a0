//! Forks: new sandboxes of the same tenant that start from a copy of a
//! live sandbox (or of one of its snapshots): its files, its packages and,
//! carried by serialisation, its Python namespace.
//!
//! The new sandboxes are created first, as any other (quota, pool) under
//! the source's egress policy. The source's actor then, in turn with its
//! other calls, has its agent serialise the namespace and clones its
//! folders straight into the new sandboxes' ([`crate::snapshots`]); each new
//! actor then loads the namespace, in turn with its calls. A fork is all or
//! nothing: one that fails midway, or whose caller hung up, removes the
//! sandboxes it made, and so does the next start of a server that stopped
//! midway (their records are marked until they are seeded).

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use ractor::rpc::CallResult;
use ractor::{ActorRef, MessagingErr};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, Instrument};
use uuid::Uuid;

use super::{answer, unexpected, CreateOptions, Creation, Quota, Reach, Sandboxes};
use crate::context::Context;
use crate::error::{Result, SandboxError};
use crate::messages::{Queued, SandboxMsg};
use crate::pool::Recipe;
use crate::resources;
use crate::results::SandboxInfo;
use crate::scope::Scope;
use crate::snapshots::{Carried, Export, ExportHold, SnapshotDone, SnapshotOp};
use sandbox_runtime::template::Template;

/// The most sandboxes one fork makes.
pub const MAX_FORKS: usize = 16;
/// The longest a fork waits for its source to take it up and copy itself:
/// within the new sandboxes' own wait for the copy.
const EXPORT_WAIT: Duration = Duration::from_secs(15 * 60);
/// How many new sandboxes load the namespace at once.
const LOADS_AT_ONCE: usize = 4;
/// The longest name a fork is given, in characters (as any sandbox's).
const MAX_NAME: usize = 100;

/// One new sandbox of a fork, and how much of the namespace it holds.
#[derive(Debug)]
pub struct Fork {
    pub info: SandboxInfo,
    pub python: Carried,
}

/// What a fork made.
#[derive(Debug)]
pub struct Forked {
    pub forks: Vec<Fork>,
    /// Files, folders and links each fork received, and whether packages
    /// were among them.
    pub files: u64,
    pub packages: bool,
    /// Told by the source's actor (its container had to be brought back, say).
    pub notice: Option<String>,
}

/// The names of `count` forks of a sandbox named `name`: its base (a
/// fork's name without its ` fork N`, so forks of forks do not grow names)
/// and numbers past the highest its owner's sandboxes (`taken`) use, so no
/// two are named alike.
fn fork_names<'a>(name: &str, taken: impl Iterator<Item = &'a str>, count: usize) -> Vec<String> {
    let base = fork_number(name).map_or(name, |(base, _)| base);
    let base: String = base.chars().take(MAX_NAME - 10).collect();
    let highest = taken
        .filter_map(fork_number)
        .filter(|(b, _)| *b == base)
        .map(|(_, n)| n)
        .max()
        .unwrap_or(0);
    (1..=count)
        .map(|i| format!("{base} fork {}", highest + i as u64))
        .collect()
}

/// `("a", 3)` for `"a fork 3"`.
fn fork_number(name: &str) -> Option<(&str, u64)> {
    let (base, n) = name.rsplit_once(" fork ")?;
    Some((base, n.parse().ok()?))
}

impl Sandboxes {
    /// Makes `count` new sandboxes for `owner` from its sandbox `id` as it
    /// is now, or from its snapshot `from`, within `quota`. `options` are
    /// those a creation by the caller would have: a fork runs under the
    /// source's egress policy, and is refused if that is not the caller's.
    pub async fn fork(
        &self,
        owner: &str,
        id: Uuid,
        count: usize,
        from: Option<Uuid>,
        quota: Quota,
        options: CreateOptions,
    ) -> Result<Forked> {
        if !(1..=MAX_FORKS).contains(&count) {
            return Err(SandboxError::InvalidArgument(format!(
                "count is {count}; a fork makes 1 to {MAX_FORKS} sandboxes"
            )));
        }
        // Only the owner's own sandboxes (an administrator's too): the
        // forks count against the caller's quota and live by its lifetime.
        let scope = Scope::from(owner);
        let SandboxInfo { name, egress, .. } = self.info(scope, id).await?;
        // A sleeping sandbox's proxy is detached: its record says.
        let egress = self
            .ctx
            .egress
            .attached_policy(id)
            .or(egress)
            .unwrap_or(self.ctx.egress.default_policy());
        // The forks are of the source's template, without its files: they
        // carry the source's own.
        let recipe = Recipe {
            template: self.ctx.templates.of(id),
            files: None,
        };
        let template_network = recipe.template.as_ref().and_then(|t| t.network);
        let allowed = Template::egress(template_network, options.egress).unwrap_or(self.ctx.egress.default_policy());
        if egress != allowed {
            return Err(SandboxError::InvalidArgument(format!(
                "this sandbox runs under the network policy {:?}, and your sandboxes now get {:?}: \
                 a fork would run its code under another policy. Create a new sandbox instead.",
                egress.name(),
                allowed.name()
            )));
        }
        resources::check_free_disk(&self.ctx.settings)?;
        let reservation = self.reserve(owner, quota, count)?;
        let fork = Uuid::new_v4();
        let records = self.ctx.store.all().await?;
        let taken = records.iter().filter(|r| r.owner == owner).map(|r| r.name.as_str());
        let creations: Vec<Creation> = fork_names(&name, taken, count)
            .into_iter()
            .map(|name| Creation {
                seeding: Some(fork),
                ..self.creation(owner, name, egress, options.lifetime, recipe.clone())
            })
            .collect();
        // Cancelled when this call is dropped (the caller hung up): claims
        // still waiting for the pool give up, and no fork is seeded.
        let gone = CancellationToken::new();
        let _hung_up = gone.clone().drop_guard();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (ctx, reach) = (self.ctx.clone(), self.reach.clone());
        let under_way = UnderWay::begin(ctx.clone(), fork);
        tokio::spawn(
            async move {
                let _reservation = reservation;
                let _under_way = under_way;
                let made = match make(&creations, &gone).await {
                    Ok(made) => made,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                let source = Source { reach, id, fork, from };
                match source.carry(&ctx, &made, &gone).await {
                    Ok(forked) => {
                        if tx.send(Ok(forked)).is_err() {
                            info!(%fork, "the caller of a fork went away; removing the sandboxes it made");
                            abandon(&creations, made).await;
                        }
                    }
                    Err(e) => {
                        abandon(&creations, made).await;
                        let _ = tx.send(Err(e));
                    }
                }
            }
            .in_current_span(),
        );
        let forked = rx
            .await
            .map_err(|_| SandboxError::Internal("the fork ended inside the server; try again".into()))??;
        info!(sandbox = %id, %fork, count, "forked");
        Ok(forked)
    }
}

/// Marks a fork as under way in the context until dropped (when the fork's
/// work, its undo included, has ended).
struct UnderWay {
    ctx: Arc<Context>,
    fork: Uuid,
}

impl UnderWay {
    fn begin(ctx: Arc<Context>, fork: Uuid) -> Self {
        ctx.forks.lock().expect("forks lock").insert(fork);
        Self { ctx, fork }
    }
}

impl Drop for UnderWay {
    fn drop(&mut self) {
        self.ctx.forks.lock().expect("forks lock").remove(&self.fork);
    }
}

/// Creates the forks, all at once; if any fails, or `gone` is cancelled,
/// removes those made and answers the first error.
async fn make(creations: &[Creation], gone: &CancellationToken) -> Result<Vec<Made>> {
    let made = join_all(creations.iter().map(|c| c.run(gone.cancelled()))).await;
    let mut forks = Vec::with_capacity(made.len());
    let mut failed = None;
    for m in made {
        match m {
            Ok(made) => forks.push(made),
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    if gone.is_cancelled() {
        failed.get_or_insert(caller_gone());
    }
    match failed {
        None => Ok(forks),
        Some(e) => {
            abandon(creations, forks).await;
            Err(e)
        }
    }
}

/// A new sandbox of a fork, and its actor.
type Made = (SandboxInfo, ActorRef<SandboxMsg>);

/// What a fork is made from: a sandbox reached by its id, as it may sleep
/// (and its actor rest) while the new sandboxes are made.
struct Source {
    reach: Reach,
    id: Uuid,
    fork: Uuid,
    from: Option<Uuid>,
}

impl Source {
    /// Has each new sandbox of `made` wait in its queue for the source,
    /// the source's actor give them its folders and namespace, then each
    /// new actor load the namespace; marks them seeded.
    async fn carry(self, ctx: &Context, made: &[Made], gone: &CancellationToken) -> Result<Forked> {
        let Source { reach, id, fork, from } = self;
        // Queued first: each new sandbox's queue waits for the copy (and
        // refuses the caller's calls until it is seeded).
        let mut releases = Vec::with_capacity(made.len());
        let mut seeds = Vec::with_capacity(made.len());
        for (info, actor) in made {
            let (release, export) = watch::channel(None);
            seeds.push(seed(actor, info.sandbox_id, fork, id, export)?);
            releases.push(release);
        }
        let into = made.iter().map(|(info, _)| ctx.paths(info.sandbox_id)).collect();
        let hold = ExportHold::child_of(gone);
        let op = SnapshotOp::Export {
            fork,
            from,
            into,
            hold: hold.clone(),
        };
        let exported_by_source = reach.ask(Scope::Everyone, id, None, |reply| {
            SandboxMsg::Queued(Queued::Snapshot { op, reply })
        });
        // Given up when the caller hangs up or the source's queue holds the
        // copy too long; the new sandboxes are removed once nothing of the
        // copy runs.
        let called = tokio::select! {
            called = exported_by_source => called,
            () = gone.cancelled() => {
                hold.give_up().await;
                return Err(caller_gone());
            }
            () = tokio::time::sleep(EXPORT_WAIT) => {
                hold.give_up().await;
                return Err(SandboxError::Quota(format!(
                    "sandbox {id} was busy for {} minutes with calls queued before the fork; nothing was forked. \
                     Fork it when its queue is shorter.",
                    EXPORT_WAIT.as_secs() / 60
                )));
            }
        };
        let (export, notice) = match called?? {
            (SnapshotDone::Exported(export), notice) => (Arc::new(export), notice),
            (other, _) => return Err(unexpected(other)),
        };
        if gone.is_cancelled() {
            return Err(caller_gone());
        }
        let (files, packages) = (export.files, export.packages);
        // A few loads at once: each writes the namespace into its sandbox's
        // disk, and many at once leave the host's kernel writing them back
        // while the loads wait.
        let mut pythons: Vec<Option<Carried>> = vec![None; made.len()];
        let mut waiting = seeds.into_iter().zip(&releases).enumerate();
        let mut loading = FuturesUnordered::new();
        loop {
            while loading.len() < LOADS_AT_ONCE {
                let Some((i, (seeded, release))) = waiting.next() else {
                    break;
                };
                release.send_replace(Some(export.clone()));
                loading.push(async move { (i, seeded.await) });
            }
            let Some((i, python)) = loading.next().await else { break };
            pythons[i] = Some(python?);
        }
        let forks = made
            .iter()
            .zip(pythons)
            .map(|((info, _), python)| Fork {
                info: info.clone(),
                python: python.expect("every fork loaded"),
            })
            .collect();
        ctx.store
            .mark_seeded(made.iter().map(|(info, _)| info.sandbox_id).collect())
            .await?;
        Ok(Forked {
            forks,
            files,
            packages,
            notice,
        })
    }
}

/// Why a fork whose caller hung up ends (nobody reads it but the logs).
fn caller_gone() -> SandboxError {
    SandboxError::Internal("the caller went away before its fork was ready".into())
}

async fn abandon(creations: &[Creation], forks: Vec<Made>) {
    for (info, actor) in forks {
        creations[0].abandon(info.sandbox_id, actor).await;
    }
}

/// Queues on a fork's actor the loading of the namespace `export` will
/// carry (its job waits for it, holding the queue); answers when it is done.
fn seed(
    actor: &ActorRef<SandboxMsg>,
    id: Uuid,
    fork: Uuid,
    source: Uuid,
    export: watch::Receiver<Option<Arc<Export>>>,
) -> Result<impl std::future::Future<Output = Result<Carried>>> {
    let (reply, answered) = ractor::concurrency::oneshot();
    let op = SnapshotOp::Seed { fork, source, export };
    actor
        .send_message(
            SandboxMsg::Queued(Queued::Snapshot {
                op,
                reply: reply.into(),
            })
            .traced(),
        )
        .map_err(|_| SandboxError::NotFound(id))?;
    let actor = actor.clone();
    Ok(async move {
        let answered = answered
            .await
            .map(CallResult::Success)
            .map_err(|_| MessagingErr::ChannelClosed);
        match answer(&actor, id, answered)?? {
            (SnapshotDone::Seeded(python), _) => Ok(python),
            (other, _) => Err(unexpected(other)),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forks_are_numbered_past_the_names_taken() {
        assert_eq!(fork_names("a", [].into_iter(), 2), ["a fork 1", "a fork 2"]);
        let taken = ["a", "a fork 1", "a fork 2", "b fork 9", "a fork x"];
        assert_eq!(fork_names("a", taken.into_iter(), 1), ["a fork 3"]);
        assert_eq!(fork_names("a fork 1", taken.into_iter(), 2), ["a fork 3", "a fork 4"]);
        let long = "é".repeat(200);
        assert!(fork_names(&long, [].into_iter(), 1)[0].chars().count() <= MAX_NAME);
    }
}
