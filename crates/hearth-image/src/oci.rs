//! Importing Docker/OCI images as Hearth root images.
//!
//! [`import_oci`] takes an [`OciSource`] (a registry reference, or a
//! `docker save` / OCI-layout tarball), pulls the linux/amd64 image,
//! applies its layers in order into a staging directory (`oci/unpack.rs`:
//! whiteouts, no path ever leaves the root), adds the mount points the
//! guest's init needs, and writes an ext4 image of exactly the requested
//! capacity with `mkfs.ext4 -d` (the same [`ROOTFS_LABEL`](crate::ROOTFS_LABEL)
//! and layout as the built-in images; the guest mounts `/dev/vda` as ext4).
//! The image's `Entrypoint`, `Cmd`, `Env`, `WorkingDir` and `User` come
//! back as a [`RunConfig`].
//!
//! Nothing from the source is trusted: every blob is checked against its
//! digest and size before it is unpacked (layers of a `docker save`
//! archive, which carry no compressed digest, against the config's
//! `diff_ids` while unpacking, in a staging directory that is discarded on
//! failure); documents are capped at 4 MiB, layers at [`MAX_LAYERS`], and
//! the unpacked tree at the capacity.
//!
//! Unlike the rest of this crate the entry point is async (the registry
//! client is); the unpacking and `mkfs.ext4` run on tokio's blocking pool.

mod archive;
mod manifest;
mod reference;
mod registry;
mod unpack;

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hearth_types::ByteSize;

use crate::cache::{self, Staging};
use crate::ext4::{self, Times};
use crate::{ImageError, Progress, Unit};
use manifest::{parse_document, pick_platform, Document, ImageConfigBlob};

/// Most layers an image may have (Docker's own limit is 127).
pub const MAX_LAYERS: usize = 128;
/// Smallest capacity accepted: below this ext4's own metadata crowds out
/// any real image.
pub const MIN_CAPACITY: ByteSize = ByteSize(16 * 1024 * 1024);

/// Where the Debian images' `docker load` keeps archives in the guest
/// (see `rootfs/buildkit.rs`), each as `<sha256 of a name it carries>.tar`.
pub const LOADED_IMAGES_DIR: &str = "/var/lib/hearth/docker/images";

/// The guest paths where `docker load` would have kept the image
/// `reference` (one per spelling of its name), for a capture with
/// `docker_image` to read the first that exists.
pub fn loaded_archive_paths(reference: &str) -> Result<Vec<String>, OciError> {
    use sha2::Digest;
    Ok(reference::Reference::loaded_names(reference)?
        .into_iter()
        .map(|n| {
            let key = hex_lower(&sha2::Sha256::digest(n.as_bytes()));
            format!("{LOADED_IMAGES_DIR}/{key}.tar")
        })
        .collect())
}

fn hex_lower(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The registry an image reference pulls from, as `host[:port]` of its
/// API in lowercase (Docker Hub's names are `registry-1.docker.io`): what
/// a registry's credentials must name before they go with the pull.
pub fn reference_registry(reference: &str) -> Result<String, OciError> {
    Ok(reference::Reference::parse(reference)?
        .registry
        .to_ascii_lowercase())
}

/// Where an image comes from.
#[derive(Clone, PartialEq, Eq)]
pub enum OciSource {
    /// A registry speaking the OCI distribution API.
    Registry {
        /// `[registry/]name[:tag][@sha256:…]`, Docker's spelling:
        /// `127.0.0.1:5000/hello:v1`, `docker.io/library/alpine:3`, `alpine`.
        reference: String,
        /// Credentials, for basic auth or to obtain a bearer token.
        auth: Option<RegistryAuth>,
        /// Speak plain HTTP instead of HTTPS (local registries).
        insecure_http: bool,
    },
    /// A `docker save` tarball or an OCI image layout tarball on disk.
    Archive(PathBuf),
}

impl std::fmt::Debug for OciSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OciSource::Registry {
                reference,
                auth,
                insecure_http,
            } => f
                .debug_struct("Registry")
                .field("reference", reference)
                .field("auth", auth)
                .field("insecure_http", insecure_http)
                .finish(),
            OciSource::Archive(p) => f.debug_tuple("Archive").field(p).finish(),
        }
    }
}

