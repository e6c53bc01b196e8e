//! Never a silent yes, over the SDK's whole parameter surface.
//!
//! `tests/sdk/surface.py` walks the request types the langsmith SDK is
//! generated from (create, update, capture, create-snapshot, the two lists,
//! service and download URLs, nested proxy rules, callbacks, mounts,
//! volumes) and gives every field, nested ones included, with a body that
//! holds it. Here each one must either act or be refused:
//!
//! - **acts**: it appears in one of the exercise requests below, which
//!   succeed, and whose reads report what was sent where the resource has
//!   it (the effect itself is proved by the suites that use each field:
//!   `hearth-cli/tests/cli/vm/sdk.rs`, `network.rs`, `hearth-egress/tests/proxy.rs`);
//! - **refused**: its body is a 422 in LangSmith's envelope whose location
//!   is the field or the part of it Hearth refuses, saying it is not
//!   supported (or unknown).
//!
//! What `openapi.json` says of each field agrees: a refused field it
//! describes says it is refused, and one that acts is not described as
//! refused or ignored.
//!
//! A field a new SDK adds lands in neither and is refused by the parser (a
//! field Hearth does not know is a 422): this test then still passes, and
//! only a field made to act must be added to an exercise. On a simulated
//! host (`SimHost`), SQLite.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use hearth_db::{Db, Quotas};
use hearth_hostapi::SimHost;
use serde_json::{json, Value};

use crate::harness;

#[path = "../../../../tests/sdk/python.rs"]
pub(crate) mod python;

const GIB: u64 = 1 << 30;

struct Env {
    app: Router,
    key: String,
    _host: Arc<SimHost>,
    _db: hearth_db::testing::TestUrl,
}

async fn env() -> Env {
    let url = hearth_db::testing::sqlite_url();
    let db = Db::connect(&url.url).await.unwrap();
    let (_, key) = crate::harness::workspace_key(&db, "surface", Quotas::default()).await;
    // The operator gave its hosts an AWS identity: role rules act.
    // A signing key, as `hearth up` has: login-mode service URLs act.
    let signer = hearth_fence::Signer::new(
        hearth_fence::KeyPair::generate().unwrap(),
        std::time::Duration::from_secs(60),
    );
    let cfg = hearth_control::ControlConfig {
        aws_roles: true,
        signer: Some(Arc::new(signer)),
        ..harness::test_config()
    };
    let (control, host) = harness::sim_control_with(db, cfg).await;
    Env {
        app: hearth_control::router(control),
        key,
        _host: host,
        _db: url,
    }
}

impl Env {
    async fn call(&self, method: Method, path: &str, body: Option<&Value>) -> (StatusCode, Value) {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("x-api-key", &self.key)
            .header("content-type", "application/json")
            .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
            .unwrap();
        crate::harness::oneshot_json(&self.app, req).await
    }

    /// Sends `op` with `body` (a JSON body, or for lists the query's
    /// parameters).
    async fn send(&self, op: &str, body: &Value) -> (StatusCode, Value) {
        const BOX: &str = "/api/v2/sandboxes/boxes/surface-box";
        match op {
            "create" => {
                self.call(Method::POST, "/api/v2/sandboxes/boxes", Some(body))
                    .await
            }
            "update" => self.call(Method::PATCH, BOX, Some(body)).await,
            "capture" => {
                self.call(Method::POST, &format!("{BOX}/snapshot"), Some(body))
                    .await
            }
            "create_snapshot" => {
                self.call(Method::POST, "/api/v2/sandboxes/snapshots", Some(body))
                    .await
            }
            "service_url" => {
                self.call(Method::POST, &format!("{BOX}/service-url"), Some(body))
                    .await
            }
            "download_url" => {
                self.call(Method::POST, &format!("{BOX}/download-url"), Some(body))
                    .await
            }
            "list_sandboxes" => {
                self.call(
                    Method::GET,
                    &format!("/api/v2/sandboxes/boxes?{}", query(body)),
                    None,
                )
                .await
            }
            "list_snapshots" => {
                self.call(
                    Method::GET,
                    &format!("/api/v2/sandboxes/snapshots?{}", query(body)),
                    None,
                )
                .await
            }
            "create_registry" => {
                self.call(Method::POST, "/api/v2/sandboxes/registries", Some(body))
                    .await
            }
            "update_registry" => {
                self.call(
                    Method::PATCH,
                    "/api/v2/sandboxes/registries/surface-reg",
                    Some(body),
                )
                .await
            }
            "list_registries" => {
                self.call(
                    Method::GET,
                    &format!("/api/v2/sandboxes/registries?{}", query(body)),
                    None,
                )
                .await
            }
            "create_volume" => {
                self.call(Method::POST, "/api/v2/sandboxes/volumes", Some(body))
                    .await
            }
            "batch_delete" => {
                self.call(
                    Method::POST,
                    "/api/v2/sandboxes/boxes/batch-delete",
                    Some(body),
                )
                .await
            }
            "update_volume" => {
                self.call(
                    Method::PATCH,
                    "/api/v2/sandboxes/volumes/surface-vol",
                    Some(body),
                )
                .await
            }
            "clone_volume" => {
                self.call(
                    Method::POST,
                    "/api/v2/sandboxes/volumes/surface-vol/clone",
                    Some(body),
                )
                .await
            }
            "list_volumes" => {
                self.call(
                    Method::GET,
                    &format!("/api/v2/sandboxes/volumes?{}", query(body)),
                    None,
                )
                .await
            }
            other => panic!("unknown operation {other}"),
        }
    }
}

