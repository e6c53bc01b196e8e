//! Real QEMU guests under TCG: boot, console, agent channel and a raw port, disks, pause and
//! resume, stop, kill, an external `kill -9`, and the accelerator probe.
//!
//! Every VM is killed by PID through its handle; a VM a failed test leaves
//! behind dies with the test thread (PR_SET_PDEATHSIG).

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common::{
    fixture, initramfs, module, skip_missing, small_spec, wait_for_text, Fixture, TestDirs,
};
use hearth_types::VmId;
use hearth_vmm::accel::{run_probe_guest, DEFAULT_PROBE_DEADLINE, PROBE_MARKER};
use hearth_vmm::qemu::cmdline::RunFiles;
use hearth_vmm::{
    probe_accel, Accel, DiskFormat, DiskSpec, ProbeOutcome, Qemu, QemuConfig, VmInstance, Vmm,
    VmmError,
};
use tokio::io::AsyncBufReadExt;

/// TCG boots are CPU-bound and this machine may have 2 cores: one VM at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const MARKER: &str = "HEARTH_TEST_MARKER";
/// Generous: a TCG boot takes ~2.5 s alone, more on a loaded machine.
const BOOT_TIMEOUT: Duration = Duration::from_secs(60);

/// Prints the marker and sleeps.
fn sleeper_initrd() -> Option<PathBuf> {
    let init =
        format!("#!/bin/busybox sh\n/bin/busybox echo {MARKER}\nexec /bin/busybox sleep 1000\n");
    match initramfs("sleeper", &init, &[]) {
        Ok(p) => Some(p),
        Err(e) => {
            skip_missing(&format!("cannot build the initramfs: {e}"));
            None
        }
    }
}

/// Loads the virtio modules, reports disk sizes and the port name on the
/// console, greets the host on the agent port and on the raw port
/// `hearth.raw`, then sleeps.
fn devices_initrd(fx: &Fixture) -> Option<PathBuf> {
    let names = [
        "virtio",
        "virtio_ring",
        "virtio_mmio",
        "virtio_blk",
        "virtio_console",
    ];
    let mut extra = Vec::new();
    for n in names {
        let Some(path) = module(&fx.kernel_root, n) else {
            skip_missing(&format!("module {n}.ko not in the kernel package"));
            return None;
        };
        extra.push((format!("lib/modules/{n}.ko"), path));
    }
    let init = format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in {mods}; do insmod /lib/modules/$m.ko || echo "INSMOD_FAIL $m"; done
# Ports are named vport<virtio index>p<n>; find ours by name, as the agent must.
port=
raw=
for i in $(seq 50); do
  for p in /sys/class/virtio-ports/*; do
    [ "$(cat $p/name 2>/dev/null)" = hearth.agent ] && port=/dev/${{p##*/}}
    [ "$(cat $p/name 2>/dev/null)" = hearth.raw ] && raw=/dev/${{p##*/}}
  done
  [ -n "$port" ] && [ -n "$raw" ] && [ -e /sys/block/vdb ] && break; sleep 0.1
done
echo "DISKS vda=$(cat /sys/block/vda/size) vdb=$(cat /sys/block/vdb/size) vdb_ro=$(cat /sys/block/vdb/ro)"
echo "PORT $port"
echo {MARKER}
exec 3<>$port
echo hello-from-guest >&3
exec 4<>$raw
echo hello-raw >&4
exec sleep 1000
"#,
        mods = names.join(" ")
    );
    match initramfs("devices", &init, &extra) {
        Ok(p) => Some(p),
        Err(e) => {
            skip_missing(&format!("cannot build the initramfs: {e}"));
            None
        }
    }
}

fn tcg() -> Qemu {
    Qemu::new(QemuConfig {
        accel: Accel::Tcg,
        ..QemuConfig::default()
    })
}

fn make_disk(path: &std::path::Path, size: u64) {
    let f = std::fs::File::create(path).expect("create disk");
    f.set_len(size).expect("size disk");
}

