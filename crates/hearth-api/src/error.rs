//! The one error type of the public API and the envelope it is sent in.
//!
//! LangSmith answers errors with `{"detail": {"error", "error_id", "message"}}`,
//! except request validation, which keeps FastAPI's shape
//! `{"detail": [{"loc", "msg", "type"}]}`. The distinction is load-bearing:
//! the SDK raises its `ValidationError` (with `field = loc[-1]`) only when
//! `detail` is a list holding an item of type `value_error`; a 422 with an
//! object `detail` becomes `ResourceCreationError` on create. So
//! [`ApiError::body`] picks the list form for [`ApiError::validation`]
//! errors and the object form for everything else.
//!
//! How the SDK (langsmith 0.15.1, `sandbox/_helpers.py`) maps statuses, which
//! fixed the constructors below:
//! - 401 and 403 → `SandboxAuthenticationError` on the control plane (status
//!   only; the type string is not read); 403 → `SandboxOperationError`
//!   (`PermissionDenied`) on the data plane.
//! - 404 → `ResourceNotFoundError`; type `FileNotFound` also maps there on
//!   the data plane.
//! - 408 on create → `ResourceTimeoutError`.
//! - 409 on update → `ResourceNameConflictError` (any 409). On create a 409
//!   falls through to the generic `SandboxClientError`: the SDK never raises
//!   `ResourceAlreadyExistsError`, so no type string can select it.
//! - 422 list form → `ValidationError`; object form on create →
//!   `ResourceCreationError(error_type=detail.error)`.
//! - 429 → `QuotaExceededError`, `quota_type` guessed from words of the
//!   message (see [`QuotaKind`]).
//! - 400 `InvalidRequest` on a proxy-config update, 400 `NotReady` and 503
//!   `ServiceUnavailable` on the data plane → `SandboxNotReadyError`.
//! - 503 on create → `ResourceCreationError(error_type=detail.error)`.
//! - 502 with type `ConnectionError` → `SandboxConnectionError`; 500 →
//!   `SandboxAPIError`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// An error answer of the public API: the HTTP status, LangSmith's error
/// type name, a message for people, and for validation errors the location
/// of the offending input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// HTTP status code.
    pub status: u16,
    /// LangSmith's machine-readable error type (`detail.error`).
    pub error: &'static str,
    /// Human-readable message (`detail.message`, or `msg` of a validation item).
    pub message: String,
    /// For [`ApiError::validation`] errors: where the bad input is, FastAPI
    /// style (`["body", "mem_bytes"]`). Empty for every other error.
    pub loc: Vec<LocSegment>,
}

/// One step of a validation error's location: an object key or a list index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum LocSegment {
    Key(String),
    Index(u64),
}

impl From<&str> for LocSegment {
    fn from(s: &str) -> Self {
        Self::Key(s.to_owned())
    }
}

impl From<usize> for LocSegment {
    fn from(i: usize) -> Self {
        Self::Index(i as u64)
    }
}

/// The body of every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum ErrorBody {
    /// `{"detail": {"error", "error_id", "message"}}`: every error but
    /// request validation.
    Error { detail: ErrorDetail },
    /// `{"detail": [{"loc", "msg", "type"}]}`: request validation (422).
    Validation { detail: Vec<ValidationIssue> },
}

/// LangSmith's error detail object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// Machine-readable error type, e.g. `NotFound`, `QuotaExceeded`.
    pub error: String,
    /// Id of this occurrence, also written to the server log.
    pub error_id: String,
    /// Human-readable message.
    pub message: String,
}

/// One FastAPI-style validation item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ValidationIssue {
    /// Location of the bad input; the SDK reports the last step as the field.
    pub loc: Vec<LocSegment>,
    /// Human-readable message.
    pub msg: String,
    /// Always `value_error`, the type the SDK looks for.
    #[serde(rename = "type")]
    pub kind: String,
}

/// The error type name of validation errors.
pub const VALIDATION_ERROR: &str = "ValidationError";

pub use hearth_types::rules::QuotaKind;

