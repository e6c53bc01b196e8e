//! The host agent's VM manager: boots VMs from Hearth's guest artifacts,
//! connects to their agents, watches them, and reconciles after a restart.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hearth_image::{GuestArtifacts, ImageConfig, ImageName, Progress};
use hearth_types::{ByteSize, MilliCpu, VmId};
use hearth_vmm::{Accel, DynInstance, DynVmm, VmSpec};

/// A running VM of whichever backend the host drives. The host speaks
/// only the [`hearth_vmm::Vmm`]/[`hearth_vmm::VmInstance`] operations,
/// through their object-safe forms ([`DynVmm`], [`DynInstance`]): the
/// backend is chosen once, when the host starts ([`Host::start`]: QEMU;
/// [`Host::start_with`]: any other, such as the fake of its tests).
pub(crate) type Instance = dyn DynInstance;

mod templates;
pub use templates::TEMPLATE_IDLE;

use crate::block::GenerationDisks;
use crate::disks::{DiskProvider, DiskRequest, QcowOverlays};
use crate::guest::GuestClient;
use crate::vm::{BootFrom, MemoryVolumes, Vm, VmRecord, VmState};
pub use hearth_hostapi::types::{Captured, CreateVm, Resize};
pub use hearth_types::error_chain;

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
const VMM_MEMORY_OVERHEAD: ByteSize = ByteSize::mib(256);
/// Processes and threads of one jailed VMM (vCPUs, I/O workers).
const VMM_PIDS_MAX: u32 = 256;

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

fn blake3_tag(p: &Path) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    p.hash(&mut h);
    format!("{:012x}", h.finish() & 0xffff_ffff_ffff)
}

