//! The artifact cache: layout under `data_dir/artifacts`, the build lock,
//! staging directories, manifests and checksums.
//!
//! Protocol: a reader checks an artifact's manifest without the lock (cheap).
//! On a miss it takes the exclusive lock, checks again (another process may
//! have just built it), builds into a `.tmp-*` directory beside the target and
//! renames the finished result into place. A manifest is always the last
//! thing to appear, so a present manifest means a complete artifact. Staging
//! leftovers of a crashed build are removed the next time the lock is taken.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::{command, ImageError, Progress};

/// Prefix of staging entries; anything with it is garbage when nobody holds
/// the lock.
const TMP_PREFIX: &str = ".tmp-";
const LOCK_FILE: &str = ".lock";

/// The exclusive build lock on `artifacts/.lock`; released on drop.
#[derive(Debug)]
pub(crate) struct BuildLock {
    _file: File,
}

/// Creates `artifacts` (and parents) if needed.
pub(crate) fn ensure_dir(dir: &Path) -> Result<(), ImageError> {
    fs::create_dir_all(dir).map_err(|e| ImageError::io("create directory", dir, e))
}

/// Takes the build lock, waiting (and saying so) if another process holds
/// it, then clears staging leftovers from crashed builds.
pub(crate) fn lock(artifacts: &Path, p: &dyn Progress) -> Result<BuildLock, ImageError> {
    ensure_dir(artifacts)?;
    let path = artifacts.join(LOCK_FILE);
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| ImageError::io("open lock file", &path, e))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => {
            p.step("waiting for another Hearth build to finish");
            file.lock().map_err(|e| ImageError::io("lock", &path, e))?;
        }
        Err(fs::TryLockError::Error(e)) => return Err(ImageError::io("lock", &path, e)),
    }
    clear_staging(artifacts)?;
    Ok(BuildLock { _file: file })
}

/// Removes every `.tmp-*` entry in `artifacts`. Only call with the lock held.
fn clear_staging(artifacts: &Path) -> Result<(), ImageError> {
    let entries =
        fs::read_dir(artifacts).map_err(|e| ImageError::io("read directory", artifacts, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| ImageError::io("read directory", artifacts, e))?;
        if entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
            remove_all(&entry.path())?;
        }
    }
    Ok(())
}

/// A unique staging path `artifacts/.tmp-<label>-<pid>-<n>` (not created).
pub(crate) fn staging_path(artifacts: &Path, label: &str) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    artifacts.join(format!("{TMP_PREFIX}{label}-{}-{n}", std::process::id()))
}

/// A staging directory that is removed on drop unless it was renamed away.
#[derive(Debug)]
pub(crate) struct Staging {
    path: PathBuf,
}

impl Staging {
    /// Creates a fresh staging directory in `artifacts`.
    pub(crate) fn new(artifacts: &Path, label: &str) -> Result<Self, ImageError> {
        let path = staging_path(artifacts, label);
        fs::create_dir(&path).map_err(|e| ImageError::io("create directory", &path, e))?;
        Ok(Staging { path })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // Best effort: whatever is left is cleared at the next lock.
        let _ = remove_all(&self.path);
    }
}

/// Removes `path` (file or tree) if it exists, first unmounting anything
/// mounted below it (an interrupted debootstrap can leave `proc` and `sys`
/// mounted in its target, and deleting through those would be wrong).
pub(crate) fn remove_all(path: &Path) -> Result<(), ImageError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ImageError::io("stat", path, e)),
    };
    if meta.is_dir() {
        unmount_below(path)?;
        fs::remove_dir_all(path).map_err(|e| ImageError::io("remove directory", path, e))
    } else {
        fs::remove_file(path).map_err(|e| ImageError::io("remove", path, e))
    }
}

/// Lazily unmounts every mount point at or below `dir`, deepest first.
/// `dir` is compared as the kernel names it (resolved: a path through a
/// symlink or `..` is not what mountinfo shows).
pub(crate) fn unmount_below(dir: &Path) -> Result<(), ImageError> {
    let resolved = fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned());
    let dir = resolved.as_path();
    let mountinfo = Path::new("/proc/self/mountinfo");
    let text = match fs::read_to_string(mountinfo) {
        Ok(t) => t,
        // No procfs: nothing we can check, nothing we mounted.
        Err(_) => return Ok(()),
    };
    let mut points: Vec<PathBuf> = text
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mountinfo(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for point in points {
        command::run(Command::new("umount").arg("-l").arg(&point))?;
    }
    Ok(())
}

