//! Issue 39, held items: what the security review tried against E2B's door
//! (and LangSmith's create and fork) and found holding, kept so. Another
//! workspace's sandbox is not found on any E2B sandbox route, and not
//! told apart from one that never existed; envd opens only with the
//! sandbox's own token; a private sandbox's ports open only with its own
//! traffic token, whatever names the request carries; a network update
//! needs `sandboxes:update`; E2B's snapshot is held to the snapshot
//! quota; a create or fork whose client hangs up still ends with the
//! lifetime it asked for. All on the simulated host (`SimHost`), through
//! the served router.

use std::time::Duration;

use hearth_db::{Quotas, SandboxStatus, Timestamp};
use hearth_hostapi::sim::SIM_HTTP_PORT;
use hearth_types::{SandboxId, VmId};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use crate::harness::{self, send, RawRequest, Resp, Server, TEST_DOMAIN};

async fn call(s: &Server, method: &str, path: &str, key: &str, body: Value) -> Resp {
    s.json(method, path, Some(key), &body).await
}

/// E2B's error answer: `(code, message)` (zero and empty when it is not
/// one).
fn e2b_error(r: &Resp) -> (u64, String) {
    let v = r.json().unwrap_or_default();
    (
        v["code"].as_u64().unwrap_or_default(),
        v["message"].as_str().unwrap_or_default().to_owned(),
    )
}

/// Asserts `r` is E2B's error shape with `status` and nothing else in it
/// (`{"code", "message"}` only); its message.
fn e2b_refusal(r: &Resp, status: u16, what: &str) -> String {
    assert_eq!(r.status, status, "{what}: {}", r.text());
    let v = r
        .json()
        .unwrap_or_else(|| panic!("{what}: not JSON: {}", r.text()));
    let keys: Vec<&String> = v
        .as_object()
        .map(|o| o.keys().collect())
        .unwrap_or_default();
    assert_eq!(keys, ["code", "message"], "{what}: {v}");
    let (code, message) = e2b_error(r);
    assert_eq!(code, u64::from(status), "{what}: {v}");
    message
}

/// An E2B create by `key` with `body`: its answer.
async fn e2b_create(s: &Server, key: &str, body: Value) -> Value {
    let r = call(s, "POST", "/v2/sandboxes", key, body).await;
    assert_eq!(r.status, 201, "{}", r.text());
    r.json().unwrap()
}

fn text_of(v: &Value, field: &str) -> String {
    v[field]
        .as_str()
        .unwrap_or_else(|| panic!("no {field} in {v}"))
        .to_owned()
}

