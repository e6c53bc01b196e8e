//! A sandbox's status history: every change of status, message or host is
//! recorded by the database itself, oldest first, the newest
//! `MAX_EVENTS_PER_SANDBOX` kept, gone with the sandbox.

use hearth_db::{Quotas, SandboxStatus, StatusExtra, Timestamp, MAX_EVENTS_PER_SANDBOX};
use hearth_types::HostId;

use crate::{each_backend, sandbox, workspace};

#[tokio::test]
async fn every_change_of_status_message_or_host_is_recorded_in_order() {
    each_backend!(|db| {
        let ws = workspace(db, Quotas::default()).await;
        let s = sandbox(ws.id, "s");
        db.insert_sandbox(&s).await.unwrap();
        let host = HostId::new();
        let set = |status, message: Option<&'static str>, extra: StatusExtra| {
            db.set_status(s.id, status, message, extra)
        };
        set(
            SandboxStatus::Provisioning,
            Some("placing"),
            StatusExtra {
                host_id: Some(Some(host)),
                ..StatusExtra::default()
            },
        )
        .await
        .unwrap();
        // No change: nothing recorded.
        set(
            SandboxStatus::Provisioning,
            Some("placing"),
            StatusExtra::default(),
        )
        .await
        .unwrap();
        let ready = set(SandboxStatus::Ready, None, StatusExtra::default())
            .await
            .unwrap();
        // A write that changes none of the three (the idle clock) adds nothing.
        db.touch_activity(s.id, Timestamp::now()).await.unwrap();
        set(
            SandboxStatus::Stopped,
            None,
            StatusExtra {
                host_id: Some(None),
                ..StatusExtra::default()
            },
        )
        .await
        .unwrap();
        set(
            SandboxStatus::Failed,
            Some("disk lost"),
            StatusExtra::default(),
        )
        .await
        .unwrap();

        let events = db.sandbox_events(s.id).await.unwrap();
        let seen: Vec<_> = events
            .iter()
            .map(|e| (e.status, e.status_message.as_deref(), e.host_id))
            .collect();
        assert_eq!(
            seen,
            vec![
                (SandboxStatus::Provisioning, None, None),
                (SandboxStatus::Provisioning, Some("placing"), Some(host)),
                (SandboxStatus::Ready, None, Some(host)),
                (SandboxStatus::Stopped, None, None),
                (SandboxStatus::Failed, Some("disk lost"), None),
            ]
        );
        assert_eq!(events[0].at, s.updated_at);
        assert_eq!(events[2].at, ready.updated_at);
        assert!(events.windows(2).all(|w| w[0].at <= w[1].at));

        // Another sandbox's history is its own.
        let t = sandbox(ws.id, "t");
        db.insert_sandbox(&t).await.unwrap();
        assert_eq!(db.sandbox_events(t.id).await.unwrap().len(), 1);

        // Gone with the sandbox.
        db.delete_sandbox(s.id).await.unwrap();
        assert!(db.sandbox_events(s.id).await.unwrap().is_empty());
        assert_eq!(db.sandbox_events(t.id).await.unwrap().len(), 1);
    });
}

#[tokio::test]
async fn only_the_newest_changes_are_kept() {
    each_backend!(|db| {
        let ws = workspace(db, Quotas::default()).await;
        let s = sandbox(ws.id, "s");
        db.insert_sandbox(&s).await.unwrap();
        let changes = MAX_EVENTS_PER_SANDBOX + 20;
        for i in 0..changes {
            let msg = format!("step {i}");
            db.set_status(
                s.id,
                SandboxStatus::Provisioning,
                Some(&msg),
                StatusExtra::default(),
            )
            .await
            .unwrap();
        }
        let events = db.sandbox_events(s.id).await.unwrap();
        assert_eq!(events.len(), MAX_EVENTS_PER_SANDBOX);
        let last = format!("step {}", changes - 1);
        assert_eq!(
            events.last().unwrap().status_message.as_deref(),
            Some(last.as_str())
        );
        let first = format!("step {}", changes - MAX_EVENTS_PER_SANDBOX);
        assert_eq!(events[0].status_message.as_deref(), Some(first.as_str()));
    });
}
