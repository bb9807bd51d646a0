//! The REST API under `/api`, which the web UI uses: JSON in and out, the
//! same keys as MCP (or the UI's session cookie with its CSRF token), and the
//! same operations ([`crate::ops`]) with the same results as the tools; and
//! `POST /api/guest`, which hands out guest keys ([`crate::access::guest`]).

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use sandbox_actors::files::FileError;
use sandbox_actors::snapshots::{CopyError, SnapshotError};
use sandbox_actors::templates::TemplateError;
use sandbox_actors::{RuntimeError, SandboxError};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::access::caller::Caller;
use crate::access::client_ip::ClientIp;
use crate::access::guest::Guest;
use crate::access::signer::unix_now;
use crate::http::error::{error, refusal};
use crate::http::state::AppState;
use crate::ops::args::{SandboxRef, SnapshotRef};
use crate::ops::error::{Channel, OpsError};
use crate::ops::results::{
    CommandResult, CreatedSandbox, DeleteResult, ForkResult, HibernateResult, InstallResult, PythonResult,
    RestoreResult, SnapshotDeleted, SnapshotList, SnapshotResult, TemplateList, UploadResult,
};
use crate::ops::usage::Period;
use crate::ops::verbs::install_package_in_sandbox::INSTALL_WAIT;
use crate::ops::verbs::list_result_files::FileList;
use crate::ops::verbs::show_sandboxes::{SandboxDetail, SandboxPage, ShownSandbox};
use crate::ops::verbs::upload_file_to_sandbox::UploadBytes;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/sandboxes", get(list).post(create))
        .route("/api/sandboxes/{id}", get(show).delete(delete))
        .route("/api/sandboxes/{id}/restart", post(restart))
        .route("/api/sandboxes/{id}/hibernate", post(hibernate))
        .route("/api/sandboxes/{id}/python", post(python))
        .route("/api/sandboxes/{id}/shell", post(shell))
        .route("/api/sandboxes/{id}/packages", get(install_status).post(install))
        .route("/api/sandboxes/{id}/snapshots", get(list_snapshots).post(snapshot))
        .route(
            "/api/sandboxes/{id}/snapshots/{snapshot}",
            axum::routing::delete(delete_snapshot),
        )
        .route(
            "/api/sandboxes/{id}/snapshots/{snapshot}/restore",
            post(restore_snapshot),
        )
        .route("/api/sandboxes/{id}/forks", post(fork))
        .route("/api/usage", get(usage))
        .route("/api/templates", get(templates))
}

/// The routes whose bodies are files (`[uploads] max_upload_mb`, not the
/// other routes' cap): the caller puts them under that cap.
pub fn upload_routes() -> Router<AppState> {
    Router::new().route("/api/sandboxes/{id}/files", get(files).post(upload))
}

/// A failed request: the status says what kind (and, for a refusal that
/// passes with time, `Retry-After` when), the body the message.
pub enum ApiError {
    Ops(OpsError),
    /// A body without a JSON content type (415), that is not JSON (400),
    /// or that is not the verb's arguments (422).
    Body(StatusCode, String),
}

impl<E: Into<OpsError>> From<E> for ApiError {
    fn from(e: E) -> Self {
        Self::Ops(e.into())
    }
}

