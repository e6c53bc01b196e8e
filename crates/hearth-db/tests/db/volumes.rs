use hearth_db::{DbError, Quotas, Timestamp, VolumeAttach, VolumeRow};
use hearth_types::{ByteSize, WorkspaceId};

use crate::{each_backend, sandbox, workspace};

fn volume(ws: WorkspaceId, name: &str, size: ByteSize) -> VolumeRow {
    let now = Timestamp::now();
    VolumeRow {
        id: uuid::Uuid::new_v4().to_string(),
        workspace_id: ws,
        name: name.into(),
        size,
        description: None,
        labels: [("team".to_owned(), "a".to_owned())].into(),
        holds: 0,
        created_by: "key-1".into(),
        updated_by: "key-1".into(),
        created_at: now,
        updated_at: now,
    }
}

fn attach(v: &VolumeRow, path: &str, read_only: bool) -> VolumeAttach {
    VolumeAttach {
        volume_id: v.id.clone(),
        mount_path: path.into(),
        read_only,
    }
}

/// One writer at a time and any number of readers, each attachment a
/// new hold; a held volume cannot be deleted; another workspace's volume
/// cannot be attached or seen; storage counts volumes whole.
#[tokio::test]
async fn volumes_have_one_writer_many_readers_and_count_as_storage() {
    each_backend!(|db| {
        let quotas = Quotas {
            max_storage: Some(ByteSize::gib(20)),
            ..Quotas::default()
        };
        let a = workspace(db, quotas).await;
        let b = workspace(db, Quotas::default()).await;
        let data = volume(a.id, "data", ByteSize::gib(4));
        db.insert_volume(&data).await.unwrap();
        assert!(matches!(
            db.insert_volume(&volume(a.id, "data", ByteSize::gib(1)))
                .await,
            Err(DbError::Conflict { .. })
        ));
        // 4 GiB of volume and an 8 GiB sandbox disk leave 8 GiB: a 9 GiB
        // volume does not fit.
        let writer = sandbox(a.id, "writer");
        db.insert_sandbox_holding(&writer, &[attach(&data, "/data", false)])
            .await
            .unwrap();
        assert!(matches!(
            db.insert_volume(&volume(a.id, "big", ByteSize::gib(9)))
                .await,
            Err(DbError::Quota { .. })
        ));
        // A second writer is refused, naming the first; the sandbox is
        // not written either.
        let second = sandbox(a.id, "second");
        match db
            .insert_sandbox_holding(&second, &[attach(&data, "/data", false)])
            .await
        {
            Err(DbError::InUse { what }) => assert!(what.contains("'writer'"), "{what}"),
            other => panic!("{other:?}"),
        }
        assert!(db.get_sandbox_by_id(second.id).await.is_err());
        // Readers may come while it is written.
        let reader = sandbox(a.id, "reader");
        db.insert_sandbox_holding(&reader, &[attach(&data, "/ro", true)])
            .await
            .unwrap();
        let held = db.volume_attachments(&[&data.id]).await.unwrap();
        let holds: Vec<(String, bool, u32)> = held
            .iter()
            .map(|a| (a.sandbox_name.clone(), a.read_only, a.hold))
            .collect();
        assert_eq!(
            holds,
            [
                ("reader".to_owned(), true, 2),
                ("writer".to_owned(), false, 1)
            ]
        );
        assert_eq!(db.sandbox_attachments(writer.id).await.unwrap().len(), 1);
        // Held: not deleted.
        assert!(matches!(
            db.delete_volume(a.id, &data.id).await,
            Err(DbError::InUse { .. })
        ));
        // Another workspace's sandbox cannot take it, nor see it.
        let foreign = sandbox(b.id, "foreign");
        assert!(matches!(
            db.insert_sandbox_holding(&foreign, &[attach(&data, "/x", true)])
                .await,
            Err(DbError::NotFound { what: "volume" })
        ));
        assert_eq!(db.volume(b.id, &data.id).await.unwrap(), None);
        // By id or by name.
        assert_eq!(db.volume(a.id, "data").await.unwrap().unwrap().id, data.id);
        let got = db.volume(a.id, &data.id).await.unwrap().unwrap();
        assert_eq!(got.holds, 2);
        // Its writer gone, the next writer takes the next hold.
        db.delete_sandbox(writer.id).await.unwrap();
        let next = sandbox(a.id, "next");
        db.insert_sandbox_holding(&next, &[attach(&data, "/data", false)])
            .await
            .unwrap();
        assert_eq!(db.sandbox_attachments(next.id).await.unwrap()[0].hold, 3);
        db.delete_sandbox(next.id).await.unwrap();
        db.delete_sandbox(reader.id).await.unwrap();
        // Described, listed, deleted.
        let mut changed = got.clone();
        changed.description = Some("datasets".into());
        changed.labels.clear();
        db.update_volume(&changed).await.unwrap();
        let page = db.list_volumes(a.id, Some("AT"), 10, None).await.unwrap();
        assert_eq!(page.items.len(), 1);
        assert_eq!(page.items[0].description.as_deref(), Some("datasets"));
        assert!(page.items[0].labels.is_empty());
        assert!(db.delete_volume(a.id, &data.id).await.unwrap());
        assert!(!db.delete_volume(a.id, &data.id).await.unwrap());
        // Its storage is free again.
        db.insert_volume(&volume(a.id, "big", ByteSize::gib(9)))
            .await
            .unwrap();
    });
}
