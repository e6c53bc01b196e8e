//! Secret files (signing keys, the master key, bearer tokens, the proxy's
//! CA key): the one way Hearth makes and reads them.
//!
//! A file is made atomically, mode 0600: a temporary file in the same
//! directory, written and synced, then hard-linked to its name, which fails
//! rather than replace a file someone else made (two processes starting at
//! once agree on one). A file is read only when it is a regular file no
//! group or other user can read (checked on the open file, so the file
//! read is the one checked), and only up to its expected size.

use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub use zeroize::Zeroizing;

/// How large a secret file may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    Exactly(u64),
    AtMost(u64),
}

impl std::fmt::Display for Size {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Size::Exactly(n) => write!(f, "{n}"),
            Size::AtMost(n) => write!(f, "at most {n}"),
        }
    }
}

/// What went wrong with a secret file; `what` names the file's purpose
/// ("key file", "host API token file") for the operator.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    #[error("{what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{what} {path} is accessible by group or others (mode {mode:03o}); \
         it must be 0600 (chmod 600 it, or delete it to make a new one)"
    )]
    Mode {
        what: &'static str,
        path: PathBuf,
        mode: u32,
    },
    #[error("{what} {path} is not a regular file")]
    NotAFile { what: &'static str, path: PathBuf },
    #[error("{what} {path} holds {len} bytes, not {expected}")]
    Length {
        what: &'static str,
        path: PathBuf,
        len: u64,
        expected: Size,
    },
}

impl KeyFileError {
    /// The I/O error's kind, when it is one.
    pub fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            KeyFileError::Io { source, .. } => Some(source.kind()),
            _ => None,
        }
    }
}

/// The secret file `path` (its purpose `what`), or a fresh one of `make`
/// written there first when there is none. When another process makes it
/// at the same time, both use the one that landed.
pub fn load_or_create(
    what: &'static str,
    path: &Path,
    size: Size,
    make: impl FnOnce() -> io::Result<Zeroizing<Vec<u8>>>,
) -> Result<Zeroizing<Vec<u8>>, KeyFileError> {
    match read(what, path, size) {
        Err(e) if e.io_kind() == Some(io::ErrorKind::NotFound) => {}
        other => return other,
    }
    let fresh = make().map_err(|source| KeyFileError::Io {
        what,
        path: path.to_owned(),
        source,
    })?;
    match write_new(what, path, &fresh) {
        Ok(()) => Ok(fresh),
        Err(e) if e.io_kind() == Some(io::ErrorKind::AlreadyExists) => read(what, path, size),
        Err(e) => Err(e),
    }
}

/// The content of the secret file `path`.
pub fn read(
    what: &'static str,
    path: &Path,
    size: Size,
) -> Result<Zeroizing<Vec<u8>>, KeyFileError> {
    let io = |source| KeyFileError::Io {
        what,
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(KeyFileError::NotAFile {
            what,
            path: path.to_owned(),
        });
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyFileError::Mode {
            what,
            path: path.to_owned(),
            mode,
        });
    }
    let bad_len = |len| KeyFileError::Length {
        what,
        path: path.to_owned(),
        len,
        expected: size,
    };
    let max = match size {
        Size::Exactly(n) if meta.len() != n => return Err(bad_len(meta.len())),
        Size::Exactly(n) | Size::AtMost(n) => n,
    };
    // One byte past the most it may hold says it holds more (the file may
    // have grown since the fstat).
    let mut bytes = Zeroizing::new(Vec::with_capacity(max as usize + 1));
    file.take(max + 1).read_to_end(&mut bytes).map_err(io)?;
    let len = bytes.len() as u64;
    match size {
        Size::Exactly(n) if len != n => Err(bad_len(len)),
        Size::AtMost(n) if len > n => Err(bad_len(len)),
        _ => Ok(bytes),
    }
}

/// Writes `bytes` to a new secret file at `path` atomically (see the
/// module's documentation); `AlreadyExists` when there is one.
pub fn write_new(what: &'static str, path: &Path, bytes: &[u8]) -> Result<(), KeyFileError> {
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| KeyFileError::Io {
            what,
            path: p,
            source,
        }
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let mut tag = [0u8; 6];
    getrandom::fill(&mut tag).map_err(|e| io(path)(io::Error::other(e.to_string())))?;
    let tag: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    let tmp = dir.join(format!(".{name}.{tag}.tmp"));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io(&tmp))?;
        // The umask can only have removed bits; make it exactly 0600.
        f.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(io(&tmp))?;
        f.write_all(bytes).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
        std::fs::hard_link(&tmp, path).map_err(io(path))?;
        // Make the new name durable.
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io(dir))
    })();
    if let Err(e) = std::fs::remove_file(&tmp) {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!(file = %tmp.display(), error = %e, "cannot remove a temporary secret file");
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn scratch() -> PathBuf {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "hearth-keyfile-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn fresh(n: usize) -> impl FnOnce() -> io::Result<Zeroizing<Vec<u8>>> {
        move || Ok(Zeroizing::new(vec![7; n]))
    }

    #[test]
    fn made_0600_alone_and_read_back() {
        let dir = scratch();
        let path = dir.join("k");
        let a = load_or_create("key file", &path, Size::Exactly(32), fresh(32)).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let b = load_or_create("key file", &path, Size::Exactly(32), || {
            panic!("made twice")
        })
        .unwrap();
        assert_eq!(*a, *b);
        // Only the file is left (no temporary).
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        assert_eq!(
            write_new("key file", &path, b"other")
                .unwrap_err()
                .io_kind(),
            Some(io::ErrorKind::AlreadyExists)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn others_readable_wrong_size_and_not_a_file_are_refused() {
        let dir = scratch();
        let path = dir.join("k");
        write_new("token file", &path, b"0123456789").unwrap();
        for mode in [0o644, 0o640, 0o604, 0o660] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = read("token file", &path, Size::AtMost(64)).unwrap_err();
            assert!(
                matches!(err, KeyFileError::Mode { mode: m, .. } if m == mode),
                "{err}"
            );
            assert!(err.to_string().contains("token file"), "{err}");
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert_eq!(
            &**read("token file", &path, Size::AtMost(10)).unwrap(),
            b"0123456789"
        );
        assert!(matches!(
            read("token file", &path, Size::AtMost(9)),
            Err(KeyFileError::Length { len: 10, .. })
        ));
        assert!(matches!(
            read("key file", &path, Size::Exactly(32)),
            Err(KeyFileError::Length { len: 10, .. })
        ));
        assert!(matches!(
            read("key file", &dir, Size::Exactly(32)),
            Err(KeyFileError::NotAFile { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
