//! The REST routes on a sandbox's background processes and preview links:
//! the same verbs, arguments and results as the MCP tools.
//!
//! - `GET  /api/sandboxes/{id}/processes`: `list_processes`
//! - `POST /api/sandboxes/{id}/processes`: `start_process` (201)
//! - `GET  /api/sandboxes/{id}/processes/{process}/output?offset=&wait_seconds=&max_bytes=`
//! - `POST /api/sandboxes/{id}/processes/{process}/input`: `{"text": ...}`
//! - `POST /api/sandboxes/{id}/processes/{process}/stop`: `{"signal"?, "grace_seconds"?}`
//! - `POST`/`DELETE /api/sandboxes/{id}/ports/{port}`: `expose_port`, `unexpose_port`

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;

use crate::access::caller::Caller;
use crate::http::api::{json_body, optional_body, ApiError, ApiResult};
use crate::http::state::AppState;
use crate::ops::args::SandboxRef;
use crate::ops::processes::{InputResult, PreviewResult, ProcessList, ProcessOutput, StopResult};
use crate::ops::verbs::expose_port::ExposePort;
use crate::ops::verbs::read_process_output::ReadProcessOutput;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/sandboxes/{id}/processes", get(list).post(start))
        .route("/api/sandboxes/{id}/processes/{process}/output", get(output))
        .route("/api/sandboxes/{id}/processes/{process}/input", post(input))
        .route("/api/sandboxes/{id}/processes/{process}/stop", post(stop))
        .route("/api/sandboxes/{id}/ports/{port}", post(expose).delete(unexpose))
}

async fn list(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<ProcessList> {
    Ok(Json(
        app.ops.list_processes(&caller, SandboxRef { sandbox_id: id }).await?,
    ))
}

async fn start(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<ProcessOutput>), ApiError> {
    let args = json_body(&[("sandbox_id", &id)], &headers, &body)?;
    Ok((StatusCode::CREATED, Json(app.ops.start_process(&caller, args).await?)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OutputQuery {
    #[serde(default)]
    offset: u64,
    #[serde(default)]
    wait_seconds: f64,
    #[serde(default)]
    max_bytes: Option<usize>,
}

async fn output(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, process)): Path<(String, String)>,
    Query(q): Query<OutputQuery>,
) -> ApiResult<ProcessOutput> {
    let args = ReadProcessOutput {
        sandbox_id: id,
        process_id: process,
        offset: q.offset,
        wait_seconds: q.wait_seconds,
        max_bytes: q.max_bytes,
    };
    Ok(Json(app.ops.read_process_output(&caller, args).await?))
}

async fn input(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, process)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<InputResult> {
    let args = json_body(&[("sandbox_id", &id), ("process_id", &process)], &headers, &body)?;
    Ok(Json(app.ops.send_process_input(&caller, args).await?))
}

async fn stop(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, process)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<StopResult> {
    let args = optional_body(&[("sandbox_id", &id), ("process_id", &process)], &body)?;
    Ok(Json(app.ops.stop_process(&caller, args).await?))
}

async fn expose(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, port)): Path<(String, u16)>,
) -> ApiResult<PreviewResult> {
    let args = ExposePort { sandbox_id: id, port };
    Ok(Json(app.ops.expose_port(&caller, args).await?))
}

async fn unexpose(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, port)): Path<(String, u16)>,
) -> ApiResult<PreviewResult> {
    let args = ExposePort { sandbox_id: id, port };
    Ok(Json(app.ops.unexpose_port(&caller, args).await?))
}
