//! Fuzz-style test of E2B's door (issue 20), as `vm::fuzz_routes` is of
//! LangSmith's: every E2B control route and every envd route served, with
//! malformed input (bodies of the wrong shape or type, invalid JSON,
//! random bytes, huge values, deep nesting, bad and huge ids, invalid
//! UTF-8 and NUL in paths, wrong content types, broken Connect envelopes,
//! no key, a forged access token), through the real server on the
//! simulated host. Two rules hold for every answer: no 5xx other than
//! E2B's 501 for what is not served (and the 502 of a live sandbox's
//! metrics, which the simulated guest does not report), and every error is
//! E2B's JSON
//! (`{"code": <int>, "message"}` from the control API, Connect's
//! `{"code": <string>, "message"}` from envd, and a Connect stream's error
//! in its end-of-stream envelope).

use serde_json::{json, Value};

use crate::harness::{send, RawRequest, Resp, Rng, Server, TEST_DOMAIN};

const SEED: u64 = 0x6532_6266_757a_7a00;

/// E2B's control routes that take an id or none (`{id}` is replaced):
/// method, path, whether a body goes with it; from the table E2B's router
/// is built from. envd's are walked below, by method.
fn control_routes() -> Vec<(&'static str, &'static str, bool)> {
    hearth_control::E2B_ROUTES
        .iter()
        .filter(|r| r.served && !r.path.contains("{method}") && !r.path.contains('.'))
        .filter(|r| !matches!(r.path, "/files" | "/health"))
        .map(|r| (r.method, r.path, r.body))
        .collect()
}

const PROCESS: &[&str] = &[
    "Start",
    "Connect",
    "SendSignal",
    "SendInput",
    "CloseStdin",
    "List",
    "Update",
    "StreamInput",
];
const FILESYSTEM: &[&str] = &[
    "Stat",
    "ListDir",
    "MakeDir",
    "Remove",
    "Move",
    "CreateWatcher",
    "GetWatcherEvents",
    "RemoveWatcher",
    "WatchDir",
];
const STREAMS: &[&str] = &["Start", "Connect", "StreamInput", "WatchDir"];

fn control_error(r: &Resp) -> Option<String> {
    let v: Value = match r.json() {
        Some(v) => v,
        None => return Some(format!("not JSON: {}", r.text())),
    };
    match (&v["code"], &v["message"]) {
        (Value::Number(c), Value::String(_)) if c.as_u64() == Some(u64::from(r.status)) => None,
        _ => Some(format!("not E2B's error shape: {v}")),
    }
}

