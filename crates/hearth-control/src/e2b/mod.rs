//! E2B's API, a second front door over the same sandboxes (issue 20):
//! the control REST API the `e2b` SDKs call (`api.rs`) and envd's data
//! plane (`envd/`: `/health`, `/files` and the Connect-RPC process and
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
mod builds;
pub(crate) use api::not_served_route;
mod connect;
mod envd;
mod fork;
pub(crate) mod hosts;
mod logs;
mod metrics;
mod network;
mod rules;
mod secrets;
mod snapshots;
mod templates;
mod volume_content;
mod volumes;

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::Router;

use crate::domain::error::DomainError;
use crate::error::Refusal;
use crate::Control;

/// The envd version Hearth reports: it unlocks in the SDK what is served
/// here (stdin 0.3.0, the sandbox's own default user 0.4.0, `CloseStdin`
/// 0.5.2, octet-stream and gzip uploads 0.5.7, file metadata 0.6.2,
/// entries in watch events 0.6.3) and nothing more (watches of network
/// mounts are 0.6.4).
pub const ENVD_VERSION: &str = "0.6.3";

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

    /// What E2B's edge answers for a sandbox it cannot reach: a 502 whose
    /// message says the sandbox "was not found", which the SDKs read as
    /// killed or past its timeout (`SandboxNotRunningException`, and
    /// `is_running()` false when envd's health answers it).
    pub fn not_running(id: impl std::fmt::Display) -> Self {
        Self::new(
            502,
            format!("sandbox {id} was not found: it is not running (killed, paused or past its timeout)"),
        )
    }
}

/// The domain's error in E2B's words: the status its SDK maps
/// (400 for a bad input, whose message names the field).
impl From<DomainError> for E2bError {
    fn from(e: DomainError) -> Self {
        let status = match &e {
            DomainError::Unauthenticated(_) => 401,
            DomainError::Forbidden(_) => 403,
            DomainError::NotFound { .. }
            | DomainError::FileNotFound(_)
            | DomainError::NoRoute(_) => 404,
            DomainError::MethodNotAllowed(_) => 405,
            DomainError::LinkGone { .. } => 410,
            DomainError::NameTaken { .. } | DomainError::Conflict(_) => 409,
            DomainError::Invalid(..)
            | DomainError::WrongState(_)
            | DomainError::BadRequest(_)
            | DomainError::ProvisionFailed { .. } => 400,
            DomainError::TooLarge(_) => 413,
            DomainError::UriTooLong(_) => 414,
            DomainError::HeadersTooLarge(_) => 431,
            DomainError::Quota { .. } => 429,
            DomainError::NoHosts | DomainError::NotReady { .. } | DomainError::HostFailed(_) => 503,
            DomainError::Timeout { .. } => 408,
            DomainError::Unreachable(_) => 502,
            DomainError::Internal => 500,
        };
        let message = match e {
            // The rule's message names the field, as E2B's SDK shows it;
            // one that does not gets the field in front.
            DomainError::Invalid(_, i) => {
                let field = i.field.rsplit('.').next().unwrap_or(&i.field);
                if i.message.starts_with(field) {
                    i.message
                } else {
                    format!("{field}: {}", i.message)
                }
            }
            other => other.to_string(),
        };
        Self::new(status, message)
    }
}

impl From<hearth_types::rules::Invalid> for E2bError {
    fn from(e: hearth_types::rules::Invalid) -> Self {
        DomainError::from(e).into()
    }
}

impl From<Refusal> for E2bError {
    fn from(e: Refusal) -> Self {
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
    pub(crate) fn refuse(self, e: DomainError) -> Response {
        match self {
            Door::Control => E2bError::from(e).into_response(),
            Door::Connect => connect::ConnectError::invalid(e.to_string()).into_response(),
        }
    }
}

/// One of E2B's routes: the one table the router, the request guard's
/// choice of door, and the tests that walk every route are made from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct E2bRoute {
    pub method: &'static str,
    /// axum's pattern: `{name}` is one path segment.
    pub path: &'static str,
    /// Whether a request carries a body.
    pub body: bool,
    /// False for what E2B has and Hearth answers 501 naming it.
    pub served: bool,
}

