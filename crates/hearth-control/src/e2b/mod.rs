//! E2B's API, a second front door over the same sandboxes (issue 20):
//! the control REST API the `e2b` SDKs call (`api.rs`) and envd's data
//! plane (`envd.rs`: `/health`, `/files` and the Connect-RPC process and
//! filesystem services), on the same listener as LangSmith's API. Each
//! request is parsed here into Hearth's own types and commands
//! ([`Control::create_sandbox`], stops, starts, deletes, deadlines, the
//! guest's exec and file operations); nothing of E2B's wire reaches the
//! domain.
//!
//! Control calls authenticate with `X-API-KEY` (a Hearth API key: its
//! workspace and permissions apply); envd calls name their sandbox in
//! `E2b-Sandbox-Id` and carry its `X-Access-Token`, a runtime token
//! ([`crate::runtime_tokens`]) handed out as `envdAccessToken` by create
//! and connect, and by get to callers with runtime access. Errors are E2B's
//! `{"code", "message"}` with the status its SDK maps.

mod api;
mod connect;
mod envd;
pub(crate) mod hosts;
mod metrics;

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use hearth_api::ApiError;

use crate::error::HttpError;
use crate::Control;

/// The envd version Hearth reports: it unlocks in the SDK what is served
/// here (stdin 0.3.0, no forced `user` 0.4.0, `CloseStdin` 0.5.2,
/// octet-stream uploads 0.5.7) and nothing more (file metadata 0.6.2 and
/// the watch features after it are not served).
pub const ENVD_VERSION: &str = "0.5.7";

/// E2B's error answer: `{"code": <status>, "message": …}`.
#[derive(Debug)]
pub struct E2bError {
    pub status: u16,
    pub message: String,
}

impl E2bError {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, message)
    }
}

impl From<ApiError> for E2bError {
    fn from(e: ApiError) -> Self {
        // A LangSmith validation error names its field in `loc`; E2B's
        // shape has only the message, so the field goes into it.
        let field = match e.loc.last() {
            Some(hearth_api::error::LocSegment::Key(k)) => format!("{k}: "),
            _ => String::new(),
        };
        // LangSmith answers a bad field 422; E2B's SDK maps 400.
        let status = if e.status == 422 { 400 } else { e.status };
        Self::new(status, format!("{field}{}", e.message))
    }
}

impl From<HttpError> for E2bError {
    fn from(e: HttpError) -> Self {
        e.0.into()
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        if self.status >= 500 {
            tracing::warn!(status = self.status, message = %self.message, "e2b request failed");
        }
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (
            status,
            axum::Json(serde_json::json!({"code": self.status, "message": self.message})),
        )
            .into_response();
        if self.status == 503 || self.status == 429 {
            resp.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        resp
    }
}

pub type E2bResult<T> = Result<T, E2bError>;

/// Which of E2B's two wires a request path is on, if either: refusals
/// made before a handler runs (the request guard) answer in its shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Door {
    /// The control API's REST (`{"code": <int>, "message"}`).
    Control,
    /// envd's Connect-RPC services (`{"code": <string>, "message"}`).
    Connect,
}

impl Door {
    pub(crate) fn refuse(self, e: ApiError) -> Response {
        match self {
            Door::Control => E2bError::from(e).into_response(),
            Door::Connect => connect::ConnectError::invalid(e.message).into_response(),
        }
    }
}

/// The door of `path` (raw, as requested), `None` for LangSmith's.
pub(crate) fn door_of(path: &str) -> Option<Door> {
    if path.starts_with("/process.Process/") || path.starts_with("/filesystem.Filesystem/") {
        return Some(Door::Connect);
    }
    let control = [
        "/sandboxes",
        "/snapshots",
        "/templates/",
        "/files",
        "/health",
    ]
    .iter()
    .any(|p| path == p.trim_end_matches('/') || path.starts_with(p))
        || path == "/v2/sandboxes"
        || (path.starts_with("/v2/sandboxes/")
            && (path.ends_with("/connect") || path.ends_with("/logs")));
    control.then_some(Door::Control)
}

/// The door of a request: E2B's for its paths, and for any request that
/// names a sandbox's port (by host or `E2b-Sandbox-Port`, see
/// [`hosts`]); `None` for LangSmith's.
pub(crate) fn door_of_request(c: &Control, req: &axum::extract::Request) -> Option<Door> {
    door_of(req.uri().path()).or_else(|| hosts::names_sandbox(c, req).then_some(Door::Control))
}

/// E2B's routes, merged into the public router.
pub(crate) fn routes() -> Router<Arc<Control>> {
    Router::new()
        .route("/sandboxes", post(api::create).get(api::list))
        .route("/v2/sandboxes", post(api::create).get(api::list))
        .route("/sandboxes/{id}", get(api::detail).delete(api::kill))
        .route("/sandboxes/{id}/timeout", post(api::set_timeout))
        .route("/sandboxes/{id}/pause", post(api::pause))
        .route("/sandboxes/{id}/connect", post(api::connect))
        .route("/sandboxes/{id}/resume", post(api::connect))
        .route("/v2/sandboxes/{id}/connect", post(api::connect))
        .route("/sandboxes/{id}/metrics", get(metrics::metrics))
        .route("/sandboxes/{id}/logs", get(api::not_served_route))
        .route("/v2/sandboxes/{id}/logs", get(api::not_served_route))
        .route("/sandboxes/{id}/refreshes", post(api::not_served_route))
        .route("/sandboxes/{id}/snapshots", post(api::create_snapshot))
        .route("/snapshots", get(api::list_snapshots))
        .route(
            "/templates/{id}",
            axum::routing::delete(api::delete_template),
        )
        .route("/sandboxes/{id}/fork", post(api::fork))
        .route(
            "/sandboxes/{id}/network",
            axum::routing::put(api::update_network),
        )
        .route("/health", get(envd::health))
        .route(
            "/files",
            get(envd::download)
                .post(envd::upload)
                .layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route(
            "/process.Process/StreamInput",
            post(envd::stream_input).layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route("/process.Process/{method}", post(envd::process))
        .route("/filesystem.Filesystem/{method}", post(envd::filesystem))
}
