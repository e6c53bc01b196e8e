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
//! The host agent makes these requests, to a URL the tenant chose, through
//! [`crate::outbound`] (the private-address gate, bounded answers), within
//! a total timeout; the details of a failure go to the host's log only: the
//! guest learns "callback failed", never what answered where.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use http::{HeaderName, HeaderValue, StatusCode};

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
/// Why a callback gave no headers; for the host's log, never the guest.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallbackError {
    #[error("the callback request")]
    Outbound(#[from] crate::outbound::OutboundError),
    #[error("the callback answered {0}")]
    Status(StatusCode),
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
    let mut headers = cb.request_headers.clone();
    // After the tenant's headers, so none can stand in for it.
    if let Some(s) = signature {
        headers.retain(|(n, _)| !n.eq_ignore_ascii_case(SIGNATURE_HEADER));
        headers.push((SIGNATURE_HEADER.to_owned(), s));
    }
    let (status, answer) =
        crate::outbound::post(sb, &cb.url, "application/json", &headers, body).await?;
    if !status.is_success() {
        return Err(CallbackError::Status(status));
    }
    parse(&answer).map_err(CallbackError::Answer)
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