const fn route(method: &'static str, path: &'static str, body: bool) -> E2bRoute {
    E2bRoute {
        method,
        path,
        body,
        served: true,
    }
}

const fn unserved(method: &'static str, path: &'static str, body: bool) -> E2bRoute {
    E2bRoute {
        method,
        path,
        body,
        served: false,
    }
}

/// Every route of E2B's door.
pub const ROUTES: &[E2bRoute] = &[
    route("POST", "/sandboxes", true),
    route("GET", "/sandboxes", false),
    route("POST", "/v2/sandboxes", true),
    route("GET", "/v2/sandboxes", false),
    route("GET", "/sandboxes/{id}", false),
    route("DELETE", "/sandboxes/{id}", false),
    route("POST", "/sandboxes/{id}/timeout", true),
    route("POST", "/sandboxes/{id}/pause", true),
    route("POST", "/sandboxes/{id}/connect", true),
    route("POST", "/sandboxes/{id}/resume", true),
    route("POST", "/v2/sandboxes/{id}/connect", true),
    route("GET", "/sandboxes/{id}/metrics", false),
    route("GET", "/sandboxes/metrics", false),
    route("GET", "/sandboxes/{id}/logs", false),
    route("GET", "/v2/sandboxes/{id}/logs", false),
    unserved("POST", "/sandboxes/{id}/refreshes", true),
    route("POST", "/sandboxes/{id}/snapshots", true),
    route("GET", "/snapshots", false),
    route("DELETE", "/templates/{id}", false),
    route("POST", "/sandboxes/{id}/fork", true),
    route("PUT", "/sandboxes/{id}/network", true),
    route("GET", "/health", false),
    route("GET", "/files", false),
    route("POST", "/files", true),
    route("GET", "/secrets", false),
    route("POST", "/secrets", true),
    route("GET", "/secrets/{id}", false),
    route("POST", "/secrets/{id}", true),
    route("DELETE", "/secrets/{id}", false),
    route("GET", "/volumes", false),
    route("POST", "/volumes", true),
    route("GET", "/volumes/{id}", false),
    route("DELETE", "/volumes/{id}", false),
    route("GET", "/volumecontent/{id}/dir", false),
    route("POST", "/volumecontent/{id}/dir", false),
    route("GET", "/volumecontent/{id}/path", false),
    route("PATCH", "/volumecontent/{id}/path", true),
    route("DELETE", "/volumecontent/{id}/path", false),
    route("GET", "/volumecontent/{id}/file", false),
    route("PUT", "/volumecontent/{id}/file", true),
    // E2B's templates and their builds (e2b 2.63's API clients); what is
    // not served is a 501 naming it, never a 404 that
    // `Template.alias_exists` would read as "does not exist".
    route("GET", "/default-templates", false),
    route("GET", "/templates", false),
    route("GET", "/templates/{id}", false),
    route("PATCH", "/templates/{id}", true),
    route("GET", "/templates/aliases/{alias}", false),
    route("GET", "/templates/{id}/tags", false),
    route("POST", "/templates/tags", true),
    route("DELETE", "/templates/tags", true),
    route("POST", "/v3/templates", true),
    route("GET", "/templates/{id}/files/{hash}", false),
    route("PUT", "/template-files/{token}", true),
    route("POST", "/v2/templates/{id}/builds/{build}", true),
    route("GET", "/templates/{id}/builds/{build}/status", false),
    route("GET", "/templates/{id}/builds/{build}/logs", false),
    route("GET", "/v2/templates", false),
    route("PATCH", "/v2/templates/{id}", true),
    route("POST", "/process.Process/StreamInput", true),
    route("POST", "/process.Process/{method}", true),
    route("POST", "/filesystem.Filesystem/{method}", true),
];

/// First path segments LangSmith's API uses too: under them only E2B's
/// own routes are E2B's door. Under E2B's other first segments every path
/// is (an unknown one answers in E2B's shape).
const SHARED_SEGMENTS: &[&str] = &["v2"];

