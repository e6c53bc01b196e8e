//! The local chunk cache: disposable, size-bounded, holding encrypted
//! objects exactly as stored (`<dir>/<scope>/<hash hex>`), so it is verified
//! like the object store and a stolen cache reveals nothing.
//!
//! Writes go to a temp file renamed into place; hits touch the mtime;
//! eviction removes least recently used entries (by mtime) once the total
//! passes the bound. Deleting the whole directory while nothing runs is
//! fine: everything is refetched.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;

use crate::backend::create_private_dir;
use crate::crypto;
use crate::error::StoreError;
use crate::manifest::ChunkRef;

const TMP_PREFIX: &str = ".tmp-";
/// Eviction brings the cache down to this share of its bound, so it does
/// not run on every insert.
const LOW_WATER_PERCENT: u64 = 90;

pub(crate) struct Cache {
    dir: PathBuf,
    max_bytes: u64,
    /// Approximate bytes held; `u64::MAX` until the first scan.
    used: AtomicU64,
    evicting: AtomicBool,
}

impl Cache {
    pub(crate) fn open(dir: PathBuf, max_bytes: u64) -> Result<Arc<Self>, StoreError> {
        create_private_dir(&dir)?;
        Ok(Arc::new(Self {
            dir,
            max_bytes,
            used: AtomicU64::new(u64::MAX),
            evicting: AtomicBool::new(false),
        }))
    }

    fn path(&self, r: &ChunkRef) -> PathBuf {
        self.dir.join(r.scope.as_str()).join(r.hex())
    }

    fn enabled(&self) -> bool {
        self.max_bytes > 0
    }

    /// The cached object, touched, or `None`.
    pub(crate) async fn get(&self, r: &ChunkRef) -> Option<Bytes> {
        if !self.enabled() {
            return None;
        }
        let path = self.path(r);
        tokio::task::spawn_blocking(move || {
            let data = std::fs::read(&path).ok()?;
            if let Ok(f) = std::fs::File::options().write(true).open(&path) {
                let _ = f.set_modified(SystemTime::now());
            }
            Some(Bytes::from(data))
        })
        .await
        .ok()
        .flatten()
    }

    /// Drops an entry (found corrupt).
    pub(crate) async fn remove(&self, r: &ChunkRef) {
        let path = self.path(r);
        if let Ok(meta) = tokio::fs::metadata(&path).await {
            if tokio::fs::remove_file(&path).await.is_ok() {
                self.sub(meta.len());
            }
        }
    }

    /// Stores an object. Failures are logged and otherwise ignored: the
    /// cache is an optimisation.
    pub(crate) async fn put(self: &Arc<Self>, r: &ChunkRef, obj: Bytes) {
        if !self.enabled() || obj.len() as u64 > self.max_bytes {
            return;
        }
        let this = Arc::clone(self);
        let r = r.clone();
        let res = tokio::task::spawn_blocking(move || this.put_blocking(&r, &obj)).await;
        match res {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "chunk cache write failed"),
            Err(_) => tracing::warn!("chunk cache write task failed"),
        }
    }

    fn put_blocking(self: &Arc<Self>, r: &ChunkRef, obj: &[u8]) -> Result<(), StoreError> {
        use std::io::Write;
        let scope_dir = self.dir.join(r.scope.as_str());
        if !scope_dir.is_dir() {
            create_private_dir(&scope_dir)?;
        }
        let dest = scope_dir.join(r.hex());
        let suffix = crypto::hex(&crypto::random::<32>());
        let tmp = scope_dir.join(format!("{TMP_PREFIX}{}-{}", r.hex(), &suffix[..16]));
        let io = |op, source| StoreError::Io {
            op,
            path: tmp.clone(),
            source,
        };
        let mut f = std::fs::File::create(&tmp).map_err(|e| io("create cache entry", e))?;
        let written = f.write_all(obj).and_then(|()| std::fs::rename(&tmp, &dest));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(io("write cache entry", e));
        }
        if self.used.load(Ordering::Relaxed) == u64::MAX {
            self.evict_blocking();
        } else {
            let used = self.used.fetch_add(obj.len() as u64, Ordering::Relaxed) + obj.len() as u64;
            if used > self.max_bytes {
                self.evict_blocking();
            }
        }
        Ok(())
    }

    fn sub(&self, n: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                (u != u64::MAX).then(|| u.saturating_sub(n))
            });
    }

    /// Scans the cache, recomputes its size and evicts the least recently
    /// used entries down to the low-water mark. One scan at a time.
    fn evict_blocking(&self) {
        if self.evicting.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut entries = scan(&self.dir);
        let mut total: u64 = entries.iter().map(|e| e.1).sum();
        if total > self.max_bytes {
            let target = self.max_bytes / 100 * LOW_WATER_PERCENT;
            entries.sort_by_key(|e| e.2);
            for (path, len, _) in entries {
                if total <= target {
                    break;
                }
                if std::fs::remove_file(&path).is_ok() {
                    total -= len;
                }
            }
        }
        self.used.store(total, Ordering::Relaxed);
        self.evicting.store(false, Ordering::Release);
    }
}

/// Every cache entry: (path, length, mtime). Stale temp files (an hour
/// old: a crashed writer) are removed on the way.
fn scan(dir: &Path) -> Vec<(PathBuf, u64, SystemTime)> {
    let mut out = Vec::new();
    let Ok(scopes) = std::fs::read_dir(dir) else {
        return out;
    };
    let now = SystemTime::now();
    for scope in scopes.flatten() {
        let Ok(files) = std::fs::read_dir(scope.path()) else {
            continue;
        };
        for f in files.flatten() {
            let Ok(meta) = f.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            if f.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                if now.duration_since(mtime).unwrap_or_default() > Duration::from_secs(3600) {
                    let _ = std::fs::remove_file(f.path());
                }
                continue;
            }
            out.push((f.path(), meta.len(), mtime));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::ScopeId;

    fn r(i: u8) -> ChunkRef {
        ChunkRef {
            scope: ScopeId::new("s").unwrap(),
            hash: [i; 32],
        }
    }

    #[tokio::test]
    async fn bounded_lru() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path().join("c"), 10_000).unwrap();
        for i in 0..5u8 {
            cache.put(&r(i), Bytes::from(vec![i; 3000])).await;
            // Distinct mtimes, oldest first.
            let p = cache.path(&r(i));
            let t = SystemTime::now() - Duration::from_secs(100 - u64::from(i));
            std::fs::File::options()
                .write(true)
                .open(p)
                .unwrap()
                .set_modified(t)
                .unwrap();
        }
        // The bound holds and the newest entry survives.
        let total: u64 = scan(&dir.path().join("c")).iter().map(|e| e.1).sum();
        assert!(total <= 10_000, "{total}");
        assert!(cache.get(&r(4)).await.is_some());
        assert!(cache.get(&r(0)).await.is_none());
        // A deleted cache directory is recreated on the next write.
        std::fs::remove_dir_all(dir.path().join("c")).unwrap();
        cache.put(&r(9), Bytes::from_static(b"x")).await;
        assert_eq!(cache.get(&r(9)).await.unwrap(), Bytes::from_static(b"x"));
    }
}
