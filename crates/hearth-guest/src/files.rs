//! File operations: streamed reads and writes, stat, list, mkdir, remove.
//! Relative paths resolve from the default user's home, as in LangSmith.
//!
//! Reads and writes touch regular files only: a FIFO, device or socket is
//! refused (`NotAFile`) without being opened for writing or replaced, and
//! a read never blocks in `open` (a FIFO without a writer). A transfer
//! the host abandons ends its blocking reader thread at once (its channel
//! closes), so aborted downloads leave no thread behind.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use bytes::{Bytes, BytesMut};
use hearth_guest_proto::{
    FileKind, FileStat, Incoming, OpError, OpErrorKind, Reply, Stream, MAX_PAYLOAD,
};
use tokio::io::AsyncWriteExt;

use tokio::sync::mpsc;

use crate::users::{self, Actor, Names};

pub(crate) fn resolve(path: &str) -> Result<PathBuf, OpError> {
    resolve_in(users::default_home(), path)
}

/// `path`, relative ones against `home`.
fn resolve_in(home: &str, path: &str) -> Result<PathBuf, OpError> {
    if path.is_empty() {
        return Err(OpError::new(OpErrorKind::InvalidPath, "the path is empty"));
    }
    if path.contains('\0') {
        return Err(OpError::new(
            OpErrorKind::InvalidPath,
            format!("invalid path {path:?}"),
        ));
    }
    let p = Path::new(path);
    Ok(if p.is_absolute() {
        p.to_path_buf()
    } else {
        Path::new(home).join(p)
    })
}

/// Who a request acts as, and its path resolved for them.
fn actor_and_path(user: Option<&str>, path: &str) -> Result<(Actor, PathBuf), OpError> {
    let actor = Actor::named(user).map_err(|e| OpError::new(OpErrorKind::BadRequest, e))?;
    let p = resolve_in(actor.home(), path)?;
    Ok((actor, p))
}

/// Runs a blocking file operation as `actor`.
async fn acting<R, F>(actor: &Actor, f: F) -> Result<R, OpError>
where
    R: Send + 'static,
    F: FnOnce() -> Result<R, OpError> + Send + 'static,
{
    actor
        .run(f)
        .await
        .map_err(|e| OpError::new(OpErrorKind::Io, format!("cannot act as the user: {e}")))?
}

async fn reply(stream: &Stream, r: Reply) {
    let _ = stream.send_ctl(&r).await;
}

async fn reply_result(stream: &Stream, r: Result<Reply, OpError>) {
    reply(stream, r.unwrap_or_else(Reply::Error)).await
}

fn stat_of(path: &Path, meta: &std::fs::Metadata, names: &Names) -> FileStat {
    let ft = meta.file_type();
    FileStat {
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "/".into()),
        path: path.to_string_lossy().into_owned(),
        kind: if ft.is_symlink() {
            FileKind::Symlink
        } else if ft.is_dir() {
            FileKind::Dir
        } else if ft.is_file() {
            FileKind::File
        } else {
            FileKind::Other
        },
        size: meta.len(),
        mode: meta.permissions().mode() & 0o7777,
        mtime: meta.mtime(),
        mtime_ns: mtime_ns(meta),
        ino: meta.ino(),
        owner: names.user(meta.uid()),
        group: names.group(meta.gid()),
        metadata: if ft.is_symlink() {
            BTreeMap::new()
        } else {
            metadata_of(path)
        },
        uid: meta.uid(),
        gid: meta.gid(),
        atime: meta.atime(),
        ctime: meta.ctime(),
        target: if ft.is_symlink() {
            std::fs::read_link(path)
                .ok()
                .map(|t| t.to_string_lossy().into_owned())
        } else {
            None
        },
    }
}

/// The stat of `path` (not following a link), as a file request answers
/// it; `None` when it cannot be read.
pub(crate) fn stat_path(path: &Path) -> Option<FileStat> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    Some(stat_of(path, &meta, &Names::load()))
}

/// Where a file's metadata lives: its extended attributes in this
/// namespace, one per key.
const METADATA_XATTR: &str = "user.e2b.";