/// `GET /sandboxes/{id}` by `key`: the body.
async fn detail(s: &Server, key: &str, id: &str) -> Value {
    let r = call(s, "GET", &format!("/sandboxes/{id}"), key, json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json().unwrap()
}

fn vm_of(id: &str) -> VmId {
    VmId::from(uuid::Uuid::parse_str(id).unwrap())
}

/// A request with `headers` as given (a `Host` among them replaces
/// loopback's); the answer.
async fn raw(
    s: &Server,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Resp {
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    send(
        s.addr,
        &RawRequest::new(method, target, &headers, body).bytes(),
    )
    .await
}

use hearth_control::E2bRoute as Route;

/// E2B's routes, from the table the router is built from, so that a route
/// added there is held here without a change to this file.
fn e2b_routes() -> Vec<Route> {
    hearth_control::E2B_ROUTES.to_vec()
}

/// A body each route accepts, so that its refusal is the lookup's and not
/// the body's.
fn body_for(path: &str) -> Value {
    match path.rsplit('/').next() {
        Some("timeout") => json!({"timeout": 60}),
        Some("fork") => json!({"count": 1, "timeout": 30}),
        Some("snapshots") => json!({"name": "held-stolen"}),
        Some("network") => json!({"denyOut": ["0.0.0.0/0"], "allowOut": ["example.com"]}),
        _ => json!({}),
    }
}

/// Issue 39, held: every E2B route that names a sandbox (the list read
/// from E2B's router) answers another workspace's sandbox 404 in E2B's
/// shape, or, for a route deliberately not served, the 501 naming its
/// path that anyone gets; each answer is the one a sandbox that never
/// existed gets (its id aside), so nothing tells the two apart; and the
/// sandbox is left as it was (running, its deadline, network, no
/// snapshot, no fork).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_e2b_sandbox_route_hides_another_workspaces_sandbox() {
    let (s, sim) = Server::on_sim().await;
    let owner = s.other.clone();
    let victim = e2b_create(&s, &owner, json!({"templateID": "base", "timeout": 300})).await;
    let id = text_of(&victim, "sandboxID");
    let before = detail(&s, &owner, &id).await;
    let network_before = format!(
        "{:?}",
        sim.network(vm_of(&id))
            .map(|n| crate::harness::policy_of(&n))
    );
    let ghost = uuid::Uuid::now_v7().to_string();

    let routes: Vec<Route> = e2b_routes()
        .into_iter()
        .filter(|r| {
            r.path.starts_with("/sandboxes/{id}") || r.path.starts_with("/v2/sandboxes/{id}")
        })
        .collect();
    // The review's list: a reading of the router gone wrong cannot pass
    // with fewer.
    for (method, path) in [
        ("GET", "/sandboxes/{id}"),
        ("DELETE", "/sandboxes/{id}"),
        ("POST", "/sandboxes/{id}/timeout"),
        ("POST", "/sandboxes/{id}/pause"),
        ("POST", "/sandboxes/{id}/resume"),
        ("POST", "/sandboxes/{id}/connect"),
        ("POST", "/v2/sandboxes/{id}/connect"),
        ("GET", "/sandboxes/{id}/metrics"),
        ("POST", "/sandboxes/{id}/fork"),
        ("POST", "/sandboxes/{id}/snapshots"),
        ("PUT", "/sandboxes/{id}/network"),
        ("POST", "/sandboxes/{id}/refreshes"),
    ] {
        assert!(
            routes.iter().any(|r| r.method == method && r.path == path),
            "{method} {path} is not among the routes read from E2B's router: {routes:?}"
        );
    }

    for route in &routes {
        let what = format!("{} {} (served: {})", route.method, route.path, route.served);
        let path = route.path.replace("{id}", &id);
        let body = body_for(route.path);
        let r = call(&s, route.method, &path, &s.admin, body.clone()).await;
        let unserved = !route.served;
        let message = e2b_refusal(&r, if unserved { 501 } else { 404 }, &what);
        if unserved {
            assert!(message.contains(&path), "{what}: {message}");
        }
        // The same answer as for a sandbox that never existed.
        let ghost_path = route.path.replace("{id}", &ghost);
        let g = call(&s, route.method, &ghost_path, &s.admin, body).await;
        let ghost_message = e2b_refusal(&g, r.status, &format!("{what}, never existed"));
        assert_eq!(
            message.replace(&id, "{id}"),
            ghost_message.replace(&ghost, "{id}"),
            "{what}: another workspace's sandbox is told apart from none"
        );
    }

    // Nothing of it happened.
    let after = detail(&s, &owner, &id).await;
    assert_eq!(after["state"], "running", "{after}");
    assert_eq!(after["endAt"], before["endAt"], "the deadline moved");
    assert_eq!(
        sim.vm(vm_of(&id)).map(|v| v.state),
        Some(hearth_hostapi::VmState::Ready)
    );
    assert_eq!(
        format!(
            "{:?}",
            sim.network(vm_of(&id))
                .map(|n| crate::harness::policy_of(&n))
        ),
        network_before,
        "the network changed"
    );
    let r = call(&s, "GET", "/snapshots", &owner, json!({})).await;
    assert_eq!((r.status, r.text()), (200, "[]".to_owned()));
    let r = call(
        &s,
        "GET",
        "/v2/sandboxes?state=running,paused",
        &owner,
        json!({}),
    )
    .await;
    let listed: Vec<String> = r
        .json()
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|v| text_of(v, "sandboxID"))
        .collect();
    assert_eq!(listed, [id.as_str()], "a fork made children");
    s.stop().await;
}

/// One of envd's calls, by the sandbox's host name or by
/// `E2b-Sandbox-Id` on the API's host.
#[derive(Clone, Copy, Debug)]
enum Envd {
    Download,
    Upload,
    Start,
}

/// A Connect envelope of one JSON message.
fn envelope(msg: &Value) -> Vec<u8> {
    let msg = msg.to_string().into_bytes();
    let mut out = vec![0u8];
    out.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    out.extend_from_slice(&msg);
    out
}

