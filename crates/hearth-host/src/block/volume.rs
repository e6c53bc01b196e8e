//! One VM's disk as a block device over a generation of the store.
//!
//! The device is a local sparse file (`<vm dir>/disk.local`), filled lazily:
//! a chunk the manifest names is fetched (and verified) from the store the
//! first time it is read or partly written, and an all-zero chunk is never
//! fetched at all. Writes land in the local file and mark their chunks
//! dirty; [`Volume::commit`] turns the dirty chunks into a new generation,
//! uploading only those chunks.
//!
//! **Flush means durable.** A persistent volume answers a guest's `FLUSH`
//! only once everything written before it is in the store: the chunks
//! written since the previous flush are uploaded and a journal record
//! naming them is appended on top of the current generation
//! ([`hearth_store::journal`]). Concurrent flushes are grouped: a flush
//! waits for one round that started after it arrived, so a database
//! calling `fsync` from many threads costs one round trip per round, not
//! per call. The local file is a cache like any other: after a crash of
//! the agent or the loss of the host it is discarded, and the disk comes
//! back from its last generation with the journal folded in
//! ([`Store::claim`]), holding every flushed write. A non-persistent
//! volume keeps nothing past its VM, so its flush has nothing to promise
//! and answers at once.
//!
//! A commit (and a flush round) is crash-consistent: under the device lock
//! the dirty chunks are copied to a staging file (a local copy,
//! milliseconds for tens of MiB) and the dirty set is noted, each chunk
//! with the number of the write that last dirtied it; the upload runs from
//! the staging file while the guest keeps writing. Only a round that
//! succeeds cleans its chunks, and only those not written again since, so
//! a failed round, or one cancelled half way (a task aborted at a stop),
//! leaves everything dirty for the next.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::{StreamExt, TryStreamExt};
use hearth_store::{
    ChunkRef, JournalRecord, Manifest, ManifestDraft, ScopeId, Store, StoreError, VolumeId,
};
use tokio::sync::Mutex;

use super::nbd::BlockDevice;

/// Chunks uploaded at once by a commit.
const UPLOADS_IN_FLIGHT: usize = 8;
/// Chunks fetched at once when a read needs several.
const FETCHES_IN_FLIGHT: usize = 8;
/// Chunks fetched ahead of a sequential read (1 MiB at 64 KiB chunks).
const READAHEAD: u64 = 16;

/// Where a volume commits its generations.
#[derive(Clone, Debug)]
pub struct Target {
    pub volume: VolumeId,
    /// Key scope of the chunks this volume writes.
    pub scope: ScopeId,
    /// The placement generation this host holds for the volume.
    pub fence: u64,
}

pub struct Volume {
    store: Store,
    target: Target,
    chunk: u64,
    /// Fixed for the volume's life: a disk grows between boots.
    size: u64,
    file: std::fs::File,
    path: PathBuf,
    staging: PathBuf,
    /// Flushes are made durable in the store (persistent volumes).
    durable: bool,
    inner: Mutex<Inner>,
    /// One commit or flush round at a time; what the sweep after a commit
    /// needs to know.
    committing: Mutex<Sweep>,
    /// Chunk bytes uploaded by flushes since the last generation (the
    /// journal's weight: past a bound the journal is folded).
    journal_bytes: AtomicU64,
    /// Rounds (flushes and commits) that have taken their dirty set.
    rounds_started: AtomicU64,
    /// The last round that made its dirty set durable; every write
    /// answered before that round started is in the store.
    durable_round: AtomicU64,
}

/// What a persistent volume's commit deletes of its own garbage (see
/// [`hearth_store::sweep`]): chunks of the generation it prunes and chunk
/// versions its flushes uploaded, that neither kept generation names.
struct Sweep {
    /// The key scope new chunks go to: the target's, until a snapshot
    /// shares it; then a fresh one (see [`Volume::sweep`]), so that the
    /// disk's own garbage stays its own to delete.
    scope: ScopeId,
    /// The chunk map of generation `Inner::seq` as committed.
    head: BTreeMap<u64, ChunkRef>,
    /// The chunk map of its parent, when known (not after an open).
    parent: Option<BTreeMap<u64, ChunkRef>>,
    /// Chunks of our scope uploaded since `head` was committed.
    uploaded: Vec<ChunkRef>,
}

