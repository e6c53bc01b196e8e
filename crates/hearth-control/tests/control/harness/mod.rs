//! Shared by the suites of `tests/control/`: a control plane
//! served on a loopback port by `hearth_control::serve` (the real server,
//! so hyper's own parsing is part of what is tested), optionally with a
//! real host agent booting busybox microVMs, and a raw HTTP/1.1 client
//! that can send anything, including malformed heads and bodies.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hearth_control::{Control, ControlConfig, LocalHost};
use hearth_db::{Db, NewWorkspace, Quotas};
use hearth_host::{Host, HostConfig};
use hearth_types::{ByteSize, HostId, MilliCpu, WorkspaceId};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub fn shared_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/hearth-test")
}

/// The settings of a test's control plane. No reaper loop runs in these
/// tests, so nothing renews the in-process hosts' leases: a test's lease
/// outlasts the test. (With the default 30 s, a test that ran longer, as
/// under four test threads, found its host's lease expired and every
/// create answered 503 `NoSandboxHostsAvailable`.) Tests of leases set
/// their own.
pub fn test_config() -> ControlConfig {
    ControlConfig {
        lease: Duration::from_secs(3600),
        sandbox_domain: Some(TEST_DOMAIN.into()),
        ..ControlConfig::default()
    }
}

/// The sandbox domain of the test servers (`{port}-{id}.hearth.test`).
pub const TEST_DOMAIN: &str = "hearth.test";

/// A host agent on a fresh data directory sharing the test image cache.
pub async fn host() -> Arc<Host> {
    let shared = shared_dir();
    let data = shared
        .join("hosts")
        .join(uuid::Uuid::now_v7().simple().to_string());
    std::fs::create_dir_all(shared.join("artifacts")).unwrap();
    std::fs::create_dir_all(&data).unwrap();
    std::os::unix::fs::symlink(shared.join("artifacts"), data.join("artifacts")).unwrap();
    let mut cfg = HostConfig::new(&data);
    cfg.accel_cache = shared.join("accel.json");
    Host::start(cfg, Arc::new(hearth_image::QuietProgress))
        .await
        .unwrap()
}

/// A new workspace named `name` with `quotas`, and an API key with every
/// permission in it.
pub async fn workspace_key(db: &Db, name: &str, quotas: Quotas) -> (WorkspaceId, String) {
    let ws = WorkspaceId::new();
    db.create_workspace(&NewWorkspace {
        id: ws,
        name: name.into(),
        quotas,
    })
    .await
    .unwrap();
    let key = hearth_control::auth::create_key(db, ws, &["*"], "")
        .await
        .unwrap()
        .1;
    (ws, key)
}

/// A control plane over `db` and one simulated host (`SimHost`) with room
/// for whatever a test asks (64 vCPUs, 256 GiB).
pub async fn sim_control(db: Db) -> (Arc<Control>, Arc<hearth_hostapi::SimHost>) {
    sim_control_with(db, test_config()).await
}

/// [`sim_control`] with `cfg`.
pub async fn sim_control_with(
    db: Db,
    cfg: ControlConfig,
) -> (Arc<Control>, Arc<hearth_hostapi::SimHost>) {
    let host = Arc::new(hearth_hostapi::SimHost::new());
    let hosts = vec![LocalHost {
        id: HostId::new(),
        host: host.clone(),
        capacity_cpu: MilliCpu::vcpus(64),
        capacity_mem: ByteSize::gib(256),
        store_url: String::new(),
    }];
    let control = Control::open(db, cfg, hosts).await.unwrap();
    (control, host)
}

/// One simulated host (64 vCPUs, 256 GiB) as the control plane's only
/// host, and the host.
fn one_sim_host() -> (Vec<LocalHost>, Arc<hearth_hostapi::SimHost>) {
    let sim = Arc::new(hearth_hostapi::SimHost::new());
    let hosts = vec![LocalHost {
        id: HostId::new(),
        host: sim.clone(),
        capacity_cpu: MilliCpu(64_000),
        capacity_mem: ByteSize::gib(256),
        store_url: String::new(),
    }];
    (hosts, sim)
}

