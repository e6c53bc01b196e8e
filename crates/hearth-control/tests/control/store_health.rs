//! A host whose object store fails stops taking sandboxes, and takes them
//! again once the store answers (issue 19).
//!
//! The whole path, in one process and without QEMU: a control plane served
//! on loopback, and two host agents on the fake VMM
//! (`hearth_host::fake`), each serving its private API with signed
//! commands and holding its lease with `hearth_host::fleet::hold_lease`,
//! as `hearth host serve --control` does. Host A keeps its disks in a real
//! S3 server (moto), host B in a local directory. moto is killed and
//! started again on the same port: creates meanwhile all land on B, the
//! control plane's row and `/metrics` say why, and once a check of A's
//! store succeeds the next create lands on A again. Skipped loudly
//! without `moto_server`, unless `HEARTH_REQUIRE_S3` is set.
//!
//! The in-process host of `hearth up` follows the same rule through
//! `Control::record_store_health` (on `SimHost`).
//!
//! On the same scaffolding: a host given every replica's URL keeps its
//! lease when the replica it renews through dies.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hearth_control::{Control, ControlConfig};
use hearth_db::{Db, Quotas};
use hearth_fence::{KeyPair, KeyRing, Signer, Verifier, VerifierConfig};
use hearth_host::fake::{guest_images, FakeVmm};
use hearth_host::fleet::{ControlClient, FleetSettings, FENCED_EPOCH};
use hearth_host::store_check::StoreCheck;
use hearth_host::{Host, HostConfig, Storage};
use hearth_types::{ByteSize, HostId, MilliCpu};

use crate::harness::{send, RawRequest};

const TOKEN: &str = "enroll-me";
/// The lease (renewed every third of it) and the store check, short so the
/// test takes seconds.
const LEASE: Duration = Duration::from_secs(3);
const CHECK: StoreCheck = StoreCheck {
    every: Duration::from_millis(300),
    // moto is a Python server: on a loaded CI machine a PUT once took more
    // than a second and the store was reported failing while it was up. A
    // stopped moto refuses at once, so this bounds nothing the test waits
    // for.
    timeout: Duration::from_secs(5),
};

