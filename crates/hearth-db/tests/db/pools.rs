//! Warm pools (migration 13): members count on their host and never in a
//! workspace; a claim turns the oldest ready member into the sandbox under
//! its id, host and generation, and replicas claiming at once never take
//! one member twice.

use hearth_db::{
    testing, Db, DbError, MemberRow, MemberStatus, PoolRow, Quotas, SandboxStatus, Timestamp,
};
use hearth_types::{ByteSize, MilliCpu, PoolId, SandboxId, SnapshotId};

use crate::placement::host;
use crate::{each_backend, sandbox, workspace};

fn pool(ws: hearth_types::WorkspaceId, name: &str, snapshot: SnapshotId) -> PoolRow {
    let now = Timestamp::now();
    PoolRow {
        id: PoolId::new(),
        workspace_id: ws,
        name: name.into(),
        snapshot_id: snapshot,
        size: 2,
        cpu: MilliCpu(1000),
        mem: ByteSize::gib(1),
        fs_capacity: ByteSize::gib(8),
        claims: 0,
        misses: 0,
        created_at: now,
        updated_at: now,
    }
}

fn member(p: &PoolRow, host: hearth_types::HostId, generation: u64) -> MemberRow {
    MemberRow {
        id: SandboxId::new(),
        pool_id: p.id,
        host_id: host,
        generation,
        status: MemberStatus::Warming,
        cpu: p.cpu,
        mem: p.mem,
        created_at: Timestamp::now(),
    }
}

#[tokio::test]
async fn members_count_on_their_host_and_a_claim_becomes_the_sandbox() {
    each_backend!(|db| {
        let ws = workspace(db, Quotas::default()).await.id;
        let h = host(4000, 16);
        db.upsert_host(&h).await.unwrap();
        let snap = SnapshotId::new();
        let p = pool(ws, "py", snap);
        db.create_pool(&p).await.unwrap();
        let dup = db.create_pool(&pool(ws, "py", snap)).await;
        assert!(matches!(dup, Err(DbError::Conflict { .. })), "{dup:?}");
        let m1 = member(&p, h.id, 5);
        let m2 = MemberRow {
            created_at: Timestamp::from_unix_ms(m1.created_at.unix_ms() + 1),
            ..member(&p, h.id, 6)
        };
        db.insert_member(&m1).await.unwrap();
        db.insert_member(&m2).await.unwrap();
        let load = |db: &Db| {
            let db = db.clone();
            async move {
                let l = db.host_load().await.unwrap();
                let l = l.iter().find(|l| l.host_id == h.id).unwrap().clone();
                (l.sandboxes, l.cpu, l.mem)
            }
        };
        // Their CPU and memory; they are no sandboxes.
        assert_eq!(load(db).await, (0, MilliCpu(2000), ByteSize::gib(2)));
        assert_eq!(db.workspace_usage(ws).await.unwrap().sandboxes, 0);

        // Nothing ready yet: no claim, nothing written.
        let mut s = sandbox(ws, "mine");
        s.snapshot_id = snap;
        s.cpu = p.cpu;
        s.mem = p.mem;
        assert_eq!(db.claim_member(p.id, &s, |_| {}).await.unwrap(), None);
        assert!(db.get_sandbox_by_id(s.id).await.is_err());

        assert!(db.mark_member_ready(m2.id).await.unwrap());
        assert!(db.mark_member_ready(m1.id).await.unwrap());
        let found = db
            .find_pool(ws, snap, p.cpu, p.mem, p.fs_capacity)
            .await
            .unwrap();
        assert_eq!(found.map(|f| f.id), Some(p.id));
        assert!(db
            .find_pool(ws, snap, MilliCpu(2000), p.mem, p.fs_capacity)
            .await
            .unwrap()
            .is_none());

        // The oldest ready member (m1) becomes the sandbox, made the
        // member's by the caller before it is stored.
        let row = db
            .claim_member(p.id, &s, |r| r.name = format!("{}-{}", r.name, r.id))
            .await
            .unwrap()
            .expect("a claim");
        assert_eq!(
            (row.id, row.host_id, row.generation, row.status),
            (m1.id, Some(h.id), 5, SandboxStatus::Provisioning)
        );
        let mine = format!("mine-{}", m1.id);
        assert_eq!(row.name, mine);
        assert_eq!(db.get_sandbox_by_id(m1.id).await.unwrap().name, mine);
        let left: Vec<SandboxId> = db
            .list_members()
            .await
            .unwrap()
            .iter()
            .map(|m| m.id)
            .collect();
        assert_eq!(left, vec![m2.id]);
        // The VM moved from member to sandbox: the host holds the same.
        assert_eq!(load(db).await, (1, MilliCpu(2000), ByteSize::gib(2)));
        assert_eq!(db.workspace_usage(ws).await.unwrap().sandboxes, 1);
        assert_eq!(db.get_pool(ws, "py").await.unwrap().claims, 1);
        db.record_pool_miss(p.id).await.unwrap();
        assert_eq!(db.get_pool(ws, "py").await.unwrap().misses, 1);

        // A claim is within the workspace's quota like any create.
        let tight = workspace(
            db,
            Quotas {
                max_sandboxes: Some(0),
                ..Quotas::default()
            },
        )
        .await
        .id;
        let over = db.claim_member(p.id, &sandbox(tight, "over"), |_| {}).await;
        assert!(matches!(over, Err(DbError::Quota { .. })), "{over:?}");
        assert_eq!(db.list_members().await.unwrap().len(), 1, "nothing claimed");

        assert_eq!(db.snapshot_has_pools(snap).await.unwrap(), vec!["py"]);
        assert_eq!(db.resize_pool(ws, "py", 5).await.unwrap().size, 5);
        db.delete_pool(ws, "py").await.unwrap();
        assert!(matches!(
            db.get_pool(ws, "py").await,
            Err(DbError::NotFound { .. })
        ));
        assert!(db.snapshot_has_pools(snap).await.unwrap().is_empty());
        // Its member stays until it is removed from its host.
        assert!(db.delete_member(m2.id).await.unwrap());
        assert!(!db.delete_member(m2.id).await.unwrap());
        assert_eq!(load(db).await, (1, MilliCpu(1000), ByteSize::gib(1)));
    });
}

