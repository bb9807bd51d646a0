//! What one sandbox's previews may hold: open connections, and bytes per
//! minute both ways (a bucket that refills evenly; a transfer past it
//! waits rather than fails, so a large download slows instead of breaking).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use uuid::Uuid;

use crate::config::PreviewConfig;
use crate::http::preview::kept::Kept;

pub(crate) struct Caps {
    connections: usize,
    bytes_per_second: f64,
    sandboxes: Mutex<HashMap<Uuid, Arc<Sandbox>>>,
}

/// Connections one sandbox's agent is asked to open at once: it answers
/// them one at a time, and takes only so many connections of its own.
const OPENING_AT_ONCE: usize = 8;

/// One sandbox's share.
pub(crate) struct Sandbox {
    open: Arc<Semaphore>,
    /// Held while its agent opens a connection (a burst waits its turn).
    pub(crate) opening: Semaphore,
    /// Idle connections to its apps, for the next exchanges.
    pub(crate) kept: Kept,
    bucket: Mutex<Bucket>,
    bytes_per_second: f64,
}

struct Bucket {
    /// Bytes that may pass now (negative: owed by transfers already let through).
    tokens: f64,
    at: Instant,
}

impl Caps {
    pub(crate) fn new(config: &PreviewConfig) -> Self {
        Self {
            connections: config.max_connections_per_sandbox,
            bytes_per_second: (config.mb_per_minute * 1024 * 1024) as f64 / 60.0,
            sandboxes: Mutex::default(),
        }
    }

    /// A place among `sandbox`'s open preview connections, held while the
    /// exchange lasts; `None` when all are taken.
    pub(crate) fn open(&self, sandbox: Uuid) -> Option<(OwnedSemaphorePermit, Arc<Sandbox>)> {
        let mut all = self.sandboxes.lock().expect("caps lock");
        // Sandboxes with nothing open are forgotten as others come: the
        // table holds no more than the sandboxes with open previews.
        if all.len() > 1024 {
            all.retain(|_, s| Arc::strong_count(s) > 1 || s.open.available_permits() < self.connections);
        }
        let share = all
            .entry(sandbox)
            .or_insert_with(|| {
                Arc::new(Sandbox {
                    open: Arc::new(Semaphore::new(self.connections)),
                    opening: Semaphore::new(OPENING_AT_ONCE),
                    kept: Kept::default(),
                    bucket: Mutex::new(Bucket {
                        tokens: self.bytes_per_second * 60.0,
                        at: Instant::now(),
                    }),
                    bytes_per_second: self.bytes_per_second,
                })
            })
            .clone();
        let permit = share.open.clone().try_acquire_owned().ok()?;
        Some((permit, share))
    }
}

impl Sandbox {
    /// Takes `bytes` from the bucket, waiting for them when it is empty.
    pub(crate) async fn pass(&self, bytes: usize) {
        let wait = {
            let mut b = self.bucket.lock().expect("bucket lock");
            let now = Instant::now();
            let full = self.bytes_per_second * 60.0;
            b.tokens = (b.tokens + (now - b.at).as_secs_f64() * self.bytes_per_second).min(full);
            b.at = now;
            b.tokens -= bytes as f64;
            (b.tokens < 0.0).then(|| Duration::from_secs_f64(-b.tokens / self.bytes_per_second))
        };
        if let Some(wait) = wait {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(connections: usize, mb_per_minute: u64) -> PreviewConfig {
        PreviewConfig {
            max_connections_per_sandbox: connections,
            mb_per_minute,
            ..PreviewConfig::default()
        }
    }

    #[test]
    fn a_sandbox_holds_at_most_its_connections_and_others_are_apart() {
        let caps = Caps::new(&config(2, 60));
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let first = caps.open(a).unwrap();
        let _second = caps.open(a).unwrap();
        assert!(caps.open(a).is_none());
        assert!(caps.open(b).is_some());
        drop(first);
        assert!(caps.open(a).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn past_a_minute_of_bytes_transfers_wait_for_the_bucket() {
        let caps = Caps::new(&config(1, 1));
        let (_permit, share) = caps.open(Uuid::new_v4()).unwrap();
        let start = Instant::now();
        share.pass(1024 * 1024).await;
        assert!(
            start.elapsed() < Duration::from_millis(1),
            "a minute's worth passes at once"
        );
        share.pass(512 * 1024).await;
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(29) && waited <= Duration::from_secs(31),
            "{waited:?}"
        );
    }
}
