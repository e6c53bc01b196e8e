//! Which accelerator this host can really use, decided once and cached.
//!
//! `/dev/kvm` opening is not enough: on nested hosts (e.g. PVM) it opens and
//! creates VMs, but a real guest kernel then hangs or QEMU aborts. So the
//! probe boots a real guest under KVM and waits, with a short deadline, for
//! the guest agent to print [`PROBE_MARKER`] (it does when the kernel
//! command line holds [`PROBE_KERNEL_ARG`], then powers off). Silence means
//! TCG. The answer is cached in a file keyed by the kernel, the QEMU version
//! and the host's boot id, so it is re-checked after any of them changes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hearth_types::{ByteSize, MilliCpu, VmId};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use crate::qemu::{Qemu, QemuConfig};
use crate::{Accel, ExitInfo, VmInstance, VmSpec, Vmm};

/// Environment variable that forces the answer (`kvm` or `tcg`).
pub const ACCEL_ENV: &str = "HEARTH_ACCEL";
/// Kernel argument that makes the guest agent print [`PROBE_MARKER`] and power off.
pub const PROBE_KERNEL_ARG: &str = "hearth.probe=1";
/// The console line that proves the guest booted.
pub const PROBE_MARKER: &str = "HEARTH_PROBE_OK";
/// A sensible probe deadline: a KVM guest prints the marker in well under a
/// second; a hung one never does.
pub const DEFAULT_PROBE_DEADLINE: Duration = Duration::from_secs(8);
/// How long to wait for `qemu --version`.
const VERSION_TIMEOUT: Duration = Duration::from_secs(5);
/// Console polling interval while probing.
const CONSOLE_POLL: Duration = Duration::from_millis(20);

/// The accelerator to use on this host. Never fails: anything short of a
/// proven KVM boot means [`Accel::Tcg`]. See the module docs.
pub async fn probe_accel(
    binary: &Path,
    kernel: &Path,
    initrd: &Path,
    cache_file: &Path,
    deadline: Duration,
) -> Accel {
    if let Some(forced) = forced_accel() {
        tracing::info!(accel = %forced, "accelerator forced by {ACCEL_ENV}");
        return forced;
    }
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        tracing::info!(accel = %Accel::Tcg, reason = %format!("cannot open /dev/kvm read-write: {e}"), "accelerator chosen");
        return Accel::Tcg;
    }
    let key = match CacheKey::gather(binary, kernel).await {
        Ok(key) => Some(key),
        Err(reason) => {
            tracing::warn!(%reason, "cannot key the accelerator cache; probing without it");
            None
        }
    };
    if let Some(key) = &key {
        match read_cache(cache_file) {
            Some(entry) if entry.key == *key => {
                tracing::info!(accel = %entry.accel, reason = %entry.reason, cache = %cache_file.display(), "accelerator from cache");
                return entry.accel;
            }
            Some(_) => {
                tracing::info!(cache = %cache_file.display(), "accelerator cache is stale; probing")
            }
            None => {}
        }
    }

    let cfg = QemuConfig {
        binary: binary.to_owned(),
        accel: Accel::Kvm,
        ..QemuConfig::default()
    };
    let outcome = run_probe_guest(cfg, kernel, initrd, deadline).await;
    let accel = if matches!(outcome, ProbeOutcome::Booted { .. }) {
        Accel::Kvm
    } else {
        Accel::Tcg
    };
    let reason = outcome.to_string();
    tracing::info!(%accel, %reason, "accelerator chosen by probe");
    if let (Some(key), true) = (key, outcome.is_conclusive()) {
        let entry = CacheEntry { accel, reason, key };
        if let Err(e) = write_cache(cache_file, &entry) {
            tracing::warn!(cache = %cache_file.display(), error = %e, "cannot write the accelerator cache");
        }
    }
    accel
}

/// The answer a probe cached in `cache_file`, as far as it can be checked
/// without a kernel: made on this boot of the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedAnswer {
    /// What the probe decided.
    pub accel: Accel,
    /// Why (the probe's outcome).
    pub reason: String,
    /// The first line of `qemu --version` it was made with.
    pub qemu_version: String,
}

/// The cached answer in `cache_file`, if there is one from this boot.
/// For reports (`hearth doctor`); [`probe_accel`] checks the whole key.
pub fn cached_answer(cache_file: &Path) -> Option<CachedAnswer> {
    let entry = read_cache(cache_file)?;
    let boot = crate::host::boot_id().ok()?;
    (entry.key.boot_id == boot).then_some(CachedAnswer {
        accel: entry.accel,
        reason: entry.reason,
        qemu_version: entry.key.qemu_version,
    })
}