/// A file's metadata: its `user.e2b.*` (as envd keeps them) extended attributes that read as
/// printable text (others, and a filesystem without them, give none).
fn metadata_of(path: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(names) = crate::sys::xattr_names(path) else {
        return out;
    };
    for name in names {
        let Some(key) = name.strip_prefix(METADATA_XATTR) else {
            continue;
        };
        if let Ok(Some(v)) = crate::sys::xattr_get(path, &name) {
            if let Ok(v) = String::from_utf8(v) {
                out.insert(key.to_owned(), v);
            }
        }
    }
    out
}

/// Gives the open file `f` the metadata `m` (already checked).
fn set_metadata(
    f: &std::fs::File,
    m: &BTreeMap<String, String>,
    path: &str,
) -> Result<(), OpError> {
    for (k, v) in m {
        crate::sys::xattr_set(f, &format!("{METADATA_XATTR}{k}"), v.as_bytes()).map_err(|e| {
            if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                OpError::new(
                    OpErrorKind::Unsupported,
                    format!("metadata: the filesystem of {path} keeps no extended attributes"),
                )
            } else {
                OpError::from_io(&e, path)
            }
        })?;
    }
    Ok(())
}

/// Modification time in nanoseconds since the epoch.
pub(crate) fn mtime_ns(meta: &std::fs::Metadata) -> i64 {
    meta.mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(meta.mtime_nsec())
}

/// What a path that is not a regular file is, for error messages.
fn kind_name(ft: std::fs::FileType) -> &'static str {
    if ft.is_fifo() {
        "FIFO"
    } else if ft.is_char_device() {
        "character device"
    } else if ft.is_block_device() {
        "block device"
    } else if ft.is_socket() {
        "socket"
    } else if ft.is_symlink() {
        "symbolic link"
    } else {
        "special file"
    }
}

/// `Ok` for a regular file; `IsADirectory` or `NotAFile` otherwise.
fn regular(path: &str, meta: &std::fs::Metadata) -> Result<(), OpError> {
    let ft = meta.file_type();
    if ft.is_file() {
        Ok(())
    } else if ft.is_dir() {
        Err(OpError::new(
            OpErrorKind::IsADirectory,
            format!("{path} is a directory"),
        ))
    } else {
        Err(OpError::new(
            OpErrorKind::NotAFile,
            format!("{path} is a {}, not a regular file", kind_name(ft)),
        ))
    }
}

/// Opens a regular file for reading at `offset`: refused before opening
/// when the path is something else (opening a device can have effects, and
/// opening a FIFO blocks), opened with `O_NONBLOCK | O_NOCTTY` so that even
/// a path swapped meanwhile cannot block or become our terminal, checked
/// again on the open descriptor, then made blocking. Runs on a blocking
/// thread for a moment only.
fn open_regular(
    p: &Path,
    path: &str,
    offset: u64,
    length: Option<u64>,
) -> Result<(std::fs::File, Reply, u64), OpError> {
    use std::io::Seek;
    let io = |e: std::io::Error| OpError::from_io(&e, &p.to_string_lossy());
    regular(path, &std::fs::metadata(p).map_err(io)?)?;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(p)
        .map_err(io)?;
    // Describe the open file: the size and version sent are those of the
    // bytes that follow, even if the path is replaced.
    let meta = f.metadata().map_err(io)?;
    regular(path, &meta)?;
    crate::sys::clear_nonblocking(&f).map_err(io)?;
    let size = meta.len();
    let start = offset.min(size);
    let len = length.map_or(size - start, |l| l.min(size - start));
    f.seek(std::io::SeekFrom::Start(start)).map_err(io)?;
    let info = Reply::FileInfo {
        size,
        length: len,
        mtime_ns: mtime_ns(&meta),
        ino: meta.ino(),
    };
    Ok((f, info, len))
}