/// A Connect stream's envelopes: flags and message.
fn frames(mut body: &[u8]) -> Vec<(u8, Value)> {
    let mut out = Vec::new();
    while body.len() >= 5 {
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        let end = (5 + len).min(body.len());
        out.push((
            body[0],
            serde_json::from_slice(&body[5..end]).unwrap_or_default(),
        ));
        body = &body[end..];
    }
    out
}

/// Calls `call` of sandbox `id`'s envd with `token` (none: no header),
/// naming the sandbox by host name (`by_host`) or `E2b-Sandbox-Id`.
async fn envd(s: &Server, call: Envd, by_host: bool, id: &str, token: Option<&str>) -> Resp {
    let host = format!("49983-{id}.{TEST_DOMAIN}");
    let mut headers: Vec<(&str, &str)> = if by_host {
        vec![("host", &host)]
    } else {
        vec![("e2b-sandbox-id", id)]
    };
    if let Some(t) = token {
        headers.push(("x-access-token", t));
    }
    match call {
        Envd::Download => raw(s, "GET", "/files?path=/etc/hostname", &headers, Vec::new()).await,
        Envd::Upload => {
            headers.push(("content-type", "application/octet-stream"));
            raw(
                s,
                "POST",
                "/files?path=/tmp/held-39",
                &headers,
                b"pwned".to_vec(),
            )
            .await
        }
        Envd::Start => {
            headers.push(("content-type", "application/connect+json"));
            let start = json!({"process": {"cmd": "/bin/sh", "args": ["-c", "echo pwned"]}});
            raw(
                s,
                "POST",
                "/process.Process/Start",
                &headers,
                envelope(&start),
            )
            .await
        }
    }
}

/// Issue 39, held: envd's `/files` (GET and POST) and
/// `process.Process/Start`, by the sandbox's host name or by
/// `E2b-Sandbox-Id`, refuse a token that is missing, empty, cut by one
/// character, another sandbox's of the same workspace, or changed in one
/// character, and one naming another sandbox than the host does: 401 in
/// E2B's shape for the files, `unauthenticated` (Connect's 401: a stream
/// answers its error in its end-of-stream envelope) with no process
/// started for `Start`. The sandbox's own token gets through to the
/// guest (the simulated guest starts the process, and refuses file
/// operations it does not simulate), so the refusals are the token's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envd_opens_only_with_the_sandboxes_own_token() {
    let (s, _sim) = Server::on_sim().await;
    let key = s.other.clone();
    let a = e2b_create(&s, &key, json!({"templateID": "base", "timeout": 300})).await;
    let b = e2b_create(&s, &key, json!({"templateID": "base", "timeout": 300})).await;
    let (id, token) = (text_of(&a, "sandboxID"), text_of(&a, "envdAccessToken"));
    let (other_id, other_token) = (text_of(&b, "sandboxID"), text_of(&b, "envdAccessToken"));
    let mut flipped = token.clone().into_bytes();
    let mid = flipped.len() / 2;
    flipped[mid] = if flipped[mid] == b'A' { b'B' } else { b'A' };
    let flipped = String::from_utf8(flipped).unwrap();
    let truncated = &token[..token.len() - 1];
    let forged: [(&str, Option<&str>); 5] = [
        ("missing", None),
        ("empty", Some("")),
        ("cut by one", Some(truncated)),
        ("another sandbox's", Some(&other_token)),
        ("one changed", Some(&flipped)),
    ];

    for by_host in [true, false] {
        for call in [Envd::Download, Envd::Upload, Envd::Start] {
            for (what, tok) in forged {
                let what = format!("{call:?}, by host {by_host}, token {what}");
                let r = envd(&s, call, by_host, &id, tok).await;
                refused(&r, call, &what);
            }
            // The right token gets through to the guest.
            let r = envd(&s, call, by_host, &id, Some(&token)).await;
            let what = format!("{call:?}, by host {by_host}, its own token");
            match call {
                Envd::Start => {
                    assert_eq!(r.status, 200, "{what}: {}", r.text());
                    let f = frames(&r.body);
                    assert!(
                        f.iter().any(|(_, m)| m["event"]["start"]["pid"].is_u64()),
                        "{what}: {f:?}"
                    );
                    assert!(
                        f.iter().all(|(_, m)| m.get("error").is_none()),
                        "{what}: {f:?}"
                    );
                }
                Envd::Download | Envd::Upload => {
                    let (_, message) = e2b_error(&r);
                    assert!(
                        r.status == 200 || message.contains("simulated guest"),
                        "{what}: {} {}",
                        r.status,
                        r.text()
                    );
                }
            }
        }
    }

    // The host names this sandbox, E2b-Sandbox-Id the other, with the
    // other's token: the host decides, and the token does not open it.
    let host = format!("49983-{id}.{TEST_DOMAIN}");
    for (call, target, ct) in [
        (Envd::Download, "/files?path=/etc/hostname", None),
        (
            Envd::Upload,
            "/files?path=/tmp/held-39",
            Some("application/octet-stream"),
        ),
        (
            Envd::Start,
            "/process.Process/Start",
            Some("application/connect+json"),
        ),
    ] {
        let mut headers = vec![
            ("host", host.as_str()),
            ("e2b-sandbox-id", other_id.as_str()),
            ("x-access-token", other_token.as_str()),
        ];
        headers.extend(ct.map(|c| ("content-type", c)));
        let (method, body) = match call {
            Envd::Download => ("GET", Vec::new()),
            Envd::Upload => ("POST", b"pwned".to_vec()),
            Envd::Start => (
                "POST",
                envelope(&json!({"process": {"cmd": "/bin/sh", "args": ["-c", "echo pwned"]}})),
            ),
        };
        let r = raw(&s, method, target, &headers, body).await;
        refused(
            &r,
            call,
            &format!("{call:?}, host and header naming two sandboxes"),
        );
    }
    s.stop().await;
}

