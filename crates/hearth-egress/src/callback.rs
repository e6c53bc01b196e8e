//! Header callbacks: `POST {"host","port"}` to the configured URL, 2xx JSON
//! `{"headers": {...}}`, cached per (callback, host, port) for its TTL. Any
//! failure is the caller's 502 (fail closed). Callbacks go wherever their
//! URL says, private addresses included: they are the operator's or user's
//! endpoints, called from the host, not the guest's traffic.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderName, HeaderValue, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;

use crate::policy::Callback;
use crate::{lock, Sandbox};

const TIMEOUT: Duration = Duration::from_secs(10);
const MAX_BODY: usize = 64 * 1024;

pub async fn headers(
    sb: &Sandbox,
    cb: &Callback,
    host: &str,
    port: u16,
) -> Result<Vec<(String, String)>, String> {
    let key = (cb.url.clone(), host.to_ascii_lowercase(), port);
    if let Some((headers, until)) = lock(&sb.callback_cache).get(&key) {
        if Instant::now() < *until {
            return Ok(headers.clone());
        }
    }
    let headers = tokio::time::timeout(TIMEOUT, call(sb, cb, host, port))
        .await
        .map_err(|_| "the callback timed out".to_owned())??;
    let until = Instant::now() + Duration::from_secs(cb.ttl_seconds);
    let mut cache = lock(&sb.callback_cache);
    if cache.len() >= 1024 {
        cache.clear();
    }
    cache.insert(key, (headers.clone(), until));
    Ok(headers)
}

async fn call(
    sb: &Sandbox,
    cb: &Callback,
    host: &str,
    port: u16,
) -> Result<Vec<(String, String)>, String> {
    let uri: Uri = cb.url.parse().map_err(|_| "bad callback URL".to_owned())?;
    let tls = uri.scheme_str() == Some("https");
    let cb_host = uri
        .host()
        .ok_or("callback URL has no host")?
        .trim_matches(['[', ']'])
        .to_owned();
    let cb_port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let addrs = sb
        .shared
        .resolve(&cb_host, cb_port)
        .await
        .map_err(|e| e.to_string())?;
    let tcp = sb
        .shared
        .connect(&addrs)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let body = serde_json::json!({ "host": host, "port": port }).to_string();
    let mut req = Request::post(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(
            header::HOST,
            uri.authority().map_or(cb_host.as_str(), |a| a.as_str()),
        )
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    for (name, value) in &cb.request_headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            req.headers_mut().insert(n, v);
        }
    }
    let resp = if tls {
        let name = ServerName::try_from(cb_host.clone()).map_err(|e| e.to_string())?;
        let connector = tokio_rustls::TlsConnector::from(sb.shared.client_tls.clone());
        let stream = connector
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        send(stream, req).await?
    } else {
        send(tcp, req).await?
    };
    let (parts, body) = resp;
    if !parts.is_success() {
        return Err(format!("the callback answered {parts}"));
    }
    parse(&body)
}

async fn send<I>(io: I, req: Request<Full<Bytes>>) -> Result<(StatusCode, Bytes), String>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(conn);
    let resp = sender.send_request(req).await.map_err(|e| e.to_string());
    let out = match resp {
        Ok(resp) => {
            let status = resp.status();
            Limited::new(resp.into_body(), MAX_BODY)
                .collect()
                .await
                .map(|c| (status, c.to_bytes()))
                .map_err(|e| format!("callback body: {e}"))
        }
        Err(e) => Err(e),
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
