//! Finding 5 of the security review: snapshots were limited by nothing.
//! They now count against the workspace's storage quota (one budget with
//! sandboxes' disks) and a count of snapshots, checked in the insert's
//! transaction; deleting one frees its share.

use hearth_db::{snapshot_size, DbError, QuotaKind, Quotas, SandboxStatus, SnapshotStatus};
use hearth_types::{ByteSize, WorkspaceId};

use crate::hosts_snapshots::snapshot;
use crate::{each_backend, sandbox, workspace};

fn quota_kind(r: &Result<(), DbError>) -> Option<(QuotaKind, u64, u64, u64)> {
    match r {
        Err(DbError::Quota {
            kind,
            limit,
            used,
            requested,
        }) => Some((*kind, *limit, *used, *requested)),
        _ => None,
    }
}

fn own(ws: WorkspaceId, name: &str, disk: ByteSize) -> hearth_db::SnapshotRow {
    let mut s = snapshot(name, "v1");
    s.workspace_id = Some(ws);
    s.fs_capacity = disk;
    s
}

#[tokio::test]
async fn finding5_snapshots_count_against_the_storage_quota() {
    each_backend!(|db| {
        let gib = ByteSize::gib(1).bytes();
        let ws = workspace(
            db,
            Quotas {
                max_storage: Some(ByteSize::gib(10)),
                ..Quotas::default()
            },
        )
        .await
        .id;
        let mut a = sandbox(ws, "a");
        a.fs_capacity = ByteSize::gib(4);
        a.status = SandboxStatus::Stopped;
        db.insert_sandbox_within_quota(&a).await.unwrap();

        let first = own(ws, "first", ByteSize::gib(4));
        db.publish_snapshot(ws, &first).await.unwrap();
        // A capture with memory charges the memory it may save while it
        // builds: 8 in use + 1 disk + 2 memory > 10.
        let mut second = own(ws, "second", ByteSize::gib(1));
        second.status = SnapshotStatus::Building;
        second.memory_reserved = Some(ByteSize::gib(2));
        assert_eq!(snapshot_size(&second), ByteSize::gib(3));
        let refused = db.publish_snapshot(ws, &second).await;
        assert_eq!(
            quota_kind(&refused),
            Some((QuotaKind::Storage, 10 * gib, 8 * gib, 3 * gib)),
            "{refused:?}"
        );
        // insert_snapshot is held to the same rule.
        let refused = db.insert_snapshot(ws, &second).await;
        assert_eq!(quota_kind(&refused).map(|q| q.0), Some(QuotaKind::Storage));
        // Exactly full is allowed.
        second.memory_reserved = Some(ByteSize::gib(1));
        db.publish_snapshot(ws, &second).await.unwrap();
        // The build records what it saved and drops the reservation.
        second.status = SnapshotStatus::Ready;
        second.memory_reserved = None;
        second.memory_bytes = Some(ByteSize::mib(768));
        db.update_snapshot(&second).await.unwrap();
        let stored = db.get_snapshot(ws, second.id).await.unwrap();
        assert_eq!(
            (stored.memory_bytes, stored.memory_reserved),
            (Some(ByteSize::mib(768)), None)
        );

        // One budget: the snapshots (5.75 GiB) and the disk (4) leave no
        // room for another sandbox's 1 GiB disk.
        let mut b = sandbox(ws, "b");
        b.fs_capacity = ByteSize::gib(1);
        b.status = SandboxStatus::Stopped;
        let refused = db.insert_sandbox_within_quota(&b).await;
        assert_eq!(
            quota_kind(&refused),
            Some((QuotaKind::Storage, 10 * gib, 10 * gib - gib / 4, gib)),
            "{refused:?}"
        );

        // Deleting a snapshot frees its share.
        db.delete_snapshot(ws, first.id).await.unwrap();
        db.insert_sandbox_within_quota(&b).await.unwrap();
        // Another workspace's snapshots and the built-ins count for nobody
        // else.
        let other = workspace(
            db,
            Quotas {
                max_storage: Some(ByteSize::gib(1)),
                ..Quotas::default()
            },
        )
        .await
        .id;
        db.upsert_builtin_snapshot(&snapshot("builtin", "latest"))
            .await
            .unwrap();
        db.publish_snapshot(other, &own(other, "small", ByteSize::gib(1)))
            .await
            .unwrap();
    });
}

