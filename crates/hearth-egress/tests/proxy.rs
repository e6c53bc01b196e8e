//! End-to-end tests of the egress proxy: a sandbox network namespace whose
//! nftables redirect every TCP connection to the transparent listener (so
//! `SO_ORIGINAL_DST` is real), clients run inside it (`curl` through
//! `ip netns exec`, or threads that `setns`), upstream servers in the root
//! namespace on loopback that record what they receive.
//!
//! Needs root and `nft`; skips with SKIP otherwise, fails instead when
//! `HEARTH_REQUIRE_NET=1`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hearth_api::nested::{
    AccessControl, ProxyCallback, ProxyConfig, ProxyHeader, ProxyRule, SecretKind,
};
use hearth_egress::{Attachment, Egress, EgressSettings, Policy, SandboxSockets};
use http_body_util::Full;
use hyper_util::rt::TokioIo;

static NEXT: AtomicUsize = AtomicUsize::new(0);

fn net_available() -> bool {
    let root = nix::unistd::Uid::effective().is_root();
    let nft = Command::new("nft")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if root && nft {
        return true;
    }
    if std::env::var("HEARTH_REQUIRE_NET").as_deref() == Ok("1") {
        panic!("HEARTH_REQUIRE_NET=1 but root={root} nft={nft}");
    }
    eprintln!("SKIP: needs root and nft (root={root}, nft={nft})");
    false
}

fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A sandbox namespace; removed on drop.
struct Netns {
    name: String,
}

impl Netns {
    fn new() -> Netns {
        let name = format!(
            "hegress-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        sh(&["ip", "netns", "add", &name]);
        let ns = Netns { name };
        let n = ns.name.as_str();
        sh(&["ip", "-n", n, "link", "set", "lo", "up"]);
        // A veth pair stands in for the TAP (both ends stay in the namespace).
        sh(&[
            "ip", "-n", n, "link", "add", "tap0", "type", "veth", "peer", "name", "tap0p",
        ]);
        sh(&["ip", "-n", n, "link", "set", "tap0p", "up"]);
        sh(&["ip", "-n", n, "addr", "add", "10.200.0.1/30", "dev", "tap0"]);
        sh(&["ip", "-n", n, "link", "set", "tap0", "up"]);
        sh(&["ip", "-n", n, "route", "add", "default", "dev", "tap0"]);
        sh(&[
            "ip", "-6", "-n", n, "route", "add", "default", "dev", "tap0",
        ]);
        let rules = "table ip hearth {\n chain out {\n  type nat hook output priority -100; policy accept;\n  \
                     tcp dport != { 15001, 3128 } redirect to :15001\n }\n}\n";
        let script = format!("printf '{rules}' | nft -f -");
        sh(&["ip", "netns", "exec", n, "sh", "-c", &script]);
        ns
    }

    /// Runs `f` on a thread inside the namespace.
    fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let fd = std::fs::File::open(path).unwrap();
            nix::sched::setns(fd, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            f()
        })
        .join()
        .unwrap()
    }

    fn sockets(&self) -> SandboxSockets {
        self.run(|| SandboxSockets {
            transparent: std::net::TcpListener::bind("0.0.0.0:15001").unwrap(),
            explicit: std::net::TcpListener::bind("10.200.0.1:3128").unwrap(),
            dns: std::net::UdpSocket::bind("10.200.0.1:53").unwrap(),
        })
    }

    /// `curl -s` inside the namespace; returns (status, body).
    async fn curl(&self, args: &[&str]) -> (u16, String) {
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            &self.name,
            "curl",
            "-sS",
            "-m",
            "15",
            "-w",
            "\n%{http_code}",
        ]);
        cmd.args(args);
        let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_owned())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// What an upstream server received.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: http::HeaderMap,
}

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Seen>>>);