/// Registry credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct RegistryAuth {
    /// User name.
    pub username: String,
    /// Password or access token.
    pub password: String,
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryAuth")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// How the image wants its process started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunConfig {
    /// `Entrypoint`.
    pub entrypoint: Vec<String>,
    /// `Cmd`.
    pub cmd: Vec<String>,
    /// `Env`, split at the first `=`, in order.
    pub env: Vec<(String, String)>,
    /// `WorkingDir`, when set.
    pub working_dir: Option<String>,
    /// `User` (`name`, `uid`, `uid:gid`…), when set.
    pub user: Option<String>,
}

/// An imported image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciImage {
    /// How to run it.
    pub run_config: RunConfig,
    /// The digest of the platform manifest (`sha256:…`); for a `docker save`
    /// archive, which has no manifest, the config's digest (the image id).
    pub digest: String,
    /// Bytes the unpacked tree used before it became an image.
    pub rootfs_bytes: u64,
}

/// Why an import failed.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// The reference cannot be parsed.
    #[error("bad image reference {reference:?}: {reason}")]
    BadReference {
        /// What was given.
        reference: String,
        /// What is wrong.
        reason: String,
    },
    /// The registry could not be reached or the transfer broke.
    #[error("request to {url} failed")]
    Http {
        /// The URL asked.
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// The registry answered with an error status.
    #[error("{url} answered {status}: {body}")]
    Status {
        /// The URL asked.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The start of its body.
        body: String,
    },
    /// The registry refused the credentials (or their absence).
    #[error("not authorized for {url}: {reason}")]
    Unauthorized {
        /// The URL asked.
        url: String,
        /// Why.
        reason: String,
    },
    /// Something exceeded its cap.
    #[error("{what} is larger than {limit} bytes")]
    TooLarge {
        /// What.
        what: String,
        /// The cap.
        limit: u64,
    },
    /// A blob or layer does not hash to its digest.
    #[error("{what} does not match its digest: expected {expected}, got {actual}")]
    DigestMismatch {
        /// What was checked.
        what: String,
        /// The digest the manifest or config names.
        expected: String,
        /// The digest of what arrived.
        actual: String,
    },
    /// A blob is not the size its descriptor gives.
    #[error("{what} has {actual} bytes; its descriptor says {expected}")]
    SizeMismatch {
        /// What was checked.
        what: String,
        /// The size in the descriptor.
        expected: u64,
        /// What arrived.
        actual: String,
    },
    /// A manifest, index, config or token is malformed.
    #[error("malformed {what}: {reason}")]
    BadDocument {
        /// Which document.
        what: String,
        /// What is wrong.
        reason: String,
    },
    /// A manifest or layer type this importer does not handle.
    #[error("unsupported media type {media_type}")]
    UnsupportedMediaType {
        /// The type.
        media_type: String,
    },
    /// The image has no linux/amd64 variant.
    #[error("no linux/amd64 image (available: {})", available.join(", "))]
    NoPlatform {
        /// The platforms offered, as `os/arch`.
        available: Vec<String>,
    },
    /// More layers than [`MAX_LAYERS`].
    #[error("{count} layers; at most {limit} are accepted")]
    TooManyLayers {
        /// Layers in the manifest.
        count: usize,
        /// The cap.
        limit: usize,
    },
    /// The image does not fit the requested capacity.
    #[error("the image does not fit in {capacity} bytes ({needed})")]
    CapacityExceeded {
        /// The capacity asked for.
        capacity: u64,
        /// How much more was needed, in words.
        needed: String,
    },
    /// A layer entry would land outside the root filesystem.
    #[error("layer {index}: refusing entry {path:?}: {reason}")]
    UnsafePath {
        /// The layer (0-based).
        index: usize,
        /// The entry name.
        path: String,
        /// Why it was refused.
        reason: String,
    },
    /// A layer cannot be read or unpacked.
    #[error("layer {index}: {reason}")]
    Layer {
        /// The layer (0-based).
        index: usize,
        /// What went wrong.
        reason: String,
    },
    /// The image tarball is not one this importer reads.
    #[error("image archive {}: {reason}", path.display())]
    Archive {
        /// The tarball.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Local work failed: files, `mkfs.ext4`, root privileges.
    #[error(transparent)]
    Image(#[from] ImageError),
}

/// A pulled image, ready to unpack: its digest, config, and layers in order.
pub(crate) struct Pulled {
    digest: String,
    config: Vec<u8>,
    layers: Vec<LayerBlob>,
}

pub(crate) struct LayerBlob {
    data: LayerData,
}

/// Where a layer's (verified, maybe compressed) bytes are.
pub(crate) enum LayerData {
    /// A downloaded blob.
    File(PathBuf),
    /// A member of an image archive.
    Slice {
        archive: PathBuf,
        offset: u64,
        size: u64,
    },
}

impl LayerData {
    fn open(&self) -> Result<Box<dyn Read>, OciError> {
        Ok(match self {
            LayerData::File(p) => {
                Box::new(fs::File::open(p).map_err(|e| ImageError::io("open", p, e))?)
            }
            LayerData::Slice {
                archive,
                offset,
                size,
            } => Box::new(archive::open_slice(archive, *offset, *size)?),
        })
    }
}

pub(crate) fn check_layers(count: usize, limit: usize) -> Result<(), OciError> {
    if count > limit {
        Err(OciError::TooManyLayers { count, limit })
    } else {
        Ok(())
    }
}

/// Imports `source` into a new ext4 image at `out` of exactly `capacity`
/// bytes (rounded down to 4 KiB), replacing `out` only once it is complete.
/// Needs root (the tree keeps the layers' owners) and a tokio runtime.
pub async fn import_oci(
    source: OciSource,
    out: &Path,
    capacity: ByteSize,
    progress: &dyn Progress,
) -> Result<OciImage, OciError> {
    let started = Instant::now();
    cache::require_root("importing an OCI image")?;
    let capacity = capacity.bytes() / 4096 * 4096;
    if capacity < MIN_CAPACITY.bytes() {
        return Err(OciError::CapacityExceeded {
            capacity,
            needed: format!("at least {} bytes are needed", MIN_CAPACITY.bytes()),
        });
    }
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let staging = Staging::new(&parent, "oci")?;
    let what = match &source {
        OciSource::Registry { reference, .. } => reference.clone(),
        OciSource::Archive(p) => p.display().to_string(),
    };
    let pulled = match source {
        OciSource::Registry {
            reference,
            auth,
            insecure_http,
        } => {
            pull(
                &reference,
                auth,
                insecure_http,
                staging.path(),
                capacity,
                progress,
            )
            .await?
        }
        OciSource::Archive(path) => {
            progress.step(&format!("reading image archive {}", path.display()));
            blocking(progress, move |_| archive::load(&path, MAX_LAYERS)).await?
        }
    };
    let staging_path = staging.path().to_path_buf();
    let out_path = out.to_path_buf();
    let image = blocking(progress, move |p| {
        build(pulled, &staging_path, &out_path, capacity, p)
    })
    .await?;
    drop(staging);
    progress.done(
        &format!(
            "OCI image {what} ({} MiB used of {} MiB)",
            image.rootfs_bytes.div_ceil(1 << 20),
            capacity >> 20
        ),
        started.elapsed(),
    );
    Ok(image)
}

/// Fetches the manifest, config and layers of `reference` into `dir`.
async fn pull(
    reference: &str,
    auth: Option<RegistryAuth>,
    insecure_http: bool,
    dir: &Path,
    capacity: u64,
    p: &dyn Progress,
) -> Result<Pulled, OciError> {
    let parsed = reference::Reference::parse(reference)?;
    let mut reg = registry::Registry::new(&parsed, auth, insecure_http)?;
    p.step(&format!("fetching manifest of {reference}"));
    let mut fetched = reg.manifest(&parsed.reference).await?;
    if parsed.reference.starts_with("sha256:") && fetched.digest != parsed.reference {
        return Err(OciError::DigestMismatch {
            what: "manifest".to_owned(),
            expected: parsed.reference.clone(),
            actual: fetched.digest,
        });
    }
    let mut doc = parse_document(fetched.content_type.as_deref(), &fetched.body)?;
    if let Document::Index(index) = &doc {
        let desc = pick_platform(index)?.clone();
        if desc.size > registry::DOC_LIMIT {
            return Err(OciError::TooLarge {
                what: format!("manifest {}", desc.digest),
                limit: registry::DOC_LIMIT,
            });
        }
        fetched = reg.manifest(&desc.digest).await?;
        registry::verify(
            &desc.digest,
            desc.size,
            &fetched.digest,
            fetched.body.len() as u64,
            "manifest",
        )?;
        doc = parse_document(fetched.content_type.as_deref(), &fetched.body)?;
    }
    let Document::Manifest(m) = doc else {
        return Err(OciError::BadDocument {
            what: "manifest".to_owned(),
            reason: "an index where a platform manifest was expected".to_owned(),
        });
    };
    check_layers(m.layers.len(), MAX_LAYERS)?;
    let compressed: u64 = m.layers.iter().map(|l| l.size).fold(0, u64::saturating_add);
    if compressed > capacity {
        return Err(OciError::CapacityExceeded {
            capacity,
            needed: format!("its layers alone are {compressed} bytes compressed"),
        });
    }
    for l in &m.layers {
        manifest::check_layer_type(&l.media_type)?;
    }
    let config = reg.blob_bytes(&m.config).await?;
    p.measure(
        &format!("downloading {} layers of {reference}", m.layers.len()),
        Unit::Bytes,
        Some(compressed),
    );
    let mut done = 0u64;
    let mut layers = Vec::with_capacity(m.layers.len());
    for desc in &m.layers {
        let path = dir.join(format!("blob-{}", manifest::digest_hex(&desc.digest)?));
        if !path.exists() {
            reg.blob_to_file(desc, &path, &mut |n| {
                done += n;
                p.advance(done, Some(compressed), "");
            })
            .await?;
        }
        layers.push(LayerBlob {
            data: LayerData::File(path),
        });
    }
    Ok(Pulled {
        digest: fetched.digest,
        config,
        layers,
    })
}

/// Unpacks `pulled` and writes the image (blocking).
fn build(
    pulled: Pulled,
    staging: &Path,
    out: &Path,
    capacity: u64,
    p: &dyn Progress,
) -> Result<OciImage, OciError> {
    let config: ImageConfigBlob = manifest::json("image config", &pulled.config)?;
    let arch_ok = |a: &str, want: &str| a.is_empty() || a == want;
    if !arch_ok(&config.os, "linux") || !arch_ok(&config.architecture, "amd64") {
        return Err(OciError::NoPlatform {
            available: vec![format!("{}/{}", config.os, config.architecture)],
        });
    }
    let diff_ids = config.rootfs.as_ref().map(|r| &r.diff_ids);
    if let Some(ids) = diff_ids.filter(|ids| ids.len() != pulled.layers.len()) {
        return Err(OciError::BadDocument {
            what: "image config".to_owned(),
            reason: format!("{} diff_ids for {} layers", ids.len(), pulled.layers.len()),
        });
    }
    let run_config = run_config(&config);

    let tree = staging.join("rootfs");
    fs::create_dir(&tree).map_err(|e| ImageError::io("create directory", &tree, e))?;
    let mut unpacker = unpack::Unpacker::new(&tree, capacity);
    let n = pulled.layers.len();
    p.measure("unpacking layers", Unit::Steps, Some(n as u64));
    for (i, layer) in pulled.layers.iter().enumerate() {
        let diff_id = diff_ids.and_then(|ids| ids.get(i)).map(String::as_str);
        unpacker.apply(i, layer.data.open()?, diff_id)?;
        p.advance(i as u64 + 1, Some(n as u64), "");
        if let LayerData::File(path) = &layer.data {
            // Downloaded blobs are no longer needed: free the space early.
            let _ = fs::remove_file(path);
        }
    }
    unpacker.finish();
    if unpacker.skipped_special > 0 {
        p.warn(&format!(
            "left out {} device nodes and FIFOs (the guest mounts its own /dev)",
            unpacker.skipped_special
        ));
    }
    add_mount_points(&tree)?;

    let rootfs_bytes = ext4::disk_usage(&tree)?;
    let needed = rootfs_bytes + ext4_overhead(capacity);
    if needed > capacity {
        return Err(OciError::CapacityExceeded {
            capacity,
            needed: format!("{rootfs_bytes} bytes of files plus ext4 metadata need about {needed}"),
        });
    }
    p.step(&format!("mkfs.ext4 ({} MiB)", capacity >> 20));
    let img = staging.join("rootfs.ext4");
    ext4::make_image(
        &tree,
        &img,
        capacity,
        &fs_uuid(&pulled.digest),
        Times::KeepMtime,
    )?;
    cache::remove_all(&tree)?;
    fs::rename(&img, out).map_err(|e| ImageError::io("rename into", out, e))?;
    Ok(OciImage {
        run_config,
        digest: pulled.digest,
        rootfs_bytes,
    })
}

fn run_config(config: &ImageConfigBlob) -> RunConfig {
    let Some(c) = &config.config else {
        return RunConfig::default();
    };
    RunConfig {
        entrypoint: c.entrypoint.clone().unwrap_or_default(),
        cmd: c.cmd.clone().unwrap_or_default(),
        env: c
            .env
            .iter()
            .flatten()
            .map(|kv| match kv.split_once('=') {
                Some((k, v)) => (k.to_owned(), v.to_owned()),
                None => (kv.clone(), String::new()),
            })
            .collect(),
        working_dir: c.working_dir.clone().filter(|w| !w.is_empty()),
        user: c.user.clone().filter(|u| !u.is_empty()),
    }
}

/// The directories the guest's init mounts onto, when the image lacks
/// them (init can create them in the VM's overlay too, but a read-only
/// image must not depend on that).
fn add_mount_points(tree: &Path) -> Result<(), ImageError> {
    use std::os::unix::fs::PermissionsExt;
    for (dir, mode) in [
        ("proc", 0o555),
        ("sys", 0o555),
        ("dev", 0o755),
        ("tmp", 0o1777),
        ("run", 0o755),
    ] {
        let path = tree.join(dir);
        if fs::symlink_metadata(&path).is_err() {
            fs::create_dir(&path).map_err(|e| ImageError::io("create directory", &path, e))?;
            fs::set_permissions(&path, fs::Permissions::from_mode(mode))
                .map_err(|e| ImageError::io("set mode of", &path, e))?;
        }
    }
    Ok(())
}

/// What ext4 itself takes of a `capacity`-byte filesystem, generously:
/// inode tables (256 bytes per 16 KiB), the journal mke2fs picks, group
/// descriptors, bitmaps and a margin.
fn ext4_overhead(capacity: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    let journal = match capacity {
        c if c < 128 * MIB => 4 * MIB,
        c if c < 1024 * MIB => 16 * MIB,
        c if c < 2048 * MIB => 32 * MIB,
        c if c < 16384 * MIB => 64 * MIB,
        _ => 256 * MIB,
    };
    capacity / 64 + capacity / 100 + journal + 2 * MIB
}

/// A filesystem UUID derived from the image digest (same image, same
/// UUID), shaped as a version-4 UUID.
fn fs_uuid(digest: &str) -> String {
    let hex = manifest::sha256_digest(digest.as_bytes());
    let h = &hex["sha256:".len()..];
    let variant = ['8', '9', 'a', 'b'][usize::from(h.as_bytes()[16] % 4)];
    format!(
        "{}-{}-4{}-{}{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        variant,
        &h[17..20],
        &h[20..32]
    )
}

/// Runs `f` on the blocking pool, relaying its progress to `progress`.
async fn blocking<T: Send + 'static>(
    progress: &dyn Progress,
    f: impl FnOnce(&dyn Progress) -> Result<T, OciError> + Send + 'static,
) -> Result<T, OciError> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let handle = tokio::task::spawn_blocking(move || f(&Relay(tx)));
    while let Some(event) = rx.recv().await {
        match event {
            Event::Step(s) => progress.step(&s),
            Event::Measure(s, unit, total) => progress.measure(&s, unit, total),
            Event::Advance(pos, total, detail) => progress.advance(pos, total, &detail),
            Event::Done(s, d) => progress.done(&s, d),
            Event::Warn(s) => progress.warn(&s),
        }
    }
    match handle.await {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(OciError::Layer {
            index: 0,
            reason: format!("import task cancelled: {e}"),
        }),
    }
}

