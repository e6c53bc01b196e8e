//! HTTP/1.1 towards the guest (plain, inside a CONNECT tunnel, or over
//! intercepted TLS): each request is checked against the current policy,
//! gets its rule's or callback's headers, and is forwarded upstream.
//!
//! Every way a request names its destination must agree before anything
//! else: its one `Host` header, its absolute-form target, and what the
//! connection was opened for (the TLS server name, the `CONNECT` target, the
//! original port). A request that disagrees is answered 400 and never
//! forwarded, so policy and header rules judge the name the upstream will
//! actually serve, not a friendlier one the guest wrote beside it. Secret
//! header values are set only on requests that go upstream over TLS.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hearth_types::egress::BucketScope;
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use http_body::Body as _;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Mutex;

use crate::bucket_scope::BodyNamed;
use crate::policy::Policy;
use crate::{callback, lock, Counters, RouteError, Sandbox};

type Body = BoxBody<Bytes, hyper::Error>;
/// A request body on its way upstream: the guest's, or one the proxy read
/// the start of, whose checks of the rest may end it with an error.
type Outgoing = BoxBody<Bytes, BoxError>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// (name, port, TLS) of an upstream connection.
type UpstreamKey = (String, u16, bool);

/// How the target of a request is known.
#[derive(Debug, Clone)]
pub enum Mode {
    /// Transparent plain HTTP: the `Host` header names it, on the original port.
    Plain { ip: IpAddr, port: u16 },
    /// HTTP inside a CONNECT tunnel to `name:port`.
    Tunnel { name: String, port: u16 },
    /// Intercepted TLS to the SNI name.
    Tls { name: String, port: u16 },
    /// The explicit proxy: absolute-form URIs name it.
    Explicit,
    /// The connection named two destinations (a TLS server name other than
    /// its `CONNECT` target): every request is answered 400.
    Conflict { reason: String },
}

/// How a request names its destination (`Host`, an absolute URI).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Authority {
    host: String,
    port: Option<u16>,
}

impl Authority {
    fn parse(s: &str) -> Option<Authority> {
        if s.contains('@') {
            return None;
        }
        let a: http::uri::Authority = s.parse().ok()?;
        let host = a.host().trim_matches(['[', ']']);
        let plausible = crate::pattern::parse_ip(host).is_some()
            || crate::pattern::normalize_name(host).is_some();
        plausible.then(|| Authority {
            host: host.to_owned(),
            port: a.port_u16(),
        })
    }

    /// Same host, and the same port when both say one. (A `Host` without a
    /// port is taken to mean the connection's: clients name a non-default
    /// port, and no upstream routes on the port it was reached on.)
    fn agrees(&self, host: &str, port: Option<u16>) -> bool {
        crate::pattern::same_host(&self.host, host)
            && (self.port.is_none() || port.is_none() || self.port == port)
    }
}

/// The request's one `Host` header; `Err` for two or an unparsable one.
fn host_header(headers: &HeaderMap) -> Result<Option<Authority>, String> {
    let mut all = headers.get_all(header::HOST).iter();
    let Some(first) = all.next() else {
        return Ok(None);
    };
    if all.next().is_some() {
        return Err("the request has more than one Host header".into());
    }
    first
        .to_str()
        .ok()
        .and_then(Authority::parse)
        .map(Some)
        .ok_or_else(|| "the request's Host header is not a host[:port]".into())
}

