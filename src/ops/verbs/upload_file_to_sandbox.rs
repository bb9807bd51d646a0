//! `upload_file_to_sandbox`: a file or folder from an allowed host folder
//! (MCP), or the bytes a browser sent (REST), into a folder of the sandbox.

use bytes::Bytes;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::access::caller::Caller;
use crate::ops::args::default_dest;
use crate::ops::error::OpsError;
use crate::ops::results::UploadResult;
use crate::ops::route::{forward_if_elsewhere, Holder};
use crate::ops::Ops;

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct UploadFileToSandbox {
    /// The sandbox_id returned by create_sandbox.
    pub sandbox_id: String,
    /// Absolute path of a file or folder on the server's host, inside a folder the server allows uploads from.
    pub local_file_path: String,
    /// Folder in the sandbox to copy into (default /app/results).
    #[serde(default = "default_dest")]
    pub dest_path: String,
}

/// A file sent in the request: its name in the sandbox and where it goes
/// (the body is its bytes).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UploadBytes {
    /// The file's name in the sandbox.
    pub name: String,
    #[serde(default = "default_dest")]
    pub dest: String,
}

/// A browser upload forwarded to the node holding the sandbox (the bytes
/// follow these arguments).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ForwardedUpload {
    pub sandbox_id: String,
    pub upload: UploadBytes,
}

impl Ops {
    /// Copies a file or folder from an allowed host folder (of the node
    /// that holds the sandbox, in a cluster).
    pub async fn upload_file_to_sandbox(
        &self,
        caller: &Caller,
        args: UploadFileToSandbox,
    ) -> Result<UploadResult, OpsError> {
        forward_if_elsewhere!(self, caller, "upload_file_to_sandbox", args, None);
        self.on_sandbox("upload_file_to_sandbox", &args.sandbox_id, |id| async move {
            let up = self
                .sandboxes
                .upload(caller.scope(), id, &args.local_file_path, &args.dest_path)
                .await?;
            Ok(UploadResult::new(up, id))
        })
        .await
    }

    /// Writes bytes the caller sent (a browser upload) as a file.
    pub async fn upload_bytes(
        &self,
        caller: &Caller,
        raw_id: &str,
        args: UploadBytes,
        data: Bytes,
    ) -> Result<UploadResult, OpsError> {
        if let Holder::Node { name, url } = self.holder(caller, raw_id).await? {
            let args = ForwardedUpload {
                sandbox_id: raw_id.to_string(),
                upload: args,
            };
            return self
                .forward_with_bytes((&name, &url), "upload_bytes", caller, &args, data)
                .await;
        }
        self.on_sandbox("upload_file_to_sandbox", raw_id, |id| async move {
            let up = self
                .sandboxes
                .upload_bytes(caller.scope(), id, &args.name, data, &args.dest)
                .await?;
            Ok(UploadResult::new(up, id))
        })
        .await
    }
}
