//! Files of the data directory: private directories, the master key, logged
//! removals.

use super::*;

pub(super) fn blake3_tag(p: &Path) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    p.hash(&mut h);
    format!("{:012x}", h.finish() & 0xffff_ffff_ffff)
}

pub(super) fn world_readable(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)?.permissions().mode();
    if mode & 0o444 != 0o444 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode | 0o444))?;
    }
    Ok(())
}

/// The 32-byte master key, its file (mode 0600) made first when there is
/// none. The control plane seals its secrets under the same file, and
/// every host of a fleet must be given the same one.
pub(super) fn master_key(path: &Path) -> Result<[u8; 32], HostError> {
    use hearth_fence::keyfile::{self, Size, Zeroizing};
    let bytes = keyfile::load_or_create("master key file", path, Size::Exactly(32), || {
        let mut key = Zeroizing::new(vec![0u8; 32]);
        getrandom::fill(&mut key).map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(key)
    })?;
    bytes
        .as_slice()
        .try_into()
        .map_err(|_| HostError::Invalid("the master key file changed length".into()))
}

/// Removes a file; one already gone is fine, other failures are logged.
pub(super) fn remove_file_logged(file: &Path) {
    if let Err(e) = std::fs::remove_file(file) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(file = %file.display(), error = %e, "cannot remove a file");
        }
    }
}

/// Removes a directory tree; one already gone is fine, other failures are
/// logged (a leftover directory is harmless but should be seen).
pub(super) fn remove_dir_logged(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a directory");
        }
    }
}

/// Creates `dir` (and parents) private to this user: mode 0700 whatever the
/// umask. An existing directory that others can write is refused (anyone
/// could swap its contents); one they can read or enter is warned about and
/// made private, since it holds guest memory, disks and keys.
pub(super) fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let mode = std::fs::metadata(dir)?.permissions().mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} is writable by other users (mode {mode:03o}); make it private: chmod 700",
                dir.display()
            ),
        ));
    }
    if mode & 0o077 != 0 {
        tracing::warn!(dir = %dir.display(), mode = format!("{mode:03o}"), "directory was readable by other users; making it 0700");
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}
