//! Placement and quota counters (migration 11): what the database keeps
//! per workspace and per host follows every write, and two control-plane
//! replicas placing on one host through their own connections never
//! commit more than it holds.

use hearth_db::{
    testing, Db, DbError, HostLoad, HostRow, HostState, Quotas, SandboxFilter, SandboxStatus,
    StatusExtra, Timestamp, WorkspaceUsage,
};
use hearth_types::{ByteSize, HostId, MilliCpu, WorkspaceId};

use crate::hosts_snapshots::snapshot;
use crate::{each_backend, sandbox, workspace};

pub fn host(cpu: u32, gib: u64) -> HostRow {
    HostRow {
        id: HostId::new(),
        address: "http://10.0.0.1:7070".into(),
        state: HostState::Ready,
        capacity_cpu: MilliCpu(cpu),
        capacity_mem: ByteSize::gib(gib),
        lease_expires_at: Timestamp::from_unix_ms(i64::MAX / 2),
        registered_at: Timestamp::from_unix_ms(1000),
        updated_at: Timestamp::from_unix_ms(1000),
        epoch: 0,
        version: "test".into(),
        store_url: "file:///store".into(),
        disk_free: ByteSize::gib(100),
        store_error: None,
    }
}

/// A small deterministic generator (the sequence is the test's input).
struct Lcg(u64);
impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// The counters, recomputed the slow way from every row: what the sums
/// over all sandboxes said before migration 11.
async fn recount(db: &Db, ws: WorkspaceId, hosts: &[HostId]) -> (WorkspaceUsage, Vec<HostLoad>) {
    let rows = db
        .list_sandboxes(
            ws,
            &SandboxFilter {
                page_size: 1000,
                ..SandboxFilter::default()
            },
        )
        .await
        .unwrap()
        .items;
    let mut u = WorkspaceUsage::default();
    let mut loads: Vec<HostLoad> = hosts
        .iter()
        .map(|&host_id| HostLoad {
            host_id,
            cpu: MilliCpu(0),
            mem: ByteSize(0),
            sandboxes: 0,
        })
        .collect();
    for s in rows.iter().filter(|s| s.status != SandboxStatus::Deleting) {
        u.sandboxes += 1;
        u.disk = ByteSize(u.disk.0 + s.fs_capacity.0);
        if s.status.is_live() {
            u.cpu = MilliCpu(u.cpu.0 + s.cpu.0);
            u.mem = ByteSize(u.mem.0 + s.mem.0);
        }
    }
    for s in rows.iter().filter(|s| s.status.is_live()) {
        if let Some(l) = loads.iter_mut().find(|l| Some(l.host_id) == s.host_id) {
            l.cpu = MilliCpu(l.cpu.0 + s.cpu.0);
            l.mem = ByteSize(l.mem.0 + s.mem.0);
            l.sandboxes += 1;
        }
    }
    let snaps = db
        .list_snapshots(ws, &hearth_db::SnapshotFilter::default())
        .await
        .unwrap()
        .items;
    for s in snaps.iter().filter(|s| s.workspace_id == Some(ws)) {
        u.snapshots += 1;
        let mem = s.memory_bytes.or(s.memory_reserved).unwrap_or(ByteSize(0));
        u.snapshot_bytes = ByteSize(u.snapshot_bytes.0 + s.fs_capacity.0 + mem.0);
    }
    (u, loads)
}

/// 400 random writes (inserts in any status, status changes that move
/// sandboxes between hosts or off them, resizes, deletes, snapshots added,
/// finished and deleted): after each, the counters equal the sums.
#[tokio::test]
async fn usage_counters_follow_every_write() {
    each_backend!(|db| {
        let ws = workspace(db, Quotas::default()).await.id;
        let hosts = [host(64_000, 256), host(64_000, 256)];
        for h in &hosts {
            db.upsert_host(h).await.unwrap();
        }
        let ids: Vec<HostId> = hosts.iter().map(|h| h.id).collect();
        let pick_host = |r: &mut Lcg| match r.below(3) {
            0 => None,
            i => Some(ids[i as usize - 1]),
        };
        const STATUSES: [SandboxStatus; 5] = [
            SandboxStatus::Provisioning,
            SandboxStatus::Ready,
            SandboxStatus::Stopped,
            SandboxStatus::Failed,
            SandboxStatus::Deleting,
        ];
        let mut r = Lcg(7);
        let mut live = Vec::new();
        let mut snaps = Vec::new();
        for step in 0..400 {
            match r.below(6) {
                0 | 1 => {
                    let mut s = sandbox(ws, &format!("s{step}"));
                    s.status = STATUSES[r.below(5) as usize];
                    s.host_id = pick_host(&mut r);
                    s.cpu = MilliCpu(250 * (1 + r.below(8) as u32));
                    s.mem = ByteSize::mib(256 * (1 + r.below(8)));
                    s.fs_capacity = ByteSize::gib(1 + r.below(4));
                    db.insert_sandbox(&s).await.unwrap();
                    live.push(s.id);
                }
                2 | 3 if !live.is_empty() => {
                    let id = live[r.below(live.len() as u64) as usize];
                    let extra = StatusExtra {
                        host_id: Some(pick_host(&mut r)),
                        ..StatusExtra::default()
                    };
                    let to = STATUSES[r.below(5) as usize];
                    db.set_status(id, to, None, extra).await.unwrap();
                }
                4 if !live.is_empty() => {
                    let i = r.below(live.len() as u64) as usize;
                    if r.below(2) == 0 {
                        db.delete_sandbox(live.swap_remove(i)).await.unwrap();
                    } else {
                        let mut s = db.get_sandbox_by_id(live[i]).await.unwrap();
                        s.cpu = MilliCpu(250 * (1 + r.below(8) as u32));
                        s.mem = ByteSize::mib(256 * (1 + r.below(8)));
                        s.fs_capacity = ByteSize::gib(1 + r.below(4));
                        db.update_sandbox(&s, s.updated_at).await.unwrap();
                    }
                }
                _ => {
                    if snaps.is_empty() || r.below(2) == 0 {
                        let mut s = snapshot(&format!("snap{step}"), "latest");
                        s.workspace_id = Some(ws);
                        s.fs_capacity = ByteSize::gib(1 + r.below(4));
                        s.memory_reserved = (r.below(2) == 0).then(|| ByteSize::mib(512));
                        db.insert_snapshot(ws, &s).await.unwrap();
                        snaps.push(s.id);
                    } else {
                        let id = snaps.swap_remove(r.below(snaps.len() as u64) as usize);
                        db.delete_snapshot(ws, id).await.unwrap();
                    }
                }
            }
            let (want, want_loads) = recount(db, ws, &ids).await;
            assert_eq!(db.workspace_usage(ws).await.unwrap(), want, "step {step}");
            let mut got_loads = db.host_load().await.unwrap();
            got_loads.sort_by_key(|l| ids.iter().position(|&i| i == l.host_id));
            assert_eq!(got_loads, want_loads, "step {step}");
        }
    });
}

