//! Commands: LangSmith's exec WebSocket protocol, and a blocking HTTP exec.
//!
//! WebSocket (`GET /v1/vms/{id}/exec/ws`), client → server:
//!
//! ```text
//! {"type":"execute","command":"…","timeout_seconds"?,"shell"?,"env"?,"cwd"?,"user"?,
//!  "idle_timeout_seconds"?,"kill_on_disconnect"?,"ttl_seconds"?,"command_id"?,"pty"?}
//! {"type":"reconnect","command_id":"…","stdout_offset":n,"stderr_offset":n}
//! then {"type":"input","data":"…"} | {"type":"kill"} | {"type":"resize","rows","cols"}
//!      | {"type":"close_stdin"}
//! ```
//!
//! server → client: `started`, `stdout`/`stderr` (`data` text, `offset` in
//! bytes of the stream), then `exit` or `error`, then a normal close.
//!
//! Output is decoded per channel with [`Utf8Stream`]: a character split
//! across chunks is held back until complete, invalid bytes become U+FFFD,
//! and `offset` is always the byte offset (as the guest counts) of the first
//! byte behind `data`. For valid UTF-8 output, `offset + len(utf8(data))` is
//! therefore exactly the offset to reconnect from.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::ws::{close_code, CloseFrame, Message, WebSocket};
use bytes::Bytes;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use hearth_guest_proto::{ExecErrorType, ExecRequest, OutputChannel, PtySize};
use hearth_types::VmId;
use serde::{Deserialize, Serialize};

use hearth_hostapi::guest::{ExecControl, ExecEvents, ExecHandle, ExecUpdate, GuestClient};

/// How long a new exec WebSocket may take to send its first frame.
const FIRST_FRAME_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a closing WebSocket waits for the client's close frame.
const CLOSE_WAIT: Duration = Duration::from_secs(5);
/// How long a last flush of a WebSocket may take.
const FLUSH_WAIT: Duration = Duration::from_secs(1);
/// LangSmith's defaults, in milliseconds.
const DEFAULT_TIMEOUT_MS: u64 = 60_000;
const DEFAULT_IDLE_TIMEOUT_MS: i64 = 300_000;
const DEFAULT_TTL_MS: i64 = 600_000;
/// Terminal size of `"pty": true`.
const DEFAULT_PTY: PtySize = PtySize { rows: 24, cols: 80 };

// ---------------------------------------------------------------------------
// Client frames

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum FirstFrame {
    Execute(Box<Execute>),
    Reconnect {
        command_id: String,
        #[serde(default)]
        stdout_offset: u64,
        #[serde(default)]
        stderr_offset: u64,
    },
}

/// `{"type":"execute",…}`; unknown fields are ignored, `null` means absent.
/// Also the body of the SSE transport's `start` (see [`super::sse`]).
#[derive(Deserialize)]
pub(super) struct Execute {
    command: String,
    timeout_seconds: Option<f64>,
    shell: Option<String>,
    env: Option<BTreeMap<String, String>>,
    cwd: Option<String>,
    user: Option<String>,
    idle_timeout_seconds: Option<f64>,
    kill_on_disconnect: Option<bool>,
    ttl_seconds: Option<f64>,
    command_id: Option<String>,
    pty: Option<bool>,
    /// The SDK closes stdin at spawn unless it wants to write to it.
    close_stdin: Option<bool>,
    /// Per-command override of the sandbox's run config.
    run_config: Option<RunConfig>,
}

/// The user, working directory and base environment commands run with
/// (LangSmith's `run_config`). The frame's own `env`, `cwd` and `user` win.
#[derive(Clone, Debug, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
pub struct RunConfig {
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub work_dir: Option<String>,
    #[serde(default)]
    pub env_vars: Option<BTreeMap<String, String>>,
}

impl RunConfig {
    /// `over` replaces user and work_dir and merges env_vars on top.
    pub fn merged(&self, over: Option<&RunConfig>) -> RunConfig {
        let Some(over) = over else {
            return self.clone();
        };
        let mut env = self.env_vars.clone().unwrap_or_default();
        env.extend(over.env_vars.clone().unwrap_or_default());
        RunConfig {
            user: over.user.clone().or_else(|| self.user.clone()),
            work_dir: over.work_dir.clone().or_else(|| self.work_dir.clone()),
            env_vars: Some(env),
        }
    }
}