/// Whether `path` is one `pattern` describes.
fn matches(pattern: &str, path: &str) -> bool {
    let (mut p, mut q) = (pattern.split('/'), path.split('/'));
    loop {
        match (p.next(), q.next()) {
            (None, None) => return true,
            (Some(a), Some(b)) if a.starts_with('{') || a == b => {}
            _ => return false,
        }
    }
}

/// The door of `path` (raw, as requested), `None` for LangSmith's.
pub(crate) fn door_of(path: &str) -> Option<Door> {
    let door = |pattern: &str| {
        if pattern.starts_with("/process.Process/")
            || pattern.starts_with("/filesystem.Filesystem/")
        {
            Door::Connect
        } else {
            Door::Control
        }
    };
    if let Some(r) = ROUTES.iter().find(|r| matches(r.path, path)) {
        return Some(door(r.path));
    }
    let first = |p: &str| {
        p.trim_start_matches('/')
            .split('/')
            .next()
            .unwrap_or("")
            .to_owned()
    };
    let segment = first(path);
    ROUTES
        .iter()
        .find(|r| !SHARED_SEGMENTS.contains(&segment.as_str()) && first(r.path) == segment)
        .map(|r| door(r.path))
}

/// The door of a request: E2B's for its paths, and for any request that
/// names a sandbox's port (by host or `E2b-Sandbox-Port`, see
/// [`hosts`]); `None` for LangSmith's.
pub(crate) fn door_of_request(c: &Control, req: &axum::extract::Request) -> Option<Door> {
    door_of(req.uri().path()).or_else(|| hosts::names_sandbox(c, req).then_some(Door::Control))
}

/// E2B's routes, merged into the public router: one per entry of
/// [`ROUTES`].
pub(crate) fn routes() -> Router<Arc<Control>> {
    ROUTES
        .iter()
        .fold(Router::new(), |router, r| router.route(r.path, handler(r)))
}