/// Why the headers a request should get could not be had.
#[derive(Debug, thiserror::Error)]
enum InjectError {
    #[error(transparent)]
    Callback(#[from] callback::CallbackError),
    #[error("GCP access token")]
    Token(#[from] crate::gcp::TokenError),
}

/// Where a request goes, once every way it names that agrees.
struct Target {
    name: String,
    port: u16,
    /// Upstream over TLS (the only way secrets travel).
    tls: bool,
    /// The `Host` header to set when the guest sent none.
    host: Option<String>,
}

/// One guest connection's forwarding state: the upstream it last used.
struct Conn {
    sb: Arc<Sandbox>,
    mode: Mode,
    upstream: Mutex<Option<(UpstreamKey, SendRequest<Outgoing>)>>,
    /// Upgraded connections being spliced; the guest connection's task
    /// waits for them (so they hold its slot and end with the sandbox).
    splices: std::sync::Mutex<tokio::task::JoinSet<()>>,
}

pub async fn serve_http<I>(sb: Arc<Sandbox>, io: I, mode: Mode)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let conn = Arc::new(Conn {
        sb,
        mode,
        upstream: Mutex::new(None),
        splices: std::sync::Mutex::new(tokio::task::JoinSet::new()),
    });
    let handler = conn.clone();
    let service = hyper::service::service_fn(move |req| {
        let conn = handler.clone();
        async move { Ok::<_, Infallible>(conn.handle(req).await) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .max_buf_size(crate::proxy::MAX_HEAD)
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(60))
        .keep_alive(true);
    if let Err(e) = builder
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades()
        .await
    {
        tracing::debug!(error = %e, "guest HTTP connection ended");
    }
    let mut splices = std::mem::take(&mut *lock(&conn.splices));
    while splices.join_next().await.is_some() {}
}

/// Joins an upgraded guest connection and its upstream until either ends.
async fn splice(
    guest: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
) -> Result<(), String> {
    let (guest, upstream) = tokio::join!(guest, upstream);
    let mut guest = TokioIo::new(guest.map_err(|e| format!("guest upgrade: {e}"))?);
    let mut upstream = TokioIo::new(upstream.map_err(|e| format!("upstream upgrade: {e}"))?);
    tokio::io::copy_bidirectional(&mut guest, &mut upstream)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

fn empty() -> Body {
    Full::new(Bytes::new()).map_err(|n| match n {}).boxed()
}

fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(body)).map_err(|n| match n {}).boxed());
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// Headers that describe one hop, never forwarded.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
];

/// Removes the hop-by-hop headers of a request or response being
/// forwarded: the standard ones and those its `Connection` header names.
pub fn remove_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in listed {
        headers.remove(n);
    }
    for n in HOP_BY_HOP {
        headers.remove(n);
    }
}

