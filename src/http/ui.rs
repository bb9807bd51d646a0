//! The web UI at `/ui`: a few server-rendered pages whose script calls the
//! REST API. Pages, script and style sheet are compiled into the binary.
//!
//! Signing in posts an API key in a plain HTML form (no script needed); the
//! key is then kept in an HttpOnly, SameSite=Strict cookie, so page scripts
//! never read it. Requests that the cookie authenticates must also carry the
//! session's CSRF token, which only the server's own pages hold.

use axum::extract::{Form, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use percent_encoding::{percent_decode_str, utf8_percent_encode, NON_ALPHANUMERIC};
use serde::Deserialize;

use crate::access::auth::Identified;
use crate::access::caller::Caller;
use crate::access::client_ip::ClientIp;
use crate::access::signer::unix_now;
use crate::http::api::guest_key_for;
use crate::http::state::AppState;
use crate::ops::args::parse_id;

/// The cookie holding a signed-in browser's API key.
pub(crate) const SESSION_COOKIE: &str = "mcp_sandbox_key";
/// The header carrying the session's CSRF token on API calls.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// How long a browser stays signed in.
const SESSION_SECONDS: u64 = 12 * 3600;

const APP_JS: &str = include_str!("ui/app.js");
const APP_CSS: &str = include_str!("ui/app.css");

/// Scripts and styles from this server only, no inline code, no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
                   form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

pub fn routes() -> Router<AppState> {
    Router::new()
        // The server's address alone, as a person types it, leads to the UI.
        .route("/", get(|| async { Redirect::to("/ui") }))
        .route("/ui", get(sandboxes_page))
        .route("/ui/", get(sandboxes_page))
        .route("/ui/sandboxes/{id}", get(sandbox_page))
        .route("/ui/usage", get(usage_page))
        .route("/ui/login", post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/guest", post(try_as_guest))
        .route(
            "/ui/assets/app.js",
            get(|| asset("text/javascript; charset=utf-8", APP_JS)),
        )
        .route("/ui/assets/app.css", get(|| asset("text/css; charset=utf-8", APP_CSS)))
}

/// The API key in a request's session cookie.
pub fn session_key(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(SESSION_COOKIE)?.strip_prefix('='))
        .map(|v| percent_decode_str(v).decode_utf8_lossy().into_owned())
        .filter(|k| !k.is_empty())
}

fn session_cookie(app: &AppState, value: &str, max_age: u64) -> HeaderValue {
    let secure = if app.secure_cookies { "; Secure" } else { "" };
    let value = utf8_percent_encode(value, NON_ALPHANUMERIC);
    HeaderValue::from_str(&format!(
        "{SESSION_COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}"
    ))
    .expect("cookie is ASCII")
}

async fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

/// Escapes text for HTML content and attribute values.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Who the page is for: shown in its header, and its CSRF token.
struct Viewer {
    caller: Caller,
    csrf: String,
}

impl Viewer {
    /// `None` when authentication is on and nobody is signed in.
    fn of(app: &AppState, caller: Option<Extension<Caller>>, headers: &HeaderMap) -> Option<Self> {
        let caller = match caller {
            Some(Extension(c)) => c,
            None if app.auth() => return None,
            None => Caller::local(),
        };
        let csrf = match (&app.signer, session_key(headers)) {
            (Some(signer), Some(key)) => signer.csrf_token(&key),
            _ => String::new(),
        };
        Some(Self { caller, csrf })
    }
}

/// A whole page around `body`.
fn page(app: &AppState, status: StatusCode, title: &str, viewer: Option<&Viewer>, body: &str) -> Response {
    let who = match viewer {
        Some(v) => {
            let role = if v.caller.admin { " (administrator)" } else { "" };
            let sign_out = if app.auth() {
                format!(
                    r#"<form method="post" action="/ui/logout" class="inline"><input type="hidden" name="csrf" value="{}"><button type="submit" id="sign-out">Sign out</button></form>"#,
                    esc(&v.csrf)
                )
            } else {
                String::new()
            };
            format!(
                r#"<a href="/ui/usage" id="usage-link">Usage</a> <span id="who">{}{role}</span> {sign_out}"#,
                esc(&v.caller.owner)
            )
        }
        None => String::new(),
    };
    let csrf = viewer.map(|v| esc(&v.csrf)).unwrap_or_default();
    let html = format!(
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="csrf-token" content="{csrf}">
<title>{title} · mcp-sandbox</title>
<link rel="stylesheet" href="/ui/assets/app.css">
<script src="/ui/assets/app.js" defer></script>
</head>
<body>
<header><a href="/ui" class="brand">mcp-sandbox</a><nav>{who}</nav></header>
<main>
{body}
</main>
</body>
</html>
"#,
        title = esc(title)
    );
    let mut response = (status, html).into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Nothing of the UI's addresses goes to other sites. (Not `no-referrer`:
    // with it, form posts carry `Origin: null`, which the Origin check refuses.)
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    response
}

fn sign_in_page(app: &AppState, status: StatusCode, message: Option<&str>) -> Response {
    let guest = match app.ops.limits.keys().guests() {
        Some(_) => format!(
            r#"<form method="post" action="/ui/guest" id="guest-form">
<p>No key? A guest key gives you a sandbox for {} minutes.</p>
<button type="submit" id="try-as-guest" class="secondary">Try without a key</button>
</form>"#,
            app.ops.limits.guest().key_ttl_seconds.div_ceil(60)
        ),
        None => String::new(),
    };
    let message = message
        .map(|m| format!(r#"<p class="error" id="sign-in-error">{}</p>"#, esc(m)))
        .unwrap_or_default();
    let body = format!(
        r#"<section class="card narrow">
<h1>Sign in</h1>
<p>Enter your API key. It is kept in a cookie that page scripts cannot read, for 12 hours.</p>
{message}
<form method="post" action="/ui/login" id="sign-in">
<label for="key">API key</label>
<input type="password" id="key" name="key" autocomplete="current-password" required>
<button type="submit">Sign in</button>
</form>
{guest}
</section>"#
    );
    page(app, status, "Sign in", None, &body)
}

async fn sandboxes_page(
    State(app): State<AppState>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
) -> Response {
    let Some(viewer) = Viewer::of(&app, caller, &headers) else {
        return sign_in_page(&app, StatusCode::OK, None);
    };
    let owner_column = if viewer.caller.admin { "<th>Owner</th>" } else { "" };
    let body = format!(
        r#"<section class="card">
<h1>Sandboxes</h1>
<form id="create-form" class="row">
<input name="name" id="create-name" placeholder="Name (optional)" maxlength="100">
<select name="template" id="create-template" hidden><option value="">Default environment</option></select>
<button type="submit">Create sandbox</button>
</form>
<p class="error" id="error" hidden></p>
<table id="sandboxes" data-admin="{admin}">
<thead><tr><th>Name</th><th>ID</th>{owner_column}<th>Status</th><th>Age</th><th>Expires</th><th>CPU</th><th>Memory</th><th>Disk</th><th>Packages</th><th></th></tr></thead>
<tbody></tbody>
</table>
<p id="empty" hidden>No sandboxes yet.</p>
</section>"#,
        admin = viewer.caller.admin
    );
    page(&app, StatusCode::OK, "Sandboxes", Some(&viewer), &body)
}

/// What the caller used this month, by day: a chart per measure and the
/// rows (an administrator's: every tenant's), filled from `/api/usage`.
async fn usage_page(State(app): State<AppState>, caller: Option<Extension<Caller>>, headers: HeaderMap) -> Response {
    let Some(viewer) = Viewer::of(&app, caller, &headers) else {
        return sign_in_page(&app, StatusCode::OK, None);
    };
    let whose = if viewer.caller.admin {
        "every tenant's sandboxes"
    } else {
        "your sandboxes"
    };
    let body = format!(
        r#"<section class="card" id="usage-page">
<h1>Usage</h1>
<p>What {whose} used this month (UTC), by day; sampled every few seconds, and kept after sandboxes are deleted. <button type="button" id="usage-csv" class="secondary">Download CSV</button></p>
<p class="error" id="error" hidden></p>
<div id="usage-charts" class="charts"></div>
<table id="usage">
<thead><tr><th>Day</th><th>Tenant</th><th>Sandbox h</th><th>CPU h</th><th>Memory GB·h</th><th>Disk GB·h</th><th>Network MiB</th><th>Calls</th><th>Installs</th></tr></thead>
<tbody></tbody>
</table>
<p id="usage-empty" hidden>Nothing used yet this month.</p>
</section>"#
    );
    page(&app, StatusCode::OK, "Usage", Some(&viewer), &body)
}

async fn sandbox_page(
    State(app): State<AppState>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let Some(viewer) = Viewer::of(&app, caller, &headers) else {
        return sign_in_page(&app, StatusCode::OK, None);
    };
    let Ok(id) = parse_id(&id) else {
        return page(
            &app,
            StatusCode::NOT_FOUND,
            "Not found",
            Some(&viewer),
            "<p>No such sandbox.</p>",
        );
    };
    let body = format!(
        r#"<div id="sandbox" data-id="{id}">
<section class="card">
<h1 id="sandbox-name">Sandbox</h1>
<dl id="info"></dl>
<div class="row"><button id="restart" class="secondary">Restart</button><button id="hibernate" class="secondary">Hibernate</button><button id="delete" class="danger">Delete</button></div>
<p class="muted" id="asleep" hidden>Hibernated: asleep on disk, holding no memory. Its next call (a run, a file, a process) wakes it; <button id="wake" class="secondary">Wake</button></p>
<p class="error" id="error" hidden></p>
</section>
<section class="card">
<h2>Python</h2>
<form id="python-form">
<textarea name="code" id="code" rows="8" spellcheck="false">print("hello")</textarea>
<button type="submit">Run</button>
</form>
<div class="output" id="python-out" hidden>
<p>Exit code <code id="python-exit"></code> · <span id="python-duration"></span> ms</p>
<pre id="python-stdout" class="stdout"></pre>
<div id="python-outputs" class="outputs"></div>
<pre id="python-stderr" class="stderr"></pre>
</div>
</section>
<section class="card">
<h2>Shell</h2>
<form id="shell-form" class="row">
<input name="command" id="command" placeholder="ls -la" spellcheck="false">
<button type="submit">Run</button>
</form>
<div class="output" id="shell-out" hidden>
<p>Exit code <code id="shell-exit"></code></p>
<pre id="shell-stdout" class="stdout"></pre>
<div id="shell-outputs" class="outputs"></div>
<pre id="shell-stderr" class="stderr"></pre>
</div>
</section>
<section class="card">
<h2>Packages</h2>
<form id="install-form" class="row">
<input name="package" id="package" placeholder="numpy or pandas==2.2.2">
<button type="submit">Install</button>
</form>
<p>Status: <code id="install-status">—</code> <span id="install-message"></span></p>
<pre id="install-output" hidden></pre>
</section>
<section class="card">
<h2>Files in /app/results</h2>
<form id="upload-form" class="row">
<input type="file" name="file" id="file">
<button type="submit">Upload</button>
<span id="upload-status"></span>
</form>
<table id="files"><thead><tr><th>Path</th><th>Size</th><th>Modified</th><th>Preview</th></tr></thead><tbody></tbody></table>
</section>
<section class="card">
<h2>Processes and previews</h2>
<form id="process-form" class="row">
<input name="command" id="process-command" placeholder="python -m http.server 8000" spellcheck="false">
<button type="submit">Start</button>
</form>
<table id="processes"><thead><tr><th>Process</th><th>Command</th><th>State</th><th>Output</th><th></th></tr></thead><tbody></tbody></table>
<pre id="process-output" hidden></pre>
<form id="expose-form" class="row">
<input name="port" id="expose-port" type="number" min="1" max="65535" placeholder="Port, e.g. 8000">
<button type="submit">Expose</button>
</form>
<ul id="ports"></ul>
</section>
<section class="card">
<h2>Snapshots and forks</h2>
<form id="snapshot-form" class="row">
<input name="label" id="snapshot-label" placeholder="Label (optional)" maxlength="200">
<button type="submit">Take snapshot</button>
<button type="button" id="fork" class="secondary">Fork sandbox</button>
<span id="snapshot-status"></span>
</form>
<table id="snapshots"><thead><tr><th>Label</th><th>Taken</th><th>Python</th><th>Files</th><th>Disk</th><th></th></tr></thead><tbody></tbody></table>
</section>
<section class="card">
<h2>Recent calls</h2>
<table id="history"><thead><tr><th>Started</th><th>Kind</th><th>Call</th><th>Outcome</th><th>ms</th></tr></thead><tbody></tbody></table>
</section>
</div>"#
    );
    page(&app, StatusCode::OK, "Sandbox", Some(&viewer), &body)
}

#[derive(Deserialize)]
struct SignIn {
    key: String,
}

async fn login(State(app): State<AppState>, Form(form): Form<SignIn>) -> Response {
    if !app.auth() {
        return Redirect::to("/ui").into_response();
    }
    let key = form.key.trim();
    match app.ops.limits.keys().identify(key) {
        Identified::Tenant(_) => signed_in(&app, key, SESSION_SECONDS),
        Identified::Guest(g) => signed_in(&app, key, guest_session_seconds(g.expires_at)),
        Identified::Revoked => sign_in_page(&app, StatusCode::UNAUTHORIZED, Some("This API key has been revoked.")),
        Identified::Expired => sign_in_page(&app, StatusCode::UNAUTHORIZED, Some("This guest key has expired.")),
        Identified::Unknown => sign_in_page(&app, StatusCode::UNAUTHORIZED, Some("Unknown API key.")),
    }
}

/// The answer to a sign-in: the session cookie, and on to the sandboxes.
fn signed_in(app: &AppState, key: &str, max_age: u64) -> Response {
    let mut r = Redirect::to("/ui").into_response();
    r.headers_mut()
        .insert(header::SET_COOKIE, session_cookie(app, key, max_age));
    r
}

/// A guest's browser session lasts as long as its key.
fn guest_session_seconds(expires_at: u64) -> u64 {
    expires_at.saturating_sub(unix_now()).min(SESSION_SECONDS)
}

/// "Try without a key": a fresh guest key, kept in the session cookie.
async fn try_as_guest(State(app): State<AppState>, Extension(client): Extension<ClientIp>) -> Response {
    match guest_key_for(&app, client).await {
        Ok((key, guest)) => signed_in(&app, &key, guest_session_seconds(guest.expires_at)),
        Err(refused) if refused.status() == StatusCode::TOO_MANY_REQUESTS => sign_in_page(
            &app,
            StatusCode::TOO_MANY_REQUESTS,
            Some("This address has had its guest keys for this hour; try again later."),
        ),
        Err(refused) => *refused,
    }
}

#[derive(Deserialize)]
struct SignOut {
    csrf: String,
}

async fn logout(State(app): State<AppState>, headers: HeaderMap, Form(form): Form<SignOut>) -> Response {
    let genuine = match (&app.signer, session_key(&headers)) {
        (Some(signer), Some(key)) => signer.verify_csrf(&key, &form.csrf),
        _ => false,
    };
    if !genuine {
        return crate::http::error::error(StatusCode::FORBIDDEN, "sign-out needs the session's CSRF token");
    }
    let mut r = Redirect::to("/ui").into_response();
    r.headers_mut().insert(header::SET_COOKIE, session_cookie(&app, "", 0));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_is_escaped() {
        assert_eq!(
            esc(r#"<a href="x">'&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn the_session_key_is_read_from_its_cookie() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; mcp_sandbox_key=k%3Bey; b=2"),
        );
        assert_eq!(session_key(&h).as_deref(), Some("k;ey"));
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("mcp_sandbox_keyx=1; mcp_sandbox_key="),
        );
        assert_eq!(session_key(&h), None);
    }
}
