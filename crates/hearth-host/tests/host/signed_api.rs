//! The host's private API with signed commands: a real host agent, a real
//! VM, and every kind of bad command sent over real HTTP. Every one is
//! refused (`CommandRefused`: 401 without a command, 403 for a command that
//! does not verify), each with its own reason, and the VM the good commands
//! drive is untouched by the bad ones.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::common::{self, every_route, host, request, router_routes, template, Resp, UPGRADE};
use hearth_fence::{KeyPair, KeyRing, Signer, Verifier, VerifierConfig};
use hearth_host::api::Access;
use serde_json::json;

const HOST: &str = "host-a";
const EPOCH: u64 = 3;

/// One HTTP/1.1 request on its own connection, with the command `token`.
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> Resp {
    let headers: Vec<(&str, &str)> = token
        .map(|t| (hearth_fence::HEADER_NAME, t))
        .into_iter()
        .collect();
    request(addr, method, path, &headers, body).await
}

/// The refusal's reason (the message's first word): a 401 when the
/// request carried no command, else a 403.
fn reason(r: &Resp) -> String {
    assert_eq!(r.body["detail"]["error"], "CommandRefused", "{}", r.body);
    let message = r.body["detail"]["message"].as_str().unwrap();
    let reason = message.split(':').next().unwrap().to_owned();
    let want = if reason == "missing_command" {
        401
    } else {
        403
    };
    assert_eq!(r.status, want, "{}", r.body);
    reason
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
    let server = tokio::spawn(hearth_host::api::serve(
        host.clone(),
        Access::Signed(verifier),
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
        println!("{want:>18}: {} {}", r.status, r.body["detail"]["message"]);
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
    use hearth_hostapi::{CreateVm, HostApi, HostCredentials, RemoteHost, Resize, StopVm, VmState};

    let control = KeyPair::from_seed(&[9; 32]);
    let ring = KeyRing::new().with(control.public(), None);
    let mut cfg = VerifierConfig::new(HOST);
    cfg.epoch = EPOCH;
    let verifier = Arc::new(Verifier::new(cfg, ring));
    let host = host().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(hearth_host::api::serve(
        host.clone(),
        Access::Signed(verifier),
        listener,
        hearth_listen::Limits::for_this_process(),
        async move {
            let _ = stopped.await;
        },
    ));
    let signer = Arc::new(Signer::new(control, Duration::from_secs(60)));
    let credentials = HostCredentials::Signed(signer);
    let remote = RemoteHost::new(format!("http://{addr}"), HOST, EPOCH, credentials).unwrap();

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
    // The change feed: whole at first, then only what changed.
    let feed = remote.vm_changes(None).await.unwrap();
    assert!(feed.complete && feed.changed.iter().any(|v| v.id == id));
    let quiet = remote.vm_changes(feed.cursor).await.unwrap();
    assert!(!quiet.complete && quiet.changed.is_empty() && quiet.gone.is_empty());
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
    let stopped = remote.vm_changes(quiet.cursor).await.unwrap();
    assert!(!stopped.complete);
    assert_eq!(stopped.changed, vec![rec.clone()]);
    let rec = remote.start_vm(id, 2, Resize::default()).await.unwrap();
    assert_eq!((rec.state, rec.fence), (VmState::Ready, 2));
    // The old generation is refused from now on.
    let e = remote.get_vm(id, 1).await.unwrap_err();
    assert_eq!(e.kind, hearth_hostapi::ErrorKind::Refused, "{e}");
    assert!(e.message.starts_with("stale_generation"), "{e}");
    remote.delete_vm(id, 2).await.unwrap();
    let e = remote.get_vm(id, 2).await.unwrap_err();
    assert!(e.is_not_found(), "{e}");
    let gone = remote.vm_changes(stopped.cursor).await.unwrap();
    assert_eq!((gone.complete, gone.gone), (false, vec![id]));

    let _ = stop.send(());
    server.await.unwrap().unwrap();
    host.shutdown().await;
}

/// With `--control`, a request without a signed command is a 401 on every
/// route (reads, the guest relay and unknown paths too) and does nothing;
/// a bearer token is no substitute (security review of issue 16, finding 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_host_api_refuses_unsigned_requests_to_every_route() {
    let control = KeyPair::from_seed(&[10; 32]);
    let ring = KeyRing::new().with(control.public(), None);
    let mut cfg = VerifierConfig::new(HOST);
    cfg.epoch = EPOCH;
    let verifier = Arc::new(Verifier::new(cfg, ring));
    let host = host().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(hearth_host::api::serve(
        host.clone(),
        Access::Signed(verifier),
        listener,
        hearth_listen::Limits::for_this_process(),
        async move {
            if stopped.await.is_err() {
                tracing::debug!("the test dropped the stop signal");
            }
        },
    ));

    let vm = hearth_types::VmId::new().to_string();
    let mut routes = every_route(&vm);
    let walked: BTreeSet<(String, String)> = routes
        .iter()
        .map(|(m, p, _)| (m.to_string(), template(p, &vm)))
        .collect();
    let mut served = router_routes();
    served.remove(&("GET".to_owned(), "/healthz".to_owned()));
    assert_eq!(walked, served, "every route is walked");
    routes.push(("GET", "/v1/nothing".into(), vec![]));
    for (method, path, body) in &routes {
        let mut headers: Vec<(&str, &str)> = Vec::new();
        if path.ends_with("/guest") {
            headers.extend(UPGRADE);
        }
        let r = request(addr, method, path, &headers, body).await;
        assert_eq!(reason(&r), "missing_command", "{method} {path}");
        assert!(
            r.head.contains("www-authenticate: hearth-command"),
            "{}",
            r.head
        );
        headers.push((
            "Authorization",
            "Bearer hth_host_not-a-command-at-all-xxxxxxxx",
        ));
        let r = request(addr, method, path, &headers, body).await;
        assert_eq!(reason(&r), "missing_command", "{method} {path}");
        println!("{:>60}: 401 unsigned", format!("{method} {path}"));
    }
    assert!(host.list().is_empty(), "an unsigned request acted");
    let r = request(addr, "GET", "/healthz", &[], b"").await;
    assert_eq!(r.status, 200, "{}", r.body);

    if stop.send(()).is_err() {
        panic!("the server ended early");
    }
    server.await.unwrap().unwrap();
    host.shutdown().await;
}