/// Why provisioning a sandbox failed, as the SDK's
/// `ResourceCreationError.error_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreationFailure {
    ImagePull,
    CrashLoop,
    SandboxConfig,
    Unschedulable,
}

impl CreationFailure {
    fn name(self) -> &'static str {
        match self {
            Self::ImagePull => "ImagePull",
            Self::CrashLoop => "CrashLoop",
            Self::SandboxConfig => "SandboxConfig",
            Self::Unschedulable => "Unschedulable",
        }
    }
}

impl ApiError {
    /// An error with no location.
    pub fn new(status: u16, error: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            error,
            message: message.into(),
            loc: Vec::new(),
        }
    }

    /// 422: a request body field is invalid. `field` is a dotted path
    /// (`proxy_config.rules[0].name` or plain `mem_bytes`); the location
    /// becomes `["body", "proxy_config", "rules", 0, "name"]`.
    pub fn validation(field: &str, message: impl Into<String>) -> Self {
        let mut loc = vec![LocSegment::from("body")];
        loc.extend(parse_field_path(field));
        Self::validation_at(loc, message)
    }

    /// 422: a query parameter is invalid (`["query", param]`).
    pub fn invalid_query(param: &str, message: impl Into<String>) -> Self {
        Self::validation_at(vec!["query".into(), param.into()], message)
    }

    /// 422 at an explicit location.
    pub fn validation_at(loc: Vec<LocSegment>, message: impl Into<String>) -> Self {
        Self {
            status: 422,
            error: VALIDATION_ERROR,
            message: message.into(),
            loc,
        }
    }

    /// Whether this is a request-validation error (sent in the list form).
    pub fn is_validation(&self) -> bool {
        self.error == VALIDATION_ERROR
    }

    /// The field the SDK will report: the last key of the location.
    pub fn field(&self) -> Option<&str> {
        match self.loc.last() {
            Some(LocSegment::Key(k)) => Some(k),
            _ => None,
        }
    }

    /// 401: the `X-Api-Key` header is missing or unknown.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "invalid or missing API key")
    }

    /// 403: a runtime action by someone who is neither the sandbox's creator
    /// nor a holder of `sandboxes:exec`.
    pub fn forbidden_not_creator() -> Self {
        Self::forbidden("sandbox access denied: not the creator and missing sandboxes:exec")
    }

    /// 403 with a specific reason.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// 404 for a sandbox, by the name or id the caller used. Also the answer
    /// for a sandbox of another workspace, whose existence is hidden.
    pub fn sandbox_not_found(name_or_id: &str) -> Self {
        Self::not_found("sandbox", name_or_id)
    }

    /// 404 for a snapshot, by the id or reference the caller used.
    pub fn snapshot_not_found(reference: &str) -> Self {
        Self::not_found("snapshot", reference)
    }

    /// 404 for any named resource (`kind` is lowercase: "sandbox", "volume").
    pub fn not_found(kind: &str, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{kind} '{name}' not found"))
    }

    /// 404 on the data plane: no file at `path`.
    pub fn file_not_found(path: &str) -> Self {
        Self::new(404, "FileNotFound", format!("file '{path}' not found"))
    }

    /// 408: the sandbox did not become ready within the create's `timeout`.
    pub fn create_timeout(name: &str, timeout_secs: f64, last_status: &str) -> Self {
        Self::new(
            408,
            "Timeout",
            format!(
                "sandbox '{name}' not ready after {timeout_secs}s (last status: {last_status})"
            ),
        )
    }

    /// 409: the name is taken by another resource of the same kind.
    pub fn name_conflict(kind: &str, name: &str) -> Self {
        Self::conflict(format!("{kind} name '{name}' already in use"))
    }

    /// 409 for other conflicts (a snapshot still referenced, a login-mode
    /// service grant blocking token mode).
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(409, "Conflict", message)
    }

    /// 400: the request cannot apply in the resource's current state (the SDK
    /// turns this into `SandboxNotReadyError` after a proxy-config update).
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(400, "InvalidRequest", message)
    }

    /// 413: the request body is larger than `limit_bytes`.
    pub fn payload_too_large(limit_bytes: u64) -> Self {
        Self::new(
            413,
            "PayloadTooLarge",
            format!("request body exceeds the limit of {limit_bytes} bytes"),
        )
    }

    /// 422 with an object detail: provisioning failed for a reason the SDK
    /// reports as `ResourceCreationError.error_type`.
    pub fn creation_failed(kind: CreationFailure, message: impl Into<String>) -> Self {
        Self::new(422, kind.name(), message)
    }

    /// 429: creating or starting would exceed a workspace quota. `used`
    /// includes what the request asks for; `limit` is the quota.
    pub fn quota(kind: QuotaKind, limit: u64, used: u64) -> Self {
        Self::new(429, "QuotaExceeded", kind.refusal(limit, used))
    }

    /// 503: no host can take the sandbox (self-hosted: no ready hosts; there
    /// is no queue). The SDK retries 502/503/504 and replays the POST, so
    /// answer this before recording anything.
    pub fn no_hosts() -> Self {
        Self::new(
            503,
            "NoSandboxHostsAvailable",
            "no sandbox hosts are available to run this sandbox",
        )
    }

    /// 503 on the data plane: the sandbox exists but its runtime is not
    /// ready yet (booting, waking). The SDK retries it, and retries a
    /// WebSocket upgrade refused with it for up to 120 s.
    pub fn sandbox_not_ready(name: &str) -> Self {
        Self::new(
            503,
            "ServiceUnavailable",
            format!("sandbox '{name}' is not ready"),
        )
    }

    /// 503: a change that must reach the sandbox's host (a new
    /// `proxy_config`) did not; nothing was changed. The SDK retries it.
    pub fn host_did_not_apply(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    /// 400 on the data plane: the sandbox cannot serve the request in its
    /// current state and will not by retrying (the SDK raises
    /// `SandboxNotReadyError`). Prefer [`ApiError::sandbox_not_ready`] while
    /// it is booting or waking.
    pub fn not_ready(name: &str) -> Self {
        Self::new(400, "NotReady", format!("sandbox '{name}' is not ready"))
    }

    /// 502: the gateway could not reach the sandbox's runtime.
    pub fn connection_error(message: impl Into<String>) -> Self {
        Self::new(502, "ConnectionError", message)
    }

    /// 500 on the data plane: writing a file failed inside the sandbox.
    pub fn write_failed(message: impl Into<String>) -> Self {
        Self::new(500, "WriteError", message)
    }

    /// 500 on the data plane: reading a file failed inside the sandbox.
    pub fn read_failed(message: impl Into<String>) -> Self {
        Self::new(500, "ReadError", message)
    }

    /// 500 on the data plane: running a command failed.
    pub fn command_failed(message: impl Into<String>) -> Self {
        Self::new(500, "CommandError", message)
    }

    /// 400 on the data plane: the command could not start because of the
    /// request itself (a working directory, shell or user that does not
    /// exist, a NUL byte, an invalid environment name). The type stays
    /// `CommandError`, so the SDK raises the same `SandboxOperationError`
    /// as for [`ApiError::command_failed`].
    pub fn command_refused(message: impl Into<String>) -> Self {
        Self::new(400, "CommandError", message)
    }

    /// 400 on the data plane: the file cannot be written where the request
    /// says (a directory, a path through a file). Type `WriteError`, as
    /// [`ApiError::write_failed`], for the SDK's `SandboxOperationError`.
    pub fn write_refused(message: impl Into<String>) -> Self {
        Self::new(400, "WriteError", message)
    }

    /// 400: the request cannot be read as HTTP says it should (a body that
    /// breaks off or is malformed, a multipart stream that is not one, a
    /// path that is not UTF-8).
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 414: the request target is longer than `limit_bytes`.
    pub fn uri_too_long(limit_bytes: usize) -> Self {
        Self::new(
            414,
            "UriTooLong",
            format!("the request target exceeds the limit of {limit_bytes} bytes"),
        )
    }

    /// 431: the request's header fields are too many or too large.
    pub fn headers_too_large(message: impl Into<String>) -> Self {
        Self::new(431, "RequestHeaderFieldsTooLarge", message)
    }

    /// 500: a bug or an unexpected failure. The message stays generic; the
    /// cause goes to the log under the same error id.
    pub fn internal() -> Self {
        Self::new(500, "InternalError", "internal server error")
    }

    /// The JSON body to send, with `error_id` naming this occurrence.
    ///
    /// Validation errors use FastAPI's list form, which carries no error id;
    /// the control plane should still log it.
    pub fn body(&self, error_id: &str) -> ErrorBody {
        if self.is_validation() {
            let loc = if self.loc.is_empty() {
                vec![LocSegment::from("body")]
            } else {
                self.loc.clone()
            };
            ErrorBody::Validation {
                detail: vec![ValidationIssue {
                    loc,
                    msg: self.message.clone(),
                    kind: "value_error".to_owned(),
                }],
            }
        } else {
            ErrorBody::Error {
                detail: ErrorDetail {
                    error: self.error.to_owned(),
                    error_id: error_id.to_owned(),
                    message: self.message.clone(),
                },
            }
        }
    }
}

