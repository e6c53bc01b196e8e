//! `hearth bench memory`: what an idle guest that once touched most of its
//! memory costs the host, with and without free page reporting, and how
//! long the host takes to get the memory back. Both runs happen in the same
//! invocation, so the number without reporting is the baseline.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use hearth_guest_proto::ExecRequest;
use hearth_host::{CreateVm, Host, HostConfig};
use hearth_image::ImageName;
use hearth_types::ByteSize;

fn sh(cmd: &str) -> ExecRequest {
    ExecRequest {
        command: cmd.into(),
        ..Default::default()
    }
}

fn rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

fn mib(b: u64) -> String {
    format!("{} MiB", b >> 20)
}

/// A host agent in `<data>/bench-memory/<name>` sharing the main artifacts.
async fn bench_host(data_dir: &Path, name: &str, reporting: bool) -> anyhow::Result<Arc<Host>> {
    let dir = data_dir.join("bench-memory").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    std::os::unix::fs::symlink(data_dir.join("artifacts"), dir.join("artifacts"))
        .context("link the artifacts")?;
    let mut cfg = HostConfig::new(&dir);
    cfg.accel_cache = data_dir.join("accel.json");
    cfg.free_page_reporting = reporting;
    Host::start(cfg, Arc::new(hearth_image::QuietProgress))
        .await
        .map_err(|e| anyhow::anyhow!(hearth_host::error_chain(&e)))
}

pub async fn memory(data_dir: PathBuf, memory: ByteSize) -> anyhow::Result<()> {
    // Build artifacts once, outside the measurement.
    {
        let images = hearth_image::ImageConfig::new(&data_dir);
        tokio::task::spawn_blocking(move || {
            hearth_image::ensure_all(&images, ImageName::Busybox, &hearth_image::StderrProgress)
        })
        .await??;
    }
    let touch = memory.bytes() * 85 / 100;
    println!(
        "guest: busybox, {} of RAM; touches {} (tmpfs), frees it, then idles",
        mib(memory.bytes()),
        mib(touch)
    );
    for (name, reporting) in [("without", false), ("with", true)] {
        let host = bench_host(&data_dir, name, reporting).await?;
        let vm = host
            .create_vm(CreateVm {
                image: ImageName::Busybox,
                memory,
                ..CreateVm::default()
            })
            .await
            .map_err(|e| anyhow::anyhow!(hearth_host::error_chain(&e)))?;
        let g = vm.guest().context("guest")?;
        let pid = vm.record().pid.context("pid")?;
        // Guest RAM is the VMM's anonymous memory: its RSS is the cost.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let idle = rss_bytes(pid);
        let out = g
            .run(sh(&format!(
                "mkdir -p /mnt/t && mount -t tmpfs -o size={}m t /mnt/t && \
                 dd if=/dev/zero of=/mnt/t/f bs=1M count={} 2>/dev/null && echo ok",
                memory.bytes() >> 20,
                touch >> 20
            )))
            .await?;
        anyhow::ensure!(out.stdout == b"ok\n", "touch failed: {out:?}");
        let touched = rss_bytes(pid);
        g.run(sh("rm /mnt/t/f && umount /mnt/t")).await?;
        let freed_at = Instant::now();
        // Sample until the footprint stops moving (or 60 s pass).
        let mut last = (touched, Instant::now());
        let mut settled = None;
        while freed_at.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let now = rss_bytes(pid);
            if now + (8 << 20) < last.0 {
                last = (now, Instant::now());
            } else if last.1.elapsed() > Duration::from_secs(5) {
                settled = Some(last.1.duration_since(freed_at));
                break;
            }
        }
        let after = rss_bytes(pid);
        println!(
            "{name:>7} free page reporting: idle {} RSS | touched {} RSS | \
             after freeing {} RSS, settled {}",
            mib(idle),
            mib(touched),
            mib(after),
            settled.map_or("not within 60 s".into(), |d| format!(
                "{:.1} s after the free",
                d.as_secs_f64()
            )),
        );
        host.delete(vm.id).await.ok();
        host.shutdown().await;
    }
    Ok(())
}
