//! Service URLs: each port of each sandbox is served on a host name of its
//! own, `{port}-{sandbox id}.{sandbox domain}` (E2B's sandbox hosts), never
//! on the API's or the console's origin, so one tenant's pages cannot read
//! another's through the browser's same-origin rules.
//!
//! Who may reach a port there ([`port_access`], one decision for every
//! kind of caller): anyone when the sandbox is public (E2B's default); a
//! runtime token in `E2B-Traffic-Access-Token`; a LangSmith service token
//! (`POST /boxes/{name}/service-url`, see [`crate::links`]) in
//! `X-Langsmith-Sandbox-Service-Token`, or in the `hearth_service` cookie
//! its hand-off (`/.hearth/auth?token=…`, the `browser_url`) sets on that
//! origin only; a browser signed in to a login grant on that origin (see
//! [`crate::login`]). `/.hearth/` on a service host is Hearth's.
//!
//! The old paths on the API's origin (`/services/{token}/…`,
//! `/services/login/{id}/{port}/…`) only redirect to the new origin.
//!
//! A request is forwarded over HTTP/1.1 through the guest agent with
//! hop-by-hop headers and Hearth's credentials and cookies removed; the
//! answer streams back without cookies scoped to a domain or naming
//! Hearth's. Upgrades (WebSocket, or any protocol the service switches to
//! with 101) are spliced: after the 101 the two connections are copied
//! into each other.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use hearth_api::ApiError;
use hearth_db::SandboxRow;
use hearth_guest_proto::OpErrorKind;
use hearth_types::SandboxId;
use hyper_util::rt::TokioIo;

use crate::domain::error::DomainError;
use crate::domain::queries::spec_of;
use crate::error::HttpResult;
use crate::extract::Path;
use crate::links::{embed_origins, service_port, token_expiry, token_sandbox};
use crate::runtime_tokens::RuntimeKind;
use crate::Control;

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

/// `ANY /services/{token}` and `/services/{token}/`: the old token URL,
/// a redirect to the service's own origin.
pub async fn proxy_root(
    State(c): State<Arc<Control>>,
    Path(token): Path<String>,
    req: Request,
) -> HttpResult<Response> {
    moved_token_url(c, token, String::new(), req).await
}

/// `ANY /services/{token}/{*rest}`.
pub async fn proxy(
    State(c): State<Arc<Control>>,
    Path((token, rest)): Path<(String, String)>,
    req: Request,
) -> HttpResult<Response> {
    moved_token_url(c, token, rest, req).await
}

fn bad_gateway(message: String) -> DomainError {
    DomainError::Unreachable(message)
}

/// A token URL of the API's origin (minted before service hosts, or built
/// by hand): 307 to the hand-off on the service's own origin, which sets
/// the token as that origin's cookie and goes on to the same path. Nothing
/// of the service is served here.
async fn moved_token_url(
    c: Arc<Control>,
    token: String,
    rest: String,
    req: Request,
) -> HttpResult<Response> {
    let (claims, _) = c.redeem_claims(&token, true).await?;
    let origin = service_origin(&c, token_sandbox(&claims), service_port(&claims))?;
    let next = under_prefix(&rest, req.uri());
    Ok(redirect(
        StatusCode::TEMPORARY_REDIRECT,
        &format!("{}&next={}", hand_off_url(&origin, &token), encode(&next)),
    ))
}

/// The origin a sandbox's port is served on: `{scheme}://{port}-{id}.
/// {domain}`; refused without a sandbox domain.
pub(crate) fn service_origin(c: &Control, id: SandboxId, port: u16) -> Result<String, ApiError> {
    let Some(domain) = c.cfg.sandbox_domain.as_deref() else {
        return Err(ApiError::conflict(
            "service URLs are served on a host name of their own per sandbox and port ({port}-{id}.<domain>), and this control plane has no sandbox domain: give it --sandbox-domain (a wildcard DNS name)",
        ));
    };
    Ok(format!("{}://{port}-{id}.{domain}", scheme(c)))
}

