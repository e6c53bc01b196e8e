//! Pool templates (issue 18): the memory a warm pool's members share.
//!
//! The first member a host is asked for, of one shape (image or snapshot
//! disk, memory, CPUs, disk size), makes the shape's template: a VM of
//! that shape boots cold with its RAM in a file of its own and no free
//! page reporting, runs one command (as a member's warm-up does), and is
//! saved: its device state to a file, its disk committed to its own
//! volume in the store, its RAM sealed into a [`MemoryTemplate`] (a memfd
//! no VMM can write, truncate or punch). Then it is gone, and every member
//! of that shape, the first included, is restored from the template: the
//! RAM mapped copy-on-write (pages shared until the guest writes them), the
//! device state loaded, the disk a new volume on the template's
//! generation (every chunk shared until written). No member boots cold.
//!
//! - Shared only as far as a pool's snapshot is: built-in images (public
//!   contents), or one workspace's snapshot (its volume is the key): a
//!   shared page cache is a side channel between tenants.
//! - A snapshot's memory (a pool of a snapshot with memory, a fork's
//!   children when there are several) makes a template too, with no
//!   guest code run: the source's VMM loads the stream into a RAM file and
//!   stays stopped ([`hearth_vmm::Vmm::restore_frozen`]), and is saved
//!   again. Its members keep the balloon the stream was saved with (a
//!   restore needs the same devices): the seals refuse what they report.
//! - A create of a built-in image's shape (`share_memory` without a
//!   snapshot's memory: the control plane's rule) is a copy of a fresh
//!   boot's template of that shape, as a pool's member is, when the host
//!   holds one; without one it boots cold, never waiting, and the host
//!   makes one beside it (at most [`CREATE_TEMPLATES_MAX`] held; kept
//!   [`CREATE_TEMPLATE_IDLE`]). Its copies take a fresh identity at once.
//! - Members lose free page reporting until their next cold boot (QEMU
//!   7.2 punches every reported page out of the file it maps, which the
//!   seals refuse); their memory goes back to the host when they stop.
//! - A template unused for [`TEMPLATE_IDLE`] is dropped (its memfd closed:
//!   members that map it keep their mappings; its volume deleted: members'
//!   disks keep the chunks they name, see the store's GC). A restart drops
//!   every template, and removes what a killed agent left.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hearth_hostapi::types::{CreateVm, MemoryVolumes};
use hearth_hostapi::TemplateUsage;
use hearth_image::{GuestArtifacts, ImageName};
use hearth_types::{ByteSize, MilliCpu, VmId};
use hearth_vmm::MemoryTemplate;

use super::{error_chain, private_dir, remove_dir_logged, BootAs, Host};
use crate::block::GenerationDisks;
use crate::vm::{Vm, VmRecord};
use crate::HostError;

/// How long a template is kept after it last made a member.
pub const TEMPLATE_IDLE: Duration = Duration::from_secs(600);

/// How long a template made for the creates of a built-in image's shape
/// is kept after it last made one: creates come in bursts an
/// interactive session apart, where a pool keeps its members itself.
pub const CREATE_TEMPLATE_IDLE: Duration = Duration::from_secs(3600);

/// How long after a shape's template could not be made its members boot
/// cold without trying again (each try is a cold boot of its own).
pub const TEMPLATE_RETRY: Duration = Duration::from_secs(300);

/// How many templates a host may hold before a create of a shape it has
/// none of makes no more (pools' members always may).
pub const CREATE_TEMPLATES_MAX: u32 = 4;

/// What members must share to share a template.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct TemplateKey {
    image: ImageName,
    /// The snapshot's disk volume (a workspace's), or none: the image's.
    from: Option<String>,
    /// The snapshot's memory volume, when members resume its memory (the
    /// template is that memory); none: the template is a fresh boot.
    memory_from: Option<String>,
    memory: ByteSize,
    cpu: MilliCpu,
    disk: Option<ByteSize>,
}

