//! File operations: streamed reads and writes, stat, list, mkdir, remove.
//! Relative paths resolve from the default user's home, as in LangSmith.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use bytes::{Bytes, BytesMut};
use hearth_guest_proto::{
    FileKind, FileStat, Incoming, OpError, OpErrorKind, Reply, Stream, MAX_PAYLOAD,
};
use tokio::io::{AsyncSeekExt, AsyncWriteExt};

use tokio::sync::mpsc;

use crate::{sys, users};

pub(crate) fn resolve(path: &str) -> Result<PathBuf, OpError> {
    if path.is_empty() || path.contains('\0') {
        return Err(OpError::new(
            OpErrorKind::InvalidPath,
            format!("invalid path {path:?}"),
        ));
    }
    let p = Path::new(path);
    Ok(if p.is_absolute() {
        p.to_path_buf()
    } else {
        Path::new(users::default_home()).join(p)
    })
}

async fn reply(stream: &Stream, r: Reply) {
    let _ = stream.send_ctl(&r).await;
}

async fn reply_result(stream: &Stream, r: Result<Reply, OpError>) {
    reply(stream, r.unwrap_or_else(Reply::Error)).await
}

fn stat_of(path: &Path, meta: &std::fs::Metadata) -> FileStat {
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
    }
}

/// Modification time in nanoseconds since the epoch.
pub(crate) fn mtime_ns(meta: &std::fs::Metadata) -> i64 {
    meta.mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(meta.mtime_nsec())
}

pub async fn read_file(stream: Stream, path: String, offset: u64, length: Option<u64>) {
    let result = async {
        let p = resolve(&path)?;
        let io = |e: std::io::Error| OpError::from_io(&e, &p.to_string_lossy());
        // Open, then describe the open file: the size and version sent
        // are those of the bytes that follow, even if the path is replaced.
        let mut f = tokio::fs::File::open(&p).await.map_err(io)?;
        let meta = f.metadata().await.map_err(io)?;
        if meta.is_dir() {
            return Err(OpError::new(
                OpErrorKind::IsADirectory,
                format!("{path} is a directory"),
            ));
        }
        let size = meta.len();
        let start = offset.min(size);
        let len = length.map_or(size - start, |l| l.min(size - start));
        f.seek(std::io::SeekFrom::Start(start)).await.map_err(io)?;
        let info = Reply::FileInfo {
            size,
            length: len,
            mtime_ns: mtime_ns(&meta),
            ino: meta.ino(),
        };
        Ok((f, info, len))
    }
    .await;
    let (f, info, len) = match result {
        Ok(v) => v,
        Err(e) => return reply(&stream, Reply::Error(e)).await,
    };
    if stream.send_ctl(&info).await.is_err() {
        return;
    }
    let mut chunks = spawn_reader(f.into_std().await, len);
    while let Some(chunk) = chunks.recv().await {
        match chunk {
            Ok(bytes) => {
                if stream.send_data(bytes).await.is_err() {
                    return; // dropping `chunks` ends the reader
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
/// at end of file (the file shrank meanwhile) or when the receiver is gone.
fn spawn_reader(f: std::fs::File, len: u64) -> mpsc::Receiver<std::io::Result<Bytes>> {
    let (tx, rx) = mpsc::channel(4);
    tokio::task::spawn_blocking(move || {
        let mut left = len;
        while left > 0 {
            let mut buf = BytesMut::new();
            let want = left.min(MAX_PAYLOAD as u64) as usize;
            match sys::read_into(&f, &mut buf, want) {
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

pub async fn write_file(mut stream: Stream, path: String, mode: Option<u32>) {
    let p = match resolve(&path) {
        Ok(p) => p,
        Err(e) => return reply(&stream, Reply::Error(e)).await,
    };
    let io = |e: std::io::Error| OpError::from_io(&e, &path);
    if p.is_dir() {
        return reply(
            &stream,
            Reply::Error(OpError::new(
                OpErrorKind::IsADirectory,
                format!("{path} is a directory"),
            )),
        )
        .await;
    }
    let dir = p.parent().unwrap_or(Path::new("/")).to_path_buf();
    if let Err(e) = tokio::fs::create_dir_all(&dir).await {
        return reply(&stream, Reply::Error(io(e))).await;
    }
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(
        ".{name}.hearth-{}",
        std::process::id() as u64 ^ stream.id() as u64
    ));
    let mut f = match tokio::fs::File::create(&tmp).await {
        Ok(f) => f,
        Err(e) => return reply(&stream, Reply::Error(io(e))).await,
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
        tokio::fs::set_permissions(&tmp, perm)
            .await
            .map_err(|e| Some(io(e)))?;
        tokio::fs::rename(&tmp, &p).await.map_err(|e| Some(io(e)))?;
        Ok::<(), Option<OpError>>(())
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

pub async fn stat(stream: Stream, path: String) {
    let r = async {
        let p = resolve(&path)?;
        let meta = tokio::fs::symlink_metadata(&p)
            .await
            .map_err(|e| OpError::from_io(&e, &path))?;
        Ok(Reply::Stat(stat_of(&p, &meta)))
    }
    .await;
    reply_result(&stream, r).await
}

pub async fn list(stream: Stream, path: String) {
    let r = async {
        let p = resolve(&path)?;
        let io = |e: std::io::Error| OpError::from_io(&e, &path);
        let mut rd = tokio::fs::read_dir(&p).await.map_err(io)?;
        let mut entries = Vec::new();
        while let Some(e) = rd.next_entry().await.map_err(io)? {
            if let Ok(meta) = tokio::fs::symlink_metadata(e.path()).await {
                entries.push(stat_of(&e.path(), &meta));
            }
            // A reply must fit in one frame.
            if entries.len() >= 200 {
                break;
            }
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Reply::List { entries })
    }
    .await;
    reply_result(&stream, r).await
}

pub async fn mkdir(stream: Stream, path: String, parents: bool) {
    let r = async {
        let p = resolve(&path)?;
        let res = if parents {
            tokio::fs::create_dir_all(&p).await
        } else {
            tokio::fs::create_dir(&p).await
        };
        res.map_err(|e| OpError::from_io(&e, &path))?;
        Ok(Reply::Ok)
    }
    .await;
    reply_result(&stream, r).await
}

pub async fn remove(stream: Stream, path: String, recursive: bool) {
    let r = async {
        let p = resolve(&path)?;
        if p == Path::new("/") {
            return Err(OpError::new(
                OpErrorKind::InvalidPath,
                "refusing to remove /",
            ));
        }
        let io = |e: std::io::Error| OpError::from_io(&e, &path);
        let meta = tokio::fs::symlink_metadata(&p).await.map_err(io)?;
        if meta.is_dir() {
            if recursive {
                tokio::fs::remove_dir_all(&p).await.map_err(io)?;
            } else {
                tokio::fs::remove_dir(&p).await.map_err(io)?;
            }
        } else {
            tokio::fs::remove_file(&p).await.map_err(io)?;
        }
        Ok(Reply::Ok)
    }
    .await;
    reply_result(&stream, r).await
}
