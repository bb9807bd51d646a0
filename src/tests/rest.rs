//! The REST API over HTTP on a loopback port, behind API keys: each key
//! sees and changes only its own sandboxes, and bad input is answered with
//! the status that says what kind and a message that says what to send.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::{App, ALICE, BOB, KEYS};

pub(super) struct Api {
    pub http: reqwest::Client,
    pub base: String,
}

impl Api {
    pub async fn send(&self, key: &str, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(key);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("an answer");
        let status = response.status();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }
}

pub(super) async fn api(app: &App) -> (Api, tokio_util::sync::DropGuard) {
    let (base, shutdown) = app.http().await;
    let api = Api {
        http: reqwest::Client::new(),
        base,
    };
    (api, shutdown.drop_guard())
}

#[tokio::test]
async fn each_key_sees_and_changes_only_its_own_sandboxes() {
    let app = App::start(&[("MCP_SANDBOX_AUTH_ENABLED", "true"), ("MCP_SANDBOX_AUTH_KEYS", KEYS)]).await;
    let (api, _serving) = api(&app).await;

    let (status, made) = api
        .send(ALICE, Method::POST, "/api/sandboxes", Some(json!({"name": "mine"})))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let id = made["sandbox_id"].as_str().unwrap().to_string();
    let (status, ran) = api
        .send(
            ALICE,
            Method::POST,
            &format!("/api/sandboxes/{id}/python"),
            Some(json!({"code": "hello"})),
        )
        .await;
    assert_eq!(
        (status, ran["stdout"].clone()),
        (StatusCode::OK, json!("hello\n")),
        "{ran}"
    );

    let (_, listed) = api.send(BOB, Method::GET, "/api/sandboxes", None).await;
    assert_eq!(listed["sandboxes"], json!([]), "{listed}");
    for (method, path, body) in [
        (Method::GET, format!("/api/sandboxes/{id}"), None),
        (
            Method::POST,
            format!("/api/sandboxes/{id}/python"),
            Some(json!({"code": "set x 1"})),
        ),
        (
            Method::POST,
            format!("/api/sandboxes/{id}/shell"),
            Some(json!({"command": "echo hi"})),
        ),
        (Method::GET, format!("/api/sandboxes/{id}/files"), None),
        (Method::POST, format!("/api/sandboxes/{id}/snapshots"), Some(json!({}))),
        (Method::POST, format!("/api/sandboxes/{id}/forks"), Some(json!({}))),
        (Method::DELETE, format!("/api/sandboxes/{id}"), None),
    ] {
        let (status, body) = api.send(BOB, method.clone(), &path, body).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {body}");
    }
    let (_, mine) = api.send(ALICE, Method::GET, "/api/sandboxes", None).await;
    assert_eq!(mine["sandboxes"].as_array().map(Vec::len), Some(1), "{mine}");

    let (status, _) = api.send("no-such-key", Method::GET, "/api/sandboxes", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let (status, _) = api
        .send(ALICE, Method::DELETE, &format!("/api/sandboxes/{id}"), None)
        .await;
    assert!(status.is_success(), "{status}");
    let (status, _) = api
        .send(ALICE, Method::GET, &format!("/api/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn bad_input_is_answered_with_its_kind_and_what_to_send() {
    let app = App::start(&[("MCP_SANDBOX_AUTH_ENABLED", "true"), ("MCP_SANDBOX_AUTH_KEYS", KEYS)]).await;
    let (api, _serving) = api(&app).await;
    let (_, made) = api.send(ALICE, Method::POST, "/api/sandboxes", Some(json!({}))).await;
    let id = made["sandbox_id"].as_str().unwrap().to_string();
    let cases = [
        (
            Method::GET,
            "/api/sandboxes/not-an-id".to_string(),
            None,
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::POST,
            format!("/api/sandboxes/{id}/python"),
            Some(json!({"cod": "x"})),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            Method::POST,
            format!("/api/sandboxes/{id}/python"),
            Some(json!({"code": "x", "timeout_seconds": 0})),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::POST,
            format!("/api/sandboxes/{id}/forks"),
            Some(json!({"count": 17})),
            StatusCode::BAD_REQUEST,
        ),
    ];
    for (method, path, body, expected) in cases {
        let (status, answer) = api.send(ALICE, method.clone(), &path, body).await;
        assert_eq!(status, expected, "{method} {path}: {answer}");
        let message = answer["error"].as_str().unwrap_or_default();
        assert!(message.len() > 10, "{method} {path}: no message in {answer}");
    }
}

/// A body refused at its size before it is read is drained, not reset: a
/// client that sends all of it before reading (as most do), and whose bytes
/// come after the answer, still reads the 413. Closed at once, the server's
/// socket would answer those bytes with a reset, and the client would see a
/// broken pipe in place of the answer.
#[tokio::test]
async fn a_body_refused_at_its_size_is_drained_and_the_answer_read() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let app = App::start(&[]).await;
    let (base, shutdown) = app.http().await;
    let _serving = shutdown.drop_guard();
    let body = vec![b'x'; crate::http::bodies::MAX_BODY_BYTES + 1];
    let address = base.trim_start_matches("http://");
    let mut tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = format!(
        "POST /api/sandboxes HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    // The answer is written and the connection ends before the body comes.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    tcp.write_all(&body).await.expect("the body is taken, not reset");
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).await.expect("the answer");
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
}

/// A refusal that passes with time says when: past the creation rate, the
/// answer is a 429 with `Retry-After` (the seconds the message gives), and a
/// body that names a field twice (in the path and in the body) is refused.
#[tokio::test]
async fn a_rate_refusal_says_when_to_try_again() {
    let app = App::start(&[("MCP_SANDBOX_LIMITS_CREATIONS_PER_MINUTE", "1")]).await;
    let (api, _serving) = api(&app).await;
    let (status, made) = api.send(ALICE, Method::POST, "/api/sandboxes", None).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let response = api
        .http
        .post(format!("{}/api/sandboxes", api.base))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let after: u64 = response.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&after), "{after}");
    let body: Value = response.json().await.unwrap();
    let message = body["error"].as_str().unwrap();
    assert!(message.contains(&format!("wait {after} s")), "{message}");
    let id = made["sandbox_id"].as_str().unwrap();
    let (status, answer) = api
        .send(
            ALICE,
            Method::POST,
            &format!("/api/sandboxes/{id}/python"),
            Some(json!({"code": "1", "sandbox_id": id})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
}

/// The attack: without keys, clients of one IPv6 network (one /64, which
/// the rates count as one client) reach each other's sandboxes. The tenant
/// is each client's own address.
#[tokio::test]
async fn without_keys_each_address_of_one_network_is_a_tenant_of_its_own() {
    let app = App::start(&[("MCP_SANDBOX_SERVER_TRUSTED_PROXIES", r#"["127.0.0.1/32"]"#)]).await;
    let (api, _serving) = api(&app).await;
    let from = |address: &'static str, method: Method, path: String| {
        api.http
            .request(method, format!("{}{path}", api.base))
            .header("X-Forwarded-For", address)
            .send()
    };
    let made = from("2001:db8::1", Method::POST, "/api/sandboxes".into())
        .await
        .unwrap();
    assert_eq!(made.status(), StatusCode::CREATED);
    let id = made.json::<Value>().await.unwrap()["sandbox_id"]
        .as_str()
        .unwrap()
        .to_string();
    let listed: Value = from("2001:db8::2", Method::GET, "/api/sandboxes".into())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["sandboxes"], json!([]), "{listed}");
    let other = from("2001:db8::2", Method::DELETE, format!("/api/sandboxes/{id}"))
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::NOT_FOUND);
    let own: Value = from("2001:db8::1", Method::GET, "/api/sandboxes".into())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(own["sandboxes"][0]["sandbox_id"], json!(id), "{own}");
}

/// The attack: another tenant's valid key with a Streamable HTTP session's
/// id (seen in a log, a proxy, a shared client). The session is its
/// opener's on every request: to the other key it does not exist, whether
/// it posts to it, opens its stream, resumes it or deletes it, and its
/// opener's session goes on.
#[tokio::test]
async fn a_session_answers_only_the_tenant_that_opened_it() {
    let app = App::start(&[("MCP_SANDBOX_AUTH_ENABLED", "true"), ("MCP_SANDBOX_AUTH_KEYS", KEYS)]).await;
    let (api, _serving) = api(&app).await;
    let post = |key: &'static str, session: Option<String>, body: Value| {
        let mut request = api
            .http
            .post(format!("{}/mcp", api.base))
            .bearer_auth(key)
            .header("Accept", "application/json, text/event-stream")
            .header("Mcp-Protocol-Version", "2025-06-18")
            .json(&body);
        if let Some(id) = session {
            request = request.header("Mcp-Session-Id", id);
        }
        request.send()
    };
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let opened = post(ALICE, None, init).await.unwrap();
    assert_eq!(opened.status(), StatusCode::OK);
    let sid = opened.headers()["mcp-session-id"].to_str().unwrap().to_string();
    drop(opened);
    let ready = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert_eq!(
        post(ALICE, Some(sid.clone()), ready).await.unwrap().status(),
        StatusCode::ACCEPTED
    );
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});

    let theirs = post(BOB, Some(sid.clone()), list.clone()).await.unwrap();
    assert_eq!(theirs.status(), StatusCode::NOT_FOUND, "a message");
    for last_event in [None, Some("0")] {
        let mut stream = api
            .http
            .get(format!("{}/mcp", api.base))
            .bearer_auth(BOB)
            .header("Accept", "text/event-stream")
            .header("Mcp-Protocol-Version", "2025-06-18")
            .header("Mcp-Session-Id", &sid);
        if let Some(id) = last_event {
            stream = stream.header("Last-Event-ID", id);
        }
        let answer = stream.send().await.unwrap();
        assert_eq!(
            answer.status(),
            StatusCode::NOT_FOUND,
            "a stream, resumed: {last_event:?}"
        );
    }
    let _ = api
        .http
        .delete(format!("{}/mcp", api.base))
        .bearer_auth(BOB)
        .header("Mcp-Protocol-Version", "2025-06-18")
        .header("Mcp-Session-Id", &sid)
        .send()
        .await
        .unwrap();
    let mine = post(ALICE, Some(sid), list).await.unwrap();
    assert_eq!(mine.status(), StatusCode::OK, "the opener's session goes on");
    let text = mine.text().await.unwrap();
    assert!(text.contains("create_sandbox"), "{text}");
}

#[tokio::test]
async fn the_server_s_address_alone_leads_to_the_web_ui() {
    let app = App::start(&[]).await;
    let (api, _serving) = api(&app).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let answer = http.get(format!("{}/", api.base)).send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::SEE_OTHER);
    assert_eq!(answer.headers()["location"], "/ui");
}