pub async fn read_file(
    stream: Stream,
    path: String,
    offset: u64,
    length: Option<u64>,
    user: Option<String>,
) {
    let result = match actor_and_path(user.as_deref(), &path) {
        Ok((actor, p)) => {
            let path = path.clone();
            acting(&actor, move || open_regular(&p, &path, offset, length)).await
        }
        Err(e) => Err(e),
    };
    let (f, info, len) = match result {
        Ok(v) => v,
        Err(e) => return reply(&stream, Reply::Error(e)).await,
    };
    if stream.send_ctl(&info).await.is_err() {
        return;
    }
    let mut chunks = spawn_reader(f, len);
    while let Some(chunk) = chunks.recv().await {
        match chunk {
            Ok(bytes) => {
                // Fails at once when the host closes the stream (its credit
                // is closed); dropping `chunks` then ends the reader thread.
                if stream.send_data(bytes).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                stream.sender.close(Some(&OpError::from_io(&e, &path)));
                return;
            }
        }
    }
    // Eof then (on drop) Close leave through the same ordered queue.
    let _ = stream.send_eof();
}

/// Reads `len` bytes from the file's position on one blocking thread, a
/// few chunks ahead of the sender, each straight into the buffer that is
/// sent (one copy out of the page cache, none in user space). Ends early
/// at end of file (the file shrank meanwhile) or when the receiver is gone:
/// a regular file's `read` does not block indefinitely, and a full channel
/// wakes `blocking_send` with an error once the receiver is dropped.
fn spawn_reader(f: std::fs::File, len: u64) -> mpsc::Receiver<std::io::Result<Bytes>> {
    let (tx, rx) = mpsc::channel(4);
    tokio::task::spawn_blocking(move || {
        let mut left = len;
        while left > 0 {
            let mut buf = BytesMut::new();
            let want = left.min(MAX_PAYLOAD as u64) as usize;
            match crate::sys::read_into(&f, &mut buf, want) {
                Ok(0) => return,
                Ok(n) => {
                    left -= n as u64;
                    if tx.blocking_send(Ok(buf.freeze())).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    return;
                }
            }
        }
    });
    rx
}

/// A write may replace only a regular file (or create a new one): an
/// existing directory, device, FIFO or socket at the path, or behind a
/// symbolic link there, is refused and left untouched.
fn check_write_target(p: &Path, path: &str) -> Result<(), OpError> {
    let io = |e: std::io::Error| OpError::from_io(&e, path);
    match std::fs::symlink_metadata(p) {
        Ok(meta) if meta.file_type().is_symlink() => match std::fs::metadata(p) {
            Ok(target) => regular(path, &target),
            // A dangling link is replaced like a missing file.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(e)),
        },
        Ok(meta) => regular(path, &meta),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(e)),
    }
}

/// The temporary name a write of `name` goes to before it is renamed over
/// it: `.{name}.hearth-{n}`, or `.{name}.hearth+{n}` when the write
/// creates the file. Watchers hide these names and tell the rename as
/// the write of `name` it is (see [`written_by_rename`]).
pub(crate) fn temp_name(name: &str, new: bool, n: u64) -> String {
    format!(".{name}.hearth{}{n}", if new { '+' } else { '-' })
}

/// For a temporary name of [`temp_name`]'s: whether its write creates the
/// file (`Some(true)`) or replaces it (`Some(false)`); `None` for any other
/// name.
pub(crate) fn written_by_rename(name: &str) -> Option<bool> {
    let base = name.rsplit('/').next().unwrap_or(name);
    let (head, n) = base.rsplit_once(".hearth")?;
    let new = match n.as_bytes().first()? {
        b'+' => true,
        b'-' => false,
        _ => return None,
    };
    let digits = &n[1..];
    (head.starts_with('.')
        && head.len() > 1
        && !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit()))
    .then_some(new)
}

/// Creates the temporary file a write goes to, exclusively (never opening
/// whatever a stale name holds: a leftover is removed first).
fn create_temp(tmp: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true).mode(0o600);
    match options.open(tmp) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(tmp)?;
            options.open(tmp)
        }
        r => r,
    }
}

