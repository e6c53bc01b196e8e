//! The VMM layer of Hearth: a small [`Vmm`] trait and its backends.
//!
//! A host agent describes a VM with a [`VmSpec`] (vCPUs in millicores, memory
//! in bytes, kernel, initrd, disks, a per-VM run directory and the file that
//! backs guest RAM) and asks a [`Vmm`] to boot it. The result is a
//! [`VmInstance`]: a handle that can pause, resume, stop and kill the VM and
//! that reports, exactly once and to any number of waiters, how the VMM
//! process ended ([`ExitInfo`]).
//!
//! Backends:
//! - [`Qemu`] ([`qemu`]): QEMU's `microvm` machine, under KVM where a guest can
//!   really boot and under TCG everywhere else. Its QMP client
//!   ([`QmpClient`]) is public so that later work (memory snapshots through
//!   `migrate`) can send further commands.
//!
//! Host facts live beside the backends: [`accel::probe_accel`] decides once per
//! host (and caches) whether KVM can boot a real guest, and [`host`] reads
//! the host TSC frequency that TCG guests need on their kernel command line.
//!
//! Every error is a [`VmmError`] that names the VM, path or QMP command it is
//! about; failures during QEMU startup carry the tail of QEMU's own log.

use std::fmt;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use hearth_types::{ByteSize, MilliCpu, VmId};
use serde::{Deserialize, Serialize};

pub mod accel;
pub mod host;
pub mod qemu;

pub use accel::{probe_accel, ProbeOutcome};
pub use qemu::qmp::QmpClient;
pub use qemu::{Qemu, QemuConfig, QemuInstance, QemuStatus};

/// Everything a backend needs to boot one VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmSpec {
    pub id: VmId,
    /// The guest gets `cpu.whole_vcpus()` vCPUs (fractions round up).
    pub cpu: MilliCpu,
    /// Guest RAM; must be a positive whole number of MiB.
    pub memory: ByteSize,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    /// Extra kernel arguments from the caller (e.g. `hearth.image=busybox`).
    /// The backend adds its own base arguments in front. Each entry is one
    /// argument: no whitespace, no quotes.
    pub cmdline: Vec<String>,
    /// Block devices in order; the first one is `/dev/vda` in the guest.
    pub disks: Vec<DiskSpec>,
    /// Per-VM directory the backend writes into (sockets, console log, pid
    /// file, VMM log). The caller creates it before boot and removes it after
    /// the VM has exited.
    pub run_dir: PathBuf,
    /// File that backs guest RAM (normally on tmpfs). The backend replaces
    /// any file already there (a cold boot starts from zeroed memory), creates
    /// and sizes it; the caller removes it after the VM has exited.
    pub mem_path: PathBuf,
    /// Extra raw virtio-serial ports, by name (diagnostics and benchmarks:
    /// a byte pipe into the guest with no protocol on it). The guest sees
    /// each under `/sys/class/virtio-ports/*/name`; the host end is the unix
    /// socket [`qemu::RunFiles::raw_port`] in `run_dir`. Names are short
    /// and hold only `[a-z0-9.-]`. Normally empty.
    pub raw_ports: Vec<String>,
    /// A virtio-balloon device with free page reporting: the guest kernel
    /// hands pages it frees back to the host (QEMU punches them out of the
    /// memory file), so an idle guest's footprint shrinks to what it uses.
    pub free_page_reporting: bool,
}

/// One block device of a [`VmSpec`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskSpec {
    pub path: PathBuf,
    pub format: DiskFormat,
    pub read_only: bool,
}

/// On-disk format of a [`DiskSpec`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskFormat {
    Raw,
    Qcow2,
}

impl DiskFormat {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Raw => "raw",
            Self::Qcow2 => "qcow2",
        }
    }
}

/// How guests execute: hardware virtualization or QEMU's binary translator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Kvm => "kvm",
            Self::Tcg => "tcg",
        }
    }
}

impl fmt::Display for Accel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The string was neither `kvm` nor `tcg`.
#[derive(Debug, thiserror::Error)]
#[error("invalid accelerator {input:?}: expected \"kvm\" or \"tcg\"")]
pub struct ParseAccelError {
    input: String,
}

impl FromStr for Accel {
    type Err = ParseAccelError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "kvm" => Ok(Self::Kvm),
            "tcg" => Ok(Self::Tcg),
            _ => Err(ParseAccelError {
                input: s.to_owned(),
            }),
        }
    }
}

/// How a VMM process ended. Exactly one of the fields is set when the exit
/// status was known; both are `None` if it could not be collected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ExitInfo {
    /// Exit code, if the process exited normally.
    pub code: Option<i32>,
    /// Signal number, if a signal ended the process.
    pub signal: Option<i32>,
}

impl From<std::process::ExitStatus> for ExitInfo {
    fn from(status: std::process::ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        Self {
            code: status.code(),
            signal: status.signal(),
        }
    }
}

