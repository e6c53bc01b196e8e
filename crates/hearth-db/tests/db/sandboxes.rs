use std::sync::Arc;
use std::time::Duration;

use hearth_db::{testing, DbError, QuotaKind, Quotas, SandboxStatus, StatusExtra, Timestamp};
use hearth_types::{ByteSize, HostId, MilliCpu, SandboxId};

use crate::{each_backend, sandbox, workspace};

#[tokio::test]
async fn names_are_unique_per_workspace() {
    each_backend!(|db| {
        let ws1 = workspace(db, Quotas::default()).await;
        let ws2 = workspace(db, Quotas::default()).await;
        db.insert_sandbox(&sandbox(ws1.id, "dev")).await.unwrap();
        let err = db
            .insert_sandbox(&sandbox(ws1.id, "dev"))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, DbError::Conflict { what } if what.contains("dev")),
            "{err:?}"
        );
        // The same name in another workspace is fine.
        db.insert_sandbox(&sandbox(ws2.id, "dev")).await.unwrap();
        // So is the quota-checked path, with the same conflict.
        assert!(matches!(
            db.insert_sandbox_within_quota(&sandbox(ws2.id, "dev"))
                .await,
            Err(DbError::Conflict { .. })
        ));
        // A missing workspace is NotFound on both paths.
        let orphan = sandbox(hearth_types::WorkspaceId::new(), "orphan");
        assert!(matches!(
            db.insert_sandbox(&orphan).await,
            Err(DbError::NotFound { what: "workspace" })
        ));
        assert!(matches!(
            db.insert_sandbox_within_quota(&orphan).await,
            Err(DbError::NotFound { what: "workspace" })
        ));
    });
}

#[tokio::test]
async fn get_by_id_or_name_and_invisible_across_workspaces() {
    each_backend!(|db| {
        let ws = workspace(db, Quotas::default()).await;
        let other = workspace(db, Quotas::default()).await;
        let mut s = sandbox(ws.id, "box-1");
        s.labels.insert("team".into(), "infra".into());
        s.host_id = Some(HostId::new());
        s.generation = 3;
        s.stopped_at = Some(Timestamp::from_unix_ms(1_700_000_000_000));
        s.preserve_memory_on_stop = true;
        db.insert_sandbox(&s).await.unwrap();

        // Every field survives the round trip.
        assert_eq!(db.get_sandbox(ws.id, &s.id.to_string()).await.unwrap(), s);
        assert_eq!(db.get_sandbox(ws.id, "box-1").await.unwrap(), s);
        assert_eq!(
            db.get_sandbox(ws.id, &s.id.to_string().to_uppercase())
                .await
                .unwrap(),
            s
        );
        assert_eq!(db.get_sandbox_by_id(s.id).await.unwrap(), s);

        for key in [s.id.to_string(), "box-1".to_owned()] {
            assert!(matches!(
                db.get_sandbox(other.id, &key).await,
                Err(DbError::NotFound { what: "sandbox" })
            ));
        }
        assert!(matches!(
            db.get_sandbox_by_id(SandboxId::new()).await,
            Err(DbError::NotFound { .. })
        ));

        // A sandbox named like another's id: the id wins.
        let tricky = sandbox(ws.id, &s.id.to_string());
        db.insert_sandbox(&tricky).await.unwrap();
        assert_eq!(
            db.get_sandbox(ws.id, &s.id.to_string()).await.unwrap().id,
            s.id
        );
    });
}

#[tokio::test]
async fn starting_a_stopped_sandbox_is_quota_checked() {
    for t in testing::backends().await {
        eprintln!("-- backend {:?}", t.backend());
        let ws = workspace(
            &t,
            Quotas {
                max_cpu: Some(MilliCpu(2000)),
                ..Quotas::default()
            },
        )
        .await;
        let mut stopped = sandbox(ws.id, "stopped");
        stopped.status = SandboxStatus::Stopped;
        t.insert_sandbox_within_quota(&stopped).await.unwrap();
        let mut live = sandbox(ws.id, "live");
        live.cpu = MilliCpu(2000);
        t.insert_sandbox_within_quota(&live).await.unwrap();
        let start = || StatusExtra {
            within_quota: true,
            expect_status: vec![SandboxStatus::Stopped],
            ..StatusExtra::default()
        };
        let refused = t
            .set_status(stopped.id, SandboxStatus::Provisioning, None, start())
            .await;
        assert!(
            matches!(
                refused,
                Err(DbError::Quota {
                    kind: QuotaKind::Cpu,
                    limit: 2000,
                    used: 2000,
                    requested: 1000
                })
            ),
            "{refused:?}"
        );
        assert_eq!(
            t.get_sandbox(ws.id, "stopped").await.unwrap().status,
            SandboxStatus::Stopped,
            "a refused start writes nothing"
        );
        // Once the other one stops, it fits; its own CPU is not counted twice.
        t.set_status(
            live.id,
            SandboxStatus::Stopped,
            None,
            StatusExtra::default(),
        )
        .await
        .unwrap();
        let row = t
            .set_status(stopped.id, SandboxStatus::Provisioning, None, start())
            .await
            .unwrap();
        assert_eq!(row.status, SandboxStatus::Provisioning);
        // Fences still apply inside the quota check.
        assert!(matches!(
            t.set_status(stopped.id, SandboxStatus::Provisioning, None, start())
                .await,
            Err(DbError::Stale { .. })
        ));
    }
}