/// The accelerator forced by [`ACCEL_ENV`], if set to a valid value.
pub fn forced_accel() -> Option<Accel> {
    let value = std::env::var(ACCEL_ENV).ok()?;
    match value.parse() {
        Ok(a) => Some(a),
        Err(e) => {
            tracing::warn!(error = %e, "ignoring {ACCEL_ENV}");
            None
        }
    }
}

/// What booting the probe guest showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// The marker appeared on the console.
    Booted { elapsed: Duration },
    /// No marker before the deadline (how nested KVM fails here).
    Silent { waited: Duration },
    /// QEMU ended without printing the marker (e.g. it aborted on an MSR).
    Exited { exit: ExitInfo, log_tail: String },
    /// The probe could not run for reasons of this host, not of the
    /// accelerator (cannot spawn, cannot create files); not worth caching.
    HostError(String),
}

impl ProbeOutcome {
    /// Whether the outcome says something about the accelerator.
    pub fn is_conclusive(&self) -> bool {
        !matches!(self, Self::HostError(_))
    }
}

impl std::fmt::Display for ProbeOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Booted { elapsed } => {
                write!(f, "probe guest printed {PROBE_MARKER} after {elapsed:?}")
            }
            Self::Silent { waited } => write!(f, "probe guest silent for {waited:?}"),
            Self::Exited { exit, log_tail } => {
                write!(
                    f,
                    "probe qemu ended with {exit} before {PROBE_MARKER}: {log_tail}"
                )
            }
            Self::HostError(e) => write!(f, "probe could not run: {e}"),
        }
    }
}

/// Boots a small guest with `cfg` (kernel argument [`PROBE_KERNEL_ARG`]) and
/// waits up to `deadline`, all included, for [`PROBE_MARKER`] on its console.
/// The VM is killed and its files removed before this returns.
pub async fn run_probe_guest(
    cfg: QemuConfig,
    kernel: &Path,
    initrd: &Path,
    deadline: Duration,
) -> ProbeOutcome {
    let started = Instant::now();
    let id = VmId::new();
    let run_dir = std::env::temp_dir().join(format!("hearth-probe-{id}"));
    let shm = Path::new("/dev/shm");
    let mem_path = if shm.is_dir() {
        shm.join(format!("hearth-probe-{id}.mem"))
    } else {
        run_dir.join("mem")
    };
    if let Err(e) = std::fs::create_dir_all(&run_dir) {
        return ProbeOutcome::HostError(format!("create {}: {e}", run_dir.display()));
    }
    let spec = VmSpec {
        id,
        cpu: MilliCpu::vcpus(1),
        memory: ByteSize::mib(128),
        kernel: kernel.to_owned(),
        initrd: initrd.to_owned(),
        cmdline: vec![PROBE_KERNEL_ARG.to_owned()],
        disks: Vec::new(),
        run_dir: run_dir.clone(),
        mem_path: mem_path.clone(),
        memory_file: false,
        raw_ports: Vec::new(),
        free_page_reporting: false,
        net: None,
        jail: None,
    };
    let qemu = Qemu::new(QemuConfig {
        start_timeout: cfg.start_timeout.min(deadline),
        ..cfg
    });
    let outcome = match qemu.boot(&spec).await {
        Ok(vm) => {
            let outcome = watch_console(&vm, started, deadline).await;
            if let Err(e) = vm.kill().await {
                tracing::error!(pid = vm.pid(), error = %e, "cannot kill the probe vm");
            }
            outcome
        }
        Err(crate::VmmError::EarlyExit { exit, log_tail, .. }) => {
            ProbeOutcome::Exited { exit, log_tail }
        }
        Err(crate::VmmError::StartTimeout { waited, .. }) => ProbeOutcome::Silent { waited },
        Err(e) => ProbeOutcome::HostError(e.to_string()),
    };
    for (what, res) in [
        ("run dir", std::fs::remove_dir_all(&run_dir)),
        ("memory file", std::fs::remove_file(&mem_path)),
    ] {
        if let Err(e) = res {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(error = %e, "cannot remove the probe's {what}");
            }
        }
    }
    outcome
}

async fn watch_console(
    vm: &crate::QemuInstance,
    started: Instant,
    deadline: Duration,
) -> ProbeOutcome {
    let mut console = ConsoleScan::default();
    loop {
        // Check exit first, then read: a guest that printed the marker and
        // powered off in between still counts.
        let exit = vm.exit_info();
        match console.scan(vm.console_log()).await {
            Ok(true) => {
                return ProbeOutcome::Booted {
                    elapsed: started.elapsed(),
                }
            }
            Ok(false) => {}
            Err(e) => {
                return ProbeOutcome::HostError(format!("read {}: {e}", vm.console_log().display()))
            }
        }
        if let Some(exit) = exit {
            return ProbeOutcome::Exited {
                exit,
                log_tail: console.tail(),
            };
        }
        if started.elapsed() >= deadline {
            return ProbeOutcome::Silent {
                waited: started.elapsed(),
            };
        }
        tokio::time::sleep(CONSOLE_POLL).await;
    }
}

