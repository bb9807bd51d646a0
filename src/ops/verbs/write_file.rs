//! `write_file`: text, or bytes sent as base64, written as a file under
//! `/app/results`, in turn with the sandbox's other calls.

use base64::Engine;
use sandbox_actors::files::{ResultsPath, MAX_WRITE_BYTES};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::access::caller::Caller;
use crate::ops::error::OpsError;
use crate::ops::files::{Encoding, WriteResult};
use crate::ops::route::forward_if_elsewhere;
use crate::ops::Ops;

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct WriteFile {
    /// The sandbox_id returned by create_sandbox.
    pub sandbox_id: String,
    /// The file to write under /app/results, absolute or relative to it; missing folders are made.
    pub path: String,
    /// What to write (at most 1 MiB): text, or with `encoding` `base64` the
    /// base64 of the bytes (a picture, a parquet file, a zip); an existing
    /// file is replaced.
    pub content: String,
    /// `utf-8` (the default): `content` is the text; `base64`: `content` is
    /// the bytes in standard base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<Encoding>,
}

/// The bytes `content` stands for; base64 longer than the largest write
/// could take is refused before it is decoded.
fn bytes_of(content: String, encoding: Option<Encoding>) -> Result<Vec<u8>, OpsError> {
    match encoding.unwrap_or(Encoding::Utf8) {
        Encoding::Utf8 => Ok(content.into_bytes()),
        Encoding::Base64 if content.len() > MAX_WRITE_BYTES.div_ceil(3) * 4 => Err(OpsError::InvalidArgument(format!(
            "content is longer than the base64 of {MAX_WRITE_BYTES} bytes, the most write_file writes; upload a \
             larger file with upload_file_to_sandbox"
        ))),
        Encoding::Base64 => base64::engine::general_purpose::STANDARD
            .decode(content.trim())
            .map_err(|e| OpsError::InvalidArgument(format!("content is not standard base64 ({e})"))),
    }
}

impl Ops {
    pub async fn write_file(&self, caller: &Caller, args: WriteFile) -> Result<WriteResult, OpsError> {
        forward_if_elsewhere!(self, caller, "write_file", args, None);
        self.on_sandbox("write_file", &args.sandbox_id, |id| async move {
            let target = ResultsPath::parse(&args.path)?;
            let data = bytes_of(args.content, args.encoding)?;
            let size = data.len() as u64;
            let written = self.sandboxes.write_file(caller.scope(), id, target, data).await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_content_is_decoded_and_bounded_before_decoding() {
        let bytes = bytes_of("AAEC/w==".into(), Some(Encoding::Base64)).unwrap();
        assert_eq!(bytes, [0, 1, 2, 255]);
        assert_eq!(bytes_of("é".into(), None).unwrap(), "é".as_bytes());
        assert!(matches!(
            bytes_of("not base64!".into(), Some(Encoding::Base64)),
            Err(OpsError::InvalidArgument(_))
        ));
        let over = "A".repeat(MAX_WRITE_BYTES.div_ceil(3) * 4 + 4);
        let refused = bytes_of(over, Some(Encoding::Base64)).unwrap_err().to_string();
        assert!(refused.contains("upload_file_to_sandbox"), "{refused}");
    }
}
