//! Templates through the tools and the REST API: each key sees and uses
//! only the templates its list names, and one it may not use is refused
//! exactly as one that does not exist.

use serde_json::json;

use super::{App, ALICE, BOB};
use crate::access::caller::Caller;
use crate::config::Config;
use sandbox_actors::config::TemplateConfig;

/// Alice may use `data`, Bob none; guests are not configured.
async fn app() -> App {
    let keys = format!(
        r#"[{{name = "alice", key = "{ALICE}"}}, {{name = "bob", key = "{BOB}"}}, {{name = "carol", key = "carol-key-0123456789abcdef"}}]"#
    );
    let vars = [
        ("MCP_SANDBOX_AUTH_ENABLED", "true"),
        ("MCP_SANDBOX_AUTH_KEYS", keys.as_str()),
    ];
    App::start_with(&vars, |c: &mut Config| {
        c.templates = ["data", "web"]
            .map(|name| TemplateConfig {
                name: name.into(),
                description: format!("the {name} template"),
                packages: vec![format!("{name}-package")],
                ..Default::default()
            })
            .to_vec();
        c.auth.keys[0].templates = Some(vec!["data".into()]);
        c.auth.keys[1].templates = Some(vec![]);
    })
    .await
}

#[tokio::test]
async fn a_key_sees_and_uses_only_the_templates_its_list_names() {
    let app = app().await;
    let alice = app.client(Caller::tenant("alice", false), false).await;
    let listed = alice.ok("list_templates", json!({})).await;
    let names: Vec<&str> = listed["templates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["data"]);
    assert_eq!(listed["templates"][0]["packages"], json!(["data-package"]));
    let made = alice.ok("create_sandbox", json!({"template": "data"})).await;
    assert_eq!(made["template"], "data");
    let sandboxes = alice.ok("list_sandboxes", json!({})).await;
    assert_eq!(sandboxes["sandboxes"][0]["template"], "data");

    // Another template, and one that does not exist, are refused alike.
    let theirs = alice.error("create_sandbox", json!({"template": "web"})).await;
    let unknown = alice.error("create_sandbox", json!({"template": "nope"})).await;
    assert_eq!(theirs.replace("\"web\"", "X"), unknown.replace("\"nope\"", "X"));
    assert!(theirs.contains("list_templates"), "{theirs}");
    // A name no template can have is echoed no longer than a name can be.
    let long = "x".repeat(100_000);
    let refused = alice.error("create_sandbox", json!({"template": long})).await;
    assert!(refused.contains(&format!("\"{}…\"", "x".repeat(40))), "{refused}");
    assert!(refused.len() < 600, "{} bytes echoed", refused.len());

    let bob = app.client(Caller::tenant("bob", false), false).await;
    assert_eq!(bob.ok("list_templates", json!({})).await["templates"], json!([]));
    bob.error("create_sandbox", json!({"template": "data"})).await;
    // Without a list, every template; without a template, the default.
    let carol = app.client(Caller::tenant("carol", false), false).await;
    assert_eq!(
        carol.ok("list_templates", json!({})).await["templates"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    carol.ok("create_sandbox", json!({"template": "web"})).await;
    let plain = carol.ok("create_sandbox", json!({})).await;
    assert!(plain.get("template").is_none(), "{plain}");
    let count = |listed: serde_json::Value| listed["sandboxes"].as_array().unwrap().len();
    assert_eq!(
        count(bob.ok("list_sandboxes", json!({})).await),
        0,
        "nothing made for a refused template"
    );
    assert_eq!(count(alice.ok("list_sandboxes", json!({})).await), 1);
}

#[tokio::test]
async fn the_rest_api_lists_a_key_s_templates_and_creates_from_them() {
    let app = app().await;
    let (base, stop) = app.http().await;
    let http = reqwest::Client::new();
    let listed: serde_json::Value = http
        .get(format!("{base}/api/templates"))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["templates"].as_array().unwrap().len(), 1, "{listed}");
    let refused = http
        .post(format!("{base}/api/sandboxes"))
        .bearer_auth(BOB)
        .json(&json!({"template": "data"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    let made = http
        .post(format!("{base}/api/sandboxes"))
        .bearer_auth(ALICE)
        .json(&json!({"template": "data"}))
        .send()
        .await
        .unwrap();
    assert_eq!(made.status(), 201);
    stop.cancel();
}

#[test]
fn an_allow_list_naming_no_template_is_a_configuration_error() {
    let mut config = Config::default();
    config.templates.push(TemplateConfig {
        name: "data".into(),
        ..Default::default()
    });
    config.guest.templates = Some(vec!["datas".into()]);
    let e = config.validate().unwrap_err().to_string();
    assert!(e.contains("guest.templates") && e.contains("datas"), "{e}");
    config.guest.templates = None;
    config.templates.push(config.templates[0].clone());
    assert!(config.validate().unwrap_err().to_string().contains("twice"));
}

#[tokio::test]
async fn guests_use_only_the_templates_of_the_guest_tier() {
    let app = App::start_with(
        &[
            ("MCP_SANDBOX_AUTH_ENABLED", "true"),
            ("MCP_SANDBOX_GUEST_ENABLED", "true"),
        ],
        |c: &mut Config| {
            c.templates = ["data", "web"]
                .map(|name| TemplateConfig {
                    name: name.into(),
                    ..Default::default()
                })
                .to_vec();
            c.guest.templates = Some(vec!["web".into()]);
        },
    )
    .await;
    let until = crate::access::signer::unix_now() + 600;
    let guest = app
        .client(
            Caller::guest(format!("{}a1", crate::access::caller::GUEST_PREFIX), until),
            false,
        )
        .await;
    let listed = guest.ok("list_templates", json!({})).await;
    assert_eq!(listed["templates"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed["templates"][0]["name"], "web");
    guest.error("create_sandbox", json!({"template": "data"})).await;
    guest.ok("create_sandbox", json!({"template": "web"})).await;
}
