//! How a tool's outcome goes over MCP: its typed result as
//! `structuredContent` and as one pretty-printed JSON text item, plus a
//! `resource_link` item per artifact; a failure of the tool itself as an
//! `isError` result with the error's message.

use rmcp::model::{CallToolResult, ContentBlock, Resource};
use sandbox_actors::SandboxError;
use serde::Serialize;

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
pub fn failure(err: &SandboxError) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(err.to_string())])
}