#[tokio::test]
async fn boot_console_channel_pause_resume_kill() {
    let Some(fx) = fixture() else { return };
    let Some(initrd) = devices_initrd(&fx) else {
        return;
    };
    let _one = SERIAL.lock().await;

    let id = VmId::new();
    let dirs = TestDirs::new(id);
    let mut spec = small_spec(id, &fx.kernel, &initrd, &dirs);
    spec.cmdline.push("hearth.test=1".to_owned());
    spec.raw_ports = vec!["hearth.raw".to_owned()];
    let (d0, d1) = (dirs.run_dir.join("d0.img"), dirs.run_dir.join("d1.img"));
    make_disk(&d0, 1 << 20);
    make_disk(&d1, 2 << 20);
    spec.disks = vec![
        DiskSpec::file(d0, DiskFormat::Raw),
        DiskSpec::file(d1, DiskFormat::Raw).with_read_only(true),
    ];

    let t0 = Instant::now();
    let vm = tcg().boot(&spec).await.expect("boot");
    eprintln!("qemu spawn -> qmp ready: {:?}", vm.ready_in());

    // The restart-recovery contract: the VM's name is in its command line.
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", vm.pid())).expect("read cmdline");
    let needle = format!("hearth-vm-{id}");
    assert!(
        cmdline
            .windows(needle.len())
            .any(|w| w == needle.as_bytes()),
        "{needle} not in /proc/pid/cmdline"
    );
    let pid_file = std::fs::read_to_string(dirs.run_dir.join("qemu.pid")).expect("pid file");
    assert_eq!(pid_file.trim(), vm.pid().to_string());

    // Connect to the agent port before the guest writes to it.
    let agent = tokio::net::UnixStream::connect(vm.channel_path())
        .await
        .expect("connect agent socket");
    let raw_path = RunFiles::raw_port(&spec.run_dir, "hearth.raw");
    let raw = tokio::net::UnixStream::connect(&raw_path)
        .await
        .expect("connect raw port socket");

    let console = wait_for_text(vm.console_log(), MARKER, BOOT_TIMEOUT).await;
    let console = console.unwrap_or_else(|| {
        let text = std::fs::read_to_string(vm.console_log()).unwrap_or_default();
        panic!("no marker within {BOOT_TIMEOUT:?}; console:\n{text}")
    });
    eprintln!("qemu spawn -> console marker (TCG): {:?}", t0.elapsed());
    assert!(!console.contains("INSMOD_FAIL"), "console:\n{console}");
    // 512-byte sectors: the first disk is vda, and the read-only one is ro.
    assert!(
        console.contains("DISKS vda=2048 vdb=4096 vdb_ro=1"),
        "console:\n{console}"
    );
    assert!(console.contains("PORT /dev/vport"), "console:\n{console}");

    let mut lines = tokio::io::BufReader::new(agent).lines();
    let hello = tokio::time::timeout(Duration::from_secs(10), lines.next_line()).await;
    assert_eq!(
        hello.ok().and_then(Result::ok).flatten().as_deref(),
        Some("hello-from-guest")
    );
    let mut lines = tokio::io::BufReader::new(raw).lines();
    let hello = tokio::time::timeout(Duration::from_secs(10), lines.next_line()).await;
    assert_eq!(
        hello.ok().and_then(Result::ok).flatten().as_deref(),
        Some("hello-raw")
    );

    let status = vm.query_status().await.expect("query-status");
    assert_eq!((status.status.as_str(), status.running), ("running", true));
    vm.pause().await.expect("pause");
    let status = vm.query_status().await.expect("query-status");
    assert_eq!((status.status.as_str(), status.running), ("paused", false));
    vm.resume().await.expect("resume");
    let status = vm.query_status().await.expect("query-status");
    assert_eq!((status.status.as_str(), status.running), ("running", true));

    let t = Instant::now();
    vm.kill().await.expect("kill");
    let exit = vm.wait_exit().await;
    eprintln!("kill -> exit observed: {:?}", t.elapsed());
    assert_eq!(exit.signal, Some(9), "{exit:?}");
    assert_eq!(exit.code, None);
    // Resolves again, for any caller.
    assert_eq!(vm.wait_exit().await, exit);
    // Stopping a dead VM is fine; QMP on it is an error, not a hang.
    vm.stop(Duration::from_secs(1))
        .await
        .expect("stop after exit");
    assert!(vm.pause().await.is_err());
}

#[tokio::test]
async fn external_sigkill_is_noticed_quickly() {
    let Some(fx) = fixture() else { return };
    let Some(initrd) = sleeper_initrd() else {
        return;
    };
    let _one = SERIAL.lock().await;

    let id = VmId::new();
    let dirs = TestDirs::new(id);
    // A stale memory file from an earlier VM is replaced, not reused.
    std::fs::write(&dirs.mem_path, b"stale guest memory").expect("stale mem file");
    let stale_ino = std::fs::metadata(&dirs.mem_path).expect("stat").ino();
    let vm = tcg()
        .boot(&small_spec(id, &fx.kernel, &initrd, &dirs))
        .await
        .expect("boot");
    let mem = std::fs::metadata(&dirs.mem_path).expect("stat mem file");
    assert_ne!(mem.ino(), stale_ino);
    assert_eq!(mem.len(), 128 << 20);
    let waiter = vm.wait_exit();

    // Someone else kills QEMU by PID.
    let t = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-9", &vm.pid().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    let exit = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("wait_exit did not resolve within 2 s of kill -9");
    eprintln!("external kill -9 -> wait_exit: {:?}", t.elapsed());
    assert_eq!(exit.signal, Some(9));
}

#[tokio::test]
async fn stop_quits_through_qmp() {
    let Some(fx) = fixture() else { return };
    let Some(initrd) = sleeper_initrd() else {
        return;
    };
    let _one = SERIAL.lock().await;

    let id = VmId::new();
    let dirs = TestDirs::new(id);
    let vm = tcg()
        .boot(&small_spec(id, &fx.kernel, &initrd, &dirs))
        .await
        .expect("boot");
    // Stop while the guest is still booting.
    let t = Instant::now();
    vm.stop(Duration::from_secs(5)).await.expect("stop");
    eprintln!("stop (qmp quit) -> exit: {:?}", t.elapsed());
    let exit = vm.exit_info().expect("exited after stop");
    assert_eq!(exit.code, Some(0), "quit is a clean exit: {exit:?}");
}

