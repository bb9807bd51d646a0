//! What one run cost, handed back with its result: its wall time, the CPU
//! seconds its sandbox spent meanwhile, its memory's peak and the bytes its
//! sandbox moved on the network. Read from the counters the usage meter
//! bills from (the container's cgroup and interfaces, the egress proxy's
//! count), so a tenant's receipts add up to what its bill shows for those
//! calls; a counter that cannot be read is left out, never guessed.

use std::time::Instant;

use sandbox_runtime::counters::{Counters, PeakMark};

use crate::agent_connection::AgentConnection;
use crate::usage::reading::grown;

/// What one run cost, read from the counters usage is billed from.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Receipt {
    /// The run's wall time, as the server measured it.
    pub wall_ms: f64,
    /// CPU seconds the sandbox's processes used during the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<f64>,
    /// The sandbox's highest memory use during the run, page cache included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<u64>,
    /// Bytes the sandbox received and sent on the network during the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_bytes: Option<u64>,
}

/// The counters as a run began.
pub(crate) struct Meter {
    started: Instant,
    container: String,
    counters: Option<Counters>,
    peak: Option<PeakMark>,
    proxied: Option<u64>,
}

impl Meter {
    pub(crate) fn start(link: &AgentConnection) -> Self {
        Self {
            started: Instant::now(),
            container: link.container_id.clone(),
            counters: link.ctx().runtime.counters(&link.container_id),
            peak: link.ctx().runtime.peak_mark(&link.container_id),
            proxied: link.ctx().egress.moved(link.paths.id),
        }
    }

    /// The receipt, read as the run ended. A container replaced during the
    /// run (revived) counts from zero, as the meter does.
    pub(crate) fn finish(self, link: &AgentConnection) -> Receipt {
        let wall_ms = (self.started.elapsed().as_secs_f64() * 1e6).round() / 1e3;
        let same = self.container == link.container_id;
        let peak_memory_bytes = self.peak.filter(|_| same).and_then(|mut p| p.read());
        let now = link.ctx().runtime.counters(&link.container_id);
        let before = self.counters.filter(|_| same);
        let cpu_seconds = now.as_ref().map(|n| {
            let used = grown(n.cpu_seconds, before.as_ref().map_or(0.0, |b| b.cpu_seconds));
            (used * 1e6).round() / 1e6
        });
        let network = now.as_ref().and_then(|n| {
            Some(grown(
                n.network_bytes?,
                before.as_ref().map_or(Some(0), |b| b.network_bytes)?,
            ))
        });
        let proxied = link
            .ctx()
            .egress
            .moved(link.paths.id)
            .map(|n| grown(n, self.proxied.unwrap_or(0)));
        let network_bytes = match (network, proxied) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        Receipt {
            wall_ms,
            cpu_seconds,
            peak_memory_bytes,
            network_bytes,
        }
    }
}
