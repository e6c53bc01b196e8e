//! Service URLs: `{public_url}/services/{token}/…` proxies HTTP to a port
//! inside the sandbox (LangSmith's token mode; the token comes from
//! `POST /boxes/{name}/service-url`, see [`crate::links`]).
//!
//! Each request is verified, wakes the sandbox, dials the port through the
//! guest agent and is forwarded over HTTP/1.1 with hop-by-hop headers and
//! Hearth's own credentials removed; the answer streams back. Upgrades
//! (WebSocket, or any protocol the service switches to with 101) are
//! spliced: after the 101 the two connections are copied into each other.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Uri};
use axum::response::{IntoResponse, Response};
use hearth_api::ApiError;
use hearth_guest_proto::OpErrorKind;
use hyper_util::rt::TokioIo;

use crate::error::HttpResult;
use crate::extract::Path;
use crate::links::{embed_origins, service_port};
use crate::Control;

/// Headers of one hop only (RFC 9110 §7.6.1), plus Hearth's credentials.
/// Dropped besides the hop-by-hop headers: the framing hyper redoes, and
/// Hearth's own credentials, which never reach the service.
const DROPPED: &[&str] = &[
    "transfer-encoding",
    "x-api-key",
    "x-langsmith-sandbox-service-token",
];

/// Whether a request asks to switch protocols (`Connection: upgrade`).
fn wants_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Removes hop-by-hop headers; an upgrade keeps `Upgrade` and a bare
/// `Connection: upgrade`.
fn strip_hops(headers: &mut HeaderMap, upgrade: bool) {
    let protocol = headers.get(header::UPGRADE).cloned();
    strip(headers);
    if let (true, Some(p)) = (upgrade, protocol) {
        headers.insert(header::UPGRADE, p);
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

fn strip(headers: &mut HeaderMap) {
    hearth_egress::remove_hop_by_hop(headers);
    for n in DROPPED {
        headers.remove(*n);
    }
}

/// `ANY /services/{token}` and `/services/{token}/` (the service's `/`).
pub async fn proxy_root(
    State(c): State<Arc<Control>>,
    Path(token): Path<String>,
    req: Request,
) -> HttpResult<Response> {
    forward(c, token, String::new(), req).await
}

/// `ANY /services/{token}/{*rest}`.
pub async fn proxy(
    State(c): State<Arc<Control>>,
    Path((token, rest)): Path<(String, String)>,
    req: Request,
) -> HttpResult<Response> {
    forward(c, token, rest, req).await
}

fn bad_gateway(message: String) -> ApiError {
    ApiError::new(502, "ServiceUnavailable", message)
}

async fn forward(
    c: Arc<Control>,
    token: String,
    rest: String,
    mut req: Request,
) -> HttpResult<Response> {
    let upgrade = wants_upgrade(req.headers());
    let client_side = upgrade.then(|| hyper::upgrade::on(&mut req));
    let (claims, guest) = c.redeem(&token, true).await?;
    let port = service_port(&claims);
    let conn = guest.dial(port).await.map_err(|e| {
        if e.op_kind() == Some(OpErrorKind::ConnectionRefused) {
            bad_gateway(format!("nothing listens on port {port} in the sandbox"))
        } else {
            bad_gateway(format!("cannot reach port {port} in the sandbox: {e}"))
        }
    })?;
    let io = TokioIo::new(hearth_hostapi::stream_io(conn));
    let (mut sender, connection) = hyper::client::conn::http1::handshake::<_, Body>(io)
        .await
        .map_err(|e| bad_gateway(format!("HTTP handshake with port {port} failed: {e}")))?;
    tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
    });

    let (mut parts, body) = req.into_parts();
    let path_and_query = match parts.uri.query() {
        Some(q) => format!("/{rest}?{q}"),
        None => format!("/{rest}"),
    };
    parts.uri = Uri::builder()
        .path_and_query(path_and_query)
        .build()
        .map_err(|e| ApiError::invalid_request(format!("bad request path: {e}")))?;
    strip_hops(&mut parts.headers, upgrade);
    if let Ok(host) = HeaderValue::from_str(&format!("localhost:{port}")) {
        parts.headers.insert(header::HOST, host);
    }
    parts.version = axum::http::Version::HTTP_11;
    let mut resp = sender
        .send_request(Request::from_parts(parts, body))
        .await
        .map_err(|e| bad_gateway(format!("port {port} did not answer: {e}")))?;
    let switched = resp.status() == axum::http::StatusCode::SWITCHING_PROTOCOLS;
    if let (true, Some(client_side)) = (switched, client_side) {
        let service_side = hyper::upgrade::on(&mut resp);
        tokio::spawn(async move {
            let (Ok(client), Ok(service)) = (client_side.await, service_side.await) else {
                return;
            };
            let (mut client, mut service) = (TokioIo::new(client), TokioIo::new(service));
            let _ = tokio::io::copy_bidirectional(&mut client, &mut service).await;
        });
    }
    let (mut parts, body) = resp.into_parts();
    strip_hops(&mut parts.headers, switched);
    if let Some(origins) = embed_origins(&claims) {
        if let Ok(v) = HeaderValue::from_str(&format!("frame-ancestors 'self' {origins}")) {
            parts.headers.insert(header::CONTENT_SECURITY_POLICY, v);
        }
        parts.headers.remove(header::X_FRAME_OPTIONS);
    }
    Ok(Response::from_parts(parts, Body::new(body)).into_response())
}
