//! Real QEMU guests under TCG saved and restored: a guest process counting
//! in memory keeps its PID and its count, the device state is small, many
//! VMs restore copy-on-write from one memory file, an NBD disk may be served
//! from another socket after a restore, and a bad state file fails fast.
//!
//! The guest is a busybox shell: `/init` fills 40 MiB of tmpfs with random
//! bytes (RAM the guest dirtied), then runs a counter in its own process
//! (`COUNT <pid> <n>` on the console every 0.2 s, also written to the first
//! disk when there is one) and checks the fill's md5 every 3 s (`MD5 …`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::common::{fixture, initramfs, module, skip_missing, small_spec, Fixture, TestDirs};
use hearth_types::{ByteSize, VmId};
use hearth_vmm::{
    Accel, DiskSpec, Qemu, QemuConfig, QemuInstance, RestoreFrom, RestoreMemory, VmInstance,
    VmSpec, Vmm, VmmError,
};

/// TCG is CPU-bound and this machine may have 2 cores: one test at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const WAIT: Duration = Duration::from_secs(90);
const MEMORY: ByteSize = ByteSize::mib(256);
const FILL_MIB: u32 = 40;

fn counter_initrd(fx: &Fixture) -> Option<PathBuf> {
    let names = ["virtio", "virtio_ring", "virtio_mmio", "virtio_blk"];
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
dd if=/dev/urandom of=/fill bs=1M count={FILL_MIB} 2>/dev/null
echo "FILL $(md5sum < /fill)"
sh -c 'i=0; while :; do i=$((i+1)); echo "COUNT $$ $i"; [ -b /dev/vda ] && echo "COUNT $$ $i" | dd of=/dev/vda conv=notrunc,fsync 2>/dev/null; sleep 0.2; done' &
while :; do sleep 3; echo "MD5 $(md5sum < /fill)"; done
"#,
        mods = names.join(" ")
    );
    match initramfs("counter", &init, &extra) {
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

fn spec(id: VmId, fx: &Fixture, initrd: &Path, dirs: &TestDirs) -> VmSpec {
    let mut spec = small_spec(id, &fx.kernel, initrd, dirs);
    spec.memory = MEMORY;
    spec
}

/// `(pid, n)` of every `COUNT` line, in order.
fn counts(text: &str) -> Vec<(u32, u64)> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            match (w.next(), w.next(), w.next(), w.next()) {
                (Some("COUNT"), Some(pid), Some(n), None) => {
                    Some((pid.parse().ok()?, n.parse().ok()?))
                }
                _ => None,
            }
        })
        .collect()
}

/// The md5 of every line starting with `tag` (`FILL ` or `MD5 `).
fn sums(text: &str, tag: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix(tag))
        .filter_map(|rest| rest.split_whitespace().next().map(str::to_owned))
        .collect()
}

