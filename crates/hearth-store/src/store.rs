//! The `Store`: keys, chunks, generations and file import/export.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutPayload};

use crate::cache::Cache;
use crate::crypto::{self, ScopeKeys, NONCE_LEN};
use crate::error::StoreError;
use crate::id::{ScopeId, VolumeId};
use crate::kek::Kek;
use crate::manifest::{self, ChunkRef, Manifest, ManifestDraft};

/// How many chunks import and export keep in flight.
pub const CONCURRENCY: usize = 16;
/// The GC grace period assumed by `put_chunk`'s refresh rule unless
/// [`Store::with_gc_grace`] says otherwise.
pub const DEFAULT_GC_GRACE: Duration = Duration::from_secs(3600);

const CHUNK_MAGIC: &[u8; 4] = b"HCHK";
const KEY_MAGIC: &[u8; 4] = b"HKEY";
const FORMAT_VERSION: u8 = 1;
const CHUNK_HEADER_LEN: usize = 5 + NONCE_LEN;
const MAX_CHUNK_OBJECT: u64 = manifest::MAX_CHUNK_SIZE as u64 + 64;
const MAX_KEY_OBJECT: u64 = 64 << 10;
/// A manifest of a 1 TiB device at 64 KiB chunks is 700 MB; beyond 1 GiB
/// something is wrong.
const MAX_MANIFEST_OBJECT: u64 = 1 << 30;
/// Forget recent puts beyond this many entries (they are only an
/// optimisation).
const MAX_RECENT: usize = 1 << 20;

/// Where the store lives and how much local cache it may use.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// `file:///abs/dir`, `/abs/dir`, or `s3://bucket/prefix?…`
    /// (see [`Store::open`]).
    pub url: String,
    pub cache_dir: PathBuf,
    /// 0 disables the cache.
    pub cache_max_bytes: u64,
}

/// Counters since the store was opened. Bytes are object bytes (what
/// crossed the wire: ciphertext plus 45 bytes of header, nonce and tag).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub bytes_uploaded: u64,
    pub chunks_uploaded: u64,
    pub bytes_fetched: u64,
    pub chunks_fetched: u64,
    pub cache_hits: u64,
}

#[derive(Default)]
struct Counters {
    bytes_uploaded: AtomicU64,
    chunks_uploaded: AtomicU64,
    bytes_fetched: AtomicU64,
    chunks_fetched: AtomicU64,
    cache_hits: AtomicU64,
}

/// The generation store. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) os: Arc<dyn ObjectStore>,
    kek: Arc<dyn Kek>,
    pub(crate) cache: Arc<Cache>,
    keys: Mutex<HashMap<ScopeId, Arc<ScopeKeys>>>,
    /// Chunks this instance PUT recently, and when.
    recent: Mutex<HashMap<ChunkRef, Instant>>,
    refresh_after: Duration,
    /// Keep uploaded chunks in the cache (not for a local directory).
    cache_uploads: bool,
    /// Scopes known to be marked shared (a mark is never removed).
    pub(crate) shared: Mutex<std::collections::HashSet<ScopeId>>,
    stats: Counters,
}

