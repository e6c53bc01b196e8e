//! envd's data plane: `/health`, `/files` and the Connect-RPC services
//! `process.Process` and `filesystem.Filesystem`, over the sandbox's held
//! guest stream like LangSmith's data plane.
//!
//! A call names its sandbox in `E2b-Sandbox-Id` and proves it may use it
//! with `X-Access-Token` (checked before the sandbox is looked up). Only a
//! running sandbox answers: a paused one is 502, as E2B's edge answers,
//! and is not resumed by a data-plane call (E2B resumes on `connect`).
//!
//! Served: `Process/Start` (streamed, with keepalives; the SDK's
//! `/bin/bash -l -c CMD` runs as a shell command, so an image without
//! bash runs it with `/bin/sh`; with `stdin: true` its stdin stays open
//! for `SendInput` and `CloseStdin`, else it is closed at once),
//! `Process/{SendSignal, SendInput, CloseStdin, List, Update, Connect}`
//! (by pid, through the guest's `Stdin`, `Commands`, `Resize` and
//! `Follow` requests, which reach a running command without taking its
//! stream over; the SDK's
//! `pty.create`, `bash -i -l`, is a login shell, `sh` without bash), and
//! `Filesystem/{Stat, ListDir, MakeDir, Remove, Move, CreateWatcher,
//! GetWatcherEvents, RemoveWatcher}` (watchers live in the guest, so any
//! replica can answer for one; `WatchDir` streams one), and the client
//! stream `StreamInput`. Nothing else is served: it answers `unimplemented`,
//! and a `tag` is refused: none of it is accepted and then ignored.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use hearth_db::{SandboxRow, SandboxStatus};
use hearth_guest_proto::{
    ExecErrorType, ExecRequest, FileKind, FileStat, OpErrorKind, OutputChannel, PtySize,
};
use hearth_hostapi::{ExecHandle, ExecUpdate, GuestClient, GuestError};
use hearth_types::SandboxId;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::connect::{self, ConnectError};
use super::{E2bError, E2bResult};
use crate::domain::queries::spec_of;
use crate::runtime_tokens::RuntimeKind;
use crate::Control;

const B64: base64::engine::general_purpose::GeneralPurpose =
    base64::engine::general_purpose::STANDARD;

/// Largest request a Connect call may send (a command line and its
/// environment, or a path).
const MAX_RPC_BODY: usize = 1 << 20;
/// Most entries a `ListDir` answers (past it: `resource_exhausted`).
const MAX_LIST_ENTRIES: usize = 10_000;
/// Deepest `ListDir` walk.
const MAX_LIST_DEPTH: u32 = 16;

/// A call's sandbox: its row, its guest, and who commands run as.
struct Target {
    row: SandboxRow,
    guest: GuestClient,
    /// The sandbox's user (its run settings'), `None` = root.
    user: Option<String>,
    work_dir: Option<String>,
    env: BTreeMap<String, String>,
}

impl Target {
    /// The home directory of `user` (or the sandbox's user), which E2B
    /// resolves relative paths against.
    fn home(&self, user: Option<&str>) -> String {
        match user.or(self.user.as_deref()) {
            None | Some("root") | Some("0") => "/root".into(),
            Some(u) => format!("/home/{}", u.split(':').next().unwrap_or(u)),
        }
    }

    /// The guest path a call names (relative to the user's home), or
    /// why it cannot name one.
    fn path(&self, path: &str, user: Option<&str>) -> Result<String, BadPath> {
        if path.contains('\0') {
            return Err(BadPath("path: contains a NUL byte".into()));
        }
        if path.len() > MAX_PATH {
            return Err(BadPath(format!(
                "path: {} bytes, at most {MAX_PATH}",
                path.len()
            )));
        }
        Ok(if path.starts_with('/') {
            path.to_owned()
        } else {
            let home = self.home(user);
            let rest = path.trim_start_matches("./");
            if rest.is_empty() || rest == "." {
                home
            } else {
                format!("{home}/{rest}")
            }
        })
    }
}

/// Longest path a data-plane call may name (Linux's `PATH_MAX`).
const MAX_PATH: usize = 4096;

/// A path no file can have: refused before the guest sees it.
struct BadPath(String);

impl From<BadPath> for ConnectError {
    fn from(e: BadPath) -> Self {
        ConnectError::invalid(e.0)
    }
}

impl From<BadPath> for E2bError {
    fn from(e: BadPath) -> Self {
        E2bError::bad_request(e.0)
    }
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::trim)
}

/// The sandbox a data-plane call is for, checked.
async fn target(c: &Arc<Control>, headers: &HeaderMap) -> E2bResult<Target> {
    let id = header(headers, "e2b-sandbox-id").ok_or_else(|| {
        E2bError::bad_request(
            "E2b-Sandbox-Id is missing: point the SDK's sandbox URL (E2B_SANDBOX_URL) at this server",
        )
    })?;
    let token = header(headers, "x-access-token")
        .ok_or_else(|| E2bError::new(401, "X-Access-Token is missing"))?;
    let id: SandboxId = id
        .parse()
        .map_err(|_| E2bError::new(401, "the access token does not open this sandbox"))?;
    let not_running = || E2bError::new(502, format!("sandbox {id} is not running"));
    let row = match c.check_runtime_token(RuntimeKind::Envd, id, token).await? {
        Ok(row) => row,
        Err(crate::runtime_tokens::TokenRefusal::Gone) => return Err(not_running()),
        Err(refused) => return Err(E2bError::new(401, refused.to_string())),
    };
    if row.status != SandboxStatus::Ready {
        return Err(not_running());
    }
    let guest = c.ready_guest(&row).await.map_err(|_| not_running())?;
    c.touch(&row).await;
    let spec = spec_of(&row).ok();
    Ok(Target {
        user: spec.as_ref().and_then(|s| s.run.user.clone()),
        work_dir: spec.as_ref().and_then(|s| s.run.work_dir.clone()),
        env: spec.as_ref().map(|s| s.command_env()).unwrap_or_default(),
        row,
        guest,
    })
}

