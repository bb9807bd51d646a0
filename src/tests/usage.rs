//! Usage over the REST API: each key reads its own figures (an
//! administrator everyone's), JSON and CSV agree, and a key past its
//! monthly budget is refused new work but still lists and deletes.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use sandbox_actors::Usage;
use serde_json::{json, Value};
use uuid::Uuid;

use super::rest::{api, Api};
use super::App;

const ALICE: &str = "alice-key-0123456789abcdef";
const BOB: &str = "bob-key-0123456789abcdef";
const OPS: &str = "ops-key-0123456789abcdef";
/// Alice may use 3.6 CPU seconds a month; Bob has no budget; `ops` is an
/// administrator.
const KEYS: &str = r#"[{name = "alice", key = "alice-key-0123456789abcdef", cpu_hours_per_month = 0.001}, {name = "bob", key = "bob-key-0123456789abcdef"}, {name = "ops", key = "ops-key-0123456789abcdef"}]"#;

async fn create(api: &Api, key: &str) -> Uuid {
    let (status, made) = api.send(key, Method::POST, "/api/sandboxes", None).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    made["sandbox_id"].as_str().unwrap().parse().unwrap()
}

fn cpu(report: &Value, tenant: &str) -> f64 {
    let rows = report["rows"].as_array().unwrap();
    rows.iter()
        .filter(|r| r["tenant"] == tenant)
        .map(|r| r["cpu_seconds"].as_f64().unwrap())
        .sum()
}

fn tenants(report: &Value) -> Vec<String> {
    let mut t: Vec<String> = report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["tenant"].as_str().unwrap().to_string())
        .collect();
    t.dedup();
    t
}

#[tokio::test]
async fn each_key_reads_its_own_usage_and_a_spent_budget_stops_new_work_only() {
    let app = App::start(&[
        ("MCP_SANDBOX_AUTH_ENABLED", "true"),
        ("MCP_SANDBOX_AUTH_KEYS", KEYS),
        ("MCP_SANDBOX_AUTH_ADMIN_KEYS", r#"["ops"]"#),
        ("MCP_SANDBOX_USAGE_SAMPLE_SECONDS", "5"),
    ])
    .await;
    let (api, _serving) = api(&app).await;
    let alices = create(&api, ALICE).await;
    let bobs = create(&api, BOB).await;
    let busy = |cpu_seconds| Usage {
        cpu_seconds,
        network_bytes: Some(2048),
        ..Usage::default()
    };
    app.fake.set_usage(alices, busy(5.0));
    app.fake.set_usage(bobs, busy(1.0));

    let deadline = Instant::now() + Duration::from_secs(20);
    let mine = loop {
        let (status, report) = api.send(ALICE, Method::GET, "/api/usage", None).await;
        assert_eq!(status, StatusCode::OK, "{report}");
        if cpu(&report, "alice") >= 5.0 {
            break report;
        }
        assert!(Instant::now() < deadline, "never sampled: {report}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(tenants(&mine), ["alice"], "{mine}");
    assert_eq!(mine["granularity"], "day");
    let (_, theirs) = api.send(BOB, Method::GET, "/api/usage?granularity=hour", None).await;
    assert_eq!(
        (tenants(&theirs), cpu(&theirs, "bob")),
        (vec!["bob".to_string()], 1.0),
        "{theirs}"
    );
    let (status, refused) = api.send(ALICE, Method::GET, "/api/usage?tenant=bob", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    let (_, everyone) = api.send(OPS, Method::GET, "/api/usage", None).await;
    assert_eq!(tenants(&everyone), ["alice", "bob"], "{everyone}");
    let (_, one) = api.send(OPS, Method::GET, "/api/usage?tenant=bob", None).await;
    assert_eq!(tenants(&one), ["bob"], "{one}");
    for bad in [
        "granularity=week",
        "from=yesterday",
        "from=2026-12-02&to=2026-12-01",
        "colour=red",
    ] {
        let (status, said) = api.send(ALICE, Method::GET, &format!("/api/usage?{bad}"), None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {said}");
    }

    // The same figures as CSV.
    let csv = api
        .http
        .get(format!("{}/api/usage", api.base))
        .bearer_auth(ALICE)
        .header("accept", "text/csv")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let column = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), mine["rows"].as_array().unwrap().len(), "{csv}");
    let csv_cpu: f64 = rows
        .iter()
        .map(|r| r[column("cpu_seconds")].parse::<f64>().unwrap())
        .sum();
    assert_eq!(csv_cpu, cpu(&mine, "alice"), "{csv}");
    assert!(rows.iter().all(|r| r[column("tenant")] == "alice"), "{csv}");

    // Alice is past her 3.6 CPU seconds: no new runs or sandboxes, but she
    // lists and deletes; Bob runs on.
    let run = json!({"code": "set x 1"});
    let (status, said) = api
        .send(
            ALICE,
            Method::POST,
            &format!("/api/sandboxes/{alices}/python"),
            Some(run.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{said}");
    assert!(said.to_string().contains("cpu_hours_per_month"), "{said}");
    let (status, _) = api.send(ALICE, Method::POST, "/api/sandboxes", None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let (status, listed) = api.send(ALICE, Method::GET, "/api/sandboxes", None).await;
    assert_eq!(
        (status, listed["sandboxes"].as_array().unwrap().len()),
        (StatusCode::OK, 1)
    );
    let (status, _) = api
        .send(ALICE, Method::DELETE, &format!("/api/sandboxes/{alices}"), None)
        .await;
    assert!(status.is_success(), "{status}");
    let (status, ran) = api
        .send(BOB, Method::POST, &format!("/api/sandboxes/{bobs}/python"), Some(run))
        .await;
    assert_eq!(status, StatusCode::OK, "{ran}");
    // What Alice used stays after her sandbox is gone.
    let (_, after) = api.send(ALICE, Method::GET, "/api/usage", None).await;
    assert!(cpu(&after, "alice") >= 5.0, "{after}");
}
