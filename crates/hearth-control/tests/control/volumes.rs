//! Workspace volumes through the real server on a simulated host, through
//! both doors: LangSmith's `/api/v2/sandboxes/volumes` and `volumes` on
//! create, E2B's `/volumes` and `volumeMounts`. The rules are one set:
//! one writer at a time and any readers, a held volume not deletable,
//! attaching by its creator or `sandboxes:exec`, never a pool member, a
//! fork's parent or a capture with memory. What the host is given (the
//! mount, its hold) is checked on the simulated host; the real VM's side
//! is `hearth-host`'s `a_volume_outlives_its_vms_and_a_reader_changes_nothing`.

use serde_json::{json, Value};

use crate::harness::{Resp, Server};

const VOLUMES: &str = "/api/v2/sandboxes/volumes";
const BOXES: &str = "/api/v2/sandboxes/boxes";
const GIB: u64 = 1 << 30;

fn ok(r: &Resp, status: u16, what: &str) -> Value {
    assert_eq!(r.status, status, "{what}: {}", r.text());
    r.json().unwrap_or(Value::Null)
}

async fn create_box(s: &Server, key: &str, name: &str, volumes: Value) -> Resp {
    s.json(
        "POST",
        BOXES,
        Some(key),
        &json!({"name": name, "snapshot": "busybox", "volumes": volumes,
                "wait_for_ready": true, "timeout": 60}),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_have_one_writer_and_outlive_their_sandboxes_through_both_doors() {
    let (s, sim) = Server::on_sim().await;
    let (_, a) =
        crate::harness::workspace_key(&s.db, "volumes", hearth_db::Quotas::default()).await;

    // Made: its size a whole GiB, its name unique, checked.
    let made = ok(
        &s.json(
            "POST",
            VOLUMES,
            Some(&a),
            &json!({"name": "data", "size_bytes": GIB + 1, "labels": {"team": "a"}}),
        )
        .await,
        201,
        "create",
    );
    assert_eq!(made["size_bytes"], 2 * GIB);
    assert_eq!(made["status"], "ready");
    assert_eq!(made["attachments"], json!([]));
    let id = made["id"].as_str().unwrap().to_owned();
    let again = s
        .json(
            "POST",
            VOLUMES,
            Some(&a),
            &json!({"name": "data", "size_bytes": GIB}),
        )
        .await;
    ok(&again, 409, "the same name twice");
    let bad = s
        .json(
            "POST",
            VOLUMES,
            Some(&a),
            &json!({"name": "-x", "size_bytes": GIB}),
        )
        .await;
    ok(&bad, 422, "a bad name");
    assert_eq!(bad.field(), "name");
    let bad = s
        .json(
            "POST",
            VOLUMES,
            Some(&a),
            &json!({"name": "big", "size_bytes": 2u64 << 40}),
        )
        .await;
    ok(&bad, 422, "too large");
    assert_eq!(bad.field(), "size_bytes");

    // Its writer: the host is given the mount with the attachment's hold.
    let w = ok(
        &create_box(
            &s,
            &a,
            "writer",
            json!([{"volume": "data", "mount_path": "/mnt/data/"}]),
        )
        .await,
        201,
        "writer",
    );
    assert_eq!(
        w["volumes"],
        json!([{"volume_id": id, "volume_name": "data", "mount_path": "/mnt/data",
                "read_only": false}])
    );
    let writer_id: hearth_types::VmId = w["id"].as_str().unwrap().parse().unwrap();
    let net = sim.network(writer_id).expect("the writer's network");
    let mount = net.mounts[0].volume().expect("a volume mount");
    assert_eq!((mount.volume.as_str(), mount.hold), (id.as_str(), 1));
    assert_eq!(mount.size.bytes(), 2 * GIB);
    assert!(!mount.read_only);

    // A second writer is refused naming the first; readers are not.
    let second = create_box(
        &s,
        &a,
        "second",
        json!([{"volume": id, "mount_path": "/data"}]),
    )
    .await;
    ok(&second, 409, "a second writer");
    assert!(second.text().contains("'writer'"), "{}", second.text());
    ok(
        &create_box(
            &s,
            &a,
            "reader",
            json!([{"volume": "data", "mount_path": "/data", "read_only": true}]),
        )
        .await,
        201,
        "a reader",
    );
    // Mount paths follow the mounts' rules.
    let r = create_box(
        &s,
        &a,
        "sys",
        json!([{"volume": "data", "mount_path": "/etc/x",
                                             "read_only": true}]),
    )
    .await;
    ok(&r, 422, "a system path");
    let r = create_box(
        &s,
        &a,
        "ghost",
        json!([{"volume": "nope", "mount_path": "/d"}]),
    )
    .await;
    ok(&r, 404, "an unknown volume");

    // Listed with its holders; changed.
    let got = ok(
        &s.json("GET", &format!("{VOLUMES}/data"), Some(&a), &Value::Null)
            .await,
        200,
        "get",
    );
    let holders: Vec<(&str, bool)> = got["attachments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["sandbox_name"].as_str().unwrap(),
                h["read_only"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(holders, [("reader", true), ("writer", false)]);
    let changed = ok(
        &s.json(
            "PATCH",
            &format!("{VOLUMES}/{id}"),
            Some(&a),
            &json!({"description": "datasets", "labels": null}),
        )
        .await,
        200,
        "update",
    );
    assert_eq!(changed["description"], "datasets");
    assert_eq!(changed["labels"], json!({}));

    // A holder's memory goes nowhere else: no fork, no capture with it.
    let r = s
        .json(
            "POST",
            &format!("{BOXES}/writer/fork"),
            Some(&a),
            &json!({}),
        )
        .await;
    ok(&r, 409, "a fork of a holder");
    assert!(r.text().contains("volume 'data'"), "{}", r.text());
    let r = s
        .json(
            "POST",
            &format!("{BOXES}/writer/snapshot"),
            Some(&a),
            &json!({"name": "with-mem", "include_memory": true}),
        )
        .await;
    ok(&r, 409, "a capture with memory of a holder");

    // Held: not deleted, naming a holder.
    let r = s
        .json("DELETE", &format!("{VOLUMES}/data"), Some(&a), &Value::Null)
        .await;
    ok(&r, 409, "delete a held volume");
    assert!(r.text().contains("sandbox '"), "{}", r.text());

    // The other workspace sees none of it.
    let b = s.other.clone();
    ok(
        &s.json("GET", &format!("{VOLUMES}/{id}"), Some(&b), &Value::Null)
            .await,
        404,
        "another workspace's volume",
    );
    ok(
        &create_box(
            &s,
            &b,
            "thief",
            json!([{"volume": id, "mount_path": "/d",
                                             "read_only": true}]),
        )
        .await,
        404,
        "another workspace attaches",
    );

    // A key without sandboxes:exec attaches only its own volumes.
    let r = s
        .json(
            "POST",
            "/api/v1/api-key",
            Some(&a),
            &json!({"description": "no exec", "permissions": ["sandboxes:create", "sandboxes:read"]}),
        )
        .await;
    let narrow = ok(&r, 201, "a narrow key")["key"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = create_box(
        &s,
        &narrow,
        "narrow",
        json!([{"volume": "data", "mount_path": "/d",
                                                       "read_only": true}]),
    )
    .await;
    ok(&r, 403, "attach another's volume without sandboxes:exec");

    // The writer gone, the next one takes the next hold.
    for name in ["writer", "reader"] {
        ok(
            &s.json("DELETE", &format!("{BOXES}/{name}"), Some(&a), &Value::Null)
                .await,
            204,
            "delete",
        );
    }

    // E2B's door: the same volume by name, mounted at create, shown in the
    // detail; its own volumes listed with LangSmith's.
    let e = s
        .json("POST", "/volumes", Some(&a), &json!({"name": "e2b-vol"}))
        .await;
    let e2b_vol = ok(&e, 201, "E2B create")["volumeID"]
        .as_str()
        .unwrap()
        .to_owned();
    let list = ok(
        &s.json("GET", "/volumes", Some(&a), &json!({})).await,
        200,
        "list",
    );
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["data", "e2b-vol"]);
    let ls = ok(
        &s.json("GET", &format!("{VOLUMES}/e2b-vol"), Some(&a), &Value::Null)
            .await,
        200,
        "E2B's volume through LangSmith's door",
    );
    assert_eq!(ls["size_bytes"], 4 * GIB);
    let sb = ok(
        &s.json(
            "POST",
            "/sandboxes",
            Some(&a),
            &json!({"templateID": "base", "volumeMounts": [
                {"name": "data", "path": "/mnt/data"},
                {"name": e2b_vol, "path": "/mnt/e2b"},
            ]}),
        )
        .await,
        201,
        "E2B create with volumes",
    );
    let sid = sb["sandboxID"].as_str().unwrap().to_owned();
    let detail = ok(
        &s.json("GET", &format!("/sandboxes/{sid}"), Some(&a), &json!({}))
            .await,
        200,
        "detail",
    );
    assert_eq!(
        detail["volumeMounts"],
        json!([{"name": "data", "path": "/mnt/data"}, {"name": "e2b-vol", "path": "/mnt/e2b"}])
    );
    let vm: hearth_types::VmId = sid.parse().unwrap();
    let holds: Vec<u32> = sim
        .network(vm)
        .unwrap()
        .mounts
        .iter()
        .filter_map(|m| m.volume().map(|v| v.hold))
        .collect();
    // `data`'s third attachment (writer, reader), `e2b-vol`'s first.
    assert_eq!(holds, [3, 1]);
    // E2B's refusal of a held volume's delete is E2B's shape.
    let r = s
        .json(
            "DELETE",
            &format!("/volumes/{e2b_vol}"),
            Some(&a),
            &json!({}),
        )
        .await;
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.json().unwrap()["message"]
        .as_str()
        .unwrap()
        .contains("attached"));
    ok(
        &s.json("DELETE", &format!("/sandboxes/{sid}"), Some(&a), &json!({}))
            .await,
        204,
        "kill",
    );
    // Deleted, its disk too; then unknown to both doors.
    let e2b_vol_disk = format!("volume-{e2b_vol}");
    ok(
        &s.json(
            "DELETE",
            &format!("/volumes/{e2b_vol}"),
            Some(&a),
            &json!({}),
        )
        .await,
        204,
        "E2B delete",
    );
    assert!(!sim.has_volume(&e2b_vol_disk));
    ok(
        &s.json(
            "DELETE",
            &format!("/volumes/{e2b_vol}"),
            Some(&a),
            &json!({}),
        )
        .await,
        404,
        "E2B delete again (the SDK's False)",
    );
    ok(
        &s.json("DELETE", &format!("{VOLUMES}/data"), Some(&a), &Value::Null)
            .await,
        204,
        "LangSmith delete",
    );
    ok(
        &s.json("GET", &format!("{VOLUMES}/{id}"), Some(&a), &Value::Null)
            .await,
        404,
        "gone",
    );
    // A clone: the source's size and labels, what its writer committed;
    // refused while a running sandbox writes the source, named.
    ok(
        &s.json(
            "POST",
            VOLUMES,
            Some(&a),
            &json!({"name": "src", "size_bytes": GIB, "labels": {"k": "v"}}),
        )
        .await,
        201,
        "a source",
    );
    let src_box = ok(
        &create_box(
            &s,
            &a,
            "src-writer",
            json!([{"volume": "src", "mount_path": "/src"}]),
        )
        .await,
        201,
        "a writer of the source",
    );
    let r = s
        .json(
            "POST",
            &format!("{VOLUMES}/src/clone"),
            Some(&a),
            &json!({"name": "y"}),
        )
        .await;
    ok(&r, 409, "a clone while its writer runs");
    assert!(r.text().contains("src-writer"), "{}", r.text());
    ok(
        &s.json(
            "POST",
            &format!("{BOXES}/src-writer/stop"),
            Some(&a),
            &json!({}),
        )
        .await,
        200,
        "stop the writer",
    );
    let clone = ok(
        &s.json(
            "POST",
            &format!("{VOLUMES}/src/clone"),
            Some(&a),
            &json!({"name": "y"}),
        )
        .await,
        201,
        "a clone of a stopped writer's volume",
    );
    assert_eq!(
        (
            &clone["size_bytes"],
            &clone["labels"],
            &clone["attachments"]
        ),
        (&json!(GIB), &json!({"k": "v"}), &json!([]))
    );
    let clone_id = clone["id"].as_str().unwrap();
    assert!(
        sim.has_volume(&format!("volume-{clone_id}")),
        "copied in the store"
    );
    let r = s
        .json(
            "POST",
            &format!("{VOLUMES}/src/clone"),
            Some(&a),
            &json!({"name": "y"}),
        )
        .await;
    ok(&r, 409, "a clone's name taken");
    let r = s
        .json(
            "POST",
            &format!("{VOLUMES}/src/clone"),
            Some(&a),
            &json!({"name": "z", "size_bytes": GIB}),
        )
        .await;
    ok(&r, 422, "a clone's size is its source's");
    let _ = src_box;
}

/// LangSmith's `/usage` (the workspace's use against its quotas, and what
/// it holds) and `boxes.batch_delete` (each deleted or skipped with why);
/// `/usage/costs` is a 501 naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_counts_what_a_workspace_holds_and_batch_delete_says_what_it_skipped() {
    let (s, _sim) = Server::on_sim().await;
    let quotas = hearth_db::Quotas {
        max_sandboxes: Some(10),
        max_cpu: Some(hearth_types::MilliCpu(8000)),
        ..hearth_db::Quotas::default()
    };
    let (_, a) = crate::harness::workspace_key(&s.db, "usage", quotas).await;
    for name in ["u1", "u2", "u3"] {
        ok(&create_box(&s, &a, name, json!([])).await, 201, name);
    }
    ok(
        &s.json("POST", &format!("{BOXES}/u3/stop"), Some(&a), &json!({}))
            .await,
        200,
        "stop",
    );
    ok(
        &s.json(
            "POST",
            VOLUMES,
            Some(&a),
            &json!({"name": "v", "size_bytes": GIB}),
        )
        .await,
        201,
        "a volume",
    );
    let u = ok(
        &s.json("GET", "/api/v2/sandboxes/usage", Some(&a), &Value::Null)
            .await,
        200,
        "usage",
    );
    assert_eq!(u["sandboxes_used"], 3, "{u}");
    assert_eq!(u["sandboxes_limit"], 10, "{u}");
    assert_eq!(u["cpu_limit_millicores"], 8000, "{u}");
    assert_eq!(
        (
            u["sandbox_running_count"].as_u64(),
            u["sandbox_stopped_count"].as_u64()
        ),
        (Some(2), Some(1)),
        "{u}"
    );
    assert!(u["cpu_used_millicores"].as_u64().unwrap() > 0, "{u}");
    assert!(
        u.get("memory_limit_bytes").is_none(),
        "no memory quota: {u}"
    );
    // Another workspace's names are not found there, and skipped.
    let b = s.other.clone();
    ok(
        &create_box(&s, &b, "theirs", json!([])).await,
        201,
        "theirs",
    );
    let r = ok(
        &s.json(
            "POST",
            &format!("{BOXES}/batch-delete"),
            Some(&a),
            &json!({"names": ["u1", "u3", "theirs", "ghost"]}),
        )
        .await,
        200,
        "batch delete",
    );
    assert_eq!(r["deleted"], json!(["u1", "u3"]), "{r}");
    let skipped: Vec<&str> = r["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(skipped, ["theirs", "ghost"], "{r}");
    assert!(
        r["skipped"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("not found"),
        "{r}"
    );
    ok(
        &s.json("GET", &format!("{BOXES}/u1"), Some(&a), &Value::Null)
            .await,
        404,
        "u1 gone",
    );
    ok(
        &s.json("GET", &format!("{BOXES}/theirs"), Some(&b), &Value::Null)
            .await,
        200,
        "theirs kept",
    );
    let r = s
        .json(
            "POST",
            &format!("{BOXES}/batch-delete"),
            Some(&a),
            &json!({"names": ["x"], "all": true}),
        )
        .await;
    ok(&r, 422, "an unknown field");
    let r = s
        .json(
            "GET",
            "/api/v2/sandboxes/usage/costs",
            Some(&a),
            &Value::Null,
        )
        .await;
    ok(&r, 501, "costs");
    assert!(r.text().contains("usage/costs"), "{}", r.text());
    // A sandbox named like the route is reached by its name as any other.
    ok(
        &create_box(&s, &a, "batch-delete", json!([])).await,
        201,
        "a sandbox named batch-delete",
    );
    let path = format!("{BOXES}/batch-delete");
    let got = ok(
        &s.json("GET", &path, Some(&a), &Value::Null).await,
        200,
        "get",
    );
    assert_eq!(got["name"], "batch-delete");
    let changed = ok(
        &s.json("PATCH", &path, Some(&a), &json!({"idle_ttl_seconds": 600}))
            .await,
        200,
        "patch",
    );
    assert_eq!(changed["idle_ttl_seconds"], 600);
    ok(
        &s.json("DELETE", &path, Some(&a), &Value::Null).await,
        204,
        "delete",
    );
    ok(
        &s.json("GET", &path, Some(&a), &Value::Null).await,
        404,
        "gone",
    );
}

/// A content call: `GET /volumecontent/{id}/path?path=` with `token`.
async fn content(s: &Server, id: &str, path: &str, token: Option<&str>) -> Resp {
    let headers: Vec<(String, String)> = token
        .map(|t| vec![("authorization".to_owned(), format!("Bearer {t}"))])
        .unwrap_or_default();
    let raw = crate::harness::RawRequest::new(
        "GET",
        &format!("/volumecontent/{id}/path?path={path}"),
        &headers,
        Vec::new(),
    );
    crate::harness::send(s.addr, &raw.bytes()).await
}

/// The ids of the workspace's sandboxes (E2B's list), and which of them
/// serve a volume's content.
async fn sandboxes(s: &Server, key: &str) -> (Vec<String>, Vec<String>) {
    let list = ok(
        &s.json("GET", "/v2/sandboxes", Some(key), &Value::Null)
            .await,
        200,
        "list",
    );
    let mut all = Vec::new();
    let mut services = Vec::new();
    for sb in list.as_array().unwrap() {
        let id = sb["sandboxID"].as_str().unwrap().to_owned();
        if sb["metadata"]["hearth.volume-content"].is_string() {
            services.push(id.clone());
        }
        all.push(id);
    }
    (all, services)
}

/// E2B's volume content API: the volume's `token` opens it (none for a
/// key that may not); with no sandbox holding the volume, a service
/// sandbox of the caller's holds it (one, reused, listed); a create that
/// attaches the volume ends it, and content calls then go through that
/// sandbox. The file operations themselves run on real VMs (the E2B
/// suite's `test_volume_content`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volumes_content_opens_with_its_token_through_the_sandbox_that_holds_it() {
    let (s, _sim) = Server::on_sim().await;
    let (ws, a) =
        crate::harness::workspace_key(&s.db, "content", hearth_db::Quotas::default()).await;
    let (reader_id, reader) = hearth_control::auth::create_key(&s.db, ws, &["sandboxes:read"], "")
        .await
        .unwrap();
    let made = ok(
        &s.json("POST", "/volumes", Some(&a), &json!({"name": "vc"}))
            .await,
        201,
        "create",
    );
    let id = made["volumeID"].as_str().unwrap().to_owned();
    let token = made["token"].as_str().unwrap().to_owned();
    assert!(!token.is_empty(), "{made}");
    // A read-only key gets no token, and its own API key opens nothing.
    let seen = ok(
        &s.json(
            "GET",
            &format!("/volumes/{id}"),
            Some(&reader),
            &Value::Null,
        )
        .await,
        200,
        "get as a reader",
    );
    assert_eq!(seen["token"], "", "{seen}");
    for (bearer, why) in [
        (None, "missing"),
        (Some("forged"), "forged"),
        (Some(&*reader), "an API key"),
    ] {
        let r = content(&s, &id, "/", bearer).await;
        assert_eq!(r.status, 401, "{why}: {}", r.text());
    }
    assert_eq!(
        sandboxes(&s, &a).await.0.len(),
        0,
        "nothing made for a refusal"
    );
    // Another volume's token does not open this one.
    let other = ok(
        &s.json("POST", "/volumes", Some(&a), &json!({"name": "other"}))
            .await,
        201,
        "another",
    );
    let r = content(&s, &id, "/", other["token"].as_str()).await;
    assert_eq!(r.status, 401, "{}", r.text());

    // The token opens it: a service sandbox holds it, reused by the next
    // call, and shown in the list.
    let r = content(&s, &id, "/", Some(&token)).await;
    let root = ok(&r, 200, "the root");
    assert_eq!(
        (&root["type"], &root["path"], &root["uid"]),
        (&json!("directory"), &json!("/"), &json!(1000))
    );
    let (all, services) = sandboxes(&s, &a).await;
    assert_eq!((all.len(), services.len()), (1, 1), "{all:?}");
    let r = content(&s, &id, "/a/b.txt", Some(&token)).await;
    assert_eq!(ok(&r, 200, "a path")["name"], "b.txt");
    assert_eq!(sandboxes(&s, &a).await.1, services, "reused");
    let r = content(&s, &id, "/a/../../etc", Some(&token)).await;
    assert_eq!(r.status, 400, "{}", r.text());
    // Its label is Hearth's alone.
    let r = s
        .json(
            "POST",
            "/v2/sandboxes",
            Some(&a),
            &json!({"templateID": "busybox", "metadata": {"hearth.volume-content": id}}),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("reserved"), "{}", r.text());

    // A volume whose content is open can be deleted: its service sandbox
    // ends first.
    let other_id = other["volumeID"].as_str().unwrap();
    ok(
        &content(&s, other_id, "/", other["token"].as_str()).await,
        200,
        "the other's root",
    );
    assert_eq!(sandboxes(&s, &a).await.1.len(), 2);
    ok(
        &s.json(
            "DELETE",
            &format!("/volumes/{other_id}"),
            Some(&a),
            &Value::Null,
        )
        .await,
        204,
        "delete while its content is open",
    );
    assert_eq!(sandboxes(&s, &a).await.1, services);

    // A create attaching the volume ends the service sandbox; then the
    // content is reached through the new holder.
    let sb = ok(
        &s.json(
            "POST",
            "/v2/sandboxes",
            Some(&a),
            &json!({"templateID": "busybox", "volumeMounts": [{"name": "vc", "path": "/mnt/vc"}]}),
        )
        .await,
        201,
        "a create attaching it",
    );
    let holder = sb["sandboxID"].as_str().unwrap().to_owned();
    assert_eq!(sandboxes(&s, &a).await, (vec![holder.clone()], vec![]));
    let r = content(&s, &id, "/", Some(&token)).await;
    ok(&r, 200, "through the holder");
    assert_eq!(sandboxes(&s, &a).await.0, vec![holder.clone()]);
    // A holder that does not run is named.
    ok(
        &s.json(
            "POST",
            &format!("/sandboxes/{holder}/pause"),
            Some(&a),
            &json!({}),
        )
        .await,
        204,
        "pause",
    );
    let r = content(&s, &id, "/", Some(&token)).await;
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(
        r.text().contains(&holder) || r.text().contains("attached"),
        "{}",
        r.text()
    );
    // A revoked key's token opens nothing.
    s.db.revoke_api_key(ws, reader_id).await.unwrap();
    let (a_id, _) =
        s.db.list_api_keys(ws)
            .await
            .unwrap()
            .into_iter()
            .map(|k| (k.id, k.revoked_at))
            .find(|(k, _)| *k != reader_id)
            .unwrap();
    s.db.revoke_api_key(ws, a_id).await.unwrap();
    let r = content(&s, &id, "/", Some(&token)).await;
    assert_eq!(r.status, 401, "{}", r.text());
    assert!(r.text().contains("revoked"), "{}", r.text());
    s.stop().await;
}