/// Asserts envd refused `call` for its token (see the test above).
fn refused(r: &Resp, call: Envd, what: &str) {
    match call {
        Envd::Start => {
            assert_eq!(r.status, 200, "{what}: {}", r.text());
            assert_eq!(
                r.header("content-type"),
                Some("application/connect+json"),
                "{what}"
            );
            let f = frames(&r.body);
            assert_eq!(f.len(), 1, "{what}: {f:?}");
            let (flags, end) = &f[0];
            assert_eq!(*flags, 0x02, "{what}: not the end of the stream: {f:?}");
            assert_eq!(end["error"]["code"], "unauthenticated", "{what}: {end}");
        }
        Envd::Download | Envd::Upload => {
            e2b_refusal(r, 401, what);
        }
    }
}

/// A GET of `/` on `host` with `headers`; the answer.
async fn to_host(s: &Server, host: &str, headers: &[(&str, &str)]) -> Resp {
    let mut all = vec![("host", host)];
    all.extend_from_slice(headers);
    raw(s, "GET", "/", &all, Vec::new()).await
}

/// Asserts `r` is the 403 of a port that is not public and did not come
/// from the guest (whose HTTP port answers what it got); its message.
fn not_public(r: &Resp, what: &str) -> String {
    let message = e2b_refusal(r, 403, what);
    assert!(message.contains("is not public"), "{what}: {message}");
    message
}

