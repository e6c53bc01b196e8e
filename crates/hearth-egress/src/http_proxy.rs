//! HTTP/1.1 towards the guest (plain, inside a CONNECT tunnel, or over
//! intercepted TLS): each request is checked against the current policy,
//! gets its rule's or callback's headers, and is forwarded upstream.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Request, Response, StatusCode, Uri};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Mutex;

use crate::policy::Policy;
use crate::{callback, Counters, RouteError, Sandbox};

type Body = BoxBody<Bytes, hyper::Error>;
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
}

/// One guest connection's forwarding state: the upstream it last used.
struct Conn {
    sb: Arc<Sandbox>,
    mode: Mode,
    upstream: Mutex<Option<(UpstreamKey, SendRequest<Incoming>)>>,
}

pub async fn serve_http<I>(sb: Arc<Sandbox>, io: I, mode: Mode)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let conn = Arc::new(Conn {
        sb,
        mode,
        upstream: Mutex::new(None),
    });
    let service = hyper::service::service_fn(move |req| {
        let conn = conn.clone();
        async move { Ok::<_, Infallible>(conn.handle(req).await) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .max_buf_size(crate::proxy::MAX_HEAD)
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(60))
        .keep_alive(true);
    if let Err(e) = builder.serve_connection(TokioIo::new(io), service).await {
        tracing::debug!(error = %e, "guest HTTP connection ended");
    }
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
        let Some((name, port, tls)) = self.target(&req) else {
            return text(
                StatusCode::BAD_REQUEST,
                "Hearth egress proxy: the request names no host\n".into(),
            );
        };
        if req.headers().contains_key(header::UPGRADE) {
            return text(
                StatusCode::NOT_IMPLEMENTED,
                "Hearth egress proxy: protocol upgrades (WebSocket) are not supported through the proxy yet\n".into(),
            );
        }
        // Read at every request, so a new policy applies on kept-alive connections.
        let policy = sb.policy();
        let addrs = match sb.route(&policy, &name, port).await {
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
        let inject = match self.injected(&policy, &name, port, &req).await {
            Ok(h) => h,
            Err(e) => {
                // The detail is the operator's: the guest must not learn
                // what answered (or did not) where.
                tracing::warn!(sandbox = %sb.id, host = %name, error = %callback::chain(&e), "header callback failed");
                return text(
                    StatusCode::BAD_GATEWAY,
                    format!("Hearth egress proxy: the header callback for {name:?} failed\n"),
                );
            }
        };
        let req = prepare(req, &inject);
        match self.send(req, (name.clone(), port, tls), &addrs).await {
            Ok(resp) => resp.map(|b| b.boxed()),
            Err(e) => text(
                StatusCode::BAD_GATEWAY,
                format!("Hearth egress proxy: upstream {name:?} failed: {e}\n"),
            ),
        }
    }

    /// (name, port, upstream TLS) of a request.
    fn target(&self, req: &Request<Incoming>) -> Option<(String, u16, bool)> {
        match &self.mode {
            Mode::Tls { name, port } => Some((name.clone(), *port, true)),
            Mode::Tunnel { name, port } => Some((name.clone(), *port, false)),
            Mode::Plain { ip, port } => {
                let host = req
                    .headers()
                    .get(header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .map(str::to_owned)
                    .or_else(|| req.uri().host().map(str::to_owned));
                let name = match host {
                    Some(h) => strip_port(&h),
                    None => ip.to_string(),
                };
                Some((name, *port, false))
            }
            Mode::Explicit => {
                let uri = req.uri();
                if uri.scheme_str() != Some("http") {
                    return None;
                }
                Some((
                    uri.host()?.trim_matches(['[', ']']).to_owned(),
                    uri.port_u16().unwrap_or(80),
                    false,
                ))
            }
        }
    }

    /// The headers to set: the first matching rule's, else a callback's.
    async fn injected(
        &self,
        policy: &Policy,
        name: &str,
        port: u16,
        req: &Request<Incoming>,
    ) -> Result<Vec<(String, String)>, callback::CallbackError> {
        if let Some(rule) = policy.rule_for(name, req.uri().path(), req.headers()) {
            return Ok(rule.headers.clone());
        }
        match policy.callback_for(name) {
            Some((_, cb)) => callback::headers(&self.sb, cb, name, port).await,
            None => Ok(Vec::new()),
        }
    }

    async fn send(
        &self,
        req: Request<Incoming>,
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
    ) -> Result<SendRequest<Incoming>, String> {
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

async fn handshake<I>(io: I) -> Result<SendRequest<Incoming>, String>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "upstream HTTP connection ended");
        }
    });
    Ok(sender)
}

fn strip_port(host: &str) -> String {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("").to_owned();
    }
    match host.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h.to_owned(),
        _ => host.to_owned(),
    }
}

/// Origin-form URI, no hop-by-hop headers, injected headers replacing the
/// guest's of the same name.
fn prepare(mut req: Request<Incoming>, inject: &[(String, String)]) -> Request<Incoming> {
    let uri = req.uri().clone();
    if uri.authority().is_some() {
        if req.headers().get(header::HOST).is_none() {
            if let Some(v) = uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            {
                req.headers_mut().insert(header::HOST, v);
            }
        }
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
