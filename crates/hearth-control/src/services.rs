//! Service URLs: `{public_url}/services/{token}/…` proxies HTTP to a port
//! inside the sandbox (LangSmith's token mode; the token comes from
//! `POST /boxes/{name}/service-url`, see [`crate::links`]).
//!
//! Each request is verified, wakes the sandbox, dials the port through the
//! guest agent and is forwarded over HTTP/1.1 with hop-by-hop headers,
//! Hearth's own credentials and the browser's cookies removed; the answer
//! streams back without the cookies it sets (service URLs share the control
//! plane's origin, see `docs/ARCHITECTURE.md`). Upgrades
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

/// Request headers dropped besides the hop-by-hop ones (RFC 9110
/// §7.6.1): the framing hyper redoes, Hearth's own credentials, and the
/// browser's `Cookie`. Service URLs share the control plane's origin, so
/// that header carries whatever any page on the origin set — another
/// sandbox's service included — and is no business of this one.
/// `Authorization` passes: Hearth takes no credential in it on this path
/// (only a host's enrollment token, on the fleet routes), and services
/// use it for their own authentication.
const REQUEST_DROPPED: &[&str] = &[
    "transfer-encoding",
    "x-api-key",
    "x-langsmith-sandbox-service-token",
    "cookie",
];

/// Response headers dropped besides the hop-by-hop ones: the framing,
/// cookies (set on the shared origin they would reach every other
/// sandbox's service and the control plane), and `Service-Worker-Allowed`,
/// which would let a worker the service registers widen its scope from
/// `/services/{token}/` to the whole origin (and see other sandboxes'
/// service-URL tokens).
const RESPONSE_DROPPED: &[&str] = &[
    "transfer-encoding",
    "set-cookie",
    "set-cookie2",
    "service-worker-allowed",
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

/// Removes hop-by-hop headers and `dropped`; an upgrade keeps `Upgrade`
/// and a bare `Connection: upgrade`.
fn strip_hops(headers: &mut HeaderMap, upgrade: bool, dropped: &[&str]) {
    let protocol = headers.get(header::UPGRADE).cloned();
    hearth_egress::remove_hop_by_hop(headers);
    for n in dropped {
        headers.remove(*n);
    }
    if let (true, Some(p)) = (upgrade, protocol) {
        headers.insert(header::UPGRADE, p);
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
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
    strip_hops(&mut parts.headers, upgrade, REQUEST_DROPPED);
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
    strip_hops(&mut parts.headers, switched, RESPONSE_DROPPED);
    if let Some(origins) = embed_origins(&claims) {
        if let Ok(v) = HeaderValue::from_str(&format!("frame-ancestors 'self' {origins}")) {
            parts.headers.insert(header::CONTENT_SECURITY_POLICY, v);
        }
        parts.headers.remove(header::X_FRAME_OPTIONS);
    }
    Ok(Response::from_parts(parts, Body::new(body)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(*n, HeaderValue::from_static(v));
        }
        h
    }

    fn names(h: &HeaderMap) -> Vec<&str> {
        let mut n: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        n.sort_unstable();
        n
    }

    /// Service URLs share the control plane's origin: the browser's cookies
    /// never reach a guest, and a guest's cookies never reach the browser.
    #[test]
    fn service_urls_strip_cookies_both_ways() {
        let mut req = headers(&[
            ("cookie", "other-tenant=secret"),
            ("cookie", "evil=1"),
            ("x-api-key", "hearth-key"),
            ("x-langsmith-sandbox-service-token", "tok"),
            ("authorization", "Bearer the-services-own"),
            ("accept", "text/html"),
            ("x-custom", "kept"),
            ("transfer-encoding", "chunked"),
            ("connection", "keep-alive"),
        ]);
        strip_hops(&mut req, false, REQUEST_DROPPED);
        assert_eq!(names(&req), ["accept", "authorization", "x-custom"]);

        let mut resp = headers(&[
            ("set-cookie", "evil=1; Path=/"),
            ("set-cookie", "more=2; Path=/services"),
            ("set-cookie2", "old=3"),
            ("service-worker-allowed", "/"),
            ("content-type", "text/html"),
            ("cache-control", "no-store"),
            ("location", "/elsewhere"),
        ]);
        strip_hops(&mut resp, false, RESPONSE_DROPPED);
        assert_eq!(names(&resp), ["cache-control", "content-type", "location"]);

        // An upgrade keeps its handshake and still loses the cookies.
        let mut ws = headers(&[
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("cookie", "evil=1"),
            ("sec-websocket-key", "k"),
        ]);
        assert!(wants_upgrade(&ws));
        strip_hops(&mut ws, true, REQUEST_DROPPED);
        assert_eq!(names(&ws), ["connection", "sec-websocket-key", "upgrade"]);
        let mut switched = headers(&[
            ("connection", "upgrade"),
            ("upgrade", "websocket"),
            ("set-cookie", "evil=1; Path=/"),
        ]);
        strip_hops(&mut switched, true, RESPONSE_DROPPED);
        assert_eq!(names(&switched), ["connection", "upgrade"]);
    }
}
