//! Where a VM's root disk comes from. The boot asks a [`DiskProvider`] for
//! a block device to attach; the provider owns how the disk is made, kept,
//! grown and admitted against the host's storage.
//!
//! Two providers: [`crate::block::GenerationDisks`] (the default: disks as
//! generations of content-addressed chunks in the store, served to QEMU by
//! the block service) and [`QcowOverlays`] (a qcow2 overlay per VM over the
//! read-only image, in the VM's directory: no snapshots, no commits; kept
//! as the baseline the block service is measured against).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use hearth_types::{ByteSize, VmId};
use hearth_vmm::{DiskFormat, DiskSpec};

use crate::error::HostError;

/// What a boot asks of a [`DiskProvider`].
#[derive(Clone, Copy, Debug)]
pub struct DiskRequest<'a> {
    pub vm: VmId,
    /// The VM's own directory (persistent; removed with the VM).
    pub dir: &'a Path,
    /// The VM's runtime directory (tmpfs; sockets live here).
    pub run_dir: &'a Path,
    /// The read-only image the disk starts from.
    pub base: &'a Path,
    /// A snapshot's disk in the store to start from instead of `base`.
    pub from: Option<&'a str>,
    /// Size of the disk; the image's own when absent or smaller. A kept
    /// disk grows to it, never shrinks.
    pub size: Option<ByteSize>,
    /// Start from the image, discarding any kept disk (`persistent=false`,
    /// or a first boot).
    pub fresh: bool,
    /// Keep the disk's writes across stops.
    pub persistent: bool,
    /// The placement generation the host holds for this VM: commits of the
    /// disk are refused once a newer one exists.
    pub fence: u64,
}

/// A workspace volume a boot attaches beside the root disk
/// ([`hearth_types::sandbox::MountSource::Volume`]).
#[derive(Clone, Copy, Debug)]
pub struct VolumeRequest<'a> {
    pub vm: VmId,
    /// The VM's own directory (the volume's local file lives here).
    pub dir: &'a Path,
    /// The VM's runtime directory (its socket lives here).
    pub run_dir: &'a Path,
    /// Its place among the VM's volumes: names its socket and local file.
    pub index: usize,
    pub mount: &'a hearth_types::sandbox::VolumeMount,
    /// The VM's placement generation: the low half of the commits' fence.
    pub fence: u64,
}

/// A boxed future, so that providers can sit behind `dyn`.
pub type DiskFuture<'a> = Pin<Box<dyn Future<Output = Result<DiskSpec, HostError>> + Send + 'a>>;
/// A boxed future of a provider operation without a result.
pub type UnitFuture<'a> = Pin<Box<dyn Future<Output = Result<(), HostError>> + Send + 'a>>;

/// Makes and keeps VMs' root disks.
pub trait DiskProvider: Send + Sync {
    /// The VM's root disk, ready to attach: admitted against the host's
    /// storage, fresh or kept as asked, at least `size` large.
    fn prepare<'a>(&'a self, req: DiskRequest<'a>) -> DiskFuture<'a>;

    /// A volume to attach beside the root disk, ready to attach: its last
    /// generation (an empty ext4 filesystem of its size the first time),
    /// kept by a writer's commits, or read and dropped by a reader's.
    fn prepare_volume<'a>(&'a self, req: VolumeRequest<'a>) -> DiskFuture<'a>;

    /// The VM's VMM has exited (stop, kill or crash): a persistent disk
    /// keeps what was written (committed), any other drops it; so do its
    /// volumes, a writer's committed, a reader's dropped.
    fn release<'a>(&'a self, vm: VmId) -> UnitFuture<'a>;

    /// The VM's VMM has exited and the VM is going (deleted, or moved to
    /// another host): its volumes are released as at a stop (a writer's
    /// committed), while its root disk waits for [`Self::remove`] or
    /// [`Self::release`].
    fn release_volumes<'a>(&'a self, _vm: VmId) -> UnitFuture<'a> {
        Box::pin(async { Ok(()) })
    }

    /// The VM is deleted: its disk goes, wherever it is kept.
    fn remove<'a>(&'a self, vm: VmId) -> UnitFuture<'a>;

    /// Bytes this host can still give disks.
    fn available(&self) -> u64;
}

