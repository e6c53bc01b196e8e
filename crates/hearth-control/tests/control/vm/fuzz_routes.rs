//! Fuzz-style test of the whole public API (issue 6): for every path and
//! method of `crates/hearth-api/openapi.json`, malformed and oversized
//! input through the real server, with and without a valid API key, and
//! two rules that must hold for every answer: no 5xx, ever, and every 4xx
//! carries a JSON body in LangSmith's envelope (`detail` an object with
//! `error`, `error_id` and `message`, or FastAPI's validation list).
//!
//! Cases per route: path parameters (invalid UTF-8, NUL, `..`, huge,
//! wrong types, seeded random bytes), query parameters (each declared one
//! and an unknown one missing, repeated, empty, NUL, invalid UTF-8, wrong
//! type, huge), bodies (empty, invalid JSON, JSON of the wrong type, deep
//! nesting, huge strings and keys, each field of the body's schema with a
//! value of the wrong type, random bytes, the wrong content type, over the
//! size limit, a malformed chunked encoding, broken multipart forms),
//! headers (too large, too many, garbage ranges and validators, a
//! WebSocket upgrade) and methods the route does not have. Data-plane
//! routes run against one live busybox sandbox, so the requests that get
//! that far reach a real guest; the routes that could destroy it (delete,
//! stop, start) are aimed at a name that does not exist.
//!
//! A few requests are malformed at the HTTP level (a `Content-Length` that
//! is not a number, a garbled request line): hyper refuses those itself,
//! before Hearth sees them, with an empty body; for them only "no 5xx" is
//! asserted.

use std::collections::BTreeSet;

use crate::harness::{envelope_problem, send, RawRequest, Resp, Rng, Server};
use serde_json::{json, Value};

/// Seed of the generator behind the random cases (change it to explore).
const SEED: u64 = 0x6865_6172_7468_0006;
const LIVE: &str = "fuzz-live";
const ABSENT: &str = "fuzz-absent";

/// One operation of the document.
struct Route {
    method: String,
    /// The path as served, `{params}` still in it; data-plane paths get
    /// the `/dataplane/{dp}` prefix.
    template: String,
    query: Vec<(String, bool)>,
    /// Content type and (resolved) schema of the request body.
    body: Option<(String, Value)>,
}

impl Route {
    fn label(&self) -> String {
        format!("{} {}", self.method.to_uppercase(), self.template)
    }

    fn destructive(&self) -> bool {
        self.method == "delete"
            || self.template.ends_with("/start")
            || self.template.ends_with("/stop")
    }

    fn params(&self) -> Vec<String> {
        self.template
            .split('/')
            .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(str::to_owned)
            .collect()
    }
}

fn routes() -> Vec<Route> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../hearth-api/openapi.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        let template = if item.get("servers").is_some() {
            format!("/dataplane/{{dp}}{path}")
        } else {
            path.clone()
        };
        for (method, op) in item.as_object().unwrap() {
            if !["get", "post", "put", "patch", "delete"].contains(&method.as_str()) {
                continue;
            }
            let query = op["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["in"] == "query")
                .map(|p| {
                    (
                        p["name"].as_str().unwrap().to_owned(),
                        p["required"] == true,
                    )
                })
                .collect();
            let body = op["requestBody"]["content"]
                .as_object()
                .and_then(|c| c.iter().next())
                .map(|(ct, media)| (ct.clone(), resolve(&doc, &media["schema"])));
            out.push(Route {
                method: method.clone(),
                template: template.clone(),
                query,
                body,
            });
        }
    }
    out
}

/// A schema with its `$ref` (or the non-null arm of a nullable `oneOf`)
/// followed, one level deep.
fn resolve(doc: &Value, schema: &Value) -> Value {
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.rsplit('/').next().unwrap();
        return doc["components"]["schemas"][name].clone();
    }
    if let Some(arms) = schema["oneOf"].as_array() {
        if let Some(arm) = arms.iter().find(|a| a["type"] != "null") {
            return resolve(doc, arm);
        }
    }
    schema.clone()
}

