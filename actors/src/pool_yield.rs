//! When the pool's refills give way to the first calls of sandboxes just
//! claimed. A claim from stock answers in milliseconds, but its agent's
//! first call then shares the host's CPU with the refills the claim set
//! off (a creation is the engine, the runtime and a new interpreter: about
//! a third of a second of both cores of a small host), and in a burst a
//! hundred first calls met a dozen creations: their time to interactive
//! doubled. So while claimed sandboxes have a first call to come or under
//! way, and no claim waits for a sandbox, refills hold, for at most
//! [`MAX_YIELD`] at a time; after a hold the refills run at least as long
//! as they held before the next may begin, so however claims come (and a
//! caller who claims and never calls), refills keep at least half of the
//! time.
//!
//! Pure bookkeeping on times it is given, so it is tested without a clock.

use std::time::Duration;

use tokio::time::Instant;

/// The longest refills hold for first calls at a time.
pub const MAX_YIELD: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
pub struct Yield {
    /// When the current hold began.
    since: Option<Instant>,
    /// No hold begins before this (the previous one's length after its end).
    not_before: Option<Instant>,
}

impl Yield {
    /// Whether refills hold at `now`: `first_calls` is whether claimed
    /// sandboxes' first calls are to come or under way while no claim waits.
    pub fn holds(&mut self, now: Instant, first_calls: bool) -> bool {
        match self.since {
            Some(since) if first_calls && now.duration_since(since) < MAX_YIELD => true,
            Some(since) => {
                self.since = None;
                self.not_before = Some(now + now.duration_since(since));
                false
            }
            None if first_calls && self.not_before.is_none_or(|t| now >= t) => {
                self.since = Some(now);
                true
            }
            None => false,
        }
    }

    /// When the current hold ends at the latest.
    pub fn until(&self) -> Option<Instant> {
        self.since.map(|since| since + MAX_YIELD)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn refills_hold_while_first_calls_run_and_resume_when_they_end() {
        let t = Instant::now();
        let mut y = Yield::default();
        assert!(!y.holds(t, false), "nothing to give way to");
        assert!(y.holds(t, true));
        assert_eq!(y.until(), Some(t + MAX_YIELD));
        assert!(y.holds(t + ms(100), true));
        assert!(!y.holds(t + ms(150), false), "the first calls ended");
        assert_eq!(y.until(), None);
        assert!(!y.holds(t + ms(200), true), "refills run as long as they held first");
        assert!(
            y.holds(t + ms(300), true),
            "then the next claims' first calls come first again"
        );
    }

    #[test]
    fn a_hold_never_outlasts_its_maximum_and_refills_keep_half_of_the_time() {
        let t = Instant::now();
        let mut y = Yield::default();
        // First calls that never end (a caller that claims and never calls).
        let mut held = Duration::ZERO;
        let step = ms(10);
        let mut now = t;
        while now < t + Duration::from_secs(60) {
            if y.holds(now, true) {
                held += step;
            }
            assert!(y.until().is_none_or(|u| u <= now + MAX_YIELD));
            now += step;
        }
        let share = held.as_secs_f64() / 60.0;
        assert!((0.45..=0.51).contains(&share), "held {share:.2} of the time");
    }
}
