//! The public API against both databases (SQLite and a real PostgreSQL):
//! every validation rule and error code the SDK maps, auth and workspace
//! isolation, placement and quotas, with a real host agent booting real
//! microVMs (busybox, TCG here) where a sandbox must run.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use hearth_control::{Control, ControlConfig, LocalHost};
use hearth_db::{Db, NewWorkspace, Quotas};
use hearth_host::{Host, HostConfig};
use hearth_types::{ByteSize, HostId, MilliCpu, WorkspaceId};
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::harness::{host, shared_dir};

struct Env {
    app: Router,
    control: Arc<Control>,
    /// The control plane's settings (its master key, to restart it).
    cfg: ControlConfig,
    /// Admin of workspace 1.
    admin: String,
    /// Workspace 1, `sandboxes:read` only.
    reader: String,
    /// Workspace 2.
    other: String,
    /// Workspace 3, quota of two sandboxes and one vCPU.
    small: String,
}

async fn key(db: &Db, ws: WorkspaceId, perms: &[&str]) -> String {
    hearth_control::auth::create_key(db, ws, perms, "")
        .await
        .unwrap()
        .1
}

async fn env(url: &str, hosts: Vec<LocalHost>) -> Env {
    let db = Db::connect(url).await.unwrap();
    let mut keys = Vec::new();
    for (i, quotas) in [
        Quotas {
            max_sandboxes: Some(1000),
            max_cpu: Some(MilliCpu(16_000)),
            max_mem: Some(ByteSize::gib(64)),
            max_storage: None,
            max_snapshots: None,
        },
        Quotas::default(),
        Quotas {
            max_sandboxes: Some(2),
            max_cpu: Some(MilliCpu(1000)),
            ..Quotas::default()
        },
    ]
    .into_iter()
    .enumerate()
    {
        let ws = WorkspaceId::new();
        db.create_workspace(&NewWorkspace {
            id: ws,
            name: format!("ws{i}"),
            quotas,
        })
        .await
        .unwrap();
        keys.push((ws, key(&db, ws, &["*"]).await));
    }
    let reader = key(&db, keys[0].0, &["sandboxes:read"]).await;
    let cfg = crate::harness::test_config();
    let control = Control::open(db, cfg.clone(), hosts).await.unwrap();
    Env {
        cfg,
        app: hearth_control::router(control.clone()),
        control,
        admin: keys[0].1.clone(),
        reader,
        other: keys[1].1.clone(),
        small: keys[2].1.clone(),
    }
}

/// A simulated host, with the same room as [`local`]'s.
fn simulated(host: Arc<hearth_hostapi::SimHost>) -> LocalHost {
    LocalHost {
        id: HostId::new(),
        host,
        capacity_cpu: MilliCpu(64_000),
        capacity_mem: ByteSize::gib(256),
        store_url: String::new(),
    }
}

fn local(host: Arc<Host>) -> LocalHost {
    LocalHost {
        id: HostId::new(),
        host: Arc::new(hearth_host::InProcessHost::new(host)),
        capacity_cpu: MilliCpu(64_000),
        capacity_mem: ByteSize::gib(256),
        store_url: String::new(),
    }
}

impl Env {
    async fn call(
        &self,
        method: Method,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let raw = body.map(|b| b.to_string().into_bytes());
        self.raw(method, path, key, raw).await
    }

    async fn raw(
        &self,
        method: Method,
        path: &str,
        key: Option<&str>,
        body: Option<Vec<u8>>,
    ) -> (StatusCode, Value) {
        let mut req = Request::builder().method(method).uri(path);
        if let Some(k) = key {
            req = req.header("x-api-key", k);
        }
        req = req.header("content-type", "application/json");
        let req = req
            .body(body.map(Body::from).unwrap_or_else(Body::empty))
            .unwrap();
        let resp = self.app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 64 << 20)
            .await
            .unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// A request with extra headers (no credential when `key` is empty);
    /// the raw answer.
    async fn fetch(
        &self,
        method: Method,
        path: &str,
        key: &str,
        headers: &[(&str, &str)],
    ) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
        let mut req = Request::builder().method(method).uri(path);
        if !key.is_empty() {
            req = req.header("x-api-key", key);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = self
            .app
            .clone()
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let (parts, body) = resp.into_parts();
        let bytes = axum::body::to_bytes(body, 64 << 20).await.unwrap();
        (parts.status, parts.headers, bytes.to_vec())
    }

    async fn create(&self, key: &str, body: Value) -> (StatusCode, Value) {
        self.call(
            Method::POST,
            "/api/v2/sandboxes/boxes",
            Some(key),
            Some(body),
        )
        .await
    }
}

/// The envelope the SDK reads: `detail.error` and `detail.message`.
fn error_of(v: &Value) -> &str {
    v["detail"]["error"].as_str().unwrap_or("")
}

