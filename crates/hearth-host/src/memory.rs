//! Saved guest memory: local copies and the store's.
//!
//! A VM's RAM is the VMM's anonymous memory while it runs. A stop that
//! preserves memory, and a capture with memory, write one stream of RAM
//! (its data pages) and device state, kept in the VM's (or the snapshot's)
//! directory as `live` and imported into the store as the `-state` volume
//! (its `kind` says it holds the RAM), so that the next start resumes on
//! this host from the local copy or on any host from the store. Saves made
//! before that are a RAM file (`memory`, data only: holes stay holes) and
//! a device state (`state`), two volumes; they still resume. A snapshot
//! with memory keeps one copy per host under `<data>/snapshots/`.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use hearth_store::{ScopeId, Store, VolumeId};
use hearth_types::{ByteSize, VmId};

use crate::error::HostError;
use crate::vm::MemoryVolumes;

/// Chunk size of memory images in the store.
pub const CHUNK_SIZE: u32 = 64 << 10;

/// Copies `src` to `dst` (replaced), data only: holes in `src` stay holes,
/// so a 2 GiB guest that used 200 MiB costs 200 MiB. Returns the bytes of
/// data copied.
pub fn copy_sparse(src: &Path, dst: &Path) -> io::Result<u64> {
    let from = std::fs::File::open(src)?;
    let len = from.metadata()?.len();
    let tmp = dst.with_extension("partial");
    let to = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    to.set_len(len)?;
    let copied = hearth_vmm::template::copy_data(&from, &to, len)?;
    to.sync_all()?;
    std::fs::rename(&tmp, dst)?;
    Ok(copied)
}

/// Imports a saved RAM file and device-state file into the store as the
/// volumes `<prefix>-mem` and `<prefix>-state` (new generations when they
/// exist already).
pub async fn import(
    store: &Store,
    scope: &ScopeId,
    prefix: &str,
    memory: &Path,
    state: &Path,
    fence: u64,
) -> Result<MemoryVolumes, HostError> {
    let volumes = MemoryVolumes {
        memory: format!("{prefix}-mem"),
        state: format!("{prefix}-state"),
        memory_size: ByteSize(
            std::fs::metadata(memory)
                .map_err(|e| HostError::Invalid(format!("saved memory: {e}")))?
                .len(),
        ),
    };
    for (volume, path, kind) in [
        (&volumes.memory, memory, "memory"),
        (&volumes.state, state, "device-state"),
    ] {
        let volume: VolumeId = volume.parse()?;
        let meta = BTreeMap::from([("kind".to_owned(), kind.to_owned())]);
        store
            .import_file(scope, &volume, path, CHUNK_SIZE, fence, meta)
            .await?;
    }
    Ok(volumes)
}

/// The `kind` of a state volume that holds guest RAM too (a live save,
/// [`import_live`]); there is no memory volume beside it.
const KIND_LIVE: &str = "memory-and-device-state";

/// Imports a live save (guest RAM and device state in one stream) into
/// the store as the volume `<prefix>-state`; the returned `memory`
/// volume is not written (the state's `kind` says the RAM is in it).
pub async fn import_live(
    store: &Store,
    scope: &ScopeId,
    prefix: &str,
    state: &Path,
    memory_size: ByteSize,
    fence: u64,
) -> Result<MemoryVolumes, HostError> {
    let volumes = MemoryVolumes {
        memory: format!("{prefix}-mem"),
        state: format!("{prefix}-state"),
        memory_size,
    };
    let volume: VolumeId = volumes.state.parse()?;
    let meta = BTreeMap::from([("kind".to_owned(), KIND_LIVE.to_owned())]);
    store
        .import_file(scope, &volume, state, CHUNK_SIZE, fence, meta)
        .await?;
    Ok(volumes)
}

/// Where a live save's stream is kept in a directory of saved memory: a
/// name of its own, so that the files a directory holds say what they are
/// without asking the store.
pub fn live_path(dir: &Path) -> PathBuf {
    dir.join("live")
}

/// Saved memory as local files.
#[derive(Debug)]
pub struct Fetched {
    /// Guest RAM; `None` when `state` holds it too (a live save).
    pub memory: Option<PathBuf>,
    pub state: PathBuf,
}

/// Local files of saved memory: fetched from the store into `dir` unless
/// already there.
pub async fn fetch(
    store: &Store,
    volumes: &MemoryVolumes,
    dir: &Path,
) -> Result<Fetched, HostError> {
    let io = |e: io::Error| HostError::Invalid(format!("saved memory in {}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(io)?;
    let memory = dir.join("memory");
    let state = dir.join("state");
    let live = live_path(dir);
    if live.exists() {
        return Ok(Fetched {
            memory: None,
            state: live,
        });
    }
    let head = |volume: &String| {
        let volume = volume.parse::<VolumeId>();
        async move {
            let volume = volume?;
            store.head(&volume).await?.ok_or_else(|| {
                HostError::Invalid(format!("saved memory {volume} is not in the store"))
            })
        }
    };
    let export = |manifest: hearth_store::Manifest, path: PathBuf| async move {
        let partial = path.with_extension("partial");
        store.export_to_file(&manifest, &partial).await?;
        std::fs::rename(&partial, &path).map_err(io)
    };
    if !state.exists() {
        let manifest = head(&volumes.state).await?;
        if manifest.meta.get("kind").map(String::as_str) == Some(KIND_LIVE) {
            export(manifest, live.clone()).await?;
            return Ok(Fetched {
                memory: None,
                state: live,
            });
        }
        export(manifest, state.clone()).await?;
    }
    if !memory.exists() {
        export(head(&volumes.memory).await?, memory.clone()).await?;
    }
    Ok(Fetched {
        memory: Some(memory),
        state,
    })
}

/// The key scope of a VM's saved memory: its own, apart from its disk's
/// (whose commits sweep their scope, and a memory chunk deduplicated
/// against a disk chunk there could go).
pub fn scope_of(id: VmId) -> Result<ScopeId, HostError> {
    format!("vm-{id}-mem")
        .parse()
        .map_err(|_| HostError::Invalid(format!("no memory scope for vm {id}")))
}

/// Removes the store's copy of saved memory (both volumes).
pub async fn delete(store: &Store, volumes: &MemoryVolumes) -> Result<(), HostError> {
    for volume in [&volumes.memory, &volumes.state] {
        if let Ok(v) = volume.parse::<VolumeId>() {
            store.delete_volume(&v).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn sparse_copies_keep_holes_and_data() {
        let dir = std::env::temp_dir().join(format!("hearth-sparse-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("src");
        let f = std::fs::File::create(&src).unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all_at(&[1u8; 8192], 4096).unwrap();
        f.write_all_at(&[2u8; 4096], 32 << 20).unwrap();
        drop(f);
        let dst = dir.join("dst");
        let copied = copy_sparse(&src, &dst).unwrap();
        assert!((12288..1 << 20).contains(&copied), "{copied}");
        assert_eq!(std::fs::read(&src).unwrap(), std::fs::read(&dst).unwrap());
        use std::os::unix::fs::MetadataExt;
        assert!(std::fs::metadata(&dst).unwrap().blocks() * 512 < 4 << 20);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
