//! Leader leases and signing keys (migration 6), on SQLite and PostgreSQL
//! (see `hearth_db::testing`; `HEARTH_REQUIRE_POSTGRES=1` refuses to skip
//! PostgreSQL).

use std::time::Duration;

use hearth_db::{testing, Db, DbError, KeyOwnerKind, Leadership, NewSigningKey, Timestamp};

const TTL: Duration = Duration::from_secs(10);

fn at(ms: i64) -> Timestamp {
    Timestamp::from_unix_ms(1_700_000_000_000 + ms)
}

/// `contenders` holders race for `name` at `now`, each on its own task
/// (PostgreSQL: its own connection); the winners.
async fn race(db: &Db, name: &str, contenders: usize, now: Timestamp) -> Vec<(String, Leadership)> {
    let tasks: Vec<_> = (0..contenders)
        .map(|i| {
            let db = db.clone();
            let name = name.to_owned();
            let holder = format!("replica-{i}");
            tokio::spawn(async move {
                let got = db.acquire_leadership(&name, &holder, TTL, now).await;
                (holder, got)
            })
        })
        .collect();
    let mut winners = Vec::new();
    for t in tasks {
        let (holder, got) = t.await.unwrap();
        if let Some(l) = got.unwrap() {
            winners.push((holder, l));
        }
    }
    winners
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leadership_one_winner_takeover_after_expiry_renewal_keeps_term() {
    for t in testing::backends().await {
        eprintln!("-- backend {:?}", t.backend());
        let db: &Db = &t;
        assert_eq!(db.leader_lease("autoscaler").await.unwrap(), None);

        // Many replicas at once: exactly one wins, at term 1.
        let winners = race(db, "autoscaler", 8, at(0)).await;
        assert_eq!(winners.len(), 1, "{winners:?}");
        let (leader, lease) = winners[0].clone();
        assert_eq!(
            lease,
            Leadership {
                term: 1,
                expires_at: at(10_000)
            }
        );
        let other = if leader == "replica-0" {
            "replica-1"
        } else {
            "replica-0"
        };
        let stored = db.leader_lease("autoscaler").await.unwrap().unwrap();
        assert_eq!((stored.holder.as_str(), stored.term), (leader.as_str(), 1));

        // While it is live, nobody else gets it.
        assert_eq!(
            db.acquire_leadership("autoscaler", other, TTL, at(5_000))
                .await
                .unwrap(),
            None
        );
        // Renewal by the holder keeps the term and extends the expiry.
        assert_eq!(
            db.acquire_leadership("autoscaler", &leader, TTL, at(5_000))
                .await
                .unwrap(),
            Some(Leadership {
                term: 1,
                expires_at: at(15_000)
            })
        );
        assert_eq!(
            db.acquire_leadership("autoscaler", other, TTL, at(14_999))
                .await
                .unwrap(),
            None,
            "still live one millisecond before expiry"
        );

        // Expired: the other takes over with the next term.
        assert_eq!(
            db.acquire_leadership("autoscaler", other, TTL, at(15_000))
                .await
                .unwrap(),
            Some(Leadership {
                term: 2,
                expires_at: at(25_000)
            })
        );
        // The deposed leader cannot renew.
        assert_eq!(
            db.acquire_leadership("autoscaler", &leader, TTL, at(16_000))
                .await
                .unwrap(),
            None
        );
        assert_eq!(
            db.acquire_leadership("autoscaler", other, TTL, at(20_000))
                .await
                .unwrap()
                .map(|l| l.term),
            Some(2)
        );

        // Release: only by the holder; the term survives it.
        assert!(!db.release_leadership("autoscaler", &leader).await.unwrap());
        assert!(db.release_leadership("autoscaler", other).await.unwrap());
        assert_eq!(
            db.acquire_leadership("autoscaler", &leader, TTL, at(21_000))
                .await
                .unwrap(),
            Some(Leadership {
                term: 3,
                expires_at: at(31_000)
            })
        );

        // A racing takeover of an expired lease: still exactly one winner.
        let winners = race(db, "autoscaler", 8, at(60_000)).await;
        assert_eq!(winners.len(), 1, "{winners:?}");
        let expected_term = if winners[0].0 == leader { 3 } else { 4 };
        assert_eq!(winners[0].1.term, expected_term, "{winners:?}");

        // More rounds of first acquisitions, each a fresh name.
        for round in 0..20 {
            let winners = race(db, &format!("role-{round}"), 8, at(0)).await;
            assert_eq!(winners.len(), 1, "round {round}: {winners:?}");
            assert_eq!(winners[0].1.term, 1);
        }

        // Names are independent.
        assert_eq!(
            db.acquire_leadership("gc", other, TTL, at(60_000))
                .await
                .unwrap()
                .map(|l| l.term),
            Some(1)
        );
        let stored = db.leader_lease("autoscaler").await.unwrap().unwrap();
        assert_eq!(stored.holder, winners[0].0);
        assert_eq!(stored.expires_at, at(70_000));
    }
}

fn key(id: &str, kind: KeyOwnerKind, owner: &str, byte: u8, created: i64) -> NewSigningKey {
    NewSigningKey {
        key_id: id.to_owned(),
        owner_kind: kind,
        owner_id: owner.to_owned(),
        public_key: std::array::from_fn(|i| byte.wrapping_add(i as u8)),
        created_at: at(created),
    }
}

#[tokio::test]
async fn signing_keys_register_list_retire_and_never_overwrite() {
    for t in testing::backends().await {
        eprintln!("-- backend {:?}", t.backend());
        let db: &Db = &t;
        let c1 = key("ctl-1", KeyOwnerKind::Control, "control-a", 1, 0);
        let c2 = key("ctl-2", KeyOwnerKind::Control, "control-b", 2, 10);
        let h1 = key("host-1", KeyOwnerKind::Host, "host-x", 3, 5);
        let h2 = key("host-2", KeyOwnerKind::Host, "host-x", 4, 20);
        let h3 = key("host-3", KeyOwnerKind::Host, "host-y", 0xfe, 15);
        for k in [&c1, &c2, &h1, &h2, &h3] {
            let row = db.register_signing_key(k).await.unwrap();
            assert_eq!(
                (row.key_id.as_str(), row.public_key),
                (k.key_id.as_str(), k.public_key)
            );
            assert_eq!(row.retired_at, None);
        }

        // The same registration again is a no-op returning the stored row.
        let again = db
            .register_signing_key(&NewSigningKey {
                created_at: at(999),
                ..h1.clone()
            })
            .await
            .unwrap();
        assert_eq!(again.created_at, at(5));

        // Another key, or another owner, under an existing id: refused.
        for clash in [
            NewSigningKey {
                public_key: [9; 32],
                ..h1.clone()
            },
            NewSigningKey {
                owner_id: "host-z".into(),
                ..h1.clone()
            },
            NewSigningKey {
                owner_kind: KeyOwnerKind::Control,
                ..h1.clone()
            },
        ] {
            let err = db.register_signing_key(&clash).await.unwrap_err();
            assert!(matches!(err, DbError::Conflict { .. }), "{err:?}");
        }
        assert_eq!(
            db.signing_key("host-1").await.unwrap().unwrap().public_key,
            h1.public_key,
            "never overwritten"
        );

        let ids = |rows: Vec<hearth_db::SigningKeyRow>| {
            rows.into_iter().map(|r| r.key_id).collect::<Vec<_>>()
        };
        assert_eq!(
            ids(db
                .list_signing_keys(KeyOwnerKind::Host, None)
                .await
                .unwrap()),
            ["host-1", "host-3", "host-2"],
            "oldest first"
        );
        assert_eq!(
            ids(db
                .list_signing_keys(KeyOwnerKind::Host, Some("host-x"))
                .await
                .unwrap()),
            ["host-1", "host-2"]
        );
        assert_eq!(
            ids(db
                .list_signing_keys(KeyOwnerKind::Control, None)
                .await
                .unwrap()),
            ["ctl-1", "ctl-2"]
        );
        assert!(db
            .list_signing_keys(KeyOwnerKind::Control, Some("host-x"))
            .await
            .unwrap()
            .is_empty());

        // Retire: once; a second retirement keeps the first time.
        let retired = db.retire_signing_key("host-1", at(100)).await.unwrap();
        assert_eq!(retired.retired_at, Some(at(100)));
        let again = db.retire_signing_key("host-1", at(200)).await.unwrap();
        assert_eq!(again.retired_at, Some(at(100)));
        let listed = db
            .list_signing_keys(KeyOwnerKind::Host, Some("host-x"))
            .await
            .unwrap();
        assert_eq!(
            listed[0].retired_at,
            Some(at(100)),
            "retired keys stay listed"
        );
        assert_eq!(listed[1].retired_at, None);
        assert_eq!(listed[0], db.signing_key("host-1").await.unwrap().unwrap());
        // Re-registering a retired key does not revive it.
        assert_eq!(
            db.register_signing_key(&h1).await.unwrap().retired_at,
            Some(at(100))
        );
        assert!(matches!(
            db.retire_signing_key("nope", at(1)).await.unwrap_err(),
            DbError::NotFound { .. }
        ));
        assert_eq!(db.signing_key("nope").await.unwrap(), None);

        // Seen: registration counts; a touch moves it forward only.
        let seen = |id: &'static str| async move { db.signing_key(id).await.unwrap().unwrap() };
        assert_eq!(seen("ctl-2").await.seen_at, at(10));
        db.touch_signing_key("ctl-2", at(500)).await.unwrap();
        db.touch_signing_key("ctl-2", at(400)).await.unwrap();
        let c2_row = seen("ctl-2").await;
        assert_eq!(c2_row.seen_at, at(500));
        assert!(c2_row.live_since(at(500)) && !c2_row.live_since(at(501)));
        // ctl-1 was never touched: seen when registered, so not live now.
        assert!(!seen("ctl-1").await.live_since(at(400)));
        // A retired key is never live, however recently seen.
        db.touch_signing_key("host-1", at(900)).await.unwrap();
        assert!(!seen("host-1").await.live_since(at(0)));
        assert!(matches!(
            db.touch_signing_key("nope", at(1)).await.unwrap_err(),
            DbError::NotFound { .. }
        ));
    }
}
