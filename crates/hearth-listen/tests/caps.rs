//! The listener's bounds against a real server on loopback: both caps
//! refuse and recover, half-open and idle connections are closed after
//! the header timeout, and an upgraded connection outlives it while
//! holding its slot. (The control plane's own regression test,
//! `finding7_slow_clients_do_not_exhaust_descriptors`, floods the real API.)

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::routing::get;
use futures_util::{SinkExt, StreamExt};
use hearth_listen::{Counters, Limits, Options};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

async fn start(limits: Limits) -> (SocketAddr, Arc<Counters>) {
    let app = axum::Router::new()
        .route("/", get(|| async { "ok" }))
        .route(
            "/ws",
            get(|ws: WebSocketUpgrade| async { ws.on_upgrade(echo) }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let options = Options::new("test", limits);
    let counters = options.counters.clone();
    tokio::spawn(hearth_listen::serve(
        listener,
        app,
        options,
        std::future::pending(),
    ));
    (addr, counters)
}

async fn echo(mut ws: WebSocket) {
    while let Some(Ok(m)) = ws.recv().await {
        if matches!(m, Message::Close(_)) || ws.send(m).await.is_err() {
            break;
        }
    }
}

/// A connection from `from` (any 127.0.0.0/8 address is loopback).
async fn connect(from: &str, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::new(from.parse::<IpAddr>().unwrap(), 0))
        .unwrap();
    socket.connect(to).await.unwrap()
}

/// What the server sends before it closes, or `None` if it keeps the
/// connection open for `wait`.
async fn until_closed(tcp: &mut TcpStream, wait: Duration) -> Option<String> {
    let mut out = Vec::new();
    match tokio::time::timeout(wait, tcp.read_to_end(&mut out)).await {
        Ok(Ok(_)) => Some(String::from_utf8_lossy(&out).into_owned()),
        // A reset is a close too.
        Ok(Err(_)) => Some(String::from_utf8_lossy(&out).into_owned()),
        Err(_) => None,
    }
}

async fn wait_open(counters: &Counters, n: u64) {
    let t = Instant::now();
    while counters.open() != n {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "open {}",
            counters.open()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn get_ok(from: &str, addr: SocketAddr) -> String {
    let mut tcp = connect(from, addr).await;
    tcp.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    until_closed(&mut tcp, Duration::from_secs(5))
        .await
        .expect("answered")
}

#[tokio::test]
async fn both_caps_refuse_with_a_503_and_recover() {
    let (addr, counters) = start(Limits {
        header_read_timeout: Duration::from_secs(60),
        max_connections: 3,
        max_per_peer: 2,
    })
    .await;
    let short = Duration::from_millis(300);

    let mut a1 = connect("127.0.0.2", addr).await;
    let mut a2 = connect("127.0.0.2", addr).await;
    let mut a3 = connect("127.0.0.2", addr).await;
    assert!(until_closed(&mut a1, short).await.is_none());
    assert!(until_closed(&mut a2, short).await.is_none());
    let refused = until_closed(&mut a3, short).await.expect("refused at once");
    assert!(refused.starts_with("HTTP/1.1 503 "), "{refused}");
    assert!(refused.contains("TooManyConnections"), "{refused}");
    assert_eq!(counters.refused_peer(), 1);

    let mut b1 = connect("127.0.0.3", addr).await;
    assert!(until_closed(&mut b1, short).await.is_none());
    wait_open(&counters, 3).await;
    let refused = get_ok("127.0.0.4", addr).await;
    assert!(refused.starts_with("HTTP/1.1 503 "), "{refused}");
    assert_eq!(counters.refused_total(), 1);

    // Slots come back when sockets close; the loop never stopped.
    drop(a1);
    drop(b1);
    wait_open(&counters, 1).await;
    assert!(get_ok("127.0.0.4", addr).await.starts_with("HTTP/1.1 200 "));
    assert!(get_ok("127.0.0.2", addr).await.starts_with("HTTP/1.1 200 "));
    wait_open(&counters, 1).await;
    drop(a2);
    wait_open(&counters, 0).await;
}

#[tokio::test]
async fn half_open_and_idle_connections_close_after_the_header_timeout() {
    let timeout = Duration::from_secs(1);
    let (addr, counters) = start(Limits {
        header_read_timeout: timeout,
        max_connections: 16,
        max_per_peer: 16,
    })
    .await;

    // A head that never ends.
    let t = Instant::now();
    let mut half = connect("127.0.0.1", addr).await;
    half.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nx-slow: ")
        .await
        .unwrap();
    until_closed(&mut half, Duration::from_secs(5))
        .await
        .expect("closed");
    let took = t.elapsed();
    assert!(
        took >= timeout && took < timeout * 3,
        "closed after {took:?}"
    );

    // A keep-alive connection after its answer.
    let mut idle = connect("127.0.0.1", addr).await;
    idle.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 512];
    let n = idle.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200 "));
    let t = Instant::now();
    until_closed(&mut idle, Duration::from_secs(5))
        .await
        .expect("closed");
    let took = t.elapsed();
    assert!(
        took >= timeout / 2 && took < timeout * 3,
        "closed after {took:?}"
    );
    wait_open(&counters, 0).await;
}

#[tokio::test]
async fn upgraded_connections_outlive_the_header_timeout_and_keep_their_slot() {
    let timeout = Duration::from_secs(1);
    let (addr, counters) = start(Limits {
        header_read_timeout: timeout,
        max_connections: 1,
        max_per_peer: 1,
    })
    .await;
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws"))
        .await
        .unwrap();
    tokio::time::sleep(timeout * 3).await;
    ws.send(tokio_tungstenite::tungstenite::Message::text("still here"))
        .await
        .unwrap();
    let back = ws.next().await.unwrap().unwrap();
    assert_eq!(back.into_text().unwrap().as_str(), "still here");

    // The WebSocket still holds the only slot.
    assert_eq!(counters.open(), 1);
    assert!(get_ok("127.0.0.1", addr).await.starts_with("HTTP/1.1 503 "));
    ws.close(None).await.unwrap();
    drop(ws);
    wait_open(&counters, 0).await;
    assert!(get_ok("127.0.0.1", addr).await.starts_with("HTTP/1.1 200 "));
}

/// TLS and plain HTTP share the port: a client that opens with a TLS
/// handshake is served over TLS, any other in the clear; one that starts
/// a handshake and stalls is closed after the header timeout, and its
/// slot comes back.
#[tokio::test]
async fn tls_and_plain_http_share_a_port() {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["x.hearth.localhost".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let der_key = rustls::pki_types::PrivateKeyDer::Pkcs8(
        rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()),
    );
    let server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], der_key)
        .unwrap();
    let app = axum::Router::new().route("/", get(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut options = Options::new(
        "test",
        Limits {
            header_read_timeout: Duration::from_millis(500),
            max_connections: 64,
            max_per_peer: 64,
        },
    );
    options.tls = Some(Arc::new(server));
    let counters = options.counters.clone();
    tokio::spawn(hearth_listen::serve(
        listener,
        app,
        options,
        std::future::pending(),
    ));

    // In the clear.
    assert!(get_ok("127.0.0.1", addr).await.ends_with("ok"));

    // Over TLS, trusting the certificate.
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let tcp = connect("127.0.0.1", addr).await;
    let name = rustls::pki_types::ServerName::try_from("x.hearth.localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    tls.write_all(b"GET / HTTP/1.1\r\nhost: x.hearth.localhost\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    // A close without close_notify is the server's right here.
    let _ = tls.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out);
    assert!(
        text.starts_with("HTTP/1.1 200") && text.ends_with("ok"),
        "{text}"
    );

    // A handshake begun and never finished is closed like a stalled head.
    let mut stalled = connect("127.0.0.1", addr).await;
    stalled.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
    let t = Instant::now();
    assert!(until_closed(&mut stalled, Duration::from_secs(5))
        .await
        .is_some());
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    wait_open(&counters, 0).await;

    // So is one whose first record is larger than TLS allows (2^14 bytes
    // and a little): refused at its header, not read to its end.
    let mut huge = connect("127.0.0.1", addr).await;
    let mut hello = vec![0x16, 0x03, 0x01, 0xff, 0xff];
    hello.extend(std::iter::repeat_n(0x41, 64 << 10));
    // The server may close before it has read it all.
    let _ = huge.write_all(&hello).await;
    let t = Instant::now();
    assert!(until_closed(&mut huge, Duration::from_secs(5))
        .await
        .is_some());
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    wait_open(&counters, 0).await;
}

/// Issue 39, finding 6: a local client holding every connection the TCP
/// listener allows its address does not lock the operator out: the same
/// app on the operator's unix socket answers, with a cap of its own.
#[tokio::test]
async fn the_operator_socket_answers_while_tcp_is_full() {
    let (addr, counters) = start(Limits {
        header_read_timeout: Duration::from_secs(60),
        max_connections: 4,
        max_per_peer: 2,
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("api.sock");
    let unix = tokio::net::UnixListener::bind(&path).unwrap();
    let app = axum::Router::new().route("/", get(|| async { "ok" }));
    tokio::spawn(hearth_listen::serve_unix(
        unix,
        app,
        Options::new("operator", Limits::for_descriptors(4096)),
        std::future::pending(),
    ));
    let _held = [
        connect("127.0.0.1", addr).await,
        connect("127.0.0.1", addr).await,
    ];
    wait_open(&counters, 2).await;
    assert!(get_ok("127.0.0.1", addr).await.starts_with("HTTP/1.1 503 "));

    let get = || async {
        let mut s = tokio::net::UnixStream::connect(&path).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    };
    let answer = get().await;
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok"),
        "{answer}"
    );

    // Its own cap: past it, the same 503; a slot given back is reusable.
    let mut idle = Vec::new();
    for _ in 0..hearth_listen::OPERATOR_CONNECTIONS {
        idle.push(tokio::net::UnixStream::connect(&path).await.unwrap());
    }
    // The server takes each as it accepts it: wait for the refusals.
    let t = Instant::now();
    let refused = loop {
        let answer = get().await;
        if answer.starts_with("HTTP/1.1 503 ") || t.elapsed() > Duration::from_secs(5) {
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(refused.contains("TooManyConnections"), "{refused}");
    idle.pop();
    let t = Instant::now();
    loop {
        let answer = get().await;
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "{answer}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