impl From<E2bError> for ConnectError {
    fn from(e: E2bError) -> Self {
        let code = match e.status {
            400 => "invalid_argument",
            401 => "unauthenticated",
            403 => "permission_denied",
            404 => "not_found",
            409 => "already_exists",
            502 | 503 => "unavailable",
            _ => "internal",
        };
        ConnectError::new(code, e.message)
    }
}

impl From<ConnectError> for E2bError {
    fn from(e: ConnectError) -> Self {
        E2bError::new(e.status().as_u16(), e.message)
    }
}

/// A guest failure as a Connect error about `path`.
fn fs_error(e: GuestError, path: &str) -> ConnectError {
    use hearth_guest_proto::OpErrorKind as K;
    match e.op_kind() {
        Some(K::NotFound) => ConnectError::not_found(format!("{path}: no such file or directory")),
        Some(K::AlreadyExists) => ConnectError::new("already_exists", format!("{path}: {e}")),
        Some(K::PermissionDenied) => ConnectError::new("permission_denied", format!("{path}: {e}")),
        Some(K::NotADirectory | K::IsADirectory | K::NotAFile | K::InvalidPath | K::BadRequest) => {
            ConnectError::invalid(format!("{path}: {e}"))
        }
        _ => ConnectError::internal(format!("{path}: {e}")),
    }
}

/// A guest failure as E2B's JSON error about `path`.
fn file_error(e: GuestError, path: &str) -> E2bError {
    fs_error(e, path).into()
}

/// `GET /health`: 204 while the sandbox runs, 502 when it does not.
pub async fn health(State(c): State<Arc<Control>>, headers: HeaderMap) -> E2bResult<StatusCode> {
    target(&c, &headers).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Files are read and written as root (as through LangSmith's data plane):
/// another user asked for is refused rather than silently not honoured.
fn as_root_only(user: &str) -> ConnectError {
    ConnectError::invalid(format!(
        "user {user:?}: files are read and written as root in Hearth; omit the user"
    ))
}

#[derive(Default)]
struct FilesQuery {
    path: Option<String>,
    username: Option<String>,
}

fn files_query(raw: Option<&str>) -> E2bResult<FilesQuery> {
    let mut q = FilesQuery::default();
    // A name that is not UTF-8 once decoded would reach the guest changed
    // (decoding replaces what is not): refused instead.
    for pair in raw.unwrap_or_default().split('&') {
        let value = pair.split_once('=').map_or("", |(_, v)| v);
        if std::str::from_utf8(&crate::guard::percent_decode(value.as_bytes())).is_err() {
            let key = pair.split_once('=').map_or(pair, |(k, _)| k);
            return Err(E2bError::bad_request(format!(
                "{key}: not valid UTF-8 once percent-decoded"
            )));
        }
    }
    for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        match &*k {
            "path" => q.path = Some(v.into_owned()),
            "username" if v != "root" => return Err(as_root_only(&v).into()),
            "username" => q.username = Some(v.into_owned()),
            "signature" | "signature_expiration" => {
                return Err(E2bError::bad_request(format!(
                    "{k}: signed file URLs are not served; send the access token"
                )))
            }
            other => {
                return Err(E2bError::bad_request(format!(
                    "{other}: not a query parameter of /files"
                )))
            }
        }
    }
    Ok(q)
}

/// `GET /files?path=`: the file's bytes, streamed.
pub async fn download(
    State(c): State<Arc<Control>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> E2bResult<Response> {
    let q = files_query(raw.as_deref())?;
    let t = target(&c, &headers).await?;
    let path = t.path(
        q.path
            .as_deref()
            .ok_or_else(|| E2bError::bad_request("path is missing"))?,
        q.username.as_deref(),
    )?;
    let reader = t
        .guest
        .read_file(&path, 0, None)
        .await
        .map_err(|e| file_error(e, &path))?;
    let stream = file_stream(reader);
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(axum::http::header::CONTENT_TYPE, "application/octet-stream")
        .body(axum::body::Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response()))
}

/// A file reader as a body stream (an error after the first bytes breaks
/// the body off, which the client sees as a short read).
fn file_stream(
    reader: hearth_hostapi::FileReader,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send {
    futures_util::stream::unfold(Some(reader), |state| async move {
        let mut r = state?;
        match r.next_chunk().await {
            Ok(Some(chunk)) => Some((Ok(chunk), Some(r))),
            Ok(None) => None,
            Err(e) => Some((Err(std::io::Error::other(e.to_string())), None)),
        }
    })
}

#[derive(Serialize)]
struct WriteInfo {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    path: String,
}

fn write_info(path: &str) -> WriteInfo {
    WriteInfo {
        name: path.rsplit('/').next().unwrap_or(path).to_owned(),
        kind: "file",
        path: path.to_owned(),
    }
}

/// Makes the parent directories of `path` (E2B's write does).
async fn parents(g: &GuestClient, path: &str) -> E2bResult<()> {
    if let Some((dir, _)) = path.rsplit_once('/') {
        if !dir.is_empty() {
            g.mkdir(dir, true).await.map_err(|e| file_error(e, dir))?;
        }
    }
    Ok(())
}

/// Streams `body` into the guest file `path`.
async fn write_stream<S, E>(g: &GuestClient, path: &str, mut body: S) -> E2bResult<()>
where
    S: futures_util::Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    use futures_util::StreamExt;
    parents(g, path).await?;
    let mut w = g
        .write_file(path, None)
        .await
        .map_err(|e| file_error(e, path))?;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| E2bError::bad_request(format!("upload interrupted: {e}")))?;
        w.send(chunk).await.map_err(|e| file_error(e, path))?;
    }
    w.finish().await.map_err(|e| file_error(e, path))?;
    Ok(())
}

