//! Issue 19: control-plane replicas on one database place without a lock
//! in the process. Two `Control`s (two replicas) over one database and one
//! simulated host with room for exactly one more sandbox create at the
//! same moment, 100 times: one gets its sandbox, the other a 503 "no
//! host" (the SDK retries it), and the host is never committed past its
//! capacity. On SQLite and on PostgreSQL.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use hearth_control::{Control, ControlConfig, LocalHost};
use hearth_db::{Db, NewWorkspace, Quotas};
use hearth_hostapi::SimHost;
use hearth_types::{ByteSize, HostId, MilliCpu, SandboxId, WorkspaceId};
use serde_json::{json, Value};
use tower::ServiceExt;

async fn create(app: &Router, key: &str, name: &str) -> (StatusCode, Value) {
    let body = json!({
        "name": name, "snapshot": "busybox", "cpu_millicores": 1000,
        "mem_bytes": 4u64 << 30, "wait_for_ready": false,
    });
    let req = Request::builder()
        .method(Method::POST)
        .uri("/api/v2/sandboxes/boxes")
        .header("x-api-key", key)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_placing_on_a_nearly_full_host_never_overcommit_it() {
    for url in hearth_db::testing::backend_urls().await {
        eprintln!("-- {}", url.url.split(':').next().unwrap_or_default());
        let db = Db::connect(&url.url).await.unwrap();
        let ws = WorkspaceId::new();
        db.create_workspace(&NewWorkspace {
            id: ws,
            name: "replicas".into(),
            quotas: Quotas::default(),
        })
        .await
        .unwrap();
        let key = hearth_control::auth::create_key(&db, ws, &["*"], "")
            .await
            .unwrap()
            .1;
        // One host, 4 vCPUs and 16 GiB: four of these sandboxes.
        let sim = Arc::new(SimHost::new());
        let host_id = HostId::new();
        let local = || {
            vec![LocalHost {
                id: host_id,
                host: sim.clone(),
                capacity_cpu: MilliCpu::vcpus(4),
                capacity_mem: ByteSize::gib(16),
            }]
        };
        // Replicas share their configuration (the master key above all).
        let cfg = ControlConfig::default();
        let replica = |db: Db| async {
            let control: Arc<Control> = Control::open(db, cfg.clone(), local()).await.unwrap();
            hearth_control::router(control)
        };
        let a = replica(db.clone()).await;
        let b = replica(Db::connect(&url.url).await.unwrap()).await;
        for i in 0..3 {
            let (s, v) = create(&a, &key, &format!("base{i}")).await;
            assert_eq!(s, StatusCode::CREATED, "{v}");
        }
        for round in 0..100 {
            let (na, nb) = (format!("a{round}"), format!("b{round}"));
            let (ra, rb) = tokio::join!(create(&a, &key, &na), create(&b, &key, &nb));
            let winner = match (&ra, &rb) {
                ((StatusCode::CREATED, w), (StatusCode::SERVICE_UNAVAILABLE, l))
                | ((StatusCode::SERVICE_UNAVAILABLE, l), (StatusCode::CREATED, w)) => {
                    assert_eq!(l["detail"]["error"], "NoSandboxHostsAvailable", "{l}");
                    w["id"].as_str().unwrap().parse::<SandboxId>().unwrap()
                }
                other => panic!("round {round}: {other:?}"),
            };
            let load = db.host_load().await.unwrap();
            let l = load.iter().find(|l| l.host_id == host_id).unwrap();
            assert_eq!(
                (l.cpu, l.mem, l.sandboxes),
                (MilliCpu::vcpus(4), ByteSize::gib(16), 4),
                "round {round}"
            );
            // Room for the next round.
            db.delete_sandbox(winner).await.unwrap();
        }
        db.close().await;
    }
}
