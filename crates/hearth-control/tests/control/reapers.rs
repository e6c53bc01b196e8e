//! The reapers with several replicas on one database: two `Control`s
//! share a database and a simulated host (as replicas share remote hosts),
//! and passes run at chosen times. The fleet's duties run only in the
//! replica holding the `reaper` lease; when it dies, the other takes over
//! after the lease's TTL and finishes what it left in flight.

use std::sync::Arc;
use std::time::Duration;

use hearth_control::{Control, ControlConfig, LocalHost};
use hearth_db::{
    NewWorkspace, Quotas, SandboxRow, SandboxStatus, SnapshotRow, SnapshotStatus, Timestamp,
};
use hearth_hostapi::{CreateVm, HostApi, SimHost, StopVm, VmState};
use hearth_types::{ByteSize, HostId, MilliCpu, SandboxId, SnapshotId, VmId, WorkspaceId};

/// A pass every 60 s: the reaper lease lasts 180 s.
const INTERVAL: Duration = Duration::from_secs(60);
const LEASE_TTL: Duration = Duration::from_secs(180);

fn vm(id: SandboxId) -> VmId {
    VmId::from(*id.as_uuid())
}

fn row(ws: WorkspaceId, host: HostId, name: &str, status: SandboxStatus) -> SandboxRow {
    crate::harness::sandbox_row(ws, host, name, status)
}

/// A replica over `db` whose one host is `sim` (64 vCPUs, 256 GiB) as
/// `host`; replicas opened on the same `sim` and `host` share it.
async fn replica(
    db: &hearth_db::Db,
    cfg: &ControlConfig,
    sim: &Arc<SimHost>,
    host: HostId,
) -> Arc<Control> {
    let hosts = vec![LocalHost {
        id: host,
        host: sim.clone(),
        capacity_cpu: MilliCpu::vcpus(64),
        capacity_mem: ByteSize::gib(256),
        store_url: String::new(),
    }];
    Control::open(db.clone(), cfg.clone(), hosts).await.unwrap()
}

/// Two replicas over `db` and one simulated host both can command.
async fn two_replicas(db: &hearth_db::Db) -> (Arc<Control>, Arc<Control>, Arc<SimHost>, HostId) {
    let sim = Arc::new(SimHost::new());
    let host = HostId::new();
    let cfg = ControlConfig {
        reaper_interval: INTERVAL,
        // Nobody renews the host's lease between the passes' far-apart
        // clocks; it must not fail over.
        lease: Duration::from_secs(24 * 3600),
        ..ControlConfig::default()
    };
    let a = replica(db, &cfg, &sim, host).await;
    let b = replica(db, &cfg, &sim, host).await;
    (a, b, sim, host)
}

async fn workspace(db: &hearth_db::Db) -> WorkspaceId {
    let ws = WorkspaceId::new();
    db.create_workspace(&NewWorkspace {
        id: ws,
        name: format!("ws-{ws}"),
        quotas: Quotas::default(),
    })
    .await
    .unwrap();
    ws
}

/// One replica over a fresh SQLite database and one simulated host, with
/// a workspace.
struct OneReplica {
    _url: hearth_db::testing::TestUrl,
    db: hearth_db::Db,
    sim: Arc<SimHost>,
    host: HostId,
    control: Arc<Control>,
    ws: WorkspaceId,
}

async fn one_replica(cfg: &ControlConfig) -> OneReplica {
    let url = hearth_db::testing::sqlite_url();
    let db = hearth_db::Db::connect(&url.url).await.unwrap();
    let sim = Arc::new(SimHost::new());
    let host = HostId::new();
    let control = replica(&db, cfg, &sim, host).await;
    let ws = workspace(&db).await;
    OneReplica {
        _url: url,
        db,
        sim,
        host,
        control,
        ws,
    }
}

/// A sandbox row and, when it runs, its VM on the host.
async fn sandbox(db: &hearth_db::Db, sim: &SimHost, r: SandboxRow) -> SandboxRow {
    db.insert_sandbox(&r).await.unwrap();
    boot_vm(sim, &r).await;
    r
}

/// The sandbox's VM, created on the host at its generation and booted.
async fn boot_vm(sim: &SimHost, r: &SandboxRow) {
    sim.create_vm(CreateVm {
        id: Some(vm(r.id)),
        fence: r.generation,
        memory: r.mem,
        ..CreateVm::default()
    })
    .await
    .unwrap();
}