/// The status that answers a domain error.
fn status_of(e: &SandboxError) -> StatusCode {
    match e {
        SandboxError::NotFound(_) => StatusCode::NOT_FOUND,
        SandboxError::File(FileError::NotFound(_)) => StatusCode::NOT_FOUND,
        SandboxError::File(FileError::Slow { .. }) => StatusCode::SERVICE_UNAVAILABLE,
        SandboxError::File(FileError::Io { .. }) => StatusCode::INTERNAL_SERVER_ERROR,
        SandboxError::InvalidArgument(_) | SandboxError::UploadRefused(_) | SandboxError::File(_) => {
            StatusCode::BAD_REQUEST
        }
        SandboxError::Outdated { .. } => StatusCode::CONFLICT,
        SandboxError::Quota(_) | SandboxError::TooMany { .. } | SandboxError::Seeding { .. } => {
            StatusCode::TOO_MANY_REQUESTS
        }
        SandboxError::Runtime(RuntimeError::Disk(_) | RuntimeError::File { .. } | RuntimeError::Internal(_)) => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
        SandboxError::Docker(_) | SandboxError::Runtime(_) => StatusCode::SERVICE_UNAVAILABLE,
        SandboxError::Agent(_) | SandboxError::Unresponsive { .. } | SandboxError::Preview(_) => {
            StatusCode::BAD_GATEWAY
        }
        SandboxError::Ended { .. } => StatusCode::GONE,
        SandboxError::Asleep { .. } => StatusCode::SERVICE_UNAVAILABLE,
        SandboxError::Template(TemplateError::Unknown(_)) => StatusCode::BAD_REQUEST,
        SandboxError::Template(TemplateError::NotBuilt { .. }) => StatusCode::SERVICE_UNAVAILABLE,
        SandboxError::Snapshot(e) => match e {
            SnapshotError::NotFound(_) => StatusCode::NOT_FOUND,
            SnapshotError::TooMany(_) => StatusCode::CONFLICT,
            SnapshotError::Disabled => StatusCode::FORBIDDEN,
            SnapshotError::Save(copy)
            | SnapshotError::Restore(copy)
            | SnapshotError::Export(copy)
            | SnapshotError::Seed(copy) => match copy {
                CopyError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
                CopyError::TooDeep { .. } => StatusCode::UNPROCESSABLE_ENTITY,
                CopyError::Stopped => StatusCode::GATEWAY_TIMEOUT,
                CopyError::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
            },
            SnapshotError::StoreFull { .. } => StatusCode::INSUFFICIENT_STORAGE,
            SnapshotError::NoRoom => StatusCode::SERVICE_UNAVAILABLE,
            SnapshotError::Store(_) | SnapshotError::Disk(_) => StatusCode::INTERNAL_SERVER_ERROR,
        },
        SandboxError::Store(_) | SandboxError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let ops = match self {
            ApiError::Ops(ops) => ops,
            ApiError::Body(status, message) => return error(status, &message),
        };
        let message = ops.message_for(Channel::Web);
        match answer_of(&ops) {
            (status, Some(seconds)) => refusal(status, seconds, &message),
            (status, None) => error(status, &message),
        }
    }
}

/// The REST status of an operation's failure, and for a refusal that
/// passes with time, after how many seconds to retry.
pub(crate) fn answer_of(ops: &OpsError) -> (StatusCode, Option<u64>) {
    match ops {
        OpsError::Sandbox(e) => (status_of(e), None),
        OpsError::InvalidArgument(_) => (StatusCode::BAD_REQUEST, None),
        OpsError::RateLimited { retry_after, .. } => (StatusCode::TOO_MANY_REQUESTS, Some(*retry_after)),
        OpsError::Refused(_) => (StatusCode::TOO_MANY_REQUESTS, None),
        OpsError::Cluster(_) | OpsError::Unreachable { .. } => (StatusCode::SERVICE_UNAVAILABLE, None),
        OpsError::Forwarded(remote) => (
            StatusCode::from_u16(remote.status).unwrap_or(StatusCode::BAD_GATEWAY),
            remote.retry_after,
        ),
        OpsError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, None),
    }
}

pub(crate) type ApiResult<T> = Result<Json<T>, ApiError>;

/// A verb's arguments from `fields` (a request's JSON body, or its query)
/// with the path's `ids` put in; the message of what is wrong with them. A
/// key the verb does not take is refused, as the routes always did (the
/// MCP tools pass over unknown arguments), and so is an id given in the
/// body as well as in the path.
fn verb_args<T: DeserializeOwned + JsonSchema>(
    ids: &[(&str, &str)],
    mut fields: serde_json::Map<String, serde_json::Value>,
) -> Result<T, String> {
    let schema = schemars::schema_for!(T);
    let known = schema
        .as_object()
        .and_then(|o| o.get("properties"))
        .and_then(|p| p.as_object());
    let taken =
        |key: &String| known.is_some_and(|known| known.contains_key(key)) && !ids.iter().any(|(id, _)| id == key);
    if let Some(key) = fields.keys().find(|k| !taken(k)) {
        return Err(format!("unknown field `{key}`"));
    }
    for (key, value) in ids {
        fields.insert(key.to_string(), serde_json::Value::from(*value));
    }
    serde_json::from_value(serde_json::Value::Object(fields)).map_err(|e| e.to_string())
}

