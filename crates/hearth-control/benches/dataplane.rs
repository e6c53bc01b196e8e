//! Exec of `true` through the public data plane (the LangSmith exec
//! WebSocket at `{dataplane_url}/execute/ws`, over real TCP, one WebSocket
//! per command as the SDK does) next to the host agent's own exec (the
//! guest client, in process). The difference is the data plane's overhead.
//!
//! cargo bench -p hearth-control --bench dataplane

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use hearth_control::{Control, ControlConfig, LocalHost};
use hearth_db::{Db, NewWorkspace, Quotas};
use hearth_hostapi::HostApi;
use hearth_types::{ByteSize, HostId, MilliCpu, WorkspaceId};
use tokio_tungstenite::tungstenite::Message;

const RUNS: usize = 500;

fn pct(v: &[Duration], p: f64) -> Duration {
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn report(what: &str, mut v: Vec<Duration>) {
    v.sort();
    println!(
        "{what}: p50 {:.2} ms, p99 {:.2} ms (n={})",
        pct(&v, 0.5).as_secs_f64() * 1e3,
        pct(&v, 0.99).as_secs_f64() * 1e3,
        v.len()
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let shared = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/hearth-test");
    let data = shared
        .join("hosts")
        .join(format!("bench-{}", std::process::id()));
    std::fs::create_dir_all(shared.join("artifacts")).unwrap();
    std::fs::create_dir_all(&data).unwrap();
    let _ = std::os::unix::fs::symlink(shared.join("artifacts"), data.join("artifacts"));
    let mut hcfg = hearth_host::HostConfig::new(&data);
    hcfg.accel_cache = shared.join("accel.json");
    let started = hearth_host::Host::start(hcfg, Arc::new(hearth_image::QuietProgress))
        .await
        .unwrap();
    // From here on the host is reached only through the host API, as the
    // control plane reaches it.
    let host: Arc<dyn HostApi> = Arc::new(hearth_host::InProcessHost::new(started));

    let db_url = hearth_db::testing::sqlite_url();
    let db = Db::connect(&db_url.url).await.unwrap();
    let ws = WorkspaceId::new();
    db.create_workspace(&NewWorkspace {
        id: ws,
        name: "bench".into(),
        quotas: Quotas::default(),
    })
    .await
    .unwrap();
    let (_, key) = hearth_control::auth::create_key(&db, ws, &["*"], "bench")
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cfg = ControlConfig {
        public_url: format!("http://{addr}"),
        ..ControlConfig::default()
    };
    let local = LocalHost {
        id: HostId::new(),
        host: host.clone(),
        capacity_cpu: MilliCpu(64_000),
        capacity_mem: ByteSize::gib(256),
        store_url: String::new(),
    };
    let control = Control::open(db, cfg, vec![local]).await.unwrap();
    tokio::spawn(hearth_control::serve(
        control.clone(),
        listener,
        std::future::pending(),
    ));

    // One busybox sandbox through the public API.
    let body =
        r#"{"snapshot":"busybox","mem_bytes":2147483648,"wait_for_ready":true,"timeout":120}"#;
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /api/v2/sandboxes/boxes HTTP/1.1\r\nHost: x\r\nX-Api-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tokio::io::AsyncWriteExt::write_all(&mut s, req.as_bytes())
        .await
        .unwrap();
    let mut resp = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut s, &mut resp)
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&resp);
    let json: serde_json::Value =
        serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    let dp = json["dataplane_url"]
        .as_str()
        .expect("created")
        .replace("http://", "ws://");
    let id: uuid::Uuid = json["id"].as_str().unwrap().parse().unwrap();
    let vm = hearth_types::VmId::from(id);
    let fence = host
        .list_vms()
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.id == vm)
        .expect("the host has the sandbox's VM")
        .fence;
    let guest = host.guest(vm, fence).await.unwrap();

    // The host agent's own exec.
    let mut direct = Vec::new();
    for _ in 0..RUNS {
        let t = Instant::now();
        let out = guest
            .run(hearth_guest_proto::ExecRequest {
                command: "true".into(),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(out.exit_code, Some(0));
        direct.push(t.elapsed());
    }
    // Through the public data plane: new WebSocket, execute, read to exit.
    let mut public = Vec::new();
    for i in 0..RUNS {
        let t = Instant::now();
        let mut req =
            tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
                format!("{dp}/execute/ws"),
            )
            .unwrap();
        req.headers_mut().insert("x-api-key", key.parse().unwrap());
        let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
        let frame = serde_json::json!({"type":"execute","command":"true","timeout_seconds":60,"shell":"/bin/bash",
            "idle_timeout_seconds":300,"kill_on_disconnect":false,"ttl_seconds":600,
            "command_id": format!("{:032x}", i), "close_stdin": true});
        ws.send(Message::Text(frame.to_string().into()))
            .await
            .unwrap();
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) if t.contains("\"exit\"") => break,
                Some(Ok(_)) => continue,
                other => panic!("exec ws ended: {other:?}"),
            }
        }
        let _ = ws.close(None).await;
        public.push(t.elapsed());
    }
    report("exec `true`, host agent's own (guest client)", direct);
    report(
        "exec `true`, public data plane (WebSocket per command)",
        public,
    );
    if let Err(e) = host.delete_vm(vm, fence).await {
        eprintln!("cannot delete the bench's sandbox: {e}");
    }
}
