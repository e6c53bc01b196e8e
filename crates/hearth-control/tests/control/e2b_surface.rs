//! Never a silent yes, over the e2b SDK's whole request surface.
//!
//! `tests/e2b/surface.py` walks the request models the e2b SDK's API
//! client is generated from (create, connect, resume, pause, timeout,
//! snapshot, fork, network update, secrets) and the query parameters of
//! its lists, and gives every field, nested ones included, with a body
//! that holds it. Here each one must either act or be refused:
//!
//! - **acts**: it appears in one of the exercise requests below, which
//!   succeed (the effect itself is proved by the suites that use each
//!   field: `control/e2b.rs`, `tests/e2b/test_e2b.py`, `hearth-cli`'s
//!   `network.rs`);
//! - **refused**: its request is a 400 in E2B's error shape whose message
//!   names the field (or the part of it Hearth refuses).
//!
//! A field a new SDK adds lands in neither and is refused by the parser
//! (every body is `deny_unknown_fields`): this test then still passes,
//! and only a field made to act must be added to an exercise. E2B's
//! routes Hearth does not serve (refreshes) are a 501 whatever their
//! body. On a simulated host, SQLite.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use crate::harness::{Resp, Server};

use crate::sdk_surface::{paths, surface};

fn rules() -> Value {
    json!({"api.test": [{"transform": {"headers": {"X-Surface": "surface"}}}]})
}

/// Requests that use every field Hearth acts on, per operation.
fn exercises() -> Vec<(&'static str, Value)> {
    let mut v = Vec::new();
    for op in ["create", "create_v2"] {
        v.push((
            op,
            json!({
                "templateID": "base", "timeout": 60, "autoPause": true,
                "autoPauseMemory": true, "autoResume": {"enabled": true},
                "allow_internet_access": true,
                "network": {"allowPublicTraffic": true, "allowOut": ["api.test"],
                            "denyOut": ["0.0.0.0/0"], "rules": rules(),
                            "maskRequestHost": "localhost:${PORT}", "httpsPorts": [8443]},
                "metadata": {"team": "a"}, "envVars": {"A": "1"},
            }),
        ));
        v.push((
            op,
            json!({"templateID": "base", "network": {"denyOut": ["10.0.0.0/8"]}}),
        ));
    }
    // Volumes, mounted read-write by one sandbox each (a create makes
    // the volumes it names first, see `send`).
    v.extend([
        ("create_volume", json!({"name": "surface-v1"})),
        (
            "create",
            json!({"templateID": "base",
                   "volumeMounts": [{"name": "surface-v1", "path": "/mnt/data"}]}),
        ),
        (
            "create_v2",
            json!({"templateID": "base",
                   "volumeMounts": [{"name": "surface-v2", "path": "/mnt/data"}]}),
        ),
    ]);
    // `secure` is E2B's only mode (v1 only): tokens are always required.
    v.push(("create", json!({"templateID": "base", "secure": true})));
    v.extend([
        ("timeout", json!({"timeout": 60})),
        (
            "pause",
            json!({"memory": true, "requireHealthyGuest": true}),
        ),
        ("connect", json!({"timeout": 60, "memory": true})),
        ("connect_v2", json!({"timeout": 60, "memory": true})),
        ("resume", json!({"timeout": 60, "memory": true})),
        ("snapshot", json!({"name": "surface", "memory": true})),
        ("fork", json!({"timeout": 60, "count": 1})),
        (
            "network",
            json!({"allowOut": ["api.test"], "denyOut": ["0.0.0.0/0"], "rules": rules(),
                   "allow_internet_access": true}),
        ),
        (
            "create_secret",
            json!({"name": "surface", "value": "s3cret", "metadata": {"team": "a"}}),
        ),
        (
            "update_secret",
            json!({"value": "s3cret", "metadata": {"team": "a"}}),
        ),
        ("list", json!({"metadata": "team=a"})),
        (
            "list_v2",
            json!({"metadata": "team=a", "state": "running", "limit": 1,
                   "nextToken": "$NEXT", "startedAfter": "2026-01-01T00:00:00Z",
                   "template": "base", "order": "asc"}),
        ),
        (
            "list_snapshots",
            json!({"limit": 1, "sandboxID": "$SANDBOX"}),
        ),
        ("list_snapshots", json!({"limit": 1, "nextToken": "$NEXT"})),
        ("list_snapshots", json!({"name": "surface"})),
        ("list_secrets", json!({"limit": 1, "nextToken": "$NEXT"})),
        // A window before now: answered without asking the (simulated)
        // guest for its figures.
        ("metrics", json!({"start": 0, "end": 1})),
        ("logs", json!({"start": 0, "limit": 10})),
        (
            "logs_v2",
            json!({"cursor": 0, "limit": 10, "direction": "backward", "level": "warn",
                   "search": "process"}),
        ),
    ]);
    v
}