impl Conn {
    async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let sb = &self.sb;
        // TRACE echoes the request, injected credentials included.
        if req.method() == Method::TRACE || req.method().as_str() == "TRACK" {
            let mut resp = text(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("Hearth egress proxy: {} is not forwarded\n", req.method()),
            );
            resp.headers_mut().insert(
                header::ALLOW,
                HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
            );
            return resp;
        }
        let Target {
            name,
            port,
            tls,
            host,
        } = match self.target(&req) {
            Ok(t) => t,
            Err(reason) => {
                tracing::debug!(sandbox = %sb.id, %reason, "request refused");
                Counters::inc(&sb.counters.connections_refused);
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("Hearth egress proxy: {reason}\n"),
                );
            }
        };
        // Read at every request, so a new policy applies on kept-alive connections.
        let policy = sb.policy();
        if crate::pattern::same_host(&name, crate::DELEGATION_HOST) {
            return self.delegate(req, &policy, tls).await;
        }
        let mut req = req.map(|b| b.map_err(BoxError::from).boxed());
        // A bucket mount's rule signs only what the mount may do; anything
        // else it matches is refused here, neither signed nor sent.
        let scoped = policy
            .rule_for(&name, req.uri().path(), req.headers())
            .and_then(|r| Some((r.name.as_str(), r.scope.as_ref()?)));
        if let Some((rule, scope)) = scoped {
            let outside = |why: &str| {
                tracing::debug!(sandbox = %sb.id, host = %name, %rule, %why, "request outside a mount's scope refused");
                Counters::inc(&sb.counters.connections_refused);
                text(
                    StatusCode::FORBIDDEN,
                    format!("Hearth egress proxy: {why}\n"),
                )
            };
            match crate::bucket_scope::check(scope, req.method(), req.uri(), req.headers()) {
                Ok(None) => {}
                Err(why) => return outside(&why),
                // An upload that names its object in its body: the name
                // is read there before anything is signed.
                Ok(Some(upload)) => {
                    req = match tokio::time::timeout(
                        UPLOAD_NAME_TIMEOUT,
                        upload_named(req, scope, &upload),
                    )
                    .await
                    {
                        Ok(Ok(req)) => req,
                        Ok(Err(UploadError::Refused(why, rest))) => {
                            drain(rest).await;
                            return outside(&why);
                        }
                        Ok(Err(UploadError::Read(e))) => {
                            return text(
                                StatusCode::BAD_REQUEST,
                                format!("Hearth egress proxy: reading the request body failed: {e}\n"),
                            )
                        }
                        Err(_) => {
                            return text(
                                StatusCode::REQUEST_TIMEOUT,
                                format!("Hearth egress proxy: the part of the upload that names its object did not arrive within {UPLOAD_NAME_TIMEOUT:?}\n"),
                            )
                        }
                    };
                }
            }
        }
        // A rewrite rule sends the request to its own HTTPS destination:
        // the name the guest asked for must pass access control, the
        // destination the private-address gate.
        let rewrite = policy
            .rule_for(&name, req.uri().path(), req.headers())
            .and_then(|r| r.rewrite.clone());
        let routed = match &rewrite {
            None => sb.route(&policy, &name, port).await,
            Some(rw) => match policy.name_verdict(&name) {
                crate::policy::NameVerdict::Refused(r) => Err(RouteError::Refused(r)),
                _ => sb.route_rewrite(&rw.host, rw.port).await,
            },
        };
        let addrs = match routed {
            Ok(a) => a,
            Err(RouteError::Refused(r)) => {
                Counters::inc(&sb.counters.connections_refused);
                return text(StatusCode::FORBIDDEN, format!("Hearth egress proxy: {r}\n"));
            }
            Err(e) => {
                return text(
                    StatusCode::BAD_GATEWAY,
                    format!("Hearth egress proxy: {e}\n"),
                );
            }
        };
        // A `full_request` callback is sent the request as the guest sent it.
        let full = tls
            && policy
                .rule_for(&name, req.uri().path(), req.headers())
                .is_none()
            && policy
                .callback_for(&name)
                .is_some_and(|(_, cb)| cb.full_request);
        let (req, snapshot) = if full {
            match tokio::time::timeout(SNAPSHOT_TIMEOUT, snapshot(req, &name, port)).await {
                Ok(Ok((req, snap))) => (req, Some(snap)),
                Ok(Err(e)) => {
                    return text(
                        StatusCode::BAD_REQUEST,
                        format!("Hearth egress proxy: reading the request body failed: {e}\n"),
                    )
                }
                Err(_) => {
                    return text(
                        StatusCode::REQUEST_TIMEOUT,
                        format!("Hearth egress proxy: the request body's first {} KiB did not arrive within {SNAPSHOT_TIMEOUT:?}\n", callback::MAX_SNAPSHOT_BODY / 1024),
                    )
                }
            }
        } else {
            (req, None)
        };
        let inject = match self
            // A rewrite's upstream is always TLS.
            .injected(
                &policy,
                &name,
                port,
                tls || rewrite.is_some(),
                &req,
                snapshot.as_ref(),
            )
            .await
        {
            Ok(h) => h,
            Err(e) => {
                // The detail is the operator's: the guest must not learn
                // what answered (or did not) where.
                let (what, say) = match &e {
                    InjectError::Callback(_) => ("header callback failed", "the header callback"),
                    InjectError::Token(_) => ("GCP access token failed", "the GCP access token"),
                };
                tracing::warn!(sandbox = %sb.id, host = %name, error = %callback::chain(&e), "{what}");
                return text(
                    StatusCode::BAD_GATEWAY,
                    format!("Hearth egress proxy: {say} for {name:?} failed\n"),
                );
            }
        };
        // An `aws` rule re-signs, and only inside TLS like every secret:
        // with its keys, or a session of its role.
        let rule = policy
            .rule_for(&name, req.uri().path(), req.headers())
            .filter(|_| tls);
        let aws = match rule.map(|r| (&r.aws, &r.aws_role)) {
            Some((Some(keys), _)) => Some(keys.clone()),
            Some((None, Some(role))) => {
                let external_id = policy.tenant_id.as_deref().unwrap_or_default();
                match crate::sts::session(sb, role, external_id).await {
                    Ok(keys) => Some(keys),
                    Err(e) => {
                        tracing::warn!(sandbox = %sb.id, host = %name, role = %role.role_arn, error = %callback::chain(&e), "AWS role session failed");
                        return text(
                            StatusCode::BAD_GATEWAY,
                            format!("Hearth egress proxy: assuming the AWS role of the rule for {name:?} failed\n"),
                        );
                    }
                }
            }
            _ => None,
        };
        // An upgrade (WebSocket): the handshake is a request like any other
        // (policy, rules, callbacks); once the upstream answers 101 both
        // sides are spliced.
        let upgrade = req.headers().get(header::UPGRADE).cloned();
        let mut req = req;
        let guest_upgrade = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
        let (name, port, tls, host) = match &rewrite {
            Some(rw) => {
                rw.treat_credentials(req.headers_mut());
                let host = host_value(&rw.host, rw.port, true);
                (rw.host.clone(), rw.port, true, Some(host))
            }
            None => (name, port, tls, host),
        };
        let mut req = prepare(req, &inject, host.as_deref());
        if let Some(proto) = upgrade {
            req.headers_mut().insert(header::UPGRADE, proto);
            req.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        }
        if let Some(keys) = aws {
            req = match resign_aws(req, &keys).await {
                Ok(r) => r,
                Err(resp) => return resp,
            };
        }
        match self.send(req, (name.clone(), port, tls), &addrs).await {
            Ok(mut resp) => match guest_upgrade {
                Some(guest) if resp.status() == StatusCode::SWITCHING_PROTOCOLS => {
                    let upstream = hyper::upgrade::on(&mut resp);
                    let id = sb.id.clone();
                    lock(&self.splices).spawn(async move {
                        if let Err(e) = splice(guest, upstream).await {
                            tracing::debug!(sandbox = %id, error = %e, "upgraded connection ended");
                        }
                    });
                    resp.map(|_| empty())
                }
                _ => resp.map(|b| b.boxed()),
            },
            Err(e) => text(
                StatusCode::BAD_GATEWAY,
                format!("Hearth egress proxy: upstream {name:?} failed: {e}\n"),
            ),
        }
    }

    /// A request to [`crate::DELEGATION_HOST`]: sent to the control plane
    /// with a delegation token for this sandbox (signed by this host's key,
    /// five minutes) instead of whatever credentials the guest sent. The
    /// control plane decides what it may do.
    async fn delegate(&self, req: Request<Incoming>, policy: &Policy, tls: bool) -> Response<Body> {
        let sb = &self.sb;
        let settings = &sb.shared.settings;
        if !policy.delegation {
            Counters::inc(&sb.counters.connections_refused);
            return text(
                StatusCode::FORBIDDEN,
                "Hearth egress proxy: this sandbox was created without access_delegation\n".into(),
            );
        }
        let (Some(signer), Some(control)) = (&settings.callback_signer, &settings.control_url)
        else {
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                "Hearth egress proxy: delegated access is not available on this host\n".into(),
            );
        };
        if tls {
            return text(
                StatusCode::BAD_REQUEST,
                format!(
                    "Hearth egress proxy: use http://{} (through the proxy)\n",
                    crate::DELEGATION_HOST
                ),
            );
        }
        let uri: Uri = match control.parse() {
            Ok(u) => u,
            Err(_) => {
                return text(
                    StatusCode::BAD_GATEWAY,
                    "Hearth egress proxy: the control plane's URL is invalid\n".into(),
                )
            }
        };
        let up_tls = uri.scheme_str() == Some("https");
        let (Some(host), port) = (
            uri.host(),
            uri.port_u16().unwrap_or(if up_tls { 443 } else { 80 }),
        ) else {
            return text(
                StatusCode::BAD_GATEWAY,
                "Hearth egress proxy: the control plane's URL is invalid\n".into(),
            );
        };
        let host = host.trim_matches(['[', ']']).to_owned();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let token = match hearth_fence::jwt::sign(
            &signer.key,
            &serde_json::json!({
                "iss": signer.issuer, "aud": "hearth-delegation", "sub": sb.id,
                "iat": now, "exp": now + 300,
            }),
        ) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(sandbox = %sb.id, error = %e, "cannot sign a delegation token");
                return text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "Hearth egress proxy: internal error\n".into(),
                );
            }
        };
        // The operator's own control plane: no private-address gate.
        let addrs = match sb.shared.resolve(&host, port).await {
            Ok(a) => a,
            Err(e) => {
                return text(
                    StatusCode::BAD_GATEWAY,
                    format!("Hearth egress proxy: {e}\n"),
                )
            }
        };
        let (mut parts, body) = req.into_parts();
        remove_hop_by_hop(&mut parts.headers);
        for h in crate::policy::CREDENTIAL_HEADERS {
            parts.headers.remove(*h);
        }
        let authority = uri
            .authority()
            .map_or(host.clone(), |a| a.as_str().to_owned());
        if let Ok(v) = HeaderValue::from_str(&authority) {
            parts.headers.insert(header::HOST, v);
        }
        if let Ok(v) = HeaderValue::from_str(&format!("Bearer {token}")) {
            parts.headers.insert(header::AUTHORIZATION, v);
        }
        let base = uri.path().trim_end_matches('/');
        let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        parts.uri = match format!("{base}{pq}").parse() {
            Ok(u) => u,
            Err(_) => {
                return text(
                    StatusCode::BAD_REQUEST,
                    "Hearth egress proxy: invalid request target\n".into(),
                )
            }
        };
        let req = Request::from_parts(parts, body.map_err(BoxError::from).boxed());
        match self.send(req, (host.clone(), port, up_tls), &addrs).await {
            Ok(resp) => resp.map(|b| b.boxed()),
            Err(e) => text(
                StatusCode::BAD_GATEWAY,
                format!("Hearth egress proxy: the control plane failed: {e}\n"),
            ),
        }
    }

    /// Where a request goes: its `Host`, its absolute-form target and the
    /// connection's destination must agree; `Err` is the 400's reason.
    fn target(&self, req: &Request<Incoming>) -> Result<Target, String> {
        let host = host_header(req.headers())?;
        let uri = match req.uri().authority() {
            None => None,
            Some(a) => Some(
                Authority::parse(a.as_str())
                    .ok_or("the request target's authority is not a host[:port]")?,
            ),
        };
        if let (Some(h), Some(u)) = (&host, &uri) {
            if !h.agrees(&u.host, u.port) {
                return Err(format!(
                    "the Host header ({:?}) disagrees with the request target ({:?})",
                    h.host, u.host
                ));
            }
        }
        // What the request says, the absolute URI first (RFC 9112 §3.2.2).
        let named = uri.as_ref().or(host.as_ref());
        let on_connection = |name: &str, port: u16, tls: bool| {
            if let Some(a) = named.filter(|a| !a.agrees(name, Some(port))) {
                return Err(format!(
                    "the request names {:?}, but this connection goes to {name:?} port {port}",
                    a.host
                ));
            }
            Ok(Target {
                name: name.to_owned(),
                port,
                tls,
                host: Some(host_value(name, port, tls)),
            })
        };
        let mut target = match &self.mode {
            Mode::Conflict { reason } => return Err(reason.clone()),
            Mode::Tls { name, port } => on_connection(name, *port, true)?,
            Mode::Tunnel { name, port } => on_connection(name, *port, false)?,
            Mode::Plain { ip, port } => match named {
                // Only the port is the connection's: the name is the request's.
                Some(a) => on_connection(&a.host, *port, false)?,
                None => on_connection(&ip.to_string(), *port, false)?,
            },
            Mode::Explicit => {
                if req.uri().scheme_str() != Some("http") {
                    return Err("the request names no http:// target".into());
                }
                let u = uri.as_ref().ok_or("the request names no host")?;
                let port = u.port.unwrap_or(80);
                on_connection(&u.host, port, false)?
            }
        };
        if host.is_some() {
            target.host = None;
        }
        Ok(target)
    }

    /// The headers to set: the first matching rule's (a GCP rule's: its
    /// access token), else a callback's. Without TLS upstream only a
    /// rule's `plaintext` values: a callback's headers and tokens are
    /// credentials, so neither is even asked for.
    async fn injected<B>(
        &self,
        policy: &Policy,
        name: &str,
        port: u16,
        tls: bool,
        req: &Request<B>,
        snapshot: Option<&callback::RequestSnapshot>,
    ) -> Result<Vec<(String, String)>, InjectError> {
        if let Some(rule) = policy.rule_for(name, req.uri().path(), req.headers()) {
            if let Some(g) = rule.gcp.as_ref().filter(|_| tls) {
                let token = crate::gcp::token(&self.sb, g).await?;
                return Ok(vec![(
                    "authorization".to_owned(),
                    format!("Bearer {token}"),
                )]);
            }
            return Ok(rule.headers_for(tls));
        }
        if !tls {
            return Ok(Vec::new());
        }
        match policy.callback_for(name) {
            Some((_, cb)) => {
                Ok(callback::headers(&self.sb, policy, cb, name, port, snapshot).await?)
            }
            None => Ok(Vec::new()),
        }
    }

    async fn send(
        &self,
        req: Request<Outgoing>,
        key: UpstreamKey,
        addrs: &[SocketAddr],
    ) -> Result<Response<Incoming>, String> {
        let mut slot = self.upstream.lock().await;
        let reusable = slot.take().filter(|(k, s)| *k == key && !s.is_closed());
        let mut sender = match reusable {
            Some((_, s)) => s,
            None => {
                let s = self.connect(&key, addrs).await?;
                Counters::inc(&self.sb.counters.connections_allowed);
                s
            }
        };
        if sender.ready().await.is_err() {
            sender = self.connect(&key, addrs).await?;
        }
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        *slot = Some((key, sender));
        Ok(resp)
    }

    async fn connect(
        &self,
        (name, _, tls): &UpstreamKey,
        addrs: &[SocketAddr],
    ) -> Result<SendRequest<Outgoing>, String> {
        let tcp = self
            .sb
            .shared
            .connect(addrs)
            .await
            .map_err(|e| e.to_string())?;
        if *tls {
            let server_name = ServerName::try_from(name.clone()).map_err(|e| e.to_string())?;
            let connector = tokio_rustls::TlsConnector::from(self.sb.shared.client_tls.clone());
            let stream =
                tokio::time::timeout(Duration::from_secs(10), connector.connect(server_name, tcp))
                    .await
                    .map_err(|_| "TLS handshake timed out".to_owned())?
                    .map_err(|e| format!("TLS: {e}"))?;
            handshake(stream).await
        } else {
            handshake(tcp).await
        }
    }
}