/// Values of the wrong JSON type for a property of `schema`.
fn wrong_values(schema: &Value) -> Vec<Value> {
    let ty = match &schema["type"] {
        Value::String(t) => t.clone(),
        Value::Array(ts) => ts
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("")
            .to_owned(),
        _ if schema.get("$ref").is_some() || schema.get("oneOf").is_some() => "object".into(),
        _ => String::new(),
    };
    match ty.as_str() {
        "string" => vec![json!(12345), json!(["x"])],
        "integer" | "number" => vec![json!("12"), json!({"n": 1}), json!(1e300)],
        "boolean" => vec![json!("yes"), json!(1)],
        "array" => vec![json!({"a": 1}), json!("x")],
        "object" => vec![json!([1, 2]), json!("x"), json!(7)],
        _ => vec![json!([[[]]])],
    }
}

/// One request to send (with and without the key).
struct Case {
    name: String,
    method: String,
    /// Percent-encoded request target.
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    chunked: Option<Vec<u8>>,
    /// hyper answers these itself (empty body): only "no 5xx" holds.
    protocol: bool,
}

struct Live {
    id: String,
}

/// Path-parameter values, already percent-encoded.
fn path_values(rng: &mut Rng) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = [
        ("invalid utf-8", "%C3%28"),
        ("lone byte", "%FF"),
        ("nul", "%00"),
        ("inner nul", "a%00b"),
        ("dotdot", ".."),
        ("encoded dotdot", "%2E%2E"),
        ("traversal", "..%2F..%2Fetc%2Fpasswd"),
        ("negative", "-1"),
        ("float", "1.5"),
        ("bool", "true"),
        ("null", "null"),
        ("json object", "%7B%7D"),
        ("json array", "%5B%5D"),
        ("nil uuid", "00000000-0000-0000-0000-000000000000"),
        ("percent", "%25"),
        ("encoded slash", "a%2Fb"),
        ("space", "%20"),
        ("unicode", "%E2%98%83"),
    ]
    .iter()
    .map(|(n, v)| (n.to_string(), v.to_string()))
    .collect();
    v.push(("huge".into(), "x".repeat(8000)));
    v.push(("over the target limit".into(), "x".repeat(20_000)));
    for i in 0..3 {
        let n = 1 + rng.below(40);
        let enc: String = rng.bytes(n).iter().map(|b| format!("%{b:02X}")).collect();
        v.push((format!("random bytes {i}"), enc));
    }
    v
}

/// Query-parameter values, already percent-encoded.
fn query_values() -> Vec<(&'static str, String)> {
    vec![
        ("empty", String::new()),
        ("nul", "%00".into()),
        ("invalid utf-8", "%C3%28".into()),
        ("negative", "-1".into()),
        ("float", "1.5".into()),
        ("word", "abc".into()),
        ("bool", "true".into()),
        ("root", "/".into()),
        ("directory", "/etc".into()),
        ("dotdot", "..".into()),
        ("huge", "q".repeat(6000)),
        ("bytes", "%FF%FE%00%01".into()),
    ]
}

/// A small `multipart/form-data` body with one `file` field.
fn multipart(field: &str, content: &[u8], close: bool) -> Vec<u8> {
    let mut b = format!(
        "--fuzzb\r\ncontent-disposition: form-data; name=\"{field}\"; filename=\"f\"\r\n\r\n"
    )
    .into_bytes();
    b.extend_from_slice(content);
    if close {
        b.extend_from_slice(b"\r\n--fuzzb--\r\n");
    }
    b
}

const MULTIPART: &str = "multipart/form-data; boundary=fuzzb";

