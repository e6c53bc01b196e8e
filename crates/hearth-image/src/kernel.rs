//! The guest kernel: Debian's cloud kernel package and its virtio modules.
//!
//! The package is fetched with `apt-get download` (so it comes from whatever
//! apt is configured to use), unpacked with `dpkg-deb -x`, and reduced to
//! `vmlinuz-<release>` plus the modules in [`MODULE_LOAD_ORDER`], stored as
//! `modules/NN-<name>.ko` so that lexical order is load order. The Debian
//! mirror drops old ABI versions over time; when the pinned package is gone
//! the newest one of the same family is used instead, with a warning, and
//! the manifest records what was really used.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::cache::{self, Staging};
use crate::{command, ImageConfig, ImageError, Progress, Unit};

/// The pinned kernel package.
pub const DEFAULT_KERNEL_PACKAGE: &str = "linux-image-6.1.0-50-cloud-amd64-unsigned";

/// The modules the guest loads, in load order (dependencies first).
pub const MODULE_LOAD_ORDER: [&str; 10] = [
    "virtio",
    "virtio_ring",
    "virtio_mmio",
    "virtio_blk",
    "virtio_console",
    "failover",
    "net_failover",
    "virtio_net",
    // Free page reporting: idle guests give memory back to the host.
    "virtio_balloon",
    // FUSE: bucket mounts are made in the guest by a FUSE client.
    "fuse",
];

/// Modules without which the guest cannot work (root disk, host stream).
const REQUIRED_MODULES: [&str; 2] = ["virtio_blk", "virtio_console"];

/// Version of the kernel extraction recipe; bump to invalidate caches.
const KERNEL_RECIPE: u32 = 4;

/// One kernel module, ready to load.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelModule {
    /// Module name, e.g. `virtio_blk`.
    pub name: String,
    /// The `.ko` file (`<modules_dir>/NN-<name>.ko`).
    pub path: PathBuf,
    /// BLAKE3 of the file.
    pub blake3: String,
}

/// A cached kernel with its modules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelArtifact {
    /// The package's bzImage.
    pub vmlinuz: PathBuf,
    /// What QEMU boots: the uncompressed kernel (`vmlinux-*`, entered
    /// through PVH, no decompression at boot) when the bzImage's payload
    /// could be unpacked, else the bzImage itself.
    pub boot_image: PathBuf,
    /// The kernel release, e.g. `6.1.0-50-cloud-amd64`.
    pub release: String,
    /// The Debian package actually used (may differ from the configured one
    /// after a fallback).
    pub package: String,
    /// Its Debian version, e.g. `6.1.176-1`.
    pub package_version: String,
    /// Directory holding `NN-<name>.ko`, in load order.
    pub modules_dir: PathBuf,
    /// The modules present as files, in load order.
    pub modules: Vec<KernelModule>,
    /// Modules of [`MODULE_LOAD_ORDER`] that are built into this kernel.
    pub builtin_modules: Vec<String>,
    /// BLAKE3 of `vmlinuz`.
    pub blake3: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct KernelManifest {
    recipe: u32,
    requested_package: String,
    package: String,
    package_version: String,
    release: String,
    deb_blake3: String,
    vmlinuz: String,
    vmlinuz_size: u64,
    vmlinuz_blake3: String,
    /// The uncompressed kernel beside it, when it could be unpacked.
    #[serde(default)]
    vmlinux: Option<String>,
    #[serde(default)]
    vmlinux_size: u64,
    modules: Vec<ManifestModule>,
    builtin_modules: Vec<String>,
    built_at_unix: u64,
    build_seconds: f64,
}

#[derive(Debug, Serialize, Deserialize)]
struct ManifestModule {
    name: String,
    file: String,
    size: u64,
    blake3: String,
}

/// Returns the cached kernel for `cfg.kernel_package`, building it first if
/// needed (download, extract, pick modules).
pub fn ensure_kernel(cfg: &ImageConfig, p: &dyn Progress) -> Result<KernelArtifact, ImageError> {
    let artifacts = cfg.artifacts_dir();
    if let Some(hit) = find_cached(&artifacts, &cfg.kernel_package) {
        return Ok(hit);
    }
    let _lock = cache::lock(&artifacts, p)?;
    if let Some(hit) = find_cached(&artifacts, &cfg.kernel_package) {
        return Ok(hit);
    }
    build(cfg, &artifacts, p)
}