async fn handshake<I>(io: I) -> Result<SendRequest<Outgoing>, String>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "upstream HTTP connection ended");
        }
    });
    Ok(sender)
}

/// How long the start of a body a `full_request` callback is sent may take.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(30);

/// Reads the start of `req`'s body (up to [`callback::MAX_SNAPSHOT_BODY`])
/// for a `full_request` callback: the request as the guest sent it, and
/// the request again with its whole body (what was read, then the rest).
async fn snapshot(
    req: Request<Outgoing>,
    name: &str,
    port: u16,
) -> Result<(Request<Outgoing>, callback::RequestSnapshot), BoxError> {
    use base64::Engine;
    let (parts, mut body) = req.into_parts();
    let mut frames = std::collections::VecDeque::new();
    let mut data = Vec::new();
    let mut ended = false;
    while data.len() < callback::MAX_SNAPSHOT_BODY {
        match body.frame().await.transpose()? {
            None => {
                ended = true;
                break;
            }
            Some(frame) => {
                if let Some(d) = frame.data_ref() {
                    data.extend_from_slice(d);
                }
                frames.push_back(frame);
            }
        }
    }
    let truncated = data.len() > callback::MAX_SNAPSHOT_BODY || (!ended && !body.is_end_stream());
    data.truncate(callback::MAX_SNAPSHOT_BODY);
    let mut headers = std::collections::BTreeMap::<String, Vec<String>>::new();
    let mut sent = parts.headers.clone();
    remove_hop_by_hop(&mut sent);
    for (k, v) in &sent {
        headers
            .entry(k.as_str().to_owned())
            .or_default()
            .push(String::from_utf8_lossy(v.as_bytes()).into_owned());
    }
    let path = parts.uri.path().to_owned();
    let query = parts.uri.query().map(str::to_owned);
    let authority = host_value(name, port, true);
    let snap = callback::RequestSnapshot {
        method: parts.method.to_string(),
        url: format!(
            "https://{authority}{}",
            parts.uri.path_and_query().map_or("/", |p| p.as_str())
        ),
        scheme: "https",
        host: name.to_owned(),
        path,
        query,
        headers,
        body_base64: base64::engine::general_purpose::STANDARD.encode(&data),
        body_truncated: truncated,
    };
    let rest = (!ended).then_some(body);
    let replay = Replay { frames, rest };
    Ok((Request::from_parts(parts, replay.boxed()), snap))
}

