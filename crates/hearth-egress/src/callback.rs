//! Header callbacks: `POST {"host","port","identity"[,"request"]}` to the
//! configured URL, 2xx JSON `{"headers": {...}}`, cached per (callback,
//! body) for its TTL: per host and port, or, for a `full_request` callback,
//! per identical request. Any failure is the caller's 502 (fail closed).
//!
//! Each POST carries `X-LangSmith-Signature-JWT`: an EdDSA JWT (`sub`
//! `langsmith-sandbox-callback`, `aud` the callback URL, `body_sha256` of
//! the exact body, five minutes of life) signed with this host's key, which
//! the control plane publishes at `/.well-known/jwks.json`; LangSmith's
//! `SandboxTokenVerifier.verify_callback` checks it, so a callback endpoint
//! knows the request came from Hearth about this sandbox and workspace.
//!
//! The host agent makes these requests, to a URL the tenant chose, so they
//! pass the same private-address gate as guest traffic: the name is
//! resolved, every address is checked, and only a checked address is
//! connected to (a name that resolves to a public address at create time
//! and to the metadata address now is refused). The answer is bounded (a
//! total timeout, a head and a body cap), and its details (status, connect
//! error, refusal) go to the host's log only: the guest learns "callback
//! failed", never what answered where, so callbacks cannot probe networks.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderName, HeaderValue, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;

use crate::policy::{Callback, Policy};
use crate::{lock, Sandbox};

/// The header a callback's signature travels in.
pub const SIGNATURE_HEADER: &str = "x-langsmith-signature-jwt";
/// The `sub` of a callback's signature.
const SUBJECT: &str = "langsmith-sandbox-callback";
/// How long a callback's signature is valid.
const SIGNATURE_TTL: Duration = Duration::from_secs(300);
/// The most of a request's body a `full_request` callback is sent.
pub(crate) const MAX_SNAPSHOT_BODY: usize = 64 * 1024;

/// The request a `full_request` callback is asked about, as the guest sent
/// it (the field names are what LangSmith's SDK parses).
#[derive(Debug, serde::Serialize)]
pub(crate) struct RequestSnapshot {
    pub method: String,
    pub url: String,
    pub scheme: &'static str,
    pub host: String,
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    pub headers: BTreeMap<String, Vec<String>>,
    pub body_base64: String,
    pub body_truncated: bool,
}

/// What the callback is POSTed.
#[derive(serde::Serialize)]
struct CallbackBody<'a> {
    host: &'a str,
    port: u16,
    identity: Identity<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    request: Option<&'a RequestSnapshot>,
}

#[derive(serde::Serialize)]
struct Identity<'a> {
    tenant_id: &'a str,
    sandbox_id: &'a str,
    organization_id: Option<&'a str>,
    ls_user_id: Option<&'a str>,
}

#[derive(serde::Serialize)]
struct Claims<'a> {
    iss: &'a str,
    aud: &'a str,
    sub: &'static str,
    iat: u64,
    exp: u64,
    body_sha256: &'a str,
}

/// The whole call: resolve, connect, TLS, request and answer.
const TIMEOUT: Duration = Duration::from_secs(10);
/// Largest answer body read.
const MAX_BODY: usize = 64 * 1024;
/// Largest answer head buffered (hyper's minimum is 8 KiB).
const MAX_HEAD: usize = 16 * 1024;

