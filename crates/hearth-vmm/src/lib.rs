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
//!   ([`QmpClient`]) is public for commands beyond the trait's.
//!
//! A VM can be saved ([`VmInstance::save`]; [`VmInstance::save_live`]
//! while it runs on: RAM and device state in one stream, or with
//! [`VmSpec::memory_file`] device state alone, RAM left in its file) and
//! restored ([`Vmm::restore`] from a [`RestoreFrom`]), a memory file also
//! copy-on-write so that many VMs start from one snapshot. Disks are image
//! files or NBD exports ([`DiskSource`]).
//!
//! A VM may have a NIC ([`NetAttach`]: a TAP the caller prepared in a
//! network namespace; the backend opens it and the VMM inherits it) and a
//! jail ([`JailSpec`]: an unprivileged user, namespaces, a minimal root and
//! cgroup [`Limits`]; see [`qemu::jail`]).
//!
//! A caller that chooses its backend at run time (the host agent: QEMU,
//! or a fake in its tests) holds it as a [`DynVmm`] ([`dynamic`]): every
//! [`Vmm`] is one, its VMs [`DynInstance`]s.
//!
//! Host facts live beside the backends: [`accel::probe_accel`] decides once per
//! host (and caches) whether KVM can boot a real guest, and [`host`] reads
//! the host TSC frequency that TCG guests need on their kernel command line.
//!
//! Every error is a [`VmmError`] that names the VM or path it is about;
//! failures during QEMU startup carry the tail of QEMU's own log, and a
//! backend's own failures (QMP, migration) are the source of
//! [`VmmError::Backend`].

use std::fmt;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use hearth_types::{ByteSize, MilliCpu, VmId};
use serde::{Deserialize, Serialize};

pub mod accel;
pub mod dynamic;
pub mod host;
pub mod qemu;
pub mod template;

pub use accel::{probe_accel, ProbeOutcome};
pub use dynamic::{DynInstance, DynVmm};
pub use qemu::qmp::{QmpClient, QmpError};
pub use qemu::{Qemu, QemuConfig, QemuInstance, QemuStatus};
pub use template::MemoryTemplate;

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
    /// File that backs guest RAM (normally on tmpfs) when `memory_file`.
    /// The backend replaces any file already there (a cold boot starts
    /// from zeroed memory), creates and sizes it; the caller removes it
    /// after the VM has exited. A restore maps [`RestoreFrom::memory`]
    /// instead and never replaces a file.
    pub mem_path: PathBuf,
    /// Guest RAM is the file at `mem_path`, a shared mapping: a save
    /// writes the device state alone and leaves the RAM in the file, which
    /// private restores can map copy-on-write. `false`: anonymous memory,
    /// which every save writes into the state with the device state; a
    /// save can then run while the guest runs ([`VmInstance::save_live`]),
    /// which on a file would allocate all of it (QEMU's pre-copy reads
    /// every page, and reading a hole of a tmpfs file allocates it).
    pub memory_file: bool,
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
    /// A virtio-net NIC on a TAP device the caller prepared; `None`: no NIC.
    pub net: Option<NetAttach>,
    /// Run the VMM confined ([`JailSpec`]); `None`: as the calling user,
    /// with the host's view of everything.
    pub jail: Option<JailSpec>,
}

/// A NIC of a [`VmSpec`]: a persistent TAP device the caller created in a
/// network namespace (`ip -n <ns> tuntap add dev <tap> mode tap`), with
/// its addresses and filtering. The backend only attaches to it: it opens
/// the TAP from inside `netns` and hands the descriptor to the VMM, which
/// then needs no network privilege at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetAttach {
    /// The namespace's nsfs file (e.g. `/run/netns/hearth-<id>`).
    pub netns: PathBuf,
    /// Name of the TAP device inside `netns`.
    pub tap: String,
    /// The guest NIC's MAC address.
    pub mac: [u8; 6],
}

impl NetAttach {
    /// The MAC in the usual `xx:xx:xx:xx:xx:xx` form.
    pub fn mac_string(&self) -> String {
        let m = self.mac;
        format!(
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

/// How a VMM process is confined: an unprivileged user, its own
/// namespaces, a root holding only the files it needs, and cgroup limits.
/// See [`qemu::jail`] for what exactly the QEMU backend does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JailSpec {
    /// The user the VMM runs as; not 0. Give each VM its own uid, so that one
    /// escaped VMM cannot touch another VM's files or processes.
    pub uid: u32,
    /// The group the VMM runs as (supplementary groups are cleared); not 0.
    pub gid: u32,
    pub limits: Limits,
}

/// Resource limits of a jailed VMM, enforced with cgroups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// CPU quota: `cpu` millicores per 100 ms period.
    pub cpu: MilliCpu,
    /// Memory limit of the whole VMM (guest RAM plus the VMM's overhead, as
    /// the caller computes it); swap is limited to the same total.
    pub memory_max: ByteSize,
    /// Most processes and threads the VMM may have.
    pub pids_max: u32,
}

/// One block device of a [`VmSpec`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskSpec {
    pub source: DiskSource,
    pub read_only: bool,
    /// The device's serial (`/sys/block/vdX/serial` in the guest), by
    /// which the guest finds a disk among several.
    pub serial: Option<String>,
}

