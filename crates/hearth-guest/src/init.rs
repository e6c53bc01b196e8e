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