/// Why a host operation failed.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("no vm {0}")]
    NotFound(VmId),
    #[error("vm {id} is {state:?}, not {wanted}")]
    WrongState {
        id: VmId,
        state: VmState,
        wanted: &'static str,
    },
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("prepare guest artifacts")]
    Image(#[from] hearth_image::ImageError),
    #[error("vm {id}: {what}")]
    Io {
        id: VmId,
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("vmm")]
    Vmm(#[from] hearth_vmm::VmmError),
    #[error("vm {id} did not become ready: {reason}")]
    Boot { id: VmId, reason: String },
    #[error("guest")]
    Guest(#[from] crate::guest::GuestError),
    #[error("storage")]
    Store(#[from] hearth_store::StoreError),
    #[error("{0} needs the store (this host keeps qcow2 overlays)")]
    NeedsStore(&'static str),
}

/// The host agent's view of its VMs.
pub struct Host {
    cfg: HostConfig,
    images: ImageConfig,
    vmm: Arc<dyn DynVmm>,
    accel: Accel,
    artifacts: tokio::sync::Mutex<HashMap<ImageName, Arc<GuestArtifacts>>>,
    vms: Mutex<HashMap<VmId, Arc<Vm>>>,
    /// Root disks (see `disks.rs`).
    disks: Arc<dyn DiskProvider>,
    /// The same provider when it is the store's: snapshots and saved
    /// memory need it.
    generations: Option<Arc<GenerationDisks>>,
    /// VM networks and the egress proxy, when enabled.
    network: Option<crate::network::Network>,
    /// Turns of cold boots ([`HostConfig::boot_slots`]).
    boot_turns: tokio::sync::Semaphore,
    /// Jail uids in use (offsets from `JailSettings::uid_base`).
    jail_slots: Mutex<std::collections::BTreeMap<u32, std::fs::File>>,
    /// Pool templates, one per member shape (`host/templates.rs`).
    templates: templates::Templates,
    /// The last check of the store (`store_check.rs`).
    pub(crate) store_health: crate::store_check::HealthCell,
    /// This agent's hold on its data directory; the last field, so it is
    /// released after everything else is dropped.
    _lock: crate::lock::DataDirLock,
}

impl Host {
    /// A host whose VMs run under QEMU ([`hearth_vmm::Qemu`]): prepares
    /// the kernel and initramfs (building them on first use), decides KVM
    /// or TCG with them ([`hearth_vmm::probe_accel`], cached in
    /// [`HostConfig::accel_cache`]), and reconciles VMs left by a previous
    /// run.
    pub async fn start(
        cfg: HostConfig,
        progress: Arc<dyn Progress>,
    ) -> Result<Arc<Self>, HostError> {
        Self::start_on(cfg, progress, None).await
    }

    /// A host whose VMs run under `vmm` (its guests run under
    /// `vmm.accel()`; [`HostConfig::qemu_binary`] and
    /// [`HostConfig::accel_cache`] are QEMU's and unused). Everything
    /// else is [`Host::start`]'s: the data directory's lock, the disk
    /// provider, the network and jails as configured, and the
    /// reconciliation of VMs a previous run left, whose VMMs `vmm` reaps
    /// ([`hearth_vmm::Vmm::reap_stale`]).
    pub async fn start_with(
        cfg: HostConfig,
        progress: Arc<dyn Progress>,
        vmm: impl hearth_vmm::Vmm,
    ) -> Result<Arc<Self>, HostError> {
        Self::start_on(cfg, progress, Some(Arc::new(vmm))).await
    }

    /// [`Host::start`] (`vmm` absent: QEMU) and [`Host::start_with`].
    async fn start_on(
        cfg: HostConfig,
        progress: Arc<dyn Progress>,
        vmm: Option<Arc<dyn DynVmm>>,
    ) -> Result<Arc<Self>, HostError> {
        let io = |what: &str, e| HostError::Io {
            id: VmId::new(),
            what: what.to_owned(),
            source: e,
        };
        private_dir(&cfg.data_dir).map_err(|e| io("secure the data dir", e))?;
        // Before anything under the directory is read or changed.
        let lock = crate::lock::DataDirLock::acquire(&cfg.data_dir, cfg.lock_wait).await?;
        private_dir(&cfg.data_dir.join("vms")).map_err(|e| io("create data dir", e))?;
        private_dir(&cfg.run_root).map_err(|e| io("create run dir", e))?;
        // Paths handed to a jailed VMM must be plain absolute paths (no
        // `..`, no relative parts): they are recreated inside its root.
        let mut cfg = cfg;
        cfg.data_dir =
            std::fs::canonicalize(&cfg.data_dir).map_err(|e| io("resolve the data dir", e))?;
        cfg.run_root =
            std::fs::canonicalize(&cfg.run_root).map_err(|e| io("resolve the run dir", e))?;
        let images = ImageConfig::new(&cfg.data_dir);
        // The busybox image is tiny; the kernel + initramfs are what the probe needs.
        let base = match &cfg.images {
            GuestImages::Build => {
                let (images, p) = (images.clone(), progress.clone());
                Arc::new(
                    tokio::task::spawn_blocking(move || {
                        hearth_image::ensure_all(&images, ImageName::Busybox, p.as_ref())
                    })
                    .await
                    .map_err(|e| HostError::Invalid(format!("artifact task: {e}")))??,
                )
            }
            GuestImages::Fixed(a) => a.clone(),
        };
        let vmm: Arc<dyn DynVmm> = match vmm {
            Some(vmm) => vmm,
            None => {
                let accel = hearth_vmm::probe_accel(
                    &cfg.qemu_binary,
                    &base.kernel.boot_image,
                    &base.initramfs.path,
                    &cfg.accel_cache,
                    hearth_vmm::accel::DEFAULT_PROBE_DEADLINE,
                )
                .await;
                Arc::new(hearth_vmm::Qemu::new(hearth_vmm::QemuConfig {
                    binary: cfg.qemu_binary.clone(),
                    accel,
                    ..hearth_vmm::QemuConfig::default()
                }))
            }
        };
        let accel = vmm.accel();
        tracing::info!(%accel, "guests will run under {accel}");
        let mut artifacts = HashMap::new();
        artifacts.insert(ImageName::Busybox, base);
        let (disks, generations): (Arc<dyn DiskProvider>, _) = match &cfg.storage {
            Storage::Store(s) => {
                ensure_master_key(&s.master_key_file).map_err(|source| HostError::Io {
                    id: VmId::new(),
                    what: "create the master key".into(),
                    source,
                })?;
                let kek = hearth_store::KeyFileKek::load(&s.master_key_file)?;
                let store = hearth_store::Store::open(
                    hearth_store::StoreConfig {
                        url: s.url.clone(),
                        cache_dir: s.cache_dir.clone(),
                        cache_max_bytes: s.cache_max.bytes(),
                    },
                    Arc::new(kek),
                )
                .await?;
                let g = Arc::new(GenerationDisks::new(
                    store,
                    &cfg.data_dir,
                    s.commit_interval,
                ));
                (g.clone(), Some(g))
            }
            Storage::QcowOverlays => (Arc::new(QcowOverlays::new(&cfg.data_dir)), None),
        };
        let network = match &cfg.network {
            Some(settings) => Some(crate::network::Network::new(
                hearth_egress::Egress::new(settings.clone())
                    .map_err(|e| HostError::Invalid(format!("egress proxy: {e}")))?,
            )),
            None => None,
        };
        let turns = cfg
            .boot_slots
            .unwrap_or_else(|| boot_slots(accel, host_cpus()));
        tracing::info!(slots = turns, "cold boots run {turns} at a time");
        let host = Arc::new(Self {
            network,
            boot_turns: tokio::sync::Semaphore::new(turns.max(1)),
            jail_slots: Mutex::new(std::collections::BTreeMap::new()),
            cfg,
            images,
            vmm,
            accel,
            artifacts: tokio::sync::Mutex::new(artifacts),
            vms: Mutex::new(HashMap::new()),
            disks,
            generations,
            store_health: crate::store_check::HealthCell::new(),
            templates: templates::Templates::default(),
            _lock: lock,
        });
        host.recover().await;
        host.remove_stale_templates().await;
        let weak = Arc::downgrade(&host);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(TEMPLATE_IDLE / 10);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(host) = weak.upgrade() else { return };
                host.sweep_templates(TEMPLATE_IDLE).await;
            }
        });
        Ok(host)
    }

    /// The store-backed disk provider, when this host keeps its disks in
    /// the store (benchmarks and tests count its bytes).
    pub fn generations(&self) -> Option<&Arc<GenerationDisks>> {
        self.generations.as_ref()
    }

    /// Proves the store this host keeps disks in takes a write, gives it
    /// back and deletes it ([`hearth_store::Store::probe`]); `who` names
    /// the prober. Nothing to prove without a store.
    pub async fn probe_store(&self, who: &str) -> Result<(), hearth_store::StoreError> {
        match &self.generations {
            Some(g) => g.store().probe(who).await,
            None => Ok(()),
        }
    }

    pub fn config(&self) -> &HostConfig {
        &self.cfg
    }

    /// The object store this host writes, as it reports it to a control
    /// plane (hosts reporting the same URL share one store; empty without
    /// a store).
    pub fn store_url(&self) -> String {
        match &self.cfg.storage {
            Storage::Store(s) => s.url.clone(),
            Storage::QcowOverlays => String::new(),
        }
    }

    /// `message` with this host's directories replaced by placeholders:
    /// what reaches a sandbox's status and the API never names a host path.
    pub fn redact(&self, message: &str) -> String {
        let mut out = message.to_owned();
        for (dir, name) in [
            (&self.cfg.data_dir, "<data>"),
            (&self.cfg.run_root, "<run>"),
        ] {
            let dir = dir.to_string_lossy();
            if !dir.is_empty() {
                out = out.replace(dir.as_ref(), name);
            }
        }
        out
    }

    /// The error as the API may show it: its chain, host paths redacted.
    pub fn public_error(&self, e: &HostError) -> String {
        self.redact(&error_chain(e))
    }

    /// Bytes free for disks on the filesystem of the data directory.
    pub fn disk_available(&self) -> u64 {
        self.disks.available()
    }

    pub fn accel(&self) -> Accel {
        self.accel
    }

    /// Builds (or finds) the artifacts of an image.
    pub async fn artifacts(
        &self,
        image: ImageName,
        progress: Arc<dyn Progress>,
    ) -> Result<Arc<GuestArtifacts>, HostError> {
        if let GuestImages::Fixed(a) = &self.cfg.images {
            return Ok(a.clone());
        }
        let mut cache = self.artifacts.lock().await;
        if let Some(a) = cache.get(&image) {
            return Ok(a.clone());
        }
        let images = self.images.clone();
        let built = tokio::task::spawn_blocking(move || {
            hearth_image::ensure_all(&images, image, progress.as_ref())
        })
        .await
        .map_err(|e| HostError::Invalid(format!("artifact task: {e}")))??;
        let built = Arc::new(built);
        cache.insert(image, built.clone());
        Ok(built)
    }

    fn vms(&self) -> std::sync::MutexGuard<'_, HashMap<VmId, Arc<Vm>>> {
        self.vms.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn list(&self) -> Vec<VmRecord> {
        let mut v: Vec<_> = self.vms().values().map(|vm| vm.record()).collect();
        v.sort_by_key(|r| r.created_at_ms);
        v
    }

    pub fn get(&self, id: VmId) -> Result<Arc<Vm>, HostError> {
        self.vms().get(&id).cloned().ok_or(HostError::NotFound(id))
    }

    /// The guest of a ready VM.
    pub fn guest(&self, id: VmId) -> Result<GuestClient, HostError> {
        let vm = self.get(id)?;
        match (vm.state(), vm.guest()) {
            (VmState::Ready, Some(g)) => Ok(g),
            (state, _) => Err(HostError::WrongState {
                id,
                state,
                wanted: "ready",
            }),
        }
    }

    /// Boots a VM and waits until its guest agent answers.
    pub async fn create_vm(self: &Arc<Self>, req: CreateVm) -> Result<Arc<Vm>, HostError> {
        check_resources(req.memory, req.cpu)?;
        let artifacts = self
            .artifacts(req.image, Arc::new(hearth_image::QuietProgress))
            .await?;
        let id = req.id.unwrap_or_default();
        if self.vms().contains_key(&id) {
            return Err(HostError::Conflict(format!("vm {id} already exists")));
        }
        let dir = self.cfg.data_dir.join("vms").join(id.to_string());
        let run_dir = self.cfg.run_root.join(id.to_string());
        let io = |what: &str| {
            let what = what.to_owned();
            move |source| HostError::Io { id, what, source }
        };
        private_dir(&dir).map_err(io("create vm dir"))?;
        private_dir(&run_dir).map_err(io("create run dir"))?;
        let vm = Arc::new(Vm::new(
            VmRecord::provisioning(id, &req, self.accel.to_string()),
            dir.clone(),
            run_dir.clone(),
        ));
        *vm.net_config.lock().unwrap_or_else(|p| p.into_inner()) = req.network.clone();
        self.vms().insert(id, vm.clone());
        // A pool member, or one of several VMs made from one snapshot's
        // memory, is its shape's template's copy (see `host/templates.rs`),
        // else booted like any VM.
        let template = match req.pooled || req.share_memory {
            true => self.pool_template(&req, &artifacts).await,
            false => None,
        };
        let how = template.as_deref().map_or(BootAs::Sandbox, BootAs::Member);
        let vm = match self.boot_or_fail(vm, &artifacts, !req.existing, how).await {
            Ok(vm) => vm,
            Err(e) => {
                // The VMM could not restore from it: the template is bad.
                // Any other failure (the member deleted while it booted,
                // its network, its guest) is the member's own.
                if let (Some(t), HostError::Vmm(_)) = (&template, &e) {
                    self.discard_template(t).await;
                }
                return Err(e);
            }
        };
        if let Some(t) = &template {
            tracing::info!(vm = %id, template = %t.source(), boot_ms = vm.record().boot_ms, "pool member restored from its template");
        }
        if req.pooled {
            self.warm_up(&vm).await;
            // Nothing runs in a member until its claim; a pause that fails
            // leaves no half-made member behind.
            if let Err(e) = self.pause(id).await {
                if let Err(k) = self.kill(id).await {
                    tracing::warn!(vm = %id, error = %error_chain(&k), "cannot kill a pool member that did not pause");
                }
                return Err(e);
            }
        }
        Ok(vm)
    }

    /// Runs one command, as a sandbox's first exec would: the shell's
    /// pages and (under emulation) its translated code are then warm,
    /// which otherwise is most of a claimed sandbox's first exec (107 of
    /// 157 ms under TCG). Logged when it fails: a warm-up is no promise.
    async fn warm_up(&self, vm: &Vm) {
        let Some(g) = vm.guest() else { return };
        let warm = hearth_guest_proto::ExecRequest {
            command: "true".into(),
            ..Default::default()
        };
        match tokio::time::timeout(self.cfg.boot_timeout, g.run(warm)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(vm = %vm.id, error = %e, "a warm-up exec failed"),
            Err(_) => tracing::warn!(vm = %vm.id, "a warm-up exec did not finish"),
        }
    }

    /// Binds the paused pool member `id` to its sandbox (see
    /// [`hearth_hostapi::HostApi::claim_vm`]): the sandbox's egress policy
    /// first (the proxy enforces it from the guest's first packet), then
    /// the VM runs again, its clock is set and its guest takes a fresh
    /// identity and the sandbox's environment, before the claim answers.
    /// A member whose guest cannot take its identity is killed: it must
    /// not serve a sandbox with another VM's CRNG state.
    pub async fn claim(
        self: &Arc<Self>,
        id: VmId,
        fence: u64,
        net: hearth_hostapi::SandboxNet,
    ) -> Result<VmRecord, HostError> {
        let vm = self.get(id)?;
        let inst = self.running_instance(&vm, VmState::Paused, "an unclaimed pool member")?;
        // One claim wins.
        let mut won = false;
        vm.update(|r| {
            if r.pooled {
                r.pooled = false;
                r.fence = r.fence.max(fence);
                won = true;
            }
        });
        if !won {
            return Err(HostError::WrongState {
                id,
                state: vm.state(),
                wanted: "an unclaimed pool member",
            });
        }
        let policy = net.policy.clone();
        *vm.net_config.lock().unwrap_or_else(|p| p.into_inner()) = Some(net);
        if let Some(network) = &self.network {
            network.set_policy(id, policy);
        }
        let started = Instant::now();
        let mut resumed_ms = 0;
        let bound = async {
            let identity = fresh_identity(id)?;
            inst.resume().await?;
            resumed_ms = started.elapsed().as_millis() as u64;
            // Its record says `paused` until it is bound: `ready` is what
            // tells the control plane (its reconcile, too) that the
            // sandbox may run code, which it must not before its identity.
            let guest = vm.guest().ok_or(HostError::WrongState {
                id,
                state: vm.state(),
                wanted: "ready",
            })?;
            // Independent requests on their own streams, so their round
            // trips overlap; all are answered before the claim is.
            let cfg = self.guest_config(&vm);
            let (_, identified, configured) = tokio::join!(
                crate::clock::sync(&vm, &guest, "claim"),
                guest.set_identity(&identity),
                async {
                    match &cfg {
                        Some(cfg) => guest.configure(cfg).await,
                        None => Ok(()),
                    }
                }
            );
            identified?;
            configured?;
            self.make_mounts(&vm).await?;
            if !vm.transition_from(&[VmState::Paused], VmState::Ready, None) {
                return Err(HostError::WrongState {
                    id,
                    state: vm.state(),
                    wanted: "a member being claimed",
                });
            }
            Ok::<_, HostError>(())
        };
        // A guest that does not answer fails the claim like a boot's.
        let bound = match tokio::time::timeout(self.cfg.boot_timeout, bound).await {
            Ok(r) => r,
            Err(_) => Err(HostError::Boot {
                id,
                reason: format!(
                    "the claimed guest did not take its identity within {:?}",
                    self.cfg.boot_timeout
                ),
            }),
        };
        if let Err(e) = bound {
            tracing::warn!(vm = %id, error = %error_chain(&e), "claim failed; killing the member");
            if let Err(k) = self.kill(id).await {
                tracing::warn!(vm = %id, error = %error_chain(&k), "cannot kill a member whose claim failed");
            }
            return Err(e);
        }
        tracing::info!(
            vm = %id,
            resume_ms = resumed_ms,
            total_ms = started.elapsed().as_millis() as u64,
            "pool member claimed"
        );
        Ok(vm.record())
    }

    /// Boots a stopped (or failed) VM again from its disk; a non-persistent
    /// VM starts from a fresh disk.
    pub async fn start_vm(self: &Arc<Self>, id: VmId) -> Result<Arc<Vm>, HostError> {
        self.start_vm_with(id, Resize::default()).await
    }

    /// [`Host::start_vm`] with new resources, which take effect at this
    /// boot: memory and CPU as given, and a larger disk (the overlay grows
    /// and the guest grows its filesystem; a disk never shrinks).
    pub async fn start_vm_with(
        self: &Arc<Self>,
        id: VmId,
        resize: Resize,
    ) -> Result<Arc<Vm>, HostError> {
        let vm = self.get(id)?;
        let current = vm.record();
        check_resources(
            resize.memory.unwrap_or(current.memory),
            resize.cpu.unwrap_or(current.cpu),
        )?;
        match vm.state() {
            VmState::Ready => return Ok(vm),
            VmState::Stopped | VmState::Failed => {}
            state => {
                return Err(HostError::WrongState {
                    id,
                    state,
                    wanted: "stopped",
                })
            }
        }
        let rec = vm.record();
        let artifacts = self
            .artifacts(rec.image, Arc::new(hearth_image::QuietProgress))
            .await?;
        if !vm.transition(VmState::Provisioning, Some("starting".into())) {
            return Err(HostError::WrongState {
                id,
                state: vm.state(),
                wanted: "stopped",
            });
        }
        private_dir(&vm.run_dir).map_err(|source| HostError::Io {
            id,
            what: "create run dir".into(),
            source,
        })?;
        vm.update(|r| {
            r.memory = resize.memory.unwrap_or(r.memory);
            r.cpu = resize.cpu.unwrap_or(r.cpu);
            r.disk = r.disk.max(resize.disk);
            r.fence = r.fence.max(resize.fence.unwrap_or(0));
        });
        if let Some(net) = resize.network {
            *vm.net_config.lock().unwrap_or_else(|p| p.into_inner()) = Some(net);
        }
        self.boot_or_fail(vm, &artifacts, !rec.persistent, BootAs::Sandbox)
            .await
    }

    async fn boot_or_fail(
        self: &Arc<Self>,
        vm: Arc<Vm>,
        artifacts: &GuestArtifacts,
        fresh_disk: bool,
        how: BootAs<'_>,
    ) -> Result<Arc<Vm>, HostError> {
        match self.boot(&vm, artifacts, fresh_disk, how).await {
            Ok(()) => Ok(vm),
            Err(e) => {
                let reason = self.redact(&error_chain(&e));
                if let Some(inst) = vm.instance() {
                    if let Err(e) = inst.kill().await {
                        tracing::warn!(vm = %vm.id, error = %e, "cannot kill the vmm of a failed boot");
                    }
                }
                // Logged on failure; the boot's own error is what counts.
                let _ = self.after_exit(&vm).await;
                // A stop that began meanwhile ends it as stopped instead.
                vm.transition_from(&[VmState::Provisioning], VmState::Failed, Some(reason));
                Err(e)
            }
        }
    }

    async fn boot(
        self: &Arc<Self>,
        vm: &Arc<Vm>,
        artifacts: &GuestArtifacts,
        fresh_disk: bool,
        how: BootAs<'_>,
    ) -> Result<(), HostError> {
        let started = Instant::now();
        let id = vm.id;
        let rec = vm.record();
        // Resume from memory: what the last stop saved, else (first boot
        // only) the snapshot's.
        let resume = match (&rec.saved, &rec.from) {
            // A member's memory is its template's.
            _ if matches!(how, BootAs::Member(_)) => None,
            (Some(saved), _) => Some((saved.clone(), false, false)),
            (
                None,
                Some(BootFrom {
                    memory: Some(m),
                    require_memory,
                    ..
                }),
            ) if rec.boot_ms.is_none() => Some((m.clone(), true, *require_memory)),
            _ => None,
        };
        let restoring = resume.is_some() || matches!(how, BootAs::Member(_));
        let spec = self
            .machine(vm, &rec, artifacts, fresh_disk, how, restoring)
            .await?;
        // Whether the guest resumed memory other VMs may resume too.
        let mut shared_memory = false;
        // A cold boot holds its turn until the guest answers.
        let (instance, turn) = match resume {
            None => match how {
                BootAs::Member(t) => {
                    // A snapshot's memory, as every VM made from it has.
                    shared_memory = t.of_memory();
                    (self.vmm.restore(&spec, &t.restore()).await?, None)
                }
                BootAs::Sandbox | BootAs::TemplateSource => self.boot_cold(vm, &spec).await?,
            },
            Some((volumes, shared, required)) => {
                match self.resume_from_memory(vm, &spec, &volumes, shared).await {
                    Ok(i) => {
                        shared_memory = shared;
                        (i, None)
                    }
                    Err(e) if !required => {
                        tracing::warn!(vm = %id, error = %error_chain(&e), "cannot resume from saved memory; booting cold");
                        self.boot_cold(vm, &spec).await?
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        self.attach(vm, instance).await?;
        drop(turn);
        if shared_memory {
            self.refresh_identity(vm).await?;
        }
        self.make_mounts(vm).await?;
        let boot_ms = started.elapsed().as_millis() as u64;
        let resumed = rec.saved.is_some();
        vm.update(|r| {
            r.boot_ms = Some(boot_ms);
            r.template = match how {
                BootAs::Member(t) => Some(t.source()),
                BootAs::Sandbox | BootAs::TemplateSource => None,
            };
            // Resumed (or not): the saved memory no longer matches the disk.
            r.saved = None;
        });
        if resumed {
            remove_dir_logged(&vm.dir.join("saved"));
        }
        if !vm.transition(VmState::Ready, None) {
            return Err(HostError::Boot {
                id,
                reason: "vm left provisioning during boot".into(),
            });
        }
        tracing::info!(vm = %id, boot_ms, "vm ready");
        Ok(())
    }

    /// What a VM needs before its VMM starts: its disk (new, or the one it
    /// had; grown only on a fresh start, not a `restoring` one: saved
    /// devices must match), its network and its jail slot; and then its
    /// machine.
    async fn machine(
        &self,
        vm: &Arc<Vm>,
        rec: &VmRecord,
        artifacts: &GuestArtifacts,
        fresh_disk: bool,
        how: BootAs<'_>,
        restoring: bool,
    ) -> Result<VmSpec, HostError> {
        let id = vm.id;
        let from_disk: Option<&str> = match (how, &rec.from) {
            (BootAs::Member(t), _) => Some(&t.disk),
            (_, Some(f)) => Some(&f.disk),
            (_, None) => None,
        };
        let root = self
            .disks
            .prepare(DiskRequest {
                vm: id,
                dir: &vm.dir,
                run_dir: &vm.run_dir,
                base: &artifacts.rootfs.path,
                from: from_disk,
                // The saved devices must match: no growth on a resume.
                size: if restoring { None } else { rec.disk },
                fresh: fresh_disk,
                persistent: rec.persistent,
                fence: rec.fence,
            })
            .await?;
        if let Some(network) = &self.network {
            let cfg = vm
                .net_config
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            let net = network
                .setup(id, cfg.unwrap_or_default().policy)
                .await
                .map_err(|e| HostError::Boot {
                    id,
                    reason: format!("network: {e}"),
                })?;
            *vm.net.lock().unwrap_or_else(|p| p.into_inner()) = Some(net);
        }
        if self.cfg.jail.is_some() {
            self.take_jail_slot(vm)?;
            for file in [&artifacts.kernel.boot_image, &artifacts.initramfs.path] {
                world_readable(file).map_err(|source| HostError::Io {
                    id,
                    what: format!("make {} readable to jailed VMMs", file.display()),
                    source,
                })?;
            }
        }
        Ok(self.spec(vm, rec, artifacts, root, how))
    }

    /// Starts the VMM for a cold boot once a boot slot is free; the turn
    /// it returns is held until the guest answers.
    async fn boot_cold(
        &self,
        vm: &Vm,
        spec: &hearth_vmm::VmSpec,
    ) -> Result<(Arc<Instance>, Option<tokio::sync::SemaphorePermit<'_>>), HostError> {
        let waited = Instant::now();
        let turn = match self.boot_turns.try_acquire() {
            Ok(turn) => turn,
            Err(_) => {
                vm.update(|r| r.reason = Some("waiting for a boot slot".into()));
                // The semaphore is never closed.
                let turn = self
                    .boot_turns
                    .acquire()
                    .await
                    .map_err(|_| HostError::Boot {
                        id: vm.id,
                        reason: "the host is shutting down".into(),
                    })?;
                tracing::info!(vm = %vm.id, waited_ms = waited.elapsed().as_millis() as u64, "boot slot taken");
                vm.update(|r| r.reason = Some("starting".into()));
                turn
            }
        };
        Ok((self.vmm.boot(spec).await?, Some(turn)))
    }

    /// The VM's machine: the same for a boot and for a resume of its saved
    /// state.
    fn spec(
        &self,
        vm: &Vm,
        rec: &VmRecord,
        artifacts: &GuestArtifacts,
        root: hearth_vmm::DiskSpec,
        how: BootAs<'_>,
    ) -> VmSpec {
        VmSpec {
            id: vm.id,
            cpu: rec.cpu,
            memory: rec.memory,
            kernel: artifacts.kernel.boot_image.clone(),
            initrd: artifacts.initramfs.path.clone(),
            cmdline: vec![format!("hearth.image={}", rec.image)],
            disks: vec![root],
            run_dir: vm.run_dir.clone(),
            mem_path: vm.run_dir.join("guest.mem"),
            // Anonymous (captures save while the guest runs), but for a
            // pool template's source, whose RAM becomes the template.
            memory_file: matches!(how, BootAs::TemplateSource),
            raw_ports: self.cfg.raw_ports.clone(),
            // One device set for every VM of this host, however it is
            // made: a saved VM is restored with the devices it was saved
            // with (a pool member claimed and then forked, a fork of a
            // fork), or QEMU refuses the stream. Where RAM is a template's,
            // the guest's reports are refused by the template's seals (a
            // page a guest frees there stays until the VM stops); a
            // template's source, not sealed yet, leaves what its guest
            // freed out of the template.
            free_page_reporting: self.cfg.free_page_reporting,
            net: vm
                .net
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .map(crate::network::Network::attach_spec),
            jail: self.jail_spec(vm, rec),
        }
    }

    /// The VM's jail, when VMMs are jailed and it holds a slot.
    fn jail_spec(&self, vm: &Vm, rec: &VmRecord) -> Option<hearth_vmm::JailSpec> {
        let settings = self.cfg.jail?;
        let slot = (*vm.jail_slot.lock().unwrap_or_else(|p| p.into_inner()))?;
        let uid = settings.uid_base.checked_add(slot)?;
        Some(hearth_vmm::JailSpec {
            uid,
            gid: uid,
            limits: hearth_vmm::Limits {
                cpu: rec.cpu,
                memory_max: ByteSize(rec.memory.bytes() + VMM_MEMORY_OVERHEAD.bytes()),
                pids_max: VMM_PIDS_MAX,
            },
        })
    }

    /// Gives the VM the lowest free jail uid (kept until its VMM exits).
    /// A uid is free when no VM of this agent holds it and no other
    /// process on the machine does: each taken uid holds an exclusive
    /// `flock` on `JAIL_UID_LOCKS/<uid>` (two Hearth instances on one
    /// machine gave their VMMs the same uids: issue 16, finding 9b).
    fn take_jail_slot(&self, vm: &Vm) -> Result<(), HostError> {
        let Some(settings) = self.cfg.jail else {
            return Ok(());
        };
        let mut mine = vm.jail_slot.lock().unwrap_or_else(|p| p.into_inner());
        if mine.is_some() {
            return Ok(());
        }
        let mut used = self.jail_slots.lock().unwrap_or_else(|p| p.into_inner());
        for n in 0..settings.slots {
            if used.contains_key(&n) {
                continue;
            }
            let Some(uid) = settings.uid_base.checked_add(n) else {
                break;
            };
            if let Some(lock) =
                lock_jail_uid(Path::new(JAIL_UID_LOCKS), uid).map_err(|source| HostError::Io {
                    id: vm.id,
                    what: format!("lock jail uid {uid} in {JAIL_UID_LOCKS}"),
                    source,
                })?
            {
                used.insert(n, lock);
                *mine = Some(n);
                return Ok(());
            }
        }
        Err(HostError::Invalid(format!(
            "all {} jail uids are in use on this machine",
            settings.slots
        )))
    }

    fn release_jail_slot(&self, vm: &Vm) {
        if let Some(slot) = vm
            .jail_slot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            // Dropping the file releases its lock.
            self.jail_slots
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&slot);
        }
    }

    /// Takes a started VMM as the VM's: waits for its guest agent and
    /// watches both from then on.
    async fn attach(
        self: &Arc<Self>,
        vm: &Arc<Vm>,
        instance: Arc<Instance>,
    ) -> Result<(), HostError> {
        let id = vm.id;
        hold_instance(vm, &instance);

        // The guest agent answers once the kernel has booted; QEMU dying
        // meanwhile ends the wait at once.
        let connect = GuestClient::connect(instance.channel_path(), self.cfg.boot_timeout);
        let guest = tokio::select! {
            g = connect => g.map_err(|e| HostError::Boot { id, reason: format!("{e}; console: {}", console_tail(instance.console_log())) })?,
            exit = instance.wait_exit() => return Err(HostError::Boot { id, reason: format!("the vmm exited during boot ({exit}); console: {}", console_tail(instance.console_log())) }),
        };
        // Before the guest runs anything for the sandbox (a failure is
        // logged; the periodic sync tries again).
        crate::clock::sync(vm, &guest, "handshake").await;
        if let Some(cfg) = self.guest_config(vm) {
            guest.configure(&cfg).await.map_err(|e| HostError::Boot {
                id,
                reason: format!("configure the guest's network: {e}"),
            })?;
        }
        *vm.guest.lock().unwrap_or_else(|p| p.into_inner()) = Some(guest.clone());
        tokio::spawn(watch_vm(self.clone(), vm.clone(), instance, guest));
        Ok(())
    }

    /// Gives a guest that resumed a snapshot's memory (which every VM
    /// created from that snapshot resumes) an identity of its own; a guest
    /// agent too old to take one (memory captured before protocol 4) is
    /// logged, and runs on with the snapshot's.
    async fn refresh_identity(&self, vm: &Vm) -> Result<(), HostError> {
        let id = vm.id;
        let Some(guest) = vm.guest() else {
            return Err(HostError::Boot {
                id,
                reason: "no guest channel after the resume".into(),
            });
        };
        if guest.protocol_version < hearth_guest_proto::IDENTITY_VERSION {
            tracing::warn!(vm = %id, protocol = guest.protocol_version, "the snapshot's guest agent cannot take a fresh identity; the VM keeps the snapshot's CRNG state, machine id and boot id");
            return Ok(());
        }
        guest
            .set_identity(&fresh_identity(id)?)
            .await
            .map_err(|e| HostError::Boot {
                id,
                reason: format!("a fresh identity after resuming a snapshot's memory: {e}"),
            })
    }

    /// Makes the sandbox's mounts in the guest (see `mounts.rs`).
    async fn make_mounts(&self, vm: &Vm) -> Result<(), HostError> {
        let Some(guest) = vm.guest() else {
            return Err(HostError::Boot {
                id: vm.id,
                reason: "no guest channel to make its mounts".into(),
            });
        };
        let has_network =
            self.network.is_some() && vm.net.lock().unwrap_or_else(|p| p.into_inner()).is_some();
        crate::mounts::make(vm, &guest, has_network).await
    }

    /// What the guest is told at each handshake when the VM has a network.
    fn guest_config(&self, vm: &Vm) -> Option<hearth_guest_proto::GuestConfig> {
        let network = self.network.as_ref()?;
        vm.net.lock().unwrap_or_else(|p| p.into_inner()).as_ref()?;
        let cfg = vm
            .net_config
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        Some(network.guest_config(cfg.unwrap_or_default().env))
    }

    /// Applies a new egress policy and environment to a VM: the proxy
    /// enforces the policy on its next connection and request, a running
    /// guest gets the environment for its next command; a stopped VM keeps
    /// them for its next start.
    pub async fn set_network(
        &self,
        id: VmId,
        net: hearth_hostapi::SandboxNet,
    ) -> Result<(), HostError> {
        let vm = self.get(id)?;
        let policy = net.policy.clone();
        *vm.net_config.lock().unwrap_or_else(|p| p.into_inner()) = Some(net);
        let Some(network) = &self.network else {
            return Ok(());
        };
        if !network.set_policy(id, policy) {
            return Ok(());
        }
        if let (Some(cfg), Some(guest)) = (self.guest_config(&vm), vm.guest()) {
            guest.configure(&cfg).await?;
        }
        Ok(())
    }

    /// The egress proxy's counters of each VM with a network.
    pub fn egress_metrics(&self) -> Vec<(String, hearth_egress::EgressCounters)> {
        self.network
            .as_ref()
            .map(|n| n.egress().metrics())
            .unwrap_or_default()
    }

    /// What each VM with a running VMM costs the host (CPU time and
    /// resident memory of the VMM process itself, not the jail's
    /// intermediate parent), by VM id.
    pub fn vm_usage(&self) -> Vec<(String, hearth_hostapi::VmUsage)> {
        let running: Vec<(VmId, u32)> = self
            .vms()
            .values()
            .filter_map(|vm| Some((vm.id, vm.instance()?.vmm_pid())))
            .collect();
        running
            .into_iter()
            .filter_map(|(id, pid)| Some((id.to_string(), crate::usage::measure(pid)?)))
            .collect()
    }

    /// Detaches the VM's network (proxy and namespace), logging failures.
    async fn release_network(&self, vm: &Vm) {
        let net = vm.net.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let (Some(network), Some(net)) = (&self.network, net) {
            if let Err(e) = network.teardown(net).await {
                tracing::warn!(vm = %vm.id, error = %e, "cannot remove the vm's network namespace");
            }
        }
    }

    /// Starts the VM's VMM from saved memory: the VM's own, or (`shared`)
    /// a snapshot's, of which each host keeps one local copy. The memory is
    /// copied to the VM's RAM file on tmpfs (its data only), which the VM
    /// then owns: a copy-on-write mapping of the snapshot file would be
    /// faster, but QEMU 7.2 punches holes into it when the guest reports
    /// free pages, under every other VM mapping it.
    async fn resume_from_memory(
        &self,
        vm: &Vm,
        spec: &VmSpec,
        volumes: &MemoryVolumes,
        shared: bool,
    ) -> Result<Arc<Instance>, HostError> {
        let fetched = self.fetch_memory(vm, volumes, shared).await?;
        // A live save's RAM is in its state: QEMU loads it into a new file.
        if let Some(memory) = &fetched.memory {
            copy_memory(vm.id, memory, &spec.mem_path, "copy saved memory to tmpfs").await?;
        }
        let from = hearth_vmm::RestoreFrom {
            state: fetched.state,
            memory: match fetched.memory {
                Some(_) => hearth_vmm::RestoreMemory::File(spec.mem_path.clone()),
                None => hearth_vmm::RestoreMemory::InState,
            },
        };
        Ok(self.vmm.restore(spec, &from).await?)
    }

    /// Saved memory on this host, fetched from the store if it is not:
    /// a snapshot's (`shared`, which every VM made from it resumes) or the
    /// VM's own (its last stop's).
    async fn fetch_memory(
        &self,
        vm: &Vm,
        volumes: &MemoryVolumes,
        shared: bool,
    ) -> Result<crate::memory::Fetched, HostError> {
        let store = self.store("resuming from memory")?;
        let dir = match shared {
            true => self.snapshot_memory_dir(&volumes.memory),
            false => vm.dir.join("saved"),
        };
        crate::memory::fetch(store, volumes, &dir).await
    }

    /// Where this host keeps its copy of a snapshot's memory (named by its
    /// memory volume).
    fn snapshot_memory_dir(&self, memory_volume: &str) -> PathBuf {
        self.cfg.data_dir.join("snapshots").join(memory_volume)
    }

    fn store(&self, what: &'static str) -> Result<&hearth_store::Store, HostError> {
        self.generations
            .as_ref()
            .map(|g| g.store())
            .ok_or(HostError::NeedsStore(what))
    }

    /// Stops the VM keeping its memory (LangSmith's
    /// `preserve_memory_on_stop`): the VMM saves its device state and
    /// exits, the disk is committed, and memory and state go to the store
    /// (and stay on this host), so the next start resumes the running
    /// processes. A VM that cannot be saved is stopped gracefully instead.
    pub async fn stop_saving_memory(&self, id: VmId) -> Result<VmRecord, HostError> {
        let vm = self.get(id)?;
        let state = vm.state();
        let Some(inst) = vm.instance() else {
            return self.stop(id).await;
        };
        if !matches!(state, VmState::Ready | VmState::Paused) || self.generations.is_none() {
            return self.stop(id).await;
        }
        if !vm.transition(VmState::Stopping, Some("saving memory".into())) {
            return Ok(vm.record());
        }
        let saved_dir = vm.dir.join("saved");
        let started = Instant::now();
        // Should the resume fail, the cold boot finds the guest's writes.
        guest_sync(&vm).await;
        let saved = match self.save_memory(&vm, &*inst, &saved_dir).await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(vm = %id, error = %error_chain(&e), "cannot save memory; stopping without it");
                if let Err(e) = inst.kill().await {
                    tracing::warn!(vm = %id, error = %e, "cannot kill the vmm");
                }
                // A release failure is logged and named in the reason.
                let released = self.after_exit(&vm).await;
                let reason = match released {
                    Ok(()) => "memory was not saved".to_owned(),
                    Err(e) => format!("memory was not saved; {}", self.public_error(&e)),
                };
                vm.transition(VmState::Stopped, Some(reason));
                return Ok(vm.record());
            }
        };
        tracing::info!(vm = %id, ms = started.elapsed().as_millis() as u64, memory = %saved.memory_size, "saved memory");
        vm.update(|r| r.saved = Some(saved));
        vm.transition(VmState::Stopped, None);
        Ok(vm.record())
    }

    /// Saves device state and memory into `dir` and the store; the VMM
    /// has exited and the disk is committed when this returns Ok.
    async fn save_memory(
        &self,
        vm: &Vm,
        inst: &Instance,
        dir: &Path,
    ) -> Result<MemoryVolumes, HostError> {
        let id = vm.id;
        private_dir(dir).map_err(|source| HostError::Io {
            id,
            what: "create the saved-memory dir".into(),
            source,
        })?;
        // Which files the directory holds says which kind of save it is.
        let live = crate::memory::live_path(dir);
        match std::fs::remove_file(&live) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(HostError::Io {
                    id,
                    what: "remove an earlier saved memory".into(),
                    source: e,
                })
            }
            _ => {}
        }
        let saved = inst.save(&dir.join("state")).await?;
        match &saved.memory {
            Some(memory) => {
                copy_memory(id, memory, &dir.join("memory"), "keep the saved memory").await?;
            }
            // The RAM is in the state (it was in no file of the VM's own).
            None => std::fs::rename(&saved.state, &live).map_err(|source| HostError::Io {
                id,
                what: "keep the saved memory".into(),
                source,
            })?,
        };
        // The VMM is gone: commit the disk the memory belongs with, and
        // free the tmpfs copy.
        self.after_exit(vm).await?;
        let store = self.store("saving memory")?;
        let rec = vm.record();
        let scope = crate::memory::scope_of(id)?;
        let prefix = format!("vm-{id}");
        let volumes = match saved.memory {
            Some(_) => {
                crate::memory::import(
                    store,
                    &scope,
                    &prefix,
                    &dir.join("memory"),
                    &dir.join("state"),
                    rec.fence,
                )
                .await?
            }
            None => {
                crate::memory::import_live(store, &scope, &prefix, &live, rec.memory, rec.fence)
                    .await?
            }
        };
        Ok(volumes)
    }

    /// Captures the VM's disk as the snapshot volume `name` (sharing every
    /// chunk with the VM), and with `include_memory` its running memory as
    /// `<name>-mem` and `<name>-state`. A running VM keeps running: for its
    /// memory its vCPUs are frozen while its device state is written, the
    /// data of its RAM file copied and its disk committed (most of the disk
    /// was committed just before, while it ran), then it runs on in the
    /// same VMM (`paused_ms` says for how long; streams open on its guest
    /// agent stay open). Without memory the disk is committed as it is
    /// (the guest syncs first): crash-consistent.
    pub async fn capture(
        self: &Arc<Self>,
        id: VmId,
        name: &str,
        include_memory: bool,
    ) -> Result<Captured, HostError> {
        let gens = self
            .generations
            .clone()
            .ok_or(HostError::NeedsStore("snapshots"))?;
        let snap: hearth_store::VolumeId = name
            .parse()
            .map_err(|_| HostError::Invalid(format!("bad snapshot volume name {name}")))?;
        let vm = self.get(id)?;
        let rec = vm.record();
        let running = matches!(vm.state(), VmState::Ready | VmState::Paused);
        // The snapshot will name the disk's chunks: the scope they are in
        // is left to GC from now on, and the disk's later chunks go to a
        // fresh one (`Volume::share`). Marked before the commit below.
        gens.share(id).await?;
        let mut paused_ms = None;
        let (disk, memory) = if running && include_memory {
            let (disk, memory, paused) = self.capture_running(&vm, &gens, name).await?;
            paused_ms = Some(paused.as_millis() as u64);
            (disk, memory)
        } else if running {
            guest_sync(&vm).await;
            let m = gens
                .commit(id)
                .await?
                .ok_or_else(|| HostError::Invalid(format!("vm {id} has no disk attached")))?;
            (m, None)
        } else if rec.persistent && vm.state() == VmState::Stopped {
            let m = gens
                .store()
                .head(&GenerationDisks::volume_of(id))
                .await?
                .ok_or_else(|| HostError::Invalid(format!("vm {id} has no committed disk")))?;
            (m, None)
        } else {
            return Err(HostError::WrongState {
                id,
                state: vm.state(),
                wanted: "ready, or stopped with a persistent disk",
            });
        };
        if include_memory && memory.is_none() {
            return Err(HostError::Invalid(format!(
                "vm {id} is not running: memory can only be captured from a running sandbox"
            )));
        }
        let copy = gens
            .store()
            .copy_volume(&disk, &snap, &disk.scope, 0)
            .await?;
        Ok(Captured {
            disk: name.to_owned(),
            disk_size: ByteSize(copy.size),
            memory,
            paused_ms,
        })
    }

    /// [`Host::capture`] of a running VM with its memory; also how long its
    /// vCPUs were frozen.
    async fn capture_running(
        self: &Arc<Self>,
        vm: &Arc<Vm>,
        gens: &GenerationDisks,
        name: &str,
    ) -> Result<(hearth_store::Manifest, Option<MemoryVolumes>, Duration), HostError> {
        let id = vm.id;
        let inst = self.running_instance(vm, vm.state(), "ready")?;
        let dir = self.snapshot_memory_dir(&format!("{name}-mem"));
        private_dir(&dir).map_err(|source| HostError::Io {
            id,
            what: "create the snapshot's memory dir".into(),
            source,
        })?;
        if !vm.transition(VmState::Stopping, Some("capturing a snapshot".into())) {
            return Err(HostError::WrongState {
                id,
                state: vm.state(),
                wanted: "ready",
            });
        }
        let started = Instant::now();
        // The disk alone must hold what the guest wrote, for cold boots of
        // the snapshot (restore_memory=false); committed while the guest
        // still runs, so that little is left for the commit while frozen.
        guest_sync(vm).await;
        if let Err(e) = gens.commit(id).await {
            tracing::warn!(vm = %id, error = %error_chain(&e), "commit before a memory capture failed; the frozen commit tries again");
        }
        // RAM and device state are written while the guest runs; frozen
        // only for the last pages and the disk's last writes. The file
        // stays as this host's copy of the snapshot's memory.
        let state = crate::memory::live_path(&dir);
        let result = async {
            let saved = inst.save_live(&state).await?;
            let frozen = Instant::now();
            // The disk as of the freeze: nothing writes while it lasts.
            let disk = gens
                .commit(id)
                .await?
                .ok_or_else(|| HostError::Invalid(format!("vm {id} has no disk attached")))?;
            Ok::<_, HostError>((disk, saved.frozen, frozen))
        }
        .await;
        // Whatever happened, the VM runs on from its own memory (a failed
        // save left it running; `cont` of a running VM changes nothing).
        let resumed = inst.resume().await;
        // QEMU's own timing of the freeze when it gave one; else ours, an
        // upper bound (its downtime rounded up, the poll that saw its end,
        // the commit).
        let bound = match &result {
            Ok((_, before, frozen)) => *before + frozen.elapsed(),
            Err(_) => Duration::ZERO,
        };
        let paused = inst
            .last_freeze()
            .filter(|qemu| result.is_ok() && *qemu <= bound)
            .unwrap_or(bound);
        match resumed {
            Ok(()) => {
                vm.transition(VmState::Provisioning, None);
                vm.transition(VmState::Ready, None);
                // The guest's clock stood still while it was frozen.
                if let Some(guest) = vm.guest() {
                    crate::clock::sync(vm, &guest, "capture").await;
                }
            }
            Err(e) => {
                tracing::error!(vm = %id, error = %error_chain(&e), "the vm did not resume after a snapshot");
                if let Err(e) = inst.kill().await {
                    tracing::warn!(vm = %id, error = %error_chain(&e), "cannot kill the vmm that did not resume");
                }
                if let Err(e) = self.after_exit(vm).await {
                    tracing::warn!(vm = %id, error = %error_chain(&e), "cleaning up after a vm that did not resume");
                }
                vm.transition(
                    VmState::Stopped,
                    Some("did not resume after a snapshot".into()),
                );
            }
        }
        let (disk, _, _) = result?;
        tracing::info!(
            vm = %id,
            ms = started.elapsed().as_millis() as u64,
            paused_ms = paused.as_millis() as u64,
            paused_bound_ms = bound.as_millis() as u64,
            "captured memory"
        );
        let scope = disk.scope.clone();
        let volumes =
            crate::memory::import_live(gens.store(), &scope, name, &state, vm.record().memory, 0)
                .await?;
        Ok((disk, Some(volumes), paused))
    }

    /// Builds a snapshot from an OCI image (a registry reference or a
    /// `docker save`/OCI-layout tarball): the image is unpacked into an
    /// ext4 file of `capacity`, which is imported into the store as the
    /// volume `name` (its own key scope) and then removed.
    pub async fn import_oci(
        &self,
        source: hearth_image::OciSource,
        capacity: ByteSize,
        name: &str,
    ) -> Result<(Captured, hearth_image::OciImage), HostError> {
        let store = self.store("building snapshots")?;
        let volume: hearth_store::VolumeId = name.parse()?;
        let scope: hearth_store::ScopeId = name.parse()?;
        let dir = self.cfg.data_dir.join("imports");
        private_dir(&dir).map_err(|source| HostError::Io {
            id: VmId::new(),
            what: "create the imports dir".into(),
            source,
        })?;
        let file = dir.join(format!("{name}.ext4"));
        let result = async {
            let image =
                hearth_image::import_oci(source, &file, capacity, &hearth_image::QuietProgress)
                    .await
                    .map_err(|e| HostError::Invalid(format!("image: {}", error_chain(&e))))?;
            let meta = std::collections::BTreeMap::from([
                ("kind".to_owned(), "oci".to_owned()),
                ("digest".to_owned(), image.digest.clone()),
            ]);
            let m = store
                .import_file(&scope, &volume, &file, crate::block::CHUNK_SIZE, 0, meta)
                .await?;
            Ok::<_, HostError>((m, image))
        }
        .await;
        remove_file_logged(&file);
        let (m, image) = result?;
        Ok((
            Captured {
                disk: name.to_owned(),
                disk_size: ByteSize(m.size),
                memory: None,
                paused_ms: None,
            },
            image,
        ))
    }

    /// Collects the store's garbage: old generations beyond the newest few
    /// of each volume, then chunks no manifest references (see
    /// `hearth_store::gc`). Exactly one process per store may run it.
    pub async fn collect_garbage(&self) -> Result<hearth_store::GcReport, HostError> {
        let store = self.store("garbage collection")?;
        Ok(store.gc(hearth_store::GcOptions::default()).await?)
    }

    /// Removes a snapshot's volumes from the store and this host's copies
    /// of its memory. Chunks other volumes still use stay (see GC).
    pub async fn delete_snapshot_data(&self, captured: &Captured) -> Result<(), HostError> {
        let store = self.store("snapshots")?;
        if let Ok(v) = captured.disk.parse::<hearth_store::VolumeId>() {
            store.delete_volume(&v).await?;
        }
        if let Some(m) = &captured.memory {
            self.drop_templates_of_memory(&m.memory).await;
            crate::memory::delete(store, m).await?;
            remove_dir_logged(&self.snapshot_memory_dir(&m.memory));
        }
        Ok(())
    }

    pub async fn pause(&self, id: VmId) -> Result<VmRecord, HostError> {
        let vm = self.get(id)?;
        let inst = self.running_instance(&vm, VmState::Ready, "ready")?;
        inst.pause().await?;
        vm.transition(VmState::Paused, None);
        Ok(vm.record())
    }

    pub async fn resume(&self, id: VmId) -> Result<VmRecord, HostError> {
        let vm = self.get(id)?;
        let inst = self.running_instance(&vm, VmState::Paused, "paused")?;
        inst.resume().await?;
        vm.transition(VmState::Ready, None);
        // The guest's clock stood still while its VMM was stopped.
        if let Some(guest) = vm.guest() {
            crate::clock::sync(&vm, &guest, "resume").await;
        }
        Ok(vm.record())
    }

    fn running_instance(
        &self,
        vm: &Vm,
        want: VmState,
        wanted: &'static str,
    ) -> Result<Arc<Instance>, HostError> {
        let state = vm.state();
        match vm.instance() {
            Some(i) if state == want => Ok(i),
            _ => Err(HostError::WrongState {
                id: vm.id,
                state,
                wanted,
            }),
        }
    }

    /// Graceful stop: the guest syncs and powers off; QEMU is killed if it
    /// does not exit within the grace period.
    pub async fn stop(&self, id: VmId) -> Result<VmRecord, HostError> {
        let vm = self.get(id)?;
        let state = vm.state();
        if state.is_terminal() {
            return Ok(vm.record());
        }
        if !vm.transition(VmState::Stopping, None) {
            return Ok(vm.record());
        }
        if let Some(inst) = vm.instance() {
            // A guest that cannot power off by itself is killed after the
            // grace period: what it flushed is durable, the rest is lost,
            // and the log says why.
            if state == VmState::Paused {
                if let Err(e) = inst.resume().await {
                    tracing::warn!(vm = %id, error = %e, "cannot resume a paused vm to stop it gracefully; it will be killed");
                }
            }
            if let Some(g) = vm.guest() {
                match tokio::time::timeout(Duration::from_secs(2), g.shutdown()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(vm = %id, error = %e, "the guest did not take the shutdown request")
                    }
                    Err(_) => {
                        tracing::warn!(vm = %id, "the guest did not answer the shutdown request within 2 s")
                    }
                }
            }
            let exited = tokio::time::timeout(self.cfg.stop_grace, inst.wait_exit()).await;
            if exited.is_err() {
                inst.stop(Duration::from_secs(2)).await?;
            }
        }
        let released = self.after_exit(&vm).await;
        vm.transition(
            VmState::Stopped,
            released.as_ref().err().map(|e| self.public_error(e)),
        );
        released.map(|()| vm.record())
    }

    /// Hard stop: SIGKILL to the VMM.
    pub async fn kill(&self, id: VmId) -> Result<VmRecord, HostError> {
        let vm = self.get(id)?;
        if vm.state().is_terminal() {
            return Ok(vm.record());
        }
        vm.transition(VmState::Stopping, Some("killed".into()));
        if let Some(inst) = vm.instance() {
            inst.kill().await?;
        }
        // A persistent disk keeps what was written up to the kill, as a
        // real disk keeps what reached it before a power cut.
        let released = self.after_exit(&vm).await;
        vm.transition(VmState::Stopped, None);
        released.map(|()| vm.record())
    }

    /// Stops the VM if needed and removes every trace of it, its disk and
    /// saved memory in the store included.
    pub async fn delete(&self, id: VmId) -> Result<(), HostError> {
        let vm = self.forget_inner(id).await?;
        self.disks.remove(id).await?;
        if let Some(g) = &self.generations {
            if let Some(saved) = vm.record().saved {
                crate::memory::delete(g.store(), &saved).await?;
            }
            // What its saved memories (this one and older generations)
            // put, now that no volume of it names them.
            g.retire(vec![crate::memory::scope_of(id)?]);
        }
        Ok(())
    }

    /// Stops the VM if needed and drops this host's copy of it (records,
    /// local files), keeping what the store holds: how a sandbox moves to
    /// another host.
    pub async fn forget(&self, id: VmId) -> Result<(), HostError> {
        let vm = self.forget_inner(id).await?;
        self.disks.release(vm.id).await
    }

    async fn forget_inner(&self, id: VmId) -> Result<Arc<Vm>, HostError> {
        let vm = self.get(id)?;
        if !vm.state().is_terminal() {
            vm.transition(VmState::Stopping, Some("deleted".into()));
            if let Some(inst) = vm.instance() {
                inst.kill().await?;
            }
        }
        vm.transition(VmState::Deleted, None);
        self.release_network(&vm).await;
        self.release_jail_slot(&vm);
        self.cleanup_runtime(&vm);
        remove_dir_logged(&vm.dir);
        self.vms().remove(&id);
        Ok(vm)
    }

    /// After the VM's VMM has exited: it is no longer the VM's, its disk
    /// is released (a persistent one committed) and its runtime directory
    /// removed.
    async fn after_exit(&self, vm: &Vm) -> Result<(), HostError> {
        // Its watcher, should it wake later, then knows it is stale.
        vm.instance.lock().unwrap_or_else(|p| p.into_inner()).take();
        let released = self.disks.release(vm.id).await;
        self.release_network(vm).await;
        self.release_jail_slot(vm);
        self.cleanup_runtime(vm);
        if let Err(e) = &released {
            tracing::error!(vm = %vm.id, error = %error_chain(e), "disk release failed");
        }
        released
    }

    /// Stops every running VM (agent shutdown) and removes the runtime
    /// directory on tmpfs: a clean shutdown leaves nothing under `/dev/shm`.
    pub async fn shutdown(&self) {
        let ids: Vec<VmId> = self.vms().keys().copied().collect();
        let stops = ids.into_iter().map(|id| self.stop(id));
        for (id, r) in futures_util::future::join_all(stops)
            .await
            .into_iter()
            .enumerate()
        {
            if let Err(e) = r {
                tracing::warn!(n = id, error = %error_chain(&e), "stop at shutdown failed");
            }
        }
        self.sweep_templates(Duration::ZERO).await;
        if let Err(e) = std::fs::remove_dir_all(&self.cfg.run_root) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %self.cfg.run_root.display(), error = %e, "cannot remove the run directory");
            }
        }
    }

    fn cleanup_runtime(&self, vm: &Vm) {
        vm.guest.lock().unwrap_or_else(|p| p.into_inner()).take();
        remove_dir_logged(&vm.run_dir);
    }

    /// After a restart: every VM a previous run left is accounted for. A
    /// VMM that is still alive (it should have died with its parent) is
    /// killed, and what else it left removed, by the backend
    /// ([`hearth_vmm::Vmm::reap_stale`]: QEMU's is killed by PID after
    /// checking its command line names the VM).
    async fn recover(&self) {
        let Ok(dir) = std::fs::read_dir(self.cfg.data_dir.join("vms")) else {
            return;
        };
        for entry in dir.flatten() {
            let Some(vm) = Vm::load(&entry.path(), &self.cfg.run_root) else {
                continue;
            };
            let rec = vm.record();
            let running = !rec.state.is_terminal();
            let pid = rec.pid.filter(|_| running);
            match self.vmm.reap_stale(rec.id, pid).await {
                Ok(true) => {
                    tracing::warn!(vm = %rec.id, pid, "killed a VMM left by a previous host agent")
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(vm = %rec.id, error = %error_chain(&e), "cannot clean up after a VMM of a previous host agent")
                }
            }
            if running {
                vm.transition(
                    VmState::Failed,
                    Some("host agent restarted while the vm was running".into()),
                );
            }
            remove_dir_logged(&vm.run_dir);
            if self.network.is_some() {
                if let Err(e) = crate::network::Network::remove_stale(rec.id).await {
                    tracing::warn!(vm = %rec.id, error = %e, "cannot remove a namespace left by a previous host agent");
                }
            }
            self.vms().insert(rec.id, Arc::new(vm));
        }
    }
}

