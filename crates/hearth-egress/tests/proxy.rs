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
use hearth_types::egress::SecretValue;
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
    /// A namespace with only `lo`, up.
    fn empty() -> Netns {
        let name = format!(
            "hegress-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        sh(&["ip", "netns", "add", &name]);
        let ns = Netns { name };
        sh(&["ip", "-n", &ns.name, "link", "set", "lo", "up"]);
        ns
    }

    fn new() -> Netns {
        let ns = Netns::empty();
        let n = ns.name.as_str();
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
        in_netns(format!("/run/netns/{}", self.name), f)
    }

    /// [`Netns::run`] without blocking a runtime worker meanwhile.
    async fn run_async<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/run/netns/{}", self.name);
        tokio::task::spawn_blocking(move || in_netns(path, f))
            .await
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

/// Runs `f` on a new thread that enters the namespace at `path` (never on a
/// pooled thread: it would stay in the namespace).
fn in_netns<T: Send + 'static>(path: String, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        let fd = std::fs::File::open(path).unwrap();
        nix::sched::setns(fd, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        f()
    })
    .join()
    .unwrap()
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
    body: Bytes,
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
                let svc = hyper::service::service_fn(
                    move |mut req: http::Request<hyper::body::Incoming>| {
                        let (r, reply) = (r.clone(), reply.clone());
                        async move {
                            // An upgrade is answered 101, then echoes what it reads.
                            let upgrade = req
                                .headers()
                                .contains_key("upgrade")
                                .then(|| hyper::upgrade::on(&mut req));
                            let (parts, body) = req.into_parts();
                            let body = http_body_util::BodyExt::collect(body)
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            r.0.lock().unwrap().push(Seen {
                                path: parts.uri.path().to_owned(),
                                headers: parts.headers.clone(),
                                body,
                            });
                            if let Some(on) = upgrade {
                                tokio::spawn(async move {
                                    if let Ok(io) = on.await {
                                        let (mut rd, mut wr) = tokio::io::split(TokioIo::new(io));
                                        let _ = tokio::io::copy(&mut rd, &mut wr).await;
                                    }
                                });
                                let mut resp = http::Response::new(Full::new(Bytes::new()));
                                *resp.status_mut() = http::StatusCode::SWITCHING_PROTOCOLS;
                                resp.headers_mut()
                                    .insert("upgrade", "websocket".parse().unwrap());
                                resp.headers_mut()
                                    .insert("connection", "Upgrade".parse().unwrap());
                                return Ok::<_, Infallible>(resp);
                            }
                            let (status, body) =
                                reply.unwrap_or((200, format!("hello {}", parts.uri.path())));
                            let mut resp = http::Response::new(Full::new(Bytes::from(body)));
                            *resp.status_mut() = http::StatusCode::from_u16(status).unwrap();
                            Ok::<_, Infallible>(resp)
                        }
                    },
                );
                let builder = hyper::server::conn::http1::Builder::new();
                match tls {
                    Some(cfg) => {
                        if let Ok(s) = tokio_rustls::TlsAcceptor::from(cfg).accept(tcp).await {
                            let _ = builder
                                .serve_connection(TokioIo::new(s), svc)
                                .with_upgrades()
                                .await;
                        }
                    }
                    None => {
                        let _ = builder
                            .serve_connection(TokioIo::new(tcp), svc)
                            .with_upgrades()
                            .await;
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
    // The leaf as files too, for servers that are not in this process.
    std::fs::write(dir.join("secure.test.pem"), leaf.pem()).unwrap();
    std::fs::write(dir.join("secure.test.key"), key.serialize_pem()).unwrap();
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
    world_with(policy, |_| None).await
}

/// [`world`] whose proxy assumes AWS roles with the identity `identity`
/// gives (called with the world's directory once its certificates are
/// there, before the proxy starts).
async fn world_with(
    policy: Policy,
    identity: impl FnOnce(&std::path::Path) -> Option<hearth_egress::AwsIdentity>,
) -> World {
    let dir = std::env::temp_dir().join(format!(
        "hegress-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let (origin_ca, origin_cfg) = origin_tls(&dir);
    let aws_identity = identity(&dir);
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
        callback_signer: Some(hearth_egress::CallbackSigner {
            key: std::sync::Arc::new(callback_key()),
            issuer: "http://hearth.test".into(),
        }),
        // The plain upstream stands in for the control plane.
        control_url: Some(format!("http://127.0.0.1:{http_port}/cp")),
        aws_identity,
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
    // Stored values as they are: these tests put real values in.
    Policy::from_spec(&cfg.to_spec(), &mut |v| {
        let (SecretValue::Plain(s) | SecretValue::Sealed(s) | SecretValue::Template(s)) = v;
        Ok(s.clone())
    })
    .unwrap()
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

/// A client that takes its time to start TLS after its `CONNECT` (as git
/// on GnuTLS does under TCG, loading its CA directory) is still
/// intercepted where a rule applies: the upstream gets the rule's header.
/// The proxy used to splice any connection silent for 300 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_hello_is_still_intercepted_where_a_rule_applies() {
    if !net_available() {
        return;
    }
    let cfg = ProxyConfig {
        rules: vec![rule("slow", &["secure.test"], &[("x-rule", "applied")])],
        ..Default::default()
    };
    let w = world(policy(cfg)).await;
    let tls = guest_tls_config(&[w.egress.ca_pem().as_bytes()]);
    let port = w.https_port;
    let got =
        w.ns.run_async(move || {
            let mut s = std::net::TcpStream::connect("10.200.0.1:3128").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            write!(
                s,
                "CONNECT secure.test:{port} HTTP/1.1\r\nHost: secure.test:{port}\r\n\r\n"
            )
            .unwrap();
            let mut head = [0u8; 39];
            s.read_exact(&mut head).unwrap();
            assert!(
                head.starts_with(b"HTTP/1.1 200"),
                "{}",
                String::from_utf8_lossy(&head)
            );
            std::thread::sleep(Duration::from_millis(1500));
            let req = format!(
                "GET /slow HTTP/1.1\r\nHost: secure.test:{port}\r\nConnection: close\r\n\r\n"
            );
            guest_tls(s, "secure.test", &req, &tls)
        })
        .await;
    assert!(matches!(got, Got::Http(200, _)), "{got:?}");
    let seen = w.https.all();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].headers.get("x-rule").unwrap(), "applied");
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

/// The key the test proxy signs callbacks with.
fn callback_key() -> hearth_fence::KeyPair {
    hearth_fence::KeyPair::from_seed(&[9; 32])
}

/// The claims of a callback's `X-LangSmith-Signature-JWT`, once its
/// signature verifies with [`callback_key`] and its `kid` names that key.
fn verified_claims(token: &str) -> serde_json::Value {
    use base64::Engine;
    use ed25519_dalek::Verifier;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts.len(), 3, "{token}");
    let header: serde_json::Value = serde_json::from_slice(&b64.decode(parts[0]).unwrap()).unwrap();
    let key = callback_key();
    assert_eq!(header["alg"], "EdDSA");
    assert_eq!(header["kid"], key.id().as_str());
    let vk = ed25519_dalek::VerifyingKey::from_bytes(&key.public().bytes()).unwrap();
    let sig = ed25519_dalek::Signature::from_slice(&b64.decode(parts[2]).unwrap()).unwrap();
    vk.verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &sig)
        .expect("the signature verifies");
    serde_json::from_slice(&b64.decode(parts[1]).unwrap()).unwrap()
}

