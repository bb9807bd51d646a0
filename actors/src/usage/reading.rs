//! One reading of a sandbox's counters, and what it adds to its tenant's
//! hour: time by state, CPU, memory and disk held over the interval, and
//! bytes moved. Readings are taken every `usage.sample_seconds` (the
//! service's sampler) and once more as a sandbox is deleted.
//!
//! Counters are the engine's (cgroups, the container's interfaces) and the
//! egress proxy's, which the sandbox cannot lower but can start again from
//! zero (a counter that went down was reset, and counts from zero). A new
//! container (re-created) counts from zero; a counter that could not be read this
//! time keeps its last value, so the next reading counts what it missed. A
//! sandbox first seen that was made before the meter opened (adopted after
//! a restart) starts from its current counters, as the earlier server
//! counted up to its last sample; one made since counts from zero.

use std::time::Duration;

use sandbox_runtime::Usage;
use time::OffsetDateTime;
use tokio::time::Instant;
use uuid::Uuid;

use super::{Meter, Totals};
use crate::moment;
use crate::results::SandboxInfo;
use crate::status::SandboxStatus;

/// How long one sandbox's reading may take (its actor's answer, then the
/// engine's counters); a sandbox past it is read again next time.
pub(crate) const READING_DEADLINE: Duration = Duration::from_secs(5);

/// The last reading of one sandbox.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    container: String,
    at: Instant,
    cpu_seconds: f64,
    network_bytes: u64,
    proxied_bytes: u64,
}

/// What a reading needs to know of a sandbox.
pub(crate) struct Subject {
    pub id: Uuid,
    pub owner: String,
    pub container: String,
    pub status: SandboxStatus,
    pub created_at: OffsetDateTime,
    pub disk_bytes: u64,
}

impl From<&SandboxInfo> for Subject {
    fn from(info: &SandboxInfo) -> Self {
        // Its disks, and the host disk its snapshots hold.
        let disk_bytes = info.disk.as_ref().map_or(0, |d| {
            d.results.as_ref().map_or(0, |u| u.used_bytes) + d.packages.as_ref().map_or(0, |u| u.used_bytes)
        }) + info.snapshots.bytes;
        Self {
            id: info.sandbox_id,
            owner: info.owner.clone(),
            container: info.container_id.clone(),
            status: info.status,
            created_at: info.created_at,
            disk_bytes,
        }
    }
}

/// What a counter grew by since `before`. A counter below `before` was
/// started again from zero under the same container id (a restart, an OOM
/// kill, a first process that ended and was revived): all it shows was
/// used since then. Taking the drop for nothing would let a sandbox that
/// restarts itself before every sample use what no bill sees.
pub(crate) fn grown<T: PartialOrd + std::ops::Sub<Output = T> + Copy>(now: T, before: T) -> T {
    if now >= before {
        now - before
    } else {
        now
    }
}

impl Meter {
    /// Adds what `s` used since its last reading, from its container's
    /// counters now (`usage`; none when they could not be read) and the bytes
    /// its proxy moved (`proxied`); `period` is the sampling interval, the
    /// longest a reading may count four times over. `last`: it is going,
    /// and is forgotten. Concurrent readings of one sandbox (a sample and
    /// its deletion) each count from whichever reading was made last.
    pub(crate) fn take_reading(
        &self,
        s: Subject,
        usage: Option<Usage>,
        proxied: Option<u64>,
        period: Duration,
        last: bool,
    ) {
        let meter = self;
        let now = Instant::now();
        let totals = {
            let mut readings = meter.readings.lock().expect("readings lock");
            let before = readings.get(&s.id).cloned();
            let zero = |at| Seen {
                container: s.container.clone(),
                at,
                cpu_seconds: 0.0,
                network_bytes: 0,
                proxied_bytes: 0,
            };
            let base = match before {
                Some(b) if b.container == s.container => b,
                // A new container: its counters start at zero; the
                // proxy's are the sandbox's and go on.
                Some(b) => Seen {
                    proxied_bytes: b.proxied_bytes,
                    ..zero(b.at)
                },
                None if s.created_at < meter.opened_at => Seen {
                    cpu_seconds: usage.map_or(0.0, |u| u.cpu_seconds),
                    network_bytes: usage.and_then(|u| u.network_bytes).unwrap_or(0),
                    proxied_bytes: proxied.unwrap_or(0),
                    ..zero(meter.opened)
                },
                None => {
                    let age = (moment::now() - s.created_at).unsigned_abs();
                    zero(now.checked_sub(age).unwrap_or(now))
                }
            };
            let secs = now.duration_since(base.at).min(period * 4).as_secs_f64();
            let (running, paused) = match s.status {
                SandboxStatus::Running | SandboxStatus::Restarting => (secs, 0.0),
                SandboxStatus::Paused => (0.0, secs),
                SandboxStatus::Stopped | SandboxStatus::Hibernated | SandboxStatus::Deleting => (0.0, 0.0),
            };
            let cpu = usage.map_or(base.cpu_seconds, |u| u.cpu_seconds);
            let network = usage.and_then(|u| u.network_bytes).unwrap_or(base.network_bytes);
            let proxied = proxied.unwrap_or(base.proxied_bytes);
            let totals = Totals {
                running_seconds: running,
                paused_seconds: paused,
                cpu_seconds: grown(cpu, base.cpu_seconds),
                memory_gb_seconds: usage.map_or(0.0, |u| u.memory_bytes as f64 / 1e9 * secs),
                disk_gb_hours: s.disk_bytes as f64 / 1e9 * secs / 3600.0,
                egress_bytes: grown(network, base.network_bytes) + grown(proxied, base.proxied_bytes),
                ..Totals::default()
            };
            if last {
                readings.remove(&s.id);
            } else {
                readings.insert(
                    s.id,
                    Seen {
                        container: s.container.clone(),
                        at: now,
                        cpu_seconds: cpu,
                        network_bytes: network,
                        proxied_bytes: proxied,
                    },
                );
            }
            totals
        };
        if totals != Totals::default() {
            meter.add(&s.owner, moment::now(), &totals);
        }
    }
}