/// The handler of a route of [`ROUTES`].
fn handler(r: &E2bRoute) -> MethodRouter<Arc<Control>> {
    use axum::extract::DefaultBodyLimit;
    // The method is the table's: only the handler is chosen here.
    let m = method_filter(r.method);
    if !r.served {
        return on(m, api::not_served_route);
    }
    match (r.method, r.path) {
        ("POST", "/sandboxes" | "/v2/sandboxes") => on(m, api::create),
        ("GET", "/sandboxes" | "/v2/sandboxes") => on(m, api::list),
        ("GET", "/sandboxes/{id}") => on(m, api::detail),
        ("DELETE", "/sandboxes/{id}") => on(m, api::kill),
        ("POST", "/sandboxes/{id}/timeout") => on(m, api::set_timeout),
        ("POST", "/sandboxes/{id}/pause") => on(m, api::pause),
        (
            "POST",
            "/sandboxes/{id}/connect" | "/sandboxes/{id}/resume" | "/v2/sandboxes/{id}/connect",
        ) => on(m, api::connect),
        ("GET", "/sandboxes/{id}/metrics") => on(m, metrics::metrics),
        ("GET", "/sandboxes/metrics") => on(m, metrics::latest),
        ("GET", "/sandboxes/{id}/logs") => on(m, logs::logs_v1),
        ("GET", "/v2/sandboxes/{id}/logs") => on(m, logs::logs_v2),
        ("POST", "/sandboxes/{id}/snapshots") => on(m, snapshots::create_snapshot),
        ("GET", "/snapshots") => on(m, snapshots::list_snapshots),
        ("DELETE", "/templates/{id}") => on(m, templates::delete_template),
        ("GET", "/templates") => on(m, templates::list),
        ("GET", "/templates/{id}") => on(m, templates::get),
        ("PATCH", "/templates/{id}") => on(m, templates::update_v1),
        ("GET", "/v2/templates") => on(m, templates::list_v2),
        ("PATCH", "/v2/templates/{id}") => on(m, templates::update_v2),
        ("GET", "/default-templates") => on(m, templates::default_templates),
        ("GET", "/templates/aliases/{alias}") => on(m, templates::template_alias),
        ("GET", "/templates/{id}/tags") => on(m, templates::template_tags_list),
        ("POST", "/templates/tags") => on(m, templates::assign_tags),
        ("DELETE", "/templates/tags") => on(m, templates::remove_tags),
        ("POST", "/v3/templates") => on(m, builds::request),
        ("GET", "/templates/{id}/files/{hash}") => on(m, builds::files),
        ("PUT", "/template-files/{token}") => {
            on(m, builds::upload).layer(DefaultBodyLimit::disable())
        }
        ("POST", "/v2/templates/{id}/builds/{build}") => on(m, builds::start),
        ("GET", "/templates/{id}/builds/{build}/status") => on(m, builds::status),
        ("GET", "/templates/{id}/builds/{build}/logs") => on(m, builds::logs),
        ("POST", "/sandboxes/{id}/fork") => on(m, fork::fork),
        ("PUT", "/sandboxes/{id}/network") => on(m, network::update_network),
        ("GET", "/secrets") => on(m, secrets::list),
        ("POST", "/secrets") => on(m, secrets::create),
        ("GET", "/secrets/{id}") => on(m, secrets::get),
        ("POST", "/secrets/{id}") => on(m, secrets::update),
        ("DELETE", "/secrets/{id}") => on(m, secrets::delete),
        ("GET", "/volumes") => on(m, volumes::list),
        ("POST", "/volumes") => on(m, volumes::create),
        ("GET", "/volumes/{id}") => on(m, volumes::get),
        ("DELETE", "/volumes/{id}") => on(m, volumes::delete),
        ("GET", "/volumecontent/{id}/dir") => on(m, volume_content::list),
        ("POST", "/volumecontent/{id}/dir") => on(m, volume_content::make_dir),
        ("GET", "/volumecontent/{id}/path") => on(m, volume_content::get_info),
        ("PATCH", "/volumecontent/{id}/path") => on(m, volume_content::update_metadata),
        ("DELETE", "/volumecontent/{id}/path") => on(m, volume_content::remove),
        ("GET", "/volumecontent/{id}/file") => on(m, volume_content::read_file),
        ("PUT", "/volumecontent/{id}/file") => {
            on(m, volume_content::write_file).layer(DefaultBodyLimit::disable())
        }
        ("GET", "/health") => on(m, envd::health),
        ("GET", "/files") => on(m, envd::download).layer(DefaultBodyLimit::disable()),
        ("POST", "/files") => on(m, envd::upload).layer(DefaultBodyLimit::disable()),
        ("POST", "/process.Process/StreamInput") => {
            on(m, envd::stream_input).layer(DefaultBodyLimit::disable())
        }
        ("POST", "/process.Process/{method}") => on(m, envd::process),
        ("POST", "/filesystem.Filesystem/{method}") => on(m, envd::filesystem),
        (method, path) => unreachable!("E2B route {method} {path} has no handler"),
    }
}

fn method_filter(method: &str) -> MethodFilter {
    match method {
        "GET" => MethodFilter::GET,
        "POST" => MethodFilter::POST,
        "PUT" => MethodFilter::PUT,
        "PATCH" => MethodFilter::PATCH,
        "DELETE" => MethodFilter::DELETE,
        other => unreachable!("E2B route method {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_has_a_handler_once_and_picks_its_door() {
        // Building the router panics on a route without a handler or one
        // given twice.
        let _ = routes();
        for (i, r) in ROUTES.iter().enumerate() {
            assert!(
                !ROUTES[..i]
                    .iter()
                    .any(|o| o.method == r.method && o.path == r.path),
                "{r:?} twice"
            );
            let concrete = r.path.replace("{id}", "abc").replace("{method}", "Start");
            assert!(door_of(&concrete).is_some(), "{concrete}");
        }
        assert_eq!(door_of("/process.Process/Start"), Some(Door::Connect));
        assert_eq!(door_of("/sandboxes/abc/unknown"), Some(Door::Control));
        assert_eq!(door_of("/v2/sandboxes/abc/connect"), Some(Door::Control));
        // LangSmith's, under the segment both use.
        assert_eq!(door_of("/v2/sandboxes/boxes"), None);
        assert_eq!(door_of("/api/v2/sandboxes/boxes"), None);
        assert_eq!(door_of("/healthz"), None);
    }
}
