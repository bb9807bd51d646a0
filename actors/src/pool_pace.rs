//! How fast the pool refills while calls run. A refill is a creation (the
//! engine, the runtime and a new interpreter: about a third of a second of
//! both cores of a small host), and a burst of claims sets off as many at
//! once: the calls of the sandboxes already in use then share the host with
//! them, and ten clients looping `print(1)` lost a third of their rate and
//! quadrupled their p99 while the pool refilled. So while calls run (one is
//! under way, or one ended within [`RECENT`]) and no claim waits, refills
//! go one at a time, and after each the next waits [`GAP_FACTOR`] times as
//! long as it took: refills take at most a quarter of the time. With no
//! call, or with a claim waiting for a sandbox, they run as many at once as
//! the pool allows.
//!
//! Pure bookkeeping on times it is given, so it is tested without a clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// A call that ended this recently still counts: a client looping calls
/// sends the next one a moment after.
pub const RECENT: Duration = Duration::from_millis(250);

/// While calls run, a refill that took `t` is followed by `GAP_FACTOR × t`
/// without one.
pub const GAP_FACTOR: u32 = 3;

/// The calls under way in the server's sandboxes, and when the last ended.
#[derive(Debug, Default)]
pub struct CallsInFlight {
    running: AtomicUsize,
    last_end: Mutex<Option<Instant>>,
}

impl CallsInFlight {
    /// Counts a call until the guard drops.
    pub fn enter(self: &Arc<Self>) -> CallGuard {
        self.running.fetch_add(1, Ordering::AcqRel);
        CallGuard(self.clone())
    }

    /// Whether a call runs at `now`, or ended within [`RECENT`].
    pub fn busy(&self, now: Instant) -> bool {
        self.running.load(Ordering::Acquire) > 0
            || self
                .last_end
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .is_some_and(|end| now.duration_since(end) < RECENT)
    }
}

/// A call under way; see [`CallsInFlight::enter`].
pub struct CallGuard(Arc<CallsInFlight>);

impl Drop for CallGuard {
    fn drop(&mut self) {
        *self
            .0
            .last_end
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
        self.0.running.fetch_sub(1, Ordering::AcqRel);
    }
}

/// When the next refill may start while calls run.
#[derive(Debug, Default)]
pub struct Pace {
    next: Option<Instant>,
}

impl Pace {
    /// A refill that took `took` ended at `now`; `busy`: calls ran.
    pub fn landed(&mut self, now: Instant, took: Duration, busy: bool) {
        self.next = busy.then(|| now + took * GAP_FACTOR);
    }

    /// How many refills may be under way at `now`: `at_once` without calls;
    /// with them, one, once the gap after the last is over.
    pub fn room(&self, now: Instant, busy: bool, at_once: usize) -> usize {
        match busy {
            false => at_once,
            true if self.next.is_some_and(|t| now < t) => 0,
            true => at_once.min(1),
        }
    }

    /// When the current gap ends, if one runs at `now`.
    pub fn until(&self, now: Instant) -> Option<Instant> {
        self.next.filter(|t| now < *t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn while_calls_run_refills_go_one_at_a_time_and_take_a_quarter_of_the_time() {
        let t = Instant::now();
        let mut pace = Pace::default();
        assert_eq!(pace.room(t, false, 4), 4, "no call: as many as the pool allows");
        assert_eq!(pace.room(t, true, 4), 1, "calls: one at a time");
        pace.landed(t + ms(300), ms(300), true);
        assert_eq!(pace.room(t + ms(1000), true, 4), 0, "the gap: three times the refill");
        assert_eq!(pace.until(t + ms(1000)), Some(t + ms(1200)));
        assert_eq!(pace.room(t + ms(1000), false, 4), 4, "the calls ended: no gap");
        assert_eq!(pace.room(t + ms(1200), true, 4), 1);
        assert_eq!(pace.until(t + ms(1200)), None);
        pace.landed(t + ms(1500), ms(300), false);
        assert_eq!(
            pace.room(t + ms(1500), true, 4),
            1,
            "a refill without calls leaves no gap"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_counts_while_it_runs_and_a_moment_after() {
        let calls = Arc::new(CallsInFlight::default());
        assert!(!calls.busy(Instant::now()));
        let call = calls.enter();
        assert!(calls.busy(Instant::now()));
        drop(call);
        assert!(calls.busy(Instant::now()), "ended just now");
        tokio::time::advance(RECENT).await;
        assert!(!calls.busy(Instant::now()));
    }
}
