//! Login-mode service URLs on a simulated host, end to end over HTTP: the
//! unmodified SDK asks for one, a browser (a cookie jar) signs in and
//! reaches the service, and the SDK's own `SandboxTokenVerifier` accepts
//! the user token the service got, and refuses a tampered one or one
//! presented to another service (`tests/sdk/login_urls.py` says what each
//! step shows).

use crate::harness::Server;
use crate::sdk_surface::python;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_urls_admit_signed_in_members_and_the_sdk_verifies_their_tokens() {
    let (server, _sim) = Server::on_sim_signed().await;
    let sandbox = server.sandbox("login-box").await;
    let name = sandbox["name"].as_str().unwrap().to_owned();
    let python = python::sdk_python();
    let endpoint = format!("http://{}", server.addr);
    let (admin, other) = (server.admin.clone(), server.other.clone());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../tests/sdk/login_urls.py"
            ))
            .env("LANGSMITH_ENDPOINT", endpoint)
            .env("LANGSMITH_API_KEY", admin)
            .env("OTHER_API_KEY", other)
            .env("SANDBOX", name)
            .env("NO_PROXY", "*")
            .output()
            .expect("run tests/sdk/login_urls.py")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim_end().ends_with("PASS"),
        "login_urls.py: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn set_cookie(r: &crate::harness::Resp, name: &str) -> Option<String> {
    r.headers
        .iter()
        .filter(|(k, _)| k == "set-cookie")
        .find_map(|(_, v)| {
            v.strip_prefix(&format!("{name}="))?
                .split(';')
                .next()
                .map(str::to_owned)
        })
}

async fn get(s: &Server, host: &str, path: &str, cookie: &str) -> crate::harness::Resp {
    let mut h = vec![("host".to_owned(), host.to_owned())];
    if !cookie.is_empty() {
        h.push(("cookie".to_owned(), cookie.to_owned()));
    }
    let req = crate::harness::RawRequest::new("GET", path, &h, Vec::new());
    crate::harness::send(s.addr, &req.bytes()).await
}

