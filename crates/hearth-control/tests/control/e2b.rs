//! E2B's control API on the simulated host (issue 20): create with its
//! deadline, get, list with filters and paging, timeout, pause, connect,
//! kill; refusals named; another workspace sees nothing; deadlines acted
//! on by the reaper. The e2b SDK itself drives a real sandbox in the cli's
//! `vm::e2b` suite.

use std::time::Duration;

use hearth_db::Timestamp;
use serde_json::{json, Value};

use crate::harness::{Resp, Server};

async fn call(s: &Server, method: &str, path: &str, key: &str, body: Value) -> Resp {
    s.json(method, path, Some(key), &body).await
}

/// `GET /sandboxes/{id}`'s body.
async fn detail(s: &Server, key: &str, id: &str) -> Value {
    let r = call(s, "GET", &format!("/sandboxes/{id}"), key, json!({})).await;
    r.json()
        .unwrap_or_else(|| panic!("{} {}", r.status, r.text()))
}

fn e2b_error(r: &Resp) -> (u64, String) {
    let v = r.json().unwrap_or_default();
    (
        v["code"].as_u64().unwrap_or_default(),
        v["message"].as_str().unwrap_or_default().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_control_api_on_the_sim_host() {
    let (s, _sim) = Server::on_sim().await;
    let key = s.other.clone();

    // The SDK's default create: base template, 300 s, metadata and env.
    let before = Timestamp::now();
    let r = call(
        &s,
        "POST",
        "/v2/sandboxes",
        &key,
        json!({"templateID": "base", "timeout": 300, "metadata": {"team": "a"}, "envVars": {"X": "1"}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let sb = r.json().unwrap();
    let id = sb["sandboxID"].as_str().unwrap().to_owned();
    assert_eq!(sb["envdVersion"], "0.5.7");
    assert_eq!(sb["alias"], "busybox");
    let token = sb["envdAccessToken"].as_str().unwrap().to_owned();
    assert!(token.len() >= 40, "{token}");

    // Detail: running, its deadline 300 s from the create, its metadata.
    let r = call(&s, "GET", &format!("/sandboxes/{id}"), &key, json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let d = r.json().unwrap();
    assert_eq!(d["state"], "running");
    assert_eq!(d["metadata"]["team"], "a");
    assert_eq!(d["envdAccessToken"], token.as_str());
    ends_within(&d, before, 300);

    // Refusals name the field; nothing is created.
    for (body, field) in [
        (
            json!({"templateID": "base", "network": {"allowOut": ["x"]}}),
            "network",
        ),
        (json!({"templateID": "base", "secure": false}), "secure"),
        (
            json!({"templateID": "base", "autoPauseMemory": false}),
            "autoPauseMemory",
        ),
        (
            json!({"templateID": "base", "autoResume": {"enabled": true}}),
            "autoResume",
        ),
        (json!({"templateID": "base", "timeout": 0}), "timeout"),
        (json!({"templateID": "base", "surprise": 1}), "surprise"),
        (
            json!({"templateID": "no-such-template"}),
            "no-such-template",
        ),
    ] {
        let r = call(&s, "POST", "/v2/sandboxes", &key, body.clone()).await;
        let (code, message) = e2b_error(&r);
        assert!(
            matches!(r.status, 400 | 404) && code == u64::from(r.status) && message.contains(field),
            "{body}: {} {}",
            r.status,
            r.text()
        );
    }

    // A second sandbox, then the list: both, filtered, paged.
    let r = call(
        &s,
        "POST",
        "/sandboxes",
        &key,
        json!({"templateID": "busybox", "metadata": {"team": "b"}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let id2 = r.json().unwrap()["sandboxID"].as_str().unwrap().to_owned();
    let ids = |r: &Resp| -> Vec<String> {
        r.json()
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["sandboxID"].as_str().unwrap().to_owned())
            .collect()
    };
    let r = call(&s, "GET", "/v2/sandboxes", &key, json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(ids(&r), [id2.clone(), id.clone()], "newest first");
    let r = call(
        &s,
        "GET",
        "/v2/sandboxes?metadata=team%3Da",
        &key,
        json!({}),
    )
    .await;
    assert_eq!(ids(&r), [id.as_str()]);
    let r = call(&s, "GET", "/v2/sandboxes?limit=1", &key, json!({})).await;
    assert_eq!(ids(&r), [id2.as_str()]);
    let next = r.header("x-next-token").expect("a next token").to_owned();
    let r = call(
        &s,
        "GET",
        &format!("/v2/sandboxes?limit=1&nextToken={next}"),
        &key,
        json!({}),
    )
    .await;
    assert_eq!(ids(&r), [id.as_str()]);
    assert_eq!(r.header("x-next-token"), None);
    let r = call(&s, "GET", "/v2/sandboxes?template=base", &key, json!({})).await;
    assert_eq!(r.status, 400, "{}", r.text());

    // Another workspace sees none of it.
    let admin = s.admin.clone();
    let r = call(&s, "GET", &format!("/sandboxes/{id}"), &admin, json!({})).await;
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(e2b_error(&r).0, 404);
    let r = call(&s, "GET", "/v2/sandboxes", &admin, json!({})).await;
    assert_eq!(ids(&r), Vec::<String>::new());
    let r = call(&s, "DELETE", &format!("/sandboxes/{id}"), &admin, json!({})).await;
    assert_eq!(r.status, 404);
    // No key: E2B's 401.
    let r = s.json("GET", "/v2/sandboxes", None, &json!({})).await;
    assert_eq!((r.status, e2b_error(&r).0), (401, 401), "{}", r.text());

    // Timeout moves the deadline (sooner too).
    let r = call(
        &s,
        "POST",
        &format!("/sandboxes/{id}/timeout"),
        &key,
        json!({"timeout": 60}),
    )
    .await;
    assert_eq!(r.status, 204, "{}", r.text());
    let d = detail(&s, &key, &id).await;
    ends_within(&d, Timestamp::now(), 60);

    // Pause: paused, its deadline gone; again is 409; connect resumes (201)
    // with a new deadline; connect of a running one is 200.
    let r = call(
        &s,
        "POST",
        &format!("/sandboxes/{id}/pause"),
        &key,
        json!({}),
    )
    .await;
    assert_eq!(r.status, 204, "{}", r.text());
    let d = detail(&s, &key, &id).await;
    assert_eq!(d["state"], "paused");
    let r = call(
        &s,
        "POST",
        &format!("/sandboxes/{id}/pause"),
        &key,
        json!({}),
    )
    .await;
    assert_eq!(r.status, 409, "{}", r.text());
    let r = call(&s, "GET", "/v2/sandboxes?state=paused", &key, json!({})).await;
    assert_eq!(ids(&r), [id.as_str()]);
    let r = call(&s, "GET", "/v2/sandboxes?state=running", &key, json!({})).await;
    assert_eq!(ids(&r), [id2.as_str()]);
    let r = call(
        &s,
        "POST",
        &format!("/v2/sandboxes/{id}/connect"),
        &key,
        json!({"timeout": 120}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json().unwrap()["envdAccessToken"], token.as_str());
    let d = detail(&s, &key, &id).await;
    assert_eq!(d["state"], "running");
    ends_within(&d, Timestamp::now(), 120);
    let r = call(
        &s,
        "POST",
        &format!("/sandboxes/{id}/connect"),
        &key,
        json!({}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());

    // Metrics: one sample of the guest's own figures (the simulated host
    // has no guest: read in the e2b SDK suite); none outside the window
    // asked; a parameter not served is a 400 naming it.
    let later = Timestamp::now().unix_ms() / 1000 + 3600;
    let r = call(
        &s,
        "GET",
        &format!("/sandboxes/{id}/metrics?start={later}"),
        &key,
        json!({}),
    )
    .await;
    assert_eq!((r.status, r.text()), (200, "[]".to_owned()));
    let r = call(
        &s,
        "GET",
        &format!("/sandboxes/{id}/metrics?step=5"),
        &key,
        json!({}),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(e2b_error(&r).1.contains("step"), "{}", r.text());
    let r = call(
        &s,
        "GET",
        &format!("/sandboxes/{id}/metrics"),
        &s.admin,
        json!({}),
    )
    .await;
    assert_eq!(r.status, 404, "another workspace's: {}", r.text());
    // Calls not served are a 501 that says so, not a 404.
    let r = call(&s, "GET", &format!("/sandboxes/{id}/logs"), &key, json!({})).await;
    assert_eq!(r.status, 501, "{}", r.text());

    // envd: a wrong token is 401 before anything is looked up; the right
    // one reaches the sandbox (the simulated host has no guest: 502).
    let envd = |tok: &str| {
        vec![
            ("e2b-sandbox-id".to_owned(), id.clone()),
            ("x-access-token".to_owned(), tok.to_owned()),
        ]
    };
    let raw = crate::harness::RawRequest::new("GET", "/health", &envd("forged"), Vec::new());
    let r = crate::harness::send(s.addr, &raw.bytes()).await;
    assert_eq!(r.status, 401, "{}", r.text());
    let raw = crate::harness::RawRequest::new("GET", "/health", &envd(&token), Vec::new());
    let r = crate::harness::send(s.addr, &raw.bytes()).await;
    assert!(matches!(r.status, 204 | 502), "{} {}", r.status, r.text());
    // Files are root's: another user is refused, not ignored.
    let raw = crate::harness::RawRequest::new(
        "GET",
        "/files?path=/etc/hostname&username=user",
        &envd(&token),
        Vec::new(),
    );
    let r = crate::harness::send(s.addr, &raw.bytes()).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(e2b_error(&r).1.contains("root"), "{}", r.text());

    // Processes: the list (the simulated guest's commands end at once),
    // input to a process that does not run, and what is refused.
    let rpc = |method: &str, body: Value| {
        let mut h = envd(&token);
        h.push(("content-type".to_owned(), "application/json".to_owned()));
        crate::harness::RawRequest::new(
            "POST",
            &format!("/process.Process/{method}"),
            &h,
            body.to_string().into_bytes(),
        )
    };
    let r = crate::harness::send(s.addr, &rpc("List", json!({})).bytes()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json().unwrap(), json!({"processes": []}));
    let input = json!({"process": {"pid": 4242}, "input": {"stdin": "aGk="}});
    let r = crate::harness::send(s.addr, &rpc("SendInput", input).bytes()).await;
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(r.text().contains("process 4242 not found"), "{}", r.text());
    let r = crate::harness::send(
        s.addr,
        &rpc("CloseStdin", json!({"process": {"pid": 4242}})).bytes(),
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.text());
    let by_tag = json!({"process": {"tag": "web"}, "input": {"stdin": "aGk="}});
    let r = crate::harness::send(s.addr, &rpc("SendInput", by_tag).bytes()).await;
    assert_eq!(r.status, 501, "{}", r.text());
    let both = json!({"process": {"pid": 4242}, "input": {"stdin": "aGk=", "pty": "aGk="}});
    let r = crate::harness::send(s.addr, &rpc("SendInput", both).bytes()).await;
    assert_eq!(r.status, 400, "{}", r.text());

    // Deadlines: the reaper deletes a sandbox past its timeout, and pauses
    // one created with autoPause.
    let r = call(
        &s,
        "POST",
        "/v2/sandboxes",
        &key,
        json!({"templateID": "base", "timeout": 30, "autoPause": true}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let id3 = r.json().unwrap()["sandboxID"].as_str().unwrap().to_owned();
    let later = Timestamp::now().plus(Duration::from_secs(600));
    let report = s.control.reap_at(later).await;
    assert!(report.deadlines_expired >= 2, "{report:?}");
    let r = call(&s, "GET", &format!("/sandboxes/{id}"), &key, json!({})).await;
    assert_eq!(r.status, 404, "deleted at its deadline: {}", r.text());
    let d = detail(&s, &key, &id3).await;
    assert_eq!(d["state"], "paused", "{d}");
    // id2 had the API's default 15 s: deleted too.
    let r = call(&s, "GET", &format!("/sandboxes/{id2}"), &key, json!({})).await;
    assert_eq!(r.status, 404, "{}", r.text());

    // Kill.
    let r = call(&s, "DELETE", &format!("/sandboxes/{id3}"), &key, json!({})).await;
    assert_eq!(r.status, 204, "{}", r.text());
    let r = call(&s, "DELETE", &format!("/sandboxes/{id3}"), &key, json!({})).await;
    assert_eq!(r.status, 404, "{}", r.text());
    s.stop().await;
}

/// `endAt` is `secs` after `from`, give or take 5 s (the API writes fixed
/// width UTC, so the strings compare as the times do).
fn ends_within(d: &Value, from: Timestamp, secs: u64) {
    let end = d["endAt"].as_str().unwrap_or_default();
    let at = from.plus(Duration::from_secs(secs));
    let lo = at.minus(Duration::from_secs(5)).to_rfc3339();
    let hi = at.plus(Duration::from_secs(5)).to_rfc3339();
    assert!(
        lo.as_str() <= end && end <= hi.as_str(),
        "endAt {end} not within {lo}..{hi}: {d}"
    );
}

/// E2B's fork over Hearth's: one entry per child, each a running sandbox
/// with its own token and E2B's deadline; refusals named; another
/// workspace's sandbox does not exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_fork_makes_children_with_their_deadlines() {
    let (s, _sim) = Server::on_sim().await;
    let key = s.other.clone();
    let r = call(
        &s,
        "POST",
        "/sandboxes",
        &key,
        json!({"templateID": "base", "timeout": 300}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let parent = r.json().unwrap()["sandboxID"].as_str().unwrap().to_owned();

    let before = Timestamp::now();
    let r = call(
        &s,
        "POST",
        &format!("/sandboxes/{parent}/fork"),
        &key,
        json!({"count": 2, "timeout": 60}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let entries = r.json().unwrap();
    let entries = entries.as_array().unwrap();
    assert_eq!(entries.len(), 2, "{entries:?}");
    let mut tokens = Vec::new();
    for e in entries {
        let child = &e["sandbox"];
        assert!(e.get("error").is_none(), "{e}");
        let id = child["sandboxID"].as_str().unwrap();
        assert_ne!(id, parent);
        assert_eq!(child["envdVersion"], "0.5.7");
        tokens.push(child["envdAccessToken"].as_str().unwrap().to_owned());
        let d = detail(&s, &key, id).await;
        assert_eq!(d["state"], "running", "{d}");
        ends_within(&d, before, 60);
    }
    assert_ne!(tokens[0], tokens[1]);
    // The parent runs on, its deadline untouched.
    let d = detail(&s, &key, &parent).await;
    assert_eq!(d["state"], "running");
    ends_within(&d, before, 300);

    for (body, named) in [
        (json!({"count": 17}), "count"),
        (json!({"count": 0}), "count"),
        (json!({"timeout": 0}), "timeout"),
        (json!({"name": "x"}), "name"),
    ] {
        let r = call(
            &s,
            "POST",
            &format!("/sandboxes/{parent}/fork"),
            &key,
            body.clone(),
        )
        .await;
        let (code, message) = e2b_error(&r);
        assert_eq!((r.status, code), (400, 400), "{body}: {}", r.text());
        assert!(message.contains(named), "{body}: {message}");
    }
    let r = call(
        &s,
        "POST",
        &format!("/sandboxes/{parent}/fork"),
        &s.admin,
        json!({}),
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.text());
    s.stop().await;
}

/// E2B's snapshots over Hearth's capture: `POST /sandboxes/{id}/snapshots`
/// answers once the snapshot is stored, its id is a template a create
/// resumes from, `GET /snapshots` lists it (by sandbox, by name or id,
/// paged), `DELETE /templates/{id}` removes it; refusals named; another
/// workspace sees none of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_snapshots_are_captures_listed_created_from_and_deleted() {
    let (s, _sim) = Server::on_sim().await;
    let key = s.other.clone();
    let create = |template: String| {
        let (s, key) = (&s, key.clone());
        async move {
            call(
                s,
                "POST",
                "/sandboxes",
                &key,
                json!({"templateID": template, "timeout": 300}),
            )
            .await
        }
    };
    let r = create("base".into()).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let source = r.json().unwrap()["sandboxID"].as_str().unwrap().to_owned();
    let snapshots = format!("/sandboxes/{source}/snapshots");

    // The SDK's default: memory and filesystem, a generated name.
    let r = call(&s, "POST", &snapshots, &key, json!({})).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let first = r.json().unwrap();
    let first_id = first["snapshotID"].as_str().unwrap().to_owned();
    let first_name = first["names"][0].as_str().unwrap().to_owned();
    assert!(first_name.starts_with("snapshot-"), "{first}");
    // Named, filesystem only.
    let r = call(
        &s,
        "POST",
        &snapshots,
        &key,
        json!({"name": "nightly:v2", "memory": false}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let second = r.json().unwrap();
    assert_eq!(second["names"], json!(["nightly:v2"]));
    let second_id = second["snapshotID"].as_str().unwrap().to_owned();
    // The source runs on.
    assert_eq!(detail(&s, &key, &source).await["state"], "running");

    // A create from the snapshot's id (the SDK's Sandbox.create(snapshot_id)).
    let r = create(first_id.clone()).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let from = r.json().unwrap()["sandboxID"].as_str().unwrap().to_owned();
    assert_eq!(detail(&s, &key, &from).await["state"], "running");
    let r = create("nightly:v2".into()).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let from_second = r.json().unwrap()["sandboxID"].as_str().unwrap().to_owned();

    // Listed: newest first; by sandbox; by name and by id; paged.
    let list = |q: String| {
        let (s, key) = (&s, key.clone());
        async move { call(s, "GET", &format!("/snapshots{q}"), &key, json!({})).await }
    };
    let ids = |r: &Resp| -> Vec<String> {
        r.json()
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["snapshotID"].as_str().unwrap().to_owned())
            .collect()
    };
    let r = list(String::new()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(ids(&r), [second_id.as_str(), first_id.as_str()]);
    let r = list(format!("?sandboxID={source}")).await;
    assert_eq!(ids(&r), [second_id.as_str(), first_id.as_str()]);
    let r = list(format!("?sandboxID={from}")).await;
    assert!(ids(&r).is_empty(), "{}", r.text());
    assert_eq!(
        ids(&list("?name=nightly:v2".into()).await),
        [second_id.as_str()]
    );
    assert_eq!(
        ids(&list(format!("?name={first_name}")).await),
        [first_id.as_str()]
    );
    assert_eq!(
        ids(&list(format!("?name={first_id}")).await),
        [first_id.as_str()]
    );
    let r = list("?limit=1".into()).await;
    assert_eq!(ids(&r), [second_id.as_str()]);
    let next = r.header("x-next-token").expect("a next page").to_owned();
    let r = list(format!("?limit=1&nextToken={next}")).await;
    assert_eq!(ids(&r), [first_id.as_str()]);

    // Refusals name what they refuse.
    for (body, named) in [
        (json!({"name": "Not A Name!"}), "name"),
        (json!({"memory": "yes"}), "memory"),
        (json!({"mode": "full"}), "mode"),
    ] {
        let r = call(&s, "POST", &snapshots, &key, body.clone()).await;
        let (code, message) = e2b_error(&r);
        assert_eq!((r.status, code), (400, 400), "{body}: {}", r.text());
        assert!(message.contains(named), "{body}: {message}");
    }
    let r = list("?order=asc".into()).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(e2b_error(&r).1.contains("order"), "{}", r.text());

    // Another workspace: no such sandbox, no snapshots, no template.
    let r = call(&s, "POST", &snapshots, &s.admin, json!({})).await;
    assert_eq!(r.status, 404, "{}", r.text());
    let r = call(&s, "GET", "/snapshots", &s.admin, json!({})).await;
    assert!(ids(&r).is_empty(), "{}", r.text());
    let r = call(
        &s,
        "DELETE",
        &format!("/templates/{first_id}"),
        &s.admin,
        json!({}),
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.text());

    // Not while a sandbox made from it exists; then deleted once, and a
    // second time it is not found.
    let template = format!("/templates/{second_id}");
    let delete = || call(&s, "DELETE", &template, &key, json!({}));
    let r = delete().await;
    assert_eq!(r.status, 409, "{}", r.text());
    let r = call(
        &s,
        "DELETE",
        &format!("/sandboxes/{from_second}"),
        &key,
        json!({}),
    )
    .await;
    assert!(r.status < 300, "{} {}", r.status, r.text());
    let r = delete().await;
    assert_eq!(r.status, 204, "{}", r.text());
    let r = call(
        &s,
        "DELETE",
        &format!("/templates/{second_id}"),
        &key,
        json!({}),
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(ids(&list(String::new()).await), [first_id.as_str()]);
    s.stop().await;
}