/// How [`Host::boot`] makes a VM's RAM.
#[derive(Clone, Copy)]
enum BootAs<'a> {
    /// Anonymous memory: booted cold, or resumed from saved memory.
    Sandbox,
    /// A pool template's source: RAM in a file of its own, no free page
    /// reporting (see `templates.rs`).
    TemplateSource,
    /// A pool member: the template's RAM mapped copy-on-write, its
    /// device state restored, its disk from the template's.
    Member(&'a templates::PoolTemplate),
}

/// Adds read permission for everyone to `path` (a kernel or initramfs:
/// public contents), which a jailed VMM needs.
/// The automatic [`HostConfig::boot_slots`] of a host with `cpus` CPUs
/// whose guests run under `accel`: under TCG a booting guest keeps a CPU
/// busy throughout; under KVM a boot mostly waits (firmware-free kernel
/// start, the disk), so more overlap.
pub fn boot_slots(accel: Accel, cpus: usize) -> usize {
    let cpus = cpus.max(1);
    match accel {
        Accel::Kvm => cpus * 4,
        Accel::Tcg => cpus,
    }
}

/// The CPUs this process may run on.
fn host_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn world_readable(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)?.permissions().mode();
    if mode & 0o444 != 0o444 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode | 0o444))?;
    }
    Ok(())
}