/// FastAPI-style validation list: the SDK's `ValidationError(field)`.
fn validation_field(v: &Value) -> String {
    let item = &v["detail"][0];
    assert_eq!(item["type"], "value_error", "{v}");
    item["loc"]
        .as_array()
        .and_then(|l| l.last())
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

async fn validation_and_errors(e: &Env) {
    let a = e.admin.as_str();
    // Auth: missing and wrong keys.
    let (s, v) = e
        .call(Method::GET, "/api/v2/sandboxes/boxes", None, None)
        .await;
    assert_eq!(
        (s, error_of(&v)),
        (StatusCode::UNAUTHORIZED, "Unauthorized"),
        "{v}"
    );
    let (s, _) = e
        .call(Method::GET, "/v2/sandboxes/boxes", Some("hth_nope"), None)
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);

    // Malformed JSON, wrong types, oversized bodies.
    let (s, v) = e
        .raw(
            Method::POST,
            "/api/v2/sandboxes/boxes",
            Some(a),
            Some(b"{not json".to_vec()),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let (s, v) = e.create(a, json!({"vcpus": "two"})).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(validation_field(&v), "vcpus");
    let (s, v) = e.create(a, json!({"labels": [1, 2]})).await;
    assert_eq!(
        (s, validation_field(&v).as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, "labels")
    );
    let big = vec![b' '; 2 << 20];
    let (s, v) = e
        .raw(Method::POST, "/api/v2/sandboxes/boxes", Some(a), Some(big))
        .await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    assert!(!error_of(&v).is_empty(), "413 carries the envelope: {v}");

    // Sizing rules.
    let gib = 1u64 << 30;
    for (body, field) in [
        (json!({"vcpus": 1, "mem_bytes": 20 * gib}), "mem_bytes"),
        (json!({"vcpus": 1, "mem_bytes": gib}), "mem_bytes"),
        (json!({"mem_bytes": 65 * gib, "vcpus": 16}), "mem_bytes"),
        (json!({"vcpus": 0}), "vcpus"),
        (json!({"cpu_millicores": 0}), "cpu_millicores"),
        (json!({"idle_ttl_seconds": 61}), "idle_ttl_seconds"),
        (json!({"idle_ttl_seconds": -60}), "idle_ttl_seconds"),
        (
            json!({"delete_after_stop_seconds": 59}),
            "delete_after_stop_seconds",
        ),
        (json!({"name": "Bad Name!"}), "name"),
        (
            json!({"persistent": false, "preserve_memory_on_stop": true}),
            "preserve_memory_on_stop",
        ),
        (
            json!({"snapshot": "busybox", "snapshot_id": "00000000-0000-0000-0000-000000000001"}),
            "snapshot",
        ),
        (
            json!({"snapshot": "busybox", "fs_capacity_bytes": 1024}),
            "fs_capacity_bytes",
        ),
        (
            json!({"snapshot": "busybox", "persistent": false, "vcpus": 1, "fs_capacity_bytes": 17 * gib}),
            "fs_capacity_bytes",
        ),
    ] {
        let (s, v) = e.create(a, body.clone()).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body} → {v}");
        assert_eq!(validation_field(&v), field, "{body} → {v}");
    }
    // cpu_millicores takes precedence over vcpus: 500 millicores allow 1–3 GiB,
    // which 2 vCPU would refuse. (Refused later only by the missing snapshot.)
    let (s, v) = e
        .create(
            a,
            json!({"vcpus": 2, "cpu_millicores": 500, "mem_bytes": gib, "snapshot": "nope"}),
        )
        .await;
    assert_eq!(
        (s, error_of(&v)),
        (StatusCode::NOT_FOUND, "NotFound"),
        "{v}"
    );

    // Unknown sandboxes, unknown routes.
    let (s, v) = e
        .call(Method::GET, "/api/v2/sandboxes/boxes/ghost", Some(a), None)
        .await;
    assert_eq!((s, error_of(&v)), (StatusCode::NOT_FOUND, "NotFound"));
    let (s, v) = e.call(Method::GET, "/api/v2/nowhere", Some(a), None).await;
    assert_eq!((s, error_of(&v)), (StatusCode::NOT_FOUND, "NotFound"));
    let (s, v) = e
        .call(
            Method::GET,
            "/dataplane/not-a-sandbox/download?path=/etc/hostname",
            Some(a),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    let (s, _) = e
        .call(Method::PUT, "/api/v2/sandboxes/boxes", Some(a), None)
        .await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
}

/// `/glob`, `/grep` and `/download`'s validators, `HEAD` and conditions,
/// against a real guest.
async fn search_and_conditional_download(e: &Env, a: &str, id: &str) {
    let dp = format!("/dataplane/{id}");
    let (s, v) = e
        .call(
            Method::POST,
            &format!("{dp}/execute"),
            Some(a),
            Some(
                json!({"command": "mkdir -p /srv/t/sub/deep && cd /srv/t && \
                printf 'alpha\nneedle one\n' > a.py && printf 'needle two\n' > sub/b.py && \
                printf 'needle\\0bin' > sub/c.bin && printf 'x needle\n' > sub/deep/d.txt && \
                printf '0123456789' > digits"}),
            ),
        )
        .await;
    assert_eq!(
        (s, v["exit_code"].as_i64()),
        (StatusCode::OK, Some(0)),
        "{v}"
    );

    let glob_url = format!("{dp}/glob");
    let glob = |body: Value| e.call(Method::POST, &glob_url, Some(a), Some(body));
    let (s, v) = glob(json!({"pattern": "**/*.py", "path": "/srv/t"})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let paths: Vec<&str> = v["matches"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["path"].as_str())
        .collect();
    assert_eq!(paths, ["/srv/t/a.py", "/srv/t/sub/b.py"], "{v}");
    assert_eq!(v["truncated"], false);
    let first = &v["matches"][0];
    assert_eq!(
        (first["is_dir"].as_bool(), first["size_bytes"].as_u64()),
        (Some(false), Some(17))
    );
    assert!(
        first["modified_at"]
            .as_str()
            .is_some_and(|t| t.contains('T')),
        "{v}"
    );
    // `ls` is glob "*": immediate entries only, directories flagged.
    let (_, v) = glob(json!({"pattern": "*", "path": "/srv/t", "limit": 2})).await;
    assert_eq!(v["matches"].as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(v["truncated"], true, "{v}");
    let (_, v) = glob(json!({"pattern": "sub", "path": "/srv/t"})).await;
    assert_eq!(v["matches"][0]["is_dir"], true, "{v}");
    // Errors: a missing directory is the file 404; bad fields are 422.
    let (s, v) = glob(json!({"pattern": "*", "path": "/srv/none"})).await;
    assert_eq!(
        (s, error_of(&v)),
        (StatusCode::NOT_FOUND, "FileNotFound"),
        "{v}"
    );
    for (body, field) in [
        (json!({"pattern": "", "path": "/srv/t"}), "pattern"),
        (
            json!({"pattern": "*", "path": "/srv/t", "limit": 0}),
            "limit",
        ),
        (json!({"pattern": "a**", "path": "/srv/t"}), "pattern"),
        (json!({"pattern": "*", "path": "/srv/t/a.py"}), "path"),
    ] {
        let (s, v) = glob(body).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
        assert_eq!(validation_field(&v), field, "{v}");
    }
    let (s, v) = glob(json!({"pattern": 5, "path": "/srv/t"})).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");

    let grep_url = format!("{dp}/grep");
    let grep = |body: Value| e.call(Method::POST, &grep_url, Some(a), Some(body));
    let (s, v) = grep(json!({"pattern": "needle", "path": "/srv/t"})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let hits: Vec<(String, u64, String)> = v["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["path"].as_str().unwrap_or("").to_owned(),
                m["line"].as_u64().unwrap_or(0),
                m["text"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    let want = [
        ("/srv/t/a.py", 2, "needle one"),
        ("/srv/t/sub/b.py", 1, "needle two"),
        ("/srv/t/sub/deep/d.txt", 1, "x needle"),
    ]
    .map(|(p, l, t)| (p.to_owned(), l, t.to_owned()));
    assert_eq!(hits, want, "binary files are skipped: {v}");
    let (_, v) = grep(json!({"pattern": "needle", "path": "/srv/t", "glob": "*.py"})).await;
    assert_eq!(v["matches"].as_array().map(Vec::len), Some(2), "{v}");
    let (_, v) = grep(json!({"pattern": "needle", "path": "/srv/t", "limit": 1})).await;
    assert_eq!(
        (v["matches"].as_array().map(Vec::len), &v["truncated"]),
        (Some(1), &json!(true))
    );
    let (s, v) = grep(json!({"pattern": "", "path": "/srv/t"})).await;
    assert_eq!(
        (s, validation_field(&v)),
        (StatusCode::UNPROCESSABLE_ENTITY, "pattern".into())
    );
    let (s, v) = grep(json!({"pattern": "x", "path": "/srv/none"})).await;
    assert_eq!(
        (s, error_of(&v)),
        (StatusCode::NOT_FOUND, "FileNotFound"),
        "{v}"
    );

    // Download validators and conditions.
    let file = format!("{dp}/download?path=/srv/t/digits");
    let (s, h, body) = e.fetch(Method::HEAD, &file, a, &[]).await;
    assert_eq!(s, StatusCode::OK);
    assert!(body.is_empty(), "HEAD has no body");
    assert_eq!(h["content-length"], "10");
    let etag = h["etag"].to_str().unwrap().to_owned();
    assert!(etag.starts_with('"') && etag.ends_with('"'), "{etag}");
    assert!(h["last-modified"].to_str().unwrap().ends_with("GMT"));
    let (s, h, body) = e
        .fetch(Method::GET, &file, a, &[("if-none-match", &etag)])
        .await;
    assert_eq!((s, body.len()), (StatusCode::NOT_MODIFIED, 0));
    assert_eq!(h["etag"], etag.as_str());
    let (s, h, body) = e
        .fetch(
            Method::GET,
            &file,
            a,
            &[("range", "bytes=2-4"), ("if-range", &etag)],
        )
        .await;
    assert_eq!(
        (s, body.as_slice()),
        (StatusCode::PARTIAL_CONTENT, &b"234"[..])
    );
    assert_eq!(
        (&h["content-range"], &h["etag"]),
        (&"bytes 2-4/10".parse().unwrap(), &etag.parse().unwrap())
    );
    // Rewritten: the old ETag no longer holds, so the whole new file comes back.
    let (s, _) = e
        .call(
            Method::POST,
            &format!("{dp}/execute"),
            Some(a),
            Some(json!({"command": "printf 'abcdefghijkl' > /srv/t/digits.new && mv /srv/t/digits.new /srv/t/digits"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, h, body) = e
        .fetch(
            Method::GET,
            &file,
            a,
            &[("range", "bytes=2-4"), ("if-range", &etag)],
        )
        .await;
    assert_eq!((s, body.as_slice()), (StatusCode::OK, &b"abcdefghijkl"[..]));
    assert_ne!(h["etag"], etag.as_str());
    let (s, _, body) = e
        .fetch(Method::GET, &file, a, &[("if-none-match", &etag)])
        .await;
    assert_eq!((s, body.len()), (StatusCode::OK, 12));
    let (s, _, _) = e
        .fetch(Method::GET, &file, a, &[("range", "bytes=50-")])
        .await;
    assert_eq!(s, StatusCode::RANGE_NOT_SATISFIABLE);
    let (s, _, _) = e
        .fetch(
            Method::HEAD,
            &format!("{dp}/download?path=/srv/none"),
            a,
            &[],
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

/// The SSE exec transport on the wire: event names, base64 output with
/// offsets, stream ends, exit; resume replays; unknown commands are 404.
async fn sse_exec(e: &Env, a: &str, id: &str) {
    let post = |path: String, body: Value| async move {
        let req = Request::builder()
            .method(Method::POST)
            .uri(path)
            .header("x-api-key", a)
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        let resp = e.app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let ct = resp.headers().get("content-type").cloned();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, ct, String::from_utf8_lossy(&bytes).into_owned())
    };
    /// (event, data) pairs of an SSE body.
    fn events(text: &str) -> Vec<(String, Value)> {
        text.split("\n\n")
            .filter_map(|block| {
                let mut name = None;
                let mut data = None;
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event: ") {
                        name = Some(v.to_owned());
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data = serde_json::from_str(v).ok();
                    }
                }
                Some((name?, data?))
            })
            .collect()
    }
    let dp = format!("/dataplane/{id}/execute/stream");
    let (s, ct, body) = post(
        format!("{dp}/start"),
        json!({"command": "echo hi; echo oops >&2; exit 4", "command_id": "sse-wire-1"}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(ct.unwrap(), "text/event-stream");
    let ev = events(&body);
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"started"), "{body}");
    assert_eq!(ev[0].1["command_id"], "sse-wire-1");
    assert_eq!(
        &names[names.len() - 3..],
        ["stream_end", "stream_end", "exit"],
        "{body}"
    );
    assert_eq!(ev.last().unwrap().1["exit_code"], 4);
    let out: Vec<&Value> = ev
        .iter()
        .filter(|(n, _)| n == "stdout")
        .map(|(_, d)| d)
        .collect();
    assert_eq!(
        (out[0]["data"].as_str(), out[0]["offset"].as_u64()),
        (Some("aGkK"), Some(0)),
        "{body}"
    );
    let ends: Vec<(&str, u64)> = ev
        .iter()
        .filter(|(n, _)| n == "stream_end")
        .map(|(_, d)| (d["stream"].as_str().unwrap(), d["offset"].as_u64().unwrap()))
        .collect();
    assert_eq!(ends, [("stdout", 3), ("stderr", 5)]);
    // Resume from the middle: only the missing bytes, then the exit again.
    let (s, _, body) = post(
        format!("{dp}/resume"),
        json!({"command_id": "sse-wire-1", "stdout_offset": 1, "stderr_offset": 5}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let ev = events(&body);
    let out: Vec<&Value> = ev
        .iter()
        .filter(|(n, _)| n == "stdout")
        .map(|(_, d)| d)
        .collect();
    assert_eq!(
        (out[0]["data"].as_str(), out[0]["offset"].as_u64()),
        (Some("aQo="), Some(1)),
        "{body}"
    );
    assert!(!ev.iter().any(|(n, _)| n == "stderr"), "{body}");
    assert_eq!(ev.last().unwrap().0, "exit");
    let (s, _, body) = post(format!("{dp}/resume"), json!({"command_id": "nope"})).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{body}");
    assert!(body.contains("CommandNotFound"), "{body}");
    let (s, _, body) = post(format!("{dp}/start"), json!({"cmd": "x"})).await;
    assert!(s.is_client_error(), "{s} {body}");
}

/// Service URLs: a token URL proxies HTTP to a port in the sandbox.
async fn service_urls(e: &Env, a: &str, id: &str) {
    let (s, v) = e
        .call(
            Method::POST,
            &format!("/dataplane/{id}/execute"),
            Some(a),
            Some(json!({"command": "mkdir -p /srv/www/sub && echo 'hello from httpd' > /srv/www/sub/index.html && busybox httpd -p 8081 -h /srv/www"})),
        )
        .await;
    assert_eq!(
        (s, v["exit_code"].as_i64()),
        (StatusCode::OK, Some(0)),
        "{v}"
    );
    let mint = |body: Value| {
        e.call(
            Method::POST,
            "/api/v2/sandboxes/boxes/box-one/service-url",
            Some(a),
            Some(body),
        )
    };
    let (s, v) = mint(json!({"port": 8081, "expires_in_seconds": 120})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    for k in ["browser_url", "service_url", "token", "expires_at"] {
        assert!(v[k].as_str().is_some_and(|x| !x.is_empty()), "{k}: {v}");
    }
    // The port's own origin (issue 39), the token in the SDK's header.
    let url = v["service_url"].as_str().unwrap();
    let host = url.strip_prefix("http://").unwrap().to_owned();
    assert!(host.starts_with(&format!("8081-{id}.")), "{url}");
    let token = v["token"].as_str().unwrap().to_owned();
    let with_token = [
        ("host", host.as_str()),
        ("x-langsmith-sandbox-service-token", token.as_str()),
    ];
    let (s, h, body) = e
        .fetch(Method::GET, "/sub/index.html?x=1", "", &with_token)
        .await;
    assert_eq!(
        (s, body.as_slice()),
        (StatusCode::OK, &b"hello from httpd\n"[..])
    );
    assert!(h.get("content-type").is_some());
    let (s, _, _) = e.fetch(Method::GET, "/missing.html", "", &with_token).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "the app's own 404 passes through");
    let (s, _, _) = e
        .fetch(
            Method::GET,
            "/sub/index.html",
            "",
            &[("host", host.as_str())],
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "no token, no service");
    // The old URL on the API's origin only redirects to the hand-off.
    let (s, h, _) = e
        .fetch(
            Method::GET,
            &format!("/services/{token}/sub/index.html"),
            "",
            &[],
        )
        .await;
    assert_eq!(s, StatusCode::TEMPORARY_REDIRECT);
    let to = h.get("location").unwrap().to_str().unwrap();
    assert!(
        to.starts_with(&format!("{url}/.hearth/auth?token="))
            && to.ends_with("&next=%2Fsub%2Findex.html"),
        "{to}"
    );
    // Nothing on the port: 502. A download-link token is not a service token.
    let (_, v) = mint(json!({"port": 9})).await;
    let closed = v["service_url"]
        .as_str()
        .unwrap()
        .strip_prefix("http://")
        .unwrap()
        .to_owned();
    let closed_token = v["token"].as_str().unwrap().to_owned();
    let (s, _, body) = e
        .fetch(
            Method::GET,
            "/",
            "",
            &[
                ("host", closed.as_str()),
                ("x-langsmith-sandbox-service-token", closed_token.as_str()),
            ],
        )
        .await;
    assert_eq!(
        s,
        StatusCode::BAD_GATEWAY,
        "{}",
        String::from_utf8_lossy(&body)
    );
    let (s, _, _) = e.fetch(Method::GET, "/services/forged/x", "", &[]).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    for (body, field) in [
        (json!({"port": 0}), "port"),
        (json!({"port": 70000}), "port"),
        (
            json!({"port": 80, "expires_in_seconds": 0}),
            "expires_in_seconds",
        ),
        (json!({"port": 80, "access": "workspace"}), "access"),
    ] {
        let (s, v) = mint(body).await;
        assert_eq!(
            (s, validation_field(&v)),
            (StatusCode::UNPROCESSABLE_ENTITY, field.into()),
            "{v}"
        );
    }
    let (s, _) = e
        .call(
            Method::POST,
            "/api/v2/sandboxes/boxes/box-one/service-url",
            Some(&e.reader),
            Some(json!({"port": 8081})),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
}

/// `download-url` links: minted with runtime rights, fetched with none.
/// Returns the path of a live link to `/srv/t/a.py`.
async fn download_links(e: &Env, a: &str, id: &str) -> String {
    let mint = |key: &str, body: Value| {
        let key = key.to_owned();
        async move {
            e.call(
                Method::POST,
                "/api/v2/sandboxes/boxes/box-one/download-url",
                Some(&key),
                Some(body),
            )
            .await
        }
    };
    let (s, v) = mint(
        a,
        json!({"path": "/srv/t/a.py", "content_type": "text/x-python", "content_disposition": "attachment"}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    // Every link expires: omitted means the server's default (24 h).
    let expires = v["expires_at"].as_str().unwrap_or_default();
    assert!(expires.starts_with("20"), "{v}");
    let url = v["download_url"].as_str().unwrap().to_owned();
    let token = v["token"].as_str().unwrap();
    assert!(url.ends_with(&format!("/downloads/{token}")), "{url}");
    let path = url[url.find("/downloads/").unwrap()..].to_owned();

    // Anyone with the link: GET, HEAD, Range; headers pinned at minting.
    let (s, h, body) = e.fetch(Method::GET, &path, "", &[]).await;
    assert_eq!(
        (s, body.as_slice()),
        (StatusCode::OK, &b"alpha\nneedle one\n"[..])
    );
    assert_eq!(h["content-type"], "text/x-python");
    assert_eq!(h["content-disposition"], "attachment; filename=\"a.py\"");
    assert_eq!(h["content-security-policy"], "sandbox");
    let (s, h, body) = e.fetch(Method::HEAD, &path, "", &[]).await;
    assert_eq!((s, body.len()), (StatusCode::OK, 0));
    assert_eq!(h["content-length"], "17");
    let (s, _, body) = e
        .fetch(Method::GET, &path, "", &[("range", "bytes=0-4")])
        .await;
    assert_eq!(
        (s, body.as_slice()),
        (StatusCode::PARTIAL_CONTENT, &b"alpha"[..])
    );
    // A forged or damaged token is unknown; the data plane still wants a key.
    let (s, _, _) = e.fetch(Method::GET, &format!("{path}x"), "", &[]).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _, _) = e.fetch(Method::GET, "/downloads/garbage", "", &[]).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _, _) = e
        .fetch(
            Method::GET,
            &format!("/dataplane/{id}/download?path=/srv/t/a.py"),
            "",
            &[],
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);

    // Minting: runtime rights, a real sandbox, valid fields.
    let (s, v) = mint(&e.reader, json!({"path": "/srv/t/a.py"})).await;
    assert_eq!(
        (s, error_of(&v)),
        (StatusCode::FORBIDDEN, "Forbidden"),
        "{v}"
    );
    let (s, _) = mint(&e.other, json!({"path": "/srv/t/a.py"})).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    for (body, field) in [
        (json!({"path": ""}), "path"),
        (
            json!({"path": "/x", "expires_in_seconds": 0}),
            "expires_in_seconds",
        ),
        (
            json!({"path": "/x", "content_disposition": "evil"}),
            "content_disposition",
        ),
    ] {
        let (s, v) = mint(a, body).await;
        assert_eq!(
            (s, validation_field(&v)),
            (StatusCode::UNPROCESSABLE_ENTITY, field.into()),
            "{v}"
        );
    }
    // Expiry.
    let (s, v) = mint(a, json!({"path": "/srv/t/a.py", "expires_in_seconds": 1})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(v["expires_at"].is_string(), "{v}");
    let url = v["download_url"].as_str().unwrap();
    let short = &url[url.find("/downloads/").unwrap()..];
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let (s, _, _) = e.fetch(Method::GET, short, "", &[]).await;
    assert_eq!(s, StatusCode::GONE);
    path
}

async fn lifecycle(e: &Env) {
    let a = e.admin.as_str();
    let (s, sb) = e
        .create(
            a,
            json!({"name": "box-one", "snapshot": "busybox", "vcpus": 1, "mem_bytes": 2u64 << 30,
                          "labels": {"team": "a"}, "wait_for_ready": true, "timeout": 120}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{sb}");
    assert_eq!(sb["status"], "ready");
    for k in [
        "id",
        "name",
        "dataplane_url",
        "snapshot_id",
        "vcpus",
        "cpu_millicores",
        "mem_bytes",
        "fs_capacity_bytes",
        "idle_ttl_seconds",
        "delete_after_stop_seconds",
        "created_at",
        "run_config",
    ] {
        assert!(!sb[k].is_null(), "{k} missing: {sb}");
    }
    let id = sb["id"].as_str().unwrap().to_owned();
    assert!(sb["dataplane_url"]
        .as_str()
        .unwrap()
        .ends_with(&format!("/dataplane/{id}")));

    // Name conflict → 409; by id and by name; other workspace → 404.
    let (s, v) = e
        .create(a, json!({"name": "box-one", "snapshot": "busybox"}))
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    for r in [&id, "box-one"] {
        let (s, v) = e
            .call(
                Method::GET,
                &format!("/api/v2/sandboxes/boxes/{r}"),
                Some(a),
                None,
            )
            .await;
        assert_eq!((s, v["name"].as_str()), (StatusCode::OK, Some("box-one")));
    }
    let (s, _) = e
        .call(
            Method::GET,
            "/api/v2/sandboxes/boxes/box-one",
            Some(&e.other),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = e
        .call(
            Method::GET,
            &format!("/dataplane/{id}/download?path=/etc/hostname"),
            Some(&e.other),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // Runtime access needs the creator or sandboxes:exec.
    let (s, v) = e
        .call(
            Method::GET,
            &format!("/dataplane/{id}/download?path=/etc/hostname"),
            Some(&e.reader),
            None,
        )
        .await;
    assert_eq!(
        (s, error_of(&v)),
        (StatusCode::FORBIDDEN, "Forbidden"),
        "{v}"
    );
    let (s, _) = e
        .call(
            Method::GET,
            "/api/v2/sandboxes/boxes/box-one",
            Some(&e.reader),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "reading is allowed");
    let (s, _) = e
        .call(
            Method::POST,
            "/api/v2/sandboxes/boxes/box-one/stop",
            Some(&e.reader),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    // The data plane works for the creator.
    let (s, v) = e
        .call(
            Method::POST,
            &format!("/dataplane/{id}/execute"),
            Some(a),
            Some(json!({"command": "echo hi; exit 3"})),
        )
        .await;
    assert_eq!(
        (s, v["stdout"].as_str(), v["exit_code"].as_i64()),
        (StatusCode::OK, Some("hi\n"), Some(3)),
        "{v}"
    );
    let (s, v) = e
        .call(
            Method::GET,
            &format!("/dataplane/{id}/download?path=/nope"),
            Some(a),
            None,
        )
        .await;
    assert_eq!((s, error_of(&v)), (StatusCode::NOT_FOUND, "FileNotFound"));

    search_and_conditional_download(e, a, &id).await;
    let link = download_links(e, a, &id).await;
    sse_exec(e, a, &id).await;
    service_urls(e, a, &id).await;

    // List with filters and a cursor.
    let (s, v) = e.create(a, json!({"name": "box-two", "snapshot": "busybox", "labels": {"team": "b"}, "wait_for_ready": false})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (_, v) = e
        .call(
            Method::GET,
            "/api/v2/sandboxes/boxes?label=team=a",
            Some(a),
            None,
        )
        .await;
    let names: Vec<&str> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names, ["box-one"], "{v}");
    assert_eq!(v["sandboxes"], v["items"], "the SDK reads `sandboxes`");
    let (_, v) = e
        .call(
            Method::GET,
            "/api/v2/sandboxes/boxes?page_size=1&sort_by=name&sort_order=asc",
            Some(a),
            None,
        )
        .await;
    assert_eq!(v["items"][0]["name"], "box-one");
    let cursor = v["next_cursor"].as_str().unwrap().to_owned();
    let (_, v) = e
        .call(
            Method::GET,
            &format!(
                "/api/v2/sandboxes/boxes?page_size=1&sort_by=name&sort_order=asc&cursor={cursor}"
            ),
            Some(a),
            None,
        )
        .await;
    assert_eq!(v["items"][0]["name"], "box-two");
    let (s, _) = e
        .call(
            Method::GET,
            "/api/v2/sandboxes/boxes?cursor=garbage",
            Some(a),
            None,
        )
        .await;
    assert!(s.is_client_error());
    let (_, v) = e
        .call(
            Method::GET,
            "/api/v2/sandboxes/boxes?name_contains=TWO",
            Some(a),
            None,
        )
        .await;
    assert_eq!(v["items"].as_array().unwrap().len(), 1);

    // PATCH: rename conflict → 409; TTL update.
    let (s, _) = e
        .call(
            Method::PATCH,
            "/api/v2/sandboxes/boxes/box-two",
            Some(a),
            Some(json!({"name": "box-one"})),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
    let (s, v) = e
        .call(
            Method::PATCH,
            "/api/v2/sandboxes/boxes/box-one",
            Some(a),
            Some(json!({"idle_ttl_seconds": 120})),
        )
        .await;
    assert_eq!(
        (s, v["idle_ttl_seconds"].as_u64()),
        (StatusCode::OK, Some(120)),
        "{v}"
    );

    // Stop, status, start (the disk survives), delete.
    let (s, _) = e
        .call(
            Method::POST,
            &format!("/dataplane/{id}/execute"),
            Some(a),
            Some(json!({"command": "echo kept > /root/k"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, v) = e
        .call(
            Method::POST,
            "/api/v2/sandboxes/boxes/box-one/stop",
            Some(a),
            None,
        )
        .await;
    assert_eq!(
        (s, v["status"].as_str()),
        (StatusCode::OK, Some("stopped")),
        "{v}"
    );
    assert!(v["stopped_at"].is_string());
    let (_, v) = e
        .call(
            Method::GET,
            "/api/v2/sandboxes/boxes/box-one/status",
            Some(a),
            None,
        )
        .await;
    assert_eq!(v["status"], "stopped");
    // Resources changed while stopped apply at the next start.
    let (s, v) = e
        .call(
            Method::PATCH,
            "/api/v2/sandboxes/boxes/box-one",
            Some(a),
            Some(json!({"fs_capacity_bytes": 1u64 << 30, "mem_bytes": 3u64 << 30})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    // A data-plane request wakes the stopped sandbox.
    let (s, v) = e
        .call(
            Method::POST,
            &format!("/dataplane/{id}/execute"),
            Some(a),
            Some(json!({"command": "cat /root/k"})),
        )
        .await;
    assert_eq!(
        (s, v["stdout"].as_str()),
        (StatusCode::OK, Some("kept\n")),
        "{v}"
    );
    let (_, v) = e
        .call(
            Method::POST,
            &format!("/dataplane/{id}/execute"),
            Some(a),
            Some(json!({"command": "df -k / | tail -1 | awk '{print $2}'; awk '/MemTotal/ {print $2}' /proc/meminfo"})),
        )
        .await;
    let nums: Vec<u64> = v["stdout"]
        .as_str()
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|n| n.parse().ok())
        .collect();
    assert!(
        nums.len() == 2 && nums[0] > 900_000 && nums[1] > 2_900_000,
        "disk and memory after the PATCH and a start: {v}"
    );
    let (s, _) = e
        .call(
            Method::DELETE,
            "/api/v2/sandboxes/boxes/box-one",
            Some(a),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _) = e
        .call(
            Method::GET,
            "/api/v2/sandboxes/boxes/box-one",
            Some(a),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _, _) = e.fetch(Method::GET, &link, "", &[]).await;
    assert_eq!(
        s,
        StatusCode::NOT_FOUND,
        "deleting the sandbox revokes its links"
    );
    let (s, _) = e
        .call(
            Method::DELETE,
            "/api/v2/sandboxes/boxes/box-two",
            Some(a),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);

    // Quotas (workspace of two sandboxes and one vCPU): CPU counts live
    // sandboxes only, the count every sandbox; a start is checked too.
    let small = e.small.as_str();
    let create_small = |wait: bool| {
        e.create(
            small,
            json!({"snapshot": "busybox", "vcpus": 1, "wait_for_ready": wait}),
        )
    };
    let (s, a1) = create_small(true).await;
    assert_eq!(s, StatusCode::CREATED, "{a1}");
    let first = a1["name"].as_str().unwrap().to_owned();
    let (s, v) = create_small(false).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert!(
        v["detail"]["message"].as_str().unwrap().contains("cpu"),
        "{v}"
    );
    let box_url = |name: &str, action: &str| format!("/api/v2/sandboxes/boxes/{name}{action}");
    let (s, v) = e
        .call(Method::POST, &box_url(&first, "/stop"), Some(small), None)
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = create_small(false).await;
    assert_eq!(
        s,
        StatusCode::CREATED,
        "a stopped sandbox holds no CPU: {v}"
    );
    let second = v["name"].as_str().unwrap().to_owned();
    let (s, v) = create_small(false).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert!(
        v["detail"]["message"].as_str().unwrap().contains("sandbox"),
        "{v}"
    );
    let (s, v) = e
        .call(Method::POST, &box_url(&first, "/start"), Some(small), None)
        .await;
    assert_eq!(
        s,
        StatusCode::TOO_MANY_REQUESTS,
        "starting must respect the CPU quota: {v}"
    );
    let (_, v) = e
        .call(Method::GET, &box_url(&first, ""), Some(small), None)
        .await;
    assert_eq!(
        v["status"], "stopped",
        "a refused start changes nothing: {v}"
    );
    for name in [&first, &second] {
        let (s, _) = e
            .call(Method::DELETE, &box_url(name, ""), Some(small), None)
            .await;
        assert_eq!(s, StatusCode::NO_CONTENT);
    }

    // Snapshots, read side.
    let (s, v) = e
        .call(Method::GET, "/api/v2/sandboxes/snapshots", Some(a), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        v["snapshots"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["name"] == "busybox"),
        "{v}"
    );
    let (s, v) = e
        .call(
            Method::GET,
            "/api/v2/sandboxes/snapshots/busybox:latest",
            Some(a),
            None,
        )
        .await;
    assert_eq!((s, v["status"].as_str()), (StatusCode::OK, Some("ready")));
    let sid = v["id"].as_str().unwrap().to_owned();
    let (s, v) = e
        .call(
            Method::GET,
            &format!("/api/v2/sandboxes/snapshots/{sid}"),
            Some(a),
            None,
        )
        .await;
    assert_eq!((s, v["name"].as_str()), (StatusCode::OK, Some("busybox")));
    let (s, v) = e
        .call(
            Method::GET,
            "/api/v2/sandboxes/snapshots-by-name/busybox",
            Some(a),
            None,
        )
        .await;
    assert_eq!(
        (s, v["tags"][0]["tag"].as_str()),
        (StatusCode::OK, Some("latest")),
        "{v}"
    );
    let (s, _) = e
        .call(
            Method::GET,
            "/api/v2/sandboxes/snapshots/none:such",
            Some(a),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn no_ready_host_is_503_and_writes_nothing() {
    let url = hearth_db::testing::sqlite_url();
    let e = env(&url.url, Vec::new()).await;
    let (s, v) = e.create(&e.admin, json!({"snapshot": "busybox"})).await;
    assert_eq!(
        (s, error_of(&v)),
        (StatusCode::SERVICE_UNAVAILABLE, "NoSandboxHostsAvailable"),
        "{v}"
    );
    let (_, v) = e
        .call(Method::GET, "/api/v2/sandboxes/boxes", Some(&e.admin), None)
        .await;
    assert_eq!(
        v["items"].as_array().unwrap().len(),
        0,
        "a refused create leaves no record"
    );
    let (s, _) = e.call(Method::GET, "/readyz", None, None).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    let (s, _) = e.call(Method::GET, "/healthz", None, None).await;
    assert_eq!(s, StatusCode::OK);
}

/// Security review (issue 16), finding 3: a callback URL naming the
/// control plane itself, the metadata address or a private network is a 422
/// on `proxy_config.callbacks[i].url` at create and PATCH (before anything
/// is looked up or stored); a public name passes on to placement.
#[tokio::test]
async fn finding3_callback_to_private_address_is_422_at_create_and_patch() {
    let url = hearth_db::testing::sqlite_url();
    let e = env(&url.url, Vec::new()).await;
    let cb = |url: &str| {
        json!({"proxy_config": {"callbacks": [
            {"match_hosts": ["api.example"], "url": "https://hooks.example.com/", "ttl_seconds": 60},
            {"match_hosts": ["api.example"], "url": url, "ttl_seconds": 60},
        ]}})
    };
    for bad in [
        "http://127.0.0.1:8080/api/v2/sandboxes/boxes",
        "http://localhost:8080/",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.1.2.3/",
        "http://[::ffff:127.0.0.1]/",
    ] {
        let mut body = cb(bad);
        body["snapshot"] = json!("busybox");
        let (s, v) = e.create(&e.admin, body).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {v}");
        assert_eq!(
            v["detail"][0]["loc"],
            json!(["body", "proxy_config", "callbacks", 1, "url"]),
            "{bad}: {v}"
        );
        assert!(
            v["detail"][0]["msg"]
                .as_str()
                .is_some_and(|m| m.contains("proxy_config.callbacks[1].url")),
            "{bad}: {v}"
        );
        let (s, v) = e
            .call(
                Method::PATCH,
                "/api/v2/sandboxes/boxes/ghost",
                Some(&e.admin),
                Some(cb(bad)),
            )
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "PATCH {bad}: {v}");
        assert_eq!(validation_field(&v), "url", "PATCH {bad}: {v}");
    }
    let mut body = cb("https://hooks.example.com/other");
    body["snapshot"] = json!("busybox");
    let (s, v) = e.create(&e.admin, body).await;
    assert_eq!(
        s,
        StatusCode::SERVICE_UNAVAILABLE,
        "a public callback passes: {v}"
    );
}

/// `idle_ttl_seconds` stops an idle sandbox (activity resets the clock) and
/// `delete_after_stop_seconds` deletes a stopped one. The reaper is run with
/// the clock moved forward instead of waiting minutes. Reaping is the
/// control plane's decision: the host is simulated (`SimHost`), and its VM
/// is checked stopped, then gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reapers_stop_idle_and_delete_long_stopped_sandboxes() {
    use std::time::Duration;
    let url = hearth_db::testing::sqlite_url();
    let sim = Arc::new(hearth_hostapi::SimHost::new());
    let e = env(&url.url, vec![simulated(sim.clone())]).await;
    let (s, sb) = e
        .create(
            &e.admin,
            json!({"name": "idle", "snapshot": "busybox", "mem_bytes": 2u64 << 30, "idle_ttl_seconds": 60,
                   "delete_after_stop_seconds": 600, "wait_for_ready": true, "timeout": 120}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{sb}");
    let id = sb["id"].as_str().unwrap().to_owned();
    let status = |v: &Value| v["status"].as_str().unwrap_or("").to_owned();
    let now = hearth_db::Timestamp::now();

    // 30 s on: not idle long enough.
    e.control.reap_at(now.plus(Duration::from_secs(30))).await;
    let (_, v) = e
        .call(
            Method::GET,
            "/api/v2/sandboxes/boxes/idle",
            Some(&e.admin),
            None,
        )
        .await;
    assert_eq!(status(&v), "ready");
    // Activity 10 s later (recorded: it is past the 5 s granularity)...
    tokio::time::sleep(Duration::from_millis(5_100)).await;
    let (s, _) = e
        .call(
            Method::POST,
            &format!("/dataplane/{id}/execute"),
            Some(&e.admin),
            Some(json!({"command": "true"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    // ...so 62 s after creation it is still within 60 s of the last activity.
    e.control.reap_at(now.plus(Duration::from_secs(62))).await;
    let (_, v) = e
        .call(
            Method::GET,
            "/api/v2/sandboxes/boxes/idle",
            Some(&e.admin),
            None,
        )
        .await;
    assert_eq!(status(&v), "ready", "activity resets the idle clock");
    // Well past the idle timeout: stopped.
    e.control.reap_at(now.plus(Duration::from_secs(200))).await;
    let (_, v) = e
        .call(
            Method::GET,
            "/api/v2/sandboxes/boxes/idle",
            Some(&e.admin),
            None,
        )
        .await;
    assert_eq!(status(&v), "stopped", "{v}");
    let vm = hearth_types::VmId::from(id.parse::<uuid::Uuid>().unwrap());
    assert_eq!(
        sim.vm(vm).map(|r| r.state),
        Some(hearth_hostapi::VmState::Stopped),
        "the host stopped the VM"
    );
    // Past delete_after_stop: gone.
    e.control
        .reap_at(hearth_db::Timestamp::now().plus(Duration::from_secs(601)))
        .await;
    let (s, _) = e
        .call(
            Method::GET,
            "/api/v2/sandboxes/boxes/idle",
            Some(&e.admin),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(sim.vm(vm).is_none(), "the host forgot the VM");
}

/// Finding 1: the link key sat in the database in the clear, so a copy of
/// the database forged links. It is now sealed under a master key that is
/// not in the database, and a control plane with the wrong master key
/// refuses to start rather than mint or accept anything.
#[tokio::test]
async fn finding1_link_key_is_sealed_and_a_wrong_master_key_fails_closed() {
    let dir = std::env::temp_dir().join(format!("hearth-mk-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.join("h.db").display());
    let db = Db::connect(&url).await.unwrap();
    let key = hearth_control::secrets::MasterKey::ephemeral();
    let cfg = ControlConfig {
        master_key: key.clone(),
        ..ControlConfig::default()
    };
    drop(
        Control::open(db.clone(), cfg.clone(), Vec::new())
            .await
            .unwrap(),
    );
    let stored = db
        .secret_or_init("download-links.v2", "unused")
        .await
        .unwrap();
    assert!(stored.starts_with("hs1:"), "{stored}");
    // The same key opens it again; another fails closed.
    drop(Control::open(db.clone(), cfg, Vec::new()).await.unwrap());
    let wrong = Control::open(db.clone(), ControlConfig::default(), Vec::new()).await;
    assert!(
        matches!(
            wrong,
            Err(hearth_control::error::OpenError::Secret(
                hearth_control::secrets::SecretError::Open { .. }
            ))
        ),
        "{:?}",
        wrong.err()
    );
    db.close().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The tests here boot real microVMs (`scripts/test-fast` skips `vm::`).
mod vm {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn public_api_on_sqlite() {
        public_api(hearth_db::testing::sqlite_url()).await;
    }

    /// The same on PostgreSQL (skipped, loudly, without a server unless
    /// `HEARTH_REQUIRE_POSTGRES=1`); a test of its own so the two run side
    /// by side.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn public_api_on_postgres() {
        if let Some(url) = hearth_db::testing::postgres_url().await {
            public_api(url).await;
        }
    }

    async fn public_api(url: hearth_db::testing::TestUrl) {
        let e = env(&url.url, vec![local(host().await)]).await;
        validation_and_errors(&e).await;
        lifecycle(&e).await;
        // Nothing left running on the host for this database.
        e.control.reap_once().await;
    }

    /// A server shutting down closes exec WebSockets with 1001, so the SDK
    /// reconnects instead of reporting a failure.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_closes_exec_sockets_with_1001() {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
        use tokio_tungstenite::tungstenite::Message;

        let url = hearth_db::testing::sqlite_url();
        let e = env(&url.url, vec![local(host().await)]).await;
        let (s, sb) = e
            .create(&e.admin, json!({"snapshot": "busybox", "mem_bytes": 2u64 << 30, "wait_for_ready": true, "timeout": 120}))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{sb}");
        let id = sb["id"].as_str().unwrap().to_owned();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(hearth_control::serve(e.control.clone(), listener, async {
            let _ = stop_rx.await;
        }));
        let mut req =
            tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
                format!("ws://{addr}/dataplane/{id}/execute/ws"),
            )
            .unwrap();
        req.headers_mut()
            .insert("x-api-key", e.admin.parse().unwrap());
        let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
        let frame = json!({"type": "execute", "command": "echo up; sleep 30", "command_id": "f".repeat(32)});
        ws.send(Message::Text(frame.to_string().into()))
            .await
            .unwrap();
        // started, then the first output.
        let mut seen_output = false;
        while !seen_output {
            if let Some(Ok(Message::Text(t))) = ws.next().await {
                seen_output = t.contains("\"stdout\"");
            }
        }
        stop_tx.send(()).unwrap();
        let close = loop {
            match tokio::time::timeout(std::time::Duration::from_secs(10), ws.next())
                .await
                .unwrap()
            {
                Some(Ok(Message::Close(frame))) => break frame,
                Some(Ok(_)) => continue,
                other => panic!("expected a close frame, got {other:?}"),
            }
        };
        assert_eq!(close.map(|f| f.code), Some(CloseCode::Away));
        let _ = server.await;
        e.control.stop_all().await;
    }

    /// Host loss: the host agent dies with its VMs; a new one starts on the same
    /// data directory. Running sandboxes become `stopped` and the next
    /// data-plane request cold boots them from their persisted disks.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_host_loss_sandboxes_cold_boot_from_their_disks() {
        let shared = shared_dir();
        let data = shared
            .join("hosts")
            .join(uuid::Uuid::now_v7().simple().to_string());
        std::fs::create_dir_all(&data).unwrap();
        std::os::unix::fs::symlink(shared.join("artifacts"), data.join("artifacts")).unwrap();
        let mut hcfg = HostConfig::new(&data);
        hcfg.accel_cache = shared.join("accel.json");
        let host_id = HostId::new();
        let host1 = Host::start(hcfg.clone(), Arc::new(hearth_image::QuietProgress))
            .await
            .unwrap();
        let url = hearth_db::testing::sqlite_url();
        let mk = |host: Arc<Host>| LocalHost {
            id: host_id,
            host: Arc::new(hearth_host::InProcessHost::new(host)),
            capacity_cpu: MilliCpu(64_000),
            capacity_mem: ByteSize::gib(256),
            store_url: String::new(),
        };
        let e = env(&url.url, vec![mk(host1.clone())]).await;
        let (s, sb) = e
            .create(&e.admin, json!({"name": "survivor", "snapshot": "busybox", "mem_bytes": 2u64 << 30, "wait_for_ready": true, "timeout": 120}))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{sb}");
        let id = sb["id"].as_str().unwrap().to_owned();
        let (s, _) = e
            .call(
                Method::POST,
                &format!("/dataplane/{id}/execute"),
                Some(&e.admin),
                Some(json!({"command": "echo persisted > /root/p; sync"})),
            )
            .await;
        assert_eq!(s, StatusCode::OK);

        // The host makes its template of this shape beside the first
        // create, on a task holding the host: a real agent's death ends
        // that task with it, this one must end before the host is gone.
        let made = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
        while host1.template_usage().count == 0 && tokio::time::Instant::now() < made {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        // The host dies: its VMM is killed outright (no graceful stop).
        let vm = host1
            .get(hearth_types::VmId::from(id.parse::<uuid::Uuid>().unwrap()))
            .unwrap();
        let pid = vm.record().pid.unwrap();
        // SAFETY: signalling the QEMU process this test's host started.
        unsafe {
            libc::kill(pid as i32, libc::SIGKILL);
        }
        // In this process the dead host's tasks outlive it: its VM watcher
        // still releases the disk and removes the run directory it sees die.
        // A real host agent dies with its tasks, so the new one must not start
        // on the same directory until that reaction is over (else the old
        // watcher removes the new VMM's run directory and races its disk).
        let gone = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        while !vm.state().is_terminal() {
            assert!(
                tokio::time::Instant::now() < gone,
                "the killed vm was never seen dead: {:?}",
                vm.record()
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        drop(vm);
        // The restarted control plane has the same master key (it seals the
        // link key in the database; another key would fail closed).
        let master_key = e.cfg.master_key.clone();
        drop(e);
        drop(host1);

        // A new host agent and control plane on the same data and database.
        let host2 = Host::start(hcfg, Arc::new(hearth_image::QuietProgress))
            .await
            .unwrap();
        let db = Db::connect(&url.url).await.unwrap();
        let cfg = ControlConfig {
            master_key,
            ..crate::harness::test_config()
        };
        let control = Control::open(db.clone(), cfg, vec![mk(host2)])
            .await
            .unwrap();
        let row = db.get_sandbox_by_id(id.parse().unwrap()).await.unwrap();
        assert_eq!(
            row.status,
            hearth_db::SandboxStatus::Stopped,
            "{:?}",
            row.status_message
        );
        // The next request wakes it from its disk.
        let app = hearth_control::router(control.clone());
        let key = {
            let ws = row.workspace_id;
            key(&db, ws, &["*"]).await
        };
        let req = Request::builder()
            .method(Method::POST)
            .uri(format!("/dataplane/{id}/execute"))
            .header("x-api-key", &key)
            .body(Body::from(json!({"command": "cat /root/p"}).to_string()))
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        if status != StatusCode::OK {
            let row = db.get_sandbox_by_id(id.parse().unwrap()).await.unwrap();
            eprintln!("sandbox {:?}: {:?}", row.status, row.status_message);
        }
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["stdout"], "persisted\n", "{v}");
        control.stop_all().await;
    }
}