/// A body read in part: the frames already read, then the rest.
struct Replay {
    frames: std::collections::VecDeque<http_body::Frame<Bytes>>,
    rest: Option<Outgoing>,
}

impl http_body::Body for Replay {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        if let Some(f) = self.frames.pop_front() {
            return std::task::Poll::Ready(Some(Ok(f)));
        }
        match self.rest.as_mut() {
            Some(rest) => std::pin::Pin::new(rest).poll_frame(cx),
            None => std::task::Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && self.rest.as_ref().is_none_or(|r| r.is_end_stream())
    }
}

/// How long a guest may take to send the part of an upload's body that
/// names its object.
const UPLOAD_NAME_TIMEOUT: Duration = Duration::from_secs(30);

/// Why an upload whose body names its object is not sent on.
enum UploadError {
    /// The object is outside the mount's scope, or the body does not say
    /// which it is in a way the proxy can be sure of: a scope refusal. The
    /// rest of the body, to [`drain`] first.
    Refused(String, Outgoing),
    /// The guest's body failed.
    Read(BoxError),
}

/// Reads the start of an upload whose body names its object
/// ([`crate::bucket_scope::BodyNamed`]) until the name is known, checks it
/// is inside `scope`, and gives the request back with its whole body as
/// the guest sent it: the frames read, then the rest, streamed. At most
/// [`crate::bucket_scope::MAX_METADATA`] bytes (and what arrived with them)
/// are held, whatever the upload's size.
async fn upload_named(
    req: Request<Outgoing>,
    scope: &BucketScope,
    upload: &BodyNamed,
) -> Result<Request<Outgoing>, UploadError> {
    let (parts, mut body) = req.into_parts();
    let mut frames = std::collections::VecDeque::new();
    let mut data = Vec::new();
    let mut ended = false;
    let forbidden = loop {
        match named(scope, upload, &data, ended) {
            Ok(Some(forbidden)) => break forbidden,
            Ok(None) => {}
            Err(why) => return Err(UploadError::Refused(why, body)),
        }
        match body.frame().await {
            None => ended = true,
            Some(frame) => {
                let frame = frame.map_err(UploadError::Read)?;
                if let Some(d) = frame.data_ref() {
                    data.extend_from_slice(d);
                }
                frames.push_back(frame);
            }
        }
    };
    if let Some(pattern) = forbidden {
        let mut watch = crate::bucket_scope::DelimiterWatch::new(pattern);
        if watch.seen_in(&data) {
            return Err(UploadError::Refused(CRLF_IN_LF.into(), body));
        }
        body = Watched { body, watch }.boxed();
    }
    let rest = (!ended).then_some(body);
    Ok(Request::from_parts(parts, Replay { frames, rest }.boxed()))
}

