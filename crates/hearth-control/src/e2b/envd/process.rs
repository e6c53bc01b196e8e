//! envd's `process.Process` service: start, stream, signal, input,
//! connect, update, list.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use hearth_guest_proto::{ExecErrorType, ExecRequest, OpErrorKind, OutputChannel, PtySize};
use hearth_hostapi::{ExecHandle, ExecUpdate, GuestError};
use hearth_types::SandboxId;
use serde::Deserialize;
use serde_json::json;

use super::super::connect::{self, ConnectError};
use super::*;
use crate::Control;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ProcessConfig {
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PtyConfig {
    size: Option<PtyDims>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PtyDims {
    rows: u32,
    cols: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StartRequest {
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
pub(super) fn exec_of(
    t: &Target,
    req: StartRequest,
    user: Option<String>,
    timeout: Duration,
) -> ExecRequest {
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
pub(super) fn connect_timeout(headers: &HeaderMap) -> Result<Duration, ConnectError> {
    match header(headers, "connect-timeout-ms") {
        None => Ok(Duration::ZERO),
        Some(v) => v.parse::<u64>().map(Duration::from_millis).map_err(|_| {
            ConnectError::invalid(format!("Connect-Timeout-Ms: {v:?} is not a number"))
        }),
    }
}

/// `Keepalive-Ping-Interval` (seconds): how often an idle stream sends a
/// keepalive event; at least 1 s, 50 s when not asked.
pub(super) fn keepalive(headers: &HeaderMap) -> Duration {
    header(headers, "keepalive-ping-interval")
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(Duration::from_secs(50), |s| {
            Duration::from_secs(s.clamp(1, 3600))
        })
}

pub(super) fn signal_name(sig: i32) -> String {
    match sig {
        9 => "killed".into(),
        15 => "terminated".into(),
        2 => "interrupt".into(),
        1 => "hangup".into(),
        n => format!("signal {n}"),
    }
}

pub(super) async fn start(
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
pub(super) fn stream_process(
    sandbox: SandboxId,
    mut h: ExecHandle,
    pty: bool,
    every: Duration,
) -> Response {
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
pub(super) struct ProcessSelector {
    pid: Option<u32>,
    tag: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SendSignalRequest {
    process: ProcessSelector,
    signal: String,
}

/// `Process/SendSignal`: the signal to the process's group (each started
/// process leads its own), sent by `kill` in the guest; `not_found` when
/// no such process runs.
pub(super) async fn send_signal(
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
pub(super) fn process_error(e: GuestError, pid: u32, what: &str) -> ConnectError {
    match e.op_kind() {
        Some(OpErrorKind::NotFound) => ConnectError::not_found(format!("process {pid} not found")),
        Some(OpErrorKind::BadRequest) => ConnectError::new("failed_precondition", e.to_string()),
        _ => ConnectError::internal(format!("{what} of process {pid}: {e}")),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ProcessInput {
    stdin: Option<String>,
    pty: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SendInputRequest {
    process: ProcessSelector,
    input: ProcessInput,
}

/// Most bytes one `SendInput` carries (E2B's SDK sends what the caller
/// gives it; the guest's pipe takes it as fast as the process reads).
pub(super) const MAX_INPUT: usize = 4 << 20;

/// `Process/SendInput`: bytes to a running process's stdin (or its PTY),
/// without taking its output stream over.
pub(super) async fn send_input(
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
pub(super) struct ConnectRequest {
    process: ProcessSelector,
}

/// `Process/Connect` (the SDK's `commands.connect(pid)`): a running
/// process's events from now on, beside the stream that started it (the
/// guest's `Follow`: nothing is taken from that stream).
pub(super) async fn connect_process(
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
pub(super) struct UpdateRequest {
    process: ProcessSelector,
    pty: Option<PtyConfig>,
}

/// `Process/Update`: a running process's terminal size (the SDK's
/// `pty.resize`).
pub(super) async fn update(
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
pub(super) struct StreamInputRequest {
    start: Option<StreamInputStart>,
    data: Option<StreamInputData>,
    keepalive: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StreamInputStart {
    process: ProcessSelector,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StreamInputData {
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

pub(super) async fn stream_input_to(
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
pub(super) struct CloseStdinRequest {
    process: ProcessSelector,
}

/// `Process/CloseStdin`: end of input for a running process.
pub(super) async fn close_stdin(
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
pub(super) struct ListRequest {}

/// `Process/List`: the processes running now, as they were started (a
/// shell command as envd's `/bin/bash -l -c CMD`).
pub(super) async fn list(
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
