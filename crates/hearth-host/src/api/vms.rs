//! VM lifecycle routes, guest info, and the TCP tunnel WebSocket.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{close_code, CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::{SinkExt, StreamExt};
use hearth_guest_proto::{GuestInfo, Incoming, Stream};
use hearth_types::VmId;

use super::{detached, guest_call, no_content, ws_rejection, ApiError, JsonBody, Query, VmPath};
use crate::host::{CreateVm, Host};
use crate::vm::VmRecord;

/// How long a closing WebSocket waits for the client's close frame.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

pub(super) async fn create(
    State(host): State<Arc<Host>>,
    JsonBody(req): JsonBody<CreateVm>,
) -> Result<Response, ApiError> {
    let vm = detached(async move { host.create_vm(req).await }).await?;
    Ok((StatusCode::CREATED, Json(vm.record())).into_response())
}

/// `PUT /v1/vms/{id}`: creates the VM with that id (the form signed
/// commands use, so the command names the VM it creates).
pub(super) async fn create_at(
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
    let vm = detached(async move { host.create_vm(req).await }).await?;
    Ok((StatusCode::CREATED, Json(vm.record())).into_response())
}

pub(super) async fn list(State(host): State<Arc<Host>>) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "vms": host.list() }))
}

pub(super) async fn get(
    State(host): State<Arc<Host>>,
    VmPath(id): VmPath,
) -> Result<Json<VmRecord>, ApiError> {
    Ok(Json(host.get(id)?.record()))
}

pub(super) async fn delete(
    State(host): State<Arc<Host>>,
    VmPath(id): VmPath,
) -> Result<Response, ApiError> {
    detached(async move { host.delete(id).await }).await?;
    Ok(no_content())
}

pub(super) async fn pause(
    State(host): State<Arc<Host>>,
    VmPath(id): VmPath,
) -> Result<Json<VmRecord>, ApiError> {
    Ok(Json(detached(async move { host.pause(id).await }).await?))
}

pub(super) async fn resume(
    State(host): State<Arc<Host>>,
    VmPath(id): VmPath,
) -> Result<Json<VmRecord>, ApiError> {
    Ok(Json(detached(async move { host.resume(id).await }).await?))
}

pub(super) async fn stop(
    State(host): State<Arc<Host>>,
    VmPath(id): VmPath,
) -> Result<Json<VmRecord>, ApiError> {
    Ok(Json(detached(async move { host.stop(id).await }).await?))
}

pub(super) async fn kill(
    State(host): State<Arc<Host>>,
    VmPath(id): VmPath,
) -> Result<Json<VmRecord>, ApiError> {
    Ok(Json(detached(async move { host.kill(id).await }).await?))
}

pub(super) async fn info(
    State(host): State<Arc<Host>>,
    VmPath(id): VmPath,
) -> Result<Json<GuestInfo>, ApiError> {
    let guest = host.guest(id)?;
    Ok(Json(guest_call(guest.info()).await?))
}

#[derive(serde::Deserialize)]
pub(super) struct TcpQuery {
    port: u16,
}

/// `GET /v1/vms/{id}/tcp?port=N`: dials the port inside the guest before
/// upgrading (so a refused connection is an HTTP error), then carries its
/// bytes in binary frames both ways.
pub(super) async fn tcp(
    State(host): State<Arc<Host>>,
    VmPath(id): VmPath,
    Query(q): Query<TcpQuery>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let ws = ws.map_err(ws_rejection)?;
    let guest = host.guest(id)?;
    let stream = guest_call(guest.dial(q.port)).await?;
    let port = q.port;
    Ok(ws
        .on_failed_upgrade(
            move |e| tracing::info!(vm = %id, port, error = %e, "tcp websocket upgrade failed"),
        )
        .on_upgrade(move |socket| tunnel(socket, stream, id, port)))
}

async fn tunnel(socket: WebSocket, stream: Stream, vm: VmId, port: u16) {
    let (tx, mut rx) = stream.split();
    let (mut sink, mut source) = socket.split();
    // Client → guest. A client close ends its direction (EOF to the port);
    // WebSocket has no half-close, so it also ends the tunnel.
    let upstream = async {
        while let Some(msg) = source.next().await {
            let data = match msg {
                Ok(Message::Binary(b)) => b,
                Ok(Message::Text(t)) => bytes::Bytes::copy_from_slice(t.as_str().as_bytes()),
                Ok(Message::Ping(_) | Message::Pong(_)) => continue,
                Ok(Message::Close(_)) | Err(_) => break,
            };
            if tx.send_data(data).await.is_err() {
                return;
            }
        }
        let _ = tx.send_eof();
    };
    // Guest → client; the port's EOF closes the WebSocket normally.
    let downstream = async {
        loop {
            let close = match rx.recv().await {
                Some(Incoming::Data(d)) => {
                    if sink.send(Message::Binary(d)).await.is_err() {
                        return false;
                    }
                    continue;
                }
                Some(Incoming::Ctl(_)) => continue,
                Some(Incoming::Eof) => CloseFrame {
                    code: close_code::NORMAL,
                    reason: "".into(),
                },
                msg @ (Some(Incoming::Close(_)) | None) => {
                    let reason = match msg {
                        Some(Incoming::Close(Some(r))) => r.message,
                        _ => "the guest closed the connection".to_owned(),
                    };
                    CloseFrame {
                        code: close_code::ERROR,
                        reason: truncate_reason(&reason).into(),
                    }
                }
            };
            let _ = sink.send(Message::Close(Some(close))).await;
            return true;
        }
    };
    {
        tokio::pin!(upstream, downstream);
        tokio::select! {
            () = &mut upstream => {}
            closed = &mut downstream => {
                if closed {
                    let _ = tokio::time::timeout(CLOSE_WAIT, &mut upstream).await;
                }
            }
        }
    }
    // Completes the close handshake when the client started it.
    let _ = tokio::time::timeout(Duration::from_secs(1), sink.close()).await;
    tracing::debug!(vm = %vm, port, "tcp tunnel ended");
}

/// A close frame's reason must fit in 123 bytes.
fn truncate_reason(s: &str) -> String {
    let mut end = s.len().min(120);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}