/// [`crate::memory::copy_sparse`] on the blocking pool.
async fn copy_memory(id: VmId, src: &Path, dst: &Path, what: &str) -> Result<u64, HostError> {
    let (from, to) = (src.to_owned(), dst.to_owned());
    tokio::task::spawn_blocking(move || crate::memory::copy_sparse(&from, &to))
        .await
        .map_err(|e| HostError::Invalid(format!("copy task: {e}")))?
        .map_err(|source| HostError::Io {
            id,
            what: what.to_owned(),
            source,
        })
}

/// Asks a ready guest to write its dirty pages to the disk (`sync`), at
/// most 30 s; a failure is logged (what reached the disk is still
/// consistent: the filesystem journals).
async fn guest_sync(vm: &Vm) {
    let Some(g) = vm.guest() else { return };
    let sync = hearth_guest_proto::ExecRequest {
        argv: Some(vec!["sync".into()]),
        timeout_ms: 30_000,
        ..Default::default()
    };
    if let Err(e) = g.run_capped(sync, 1024).await {
        tracing::warn!(vm = %vm.id, error = %e, "guest sync failed");
    }
}

/// Creates the 32-byte master key file (mode 0600) unless it exists. The
/// control plane seals its secrets under the same file, and every host of a
/// fleet must be given the same one.
fn ensure_master_key(path: &Path) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).map_err(std::io::Error::other)?;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(mut f) => {
            f.write_all(&key)?;
            f.sync_all()
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Removes a file; one already gone is fine, other failures are logged.
fn remove_file_logged(file: &Path) {
    if let Err(e) = std::fs::remove_file(file) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(file = %file.display(), error = %e, "cannot remove a file");
        }
    }
}