/// Finding 3 of the security review: disks had no quota. The summed
/// `fs_capacity` of a workspace's sandboxes (stopped ones too) is capped,
/// at create and at a start that applies a larger disk.
#[tokio::test]
async fn finding3_storage_quota_counts_every_disk() {
    for t in testing::backends().await {
        eprintln!("-- backend {:?}", t.backend());
        let ws = workspace(
            &t,
            Quotas {
                max_storage: Some(ByteSize::gib(10)),
                ..Quotas::default()
            },
        )
        .await;
        let mut a = sandbox(ws.id, "a");
        a.fs_capacity = ByteSize::gib(6);
        a.status = SandboxStatus::Stopped;
        t.insert_sandbox_within_quota(&a).await.unwrap();
        let mut b = sandbox(ws.id, "b");
        b.fs_capacity = ByteSize::gib(5);
        let refused = t.insert_sandbox_within_quota(&b).await;
        assert!(
            matches!(
                refused,
                Err(DbError::Quota {
                    kind: QuotaKind::Storage,
                    requested,
                    ..
                }) if requested == ByteSize::gib(5).bytes()
            ),
            "{refused:?}"
        );
        b.fs_capacity = ByteSize::gib(4);
        t.insert_sandbox_within_quota(&b).await.unwrap();
        // A disk grown while stopped is checked when the start applies it.
        let mut grown = t.get_sandbox(ws.id, "a").await.unwrap();
        grown.fs_capacity = ByteSize::gib(7);
        let at = grown.updated_at;
        t.update_sandbox(&grown, at).await.unwrap();
        let start = StatusExtra {
            within_quota: true,
            expect_status: vec![SandboxStatus::Stopped],
            ..StatusExtra::default()
        };
        let refused = t
            .set_status(a.id, SandboxStatus::Provisioning, None, start)
            .await;
        assert!(
            matches!(
                refused,
                Err(DbError::Quota {
                    kind: QuotaKind::Storage,
                    ..
                })
            ),
            "{refused:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_holds_under_concurrent_inserts() {
    for t in testing::backends().await {
        eprintln!("-- backend {:?}", t.backend());
        let db = Arc::new(t.db.clone());
        let ws = workspace(
            &db,
            Quotas {
                max_sandboxes: Some(10),
                ..Quotas::default()
            },
        )
        .await;
        let tasks: Vec<_> = (0..30)
            .map(|i| {
                let db = db.clone();
                let s = sandbox(ws.id, &format!("racer-{i}"));
                tokio::spawn(async move { db.insert_sandbox_within_quota(&s).await })
            })
            .collect();
        let mut ok = 0;
        for task in tasks {
            match task.await.unwrap() {
                Ok(()) => ok += 1,
                Err(DbError::Quota {
                    kind: QuotaKind::Sandboxes,
                    limit: 10,
                    used: 10,
                    requested: 1,
                }) => {}
                Err(e) => panic!("unexpected {e:?}"),
            }
        }
        assert_eq!(ok, 10);
        let page = db
            .list_sandboxes(ws.id, &hearth_db::SandboxFilter::default())
            .await
            .unwrap();
        assert_eq!(page.items.len(), 10);
    }
}

#[tokio::test]
async fn cpu_and_memory_quotas_count_only_live_sandboxes() {
    each_backend!(|db| {
        let ws = workspace(
            db,
            Quotas {
                max_sandboxes: Some(5),
                max_cpu: Some(MilliCpu(2500)),
                max_mem: Some(ByteSize::gib(10)),
                max_storage: None,
                max_snapshots: None,
            },
        )
        .await;
        let mut a = sandbox(ws.id, "a");
        a.cpu = MilliCpu(1000);
        db.insert_sandbox_within_quota(&a).await.unwrap();
        let mut b = sandbox(ws.id, "b");
        b.cpu = MilliCpu(1000);
        db.insert_sandbox_within_quota(&b).await.unwrap();
        let mut c = sandbox(ws.id, "c");
        c.cpu = MilliCpu(1000);
        assert!(matches!(
            db.insert_sandbox_within_quota(&c).await,
            Err(DbError::Quota {
                kind: QuotaKind::Cpu,
                limit: 2500,
                used: 2000,
                requested: 1000
            })
        ));
        // A stopped sandbox holds no CPU or memory.
        c.status = SandboxStatus::Stopped;
        db.insert_sandbox_within_quota(&c).await.unwrap();
        // Memory: 4 GiB each live; 8 used, 4 more exceeds 10.
        let mut d = sandbox(ws.id, "d");
        d.cpu = MilliCpu(500);
        assert!(matches!(
            db.insert_sandbox_within_quota(&d).await,
            Err(DbError::Quota {
                kind: QuotaKind::Memory,
                ..
            })
        ));
        d.mem = ByteSize::gib(2);
        db.insert_sandbox_within_quota(&d).await.unwrap();
        // Count: 4 of 5 used; a deleting sandbox frees its slot.
        db.insert_sandbox_within_quota(&{
            let mut e = sandbox(ws.id, "e");
            e.status = SandboxStatus::Failed;
            e
        })
        .await
        .unwrap();
        let f = {
            let mut f = sandbox(ws.id, "f");
            f.status = SandboxStatus::Stopped;
            f
        };
        assert!(matches!(
            db.insert_sandbox_within_quota(&f).await,
            Err(DbError::Quota {
                kind: QuotaKind::Sandboxes,
                limit: 5,
                used: 5,
                ..
            })
        ));
        db.set_status(c.id, SandboxStatus::Deleting, None, StatusExtra::default())
            .await
            .unwrap();
        db.insert_sandbox_within_quota(&f).await.unwrap();
    });
}

#[tokio::test]
async fn optimistic_update_detects_concurrent_changes() {
    each_backend!(|db| {
        let ws = workspace(db, Quotas::default()).await;
        db.insert_sandbox(&sandbox(ws.id, "taken")).await.unwrap();
        let s = sandbox(ws.id, "orig");
        db.insert_sandbox(&s).await.unwrap();

        let read = db.get_sandbox(ws.id, "orig").await.unwrap();
        let mut edit = read.clone();
        edit.name = "renamed".into();
        edit.idle_ttl = Duration::from_secs(120);
        edit.labels.insert("k".into(), "v".into());
        edit.spec = serde_json::json!({"proxy_config": {"rules": []}});
        edit.updated_by = "user-2".into();
        let stored = db.update_sandbox(&edit, read.updated_at).await.unwrap();
        assert!(stored.updated_at > read.updated_at);
        assert_eq!(stored.name, "renamed");
        assert_eq!(stored.idle_ttl, Duration::from_secs(120));
        assert_eq!(stored.labels, edit.labels);
        assert_eq!(stored.spec, edit.spec);
        assert_eq!(stored.updated_by, "user-2");
        assert_eq!(db.get_sandbox(ws.id, "renamed").await.unwrap(), stored);

        // A writer still holding the old version loses.
        let mut late = read.clone();
        late.name = "late".into();
        assert!(matches!(
            db.update_sandbox(&late, read.updated_at).await,
            Err(DbError::Stale { what: "sandbox" })
        ));
        // Status changes also move the version, even within one millisecond.
        let fresh = db.get_sandbox_by_id(s.id).await.unwrap();
        db.set_status(s.id, SandboxStatus::Ready, None, StatusExtra::default())
            .await
            .unwrap();
        assert!(matches!(
            db.update_sandbox(&fresh, fresh.updated_at).await,
            Err(DbError::Stale { .. })
        ));

        let mut clash = db.get_sandbox_by_id(s.id).await.unwrap();
        let version = clash.updated_at;
        clash.name = "taken".into();
        assert!(matches!(
            db.update_sandbox(&clash, version).await,
            Err(DbError::Conflict { .. })
        ));
        let missing = sandbox(ws.id, "ghost");
        assert!(matches!(
            db.update_sandbox(&missing, missing.updated_at).await,
            Err(DbError::NotFound { .. })
        ));
    });
}

#[tokio::test]
async fn set_status_places_fences_and_stamps() {
    each_backend!(|db| {
        let ws = workspace(db, Quotas::default()).await;
        let mut s = sandbox(ws.id, "s");
        s.last_activity_at = Timestamp::from_unix_ms(1000);
        db.insert_sandbox(&s).await.unwrap();
        let host = HostId::new();

        // Placement: host + generation bump, fenced on the generation read.
        let placed = db
            .set_status(
                s.id,
                SandboxStatus::Provisioning,
                Some("placing"),
                StatusExtra {
                    host_id: Some(Some(host)),
                    bump_generation: true,
                    expect_generation: Some(0),
                    ..StatusExtra::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(placed.generation, 1);
        assert_eq!(placed.host_id, Some(host));
        assert_eq!(placed.status_message.as_deref(), Some("placing"));
        assert!(placed.updated_at > s.updated_at);

        // A second placer with the same stale read loses.
        assert!(matches!(
            db.set_status(
                s.id,
                SandboxStatus::Provisioning,
                None,
                StatusExtra {
                    bump_generation: true,
                    expect_generation: Some(0),
                    ..StatusExtra::default()
                }
            )
            .await,
            Err(DbError::Stale { .. })
        ));

        // The host reports ready for generation 1: idle clock restarts.
        let ready = db
            .set_status(
                s.id,
                SandboxStatus::Ready,
                None,
                StatusExtra {
                    expect_generation: Some(1),
                    expect_status: vec![SandboxStatus::Provisioning],
                    ..StatusExtra::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(ready.status, SandboxStatus::Ready);
        assert_eq!(ready.status_message, None);
        assert_eq!(ready.generation, 1);
        assert!(ready.last_activity_at.unix_ms() > 1000);

        // Stop only from ready; stopping twice is Stale (not idempotent).
        let stop = || StatusExtra {
            stopped_at: Some(Some(Timestamp::from_unix_ms(5000))),
            host_id: Some(None),
            expect_status: vec![SandboxStatus::Ready],
            ..StatusExtra::default()
        };
        let stopped = db
            .set_status(s.id, SandboxStatus::Stopped, None, stop())
            .await
            .unwrap();
        assert_eq!(stopped.stopped_at, Some(Timestamp::from_unix_ms(5000)));
        assert_eq!(stopped.host_id, None);
        assert_eq!(stopped.generation, 1);
        assert!(matches!(
            db.set_status(s.id, SandboxStatus::Stopped, None, stop())
                .await,
            Err(DbError::Stale { .. })
        ));
        // Clearing stopped_at on restart.
        let restarted = db
            .set_status(
                s.id,
                SandboxStatus::Provisioning,
                None,
                StatusExtra {
                    stopped_at: Some(None),
                    bump_generation: true,
                    expect_status: vec![SandboxStatus::Stopped, SandboxStatus::Failed],
                    ..StatusExtra::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(restarted.stopped_at, None);
        assert_eq!(restarted.generation, 2);

        assert!(matches!(
            db.set_status(
                SandboxId::new(),
                SandboxStatus::Ready,
                None,
                StatusExtra::default()
            )
            .await,
            Err(DbError::NotFound { .. })
        ));
    });
}

/// A stop that saved memory is recorded with it in one transaction: the
/// status and where the memory went, or (fenced out) neither.
#[tokio::test]
async fn a_stop_records_its_saved_memory_with_the_status_or_not_at_all() {
    each_backend!(|db| {
        let ws = workspace(db, Quotas::default()).await;
        let s = sandbox(ws.id, "s");
        db.insert_sandbox(&s).await.unwrap();
        let stop = |generation: u64, volumes: &str| StatusExtra {
            expect_generation: Some(generation),
            saved_memory: Some(volumes.to_owned()),
            ..StatusExtra::default()
        };
        // A stale stop (another placement won meanwhile) records nothing.
        assert!(matches!(
            db.set_status(s.id, SandboxStatus::Stopped, None, stop(7, "stale"))
                .await,
            Err(DbError::Stale { .. })
        ));
        assert_eq!(db.take_saved_memory(s.id).await.unwrap(), None);
        let stopped = db
            .set_status(
                s.id,
                SandboxStatus::Stopped,
                None,
                stop(s.generation, "{\"v\":1}"),
            )
            .await
            .unwrap();
        assert_eq!(stopped.status, SandboxStatus::Stopped);
        assert_eq!(
            db.take_saved_memory(s.id).await.unwrap().as_deref(),
            Some("{\"v\":1}")
        );
        assert_eq!(
            db.take_saved_memory(s.id).await.unwrap(),
            None,
            "a start takes it once"
        );
    });
}

#[tokio::test]
async fn reaper_queries_find_due_sandboxes() {
    each_backend!(|db| {
        let ws = workspace(db, Quotas::default()).await;
        let t0 = Timestamp::from_unix_ms(1_000_000);
        let mk = |name: &str, status: SandboxStatus| {
            let mut s = sandbox(ws.id, name);
            s.status = status;
            s.created_at = t0;
            s.updated_at = t0;
            s.last_activity_at = t0;
            s.idle_ttl = Duration::from_secs(60);
            s.delete_after_stop = Duration::from_secs(120);
            s
        };
        let idle = mk("idle", SandboxStatus::Ready);
        let mut busy = mk("busy", SandboxStatus::Ready);
        busy.last_activity_at = t0.plus(Duration::from_secs(50));
        let mut no_ttl = mk("no-ttl", SandboxStatus::Ready);
        no_ttl.idle_ttl = Duration::ZERO;
        let mut stopped_due = mk("stopped-due", SandboxStatus::Stopped);
        stopped_due.stopped_at = Some(t0);
        let mut stopped_recent = mk("stopped-recent", SandboxStatus::Stopped);
        stopped_recent.stopped_at = Some(t0.plus(Duration::from_secs(100)));
        let mut keep_forever = mk("keep", SandboxStatus::Stopped);
        keep_forever.stopped_at = Some(t0);
        keep_forever.delete_after_stop = Duration::ZERO;
        let stuck = mk("stuck", SandboxStatus::Provisioning);
        let mut fresh = mk("fresh", SandboxStatus::Provisioning);
        fresh.updated_at = t0.plus(Duration::from_secs(100));
        let host = HostId::new();
        let mut on_host = mk("on-host", SandboxStatus::Ready);
        on_host.host_id = Some(host);
        on_host.idle_ttl = Duration::ZERO;
        for s in [
            &idle,
            &busy,
            &no_ttl,
            &stopped_due,
            &stopped_recent,
            &keep_forever,
            &stuck,
            &fresh,
            &on_host,
        ] {
            db.insert_sandbox(s).await.unwrap();
        }
        let names = |v: Vec<hearth_db::SandboxRow>| {
            let mut n: Vec<String> = v.into_iter().map(|s| s.name).collect();
            n.sort();
            n
        };
        let now = t0.plus(Duration::from_secs(90));
        assert_eq!(names(db.sandboxes_idle_since(now).await.unwrap()), ["idle"]);
        assert_eq!(
            names(
                db.sandboxes_idle_since(t0.plus(Duration::from_secs(200)))
                    .await
                    .unwrap()
            ),
            ["busy", "idle"]
        );
        // Activity postpones idleness, and never moves the clock back.
        db.touch_activity(idle.id, t0.plus(Duration::from_secs(80)))
            .await
            .unwrap();
        db.touch_activity(idle.id, t0).await.unwrap();
        assert_eq!(
            names(db.sandboxes_idle_since(now).await.unwrap()),
            Vec::<String>::new()
        );
        assert!(matches!(
            db.touch_activity(SandboxId::new(), now).await,
            Err(DbError::NotFound { .. })
        ));

        let later = t0.plus(Duration::from_secs(150));
        assert_eq!(
            names(db.sandboxes_to_delete(later).await.unwrap()),
            ["stopped-due"]
        );
        assert_eq!(
            names(
                db.sandboxes_to_delete(t0.plus(Duration::from_secs(300)))
                    .await
                    .unwrap()
            ),
            ["stopped-due", "stopped-recent"]
        );
        // Its insert stamped the boot: the stamps judge it, not its age.
        assert_eq!(
            names(
                db.abandoned_boots(t0.plus(Duration::from_secs(50)))
                    .await
                    .unwrap()
            ),
            ["stuck"]
        );
        assert!(db
            .stale_provisioning(t0.plus(Duration::from_secs(50)))
            .await
            .unwrap()
            .is_empty());
        assert_eq!(
            names(db.sandboxes_on_host(host).await.unwrap()),
            ["on-host"]
        );

        db.delete_sandbox(stuck.id).await.unwrap();
        assert!(matches!(
            db.delete_sandbox(stuck.id).await,
            Err(DbError::NotFound { .. })
        ));
        assert!(db.stale_provisioning(now).await.unwrap().is_empty());
        assert!(db.abandoned_boots(now).await.unwrap().is_empty());
    });
}
