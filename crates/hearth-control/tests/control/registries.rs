//! Private image registries through the real server on a simulated host
//! (`SimHost`, SQLite): the SDK's `client.registries` CRUD, what answers
//! never hold (the password), isolation between workspaces, and which
//! credentials go with which pull (the registry's, to its own host only).

use serde_json::{json, Value};

use crate::harness::{envelope_problem, Resp, Server};

const REGISTRIES: &str = "/api/v2/sandboxes/registries";
const SNAPSHOTS: &str = "/api/v2/sandboxes/snapshots";

fn ok(r: &Resp, status: u16, what: &str) -> Value {
    assert_eq!(r.status, status, "{what}: {}", r.text());
    if status >= 400 {
        if let Some(p) = envelope_problem(r) {
            panic!("{what}: not in the envelope: {p}");
        }
    }
    r.json().unwrap_or(Value::Null)
}

fn refused(r: &Resp, status: u16, field: &str, what: &str) {
    ok(r, status, what);
    assert_eq!(r.field(), field, "{what}: {}", r.text());
}

#[tokio::test]
async fn registries_keep_their_password_to_themselves_and_their_own_host() {
    let (s, sim) = Server::on_sim().await;
    let (a, b) = (Some(s.admin.as_str()), Some(s.other.as_str()));
    let body = json!({"name": "internal", "url": "https://Registry.Example:5000",
                      "username": "robot", "password": "hunter2-registry"});
    let created = ok(&s.json("POST", REGISTRIES, a, &body).await, 201, "create");
    assert_eq!(created["name"], "internal");
    assert_eq!(created["auth_type"], "DOCKER_CONFIG");
    assert_eq!(created["provider"], "DOCKER_REGISTRY");
    assert_eq!(created["has_password"], true);
    let id = created["id"].as_str().unwrap().to_owned();
    ok(
        &s.json("POST", REGISTRIES, a, &body).await,
        409,
        "the same name twice",
    );
    // The other workspace may use the name; sees none of the first's.
    ok(
        &s.json("POST", REGISTRIES, b, &body).await,
        201,
        "same name elsewhere",
    );
    ok(
        &s.json("GET", &format!("{REGISTRIES}/internal"), a, &Value::Null)
            .await,
        200,
        "get",
    );
    let list = ok(
        &s.json("GET", REGISTRIES, b, &Value::Null).await,
        200,
        "list",
    );
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    assert_ne!(list["items"][0]["id"].as_str(), Some(id.as_str()));

    // No answer ever carries the password, and the database holds it
    // sealed.
    for r in [
        s.json("GET", &format!("{REGISTRIES}/internal"), a, &Value::Null)
            .await,
        s.json("GET", REGISTRIES, a, &Value::Null).await,
    ] {
        assert!(!r.text().contains("hunter2"), "{}", r.text());
    }
    let ws =
        s.db.find_api_key(&hearth_control::auth::hash_key(&s.admin))
            .await
            .unwrap()
            .unwrap()
            .workspace_id;
    let row =
        s.db.registry_by_name(ws, "internal")
            .await
            .unwrap()
            .unwrap();
    assert!(!row.password.as_deref().unwrap().contains("hunter2"));

    // A pull with it: its credentials, to its own host.
    let pull = |image: &str, registry: &str| {
        json!({"name": "private", "docker_image": image, "fs_capacity_bytes": 1u64 << 30,
               "registry_id": registry})
    };
    let snap = ok(
        &s.json(
            "POST",
            SNAPSHOTS,
            a,
            &pull("registry.example:5000/team/app:v1", &id),
        )
        .await,
        202,
        "pull with the registry",
    );
    assert_eq!(snap["registry_id"].as_str(), Some(id.as_str()));
    // The build runs in the background.
    let snap_path = format!("{SNAPSHOTS}/{}", snap["id"].as_str().unwrap());
    let t = std::time::Instant::now();
    while ok(
        &s.json("GET", &snap_path, a, &Value::Null).await,
        200,
        "the build",
    )["status"]
        == "building"
    {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "still building"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let import = sim.imports().pop().unwrap();
    assert_eq!(import.reference, "registry.example:5000/team/app:v1");
    assert!(!import.insecure_http);
    let auth = import
        .auth
        .expect("the registry's credentials went with the pull");
    assert_eq!(
        (auth.username.as_str(), auth.password.as_str()),
        ("robot", "hunter2-registry")
    );
    // An image on another host never gets them; another workspace's
    // registry is not found; nor is a made-up one.
    refused(
        &s.json("POST", SNAPSHOTS, a, &pull("evil.example/team/app:v1", &id))
            .await,
        422,
        "registry_id",
        "an image elsewhere",
    );
    ok(
        &s.json(
            "POST",
            SNAPSHOTS,
            b,
            &pull("registry.example:5000/team/app:v1", &id),
        )
        .await,
        404,
        "another workspace's registry",
    );
    refused(
        &s.json(
            "POST",
            SNAPSHOTS,
            a,
            &pull("registry.example:5000/a:v1", "not-an-id"),
        )
        .await,
        422,
        "registry_id",
        "a malformed id",
    );
    assert_eq!(sim.imports().len(), 1, "no refused pull reached the host");

    // Moving it to another host needs the password again.
    let path = format!("{REGISTRIES}/internal");
    refused(
        &s.json("PATCH", &path, a, &json!({"url": "evil.example"}))
            .await,
        422,
        "password",
        "a move without the password",
    );
    let moved = ok(
        &s.json(
            "PATCH",
            &path,
            a,
            &json!({"url": "ghcr.io", "password": "new-token", "name": "gh"}),
        )
        .await,
        200,
        "a move with a new password",
    );
    assert_eq!(
        (moved["provider"].as_str(), moved["name"].as_str()),
        (Some("GHCR"), Some("gh"))
    );
    ok(
        &s.json("GET", &path, a, &Value::Null).await,
        404,
        "the old name",
    );

    // What is refused, naming the field.
    for (body, field) in [
        (
            json!({"name": "r", "url": "http://registry.example"}),
            "url",
        ),
        (
            json!({"name": "r", "url": "registry.example", "username": "u"}),
            "password",
        ),
        (
            json!({"name": "r", "url": "registry.example", "auth_type": "AWS_ROLE"}),
            "auth_type",
        ),
        (
            json!({"name": "r", "url": "registry.example", "aws_role_arn": "arn:aws:iam::1:role/r"}),
            "aws_role_arn",
        ),
        (
            json!({"name": "r", "url": "registry.example", "region": "x"}),
            "region",
        ),
        (json!({"name": "../r", "url": "registry.example"}), "name"),
    ] {
        refused(
            &s.json("POST", REGISTRIES, a, &body).await,
            422,
            field,
            &body.to_string(),
        );
    }
    ok(
        &s.json("GET", &format!("{REGISTRIES}?tag=x"), a, &Value::Null)
            .await,
        422,
        "an unknown query parameter",
    );

    ok(
        &s.json("DELETE", &format!("{REGISTRIES}/gh"), b, &Value::Null)
            .await,
        404,
        "delete elsewhere",
    );
    ok(
        &s.json("DELETE", &format!("{REGISTRIES}/gh"), a, &Value::Null)
            .await,
        204,
        "delete",
    );
    ok(
        &s.json("DELETE", &format!("{REGISTRIES}/gh"), a, &Value::Null)
            .await,
        404,
        "delete twice",
    );
    s.stop().await;
}
