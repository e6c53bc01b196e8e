use hearth_db::{DbError, Quotas, RegistryRow, Timestamp, MAX_REGISTRIES};
use hearth_types::WorkspaceId;

use crate::{each_backend, workspace};

fn registry(ws: WorkspaceId, name: &str) -> RegistryRow {
    let now = Timestamp::now();
    RegistryRow {
        id: uuid::Uuid::new_v4().to_string(),
        workspace_id: ws,
        name: name.into(),
        url: "registry.example".into(),
        auth_type: "DOCKER_CONFIG".into(),
        username: Some("robot".into()),
        password: Some("hs1:sealed".into()),
        created_by: Some("key-1".into()),
        updated_by: Some("key-1".into()),
        created_at: now,
        updated_at: now,
    }
}

#[tokio::test]
async fn registries_insert_read_update_list_delete_per_workspace() {
    each_backend!(|db| {
        let a = workspace(db, Quotas::default()).await;
        let b = workspace(db, Quotas::default()).await;
        let one = registry(a.id, "one");
        db.insert_registry(&one).await.unwrap();
        db.insert_registry(&registry(a.id, "two")).await.unwrap();
        // Names are per workspace: b may use one, a may not twice.
        db.insert_registry(&registry(b.id, "one")).await.unwrap();
        assert!(matches!(
            db.insert_registry(&registry(a.id, "one")).await,
            Err(DbError::Conflict { .. })
        ));
        assert_eq!(
            db.registry_by_name(a.id, "one").await.unwrap(),
            Some(one.clone())
        );
        assert_eq!(
            db.registry_by_id(a.id, &one.id).await.unwrap(),
            Some(one.clone())
        );
        // Another workspace sees nothing of it, by id or by name.
        assert_eq!(db.registry_by_id(b.id, &one.id).await.unwrap(), None);
        let names = |page: hearth_db::Page<RegistryRow>| -> Vec<String> {
            page.items.into_iter().map(|r| r.name).collect()
        };
        let first = db.list_registries(a.id, None, 1, None).await.unwrap();
        let cursor = first.next_cursor.clone().expect("a second page");
        assert_eq!(names(first), ["one"]);
        let second = db
            .list_registries(a.id, None, 1, Some(&cursor))
            .await
            .unwrap();
        assert_eq!(second.next_cursor, None);
        assert_eq!(names(second), ["two"]);
        let two = db
            .list_registries(a.id, Some("tW"), 10, None)
            .await
            .unwrap();
        assert_eq!(names(two), ["two"]);

        let mut changed = one.clone();
        changed.name = "renamed".into();
        changed.password = Some("hs1:other".into());
        changed.updated_at = Timestamp::now();
        db.update_registry(&changed).await.unwrap();
        assert_eq!(db.registry_by_name(a.id, "one").await.unwrap(), None);
        assert_eq!(
            db.registry_by_id(a.id, &one.id).await.unwrap(),
            Some(changed.clone())
        );
        let mut clash = changed.clone();
        clash.name = "two".into();
        assert!(matches!(
            db.update_registry(&clash).await,
            Err(DbError::Conflict { .. })
        ));
        let mut foreign = changed.clone();
        foreign.workspace_id = b.id;
        assert!(matches!(
            db.update_registry(&foreign).await,
            Err(DbError::NotFound { .. })
        ));

        assert!(db.delete_registry(a.id, "renamed").await.unwrap());
        assert!(!db.delete_registry(a.id, "renamed").await.unwrap());
        assert_eq!(
            db.list_registries(a.id, None, 10, None)
                .await
                .unwrap()
                .items
                .len(),
            1
        );
        assert_eq!(
            db.list_registries(b.id, None, 10, None)
                .await
                .unwrap()
                .items
                .len(),
            1
        );
    });
}

#[tokio::test]
async fn registries_stop_at_the_workspace_limit() {
    each_backend!(|db| {
        let ws = workspace(db, Quotas::default()).await;
        for i in 0..MAX_REGISTRIES {
            db.insert_registry(&registry(ws.id, &format!("r{i}")))
                .await
                .unwrap();
        }
        assert!(matches!(
            db.insert_registry(&registry(ws.id, "one-more")).await,
            Err(DbError::TooMany {
                limit: MAX_REGISTRIES,
                ..
            })
        ));
        assert!(matches!(
            db.insert_registry(&registry(WorkspaceId::new(), "nowhere"))
                .await,
            Err(DbError::NotFound { .. })
        ));
    });
}
