//! The host's commands ([`HostApi`], served through [`InProcessHost`]),
//! one route each. Errors travel as LangSmith's envelope whose `error` is
//! the [`ErrorKind`], so a remote client gets back the same
//! [`HostApiError`] the host produced.

use std::sync::Arc;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use hearth_hostapi::{
    Captured, ClaimVm, CreateVm, ErrorKind, HostApi, HostApiError, HostStatus, ImportImage,
    ImportedImage, Resize, SandboxNet, StopVm, StoreGc, VmRecord,
};
use serde::Deserialize;

use super::{no_content, ws_rejection, ApiError, JsonBody, VmPath};
use crate::host::Host;
use crate::local::InProcessHost;

/// The HTTP status of each kind of failure.
pub(crate) fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::WrongState | ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::Invalid => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Refused => StatusCode::FORBIDDEN,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<HostApiError> for ApiError {
    fn from(e: HostApiError) -> Self {
        ApiError::new(status_of(e.kind), e.kind.as_str(), e.message)
    }
}

fn api(host: Arc<Host>) -> InProcessHost {
    InProcessHost::new(host)
}

/// Runs a command as its own task, so a client that disconnects cannot
/// abandon a boot or a stop half way.
async fn detached<T: Send + 'static>(
    op: impl std::future::Future<Output = Result<T, HostApiError>> + Send + 'static,
) -> Result<T, ApiError> {
    match tokio::spawn(op).await {
        Ok(r) => r.map_err(ApiError::from),
        Err(e) => Err(ApiError::internal(format!("host operation failed: {e}"))),
    }
}

pub(super) async fn status(State(host): State<Arc<Host>>) -> Result<Json<HostStatus>, ApiError> {
    Ok(Json(api(host).status().await?))
}

pub(super) async fn list(
    State(host): State<Arc<Host>>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let vms = api(host).list_vms().await?;
    Ok(Json(serde_json::json!({ "vms": vms })))
}

/// The body of `POST /v1/vm-changes`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ChangesSince {
    since: Option<hearth_hostapi::ChangeCursor>,
}

pub(super) async fn changes(
    State(host): State<Arc<Host>>,
    JsonBody(req): JsonBody<ChangesSince>,
) -> Result<Json<hearth_hostapi::VmChanges>, ApiError> {
    Ok(Json(api(host).vm_changes(req.since).await?))
}

/// `PUT /v1/vms/{id}`: boots the VM with that id.
pub(super) async fn create(
    State(host): State<Arc<Host>>,
    VmPath(id): VmPath,
    JsonBody(mut req): JsonBody<CreateVm>,
) -> Result<Response, ApiError> {
    if req.id.is_some_and(|body_id| body_id != id) {
        return Err(ApiError::validation(
            "the body names another VM than the path",
        ));
    }
    req.id = Some(id);
    let rec = detached(async move { api(host).create_vm(req).await }).await?;
    Ok((StatusCode::CREATED, Json(rec)).into_response())
}

pub(super) async fn get(
    State(host): State<Arc<Host>>,
    VmPath(id): VmPath,
) -> Result<Json<VmRecord>, ApiError> {
    Ok(Json(api(host).get_vm(id, 0).await?))
}

pub(super) async fn delete(
    State(host): State<Arc<Host>>,
    VmPath(id): VmPath,
) -> Result<Response, ApiError> {
    detached(async move { api(host).delete_vm(id, 0).await }).await?;
    Ok(no_content())
}

pub(super) async fn start(
    State(host): State<Arc<Host>>,
    VmPath(id): VmPath,
    JsonBody(resize): JsonBody<Resize>,
) -> Result<Json<VmRecord>, ApiError> {
    let fence = resize.fence.unwrap_or(0);
    Ok(Json(
        detached(async move { api(host).start_vm(id, fence, resize).await }).await?,
    ))
}

pub(super) async fn stop(
    State(host): State<Arc<Host>>,
    VmPath(id): VmPath,
    JsonBody(how): JsonBody<StopVm>,
) -> Result<Json<VmRecord>, ApiError> {
    Ok(Json(
        detached(async move { api(host).stop_vm(id, 0, how).await }).await?,
    ))
}

pub(super) async fn forget(
    State(host): State<Arc<Host>>,
    VmPath(id): VmPath,
) -> Result<Response, ApiError> {
    detached(async move { api(host).forget_vm(id, 0).await }).await?;
    Ok(no_content())
}

/// `POST /v1/vms/{id}/claim`: binds a pool member to its sandbox.
pub(super) async fn claim(
    State(host): State<Arc<Host>>,
    VmPath(id): VmPath,
    JsonBody(claim): JsonBody<ClaimVm>,
) -> Result<Json<VmRecord>, ApiError> {
    Ok(Json(
        detached(async move { api(host).claim_vm(id, 0, claim).await }).await?,
    ))
}

pub(super) async fn network(
    State(host): State<Arc<Host>>,
    VmPath(id): VmPath,
    JsonBody(net): JsonBody<SandboxNet>,
) -> Result<Response, ApiError> {
    api(host).set_network(id, 0, net).await?;
    Ok(no_content())
}

#[derive(Deserialize)]
pub(super) struct CaptureBody {
    volume: String,
    #[serde(default)]
    include_memory: bool,
}

pub(super) async fn capture(
    State(host): State<Arc<Host>>,
    VmPath(id): VmPath,
    JsonBody(body): JsonBody<CaptureBody>,
) -> Result<Json<Captured>, ApiError> {
    Ok(Json(
        detached(async move {
            api(host)
                .capture(id, 0, &body.volume, body.include_memory)
                .await
        })
        .await?,
    ))
}

pub(super) async fn import(
    State(host): State<Arc<Host>>,
    JsonBody(req): JsonBody<ImportImage>,
) -> Result<Json<ImportedImage>, ApiError> {
    Ok(Json(
        detached(async move { api(host).import_image(req).await }).await?,
    ))
}

pub(super) async fn copy_volume(
    State(host): State<Arc<Host>>,
    JsonBody(copy): JsonBody<hearth_hostapi::CopyVolume>,
) -> Result<Response, ApiError> {
    api(host).copy_volume_data(&copy).await?;
    Ok(no_content())
}

pub(super) async fn delete_snapshot(
    State(host): State<Arc<Host>>,
    JsonBody(captured): JsonBody<Captured>,
) -> Result<Response, ApiError> {
    api(host).delete_snapshot_data(&captured).await?;
    Ok(no_content())
}

/// `POST /v1/store/gc`: one garbage collection of the store, detached
/// from the request (a caller that gives up does not stop it halfway).
pub(super) async fn collect_garbage(
    State(host): State<Arc<Host>>,
) -> Result<Json<StoreGc>, ApiError> {
    Ok(Json(
        detached(async move { api(host).collect_garbage().await }).await?,
    ))
}

/// `GET /v1/vms/{id}/guest`: the VM's guest streams over a WebSocket (see
/// `guest_relay.rs`).
pub(super) async fn guest(
    State(host): State<Arc<Host>>,
    VmPath(id): VmPath,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let ws = ws.map_err(ws_rejection)?;
    let guest = api(host).guest(id, 0).await?;
    Ok(ws
        .max_message_size(super::guest_relay::MAX_MESSAGE)
        .on_failed_upgrade(
            move |e| tracing::info!(vm = %id, error = %e, "guest websocket upgrade failed"),
        )
        .on_upgrade(move |socket| super::guest_relay::relay(socket, guest, id)))
}
