//! The sandbox view (MCP Apps): offered to clients that declare the
//! extension only, its page served as a `ui://` resource, and its own tool
//! answering for the caller's sandboxes alone.

use rmcp::model::{ClientCapabilities, ReadResourceRequestParams, ResourceContents};
use serde_json::{json, Map};

use super::App;
use crate::access::caller::Caller;
use crate::mcp::app::{EXTENSION, VIEW_MIME, VIEW_TOOL, VIEW_URI};

fn apps() -> ClientCapabilities {
    let settings = Map::from_iter([("mimeTypes".to_string(), json!([VIEW_MIME]))]);
    let mut capabilities = ClientCapabilities::default();
    capabilities.extensions = Some([(EXTENSION.to_string(), settings)].into());
    capabilities
}

#[tokio::test(start_paused = true)]
async fn a_client_of_mcp_apps_is_offered_the_view_and_others_see_todays_tools() {
    let app = App::start(&[]).await;
    let plain = app.client(Caller::tenant("alice", false), false).await;
    let tools = plain.0.list_all_tools().await.unwrap();
    assert!(tools.iter().all(|t| t.name != VIEW_TOOL && t.meta.is_none()));
    assert!(plain.0.list_all_resources().await.unwrap().is_empty());
    let id = plain.create().await;
    let hidden = plain
        .0
        .call_tool(super::params(VIEW_TOOL, json!({"sandbox_id": id})))
        .await;
    assert!(hidden.is_err(), "a tool not offered is not answered: {hidden:?}");

    let host = app.client_with(Caller::tenant("alice", false), apps()).await;
    let tools = host.0.list_all_tools().await.unwrap();
    let ui = |name: &str| {
        let tool = tools.iter().find(|t| t.name == name).expect(name);
        tool.meta.as_ref().and_then(|m| m.0.get("ui").cloned())
    };
    for viewed in ["execute_python_code", "list_files", "read_file"] {
        assert_eq!(ui(viewed).unwrap()["resourceUri"], VIEW_URI, "{viewed}");
    }
    assert_eq!(ui("create_sandbox"), None);
    assert_eq!(ui(VIEW_TOOL).unwrap()["visibility"], json!(["app"]));

    let listed = host.0.list_all_resources().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].uri, VIEW_URI);
    assert_eq!(listed[0].mime_type.as_deref(), Some(VIEW_MIME));
    let read = host
        .0
        .read_resource(ReadResourceRequestParams::new(VIEW_URI))
        .await
        .unwrap();
    let ResourceContents::TextResourceContents { mime_type, text, .. } = &read.contents[0] else {
        panic!("the view is text");
    };
    assert_eq!(mime_type.as_deref(), Some(VIEW_MIME));
    assert!(text.starts_with("<!doctype html>"));
    let missing = host
        .0
        .read_resource(ReadResourceRequestParams::new("ui://mcp-sandbox/other"))
        .await;
    assert!(missing.is_err());
}

#[tokio::test(start_paused = true)]
async fn the_views_tool_shows_the_callers_sandbox_and_no_one_elses() {
    let app = App::start(&[]).await;
    let alice = app.client_with(Caller::tenant("alice", false), apps()).await;
    let bob = app.client_with(Caller::tenant("bob", false), apps()).await;
    let id = alice.create().await;
    // The test runtime writes no files: put one where the sandbox's would be.
    let caller = Caller::tenant("alice", false);
    let root = app
        .ops
        .sandboxes
        .results_dir(caller.scope(), id.parse().unwrap())
        .await
        .unwrap();
    std::fs::create_dir_all(root.join("notes")).unwrap();
    std::fs::write(root.join("notes/a.txt"), "hello").unwrap();
    alice
        .ok("execute_python_code", json!({"sandbox_id": id, "code": "echo ran"}))
        .await;

    let view = alice.ok(VIEW_TOOL, json!({"sandbox_id": id})).await;
    assert_eq!(view["sandbox"]["sandbox_id"], json!(id));
    let paths: Vec<_> = view["files"]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap().to_string())
        .collect();
    assert!(paths.contains(&"/app/results/notes/a.txt".to_string()), "{paths:?}");
    let file = view["files"]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["path"] == "/app/results/notes/a.txt")
        .unwrap();
    assert!(file["link"].as_str().unwrap().starts_with("http"), "{file}");
    let kinds: Vec<_> = view["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["kind"].clone())
        .collect();
    assert!(kinds.contains(&json!("python")), "{kinds:?}");

    let refused = bob.error(VIEW_TOOL, json!({"sandbox_id": id})).await;
    assert!(
        refused.contains("not found") || refused.contains("No sandbox"),
        "{refused}"
    );
    assert!(!refused.contains("a.txt"));
}
