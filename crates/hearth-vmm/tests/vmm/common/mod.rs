//! Fixtures for tests that boot real guests: Debian's cloud kernel (fetched
//! with `apt-get download` into a cache dir) and tiny busybox initramfs
//! images built here, in `newc` cpio format.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use hearth_types::{ByteSize, MilliCpu, VmId};
use hearth_vmm::VmSpec;

pub const CACHE_DIR: &str = "/tmp/hearth-vmm-test";
pub const KERNEL_PACKAGE: &str = "linux-image-6.1.0-50-cloud-amd64-unsigned";
pub const KERNEL_RELEASE: &str = "6.1.0-50-cloud-amd64";
pub const BUSYBOX: &str = "/bin/busybox";

/// Serializes fixture creation within one test binary.
static FIXTURE_LOCK: Mutex<()> = Mutex::new(());

/// The unpacked kernel package (`boot/vmlinuz-*`, `lib/modules/*`), fetched
/// on first use. `Err` says why the tests that need it must be skipped.
pub fn kernel_root() -> Result<PathBuf, String> {
    let _held = FIXTURE_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let cache = Path::new(CACHE_DIR);
    let root = cache.join("kroot");
    if root
        .join("boot")
        .join(format!("vmlinuz-{KERNEL_RELEASE}"))
        .is_file()
    {
        return Ok(root);
    }
    let work = cache.join(format!("fetch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| format!("create {}: {e}", work.display()))?;
    let run = |cmd: &mut Command| -> Result<(), String> {
        let out = cmd.output().map_err(|e| format!("run {cmd:?}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{cmd:?} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    };
    run(Command::new("apt-get")
        .args(["download", KERNEL_PACKAGE])
        .current_dir(&work))?;
    let deb = std::fs::read_dir(&work)
        .map_err(|e| format!("list {}: {e}", work.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or("apt-get download left no .deb")?;
    let unpacked = work.join("root");
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked))?;
    // Another process may have won the race; either copy is good.
    if std::fs::rename(&unpacked, &root).is_err() && !root.is_dir() {
        return Err(format!("cannot move the kernel into {}", root.display()));
    }
    let _ = std::fs::remove_dir_all(&work);
    Ok(root)
}

pub fn kernel_image(root: &Path) -> PathBuf {
    root.join("boot").join(format!("vmlinuz-{KERNEL_RELEASE}"))
}

/// A virtio module of the fetched kernel, by name (e.g. `virtio_blk`).
pub fn module(root: &Path, name: &str) -> Option<PathBuf> {
    let base = root
        .join("lib/modules")
        .join(KERNEL_RELEASE)
        .join("kernel/drivers");
    ["virtio", "block", "char"]
        .iter()
        .map(|d| base.join(d).join(format!("{name}.ko")))
        .find(|p| p.is_file())
}

/// Everything a VM test needs, or why it must be skipped.
pub struct Fixture {
    pub kernel: PathBuf,
    pub kernel_root: PathBuf,
}

/// Environment variable that turns every skip for a missing prerequisite
/// (QEMU, busybox, the kernel, a fixture) into a test failure, so a CI
/// without them cannot pass without booting anything.
pub const REQUIRE_QEMU_ENV: &str = "HEARTH_REQUIRE_QEMU";

/// Skips the calling test for a missing prerequisite: prints `SKIP: why`,
/// or panics when `HEARTH_REQUIRE_QEMU=1`. Skips for conditions that are
/// legitimate on a complete machine (e.g. "KVM works on this host") print
/// their own SKIP line instead.
pub fn skip_missing(why: &str) {
    if std::env::var(REQUIRE_QEMU_ENV).as_deref() == Ok("1") {
        panic!("{REQUIRE_QEMU_ENV}=1 but this VM test cannot run: {why}");
    }
    eprintln!("SKIP: {why} (set {REQUIRE_QEMU_ENV}=1 to fail instead)");
}

pub fn fixture() -> Option<Fixture> {
    if which("qemu-system-x86_64").is_none() {
        skip_missing("qemu-system-x86_64 is not installed");
        return None;
    }
    if !Path::new(BUSYBOX).is_file() {
        skip_missing(&format!("{BUSYBOX} (busybox-static) is missing"));
        return None;
    }
    match kernel_root() {
        Ok(root) => Some(Fixture {
            kernel: kernel_image(&root),
            kernel_root: root,
        }),
        Err(e) => {
            skip_missing(&format!(
                "cannot fetch the guest kernel {KERNEL_PACKAGE}: {e}"
            ));
            None
        }
    }
}

fn which(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(bin))
            .find(|p| p.is_file())
    })
}

/// Builds (once per content) an initramfs with busybox, `/init` = `init`
/// and the given extra files (guest path, host path).
pub fn initramfs(name: &str, init: &str, extra: &[(String, PathBuf)]) -> Result<PathBuf, String> {
    let _held = FIXTURE_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let mut cpio = Cpio::default();
    for dir in ["bin", "dev", "proc", "sys", "lib", "lib/modules"] {
        cpio.dir(dir);
    }
    let busybox = std::fs::read(BUSYBOX).map_err(|e| format!("read {BUSYBOX}: {e}"))?;
    cpio.file("bin/busybox", 0o755, &busybox);
    cpio.file("init", 0o755, init.as_bytes());
    for (guest, host) in extra {
        let data = std::fs::read(host).map_err(|e| format!("read {}: {e}", host.display()))?;
        cpio.file(guest, 0o644, &data);
    }
    let bytes = cpio.finish();
    let dir = Path::new(CACHE_DIR);
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let path = dir.join(format!("{name}.cpio"));
    let tmp = dir.join(format!("{name}.cpio.tmp-{}", std::process::id()));
    std::fs::write(&tmp, &bytes).map_err(|e| format!("write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, &path).map_err(|e| format!("rename to {}: {e}", path.display()))?;
    Ok(path)
}

/// A writer of the `newc` cpio format the kernel unpacks as initramfs.
#[derive(Default)]
struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040_755, 2, &[]);
    }

    fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, 0o100_000 | perm, 1, data);
    }

    fn entry(&mut self, name: &str, mode: u32, nlink: u32, data: &[u8]) {
        self.ino += 1;
        let fields = [
            self.ino,
            mode,
            0, // uid
            0, // gid
            nlink,
            0, // mtime
            data.len() as u32,
            0, // dev major
            0, // dev minor
            0, // rdev major
            0, // rdev minor
            name.len() as u32 + 1,
            0, // check
        ];
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.ino = 0;
        self.entry("TRAILER!!!", 0, 1, &[]);
        self.out
    }
}

