//! `GET /results/{sandbox_id}/{path}`: files a sandbox wrote under
//! `/app/results`, served from the host folder bind-mounted there.
//!
//! That folder is writable by the sandbox, so it may hold symlinks to host
//! files: the path is opened one component at a time without following
//! links beneath the sandbox's folder ([`sandbox_actors::files`]), and
//! anything but a regular file is refused.
//!
//! In a cluster a link may reach a node that does not hold its sandbox
//! (behind a load balancer, say): that node checks the link, then relays
//! the file from the holder (`/cluster/v1/results/...`, the node channel).

use axum::body::Body;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use sandbox_actors::files::{FileError, ResultsPath};
use sandbox_actors::{SandboxError, Scope};
use serde::Deserialize;
use uuid::Uuid;

use crate::access::caller::Caller;
use crate::access::signer::unix_now;
use crate::http::node;
use crate::http::state::AppState;
use crate::ops::route::Holder;

fn refuse(status: StatusCode, message: &str) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}

#[derive(Deserialize)]
pub struct LinkQuery {
    token: Option<String>,
}

pub async fn get(
    State(app): State<AppState>,
    caller: Option<Extension<Caller>>,
    Query(q): Query<LinkQuery>,
    UrlPath((sandbox, path)): UrlPath<(String, String)>,
) -> Response {
    let not_found = || refuse(StatusCode::NOT_FOUND, "no such file");
    let has_caller = caller.is_some();
    let Ok(id) = Uuid::parse_str(&sandbox) else {
        return not_found();
    };
    if !is_clean(&path) {
        return refuse(
            StatusCode::BAD_REQUEST,
            "the path must not contain empty, '.' or '..' segments",
        );
    }
    // With authentication, a valid link token grants this one file (the
    // owner's API key does too); without, the tenant's own sandboxes.
    let caller = caller.map(|Extension(c)| c).unwrap_or_else(Caller::local);
    let by_link = q.token.is_some();
    let scope = match (&app.signer, q.token) {
        (Some(signer), Some(token)) => match signer.verify(&id.to_string(), &path, &token, unix_now()) {
            Ok(()) => Scope::Everyone,
            Err(_) => {
                return refuse(
                    StatusCode::FORBIDDEN,
                    "invalid or expired link token; run the code again for a fresh link",
                )
            }
        },
        (Some(_), None) if !has_caller => {
            return refuse(StatusCode::UNAUTHORIZED, "this link needs its ?token= (or an API key)")
        }
        _ => caller.scope(),
    };
    if let Some(relayed) = from_holder(&app, &caller, by_link, id, &path).await {
        return relayed;
    }
    serve(&app, scope, id, &path).await
}

/// `/cluster/v1/results/{sandbox_id}/{path}`: a file of a sandbox this node
/// holds, for the node a link reached (which checked the link or the key).
pub async fn for_node(
    State(app): State<AppState>,
    Extension(signed): Extension<node::SignedDigest>,
    UrlPath((sandbox, path)): UrlPath<(String, String)>,
) -> Response {
    if !signed.covers(b"") {
        return refuse(StatusCode::UNAUTHORIZED, node::FOR_NODES);
    }
    match Uuid::parse_str(&sandbox) {
        Ok(id) if is_clean(&path) => serve(&app, Scope::Everyone, id, &path).await,
        _ => refuse(StatusCode::NOT_FOUND, "no such file"),
    }
}

/// The file from the node that holds the sandbox, when another node does
/// and the link (or the caller's key) admits it; `None`: served here.
async fn from_holder(app: &AppState, caller: &Caller, by_link: bool, id: Uuid, path: &str) -> Option<Response> {
    // A valid link admits any tenant's file; a key, its own tenant's.
    let admits = |tenant: &str| by_link || caller.admin || caller.owner == tenant;
    let Ok(Holder::Node { name: node, url }) = app.ops.holder_of(id, admits).await else {
        return None;
    };
    let cluster = app.ops.cluster.as_ref()?;
    let encoded: Vec<String> = path
        .split('/')
        .map(|s| utf8_percent_encode(s, NON_ALPHANUMERIC).to_string())
        .collect();
    let route = format!("/cluster/v1/results/{id}/{}", encoded.join("/"));
    let answer = match cluster.channel.get(&node, &url, &route).await {
        Ok(answer) => answer,
        Err(_) => {
            return Some(refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!(
                    "node {}, which holds this sandbox, does not answer; try again later",
                    node
                ),
            ))
        }
    };
    let mut relayed = Response::builder().status(answer.status().as_u16());
    for name in [
        header::CONTENT_TYPE,
        header::CONTENT_LENGTH,
        header::CONTENT_DISPOSITION,
        header::X_CONTENT_TYPE_OPTIONS,
        header::CONTENT_SECURITY_POLICY,
        header::CACHE_CONTROL,
    ] {
        if let Some(value) = answer
            .headers()
            .get(name.as_str())
            .and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok())
        {
            relayed = relayed.header(name, value);
        }
    }
    let body = Body::from_stream(answer.bytes_stream());
    Some(
        relayed
            .body(body)
            .unwrap_or_else(|_| refuse(StatusCode::BAD_GATEWAY, "a node's answer could not be relayed")),
    )
}

/// The file at `path` of sandbox `id`, as `scope` may see it.
async fn serve(app: &AppState, scope: Scope<'_>, id: Uuid, path: &str) -> Response {
    let not_found = || refuse(StatusCode::NOT_FOUND, "no such file");
    let Ok(target) = ResultsPath::parse(path) else {
        return not_found();
    };
    let (file, len) = match app.ops.sandboxes.open_file(scope, id, target).await {
        Ok(f) => f,
        Err(SandboxError::File(FileError::Symlink(_))) => return refuse(StatusCode::FORBIDDEN, "links are not served"),
        Err(SandboxError::Asleep { .. }) => {
            return refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "the sandbox is hibernated and could not be woken now; try again",
            )
        }
        Err(_) => return not_found(),
    };
    let name = path.rsplit('/').next().unwrap_or("file");
    let mime = mime_guess::from_path(name).first_or_octet_stream();
    let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(file));
    let disposition = format!(
        "inline; filename*=UTF-8''{}",
        utf8_percent_encode(name, NON_ALPHANUMERIC)
    );
    let mut response = Body::from_stream(stream).into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(mime.as_ref()).unwrap_or(HeaderValue::from_static("application/octet-stream")),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    h.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_str(&disposition).expect("ASCII"),
    );
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    // A sandbox may write HTML: it renders in an opaque origin, without scripts.
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static("sandbox"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("private, no-cache"));
    response
}

/// Whether a (decoded) relative path is free of traversal and of empty
/// segments: a link names exactly one file, the one its token was signed for.
fn is_clean(path: &str) -> bool {
    path.split('/')
        .all(|p| !p.is_empty() && p != "." && p != ".." && !p.contains('\0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traversal_and_empty_segments_are_refused() {
        assert!(is_clean("d/ok.txt"));
        for bad in ["../x", "d/../d/ok.txt", "d//ok.txt", "./x", "", "a\0b"] {
            assert!(!is_clean(bad), "{bad:?} accepted");
        }
    }
}