/// moto_server, killed (by its PID, through the handle) when dropped.
struct Moto(Child);

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts moto on `port` and creates the bucket `hearth`; `None` (after a
/// loud message) when moto is not installed.
fn start_moto(port: u16) -> Option<Moto> {
    let spawned = Command::new("moto_server")
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let moto = match spawned {
        Ok(child) => Moto(child),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                std::env::var_os("HEARTH_REQUIRE_S3").is_none(),
                "HEARTH_REQUIRE_S3 is set but moto_server is not installed (scripts/install-deps)"
            );
            eprintln!(
                "\n*** SKIPPING: moto_server not found (scripts/install-deps installs it) ***\n"
            );
            return None;
        }
        Err(e) => panic!("start moto_server: {e}"),
    };
    // Moto checks no signatures: a plain PUT creates the bucket.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let put = TcpStream::connect(("127.0.0.1", port)).and_then(|mut s| {
            s.write_all(
                format!("PUT /hearth HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )?;
            let mut buf = String::new();
            s.read_to_string(&mut buf)?;
            Ok(buf)
        });
        match put {
            Ok(r) if r.starts_with("HTTP/1.1 200") => return Some(moto),
            _ if Instant::now() > deadline => panic!("moto_server never created the bucket"),
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A host agent on the fake VMM, in the fleet of the control plane at
/// `controls` (its URLs: one, or each replica's): its API served with
/// signed commands, its lease held.
async fn fleet_host(
    dir: &std::path::Path,
    name: &str,
    store_url: Option<String>,
    controls: &[String],
) -> (HostId, Arc<Host>) {
    let data = dir.join(name);
    let mut cfg = HostConfig::new(&data);
    cfg.run_root = dir.join(format!("{name}-run"));
    cfg.images = guest_images(&dir.join(format!("{name}-images"))).expect("fake images");
    cfg.boot_timeout = Duration::from_secs(2);
    cfg.stop_grace = Duration::from_millis(200);
    if let (Some(url), Storage::Store(s)) = (store_url, &mut cfg.storage) {
        s.url = url;
    }
    let host = Host::start_with(cfg, Arc::new(hearth_image::QuietProgress), FakeVmm::new())
        .await
        .expect("host starts on the fake vmm");
    let id = HostId::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut vcfg = VerifierConfig::new(id.to_string());
    vcfg.epoch = FENCED_EPOCH;
    let verifier = Arc::new(Verifier::new(vcfg, KeyRing::new()));
    let client = ControlClient::new(FleetSettings {
        control: controls.to_vec(),
        token: TOKEN.into(),
        advertise: format!("http://{addr}"),
        host_id: id,
        capacity_cpu: MilliCpu::vcpus(16),
        capacity_mem: ByteSize::gib(64),
        key: Arc::new(KeyPair::generate().unwrap()),
        margin: Duration::from_millis(500),
        lease_file: data.join("lease.json"),
        store_check: CHECK,
    })
    .unwrap();
    tokio::spawn(hearth_host::fleet::hold_lease(
        host.clone(),
        client,
        verifier.clone(),
    ));
    tokio::spawn(hearth_host::api::serve(
        host.clone(),
        hearth_host::api::Access::Signed(verifier),
        listener,
        hearth_listen::Limits::for_this_process(),
        std::future::pending(),
    ));
    (id, host)
}

/// Polls `f` every 20 ms until it holds; how long that took.
async fn until(what: &str, limit: Duration, mut f: impl AsyncFnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !f().await {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    t.elapsed()
}

async fn store_error(db: &Db, id: HostId) -> Option<String> {
    db.get_host(id).await.unwrap().store_error
}

/// Creates a ready sandbox; the host it was placed on.
async fn create(addr: std::net::SocketAddr, key: &str, db: &Db, name: &str) -> HostId {
    let body = serde_json::json!({
        "name": name, "snapshot": "busybox", "mem_bytes": 2u64 << 30,
        "wait_for_ready": true, "timeout": 60,
    });
    let headers = vec![
        ("content-type".to_owned(), "application/json".to_owned()),
        ("x-api-key".to_owned(), key.to_owned()),
    ];
    let req = RawRequest::new(
        "POST",
        "/api/v2/sandboxes/boxes",
        &headers,
        body.to_string().into_bytes(),
    );
    let r = send(addr, &req.bytes()).await;
    assert_eq!(r.status, 201, "create {name}: {}", r.text());
    let id: uuid::Uuid = r.json().unwrap()["id"].as_str().unwrap().parse().unwrap();
    db.get_sandbox_by_id(hearth_types::SandboxId::from_uuid(id))
        .await
        .unwrap()
        .host_id
        .expect("a ready sandbox has a host")
}

async fn metrics(addr: std::net::SocketAddr, key: &str) -> String {
    let headers = [("x-api-key".to_owned(), key.to_owned())];
    let r = send(
        addr,
        &RawRequest::new("GET", "/metrics", &headers, Vec::new()).bytes(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_store_fails_gets_no_sandboxes_until_its_store_answers_again() {
    let port = free_port();
    let Some(moto) = tokio::task::spawn_blocking(move || start_moto(port))
        .await
        .unwrap()
    else {
        return;
    };
    let dir = tempfile::Builder::new()
        .prefix("hs")
        .tempdir_in("/tmp")
        .unwrap();

    // The control plane.
    let url = hearth_db::testing::sqlite_url();
    let db = Db::connect(&url.url).await.unwrap();
    let (_, key) = crate::harness::workspace_key(&db, "ws", Quotas::default()).await;
    let cfg = ControlConfig {
        host_token: Some(TOKEN.into()),
        signer: Some(Arc::new(Signer::new(
            KeyPair::generate().unwrap(),
            Duration::from_secs(60),
        ))),
        lease: LEASE,
        ..ControlConfig::default()
    };
    let control = Control::open(db.clone(), cfg, Vec::new()).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(hearth_control::serve(
        control.clone(),
        listener,
        std::future::pending(),
    ));
    let control_url = format!("http://{addr}");

    // Host A on S3, host B on a local directory.
    let s3 = format!(
        "s3://hearth/disks?endpoint=http://127.0.0.1:{port}&region=us-east-1\
         &allow_http=true&access_key_id=test&secret_access_key=test"
    );
    let controls = [control_url];
    let (a, host_a) = fleet_host(dir.path(), "a", Some(s3), &controls).await;
    let (b, host_b) = fleet_host(dir.path(), "b", None, &controls).await;
    until(
        "both hosts registered",
        Duration::from_secs(20),
        async || {
            let hosts = db.list_hosts().await.unwrap();
            hosts.len() == 2
                && hosts
                    .iter()
                    .all(|h| h.epoch >= 1 && h.store_error.is_none())
        },
    )
    .await;
    assert!(metrics(addr, &key)
        .await
        .contains(&format!("hearth_host_store_ok{{host=\"{a}\"}} 1")));

    // The S3 server dies: within a check and a renewal the control plane
    // knows (the change brings the renewal forward).
    let killed = Instant::now();
    drop(moto);
    let detected = until(
        "A's store failure reported",
        Duration::from_secs(10),
        async || store_error(&db, a).await.is_some(),
    )
    .await;
    let error = store_error(&db, a).await.unwrap();
    println!("store down -> reported by A's lease: {detected:?} ({error})");
    assert!(!host_a.store_health().is_ok());
    assert!(metrics(addr, &key)
        .await
        .contains(&format!("hearth_host_store_ok{{host=\"{a}\"}} 0")));
    // A still holds its lease (its control plane answers): only placement
    // skips it. Every create lands on B, though B fills up first.
    for i in 0..3 {
        assert_eq!(
            create(addr, &key, &db, &format!("during-{i}")).await,
            b,
            "during-{i}"
        );
    }
    assert!(
        host_a.list().is_empty(),
        "A was given a VM while its store failed"
    );
    assert_eq!(host_b.list().len(), 3);
    let row = db.get_host(a).await.unwrap();
    assert!(
        row.lease_expires_at > hearth_db::Timestamp::now(),
        "A kept its lease"
    );
    assert!(killed.elapsed() < Duration::from_secs(60));

    // The store comes back (a new moto on the same port): the next check
    // says so, the next renewal carries it, and A takes sandboxes again
    // (it is the least loaded).
    let moto = tokio::task::spawn_blocking(move || start_moto(port))
        .await
        .unwrap()
        .unwrap();
    let back = Instant::now();
    let recovered = until(
        "A's store reported answering",
        Duration::from_secs(10),
        async || store_error(&db, a).await.is_none(),
    )
    .await;
    println!("store back -> reported by A's lease: {recovered:?}");
    assert!(back.elapsed() < Duration::from_secs(10));
    assert!(metrics(addr, &key)
        .await
        .contains(&format!("hearth_host_store_ok{{host=\"{a}\"}} 1")));
    assert_eq!(create(addr, &key, &db, "after").await, a);
    assert_eq!(host_a.list().len(), 1);

    host_a.shutdown().await;
    host_b.shutdown().await;
    drop(moto);
}

/// The in-process host of `hearth up` follows the same rule: a failed
/// check recorded on its row (`Control::record_store_health`, which `hearth
/// up` calls on every flip of its host's checks) keeps creates off it, a
/// 503 with no other host, and the next success lets them in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_process_host_whose_store_fails_takes_no_sandboxes_until_it_answers() {
    use hearth_hostapi::fleet::StoreHealth;
    use tower::ServiceExt;

    let url = hearth_db::testing::sqlite_url();
    let db = Db::connect(&url.url).await.unwrap();
    let (_, key) = crate::harness::workspace_key(&db, "ws", Quotas::default()).await;
    let (control, _sim) = crate::harness::sim_control(db.clone()).await;
    let id = db.list_hosts().await.unwrap()[0].id;
    let app = hearth_control::router(control.clone());
    let create = async |name: &str| {
        let body = serde_json::json!({
            "name": name, "snapshot": "busybox", "mem_bytes": 2u64 << 30,
            "wait_for_ready": true, "timeout": 30,
        });
        let req = axum::http::Request::post("/api/v2/sandboxes/boxes")
            .header("x-api-key", &key)
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body.to_string()))
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let status = resp.status().as_u16();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    };

    assert_eq!(create("before").await.0, 201);
    control
        .record_store_health(
            id,
            &StoreHealth::Failing {
                error: "the store did not answer a check within 5s".into(),
            },
        )
        .await;
    assert!(store_error(&db, id).await.is_some());
    let (status, body) = create("during").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("NoSandboxHostsAvailable"), "{body}");
    control.record_store_health(id, &StoreHealth::Ok).await;
    assert_eq!(store_error(&db, id).await, None);
    assert_eq!(create("after").await.0, 201);
}

/// Two control-plane replicas (each its own signing key) on one database,
/// and a host given both URLs (`hearth host serve --control A,B`). It holds
/// its lease through A; A stops serving; the host renews through B, never
/// fences (its epoch stays, its lease never lapses), and a create through
/// B lands on it. With A's URL alone the lease would lapse within one TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_renews_through_the_next_replica_when_its_replica_dies() {
    let dir = tempfile::Builder::new()
        .prefix("hf")
        .tempdir_in("/tmp")
        .unwrap();
    let url = hearth_db::testing::sqlite_url();
    let db = Db::connect(&url.url).await.unwrap();
    let (_, key) = crate::harness::workspace_key(&db, "ws", Quotas::default()).await;
    // One master key (it seals what the replicas share), a signing key
    // each.
    let shared = ControlConfig {
        host_token: Some(TOKEN.into()),
        lease: LEASE,
        ..ControlConfig::default()
    };
    let replica = async |db: Db| {
        let cfg = ControlConfig {
            signer: Some(Arc::new(Signer::new(
                KeyPair::generate().unwrap(),
                Duration::from_secs(60),
            ))),
            ..shared.clone()
        };
        let control = Control::open(db, cfg, Vec::new()).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(hearth_control::serve(control, listener, async move {
            if stopped.await.is_err() {
                tracing::debug!("the test dropped the stop signal");
            }
        }));
        (addr, stop, server)
    };
    let (a_addr, stop_a, server_a) = replica(db.clone()).await;
    let (b_addr, _stop_b, _server_b) = replica(Db::connect(&url.url).await.unwrap()).await;
    let controls = [format!("http://{a_addr}"), format!("http://{b_addr}")];
    let (id, host) = fleet_host(dir.path(), "h", None, &controls).await;
    until("the host registered", Duration::from_secs(20), async || {
        db.get_host(id).await.is_ok_and(|h| h.epoch >= 1)
    })
    .await;
    let epoch = db.get_host(id).await.unwrap().epoch;

    // A stops serving (its listener closes: connections are refused).
    stop_a.send(()).unwrap();
    server_a.await.unwrap().unwrap();
    let stopped = Instant::now();
    // Three lease terms later the host still holds the same lease: renewed
    // through B all along, never fenced.
    while stopped.elapsed() < LEASE * 3 {
        let row = db.get_host(id).await.unwrap();
        assert_eq!(row.epoch, epoch, "the host fenced and registered again");
        assert!(
            row.lease_expires_at > hearth_db::Timestamp::now(),
            "the lease lapsed {:?} after A stopped",
            stopped.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // And it takes sandboxes through B.
    assert_eq!(create(b_addr, &key, &db, "after-a").await, id);
    assert_eq!(host.list().len(), 1);
    host.shutdown().await;
}
