//! LangSmith's data-plane protocol on the control plane's public routes
//! (`/dataplane/{sandbox_id}/…`), through the real server on loopback and a
//! real busybox microVM (TCG here): the exec WebSocket, the blocking
//! `POST /execute`, uploads and downloads with ranges, the TCP tunnel, and
//! the envelope of refused requests.
//!
//! These are the protocol assertions of the host agent's old API test
//! (`crates/hearth-host/tests/api.rs`, deleted when the protocol moved
//! here), ported to the public routes. Not repeated here, because another
//! test already makes them:
//! - `api.rs`: `If-None-Match` → 304, `If-Range`, `HEAD`, the SSE
//!   transport, an unknown sandbox id that is not a UUID, a missing key;
//! - `client_errors.rs`: a working directory or shell that does not exist
//!   (400 `CommandError`, and the WebSocket's `error` frame for a missing
//!   directory), 422s naming the field, uploads over a directory, a
//!   missing or repeated `path` query;
//! - the SDK suite (`tests/sdk/test_sdk.py`): bulk traffic through the
//!   tunnel (HTTP and 512 KiB echoed); here only one echo and the refusals.
//!
//! The old API's host-only routes (VM create/pause/resume, stat, list,
//! mkdir, remove) have no public counterpart and are not ported. Where the
//! public routes answer differently, their behaviour is asserted: uploads
//! are multipart `POST`s that make missing parent directories and answer
//! `{path, bytes}`; `truncated` is sent only when true; a malformed body is
//! a 422; a tunnel to a closed port is status byte 2 inside its yamux
//! stream (the old `/tcp` failed the handshake with a 502); a plain GET of
//! a WebSocket route is 400 `InvalidRequest`; an unknown sandbox is 404
//! `NotFound` on every route.

use std::task::Poll;
use std::time::{Duration, Instant};

