use std::collections::BTreeMap;

use hearth_db::{
    DbError, HostLoad, HostRow, HostState, Quotas, SandboxStatus, SnapshotFilter, SnapshotRow,
    SnapshotSort, SnapshotStatus, SortOrder, StatusExtra, Timestamp,
};
use hearth_types::{ByteSize, HostId, MilliCpu, SnapshotId, WorkspaceId};

use crate::{each_backend, sandbox, workspace};

fn host(lease_ms: i64) -> HostRow {
    HostRow {
        id: HostId::new(),
        address: "http://10.0.0.1:7070".into(),
        state: HostState::Ready,
        capacity_cpu: MilliCpu(16_000),
        capacity_mem: ByteSize::gib(64),
        lease_expires_at: Timestamp::from_unix_ms(lease_ms),
        registered_at: Timestamp::from_unix_ms(1000),
        updated_at: Timestamp::from_unix_ms(1000),
        epoch: 0,
        version: "test".into(),
        store_url: "file:///store".into(),
        disk_free: ByteSize::gib(100),
        store_error: None,
    }
}

#[tokio::test]
async fn registrations_start_new_epochs_and_a_lost_lease_is_not_renewed() {
    each_backend!(|db| {
        let h = host(10_000);
        assert_eq!(db.register_host(&h).await.unwrap(), 1);
        let at = |ms| Timestamp::from_unix_ms(ms);
        // Renewal at the current epoch, before expiry.
        assert!(db
            .renew_lease_at_epoch(h.id, 1, at(5_000), at(15_000), ByteSize::gib(9), None)
            .await
            .unwrap());
        let row = db.get_host(h.id).await.unwrap();
        assert_eq!(
            (row.epoch, row.lease_expires_at, row.disk_free),
            (1, at(15_000), ByteSize::gib(9))
        );
        // Another epoch, or after expiry: refused.
        assert!(!db
            .renew_lease_at_epoch(h.id, 2, at(6_000), at(16_000), ByteSize::gib(9), None)
            .await
            .unwrap());
        assert!(!db
            .renew_lease_at_epoch(h.id, 1, at(15_001), at(25_000), ByteSize::gib(9), None)
            .await
            .unwrap());
        // Expired and marked down at its epoch; down is never renewed.
        let expired = db.expired_hosts(at(15_001)).await.unwrap();
        assert_eq!(expired.iter().map(|h| h.id).collect::<Vec<_>>(), vec![h.id]);
        assert!(!db.mark_host_down(h.id, 2).await.unwrap());
        assert!(db.mark_host_down(h.id, 1).await.unwrap());
        assert!(db.expired_hosts(at(15_001)).await.unwrap().is_empty());
        // Registering again: a new epoch, ready again.
        let mut again = host(40_000);
        again.id = h.id;
        assert_eq!(db.register_host(&again).await.unwrap(), 2);
        let row = db.get_host(h.id).await.unwrap();
        assert_eq!((row.epoch, row.state), (2, HostState::Ready));
    });
}

#[tokio::test]
async fn a_store_failure_reported_with_a_renewal_is_recorded_until_the_next_says_otherwise() {
    each_backend!(|db| {
        let h = host(10_000);
        assert_eq!(db.register_host(&h).await.unwrap(), 1);
        let at = |ms| Timestamp::from_unix_ms(ms);
        let renew = |store_error: Option<&'static str>, now: i64| {
            let db = db.clone();
            async move {
                db.renew_lease_at_epoch(
                    h.id,
                    1,
                    at(now),
                    at(now + 10_000),
                    ByteSize::gib(9),
                    store_error,
                )
                .await
                .unwrap()
            }
        };
        assert_eq!(db.get_host(h.id).await.unwrap().store_error, None);
        assert!(renew(Some("write the health probe: connection refused"), 2_000).await);
        assert_eq!(
            db.get_host(h.id).await.unwrap().store_error.as_deref(),
            Some("write the health probe: connection refused")
        );
        // A refused renewal (another epoch) records nothing.
        assert!(!db
            .renew_lease_at_epoch(h.id, 2, at(3_000), at(13_000), ByteSize::gib(9), None)
            .await
            .unwrap());
        assert!(db.list_hosts().await.unwrap()[0].store_error.is_some());
        // The store answers again: the next renewal clears it.
        assert!(renew(None, 4_000).await);
        assert_eq!(db.get_host(h.id).await.unwrap().store_error, None);
        // A registration clears it too (a host registers only once its
        // store answers).
        assert!(renew(Some("timed out"), 5_000).await);
        assert_eq!(db.register_host(&h).await.unwrap(), 2);
        assert_eq!(db.get_host(h.id).await.unwrap().store_error, None);
        // The in-process host's check is recorded without a lease.
        db.set_host_store_error(h.id, Some("timed out"))
            .await
            .unwrap();
        assert_eq!(
            db.get_host(h.id).await.unwrap().store_error.as_deref(),
            Some("timed out")
        );
        db.set_host_store_error(h.id, None).await.unwrap();
        assert_eq!(db.get_host(h.id).await.unwrap().store_error, None);
        assert!(matches!(
            db.set_host_store_error(HostId::new(), None).await,
            Err(DbError::NotFound { what: "host" })
        ));
    });
}

