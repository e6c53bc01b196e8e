//! Findings 7 and 9 of the security review (issue 6): client mistakes are
//! 4xx, never 500, and every rejection, the framework's included, answers
//! in LangSmith's envelope. All through the real server
//! (`hearth_control::serve`) over loopback; one test boots a busybox
//! microVM for the mistakes only the guest can see.

use crate::harness::{envelope_problem, send, RawRequest, Resp, Server};
use serde_json::{json, Value};

fn headers(key: &str, content_type: &str) -> Vec<(String, String)> {
    vec![
        ("x-api-key".to_owned(), key.to_owned()),
        ("content-type".to_owned(), content_type.to_owned()),
    ]
}

async fn get(s: &Server, path: &str) -> Resp {
    let req = RawRequest::new("GET", path, &headers(&s.admin, "text/plain"), Vec::new());
    send(s.addr, &req.bytes()).await
}

fn assert_enveloped(r: &Resp, what: &str) {
    assert!(
        (400..500).contains(&r.status),
        "{what}: {} {}",
        r.status,
        r.text()
    );
    if let Some(p) = envelope_problem(r) {
        panic!("{what}: {} not in the envelope: {p}", r.status);
    }
}

/// A multipart body with one `file` field.
fn multipart(content: &[u8]) -> (String, Vec<u8>) {
    let boundary = "hearth-test-boundary";
    let mut body = format!(
        "--{boundary}\r\ncontent-disposition: form-data; name=\"file\"; filename=\"f\"\r\n\
         content-type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(content);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

#[tokio::test]
async fn finding7_too_many_label_filters_is_422() {
    let s = Server::start(false).await;
    let query: Vec<String> = (0..1000).map(|i| format!("label=k{i}")).collect();
    let r = get(&s, &format!("/api/v2/sandboxes/boxes?{}", query.join("&"))).await;
    assert_eq!(
        (r.status, r.field().as_str()),
        (422, "label"),
        "{}",
        r.text()
    );
    assert_enveloped(&r, "1000 label filters");
    // Up to the documented cap is fine.
    let query: Vec<String> = (0..hearth_api::boxes::MAX_LIST_FILTERS)
        .map(|i| format!("label=k{i}=v"))
        .collect();
    let r = get(&s, &format!("/api/v2/sandboxes/boxes?{}", query.join("&"))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // A NUL byte in a filter matches nothing (and PostgreSQL refuses it).
    let r = get(&s, "/api/v2/sandboxes/boxes?name_contains=a%00b").await;
    assert_eq!((r.status, r.field().as_str()), (422, "name_contains"));
    s.stop().await;
}

#[tokio::test]
async fn finding7_empty_upload_path_is_422() {
    let s = Server::start(false).await;
    let (ct, body) = multipart(b"x");
    let id = uuid::Uuid::now_v7();
    for path in ["", "%00", "a%00b"] {
        let req = RawRequest::new(
            "POST",
            &format!("/dataplane/{id}/upload?path={path}"),
            &headers(&s.admin, &ct),
            body.clone(),
        );
        let r = send(s.addr, &req.bytes()).await;
        assert_eq!(
            (r.status, r.field().as_str()),
            (422, "path"),
            "{}",
            r.text()
        );
        let r = get(&s, &format!("/dataplane/{id}/download?path={path}")).await;
        assert_eq!(
            (r.status, r.field().as_str()),
            (422, "path"),
            "{}",
            r.text()
        );
    }
    s.stop().await;
}

#[tokio::test]
async fn finding9_query_errors_are_enveloped() {
    let s = Server::start(false).await;
    let id = uuid::Uuid::now_v7();
    let (ct, body) = multipart(b"x");
    for query in ["", "?other=1", "?path=/a&path=/b", "?path"] {
        let r = get(&s, &format!("/dataplane/{id}/download{query}")).await;
        assert_eq!(r.status, 422, "download{query}: {}", r.text());
        assert_eq!(r.field(), "path", "download{query}: {}", r.text());
        assert_enveloped(&r, query);
        let req = RawRequest::new(
            "POST",
            &format!("/dataplane/{id}/upload{query}"),
            &headers(&s.admin, &ct),
            body.clone(),
        );
        let r = send(s.addr, &req.bytes()).await;
        assert_eq!(r.status, 422, "upload{query}: {}", r.text());
        assert_eq!(r.field(), "path", "upload{query}: {}", r.text());
    }
    s.stop().await;
}

#[tokio::test]
async fn finding9_invalid_utf8_and_nul_in_paths_are_enveloped() {
    let s = Server::start(false).await;
    for path in [
        "/api/v2/sandboxes/boxes/%C3%28",
        "/v2/sandboxes/boxes/%FF/status",
        "/api/v2/sandboxes/snapshots/%C3%28",
        "/api/v2/sandboxes/boxes/a%00b",
        "/dataplane/%C3%28/download?path=/etc/hostname",
        "/downloads/%C3%28",
        "/services/%C3%28/x",
        "/services/tok/%FF",
    ] {
        let r = get(&s, path).await;
        assert_eq!(
            (r.status, r.error().as_str()),
            (400, "BadRequest"),
            "{path}: {}",
            r.text()
        );
        assert_enveloped(&r, path);
    }
    s.stop().await;
}

#[tokio::test]
async fn finding9_non_multipart_upload_is_enveloped() {
    let s = Server::start(false).await;
    let id = uuid::Uuid::now_v7();
    for ct in ["application/json", "text/plain", "multipart/form-data"] {
        let req = RawRequest::new(
            "POST",
            &format!("/dataplane/{id}/upload?path=/tmp/x"),
            &headers(&s.admin, ct),
            b"{\"file\": \"x\"}".to_vec(),
        );
        let r = send(s.addr, &req.bytes()).await;
        assert_eq!(
            (r.status, r.field().as_str()),
            (422, "file"),
            "{ct}: {}",
            r.text()
        );
        assert_enveloped(&r, ct);
    }
    s.stop().await;
}

#[tokio::test]
async fn finding9_malformed_chunked_body_is_400() {
    let s = Server::start(false).await;
    for path in [
        "/api/v2/sandboxes/boxes",
        "/api/v2/sandboxes/boxes/nope/start",
        &format!("/dataplane/{}/execute", uuid::Uuid::now_v7()),
    ] {
        let mut req = RawRequest::new(
            "POST",
            path,
            &headers(&s.admin, "application/json"),
            Vec::new(),
        );
        req.chunked = Some(b"2\r\n{}\r\nzz\r\nnot hex\r\n0\r\n\r\n".to_vec());
        let r = send(s.addr, &req.bytes()).await;
        assert_eq!(
            (r.status, r.error().as_str()),
            (400, "BadRequest"),
            "{path}: {}",
            r.text()
        );
    }
    // A body really over the limit is still 413, declared or chunked.
    let mut req = RawRequest::new(
        "POST",
        "/api/v2/sandboxes/boxes",
        &headers(&s.admin, "application/json"),
        Vec::new(),
    );
    let mut chunks = Vec::new();
    for _ in 0..40 {
        chunks.extend_from_slice(format!("{:x}\r\n", 64 * 1024).as_bytes());
        chunks.extend(std::iter::repeat_n(b' ', 64 * 1024));
        chunks.extend_from_slice(b"\r\n");
    }
    chunks.extend_from_slice(b"0\r\n\r\n");
    req.chunked = Some(chunks);
    let r = send(s.addr, &req.bytes()).await;
    assert_eq!(
        (r.status, r.error().as_str()),
        (413, "PayloadTooLarge"),
        "{}",
        r.text()
    );
    s.stop().await;
}

#[tokio::test]
async fn finding9_long_targets_and_large_heads_are_enveloped() {
    let s = Server::start(false).await;
    let long = format!("/api/v2/sandboxes/boxes/{}", "a".repeat(20_000));
    let r = get(&s, &long).await;
    assert_eq!(
        (r.status, r.error().as_str()),
        (414, "UriTooLong"),
        "{}",
        r.text()
    );
    let big = vec![
        ("x-api-key".to_owned(), s.admin.clone()),
        ("x-big".to_owned(), "b".repeat(70_000)),
    ];
    let req = RawRequest::new("GET", "/api/v2/sandboxes/boxes", &big, Vec::new());
    let r = send(s.addr, &req.bytes()).await;
    assert_eq!(
        (r.status, r.error().as_str()),
        (431, "RequestHeaderFieldsTooLarge"),
        "{}",
        r.text()
    );
    let many: Vec<(String, String)> = (0..150)
        .map(|i| (format!("x-h{i}"), "v".to_owned()))
        .collect();
    let req = RawRequest::new("GET", "/api/v2/sandboxes/boxes", &many, Vec::new());
    let r = send(s.addr, &req.bytes()).await;
    assert_eq!(r.status, 431, "{}", r.text());
    assert_enveloped(&r, "150 header fields");
    // Past hyper's own limits the answer is still a 414 or 431, without a
    // body (documented in guard.rs).
    let longer = format!("/api/v2/sandboxes/boxes/{}", "a".repeat(70_000));
    assert_eq!(get(&s, &longer).await.status, 414);
    s.stop().await;
}

#[tokio::test]
async fn finding9_start_and_stop_refuse_bodies_that_are_not_objects() {
    let s = Server::start(false).await;
    for action in ["start", "stop"] {
        let path = format!("/api/v2/sandboxes/boxes/no-such-box/{action}");
        // Nor a field: nothing reads one (never a silent yes).
        for body in [
            &b"[[[["[..],
            b"[]",
            b"\"x\"",
            b"42",
            b"{\"a\":",
            b"null",
            b"{\"unknown\": 1}",
        ] {
            let req = RawRequest::new(
                "POST",
                &path,
                &headers(&s.admin, "application/json"),
                body.to_vec(),
            );
            let r = send(s.addr, &req.bytes()).await;
            assert_eq!(
                r.status,
                422,
                "{action} {:?}: {}",
                String::from_utf8_lossy(body),
                r.text()
            );
            assert_enveloped(&r, action);
        }
        // What the SDK sends, and no body at all, are accepted.
        for body in [&b"{}"[..], b""] {
            let req = RawRequest::new(
                "POST",
                &path,
                &headers(&s.admin, "application/json"),
                body.to_vec(),
            );
            let r = send(s.addr, &req.bytes()).await;
            assert_eq!(
                (r.status, r.error().as_str()),
                (404, "NotFound"),
                "{}",
                r.text()
            );
        }
    }
    s.stop().await;
}

#[tokio::test]
async fn finding9_unknown_routes_and_wrong_methods_are_enveloped() {
    let s = Server::start(false).await;
    let id = uuid::Uuid::now_v7();
    for (method, path, status) in [
        ("GET", "/nope".to_owned(), 404),
        ("GET", "/api/v2/sandboxes/nope".to_owned(), 404),
        ("GET", format!("/dataplane/{id}/nope"), 404),
        ("PUT", "/api/v2/sandboxes/boxes".to_owned(), 405),
        ("DELETE", "/v2/sandboxes/snapshots".to_owned(), 405),
        ("POST", format!("/dataplane/{id}/download?path=/x"), 405),
        ("GET", format!("/dataplane/{id}/execute"), 405),
    ] {
        let req = RawRequest::new(method, &path, &headers(&s.admin, "text/plain"), Vec::new());
        let r = send(s.addr, &req.bytes()).await;
        assert_eq!(r.status, status, "{method} {path}: {}", r.text());
        assert_enveloped(&r, &path);
    }
    s.stop().await;
}

/// Boots a real microVM (`scripts/test-fast` skips `vm::`).
mod vm {
    use super::*;

    /// The mistakes only the guest can see: a working directory, shell or
    /// path that does not exist there. One busybox sandbox serves them all.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn finding7_exec_and_upload_mistakes_are_4xx() {
        let s = Server::start(true).await;
        let sb = s.sandbox("mistakes").await;
        let id = sb["id"].as_str().unwrap().to_owned();
        let dp = format!("/dataplane/{id}");
        let exec = |body: Value| {
            let s = &s;
            let path = format!("{dp}/execute");
            async move { s.json("POST", &path, Some(&s.admin), &body).await }
        };
        let r = exec(json!({"command": "echo ok"})).await;
        assert_eq!(
            (r.status, r.json().unwrap()["stdout"].as_str()),
            (200, Some("ok\n"))
        );

        // Refused by the guest: 400 CommandError (the SDK's SandboxOperationError).
        for body in [
            json!({"command": "true", "cwd": "/no/such/dir"}),
            json!({"command": "true", "cwd": "/etc/hostname"}),
            json!({"command": "true", "shell": "/bin/no-such-shell"}),
            json!({"command": "true", "shell": "/etc"}),
        ] {
            let r = exec(body.clone()).await;
            assert_eq!(
                (r.status, r.error().as_str()),
                (400, "CommandError"),
                "{body}: {}",
                r.text()
            );
        }
        // Refused up front: 422 naming the field.
        for (body, field) in [
            (json!({"command": "echo a\u{0}b"}), "command"),
            (json!({"command": "true", "cwd": "/tmp\u{0}"}), "cwd"),
            (json!({"command": "true", "shell": "/bin/sh\u{0}"}), "shell"),
            (json!({"command": "true", "env": {"A=B": "x"}}), "A=B"),
            (json!({"command": "true", "env": {"": "x"}}), "env"),
            (json!({"command": "true", "env": {"A": "x\u{0}"}}), "A"),
        ] {
            let r = exec(body.clone()).await;
            assert_eq!(r.status, 422, "{body}: {}", r.text());
            assert_eq!(r.field(), field, "{body}: {}", r.text());
        }

        // The SSE transport: the same refusals are a 400 before any event.
        for body in [
            json!({"command": "true", "cwd": "/no/such/dir"}),
            json!({"command": "true", "shell": "/bin/no-such-shell"}),
            json!({"command": "echo a\u{0}b"}),
            json!({"command": "true", "env": {"A=B": "x"}}),
            json!({"command": "true", "env": {"": "x"}}),
            json!({"command": "true", "run_config": {"user": "nobody-here"}}),
        ] {
            let r = s
                .json(
                    "POST",
                    &format!("{dp}/execute/stream/start"),
                    Some(&s.admin),
                    &body,
                )
                .await;
            assert_eq!(
                (r.status, r.error().as_str()),
                (400, "CommandError"),
                "{body}: {}",
                r.text()
            );
        }
        let r = s
            .json(
                "POST",
                &format!("{dp}/execute/stream/start"),
                Some(&s.admin),
                &json!({"command": "echo sse"}),
            )
            .await;
        assert_eq!(r.status, 200, "a good command still streams");

        // The WebSocket has no status to give once upgraded: the refusal is an
        // `error` frame of LangSmith's type CommandError, then a clean close.
        for frame in [
            json!({"type": "execute", "command": "true", "cwd": "/no/such/dir"}),
            json!({"type": "execute", "command": "true", "env": {"A=B": "x"}}),
        ] {
            let error = ws_error(&s, &id, &frame).await;
            assert_eq!(error["error_type"], "CommandError", "{frame}: {error}");
        }

        // Uploads over a directory are the caller's mistake too.
        let (ct, body) = multipart(b"data");
        let req = RawRequest::new(
            "POST",
            &format!("{dp}/upload?path=/tmp/afile"),
            &headers(&s.admin, &ct),
            body.clone(),
        );
        assert_eq!(send(s.addr, &req.bytes()).await.status, 200);
        // A device (or FIFO) is not a file to replace either.
        for path in ["/etc", "/", "/tmp/afile/x", "/dev/null"] {
            let req = RawRequest::new(
                "POST",
                &format!("{dp}/upload?path={path}"),
                &headers(&s.admin, &ct),
                body.clone(),
            );
            let r = send(s.addr, &req.bytes()).await;
            assert!(
                r.status == 400 && r.error() == "WriteError",
                "upload to {path}: {} {}",
                r.status,
                r.text()
            );
        }
        let r = s
            .json(
                "DELETE",
                "/api/v2/sandboxes/boxes/mistakes",
                Some(&s.admin),
                &json!({}),
            )
            .await;
        assert_eq!(r.status, 204, "{}", r.text());
        s.stop().await;
    }

    /// Runs one execute frame over the exec WebSocket; its `error` frame.
    async fn ws_error(s: &Server, id: &str, frame: &Value) -> Value {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        use tokio_tungstenite::tungstenite::Message;

        let mut req = format!("ws://{}/dataplane/{id}/execute/ws", s.addr)
            .into_client_request()
            .unwrap();
        req.headers_mut()
            .insert("x-api-key", s.admin.parse().unwrap());
        let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
        ws.send(Message::Text(frame.to_string().into()))
            .await
            .unwrap();
        loop {
            let msg = tokio::time::timeout(std::time::Duration::from_secs(30), ws.next())
                .await
                .expect("an answer frame");
            match msg {
                Some(Ok(Message::Text(t))) => {
                    let v: Value = serde_json::from_str(t.as_str()).unwrap();
                    if v["type"] == "error" {
                        return v;
                    }
                    assert_ne!(v["type"], "exit", "{frame} ran: {v}");
                }
                Some(Ok(_)) => {}
                other => panic!("{frame}: the socket ended without an error frame: {other:?}"),
            }
        }
    }
}