/// The best complete cached kernel for `package`: one built from exactly
/// that package, else one built as a fallback for it; newest first.
fn find_cached(artifacts: &Path, package: &str) -> Option<KernelArtifact> {
    let entries = fs::read_dir(artifacts).ok()?;
    let mut best: Option<(bool, u64, KernelArtifact)> = None;
    for entry in entries.filter_map(Result::ok) {
        if !entry.file_name().to_string_lossy().starts_with("kernel-") {
            continue;
        }
        let dir = entry.path();
        let Some(m) = cache::read_manifest::<KernelManifest>(&dir.join("manifest.json")) else {
            continue;
        };
        let exact = m.package == package;
        if m.recipe != KERNEL_RECIPE || !(exact || m.requested_package == package) {
            continue;
        }
        let Some(artifact) = artifact_from_manifest(&dir, &m) else {
            continue;
        };
        let rank = (exact, m.built_at_unix);
        if best.as_ref().is_none_or(|(e, t, _)| rank > (*e, *t)) {
            best = Some((rank.0, rank.1, artifact));
        }
    }
    best.map(|(_, _, a)| a)
}

/// Rebuilds the artifact description from a manifest, if every file it
/// names is present with the recorded size.
fn artifact_from_manifest(dir: &Path, m: &KernelManifest) -> Option<KernelArtifact> {
    let vmlinuz = dir.join(&m.vmlinuz);
    if !cache::file_has_len(&vmlinuz, m.vmlinuz_size) {
        return None;
    }
    let boot_image = match &m.vmlinux {
        Some(name) => {
            let path = dir.join(name);
            if !cache::file_has_len(&path, m.vmlinux_size) {
                return None;
            }
            path
        }
        None => vmlinuz.clone(),
    };
    let modules_dir = dir.join("modules");
    let mut modules = Vec::with_capacity(m.modules.len());
    for module in &m.modules {
        let path = modules_dir.join(&module.file);
        if !cache::file_has_len(&path, module.size) {
            return None;
        }
        modules.push(KernelModule {
            name: module.name.clone(),
            path,
            blake3: module.blake3.clone(),
        });
    }
    Some(KernelArtifact {
        vmlinuz,
        boot_image,
        release: m.release.clone(),
        package: m.package.clone(),
        package_version: m.package_version.clone(),
        modules_dir,
        modules,
        builtin_modules: m.builtin_modules.clone(),
        blake3: m.vmlinuz_blake3.clone(),
    })
}