/// Undoes mountinfo's octal escapes (`\040` for space and so on).
fn unescape_mountinfo(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let oct = &bytes[i + 1..i + 4];
            if oct.iter().all(|b| (b'0'..=b'7').contains(b)) {
                let v = oct
                    .iter()
                    .fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Moves `from` to `to`, replacing an existing `to` (file or directory).
/// For directories the old one is first moved aside, so `to` is briefly
/// absent but never half-written.
pub(crate) fn replace(from: &Path, to: &Path) -> Result<(), ImageError> {
    if to.is_dir() {
        let parent = to.parent().unwrap_or_else(|| Path::new("."));
        let aside = staging_path(parent, "old");
        fs::rename(to, &aside).map_err(|e| ImageError::io("move aside", to, e))?;
        fs::rename(from, to).map_err(|e| ImageError::io("rename into place", to, e))?;
        remove_all(&aside)
    } else {
        fs::rename(from, to).map_err(|e| ImageError::io("rename into place", to, e))
    }
}

/// Reads a manifest; `None` when it is missing or unreadable (a cache miss).
pub(crate) fn read_manifest<T: DeserializeOwned>(path: &Path) -> Option<T> {
    let bytes = fs::read(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Writes a manifest (pretty JSON, trailing newline).
pub(crate) fn write_manifest<T: Serialize>(path: &Path, value: &T) -> Result<(), ImageError> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(|source| ImageError::Manifest {
        path: path.to_path_buf(),
        source,
    })?;
    bytes.push(b'\n');
    let mut f = File::create(path).map_err(|e| ImageError::io("create", path, e))?;
    f.write_all(&bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| ImageError::io("write", path, e))
}

/// BLAKE3 of a file's contents, lowercase hex.
/// The files in `dir` that `matches` selects, other than `keep`, past the
/// `keep_total - 1` newest (by mtime): what a cache prune removes so that
/// `keep_total` generations stay, `keep` always among them.
pub(crate) fn stale_files(
    dir: &Path,
    keep: &Path,
    keep_total: usize,
    matches: impl Fn(&Path) -> bool,
) -> Result<Vec<PathBuf>, ImageError> {
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = fs::read_dir(dir)
        .map_err(|e| ImageError::io("read directory", dir, e))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p != keep && matches(p))
        .map(|p| {
            let mtime = fs::metadata(&p)
                .and_then(|m| m.modified())
                .unwrap_or(std::time::SystemTime::UNIX_EPOCH);
            (mtime, p)
        })
        .collect();
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    Ok(found
        .into_iter()
        .skip(keep_total.saturating_sub(1))
        .map(|(_, p)| p)
        .collect())
}

pub(crate) fn hash_file(path: &Path) -> Result<String, ImageError> {
    let file = File::open(path).map_err(|e| ImageError::io("open", path, e))?;
    let mut hasher = blake3::Hasher::new();
    hasher
        .update_reader(file)
        .map_err(|e| ImageError::io("read", path, e))?;
    Ok(hasher.finalize().to_hex().to_string())
}

/// Whether `path` is a regular file of exactly `len` bytes.
pub(crate) fn file_has_len(path: &Path, len: u64) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() == len)
}

/// Size of a file in bytes.
pub(crate) fn file_len(path: &Path) -> Result<u64, ImageError> {
    fs::metadata(path)
        .map(|m| m.len())
        .map_err(|e| ImageError::io("stat", path, e))
}

/// Seconds since the Unix epoch, for manifests.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The effective uid of this process (from `/proc/self/status`).
pub(crate) fn effective_uid() -> Result<u32, ImageError> {
    let path = Path::new("/proc/self/status");
    let text = fs::read_to_string(path).map_err(|e| ImageError::io("read", path, e))?;
    text.lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().nth(1))
        .and_then(|euid| euid.parse().ok())
        .ok_or_else(|| {
            ImageError::io(
                "parse Uid line of",
                path,
                io::Error::new(io::ErrorKind::InvalidData, "no effective uid"),
            )
        })
}

/// Fails with [`ImageError::NotRoot`] unless running as root.
pub(crate) fn require_root(what: &str) -> Result<(), ImageError> {
    let euid = effective_uid()?;
    if euid == 0 {
        Ok(())
    } else {
        Err(ImageError::NotRoot {
            what: what.to_owned(),
            euid,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mountinfo(r"/a\040b/c"), "/a b/c");
        assert_eq!(unescape_mountinfo(r"/plain"), "/plain");
        assert_eq!(unescape_mountinfo(r"/trailing\04"), r"/trailing\04");
    }

    #[test]
    fn effective_uid_parses() {
        effective_uid().unwrap();
    }
}
