//! `hearth doctor`: what Hearth needs on this machine, one line per check,
//! with what to do about each failure. `hearth up` runs the same checks
//! first and stops with their advice when a required one fails.

use std::ffi::OsString;
use std::fmt;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const INSTALL: &str = "run scripts/install-deps (as root)";

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Fine.
    Ok,
    /// Hearth works, but not at its best (e.g. TCG instead of KVM).
    Warn,
    /// Hearth cannot work until this is fixed.
    Fail,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// What was checked ("QEMU", "KVM", "/dev/shm", …).
    pub name: &'static str,
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do about it (for warnings and failures).
    pub advice: Option<String>,
}

impl Check {
    fn ok(name: &'static str, detail: impl Into<String>) -> Self {
        Check {
            name,
            status: Status::Ok,
            detail: detail.into(),
            advice: None,
        }
    }

    fn warn(name: &'static str, detail: impl Into<String>, advice: impl Into<String>) -> Self {
        Check {
            name,
            status: Status::Warn,
            detail: detail.into(),
            advice: Some(advice.into()),
        }
    }

    fn fail(name: &'static str, detail: impl Into<String>, advice: impl Into<String>) -> Self {
        Check {
            name,
            status: Status::Fail,
            detail: detail.into(),
            advice: Some(advice.into()),
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tag = match self.status {
            Status::Ok => "ok  ",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        };
        // One line per check, whatever a tool printed.
        let detail = self.detail.trim().replace('\n', "; ");
        write!(f, "{tag}  {:<13} {detail}", self.name)?;
        if let Some(advice) = &self.advice {
            write!(f, " -> {advice}")?;
        }
        Ok(())
    }
}

/// What the checks look at; [`Env::new`] gives this machine's defaults,
/// tests point single paths elsewhere.
#[derive(Debug, Clone)]
pub struct Env {
    /// Hearth's data directory.
    pub data_dir: PathBuf,
    /// The QEMU system emulator (a name looked up on `path`, or a path).
    pub qemu: PathBuf,
    /// The qcow2 tool.
    pub qemu_img: PathBuf,
    /// busybox-static's binary.
    pub busybox: PathBuf,
    /// Where guest RAM files go.
    pub shm: PathBuf,
    /// The accelerator probe's cache.
    pub accel_cache: PathBuf,
    /// The search path for tools.
    pub path: OsString,
}

impl Env {
    /// The defaults for `data_dir` on this machine.
    pub fn new(data_dir: &Path) -> Self {
        let host = hearth_host::host::HostConfig::new(data_dir);
        Env {
            data_dir: data_dir.to_owned(),
            qemu: host.qemu_binary,
            qemu_img: PathBuf::from("qemu-img"),
            busybox: PathBuf::from("/bin/busybox"),
            shm: PathBuf::from("/dev/shm"),
            accel_cache: host.accel_cache,
            path: std::env::var_os("PATH").unwrap_or_default(),
        }
    }
}

/// Runs every check, in report order.
pub fn run_checks(env: &Env) -> Vec<Check> {
    let qemu = qemu(env);
    let qemu_version = (qemu.status == Status::Ok).then(|| qemu.detail.clone());
    let mut checks = vec![
        root(),
        qemu,
        kvm(env, qemu_version.as_deref()),
        qemu_img(env),
        busybox(env),
        tool(
            env,
            "debootstrap",
            "debootstrap",
            "builds the default image",
            "debootstrap",
        ),
        tool(
            env,
            "mkfs.ext4",
            "mkfs.ext4",
            "makes root images",
            "e2fsprogs",
        ),
        tool(env, "apt-get", "apt-get", "fetches the guest kernel", "apt"),
        tool(
            env,
            "ip",
            "ip",
            "makes each sandbox's network namespace and TAP",
            "iproute2",
        ),
        tool(
            env,
            "nft",
            "nft",
            "sends each sandbox's traffic to the egress proxy",
            "nftables",
        ),
        shm(env),
        memory(),
        disk(env),
    ];
    checks.push(data_dir(env));
    checks
}

/// Whether no required check failed.
pub fn passed(checks: &[Check]) -> bool {
    checks.iter().all(|c| c.status != Status::Fail)
}

/// The report, one line per check.
pub fn report(checks: &[Check]) -> String {
    checks.iter().map(|c| format!("{c}\n")).collect()
}

fn root() -> Check {
    match effective_uid() {
        Some(0) => Check::ok("root", "running as root"),
        // Not fatal: artifacts built earlier and TCG work without root.
        Some(uid) => Check::warn(
            "root",
            format!("running as uid {uid}: building root images needs root"),
            "run hearth as root, at least for the first start",
        ),
        None => Check::warn(
            "root",
            "cannot read the effective uid from /proc/self/status",
            "make sure /proc is mounted",
        ),
    }
}

fn effective_uid() -> Option<u32> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// `name` if it names a path, else its first match on `path`.
fn which(path: &OsString, name: &Path) -> Option<PathBuf> {
    if name.components().count() > 1 {
        return name.is_file().then(|| name.to_owned());
    }
    std::env::split_paths(path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The first line of `bin --version`.
fn version(bin: &Path) -> Result<String, String> {
    let out = Command::new(bin)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    if !out.status.success() {
        return Err(format!("{} --version: {}", bin.display(), out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned())
}

fn qemu(env: &Env) -> Check {
    let Some(bin) = which(&env.path, &env.qemu) else {
        return Check::fail(
            "QEMU",
            format!("{} not found", env.qemu.display()),
            format!("{INSTALL} (Debian package qemu-system-x86)"),
        );
    };
    match version(&bin) {
        Ok(v) => Check::ok("QEMU", v),
        Err(e) => Check::fail(
            "QEMU",
            e,
            format!("reinstall it: {INSTALL} (Debian package qemu-system-x86)"),
        ),
    }
}

fn qemu_img(env: &Env) -> Check {
    let Some(bin) = which(&env.path, &env.qemu_img) else {
        return Check::fail(
            "qemu-img",
            format!(
                "{} not found (sandbox disks are qcow2 overlays)",
                env.qemu_img.display()
            ),
            format!("{INSTALL} (Debian package qemu-utils)"),
        );
    };
    match version(&bin) {
        Ok(v) => Check::ok("qemu-img", v),
        Err(e) => Check::fail(
            "qemu-img",
            e,
            format!("{INSTALL} (Debian package qemu-utils)"),
        ),
    }
}

/// KVM: forced, unopenable, the probe's cached answer (same boot and QEMU),
/// or else a quick look at whether QEMU can create a KVM vCPU at all.
fn kvm(env: &Env, qemu_version: Option<&str>) -> Check {
    const TCG: &str = "guests run under TCG (slower, fully working)";
    if let Some(accel) = hearth_vmm::accel::forced_accel() {
        return Check::ok(
            "KVM",
            format!("{accel} forced by {}", hearth_vmm::accel::ACCEL_ENV),
        );
    }
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        return Check::warn(
            "KVM",
            format!("unusable: cannot open /dev/kvm read-write ({e}); {TCG}"),
            "for KVM: enable virtualization for this machine and load the kvm module",
        );
    }
    let nested = if Path::new("/sys/module/kvm_pvm").exists() {
        " (nested PVM: kvm_pvm is loaded)"
    } else {
        ""
    };
    let Some(qemu_version) = qemu_version else {
        return Check::warn(
            "KVM",
            "/dev/kvm opens; cannot tell more without QEMU",
            "install QEMU (above)",
        );
    };
    if let Some(cached) = hearth_vmm::accel::cached_answer(&env.accel_cache)
        .filter(|c| c.qemu_version == qemu_version)
    {
        // The probe's reason ends with QEMU's whole stderr; its first line says it.
        let reason = cached.reason.lines().next().unwrap_or_default();
        return match cached.accel {
            hearth_vmm::Accel::Kvm => Check::ok("KVM", format!("usable: {reason} (boot probe)")),
            hearth_vmm::Accel::Tcg => Check::warn(
                "KVM",
                format!("unusable{nested}: {reason} (boot probe); {TCG}"),
                "nothing to do; HEARTH_ACCEL=kvm forces KVM",
            ),
        };
    }
    let Some(bin) = which(&env.path, &env.qemu) else {
        return Check::warn("KVM", "cannot find QEMU to check KVM", "install QEMU");
    };
    match kvm_vcpu_starts(&bin) {
        // A vCPU starts under PVM, and a guest kernel then hangs: only
        // `hearth up`'s boot probe can tell, and on PVM it says TCG.
        Ok(()) if !nested.is_empty() => Check::warn(
            "KVM",
            format!(
                "likely unusable (nested PVM: kvm_pvm is loaded; a vCPU starts, but guest kernels hang under it, which `hearth up`'s boot probe checks); {TCG}"
            ),
            "nothing to do; HEARTH_ACCEL=kvm forces KVM",
        ),
        Ok(()) => Check::ok(
            "KVM",
            "a KVM vCPU starts; `hearth up` confirms it with a boot probe",
        ),
        Err(why) => Check::warn(
            "KVM",
            format!("unusable{nested}: {why}; {TCG}"),
            "nothing to do; HEARTH_ACCEL=kvm forces KVM",
        ),
    }
}

/// Starts QEMU paused under KVM with `-cpu host` (what a guest gets): on
/// some nested hosts it aborts creating the vCPU. QEMU answers QMP only
/// from its main loop, which it enters once the machine (its vCPUs
/// included) is made: an answer to `query-status` means the vCPU was
/// created, an exit first that it was not. (A timer, "still running
/// after 1.5 s", passed a QEMU that had not yet got as far on a loaded
/// machine.)
fn kvm_vcpu_starts(qemu: &Path) -> Result<(), String> {
    use std::io::{BufRead, Write};
    let mut child = Command::new(qemu)
        .args([
            "-machine",
            "microvm",
            "-accel",
            "kvm",
            "-cpu",
            "host",
            "-display",
            "none",
            "-nodefaults",
            "-no-user-config",
            "-monitor",
            "none",
            "-serial",
            "none",
            "-qmp",
            "stdio",
            "-S",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", qemu.display()))?;
    let (tx, rx) = std::sync::mpsc::channel();
    if let Some(out) = child.stdout.take() {
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
    }
    if let Some(mut stdin) = child.stdin.take() {
        // Read once QEMU's main loop runs; a write to a QEMU that already
        // exited fails, and the exit below says why.
        let _ = stdin
            .write_all(b"{\"execute\":\"qmp_capabilities\"}\n{\"execute\":\"query-status\"}\n");
        std::mem::forget(stdin);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let answered = loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line.contains("\"status\"") => break Ok(()),
            Ok(_) => continue,
            // Its stdout closed: QEMU exited (or is exiting).
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break Err(None),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                break Err(Some("QEMU did not answer within 30 s".to_owned()))
            }
        }
    };
    if let Err(e) = child.kill() {
        if e.kind() != std::io::ErrorKind::InvalidInput {
            return Err(format!("kill the QEMU of the KVM check: {e}"));
        }
    }
    let status = child.wait().map_err(|e| format!("wait for QEMU: {e}"))?;
    match answered {
        Ok(()) => Ok(()),
        Err(Some(why)) => Err(why),
        Err(None) => {
            let mut err = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                let _ = pipe.read_to_string(&mut err);
            }
            let first = err
                .lines()
                .map(|l| l.trim_start_matches("qemu-system-x86_64: ").trim())
                .find(|l| !l.is_empty())
                .unwrap_or("no message")
                .to_owned();
            Err(format!(
                "QEMU exits creating a KVM vCPU with -cpu host ({status}: {first})"
            ))
        }
    }
}

fn busybox(env: &Env) -> Check {
    if !env.busybox.is_file() {
        return Check::fail(
            "busybox",
            format!(
                "{} is missing (the busybox image and the KVM probe use it)",
                env.busybox.display()
            ),
            format!("{INSTALL} (Debian package busybox-static)"),
        );
    }
    match hearth_image::elf::require_static(&env.busybox) {
        Ok(()) => Check::ok("busybox", format!("{} (static)", env.busybox.display())),
        Err(e) => Check::fail(
            "busybox",
            format!("{}: {e}", env.busybox.display()),
            format!("install the static build: {INSTALL} (Debian package busybox-static)"),
        ),
    }
}

fn tool(env: &Env, name: &'static str, bin: &str, why: &str, package: &str) -> Check {
    if let Some(found) = which(&env.path, Path::new(bin)) {
        return Check::ok(name, format!("{} ({why})", found.display()));
    }
    let sbin = ["/usr/sbin", "/sbin"]
        .iter()
        .map(|d| Path::new(d).join(bin))
        .find(|p| p.is_file());
    match sbin {
        Some(p) => Check::fail(
            name,
            format!("{} is not on PATH ({why})", p.display()),
            format!(
                "add {} to PATH",
                p.parent().unwrap_or(Path::new("/")).display()
            ),
        ),
        None => Check::fail(
            name,
            format!("{bin} not found ({why})"),
            format!("{INSTALL} (Debian package {package})"),
        ),
    }
}

/// Free bytes of the filesystem holding `path` (or its nearest existing
/// ancestor), from `df`.
fn free_bytes(path: &Path) -> Result<(u64, PathBuf), String> {
    let existing = path
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"))
        .to_owned();
    // coreutils' df, wherever PATH points.
    let df = ["/usr/bin/df", "/bin/df"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .unwrap_or("df");
    let out = Command::new(df)
        .args(["-B1", "--output=avail"])
        .arg(&existing)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run df: {e}"))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .map(|b| (b, existing.clone()))
        .ok_or_else(|| format!("df {} printed no free space", existing.display()))
}

fn human(bytes: u64) -> String {
    if bytes >= GIB {
        format!("{:.1} GiB", bytes as f64 / GIB as f64)
    } else {
        format!("{} MiB", bytes / MIB)
    }
}

fn shm(env: &Env) -> Check {
    if !env.shm.is_dir() {
        return Check::fail(
            "/dev/shm",
            format!(
                "{} is missing (guest RAM is a file there)",
                env.shm.display()
            ),
            "mount a tmpfs on /dev/shm",
        );
    }
    match free_bytes(&env.shm) {
        Ok((free, _)) if free < 512 * MIB => Check::fail(
            "/dev/shm",
            format!("{} free: not enough for one 512 MiB guest", human(free)),
            "enlarge it: mount -o remount,size=8G /dev/shm",
        ),
        Ok((free, _)) if free < 2 * GIB => Check::warn(
            "/dev/shm",
            format!("{} free (guest RAM lives here)", human(free)),
            "enlarge it for more guests: mount -o remount,size=8G /dev/shm",
        ),
        Ok((free, _)) => Check::ok("/dev/shm", format!("{} free (guest RAM)", human(free))),
        Err(e) => Check::warn("/dev/shm", e, "check that df works"),
    }
}

fn memory() -> Check {
    let available = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|kib| kib.parse::<u64>().ok())
            .map(|kib| kib * 1024)
    });
    match available {
        None => Check::warn(
            "memory",
            "cannot read MemAvailable from /proc/meminfo",
            "make sure /proc is mounted",
        ),
        Some(b) if b < 1024 * MIB => Check::fail(
            "memory",
            format!("{} available", human(b)),
            "free memory: Hearth and one guest need about 1 GiB",
        ),
        Some(b) if b < 2 * GIB => Check::warn(
            "memory",
            format!("{} available", human(b)),
            "only a few small guests will fit",
        ),
        Some(b) => Check::ok("memory", format!("{} available", human(b))),
    }
}

fn disk(env: &Env) -> Check {
    match free_bytes(&env.data_dir) {
        Ok((free, on)) if free < 2 * GIB => Check::fail(
            "disk",
            format!("{} free under {}", human(free), on.display()),
            "free space or choose another --data-dir: the images need about 2 GiB",
        ),
        Ok((free, on)) if free < 5 * GIB => Check::warn(
            "disk",
            format!("{} free under {}", human(free), on.display()),
            "sandbox disks will soon fill it",
        ),
        Ok((free, on)) => Check::ok(
            "disk",
            format!("{} free under {}", human(free), on.display()),
        ),
        Err(e) => Check::warn("disk", e, "check that df works"),
    }
}

fn data_dir(env: &Env) -> Check {
    let dir = &env.data_dir;
    let meta = match std::fs::metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Check::ok(
                "data dir",
                format!(
                    "{} does not exist yet (created private, mode 0700)",
                    dir.display()
                ),
            )
        }
        Err(e) => {
            return Check::fail(
                "data dir",
                format!("cannot stat {}: {e}", dir.display()),
                "choose another --data-dir",
            )
        }
    };
    if !meta.is_dir() {
        return Check::fail(
            "data dir",
            format!("{} is not a directory", dir.display()),
            "choose another --data-dir",
        );
    }
    let mode = meta.permissions().mode() & 0o7777;
    let chmod = format!("chmod 700 {}", dir.display());
    if mode & 0o022 != 0 {
        Check::fail(
            "data dir",
            format!(
                "{} is writable by others (mode {mode:04o}): they could replace images and keys",
                dir.display()
            ),
            chmod,
        )
    } else if mode & 0o005 != 0 {
        Check::warn(
            "data dir",
            format!("{} is readable by others (mode {mode:04o})", dir.display()),
            chmod,
        )
    } else {
        Check::ok("data dir", format!("{} (mode {mode:04o})", dir.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("hearth-doctor-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn missing_qemu_fails_with_install_advice() {
        let dir = temp_dir("noqemu");
        let mut env = Env::new(&dir);
        env.qemu = PathBuf::from("/nonexistent/qemu-system-x86_64");
        env.qemu_img = PathBuf::from("/nonexistent/qemu-img");
        let checks = run_checks(&env);
        let qemu = checks.iter().find(|c| c.name == "QEMU").unwrap();
        assert_eq!(qemu.status, Status::Fail);
        let line = qemu.to_string();
        assert!(line.starts_with("FAIL  QEMU"), "{line}");
        assert!(
            line.contains("/nonexistent/qemu-system-x86_64 not found"),
            "{line}"
        );
        assert!(line.contains("scripts/install-deps"), "{line}");
        assert!(line.contains("qemu-system-x86"), "{line}");
        let img = checks.iter().find(|c| c.name == "qemu-img").unwrap();
        assert_eq!(img.status, Status::Fail);
        assert!(img.to_string().contains("qemu-utils"));
        assert!(!passed(&checks));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_tools_fail_with_their_package() {
        let dir = temp_dir("notools");
        let mut env = Env::new(&dir);
        env.path = OsString::from("/nonexistent");
        env.busybox = PathBuf::from("/nonexistent/busybox");
        let checks = run_checks(&env);
        for (name, package) in [("busybox", "busybox-static"), ("mkfs.ext4", "e2fsprogs")] {
            let c = checks.iter().find(|c| c.name == name).unwrap();
            assert_eq!(c.status, Status::Fail, "{c}");
            let line = c.to_string();
            // Either not installed (install advice) or only in sbin (PATH advice).
            assert!(
                line.contains(package)
                    || line.contains("add /usr/sbin to PATH")
                    || line.contains("add /sbin to PATH"),
                "{line}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The probe's cached answer is used when it is from this boot and this
    /// QEMU, and its multi-line reason still makes one line.
    #[test]
    fn kvm_line_uses_the_cached_probe_answer() {
        let dir = temp_dir("cached");
        let env = Env::new(&dir);
        let Some(qemu) = which(&env.path, &env.qemu) else {
            eprintln!("no QEMU here: nothing to check");
            return;
        };
        let qemu_version = version(&qemu).unwrap();
        let entry = serde_json::json!({
            "accel": "tcg",
            "reason": "probe qemu ended with killed by signal 6 before HEARTH_PROBE_OK: boom\nsecond line",
            "kernel": "/k",
            "kernel_size": 1,
            "qemu_binary": "qemu-system-x86_64",
            "qemu_version": qemu_version,
            "boot_id": hearth_vmm::host::boot_id().unwrap(),
        });
        std::fs::write(&env.accel_cache, entry.to_string()).unwrap();
        let check = kvm(&env, Some(&qemu_version));
        let line = check.to_string();
        if hearth_vmm::accel::forced_accel().is_none() && Path::new("/dev/kvm").exists() {
            assert_eq!(check.status, Status::Warn, "{line}");
            assert!(
                line.contains("before HEARTH_PROBE_OK: boom (boot probe)"),
                "{line}"
            );
            assert!(line.contains("guests run under TCG"), "{line}");
        }
        assert!(!line.contains('\n'), "{line}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn data_dir_permissions() {
        let dir = temp_dir("perms");
        let env = Env::new(&dir);
        let set =
            |mode| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
        set(0o700);
        assert_eq!(data_dir(&env).status, Status::Ok);
        set(0o755);
        let c = data_dir(&env);
        assert_eq!(c.status, Status::Warn, "{c}");
        assert!(c.to_string().contains("chmod 700"), "{c}");
        set(0o777);
        assert_eq!(data_dir(&env).status, Status::Fail);
        set(0o770);
        assert_eq!(data_dir(&env).status, Status::Fail);
        let missing = Env::new(&dir.join("not-yet"));
        assert_eq!(data_dir(&missing).status, Status::Ok);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