/// `POST /files`: `multipart/form-data` (each `file` part to the query's
/// `path`, or with one part and no `path`, to its file name) or
/// `application/octet-stream` to `path`; parent directories are made.
pub async fn upload(
    State(c): State<Arc<Control>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
    request: axum::extract::Request,
) -> E2bResult<Response> {
    let q = files_query(raw.as_deref())?;
    if let Some(enc) = header(&headers, "content-encoding").filter(|e| *e != "identity") {
        return Err(E2bError::bad_request(format!(
            "Content-Encoding {enc}: compressed uploads are not served; send the bytes as they are"
        )));
    }
    if headers
        .keys()
        .any(|k| k.as_str().starts_with("x-metadata-"))
    {
        return Err(E2bError::bad_request(
            "X-Metadata-*: file metadata is not served",
        ));
    }
    let t = target(&c, &headers).await?;
    let user = q.username.as_deref();
    let ct = header(&headers, "content-type")
        .unwrap_or_default()
        .to_owned();
    let mut written = Vec::new();
    if ct.starts_with("multipart/form-data") {
        use axum::extract::FromRequest;
        let mut form = axum::extract::Multipart::from_request(request, &())
            .await
            .map_err(|e| E2bError::bad_request(format!("malformed multipart body: {e}")))?;
        while let Some(field) = form
            .next_field()
            .await
            .map_err(|e| E2bError::bad_request(format!("malformed multipart body: {e}")))?
        {
            if field.name() != Some("file") {
                continue;
            }
            let name = q
                .path
                .clone()
                .or_else(|| field.file_name().map(str::to_owned))
                .ok_or_else(|| E2bError::bad_request("path is missing"))?;
            let path = t.path(&name, user)?;
            write_stream(&t.guest, &path, Box::pin(field)).await?;
            written.push(write_info(&path));
        }
        if written.is_empty() {
            return Err(E2bError::bad_request("the form holds no `file` part"));
        }
    } else if ct.is_empty() || ct.starts_with("application/octet-stream") {
        let name = q
            .path
            .as_deref()
            .ok_or_else(|| E2bError::bad_request("path is missing"))?;
        let path = t.path(name, user)?;
        let body = request.into_body().into_data_stream();
        write_stream(&t.guest, &path, body).await?;
        written.push(write_info(&path));
    } else {
        return Err(E2bError::bad_request(format!(
            "Content-Type {ct}: send multipart/form-data or application/octet-stream"
        )));
    }
    c.touch(&t.row).await;
    Ok(axum::Json(written).into_response())
}

/// Reads a Connect call's body (at most [`MAX_RPC_BODY`]).
fn rpc_body(body: &Bytes) -> Result<(), ConnectError> {
    if body.len() > MAX_RPC_BODY {
        return Err(ConnectError::new(
            "resource_exhausted",
            format!(
                "the request holds {} bytes; at most {MAX_RPC_BODY}",
                body.len()
            ),
        ));
    }
    Ok(())
}

/// The message of a unary call in the JSON codec.
fn unary_request<T: serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<T, ConnectError> {
    connect::check_codec(headers, false)?;
    rpc_body(body)?;
    parse(body)
}

fn parse<T: serde::de::DeserializeOwned>(msg: &[u8]) -> Result<T, ConnectError> {
    serde_json::from_slice(msg).map_err(|e| ConnectError::invalid(format!("bad request: {e}")))
}

