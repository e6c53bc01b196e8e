//! A small HTTP/1.1 client for the public API: one connection per request
//! (hyper's connection-level client), `X-Api-Key` on every request, and
//! LangSmith's error envelope turned into one readable line.

use std::fmt;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderValue, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, Uri};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde_json::Value;

use super::Endpoint;

/// How long opening a TCP connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most of an error body that is read.
const ERROR_BODY_LIMIT: usize = 64 * 1024;

/// A request body: whole or streamed.
pub type Body = UnsyncBoxBody<Bytes, std::io::Error>;

pub fn empty() -> Body {
    full(Bytes::new())
}

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// An `http://host[:port][/prefix]` URL split into what a request needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// `host:port` as written (for the `Host` header).
    pub authority: String,
    pub host: String,
    pub port: u16,
    /// Path prefix without a trailing slash ("" for the root).
    pub prefix: String,
}

impl Target {
    pub fn parse(url: &str) -> anyhow::Result<Self> {
        let uri: Uri = url
            .trim()
            .parse()
            .with_context(|| format!("{url:?} is not a URL"))?;
        match uri.scheme_str() {
            Some("http") | Some("ws") => {}
            Some("https") | Some("wss") => bail!(
                "{url}: https is not supported by this client; \
                 use http:// (e.g. through an SSH tunnel or on a trusted network)"
            ),
            _ => bail!("{url:?} must start with http://"),
        }
        let authority = uri
            .authority()
            .ok_or_else(|| anyhow!("{url:?} has no host"))?;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        Ok(Self {
            authority: authority.as_str().to_owned(),
            host,
            port: authority.port_u16().unwrap_or(80),
            prefix: uri.path().trim_end_matches('/').to_owned(),
        })
    }

    pub fn origin(&self) -> String {
        format!("http://{}", self.authority)
    }
}

/// The file beside an operator socket that names the endpoints it stands
/// for (`hearth up`'s public URL and listen address, one a line).
pub fn socket_endpoints(socket: &std::path::Path) -> std::path::PathBuf {
    let mut name = socket.as_os_str().to_owned();
    name.push(".endpoints");
    name.into()
}

/// Whether the operator socket at `socket` serves `target`: only then do
/// requests to it go through the socket (a CLI pointed at another server
/// with `--endpoint` goes there, whatever `HEARTH_SOCKET` says).
fn stands_for(socket: &std::path::Path, target: &Target) -> bool {
    let Ok(text) = std::fs::read_to_string(socket_endpoints(socket)) else {
        return false;
    };
    text.lines()
        .filter_map(|l| Target::parse(l).ok())
        .any(|t| t.authority.eq_ignore_ascii_case(&target.authority))
}

/// A connection to the server, over TCP or the operator's socket.
pub trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static {}
impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static> Io for S {}

/// An HTTP/1.1 connection on `stream`, driven in the background.
async fn handshake(stream: Box<dyn Io>, unreachable: &str) -> anyhow::Result<SendRequest<Body>> {
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .with_context(|| unreachable.to_owned())?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "http connection ended");
        }
    });
    Ok(sender)
}

/// An error answer of the server, already put into words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    pub status: u16,
    /// `detail.error`, when the body had one.
    pub error: Option<String>,
    pub message: String,
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.error {
            Some(e) => write!(f, "{} ({} {e})", self.message, self.status),
            None => write!(f, "{} (HTTP {})", self.message, self.status),
        }
    }
}

impl std::error::Error for ServerError {}

