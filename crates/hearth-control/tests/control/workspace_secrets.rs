//! Workspace secrets through the real server (`hearth_control::serve` on
//! loopback, SQLite): the LangSmith-shaped API under both prefixes, its
//! validation, permissions and limits, isolation between workspaces, and
//! what the database holds (sealed values bound to workspace and name).

use crate::harness;

use crate::harness::{envelope_problem, Resp, Server};
use hearth_types::WorkspaceId;
use serde_json::{json, Value};

const SECRETS: &str = "/api/v1/workspaces/current/secrets";

async fn workspace_of(s: &Server, key: &str) -> WorkspaceId {
    s.db.find_api_key(&hearth_control::auth::hash_key(key))
        .await
        .unwrap()
        .expect("the key exists")
        .workspace_id
}

fn keys(r: &Resp) -> Vec<String> {
    let v = r.json().unwrap_or_else(|| panic!("not JSON: {}", r.text()));
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|s| {
            let obj = s.as_object().unwrap();
            // Never a value: exactly these three fields.
            let mut fields: Vec<&str> = obj.keys().map(String::as_str).collect();
            fields.sort();
            assert_eq!(fields, ["created_at", "key", "updated_at"], "{s}");
            s["key"].as_str().unwrap().to_owned()
        })
        .collect()
}

fn assert_error(r: &Resp, status: u16, what: &str) {
    assert_eq!(r.status, status, "{what}: {}", r.text());
    if let Some(p) = envelope_problem(r) {
        panic!("{what}: not in the envelope: {p}");
    }
}

#[tokio::test]
async fn secrets_round_trip_under_both_prefixes() {
    let s = Server::start(false).await;
    let k = Some(s.admin.as_str());
    let r = s.json("GET", SECRETS, k, &Value::Null).await;
    assert_eq!((r.status, keys(&r).len()), (200, 0), "{}", r.text());

    let body = json!([
        {"key": "OPENAI_API_KEY", "value": "sk-plain-1"},
        {"key": "_internal", "value": ""},
        {"key": "GITHUB_TOKEN", "value": "ghp-plain-2"},
    ]);
    let r = s.json("POST", SECRETS, k, &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(keys(&r), ["GITHUB_TOKEN", "OPENAI_API_KEY", "_internal"]);
    assert!(!r.text().contains("plain"), "a value leaked: {}", r.text());
    let listed = r.json().unwrap();
    let first = &listed[1];
    assert!(first["created_at"].as_str().unwrap().contains('T'));

    // The other prefix serves the same store.
    let r = s
        .json("GET", "/v1/workspaces/current/secrets", k, &Value::Null)
        .await;
    assert_eq!(r.json().unwrap(), listed);

    // Upsert one, delete one with null, in one request.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let body = json!([
        {"key": "OPENAI_API_KEY", "value": "sk-plain-3"},
        {"key": "_internal", "value": null},
    ]);
    let r = s.json("POST", SECRETS, k, &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(keys(&r), ["GITHUB_TOKEN", "OPENAI_API_KEY"]);
    let after = r.json().unwrap();
    assert_eq!(after[1]["created_at"], first["created_at"]);
    assert_ne!(after[1]["updated_at"], first["updated_at"]);
    // Deleting with null what does not exist is not an error.
    let r = s
        .json(
            "POST",
            SECRETS,
            k,
            &json!([{"key": "NEVER", "value": null}]),
        )
        .await;
    assert_eq!(keys(&r), ["GITHUB_TOKEN", "OPENAI_API_KEY"]);

    let r = s
        .json(
            "DELETE",
            &format!("{SECRETS}/GITHUB_TOKEN"),
            k,
            &Value::Null,
        )
        .await;
    assert_eq!(r.status, 204, "{}", r.text());
    let r = s
        .json(
            "DELETE",
            "/v1/workspaces/current/secrets/GITHUB_TOKEN",
            k,
            &Value::Null,
        )
        .await;
    assert_error(&r, 404, "deleting twice");
    assert_eq!(r.error(), "NotFound");
    let r = s
        .json("DELETE", &format!("{SECRETS}/not-a-name"), k, &Value::Null)
        .await;
    assert_error(&r, 404, "deleting an impossible name");
    let r = s.json("GET", SECRETS, k, &Value::Null).await;
    assert_eq!(keys(&r), ["OPENAI_API_KEY"]);
    s.stop().await;
}

