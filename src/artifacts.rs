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
use sandbox_actors::Scope;
use serde::Deserialize;
use uuid::Uuid;

use crate::auth::unix_now;
use crate::caller::Caller;
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
    let has_caller = caller.is_some();
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
    let Ok(root) = app.ops.sandboxes.results_dir(scope, id) else {
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
pub(crate) fn segments(path: &str) -> Option<Vec<String>> {
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
pub(crate) fn open_beneath(root: &Path, segments: &[String]) -> std::io::Result<(File, u64)> {
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

/// Most files listed per sandbox, and deepest folder level walked.
const MAX_LISTED: usize = 1000;
const MAX_DEPTH: usize = 16;

/// A file under a sandbox's `/app/results`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ListedFile {
    /// Relative to `/app/results`, `/`-separated.
    pub path: String,
    pub size: u64,
    /// Seconds since the Unix epoch.
    pub modified: i64,
}

/// The regular files under `root`, sorted by path; symlinks are skipped and
/// never followed (each folder is opened with `O_NOFOLLOW` from its parent,
/// so a sandbox swapping a folder for a link cannot redirect the walk), and
/// the listing stops at [`MAX_LISTED`] files (`true` in the second place).
pub fn list_files(root: &Path) -> std::io::Result<(Vec<ListedFile>, bool)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut stack: Vec<(OwnedFd, String, usize)> = vec![(File::open(root)?.into(), String::new(), 0)];
    while let Some((dir, prefix, depth)) = stack.pop() {
        // Reading /proc/self/fd/N lists the folder the descriptor holds.
        let entries = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(meta) = entry.metadata() else { continue };
            let path = format!("{prefix}{name}");
            if meta.is_dir() && depth < MAX_DEPTH {
                if let Ok(sub) = openat(&dir, &name, libc::O_RDONLY | libc::O_DIRECTORY) {
                    stack.push((sub, format!("{path}/"), depth + 1));
                }
            } else if meta.is_file() {
                if out.len() == MAX_LISTED {
                    out.sort_by(|a: &ListedFile, b| a.path.cmp(&b.path));
                    return Ok((out, true));
                }
                out.push(ListedFile {
                    path,
                    size: meta.len(),
                    modified: meta.mtime(),
                });
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok((out, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_skips_links_and_walks_folders() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        std::fs::create_dir(root.path().join("d")).unwrap();
        std::fs::write(root.path().join("d/b.txt"), "bb").unwrap();
        std::fs::write(root.path().join("a b.png"), "a").unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("dirlink")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), root.path().join("link")).unwrap();
        let (files, cut) = list_files(root.path()).unwrap();
        let paths: Vec<_> = files.iter().map(|f| (f.path.as_str(), f.size)).collect();
        assert_eq!(paths, vec![("a b.png", 1), ("d/b.txt", 2)]);
        assert!(!cut);
    }

    #[test]
    fn listing_stops_at_its_limit() {
        let root = tempfile::tempdir().unwrap();
        for i in 0..MAX_LISTED + 3 {
            std::fs::write(root.path().join(format!("{i}")), "").unwrap();
        }
        let (files, cut) = list_files(root.path()).unwrap();
        assert_eq!(files.len(), MAX_LISTED);
        assert!(cut);
    }

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
