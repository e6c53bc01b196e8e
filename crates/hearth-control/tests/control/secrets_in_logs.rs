//! Issue 39, held: no secret the API is given or hands out — an API key,
//! a wrong key a client tried, a workspace secret, a registry password,
//! an envd token, a service URL's token — appears in a log line (at DEBUG
//! and up) or in `/metrics`.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::{json, Value};

use crate::harness::*;

/// Everything this test binary logs from the first call on (DEBUG and
/// up, every crate), kept in memory. Global, not scoped to the test's
/// thread: tracing caches each callsite's interest process-wide, and a
/// scoped subscriber missed events whose callsites other tests' threads
/// (with no subscriber) had registered first (CI saw it).
fn captured() -> Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        let installed = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || Sink(sink.clone()))
            .try_init();
        assert!(installed.is_ok(), "another subscriber took the logs");
        buf
    })
    .clone()
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn ok(r: Resp, status: u16, what: &str) -> Value {
    assert_eq!(r.status, status, "{what}: {}", r.text());
    r.json().unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_a_log_line_or_the_metrics() {
    let log = captured();
    let (s, _sim) = Server::on_sim().await;
    let admin = Some(s.admin.as_str());
    let mut secrets: Vec<(String, &str)> = Vec::new();

    // A key made through the API, and used.
    let made = ok(
        s.json(
            "POST",
            "/api/v1/api-key",
            admin,
            &json!({"description": "logs"}),
        )
        .await,
        201,
        "create a key",
    )
    .await;
    let key = made["key"].as_str().expect("the new key").to_owned();
    ok(
        s.json("GET", "/api/v2/sandboxes/boxes", Some(&key), &Value::Null)
            .await,
        200,
        "list",
    )
    .await;
    secrets.push((key.clone(), "a new API key"));
    secrets.push((s.admin.clone(), "the admin key"));
    secrets.push((s.other.clone(), "the other workspace's key"));
    // A wrong key a client tried.
    let wrong = format!("hth_{}", "5eC2e7".repeat(7));
    ok(
        s.json("GET", "/api/v2/sandboxes/boxes", Some(&wrong), &Value::Null)
            .await,
        401,
        "wrong key",
    )
    .await;
    secrets.push((wrong, "a wrong key"));
    // A workspace secret and a registry password.
    let value = "wS-secret-9f0c1a77e2";
    ok(
        s.json(
            "POST",
            "/api/v1/workspaces/current/secrets",
            admin,
            &json!([{"key": "LOG_TEST", "value": value}]),
        )
        .await,
        200,
        "workspace secret",
    )
    .await;
    secrets.push((value.to_owned(), "a workspace secret"));
    let password = "rEgistry-pw-0b5d3e";
    ok(
        s.json(
            "POST",
            "/api/v2/sandboxes/registries",
            admin,
            &json!({"name": "logs", "url": "https://registry.example:5000",
                    "username": "robot", "password": password}),
        )
        .await,
        201,
        "registry",
    )
    .await;
    secrets.push((password.to_owned(), "a registry password"));

    // An E2B sandbox's envd token, used (and a LangSmith service token).
    let e2b = ok(
        // The other workspace's: the admin's holds one sandbox.
        s.json(
            "POST",
            "/sandboxes",
            Some(&s.other),
            &json!({"templateID": "base", "timeout": 300}),
        )
        .await,
        201,
        "e2b create",
    )
    .await;
    let (id, envd) = (
        e2b["sandboxID"].as_str().unwrap().to_owned(),
        e2b["envdAccessToken"].as_str().unwrap().to_owned(),
    );
    let health = RawRequest::new(
        "GET",
        "/health",
        &[
            ("e2b-sandbox-id".into(), id.clone()),
            ("x-access-token".into(), envd.clone()),
        ],
        Vec::new(),
    );
    let r = send(s.addr, &health.bytes()).await;
    assert!(r.status < 300, "envd health: {} {}", r.status, r.text());
    secrets.push((envd, "an envd token"));
    s.sandbox("logs").await;
    let url = ok(
        s.json(
            "POST",
            "/api/v2/sandboxes/boxes/logs/service-url",
            admin,
            &json!({"port": 8000}),
        )
        .await,
        200,
        "service url",
    )
    .await;
    let token = url["token"].as_str().expect("a service token").to_owned();
    secrets.push((token, "a service token"));

    let metrics = s.json("GET", "/metrics", admin, &Value::Null).await;
    assert_eq!(metrics.status, 200);
    let metrics = metrics.text();
    // Let the last lines land.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let logged = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
    assert!(
        logged.contains("request refused") || logged.contains("DEBUG"),
        "the capture saw nothing: {} bytes",
        logged.len()
    );
    for (secret, what) in &secrets {
        assert!(!logged.contains(secret.as_str()), "{what} is in the log");
        assert!(!metrics.contains(secret.as_str()), "{what} is in /metrics");
    }
    s.stop().await;
}