#[tokio::test]
async fn secrets_are_sealed_to_their_workspace_and_name() {
    let s = Server::start(false).await;
    let ws = workspace_of(&s, &s.admin).await;
    let other = workspace_of(&s, &s.other).await;
    let r = s
        .json(
            "POST",
            SECRETS,
            Some(&s.admin),
            &json!([{"key": "TOKEN", "value": "plaintext-value"}]),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());

    let sealed =
        s.db.workspace_secret(ws, "TOKEN")
            .await
            .unwrap()
            .expect("stored");
    assert!(sealed.starts_with("hs1:"), "{sealed}");
    assert!(!sealed.contains("plaintext"), "{sealed}");
    let key = &s.cfg.master_key;
    let aad = |w: WorkspaceId, n: &str| format!("workspace-secret:{w}:{n}");
    assert_eq!(
        key.open(&aad(ws, "TOKEN"), &sealed).unwrap(),
        b"plaintext-value"
    );
    // Moved to another workspace or name, the value does not open.
    assert!(key.open(&aad(other, "TOKEN"), &sealed).is_err());
    assert!(key.open(&aad(ws, "TOKEN2"), &sealed).is_err());
    assert!(key.open("TOKEN", &sealed).is_err());
    // Two seals of one value differ (fresh nonces).
    s.json(
        "POST",
        SECRETS,
        Some(&s.admin),
        &json!([{"key": "TOKEN", "value": "plaintext-value"}]),
    )
    .await;
    let again = s.db.workspace_secret(ws, "TOKEN").await.unwrap();
    assert_ne!(again.as_deref(), Some(sealed.as_str()));
    s.stop().await;
}

#[tokio::test]
async fn workspaces_cannot_see_each_others_secrets() {
    let s = Server::start(false).await;
    let (a, b) = (Some(s.admin.as_str()), Some(s.other.as_str()));
    let r = s
        .json(
            "POST",
            SECRETS,
            a,
            &json!([{"key": "A_ONLY", "value": "a"}]),
        )
        .await;
    assert_eq!(r.status, 200);
    let r = s.json("GET", SECRETS, b, &Value::Null).await;
    assert_eq!(keys(&r), Vec::<String>::new());
    let r = s
        .json("DELETE", &format!("{SECRETS}/A_ONLY"), b, &Value::Null)
        .await;
    assert_error(&r, 404, "deleting another workspace's secret");
    // Null from B deletes nothing of A's; the same name in B is B's own.
    let r = s
        .json(
            "POST",
            SECRETS,
            b,
            &json!([{"key": "A_ONLY", "value": null}, {"key": "SHARED", "value": "b"}]),
        )
        .await;
    assert_eq!(keys(&r), ["SHARED"]);
    let r = s
        .json(
            "POST",
            SECRETS,
            a,
            &json!([{"key": "SHARED", "value": "a"}]),
        )
        .await;
    assert_eq!(keys(&r), ["A_ONLY", "SHARED"]);
    let (wa, wb) = (
        workspace_of(&s, &s.admin).await,
        workspace_of(&s, &s.other).await,
    );
    let key = &s.cfg.master_key;
    for (w, want) in [(wa, b"a"), (wb, b"b")] {
        let sealed = s.db.workspace_secret(w, "SHARED").await.unwrap().unwrap();
        let plain = key
            .open(&format!("workspace-secret:{w}:SHARED"), &sealed)
            .unwrap();
        assert_eq!(plain, want);
    }
    s.stop().await;
}

