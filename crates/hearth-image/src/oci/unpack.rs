//! Applying layer tarballs, in order, to a directory: the overlay semantics
//! of the OCI image spec (`.wh.<name>` deletes a lower entry,
//! `.wh..wh..opq` hides a directory's lower contents) with every entry
//! written through checked paths.
//!
//! **Invariant: nothing outside the root is ever written.** Entry names with
//! `..` or a leading `/` are refused. Parent directories are resolved one
//! component at a time with `lstat`; a symlink met on the way is resolved as
//! if the root were `/` (its `..` stops at the root, an absolute target
//! starts at the root), so `lib -> usr/lib` works while `evil -> /etc` or
//! `evil -> ../../..` stays inside. The last component is never followed: an
//! existing entry there is removed, then created afresh with `O_EXCL`.

use std::collections::{HashSet, VecDeque};
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{lchown, symlink, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, SystemTime};

use sha2::{Digest as _, Sha256};

use super::manifest::format_digest;
use super::OciError;
use crate::ImageError;

/// Symlinks followed while resolving one path (Linux's own limit).
const MAX_SYMLINK_HOPS: u32 = 40;
/// What an entry costs besides its content (inode, directory entry): a
/// million empty files must not pass as zero bytes.
const ENTRY_OVERHEAD: u64 = 512;
const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_MARKER: &str = ".wh..wh..opq";

/// Applies layers to `root`, keeping the byte budget across them.
pub(crate) struct Unpacker {
    root: PathBuf,
    /// Bytes the tree may hold.
    capacity: u64,
    /// Bytes the tree holds, as counted (never decreases: deletions by
    /// whiteouts are not credited back, which errs on the safe side).
    used: u64,
    /// Directory mtimes, applied at the end (creating children bumps them).
    dir_times: Vec<(PathBuf, u64)>,
    /// Device nodes and FIFOs left out.
    pub(crate) skipped_special: u64,
}

impl Unpacker {
    pub(crate) fn new(root: &Path, capacity: u64) -> Self {
        Unpacker {
            root: root.to_path_buf(),
            capacity,
            used: 0,
            dir_times: Vec::new(),
            skipped_special: 0,
        }
    }