/// A run dir and memory file for one test VM, removed on drop.
pub struct TestDirs {
    pub run_dir: PathBuf,
    pub mem_path: PathBuf,
}

impl TestDirs {
    pub fn new(id: VmId) -> Self {
        // On disk (not tmpfs): writable disks use cache=none (O_DIRECT).
        let run_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("vm-{id}"));
        std::fs::create_dir_all(&run_dir).expect("create run dir");
        let shm = Path::new("/dev/shm");
        let mem_path = if shm.is_dir() {
            shm.join(format!("hearth-vmm-test-{id}.mem"))
        } else {
            run_dir.join("mem")
        };
        Self { run_dir, mem_path }
    }
}

impl Drop for TestDirs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.run_dir);
        let _ = std::fs::remove_file(&self.mem_path);
    }
}

/// A 1-vCPU, 128 MiB spec for `dirs`.
pub fn small_spec(id: VmId, kernel: &Path, initrd: &Path, dirs: &TestDirs) -> VmSpec {
    VmSpec {
        id,
        cpu: MilliCpu(1000),
        memory: ByteSize::mib(128),
        kernel: kernel.to_owned(),
        initrd: initrd.to_owned(),
        cmdline: Vec::new(),
        disks: Vec::new(),
        run_dir: dirs.run_dir.clone(),
        mem_path: dirs.mem_path.clone(),
        memory_file: true,
        raw_ports: Vec::new(),
        free_page_reporting: false,
        net: None,
        jail: None,
    }
}

/// Polls `path` until it contains `needle` or `timeout` passes.
pub async fn wait_for_text(
    path: &Path,
    needle: &str,
    timeout: std::time::Duration,
) -> Option<String> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if text.contains(needle) {
                return Some(text);
            }
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