/// Removes a directory tree; one already gone is fine, other failures are
/// logged (a leftover directory is harmless but should be seen).
fn remove_dir_logged(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a directory");
        }
    }
}

/// Creates `dir` (and parents) private to this user: mode 0700 whatever the
/// umask. An existing directory that others can write is refused (anyone
/// could swap its contents); one they can read or enter is warned about and
/// made private, since it holds guest memory, disks and keys.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let mode = std::fs::metadata(dir)?.permissions().mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} is writable by other users (mode {mode:03o}); make it private: chmod 700",
                dir.display()
            ),
        ));
    }
    if mode & 0o077 != 0 {
        tracing::warn!(dir = %dir.display(), mode = format!("{mode:03o}"), "directory was readable by other users; making it 0700");
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

fn check_resources(memory: ByteSize, cpu: MilliCpu) -> Result<(), HostError> {
    if memory < ByteSize::mib(64) || !memory.bytes().is_multiple_of(ByteSize::MIB) {
        return Err(HostError::Invalid(format!(
            "memory must be a whole number of MiB, at least 64MiB (got {memory})"
        )));
    }
    if cpu.0 == 0 || cpu.whole_vcpus() > 64 {
        return Err(HostError::Invalid(format!(
            "cpu must be 1..64 vCPUs (got {} millicores)",
            cpu.0
        )));
    }
    Ok(())
}

/// How long a watcher waits for a boot in progress to record its own
/// failure before recording the one it saw.
const BOOT_SETTLES: Duration = Duration::from_secs(30);

/// Marks the VM failed the moment its VMM exits or its guest channel breaks
/// while it should be running.
async fn watch_vm(host: Arc<Host>, vm: Arc<Vm>, instance: Arc<Instance>, guest: GuestClient) {
    let reason = tokio::select! {
        exit = instance.wait_exit() => format!("vmm exited unexpectedly ({exit})"),
        why = guest.closed() => format!("guest channel lost: {why}"),
        why = watch_liveness(&vm, &guest, host.cfg.liveness) => why,
        never = crate::clock::keep(&vm, &guest, host.cfg.clock_interval) => match never {},
        never = crate::mounts::keep(&vm, &guest) => match never {},
    };
    // A boot still in progress owns its failure: it reports the first
    // cause (a mount that could not be made, say), and its killing the VMM
    // for it is what this watcher saw. Wait for the boot to settle; only
    // a boot that went on to `ready` (or never settles) leaves the failure
    // to this watcher.
    if vm.state() == VmState::Provisioning {
        let mut rx = vm.subscribe();
        let settled = tokio::time::timeout(
            BOOT_SETTLES,
            rx.wait_for(|r| r.state != VmState::Provisioning),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .map(|r| r.state);
        if settled.is_some_and(|s| s != VmState::Ready) {
            return;
        }
    }
    // The VMM watched here is no longer the VM's (it was stopped or saved,
    // and the VM may be starting or running on another already): the
    // state is not this watcher's to change, nor the disk and run
    // directory, which are the new VMM's.
    if !vm
        .instance()
        .is_some_and(|current| Arc::ptr_eq(&current, &instance))
    {
        return;
    }
    let state = vm.state();
    if matches!(
        state,
        VmState::Ready | VmState::Paused | VmState::Provisioning
    ) {
        // Kill and clean up before the state says `failed`: a start may
        // follow the moment it does, and must not find our leftovers (or
        // have its fresh run directory removed under it).
        if let Err(e) = instance.kill().await {
            tracing::warn!(vm = %vm.id, error = %e, "cannot kill a failed vm's vmm");
        }
        // A persistent disk keeps what reached it (logged on failure).
        let _ = host.after_exit(&vm).await;
        let running = [VmState::Ready, VmState::Paused, VmState::Provisioning];
        if vm.transition_from(&running, VmState::Failed, Some(reason.clone())) {
            tracing::warn!(vm = %vm.id, %reason, "vm failed");
        }
    }
}

/// Pings the guest until it has been silent for `l.fail_after`; then the
/// reason it is declared failed. See [`Liveness`].
async fn watch_liveness(vm: &Vm, guest: &GuestClient, l: Liveness) -> String {
    const UNHEALTHY: &str = "unhealthy: ";
    let mut last_answer = Instant::now();
    loop {
        tokio::time::sleep(l.interval).await;
        if vm.state() != VmState::Ready {
            // Paused (or on its way out): not expected to answer.
            last_answer = Instant::now();
            continue;
        }
        match tokio::time::timeout(l.interval, guest.ping()).await {
            Ok(Ok(())) => {
                last_answer = Instant::now();
                if vm.record().reason.is_some_and(|r| r.starts_with(UNHEALTHY)) {
                    tracing::info!(vm = %vm.id, "guest agent answers again");
                    vm.update(|r| r.reason = None);
                }
                continue;
            }
            // A closed channel is the other arm's to report.
            Ok(Err(_)) => std::future::pending::<()>().await,
            Err(_) => {}
        }
        let silent = last_answer.elapsed();
        if vm.state() != VmState::Ready {
            continue;
        }
        if silent >= l.fail_after {
            return format!(
                "the guest agent stopped answering (no ping answered for {}s)",
                silent.as_secs()
            );
        }
        if silent >= l.unhealthy_after {
            let why = format!(
                "{UNHEALTHY}the guest agent has not answered a ping for {}s",
                silent.as_secs()
            );
            tracing::warn!(vm = %vm.id, "{why}");
            vm.update(|r| r.reason = Some(why));
        }
    }
}

fn console_tail(path: &Path) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let start = text.len().saturating_sub(600);
    String::from_utf8_lossy(&text[start..]).replace('\n', " | ")
}

/// Where jail uids are locked, machine-wide (every host agent on the
/// machine, whatever its data directory).
pub const JAIL_UID_LOCKS: &str = "/run/hearth/jail-uids";

/// Takes `<dir>/<uid>`'s exclusive lock without waiting: the file holding
/// it, or `None` when another process (or another open of it) holds it.
/// A fresh identity for the guest of `id` (see
/// [`hearth_guest_proto::GuestIdentity`]): host entropy, new machine and
/// boot ids, and a host name of the VM's own (`sandbox-` and the random
/// tail of its id, as the control plane names sandboxes by default).
pub fn fresh_identity(id: VmId) -> Result<hearth_guest_proto::GuestIdentity, HostError> {
    let mut entropy = vec![0u8; hearth_guest_proto::MIN_IDENTITY_ENTROPY];
    let mut machine = [0u8; 16];
    getrandom::fill(&mut entropy)
        .and_then(|()| getrandom::fill(&mut machine))
        .map_err(|e| HostError::Io {
            id,
            what: "draw entropy for a fresh identity".into(),
            source: std::io::Error::other(e),
        })?;
    Ok(hearth_guest_proto::GuestIdentity {
        entropy,
        hostname: hearth_types::machine_name(&id.as_uuid()),
        machine_id: uuid::Uuid::from_bytes(machine).simple().to_string(),
        boot_id: uuid::Uuid::new_v4().hyphenated().to_string(),
    })
}

pub fn lock_jail_uid(dir: &Path, uid: u32) -> std::io::Result<Option<std::fs::File>> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(dir.join(uid.to_string()))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

/// Records `instance` as `vm`'s VMM: its PID (QEMU's own, under a jail
/// the spawned process's child: what the restart sweep looks for by
/// command line) and its handle.
fn hold_instance(vm: &Vm, instance: &Arc<Instance>) {
    let pid = instance.vmm_pid();
    vm.update(|r| r.pid = Some(pid));
    *vm.instance.lock().unwrap_or_else(|p| p.into_inner()) = Some(instance.clone());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 16, finding 9b: two host agents on one machine gave their
    /// VMMs the same uids. A uid's lock is held by one holder at a time
    /// (flock locks belong to an open file, as two agents' would) and is
    /// free again once its holder goes.
    #[test]
    fn jail_uids_are_unique_per_machine() {
        let dir = std::env::temp_dir().join(format!("hearth-uids-{}", std::process::id()));
        let first = lock_jail_uid(&dir, 1_600_000_000).unwrap();
        assert!(first.is_some());
        assert!(lock_jail_uid(&dir, 1_600_000_000).unwrap().is_none());
        assert!(lock_jail_uid(&dir, 1_600_000_001).unwrap().is_some());
        drop(first);
        // Free again, though not always at once: a process another test
        // forks meanwhile holds a copy of the descriptor (and so the lock)
        // until it execs, which closes it (`O_CLOEXEC`). Once failed in CI.
        let t = std::time::Instant::now();
        while lock_jail_uid(&dir, 1_600_000_000).unwrap().is_none() {
            assert!(
                t.elapsed() < std::time::Duration::from_secs(5),
                "the uid's lock outlived its holder"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