#[tokio::test]
async fn hosts_register_renew_and_sum_load() {
    each_backend!(|db| {
        let mut h1 = host(10_000);
        let h2 = host(20_000);
        db.upsert_host(&h1).await.unwrap();
        db.upsert_host(&h2).await.unwrap();
        // Re-registering updates everything but the first registration time.
        h1.address = "http://10.0.0.9:7070".into();
        h1.registered_at = Timestamp::from_unix_ms(5000);
        h1.updated_at = Timestamp::from_unix_ms(5000);
        db.upsert_host(&h1).await.unwrap();
        let got = db.get_host(h1.id).await.unwrap();
        assert_eq!(got.address, "http://10.0.0.9:7070");
        assert_eq!(got.registered_at, Timestamp::from_unix_ms(1000));
        assert_eq!(got.updated_at, Timestamp::from_unix_ms(5000));

        db.renew_host_lease(h2.id, Timestamp::from_unix_ms(99_000))
            .await
            .unwrap();
        db.set_host_state(h2.id, HostState::Draining).await.unwrap();
        let listed = db.list_hosts().await.unwrap();
        assert_eq!(listed.len(), 2);
        let got2 = listed.iter().find(|h| h.id == h2.id).unwrap();
        assert_eq!(got2.lease_expires_at, Timestamp::from_unix_ms(99_000));
        assert_eq!(got2.state, HostState::Draining);
        assert!(matches!(
            db.renew_host_lease(HostId::new(), Timestamp::now()).await,
            Err(DbError::NotFound { what: "host" })
        ));
        assert!(matches!(
            db.get_host(HostId::new()).await,
            Err(DbError::NotFound { .. })
        ));

        let ws = workspace(db, Quotas::default()).await;
        let place = |name: &str, host: HostId, status: SandboxStatus, cpu: u32, gib: u64| {
            let mut s = sandbox(ws.id, name);
            s.host_id = Some(host);
            s.status = status;
            s.cpu = MilliCpu(cpu);
            s.mem = ByteSize::gib(gib);
            s
        };
        for s in [
            place("a", h1.id, SandboxStatus::Ready, 1000, 4),
            place("b", h1.id, SandboxStatus::Provisioning, 500, 2),
            place("c", h1.id, SandboxStatus::Stopped, 4000, 16),
            place("d", h1.id, SandboxStatus::Failed, 4000, 16),
            place("e", h2.id, SandboxStatus::Deleting, 2000, 8),
        ] {
            db.insert_sandbox(&s).await.unwrap();
        }
        let mut load = db.host_load().await.unwrap();
        load.sort_by_key(|l| if l.host_id == h1.id { 0 } else { 1 });
        assert_eq!(
            load,
            vec![
                HostLoad {
                    host_id: h1.id,
                    cpu: MilliCpu(1500),
                    mem: ByteSize::gib(6),
                    sandboxes: 2
                },
                HostLoad {
                    host_id: h2.id,
                    cpu: MilliCpu(0),
                    mem: ByteSize(0),
                    sandboxes: 0
                },
            ]
        );
        // Moving a sandbox off a host releases its share.
        let a = db.get_sandbox(ws.id, "a").await.unwrap();
        db.set_status(
            a.id,
            SandboxStatus::Stopped,
            None,
            StatusExtra {
                host_id: Some(None),
                ..StatusExtra::default()
            },
        )
        .await
        .unwrap();
        let load = db.host_load().await.unwrap();
        let l1 = load.iter().find(|l| l.host_id == h1.id).unwrap();
        assert_eq!(
            (l1.cpu, l1.mem, l1.sandboxes),
            (MilliCpu(500), ByteSize::gib(2), 1)
        );
    });
}

