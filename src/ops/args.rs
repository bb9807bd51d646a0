//! What the verbs' arguments share: the references to a sandbox, one of its
//! snapshots or a package (one type each, read by the MCP tools and the REST
//! routes alike), and the checks that turn raw arguments into typed values.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::ops::error::OpsError;

type Result<T> = std::result::Result<T, OpsError>;

/// A sandbox, by the id `create_sandbox` gave it.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct SandboxRef {
    /// The sandbox_id returned by create_sandbox.
    pub sandbox_id: String,
}

/// One of a sandbox's snapshots.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct SnapshotRef {
    /// The sandbox_id returned by create_sandbox.
    pub sandbox_id: String,
    /// The snapshot_id returned by snapshot_sandbox or list_snapshots.
    pub snapshot_id: String,
}

/// A package of a sandbox: to install, or whose installation to check.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct PackageRef {
    /// The sandbox_id returned by create_sandbox.
    pub sandbox_id: String,
    /// A requirement such as "numpy" or "pandas==2.2.2"; several may be separated by spaces.
    pub package_name: String,
}

/// The folder files go to unless a call names another.
pub fn default_dest() -> String {
    "/app/results".into()
}

pub fn parse_id(raw: &str) -> Result<Uuid> {
    Uuid::parse_str(raw.trim()).map_err(|_| {
        OpsError::InvalidArgument(format!(
            "sandbox_id {raw:?} is not a sandbox id; use the sandbox_id from create_sandbox or list_sandboxes"
        ))
    })
}

pub fn parse_snapshot_id(raw: &str) -> Result<Uuid> {
    Uuid::parse_str(raw.trim()).map_err(|_| {
        OpsError::InvalidArgument(format!(
            "snapshot_id {raw:?} is not a snapshot id; use the snapshot_id from snapshot_sandbox or list_snapshots"
        ))
    })
}

/// `value` (default `default`) when it lies in `1..=max`.
pub fn in_range(what: &str, value: Option<u64>, default: u64, max: usize) -> Result<usize> {
    match value.unwrap_or(default) {
        v @ 1.. if v <= max as u64 => Ok(v as usize),
        v => Err(OpsError::InvalidArgument(format!("{what} is {v}; give 1 to {max}"))),
    }
}

pub fn check_len(what: &str, value: &str, max: usize) -> Result<()> {
    match value.len() {
        len if len > max => Err(OpsError::InvalidArgument(format!(
            "{what} is {len} bytes; at most {max} are accepted"
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_ranges_are_checked_with_a_message_that_names_the_argument() {
        assert!(parse_id(" 0e0f53f1-5f3a-4d7e-9a53-2a1c1b9ad1c7 ").is_ok());
        let bad = parse_id("../etc").unwrap_err().to_string();
        assert!(bad.contains("sandbox_id") && bad.contains("create_sandbox"), "{bad}");
        assert!(parse_snapshot_id("x").unwrap_err().to_string().contains("snapshot_id"));
        assert_eq!(in_range("count", None, 1, 16).unwrap(), 1);
        assert!(in_range("count", Some(0), 1, 16).is_err());
        assert!(in_range("count", Some(17), 1, 16)
            .unwrap_err()
            .to_string()
            .contains("give 1 to 16"));
        assert!(check_len("code", "abc", 2).unwrap_err().to_string().contains("3 bytes"));
    }
}