/// What a query parameter sample is in a URL (the SDK's forms).
fn query(params: &Value) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    for (k, v) in params.as_object().expect("query parameters") {
        let s = match v {
            Value::String(s) => s.clone(),
            Value::Object(o) => o
                .iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join("&"),
            v => v.to_string(),
        };
        q.append_pair(k, &s);
    }
    q.finish()
}

struct Env {
    s: Server,
    key: String,
}

impl Env {
    async fn call(&self, method: &str, path: &str, body: &Value) -> Resp {
        self.s.json(method, path, Some(&self.key), body).await
    }

    /// A running sandbox of its own for an operation on one.
    async fn sandbox(&self) -> String {
        let r = self
            .call(
                "POST",
                "/sandboxes",
                &json!({"templateID": "base", "timeout": 300, "metadata": {"team": "a"}}),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.text());
        r.json().unwrap()["sandboxID"].as_str().unwrap().to_owned()
    }

    /// Kills every sandbox, so that the next request finds the simulated
    /// host's room.
    async fn cleanup(&self) {
        let r = self
            .call(
                "GET",
                "/v2/sandboxes?state=running,paused&limit=100",
                &json!({}),
            )
            .await;
        for sb in r
            .json()
            .unwrap_or_default()
            .as_array()
            .into_iter()
            .flatten()
        {
            let id = sb["sandboxID"].as_str().unwrap_or_default();
            let r = self
                .call("DELETE", &format!("/sandboxes/{id}"), &json!({}))
                .await;
            assert!(r.status < 300 || r.status == 404, "kill {id}: {}", r.text());
        }
        // And the secret and volumes the creates name, so that the next may.
        self.call("DELETE", "/secrets/surface", &json!({})).await;
        for name in ["surface", "surface-v1", "surface-v2"] {
            let r = self
                .call("DELETE", &format!("/volumes/{name}"), &json!({}))
                .await;
            assert!(
                r.status < 300 || r.status == 404,
                "delete volume {name}: {}",
                r.text()
            );
        }
    }

    /// Fills the placeholders a query of `op` needs from the server: a
    /// sandbox, or the token of the list's second page.
    async fn resolve(&self, op: &str, v: &mut Value) {
        // A token is for the query that gave it: the same one, paged by 1.
        let mut same = v.clone();
        if let Some(o) = same.as_object_mut() {
            o.remove("nextToken");
            o.insert("limit".into(), json!(1));
        }
        let Some(o) = v.as_object_mut() else { return };
        for val in o.values_mut() {
            if val == "$SANDBOX" {
                *val = json!(self.sandbox().await);
            } else if val == "$NEXT" {
                let list = match op {
                    "list_v2" => {
                        self.sandbox().await;
                        self.sandbox().await;
                        "/v2/sandboxes"
                    }
                    "list_secrets" => {
                        for _ in 0..2 {
                            let name = format!("page{}", rand_suffix());
                            self.call("POST", "/secrets", &json!({"name": name, "value": "v"}))
                                .await;
                        }
                        "/secrets"
                    }
                    "list_snapshots" => {
                        let id = self.sandbox().await;
                        for _ in 0..2 {
                            let r = self
                                .call("POST", &format!("/sandboxes/{id}/snapshots"), &json!({}))
                                .await;
                            assert!(r.status < 300, "snapshot: {}", r.text());
                        }
                        "/snapshots"
                    }
                    other => panic!("no second page of {other}"),
                };
                let r = self
                    .call("GET", &format!("{list}?{}", query(&same)), &json!({}))
                    .await;
                let next = r
                    .header("x-next-token")
                    .unwrap_or_else(|| panic!("a second page of {list}: {}", r.text()))
                    .to_owned();
                *val = json!(next);
            }
        }
    }

