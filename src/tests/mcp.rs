//! The MCP tools through the rmcp client: what each answers, in order, and
//! what another tenant is told.

use std::time::Duration;

use serde_json::json;

use super::App;
use crate::access::caller::Caller;

#[tokio::test(start_paused = true)]
async fn the_tools_run_a_sandbox_from_creation_to_deletion_in_order() {
    let app = App::start(&[]).await;
    let alice = app.client(Caller::tenant("alice", false), false).await;
    let tools = alice.0.list_all_tools().await.unwrap();
    assert_eq!(
        tools.len(),
        26,
        "{:?}",
        tools.iter().map(|t| &t.name).collect::<Vec<_>>()
    );
    assert!(
        tools.iter().all(|t| t.output_schema.is_some()),
        "every tool declares its output"
    );

    let id = alice.create().await;
    alice
        .ok("execute_python_code", json!({"sandbox_id": id, "code": "set x 41"}))
        .await;
    let got = alice
        .ok("execute_python_code", json!({"sandbox_id": id, "code": "get x"}))
        .await;
    assert_eq!(got["stdout"], "41\n", "{got}");
    assert_eq!(got["exit_code"], 0);

    let listed = alice.ok("list_sandboxes", json!({})).await;
    let ids: Vec<_> = listed["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sandbox_id"].clone())
        .collect();
    assert_eq!(ids, [json!(id)]);

    // A reset empties the namespace in turn with the calls around it.
    let reset = alice.ok("reset_python", json!({"sandbox_id": id})).await;
    let took = reset["duration_ms"].to_string();
    assert!(took.split('.').nth(1).is_none_or(|f| f.len() <= 3), "{took}");
    let after = alice
        .ok("execute_python_code", json!({"sandbox_id": id, "code": "get x"}))
        .await;
    assert!(after["stderr"].as_str().unwrap().contains("NameError"), "{after}");

    assert_eq!(
        alice.ok("delete_sandbox", json!({"sandbox_id": id})).await["success"],
        true
    );
    assert_eq!(alice.ok("list_sandboxes", json!({})).await["sandboxes"], json!([]));
    let gone = alice
        .error("execute_python_code", json!({"sandbox_id": id, "code": "get x"}))
        .await;
    assert!(gone.contains("not found") && gone.contains("create_sandbox"), "{gone}");
}

#[tokio::test(start_paused = true)]
async fn another_tenant_is_told_a_sandbox_does_not_exist_whatever_it_asks() {
    let app = App::start(&[]).await;
    let alice = app.client(Caller::tenant("alice", false), false).await;
    let bob = app.client(Caller::tenant("bob", false), false).await;
    let id = alice.create().await;
    let never = uuid::Uuid::new_v4().to_string();
    for (tool, args) in [
        ("execute_python_code", json!({"code": "set x 1"})),
        ("execute_terminal_command", json!({"command": "echo hi"})),
        ("list_files", json!({})),
        ("read_file", json!({"path": "a.txt"})),
        ("write_file", json!({"path": "a.txt", "content": "x"})),
        ("snapshot_sandbox", json!({})),
        ("fork_sandbox", json!({})),
        ("reset_python", json!({})),
        ("delete_sandbox", json!({})),
    ] {
        let with = |sandbox: &str| {
            let mut a = args.clone();
            a["sandbox_id"] = json!(sandbox);
            a
        };
        let refused = bob.error(tool, with(&id)).await;
        let unknown = bob.error(tool, with(&never)).await;
        assert_eq!(refused.replace(&id, "ID"), unknown.replace(&never, "ID"), "{tool}");
    }
    assert_eq!(bob.ok("list_sandboxes", json!({})).await["sandboxes"], json!([]));
    // Nothing bob sent reached the sandbox: its namespace and files are as they were.
    let got = alice
        .ok("execute_python_code", json!({"sandbox_id": id, "code": "get x"}))
        .await;
    assert!(got["stderr"].as_str().unwrap().contains("NameError"), "{got}");
    assert_eq!(
        alice.ok("list_files", json!({"sandbox_id": id})).await["entries"],
        json!([])
    );
}

#[tokio::test(start_paused = true)]
async fn a_run_past_its_timeout_says_so_and_the_next_call_runs() {
    let app = App::start(&[]).await;
    let alice = app.client(Caller::tenant("alice", false), false).await;
    let id = alice.create().await;
    let started = tokio::time::Instant::now();
    let slow = alice
        .call(
            "execute_python_code",
            json!({"sandbox_id": id, "code": "sleep 600", "timeout_seconds": 2}),
        )
        .await;
    assert!(started.elapsed() < Duration::from_secs(60), "ended near its timeout");
    let said = format!("{} {:?}", super::text(&slow), slow.structured_content);
    assert!(said.contains("124") || said.contains("timed out"), "{said}");
    let next = alice
        .ok(
            "execute_terminal_command",
            json!({"sandbox_id": id, "command": "echo alive"}),
        )
        .await;
    assert!(next["stdout"].as_str().unwrap().contains("alive"), "{next}");
}

#[tokio::test(start_paused = true)]
async fn bad_arguments_are_refused_with_what_to_send() {
    let app = App::start(&[]).await;
    let alice = app.client(Caller::tenant("alice", false), false).await;
    let id = alice.create().await;
    let cases = [
        (
            "execute_python_code",
            json!({"sandbox_id": "not-an-id", "code": "x"}),
            "sandbox_id",
        ),
        (
            "execute_python_code",
            json!({"sandbox_id": id, "code": "x", "timeout_seconds": 0}),
            "timeout_seconds",
        ),
        (
            "read_file",
            json!({"sandbox_id": id, "path": "../../etc/passwd"}),
            "outside /app/results",
        ),
        ("fork_sandbox", json!({"sandbox_id": id, "count": 17}), "count"),
        ("create_sandbox", json!({"name": "a\u{7}b"}), "name"),
    ];
    for (tool, args, says) in cases {
        let message = alice.error(tool, args.clone()).await;
        assert!(message.contains(says), "{tool} {args}: {message}");
    }
}