pub(crate) fn snapshot(name: &str, tag: &str) -> SnapshotRow {
    SnapshotRow {
        id: SnapshotId::new(),
        workspace_id: None,
        name: name.into(),
        tag: tag.into(),
        status: SnapshotStatus::Ready,
        status_message: None,
        image: "debian-bookworm".into(),
        fs_capacity: ByteSize::gib(8),
        labels: BTreeMap::from([("os".to_owned(), "debian".to_owned())]),
        run_config: Some(serde_json::json!({"user": "root"})),
        docker_image: None,
        created_at: Timestamp::from_unix_ms(1000),
        updated_at: Timestamp::from_unix_ms(1000),
        volume: None,
        memory_bytes: None,
        source_sandbox_id: None,
        image_digest: None,
        description: None,
        memory_reserved: None,
        registry_id: None,
        cpu: None,
    }
}

#[tokio::test]
async fn snapshots_builtin_and_owned_visibility() {
    each_backend!(|db| {
        let ws1 = workspace(db, Quotas::default()).await.id;
        let ws2 = workspace(db, Quotas::default()).await.id;

        let mut base = snapshot("default", "latest");
        db.upsert_builtin_snapshot(&base).await.unwrap();
        // Upserting again updates in place.
        base.fs_capacity = ByteSize::gib(16);
        base.updated_at = Timestamp::from_unix_ms(2000);
        db.upsert_builtin_snapshot(&base).await.unwrap();
        for ws in [ws1, ws2] {
            assert_eq!(db.get_snapshot(ws, base.id).await.unwrap(), base);
            assert_eq!(
                db.find_snapshot_by_ref(ws, "default", "latest")
                    .await
                    .unwrap(),
                base
            );
        }
        // A second built-in with the same name:tag conflicts (NULL
        // workspaces are distinct in UNIQUE; the partial index catches it).
        let dup = snapshot("default", "latest");
        assert!(matches!(
            db.upsert_builtin_snapshot(&dup).await,
            Err(DbError::Conflict { .. })
        ));
        db.upsert_builtin_snapshot(&snapshot("default", "v1"))
            .await
            .unwrap();

        // ws1's own "default:latest" shadows the built-in for ws1 only.
        let mut own = snapshot("default", "latest");
        own.workspace_id = Some(ws1);
        own.status = SnapshotStatus::Building;
        own.run_config = None;
        own.docker_image = Some("python:3.12".into());
        db.insert_snapshot(ws1, &own).await.unwrap();
        assert_eq!(
            db.find_snapshot_by_ref(ws1, "default", "latest")
                .await
                .unwrap(),
            own
        );
        assert_eq!(
            db.find_snapshot_by_ref(ws2, "default", "latest")
                .await
                .unwrap()
                .id,
            base.id
        );
        assert!(matches!(
            db.get_snapshot(ws2, own.id).await,
            Err(DbError::NotFound { .. })
        ));
        assert!(matches!(
            db.find_snapshot_by_ref(ws1, "default", "nope").await,
            Err(DbError::NotFound { .. })
        ));
        let mut again = snapshot("default", "latest");
        again.workspace_id = Some(ws1);
        assert!(matches!(
            db.insert_snapshot(ws1, &again).await,
            Err(DbError::Conflict { .. })
        ));
        // A built-in upsert cannot take over a workspace's snapshot id.
        let mut hijack = own.clone();
        hijack.name = "hijack".into();
        assert!(matches!(
            db.upsert_builtin_snapshot(&hijack).await,
            Err(DbError::Conflict { .. })
        ));

        let tags = db.snapshot_tags(ws1, "default").await.unwrap();
        assert_eq!(
            tags.iter().map(|(t, _)| t.as_str()).collect::<Vec<_>>(),
            ["latest", "v1"]
        );
        assert_eq!(tags[0].1, own.id);
        assert_eq!(
            db.snapshot_tags(ws2, "default").await.unwrap()[0].1,
            base.id
        );

        db.set_snapshot_status(own.id, SnapshotStatus::Failed, Some("pull failed"))
            .await
            .unwrap();
        let failed = db.get_snapshot(ws1, own.id).await.unwrap();
        assert_eq!(failed.status, SnapshotStatus::Failed);
        assert_eq!(failed.status_message.as_deref(), Some("pull failed"));
        assert!(matches!(
            db.set_snapshot_status(SnapshotId::new(), SnapshotStatus::Ready, None)
                .await,
            Err(DbError::NotFound { .. })
        ));

        // Lists: own + built-ins, filtered and paged.
        let list = |ws: WorkspaceId, f: SnapshotFilter| async move {
            let mut f = f;
            let mut ids = Vec::new();
            loop {
                let page = db.list_snapshots(ws, &f).await.unwrap();
                ids.extend(page.items.into_iter().map(|s| (s.name, s.tag)));
                match page.next_cursor {
                    Some(c) => f.cursor = Some(c),
                    None => return ids,
                }
            }
        };
        let by_name = SnapshotFilter {
            sort_by: SnapshotSort::Name,
            sort_order: SortOrder::Asc,
            page_size: 1,
            ..SnapshotFilter::default()
        };
        assert_eq!(list(ws1, by_name.clone()).await.len(), 3);
        assert_eq!(list(ws2, by_name.clone()).await.len(), 2);
        let failed_only = SnapshotFilter {
            status: Some(SnapshotStatus::Failed),
            ..by_name.clone()
        };
        assert_eq!(
            list(ws1, failed_only.clone()).await,
            [("default".to_owned(), "latest".to_owned())]
        );
        assert!(list(ws2, failed_only).await.is_empty());
        let named = SnapshotFilter {
            name_contains: Some("DEF".into()),
            ..SnapshotFilter::default()
        };
        assert_eq!(list(ws2, named).await.len(), 2);
    });
}