/// Issue 39, held: a port of a sandbox made not public
/// (`allowPublicTraffic: false`) on its host name `{port}-{id}.{domain}`
/// is refused 403 with another sandbox's traffic token, of the same
/// workspace or another; a sandbox that never existed gets the very same
/// 403 and message (its id aside), with no token and with a token, so
/// nothing tells which exist; a request whose absolute-form target names
/// one sandbox while its `Host` names another (or the API), or whose
/// target alone names it, is decided for the sandbox it is sent to and
/// does not get through. Every refusal is the server's, not the guest's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_sandbox_ports_open_only_with_their_own_traffic_token() {
    let (s, _sim) = Server::on_sim().await;
    let key = s.other.clone();
    let private = json!({"templateID": "base", "network": {"allowPublicTraffic": false}});
    let p = e2b_create(&s, &key, private.clone()).await;
    let q = e2b_create(&s, &key, private.clone()).await;
    let f = e2b_create(&s, &s.admin.clone(), private).await;
    let (pid, p_token) = (text_of(&p, "sandboxID"), text_of(&p, "trafficAccessToken"));
    let (qid, q_token) = (text_of(&q, "sandboxID"), text_of(&q, "trafficAccessToken"));
    let f_token = text_of(&f, "trafficAccessToken");
    let ghost = uuid::Uuid::now_v7().to_string();
    let host = |id: &str| format!("{SIM_HTTP_PORT}-{id}.{TEST_DOMAIN}");

    // Its own token opens it (the test is not vacuous).
    let r = to_host(&s, &host(&pid), &[("e2b-traffic-access-token", &p_token)]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json().unwrap()["request"].is_string(), "{}", r.text());

    // Another sandbox's token, of its workspace or another: 403.
    for (what, t) in [
        ("a sibling's token", &q_token),
        ("another workspace's token", &f_token),
    ] {
        let r = to_host(&s, &host(&pid), &[("e2b-traffic-access-token", t)]).await;
        not_public(&r, what);
    }

    // None and a wrong one: the same answer as for no sandbox at all.
    let sibling = [("e2b-traffic-access-token", q_token.as_str())];
    for (what, headers) in [("no token", &[][..]), ("a sibling's token", &sibling[..])] {
        let r = to_host(&s, &host(&pid), headers).await;
        let message = not_public(&r, what);
        let g = to_host(&s, &host(&ghost), headers).await;
        let ghost_message = not_public(&g, &format!("{what}, never existed"));
        assert_eq!(
            message.replace(&pid, "{id}"),
            ghost_message.replace(&ghost, "{id}"),
            "{what}: a private sandbox is told apart from none"
        );
    }

    // Absolute-form targets: the target names Q (whose token is sent),
    // the Host names P; the target names P, the Host the API or a
    // sandbox that does not exist; no Host at all, the target names P.
    let absolute = |id: &str| format!("http://{}/", host(id));
    for (what, target, host_header, token) in [
        (
            "target Q, Host P, Q's token",
            absolute(&qid),
            Some(host(&pid)),
            Some(&q_token),
        ),
        (
            "target P, Host the API's",
            absolute(&pid),
            Some("127.0.0.1".to_owned()),
            None,
        ),
        (
            "target P, Host a ghost's",
            absolute(&pid),
            Some(host(&ghost)),
            None,
        ),
    ] {
        let mut headers = Vec::new();
        if let Some(h) = &host_header {
            headers.push(("host", h.as_str()));
        }
        if let Some(t) = token {
            headers.push(("e2b-traffic-access-token", t.as_str()));
        }
        let r = raw(&s, "GET", &target, &headers, Vec::new()).await;
        assert_ne!(r.status, 200, "{what}: {}", r.text());
        assert!(
            r.json().is_none_or(|v| v.get("request").is_none()),
            "{what}: the guest answered: {}",
            r.text()
        );
        if host_header.as_deref() != Some("127.0.0.1") {
            not_public(&r, what);
        }
    }
    for (what, token) in [
        ("no Host, target P", None),
        ("no Host, target P, Q's token", Some(&q_token)),
    ] {
        let mut head = format!("GET {} HTTP/1.1\r\nconnection: close\r\n", absolute(&pid));
        if let Some(t) = token {
            head.push_str(&format!("e2b-traffic-access-token: {t}\r\n"));
        }
        head.push_str("\r\n");
        let r = send(s.addr, head.as_bytes()).await;
        not_public(&r, what);
    }
    s.stop().await;
}