    /// Unpacks layer `index` (0-based) from `blob` (tar, gzip or zstd,
    /// sniffed), and checks the uncompressed stream against `diff_id` when
    /// the config gives one.
    pub(crate) fn apply(
        &mut self,
        index: usize,
        blob: impl Read,
        diff_id: Option<&str>,
    ) -> Result<(), OciError> {
        let mut buffered = BufReader::with_capacity(64 * 1024, blob);
        let head = buffered
            .fill_buf()
            .map_err(|e| layer_io(index, "read", e))?
            .to_vec();
        let decoded: Box<dyn Read + '_> = if head.starts_with(&[0x1f, 0x8b]) {
            Box::new(flate2::bufread::MultiGzDecoder::new(buffered))
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Box::new(
                ruzstd::decoding::StreamingDecoder::new(buffered).map_err(|e| OciError::Layer {
                    index,
                    reason: format!("zstd: {e}"),
                })?,
            )
        } else {
            Box::new(buffered)
        };
        let mut hashing = HashingReader {
            inner: decoded,
            hash: Sha256::new(),
            bytes: 0,
            // The tar stream of a layer never needs to be longer than what
            // may still be stored, plus its headers.
            limit: self.capacity.saturating_sub(self.used) + 64 * 1024 * 1024,
        };
        let mut touched = HashSet::new();
        {
            let mut archive = tar::Archive::new(&mut hashing);
            let entries = archive.entries().map_err(|e| layer_io(index, "read", e))?;
            for entry in entries {
                let mut entry = entry.map_err(|e| layer_io(index, "read", e))?;
                self.entry(index, &mut entry, &mut touched)?;
            }
        }
        // The digest covers the whole stream, end-of-archive blocks included.
        io::copy(&mut hashing, &mut io::sink()).map_err(|e| layer_io(index, "read", e))?;
        if let Some(expected) = diff_id {
            let actual = format_digest(&hashing.hash.finalize());
            if actual != expected {
                return Err(OciError::DigestMismatch {
                    what: format!("layer {index} (uncompressed)"),
                    expected: expected.to_owned(),
                    actual,
                });
            }
        }
        Ok(())
    }

    fn entry<R: Read>(
        &mut self,
        index: usize,
        entry: &mut tar::Entry<'_, R>,
        touched: &mut HashSet<PathBuf>,
    ) -> Result<(), OciError> {
        let raw = entry
            .path()
            .map_err(|e| layer_io(index, "read entry name", e))?
            .into_owned();
        let unsafe_path = |reason: &str| OciError::UnsafePath {
            index,
            path: raw.display().to_string(),
            reason: reason.to_owned(),
        };
        let comps = clean(&raw).map_err(unsafe_path)?;
        let Some((name, parents)) = comps.split_last() else {
            return Ok(()); // "./": the root itself keeps mkfs's owner and mode
        };
        self.charge(ENTRY_OVERHEAD)?;

        let name_str = name.to_string_lossy();
        if let Some(hidden) = name_str.strip_prefix(WHITEOUT_PREFIX) {
            let Some(dir) = self
                .resolve(parents, false)
                .map_err(|e| self.path_err(index, &raw, e))?
            else {
                return Ok(()); // nothing below to hide
            };
            if name_str == OPAQUE_MARKER {
                self.clear_lower(&dir, touched)?;
            } else if !hidden.starts_with(WHITEOUT_PREFIX) && !hidden.is_empty() {
                let victim = dir.join(hidden);
                if !touched.contains(&victim) {
                    remove_any(&victim)?;
                }
            }
            // Other `.wh..wh.` names (aufs hard-link bookkeeping) mean nothing here.
            return Ok(());
        }

        let dir = self
            .resolve(parents, true)
            .map_err(|e| self.path_err(index, &raw, e))?
            .ok_or_else(|| unsafe_path("parent directory missing"))?;
        let target = dir.join(name);
        let mut ancestor = Some(target.as_path());
        while let Some(a) = ancestor {
            if a == self.root || !touched.insert(a.to_path_buf()) {
                break;
            }
            ancestor = a.parent();
        }

        let header = entry.header();
        let mode = header.mode().unwrap_or(0o644) & 0o7777;
        let uid = header
            .uid()
            .ok()
            .and_then(|u| u32::try_from(u).ok())
            .unwrap_or(0);
        let gid = header
            .gid()
            .ok()
            .and_then(|g| u32::try_from(g).ok())
            .unwrap_or(0);
        let mtime = header.mtime().unwrap_or(0);
        let kind = header.entry_type();
        match kind {
            tar::EntryType::Directory => {
                let is_dir = fs::symlink_metadata(&target).is_ok_and(|m| m.is_dir());
                if !is_dir {
                    remove_any(&target)?;
                    fs::create_dir(&target)
                        .map_err(|e| ImageError::io("create directory", &target, e))?;
                }
                own(&target, uid, gid)?;
                chmod(&target, mode)?;
                self.dir_times.push((target, mtime));
            }
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                let size = entry.size();
                self.charge(size.div_ceil(4096) * 4096)?;
                remove_any(&target)?;
                let mut file = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .mode(0o600)
                    .open(&target)
                    .map_err(|e| ImageError::io("create", &target, e))?;
                let copied = io::copy(&mut entry.take(size), &mut file)
                    .map_err(|e| layer_io(index, "read", e))?;
                if copied != size {
                    return Err(OciError::Layer {
                        index,
                        reason: format!("{} is truncated", raw.display()),
                    });
                }
                file.flush()
                    .map_err(|e| ImageError::io("write", &target, e))?;
                let _ = file.set_modified(unix_time(mtime));
                drop(file);
                own(&target, uid, gid)?;
                // After chown, which clears set-id bits.
                chmod(&target, mode)?;
            }
            tar::EntryType::Symlink => {
                let link = entry
                    .link_name()
                    .map_err(|e| layer_io(index, "read link name", e))?
                    .ok_or_else(|| unsafe_path("symlink without a target"))?
                    .into_owned();
                remove_any(&target)?;
                // The target is stored as is: it is only ever resolved by the
                // guest kernel, inside the guest's root.
                symlink(&link, &target)
                    .map_err(|e| ImageError::io("create symlink", &target, e))?;
                own(&target, uid, gid)?;
            }
            tar::EntryType::Link => {
                let link = entry
                    .link_name()
                    .map_err(|e| layer_io(index, "read link name", e))?
                    .ok_or_else(|| unsafe_path("hard link without a target"))?
                    .into_owned();
                let link_comps = clean(&link).map_err(|r| OciError::UnsafePath {
                    index,
                    path: format!("{} (hard link to {})", raw.display(), link.display()),
                    reason: r.to_owned(),
                })?;
                let (link_name, link_parents) = link_comps
                    .split_last()
                    .ok_or_else(|| unsafe_path("hard link to the root"))?;
                let source = self
                    .resolve(link_parents, false)
                    .map_err(|e| self.path_err(index, &link, e))?
                    .map(|d| d.join(link_name))
                    .filter(|s| fs::symlink_metadata(s).is_ok_and(|m| !m.is_dir()))
                    .ok_or_else(|| OciError::Layer {
                        index,
                        reason: format!(
                            "{} is a hard link to {}, which is not a file in the image",
                            raw.display(),
                            link.display()
                        ),
                    })?;
                if source != target {
                    remove_any(&target)?;
                    // linkat(2) without AT_SYMLINK_FOLLOW: a symlink source is
                    // linked itself, never what it points to.
                    fs::hard_link(&source, &target)
                        .map_err(|e| ImageError::io("create hard link", &target, e))?;
                }
            }
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                // The guest gets a devtmpfs on /dev; device nodes elsewhere
                // are not worth the privilege they would need.
                self.skipped_special += 1;
            }
            // PAX and GNU long-name headers are folded into the next entry by
            // the tar reader; anything else has no place in a root filesystem.
            _ => {}
        }
        Ok(())
    }

    /// Removes everything below `dir` that this layer did not write: the
    /// lower layers' contents of an opaque directory.
    fn clear_lower(&self, dir: &Path, touched: &HashSet<PathBuf>) -> Result<(), OciError> {
        let entries = fs::read_dir(dir).map_err(|e| ImageError::io("read directory", dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| ImageError::io("read directory", dir, e))?;
            let path = entry.path();
            if !touched.contains(&path) {
                remove_any(&path)?;
            } else if fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
                self.clear_lower(&path, touched)?;
            }
        }
        Ok(())
    }

    /// Sets the recorded directory mtimes, deepest first.
    pub(crate) fn finish(&mut self) {
        self.dir_times.sort_by(|a, b| b.0.cmp(&a.0));
        for (dir, mtime) in self.dir_times.drain(..) {
            if let Ok(f) = File::open(&dir) {
                let _ = f.set_modified(unix_time(mtime));
            }
        }
    }

    fn charge(&mut self, bytes: u64) -> Result<(), OciError> {
        self.used = self.used.saturating_add(bytes);
        if self.used > self.capacity {
            return Err(OciError::CapacityExceeded {
                capacity: self.capacity,
                needed: format!("more than {} bytes unpacked", self.capacity),
            });
        }
        Ok(())
    }

    fn path_err(&self, index: usize, raw: &Path, e: Resolve) -> OciError {
        match e {
            Resolve::Io(e) => e.into(),
            Resolve::Bad(reason) => OciError::UnsafePath {
                index,
                path: raw.display().to_string(),
                reason,
            },
        }
    }

    /// The host path of directory `comps` inside the root, resolving
    /// symlinks as if the root were `/`. Missing directories are created
    /// (mode 0755, root-owned) when `create`, else the answer is `None`.
    fn resolve(&self, comps: &[OsString], create: bool) -> Result<Option<PathBuf>, Resolve> {
        let mut queue: VecDeque<OsString> = comps.iter().cloned().collect();
        let mut at = self.root.clone();
        let mut depth = 0usize;
        let mut hops = 0u32;
        while let Some(comp) = queue.pop_front() {
            match comp.as_bytes() {
                b"" | b"." => continue,
                b".." => {
                    if depth > 0 {
                        at.pop();
                        depth -= 1;
                    }
                    continue;
                }
                _ => {}
            }
            let next = at.join(&comp);
            match fs::symlink_metadata(&next) {
                Ok(m) if m.is_dir() => {
                    at = next;
                    depth += 1;
                }
                Ok(m) if m.file_type().is_symlink() => {
                    hops += 1;
                    if hops > MAX_SYMLINK_HOPS {
                        return Err(Resolve::Bad("too many levels of symbolic links".into()));
                    }
                    let target = fs::read_link(&next)
                        .map_err(|e| Resolve::Io(ImageError::io("read link", &next, e)))?;
                    let mut front: Vec<OsString> = Vec::new();
                    for c in target.components() {
                        match c {
                            Component::RootDir => {
                                at = self.root.clone();
                                depth = 0;
                            }
                            Component::Normal(n) => front.push(n.to_owned()),
                            Component::ParentDir => front.push("..".into()),
                            Component::CurDir | Component::Prefix(_) => {}
                        }
                    }
                    for c in front.into_iter().rev() {
                        queue.push_front(c);
                    }
                }
                Ok(_) => {
                    return Err(Resolve::Bad(format!(
                        "{} is not a directory",
                        next.strip_prefix(&self.root).unwrap_or(&next).display()
                    )))
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    if !create {
                        return Ok(None);
                    }
                    fs::create_dir(&next)
                        .and_then(|()| {
                            fs::set_permissions(&next, fs::Permissions::from_mode(0o755))
                        })
                        .map_err(|e| Resolve::Io(ImageError::io("create directory", &next, e)))?;
                    at = next;
                    depth += 1;
                }
                Err(e) => return Err(Resolve::Io(ImageError::io("stat", &next, e))),
            }
        }
        Ok(Some(at))
    }
}

