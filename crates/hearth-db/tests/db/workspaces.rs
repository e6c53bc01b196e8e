use hearth_db::{testing, Backend, Db, DbError, NewApiKey, Quotas};
use hearth_types::{ApiKeyId, ByteSize, MilliCpu, WorkspaceId};

use crate::{each_backend, sandbox, workspace};

#[tokio::test]
async fn migrations_are_idempotent_and_recorded() {
    for t in testing::backends().await {
        eprintln!("-- backend {:?}", t.backend());
        assert_eq!(t.schema_version().await.unwrap(), 22);
        assert_eq!(t.migrate().await.unwrap(), Vec::<i64>::new());
        // A second process opening the same database finds nothing to do,
        // and sees the first one's data.
        let ws = workspace(&t, Quotas::default()).await;
        let again = Db::connect(&t.url).await.unwrap();
        assert_eq!(again.schema_version().await.unwrap(), 22);
        assert_eq!(again.get_workspace(ws.id).await.unwrap(), ws);
        again.close().await;
    }
}

#[tokio::test]
async fn in_memory_sqlite_works() {
    let db = Db::connect("sqlite::memory:").await.unwrap();
    assert_eq!(db.backend(), Backend::Sqlite);
    let ws = workspace(&db, Quotas::default()).await;
    let s = sandbox(ws.id, "mem");
    db.insert_sandbox(&s).await.unwrap();
    assert_eq!(db.get_sandbox(ws.id, "mem").await.unwrap(), s);
    // Two in-memory handles are separate databases.
    let other = Db::connect("sqlite::memory:").await.unwrap();
    assert!(matches!(
        other.get_workspace(ws.id).await,
        Err(DbError::NotFound { .. })
    ));
}

#[tokio::test]
async fn unsupported_url_is_an_error() {
    assert!(matches!(
        Db::connect("mysql://localhost/x").await,
        Err(DbError::Backend { op: "connect", .. })
    ));
}

#[tokio::test]
async fn workspace_round_trips_quotas() {
    each_backend!(|db| {
        let quotas = Quotas {
            max_sandboxes: Some(1000),
            max_cpu: Some(MilliCpu(16_000)),
            max_mem: Some(ByteSize::gib(64)),
            max_storage: Some(ByteSize::gib(512)),
            max_snapshots: Some(100),
        };
        let ws = workspace(db, quotas).await;
        let got = db.get_workspace(ws.id).await.unwrap();
        assert_eq!(got, ws);
        assert_eq!(got.quotas, quotas);
        let unlimited = workspace(db, Quotas::default()).await;
        assert_eq!(
            db.get_workspace(unlimited.id).await.unwrap().quotas,
            Quotas::default()
        );
        assert!(matches!(
            db.get_workspace(WorkspaceId::new()).await,
            Err(DbError::NotFound { what: "workspace" })
        ));
    });
}

fn key(ws: WorkspaceId, hash: &str) -> NewApiKey {
    NewApiKey {
        id: ApiKeyId::new(),
        workspace_id: ws,
        key_hash: hash.to_owned(),
        prefix: "hk_live_ab".into(),
        description: "ci".into(),
        permissions: vec!["sandboxes:read".into(), "sandboxes:exec".into()],
    }
}

#[tokio::test]
async fn api_keys_create_find_list_revoke() {
    each_backend!(|db| {
        let ws = workspace(db, Quotas::default()).await;
        let other = workspace(db, Quotas::default()).await;
        let a = db.create_api_key(&key(ws.id, "aa11")).await.unwrap();
        let b = db.create_api_key(&key(ws.id, "bb22")).await.unwrap();
        db.create_api_key(&key(other.id, "cc33")).await.unwrap();

        assert_eq!(db.find_api_key("aa11").await.unwrap(), Some(a.clone()));
        assert_eq!(db.find_api_key("nope").await.unwrap(), None);
        assert!(matches!(
            db.create_api_key(&key(ws.id, "aa11")).await,
            Err(DbError::Conflict { .. })
        ));
        assert!(matches!(
            db.create_api_key(&key(WorkspaceId::new(), "dd44")).await,
            Err(DbError::NotFound { what: "workspace" })
        ));
        let listed = db.list_api_keys(ws.id).await.unwrap();
        assert_eq!(
            listed.iter().map(|k| k.id).collect::<Vec<_>>(),
            vec![a.id, b.id]
        );

        // Another workspace cannot revoke it.
        assert!(matches!(
            db.revoke_api_key(other.id, a.id).await,
            Err(DbError::NotFound { what: "api key" })
        ));
        db.revoke_api_key(ws.id, a.id).await.unwrap();
        assert_eq!(db.find_api_key("aa11").await.unwrap(), None);
        let revoked_at = db.list_api_keys(ws.id).await.unwrap()[0].revoked_at;
        assert!(revoked_at.is_some());
        // Revoking again is fine and keeps the first time.
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        db.revoke_api_key(ws.id, a.id).await.unwrap();
        assert_eq!(
            db.list_api_keys(ws.id).await.unwrap()[0].revoked_at,
            revoked_at
        );
        assert_eq!(db.find_api_key("bb22").await.unwrap(), Some(b));
        assert!(matches!(
            db.revoke_api_key(ws.id, ApiKeyId::new()).await,
            Err(DbError::NotFound { .. })
        ));
    });
}

#[tokio::test]
async fn secrets_are_written_once() {
    for t in testing::backends().await {
        let first = t.secret_or_init("links", "aa").await.unwrap();
        assert_eq!(first, "aa");
        assert_eq!(t.secret_or_init("links", "bb").await.unwrap(), "aa");
        assert_eq!(t.secret_or_init("other", "cc").await.unwrap(), "cc");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_starting_together_migrate_once() {
    // Several rounds on fresh files: opening a new SQLite file from many
    // connections at once races on the switch to WAL (it used to fail with
    // "database is locked" about one time in ten).
    for place in fresh_rounds().await {
        eprintln!("-- {}", place.url);
        let connects: Vec<_> = (0..6)
            .map(|_| {
                let url = place.url.clone();
                tokio::spawn(async move { Db::connect(&url).await })
            })
            .collect();
        for c in connects {
            let db = c.await.unwrap().expect("concurrent connect");
            assert_eq!(db.schema_version().await.unwrap(), 22);
            db.close().await;
        }
    }
}

/// Fresh unmigrated databases for five rounds of a concurrency test.
async fn fresh_rounds() -> Vec<testing::TestUrl> {
    let mut all = Vec::new();
    for _ in 0..5 {
        all.extend(testing::backend_urls().await);
    }
    all
}