/// Splits `a.b[0].c` into `["a", "b", 0, "c"]`.
fn parse_field_path(path: &str) -> Vec<LocSegment> {
    let mut out = Vec::new();
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let mut rest = part;
        if let Some(open) = rest.find('[') {
            let (key, tail) = rest.split_at(open);
            if !key.is_empty() {
                out.push(LocSegment::from(key));
            }
            rest = tail;
            while let Some(stripped) = rest.strip_prefix('[') {
                let Some(close) = stripped.find(']') else {
                    out.push(LocSegment::from(rest));
                    rest = "";
                    break;
                };
                let inner = &stripped[..close];
                match inner.parse::<u64>() {
                    Ok(i) => out.push(LocSegment::Index(i)),
                    Err(_) => out.push(LocSegment::from(inner)),
                }
                rest = &stripped[close + 1..];
            }
            if !rest.is_empty() {
                out.push(LocSegment::from(rest));
            }
        } else {
            out.push(LocSegment::from(rest));
        }
    }
    out
}

/// Parses a JSON request body into `T` ([`hearth_types::body::parse_object`]),
/// turning every failure into a 422 whose `loc` names the offending field.
pub fn parse_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    hearth_types::body::parse_object(bytes).map_err(|e| {
        let mut loc = vec![LocSegment::from("body")];
        loc.extend(e.path.into_iter().map(|step| match step {
            hearth_types::body::Step::Key(k) => LocSegment::Key(k),
            hearth_types::body::Step::Index(i) => LocSegment::Index(i as u64),
        }));
        ApiError::validation_at(loc, e.message)
    })
}