/// A request body as a JSON object, or why it is none.
fn json_object(body: &[u8]) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    match serde_json::from_slice(body) {
        Ok(serde_json::Value::Object(fields)) => Ok(fields),
        Ok(_) => Err("not a JSON object".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// A verb's arguments from the path's `ids` and an optional JSON body (an
/// empty one means all defaults): anything wrong is an invalid argument
/// (400).
pub(crate) fn optional_body<T: DeserializeOwned + JsonSchema>(
    ids: &[(&str, &str)],
    body: &[u8],
) -> Result<T, ApiError> {
    let invalid = |e: String| ApiError::Ops(OpsError::InvalidArgument(format!("request body: {e}")));
    let fields = match body.iter().all(u8::is_ascii_whitespace) {
        true => serde_json::Map::new(),
        false => json_object(body).map_err(invalid)?,
    };
    verb_args(ids, fields).map_err(invalid)
}

/// A verb's arguments from the path's `ids` and a JSON body it needs: a
/// body without a JSON content type is 415, one that is not JSON 400, and
/// JSON that is not the verb's arguments 422.
pub(crate) fn json_body<T: DeserializeOwned + JsonSchema>(
    ids: &[(&str, &str)],
    headers: &HeaderMap,
    body: &[u8],
) -> Result<T, ApiError> {
    let json = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| {
            let v = v.trim().to_ascii_lowercase();
            v == "application/json" || (v.starts_with("application/") && v.ends_with("+json"))
        });
    if !json {
        return Err(ApiError::Body(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Expected request with `Content-Type: application/json`".into(),
        ));
    }
    let fields =
        json_object(body).map_err(|e| ApiError::Body(StatusCode::BAD_REQUEST, format!("request body: {e}")))?;
    verb_args(ids, fields).map_err(|e| ApiError::Body(StatusCode::UNPROCESSABLE_ENTITY, format!("request body: {e}")))
}

async fn list(State(app): State<AppState>, Extension(caller): Extension<Caller>) -> Json<SandboxPage> {
    Json(app.ops.show_sandboxes(&caller).await)
}

async fn templates(State(app): State<AppState>, Extension(caller): Extension<Caller>) -> Json<TemplateList> {
    Json(app.ops.list_templates(&caller))
}

async fn create(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> Result<(StatusCode, Json<CreatedSandbox>), ApiError> {
    let args = optional_body(&[], &body)?;
    Ok((StatusCode::CREATED, Json(app.ops.create_sandbox(&caller, args).await?)))
}

async fn show(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<SandboxDetail> {
    Ok(Json(
        app.ops.show_sandbox(&caller, SandboxRef { sandbox_id: id }).await?,
    ))
}

async fn delete(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<DeleteResult> {
    Ok(Json(
        app.ops.delete_sandbox(&caller, SandboxRef { sandbox_id: id }).await?,
    ))
}

async fn restart(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<ShownSandbox> {
    let info = app.ops.restart_sandbox(&caller, SandboxRef { sandbox_id: id }).await?;
    Ok(Json(app.ops.shown(&caller, info).await))
}

async fn hibernate(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<HibernateResult> {
    Ok(Json(
        app.ops
            .hibernate_sandbox(&caller, SandboxRef { sandbox_id: id })
            .await?,
    ))
}

async fn snapshot(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<(StatusCode, Json<SnapshotResult>), ApiError> {
    let args = optional_body(&[("sandbox_id", &id)], &body)?;
    Ok((
        StatusCode::CREATED,
        Json(app.ops.snapshot_sandbox(&caller, args).await?),
    ))
}

async fn fork(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<(StatusCode, Json<ForkResult>), ApiError> {
    let args = optional_body(&[("sandbox_id", &id)], &body)?;
    Ok((StatusCode::CREATED, Json(app.ops.fork_sandbox(&caller, args).await?)))
}

async fn list_snapshots(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<SnapshotList> {
    Ok(Json(
        app.ops.list_snapshots(&caller, SandboxRef { sandbox_id: id }).await?,
    ))
}

async fn restore_snapshot(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((sandbox_id, snapshot_id)): Path<(String, String)>,
) -> ApiResult<RestoreResult> {
    let args = SnapshotRef {
        sandbox_id,
        snapshot_id,
    };
    Ok(Json(app.ops.restore_snapshot(&caller, args).await?))
}

async fn delete_snapshot(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((sandbox_id, snapshot_id)): Path<(String, String)>,
) -> ApiResult<SnapshotDeleted> {
    let args = SnapshotRef {
        sandbox_id,
        snapshot_id,
    };
    Ok(Json(app.ops.delete_snapshot(&caller, args).await?))
}

async fn python(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<PythonResult> {
    let args = json_body(&[("sandbox_id", &id)], &headers, &body)?;
    Ok(Json(app.ops.execute_python_code(&caller, args, None).await?))
}

async fn shell(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<CommandResult> {
    let args = json_body(&[("sandbox_id", &id)], &headers, &body)?;
    Ok(Json(app.ops.execute_terminal_command(&caller, args, None).await?))
}

async fn install(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<InstallResult> {
    let args = json_body(&[("sandbox_id", &id)], &headers, &body)?;
    Ok(Json(
        app.ops.install_package_in_sandbox(&caller, args, INSTALL_WAIT).await?,
    ))
}

async fn install_status(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(query): Query<serde_json::Map<String, serde_json::Value>>,
) -> ApiResult<InstallResult> {
    let args = verb_args(&[("sandbox_id", &id)], query)
        .map_err(|e| ApiError::Ops(OpsError::InvalidArgument(format!("query: {e}"))))?;
    Ok(Json(app.ops.check_package_installation_status(&caller, args).await?))
}

async fn files(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<FileList> {
    Ok(Json(
        app.ops
            .list_result_files(&caller, SandboxRef { sandbox_id: id })
            .await?,
    ))
}

/// The body is the file's bytes.
async fn upload(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(args): Query<UploadBytes>,
    body: Bytes,
) -> ApiResult<UploadResult> {
    Ok(Json(app.ops.upload_bytes(&caller, &id, args, body).await?))
}

/// A fresh guest key for `client`, or the response refusing one.
/// The refusal is boxed: a response is large and the key the common case.
pub async fn guest_key_for(app: &AppState, client: ClientIp) -> Result<(String, Guest), Box<Response>> {
    let Some(guests) = app.ops.limits.keys().guests() else {
        return Err(Box::new(error(
            StatusCode::NOT_FOUND,
            "guest keys are not enabled on this server ([guest] enabled)",
        )));
    };
    if let Err(wait) = app.ops.limits.check_guest_issue(client.0) {
        return Err(Box::new(refusal(
            StatusCode::TOO_MANY_REQUESTS,
            wait.seconds(),
            &format!(
                "this address has had its guest keys for this hour; retry in {} s",
                wait.seconds()
            ),
        )));
    }
    // In a cluster the hour's keys are counted over every node.
    if let Some(cluster) = &app.ops.cluster {
        let most = app.ops.limits.guest().keys_per_ip_per_hour;
        match cluster.take_guest_issue(&client.0.to_string(), most).await {
            Ok(true) => {}
            Ok(false) => {
                return Err(Box::new(error(
                    StatusCode::TOO_MANY_REQUESTS,
                    "this address has had its guest keys for this hour from the cluster's nodes; retry later",
                )))
            }
            Err(e) => return Err(Box::new(error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()))),
        }
    }
    app.ops.metrics.guest_key_issued();
    Ok(guests.issue(unix_now()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UsageQuery {
    from: Option<String>,
    to: Option<String>,
    granularity: Option<String>,
    tenant: Option<String>,
}

/// The caller's usage (an administrator's: everyone's, or `tenant`'s), as
/// JSON, or CSV when the client accepts `text/csv`.
async fn usage(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    query: Result<Query<UsageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::Ops(OpsError::InvalidArgument(e.body_text())))?;
    let period = Period::parse(q.from.as_deref(), q.to.as_deref(), q.granularity.as_deref())?;
    let report = app.ops.usage(&caller, q.tenant.as_deref(), period).await?;
    let csv = headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/csv"));
    // CSV has no room for the nodes whose figures are missing: a header
    // names them (node names are lower-case letters, digits and `-`).
    let missing = report.missing_nodes.join(",");
    let mut response = match csv {
        true => (
            [(axum::http::header::CONTENT_TYPE, "text/csv; charset=utf-8")],
            report.csv(),
        )
            .into_response(),
        false => Json(report).into_response(),
    };
    if let (false, Ok(value)) = (missing.is_empty(), axum::http::HeaderValue::from_str(&missing)) {
        response.headers_mut().insert(MISSING_NODES, value);
    }
    Ok(response)
}

/// The header of a usage report that lacks some nodes' figures.
const MISSING_NODES: &str = "x-mcp-sandbox-missing-nodes";

/// `POST /api/guest`: `{key, expires_at, tenant}`.
pub async fn guest_key(State(app): State<AppState>, Extension(client): Extension<ClientIp>) -> Response {
    match guest_key_for(&app, client).await {
        Ok((key, guest)) => {
            let expires = time::OffsetDateTime::from_unix_timestamp(guest.expires_at as i64)
                .ok()
                .map(crate::ops::timestamps::rfc3339);
            (
                StatusCode::CREATED,
                Json(serde_json::json!({"key": key, "expires_at": expires, "tenant": guest.owner})),
            )
                .into_response()
        }
        Err(r) => *r,
    }
}
