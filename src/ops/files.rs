//! What the file tools return (`list_files`, `read_file`, `write_file`):
//! one typed struct per tool, paths absolute in the sandbox, each file with
//! its download link.

use std::fs::File;

use std::time::{Instant, SystemTime};

use base64::Engine;
use sandbox_actors::files::{Content, EntryKind, FileRead, Listing, ResultsPath};
use sandbox_runtime::agent::RESULTS_IN_CONTAINER;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::access::artifact_links::ArtifactLinks;
use crate::ops::inline_images::{self, ImageNote, InlineImage, Inliner, NotInlined};
use crate::ops::timestamps::rfc3339;

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct FileListing {
    /// The folder listed, absolute in the sandbox.
    pub path: String,
    /// Sorted by path; the shallowest entries first when cut.
    pub entries: Vec<ListedEntry>,
    /// More entries exist than were listed: list a subfolder, or raise max_entries.
    pub truncated: bool,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ListedEntry {
    /// Absolute in the sandbox; pass it to read_file.
    pub path: String,
    /// file, folder, link (never followed) or other (a FIFO, socket or device).
    #[serde(rename = "type")]
    pub kind: String,
    /// In bytes (0 for a folder).
    pub size: u64,
    /// RFC 3339, UTC.
    pub modified: String,
    /// Download link (files only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
}

impl FileListing {
    pub fn new(folder: &ResultsPath, listing: Listing, links: &ArtifactLinks, sandbox: Uuid) -> Self {
        let entries = listing
            .entries
            .into_iter()
            .map(|e| {
                let path = format!("{RESULTS_IN_CONTAINER}/{}", e.path);
                let kind = match e.kind {
                    EntryKind::File => "file",
                    EntryKind::Folder => "folder",
                    EntryKind::Symlink => "link",
                    EntryKind::Other => "other",
                };
                ListedEntry {
                    link: (e.kind == EntryKind::File).then(|| links.artifact(sandbox, &path)),
                    path,
                    kind: kind.into(),
                    size: e.size,
                    modified: modified(e.modified),
                }
            })
            .collect();
        Self {
            path: folder.absolute(),
            entries,
            truncated: listing.truncated,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ReadResult {
    /// Absolute in the sandbox.
    pub path: String,
    /// text, image or binary; bytes when read with `encoding` `base64`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Of the whole file, in bytes.
    pub size: u64,
    /// RFC 3339, UTC.
    pub modified: String,
    pub mime_type: String,
    /// Download link of the whole file.
    pub link: String,
    /// The text from `offset` (text files); with `encoding` `base64`, the
    /// bytes from `offset` in standard base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// `base64` when `content` is bytes in base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<Encoding>,
    /// Byte offset where `content` starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// Pass as `offset` to read on; absent once the end is reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<u64>,
    /// The file's last lines, on a first read of a file larger than one window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<String>,
    /// How to see a file that is not text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// An image: whether it follows as an `image` item (after the link), at
    /// what size, or why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageNote>,
}

/// A read, ready to present (and to travel from the node holding the
/// sandbox): an image is already fitted for inline display, or its note
/// says why not.
#[derive(Debug, Serialize, Deserialize)]
pub struct Read {
    pub result: ReadResult,
    pub image: Option<InlineImage>,
}

impl Read {
    /// The tool's answer to `read`; an image is shown inline by `images`,
    /// on the budget of a run's single image.
    pub async fn new(read: FileRead, links: &ArtifactLinks, images: &Inliner, sandbox: Uuid) -> Self {
        let path = read.path.absolute();
        let by_name = mime_guess::from_path(&path).first().map(|m| m.to_string());
        let mut result = ReadResult {
            link: links.artifact(sandbox, &path),
            path,
            kind: String::new(),
            size: read.size,
            modified: modified(read.modified),
            mime_type: String::new(),
            content: None,
            encoding: None,
            offset: None,
            next_offset: None,
            tail: None,
            message: None,
            image: None,
        };
        let image = match read.content {
            Content::Text(w) => {
                result.kind = "text".into();
                result.mime_type = by_name.unwrap_or_else(|| "text/plain".into());
                result.content = Some(w.text);
                result.offset = Some(w.offset);
                result.next_offset = w.next_offset;
                result.tail = w.tail;
                None
            }
            Content::Image { mime, file } => {
                result.kind = "image".into();
                result.mime_type = mime.into();
                fit_image(&mut result, file, images).await
            }
            Content::Bytes(w) => {
                result.kind = "bytes".into();
                result.mime_type = by_name.unwrap_or_else(|| "application/octet-stream".into());
                result.content = Some(base64::engine::general_purpose::STANDARD.encode(&w.data));
                result.encoding = Some(Encoding::Base64);
                result.offset = Some(w.offset);
                result.next_offset = w.next_offset;
                None
            }
            Content::Binary => {
                result.kind = "binary".into();
                result.mime_type = by_name.unwrap_or_else(|| "application/octet-stream".into());
                result.message =
                    Some("A binary file: download it from link, or read its bytes with encoding base64.".into());
                None
            }
        };
        Self { result, image }
    }
}

/// The one place an image read is fitted for inline display (`file` is
/// opened safely beneath the sandbox's folder): the image when it fits
/// `results.inline_image_max_bytes` in time, otherwise `None`, and the
/// result's note and message say which.
async fn fit_image(result: &mut ReadResult, file: File, images: &Inliner) -> Option<InlineImage> {
    let deadline = Instant::now() + inline_images::DEADLINE;
    let shown = match result.mime_type.as_str() {
        "image/svg+xml" => Err(NotInlined::Svg),
        _ => images.image_file(file, images.max_bytes(), deadline).await,
    };
    let (note, image) = match shown {
        Ok(image) => {
            result.message = Some("An image, shown below (downscaled to fit when large); link serves the file.".into());
            let note = ImageNote {
                path: result.path.clone(),
                inline: true,
                width: Some(image.width),
                height: Some(image.height),
                reason: None,
            };
            (note, Some(image))
        }
        Err(why) => {
            tracing::debug!(path = result.path, reason = %why, "image not inlined");
            result.message = Some(format!("An image, not shown inline ({why}): open link to see it."));
            let note = ImageNote {
                path: result.path.clone(),
                inline: false,
                width: None,
                height: None,
                reason: Some(why.to_string()),
            };
            (note, None)
        }
    };
    result.image = Some(note);
    image
}

/// How a file's content travels in `write_file` and `read_file`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Encoding {
    #[serde(rename = "utf-8")]
    Utf8,
    #[serde(rename = "base64")]
    Base64,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct WriteResult {
    pub success: bool,
    /// Absolute in the sandbox.
    pub path: String,
    /// Bytes written.
    pub size: u64,
    /// Download link.
    pub link: String,
    pub message: String,
}

fn modified(t: SystemTime) -> String {
    rfc3339(time::OffsetDateTime::from(t))
}
