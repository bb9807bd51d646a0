//! Monthly budgets of a key (`[[auth.keys]]`) or of each guest (`[guest]`):
//! `cpu_hours_per_month`, `sandbox_hours_per_month` and
//! `egress_mb_per_month`. Past one, new work (runs, installs, creations,
//! forks, restarts, snapshots and restores) is refused until the month (UTC)
//! ends; listings, reads, uploads and deletions keep working, so a tenant
//! can still see and clean up what it has.
//! Figures come from the domain's usage meter (`sandbox_actors::usage`).

use sandbox_actors::usage::Totals;
use time::OffsetDateTime;

/// What one tenant may use in a month; `None`: no bound.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Budget {
    pub cpu_hours: Option<f64>,
    pub sandbox_hours: Option<f64>,
    pub egress_mb: Option<f64>,
}

impl Budget {
    /// The name of the first key that is not a positive number, if any.
    pub fn invalid_key(&self) -> Option<&'static str> {
        self.caps()
            .into_iter()
            .find(|(_, cap, _)| cap.is_some_and(|c| !(c.is_finite() && c > 0.0)))
            .map(|(key, _, _)| key)
    }

    fn caps(&self) -> [(&'static str, Option<f64>, &'static str); 3] {
        [
            ("cpu_hours_per_month", self.cpu_hours, "CPU hours"),
            ("sandbox_hours_per_month", self.sandbox_hours, "sandbox hours"),
            ("egress_mb_per_month", self.egress_mb, "MiB of network traffic"),
        ]
    }

    /// Refuses when `used` this month reached a bound: the message names
    /// the bound and when it renews.
    pub fn check(&self, used: &Totals, renews: OffsetDateTime) -> Result<(), String> {
        let spent = [
            used.cpu_seconds / 3600.0,
            (used.running_seconds + used.paused_seconds) / 3600.0,
            used.egress_bytes as f64 / (1024.0 * 1024.0),
        ];
        for ((key, cap, what), spent) in self.caps().into_iter().zip(spent) {
            if let Some(cap) = cap.filter(|cap| spent >= *cap) {
                let renews = sandbox_actors::moment::format(renews);
                return Err(format!(
                    "this key has used {spent:.2} of its {cap} {what} this month ({key}): new runs, installs, \
                     sandboxes, restarts and snapshots are refused until {renews}; listing, reading files and \
                     deleting still work"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_bound_reached_is_named_with_its_renewal() {
        let budget = Budget {
            cpu_hours: Some(1.0),
            sandbox_hours: Some(10.0),
            egress_mb: None,
        };
        let renews = time::macros::datetime!(2027-01-01 0:00 UTC);
        let mut used = Totals {
            cpu_seconds: 3599.0,
            running_seconds: 3600.0 * 9.0,
            egress_bytes: u64::MAX / 2,
            ..Totals::default()
        };
        assert_eq!(budget.check(&used, renews), Ok(()), "egress has no bound");
        used.cpu_seconds = 3600.0;
        let refused = budget.check(&used, renews).unwrap_err();
        assert!(
            refused.contains("cpu_hours_per_month") && refused.contains("2027-01-01T00:00:00.000Z"),
            "{refused}"
        );
        used.cpu_seconds = 0.0;
        used.paused_seconds = 3600.0;
        assert!(budget
            .check(&used, renews)
            .unwrap_err()
            .contains("sandbox_hours_per_month"));
        assert_eq!(
            Budget {
                egress_mb: Some(-1.0),
                ..budget
            }
            .invalid_key(),
            Some("egress_mb_per_month")
        );
        assert_eq!(
            Budget {
                cpu_hours: Some(f64::NAN),
                ..budget
            }
            .invalid_key(),
            Some("cpu_hours_per_month")
        );
        assert_eq!(budget.invalid_key(), None);
    }
}
