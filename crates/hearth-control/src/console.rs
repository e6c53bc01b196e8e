//! The web console's routes: the page at `/console/` (one page for every
//! console route: the routing is in its hash), its content-hashed assets
//! under `/console/assets/`, each with the console's Content-Security-Policy
//! and caching headers. The assets are built into the binary
//! (`hearth-console`); the page calls the public API like any client.

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

use crate::error::HttpError;

pub(crate) fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/console",
            get(|| async { Redirect::permanent("/console/") }),
        )
        .route("/console/", get(page))
        .route("/console/assets/{file}", get(asset))
}

async fn page() -> Response {
    let mut resp = hearth_console::page().into_response();
    secure(
        &mut resp,
        "text/html; charset=utf-8",
        hearth_console::PAGE_CACHE_CONTROL,
    );
    resp
}

async fn asset(Path(file): Path<String>) -> Result<Response, HttpError> {
    let a = hearth_console::asset(&file).ok_or_else(|| {
        hearth_api::ApiError::new(
            404,
            "NotFound",
            format!("the console has no asset {file:?}"),
        )
    })?;
    let mut resp = (StatusCode::OK, a.bytes).into_response();
    secure(
        &mut resp,
        a.content_type,
        hearth_console::ASSET_CACHE_CONTROL,
    );
    Ok(resp)
}

fn secure(resp: &mut Response, content_type: &'static str, cache: &'static str) {
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(hearth_console::CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
}