struct Inner {
    /// The generation the local file was built on; the source of chunks not
    /// yet present locally.
    seq: u64,
    chunks: BTreeMap<u64, ChunkRef>,
    /// The local file holds this chunk's current content.
    present: Vec<bool>,
    /// Written since the last flush or commit: only the local file has
    /// their current content. Each with the number of its last write.
    dirty: BTreeMap<u64, u64>,
    /// Writes so far (numbers them for `dirty`).
    writes: u64,
    /// Journal records appended on generation `seq` (the next one's
    /// position).
    journal_n: u64,
    /// The volume's generation fence moved past ours: refuse everything.
    fenced: bool,
    /// Where the last read ended: a read starting there is sequential and
    /// fetches ahead.
    read_end: u64,
}

impl Volume {
    /// A device over `head` (the volume's current generation), `size` bytes
    /// large (at least the generation's; a larger size grows the disk),
    /// with its local file at `path` (replaced). `head` must have no journal
    /// (as [`Store::claim`] leaves it). A `durable` volume makes every flush
    /// durable in the store.
    pub fn open(
        store: Store,
        target: Target,
        head: &Manifest,
        size: u64,
        path: &Path,
        durable: bool,
    ) -> io::Result<Self> {
        let chunk = u64::from(head.chunk_size);
        let size = size.max(head.size);
        let count = size.div_ceil(chunk);
        let _ = std::fs::remove_file(path);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        file.set_len(size)?;
        let present = (0..count).map(|i| !head.chunks.contains_key(&i)).collect();
        // Growing is a change the next commit records.
        let dirty = if size > head.size {
            BTreeMap::from([(count - 1, 0)])
        } else {
            BTreeMap::new()
        };
        let scope = target.scope.clone();
        Ok(Self {
            store,
            target,
            chunk,
            size,
            file,
            staging: path.with_extension("staging"),
            path: path.to_owned(),
            durable,
            inner: Mutex::new(Inner {
                seq: head.seq,
                chunks: head.chunks.clone(),
                present,
                dirty,
                writes: 0,
                journal_n: 0,
                fenced: false,
                read_end: u64::MAX,
            }),
            committing: Mutex::new(Sweep {
                scope,
                head: head.chunks.clone(),
                parent: None,
                uploaded: Vec::new(),
            }),
            journal_bytes: AtomicU64::new(0),
            rounds_started: AtomicU64::new(0),
            durable_round: AtomicU64::new(0),
        })
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The local file (removed by [`Volume::discard`]).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes written since the last flush or commit (whole chunks).
    pub async fn dirty_bytes(&self) -> u64 {
        self.inner.lock().await.dirty.len() as u64 * self.chunk
    }

    /// Something since the last generation: writes, or flushes journaled
    /// on top of it.
    pub async fn uncommitted(&self) -> bool {
        let g = self.inner.lock().await;
        !g.dirty.is_empty() || g.journal_n > 0
    }

    /// Journal records on the current generation (tests count them).
    pub async fn journal_len(&self) -> u64 {
        self.inner.lock().await.journal_n
    }

    /// Chunk bytes flushes uploaded since the last generation.
    pub fn journal_bytes(&self) -> u64 {
        self.journal_bytes.load(Ordering::Relaxed)
    }

    /// Removes the local files.
    pub fn discard(&self) {
        for p in [&self.path, &self.staging] {
            if let Err(e) = std::fs::remove_file(p) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!(file = %p.display(), error = %e, "cannot remove a volume file");
                }
            }
        }
    }

    /// Byte range of chunk `i` within a device of `size` bytes: start, length.
    fn span(&self, i: u64, size: u64) -> (u64, u64) {
        let start = i * self.chunk;
        (start, (start + self.chunk).min(size) - start)
    }

    /// Chunks that `[offset, offset+len)` touches.
    fn chunks_of(&self, offset: u64, len: u64) -> std::ops::Range<u64> {
        if len == 0 {
            return 0..0;
        }
        offset / self.chunk..(offset + len).div_ceil(self.chunk)
    }

    /// Makes the chunks of `wanted` present, and tries those of `ahead`
    /// too (a failure there is left for a later read to report), fetching
    /// them concurrently.
    async fn fetch_many(
        &self,
        g: &mut Inner,
        wanted: std::ops::Range<u64>,
        ahead: std::ops::Range<u64>,
    ) -> io::Result<()> {
        let mut missing: Vec<(u64, ChunkRef, bool)> = Vec::new();
        for (i, needed) in wanted.map(|i| (i, true)).chain(ahead.map(|i| (i, false))) {
            if g.present[i as usize] {
                continue;
            }
            match g.chunks.get(&i) {
                Some(r) => missing.push((i, r.clone(), needed)),
                // A zero chunk: the sparse file already reads as zeros.
                None => g.present[i as usize] = true,
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        let fetched: Vec<_> = futures_util::stream::iter(missing)
            .map(|(i, r, needed)| async move { (i, needed, self.store.get_chunk(&r).await) })
            .buffer_unordered(FETCHES_IN_FLIGHT)
            .collect()
            .await;
        for (i, needed, data) in fetched {
            match data {
                Ok(data) => self.place(g, i, &data)?,
                Err(e) if needed => return Err(io::Error::other(e)),
                Err(e) => tracing::debug!(chunk = i, error = %e, "readahead fetch failed"),
            }
        }
        Ok(())
    }

    /// Writes fetched chunk `i` into the local file; it is present then.
    fn place(&self, g: &mut Inner, i: u64, data: &[u8]) -> io::Result<()> {
        let (start, len) = self.span(i, self.size);
        // The last chunk of a grown disk may be shorter than a chunk.
        if data.len() as u64 > self.chunk {
            return Err(io::Error::other(format!(
                "chunk {i} of {} holds {} bytes, more than a chunk",
                self.target.volume,
                data.len()
            )));
        }
        let n = (data.len() as u64).min(len) as usize;
        self.file.write_all_at(&data[..n], start)?;
        g.present[i as usize] = true;
        Ok(())
    }

    /// Makes chunk `i` present in the local file, fetching it if needed.
    async fn ensure(&self, g: &mut Inner, i: u64) -> io::Result<()> {
        if g.present[i as usize] {
            return Ok(());
        }
        let Some(r) = g.chunks.get(&i) else {
            g.present[i as usize] = true;
            return Ok(());
        };
        let data = self.store.get_chunk(r).await.map_err(io::Error::other)?;
        self.place(g, i, &data)
    }

    /// Before `[offset, offset+len)` is written: the chunks it covers only
    /// in part are fetched (a chunk written whole need not be), and all of
    /// them are marked present and dirty. The device stays locked until the
    /// returned guard drops, after the write.
    async fn about_to_write(
        &self,
        offset: u64,
        len: u64,
    ) -> io::Result<tokio::sync::MutexGuard<'_, Inner>> {
        let mut g = self.inner.lock().await;
        self.check(&g)?;
        for i in self.chunks_of(offset, len) {
            let (start, clen) = self.span(i, self.size);
            if offset > start || offset + len < start + clen {
                self.ensure(&mut g, i).await?;
            }
            g.present[i as usize] = true;
            g.writes += 1;
            let w = g.writes;
            g.dirty.insert(i, w);
        }
        Ok(g)
    }

    fn staging_error(&self, op: &'static str, source: io::Error) -> StoreError {
        StoreError::Io {
            op,
            path: self.staging.clone(),
            source,
        }
    }

    fn check(&self, g: &Inner) -> io::Result<()> {
        if g.fenced {
            return Err(io::Error::other(format!(
                "volume {} was taken over by a newer placement",
                self.target.volume
            )));
        }
        Ok(())
    }

    fn fenced_error(&self) -> StoreError {
        StoreError::Fenced {
            volume: self.target.volume.clone(),
            head_fence: u64::MAX,
            ours: self.target.fence,
        }
    }

    /// Under the device lock: starts a round (see `durable_round`), copies
    /// the dirty chunks to the staging file and notes the dirty set (left
    /// in place until the round succeeds). The guest keeps writing while
    /// the round uploads from the copy.
    fn take_dirty(&self, g: &mut Inner) -> Result<(u64, BTreeMap<u64, u64>), StoreError> {
        if g.fenced {
            return Err(self.fenced_error());
        }
        let round = self.rounds_started.fetch_add(1, Ordering::SeqCst) + 1;
        if g.dirty.is_empty() {
            return Ok((round, BTreeMap::new()));
        }
        let staging = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&self.staging)
            .map_err(|source| self.staging_error("create", source))?;
        staging
            .set_len(self.size)
            .map_err(|source| self.staging_error("size", source))?;
        let mut buf = vec![0u8; self.chunk as usize];
        for &i in g.dirty.keys() {
            let (start, len) = self.span(i, self.size);
            let b = &mut buf[..len as usize];
            self.file
                .read_exact_at(b, start)
                .and_then(|()| staging.write_all_at(b, start))
                .map_err(|source| self.staging_error("copy a chunk to", source))?;
        }
        Ok((round, g.dirty.clone()))
    }

    /// A round's end: on success its chunks' new places are recorded, the
    /// chunks not written since are clean, and every write before the
    /// round is durable; on failure everything stays dirty for the next.
    fn end_round(
        &self,
        g: &mut Inner,
        round: u64,
        dirty: BTreeMap<u64, u64>,
        outcome: Result<&[(u64, Option<ChunkRef>)], &StoreError>,
    ) {
        match outcome {
            Ok(placed) => {
                for (i, r) in placed {
                    match r {
                        Some(r) => g.chunks.insert(*i, r.clone()),
                        None => g.chunks.remove(i),
                    };
                }
                for (i, w) in dirty {
                    if g.dirty.get(&i) == Some(&w) {
                        g.dirty.remove(&i);
                    }
                }
                self.durable_round.fetch_max(round, Ordering::SeqCst);
            }
            Err(e) => {
                if matches!(e, StoreError::Fenced { .. }) {
                    g.fenced = true;
                }
            }
        }
    }

    /// Makes every write answered before this call durable in the store
    /// (see the module docs). Concurrent callers share rounds.
    pub async fn flush_durably(&self) -> Result<(), StoreError> {
        if !self.durable {
            return Ok(());
        }
        // A round that starts after this point covers our writes.
        let need = self.rounds_started.load(Ordering::SeqCst) + 1;
        let mut sweep = self.committing.lock().await;
        if self.durable_round.load(Ordering::SeqCst) >= need {
            return Ok(());
        }
        let (round, dirty, base, mut n) = {
            let mut g = self.inner.lock().await;
            let (round, dirty) = self.take_dirty(&mut g)?;
            (round, dirty, g.seq, g.journal_n)
        };
        let result = if dirty.is_empty() {
            Ok(Vec::new())
        } else {
            match self.upload(&dirty, self.size, &sweep.scope).await {
                Ok(placed) => {
                    let mut record = JournalRecord {
                        volume: self.target.volume.clone(),
                        base,
                        n,
                        fence: self.target.fence,
                        scope: sweep.scope.clone(),
                        size: self.size,
                        chunk_size: self.chunk as u32,
                        entries: placed
                            .iter()
                            .map(|(i, r)| (*i, r.as_ref().map(|r| r.hash)))
                            .collect(),
                    };
                    let mut appended = self.store.append_journal(&record).await;
                    if let Err(StoreError::JournalExists { .. }) = appended {
                        // Our previous attempt landed though its answer
                        // was lost; this record supersedes it.
                        n += 1;
                        record.n = n;
                        appended = self.store.append_journal(&record).await;
                    }
                    appended.map(|()| placed)
                }
                Err(e) => Err(e),
            }
        };
        if let Ok(placed) = &result {
            sweep
                .uploaded
                .extend(placed.iter().filter_map(|(_, r)| r.clone()));
            let stored = placed.iter().filter(|(_, r)| r.is_some()).count() as u64;
            self.journal_bytes
                .fetch_add(stored * self.chunk, Ordering::Relaxed);
        }
        let mut g = self.inner.lock().await;
        if result.is_ok() && !dirty.is_empty() {
            g.journal_n = n + 1;
        }
        self.end_round(&mut g, round, dirty, result.as_deref());
        result.map(drop)
    }

    /// Commits the dirty chunks and the journal as a new generation (`meta`
    /// recorded in its manifest). Nothing dirty, no journal and no meta:
    /// the current generation.
    pub async fn commit(&self, meta: BTreeMap<String, String>) -> Result<Manifest, StoreError> {
        let mut sweep = self.committing.lock().await;
        let (round, dirty, parent, journal_n) = {
            let mut g = self.inner.lock().await;
            if g.fenced {
                return Err(self.fenced_error());
            }
            if g.dirty.is_empty() && g.journal_n == 0 && meta.is_empty() {
                let round = self.rounds_started.fetch_add(1, Ordering::SeqCst) + 1;
                self.durable_round.fetch_max(round, Ordering::SeqCst);
                return self.store.manifest(&self.target.volume, g.seq).await;
            }
            let (round, dirty) = self.take_dirty(&mut g)?;
            (round, dirty, g.seq, g.journal_n)
        };
        let placed = match self.upload(&dirty, self.size, &sweep.scope).await {
            Ok(placed) => placed,
            Err(e) => {
                self.end_round(&mut *self.inner.lock().await, round, dirty, Err(&e));
                return Err(e);
            }
        };
        let mut chunks = self.inner.lock().await.chunks.clone();
        for (i, r) in &placed {
            match r {
                Some(r) => chunks.insert(*i, r.clone()),
                None => chunks.remove(i),
            };
        }
        let draft = ManifestDraft {
            scope: sweep.scope.clone(),
            parent: Some(parent),
            fence: self.target.fence,
            size: self.size,
            chunk_size: self.chunk as u32,
            meta,
            chunks,
        };
        // The round is durable only once the manifest naming its chunks is.
        let committed = self.store.commit(&self.target.volume, draft).await;
        let outcome = match &committed {
            Ok(_) => Ok(&placed[..]),
            Err(e) => Err(e),
        };
        let mut g = self.inner.lock().await;
        self.end_round(&mut g, round, dirty, outcome);
        let m = committed?;
        g.seq = m.seq;
        g.journal_n = 0;
        drop(g);
        self.journal_bytes.store(0, Ordering::Relaxed);
        sweep
            .uploaded
            .extend(placed.iter().filter_map(|(_, r)| r.clone()));
        if journal_n > 0 {
            if let Err(e) = self.store.delete_journal(&self.target.volume, parent).await {
                tracing::warn!(volume = %self.target.volume, base = parent, error = %e, "cannot delete the journal a generation holds; GC will");
            }
        }
        if self.durable {
            self.sweep(&mut sweep, parent, &m).await;
        }
        Ok(m)
    }

    /// After generation `m` (on `parent`): drops the generations before
    /// `parent`, and deletes the chunks of our scope that the pruned
    /// generation or our flushes put and neither kept generation names.
    /// When a snapshot shares the scope, its garbage is GC's and new chunks
    /// go to a fresh scope (`<volume>-s<seq>`), whose garbage is ours again:
    /// a guest rewriting its disk after a capture still cannot grow the
    /// store past about two versions of it. Failures are logged: garbage
    /// left is GC's.
    async fn sweep(&self, sweep: &mut Sweep, parent: u64, m: &Manifest) {
        let volume = &self.target.volume;
        let scope = sweep.scope.clone();
        let old_parent = sweep.parent.take();
        let kept_parent = std::mem::replace(&mut sweep.head, m.chunks.clone());
        let uploaded = std::mem::take(&mut sweep.uploaded);
        let pruned = match self.store.prune_before(volume, parent).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(%volume, error = %e, "cannot prune old generations; GC will");
                sweep.parent = Some(kept_parent);
                return;
            }
        };
        let keep: std::collections::HashSet<&[u8; 32]> = kept_parent
            .values()
            .chain(m.chunks.values())
            .filter(|r| r.scope == scope)
            .map(|r| &r.hash)
            .collect();
        let candidates: std::collections::BTreeSet<[u8; 32]> = old_parent
            .iter()
            .flat_map(|c| c.values())
            .chain(uploaded.iter())
            .filter(|r| r.scope == scope && !keep.contains(&r.hash))
            .map(|r| r.hash)
            .collect();
        let found = candidates.len();
        match self.store.delete_unshared_chunks(&scope, candidates).await {
            Ok(Some(deleted)) => {
                tracing::debug!(%volume, pruned, deleted, "swept the volume's garbage")
            }
            Ok(None) => match fresh_scope(volume, m.seq) {
                Ok(fresh) => {
                    tracing::debug!(%volume, pruned, left = found, %scope, %fresh, "scope shared: its garbage is GC's; new chunks go to a fresh scope");
                    sweep.scope = fresh;
                }
                Err(e) => {
                    tracing::warn!(%volume, error = %e, "no fresh scope; the shared one's garbage is GC's")
                }
            },
            Err(e) => {
                tracing::warn!(%volume, error = %e, "cannot delete superseded chunks; GC will")
            }
        }
        sweep.parent = Some(kept_parent);
    }

    /// Marks the scope new chunks go to as shared (a snapshot is about to
    /// name them): from now on no commit sweeps it, and the next commit
    /// moves the volume to a fresh scope. Waits for a round in progress.
    pub async fn share(&self) -> Result<(), StoreError> {
        let sweep = self.committing.lock().await;
        self.store.mark_shared(&sweep.scope).await
    }

    /// The key scope new chunks go to.
    pub async fn write_scope(&self) -> ScopeId {
        self.committing.lock().await.scope.clone()
    }

    /// Uploads the staged chunks of `dirty`: each one's new place, `None`
    /// for an all-zero chunk (never stored).
    async fn upload(
        &self,
        dirty: &BTreeMap<u64, u64>,
        size: u64,
        scope: &ScopeId,
    ) -> Result<Vec<(u64, Option<ChunkRef>)>, StoreError> {
        if dirty.is_empty() {
            return Ok(Vec::new());
        }
        let staging = std::fs::File::open(&self.staging)
            .map_err(|source| self.staging_error("open", source))?;
        let staging = Arc::new(staging);
        let placed = futures_util::stream::iter(dirty.keys().copied())
            .map(|i| {
                let staging = staging.clone();
                let (start, len) = self.span(i, size);
                async move {
                    let mut b = vec![0u8; len as usize];
                    staging
                        .read_exact_at(&mut b, start)
                        .map_err(|source| StoreError::Io {
                            op: "read a staged chunk from",
                            path: self.staging.clone(),
                            source,
                        })?;
                    if b.iter().all(|&x| x == 0) {
                        return Ok((i, None));
                    }
                    let r = self.store.put_chunk(scope, &b).await?;
                    Ok::<_, StoreError>((i, Some(r)))
                }
            })
            .buffer_unordered(UPLOADS_IN_FLIGHT)
            .try_collect()
            .await?;
        if let Err(e) = std::fs::remove_file(&self.staging) {
            tracing::debug!(error = %e, "staging file already gone");
        }
        Ok(placed)
    }
}