    /// Sends `op` with `body` (a JSON body, or for lists the query's
    /// parameters).
    async fn send(&self, op: &str, body: &Value) -> Resp {
        let mut body = body.clone();
        self.resolve(op, &mut body).await;
        let empty = json!({});
        if op.starts_with("create") {
            // The volumes it mounts exist (made here when they do not).
            for m in body["volumeMounts"].as_array().into_iter().flatten() {
                let r = self
                    .call("POST", "/volumes", &json!({"name": m["name"]}))
                    .await;
                assert!(r.status < 300 || r.status == 409, "{}", r.text());
            }
        }
        match op {
            "create" => self.call("POST", "/sandboxes", &body).await,
            "create_v2" => self.call("POST", "/v2/sandboxes", &body).await,
            "create_secret" => self.call("POST", "/secrets", &body).await,
            "create_volume" => self.call("POST", "/volumes", &body).await,
            "update_secret" => {
                // A secret of its own to update.
                let name = format!("s{}", rand_suffix());
                let r = self
                    .call("POST", "/secrets", &json!({"name": name, "value": "v"}))
                    .await;
                assert!(r.status < 300, "{}", r.text());
                let id = r.json().unwrap()["secretID"].as_str().unwrap().to_owned();
                self.call("POST", &format!("/secrets/{id}"), &body).await
            }
            "list" => {
                self.call("GET", &format!("/sandboxes?{}", query(&body)), &empty)
                    .await
            }
            "list_v2" => {
                self.call("GET", &format!("/v2/sandboxes?{}", query(&body)), &empty)
                    .await
            }
            "list_snapshots" => {
                self.call("GET", &format!("/snapshots?{}", query(&body)), &empty)
                    .await
            }
            "list_secrets" => {
                self.call("GET", &format!("/secrets?{}", query(&body)), &empty)
                    .await
            }
            op => {
                let id = self.sandbox().await;
                let (method, path) = match op {
                    "timeout" => ("POST", "timeout"),
                    "pause" => ("POST", "pause"),
                    "connect" => ("POST", "connect"),
                    "resume" => {
                        let r = self
                            .call("POST", &format!("/sandboxes/{id}/pause"), &empty)
                            .await;
                        assert_eq!(r.status, 204, "{}", r.text());
                        ("POST", "resume")
                    }
                    "connect_v2" => {
                        return self
                            .call("POST", &format!("/v2/sandboxes/{id}/connect"), &body)
                            .await
                    }
                    "snapshot" => ("POST", "snapshots"),
                    "fork" => ("POST", "fork"),
                    "network" => ("PUT", "network"),
                    // Reads: the query on the sandbox's own path.
                    "metrics" | "logs" | "logs_v2" => {
                        let path = match op {
                            "metrics" => format!("/sandboxes/{id}/metrics"),
                            "logs" => format!("/sandboxes/{id}/logs"),
                            _ => format!("/v2/sandboxes/{id}/logs"),
                        };
                        return self
                            .call("GET", &format!("{path}?{}", query(&body)), &empty)
                            .await;
                    }
                    other => panic!("unknown operation {other}"),
                };
                self.call(method, &format!("/sandboxes/{id}/{path}"), &body)
                    .await
            }
        }
    }
}

fn rand_suffix() -> u32 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_e2b_sdk_field_acts_or_is_refused_naming_it() {
    let surface = surface("tests/e2b/surface.py");
    assert!(
        surface.len() >= 100,
        "the SDK's surface shrank to {} fields: is surface.py still finding its models?",
        surface.len()
    );

    let (s, _sim) = Server::on_sim().await;
    let e = Env {
        key: s.other.clone(),
        s,
    };
    // What acts: every exercise succeeds.
    let mut acting: BTreeSet<(String, String)> = BTreeSet::new();
    for (op, body) in exercises() {
        let r = e.send(op, &body).await;
        assert!(
            r.status < 300,
            "exercise {op} {body}: {} {}",
            r.status,
            r.text()
        );
        e.cleanup().await;
        let mut p = BTreeSet::new();
        paths(&body, "", &mut p);
        acting.extend(p.into_iter().map(|p| (op.to_owned(), p)));
    }

    // Every field of the SDK: acts, or is refused naming it.
    let mut silent = Vec::new();
    let mut unnamed = Vec::new();
    let mut refused = Vec::new();
    for (op, path, body) in &surface {
        let r = e.send(op, body).await;
        e.cleanup().await;
        if r.status >= 300 {
            refused.push(format!("{op} {path}"));
        }
        if r.status < 300 {
            if !acting.contains(&(op.clone(), path.clone())) {
                silent.push(format!("{op} {path}: {} for {body}", r.status));
            }
            continue;
        }
        let message = r.json().unwrap_or_default()["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let named = path
            .split(['.', '[', ']'])
            .filter(|s| !s.is_empty())
            .any(|seg| message.contains(seg));
        if r.status != 400 || !named {
            unnamed.push(format!("{op} {path}: {} {message:?} for {body}", r.status));
        }
    }
    eprintln!(
        "{} fields of the e2b SDK: {} act, {} refused by name: {}",
        surface.len(),
        surface.len() - refused.len(),
        refused.len(),
        refused.join(", ")
    );
    assert!(
        silent.is_empty(),
        "accepted but in no exercise (a silent yes?):\n{}",
        silent.join("\n")
    );
    assert!(
        unnamed.is_empty(),
        "refused without naming the field:\n{}",
        unnamed.join("\n")
    );
}
