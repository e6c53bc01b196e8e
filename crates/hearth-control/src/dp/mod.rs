//! LangSmith's data-plane protocol, in one place: the exec WebSocket
//! (`exec.rs`), the SSE exec transport (`sse.rs`) and file downloads with
//! ranges and validators (`files.rs`), spoken to a guest through
//! [`hearth_hostapi::GuestClient`], whether its host runs in this process
//! or elsewhere. Hosts expose guest streams, never this protocol.

pub mod exec;
pub mod files;
pub mod sse;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use hearth_guest_proto::{MuxError, OpErrorKind};
use hearth_hostapi::GuestError;

pub use exec::{exec_session, RunConfig};
pub use files::serve_download;
pub use sse::{sse_resume, sse_start};

/// A refusal of the data plane; answered as [`hearth_api::ApiError`] in
/// LangSmith's envelope.
#[derive(Debug)]
pub struct ApiError(pub hearth_api::ApiError);

impl ApiError {
    pub fn new(status: StatusCode, error: &'static str, message: impl Into<String>) -> Self {
        Self(hearth_api::ApiError::new(status.as_u16(), error, message))
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
        crate::error::HttpError(self.0).into_response()
    }
}

impl From<ApiError> for crate::error::HttpError {
    fn from(e: ApiError) -> Self {
        Self(e.0)
    }
}

/// How a failed guest operation is answered, on every data-plane path.
pub fn guest_error(e: GuestError) -> hearth_api::ApiError {
    let message = e.to_string();
    let (status, error) = match &e {
        GuestError::Op(op) => match op.kind {
            OpErrorKind::NotFound => (404, "FileNotFound"),
            OpErrorKind::PermissionDenied => (403, "PermissionDenied"),
            OpErrorKind::IsADirectory => (400, "IsADirectory"),
            OpErrorKind::NotADirectory => (400, "NotADirectory"),
            OpErrorKind::InvalidPath => (400, "InvalidPath"),
            OpErrorKind::NotAFile => (400, "NotAFile"),
            OpErrorKind::BadRequest => (400, "ValidationError"),
            OpErrorKind::AlreadyExists | OpErrorKind::DirectoryNotEmpty => (409, "Conflict"),
            OpErrorKind::ConnectionRefused => (502, "ConnectionError"),
            OpErrorKind::Unsupported | OpErrorKind::Io => (500, "CommandError"),
        },
        GuestError::Handshake(_) | GuestError::Channel(MuxError::Closed { .. }) => {
            (503, "ServiceUnavailable")
        }
        GuestError::Channel(MuxError::RequestTooLarge { .. }) => (413, "PayloadTooLarge"),
        GuestError::Channel(_) => (500, "CommandError"),
        GuestError::Protocol(_) => (502, "GuestProtocolError"),
        GuestError::Deadline(_) => (504, "GuestTimeout"),
    };
    hearth_api::ApiError::new(status, error, message)
}

impl From<GuestError> for ApiError {
    fn from(e: GuestError) -> Self {
        Self(guest_error(e))
    }
}

/// Deadline of a guest operation that answers with a single reply.
const GUEST_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// A guest operation with a single reply, bounded in time.
pub async fn guest_call<T>(
    op: impl std::future::Future<Output = Result<T, GuestError>>,
) -> Result<T, ApiError> {
    match tokio::time::timeout(GUEST_CALL_TIMEOUT, op).await {
        Ok(r) => r.map_err(ApiError::from),
        Err(_) => Err(ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "Timeout",
            format!(
                "the guest agent did not answer within {}s",
                GUEST_CALL_TIMEOUT.as_secs()
            ),
        )),
    }
}
