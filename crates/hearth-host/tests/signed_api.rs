//! The host's private API with signed commands: a real host agent, a real
//! VM, and every kind of bad command sent over real HTTP. Every one is
//! refused (403 `CommandRefused`), each with its own reason, and the VM the
//! good commands drive is untouched by the bad ones.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::host;
use hearth_fence::{KeyPair, KeyRing, Signer, Verifier, VerifierConfig};
use hearth_host::api::CommandCheck;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const HOST: &str = "host-a";
const EPOCH: u64 = 3;

struct Resp {
    status: u16,
    body: Value,
}

/// One HTTP/1.1 request on its own connection.
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> Resp {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(t) = token {
        head.push_str(&format!("{}: {t}\r\n", hearth_fence::HEADER_NAME));
    }
    head.push_str("\r\n");
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(body).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(120), tcp.read_to_end(&mut raw))
        .await
        .expect("answer in time")
        .unwrap();
    let text = String::from_utf8_lossy(&raw);
    let status: u16 = text[9..12].parse().unwrap();
    let body_at = text.find("\r\n\r\n").map_or(text.len(), |i| i + 4);
    let body = serde_json::from_str(&text[body_at..]).unwrap_or(Value::Null);
    Resp { status, body }
}

/// The refusal's reason (the message's first word).
fn reason(r: &Resp) -> String {
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(r.body["detail"]["error"], "CommandRefused", "{}", r.body);
    let message = r.body["detail"]["message"].as_str().unwrap();
    message.split(':').next().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_commands_are_all_refused_each_with_its_own_reason() {
    let control = KeyPair::from_seed(&[7; 32]);
    let stranger = KeyPair::from_seed(&[8; 32]);
    let ring = KeyRing::new().with(control.public(), None);
    let mut cfg = VerifierConfig::new(HOST);
    cfg.epoch = EPOCH;
    let verifier = Arc::new(Verifier::new(cfg, ring));
    let signer = Signer::new(control, Duration::from_secs(60));
    let forger = Signer::new(stranger, Duration::from_secs(60));

    let host = host().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(hearth_host::api::serve_checked(
        host.clone(),
        CommandCheck(Some(verifier)),
        listener,
        hearth_listen::Limits::for_this_process(),
        async move {
            let _ = stopped.await;
        },
    ));

    let vm = hearth_types::VmId::new().to_string();
    let path = format!("/v1/vms/{vm}");
    let stop_path = format!("{path}/stop");
    let create =
        serde_json::to_vec(&json!({"image": "busybox", "memory": 256u64 << 20, "fence": 5}))
            .unwrap();
    let sign = |s: &Signer,
                aud: &str,
                epoch: u64,
                subject: &str,
                gen: u64,
                method: &str,
                p: &str,
                body: &[u8]| {
        s.sign(
            aud,
            epoch,
            Some(subject),
            gen,
            &hearth_fence::action(method, p),
            body,
        )
        .unwrap()
    };

    // The good command: the VM boots, for real.
    let good = sign(&signer, HOST, EPOCH, &vm, 5, "PUT", &path, &create);
    let r = send(addr, "PUT", &path, Some(&good), &create).await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["state"], "ready", "{}", r.body);

    let mut refusals: Vec<(&str, Resp)> = Vec::new();
    // Replayed: the same command again.
    refusals.push((
        "replayed",
        send(addr, "PUT", &path, Some(&good), &create).await,
    ));
    // Tampered: one character of the signed header changed.
    let fresh = sign(&signer, HOST, EPOCH, &vm, 5, "POST", &stop_path, b"{}");
    let flip = |token: &str, at: usize| {
        let mut t = token.as_bytes().to_vec();
        t[at] = if t[at] == b'A' { b'B' } else { b'A' };
        String::from_utf8(t).unwrap()
    };
    let dot = fresh.find('.').unwrap();
    let header_tampered = flip(&fresh, 20);
    refusals.push((
        "malformed",
        send(addr, "POST", &stop_path, Some(&header_tampered), b"{}").await,
    ));
    let sig_tampered = flip(&fresh, dot + 10);
    refusals.push((
        "bad_signature",
        send(addr, "POST", &stop_path, Some(&sig_tampered), b"{}").await,
    ));
    // Expired: a window in the past, properly signed.
    let mut old = signer
        .header(
            HOST,
            EPOCH,
            Some(&vm),
            5,
            &hearth_fence::action("POST", &stop_path),
            b"{}",
        )
        .unwrap();
    old.issued_at_ms -= 600_000;
    old.expires_at_ms = old.issued_at_ms + 30_000;
    let expired = signer.seal(&old);
    refusals.push((
        "expired",
        send(addr, "POST", &stop_path, Some(&expired), b"{}").await,
    ));
    // Wrong host.
    let elsewhere = sign(&signer, "host-b", EPOCH, &vm, 5, "POST", &stop_path, b"{}");
    refusals.push((
        "wrong_audience",
        send(addr, "POST", &stop_path, Some(&elsewhere), b"{}").await,
    ));
    // A lease epoch this host no longer holds.
    let stale_epoch = sign(&signer, HOST, EPOCH - 1, &vm, 5, "POST", &stop_path, b"{}");
    refusals.push((
        "stale_epoch",
        send(addr, "POST", &stop_path, Some(&stale_epoch), b"{}").await,
    ));
    // Signed for a stop, sent as a delete.
    let other_action = sign(&signer, HOST, EPOCH, &vm, 5, "POST", &stop_path, b"{}");
    refusals.push((
        "wrong_action",
        send(addr, "DELETE", &path, Some(&other_action), b"{}").await,
    ));
    // Signed for one body, sent with another.
    let body_signed = sign(&signer, HOST, EPOCH, &vm, 5, "POST", &stop_path, b"{}");
    refusals.push((
        "body_mismatch",
        send(
            addr,
            "POST",
            &stop_path,
            Some(&body_signed),
            br#"{"save_memory":true}"#,
        )
        .await,
    ));
    // Signed by a key the host does not trust.
    let forged = sign(&forger, HOST, EPOCH, &vm, 5, "POST", &stop_path, b"{}");
    refusals.push((
        "unknown_key",
        send(addr, "POST", &stop_path, Some(&forged), b"{}").await,
    ));
    // An older placement generation than the host holds.
    let stale = sign(&signer, HOST, EPOCH, &vm, 4, "POST", &stop_path, b"{}");
    refusals.push((
        "stale_generation",
        send(addr, "POST", &stop_path, Some(&stale), b"{}").await,
    ));
    // Signed for another VM.
    let other_vm = hearth_types::VmId::new().to_string();
    let other_path = format!("/v1/vms/{other_vm}/stop");
    let misdirected = sign(&signer, HOST, EPOCH, &vm, 5, "POST", &other_path, b"{}");
    refusals.push((
        "wrong_subject",
        send(addr, "POST", &other_path, Some(&misdirected), b"{}").await,
    ));
    // No command at all.
    refusals.push((
        "missing_command",
        send(addr, "POST", &stop_path, None, b"{}").await,
    ));

    let mut seen = BTreeSet::new();
    for (want, r) in &refusals {
        let got = reason(r);
        println!("{want:>18}: 403 {}", r.body["detail"]["message"]);
        assert_eq!(&got, want, "{}", r.body);
        seen.insert(got);
    }
    assert_eq!(
        seen.len(),
        refusals.len(),
        "every refusal has its own reason"
    );
    println!(
        "{} bad commands, {} refused, 0 accepted",
        refusals.len(),
        refusals.len()
    );

    // None of them touched the VM: it is still ready.
    let look = sign(&signer, HOST, EPOCH, &vm, 5, "GET", &path, b"");
    let r = send(addr, "GET", &path, Some(&look), b"").await;
    assert_eq!(
        (r.status, r.body["state"].as_str()),
        (200, Some("ready")),
        "{}",
        r.body
    );

    // A newer placement generation is accepted and becomes the one held;
    // the old generation is refused from then on.
    let gone = sign(&signer, HOST, EPOCH, &vm, 6, "DELETE", &path, b"");
    assert_eq!(
        send(addr, "DELETE", &path, Some(&gone), b"").await.status,
        204
    );
    let again = sign(&signer, HOST, EPOCH, &vm, 5, "GET", &path, b"");
    assert_eq!(
        reason(&send(addr, "GET", &path, Some(&again), b"").await),
        "stale_generation"
    );

    let _ = stop.send(());
    server.await.unwrap().unwrap();
    host.shutdown().await;
}

