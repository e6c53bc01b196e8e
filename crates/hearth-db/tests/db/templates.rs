use hearth_db::{BuildLogLine, BuildStatus, DbError, Quotas, TemplateBuildRow, Timestamp};

use crate::{each_backend, workspace};

fn build(ws: hearth_types::WorkspaceId, name: &str) -> TemplateBuildRow {
    let now = Timestamp::now();
    TemplateBuildRow {
        id: uuid::Uuid::new_v4().to_string(),
        workspace_id: ws,
        name: name.into(),
        tags: vec!["latest".into(), "v1".into()],
        cpu_count: Some(2),
        memory_mb: Some(1024),
        extra_disk_mb: None,
        status: BuildStatus::Waiting,
        reason: None,
        reason_step: None,
        snapshot_id: None,
        created_by: "key".into(),
        created_at: now,
        updated_at: now,
    }
}

#[tokio::test]
async fn a_build_starts_once_ends_once_and_pages_its_log() {
    each_backend!(|db| {
        let ws = workspace(db, Quotas::default()).await;
        let other = workspace(db, Quotas::default()).await;
        let b = build(ws.id, "app");
        db.insert_template_build(&b).await.unwrap();
        assert_eq!(db.get_template_build(ws.id, &b.id).await.unwrap(), b);
        // Another workspace does not see it.
        assert!(matches!(
            db.get_template_build(other.id, &b.id).await,
            Err(DbError::NotFound { .. })
        ));
        assert_eq!(db.template_builds(ws.id, "app").await.unwrap().len(), 1);
        // Started once: a second start finds it building.
        db.set_template_build_status(&b, BuildStatus::Waiting, BuildStatus::Building)
            .await
            .unwrap();
        assert!(matches!(
            db.set_template_build_status(&b, BuildStatus::Waiting, BuildStatus::Building)
                .await,
            Err(DbError::Stale { .. })
        ));
        assert!(db.touch_template_build(&b.id).await.unwrap());
        let lines: Vec<BuildLogLine> = (0..250)
            .map(|i| BuildLogLine {
                seq: i,
                at: Timestamp::now(),
                level: if i % 2 == 0 { "info" } else { "debug" }.into(),
                step: Some((i / 100).to_string()),
                message: format!("line {i}"),
            })
            .collect();
        db.append_build_log(&b.id, &lines).await.unwrap();
        let page = db.build_log(&b.id, 100, 100).await.unwrap();
        assert_eq!(page.len(), 100);
        assert_eq!(page[0].message, "line 100");
        assert_eq!(page[99].seq, 199);
        assert_eq!(db.build_log(&b.id, 240, 100).await.unwrap().len(), 10);
        // It ends with its reason and step.
        let mut failed = b.clone();
        failed.reason = Some("step 2 failed".into());
        failed.reason_step = Some("2".into());
        db.set_template_build_status(&failed, BuildStatus::Building, BuildStatus::Error)
            .await
            .unwrap();
        let now = db.get_template_build(ws.id, &b.id).await.unwrap();
        assert_eq!(now.status, BuildStatus::Error);
        assert_eq!(now.reason_step.as_deref(), Some("2"));
        // What explains it: the step's lines and any error, the last few,
        // oldest first.
        db.append_build_log(
            &b.id,
            &[BuildLogLine {
                seq: 250,
                at: Timestamp::now(),
                level: "error".into(),
                step: Some("finalize".into()),
                message: "the failure".into(),
            }],
        )
        .await
        .unwrap();
        let why = db.build_failure_lines(&b.id, Some("2"), 3).await.unwrap();
        let said: Vec<&str> = why.iter().map(|l| l.message.as_str()).collect();
        assert_eq!(said, ["line 248", "line 249", "the failure"]);
        let why = db.build_failure_lines(&b.id, Some("1"), 200).await.unwrap();
        assert_eq!(why.len(), 101, "step 1's hundred lines and the error");
        assert_eq!(why[0].message, "line 100");
        assert!(!db.touch_template_build(&b.id).await.unwrap());

        // A build whose heartbeat stopped is failed, saying why.
        let orphan = build(ws.id, "orphan");
        db.insert_template_build(&orphan).await.unwrap();
        db.set_template_build_status(&orphan, BuildStatus::Waiting, BuildStatus::Building)
            .await
            .unwrap();
        let later = Timestamp::from_unix_ms(Timestamp::now().unix_ms() + 60_000);
        assert_eq!(db.fail_orphaned_template_builds(later).await.unwrap(), 1);
        let orphan = db.get_template_build(ws.id, &orphan.id).await.unwrap();
        assert_eq!(orphan.status, BuildStatus::Error);
        assert!(orphan.reason.unwrap().contains("went away"));
    });
}

#[tokio::test]
async fn an_upload_becomes_the_files_of_its_hash_only_when_complete() {
    each_backend!(|db| {
        let ws = workspace(db, Quotas::default()).await;
        let hash = "ab".repeat(32);
        assert_eq!(db.template_file(ws.id, &hash).await.unwrap(), None);
        db.put_upload_chunk("u1", 0, vec![1, 2, 3]).await.unwrap();
        db.put_upload_chunk("u1", 1, vec![4]).await.unwrap();
        // Not the hash's until finished.
        assert_eq!(db.template_file(ws.id, &hash).await.unwrap(), None);
        db.finish_upload(ws.id, &hash, "u1", 4).await.unwrap();
        let f = db.template_file(ws.id, &hash).await.unwrap().unwrap();
        assert_eq!((f.upload_id.as_str(), f.size), ("u1", 4));
        assert_eq!(db.upload_chunk("u1", 0).await.unwrap(), Some(vec![1, 2, 3]));
        assert_eq!(db.upload_chunk("u1", 2).await.unwrap(), None);
        // A second upload replaces the first, whose chunks go.
        db.put_upload_chunk("u2", 0, vec![9; 10]).await.unwrap();
        db.finish_upload(ws.id, &hash, "u2", 10).await.unwrap();
        assert_eq!(
            db.template_file(ws.id, &hash).await.unwrap().unwrap().size,
            10
        );
        assert_eq!(db.upload_chunk("u1", 0).await.unwrap(), None);
        // A discarded upload leaves nothing.
        db.put_upload_chunk("u3", 0, vec![7]).await.unwrap();
        db.discard_upload("u3").await.unwrap();
        assert_eq!(db.upload_chunk("u3", 0).await.unwrap(), None);
    });
}
