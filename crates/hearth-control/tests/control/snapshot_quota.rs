//! Finding 5 of the security review: snapshots were limited by nothing
//! (four captures of 200 MB grew the store by 0.9 GB, never refused). They
//! now count against the workspace's storage quota, one budget with its
//! sandboxes' disks (a snapshot's disk, plus its memory when captured with
//! it), and a count of snapshots; past either, every path that makes a
//! snapshot (capture, build from an OCI image) and a sandbox create are
//! 429 in LangSmith's envelope, naming the limit and the numbers.
//!
//! The public API through the router, on a simulated host (`SimHost`), on
//! SQLite and PostgreSQL.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use hearth_db::{Db, Quotas};
use hearth_hostapi::SimHost;
use hearth_types::ByteSize;
use serde_json::{json, Value};

use crate::harness;

const GIB: u64 = 1 << 30;

struct Env {
    app: Router,
    key: String,
    _host: Arc<SimHost>,
}

/// A control plane over one simulated host and a workspace with `quotas`.
async fn env(url: &str, quotas: Quotas) -> Env {
    let db = Db::connect(url).await.unwrap();
    let (_, key) = crate::harness::workspace_key(&db, "quota", quotas).await;
    let (control, host) = harness::sim_control(db).await;
    Env {
        app: hearth_control::router(control),
        key,
        _host: host,
    }
}