impl ServerError {
    /// Reads LangSmith's envelope: `{"detail":{"error","message"}}`, the
    /// FastAPI list form `{"detail":[{"loc","msg"}]}`, a string `detail`, or
    /// anything else as text.
    pub fn from_body(status: u16, body: &[u8]) -> Self {
        let reason = hyper::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("error");
        let text = String::from_utf8_lossy(body).trim().to_owned();
        let json: Option<Value> = serde_json::from_slice(body).ok();
        let detail = json.as_ref().and_then(|j| j.get("detail"));
        let (error, message) = match detail {
            Some(Value::Object(d)) => (
                d.get("error").and_then(Value::as_str).map(str::to_owned),
                d.get("message")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .unwrap_or_else(|| reason.to_owned()),
            ),
            Some(Value::Array(items)) => {
                let msgs: Vec<String> = items.iter().map(validation_item).collect();
                let error = (status == 422).then(|| "ValidationError".to_owned());
                (error, msgs.join("; "))
            }
            Some(Value::String(s)) => (None, s.clone()),
            // E2B's door: `{code, message}`.
            None if json.as_ref().and_then(|j| j["message"].as_str()).is_some() => (
                None,
                json.as_ref()
                    .and_then(|j| j["message"].as_str())
                    .unwrap_or_default()
                    .to_owned(),
            ),
            _ if text.is_empty() || text.len() > 300 => (None, reason.to_owned()),
            _ => (None, text.replace('\n', " ")),
        };
        Self {
            status,
            error,
            message,
        }
    }
}

