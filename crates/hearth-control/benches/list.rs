//! `GET /api/v2/sandboxes/boxes` latency with 10,000 sandboxes in the
//! database, on SQLite and on PostgreSQL (a throwaway cluster started from
//! the installed binaries, as the tests do).
//!
//! cargo bench -p hearth-control --bench list

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use hearth_control::{Control, ControlConfig};
use hearth_db::{Db, NewWorkspace, Quotas, SandboxRow, SandboxStatus, Timestamp};
use hearth_types::{ByteSize, MilliCpu, SandboxId, SnapshotId, WorkspaceId};
use tower::ServiceExt;

const SANDBOXES: usize = 10_000;
const REQUESTS: usize = 200;

fn pct(v: &[Duration], p: f64) -> Duration {
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

async fn run(label: &str, url: &str) {
    let db = Db::connect(url).await.expect("connect");
    let ws = WorkspaceId::new();
    db.create_workspace(&NewWorkspace {
        id: ws,
        name: "bench".into(),
        quotas: Quotas::default(),
    })
    .await
    .unwrap();
    let (_, secret) = hearth_control::auth::create_key(&db, ws, &["*"], "bench")
        .await
        .unwrap();
    let control = Control::open(db.clone(), ControlConfig::default(), Vec::new())
        .await
        .unwrap();
    let snapshot = SnapshotId::from_uuid(hearth_control::builtin_snapshot_id("busybox"));
    let spec = serde_json::to_value(hearth_types::sandbox::SandboxSpec {
        name: None,
        snapshot_id: snapshot,
        cpu: MilliCpu(1000),
        mem: ByteSize::gib(4),
        fs_capacity: ByteSize::mib(64),
        persistent: true,
        preserve_memory_on_stop: false,
        idle_ttl: Some(Duration::from_secs(600)),
        delete_after_stop: Some(Duration::from_secs(1_209_600)),
        run: Default::default(),
        env_vars: Default::default(),
        labels: Default::default(),
        egress: None,
        delegation: None,
        mounts: Vec::new(),
        mount_rules: Vec::new(),
        service_grants: Default::default(),
        auto_resume: false,
        lifetime: None,
        public_ports: false,
        port_host: None,
        tls_ports: Default::default(),
    })
    .unwrap();
    let t = Instant::now();
    for i in 0..SANDBOXES {
        let now = Timestamp::now();
        db.insert_sandbox(&SandboxRow {
            id: SandboxId::new(),
            workspace_id: ws,
            name: format!("bench-{i:05}"),
            status: if i % 3 == 0 {
                SandboxStatus::Stopped
            } else {
                SandboxStatus::Ready
            },
            status_message: None,
            snapshot_id: snapshot,
            cpu: MilliCpu(1000),
            mem: ByteSize::gib(4),
            fs_capacity: ByteSize::mib(64),
            idle_ttl: Duration::from_secs(600),
            delete_after_stop: Duration::from_secs(1_209_600),
            persistent: true,
            preserve_memory_on_stop: false,
            labels: [("team".to_string(), format!("t{}", i % 10))].into(),
            run_config: serde_json::json!({}),
            spec: spec.clone(),
            host_id: None,
            generation: 1,
            created_at: now,
            created_by: "bench".into(),
            updated_at: now,
            updated_by: "bench".into(),
            stopped_at: None,
            last_activity_at: now,
        })
        .await
        .unwrap();
    }
    eprintln!(
        "[{label}] inserted {SANDBOXES} sandboxes in {:?}",
        t.elapsed()
    );
    let app = hearth_control::router(control);
    for (what, path) in [
        ("first page (50, newest first)", "/api/v2/sandboxes/boxes"),
        (
            "page of 500 by name",
            "/api/v2/sandboxes/boxes?page_size=500&sort_by=name&sort_order=asc",
        ),
        (
            "label filter team=t3",
            "/api/v2/sandboxes/boxes?label=team=t3",
        ),
        ("status=stopped", "/api/v2/sandboxes/boxes?status=stopped"),
    ] {
        let mut lat = Vec::with_capacity(REQUESTS);
        for _ in 0..REQUESTS {
            let req = Request::get(path)
                .header("x-api-key", &secret)
                .body(Body::empty())
                .unwrap();
            let t = Instant::now();
            let resp = app.clone().oneshot(req).await.unwrap();
            let body = axum::body::to_bytes(resp.into_body(), 64 << 20)
                .await
                .unwrap();
            lat.push(t.elapsed());
            assert!(body.len() > 100);
        }
        lat.sort();
        println!(
            "GET /boxes [{label}, {SANDBOXES} sandboxes] {what}: p50 {:.2} ms, p99 {:.2} ms",
            pct(&lat, 0.5).as_secs_f64() * 1e3,
            pct(&lat, 0.99).as_secs_f64() * 1e3
        );
    }
    let _ = Arc::strong_count(&Arc::new(()));
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let sqlite = hearth_db::testing::sqlite_url();
    run("sqlite", &sqlite.url).await;
    match hearth_db::testing::postgres_url().await {
        Some(pg) => run("postgres", &pg.url).await,
        None => println!("postgres: unavailable, skipped"),
    }
}