impl Env {
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("x-api-key", &self.key)
            .header("content-type", "application/json")
            .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
            .unwrap();
        crate::harness::oneshot_json(&self.app, req).await
    }

    /// A ready busybox sandbox with a disk of `fs` GiB and 1 GiB of RAM.
    async fn sandbox(&self, name: &str, fs: u64) -> (StatusCode, Value) {
        let body = json!({
            "name": name, "snapshot": "busybox", "fs_capacity_bytes": fs * GIB,
            "mem_bytes": GIB, "cpu_millicores": 500, "wait_for_ready": true, "timeout": 30,
        });
        self.call(Method::POST, "/api/v2/sandboxes/boxes", Some(body))
            .await
    }

    async fn capture(&self, sandbox: &str, name: &str, memory: bool) -> (StatusCode, Value) {
        self.call(
            Method::POST,
            &format!("/api/v2/sandboxes/boxes/{sandbox}/snapshot"),
            Some(json!({"name": name, "include_memory": memory})),
        )
        .await
    }

    /// `POST /snapshots`: a snapshot built from an OCI image, `fs` GiB.
    async fn import(&self, name: &str, fs: u64) -> (StatusCode, Value) {
        let body = json!({
            "name": name, "docker_image": "127.0.0.1:5000/hello:v1",
            "fs_capacity_bytes": fs * GIB,
        });
        self.call(Method::POST, "/api/v2/sandboxes/snapshots", Some(body))
            .await
    }

    /// Waits until the snapshot has left `building`, then deletes it.
    async fn delete_snapshot(&self, reference: &str) {
        let path = format!("/api/v2/sandboxes/snapshots/{reference}");
        for _ in 0..500 {
            let (s, v) = self.call(Method::GET, &path, None).await;
            assert_eq!(s, StatusCode::OK, "{v}");
            if v["status"] != "building" {
                assert_eq!(v["status"], "ready", "{v}");
                let (s, v) = self.call(Method::DELETE, &path, None).await;
                assert_eq!(s, StatusCode::NO_CONTENT, "{v}");
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("snapshot {reference} is still building");
    }
}

/// A 429 in LangSmith's envelope; its message.
fn quota_refusal(s: StatusCode, v: &Value) -> String {
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(v["detail"]["error"], "QuotaExceeded", "{v}");
    assert!(v["detail"]["error_id"].is_string(), "{v}");
    v["detail"]["message"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn snapshots_count_against_the_storage_quota() {
    for url in hearth_db::testing::backend_urls().await {
        eprintln!("-- {}", url.url);
        let e = env(
            &url.url,
            Quotas {
                max_storage: Some(ByteSize::gib(4)),
                max_snapshots: Some(100),
                ..Quotas::default()
            },
        )
        .await;
        let (s, v) = e.sandbox("box", 1).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        for name in ["s1", "s2", "s3"] {
            let (s, v) = e.capture("box", name, false).await;
            assert_eq!(s, StatusCode::ACCEPTED, "{name}: {v}");
        }
        // 1 GiB of disk and three 1 GiB snapshots: the quota is full.
        let (s, v) = e.capture("box", "s4", false).await;
        let message = quota_refusal(s, &v);
        assert!(message.contains("storage"), "{message}");
        assert!(message.contains(&(5 * GIB).to_string()), "{message}");
        assert!(message.contains(&(4 * GIB).to_string()), "{message}");
        // Nothing was recorded for the refused capture.
        let (s, v) = e
            .call(Method::GET, "/api/v2/sandboxes/snapshots/s4:latest", None)
            .await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{v}");

        // Deleting one frees its share.
        e.delete_snapshot("s1:latest").await;
        let (s, v) = e.capture("box", "s4", false).await;
        assert_eq!(s, StatusCode::ACCEPTED, "{v}");

        // Memory counts: a capture with it charges the guest's RAM too
        // (3 GiB in use + 1 GiB disk + 1 GiB memory).
        e.delete_snapshot("s2:latest").await;
        let (s, v) = e.capture("box", "s5", true).await;
        let message = quota_refusal(s, &v);
        assert!(message.contains(&(5 * GIB).to_string()), "{message}");
        let (s, v) = e.capture("box", "s5", false).await;
        assert_eq!(s, StatusCode::ACCEPTED, "{v}");
        // Building from an OCI image is held to the same budget.
        let (s, v) = e.import("oci", 1).await;
        let message = quota_refusal(s, &v);
        assert!(message.contains("storage"), "{message}");
    }
}

#[tokio::test]
async fn snapshot_count_limit_is_enforced() {
    for url in hearth_db::testing::backend_urls().await {
        eprintln!("-- {}", url.url);
        let e = env(
            &url.url,
            Quotas {
                max_snapshots: Some(2),
                ..Quotas::default()
            },
        )
        .await;
        let (s, v) = e.sandbox("box", 1).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        let (s, v) = e.capture("box", "one", false).await;
        assert_eq!(s, StatusCode::ACCEPTED, "{v}");
        let (s, v) = e.import("two", 1).await;
        assert_eq!(s, StatusCode::ACCEPTED, "{v}");
        for (s, v) in [
            e.capture("box", "three", false).await,
            e.import("three", 1).await,
        ] {
            let message = quota_refusal(s, &v);
            assert!(message.contains("snapshot count"), "{message}");
            assert!(message.contains("3 snapshots"), "{message}");
            assert!(message.contains("limit 2"), "{message}");
        }
        e.delete_snapshot("one:latest").await;
        let (s, v) = e.import("three", 1).await;
        assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    }
}

#[tokio::test]
async fn sandbox_create_is_refused_when_snapshots_fill_the_storage_quota() {
    for url in hearth_db::testing::backend_urls().await {
        eprintln!("-- {}", url.url);
        let e = env(
            &url.url,
            Quotas {
                max_storage: Some(ByteSize::gib(3)),
                ..Quotas::default()
            },
        )
        .await;
        let (s, v) = e.import("big", 2).await;
        assert_eq!(s, StatusCode::ACCEPTED, "{v}");
        let (s, v) = e.sandbox("first", 1).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        // 2 GiB of snapshot and a 1 GiB disk: no room for another disk.
        let (s, v) = e.sandbox("second", 1).await;
        let message = quota_refusal(s, &v);
        assert!(message.contains("storage"), "{message}");
        assert!(message.contains(&(4 * GIB).to_string()), "{message}");
        let (s, _) = e
            .call(Method::GET, "/api/v2/sandboxes/boxes/second", None)
            .await;
        assert_eq!(s, StatusCode::NOT_FOUND, "a refused create records nothing");
        e.delete_snapshot("big:v1").await;
        let (s, v) = e.sandbox("second", 1).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }
}
