//! `/health`: liveness with the Docker engine's state, from a check made at
//! most once a second whatever the number of probes, so that probes (and
//! floods of them) cost the engine nothing. The route is exempt from
//! request-rate limits: a load balancer's probe must not read somebody
//! else's flood from the same address as the server being down.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use sandbox_actors::{SandboxError, Sandboxes};

use crate::http::AppState;

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

/// `/health`: whether Docker answers, and the host resources the sandboxes
/// draw on (free disk, their memory limits added up, the host's memory).
pub async fn route(State(app): State<AppState>) -> Response {
    let r = app.ops.sandboxes.resources();
    let mb = |b: u64| b >> 20;
    let resources = serde_json::json!({
        "disk_free_mb": r.disk_free_bytes.map(mb),
        "sandbox_memory_limits_mb": mb(r.memory_limits_bytes),
        "host_memory_mb": r.host_memory_bytes.map(mb),
    });
    match app.health.engine().await {
        Ok(()) => Json(serde_json::json!({ "status": "ok", "docker": "ok", "resources": resources })).into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({ "status": "unavailable", "docker": e.to_string(), "resources": resources })),
        )
            .into_response(),
    }
}
