//! LangSmith's server-sent-events exec transport, the SDK's opt-in
//! alternative to the WebSocket (`LANGSMITH_EXPERIMENTAL_FEATURES` holding
//! `sandbox_sse_exec`; langsmith 0.15.1 `sandbox/_sse_execute.py`).
//!
//! - `POST …/execute/stream/start` takes the WebSocket's `execute` frame as a
//!   JSON body (no PTY, no stdin: stdin is closed at spawn, and a dropped
//!   response never kills the command, since resuming is how this transport
//!   survives broken connections) and answers `text/event-stream`.
//! - `POST …/execute/stream/resume` takes `{command_id, stdout_offset,
//!   stderr_offset}` and replays from those offsets; an unknown command is a
//!   404 (`CommandNotFound`).
//!
//! Events: `started` `{command_id, pid}`, then `stdout`/`stderr`
//! `{data: base64, offset}` (offset of the chunk's first byte), then
//! `stream_end` `{stream, offset}` for both streams and `exit`
//! `{exit_code}`, or `error` `{error_type, error}` (`ServerShuttingDown` when
//! the server stops: the client resumes). A comment line every 15 s keeps
//! idle connections alive.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use bytes::Bytes;
use hearth_guest_proto::{ExecErrorType, OutputChannel};
use serde::Deserialize;
use tokio::sync::watch;

use super::exec::{Execute, RunConfig};
use super::ApiError;
use hearth_hostapi::guest::{ExecControl, ExecEvents, ExecHandle, ExecUpdate, GuestClient};

/// How often an idle stream carries a comment line.
const HEARTBEAT: Duration = Duration::from_secs(15);

#[derive(Deserialize)]
pub(super) struct Resume {
    command_id: String,
    #[serde(default)]
    stdout_offset: u64,
    #[serde(default)]
    stderr_offset: u64,
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::unprocessable(format!("invalid body: {e}")))
}

/// `POST …/execute/stream/start` with a JSON `body`; the public data plane
/// passes the sandbox's run config as `defaults`.
pub async fn sse_start(
    guest: &GuestClient,
    defaults: &RunConfig,
    body: &[u8],
    shutdown: Option<watch::Receiver<bool>>,
) -> Result<Response, ApiError> {
    start(guest, defaults, parse(body)?, shutdown).await
}

/// `POST …/execute/stream/resume` with a JSON `body`.
pub async fn sse_resume(
    guest: &GuestClient,
    body: &[u8],
    shutdown: Option<watch::Receiver<bool>>,
) -> Result<Response, ApiError> {
    resume(guest, parse(body)?, shutdown).await
}

async fn start(
    guest: &GuestClient,
    defaults: &RunConfig,
    x: Execute,
    shutdown: Option<watch::Receiver<bool>>,
) -> Result<Response, ApiError> {
    let req = x
        .without_session_features()
        .into_request(defaults)
        .map_err(ApiError::unprocessable)?;
    let mut handle = guest
        .exec(req)
        .await
        .map_err(|e| ApiError::internal(format!("cannot start the command: {e}")))?;
    // A start the request made impossible (no such directory, shell or
    // user, …) is a 400 before any event, as on the blocking exec; the
    // SDK reads the envelope's `CommandError` as it would the event.
    let first = handle.events.next().await;
    if let Ok(Some(ExecUpdate::Error {
        error_type,
        message,
    })) = &first
    {
        if super::exec::is_refusal(*error_type) {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "CommandError",
                message.clone(),
            ));
        }
    }
    let _ = handle.control.close_stdin().await;
    Ok(stream_response(handle, Some(first), [0, 0], shutdown))
}

async fn resume(
    guest: &GuestClient,
    r: Resume,
    shutdown: Option<watch::Receiver<bool>>,
) -> Result<Response, ApiError> {
    let mut handle = guest
        .attach(&r.command_id, r.stdout_offset, r.stderr_offset)
        .await
        .map_err(|e| ApiError::internal(format!("cannot attach to the command: {e}")))?;
    // An unknown command is a 404 before any event (the SDK maps it to
    // CommandNotFound); anything else starts the stream.
    let first = handle.events.next().await;
    if let Ok(Some(ExecUpdate::Error {
        error_type: ExecErrorType::CommandNotFound,
        message,
    })) = &first
    {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "CommandNotFound",
            message.clone(),
        ));
    }
    Ok(stream_response(
        handle,
        Some(first),
        [r.stdout_offset, r.stderr_offset],
        shutdown,
    ))
}

