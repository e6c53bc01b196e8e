//! `hearth bench substrate`: the numbers behind docs/benchmarks.md.
//!
//! Everything is measured from the host agent's library API, the way the
//! control plane will use it: cold boot to first exec, exec round trip,
//! file throughput in both directions next to the exec-stdout path, the
//! protocol's own cost over an in-memory pipe, and QEMU's RSS per idle VM.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use hearth_guest_proto::ExecRequest;
use hearth_host::CreateVm;
use hearth_image::ImageName;
use hearth_types::ByteSize;

fn sh(cmd: &str) -> ExecRequest {
    ExecRequest {
        command: cmd.into(),
        ..Default::default()
    }
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn mib_s(bytes: u64, d: Duration) -> String {
    format!(
        "{:.1} MiB/s",
        bytes as f64 / (1 << 20) as f64 / d.as_secs_f64()
    )
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The raw virtio-serial port every bench VM gets besides the agent's.
const RAW_PORT: &str = "hearth.raw";

pub async fn substrate(
    data_dir: PathBuf,
    images: Vec<ImageName>,
    boots: usize,
    execs: usize,
    file_size: ByteSize,
) -> anyhow::Result<()> {
    let mut cfg = hearth_host::HostConfig::new(data_dir);
    cfg.raw_ports = vec![RAW_PORT.to_owned()];
    let host = hearth_host::Host::start(cfg, crate::progress::reporter())
        .await
        .map_err(|e| anyhow::anyhow!(hearth_host::error_chain(&e)))
        .context("start the host agent")?;
    println!("accelerator: {}", host.accel());
    let create = |image| CreateVm {
        image,
        memory: ByteSize::mib(512),
        ..CreateVm::default()
    };

    for &image in &images {
        // Build artifacts outside the timing.
        host.artifacts(image, crate::progress::reporter())
            .await
            .map_err(|e| anyhow::anyhow!(hearth_host::error_chain(&e)))?;
        let mut times = Vec::new();
        for _ in 0..boots {
            let t = Instant::now();
            let vm = host
                .create_vm(create(image))
                .await
                .map_err(|e| anyhow::anyhow!(hearth_host::error_chain(&e)))?;
            let g = vm.guest().context("guest")?;
            let out = g.run(sh("true")).await?;
            anyhow::ensure!(out.exit_code == Some(0), "first exec failed: {out:?}");
            times.push(t.elapsed());
            host.delete(vm.id).await.ok();
        }
        times.sort();
        println!(
            "cold boot to first exec [{image}]: median {} (min {}, max {}, n={boots})",
            ms(pct(&times, 0.5)),
            ms(times[0]),
            ms(times[times.len() - 1])
        );
    }

    let vm = host
        .create_vm(CreateVm {
            image: ImageName::Busybox,
            memory: ByteSize::gib(1),
            ..CreateVm::default()
        })
        .await
        .map_err(|e| anyhow::anyhow!(hearth_host::error_chain(&e)))?;
    let g = vm.guest().context("guest")?;
    let pid = vm.record().pid.unwrap_or(0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!(
        "qemu RSS of an idle busybox VM (1 GiB guest): {} MiB",
        rss_kib(pid) / 1024
    );

    // Exec round trip of `true`.
    let mut lat = Vec::with_capacity(execs);
    for _ in 0..execs {
        let t = Instant::now();
        let out = g.run(sh("true")).await?;
        lat.push(t.elapsed());
        anyhow::ensure!(out.exit_code == Some(0), "exec failed: {out:?}");
    }
    lat.sort();
    println!(
        "exec round trip of `true` (bash -c): p50 {}, p99 {} (n={execs})",
        ms(pct(&lat, 0.5)),
        ms(pct(&lat, 0.99))
    );
    // Protocol-only round trip: a ping through the guest agent's reader.
    let mut pings = Vec::new();
    for _ in 0..execs {
        let t = Instant::now();
        g.ping().await?;
        pings.push(t.elapsed());
    }
    pings.sort();
    println!(
        "held-stream ping round trip: p50 {}, p99 {}",
        ms(pct(&pings, 0.5)),
        ms(pct(&pings, 0.99))
    );

    // File throughput: upload, download, and the same bytes as exec stdout.
    let size = file_size.bytes();
    let chunk = Bytes::from(vec![0x5au8; 1 << 20]);
    let t = Instant::now();
    let mut w = g.write_file("/tmp/bench", None).await?;
    let mut sent = 0;
    while sent < size {
        let n = (size - sent).min(chunk.len() as u64) as usize;
        w.send(chunk.slice(..n)).await?;
        sent += n as u64;
    }
    w.finish().await?;
    let up = t.elapsed();
    let t = Instant::now();
    let mut r = g.read_file("/tmp/bench", 0, None).await?;
    let mut got = 0u64;
    while let Some(c) = r.next_chunk().await? {
        got += c.len() as u64;
    }
    let down = t.elapsed();
    anyhow::ensure!(got == size, "download returned {got} of {size} bytes");
    let t = Instant::now();
    // All of it: `run` keeps at most OUTPUT_CAP (16 MiB) of a command's
    // output, and this measures the channel, not the cap.
    let cap = usize::try_from(size)?;
    let out = g.run_capped(sh("cat /tmp/bench"), cap).await?;
    let cat = t.elapsed();
    anyhow::ensure!(
        out.stdout.len() as u64 == size,
        "cat returned {} bytes",
        out.stdout.len()
    );
    let t = Instant::now();
    let out = g
        .run(sh(&format!(
            "dd if=/tmp/bench of=/dev/null bs=1M 2>/dev/null; echo {size}"
        )))
        .await?;
    let guest_read = t.elapsed();
    anyhow::ensure!(out.exit_code == Some(0), "dd failed");
    let (raw_down, raw_up) = raw_channel(&g, &vm.raw_port_path(RAW_PORT), size).await?;
    println!("upload {file_size}: {}", mib_s(size, up));
    println!(
        "raw channel host -> guest (cat of the bare port into tmpfs): {}",
        mib_s(size, raw_up)
    );
    println!("download {file_size}: {}", mib_s(size, down));
    println!(
        "raw channel guest -> host (cat of the same file into the bare port): {}",
        mib_s(size, raw_down)
    );
    println!("same bytes as exec stdout (cat): {}", mib_s(size, cat));
    println!(
        "guest-only read of the file (dd to /dev/null): {}",
        mib_s(size, guest_read)
    );
    host.delete(vm.id).await.ok();

    // The protocol alone, over an in-memory pipe on the host (no VM).
    let (bytes, took) = protocol_only(size).await?;
    println!(
        "protocol only (mux over an in-memory pipe, host CPU): {}",
        mib_s(bytes, took)
    );
    Ok(())
}

/// The bare channel, measured the way the file transfers are: the same
/// `size` bytes between the same tmpfs file and the host, but through a
/// second virtio-serial port with no protocol, no multiplexer and no guest
/// agent in the data path (a shell pipes the file). Returns (guest → host,
/// host → guest) durations.
async fn raw_channel(
    g: &hearth_host::GuestClient,
    port: &std::path::Path,
    size: u64,
) -> anyhow::Result<(Duration, Duration)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let find = format!(
        "dev=; for p in /sys/class/virtio-ports/*; do \
         [ \"$(cat $p/name)\" = {RAW_PORT} ] && dev=/dev/${{p##*/}}; done; \
         [ -n \"$dev\" ] || {{ echo no raw port >&2; exit 3; }};"
    );

    // Guest -> host: the guest cats the file into the port, the host reads
    // until it has every byte.
    let mut sock = tokio::net::UnixStream::connect(port)
        .await
        .with_context(|| format!("connect {}", port.display()))?;
    let t = Instant::now();
    let send = g.run(sh(&format!("{find} cat /tmp/bench > $dev")));
    let mut buf = vec![0u8; 1 << 20];
    let recv = async {
        let mut got = 0u64;
        while got < size {
            let n = sock.read(&mut buf).await?;
            anyhow::ensure!(n > 0, "raw port closed after {got} of {size} bytes");
            got += n as u64;
        }
        Ok(t.elapsed())
    };
    let (out, down) = tokio::join!(send, recv);
    let down = down?;
    let out = out?;
    anyhow::ensure!(out.exit_code == Some(0), "raw send failed: {out:?}");

    // Host -> guest: the guest reads exactly `size` bytes off the port into
    // tmpfs; done when that command has exited. (The source file goes first:
    // two copies may not fit the guest's tmpfs.)
    g.run(sh("rm -f /tmp/bench")).await?;
    let t = Instant::now();
    let recv = g.run(sh(&format!(
        "{find} cat $dev > /tmp/bench.raw && wc -c < /tmp/bench.raw"
    )));
    let chunk = vec![0x5au8; 1 << 20];
    let send = async {
        let mut sent = 0u64;
        while sent < size {
            let n = (size - sent).min(chunk.len() as u64) as usize;
            sock.write_all(&chunk[..n]).await?;
            sent += n as u64;
        }
        // End of stream: QEMU drains the socket, then tells the guest the
        // host end is gone, and `cat` reads end-of-file.
        sock.shutdown().await?;
        anyhow::Ok(())
    };
    let (out, sent) = tokio::join!(recv, send);
    sent?;
    let out = out?;
    let up = t.elapsed();
    let wrote = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse::<u64>()
        .ok();
    anyhow::ensure!(
        out.exit_code == Some(0) && wrote == Some(size),
        "raw receive failed: {out:?}"
    );
    g.run(sh("rm -f /tmp/bench.raw")).await?;
    Ok((down, up))
}

async fn protocol_only(size: u64) -> anyhow::Result<(u64, Duration)> {
    use hearth_guest_proto::{FrameCodec, Incoming, Mux, Role};
    use tokio_util::codec::{FramedRead, FramedWrite};
    let (a, b) = tokio::io::duplex(1 << 20);
    let (ar, aw) = tokio::io::split(a);
    let (br, bw) = tokio::io::split(b);
    let guest = tokio::spawn(async move {
        let mut r = FramedRead::new(br, FrameCodec);
        let mut w = FramedWrite::new(bw, FrameCodec);
        hearth_guest_proto::guest_handshake(&mut r, &mut w)
            .await
            .ok();
        let (_m, acc) = Mux::start(Role::Guest, r, w);
        let mut acc = acc.expect("guest acceptor");
        if let Some((s, _)) = acc.recv().await {
            let chunk = Bytes::from(vec![1u8; 64 * 1024]);
            let mut sent = 0u64;
            while sent < size {
                let n = (size - sent).min(chunk.len() as u64) as usize;
                if s.send_data(chunk.slice(..n)).await.is_err() {
                    break;
                }
                sent += n as u64;
            }
            let _ = s.send_eof();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let client = hearth_host::GuestClient::handshake(ar, aw, Duration::from_secs(5)).await?;
    let t = Instant::now();
    let mut s = client
        .mux()
        .open(&hearth_guest_proto::Request::Info)
        .await?;
    let mut got = 0u64;
    while let Some(m) = s.recv().await {
        match m {
            Incoming::Data(d) => got += d.len() as u64,
            _ => break,
        }
    }
    let took = t.elapsed();
    guest.abort();
    Ok((got, took))
}
