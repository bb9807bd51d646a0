//! `GET /results/{sandbox_id}/{path}`: files a sandbox wrote under
//! `/app/results`, served from the host folder bind-mounted there.
//!
//! That folder is writable by the sandbox, so it may hold symlinks to host
//! files: the path is opened one component at a time without following
//! links beneath the sandbox's folder ([`sandbox_actors::files`]), and
//! anything but a regular file is refused.

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
use crate::http::state::AppState;

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
    let Ok(target) = ResultsPath::parse(&path) else {
        return not_found();
    };
    let (file, len) = match app.ops.sandboxes.open_file(scope, id, target).await {
        Ok(f) => f,
        Err(SandboxError::File(FileError::Symlink(_))) => return refuse(StatusCode::FORBIDDEN, "links are not served"),
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
