//! `GET /api/sandboxes/{id}/files` (REST and the web UI's file table):
//! every regular file of `/app/results`, with its download link.

use sandbox_actors::files::{ListOptions, ResultsPath, MAX_LIST_DEPTH, MAX_LIST_ENTRIES};
use serde::{Deserialize, Serialize};

use crate::access::caller::Caller;
use crate::ops::args::{parse_id, SandboxRef};
use crate::ops::error::OpsError;
use crate::ops::route::forward_if_elsewhere;
use crate::ops::Ops;

/// A file under `/app/results` with its download link.
#[derive(Serialize, Deserialize)]
pub struct LinkedFile {
    /// Relative to `/app/results`, `/`-separated.
    path: String,
    size: u64,
    /// Seconds since the Unix epoch.
    modified: i64,
    url: String,
}

#[derive(Serialize, Deserialize)]
pub struct FileList {
    files: Vec<LinkedFile>,
    /// More files exist than were listed.
    truncated: bool,
}

/// Every regular file of the results folder, as deep and as many as a
/// listing goes.
const ALL_FILES: ListOptions = ListOptions {
    depth: MAX_LIST_DEPTH,
    max_entries: MAX_LIST_ENTRIES,
    files_only: true,
};

impl Ops {
    pub async fn list_result_files(&self, caller: &Caller, args: SandboxRef) -> Result<FileList, OpsError> {
        forward_if_elsewhere!(self, caller, "list_result_files", args, None);
        let id = parse_id(&args.sandbox_id)?;
        let root = ResultsPath::parse("").expect("the folder itself");
        let listing = self.sandboxes.list_files(caller.scope(), id, root, ALL_FILES).await?;
        let files = listing
            .entries
            .into_iter()
            .map(|e| LinkedFile {
                url: self.links.artifact(id, &e.path),
                modified: e
                    .modified
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs() as i64),
                path: e.path,
                size: e.size,
            })
            .collect();
        Ok(FileList {
            files,
            truncated: listing.truncated,
        })
    }
}