/// Most of a refused upload's body read and dropped before the refusal
/// is sent, and for how long: a client still sending when the connection
/// closes may never see the answer (the data left unread resets the
/// connection). Multipart uploads are small (Google's Go client sends up
/// to 16 MiB in one, its Python client up to 8 MiB; larger files go as
/// resumable uploads).
const DRAIN_MAX: usize = 16 << 20;
const DRAIN_TIME: Duration = Duration::from_secs(5);

/// Reads and drops what is left of `body`, within [`DRAIN_MAX`] and
/// [`DRAIN_TIME`].
async fn drain(mut body: Outgoing) {
    let mut left = DRAIN_MAX;
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        while let Some(Ok(frame)) = body.frame().await {
            let n = frame.data_ref().map_or(0, Bytes::len);
            if n >= left {
                break;
            }
            left -= n;
        }
    })
    .await;
}

/// Whether the start of an upload's body, `data` (all of it if `ended`),
/// names an object inside `scope`: `Ok(None)` while it does not say yet;
/// once it does, what must occur nowhere in the body
/// ([`crate::bucket_scope::FirstPart::forbidden`]).
fn named(
    scope: &BucketScope,
    upload: &BodyNamed,
    data: &[u8],
    ended: bool,
) -> Result<Option<Option<Vec<u8>>>, String> {
    use crate::bucket_scope::{self as bs, UploadBody, MAX_METADATA};
    match &upload.body {
        UploadBody::Metadata if data.len() > MAX_METADATA => Err(format!(
            "the upload's metadata (its body) is longer than {} KiB",
            MAX_METADATA >> 10
        )),
        UploadBody::Metadata if ended => {
            bs::check_metadata(scope, upload, data).map(|()| Some(None))
        }
        UploadBody::Metadata => Ok(None),
        UploadBody::Multipart { boundary } => match bs::multipart_metadata(data, boundary)? {
            Some(part) => {
                bs::check_metadata(scope, upload, part.metadata)?;
                Ok(Some(part.forbidden))
            }
            None if ended => {
                Err("a multipart upload's body ends before its first part does".into())
            }
            None => Ok(None),
        },
    }
}

