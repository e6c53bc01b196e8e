//! Throughput and connection-setup latency through the egress proxy, next to
//! direct connections, in one run. Needs root and `nft` (it builds a sandbox
//! namespace like the tests do).
//!
//! `cargo run --release -p hearth-egress --example egress_throughput`

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hearth_egress::{Egress, EgressSettings, Policy, SandboxSockets};
use hearth_types::egress::{EgressSpec, HeaderSpec, RuleSpec, SecretValue};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SIZE: usize = 256 << 20;
const ROUNDS: usize = 200;

fn sh(args: &[&str]) {
    let ok = Command::new(args[0])
        .args(&args[1..])
        .status()
        .map(|s| s.success());
    assert!(matches!(ok, Ok(true)), "{args:?} failed");
}

fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        nix::sched::setns(
            std::fs::File::open(path).unwrap(),
            nix::sched::CloneFlags::CLONE_NEWNET,
        )
        .unwrap();
        f()
    })
    .join()
    .unwrap()
}

/// Serves `GET /big` (256 MiB) and anything else (a few bytes), one request
/// per connection, over TLS when configured.
async fn server(tls: Option<Arc<rustls::ServerConfig>>) -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = l.accept().await.unwrap();
            let _ = tcp.set_nodelay(true);
            let tls = tls.clone();
            tokio::spawn(async move {
                match tls {
                    Some(cfg) => {
                        if let Ok(s) = tokio_rustls::TlsAcceptor::from(cfg).accept(tcp).await {
                            serve_one(s).await;
                        }
                    }
                    None => serve_one(tcp).await,
                }
            });
        }
    });
    port
}

async fn serve_one<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut s: S) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let big = head.starts_with(b"GET /big");
    let len = if big { SIZE } else { 2 };
    let _ = s
        .write_all(
            format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await;
    if big {
        let chunk = vec![0u8; 256 << 10];
        for _ in 0..SIZE / chunk.len() {
            if s.write_all(&chunk).await.is_err() {
                return;
            }
        }
    } else {
        let _ = s.write_all(b"ok").await;
    }
    let _ = s.shutdown().await;
}

/// One request; returns the bytes of the response read.
fn get(addr: SocketAddr, tls: Option<(&Arc<rustls::ClientConfig>, &str)>, path: &str) -> usize {
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_nodelay(true).unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: bench.test\r\nConnection: close\r\n\r\n");
    let mut buf = vec![0u8; 256 << 10];
    let mut total = 0;
    let mut read_all = |s: &mut dyn Read| loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => total += n,
        }
    };
    match tls {
        Some((cfg, name)) => {
            let conn = rustls::ClientConnection::new(
                cfg.clone(),
                ServerName::try_from(name.to_owned()).unwrap(),
            )
            .unwrap();
            let mut s = rustls::StreamOwned::new(conn, tcp);
            s.write_all(req.as_bytes()).unwrap();
            read_all(&mut s);
        }
        None => {
            let mut tcp = tcp;
            tcp.write_all(req.as_bytes()).unwrap();
            read_all(&mut tcp);
        }
    }
    total
}

