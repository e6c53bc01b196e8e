//! Issue 19: control-plane replicas on one database place without a lock
//! in the process. Two `Control`s (two replicas) over one database and one
//! simulated host with room for exactly one more sandbox create at the
//! same moment, 100 times: one gets its sandbox, the other a 503 "no
//! host" (the SDK retries it), and the host is never committed past its
//! capacity. On SQLite and on PostgreSQL.
//!
//! And a boot survives the replica that drove it: a VM its host booted is
//! recorded `ready` by any replica's reconciler, and the replica that
//! drove it, should it still be there, takes that record as its own.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use hearth_control::{Control, ControlConfig, LocalHost};
use hearth_db::{Db, Quotas, SandboxStatus, StatusExtra};
use hearth_hostapi::SimHost;
use hearth_hostapi::VmState;
use hearth_types::{ByteSize, HostId, MilliCpu, SandboxId, VmId};
use serde_json::{json, Value};

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
    crate::harness::oneshot_json(app, req).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_placing_on_a_nearly_full_host_never_overcommit_it() {
    for url in hearth_db::testing::backend_urls().await {
        eprintln!("-- {}", url.url.split(':').next().unwrap_or_default());
        let db = Db::connect(&url.url).await.unwrap();
        let (_, key) = crate::harness::workspace_key(&db, "replicas", Quotas::default()).await;
        // One host, 4 vCPUs and 16 GiB: four of these sandboxes.
        let sim = Arc::new(SimHost::new());
        let host_id = HostId::new();
        let local = || {
            vec![LocalHost {
                id: host_id,
                host: sim.clone(),
                capacity_cpu: MilliCpu::vcpus(4),
                capacity_mem: ByteSize::gib(16),
                store_url: String::new(),
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

/// Two replicas over one SQLite database and one simulated host, and a key.
async fn two_replicas(sim: &Arc<SimHost>) -> (Db, Arc<Control>, Arc<Control>, String) {
    let url = format!(
        "sqlite://{}/hearth-replicas-{}.db?mode=rwc",
        std::env::temp_dir().display(),
        SandboxId::new()
    );
    let db = Db::connect(&url).await.unwrap();
    let (_, key) = crate::harness::workspace_key(&db, "replicas", Quotas::default()).await;
    let host_id = HostId::new();
    // Replicas share their configuration (the master key above all).
    let cfg = ControlConfig::default();
    let open = |db: Db| async {
        let local = vec![LocalHost {
            id: host_id,
            host: sim.clone(),
            capacity_cpu: MilliCpu::vcpus(4),
            capacity_mem: ByteSize::gib(16),
            store_url: String::new(),
        }];
        Control::open(db, cfg.clone(), local).await.unwrap()
    };
    let a = open(db.clone()).await;
    let b = open(Db::connect(&url).await.unwrap()).await;
    (db, a, b, key)
}

async fn wait_for_status(db: &Db, id: SandboxId, want: SandboxStatus) -> hearth_db::SandboxRow {
    for _ in 0..500 {
        let row = db.get_sandbox_by_id(id).await.unwrap();
        if row.status == want {
            return row;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("sandbox {id} never became {want:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_boot_whose_replica_died_after_its_host_booted_it_is_recorded_ready_by_another() {
    let sim = Arc::new(SimHost::new());
    let (db, a, b, key) = two_replicas(&sim).await;
    let (s, v) = create(&hearth_control::router(a), &key, "orphan").await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let id: SandboxId = v["id"].as_str().unwrap().parse().unwrap();
    let booted = wait_for_status(&db, id, SandboxStatus::Ready).await;
    // What a replica killed between its host's answer and its write
    // leaves: the VM ready on its host, the row still `provisioning`.
    db.set_status(
        id,
        SandboxStatus::Provisioning,
        None,
        StatusExtra {
            expect_generation: Some(booted.generation),
            expect_status: vec![SandboxStatus::Ready],
            ..StatusExtra::default()
        },
    )
    .await
    .unwrap();
    b.reap_once().await;
    let row = db.get_sandbox_by_id(id).await.unwrap();
    assert_eq!(
        (row.status, row.generation),
        (SandboxStatus::Ready, booted.generation)
    );
    let vm = sim.vm(VmId::from(*id.as_uuid())).expect("the VM is kept");
    assert_eq!(vm.state, VmState::Ready);
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_boot_recorded_ready_by_another_replica_is_kept_by_the_replica_that_drove_it() {
    let sim = Arc::new(SimHost::new());
    sim.set_boot_time(std::time::Duration::from_millis(500));
    let (db, a, _b, key) = two_replicas(&sim).await;
    let (s, v) = create(&hearth_control::router(a), &key, "both").await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let id: SandboxId = v["id"].as_str().unwrap().parse().unwrap();
    let row = db.get_sandbox_by_id(id).await.unwrap();
    assert_eq!(row.status, SandboxStatus::Provisioning);
    // Another replica's reconciler records the boot first (as it does
    // when the host reports the VM ready before the driver's write).
    db.set_status(
        id,
        SandboxStatus::Ready,
        None,
        StatusExtra {
            expect_generation: Some(row.generation),
            expect_status: vec![SandboxStatus::Provisioning],
            ..StatusExtra::default()
        },
    )
    .await
    .unwrap();
    // The driver's boot ends: it must not take the VM for one that
    // "booted too late" and delete it under a ready sandbox.
    let vm = VmId::from(*id.as_uuid());
    for _ in 0..300 {
        if sim.vm(vm).is_some_and(|r| r.state != VmState::Provisioning) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(
        sim.vm(vm).map(|r| r.state),
        Some(VmState::Ready),
        "the VM of a ready sandbox"
    );
    assert_eq!(
        db.get_sandbox_by_id(id).await.unwrap().status,
        SandboxStatus::Ready
    );
    db.close().await;
}
