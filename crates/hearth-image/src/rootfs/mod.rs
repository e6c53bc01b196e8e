//! Root images: an ext4 file per [`ImageName`], built by a versioned recipe.
//!
//! Each image lives in `artifacts/rootfs-<name>-v<recipe>/` as `rootfs.ext4`
//! plus `manifest.json` (recipe inputs, size, BLAKE3). A recipe's inputs are
//! what changes its output: the host's busybox binary for `busybox`, the
//! suite and package list for `default` (the mirror is not an input: any
//! mirror serves the same packages). Old recipe versions are left in place:
//! existing sandboxes may still be layered on them.

mod buildkit;
mod busybox;
mod code_interpreter;
mod debian;
mod npm;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{chown, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::cache::{self, Staging};
use crate::ext4::{self, Times};
use crate::{ImageConfig, ImageError, ImageName, Progress};

pub use crate::ext4::ROOTFS_LABEL;

/// Recipe version of the busybox image.
pub(crate) const BUSYBOX_RECIPE: u32 = 2;
/// Recipe version of the default image (its package list is an input of
/// its own: changing it rebuilds the image without a bump).
pub(crate) const DEFAULT_RECIPE: u32 = 3;
/// Recipe version of the code-interpreter image (its packages and its
/// server are inputs of their own).
pub(crate) const CODE_INTERPRETER_RECIPE: u32 = 2;

const MIB: u64 = 1024 * 1024;
const IMAGE_FILE: &str = "rootfs.ext4";

/// A cached root image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootfsArtifact {
    /// Which image.
    pub name: ImageName,
    /// The ext4 image. Never modify it: it is shared by every sandbox.
    pub path: PathBuf,
    /// Its (apparent) size in bytes; the file is sparse.
    pub size_bytes: u64,
    /// BLAKE3 of the whole image file.
    pub blake3: String,
    /// The recipe version it was built with.
    pub recipe_version: u32,
}

#[derive(Debug, Serialize, Deserialize)]
struct RootfsManifest {
    name: ImageName,
    recipe: u32,
    inputs: BTreeMap<String, String>,
    file: String,
    size: u64,
    blake3: String,
    /// Bytes the source tree used before it became an image.
    tree_bytes: u64,
    /// Informational (not an input): where packages came from.
    mirror: Option<String>,
    built_at_unix: u64,
    build_seconds: f64,
}

/// Returns the root image `name`, building it first if needed (needs root).
pub fn ensure_rootfs(
    cfg: &ImageConfig,
    name: ImageName,
    p: &dyn Progress,
) -> Result<RootfsArtifact, ImageError> {
    let inputs = recipe_inputs(cfg, name)?;
    let artifacts = cfg.artifacts_dir();
    let dir = image_dir(&artifacts, name);
    if let Some(hit) = cached(&dir, name, &inputs) {
        return Ok(hit);
    }
    let _lock = cache::lock(&artifacts, p)?;
    if let Some(hit) = cached(&dir, name, &inputs) {
        return Ok(hit);
    }
    cache::require_root(&format!("the {name} root image"))?;

    let started = Instant::now();
    let build = Build::new(&artifacts, name, p)?;
    let mirror = match name {
        ImageName::Busybox => {
            busybox::populate(&build.tree)?;
            None
        }
        ImageName::Default => Some(debian::populate(cfg, &build.tree, &[], p)?),
        ImageName::CodeInterpreter => {
            let mirror = debian::populate(cfg, &build.tree, &code_interpreter::EXTRA, p)?;
            code_interpreter::install(&build.tree)?;
            Some(mirror)
        }
    };
    build.finish(inputs, mirror, &dir, started, p)
}

/// Returns the root images `names`, in that order, building those missing.
/// When both Debian images are missing, one debootstrap makes both: the
/// code interpreter's tree is a copy of the default's taken before either
/// is finished, so each image holds what its own build would (about a
/// minute of debootstrap saved, `hearth image build --image all`).
pub fn ensure_rootfs_all(
    cfg: &ImageConfig,
    names: &[ImageName],
    p: &dyn Progress,
) -> Result<Vec<RootfsArtifact>, ImageError> {
    let pair = [ImageName::Default, ImageName::CodeInterpreter];
    let both_wanted = pair.iter().all(|n| names.contains(n));
    let artifacts = cfg.artifacts_dir();
    let both_missing = || -> Result<bool, ImageError> {
        for name in pair {
            let inputs = recipe_inputs(cfg, name)?;
            if cached(&image_dir(&artifacts, name), name, &inputs).is_some() {
                return Ok(false);
            }
        }
        Ok(true)
    };
    let mut built = Vec::with_capacity(names.len());
    for &name in names {
        if both_wanted && pair.contains(&name) && both_missing()? {
            let _lock = cache::lock(&artifacts, p)?;
            if both_missing()? {
                build_debian_pair(cfg, p)?;
            }
        }
        built.push(ensure_rootfs(cfg, name, p)?);
    }
    Ok(built)
}

