//! What each tenant used, by the hour: sandbox time by state, CPU, memory,
//! disk and network from the containers' own counters, and calls, their
//! time and installs as they end. Kept in the record store, so figures
//! survive restarts and the sandboxes they came from; the hours older than
//! `usage.retention_days` are removed as new ones are written.
//!
//! Figures accrue in memory and are written every `usage.sample_seconds`
//! (see [`reading`]): a crash of the server loses at most that long. This
//! month's totals per tenant are kept in memory too, so a budget check on
//! every call costs a lookup, not a scan.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use time::{Date, OffsetDateTime, Time};
use uuid::Uuid;

use crate::config::UsageConfig;
use crate::error::Result;
use crate::history::CallKind;
use crate::moment;
use crate::records::RecordStore;

pub(crate) mod reading;
mod store;

/// What one tenant used in one period.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Totals {
    /// Seconds its sandboxes ran (running or restarting).
    pub running_seconds: f64,
    /// Seconds its sandboxes were paused while idle (memory kept, no CPU).
    pub paused_seconds: f64,
    /// CPU time of its containers (their cgroups' counters).
    pub cpu_seconds: f64,
    /// Memory in use (as `docker stats` shows it) times the time it was held.
    pub memory_gb_seconds: f64,
    /// Bytes on the sandboxes' results and package disks times the time held.
    pub disk_gb_hours: f64,
    /// Bytes in and out: the containers' own interfaces for sandboxes on
    /// the bridge, the egress proxy's count for proxied ones.
    pub egress_bytes: u64,
    /// Runs (Python and shell) and other calls that went to a sandbox.
    pub calls: u64,
    /// Time those calls took, queueing aside.
    pub exec_seconds: f64,
    /// Package installs that ended (done or failed).
    pub installs: u64,
}

impl Totals {
    pub fn add(&mut self, other: &Totals) {
        self.running_seconds += other.running_seconds;
        self.paused_seconds += other.paused_seconds;
        self.cpu_seconds += other.cpu_seconds;
        self.memory_gb_seconds += other.memory_gb_seconds;
        self.disk_gb_hours += other.disk_gb_hours;
        self.egress_bytes += other.egress_bytes;
        self.calls += other.calls;
        self.exec_seconds += other.exec_seconds;
        self.installs += other.installs;
    }
}

/// One tenant's figures for one hour.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// Start of the hour, in Unix seconds.
    pub hour: u64,
    pub tenant: String,
    #[serde(flatten)]
    pub totals: Totals,
}

/// Start of the hour holding `at`, in Unix seconds.
pub fn hour_of(at: OffsetDateTime) -> u64 {
    let secs = at.unix_timestamp().max(0) as u64;
    secs - secs % 3600
}

/// Start of the month holding `at` (UTC), and of the next one.
pub fn month_of(at: OffsetDateTime) -> (OffsetDateTime, OffsetDateTime) {
    let at = at.to_offset(time::UtcOffset::UTC);
    let first = |year, month| {
        Date::from_calendar_date(year, month, 1)
            .expect("the first of a month")
            .with_time(Time::MIDNIGHT)
            .assume_utc()
    };
    let start = first(at.year(), at.month());
    let next = match at.month() {
        time::Month::December => first(at.year() + 1, time::Month::January),
        m => first(at.year(), m.next()),
    };
    (start, next)
}

struct Accrued {
    /// Not yet written, by (hour, tenant).
    pending: BTreeMap<(u64, String), Totals>,
    /// The month `month` begins (Unix seconds) and each tenant's totals in it.
    month: u64,
    this_month: HashMap<String, Totals>,
}

/// The accrual of every tenant's usage; one per server.
pub struct Meter {
    store: RecordStore,
    retention_days: u64,
    accrued: Mutex<Accrued>,
    /// Each live sandbox's last reading (see [`reading`]).
    pub(crate) readings: Mutex<HashMap<Uuid, reading::Seen>>,
    /// When this meter opened: sandboxes made before were counted, up to
    /// their last reading, by an earlier server.
    pub(crate) opened_at: OffsetDateTime,
    pub(crate) opened: tokio::time::Instant,
}