fn cases(route: &Route, live: &Live, rng: &mut Rng) -> Vec<Case> {
    let params = route.params();
    // The value each parameter takes when it is not the one being fuzzed.
    let good = |p: &str| -> String {
        match p {
            "dp" => live.id.clone(),
            "name" if route.destructive() => ABSENT.into(),
            "name" => LIVE.into(),
            "snapshot_id" => "busybox".into(),
            "token" => "not-a-token".into(),
            _ => "x".into(),
        }
    };
    let fill = |over: Option<(&str, &str)>| -> String {
        let mut t = route.template.clone();
        for p in &params {
            let v = match over {
                Some((name, v)) if name == p => v.to_owned(),
                _ => good(p),
            };
            t = t.replace(&format!("{{{p}}}"), &v);
        }
        t
    };
    let base_target = {
        let t = fill(None);
        // Routes with a required `path` get a harmless one by default.
        if route.query.iter().any(|(n, r)| n == "path" && *r) {
            format!("{t}?path=/tmp/fuzz-file")
        } else {
            t
        }
    };
    let (base_ct, base_body) = match &route.body {
        Some((ct, _)) if ct.starts_with("multipart/") => {
            (MULTIPART.to_owned(), multipart("file", b"fuzz", true))
        }
        Some(_) => ("application/json".to_owned(), b"{}".to_vec()),
        None => ("application/json".to_owned(), Vec::new()),
    };
    let method = route.method.to_uppercase();
    let case = |name: String, target: String, ct: &str, body: Vec<u8>| Case {
        name,
        method: method.clone(),
        target,
        headers: vec![("content-type".into(), ct.into())],
        body,
        chunked: None,
        protocol: false,
    };
    let mut out = Vec::new();
    out.push(case(
        "baseline".into(),
        base_target.clone(),
        &base_ct,
        base_body.clone(),
    ));

    // Path parameters.
    for p in &params {
        for (what, v) in path_values(rng) {
            let mut target = fill(Some((p, &v)));
            if let Some(q) = base_target.split_once('?').map(|(_, q)| q) {
                target = format!("{target}?{q}");
            }
            out.push(case(
                format!("path {p}: {what}"),
                target,
                &base_ct,
                base_body.clone(),
            ));
        }
    }

    // Query parameters: each declared one, and one the route does not know.
    let path_only = fill(None);
    let mut names: Vec<String> = route.query.iter().map(|(n, _)| n.clone()).collect();
    names.push("unknown_param".into());
    for name in &names {
        out.push(case(
            format!("query {name}: repeated"),
            format!("{path_only}?{name}=a&{name}=b"),
            &base_ct,
            base_body.clone(),
        ));
        for (what, v) in query_values() {
            out.push(case(
                format!("query {name}: {what}"),
                format!("{path_only}?{name}={v}"),
                &base_ct,
                base_body.clone(),
            ));
        }
    }
    for (what, q) in [
        ("missing", String::new()),
        ("bare key", "?path".to_owned()),
        ("invalid utf-8 key", "?%FF=1".to_owned()),
        ("empty pairs", "?&&=&=&".to_owned()),
        (
            "1000 labels",
            format!(
                "?{}",
                (0..1000)
                    .map(|i| format!("label=l{i}"))
                    .collect::<Vec<_>>()
                    .join("&")
            ),
        ),
        ("page size 0", "?page_size=0&limit=0".to_owned()),
        (
            "page size huge",
            "?page_size=99999999999999999999".to_owned(),
        ),
        ("bad cursor", "?cursor=%FF%00garbage".to_owned()),
        ("bad enum", "?status=exploded&sort_by=%00".to_owned()),
    ] {
        out.push(case(
            format!("query: {what}"),
            format!("{path_only}{q}"),
            &base_ct,
            base_body.clone(),
        ));
    }

    // Bodies.
    let json_body = |name: &str, body: Vec<u8>| {
        case(name.into(), base_target.clone(), "application/json", body)
    };
    for (what, body) in [
        ("empty", Vec::new()),
        ("whitespace", b"  \n\t ".to_vec()),
        ("truncated object", b"{".to_vec()),
        ("brackets", b"[[[[".to_vec()),
        ("missing value", b"{\"a\":}".to_vec()),
        ("trailing garbage", b"{} {}".to_vec()),
        ("array", b"[]".to_vec()),
        ("array of objects", b"[{}]".to_vec()),
        ("string", b"\"text\"".to_vec()),
        ("number", b"42".to_vec()),
        ("negative", b"-1".to_vec()),
        ("true", b"true".to_vec()),
        ("null", b"null".to_vec()),
        (
            "invalid utf-8 in a string",
            b"{\"command\": \"\xff\xfe\"}".to_vec(),
        ),
        ("nul in a string", b"{\"a\": \"\\u0000\"}".to_vec()),
        ("deep arrays", "[".repeat(100_000).into_bytes()),
        ("deep objects", "{\"a\":".repeat(50_000).into_bytes()),
        (
            "deep inside",
            format!("{{\"x\": {}}}", "[".repeat(50_000)).into_bytes(),
        ),
        (
            "huge string",
            format!("\"{}\"", "s".repeat(900 * 1024)).into_bytes(),
        ),
        (
            "huge key",
            format!("{{\"{}\": 1}}", "k".repeat(900 * 1024)).into_bytes(),
        ),
        ("random bytes", rng.bytes(4096)),
    ] {
        out.push(json_body(what, body));
    }
    if let Some((_, schema)) = &route.body {
        if let Some(props) = schema["properties"].as_object() {
            for (prop, s) in props {
                for wrong in wrong_values(s) {
                    out.push(json_body(
                        &format!("field {prop}: {wrong}"),
                        json!({ prop: wrong }).to_string().into_bytes(),
                    ));
                }
            }
        }
    }
    for ct in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=zz",
        "application/octet-stream",
    ] {
        out.push(case(
            format!("content type {ct}"),
            base_target.clone(),
            ct,
            b"{}".to_vec(),
        ));
    }
    let mut no_ct = case(
        "no content type".into(),
        base_target.clone(),
        "",
        b"{}".to_vec(),
    );
    no_ct.headers.clear();
    out.push(no_ct);
    out.push(case(
        "over the size limit".into(),
        base_target.clone(),
        &base_ct,
        vec![b' '; 2 << 20],
    ));
    let mut c = case(
        "malformed chunked body".into(),
        base_target.clone(),
        &base_ct,
        Vec::new(),
    );
    c.chunked = Some(b"2\r\n{}\r\nzz\r\nnot hex\r\n0\r\n\r\n".to_vec());
    out.push(c);
    let mut c = case(
        "chunked over the size limit".into(),
        base_target.clone(),
        &base_ct,
        Vec::new(),
    );
    let mut big = Vec::new();
    for _ in 0..20 {
        big.extend_from_slice(format!("{:x}\r\n", 64 * 1024).as_bytes());
        big.extend(std::iter::repeat_n(b' ', 64 * 1024));
        big.extend_from_slice(b"\r\n");
    }
    big.extend_from_slice(b"0\r\n\r\n");
    c.chunked = Some(big);
    out.push(c);
    if route
        .body
        .as_ref()
        .is_some_and(|(ct, _)| ct.starts_with("multipart/"))
    {
        for (what, ct, body) in [
            ("wrong field", MULTIPART, multipart("other", b"x", true)),
            ("unterminated", MULTIPART, multipart("file", b"x", false)),
            ("no parts", MULTIPART, b"--fuzzb--\r\n".to_vec()),
            (
                "boundary mismatch",
                MULTIPART,
                b"--other\r\n\r\nx\r\n--other--\r\n".to_vec(),
            ),
            (
                "no boundary",
                "multipart/form-data",
                multipart("file", b"x", true),
            ),
            ("garbage", MULTIPART, rng.bytes(2048)),
        ] {
            out.push(case(
                format!("multipart: {what}"),
                base_target.clone(),
                ct,
                body,
            ));
        }
    }

    // Headers.
    for (what, extra) in [
        (
            "header too large",
            vec![("x-big".to_owned(), "h".repeat(70_000))],
        ),
        (
            "too many headers",
            (0..150)
                .map(|i| (format!("x-h{i}"), "v".to_owned()))
                .collect(),
        ),
        (
            "garbage range",
            vec![("range".to_owned(), "bytes=abc".to_owned())],
        ),
        (
            "inverted range",
            vec![("range".to_owned(), "bytes=9-1".to_owned())],
        ),
        (
            "range past u64",
            vec![(
                "range".to_owned(),
                "bytes=99999999999999999999999-".to_owned(),
            )],
        ),
        (
            "garbage validators",
            vec![
                ("if-none-match".to_owned(), "garbage\", W/".to_owned()),
                ("if-range".to_owned(), "not a date".to_owned()),
            ],
        ),
        (
            "websocket upgrade",
            vec![
                ("connection".to_owned(), "upgrade".to_owned()),
                ("upgrade".to_owned(), "websocket".to_owned()),
                ("sec-websocket-version".to_owned(), "13".to_owned()),
                (
                    "sec-websocket-key".to_owned(),
                    "dGhlIHNhbXBsZSBub25jZQ==".to_owned(),
                ),
            ],
        ),
        (
            "broken websocket upgrade",
            vec![
                ("connection".to_owned(), "upgrade".to_owned()),
                ("upgrade".to_owned(), "websocket".to_owned()),
                ("sec-websocket-version".to_owned(), "99".to_owned()),
            ],
        ),
    ] {
        let mut c = case(
            what.to_owned(),
            base_target.clone(),
            &base_ct,
            base_body.clone(),
        );
        c.headers.extend(extra);
        out.push(c);
    }

    // Methods the route does not have (aimed at the absent name).
    let absent_target = base_target.replace(LIVE, ABSENT);
    for m in ["PUT", "PATCH", "DELETE", "POST", "GET", "OPTIONS", "TRACE"] {
        if m.eq_ignore_ascii_case(&route.method) {
            continue;
        }
        let mut c = case(
            format!("method {m}"),
            absent_target.clone(),
            &base_ct,
            Vec::new(),
        );
        c.method = m.to_owned();
        out.push(c);
    }
    out
}