async fn replicas_share_the_fleet_duties(url: hearth_db::testing::TestUrl) {
    let db = Db::connect(&url.url).await.unwrap();
    let (a, b, sim, host) = two_replicas(&db).await;
    let ws = workspace(&db).await;
    let t0 = Timestamp::now();

    let idle = sandbox(
        &db,
        &sim,
        SandboxRow {
            idle_ttl: Duration::from_secs(60),
            ..row(ws, host, "idle", SandboxStatus::Ready)
        },
    )
    .await;

    // A leads from its first pass; nothing is idle yet.
    let first = a.reap_at(t0.plus(Duration::from_secs(10))).await;
    assert!(first.leader);
    assert_eq!(first.idle_stopped, 0);

    // Past the idle TTL, B's pass leaves the fleet's duties to A.
    let t1 = t0.plus(Duration::from_secs(70));
    let by_b = b.reap_at(t1).await;
    assert!(!by_b.leader, "{by_b:?}");
    assert_eq!(by_b.idle_stopped, 0);
    assert_eq!(
        db.get_sandbox_by_id(idle.id).await.unwrap().status,
        SandboxStatus::Ready
    );
    assert_eq!(sim.vm(vm(idle.id)).unwrap().state, VmState::Ready);

    // A stops it, once.
    let by_a = a.reap_at(t1).await;
    assert_eq!(by_a.idle_stopped, 1, "{by_a:?}");
    assert_eq!(
        db.get_sandbox_by_id(idle.id).await.unwrap().status,
        SandboxStatus::Stopped
    );
    assert_eq!(sim.vm(vm(idle.id)).unwrap().state, VmState::Stopped);
    assert_eq!(b.reap_at(t1).await, Default::default());

    // A dies with work in flight: a delete it marked and never finished, a
    // stop the host finished that it never recorded, a snapshot build
    // whose heartbeat stopped.
    let deleting = sandbox(
        &db,
        &sim,
        row(ws, host, "left-deleting", SandboxStatus::Deleting),
    )
    .await;
    let mut stopping = row(ws, host, "left-stopping", SandboxStatus::Ready);
    stopping.preserve_memory_on_stop = true;
    let stopping = sandbox(&db, &sim, stopping).await;
    let saved = sim
        .stop_vm(vm(stopping.id), 1, StopVm { save_memory: true })
        .await
        .unwrap()
        .saved
        .expect("the host saved memory");
    let building = building_snapshot(ws);
    db.insert_snapshot(ws, &building).await.unwrap();
    let a_lease_ends = t1.plus(LEASE_TTL);
    drop(a);

    // Before A's lease runs out, B still does nothing of the fleet's:
    // the stop is recorded by B's own host reconciliation (both replicas
    // run this host in process here), the rest waits.
    let early = b.reap_at(a_lease_ends.minus(Duration::from_secs(1))).await;
    assert!(!early.leader);
    assert_eq!(
        db.get_sandbox_by_id(deleting.id).await.unwrap().status,
        SandboxStatus::Deleting
    );

    // Then B takes over and finishes A's work.
    let took_over = b.reap_at(a_lease_ends.plus(Duration::from_secs(1))).await;
    assert!(took_over.leader, "{took_over:?}");
    assert_eq!(took_over.deletes_finished, 1, "{took_over:?}");
    assert_eq!(took_over.builds_failed, 1, "{took_over:?}");
    assert!(matches!(
        db.get_sandbox_by_id(deleting.id).await,
        Err(hearth_db::DbError::NotFound { .. })
    ));
    assert!(sim.vm(vm(deleting.id)).is_none(), "the host deleted its VM");
    let stopped = db.get_sandbox_by_id(stopping.id).await.unwrap();
    assert_eq!(stopped.status, SandboxStatus::Stopped, "{stopped:?}");
    let recorded = db.take_saved_memory(stopping.id).await.unwrap().unwrap();
    assert!(recorded.contains(&saved.memory), "{recorded}");
    let failed = db.get_snapshot(ws, building.id).await.unwrap();
    assert_eq!(failed.status, SnapshotStatus::Failed);
    assert_eq!(failed.memory_reserved, None);
    assert!(failed.status_message.unwrap().contains("went away"));

    // Nothing is done twice.
    let again = b.reap_at(a_lease_ends.plus(Duration::from_secs(2))).await;
    assert_eq!(again.deletes_finished + again.builds_failed, 0);
    db.close().await;
}

