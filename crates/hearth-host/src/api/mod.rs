//! The host agent's private HTTP + WebSocket API: exactly the commands of
//! [`hearth_hostapi::HostApi`], which a remote control plane drives
//! (`hearth_hostapi::remote`). Every request but `/healthz` is
//! authenticated (`access.rs`): in a fleet it carries a signed command
//! (`fence.rs`), on a standalone host the host's bearer token (`token.rs`);
//! without either it is a 401. Every failure is answered with LangSmith's
//! error envelope whose `error` is the host's error kind:
//!
//! ```text
//! {"detail": {"error": "not_found", "error_id": "<uuid>", "message": "…"}}
//! ```
//!
//! | method and path                          | command                              |
//! |------------------------------------------|--------------------------------------|
//! | `GET /healthz`                           | `{"status":"ok","accel":"tcg"}` (no credentials) |
//! | `GET /v1/status`                         | `HostStatus`                         |
//! | `GET /v1/vms`                            | `{"vms":[VmRecord…]}`                |
//! | `PUT /v1/vms/{id}` (`CreateVm`)          | 201 + `VmRecord` once ready          |
//! | `GET`, `DELETE /v1/vms/{id}`             | `VmRecord`; 204                      |
//! | `POST /v1/vms/{id}/start` (`Resize`)     | `VmRecord`                           |
//! | `POST /v1/vms/{id}/stop` (`StopVm`)      | `VmRecord`                           |
//! | `POST /v1/vms/{id}/forget`               | 204                                  |
//! | `POST /v1/vms/{id}/claim` (`ClaimVm`)    | `VmRecord` once the member is ready  |
//! | `PUT /v1/vms/{id}/network` (`SandboxNet`) | 204                                 |
//! | `POST /v1/vms/{id}/capture`              | `Captured`                           |
//! | `GET /v1/vms/{id}/guest`                 | WebSocket: the guest streams (`guest_relay.rs`) |
//! | `POST /v1/images/import` (`ImportImage`) | `ImportedImage`                      |
//! | `POST /v1/snapshots/delete` (`Captured`) | 204                                  |
//! | `POST /v1/volumes/copy` (`CopyVolume`)   | 204                                  |
//! | `POST /v1/store/gc`                      | `StoreGc` (one GC of the store)      |

mod access;
mod fence;
mod guest_relay;
mod token;
mod vms;

pub use access::Access;
pub use token::{read_token, ApiToken, TokenError, TOKEN_FILE};

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::{Json, Router};
use futures_util::StreamExt;
use hearth_hostapi::routes::HostRoute;
use hearth_types::VmId;
use serde::de::DeserializeOwned;

use crate::host::Host;

/// Largest JSON request body; file uploads have no limit.
pub const JSON_LIMIT: usize = 1024 * 1024;
/// After the shutdown signal, how long open requests may still finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The API's routes over `host`, every request but `/healthz`
/// authenticated as `access` says.
pub fn router(host: Arc<Host>, access: Access) -> Router {
    HostRoute::ALL
        .iter()
        .fold(Router::new(), |router, r| {
            router.route(r.pattern(), handler(*r))
        })
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(host)
        .layer(axum::middleware::from_fn_with_state(access, access::check))
}

/// The handler of a route of the table the client is written from too.
fn handler(route: HostRoute) -> MethodRouter<Arc<Host>> {
    // The method is the table's: only the handler is chosen here.
    let m = match route.method() {
        "GET" => MethodFilter::GET,
        "PUT" => MethodFilter::PUT,
        "DELETE" => MethodFilter::DELETE,
        _ => MethodFilter::POST,
    };
    match route {
        HostRoute::Health => on(m, healthz),
        HostRoute::Status => on(m, vms::status),
        HostRoute::ListVms => on(m, vms::list),
        HostRoute::VmChanges => on(m, vms::changes),
        HostRoute::GetVm => on(m, vms::get),
        HostRoute::CreateVm => on(m, vms::create),
        HostRoute::DeleteVm => on(m, vms::delete),
        HostRoute::StartVm => on(m, vms::start),
        HostRoute::StopVm => on(m, vms::stop),
        HostRoute::ForgetVm => on(m, vms::forget),
        HostRoute::ClaimVm => on(m, vms::claim),
        HostRoute::SetNetwork => on(m, vms::network),
        HostRoute::Capture => on(m, vms::capture),
        HostRoute::Guest => on(m, vms::guest),
        HostRoute::ImportImage => on(m, vms::import),
        HostRoute::DeleteSnapshot => on(m, vms::delete_snapshot),
        HostRoute::CopyVolume => on(m, vms::copy_volume),
        HostRoute::CollectGarbage => on(m, vms::collect_garbage),
    }
}