/// A served control plane and the keys of its two workspaces.
pub struct Server {
    pub addr: SocketAddr,
    pub control: Arc<Control>,
    /// The control plane's database, for a test to seed and inspect rows
    /// (the control plane keeps its own handle private).
    pub db: Db,
    /// The control plane's settings.
    pub cfg: ControlConfig,
    /// Every permission, in a workspace allowed one sandbox (so a create
    /// that slips through a fuzz case is refused instead of booting).
    pub admin: String,
    /// Every permission, in a second workspace.
    pub other: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    _db: hearth_db::testing::TestUrl,
}

impl Server {
    /// Starts the server; with `with_host`, a host agent too.
    pub async fn start(with_host: bool) -> Server {
        let hosts = if with_host {
            vec![LocalHost {
                id: HostId::new(),
                host: Arc::new(hearth_host::InProcessHost::new(host().await)),
                capacity_cpu: MilliCpu(64_000),
                capacity_mem: ByteSize::gib(256),
                store_url: String::new(),
            }]
        } else {
            Vec::new()
        };
        Self::start_with(hosts).await
    }

    /// Starts the server over one simulated host (`SimHost`, 64 vCPUs and
    /// 256 GiB), which it returns too.
    pub async fn on_sim() -> (Server, Arc<hearth_hostapi::SimHost>) {
        let (hosts, sim) = one_sim_host();
        (Self::start_with(hosts).await, sim)
    }

    /// [`Self::on_sim`] with a control-plane signing key (as `hearth up`
    /// has: its tokens verify against `/.well-known/jwks.json`).
    pub async fn on_sim_signed() -> (Server, Arc<hearth_hostapi::SimHost>) {
        let (hosts, sim) = one_sim_host();
        let signer = hearth_fence::Signer::new(
            hearth_fence::KeyPair::generate().unwrap(),
            Duration::from_secs(60),
        );
        let cfg = ControlConfig {
            signer: Some(Arc::new(signer)),
            ..test_config()
        };
        (Self::start_with_config(hosts, cfg).await, sim)
    }

    /// [`Self::on_sim`] with the reapers running, a pass every
    /// `interval` (deadlines have a timer of their own beside them).
    pub async fn on_sim_reaping(interval: Duration) -> (Server, Arc<hearth_hostapi::SimHost>) {
        let (hosts, sim) = one_sim_host();
        let cfg = ControlConfig {
            reaper_interval: interval,
            ..test_config()
        };
        let s = Self::start_with_config(hosts, cfg).await;
        tokio::spawn(s.control.clone().run_reapers());
        (s, sim)
    }

    async fn start_with(hosts: Vec<LocalHost>) -> Server {
        Self::start_with_config(hosts, test_config()).await
    }

    async fn start_with_config(hosts: Vec<LocalHost>, cfg: ControlConfig) -> Server {
        let url = hearth_db::testing::sqlite_url();
        let db = Db::connect(&url.url).await.unwrap();
        let mut keys = Vec::new();
        for (i, max_sandboxes) in [Some(1), None].into_iter().enumerate() {
            let ws = WorkspaceId::new();
            db.create_workspace(&NewWorkspace {
                id: ws,
                name: format!("ws{i}"),
                quotas: Quotas {
                    max_sandboxes,
                    ..Quotas::default()
                },
            })
            .await
            .unwrap();
            let key = hearth_control::auth::create_key(&db, ws, &["*"], "")
                .await
                .unwrap()
                .1;
            keys.push(key);
        }
        let cfg = ControlConfig {
            default_snapshot: ("busybox".into(), "latest".into()),
            ..cfg
        };
        let control = Control::open(db.clone(), cfg.clone(), hosts).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(hearth_control::serve(control.clone(), listener, async {
            let _ = stopped.await;
        }));
        Server {
            addr,
            control,
            db,
            cfg,
            admin: keys[0].clone(),
            other: keys[1].clone(),
            stop: Some(stop),
            task: Some(task),
            _db: url,
        }
    }

    /// Creates a ready busybox sandbox with the admin key; its response.
    pub async fn sandbox(&self, name: &str) -> Value {
        let body = serde_json::json!({
            "name": name, "snapshot": "busybox", "mem_bytes": 2u64 << 30,
            "wait_for_ready": true, "timeout": 120,
        });
        let r = self
            .json("POST", "/api/v2/sandboxes/boxes", Some(&self.admin), &body)
            .await;
        assert_eq!(r.status, 201, "{}", r.text());
        r.json().unwrap()
    }