impl Recorder {
    fn all(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// An HTTP(S) server on 127.0.0.1 that records requests; with `reply`,
/// answers with that body (callbacks), else `hello <path>`.
async fn upstream(
    tls: Option<Arc<rustls::ServerConfig>>,
    reply: Option<(u16, String)>,
) -> (u16, Recorder) {
    upstream_on("127.0.0.1", tls, reply).await
}

/// [`upstream`] on another loopback address (127.0.0.2 is not allowed).
async fn upstream_on(
    ip: &str,
    tls: Option<Arc<rustls::ServerConfig>>,
    reply: Option<(u16, String)>,
) -> (u16, Recorder) {
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let rec = Recorder::default();
    let r = rec.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (r, tls, reply) = (r.clone(), tls.clone(), reply.clone());
            tokio::spawn(async move {
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let (r, reply) = (r.clone(), reply.clone());
                        async move {
                            r.0.lock().unwrap().push(Seen {
                                path: req.uri().path().to_owned(),
                                headers: req.headers().clone(),
                            });
                            let (status, body) =
                                reply.unwrap_or((200, format!("hello {}", req.uri().path())));
                            let mut resp = http::Response::new(Full::new(Bytes::from(body)));
                            *resp.status_mut() = http::StatusCode::from_u16(status).unwrap();
                            Ok::<_, Infallible>(resp)
                        }
                    });
                let builder = hyper::server::conn::http1::Builder::new();
                match tls {
                    Some(cfg) => {
                        if let Ok(s) = tokio_rustls::TlsAcceptor::from(cfg).accept(tcp).await {
                            let _ = builder.serve_connection(TokioIo::new(s), svc).await;
                        }
                    }
                    None => {
                        let _ = builder.serve_connection(TokioIo::new(tcp), svc).await;
                    }
                }
            });
        }
    });
    (port, rec)
}

/// A test origin CA and a server config for `secure.test` signed by it.
fn origin_tls(dir: &std::path::Path) -> (PathBuf, Arc<rustls::ServerConfig>) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "test origin CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["secure.test".to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let ca_path = dir.join("origin-ca.pem");
    std::fs::write(&ca_path, ca_cert.pem()).unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .unwrap();
    (ca_path, Arc::new(cfg))
}

struct World {
    ns: Netns,
    egress: Egress,
    _attachment: Attachment,
    dir: PathBuf,
    origin_ca: PathBuf,
    proxy_ca: PathBuf,
    http_port: u16,
    http: Recorder,
    https_port: u16,
    https: Recorder,
}

const SANDBOX: &str = "sb-test";

