//! `/cluster/v1/ops/{verb}` (and `/cluster/v1/bytes/{verb}` for a call that
//! carries a file): calls another node of the cluster forwarded here
//! because this node holds their sandbox (see `ops::route`). Only a
//! request with the cluster's token reaches it (the guard checks it in place
//! of an API key); the caller is the one the entry node authenticated. The
//! answer is a stream of JSON lines: the run's progress, a heartbeat while
//! it runs quietly, and last its outcome. A call whose entry node goes away
//! is dropped, which interrupts it as a cancelled request is.

use std::future::Future;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use sandbox_actors::Progress;
use sandbox_cluster::channel::{digest_of, BYTES_PATH, HEARTBEAT, TOKEN_HEADER};

use crate::http::api::answer_of;
use crate::http::error::error;
use crate::http::state::AppState;
use crate::ops::error::{OpsError, RemoteError};
use crate::ops::results::ListedSandbox;
use crate::ops::route::{Forwarded, Line};
use crate::ops::usage::UsageAsked;
use crate::ops::verbs::install_package_in_sandbox::ForwardedInstall;
use crate::ops::verbs::upload_file_to_sandbox::ForwardedUpload;
use crate::ops::RunFiles;

/// The route's path (`channel::OPS_PATH`).
pub(crate) const ROUTE: &str = "/cluster/v1/ops/{verb}";
/// The route of calls that carry a file (`channel::BYTES_PATH`).
pub(crate) const BYTES_ROUTE: &str = "/cluster/v1/bytes/{verb}";
/// Room for a file's call's arguments, above the file's own cap.
pub(crate) const ARGS_ROOM: usize = 64 * 1024;
/// What a request without the cluster's signature hears.
pub(crate) const FOR_NODES: &str = "this route is for the nodes of the cluster";

/// The digest of the body a request's signature covers: the guard checks
/// the signature on the headers, before the body is read, and leaves this
/// for the route, which checks the body against it.
#[derive(Debug, Clone)]
pub(crate) struct SignedDigest(String);

/// The body's digest the request's headers sign with the cluster's key,
/// if they do.
pub(crate) fn signed_headers(app: &AppState, headers: &HeaderMap, method: &str, path: &str) -> Option<SignedDigest> {
    let header = headers.get(TOKEN_HEADER).and_then(|v| v.to_str().ok())?;
    app.ops
        .cluster
        .as_ref()?
        .channel
        .accepts(header, method, path)
        .map(SignedDigest)
}

impl SignedDigest {
    /// Whether `body` is the one the signature covers.
    pub(crate) fn covers(&self, body: &[u8]) -> bool {
        self.0 == digest_of(&[body])
    }
}
/// What every path of the channel starts with.
pub(crate) const PREFIX: &str = "/cluster/";

pub(crate) async fn call(
    State(app): State<AppState>,
    Extension(signed): Extension<SignedDigest>,
    Path(verb): Path<String>,
    uri: Uri,
    body: Bytes,
) -> Response {
    // A call that carries a file has its arguments on the body's first
    // line, the file's bytes after it.
    let with_bytes = uri.path().starts_with(BYTES_PATH);
    let end = match with_bytes {
        true => body.iter().position(|&b| b == b'\n').unwrap_or(body.len()),
        false => body.len(),
    };
    let Forwarded { caller, args } = match opened(&signed, &body, &body[..end]) {
        Ok(call) => call,
        Err(refused) => return *refused,
    };
    let (ops, c) = (app.ops.serving_forwarded(), caller);
    if with_bytes {
        let data = body.slice((end + 1).min(body.len())..);
        return match verb.as_str() {
            "upload_bytes" => run(args, move |a: ForwardedUpload, _| async move {
                ops.upload_bytes(&c, &a.sandbox_id, a.upload, data).await
            }),
            _ => error(StatusCode::NOT_FOUND, &format!("no verb {verb} on this channel")),
        };
    }
    match verb.as_str() {
        "create_sandbox" => run(args, move |a, _| async move { ops.create_here(&c, a).await }),
        "execute_python_code" => run(args, move |a, p| async move { ops.execute_python_code(&c, a, p).await }),
        "execute_terminal_command" => run(
            args,
            move |a, p| async move { ops.execute_terminal_command(&c, a, p).await },
        ),
        "install_package_in_sandbox" => run(args, move |a: ForwardedInstall, _| async move {
            let wait = Duration::from_millis(a.wait_ms);
            ops.install_package_in_sandbox(&c, a.args, wait).await
        }),
        "check_package_installation_status" => run(args, move |a, _| async move {
            ops.check_package_installation_status(&c, a).await
        }),
        "delete_sandbox" => run(args, move |a, _| async move { ops.delete_sandbox(&c, a).await }),
        "reset_python" => run(args, move |a, _| async move { ops.reset_python(&c, a).await }),
        "list_files" => run(args, move |a, _| async move { ops.list_files(&c, a).await }),
        "upload_file_to_sandbox" => run(args, move |a, _| async move { ops.upload_file_to_sandbox(&c, a).await }),
        "read_file" => run(args, move |a, _| async move { ops.read_file(&c, a).await }),
        "write_file" => run(args, move |a, _| async move { ops.write_file(&c, a).await }),
        "snapshot_sandbox" => run(args, move |a, _| async move { ops.snapshot_sandbox(&c, a).await }),
        "restore_snapshot" => run(args, move |a, _| async move { ops.restore_snapshot(&c, a).await }),
        "list_snapshots" => run(args, move |a, _| async move { ops.list_snapshots(&c, a).await }),
        "delete_snapshot" => run(args, move |a, _| async move { ops.delete_snapshot(&c, a).await }),
        "fork_sandbox" => run(args, move |a, _| async move { ops.fork_sandbox(&c, a).await }),
        "view_sandbox" => run(args, move |a, _| async move { ops.view_sandbox(&c, a).await }),
        "show_sandbox" => run(args, move |a, _| async move { ops.show_sandbox(&c, a).await }),
        "restart_sandbox" => run(args, move |a, _| async move { ops.restart_sandbox(&c, a).await }),
        "hibernate_sandbox" => run(args, move |a, _| async move { ops.hibernate_sandbox(&c, a).await }),
        "start_process" => run(args, move |a, _| async move { ops.start_process(&c, a).await }),
        "list_processes" => run(args, move |a, _| async move { ops.list_processes(&c, a).await }),
        "read_process_output" => run(args, move |a, _| async move { ops.read_process_output(&c, a).await }),
        "send_process_input" => run(args, move |a, _| async move { ops.send_process_input(&c, a).await }),
        "stop_process" => run(args, move |a, _| async move { ops.stop_process(&c, a).await }),
        "expose_port" => run(args, move |a, _| async move { ops.expose_port(&c, a).await }),
        "unexpose_port" => run(args, move |a, _| async move { ops.unexpose_port(&c, a).await }),
        "list_result_files" => run(args, move |a, _| async move { ops.list_result_files(&c, a).await }),
        "run_images" => run(args, move |a: RunFiles, _| async move {
            Ok::<_, OpsError>(ops.run_images(&c, &a.sandbox_id, &a.shown, &a.files).await)
        }),
        // This node's own, for a listing over every node.
        "list_sandboxes" => run(args, move |(), _| async move {
            let listed: Vec<ListedSandbox> = ops.list_sandboxes(&c).await.into_iter().map(Into::into).collect();
            Ok::<_, OpsError>(listed)
        }),
        "usage" => run(args, move |a: UsageAsked, _| async move {
            ops.usage_here(&c, a.tenant.as_deref(), a.period).await
        }),
        "show_sandboxes" => run(args, move |(), _| async move {
            Ok::<_, OpsError>(ops.show_sandboxes_here(&c).await)
        }),
        _ => error(StatusCode::NOT_FOUND, &format!("no verb {verb} on this channel")),
    }
}

