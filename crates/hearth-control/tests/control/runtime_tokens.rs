//! Issue 39, findings 1 and 4: runtime tokens (E2B's envd and traffic
//! tokens) go only to callers with runtime access (the creator, or
//! `sandboxes:exec`), through either door; they die with the key or the
//! delegation that obtained them; a capture needs the same right. On
//! `SimHost`, through the router.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use hearth_db::{Db, KeyOwnerKind, NewSigningKey, Quotas, Timestamp};
use hearth_fence::KeyPair;
use serde_json::{json, Value};

/// A request with `headers`; the status and the JSON answer (or Null).
async fn call(
    app: &Router,
    headers: &[(&str, &str)],
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .unwrap();
    crate::harness::oneshot_json(app, req).await
}

async fn as_key(
    app: &Router,
    key: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    call(app, &[("x-api-key", key)], method, path, body).await
}

/// envd's `/health` of `id` with `token`: the status and the message.
async fn envd_health(app: &Router, id: &str, token: &str) -> (StatusCode, String) {
    let (s, v) = call(
        app,
        &[("e2b-sandbox-id", id), ("x-access-token", token)],
        Method::GET,
        "/health",
        None,
    )
    .await;
    (s, v["message"].as_str().unwrap_or_default().to_owned())
}

/// An E2B sandbox made by `key`: its id and envd token.
async fn e2b_sandbox(app: &Router, key: &str) -> (String, String) {
    let (s, sb) = as_key(
        app,
        key,
        Method::POST,
        "/sandboxes",
        Some(json!({"templateID": "base", "timeout": 300})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{sb}");
    (
        sb["sandboxID"].as_str().unwrap().to_owned(),
        sb["envdAccessToken"].as_str().unwrap().to_owned(),
    )
}

/// The simulated host's guest answers envd's health check.
fn opened(s: StatusCode) -> bool {
    s == StatusCode::NO_CONTENT
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxes_read_key_gets_no_runtime_token_from_either_door() {
    let url = hearth_db::testing::sqlite_url();
    let db = Db::connect(&url.url).await.unwrap();
    let (ws, admin) = crate::harness::workspace_key(&db, "tokens", Quotas::default()).await;
    let (_, reader) = hearth_control::auth::create_key(&db, ws, &["sandboxes:read"], "reader")
        .await
        .unwrap();
    let exec_perms = ["sandboxes:read", "sandboxes:exec"];
    let (exec_id, exec) = hearth_control::auth::create_key(&db, ws, &exec_perms, "exec")
        .await
        .unwrap();
    let (control, _sim) = crate::harness::sim_control(db.clone()).await;
    let app = hearth_control::router(control);
    let (id, admin_token) = e2b_sandbox(&app, &admin).await;
    assert!(opened(envd_health(&app, &id, &admin_token).await.0));

    // E2B's door: the reader sees the sandbox, not its token; connecting
    // (whose answer is the tokens) is refused.
    let (s, d) = as_key(
        &app,
        &reader,
        Method::GET,
        &format!("/sandboxes/{id}"),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{d}");
    assert_eq!(d["state"], "running");
    assert!(
        d.get("envdAccessToken").is_none(),
        "a reader got the envd token: {d}"
    );
    let (s, v) = as_key(
        &app,
        &reader,
        Method::POST,
        &format!("/sandboxes/{id}/connect"),
        Some(json!({"timeout": 60})),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("sandboxes:exec"),
        "{v}"
    );
    let (s, list) = as_key(&app, &reader, Method::GET, "/v2/sandboxes", None).await;
    assert_eq!(s, StatusCode::OK, "{list}");
    assert!(!list.to_string().contains("envdAccessToken"), "{list}");
    // LangSmith's door: the same key, the same answer.
    let (s, v) = as_key(
        &app,
        &reader,
        Method::POST,
        &format!("/dataplane/{id}/execute"),
        Some(json!({"command": "id"})),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    for (what, body) in [
        ("download-url", json!({"path": "/etc/hostname"})),
        ("service-url", json!({"port": 8000})),
    ] {
        let (s, v) = as_key(
            &app,
            &reader,
            Method::POST,
            &format!("/api/v2/sandboxes/boxes/{id}/{what}"),
            Some(body),
        )
        .await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{what}: {v}");
    }

    // A key with sandboxes:exec gets a token of its own, which opens envd.
    let (s, d) = as_key(&app, &exec, Method::GET, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(s, StatusCode::OK, "{d}");
    let exec_token = d["envdAccessToken"]
        .as_str()
        .expect("an exec key gets the token")
        .to_owned();
    assert!(opened(envd_health(&app, &id, &exec_token).await.0));
    let (s, c) = as_key(
        &app,
        &exec,
        Method::POST,
        &format!("/sandboxes/{id}/connect"),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{c}");
    let connected = c["envdAccessToken"].as_str().unwrap().to_owned();

    // Revoking the key ends every token it obtained, at once; the
    // creator's own token is untouched.
    db.revoke_api_key(ws, exec_id).await.unwrap();
    for token in [&exec_token, &connected] {
        let (s, why) = envd_health(&app, &id, token).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{why}");
        assert!(why.contains("revoked"), "{why}");
    }
    assert!(opened(envd_health(&app, &id, &admin_token).await.0));

    // A token opens its own sandbox only, and only as envd.
    let (other, other_token) = e2b_sandbox(&app, &admin).await;
    assert_eq!(
        envd_health(&app, &other, &admin_token).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        envd_health(&app, &id, &other_token).await.0,
        StatusCode::UNAUTHORIZED
    );
    for forged in ["", "x", &admin_token[..admin_token.len() - 2]] {
        assert_eq!(
            envd_health(&app, &id, forged).await.0,
            StatusCode::UNAUTHORIZED,
            "{forged}"
        );
    }
}

fn delegation_token(key: &KeyPair, sandbox: &str) -> String {
    let now = (hearth_fence::now_ms() / 1000) as i64;
    hearth_fence::jwt::sign(
        key,
        &json!({"aud": "hearth-delegation", "sub": sandbox, "iat": now, "exp": now + 300}),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_delegated_sandbox_cannot_open_another() {
    let url = hearth_db::testing::sqlite_url();
    let db = Db::connect(&url.url).await.unwrap();
    let (_, admin) = crate::harness::workspace_key(&db, "deleg", Quotas::default()).await;
    let (control, _sim) = crate::harness::sim_control(db.clone()).await;
    let app = hearth_control::router(control);
    let control_key = KeyPair::generate().unwrap();
    db.register_signing_key(&NewSigningKey {
        key_id: control_key.id().to_string(),
        owner_kind: KeyOwnerKind::Control,
        owner_id: "control".into(),
        public_key: control_key.public().bytes(),
        created_at: Timestamp::now(),
    })
    .await
    .unwrap();
    let (victim, _) = e2b_sandbox(&app, &admin).await;
    let delegated = |name: &str, permissions: Value| {
        json!({"name": name, "snapshot": "busybox", "wait_for_ready": true, "timeout": 60,
               "access_delegation": {"mode": "EXPLICIT", "permissions": permissions}})
    };

    // Delegated sandboxes:read only: it sees the victim, never its insides.
    let (s, reader) = as_key(
        &app,
        &admin,
        Method::POST,
        "/api/v2/sandboxes/boxes",
        Some(delegated("reader", json!(["sandboxes:read"]))),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{reader}");
    let bearer = format!(
        "Bearer {}",
        delegation_token(&control_key, reader["id"].as_str().unwrap())
    );
    let from_inside = [("authorization", bearer.as_str())];
    let (s, d) = call(
        &app,
        &from_inside,
        Method::GET,
        &format!("/sandboxes/{victim}"),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{d}");
    assert!(
        d.get("envdAccessToken").is_none(),
        "a read-only delegation got the envd token: {d}"
    );
    let (s, v) = call(
        &app,
        &from_inside,
        Method::POST,
        &format!("/sandboxes/{victim}/connect"),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    // Nor a sandbox it creates itself (it could not, without create).
    let (s, v) = call(
        &app,
        &from_inside,
        Method::POST,
        "/sandboxes",
        Some(json!({"templateID": "base"})),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");

    // Delegated exec: a token, which dies with the delegating sandbox.
    let (s, runner) = as_key(
        &app,
        &admin,
        Method::POST,
        "/api/v2/sandboxes/boxes",
        Some(delegated(
            "runner",
            json!(["sandboxes:read", "sandboxes:exec"]),
        )),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{runner}");
    let runner_id = runner["id"].as_str().unwrap().to_owned();
    let bearer = format!("Bearer {}", delegation_token(&control_key, &runner_id));
    let (s, d) = call(
        &app,
        &[("authorization", bearer.as_str())],
        Method::GET,
        &format!("/sandboxes/{victim}"),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{d}");
    let token = d["envdAccessToken"]
        .as_str()
        .expect("delegated exec gets the token")
        .to_owned();
    assert!(opened(envd_health(&app, &victim, &token).await.0));
    let (s, v) = as_key(
        &app,
        &admin,
        Method::DELETE,
        &format!("/api/v2/sandboxes/boxes/{runner_id}"),
        None,
    )
    .await;
    assert!(s.is_success(), "{v}");
    let (s, why) = envd_health(&app, &victim, &token).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{why}");
    assert!(why.contains("delegation"), "{why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capture_without_exec_is_403() {
    let url = hearth_db::testing::sqlite_url();
    let db = Db::connect(&url.url).await.unwrap();
    let (ws, admin) = crate::harness::workspace_key(&db, "capture", Quotas::default()).await;
    let perms = ["sandboxes:create", "sandboxes:read", "sandboxes:update"];
    let (_, no_exec) = hearth_control::auth::create_key(&db, ws, &perms, "no exec")
        .await
        .unwrap();
    let (control, _sim) = crate::harness::sim_control(db.clone()).await;
    let app = hearth_control::router(control);
    let (victim, _) = e2b_sandbox(&app, &admin).await;

    let (s, v) = as_key(
        &app,
        &no_exec,
        Method::POST,
        &format!("/api/v2/sandboxes/boxes/{victim}/snapshot"),
        Some(json!({"name": "stolen", "include_memory": true})),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "LangSmith's capture: {v}");
    let (s, v) = as_key(
        &app,
        &no_exec,
        Method::POST,
        &format!("/sandboxes/{victim}/snapshots"),
        Some(json!({"name": "stolen"})),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "E2B's snapshot: {v}");
    let (s, v) = as_key(
        &app,
        &no_exec,
        Method::GET,
        "/api/v2/sandboxes/snapshots?name_contains=stolen",
        None,
    )
    .await;
    assert!(
        s.is_success() && !v.to_string().contains("stolen"),
        "no snapshot was made: {v}"
    );

    // Its own sandbox, it may capture (the creator has runtime access).
    let (s, own) = as_key(
        &app,
        &no_exec,
        Method::POST,
        "/sandboxes",
        Some(json!({"templateID": "base"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{own}");
    let own = own["sandboxID"].as_str().unwrap();
    let (s, v) = as_key(
        &app,
        &no_exec,
        Method::POST,
        &format!("/api/v2/sandboxes/boxes/{own}/snapshot"),
        Some(json!({"name": "mine"})),
    )
    .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
}
