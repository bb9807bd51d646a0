//! `GET /results/{sandbox_id}/{path}`: files a sandbox wrote under
//! `/app/results`, served from the host folder bind-mounted there.
//!
//! That folder is writable by the sandbox, so it may hold symlinks to host
//! files: the path is opened one component at a time with `O_NOFOLLOW`
//! beneath the sandbox's folder, and anything but a regular file is refused.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use axum::body::Body;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use serde::Deserialize;
use uuid::Uuid;

use crate::auth::unix_now;
use crate::caller::{Caller, LOCAL_OWNER};
use crate::http::AppState;

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
    let Ok(id) = Uuid::parse_str(&sandbox) else {
        return not_found();
    };
    let Some(segments) = segments(&path) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "the path must not contain empty, '.' or '..' segments",
        );
    };
    // With authentication, a valid link token grants this one file (the
    // owner's API key does too); without, the tenant's own sandboxes.
    let owner = match (&app.signer, q.token) {
        (Some(signer), Some(token)) => match signer.verify(&id.to_string(), &path, &token, unix_now()) {
            Ok(()) => None,
            Err(_) => {
                return refuse(
                    StatusCode::FORBIDDEN,
                    "invalid or expired link token; run the code again for a fresh link",
                )
            }
        },
        (Some(_), None) => match caller {
            Some(Extension(c)) => Some(c.owner),
            None => return refuse(StatusCode::UNAUTHORIZED, "this link needs its ?token= (or an API key)"),
        },
        (None, _) => Some(
            caller
                .map(|Extension(c)| c.owner)
                .unwrap_or_else(|| LOCAL_OWNER.to_string()),
        ),
    };
    let Ok(root) = app.sandboxes.results_dir(owner.as_deref(), id) else {
        return not_found();
    };
    let opened = tokio::task::spawn_blocking(move || open_beneath(&root, &segments)).await;
    let (file, len) = match opened {
        Ok(Ok(f)) => f,
        Ok(Err(e)) if e.raw_os_error() == Some(libc::ELOOP) => {
            return refuse(StatusCode::FORBIDDEN, "links are not served")
        }
        _ => return not_found(),
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

/// Splits a (decoded) relative path; `None` for traversal or empty segments.
fn segments(path: &str) -> Option<Vec<String>> {
    let parts: Vec<String> = path.split('/').map(str::to_string).collect();
    let ok = !parts.is_empty()
        && parts
            .iter()
            .all(|p| !p.is_empty() && p != "." && p != ".." && !p.contains('\0'));
    ok.then_some(parts)
}

fn openat(dir: &OwnedFd, name: &str, flags: libc::c_int) -> std::io::Result<OwnedFd> {
    let c = std::ffi::CString::new(name).map_err(|_| std::io::Error::from_raw_os_error(libc::ENOENT))?;
    // SAFETY: valid directory fd and NUL-terminated name; the result is owned below.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens `root/segments…` without following any symlink, as a regular file.
fn open_beneath(root: &Path, segments: &[String]) -> std::io::Result<(File, u64)> {
    let mut dir: OwnedFd = File::open(root)?.into();
    let (last, parents) = segments.split_last().expect("at least one segment");
    for s in parents {
        dir = openat(&dir, s, libc::O_PATH | libc::O_DIRECTORY)?;
    }
    // O_NONBLOCK: a FIFO planted by the sandbox must not hang the server.
    let file = File::from(openat(&dir, last, libc::O_RDONLY | libc::O_NONBLOCK)?);
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::from_raw_os_error(libc::ENOENT));
    }
    Ok((file, meta.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traversal_and_links_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        std::fs::create_dir(root.path().join("d")).unwrap();
        std::fs::write(root.path().join("d/ok.txt"), "ok").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), root.path().join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("dirlink")).unwrap();
        let open = |p: &str| segments(p).map(|s| open_beneath(root.path(), &s));
        assert!(open("d/ok.txt").unwrap().is_ok());
        assert!(open("link").unwrap().is_err());
        assert!(open("dirlink/secret").unwrap().is_err());
        assert!(open("d").unwrap().is_err(), "folders are not served");
        assert!(open("../x").is_none() && open("d/../d/ok.txt").is_none() && open("d//ok.txt").is_none());
    }
}
