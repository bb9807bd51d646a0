//! The sandbox view as an MCP App (the `io.modelcontextprotocol/ui`
//! extension, SEP-1865): one `ui://` resource, an HTML page that a host
//! renders in a sandboxed frame beside the results of `execute_python_code`,
//! `list_files` and `read_file`. It shows the result it came with (output,
//! images), then asks for the rest through the host, with the caller's own
//! session: the app-only tool `view_sandbox` (files with links, packages,
//! recent calls) and `read_file` for a file clicked. It holds no key and
//! reaches nothing but its host (the host's default content security policy
//! lets it load nothing else).
//!
//! Offered only to clients that declare the extension: others list neither
//! the resource, the tools' `_meta.ui` nor `view_sandbox`, and their results
//! stay as they were.

use rmcp::model::{Resource, ResourceContents, Tool};
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use serde_json::{json, Map, Value};

/// The extension's identifier in a client's capabilities.
pub const EXTENSION: &str = "io.modelcontextprotocol/ui";
/// The view's address, named in the tools' `_meta.ui.resourceUri`.
pub const VIEW_URI: &str = "ui://mcp-sandbox/sandbox-view";
pub const VIEW_MIME: &str = "text/html;profile=mcp-app";
/// The tool the view calls for what it shows; hidden from the model.
pub const VIEW_TOOL: &str = "view_sandbox";
/// The tools whose results the view accompanies.
const VIEWED: [&str; 3] = ["execute_python_code", "list_files", "read_file"];
/// The page: markup, style and script in one file (the host's default
/// policy allows inline script and style, and no other source).
const VIEW_HTML: &str = include_str!("view.html");

/// Whether the client declared the extension (with the HTML profile, or
/// with no settings at all).
pub fn declared(ctx: &RequestContext<RoleServer>) -> bool {
    let Some(caps) = ctx.client_capabilities() else {
        return false;
    };
    let Some(ui) = caps.extensions.as_ref().and_then(|e| e.get(EXTENSION)) else {
        return false;
    };
    match ui.get("mimeTypes") {
        None => true,
        Some(Value::Array(types)) => types.iter().any(|t| t.as_str() == Some(VIEW_MIME)),
        Some(_) => false,
    }
}

/// The tool list as this client sees it: for a client of the extension,
/// the viewed tools name the view and `view_sandbox` is for the view alone;
/// for any other, `view_sandbox` is left out.
pub fn offer(tools: &mut Vec<Tool>, declared: bool) {
    if !declared {
        tools.retain(|t| t.name != VIEW_TOOL);
        return;
    }
    for tool in tools.iter_mut() {
        let ui = match tool.name.as_ref() {
            name if VIEWED.contains(&name) => json!({ "resourceUri": VIEW_URI }),
            VIEW_TOOL => json!({ "resourceUri": VIEW_URI, "visibility": ["app"] }),
            _ => continue,
        };
        let meta = tool.meta.get_or_insert_with(Default::default);
        meta.0.insert("ui".into(), ui);
        // The key hosts read before the extension's final revision.
        meta.0.insert("ui/resourceUri".into(), json!(VIEW_URI));
    }
}

fn resource_meta() -> Map<String, Value> {
    let ui = json!({ "prefersBorder": true, "csp": { "connectDomains": [], "resourceDomains": [] } });
    Map::from_iter([("ui".to_string(), ui)])
}

/// The view as `resources/list` shows it.
pub fn resource() -> Resource {
    let mut resource = Resource::new(VIEW_URI, "sandbox-view")
        .with_title("Sandbox")
        .with_description("The sandbox of a call: its last run's output and images, files, packages and recent calls")
        .with_mime_type(VIEW_MIME);
    resource.meta = Some(rmcp::model::MetaObject(resource_meta()));
    resource
}

/// The view's page, for `resources/read` of [`VIEW_URI`].
pub fn contents() -> ResourceContents {
    ResourceContents::TextResourceContents {
        uri: VIEW_URI.into(),
        mime_type: Some(VIEW_MIME.into()),
        text: VIEW_HTML.into(),
        meta: Some(rmcp::model::MetaObject(resource_meta())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &'static str) -> Tool {
        Tool::new(name, "d", std::sync::Arc::new(Default::default()))
    }

    #[test]
    fn only_clients_of_the_extension_are_offered_the_view() {
        let all = || vec![tool("execute_python_code"), tool("create_sandbox"), tool(VIEW_TOOL)];
        let mut plain = all();
        offer(&mut plain, false);
        let names: Vec<_> = plain.iter().map(|t| t.name.as_ref()).collect();
        assert_eq!(names, ["execute_python_code", "create_sandbox"]);
        assert!(plain.iter().all(|t| t.meta.is_none()));

        let mut apps = all();
        offer(&mut apps, true);
        let ui = |t: &Tool| t.meta.as_ref().and_then(|m| m.0.get("ui").cloned());
        assert_eq!(ui(&apps[0]), Some(json!({ "resourceUri": VIEW_URI })));
        assert_eq!(ui(&apps[1]), None);
        assert_eq!(ui(&apps[2]).unwrap()["visibility"], json!(["app"]));
        assert_eq!(apps[0].meta.as_ref().unwrap().0["ui/resourceUri"], json!(VIEW_URI));
    }

    #[test]
    fn the_page_renders_sandbox_text_as_text() {
        // Everything shown comes from a hostile sandbox: the page never
        // parses it as HTML.
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "srcdoc",
            "eval(",
            "new Function",
            "setAttribute",
            "location",
            ".href",
        ] {
            assert!(!VIEW_HTML.contains(sink), "{sink}");
        }
        assert!(VIEW_HTML.contains("ui/initialize"));
    }
}
