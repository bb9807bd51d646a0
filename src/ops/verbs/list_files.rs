//! `list_files`: a folder under `/app/results`, some levels deep.

use sandbox_actors::files::{ListOptions, ResultsPath, MAX_LIST_DEPTH, MAX_LIST_ENTRIES};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::access::caller::Caller;
use crate::ops::args::{default_dest, in_range};
use crate::ops::error::OpsError;
use crate::ops::files::FileListing;
use crate::ops::route::forward_if_elsewhere;
use crate::ops::Ops;

/// What `list_files` does unless asked otherwise: enough to see a folder's
/// layout, few tokens.
pub const DEFAULT_LIST_DEPTH: u64 = 2;
pub const DEFAULT_LIST_ENTRIES: u64 = 200;

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ListFiles {
    /// The sandbox_id returned by create_sandbox.
    pub sandbox_id: String,
    /// A folder under /app/results, absolute or relative to it (default /app/results).
    #[serde(default = "default_dest")]
    pub path: String,
    /// Folder levels to list: 1 for the folder's own entries (default 2, at most 16).
    #[serde(default)]
    #[schemars(with = "u64")]
    pub depth: Option<u64>,
    /// Most entries returned (default 200, at most 1000).
    #[serde(default)]
    #[schemars(with = "u64")]
    pub max_entries: Option<u64>,
}

impl Ops {
    /// Lists a folder under `/app/results`, `depth` levels deep, at most
    /// `max_entries` entries.
    pub async fn list_files(&self, caller: &Caller, args: ListFiles) -> Result<FileListing, OpsError> {
        forward_if_elsewhere!(self, caller, "list_files", args, None);
        self.on_sandbox("list_files", &args.sandbox_id, |id| {
            self.listing(caller, id, &args.path, args.depth, args.max_entries)
        })
        .await
    }

    pub(super) async fn listing(
        &self,
        caller: &Caller,
        id: Uuid,
        path: &str,
        depth: Option<u64>,
        max_entries: Option<u64>,
    ) -> Result<FileListing, OpsError> {
        let options = ListOptions {
            depth: in_range("depth", depth, DEFAULT_LIST_DEPTH, MAX_LIST_DEPTH)?,
            max_entries: in_range("max_entries", max_entries, DEFAULT_LIST_ENTRIES, MAX_LIST_ENTRIES)?,
            files_only: false,
        };
        let folder = ResultsPath::parse(path)?;
        let listing = self
            .sandboxes
            .list_files(caller.scope(), id, folder.clone(), options)
            .await?;
        Ok(FileListing::new(&folder, listing, &self.links, id))
    }
}
