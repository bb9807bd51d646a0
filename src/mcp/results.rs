//! How a tool's outcome goes over MCP: its typed result as
//! `structuredContent` and as one pretty-printed JSON text item, plus a
//! `resource_link` item per artifact and an `image` item per image shown
//! inline; a failure of the tool itself as an `isError` result with the
//! error's message.

use std::collections::HashMap;

use base64::Engine;
use rmcp::model::{CallToolResult, ContentBlock, Resource};
use serde::Serialize;

use crate::access::caller::Caller;
use crate::ops::error::OpsError;
use crate::ops::files::{Read, ReadResult};
use crate::ops::inline_images::{ImageNote, InlineImage};
use crate::ops::outputs::Output;
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
    content.extend(links.into_iter().map(|(uri, name)| link_item(uri, name)));
    let mut result = CallToolResult::success(content);
    result.structured_content = Some(structured);
    result
}

/// A link to a file, as a `resource_link` item.
fn link_item(uri: String, name: String) -> ContentBlock {
    let mime = mime_guess::from_path(&name).first().map(|m| m.to_string());
    let mut resource = Resource::new(uri, name);
    resource.mime_type = mime;
    ContentBlock::resource_link(resource)
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
    /// What the run showed besides printed text (Python runs).
    fn outputs(&self) -> &[Output] {
        &[]
    }
    fn set_images(&mut self, notes: Vec<ImageNote>);
}

impl RunArtifacts for PythonResult {
    fn files(&self) -> (&[String], &[String]) {
        (&self.files, &self.file_links)
    }

    fn outputs(&self) -> &[Output] {
        &self.outputs
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

/// A run's result, as a notebook shows a cell: the result as JSON (the
/// outputs' texts and links left out of it, as they follow), then each output in
/// order (its text as a text item; an image as its link and, within the
/// inline budget, its picture), then the files' links and the pictures of
/// the images among them.
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
    let shown: Vec<String> = result.outputs().iter().filter_map(|o| o.output.path.clone()).collect();
    let images = ops.run_images(caller, raw_id, &shown, result.files().0).await;
    let inline: Vec<String> = images
        .notes
        .iter()
        .filter(|n| n.inline)
        .map(|n| n.path.clone())
        .collect();
    let mut pictures: HashMap<String, InlineImage> = inline.iter().cloned().zip(images.images).collect();
    result.set_images(images.notes);
    // A result without outputs is its JSON alone, made once.
    let text = (!result.outputs().is_empty()).then(|| {
        let mut text = serde_json::to_value(&result).expect("results serialise");
        for output in text
            .get_mut("outputs")
            .and_then(|o| o.as_array_mut())
            .into_iter()
            .flatten()
        {
            if let Some(fields) = output.as_object_mut() {
                // Both follow as items of their own.
                fields.remove("text");
                fields.remove("link");
            }
        }
        text
    });
    let mut reply = success(&result, text, vec![]);
    for Output { output, link } in result.outputs() {
        if let Some(text) = &output.text {
            reply.content.push(ContentBlock::text(text.clone()));
        }
        if let (Some(path), Some(link)) = (&output.path, link) {
            reply.content.push(link_item(link.clone(), file_name(path)));
            if let Some(picture) = pictures.remove(path) {
                reply.content.push(image_item(picture));
            }
        }
    }
    let (files, links) = result.files();
    for (link, file) in links.iter().zip(files) {
        reply.content.push(link_item(link.clone(), file_name(file)));
    }
    for path in inline {
        if let Some(picture) = pictures.remove(&path) {
            reply.content.push(image_item(picture));
        }
    }
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