impl Meter {
    /// Starts from what the store holds of this month.
    pub async fn open(store: RecordStore, config: &UsageConfig) -> Result<Self> {
        let (start, _) = month_of(moment::now());
        let month = start.unix_timestamp() as u64;
        let this_month = store.usage_since(month).await?;
        Ok(Self {
            store,
            readings: Mutex::default(),
            opened_at: moment::now(),
            opened: tokio::time::Instant::now(),
            retention_days: config.retention_days,
            accrued: Mutex::new(Accrued {
                pending: BTreeMap::new(),
                month,
                this_month,
            }),
        })
    }

    /// Adds `totals` to `tenant`'s figures for the hour holding `at`.
    pub fn add(&self, tenant: &str, at: OffsetDateTime, totals: &Totals) {
        let (start, _) = month_of(at);
        let month = start.unix_timestamp() as u64;
        let mut a = self.accrued.lock().expect("usage lock");
        a.pending
            .entry((hour_of(at), tenant.to_string()))
            .or_default()
            .add(totals);
        if month > a.month {
            a.month = month;
            a.this_month.clear();
        }
        if month == a.month {
            a.this_month.entry(tenant.to_string()).or_default().add(totals);
        }
    }

    /// A call that ended after `seconds`: an install counts as one, any
    /// other (runs, uploads, restarts, snapshots) as a call.
    pub fn call(&self, tenant: &str, kind: CallKind, seconds: f64) {
        let (calls, installs) = match kind {
            CallKind::Install => (0, 1),
            _ => (1, 0),
        };
        let totals = Totals {
            calls,
            installs,
            exec_seconds: seconds,
            ..Totals::default()
        };
        self.add(tenant, moment::now(), &totals);
    }

    /// `tenant`'s totals this month (UTC), and when the month ends.
    pub fn this_month(&self, tenant: &str) -> (Totals, OffsetDateTime) {
        let (start, next) = month_of(moment::now());
        let a = self.accrued.lock().expect("usage lock");
        let totals = match a.month == start.unix_timestamp() as u64 {
            true => a.this_month.get(tenant).copied().unwrap_or_default(),
            false => Totals::default(),
        };
        (totals, next)
    }

    /// The `n` tenants that used the most CPU this month, with their totals,
    /// most first. (Selected, not sorted: the lock every call's accrual
    /// takes is held for one pass over the tenants.)
    pub fn top_this_month(&self, n: usize) -> Vec<(String, Totals)> {
        let (start, _) = month_of(moment::now());
        let mut top: Vec<(&str, Totals)> = Vec::with_capacity(n + 1);
        let a = self.accrued.lock().expect("usage lock");
        if n == 0 || a.month != start.unix_timestamp() as u64 {
            return vec![];
        }
        let more = |x: &(&str, Totals), y: &(&str, Totals)| {
            y.1.cpu_seconds.total_cmp(&x.1.cpu_seconds).then_with(|| x.0.cmp(y.0))
        };
        for (tenant, totals) in &a.this_month {
            let entry = (tenant.as_str(), *totals);
            if top.len() < n || more(&entry, top.last().expect("n > 0")).is_lt() {
                let at = top.partition_point(|t| more(t, &entry).is_lt());
                top.insert(at, entry);
                top.truncate(n);
            }
        }
        top.into_iter().map(|(t, u)| (t.to_string(), u)).collect()
    }

