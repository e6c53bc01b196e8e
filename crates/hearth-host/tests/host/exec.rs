//! Exec against real microVMs (TCG here): semantics of LangSmith's exec.

use std::time::Duration;

use crate::common::*;
use bytes::Bytes;
use hearth_guest_proto::{ExecErrorType, ExecRequest, OutputChannel, PtySize};
use hearth_host::ExecUpdate;
use hearth_image::ImageName;

/// Re-attaches to a command and returns its last event.
async fn final_event(g: &hearth_host::GuestClient, command_id: &str) -> Option<ExecUpdate> {
    let mut h = g.attach(command_id, 0, 0).await.unwrap();
    let mut last = None;
    while let Some(ev) = h.next().await.unwrap() {
        last = Some(ev);
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busybox_vm_exec_semantics() {
    let host = host().await;
    let (vm, g) = vm(&host, ImageName::Busybox).await;

    let out = g.run(sh("echo hello")).await.unwrap();
    assert_eq!(out.stdout, b"hello\n");
    assert_eq!(out.exit_code, Some(0));

    // Exit codes and stderr kept apart from stdout.
    let out = g.run(sh("echo out; echo err >&2; exit 3")).await.unwrap();
    assert_eq!(
        (out.stdout.as_slice(), out.stderr.as_slice(), out.exit_code),
        (&b"out\n"[..], &b"err\n"[..], Some(3))
    );

    // env, cwd, user.
    let mut req = sh("echo $FOO; pwd; id -u");
    req.env.insert("FOO".into(), "bar baz".into());
    req.cwd = Some("/tmp".into());
    req.user = Some("user".into());
    let out = g.run(req).await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "bar baz\n/tmp\n1000\n"
    );

    // Bad cwd and user are typed errors, not crashes: the request's fault
    // (BadRequest, a 400 on the HTTP transports).
    let mut req = sh("true");
    req.cwd = Some("/nope".into());
    let out = g.run(req).await.unwrap();
    assert_eq!(
        out.error.as_ref().map(|e| e.0),
        Some(ExecErrorType::BadRequest),
        "{out:?}"
    );
    let mut req = sh("true");
    req.user = Some("mallory".into());
    let out = g.run(req).await.unwrap();
    assert_eq!(
        out.error.as_ref().map(|e| e.0),
        Some(ExecErrorType::BadRequest)
    );
    let out = g
        .run(ExecRequest {
            argv: Some(vec!["/no/such/binary".into()]),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        out.error.as_ref().map(|e| e.0),
        Some(ExecErrorType::CommandNotFound)
    );
    // Through a shell, a missing command is exit 127, as in LangSmith.
    let out = g.run(sh("no-such-command-xyz")).await.unwrap();
    assert_eq!(out.exit_code, Some(127));

    // stdin round trip.
    let mut h = g.exec(sh("cat; echo done")).await.unwrap();
    h.control
        .stdin(Bytes::from_static(b"ping\n"))
        .await
        .unwrap();
    h.control.close_stdin().await.unwrap();
    let mut stdout = Vec::new();
    let mut exit = None;
    while let Some(ev) = h.next().await.unwrap() {
        match ev {
            ExecUpdate::Output { data, .. } => stdout.extend_from_slice(&data),
            ExecUpdate::Exit { exit_code, .. } => exit = Some(exit_code),
            _ => {}
        }
    }
    assert_eq!((stdout.as_slice(), exit), (&b"ping\ndone\n"[..], Some(0)));

    // PTY: tty names a pts device; resize is seen by the program.
    let mut req = sh("tty; stty size");
    req.pty = Some(PtySize {
        rows: 30,
        cols: 100,
    });
    let out = g.run(req).await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("/dev/pts/"), "{text}");
    assert!(text.contains("30 100"), "{text}");

    // Timeout kills the whole process group and is reported as such.
    let mut req = sh("sleep 100 & sleep 100; echo never");
    req.timeout_ms = 1500;
    let t = std::time::Instant::now();
    let out = g.run(req).await.unwrap();
    assert_eq!(
        out.error.as_ref().map(|e| e.0),
        Some(ExecErrorType::CommandTimeout),
        "{out:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(10));
    let ps = g
        .run(sh(
            "ps -o pid,args | grep 'sleep 100' | grep -v grep | wc -l",
        ))
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&ps.stdout).trim(),
        "0",
        "process group survived the timeout"
    );

    // Kill ends the command, reported with the signal.
    let mut h = g.exec(sh("sleep 100")).await.unwrap();
    assert!(matches!(
        h.next().await.unwrap(),
        Some(ExecUpdate::Started { .. })
    ));
    h.control.kill(None).await.unwrap();
    let mut last = None;
    while let Some(ev) = h.next().await.unwrap() {
        last = Some(ev);
    }
    assert_eq!(
        last,
        Some(ExecUpdate::Exit {
            exit_code: 137,
            signal: Some(9)
        })
    );

    // A child that keeps stdout open cannot hold the stream: exit still arrives.
    let t = std::time::Instant::now();
    let out = g.run(sh("sleep 30 & echo started")).await.unwrap();
    assert_eq!(
        (out.stdout.as_slice(), out.exit_code),
        (&b"started\n"[..], Some(0))
    );
    assert!(t.elapsed() < Duration::from_secs(10));

    // kill_on_disconnect: the command dies when its client goes away;
    // idle_timeout: a command nobody is attached to is killed after it.
    let killed = Some(ExecUpdate::Exit {
        exit_code: 137,
        signal: Some(9),
    });
    let mut kod = sh("sleep 1000");
    kod.kill_on_disconnect = true;
    let mut idle = sh("sleep 1000");
    idle.idle_timeout_ms = 1000;
    for (id, mut req, wait) in [("kod", kod, 0), ("idle", idle, 2500)] {
        req.command_id = Some(id.into());
        let mut h = g.exec(req).await.unwrap();
        assert!(matches!(
            h.next().await.unwrap(),
            Some(ExecUpdate::Started { .. })
        ));
        h.control.detach();
        drop(h);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        assert_eq!(final_event(&g, id).await, killed, "{id}");
    }

    // ttl: a finished command is forgotten after its ttl (SessionExpired).
    let mut req = sh("echo short");
    req.ttl_ms = 300;
    req.command_id = Some("ttl".into());
    assert_eq!(g.run(req).await.unwrap().stdout, b"short\n");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let mut h = g.attach("ttl", 0, 0).await.unwrap();
    match h.next().await.unwrap() {
        Some(ExecUpdate::Error { error_type, .. }) => {
            assert_eq!(error_type, ExecErrorType::SessionExpired)
        }
        other => panic!("{other:?}"),
    }

    // PID 1 reaps orphans: no zombies are left behind.
    let out = g
        .run(sh("for i in 1 2 3 4 5; do (sleep 0.1 &); done; sleep 1; ps -o stat | grep -c '^Z' || true"))
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "0",
        "zombies: {out:?}"
    );

    // Files: mkdir, stat, list, remove.
    g.mkdir("/root/d/e", true).await.unwrap();
    g.write_all("/root/d/e/f.txt", Bytes::from_static(b"12345"))
        .await
        .unwrap();
    let st = g.stat("/root/d/e/f.txt").await.unwrap();
    assert_eq!((st.size, st.kind), (5, hearth_guest_proto::FileKind::File));
    let names: Vec<String> = g
        .list("/root/d/e")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["f.txt"]);
    assert_eq!(
        g.remove("/root/d", false).await.unwrap_err().op_kind(),
        Some(hearth_guest_proto::OpErrorKind::DirectoryNotEmpty)
    );
    g.remove("/root/d", true).await.unwrap();
    assert_eq!(
        g.stat("/root/d").await.unwrap_err().op_kind(),
        Some(hearth_guest_proto::OpErrorKind::NotFound)
    );
    // Writing onto a directory is refused with the guest's reason.
    assert_eq!(
        g.write_all("/root", Bytes::from(vec![0u8; 1 << 20]))
            .await
            .unwrap_err()
            .op_kind(),
        Some(hearth_guest_proto::OpErrorKind::IsADirectory)
    );

    let info = g.info().await.unwrap();
    assert!(info.kernel_release.contains("cloud-amd64"), "{info:?}");
    host.delete(vm.id).await.unwrap();
    let _ = OutputChannel::Stdout;
}
