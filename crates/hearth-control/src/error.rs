//! The HTTP face of errors: every failure leaves as LangSmith's envelope.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use hearth_api::{ApiError, CreationFailure};
use hearth_db::DbError;

use crate::domain::error::{DomainError, Input, ProvisionFailure};

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

/// Maps database failures that can reach a client (through the domain's
/// reading of them); anything unexpected is logged there and answered 500
/// without detail.
pub fn db_error(e: DbError) -> ApiError {
    DomainError::from(e).into()
}

/// A refusal made before a handler runs (an extractor's: the caller's
/// key, the body's size), in the domain's words: a LangSmith handler
/// answers it in LangSmith's envelope, an E2B handler in E2B's.
#[derive(Debug)]
pub struct Refusal(pub DomainError);

impl From<DomainError> for Refusal {
    fn from(e: DomainError) -> Self {
        Self(e)
    }
}

impl From<Refusal> for HttpError {
    fn from(e: Refusal) -> Self {
        e.0.into()
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        HttpError::from(self).into_response()
    }
}

impl From<DomainError> for HttpError {
    fn from(e: DomainError) -> Self {
        Self(e.into())
    }
}

/// The domain's error in LangSmith's words: the status and error type the
/// SDK maps (see `hearth_api::error`).
impl From<DomainError> for ApiError {
    fn from(e: DomainError) -> Self {
        match e {
            DomainError::Unauthenticated(None) => ApiError::unauthorized(),
            DomainError::Unauthenticated(Some(why)) => ApiError::new(401, "Unauthorized", why),
            DomainError::Forbidden(m) => ApiError::forbidden(m),
            DomainError::NotFound { kind, name } => ApiError::not_found(kind, &name),
            DomainError::FileNotFound(path) => ApiError::file_not_found(&path),
            DomainError::NoRoute(m) => ApiError::new(404, "NotFound", m),
            DomainError::MethodNotAllowed(m) => ApiError::new(405, "MethodNotAllowed", m),
            DomainError::LinkGone {
                revoked: false,
                message,
            } => ApiError::new(410, "LinkExpired", message),
            DomainError::LinkGone {
                revoked: true,
                message,
            } => ApiError::new(410, "LinkRevoked", message),
            DomainError::NameTaken { kind, name } => ApiError::name_conflict(kind, &name),
            DomainError::Conflict(m) => ApiError::conflict(m),
            DomainError::Invalid(Input::Body, i) => ApiError::validation(&i.field, i.message),
            DomainError::Invalid(Input::Query, i) => ApiError::invalid_query(&i.field, i.message),
            DomainError::WrongState(m) => ApiError::invalid_request(m),
            DomainError::BadRequest(m) => ApiError::bad_request(m),
            DomainError::TooLarge(limit) => ApiError::payload_too_large(limit),
            DomainError::UriTooLong(limit) => ApiError::uri_too_long(limit),
            DomainError::HeadersTooLarge(m) => ApiError::headers_too_large(m),
            DomainError::Quota { kind, limit, used } => ApiError::quota(kind, limit, used),
            // The SDK retries the 503 and replays the POST.
            DomainError::NoHosts => ApiError::no_hosts(),
            DomainError::NotReady { name } => ApiError::sandbox_not_ready(&name),
            DomainError::HostFailed(m) => ApiError::host_did_not_apply(m),
            DomainError::Unreachable(m) => ApiError::new(502, "ServiceUnavailable", m),
            DomainError::Timeout {
                name,
                secs,
                last_status,
            } => ApiError::create_timeout(&name, secs, &last_status),
            DomainError::ProvisionFailed {
                why: ProvisionFailure::Crashed,
                message,
            } => ApiError::creation_failed(CreationFailure::CrashLoop, message),
            DomainError::Internal => ApiError::internal(),
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
        t if crate::dp::exec::is_refusal(t) => ApiError::command_refused(message),
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