/// The scheme sandbox hosts are served with: the public URL's.
pub(crate) fn scheme(c: &Control) -> &'static str {
    if c.cfg.public_url.starts_with("https://") {
        "https"
    } else {
        "http"
    }
}

/// Hearth's own paths on a service host.
pub(crate) const OWN_PREFIX: &str = "/.hearth/";
/// The hand-off of a service token to a browser.
const AUTH_PATH: &str = "/.hearth/auth";
/// The cookie the hand-off sets: the service token itself.
pub(crate) const TOKEN_COOKIE: &str = "hearth_service";

/// The `browser_url` of a service token: its hand-off on `origin`.
pub(crate) fn hand_off_url(origin: &str, token: &str) -> String {
    format!("{origin}{AUTH_PATH}?token={}", encode(token))
}

fn encode(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

pub(crate) fn redirect(status: StatusCode, location: &str) -> Response {
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = status;
    if let Ok(v) = HeaderValue::from_str(location) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// The values of every cookie named `name` the request carries (a page
/// of a sibling host can plant one for the whole domain: each is checked,
/// none wins by coming first).
pub(crate) fn cookies<'a>(headers: &'a HeaderMap, name: &'a str) -> impl Iterator<Item = &'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(move |p| p.trim().strip_prefix(name)?.strip_prefix('='))
}

/// Whether a request to a service host is for Hearth's own paths there.
pub(crate) fn is_own_path(path: &str) -> bool {
    path.starts_with(OWN_PREFIX) || path == "/.hearth"
}

/// `GET /.hearth/auth?token=…&next=…` (or `redirect=`, the SDK's embed
/// URL) on a service host: a service token for this port becomes this
/// origin's cookie, then on to `next`.
pub(crate) async fn hand_off(
    c: &Control,
    id: SandboxId,
    port: u16,
    method: &Method,
    uri: &Uri,
) -> Result<Response, DomainError> {
    if method != Method::GET && method != Method::HEAD {
        return Err(DomainError::MethodNotAllowed(
            "the hand-off of a service URL is a GET".into(),
        ));
    }
    let query = uri.query().unwrap_or_default();
    let param = |name: &str| {
        form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    };
    let token = param("token").unwrap_or_default();
    let (claims, _) = c.redeem_claims(&token, true).await?;
    if token_sandbox(&claims) != id || service_port(&claims) != port {
        return Err(DomainError::NoRoute("unknown service URL".into()));
    }
    let next = param("next")
        .or_else(|| param("redirect"))
        .unwrap_or_else(|| "/".into());
    let next = crate::login::safe_next(&next);
    let secs = (token_expiry(&claims) - hearth_db::Timestamp::now().unix_ms()).max(0) / 1000;
    let cookie = format!(
        "{TOKEN_COOKIE}={token}; Path=/; Max-Age={secs}; HttpOnly; {}",
        crate::login::cookie_attributes(c, embed_origins(&claims).is_some())
    );
    let mut resp = redirect(StatusCode::SEE_OTHER, next);
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(resp)
}

/// Who reaches a port on its host, and how.
pub(crate) struct PortAccess {
    pub row: SandboxRow,
    /// Wake a stopped sandbox (LangSmith's service URLs do; E2B's hosts
    /// answer 502 for a sandbox not running unless it has `auto_resume`).
    pub wake: bool,
    /// The frame ancestors the credential allows.
    pub embed: Option<String>,
    /// A login grant's user token for the service, and its `Host`.
    pub user_token: Option<(HeaderValue, String)>,
}

/// Why a request does not reach a port.
pub(crate) enum PortRefusal {
    /// No credential that opens it (E2B's 403, the same for an unknown
    /// sandbox).
    NotPublic(String),
    /// A login grant's port, and no one signed in on this origin.
    SignIn,
    Refused(DomainError),
}

impl From<DomainError> for PortRefusal {
    fn from(e: DomainError) -> Self {
        PortRefusal::Refused(e)
    }
}

/// The one decision of who reaches `port` of sandbox `id` through its
/// host (see the module's documentation). `own_origin`: the request came
/// in on the port's own host name (a browser's cookies there are that
/// origin's), not on the API's with `E2b-Sandbox-Port`.
pub(crate) async fn port_access(
    c: &Arc<Control>,
    id: SandboxId,
    port: u16,
    headers: &HeaderMap,
    own_origin: bool,
) -> Result<PortAccess, PortRefusal> {
    let found = match c.db.get_sandbox_by_id(id).await {
        Ok(row) if row.status != hearth_db::SandboxStatus::Deleting => Some(row),
        Ok(_) | Err(hearth_db::DbError::NotFound { .. }) => None,
        Err(e) => return Err(DomainError::from(e).into()),
    };
    let pass = |row: SandboxRow, wake: bool, embed: Option<String>| PortAccess {
        row,
        wake,
        embed,
        user_token: None,
    };
    // E2B's hosts answer 502 for a sandbox not running, unless it resumes
    // on a request (its autoResume).
    let resumes = |r: &SandboxRow| spec_of(r).is_ok_and(|s| s.auto_resume);
    if let Some(row) = found
        .as_ref()
        .filter(|r| spec_of(r).is_ok_and(|s| s.public_ports))
    {
        return Ok(pass(row.clone(), resumes(row), None));
    }
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let mut why = "none was sent".to_owned();
    if let Some(token) = header("e2b-traffic-access-token") {
        match c
            .check_runtime_token(RuntimeKind::Traffic, id, token)
            .await?
        {
            Ok(row) => {
                let wake = resumes(&row);
                return Ok(pass(row, wake, None));
            }
            Err(refused) => why = refused.to_string(),
        }
    }
    let service_tokens = header(SERVICE_TOKEN_HEADER).into_iter().chain(
        own_origin
            .then(|| cookies(headers, TOKEN_COOKIE))
            .into_iter()
            .flatten(),
    );
    // A few at most: each genuine one costs reads of the records.
    for token in service_tokens.take(MAX_TOKENS_TRIED) {
        match c.redeem_claims(token, true).await {
            Ok((claims, row)) if token_sandbox(&claims) == id && service_port(&claims) == port => {
                let embed = embed_origins(&claims).map(str::to_owned);
                return Ok(pass(row, true, embed));
            }
            Ok(_) => why = "the service token is for another sandbox or port".into(),
            Err(e) => why = e.to_string(),
        }
    }
    if let (true, Some(row)) = (own_origin, found) {
        let spec = spec_of(&row)?;
        if let Some(grant) = spec.service_grants.get(&port) {
            let host = service_host(c, id, port);
            let Some((who, description)) = crate::login::signed_in(c, headers, &host).await? else {
                return Err(PortRefusal::SignIn);
            };
            let user_token = crate::login::admit(c, &row, grant, &who, description, &host)?;
            let embed = (!grant.embed_origins.is_empty()).then(|| grant.embed_origins.join(" "));
            return Ok(PortAccess {
                row,
                wake: true,
                embed,
                user_token: Some((user_token, host)),
            });
        }
    }
    Err(PortRefusal::NotPublic(why))
}

/// The most service tokens (header and cookies) one request has checked.
const MAX_TOKENS_TRIED: usize = 4;

/// The header LangSmith's SDK sends a service token in.
const SERVICE_TOKEN_HEADER: &str = "x-langsmith-sandbox-service-token";

/// `{port}-{id}.{domain}`: the host a port is served on, and the audience
/// of the user tokens its service receives.
pub(crate) fn service_host(c: &Control, id: SandboxId, port: u16) -> String {
    format!(
        "{port}-{id}.{}",
        c.cfg.sandbox_domain.as_deref().unwrap_or("hearth.internal")
    )
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

/// Forwards `req` to `port` in the sandbox behind `guest` as
/// `path_and_query`, and its answer back; `client_side` is the request's
/// upgrade, taken before its handler consumed anything, when it asks for
/// one. The service sees `host` as the request's `Host` (default
/// `localhost:{port}`).
/// A connection to a sandbox's port, over TLS or not.
trait PortIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> PortIo for T {}

pub(crate) async fn forward_to_port(
    guest: &hearth_hostapi::GuestClient,
    port: u16,
    path_and_query: &str,
    req: Request,
    client_side: Option<hyper::upgrade::OnUpgrade>,
    host: Option<&str>,
    tls: bool,
) -> Result<Response, DomainError> {
    let upgrade = client_side.is_some();
    let conn = guest.dial(port).await.map_err(|e| {
        if e.op_kind() == Some(OpErrorKind::ConnectionRefused) {
            bad_gateway(format!("nothing listens on port {port} in the sandbox"))
        } else {
            bad_gateway(format!("cannot reach port {port} in the sandbox: {e}"))
        }
    })?;
    let plain = hearth_hostapi::stream_io(conn);
    let conn: Box<dyn PortIo> = if tls {
        Box::new(
            crate::port_tls::connect(plain)
                .await
                .map_err(|e| bad_gateway(format!("TLS with port {port} failed: {e}")))?,
        )
    } else {
        Box::new(plain)
    };
    let io = TokioIo::new(conn);
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
        .map_err(|e| DomainError::WrongState(format!("bad request path: {e}")))?;
    strip_hops(&mut parts.headers, upgrade, OWN_ORIGIN_REQUEST_DROPPED);
    drop_hearth_cookies(&mut parts.headers);
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
    strip_hops(&mut parts.headers, switched, OWN_ORIGIN_RESPONSE_DROPPED);
    drop_domain_cookies(&mut parts.headers);
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

/// Whether a cookie's name is one of Hearth's (`hearth_…`): the service
/// never sees them, nor sets them.
fn is_hearths(cookie: &str) -> bool {
    cookie.trim_start().starts_with("hearth_")
}

/// Removes Hearth's cookies from the request's `Cookie` headers, keeping
/// the service's own.
fn drop_hearth_cookies(headers: &mut HeaderMap) {
    let kept: Vec<String> = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|c| !c.is_empty() && !is_hearths(c))
        .map(str::to_owned)
        .collect();
    headers.remove(header::COOKIE);
    if kept.is_empty() {
        return;
    }
    if let Ok(v) = HeaderValue::from_str(&kept.join("; ")) {
        headers.insert(header::COOKIE, v);
    }
}

/// Removes each `Set-Cookie` that names a `Domain` (such a cookie would
/// reach every host under it: other sandboxes' ports, the API's host) or
/// one of Hearth's cookies.
fn drop_domain_cookies(headers: &mut HeaderMap) {
    let kept: Vec<HeaderValue> = headers
        .get_all(header::SET_COOKIE)
        .iter()
        .filter(|v| {
            let has_domain = v.to_str().map_or(true, |s| {
                is_hearths(s)
                    || s.split(';')
                        .skip(1)
                        .any(|a| a.trim().to_ascii_lowercase().starts_with("domain"))
            });
            if has_domain {
                tracing::debug!(
                    "dropped a sandbox's cookie scoped to a domain or named as Hearth's"
                );
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

    /// On a port's own origin cookies pass, except one scoped to a
    /// domain (it would reach the other sandboxes under it).
    #[test]
    fn own_origins_keep_host_cookies_and_drop_domain_ones() {
        let mut resp = headers(&[
            ("set-cookie", "session=1; Path=/; HttpOnly"),
            ("set-cookie", "hearth_login=forged; Path=/"),
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
            ("cookie", "session=1; hearth_login=k.1.m"),
            ("cookie", "hearth_service=t; b=2"),
            ("x-access-token", "t"),
            ("e2b-traffic-access-token", "t"),
            ("x-langsmith-sandbox-service-token", "t"),
            ("x-api-key", "k"),
            ("upgrade", "websocket"),
            ("connection", "Upgrade"),
        ]);
        strip_hops(&mut req, true, OWN_ORIGIN_REQUEST_DROPPED);
        drop_hearth_cookies(&mut req);
        assert_eq!(names(&req), ["connection", "cookie", "upgrade"]);
        assert_eq!(req.get("cookie").unwrap(), "session=1; b=2");
    }
}