/// One FastAPI validation item as `field: msg` (unless `msg` names it).
fn validation_item(item: &Value) -> String {
    let msg = item
        .get("msg")
        .and_then(Value::as_str)
        .unwrap_or("invalid value");
    let loc: Vec<String> = item
        .get("loc")
        .and_then(Value::as_array)
        .map(|l| {
            l.iter()
                .skip_while(|s| s.as_str() == Some("body"))
                .map(|s| match s {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect()
        })
        .unwrap_or_default();
    let field = loc.join(".");
    if field.is_empty() || msg.starts_with(&field) {
        msg.to_owned()
    } else {
        format!("{field}: {msg}")
    }
}

/// Percent-encodes one path segment or query value (everything but
/// RFC 3986's unreserved characters).
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The API of one server.
#[derive(Clone, Debug)]
pub struct Api {
    /// As the user gave it, for messages.
    pub endpoint: String,
    target: Target,
    /// Path of the sandbox API, e.g. `/api/v2/sandboxes`.
    base_path: String,
    pub api_key: Option<String>,
    /// The operator's socket, for requests to `target`'s authority.
    socket: Option<std::path::PathBuf>,
}

impl Api {
    pub fn new(ep: &Endpoint) -> anyhow::Result<Self> {
        let endpoint = ep.endpoint.trim().trim_end_matches('/').to_owned();
        let target = Target::parse(&endpoint).context("--endpoint / LANGSMITH_ENDPOINT")?;
        // Like the SDK: a trailing /api/v1 or /api is dropped, then the
        // sandbox API's path is appended.
        let prefix = target.prefix.clone();
        let prefix = prefix
            .strip_suffix("/api/v1")
            .or_else(|| prefix.strip_suffix("/api"))
            .unwrap_or(&prefix);
        let socket = ep
            .socket
            .clone()
            .filter(|p| !p.as_os_str().is_empty() && stands_for(p, &target));
        Ok(Self {
            base_path: format!("{prefix}/api/v2/sandboxes"),
            endpoint,
            target,
            api_key: ep.api_key.clone().filter(|k| !k.is_empty()),
            socket,
        })
    }

    /// `{base}/boxes/{name}` and friends: `segments` are encoded one each.
    pub fn path(&self, segments: &[&str]) -> String {
        let mut p = self.base_path.clone();
        for s in segments {
            p.push('/');
            p.push_str(&encode(s));
        }
        p
    }

    /// `{root}/{segments…}`, each encoded: a path outside the sandbox
    /// API (E2B's `/templates…` on the same server).
    pub fn root_path(&self, segments: &[&str]) -> String {
        let mut p = self
            .base_path
            .strip_suffix("/api/v2/sandboxes")
            .unwrap_or_default()
            .to_owned();
        for s in segments {
            p.push('/');
            p.push_str(&encode(s));
        }
        p
    }

    /// A connection to `target`: the server's own authority (its API, and
    /// the data planes it names on it) through the operator's socket when
    /// there is one, anything else over TCP.
    pub async fn open(&self, target: &Target, unreachable: &str) -> anyhow::Result<Box<dyn Io>> {
        let timed_out = |_| anyhow!("{unreachable}: connection timed out");
        match &self.socket {
            Some(path) if target.authority == self.target.authority => {
                let connect = tokio::net::UnixStream::connect(path);
                let stream = tokio::time::timeout(CONNECT_TIMEOUT, connect)
                    .await
                    .map_err(timed_out)?
                    .map_err(|e| {
                        anyhow!(
                            "{unreachable} through the operator socket {} (HEARTH_SOCKET): {}",
                            path.display(),
                            io_reason(&e)
                        )
                    })?;
                Ok(Box::new(stream))
            }
            _ => {
                let connect = tokio::net::TcpStream::connect((target.host.as_str(), target.port));
                let stream = tokio::time::timeout(CONNECT_TIMEOUT, connect)
                    .await
                    .map_err(timed_out)?
                    .map_err(|e| anyhow!("{unreachable}: {}", io_reason(&e)))?;
                let _ = stream.set_nodelay(true);
                Ok(Box::new(stream))
            }
        }
    }

    /// Sends one request to `target` (the server or a data plane).
    pub async fn send_to(
        &self,
        target: &Target,
        unreachable: &str,
        method: Method,
        path_and_query: &str,
        content_type: Option<&str>,
        body: Body,
    ) -> anyhow::Result<Response<Incoming>> {
        let mut sender = handshake(self.open(target, unreachable).await?, unreachable).await?;
        let mut req = Request::builder()
            .method(method)
            .uri(path_and_query)
            .header(HOST, &target.authority)
            .header("user-agent", concat!("hearth/", env!("CARGO_PKG_VERSION")));
        if let Some(ct) = content_type {
            req = req.header(CONTENT_TYPE, ct);
        }
        if let Some(key) = &self.api_key {
            let mut v = HeaderValue::from_str(key).context("the API key is not a valid header")?;
            v.set_sensitive(true);
            req = req.header("x-api-key", v);
        }
        let req = req.body(body).context("build the request")?;
        sender
            .send_request(req)
            .await
            .map_err(|e| anyhow!("{unreachable}: {e}"))
    }

    /// A JSON call to the sandbox API; non-2xx answers become [`ServerError`].
    pub async fn json(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
    ) -> anyhow::Result<Value> {
        let what = format!("cannot reach {}", self.endpoint);
        self.json_to(&self.target, &what, method, path, body).await
    }

    /// A JSON call to `target` (the server or a data plane).
    pub async fn json_to(
        &self,
        target: &Target,
        unreachable: &str,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
    ) -> anyhow::Result<Value> {
        let (ct, body) = match body {
            Some(b) => (
                Some("application/json"),
                full(serde_json::to_vec(b).context("encode the request")?),
            ),
            None => (None, empty()),
        };
        let resp = self
            .send_to(target, unreachable, method, path, ct, body)
            .await?;
        let resp = check(resp).await?;
        let bytes = resp
            .into_body()
            .collect()
            .await
            .context("read the answer")?
            .to_bytes();
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&bytes).context("the server's answer is not JSON")
    }

    /// `GET {base}/boxes/{name}`.
    pub async fn get_box(&self, name: &str) -> anyhow::Result<Value> {
        self.json(Method::GET, &self.path(&["boxes", name]), None::<&()>)
            .await
            .with_context(|| format!("get sandbox {name:?}"))
    }

    /// The sandbox's data plane, from its `dataplane_url`.
    pub async fn dataplane(&self, name: &str) -> anyhow::Result<Target> {
        let sb = self.get_box(name).await?;
        let url = sb
            .get("dataplane_url")
            .and_then(Value::as_str)
            .filter(|u| !u.is_empty())
            .ok_or_else(|| {
                let status = sb
                    .get("status")
                    .and_then(Value::as_str)
                    .unwrap_or("unknown");
                anyhow!("sandbox {name:?} has no data plane (status: {status})")
            })?;
        Target::parse(url).with_context(|| format!("the dataplane_url of {name:?}"))
    }
}

/// Turns a non-2xx answer into a [`ServerError`].
pub async fn check(resp: Response<Incoming>) -> anyhow::Result<Response<Incoming>> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let mut body = Vec::new();
    let mut incoming = resp.into_body();
    while let Some(frame) = incoming.frame().await {
        let Ok(frame) = frame else { break };
        if let Some(d) = frame.data_ref() {
            body.extend_from_slice(d);
        }
        if body.len() > ERROR_BODY_LIMIT {
            break;
        }
    }
    Err(ServerError::from_body(status.as_u16(), &body).into())
}