impl BlockDevice for Volume {
    fn size(&self) -> u64 {
        self.size
    }

    async fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let mut g = self.inner.lock().await;
        self.check(&g)?;
        let len = buf.len() as u64;
        let wanted = self.chunks_of(offset, len);
        let ahead = if g.read_end == offset {
            wanted.end..(wanted.end + READAHEAD).min(self.size.div_ceil(self.chunk))
        } else {
            wanted.end..wanted.end
        };
        g.read_end = offset + len;
        self.fetch_many(&mut g, wanted, ahead).await?;
        self.file.read_exact_at(buf, offset)
    }

    async fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let _g = self.about_to_write(offset, data.len() as u64).await?;
        self.file.write_all_at(data, offset)
    }

    async fn zero(&self, offset: u64, len: u64) -> io::Result<()> {
        let _g = self.about_to_write(offset, len).await?;
        punch_hole(&self.file, offset, len)
    }

    async fn flush(&self) -> io::Result<()> {
        self.flush_durably().await.map_err(io::Error::other)
    }
}

/// Deallocates `[offset, offset+len)` of `file`; it then reads as zeros.
fn punch_hole(file: &std::fs::File, offset: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let (Ok(off), Ok(n)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    // SAFETY: fallocate on an open descriptor we own with plain integers.
    let rc = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off,
            n,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The scope a volume's new chunks go to once its scope is shared, after
/// generation `seq` (unique: a volume's generation numbers only grow).
pub fn fresh_scope(volume: &VolumeId, seq: u64) -> Result<ScopeId, StoreError> {
    ScopeId::new(format!("{volume}-s{seq}"))
}

/// Whether `scope` is one only `volume`'s writer puts chunks to: the scope
/// named after the volume, or a fresh one of it ([`fresh_scope`]).
pub fn is_own_scope(volume: &VolumeId, scope: &ScopeId) -> bool {
    scope.as_str() == volume.as_str()
        || scope
            .as_str()
            .strip_prefix(volume.as_str())
            .and_then(|rest| rest.strip_prefix("-s"))
            .is_some_and(|seq| !seq.is_empty() && seq.bytes().all(|b| b.is_ascii_digit()))
}