impl From<hearth_types::rules::Invalid> for ApiError {
    fn from(e: hearth_types::rules::Invalid) -> Self {
        ApiError::validation(&e.field, e.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_paths_become_locations() {
        let e = ApiError::validation("proxy_config.rules[2].headers[0].name", "bad");
        assert_eq!(
            serde_json::to_value(&e.loc).unwrap(),
            serde_json::json!(["body", "proxy_config", "rules", 2, "headers", 0, "name"])
        );
        assert_eq!(e.field(), Some("name"));
        let e = ApiError::validation("labels.team", "bad");
        assert_eq!(e.field(), Some("team"));
    }

    #[test]
    fn envelope_shapes() {
        let body = serde_json::to_value(ApiError::sandbox_not_found("box").body("e1")).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"detail": {"error": "NotFound", "error_id": "e1",
                "message": "sandbox 'box' not found"}})
        );
        let body =
            serde_json::to_value(ApiError::validation("vcpus", "too small").body("e2")).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"detail": [{"loc": ["body", "vcpus"], "msg": "too small",
                "type": "value_error"}]})
        );
        // Creation failures are 422 too, but in the object form.
        let body = serde_json::to_value(
            ApiError::creation_failed(CreationFailure::ImagePull, "pull failed").body("e3"),
        )
        .unwrap();
        assert_eq!(body["detail"]["error"], "ImagePull");
    }
}