/// A query string from an object (arrays repeat the key).
fn query(params: &Value) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    for (k, v) in params.as_object().expect("query parameters") {
        let values = match v {
            Value::Array(a) => a.clone(),
            v => vec![v.clone()],
        };
        for v in values {
            let s = match v {
                Value::String(s) => s,
                v => v.to_string(),
            };
            q.append_pair(k, &s);
        }
    }
    q.finish()
}

/// Every field path in `v` (`a.b[].c`), containers included.
pub(crate) fn paths(v: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(o) => {
            for (k, child) in o {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                out.insert(p.clone());
                paths(child, &p, out);
            }
        }
        Value::Array(a) => {
            for child in a {
                paths(child, &format!("{prefix}[]"), out);
            }
        }
        _ => {}
    }
}

/// A 422's location as a field path (`proxy_config.rules[].aws`), and its
/// message, from LangSmith's validation envelope.
fn refusal(v: &Value) -> Option<(String, String)> {
    let d = v["detail"].get(0)?;
    let mut path = String::new();
    for seg in d["loc"].as_array()?.iter().skip(1) {
        match seg {
            Value::String(s) => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(s);
            }
            Value::Number(_) => path.push_str("[]"),
            _ => return None,
        }
    }
    Some((path, d["msg"].as_str()?.to_owned()))
}

fn rule(name: &str) -> Value {
    json!({
        "name": name, "type": "headers", "enabled": true, "description": "reach the test API",
        "match_hosts": ["api.test"], "match_paths": ["/v1/*"],
        "match_headers": ["x-tenant: blue"],
        "headers": [
            {"name": "X-Plain", "type": "plaintext", "value": "p"},
            {"name": "Authorization", "type": "opaque", "value": "Bearer s"},
        ],
        "env_vars": {"API_TOKEN": "dummy"},
    })
}

/// An `aws` rule (the SDK's `aws_auth`): the proxy re-signs with its keys.
fn aws_rule() -> Value {
    json!({
        "name": "aws", "type": "aws", "enabled": true,
        "aws": {
            "access_key_id": {"type": "opaque", "value": "AKIASURFACE"},
            "secret_access_key": {"type": "opaque", "value": "surface-secret"},
        },
    })
}

/// A service account key's JSON with a fresh RSA key (`openssl`), which a
/// GCP rule must hold to be accepted.
fn service_account() -> String {
    static KEY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    KEY.get_or_init(|| {
        let out = std::process::Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
            ])
            .output()
            .expect("openssl");
        assert!(out.status.success());
        json!({
            "type": "service_account", "client_email": "surface@p.iam.gserviceaccount.com",
            "private_key": String::from_utf8(out.stdout).unwrap(),
            "token_uri": "https://oauth2.googleapis.com/token",
        })
        .to_string()
    })
    .clone()
}