    /// Writes what accrued since the last write, and removes the hours past
    /// retention. What could not be written stays for the next time.
    pub async fn flush(&self) -> Result<()> {
        let pending = std::mem::take(&mut self.accrued.lock().expect("usage lock").pending);
        let keep_from = hour_of(moment::now()).saturating_sub(self.retention_days * 24 * 3600);
        if pending.is_empty() {
            return Ok(());
        }
        let rows: Vec<Row> = pending
            .iter()
            .map(|((hour, tenant), totals)| Row {
                hour: *hour,
                tenant: tenant.clone(),
                totals: *totals,
            })
            .collect();
        if let Err(e) = self.store.add_usage(rows, keep_from).await {
            let mut a = self.accrued.lock().expect("usage lock");
            for (key, totals) in pending {
                a.pending.entry(key).or_default().add(&totals);
            }
            return Err(e);
        }
        Ok(())
    }

    /// The hourly rows from `from` up to `to` (Unix seconds, `from`'s hour
    /// included, `to`'s not), of one tenant or of all: those written, with
    /// what accrued since added in (a report never waits for a write).
    pub async fn report(&self, from: u64, to: u64, tenant: Option<&str>) -> Result<Vec<Row>> {
        let (from, to) = (from - from % 3600, to.div_ceil(3600).saturating_mul(3600));
        let written = self.store.usage(from, to, tenant.map(str::to_string)).await?;
        let mut rows: BTreeMap<(u64, String), Totals> =
            written.into_iter().map(|r| ((r.hour, r.tenant), r.totals)).collect();
        {
            let a = self.accrued.lock().expect("usage lock");
            let pending = a.pending.range((from, String::new())..(to, String::new()));
            for ((hour, name), totals) in pending.filter(|((_, name), _)| tenant.is_none_or(|t| t == name)) {
                rows.entry((*hour, name.clone())).or_default().add(totals);
            }
        }
        if rows.len() > store::MAX_REPORT_ROWS {
            return Err(store::too_many());
        }
        Ok(rows
            .into_iter()
            .map(|((hour, tenant), totals)| Row { hour, tenant, totals })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn months_and_hours_are_utc() {
        let (start, next) = month_of(datetime!(2026-12-31 23:30 UTC));
        assert_eq!(
            (start, next),
            (datetime!(2026-12-01 0:00 UTC), datetime!(2027-01-01 0:00 UTC))
        );
        assert_eq!(
            hour_of(datetime!(2026-12-02 21:59:59 UTC)),
            datetime!(2026-12-02 21:00 UTC).unix_timestamp() as u64
        );
    }

    #[tokio::test]
    async fn figures_add_up_by_hour_survive_a_reopen_and_go_after_retention() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("records.redb");
        let config = UsageConfig::default();
        let now = moment::now();
        {
            let meter = Meter::open(RecordStore::open(&path).unwrap(), &config).await.unwrap();
            let cpu = |s| Totals {
                cpu_seconds: s,
                ..Totals::default()
            };
            meter.add("a", now, &cpu(2.0));
            meter.add("a", now, &cpu(3.0));
            meter.add("b", now, &cpu(7.0));
            meter.add("a", now - time::Duration::days(200), &cpu(100.0));
            meter.call("a", CallKind::Python, 1.5);
            meter.flush().await.unwrap();
            meter.add("a", now, &cpu(1.0));
            meter.flush().await.unwrap();
            assert_eq!(meter.this_month("a").0.cpu_seconds, 6.0);
        }
        let meter = Meter::open(RecordStore::open(&path).unwrap(), &config).await.unwrap();
        let (mine, _) = meter.this_month("a");
        assert_eq!((mine.cpu_seconds, mine.calls, mine.exec_seconds), (6.0, 1, 1.5));
        let top: Vec<String> = meter.top_this_month(5).into_iter().map(|(t, _)| t).collect();
        assert_eq!(top, ["b", "a"], "most CPU first");
        let all = meter.report(0, u64::MAX - 3600, None).await.unwrap();
        assert_eq!(
            all.len(),
            2,
            "one row per tenant for the hour, the old hour gone: {all:?}"
        );
        let theirs = meter.report(0, u64::MAX - 3600, Some("b")).await.unwrap();
        assert_eq!((theirs.len(), theirs[0].totals.cpu_seconds), (1, 7.0));
    }
}