/// The whole `HostApi` through `RemoteHost`: signed commands over HTTP and
/// the guest streams over one WebSocket, against a real VM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_host_serves_every_command_and_the_guest_streams() {
    use hearth_hostapi::{CreateVm, HostApi, RemoteHost, Resize, StopVm, VmState};

    let control = KeyPair::from_seed(&[9; 32]);
    let ring = KeyRing::new().with(control.public(), None);
    let mut cfg = VerifierConfig::new(HOST);
    cfg.epoch = EPOCH;
    let verifier = Arc::new(Verifier::new(cfg, ring));
    let host = host().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(hearth_host::api::serve_checked(
        host.clone(),
        CommandCheck(Some(verifier)),
        listener,
        hearth_listen::Limits::for_this_process(),
        async move {
            let _ = stopped.await;
        },
    ));
    let signer = Arc::new(Signer::new(control, Duration::from_secs(60)));
    let remote = RemoteHost::new(format!("http://{addr}"), HOST, EPOCH, Some(signer)).unwrap();

    let id = hearth_types::VmId::new();
    let rec = remote
        .create_vm(CreateVm {
            id: Some(id),
            image: hearth_image::ImageName::Busybox,
            memory: hearth_types::ByteSize::mib(256),
            fence: 1,
            ..CreateVm::default()
        })
        .await
        .expect("create through the remote host");
    assert_eq!(rec.state, VmState::Ready);
    assert!(remote.list_vms().await.unwrap().iter().any(|v| v.id == id));
    assert!(remote.status().await.unwrap().disk_available.bytes() > 0);

    // Exec, files and a large transfer through the relayed guest session.
    let guest = remote.guest(id, 1).await.expect("guest session");
    let out = guest
        .run(common::sh("echo remote; echo err >&2; exit 3"))
        .await
        .unwrap();
    assert_eq!(
        (out.stdout.as_slice(), out.stderr.as_slice(), out.exit_code),
        (&b"remote\n"[..], &b"err\n"[..], Some(3))
    );
    let big: Vec<u8> = (0..8u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let t = std::time::Instant::now();
    guest
        .write_all("/tmp/big", bytes::Bytes::from(big.clone()))
        .await
        .unwrap();
    let back = guest.read_all("/tmp/big").await.unwrap();
    println!("8 MiB up and back through the relay in {:?}", t.elapsed());
    assert!(back == big, "the file came back different");
    // The same session is reused.
    let again = remote.guest(id, 1).await.unwrap();
    assert_eq!(
        again
            .run(common::sh("cat /tmp/big | wc -c"))
            .await
            .unwrap()
            .stdout,
        b"8388608\n"
    );
    // Only the host configures or shuts down its guest.
    assert!(guest.shutdown().await.is_err());

    // Lifecycle: stop, start (a newer generation), delete.
    let rec = remote.stop_vm(id, 1, StopVm::default()).await.unwrap();
    assert_eq!(rec.state, VmState::Stopped);
    let rec = remote.start_vm(id, 2, Resize::default()).await.unwrap();
    assert_eq!((rec.state, rec.fence), (VmState::Ready, 2));
    // The old generation is refused from now on.
    let e = remote.get_vm(id, 1).await.unwrap_err();
    assert_eq!(e.kind, hearth_hostapi::ErrorKind::Refused, "{e}");
    assert!(e.message.starts_with("stale_generation"), "{e}");
    remote.delete_vm(id, 2).await.unwrap();
    let e = remote.get_vm(id, 2).await.unwrap_err();
    assert!(e.is_not_found(), "{e}");

    let _ = stop.send(());
    server.await.unwrap().unwrap();
    host.shutdown().await;
}
