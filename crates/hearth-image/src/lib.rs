//! Builds and caches the guest artifacts Hearth boots.
//!
//! A Hearth microVM boots three things, all built here from Debian packages
//! and kept under `<data_dir>/artifacts`:
//!
//! - a **kernel** ([`ensure_kernel`] → [`KernelArtifact`]): Debian's cloud
//!   kernel package, pinned by name, fetched with `apt-get download`, plus the
//!   virtio modules it needs as `.ko` files (they are not built in);
//! - an **initramfs** ([`ensure_initramfs`] → [`InitramfsArtifact`]): an
//!   uncompressed newc cpio holding the static guest agent as `/init` and the
//!   modules as `/hearth/modules/NN-<name>.ko`, to be loaded in lexical order;
//! - a **root image** ([`ensure_rootfs`] → [`RootfsArtifact`]): an ext4 file
//!   for one [`ImageName`] — `busybox` (tiny, built in a second) or `default`
//!   (Debian minbase with bash, python, pip, git, curl, jq, ripgrep…, built
//!   by debootstrap).
//!   Callers must never modify it; sandboxes write to their own layers.
//!
//! Root images can also come from Docker/OCI images: [`import_oci`] pulls
//! one from a registry or reads a `docker save` / OCI-layout tarball and
//! writes an ext4 image of a requested capacity (see [`oci`]).
//!
//! [`ensure_all`] does all of it, including writing out the guest agent
//! ([`guest_agent_binary`]): `build.rs` builds it statically at compile time
//! and this crate embeds it, so nothing here needs cargo or the source tree
//! at run time.
//!
//! Every `ensure_*` is idempotent: a `manifest.json` beside each artifact
//! records its inputs, versions and BLAKE3 checksums, and a call whose inputs
//! match returns at once. Builds run under an exclusive file lock
//! (`artifacts/.lock`), go into a `.tmp-*` staging directory and are renamed
//! into place, so concurrent processes never see half-built artifacts: the
//! second one waits, then finds the cache.
//!
//! The API is synchronous and shells out to Debian tools (`apt-get`,
//! `dpkg-deb`, `debootstrap`, `mkfs.ext4`, `debugfs`); async callers use
//! `spawn_blocking`. Slow steps report through a [`Progress`].

mod cache;
mod command;
mod cpio;
pub mod elf;
mod error;
mod ext4;
mod guest_agent;
mod initramfs;
mod kernel;
pub mod mirror;
pub mod oci;
mod progress;
mod rootfs;
mod vmlinux;

use std::path::{Path, PathBuf};

pub use error::ImageError;
pub use guest_agent::{
    embedded_guest_agent, embedded_guest_agent_blake3, guest_agent_binary,
    EMBEDDED_GUEST_AGENT_PROFILE, GUEST_BIN_ENV,
};
pub use hearth_types::image::{ImageName, UnknownImageName};
pub use initramfs::{ensure_initramfs, InitramfsArtifact};
pub use kernel::{
    ensure_kernel, KernelArtifact, KernelModule, DEFAULT_KERNEL_PACKAGE, MODULE_LOAD_ORDER,
};
pub use oci::{
    import_oci, reference_registry, OciError, OciImage, OciSource, RegistryAuth, RunConfig,
};
pub use progress::{under_way, Progress, QuietProgress, StderrProgress, Unit};
pub use rootfs::{
    ensure_rootfs, ensure_rootfs_all, fs_uuid, recipe_version, RootfsArtifact, ROOTFS_LABEL,
};

/// Where and from what the artifacts are built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageConfig {
    /// Hearth's data directory, e.g. `/var/lib/hearth`; artifacts go under
    /// `data_dir/artifacts`.
    pub data_dir: PathBuf,
    /// The Debian kernel package to use, pinned by ABI version.
    pub kernel_package: String,
    /// The Debian mirror for debootstrap; `None` reads it from apt's sources
    /// (see [`mirror`]), falling back to `http://deb.debian.org/debian`.
    pub debian_mirror: Option<String>,
    /// The Debian suite of the default image.
    pub suite: String,
}

impl ImageConfig {
    /// The defaults: [`DEFAULT_KERNEL_PACKAGE`], apt's mirror, `bookworm`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        ImageConfig {
            data_dir: data_dir.into(),
            kernel_package: DEFAULT_KERNEL_PACKAGE.to_owned(),
            debian_mirror: None,
            suite: "bookworm".to_owned(),
        }
    }

    /// `data_dir/artifacts`.
    pub fn artifacts_dir(&self) -> PathBuf {
        self.data_dir.join("artifacts")
    }

    /// The mirror debootstrap will use: the configured one, else apt's.
    pub fn resolved_mirror(&self) -> String {
        match &self.debian_mirror {
            Some(m) => m.clone(),
            None => mirror::mirror_from_apt(Path::new("/etc/apt"), &self.suite),
        }
    }
}

/// Everything needed to boot one image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestArtifacts {
    /// The kernel and its modules.
    pub kernel: KernelArtifact,
    /// The initramfs with the guest agent and the modules.
    pub initramfs: InitramfsArtifact,
    /// The root image.
    pub rootfs: RootfsArtifact,
}

/// Writes out (or locates) the guest agent, then ensures the kernel, the
/// initramfs and the root image `image`.
pub fn ensure_all(
    cfg: &ImageConfig,
    image: ImageName,
    p: &dyn Progress,
) -> Result<GuestArtifacts, ImageError> {
    let agent = guest_agent_binary(cfg, p)?;
    let kernel = ensure_kernel(cfg, p)?;
    let initramfs = ensure_initramfs(cfg, &kernel, &agent, p)?;
    let rootfs = ensure_rootfs(cfg, image, p)?;
    Ok(GuestArtifacts {
        kernel,
        initramfs,
        rootfs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_name_round_trips() {
        for name in ImageName::ALL {
            assert_eq!(name.to_string().parse::<ImageName>().unwrap(), name);
            let json = serde_json::to_string(&name).unwrap();
            assert_eq!(json, format!("\"{name}\""));
            assert_eq!(serde_json::from_str::<ImageName>(&json).unwrap(), name);
        }
        assert_eq!("busybox".parse::<ImageName>().unwrap(), ImageName::Busybox);
        assert_eq!("default".parse::<ImageName>().unwrap(), ImageName::Default);
        let err = "Default".parse::<ImageName>().unwrap_err();
        assert_eq!(err.input, "Default");
        assert!("".parse::<ImageName>().is_err());
    }

    #[test]
    fn config_defaults() {
        let cfg = ImageConfig::new("/var/lib/hearth");
        assert_eq!(cfg.artifacts_dir(), Path::new("/var/lib/hearth/artifacts"));
        assert_eq!(
            cfg.kernel_package,
            "linux-image-6.1.0-50-cloud-amd64-unsigned"
        );
        assert_eq!(cfg.suite, "bookworm");
        let with = ImageConfig {
            debian_mirror: Some("http://m.example/debian".into()),
            ..cfg
        };
        assert_eq!(with.resolved_mirror(), "http://m.example/debian");
    }
}
