//! Signed commands on the host's private API (`hearth host serve
//! --control`): every request but `/healthz` must carry a `hearth-command`
//! header the control plane signed for this host, its lease epoch, the
//! request's method and path, its body, the VM the path names and the VM's
//! placement generation (see `hearth-fence`). A request without one is a
//! 401 `CommandRefused` (`missing_command`); a command that does not verify
//! a 403 `CommandRefused`. Either message starts with the reason;
//! `hearth-fence` logs a refused command once.

use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hearth_fence::Verifier;

use super::{ApiError, JSON_LIMIT};

/// The VM a path is about: `/v1/vms/{id}[/…]`.
fn subject(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1/vms/")?;
    let id = rest.split('/').next()?;
    (!id.is_empty()).then_some(id)
}

/// Passes `req` on only when it carries a command `verifier` accepts.
pub(super) async fn check(verifier: &Verifier, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let token = match parts.headers.get(hearth_fence::HEADER_NAME) {
        Some(v) => v.to_str().unwrap_or_default().to_owned(),
        None => {
            return super::access::unauthorized(
                "CommandRefused",
                hearth_fence::HEADER_NAME,
                "missing_command: the request carries no signed command \
                 (this host takes only commands its control plane signed)",
            );
        }
    };
    // A command's body is small JSON; a WebSocket upgrade has none.
    let bytes = match axum::body::to_bytes(body, JSON_LIMIT).await {
        Ok(b) => b,
        Err(_) => {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "PayloadTooLarge",
                format!("command bodies are limited to {JSON_LIMIT} bytes"),
            )
            .into_response()
        }
    };
    let action = hearth_fence::action(parts.method.as_str(), parts.uri.path());
    let verified = match verifier.verify(&token, &action, &bytes, hearth_fence::now_ms()) {
        Ok(v) => v,
        Err(refusal) => return refused(refusal.reason(), &refusal.to_string()),
    };
    if verified.subject.as_deref() != subject(parts.uri.path()) {
        tracing::warn!(
            reason = "wrong_subject",
            signed = ?verified.subject,
            path = parts.uri.path(),
            "command refused"
        );
        return refused(
            "wrong_subject",
            "the command was signed for another VM than the path names",
        );
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

fn refused(reason: &str, message: &str) -> Response {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "CommandRefused",
        format!("{reason}: {message}"),
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::subject;

    #[test]
    fn the_subject_is_the_vm_the_path_names() {
        assert_eq!(subject("/v1/vms/abc"), Some("abc"));
        assert_eq!(subject("/v1/vms/abc/stop"), Some("abc"));
        assert_eq!(subject("/v1/vms"), None);
        assert_eq!(subject("/v1/vms/"), None);
        assert_eq!(subject("/healthz"), None);
    }
}