/// Where a [`DiskSpec`]'s blocks come from. The guest sees the same
/// virtio-blk device either way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskSource {
    /// An image file on the host.
    File { path: PathBuf, format: DiskFormat },
    /// An export of an NBD server listening on a unix socket (a userspace
    /// block service). Only the device is part of a saved VM state, so a
    /// restore may name another socket for the same export.
    Nbd { socket: PathBuf, export: String },
}

impl DiskSpec {
    /// A writable image file.
    pub fn file(path: impl Into<PathBuf>, format: DiskFormat) -> Self {
        Self {
            source: DiskSource::File {
                path: path.into(),
                format,
            },
            read_only: false,
            serial: None,
        }
    }

    /// A writable NBD export on the unix socket `socket`; an empty `export`
    /// is the server's default export.
    pub fn nbd(socket: impl Into<PathBuf>, export: impl Into<String>) -> Self {
        Self {
            source: DiskSource::Nbd {
                socket: socket.into(),
                export: export.into(),
            },
            read_only: false,
            serial: None,
        }
    }

    /// The same disk, read-only (`/sys/block/vdX/ro` is 1 in the guest).
    pub fn with_read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// The same disk, with serial `serial` (at most 20 bytes, of
    /// `[A-Za-z0-9_-]`: QEMU's limit, and nothing its options parse).
    pub fn with_serial(mut self, serial: impl Into<String>) -> Self {
        self.serial = Some(serial.into());
        self
    }
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

    /// Start a VM from a [`VmInstance::save`]d state and return it running.
    /// `spec` must describe the same devices as the saved VM (machine,
    /// memory size, disks in the same order, ports); disk backends may
    /// differ (another NBD socket for the same export).
    fn restore(
        &self,
        spec: &VmSpec,
        from: &RestoreFrom,
    ) -> impl Future<Output = Result<Self::Instance, VmmError>> + Send;

    /// [`Vmm::restore`], but the vCPUs stay stopped: no guest code runs
    /// until [`VmInstance::resume`] (or ever: [`VmInstance::save`] or
    /// [`VmInstance::kill`] it). What a template's source is made with.
    fn restore_frozen(
        &self,
        spec: &VmSpec,
        from: &RestoreFrom,
    ) -> impl Future<Output = Result<Self::Instance, VmmError>> + Send;

    /// How this backend's guests execute.
    fn accel(&self) -> Accel;

    /// After its caller restarted: ends what a VMM of `id` started by an
    /// earlier caller may have left. That is the process `pid` (as
    /// [`VmInstance::vmm_pid`] gave it) if it is still the VMM of `id` (a
    /// PID may have been reused: nothing else is signalled), and the
    /// backend's own per-VM leftovers (QEMU: a jail's cgroups). Returns
    /// whether a VMM was still running; it is gone when this returns.
    fn reap_stale(
        &self,
        id: VmId,
        pid: Option<u32>,
    ) -> impl Future<Output = Result<bool, VmmError>> + Send;
}

/// A running VM. Dropping the handle does not stop the VM.
pub trait VmInstance: Send + Sync + 'static {
    fn id(&self) -> VmId;
    /// PID of the VMM process.
    fn pid(&self) -> u32;
    /// The PID a caller records to find the VMM again after a restart
    /// ([`Vmm::reap_stale`]); [`VmInstance::pid`] unless the backend's
    /// spawned process is not the VMM itself (QEMU under a jail).
    fn vmm_pid(&self) -> u32 {
        self.pid()
    }
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
    /// How long the vCPUs were frozen the last time they were stopped and
    /// resumed, as the VMM itself timed it; `None` when it cannot say.
    fn last_freeze(&self) -> Option<Duration> {
        None
    }
    /// Ask the VMM to quit, wait up to `grace` for it to exit, then SIGKILL it.
    fn stop(&self, grace: Duration) -> impl Future<Output = Result<(), VmmError>> + Send;
    /// SIGKILL the VMM process and wait until it has exited.
    fn kill(&self) -> impl Future<Output = Result<(), VmmError>> + Send;
    /// Resolves once the VMM process has exited; any number of callers, any
    /// number of times.
    fn wait_exit(&self) -> impl Future<Output = ExitInfo> + Send;
    /// Save the VM: freeze it, write its device state to `state_path`
    /// (created or replaced) and end the VMM. Guest RAM stays in the memory
    /// file, which from then on belongs to the snapshot and must not be
    /// written again (restore it with [`RestoreMemory::Private`] to share
    /// it). On failure the VM is left running as it was.
    fn save(&self, state_path: &Path) -> impl Future<Output = Result<SavedState, VmmError>> + Send;
    /// Save the VM live and keep it: its RAM and device state are written
    /// to `state_path` (created or replaced) while the guest runs on (the
    /// VMM's pre-copy: RAM is copied and re-copied as the guest writes it);
    /// the vCPUs are frozen only for the last pages written and the device
    /// state, and are still frozen when this returns, so that the caller
    /// can take what must match the memory (the disk) before it
    /// [`VmInstance::resume`]s the VM (it runs on from the same RAM, its
    /// connections, the guest agent's stream included, never cut) or stops
    /// it. Works whatever backs guest RAM (a private restore's too). The
    /// file is not synced (the caller copies it where it must last). A
    /// backend that cannot track the guest's writes while it copies
    /// (QEMU 7.2 under TCG) freezes the VM for the whole save instead.
    /// On failure the VM is left running as it was.
    fn save_live(
        &self,
        state_path: &Path,
    ) -> impl Future<Output = Result<LiveSaved, VmmError>> + Send;
}

