//! E2B's template builds on the simulated host (issue 41): a build
//! requested, its files uploaded by hash through the URL it gives, started
//! with its steps, run in a builder sandbox to a snapshot, its log paged
//! by offset; the layer cache on a rebuild; a failing step named; the
//! refusals (another workspace, a forged upload URL, files not uploaded,
//! unknown step types, a read-only key). The unmodified SDK builds real
//! templates in the cli's `vm::sdk` E2B suite.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::{send, RawRequest, Resp, Server};

async fn call(s: &Server, method: &str, path: &str, key: &str, body: Value) -> Resp {
    s.json(method, path, Some(key), &body).await
}

/// Requests a build of `name`; its build id.
async fn request(s: &Server, key: &str, name: &str) -> String {
    let r = call(s, "POST", "/v3/templates", key, json!({"name": name})).await;
    assert_eq!(r.status, 202, "{}", r.text());
    let v = r.json().unwrap();
    assert_eq!(v["templateID"], name.split(':').next().unwrap());
    v["buildID"].as_str().unwrap().to_owned()
}

/// Polls the build's status until it ends; its last answer and every log
/// entry, read by offset as the SDK does.
async fn wait(s: &Server, key: &str, name: &str, build: &str) -> (Value, Vec<Value>) {
    let mut entries: Vec<Value> = Vec::new();
    let until = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let r = call(
            s,
            "GET",
            &format!(
                "/templates/{name}/builds/{build}/status?logsOffset={}",
                entries.len()
            ),
            key,
            json!({}),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json().unwrap();
        let page = v["logEntries"].as_array().unwrap().clone();
        assert!(page.len() <= 100);
        let more = !page.is_empty();
        entries.extend(page);
        let status = v["status"].as_str().unwrap().to_owned();
        if (status == "ready" || status == "error") && !more {
            return (v, entries);
        }
        assert!(
            tokio::time::Instant::now() < until,
            "the build did not end: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn messages(entries: &[Value]) -> Vec<String> {
    entries
        .iter()
        .map(|e| e["message"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_build_runs_its_steps_in_a_builder_and_caches_them() {
    let (s, _sim) = Server::on_sim().await;
    let key = s.other.clone();

    // Files by hash: not there, then uploaded through the URL given (no
    // API key: the URL is the credential), then there.
    let build = request(&s, &key, "app").await;
    let hash = "5f".repeat(32);
    let r = call(
        &s,
        "GET",
        &format!("/templates/app/files/{hash}"),
        &key,
        json!({}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let v = r.json().unwrap();
    assert_eq!(v["present"], false);
    let url = v["url"].as_str().unwrap().to_owned();
    let path = &url[url.find("/template-files/").unwrap()..];
    let raw = RawRequest::new("PUT", path, &[], b"not really a tar".to_vec());
    let r = send(s.addr, &raw.bytes()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = call(
        &s,
        "GET",
        &format!("/templates/app/files/{hash}"),
        &key,
        json!({}),
    )
    .await;
    assert_eq!(r.json().unwrap()["present"], true);
    // A forged URL opens nothing; files of another template's unknown name
    // are a 404; a hash is SHA-256 in hex.
    let forged = format!("/template-files/{}x", &path["/template-files/".len()..]);
    let r = send(
        s.addr,
        &RawRequest::new("PUT", &forged, &[], b"x".to_vec()).bytes(),
    )
    .await;
    assert_eq!(r.status, 401, "{}", r.text());
    let r = call(
        &s,
        "GET",
        &format!("/templates/nope/files/{hash}"),
        &key,
        json!({}),
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.text());
    let r = call(&s, "GET", "/templates/app/files/xyz", &key, json!({})).await;
    assert_eq!(r.status, 400, "{}", r.text());

    // A start naming files not uploaded, or a step Hearth does not know,
    // is refused by name; the build still waits.
    let other_hash = "aa".repeat(32);
    for (steps, says) in [
        (
            json!([{"type": "COPY", "args": ["a", "/a"], "filesHash": other_hash}]),
            "were not uploaded",
        ),
        (
            json!([{"type": "SHELL", "args": ["x"]}]),
            "unknown step type",
        ),
        (json!([{"type": "RUN", "args": []}]), "steps[0]"),
        (json!([{"type": "ENV", "args": ["A"]}]), "pairs"),
    ] {
        let r = call(
            &s,
            "POST",
            &format!("/v2/templates/app/builds/{build}"),
            &key,
            json!({"fromTemplate": "busybox", "steps": steps}),
        )
        .await;
        assert_eq!(r.status, 400, "{}", r.text());
        assert!(r.text().contains(says), "{says}: {}", r.text());
    }
    let r = call(
        &s,
        "POST",
        &format!("/v2/templates/app/builds/{build}"),
        &key,
        json!({"fromImage": "x", "fromTemplate": "busybox"}),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());

    // The recipe: env, a command, a working directory, a user, a start
    // command and its ready check.
    let recipe = json!({
        "fromTemplate": "busybox",
        "force": false,
        "steps": [
            {"type": "ENV", "args": ["MODE", "built"], "force": false},
            {"type": "RUN", "args": ["echo first-step", "root"], "force": false},
            {"type": "WORKDIR", "args": ["/srv"], "force": false},
            {"type": "USER", "args": ["user"], "force": false},
            {"type": "RUN", "args": ["echo second-step"], "force": false},
        ],
        "startCmd": "server --port 8000",
        "readyCmd": "ready-check",
    });
    let r = call(
        &s,
        "POST",
        &format!("/v2/templates/app/builds/{build}"),
        &key,
        recipe.clone(),
    )
    .await;
    assert_eq!(r.status, 202, "{}", r.text());
    // Started once.
    let r = call(
        &s,
        "POST",
        &format!("/v2/templates/app/builds/{build}"),
        &key,
        recipe.clone(),
    )
    .await;
    assert_eq!(r.status, 409, "{}", r.text());
    let (done, entries) = wait(&s, &key, "app", &build).await;
    assert_eq!(done["status"], "ready", "{done} {entries:?}");
    assert_eq!(done["templateID"], "app");
    let said = messages(&entries).join("\n");
    for expected in [
        "[2/5] RUN echo first-step (as root)",
        "first-step",
        "[5/5] RUN echo second-step",
        "Started `server --port 8000`",
        "Ready in",
        "Capturing the template with its memory",
        "Published app:latest",
    ] {
        assert!(said.contains(expected), "{expected:?} in {said}");
    }
    // Each entry names its step: the SDK maps a failure to its line.
    assert!(entries.iter().any(|e| e["step"] == "2"), "{entries:?}");
    assert!(entries.iter().any(|e| e["step"] == "finalize"));
    // The template is a snapshot of the workspace with the built settings;
    // the build cache's layers are not listed, and no builder is left.
    let r = call(&s, "GET", "/templates/aliases/app", &key, json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let snaps = call(&s, "GET", "/snapshots", &key, json!({})).await;
    assert!(!snaps.text().contains("hearth-layer-"), "{}", snaps.text());
    let r = call(&s, "GET", "/sandboxes", &key, json!({})).await;
    assert_eq!(
        r.json().unwrap().as_array().unwrap().len(),
        0,
        "{}",
        r.text()
    );
    // The build's log by time (E2B's logs API): forward from a cursor,
    // backward newest first, by level.
    let first_at = entries[0]["timestamp"].as_str().unwrap().to_owned();
    let r = call(
        &s,
        "GET",
        &format!("/templates/app/builds/{build}/logs?limit=3"),
        &key,
        json!({}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let logs = r.json().unwrap()["logs"].as_array().unwrap().clone();
    assert_eq!(logs.len(), 3);
    assert_eq!(logs[0]["timestamp"].as_str().unwrap(), first_at);
    let r = call(
        &s,
        "GET",
        &format!("/templates/app/builds/{build}/logs?direction=backward&limit=1"),
        &key,
        json!({}),
    )
    .await;
    let newest = r.json().unwrap()["logs"][0]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(newest.contains("Build finished"), "{newest}");
    let r = call(
        &s,
        "GET",
        &format!("/templates/app/builds/{build}/logs?level=warn"),
        &key,
        json!({}),
    )
    .await;
    assert_eq!(
        r.json().unwrap()["logs"].as_array().unwrap().len(),
        0,
        "{}",
        r.text()
    );
    let r = call(
        &s,
        "GET",
        &format!("/templates/app/builds/{build}/logs?direction=up"),
        &key,
        json!({}),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    // A sandbox of it.
    let r = call(&s, "POST", "/sandboxes", &key, json!({"templateID": "app"})).await;
    assert_eq!(r.status, 201, "{}", r.text());

    // The unchanged recipe rebuilds from the cache: no builder, every step
    // CACHED, the finished template published again.
    let again = request(&s, &key, "app").await;
    let r = call(
        &s,
        "POST",
        &format!("/v2/templates/app/builds/{again}"),
        &key,
        recipe.clone(),
    )
    .await;
    assert_eq!(r.status, 202, "{}", r.text());
    let (done, entries) = wait(&s, &key, "app", &again).await;
    assert_eq!(done["status"], "ready", "{done}");
    let said = messages(&entries).join("\n");
    assert!(
        said.contains("CACHED [2/5]") && said.contains("CACHED [5/5]"),
        "{said}"
    );
    assert!(!said.contains("Starting a builder"), "{said}");
    // A changed step rebuilds from there on: the first is cached.
    let mut changed = recipe.clone();
    changed["steps"][4]["args"][0] = json!("echo changed-step");
    let third = request(&s, &key, "app").await;
    call(
        &s,
        "POST",
        &format!("/v2/templates/app/builds/{third}"),
        &key,
        changed,
    )
    .await;
    let (done, entries) = wait(&s, &key, "app", &third).await;
    assert_eq!(done["status"], "ready", "{done}");
    let said = messages(&entries).join("\n");
    assert!(said.contains("CACHED [2/5]"), "{said}");
    assert!(
        said.contains("Starting a builder microVM from hearth-layer-"),
        "{said}"
    );
    assert!(
        said.contains("changed-step") && !said.contains("CACHED [5/5]"),
        "{said}"
    );

    // The workspace's templates: E2B's list and one with its builds.
    let r = call(&s, "GET", "/templates", &key, json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let all = r.json().unwrap();
    let app = all
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["templateID"] == "app")
        .unwrap_or_else(|| panic!("{all}"))
        .clone();
    assert_eq!(app["buildCount"], 3, "{app}");
    assert_eq!(app["buildStatus"], "ready");
    assert_eq!(app["names"], json!(["app:latest"]));
    assert!(!all.to_string().contains("hearth-layer-"), "{all}");
    let r = call(&s, "GET", "/templates/app?limit=2", &key, json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json().unwrap();
    assert_eq!(v["builds"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(v["builds"][0]["buildID"], third, "newest first: {v}");
    assert_eq!(v["builds"][0]["status"], "ready");
    let r = call(&s, "GET", "/templates/nothing", &key, json!({})).await;
    assert_eq!(r.status, 404, "{}", r.text());
    let r = call(&s, "GET", "/templates?teamID=t", &key, json!({})).await;
    assert_eq!(r.status, 400, "{}", r.text());
    the_template_routes_of_e2bs_cli(&s, &key).await;

    // A step that fails fails the build, naming it (the simulated guest
    // writes no files, so a copy fails there).
    let bad = request(&s, &key, "bad").await;
    let r = call(
        &s,
        "POST",
        &format!("/v2/templates/bad/builds/{bad}"),
        &key,
        json!({"fromTemplate": "busybox", "steps": [
            {"type": "RUN", "args": ["echo ok"]},
            {"type": "COPY", "args": ["a", "/a"], "filesHash": hash},
        ]}),
    )
    .await;
    assert_eq!(r.status, 202, "{}", r.text());
    let (done, _) = wait(&s, &key, "bad", &bad).await;
    assert_eq!(done["status"], "error", "{done}");
    assert_eq!(done["reason"]["step"], "2", "{done}");
    assert!(
        done["reason"]["message"]
            .as_str()
            .unwrap()
            .contains("step 2"),
        "{done}"
    );
    let r = call(&s, "GET", "/templates/aliases/bad", &key, json!({})).await;
    assert_eq!(r.status, 404, "{}", r.text());

    // Another workspace sees no build of this one's.
    let r = s
        .json(
            "GET",
            &format!("/templates/app/builds/{build}/status"),
            Some(&s.admin),
            &json!({}),
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.text());
    // A bad query parameter is named.
    let r = call(
        &s,
        "GET",
        &format!("/templates/app/builds/{build}/status?level=loud"),
        &key,
        json!({}),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    // A template's name is a snapshot name: the build cache's are not.
    let r = call(
        &s,
        "POST",
        "/v3/templates",
        &key,
        json!({"name": "hearth-layer-x"}),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    let r = call(
        &s,
        "POST",
        "/v3/templates",
        &key,
        json!({"name": "x", "teamID": "t"}),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
}

/// What E2B's CLI asks of the workspace's template `app` (and of no
/// other): the list paged by name (`GET /v2/templates`), the built-in
/// templates (`GET /default-templates`), and `PATCH` of a template, whose
/// `public: true` is refused by name (a template is its workspace's).
async fn the_template_routes_of_e2bs_cli(s: &Server, key: &str) {
    let second = request(s, key, "zeta").await;
    let r = call(
        s,
        "POST",
        &format!("/v2/templates/zeta/builds/{second}"),
        key,
        json!({"fromTemplate": "busybox", "steps": [{"type": "RUN", "args": ["true"]}]}),
    )
    .await;
    assert_eq!(r.status, 202, "{}", r.text());
    let (v, _) = wait(s, key, "zeta", &second).await;
    assert_eq!(v["status"], "ready", "{v}");
    let r = call(s, "GET", "/v2/templates?limit=1", key, json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let page = r.json().unwrap();
    assert_eq!(page.as_array().unwrap().len(), 1, "{page}");
    assert_eq!(page[0]["templateID"], "app", "{page}");
    assert_eq!(r.header("x-next-token"), Some("app"));
    let r = call(
        s,
        "GET",
        "/v2/templates?limit=1&nextToken=app",
        key,
        json!({}),
    )
    .await;
    let page = r.json().unwrap();
    assert_eq!(page[0]["templateID"], "zeta", "{page}");
    assert_eq!(r.header("x-next-token"), None, "the last page");
    for bad in ["/v2/templates?limit=0", "/v2/templates?teamID=t"] {
        let r = call(s, "GET", bad, key, json!({})).await;
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
    }

    let r = call(s, "GET", "/default-templates", key, json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let all = r.json().unwrap();
    let ids: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["templateID"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["busybox", "code-interpreter-v1", "default"], "{all}");
    for t in all.as_array().unwrap() {
        assert_eq!(
            (&t["public"], &t["isDefault"]),
            (&json!(true), &json!(true)),
            "{t}"
        );
    }
    // The one E2B's `base` names (the server's default snapshot) has that
    // alias too.
    for t in all.as_array().unwrap() {
        let id = t["templateID"].as_str().unwrap();
        let aliases = if id == s.cfg.default_snapshot.0 {
            json!([id, "base"])
        } else {
            json!([id])
        };
        assert_eq!(t["aliases"], aliases, "{all}");
    }

    let r = call(s, "PATCH", "/templates/app", key, json!({"public": false})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = call(
        s,
        "PATCH",
        "/v2/templates/app",
        key,
        json!({"public": false}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json().unwrap(), json!({"names": ["app:latest"]}));
    let r = call(
        s,
        "PATCH",
        "/v2/templates/app",
        key,
        json!({"public": true}),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("public"), "{}", r.text());
    let r = call(s, "PATCH", "/templates/app", key, json!({"shared": true})).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("shared"), "{}", r.text());
    for (path, who) in [
        ("/templates/nothing", key),
        ("/templates/busybox", key),
        ("/templates/app", s.admin.as_str()),
    ] {
        let r = call(s, "PATCH", path, who, json!({"public": false})).await;
        assert_eq!(r.status, 404, "{path}: {}", r.text());
    }
}