async fn world(policy: Policy) -> World {
    let dir = std::env::temp_dir().join(format!(
        "hegress-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let (origin_ca, origin_cfg) = origin_tls(&dir);
    let (http_port, http) = upstream(None, None).await;
    let (https_port, https) = upstream(Some(origin_cfg), None).await;
    let lo: IpAddr = "127.0.0.1".parse().unwrap();
    let mut hosts = BTreeMap::new();
    for name in [
        "plain.test",
        "secure.test",
        "evil.test",
        "api.ok.test",
        "api7.re.test",
        "callback.test",
    ] {
        hosts.insert(name.to_owned(), vec![lo]);
    }
    hosts.insert(
        "private.test".to_owned(),
        vec!["127.0.0.2".parse().unwrap()],
    );
    hosts.insert(
        "mixed.test".to_owned(),
        vec!["127.0.0.2".parse().unwrap(), lo],
    );
    let egress = Egress::new(EgressSettings {
        ca_dir: dir.join("ca"),
        origin_ca_files: vec![origin_ca.clone()],
        allow_private: vec!["127.0.0.1/32".parse().unwrap()],
        hosts,
        connect_timeout: Duration::from_secs(5),
    })
    .unwrap();
    let proxy_ca = dir.join("proxy-ca.pem");
    std::fs::write(&proxy_ca, egress.ca_pem()).unwrap();
    let ns = Netns::new();
    let attachment = egress.attach(SANDBOX, policy, ns.sockets()).unwrap();
    World {
        ns,
        egress,
        _attachment: attachment,
        dir,
        origin_ca,
        proxy_ca,
        http_port,
        http,
        https_port,
        https,
    }
}

impl World {
    /// Plain HTTP to `name` on the upstream's port, via an arbitrary address.
    async fn get_http(&self, name: &str, path: &str, extra: &[&str]) -> (u16, String) {
        let url = format!("http://{name}:{}{path}", self.http_port);
        let resolve = format!("{name}:{}:192.0.2.10", self.http_port);
        let mut args = vec!["--resolve", &resolve, &url];
        args.extend_from_slice(extra);
        self.ns.curl(&args).await
    }

    /// HTTPS to `name`, trusting the proxy CA.
    async fn get_https(&self, name: &str, path: &str, extra: &[&str]) -> (u16, String) {
        let url = format!("https://{name}:{}{path}", self.https_port);
        let resolve = format!("{name}:{}:192.0.2.10", self.https_port);
        let ca = self.proxy_ca.to_str().unwrap().to_owned();
        let mut args = vec!["--resolve", &resolve, "--cacert", &ca, &url];
        args.extend_from_slice(extra);
        self.ns.curl(&args).await
    }

    fn counters(&self) -> hearth_egress::EgressCounters {
        self.egress
            .metrics()
            .into_iter()
            .find(|(id, _)| id == SANDBOX)
            .unwrap()
            .1
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn policy(cfg: ProxyConfig) -> Policy {
    Policy::from_config(&cfg, &mut |h| Ok(h.value.clone().unwrap_or_default())).unwrap()
}

fn access(allow: Option<&[&str]>, deny: Option<&[&str]>) -> ProxyConfig {
    let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
    ProxyConfig {
        access_control: Some(AccessControl {
            allow_list: allow.map(v),
            deny_list: deny.map(v),
        }),
        ..Default::default()
    }
}

fn header(name: &str, value: &str) -> ProxyHeader {
    ProxyHeader {
        name: name.into(),
        kind: SecretKind::Plaintext,
        value: Some(value.into()),
        is_set: None,
    }
}

/// A header whose value comes from a workspace secret (the test policy
/// takes the stored value as the resolved one).
fn secret(name: &str, value: &str) -> ProxyHeader {
    ProxyHeader {
        kind: SecretKind::WorkspaceSecret,
        ..header(name, value)
    }
}

/// Sends `bytes` to `target` from inside the namespace; the whole answer.
fn raw_exchange(ns: &Netns, target: SocketAddr, bytes: &'static [u8]) -> String {
    ns.run(move || {
        let mut s = std::net::TcpStream::connect(target).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(bytes).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    })
}

fn rule(name: &str, hosts: &[&str], headers: &[(&str, &str)]) -> ProxyRule {
    ProxyRule {
        name: name.into(),
        match_hosts: hosts.iter().map(|s| s.to_string()).collect(),
        headers: headers.iter().map(|(n, v)| header(n, v)).collect(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_list_exact_glob_regex_and_address() {
    if !net_available() {
        return;
    }
    let w = world(policy(access(
        Some(&[
            "plain.test",
            "*.ok.test",
            "~api[0-9]\\.re\\.test",
            "127.0.0.0/8",
        ]),
        None,
    )))
    .await;
    assert_eq!(
        w.get_http("plain.test", "/a", &[]).await,
        (200, "hello /a".into())
    );
    assert_eq!(w.get_http("api.ok.test", "/b", &[]).await.0, 200);
    assert_eq!(w.get_http("api7.re.test", "/c", &[]).await.0, 200);
    // evil.test resolves into the allowed CIDR, so it passes by address.
    assert_eq!(w.get_http("evil.test", "/d", &[]).await.0, 200);
    w.egress.set_policy(
        SANDBOX,
        policy(access(Some(&["plain.test", "*.ok.test"]), None)),
    );
    let (status, body) = w.get_http("evil.test", "/e", &[]).await;
    assert_eq!(status, 403);
    assert_eq!(
        body.trim(),
        "Hearth egress proxy: \"evil.test\" is not in this sandbox's allow_list"
    );
    let (status, body) = w.get_https("evil.test", "/f", &[]).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("not in this sandbox's allow_list"));
    assert_eq!(w.http.len(), 4);
    assert!(w.counters().connections_refused >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_list_and_private_addresses() {
    if !net_available() {
        return;
    }
    let w = world(policy(access(
        None,
        Some(&["evil.test", "198.51.100.0/24"]),
    )))
    .await;
    assert_eq!(w.get_http("plain.test", "/", &[]).await.0, 200);
    let (status, body) = w.get_http("EVIL.test", "/", &[]).await;
    assert_eq!(status, 403);
    assert!(body.contains("is in this sandbox's deny_list"), "{body}");
    let (status, body) = w.get_http("private.test", "/", &[]).await;
    assert_eq!(status, 403);
    assert!(body.contains("is a private address (127.0.0.2)"), "{body}");
    // A raw connection to a denied CIDR is closed without reaching anything.
    let port = w.http_port;
    let got = w.ns.run(move || {
        let mut s = std::net::TcpStream::connect(("198.51.100.7", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 16];
        s.read(&mut buf)
    });
    assert!(matches!(got, Ok(0) | Err(_)), "{got:?}");
    assert_eq!(w.http.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_rules_plain_and_intercepted_tls() {
    if !net_available() {
        return;
    }
    let mut paths = rule(
        "paths",
        &["secure.test"],
        &[("authorization", "Bearer paths")],
    );
    paths.match_paths = vec!["/v1/*".into()];
    let mut hdrs = rule(
        "hdrs",
        &["secure.test"],
        &[("authorization", "Bearer hdrs")],
    );
    hdrs.match_headers = vec!["x-tenant: blue".into()];
    let cfg = ProxyConfig {
        rules: vec![
            paths,
            hdrs,
            rule(
                "any",
                &["secure.test", "plain.test"],
                &[("authorization", "Bearer any")],
            ),
            rule(
                "never",
                &["secure.test"],
                &[("authorization", "Bearer never")],
            ),
        ],
        ..Default::default()
    };
    let w = world(policy(cfg)).await;
    let auth = |s: &Seen| {
        s.headers
            .get_all("authorization")
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        w.get_http("plain.test", "/x", &["-H", "Authorization: guest"])
            .await
            .0,
        200
    );
    assert_eq!(auth(&w.http.all()[0]), vec!["Bearer any"]);
    assert_eq!(
        w.get_https("secure.test", "/v1/chat", &["-H", "Authorization: guest"])
            .await,
        (200, "hello /v1/chat".into())
    );
    assert_eq!(
        w.get_https("secure.test", "/v2", &["-H", "X-Tenant: blue"])
            .await
            .0,
        200
    );
    assert_eq!(w.get_https("secure.test", "/v2", &[]).await.0, 200);
    let seen = w.https.all();
    let paths: Vec<&str> = seen.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(paths, ["/v1/chat", "/v2", "/v2"]);
    assert_eq!(
        seen.iter().map(auth).collect::<Vec<_>>(),
        vec![
            vec!["Bearer paths"],
            vec!["Bearer hdrs"],
            vec!["Bearer any"]
        ]
    );
    let c = w.counters();
    assert!(
        c.bytes_in > 0 && c.bytes_out > 0 && c.connections_allowed >= 4,
        "{c:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_tls_without_rules_is_spliced() {
    if !net_available() {
        return;
    }
    let w = world(Policy::default()).await;
    // The guest trusts only the origin CA: it sees the upstream's own certificate.
    let url = format!("https://secure.test:{}/spliced", w.https_port);
    let resolve = format!("secure.test:{}:192.0.2.10", w.https_port);
    let ca = w.origin_ca.to_str().unwrap().to_owned();
    assert_eq!(
        w.ns.curl(&["--resolve", &resolve, "--cacert", &ca, "--http2", &url])
            .await,
        (200, "hello /spliced".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callbacks_cached_fail_closed_and_beaten_by_rules() {
    if !net_available() {
        return;
    }
    let (ok_port, ok_calls) = upstream(
        None,
        Some((200, r#"{"headers":{"X-Api-Key":"from-callback"}}"#.into())),
    )
    .await;
    let (bad_port, bad_calls) = upstream(None, Some((500, "nope".into()))).await;
    let cb = |url: String, host: &str| ProxyCallback {
        match_hosts: vec![host.into()],
        url,
        ttl_seconds: 60,
        full_request: None,
        request_headers: vec![header("x-callback-secret", "s")],
    };
    let cfg = ProxyConfig {
        rules: vec![rule("static", &["plain.test"], &[("x-api-key", "static")])],
        callbacks: vec![
            cb(
                format!("http://callback.test:{ok_port}/resolve"),
                "secure.test",
            ),
            cb(format!("http://127.0.0.1:{ok_port}/resolve"), "plain.test"),
            cb(
                format!("http://127.0.0.1:{bad_port}/resolve"),
                "api.ok.test",
            ),
        ],
        ..Default::default()
    };
    let w = world(policy(cfg)).await;
    assert_eq!(
        w.get_https("secure.test", "/1", &["-H", "X-Api-Key: guest"])
            .await
            .0,
        200
    );
    assert_eq!(w.get_https("secure.test", "/2", &[]).await.0, 200);
    let seen = w.https.all();
    assert!(seen
        .iter()
        .all(|s| s.headers["x-api-key"] == "from-callback"));
    let calls = ok_calls.all();
    assert_eq!(
        calls.len(),
        1,
        "second request within the TTL calls back again"
    );
    assert_eq!(calls[0].headers["x-callback-secret"], "s");
    // Static rule beats the callback for the same host.
    assert_eq!(w.get_http("plain.test", "/s", &[]).await.0, 200);
    assert_eq!(w.http.all()[0].headers["x-api-key"], "static");
    assert_eq!(ok_calls.len(), 1);
    // Failing callback: 502, nothing upstream.
    let (status, body) = w.get_https("api.ok.test", "/f", &[]).await;
    assert_eq!(status, 502);
    assert!(
        body.contains("header callback for \"api.ok.test\" failed"),
        "{body}"
    );
    assert_eq!(bad_calls.len(), 1);
    assert_eq!(w.http.len(), 1);
    assert_eq!(w.https.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_policy_applies_to_next_request_on_kept_alive_connection() {
    if !net_available() {
        return;
    }
    let w = world(Policy::default()).await;
    let port = w.http_port;
    let (to_test, from_client) = std::sync::mpsc::channel::<String>();
    let (to_client, from_test) = std::sync::mpsc::channel::<()>();
    let path = format!("/run/netns/{}", w.ns.name);
    let client = std::thread::spawn(move || {
        nix::sched::setns(
            std::fs::File::open(path).unwrap(),
            nix::sched::CloneFlags::CLONE_NEWNET,
        )
        .unwrap();
        let mut s = std::net::TcpStream::connect(("192.0.2.44", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let exchange = |s: &mut std::net::TcpStream| {
            s.write_all(b"GET /k HTTP/1.1\r\nHost: plain.test\r\n\r\n")
                .unwrap();
            let mut buf = vec![0u8; 4096];
            let n = s.read(&mut buf).unwrap();
            String::from_utf8_lossy(&buf[..n]).into_owned()
        };
        to_test.send(exchange(&mut s)).unwrap();
        from_test.recv().unwrap();
        to_test.send(exchange(&mut s)).unwrap();
    });
    let first = tokio::task::spawn_blocking({
        let rx = from_client;
        move || {
            let a = rx.recv().unwrap();
            (a, rx)
        }
    })
    .await
    .unwrap();
    assert!(first.0.starts_with("HTTP/1.1 200"), "{}", first.0);
    assert!(w
        .egress
        .set_policy(SANDBOX, policy(access(None, Some(&["plain.test"])))));
    to_client.send(()).unwrap();
    let second = tokio::task::spawn_blocking(move || first.1.recv().unwrap())
        .await
        .unwrap();
    assert!(second.starts_with("HTTP/1.1 403"), "{second}");
    client.join().unwrap();
    assert_eq!(w.http.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_proxy_connect_and_absolute_form() {
    if !net_available() {
        return;
    }
    let w = world(policy(access(None, Some(&["evil.test"])))).await;
    let url = format!("https://secure.test:{}/tunnel", w.https_port);
    let ca = w.origin_ca.to_str().unwrap().to_owned();
    assert_eq!(
        w.ns.curl(&["-x", "http://10.200.0.1:3128", "--cacert", &ca, &url])
            .await,
        (200, "hello /tunnel".into())
    );
    let url = format!("http://plain.test:{}/abs", w.http_port);
    assert_eq!(
        w.ns.curl(&["-x", "http://10.200.0.1:3128", &url]).await,
        (200, "hello /abs".into())
    );
    let url = format!("https://evil.test:{}/x", w.https_port);
    let (status, _) =
        w.ns.curl(&["-x", "http://10.200.0.1:3128", "--cacert", &ca, &url])
            .await;
    assert_ne!(status, 200);
    // curl reports the CONNECT refusal itself; check it raw.
    let resp = w.ns.run(|| {
        let mut s = std::net::TcpStream::connect("10.200.0.1:3128").unwrap();
        s.write_all(b"CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    });
    assert!(resp.starts_with("HTTP/1.1 403"), "{resp}");
    assert!(resp.contains("deny_list"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_answers_and_refuses() {
    if !net_available() {
        return;
    }
    use hickory_proto::op::{Message, Query, ResponseCode};
    use hickory_proto::rr::{Name, RecordType};
    let w = world(policy(access(None, Some(&["evil.test"])))).await;
    let ask = |name: &str, t: RecordType| {
        let mut m = Message::new();
        m.set_id(7).set_recursion_desired(true);
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
        m.to_vec().unwrap()
    };
    let queries = [
        ask("plain.test.", RecordType::A),
        ask("evil.test.", RecordType::A),
        ask("plain.test.", RecordType::MX),
        b"\x00\x01garbage".to_vec(),
        // Static hosts naming private addresses the operator did not allow:
        // the gate would refuse a connection, so DNS does not tell.
        ask("private.test.", RecordType::A),
        ask("mixed.test.", RecordType::A),
        // Last, so 127.0.0.1 is known as plain.test again (raw TCP below).
        ask("plain.test.", RecordType::A),
    ];
    let answers = w.ns.run(move || {
        let s = std::net::UdpSocket::bind("10.200.0.1:0").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        queries
            .iter()
            .map(|q| {
                s.send_to(q, "10.200.0.1:53").unwrap();
                let mut buf = [0u8; 1500];
                s.recv(&mut buf).ok().map(|n| buf[..n].to_vec())
            })
            .collect::<Vec<_>>()
    });
    let a = Message::from_vec(answers[0].as_ref().unwrap()).unwrap();
    assert_eq!(a.response_code(), ResponseCode::NoError);
    assert_eq!(a.answers().len(), 1);
    assert_eq!(a.answers()[0].ttl(), 30);
    let nx = Message::from_vec(answers[1].as_ref().unwrap()).unwrap();
    assert_eq!(nx.response_code(), ResponseCode::NXDomain);
    let mx = Message::from_vec(answers[2].as_ref().unwrap()).unwrap();
    assert_eq!(
        (mx.response_code(), mx.answers().len()),
        (ResponseCode::NoError, 0)
    );
    assert!(answers[3].is_none(), "garbage must be dropped");
    let private = Message::from_vec(answers[4].as_ref().unwrap()).unwrap();
    assert_eq!(private.response_code(), ResponseCode::NXDomain);
    let mixed = Message::from_vec(answers[5].as_ref().unwrap()).unwrap();
    let ips: Vec<String> = mixed
        .answers()
        .iter()
        .map(|r| r.data().to_string())
        .collect();
    assert_eq!(ips, ["127.0.0.1"], "only the allowed address is answered");
    let c = w.counters();
    assert_eq!((c.dns_queries, c.dns_refused), (6, 2));
    // Raw TCP to the address DNS answered is judged by that name.
    w.egress
        .set_policy(SANDBOX, policy(access(None, Some(&["plain.test"]))));
    let port = w.http_port;
    let got = w.ns.run(move || {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = s.write_all(b"\x00\x01raw");
        let mut buf = [0u8; 16];
        s.read(&mut buf)
    });
    assert!(matches!(got, Ok(0) | Err(_)), "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_never_panics() {
    if !net_available() {
        return;
    }
    let w = world(policy(ProxyConfig {
        rules: vec![rule("r", &["secure.test"], &[("x", "y")])],
        ..Default::default()
    }))
    .await;
    let port = w.https_port;
    w.ns.run(move || {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut rand = |n: usize| {
            (0..n)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect::<Vec<u8>>()
        };
        let mut inputs: Vec<Vec<u8>> = (0..20).map(|i| rand(i * 37 + 1)).collect();
        inputs.push(
            [
                b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03".as_slice(),
                &rand(40),
            ]
            .concat(),
        ); // truncated ClientHello
        inputs.push(
            [
                b"GET / HTTP/1.1\r\nHost: plain.test\r\nX: ".as_slice(),
                &vec![b'a'; 200_000],
            ]
            .concat(),
        );
        inputs.push(b"GET / HTTP/1.1\r\nHost: \r\n\r\n".to_vec());
        for input in inputs {
            for target in [
                SocketAddr::from(([192, 0, 2, 9], port)),
                "10.200.0.1:3128".parse().unwrap(),
            ] {
                let Ok(mut s) = std::net::TcpStream::connect(target) else {
                    continue;
                };
                s.set_read_timeout(Some(Duration::from_millis(500)))
                    .unwrap();
                let _ = s.write_all(&input);
                let _ = s.shutdown(std::net::Shutdown::Write);
                let mut sink = Vec::new();
                let _ = s.read_to_end(&mut sink);
            }
        }
    });
    // Still serving afterwards.
    assert_eq!(w.get_http("plain.test", "/alive", &[]).await.0, 200);
}

// Security review (issue 16), finding 2: a header rule's secret follows the
// Host header the guest chooses.

/// A rule for `secure.test` and `plain.test` whose Authorization comes from
/// a secret, beside a plaintext header.
fn secret_rule_cfg() -> ProxyConfig {
    ProxyConfig {
        rules: vec![ProxyRule {
            name: "api".into(),
            match_hosts: vec!["secure.test".into(), "plain.test".into()],
            headers: vec![
                secret("authorization", "Bearer s3cret"),
                header("x-plain", "p"),
            ],
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding2_header_rule_secret_is_not_sent_when_host_header_disagrees() {
    if !net_available() {
        return;
    }
    let w = world(policy(secret_rule_cfg())).await;
    let proxy_ca = w.proxy_ca.to_str().unwrap().to_owned();
    // Intercepted TLS (transparent): SNI secure.test, Host evil.test.
    let (status, body) = w
        .get_https("secure.test", "/t", &["-H", "Host: evil.test"])
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("evil.test"), "{body}");
    // Through the explicit proxy: CONNECT secure.test, then Host evil.test.
    let url = format!("https://secure.test:{}/c", w.https_port);
    let (status, body) =
        w.ns.curl(&[
            "-x",
            "http://10.200.0.1:3128",
            "--cacert",
            &proxy_ca,
            "-H",
            "Host: evil.test",
            &url,
        ])
        .await;
    assert_eq!(status, 400, "{body}");
    // Absolute form: the target says plain.test, Host says evil.test.
    let url = format!("http://plain.test:{}/a", w.http_port);
    let (status, body) =
        w.ns.curl(&[
            "-x",
            "http://10.200.0.1:3128",
            "-H",
            "Host: evil.test",
            &url,
        ])
        .await;
    assert_eq!(status, 400, "{body}");
    // A Host naming another port than the connection's.
    let (status, body) = w
        .get_https("secure.test", "/p", &["-H", "Host: secure.test:1"])
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!((w.https.len(), w.http.len()), (0, 0), "nothing forwarded");
    // Agreeing names (any case, a trailing dot) still work.
    let (status, _) = w
        .get_https("secure.test", "/ok", &["-H", "Host: SECURE.test."])
        .await;
    assert_eq!(status, 200);
    assert_eq!(w.https.all()[0].headers["authorization"], "Bearer s3cret");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding2_tls_server_name_must_be_the_connect_target() {
    if !net_available() {
        return;
    }
    let w = world(policy(secret_rule_cfg())).await;
    let proxy_ca = w.proxy_ca.to_str().unwrap().to_owned();
    // CONNECT evil.test, TLS for secure.test (curl's --connect-to).
    let port = w.https_port;
    let url = format!("https://secure.test:{port}/sni");
    let connect_to = format!("secure.test:{port}:evil.test:{port}");
    let (status, body) =
        w.ns.curl(&[
            "-x",
            "http://10.200.0.1:3128",
            "--connect-to",
            &connect_to,
            "--cacert",
            &proxy_ca,
            &url,
        ])
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("CONNECT target"), "{body}");
    assert_eq!(w.https.len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding2_duplicate_host_headers_are_400() {
    if !net_available() {
        return;
    }
    let w = world(policy(secret_rule_cfg())).await;
    let transparent = SocketAddr::from(([192, 0, 2, 10], w.http_port));
    let explicit: SocketAddr = "10.200.0.1:3128".parse().unwrap();
    let resp = raw_exchange(
        &w.ns,
        transparent,
        b"GET /dup HTTP/1.1\r\nHost: plain.test\r\nHost: evil.test\r\nConnection: close\r\n\r\n",
    );
    assert!(resp.starts_with("HTTP/1.1 400"), "{resp}");
    assert!(resp.contains("more than one Host"), "{resp}");
    let resp = raw_exchange(
        &w.ns,
        explicit,
        b"GET http://plain.test/dup HTTP/1.1\r\nHost: plain.test\r\nHost: plain.test\r\nConnection: close\r\n\r\n",
    );
    assert!(resp.starts_with("HTTP/1.1 400"), "{resp}");
    let resp = raw_exchange(
        &w.ns,
        transparent,
        b"GET /bad HTTP/1.1\r\nHost: plain.test, evil.test\r\nConnection: close\r\n\r\n",
    );
    assert!(resp.starts_with("HTTP/1.1 400"), "{resp}");
    assert_eq!(w.http.len(), 0, "nothing forwarded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding2_secret_headers_are_not_injected_over_plain_http() {
    if !net_available() {
        return;
    }
    let (cb_port, cb_calls) = upstream(
        None,
        Some((200, r#"{"headers":{"X-Api-Key":"from-callback"}}"#.into())),
    )
    .await;
    let mut cfg = secret_rule_cfg();
    cfg.callbacks = vec![ProxyCallback {
        match_hosts: vec!["api.ok.test".into()],
        url: format!("http://127.0.0.1:{cb_port}/resolve"),
        ttl_seconds: 60,
        full_request: None,
        request_headers: vec![],
    }];
    let w = world(policy(cfg)).await;
    // Transparent plain HTTP, and plain HTTP through the explicit proxy.
    assert_eq!(w.get_http("plain.test", "/t", &[]).await.0, 200);
    let url = format!("http://plain.test:{}/x", w.http_port);
    assert_eq!(
        w.ns.curl(&["-x", "http://10.200.0.1:3128", &url]).await.0,
        200
    );
    // A callback's headers are credentials too: not even fetched.
    assert_eq!(w.get_http("api.ok.test", "/cb", &[]).await.0, 200);
    let seen = w.http.all();
    assert_eq!(seen.len(), 3);
    for s in &seen {
        assert!(s.headers.get("authorization").is_none(), "{s:?}");
        assert!(s.headers.get("x-api-key").is_none(), "{s:?}");
    }
    assert_eq!(
        seen[0].headers["x-plain"], "p",
        "plaintext values still set"
    );
    assert_eq!(cb_calls.len(), 0);
    // Over TLS the secret is set.
    assert_eq!(w.get_https("secure.test", "/s", &[]).await.0, 200);
    assert_eq!(w.https.all()[0].headers["authorization"], "Bearer s3cret");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding2_trace_is_refused() {
    if !net_available() {
        return;
    }
    let w = world(policy(secret_rule_cfg())).await;
    for method in ["TRACE", "TRACK"] {
        let (status, _) = w.get_https("secure.test", "/", &["-X", method]).await;
        assert_eq!(status, 405, "{method} over TLS");
        let (status, _) = w.get_http("plain.test", "/", &["-X", method]).await;
        assert_eq!(status, 405, "{method} over plain HTTP");
    }
    let url = format!("http://plain.test:{}/", w.http_port);
    let (status, _) =
        w.ns.curl(&["-x", "http://10.200.0.1:3128", "-X", "TRACE", &url])
            .await;
    assert_eq!(status, 405, "TRACE through the explicit proxy");
    assert_eq!((w.https.len(), w.http.len()), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding2_allow_list_judges_the_name_the_request_goes_to() {
    if !net_available() {
        return;
    }
    // Intercepted because a rule applies; the allow list has one name.
    let mut cfg = access(Some(&["secure.test", "plain.test"]), None);
    cfg.rules = vec![rule("r", &["secure.test"], &[("x-r", "1")])];
    let w = world(policy(cfg)).await;
    let (status, body) = w
        .get_https("secure.test", "/", &["-H", "Host: evil.test"])
        .await;
    assert_eq!(status, 400, "{body}");
    let url = format!("http://plain.test:{}/", w.http_port);
    let (status, body) =
        w.ns.curl(&[
            "-x",
            "http://10.200.0.1:3128",
            "-H",
            "Host: evil.test",
            &url,
        ])
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!((w.https.len(), w.http.len()), (0, 0));
}

// Security review (issue 16), finding 3: callbacks are a server-side request
// forgery from the host agent unless they pass the private-address gate.

/// A callback for `secure.test` at `url`.
fn callback_cfg(url: String) -> ProxyConfig {
    ProxyConfig {
        callbacks: vec![ProxyCallback {
            match_hosts: vec!["secure.test".into()],
            url,
            ttl_seconds: 60,
            full_request: None,
            request_headers: vec![header("x-callback-secret", "s")],
        }],
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding3_callback_to_loopback_is_refused() {
    if !net_available() {
        return;
    }
    // The operator allows 127.0.0.1 only; 127.0.0.2 is the host's loopback.
    let (port, calls) = upstream_on(
        "127.0.0.2",
        None,
        Some((200, r#"{"headers":{"X-Api-Key":"k"}}"#.into())),
    )
    .await;
    let w = world(policy(callback_cfg(format!("http://127.0.0.2:{port}/")))).await;
    let (status, body) = w.get_https("secure.test", "/", &[]).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(calls.len(), 0, "the callback must not be called");
    assert_eq!(w.https.len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding3_callback_dns_rebinding_is_refused() {
    if !net_available() {
        return;
    }
    let (port, calls) = upstream_on(
        "127.0.0.2",
        None,
        Some((200, r#"{"headers":{"X-Api-Key":"k"}}"#.into())),
    )
    .await;
    // A name passes validation; it resolves to a private address now.
    let cfg = callback_cfg(format!("http://private.test:{port}/"));
    hearth_egress::validate_config(&cfg, &[]).unwrap();
    let w = world(policy(cfg)).await;
    assert_eq!(w.get_https("secure.test", "/", &[]).await.0, 502);
    // A name with a private and an allowed address: only the checked one
    // is connected to (nothing listens there, so the callback fails).
    w.egress.set_policy(
        SANDBOX,
        policy(callback_cfg(format!("http://mixed.test:{port}/"))),
    );
    assert_eq!(w.get_https("secure.test", "/", &[]).await.0, 502);
    assert_eq!(calls.len(), 0, "the private address must not be reached");
    assert_eq!(w.https.len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding3_callback_failure_tells_the_guest_nothing() {
    if !net_available() {
        return;
    }
    let (status_port, _) = upstream(None, Some((403, "metadata says no".into()))).await;
    let closed_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (private_port, _) = upstream_on("127.0.0.2", None, Some((405, "nope".into()))).await;
    let mut bodies = Vec::new();
    let w = world(Policy::default()).await;
    for url in [
        format!("http://127.0.0.1:{status_port}/"),
        format!("http://127.0.0.1:{closed_port}/"),
        format!("http://127.0.0.2:{private_port}/"),
    ] {
        w.egress
            .set_policy(SANDBOX, policy(callback_cfg(url.clone())));
        let (status, body) = w.get_https("secure.test", "/", &[]).await;
        assert_eq!(status, 502, "{url}: {body}");
        bodies.push(body);
    }
    for body in &bodies {
        assert_eq!(
            body.trim(),
            "Hearth egress proxy: the header callback for \"secure.test\" failed"
        );
    }
    assert_eq!(w.https.len(), 0);
}