fn console(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The console of a saved VM up to its last full line: a line the guest
/// was printing when it stopped ends after the restore.
fn saved_console(path: &Path) -> String {
    let mut text = console(path);
    text.truncate(text.rfind('\n').map_or(0, |i| i + 1));
    text
}

/// Polls `path` until `done(text)` or [`WAIT`]; panics with the console.
async fn wait_until(path: &Path, what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let text = console(path);
        if done(&text) {
            return text;
        }
        if Instant::now() >= deadline {
            panic!("{what}: not within {WAIT:?}; console:\n{text}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Boots the counter guest and waits until it has filled its memory,
/// checked it once and counted a few times. Returns the fill's md5.
async fn boot_counting(qemu: &Qemu, spec: &VmSpec) -> (QemuInstance, String) {
    let t = Instant::now();
    let vm = qemu.boot(spec).await.expect("boot");
    let text = wait_until(vm.console_log(), "counting guest", |t| {
        !sums(t, "MD5 ").is_empty() && counts(t).len() >= 3
    })
    .await;
    assert!(!text.contains("INSMOD_FAIL"), "console:\n{text}");
    let fill = sums(&text, "FILL ").pop().expect("FILL line");
    assert_eq!(sums(&text, "MD5 ")[0], fill, "console:\n{text}");
    eprintln!(
        "boot -> filled {FILL_MIB} MiB and counting: {:?}",
        t.elapsed()
    );
    (vm, fill)
}

/// Checks a restored console: the counter has the saved PID and goes on
/// from `last + 1` (every step +1, never back to 1), reaching `last + 5`,
/// and the fill's md5 is unchanged. `after` is the console length at save
/// time (0 for a fresh console).
async fn assert_continues(log: &Path, after: usize, pid: u32, last: u64, fill: &str) {
    let text = wait_until(log, "counter after restore", |t| {
        let new = t.get(after..).unwrap_or("");
        counts(new).last().is_some_and(|&(_, n)| n >= last + 5) && !sums(new, "MD5 ").is_empty()
    })
    .await;
    let new = &text[after..];
    let seen = counts(new);
    assert!(seen.iter().all(|&(p, _)| p == pid), "pid changed: {seen:?}");
    assert_eq!(seen[0].1, last + 1, "count did not continue: {seen:?}");
    assert!(seen.windows(2).all(|w| w[1].1 == w[0].1 + 1), "{seen:?}");
    assert!(
        sums(new, "MD5 ").iter().all(|s| s == fill),
        "memory changed:\n{new}"
    );
}

/// A `qemu-nbd` serving `file` as export `disk` on `socket`, killed on drop.
struct NbdServer(Child);

impl NbdServer {
    fn start(file: &Path, socket: &Path) -> Option<Self> {
        let child = Command::new("qemu-nbd")
            .args([
                "--persistent",
                "--format=raw",
                "--export-name=disk",
                "--socket",
            ])
            .arg(socket)
            .arg(file)
            .spawn();
        let child = match child {
            Ok(c) => Self(c),
            Err(e) => {
                skip_missing(&format!("cannot run qemu-nbd: {e}"));
                return None;
            }
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "qemu-nbd made no socket");
            std::thread::sleep(Duration::from_millis(10));
        }
        Some(child)
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn save_and_restore_keep_the_counting_process() {
    let Some(fx) = fixture() else { return };
    let Some(initrd) = counter_initrd(&fx) else {
        return;
    };
    let _one = SERIAL.lock().await;
    let qemu = tcg();
    let id = VmId::new();
    let dirs = TestDirs::new(id);

    // The root disk is an NBD export; the restore reaches the same disk
    // through another socket (another server process).
    let disk = dirs.run_dir.join("disk.raw");
    std::fs::File::create(&disk)
        .and_then(|f| f.set_len(1 << 20))
        .expect("disk file");
    let sock1 = dirs.run_dir.join("nbd1.sock");
    let Some(server1) = NbdServer::start(&disk, &sock1) else {
        return;
    };
    let mut spec = spec(id, &fx, &initrd, &dirs);
    spec.disks = vec![DiskSpec::nbd(&sock1, "disk")];

    let (vm, fill) = boot_counting(&qemu, &spec).await;
    let state = dirs.run_dir.join("state");
    let t = Instant::now();
    let saved = vm.save(&state).await.expect("save");
    let save_s = t.elapsed();
    let exit = vm.exit_info().expect("qemu quit after the save");
    assert_eq!(exit.code, Some(0), "{exit:?}");
    let before = saved_console(vm.console_log());
    let &(pid, last) = counts(&before).last().expect("counted before save");
    eprintln!(
        "save: {:.3} s; state {} bytes; memory {} ({} allocated); counter pid {pid} at {last}",
        save_s.as_secs_f64(),
        saved.state_size.bytes(),
        saved.memory_size,
        saved.memory_allocated
    );
    assert_eq!(saved.state, state);
    assert_eq!(saved.memory.as_ref(), Some(&dirs.mem_path));
    assert_eq!(saved.memory_size, MEMORY);
    assert!(
        saved.state_size.bytes() < 1 << 20,
        "device state is {} bytes",
        saved.state_size.bytes()
    );
    assert!(
        saved.memory_allocated.bytes() >= u64::from(FILL_MIB) << 20,
        "{saved:?}"
    );

    drop(server1);
    let sock2 = dirs.run_dir.join("nbd2.sock");
    let server2 = NbdServer::start(&disk, &sock2).expect("second qemu-nbd");
    spec.disks = vec![DiskSpec::nbd(&sock2, "disk")];
    let from = RestoreFrom {
        state: saved.state.clone(),
        memory: RestoreMemory::File(saved.memory.clone().expect("a memory file")),
    };
    let t = Instant::now();
    let vm = qemu.restore(&spec, &from).await.expect("restore");
    let restore_s = t.elapsed();
    eprintln!(
        "restore (shared memory file): {:.3} s",
        restore_s.as_secs_f64()
    );
    assert_continues(vm.console_log(), before.len(), pid, last, &fill).await;
    assert!(vm.query_status().await.expect("status").running);

    // The disk still works: the counter's writes after the restore went
    // through the second server into the file.
    vm.stop(Duration::from_secs(5)).await.expect("stop");
    drop(server2);
    let head = std::fs::read(&disk).expect("read disk");
    let written = String::from_utf8_lossy(&head[..64]);
    let on_disk = counts(written.trim_end_matches('\0'));
    assert!(
        on_disk
            .first()
            .is_some_and(|&(p, n)| p == pid && n > last + 1),
        "disk holds {written:?}"
    );
}

#[tokio::test]
async fn private_restores_share_one_snapshot() {
    let Some(fx) = fixture() else { return };
    let Some(initrd) = counter_initrd(&fx) else {
        return;
    };
    let _one = SERIAL.lock().await;
    let qemu = tcg();
    let id = VmId::new();
    let dirs = TestDirs::new(id);
    let spec0 = spec(id, &fx, &initrd, &dirs);
    let (vm, fill) = boot_counting(&qemu, &spec0).await;
    let state = dirs.run_dir.join("state");
    let t = Instant::now();
    let saved = vm.save(&state).await.expect("save");
    let save_s = t.elapsed();
    let &(pid, last) = counts(&saved_console(vm.console_log()))
        .last()
        .expect("counted before save");
    eprintln!(
        "save: {:.3} s; state {} bytes; memory allocated {}",
        save_s.as_secs_f64(),
        saved.state_size.bytes(),
        saved.memory_allocated
    );
    let memory = saved.memory.clone().expect("the vm's own memory file");
    let mem_before = std::fs::metadata(&memory).expect("stat memory");

    // A truncated state fails the restore quickly and leaves no QEMU.
    let truncated = dirs.run_dir.join("state.truncated");
    let bytes = std::fs::read(&state).expect("read state");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).expect("write truncated");
    let bad = RestoreFrom {
        state: truncated,
        memory: RestoreMemory::Private(memory.clone()),
    };
    expect_failed_restore(&qemu, &fx, &initrd, &bad).await;

    // Two forks from the one memory file, side by side.
    let from = RestoreFrom {
        state: state.clone(),
        memory: RestoreMemory::Private(memory.clone()),
    };
    let (id_a, id_b) = (VmId::new(), VmId::new());
    let (dirs_a, dirs_b) = (TestDirs::new(id_a), TestDirs::new(id_b));
    let (spec_a, spec_b) = (
        spec(id_a, &fx, &initrd, &dirs_a),
        spec(id_b, &fx, &initrd, &dirs_b),
    );
    let timed = |spec: VmSpec| {
        let (qemu, from) = (&qemu, &from);
        async move {
            let t = Instant::now();
            let vm = qemu.restore(&spec, from).await;
            (vm, t.elapsed())
        }
    };
    let ((a, a_s), (b, b_s)) = tokio::join!(timed(spec_a), timed(spec_b));
    let (a, b) = (a.expect("restore a"), b.expect("restore b"));
    eprintln!(
        "two concurrent private restores: {:.3} s and {:.3} s",
        a_s.as_secs_f64(),
        b_s.as_secs_f64()
    );
    assert!(a.private_memory() && b.private_memory());
    assert_ne!(a.pid(), b.pid());
    tokio::join!(
        assert_continues(a.console_log(), 0, pid, last, &fill),
        assert_continues(b.console_log(), 0, pid, last, &fill),
    );
    // A live save works whatever backs the RAM (it travels in the
    // stream): the fork runs on, and a third VM restored from the stream
    // alone counts on from the freeze, with the same memory.
    let live = dirs_a.run_dir.join("live");
    let saved_live = a.save_live(&live).await.expect("live save");
    let returned = Instant::now();
    let at_freeze = console(a.console_log());
    let &(_, at) = counts(&at_freeze).last().expect("a counted");
    a.resume().await.expect("resume after the live save");
    let bound = saved_live.frozen + returned.elapsed();
    // QEMU's own STOP and RESUME events time the freeze, within our bound.
    let freeze = a.last_freeze().expect("qemu timed the freeze");
    eprintln!(
        "live save of a private restore: frozen {freeze:?} (bound {bound:?}), stream {} bytes",
        saved_live.state_size.bytes()
    );
    assert!(freeze <= bound, "{freeze:?} > {bound:?}");
    assert!(
        saved_live.state_size.bytes() >= u64::from(FILL_MIB) << 20,
        "the stream holds no ram: {saved_live:?}"
    );
    let id_c = VmId::new();
    let dirs_c = TestDirs::new(id_c);
    let from_live = RestoreFrom {
        state: live,
        memory: RestoreMemory::InState,
    };
    let c = qemu
        .restore(&spec(id_c, &fx, &initrd, &dirs_c), &from_live)
        .await
        .expect("restore from a live save");
    assert!(!c.private_memory() && c.anonymous_memory());
    tokio::join!(
        assert_continues(a.console_log(), at_freeze.len(), pid, at, &fill),
        assert_continues(c.console_log(), 0, pid, at, &fill),
    );
    // RAM in no file of its own is saved into the state.
    let saved_c = c
        .save(&dirs_c.run_dir.join("state"))
        .await
        .expect("save of anonymous memory");
    assert_eq!(saved_c.memory, None);
    assert!(saved_c.state_size.bytes() >= u64::from(FILL_MIB) << 20);
    assert!(c.exit_info().is_some(), "qemu quit after the save");

    a.kill().await.expect("kill a");
    b.kill().await.expect("kill b");
    // Neither fork wrote the snapshot.
    let mem_after = std::fs::metadata(&memory).expect("stat memory");
    assert_eq!(mem_after.len(), mem_before.len());
    assert_eq!(
        mem_after.modified().ok(),
        mem_before.modified().ok(),
        "the snapshot's memory file was written"
    );
}

#[tokio::test]
async fn restore_from_garbage_state_fails_and_reaps_qemu() {
    let Some(fx) = fixture() else { return };
    let Some(initrd) = counter_initrd(&fx) else {
        return;
    };
    let _one = SERIAL.lock().await;
    let dirs = TestDirs::new(VmId::new());
    let memory = dirs.run_dir.join("snapshot.mem");
    std::fs::File::create(&memory)
        .and_then(|f| f.set_len(MEMORY.bytes()))
        .expect("memory file");
    let garbage = dirs.run_dir.join("garbage.state");
    std::fs::write(
        &garbage,
        b"QEVM but not really a migration stream".repeat(100),
    )
    .expect("garbage");
    for state in [garbage, dirs.run_dir.join("empty.state")] {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&state)
            .expect("state file");
        let from = RestoreFrom {
            state,
            memory: RestoreMemory::Private(memory.clone()),
        };
        expect_failed_restore(&tcg(), &fx, &initrd, &from).await;
    }
}

#[tokio::test]
async fn restore_refuses_mismatched_inputs_before_starting_qemu() {
    let dirs = TestDirs::new(VmId::new());
    let mut spec = small_spec(VmId::new(), "/k".as_ref(), "/i".as_ref(), &dirs);
    let qemu = Qemu::new(QemuConfig {
        tsc_khz: Some(1_000_000),
        binary: "/nonexistent/qemu".into(),
        ..QemuConfig::default()
    });
    let other = dirs.run_dir.join("other.mem");
    std::fs::File::create(&other)
        .and_then(|f| f.set_len(64 << 20))
        .expect("memory file");
    let state = dirs.run_dir.join("state");
    std::fs::write(&state, b"x").expect("state");
    let from = |memory: &Path, private| RestoreFrom {
        state: state.clone(),
        memory: if private {
            RestoreMemory::Private(memory.to_owned())
        } else {
            RestoreMemory::File(memory.to_owned())
        },
    };

    // A shared restore takes the spec's own memory file over.
    let got = qemu.restore(&spec, &from(&other, false)).await;
    assert!(matches!(got, Err(VmmError::InvalidSpec { .. })), "{got:?}");
    // 64 MiB of memory for a 128 MiB VM.
    let got = qemu.restore(&spec, &from(&other, true)).await;
    let err = got.err().map(|e| chain(&e)).unwrap_or_default();
    assert!(err.contains("holds 67108864 bytes"), "{err}");
    // Free page reporting would punch holes in a shared snapshot.
    spec.free_page_reporting = true;
    let got = qemu.restore(&spec, &from(&other, true)).await;
    assert!(matches!(got, Err(VmmError::InvalidSpec { .. })), "{got:?}");
}

/// Restoring `from` fails with a `restore` error within a bound, and the
/// QEMU it started is gone.
async fn expect_failed_restore(qemu: &Qemu, fx: &Fixture, initrd: &Path, from: &RestoreFrom) {
    let id = VmId::new();
    let dirs = TestDirs::new(id);
    let spec = spec(id, fx, initrd, &dirs);
    let t = Instant::now();
    let got = qemu.restore(&spec, from).await;
    let took = t.elapsed();
    let err = match got {
        Err(e @ VmmError::Backend { op: "restore", .. }) => e,
        other => panic!("expected a restore error, got {other:?}"),
    };
    let chain = chain(&err);
    eprintln!(
        "bad state {:?}: failed in {:.3} s: {chain}",
        from.state.file_name().unwrap_or_default(),
        took.as_secs_f64()
    );
    assert!(took < Duration::from_secs(30), "{took:?}");
    assert!(chain.contains("load of migration failed"), "{chain}");
    let pid = std::fs::read_to_string(dirs.run_dir.join("qemu.pid")).expect("pid file");
    assert!(
        !Path::new(&format!("/proc/{}", pid.trim())).exists(),
        "qemu {pid} still exists"
    );
}

/// Every message of an error's source chain, joined.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cur = c.source();
    }
    out
}