/// The LangSmith view of sandbox `id`'s access control.
async fn access_of(s: &Server, key: &str, id: &str) -> Value {
    let r = call(
        s,
        "GET",
        "/api/v2/sandboxes/boxes?limit=100",
        key,
        json!({}),
    )
    .await;
    let all = r.json().unwrap();
    all["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["id"] == id)
        .map(|b| b["proxy_config"]["access_control"].clone())
        .unwrap_or_default()
}

/// Issue 39, held: E2B's `PUT /sandboxes/{id}/network` with a key that
/// has every sandbox permission but `sandboxes:update` is 403 naming it,
/// for a sandbox another key made and for one it made itself, and the
/// policy is unchanged on the host and in the API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_update_needs_sandboxes_update() {
    let (s, sim) = Server::on_sim().await;
    let key = s.other.clone();
    let net = json!({"templateID": "base", "network": {"denyOut": ["10.0.0.0/8"]}});
    let made = e2b_create(&s, &key, net.clone()).await;
    let id = text_of(&made, "sandboxID");
    let row =
        s.db.get_sandbox_by_id(id.parse::<SandboxId>().unwrap())
            .await
            .unwrap();
    let perms = [
        "sandboxes:create",
        "sandboxes:read",
        "sandboxes:delete",
        "sandboxes:exec",
    ];
    let (_, narrow) =
        hearth_control::auth::create_key(&s.db, row.workspace_id, &perms, "no update")
            .await
            .unwrap();
    let own = e2b_create(&s, &narrow, net).await;
    let own_id = text_of(&own, "sandboxID");

    for id in [&id, &own_id] {
        let on_host = format!(
            "{:?}",
            crate::harness::policy_of(&sim.network(vm_of(id)).expect("a network"))
        );
        assert!(on_host.contains("10.0.0.0/8"), "{on_host}");
        let in_api = access_of(&s, &key, id).await;
        assert_eq!(in_api["deny_list"], json!(["10.0.0.0/8"]), "{in_api}");
        let r = call(
            &s,
            "PUT",
            &format!("/sandboxes/{id}/network"),
            &narrow,
            json!({"denyOut": ["0.0.0.0/0"], "allowOut": ["example.com"]}),
        )
        .await;
        let message = e2b_refusal(&r, 403, "PUT network without sandboxes:update");
        assert!(message.contains("sandboxes:update"), "{message}");
        assert_eq!(
            format!(
                "{:?}",
                crate::harness::policy_of(&sim.network(vm_of(id)).expect("a network"))
            ),
            on_host,
            "the host's policy changed"
        );
        assert_eq!(
            access_of(&s, &key, id).await,
            in_api,
            "the API's policy changed"
        );
    }
    s.stop().await;
}

/// Issue 39, held: E2B's `POST /sandboxes/{id}/snapshots` past the
/// workspace's snapshot count is 429 in E2B's shape naming the limit,
/// and records nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_e2b_snapshot_past_the_quota_is_429() {
    let (s, _sim) = Server::on_sim().await;
    let quotas = Quotas {
        max_snapshots: Some(1),
        ..Quotas::default()
    };
    let (_, key) = harness::workspace_key(&s.db, "held-quota", quotas).await;
    let made = e2b_create(&s, &key, json!({"templateID": "base", "timeout": 300})).await;
    let snapshots = format!("/sandboxes/{}/snapshots", text_of(&made, "sandboxID"));
    let r = call(&s, "POST", &snapshots, &key, json!({"name": "first"})).await;
    assert_eq!(r.status, 201, "{}", r.text());
    for body in [
        json!({"name": "second"}),
        json!({}),
        json!({"memory": false}),
    ] {
        let r = call(&s, "POST", &snapshots, &key, body.clone()).await;
        let message = e2b_refusal(&r, 429, &format!("{body}"));
        assert!(message.contains("snapshot count"), "{body}: {message}");
        assert!(message.contains("limit 1"), "{body}: {message}");
    }
    let r = call(&s, "GET", "/snapshots", &key, json!({})).await;
    let names: Vec<Value> = r
        .json()
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["names"].clone())
        .collect();
    assert_eq!(names, [json!(["first"])], "a refused snapshot was recorded");
    s.stop().await;
}

/// LangSmith's view of sandbox `name`, if it exists.
async fn sandbox_by_name(s: &Server, key: &str, name: &str) -> Option<Value> {
    let r = call(
        s,
        "GET",
        &format!("/api/v2/sandboxes/boxes/{name}"),
        key,
        json!({}),
    )
    .await;
    match r.status {
        200 => r.json(),
        404 => None,
        other => panic!("{name}: {other} {}", r.text()),
    }
}