impl Execute {
    /// For transports without a session to carry them: no PTY, and the
    /// command outlives a dropped connection (clients resume instead).
    pub(super) fn without_session_features(mut self) -> Self {
        self.pty = None;
        self.kill_on_disconnect = Some(false);
        self
    }

    pub(super) fn into_request(self, defaults: &RunConfig) -> Result<ExecRequest, String> {
        let rc = defaults.merged(self.run_config.as_ref());
        let mut env = rc.env_vars.unwrap_or_default();
        env.extend(self.env.unwrap_or_default());
        Ok(ExecRequest {
            command: self.command,
            argv: None,
            shell: self.shell,
            env,
            cwd: self.cwd.or(rc.work_dir),
            user: self.user.or(rc.user),
            timeout_ms: timeout_ms(self.timeout_seconds, "timeout_seconds")?,
            idle_timeout_ms: signed_ms(
                self.idle_timeout_seconds,
                DEFAULT_IDLE_TIMEOUT_MS,
                "idle_timeout_seconds",
            )?,
            ttl_ms: signed_ms(self.ttl_seconds, DEFAULT_TTL_MS, "ttl_seconds")?,
            kill_on_disconnect: self.kill_on_disconnect.unwrap_or(false),
            pty: self.pty.unwrap_or(false).then_some(DEFAULT_PTY),
            command_id: self.command_id,
        })
    }
}

/// Frames after the first.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ClientFrame {
    Input {
        data: String,
    },
    Kill {
        #[serde(default)]
        signal: Option<i32>,
    },
    Resize {
        rows: u16,
        cols: u16,
    },
    CloseStdin,
}

/// Largest duration accepted, in seconds (about 31 years).
const MAX_SECONDS: f64 = 1e9;

fn seconds_to_ms(s: f64, name: &str) -> Result<i64, String> {
    if !s.is_finite() || s > MAX_SECONDS {
        return Err(format!(
            "{name} must be a number of seconds up to {MAX_SECONDS}"
        ));
    }
    Ok((s * 1000.0).round() as i64)
}

/// A deadline: absent = 60 s, 0 = none; negative is refused.
fn timeout_ms(s: Option<f64>, name: &str) -> Result<u64, String> {
    match s {
        None => Ok(DEFAULT_TIMEOUT_MS),
        Some(s) if s < 0.0 => Err(format!("{name} must not be negative")),
        Some(s) => seconds_to_ms(s, name).map(|ms| ms as u64),
    }
}

/// An idle timeout or ttl: absent = the default, negative = never.
fn signed_ms(s: Option<f64>, default: i64, name: &str) -> Result<i64, String> {
    match s {
        None => Ok(default),
        Some(s) if s < 0.0 => Ok(-1),
        Some(s) => seconds_to_ms(s, name),
    }
}

// ---------------------------------------------------------------------------
// Server frames

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ServerFrame<'a> {
    Started {
        command_id: &'a str,
        pid: u32,
    },
    Stdout {
        data: &'a str,
        offset: u64,
    },
    Stderr {
        data: &'a str,
        offset: u64,
    },
    Exit {
        exit_code: i32,
    },
    Error {
        error_type: ExecErrorType,
        error: &'a str,
    },
}

impl ServerFrame<'_> {
    fn message(&self) -> Message {
        // Serializing these plain structs cannot fail.
        Message::Text(serde_json::to_string(self).unwrap_or_default().into())
    }
}

// ---------------------------------------------------------------------------
// Incremental UTF-8 decoding

/// Decodes one output channel chunk by chunk, holding back an incomplete
/// trailing UTF-8 sequence until the rest of it arrives.
#[derive(Default)]
struct Utf8Stream {
    /// At most 3 bytes: the start of a character cut by a chunk boundary.
    pending: Vec<u8>,
    /// Stream offset of `pending[0]`.
    pending_at: u64,
}