/// Writes a file from the `Data` the host sends until `Eof`, to a
/// temporary name in its directory, renamed over the path at the end
/// (readers see the old file or the new one). The directories it makes,
/// the temporary file and the rename are the actor's: their permissions
/// apply and what is made is theirs.
pub async fn write_file(
    mut stream: Stream,
    path: String,
    mode: Option<u32>,
    user: Option<String>,
    metadata: BTreeMap<String, String>,
) {
    let checked = hearth_guest_proto::check_metadata(&metadata)
        .map_err(|e| OpError::new(OpErrorKind::BadRequest, e))
        .and_then(|()| actor_and_path(user.as_deref(), &path));
    let (actor, p) = match checked {
        Ok(v) => v,
        Err(e) => return reply(&stream, Reply::Error(e)).await,
    };
    let io = |e: std::io::Error| OpError::from_io(&e, &path);
    let dir = p.parent().unwrap_or(Path::new("/")).to_path_buf();
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let n = std::process::id() as u64 ^ stream.id() as u64;
    let opened = {
        let (p, path, dir) = (p.clone(), path.clone(), dir.clone());
        acting(&actor, move || {
            let io = |e: std::io::Error| OpError::from_io(&e, &path);
            check_write_target(&p, &path)?;
            let new = std::fs::symlink_metadata(&p).is_err();
            std::fs::create_dir_all(&dir).map_err(io)?;
            let tmp = dir.join(temp_name(&name, new, n));
            create_temp(&tmp).map_err(io).map(|f| (f, tmp))
        })
        .await
    };
    let (mut f, tmp) = match opened {
        Ok((f, tmp)) => (tokio::fs::File::from_std(f), tmp),
        Err(e) => return reply(&stream, Reply::Error(e)).await,
    };
    let mut written = 0u64;
    let outcome: Result<(), Option<OpError>> = loop {
        match stream.recv().await {
            Some(Incoming::Data(d)) => {
                if let Err(e) = f.write_all(&d).await {
                    break Err(Some(io(e)));
                }
                written += d.len() as u64;
            }
            Some(Incoming::Eof) => break Ok(()),
            Some(Incoming::Ctl(_)) => {}
            Some(Incoming::Close(_)) | None => break Err(None),
        }
    };
    let finish = async {
        outcome?;
        f.flush().await.map_err(|e| Some(io(e)))?;
        let perm = std::fs::Permissions::from_mode(mode.unwrap_or(0o644) & 0o7777);
        f.set_permissions(perm).await.map_err(|e| Some(io(e)))?;
        let f = f.into_std().await;
        let (p, path, tmp) = (p.clone(), path.clone(), tmp.clone());
        acting(&actor, move || {
            set_metadata(&f, &metadata, &path)?;
            // Again, just before replacing: the path may have changed meanwhile.
            check_write_target(&p, &path)?;
            std::fs::rename(&tmp, &p).map_err(|e| OpError::from_io(&e, &path))
        })
        .await
        .map_err(Some)
    }
    .await;
    match finish {
        Ok(()) => reply(&stream, Reply::Written { bytes: written }).await,
        Err(e) => {
            let _ = tokio::fs::remove_file(&tmp).await;
            if let Some(e) = e {
                reply(&stream, Reply::Error(e)).await;
            }
        }
    }
}

pub async fn stat(stream: Stream, path: String, user: Option<String>) {
    let r = async {
        let (actor, p) = actor_and_path(user.as_deref(), &path)?;
        acting(&actor, move || {
            let meta = std::fs::symlink_metadata(&p).map_err(|e| OpError::from_io(&e, &path))?;
            Ok(Reply::Stat(Box::new(stat_of(&p, &meta, &Names::load()))))
        })
        .await
    }
    .await;
    reply_result(&stream, r).await
}