fn connect_error(r: &Resp, stream: bool) -> Option<String> {
    if stream && r.status == 200 {
        // The last envelope: flags 0x02, then {"error": {...}}.
        let b = &r.body;
        if b.len() < 5 || b[0] & 0x02 == 0 {
            return Some(format!("a stream without its end: {}", r.text()));
        }
        let v: Value = serde_json::from_slice(&b[5..]).unwrap_or_default();
        return match (&v["error"]["code"], &v["error"]["message"]) {
            (Value::String(_), Value::String(_)) => None,
            _ => Some(format!("a stream's end without an error: {v}")),
        };
    }
    let v: Value = match r.json() {
        Some(v) => v,
        None => return Some(format!("not JSON: {}", r.text())),
    };
    match (&v["code"], &v["message"]) {
        (Value::String(_), Value::String(_)) => None,
        _ => Some(format!("not Connect's error shape: {v}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_routes_answer_malformed_input_in_e2bs_shape_and_never_5xx() {
    let (s, _sim) = Server::on_sim().await;
    let key = s.other.clone();
    let r = s
        .json(
            "POST",
            "/sandboxes",
            Some(&key),
            &json!({"templateID": "base", "timeout": 300}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let sb = r.json().unwrap();
    let live = sb["sandboxID"].as_str().unwrap().to_owned();
    let token = sb["envdAccessToken"].as_str().unwrap().to_owned();
    let mut rng = Rng::new(SEED);
    let mut problems = Vec::new();
    let mut asked = 0;

    let huge = "x".repeat(200_000);
    let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    let mut bodies: Vec<(String, Vec<u8>)> = vec![
        ("empty".into(), Vec::new()),
        ("invalid JSON".into(), b"{\"timeout\":".to_vec()),
        ("an array".into(), b"[]".to_vec()),
        ("a string".into(), b"\"x\"".to_vec()),
        ("deep nesting".into(), deep.into_bytes()),
        (
            "a huge string".into(),
            json!({"name": huge}).to_string().into_bytes(),
        ),
        ("an unknown field".into(), br#"{"surprise": 1}"#.to_vec()),
    ];
    for field in [
        "timeout",
        "templateID",
        "metadata",
        "envVars",
        "count",
        "name",
        "memory",
        "autoPause",
    ] {
        for wrong in [
            json!("x"),
            json!(-1),
            json!([1]),
            json!({"a": {}}),
            json!(1e300),
        ] {
            bodies.push((
                format!("{field}: {wrong}"),
                json!({ field: wrong }).to_string().into_bytes(),
            ));
        }
    }
    bodies.push(("random bytes".into(), rng.bytes(512)));

    // Control routes: each with each body (where it takes one), with bad
    // ids, without a key.
    let ids = [
        live.clone(),
        "nope".to_owned(),
        "%00".to_owned(),
        "%ff%fe".to_owned(),
        "..%2f..%2fetc".to_owned(),
        "a".repeat(5000),
    ];
    for (method, path, with_body) in control_routes().iter() {
        for id in &ids {
            let target = path.replace("{id}", id);
            let cases: Vec<(String, Vec<u8>)> = if *with_body {
                bodies.clone()
            } else {
                vec![("none".into(), Vec::new())]
            };
            for (what, body) in cases {
                // A valid id with a body that could pause or delete it is
                // only sent malformed bodies, which are refused first.
                for authed in [true, false] {
                    let mut headers =
                        vec![("content-type".to_owned(), "application/json".to_owned())];
                    if authed {
                        headers.push(("x-api-key".to_owned(), key.clone()));
                    }
                    if *method == "DELETE" && id == &live && authed {
                        continue;
                    }
                    let raw = RawRequest::new(method, &target, &headers, body.clone());
                    let r = send(s.addr, &raw.bytes()).await;
                    asked += 1;
                    let label = format!("{method} {path} id={:.20} body={what} key={authed}", id);
                    // The simulated guest answers an exec with nothing, so
                    // the metrics of a live sandbox are its 502 (a guest
                    // that does not report its figures).
                    let no_guest = r.status == 502 && path.ends_with("/metrics") && id == &live;
                    if r.status >= 500 && r.status != 501 && !no_guest {
                        problems.push(format!("{label}: {} {}", r.status, r.text()));
                    } else if r.status >= 400 {
                        if let Some(p) = control_error(&r) {
                            problems.push(format!("{label}: {} {p}", r.status));
                        }
                    }
                }
            }
        }
        // Queries of the lists and metrics: unknown, wrong type, huge.
        for q in [
            "?limit=x",
            "?limit=0",
            "?nextToken=%ff",
            "?state=dead",
            "?start=yesterday",
            "?metadata=%zz",
            &format!("?name={}", "n".repeat(9000)),
        ] {
            let target = format!("{}{q}", path.replace("{id}", &live));
            if *method != "GET" {
                continue;
            }
            let headers = vec![("x-api-key".to_owned(), key.clone())];
            let r = send(
                s.addr,
                &RawRequest::new(method, &target, &headers, Vec::new()).bytes(),
            )
            .await;
            asked += 1;
            if r.status >= 500 && r.status != 501 {
                problems.push(format!("GET {target:.80}: {} {}", r.status, r.text()));
            } else if r.status >= 400 {
                if let Some(p) = control_error(&r) {
                    problems.push(format!("GET {target:.80}: {} {p}", r.status));
                }
            }
        }
    }

    // envd: every served method with malformed requests, the sandbox's
    // own token (so what passes the checks reaches the lookup), a forged
    // one and none.
    let envd_bodies: Vec<(String, Vec<u8>, &str)> = vec![
        ("empty".into(), Vec::new(), "application/json"),
        (
            "invalid JSON".into(),
            b"{\"path\":".to_vec(),
            "application/json",
        ),
        ("a number".into(), b"7".to_vec(), "application/json"),
        (
            "unknown field".into(),
            br#"{"nope": 1}"#.to_vec(),
            "application/json",
        ),
        (
            "wrong type".into(),
            br#"{"path": 7, "process": "x", "watcherId": []}"#.to_vec(),
            "application/json",
        ),
        (
            "protobuf".into(),
            vec![0x0a, 0x03, b'a', b'b', b'c'],
            "application/proto",
        ),
        (
            "a short envelope".into(),
            vec![0, 0, 0],
            "application/connect+json",
        ),
        (
            "an envelope longer than its body".into(),
            vec![0, 0, 0, 1, 0, b'{'],
            "application/connect+json",
        ),
        (
            "a compressed envelope".into(),
            vec![1, 0, 0, 0, 2, b'{', b'}'],
            "application/connect+json",
        ),
        (
            "an envelope of garbage".into(),
            [vec![0, 0, 0, 0, 4], b"\xff\xfe{[".to_vec()].concat(),
            "application/connect+json",
        ),
        (
            "random bytes".into(),
            rng.bytes(300),
            "application/connect+json",
        ),
    ];
    for (service, methods) in [
        ("process.Process", PROCESS),
        ("filesystem.Filesystem", FILESYSTEM),
    ] {
        for m in methods {
            let stream = STREAMS.contains(m);
            for tok in [Some(token.as_str()), Some("forged"), None] {
                for (what, body, ct) in &envd_bodies {
                    let mut headers = vec![
                        ("e2b-sandbox-id".to_owned(), live.clone()),
                        ("content-type".to_owned(), (*ct).to_owned()),
                    ];
                    if let Some(t) = tok {
                        headers.push(("x-access-token".to_owned(), t.to_owned()));
                    }
                    let path = format!("/{service}/{m}");
                    let r = send(
                        s.addr,
                        &RawRequest::new("POST", &path, &headers, body.clone()).bytes(),
                    )
                    .await;
                    asked += 1;
                    let label = format!("{path} body={what} token={tok:?}");
                    if r.status >= 500 {
                        problems.push(format!("{label}: {} {}", r.status, r.text()));
                    } else if r.status >= 400 || (stream && r.status == 200) {
                        if let Some(p) = connect_error(&r, stream) {
                            problems.push(format!("{label}: {} {p}", r.status));
                        }
                    } else {
                        problems.push(format!(
                            "{label}: a malformed request answered {}",
                            r.status
                        ));
                    }
                }
            }
        }
    }
    // envd's files: bad paths, users and bodies.
    for target in [
        "/files?path=%00".to_owned(),
        "/files?path=%ff".to_owned(),
        format!("/files?path={}", "p".repeat(9000)),
        // (A user is the guest's to check: the simulated one reads no files.)
        "/files?surprise=1".to_owned(),
    ] {
        for method in ["GET", "POST"] {
            let headers = vec![
                ("e2b-sandbox-id".to_owned(), live.clone()),
                ("x-access-token".to_owned(), token.clone()),
                (
                    "content-type".to_owned(),
                    "multipart/form-data; boundary=zz".to_owned(),
                ),
            ];
            let r = send(
                s.addr,
                &RawRequest::new(method, &target, &headers, b"--zz\r\nbroken".to_vec()).bytes(),
            )
            .await;
            asked += 1;
            if r.status >= 500 {
                problems.push(format!("{method} {target:.60}: {} {}", r.status, r.text()));
            } else if r.status >= 400 {
                if let Some(p) = control_error(&r) {
                    problems.push(format!("{method} {target:.60}: {} {p}", r.status));
                }
            }
        }
    }
    // Sandbox hosts by name and E2b-Sandbox-Port: bad ports, bad and
    // unknown ids, odd paths, with and without tokens. A port that is
    // reached answers what the sandbox answers; everything else is E2B's
    // error, and a 5xx only the 502 of a port that cannot be reached.
    let unknown = uuid::Uuid::now_v7().to_string();
    let host_ids = [live.as_str(), unknown.as_str(), "nope", "%00", "a.b"];
    let ports = [
        "8000", "9000", "49983", "0", "65536", "-1", "x", "", "08000",
    ];
    let paths = [
        "/",
        "/health",
        // A path the guest never sees: the simulated guest reads no files.
        "/files?path=%00",
        "/%00",
        "/a/../../b",
    ];
    for id in host_ids {
        for port in ports {
            for path in paths {
                for (name, value) in [
                    ("host", format!("{port}-{id}.{TEST_DOMAIN}")),
                    ("e2b-sandbox-port", port.to_owned()),
                ] {
                    let mut headers = vec![(name.to_owned(), value.clone())];
                    if name == "e2b-sandbox-port" {
                        headers.push(("e2b-sandbox-id".to_owned(), id.to_owned()));
                    }
                    if rng.below(2) == 0 {
                        headers.push(("x-access-token".to_owned(), token.clone()));
                    }
                    if rng.below(2) == 0 {
                        headers.push(("e2b-traffic-access-token".to_owned(), "forged".into()));
                    }
                    let r = send(
                        s.addr,
                        &RawRequest::new("GET", path, &headers, Vec::new()).bytes(),
                    )
                    .await;
                    asked += 1;
                    let label = format!("GET {path} {name}: {value:.60}");
                    if r.status >= 500 && r.status != 502 {
                        problems.push(format!("{label}: {} {}", r.status, r.text()));
                    } else if r.status >= 400 {
                        if let Some(p) = control_error(&r) {
                            problems.push(format!("{label}: {} {p}", r.status));
                        }
                    }
                }
            }
        }
    }
    eprintln!(
        "{asked} malformed requests to E2B's door; {} problems",
        problems.len()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    s.stop().await;
}