/// Requests malformed at the HTTP level, which hyper answers itself.
fn protocol_cases() -> Vec<(String, Vec<u8>)> {
    let raw = |s: &str| s.as_bytes().to_vec();
    vec![
        (
            "content-length not a number".into(),
            raw("POST /api/v2/sandboxes/boxes HTTP/1.1\r\nhost: x\r\ncontent-length: abc\r\n\r\n{}"),
        ),
        (
            "content-length and chunked".into(),
            raw("POST /api/v2/sandboxes/boxes HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n"),
        ),
        (
            "two content-lengths".into(),
            raw("POST /api/v2/sandboxes/boxes HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n{}"),
        ),
        (
            "garbled request line".into(),
            raw("GARBAGE\r\n\r\n"),
        ),
        (
            "control character in a header value".into(),
            raw("GET /healthz HTTP/1.1\r\nhost: x\r\nif-none-match: \u{1}x\r\n\r\n"),
        ),
        (
            "space in a header name".into(),
            raw("GET /healthz HTTP/1.1\r\nhost: x\r\nbad header: 1\r\n\r\n"),
        ),
        (
            "target past hyper's limit".into(),
            format!("GET /{} HTTP/1.1\r\nhost: x\r\n\r\n", "a".repeat(70_000)).into_bytes(),
        ),
        (
            "head past hyper's buffer".into(),
            format!("GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n", "b".repeat(1_100_000))
                .into_bytes(),
        ),
        (
            "absolute-form target".into(),
            raw("GET http://127.0.0.1/api/v2/sandboxes/boxes HTTP/1.1\r\nhost: x\r\n\r\n"),
        ),
        (
            "HTTP/1.0 without host".into(),
            raw("GET /api/v2/sandboxes/boxes HTTP/1.0\r\n\r\n"),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_survives_malformed_and_oversized_input() {
    let started = std::time::Instant::now();
    let s = Server::start(true).await;
    let sb = s.sandbox(LIVE).await;
    let live = Live {
        id: sb["id"].as_str().unwrap().to_owned(),
    };
    let routes = routes();
    assert!(
        routes.len() >= 20,
        "the document lists {} operations",
        routes.len()
    );
    let mut rng = Rng::new(SEED);
    let mut failures = Vec::new();
    let mut sent = 0usize;
    let mut cases_total = 0usize;
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for route in &routes {
        let cases = cases(route, &live, &mut rng);
        cases_total += cases.len();
        for c in &cases {
            for key in [Some(s.admin.as_str()), None] {
                let mut headers = c.headers.clone();
                if let Some(k) = key {
                    headers.push(("x-api-key".into(), k.into()));
                }
                let req = RawRequest {
                    method: c.method.clone(),
                    target: c.target.as_bytes().to_vec(),
                    headers,
                    body: c.body.clone(),
                    chunked: c.chunked.clone(),
                };
                let r = send(s.addr, &req.bytes()).await;
                sent += 1;
                *statuses.entry(r.status).or_default() += 1;
                let who = if key.is_some() { "key" } else { "no key" };
                if let Some(problem) = judge(&r, c.protocol) {
                    failures.push(format!(
                        "{} [{}] ({who}) {} {}: {problem}",
                        route.label(),
                        c.name,
                        c.method,
                        shorten(&c.target)
                    ));
                }
            }
        }
    }
    for (name, raw) in protocol_cases() {
        let r = send(s.addr, &raw).await;
        sent += 1;
        *statuses.entry(r.status).or_default() += 1;
        if r.status >= 500 {
            failures.push(format!("protocol [{name}]: {} {}", r.status, r.text()));
        }
    }
    // The live sandbox is still there and still runs commands.
    let r = s
        .json(
            "POST",
            &format!("/dataplane/{}/execute", live.id),
            Some(&s.admin),
            &json!({"command": "echo alive"}),
        )
        .await;
    assert_eq!(r.status, 200, "the live sandbox survived: {}", r.text());
    let routes_seen: BTreeSet<String> = routes.iter().map(Route::label).collect();
    eprintln!(
        "fuzzed {} operations with {cases_total} cases, {sent} requests (with and without a key) \
         in {:.1?}; statuses {statuses:?}",
        routes_seen.len(),
        started.elapsed()
    );
    let r = s
        .json(
            "DELETE",
            &format!("/api/v2/sandboxes/boxes/{LIVE}"),
            Some(&s.admin),
            &json!({}),
        )
        .await;
    assert_eq!(r.status, 204, "{}", r.text());
    s.stop().await;
    assert!(
        failures.is_empty(),
        "{} of {sent} answers broke the rules:\n{}",
        failures.len(),
        failures
            .iter()
            .take(60)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// What is wrong with an answer, if anything.
fn judge(r: &Resp, protocol: bool) -> Option<String> {
    if r.status == 0 {
        return (!protocol).then(|| "no answer".to_owned());
    }
    // 501 is not a fault: an unserved route says so (in the envelope).
    if r.status >= 500 && r.status != 501 {
        return Some(format!("{} {}", r.status, shorten(&r.text())));
    }
    if ((400..500).contains(&r.status) || r.status == 501) && !protocol {
        return envelope_problem(r).map(|p| format!("{}: {p}", r.status));
    }
    None
}

fn shorten(s: &str) -> String {
    if s.len() <= 160 {
        s.to_owned()
    } else {
        let cut: String = s.chars().take(150).collect();
        format!("{cut}…({} bytes)", s.len())
    }
}