fn proxy_config() -> Value {
    json!({
        "description": "what the sandbox may reach",
        "rules": [rule("api"), aws_rule(), {
            "name": "aws-role", "type": "aws", "match_hosts": ["s3.example.com"],
            "aws": {"role_arn": "arn:aws:iam::123456789012:role/reader", "session_tags": {"team": "a"}},
        }, {
            "name": "gateway", "match_hosts": ["llm.test"],
            "headers": [{"name": "X-Gateway-Key", "type": "opaque", "value": "g"}],
            "rewrite": {"host": "gateway.test", "port": 8443, "credentials": "redact"},
        }, {
            "name": "gcp", "type": "gcp", "match_hosts": ["storage.googleapis.com"],
            "gcp": {
                "service_account_json": {"type": "opaque", "value": service_account()},
                "scopes": ["https://www.googleapis.com/auth/devstorage.read_only"],
            },
        }],
        "callbacks": [{
            "match_hosts": ["cb.test"], "url": "https://callback.test/hook", "ttl_seconds": 60,
            "full_request": true,
            "request_headers": [{"name": "X-Key", "type": "opaque", "value": "k"}],
        }],
        "access_control": {"allow_list": ["api.test", "cb.test"]},
    })
}

/// Requests that use every field Hearth acts on, per operation, in order.
fn exercises() -> Vec<(&'static str, Value)> {
    let run_config = json!({"user": "root", "work_dir": "/tmp", "env_vars": {"A": "1"}});
    vec![
        (
            "create_volume",
            json!({"name": "surface-vol", "size_bytes": GIB / 2, "description": "data",
                   "labels": {"team": "a"}}),
        ),
        (
            "create_volume",
            json!({"name": "surface-vol2", "size_bytes": GIB}),
        ),
        (
            "update_volume",
            json!({"description": "datasets", "labels": {"team": "b"}}),
        ),
        (
            "clone_volume",
            json!({"name": "surface-clone", "description": "copy", "labels": {"team": "c"}}),
        ),
        (
            "list_volumes",
            json!({"name_contains": "SURFACE", "page_size": 1, "cursor": "$VOLUME_CURSOR"}),
        ),
        (
            "create",
            json!({"name": "surface-vol-box", "snapshot": "busybox", "volumes": [
                {"volume": "surface-vol", "mount_path": "/mnt/data"},
                {"volume": "surface-vol2", "mount_path": "/mnt/ro", "read_only": true},
            ]}),
        ),
        (
            "create",
            json!({
                "name": "surface-box", "snapshot": "busybox", "restore_memory": false,
                "cpu_millicores": 1000, "mem_bytes": 4 * GIB, "fs_capacity_bytes": 2 * GIB,
                "idle_ttl_seconds": 600, "delete_after_stop_seconds": 3600,
                "persistent": true, "preserve_memory_on_stop": true,
                "env_vars": {"B": "2"}, "labels": {"team": "a"}, "run_config": run_config,
                "proxy_config": proxy_config(),
                "access_delegation": {"mode": "EXPLICIT", "permissions": ["sandboxes:read"]},
            }),
        ),
        (
            "create",
            json!({"name": "surface-two", "snapshot_name": "busybox", "vcpus": 1,
                   "proxy_config": {"access_control": {"deny_list": ["evil.test"]}}}),
        ),
        (
            "create",
            json!({"name": "surface-three", "snapshot_id": "$BUSYBOX_ID"}),
        ),
        (
            "create",
            json!({"name": "surface-git", "snapshot": "busybox", "mount_config": {
                "auth": {},
                "mounts": [{"id": "repo", "type": "git", "mount_path": "/mnt/repo", "git": {
                    "remote_url": "https://git.test/repo.git",
                    "ref": {"type": "branch", "name": "main"},
                    "refresh_interval_seconds": 60,
                }}],
            }}),
        ),
        (
            "create",
            json!({"name": "surface-buckets", "snapshot": "busybox", "mount_config": {
                "auth": {
                    "aws": {
                        "access_key_id": {"type": "opaque", "value": "AKIAMOUNT"},
                        "secret_access_key": {"type": "opaque", "value": "mount-secret"},
                    },
                    "gcp": {"service_account_json": {"type": "opaque", "value": service_account()}},
                },
                "mounts": [{
                    "id": "data", "type": "s3", "mount_path": "/mnt/data", "read_only": true,
                    "cache": {"max_size_bytes": 1 << 30},
                    "encryption": {"kms_key": "arn:aws:kms:us-east-1:123456789012:key/k"},
                    "s3": {"endpoint_url": "https://s3.example.com", "region": "us-east-1",
                           "bucket": "surface-data", "prefix": "in", "path_style": true},
                }, {
                    "id": "media", "type": "gcs", "mount_path": "/mnt/media",
                    "cache": {"writeback_seconds": 10},
                    "gcs": {"bucket": "surface-media", "prefix": "p"},
                }],
            }}),
        ),
        (
            "create",
            json!({"name": "surface-role", "snapshot": "busybox", "mount_config": {
                "auth": {"aws": {"role_arn": "arn:aws:iam::123456789012:role/reader"}},
                "mounts": [{"id": "data", "type": "s3", "mount_path": "/mnt/data",
                            "s3": {"endpoint_url": "https://s3.amazonaws.com", "region": "eu-west-1",
                                   "bucket": "surface-data"}}],
            }}),
        ),
        (
            "update",
            json!({
                "name": "surface-box", "idle_ttl_seconds": 1200, "delete_after_stop_seconds": 7200,
                "cpu_millicores": 2000, "mem_bytes": 8 * GIB, "fs_capacity_bytes": 3 * GIB,
                "run_config": {"user": "root", "work_dir": "/root", "env_vars": {"C": "3"}},
                "proxy_config": proxy_config(),
            }),
        ),
        (
            "update",
            json!({"vcpus": 2, "proxy_config": {"rules": [{
                "name": "api", "match_hosts": ["api.test"],
                "headers": [{"name": "Authorization", "type": "opaque", "is_set": true}],
            }, {
                "name": "aws", "type": "aws",
                "aws": {"access_key_id": {"type": "opaque", "is_set": true},
                        "secret_access_key": {"type": "opaque", "is_set": true}},
            }]}}),
        ),
        (
            "update",
            json!({"proxy_config": {"access_control": {"deny_list": ["evil.test"]}}}),
        ),
        (
            "capture",
            json!({"name": "surface-snap", "tag": "v1", "include_memory": false,
                   "fs_capacity_bytes": 4 * GIB, "run_config": run_config,
                   "labels": {"kind": "captured"}, "description": "captured by the guard"}),
        ),
        (
            "capture",
            json!({"name": "surface-image", "docker_image": "langsmith-snapshot-build:x",
                   "fs_capacity_bytes": GIB}),
        ),
        (
            "create_registry",
            json!({"name": "surface-reg", "url": "https://registry.test", "auth_type": "DOCKER_CONFIG",
                   "username": "robot", "password": "first"}),
        ),
        (
            "create_registry",
            json!({"name": "surface-reg2", "url": "ghcr.io"}),
        ),
        (
            "update_registry",
            json!({"name": "surface-reg", "url": "registry.test", "auth_type": "DOCKER_CONFIG",
                   "username": "robot2", "password": "second"}),
        ),
        (
            "list_registries",
            json!({"name_contains": "SURFACE", "page_size": 1, "cursor": "$REGISTRY_CURSOR"}),
        ),
        ("list_registries", json!({"limit": 1, "offset": 1})),
        (
            "create_snapshot",
            json!({"name": "surface-private", "docker_image": "registry.test/team/app:v1",
                   "fs_capacity_bytes": GIB, "registry_id": "$REGISTRY_ID"}),
        ),
        (
            "create_snapshot",
            json!({"name": "surface-oci", "docker_image": "docker.io/library/busybox:latest",
                   "fs_capacity_bytes": GIB, "tag": "v1", "run_config": run_config,
                   "labels": {"kind": "oci"}, "description": "built by the guard"}),
        ),
        (
            "service_url",
            json!({"port": 8080, "expires_in_seconds": 600, "embed_origins": ["https://app.test"]}),
        ),
        (
            "service_url",
            json!({"port": 8081, "access": "restricted", "embed_origins": ["https://app.test"]}),
        ),
        (
            "download_url",
            json!({"path": "/etc/hostname", "expires_in_seconds": 600,
                   "content_type": "text/plain", "content_disposition": "inline"}),
        ),
        (
            "list_sandboxes",
            json!({"created_by": "me", "label": "team=a", "name_contains": "surface",
                   "status": "ready", "sort_by": "name", "sort_order": "asc", "page_size": 10}),
        ),
        (
            "list_sandboxes",
            json!({"sort_direction": "desc", "limit": 1, "offset": 1}),
        ),
        (
            "list_sandboxes",
            json!({"page_size": 1, "cursor": "$CURSOR"}),
        ),
        (
            "list_snapshots",
            json!({"name_contains": "busy", "status": "ready", "page_size": 1, "cursor": "$SNAPSHOT_CURSOR"}),
        ),
        ("list_snapshots", json!({"limit": 1, "offset": 1})),
        (
            "batch_delete",
            json!({"names": ["surface-three", "surface-never-made"]}),
        ),
    ]
}

