//! Usage reports: the domain's hourly figures of a period, by hour or by
//! day, for the caller's tenant (an administrator's: every tenant, or one),
//! as JSON or CSV.

use std::collections::BTreeMap;

use sandbox_actors::usage::{month_of, Row, Totals};
use sandbox_actors::Scope;
use serde::{Deserialize, Serialize};
use time::format_description::well_known::Rfc3339;
use time::{Date, OffsetDateTime, Time};

use crate::access::caller::Caller;
use crate::ops::error::OpsError;
use crate::ops::timestamps::rfc3339;
use crate::ops::Ops;

type Result<T> = std::result::Result<T, OpsError>;

/// The figures' columns, in the CSV's order.
const COLUMNS: &str = "period,tenant,running_seconds,paused_seconds,cpu_seconds,memory_gb_seconds,disk_gb_hours,egress_bytes,calls,exec_seconds,installs";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Granularity {
    Hour,
    Day,
}

/// What a report covers: from `from` up to `to`, in periods of `granularity`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Period {
    #[serde(with = "time::serde::timestamp")]
    pub from: OffsetDateTime,
    #[serde(with = "time::serde::timestamp")]
    pub to: OffsetDateTime,
    pub granularity: Granularity,
}

/// A usage report's question, as another node hears it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct UsageAsked {
    pub tenant: Option<String>,
    pub period: Period,
}

fn instant(what: &str, raw: &str) -> Result<OffsetDateTime> {
    let bad = || {
        OpsError::InvalidArgument(format!(
            "{what} {raw:?} is not a time: give an RFC 3339 time (2026-12-01T00:00:00Z) or a date (2026-12-01)"
        ))
    };
    // In UTC, where every report's moments are written: a far offset can
    // take a moment past the years UTC can hold.
    if let Ok(t) = OffsetDateTime::parse(raw, &Rfc3339) {
        return t.checked_to_offset(time::UtcOffset::UTC).ok_or_else(bad);
    }
    let format = time::macros::format_description!("[year]-[month]-[day]");
    let date = Date::parse(raw, format).map_err(|_| bad())?;
    Ok(date.with_time(Time::MIDNIGHT).assume_utc())
}