/// The reason of a connect failure in few words.
pub fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connection refused".into(),
        std::io::ErrorKind::TimedOut => "connection timed out".into(),
        _ => e.to_string(),
    }
}

/// Adds a hint to errors where one helps.
pub fn hint(err: anyhow::Error, api: &Api) -> anyhow::Error {
    let Some(se) = err.downcast_ref::<ServerError>() else {
        return err;
    };
    if se.status == 401 && api.api_key.is_none() {
        return anyhow!("{err:#}; no API key was given: set LANGSMITH_API_KEY or pass --api-key");
    }
    err
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operator_socket_serves_only_the_endpoints_it_names() {
        let dir = std::env::temp_dir().join(format!("hearth-sock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("api.sock");
        let target = |url: &str| Target::parse(url).unwrap();
        // No file beside it: not ours to use.
        assert!(!stands_for(&socket, &target("http://127.0.0.1:8080")));
        std::fs::write(
            socket_endpoints(&socket),
            "https://hearth.example\nhttp://127.0.0.1:8080\n",
        )
        .unwrap();
        assert!(stands_for(&socket, &target("http://127.0.0.1:8080/api/v1")));
        assert!(!stands_for(&socket, &target("http://127.0.0.1:1")));
        assert!(!stands_for(&socket, &target("http://localhost:8080")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn envelopes_become_one_line() {
        let e = ServerError::from_body(
            404,
            br#"{"detail":{"error":"NotFound","error_id":"x","message":"sandbox 'a' not found"}}"#,
        );
        assert_eq!(e.to_string(), "sandbox 'a' not found (404 NotFound)");
        let e = ServerError::from_body(
            422,
            br#"{"detail":[{"loc":["body","vcpus"],"msg":"too small","type":"value_error"},
                {"loc":["body","mem_bytes"],"msg":"mem_bytes: too big","type":"value_error"}]}"#,
        );
        assert_eq!(
            e.to_string(),
            "vcpus: too small; mem_bytes: too big (422 ValidationError)"
        );
        let e = ServerError::from_body(502, b"Bad gateway\n");
        assert_eq!(e.to_string(), "Bad gateway (HTTP 502)");
        let e = ServerError::from_body(500, b"");
        assert_eq!(e.to_string(), "Internal Server Error (HTTP 500)");
    }

    #[test]
    fn targets_and_paths() {
        let t = Target::parse("http://h:9000/dataplane/abc/").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("h", 9000));
        assert_eq!(t.prefix, "/dataplane/abc");
        assert!(Target::parse("https://h").is_err());
        let api = Api::new(&Endpoint {
            endpoint: "http://h:8080/api/".into(),
            socket: None,
            api_key: Some(String::new()),
            json: false,
        })
        .unwrap();
        assert_eq!(
            api.path(&["boxes", "a b/c"]),
            "/api/v2/sandboxes/boxes/a%20b%2Fc"
        );
        assert_eq!(api.api_key, None);
    }
}