impl TemplateKey {
    /// The key of a pool member's create, or of a create that shares
    /// memory (`share_memory`: one of several VMs made from one
    /// snapshot's memory, or a fresh boot's template of a built-in
    /// image); `None` for any other.
    pub(crate) fn of(req: &CreateVm) -> Option<Self> {
        if req.existing || req.saved.is_some() {
            return None;
        }
        let memory_from = req
            .from
            .as_ref()
            .and_then(|f| f.memory.as_ref())
            .map(|m| m.memory.clone());
        if !(req.pooled || req.share_memory) {
            return None;
        }
        Some(Self {
            image: req.image,
            from: req.from.as_ref().map(|f| f.disk.clone()),
            memory_from,
            memory: req.memory,
            cpu: req.cpu,
            disk: req.disk,
        })
    }
}

/// Whether `req` is a create of a built-in image's fresh boot (no pool
/// member, sharing memory without a snapshot's): a copy of its shape's
/// template when the host holds one, never waiting for it.
pub(crate) fn is_fresh_boot_create(req: &CreateVm) -> bool {
    let of_memory = req.from.as_ref().is_some_and(|f| f.memory.is_some());
    req.share_memory && !req.pooled && !of_memory
}

/// One shape's template: what a member is restored from.
pub(crate) struct PoolTemplate {
    /// The shape it is the template of.
    key: TemplateKey,
    /// The VM it was saved from (its disk volume is the template's).
    source: VmId,
    dir: PathBuf,
    state: PathBuf,
    memory: Arc<MemoryTemplate>,
    /// The volume of the template's disk generation.
    pub(crate) disk: String,
    last_used: Mutex<Instant>,
    /// How long it is kept without a new copy.
    keep: Duration,
}

impl PoolTemplate {
    /// What [`hearth_vmm::Vmm::restore`] takes a member from.
    pub(crate) fn restore(&self) -> hearth_vmm::RestoreFrom {
        self.touch();
        hearth_vmm::RestoreFrom {
            state: self.state.clone(),
            memory: hearth_vmm::RestoreMemory::Template(self.memory.clone()),
        }
    }

    /// The id of the VM it was saved from.
    pub(crate) fn source(&self) -> VmId {
        self.source
    }

    /// Whether it is a snapshot's memory (every VM made from it needs an
    /// identity of its own at once), not a fresh boot.
    pub(crate) fn of_memory(&self) -> bool {
        self.key.memory_from.is_some()
    }

    fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn idle_for(&self) -> Duration {
        self.last_used
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
    }

    /// Bytes of guest RAM the template holds.
    pub(crate) fn resident(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        self.memory
            .file()
            .and_then(|f| f.metadata())
            .map_or(0, |m| m.blocks() * 512)
    }
}

type Slot = Arc<tokio::sync::Mutex<Option<Arc<PoolTemplate>>>>;

/// A host's templates, one slot per shape; a slot's lock is held while
/// its template is made, so members of one shape wait for one template.
#[derive(Default)]
pub(crate) struct Templates {
    slots: Mutex<HashMap<TemplateKey, Slot>>,
    /// When each shape's template last could not be made.
    failed: Mutex<HashMap<TemplateKey, Instant>>,
}

impl Templates {
    fn slot(&self, key: &TemplateKey) -> Slot {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.clone())
            .or_default()
            .clone()
    }

    /// Takes out every template idle for as long as it is kept (every
    /// one with `all`); a slot being filled is left alone.
    fn take_idle(&self, all: bool) -> Vec<Arc<PoolTemplate>> {
        let mut out = Vec::new();
        let slots: Vec<Slot> = self
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for slot in slots {
            let Ok(mut held) = slot.try_lock() else {
                continue;
            };
            if held.as_ref().is_some_and(|t| all || t.idle_for() >= t.keep) {
                out.extend(held.take());
            }
        }
        out
    }

    /// Forgets the shapes `which` picks (their slots and failures), and
    /// returns their templates, waiting for any being made.
    async fn forget(&self, which: impl Fn(&TemplateKey) -> bool) -> Vec<Arc<PoolTemplate>> {
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|k, _| !which(k));
        let slots: Vec<Slot> = {
            let mut map = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            let keys: Vec<TemplateKey> = map.keys().filter(|k| which(k)).cloned().collect();
            keys.iter().filter_map(|k| map.remove(k)).collect()
        };
        let mut out = Vec::new();
        for slot in slots {
            out.extend(slot.lock().await.take());
        }
        out
    }

    /// Whether the shape's template could not be made within
    /// [`TEMPLATE_RETRY`].
    fn failed_lately(&self, key: &TemplateKey) -> bool {
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .is_some_and(|at| at.elapsed() < TEMPLATE_RETRY)
    }

    /// How many templates this host holds, and their bytes of RAM.
    fn usage(&self) -> TemplateUsage {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots
            .values()
            .filter_map(|s| s.try_lock().ok().and_then(|t| t.clone()))
            .fold(TemplateUsage::default(), |u, t| TemplateUsage {
                count: u.count + 1,
                memory_bytes: u.memory_bytes + t.resident(),
            })
    }
}