use crate::harness::{envelope_problem, send, RawRequest, Resp, Rng, Server};
use bytes::Bytes;
use futures_util::{AsyncReadExt as _, AsyncWriteExt as _, SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_util::compat::TokioAsyncReadCompatExt;

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>;

const DEADLINE: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------
// HTTP helpers

/// Asserts LangSmith's object envelope with this status and error type,
/// and an `error_id` that is a UUID.
#[track_caller]
fn assert_error(r: &Resp, status: u16, error: &str) {
    assert_eq!(
        (r.status, r.error().as_str()),
        (status, error),
        "{}",
        r.text()
    );
    if let Some(p) = envelope_problem(r) {
        panic!("{status} {error} is not in the envelope: {p}");
    }
    let v = r.json().unwrap_or_default();
    let id = v["detail"]["error_id"].as_str().unwrap_or_default();
    assert!(uuid::Uuid::parse_str(id).is_ok(), "error_id {id:?}: {v}");
}

fn key_header(s: &Server) -> (String, String) {
    ("x-api-key".to_owned(), s.admin.clone())
}

/// A request with the admin key and `headers`.
async fn request(
    s: &Server,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Resp {
    let mut all = vec![key_header(s)];
    all.extend(
        headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    send(s.addr, &RawRequest::new(method, path, &all, body).bytes()).await
}

async fn execute(s: &Server, id: &str, body: &Value) -> Resp {
    s.json(
        "POST",
        &format!("/dataplane/{id}/execute"),
        Some(&s.admin),
        body,
    )
    .await
}

async fn download(s: &Server, id: &str, path: &str, headers: &[(&str, &str)]) -> Resp {
    request(
        s,
        "GET",
        &format!("/dataplane/{id}/download?path={path}"),
        headers,
        Vec::new(),
    )
    .await
}

/// `POST /upload` with `content` as the multipart field `file`.
async fn upload(s: &Server, id: &str, path: &str, content: &[u8]) -> Resp {
    let boundary = "dataplane-protocol-boundary";
    let mut body = format!(
        "--{boundary}\r\ncontent-disposition: form-data; name=\"file\"; filename=\"f\"\r\n\
         content-type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(content);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let ct = format!("multipart/form-data; boundary={boundary}");
    request(
        s,
        "POST",
        &format!("/dataplane/{id}/upload?path={path}"),
        &[("content-type", &ct)],
        body,
    )
    .await
}

// ---------------------------------------------------------------------------
// WebSocket helpers

async fn ws_connect(s: &Server, path: &str) -> Result<Ws, tungstenite::Error> {
    let mut req = format!("ws://{}{path}", s.addr)
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("x-api-key", s.admin.parse().unwrap());
    tokio::time::timeout(DEADLINE, tokio_tungstenite::connect_async(req))
        .await
        .expect("the WebSocket handshake answers")
        .map(|(ws, _)| ws)
}

async fn exec_ws(s: &Server, id: &str) -> Ws {
    ws_connect(s, &format!("/dataplane/{id}/execute/ws"))
        .await
        .expect("exec WebSocket")
}

async fn send_json(ws: &mut Ws, v: Value) {
    ws.send(Message::Text(v.to_string().into())).await.unwrap();
}

/// The next JSON text frame; `None` once the server closed (normally).
async fn next_json(ws: &mut Ws) -> Option<Value> {
    loop {
        let msg = tokio::time::timeout(DEADLINE, ws.next())
            .await
            .expect("a frame in time");
        match msg {
            Some(Ok(Message::Text(t))) => return Some(serde_json::from_str(t.as_str()).unwrap()),
            Some(Ok(Message::Close(frame))) => {
                if let Some(f) = frame {
                    assert_eq!(u16::from(f.code), 1000, "close frame {f:?}");
                }
                return None;
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(other)) => panic!("unexpected frame {other:?}"),
            Some(Err(e)) => panic!("WebSocket error {e}"),
            None => return None,
        }
    }
}

/// What one exec WebSocket delivered until the server closed it.
#[derive(Debug, Default)]
struct Run {
    started: Option<Value>,
    /// `(offset, data)` of each stdout frame.
    stdout_frames: Vec<(u64, String)>,
    stdout: String,
    stderr: String,
    exit_code: Option<i64>,
    error: Option<Value>,
}

/// Reads frames until the close, checking that the byte offsets of each
/// channel are contiguous from `from` (stdout, stderr).
async fn collect(ws: &mut Ws, from: (u64, u64)) -> Run {
    let mut run = Run::default();
    let mut next = [from.0, from.1];
    while let Some(f) = next_json(ws).await {
        assert!(
            run.exit_code.is_none() && run.error.is_none(),
            "a frame after the last: {f}"
        );
        match f["type"].as_str().unwrap_or_default() {
            "started" => run.started = Some(f),
            t @ ("stdout" | "stderr") => {
                let idx = usize::from(t == "stderr");
                let data = f["data"].as_str().unwrap().to_owned();
                assert_eq!(f["offset"].as_u64(), Some(next[idx]), "{f}");
                next[idx] += data.len() as u64;
                if idx == 0 {
                    run.stdout.push_str(&data);
                    run.stdout_frames.push((next[0] - data.len() as u64, data));
                } else {
                    run.stderr.push_str(&data);
                }
            }
            "exit" => run.exit_code = f["exit_code"].as_i64(),
            "error" => run.error = Some(f),
            other => panic!("unknown frame type {other}: {f}"),
        }
    }
    run
}

async fn ws_run(s: &Server, id: &str, first: Value) -> Run {
    let mut ws = exec_ws(s, id).await;
    send_json(&mut ws, first).await;
    collect(&mut ws, (0, 0)).await
}

fn error_type(run: &Run) -> &str {
    run.error
        .as_ref()
        .and_then(|e| e["error_type"].as_str())
        .unwrap_or_else(|| panic!("no error frame: {run:?}"))
}

fn lap(what: &str, t: &mut Instant) {
    eprintln!("[dataplane protocol] {what}: {:.2?}", t.elapsed());
    *t = Instant::now();
}

// ---------------------------------------------------------------------------
// The exec WebSocket

async fn ws_exec(s: &Server, id: &str) {
    // started, separate outputs with byte offsets, the exit code.
    let run = ws_run(
        s,
        id,
        json!({"type": "execute", "command": "echo hi; echo err >&2; exit 4"}),
    )
    .await;
    let started = run.started.as_ref().expect("started frame");
    assert!(
        started["command_id"]
            .as_str()
            .is_some_and(|c| !c.is_empty())
            && started["pid"].as_u64().is_some(),
        "{started}"
    );
    assert_eq!(
        (run.stdout.as_str(), run.stderr.as_str(), run.exit_code),
        ("hi\n", "err\n", Some(4)),
        "{run:?}"
    );

    // Multi-byte characters arrive intact; env, cwd and user are honoured.
    let run = ws_run(
        s,
        id,
        json!({"type": "execute",
               "command": "printf 'caf\\303\\251 \\342\\202\\254\\n'; echo $FOO; pwd; id -u",
               "env": {"FOO": "bar"}, "cwd": "/tmp", "user": "user"}),
    )
    .await;
    assert_eq!(run.stdout, "café €\nbar\n/tmp\n1000\n", "{run:?}");

    // A character cut between two writes (so between two guest chunks) is
    // held back and sent whole, at the byte offset of its first byte.
    let run = ws_run(
        s,
        id,
        json!({"type": "execute", "command": "printf 'x\\342\\202'; sleep 1; printf '\\254y\\n'"}),
    )
    .await;
    assert_eq!((run.stdout.as_str(), run.exit_code), ("x€y\n", Some(0)));
    assert_eq!(
        run.stdout_frames,
        [(0, "x".to_owned()), (1, "€y\n".to_owned())],
        "the split € is neither lost, doubled nor replaced"
    );

    // stdin through input frames, then close_stdin.
    let mut ws = exec_ws(s, id).await;
    send_json(
        &mut ws,
        json!({"type": "execute", "command": "cat; echo done"}),
    )
    .await;
    assert_eq!(next_json(&mut ws).await.unwrap()["type"], "started");
    send_json(&mut ws, json!({"type": "input", "data": "ping\n"})).await;
    send_json(&mut ws, json!({"type": "input", "data": "pöng\n"})).await;
    send_json(&mut ws, json!({"type": "close_stdin"})).await;
    let run = collect(&mut ws, (0, 0)).await;
    assert_eq!(
        (run.stdout.as_str(), run.exit_code),
        ("ping\npöng\ndone\n", Some(0)),
        "{run:?}"
    );

    // PTY: a terminal of the default size; a resize is seen.
    let mut ws = exec_ws(s, id).await;
    send_json(
        &mut ws,
        json!({"type": "execute", "command": "stty size; read x; stty size", "pty": true}),
    )
    .await;
    assert_eq!(next_json(&mut ws).await.unwrap()["type"], "started");
    let mut seen = String::new();
    while !seen.contains("24 80") {
        let f = next_json(&mut ws).await.expect("PTY output");
        seen.push_str(f["data"].as_str().unwrap_or_default());
    }
    send_json(&mut ws, json!({"type": "resize", "rows": 30, "cols": 100})).await;
    send_json(&mut ws, json!({"type": "input", "data": "\n"})).await;
    let run = collect(&mut ws, (seen.len() as u64, 0)).await;
    assert!(run.stdout.contains("30 100"), "{run:?}");
    assert_eq!(run.exit_code, Some(0));

    // Kill over the WebSocket: SIGKILL, so 128 + 9.
    let mut ws = exec_ws(s, id).await;
    send_json(&mut ws, json!({"type": "execute", "command": "sleep 100"})).await;
    assert_eq!(next_json(&mut ws).await.unwrap()["type"], "started");
    let t = Instant::now();
    send_json(&mut ws, json!({"type": "kill"})).await;
    let run = collect(&mut ws, (0, 0)).await;
    assert_eq!(run.exit_code, Some(137), "{run:?}");
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
}

/// Drop the socket midway, re-attach by `command_id` from the offsets held,
/// and get exactly the missing bytes of each channel; after the command
/// ended, a re-attach from any offset replays from there and reports the
/// exit again.
async fn ws_reconnect(s: &Server, id: &str) {
    let command_id = format!("dp-{}", uuid::Uuid::new_v4().simple());
    let cmd = "for i in $(seq 1 40); do echo out$i; echo err$i >&2; sleep 0.05; done";
    let want_out: String = (1..=40).map(|i| format!("out{i}\n")).collect();
    let want_err: String = (1..=40).map(|i| format!("err{i}\n")).collect();

    let mut ws = exec_ws(s, id).await;
    send_json(
        &mut ws,
        json!({"type": "execute", "command": cmd, "command_id": command_id}),
    )
    .await;
    let f = next_json(&mut ws).await.unwrap();
    assert_eq!(
        (f["type"].as_str(), f["command_id"].as_str()),
        (Some("started"), Some(command_id.as_str())),
        "{f}"
    );
    let (mut out, mut err) = (String::new(), String::new());
    while out.lines().count() < 5 || err.is_empty() {
        let f = next_json(&mut ws).await.expect("output before the drop");
        let (buf, kind) = match f["type"].as_str() {
            Some("stdout") => (&mut out, "stdout"),
            Some("stderr") => (&mut err, "stderr"),
            _ => panic!("{f}"),
        };
        assert_eq!(f["offset"].as_u64(), Some(buf.len() as u64), "{kind}: {f}");
        buf.push_str(f["data"].as_str().unwrap());
    }
    drop(ws);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut ws = exec_ws(s, id).await;
    send_json(
        &mut ws,
        json!({"type": "reconnect", "command_id": command_id,
               "stdout_offset": out.len(), "stderr_offset": err.len()}),
    )
    .await;
    let run = collect(&mut ws, (out.len() as u64, err.len() as u64)).await;
    assert_eq!(
        run.started.as_ref().map(|f| &f["command_id"]),
        Some(&json!(command_id)),
        "{run:?}"
    );
    assert_eq!(run.exit_code, Some(0), "{run:?}");
    out.push_str(&run.stdout);
    err.push_str(&run.stderr);
    assert_eq!(out, want_out, "stdout: each byte exactly once");
    assert_eq!(err, want_err, "stderr: each byte exactly once");

    // The command has ended: a re-attach mid-line replays from there.
    let mut ws = exec_ws(s, id).await;
    send_json(
        &mut ws,
        json!({"type": "reconnect", "command_id": command_id,
               "stdout_offset": 7, "stderr_offset": want_err.len()}),
    )
    .await;
    let run = collect(&mut ws, (7, want_err.len() as u64)).await;
    assert_eq!(
        (run.stdout.as_str(), run.stderr.as_str(), run.exit_code),
        (&want_out[7..], "", Some(0)),
        "{run:?}"
    );
}

/// Bad starts are an `error` frame (LangSmith's types), then a normal close.
async fn ws_errors(s: &Server, id: &str) {
    for first in [
        json!({"type": "launch", "command": "true"}),
        json!({"type": "execute"}),
        json!({"type": "execute", "command": "true", "timeout_seconds": -1}),
        json!({"type": "execute", "command": "true", "user": "nobody-here"}),
        json!({"type": "execute", "command": "true", "cwd": "/etc/hostname"}),
    ] {
        let run = ws_run(s, id, first.clone()).await;
        assert_eq!(error_type(&run), "CommandError", "{first}: {run:?}");
        assert!(run.error.as_ref().unwrap()["error"].is_string(), "{run:?}");
        assert!(run.exit_code.is_none(), "{first} ran: {run:?}");
    }
    // Not JSON at all.
    let mut ws = exec_ws(s, id).await;
    ws.send(Message::Text("execute true".into())).await.unwrap();
    let run = collect(&mut ws, (0, 0)).await;
    assert_eq!(error_type(&run), "CommandError", "{run:?}");

    let run = ws_run(
        s,
        id,
        json!({"type": "reconnect", "command_id": "no-such-command", "stdout_offset": 0, "stderr_offset": 0}),
    )
    .await;
    assert_eq!(error_type(&run), "CommandNotFound", "{run:?}");

    let t = Instant::now();
    let run = ws_run(
        s,
        id,
        json!({"type": "execute", "command": "sleep 10", "timeout_seconds": 1}),
    )
    .await;
    assert_eq!(error_type(&run), "CommandTimeout", "{run:?}");
    assert!(t.elapsed() < Duration::from_secs(9), "{:?}", t.elapsed());
}

// ---------------------------------------------------------------------------
// The blocking execute

async fn http_execute(s: &Server, id: &str) {
    let r = execute(s, id, &json!({"command": "echo hi; echo oops >&2; exit 3"})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // `truncated` is only sent when true (LangSmith's answer has no such field).
    assert_eq!(
        r.json(),
        Some(json!({"stdout": "hi\n", "stderr": "oops\n", "exit_code": 3}))
    );
    let r = execute(
        s,
        id,
        &json!({"command": "printf '%s|' \"$FOO\"; pwd", "env": {"FOO": "a b"}, "cwd": "/tmp"}),
    )
    .await;
    assert_eq!(
        r.json().map(|v| v["stdout"].clone()),
        Some(json!("a b|/tmp\n")),
        "{}",
        r.text()
    );
    // Non-UTF-8 output is answered as text, never as a failure.
    let r = execute(s, id, &json!({"command": "printf 'a\\377b'"})).await;
    assert_eq!(
        (r.status, r.json().map(|v| v["stdout"].clone())),
        (200, Some(json!("a\u{fffd}b"))),
        "{}",
        r.text()
    );
    // A timeout is a 408 CommandTimeout, in about the timeout.
    let t = Instant::now();
    let r = execute(s, id, &json!({"command": "sleep 10", "timeout": 1})).await;
    assert_error(&r, 408, "CommandTimeout");
    assert!(t.elapsed() < Duration::from_secs(9), "{:?}", t.elapsed());
    // A run that exits non-zero is an answer, not an error.
    let r = execute(s, id, &json!({"command": "kill -9 $$"})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json().unwrap()["exit_code"], 137, "{}", r.text());
}

// ---------------------------------------------------------------------------
// Uploads and downloads

async fn files(s: &Server, id: &str, t: &mut Instant) {
    const SIZE: usize = 16 << 20;
    let data = Rng::new(0x5eed_da7a).bytes(SIZE);
    let r = upload(s, id, "/tmp/big.bin", &data).await;
    assert_eq!(
        (r.status, r.json()),
        (200, Some(json!({"path": "/tmp/big.bin", "bytes": SIZE}))),
        "{}",
        r.text()
    );
    lap("upload 16 MiB", t);
    let r = download(s, id, "/tmp/big.bin", &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    assert_eq!(r.header("content-length"), Some(SIZE.to_string().as_str()));
    assert_eq!(r.header("accept-ranges"), Some("bytes"));
    assert!(r.header("etag").is_some() && r.header("last-modified").is_some());
    assert_eq!(r.body.len(), SIZE);
    assert!(r.body == data, "the download differs from the upload");
    lap("download 16 MiB", t);

    // Single ranges: 206 with Content-Range and exactly those bytes.
    for (range, start, end) in [
        ("bytes=1000-1999", 1000, 1999),
        ("bytes=0-0", 0, 0),
        ("bytes=-100", SIZE - 100, SIZE - 1),
        ("bytes=16777000-", 16_777_000, SIZE - 1),
        // An end past the file is cut at its last byte.
        ("bytes=16777200-99999999", 16_777_200, SIZE - 1),
    ] {
        let r = download(s, id, "/tmp/big.bin", &[("range", range)]).await;
        assert_eq!(r.status, 206, "{range}: {}", r.text());
        let want = format!("bytes {start}-{end}/{SIZE}");
        assert_eq!(r.header("content-range"), Some(want.as_str()), "{range}");
        let len = (end - start + 1).to_string();
        assert_eq!(r.header("content-length"), Some(len.as_str()), "{range}");
        assert!(r.body == data[start..=end], "{range}: other bytes");
    }
    // Past the end: 416 in the envelope, with the size in Content-Range.
    for range in ["bytes=16777216-", "bytes=20000000-20000010", "bytes=-0"] {
        let r = download(s, id, "/tmp/big.bin", &[("range", range)]).await;
        assert_error(&r, 416, "RangeNotSatisfiable");
        assert_eq!(
            r.header("content-range"),
            Some(format!("bytes */{SIZE}").as_str()),
            "{range}"
        );
    }
    // A range this server does not serve is ignored: the whole file.
    let r = download(s, id, "/tmp/big.bin", &[("range", "bytes=0-1,5-6")]).await;
    assert_eq!((r.status, r.body.len()), (200, SIZE));

    // An upload replaces the file, leaving no tail of the old one.
    let r = upload(s, id, "/tmp/big.bin", b"hello").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = download(s, id, "/tmp/big.bin", &[]).await;
    assert_eq!((r.status, r.body.as_slice()), (200, &b"hello"[..]));
    // Empty files round-trip too; a range of one is unsatisfiable.
    let r = upload(s, id, "/tmp/empty", b"").await;
    assert_eq!(r.json(), Some(json!({"path": "/tmp/empty", "bytes": 0})));
    let r = download(s, id, "/tmp/empty", &[]).await;
    assert_eq!((r.status, r.body.len()), (200, 0), "{}", r.text());
    let r = download(s, id, "/tmp/empty", &[("range", "bytes=0-")]).await;
    assert_error(&r, 416, "RangeNotSatisfiable");

    // Missing files and directories, in LangSmith's envelope.
    assert_error(
        &download(s, id, "/tmp/nope", &[]).await,
        404,
        "FileNotFound",
    );
    assert_error(
        &download(s, id, "/tmp/nope", &[("range", "bytes=0-9")]).await,
        404,
        "FileNotFound",
    );
    assert_error(&download(s, id, "/tmp", &[]).await, 400, "IsADirectory");
    // An upload makes the missing parent directories (as LangSmith's does).
    let r = upload(s, id, "/tmp/new/sub/f", b"x").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = download(s, id, "/tmp/new/sub/f", &[]).await;
    assert_eq!((r.status, r.body.as_slice()), (200, &b"x"[..]));
}

// ---------------------------------------------------------------------------
// The tunnel: yamux inside a WebSocket, this test being the yamux client

/// Carries the WebSocket's binary messages to and from a byte pipe.
async fn bridge(ws: Ws, pipe: tokio::io::DuplexStream) {
    let (mut rd, mut wr) = tokio::io::split(pipe);
    let (mut tx, mut rx) = ws.split();
    let inbound = async move {
        while let Some(Ok(msg)) = rx.next().await {
            match msg {
                Message::Binary(b) if wr.write_all(&b).await.is_err() => break,
                Message::Close(_) => break,
                _ => {}
            }
        }
        let _ = wr.shutdown().await;
    };
    let outbound = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = rd.read(&mut buf).await {
            let msg = Message::Binary(Bytes::copy_from_slice(&buf[..n]));
            if tx.send(msg).await.is_err() {
                break;
            }
        }
        let _ = tx.close().await;
    };
    tokio::join!(inbound, outbound);
}

/// A new tunnel WebSocket with one yamux stream on it; the session is
/// driven by a task until the server ends it.
async fn tunnel_stream(s: &Server, id: &str) -> yamux::Stream {
    let ws = ws_connect(s, &format!("/dataplane/{id}/tunnel"))
        .await
        .expect("tunnel WebSocket");
    let (ours, theirs) = tokio::io::duplex(256 * 1024);
    tokio::spawn(bridge(ws, ours));
    let (give, take) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut conn = yamux::Connection::new(
            theirs.compat(),
            yamux::Config::default(),
            yamux::Mode::Client,
        );
        let mut give = Some(give);
        std::future::poll_fn(|cx| {
            if give.is_some() {
                match conn.poll_new_outbound(cx) {
                    Poll::Ready(Ok(stream)) => {
                        if let Some(g) = give.take() {
                            let _ = g.send(stream);
                        }
                    }
                    Poll::Ready(Err(_)) => return Poll::Ready(()),
                    Poll::Pending => {}
                }
            }
            // Drives the session (the server opens no streams itself).
            loop {
                match conn.poll_next_inbound(cx) {
                    Poll::Ready(Some(Ok(_))) => continue,
                    Poll::Ready(_) => return Poll::Ready(()),
                    Poll::Pending => return Poll::Pending,
                }
            }
        })
        .await;
    });
    take.await.expect("a yamux stream")
}

/// Sends the stream header `[version][port BE]`; the server's status byte.
async fn tunnel_open(s: &Server, id: &str, version: u8, port: u16) -> (u8, yamux::Stream) {
    let mut stream = tunnel_stream(s, id).await;
    let [hi, lo] = port.to_be_bytes();
    stream.write_all(&[version, hi, lo]).await.unwrap();
    stream.flush().await.unwrap();
    let mut status = [0u8; 1];
    tokio::time::timeout(Duration::from_secs(60), stream.read_exact(&mut status))
        .await
        .expect("a status byte in time")
        .expect("a status byte");
    (status[0], stream)
}

async fn tunnel(s: &Server, id: &str) {
    let r = execute(
        s,
        id,
        &json!({"command": "nc -ll -p 7000 -e cat </dev/null >/dev/null 2>&1 &"}),
    )
    .await;
    assert_eq!(r.json().unwrap()["exit_code"], 0, "{}", r.text());
    // 0: connected (2 while the listener is not up yet).
    let mut tries = 0;
    let stream = loop {
        match tunnel_open(s, id, 1, 7000).await {
            (0, stream) => break stream,
            (2, _) if tries < 50 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (status, _) => panic!("tunnel to 7000: status {status}"),
        }
    };
    let payload = Rng::new(7000).bytes(200_000);
    let (mut rd, mut wr) = futures_util::AsyncReadExt::split(stream);
    let write = async {
        wr.write_all(&payload).await.unwrap();
        wr.flush().await.unwrap();
    };
    let read = async {
        let mut echoed = vec![0u8; payload.len()];
        rd.read_exact(&mut echoed).await.unwrap();
        echoed
    };
    let ((), echoed) = tokio::time::timeout(DEADLINE, async { tokio::join!(write, read) })
        .await
        .expect("the echo in time");
    assert!(echoed == payload, "the echo differs");

    // 2: nothing listens there; 3: a header version this server lacks.
    let (status, _) = tunnel_open(s, id, 1, 7001).await;
    assert_eq!(status, 2, "a dial to a closed port");
    let (status, _) = tunnel_open(s, id, 9, 7000).await;
    assert_eq!(status, 3, "an unknown header version");
}

// ---------------------------------------------------------------------------
// Tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_plane_protocol_against_one_sandbox() {
    let mut t = Instant::now();
    let s = Server::start(true).await;
    let sb = s.sandbox("protocol").await;
    let id = sb["id"].as_str().unwrap().to_owned();
    lap("server and sandbox up", &mut t);

    ws_exec(&s, &id).await;
    lap("ws exec, stdin, pty, kill", &mut t);
    ws_reconnect(&s, &id).await;
    lap("ws reconnect", &mut t);
    ws_errors(&s, &id).await;
    lap("ws errors, timeout", &mut t);
    http_execute(&s, &id).await;
    lap("http execute", &mut t);
    files(&s, &id, &mut t).await;
    lap("ranges and errors", &mut t);
    tunnel(&s, &id).await;
    lap("tunnel", &mut t);

    let r = s
        .json(
            "DELETE",
            "/api/v2/sandboxes/boxes/protocol",
            Some(&s.admin),
            &json!({}),
        )
        .await;
    assert_eq!(r.status, 204, "{}", r.text());
    // A deleted sandbox's data plane is gone.
    assert_error(
        &execute(&s, &id, &json!({"command": "true"})).await,
        404,
        "NotFound",
    );
    s.stop().await;
}

/// Refusals that need no guest: every one in the envelope. The old host
/// API answered an unknown VM 404 as well; the control plane answers an
/// unknown (or foreign) sandbox 404 `NotFound` on every data-plane route.
#[tokio::test]
async fn bad_requests_get_the_envelope() {
    let s = Server::start(false).await;
    let unknown = uuid::Uuid::now_v7().to_string();
    let dp = format!("/dataplane/{unknown}");

    assert_error(
        &execute(&s, &unknown, &json!({"command": "true"})).await,
        404,
        "NotFound",
    );
    assert_error(
        &download(&s, &unknown, "/etc/hostname", &[]).await,
        404,
        "NotFound",
    );
    assert_error(&upload(&s, &unknown, "/tmp/x", b"x").await, 404, "NotFound");
    let r = s
        .json(
            "POST",
            &format!("{dp}/execute/stream/start"),
            Some(&s.admin),
            &json!({"command": "true"}),
        )
        .await;
    assert_error(&r, 404, "NotFound");

    // The body is checked before the sandbox is looked up: 422 naming the
    // field (FastAPI's list form), 413 on the declared length.
    for (body, field) in [
        (json!({"command": 5}), "command"),
        (json!({"timeout": 1}), "command"),
        (json!({"command": "true", "timeout": "soon"}), "timeout"),
        (json!({"command": "true", "env": {"A": 1}}), "A"),
    ] {
        let r = execute(&s, &unknown, &body).await;
        assert_eq!(
            (r.status, r.field()),
            (422, field.to_owned()),
            "{body}: {}",
            r.text()
        );
        assert_eq!(envelope_problem(&r), None, "{body}");
    }
    let r = request(
        &s,
        "POST",
        &format!("{dp}/execute"),
        &[("content-type", "application/json")],
        b"{\"command\":".to_vec(),
    )
    .await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert_eq!(envelope_problem(&r), None);
    let r = request(
        &s,
        "POST",
        &format!("{dp}/execute"),
        &[
            ("content-type", "application/json"),
            ("content-length", "1048577"),
        ],
        Vec::new(),
    )
    .await;
    assert_error(&r, 413, "PayloadTooLarge");

    // WebSocket routes: a plain GET is refused in the envelope; a handshake
    // to an unknown sandbox fails with the 404 in the envelope.
    for route in ["execute/ws", "tunnel"] {
        let r = request(&s, "GET", &format!("{dp}/{route}"), &[], Vec::new()).await;
        assert_error(&r, 400, "InvalidRequest");
        match ws_connect(&s, &format!("{dp}/{route}")).await {
            Err(tungstenite::Error::Http(resp)) => {
                assert_eq!(resp.status(), 404, "{route}");
                let body: Value =
                    serde_json::from_slice(resp.body().as_deref().unwrap_or_default())
                        .unwrap_or_default();
                assert_eq!(body["detail"]["error"], "NotFound", "{route}: {body}");
            }
            other => panic!("{route} on an unknown sandbox: {other:?}"),
        }
    }
    s.stop().await;
}