/// Changes the owner, group or permission bits of `path`, as root (the
/// owner of a symbolic link itself; its mode cannot change), and answers
/// its stat.
pub async fn set_attrs(
    stream: Stream,
    path: String,
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
) {
    let r = async {
        if mode.is_some_and(|m| m > 0o7777) {
            return Err(OpError::new(
                OpErrorKind::BadRequest,
                format!(
                    "mode {:o}: permission bits are at most 7777",
                    mode.unwrap_or(0)
                ),
            ));
        }
        let (actor, p) = actor_and_path(None, &path)?;
        acting(&actor, move || {
            let io = |e: std::io::Error| OpError::from_io(&e, &path);
            if uid.is_some() || gid.is_some() {
                std::os::unix::fs::lchown(&p, uid, gid).map_err(io)?;
            }
            let meta = std::fs::symlink_metadata(&p).map_err(io)?;
            if let Some(m) = mode {
                if meta.file_type().is_symlink() {
                    return Err(OpError::new(
                        OpErrorKind::BadRequest,
                        format!("{path} is a symbolic link: its mode cannot change"),
                    ));
                }
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(m)).map_err(io)?;
            }
            let meta = std::fs::symlink_metadata(&p).map_err(io)?;
            Ok(Reply::Stat(Box::new(stat_of(&p, &meta, &Names::load()))))
        })
        .await
    }
    .await;
    reply_result(&stream, r).await
}

pub async fn list(stream: Stream, path: String, user: Option<String>) {
    let r = async {
        let (actor, p) = actor_and_path(user.as_deref(), &path)?;
        acting(&actor, move || {
            let io = |e: std::io::Error| OpError::from_io(&e, &path);
            let names = Names::load();
            let mut entries = Vec::new();
            for e in std::fs::read_dir(&p).map_err(io)? {
                let e = e.map_err(io)?;
                if let Ok(meta) = std::fs::symlink_metadata(e.path()) {
                    entries.push(stat_of(&e.path(), &meta, &names));
                }
                // A reply must fit in one frame.
                if entries.len() >= 200 {
                    break;
                }
            }
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(Reply::List { entries })
        })
        .await
    }
    .await;
    reply_result(&stream, r).await
}

pub async fn mkdir(stream: Stream, path: String, parents: bool, user: Option<String>) {
    let r = async {
        let (actor, p) = actor_and_path(user.as_deref(), &path)?;
        acting(&actor, move || {
            let res = if parents {
                std::fs::create_dir_all(&p)
            } else {
                std::fs::create_dir(&p)
            };
            res.map_err(|e| OpError::from_io(&e, &path))?;
            Ok(Reply::Ok)
        })
        .await
    }
    .await;
    reply_result(&stream, r).await
}

