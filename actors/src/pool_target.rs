//! How many warm sandboxes the pool aims to hold: `[pool] min` always, and
//! between `min` and `max` whatever demand shows. A burst of claims raises
//! the target at once to the size of the burst (the claims of the last
//! [`BURST_WINDOW`]), so the next burst of that size finds its sandboxes
//! ready; after `shrink_after_seconds` without a claim it comes down by a
//! tenth of the way to `min` every [`SHRINK_EVERY`], so a quiet server gives
//! its memory back slowly and a server with steady demand keeps its pool.
//!
//! Pure bookkeeping on times it is given, so it is tested without a clock.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// Claims this close together count as one burst.
pub const BURST_WINDOW: Duration = Duration::from_secs(30);
/// How often a quiet pool steps down.
pub const SHRINK_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub struct Target {
    min: usize,
    max: usize,
    quiet: Duration,
    /// Claims of the current window, oldest first (at most `max` kept: a
    /// burst larger than the pool may hold counts as `max`).
    claims: VecDeque<Instant>,
    /// The target before bounds: the largest burst seen, decayed.
    peak: usize,
    last_claim: Option<Instant>,
    last_step: Option<Instant>,
}

impl Target {
    pub fn new(min: usize, max: usize, quiet: Duration) -> Self {
        Self {
            min,
            max: max.max(min),
            quiet,
            claims: VecDeque::new(),
            peak: min,
            last_claim: None,
            last_step: None,
        }
    }

    /// A claim at `now` (whether or not the pool had a sandbox for it).
    pub fn claimed(&mut self, now: Instant) {
        while self
            .claims
            .front()
            .is_some_and(|t| now.duration_since(*t) > BURST_WINDOW)
        {
            self.claims.pop_front();
        }
        if self.claims.len() == self.max {
            self.claims.pop_front();
        }
        self.claims.push_back(now);
        self.peak = self.peak.max(self.claims.len());
        self.last_claim = Some(now);
    }

    /// The target at `now`, after any step down that is due.
    pub fn at(&mut self, now: Instant) -> usize {
        let quiet_since = self.last_claim.map(|t| now.duration_since(t));
        let due = self.last_step.is_none_or(|t| now.duration_since(t) >= SHRINK_EVERY);
        if quiet_since.is_some_and(|q| q >= self.quiet) && due && self.peak > self.min {
            self.peak -= ((self.peak - self.min) / 10).max(1);
            self.last_step = Some(now);
        }
        self.peak.clamp(self.min, self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUIET: Duration = Duration::from_secs(120);

    fn burst(t: &mut Target, at: Instant, n: usize) {
        for i in 0..n {
            t.claimed(at + Duration::from_millis(i as u64));
        }
    }

    #[test]
    fn it_starts_at_the_minimum_and_grows_at_once_to_a_burst() {
        let start = Instant::now();
        let mut t = Target::new(2, 100, QUIET);
        assert_eq!(t.at(start), 2);
        burst(&mut t, start, 40);
        assert_eq!(t.at(start + Duration::from_secs(1)), 40);
        // A later, larger burst raises it again; a smaller one does not lower it.
        burst(&mut t, start + Duration::from_secs(60), 70);
        assert_eq!(t.at(start + Duration::from_secs(61)), 70);
        burst(&mut t, start + Duration::from_secs(100), 5);
        assert_eq!(t.at(start + Duration::from_secs(101)), 70);
    }

    #[test]
    fn claims_spread_out_are_no_burst() {
        let start = Instant::now();
        let mut t = Target::new(1, 50, QUIET);
        for i in 0..20 {
            t.claimed(start + BURST_WINDOW * i + Duration::from_secs(1));
        }
        assert!(t.at(start + BURST_WINDOW * 20) <= 2, "{t:?}");
    }

    #[test]
    fn it_never_leaves_its_bounds() {
        let start = Instant::now();
        let mut t = Target::new(3, 10, QUIET);
        burst(&mut t, start, 500);
        assert_eq!(t.at(start), 10);
        assert!(t.claims.len() <= 10, "the window holds at most max claims");
        let mut later = start;
        for _ in 0..1000 {
            later += SHRINK_EVERY;
            assert!((3..=10).contains(&t.at(later)));
        }
        assert_eq!(t.at(later), 3);
        let mut flat = Target::new(4, 2, QUIET);
        assert_eq!(flat.at(start), 4, "a max below min is min");
    }

    #[test]
    fn it_shrinks_only_after_the_quiet_period_and_then_slowly() {
        let start = Instant::now();
        let mut t = Target::new(2, 100, QUIET);
        burst(&mut t, start, 100);
        let last = start + Duration::from_millis(99);
        assert_eq!(t.at(last + QUIET - Duration::from_secs(1)), 100, "not yet quiet");
        let first = t.at(last + QUIET);
        assert!((90..100).contains(&first), "one step of a tenth: {first}");
        assert_eq!(
            t.at(last + QUIET + Duration::from_secs(1)),
            first,
            "one step per interval"
        );
        let mut now = last + QUIET;
        let mut steps = 0;
        while t.at(now) > 2 {
            now += SHRINK_EVERY;
            steps += 1;
            assert!(steps < 200, "it reaches the minimum");
        }
        assert!(steps >= 20, "slowly: {steps} steps");
        // A claim during the descent stops it.
        burst(&mut t, now, 30);
        assert_eq!(t.at(now + Duration::from_secs(60)), 30);
    }
}