fn build(
    cfg: &ImageConfig,
    artifacts: &Path,
    p: &dyn Progress,
) -> Result<KernelArtifact, ImageError> {
    let started = Instant::now();
    let package = resolve_package(&cfg.kernel_package, p)?;
    let staging = Staging::new(artifacts, "kernel")?;
    let download = staging.path().join("download");
    cache::ensure_dir(&download)?;
    p.measure(
        &format!("building kernel: downloading {package}"),
        Unit::Bytes,
        package_size(&package),
    );
    let mut apt = Command::new("apt-get");
    apt.args(["download", "-q", &package])
        .current_dir(&download);
    run_watching_size(&mut apt, &download, p)?;
    let deb = single_deb(&download, &package)?;
    let info = command::run_stdout(
        Command::new("dpkg-deb")
            .arg("-f")
            .arg(&deb)
            .args(["Package", "Version"]),
    )?;
    let (deb_package, version) =
        parse_control(&info).ok_or_else(|| ImageError::UnexpectedOutput {
            command: format!("dpkg-deb -f {} Package Version", deb.display()),
            reason: format!("no Package/Version fields in {info:?}"),
        })?;

    p.step(&format!(
        "building kernel: extracting {deb_package} {version}"
    ));
    let tree = staging.path().join("tree");
    command::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tree))?;
    let (vmlinuz_src, release) = find_vmlinuz(&tree, &deb_package)?;
    let module_root = ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|base| tree.join(base).join(&release))
        .find(|p| p.is_dir())
        .ok_or_else(|| ImageError::BadKernelPackage {
            package: deb_package.clone(),
            reason: format!("no lib/modules/{release} directory"),
        })?;
    let builtin = read_builtin(&module_root)?;
    let available = index_modules(&module_root.join("kernel"))?;

    let out = staging.path().join("out");
    let modules_out = out.join("modules");
    cache::ensure_dir(&modules_out)?;
    let vmlinuz_name = format!("vmlinuz-{release}");
    let vmlinuz = out.join(&vmlinuz_name);
    copy(&vmlinuz_src, &vmlinuz)?;
    let vmlinux_name = format!("vmlinux-{release}");
    let bzimage = fs::read(&vmlinuz).map_err(|e| ImageError::io("read", &vmlinuz, e))?;
    let vmlinux = match crate::vmlinux::extract(&bzimage) {
        Ok(elf) => {
            let path = out.join(&vmlinux_name);
            fs::write(&path, &elf).map_err(|e| ImageError::io("write", &path, e))?;
            Some((vmlinux_name, elf.len() as u64))
        }
        Err(reason) => {
            p.warn(&format!(
                "kernel {release}: guests boot the bzImage, which decompresses itself at every boot ({reason})"
            ));
            None
        }
    };
    drop(bzimage);

    let mut modules = Vec::new();
    let mut builtin_modules = Vec::new();
    for name in MODULE_LOAD_ORDER {
        match available.get(name) {
            Some(ModuleFile::Plain(src)) => {
                let file = format!("{:02}-{name}.ko", modules.len());
                let dst = modules_out.join(&file);
                copy(src, &dst)?;
                modules.push(ManifestModule {
                    name: name.to_owned(),
                    size: cache::file_len(&dst)?,
                    blake3: cache::hash_file(&dst)?,
                    file,
                });
            }
            Some(ModuleFile::Compressed(src)) => {
                return Err(ImageError::BadKernelPackage {
                    package: deb_package,
                    reason: format!(
                        "module {name} is compressed ({}); only plain .ko files are supported",
                        src.display()
                    ),
                });
            }
            None if builtin.contains(name) => builtin_modules.push(name.to_owned()),
            None if REQUIRED_MODULES.contains(&name) => {
                return Err(ImageError::MissingModule {
                    release,
                    module: name,
                });
            }
            None => p.warn(&format!(
                "kernel {release} has no module {name} and does not build it in; skipping it"
            )),
        }
    }

    let manifest = KernelManifest {
        recipe: KERNEL_RECIPE,
        requested_package: cfg.kernel_package.clone(),
        package: deb_package,
        package_version: version,
        release,
        deb_blake3: cache::hash_file(&deb)?,
        vmlinuz_size: cache::file_len(&vmlinuz)?,
        vmlinuz_blake3: cache::hash_file(&vmlinuz)?,
        vmlinuz: vmlinuz_name,
        vmlinux_size: vmlinux.as_ref().map_or(0, |(_, len)| *len),
        vmlinux: vmlinux.map(|(name, _)| name),
        modules,
        builtin_modules,
        built_at_unix: cache::unix_now(),
        build_seconds: started.elapsed().as_secs_f64(),
    };
    cache::write_manifest(&out.join("manifest.json"), &manifest)?;
    let final_dir = artifacts.join(format!(
        "kernel-{}-{}",
        manifest.release,
        path_safe(&manifest.package_version)
    ));
    cache::replace(&out, &final_dir)?;
    drop(staging);

    let artifact = artifact_from_manifest(&final_dir, &manifest).ok_or_else(|| {
        ImageError::BadKernelPackage {
            package: manifest.package.clone(),
            reason: format!(
                "files vanished from {} right after the build",
                final_dir.display()
            ),
        }
    })?;
    p.done(
        &format!(
            "kernel {} ({} {})",
            artifact.release, artifact.package, artifact.package_version
        ),
        started.elapsed(),
    );
    Ok(artifact)
}

/// The size in bytes of the `.deb` apt would download for `package`, if apt
/// says (only for the progress bar).
fn package_size(package: &str) -> Option<u64> {
    let show =
        command::run_stdout(Command::new("apt-cache").args(["show", "--no-all-versions", package]))
            .ok()?;
    parse_size(&show)
}