/// qcow2 overlays over the read-only image, one per VM (`<vm dir>/root.qcow2`).
#[derive(Clone, Debug)]
pub struct QcowOverlays {
    /// Free space is measured on the filesystem holding this directory.
    data_dir: PathBuf,
}

impl QcowOverlays {
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
        }
    }

    /// Refuses a disk this host cannot hold: its size past what the overlay
    /// already uses must fit in the free space, less a reserve.
    fn admit(&self, id: VmId, overlay: &Path, disk: ByteSize) -> Result<(), HostError> {
        let used = std::fs::metadata(overlay).map(|m| m.len()).unwrap_or(0);
        let free = self.available();
        let need = disk
            .bytes()
            .saturating_sub(used)
            .saturating_add(DISK_RESERVE);
        if need > free {
            return Err(HostError::Invalid(format!(
                "vm {id}: a disk of {disk} does not fit on this host ({} free)",
                ByteSize(free)
            )));
        }
        Ok(())
    }
}

impl DiskProvider for QcowOverlays {
    fn prepare<'a>(&'a self, req: DiskRequest<'a>) -> DiskFuture<'a> {
        Box::pin(async move {
            if req.from.is_some() {
                return Err(HostError::NeedsStore("booting from a snapshot"));
            }
            let overlay = req.dir.join("root.qcow2");
            if let Some(size) = req.size {
                self.admit(req.vm, &overlay, size)?;
            }
            if req.fresh || !overlay.exists() {
                create_overlay(req.vm, req.base, &overlay, req.size).await?;
            } else if let Some(size) = req.size {
                grow_overlay(req.vm, &overlay, size).await?;
            }
            Ok(DiskSpec::file(overlay, DiskFormat::Qcow2))
        })
    }

    fn prepare_volume<'a>(&'a self, _req: VolumeRequest<'a>) -> DiskFuture<'a> {
        Box::pin(async { Err(HostError::NeedsStore("a volume")) })
    }

    fn release<'a>(&'a self, _vm: VmId) -> UnitFuture<'a> {
        // The overlay is the disk: nothing to do.
        Box::pin(async { Ok(()) })
    }

    fn remove<'a>(&'a self, _vm: VmId) -> UnitFuture<'a> {
        // The overlay lives in the VM's directory, removed with it.
        Box::pin(async { Ok(()) })
    }

    fn available(&self) -> u64 {
        disk_available(&self.data_dir).unwrap_or(0)
    }
}

/// Free space every disk admission leaves on the host's data filesystem.
pub const DISK_RESERVE: u64 = 1 << 30;