/// One event: `event: NAME` and one `data:` line of JSON.
fn event(name: &str, data: serde_json::Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// `error` with a LangSmith error type: one of the command's
/// ([`ExecErrorType`]) or the server's own `ServerShuttingDown`.
fn error_event(error_type: serde_json::Value, message: &str) -> Bytes {
    event(
        "error",
        serde_json::json!({ "error_type": error_type, "error": message }),
    )
}

/// The state of one response body.
struct Pump {
    events: ExecEvents,
    /// Kept so the command stays attached while the response is read;
    /// dropping it detaches (the command keeps running).
    _control: ExecControl,
    /// An update read before the response began (resume's first).
    pending: Option<Result<Option<ExecUpdate>, hearth_hostapi::GuestError>>,
    /// Where each stream's next byte sits (stdout, stderr).
    cursors: [u64; 2],
    shutdown: Option<watch::Receiver<bool>>,
    heartbeat: tokio::time::Interval,
    done: bool,
}

impl Pump {
    /// The next piece of the body; `None` once the stream has ended.
    async fn next(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        let update = match self.pending.take() {
            Some(u) => u,
            None => {
                let stop = &mut self.shutdown;
                let shutdown = async {
                    match stop {
                        Some(rx) => {
                            let _ = rx.wait_for(|stop| *stop).await;
                        }
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    u = self.events.next() => u,
                    _ = self.heartbeat.tick() => return Some(Bytes::from_static(b": keepalive\n\n")),
                    () = shutdown => {
                        self.done = true;
                        return Some(error_event(
                            "ServerShuttingDown".into(),
                            "the server is shutting down; resume from your offsets",
                        ));
                    }
                }
            }
        };
        let update = match update {
            Ok(Some(u)) => u,
            Ok(None) => ExecUpdate::Error {
                error_type: ExecErrorType::CommandError,
                message: "the command stream ended without an exit status".into(),
            },
            Err(e) => ExecUpdate::Error {
                error_type: ExecErrorType::CommandError,
                message: e.to_string(),
            },
        };
        Some(match update {
            ExecUpdate::Started { command_id, pid } => event(
                "started",
                serde_json::json!({ "command_id": command_id, "pid": pid }),
            ),
            ExecUpdate::Output {
                channel,
                offset,
                data,
            } => {
                let (idx, name) = match channel {
                    OutputChannel::Stdout => (0, "stdout"),
                    OutputChannel::Stderr => (1, "stderr"),
                };
                self.cursors[idx] = self.cursors[idx].max(offset + data.len() as u64);
                event(
                    name,
                    serde_json::json!({ "data": B64.encode(&data), "offset": offset }),
                )
            }
            ExecUpdate::Exit { exit_code, .. } => {
                self.done = true;
                let mut out = self.stream_ends();
                out.extend_from_slice(&event(
                    "exit",
                    serde_json::json!({ "exit_code": exit_code }),
                ));
                Bytes::from(out)
            }
            ExecUpdate::Error {
                error_type,
                message,
            } => {
                self.done = true;
                let mut out = self.stream_ends();
                let error_type = serde_json::to_value(super::exec::client_error_type(error_type))
                    .unwrap_or_default();
                out.extend_from_slice(&error_event(error_type, &message));
                Bytes::from(out)
            }
        })
    }

    fn stream_ends(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, offset) in ["stdout", "stderr"].into_iter().zip(self.cursors) {
            out.extend_from_slice(&event(
                "stream_end",
                serde_json::json!({ "stream": name, "offset": offset }),
            ));
        }
        out
    }
}

fn stream_response(
    handle: ExecHandle,
    pending: Option<Result<Option<ExecUpdate>, hearth_hostapi::GuestError>>,
    cursors: [u64; 2],
    shutdown: Option<watch::Receiver<bool>>,
) -> Response {
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    heartbeat.reset(); // the first tick after one period, not at once
    let pump = Pump {
        events: handle.events,
        _control: handle.control,
        pending,
        cursors,
        shutdown,
        heartbeat,
        done: false,
    };
    let body = futures_util::stream::unfold(pump, |mut pump| async move {
        let chunk = pump.next().await?;
        Some((Ok::<_, Infallible>(chunk), pump))
    });
    let mut resp = Response::new(Body::from_stream(body));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}
