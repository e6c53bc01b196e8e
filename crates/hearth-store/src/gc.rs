//! Garbage collection of old generations and unreferenced chunks.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, SystemTime};

use futures_util::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjPath;
use object_store::{ObjectMeta, ObjectStoreExt};

use crate::crypto;
use crate::error::StoreError;
use crate::id::{ScopeId, VolumeId};
use crate::manifest::ChunkRef;
use crate::store::{backend, parse_seq, Store};

/// What GC keeps.
#[derive(Clone, Copy, Debug)]
pub struct GcOptions {
    /// Newest generations kept per volume (at least 1: the head is never
    /// pruned).
    pub keep_generations: usize,
    /// Unreferenced chunks younger than this are kept (a writer may be
    /// about to commit a manifest naming them).
    pub grace: Duration,
}

impl Default for GcOptions {
    fn default() -> Self {
        Self {
            keep_generations: 3,
            grace: crate::store::DEFAULT_GC_GRACE,
        }
    }
}

/// What one GC run did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    pub manifests_deleted: u64,
    /// Flush journal records superseded by a generation.
    pub journal_records_deleted: u64,
    pub chunks_deleted: u64,
    pub bytes_deleted: u64,
    pub chunks_kept: u64,
}

impl Store {
    /// Prunes old generations, then deletes chunks that no remaining
    /// manifest or journal record references and that are older than
    /// `grace`. Safe against concurrent commits and flushes from any
    /// number of hosts, and against another GC run: see the crate
    /// documentation for the argument and what it assumes.
    pub async fn gc(&self, opts: GcOptions) -> Result<GcReport, StoreError> {
        let mut report = GcReport::default();
        let keep = opts.keep_generations.max(1);

        // 1. Prune generations beyond the newest `keep` of each volume.
        for (volume, seqs) in self.all_generations().await? {
            let old = seqs.len().saturating_sub(keep);
            for &seq in &seqs[..old] {
                self.delete_manifest(&volume, seq).await?;
                report.manifests_deleted += 1;
            }
        }

        // 1b. Drop journal records a newer generation superseded (folded, or
        //     appended by a fenced writer) and, once older than grace,
        //     those of volumes without generations (deleted ones). A volume
        //     with no generation in the listing above may also be one
        //     created since, whose first flush is already in the journal
        //     listed below: its records are young, and kept.
        let heads: HashMap<VolumeId, u64> = self
            .all_generations()
            .await?
            .into_iter()
            .filter_map(|(v, s)| s.last().map(|&h| (v, h)))
            .collect();
        let now = SystemTime::now();
        for (volume, base, n, meta) in self.journal_records().await? {
            let superseded = match heads.get(&volume) {
                Some(&head) => base < head,
                None => older_than(now, &meta, opts.grace),
            };
            if superseded {
                self.delete_record(&volume, base, n).await?;
                report.journal_records_deleted += 1;
            }
        }

        // 2. List chunks with their ages (before reading manifests).
        let listed_at = SystemTime::now();
        let chunks: Vec<(ChunkRef, ObjectMeta)> = self
            .list(ObjPath::from("chunks"), "list chunks")
            .await?
            .into_iter()
            .filter_map(|m| parse_chunk_path(&m.location).map(|r| (r, m)))
            .collect();

        // 3. Everything a journal record or manifest names.
        let referenced = self.referenced_chunks().await?;

        // 4. Delete the unreferenced ones older than grace, re-checking each
        //    one's age just before deleting it.
        for (r, meta) in chunks {
            // Ages are measured against our clock at listing time; skew
            // between us and the object store eats into the grace.
            let old =
                |t: SystemTime| listed_at.duration_since(t).unwrap_or(Duration::ZERO) > opts.grace;
            if referenced.contains(&r) || !old(SystemTime::from(meta.last_modified)) {
                report.chunks_kept += 1;
                continue;
            }
            match self.inner.os.head(&meta.location).await {
                Ok(now) if !old(SystemTime::from(now.last_modified)) => {
                    report.chunks_kept += 1;
                    continue;
                }
                Ok(_) => {}
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => {
                    return Err(backend(format!(
                        "head chunk {} of scope {}",
                        r.hex(),
                        r.scope
                    ))(e))
                }
            }
            self.delete_chunk(&r).await?;
            report.chunks_deleted += 1;
            report.bytes_deleted += meta.size;
        }
        Ok(report)
    }

    /// Every chunk a flush journal record or a manifest names. Records are
    /// read before manifests: a record folded into a generation after the
    /// listing is found as a record, one folded before as a generation. A
    /// record appended after the caller listed chunks names chunks put
    /// just before it, so young (the writer's puts refresh old ones, as
    /// for commits).
    async fn referenced_chunks(&self) -> Result<HashSet<ChunkRef>, StoreError> {
        let mut referenced: HashSet<ChunkRef> = HashSet::new();
        // 3. Everything the flush journals name, read before the manifests:
        //    a record folded into a generation after this point is found
        //    here, and one folded before is a generation listed below. A
        //    record appended after step 2 names chunks put just before it,
        //    so young (the writer's puts refresh old ones, as for commits).
        for (volume, base, n, _) in self.journal_records().await? {
            // Gone meanwhile: folded into a generation listed below.
            if let Some(r) = self.journal_record(&volume, base, n).await? {
                referenced.extend(r.entries.values().flatten().map(|hash| ChunkRef {
                    scope: r.scope.clone(),
                    hash: *hash,
                }));
            }
        }

        // 3b. Everything the remaining manifests reference.
        let gens = self.all_generations().await?;
        let manifests = futures_util::stream::iter(
            gens.into_iter()
                .flat_map(|(v, seqs)| seqs.into_iter().map(move |s| (v.clone(), s))),
        )
        .map(|(volume, seq)| async move {
            match self.manifest(&volume, seq).await {
                Ok(m) => Ok(Some(m)),
                // Deleted meanwhile (delete_volume, another GC): its chunks
                // are no longer needed by it.
                Err(StoreError::NoSuchGeneration { .. }) => Ok(None),
                // Anything unreadable aborts: we could not prove its chunks
                // unreferenced.
                Err(e) => Err(e),
            }
        })
        .buffer_unordered(8);
        futures_util::pin_mut!(manifests);
        while let Some(m) = manifests.try_next().await? {
            if let Some(m) = m {
                referenced.extend(m.chunks.into_values());
            }
        }

        Ok(referenced)
    }

