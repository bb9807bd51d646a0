//! Long calls as tasks (`ops::tasks`), through the rmcp client's tasks API
//! on the paused clock: a 90 s run is polled to its end in an instant.

use std::time::Duration;

use rmcp::model::{CallToolResponse, CancelTaskParams, GetTaskParams, TaskPayload, TaskStatus};
use serde_json::{json, Value};

use super::{params, App, Client};
use crate::access::caller::Caller;

const TASKS: &[(&str, &str)] = &[
    ("MCP_SANDBOX_TASKS_THRESHOLD_MS", "1000"),
    ("MCP_SANDBOX_TASKS_TTL_SECONDS", "600"),
    ("MCP_SANDBOX_TASKS_MAX_PER_TENANT", "3"),
];

/// Calls a tool; the task it became (its id), or its plain result.
async fn call(client: &Client, tool: &str, arguments: Value) -> Result<String, Value> {
    match client
        .0
        .call_tool_once(params(tool, arguments))
        .await
        .expect("an answer")
    {
        CallToolResponse::Task(task) => Ok(task.task.task_id),
        CallToolResponse::Complete(result) => Err(result.structured_content.expect("structured content")),
        other => panic!("neither a task nor a result: {other:?}"),
    }
}

/// Polls a task, once a second, until it ends: its payload.
async fn poll(client: &Client, task: &str) -> TaskPayload {
    for _ in 0..1000 {
        let got = client.0.get_task(GetTaskParams::new(task)).await.expect("tasks/get");
        if got.task.task.status != TaskStatus::Working {
            return got.task.payload;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    panic!("task {task} never ended");
}

#[tokio::test(start_paused = true)]
async fn a_long_run_becomes_a_task_its_tenant_polls_to_the_end() {
    let app = App::start(TASKS).await;
    let alice = app.client(Caller::tenant("alice", false), true).await;
    let bob = app.client(Caller::tenant("bob", false), true).await;
    let id = alice.create().await;

    // Within the threshold a tasks client gets the plain result.
    let quick = call(
        &alice,
        "execute_python_code",
        json!({"sandbox_id": id, "code": "quick"}),
    )
    .await;
    assert_eq!(quick.expect_err("a plain result")["stdout"], "quick\n");

    let started = tokio::time::Instant::now();
    let slow = call(
        &alice,
        "execute_python_code",
        json!({"sandbox_id": id, "code": "sleep 90", "timeout_seconds": 150}),
    )
    .await
    .expect("a task");

    // To another tenant the task does not exist.
    let refused = bob.0.get_task(GetTaskParams::new(slow.clone())).await.unwrap_err();
    assert!(refused.to_string().contains("unknown task"), "{refused}");
    let refused = bob
        .0
        .cancel_task(CancelTaskParams::new(slow.clone()))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("unknown task"), "{refused}");

    let done = poll(&alice, &slow).await;
    assert!(started.elapsed() >= Duration::from_secs(90));
    let TaskPayload::Completed { result } = done else {
        panic!("not completed: {done:?}");
    };
    assert_eq!(result["structuredContent"]["exit_code"], 0, "{result:?}");
    // The result stays: polled again, it is still there.
    let again = alice.0.get_task(GetTaskParams::new(slow)).await.unwrap();
    assert_eq!(again.task.payload, TaskPayload::Completed { result });
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_task_interrupts_its_run_and_the_sandbox_runs_the_next_call() {
    let app = App::start(TASKS).await;
    let alice = app.client(Caller::tenant("alice", false), true).await;
    let id = alice.create().await;
    let doomed = call(
        &alice,
        "execute_python_code",
        json!({"sandbox_id": id, "code": "sleep 60"}),
    )
    .await
    .expect("a task");
    alice
        .0
        .cancel_task(CancelTaskParams::new(doomed.clone()))
        .await
        .unwrap();
    let ended = poll(&alice, &doomed).await;
    assert_eq!(ended, TaskPayload::Cancelled);
    let next = alice
        .ok(
            "execute_terminal_command",
            json!({"sandbox_id": id, "command": "alive"}),
        )
        .await;
    assert!(next["stdout"].as_str().unwrap().contains("alive"), "{next}");
    // The interrupt reached the agent: the run did not hold the queue for its 60 s.
    let runs = app.fake.execs(uuid::Uuid::parse_str(&id).unwrap());
    let (first, last) = (runs.first().unwrap().1, runs.last().unwrap().1);
    assert!(last - first < Duration::from_secs(60), "{:?}", last - first);
}

#[tokio::test(start_paused = true)]
async fn past_its_cap_or_without_the_extension_a_long_call_answers_its_plain_result() {
    let app = App::start(TASKS).await;
    let alice = app.client(Caller::tenant("alice", false), true).await;
    let plain = app.client(Caller::tenant("alice", false), false).await;
    let id = alice.create().await;
    let long = |n: u32| json!({"sandbox_id": id, "code": format!("sleep 2 {n}")});

    // A client without the extension keeps the plain result past the threshold.
    let ran = call(&plain, "execute_python_code", long(0))
        .await
        .expect_err("a plain result");
    assert_eq!(ran["exit_code"], 0);

    // Three tasks fill the tenant's cap; the fourth long call runs as a plain call.
    let mut held = vec![];
    for n in 1..=3 {
        held.push(call(&alice, "execute_python_code", long(n)).await.expect("a task"));
    }
    let at_cap = call(&alice, "execute_python_code", long(4)).await;
    assert_eq!(at_cap.expect_err("a plain result at the cap")["exit_code"], 0);

    // A fetched result frees its place: the next long call is a task again.
    let done = poll(&alice, &held[0]).await;
    assert!(matches!(done, TaskPayload::Completed { .. }), "{done:?}");
    call(&alice, "execute_python_code", long(5))
        .await
        .expect("a task again");
}

/// The attack: many guests (each a tenant of its own, with its own cap)
/// together hold every task place, and every other client's long calls run
/// as plain calls that clients cut. Guests together keep at most half of
/// the server's tasks; a key's tenant still gets one.
#[tokio::test(start_paused = true)]
async fn guests_together_cannot_take_every_task_place() {
    let app = App::start(&[
        ("MCP_SANDBOX_TASKS_THRESHOLD_MS", "1000"),
        ("MCP_SANDBOX_TASKS_TTL_SECONDS", "600"),
        ("MCP_SANDBOX_TASKS_MAX_PER_TENANT", "3"),
        ("MCP_SANDBOX_TASKS_MAX_TOTAL", "8"),
    ])
    .await;
    let guest = |n: u32| Caller {
        owner: format!("{}{n}", crate::access::caller::GUEST_PREFIX),
        admin: false,
        expires_at: Some(u64::MAX / 2),
    };
    let mut guests = vec![];
    for n in 0..3 {
        let client = app.client(guest(n), true).await;
        let id = client.create().await;
        guests.push((client, id));
    }
    let long = |id: &str, n: u32| json!({"sandbox_id": id, "code": format!("sleep 2 {n}")});
    let mut tasks = 0;
    for (client, id) in &guests {
        for n in 0..3 {
            if call(client, "execute_python_code", long(id, n)).await.is_ok() {
                tasks += 1;
            }
        }
    }
    assert_eq!(tasks, 4, "guests together keep half of the 8 places");
    let alice = app.client(Caller::tenant("alice", false), true).await;
    let id = alice.create().await;
    call(&alice, "execute_python_code", long(&id, 9))
        .await
        .expect("a key's tenant still gets a task");
}
