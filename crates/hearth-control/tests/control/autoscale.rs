//! The elected host autoscaler over a scripted load: the control plane's
//! reapers (at chosen times) read committed CPU from the database, decide
//! with LangSmith's rule and scale through a real command hook (a shell
//! script that keeps the replica count in a file). Checks: each decision
//! is `ceil(committed / (host vCPU × 70 %)) + 1` clamped to [1, 10];
//! scale-up is immediate; scale-down waits out the stabilization window
//! from the last peak and removes one host per window.

use std::sync::Arc;
use std::time::Duration;

use hearth_control::{AutoscaleSetup, Control, ControlConfig};
use hearth_db::{HostRow, HostState, NewWorkspace, Quotas, SandboxRow, SandboxStatus, Timestamp};
use hearth_fleet::{AutoscalePolicy, CommandHook};
use hearth_types::{ByteSize, HostId, MilliCpu, SandboxId, WorkspaceId};

const WINDOW: Duration = Duration::from_secs(60);

fn hook(dir: &std::path::Path) -> CommandHook {
    let script = dir.join("scale.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nset -e\ncd {}\nif [ \"$HEARTH_QUERY_REPLICAS\" = 1 ]; then cat count; exit 0; fi\n\
             echo \"$HEARTH_DESIRED_REPLICAS\" > count\necho \"$HEARTH_DESIRED_REPLICAS\" >> calls\n",
            dir.display()
        ),
    )
    .unwrap();
    std::fs::write(dir.join("count"), "1\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    CommandHook::new(&script, Vec::<String>::new(), Duration::from_secs(10))
}

fn sandbox(ws: WorkspaceId, host: HostId, i: usize, cpu: u32) -> SandboxRow {
    SandboxRow {
        cpu: MilliCpu(cpu),
        ..crate::harness::sandbox_row(ws, host, &format!("load-{i:04}"), SandboxStatus::Ready)
    }
}

/// A control plane whose autoscaler scales the hook in a fresh directory
/// (starting at 1 replica), over two in-database hosts.
struct Setup {
    db: hearth_db::testing::TestDb,
    control: Arc<Control>,
    dir: std::path::PathBuf,
    ws: WorkspaceId,
    hosts: Vec<HostId>,
    t0: Timestamp,
}

impl Setup {
    fn count(&self) -> u32 {
        std::fs::read_to_string(self.dir.join("count"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn setup() -> Setup {
    let url = hearth_db::testing::sqlite_url();
    let db = url.open().await;
    let dir = std::env::temp_dir().join(format!("hearth-autoscale-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut policy = AutoscalePolicy::new(MilliCpu(16_000));
    policy.enabled = true;
    policy.scale_down_stabilization = WINDOW;
    let cfg = ControlConfig {
        autoscale: Some(AutoscaleSetup {
            policy,
            backend: Arc::new(hook(&dir)),
        }),
        // Leases of the in-database hosts below are not renewed by anyone.
        lease: Duration::from_secs(3600),
        ..ControlConfig::default()
    };
    let ws = WorkspaceId::new();
    db.create_workspace(&NewWorkspace {
        id: ws,
        name: "load".into(),
        quotas: Quotas::default(),
    })
    .await
    .unwrap();
    // Hosts in the registry (placement is not exercised here).
    let t0 = Timestamp::now();
    let mut hosts = Vec::new();
    for _ in 0..2 {
        let h = HostRow {
            id: HostId::new(),
            address: "in-process".into(),
            state: HostState::Ready,
            capacity_cpu: MilliCpu(1_000_000),
            capacity_mem: ByteSize::gib(4096),
            lease_expires_at: t0.plus(Duration::from_secs(7200)),
            registered_at: t0,
            updated_at: t0,
            epoch: 1,
            version: "test".into(),
            store_url: String::new(),
            disk_free: ByteSize::gib(100),
            store_error: None,
        };
        db.upsert_host(&h).await.unwrap();
        hosts.push(h.id);
    }
    let control = Control::open(db.db.clone(), cfg, Vec::new()).await.unwrap();
    Setup {
        db,
        control,
        dir,
        ws,
        hosts,
        t0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_follow_the_formula_and_the_stabilization_window() {
    let s = setup().await;
    let (db, control, ws, hosts, t0) = (&s.db, &s.control, s.ws, &s.hosts, s.t0);
    let mut live: Vec<SandboxId> = Vec::new();
    let mut n = 0;
    // (seconds from start, sandboxes of 0.5 vCPU, the replica count then)
    // 60 × 0.5 vCPU = 30 vCPU → ceil(30 / 11.2) + 1 = 4 (LangSmith's
    // example); 120 → 60 vCPU → 6 + 1 = 7; 20 → 10 vCPU → 1 + 1 = 2.
    let script: [(u64, usize, u32); 11] = [
        (0, 0, 1),
        (10, 60, 4),    // up at once
        (20, 120, 7),   // up at once
        (30, 20, 7),    // the peak (7) is held for the window
        (70, 20, 7),    // 50 s after the peak: still held
        (81, 20, 6),    // the window has passed: one host down
        (100, 20, 6),   // one host per window
        (142, 20, 5),   // a window after the last removal: one more
        (160, 400, 10), // 200 vCPU → 19, clamped to max 10, at once
        (200, 0, 10),   // the new peak is held for a window
        (225, 0, 9),    // then one host down
    ];
    for (t, want_sandboxes, want) in script {
        while live.len() < want_sandboxes {
            let row = sandbox(ws, hosts[n % 2], n, 500);
            n += 1;
            db.insert_sandbox(&row).await.unwrap();
            live.push(row.id);
        }
        while live.len() > want_sandboxes {
            db.delete_sandbox(live.pop().unwrap()).await.unwrap();
        }
        control.reap_at(t0.plus(Duration::from_secs(t))).await;
        let count = s.count();
        let committed = want_sandboxes as u64 * 500;
        let formula = (committed.div_ceil(11_200) + 1).clamp(1, 10);
        println!("t={t:>3}s committed {committed:>6}m formula {formula:>2} replicas {count:>2}");
        assert_eq!(count, want, "at t={t}s with {want_sandboxes} sandboxes");
    }
    let calls = std::fs::read_to_string(s.dir.join("calls")).unwrap();
    // Only changes call the hook.
    assert_eq!(
        calls.split_whitespace().collect::<Vec<_>>(),
        ["4", "7", "6", "5", "10", "9"]
    );
}

/// A host whose object store fails holds its lease but takes no
/// placements: the pool gets a host more for it at once, and gives it
/// back a window after the store recovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_store_fails_is_replaced_until_it_recovers() {
    let s = setup().await;
    for i in 0..60 {
        // 60 × 0.5 vCPU: ceil(30 / 11.2) + 1 = 4.
        let row = sandbox(s.ws, s.hosts[i % 2], i, 500);
        s.db.insert_sandbox(&row).await.unwrap();
    }
    let at = |secs| s.t0.plus(Duration::from_secs(secs));
    s.control.reap_at(at(0)).await;
    assert_eq!(s.count(), 4);
    s.db.set_host_store_error(s.hosts[0], Some("store: connection refused"))
        .await
        .unwrap();
    s.control.reap_at(at(10)).await;
    assert_eq!(
        s.count(),
        5,
        "one more host for the one taking no placements"
    );
    s.db.set_host_store_error(s.hosts[0], None).await.unwrap();
    s.control.reap_at(at(20)).await;
    assert_eq!(s.count(), 5, "the peak is held for the window");
    s.control.reap_at(at(11 + WINDOW.as_secs())).await;
    assert_eq!(s.count(), 4, "given back once the window passed");
}
