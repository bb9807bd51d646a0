//! How the HTTP routes answer what they refuse: a status and a JSON body
//! `{"error": message}`, with `Retry-After` when the client may try again.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::metrics::SessionRefusal;

pub fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}

/// A refusal to hold more for a client: 429 or 503, `Retry-After` and a
/// JSON message.
pub fn refusal(status: StatusCode, retry_after_seconds: u64, message: &str) -> Response {
    let mut r = error(status, message);
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_seconds.max(1)));
    r
}

/// A session not opened: 429 for the tenant's own cap, 503 for the
/// server's, with `Retry-After`.
pub fn session_refused(why: SessionRefusal) -> Response {
    let status = match why {
        SessionRefusal::Tenant(_) => StatusCode::TOO_MANY_REQUESTS,
        SessionRefusal::Total(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    refusal(status, 5, &why.to_string())
}