impl Period {
    /// From the query's words; by default this month (UTC) so far, by day.
    pub fn parse(from: Option<&str>, to: Option<&str>, granularity: Option<&str>) -> Result<Self> {
        let now = OffsetDateTime::now_utc();
        let from = from.map(|f| instant("from", f)).transpose()?.unwrap_or(month_of(now).0);
        let to = to.map(|t| instant("to", t)).transpose()?.unwrap_or(now);
        if from >= to || from.unix_timestamp() < 0 {
            return Err(OpsError::InvalidArgument(
                "from must come before to, and after 1970".into(),
            ));
        }
        let granularity = match granularity.unwrap_or("day") {
            "hour" => Granularity::Hour,
            "day" => Granularity::Day,
            other => {
                return Err(OpsError::InvalidArgument(format!(
                    "granularity {other:?}: give hour or day"
                )))
            }
        };
        Ok(Self { from, to, granularity })
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct UsageRow {
    /// Start of the hour or day (UTC).
    pub period: String,
    pub tenant: String,
    #[serde(flatten)]
    pub totals: Totals,
}

#[derive(Debug, Clone, Serialize)]
pub struct UsageReport {
    pub from: String,
    pub to: String,
    pub granularity: Granularity,
    /// Oldest first, then by tenant.
    pub rows: Vec<UsageRow>,
    /// Nodes of the cluster that did not answer: the figures of the
    /// sandboxes they held are missing (ask again once they are back).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub missing_nodes: Vec<String>,
}

/// `rows` added up by tenant and period of `granularity`, oldest first.
fn bucketed(granularity: Granularity, rows: Vec<Row>) -> BTreeMap<(u64, String), Totals> {
    let bucket = |hour: u64| match granularity {
        Granularity::Hour => hour,
        Granularity::Day => hour - hour % 86_400,
    };
    let mut merged: BTreeMap<(u64, String), Totals> = BTreeMap::new();
    for row in rows {
        merged
            .entry((bucket(row.hour), row.tenant))
            .or_default()
            .add(&row.totals);
    }
    merged
}

impl UsageReport {
    /// The report of `rows` (of any nodes; rows already added up by period
    /// add up again to the same).
    fn new(period: Period, rows: Vec<Row>, missing_nodes: Vec<String>) -> Self {
        let merged = bucketed(period.granularity, rows);
        let at = |secs: u64| {
            OffsetDateTime::from_unix_timestamp(secs as i64)
                .map(rfc3339)
                .unwrap_or_default()
        };
        Self {
            from: rfc3339(period.from),
            to: rfc3339(period.to),
            granularity: period.granularity,
            rows: merged
                .into_iter()
                .map(|((start, tenant), totals)| UsageRow {
                    period: at(start),
                    tenant,
                    totals,
                })
                .collect(),
            missing_nodes,
        }
    }

    /// The rows as CSV, a header first. Tenant names hold no commas, quotes
    /// or line breaks (key names are letters, digits and `-_.@`, others
    /// `guest:`, `ip:` and an address); one that starts as a spreadsheet
    /// formula would (`-`, `@`) gets a `'` before it.
    pub fn csv(&self) -> String {
        let mut out = format!("{COLUMNS}\n");
        for r in &self.rows {
            let t = &r.totals;
            let formula = r.tenant.starts_with(['=', '+', '-', '@']);
            out.push_str(&format!(
                "{},{}{},{},{},{},{},{},{},{},{},{}\n",
                r.period,
                if formula { "'" } else { "" },
                r.tenant,
                t.running_seconds,
                t.paused_seconds,
                t.cpu_seconds,
                t.memory_gb_seconds,
                t.disk_gb_hours,
                t.egress_bytes,
                t.calls,
                t.exec_seconds,
                t.installs
            ));
        }
        out
    }
}

impl Ops {
    /// The caller's usage over `period`, on every node of a cluster; an
    /// administrator's covers every tenant, or `tenant` alone. Anyone else
    /// may name only itself.
    pub async fn usage(&self, caller: &Caller, tenant: Option<&str>, period: Period) -> Result<UsageReport> {
        let mut rows = self.usage_here(caller, tenant, period).await?;
        let asked = UsageAsked {
            tenant: tenant.map(str::to_string),
            period,
        };
        // Without the cluster's membership a report would look whole and
        // lack the other nodes: it is refused (503) instead.
        let (theirs, missing) = self.on_other_nodes::<_, Vec<Row>>("usage", caller, &asked).await?;
        rows.extend(theirs.into_iter().flatten());
        Ok(UsageReport::new(period, rows, missing))
    }

    /// This node's part of a usage report: its rows, added up by period.
    pub(crate) async fn usage_here(&self, caller: &Caller, tenant: Option<&str>, period: Period) -> Result<Vec<Row>> {
        let scope = match tenant {
            Some(t) if caller.admin => Scope::Owner(t),
            Some(t) if t == caller.owner => Scope::Owner(t),
            Some(_) => {
                return Err(OpsError::InvalidArgument(
                    "tenant= is for administrators' keys; without it you get your own usage".into(),
                ))
            }
            None => caller.scope(),
        };
        let (from, to) = (period.from.unix_timestamp() as u64, period.to.unix_timestamp() as u64);
        let rows = self.sandboxes.usage_report(scope, from, to).await?;
        let merged = bucketed(period.granularity, rows);
        Ok(merged
            .into_iter()
            .map(|((hour, tenant), totals)| Row { hour, tenant, totals })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_period_is_read_in_utc_and_one_past_its_years_is_refused() {
        let p = Period::parse(Some("2026-12-01T02:00:00+02:00"), Some("2026-12-02"), None).unwrap();
        assert_eq!(rfc3339(p.from), "2026-12-01T00:00:00.000Z");
        let far = Period::parse(None, Some("9999-12-31T23:59:59-23:59"), None).unwrap_err();
        assert!(far.to_string().contains("is not a time"), "{far}");
    }
}