/// Two replicas (each its own connection pool, as two control-plane
/// processes) insert a sandbox onto one host with room for one more, at
/// the same moment, 100 times: exactly one wins each round, the other is
/// told `NoRoom`, and the host never holds more than its capacity.
#[tokio::test]
async fn two_replicas_never_overcommit_a_host() {
    for t in testing::backends().await {
        eprintln!("-- backend {:?}", t.backend());
        let a: &Db = &t;
        let b = Db::connect(&t.url).await.unwrap();
        let ws = workspace(a, Quotas::default()).await.id;
        let h = host(4000, 16);
        a.upsert_host(&h).await.unwrap();
        for i in 0..3 {
            let mut s = sandbox(ws, &format!("base{i}"));
            s.host_id = Some(h.id);
            s.mem = ByteSize::gib(4);
            a.insert_sandbox_within_quota(&s).await.unwrap();
        }
        for round in 0..100 {
            let new = |n: &str| {
                let mut s = sandbox(ws, &format!("{n}{round}"));
                s.host_id = Some(h.id);
                s.mem = ByteSize::gib(4);
                s
            };
            let (sa, sb) = (new("a"), new("b"));
            let (ra, rb) = tokio::join!(
                a.insert_sandbox_within_quota(&sa),
                b.insert_sandbox_within_quota(&sb)
            );
            let winner = match (&ra, &rb) {
                (Ok(()), Err(DbError::NoRoom { host })) if *host == h.id => sa.id,
                (Err(DbError::NoRoom { host }), Ok(())) if *host == h.id => sb.id,
                other => panic!("round {round}: {other:?}"),
            };
            let load = a.host_load().await.unwrap();
            let l = load.iter().find(|l| l.host_id == h.id).unwrap();
            assert_eq!(
                (l.cpu, l.mem, l.sandboxes),
                (MilliCpu(4000), ByteSize::gib(16), 4),
                "round {round}"
            );
            a.delete_sandbox(winner).await.unwrap();
        }
        // A start onto a full host is refused the same way.
        let mut stopped = sandbox(ws, "stopped");
        stopped.status = SandboxStatus::Stopped;
        a.insert_sandbox(&stopped).await.unwrap();
        let mut fill = sandbox(ws, "fill");
        fill.host_id = Some(h.id);
        fill.mem = ByteSize::gib(4);
        a.insert_sandbox_within_quota(&fill).await.unwrap();
        let start = StatusExtra {
            host_id: Some(Some(h.id)),
            within_quota: true,
            host_room: true,
            expect_status: vec![SandboxStatus::Stopped],
            ..StatusExtra::default()
        };
        let got = b
            .set_status(stopped.id, SandboxStatus::Provisioning, None, start.clone())
            .await;
        assert!(matches!(got, Err(DbError::NoRoom { .. })), "{got:?}");
        a.delete_sandbox(fill.id).await.unwrap();
        b.set_status(stopped.id, SandboxStatus::Provisioning, None, start)
            .await
            .unwrap();
        b.close().await;
    }
}

/// Replicas starting together on a new database each seed the built-in
/// snapshots: three connection pools upserting one built-in at the same
/// moment, 30 times (a fresh name each round), all succeed and leave one
/// row (the fleet test once saw "snapshot busybox:latest already exists").
#[tokio::test]
async fn replicas_seeding_one_builtin_at_once_all_succeed() {
    for t in testing::backends().await {
        eprintln!("-- backend {:?}", t.backend());
        let a: &Db = &t;
        let b = Db::connect(&t.url).await.unwrap();
        let c = Db::connect(&t.url).await.unwrap();
        let ws = workspace(a, Quotas::default()).await.id;
        for round in 0..30 {
            let s = snapshot(&format!("seed{round}"), "latest");
            let (ra, rb, rc) = tokio::join!(
                a.upsert_builtin_snapshot(&s),
                b.upsert_builtin_snapshot(&s),
                c.upsert_builtin_snapshot(&s)
            );
            for r in [ra, rb, rc] {
                r.unwrap_or_else(|e| panic!("round {round}: {e} ({e:?})"));
            }
            assert_eq!(a.get_snapshot(ws, s.id).await.unwrap().id, s.id);
        }
    }
}
