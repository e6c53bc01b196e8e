//! Requests the host agent makes on a tenant's behalf, to a URL the tenant
//! chose (header callbacks, OAuth token endpoints): they pass the same
//! private-address gate as guest traffic. The name is resolved, every
//! address is checked, and only a checked address is connected to (a name
//! that resolved to a public address at create time and to the metadata
//! address now is refused). The answer is bounded (a head and a body cap;
//! the caller bounds the time). The errors are for the host's log only:
//! the guest learns that the call failed, never what answered where, so
//! these calls cannot probe networks.

use bytes::Bytes;
use http::{header, HeaderName, HeaderValue, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;

use crate::Sandbox;

/// Largest answer body read.
pub(crate) const MAX_BODY: usize = 64 * 1024;
/// Largest answer head buffered (hyper's minimum is 8 KiB).
const MAX_HEAD: usize = 16 * 1024;

/// Why an outbound request got no answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OutboundError {
    #[error("URL {url:?} is not an absolute http(s) URL")]
    BadUrl { url: String },
    #[error("cannot resolve {host:?}")]
    Unresolved { host: String },
    #[error("{host:?} is a private address ({ip}) the operator did not allow")]
    Private { host: String, ip: std::net::IpAddr },
    #[error("connect to {host:?}")]
    Connect {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS with {host:?}")]
    Tls {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP exchange")]
    Http(#[source] hyper::Error),
    #[error("build the request")]
    Request(#[source] http::Error),
    #[error("read the answer (at most {MAX_BODY} bytes)")]
    Body(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// POSTs `body` (of `content_type`) to `url` with `headers`, through the
/// private-address gate; the answer's status and (bounded) body.
pub(crate) async fn post(
    sb: &Sandbox,
    url: &str,
    content_type: &'static str,
    headers: &[(String, String)],
    body: Vec<u8>,
) -> Result<(StatusCode, Bytes), OutboundError> {
    let bad_url = || OutboundError::BadUrl {
        url: url.to_owned(),
    };
    let uri: Uri = url.parse().map_err(|_| bad_url())?;
    let tls = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(bad_url()),
    };
    let host = uri
        .host()
        .ok_or_else(bad_url)?
        .trim_matches(['[', ']'])
        .to_owned();
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let resolved = sb
        .shared
        .resolve(&host, port)
        .await
        .map_err(|_| OutboundError::Unresolved { host: host.clone() })?;
    // Every address is checked; only checked ones are connected to.
    let mut refused = None;
    let addrs: Vec<_> = resolved
        .into_iter()
        .filter(|a| {
            let private = sb.shared.gate.refuses(a.ip());
            if private {
                refused.get_or_insert(a.ip());
            }
            !private
        })
        .collect();
    if addrs.is_empty() {
        return Err(match refused {
            Some(ip) => OutboundError::Private { host, ip },
            None => OutboundError::Unresolved { host },
        });
    }
    let tcp = sb
        .shared
        .connect(&addrs)
        .await
        .map_err(|source| OutboundError::Connect {
            host: host.clone(),
            source,
        })?;
    let mut req = Request::post(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(
            header::HOST,
            uri.authority().map_or(host.as_str(), |a| a.as_str()),
        )
        .header(header::CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body)))
        .map_err(OutboundError::Request)?;
    for (name, value) in headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            req.headers_mut().insert(n, v);
        }
    }
    if tls {
        let name = ServerName::try_from(host.clone()).map_err(|_| bad_url())?;
        let connector = tokio_rustls::TlsConnector::from(sb.shared.client_tls.clone());
        let stream = connector
            .connect(name, tcp)
            .await
            .map_err(|source| OutboundError::Tls {
                host: host.clone(),
                source,
            })?;
        send(stream, req).await
    } else {
        send(tcp, req).await
    }
}

async fn send<I>(io: I, req: Request<Full<Bytes>>) -> Result<(StatusCode, Bytes), OutboundError>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(MAX_HEAD)
        .handshake(TokioIo::new(io))
        .await
        .map_err(OutboundError::Http)?;
    let driver = tokio::spawn(conn);
    let out = match sender.send_request(req).await {
        Ok(resp) => {
            let status = resp.status();
            Limited::new(resp.into_body(), MAX_BODY)
                .collect()
                .await
                .map(|c| (status, c.to_bytes()))
                .map_err(OutboundError::Body)
        }
        Err(e) => Err(OutboundError::Http(e)),
    };
    driver.abort();
    out
}