/// Sends a POST of `body` to `path` and hangs up once every sandbox of
/// `names` exists and still boots (`provisioning`), as a client cut off
/// mid-request does; their ids.
async fn hang_up_while_booting(
    s: &Server,
    path: &str,
    key: &str,
    body: Value,
    names: &[&str],
) -> Vec<String> {
    let headers = vec![
        ("content-type".to_owned(), "application/json".to_owned()),
        ("x-api-key".to_owned(), key.to_owned()),
    ];
    let req = RawRequest::new("POST", path, &headers, body.to_string().into_bytes());
    let mut conn = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    conn.write_all(&req.bytes()).await.unwrap();
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    let ids = loop {
        let mut found = Vec::new();
        for name in names {
            if let Some(sb) = sandbox_by_name(s, key, name).await {
                assert_eq!(
                    sb["status"], "provisioning",
                    "{name} was ready before the client left: {sb}"
                );
                found.push(text_of(&sb, "id"));
            }
        }
        if found.len() == names.len() {
            break found;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "{names:?} never appeared"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    drop(conn);
    ids
}

/// Waits (at most 20 s) until sandbox `id` has left `provisioning`;
/// asserts it is ready.
async fn ready(s: &Server, id: &str) {
    let id: SandboxId = id.parse().unwrap();
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let row = s.db.get_sandbox_by_id(id).await.unwrap();
        if row.status != SandboxStatus::Provisioning {
            assert_eq!(row.status, SandboxStatus::Ready, "{:?}", row.status_message);
            return;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "{id} stayed provisioning"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The statuses of sandboxes `ids` (`None`: gone).
async fn statuses(s: &Server, ids: &[SandboxId]) -> Vec<Option<SandboxStatus>> {
    let mut out = Vec::new();
    for id in ids {
        out.push(s.db.get_sandbox_by_id(*id).await.map(|r| r.status).ok());
    }
    out
}

/// Issue 39, held: on LangSmith's door, a create
/// (`POST /api/v2/sandboxes/boxes`) and a fork
/// (`POST /api/v2/sandboxes/boxes/{name}/fork`) whose client hangs up
/// after the sandboxes' rows exist, while they boot, still end as ready
/// sandboxes with the lifetime asked for: the create's
/// `idle_ttl_seconds` and `delete_after_stop_seconds`, which the fork's
/// children inherit (its body names none). The reaper keeps to them: none
/// stopped before the idle timeout, all after it, all deleted once
/// stopped past `delete_after_stop`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_langsmith_create_or_fork_keeps_its_lifetime() {
    let (s, sim) = Server::on_sim().await;
    let key = s.other.clone();
    sim.set_boot_time(Duration::from_secs(2));
    let create = json!({
        "name": "abandoned", "snapshot": "busybox", "idle_ttl_seconds": 300,
        "delete_after_stop_seconds": 3600, "wait_for_ready": true, "timeout": 60,
    });
    let ids =
        hang_up_while_booting(&s, "/api/v2/sandboxes/boxes", &key, create, &["abandoned"]).await;
    ready(&s, &ids[0]).await;

    let fork = json!({"name": "kid", "count": 2});
    let kids = hang_up_while_booting(
        &s,
        "/api/v2/sandboxes/boxes/abandoned/fork",
        &key,
        fork,
        &["kid-1", "kid-2"],
    )
    .await;
    for kid in &kids {
        ready(&s, kid).await;
    }
    for name in ["abandoned", "kid-1", "kid-2"] {
        let sb = sandbox_by_name(&s, &key, name).await.expect("it exists");
        assert_eq!(sb["status"], "ready", "{sb}");
        assert_eq!(sb["idle_ttl_seconds"], 300, "{sb}");
        assert_eq!(sb["delete_after_stop_seconds"], 3600, "{sb}");
    }

    let all: Vec<SandboxId> = ids
        .iter()
        .chain(&kids)
        .map(|i| i.parse().unwrap())
        .collect();
    let now = Timestamp::now();
    let early = s.control.reap_at(now.plus(Duration::from_secs(240))).await;
    assert!(early.leader, "{early:?}");
    assert_eq!(
        early.idle_stopped, 0,
        "stopped before its idle timeout: {early:?}"
    );
    let late = s.control.reap_at(now.plus(Duration::from_secs(360))).await;
    assert_eq!(late.idle_stopped, 3, "{late:?}");
    assert_eq!(statuses(&s, &all).await, [Some(SandboxStatus::Stopped); 3]);
    let stopped = Timestamp::now();
    let kept = s
        .control
        .reap_at(stopped.plus(Duration::from_secs(3000)))
        .await;
    assert_eq!(
        kept.expired_deleted, 0,
        "deleted before delete_after_stop: {kept:?}"
    );
    let gone = s
        .control
        .reap_at(stopped.plus(Duration::from_secs(3700)))
        .await;
    assert_eq!(gone.expired_deleted, 3, "{gone:?}");
    for name in ["abandoned", "kid-1", "kid-2"] {
        assert!(
            sandbox_by_name(&s, &key, name).await.is_none(),
            "{name} outlived its lifetime"
        );
    }
    s.stop().await;
}