/// Why a callback gave no headers; for the host's log, never the guest.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallbackError {
    #[error("callback URL {url:?} is not an absolute http(s) URL")]
    BadUrl { url: String },
    #[error("cannot resolve the callback host {host:?}")]
    Unresolved { host: String },
    #[error("callback host {host:?} is a private address ({ip}) the operator did not allow")]
    Private { host: String, ip: std::net::IpAddr },
    #[error("connect to the callback host {host:?}")]
    Connect {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS with the callback host {host:?}")]
    Tls {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("callback HTTP exchange")]
    Http(#[source] hyper::Error),
    #[error("build the callback request")]
    Request(#[source] http::Error),
    #[error("the callback answered {0}")]
    Status(StatusCode),
    #[error("read the callback's answer (at most {MAX_BODY} bytes)")]
    Body(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("the callback's answer is invalid: {0}")]
    Answer(String),
    #[error("the callback took longer than {TIMEOUT:?}")]
    Timeout,
    #[error("encode the callback's body or signature")]
    Encode(#[source] serde_json::Error),
}

/// `e` and its sources, for a log line.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        out.push_str(": ");
        out.push_str(&s.to_string());
        next = s.source();
    }
    out
}

/// The headers `cb` gives a request to `host:port` (`request`: the
/// request itself, for a `full_request` callback).
pub(crate) async fn headers(
    sb: &Sandbox,
    policy: &Policy,
    cb: &Callback,
    host: &str,
    port: u16,
    request: Option<&RequestSnapshot>,
) -> Result<Vec<(String, String)>, CallbackError> {
    let host = host.to_ascii_lowercase();
    let body = serde_json::to_vec(&CallbackBody {
        host: &host,
        port,
        identity: Identity {
            tenant_id: policy.tenant_id.as_deref().unwrap_or_default(),
            sandbox_id: &sb.id,
            organization_id: None,
            ls_user_id: None,
        },
        request: request.filter(|_| cb.full_request),
    })
    .map_err(CallbackError::Encode)?;
    let digest = crate::sigv4::payload_hash(&body);
    let key = (cb.url.clone(), digest.clone());
    if let Some((headers, until)) = lock(&sb.callback_cache).get(&key) {
        if Instant::now() < *until {
            return Ok(headers.clone());
        }
    }
    let signature = match &sb.shared.settings.callback_signer {
        Some(s) => Some(sign(s, &cb.url, &digest)?),
        None => None,
    };
    let headers = tokio::time::timeout(TIMEOUT, call(sb, cb, body, signature))
        .await
        .map_err(|_| CallbackError::Timeout)??;
    let until = Instant::now() + Duration::from_secs(cb.ttl_seconds);
    let mut cache = lock(&sb.callback_cache);
    if cache.len() >= 1024 {
        cache.clear();
    }
    cache.insert(key, (headers.clone(), until));
    Ok(headers)
}

/// The signature of a callback to `url` whose body hashes to `digest`.
fn sign(signer: &crate::CallbackSigner, url: &str, digest: &str) -> Result<String, CallbackError> {
    let iat = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    hearth_fence::jwt::sign(
        &signer.key,
        &Claims {
            iss: &signer.issuer,
            aud: url,
            sub: SUBJECT,
            iat,
            exp: iat + SIGNATURE_TTL.as_secs(),
            body_sha256: digest,
        },
    )
    .map_err(CallbackError::Encode)
}

async fn call(
    sb: &Sandbox,
    cb: &Callback,
    body: Vec<u8>,
    signature: Option<String>,
) -> Result<Vec<(String, String)>, CallbackError> {
    let bad_url = || CallbackError::BadUrl {
        url: cb.url.clone(),
    };
    let uri: Uri = cb.url.parse().map_err(|_| bad_url())?;
    let tls = uri.scheme_str() == Some("https");
    let cb_host = uri
        .host()
        .ok_or_else(bad_url)?
        .trim_matches(['[', ']'])
        .to_owned();
    let cb_port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let resolved =
        sb.shared
            .resolve(&cb_host, cb_port)
            .await
            .map_err(|_| CallbackError::Unresolved {
                host: cb_host.clone(),
            })?;
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
            Some(ip) => CallbackError::Private { host: cb_host, ip },
            None => CallbackError::Unresolved { host: cb_host },
        });
    }
    let tcp = sb
        .shared
        .connect(&addrs)
        .await
        .map_err(|source| CallbackError::Connect {
            host: cb_host.clone(),
            source,
        })?;
    let mut req = Request::post(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(
            header::HOST,
            uri.authority().map_or(cb_host.as_str(), |a| a.as_str()),
        )
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(CallbackError::Request)?;
    for (name, value) in &cb.request_headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            req.headers_mut().insert(n, v);
        }
    }
    // After the tenant's headers, so none can stand in for it.
    if let Some(v) = signature.and_then(|s| HeaderValue::from_str(&s).ok()) {
        req.headers_mut().insert(SIGNATURE_HEADER, v);
    }
    let (status, body) = if tls {
        let name = ServerName::try_from(cb_host.clone()).map_err(|_| bad_url())?;
        let connector = tokio_rustls::TlsConnector::from(sb.shared.client_tls.clone());
        let stream = connector
            .connect(name, tcp)
            .await
            .map_err(|source| CallbackError::Tls {
                host: cb_host.clone(),
                source,
            })?;
        send(stream, req).await?
    } else {
        send(tcp, req).await?
    };
    if !status.is_success() {
        return Err(CallbackError::Status(status));
    }
    parse(&body).map_err(CallbackError::Answer)
}

async fn send<I>(io: I, req: Request<Full<Bytes>>) -> Result<(StatusCode, Bytes), CallbackError>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(MAX_HEAD)
        .handshake(TokioIo::new(io))
        .await
        .map_err(CallbackError::Http)?;
    let driver = tokio::spawn(conn);
    let out = match sender.send_request(req).await {
        Ok(resp) => {
            let status = resp.status();
            Limited::new(resp.into_body(), MAX_BODY)
                .collect()
                .await
                .map(|c| (status, c.to_bytes()))
                .map_err(CallbackError::Body)
        }
        Err(e) => Err(CallbackError::Http(e)),
    };
    driver.abort();
    out
}

/// `{"headers": {"name": "value", ...}}` with valid names and values.
fn parse(body: &[u8]) -> Result<Vec<(String, String)>, String> {
    #[derive(serde::Deserialize)]
    struct Answer {
        headers: std::collections::BTreeMap<String, String>,
    }
    let answer: Answer =
        serde_json::from_slice(body).map_err(|e| format!("the callback's JSON is invalid: {e}"))?;
    let mut out = Vec::new();
    for (name, value) in answer.headers {
        let name = name.to_ascii_lowercase();
        if HeaderName::from_bytes(name.as_bytes()).is_err()
            || HeaderValue::from_str(&value).is_err()
        {
            return Err(format!("the callback returned an invalid header {name:?}"));
        }
        out.push((name, value));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn answers() {
        assert_eq!(
            parse(br#"{"headers":{"Authorization":"Bearer x"}}"#).unwrap(),
            vec![("authorization".to_owned(), "Bearer x".to_owned())]
        );
        assert!(parse(b"{}").is_err());
        assert!(parse(br#"{"headers":{"a b":"x"}}"#).is_err());
        assert!(parse(br#"{"headers":{"a":"x\ny"}}"#).is_err());
        assert!(parse(b"not json").is_err());
    }
}