enum Event {
    Step(String),
    Measure(String, Unit, Option<u64>),
    Advance(u64, Option<u64>, String),
    Done(String, Duration),
    Warn(String),
}

/// A [`Progress`] that sends what it hears to the async side.
struct Relay(tokio::sync::mpsc::UnboundedSender<Event>);

impl Progress for Relay {
    fn step(&self, what: &str) {
        let _ = self.0.send(Event::Step(what.to_owned()));
    }
    fn measure(&self, what: &str, unit: Unit, total: Option<u64>) {
        let _ = self.0.send(Event::Measure(what.to_owned(), unit, total));
    }
    fn advance(&self, position: u64, total: Option<u64>, detail: &str) {
        let _ = self
            .0
            .send(Event::Advance(position, total, detail.to_owned()));
    }
    fn done(&self, what: &str, elapsed: Duration) {
        let _ = self.0.send(Event::Done(what.to_owned(), elapsed));
    }
    fn warn(&self, what: &str) {
        let _ = self.0.send(Event::Warn(what.to_owned()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_is_stable_and_well_formed() {
        let a = fs_uuid("sha256:abc");
        assert_eq!(a, fs_uuid("sha256:abc"));
        assert_ne!(a, fs_uuid("sha256:abd"));
        let parts: Vec<&str> = a.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(parts[2].starts_with('4'));
        assert!("89ab".contains(&parts[3][..1]));
    }

    #[test]
    fn run_config_from_image_config() {
        let config: ImageConfigBlob = manifest::json(
            "config",
            br#"{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/bin","A=b=c","EMPTY"],
               "Entrypoint":["/hello"],"Cmd":null,"WorkingDir":"/work","User":""}}"#,
        )
        .unwrap();
        let rc = run_config(&config);
        assert_eq!(rc.entrypoint, ["/hello"]);
        assert!(rc.cmd.is_empty());
        assert_eq!(
            rc.env,
            [
                ("PATH".to_owned(), "/bin".to_owned()),
                ("A".to_owned(), "b=c".to_owned()),
                ("EMPTY".to_owned(), String::new())
            ]
        );
        assert_eq!(rc.working_dir.as_deref(), Some("/work"));
        assert_eq!(rc.user, None);
    }

    #[test]
    fn debug_hides_the_password() {
        let auth = RegistryAuth {
            username: "u".into(),
            password: "hunter2".into(),
        };
        assert!(!format!("{auth:?}").contains("hunter2"));
    }
}