/// Why a multipart body of LF lines is not sent on (see
/// [`crate::bucket_scope`]'s docs).
const CRLF_IN_LF: &str =
    "a multipart upload whose lines end in LF has a boundary line ending in CRLF";

/// The rest of a multipart body whose lines end in LF alone: it fails
/// where a CRLF boundary line appears, so the upstream never gets a whole
/// request it might read other parts from.
struct Watched {
    body: Outgoing,
    watch: crate::bucket_scope::DelimiterWatch,
}

impl http_body::Body for Watched {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let frame = std::task::ready!(std::pin::Pin::new(&mut this.body).poll_frame(cx));
        if let Some(Ok(f)) = &frame {
            if f.data_ref().is_some_and(|d| this.watch.seen_in(d)) {
                tracing::debug!("{CRLF_IN_LF}: the upload is cut off");
                return std::task::Poll::Ready(Some(Err(CRLF_IN_LF.into())));
            }
        }
        std::task::Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Most of a body the proxy reads to hash it for an AWS signature (when
/// the guest did not send `x-amz-content-sha256`; AWS's JSON and query
/// APIs take small bodies, S3 always sends the header).
const MAX_SIGNED_BODY: usize = 8 << 20;

/// Signs an AWS request again with a rule's keys (see [`sigv4`]). A
/// request not signed with SigV4 goes as it is (AWS answers it); one
/// that cannot be re-signed is answered here, never sent half-signed.
async fn resign_aws(
    req: Request<Outgoing>,
    keys: &crate::policy::AwsKeys,
) -> Result<Request<Outgoing>, Response<Body>> {
    use crate::sigv4;
    let refuse =
        |status: StatusCode, why: &str| text(status, format!("Hearth egress proxy: {why}\n"));
    let guest = match req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(sigv4::parse_authorization)
    {
        Some(g) => g,
        None => return Ok(req),
    };
    let (mut parts, body) = req.into_parts();
    let (hash, body) = match parts
        .headers
        .get(sigv4::CONTENT_SHA256)
        .and_then(|v| v.to_str().ok())
    {
        Some(h) if sigv4::usable_payload_hash(h) => (h.to_owned(), body),
        Some(_) => {
            return Err(refuse(
                StatusCode::NOT_IMPLEMENTED,
                "a payload signed chunk by chunk (STREAMING-AWS4-HMAC-SHA256-PAYLOAD) cannot be re-signed; send UNSIGNED-PAYLOAD or the body's SHA-256",
            ))
        }
        None => {
            let bytes = match read_whole(body, MAX_SIGNED_BODY).await {
                Some(b) => b,
                None => {
                    return Err(refuse(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "the body of an AWS request without x-amz-content-sha256 is too large to sign (over 8 MiB)",
                    ))
                }
            };
            let hash = sigv4::payload_hash(&bytes);
            (hash, Full::new(bytes).map_err(|n| match n {}).boxed())
        }
    };
    let pq = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    if let Err(why) = sigv4::resign(
        parts.method.as_str(),
        &pq,
        &mut parts.headers,
        &guest,
        &hash,
        keys,
    ) {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            &format!("cannot sign this AWS request: {why}"),
        ));
    }
    Ok(Request::from_parts(parts, body))
}