impl Host {
    /// The pool templates this host holds.
    pub fn template_usage(&self) -> TemplateUsage {
        self.templates.usage()
    }

    /// The template a pool member of `req`'s shape is restored from, made
    /// now if this host has none; `None` when members of this shape do
    /// not share one (see [`TemplateKey::of`]), or this host keeps no
    /// disks in the store, or the template cannot be made (logged: the
    /// member boots cold, as without one).
    pub(crate) async fn pool_template(
        self: &Arc<Self>,
        req: &CreateVm,
        artifacts: &GuestArtifacts,
    ) -> Option<Arc<PoolTemplate>> {
        let key = TemplateKey::of(req)?;
        let gens = self.generations.clone()?;
        let slot = self.templates.slot(&key);
        let mut held = slot.lock().await;
        if let Some(t) = held.as_ref() {
            // Used from now: the sweep leaves it to this member.
            t.touch();
            return Some(t.clone());
        }
        if self.templates.failed_lately(&key) {
            return None;
        }
        self.fill_slot(&mut held, req, key, artifacts, &gens).await
    }

    /// The template a create of a built-in image's fresh boot
    /// (`share_memory` without a snapshot's memory) is restored from,
    /// when this host holds one of its shape. A create never waits for
    /// one: without it, it boots cold, and then asks for one for the
    /// creates that follow ([`Host::make_create_template`]).
    pub(crate) fn create_template(&self, req: &CreateVm) -> Option<Arc<PoolTemplate>> {
        let key = TemplateKey::of(req)?;
        let held = self.templates.slot(&key).try_lock_owned().ok()?;
        let t = held.as_ref()?;
        t.touch();
        Some(t.clone())
    }

    /// Makes a template of `req`'s shape beside whatever runs, unless one
    /// is held or being made, or it failed lately, or this host holds
    /// [`CREATE_TEMPLATES_MAX`] templates already (each holds up to its
    /// guest's RAM).
    pub(crate) fn make_create_template(
        self: &Arc<Self>,
        req: &CreateVm,
        artifacts: &GuestArtifacts,
    ) {
        let Some(key) = TemplateKey::of(req) else {
            return;
        };
        let Some(gens) = self.generations.clone() else {
            return;
        };
        let Ok(mut held) = self.templates.slot(&key).try_lock_owned() else {
            return;
        };
        if held.is_some()
            || self.templates.failed_lately(&key)
            || self.templates.usage().count >= CREATE_TEMPLATES_MAX
        {
            return;
        }
        let (host, req, artifacts) = (self.clone(), req.clone(), artifacts.clone());
        tokio::spawn(async move {
            host.fill_slot(&mut held, &req, key, &artifacts, &gens)
                .await;
        });
    }