impl fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.code, self.signal) {
            (Some(code), _) => write!(f, "exit code {code}"),
            (None, Some(sig)) => write!(f, "killed by signal {sig}"),
            (None, None) => f.write_str("exit status unknown"),
        }
    }
}

/// A virtual machine monitor that can boot VMs.
pub trait Vmm: Send + Sync + 'static {
    type Instance: VmInstance;

    /// Start the VMM process for `spec` and return once it is ready to be
    /// controlled (the guest is still booting).
    fn boot(&self, spec: &VmSpec) -> impl Future<Output = Result<Self::Instance, VmmError>> + Send;
}

/// A running VM. Dropping the handle does not stop the VM.
pub trait VmInstance: Send + Sync + 'static {
    fn id(&self) -> VmId;
    /// PID of the VMM process.
    fn pid(&self) -> u32;
    fn accel(&self) -> Accel;
    /// Unix socket of the guest agent's port; the VMM listens, the host agent
    /// connects (once, for the VM's whole life).
    fn channel_path(&self) -> &Path;
    /// File that receives the guest's serial console.
    fn console_log(&self) -> &Path;
    /// Freeze the vCPUs.
    fn pause(&self) -> impl Future<Output = Result<(), VmmError>> + Send;
    /// Continue after [`VmInstance::pause`].
    fn resume(&self) -> impl Future<Output = Result<(), VmmError>> + Send;
    /// Ask the VMM to quit, wait up to `grace` for it to exit, then SIGKILL it.
    fn stop(&self, grace: Duration) -> impl Future<Output = Result<(), VmmError>> + Send;
    /// SIGKILL the VMM process and wait until it has exited.
    fn kill(&self) -> impl Future<Output = Result<(), VmmError>> + Send;
    /// Resolves once the VMM process has exited; any number of callers, any
    /// number of times.
    fn wait_exit(&self) -> impl Future<Output = ExitInfo> + Send;
}

/// Errors of the VMM layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VmmError {
    #[error("invalid spec for vm {vm}: {reason}")]
    InvalidSpec { vm: VmId, reason: String },

    #[error("host TSC frequency unknown ({detail}); TCG guests need it: set QemuConfig::tsc_khz")]
    TscUnknown { detail: String },

    #[error("prepare {path} for vm {vm}")]
    RunDir {
        vm: VmId,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("spawn {binary} for vm {vm}")]
    Spawn {
        vm: VmId,
        binary: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("qemu for vm {vm} (pid {pid}) ended during startup with {exit}; qemu.log ends with: {log_tail}")]
    EarlyExit {
        vm: VmId,
        pid: u32,
        exit: ExitInfo,
        log_tail: String,
    },

    #[error(
        "qemu for vm {vm} (pid {pid}) not ready after {waited:?}; qemu.log ends with: {log_tail}"
    )]
    StartTimeout {
        vm: VmId,
        pid: u32,
        waited: Duration,
        log_tail: String,
    },

    #[error("qemu for vm {vm} (pid {pid}) still running {waited:?} after SIGKILL")]
    ExitTimeout {
        vm: VmId,
        pid: u32,
        waited: Duration,
    },

    #[error("connect to qmp socket {path}")]
    QmpConnect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("qmp {command} on {path}: socket i/o failed")]
    QmpIo {
        path: PathBuf,
        command: String,
        #[source]
        source: io::Error,
    },

    #[error("qmp {command} on {path}: malformed message from qemu: {detail}")]
    QmpProtocol {
        path: PathBuf,
        command: String,
        detail: String,
        #[source]
        source: Option<serde_json::Error>,
    },

    #[error("qmp {command} on {path}: qemu answered {class}: {desc}")]
    QmpCommand {
        path: PathBuf,
        command: String,
        class: String,
        desc: String,
    },

    #[error("qmp {command} on {path}: no reply within {timeout:?}")]
    QmpTimeout {
        path: PathBuf,
        command: String,
        timeout: Duration,
    },

    #[error("qmp {command} on {path}: qemu closed the connection")]
    QmpClosed { path: PathBuf, command: String },

    #[error("qmp {command} on {path}: connection unusable: {reason}")]
    QmpBroken {
        path: PathBuf,
        command: String,
        reason: &'static str,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accel_round_trips_through_text_and_json() {
        assert_eq!(Accel::Kvm.to_string(), "kvm");
        assert_eq!("TCG".parse::<Accel>().ok(), Some(Accel::Tcg));
        assert!("xen".parse::<Accel>().is_err());
        assert_eq!(
            serde_json::to_string(&Accel::Tcg).ok().as_deref(),
            Some("\"tcg\"")
        );
    }

    #[test]
    fn exit_info_describes_itself() {
        let killed = ExitInfo {
            code: None,
            signal: Some(9),
        };
        assert_eq!(killed.to_string(), "killed by signal 9");
        assert_eq!(ExitInfo::default().to_string(), "exit status unknown");
    }
}