fn parse_size(show: &str) -> Option<u64> {
    show.lines()
        .find_map(|l| l.strip_prefix("Size:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Runs `cmd` to completion while reporting the bytes in `dir` (where it
/// downloads) every 100 ms.
fn run_watching_size(cmd: &mut Command, dir: &Path, p: &dyn Progress) -> Result<(), ImageError> {
    let finished = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !finished.load(Ordering::Relaxed) {
                p.advance(dir_bytes(dir), None, "");
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let result = command::run(cmd);
        finished.store(true, Ordering::Relaxed);
        if result.is_ok() {
            p.advance(dir_bytes(dir), None, "");
        }
        result.map(drop)
    })
}

/// Bytes in the files directly below `dir` (apt's `partial/` included).
fn dir_bytes(dir: &Path) -> u64 {
    let files = |d: &Path| -> u64 {
        fs::read_dir(d)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter_map(|e| e.metadata().ok())
            .filter(fs::Metadata::is_file)
            .map(|m| m.len())
            .sum()
    };
    files(dir) + files(&dir.join("partial"))
}

/// `wanted` if apt knows it; else the newest package of the same family
/// (same name with another ABI number), with a warning.
fn resolve_package(wanted: &str, p: &dyn Progress) -> Result<String, ImageError> {
    let madison = command::run_stdout(Command::new("apt-cache").args(["madison", wanted]))?;
    if !madison.trim().is_empty() {
        return Ok(wanted.to_owned());
    }
    let unavailable = |detail: String| ImageError::KernelPackageUnavailable {
        package: wanted.to_owned(),
        detail,
    };
    let (prefix, suffix) = package_family(wanted)
        .ok_or_else(|| unavailable("its name has no ABI number to vary".to_owned()))?;
    let pattern = format!("^{}[0-9]+{}$", regex_escape(prefix), regex_escape(suffix));
    let listing =
        command::run_stdout(Command::new("apt-cache").args(["search", "--names-only", &pattern]))?;
    let newest = listing
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter_map(|name| abi_number(name, prefix, suffix).map(|n| (n, name)))
        .max()
        .map(|(_, name)| name.to_owned())
        .ok_or_else(|| unavailable(format!(
                "no {prefix}*{suffix} package is available either (do apt's lists need `apt-get update`?)"
            )))?;
    p.warn(&format!(
        "kernel package {wanted} is not available from apt; using the newest of its family, {newest}"
    ));
    Ok(newest)
}

/// Splits `linux-image-6.1.0-50-cloud-amd64-unsigned` into
/// `("linux-image-6.1.0-", "-cloud-amd64-unsigned")` around the ABI number.
fn package_family(name: &str) -> Option<(&str, &str)> {
    let rest = name.strip_prefix("linux-image-")?;
    // The version "X.Y.Z" ends at the first '-'; the ABI number follows.
    let version_end = rest.find('-')? + 1;
    let after = &rest[version_end..];
    let digits = after.find(|c: char| !c.is_ascii_digit())?;
    if digits == 0 {
        return None;
    }
    let split = "linux-image-".len() + version_end;
    Some((&name[..split], &name[split + digits..]))
}

fn abi_number(name: &str, prefix: &str, suffix: &str) -> Option<u64> {
    name.strip_prefix(prefix)?
        .strip_suffix(suffix)?
        .parse()
        .ok()
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let special = ".+*?()[]{}|^$\\".contains(c);
            special
                .then_some('\\')
                .into_iter()
                .chain(std::iter::once(c))
        })
        .collect()
}

/// Parses `dpkg-deb -f deb Package Version` output.
fn parse_control(text: &str) -> Option<(String, String)> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    Some((field("Package")?, field("Version")?))
}

/// Replaces characters that do not belong in a directory name (an epoch's
/// `:`) with `_`.
fn path_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._+~-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn single_deb(dir: &Path, package: &str) -> Result<PathBuf, ImageError> {
    let debs: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(|e| ImageError::io("read directory", dir, e))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        .collect();
    match <[PathBuf; 1]>::try_from(debs) {
        Ok([deb]) => Ok(deb),
        Err(debs) => Err(ImageError::UnexpectedOutput {
            command: format!("apt-get download {package}"),
            reason: format!("expected one .deb, found {}", debs.len()),
        }),
    }
}