    /// Deletes, at once and without GC's grace, the chunks of `scopes` that
    /// no manifest or journal record names: the scopes of a deleted
    /// sandbox (its disk's, its saved memory's), which is what lets a
    /// deleted sandbox's data go within minutes instead of at the next GC
    /// run. An unshared scope is named by its own volume only (see
    /// `sweep.rs`), so once that volume is deleted all its chunks go
    /// without reading any manifest; a shared one keeps what snapshots and
    /// other volumes name.
    ///
    /// The caller guarantees that no writer puts chunks to these scopes any
    /// more (their volumes are deleted and fenced) and that no copy of
    /// their volumes is in flight: that, not the grace, is what makes
    /// deleting young chunks safe here.
    pub async fn retire_scopes(&self, scopes: &[ScopeId]) -> Result<GcReport, StoreError> {
        let mut report = GcReport::default();
        let mut listed = Vec::new();
        let mut any_shared = false;
        for scope in scopes {
            let chunks: Vec<(ChunkRef, ObjectMeta)> = self
                .list(
                    ObjPath::from(format!("chunks/{scope}")),
                    format!("list the chunks of scope {scope}").as_str(),
                )
                .await?
                .into_iter()
                .filter_map(|m| parse_chunk_path(&m.location).map(|r| (r, m)))
                .filter(|(r, _)| &r.scope == scope)
                .collect();
            if chunks.is_empty() {
                continue;
            }
            let shared = self.is_shared(scope).await?;
            any_shared |= shared;
            listed.push((shared, chunks));
        }
        let referenced = if any_shared {
            self.referenced_chunks().await?
        } else {
            HashSet::new()
        };
        for (shared, chunks) in listed {
            for (r, meta) in chunks {
                if shared && referenced.contains(&r) {
                    report.chunks_kept += 1;
                    continue;
                }
                self.delete_chunk(&r).await?;
                report.chunks_deleted += 1;
                report.bytes_deleted += meta.size;
            }
        }
        Ok(report)
    }

    /// Deletes one chunk object (gone already is fine), and forgets it as
    /// recently put and cached: a writer sharing this instance uploads it
    /// again rather than trust its memory of having put it.
    async fn delete_chunk(&self, r: &ChunkRef) -> Result<(), StoreError> {
        match self.inner.os.delete(&crate::store::chunk_path(r)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                self.forget_put(r);
                self.inner.cache.remove(r).await;
                Ok(())
            }
            Err(e) => Err(backend(format!(
                "delete chunk {} of scope {}",
                r.hex(),
                r.scope
            ))(e)),
        }
    }

    async fn list(&self, prefix: ObjPath, op: &str) -> Result<Vec<ObjectMeta>, StoreError> {
        self.inner
            .os
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(backend(op))
    }

    /// Every journal record: volume, base, position, and its object.
    async fn journal_records(&self) -> Result<Vec<(VolumeId, u64, u64, ObjectMeta)>, StoreError> {
        Ok(self
            .list(ObjPath::from("journal"), "list journals")
            .await?
            .into_iter()
            .filter_map(|m| {
                crate::journal::parse_record_path(&m.location).map(|(v, b, n)| (v, b, n, m))
            })
            .collect())
    }

    /// Every volume's generations, ascending.
    async fn all_generations(&self) -> Result<BTreeMap<VolumeId, Vec<u64>>, StoreError> {
        let mut out: HashMap<VolumeId, Vec<u64>> = HashMap::new();
        for m in self.list(ObjPath::from("volumes"), "list volumes").await? {
            let parts: Vec<_> = m.location.parts().collect();
            if parts.len() != 3 {
                continue;
            }
            let (Ok(volume), Some(seq)) = (
                VolumeId::new(parts[1].as_ref()),
                parse_seq(parts[2].as_ref()),
            ) else {
                continue;
            };
            out.entry(volume).or_default().push(seq);
        }
        Ok(out
            .into_iter()
            .map(|(v, mut s)| {
                s.sort_unstable();
                (v, s)
            })
            .collect())
    }
}

/// Whether the object was last written more than `grace` before `now`
/// (our clock; skew with the object store's eats into the grace).
fn older_than(now: SystemTime, meta: &ObjectMeta, grace: Duration) -> bool {
    now.duration_since(SystemTime::from(meta.last_modified))
        .unwrap_or(Duration::ZERO)
        > grace
}

/// `chunks/<scope>/<xx>/<hex>` → the chunk; anything else is not ours to
/// delete.
fn parse_chunk_path(p: &ObjPath) -> Option<ChunkRef> {
    let parts: Vec<_> = p.parts().collect();
    if parts.len() != 4 {
        return None;
    }
    let scope = ScopeId::new(parts[1].as_ref()).ok()?;
    let hash = crypto::parse_hex(parts[3].as_ref())?;
    (crypto::hex(&hash) == parts[3].as_ref() && parts[2].as_ref() == &parts[3].as_ref()[..2])
        .then_some(ChunkRef { scope, hash })
}