#[tokio::test]
async fn finding5_snapshot_count_limit_is_enforced() {
    each_backend!(|db| {
        let ws = workspace(
            db,
            Quotas {
                max_snapshots: Some(2),
                ..Quotas::default()
            },
        )
        .await
        .id;
        let one = own(ws, "one", ByteSize::gib(1));
        db.publish_snapshot(ws, &one).await.unwrap();
        // Moving a tag keeps the older snapshot (by id): it still counts.
        let again = own(ws, "one", ByteSize::gib(1));
        db.publish_snapshot(ws, &again).await.unwrap();
        let mut failed = own(ws, "two", ByteSize::gib(1));
        failed.status = SnapshotStatus::Failed;
        let refused = db.publish_snapshot(ws, &failed).await;
        assert_eq!(
            quota_kind(&refused),
            Some((QuotaKind::Snapshots, 2, 2, 1)),
            "{refused:?}"
        );
        let refused = db.insert_snapshot(ws, &failed).await;
        assert_eq!(
            quota_kind(&refused).map(|q| q.0),
            Some(QuotaKind::Snapshots)
        );
        db.delete_snapshot(ws, one.id).await.unwrap();
        // A failed build counts too, until it is deleted.
        db.publish_snapshot(ws, &failed).await.unwrap();
        let refused = db
            .publish_snapshot(ws, &own(ws, "three", ByteSize::gib(1)))
            .await;
        assert_eq!(
            quota_kind(&refused).map(|q| q.0),
            Some(QuotaKind::Snapshots)
        );
        // The limit is the workspace's own.
        let other = workspace(db, Quotas::default()).await.id;
        for i in 0..3 {
            db.publish_snapshot(other, &own(other, &format!("s{i}"), ByteSize::gib(1)))
                .await
                .unwrap();
        }
    });
}

#[tokio::test]
async fn a_templates_cache_layers_take_storage_not_a_place_in_the_count() {
    each_backend!(|db| {
        let ws = workspace(
            db,
            Quotas {
                max_snapshots: Some(1),
                max_storage: Some(ByteSize::gib(3)),
                ..Quotas::default()
            },
        )
        .await
        .id;
        let layer = |i: u32| own(ws, &format!("hearth-layer-{i:040}"), ByteSize::gib(1));
        db.publish_snapshot(ws, &layer(1)).await.unwrap();
        db.publish_snapshot(ws, &own(ws, "app", ByteSize::gib(1)))
            .await
            .unwrap();
        db.publish_snapshot(ws, &layer(2)).await.unwrap();
        let usage = db.workspace_usage(ws).await.unwrap();
        assert_eq!(usage.snapshots, 1, "{usage:?}");
        // The count holds for snapshots; storage holds for all.
        let refused = db
            .publish_snapshot(ws, &own(ws, "other", ByteSize::gib(1)))
            .await;
        assert_eq!(
            quota_kind(&refused).map(|q| q.0),
            Some(QuotaKind::Snapshots)
        );
        let refused = db.publish_snapshot(ws, &layer(3)).await;
        assert_eq!(quota_kind(&refused).map(|q| q.0), Some(QuotaKind::Storage));
        // A deleted layer frees its bytes, and the count stays.
        let first = db
            .find_snapshot_by_ref(ws, &format!("hearth-layer-{:040}", 1), "v1")
            .await
            .unwrap();
        db.delete_snapshot(ws, first.id).await.unwrap();
        assert_eq!(db.workspace_usage(ws).await.unwrap().snapshots, 1);
        db.publish_snapshot(ws, &layer(3)).await.unwrap();
    });
}
