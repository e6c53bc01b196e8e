use hearth_db::{DbError, Quotas, SecretWrite, MAX_WORKSPACE_SECRETS};
use hearth_types::WorkspaceId;

use crate::{each_backend, workspace};

#[tokio::test]
async fn workspace_secrets_upsert_list_read_delete() {
    each_backend!(|db| {
        let ws = workspace(db, Quotas::default()).await;
        assert!(db.list_workspace_secrets(ws.id).await.unwrap().is_empty());
        assert_eq!(db.workspace_secret(ws.id, "A").await.unwrap(), None);

        db.put_workspace_secret(ws.id, "b_token", "hs1:one")
            .await
            .unwrap();
        db.put_workspace_secret(ws.id, "A_KEY", "hs1:two")
            .await
            .unwrap();
        db.put_workspace_secret(ws.id, "a_key", "hs1:three")
            .await
            .unwrap();
        let first = db.list_workspace_secrets(ws.id).await.unwrap();
        // Byte order on both backends, whatever PostgreSQL's collation.
        let names: Vec<&str> = first.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["A_KEY", "a_key", "b_token"]);
        assert!(first.iter().all(|m| m.created_at == m.updated_at));
        assert_eq!(
            db.workspace_secret(ws.id, "b_token").await.unwrap(),
            Some("hs1:one".to_owned())
        );

        // Upsert: the value and updated_at change, created_at stays.
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        db.put_workspace_secret(ws.id, "b_token", "hs1:four")
            .await
            .unwrap();
        assert_eq!(
            db.workspace_secret(ws.id, "b_token").await.unwrap(),
            Some("hs1:four".to_owned())
        );
        let after = db.list_workspace_secrets(ws.id).await.unwrap();
        let (old, new) = (&first[2], &after[2]);
        assert_eq!(new.name, "b_token");
        assert_eq!(new.created_at, old.created_at);
        assert!(new.updated_at > old.updated_at, "{old:?} then {new:?}");
        assert_eq!(
            (old.version, new.version),
            (1, 2),
            "a new value is a new version"
        );
        assert_eq!(after[..2], first[..2]);

        assert!(db.delete_workspace_secret(ws.id, "A_KEY").await.unwrap());
        assert!(!db.delete_workspace_secret(ws.id, "A_KEY").await.unwrap());
        assert_eq!(db.workspace_secret(ws.id, "A_KEY").await.unwrap(), None);
        assert_eq!(db.list_workspace_secrets(ws.id).await.unwrap().len(), 2);
    });
}

#[tokio::test]
async fn workspace_secrets_are_per_workspace() {
    each_backend!(|db| {
        let a = workspace(db, Quotas::default()).await;
        let b = workspace(db, Quotas::default()).await;
        db.put_workspace_secret(a.id, "TOKEN", "hs1:a")
            .await
            .unwrap();
        db.put_workspace_secret(b.id, "TOKEN", "hs1:b")
            .await
            .unwrap();
        assert_eq!(
            db.workspace_secret(a.id, "TOKEN").await.unwrap().as_deref(),
            Some("hs1:a")
        );
        assert_eq!(
            db.workspace_secret(b.id, "TOKEN").await.unwrap().as_deref(),
            Some("hs1:b")
        );
        db.put_workspace_secret(b.id, "ONLY_B", "hs1:x")
            .await
            .unwrap();
        assert_eq!(db.list_workspace_secrets(a.id).await.unwrap().len(), 1);
        assert_eq!(db.workspace_secret(a.id, "ONLY_B").await.unwrap(), None);
        assert!(!db.delete_workspace_secret(a.id, "ONLY_B").await.unwrap());
        assert!(db.workspace_secret(b.id, "ONLY_B").await.unwrap().is_some());
        assert!(db.delete_workspace_secret(a.id, "TOKEN").await.unwrap());
        assert!(db.workspace_secret(b.id, "TOKEN").await.unwrap().is_some());

        // An unknown workspace has nothing, and cannot be written to.
        let ghost = WorkspaceId::new();
        assert!(db.list_workspace_secrets(ghost).await.unwrap().is_empty());
        assert!(matches!(
            db.put_workspace_secret(ghost, "X", "hs1:x").await,
            Err(DbError::NotFound { what: "workspace" })
        ));
    });
}