/// Bytes available to this (root) process on the filesystem holding `path`.
pub(crate) fn disk_available(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a valid NUL-terminated path and `st` points to writable
    // memory of the right type; statvfs initializes it on success.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// A copy-on-write disk over the read-only root image.
/// The disk is `disk` bytes when that is larger than the image; the guest
/// agent grows the filesystem to the device at boot.
async fn create_overlay(
    id: VmId,
    base: &Path,
    overlay: &Path,
    disk: Option<ByteSize>,
) -> Result<(), HostError> {
    use std::ffi::OsStr;
    let _ = std::fs::remove_file(overlay);
    let base_size = std::fs::metadata(base).map(|m| m.len()).unwrap_or(0);
    let mut args: Vec<&OsStr> = ["create", "-q", "-f", "qcow2", "-F", "raw", "-b"]
        .iter()
        .map(OsStr::new)
        .collect();
    args.extend([base.as_os_str(), overlay.as_os_str()]);
    let size = disk
        .filter(|d| d.bytes() > base_size)
        .map(|d| d.bytes().to_string());
    if let Some(size) = &size {
        args.push(size.as_ref());
    }
    qemu_img(id, &args).await.map(drop)
}

/// Runs `qemu-img` with `args`; its stdout.
async fn qemu_img(id: VmId, args: &[&std::ffi::OsStr]) -> Result<Vec<u8>, HostError> {
    let out = tokio::process::Command::new("qemu-img")
        .args(args)
        .output()
        .await
        .map_err(|source| HostError::Io {
            id,
            what: "run qemu-img".into(),
            source,
        })?;
    if !out.status.success() {
        return Err(HostError::Boot {
            id,
            reason: format!(
                "qemu-img {}: {}",
                args.first().map_or("".into(), |a| a.to_string_lossy()),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(out.stdout)
}

/// Grows the overlay's virtual size to `disk` when it is smaller (the guest
/// agent grows the filesystem at boot). Never shrinks.
async fn grow_overlay(id: VmId, overlay: &Path, disk: ByteSize) -> Result<(), HostError> {
    use std::ffi::OsStr;
    let path = overlay.as_os_str();
    let info = qemu_img(id, &["info".as_ref(), "--output=json".as_ref(), path]).await?;
    let size = serde_json::from_slice::<serde_json::Value>(&info)
        .ok()
        .and_then(|v| v["virtual-size"].as_u64())
        .ok_or_else(|| HostError::Boot {
            id,
            reason: "qemu-img info: no virtual-size".into(),
        })?;
    if disk.bytes() > size {
        let target = disk.bytes().to_string();
        let args: [&OsStr; 6] = [
            "resize".as_ref(),
            "-q".as_ref(),
            "-f".as_ref(),
            "qcow2".as_ref(),
            path,
            target.as_ref(),
        ];
        qemu_img(id, &args).await?;
        tracing::info!(vm = %id, from = size, to = disk.bytes(), "grew the disk");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn virtual_size(path: &Path) -> u64 {
        let out = std::process::Command::new("qemu-img")
            .args(["info", "--output=json"])
            .arg(path)
            .output()
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["virtual-size"]
            .as_u64()
            .unwrap_or(0)
    }

    #[tokio::test]
    async fn qcow_overlays_are_made_kept_grown_and_admitted() {
        let dir = std::env::temp_dir().join(format!("hearth-disks-{}", VmId::new()));
        std::fs::create_dir_all(&dir).unwrap();
        let base = dir.join("base.img");
        std::fs::write(&base, vec![0u8; 1 << 20]).unwrap();
        let disks = QcowOverlays::new(&dir);
        let req = |size: Option<ByteSize>, fresh| DiskRequest {
            vm: VmId::new(),
            dir: &dir,
            run_dir: &dir,
            base: &base,
            from: None,
            size,
            fresh,
            persistent: true,
            fence: 0,
        };
        let spec = disks
            .prepare(req(Some(ByteSize::mib(2)), true))
            .await
            .unwrap();
        assert_eq!(
            spec,
            DiskSpec::file(dir.join("root.qcow2"), DiskFormat::Qcow2)
        );
        let overlay = dir.join("root.qcow2");
        assert_eq!(virtual_size(&overlay), 2 << 20);
        // Kept and grown, never shrunk.
        disks
            .prepare(req(Some(ByteSize::mib(4)), false))
            .await
            .unwrap();
        assert_eq!(virtual_size(&overlay), 4 << 20);
        disks
            .prepare(req(Some(ByteSize::mib(3)), false))
            .await
            .unwrap();
        assert_eq!(virtual_size(&overlay), 4 << 20);
        // Fresh again: back to the image's size.
        disks.prepare(req(None, true)).await.unwrap();
        assert_eq!(virtual_size(&overlay), 1 << 20);
        // More than the filesystem holds is refused before anything is made.
        let huge = ByteSize(disks.available() + (1 << 40));
        let err = disks.prepare(req(Some(huge), false)).await.err();
        assert!(matches!(err, Some(HostError::Invalid(_))), "{err:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
