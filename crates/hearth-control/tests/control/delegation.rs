//! `access_delegation`: code in a sandbox calls the API as the sandbox's
//! creator with a delegation token its host's proxy adds (minted here with
//! the keys a host or control plane would hold). The grant is a ceiling
//! re-checked on every request: only permissions the creator holds can be
//! granted, an ungranted one is a 403, and a revoked creator key, a deleted
//! sandbox, a forged, expired or misdirected token are 401s. On `SimHost`.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use hearth_db::{Db, KeyOwnerKind, NewSigningKey, Quotas, Timestamp};
use hearth_fence::KeyPair;
use hearth_types::HostId;
use serde_json::{json, Value};

enum Auth<'a> {
    Key(&'a str),
    Bearer(&'a str),
}

async fn call(
    app: &Router,
    auth: Auth<'_>,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json");
    req = match auth {
        Auth::Key(k) => req.header("x-api-key", k),
        Auth::Bearer(t) => req.header("authorization", format!("Bearer {t}")),
    };
    let req = req
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .unwrap();
    crate::harness::oneshot_json(app, req).await
}

async fn register(db: &Db, key: &KeyPair, kind: KeyOwnerKind, owner: &str) {
    db.register_signing_key(&NewSigningKey {
        key_id: key.id().to_string(),
        owner_kind: kind,
        owner_id: owner.into(),
        public_key: key.public().bytes(),
        created_at: Timestamp::now(),
    })
    .await
    .unwrap();
}

fn token(key: &KeyPair, sandbox: &str, aud: &str, ttl: i64) -> String {
    let now = (hearth_fence::now_ms() / 1000) as i64;
    hearth_fence::jwt::sign(
        key,
        &json!({"aud": aud, "sub": sandbox, "iat": now, "exp": now + ttl}),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegated_sandbox_calls_the_api_as_its_creator_within_its_grant() {
    let url = hearth_db::testing::sqlite_url();
    let db = Db::connect(&url.url).await.unwrap();
    let (ws, _) = crate::harness::workspace_key(&db, "deleg", Quotas::default()).await;
    let perms = ["sandboxes:create", "sandboxes:read", "sandboxes:exec"];
    let (creator_id, creator) = hearth_control::auth::create_key(&db, ws, &perms, "creator")
        .await
        .unwrap();
    let (control, _sim) = crate::harness::sim_control(db.clone()).await;
    let app = hearth_control::router(control);
    let control_key = KeyPair::generate().unwrap();
    register(&db, &control_key, KeyOwnerKind::Control, "control").await;

    let create = |name: &str, delegation: Value| {
        json!({"name": name, "snapshot": "busybox", "wait_for_ready": true, "timeout": 60,
               "access_delegation": delegation})
    };
    // Only permissions the creator holds, and known ones, can be granted.
    let (s, v) = call(
        &app,
        Auth::Key(&creator),
        Method::POST,
        "/api/v2/sandboxes/boxes",
        Some(create(
            "no",
            json!({"mode": "EXPLICIT", "permissions": ["sandboxes:delete"]}),
        )),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert!(v.to_string().contains("cannot grant"), "{v}");
    let (s, v) = call(
        &app,
        Auth::Key(&creator),
        Method::POST,
        "/api/v2/sandboxes/boxes",
        Some(create(
            "no",
            json!({"mode": "EXPLICIT", "permissions": ["boxes:fly"]}),
        )),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");

    let (s, sb) = call(
        &app,
        Auth::Key(&creator),
        Method::POST,
        "/api/v2/sandboxes/boxes",
        Some(create(
            "deleg",
            json!({"mode": "EXPLICIT", "permissions": ["sandboxes:read"]}),
        )),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{sb}");
    assert_eq!(
        sb["access_delegation"],
        json!({"mode": "EXPLICIT", "permissions": ["sandboxes:read"]})
    );
    let id = sb["id"].as_str().unwrap().to_owned();
    let (s, plain) = call(
        &app,
        Auth::Key(&creator),
        Method::POST,
        "/api/v2/sandboxes/boxes",
        Some(
            json!({"name": "plain", "snapshot": "busybox", "wait_for_ready": true, "timeout": 60}),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{plain}");

    // Granted: read, as the creator.
    let t = token(&control_key, &id, "hearth-delegation", 300);
    let (s, list) = call(
        &app,
        Auth::Bearer(&t),
        Method::GET,
        "/api/v2/sandboxes/boxes",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{list}");
    let text = list.to_string();
    assert!(
        text.contains(r#""name":"deleg""#) && text.contains(r#""name":"plain""#),
        "{list}"
    );
    // Not granted (the creator could): create, exec on the creator's own sandbox.
    let (s, v) = call(
        &app,
        Auth::Bearer(&t),
        Method::POST,
        "/api/v2/sandboxes/boxes",
        Some(json!({"name": "child", "snapshot": "busybox"})),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    let (s, v) = call(
        &app,
        Auth::Bearer(&t),
        Method::POST,
        &format!("/dataplane/{id}/execute"),
        Some(json!({"command": "true"})),
    )
    .await;
    assert_eq!(
        s,
        StatusCode::FORBIDDEN,
        "the creator's runtime right is not delegated: {v}"
    );

    // Refused tokens.
    let stranger = KeyPair::generate().unwrap();
    let other_host = KeyPair::generate().unwrap();
    register(
        &db,
        &other_host,
        KeyOwnerKind::Host,
        &HostId::new().to_string(),
    )
    .await;
    let plain_id = plain["id"].as_str().unwrap();
    for (what, t) in [
        (
            "an unknown key",
            token(&stranger, &id, "hearth-delegation", 300),
        ),
        ("another audience", token(&control_key, &id, "control", 300)),
        (
            "an expired token",
            token(&control_key, &id, "hearth-delegation", -120),
        ),
        (
            "a sandbox without a delegation",
            token(&control_key, plain_id, "hearth-delegation", 300),
        ),
        (
            "a host that does not hold the sandbox",
            token(&other_host, &id, "hearth-delegation", 300),
        ),
        (
            "a long-lived token",
            token(&control_key, &id, "hearth-delegation", 86_400),
        ),
    ] {
        let (s, v) = call(
            &app,
            Auth::Bearer(&t),
            Method::GET,
            "/api/v2/sandboxes/boxes",
            None,
        )
        .await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{what}: {v}");
    }

    // The creator's key revoked: every delegated call fails at once.
    db.revoke_api_key(ws, creator_id).await.unwrap();
    let (s, v) = call(
        &app,
        Auth::Bearer(&t),
        Method::GET,
        "/api/v2/sandboxes/boxes",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    assert!(v.to_string().contains("revoked"), "{v}");
}