/// Serves the API on `listener` until `shutdown` resolves; requests still
/// open then get [`SHUTDOWN_GRACE`] to finish before they are dropped.
/// WebSocket sessions end with the process. Connections are bounded by
/// `limits` (header-read timeout, per peer and in total: see
/// [`hearth_listen`]); guest relays are upgraded connections, which hold
/// their slot and have no timeout of the listener's. Every request but
/// `/healthz` is authenticated as `access` says.
pub async fn serve(
    host: Arc<Host>,
    access: Access,
    listener: tokio::net::TcpListener,
    limits: hearth_listen::Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let mut options = hearth_listen::Options::new("host api", limits);
    options.grace = Some(SHUTDOWN_GRACE);
    hearth_listen::serve(listener, router(host, access), options, shutdown).await
}

async fn healthz(State(host): State<Arc<Host>>) -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok", "accel": host.accel().as_str()}))
}

async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("no route for {} {}", req.method(), req.uri().path()),
    )
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "MethodNotAllowed",
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}

/// A failed request, answered with LangSmith's error envelope.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    /// The envelope's `error`: `NotFound`, `ValidationError`, …
    pub error: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, error: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            error,
            message: message.into(),
        }
    }

    /// 400 `ValidationError`.
    pub fn validation(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "ValidationError", message)
    }

    /// 422 `ValidationError`: well-formed, but not acceptable.
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "ValidationError", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let error_id = uuid::Uuid::new_v4().to_string();
        let status = self.status.as_u16();
        if self.status.is_server_error() {
            tracing::warn!(status, error = self.error, %error_id, message = %self.message, "api request failed");
        } else {
            tracing::info!(status, error = self.error, %error_id, message = %self.message, "api request rejected");
        }
        let body = serde_json::json!({
            "detail": {"error": self.error, "error_id": error_id, "message": self.message}
        });
        (self.status, Json(body)).into_response()
    }
}

/// A WebSocket endpoint was asked for without a proper upgrade request.
fn ws_rejection(e: WebSocketUpgradeRejection) -> ApiError {
    ApiError::new(e.status(), "ValidationError", e.body_text())
}

/// The `{id}` of a route, parsed as a [`VmId`].
struct VmPath(VmId);

impl<S: Send + Sync> FromRequestParts<S> for VmPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let axum::extract::Path(raw) =
            axum::extract::Path::<String>::from_request_parts(parts, state)
                .await
                .map_err(|e| ApiError::validation(e.body_text()))?;
        raw.parse::<VmId>()
            .map(VmPath)
            .map_err(|_| ApiError::validation(format!("invalid vm id {raw:?}")))
    }
}

/// A JSON body of at most [`JSON_LIMIT`] bytes, parsed as `T`. An empty
/// body reads as `{}`, so requests whose fields are all optional need none.
struct JsonBody<T>(T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _: &S) -> Result<Self, ApiError> {
        let too_large = || {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "PayloadTooLarge",
                format!("JSON bodies are limited to {JSON_LIMIT} bytes"),
            )
        };
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > JSON_LIMIT as u64) {
            return Err(too_large());
        }
        let mut body = req.into_body().into_data_stream();
        let mut buf = Vec::new();
        while let Some(chunk) = body.next().await {
            let chunk = chunk
                .map_err(|e| ApiError::validation(format!("cannot read the request body: {e}")))?;
            if buf.len() + chunk.len() > JSON_LIMIT {
                return Err(too_large());
            }
            buf.extend_from_slice(&chunk);
        }
        parse_json(&buf).map(JsonBody)
    }
}

/// Malformed JSON is a 400; JSON of the wrong shape (types, missing
/// fields, unknown values) a 422. Messages name the offending field.
fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        bytes
    };
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = if path == "." {
            format!("invalid JSON body: {inner}")
        } else {
            format!("invalid JSON body at {path}: {inner}")
        };
        match inner.classify() {
            serde_json::error::Category::Data => ApiError::unprocessable(message),
            _ => ApiError::validation(message),
        }
    })?;
    de.end()
        .map_err(|e| ApiError::validation(format!("invalid JSON body: {e}")))?;
    Ok(value)
}

/// An empty body.
fn no_content() -> Response {
    (StatusCode::NO_CONTENT, Body::empty()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    struct Sample {
        #[serde(default)]
        n: Option<u32>,
        #[allow(dead_code)]
        name: String,
    }

    #[test]
    fn json_errors_are_classified() {
        let e = parse_json::<Sample>(b"{\"name\":").unwrap_err();
        assert_eq!(
            (e.status, e.error),
            (StatusCode::BAD_REQUEST, "ValidationError")
        );
        let e = parse_json::<Sample>(br#"{"name":"x","n":"lots"}"#).unwrap_err();
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(e.message.contains("n:"), "{}", e.message);
        let e = parse_json::<Sample>(b"").unwrap_err();
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", e.message);
        assert!(e.message.contains("name"), "{}", e.message);
        let e = parse_json::<Sample>(br#"{"name":"x"} trailing"#).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let ok = parse_json::<Sample>(br#" {"name":"x","n":3} "#).unwrap();
        assert_eq!(ok.n, Some(3));
    }
}
