//! The host agent's HTTP + WebSocket API against a real microVM (TCG here),
//! through a real socket: a hand-written HTTP/1.1 client and
//! tokio-tungstenite for the WebSockets.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use futures_util::{SinkExt, StreamExt};
use hearth_host::Host;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::{self, Message};

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>;

const DEADLINE: Duration = Duration::from_secs(120);

struct Api {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn start_api(host: Arc<Host>) -> Api {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(hearth_host::api::serve(host, listener, async move {
        let _ = stopped.await;
    }));
    Api { addr, stop, server }
}

impl Api {
    async fn shutdown(self) {
        let _ = self.stop.send(());
        let r = tokio::time::timeout(Duration::from_secs(15), self.server)
            .await
            .expect("serve returns after shutdown")
            .unwrap();
        r.expect("serve ends cleanly");
    }
}

#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "{} is not JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// Asserts LangSmith's error envelope with this status and type.
    fn assert_error(&self, status: u16, error: &str) {
        let v = self.json();
        assert_eq!(self.status, status, "{v}");
        assert_eq!(v["detail"]["error"], error, "{v}");
        let id = v["detail"]["error_id"].as_str().expect("error_id");
        uuid::Uuid::parse_str(id).expect("error_id is a uuid");
        assert!(v["detail"]["message"].is_string(), "{v}");
    }
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`).
async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    tokio::time::timeout(DEADLINE, http_inner(addr, method, path, headers, body))
        .await
        .unwrap_or_else(|_| panic!("{method} {path} did not answer"))
}

async fn http_inner(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-length"))
    {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();

    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("response head");
    let head = String::from_utf8(raw[..end].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let mut resp = Resp {
        status,
        headers,
        body: raw[end + 4..].to_vec(),
    };
    if resp
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        resp.body = dechunk(&resp.body);
    } else if let Some(len) = resp.header("content-length") {
        let len: usize = len.parse().unwrap();
        assert_eq!(resp.body.len(), len, "body shorter than its Content-Length");
    }
    resp
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n").expect("chunk size");
        let size_text = std::str::from_utf8(&b[..eol]).unwrap();
        let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16).unwrap();
        b = &b[eol + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

async fn get(addr: SocketAddr, path: &str) -> Resp {
    http(addr, "GET", path, &[], b"").await
}

async fn post_json(addr: SocketAddr, path: &str, body: &Value) -> Resp {
    let body = serde_json::to_vec(body).unwrap();
    http(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        &body,
    )
    .await
}

async fn ws_connect(addr: SocketAddr, path: &str) -> Result<Ws, tungstenite::Error> {
    let url = format!("ws://{addr}{path}");
    tokio::time::timeout(DEADLINE, tokio_tungstenite::connect_async(url))
        .await
        .expect("websocket handshake answers")
        .map(|(ws, _)| ws)
}

async fn send_json(ws: &mut Ws, v: Value) {
    ws.send(Message::Text(v.to_string().into())).await.unwrap();
}

/// The next JSON text frame; `None` once the server closed.
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
            Some(Err(e)) => panic!("websocket error {e}"),
            None => return None,
        }
    }
}

/// What one exec WebSocket delivered until the server closed it.
#[derive(Debug, Default)]
struct Run {
    started: Option<Value>,
    stdout: String,
    stderr: String,
    exit_code: Option<i64>,
    error: Option<Value>,
}

/// Reads frames until the close, checking the offsets are contiguous from
/// `from` (stdout, stderr).
async fn collect(ws: &mut Ws, from: (u64, u64)) -> Run {
    let mut run = Run::default();
    let mut next = [from.0, from.1];
    while let Some(f) = next_json(ws).await {
        match f["type"].as_str().unwrap() {
            "started" => run.started = Some(f),
            t @ ("stdout" | "stderr") => {
                let idx = usize::from(t == "stderr");
                let data = f["data"].as_str().unwrap();
                assert_eq!(f["offset"].as_u64(), Some(next[idx]), "{f}");
                next[idx] += data.len() as u64;
                if idx == 0 {
                    run.stdout.push_str(data);
                } else {
                    run.stderr.push_str(data);
                }
            }
            "exit" => run.exit_code = f["exit_code"].as_i64(),
            "error" => run.error = Some(f),
            other => panic!("unknown frame type {other}: {f}"),
        }
    }
    run
}

async fn ws_run(addr: SocketAddr, id: &str, execute: Value) -> Run {
    let mut ws = ws_connect(addr, &format!("/v1/vms/{id}/exec/ws"))
        .await
        .unwrap();
    send_json(&mut ws, execute).await;
    collect(&mut ws, (0, 0)).await
}

fn random_bytes(len: usize, seed: &str) -> Vec<u8> {
    let mut data = vec![0u8; len];
    blake3::Hasher::new()
        .update(seed.as_bytes())
        .finalize_xof()
        .fill(&mut data);
    data
}

fn lap(what: &str, t: &mut Instant) {
    eprintln!("[api test] {what}: {:.2?}", t.elapsed());
    *t = Instant::now();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_vm_over_http_and_websockets() {
    let mut t = Instant::now();
    let host = host().await;
    let api = start_api(host).await;
    let addr = api.addr;
    lap("host agent up", &mut t);

    // Create over HTTP: 201 once ready.
    let r = post_json(
        addr,
        "/v1/vms",
        &json!({"image": "busybox", "memory": 256u64 << 20}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let rec = r.json();
    assert_eq!(rec["state"], "ready", "{rec}");
    assert_eq!(rec["image"], "busybox");
    let id = rec["id"].as_str().unwrap().to_owned();
    lap("create vm", &mut t);

    let r = get(addr, &format!("/v1/vms/{id}")).await;
    assert_eq!(
        (r.status, r.json()["id"].as_str()),
        (200, Some(id.as_str()))
    );
    let r = get(addr, "/v1/vms").await;
    assert!(r.json()["vms"]
        .as_array()
        .unwrap()
        .iter()
        .any(|v| v["id"] == id.as_str()));
    let r = get(addr, &format!("/v1/vms/{id}/info")).await;
    assert_eq!(r.status, 200);
    assert!(r.json()["kernel_release"].is_string(), "{}", r.json());

    // WebSocket exec: started, separate outputs with byte offsets, exit code.
    let run = ws_run(
        addr,
        &id,
        json!({"type": "execute", "command": "echo hi; echo err >&2; exit 4"}),
    )
    .await;
    let started = run.started.as_ref().expect("started frame");
    assert!(
        started["command_id"].is_string() && started["pid"].as_u64().is_some(),
        "{started}"
    );
    assert_eq!(
        (run.stdout.as_str(), run.stderr.as_str(), run.exit_code),
        ("hi\n", "err\n", Some(4)),
        "{run:?}"
    );
    lap("ws exec", &mut t);

    // Multi-byte characters arrive intact; env, cwd and user are honoured.
    let run = ws_run(
        addr,
        &id,
        json!({"type": "execute", "command": "printf 'caf\\303\\251 \\342\\202\\254\\n'; echo $FOO; pwd; id -u",
               "env": {"FOO": "bar"}, "cwd": "/tmp", "user": "user"}),
    )
    .await;
    assert_eq!(run.stdout, "café €\nbar\n/tmp\n1000\n", "{run:?}");

    // stdin through input frames, then close_stdin.
    let mut ws = ws_connect(addr, &format!("/v1/vms/{id}/exec/ws"))
        .await
        .unwrap();
    send_json(
        &mut ws,
        json!({"type": "execute", "command": "cat; echo done"}),
    )
    .await;
    assert_eq!(next_json(&mut ws).await.unwrap()["type"], "started");
    send_json(&mut ws, json!({"type": "input", "data": "ping\n"})).await;
    send_json(&mut ws, json!({"type": "close_stdin"})).await;
    let run = collect(&mut ws, (0, 0)).await;
    assert_eq!(
        (run.stdout.as_str(), run.exit_code),
        ("ping\ndone\n", Some(0)),
        "{run:?}"
    );

    // PTY: a terminal of the default size; resize is seen.
    let mut ws = ws_connect(addr, &format!("/v1/vms/{id}/exec/ws"))
        .await
        .unwrap();
    send_json(
        &mut ws,
        json!({"type": "execute", "command": "stty size; read x; stty size", "pty": true}),
    )
    .await;
    assert_eq!(next_json(&mut ws).await.unwrap()["type"], "started");
    let mut seen = String::new();
    while !seen.contains("24 80") {
        let f = next_json(&mut ws).await.expect("pty output");
        seen.push_str(f["data"].as_str().unwrap_or_default());
    }
    send_json(&mut ws, json!({"type": "resize", "rows": 30, "cols": 100})).await;
    send_json(&mut ws, json!({"type": "input", "data": "\n"})).await;
    let run = collect(&mut ws, (seen.len() as u64, 0)).await;
    assert!(run.stdout.contains("30 100"), "{run:?}");
    assert_eq!(run.exit_code, Some(0));
    lap("ws stdin, pty", &mut t);

    // Reconnect: drop the socket midway, re-attach from the offsets we
    // hold, and get every line exactly once.
    let command_id = format!("api-{}", uuid::Uuid::new_v4().simple());
    let cmd = "for i in $(seq 1 50); do echo line$i; sleep 0.05; done";
    let mut ws = ws_connect(addr, &format!("/v1/vms/{id}/exec/ws"))
        .await
        .unwrap();
    send_json(
        &mut ws,
        json!({"type": "execute", "command": cmd, "command_id": command_id}),
    )
    .await;
    let f = next_json(&mut ws).await.unwrap();
    assert_eq!(
        (f["type"].as_str(), f["command_id"].as_str()),
        (Some("started"), Some(command_id.as_str()))
    );
    let mut got = String::new();
    while got.lines().count() < 5 {
        let f = next_json(&mut ws).await.expect("output before the drop");
        assert_eq!(f["type"], "stdout", "{f}");
        assert_eq!(f["offset"].as_u64(), Some(got.len() as u64), "{f}");
        got.push_str(f["data"].as_str().unwrap());
    }
    drop(ws);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut ws = ws_connect(addr, &format!("/v1/vms/{id}/exec/ws"))
        .await
        .unwrap();
    send_json(
        &mut ws,
        json!({"type": "reconnect", "command_id": command_id, "stdout_offset": got.len(), "stderr_offset": 0}),
    )
    .await;
    let run = collect(&mut ws, (got.len() as u64, 0)).await;
    assert_eq!(
        run.started.as_ref().unwrap()["command_id"],
        command_id.as_str()
    );
    assert_eq!(run.exit_code, Some(0), "{run:?}");
    got.push_str(&run.stdout);
    let want: String = (1..=50).map(|i| format!("line{i}\n")).collect();
    assert_eq!(got, want);
    lap("ws reconnect", &mut t);

    // Kill over the WebSocket.
    let mut ws = ws_connect(addr, &format!("/v1/vms/{id}/exec/ws"))
        .await
        .unwrap();
    send_json(&mut ws, json!({"type": "execute", "command": "sleep 100"})).await;
    assert_eq!(next_json(&mut ws).await.unwrap()["type"], "started");
    send_json(&mut ws, json!({"type": "kill"})).await;
    let run = collect(&mut ws, (0, 0)).await;
    assert_eq!(run.exit_code, Some(137), "{run:?}");

    // Bad first frames and unknown commands are error frames, then a close.
    let mut ws = ws_connect(addr, &format!("/v1/vms/{id}/exec/ws"))
        .await
        .unwrap();
    send_json(&mut ws, json!({"type": "launch", "command": "true"})).await;
    let run = collect(&mut ws, (0, 0)).await;
    assert_eq!(
        run.error.as_ref().unwrap()["error_type"],
        "CommandError",
        "{run:?}"
    );
    let mut ws = ws_connect(addr, &format!("/v1/vms/{id}/exec/ws"))
        .await
        .unwrap();
    send_json(
        &mut ws,
        json!({"type": "reconnect", "command_id": "no-such-command", "stdout_offset": 0, "stderr_offset": 0}),
    )
    .await;
    let run = collect(&mut ws, (0, 0)).await;
    assert_eq!(
        run.error.as_ref().unwrap()["error_type"],
        "CommandNotFound",
        "{run:?}"
    );
    let r = ws_run(
        addr,
        &id,
        json!({"type": "execute", "command": "sleep 10", "timeout_seconds": 1}),
    )
    .await;
    assert_eq!(
        r.error.as_ref().unwrap()["error_type"],
        "CommandTimeout",
        "{r:?}"
    );
    lap("ws kill, errors, timeout", &mut t);

    // Blocking HTTP exec.
    let r = post_json(
        addr,
        &format!("/v1/vms/{id}/exec"),
        &json!({"command": "echo hi; echo oops >&2; exit 3"}),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.json(),
        json!({"stdout": "hi\n", "stderr": "oops\n", "exit_code": 3})
    );
    let r = post_json(
        addr,
        &format!("/v1/vms/{id}/exec"),
        &json!({"command": "sleep 10", "timeout": 1}),
    )
    .await;
    r.assert_error(408, "CommandTimeout");
    let r = post_json(addr, &format!("/v1/vms/{id}/exec"), &json!({"timeout": 1})).await;
    r.assert_error(422, "ValidationError");
    // A start the request makes impossible is the caller's mistake.
    for body in [
        json!({"command": "true", "cwd": "/no/such/dir"}),
        json!({"command": "true", "shell": "/no/such/shell"}),
    ] {
        let r = post_json(addr, &format!("/v1/vms/{id}/exec"), &body).await;
        r.assert_error(400, "CommandError");
    }
    lap("http exec", &mut t);

    // Files: 16 MiB up and down, byte ranges, stat, list, mkdir, remove.
    let data = random_bytes(16 << 20, "api upload");
    let r = http(
        addr,
        "PUT",
        &format!("/v1/vms/{id}/files?path=/tmp/big.bin&mode=600"),
        &[],
        &data,
    )
    .await;
    assert_eq!((r.status, r.json()), (200, json!({"bytes": data.len()})));
    lap("upload 16 MiB", &mut t);
    let r = get(addr, &format!("/v1/vms/{id}/files?path=/tmp/big.bin")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    assert_eq!(r.body.len(), data.len());
    assert_eq!(blake3::hash(&r.body), blake3::hash(&data));
    lap("download 16 MiB", &mut t);
    let path = format!("/v1/vms/{id}/files?path=/tmp/big.bin");
    let r = http(addr, "GET", &path, &[("Range", "bytes=1000-1999")], b"").await;
    assert_eq!(r.status, 206);
    assert_eq!(r.header("content-range"), Some("bytes 1000-1999/16777216"));
    assert_eq!(r.body, &data[1000..2000]);
    let r = http(addr, "GET", &path, &[("Range", "bytes=-100")], b"").await;
    assert_eq!(
        (r.status, r.header("content-range")),
        (206, Some("bytes 16777116-16777215/16777216"))
    );
    assert_eq!(r.body, &data[data.len() - 100..]);
    let r = http(addr, "GET", &path, &[("Range", "bytes=16777000-")], b"").await;
    assert_eq!((r.status, r.body.as_slice()), (206, &data[16777000..]));
    let r = http(addr, "GET", &path, &[("Range", "bytes=16777216-")], b"").await;
    r.assert_error(416, "RangeNotSatisfiable");
    assert_eq!(r.header("content-range"), Some("bytes */16777216"));

    let r = get(addr, &format!("/v1/vms/{id}/files/stat?path=/tmp/big.bin")).await;
    let st = r.json();
    assert_eq!(
        (
            st["size"].as_u64(),
            st["kind"].as_str(),
            st["mode"].as_u64()
        ),
        (Some(16 << 20), Some("file"), Some(0o600)),
        "{st}"
    );
    let r = http(
        addr,
        "POST",
        &format!("/v1/vms/{id}/files/mkdir?path=/tmp/d/e&parents=true"),
        &[],
        b"",
    )
    .await;
    assert_eq!(r.status, 204);
    let r = http(
        addr,
        "PUT",
        &format!("/v1/vms/{id}/files?path=/tmp/d/f.txt"),
        &[],
        b"hello",
    )
    .await;
    assert_eq!(r.json(), json!({"bytes": 5}));
    let r = get(addr, &format!("/v1/vms/{id}/files/list?path=/tmp/d")).await;
    let entries = r.json();
    let names: Vec<&str> = entries["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["e", "f.txt"]);
    let r = get(addr, &format!("/v1/vms/{id}/files?path=/tmp/d/f.txt")).await;
    assert_eq!(r.body, b"hello");
    get(addr, &format!("/v1/vms/{id}/files?path=/tmp/nope"))
        .await
        .assert_error(404, "FileNotFound");
    get(addr, &format!("/v1/vms/{id}/files?path=/tmp/d"))
        .await
        .assert_error(400, "IsADirectory");
    get(addr, &format!("/v1/vms/{id}/files"))
        .await
        .assert_error(400, "ValidationError");
    http(
        addr,
        "POST",
        &format!("/v1/vms/{id}/files/mkdir?path=/tmp/d"),
        &[],
        b"",
    )
    .await
    .assert_error(409, "Conflict");
    // A non-empty directory needs recursive=true.
    let r = http(
        addr,
        "DELETE",
        &format!("/v1/vms/{id}/files?path=/tmp/d"),
        &[],
        b"",
    )
    .await;
    assert!(r.status >= 400, "{r:?}");
    r.assert_error(r.status, r.json()["detail"]["error"].as_str().unwrap());
    let r = http(
        addr,
        "DELETE",
        &format!("/v1/vms/{id}/files?path=/tmp/d&recursive=true"),
        &[],
        b"",
    )
    .await;
    assert_eq!(r.status, 204);
    get(addr, &format!("/v1/vms/{id}/files/stat?path=/tmp/d"))
        .await
        .assert_error(404, "FileNotFound");
    lap("files", &mut t);

    // TCP tunnel to an echo server inside the guest.
    let r = post_json(
        addr,
        &format!("/v1/vms/{id}/exec"),
        &json!({"command": "nc -ll -p 7000 -e cat </dev/null >/dev/null 2>&1 &"}),
    )
    .await;
    assert_eq!(r.json()["exit_code"], 0, "{}", r.json());
    let tcp_path = format!("/v1/vms/{id}/tcp?port=7000");
    let mut tries = 0;
    let mut ws = loop {
        match ws_connect(addr, &tcp_path).await {
            Ok(ws) => break ws,
            Err(tungstenite::Error::Http(resp)) if resp.status() == 502 && tries < 50 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("tcp websocket: {e:?}"),
        }
    };
    let payload = random_bytes(200_000, "tcp");
    ws.send(Message::Binary(payload.clone().into()))
        .await
        .unwrap();
    let mut echoed = Vec::new();
    while echoed.len() < payload.len() {
        match tokio::time::timeout(DEADLINE, ws.next())
            .await
            .expect("echo in time")
        {
            Some(Ok(Message::Binary(b))) => echoed.extend_from_slice(&b),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(echoed == payload, "echo differs");
    ws.close(None).await.unwrap();
    match ws_connect(addr, &format!("/v1/vms/{id}/tcp?port=7001")).await {
        Err(tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status(), 502);
            let body: Value = serde_json::from_slice(resp.body().as_deref().unwrap()).unwrap();
            assert_eq!(body["detail"]["error"], "ConnectionError", "{body}");
        }
        other => panic!("dial to a closed port: {other:?}"),
    }
    lap("tcp", &mut t);

    // Lifecycle: pause makes guest operations a conflict until resume.
    let r = http(addr, "POST", &format!("/v1/vms/{id}/pause"), &[], b"").await;
    assert_eq!(
        (r.status, r.json()["state"].as_str()),
        (200, Some("paused"))
    );
    post_json(
        addr,
        &format!("/v1/vms/{id}/exec"),
        &json!({"command": "true"}),
    )
    .await
    .assert_error(409, "Conflict");
    match ws_connect(addr, &format!("/v1/vms/{id}/exec/ws")).await {
        Err(tungstenite::Error::Http(resp)) => assert_eq!(resp.status(), 409),
        other => panic!("exec on a paused vm: {other:?}"),
    }
    let r = http(addr, "POST", &format!("/v1/vms/{id}/resume"), &[], b"").await;
    assert_eq!(r.json()["state"], "ready");
    let r = post_json(
        addr,
        &format!("/v1/vms/{id}/exec"),
        &json!({"command": "echo back"}),
    )
    .await;
    assert_eq!(r.json()["stdout"], "back\n");
    let r = http(addr, "DELETE", &format!("/v1/vms/{id}"), &[], b"").await;
    assert_eq!((r.status, r.body.len()), (204, 0));
    get(addr, &format!("/v1/vms/{id}"))
        .await
        .assert_error(404, "NotFound");
    lap("pause, resume, delete", &mut t);

    api.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_the_error_envelope() {
    let host = host().await;
    let api = start_api(host).await;
    let addr = api.addr;

    let r = get(addr, "/healthz").await;
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["status"], "ok");
    assert!(v["accel"] == "tcg" || v["accel"] == "kvm", "{v}");
    assert_eq!(get(addr, "/v1/vms").await.json(), json!({"vms": []}));

    let unknown = uuid::Uuid::now_v7().simple().to_string();
    get(addr, &format!("/v1/vms/{unknown}"))
        .await
        .assert_error(404, "NotFound");
    get(addr, &format!("/v1/vms/{unknown}/files?path=/etc/hosts"))
        .await
        .assert_error(404, "NotFound");
    http(addr, "DELETE", &format!("/v1/vms/{unknown}"), &[], b"")
        .await
        .assert_error(404, "NotFound");
    get(addr, "/v1/vms/not-an-id")
        .await
        .assert_error(400, "ValidationError");
    get(addr, "/v1/nothing-here")
        .await
        .assert_error(404, "NotFound");
    http(addr, "PATCH", "/v1/vms", &[], b"")
        .await
        .assert_error(405, "MethodNotAllowed");

    // Malformed JSON is a 400; the wrong shape a 422. Nothing boots.
    let r = http(
        addr,
        "POST",
        "/v1/vms",
        &[("Content-Type", "application/json")],
        b"{\"image\":",
    )
    .await;
    r.assert_error(400, "ValidationError");
    post_json(addr, "/v1/vms", &json!({"memory": "lots"}))
        .await
        .assert_error(422, "ValidationError");
    post_json(addr, "/v1/vms", &json!({"image": "windows"}))
        .await
        .assert_error(422, "ValidationError");
    post_json(addr, "/v1/vms", &json!({"memory": 1000}))
        .await
        .assert_error(422, "ValidationError");
    post_json(
        addr,
        &format!("/v1/vms/{unknown}/exec"),
        &json!({"command": 5}),
    )
    .await
    .assert_error(422, "ValidationError");
    // Refused on the declared length, before the body is read.
    http(
        addr,
        "POST",
        "/v1/vms",
        &[("Content-Length", "1048577")],
        b"",
    )
    .await
    .assert_error(413, "PayloadTooLarge");

    // WebSocket routes: a plain GET is refused; an unknown VM fails the handshake.
    let r = get(addr, &format!("/v1/vms/{unknown}/exec/ws")).await;
    assert!((400..500).contains(&r.status), "{r:?}");
    r.assert_error(r.status, "ValidationError");
    match ws_connect(addr, &format!("/v1/vms/{unknown}/exec/ws")).await {
        Err(tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status(), 404);
            let body: Value = serde_json::from_slice(resp.body().as_deref().unwrap()).unwrap();
            assert_eq!(body["detail"]["error"], "NotFound", "{body}");
        }
        other => panic!("exec ws on an unknown vm: {other:?}"),
    }
    get(addr, &format!("/v1/vms/{unknown}/tcp?port=99999"))
        .await
        .assert_error(400, "ValidationError");

    api.shutdown().await;
}