fn sha256_hex(b: &[u8]) -> String {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, b)
        .as_ref()
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// Each callback is signed (what LangSmith's SDK verifies: EdDSA, `kid`,
/// `aud` the callback URL, `sub`, `body_sha256` of the exact body, five
/// minutes) and names the sandbox and workspace; a `full_request`
/// callback also gets the request as the guest sent it (method, URL,
/// query, headers, the body's first 64 KiB), is asked again for each
/// different request, and the upstream still gets the whole body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callbacks_are_signed_and_full_request_sends_the_request() {
    if !net_available() {
        return;
    }
    let (port, calls) = upstream(
        None,
        Some((200, r#"{"headers":{"X-Api-Key":"from-callback"}}"#.into())),
    )
    .await;
    let url = format!("http://callback.test:{port}/resolve");
    let mut cfg = callback_cfg(url.clone());
    cfg.callbacks[0].full_request = Some(true);
    let mut p = policy(cfg);
    p.tenant_id = Some("ws-1".into());
    let w = world(p).await;

    let big: Vec<u8> = (0..100 * 1024).map(|i| (i % 251) as u8).collect();
    let file = w.dir.join("big.bin");
    std::fs::write(&file, &big).unwrap();
    let data = format!("@{}", file.display());
    let args = [
        "-X",
        "PUT",
        "-H",
        "X-Guest: one",
        "-H",
        "Content-Type: application/octet-stream",
        "--data-binary",
        &data,
    ];
    assert_eq!(
        w.get_https("secure.test", "/up?x=1&y=2", &args).await.0,
        200
    );
    let up = w.https.all();
    assert_eq!(up.len(), 1);
    assert_eq!(
        up[0].body.as_ref(),
        &big[..],
        "the upstream gets the whole body"
    );
    assert_eq!(up[0].headers["x-api-key"], "from-callback");

    let seen = calls.all();
    assert_eq!(seen.len(), 1);
    let claims = verified_claims(
        seen[0].headers["x-langsmith-signature-jwt"]
            .to_str()
            .unwrap(),
    );
    assert_eq!(claims["aud"], url.as_str());
    assert_eq!(claims["iss"], "http://hearth.test");
    assert_eq!(claims["sub"], "langsmith-sandbox-callback");
    assert_eq!(claims["body_sha256"], sha256_hex(&seen[0].body).as_str());
    let (iat, exp) = (
        claims["iat"].as_u64().unwrap(),
        claims["exp"].as_u64().unwrap(),
    );
    assert_eq!(exp - iat, 300);
    let body: serde_json::Value = serde_json::from_slice(&seen[0].body).unwrap();
    assert_eq!(body["host"], "secure.test");
    assert_eq!(body["port"], w.https_port);
    assert_eq!(body["identity"]["tenant_id"], "ws-1");
    assert_eq!(body["identity"]["sandbox_id"], SANDBOX);
    let r = &body["request"];
    assert_eq!(r["method"], "PUT");
    assert_eq!(r["scheme"], "https");
    assert_eq!(r["host"], "secure.test");
    assert_eq!(r["path"], "/up");
    assert_eq!(r["query"], "x=1&y=2");
    assert_eq!(
        r["url"],
        format!("https://secure.test:{}/up?x=1&y=2", w.https_port).as_str()
    );
    assert_eq!(r["headers"]["x-guest"], serde_json::json!(["one"]));
    assert_eq!(r["body_truncated"], true);
    use base64::Engine;
    let sent = base64::engine::general_purpose::STANDARD
        .decode(r["body_base64"].as_str().unwrap())
        .unwrap();
    assert_eq!(sent, &big[..64 * 1024]);

    // The same request again is answered from the cache; another is asked.
    assert_eq!(
        w.get_https("secure.test", "/up?x=1&y=2", &args).await.0,
        200
    );
    assert_eq!(calls.len(), 1);
    let (status, _) = w.get_https("secure.test", "/small", &["-d", "tiny"]).await;
    assert_eq!(status, 200);
    let seen = calls.all();
    assert_eq!(seen.len(), 2);
    let body: serde_json::Value = serde_json::from_slice(&seen[1].body).unwrap();
    assert_eq!(body["request"]["method"], "POST");
    assert_eq!(body["request"]["body_truncated"], false);
    assert_eq!(body["request"]["body_base64"], "dGlueQ==");
    assert!(body["request"].get("query").is_none());
    assert_eq!(w.https.all()[2].body.as_ref(), b"tiny");
}

/// A rewrite rule sends what it matches to its HTTPS destination (path and
/// query kept, `Host` the destination's) with its own headers, whatever
/// the guest connected to; the guest's credential headers are stripped or
/// redacted as the rule says; a destination the private gate refuses is a
/// 403, and a guest request the access list refuses never goes anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewrite_rules_send_requests_to_their_https_destination() {
    if !net_available() {
        return;
    }
    let rewrite_rule =
        |name: &str, host: &str, from: &str, port: u16, credentials: &str| ProxyRule {
            name: name.into(),
            match_hosts: vec![from.into()],
            headers: vec![secret("x-gateway-key", "gw-secret")],
            rewrite: Some(hearth_api::nested::ProxyRewrite {
                host: Some(host.into()),
                port: Some(port),
                sandbox: None,
                credentials: Some(credentials.into()),
            }),
            ..Default::default()
        };
    // The https upstream's port is only known once the world is up.
    let w = world(Policy::default()).await;
    let cfg = ProxyConfig {
        rules: vec![
            rewrite_rule("gw", "secure.test", "plain.test", w.https_port, "strip"),
            rewrite_rule("gw2", "secure.test", "api.ok.test", w.https_port, "redact"),
            rewrite_rule("bad", "private.test", "evil.test", w.https_port, "keep"),
            rewrite_rule(
                "denied",
                "secure.test",
                "api7.re.test",
                w.https_port,
                "keep",
            ),
        ],
        access_control: Some(AccessControl {
            allow_list: None,
            deny_list: Some(vec!["api7.re.test".into()]),
        }),
        ..Default::default()
    };
    assert!(w.egress.set_policy(SANDBOX, policy(cfg)));
    let creds = [
        "-H",
        "Authorization: Bearer guest-token",
        "-H",
        "Cookie: session=abc",
        "-H",
        "X-Other: kept",
    ];
    // Plain HTTP from the guest; TLS to the destination.
    let (status, body) = w.get_http("plain.test", "/v1/models?limit=2", &creds).await;
    assert_eq!((status, body.as_str()), (200, "hello /v1/models"));
    assert_eq!(w.http.len(), 0, "nothing reached plain.test");
    let seen = w.https.all();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].headers["host"],
        format!("secure.test:{}", w.https_port).as_str()
    );
    assert_eq!(seen[0].headers["x-gateway-key"], "gw-secret");
    assert_eq!(seen[0].headers["x-other"], "kept");
    assert!(
        !seen[0].headers.contains_key("authorization"),
        "{:?}",
        seen[0].headers
    );
    assert!(!seen[0].headers.contains_key("cookie"));

    // Intercepted TLS from the guest, credentials redacted.
    let (status, _) = w.get_https("api.ok.test", "/r", &creds).await;
    assert_eq!(status, 200);
    let seen = w.https.all();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].path, "/r");
    assert_eq!(seen[1].headers["authorization"], "Bearer redacted");
    assert_eq!(seen[1].headers["cookie"], "redacted");
    assert_eq!(seen[1].headers["x-gateway-key"], "gw-secret");

    // A destination the private gate refuses (127.0.0.2 is not allowed).
    let (status, body) = w.get_http("evil.test", "/x", &[]).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("private address"), "{body}");
    // A name the guest may not reach is refused before any rule sends it on.
    let (status, body) = w.get_http("api7.re.test", "/x", &[]).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("deny_list"), "{body}");
    assert_eq!(w.https.len(), 2);
}

