//! Real builds into throwaway data directories: apt, dpkg-deb,
//! mkfs.ext4 and debugfs all run for real. Root images need root; those
//! tests say SKIPPED and pass when run unprivileged.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hearth_image::{
    ensure_all, ensure_initramfs, ensure_kernel, ensure_rootfs, guest_agent_binary, ImageConfig,
    ImageError, ImageName, Progress, MODULE_LOAD_ORDER,
};

/// A data directory removed when the test ends.
struct DataDir(PathBuf);

impl DataDir {
    fn new(name: &str) -> Self {
        let path = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("hearth-image-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        DataDir(path)
    }

    fn config(&self) -> ImageConfig {
        ImageConfig::new(&self.0)
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Records every report (and echoes it with a timestamp, visible with
/// --nocapture).
struct Recorder(Mutex<Vec<String>>, Instant);

impl Default for Recorder {
    fn default() -> Self {
        Recorder(Mutex::default(), Instant::now())
    }
}

impl Recorder {
    fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    fn clear(&self) {
        self.0.lock().unwrap().clear();
    }
}

impl Progress for Recorder {
    fn step(&self, what: &str) {
        eprintln!("[test +{:.2}s] {what}", self.1.elapsed().as_secs_f64());
        self.0.lock().unwrap().push(what.to_owned());
    }

    fn done(&self, what: &str, elapsed: Duration) {
        eprintln!(
            "[test +{:.2}s] {what} done in {:.2}s",
            self.1.elapsed().as_secs_f64(),
            elapsed.as_secs_f64()
        );
        self.0.lock().unwrap().push(format!("done: {what}"));
    }
}

fn timed<T>(label: &str, f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let out = f();
    let elapsed = start.elapsed();
    eprintln!("[timing] {label}: {:.3}s", elapsed.as_secs_f64());
    (out, elapsed)
}

fn is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|r| r.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

fn debugfs(img: &Path, request: &str) -> String {
    let out = Command::new("debugfs")
        .arg("-R")
        .arg(request)
        .arg(img)
        .output()
        .expect("debugfs is installed");
    assert!(out.status.success(), "debugfs -R {request:?} failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The kernel is extracted with its modules in load order, and the second
/// call is a cache hit. Then the initramfs is built around the real guest
/// agent and holds exactly the contract's layout.
#[test]
fn kernel_and_initramfs() {
    let data = DataDir::new("kernel");
    let cfg = data.config();
    let p = Recorder::default();

    let (kernel, _) = timed("kernel build", || ensure_kernel(&cfg, &p).unwrap());
    assert!(fs::metadata(&kernel.vmlinuz).unwrap().len() > 1_000_000);
    // Debian's LZ4 bzImage is unpacked once: guests boot the ELF inside
    // (PVH) and never decompress it themselves.
    assert_ne!(kernel.boot_image, kernel.vmlinuz);
    let elf = fs::read(&kernel.boot_image).unwrap();
    assert_eq!(&elf[..4], b"\x7fELF");
    assert!(elf.len() > fs::metadata(&kernel.vmlinuz).unwrap().len() as usize);
    assert_eq!(kernel.release, "6.1.0-50-cloud-amd64");
    assert_eq!(kernel.package, cfg.kernel_package);
    assert!(!kernel.package_version.is_empty());
    assert!(kernel.modules_dir.starts_with(cfg.artifacts_dir()));
    let expected: Vec<&str> = MODULE_LOAD_ORDER
        .iter()
        .copied()
        .filter(|m| !kernel.builtin_modules.iter().any(|b| b == m))
        .collect();
    let names: Vec<&str> = kernel.modules.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, expected, "builtin: {:?}", kernel.builtin_modules);
    let mut listed: Vec<String> = fs::read_dir(&kernel.modules_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    listed.sort();
    let in_order: Vec<String> = expected
        .iter()
        .enumerate()
        .map(|(i, m)| format!("{i:02}-{m}.ko"))
        .collect();
    assert_eq!(listed, in_order);
    for m in &kernel.modules {
        assert!(fs::metadata(&m.path).unwrap().len() > 0);
    }

    p.clear();
    let (again, hit) = timed("kernel cache hit", || ensure_kernel(&cfg, &p).unwrap());
    assert_eq!(again, kernel);
    assert!(hit < Duration::from_millis(500), "cache hit took {hit:?}");
    assert!(p.lines().is_empty(), "a cache hit reported {:?}", p.lines());

    let (agent, _) = timed("guest agent", || guest_agent_binary(&cfg, &p).unwrap());
    let (initramfs, _) = timed("initramfs build", || {
        ensure_initramfs(&cfg, &kernel, &agent, &p).unwrap()
    });
    let listing = Command::new("cpio")
        .args(["-t", "--quiet", "-F"])
        .arg(&initramfs.path)
        .output()
        .unwrap();
    assert!(listing.status.success());
    let listing = String::from_utf8(listing.stdout).unwrap();
    let mut want = vec![
        "dev".to_owned(),
        "proc".into(),
        "sys".into(),
        "newroot".into(),
        "hearth".into(),
        "hearth/modules".into(),
        "dev/console".into(),
        "init".into(),
    ];
    want.extend(in_order.iter().map(|f| format!("hearth/modules/{f}")));
    assert_eq!(listing.lines().collect::<Vec<_>>(), want);
    assert_eq!(
        initramfs.size_bytes,
        fs::metadata(&initramfs.path).unwrap().len()
    );

    p.clear();
    let (again, hit) = timed("initramfs cache hit", || {
        ensure_initramfs(&cfg, &kernel, &agent, &p).unwrap()
    });
    assert_eq!(again, initramfs);
    assert!(hit < Duration::from_millis(500), "cache hit took {hit:?}");
    assert!(p.lines().is_empty());

    match ensure_initramfs(&cfg, &kernel, Path::new("/bin/ls"), &p) {
        Err(ImageError::NotStatic { interpreter, .. }) => assert!(interpreter.contains("ld-linux")),
        other => panic!("a dynamic /init was accepted: {other:?}"),
    }

    if is_root() {
        let (all, _) = timed("ensure_all(busybox) with cached kernel", || {
            ensure_all(&cfg, ImageName::Busybox, &p).unwrap()
        });
        assert_eq!(all.kernel, kernel);
        assert_eq!(all.initramfs, initramfs);
        assert_eq!(all.rootfs.name, ImageName::Busybox);
    }
}

/// The busybox image holds busybox, its applets and the users, is a cache
/// hit the second time, and is byte-for-byte reproducible.
#[test]
fn busybox_rootfs() {
    if !is_root() {
        eprintln!("SKIPPED: building root images needs root");
        return;
    }
    let data = DataDir::new("busybox");
    let cfg = data.config();
    let p = Recorder::default();
    let (img, _) = timed("busybox rootfs build", || {
        ensure_rootfs(&cfg, ImageName::Busybox, &p).unwrap()
    });
    assert_eq!(img.size_bytes, 64 << 20);
    assert_eq!(
        img.recipe_version,
        hearth_image::recipe_version(ImageName::Busybox)
    );
    assert!(img.path.ends_with(format!(
        "rootfs-busybox-v{}/rootfs.ext4",
        img.recipe_version
    )));

    let stat = debugfs(&img.path, "stat /bin/busybox");
    assert!(stat.contains("Type: regular"), "{stat}");
    assert!(stat.contains("Mode:  0755"), "{stat}");
    for link in ["/bin/sh", "/usr/bin/env"] {
        let stat = debugfs(&img.path, &format!("stat {link}"));
        assert!(stat.contains("Type: symlink"), "{link}: {stat}");
    }
    // busybox-static has no `bash` applet, so /bin/bash is a script that
    // runs busybox's sh.
    let bash = debugfs(&img.path, "stat /bin/bash");
    assert!(
        bash.contains("Type: regular") && bash.contains("Mode:  0755"),
        "{bash}"
    );
    let script = debugfs(&img.path, "cat /bin/bash");
    assert!(
        script.starts_with("#!/bin/sh\n") && script.contains("exec /bin/sh"),
        "{script}"
    );
    let home = debugfs(&img.path, "stat /home/user");
    assert!(home.contains("User:  1000   Group:  1000"), "{home}");
    let tmp = debugfs(&img.path, "stat /tmp");
    assert!(tmp.contains("Mode:  01777"), "{tmp}");
    let passwd = debugfs(&img.path, "cat /etc/passwd");
    assert!(
        passwd.contains("user:x:1000:1000:user:/home/user:/bin/sh"),
        "{passwd}"
    );
    let label = Command::new("dumpe2fs")
        .arg("-h")
        .arg(&img.path)
        .output()
        .unwrap();
    let label = String::from_utf8_lossy(&label.stdout);
    assert!(
        label.contains("Filesystem volume name:   hearthroot"),
        "{label}"
    );
    assert!(
        label.contains(hearth_image::fs_uuid(ImageName::Busybox)),
        "{label}"
    );
    let fsck = Command::new("e2fsck")
        .arg("-fn")
        .arg(&img.path)
        .output()
        .unwrap();
    assert!(
        fsck.status.success(),
        "{}",
        String::from_utf8_lossy(&fsck.stdout)
    );

    p.clear();
    let (again, hit) = timed("busybox rootfs cache hit", || {
        ensure_rootfs(&cfg, ImageName::Busybox, &p).unwrap()
    });
    assert_eq!(again, img);
    assert!(hit < Duration::from_millis(500), "cache hit took {hit:?}");
    assert!(p.lines().is_empty());

    // Rebuild in a later wall-clock second, so any timestamp that escaped
    // normalization shows up as a different checksum.
    std::thread::sleep(Duration::from_millis(1100));
    let other = DataDir::new("busybox-repro");
    let twin = ensure_rootfs(&other.config(), ImageName::Busybox, &p).unwrap();
    assert_eq!(twin.blake3, img.blake3, "busybox image is not reproducible");
}

/// Two builders racing on an empty cache: one builds, the other waits for
/// the lock and then finds the result.
#[test]
fn concurrent_builds_share_one_result() {
    if !is_root() {
        eprintln!("SKIPPED: building root images needs root");
        return;
    }
    let data = DataDir::new("race");
    let cfg = data.config();
    let p = Recorder::default();
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|_| s.spawn(|| ensure_rootfs(&cfg, ImageName::Busybox, &p).unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(results[0], results[1]);
    let builds = p
        .lines()
        .iter()
        .filter(|l| l.as_str() == "building busybox root image")
        .count();
    assert_eq!(builds, 1, "{:?}", p.lines());
    let leftovers: Vec<_> = fs::read_dir(cfg.artifacts_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// A pinned kernel that apt no longer carries falls back to the newest of
/// its family, with a warning, and the fallback is cached for that pin.
#[test]
fn unavailable_kernel_falls_back_to_newest() {
    let data = DataDir::new("fallback");
    let mut cfg = data.config();
    cfg.kernel_package = "linux-image-6.1.0-1-cloud-amd64-unsigned".to_owned();
    let p = Recorder::default();
    let kernel = ensure_kernel(&cfg, &p).unwrap();
    assert_ne!(kernel.package, cfg.kernel_package);
    assert!(kernel.package.starts_with("linux-image-6.1.0-"));
    assert!(kernel.package.ends_with("-cloud-amd64-unsigned"));
    assert!(
        p.lines()
            .iter()
            .any(|l| l.starts_with("warning:") && l.contains(&kernel.package)),
        "{:?}",
        p.lines()
    );
    p.clear();
    assert_eq!(ensure_kernel(&cfg, &p).unwrap(), kernel);
    assert!(p.lines().is_empty());
}

/// The Debian image (about a minute; run with --ignored).
#[test]
#[ignore = "runs debootstrap: about a minute and ~400 MB of downloads"]
fn default_rootfs() {
    assert!(is_root(), "building the default image needs root");
    let data = DataDir::new("default");
    let cfg = data.config();
    let p = Recorder::default();
    let (img, _) = timed("default rootfs build", || {
        ensure_rootfs(&cfg, ImageName::Default, &p).unwrap()
    });
    assert_eq!(img.size_bytes % (256 << 20), 0);
    let allocated = {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(&img.path).unwrap().blocks() * 512
    };
    eprintln!(
        "[size] default image {} MiB apparent, {} MiB allocated",
        img.size_bytes >> 20,
        allocated >> 20
    );
    for path in [
        "/usr/bin/python3",
        "/usr/bin/python",
        "/usr/bin/pip",
        "/usr/bin/pip3",
        "/usr/bin/git",
        "/usr/bin/curl",
        "/usr/bin/jq",
        "/usr/bin/rg",
        "/usr/bin/unzip",
        "/usr/bin/ps",
        "/usr/bin/ip",
        "/usr/bin/ss",
        "/usr/bin/node",
        "/usr/bin/npm",
        "/usr/bin/npx",
        "/usr/lib/node_modules/npm/bin/npm-cli.js",
        "/usr/bin/rclone",
        "/usr/bin/fusermount3",
        "/usr/lib/python3/dist-packages/boto3/__init__.py",
        "/bin/bash",
        "/etc/pip.conf",
        "/etc/ssl/certs/ca-certificates.crt",
    ] {
        let stat = debugfs(&img.path, &format!("stat {path}"));
        assert!(
            stat.contains("Type: regular") || stat.contains("Type: symlink"),
            "{path}: {stat}"
        );
    }
    let marker = debugfs(&img.path, "ls /usr/lib/python3.11");
    assert!(marker.contains("os.py"), "{marker}");
    assert!(!marker.contains("EXTERNALLY-MANAGED"), "{marker}");
    let passwd = debugfs(&img.path, "cat /etc/passwd");
    assert!(
        passwd.contains("user:x:1000:1000:user:/home/user:/bin/bash"),
        "{passwd}"
    );
    let shadow = debugfs(&img.path, "cat /etc/shadow");
    assert!(shadow.lines().any(|l| l.starts_with("user:!:")), "{shadow}");
    assert_eq!(debugfs(&img.path, "cat /etc/hostname").trim(), "hearth");
    let home = debugfs(&img.path, "stat /home/user");
    assert!(home.contains("User:  1000   Group:  1000"), "{home}");
    let lists = debugfs(&img.path, "ls /var/lib/apt/lists");
    assert!(!lists.contains("_Packages"), "{lists}");
    let fsck = Command::new("e2fsck")
        .arg("-fn")
        .arg(&img.path)
        .output()
        .unwrap();
    assert!(
        fsck.status.success(),
        "{}",
        String::from_utf8_lossy(&fsck.stdout)
    );

    p.clear();
    let (again, hit) = timed("default rootfs cache hit", || {
        ensure_rootfs(&cfg, ImageName::Default, &p).unwrap()
    });
    assert_eq!(again, img);
    assert!(hit < Duration::from_millis(500), "cache hit took {hit:?}");
}