/// Issue 39, finding 2: a login service is on its sandbox port's own
/// origin, never the API's (where another tenant's token-URL page could
/// fetch it with the user's cookie); its session opens that origin only,
/// and a cross-site sign-in is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_sessions_live_on_their_own_origin_and_a_token_url_page_cannot_reach_them() {
    use hearth_hostapi::sim::SIM_HTTP_PORT;
    use serde_json::json;
    let (s, _sim) = Server::on_sim_signed().await;
    let a = s.sandbox("tenant-a").await;
    let body =
        json!({"name": "tenant-b", "snapshot": "busybox", "wait_for_ready": true, "timeout": 60});
    let r = s
        .json("POST", "/api/v2/sandboxes/boxes", Some(&s.other), &body)
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let b_id = r.json().unwrap()["id"].as_str().unwrap().to_owned();
    let grant = json!({"port": SIM_HTTP_PORT, "access": "restricted"});
    let r = s
        .json(
            "POST",
            "/api/v2/sandboxes/boxes/tenant-b/service-url",
            Some(&s.other),
            &grant,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let login_url = r.json().unwrap()["browser_url"]
        .as_str()
        .unwrap()
        .to_owned();
    let b_host = format!("{SIM_HTTP_PORT}-{b_id}.{}", crate::harness::TEST_DOMAIN);
    assert_eq!(login_url, format!("http://{b_host}/"));
    // A's token URL: another origin.
    let r = s
        .json(
            "POST",
            "/api/v2/sandboxes/boxes/tenant-a/service-url",
            Some(&s.admin),
            &json!({"port": SIM_HTTP_PORT}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let a_url = r.json().unwrap()["service_url"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        a_url,
        format!(
            "http://{SIM_HTTP_PORT}-{}.{}",
            a["id"].as_str().unwrap(),
            crate::harness::TEST_DOMAIN
        )
    );

    // Sign in to B's service on its origin.
    let r = get(&s, &b_host, "/", "").await;
    assert_eq!(r.status, 303);
    assert!(r
        .header("location")
        .unwrap()
        .starts_with("/.hearth/signin?next="));
    let form = get(&s, &b_host, "/.hearth/signin?next=/", "").await;
    assert_eq!(form.status, 200);
    let nonce = set_cookie(&form, "hearth_csrf").expect("the form's CSRF cookie");
    let page = form.text();
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_owned();
    let post = |origin: &str, csrf: &str| {
        let mut h = vec![
            ("host".to_owned(), b_host.clone()),
            (
                "content-type".to_owned(),
                "application/x-www-form-urlencoded".to_owned(),
            ),
            ("cookie".to_owned(), format!("hearth_csrf={nonce}")),
        ];
        if !origin.is_empty() {
            h.push(("origin".to_owned(), origin.to_owned()));
        }
        let form = form_urlencoded::Serializer::new(String::new())
            .append_pair("api_key", &s.other)
            .append_pair("next", "/")
            .append_pair("csrf", csrf)
            .finish();
        crate::harness::RawRequest::new("POST", "/.hearth/signin", &h, form.into_bytes())
    };
    // Login CSRF: another site's form, no Origin, a wrong CSRF token.
    for (origin, token) in [
        ("http://evil.test", csrf.as_str()),
        ("", csrf.as_str()),
        (&*format!("http://{b_host}"), "forged"),
    ] {
        let r = crate::harness::send(s.addr, &post(origin, token).bytes()).await;
        assert_eq!(r.status, 403, "{origin:?}: {}", r.text());
        assert!(set_cookie(&r, "hearth_login").is_none());
    }
    let r = crate::harness::send(s.addr, &post(&format!("http://{b_host}"), &csrf).bytes()).await;
    assert_eq!(r.status, 303, "{}", r.text());
    let session = set_cookie(&r, "hearth_login").expect("signed in");
    let cookie_line = r
        .headers
        .iter()
        .find(|(k, v)| k == "set-cookie" && v.starts_with("hearth_login="))
        .unwrap()
        .1
        .to_ascii_lowercase();
    assert!(!cookie_line.contains("domain"), "host-only: {cookie_line}");
    let r = get(&s, &b_host, "/", &format!("hearth_login={session}")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        !r.text().contains("hearth_login"),
        "the session reached the service: {}",
        r.text()
    );
    // A junk cookie beside it (planted for the whole domain) changes nothing.
    let r = get(
        &s,
        &b_host,
        "/",
        &format!("hearth_login=junk.1.AAAA; hearth_login={session}"),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());

    // Nothing of B's service is served on the API's origin (where A's
    // pages once ran): the old URL only redirects, even with the session.
    let r = get(
        &s,
        "127.0.0.1",
        &format!("/services/login/{b_id}/{SIM_HTTP_PORT}/"),
        &format!("hearth_login={session}"),
    )
    .await;
    assert_eq!(r.status, 308, "{}", r.text());
    assert_eq!(r.header("location"), Some(login_url.as_str()));
    // The session opens B's origin only: A's, or another port of B's, no.
    let a_host = a_url.strip_prefix("http://").unwrap();
    let r = get(&s, a_host, "/", &format!("hearth_login={session}")).await;
    assert_eq!(r.status, 403, "{}", r.text());
    let other_port = format!(
        "{}-{b_id}.{}",
        SIM_HTTP_PORT + 1,
        crate::harness::TEST_DOMAIN
    );
    let r = get(&s, &other_port, "/", &format!("hearth_login={session}")).await;
    assert_eq!(r.status, 403, "{}", r.text());

    // Issue 39, item 6: a login grant is revoked through the API, at once.
    let path = format!("/api/v2/sandboxes/boxes/tenant-b/service-urls?port={SIM_HTTP_PORT}");
    let r = s.json("DELETE", &path, Some(&s.admin), &json!({})).await;
    assert_eq!(r.status, 404, "another workspace's: {}", r.text());
    let r = s.json("DELETE", &path, Some(&s.other), &json!({})).await;
    assert_eq!(r.status, 204, "{}", r.text());
    let r = get(&s, &b_host, "/", &format!("hearth_login={session}")).await;
    assert_eq!(
        r.status,
        403,
        "the revoked grant admits no one: {}",
        r.text()
    );
    let r = s
        .json(
            "DELETE",
            "/api/v2/sandboxes/boxes/tenant-b/service-urls?port=0",
            Some(&s.other),
            &json!({}),
        )
        .await;
    assert_eq!(r.status, 422, "{}", r.text());
    let r = s
        .json(
            "GET",
            "/api/v2/sandboxes/boxes/tenant-b/service-urls",
            Some(&s.other),
            &json!({}),
        )
        .await;
    assert_eq!(
        r.status,
        405,
        "listing is not served, and says so: {}",
        r.text()
    );
}