#[tokio::test]
async fn workspace_secrets_stop_at_the_limit() {
    each_backend!(|db| {
        let ws = workspace(db, Quotas::default()).await;
        for i in 0..MAX_WORKSPACE_SECRETS {
            db.put_workspace_secret(ws.id, &format!("S{i:04}"), "hs1:v")
                .await
                .unwrap();
        }
        let err = db
            .put_workspace_secret(ws.id, "ONE_MORE", "hs1:v")
            .await
            .unwrap_err();
        assert!(
            matches!(err, DbError::TooMany { limit: 1000, .. }),
            "{err:?}"
        );
        // Replacing one at the limit is not a new secret.
        db.put_workspace_secret(ws.id, "S0000", "hs1:new")
            .await
            .unwrap();
        assert_eq!(
            db.workspace_secret(ws.id, "S0000")
                .await
                .unwrap()
                .as_deref(),
            Some("hs1:new")
        );
        // Another workspace has its own allowance.
        let other = workspace(db, Quotas::default()).await;
        db.put_workspace_secret(other.id, "ONE_MORE", "hs1:v")
            .await
            .unwrap();
        // Freeing one makes room again.
        assert!(db.delete_workspace_secret(ws.id, "S0001").await.unwrap());
        db.put_workspace_secret(ws.id, "ONE_MORE", "hs1:v")
            .await
            .unwrap();
        assert_eq!(
            db.list_workspace_secrets(ws.id).await.unwrap().len() as u64,
            MAX_WORKSPACE_SECRETS
        );
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_puts_do_not_overshoot_the_limit() {
    each_backend!(|db| {
        let ws = workspace(db, Quotas::default()).await;
        for i in 0..MAX_WORKSPACE_SECRETS - 2 {
            db.put_workspace_secret(ws.id, &format!("S{i:04}"), "hs1:v")
                .await
                .unwrap();
        }
        let puts: Vec<_> = (0..8)
            .map(|i| {
                let db = db.clone();
                tokio::spawn(async move {
                    db.put_workspace_secret(ws.id, &format!("RACE{i}"), "hs1:v")
                        .await
                })
            })
            .collect();
        let mut ok = 0;
        for p in puts {
            match p.await.unwrap() {
                Ok(()) => ok += 1,
                Err(DbError::TooMany { .. }) => {}
                Err(e) => panic!("unexpected {e:?}"),
            }
        }
        assert_eq!(ok, 2);
        assert_eq!(
            db.list_workspace_secrets(ws.id).await.unwrap().len() as u64,
            MAX_WORKSPACE_SECRETS
        );
    });
}

/// E2B's secrets: a create refuses a name taken, an update one missing;
/// each new value is a version; metadata is kept until an update gives
/// new metadata.
#[tokio::test]
async fn secrets_are_created_updated_and_versioned() {
    each_backend!(|db| {
        let ws = workspace(db, Quotas::default()).await;
        let meta = std::collections::BTreeMap::from([("team".to_owned(), "data".to_owned())]);
        let made = db
            .write_workspace_secret(
                ws.id,
                "K",
                "hs1:1",
                SecretWrite::Create {
                    metadata: meta.clone(),
                },
            )
            .await
            .unwrap();
        assert_eq!((made.version, &made.metadata), (1, &meta));
        assert!(matches!(
            db.write_workspace_secret(
                ws.id,
                "K",
                "hs1:x",
                SecretWrite::Create {
                    metadata: Default::default()
                }
            )
            .await,
            Err(DbError::Conflict { .. })
        ));
        assert!(matches!(
            db.write_workspace_secret(
                ws.id,
                "NONE",
                "hs1:x",
                SecretWrite::Update { metadata: None }
            )
            .await,
            Err(DbError::NotFound { .. })
        ));
        let two = db
            .write_workspace_secret(ws.id, "K", "hs1:2", SecretWrite::Update { metadata: None })
            .await
            .unwrap();
        assert_eq!((two.version, &two.metadata), (2, &meta), "metadata kept");
        let three = db
            .write_workspace_secret(
                ws.id,
                "K",
                "hs1:3",
                SecretWrite::Update {
                    metadata: Some(Default::default()),
                },
            )
            .await
            .unwrap();
        assert_eq!(
            (three.version, three.metadata.len()),
            (3, 0),
            "metadata replaced"
        );
        db.put_workspace_secret(ws.id, "K", "hs1:4").await.unwrap();
        let listed = db.list_workspace_secrets(ws.id).await.unwrap();
        assert_eq!(listed[0].version, 4);
        assert_eq!(
            db.workspace_secret(ws.id, "K").await.unwrap().as_deref(),
            Some("hs1:4")
        );
    });
}
