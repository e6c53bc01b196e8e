//! Bulk data over the held stream of a real microVM: big outputs, big files,
//! concurrency under a bulk transfer, and reconnect with replay. Three
//! tests, each with a VM of its own, so they run side by side (this module
//! sorts first, so they start first).

use std::time::{Duration, Instant};

use crate::common::*;
use bytes::Bytes;
use hearth_guest_proto::{OpErrorKind, OutputChannel};
use hearth_host::{CreateVm, ExecUpdate};
use hearth_image::ImageName;
use hearth_types::ByteSize;

fn pseudo_random(len: usize, mut seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        out.extend_from_slice(&seed.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A host with one busybox VM of 1 GiB.
async fn busybox() -> (
    std::sync::Arc<hearth_host::Host>,
    hearth_types::VmId,
    hearth_host::GuestClient,
) {
    let host = host().await;
    let vm = host
        .create_vm(CreateVm {
            image: ImageName::Busybox,
            memory: ByteSize::gib(1),
            ..CreateVm::default()
        })
        .await
        .unwrap();
    let g = vm.guest().unwrap();
    (host, vm.id, g)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_stdout_arrives_complete_and_in_order() {
    let (host, id, g) = busybox().await;
    // 101 MB of stdout from one command arrives complete and in order:
    // past the default cap, so collected with a larger one. The guest
    // `cat`s a file of pseudo-random bytes the host wrote (any reordered,
    // lost or repeated chunk shows); generating output in the guest costs
    // more than sending it (busybox `seq` to 101 MB took 51 s under TCG).
    let data = pseudo_random(101 << 20, 11);
    let mut w = g.write_file("/tmp/out", None).await.unwrap();
    for chunk in data.chunks(1 << 20) {
        w.send(Bytes::copy_from_slice(chunk)).await.unwrap();
    }
    assert_eq!(w.finish().await.unwrap(), data.len() as u64);
    let t = Instant::now();
    let out = g.run_capped(sh("cat /tmp/out"), 256 << 20).await.unwrap();
    let elapsed = t.elapsed();
    assert!(!out.truncated);
    assert_eq!(out.exit_code, Some(0));
    assert_eq!(out.stdout.len(), data.len());
    assert!(
        out.stdout == data,
        "101 MB of stdout differs from the file the guest printed"
    );
    eprintln!("cat: {} MiB in {elapsed:?}", out.stdout.len() >> 20);
    host.delete(id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_files_round_trip_and_execs_never_stall_behind_a_download() {
    let (host, id, g) = busybox().await;
    // Upload then download 256 MiB; checksums match.
    let data = pseudo_random(256 << 20, 7);
    let sum = blake3::hash(&data);
    let t = Instant::now();
    let mut w = g.write_file("/tmp/big", None).await.unwrap();
    for chunk in data.chunks(1 << 20) {
        w.send(Bytes::copy_from_slice(chunk)).await.unwrap();
    }
    assert_eq!(w.finish().await.unwrap(), 256 << 20);
    eprintln!("upload 256 MiB: {:?}", t.elapsed());
    let t = Instant::now();
    let back = g.read_all("/tmp/big").await.unwrap();
    eprintln!("download 256 MiB: {:?}", t.elapsed());
    assert_eq!(blake3::hash(&back), sum);
    drop(back);

    // A byte range.
    let mut r = g.read_file("/tmp/big", 1000, Some(10)).await.unwrap();
    assert_eq!((r.size, r.length), (256 << 20, 10));
    let chunk = r.next_chunk().await.unwrap().unwrap();
    assert_eq!(&chunk[..], &data[1000..1010]);
    assert!(r.next_chunk().await.unwrap().is_none());

    // Missing file: a clear not-found error.
    let err = g.read_all("/tmp/nope").await.err().unwrap();
    assert_eq!(err.op_kind(), Some(OpErrorKind::NotFound), "{err}");

    // 20 concurrent execs while a 256 MiB download runs: all correct, none stalls.
    let g2 = g.clone();
    let download = tokio::spawn(async move {
        let t = Instant::now();
        let mut r = g2.read_file("/tmp/big", 0, None).await.unwrap();
        let mut h = blake3::Hasher::new();
        let mut slow_reader_pause = true;
        while let Some(c) = r.next_chunk().await.unwrap() {
            h.update(&c);
            if slow_reader_pause {
                // The downloader is slow at first: its window fills up.
                tokio::time::sleep(Duration::from_millis(500)).await;
                slow_reader_pause = false;
            }
        }
        (h.finalize(), t.elapsed())
    });
    let t = Instant::now();
    let execs = (0..20u32).map(|i| {
        let g = g.clone();
        async move {
            let t = Instant::now();
            let out = g.run(sh(&format!("echo $(({i} * {i}))"))).await.unwrap();
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                (i * i).to_string()
            );
            t.elapsed()
        }
    });
    let latencies = futures_util::future::join_all(execs).await;
    let execs_took = t.elapsed();
    let (dsum, dtook) = download.await.unwrap();
    assert_eq!(dsum, sum);
    let worst = latencies.iter().max().unwrap();
    eprintln!(
        "20 execs during download: all done in {execs_took:?}, worst {worst:?}; download {dtook:?}"
    );
    assert!(
        *worst < Duration::from_secs(30),
        "an exec stalled behind the download"
    );
    host.delete(id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_exec_reattaches_with_offsets_and_gets_exactly_the_missing_bytes() {
    let (host, id, g) = busybox().await;
    // Reconnect: drop the client mid-stream, re-attach with offsets, and
    // receive exactly the missing bytes.
    let mut req = sh("for i in $(seq 1 40); do echo line$i; echo err$i >&2; sleep 0.05; done");
    req.command_id = Some("replay-1".into());
    let mut h = g.exec(req).await.unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    while out.len() < 30 {
        match h.next().await.unwrap().unwrap() {
            ExecUpdate::Output {
                channel: OutputChannel::Stdout,
                offset,
                data,
            } => {
                assert_eq!(offset, out.len() as u64);
                out.extend_from_slice(&data);
            }
            ExecUpdate::Output {
                channel: OutputChannel::Stderr,
                offset,
                data,
            } => {
                assert_eq!(offset, err.len() as u64);
                err.extend_from_slice(&data);
            }
            _ => {}
        }
    }
    h.control.detach();
    drop(h);
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut h = g
        .attach("replay-1", out.len() as u64, err.len() as u64)
        .await
        .unwrap();
    let mut exit = None;
    while let Some(ev) = h.next().await.unwrap() {
        match ev {
            ExecUpdate::Output {
                channel: OutputChannel::Stdout,
                offset,
                data,
            } => {
                assert_eq!(offset, out.len() as u64, "gap or duplicate on stdout");
                out.extend_from_slice(&data);
            }
            ExecUpdate::Output {
                channel: OutputChannel::Stderr,
                offset,
                data,
            } => {
                assert_eq!(offset, err.len() as u64, "gap or duplicate on stderr");
                err.extend_from_slice(&data);
            }
            ExecUpdate::Exit { exit_code, .. } => exit = Some(exit_code),
            ExecUpdate::Started { command_id, .. } => assert_eq!(command_id, "replay-1"),
            ExecUpdate::Error { message, .. } => panic!("{message}"),
        }
    }
    let want_out: String = (1..=40).map(|i| format!("line{i}\n")).collect();
    let want_err: String = (1..=40).map(|i| format!("err{i}\n")).collect();
    assert_eq!(String::from_utf8_lossy(&out), want_out);
    assert_eq!(String::from_utf8_lossy(&err), want_err);
    assert_eq!(exit, Some(0));

    // Executing again with the same command_id attaches instead of re-running.
    let mut req = sh("echo should-not-run");
    req.command_id = Some("replay-1".into());
    let again = g.run(req).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&again.stdout), want_out);

    // Reconnecting to an id that never existed is CommandNotFound.
    let mut h = g.attach("no-such-id", 0, 0).await.unwrap();
    match h.next().await.unwrap() {
        Some(ExecUpdate::Error { error_type, .. }) => {
            assert_eq!(
                error_type,
                hearth_guest_proto::ExecErrorType::CommandNotFound
            )
        }
        other => panic!("{other:?}"),
    }
    host.delete(id).await.unwrap();
}
