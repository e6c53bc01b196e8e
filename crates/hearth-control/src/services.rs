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
pub(crate) fn wants_upgrade(headers: &HeaderMap) -> bool {
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
    let path_and_query = under_prefix(&rest, req.uri());
    let mut resp = forward_to_port(
        &guest,
        port,
        &path_and_query,
        req,
        client_side,
        SharedOrigin::Yes,
        None,
    )
    .await?;
    if let Some(origins) = embed_origins(&claims) {
        allow_framing(&mut resp, origins);
    }
    Ok(resp)
}

/// The service's own path for `rest` (what follows a service URL's
/// prefix), with the request's query.
pub(crate) fn under_prefix(rest: &str, uri: &Uri) -> String {
    match uri.query() {
        Some(q) => format!("/{rest}?{q}"),
        None => format!("/{rest}"),
    }
}

/// Lets pages of `origins` (space-separated) frame the answer.
pub(crate) fn allow_framing(resp: &mut Response, origins: &str) {
    if let Ok(v) = HeaderValue::from_str(&format!("frame-ancestors 'self' {origins}")) {
        resp.headers_mut()
            .insert(header::CONTENT_SECURITY_POLICY, v);
    }
    resp.headers_mut().remove(header::X_FRAME_OPTIONS);
}

/// Whether the origin a request came in on is shared with the control
/// plane and other sandboxes (a service URL's path), or is this sandbox
/// port's own (a sandbox host by name, `{port}-{id}.{domain}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SharedOrigin {
    /// Cookies are dropped both ways (see [`REQUEST_DROPPED`]).
    Yes,
    /// The browser's cookies are the port's own and pass; a cookie the
    /// service sets passes unless it names a `Domain` (which would reach
    /// every other sandbox under the domain, and the API's host).
    No,
}

/// Forwards `req` to `port` in the sandbox behind `guest` as
/// `path_and_query`, and its answer back; `client_side` is the request's
/// upgrade, taken before its handler consumed anything, when it asks for
/// one. The service sees `host` as the request's `Host` (default
/// `localhost:{port}`).
pub(crate) async fn forward_to_port(
    guest: &hearth_hostapi::GuestClient,
    port: u16,
    path_and_query: &str,
    req: Request,
    client_side: Option<hyper::upgrade::OnUpgrade>,
    origin: SharedOrigin,
    host: Option<&str>,
) -> HttpResult<Response> {
    let upgrade = client_side.is_some();
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
        if let Err(e) = connection.with_upgrades().await {
            tracing::debug!(port, error = %e, "connection to a sandbox's port ended");
        }
    });

    let (mut parts, body) = req.into_parts();
    parts.uri = Uri::builder()
        .path_and_query(path_and_query)
        .build()
        .map_err(|e| ApiError::invalid_request(format!("bad request path: {e}")))?;
    let (request_dropped, response_dropped) = match origin {
        SharedOrigin::Yes => (REQUEST_DROPPED, RESPONSE_DROPPED),
        SharedOrigin::No => (OWN_ORIGIN_REQUEST_DROPPED, OWN_ORIGIN_RESPONSE_DROPPED),
    };
    strip_hops(&mut parts.headers, upgrade, request_dropped);
    let host = host.map_or_else(|| format!("localhost:{port}"), str::to_owned);
    if let Ok(host) = HeaderValue::from_str(&host) {
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
            if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut service).await {
                tracing::debug!(port, error = %e, "upgraded connection to a sandbox's port ended");
            }
        });
    }
    let (mut parts, body) = resp.into_parts();
    strip_hops(&mut parts.headers, switched, response_dropped);
    if origin == SharedOrigin::No {
        drop_domain_cookies(&mut parts.headers);
    }
    Ok(Response::from_parts(parts, Body::new(body)).into_response())
}

/// On a port's own origin: Hearth's credentials go, cookies stay.
const OWN_ORIGIN_REQUEST_DROPPED: &[&str] = &[
    "transfer-encoding",
    "x-api-key",
    "x-access-token",
    "e2b-traffic-access-token",
    "x-langsmith-sandbox-service-token",
];

/// On a port's own origin: the framing, and workers that would widen
/// their scope.
const OWN_ORIGIN_RESPONSE_DROPPED: &[&str] = &["transfer-encoding", "service-worker-allowed"];

/// Removes each `Set-Cookie` that names a `Domain`: such a cookie would
/// reach every host under it (other sandboxes' ports, the API's host).
fn drop_domain_cookies(headers: &mut HeaderMap) {
    let kept: Vec<HeaderValue> = headers
        .get_all(header::SET_COOKIE)
        .iter()
        .filter(|v| {
            let has_domain = v.to_str().map_or(true, |s| {
                s.split(';')
                    .skip(1)
                    .any(|a| a.trim().to_ascii_lowercase().starts_with("domain"))
            });
            if has_domain {
                tracing::debug!("dropped a sandbox's cookie scoped to a domain");
            }
            !has_domain
        })
        .cloned()
        .collect();
    headers.remove(header::SET_COOKIE);
    headers.remove("set-cookie2");
    for v in kept {
        headers.append(header::SET_COOKIE, v);
    }
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

    /// On a port's own origin cookies pass, except one scoped to a
    /// domain (it would reach the other sandboxes under it).
    #[test]
    fn own_origins_keep_host_cookies_and_drop_domain_ones() {
        let mut resp = headers(&[
            ("set-cookie", "session=1; Path=/; HttpOnly"),
            ("set-cookie", "wide=2; Domain=hearth.localhost; Path=/"),
            ("set-cookie", "wide2=3; path=/; domain=.hearth.localhost"),
            ("set-cookie2", "old=4"),
            ("content-type", "text/html"),
        ]);
        strip_hops(&mut resp, false, OWN_ORIGIN_RESPONSE_DROPPED);
        drop_domain_cookies(&mut resp);
        let cookies: Vec<_> = resp.get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["session=1; Path=/; HttpOnly"]);
        assert!(resp.get("set-cookie2").is_none());
        let mut req = headers(&[
            ("cookie", "session=1"),
            ("x-access-token", "t"),
            ("e2b-traffic-access-token", "t"),
            ("x-api-key", "k"),
        ]);
        strip_hops(&mut req, false, OWN_ORIGIN_REQUEST_DROPPED);
        assert_eq!(names(&req), ["cookie"]);
    }
}