/// The forwarded call `head` holds, if the signature covers the request's
/// `body`; otherwise the refusal (boxed: a response is large and the call
/// the common case).
fn opened(signed: &SignedDigest, body: &[u8], head: &[u8]) -> Result<Forwarded, Box<Response>> {
    if !signed.covers(body) {
        return Err(Box::new(error(StatusCode::UNAUTHORIZED, FOR_NODES)));
    }
    serde_json::from_slice(head).map_err(|_| Box::new(error(StatusCode::BAD_REQUEST, "not a forwarded call")))
}

/// A verb's arguments read from `args`, and its answer.
fn run<A, T, F>(args: Value, work: impl FnOnce(A, Option<mpsc::Sender<Progress>>) -> F + Send + 'static) -> Response
where
    A: DeserializeOwned + Send + 'static,
    T: Serialize + Send + 'static,
    F: Future<Output = Result<T, OpsError>> + Send + 'static,
{
    match serde_json::from_value::<A>(args) {
        Ok(args) => answer(move |progress| work(args, progress)),
        Err(e) => error(StatusCode::BAD_REQUEST, &format!("arguments: {e}")),
    }
}

/// Runs `work` and streams its progress, heartbeats and outcome as JSON
/// lines; stops it as soon as the entry node stops reading.
fn answer<T, F>(work: impl FnOnce(Option<mpsc::Sender<Progress>>) -> F + Send + 'static) -> Response
where
    T: Serialize + Send + 'static,
    F: Future<Output = Result<T, OpsError>> + Send + 'static,
{
    let (lines, out) = mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        let (progress, mut seen) = mpsc::channel::<Progress>(16);
        let running = work(Some(progress));
        tokio::pin!(running);
        // The first beat is one period away: an interval's immediate first
        // tick waits for the timer's next millisecond, which every call
        // would pay.
        let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + HEARTBEAT, HEARTBEAT);
        let last = loop {
            tokio::select! {
                done = &mut running => break outcome(done),
                Some(p) = seen.recv() => {
                    if lines.send(encode(&Line::Progress(p))).await.is_err() {
                        return;
                    }
                }
                _ = beat.tick() => {
                    if lines.send(encode(&Line::Alive)).await.is_err() {
                        return;
                    }
                }
                // The entry node went away: dropping the call interrupts it.
                () = lines.closed() => return,
            }
        };
        // Output sent before the end still goes first.
        while let Ok(p) = seen.try_recv() {
            let _ = lines.send(encode(&Line::Progress(p))).await;
        }
        let _ = lines.send(encode(&last)).await;
    });
    let body = Body::from_stream(ReceiverStream::new(out).map(Ok::<_, std::io::Error>));
    ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response()
}

fn outcome<T: Serialize>(done: Result<T, OpsError>) -> Line {
    match done {
        Ok(value) => Line::Ok(serde_json::to_value(value).expect("results serialise")),
        Err(e) => {
            let (status, retry_after) = answer_of(&e);
            Line::Err(RemoteError {
                message: e.to_string(),
                status: status.as_u16(),
                retry_after,
            })
        }
    }
}

fn encode(line: &Line) -> Bytes {
    let mut text = serde_json::to_vec(line).expect("lines serialise");
    text.push(b'\n');
    Bytes::from(text)
}
