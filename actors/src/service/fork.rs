//! Forks: new sandboxes of the same tenant that start from a copy of a
//! live sandbox (or of one of its snapshots): its files, its packages and,
//! carried by serialisation, its Python namespace.
//!
//! The source's actor writes what the forks carry (its agent serialises
//! the namespace, the host copies the folders: [`crate::snapshots`]), in
//! turn with its other calls; the new sandboxes are then created as any
//! other (quota, pool, the source's egress policy, never a wider one) and
//! each actor seeds its sandbox from the copy, in turn with its calls.
//! A fork is all or nothing: one that fails midway, or whose caller hung
//! up, removes the sandboxes it made.

use std::sync::Arc;

use futures_util::future::join_all;
use ractor::ActorRef;
use tracing::info;
use uuid::Uuid;

use super::{answer, unexpected, CreateOptions, Creation, Quota, Sandboxes};
use crate::error::{Result, SandboxError};
use crate::host;
use crate::messages::SandboxMsg;
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
    /// Makes `count` new sandboxes from sandbox `id` as it is now, or from
    /// its snapshot `from`, for the sandbox's owner within `quota`.
    pub async fn fork<'a>(
        &self,
        scope: impl Into<Scope<'a>>,
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
        let scope = scope.into();
        let source = self.actor(scope, id)?;
        let SandboxInfo { owner, name, .. } = self.query(scope, id, SandboxMsg::Info).await?;
        host::check_free_disk(&self.ctx.settings)?;
        let reservations = (0..count)
            .map(|_| self.reserve(&owner, quota))
            .collect::<Result<Vec<_>>>()
            .map_err(|e| match e {
                SandboxError::Quota(why) => SandboxError::Quota(format!(
                    "{why} (a fork of {count} needs room for {count} new sandboxes)"
                )),
                other => other,
            })?;
        let fork = Uuid::new_v4();
        let op = SnapshotOp::Export { fork, from };
        let (export, notice) = match answer(
            &source,
            id,
            source.call(|reply| SandboxMsg::Snapshot { op, reply }, None).await,
        )?? {
            (SnapshotDone::Exported(export), notice) => (Arc::new(export), notice),
            (other, _) => return Err(unexpected(other)),
        };
        // The forks get the source's egress policy: nothing the source
        // wrote runs with more network than the source has.
        let egress = self.ctx.egress.policy(id);
        let creations: Vec<Creation> = (1..=count)
            .map(|i| {
                let name = format!("{} fork {i}", name.chars().take(MAX_NAME - 10).collect::<String>());
                self.creation(&owner, name, egress, options.lifetime)
            })
            .collect();
        let (files, packages) = (export.files, export.packages);
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let _reservations = reservations;
            let made = make(&creations, export).await;
            if let Err(Ok(forks)) = tx.send(made) {
                info!(%fork, "the caller of a fork went away; removing the sandboxes it made");
                for (f, actor) in forks {
                    creations[0].abandon(f.info.sandbox_id, actor).await;
                }
            }
        });
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
/// fails, removes those made and answers the first error.
async fn make(creations: &[Creation], export: Arc<Export>) -> Result<Vec<(Fork, ActorRef<SandboxMsg>)>> {
    let made = join_all(creations.iter().map(|c| {
        let export = export.clone();
        async move {
            let (info, actor) = c.run(std::future::pending()).await?;
            let python = seed(&actor, info.sandbox_id, export).await;
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
            for (fork, actor) in forks {
                creations[0].abandon(fork.info.sandbox_id, actor).await;
            }
            Err(e)
        }
    }
}

/// Has a fork's actor make its sandbox hold what `export` carries.
async fn seed(actor: &ActorRef<SandboxMsg>, id: Uuid, export: Arc<Export>) -> Result<Carried> {
    let op = SnapshotOp::Seed { export };
    match answer(
        actor,
        id,
        actor.call(|reply| SandboxMsg::Snapshot { op, reply }, None).await,
    )?? {
        (SnapshotDone::Seeded(python), _) => Ok(python),
        (other, _) => Err(unexpected(other)),
    }
}