/// A token endpoint that checks the JWT-bearer assertion the way Google's
/// does (RS256 with the account's key, `iss`, `aud` its own URL, `scope`)
/// and answers `ya29.hearth-<n>`; the assertions it accepted.
async fn token_endpoint(
    public_key: Vec<u8>,
    email: &'static str,
) -> (u16, Arc<Mutex<Vec<serde_json::Value>>>) {
    use base64::Engine;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(Mutex::new(Vec::new()));
    let seen = accepted.clone();
    let public_key = Arc::new(public_key);
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (seen, public_key) = (seen.clone(), public_key.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    move |req: http::Request<hyper::body::Incoming>| {
                        let (seen, public_key) = (seen.clone(), public_key.clone());
                        async move {
                            let body = http_body_util::BodyExt::collect(req.into_body())
                                .await
                                .unwrap()
                                .to_bytes();
                            let form = String::from_utf8_lossy(&body).into_owned();
                            let verdict = (|| {
                                let assertion = form
                                .strip_prefix("grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=")
                                .ok_or("grant")?;
                                let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
                                let parts: Vec<&str> = assertion.split('.').collect();
                                let header: serde_json::Value = serde_json::from_slice(
                                    &b64.decode(parts[0]).map_err(|_| "b64")?,
                                )
                                .map_err(|_| "json")?;
                                if header["alg"] != "RS256" || header["kid"] != "kid-1" {
                                    return Err("header");
                                }
                                let sig = b64.decode(parts[2]).map_err(|_| "b64")?;
                                aws_lc_rs::signature::UnparsedPublicKey::new(
                                    &aws_lc_rs::signature::RSA_PKCS1_2048_8192_SHA256,
                                    public_key.as_slice(),
                                )
                                .verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &sig)
                                .map_err(|_| "signature")?;
                                let claims: serde_json::Value = serde_json::from_slice(
                                    &b64.decode(parts[1]).map_err(|_| "b64")?,
                                )
                                .map_err(|_| "json")?;
                                if claims["iss"] != email
                                    || claims["aud"] != format!("http://127.0.0.1:{port}/token")
                                {
                                    return Err("claims");
                                }
                                Ok(claims)
                            })();
                            let (status, answer) = match verdict {
                                Ok(claims) => {
                                    let mut seen = seen.lock().unwrap();
                                    seen.push(claims);
                                    (
                                        200,
                                        format!(
                                            r#"{{"access_token":"ya29.hearth-{}","expires_in":3599,"token_type":"Bearer"}}"#,
                                            seen.len()
                                        ),
                                    )
                                }
                                Err(why) => {
                                    (400, format!(r#"{{"error":"invalid_grant","why":"{why}"}}"#))
                                }
                            };
                            let mut resp = http::Response::new(Full::new(Bytes::from(answer)));
                            *resp.status_mut() = http::StatusCode::from_u16(status).unwrap();
                            Ok::<_, Infallible>(resp)
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    (port, accepted)
}

/// A GCP rule (the SDK's `gcp_auth`): the proxy mints an OAuth access
/// token from the service account key by the JWT-bearer grant (an RS256
/// assertion the token endpoint verifies), sets it as the request's
/// `Authorization` (the guest's dummy one replaced), and reuses it until
/// it nears expiry; a token endpoint that refuses is a 502 that says only
/// that the token failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcp_rules_set_oauth_tokens_minted_from_the_service_account() {
    if !net_available() {
        return;
    }
    use rustls::pki_types::pem::PemObject;
    let dir = std::env::temp_dir().join(format!("hearth-gcp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pem_path = dir.join("key.pem");
    let ok = Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ])
        .arg(&pem_path)
        .status()
        .unwrap();
    assert!(ok.success());
    let pem = std::fs::read_to_string(&pem_path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let der = rustls::pki_types::PrivatePkcs8KeyDer::from_pem_slice(pem.as_bytes()).unwrap();
    let pair = aws_lc_rs::signature::RsaKeyPair::from_pkcs8(der.secret_pkcs8_der()).unwrap();
    use aws_lc_rs::signature::KeyPair as _;
    let public = pair.public_key().as_ref().to_vec();
    const EMAIL: &str = "hearth-test@proj.iam.gserviceaccount.com";
    let (port, accepted) = token_endpoint(public, EMAIL).await;
    let account = |token_uri: String| {
        serde_json::json!({
            "type": "service_account",
            "project_id": "proj",
            "private_key_id": "kid-1",
            "private_key": pem,
            "client_email": EMAIL,
            "token_uri": token_uri,
        })
        .to_string()
    };
    let gcp_rule = |name: &str, host: &str, json: String| ProxyRule {
        name: name.into(),
        kind: Some("gcp".into()),
        match_hosts: vec![host.into()],
        gcp: Some(hearth_api::nested::ProxyGcp {
            service_account_json: Some(hearth_api::nested::ProxySecret {
                kind: SecretKind::Opaque,
                value: Some(json),
                is_set: None,
            }),
            scopes: Some(vec![
                "https://www.googleapis.com/auth/devstorage.read_only".into()
            ]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let cfg = ProxyConfig {
        rules: vec![
            gcp_rule(
                "gcp",
                "secure.test",
                account(format!("http://127.0.0.1:{port}/token")),
            ),
            // The same key, but a token endpoint that answers 404.
            gcp_rule(
                "gcp-bad",
                "api.ok.test",
                account(format!("http://127.0.0.1:{port}/nothing-here")),
            ),
        ],
        ..Default::default()
    };
    let w = world(policy(cfg)).await;
    for path in ["/storage/v1/b/one", "/storage/v1/b/two"] {
        let (status, _) = w
            .get_https("secure.test", path, &["-H", "Authorization: Bearer dummy"])
            .await;
        assert_eq!(status, 200);
    }
    let seen = w.https.all();
    assert_eq!(seen.len(), 2);
    for s in &seen {
        assert_eq!(
            s.headers["authorization"], "Bearer ya29.hearth-1",
            "the token, not the guest's"
        );
    }
    let accepted = accepted.lock().unwrap().clone();
    assert_eq!(accepted.len(), 1, "one token minted for both requests");
    assert_eq!(
        accepted[0]["scope"],
        "https://www.googleapis.com/auth/devstorage.read_only"
    );
    let (iat, exp) = (
        accepted[0]["iat"].as_u64().unwrap(),
        accepted[0]["exp"].as_u64().unwrap(),
    );
    assert_eq!(exp - iat, 3600);

    let (status, body) = w.get_https("api.ok.test", "/x", &[]).await;
    assert_eq!(status, 502, "{body}");
    assert!(
        body.contains("GCP access token") && !body.contains("404"),
        "{body}"
    );
    assert_eq!(w.https.len(), 2, "nothing forwarded without a token");
}

/// `access_delegation`: the guest's requests to `http://api.hearth.internal`
/// (through the explicit proxy) go to the control plane with a delegation
/// token for this sandbox in place of its own credentials; a sandbox
/// without a delegation is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delegated_requests_go_to_the_control_plane_with_a_token_for_the_sandbox() {
    if !net_available() {
        return;
    }
    let w = world(Policy {
        delegation: true,
        ..Policy::default()
    })
    .await;
    let via = format!("http://{GUEST_EXPLICIT}");
    let (status, body) =
        w.ns.curl(&[
            "-x",
            &via,
            "-H",
            "X-Api-Key: delegated",
            "-H",
            "Authorization: Bearer guest",
            "http://api.hearth.internal/api/v2/sandboxes/boxes?limit=1",
        ])
        .await;
    assert_eq!(
        (status, body.as_str()),
        (200, "hello /cp/api/v2/sandboxes/boxes")
    );
    let seen = w.http.all();
    assert_eq!(seen.len(), 1);
    assert!(!seen[0].headers.contains_key("x-api-key"));
    assert_eq!(
        seen[0].headers["host"],
        format!("127.0.0.1:{}", w.http_port).as_str()
    );
    let bearer = seen[0].headers["authorization"].to_str().unwrap();
    let claims = verified_claims(bearer.strip_prefix("Bearer ").unwrap());
    assert_eq!(claims["aud"], "hearth-delegation");
    assert_eq!(claims["sub"], SANDBOX);
    assert_eq!(
        claims["exp"].as_u64().unwrap() - claims["iat"].as_u64().unwrap(),
        300
    );

    assert!(w.egress.set_policy(SANDBOX, Policy::default()));
    let (status, body) =
        w.ns.curl(&[
            "-x",
            &via,
            "http://api.hearth.internal/api/v2/sandboxes/boxes",
        ])
        .await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("without access_delegation"), "{body}");
    assert_eq!(w.http.len(), 1);
}

/// A WebSocket-style upgrade from the guest, over the named connection
/// `scheme` (`https` intercepted, `http` transparent): the handshake's
/// answer head and what the upstream echoed after the 101.
fn upgrade_in_netns(w: &World, scheme: &str, payload: &str) -> String {
    let (port, tls) = match scheme {
        "https" => (w.https_port, true),
        _ => (w.http_port, false),
    };
    let script = format!(
        r#"
import socket, ssl
s = socket.create_connection(("192.0.2.10", {port}), timeout=10)
if {tls}:
    s = ssl.create_default_context(cafile="{ca}").wrap_socket(s, server_hostname="secure.test")
s.sendall(b"GET /ws HTTP/1.1\r\nHost: secure.test:{port}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
head = b""
while b"\r\n\r\n" not in head:
    c = s.recv(1)
    if not c:
        break
    head += c
print(head.decode().split("\r\n")[0])
s.sendall(b"{payload}")
got = b""
while len(got) < len(b"{payload}"):
    c = s.recv(4096)
    if not c:
        break
    got += c
print(got.decode())
"#,
        tls = if tls { "True" } else { "False" },
        ca = w.proxy_ca.display(),
    );
    let out = Command::new("ip")
        .args(["netns", "exec", &w.ns.name, "python3", "-c", &script])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// WebSocket (any `Upgrade`) through an intercepted TLS connection: the
/// handshake gets the header rule's headers, the upstream's 101 reaches the
/// guest, and then bytes flow both ways; over plain HTTP the same, with
/// only the rule's plaintext values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrades_pass_through_with_the_rules_headers_on_the_handshake() {
    if !net_available() {
        return;
    }
    let w = world(policy(secret_rule_cfg())).await;
    let w = Arc::new(w);
    let ww = w.clone();
    let out = tokio::task::spawn_blocking(move || upgrade_in_netns(&ww, "https", "ping-over-tls"))
        .await
        .unwrap();
    assert_eq!(
        out, "HTTP/1.1 101 Switching Protocols\nping-over-tls\n",
        "{out}"
    );
    let seen = w.https.all();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/ws");
    assert_eq!(seen[0].headers["authorization"], "Bearer s3cret");
    assert_eq!(seen[0].headers["x-plain"], "p");
    assert_eq!(seen[0].headers["upgrade"], "websocket");
    assert_eq!(
        seen[0].headers["sec-websocket-key"],
        "dGhlIHNhbXBsZSBub25jZQ=="
    );

    let ww = w.clone();
    let out = tokio::task::spawn_blocking(move || upgrade_in_netns(&ww, "http", "ping-in-clear"))
        .await
        .unwrap();
    assert_eq!(
        out, "HTTP/1.1 101 Switching Protocols\nping-in-clear\n",
        "{out}"
    );
    let seen = w.http.all();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].headers["x-plain"], "p");
    assert!(
        !seen[0].headers.contains_key("authorization"),
        "no secret in clear text"
    );
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
    hearth_egress::validate_spec(&cfg.to_spec(), &[]).unwrap();
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

// Security review (issue 16), held items: about 45 attempts from a guest at
// private, loopback, link-local, metadata and host addresses were all
// refused. The test below keeps them (and more) refused, through every path
// a guest has, and proves nothing arrived where they pointed.

/// The sandbox namespace's rules as the host agent writes them (hearth-host,
/// `network.rs`, `ruleset`): the TAP's TCP is redirected to the transparent
/// listener except towards the gateway, where only the proxy's two ports and
/// DNS are accepted; nothing is forwarded.
const HOST_AGENT_RULES: &str = r#"table inet hearth {
  chain prerouting {
    type nat hook prerouting priority dstnat; policy accept;
    iifname "tap0" ip daddr 10.200.0.1 return
    iifname "tap0" meta l4proto tcp redirect to :15001
  }
  chain input {
    type filter hook input priority filter; policy drop;
    iifname "lo" accept
    ct state established,related accept
    iifname "tap0" ip daddr 10.200.0.1 tcp dport { 15001, 3128 } accept
    iifname "tap0" ip daddr 10.200.0.1 udp dport 53 accept
    iifname "tap0" ip daddr 10.200.0.1 icmp type echo-request accept
  }
  chain forward {
    type filter hook forward priority filter; policy drop;
  }
}
"#;

/// A guest as in production: the sandbox namespace holds its end of the
/// link (a veth standing in for the TAP), the proxy's sockets on the gateway
/// address and the host agent's rules; the guest is a namespace of its own
/// (10.200.0.2, default route via the gateway), as the VM is behind its TAP.
/// The guest also gives itself IPv6 towards the TAP (a ULA, and a static
/// neighbour for the sandbox's end), as a guest is free to.
struct GuestNet {
    sandbox: Netns,
    guest: Netns,
}

impl GuestNet {
    fn new() -> GuestNet {
        let (sandbox, guest) = (Netns::empty(), Netns::empty());
        let (s, g) = (sandbox.name.as_str(), guest.name.as_str());
        let ip = |args: String| {
            let args: Vec<&str> = std::iter::once("ip").chain(args.split(' ')).collect();
            sh(&args);
        };
        ip(format!(
            "-n {s} link add tap0 address 02:00:00:00:00:01 type veth peer name eth0 netns {g}"
        ));
        ip(format!("-n {s} addr add 10.200.0.1/30 dev tap0"));
        ip(format!("-n {s} addr add fd99::1/64 dev tap0 nodad"));
        ip(format!("-n {s} link set tap0 up"));
        ip(format!("-n {g} addr add 10.200.0.2/30 dev eth0"));
        ip(format!("-n {g} addr add fd99::2/64 dev eth0 nodad"));
        ip(format!("-n {g} link set eth0 up"));
        ip(format!("-n {g} route add default via 10.200.0.1"));
        ip(format!(
            "-n {g} neigh add fd99::1 lladdr 02:00:00:00:00:01 dev eth0 nud permanent"
        ));
        ip(format!("-6 -n {g} route add default via fd99::1"));
        let mut nft = Command::new("ip")
            .args(["netns", "exec", s, "nft", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        nft.stdin
            .take()
            .unwrap()
            .write_all(HOST_AGENT_RULES.as_bytes())
            .unwrap();
        assert!(nft.wait().unwrap().success(), "nft -f (host agent rules)");
        GuestNet { sandbox, guest }
    }

    /// The proxy's sockets, on the gateway address as the host agent binds them.
    fn sockets(&self) -> SandboxSockets {
        self.sandbox.run(|| SandboxSockets {
            transparent: std::net::TcpListener::bind("10.200.0.1:15001").unwrap(),
            explicit: std::net::TcpListener::bind("10.200.0.1:3128").unwrap(),
            dns: std::net::UdpSocket::bind("10.200.0.1:53").unwrap(),
        })
    }
}

/// Listeners that must hear nothing; each entry says what reached which.
#[derive(Clone, Default)]
struct Canary(Arc<Mutex<Vec<String>>>);

impl Canary {
    fn heard(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    fn clear(&self) {
        self.0.lock().unwrap().clear();
    }

    /// Answers every connection with `200 canary`, so anything that gets
    /// through shows in the attempt's outcome as well.
    fn tcp(&self, listener: std::net::TcpListener) {
        use tokio::io::AsyncWriteExt;
        listener.set_nonblocking(true).unwrap();
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let heard = self.0.clone();
        tokio::spawn(async move {
            while let Ok((mut s, peer)) = listener.accept().await {
                let local = s.local_addr().map(|a| a.to_string()).unwrap_or_default();
                heard.lock().unwrap().push(format!("tcp {local} <- {peer}"));
                let _ = s
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\nconnection: close\r\n\r\ncanary",
                    )
                    .await;
            }
        });
    }

    fn udp(&self, socket: std::net::UdpSocket) {
        socket.set_nonblocking(true).unwrap();
        let socket = tokio::net::UdpSocket::from_std(socket).unwrap();
        let heard = self.0.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            while let Ok((n, peer)) = socket.recv_from(&mut buf).await {
                let local = socket
                    .local_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_default();
                heard
                    .lock()
                    .unwrap()
                    .push(format!("udp {local} <- {peer} ({n} bytes)"));
                let _ = socket.send_to(b"canary", peer).await;
            }
        });
    }
}

/// The host's own addresses (this namespace's), loopback and link-local aside.
fn host_addresses() -> Vec<IpAddr> {
    nix::ifaddrs::getifaddrs()
        .unwrap()
        .filter_map(|a| a.address)
        .filter_map(|s| match (s.as_sockaddr_in(), s.as_sockaddr_in6()) {
            (Some(v4), _) => Some(IpAddr::V4(v4.ip())),
            (_, Some(v6)) => Some(IpAddr::V6(v6.ip())),
            _ => None,
        })
        .filter(|ip| match ip {
            IpAddr::V4(v4) => !v4.is_loopback(),
            IpAddr::V6(v6) => !v6.is_loopback() && (v6.segments()[0] & 0xffc0) != 0xfe80,
        })
        .collect()
}

/// How an attempt reaches out from inside the guest.
enum Via {
    /// These bytes to the explicit proxy, as they are.
    Explicit(String),
    /// `CONNECT target`, then, once established, what follows.
    Connect(String, Option<Inner>),
    /// A TCP connection to this address carrying these bytes (none: the
    /// guest waits for the server to speak first).
    Tcp(SocketAddr, Vec<u8>),
    /// TLS to this address with this server name, then this request.
    Tls {
        to: SocketAddr,
        sni: String,
        request: String,
    },
    /// A datagram to this address.
    Udp(SocketAddr, Vec<u8>),
    /// A query to the sandbox's DNS server.
    Dns(String, hickory_proto::rr::RecordType),
}

/// What a guest sends inside an established `CONNECT` tunnel.
enum Inner {
    Bytes(String),
    Tls { sni: String, request: String },
}

/// What an attempt met.
#[derive(Debug, Clone, PartialEq)]
enum Got {
    /// An HTTP answer: status and body.
    Http(u16, String),
    /// Accepted, then reset.
    Reset,
    /// Accepted, then closed without a byte.
    Closed,
    /// The connection attempt went unanswered.
    Dropped,
    /// The connection attempt was refused.
    Refused,
    /// Accepted, then nothing within the read timeout.
    Hung,
    /// No datagram came back.
    Silent,
    /// A DNS answer: its code and addresses.
    Dns(hickory_proto::op::ResponseCode, Vec<IpAddr>),
    /// Anything else.
    Other(String),
}

impl std::fmt::Display for Got {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Got::Http(status, body) => {
                let body: String = body.trim().chars().take(110).collect();
                write!(f, "HTTP {status} {body:?}")
            }
            Got::Dns(code, ips) => write!(f, "DNS {code} {ips:?}"),
            other => write!(f, "{other:?}"),
        }
    }
}

/// What the proxy (or the sandbox's rules) does today, per attempt.
#[derive(Debug)]
enum Expect {
    /// This status, with this in the body.
    Status(u16, String),
    /// This status and no body: the HTTP parser's own answer (hyper's, or
    /// the explicit proxy's `CONNECT` head), before any policy is read.
    Bare(u16),
    Reset,
    Dropped,
    Silent,
    NxDomain,
    /// A DNS answer with exactly these addresses.
    Answers(Vec<IpAddr>),
}

impl Expect {
    fn met_by(&self, got: &Got) -> bool {
        use hickory_proto::op::ResponseCode;
        match (self, got) {
            (Expect::Status(s, part), Got::Http(status, body)) => {
                s == status && body.contains(part)
            }
            (Expect::Bare(s), Got::Http(status, body)) => s == status && body.is_empty(),
            (Expect::Reset, Got::Reset)
            | (Expect::Dropped, Got::Dropped)
            | (Expect::Silent, Got::Silent) => true,
            (Expect::NxDomain, Got::Dns(code, ips)) => {
                *code == ResponseCode::NXDomain && ips.is_empty()
            }
            (Expect::Answers(want), Got::Dns(code, ips)) => {
                *code == ResponseCode::NoError && ips == want
            }
            _ => false,
        }
    }
}

struct Attempt {
    label: String,
    via: Via,
    expect: Expect,
}

const GUEST_EXPLICIT: &str = "10.200.0.1:3128";
const GUEST_DNS: &str = "10.200.0.1:53";

fn io_outcome(e: &std::io::Error) -> Got {
    use std::io::ErrorKind;
    match e.kind() {
        ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => Got::Reset,
        ErrorKind::WouldBlock | ErrorKind::TimedOut => Got::Hung,
        _ => Got::Other(e.to_string()),
    }
}

fn http_outcome(bytes: &[u8]) -> Got {
    let text = String::from_utf8_lossy(bytes);
    let status = text
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(2..5))
        .and_then(|code| code.parse().ok());
    match status {
        Some(status) => {
            let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
            Got::Http(status, body.to_owned())
        }
        None => Got::Other(text.into_owned()),
    }
}

fn guest_connect(to: SocketAddr) -> Result<std::net::TcpStream, Got> {
    use std::io::ErrorKind;
    match std::net::TcpStream::connect_timeout(&to, Duration::from_millis(1500)) {
        Ok(s) => {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            Ok(s)
        }
        Err(e) if e.kind() == ErrorKind::TimedOut => Err(Got::Dropped),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => Err(Got::Refused),
        Err(e) => Err(Got::Other(format!("connect: {e}"))),
    }
}

/// Sends `bytes` (if any) and reads until the other side closes.
fn guest_exchange(mut s: std::net::TcpStream, bytes: &[u8]) -> Got {
    if !bytes.is_empty() {
        if let Err(e) = s.write_all(bytes) {
            return io_outcome(&e);
        }
    }
    let mut out = Vec::new();
    let read = s.read_to_end(&mut out);
    match read {
        _ if !out.is_empty() => http_outcome(&out),
        Ok(_) => Got::Closed,
        Err(e) => io_outcome(&e),
    }
}

/// A guest's TLS client trusting the certificates in `pems`.
fn guest_tls_config(pems: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for pem in pems {
        for cert in rustls::pki_types::CertificateDer::pem_slice_iter(pem) {
            roots.add(cert.unwrap()).unwrap();
        }
    }
    Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth(),
    )
}

/// TLS over `tcp` with `sni`, `request` inside, the answer read to the end.
fn guest_tls(
    mut tcp: std::net::TcpStream,
    sni: &str,
    request: &str,
    cfg: &Arc<rustls::ClientConfig>,
) -> Got {
    let name = match rustls::pki_types::ServerName::try_from(sni.to_owned()) {
        Ok(n) => n,
        Err(e) => return Got::Other(format!("server name {sni:?}: {e}")),
    };
    let mut conn = rustls::ClientConnection::new(cfg.clone(), name).unwrap();
    let mut tls = rustls::Stream::new(&mut conn, &mut tcp);
    if let Err(e) = tls.write_all(request.as_bytes()) {
        return Got::Other(format!("TLS: {e}"));
    }
    let mut out = Vec::new();
    let read = tls.read_to_end(&mut out);
    match read {
        _ if !out.is_empty() => http_outcome(&out),
        Ok(_) => Got::Closed,
        Err(e) => Got::Other(format!("TLS: {e}")),
    }
}

fn dns_query(name: &str, t: hickory_proto::rr::RecordType) -> Vec<u8> {
    use hickory_proto::op::{Message, Query};
    use hickory_proto::rr::Name;
    let mut m = Message::new();
    m.set_id(0x4e1d).set_recursion_desired(true);
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
    m.to_vec().unwrap()
}

/// Runs one attempt from inside the guest.
fn attempt(via: &Via, tls: &Arc<rustls::ClientConfig>) -> Got {
    let result = match via {
        Via::Explicit(request) => guest_connect(GUEST_EXPLICIT.parse().unwrap())
            .map(|s| guest_exchange(s, request.as_bytes())),
        Via::Connect(target, inner) => {
            guest_connect(GUEST_EXPLICIT.parse().unwrap()).map(|mut s| {
                let head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
                if let Err(e) = s.write_all(head.as_bytes()) {
                    return io_outcome(&e);
                }
                // The answer's head, byte by byte, so nothing of the tunnel is read.
                let mut answer = Vec::new();
                let mut byte = [0u8; 1];
                while !answer.ends_with(b"\r\n\r\n") {
                    match s.read(&mut byte) {
                        Ok(1) => answer.push(byte[0]),
                        Ok(_) => break,
                        Err(e) if answer.is_empty() => return io_outcome(&e),
                        Err(_) => break,
                    }
                }
                let established = matches!(http_outcome(&answer), Got::Http(200, _));
                match inner {
                    Some(Inner::Bytes(bytes)) if established => guest_exchange(s, bytes.as_bytes()),
                    Some(Inner::Tls { sni, request }) if established => {
                        guest_tls(s, sni, request, tls)
                    }
                    _ => {
                        let _ = s.read_to_end(&mut answer);
                        if answer.is_empty() {
                            Got::Closed
                        } else {
                            http_outcome(&answer)
                        }
                    }
                }
            })
        }
        Via::Tcp(to, bytes) => guest_connect(*to).map(|s| guest_exchange(s, bytes)),
        Via::Tls { to, sni, request } => {
            guest_connect(*to).map(|s| guest_tls(s, sni, request, tls))
        }
        Via::Udp(to, bytes) => {
            let s = std::net::UdpSocket::bind(if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })
                .unwrap();
            s.set_read_timeout(Some(Duration::from_millis(400)))
                .unwrap();
            Ok(match s.send_to(bytes, to) {
                Err(e) => Got::Other(format!("send: {e}")),
                Ok(_) => {
                    let mut buf = [0u8; 1500];
                    match s.recv_from(&mut buf) {
                        Ok((n, from)) => Got::Other(format!("{n} bytes back from {from}")),
                        Err(e) if matches!(io_outcome(&e), Got::Hung) => Got::Silent,
                        Err(e) => Got::Other(format!("receive: {e}")),
                    }
                }
            })
        }
        Via::Dns(name, t) => {
            use hickory_proto::rr::RData;
            let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            s.send_to(&dns_query(name, *t), GUEST_DNS).unwrap();
            let mut buf = [0u8; 1500];
            Ok(match s.recv(&mut buf) {
                Err(_) => Got::Silent,
                Ok(n) => match hickory_proto::op::Message::from_vec(&buf[..n]) {
                    Err(e) => Got::Other(format!("DNS answer: {e}")),
                    Ok(m) => Got::Dns(
                        m.response_code(),
                        m.answers()
                            .iter()
                            .filter_map(|r| match r.data() {
                                RData::A(a) => Some(IpAddr::V4(a.0)),
                                RData::AAAA(a) => Some(IpAddr::V6(a.0)),
                                _ => None,
                            })
                            .collect(),
                    ),
                },
            })
        }
    };
    result.unwrap_or_else(|got| got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_guest_cannot_reach_private_loopback_link_local_metadata_or_host_addresses() {
    if !net_available() {
        return;
    }
    use hickory_proto::rr::RecordType;
    let started = std::time::Instant::now();
    let ip = |s: &str| -> IpAddr { s.parse().unwrap() };

    // The public internet's stand-in: 127.0.0.3, which the operator allows.
    let dir = std::env::temp_dir().join(format!(
        "hegress-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let (origin_ca, origin_cfg) = origin_tls(&dir);
    let (public_port, public_http) = upstream_on("127.0.0.3", None, None).await;
    let (public_tls_port, public_https) = upstream_on("127.0.0.3", Some(origin_cfg), None).await;

    // The canary port: every attempt aims at it. Listening on the wildcard
    // (IPv6, dual-stack), TCP and UDP, it hears every address of the host's
    // namespace, where the proxy connects from: 127.0.0.0/8, ::1, the
    // host's own addresses. The public port is watched on the loopback
    // addresses too (a name with a public and a private address).
    let canary = Canary::default();
    let (tcp, udp) = (0..20)
        .find_map(|_| {
            let tcp = std::net::TcpListener::bind("[::]:0").ok()?;
            let port = tcp.local_addr().ok()?.port();
            let udp = std::net::UdpSocket::bind(("::", port)).ok()?;
            Some((tcp, udp))
        })
        .expect("a free canary port");
    let port = tcp.local_addr().unwrap().port();
    canary.tcp(tcp);
    canary.udp(udp);
    canary.tcp(std::net::TcpListener::bind(("127.0.0.1", public_port)).unwrap());
    canary.tcp(std::net::TcpListener::bind(("::1", public_port)).unwrap());

    let hosts_own = host_addresses();
    let host_v4 = hosts_own.iter().copied().find(IpAddr::is_ipv4);
    let host_v6 = hosts_own.iter().copied().find(IpAddr::is_ipv6);
    eprintln!("held: canary port {port}, host addresses {hosts_own:?}");

    // The test DNS (static hosts): the public names, and names that
    // resolve to private addresses, as a hostile or careless resolver (or
    // the operator's hosts) could answer.
    let mut private_names: Vec<(&str, Vec<IpAddr>)> = vec![
        ("private.test", vec![ip("127.0.0.2")]),
        ("loopback.test", vec![ip("127.0.0.1")]),
        ("v6-loopback.test", vec![ip("::1")]),
        ("mapped.test", vec![ip("::ffff:127.0.0.1")]),
        ("metadata.test", vec![ip("169.254.169.254")]),
        ("rfc1918.test", vec![ip("10.0.0.1"), ip("192.168.1.1")]),
        ("gateway.test", vec![ip("10.200.0.1")]),
        // What a cloud host's resolver and systemd-resolved (RFC 6761) answer.
        ("metadata.google.internal", vec![ip("169.254.169.254")]),
        ("foo.localhost", vec![ip("127.0.0.1")]),
    ];
    if let Some(h) = host_v4 {
        private_names.push(("host-address.test", vec![h]));
    }
    let mut hosts: BTreeMap<String, Vec<IpAddr>> = private_names
        .iter()
        .map(|(n, ips)| (n.to_string(), ips.clone()))
        .collect();
    hosts.insert("public.test".into(), vec![ip("127.0.0.3")]);
    hosts.insert("secure.test".into(), vec![ip("127.0.0.3")]);
    // A private address first, the public one second.
    hosts.insert(
        "mixed-public.test".into(),
        vec![ip("127.0.0.1"), ip("127.0.0.3")],
    );

    let egress = Egress::new(EgressSettings {
        ca_dir: dir.join("ca"),
        origin_ca_files: vec![origin_ca.clone()],
        allow_private: vec!["127.0.0.3/32".parse().unwrap()],
        hosts,
        connect_timeout: Duration::from_secs(2),
        callback_signer: None,
        control_url: None,
        aws_identity: None,
    })
    .unwrap();
    let net = GuestNet::new();
    let _attachment = egress
        .attach(SANDBOX, Policy::default(), net.sockets())
        .unwrap();

    // The sandbox namespace's canary: its 127.0.0.1, its gateway address.
    let (tcp, udp) = net.sandbox.run(move || {
        (
            std::net::TcpListener::bind(("::", port)).unwrap(),
            std::net::UdpSocket::bind(("::", port)).unwrap(),
        )
    });
    canary.tcp(tcp);
    canary.udp(udp);

    // The canaries hear what reaches them.
    let mut probes: Vec<SocketAddr> = vec![
        SocketAddr::new(ip("127.0.0.1"), port),
        SocketAddr::new(ip("::1"), port),
        SocketAddr::new(ip("127.0.0.1"), public_port),
    ];
    probes.extend(host_v4.map(|h| SocketAddr::new(h, port)));
    // Those, a datagram, and the sandbox's two connections and datagram.
    let n_probes = probes.len() + 1 + 3;
    tokio::task::spawn_blocking(move || {
        for p in &probes {
            drop(std::net::TcpStream::connect(p).unwrap());
        }
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.send_to(b"probe", ("127.0.0.1", port)).unwrap();
    })
    .await
    .unwrap();
    net.sandbox
        .run_async(move || {
            drop(std::net::TcpStream::connect(("10.200.0.1", port)).unwrap());
            drop(std::net::TcpStream::connect(("127.0.0.1", port)).unwrap());
            let s = std::net::UdpSocket::bind("10.200.0.1:0").unwrap();
            s.send_to(b"probe", ("10.200.0.1", port)).unwrap();
        })
        .await;
    for _ in 0..100 {
        if canary.heard().len() >= n_probes {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(canary.heard().len(), n_probes, "{:?}", canary.heard());
    canary.clear();

    // The guest trusts the proxy's CA (as guests are set up to) and the
    // test origin's.
    let origin = std::fs::read(&origin_ca).unwrap();
    let guest_tls = guest_tls_config(&[egress.ca_pem().as_bytes(), &origin]);

    let get = |target: &str, host: &str| {
        format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
    };
    let row = |label: String, via: Via, expect: Expect| Attempt { label, via, expect };
    let private = |host: &str, ip: &str| {
        Expect::Status(403, format!("\"{host}\" is a private address ({ip})\n"))
    };
    // Resolved by the system (localhost: 127.0.0.1, ::1, or both).
    let private_resolved =
        |host: &str| Expect::Status(403, format!("\"{host}\" is a private address ("));
    let bad = |reason: &str| Expect::Status(400, reason.to_owned());
    let to = |addr: &str, port: u16| SocketAddr::new(ip(addr), port);
    let bracket = |addr: IpAddr| match addr {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    };
    // An address the guest may connect to (public, so allowed by the
    // default policy). Requests through it go where their Host header or
    // server name says: the proxy never connects here in these attempts.
    let public_addr = ip("1.1.1.1");
    let at_public = SocketAddr::new(public_addr, port);

    // Controls: every path works for the public names, so a refusal below
    // is the proxy's decision, not a broken path.
    let controls = vec![
        row(
            "control: explicit proxy to public.test".into(),
            Via::Explicit(get(
                &format!("http://public.test:{public_port}/control-explicit"),
                &format!("public.test:{public_port}"),
            )),
            Expect::Status(200, "hello /control-explicit".into()),
        ),
        row(
            "control: CONNECT public.test".into(),
            Via::Connect(
                format!("public.test:{public_port}"),
                Some(Inner::Bytes(get(
                    "/control-connect",
                    &format!("public.test:{public_port}"),
                ))),
            ),
            Expect::Status(200, "hello /control-connect".into()),
        ),
        row(
            "control: transparent HTTP, Host public.test".into(),
            Via::Tcp(
                SocketAddr::new(public_addr, public_port),
                get(
                    "/control-transparent",
                    &format!("public.test:{public_port}"),
                )
                .into_bytes(),
            ),
            Expect::Status(200, "hello /control-transparent".into()),
        ),
        row(
            "control: TLS, SNI secure.test (spliced)".into(),
            Via::Tls {
                to: SocketAddr::new(public_addr, public_tls_port),
                sni: "secure.test".into(),
                request: get("/control-tls", "secure.test"),
            },
            Expect::Status(200, "hello /control-tls".into()),
        ),
        row(
            "control: DNS A public.test".into(),
            Via::Dns("public.test.".into(), RecordType::A),
            Expect::Answers(vec![ip("127.0.0.3")]),
        ),
    ];
    let n_controls = controls.len();

    let mut rows: Vec<Attempt> = Vec::new();

    // Address literals, as written in a URL, and the address the proxy
    // finds there (the resolver reads the inet_aton forms).
    let mut literals: Vec<(String, String)> = [
        ("127.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("127.0.0.1.", "127.0.0.1"),
        ("0.0.0.0", "0.0.0.0"),
        ("0", "0.0.0.0"),
        ("10.0.0.1", "10.0.0.1"),
        ("172.16.0.1", "172.16.0.1"),
        ("192.168.1.1", "192.168.1.1"),
        ("100.64.0.1", "100.64.0.1"),
        ("169.254.169.254", "169.254.169.254"),
        ("169.254.170.2", "169.254.170.2"),
        ("[::1]", "::1"),
        ("[::]", "::"),
        ("[::ffff:127.0.0.1]", "::ffff:127.0.0.1"),
        ("[::ffff:7f00:1]", "::ffff:127.0.0.1"),
        ("[::127.0.0.1]", "::127.0.0.1"),
        ("[64:ff9b::7f00:1]", "64:ff9b::7f00:1"),
        ("[64:ff9b:1::a00:1]", "64:ff9b:1::a00:1"),
        ("[fe80::1]", "fe80::1"),
        ("[fc00::1]", "fc00::1"),
        ("[fd00:ec2::254]", "fd00:ec2::254"),
        // The gateway: the proxy's own address in the sandbox namespace.
        ("10.200.0.1", "10.200.0.1"),
    ]
    .iter()
    .map(|(w, a)| (w.to_string(), ip(a).to_string()))
    .collect();
    for h in [host_v4, host_v6].into_iter().flatten() {
        literals.push((bracket(h), h.to_string()));
    }
    for (written, addr) in &literals {
        let host = written.trim_matches(['[', ']']);
        rows.push(row(
            format!("explicit http://{written}/"),
            Via::Explicit(get(
                &format!("http://{written}:{port}/held"),
                &format!("{written}:{port}"),
            )),
            private(host, addr),
        ));
    }
    // Names: the system's localhost, the test DNS's private names.
    let mut names: Vec<(String, Option<String>)> = ["localhost", "localhost.", "LOCALHOST"]
        .iter()
        .map(|n| (n.to_string(), None))
        .collect();
    for (name, ips) in &private_names {
        names.push((name.to_string(), Some(ips[0].to_string())));
    }
    for (name, addr) in &names {
        let expect = match addr {
            Some(a) => private(name, a),
            None => private_resolved(name),
        };
        rows.push(row(
            format!("explicit http://{name}/"),
            Via::Explicit(get(
                &format!("http://{name}:{port}/held"),
                &format!("{name}:{port}"),
            )),
            expect,
        ));
    }
    let public = format!("public.test:{public_port}");
    let explicit_tricks: Vec<(&str, String, String, Expect)> = vec![
        (
            "userinfo http://public.test@127.0.0.1/",
            format!("http://public.test@127.0.0.1:{port}/held"),
            format!("127.0.0.1:{port}"),
            bad("the request target's authority is not a host[:port]"),
        ),
        (
            "URL public.test, Host 127.0.0.1",
            format!("http://{public}/held"),
            format!("127.0.0.1:{port}"),
            bad("disagrees with the request target"),
        ),
        (
            "URL 127.0.0.1, Host public.test",
            format!("http://127.0.0.1:{port}/held"),
            public.clone(),
            bad("disagrees with the request target"),
        ),
        (
            "URL public.test, Host public.test:80@127.0.0.1",
            format!("http://{public}/held"),
            "public.test:80@127.0.0.1".into(),
            bad("the request's Host header is not a host[:port]"),
        ),
        (
            "URL public.test, Host 127.0.0.1. (trailing dot)",
            format!("http://{public}/held"),
            "127.0.0.1.".into(),
            bad("disagrees with the request target"),
        ),
        (
            "percent-encoded http://%31%32%37.0.0.1/",
            format!("http://%31%32%37.0.0.1:{port}/held"),
            format!("%31%32%37.0.0.1:{port}"),
            Expect::Bare(400),
        ),
        (
            "IPv6 zone http://[fe80::1%25lo]/",
            format!("http://[fe80::1%25lo]:{port}/held"),
            format!("[fe80::1%25lo]:{port}"),
            bad("the request's Host header is not a host[:port]"),
        ),
        (
            "full-width digits http://１２７.０.０.１/",
            format!("http://１２７.０.０.１:{port}/held"),
            format!("１２７.０.０.１:{port}"),
            Expect::Bare(400),
        ),
        (
            "https:// absolute form to 127.0.0.1",
            format!("https://127.0.0.1:{port}/held"),
            format!("127.0.0.1:{port}"),
            bad("the request names no http:// target"),
        ),
        (
            "mixed-public.test (private, then public): the public one only",
            format!("http://mixed-public.test:{public_port}/mixed"),
            format!("mixed-public.test:{public_port}"),
            Expect::Status(200, "hello /mixed".into()),
        ),
    ];
    for (label, target, host, expect) in explicit_tricks {
        rows.push(row(
            format!("explicit {label}"),
            Via::Explicit(get(&target, &host)),
            expect,
        ));
    }

    // CONNECT.
    let mut connect_targets: Vec<(String, Expect)> = [
        ("127.0.0.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("0", "0.0.0.0"),
        ("[::1]", "::1"),
        ("[::ffff:127.0.0.1]", "::ffff:127.0.0.1"),
        ("[64:ff9b::7f00:1]", "64:ff9b::7f00:1"),
        ("169.254.169.254", "169.254.169.254"),
        ("[fd00:ec2::254]", "fd00:ec2::254"),
        ("10.200.0.1", "10.200.0.1"),
        ("private.test", "127.0.0.2"),
        ("v6-loopback.test", "::1"),
        ("metadata.google.internal", "169.254.169.254"),
    ]
    .iter()
    .map(|(t, a)| {
        let host = t.trim_matches(['[', ']']);
        (t.to_string(), private(host, &ip(a).to_string()))
    })
    .collect();
    connect_targets.push(("localhost".into(), private_resolved("localhost")));
    for h in [host_v4, host_v6].into_iter().flatten() {
        connect_targets.push((bracket(h), private(&h.to_string(), &h.to_string())));
    }
    for (target, expect) in connect_targets {
        rows.push(row(
            format!("CONNECT {target}"),
            Via::Connect(format!("{target}:{port}"), None),
            expect,
        ));
    }
    rows.push(row(
        "CONNECT public.test@127.0.0.1 (userinfo)".into(),
        Via::Connect(format!("public.test@127.0.0.1:{port}"), None),
        Expect::Status(502, "cannot resolve \"public.test@127.0.0.1\"".into()),
    ));
    rows.push(row(
        "CONNECT %31%32%37.0.0.1 (percent-encoded)".into(),
        Via::Connect(format!("%31%32%37.0.0.1:{port}"), None),
        Expect::Status(502, "cannot resolve \"%31%32%37.0.0.1\"".into()),
    ));
    rows.push(row(
        "CONNECT 127.0.0.1 without a port".into(),
        Via::Connect("127.0.0.1".into(), None),
        Expect::Bare(400),
    ));
    rows.push(row(
        "CONNECT public.test, then Host 127.0.0.1 inside".into(),
        Via::Connect(
            public.clone(),
            Some(Inner::Bytes(get(
                "/held",
                &format!("127.0.0.1:{public_port}"),
            ))),
        ),
        bad("but this connection goes to \"public.test\""),
    ));
    rows.push(row(
        "CONNECT secure.test, then TLS for loopback.test inside".into(),
        Via::Connect(
            format!("secure.test:{public_tls_port}"),
            Some(Inner::Tls {
                sni: "loopback.test".into(),
                request: get("/held", "loopback.test"),
            }),
        ),
        bad("disagrees with the CONNECT target"),
    ));

    // Transparent HTTP to an allowed address, naming a private one.
    let transparent: Vec<(String, Expect)> = vec![
        (
            format!("127.0.0.1:{port}"),
            private("127.0.0.1", "127.0.0.1"),
        ),
        ("127.0.0.1".into(), private("127.0.0.1", "127.0.0.1")),
        (
            "127.0.0.1:80".into(),
            bad(&format!(
                "the request names \"127.0.0.1\", but this connection goes to \"127.0.0.1\" port {port}"
            )),
        ),
        (
            "public.test:80@127.0.0.1".into(),
            bad("the request's Host header is not a host[:port]"),
        ),
        (format!("[::1]:{port}"), private("::1", "::1")),
        ("2130706433".into(), private("2130706433", "127.0.0.1")),
        ("0x7f.1".into(), private("0x7f.1", "127.0.0.1")),
        ("localhost.".into(), private_resolved("localhost.")),
        ("LOCALHOST".into(), private_resolved("LOCALHOST")),
        (
            "169.254.169.254".into(),
            private("169.254.169.254", "169.254.169.254"),
        ),
        (
            "metadata.google.internal".into(),
            private("metadata.google.internal", "169.254.169.254"),
        ),
        ("10.200.0.1".into(), private("10.200.0.1", "10.200.0.1")),
        ("private.test".into(), private("private.test", "127.0.0.2")),
        (
            "%6c%6f%63%61%6c%68%6f%73%74".into(),
            bad("the request's Host header is not a host[:port]"),
        ),
    ];
    for (host, expect) in transparent {
        rows.push(row(
            format!("transparent HTTP, Host {host}"),
            Via::Tcp(at_public, get("/held", &host).into_bytes()),
            expect,
        ));
    }
    rows.push(row(
        "transparent HTTP, absolute form http://169.254.169.254/".into(),
        Via::Tcp(
            at_public,
            get(
                &format!("http://169.254.169.254:{port}/held"),
                &format!("169.254.169.254:{port}"),
            )
            .into_bytes(),
        ),
        private("169.254.169.254", "169.254.169.254"),
    ));
    rows.push(row(
        "transparent HTTP/1.0 without Host to 169.254.169.254".into(),
        Via::Tcp(
            to("169.254.169.254", port),
            b"GET /held HTTP/1.0\r\n\r\n".to_vec(),
        ),
        private("169.254.169.254", "169.254.169.254"),
    ));

    // Intercepted TLS: an allowed address, a private server name. (An
    // address is no server name: TLS stacks send none for one, rustls reads
    // one as none, and then the address connected to is judged, as the raw
    // TCP attempts below show.)
    let mut tls_names: Vec<(String, Expect)> = ["localhost", "LOCALHOST", "localhost."]
        .iter()
        .map(|n| (n.to_string(), private_resolved("localhost")))
        .collect();
    for (name, ips) in &private_names {
        tls_names.push((name.to_string(), private(name, &ips[0].to_string())));
    }
    for (sni, expect) in tls_names {
        rows.push(row(
            format!("TLS, server name {sni}"),
            Via::Tls {
                to: at_public,
                sni: sni.clone(),
                request: get("/held", &sni),
            },
            expect,
        ));
    }
    rows.push(row(
        "TLS, server name loopback.test, Host public.test".into(),
        Via::Tls {
            to: at_public,
            sni: "loopback.test".into(),
            request: get("/held", &format!("public.test:{port}")),
        },
        bad("the request names \"public.test\", but this connection goes to \"loopback.test\""),
    ));

    // Raw TCP and UDP from the guest straight to private addresses.
    let raw = b"\x00\x01hello\r\n".to_vec();
    let mut raw_targets: Vec<SocketAddr> = [
        "10.0.0.1",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",
        "169.254.169.254",
        "169.254.170.2",
        "::ffff:169.254.169.254",
    ]
    .iter()
    .map(|a| to(a, port))
    .collect();
    raw_targets.extend(host_v4.map(|h| SocketAddr::new(h, port)));
    for target in raw_targets {
        rows.push(row(
            format!("raw TCP to {target}"),
            Via::Tcp(target, raw.clone()),
            Expect::Reset,
        ));
    }
    rows.push(row(
        "raw TCP to 169.254.169.254, waiting for the server".into(),
        Via::Tcp(to("169.254.169.254", port), Vec::new()),
        Expect::Reset,
    ));
    rows.push(row(
        "raw TCP to the transparent listener itself".into(),
        Via::Tcp(to("10.200.0.1", 15001), raw.clone()),
        Expect::Reset,
    ));
    for target in [
        to("10.200.0.1", port),
        to("10.200.0.1", 53),
        to("fd00:ec2::254", port),
        to("fd99::1", port),
    ] {
        rows.push(row(
            format!("raw TCP to {target}"),
            Via::Tcp(target, raw.clone()),
            Expect::Dropped,
        ));
    }
    let mut udp_targets: Vec<(SocketAddr, Vec<u8>)> = [
        ("10.0.0.1", port),
        ("169.254.169.254", port),
        ("10.200.0.1", port),
        ("fd00:ec2::254", port),
        ("fd99::1", port),
    ]
    .iter()
    .map(|(a, p)| (to(a, *p), raw.clone()))
    .collect();
    udp_targets.extend(host_v4.map(|h| (SocketAddr::new(h, port), raw.clone())));
    // Not DNS, to the DNS port; DNS to another (private) resolver.
    udp_targets.push((to("10.200.0.1", 53), raw.clone()));
    udp_targets.push((to("10.0.0.1", 53), dns_query("public.test.", RecordType::A)));
    for (target, bytes) in udp_targets {
        rows.push(row(
            format!("UDP to {target}"),
            Via::Udp(target, bytes),
            Expect::Silent,
        ));
    }

    // The sandbox's DNS tells nothing private.
    let mut dns: Vec<(String, RecordType)> = vec![
        ("localhost.".into(), RecordType::A),
        ("localhost.".into(), RecordType::AAAA),
        ("LOCALHOST.".into(), RecordType::A),
        ("2130706433.".into(), RecordType::A),
        ("0x7f000001.".into(), RecordType::A),
    ];
    for (name, ips) in &private_names {
        let t = if ips[0].is_ipv4() {
            RecordType::A
        } else {
            RecordType::AAAA
        };
        dns.push((format!("{name}."), t));
    }
    for (name, t) in dns {
        rows.push(row(
            format!("DNS {t} {name}"),
            Via::Dns(name, t),
            Expect::NxDomain,
        ));
    }
    rows.push(row(
        "DNS A mixed-public.test: only the public address".into(),
        Via::Dns("mixed-public.test.".into(), RecordType::A),
        Expect::Answers(vec![ip("127.0.0.3")]),
    ));

    assert!(
        rows.len() >= 45,
        "the held table shrank to {} attempts",
        rows.len()
    );
    let n_rows = rows.len();
    let all: Vec<Attempt> = controls.into_iter().chain(rows).collect();
    let results = net
        .guest
        .run_async(move || {
            all.into_iter()
                .map(|a| {
                    let t = std::time::Instant::now();
                    let got = attempt(&a.via, &guest_tls);
                    (a, got, t.elapsed())
                })
                .collect::<Vec<_>>()
        })
        .await;
    let mut failures = Vec::new();
    for (i, (a, got, took)) in results.iter().enumerate() {
        let ok = a.expect.met_by(got);
        eprintln!(
            "held {:>3} {} {:<62} {got} ({} ms)",
            i + 1,
            if ok { "ok  " } else { "FAIL" },
            a.label,
            took.as_millis()
        );
        if !ok {
            failures.push(format!("{}: expected {:?}, got {got}", a.label, a.expect));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Nothing arrived anywhere private: the canaries heard nothing, the
    // public upstream only the controls and the mixed name's public address,
    // and the proxy opened no other upstream connection.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(canary.heard(), Vec::<String>::new(), "reached a canary");
    let paths: Vec<String> = public_http.all().into_iter().map(|s| s.path).collect();
    assert_eq!(
        paths,
        [
            "/control-explicit",
            "/control-connect",
            "/control-transparent",
            "/mixed"
        ]
    );
    let tls_paths: Vec<String> = public_https.all().into_iter().map(|s| s.path).collect();
    assert_eq!(tls_paths, ["/control-tls"]);
    let counters = egress
        .metrics()
        .into_iter()
        .find(|(id, _)| id == SANDBOX)
        .unwrap()
        .1;
    assert_eq!(counters.connections_allowed, 5, "{counters:?}");
    eprintln!(
        "held: {n_rows} attempts, none reached a private address ({n_controls} controls served) in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// moto (real S3, IAM and STS with signature checks) over TLS as
/// `secure.test` (to S3 there, virtual-hosted bucket `secure`), with an
/// IAM user whose keys it returns; `None` (skip)
/// when moto is not installed and HEARTH_REQUIRE_S3 is not set.
struct Moto {
    child: std::process::Child,
    port: u16,
    key_id: String,
    secret: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        if let Err(e) = self.child.kill() {
            eprintln!("cannot stop moto_server: {e}");
        }
        let _ = self.child.wait();
    }
}

fn start_moto(dir: &std::path::Path) -> Option<Moto> {
    let Some(moto) = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("moto_server"))
            .find(|p| p.is_file())
    }) else {
        assert!(
            std::env::var_os("HEARTH_REQUIRE_S3").is_none(),
            "HEARTH_REQUIRE_S3 is set but moto_server is not installed"
        );
        eprintln!("SKIP: moto_server not found");
        return None;
    };
    // The Python that runs moto has boto3 (a dependency of moto).
    let script = std::fs::read_to_string(&moto).unwrap();
    let python = script
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("#!"))
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.contains("env") && !p.contains("bash") && !p.contains(" "))
        .unwrap_or_else(|| "python3".into());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(&moto)
        .args(["-H", "127.0.0.1", "-p", &port.to_string(), "-s"])
        .arg("-c")
        .arg(dir.join("secure.test.pem"))
        .arg("-k")
        .arg(dir.join("secure.test.key"))
        // Exactly the set-up's seven requests go unsigned; every later one
        // must carry a valid signature from a real key.
        .env("INITIAL_NO_AUTH_ACTION_COUNT", "7")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut m = Moto {
        child,
        port,
        key_id: String::new(),
        secret: String::new(),
    };
    // Ready when it accepts (an HTTP probe would use up an unsigned request).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "moto never listened");
        std::thread::sleep(Duration::from_millis(100));
    }
    let setup = r#"
import json, sys, boto3, urllib3
urllib3.disable_warnings()
kw = dict(endpoint_url=sys.argv[1], region_name="us-east-1", aws_access_key_id="setup",
          aws_secret_access_key="setup", verify=False)
iam = boto3.client("iam", **kw)
iam.create_user(UserName="sandbox")
iam.put_user_policy(UserName="sandbox", PolicyName="all", PolicyDocument=json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
k = iam.create_access_key(UserName="sandbox")["AccessKey"]
iam.create_role(RoleName="sandbox-role", AssumeRolePolicyDocument=json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"},
     "Action": ["sts:AssumeRole", "sts:TagSession"]}]}))
iam.put_role_policy(RoleName="sandbox-role", PolicyName="all", PolicyDocument=json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
s3 = boto3.client("s3", **kw)
s3.create_bucket(Bucket="secure")
s3.put_object(Bucket="secure", Key="hello.txt", Body=b"hi from moto")
print(k["AccessKeyId"], k["SecretAccessKey"])
"#;
    let out = Command::new(&python)
        .args(["-c", setup, &format!("https://127.0.0.1:{port}")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "moto set-up: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = String::from_utf8(out.stdout).unwrap();
    let mut keys = out.split_whitespace();
    m.key_id = keys.next().unwrap().to_owned();
    m.secret = keys.next().unwrap().to_owned();
    Some(m)
}

fn aws_rule(hosts: &[&str], key_id: &str, secret: &str) -> ProxyRule {
    let opaque = |v: &str| hearth_api::nested::ProxySecret {
        kind: SecretKind::Opaque,
        value: Some(v.into()),
        is_set: None,
    };
    ProxyRule {
        name: "aws".into(),
        kind: Some("aws".into()),
        match_hosts: hosts.iter().map(|s| s.to_string()).collect(),
        aws: Some(hearth_api::nested::ProxyAws {
            access_key_id: Some(opaque(key_id)),
            secret_access_key: Some(opaque(secret)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// An `aws` rule with `role_arn`: the proxy assumes the role with the
/// operator's identity (STS AssumeRole, signed; the workspace as external
/// id; the rule's session tags) and re-signs the guest's requests with the
/// session (its token signed in), which moto checks; one session serves
/// many requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_role_rules_re_sign_with_a_session_of_the_role() {
    if !net_available() {
        return;
    }
    let mut moto = None;
    let w = world_with(Policy::default(), |dir| {
        let m = start_moto(dir)?;
        let identity = hearth_egress::AwsIdentity {
            access_key_id: m.key_id.clone(),
            secret_access_key: m.secret.clone(),
            sts_endpoint: format!("https://secure.test:{}/", m.port),
            region: "us-east-1".into(),
        };
        moto = Some(m);
        Some(identity)
    })
    .await;
    let Some(moto) = moto else {
        return;
    };
    let rule = ProxyRule {
        name: "role".into(),
        kind: Some("aws".into()),
        match_hosts: vec!["secure.test".into()],
        aws: Some(hearth_api::nested::ProxyAws {
            role_arn: Some("arn:aws:iam::123456789012:role/sandbox-role".into()),
            session_tags: Some(
                [("team".to_owned(), serde_json::json!("a"))]
                    .into_iter()
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut p = policy(ProxyConfig {
        rules: vec![rule],
        ..Default::default()
    });
    p.tenant_id = Some("ws-1".into());
    assert!(w.egress.set_policy(SANDBOX, p));
    let resolve = format!("secure.test:{}:192.0.2.10", moto.port);
    let ca = w.proxy_ca.to_str().unwrap().to_owned();
    let url = |path: &str| format!("https://secure.test:{}{path}", moto.port);
    let signed = |service: &str, path: &str, extra: &[&str]| {
        let mut a: Vec<String> = vec![
            "--resolve".into(),
            resolve.clone(),
            "--cacert".into(),
            ca.clone(),
            "--aws-sigv4".into(),
            format!("aws:amz:us-east-1:{service}"),
            "--user".into(),
            "DUMMYKEY:dummysecret".into(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        a.push(url(path));
        a
    };
    let run = |args: Vec<String>| {
        let ns = &w.ns;
        async move {
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            ns.curl(&refs).await
        }
    };
    let (status, body) = run(signed(
        "s3",
        "/hello.txt",
        &["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"],
    ))
    .await;
    assert_eq!((status, body.as_str()), (200, "hi from moto"));
    let (status, body) = run(signed(
        "sts",
        "/",
        &["--data", "Action=GetCallerIdentity&Version=2011-06-15"],
    ))
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("assumed-role/sandbox-role/hearth-sb-test"),
        "the session is the role's: {body}"
    );
}

/// Issue 17: the guest signs AWS requests with a dummy key; an `aws` rule
/// makes the proxy sign them again with the real one, which moto checks
/// (S3 GET and a listing with a query, and STS over a form body the proxy
/// hashes). Without the rule the same requests are refused by moto.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_requests_are_re_signed_with_the_rules_keys() {
    if !net_available() {
        return;
    }
    let w = world(Policy::default()).await;
    let Some(moto) = start_moto(&w.dir) else {
        return;
    };
    let resolve = format!("secure.test:{}:192.0.2.10", moto.port);
    // Spliced TLS shows moto's own certificate, intercepted TLS the
    // proxy's: the guest trusts both CAs.
    let both = w.dir.join("both-ca.pem");
    let pem = |p: &PathBuf| std::fs::read_to_string(p).unwrap();
    std::fs::write(&both, pem(&w.proxy_ca) + &pem(&w.origin_ca)).unwrap();
    let ca = both.to_str().unwrap().to_owned();
    let url = |path: &str| format!("https://secure.test:{}{path}", moto.port);
    let s3 = |path: &str| {
        vec![
            "--resolve".to_owned(),
            resolve.clone(),
            "--cacert".to_owned(),
            ca.clone(),
            "--aws-sigv4".to_owned(),
            "aws:amz:us-east-1:s3".to_owned(),
            "--user".to_owned(),
            "DUMMYKEY:dummysecret".to_owned(),
            // As the SDKs send it over TLS (S3 insists on the header).
            "-H".to_owned(),
            "x-amz-content-sha256: UNSIGNED-PAYLOAD".to_owned(),
            url(path),
        ]
    };
    let sts = {
        let mut a = s3("/");
        a[5] = "aws:amz:us-east-1:sts".into();
        a.drain(8..10);
        a.extend([
            "--data".into(),
            "Action=GetCallerIdentity&Version=2011-06-15".into(),
        ]);
        a
    };
    let run = |args: Vec<String>| {
        let ns = &w.ns;
        async move {
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            ns.curl(&refs).await
        }
    };
    // No rule: TLS to secure.test is spliced and moto sees the dummy key.
    let (status, body) = run(s3("/hello.txt")).await;
    assert_eq!(status, 403, "{body}");

    assert!(w.egress.set_policy(
        SANDBOX,
        policy(ProxyConfig {
            rules: vec![aws_rule(&["secure.test"], &moto.key_id, &moto.secret)],
            ..Default::default()
        }),
    ));
    let (status, body) = run(s3("/hello.txt")).await;
    assert_eq!((status, body.as_str()), (200, "hi from moto"));
    let (status, body) = run(s3("/?list-type=2&prefix=hel")).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("<Key>hello.txt</Key>"), "{body}");
    let (status, body) = run(sts.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("user/sandbox"), "{body}");

    // A disabled rule signs nothing again.
    let mut off = aws_rule(&["secure.test"], &moto.key_id, &moto.secret);
    off.enabled = Some(false);
    assert!(w.egress.set_policy(
        SANDBOX,
        policy(ProxyConfig {
            rules: vec![off],
            ..Default::default()
        }),
    ));
    let (status, body) = run(sts).await;
    assert_eq!(status, 403, "{body}");

    // Issue 39, finding 5: a bucket mount's rule signs only what the mount
    // may do; the rest is refused by the proxy itself, never sent.
    let scoped = |read_only: bool, prefix: Option<&str>| {
        let mut spec = ProxyConfig {
            rules: vec![aws_rule(&["secure.test"], &moto.key_id, &moto.secret)],
            ..Default::default()
        }
        .to_spec();
        spec.rules[0].scope = Some(hearth_types::egress::BucketScope {
            api: hearth_types::egress::BucketApi::S3VirtualHost,
            bucket: "secure".into(),
            read_only,
            prefix: prefix.map(str::to_owned),
        });
        Policy::from_spec(&spec, &mut |v| {
            let (SecretValue::Plain(s) | SecretValue::Sealed(s) | SecretValue::Template(s)) = v;
            Ok(s.clone())
        })
        .unwrap()
    };
    let put = |path: &str| {
        let mut a = s3(path);
        let url = a.pop().unwrap();
        a.extend([
            "-X".into(),
            "PUT".into(),
            // Not a form: moto's server would read a form body as fields.
            "-H".into(),
            "content-type: application/octet-stream".into(),
            "--data-binary".into(),
            "written".into(),
            url,
        ]);
        a
    };
    assert!(w.egress.set_policy(SANDBOX, scoped(true, None)));
    let (status, body) = run(s3("/hello.txt")).await;
    assert_eq!(
        (status, body.as_str()),
        (200, "hi from moto"),
        "a read-only mount reads"
    );
    let (status, body) = run(put("/new.txt")).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("Hearth egress proxy") && body.contains("read-only"),
        "refused by the proxy: {body}"
    );
    assert!(w.egress.set_policy(SANDBOX, scoped(false, Some("team"))));
    let (status, body) = run(s3("/hello.txt")).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("outside the mount's prefix"), "{body}");
    let (status, body) = run(s3("/?list-type=2&prefix=hel")).await;
    assert_eq!(status, 403, "a listing outside the prefix: {body}");
    let (status, body) = run(put("/team/new.txt")).await;
    assert_eq!(status, 200, "a write under the prefix is signed: {body}");
    let (status, body) = run(s3("/?list-type=2&prefix=team")).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("<Key>team/new.txt</Key>"), "{body}");
    let (status, body) = run(s3("/team/new.txt")).await;
    assert_eq!(
        (status, body.as_str()),
        (200, "written"),
        "a read under the prefix is signed"
    );
}

/// Issue 39, finding 5, GCS: an upload that names its object in its body
/// (a multipart upload's first part, a resumable upload's initiation) on a
/// mount with a prefix. The proxy reads the name there before it signs:
/// inside the prefix the request goes upstream with the mount's
/// credential and its body byte for byte (the object's bytes streamed
/// after the first part); outside, or naming nothing, it is refused and
/// never sent. A resumable session's later requests name nothing and go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcs_uploads_named_in_their_body_are_signed_inside_the_prefix_only() {
    if !net_available() {
        return;
    }
    let mut spec = ProxyConfig {
        rules: vec![rule(
            "gcs-mount",
            &["secure.test"],
            &[("authorization", "Bearer mount-token")],
        )],
        ..Default::default()
    }
    .to_spec();
    spec.rules[0].scope = Some(hearth_types::egress::BucketScope {
        api: hearth_types::egress::BucketApi::Gcs,
        bucket: "data".into(),
        read_only: false,
        prefix: Some("team/a".into()),
    });
    let p = Policy::from_spec(&spec, &mut |v| {
        let (SecretValue::Plain(s) | SecretValue::Sealed(s) | SecretValue::Template(s)) = v;
        Ok(s.clone())
    })
    .unwrap();
    let w = world(p).await;

    const BOUNDARY: &str = "hearth_b0undary_7c1d";
    // The object's bytes: 3 MiB, every byte value, line ends and dashes.
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let object: Vec<u8> = (0..3 << 20)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 24) as u8
        })
        .collect();
    let multipart = |eol: &str, json: &str, object: &[u8]| {
        [
            format!("--{BOUNDARY}{eol}Content-Type: application/json; charset=UTF-8{eol}{eol}{json}{eol}--{BOUNDARY}{eol}Content-Type: application/octet-stream{eol}{eol}").as_bytes(),
            object,
            format!("{eol}--{BOUNDARY}--{eol}").as_bytes(),
        ]
        .concat()
    };
    let n = AtomicUsize::new(0);
    // POSTs (or `method`s) `body` from a file; (status, guest's answer).
    let send = |method: &str, query: &str, content_type: &str, body: Vec<u8>| {
        let file = w
            .dir
            .join(format!("upload-{}", n.fetch_add(1, Ordering::SeqCst)));
        std::fs::write(&file, body).unwrap();
        let args: Vec<String> = [
            "-X",
            method,
            "-H",
            &format!("Content-Type: {content_type}"),
            "-H",
            "Authorization: Bearer dummy",
            "--data-binary",
            &format!("@{}", file.display()),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let path = format!("/upload/storage/v1/b/data/o?{query}");
        let w = &w;
        async move {
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            w.get_https("secure.test", &path, &refs).await
        }
    };
    let related = format!("multipart/related; boundary=\"{BOUNDARY}\"");
    // The last request upstream got the body as sent, signed.
    let delivered = |body: &[u8]| {
        let seen = w.https.all();
        let last = seen.last().expect("a request upstream");
        assert_eq!(last.path, "/upload/storage/v1/b/data/o");
        assert_eq!(last.headers["authorization"], "Bearer mount-token");
        assert!(
            last.body.as_ref() == body,
            "the body byte for byte ({} bytes, {} sent)",
            last.body.len(),
            body.len()
        );
    };

    // A multipart upload inside the prefix, CRLF and LF lines.
    for eol in ["\r\n", "\n"] {
        let body = multipart(eol, r#"{"name":"team/a/big.bin"}"#, &object);
        let (status, answer) = send("POST", "uploadType=multipart", &related, body.clone()).await;
        assert_eq!(status, 200, "{eol:?}: {answer}");
        delivered(&body);
    }
    let body = multipart(
        "\r\n",
        r#"{"contentType":"text/plain","name":"team\/a\/\u00e9t\u00e9.txt"}"#,
        b"small",
    );
    let (status, answer) = send("POST", "uploadType=multipart", &related, body.clone()).await;
    assert_eq!(status, 200, "{answer}");
    delivered(&body);
    let sent = w.https.len();

    // Outside the prefix, or naming nothing: refused by the proxy.
    for (query, json, why) in [
        (
            "uploadType=multipart",
            r#"{"name":"team/b/x"}"#,
            "outside the mount's prefix",
        ),
        (
            "uploadType=multipart",
            r#"{"name":"secret.txt"}"#,
            "outside the mount's prefix",
        ),
        (
            "uploadType=multipart&name=team%2Fa%2Fx",
            r#"{"name":"secret.txt"}"#,
            "outside the mount's prefix",
        ),
        (
            "uploadType=multipart",
            r#"{"contentType":"text/plain"}"#,
            "names no object",
        ),
        (
            "uploadType=multipart",
            r#"{"name":"team/a/x","name":"secret.txt"}"#,
            "twice",
        ),
    ] {
        let (status, answer) =
            send("POST", query, &related, multipart("\r\n", json, &object)).await;
        assert_eq!(status, 403, "{json}: {answer}");
        assert!(
            answer.contains("Hearth egress proxy") && answer.contains(why),
            "{json}: {answer}"
        );
    }
    // A first part that does not end within 64 KiB.
    let long = format!(r#"{{"name":"team/a/x","pad":"{}"}}"#, "x".repeat(70 << 10));
    let (status, answer) = send(
        "POST",
        "uploadType=multipart",
        &related,
        multipart("\r\n", &long, b"x"),
    )
    .await;
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("64 KiB"), "{answer}");
    assert_eq!(w.https.len(), sent, "nothing refused went upstream");

    // An LF body with a CRLF boundary line deep in the object's bytes (a
    // parser that requires CRLF would start its parts there): cut off, so
    // the upstream never gets the whole request.
    let mut tricky = object.clone();
    let deep = format!("\r\n--{BOUNDARY}\r\n\r\n{{\"name\":\"secret.txt\"}}\r\n");
    tricky.splice(2 << 20..2 << 20, deep.bytes());
    let body = multipart("\n", r#"{"name":"team/a/x"}"#, &tricky);
    let (status, answer) = send("POST", "uploadType=multipart", &related, body.clone()).await;
    assert_ne!(status, 200, "{answer}");
    assert!(
        w.https
            .all()
            .iter()
            .all(|s| s.body.as_ref() != body.as_slice()),
        "the whole body never went upstream"
    );

    // A resumable upload: its initiation names the object in its JSON body.
    let json = "application/json; charset=UTF-8";
    let inside = br#"{"name":"team/a/resumable.bin","contentType":"application/octet-stream"}"#;
    let (status, answer) = send("POST", "uploadType=resumable", json, inside.to_vec()).await;
    assert_eq!(status, 200, "{answer}");
    delivered(inside);
    let sent = w.https.len();
    for (query, body, why) in [
        (
            "uploadType=resumable",
            &br#"{"name":"team/b/resumable.bin"}"#[..],
            "outside the mount's prefix",
        ),
        ("uploadType=resumable", b"", "names no object"),
        (
            "uploadType=resumable&name=team%2Fa%2Fx",
            br#"{"name":"other"}"#,
            "outside the mount's prefix",
        ),
        (
            "uploadType=resumable",
            b"{\"name\":\"team/a/x\"",
            "not a JSON object",
        ),
    ] {
        let (status, answer) = send("POST", query, json, body.to_vec()).await;
        assert_eq!(status, 403, "{query} {body:?}: {answer}");
        assert!(answer.contains(why), "{answer}");
    }
    let big = format!(r#"{{"name":"team/a/x","pad":"{}"}}"#, "x".repeat(70 << 10));
    let (status, answer) = send("POST", "uploadType=resumable", json, big.into_bytes()).await;
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("longer than 64 KiB"), "{answer}");
    assert_eq!(w.https.len(), sent, "nothing refused went upstream");
    // The session's chunks name nothing (GCS binds them to the initiated
    // object): signed and sent as they are.
    let (status, answer) = send(
        "PUT",
        "uploadType=resumable&upload_id=session-1",
        "application/octet-stream",
        object.clone(),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    delivered(&object);
}
