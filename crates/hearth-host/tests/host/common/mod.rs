//! Shared set-up of the real-VM tests: one artifact cache for every test
//! (built on first use), and a separate data directory per host agent so
//! tests running in parallel never reconcile each other's VMs.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use hearth_host::{CreateVm, GuestClient, Host, HostConfig, Vm};
use hearth_image::ImageName;
use hearth_types::ByteSize;

pub fn shared_dir() -> PathBuf {
    let dir = std::env::var_os("HEARTH_TEST_ARTIFACTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/hearth-test")
        });
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn test_config() -> HostConfig {
    let shared = shared_dir();
    let data = shared
        .join("hosts")
        .join(uuid::Uuid::now_v7().simple().to_string());
    std::fs::create_dir_all(&data).unwrap();
    std::fs::create_dir_all(shared.join("artifacts")).unwrap();
    let link = data.join("artifacts");
    if !link.exists() {
        std::os::unix::fs::symlink(shared.join("artifacts"), &link).unwrap();
    }
    let mut cfg = HostConfig::new(&data);
    cfg.accel_cache = shared.join("accel.json");
    cfg.run_root = run_root(&cfg.run_root);
    cfg
}

/// `default` moved under one directory of this test process's own
/// (`/dev/shm/hearth-test-<pid>/`), so that what a test leaves on tmpfs (a
/// host dropped without `shutdown`, the run directory of a VM whose test
/// failed) goes at the next run of the suite, once this process is gone.
fn run_root(default: &std::path::Path) -> PathBuf {
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(remove_dead_processes_runs);
    let tag = default.file_name().expect("a run root has a name");
    PathBuf::from(format!("/dev/shm/hearth-test-{}", std::process::id())).join(tag)
}

fn remove_dead_processes_runs() {
    let Ok(entries) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("hearth-test-") else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !std::path::Path::new("/proc").join(pid).exists() {
            if let Err(e) = std::fs::remove_dir_all(entry.path()) {
                eprintln!(
                    "cannot remove {} (left by an earlier run): {e}",
                    entry.path().display()
                );
            }
        }
    }
}

pub async fn host() -> Arc<Host> {
    Host::start(test_config(), Arc::new(hearth_image::StderrProgress))
        .await
        .expect("host agent starts")
}

pub async fn vm(host: &Arc<Host>, image: ImageName) -> (Arc<Vm>, GuestClient) {
    let vm = host
        .create_vm(CreateVm {
            image,
            memory: ByteSize::mib(256),
            ..CreateVm::default()
        })
        .await
        .expect("vm boots");
    let guest = vm.guest().expect("ready vm has a guest");
    (vm, guest)
}

pub fn sh(cmd: &str) -> hearth_guest_proto::ExecRequest {
    hearth_guest_proto::ExecRequest {
        command: cmd.into(),
        ..Default::default()
    }
}

/// An answer of the host API.
pub struct Resp {
    pub status: u16,
    /// The head, lowercase names, as raw text.
    pub head: String,
    pub body: serde_json::Value,
}

impl Resp {
    /// The envelope's `detail.error`.
    pub fn error(&self) -> &str {
        self.body["detail"]["error"].as_str().unwrap_or_default()
    }

    /// The envelope's `detail.message`.
    pub fn message(&self) -> &str {
        self.body["detail"]["message"].as_str().unwrap_or_default()
    }
}

/// One HTTP/1.1 request on its own connection, with `headers` added. An
/// upgrade's answer (101) is read up to the end of its head.
/// Whether `have` bytes after a response head are its whole body (it says
/// its `Content-Length`).
fn complete_body(head: &[u8], have: usize) -> bool {
    String::from_utf8_lossy(head)
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .is_some_and(|len| have >= len)
}

