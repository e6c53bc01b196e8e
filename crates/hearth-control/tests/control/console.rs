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
