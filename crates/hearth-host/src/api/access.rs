//! Who may call the host API. Every request but `/healthz` is
//! authenticated, whichever way the host serves:
//!
//! - [`Access::Signed`] (`hearth host serve --control`): a command the
//!   control plane signed for this host, its lease epoch, the request and
//!   the VM (`fence.rs`);
//! - [`Access::Token`] (standalone): the bearer token of
//!   `<data>/host-api.token` (`token.rs`).
//!
//! A request without credentials is a 401 whose `WWW-Authenticate` names
//! what to send; there is no unauthenticated mode. `/healthz` says only
//! that the agent is up and which accelerator its guests get.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hearth_fence::Verifier;

use super::token::ApiToken;
use super::ApiError;

/// How the host API authenticates its callers.
#[derive(Clone)]
pub enum Access {
    /// A fleet member's: every request carries a signed command.
    Signed(Arc<Verifier>),
    /// A standalone host's: every request carries the host's API token.
    Token(Arc<ApiToken>),
}

pub(super) async fn check(State(access): State<Access>, req: Request, next: Next) -> Response {
    if req.uri().path() == "/healthz" {
        return next.run(req).await;
    }
    match access {
        Access::Signed(verifier) => super::fence::check(&verifier, req, next).await,
        Access::Token(token) => check_token(&token, req, next).await,
    }
}

async fn check_token(token: &ApiToken, req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(given) if token.matches(given.trim()) => next.run(req).await,
        Some(_) => {
            tracing::warn!(
                method = %req.method(),
                path = req.uri().path(),
                "host API request with a wrong token refused"
            );
            unauthorized(
                "Unauthorized",
                "Bearer",
                "invalid_token: the bearer token is not this host's API token \
                 (host-api.token in the host's data directory)",
            )
        }
        None => unauthorized(
            "Unauthorized",
            "Bearer",
            "missing_token: this host API needs `Authorization: Bearer <token>`, the token \
             being in host-api.token in the host's data directory (readable by root only)",
        ),
    }
}

/// A 401 in the API's envelope (`error` its type), with
/// `WWW-Authenticate: <scheme>`.
pub(super) fn unauthorized(error: &'static str, scheme: &'static str, message: &str) -> Response {
    let mut resp = ApiError::new(StatusCode::UNAUTHORIZED, error, message).into_response();
    resp.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(scheme));
    resp
}
