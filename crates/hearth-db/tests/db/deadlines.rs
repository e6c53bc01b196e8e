use hearth_db::{DbError, Deadline, OnExpiry, Quotas, Timestamp};
use hearth_types::SandboxId;

use crate::{each_backend, sandbox, workspace};

#[tokio::test]
async fn deadlines_are_set_moved_read_found_expired_and_go_with_their_sandbox() {
    each_backend!(|db| {
        let ws = workspace(db, Quotas::default()).await;
        let (a, b, c) = (
            sandbox(ws.id, "a"),
            sandbox(ws.id, "b"),
            sandbox(ws.id, "c"),
        );
        for s in [&a, &b, &c] {
            db.insert_sandbox(s).await.unwrap();
        }
        let t0 = Timestamp::from_unix_ms(1_800_000_000_000);
        let at = |s: i64| Timestamp::from_unix_ms(t0.unix_ms() + s * 1000);
        let da = Deadline {
            sandbox_id: a.id,
            expires_at: at(10),
            on_expiry: OnExpiry::Delete,
        };
        let db_ = Deadline {
            sandbox_id: b.id,
            expires_at: at(5),
            on_expiry: OnExpiry::Pause,
        };
        db.set_deadline(&da).await.unwrap();
        db.set_deadline(&db_).await.unwrap();
        // No such sandbox: refused, nothing stored.
        let ghost = Deadline {
            sandbox_id: SandboxId::new(),
            ..da
        };
        assert!(matches!(
            db.set_deadline(&ghost).await,
            Err(DbError::NotFound { .. })
        ));

        let read = db
            .deadlines_of(&[a.id, b.id, c.id, ghost.sandbox_id])
            .await
            .unwrap();
        assert_eq!(read.len(), 2);
        assert_eq!(read[&a.id], da);
        assert_eq!(read[&b.id], db_);

        // Expired at t0+7: b only; at t0+10: b then a (earliest first).
        let ids = |v: Vec<Deadline>| v.into_iter().map(|d| d.sandbox_id).collect::<Vec<_>>();
        assert_eq!(ids(db.expired_deadlines(at(7), 10).await.unwrap()), [b.id]);
        assert_eq!(
            ids(db.expired_deadlines(at(10), 10).await.unwrap()),
            [b.id, a.id]
        );
        assert_eq!(ids(db.expired_deadlines(at(10), 1).await.unwrap()), [b.id]);

        // Moved (E2B's set_timeout), and the action replaced too.
        let moved = Deadline {
            expires_at: at(60),
            on_expiry: OnExpiry::Pause,
            ..da
        };
        db.set_deadline(&moved).await.unwrap();
        assert_eq!(ids(db.expired_deadlines(at(10), 10).await.unwrap()), [b.id]);
        assert_eq!(db.deadlines_of(&[a.id]).await.unwrap()[&a.id], moved);

        // The earliest of all is b's.
        assert_eq!(
            db.earliest_deadline().await.unwrap().map(|d| d.sandbox_id),
            Some(b.id)
        );
        // Cleared only if it is still the one acted on: a's moved deadline
        // is not the one that ended at t0+10.
        assert!(!db.clear_deadline_at(a.id, at(10)).await.unwrap());
        assert_eq!(db.deadlines_of(&[a.id]).await.unwrap()[&a.id], moved);
        assert!(db.clear_deadline_at(a.id, at(60)).await.unwrap());
        db.set_deadline(&moved).await.unwrap();
        // Cleared; and a deleted sandbox's deadline goes with it.
        assert!(db.clear_deadline(b.id).await.unwrap());
        assert!(!db.clear_deadline(b.id).await.unwrap());
        db.delete_sandbox(a.id).await.unwrap();
        assert!(db.expired_deadlines(at(3600), 10).await.unwrap().is_empty());
        assert!(db.deadlines_of(&[a.id, b.id]).await.unwrap().is_empty());
    });
}
