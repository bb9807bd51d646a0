//! The Docker engine's state for `/health`, from a check made at most once
//! a second whatever the number of probes, so that probes (and floods of
//! them) cost the engine nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbox_actors::{SandboxError, Sandboxes};

/// How long one engine check answers for.
const FRESH_FOR: Duration = Duration::from_secs(1);
/// An engine that does not answer within this is reported unavailable, so
/// that a probe is answered within a second even while the engine restarts.
const PING_DEADLINE: Duration = Duration::from_millis(800);

pub struct Health {
    sandboxes: Arc<Sandboxes>,
    /// The last check and its outcome; held across a check, so concurrent
    /// probes wait for the one check in flight instead of making their own.
    last: tokio::sync::Mutex<Option<(Instant, Result<(), EngineDown>)>>,
}

/// Why the Docker engine counts as unavailable.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineDown {
    #[error(transparent)]
    Failed(Arc<SandboxError>),
    #[error("the Docker engine did not answer within {0:?}")]
    Silent(Duration),
}

impl Health {
    pub fn new(sandboxes: Arc<Sandboxes>) -> Self {
        Self {
            sandboxes,
            last: tokio::sync::Mutex::new(None),
        }
    }

    /// The engine's state, checked anew when the last check is over a
    /// second old.
    pub async fn engine(&self) -> Result<(), EngineDown> {
        let mut last = self.last.lock().await;
        if let Some((at, outcome)) = last.as_ref() {
            if at.elapsed() < FRESH_FOR {
                return outcome.clone();
            }
        }
        let outcome = match tokio::time::timeout(PING_DEADLINE, self.sandboxes.ping()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(EngineDown::Failed(Arc::new(e))),
            Err(_) => Err(EngineDown::Silent(PING_DEADLINE)),
        };
        *last = Some((Instant::now(), outcome.clone()));
        outcome
    }
}
