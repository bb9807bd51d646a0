//! The legacy MCP HTTP+SSE transport (protocol 2024-11-05), which rmcp no
//! longer ships: `GET /sse` opens an event stream whose first event,
//! `endpoint`, names `/messages?sessionId=…`; the client POSTs JSON-RPC
//! messages there (202) and reads the answers as `message` events.
//! Each stream is one rmcp service over a pair of channels; closing the
//! stream ends the session. Streams hold a place in [`Sessions`]: beyond the
//! caps `/sse` answers 429 or 503, and a stream idle past the limit (no
//! message from its client, no call running) is closed.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::StreamExt;
use rmcp::model::{ClientJsonRpcMessage, JsonRpcMessage};
use rmcp::ServiceExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::access::caller::Caller;
use crate::http::bodies::MAX_BODY_BYTES;
use crate::http::error::{error, session_refused};
use crate::http::sse_sessions;
use crate::http::state::AppState;
use crate::mcp::tools::SandboxServer;

/// Client messages queued per session before POSTs are refused.
const INBOX: usize = 64;

pub async fn open(State(app): State<AppState>, Extension(caller): Extension<Caller>) -> Response {
    let ticket = match app.sessions.open(&caller) {
        Ok(t) => Arc::new(t),
        Err(refused) => return session_refused(refused),
    };
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (inbox_tx, inbox_rx) = mpsc::channel::<ClientJsonRpcMessage>(INBOX);
    let (outbox_tx, outbox_rx) = mpsc::channel::<rmcp::model::ServerJsonRpcMessage>(INBOX);
    app.sse.insert(id.clone(), inbox_tx, caller.clone(), ticket.clone());

    let stop = CancellationToken::new();
    let handler = SandboxServer::new(app.ops.clone(), app.tasks.clone(), Some(caller));
    let transport = (
        tokio_util::sync::PollSender::new(outbox_tx),
        tokio_stream::wrappers::ReceiverStream::new(inbox_rx),
    );
    let service_stop = stop.clone();
    tokio::spawn(async move {
        match handler.serve(transport).await {
            Ok(running) => {
                let ct = running.cancellation_token();
                tokio::select! {
                    _ = running.waiting() => {}
                    _ = service_stop.cancelled() => ct.cancel(),
                }
            }
            Err(e) => warn!(error = %e, "SSE session failed to start"),
        }
    });

    let guard = app.sse.guard(id.clone(), stop);
    let endpoint = futures_util::stream::once(async move {
        Ok(Event::default()
            .event("endpoint")
            .data(format!("/messages?sessionId={id}")))
    });
    let closed = ticket.closed();
    let messages =
        tokio_stream::wrappers::ReceiverStream::new(outbox_rx).map(move |msg: rmcp::model::ServerJsonRpcMessage| {
            let _keep = &guard;
            // An answer ends a call of the session.
            if matches!(msg, JsonRpcMessage::Response(_) | JsonRpcMessage::Error(_)) {
                ticket.end_call();
            }
            let data = serde_json::to_string(&msg).unwrap_or_default();
            Ok::<_, Infallible>(Event::default().event("message").data(data))
        });
    // The stream ends when the server shuts down (or a graceful shutdown
    // would wait for it forever), and when the registry closes the session.
    let events = endpoint
        .chain(messages)
        .take_until(app.shutdown.clone().cancelled_owned())
        .take_until(closed);
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// The session is found before its body is read: a message to no session
/// costs the server no more than its headers.
pub async fn post(State(app): State<AppState>, caller: Option<Extension<Caller>>, uri: Uri, body: Body) -> Response {
    let Some(id) = sse_sessions::session_id(uri.query()) else {
        return (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({"error": "sessionId is required"})),
        )
            .into_response();
    };
    // The session id (unguessable, given only to whoever opened the
    // stream) is the capability; a request that names a caller must name
    // the one that opened it.
    let Some((inbox, ticket)) = app.sse.inbox(&id, caller.as_ref().map(|Extension(c)| c)) else {
        return (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({"error": "unknown session"})),
        )
            .into_response();
    };
    let body = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, &format!("reading the message: {e}")),
    };
    let message: ClientJsonRpcMessage = match serde_json::from_slice(&body) {
        Ok(m) => m,
        Err(e) => return error(StatusCode::BAD_REQUEST, &format!("not a JSON-RPC message: {e}")),
    };
    let is_call = matches!(message, JsonRpcMessage::Request(_));
    match inbox.try_send(message) {
        Ok(()) => {
            match is_call {
                true => ticket.begin_call(),
                false => ticket.touch(),
            }
            (StatusCode::ACCEPTED, "Accepted").into_response()
        }
        Err(mpsc::error::TrySendError::Full(_)) => (
            StatusCode::TOO_MANY_REQUESTS,
            Json(serde_json::json!({"error": "too many messages in flight"})),
        )
            .into_response(),
        Err(mpsc::error::TrySendError::Closed(_)) => (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({"error": "session closed"})),
        )
            .into_response(),
    }
}