/// A member goes onto its host only if it has room (the same counter row
/// as sandboxes), and two replicas claiming from one pool at once take
/// different members, each once (PostgreSQL `SKIP LOCKED`; SQLite's write
/// lock).
#[tokio::test]
async fn members_need_room_and_concurrent_claims_take_each_member_once() {
    for t in testing::backends().await {
        eprintln!("-- backend {:?}", t.backend());
        let a: &Db = &t;
        let b = Db::connect(&t.url).await.unwrap();
        let ws = workspace(a, Quotas::default()).await.id;
        let h = host(8000, 4);
        a.upsert_host(&h).await.unwrap();
        let p = pool(ws, "race", SnapshotId::new());
        a.create_pool(&p).await.unwrap();
        let mut members = Vec::new();
        for _ in 0..4 {
            let m = member(&p, h.id, 1);
            a.insert_member(&m).await.unwrap();
            a.mark_member_ready(m.id).await.unwrap();
            members.push(m.id);
        }
        let full = a.insert_member(&member(&p, h.id, 1)).await;
        assert!(matches!(full, Err(DbError::NoRoom { .. })), "{full:?}");
        let mut claimed = Vec::new();
        for round in 0..3 {
            let (sa, sb) = (
                sandbox(ws, &format!("a{round}")),
                sandbox(ws, &format!("b{round}")),
            );
            let (ra, rb) = tokio::join!(
                a.claim_member(p.id, &sa, |_| {}),
                b.claim_member(p.id, &sb, |_| {})
            );
            for r in [ra, rb] {
                if let Some(row) = r.unwrap() {
                    claimed.push(row.id);
                }
            }
        }
        claimed.sort();
        let mut want = members.clone();
        want.sort();
        assert_eq!(claimed, want, "every member claimed exactly once");
        assert!(a.list_members().await.unwrap().is_empty());
    }
}