enum Resolve {
    Io(ImageError),
    Bad(String),
}

/// The normal components of an entry name; `.` is dropped, `..` and
/// absolute names are refused.
fn clean(path: &Path) -> Result<Vec<OsString>, &'static str> {
    let mut out = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n.to_owned()),
            Component::CurDir => {}
            Component::ParentDir => return Err("'..' in an entry name"),
            Component::RootDir | Component::Prefix(_) => return Err("absolute entry name"),
        }
    }
    Ok(out)
}

/// Removes whatever is at `path` without following it.
fn remove_any(path: &Path) -> Result<(), ImageError> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(ImageError::io("stat", path, e)),
        Ok(m) if m.is_dir() => {
            fs::remove_dir_all(path).map_err(|e| ImageError::io("remove directory", path, e))
        }
        Ok(_) => fs::remove_file(path).map_err(|e| ImageError::io("remove", path, e)),
    }
}

fn own(path: &Path, uid: u32, gid: u32) -> Result<(), ImageError> {
    lchown(path, Some(uid), Some(gid)).map_err(|e| ImageError::io("chown", path, e))
}

fn chmod(path: &Path, mode: u32) -> Result<(), ImageError> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| ImageError::io("set mode of", path, e))
}

fn unix_time(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

fn layer_io(index: usize, op: &str, e: io::Error) -> OciError {
    OciError::Layer {
        index,
        reason: format!("{op}: {e}"),
    }
}

/// Hashes and counts what passes through, and fails past `limit` bytes.
struct HashingReader<R> {
    inner: R,
    hash: Sha256,
    bytes: u64,
    limit: u64,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        if self.bytes > self.limit {
            return Err(io::Error::other(format!(
                "uncompressed layer exceeds the {} bytes left of the capacity",
                self.limit
            )));
        }
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::os::unix::fs::MetadataExt;

    /// A scratch root, removed on drop.
    struct Root(PathBuf);

    impl Root {
        fn new(name: &str) -> Self {
            let p =
                std::env::temp_dir().join(format!("hearth-unpack-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(p.join("root")).unwrap();
            Root(p)
        }
        fn root(&self) -> PathBuf {
            self.0.join("root")
        }
    }

    impl Drop for Root {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    enum E<'a> {
        File(&'a str, &'a str),
        Dir(&'a str),
        Link(&'a str, &'a str),
    }

    /// A layer owned by the test's own uid (chown to it needs no root).
    fn layer(entries: &[E<'_>], uid: u64) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for e in entries {
            let mut h = tar::Header::new_gnu();
            h.set_uid(uid);
            h.set_gid(uid);
            match e {
                E::File(name, data) => {
                    h.set_size(data.len() as u64);
                    h.set_mode(0o644);
                    h.set_cksum();
                    b.append_data(&mut h, name, data.as_bytes()).unwrap();
                }
                E::Dir(name) => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(0o755);
                    h.set_size(0);
                    h.set_cksum();
                    b.append_data(&mut h, name, &[][..]).unwrap();
                }
                E::Link(name, target) => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_size(0);
                    h.set_mode(0o777);
                    b.append_link(&mut h, name, target).unwrap();
                }
            }
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn whiteouts_and_opaque_dirs_hide_lower_layers_only() {
        let t = Root::new("wh");
        let root = t.root();
        let uid = u64::from(fs::metadata(&root).unwrap().uid());
        let mut u = Unpacker::new(&root, 1 << 30);
        let lower = layer(
            &[
                E::Dir("a"),
                E::File("a/gone", "x"),
                E::File("a/kept", "x"),
                E::Dir("o"),
                E::File("o/lower", "x"),
                E::Dir("o/sub"),
                E::File("o/sub/lower", "x"),
            ],
            uid,
        );
        u.apply(0, lower.as_slice(), None).unwrap();
        // The opaque marker comes after this layer's own entry in `o`.
        let upper = layer(
            &[
                E::File("o/sub/upper", "y"),
                E::File("o/.wh..wh..opq", ""),
                E::File("a/.wh.gone", ""),
                E::File("missing/.wh.x", ""),
            ],
            uid,
        );
        u.apply(1, upper.as_slice(), None).unwrap();
        assert!(!root.join("a/gone").exists());
        assert!(!root.join("a/.wh.gone").exists());
        assert!(root.join("a/kept").exists());
        assert!(!root.join("o/lower").exists());
        assert!(!root.join("o/sub/lower").exists());
        assert_eq!(fs::read_to_string(root.join("o/sub/upper")).unwrap(), "y");
        assert!(!root.join("o/.wh..wh..opq").exists());
        assert!(!root.join("missing").exists(), "a whiteout creates nothing");
    }

    #[test]
    fn symlinks_in_the_tree_never_lead_out_of_it() {
        let t = Root::new("escape");
        let root = t.root();
        let uid = u64::from(fs::metadata(&root).unwrap().uid());
        let mut u = Unpacker::new(&root, 1 << 30);
        let outside = t.0.join("outside");
        fs::create_dir(&outside).unwrap();
        let l = layer(
            &[
                E::Link("abs", outside.to_str().unwrap()),
                E::Link("rel", "../../../.."),
                E::Dir("usr/lib"),
                E::Link("lib", "usr/lib"),
                E::File("abs/f", "1"),
                E::File("rel/f", "2"),
                E::File("lib/f", "3"),
            ],
            uid,
        );
        u.apply(0, l.as_slice(), None).unwrap();
        assert_eq!(
            fs::read_dir(&outside).unwrap().count(),
            0,
            "nothing written outside"
        );
        // Resolved as if the root were `/`.
        let inside_abs = root.join(outside.strip_prefix("/").unwrap()).join("f");
        assert_eq!(fs::read_to_string(inside_abs).unwrap(), "1");
        assert_eq!(fs::read_to_string(root.join("f")).unwrap(), "2");
        assert_eq!(fs::read_to_string(root.join("usr/lib/f")).unwrap(), "3");
        // The links themselves are kept verbatim.
        assert_eq!(
            fs::read_link(root.join("rel")).unwrap(),
            Path::new("../../../..")
        );

        // A file replacing a symlink replaces the link, not its target.
        let over = layer(&[E::File("abs", "plain")], uid);
        u.apply(1, over.as_slice(), None).unwrap();
        assert_eq!(fs::read_to_string(root.join("abs")).unwrap(), "plain");
        assert!(outside.is_dir());
    }

    #[test]
    fn capacity_and_diff_id_are_enforced() {
        let t = Root::new("cap");
        let root = t.root();
        let uid = u64::from(fs::metadata(&root).unwrap().uid());
        let big = "z".repeat(64 * 1024);
        let l = layer(&[E::File("big", &big)], uid);
        let err = Unpacker::new(&root, 16 * 1024)
            .apply(0, l.as_slice(), None)
            .unwrap_err();
        assert!(matches!(err, OciError::CapacityExceeded { .. }), "{err:?}");
        let err = Unpacker::new(&root, 1 << 30)
            .apply(0, l.as_slice(), Some("sha256:0000"))
            .unwrap_err();
        assert!(matches!(err, OciError::DigestMismatch { .. }), "{err:?}");
        let good = super::super::manifest::sha256_digest(&l);
        Unpacker::new(&root, 1 << 30)
            .apply(0, l.as_slice(), Some(&good))
            .unwrap();
        // gzip is sniffed, and the diff_id is of the uncompressed stream.
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&l).unwrap();
        let gz = gz.finish().unwrap();
        Unpacker::new(&root, 1 << 30)
            .apply(0, gz.as_slice(), Some(&good))
            .unwrap();
    }

    #[test]
    fn clean_refuses_escapes() {
        assert_eq!(clean(Path::new("./a/./b/")).unwrap(), ["a", "b"]);
        assert!(clean(Path::new("a/../../b")).is_err());
        assert!(clean(Path::new("/etc/passwd")).is_err());
        assert!(clean(Path::new(".")).unwrap().is_empty());
    }
}