/// The only `boot/vmlinuz-<release>` in the package, and its release.
fn find_vmlinuz(tree: &Path, package: &str) -> Result<(PathBuf, String), ImageError> {
    let boot = tree.join("boot");
    let found: Vec<(PathBuf, String)> = fs::read_dir(&boot)
        .map_err(|e| ImageError::io("read directory", &boot, e))?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let release = name.strip_prefix("vmlinuz-")?.to_owned();
            Some((e.path(), release))
        })
        .collect();
    match <[(PathBuf, String); 1]>::try_from(found) {
        Ok([one]) => Ok(one),
        Err(found) => Err(ImageError::BadKernelPackage {
            package: package.to_owned(),
            reason: format!("expected one boot/vmlinuz-*, found {}", found.len()),
        }),
    }
}

/// Module names listed in `modules.builtin` (missing file: none).
fn read_builtin(module_root: &Path) -> Result<BTreeSet<String>, ImageError> {
    let path = module_root.join("modules.builtin");
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeSet::new()),
        Err(e) => return Err(ImageError::io("read", &path, e)),
    };
    Ok(text
        .lines()
        .filter_map(|l| l.rsplit('/').next())
        .filter_map(|f| f.strip_suffix(".ko"))
        .map(|n| n.replace('-', "_"))
        .collect())
}

enum ModuleFile {
    Plain(PathBuf),
    Compressed(PathBuf),
}

/// Every module file below `dir`, by module name.
fn index_modules(dir: &Path) -> Result<BTreeMap<String, ModuleFile>, ImageError> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = fs::read_dir(&d).map_err(|e| ImageError::io("read directory", &d, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| ImageError::io("read directory", &d, e))?;
            let ty = entry
                .file_type()
                .map_err(|e| ImageError::io("stat", entry.path(), e))?;
            let path = entry.path();
            if ty.is_dir() {
                stack.push(path);
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(stem) = name.strip_suffix(".ko") {
                out.insert(stem.replace('-', "_"), ModuleFile::Plain(path));
            } else if let Some(stem) = [".ko.xz", ".ko.zst", ".ko.gz"]
                .iter()
                .find_map(|ext| name.strip_suffix(ext))
            {
                out.entry(stem.replace('-', "_"))
                    .or_insert(ModuleFile::Compressed(path));
            }
        }
    }
    Ok(out)
}

fn copy(from: &Path, to: &Path) -> Result<(), ImageError> {
    fs::copy(from, to)
        .map(|_| ())
        .map_err(|e| ImageError::io("copy to", to, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apt_cache_size() {
        let show = "Package: linux-image-6.1.0-50-cloud-amd64-unsigned\nVersion: 6.1.176-1\nSize: 49151234\nMD5sum: 0\n";
        assert_eq!(parse_size(show), Some(49_151_234));
        assert_eq!(parse_size("Package: x\n"), None);
    }

    #[test]
    fn family_of_the_pinned_package() {
        let (prefix, suffix) = package_family(DEFAULT_KERNEL_PACKAGE).unwrap();
        assert_eq!(prefix, "linux-image-6.1.0-");
        assert_eq!(suffix, "-cloud-amd64-unsigned");
        assert_eq!(
            abi_number("linux-image-6.1.0-57-cloud-amd64-unsigned", prefix, suffix),
            Some(57)
        );
        assert_eq!(
            abi_number("linux-image-6.1.0-57-cloud-amd64", prefix, suffix),
            None
        );
        assert_eq!(package_family("linux-image-cloud-amd64"), None);
        assert_eq!(regex_escape("6.1.0-"), "6\\.1\\.0-");
    }

    #[test]
    fn control_fields_and_safe_paths() {
        let info = "Package: linux-image-6.1.0-50-cloud-amd64-unsigned\nVersion: 6.1.176-1\n";
        assert_eq!(
            parse_control(info),
            Some((
                "linux-image-6.1.0-50-cloud-amd64-unsigned".into(),
                "6.1.176-1".into()
            ))
        );
        assert_eq!(parse_control("Package: x\n"), None);
        assert_eq!(path_safe("1:2.3+b1~x"), "1_2.3+b1~x");
    }
}
