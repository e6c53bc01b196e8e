//! The block service: every VM's root disk served to QEMU over NBD on a
//! unix socket, from a generation in the store ([`hearth_store`]).
//!
//! - A built-in image (a raw ext4 file built by `hearth-image`) is imported
//!   into the store once, as the volume `image-<hash>` in the `images`
//!   scope; every sandbox booted from it references its chunks.
//! - A persistent sandbox's disk is the volume `vm-<id>` in its own key
//!   scope: its first generation is a copy of the image's manifest (no
//!   chunk copied); each commit adds a generation holding only the chunks
//!   that changed. Commits happen when the VM stops, on a timer while it
//!   runs, and for snapshots, and are fenced by the placement generation
//!   the host holds (`DiskRequest::fence`).
//!   A guest's flush is durable before it is answered: the chunks written
//!   since are uploaded and named by a journal record on top of the head,
//!   which the next commit, or the next host to open the disk, folds into
//!   a generation (see [`volume`]).
//! - A non-persistent sandbox's disk is served straight over the image's
//!   generation and never committed: its writes are dropped at every stop,
//!   and its flushes promise nothing beyond the VM's life.
//!
//! Reads come from the VM's local file, else lazily from the store's cache,
//! else from object storage (see [`volume`]).

pub mod nbd;
pub mod volume;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hearth_store::{Manifest, ManifestDraft, ScopeId, Store, StoreError, VolumeId};
use hearth_types::VmId;
use hearth_vmm::DiskSpec;

use crate::disks::{
    DiskFuture, DiskProvider, DiskRequest, UnitFuture, VolumeRequest, DISK_RESERVE,
};
use crate::error::HostError;
pub use volume::{Target, Volume};

/// The NBD export name of every root disk.
pub const EXPORT: &str = "root";
/// Chunk size of imported images (and so of the disks made from them).
pub const CHUNK_SIZE: u32 = 64 << 10;

/// The store-backed [`DiskProvider`].
pub struct GenerationDisks {
    store: Store,
    data_dir: PathBuf,
    /// How often a running VM's disk is committed.
    commit_interval: Duration,
    attached: Mutex<HashMap<VmId, Attached>>,
    /// VMs' workspace volumes, by VM and place among its volumes.
    volumes: Mutex<HashMap<(VmId, usize), Attached>>,
    /// Serializes image imports (one import per image, ever).
    importing: tokio::sync::Mutex<()>,
    /// Scopes of deleted volumes waiting for [`GenerationDisks::retire`]'s
    /// pass.
    retiring: Arc<Mutex<Retiring>>,
}

/// Scopes to retire, and whether a pass is running (it takes them all).
#[derive(Default)]
struct Retiring {
    pending: Vec<ScopeId>,
    running: bool,
}