pub async fn remove(stream: Stream, path: String, recursive: bool, user: Option<String>) {
    let r = async {
        let (actor, p) = actor_and_path(user.as_deref(), &path)?;
        if p == Path::new("/") {
            return Err(OpError::new(
                OpErrorKind::InvalidPath,
                "refusing to remove /",
            ));
        }
        acting(&actor, move || {
            let io = |e: std::io::Error| OpError::from_io(&e, &path);
            let meta = std::fs::symlink_metadata(&p).map_err(io)?;
            if meta.is_dir() {
                if recursive {
                    std::fs::remove_dir_all(&p).map_err(io)?;
                } else {
                    std::fs::remove_dir(&p).map_err(io)?;
                }
            } else {
                std::fs::remove_file(&p).map_err(io)?;
            }
            Ok(Reply::Ok)
        })
        .await
    }
    .await;
    reply_result(&stream, r).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// A fresh directory under the system's temp dir, with a FIFO, a file,
    /// and symbolic links to a device and to the file.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("hearth-files-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        std::fs::write(dir.join("file"), b"hello").unwrap();
        std::os::unix::fs::symlink("/dev/null", dir.join("to-null")).unwrap();
        std::os::unix::fs::symlink(dir.join("file"), dir.join("to-file")).unwrap();
        std::os::unix::fs::symlink(dir.join("missing"), dir.join("dangling")).unwrap();
        dir
    }

    fn kind_of<T>(r: Result<T, OpError>) -> Option<OpErrorKind> {
        r.err().map(|e| e.kind)
    }

    #[test]
    fn finding10_reads_open_only_regular_files_and_never_block() {
        let dir = scratch("read");
        let open = |p: &Path| open_regular(p, &p.to_string_lossy(), 0, None);
        let t = Instant::now();
        assert_eq!(
            kind_of(open(&dir.join("fifo"))),
            Some(OpErrorKind::NotAFile)
        );
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "a FIFO blocked the read"
        );
        let e = open(Path::new("/dev/null")).err().unwrap();
        assert_eq!(e.kind, OpErrorKind::NotAFile);
        assert!(e.message.contains("character device"), "{}", e.message);
        assert_eq!(
            kind_of(open(&dir.join("to-null"))),
            Some(OpErrorKind::NotAFile)
        );
        assert_eq!(kind_of(open(&dir)), Some(OpErrorKind::IsADirectory));
        assert_eq!(
            kind_of(open(&dir.join("missing"))),
            Some(OpErrorKind::NotFound)
        );
        for name in ["file", "to-file"] {
            let (f, info, len) = open(&dir.join(name)).unwrap();
            assert_eq!(len, 5);
            assert!(matches!(info, Reply::FileInfo { size: 5, .. }));
            // Blocking again once checked.
            let flags = std::fs::read_to_string(format!(
                "/proc/self/fdinfo/{}",
                std::os::fd::AsRawFd::as_raw_fd(&f)
            ))
            .unwrap();
            let octal = flags
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .map(|v| u32::from_str_radix(v.trim(), 8).unwrap())
                .unwrap();
            assert_eq!(octal & libc::O_NONBLOCK as u32, 0);
        }
        assert_eq!(
            resolve("").err().map(|e| e.kind),
            Some(OpErrorKind::InvalidPath)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn finding10_writes_replace_only_regular_files() {
        let dir = scratch("write");
        let check = |name: &str| {
            let p = if name.starts_with('/') {
                PathBuf::from(name)
            } else {
                dir.join(name)
            };
            check_write_target(&p, &p.to_string_lossy())
        };
        assert_eq!(kind_of(check("/dev/null")), Some(OpErrorKind::NotAFile));
        assert_eq!(kind_of(check("fifo")), Some(OpErrorKind::NotAFile));
        assert_eq!(kind_of(check("to-null")), Some(OpErrorKind::NotAFile));
        assert_eq!(kind_of(check("/")), Some(OpErrorKind::IsADirectory));
        assert_eq!(
            kind_of(check(&dir.to_string_lossy())),
            Some(OpErrorKind::IsADirectory)
        );
        for ok in ["file", "to-file", "dangling", "new"] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
        // A stale temporary file (even a FIFO) does not block a write.
        let tmp = dir.join("stale");
        std::process::Command::new("mkfifo")
            .arg(&tmp)
            .status()
            .unwrap();
        // (Opened with O_CREAT|O_EXCL after the removal: never blocks.)
        let f = create_temp(&tmp).unwrap();
        assert!(f.metadata().unwrap().is_file());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn metadata_is_kept_as_user_attributes_and_read_back() {
        let dir = scratch("meta");
        let path = dir.join("f");
        let f = std::fs::File::create(&path).unwrap();
        let m = BTreeMap::from([
            ("team".to_owned(), "data".to_owned()),
            ("run-id".to_owned(), "42".to_owned()),
        ]);
        match set_metadata(&f, &m, "f") {
            // A filesystem without user attributes here (an older tmpfs).
            Err(e) if e.kind == OpErrorKind::Unsupported => return,
            r => r.unwrap(),
        }
        assert_eq!(metadata_of(&path), m);
        let names = crate::users::Names::load();
        let st = stat_of(&path, &std::fs::symlink_metadata(&path).unwrap(), &names);
        assert_eq!(st.metadata, m);
        // A rename keeps them (they are the inode's).
        std::fs::rename(&path, dir.join("g")).unwrap();
        assert_eq!(metadata_of(&dir.join("g")), m);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn temporary_names_say_whether_the_write_creates_the_file() {
        assert_eq!(written_by_rename(&temp_name("a.txt", true, 26)), Some(true));
        assert_eq!(
            written_by_rename(&format!("sub/{}", temp_name("b", false, 7))),
            Some(false)
        );
        for other in [
            "a.txt",
            ".a.hearth-",
            ".hearth-1",
            ".a.hearth-x1",
            "a.hearth+1",
            ".a.hearth*1",
        ] {
            assert_eq!(written_by_rename(other), None, "{other}");
        }
    }
}