/// All of `body` if it is at most `max` bytes; `None` if it is longer or
/// fails. (Not `http_body_util::Limited`: the compiler cannot prove its
/// collecting future over this boxed error `Send`, as the connection's
/// task must be.)
async fn read_whole(mut body: Outgoing, max: usize) -> Option<Bytes> {
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.ok()?.into_data() {
            if bytes.len() + data.len() > max {
                return None;
            }
            bytes.extend_from_slice(&data);
        }
    }
    Some(Bytes::from(bytes))
}

/// `Host` for a request to `name:port` (the port only when not the default).
fn host_value(name: &str, port: u16, tls: bool) -> String {
    let host = match crate::pattern::parse_ip(name) {
        Some(std::net::IpAddr::V6(v6)) => format!("[{v6}]"),
        _ => name.to_owned(),
    };
    let default = if tls { 443 } else { 80 };
    if port == default {
        host
    } else {
        format!("{host}:{port}")
    }
}

/// Origin-form URI, `Host` set when the guest sent none, no hop-by-hop
/// headers, injected headers replacing the guest's of the same name.
fn prepare<B>(mut req: Request<B>, inject: &[(String, String)], host: Option<&str>) -> Request<B> {
    if let Some(v) = host.and_then(|h| HeaderValue::from_str(h).ok()) {
        req.headers_mut().insert(header::HOST, v);
    }
    let uri = req.uri().clone();
    if uri.authority().is_some() {
        let pq = uri.path_and_query().map_or("/", |p| p.as_str());
        if let Ok(u) = pq.parse::<Uri>() {
            *req.uri_mut() = u;
        }
    }
    let headers = req.headers_mut();
    remove_hop_by_hop(headers);
    for (name, _) in inject {
        headers.remove(name.as_str());
    }
    for (name, value) in inject {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            headers.append(n, v);
        }
    }
    req
}