/// Builds the default and code-interpreter images from one debootstrap
/// (the caller holds the cache lock and found both missing).
fn build_debian_pair(cfg: &ImageConfig, p: &dyn Progress) -> Result<(), ImageError> {
    cache::require_root("the default and code-interpreter root images")?;
    let artifacts = cfg.artifacts_dir();
    let started = Instant::now();
    let default = Build::new(&artifacts, ImageName::Default, p)?;
    let interp = Build::new(&artifacts, ImageName::CodeInterpreter, p)?;
    let mirror = debian::bootstrap(cfg, &default.tree, p)?;
    p.step("copying the bootstrapped tree for the code-interpreter image");
    debian::copy_tree(&default.tree, &interp.tree)?;
    debian::finish(&default.tree, &[], p)?;
    let inputs = recipe_inputs(cfg, ImageName::Default)?;
    let dir = image_dir(&artifacts, ImageName::Default);
    default.finish(inputs, Some(mirror.clone()), &dir, started, p)?;

    debian::finish(&interp.tree, &code_interpreter::EXTRA, p)?;
    code_interpreter::install(&interp.tree)?;
    let inputs = recipe_inputs(cfg, ImageName::CodeInterpreter)?;
    let dir = image_dir(&artifacts, ImageName::CodeInterpreter);
    interp.finish(inputs, Some(mirror), &dir, started, p)?;
    Ok(())
}

fn image_dir(artifacts: &Path, name: ImageName) -> PathBuf {
    artifacts.join(format!("rootfs-{name}-v{}", recipe_version(name)))
}

/// An image being built: its staging directory (removed unless the image
/// lands) and the tree that becomes the ext4 file.
struct Build {
    name: ImageName,
    staging: Staging,
    tree: PathBuf,
}

impl Build {
    fn new(artifacts: &Path, name: ImageName, p: &dyn Progress) -> Result<Build, ImageError> {
        p.step(&format!("building {name} root image"));
        let staging = Staging::new(artifacts, &format!("rootfs-{name}"))?;
        let tree = staging.path().join("root");
        make_dir(&tree, 0o755)?;
        Ok(Build {
            name,
            staging,
            tree,
        })
    }

    /// Makes the ext4 image of the populated tree and moves it, with its
    /// manifest, into `dir`.
    fn finish(
        self,
        inputs: BTreeMap<String, String>,
        mirror: Option<String>,
        dir: &Path,
        started: Instant,
        p: &dyn Progress,
    ) -> Result<RootfsArtifact, ImageError> {
        let name = self.name;
        let tree = &self.tree;
        let tree_bytes = ext4::disk_usage(tree)?;
        let (size, times) = match name {
            ImageName::Busybox => (64 * MIB, Times::AllFixed),
            ImageName::Default | ImageName::CodeInterpreter => (
                (tree_bytes + 1024 * MIB).div_ceil(256 * MIB) * 256 * MIB,
                Times::KeepMtime,
            ),
        };

        p.step(&format!(
            "building {name} root image: mkfs.ext4 ({} MiB)",
            size / MIB
        ));
        let out = self.staging.path().join("out");
        make_dir(&out, 0o755)?;
        let img = out.join(IMAGE_FILE);
        ext4::make_image(tree, &img, size, fs_uuid(name), times)?;
        cache::remove_all(tree)?;
        let manifest = RootfsManifest {
            name,
            recipe: recipe_version(name),
            inputs,
            file: IMAGE_FILE.to_owned(),
            size: cache::file_len(&img)?,
            blake3: cache::hash_file(&img)?,
            tree_bytes,
            mirror,
            built_at_unix: cache::unix_now(),
            build_seconds: started.elapsed().as_secs_f64(),
        };
        cache::write_manifest(&out.join("manifest.json"), &manifest)?;
        cache::replace(&out, dir)?;
        drop(self.staging);
        p.done(
            &format!(
                "{name} root image ({} MiB, {} MiB used)",
                manifest.size / MIB,
                manifest.tree_bytes.div_ceil(MIB)
            ),
            started.elapsed(),
        );
        Ok(artifact(dir, manifest))
    }
}

