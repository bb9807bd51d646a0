//! What every actor of one server shares: the runtime, the records and the
//! settings, plus where each sandbox's host folders are.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use uuid::Uuid;

use crate::census::Census;
use crate::config::Settings;
use crate::pool_pace::CallsInFlight;
use crate::records::RecordStore;
use crate::snapshots::Snapshots;
use crate::status::SandboxStatus;
use crate::templates::Templates;
use crate::usage::reading::{Subject, READING_DEADLINE};
use crate::usage::Meter;
use sandbox_egress::Egress;
use sandbox_host::agent_dir;
use sandbox_host::disk::Disks;
use sandbox_runtime::{ContainerRuntime, SandboxPaths};

pub struct Context {
    pub runtime: Arc<dyn ContainerRuntime>,
    pub store: RecordStore,
    pub settings: Settings,
    pub counters: EventCounts,
    pub egress: Egress,
    pub disks: Disks,
    pub snapshots: Snapshots,
    /// Every tenant's usage, accrued as it happens.
    pub meter: Meter,
    /// The forks under way: a new sandbox marked as being seeded by one
    /// refuses its owner's calls only while that fork is under way (a mark
    /// its actor could not clear never locks the sandbox).
    pub forks: Mutex<HashSet<Uuid>>,
    /// Which sandboxes are awake and which asleep, for the caps.
    pub census: Census,
    /// The runs under way, which the pool's refills give way to.
    pub calls: Arc<CallsInFlight>,
    /// The templates offered, and which sandbox is made from which.
    pub templates: Templates,
}

impl Context {
    /// Whether fork `fork` is still under way.
    pub fn fork_under_way(&self, fork: Uuid) -> bool {
        self.forks.lock().expect("forks lock").contains(&fork)
    }
}

/// Events counted since the server started, for its metrics.
#[derive(Debug, Default)]
pub struct EventCounts {
    /// Containers started again, re-created or restarted (after a crash, a
    /// hang, or on request).
    pub container_restarts: AtomicU64,
    pub installs_succeeded: AtomicU64,
    pub installs_failed: AtomicU64,
}

impl EventCounts {
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

impl Context {
    pub fn paths(&self, id: Uuid) -> SandboxPaths {
        SandboxPaths {
            id,
            results: self.settings.results_dir.join(id.to_string()),
            agent: agent_dir(&self.settings.agents_dir(), id),
            egress: self.egress.socket_dir(id),
            packages: self.disks.packages_dir(id),
            template: self.templates.of(id),
        }
    }

    /// Reads `s`'s counters (the engine's, within [`READING_DEADLINE`], and
    /// its proxy's) and adds what it used since its last reading to its
    /// tenant's hour; `last`: it is going, and is forgotten.
    pub async fn read_usage(&self, s: Subject, last: bool) {
        // A sleeping sandbox has no container to ask about.
        let usage = match s.status {
            SandboxStatus::Hibernated => None,
            _ => tokio::time::timeout(READING_DEADLINE, self.runtime.usage(&s.container))
                .await
                .ok()
                .and_then(Result::ok),
        };
        let proxied = self.egress.moved(s.id);
        let period = Duration::from_secs(self.settings.usage.sample_seconds);
        self.meter.take_reading(s, usage, proxied, period, last);
    }
}
