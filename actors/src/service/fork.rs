//! Forks: new sandboxes of the same tenant that start from a copy of a
//! live sandbox (or of one of its snapshots): its files, its packages and,
//! carried by serialisation, its Python namespace.
//!
//! The source's actor writes what the forks carry (its agent serialises
//! the namespace, the host copies the folders: [`crate::snapshots`]), in
//! turn with its other calls; the new sandboxes are then created as any
//! other (quota, pool) under the source's egress policy, and each actor
//! seeds its sandbox from the copy, in turn with its calls. A fork is all
//! or nothing: one that fails midway, or whose caller hung up, removes the
//! sandboxes it made, and so does the next start of a server that stopped
//! midway (their records are marked until they are seeded).

use std::sync::Arc;

use futures_util::future::join_all;
use ractor::ActorRef;
use tokio_util::sync::CancellationToken;
use tracing::{info, Instrument};
use uuid::Uuid;

use super::{answer, unexpected, CreateOptions, Creation, Quota, Sandboxes};
use crate::error::{Result, SandboxError};
use crate::host;
use crate::messages::{Queued, SandboxMsg};
use crate::results::SandboxInfo;
use crate::scope::Scope;
use crate::snapshots::{Carried, Export, SnapshotDone, SnapshotOp};

/// The most sandboxes one fork makes.
pub const MAX_FORKS: usize = 16;
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
        let source = self.actor(scope, id)?;
        let SandboxInfo { name, .. } = self.query(scope, id, SandboxMsg::Info).await?;
        let egress = self.ctx.egress.attached_policy(id).ok_or(SandboxError::NotFound(id))?;
        let allowed = options.egress.unwrap_or(self.ctx.egress.default_policy());
        if egress != allowed {
            return Err(SandboxError::InvalidArgument(format!(
                "this sandbox runs under the network policy {:?}, and your sandboxes now get {:?}: \
                 a fork would run its code under another policy. Create a new sandbox instead.",
                egress.name(),
                allowed.name()
            )));
        }
        host::check_free_disk(&self.ctx.settings)?;
        let reservation = self.reserve(owner, quota, count)?;
        let fork = Uuid::new_v4();
        let op = SnapshotOp::Export { fork, from };
        let (export, notice) = match answer(
            &source,
            id,
            source
                .call(
                    |reply| SandboxMsg::Queued(Queued::Snapshot { op, reply }).traced(),
                    None,
                )
                .await,
        )?? {
            (SnapshotDone::Exported(export), notice) => (Arc::new(export), notice),
            (other, _) => return Err(unexpected(other)),
        };
        let creations: Vec<Creation> = (1..=count)
            .map(|i| {
                let name = format!("{} fork {i}", name.chars().take(MAX_NAME - 10).collect::<String>());
                Creation {
                    seeding: Some(fork),
                    ..self.creation(owner, name, egress, options.lifetime)
                }
            })
            .collect();
        let (files, packages) = (export.files, export.packages);
        // Cancelled when this call is dropped (the caller hung up): claims
        // still waiting for the pool give up, and no fork is seeded.
        let gone = CancellationToken::new();
        let _hung_up = gone.clone().drop_guard();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let store = self.ctx.store.clone();
        tokio::spawn(
            async move {
                let _reservation = reservation;
                let made = match make(&creations, export, &gone).await {
                    Ok(forks) => {
                        let ids = forks.iter().map(|(f, _)| f.info.sandbox_id).collect();
                        match store.mark_seeded(ids).await {
                            Ok(()) => Ok(forks),
                            Err(e) => {
                                abandon(&creations, forks).await;
                                Err(e)
                            }
                        }
                    }
                    Err(e) => Err(e),
                };
                if let Err(Ok(forks)) = tx.send(made) {
                    info!(%fork, "the caller of a fork went away; removing the sandboxes it made");
                    abandon(&creations, forks).await;
                }
            }
            .in_current_span(),
        );
        let forks = rx
            .await
            .map_err(|_| SandboxError::Internal("the fork ended inside the server; try again".into()))??;
        info!(sandbox = %id, %fork, count, "forked");
        Ok(Forked {
            forks: forks.into_iter().map(|(f, _)| f).collect(),
            files,
            packages,
            notice,
        })
    }
}

/// Creates the forks and seeds each from `export`, all at once; if any
/// fails, or `gone` is cancelled, removes those made and answers the first error.
async fn make(
    creations: &[Creation],
    export: Arc<Export>,
    gone: &CancellationToken,
) -> Result<Vec<(Fork, ActorRef<SandboxMsg>)>> {
    let made = join_all(creations.iter().map(|c| {
        let export = export.clone();
        async move {
            let (info, actor) = c.run(gone.cancelled()).await?;
            let python = match gone.is_cancelled() {
                true => Err(SandboxError::Internal(
                    "the caller went away before its fork was ready".into(),
                )),
                false => seed(&actor, info.sandbox_id, export).await,
            };
            Ok::<_, SandboxError>((info, actor, python))
        }
    }))
    .await;
    let mut forks = Vec::with_capacity(made.len());
    let mut failed = None;
    for m in made {
        match m {
            Ok((info, actor, Ok(python))) => forks.push((Fork { info, python }, actor)),
            Ok((info, actor, Err(e))) => {
                creations[0].abandon(info.sandbox_id, actor).await;
                failed.get_or_insert(e);
            }
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    match failed {
        None => Ok(forks),
        Some(e) => {
            abandon(creations, forks).await;
            Err(e)
        }
    }
}

async fn abandon(creations: &[Creation], forks: Vec<(Fork, ActorRef<SandboxMsg>)>) {
    for (fork, actor) in forks {
        creations[0].abandon(fork.info.sandbox_id, actor).await;
    }
}

/// Has a fork's actor make its sandbox hold what `export` carries.
async fn seed(actor: &ActorRef<SandboxMsg>, id: Uuid, export: Arc<Export>) -> Result<Carried> {
    let op = SnapshotOp::Seed { export };
    match answer(
        actor,
        id,
        actor
            .call(
                |reply| SandboxMsg::Queued(Queued::Snapshot { op, reply }).traced(),
                None,
            )
            .await,
    )?? {
        (SnapshotDone::Seeded(python), _) => Ok(python),
        (other, _) => Err(unexpected(other)),
    }
}
