//! E2B's control API on the simulated host (issue 20): create with its
//! deadline, get, list with filters and paging, timeout, pause, connect,
//! kill; refusals named; another workspace sees nothing; deadlines acted
//! on by the reaper. The e2b SDK itself drives a real sandbox in the cli's
//! `vm::e2b` suite.

use std::time::Duration;

use hearth_db::Timestamp;
use serde_json::{json, Value};

use hearth_hostapi::sim::SIM_HTTP_PORT;

use crate::harness::{send, RawRequest, Resp, Server, TEST_DOMAIN};

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
    assert_eq!(sb["envdVersion"], "0.6.3");
    assert_eq!(sb["alias"], "busybox");
    let token = sb["envdAccessToken"].as_str().unwrap().to_owned();
    assert!(token.len() >= 40, "{token}");

    // Detail: running, its deadline 300 s from the create, its metadata.
    let r = call(&s, "GET", &format!("/sandboxes/{id}"), &key, json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let d = r.json().unwrap();
    assert_eq!(d["state"], "running");
    assert_eq!(d["metadata"]["team"], "a");
    // Its creator gets a token of its own (each expires on its own).
    assert!(
        d["envdAccessToken"].as_str().is_some_and(|t| t.len() >= 40),
        "{d}"
    );
    ends_within(&d, before, 300);

    // Refusals name the field; nothing is created.
    for (body, field) in [
        (
            json!({"templateID": "base", "network": {"rules": {"*": []}}}),
            "network.rules[*]",
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
    // By template (as a create names it: an alias, a name, an id) and by
    // start time (RFC 3339 at any offset, as the SDK's isoformat sends).
    let between = Timestamp::now();
    let r = call(
        &s,
        "POST",
        "/v2/sandboxes",
        &key,
        json!({"templateID": "default"}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let id3 = r.json().unwrap()["sandboxID"].as_str().unwrap().to_owned();
    let busybox = hearth_control::builtin_snapshot_id("busybox");
    for (query, want) in [
        ("template=base", vec![id2.as_str(), id.as_str()]),
        ("template=busybox", vec![id2.as_str(), id.as_str()]),
        (
            &format!("template={busybox}"),
            vec![id2.as_str(), id.as_str()],
        ),
        ("template=default", vec![id3.as_str()]),
        ("template=no-such-template", vec![]),
        (
            &format!("startedAfter={}", between.to_rfc3339()),
            vec![id3.as_str()],
        ),
        (
            "startedAfter=2999-01-01T00%3A00%3A00.000000%2B02%3A00",
            vec![],
        ),
        (
            "template=busybox&startedAfter=1970-01-01T00%3A00%3A00Z",
            vec![id2.as_str(), id.as_str()],
        ),
    ] {
        let r = call(
            &s,
            "GET",
            &format!("/v2/sandboxes?{query}"),
            &key,
            json!({}),
        )
        .await;
        assert_eq!(r.status, 200, "{query}: {}", r.text());
        assert_eq!(ids(&r), want, "{query}");
    }
    for bad in ["startedAfter=yesterday", "template=a%20b"] {
        let r = call(&s, "GET", &format!("/v2/sandboxes?{bad}"), &key, json!({})).await;
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert_eq!(e2b_error(&r).0, 400, "{bad}");
    }
    let r = call(&s, "DELETE", &format!("/sandboxes/{id3}"), &key, json!({})).await;
    assert_eq!(r.status, 204, "{}", r.text());

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
    // The same key's token for the same sandbox, the same day: the one a
    // signed file URL is checked against; it opens the sandbox.
    let fresh = r.json().unwrap()["envdAccessToken"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(fresh, token);
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

    // Metrics: the guest's own samples, every five seconds, in the window
    // asked (the simulated guest has kept an hour of them), CPU use
    // between each and the one before; the latest of each sandbox asked
    // after; none outside the window; a parameter not served is a 400
    // naming it.
    let minute_ago = Timestamp::now().unix_ms() / 1000 - 60;
    let r = call(
        &s,
        "GET",
        &format!("/sandboxes/{id}/metrics?start={minute_ago}"),
        &key,
        json!({}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let series = r.json().unwrap();
    let series = series.as_array().unwrap();
    assert!((12..=13).contains(&series.len()), "{series:?}");
    for (m, next) in series.iter().zip(series.iter().skip(1)) {
        let t = |m: &Value| m["timestampUnix"].as_i64().unwrap();
        assert!(t(m) >= minute_ago && t(next) - t(m) == 5, "{m} {next}");
        assert_eq!(m["cpuUsedPct"], 25.0, "{m}");
        assert_eq!(m["memUsed"], 1u64 << 28);
        assert_eq!(m["memTotal"], 1u64 << 30);
        assert_eq!(m["diskUsed"], 1u64 << 30);
        assert_eq!(m["cpuCount"], 1);
    }
    let r = call(
        &s,
        "GET",
        &format!("/sandboxes/metrics?sandbox_ids={id},{}", uuid::Uuid::nil()),
        &key,
        json!({}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let latest = r.json().unwrap()["sandboxes"].clone();
    assert_eq!(latest.as_object().map(|o| o.len()), Some(1), "{latest}");
    assert_eq!(latest[&id]["cpuUsedPct"], 25.0, "{latest}");
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
    // Logs: the guest's own, from the sandbox's start; v2 filters by
    // level and text, and pages either way.
    let r = call(&s, "GET", &format!("/sandboxes/{id}/logs"), &key, json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v1 = r.json().unwrap();
    let messages: Vec<&str> = v1["logEntries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["message"].as_str().unwrap())
        .collect();
    assert!(messages.contains(&"process started"), "{v1}");
    assert_eq!(v1["logs"].as_array().unwrap().len(), messages.len(), "{v1}");
    assert_eq!(v1["logEntries"][1]["fields"]["pid"], "101", "{v1}");
    let v2 = |q: &'static str| {
        let path = format!("/v2/sandboxes/{id}/logs?{q}");
        let key = key.clone();
        let s = &s;
        async move {
            let r = call(s, "GET", &path, &key, json!({})).await;
            assert_eq!(r.status, 200, "{q}: {}", r.text());
            r.json().unwrap()["logs"].clone()
        }
    };
    let warn = v2("level=warn").await;
    assert_eq!(warn.as_array().unwrap().len(), 1, "{warn}");
    assert_eq!(warn[0]["level"], "warn");
    let ended = v2("search=ended").await;
    assert_eq!(ended[0]["message"], "process ended", "{ended}");
    let newest = v2("direction=backward&limit=1").await;
    assert_eq!(newest.as_array().unwrap().len(), 1);
    assert_eq!(newest[0]["message"], "the disk is nearly full", "{newest}");
    let r = call(
        &s,
        "GET",
        &format!("/v2/sandboxes/{id}/logs?level=fatal"),
        &key,
        json!({}),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(e2b_error(&r).1.contains("level"), "{}", r.text());
    // Calls not served are a 501 that says so, not a 404.
    let r = call(
        &s,
        "POST",
        &format!("/sandboxes/{id}/refreshes"),
        &key,
        json!({}),
    )
    .await;
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
    // A named user reaches the guest, which acts as them (the simulated
    // one reads no files: 501), as root does.
    for user in ["user", "root"] {
        let raw = crate::harness::RawRequest::new(
            "GET",
            &format!("/files?path=/etc/hostname&username={user}"),
            &envd(&token),
            Vec::new(),
        );
        let r = crate::harness::send(s.addr, &raw.bytes()).await;
        assert!(
            matches!(r.status, 200 | 501 | 502),
            "{user}: {} {}",
            r.status,
            r.text()
        );
    }
    // An upload's metadata and encoding are checked before the guest sees
    // them: each refusal names what it refuses.
    for (name, value, names) in [
        ("x-metadata-Team", "caf\u{e9}", "X-Metadata-team"),
        ("x-metadata-k", "tab\there", "metadata value"),
        ("content-encoding", "br", "Content-Encoding br"),
    ] {
        let mut h = envd(&token);
        h.push((name.to_owned(), value.to_owned()));
        h.push((
            "content-type".to_owned(),
            "application/octet-stream".to_owned(),
        ));
        let raw = crate::harness::RawRequest::new("POST", "/files?path=/tmp/x", &h, b"x".to_vec());
        let r = crate::harness::send(s.addr, &raw.bytes()).await;
        assert_eq!(r.status, 400, "{name}: {}", r.text());
        assert!(e2b_error(&r).1.contains(names), "{name}: {}", r.text());
    }

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
        assert_eq!(child["envdVersion"], "0.6.3");
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

/// A request with its own `Host` (and more headers); the answer.
async fn to_host(s: &Server, host: &str, path: &str, headers: &[(&str, &str)]) -> Resp {
    let mut all = vec![("host".to_owned(), host.to_owned())];
    all.extend(headers.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let req = RawRequest::new("GET", path, &all, Vec::new());
    send(s.addr, &req.bytes()).await
}

/// Sandbox hosts by name (`{port}-{id}.{domain}`) and E2B's
/// `E2b-Sandbox-Port`: a port of a public sandbox is proxied with the
/// browser's cookies but not Hearth's credentials, and only its own
/// cookies come back; envd's port reaches envd's routes only; a sandbox
/// made not public (and any made through LangSmith's API) needs its
/// traffic token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_sandbox_hosts_by_name_reach_its_ports() {
    let (s, _sim) = Server::on_sim().await;
    let key = s.other.clone();
    let r = call(
        &s,
        "POST",
        "/v2/sandboxes",
        &key,
        json!({"templateID": "base"}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let sb = r.json().unwrap();
    let id = sb["sandboxID"].as_str().unwrap().to_owned();
    assert_eq!(sb["domain"], TEST_DOMAIN);
    assert!(sb.get("trafficAccessToken").is_none(), "{sb}");
    let envd_token = sb["envdAccessToken"].as_str().unwrap().to_owned();

    let port = format!("{SIM_HTTP_PORT}-{id}.{TEST_DOMAIN}:8080");
    let r = to_host(
        &s,
        &port,
        "/app/x?y=1",
        &[
            ("cookie", "session=1"),
            ("x-api-key", &key),
            ("x-access-token", &envd_token),
        ],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = r.json().unwrap();
    assert_eq!(seen["request"], "GET /app/x?y=1 HTTP/1.1");
    let headers: Vec<&str> = seen["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_str().unwrap())
        .collect();
    assert!(headers.contains(&"cookie: session=1"), "{headers:?}");
    assert!(
        headers.contains(&format!("host: localhost:{SIM_HTTP_PORT}").as_str()),
        "{headers:?}"
    );
    assert!(
        !headers
            .iter()
            .any(|h| h.starts_with("x-api-key") || h.starts_with("x-access-token")),
        "Hearth's credentials reached the sandbox: {headers:?}"
    );
    let cookies: Vec<&str> = r
        .headers
        .iter()
        .filter(|(k, _)| k == "set-cookie")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(
        cookies,
        ["own=1; Path=/"],
        "a domain cookie would reach every sandbox"
    );

    // A sandbox made to show its services another Host
    // (`maskRequestHost`): they see it, `${PORT}` their port, and its
    // detail says so; a mask that is not a host, or one an update would
    // change, is refused naming it.
    let r = call(
        &s,
        "POST",
        "/v2/sandboxes",
        &key,
        json!({"templateID": "base", "network": {"maskRequestHost": "${PORT}-app.example.com"}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let masked = r.json().unwrap()["sandboxID"].as_str().unwrap().to_owned();
    let r = to_host(
        &s,
        &format!("{SIM_HTTP_PORT}-{masked}.{TEST_DOMAIN}"),
        "/",
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = r.json().unwrap().to_string();
    assert!(
        seen.contains(&format!("host: {SIM_HTTP_PORT}-app.example.com")),
        "{seen}"
    );
    let d = detail(&s, &key, &masked).await;
    assert_eq!(
        d["network"]["maskRequestHost"], "${PORT}-app.example.com",
        "{d}"
    );
    assert_eq!(d["network"]["allowPublicTraffic"], true, "{d}");
    for mask in ["", "a b", "app.example.com/x", "${PORT}\r\nx: y"] {
        let r = call(
            &s,
            "POST",
            "/v2/sandboxes",
            &key,
            json!({"templateID": "base", "network": {"maskRequestHost": mask}}),
        )
        .await;
        assert_eq!(r.status, 400, "{mask:?}: {}", r.text());
        assert!(e2b_error(&r).1.contains("maskRequestHost"), "{}", r.text());
    }
    let r = call(
        &s,
        "PUT",
        &format!("/sandboxes/{masked}/network"),
        &key,
        json!({"maskRequestHost": "other.example.com"}),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(e2b_error(&r).1.contains("maskRequestHost"), "{}", r.text());

    // Nothing listens: E2B's 502, in its shape.
    let r = to_host(&s, &format!("9000-{id}.{TEST_DOMAIN}"), "/", &[]).await;
    assert_eq!(e2b_error(&r).0, 502, "{}", r.text());
    assert!(
        r.text().contains("nothing listens on port 9000"),
        "{}",
        r.text()
    );
    // An unknown sandbox answers as a private one (issue 39: no oracle of
    // which sandboxes exist).
    let r = to_host(
        &s,
        &format!("8000-{}.{TEST_DOMAIN}", uuid::Uuid::now_v7()),
        "/",
        &[],
    )
    .await;
    assert_eq!(e2b_error(&r).0, 403, "{}", r.text());
    assert!(r.text().contains("not public"), "{}", r.text());

    // envd's port: envd's routes (with its token), nothing else.
    let envd = format!("49983-{id}.{TEST_DOMAIN}");
    let r = to_host(&s, &envd, "/health", &[("x-access-token", &envd_token)]).await;
    assert_eq!(r.status, 204, "{}", r.text());
    let r = to_host(&s, &envd, "/files?path=/etc/hostname", &[]).await;
    assert_eq!(
        e2b_error(&r).0,
        401,
        "envd's token is still needed: {}",
        r.text()
    );
    let r = to_host(&s, &envd, "/sandboxes", &[("x-api-key", &key)]).await;
    assert_eq!(e2b_error(&r).0, 404, "{}", r.text());
    // The API's own host is the API.
    let r = to_host(
        &s,
        &format!("api.{TEST_DOMAIN}"),
        "/sandboxes",
        &[("x-api-key", &key)],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());

    // The single sandbox URL: a port named in E2b-Sandbox-Port.
    let r = to_host(
        &s,
        "127.0.0.1",
        "/execute",
        &[("e2b-sandbox-id", &id), ("e2b-sandbox-port", "8000")],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json().unwrap()["request"], "GET /execute HTTP/1.1");
    let r = to_host(
        &s,
        "127.0.0.1",
        "/execute",
        &[("e2b-sandbox-id", &id), ("e2b-sandbox-port", "0")],
    )
    .await;
    assert_eq!(e2b_error(&r).0, 400, "{}", r.text());

    // Not public: only with its traffic token.
    let r = call(
        &s,
        "POST",
        "/v2/sandboxes",
        &key,
        json!({"templateID": "base", "network": {"allowPublicTraffic": false}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let private = r.json().unwrap();
    let pid = private["sandboxID"].as_str().unwrap().to_owned();
    let traffic = private["trafficAccessToken"].as_str().unwrap().to_owned();
    let host = format!("8000-{pid}.{TEST_DOMAIN}");
    let r = to_host(&s, &host, "/", &[]).await;
    assert_eq!(e2b_error(&r).0, 403, "{}", r.text());
    let r = to_host(&s, &host, "/", &[("e2b-traffic-access-token", &envd_token)]).await;
    assert_eq!(e2b_error(&r).0, 403, "another token: {}", r.text());
    let r = to_host(&s, &host, "/", &[("e2b-traffic-access-token", &traffic)]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        !r.text().contains("e2b-traffic-access-token"),
        "the token reached the sandbox: {}",
        r.text()
    );
    // A token opens only its own sandbox.
    let r = to_host(
        &s,
        &format!("8000-{id}.{TEST_DOMAIN}"),
        "/",
        &[("e2b-traffic-access-token", &traffic)],
    )
    .await;
    assert_eq!(r.status, 200, "public anyway: {}", r.text());

    // A sandbox made through LangSmith's API is not public.
    let ls = s.sandbox("ls-made").await;
    let ls_id = ls["id"].as_str().unwrap();
    let r = to_host(&s, &format!("8000-{ls_id}.{TEST_DOMAIN}"), "/", &[]).await;
    assert_eq!(e2b_error(&r).0, 403, "{}", r.text());
}

/// The LangSmith view of sandbox `id`'s access control.
async fn access_of(s: &Server, key: &str, id: String) -> Value {
    let r = s
        .json(
            "GET",
            "/api/v2/sandboxes/boxes?limit=100",
            Some(key),
            &json!({}),
        )
        .await;
    let all = r.json().unwrap();
    all["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["id"] == id.as_str())
        .map(|b| b["proxy_config"]["access_control"].clone())
        .unwrap_or_default()
}

/// E2B's `network`: allowPublicTraffic, and allowOut/denyOut as Hearth's
/// allow or deny list, on create and `PUT /sandboxes/{id}/network`
/// (pushed to the host before the 204); what Hearth cannot honour is a
/// 400 naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_network_on_create_and_update() {
    let (s, sim) = Server::on_sim().await;
    let key = s.other.clone();
    let r = call(
        &s,
        "POST",
        "/v2/sandboxes",
        &key,
        json!({"templateID": "base", "network": {"denyOut": ["0.0.0.0/0"], "allowOut": ["example.com"]}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let id = r.json().unwrap()["sandboxID"].as_str().unwrap().to_owned();
    assert_eq!(
        access_of(&s, &key, id.clone()).await["allow_list"],
        json!(["example.com"])
    );

    let r = call(
        &s,
        "POST",
        "/v2/sandboxes",
        &key,
        json!({"templateID": "base", "network": {"denyOut": ["10.0.0.0/8"]}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let id2 = r.json().unwrap()["sandboxID"].as_str().unwrap().to_owned();
    assert_eq!(
        access_of(&s, &key, id2).await["deny_list"],
        json!(["10.0.0.0/8"])
    );

    // An update replaces the lists, in force on the host when it answers.
    let r = call(
        &s,
        "PUT",
        &format!("/sandboxes/{id}/network"),
        &key,
        json!({"denyOut": ["0.0.0.0/0"], "allowOut": ["pypi.org"]}),
    )
    .await;
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(
        access_of(&s, &key, id.clone()).await["allow_list"],
        json!(["pypi.org"])
    );
    let vm = hearth_types::VmId::from(uuid::Uuid::parse_str(&id).unwrap());
    let pushed = format!(
        "{:?}",
        crate::harness::policy_of(&sim.network(vm).expect("the host has a network"))
    );
    assert!(
        pushed.contains("pypi.org") && !pushed.contains("example.com"),
        "{pushed}"
    );
    // A deny list with exceptions (allow takes precedence, as on E2B):
    // both lists, in force on the host, and reported back.
    let r = call(
        &s,
        "PUT",
        &format!("/sandboxes/{id}/network"),
        &key,
        json!({"denyOut": ["10.0.0.0/8"], "allowOut": ["10.1.1.1"]}),
    )
    .await;
    assert_eq!(r.status, 204, "{}", r.text());
    let pushed = format!(
        "{:?}",
        crate::harness::policy_of(&sim.network(vm).expect("the host has a network")).access
    );
    assert!(
        pushed.starts_with("Some(DenyExcept") && pushed.contains("10.1.1.1"),
        "{pushed}"
    );
    let d = detail(&s, &key, &id).await;
    assert_eq!(d["network"]["denyOut"], json!(["10.0.0.0/8"]), "{d}");
    assert_eq!(d["network"]["allowOut"], json!(["10.1.1.1"]), "{d}");
    let r = call(
        &s,
        "PUT",
        &format!("/sandboxes/{id}/network"),
        &key,
        json!({}),
    )
    .await;
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(
        access_of(&s, &key, id.clone()).await,
        Value::Null,
        "the default again"
    );

    // Transform rules: the proxy's header rules, pushed with the update,
    // the value sealed (LangSmith's door sees an opaque header, set); a
    // proxy_config's own rules stay, E2B's are replaced whole.
    let secret = "tok-4f1d9c";
    let r = call(
        &s,
        "PUT",
        &format!("/sandboxes/{id}/network"),
        &key,
        json!({"allowOut": ["api.x.com"], "denyOut": ["0.0.0.0/0"],
               "rules": {"API.x.com": [{"transform": {"headers": {"Authorization": format!("Bearer {secret}")}}}],
                         "*.x.com": [{"transform": {"headers": {"X-Team": "t"}}}]}}),
    )
    .await;
    assert_eq!(r.status, 204, "{}", r.text());
    let pushed = format!(
        "{:?}",
        crate::harness::policy_of(&sim.network(vm).expect("the host has a network"))
    );
    assert!(
        pushed.contains(&format!("Bearer {secret}")) && pushed.contains("x-team"),
        "the host's proxy got both rules: {pushed}"
    );
    let r = s
        .json(
            "GET",
            "/api/v2/sandboxes/boxes?limit=100",
            Some(&key),
            &json!({}),
        )
        .await;
    let boxes = r.text();
    assert!(!boxes.contains(secret), "the value is sealed: {boxes}");
    let all = r.json().unwrap();
    let mine = all["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["id"] == id.as_str())
        .unwrap()
        .clone();
    let names: Vec<&str> = mine["proxy_config"]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["e2b:api.x.com", "e2b:*.x.com"], "exact first");
    let r = call(
        &s,
        "PUT",
        &format!("/sandboxes/{id}/network"),
        &key,
        json!({"rules": {"api.x.com": [{"transform": {"headers": {"X-Only": "1"}}}]}}),
    )
    .await;
    assert_eq!(r.status, 204, "{}", r.text());
    let pushed = format!(
        "{:?}",
        crate::harness::policy_of(&sim.network(vm).expect("the host has a network"))
    );
    assert!(
        pushed.contains("x-only") && !pushed.contains(secret) && !pushed.contains("x-team"),
        "an update replaces E2B's rules: {pushed}"
    );
    // A secret a rule names must be set.
    let r = call(
        &s,
        "PUT",
        &format!("/sandboxes/{id}/network"),
        &key,
        json!({"rules": {"api.x.com": [{"transform": {"headers": {"A": "${e2b.secrets.NOT_SET}"}}}]}}),
    )
    .await;
    let (code, message) = e2b_error(&r);
    assert_eq!(code, 400, "{}", r.text());
    assert!(message.contains("NOT_SET"), "{message}");

    // Refused, naming the field; nothing changes.
    for (body, field) in [
        (json!({"rules": {"*": [{}]}}), "network.rules[*]"),
        (
            json!({"rules": {"a.test": [{"transform": {"headers": {"A": "${e2b.identity.tokens.aws}"}}}]}}),
            "workload identity",
        ),
        (
            json!({"egressProxy": {"url": "socks5://x:1080"}}),
            "network.egressProxy",
        ),
        (json!({"dnsServers": ["1.1.1.1"]}), "network.dnsServers"),
        (json!({"httpsPorts": [443]}), "httpsPorts"),
        (json!({"allowPublicTraffic": false}), "allowPublicTraffic"),
        (json!({"bogus": 1}), "bogus"),
    ] {
        let r = call(
            &s,
            "PUT",
            &format!("/sandboxes/{id}/network"),
            &key,
            body.clone(),
        )
        .await;
        let (code, message) = e2b_error(&r);
        assert_eq!(code, 400, "{body}: {}", r.text());
        assert!(message.contains(field), "{body}: {message}");
    }
    for (net, field) in [
        (json!({"maskRequestHost": "x y"}), "network.maskRequestHost"),
        (json!({"httpsPorts": [0]}), "network.httpsPorts"),
        (json!({"httpsPorts": "443"}), "network.httpsPorts"),
    ] {
        let r = call(
            &s,
            "POST",
            "/v2/sandboxes",
            &key,
            json!({"templateID": "base", "network": net}),
        )
        .await;
        let (code, message) = e2b_error(&r);
        assert_eq!(code, 400, "{}", r.text());
        assert!(message.contains(field), "{message}");
    }
    // Empty lists ask for what a Hearth sandbox has: accepted.
    let r = call(
        &s,
        "POST",
        "/v2/sandboxes",
        &key,
        json!({"templateID": "base", "network": {"dnsServers": [], "httpsPorts": [],
               "allowOut": ["api.test"], "denyOut": ["0.0.0.0/0"]}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let (dns_id, _) = (
        r.json().unwrap()["sandboxID"].as_str().unwrap().to_owned(),
        (),
    );
    let r = call(
        &s,
        "DELETE",
        &format!("/sandboxes/{dns_id}"),
        &key,
        json!({}),
    )
    .await;
    assert_eq!(r.status, 204, "{}", r.text());
    // Paused: the network changes only while it runs.
    let r = call(
        &s,
        "POST",
        &format!("/sandboxes/{id}/pause"),
        &key,
        json!({}),
    )
    .await;
    assert_eq!(r.status, 204, "{}", r.text());
    let r = call(
        &s,
        "PUT",
        &format!("/sandboxes/{id}/network"),
        &key,
        json!({"denyOut": ["0.0.0.0/0"]}),
    )
    .await;
    let (code, message) = e2b_error(&r);
    assert_eq!(code, 400, "{}", r.text());
    assert!(message.contains("while it is ready"), "{message}");
    // Another workspace's sandbox is not found.
    let r = call(
        &s,
        "PUT",
        &format!("/sandboxes/{id}/network"),
        &s.admin,
        json!({}),
    )
    .await;
    assert_eq!(e2b_error(&r).0, 404, "{}", r.text());
}

/// Sends `body` to `path` and hangs up after `after`, as `curl -m` does.
async fn abandon(s: &Server, path: &str, key: &str, body: Value, after: Duration) {
    use tokio::io::AsyncWriteExt;
    let headers = vec![
        ("content-type".to_owned(), "application/json".to_owned()),
        ("x-api-key".to_owned(), key.to_owned()),
    ];
    let req = RawRequest::new("POST", path, &headers, body.to_string().into_bytes());
    let mut conn = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    conn.write_all(&req.bytes()).await.unwrap();
    tokio::time::sleep(after).await;
    drop(conn);
}

/// The E2B list (running and paused) of `key`'s workspace, polled until
/// `n` sandboxes besides `except` are in it.
async fn listed(s: &Server, key: &str, n: usize, except: &[&str]) -> Vec<Value> {
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let r = call(
            s,
            "GET",
            "/v2/sandboxes?state=running,paused",
            key,
            json!({}),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
        let got: Vec<Value> = r
            .json()
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| !except.contains(&v["sandboxID"].as_str().unwrap_or_default()))
            .cloned()
            .collect();
        if got.len() >= n || tokio::time::Instant::now() > until {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Issue 39, finding 3: a client that hangs up on a create or a fork
/// (`curl -m 1`) still gets what it asked for: the sandbox, or each
/// child, with the deadline it asked for, booted to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_create_or_fork_still_gets_its_deadline() {
    let (s, sim) = Server::on_sim().await;
    let key = s.other.clone();
    sim.set_boot_time(Duration::from_secs(2));
    abandon(
        &s,
        "/sandboxes",
        &key,
        json!({"templateID": "busybox", "timeout": 30}),
        Duration::from_millis(300),
    )
    .await;
    let got = listed(&s, &key, 1, &[]).await;
    assert_eq!(
        got.len(),
        1,
        "the abandoned create made its sandbox: {got:?}"
    );
    // A deadline from the first write (allowing for the boot meanwhile).
    let end = got[0]["endAt"].as_str().unwrap_or_default().to_owned();
    assert!(end.as_str() < "9999", "no deadline while it boots: {end}");
    let id = got[0]["sandboxID"].as_str().unwrap().to_owned();
    // It boots to the end, and its 30 s count from then.
    ready(&s, &id).await;
    counts_from_now(&s, &key, &id, 30).await;

    abandon(
        &s,
        &format!("/sandboxes/{id}/fork"),
        &key,
        json!({"count": 2, "timeout": 40}),
        Duration::from_millis(300),
    )
    .await;
    let children = listed(&s, &key, 2, &[&id]).await;
    assert_eq!(children.len(), 2, "{children:?}");
    for child in &children {
        let cid = child["sandboxID"].as_str().unwrap();
        ready(&s, cid).await;
        counts_from_now(&s, &key, cid, 40).await;
    }
    s.stop().await;
}

/// Waits (at most 5 s: the create's task moves it just after the sandbox
/// turns ready) until sandbox `id`'s deadline is `secs` from now.
async fn counts_from_now(s: &Server, key: &str, id: &str, secs: u64) {
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let d = detail(s, key, id).await;
        let end = d["endAt"].as_str().unwrap_or_default().to_owned();
        let at = Timestamp::now().plus(Duration::from_secs(secs));
        let lo = at.minus(Duration::from_secs(5)).to_rfc3339();
        let hi = at.plus(Duration::from_secs(5)).to_rfc3339();
        if lo <= end && end <= hi {
            return;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "endAt {end} not within {lo}..{hi}: {d}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (at most 20 s) until sandbox `id` has left `provisioning`;
/// asserts it is ready.
async fn ready(s: &Server, id: &str) {
    let id: hearth_types::SandboxId = id.parse().unwrap();
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let row = s.db.get_sandbox_by_id(id).await.unwrap();
        if row.status != hearth_db::SandboxStatus::Provisioning {
            assert_eq!(
                row.status,
                hearth_db::SandboxStatus::Ready,
                "{:?}",
                row.status_message
            );
            return;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "{id} stayed provisioning"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A path under E2B's own (`/sandboxes`, `/templates`, …) that Hearth has
/// no route for is a 501 in E2B's shape naming it, never a 404 an SDK
/// reads as "does not exist" (`Template.exists` of e2b 2.63 asks
/// `/templates/aliases/{alias}`); LangSmith's paths keep their 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_e2b_path_is_a_501_naming_it() {
    let s = Server::start(false).await;
    let key = s.other.clone();
    // What the SDK's Template class calls: a 404 would be read as "does
    // not exist" (`Template.alias_exists`).
    for (method, path) in [
        ("POST", "/sandboxes/abc/refreshes"),
        ("GET", "/sandboxes/abc/unknown"),
        ("GET", "/snapshots/x/y"),
    ] {
        let r = call(&s, method, path, &key, json!({})).await;
        let (code, message) = e2b_error(&r);
        assert_eq!(
            (r.status, code),
            (501, 501),
            "{method} {path}: {}",
            r.text()
        );
        assert!(message.contains(path), "{method} {path}: {message}");
    }
    // A method a route lacks: a 405 in the shape of its door.
    let r = call(&s, "DELETE", "/v3/templates", &key, json!({})).await;
    let (code, message) = e2b_error(&r);
    assert_eq!((r.status, code), (405, 405), "{}", r.text());
    assert!(message.contains("DELETE"), "{message}");
    let r = call(&s, "PUT", "/api/v2/sandboxes/boxes", &key, json!({})).await;
    assert_eq!(r.status, 405, "{}", r.text());
    assert_eq!(r.json().unwrap()["detail"]["error"], "MethodNotAllowed");
    let r = call(&s, "GET", "/api/v2/sandboxes/nothing-here", &key, json!({})).await;
    assert_eq!(r.status, 404, "{}", r.text());
}

/// A template is a snapshot name: `Template.exists` (an alias) is true for
/// a built-in or the workspace's own name, `base` included, false (404)
/// for another workspace's; `Template.get_tags` lists a name's tags, each
/// its snapshot as the build, by name or by a template id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn templates_are_snapshot_names_with_their_tags() {
    let (s, sim) = Server::on_sim().await;
    let (_, key) =
        crate::harness::workspace_key(&s.db, "templates", hearth_db::Quotas::default()).await;
    let (_, other) =
        crate::harness::workspace_key(&s.db, "templates-b", hearth_db::Quotas::default()).await;
    for alias in ["base", "busybox", "code-interpreter-v1"] {
        let r = call(
            &s,
            "GET",
            &format!("/templates/aliases/{alias}"),
            &key,
            json!({}),
        )
        .await;
        assert_eq!(r.status, 200, "{alias}: {}", r.text());
        assert_eq!(r.json().unwrap()["public"], true, "{alias}");
    }
    // The workspace's own snapshot, under two tags.
    let (id, _) = created(&s, &key, json!({"templateID": "busybox"})).await;
    for tag in ["v1", "latest"] {
        let r = call(
            &s,
            "POST",
            &format!("/sandboxes/{id}/snapshots"),
            &key,
            json!({"name": format!("mine:{tag}")}),
        )
        .await;
        assert!(r.status < 300, "{}", r.text());
    }
    let r = call(&s, "GET", "/templates/aliases/mine", &key, json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let alias = r.json().unwrap();
    assert_eq!(alias["public"], false);
    let tags = call(&s, "GET", "/templates/mine/tags", &key, json!({})).await;
    assert_eq!(tags.status, 200, "{}", tags.text());
    let tags = tags.json().unwrap();
    let names: Vec<&str> = tags
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tag"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["latest", "v1"]);
    let latest = &tags[0];
    assert_eq!(latest["buildID"], alias["templateID"]);
    assert!(
        latest["createdAt"].as_str().unwrap().ends_with('Z'),
        "{latest}"
    );
    // By the template's id too.
    let template_id = alias["templateID"].as_str().unwrap();
    let by_id = call(
        &s,
        "GET",
        &format!("/templates/{template_id}/tags"),
        &key,
        json!({}),
    )
    .await;
    assert_eq!(by_id.json().unwrap(), tags);
    // More tags for a build: each a snapshot with the same files (and a
    // copy of its store volumes); a sandbox starts from one.
    let r = call(
        &s,
        "POST",
        "/templates/tags",
        &key,
        json!({"target": "mine:v1", "tags": ["prod", "stable"]}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let assigned = r.json().unwrap();
    assert_eq!(assigned["tags"], json!(["prod", "stable"]));
    let tag_names = |v: Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|t| t["tag"].as_str().unwrap().to_owned())
            .collect()
    };
    let now = call(&s, "GET", "/templates/mine/tags", &key, json!({})).await;
    assert_eq!(
        tag_names(now.json().unwrap()),
        ["latest", "prod", "stable", "v1"]
    );
    let prod = assigned["buildID"].as_str().unwrap();
    assert!(
        sim.has_volume(&format!("snap-{prod}")),
        "its disk copied in the store"
    );
    let (kid, _) = created(&s, &key, json!({"templateID": "mine:prod"})).await;
    let r = call(&s, "DELETE", &format!("/sandboxes/{kid}"), &key, json!({})).await;
    assert_eq!(r.status, 204, "{}", r.text());
    // Removing tags: all found first; a missing one removes none.
    let r = call(
        &s,
        "DELETE",
        "/templates/tags",
        &key,
        json!({"name": "mine", "tags": ["prod", "nope"]}),
    )
    .await;
    assert_eq!(e2b_error(&r).0, 404, "{}", r.text());
    let r = call(
        &s,
        "DELETE",
        "/templates/tags",
        &key,
        json!({"name": "mine", "tags": ["prod", "stable"]}),
    )
    .await;
    assert_eq!(r.status, 204, "{}", r.text());
    let now = call(&s, "GET", "/templates/mine/tags", &key, json!({})).await;
    assert_eq!(tag_names(now.json().unwrap()), ["latest", "v1"]);
    // A built-in's tags are not removed; bad requests name the field.
    let r = call(
        &s,
        "DELETE",
        "/templates/tags",
        &key,
        json!({"name": "busybox", "tags": ["latest"]}),
    )
    .await;
    assert_eq!(e2b_error(&r).0, 403, "{}", r.text());
    for body in [
        json!({"target": "mine:v1", "tags": []}),
        json!({"target": "mine:v1", "tags": ["bad tag"]}),
        json!({"target": "mine:v1", "tags": ["x"], "extra": 1}),
    ] {
        let r = call(&s, "POST", "/templates/tags", &key, body.clone()).await;
        assert_eq!(e2b_error(&r).0, 400, "{body}: {}", r.text());
    }
    // Another workspace's name, and a name nobody has: 404.
    let r = call(
        &s,
        "POST",
        "/templates/tags",
        &other,
        json!({"target": "mine:v1", "tags": ["stolen"]}),
    )
    .await;
    assert_eq!(e2b_error(&r).0, 404, "{}", r.text());
    for (k, alias) in [(&other, "mine"), (&key, "nothing")] {
        let r = call(
            &s,
            "GET",
            &format!("/templates/aliases/{alias}"),
            k,
            json!({}),
        )
        .await;
        assert_eq!(e2b_error(&r).0, 404, "{alias}: {}", r.text());
        let r = call(&s, "GET", &format!("/templates/{alias}/tags"), k, json!({})).await;
        assert_eq!(e2b_error(&r).0, 404, "{alias}: {}", r.text());
    }
    s.stop().await;
}

/// E2B's lifecycle (issue 42): a sandbox made to pause at its timeout
/// keeps its memory (or, with `autoPauseMemory: false`, its disk alone);
/// one made with `autoResume` is resumed by its next envd request, with
/// its lifetime again; one without answers that it is not running until a
/// connect resumes it; a pause asked with `memory: false` keeps the disk
/// alone. `GET` reports the lifecycle as E2B's `SandboxLifecycle`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_lifecycle_pauses_and_resumes_as_asked() {
    let (s, sim) = Server::on_sim().await;
    let key = s.other.clone();
    let (resumes, resumes_token) = created(
        &s,
        &key,
        json!({"templateID": "base", "timeout": 30,
        "autoPause": true, "autoResume": {"enabled": true}}),
    )
    .await;
    let (disk_only, disk_only_token) = created(
        &s,
        &key,
        json!({"templateID": "base", "timeout": 30,
        "autoPause": true, "autoPauseMemory": false}),
    )
    .await;
    let (asked, _) = created(&s, &key, json!({"templateID": "base", "timeout": 3600})).await;
    let d = detail(&s, &key, &resumes).await;
    assert_eq!(
        d["lifecycle"],
        json!({"autoResume": true, "onTimeout": "pause"})
    );
    let d = detail(&s, &key, &disk_only).await;
    assert_eq!(
        d["lifecycle"],
        json!({"autoResume": false, "onTimeout": "pause"})
    );
    let d = detail(&s, &key, &asked).await;
    assert_eq!(
        d["lifecycle"],
        json!({"autoResume": false, "onTimeout": "kill"})
    );

    // Both pause at their deadline: one with its memory, one without.
    let vm = |id: &str| {
        let id: hearth_types::SandboxId = id.parse().unwrap();
        sim.vm(hearth_types::VmId::from(*id.as_uuid()))
            .expect("its VM")
    };
    let report = s
        .control
        .reap_at(Timestamp::now().plus(Duration::from_secs(600)))
        .await;
    assert_eq!(report.deadlines_expired, 2, "{report:?}");
    for id in [&resumes, &disk_only] {
        assert_eq!(detail(&s, &key, id).await["state"], "paused");
    }
    assert!(vm(&resumes).saved.is_some(), "the memory was kept");
    assert!(vm(&disk_only).saved.is_none(), "only the disk was kept");

    // An envd request resumes the one with autoResume, and it has its
    // lifetime again; the other is not running until a connect.
    let r = send(
        s.addr,
        &health_request(&disk_only, &disk_only_token).bytes(),
    )
    .await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert!(e2b_error(&r).1.contains("not running"), "{}", r.text());
    let r = send(s.addr, &health_request(&resumes, &resumes_token).bytes()).await;
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(detail(&s, &key, &resumes).await["state"], "running");
    counts_from_now(&s, &key, &resumes, 30).await;
    let r = call(
        &s,
        "POST",
        &format!("/sandboxes/{disk_only}/connect"),
        &key,
        json!({"timeout": 60}),
    )
    .await;
    assert_eq!(r.status, 201, "resumed: {}", r.text());
    ready(&s, &disk_only).await;
    counts_from_now(&s, &key, &disk_only, 60).await;
    // A connect gives the lifetime's end again: the next deadline pauses.
    let report = s
        .control
        .reap_at(Timestamp::now().plus(Duration::from_secs(120)))
        .await;
    assert_eq!(report.deadlines_expired, 2, "{report:?}");
    assert_eq!(detail(&s, &key, &disk_only).await["state"], "paused");
    assert_eq!(detail(&s, &key, &resumes).await["state"], "paused");

    // A request to a port by name resumes it too; without autoResume the
    // port answers that the sandbox is not running.
    let r = to_host(&s, &format!("8000-{resumes}.{TEST_DOMAIN}"), "/", &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(detail(&s, &key, &resumes).await["state"], "running");
    let r = to_host(&s, &format!("8000-{disk_only}.{TEST_DOMAIN}"), "/", &[]).await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(detail(&s, &key, &disk_only).await["state"], "paused");

    // A pause asked without memory keeps the disk alone.
    let r = call(
        &s,
        "POST",
        &format!("/sandboxes/{asked}/pause"),
        &key,
        json!({"memory": false}),
    )
    .await;
    assert_eq!(r.status, 204, "{}", r.text());
    assert!(vm(&asked).saved.is_none());
    assert_eq!(detail(&s, &key, &asked).await["state"], "paused");

    // What E2B's API does not take together is refused, naming it.
    for (body, field) in [
        (
            json!({"templateID": "base", "autoPause": true, "autoPauseMemory": false,
                "autoResume": {"enabled": true}}),
            "autoResume",
        ),
        (
            json!({"templateID": "base", "autoPause": true, "autoResume": {"enabled": "yes"}}),
            "autoResume.enabled",
        ),
    ] {
        let r = call(&s, "POST", "/v2/sandboxes", &key, body.clone()).await;
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert!(e2b_error(&r).1.contains(field), "{body}: {}", r.text());
    }
    // A sandbox made through LangSmith's API has no deadline: an E2B
    // connect with a timeout gives it one, as asked (it was ignored).
    let ls = s.sandbox("ls-made").await;
    let ls_id = ls["id"].as_str().unwrap().to_owned();
    let admin = s.admin.clone();
    let r = call(
        &s,
        "POST",
        &format!("/sandboxes/{ls_id}/connect"),
        &admin,
        json!({"timeout": 90}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    counts_from_now(&s, &admin, &ls_id, 90).await;
    s.stop().await;
}

/// E2B's secrets are the workspace's: made through E2B's door, listed
/// through LangSmith's; a value LangSmith's door puts is E2B's next
/// version; deleted through either, gone from both. No answer holds a
/// value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_secrets_are_the_workspace_secrets() {
    let s = Server::start(false).await;
    let key = s.other.clone();
    let r = call(
        &s,
        "POST",
        "/secrets",
        &key,
        json!({"name": "SHARED", "value": "v-one", "metadata": {"a": "b"}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let made = r.json().unwrap();
    assert_eq!(made["currentVersion"], 1);
    assert!(!r.text().contains("v-one"), "{}", r.text());
    let id = made["secretID"].as_str().unwrap().to_owned();
    let r = s
        .json(
            "GET",
            "/api/v1/workspaces/current/secrets",
            Some(&key),
            &json!({}),
        )
        .await;
    assert!(r.text().contains("\"SHARED\""), "{}", r.text());
    let r = s
        .json(
            "POST",
            "/api/v1/workspaces/current/secrets",
            Some(&key),
            &json!([{"key": "SHARED", "value": "v-two"}]),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = call(&s, "GET", &format!("/secrets/{id}"), &key, json!({})).await;
    let got = r.json().unwrap();
    assert_eq!(
        (got["currentVersion"].clone(), got["metadata"].clone()),
        (json!(2), json!({"a": "b"})),
        "{got}"
    );
    // Refusals name what they refuse.
    for (body, names) in [
        (json!({"name": "bad-name", "value": "x"}), "bad-name"),
        (json!({"name": "SHARED", "value": "x"}), "already exists"),
        (
            json!({"name": "N", "value": "x", "surprise": 1}),
            "surprise",
        ),
        (
            json!({"name": "N", "value": "x", "metadata": {"k": "v".repeat(2000)}}),
            "metadata",
        ),
    ] {
        let r = call(&s, "POST", "/secrets", &key, body.clone()).await;
        let (code, message) = e2b_error(&r);
        assert!(matches!(code, 400 | 409), "{body}: {}", r.text());
        assert!(message.contains(names), "{body}: {message}");
    }
    // Another workspace sees none of it.
    let r = call(&s, "GET", "/secrets/SHARED", &s.admin, json!({})).await;
    assert_eq!(e2b_error(&r).0, 404, "{}", r.text());
    let r = s
        .json(
            "DELETE",
            "/api/v1/workspaces/current/secrets/SHARED",
            Some(&key),
            &json!({}),
        )
        .await;
    assert!(r.status < 300, "{}", r.text());
    let r = call(&s, "GET", &format!("/secrets/{id}"), &key, json!({})).await;
    assert_eq!(e2b_error(&r).0, 404, "{}", r.text());
    s.stop().await;
}

/// envd's health request for a sandbox, with its token.
fn health_request(id: &str, token: &str) -> RawRequest {
    let headers = vec![
        ("e2b-sandbox-id".to_owned(), id.to_owned()),
        ("x-access-token".to_owned(), token.to_owned()),
    ];
    RawRequest::new("GET", "/health", &headers, Vec::new())
}

/// An E2B create of `body` that must succeed: the sandbox's id and its
/// envd token.
async fn created(s: &Server, key: &str, body: Value) -> (String, String) {
    let r = call(s, "POST", "/v2/sandboxes", key, body).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let sb = r.json().unwrap();
    (
        sb["sandboxID"].as_str().unwrap().to_owned(),
        sb["envdAccessToken"].as_str().unwrap().to_owned(),
    )
}

/// A deadline holds to the second: from it on the sandbox is not running
/// (envd's health, which the SDK's `is_running` asks, is 502), and the
/// deadline timer deletes it without waiting for a reaper pass (a minute
/// apart here, so only the timer can explain it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_holds_to_the_second() {
    let (s, _sim) = Server::on_sim_reaping(Duration::from_secs(60)).await;
    let key = s.other.clone();
    let (id, token) = created(&s, &key, json!({"templateID": "base", "timeout": 300})).await;
    let set = std::time::Instant::now();
    let r = call(
        &s,
        "POST",
        &format!("/sandboxes/{id}/timeout"),
        &key,
        json!({"timeout": 2}),
    )
    .await;
    assert_eq!(r.status, 204, "{}", r.text());
    let deadline = set + Duration::from_secs(2);
    let mut deleted = None;
    while set.elapsed() < Duration::from_secs(20) {
        let status = send(s.addr, &health_request(&id, &token).bytes())
            .await
            .status;
        let now = std::time::Instant::now();
        // (The request's own time either side of the deadline is slack.)
        if now > deadline + Duration::from_millis(100) {
            assert_ne!(
                status,
                204,
                "running {:?} past its deadline",
                now - deadline
            );
        }
        let r = call(&s, "GET", &format!("/sandboxes/{id}"), &key, json!({})).await;
        if r.status == 404 {
            deleted = Some(now - deadline);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let late = deleted.expect("deleted by the deadline timer, before any reaper pass");
    eprintln!("deleted {late:?} after its deadline");
}

/// E2B's lifecycle, to the second: a resumed sandbox's lifetime counts
/// from when it is ready, not from when its (slow) resume began; a request
/// that meets an `autoResume` sandbox whose deadline has passed, its pause
/// not landed yet, waits for the pause and resumes it, rather than being
/// served by a VM about to pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_a_resume_counts_from_ready_and_a_request_waits_for_a_pause() {
    let (s, sim) = Server::on_sim().await;
    let key = s.other.clone();
    let (id, token) = created(
        &s,
        &key,
        json!({"templateID": "base", "timeout": 30,
               "autoPause": true, "autoResume": {"enabled": true}}),
    )
    .await;
    let sid: hearth_types::SandboxId = id.parse().unwrap();
    let report = s
        .control
        .reap_at(Timestamp::now().plus(Duration::from_secs(600)))
        .await;
    assert_eq!(report.deadlines_expired, 1, "{report:?}");
    assert_eq!(detail(&s, &key, &id).await["state"], "paused");

    // A resume that takes 3 s: its 30 s count from its end.
    sim.set_boot_time(Duration::from_secs(3));
    let r = send(s.addr, &health_request(&id, &token).bytes()).await;
    assert_eq!(r.status, 204, "{}", r.text());
    let answered = Timestamp::now();
    let d =
        s.db.deadlines_of(&[sid])
            .await
            .unwrap()
            .remove(&sid)
            .unwrap();
    let left = d.expires_at.unix_ms() - answered.unix_ms();
    assert!(
        (28_500..=30_500).contains(&left),
        "the lifetime counts from ready: {left} ms left"
    );
    sim.set_boot_time(Duration::ZERO);

    // Its deadline passes; the pause lands a second later. A request sent
    // meanwhile waits for it, then resumes the sandbox.
    s.db.set_deadline(&hearth_db::Deadline {
        expires_at: Timestamp::now().minus(Duration::from_millis(10)),
        ..d
    })
    .await
    .unwrap();
    let control = s.control.clone();
    let reaper = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        control.reap_at(Timestamp::now()).await
    });
    let r = send(s.addr, &health_request(&id, &token).bytes()).await;
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(reaper.await.unwrap().deadlines_expired, 1);
    assert_eq!(
        detail(&s, &key, &id).await["state"],
        "running",
        "the request resumed it after its pause"
    );
    counts_from_now(&s, &key, &id, 30).await;
}

/// E2B's signed file URLs (a secure sandbox's `download_url` and
/// `upload_url`, which carry no token): a signature made with the
/// sandbox's envd token for the URL's path, operation and user opens the
/// file through the sandbox's host; another path, operation or token, a
/// past expiration, or a key revoked since are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_signed_file_urls_open_a_file_without_the_token() {
    use base64::Engine;
    use sha2::Digest;
    let (s, _sim) = Server::on_sim().await;
    let (ws, key) = crate::harness::workspace_key(&s.db, "signed", Default::default()).await;
    let (id, token) = created(&s, &key, json!({"templateID": "base"})).await;
    let host = format!("49983-{id}.{TEST_DOMAIN}");
    // As the SDK's `get_signature` makes them.
    let sign = |path: &str, op: &str, user: &str, tok: &str, exp: Option<i64>| {
        let raw = match exp {
            Some(e) => format!("{path}:{op}:{user}:{tok}:{e}"),
            None => format!("{path}:{op}:{user}:{tok}"),
        };
        let digest = sha2::Sha256::digest(raw.as_bytes());
        format!(
            "v1_{}",
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
        )
    };
    let url = |path: &str, user: Option<&str>, sig: &str, exp: Option<i64>| {
        let mut q = form_urlencoded::Serializer::new(String::new());
        q.append_pair("path", path);
        if let Some(u) = user {
            q.append_pair("username", u);
        }
        q.append_pair("signature", sig);
        if let Some(e) = exp {
            q.append_pair("signature_expiration", &e.to_string());
        }
        format!("/files?{}", q.finish())
    };
    // Past authentication, the request reaches the guest (the simulated
    // one reads no files: 501); a refusal is E2B's 401.
    let opens = |r: &Resp| matches!(r.status, 200 | 501);
    let path = "/home/user/report.csv";
    let later = Timestamp::now().unix_ms() / 1000 + 600;
    let earlier = Timestamp::now().unix_ms() / 1000 - 1;
    for (what, target, ok) in [
        (
            "signed",
            url(path, None, &sign(path, "read", "", &token, None), None),
            true,
        ),
        (
            "signed with an expiration",
            url(
                path,
                None,
                &sign(path, "read", "", &token, Some(later)),
                Some(later),
            ),
            true,
        ),
        (
            "signed as a user",
            url(
                path,
                Some("root"),
                &sign(path, "read", "root", &token, None),
                None,
            ),
            true,
        ),
        (
            "expired",
            url(
                path,
                None,
                &sign(path, "read", "", &token, Some(earlier)),
                Some(earlier),
            ),
            false,
        ),
        (
            "the expiration changed",
            url(
                path,
                None,
                &sign(path, "read", "", &token, Some(later)),
                Some(later + 60),
            ),
            false,
        ),
        (
            "for a write",
            url(path, None, &sign(path, "write", "", &token, None), None),
            false,
        ),
        (
            "another path",
            url(
                "/etc/shadow",
                None,
                &sign(path, "read", "", &token, None),
                None,
            ),
            false,
        ),
        (
            "another user",
            url(
                path,
                Some("root"),
                &sign(path, "read", "", &token, None),
                None,
            ),
            false,
        ),
        (
            "a forged token",
            url(path, None, &sign(path, "read", "", "forged", None), None),
            false,
        ),
        ("garbage", url(path, None, "v1_%%%", None), false),
    ] {
        let r = to_host(&s, &host, &target, &[]).await;
        if ok {
            assert!(opens(&r), "{what}: {} {}", r.status, r.text());
        } else {
            assert_eq!(
                (r.status, e2b_error(&r).0),
                (401, 401),
                "{what}: {}",
                r.text()
            );
        }
    }
    // An upload URL is signed for a write.
    let upload = |op: &str| {
        let h = vec![
            ("host".to_owned(), host.clone()),
            (
                "content-type".to_owned(),
                "application/octet-stream".to_owned(),
            ),
        ];
        RawRequest::new(
            "POST",
            &url(path, None, &sign(path, op, "", &token, None), None),
            &h,
            b"a,b\n".to_vec(),
        )
    };
    let r = send(s.addr, &upload("write").bytes()).await;
    assert!(opens(&r), "an upload URL: {} {}", r.status, r.text());
    let r = send(s.addr, &upload("read").bytes()).await;
    assert_eq!(
        r.status,
        401,
        "a read signature uploads nothing: {}",
        r.text()
    );
    // Another workspace's token signs nothing here.
    let (_, other_token) = created(&s, &s.other.clone(), json!({"templateID": "base"})).await;
    let r = to_host(
        &s,
        &host,
        &url(
            path,
            None,
            &sign(path, "read", "", &other_token, None),
            None,
        ),
        &[],
    )
    .await;
    assert_eq!(r.status, 401, "{}", r.text());
    // Revoking the key ends the URLs it signed.
    let key_id =
        s.db.find_api_key(&hearth_control::auth::hash_key(&key))
            .await
            .unwrap()
            .unwrap()
            .id;
    s.db.revoke_api_key(ws, key_id).await.unwrap();
    let r = to_host(
        &s,
        &host,
        &url(path, None, &sign(path, "read", "", &token, None), None),
        &[],
    )
    .await;
    assert_eq!(r.status, 401, "after the key's revocation: {}", r.text());
}