pub async fn request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("connection"))
    {
        head.push_str("Connection: close\r\n");
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(body).await.unwrap();
    let mut raw = Vec::new();
    let read = async {
        let mut buf = [0u8; 8192];
        loop {
            let n = tcp.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            raw.extend_from_slice(&buf[..n]);
            // An upgraded connection stays open: its head is the answer.
            // So does a refused upgrade (it asked for `Connection:
            // Upgrade`, not `close`): its head and body are the answer.
            if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                if raw.starts_with(b"HTTP/1.1 101")
                    || complete_body(&raw[..end], raw.len() - end - 4)
                {
                    break;
                }
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(120), read)
        .await
        .expect("answer in time");
    let text = String::from_utf8_lossy(&raw);
    let status: u16 = text[9..12].parse().unwrap();
    let body_at = text.find("\r\n\r\n").map_or(text.len(), |i| i + 4);
    let body = serde_json::from_str(&text[body_at..]).unwrap_or(serde_json::Value::Null);
    Resp {
        status,
        head: text[..body_at].to_ascii_lowercase(),
        body,
    }
}

/// The headers of a WebSocket upgrade request.
pub const UPGRADE: [(&str, &str); 4] = [
    ("Upgrade", "websocket"),
    ("Connection", "Upgrade"),
    ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ("Sec-WebSocket-Version", "13"),
];

/// One request to each route of the host API about `vm` (method, path,
/// body), in an order that works through a VM's life; the guest relay's
/// is a WebSocket upgrade (send it with [`UPGRADE`]).
pub fn every_route(vm: &str) -> Vec<(&'static str, String, Vec<u8>)> {
    let create = serde_json::json!({"image": "busybox", "memory": 256u64 << 20});
    let captured = serde_json::json!({"disk": "snap-auth-test", "disk_size": 1 << 20});
    let import = serde_json::json!({
        "reference": "127.0.0.1:1/nothing:here",
        "insecure_http": true,
        "capacity": 1u64 << 30,
        "volume": "snap-auth-import",
    });
    let json = |v: serde_json::Value| serde_json::to_vec(&v).unwrap();
    let p = format!("/v1/vms/{vm}");
    vec![
        ("PUT", p.clone(), json(create)),
        ("GET", "/v1/status".into(), vec![]),
        ("GET", "/v1/vms".into(), vec![]),
        ("POST", "/v1/vm-changes".into(), b"{}".to_vec()),
        ("GET", p.clone(), vec![]),
        ("PUT", format!("{p}/network"), b"{}".to_vec()),
        // The VM is no pool member: 409.
        ("POST", format!("{p}/claim"), b"{}".to_vec()),
        ("GET", format!("{p}/guest"), vec![]),
        (
            "POST",
            format!("{p}/capture"),
            json(serde_json::json!({"volume": "snap-auth-test"})),
        ),
        ("POST", "/v1/snapshots/delete".into(), json(captured)),
        (
            "POST",
            "/v1/volumes/copy".into(),
            json(serde_json::json!({"from": "volume-auth-a", "to": "volume-auth-b"})),
        ),
        ("POST", "/v1/store/gc".into(), vec![]),
        ("POST", "/v1/images/import".into(), json(import)),
        ("POST", format!("{p}/stop"), b"{}".to_vec()),
        ("POST", format!("{p}/start"), b"{}".to_vec()),
        ("DELETE", p.clone(), vec![]),
        ("POST", format!("{p}/forget"), vec![]),
    ]
}

/// Every `(METHOD, path template)` the host API's router serves, from the
/// table it is built from, so a route added there and not to
/// [`every_route`] fails the tests that walk every route.
pub fn router_routes() -> std::collections::BTreeSet<(String, String)> {
    hearth_hostapi::routes::HostRoute::ALL
        .iter()
        .map(|r| (r.method().to_owned(), r.pattern().to_owned()))
        .collect()
}

/// `path` with the VM id `vm` put back as `{id}`.
pub fn template(path: &str, vm: &str) -> String {
    path.replace(vm, "{id}")
}
