//! The web console's routes (issue 21) on the simulated host: the page and
//! its assets with the Content-Security-Policy and caching headers, an
//! unknown asset in the envelope, and the exec WebSocket opened as a
//! browser opens it (the key as a subprotocol, no `X-Api-Key`). The
//! console itself runs in a real browser in the cli's `vm::console` suite.

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use crate::harness::{envelope_problem, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_is_served_with_its_policy_and_the_terminal_socket_takes_a_browser_key() {
    let (s, _sim) = Server::on_sim().await;

    let r = s.json("GET", "/console", None, &json!(null)).await;
    assert_eq!(r.status, 308, "{}", r.text());
    assert_eq!(r.header("location"), Some("/console/"));

    // The page: no key needed (it signs in), never cached, strict policy.
    let page = s.json("GET", "/console/", None, &json!(null)).await;
    assert_eq!(page.status, 200);
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert_eq!(page.header("cache-control"), Some("no-cache"));
    let csp = page.header("content-security-policy").unwrap().to_owned();
    for directive in [
        "default-src 'none'",
        "script-src 'self';",
        "connect-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(directive), "{csp} lacks {directive}");
    }
    assert!(!csp.contains("unsafe-eval"), "{csp}");
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(page.header("x-frame-options"), Some("DENY"));
    // A page the console opens cannot reach back into it (window.opener).
    assert_eq!(
        page.header("cross-origin-opener-policy"),
        Some("same-origin")
    );
    assert_eq!(page.header("referrer-policy"), Some("no-referrer"));

    // Each asset the page names: cached for good, same policy.
    let text = page.text();
    let assets: Vec<&str> = text
        .split("\"assets/")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap())
        .collect();
    assert_eq!(assets.len(), 2, "{text}");
    for a in &assets {
        let r = s
            .json("GET", &format!("/console/assets/{a}"), None, &json!(null))
            .await;
        assert_eq!(r.status, 200, "{a}");
        assert_eq!(
            r.header("cache-control"),
            Some("public, max-age=31536000, immutable")
        );
        assert!(r.header("content-security-policy").is_some());
        let ct = r.header("content-type").unwrap();
        assert!(
            ct.starts_with(if a.ends_with(".js") {
                "text/javascript"
            } else {
                "text/css"
            }),
            "{ct}"
        );
    }
    for missing in ["app.js", "..%2Fopenapi.json", "nope.css"] {
        let r = s
            .json(
                "GET",
                &format!("/console/assets/{missing}"),
                None,
                &json!(null),
            )
            .await;
        assert_eq!(r.status, 404, "{missing}");
        assert_eq!(envelope_problem(&r), None, "{missing}: {}", r.text());
    }
    let r = s.json("POST", "/console/", None, &json!({})).await;
    assert_eq!(r.status, 405);
    assert_eq!(envelope_problem(&r), None, "{}", r.text());

    // The terminal's WebSocket as a browser opens it.
    let sb = s.sandbox("console-ws").await;
    let id = sb["id"].as_str().unwrap();
    let url = format!("ws://{}/dataplane/{id}/execute/ws", s.addr);
    let offer = |key: &str| {
        let mut req = url.as_str().into_client_request().unwrap();
        req.headers_mut().insert(
            "sec-websocket-protocol",
            format!("hearth, hearth.key.{key}").parse().unwrap(),
        );
        req
    };
    let (mut ws, resp) = tokio_tungstenite::connect_async(offer(&s.admin))
        .await
        .unwrap();
    assert_eq!(
        resp.headers()
            .get("sec-websocket-protocol")
            .map(|v| v.to_str().unwrap()),
        Some("hearth"),
        "the server selects the console's protocol"
    );
    ws.send(Message::Text(
        json!({"type": "execute", "command": "echo hi", "pty": true})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    let mut types = Vec::new();
    while let Some(Ok(Message::Text(t))) = ws.next().await {
        let v: Value = serde_json::from_str(t.as_str()).unwrap();
        types.push(v["type"].as_str().unwrap().to_owned());
        if v["type"] == "exit" {
            break;
        }
    }
    assert_eq!(types, ["started", "stdout", "exit"]);

    // A wrong key, or another workspace's, gets nothing.
    let err = tokio_tungstenite::connect_async(offer("hth_wrong"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("401"), "{err}");
    let err = tokio_tungstenite::connect_async(offer(&s.other))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("404"), "{err}");
    s.stop().await;
}

/// `GET /boxes/{name}/metrics` (the console's charts) and `/metrics` carry
/// what the host measures of each VM; another workspace gets a 404; a
/// stopped sandbox has no figures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_reports_what_it_costs_its_host() {
    let (s, _sim) = Server::on_sim().await;
    let sb = s.sandbox("costly").await;
    let id = sb["id"].as_str().unwrap().to_owned();
    let path = "/api/v2/sandboxes/boxes/costly/metrics";
    let r = s.json("GET", path, Some(&s.admin), &json!(null)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let m = r.json().unwrap();
    assert_eq!(m["sandbox_id"], id.as_str());
    assert_eq!(m["running"], true, "{m}");
    // The simulated host: one CPU-second per boot order, a quarter of the
    // memory.
    let cpu = m["cpu_seconds_total"].as_f64().unwrap();
    assert!(cpu >= 1.0 && cpu.fract() == 0.0, "{m}");
    assert_eq!(m["memory_bytes"].as_u64(), Some((2u64 << 30) / 4), "{m}");
    assert_eq!(m["mem_limit_bytes"].as_u64(), Some(2u64 << 30));
    assert_eq!(m["vcpus"], 1);

    let r = s
        .json("GET", "/metrics", Some(&s.admin), &json!(null))
        .await;
    let text = r.text();
    assert!(
        text.contains(&format!(
            "hearth_sandbox_cpu_seconds_total{{sandbox_id=\"{id}\"}} {cpu:.3}"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "hearth_sandbox_memory_bytes{{sandbox_id=\"{id}\"}} {}",
            (2u64 << 30) / 4
        )),
        "{text}"
    );

    let r = s.json("GET", path, Some(&s.other), &json!(null)).await;
    assert_eq!(r.status, 404, "{}", r.text());

    let r = s
        .json(
            "POST",
            "/api/v2/sandboxes/boxes/costly/stop",
            Some(&s.admin),
            &json!({}),
        )
        .await;
    assert!(r.status < 300, "{} {}", r.status, r.text());
    let m = s
        .json("GET", path, Some(&s.admin), &json!(null))
        .await
        .json()
        .unwrap();
    assert_eq!(m["running"], false, "{m}");
    assert_eq!(m["cpu_seconds_total"], Value::Null, "{m}");
    s.stop().await;
}

/// API keys through the API (the console's keys page): list, create (the
/// secret once, no permission the creator lacks), revoke; a key without
/// `*` or `keys:manage` may not; another workspace's key is a 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_listed_created_and_revoked_by_a_key_that_may() {
    let (s, _sim) = Server::on_sim().await;
    let list = |key: String| {
        let s = &s;
        async move {
            s.json("GET", "/api/v1/api-key", Some(&key), &json!(null))
                .await
        }
    };
    let r = list(s.admin.clone()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let before = r.json().unwrap().as_array().unwrap().len();
    assert!(!r.text().contains(&s.admin), "a list shows a secret");

    // A narrower key for the sandbox API only.
    let r = s
        .json(
            "POST",
            "/api/v1/api-key",
            Some(&s.admin),
            &json!({"description": "ci", "permissions": ["sandboxes:read", "sandboxes:exec"]}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let made = r.json().unwrap();
    let secret = made["key"].as_str().unwrap().to_owned();
    let id = made["id"].as_str().unwrap().to_owned();
    assert!(made["short_key"]
        .as_str()
        .unwrap()
        .starts_with(&secret[..8]));
    assert_eq!(
        made["permissions"],
        json!(["sandboxes:read", "sandboxes:exec"])
    );
    let r = list(s.admin.clone()).await;
    let keys = r.json().unwrap();
    assert_eq!(keys.as_array().unwrap().len(), before + 1);
    assert!(!r.text().contains(&secret), "a list shows a secret");

    // It works for what it has, and may not manage keys.
    let r = s
        .json(
            "GET",
            "/api/v2/sandboxes/boxes",
            Some(&secret),
            &json!(null),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(list(secret.clone()).await.status, 403);
    // sandboxes:* does not include keys:manage; keys:manage may not grant
    // what it lacks.
    let r = s
        .json(
            "POST",
            "/api/v1/api-key",
            Some(&s.admin),
            &json!({"permissions": ["sandboxes:*", "keys:manage"]}),
        )
        .await;
    let manager = r.json().unwrap()["key"].as_str().unwrap().to_owned();
    let r = s
        .json(
            "POST",
            "/api/v1/api-key",
            Some(&manager),
            &json!({"permissions": ["*"]}),
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.text().contains("\\\"*\\\""), "{}", r.text());
    for (body, field) in [
        (json!({"permissions": ["root"]}), "permissions"),
        (json!({"permissions": []}), "permissions"),
        (json!({"expires": 3}), "expires"),
    ] {
        let r = s
            .json("POST", "/api/v1/api-key", Some(&s.admin), &body)
            .await;
        assert_eq!(r.status, 422, "{body}: {}", r.text());
        assert!(r.text().contains(field), "{body}: {}", r.text());
    }

    // Another workspace cannot see or revoke it.
    let r = s
        .json(
            "DELETE",
            &format!("/api/v1/api-key/{id}"),
            Some(&s.other),
            &json!(null),
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(envelope_problem(&r), None);
    assert!(!list(s.other.clone()).await.text().contains(&id));

    // Revoked: refused at once, gone from the list; twice is fine.
    let r = s
        .json(
            "DELETE",
            &format!("/api/v1/api-key/{id}"),
            Some(&s.admin),
            &json!(null),
        )
        .await;
    assert_eq!(r.status, 204, "{}", r.text());
    let r = s
        .json(
            "GET",
            "/api/v2/sandboxes/boxes",
            Some(&secret),
            &json!(null),
        )
        .await;
    assert_eq!(r.status, 401);
    assert!(!list(s.admin.clone()).await.text().contains(&id));
    let r = s
        .json(
            "DELETE",
            &format!("/api/v1/api-key/{id}"),
            Some(&s.admin),
            &json!(null),
        )
        .await;
    assert_eq!(r.status, 204);
    let r = s
        .json(
            "DELETE",
            "/api/v1/api-key/not-an-id",
            Some(&s.admin),
            &json!(null),
        )
        .await;
    assert_eq!(r.status, 404);
    s.stop().await;
}

/// The fleet's hosts (the console's hosts page) only for `fleet:read`,
/// which `*` neither includes nor may grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_are_shown_only_to_keys_holding_fleet_read() {
    let (s, _sim) = Server::on_sim().await;
    s.sandbox("on-the-host").await;
    let r = s
        .json(
            "GET",
            "/api/v2/sandboxes/hosts",
            Some(&s.admin),
            &json!(null),
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.text().contains("fleet:read"), "{}", r.text());
    let r = s
        .json(
            "POST",
            "/api/v1/api-key",
            Some(&s.admin),
            &json!({"permissions": ["fleet:read"]}),
        )
        .await;
    assert_eq!(r.status, 403, "* granted fleet:read: {}", r.text());

    let admin =
        s.db.find_api_key(&hearth_control::auth::hash_key(&s.admin))
            .await
            .unwrap()
            .unwrap();
    let (_, operator) =
        hearth_control::auth::create_key(&s.db, admin.workspace_id, &["fleet:read"], "ops")
            .await
            .unwrap();
    let r = s
        .json(
            "GET",
            "/api/v2/sandboxes/hosts",
            Some(&operator),
            &json!(null),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let hosts = r.json().unwrap();
    let h = &hosts[0];
    assert_eq!(h["state"], "ready", "{h}");
    assert_eq!(h["lease_live"], true, "{h}");
    assert_eq!(h["sandboxes"], 1, "{h}");
    assert_eq!(h["committed_mem_bytes"].as_u64(), Some(2u64 << 30), "{h}");
    assert_eq!(h["capacity_cpu_millicores"], 64_000, "{h}");
    // An in-process host answers its free disk at once.
    assert!(h["disk_free_bytes"].as_u64().unwrap() > 0, "{h}");
    // The operator key is not a sandbox key.
    let r = s
        .json(
            "GET",
            "/api/v2/sandboxes/boxes",
            Some(&operator),
            &json!(null),
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.text());
    s.stop().await;
}

/// A sandbox's status history (the console's sandbox page): its changes
/// oldest first, through create, stop and start; hosts only to a key
/// holding `fleet:read`, in the history and in the sandbox resource; the
/// idle clock in the resource; another workspace gets a 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_keeps_its_status_history() {
    let (s, _sim) = Server::on_sim().await;
    let sb = s.sandbox("storied").await;
    assert!(
        sb["last_activity_at"].as_str().unwrap().ends_with('Z'),
        "{sb}"
    );
    assert!(sb.get("host_id").is_none(), "a tenant saw its host: {sb}");
    for action in ["stop", "start"] {
        let r = s
            .json(
                "POST",
                &format!("/api/v2/sandboxes/boxes/storied/{action}"),
                Some(&s.admin),
                &json!({}),
            )
            .await;
        assert!(r.status < 300, "{action}: {} {}", r.status, r.text());
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let r = s
            .json(
                "GET",
                "/api/v2/sandboxes/boxes/storied/status",
                Some(&s.admin),
                &json!(null),
            )
            .await;
        if r.json().unwrap()["status"] == "ready" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not ready: {}",
            r.text()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let path = "/api/v2/sandboxes/boxes/storied/events";
    let r = s.json("GET", path, Some(&s.admin), &json!(null)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let events = r.json().unwrap()["events"].as_array().unwrap().clone();
    let statuses: Vec<&str> = events
        .iter()
        .map(|e| e["status"].as_str().unwrap())
        .collect();
    // Each status once per pass, in order (a status may repeat with a new
    // message while it boots).
    let mut passes: Vec<&str> = statuses.clone();
    passes.dedup();
    assert_eq!(
        passes,
        ["provisioning", "ready", "stopped", "provisioning", "ready"],
        "{events:?}"
    );
    let times: Vec<&str> = events.iter().map(|e| e["at"].as_str().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    assert!(
        events.iter().all(|e| e.get("host_id").is_none()),
        "a tenant saw its host: {events:?}"
    );
    let r = s.json("GET", path, Some(&s.other), &json!(null)).await;
    assert_eq!(r.status, 404, "{}", r.text());

    // An operator sees where it ran.
    let admin =
        s.db.find_api_key(&hearth_control::auth::hash_key(&s.admin))
            .await
            .unwrap()
            .unwrap();
    let (_, operator) = hearth_control::auth::create_key(
        &s.db,
        admin.workspace_id,
        &["sandboxes:read", "fleet:read"],
        "ops",
    )
    .await
    .unwrap();
    let r = s.json("GET", path, Some(&operator), &json!(null)).await;
    let events = r.json().unwrap()["events"].as_array().unwrap().clone();
    let ready = events
        .iter()
        .rev()
        .find(|e| e["status"] == "ready")
        .unwrap();
    let host = ready["host_id"]
        .as_str()
        .expect("the operator sees the host");
    let r = s
        .json(
            "GET",
            "/api/v2/sandboxes/boxes/storied",
            Some(&operator),
            &json!(null),
        )
        .await;
    assert_eq!(r.json().unwrap()["host_id"], host);
    let r = s
        .json(
            "GET",
            "/api/v2/sandboxes/boxes",
            Some(&operator),
            &json!(null),
        )
        .await;
    assert_eq!(r.json().unwrap()["sandboxes"][0]["host_id"], host);
    s.stop().await;
}