#[tokio::test]
async fn bad_secret_requests_are_422_naming_the_item() {
    let s = Server::start(false).await;
    let k = Some(s.admin.as_str());
    let many: Vec<Value> = (0..101)
        .map(|i| json!({"key": format!("K{i}"), "value": "v"}))
        .collect();
    let cases = [
        (json!({"key": "A", "value": "x"}), json!(["body"])),
        (json!("A=x"), json!(["body"])),
        (Value::Array(many), json!(["body"])),
        (json!([["A", "x"]]), json!(["body", 0])),
        (json!([{"value": "x"}]), json!(["body", 0, "key"])),
        (json!([{"key": 7, "value": "x"}]), json!(["body", 0, "key"])),
        (
            json!([{"key": "OK", "value": "x"}, {"key": "1BAD", "value": "x"}]),
            json!(["body", 1, "key"]),
        ),
        (
            json!([{"key": "A-B", "value": "x"}]),
            json!(["body", 0, "key"]),
        ),
        (
            json!([{"key": "A".repeat(129), "value": "x"}]),
            json!(["body", 0, "key"]),
        ),
        (
            json!([{"key": "DUP", "value": "x"}, {"key": "DUP", "value": null}]),
            json!(["body", 1, "key"]),
        ),
        (json!([{"key": "A"}]), json!(["body", 0, "value"])),
        (
            json!([{"key": "A", "value": {"v": 1}}]),
            json!(["body", 0, "value"]),
        ),
        (
            json!([{"key": "A", "value": "a\u{0}b"}]),
            json!(["body", 0, "value"]),
        ),
        (
            json!([{"key": "A", "value": "x".repeat(64 * 1024 + 1)}]),
            json!(["body", 0, "value"]),
        ),
    ];
    for (body, loc) in cases {
        let r = s.json("POST", SECRETS, k, &body).await;
        let what = format!("{body:.100}");
        assert_error(&r, 422, &what);
        assert_eq!(r.json().unwrap()["detail"][0]["loc"], loc, "{what}");
    }
    // Nothing of a refused request was stored, even its valid items.
    let r = s.json("GET", SECRETS, k, &Value::Null).await;
    assert_eq!(keys(&r), Vec::<String>::new());

    // Not JSON at all.
    let req = harness::RawRequest::new(
        "POST",
        SECRETS,
        &[
            ("x-api-key".into(), s.admin.clone()),
            ("content-type".into(), "application/json".into()),
        ],
        b"[{".to_vec(),
    );
    let r = harness::send(s.addr, &req.bytes()).await;
    assert_error(&r, 422, "invalid JSON");

    // At the limits is fine.
    let body = json!([{"key": format!("A{}", "b".repeat(127)), "value": "x".repeat(64 * 1024)}]);
    let r = s.json("POST", SECRETS, k, &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    s.stop().await;
}

#[tokio::test]
async fn secrets_need_a_key_and_the_right_permission() {
    let s = Server::start(false).await;
    let r = s.json("GET", SECRETS, None, &Value::Null).await;
    assert_error(&r, 401, "no key");
    let r = s.json("POST", SECRETS, Some("hth_wrong"), &json!([])).await;
    assert_error(&r, 401, "unknown key");

    let ws = workspace_of(&s, &s.admin).await;
    let (_, reader) = hearth_control::auth::create_key(&s.db, ws, &["sandboxes:read"], "reader")
        .await
        .unwrap();
    let r = s
        .json(
            "POST",
            SECRETS,
            Some(&s.admin),
            &json!([{"key": "T", "value": "v"}]),
        )
        .await;
    assert_eq!(r.status, 200);
    let r = s.json("GET", SECRETS, Some(&reader), &Value::Null).await;
    assert_eq!(keys(&r), ["T"]);
    let r = s
        .json(
            "POST",
            SECRETS,
            Some(&reader),
            &json!([{"key": "T", "value": "w"}]),
        )
        .await;
    assert_error(&r, 403, "reader writes");
    let r = s
        .json(
            "DELETE",
            &format!("{SECRETS}/T"),
            Some(&reader),
            &Value::Null,
        )
        .await;
    assert_error(&r, 403, "reader deletes");
    let (_, creator) =
        hearth_control::auth::create_key(&s.db, ws, &["sandboxes:create"], "creator")
            .await
            .unwrap();
    let r = s.json("GET", SECRETS, Some(&creator), &Value::Null).await;
    assert_error(&r, 403, "creator lists");
    let r = s
        .json(
            "DELETE",
            &format!("{SECRETS}/T"),
            Some(&creator),
            &Value::Null,
        )
        .await;
    assert_eq!(r.status, 204, "{}", r.text());

    // Methods the route does not have.
    let r = s.json("PUT", SECRETS, Some(&s.admin), &json!([])).await;
    assert_error(&r, 405, "PUT");
    s.stop().await;
}

#[tokio::test]
async fn a_workspace_holds_at_most_1000_secrets() {
    let s = Server::start(false).await;
    let k = Some(s.admin.as_str());
    for batch in 0..10 {
        let body: Vec<Value> = (0..100)
            .map(|i| json!({"key": format!("S{batch}_{i:03}"), "value": "v"}))
            .collect();
        let r = s.json("POST", SECRETS, k, &Value::Array(body)).await;
        assert_eq!(r.status, 200, "batch {batch}: {}", r.text());
    }
    // One more is refused, and the refused request changes nothing, even
    // the replacement in it.
    let body = json!([{"key": "S0_000", "value": "new"}, {"key": "EXTRA", "value": "v"}]);
    let r = s.json("POST", SECRETS, k, &body).await;
    assert_error(&r, 409, "the 1001st");
    assert!(r.text().contains("1000"), "{}", r.text());
    let ws = workspace_of(&s, &s.admin).await;
    let sealed = s.db.workspace_secret(ws, "S0_000").await.unwrap().unwrap();
    let plain = s
        .cfg
        .master_key
        .open(&format!("workspace-secret:{ws}:S0_000"), &sealed)
        .unwrap();
    assert_eq!(plain, b"v");
    // Replacing at the limit is fine; deleting one in the same request
    // makes room for a new one.
    let body = json!([
        {"key": "S0_000", "value": "new"},
        {"key": "S0_001", "value": null},
        {"key": "EXTRA", "value": "v"},
    ]);
    let r = s.json("POST", SECRETS, k, &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(keys(&r).len(), 1000);
    // The other workspace is unaffected.
    let r = s
        .json(
            "POST",
            SECRETS,
            Some(&s.other),
            &json!([{"key": "EXTRA", "value": "v"}]),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    s.stop().await;
}