/// What [`VmInstance::save_live`] wrote: guest RAM and device state in
/// one file, restored with [`RestoreMemory::InState`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveSaved {
    pub state: PathBuf,
    pub state_size: ByteSize,
    /// How long the vCPUs had been frozen when the save completed, as the
    /// VMM measured it (they stay frozen until resumed).
    pub frozen: Duration,
}

/// What [`VmInstance::save`] wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedState {
    /// Device state (vCPUs, devices, the guest's view of its disks).
    pub state: PathBuf,
    pub state_size: ByteSize,
    /// Guest RAM, exactly the VM's memory size: the VM's own memory file.
    /// `None` when RAM was not a file of its own (a private mapping of a
    /// snapshot, or anonymous memory after a restore from a live save):
    /// then `state` holds the RAM too, as a [`VmInstance::save_live`]'s.
    pub memory: Option<PathBuf>,
    pub memory_size: ByteSize,
    /// Bytes of guest RAM the save holds: what the memory file really
    /// holds (the rest are holes: pages the guest never touched or gave
    /// back), or the state's size when the RAM is in it.
    pub memory_allocated: ByteSize,
}

/// Where [`Vmm::restore`] takes a VM from.
#[derive(Debug, Clone)]
pub struct RestoreFrom {
    /// Device state written by [`VmInstance::save`].
    pub state: PathBuf,
    /// Where the guest RAM saved with it is.
    pub memory: RestoreMemory,
}

/// The RAM of a [`RestoreFrom`].
#[derive(Debug, Clone)]
pub enum RestoreMemory {
    /// `state` holds it (a [`VmInstance::save_live`], or a save of RAM in
    /// no file of its own): loaded into anonymous memory (not a fresh
    /// tmpfs file, which the load would allocate whole: it reads every
    /// page it is told is zero).
    InState,
    /// This file, which the VM takes over and writes as its RAM (it must
    /// be the spec's [`VmSpec::mem_path`]).
    File(PathBuf),
    /// This file mapped copy-on-write and never written, so any number of
    /// VMs may restore from it at once; each one's changes are private
    /// memory. The VMM opens it read-write (QEMU 7.2), so it must be
    /// trusted by every VM mapping it: see [`RestoreMemory::Template`].
    Private(PathBuf),
    /// A sealed [`MemoryTemplate`] mapped copy-on-write: shared like
    /// [`RestoreMemory::Private`], and no VMM can change it.
    Template(std::sync::Arc<MemoryTemplate>),
    /// `state` holds it, loaded into this new file (it must be the spec's
    /// [`VmSpec::mem_path`] of a [`VmSpec::memory_file`] spec), which the
    /// VM then owns as with [`RestoreMemory::File`]: a stream made into a
    /// RAM file, as a template's source needs. The load allocates the
    /// whole file on tmpfs (it reads every page it is told is zero).
    Unpack(PathBuf),
}

impl RestoreMemory {
    /// Whether the RAM is a copy-on-write mapping of something shared.
    pub fn is_private(&self) -> bool {
        matches!(self, Self::Private(_) | Self::Template(_))
    }
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

    #[error("open tap {tap} in {netns} for vm {vm}")]
    Net {
        vm: VmId,
        netns: PathBuf,
        tap: String,
        #[source]
        source: io::Error,
    },

    /// Confining the VMM failed: preparing the jail, or a step of the
    /// child process between fork and exec (`step` names it).
    #[error("jail of vm {vm}: {step}")]
    Jail {
        vm: VmId,
        step: String,
        #[source]
        source: io::Error,
    },

    /// A backend-specific failure (for QEMU: a QMP exchange, a migration),
    /// with the backend's own error as the source.
    #[error("{op} of vm {vm} failed")]
    Backend {
        vm: VmId,
        /// What was being done: `pause`, `save`, `restore`, a QMP command…
        op: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}

impl VmmError {
    /// A [`VmmError::Backend`] for `op` on `vm`.
    pub fn backend(
        vm: VmId,
        op: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        Self::Backend {
            vm,
            op,
            source: source.into(),
        }
    }
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