/// Fills the placeholders an exercise needs from the server.
async fn resolve(e: &Env, v: &mut Value) {
    match v {
        Value::Object(o) => {
            for child in o.values_mut() {
                Box::pin(resolve(e, child)).await;
            }
        }
        Value::String(s) if s == "$BUSYBOX_ID" => {
            let (_, snap) = e
                .call(Method::GET, "/api/v2/sandboxes/snapshots/busybox", None)
                .await;
            *s = snap["id"].as_str().expect("busybox snapshot").to_owned();
        }
        Value::String(s) if s == "$REGISTRY_ID" => {
            let (_, reg) = e
                .call(
                    Method::GET,
                    "/api/v2/sandboxes/registries/surface-reg",
                    None,
                )
                .await;
            *s = reg["id"].as_str().expect("surface-reg").to_owned();
        }
        Value::String(s) if s == "$REGISTRY_CURSOR" => {
            let (_, page) = e
                .call(
                    Method::GET,
                    "/api/v2/sandboxes/registries?page_size=1",
                    None,
                )
                .await;
            *s = page["next_cursor"]
                .as_str()
                .expect("a second page")
                .to_owned();
        }
        Value::String(s) if s == "$VOLUME_CURSOR" => {
            let (_, page) = e
                .call(Method::GET, "/api/v2/sandboxes/volumes?page_size=1", None)
                .await;
            *s = page["next_cursor"]
                .as_str()
                .expect("a second page")
                .to_owned();
        }
        Value::String(s) if s == "$CURSOR" => {
            let (_, page) = e
                .call(Method::GET, "/api/v2/sandboxes/boxes?page_size=1", None)
                .await;
            *s = page["next_cursor"]
                .as_str()
                .expect("a second page")
                .to_owned();
        }
        Value::String(s) if s == "$SNAPSHOT_CURSOR" => {
            let (_, page) = e
                .call(Method::GET, "/api/v2/sandboxes/snapshots?page_size=1", None)
                .await;
            *s = page["next_cursor"]
                .as_str()
                .expect("a second page")
                .to_owned();
        }
        _ => {}
    }
}

