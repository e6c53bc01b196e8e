//! PID 1 duties before the agent serves: mount the pseudo filesystems, load
//! the virtio modules shipped in the initramfs, mount the root disk and
//! switch into it. The user's image is only read, never changed, except
//! that a missing mount point is created in the VM's own disk overlay.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::sys;

const MODULES_DIR: &str = "/hearth/modules";
const NEW_ROOT: &str = "/newroot";
const ROOT_DEVICE: &str = "/dev/vda";

/// Kernel command-line switches the host sets.
pub struct BootArgs {
    /// `hearth.probe=1`: print a marker and power off (accelerator probe).
    pub probe: bool,
    /// `hearth.root=none`: stay in the initramfs (tests of the init itself).
    pub no_root: bool,
}

fn log(msg: &str) {
    eprintln!("hearth-guest: {msg}");
    crate::logs::record(hearth_guest_proto::LogLevel::Info, msg, &[]);
}

pub fn boot() -> Result<BootArgs, String> {
    let _ = fs::create_dir_all("/proc");
    let _ = fs::create_dir_all("/sys");
    let _ = fs::create_dir_all("/dev");
    sys::mount("proc", "/proc", "proc", 0, "").map_err(|e| format!("mount /proc: {e}"))?;
    sys::mount("sysfs", "/sys", "sysfs", 0, "").map_err(|e| format!("mount /sys: {e}"))?;
    sys::mount("devtmpfs", "/dev", "devtmpfs", 0, "").map_err(|e| format!("mount /dev: {e}"))?;
    let cmdline = fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let args = BootArgs {
        probe: cmdline.split_whitespace().any(|a| a == "hearth.probe=1"),
        no_root: cmdline.split_whitespace().any(|a| a == "hearth.root=none"),
    };
    if args.probe {
        // Print before loading anything: the probe only asks "does a guest run?".
        if let Ok(mut console) = fs::OpenOptions::new().write(true).open("/dev/console") {
            use std::io::Write;
            let _ = console.write_all(b"HEARTH_PROBE_OK\n");
        }
        sys::power_off();
    }
    load_modules();
    if !args.no_root {
        switch_root()?;
    }
    mount_runtime_filesystems();
    if !args.no_root {
        // A disk larger than the image: fill it (cheap when nothing to do).
        if let Err(e) = sys::grow_root_fs(ROOT_DEVICE) {
            log(&format!("grow root filesystem: {e}"));
        }
    }
    let hostname = fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty() && h.len() < 64)
        .unwrap_or_else(|| "hearth".into());
    let _ = sys::sethostname(&hostname);
    if let Err(e) = sys::loopback_up() {
        log(&format!("loopback: {e}"));
    }
    Ok(args)
}

fn load_modules() {
    let Ok(dir) = fs::read_dir(MODULES_DIR) else {
        return;
    };
    let mut mods: Vec<_> = dir.flatten().map(|e| e.path()).collect();
    mods.sort();
    for m in mods {
        match fs::File::open(&m).and_then(|f| sys::finit_module(&f)) {
            Ok(()) => {}
            Err(e) => log(&format!("load {}: {e}", m.display())),
        }
    }
}