/// Reads a growing console file incrementally, looking for the marker.
#[derive(Default)]
struct ConsoleScan {
    offset: u64,
    /// The last bytes seen, so a marker split across reads is still found.
    carry: Vec<u8>,
}

impl ConsoleScan {
    async fn scan(&mut self, path: &Path) -> std::io::Result<bool> {
        let mut file = match tokio::fs::File::open(path).await {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        file.seek(std::io::SeekFrom::Start(self.offset)).await?;
        let mut fresh = Vec::new();
        file.read_to_end(&mut fresh).await?;
        self.offset += fresh.len() as u64;
        self.carry.extend_from_slice(&fresh);
        let marker = PROBE_MARKER.as_bytes();
        let found = self.carry.windows(marker.len()).any(|w| w == marker);
        let keep = self.carry.len().saturating_sub(512);
        self.carry.drain(..keep);
        Ok(found)
    }

    fn tail(&self) -> String {
        String::from_utf8_lossy(&self.carry).trim().to_owned()
    }
}

/// What the cached answer depends on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct CacheKey {
    kernel: PathBuf,
    kernel_size: u64,
    qemu_binary: PathBuf,
    qemu_version: String,
    boot_id: String,
}

impl CacheKey {
    async fn gather(binary: &Path, kernel: &Path) -> Result<Self, String> {
        let kernel_size = std::fs::metadata(kernel)
            .map_err(|e| format!("stat {}: {e}", kernel.display()))?
            .len();
        let boot_id = crate::host::boot_id().map_err(|e| format!("read boot id: {e}"))?;
        let qemu_version = qemu_version(binary).await?;
        Ok(Self {
            kernel: kernel.to_owned(),
            kernel_size,
            qemu_binary: binary.to_owned(),
            qemu_version,
            boot_id,
        })
    }
}

/// First line of `qemu --version`.
async fn qemu_version(binary: &Path) -> Result<String, String> {
    let run = tokio::process::Command::new(binary)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(VERSION_TIMEOUT, run)
        .await
        .map_err(|_| {
            format!(
                "{} --version took over {VERSION_TIMEOUT:?}",
                binary.display()
            )
        })?
        .map_err(|e| format!("run {} --version: {e}", binary.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} --version: {}",
            binary.display(),
            ExitInfo::from(out.status)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.lines().next().unwrap_or_default().trim().to_owned())
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct CacheEntry {
    accel: Accel,
    reason: String,
    #[serde(flatten)]
    key: CacheKey,
}

fn read_cache(path: &Path) -> Option<CacheEntry> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(cache = %path.display(), error = %e, "cannot read the accelerator cache");
            return None;
        }
    };
    match serde_json::from_slice(&bytes) {
        Ok(entry) => Some(entry),
        Err(e) => {
            tracing::warn!(cache = %path.display(), error = %e, "ignoring a malformed accelerator cache");
            None
        }
    }
}

/// Writes the cache atomically (temp file, then rename).
fn write_cache(path: &Path, entry: &CacheEntry) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let json = serde_json::to_vec_pretty(entry).map_err(std::io::Error::other)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}", std::process::id()));
    std::fs::write(&tmp, json)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_entry_round_trips() {
        let entry = CacheEntry {
            accel: Accel::Tcg,
            reason: "probe guest silent for 8s".to_owned(),
            key: CacheKey {
                kernel: "/k/vmlinuz".into(),
                kernel_size: 42,
                qemu_binary: "qemu-system-x86_64".into(),
                qemu_version: "QEMU emulator version 7.2.22".to_owned(),
                boot_id: "b".to_owned(),
            },
        };
        let json = serde_json::to_string(&entry).unwrap_or_default();
        assert!(json.contains("\"accel\":\"tcg\""), "{json}");
        let back: Option<CacheEntry> = serde_json::from_str(&json).ok();
        assert_eq!(
            back.map(|e| (e.accel, e.key)),
            Some((Accel::Tcg, entry.key))
        );
    }

    #[tokio::test]
    async fn console_scan_finds_a_split_marker() {
        let dir = std::env::temp_dir().join(format!("hearth-scan-{}", VmId::new()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let log = dir.join("console.log");
        let mut scan = ConsoleScan::default();
        assert!(!scan.scan(&log).await.expect("missing file is fine"));
        std::fs::write(&log, "boot...\nHEARTH_PRO").expect("write");
        assert!(!scan.scan(&log).await.expect("scan"));
        std::fs::write(&log, "boot...\nHEARTH_PROBE_OK\n").expect("write");
        assert!(scan.scan(&log).await.expect("scan"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