/// What a surface script (`tests/sdk/surface.py`, `tests/e2b/surface.py`,
/// relative to the repository) prints: (operation, field path, body).
pub(crate) fn surface(script: &str) -> Vec<(String, String, Value)> {
    let out = std::process::Command::new(python::sdk_python())
        .arg(format!("{}/../../{script}", env!("CARGO_MANIFEST_DIR")))
        .output()
        .unwrap_or_else(|e| panic!("run {script}: {e}"));
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (
                v["op"].as_str().unwrap().to_owned(),
                v["path"].as_str().unwrap().to_owned(),
                v["body"].clone(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sdk_field_acts_or_is_refused_naming_it() {
    let surface = surface("tests/sdk/surface.py");
    assert!(
        surface.len() >= 200,
        "the SDK's surface shrank to {} fields: is surface.py still finding its types?",
        surface.len()
    );

    let e = env().await;
    // What acts: every exercise succeeds.
    let mut acting: BTreeSet<(String, String)> = BTreeSet::new();
    for (op, mut body) in exercises() {
        resolve(&e, &mut body).await;
        let (status, v) = e.send(op, &body).await;
        assert!(status.is_success(), "exercise {op} {body}: {status} {v}");
        let mut p = BTreeSet::new();
        paths(&body, "", &mut p);
        acting.extend(p.into_iter().map(|p| (op.to_owned(), p)));
        if op == "create" && body["name"] == "surface-box" {
            // What the sandbox reports is what was asked.
            let (_, got) = e
                .call(Method::GET, "/api/v2/sandboxes/boxes/surface-box", None)
                .await;
            for k in [
                "cpu_millicores",
                "mem_bytes",
                "fs_capacity_bytes",
                "idle_ttl_seconds",
                "delete_after_stop_seconds",
                "persistent",
                "preserve_memory_on_stop",
                "run_config",
                "access_delegation",
            ] {
                assert_eq!(got[k], body[k], "create: {k} as read back");
            }
            assert_eq!(got["labels"]["team"], "a");
            assert_eq!(
                got["proxy_config"]["rules"][0]["match_paths"],
                json!(["/v1/*"])
            );
        }
    }

    // The private registry's credentials went with its pull, and only
    // with it; its id reads back on the snapshot. (Builds run in the
    // background: wait for them.)
    let snap = loop {
        let (_, snap) = e
            .call(
                Method::GET,
                "/api/v2/sandboxes/snapshots/surface-private:v1",
                None,
            )
            .await;
        if snap["status"] != "building" {
            break snap;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(snap["status"], "ready", "{snap}");
    let imports = e._host.imports();
    let auth = |reference: &str| {
        let i = imports.iter().find(|i| i.reference == reference).unwrap();
        i.auth
            .as_ref()
            .map(|a| (a.username.clone(), a.password.clone()))
    };
    assert_eq!(
        auth("registry.test/team/app:v1"),
        Some(("robot2".into(), "second".into()))
    );
    assert_eq!(auth("docker.io/library/busybox:latest"), None);
    let (_, reg) = e
        .call(
            Method::GET,
            "/api/v2/sandboxes/registries/surface-reg",
            None,
        )
        .await;
    assert_eq!(snap["registry_id"], reg["id"], "{snap}");
    assert!(!reg.to_string().contains("second"), "{reg}");

    // Everything else is refused, naming it.
    let (mut acts, mut refused) = (0, 0);
    let mut wrong = Vec::new();
    let doc = hearth_api::openapi();
    let mut misdocumented = Vec::new();
    let described = surface
        .iter()
        .filter(|(op, path, _)| documented(&doc, op, path).is_some())
        .count();
    // The walk finds the descriptions (152 of 332 fields when written).
    assert!(
        described >= 120,
        "openapi.json describes only {described} of the SDK's fields: does documented() still walk the document?"
    );
    for (op, path, body) in &surface {
        if acting.contains(&(op.clone(), path.clone())) {
            acts += 1;
            if let Some(said) = documented(&doc, op, path).filter(|d| says_refused(d)) {
                misdocumented.push(format!(
                    "{op} {path} acts, yet its description says: {said}"
                ));
            }
            continue;
        }
        let (status, v) = e.send(op, body).await;
        let named = refusal(&v).is_some_and(|(at, msg)| {
            let under = path == &at
                || path.starts_with(&format!("{at}."))
                || path.starts_with(&format!("{at}[]"));
            under && (msg.contains("not supported") || msg.contains("unknown"))
        });
        if status == StatusCode::UNPROCESSABLE_ENTITY && named {
            refused += 1;
            if let Some(said) = documented(&doc, op, path).filter(|d| !mentions_refusal(d)) {
                misdocumented.push(format!(
                    "{op} {path} is refused, yet its description does not say so: {said}"
                ));
            }
        } else {
            wrong.push(format!("{op} {path}: {body} -> {status} {v}"));
        }
    }
    println!(
        "{} SDK fields: {acts} act, {refused} refused with a 422 naming them; \
         openapi.json describes {described}",
        surface.len()
    );
    assert!(
        wrong.is_empty(),
        "{} fields neither act nor are refused naming them (a silent yes):\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert!(
        misdocumented.is_empty(),
        "openapi.json's descriptions disagree with what the code does:\n{}",
        misdocumented.join("\n")
    );
}

/// The request's schema (a body) or its parameters (a query) in the
/// OpenAPI document, by the route `Env::send` takes for `op`.
fn operation_of<'a>(doc: &'a Value, op: &str) -> (&'a Value, bool) {
    let (method, route) = match op {
        "create" => ("post", "/api/v2/sandboxes/boxes"),
        "update" => ("patch", "/api/v2/sandboxes/boxes/{name}"),
        "capture" => ("post", "/api/v2/sandboxes/boxes/{name}/snapshot"),
        "create_snapshot" => ("post", "/api/v2/sandboxes/snapshots"),
        "service_url" => ("post", "/api/v2/sandboxes/boxes/{name}/service-url"),
        "download_url" => ("post", "/api/v2/sandboxes/boxes/{name}/download-url"),
        "list_sandboxes" => ("get", "/api/v2/sandboxes/boxes"),
        "list_snapshots" => ("get", "/api/v2/sandboxes/snapshots"),
        "create_registry" => ("post", "/api/v2/sandboxes/registries"),
        "update_registry" => ("patch", "/api/v2/sandboxes/registries/{name}"),
        "list_registries" => ("get", "/api/v2/sandboxes/registries"),
        "create_volume" => ("post", "/api/v2/sandboxes/volumes"),
        "batch_delete" => ("post", "/api/v2/sandboxes/boxes/batch-delete"),
        "update_volume" => ("patch", "/api/v2/sandboxes/volumes/{volume}"),
        "clone_volume" => ("post", "/api/v2/sandboxes/volumes/{volume}/clone"),
        "list_volumes" => ("get", "/api/v2/sandboxes/volumes"),
        other => panic!("unknown operation {other}"),
    };
    let operation = &doc["paths"][route][method];
    assert!(
        operation.is_object(),
        "openapi.json has no {method} {route}"
    );
    if method == "get" {
        (&operation["parameters"], false)
    } else {
        (
            &operation["requestBody"]["content"]["application/json"]["schema"],
            true,
        )
    }
}

/// A schema with its `$ref` followed and, for a union (`oneOf` of null and
/// a type), the alternative that has fields or items.
fn schema_of<'a>(doc: &'a Value, mut v: &'a Value) -> &'a Value {
    for _ in 0..16 {
        if let Some(r) = v["$ref"].as_str() {
            let name = r.trim_start_matches("#/components/schemas/");
            v = &doc["components"]["schemas"][name];
            continue;
        }
        let alternatives = ["oneOf", "anyOf", "allOf"]
            .iter()
            .filter_map(|k| v[*k].as_array())
            .flatten()
            .find(|a| {
                a["$ref"].is_string() || a["properties"].is_object() || a["items"].is_object()
            });
        match alternatives {
            Some(a) => v = a,
            None => return v,
        }
    }
    v
}

/// What openapi.json says of the field at `path` (`proxy_config.rules[].aws`)
/// of `op`'s request: the field's own description, else its type's. None
/// when the document does not describe it (a field Hearth does not know).
fn documented(doc: &Value, op: &str, path: &str) -> Option<String> {
    let (root, body) = operation_of(doc, op);
    let mut segments = path.split('.');
    let first = segments.next()?;
    let mut node = if body {
        let name = first.trim_end_matches("[]");
        &schema_of(doc, root)["properties"][name]
    } else {
        let name = first.trim_end_matches("[]");
        let param = root.as_array()?.iter().find(|p| p["name"] == name)?;
        if path == first {
            return param["description"].as_str().map(str::to_owned);
        }
        &param["schema"]
    };
    let mut last = first;
    for seg in segments {
        let mut at = node;
        if last.ends_with("[]") {
            at = &schema_of(doc, at)["items"];
        }
        node = &schema_of(doc, at)["properties"][seg.trim_end_matches("[]")];
        last = seg;
    }
    if node.is_null() {
        return None;
    }
    node["description"]
        .as_str()
        .or_else(|| schema_of(doc, node)["description"].as_str())
        .map(str::to_owned)
}

/// A description that says the field as a whole is not served: it opens
/// by refusing it or calls it ignored.
fn says_refused(d: &str) -> bool {
    let first = d.split(". ").next().unwrap_or(d).to_ascii_lowercase();
    ["refused", "not supported", "rejected", "ignored"]
        .iter()
        .any(|w| first.starts_with(w))
        || first.contains("(not supported")
        || d.to_ascii_lowercase().contains("is ignored")
}

/// A description that says a refusal somewhere.
fn mentions_refusal(d: &str) -> bool {
    let d = d.to_ascii_lowercase();
    ["refused", "not supported", "rejected", "a 422"]
        .iter()
        .any(|w| d.contains(w))
}

/// The sandbox's egress as its host holds it: the allow list's patterns.
fn host_allow_list(host: &SimHost, id: &str) -> Vec<String> {
    let vm = hearth_types::VmId::from(id.parse::<uuid::Uuid>().unwrap());
    let net = host
        .network(vm)
        .expect("the host holds the sandbox's network");
    match crate::harness::policy_of(&net).access {
        Some(hearth_egress::Access::AllowList(list)) => {
            list.iter().map(|p| p.as_str().to_owned()).collect()
        }
        other => panic!("not an allow list: {other:?}"),
    }
}

/// A 200 on a PATCH of proxy_config means the sandbox's host has the new
/// policy: a stopped sandbox is refused (400 InvalidRequest, which the SDK
/// raises as SandboxNotReadyError), and a host that does not take it makes
/// the PATCH a 503 that changed nothing, stored or enforced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_config_patch_is_a_200_only_once_the_host_has_it() {
    let e = env().await;
    let allow = |hosts: &[&str]| json!({"proxy_config": {"access_control": {"allow_list": hosts}}});
    let mut body = allow(&["a.test"]);
    body["name"] = json!("patched");
    // Ready before the host is read: without it the create may answer
    // while its boot is still on the way to the host (seen with other
    // tests running alongside).
    body["wait_for_ready"] = json!(true);
    let (status, created) = e.send("create", &body).await;
    assert!(status.is_success(), "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    assert_eq!(host_allow_list(&e._host, &id), ["a.test"]);
    const BOX: &str = "/api/v2/sandboxes/boxes/patched";

    let (status, v) = e.call(Method::PATCH, BOX, Some(&allow(&["b.test"]))).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(host_allow_list(&e._host, &id), ["b.test"]);

    // Unreachable host: 503, and neither the stored config nor the host's
    // changed.
    e._host.set_unavailable(true);
    let (status, v) = e.call(Method::PATCH, BOX, Some(&allow(&["c.test"]))).await;
    e._host.set_unavailable(false);
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert!(v.to_string().contains("nothing was changed"), "{v}");
    let (_, got) = e.call(Method::GET, BOX, None).await;
    assert_eq!(
        got["proxy_config"]["access_control"]["allow_list"],
        json!(["b.test"])
    );
    assert_eq!(host_allow_list(&e._host, &id), ["b.test"]);

    // Stopped: refused as not ready, nothing stored.
    let (status, v) = e
        .call(Method::POST, &format!("{BOX}/stop"), Some(&json!({})))
        .await;
    assert!(status.is_success(), "{v}");
    let (status, v) = e.call(Method::PATCH, BOX, Some(&allow(&["d.test"]))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["detail"]["error"], "InvalidRequest", "{v}");
    let (_, got) = e.call(Method::GET, BOX, None).await;
    assert_eq!(
        got["proxy_config"]["access_control"]["allow_list"],
        json!(["b.test"])
    );
}

/// An `aws` rule with `role_arn` acts only where the operator gave the
/// hosts an AWS identity to assume roles with; elsewhere it is a 422
/// naming it, never a sandbox whose AWS requests would go unsigned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_rule_is_refused_without_an_operator_aws_identity() {
    let url = hearth_db::testing::sqlite_url();
    let db = Db::connect(&url.url).await.unwrap();
    let (_, key) = crate::harness::workspace_key(&db, "roles", Quotas::default()).await;
    let (control, host) = harness::sim_control(db).await;
    let e = Env {
        app: hearth_control::router(control),
        key,
        _host: host,
        _db: url,
    };
    let body = json!({
        "snapshot": "busybox",
        "proxy_config": {"rules": [{"name": "r", "type": "aws",
            "aws": {"role_arn": "arn:aws:iam::123456789012:role/reader"}}]},
    });
    let (status, v) = e
        .call(Method::POST, "/api/v2/sandboxes/boxes", Some(&body))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let (at, msg) = refusal(&v).unwrap();
    assert_eq!(at, "proxy_config.rules[].aws.role_arn", "{v}");
    assert!(msg.contains("HEARTH_AWS_ROLE_ACCESS_KEY_ID"), "{msg}");
}
