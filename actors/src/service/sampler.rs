//! Reads every registered sandbox's counters every `usage.sample_seconds`
//! (see [`crate::usage::reading`] for what a reading counts), and writes
//! what accrued. It walks the supervisor's registry, so it stands above the
//! supervisor, beside the service that starts and stops it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use ractor::rpc::CallResult;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::warn;
use uuid::Uuid;

use crate::context::Context;
use crate::messages::SandboxMsg;
use crate::registry::{Registry, Slot};
use crate::usage::reading::{Subject, READING_DEADLINE};

use super::describe_dormant;

/// The running sampler; stopping it writes what accrued.
pub(crate) struct Sampler {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Sampler {
    pub(crate) fn start(ctx: Arc<Context>, registry: Registry) -> Self {
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(ctx, registry, stop.clone()));
        Self { stop, task }
    }

    pub(crate) async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

async fn run(ctx: Arc<Context>, registry: Registry, stop: CancellationToken) {
    let period = Duration::from_secs(ctx.settings.usage.sample_seconds);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = stop.cancelled() => break,
        }
        sample(&ctx, &registry).await;
        if let Err(e) = ctx.meter.flush().await {
            warn!(error = %e, "could not write the usage figures; kept for the next try");
        }
    }
    if let Err(e) = ctx.meter.flush().await {
        warn!(error = %e, "could not write the last usage figures");
    }
}

/// One reading of every registered sandbox: an actor's answers for its
/// sandbox; a dormant one is read from its record (its snapshots are billed
/// as counted when it went to sleep; its results and packages disks are not
/// mounted to be measured, see docs/hibernation.md).
async fn sample(ctx: &Context, registry: &Registry) {
    let (held, actors, dormant) = {
        let registry = registry.read().expect("registry lock");
        let held: HashSet<Uuid> = registry.keys().copied().collect();
        let mut actors = Vec::new();
        let mut dormant = HashMap::new();
        for (id, entry) in registry.iter() {
            match &entry.slot {
                Slot::Dormant(rested) => {
                    dormant.insert(*id, rested.last_used());
                }
                _ => actors.extend(entry.actor().cloned()),
            }
        }
        (held, actors, dormant)
    };
    ctx.meter
        .readings
        .lock()
        .expect("readings lock")
        .retain(|id, _| held.contains(id));
    let readings = actors.into_iter().map(|actor| async move {
        if let Ok(CallResult::Success(info)) = actor.call(SandboxMsg::Info, Some(READING_DEADLINE)).await {
            ctx.read_usage(Subject::from(&info), false).await;
        }
    });
    futures_util::future::join_all(readings).await;
    match describe_dormant(ctx, dormant).await {
        Ok(infos) => {
            for info in &infos {
                ctx.read_usage(Subject::from(info), false).await;
            }
        }
        Err(e) => warn!(error = %e, "could not read the records of sleeping sandboxes for their usage"),
    }
}
