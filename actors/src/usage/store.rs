//! The hourly figures in the record store: one row per (hour, tenant), so
//! that old hours go in one sweep of keys, and an index by (tenant, hour),
//! so that one tenant's period is read without reading anyone else's.

use std::collections::HashMap;

use redb::{ReadableDatabase, ReadableTable, TableDefinition};

use super::{Row, Totals};
use crate::error::{Result, SandboxError, StoreError};
use crate::records::{blocking, to_json, RecordStore};

/// (start of the hour in Unix seconds, tenant) → [`Totals`] as JSON.
const USAGE: TableDefinition<(u64, &str), &[u8]> = TableDefinition::new("usage");
/// (tenant, hour): the hours for which a tenant has a row.
const BY_TENANT: TableDefinition<(&str, u64), ()> = TableDefinition::new("usage_by_tenant");

/// Rows one report may read: a year of hours of one tenant fits; an
/// administrator asking for every tenant over a long period is told to
/// narrow it.
pub const MAX_REPORT_ROWS: usize = 100_000;

fn decode(bytes: &[u8]) -> Result<Totals> {
    Ok(serde_json::from_slice(bytes).map_err(StoreError::Encoding)?)
}

pub(super) fn too_many() -> SandboxError {
    SandboxError::InvalidArgument(format!(
        "the period holds more than {MAX_REPORT_ROWS} hourly rows; ask for a shorter one or for one tenant"
    ))
}

impl RecordStore {
    /// Adds `rows` to what is kept for their hours and tenants, and removes
    /// the hours before `keep_from`, in one transaction.
    pub(crate) async fn add_usage(&self, rows: Vec<Row>, keep_from: u64) -> Result<()> {
        let db = self.db.clone();
        blocking(move || {
            let txn = db.begin_write()?;
            {
                let mut table = txn.open_table(USAGE)?;
                let mut index = txn.open_table(BY_TENANT)?;
                for row in rows.iter().filter(|r| r.hour >= keep_from) {
                    let key = (row.hour, row.tenant.as_str());
                    let mut totals = match table.get(key)? {
                        Some(v) => decode(v.value())?,
                        None => Totals::default(),
                    };
                    totals.add(&row.totals);
                    table.insert(key, to_json(&totals)?.as_slice())?;
                    index.insert((row.tenant.as_str(), row.hour), ())?;
                }
                let mut gone = vec![];
                for entry in table.extract_from_if(..(keep_from, ""), |_, _| true)? {
                    let (key, _) = entry?;
                    let (hour, tenant) = key.value();
                    gone.push((tenant.to_string(), hour));
                }
                for (tenant, hour) in gone {
                    index.remove((tenant.as_str(), hour))?;
                }
            }
            txn.commit()?;
            Ok(())
        })
        .await
    }

    /// Each tenant's totals over the hours from `from` on (however many rows
    /// that is: it keeps one sum per tenant).
    pub(crate) async fn usage_since(&self, from: u64) -> Result<HashMap<String, Totals>> {
        let db = self.db.clone();
        blocking(move || {
            let txn = db.begin_read()?;
            let table = match txn.open_table(USAGE) {
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(HashMap::new()),
                t => t?,
            };
            let mut sums: HashMap<String, Totals> = HashMap::new();
            for entry in table.range((from, "")..)? {
                let (key, value) = entry?;
                let (_, tenant) = key.value();
                let totals = decode(value.value())?;
                match sums.get_mut(tenant) {
                    Some(sum) => sum.add(&totals),
                    None => {
                        sums.insert(tenant.to_string(), totals);
                    }
                }
            }
            Ok(sums)
        })
        .await
    }

    /// The rows of the hours from `from` up to (not including) `to`, of one
    /// tenant (by its index) or of all, in order of hour then tenant; at
    /// most [`MAX_REPORT_ROWS`].
    pub(crate) async fn usage(&self, from: u64, to: u64, tenant: Option<String>) -> Result<Vec<Row>> {
        let db = self.db.clone();
        blocking(move || {
            let txn = db.begin_read()?;
            let missing = |e: &redb::TableError| matches!(e, redb::TableError::TableDoesNotExist(_));
            let table = match txn.open_table(USAGE) {
                Err(e) if missing(&e) => return Ok(vec![]),
                t => t?,
            };
            let mut out = vec![];
            let mut push = |hour: u64, tenant: &str, value: &[u8]| -> Result<()> {
                if out.len() == MAX_REPORT_ROWS {
                    return Err(too_many());
                }
                out.push(Row {
                    hour,
                    tenant: tenant.to_string(),
                    totals: decode(value)?,
                });
                Ok(())
            };
            match tenant {
                Some(tenant) => {
                    let index = match txn.open_table(BY_TENANT) {
                        Err(e) if missing(&e) => return Ok(vec![]),
                        t => t?,
                    };
                    for entry in index.range((tenant.as_str(), from)..(tenant.as_str(), to))? {
                        let (_, hour) = entry?.0.value();
                        if let Some(v) = table.get((hour, tenant.as_str()))? {
                            push(hour, &tenant, v.value())?;
                        }
                    }
                }
                None => {
                    for entry in table.range((from, "")..(to, ""))? {
                        let (key, value) = entry?;
                        let (hour, tenant) = key.value();
                        push(hour, tenant, value.value())?;
                    }
                }
            }
            Ok(out)
        })
        .await
    }
}