#[tokio::test]
async fn failed_start_reports_qemu_log() {
    let Some(_fx) = fixture() else { return };
    let Some(initrd) = sleeper_initrd() else {
        return;
    };
    let id = VmId::new();
    let dirs = TestDirs::new(id);
    let missing = dirs.run_dir.join("no-such-kernel");
    let spec = small_spec(id, &missing, &initrd, &dirs);
    match tcg().boot(&spec).await {
        Err(VmmError::EarlyExit { exit, log_tail, .. }) => {
            assert_eq!(exit.code, Some(1), "{exit:?}");
            assert!(log_tail.contains("no-such-kernel"), "{log_tail}");
        }
        other => panic!("expected EarlyExit, got {other:?}"),
    }
}

#[tokio::test]
async fn missing_binary_is_a_spawn_error() {
    let id = VmId::new();
    let dirs = TestDirs::new(id);
    let spec = small_spec(id, "/k".as_ref(), "/i".as_ref(), &dirs);
    let qemu = Qemu::new(QemuConfig {
        binary: "/nonexistent/qemu".into(),
        tsc_khz: Some(1_000_000),
        ..QemuConfig::default()
    });
    let got = qemu.boot(&spec).await;
    assert!(matches!(got, Err(VmmError::Spawn { .. })), "{got:?}");
}

/// The probe's guest really prints the marker when the accelerator works,
/// so a TCG answer from the probe means KVM failed, not the probe.
#[tokio::test]
async fn probe_guest_prints_marker_under_tcg() {
    let Some(fx) = fixture() else { return };
    let Some(initrd) = probe_initrd() else { return };
    let _one = SERIAL.lock().await;
    let cfg = QemuConfig {
        accel: Accel::Tcg,
        ..QemuConfig::default()
    };
    let outcome = run_probe_guest(cfg, &fx.kernel, &initrd, Duration::from_secs(60)).await;
    eprintln!("probe guest under TCG: {outcome}");
    assert!(matches!(outcome, ProbeOutcome::Booted { .. }), "{outcome}");
}

/// A guest that never prints the marker (how nested KVM hangs) costs the
/// deadline and no more.
#[tokio::test]
async fn probe_silence_is_bounded_by_the_deadline() {
    let Some(fx) = fixture() else { return };
    let Some(initrd) = sleeper_initrd() else {
        return;
    };
    let _one = SERIAL.lock().await;
    let deadline = Duration::from_secs(2);
    let t = Instant::now();
    let outcome = run_probe_guest(QemuConfig::default(), &fx.kernel, &initrd, deadline).await;
    eprintln!("silent probe guest: {outcome} in {:?}", t.elapsed());
    assert!(matches!(outcome, ProbeOutcome::Silent { .. }), "{outcome}");
    assert!(
        t.elapsed() < deadline + Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
}

#[tokio::test]
async fn probe_answers_tcg_here_and_caches() {
    let Some(fx) = fixture() else { return };
    let Some(initrd) = probe_initrd() else { return };
    if std::env::var_os(hearth_vmm::accel::ACCEL_ENV).is_some() {
        eprintln!("SKIP: {} is set", hearth_vmm::accel::ACCEL_ENV);
        return;
    }
    let _one = SERIAL.lock().await;
    let dirs = TestDirs::new(VmId::new());
    let cache = dirs.run_dir.join("accel.json");
    let binary = PathBuf::from("qemu-system-x86_64");
    let deadline = DEFAULT_PROBE_DEADLINE;

    let t = Instant::now();
    let accel = probe_accel(&binary, &fx.kernel, &initrd, &cache, deadline).await;
    let first = t.elapsed();
    let cached = std::fs::read_to_string(&cache).unwrap_or_default();
    eprintln!("probe: {accel} in {first:?}; cache: {cached}");
    // On a host where KVM really works this test does not apply.
    if accel == Accel::Kvm {
        eprintln!("SKIP: KVM works on this host");
        return;
    }
    assert!(
        first <= deadline + Duration::from_secs(2),
        "probe took {first:?}"
    );
    assert!(cached.contains("\"accel\": \"tcg\""), "{cached}");

    let t = Instant::now();
    let again = probe_accel(&binary, &fx.kernel, &initrd, &cache, deadline).await;
    eprintln!("probe from cache: {again} in {:?}", t.elapsed());
    assert_eq!(again, Accel::Tcg);
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "cached answer took {:?}",
        t.elapsed()
    );
}

fn probe_initrd() -> Option<PathBuf> {
    let init =
        format!("#!/bin/busybox sh\n/bin/busybox echo {PROBE_MARKER}\n/bin/busybox poweroff -f\n");
    match initramfs("probe", &init, &[]) {
        Ok(p) => Some(p),
        Err(e) => {
            skip_missing(&format!("cannot build the initramfs: {e}"));
            None
        }
    }
}
