//! `write_file`: text written as a file under `/app/results`, in turn with
//! the sandbox's other calls.

use sandbox_actors::files::ResultsPath;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::access::caller::Caller;
use crate::ops::error::OpsError;
use crate::ops::files::WriteResult;
use crate::ops::route::forward_if_elsewhere;
use crate::ops::Ops;

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct WriteFile {
    /// The sandbox_id returned by create_sandbox.
    pub sandbox_id: String,
    /// The file to write under /app/results, absolute or relative to it; missing folders are made.
    pub path: String,
    /// The text to write (UTF-8, at most 1 MiB); an existing file is replaced.
    pub content: String,
}

impl Ops {
    pub async fn write_file(&self, caller: &Caller, args: WriteFile) -> Result<WriteResult, OpsError> {
        forward_if_elsewhere!(self, caller, "write_file", args, None);
        self.on_sandbox("write_file", &args.sandbox_id, |id| async move {
            let target = ResultsPath::parse(&args.path)?;
            let size = args.content.len() as u64;
            let written = self
                .sandboxes
                .write_file(caller.scope(), id, target, args.content.into_bytes())
                .await?;
            Ok(WriteResult {
                success: true,
                link: self.links.artifact(id, &written.path),
                message: format!("Wrote {size} bytes to {}", written.path),
                path: written.path,
                size,
            })
        })
        .await
    }
}