impl Utf8Stream {
    /// Decodes the chunk that starts at byte `offset`; returns the text to
    /// send, each with the byte offset it starts at.
    fn push(&mut self, offset: u64, data: &[u8]) -> Vec<(u64, String)> {
        let mut out = Vec::new();
        if !self.pending.is_empty() && self.pending_at + self.pending.len() as u64 != offset {
            // Not contiguous (a replay clamped to what the guest retained):
            // the held bytes will never be completed.
            out.extend(self.flush());
        }
        let start = if self.pending.is_empty() {
            offset
        } else {
            self.pending_at
        };
        let mut buf = std::mem::take(&mut self.pending);
        buf.extend_from_slice(data);
        let (text, used) = decode_prefix(&buf);
        if used < buf.len() {
            self.pending = buf[used..].to_vec();
            self.pending_at = start + used as u64;
        }
        if !text.is_empty() {
            out.push((start, text));
        }
        out
    }

    /// Whatever is held back, decoded lossily (at the end of the output).
    fn flush(&mut self) -> Option<(u64, String)> {
        if self.pending.is_empty() {
            return None;
        }
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        Some((self.pending_at, text))
    }
}

/// Decodes `buf` except an incomplete sequence at its very end; invalid
/// bytes become U+FFFD. Returns the text and the bytes consumed.
fn decode_prefix(buf: &[u8]) -> (String, usize) {
    let mut text = String::with_capacity(buf.len());
    let mut rest = buf;
    loop {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                text.push_str(s);
                return (text, buf.len());
            }
            Err(e) => {
                let (valid, after) = rest.split_at(e.valid_up_to());
                text.push_str(std::str::from_utf8(valid).unwrap_or_default());
                match e.error_len() {
                    Some(n) => {
                        text.push(char::REPLACEMENT_CHARACTER);
                        rest = &after[n..];
                    }
                    None => return (text, buf.len() - after.len()),
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// WebSocket exec

/// Serves LangSmith's exec WebSocket protocol on an upgraded socket against
/// one guest. The public data plane calls this too, with the sandbox's run
/// config as `defaults`.
pub async fn exec_session(
    mut socket: WebSocket,
    guest: GuestClient,
    vm: VmId,
    defaults: RunConfig,
    shutdown: Option<tokio::sync::watch::Receiver<bool>>,
) {
    let first = match tokio::time::timeout(FIRST_FRAME_TIMEOUT, first_text(&mut socket)).await {
        Ok(Some(text)) => text,
        Ok(None) => return,
        Err(_) => {
            let msg = format!(
                "no execute or reconnect frame within {}s",
                FIRST_FRAME_TIMEOUT.as_secs()
            );
            return refuse(socket, vm, &msg).await;
        }
    };
    let first = match first.and_then(|t| parse_first(&t)) {
        Ok(f) => f,
        Err(msg) => return refuse(socket, vm, &msg).await,
    };
    let started = match first {
        FirstFrame::Execute(x) => {
            let close_stdin = x.close_stdin.unwrap_or(false) && !x.pty.unwrap_or(false);
            match x.into_request(&defaults) {
                Ok(req) => match guest.exec(req).await {
                    Ok(h) if close_stdin => {
                        let _ = h.control.close_stdin().await;
                        Ok(h)
                    }
                    other => other,
                },
                Err(msg) => return refuse(socket, vm, &msg).await,
            }
        }
        FirstFrame::Reconnect {
            command_id,
            stdout_offset,
            stderr_offset,
        } => {
            guest
                .attach(&command_id, stdout_offset, stderr_offset)
                .await
        }
    };
    let ExecHandle {
        mut events,
        control,
    } = match started {
        Ok(h) => h,
        Err(e) => return refuse(socket, vm, &format!("cannot start the command: {e}")).await,
    };

    let (mut sink, mut source) = socket.split();
    let mut going_away = false;
    {
        let pump = pump(&mut events, &mut sink, vm);
        let reader = read_client(&mut source, &control, vm);
        let shutdown = async {
            match shutdown {
                Some(mut rx) => {
                    let _ = rx.wait_for(|stop| *stop).await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::pin!(pump, reader, shutdown);
        tokio::select! {
            end = &mut pump => match end {
                PumpEnd::Finished => {
                    let _ = tokio::time::timeout(CLOSE_WAIT, &mut reader).await;
                }
                PumpEnd::ClientGone => control.detach(),
            },
            () = &mut reader => control.detach(),
            () = &mut shutdown => {
                control.detach();
                going_away = true;
            }
        }
    }
    if going_away {
        // 1001: the server is going away; the SDK reconnects with its offsets.
        let _ = sink
            .send(Message::Close(Some(CloseFrame {
                code: close_code::AWAY,
                reason: "server shutting down".into(),
            })))
            .await;
    }
    // Completes the close handshake when the client started it.
    let _ = tokio::time::timeout(FLUSH_WAIT, sink.close()).await;
}

/// The first text frame; `Err` for a frame that cannot be one, `None`
/// when the client left.
async fn first_text(socket: &mut WebSocket) -> Option<Result<String, String>> {
    while let Some(msg) = socket.recv().await {
        match msg {
            Ok(Message::Text(t)) => return Some(Ok(t.as_str().to_owned())),
            Ok(Message::Binary(b)) => {
                return Some(String::from_utf8(b.to_vec()).map_err(|_| {
                    "the first frame must be a JSON execute or reconnect message".into()
                }))
            }
            Ok(Message::Ping(_) | Message::Pong(_)) => continue,
            Ok(Message::Close(_)) | Err(_) => return None,
        }
    }
    None
}

fn parse_first(text: &str) -> Result<FirstFrame, String> {
    serde_json::from_str(text).map_err(|e| {
        format!("expected {{\"type\":\"execute\",…}} or {{\"type\":\"reconnect\",…}}: {e}")
    })
}

/// Answers a bad start with an `error` frame and closes.
async fn refuse(mut socket: WebSocket, vm: VmId, message: &str) {
    tracing::info!(vm = %vm, error = %message, "exec websocket refused");
    let frame = ServerFrame::Error {
        error_type: ExecErrorType::CommandError,
        error: message,
    };
    if socket.send(frame.message()).await.is_err() {
        return;
    }
    let _ = socket.send(normal_close()).await;
    let _ = tokio::time::timeout(CLOSE_WAIT, async {
        while let Some(Ok(_)) = socket.recv().await {}
    })
    .await;
}

fn normal_close() -> Message {
    Message::Close(Some(CloseFrame {
        code: close_code::NORMAL,
        reason: "".into(),
    }))
}

enum PumpEnd {
    /// `exit` or `error` was sent, then a close frame.
    Finished,
    /// The client cannot be written to.
    ClientGone,
}

/// Guest → client until the command's final event.
async fn pump(
    events: &mut ExecEvents,
    sink: &mut SplitSink<WebSocket, Message>,
    vm: VmId,
) -> PumpEnd {
    let mut decoders = [Utf8Stream::default(), Utf8Stream::default()];
    loop {
        let update = match events.next().await {
            Ok(Some(u)) => u,
            Ok(None) => ExecUpdate::Error {
                error_type: ExecErrorType::CommandError,
                message: "the command stream ended without an exit status".into(),
            },
            Err(e) => {
                tracing::warn!(vm = %vm, error = %e, "exec stream failed");
                ExecUpdate::Error {
                    error_type: ExecErrorType::CommandError,
                    message: e.to_string(),
                }
            }
        };
        let last = match update {
            ExecUpdate::Started { command_id, pid } => {
                let frame = ServerFrame::Started {
                    command_id: &command_id,
                    pid,
                };
                if sink.send(frame.message()).await.is_err() {
                    return PumpEnd::ClientGone;
                }
                continue;
            }
            ExecUpdate::Output {
                channel,
                offset,
                data,
            } => {
                let idx = channel as usize - 1;
                let chunks = decoders[idx].push(offset, &data);
                if send_output(sink, channel, chunks).await.is_err() {
                    return PumpEnd::ClientGone;
                }
                continue;
            }
            ExecUpdate::Exit { exit_code, .. } => (None, exit_code),
            ExecUpdate::Error {
                error_type,
                message,
            } => (Some((error_type, message)), 0),
        };
        for (idx, channel) in [OutputChannel::Stdout, OutputChannel::Stderr]
            .into_iter()
            .enumerate()
        {
            let rest = decoders[idx].flush().into_iter().collect();
            if send_output(sink, channel, rest).await.is_err() {
                return PumpEnd::ClientGone;
            }
        }
        let frame = match &last {
            (Some((error_type, message)), _) => ServerFrame::Error {
                error_type: client_error_type(*error_type),
                error: message,
            },
            (None, exit_code) => ServerFrame::Exit {
                exit_code: *exit_code,
            },
        };
        if sink.send(frame.message()).await.is_err() {
            return PumpEnd::ClientGone;
        }
        let _ = sink.send(normal_close()).await;
        return PumpEnd::Finished;
    }
}

async fn send_output(
    sink: &mut SplitSink<WebSocket, Message>,
    channel: OutputChannel,
    chunks: Vec<(u64, String)>,
) -> Result<(), axum::Error> {
    for (offset, data) in &chunks {
        let frame = match channel {
            OutputChannel::Stdout => ServerFrame::Stdout {
                data,
                offset: *offset,
            },
            OutputChannel::Stderr => ServerFrame::Stderr {
                data,
                offset: *offset,
            },
        };
        sink.send(frame.message()).await?;
    }
    Ok(())
}

/// Client → guest until the client closes or goes away.
async fn read_client(source: &mut SplitStream<WebSocket>, control: &ExecControl, vm: VmId) {
    while let Some(msg) = source.next().await {
        let text = match msg {
            Ok(Message::Text(t)) => t,
            // Binary frames are raw stdin (an extension).
            Ok(Message::Binary(b)) => {
                let _ = control.stdin(b).await;
                continue;
            }
            Ok(Message::Ping(_) | Message::Pong(_)) => continue,
            Ok(Message::Close(_)) | Err(_) => return,
        };
        // A failed send means the command's stream ended; the pump sees it.
        let _ = match serde_json::from_str::<ClientFrame>(text.as_str()) {
            Ok(ClientFrame::Input { data }) => control.stdin(Bytes::from(data)).await,
            Ok(ClientFrame::Kill { signal }) => control.kill(signal).await,
            Ok(ClientFrame::Resize { rows, cols }) => control.resize(rows, cols).await,
            Ok(ClientFrame::CloseStdin) => control.close_stdin().await,
            Err(e) => {
                tracing::info!(vm = %vm, error = %e, "ignoring an unknown exec client frame");
                Ok(())
            }
        };
    }
}

/// Whether an error that ends a fresh exec is the request's fault: the
/// guest refused it (`BadRequest`: no such working directory or user, a
/// NUL byte, an invalid environment name), or found no such shell or
/// program (`CommandNotFound`, which only a reconnect uses otherwise).
pub fn is_refusal(t: ExecErrorType) -> bool {
    matches!(
        t,
        ExecErrorType::BadRequest | ExecErrorType::CommandNotFound
    )
}

/// The `error_type` LangSmith clients are sent: Hearth's `BadRequest` is
/// not one of theirs, so it travels as `CommandError`.
pub(super) fn client_error_type(t: ExecErrorType) -> ExecErrorType {
    match t {
        ExecErrorType::BadRequest => ExecErrorType::CommandError,
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `bytes` to a decoder in the given chunk sizes.
    fn decode_in(bytes: &[u8], sizes: &[usize]) -> Vec<(u64, String)> {
        let mut d = Utf8Stream::default();
        let mut out = Vec::new();
        let mut at = 0usize;
        for &n in sizes {
            let end = (at + n).min(bytes.len());
            out.extend(d.push(at as u64, &bytes[at..end]));
            at = end;
        }
        out.extend(d.flush());
        out
    }

    #[test]
    fn split_characters_are_held_back_with_consistent_offsets() {
        let text = "a€b😀c";
        let bytes = text.as_bytes();
        // Every way of cutting the text into two chunks, and byte by byte.
        for cut in 0..=bytes.len() {
            let out = decode_in(bytes, &[cut, bytes.len() - cut]);
            let joined: String = out.iter().map(|(_, s)| s.as_str()).collect();
            assert_eq!(joined, text, "cut at {cut}");
            let mut expect = 0u64;
            for (off, s) in &out {
                assert_eq!(*off, expect, "cut at {cut}: {out:?}");
                expect += s.len() as u64;
            }
        }
        let out = decode_in(bytes, &vec![1; bytes.len()]);
        let joined: String = out.iter().map(|(_, s)| s.as_str()).collect();
        assert_eq!(joined, text);
        assert_eq!(out[1], (1, "€".into()));
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let out = decode_in(b"ok\xffz\xe2\x82", &[4, 2]);
        let joined: String = out.iter().map(|(_, s)| s.as_str()).collect();
        assert_eq!(joined, "ok\u{fffd}z\u{fffd}");
        // The truncated sequence at the end is flushed from its own offset.
        assert_eq!(out.last().unwrap().0, 4);
    }

    #[test]
    fn a_gap_flushes_held_bytes() {
        let mut d = Utf8Stream::default();
        assert_eq!(d.push(0, b"x\xe2"), vec![(0, "x".to_owned())]);
        // The guest replays from a later offset: the held byte is given up.
        let out = d.push(10, b"y");
        assert_eq!(out, vec![(1, "\u{fffd}".to_owned()), (10, "y".to_owned())]);
    }

    #[test]
    fn execute_frames_map_to_exec_requests() {
        let f = parse_first(r#"{"type":"execute","command":"ls","pty":true,"env":null,"extra":1}"#)
            .unwrap();
        let FirstFrame::Execute(x) = f else { panic!() };
        let r = x.into_request(&RunConfig::default()).unwrap();
        assert_eq!(
            (r.timeout_ms, r.idle_timeout_ms, r.ttl_ms, r.pty, r.shell),
            (60_000, 300_000, 600_000, Some(DEFAULT_PTY), None)
        );
        let f = parse_first(
            r#"{"type":"execute","command":"ls","timeout_seconds":0,"idle_timeout_seconds":-1,"ttl_seconds":1.5}"#,
        )
        .unwrap();
        let FirstFrame::Execute(x) = f else { panic!() };
        let r = x.into_request(&RunConfig::default()).unwrap();
        assert_eq!((r.timeout_ms, r.idle_timeout_ms, r.ttl_ms), (0, -1, 1500));
        let f = parse_first(r#"{"type":"execute","command":"ls","timeout_seconds":-3}"#).unwrap();
        let FirstFrame::Execute(x) = f else { panic!() };
        assert!(x.into_request(&RunConfig::default()).is_err());
        assert!(parse_first(r#"{"type":"execute"}"#).is_err());
        assert!(parse_first(r#"{"type":"launch","command":"ls"}"#).is_err());
        assert!(parse_first("not json").is_err());
        let f = parse_first(r#"{"type":"reconnect","command_id":"c","stdout_offset":5}"#).unwrap();
        assert!(matches!(
            f,
            FirstFrame::Reconnect {
                stdout_offset: 5,
                stderr_offset: 0,
                ..
            }
        ));
        for later in [
            r#"{"type":"input","data":"x"}"#,
            r#"{"type":"kill"}"#,
            r#"{"type":"resize","rows":3,"cols":4}"#,
            r#"{"type":"close_stdin"}"#,
        ] {
            assert!(
                serde_json::from_str::<ClientFrame>(later).is_ok(),
                "{later}"
            );
        }
    }

    #[test]
    fn run_config_defaults_apply_under_the_frame() {
        let defaults = RunConfig {
            user: Some("user".into()),
            work_dir: Some("/home/user".into()),
            env_vars: Some(
                [
                    ("A".to_string(), "1".to_string()),
                    ("B".to_string(), "1".to_string()),
                ]
                .into(),
            ),
        };
        let x: Execute = serde_json::from_str(
            r#"{"command":"x","env":{"B":"2"},"run_config":{"work_dir":"/tmp","env_vars":{"C":"3"}},"close_stdin":true}"#,
        )
        .unwrap();
        let r = x.into_request(&defaults).unwrap();
        assert_eq!(r.user.as_deref(), Some("user"));
        assert_eq!(r.cwd.as_deref(), Some("/tmp"));
        assert_eq!(r.env.get("A").map(String::as_str), Some("1"));
        assert_eq!(r.env.get("B").map(String::as_str), Some("2"));
        assert_eq!(r.env.get("C").map(String::as_str), Some("3"));
    }
}
