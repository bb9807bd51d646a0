//! `read_file`: a window of a file under `/app/results`, as text or as
//! base64 bytes.

use sandbox_actors::files::{ResultsPath, Window, MAX_READ_BYTES};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::access::caller::Caller;
use crate::ops::args::in_range;
use crate::ops::error::OpsError;
use crate::ops::files::{Encoding, Read};
use crate::ops::route::forward_if_elsewhere;
use crate::ops::Ops;

/// What `read_file` returns unless asked otherwise: a screenful of text.
pub const DEFAULT_READ_BYTES: u64 = 16 * 1024;
/// The same for bytes in base64: a reply goes to the client twice (as
/// text and as structured content), so about 175 KB unless it asks for
/// more.
pub const DEFAULT_BYTES_READ: u64 = 64 * 1024;

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ReadFile {
    /// The sandbox_id returned by create_sandbox.
    pub sandbox_id: String,
    /// A file under /app/results, absolute or relative to it.
    pub path: String,
    /// Byte offset to start at (default 0); pass next_offset from the previous read to continue.
    #[serde(default)]
    #[schemars(with = "u64")]
    pub offset: Option<u64>,
    /// Most bytes returned (default 16384 of text, 65536 of base64; at most 262144).
    #[serde(default)]
    #[schemars(with = "u64")]
    pub max_bytes: Option<u64>,
    /// Stop after this many lines (default: no line limit; text only).
    #[serde(default)]
    #[schemars(with = "u64")]
    pub max_lines: Option<u64>,
    /// `utf-8` (the default): text, or what kind of file it is; `base64`:
    /// the bytes themselves, of any file, in standard base64 (download a
    /// binary by reading on from next_offset until it is absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<Encoding>,
}

impl Ops {
    /// Reads a file under `/app/results`: text from `offset`, at most
    /// `max_bytes` bytes and `max_lines` lines (0 or none: no line limit).
    pub async fn read_file(&self, caller: &Caller, args: ReadFile) -> Result<Read, OpsError> {
        forward_if_elsewhere!(self, caller, "read_file", args, None);
        self.on_sandbox("read_file", &args.sandbox_id, |id| async move {
            let bytes = args.encoding == Some(Encoding::Base64);
            let default = match bytes {
                true => DEFAULT_BYTES_READ,
                false => DEFAULT_READ_BYTES,
            };
            let window = Window {
                offset: args.offset.unwrap_or(0),
                max_bytes: in_range("max_bytes", args.max_bytes, default, MAX_READ_BYTES)?,
                max_lines: usize::try_from(args.max_lines.unwrap_or(0)).unwrap_or(usize::MAX),
                bytes,
            };
            let target = ResultsPath::parse(&args.path)?;
            let read = self.sandboxes.read_file(caller.scope(), id, target, window).await?;
            Ok(Read::new(read, &self.links, &self.images, id).await)
        })
        .await
    }
}
