//! The initramfs: the guest agent as `/init` plus the kernel's modules.
//!
//! This layout is the contract with the guest agent (`hearth-guest`):
//!
//! | path | what |
//! |---|---|
//! | `/init` | the static guest agent, mode 0755 |
//! | `/hearth/modules/NN-<name>.ko` | modules, loaded in lexical order |
//! | `/dev/console` | char 5:1, mode 0600 |
//! | `/dev /proc /sys /newroot /hearth /hearth/modules` | directories |
//!
//! The archive is an uncompressed newc cpio (decompression costs time under
//! TCG) written by [`crate::cpio`], byte-for-byte reproducible. It is cached
//! as `artifacts/initramfs-<key16>.cpio` with `initramfs-<key16>.json`, where
//! the key hashes the agent binary and the kernel artifact's identity.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::cache;
use crate::cpio::CpioWriter;
use crate::{elf, ImageConfig, ImageError, KernelArtifact, Progress};

/// Version of the archive layout; part of the cache key.
const INITRAMFS_FORMAT: u32 = 1;
/// How many initramfs files to keep in the cache.
const KEEP: usize = 3;

/// A cached initramfs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitramfsArtifact {
    /// The uncompressed newc archive, for QEMU's `-initrd`.
    pub path: PathBuf,
    /// BLAKE3 of the archive.
    pub blake3: String,
    /// Its size in bytes.
    pub size_bytes: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct InitramfsManifest {
    format: u32,
    key: String,
    guest_agent: PathBuf,
    guest_agent_blake3: String,
    kernel_release: String,
    kernel_package: String,
    kernel_package_version: String,
    kernel_blake3: String,
    modules: Vec<String>,
    size: u64,
    blake3: String,
    built_at_unix: u64,
}

/// Returns the initramfs for this guest agent and kernel, building it if
/// needed. Fails if `guest_agent` is not a static x86-64 executable.
pub fn ensure_initramfs(
    cfg: &ImageConfig,
    kernel: &KernelArtifact,
    guest_agent: &Path,
    p: &dyn Progress,
) -> Result<InitramfsArtifact, ImageError> {
    elf::require_static(guest_agent)?;
    let agent_hash = cache::hash_file(guest_agent)?;
    let key = cache_key(&agent_hash, kernel);
    let artifacts = cfg.artifacts_dir();
    let stem = format!("initramfs-{}", &key[..16]);
    let path = artifacts.join(format!("{stem}.cpio"));
    let manifest_path = artifacts.join(format!("{stem}.json"));

    if let Some(hit) = cached(&path, &manifest_path, &key) {
        return Ok(hit);
    }
    let _lock = cache::lock(&artifacts, p)?;
    if let Some(hit) = cached(&path, &manifest_path, &key) {
        return Ok(hit);
    }

    let started = Instant::now();
    p.step("building initramfs");
    let tmp = cache::staging_path(&artifacts, "initramfs");
    let result = write_archive(&tmp, guest_agent, kernel);
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    let size = cache::file_len(&tmp)?;
    let blake3 = cache::hash_file(&tmp)?;
    let manifest = InitramfsManifest {
        format: INITRAMFS_FORMAT,
        key,
        guest_agent: guest_agent.to_path_buf(),
        guest_agent_blake3: agent_hash,
        kernel_release: kernel.release.clone(),
        kernel_package: kernel.package.clone(),
        kernel_package_version: kernel.package_version.clone(),
        kernel_blake3: kernel.blake3.clone(),
        modules: kernel.modules.iter().map(|m| m.name.clone()).collect(),
        size,
        blake3: blake3.clone(),
        built_at_unix: cache::unix_now(),
    };
    // Archive first, manifest last: a manifest implies a complete archive.
    cache::replace(&tmp, &path)?;
    let tmp_manifest = cache::staging_path(&artifacts, "initramfs-manifest");
    cache::write_manifest(&tmp_manifest, &manifest)?;
    cache::replace(&tmp_manifest, &manifest_path)?;
    prune(&artifacts, &path)?;
    p.done(
        &format!("initramfs ({} KiB)", size.div_ceil(1024)),
        started.elapsed(),
    );
    Ok(InitramfsArtifact {
        path,
        blake3,
        size_bytes: size,
    })
}

/// BLAKE3 over the layout version, the agent and everything of the kernel
/// artifact that ends up in (or must match) the archive.
fn cache_key(agent_hash: &str, kernel: &KernelArtifact) -> String {
    let mut h = blake3::Hasher::new();
    let mut field = |s: &str| {
        h.update(&(s.len() as u64).to_le_bytes());
        h.update(s.as_bytes());
    };
    field(&format!("hearth-initramfs/{INITRAMFS_FORMAT}"));
    field(agent_hash);
    field(&kernel.release);
    field(&kernel.package);
    field(&kernel.package_version);
    field(&kernel.blake3);
    for m in &kernel.modules {
        field(&m.name);
        field(&m.blake3);
    }
    h.finalize().to_hex().to_string()
}

fn cached(path: &Path, manifest_path: &Path, key: &str) -> Option<InitramfsArtifact> {
    let m: InitramfsManifest = cache::read_manifest(manifest_path)?;
    if m.format != INITRAMFS_FORMAT || m.key != key || !cache::file_has_len(path, m.size) {
        return None;
    }
    Some(InitramfsArtifact {
        path: path.to_path_buf(),
        blake3: m.blake3,
        size_bytes: m.size,
    })
}

fn write_archive(out: &Path, agent: &Path, kernel: &KernelArtifact) -> Result<(), ImageError> {
    let file = File::create(out).map_err(|e| ImageError::io("create", out, e))?;
    let mut w = CpioWriter::new(BufWriter::new(file), out);
    for dir in ["dev", "proc", "sys", "newroot", "hearth", "hearth/modules"] {
        w.dir(dir, 0o755)?;
    }
    w.char_device("dev/console", 0o600, 5, 1)?;
    add_file(&mut w, "init", 0o755, agent)?;
    for (i, m) in kernel.modules.iter().enumerate() {
        add_file(
            &mut w,
            &format!("hearth/modules/{i:02}-{}.ko", m.name),
            0o644,
            &m.path,
        )?;
    }
    let file = w
        .finish()?
        .into_inner()
        .map_err(|e| ImageError::io("flush", out, e.into_error()))?;
    file.sync_all().map_err(|e| ImageError::io("sync", out, e))
}

fn add_file<W: Write>(
    w: &mut CpioWriter<W>,
    name: &str,
    perm: u32,
    src: &Path,
) -> Result<(), ImageError> {
    let f = File::open(src).map_err(|e| ImageError::io("open", src, e))?;
    let len = f
        .metadata()
        .map_err(|e| ImageError::io("stat", src, e))?
        .len();
    w.file(name, perm, len, f)
}

/// Keeps the [`KEEP`] newest initramfs archives (always including `keep`)
/// and removes the rest with their manifests. Runs under the build lock.
fn prune(artifacts: &Path, keep: &Path) -> Result<(), ImageError> {
    let stale = cache::stale_files(artifacts, keep, KEEP, |p| {
        p.extension().is_some_and(|e| e == "cpio")
            && p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("initramfs-"))
    })?;
    for old in stale {
        cache::remove_all(&old.with_extension("json"))?;
        cache::remove_all(&old)?;
    }
    Ok(())
}