    /// A JSON request; the answer.
    pub async fn json(&self, method: &str, path: &str, key: Option<&str>, body: &Value) -> Resp {
        let mut headers = vec![("content-type".to_owned(), "application/json".to_owned())];
        if let Some(k) = key {
            headers.push(("x-api-key".to_owned(), k.to_owned()));
        }
        let req = RawRequest::new(method, path, &headers, body.to_string().into_bytes());
        send(self.addr, &req.bytes()).await
    }

    /// Stops the server and waits until it has.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(30), task)
                .await
                .expect("the server stops")
                .unwrap()
                .unwrap();
        }
    }
}

/// A request as bytes on the wire: head, then `body` as is (with a
/// `Content-Length` unless `chunked` or one is among the headers).
pub struct RawRequest {
    pub method: String,
    /// Already percent-encoded as it should appear on the wire.
    pub target: Vec<u8>,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Sent as is after the head, with `Transfer-Encoding: chunked`.
    pub chunked: Option<Vec<u8>>,
}

impl RawRequest {
    pub fn new(method: &str, target: &str, headers: &[(String, String)], body: Vec<u8>) -> Self {
        Self {
            method: method.to_owned(),
            target: target.as_bytes().to_vec(),
            headers: headers.to_vec(),
            body,
            chunked: None,
        }
    }

    pub fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.body.len() + 512);
        out.extend_from_slice(self.method.as_bytes());
        out.push(b' ');
        out.extend_from_slice(&self.target);
        out.extend_from_slice(b" HTTP/1.1\r\n");
        // A Host of the request's own, else loopback's.
        if !self
            .headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("host"))
        {
            out.extend_from_slice(b"host: 127.0.0.1\r\n");
        }
        // One request per connection, unless the request speaks of its
        // connection itself (an upgrade).
        if !self
            .headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("connection"))
        {
            out.extend_from_slice(b"connection: close\r\n");
        }
        for (k, v) in &self.headers {
            out.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
        }
        let has_length = self
            .headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-length"));
        match &self.chunked {
            Some(raw) => {
                out.extend_from_slice(b"transfer-encoding: chunked\r\n\r\n");
                out.extend_from_slice(raw);
            }
            None => {
                if !has_length {
                    out.extend_from_slice(
                        format!("content-length: {}\r\n", self.body.len()).as_bytes(),
                    );
                }
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(&self.body);
            }
        }
        out
    }
}

