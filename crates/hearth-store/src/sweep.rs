//! Keeping one writer's garbage small without waiting for [`Store::gc`].
//!
//! A guest that rewrites its disk makes every commit upload new chunk
//! versions; the old ones are garbage once no generation names them, but
//! the fleet-wide GC finds them only at its next run (after its grace).
//! A volume's writer can do better for its own chunks, right after each
//! commit:
//!
//! - [`Store::prune_before`] deletes its generations older than the one it
//!   keeps as the parent (nothing else names a disk's generations by seq:
//!   snapshots and forks copy a manifest's chunk map into a volume of
//!   their own);
//! - [`Store::delete_unshared_chunks`] deletes chunks only the writer's own
//!   volume could name, and only while the chunks' scope is **unshared**.
//!
//! A scope is shared once any other volume may name its chunks: a copy of a
//! manifest into another volume (a snapshot, a sandbox booted from one) or
//! an import into a volume not named after the scope (saved memory). Those
//! mark it (`shared/<scope>`, written before the other volume's manifest)
//! with [`Store::mark_shared`]; from then on only GC, which reads every
//! manifest, deletes the scope's chunks. A writer checks the mark before
//! each sweep, after taking its own commit lock, and a capture marks before
//! it commits through that same lock, so no sweep that missed the mark runs
//! after the capture's commit. Deleted chunks are forgotten as "recently
//! put", so writing the same content again uploads it again.

use object_store::path::Path as ObjPath;
use object_store::{ObjectStoreExt, PutPayload};

use crate::error::StoreError;
use crate::id::{ScopeId, VolumeId};
use crate::manifest::ChunkRef;
use crate::store::{backend, chunk_path, Store};

fn shared_path(scope: &ScopeId) -> ObjPath {
    ObjPath::from(format!("shared/{scope}"))
}

impl Store {
    /// Marks `scope` as possibly named by volumes other than its own:
    /// writers stop deleting its chunks themselves.
    pub async fn mark_shared(&self, scope: &ScopeId) -> Result<(), StoreError> {
        if self.known_shared(scope) {
            return Ok(());
        }
        self.inner
            .os
            .put(&shared_path(scope), PutPayload::from_static(b"shared\n"))
            .await
            .map_err(backend(format!("mark scope {scope} shared")))?;
        self.note_shared(scope);
        Ok(())
    }

    fn known_shared(&self, scope: &ScopeId) -> bool {
        let known = self.inner.shared.lock().unwrap_or_else(|p| p.into_inner());
        known.contains(scope)
    }

    fn note_shared(&self, scope: &ScopeId) {
        let mut known = self.inner.shared.lock().unwrap_or_else(|p| p.into_inner());
        known.insert(scope.clone());
    }

    /// Whether [`Store::mark_shared`] marked `scope`.
    pub async fn is_shared(&self, scope: &ScopeId) -> Result<bool, StoreError> {
        if self.known_shared(scope) {
            return Ok(true);
        }
        match self.inner.os.head(&shared_path(scope)).await {
            Ok(_) => {
                self.note_shared(scope);
                Ok(true)
            }
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(backend(format!("read the shared mark of scope {scope}"))(e)),
        }
    }

    /// Deletes `volume`'s generations older than `keep` (never `keep` or
    /// newer). Returns how many went.
    pub async fn prune_before(&self, volume: &VolumeId, keep: u64) -> Result<usize, StoreError> {
        let old: Vec<u64> = self
            .generations(volume)
            .await?
            .into_iter()
            .filter(|&s| s < keep)
            .collect();
        for &seq in &old {
            self.delete_manifest(volume, seq).await?;
        }
        Ok(old.len())
    }

    /// Deletes `chunks` of `scope` unless the scope is shared (then none:
    /// `Ok(None)`). The caller guarantees no generation or journal record
    /// of its own volume names them, and holds its volume's commit lock.
    /// Returns how many objects were deleted.
    pub async fn delete_unshared_chunks(
        &self,
        scope: &ScopeId,
        chunks: impl IntoIterator<Item = [u8; 32]>,
    ) -> Result<Option<usize>, StoreError> {
        if self.is_shared(scope).await? {
            return Ok(None);
        }
        let mut n = 0;
        for hash in chunks {
            let r = ChunkRef {
                scope: scope.clone(),
                hash,
            };
            self.forget_put(&r);
            match self.inner.os.delete(&chunk_path(&r)).await {
                Ok(()) => n += 1,
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => {
                    return Err(backend(format!(
                        "delete chunk {} of scope {scope}",
                        r.hex()
                    ))(e))
                }
            }
        }
        Ok(Some(n))
    }
}