pub(crate) fn backend(op: impl Into<String>) -> impl FnOnce(object_store::Error) -> StoreError {
    let op = op.into();
    move |source| StoreError::Backend { op, source }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pub(crate) fn chunk_path(r: &ChunkRef) -> ObjPath {
    let hex = r.hex();
    ObjPath::from(format!("chunks/{}/{}/{}", r.scope, &hex[..2], hex))
}

fn key_path(scope: &ScopeId) -> ObjPath {
    ObjPath::from(format!("keys/{scope}"))
}

pub(crate) fn volume_prefix(volume: &VolumeId) -> ObjPath {
    ObjPath::from(format!("volumes/{volume}"))
}

fn manifest_path(volume: &VolumeId, seq: u64) -> ObjPath {
    ObjPath::from(format!("volumes/{volume}/{seq:016x}"))
}

/// Parses a manifest file name (16 lower-case hex digits).
pub(crate) fn parse_seq(name: &str) -> Option<u64> {
    if name.len() != 16 || !name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    u64::from_str_radix(name, 16).ok()
}

fn chunk_aad(r: &ChunkRef) -> Vec<u8> {
    let mut a = Vec::with_capacity(16 + 1 + r.scope.as_str().len() + 32);
    a.extend_from_slice(b"hearth chunk v1");
    a.push(r.scope.as_str().len() as u8);
    a.extend_from_slice(r.scope.as_str().as_bytes());
    a.extend_from_slice(&r.hash);
    a
}

/// Reads a whole object of at most `max` bytes; `None` when absent.
pub(crate) async fn get_bounded(
    os: &dyn ObjectStore,
    path: &ObjPath,
    max: u64,
    what: &str,
) -> Result<Option<Bytes>, StoreError> {
    let got = match os.get(path).await {
        Ok(g) => g,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(backend(format!("get {what}"))(e)),
    };
    if got.meta.size > max {
        return Err(StoreError::Backend {
            op: format!("get {what}"),
            source: object_store::Error::Generic {
                store: "hearth-store",
                source: format!(
                    "object of {} bytes exceeds the {max}-byte limit",
                    got.meta.size
                )
                .into(),
            },
        });
    }
    match got.bytes().await {
        Ok(b) => Ok(Some(b)),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(backend(format!("get {what}"))(e)),
    }
}

impl Store {
    /// Opens a store. The object store is not contacted until first use.
    pub async fn open(cfg: StoreConfig, kek: Arc<dyn Kek>) -> Result<Store, StoreError> {
        let os = crate::backend::open(&cfg.url)?;
        // A local directory is as near as the cache: keeping what we upload
        // there too would only hold every written chunk twice on the host.
        let cache_uploads = !(cfg.url.starts_with('/') || cfg.url.starts_with("file:"));
        let cache = Cache::open(cfg.cache_dir, cfg.cache_max_bytes)?;
        Ok(Store {
            inner: Arc::new(Inner {
                os,
                kek,
                cache,
                keys: Mutex::default(),
                recent: Mutex::default(),
                refresh_after: DEFAULT_GC_GRACE / 2,
                cache_uploads,
                shared: Mutex::default(),
                stats: Counters::default(),
            }),
        })
    }

    /// Tells `put_chunk` the GC grace in use (it re-PUTs a chunk it put
    /// itself once grace/2 has passed). Call before cloning.
    pub fn with_gc_grace(self, grace: Duration) -> Store {
        let mut inner = match Arc::try_unwrap(self.inner) {
            Ok(inner) => inner,
            Err(shared) => return Store { inner: shared },
        };
        inner.refresh_after = grace / 2;
        Store {
            inner: Arc::new(inner),
        }
    }

    /// Counters since open.
    pub fn stats(&self) -> StoreStats {
        let s = &self.inner.stats;
        StoreStats {
            bytes_uploaded: s.bytes_uploaded.load(Ordering::Relaxed),
            chunks_uploaded: s.chunks_uploaded.load(Ordering::Relaxed),
            bytes_fetched: s.bytes_fetched.load(Ordering::Relaxed),
            chunks_fetched: s.chunks_fetched.load(Ordering::Relaxed),
            cache_hits: s.cache_hits.load(Ordering::Relaxed),
        }
    }

    // ---- keys -------------------------------------------------------

    /// The keys of a scope, creating its data key if `create` and absent.
    pub(crate) async fn scope_keys(
        &self,
        scope: &ScopeId,
        create: bool,
    ) -> Result<Arc<ScopeKeys>, StoreError> {
        if let Some(k) = self.lock_keys().get(scope) {
            return Ok(Arc::clone(k));
        }
        let path = key_path(scope);
        let os = &*self.inner.os;
        let what = format!("data key of scope {scope}");
        let mut obj = get_bounded(os, &path, MAX_KEY_OBJECT, &what).await?;
        if obj.is_none() {
            if !create {
                return Err(StoreError::MissingKey {
                    scope: scope.clone(),
                });
            }
            let fresh = self.encode_key_object(scope, &crypto::random::<32>())?;
            match os
                .put_opts(
                    &path,
                    PutPayload::from(fresh.clone()),
                    PutMode::Create.into(),
                )
                .await
            {
                Ok(_) => obj = Some(fresh.into()),
                // Another writer created it first: use theirs.
                Err(object_store::Error::AlreadyExists { .. }) => {
                    obj = get_bounded(os, &path, MAX_KEY_OBJECT, &what).await?;
                }
                Err(e) => return Err(backend(format!("create {what}"))(e)),
            }
        }
        let obj = obj.ok_or_else(|| StoreError::MissingKey {
            scope: scope.clone(),
        })?;
        let data_key = self.decode_key_object(scope, &obj)?;
        let keys = Arc::new(ScopeKeys::derive(&data_key));
        self.lock_keys().insert(scope.clone(), Arc::clone(&keys));
        Ok(keys)
    }

    fn lock_keys(&self) -> std::sync::MutexGuard<'_, HashMap<ScopeId, Arc<ScopeKeys>>> {
        self.inner.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `"HKEY" | version | kek_id_len u8 | kek_id | check[32] | wrapped`,
    /// where `check` is a keyed hash of the scope name under the data key:
    /// it binds the key to its scope (a key object copied to another
    /// scope's name is refused).
    fn encode_key_object(
        &self,
        scope: &ScopeId,
        data_key: &[u8; 32],
    ) -> Result<Vec<u8>, StoreError> {
        let kek = &self.inner.kek;
        let id = kek.id().as_bytes();
        let id = &id[..id.len().min(255)];
        let mut out = Vec::new();
        out.extend_from_slice(KEY_MAGIC);
        out.push(FORMAT_VERSION);
        out.push(id.len() as u8);
        out.extend_from_slice(id);
        out.extend_from_slice(&key_check(data_key, scope));
        out.extend_from_slice(&kek.wrap(data_key)?);
        Ok(out)
    }

    fn decode_key_object(&self, scope: &ScopeId, obj: &[u8]) -> Result<[u8; 32], StoreError> {
        let corrupt = |reason| StoreError::CorruptKey {
            scope: scope.clone(),
            reason,
        };
        let kek = &self.inner.kek;
        if obj.len() < 6 || &obj[..4] != KEY_MAGIC {
            return Err(corrupt("bad magic"));
        }
        if obj[4] != FORMAT_VERSION {
            return Err(corrupt("unknown version"));
        }
        let id_len = usize::from(obj[5]);
        let rest = &obj[6..];
        if rest.len() < id_len + 32 {
            return Err(corrupt("truncated"));
        }
        let (id, rest) = rest.split_at(id_len);
        let (check, wrapped) = rest.split_at(32);
        let wrong = || StoreError::WrongKey {
            scope: scope.clone(),
            kek: kek.id().to_owned(),
        };
        if id != kek.id().as_bytes() {
            return Err(wrong());
        }
        let data_key = kek.unwrap(wrapped).map_err(|e| match e {
            StoreError::KekRejected { .. } => wrong(),
            other => other,
        })?;
        if key_check(&data_key, scope) != check {
            return Err(corrupt("data key belongs to another scope"));
        }
        Ok(data_key)
    }

    // ---- chunks -----------------------------------------------------

    /// Stores a chunk and returns its reference. Always PUTs (refreshing
    /// the object's age for GC) unless this instance PUT the same chunk
    /// less than grace/2 ago.
    pub async fn put_chunk(
        &self,
        scope: &ScopeId,
        plaintext: &[u8],
    ) -> Result<ChunkRef, StoreError> {
        let keys = self.scope_keys(scope, true).await?;
        let (r, obj) = self.prepare(&keys, scope, plaintext);
        if let Some(obj) = obj {
            self.upload(&r, obj).await?;
        }
        Ok(r)
    }

    /// Hashes a chunk and, unless recently put, seals it. CPU only.
    fn prepare(
        &self,
        keys: &ScopeKeys,
        scope: &ScopeId,
        plaintext: &[u8],
    ) -> (ChunkRef, Option<Bytes>) {
        let r = ChunkRef {
            scope: scope.clone(),
            hash: keys.chunk_id(plaintext),
        };
        if self.recently_put(&r) {
            return (r, None);
        }
        let (nonce, ct) = keys.seal_chunk(plaintext, &chunk_aad(&r));
        let mut obj = Vec::with_capacity(CHUNK_HEADER_LEN + ct.len());
        obj.extend_from_slice(CHUNK_MAGIC);
        obj.push(FORMAT_VERSION);
        obj.extend_from_slice(&nonce);
        obj.extend_from_slice(&ct);
        (r, Some(obj.into()))
    }

    /// Forgets that this instance put `r` (it was deleted): the next put
    /// of the same content uploads it again.
    pub(crate) fn forget_put(&self, r: &ChunkRef) {
        let mut recent = self.inner.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent.remove(r);
    }

    fn recently_put(&self, r: &ChunkRef) -> bool {
        let recent = self.inner.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent
            .get(r)
            .is_some_and(|t| t.elapsed() < self.inner.refresh_after)
    }

    async fn upload(&self, r: &ChunkRef, obj: Bytes) -> Result<(), StoreError> {
        let len = obj.len() as u64;
        self.inner
            .os
            .put(&chunk_path(r), PutPayload::from(obj.clone()))
            .await
            .map_err(backend(format!(
                "put chunk {} of scope {}",
                r.hex(),
                r.scope
            )))?;
        let s = &self.inner.stats;
        s.bytes_uploaded.fetch_add(len, Ordering::Relaxed);
        s.chunks_uploaded.fetch_add(1, Ordering::Relaxed);
        {
            let mut recent = self.inner.recent.lock().unwrap_or_else(|p| p.into_inner());
            if recent.len() >= MAX_RECENT {
                let window = self.inner.refresh_after;
                recent.retain(|_, t| t.elapsed() < window);
                if recent.len() >= MAX_RECENT {
                    recent.clear();
                }
            }
            recent.insert(r.clone(), Instant::now());
        }
        // Just-written chunks are the likeliest to be read back.
        if self.inner.cache_uploads {
            self.inner.cache.put(r, obj).await;
        }
        Ok(())
    }

    /// Reads a chunk: from the cache, else from the object store (then
    /// cached). Both copies are verified (AEAD tag and content address); a
    /// corrupt cache entry is dropped and refetched, a corrupt stored
    /// object is [`StoreError::Corrupt`].
    pub async fn get_chunk(&self, r: &ChunkRef) -> Result<Bytes, StoreError> {
        let keys = self.scope_keys(&r.scope, false).await?;
        if let Some(obj) = self.inner.cache.get(r).await {
            if let Some(pt) = verify_chunk(&keys, r, &obj) {
                self.inner.stats.cache_hits.fetch_add(1, Ordering::Relaxed);
                return Ok(pt.into());
            }
            tracing::warn!(scope = %r.scope, chunk = %r.hex(), "corrupt chunk cache entry dropped");
            self.inner.cache.remove(r).await;
        }
        let what = format!("chunk {} of scope {}", r.hex(), r.scope);
        let obj = get_bounded(&*self.inner.os, &chunk_path(r), MAX_CHUNK_OBJECT, &what)
            .await?
            .ok_or_else(|| StoreError::MissingChunk {
                scope: r.scope.clone(),
                chunk: r.hex(),
            })?;
        let s = &self.inner.stats;
        s.bytes_fetched
            .fetch_add(obj.len() as u64, Ordering::Relaxed);
        s.chunks_fetched.fetch_add(1, Ordering::Relaxed);
        let pt = verify_chunk(&keys, r, &obj).ok_or_else(|| StoreError::Corrupt {
            scope: r.scope.clone(),
            chunk: r.hex(),
        })?;
        self.inner.cache.put(r, obj).await;
        Ok(pt.into())
    }

    // ---- generations ------------------------------------------------

    /// The sequence numbers of a volume's generations, ascending.
    pub async fn generations(&self, volume: &VolumeId) -> Result<Vec<u64>, StoreError> {
        let prefix = volume_prefix(volume);
        let metas: Vec<_> = self
            .inner
            .os
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(backend(format!("list generations of volume {volume}")))?;
        let mut seqs: Vec<u64> = metas
            .iter()
            .filter(|m| m.location.parts().count() == prefix.parts().count() + 1)
            .filter_map(|m| m.location.filename().and_then(parse_seq))
            .collect();
        seqs.sort_unstable();
        Ok(seqs)
    }

    /// The newest generation, if the volume has any.
    pub async fn head(&self, volume: &VolumeId) -> Result<Option<Manifest>, StoreError> {
        // A generation pruned between list and get: list again.
        for _ in 0..3 {
            let Some(&seq) = self.generations(volume).await?.last() else {
                return Ok(None);
            };
            match self.manifest(volume, seq).await {
                Err(StoreError::NoSuchGeneration { .. }) => continue,
                other => return other.map(Some),
            }
        }
        Err(StoreError::NoSuchGeneration {
            volume: volume.clone(),
            seq: u64::MAX,
        })
    }

    /// One generation.
    pub async fn manifest(&self, volume: &VolumeId, seq: u64) -> Result<Manifest, StoreError> {
        let what = format!("manifest {seq} of volume {volume}");
        let obj = get_bounded(
            &*self.inner.os,
            &manifest_path(volume, seq),
            MAX_MANIFEST_OBJECT,
            &what,
        )
        .await?
        .ok_or_else(|| StoreError::NoSuchGeneration {
            volume: volume.clone(),
            seq,
        })?;
        let corrupt = |reason: String| StoreError::CorruptManifest {
            volume: volume.clone(),
            seq,
            reason,
        };
        let sealed = manifest::split_object(&obj).map_err(corrupt)?;
        let scope = sealed.scope;
        let keys = self.scope_keys(&scope, false).await?;
        let aad = manifest::aad(sealed.header, volume, seq);
        let body = keys
            .open_manifest(sealed.nonce, sealed.ciphertext, &aad)
            .ok_or_else(|| corrupt("does not authenticate".into()))?;
        let m = tokio::task::spawn_blocking(move || manifest::decode_body(&body, &scope))
            .await
            .map_err(|_| StoreError::Task {
                what: "decode manifest",
            })?
            .map_err(corrupt)?;
        if &m.volume != volume || m.seq != seq {
            return Err(corrupt("names another volume or generation".into()));
        }
        Ok(m)
    }

    /// Commits a new generation on top of `draft.parent`, fenced by
    /// `draft.fence`: [`StoreError::Fenced`] if the head has a higher
    /// fence, [`StoreError::Conflict`] if the head is not the parent.
    pub async fn commit(
        &self,
        volume: &VolumeId,
        draft: ManifestDraft,
    ) -> Result<Manifest, StoreError> {
        let invalid = |reason: String| StoreError::InvalidDraft {
            volume: volume.clone(),
            reason,
        };
        manifest::check_shape(draft.size, draft.chunk_size, &draft.chunks).map_err(invalid)?;
        let scopes: std::collections::BTreeSet<&ScopeId> =
            draft.chunks.values().map(|c| &c.scope).collect();
        if scopes.len() >= usize::from(u16::MAX) {
            return Err(invalid("too many scopes".into()));
        }
        let keys = self.scope_keys(&draft.scope, true).await?;
        let mut raced = false;
        loop {
            let head = self.head(volume).await?;
            let seq = classify(volume, head.as_ref(), draft.parent, draft.fence)?;
            let m = Manifest {
                volume: volume.clone(),
                seq,
                parent: draft.parent,
                fence: draft.fence,
                scope: draft.scope.clone(),
                size: draft.size,
                chunk_size: draft.chunk_size,
                created_at_ms: now_ms(),
                meta: draft.meta.clone(),
                chunks: draft.chunks.clone(),
            };
            let header = manifest::header(&m.scope);
            let (nonce, ct) = keys.seal_manifest(
                &manifest::encode_body(&m),
                &manifest::aad(&header, volume, seq),
            );
            let mut obj = header;
            obj.extend_from_slice(&nonce);
            obj.extend_from_slice(&ct);
            let put = self
                .inner
                .os
                .put_opts(
                    &manifest_path(volume, seq),
                    PutPayload::from(obj),
                    PutMode::Create.into(),
                )
                .await;
            match put {
                Ok(_) => return Ok(m),
                Err(object_store::Error::AlreadyExists { .. }) if !raced => {
                    // Lost a race: the re-read head classifies it.
                    raced = true;
                }
                Err(object_store::Error::AlreadyExists { .. }) => {
                    return Err(StoreError::Conflict {
                        volume: volume.clone(),
                        parent: draft.parent,
                        head: Some(seq),
                    })
                }
                Err(e) => {
                    return Err(backend(format!("create manifest {seq} of volume {volume}"))(e))
                }
            }
        }
    }

    /// Takes a volume over at `fence` with everything flushed into it: when
    /// the head has an older fence or a journal (what its writer flushed
    /// since, see [`crate::journal`]), writes a generation with the head's
    /// chunks, the journal replayed on top, and the new fence, so a writer
    /// with an older fence can never commit again; then drops the folded
    /// records. The head itself when it already has this fence and no
    /// journal; [`StoreError::Fenced`] when it has a higher fence; `None`
    /// for a volume without generations.
    pub async fn claim(
        &self,
        volume: &VolumeId,
        fence: u64,
    ) -> Result<Option<Manifest>, StoreError> {
        let mut attempts = 0;
        loop {
            let Some(head) = self.head(volume).await? else {
                return Ok(None);
            };
            if head.fence > fence {
                return Err(StoreError::Fenced {
                    volume: volume.clone(),
                    head_fence: head.fence,
                    ours: fence,
                });
            }
            let records = self.journal(volume, head.seq, head.fence).await?;
            if head.fence == fence && records.is_empty() {
                return Ok(Some(head));
            }
            let base = head.seq;
            let mut chunks = head.chunks;
            let mut size = head.size;
            for r in &records {
                if r.chunk_size != head.chunk_size {
                    return Err(StoreError::CorruptManifest {
                        volume: volume.clone(),
                        seq: base,
                        reason: format!(
                            "journal record {} has chunks of {} bytes, the generation {}",
                            r.n, r.chunk_size, head.chunk_size
                        ),
                    });
                }
                r.apply(&mut chunks);
                size = size.max(r.size);
            }
            let draft = ManifestDraft {
                scope: head.scope,
                parent: Some(base),
                fence,
                size,
                chunk_size: head.chunk_size,
                meta: head.meta,
                chunks,
            };
            match self.commit(volume, draft).await {
                Err(StoreError::Conflict { .. }) if attempts < 5 => attempts += 1,
                Ok(m) => {
                    if !records.is_empty() {
                        tracing::info!(%volume, base, records = records.len(), seq = m.seq, "folded the flush journal into a generation");
                        if let Err(e) = self.delete_journal(volume, base).await {
                            tracing::warn!(%volume, base, error = %e, "cannot delete folded journal records; GC will");
                        }
                    }
                    return Ok(Some(m));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A new volume whose first generation references `from`'s chunks (none
    /// is copied): how a sandbox starts from a snapshot.
    pub async fn copy_volume(
        &self,
        from: &Manifest,
        to: &VolumeId,
        scope: &ScopeId,
        fence: u64,
    ) -> Result<Manifest, StoreError> {
        // Another volume is about to name these scopes' chunks.
        let scopes: std::collections::BTreeSet<&ScopeId> = from
            .chunks
            .values()
            .map(|c| &c.scope)
            .filter(|s| s.as_str() != to.as_str())
            .collect();
        for s in scopes {
            self.mark_shared(s).await?;
        }
        let draft = ManifestDraft {
            scope: scope.clone(),
            parent: None,
            fence,
            size: from.size,
            chunk_size: from.chunk_size,
            meta: from.meta.clone(),
            chunks: from.chunks.clone(),
        };
        self.commit(to, draft).await
    }

    /// Deletes a volume's manifests and journal (not its chunks: GC does
    /// that).
    /// Returns how many were deleted.
    pub async fn delete_volume(&self, volume: &VolumeId) -> Result<usize, StoreError> {
        let seqs = self.generations(volume).await?;
        for &seq in &seqs {
            self.delete_manifest(volume, seq).await?;
        }
        let records: Vec<_> = self
            .inner
            .os
            .list(Some(&crate::journal::journal_prefix(volume)))
            .try_collect()
            .await
            .map_err(backend(format!("list the journal of volume {volume}")))?;
        for (v, base, n) in records
            .iter()
            .filter_map(|m| crate::journal::parse_record_path(&m.location))
        {
            self.delete_record(&v, base, n).await?;
        }
        Ok(seqs.len())
    }

    pub(crate) async fn delete_manifest(
        &self,
        volume: &VolumeId,
        seq: u64,
    ) -> Result<(), StoreError> {
        match self.inner.os.delete(&manifest_path(volume, seq)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(backend(format!("delete manifest {seq} of volume {volume}"))(e)),
        }
    }

    // ---- files ------------------------------------------------------

    /// Chunks a raw file (a rootfs image, a guest memory file) into
    /// `chunk_size` pieces, skips all-zero chunks, uploads the rest
    /// ([`CONCURRENCY`] in flight) and commits them as the next generation
    /// of `volume` (the first if it has none) at `fence`.
    pub async fn import_file(
        &self,
        scope: &ScopeId,
        volume: &VolumeId,
        path: &Path,
        chunk_size: u32,
        fence: u64,
        meta: BTreeMap<String, String>,
    ) -> Result<Manifest, StoreError> {
        manifest::check_chunk_size(chunk_size).map_err(|reason| StoreError::InvalidDraft {
            volume: volume.clone(),
            reason,
        })?;
        // A volume not named after its scope (saved memory in a sandbox's
        // scope) may share chunks with the scope's own volume.
        if scope.as_str() != volume.as_str() {
            self.mark_shared(scope).await?;
        }
        let io = |op, source| StoreError::Io {
            op,
            path: path.to_owned(),
            source,
        };
        let file = Arc::new(std::fs::File::open(path).map_err(|e| io("open", e))?);
        let size = file.metadata().map_err(|e| io("stat", e))?.len();
        let parent = self.head(volume).await?;
        if let Some(h) = &parent {
            classify(volume, Some(h), Some(h.seq), fence)?;
        }
        let keys = self.scope_keys(scope, true).await?;
        let cs = u64::from(chunk_size);
        let count = manifest::chunk_count(size, chunk_size);
        // Only chunks holding data are read: a guest memory file is mostly
        // holes (a 2 GiB guest that used 150 MiB).
        let with_data = data_chunks(&file, size, cs).unwrap_or_else(|| (0..count).collect());
        let chunks: BTreeMap<u64, ChunkRef> = futures_util::stream::iter(with_data)
            .map(|index| {
                let file = Arc::clone(&file);
                let keys = Arc::clone(&keys);
                let this = self.clone();
                let scope = scope.clone();
                let path = path.to_owned();
                async move {
                    let prepared = tokio::task::spawn_blocking(move || {
                        use std::os::unix::fs::FileExt;
                        let offset = index * cs;
                        let len = (size - offset).min(cs) as usize;
                        let mut buf = vec![0u8; chunk_size as usize];
                        file.read_exact_at(&mut buf[..len], offset)
                            .map_err(|source| StoreError::Io {
                                op: "read",
                                path,
                                source,
                            })?;
                        if buf.iter().all(|&b| b == 0) {
                            return Ok(None);
                        }
                        Ok(Some(this.prepare(&keys, &scope, &buf)))
                    })
                    .await
                    .map_err(|_| StoreError::Task { what: "read chunk" })??;
                    let Some((r, obj)) = prepared else {
                        return Ok(None);
                    };
                    if let Some(obj) = obj {
                        self.upload(&r, obj).await?;
                    }
                    Ok::<_, StoreError>(Some((index, r)))
                }
            })
            .buffer_unordered(CONCURRENCY)
            .try_filter_map(|x| async move { Ok(x) })
            .try_collect()
            .await?;
        let draft = ManifestDraft {
            scope: scope.clone(),
            parent: parent.map(|h| h.seq),
            fence,
            size,
            chunk_size,
            meta,
            chunks,
        };
        self.commit(volume, draft).await
    }

    /// Writes a generation to a sparse file of `manifest.size` bytes
    /// (absent chunks are holes), fetching [`CONCURRENCY`] chunks at once.
    pub async fn export_to_file(&self, manifest: &Manifest, path: &Path) -> Result<(), StoreError> {
        let io = |op, source| StoreError::Io {
            op,
            path: path.to_owned(),
            source,
        };
        let file = std::fs::File::create(path).map_err(|e| io("create", e))?;
        file.set_len(manifest.size).map_err(|e| io("size", e))?;
        let file = Arc::new(file);
        let cs = u64::from(manifest.chunk_size);
        let size = manifest.size;
        // Owned items: a stream over borrowed pairs makes this future Send
        // only for one lifetime, which callers' Send bounds cannot name.
        let chunks: Vec<(u64, ChunkRef)> = manifest
            .chunks
            .iter()
            .map(|(&i, r)| (i, r.clone()))
            .collect();
        let this = self.clone();
        let writer = Arc::clone(&file);
        futures_util::stream::iter(chunks)
            .map(move |(index, r)| {
                let file = Arc::clone(&writer);
                let path = path.to_owned();
                let this = this.clone();
                async move {
                    let data = this.get_chunk(&r).await?;
                    tokio::task::spawn_blocking(move || {
                        use std::os::unix::fs::FileExt;
                        let offset = index * cs;
                        let len = (size.saturating_sub(offset)).min(cs).min(data.len() as u64);
                        file.write_all_at(&data[..len as usize], offset)
                            .map_err(|source| StoreError::Io {
                                op: "write",
                                path,
                                source,
                            })
                    })
                    .await
                    .map_err(|_| StoreError::Task {
                        what: "write chunk",
                    })?
                }
            })
            .buffer_unordered(CONCURRENCY)
            .try_collect::<()>()
            .await?;
        file.sync_all().map_err(|e| io("sync", e))
    }
}

/// Indices of the `chunk`-sized chunks of `file` (`size` bytes) that hold
/// data, from the filesystem's map of holes; `None` when the filesystem
/// cannot tell.
fn data_chunks(file: &std::fs::File, size: u64, chunk: u64) -> Option<Vec<u64>> {
    let extents = hearth_types::extents::data_extents(file, size).ok()?;
    let mut out: Vec<u64> = Vec::new();
    for range in extents {
        for i in range.start / chunk..range.end.div_ceil(chunk) {
            if out.last() != Some(&i) {
                out.push(i);
            }
        }
    }
    Some(out)
}

/// The fencing rule: the seq a draft on `parent` at `fence` may take.
fn classify(
    volume: &VolumeId,
    head: Option<&Manifest>,
    parent: Option<u64>,
    fence: u64,
) -> Result<u64, StoreError> {
    match head {
        None if parent.is_none() => Ok(0),
        Some(h) if h.fence > fence => Err(StoreError::Fenced {
            volume: volume.clone(),
            head_fence: h.fence,
            ours: fence,
        }),
        Some(h) if Some(h.seq) == parent => Ok(h.seq + 1),
        _ => Err(StoreError::Conflict {
            volume: volume.clone(),
            parent,
            head: head.map(|h| h.seq),
        }),
    }
}

fn key_check(data_key: &[u8; 32], scope: &ScopeId) -> [u8; 32] {
    let k = blake3::derive_key("hearth key check v1", data_key);
    *blake3::keyed_hash(&k, scope.as_str().as_bytes()).as_bytes()
}

/// Opens a chunk object: the plaintext if the tag and the address check.
fn verify_chunk(keys: &ScopeKeys, r: &ChunkRef, obj: &[u8]) -> Option<Vec<u8>> {
    if obj.len() < CHUNK_HEADER_LEN || &obj[..4] != CHUNK_MAGIC || obj[4] != FORMAT_VERSION {
        return None;
    }
    let pt = keys.open_chunk(
        &obj[5..CHUNK_HEADER_LEN],
        &obj[CHUNK_HEADER_LEN..],
        &chunk_aad(r),
    )?;
    (keys.chunk_id(&pt) == r.hash).then_some(pt)
}