fn client_config(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::pem::PemObject::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

fn mibs(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / d.as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let dir = std::env::temp_dir().join(format!("hegress-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_pem = ca_params.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec![
        "bench.test".to_owned(),
        "intercept.bench.test".to_owned(),
    ])
    .unwrap()
    .signed_by(&key, &issuer)
    .unwrap();
    std::fs::write(dir.join("origin.pem"), &ca_pem).unwrap();
    let server_cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
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
    let http_port = server(None).await;
    let tls_port = server(Some(Arc::new(server_cfg))).await;

    let mut hosts = BTreeMap::new();
    hosts.insert("bench.test".to_owned(), vec!["127.0.0.1".parse().unwrap()]);
    hosts.insert(
        "intercept.bench.test".to_owned(),
        vec!["127.0.0.1".parse().unwrap()],
    );
    let egress = Egress::new(EgressSettings {
        ca_dir: dir.join("ca"),
        origin_ca_files: vec![dir.join("origin.pem")],
        allow_private: vec!["127.0.0.1/32".parse().unwrap()],
        hosts,
        connect_timeout: Duration::from_secs(5),
        callback_signer: None,
        control_url: None,
        aws_identity: None,
    })
    .unwrap();
    let ns = format!("hegress-bench-{}", std::process::id());
    sh(&["ip", "netns", "add", &ns]);
    sh(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
    sh(&[
        "ip", "-n", &ns, "link", "add", "tap0", "type", "veth", "peer", "name", "tap0p",
    ]);
    sh(&["ip", "-n", &ns, "link", "set", "tap0p", "up"]);
    sh(&[
        "ip",
        "-n",
        &ns,
        "addr",
        "add",
        "10.200.0.1/30",
        "dev",
        "tap0",
    ]);
    sh(&["ip", "-n", &ns, "link", "set", "tap0", "up"]);
    sh(&["ip", "-n", &ns, "route", "add", "default", "dev", "tap0"]);
    let rules = "table ip hearth {\\n chain out {\\n  type nat hook output priority -100; policy accept;\\n  tcp dport != { 15001, 3128 } redirect to :15001\\n }\\n}\\n";
    sh(&[
        "ip",
        "netns",
        "exec",
        &ns,
        "sh",
        "-c",
        &format!("printf '{rules}' | nft -f -"),
    ]);
    let sockets = in_ns(&ns, || SandboxSockets {
        transparent: std::net::TcpListener::bind("0.0.0.0:15001").unwrap(),
        explicit: std::net::TcpListener::bind("10.200.0.1:3128").unwrap(),
        dns: std::net::UdpSocket::bind("10.200.0.1:53").unwrap(),
    });
    // One header rule, so the intercepted path does the work it does for
    // a sandbox with rules.
    let spec = EgressSpec {
        rules: vec![RuleSpec {
            name: "bench".into(),
            enabled: true,
            match_hosts: vec!["intercept.bench.test".into()],
            headers: vec![HeaderSpec {
                name: "x-bench".into(),
                value: SecretValue::Plain("1".into()),
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let policy = Policy::from_spec(&spec, &mut |v| match v {
        SecretValue::Plain(s) => Ok(s.clone()),
        _ => Err("the benchmark has no secrets".into()),
    })
    .unwrap();
    let _attachment = egress.attach("bench", policy, sockets).unwrap();

    let origin = client_config(&ca_pem);
    let proxy = client_config(egress.ca_pem());
    let direct_tls: SocketAddr = ([127, 0, 0, 1], tls_port).into();
    let via_tls: SocketAddr = ([192, 0, 2, 1], tls_port).into();
    let runs: Vec<(&str, bool, SocketAddr, Arc<rustls::ClientConfig>, &str)> = vec![
        (
            "direct TLS",
            false,
            direct_tls,
            origin.clone(),
            "bench.test",
        ),
        (
            "proxy, TLS spliced",
            true,
            via_tls,
            origin.clone(),
            "bench.test",
        ),
        (
            "proxy, TLS intercepted",
            true,
            via_tls,
            proxy.clone(),
            "intercept.bench.test",
        ),
    ];
    println!("256 MiB download:");
    for (label, proxied, addr, cfg, name) in runs {
        let name = name.to_owned();
        let f = move || {
            let t = Instant::now();
            let n = get(addr, Some((&cfg, &name)), "/big");
            (n, t.elapsed())
        };
        let (n, d) = if proxied {
            in_ns(&ns, f)
        } else {
            tokio::task::spawn_blocking(f).await.unwrap()
        };
        assert!(n >= SIZE, "{label}: short read {n}");
        println!("  {label:<24} {:>8.1} MiB/s", mibs(n, d));
    }
    println!("connection setup + one small plain HTTP request, {ROUNDS} rounds:");
    for (label, proxied) in [("direct", false), ("through the proxy", true)] {
        let addr: SocketAddr = if proxied {
            ([192, 0, 2, 1], http_port).into()
        } else {
            ([127, 0, 0, 1], http_port).into()
        };
        let f = move || {
            let t = Instant::now();
            for _ in 0..ROUNDS {
                assert!(get(addr, None, "/small") > 0);
            }
            t.elapsed() / ROUNDS as u32
        };
        let d = if proxied {
            in_ns(&ns, f)
        } else {
            tokio::task::spawn_blocking(f).await.unwrap()
        };
        println!(
            "  {label:<24} {:>8.0} µs per request",
            d.as_secs_f64() * 1e6
        );
    }
    let _ = Command::new("ip").args(["netns", "del", &ns]).status();
    let _ = std::fs::remove_dir_all(&dir);
}
