//! How a tool's outcome goes over MCP: its typed result as
//! `structuredContent` and as one pretty-printed JSON text item, plus a
//! `resource_link` item per artifact and an `image` item per image shown
//! inline; a failure of the tool itself as an `isError` result with the
//! error's message.

use base64::Engine;
use rmcp::model::{CallToolResult, ContentBlock, Resource};
use serde::Serialize;

use crate::access::caller::Caller;
use crate::ops::error::OpsError;
use crate::ops::files::{Read, ReadResult};
use crate::ops::inline_images::{ImageNote, InlineImage};
use crate::ops::results::{CommandResult, PythonResult};
use crate::ops::Ops;

/// A successful tool result: `value` as structured content and as
/// pretty-printed JSON text (`text` replaces the latter when given).
pub fn success<T: Serialize>(
    value: &T,
    text: Option<serde_json::Value>,
    links: Vec<(String, String)>,
) -> CallToolResult {
    let structured = serde_json::to_value(value).expect("results serialise");
    let text = serde_json::to_string_pretty(text.as_ref().unwrap_or(&structured)).expect("results serialise");
    let mut content = vec![ContentBlock::text(text)];
    for (uri, name) in links {
        let mime = mime_guess::from_path(&name).first().map(|m| m.to_string());
        let mut resource = Resource::new(uri, name);
        resource.mime_type = mime;
        content.push(ContentBlock::resource_link(resource));
    }
    let mut result = CallToolResult::success(content);
    result.structured_content = Some(structured);
    result
}

/// A failure of the tool itself, which the model reads (`isError: true`).
pub fn failure(err: &OpsError) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(err.to_string())])
}

/// A tool's outcome as the model reads it: a failure of the tool itself
/// becomes an `isError` result with the error's message.
pub fn reply<T: Serialize>(outcome: Result<T, OpsError>) -> CallToolResult {
    match outcome {
        Ok(value) => success(&value, None, vec![]),
        Err(e) => failure(&e),
    }
}

/// An image shown inline, as an `image` item.
pub fn image_item(image: InlineImage) -> ContentBlock {
    ContentBlock::image(
        base64::engine::general_purpose::STANDARD.encode(&image.data),
        image.mime,
    )
}

/// The result of a run, whose files are linked and whose images are shown.
pub trait RunArtifacts {
    /// The files the run created or changed, and their links.
    fn files(&self) -> (&[String], &[String]);
    fn set_images(&mut self, notes: Vec<ImageNote>);
}

impl RunArtifacts for PythonResult {
    fn files(&self) -> (&[String], &[String]) {
        (&self.files, &self.file_links)
    }

    fn set_images(&mut self, notes: Vec<ImageNote>) {
        self.images = notes;
    }
}

impl RunArtifacts for CommandResult {
    fn files(&self) -> (&[String], &[String]) {
        (&self.files, &self.file_links)
    }

    fn set_images(&mut self, notes: Vec<ImageNote>) {
        self.images = notes;
    }
}

/// A run's result: its files as resource links, then the images among
/// them as image items, on the configured budget.
pub async fn run_reply<T: Serialize + RunArtifacts>(
    ops: &Ops,
    caller: &Caller,
    raw_id: &str,
    ran: Result<T, OpsError>,
) -> CallToolResult {
    let mut result = match ran {
        Ok(result) => result,
        Err(e) => return failure(&e),
    };
    let images = ops.run_images(caller, raw_id, result.files().0).await;
    result.set_images(images.notes);
    let (files, links) = result.files();
    let links = links.iter().cloned().zip(files.iter().map(|f| file_name(f))).collect();
    let mut reply = success(&result, None, links);
    reply.content.extend(images.images.into_iter().map(image_item));
    reply
}

fn file_name(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).to_string()
}

/// A read's result: a text's window alone; any other file's link, then
/// an image's picture when it was fitted for inline display.
pub fn read_reply(read: Read) -> CallToolResult {
    if read.result.kind == "text" {
        return success(&read.result, None, vec![]);
    }
    let link = resource_link(&read.result);
    let mut reply = success(&read.result, None, vec![link]);
    reply.content.extend(read.image.map(image_item));
    reply
}

/// The `resource_link` item of a read file: its URL and name.
fn resource_link(result: &ReadResult) -> (String, String) {
    (result.link.clone(), file_name(&result.path))
}