/// An answer: status, headers (names lowercase) and, for everything but a
/// 1xx or a streamed 2xx, the body.
#[derive(Debug, Default)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// `detail.error` of the object envelope.
    pub fn error(&self) -> String {
        self.json()
            .and_then(|v| v["detail"]["error"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    /// The last step of `detail[0].loc` of the validation list form.
    pub fn field(&self) -> String {
        self.json()
            .and_then(|v| {
                v["detail"][0]["loc"]
                    .as_array()
                    .and_then(|l| l.last().cloned())
            })
            .and_then(|f| f.as_str().map(str::to_owned))
            .unwrap_or_default()
    }
}

/// Why an error answer is not in LangSmith's envelope, if it is not:
/// `{"detail": {"error", "error_id", "message"}}`, or FastAPI's
/// `{"detail": [{"loc": [...], "msg", "type"}]}`.
pub fn envelope_problem(r: &Resp) -> Option<String> {
    let Some(v) = r.json() else {
        return Some(format!("body is not JSON: {:?}", truncate(&r.text())));
    };
    match &v["detail"] {
        Value::Object(d) => {
            for f in ["error", "error_id", "message"] {
                if !d.get(f).is_some_and(Value::is_string) {
                    return Some(format!("detail.{f} is not a string: {v}"));
                }
            }
            None
        }
        Value::Array(items) if !items.is_empty() => {
            let ok = items
                .iter()
                .all(|i| i["loc"].is_array() && i["msg"].is_string() && i["type"].is_string());
            (!ok).then(|| format!("malformed validation list: {v}"))
        }
        _ => Some(format!(
            "no detail object or list: {}",
            truncate(&v.to_string())
        )),
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(300).collect()
}

/// Sends `raw` on a fresh connection and reads the answer (at most 60 s).
/// The request is written while the answer is read, so a server that
/// answers early (a 413 before the body) is heard.
pub async fn send(addr: SocketAddr, raw: &[u8]) -> Resp {
    tokio::time::timeout(Duration::from_secs(60), exchange(addr, raw.to_vec()))
        .await
        .unwrap_or_else(|_| panic!("no answer within 60 s to {:?}", head_of(raw)))
}

fn head_of(raw: &[u8]) -> String {
    let end = raw.len().min(200);
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

async fn exchange(addr: SocketAddr, raw: Vec<u8>) -> Resp {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut rd, mut wr) = stream.into_split();
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&raw).await;
        // Keep the write half open: a half-close may end the request early.
        std::future::pending::<()>().await;
        drop(wr);
    });
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i;
        }
        match rd.read(&mut chunk).await {
            Ok(0) | Err(_) => {
                writer.abort();
                return Resp::default();
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut resp = Resp {
        status,
        headers,
        body: Vec::new(),
    };
    let mut rest = buf[head_end + 4..].to_vec();
    let streamed = resp
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream"));
    if status < 200 || status == 204 || status == 304 || ((200..300).contains(&status) && streamed)
    {
        writer.abort();
        return resp;
    }
    let length = resp
        .header("content-length")
        .and_then(|v| v.parse::<usize>().ok());
    let chunked = resp
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    loop {
        if let Some(n) = length {
            if rest.len() >= n {
                rest.truncate(n);
                break;
            }
        } else if chunked && find(&rest, b"0\r\n\r\n").is_some() {
            break;
        }
        match rd.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => rest.extend_from_slice(&chunk[..n]),
        }
    }
    writer.abort();
    resp.body = if chunked { dechunk(&rest) } else { rest };
    resp
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = find(raw, b"\r\n") {
        let size = std::str::from_utf8(&raw[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next().unwrap_or("").trim(), 16).ok())
            .unwrap_or(0);
        if size == 0 || raw.len() < eol + 2 + size {
            break;
        }
        out.extend_from_slice(&raw[eol + 2..eol + 2 + size]);
        raw = &raw[(eol + 4 + size).min(raw.len())..];
    }
    out
}

/// A small deterministic generator (xorshift64*), so a failing case can
/// be replayed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The egress policy a simulated host holds for a VM, read back from the
/// document the host API carried.
pub fn policy_of(net: &hearth_hostapi::SandboxNet) -> hearth_egress::Policy {
    hearth_egress::Policy::from_document(&net.policy).expect("the host can read the policy")
}

/// Sends `req` to `app` in process: the answer's status and body (at most
/// 1 MiB).
pub async fn oneshot(
    app: &axum::Router,
    req: axum::http::Request<axum::body::Body>,
) -> (axum::http::StatusCode, axum::body::Bytes) {
    use tower::ServiceExt;
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, bytes)
}

/// As [`oneshot`], the body read as JSON (`Value::Null` when it is not).
pub async fn oneshot_json(
    app: &axum::Router,
    req: axum::http::Request<axum::body::Body>,
) -> (axum::http::StatusCode, Value) {
    let (status, bytes) = oneshot(app, req).await;
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// A row of a busybox sandbox `name` (1 vCPU, 1 GiB) in `ws`, placed on
/// `host` at generation 1, in `status`; for suites that write rows
/// straight to the database.
pub fn sandbox_row(
    ws: WorkspaceId,
    host: HostId,
    name: &str,
    status: hearth_db::SandboxStatus,
) -> hearth_db::SandboxRow {
    let now = hearth_db::Timestamp::now();
    hearth_db::SandboxRow {
        id: hearth_types::SandboxId::new(),
        workspace_id: ws,
        name: name.into(),
        status,
        status_message: None,
        snapshot_id: hearth_types::SnapshotId::from_uuid(hearth_control::builtin_snapshot_id(
            "busybox",
        )),
        cpu: MilliCpu(1000),
        mem: ByteSize::gib(1),
        fs_capacity: ByteSize::mib(64),
        idle_ttl: Duration::ZERO,
        delete_after_stop: Duration::ZERO,
        persistent: true,
        preserve_memory_on_stop: false,
        labels: Default::default(),
        run_config: serde_json::json!({}),
        spec: serde_json::json!({}),
        host_id: Some(host),
        generation: 1,
        created_at: now,
        created_by: "test".into(),
        updated_at: now,
        updated_by: "test".into(),
        stopped_at: None,
        last_activity_at: now,
    }
}