struct Attached {
    volume: Arc<Volume>,
    /// Commit on release (persistent disks).
    keep: bool,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Attached {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl GenerationDisks {
    pub fn new(store: Store, data_dir: impl Into<PathBuf>, commit_interval: Duration) -> Self {
        Self {
            store,
            data_dir: data_dir.into(),
            commit_interval,
            attached: Mutex::new(HashMap::new()),
            volumes: Mutex::new(HashMap::new()),
            importing: tokio::sync::Mutex::new(()),
            retiring: Arc::default(),
        }
    }

    /// Frees the chunks of deleted volumes' scopes in the background, at
    /// once rather than at the next GC run ([`Store::retire_scopes`]: all
    /// of an unshared scope, what nothing names of a shared one). Scopes
    /// that arrive while a pass runs wait for the next, which takes them
    /// all: a burst of deletes reads the store's manifests once or twice,
    /// not once each. A failure is logged; GC frees what is left.
    pub fn retire(&self, scopes: Vec<ScopeId>) {
        if scopes.is_empty() {
            return;
        }
        let mut r = self.retiring.lock().unwrap_or_else(|p| p.into_inner());
        r.pending.extend(scopes);
        if std::mem::replace(&mut r.running, true) {
            return;
        }
        drop(r);
        let (store, retiring) = (self.store.clone(), self.retiring.clone());
        tokio::spawn(async move {
            loop {
                let scopes = {
                    let mut r = retiring.lock().unwrap_or_else(|p| p.into_inner());
                    if r.pending.is_empty() {
                        r.running = false;
                        return;
                    }
                    let mut s = std::mem::take(&mut r.pending);
                    s.sort();
                    s.dedup();
                    s
                };
                match store.retire_scopes(&scopes).await {
                    Ok(r) => tracing::debug!(
                        scopes = scopes.len(),
                        deleted = r.chunks_deleted,
                        bytes = r.bytes_deleted,
                        kept = r.chunks_kept,
                        "retired the scopes of deleted volumes"
                    ),
                    Err(e) => tracing::warn!(
                        scopes = scopes.len(),
                        error = %e,
                        "cannot retire the scopes of deleted volumes; GC will free them"
                    ),
                }
            }
        });
    }

    /// Scopes that are `volume`'s own (see [`volume::is_own_scope`]) among
    /// those its generations and journal name.
    async fn own_scopes(&self, volume: &VolumeId) -> Result<Vec<ScopeId>, StoreError> {
        let mut scopes = std::collections::BTreeSet::new();
        for seq in self.store.generations(volume).await? {
            match self.store.manifest(volume, seq).await {
                Ok(m) => {
                    scopes.insert(m.scope);
                    scopes.extend(m.chunks.into_values().map(|r| r.scope));
                }
                Err(StoreError::NoSuchGeneration { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        if let Some(head) = self.store.head(volume).await? {
            scopes.insert(head.scope);
        }
        Ok(scopes
            .into_iter()
            .filter(|s| volume::is_own_scope(volume, s))
            .collect())
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    fn attached(&self) -> std::sync::MutexGuard<'_, HashMap<VmId, Attached>> {
        self.attached.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn volumes(&self) -> std::sync::MutexGuard<'_, HashMap<(VmId, usize), Attached>> {
        self.volumes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The store volume of workspace volume `id` (see
    /// [`hearth_types::sandbox::VolumeMount`]).
    pub fn workspace_volume(id: &str) -> Result<VolumeId, StoreError> {
        format!("volume-{id}").parse()
    }

    /// The volume of a VM's disk.
    pub fn volume_of(vm: VmId) -> VolumeId {
        name(&format!("vm-{vm}"))
    }

    /// The image at `base` as a generation, imported on first use. The
    /// volume is named after the file's content identity (name, size and
    /// modification time: `hearth-image` writes each build to a new file).
    pub async fn image(&self, base: &Path) -> Result<Manifest, StoreError> {
        let meta = std::fs::metadata(base).map_err(|source| StoreError::Io {
            op: "stat",
            path: base.to_owned(),
            source,
        })?;
        let mtime = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        let key = blake3::hash(
            format!(
                "{}:{}:{mtime}",
                base.file_name().unwrap_or_default().to_string_lossy(),
                meta.len()
            )
            .as_bytes(),
        );
        let volume = name(&format!("image-{}", &key.to_hex()[..16]));
        let _one = self.importing.lock().await;
        if let Some(m) = self.store.head(&volume).await? {
            return Ok(m);
        }
        let started = std::time::Instant::now();
        let mut meta = BTreeMap::new();
        meta.insert("kind".into(), "image".into());
        meta.insert(
            "source".into(),
            base.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into(),
        );
        let m = match self
            .store
            .import_file(&images_scope(), &volume, base, CHUNK_SIZE, 0, meta)
            .await
        {
            Ok(m) => m,
            // Another host sharing the store imported the same image (the
            // volume is named after its content) at the same time: theirs
            // is as good as ours.
            Err(StoreError::Conflict { .. }) => match self.store.head(&volume).await? {
                Some(m) => {
                    tracing::info!(%volume, "another host imported this image first");
                    return Ok(m);
                }
                None => {
                    return Err(StoreError::Conflict {
                        volume,
                        parent: None,
                        head: None,
                    })
                }
            },
            Err(e) => return Err(e),
        };
        tracing::info!(%volume, chunks = m.chunks.len(), ms = started.elapsed().as_millis() as u64, "imported an image into the store");
        Ok(m)
    }

    /// The generation a fresh disk starts from: the snapshot's, or the
    /// built-in image's (imported on first use).
    async fn base_manifest(&self, req: &DiskRequest<'_>) -> Result<Manifest, HostError> {
        let Some(from) = req.from else {
            return Ok(self.image(req.base).await?);
        };
        let volume: VolumeId = from.parse()?;
        self.store
            .head(&volume)
            .await?
            .ok_or_else(|| HostError::Boot {
                id: req.vm,
                reason: format!("snapshot {volume} is not in the store"),
            })
    }

    /// The generation a VM's disk boots from, made or claimed as asked;
    /// the base is only read when the disk starts from it.
    async fn head_for(
        &self,
        req: &DiskRequest<'_>,
    ) -> Result<(Manifest, Option<Target>), HostError> {
        if !req.persistent {
            return Ok((self.base_manifest(req).await?, None));
        }
        let target = Target {
            volume: Self::volume_of(req.vm),
            scope: name(&format!("vm-{}", req.vm)),
            fence: req.fence,
        };
        let head = match self.store.head(&target.volume).await? {
            None => {
                let base = self.base_manifest(req).await?;
                self.store
                    .copy_volume(&base, &target.volume, &target.scope, req.fence)
                    .await?
            }
            Some(head) if req.fresh => {
                let image = self.base_manifest(req).await?;
                self.store
                    .commit(
                        &target.volume,
                        ManifestDraft {
                            scope: target.scope.clone(),
                            parent: Some(head.seq),
                            fence: req.fence,
                            size: image.size,
                            chunk_size: image.chunk_size,
                            meta: BTreeMap::new(),
                            chunks: image.chunks.clone(),
                        },
                    )
                    .await?
            }
            // Taken over at our fence, with what was flushed on top of the
            // head (by this host before a crash, or by a lost one) folded in.
            Some(head) => self
                .store
                .claim(&target.volume, req.fence)
                .await?
                .unwrap_or(head),
        };
        // New chunks go where the last generation's did, unless a snapshot
        // shares that scope (or it is not the disk's own): then to a fresh
        // one, so the disk's commits can delete their own garbage.
        let target = Target {
            scope: self.write_scope(&target.volume, &head).await?,
            ..target
        };
        Ok((head, Some(target)))
    }

    /// Where a writer of `volume` puts new chunks on top of `head`: the
    /// head's scope when it is the volume's own and no snapshot shares it,
    /// else a fresh one, so the volume's commits can delete their own
    /// garbage.
    async fn write_scope(&self, volume: &VolumeId, head: &Manifest) -> Result<ScopeId, StoreError> {
        if volume::is_own_scope(volume, &head.scope) && !self.store.is_shared(&head.scope).await? {
            Ok(head.scope.clone())
        } else {
            volume::fresh_scope(volume, head.seq)
        }
    }

    async fn prepare_inner(&self, req: DiskRequest<'_>) -> Result<DiskSpec, HostError> {
        let id = req.vm;
        if let Some(old) = self.attached().remove(&id) {
            old.volume.discard();
        }
        let (head, target) = self.head_for(&req).await?;
        let chunk = u64::from(head.chunk_size);
        let size = req
            .size
            .map_or(head.size, |s| s.bytes().div_ceil(chunk) * chunk)
            .max(head.size);
        let local = req.dir.join("disk.local");
        // The local file may come to hold the whole disk.
        let need = size.saturating_add(DISK_RESERVE);
        let free = self.available();
        if need > free {
            return Err(HostError::Invalid(format!(
                "vm {id}: a disk of {} does not fit on this host ({} free)",
                hearth_types::ByteSize(size),
                hearth_types::ByteSize(free)
            )));
        }
        let keep = target.is_some();
        let target = target.unwrap_or_else(|| Target {
            volume: Self::volume_of(id),
            scope: name(&format!("vm-{id}")),
            fence: req.fence,
        });
        let io = |what: &str| {
            let what = what.to_owned();
            move |source| HostError::Io { id, what, source }
        };
        let volume = Arc::new(
            Volume::open(self.store.clone(), target, &head, size, &local, keep)
                .map_err(io("create the disk's local file"))?,
        );
        let socket = req.run_dir.join("disk.sock");
        let _ = std::fs::remove_file(&socket);
        let listener =
            tokio::net::UnixListener::bind(&socket).map_err(io("bind the disk socket"))?;
        let mut tasks = vec![tokio::spawn(serve(listener, volume.clone(), id))];
        if keep && !self.commit_interval.is_zero() {
            tasks.push(tokio::spawn(commit_periodically(
                volume.clone(),
                self.commit_interval,
                id,
            )));
        }
        self.attached().insert(
            id,
            Attached {
                volume,
                keep,
                tasks,
            },
        );
        Ok(DiskSpec::nbd(socket, EXPORT))
    }

    /// Attaches a workspace volume beside the VM's root disk (see
    /// [`DiskProvider::prepare_volume`]). A writer claims the volume at
    /// its hold's fence (a former holder can commit no more) and commits
    /// like a persistent disk; a reader's writes (ext4 replaying its
    /// journal under a read-only mount) stay in its local file and go
    /// when it stops. The device is writable either way: the read-only
    /// promise is that nothing a reader writes reaches the volume.
    async fn prepare_volume_inner(&self, req: VolumeRequest<'_>) -> Result<DiskSpec, HostError> {
        let id = req.vm;
        if let Some(old) = self.volumes().remove(&(id, req.index)) {
            old.volume.discard();
        }
        let volume = Self::workspace_volume(&req.mount.volume)?;
        let fence = req.mount.fence(req.fence);
        let keep = !req.mount.read_only;
        let head = match self.store.head(&volume).await? {
            None => self.make_filesystem(&req, &volume, fence).await?,
            Some(head) if keep => self.store.claim(&volume, fence).await?.unwrap_or(head),
            Some(head) => head,
        };
        let scope = self.write_scope(&volume, &head).await?;
        let need = head.size.saturating_add(DISK_RESERVE);
        let free = self.available();
        if need > free {
            return Err(HostError::Invalid(format!(
                "vm {id}: volume {} of {} does not fit on this host ({} free)",
                req.mount.volume,
                hearth_types::ByteSize(head.size),
                hearth_types::ByteSize(free)
            )));
        }
        let io = |what: &str| {
            let what = what.to_owned();
            move |source| HostError::Io { id, what, source }
        };
        let target = Target {
            volume,
            scope,
            fence,
        };
        let local = req.dir.join(format!("volume-{}.local", req.index));
        let disk = Arc::new(
            Volume::open(self.store.clone(), target, &head, head.size, &local, keep)
                .map_err(io("create a volume's local file"))?,
        );
        let socket = req.run_dir.join(format!("volume-{}.sock", req.index));
        let _ = std::fs::remove_file(&socket);
        let listener =
            tokio::net::UnixListener::bind(&socket).map_err(io("bind a volume's socket"))?;
        let mut tasks = vec![tokio::spawn(serve(listener, disk.clone(), id))];
        if keep && !self.commit_interval.is_zero() {
            tasks.push(tokio::spawn(commit_periodically(
                disk.clone(),
                self.commit_interval,
                id,
            )));
        }
        self.volumes().insert(
            (id, req.index),
            Attached {
                volume: disk,
                keep,
                tasks,
            },
        );
        Ok(DiskSpec::nbd(socket, EXPORT).with_serial(req.mount.serial()))
    }

    /// A volume's first generation: an empty ext4 filesystem of its size
    /// whose root belongs to the images' `user` (1000:1000; root may write
    /// anywhere), made by the host's `mkfs.ext4` (it reads nothing a guest
    /// wrote). Another host making it at the same time is as good.
    async fn make_filesystem(
        &self,
        req: &VolumeRequest<'_>,
        volume: &VolumeId,
        fence: u64,
    ) -> Result<Manifest, HostError> {
        let id = req.vm;
        let io = |what: &str| {
            let what = what.to_owned();
            move |source| HostError::Io { id, what, source }
        };
        let file = req.dir.join(format!("volume-{}.mkfs", req.index));
        let _ = std::fs::remove_file(&file);
        std::fs::File::create(&file)
            .and_then(|f| f.set_len(req.mount.size.bytes()))
            .map_err(io("create a volume's first filesystem"))?;
        let out = tokio::process::Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0", "-L", "hearth-volume", "-E"])
            .arg("root_owner=1000:1000,lazy_itable_init=1,lazy_journal_init=1")
            .arg(&file)
            .output()
            .await
            .map_err(io("run mkfs.ext4"))?;
        if !out.status.success() {
            let _ = std::fs::remove_file(&file);
            return Err(HostError::Boot {
                id,
                reason: format!(
                    "mkfs.ext4 for volume {}: {}",
                    req.mount.volume,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        let mut meta = BTreeMap::new();
        meta.insert("kind".into(), "volume".into());
        let scope = ScopeId::new(volume.as_str().to_owned())?;
        let made = self
            .store
            .import_file(&scope, volume, &file, CHUNK_SIZE, fence, meta)
            .await;
        let _ = std::fs::remove_file(&file);
        match made {
            Ok(m) => {
                tracing::info!(vm = %id, %volume, chunks = m.chunks.len(), "made a volume's filesystem");
                Ok(m)
            }
            Err(StoreError::Conflict { .. }) => match self.store.head(volume).await? {
                Some(m) => Ok(m),
                None => Err(HostError::Boot {
                    id,
                    reason: format!("volume {volume} could not be made"),
                }),
            },
            Err(e) => Err(e.into()),
        }
    }

    /// Commits a running (or stopped but attached) VM's disk now: a
    /// snapshot's point in time. `None` when the VM has no disk attached.
    pub async fn commit(&self, vm: VmId) -> Result<Option<Manifest>, StoreError> {
        let volume = self.attached().get(&vm).map(|a| a.volume.clone());
        match volume {
            Some(v) => v.commit(BTreeMap::new()).await.map(Some),
            None => Ok(None),
        }
    }

    /// Marks the scope a running VM's disk writes to as shared, before a
    /// snapshot names its chunks (see [`Volume::share`]). A VM without an
    /// attached disk has nothing to mark: the copy marks what it names.
    pub async fn share(&self, vm: VmId) -> Result<(), StoreError> {
        let volume = self.attached().get(&vm).map(|a| a.volume.clone());
        match volume {
            Some(v) => v.share().await,
            None => Ok(()),
        }
    }

    /// The attached volume of a VM (tests and benchmarks count its bytes).
    pub fn attached_volume(&self, vm: VmId) -> Option<Arc<Volume>> {
        self.attached().get(&vm).map(|a| a.volume.clone())
    }

    async fn release_inner(&self, vm: VmId) -> Result<(), HostError> {
        let volumes = self.release_volumes_inner(vm).await;
        let root = self.release_root(vm).await;
        volumes.and(root)
    }

    /// Commits a writer's volumes of `vm` (whose VMM has exited) and drops
    /// the reader's; the first failure, after trying them all.
    async fn release_volumes_inner(&self, vm: VmId) -> Result<(), HostError> {
        let volumes: Vec<Attached> = {
            let mut all = self.volumes();
            let keys: Vec<_> = all.keys().filter(|k| k.0 == vm).copied().collect();
            keys.into_iter().filter_map(|k| all.remove(&k)).collect()
        };
        let mut failed = None;
        for mut a in volumes {
            for t in a.tasks.drain(..) {
                t.abort();
            }
            if a.keep {
                if let Err(e) = commit_with_retries(&a.volume, vm).await {
                    tracing::error!(%vm, error = %e, "a volume's last writes were not committed");
                    failed = Some(e);
                }
            }
            a.volume.discard();
        }
        match failed {
            Some(e) => Err(HostError::Boot {
                id: vm,
                reason: format!("a volume's last writes were not committed: {e}"),
            }),
            None => Ok(()),
        }
    }

    async fn release_root(&self, vm: VmId) -> Result<(), HostError> {
        let Some(mut a) = self.attached().remove(&vm) else {
            return Ok(());
        };
        for t in a.tasks.drain(..) {
            t.abort();
        }
        let result = if a.keep {
            commit_with_retries(&a.volume, vm).await.map(drop)
        } else {
            Ok(())
        };
        a.volume.discard();
        result.map_err(|e| HostError::Boot {
            id: vm,
            reason: format!("the disk's last writes were not committed: {e}"),
        })
    }
}

/// Scope of the built-in images' chunks.
fn images_scope() -> ScopeId {
    name("images")
}

/// A store name built from known-good parts.
fn name<T: std::str::FromStr>(s: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    s.parse().expect("store names built from ids are valid")
}

impl DiskProvider for GenerationDisks {
    fn prepare<'a>(&'a self, req: DiskRequest<'a>) -> DiskFuture<'a> {
        Box::pin(self.prepare_inner(req))
    }

    fn prepare_volume<'a>(&'a self, req: VolumeRequest<'a>) -> DiskFuture<'a> {
        Box::pin(self.prepare_volume_inner(req))
    }

    fn release<'a>(&'a self, vm: VmId) -> UnitFuture<'a> {
        Box::pin(self.release_inner(vm))
    }

    fn release_volumes<'a>(&'a self, vm: VmId) -> UnitFuture<'a> {
        Box::pin(self.release_volumes_inner(vm))
    }

    fn remove<'a>(&'a self, vm: VmId) -> UnitFuture<'a> {
        Box::pin(async move {
            if let Some(a) = self.attached().remove(&vm) {
                a.volume.discard();
            }
            // Its workspace volumes stay (they are the workspace's): only
            // what this VM attached goes.
            self.volumes().retain(|k, a| {
                if k.0 == vm {
                    a.volume.discard();
                }
                k.0 != vm
            });
            let volume = Self::volume_of(vm);
            let scopes = self.own_scopes(&volume).await?;
            self.store.delete_volume(&volume).await?;
            self.retire(scopes);
            Ok(())
        })
    }

    fn available(&self) -> u64 {
        crate::disks::disk_available(&self.data_dir).unwrap_or(0)
    }
}

/// Accepts QEMU's connections (one per boot or restore) and serves each.
async fn serve(listener: tokio::net::UnixListener, volume: Arc<Volume>, vm: VmId) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let volume = volume.clone();
                tokio::spawn(async move {
                    if let Err(e) = nbd::serve(stream, EXPORT, volume).await {
                        tracing::warn!(%vm, error = %e, "disk connection ended");
                    }
                });
            }
            Err(e) => {
                tracing::warn!(%vm, error = %e, "disk socket accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Journal weight past which a running disk is committed at once: the
/// chunk versions a busy `fsync`er leaves in the journal are garbage only
/// once a generation folds them (and its sweep deletes them).
pub const JOURNAL_FOLD_BYTES: u64 = 64 << 20;

/// Commits a running VM's disk every `every`, and sooner when its journal
/// passes [`JOURNAL_FOLD_BYTES`]; a failure (object storage unreachable)
/// is logged and retried at the next tick, since the chunks stay dirty. A
/// fenced volume stops committing.
async fn commit_periodically(volume: Arc<Volume>, every: Duration, vm: VmId) {
    let step = every.min(Duration::from_secs(1));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + step, step);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = tokio::time::Instant::now();
    loop {
        tick.tick().await;
        let heavy = volume.journal_bytes() >= JOURNAL_FOLD_BYTES;
        if !heavy && last.elapsed() < every {
            continue;
        }
        if !volume.uncommitted().await {
            last = tokio::time::Instant::now();
            continue;
        }
        match volume.commit(BTreeMap::new()).await {
            Ok(m) => {
                last = tokio::time::Instant::now();
                tracing::debug!(%vm, seq = m.seq, heavy, "committed the disk")
            }
            Err(e @ StoreError::Fenced { .. }) => {
                tracing::error!(%vm, error = %e, "the disk was taken over; no more commits");
                return;
            }
            Err(e) => {
                last = tokio::time::Instant::now();
                tracing::warn!(%vm, error = %e, "periodic disk commit failed; retrying later")
            }
        }
    }
}

/// The final commit of a stopped VM: retried with backoff for about half a
/// minute (object storage may be briefly away).
async fn commit_with_retries(volume: &Volume, vm: VmId) -> Result<Manifest, StoreError> {
    let mut delay = Duration::from_millis(500);
    let mut attempt = 0;
    loop {
        attempt += 1;
        match volume.commit(BTreeMap::new()).await {
            Ok(m) => return Ok(m),
            Err(e @ StoreError::Fenced { .. }) => return Err(e),
            Err(e) if attempt >= 6 => return Err(e),
            Err(e) => {
                tracing::warn!(%vm, attempt, error = %e, "disk commit failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
        }
    }
}
