//! A host agent's settings.

use super::*;

/// Settings of a host agent.
#[derive(Clone, Debug)]
pub struct HostConfig {
    /// Persistent state: artifacts, VM records and disks.
    pub data_dir: PathBuf,
    /// Runtime state on tmpfs: sockets, logs, guest memory files.
    pub run_root: PathBuf,
    /// The QEMU binary ([`Host::start`]; unused by [`Host::start_with`]).
    pub qemu_binary: PathBuf,
    /// How long a boot may take until the guest agent answers, counted
    /// from when it got one of the boot slots.
    pub boot_timeout: Duration,
    /// How many cold boots run at once, from the VMM's start until the
    /// guest agent answers; the others wait their turn (still
    /// `provisioning`). A cold boot is CPU-bound, under TCG entirely: 30
    /// at once on 2 cores each took 30 times as long and all missed the
    /// boot timeout, where taking turns boots them all. Resumes from
    /// memory and pool claims do not wait. `None`: the host's CPUs under
    /// TCG, four times that under KVM ([`boot_slots`]).
    pub boot_slots: Option<usize>,
    /// How long a stop waits for the guest to power off before killing it.
    pub stop_grace: Duration,
    /// Where the KVM-or-TCG probe caches its answer ([`Host::start`]'s
    /// QEMU only).
    pub accel_cache: PathBuf,
    /// Raw virtio-serial ports every VM gets besides the agent's (see
    /// [`hearth_vmm::VmSpec::raw_ports`]); `hearth bench substrate` uses one
    /// to measure the bare channel. Empty in production.
    pub raw_ports: Vec<String>,
    /// How the host decides a running guest is wedged.
    pub liveness: Liveness,
    /// How often a running guest's clock is set to the host's again (it
    /// is also set at every handshake and resume; see [`crate::clock`]).
    /// Zero: only then.
    pub clock_interval: Duration,
    /// Guests return freed memory (virtio-balloon free page reporting; see
    /// [`hearth_vmm::VmSpec::free_page_reporting`]). On by default.
    pub free_page_reporting: bool,
    /// Where disks and saved memory are kept.
    pub storage: Storage,
    /// Give every VM a NIC in its own network namespace, whose traffic
    /// leaves only through the egress proxy with these settings (see
    /// [`crate::network`]). `None`: VMs have no network device.
    pub network: Option<hearth_egress::EgressSettings>,
    /// Run every VMM jailed (its own uid, namespaces, a minimal root,
    /// cgroup limits; see [`hearth_vmm::JailSpec`]). `None`: QEMU runs as
    /// this process's user, guarded only by its own seccomp filter.
    pub jail: Option<JailSettings>,
    /// How long a starting agent waits for the data directory's lock (see
    /// [`crate::lock`]): a previous agent may still be shutting down.
    pub lock_wait: Duration,
    /// Where the guest's kernel, initramfs and root images come from.
    pub images: GuestImages,
}

/// Where a host gets the artifacts its VMs boot ([`GuestArtifacts`]).
#[derive(Clone, Debug, Default)]
pub enum GuestImages {
    /// Built on first use and cached under `<data>/artifacts`
    /// ([`hearth_image::ensure_all`]): what a real guest boots.
    #[default]
    Build,
    /// These, for every image, never built: for a backend that boots no
    /// kernel (the fake VMM), which needs only a root image for the disk
    /// provider to base disks on.
    Fixed(Arc<GuestArtifacts>),
}

/// Settings of jailed VMMs.
#[derive(Clone, Copy, Debug)]
pub struct JailSettings {
    /// VM number `n` runs as uid and gid `uid_base + n`: no two VMMs of
    /// a host share a user.
    pub uid_base: u32,
    /// How many VMs may run jailed at once (uids reserved).
    pub slots: u32,
}

impl Default for JailSettings {
    fn default() -> Self {
        Self {
            uid_base: 1_600_000_000,
            slots: 65_536,
        }
    }
}

/// What a jailed VMM may use beyond its guest's RAM: QEMU itself, the TCG
/// translation cache, device buffers.
pub(crate) const VMM_MEMORY_OVERHEAD: ByteSize = ByteSize::mib(256);
/// Processes and threads of one jailed VMM (vCPUs, I/O workers).
pub(crate) const VMM_PIDS_MAX: u32 = 256;

/// Where a host keeps VM disks and saved memory.
#[derive(Clone, Debug)]
pub enum Storage {
    /// Generations in the store (the default): durable on object storage,
    /// snapshots, saved memory, resume on any host.
    Store(StoreSettings),
    /// qcow2 overlays on this host only: no snapshots, no saved memory.
    /// The baseline the block service is measured against.
    QcowOverlays,
}

/// Settings of [`Storage::Store`].
#[derive(Clone, Debug)]
pub struct StoreSettings {
    /// `file:///dir` (a local directory, the default `<data>/store`) or
    /// `s3://bucket/prefix?endpoint=…&region=…`.
    pub url: String,
    /// The disposable local cache of chunks.
    pub cache_dir: PathBuf,
    pub cache_max: ByteSize,
    /// How often a running VM's disk is committed (zero: only at stop and
    /// snapshot).
    pub commit_interval: Duration,
    /// The 32-byte master key file; the store's key-encryption key derives
    /// from it (created if absent).
    pub master_key_file: PathBuf,
}

impl StoreSettings {
    /// The defaults under `data_dir`.
    pub fn local(data_dir: &Path) -> Self {
        Self {
            url: format!("file://{}", data_dir.join("store").display()),
            cache_dir: data_dir.join("cache"),
            cache_max: ByteSize::gib(10),
            commit_interval: Duration::from_secs(60),
            master_key_file: data_dir.join("master.key"),
        }
    }
}

/// Liveness of running guests: the host pings each guest agent over its
/// held stream every `interval`; a guest that has answered no ping for
/// `unhealthy_after` is recorded unhealthy (the reason says so), and one
/// silent for `fail_after` is marked failed and its VMM killed, which ends
/// every request still waiting on it. Paused VMs are not pinged.
#[derive(Clone, Copy, Debug)]
pub struct Liveness {
    pub interval: Duration,
    pub unhealthy_after: Duration,
    pub fail_after: Duration,
}

impl Default for Liveness {
    fn default() -> Self {
        // Generous for TCG, where a guest under a fork bomb still answers
        // within a few seconds; a real wedge is caught in half a minute.
        Self {
            interval: Duration::from_secs(5),
            unhealthy_after: Duration::from_secs(10),
            fail_after: Duration::from_secs(30),
        }
    }
}

impl HostConfig {
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        let data_dir = data_dir.into();
        // Separate data dirs (tests, several agents) get separate runtime dirs.
        let tag = blake3_tag(&data_dir);
        Self {
            run_root: PathBuf::from("/dev/shm").join(format!("hearth-{tag}")),
            accel_cache: data_dir.join("accel.json"),
            storage: Storage::Store(StoreSettings::local(&data_dir)),
            data_dir,
            qemu_binary: PathBuf::from("qemu-system-x86_64"),
            boot_timeout: Duration::from_secs(90),
            boot_slots: None,
            stop_grace: Duration::from_secs(5),
            raw_ports: Vec::new(),
            liveness: Liveness::default(),
            clock_interval: Duration::from_secs(60),
            free_page_reporting: true,
            network: None,
            jail: None,
            lock_wait: Duration::from_secs(5),
            images: GuestImages::Build,
        }
    }
}