fn building_snapshot(ws: WorkspaceId) -> SnapshotRow {
    let now = Timestamp::now();
    let id = SnapshotId::new();
    SnapshotRow {
        id,
        workspace_id: Some(ws),
        name: "left-building".into(),
        tag: "latest".into(),
        status: SnapshotStatus::Building,
        status_message: None,
        image: "busybox".into(),
        fs_capacity: ByteSize::mib(64),
        labels: Default::default(),
        run_config: None,
        docker_image: None,
        created_at: now,
        updated_at: now,
        volume: Some(format!("snap-{id}")),
        memory_bytes: None,
        source_sandbox_id: None,
        image_digest: None,
        description: None,
        memory_reserved: Some(ByteSize::gib(1)),
        registry_id: None,
        cpu: None,
    }
}

use hearth_db::Db;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_fleet_duties_on_sqlite() {
    replicas_share_the_fleet_duties(hearth_db::testing::sqlite_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_fleet_duties_on_postgres() {
    if let Some(url) = hearth_db::testing::postgres_url().await {
        replicas_share_the_fleet_duties(url).await;
    }
}

/// The store's garbage is collected once per interval across replicas,
/// through a host (the control plane holds no store), whichever replica
/// takes the `gc` lease first; a restarted or second replica does not run
/// it again within the interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_gc_runs_once_per_interval_across_replicas() {
    let url = hearth_db::testing::sqlite_url();
    let db = Db::connect(&url.url).await.unwrap();
    let sim = Arc::new(SimHost::new());
    let host = HostId::new();
    let interval = Duration::from_secs(3600);
    let cfg = ControlConfig {
        reaper_interval: INTERVAL,
        lease: Duration::from_secs(24 * 3600),
        gc_interval: Some(interval),
        ..ControlConfig::default()
    };
    let a = replica(&db, &cfg, &sim, host).await;
    let b = replica(&db, &cfg, &sim, host).await;
    let runs = |want: u32| {
        let sim = sim.clone();
        async move {
            // The run is started in the background.
            for _ in 0..100 {
                if sim.gc_runs() >= want {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            sim.gc_runs()
        }
    };
    let t0 = Timestamp::now();
    a.reap_at(t0).await;
    assert_eq!(runs(1).await, 1);
    b.reap_at(t0.plus(Duration::from_secs(10))).await;
    a.reap_at(t0.plus(Duration::from_secs(20))).await;
    // A replica restarted within the interval does not run it again.
    let c = replica(&db, &cfg, &sim, host).await;
    c.reap_at(t0.plus(Duration::from_secs(30))).await;
    assert_eq!(runs(2).await, 1, "one run per interval");
    b.reap_at(t0.plus(interval + Duration::from_secs(1))).await;
    assert_eq!(runs(2).await, 2);
    a.reap_at(t0.plus(interval + Duration::from_secs(2))).await;
    assert_eq!(runs(3).await, 2);
    db.close().await;
}

/// Hosts reporting one S3 URL share a store, which one of them collects
/// (`hearth up`'s in-process host reports its URL as a remote host does,
/// so it and remote hosts on one bucket are collected once per interval);
/// a local-directory store is its host's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_reporting_one_bucket_are_collected_once_per_interval() {
    let url = hearth_db::testing::sqlite_url();
    let db = Db::connect(&url.url).await.unwrap();
    let stores = [
        "s3://fleet-bucket",
        "s3://fleet-bucket",
        "file:///var/lib/hearth/a/store",
        "file:///var/lib/hearth/b/store",
    ];
    let sims: Vec<Arc<SimHost>> = stores.iter().map(|_| Arc::new(SimHost::new())).collect();
    let hosts = stores
        .iter()
        .zip(&sims)
        .map(|(store, sim)| LocalHost {
            id: HostId::new(),
            host: sim.clone(),
            capacity_cpu: MilliCpu::vcpus(64),
            capacity_mem: ByteSize::gib(256),
            store_url: (*store).into(),
        })
        .collect();
    let cfg = ControlConfig {
        reaper_interval: INTERVAL,
        lease: Duration::from_secs(24 * 3600),
        gc_interval: Some(Duration::from_secs(3600)),
        ..ControlConfig::default()
    };
    let control = Control::open(db.clone(), cfg, hosts).await.unwrap();
    control.reap_at(Timestamp::now()).await;
    let runs = || sims.iter().map(|s| s.gc_runs()).collect::<Vec<_>>();
    for _ in 0..100 {
        if runs().iter().sum::<u32>() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let r = runs();
    assert_eq!(r[0] + r[1], 1, "the shared bucket once: {r:?}");
    assert_eq!((r[2], r[3]), (1, 1), "each local store by its host: {r:?}");
    db.close().await;
}

/// A boot the host finished whose replica died before recording it is
/// recorded `ready` by reconciliation (not failed ten minutes later);
/// one whose VM failed on its host is recorded `failed` with the host's
/// reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_boot_its_replica_did_not_record_is_recorded_ready() {
    let cfg = ControlConfig {
        orphan_after: Duration::ZERO,
        ..ControlConfig::default()
    };
    let OneReplica {
        _url,
        db,
        sim,
        host,
        control,
        ws,
    } = one_replica(&cfg).await;
    let booted = sandbox(
        &db,
        &sim,
        row(ws, host, "booted", SandboxStatus::Provisioning),
    )
    .await;
    let crashed = sandbox(
        &db,
        &sim,
        row(ws, host, "crashed", SandboxStatus::Provisioning),
    )
    .await;
    assert!(sim.crash(vm(crashed.id), "test"));
    tokio::time::sleep(Duration::from_millis(5)).await;
    control.reap_once().await;
    assert_eq!(
        db.get_sandbox_by_id(booted.id).await.unwrap().status,
        SandboxStatus::Ready
    );
    // A boot that ended in a failure on its host is recorded failed at
    // once, with the host's reason, not left for the stuck-boot reaper.
    assert_eq!(
        db.get_sandbox_by_id(crashed.id).await.unwrap().status,
        SandboxStatus::Failed
    );
    db.close().await;
}

/// A boot whose replica died (it never reached the host, so no host
/// reports it) is failed once its stamps stop for `orphan_after`, not
/// after `stale_provisioning`'s 10 minutes; a boot still stamping is left
/// to run, and so is a start of a sandbox stamped long ago (the start
/// stamps it again) (issue 19).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_boot_whose_replica_died_is_failed_after_orphan_after() {
    let url = hearth_db::testing::sqlite_url();
    let db = Db::connect(&url.url).await.unwrap();
    let (a, _b, _sim, host) = two_replicas(&db).await;
    let ws = workspace(&db).await;
    let now = Timestamp::now();
    let orphan_after = ControlConfig::default().orphan_after;
    let long_ago = now.minus(orphan_after * 10);
    let mut rows = Vec::new();
    for (name, status) in [
        ("abandoned", SandboxStatus::Provisioning),
        ("alive", SandboxStatus::Provisioning),
        ("restarted", SandboxStatus::Stopped),
    ] {
        let mut r = row(ws, host, name, status);
        (r.created_at, r.updated_at) = (long_ago, long_ago);
        db.insert_sandbox(&r).await.unwrap();
        rows.push(r);
    }
    assert!(db.touch_boot(rows[1].id, 1, now).await.unwrap());
    assert!(
        !db.touch_boot(rows[1].id, 7, now).await.unwrap(),
        "a stamp at another generation touches nothing"
    );
    // A start: stopped → provisioning stamps the boot afresh.
    let start = hearth_db::StatusExtra {
        expect_status: vec![SandboxStatus::Stopped],
        ..Default::default()
    };
    db.set_status(rows[2].id, SandboxStatus::Provisioning, None, start)
        .await
        .unwrap();
    let report = a.reap_at(now).await;
    assert!(report.leader);
    assert_eq!(report.boots_failed, 1, "{report:?}");
    let got = |i: usize| {
        let db = db.clone();
        let id = rows[i].id;
        async move { db.get_sandbox_by_id(id).await.unwrap() }
    };
    let failed = got(0).await;
    assert_eq!(failed.status, SandboxStatus::Failed);
    assert!(
        failed
            .status_message
            .as_deref()
            .unwrap_or("")
            .contains("abandoned"),
        "{failed:?}"
    );
    assert_eq!(got(1).await.status, SandboxStatus::Provisioning);
    assert_eq!(got(2).await.status, SandboxStatus::Provisioning);
}

/// Reconciliation lists a host's VMs before it reads their rows, so a boot
/// that ends in between shows a `ready` row beside its VM still booting,
/// or beside no VM at all when the VM was created after the listing. Such
/// a sandbox is not failed: its VM is asked about again after the row was
/// read (a `ready` sandbox whose VM was listed booting was once recorded
/// `failed` while it ran, after a `hearth up` restart and a start). A
/// sandbox whose VM really died is still failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_boot_that_ends_while_its_host_is_listed_is_not_failed() {
    let OneReplica {
        _url,
        db,
        sim,
        host,
        control,
        ws,
    } = one_replica(&ControlConfig::default()).await;
    let crashed = sandbox(&db, &sim, row(ws, host, "crashed", SandboxStatus::Ready)).await;
    assert!(sim.crash(vm(crashed.id), "test"));
    let booting = row(ws, host, "booting", SandboxStatus::Provisioning);
    let created = row(ws, host, "created", SandboxStatus::Provisioning);
    for r in [&booting, &created] {
        db.insert_sandbox(r).await.unwrap();
    }
    // A boot of 300 ms begins before the listing (taken at once, answered
    // 600 ms later); the other VM is created just after it.
    sim.set_boot_time(Duration::from_millis(300));
    sim.set_list_delay(Duration::from_millis(600));
    let boot = |r: &SandboxRow| {
        let (db, sim, r) = (db.clone(), sim.clone(), r.clone());
        async move {
            boot_vm(&sim, &r).await;
            // What the replica driving the boot records.
            let done = hearth_db::StatusExtra {
                expect_generation: Some(r.generation),
                expect_status: vec![SandboxStatus::Provisioning],
                ..Default::default()
            };
            db.set_status(r.id, SandboxStatus::Ready, None, done)
                .await
                .unwrap();
        }
    };
    let first = tokio::spawn(boot(&booting));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let listing = tokio::spawn({
        let control = control.clone();
        async move { control.reconcile(false).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = tokio::spawn(boot(&created));
    for task in [first, second, listing] {
        task.await.unwrap();
    }
    sim.set_list_delay(Duration::ZERO);
    for r in [&booting, &created] {
        let now = db.get_sandbox_by_id(r.id).await.unwrap();
        assert_eq!(
            (now.status, now.status_message.as_deref()),
            (SandboxStatus::Ready, None),
            "{}",
            r.name
        );
        assert_eq!(sim.vm(vm(r.id)).unwrap().state, VmState::Ready);
    }
    let now = db.get_sandbox_by_id(crashed.id).await.unwrap();
    assert_eq!(now.status, SandboxStatus::Failed, "{now:?}");
    db.close().await;
}

/// A reconcile pass asks each host only for what changed on it since the
/// last (its change feed), and reads only those VMs' rows: a VM lost and
/// a VM nobody owns are both handled by such a pass, a quiet host costs no
/// row, and a restart reads the host whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_reads_only_what_changed_on_a_host() {
    let OneReplica {
        _url,
        db,
        sim,
        host,
        control,
        ws,
    } = one_replica(&ControlConfig::default()).await;
    let mut rows = Vec::new();
    for i in 0..20 {
        let name = format!("s{i}");
        rows.push(sandbox(&db, &sim, row(ws, host, &name, SandboxStatus::Ready)).await);
    }
    let counts = || control.metrics().reconcile_counts();
    // The first pass after the open (which read the host whole, empty)
    // sees the 20 new VMs and reads their 20 rows.
    let (whole, _, read) = counts();
    control.reconcile(false).await;
    let (w1, c1, r1) = counts();
    assert_eq!((w1, r1 - read), (whole, 20), "{:?}", counts());
    assert!(c1 >= 1);

    // Nothing moved: a pass reads no row.
    control.reconcile(false).await;
    assert_eq!(counts().2, r1);

    // One VM dies, and a VM nobody owns appears.
    let lost = &rows[7];
    assert!(sim.crash(vm(lost.id), "test"));
    let stray = VmId::new();
    sim.create_vm(CreateVm {
        id: Some(stray),
        fence: 1,
        ..CreateVm::default()
    })
    .await
    .unwrap();
    control.reconcile(false).await;
    let (w2, _, r2) = counts();
    assert_eq!(w2, w1, "no whole read");
    assert_eq!(r2 - r1, 1, "only the lost VM's row (the stray has none)");
    let now = db.get_sandbox_by_id(lost.id).await.unwrap();
    assert_eq!(now.status, SandboxStatus::Failed, "{now:?}");
    assert!(sim.vm(stray).is_none(), "the stray VM is removed");
    for r in rows.iter().filter(|r| r.id != lost.id) {
        let now = db.get_sandbox_by_id(r.id).await.unwrap();
        assert_eq!(now.status, SandboxStatus::Ready, "{}", r.name);
    }

    // After a restart the host is read whole: all 20 rows.
    control.reconcile(true).await;
    let (w3, _, r3) = counts();
    assert_eq!((w3, r3 - r2), (w2 + 1, 20));
    db.close().await;
}
