//! The HTTP face of errors: every failure leaves as LangSmith's envelope.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use hearth_api::ApiError;
use hearth_db::DbError;

/// Why the control plane could not open.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("database")]
    Db(#[from] DbError),
    #[error("secrets")]
    Secret(#[from] crate::secrets::SecretError),
}

/// An [`ApiError`] as an axum response.
#[derive(Debug)]
pub struct HttpError(pub ApiError);

impl From<ApiError> for HttpError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl From<DbError> for HttpError {
    fn from(e: DbError) -> Self {
        Self(db_error(e))
    }
}

/// Maps database failures that can reach a client; anything unexpected is
/// logged here and answered 500 without detail.
pub fn db_error(e: DbError) -> ApiError {
    match e {
        DbError::NotFound { what } => ApiError::not_found(what, ""),
        DbError::Conflict { what } => ApiError::conflict(format!("{what} already exists")),
        DbError::Stale { what } => ApiError::conflict(format!("{what} changed meanwhile; retry")),
        DbError::Quota {
            kind,
            limit,
            used,
            requested,
        } => {
            let kind = match kind {
                hearth_db::QuotaKind::Sandboxes => hearth_api::QuotaKind::SandboxCount,
                hearth_db::QuotaKind::Cpu => hearth_api::QuotaKind::Cpu,
                hearth_db::QuotaKind::Memory => hearth_api::QuotaKind::Memory,
                hearth_db::QuotaKind::Storage => hearth_api::QuotaKind::Storage,
                hearth_db::QuotaKind::Snapshots => hearth_api::QuotaKind::SnapshotCount,
            };
            // The message names what the workspace would hold with the
            // request granted, as `ApiError::quota` expects.
            ApiError::quota(kind, limit, used.saturating_add(requested))
        }
        // Placement retries on fresher numbers; when it still finds none,
        // no host has room: the SDK retries the 503.
        DbError::NoRoom { .. } => ApiError::no_hosts(),
        DbError::TooMany { what, limit } => ApiError::conflict(format!(
            "too many {what}: the limit is {limit} per workspace"
        )),
        DbError::InvalidCursor => ApiError::invalid_query("cursor", "malformed or foreign cursor"),
        other => {
            tracing::error!(error = %hearth_types::error_chain(&other), "database failure");
            ApiError::internal()
        }
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let e = self.0;
        let error_id = uuid::Uuid::now_v7().to_string();
        if e.status >= 500 {
            tracing::warn!(status = e.status, error = e.error, %error_id, message = %e.message, "request failed");
        } else {
            tracing::debug!(status = e.status, error = e.error, %error_id, message = %e.message, "request refused");
        }
        let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (status, axum::Json(e.body(&error_id))).into_response();
        if e.status == 503 || e.status == 429 {
            resp.headers_mut()
                .insert("retry-after", HeaderValue::from_static("1"));
        }
        resp
    }
}

pub type HttpResult<T> = Result<T, HttpError>;

/// How a command that ended in an error is answered over HTTP: a timeout
/// is 408; a start the request made impossible (a working directory,
/// shell or user that does not exist, …) is 400; anything else is 500.
pub fn exec_failure(t: hearth_guest_proto::ExecErrorType, message: String) -> ApiError {
    match t {
        hearth_guest_proto::ExecErrorType::CommandTimeout => {
            ApiError::new(408, "CommandTimeout", message)
        }
        t if crate::dp::is_refusal(t) => ApiError::command_refused(message),
        _ => ApiError::command_failed(message),
    }
}

/// Logs a fenced status update's failure: losing the race it is fenced
/// against (the sandbox moved on, or is gone) is expected and logged at
/// debug; anything else is a warning with its cause.
pub(crate) fn log_status_error(
    sandbox: hearth_types::SandboxId,
    what: &str,
    result: Result<hearth_db::SandboxRow, DbError>,
) {
    match result {
        Ok(_) => {}
        Err(e @ (DbError::Stale { .. } | DbError::NotFound { .. })) => {
            tracing::debug!(%sandbox, error = %e, "not {what}: it changed meanwhile")
        }
        Err(e) => tracing::warn!(%sandbox, error = %e, "cannot record the sandbox as {what}"),
    }
}