#[tokio::test]
async fn snapshots_are_finished_and_deleted_only_when_unused() {
    each_backend!(|db| {
        let ws = workspace(db, Quotas::default()).await.id;
        let mut snap = snapshot("captured", "latest");
        snap.workspace_id = Some(ws);
        snap.status = SnapshotStatus::Building;
        db.insert_snapshot(ws, &snap).await.unwrap();
        snap.status = SnapshotStatus::Ready;
        snap.volume = Some("snap-1".into());
        snap.memory_bytes = Some(ByteSize::mib(256));
        snap.fs_capacity = ByteSize::gib(2);
        db.update_snapshot(&snap).await.unwrap();
        let got = db.get_snapshot(ws, snap.id).await.unwrap();
        assert_eq!(
            (
                got.status,
                got.volume.as_deref(),
                got.memory_bytes,
                got.fs_capacity
            ),
            (
                SnapshotStatus::Ready,
                Some("snap-1"),
                Some(ByteSize::mib(256)),
                ByteSize::gib(2)
            )
        );

        // A sandbox booted from it blocks the delete until it is deleting.
        let mut sb = sandbox(ws, "from-snap");
        sb.snapshot_id = snap.id;
        db.insert_sandbox(&sb).await.unwrap();
        assert!(matches!(
            db.delete_snapshot(ws, snap.id).await,
            Err(DbError::Conflict { .. })
        ));
        db.set_status(sb.id, SandboxStatus::Deleting, None, StatusExtra::default())
            .await
            .unwrap();
        assert_eq!(db.delete_snapshot(ws, snap.id).await.unwrap().id, snap.id);
        assert!(matches!(
            db.get_snapshot(ws, snap.id).await,
            Err(DbError::NotFound { .. })
        ));
        // Built-ins cannot be deleted.
        let builtin = snapshot("default", "latest");
        db.upsert_builtin_snapshot(&builtin).await.unwrap();
        assert!(matches!(
            db.delete_snapshot(ws, builtin.id).await,
            Err(DbError::Conflict { .. })
        ));
    });
}

#[tokio::test]
async fn publishing_a_taken_tag_moves_it_and_leaves_the_old_snapshot_by_id() {
    each_backend!(|db| {
        let ws = workspace(db, Quotas::default()).await.id;
        let mut first = snapshot("env", "latest");
        first.workspace_id = Some(ws);
        db.publish_snapshot(ws, &first).await.unwrap();
        let mut second = snapshot("env", "latest");
        second.workspace_id = Some(ws);
        db.publish_snapshot(ws, &second).await.unwrap();
        assert_eq!(
            db.find_snapshot_by_ref(ws, "env", "latest")
                .await
                .unwrap()
                .id,
            second.id
        );
        let old = db.get_snapshot(ws, first.id).await.unwrap();
        assert_eq!(old.tag, hearth_db::dangling_tag(first.id));
        assert!(!hearth_db::is_published_tag(&old.tag));
        assert_eq!(
            db.snapshot_tags(ws, "env").await.unwrap(),
            vec![("latest".to_owned(), second.id)]
        );
        // Another workspace's tag of the same name is not touched.
        let other = workspace(db, Quotas::default()).await.id;
        let mut theirs = snapshot("env", "latest");
        theirs.workspace_id = Some(other);
        db.publish_snapshot(other, &theirs).await.unwrap();
        assert_eq!(
            db.find_snapshot_by_ref(ws, "env", "latest")
                .await
                .unwrap()
                .id,
            second.id
        );
    });
}