/// What the image content depends on, besides the recipe version.
fn recipe_inputs(
    cfg: &ImageConfig,
    name: ImageName,
) -> Result<BTreeMap<String, String>, ImageError> {
    let mut inputs = BTreeMap::new();
    match name {
        ImageName::Busybox => {
            let bin = busybox::host_busybox()?;
            inputs.insert("busybox_blake3".to_owned(), cache::hash_file(&bin)?);
        }
        ImageName::Default => {
            inputs.insert("suite".to_owned(), cfg.suite.clone());
            inputs.insert("variant".to_owned(), debian::VARIANT.to_owned());
            inputs.insert("include".to_owned(), debian::INCLUDE.join(","));
            inputs.insert(
                "npm".to_owned(),
                format!("{} {}", npm::VERSION, npm::INTEGRITY),
            );
            inputs.insert("buildkit_blake3".to_owned(), buildkit::fingerprint());
        }
        ImageName::CodeInterpreter => {
            inputs.insert("suite".to_owned(), cfg.suite.clone());
            inputs.insert("variant".to_owned(), debian::VARIANT.to_owned());
            inputs.insert("include".to_owned(), debian::INCLUDE.join(","));
            inputs.insert("extra".to_owned(), code_interpreter::EXTRA.join(","));
            inputs.insert(
                "npm".to_owned(),
                format!("{} {}", npm::VERSION, npm::INTEGRITY),
            );
            inputs.insert("files_blake3".to_owned(), code_interpreter::fingerprint());
            inputs.insert("buildkit_blake3".to_owned(), buildkit::fingerprint());
        }
    }
    Ok(inputs)
}

fn cached(
    dir: &Path,
    name: ImageName,
    inputs: &BTreeMap<String, String>,
) -> Option<RootfsArtifact> {
    let m: RootfsManifest = cache::read_manifest(&dir.join("manifest.json"))?;
    let ok = m.name == name
        && m.recipe == recipe_version(name)
        && &m.inputs == inputs
        && cache::file_has_len(&dir.join(&m.file), m.size);
    ok.then(|| artifact(dir, m))
}

fn artifact(dir: &Path, m: RootfsManifest) -> RootfsArtifact {
    RootfsArtifact {
        name: m.name,
        path: dir.join(&m.file),
        size_bytes: m.size,
        blake3: m.blake3,
        recipe_version: m.recipe,
    }
}

/// Creates `path` (parents too) and sets its mode exactly (no umask).
/// Makes `path` with `mode`, and each missing directory above it 0755
/// (not the builder's umask, which would hide them from users).
pub(super) fn make_dir(path: &Path, mode: u32) -> Result<(), ImageError> {
    if let Some(parent) = path.parent() {
        if !parent.as_os_str().is_empty() && !parent.exists() {
            make_dir(parent, 0o755)?;
        }
    }
    match fs::create_dir(path) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(ImageError::io("create directory", path, e))
        }
        _ => {}
    }
    set_mode(path, mode)
}

pub(super) fn set_mode(path: &Path, mode: u32) -> Result<(), ImageError> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| ImageError::io("set mode of", path, e))
}

/// Writes `contents` to `path` with exactly `mode`.
pub(super) fn write_file(path: &Path, contents: &str, mode: u32) -> Result<(), ImageError> {
    fs::write(path, contents).map_err(|e| ImageError::io("write", path, e))?;
    set_mode(path, mode)
}

pub(super) fn chown_ids(path: &Path, uid: u32, gid: u32) -> Result<(), ImageError> {
    chown(path, Some(uid), Some(gid)).map_err(|e| ImageError::io("chown", path, e))
}

/// The version of `name`'s build recipe; bumping it rebuilds caches.
pub fn recipe_version(name: ImageName) -> u32 {
    match name {
        ImageName::Busybox => BUSYBOX_RECIPE,
        ImageName::Default => DEFAULT_RECIPE,
        ImageName::CodeInterpreter => CODE_INTERPRETER_RECIPE,
    }
}

/// The fixed filesystem UUID of `name`'s root image.
pub fn fs_uuid(name: ImageName) -> &'static str {
    match name {
        ImageName::Busybox => "4e8a7f31-6b1d-4c52-9a0e-000000000001",
        ImageName::Default => "4e8a7f31-6b1d-4c52-9a0e-000000000002",
        ImageName::CodeInterpreter => "4e8a7f31-6b1d-4c52-9a0e-000000000003",
    }
}