fn switch_root() -> Result<(), String> {
    let start = Instant::now();
    while !Path::new(ROOT_DEVICE).exists() {
        if start.elapsed() > Duration::from_secs(10) {
            return Err(format!("{ROOT_DEVICE} did not appear"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = fs::create_dir_all(NEW_ROOT);
    sys::mount(ROOT_DEVICE, NEW_ROOT, "ext4", 0, "")
        .map_err(|e| format!("mount {ROOT_DEVICE}: {e}"))?;
    for dir in ["proc", "sys", "dev", "tmp", "run"] {
        let p = Path::new(NEW_ROOT).join(dir);
        if !p.exists() {
            let _ = fs::create_dir_all(&p);
        }
    }
    // The initramfs stays mounted underneath (a few MiB of RAM); its pseudo
    // filesystems are detached and mounted again inside the new root.
    for m in ["/proc", "/sys", "/dev"] {
        let _ = sys::umount_detach(m);
    }
    std::env::set_current_dir(NEW_ROOT).map_err(|e| format!("chdir {NEW_ROOT}: {e}"))?;
    sys::mount(".", "/", "", libc::MS_MOVE, "").map_err(|e| format!("move root: {e}"))?;
    sys::chroot_here().map_err(|e| format!("chroot: {e}"))?;
    std::env::set_current_dir("/").map_err(|e| format!("chdir /: {e}"))?;
    Ok(())
}

fn mount_runtime_filesystems() {
    let mounts: &[(&str, &str, &str, libc::c_ulong, &str)] = &[
        ("proc", "/proc", "proc", 0, ""),
        ("sysfs", "/sys", "sysfs", 0, ""),
        ("devtmpfs", "/dev", "devtmpfs", 0, ""),
        (
            "devpts",
            "/dev/pts",
            "devpts",
            0,
            "gid=5,mode=620,ptmxmode=666",
        ),
        ("tmpfs", "/dev/shm", "tmpfs", 0, "mode=1777"),
        ("tmpfs", "/tmp", "tmpfs", 0, "mode=1777"),
        ("tmpfs", "/run", "tmpfs", 0, "mode=755"),
    ];
    for (src, target, fstype, flags, data) in mounts {
        let _ = fs::create_dir_all(target);
        if let Err(e) = sys::mount(src, target, fstype, *flags, data) {
            // devtmpfs may already be mounted when staying in the initramfs.
            if e.raw_os_error() != Some(libc::EBUSY) {
                log(&format!("mount {target}: {e}"));
            }
        }
    }
    // /dev/ptmx must reach the devpts instance for openpty to work.
    if !Path::new("/dev/ptmx").exists() {
        let _ = std::os::unix::fs::symlink("pts/ptmx", "/dev/ptmx");
    }
}

/// Where an image keeps what runs at every boot: each executable file is
/// started once the root disk is up, in its own process group, with its
/// output in `/var/log/hearth/<name>.log` and, line by line, in the
/// guest's log (E2B's sandbox logs; see [`follow_service_output`]) (an
/// image's services: the
/// code-interpreter image's server). A service with a `<name>.port` file
/// beside it is waited for (up to [`READY_WAIT`]) until that port accepts
/// connections on loopback before the agent answers the host, so its
/// sandbox is ready only once the service is (E2B's template "ready
/// command"). A resumed VM does not boot: what ran at its boot runs on.
const BOOT_DIR: &str = "/etc/hearth/boot.d";
const BOOT_LOG_DIR: &str = "/var/log/hearth";
/// How long a boot waits for its services' ports.
const READY_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Starts the image's boot services (see [`BOOT_DIR`]); a service that
/// cannot start is logged and skipped.
pub fn start_boot_services() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let Ok(dir) = fs::read_dir(BOOT_DIR) else {
        return;
    };
    let mut services: Vec<_> = dir
        .flatten()
        .filter(|e| {
            e.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .map(|e| e.path())
        .collect();
    services.sort();
    if let Err(e) = fs::create_dir_all(BOOT_LOG_DIR) {
        log(&format!("{BOOT_LOG_DIR}: {e}"));
    }
    for path in services {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let log_path = format!("{BOOT_LOG_DIR}/{name}.log");
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| log(&format!("{log_path}: {e}")))
            .ok();
        // Both streams into one pipe the agent reads.
        let piped = std::io::pipe().and_then(|(r, w)| Ok((r, w.try_clone()?, w)));
        let (stdout, stderr) = match piped {
            Ok((reader, out, err)) => {
                follow_service_output(name.clone(), reader, file);
                (
                    std::process::Stdio::from(out),
                    std::process::Stdio::from(err),
                )
            }
            Err(e) => {
                log(&format!("boot service {name}: no pipe for its output: {e}"));
                match file.map(|f| Ok::<_, std::io::Error>((f.try_clone()?, f))) {
                    Some(Ok((a, b))) => {
                        (std::process::Stdio::from(a), std::process::Stdio::from(b))
                    }
                    _ => (std::process::Stdio::null(), std::process::Stdio::null()),
                }
            }
        };
        let started = std::process::Command::new(&path)
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env("HOME", "/root")
            .current_dir("/")
            .stdin(std::process::Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .process_group(0)
            .spawn();
        match started {
            // The reaper collects it when it ends.
            Ok(child) => log(&format!("boot service {name} started (pid {})", child.id())),
            Err(e) => {
                log(&format!("boot service {name}: {e}"));
                continue;
            }
        }
        let port = fs::read_to_string(format!("{BOOT_DIR}/{name}.port"))
            .ok()
            .and_then(|p| p.trim().parse::<u16>().ok());
        if let Some(port) = port {
            wait_for_port(&name, port);
        }
    }
}

/// Keeps a boot service's output, on a thread of its own until the
/// service closes it: the bytes in its log file as they come, and each
/// line in the guest's log as an `info` entry with `source: service` and
/// the service's name (a line is cut at [`MAX_LOG_MESSAGE`] there; the
/// file keeps it whole). The guest's log is a bounded ring, so a chatty
/// service costs no more memory than a quiet one.
///
/// [`MAX_LOG_MESSAGE`]: hearth_guest_proto::MAX_LOG_MESSAGE
fn follow_service_output(name: String, reader: std::io::PipeReader, file: Option<fs::File>) {
    let thread_name = format!("svc-{name}");
    let spawned = std::thread::Builder::new()
        .name(thread_name)
        .stack_size(64 << 10)
        .spawn(move || {
            use std::io::{BufRead, Write};
            let mut file = file;
            let mut r = std::io::BufReader::with_capacity(8192, reader);
            let mut line: Vec<u8> = Vec::new();
            let emit = |line: &[u8]| {
                crate::logs::record(
                    hearth_guest_proto::LogLevel::Info,
                    &String::from_utf8_lossy(line),
                    &[("source", "service".into()), ("service", name.clone())],
                );
            };
            loop {
                let buf = match r.fill_buf() {
                    Ok([]) => break,
                    Ok(b) => b,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                };
                if let Some(f) = file.as_mut() {
                    if f.write_all(buf).is_err() {
                        file = None;
                    }
                }
                for &b in buf {
                    if b == b'\n' {
                        emit(&line);
                        line.clear();
                    } else if line.len() < hearth_guest_proto::MAX_LOG_MESSAGE {
                        line.push(b);
                    }
                }
                let n = buf.len();
                r.consume(n);
            }
            if !line.is_empty() {
                emit(&line);
            }
        });
    if let Err(e) = spawned {
        log(&format!("boot service output: {e}"));
    }
}

/// Waits until `port` accepts a connection on loopback, or [`READY_WAIT`].
fn wait_for_port(name: &str, port: u16) {
    let started = std::time::Instant::now();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    while started.elapsed() < READY_WAIT {
        if std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(1)).is_ok() {
            log(&format!(
                "boot service {name} listens on {port} after {} ms",
                started.elapsed().as_millis()
            ));
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    log(&format!(
        "boot service {name}: port {port} not open after {READY_WAIT:?}; going on"
    ));
}