    /// Makes `key`'s template into its slot (`held`, locked), or records
    /// that it could not be made (logged: the shape boots cold until
    /// [`TEMPLATE_RETRY`]).
    async fn fill_slot(
        self: &Arc<Self>,
        held: &mut Option<Arc<PoolTemplate>>,
        req: &CreateVm,
        key: TemplateKey,
        artifacts: &GuestArtifacts,
        gens: &GenerationDisks,
    ) -> Option<Arc<PoolTemplate>> {
        let started = Instant::now();
        match self.make_template(req, &key, artifacts, gens).await {
            Ok(t) => {
                tracing::info!(
                    image = %req.image,
                    from = ?key.from,
                    ms = started.elapsed().as_millis() as u64,
                    resident_mib = t.resident() >> 20,
                    "made a pool template"
                );
                let t = Arc::new(t);
                *held = Some(t.clone());
                Some(t)
            }
            Err(e) => {
                tracing::warn!(image = %req.image, error = %error_chain(&e), retry_s = TEMPLATE_RETRY.as_secs(), "cannot make a template; VMs of this shape boot cold until the retry");
                self.templates
                    .failed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key, Instant::now());
                None
            }
        }
    }

    /// A template failed a member's restore: the next member makes a new
    /// one.
    pub(crate) async fn discard_template(&self, t: &Arc<PoolTemplate>) {
        let slot = self.templates.slot(&t.key);
        let mut held = slot.lock().await;
        if held.as_ref().is_some_and(|h| Arc::ptr_eq(h, t)) {
            held.take();
            drop(held);
            self.remove_template_files(t.source, &t.dir).await;
        }
    }

    /// Boots the template's source VM, saves it, and seals its RAM.
    async fn make_template(
        self: &Arc<Self>,
        req: &CreateVm,
        key: &TemplateKey,
        artifacts: &GuestArtifacts,
        gens: &GenerationDisks,
    ) -> Result<PoolTemplate, HostError> {
        let id = VmId::new();
        let dir = self.cfg.data_dir.join("templates").join(id.to_string());
        let run_dir = self.cfg.run_root.join(id.to_string());
        for d in [&dir, &run_dir] {
            private_dir(d).map_err(|source| HostError::Io {
                id,
                what: "create a template's dir".into(),
                source,
            })?;
        }
        let source_req = CreateVm {
            id: Some(id),
            persistent: true,
            pooled: false,
            network: None,
            ..req.clone()
        };
        // Not one of the host's VMs: no API sees it, no restart recovers
        // it (the templates directory is cleared instead).
        let vm = Arc::new(Vm::new(
            VmRecord::provisioning(id, &source_req, self.accel.to_string()),
            dir.clone(),
            run_dir,
        ));
        let keep = match is_fresh_boot_create(req) {
            true => CREATE_TEMPLATE_IDLE,
            false => TEMPLATE_IDLE,
        };
        let made = self.save_template(&vm, key, artifacts, gens, keep).await;
        if made.is_err() {
            if let Some(inst) = vm.instance() {
                if let Err(e) = inst.kill().await {
                    tracing::warn!(vm = %id, error = %error_chain(&e), "cannot kill a template's vmm");
                }
            }
            if let Err(e) = self.after_exit(&vm).await {
                tracing::warn!(vm = %id, error = %error_chain(&e), "cleaning up after a template that failed");
            }
            self.remove_template_files(id, &dir).await;
        }
        made
    }

    async fn save_template(
        self: &Arc<Self>,
        vm: &Arc<Vm>,
        key: &TemplateKey,
        artifacts: &GuestArtifacts,
        gens: &GenerationDisks,
        keep: Duration,
    ) -> Result<PoolTemplate, HostError> {
        let id = vm.id;
        let rec = vm.record();
        let inst = match rec.from.as_ref().and_then(|f| f.memory.as_ref()) {
            // The snapshot's memory as it was: no guest code runs.
            Some(volumes) => {
                let inst = self.unpack_memory(vm, &rec, artifacts, volumes).await?;
                gens.share(id).await?;
                inst
            }
            None => {
                self.boot(vm, artifacts, true, BootAs::TemplateSource)
                    .await?;
                self.warm_up(vm).await;
                // Members' disks name the template's chunks: its scope is
                // left to GC, as a snapshot's is.
                gens.share(id).await?;
                super::guest_sync(vm).await;
                self.running_instance(vm, crate::vm::VmState::Ready, "ready")?
            }
        };
        // The save ends the VMM: its watcher (if any) must leave the rest
        // to us.
        if !vm.transition(
            crate::vm::VmState::Stopping,
            Some("saving a template".into()),
        ) {
            return Err(HostError::WrongState {
                id,
                state: vm.state(),
                wanted: "ready",
            });
        }
        let state = vm.dir.join("state");
        let saved = inst.save(&state).await?;
        let Some(ram) = saved.memory else {
            return Err(HostError::Invalid(
                "the template's vmm saved no memory file".into(),
            ));
        };
        let memory = tokio::task::spawn_blocking(move || MemoryTemplate::from_file(&ram))
            .await
            .map_err(|e| HostError::Invalid(format!("template task: {e}")))?
            .map_err(|source| HostError::Io {
                id,
                what: "seal the template's memory".into(),
                source,
            })?;
        // The VMM is gone: the disk is committed with what the memory
        // holds, and the RAM file (now copied) removed.
        self.after_exit(vm).await?;
        Ok(PoolTemplate {
            key: key.clone(),
            source: id,
            dir: vm.dir.clone(),
            state,
            memory: Arc::new(memory),
            disk: GenerationDisks::volume_of(id).to_string(),
            last_used: Mutex::new(Instant::now()),
            keep,
        })
    }

    /// A template's source VM made from a snapshot's memory (a stream):
    /// its VMM loads the stream into a RAM file of its own and stays
    /// stopped, so the template is the snapshot as it was (a fork's
    /// children go on from the parent's moment, not from one the source
    /// ran on to). The load allocates the whole file for as long as the
    /// template is made (QEMU reads every page it is told is zero); the
    /// template keeps only pages with data.
    async fn unpack_memory(
        self: &Arc<Self>,
        vm: &Arc<Vm>,
        rec: &VmRecord,
        artifacts: &GuestArtifacts,
        volumes: &MemoryVolumes,
    ) -> Result<Arc<super::Instance>, HostError> {
        let spec = self
            .machine(vm, rec, artifacts, true, BootAs::TemplateSource, true)
            .await?;
        let fetched = self.fetch_memory(vm, volumes, true).await?;
        if fetched.memory.is_some() {
            return Err(HostError::Invalid(
                "memory saved as a file of its own (before 2026-12-05) makes no template".into(),
            ));
        }
        let from = hearth_vmm::RestoreFrom {
            state: fetched.state,
            memory: hearth_vmm::RestoreMemory::Unpack(spec.mem_path.clone()),
        };
        let inst = self.vmm.restore_frozen(&spec, &from).await?;
        super::hold_instance(vm, &inst);
        Ok(inst)
    }

    /// A snapshot's memory is gone (a fork's capture, once its children
    /// are made): so are the templates made of it.
    pub(crate) async fn drop_templates_of_memory(&self, memory: &str) {
        for t in self
            .templates
            .forget(|k| k.memory_from.as_deref() == Some(memory))
            .await
        {
            tracing::info!(template = %t.source, "dropping the template of a deleted snapshot's memory");
            self.remove_template_files(t.source, &t.dir).await;
        }
    }

    /// Drops templates idle for as long as they are kept
    /// ([`TEMPLATE_IDLE`], [`CREATE_TEMPLATE_IDLE`]), or every one.
    pub(crate) async fn sweep_templates(&self, all: bool) {
        for t in self.templates.take_idle(all) {
            tracing::info!(template = %t.source, idle_s = t.idle_for().as_secs(), "dropping an idle pool template");
            self.remove_template_files(t.source, &t.dir).await;
        }
    }

    /// Deletes a template's volume and directory (its memfd closes with
    /// its last handle).
    async fn remove_template_files(&self, source: VmId, dir: &std::path::Path) {
        if let Some(gens) = &self.generations {
            if let Err(e) = gens
                .store()
                .delete_volume(&GenerationDisks::volume_of(source))
                .await
            {
                tracing::warn!(template = %source, error = %e, "cannot delete a template's volume");
            }
        }
        remove_dir_logged(dir);
    }

    /// After a restart: what templates a previous run made are gone.
    pub(crate) async fn remove_stale_templates(&self) {
        let Ok(dir) = std::fs::read_dir(self.cfg.data_dir.join("templates")) else {
            return;
        };
        for entry in dir.flatten() {
            match entry.file_name().to_string_lossy().parse::<VmId>() {
                Ok(id) => self.remove_template_files(id, &entry.path()).await,
                Err(_) => remove_dir_logged(&entry.path()),
            }
        }
    }
}