/// The user a process call runs as: `Authorization: Basic base64("user:")`.
fn basic_user(headers: &HeaderMap) -> Result<Option<String>, ConnectError> {
    let Some(v) = header(headers, "authorization") else {
        return Ok(None);
    };
    let enc = v
        .strip_prefix("Basic ")
        .ok_or_else(|| ConnectError::invalid("Authorization: only Basic names a user"))?;
    let raw = B64
        .decode(enc.trim())
        .map_err(|_| ConnectError::invalid("Authorization: not base64"))?;
    let text =
        String::from_utf8(raw).map_err(|_| ConnectError::invalid("Authorization: not UTF-8"))?;
    let user = text.split(':').next().unwrap_or_default();
    Ok((!user.is_empty()).then(|| user.to_owned()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProcessConfig {
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PtyConfig {
    size: Option<PtyDims>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PtyDims {
    rows: u32,
    cols: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StartRequest {
    process: ProcessConfig,
    pty: Option<PtyConfig>,
    tag: Option<String>,
    stdin: Option<bool>,
}

/// `POST /process.Process/{method}`.
pub async fn process(
    State(c): State<Arc<Control>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match method.as_str() {
        "Start" => match start(&c, &headers, &body).await {
            Ok(r) => r,
            Err(e) => connect::stream_error(e),
        },
        "SendSignal" => match send_signal(&c, &headers, &body).await {
            Ok(r) => r,
            Err(e) => e.into_response(),
        },
        "SendInput" => match send_input(&c, &headers, &body).await {
            Ok(r) => r,
            Err(e) => e.into_response(),
        },
        "CloseStdin" => match close_stdin(&c, &headers, &body).await {
            Ok(r) => r,
            Err(e) => e.into_response(),
        },
        "List" => match list(&c, &headers, &body).await {
            Ok(r) => r,
            Err(e) => e.into_response(),
        },
        "Update" => match update(&c, &headers, &body).await {
            Ok(r) => r,
            Err(e) => e.into_response(),
        },
        "Connect" => match connect_process(&c, &headers, &body).await {
            Ok(r) => r,
            Err(e) => connect::stream_error(e),
        },
        other => ConnectError::unimplemented(format!(
            "process.Process/{other} is not served by Hearth yet"
        ))
        .into_response(),
    }
}

/// The exec of a `Start`: the SDK's `/bin/bash -l -c CMD` as a shell
/// command (the guest falls back to `/bin/sh` without bash), anything else
/// as its argv.
fn exec_of(t: &Target, req: StartRequest, user: Option<String>, timeout: Duration) -> ExecRequest {
    let p = req.process;
    let shell_cmd = match (p.cmd.as_str(), p.args.as_slice()) {
        ("/bin/bash" | "bash", [l, c, cmd]) if l == "-l" && c == "-c" => Some(cmd.clone()),
        ("/bin/bash" | "bash", [c, cmd]) if c == "-c" => Some(cmd.clone()),
        // The SDK's `pty.create`: an interactive login shell, bash when
        // the image has it.
        ("/bin/bash" | "bash", [i, l]) if i == "-i" && l == "-l" => Some(
            "if [ -x /bin/bash ]; then exec /bin/bash -i -l; else exec /bin/sh -i -l; fi".into(),
        ),
        _ => None,
    };
    let mut env = t.env.clone();
    env.extend(p.envs);
    let (command, argv, shell) = match shell_cmd {
        Some(cmd) => (cmd, None, Some("/bin/bash".to_owned())),
        None => (String::new(), Some([vec![p.cmd], p.args].concat()), None),
    };
    let user = user.or_else(|| t.user.clone());
    let cwd = p
        .cwd
        .map(|d| t.path(&d, user.as_deref()).unwrap_or(d))
        .or_else(|| t.work_dir.clone());
    ExecRequest {
        command,
        argv,
        shell,
        env,
        cwd,
        user,
        timeout_ms: timeout.as_millis() as u64,
        // A process outlives the stream that started it (a background
        // command's handle may be dropped), as envd's do.
        idle_timeout_ms: -1,
        ttl_ms: 60_000,
        kill_on_disconnect: false,
        pty: req.pty.map(|p| {
            let s = p.size.unwrap_or(PtyDims { rows: 24, cols: 80 });
            PtySize {
                rows: s.rows.clamp(1, 1000) as u16,
                cols: s.cols.clamp(1, 1000) as u16,
            }
        }),
        command_id: None,
    }
}

/// `Connect-Timeout-Ms`: the command's deadline (the SDK sends its
/// `timeout`, 60 s by default); none = no deadline.
fn connect_timeout(headers: &HeaderMap) -> Result<Duration, ConnectError> {
    match header(headers, "connect-timeout-ms") {
        None => Ok(Duration::ZERO),
        Some(v) => v.parse::<u64>().map(Duration::from_millis).map_err(|_| {
            ConnectError::invalid(format!("Connect-Timeout-Ms: {v:?} is not a number"))
        }),
    }
}

/// `Keepalive-Ping-Interval` (seconds): how often an idle stream sends a
/// keepalive event; at least 1 s, 50 s when not asked.
fn keepalive(headers: &HeaderMap) -> Duration {
    header(headers, "keepalive-ping-interval")
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(Duration::from_secs(50), |s| {
            Duration::from_secs(s.clamp(1, 3600))
        })
}

fn signal_name(sig: i32) -> String {
    match sig {
        9 => "killed".into(),
        15 => "terminated".into(),
        2 => "interrupt".into(),
        1 => "hangup".into(),
        n => format!("signal {n}"),
    }
}

async fn start(
    c: &Arc<Control>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ConnectError> {
    connect::check_codec(headers, true)?;
    rpc_body(body)?;
    let req: StartRequest = parse(connect::single_message(body)?)?;
    let keep_stdin = req.stdin == Some(true);
    if req.tag.as_deref().is_some_and(|t| !t.is_empty()) {
        return Err(ConnectError::unimplemented(
            "tag: connecting to a process by tag is not served by Hearth yet",
        ));
    }
    let user = basic_user(headers)?;
    let timeout = connect_timeout(headers)?;
    let every = keepalive(headers);
    let t = target(c, headers).await?;
    let pty = req.pty.is_some();
    let exec = exec_of(&t, req, user, timeout);
    let h = t
        .guest
        .exec(exec)
        .await
        .map_err(|e| ConnectError::internal(format!("cannot start the process: {e}")))?;
    // Without `stdin: true` the process's stdin is not the client's:
    // closed at once. A terminal's input always is (`pty.send_stdin`);
    // closing it would type an end-of-file into the shell.
    if !keep_stdin && !pty {
        if let Err(e) = h.control.close_stdin().await {
            tracing::debug!(sandbox = %t.row.id, error = %e, "cannot close a started process's stdin");
        }
    }
    Ok(stream_process(t.row.id, h, pty, every))
}

/// A process's events as a Connect-RPC server stream (`Start`, `Connect`):
/// its start, its output (`pty` data for a terminal), keepalives at
/// `every` while it is quiet, then its end or the error that ended the
/// stream. The process outlives a client that goes away.
fn stream_process(sandbox: SandboxId, mut h: ExecHandle, pty: bool, every: Duration) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.reset();
        let end = loop {
            let update = tokio::select! {
                u = h.next() => u,
                _ = tick.tick() => {
                    if tx.send(connect::message(&json!({"event": {"keepalive": {}}}))).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            let msg = match update {
                Ok(Some(ExecUpdate::Started { pid, .. })) => {
                    json!({"event": {"start": {"pid": pid}}})
                }
                Ok(Some(ExecUpdate::Output { channel, data, .. })) => {
                    let key = match (pty, channel) {
                        (true, _) => "pty",
                        (false, OutputChannel::Stdout) => "stdout",
                        (false, OutputChannel::Stderr) => "stderr",
                    };
                    json!({"event": {"data": {key: B64.encode(&data)}}})
                }
                Ok(Some(ExecUpdate::Exit { exit_code, signal })) => {
                    let status = match signal {
                        Some(s) => format!("signal: {}", signal_name(s)),
                        None => format!("exit status {exit_code}"),
                    };
                    let ev = json!({"event": {"end": {
                        "exitCode": exit_code,
                        "exited": signal.is_none(),
                        "status": status,
                    }}});
                    if tx.send(connect::message(&ev)).await.is_err() {
                        return;
                    }
                    break None;
                }
                Ok(Some(ExecUpdate::Error {
                    error_type,
                    message,
                })) => {
                    break Some(match error_type {
                        ExecErrorType::CommandTimeout => {
                            ConnectError::new("deadline_exceeded", message)
                        }
                        ExecErrorType::BadRequest => ConnectError::invalid(message),
                        ExecErrorType::CommandNotFound => ConnectError::not_found(message),
                        _ => ConnectError::internal(message),
                    })
                }
                Ok(None) => {
                    break Some(ConnectError::internal(
                        "the process's stream ended without its exit",
                    ))
                }
                Err(e) => {
                    break Some(ConnectError::new(
                        "unavailable",
                        format!("the sandbox's guest went away: {e}"),
                    ))
                }
            };
            tick.reset();
            if tx.send(connect::message(&msg)).await.is_err() {
                // The client went away; the process runs on.
                tracing::debug!(sandbox = %sandbox, "an E2B process stream's client went away");
                return;
            }
        };
        if tx.send(connect::end_stream(end.as_ref())).await.is_err() {
            tracing::debug!(sandbox = %sandbox, "an E2B process stream ended with nobody reading");
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx))
    });
    connect::stream_response(axum::body::Body::from_stream(stream))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProcessSelector {
    pid: Option<u32>,
    tag: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SendSignalRequest {
    process: ProcessSelector,
    signal: String,
}

/// `Process/SendSignal`: the signal to the process's group (each started
/// process leads its own), sent by `kill` in the guest; `not_found` when
/// no such process runs.
async fn send_signal(
    c: &Arc<Control>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ConnectError> {
    let req: SendSignalRequest = unary_request(headers, body)?;
    let pid = req.process.pid()?;
    let sig = match req.signal.as_str() {
        "SIGNAL_SIGKILL" => "KILL",
        "SIGNAL_SIGTERM" => "TERM",
        other => {
            return Err(ConnectError::invalid(format!(
                "signal: unknown signal {other:?}"
            )))
        }
    };
    let t = target(c, headers).await?;
    let out = t
        .guest
        // The shell's own `kill` (busybox's takes no `--`, and its exit
        // status after one is not the signal's): no such process is exit
        // 3, the group first, else the process alone.
        .run(helper(
            vec![
                "/bin/sh".into(),
                "-c".into(),
                format!(
                    "kill -0 {pid} 2>/dev/null || exit 3; kill -s {sig} -{pid} 2>/dev/null || kill -s {sig} {pid}"
                ),
            ],
            10,
        ))
        .await
        .map_err(|e| ConnectError::internal(format!("cannot signal process {pid}: {e}")))?;
    match out.exit_code {
        Some(0) => Ok(connect::unary(&json!({}))),
        Some(3) => Err(ConnectError::not_found(format!("process {pid} not found"))),
        code => Err(ConnectError::internal(format!(
            "signal process {pid}: exit {code:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
    }
}

impl ProcessSelector {
    /// The pid it names (a tag is refused: not served).
    fn pid(&self) -> Result<u32, ConnectError> {
        if self.tag.is_some() {
            return Err(ConnectError::unimplemented(
                "process.tag: selecting a process by tag is not served by Hearth yet",
            ));
        }
        self.pid
            .filter(|p| *p > 1)
            .ok_or_else(|| ConnectError::invalid("process.pid: a process id above 1 is required"))
    }
}

/// A guest's answer about the process `pid`: `not_found` when none such
/// runs.
fn process_error(e: GuestError, pid: u32, what: &str) -> ConnectError {
    match e.op_kind() {
        Some(OpErrorKind::NotFound) => ConnectError::not_found(format!("process {pid} not found")),
        Some(OpErrorKind::BadRequest) => ConnectError::new("failed_precondition", e.to_string()),
        _ => ConnectError::internal(format!("{what} of process {pid}: {e}")),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProcessInput {
    stdin: Option<String>,
    pty: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SendInputRequest {
    process: ProcessSelector,
    input: ProcessInput,
}

/// Most bytes one `SendInput` carries (E2B's SDK sends what the caller
/// gives it; the guest's pipe takes it as fast as the process reads).
const MAX_INPUT: usize = 4 << 20;

/// `Process/SendInput`: bytes to a running process's stdin (or its PTY),
/// without taking its output stream over.
async fn send_input(
    c: &Arc<Control>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ConnectError> {
    let req: SendInputRequest = unary_request(headers, body)?;
    let pid = req.process.pid()?;
    let text = match (req.input.stdin, req.input.pty) {
        (Some(s), None) | (None, Some(s)) => s,
        _ => {
            return Err(ConnectError::invalid(
                "input: exactly one of stdin and pty is required",
            ))
        }
    };
    let data = B64
        .decode(text.as_bytes())
        .map_err(|e| ConnectError::invalid(format!("input: not base64: {e}")))?;
    if data.len() > MAX_INPUT {
        return Err(ConnectError::invalid(format!(
            "input: {} bytes, at most {MAX_INPUT} per call",
            data.len()
        )));
    }
    let t = target(c, headers).await?;
    t.guest
        .send_stdin(pid, Bytes::from(data), false)
        .await
        .map_err(|e| process_error(e, pid, "write to the stdin"))?;
    Ok(connect::unary(&json!({})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConnectRequest {
    process: ProcessSelector,
}

/// `Process/Connect` (the SDK's `commands.connect(pid)`): a running
/// process's events from now on, beside the stream that started it (the
/// guest's `Follow`: nothing is taken from that stream).
async fn connect_process(
    c: &Arc<Control>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ConnectError> {
    connect::check_codec(headers, true)?;
    rpc_body(body)?;
    let req: ConnectRequest = parse(connect::single_message(body)?)?;
    let pid = req.process.pid()?;
    let every = keepalive(headers);
    let t = target(c, headers).await?;
    // Whether its output is a terminal's, as envd labels it.
    let pty = t
        .guest
        .commands()
        .await
        .map_err(|e| ConnectError::internal(format!("cannot list the processes: {e}")))?
        .iter()
        .find(|p| p.pid == pid)
        .map(|p| p.pty)
        .ok_or_else(|| ConnectError::not_found(format!("process {pid} not found")))?;
    let h = t
        .guest
        .follow(pid)
        .await
        .map_err(|e| process_error(e, pid, "follow the output"))?;
    Ok(stream_process(t.row.id, h, pty, every))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateRequest {
    process: ProcessSelector,
    pty: Option<PtyConfig>,
}

/// `Process/Update`: a running process's terminal size (the SDK's
/// `pty.resize`).
async fn update(
    c: &Arc<Control>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ConnectError> {
    let req: UpdateRequest = unary_request(headers, body)?;
    let pid = req.process.pid()?;
    let size = req
        .pty
        .and_then(|p| p.size)
        .ok_or_else(|| ConnectError::invalid("pty.size: the new terminal size is required"))?;
    let t = target(c, headers).await?;
    t.guest
        .resize_pty(
            pid,
            size.rows.clamp(1, 1000) as u16,
            size.cols.clamp(1, 1000) as u16,
        )
        .await
        .map_err(|e| match e.op_kind() {
            Some(OpErrorKind::Unsupported) => ConnectError::new(
                "failed_precondition",
                format!("process {pid} has no terminal"),
            ),
            _ => process_error(e, pid, "resize the terminal"),
        })?;
    Ok(connect::unary(&json!({})))
}

/// One message of a `StreamInput` stream.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamInputRequest {
    start: Option<StreamInputStart>,
    data: Option<StreamInputData>,
    keepalive: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamInputStart {
    process: ProcessSelector,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamInputData {
    input: ProcessInput,
}

/// `Process/StreamInput` (the SDK's `commands.stream_input` and
/// `pty.stream_input`): a client stream of input to a running process,
/// each chunk handed to it as it arrives (in order), answered once the
/// client ends the stream. Its own route, so its body is read as it comes.
pub async fn stream_input(
    State(c): State<Arc<Control>>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    match stream_input_to(&c, &headers, body).await {
        Ok(()) => connect::stream_response(axum::body::Body::from(
            [connect::message(&json!({})), connect::end_stream(None)].concat(),
        )),
        Err(e) => connect::stream_error(e),
    }
}

async fn stream_input_to(
    c: &Arc<Control>,
    headers: &HeaderMap,
    body: axum::body::Body,
) -> Result<(), ConnectError> {
    connect::check_codec(headers, true)?;
    // The token is checked before a byte of the body is read.
    let t = target(c, headers).await?;
    // A message is at most one chunk of input, base64, in JSON.
    let mut messages = connect::EnvelopeReader::new(body, MAX_INPUT / 3 * 4 + 1024);
    let mut pid = None;
    while let Some(msg) = messages.next().await? {
        let m: StreamInputRequest = parse(&msg)?;
        match (m.start, m.data, m.keepalive) {
            (Some(s), None, None) if pid.is_none() => pid = Some(s.process.pid()?),
            (Some(_), None, None) => {
                return Err(ConnectError::invalid("start: the stream starts once"))
            }
            (None, Some(d), None) => {
                let pid = pid.ok_or_else(|| {
                    ConnectError::invalid("data: the stream must start with the process")
                })?;
                let text = match (d.input.stdin, d.input.pty) {
                    (Some(s), None) | (None, Some(s)) => s,
                    _ => {
                        return Err(ConnectError::invalid(
                            "data.input: exactly one of stdin and pty is required",
                        ))
                    }
                };
                let data = B64
                    .decode(text.as_bytes())
                    .map_err(|e| ConnectError::invalid(format!("data.input: not base64: {e}")))?;
                t.guest
                    .send_stdin(pid, Bytes::from(data), false)
                    .await
                    .map_err(|e| process_error(e, pid, "write to the stdin"))?;
            }
            (None, None, Some(_)) => {}
            _ => {
                return Err(ConnectError::invalid(
                    "a message is exactly one of start, data and keepalive",
                ))
            }
        }
    }
    pid.map(drop)
        .ok_or_else(|| ConnectError::invalid("start: the stream named no process"))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CloseStdinRequest {
    process: ProcessSelector,
}

/// `Process/CloseStdin`: end of input for a running process.
async fn close_stdin(
    c: &Arc<Control>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ConnectError> {
    let req: CloseStdinRequest = unary_request(headers, body)?;
    let pid = req.process.pid()?;
    let t = target(c, headers).await?;
    t.guest
        .send_stdin(pid, Bytes::new(), true)
        .await
        .map_err(|e| process_error(e, pid, "close the stdin"))?;
    Ok(connect::unary(&json!({})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListRequest {}

/// `Process/List`: the processes running now, as they were started (a
/// shell command as envd's `/bin/bash -l -c CMD`).
async fn list(
    c: &Arc<Control>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ConnectError> {
    let _: ListRequest = unary_request(headers, body)?;
    let t = target(c, headers).await?;
    let commands = t
        .guest
        .commands()
        .await
        .map_err(|e| ConnectError::internal(format!("list the processes: {e}")))?;
    let processes: Vec<serde_json::Value> = commands
        .into_iter()
        .map(|p| {
            let (cmd, args) = match p.argv {
                Some(argv) if !argv.is_empty() => (argv[0].clone(), argv[1..].to_vec()),
                _ => (
                    "/bin/bash".to_owned(),
                    vec!["-l".into(), "-c".into(), p.command],
                ),
            };
            let mut config = json!({"cmd": cmd, "args": args, "envs": p.env});
            if let Some(cwd) = p.cwd {
                config["cwd"] = json!(cwd);
            }
            json!({"config": config, "pid": p.pid})
        })
        .collect();
    Ok(connect::unary(&json!({ "processes": processes })))
}

/// A command Hearth runs in the guest for a call (as root, ended with
/// the call, forgotten once done, at most `secs` long).
fn helper(argv: Vec<String>, secs: u64) -> ExecRequest {
    ExecRequest {
        argv: Some(argv),
        timeout_ms: secs * 1000,
        kill_on_disconnect: true,
        ttl_ms: 0,
        ..ExecRequest::default()
    }
}

/// E2B's `EntryInfo` of a guest file.
fn entry(s: &FileStat) -> serde_json::Value {
    let kind = match s.kind {
        FileKind::Dir => "FILE_TYPE_DIRECTORY",
        FileKind::File => "FILE_TYPE_FILE",
        _ => "FILE_TYPE_UNSPECIFIED",
    };
    json!({
        "name": s.name,
        "type": kind,
        "path": s.path,
        "size": s.size.to_string(),
        "mode": s.mode & 0o7777,
        "permissions": permissions(s),
        "modifiedTime": hearth_db::Timestamp::from_unix_ms(s.mtime.saturating_mul(1000)).to_rfc3339(),
    })
}

/// `ls -l`'s mode string.
fn permissions(s: &FileStat) -> String {
    let t = match s.kind {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        _ => '-',
    };
    let mut out = String::with_capacity(10);
    out.push(t);
    for shift in [6, 3, 0] {
        let bits = (s.mode >> shift) & 7;
        out.push(if bits & 4 != 0 { 'r' } else { '-' });
        out.push(if bits & 2 != 0 { 'w' } else { '-' });
        out.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    out
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PathRequest {
    path: String,
    #[serde(default)]
    depth: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CreateWatcherRequest {
    path: String,
    recursive: Option<bool>,
    include_entry: Option<bool>,
    allow_network_mounts: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct WatcherRequest {
    watcher_id: String,
}

/// How often a streamed watch asks the guest for what it saw.
const WATCH_POLL: Duration = Duration::from_millis(200);

/// A `CreateWatcher` or `WatchDir` request's refusals, and its path as the
/// guest names it.
fn watched_path(
    t: &Target,
    req: &CreateWatcherRequest,
    user: Option<&str>,
) -> Result<String, ConnectError> {
    if req.include_entry == Some(true) {
        return Err(ConnectError::unimplemented(
            "includeEntry: entries in watch events are not served by Hearth yet",
        ));
    }
    if req.allow_network_mounts == Some(true) {
        return Err(ConnectError::unimplemented(
            "allowNetworkMounts: Hearth's sandboxes have no network mounts to watch",
        ));
    }
    Ok(t.path(&req.path, user)?)
}

/// `Filesystem/WatchDir` (the JS SDK's `files.watchDir`): the changes
/// under a directory as a server stream (start, each change, keepalives:
/// `WatchDirResponse`'s oneof, so at the top of each message),
/// over a guest watcher asked every [`WATCH_POLL`] and stopped when the
/// client goes away.
async fn watch_dir(
    c: &Arc<Control>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ConnectError> {
    connect::check_codec(headers, true)?;
    rpc_body(body)?;
    let req: CreateWatcherRequest = parse(connect::single_message(body)?)?;
    let user = basic_user(headers)?;
    if let Some(u) = user.as_deref().filter(|u| *u != "root") {
        return Err(as_root_only(u));
    }
    let every = keepalive(headers);
    let t = target(c, headers).await?;
    let path = watched_path(&t, &req, user.as_deref())?;
    let guest = t.guest.clone();
    let id = guest
        .watch_start(&path, req.recursive.unwrap_or(false))
        .await
        .map_err(|e| fs_error(e, &path))?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let sandbox = t.row.id;
    tokio::spawn(async move {
        let ended = async {
            if tx.send(connect::message(&json!({"start": {}}))).await.is_err() {
                return None;
            }
            let mut quiet = Duration::ZERO;
            loop {
                tokio::time::sleep(WATCH_POLL).await;
                let events = match guest.watch_events(&id).await {
                    Ok((events, lost)) => {
                        if lost {
                            tracing::warn!(sandbox = %sandbox, "a streamed watcher's guest dropped events");
                        }
                        events
                    }
                    Err(e) => {
                        return Some(ConnectError::new(
                            "unavailable",
                            format!("the watch of {path} ended: {e}"),
                        ))
                    }
                };
                quiet = if events.is_empty() { quiet + WATCH_POLL } else { Duration::ZERO };
                for e in &events {
                    let m = json!({"filesystem": {"name": e.name, "type": event_type(e.kind)}});
                    if tx.send(connect::message(&m)).await.is_err() {
                        return None;
                    }
                }
                if quiet >= every {
                    quiet = Duration::ZERO;
                    if tx.send(connect::message(&json!({"keepalive": {}}))).await.is_err() {
                        return None;
                    }
                }
            }
        }
        .await;
        if let Some(e) = &ended {
            if tx.send(connect::end_stream(Some(e))).await.is_err() {
                tracing::debug!(sandbox = %sandbox, "a watch stream ended with nobody reading");
            }
        }
        if let Err(e) = guest.watch_stop(&id).await {
            tracing::debug!(sandbox = %sandbox, error = %e, "cannot stop a streamed watcher; the guest drops it when unasked");
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx))
    });
    Ok(connect::stream_response(axum::body::Body::from_stream(
        stream,
    )))
}

/// envd's `EventType` of a guest watch event.
fn event_type(k: hearth_guest_proto::WatchKind) -> &'static str {
    use hearth_guest_proto::WatchKind as K;
    match k {
        K::Create => "EVENT_TYPE_CREATE",
        K::Write => "EVENT_TYPE_WRITE",
        K::Remove => "EVENT_TYPE_REMOVE",
        K::Rename => "EVENT_TYPE_RENAME",
        K::Chmod => "EVENT_TYPE_CHMOD",
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MoveRequest {
    source: String,
    destination: String,
}

/// `POST /filesystem.Filesystem/{method}`.
pub async fn filesystem(
    State(c): State<Arc<Control>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let answer = async {
        if method == "WatchDir" {
            return Ok(match watch_dir(&c, &headers, &body).await {
                Ok(r) => r,
                Err(e) => connect::stream_error(e),
            });
        }
        connect::check_codec(&headers, false)?;
        rpc_body(&body)?;
        let user = basic_user(&headers)?;
        if let Some(u) = user.as_deref().filter(|u| *u != "root") {
            return Err(as_root_only(u));
        }
        let user = user.as_deref();
        match method.as_str() {
            "Stat" | "ListDir" | "MakeDir" | "Remove" => {
                let req: PathRequest = parse(&body)?;
                let t = target(&c, &headers).await?;
                let path = t.path(&req.path, user)?;
                let g = &t.guest;
                match method.as_str() {
                    "Stat" => {
                        let s = g.stat(&path).await.map_err(|e| fs_error(e, &path))?;
                        Ok(connect::unary(&json!({"entry": entry(&s)})))
                    }
                    "ListDir" => {
                        let depth = req.depth.unwrap_or(1).clamp(1, MAX_LIST_DEPTH);
                        let entries = list_dir(g, &path, depth).await?;
                        Ok(connect::unary(&json!({"entries": entries})))
                    }
                    "MakeDir" => {
                        if g.stat(&path).await.is_ok() {
                            return Err(ConnectError::new(
                                "already_exists",
                                format!("{path} already exists"),
                            ));
                        }
                        g.mkdir(&path, true).await.map_err(|e| fs_error(e, &path))?;
                        let s = g.stat(&path).await.map_err(|e| fs_error(e, &path))?;
                        Ok(connect::unary(&json!({"entry": entry(&s)})))
                    }
                    _ => {
                        g.remove(&path, true)
                            .await
                            .map_err(|e| fs_error(e, &path))?;
                        Ok(connect::unary(&json!({})))
                    }
                }
            }
            "Move" => {
                let req: MoveRequest = parse(&body)?;
                let t = target(&c, &headers).await?;
                let (from, to) = (t.path(&req.source, user)?, t.path(&req.destination, user)?);
                t.guest.stat(&from).await.map_err(|e| fs_error(e, &from))?;
                let out = t
                    .guest
                    .run(helper(
                        vec![
                            "mv".into(),
                            "-f".into(),
                            "--".into(),
                            from.clone(),
                            to.clone(),
                        ],
                        60,
                    ))
                    .await
                    .map_err(|e| ConnectError::internal(format!("move {from}: {e}")))?;
                if out.exit_code != Some(0) {
                    return Err(ConnectError::invalid(format!(
                        "move {from} to {to}: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    )));
                }
                let s = t.guest.stat(&to).await.map_err(|e| fs_error(e, &to))?;
                Ok(connect::unary(&json!({"entry": entry(&s)})))
            }
            "CreateWatcher" => {
                let req: CreateWatcherRequest = parse(&body)?;
                let t = target(&c, &headers).await?;
                let path = watched_path(&t, &req, user)?;
                let id = t
                    .guest
                    .watch_start(&path, req.recursive.unwrap_or(false))
                    .await
                    .map_err(|e| fs_error(e, &path))?;
                Ok(connect::unary(&json!({ "watcherId": id })))
            }
            "GetWatcherEvents" | "RemoveWatcher" => {
                let req: WatcherRequest = parse(&body)?;
                let t = target(&c, &headers).await?;
                let g = &t.guest;
                let not_found = |e: GuestError| match e.op_kind() {
                    Some(hearth_guest_proto::OpErrorKind::NotFound) => {
                        ConnectError::not_found(format!("watcher {} not found", req.watcher_id))
                    }
                    _ => ConnectError::internal(format!("watcher {}: {e}", req.watcher_id)),
                };
                if method == "RemoveWatcher" {
                    g.watch_stop(&req.watcher_id).await.map_err(not_found)?;
                    return Ok(connect::unary(&json!({})));
                }
                let (events, lost) = g.watch_events(&req.watcher_id).await.map_err(not_found)?;
                if lost {
                    tracing::warn!(sandbox = %t.row.id, watcher = %req.watcher_id, "a watcher's guest dropped events nobody asked for in time");
                }
                let events: Vec<_> = events
                    .iter()
                    .map(|e| json!({"name": e.name, "type": event_type(e.kind)}))
                    .collect();
                Ok(connect::unary(&json!({ "events": events })))
            }
            other => Err(ConnectError::unimplemented(format!(
                "filesystem.Filesystem/{other} is not served by Hearth yet"
            ))),
        }
    };
    match answer.await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// The entries under `dir`, `depth` levels down (breadth first), at most
/// [`MAX_LIST_ENTRIES`].
async fn list_dir(
    g: &GuestClient,
    dir: &str,
    depth: u32,
) -> Result<Vec<serde_json::Value>, ConnectError> {
    let top = g.stat(dir).await.map_err(|e| fs_error(e, dir))?;
    if top.kind != FileKind::Dir {
        return Err(ConnectError::invalid(format!("{dir} is not a directory")));
    }
    let mut out = Vec::new();
    let mut level = vec![dir.to_owned()];
    for _ in 0..depth {
        let mut next = Vec::new();
        for d in level {
            let entries = match g.list(&d).await {
                Ok(e) => e,
                // A directory that went away or cannot be read below the
                // top is left out, as `find` would go on.
                Err(e) if d != dir => {
                    tracing::debug!(dir = %d, error = %e, "ListDir: skipping a directory");
                    continue;
                }
                Err(e) => return Err(fs_error(e, &d)),
            };
            for s in entries {
                if out.len() >= MAX_LIST_ENTRIES {
                    return Err(ConnectError::new(
                        "resource_exhausted",
                        format!(
                            "{dir} holds more than {MAX_LIST_ENTRIES} entries at depth {depth}"
                        ),
                    ));
                }
                if s.kind == FileKind::Dir {
                    next.push(s.path.clone());
                }
                out.push(entry(&s));
            }
        }
        level = next;
    }
    Ok(out)
}
