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

mod boot;
mod config;
mod create;
mod fs;
mod identity;
mod images;
mod lifecycle;
mod saved;
mod templates;
mod watch;
pub use crate::error::HostError;
use boot::*;
pub use boot::{boot_slots, lock_jail_uid, JAIL_UID_LOCKS};
pub use config::*;
use create::*;
use fs::*;
pub use identity::fresh_identity;
use saved::*;
pub use templates::TEMPLATE_IDLE;
use watch::*;

use crate::block::GenerationDisks;
use crate::disks::{DiskProvider, DiskRequest, QcowOverlays, VolumeRequest};
use crate::guest::GuestClient;
use crate::vm::{BootFrom, MemoryVolumes, Vm, VmRecord, VmState};
pub use hearth_hostapi::types::{Captured, CreateVm, Resize};
pub use hearth_types::error_chain;

/// The host agent's view of its VMs.
pub struct Host {
    cfg: HostConfig,
    images: ImageConfig,
    vmm: Arc<dyn DynVmm>,
    accel: Accel,
    artifacts: images::ArtifactCache,
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
    /// What changed among the VMs, for the control plane's reconcile
    /// (`HostApi::vm_changes`).
    changes: hearth_hostapi::ChangeJournal,
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
                let kek = hearth_store::KeyFileKek::from_master(master_key(&s.master_key_file)?);
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
            artifacts: images::ArtifactCache::new(artifacts),
            vms: Mutex::new(HashMap::new()),
            disks,
            generations,
            store_health: crate::store_check::HealthCell::new(),
            changes: hearth_hostapi::ChangeJournal::new(),
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
                host.sweep_templates(false).await;
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

    fn vms(&self) -> std::sync::MutexGuard<'_, HashMap<VmId, Arc<Vm>>> {
        self.vms.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn list(&self) -> Vec<VmRecord> {
        let mut v: Vec<_> = self.vms().values().map(|vm| vm.record()).collect();
        v.sort_by_key(|r| r.created_at_ms);
        v
    }

    /// The VMs that changed since `since` (see [`hearth_hostapi::changes`]).
    pub fn changes(
        &self,
        since: Option<hearth_hostapi::ChangeCursor>,
    ) -> hearth_hostapi::VmChanges {
        self.changes.changes(self.list(), since)
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

    fn store(&self, what: &'static str) -> Result<&hearth_store::Store, HostError> {
        self.generations
            .as_ref()
            .map(|g| g.store())
            .ok_or(HostError::NeedsStore(what))
    }
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
