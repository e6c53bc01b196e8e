//! Directory watchers (`Request::WatchStart`, `WatchEvents`, `WatchStop`):
//! inotify on the directory (and, recursive, on every directory under it,
//! those made later included), with what it sees kept here until the host
//! asks, so a watcher outlives the request that made it and any
//! control-plane replica can ask for its events. Bounded: a few watchers,
//! a few thousand directories each, a few thousand unasked events (older
//! ones are dropped and the next answer says so), and a watcher nobody
//! asked for ten minutes is dropped.

use std::collections::{HashMap, VecDeque};
use std::ffi::CString;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use hearth_guest_proto::{OpError, OpErrorKind, Reply, Stream, WatchEvent, WatchKind};
use tokio::io::ReadBuf;

use crate::sys;

/// Watchers at once.
const MAX_WATCHERS: usize = 64;
/// Directories one recursive watcher watches.
const MAX_DIRS: usize = 8192;
/// Unasked events one watcher keeps.
const MAX_EVENTS: usize = 10_000;
/// A watcher nobody asks for this long is dropped.
const IDLE: Duration = Duration::from_secs(600);

const MASK: u32 = libc::IN_CREATE
    | libc::IN_MODIFY
    | libc::IN_DELETE
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_ATTRIB
    | libc::IN_ONLYDIR;

struct Kept {
    events: VecDeque<WatchEvent>,
    lost: bool,
    asked: Instant,
}

struct Watcher {
    kept: Mutex<Kept>,
    task: tokio::task::JoinHandle<()>,
}

impl Watcher {
    fn kept(&self) -> MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn watchers() -> MutexGuard<'static, HashMap<String, Arc<Watcher>>> {
    static W: OnceLock<Mutex<HashMap<String, Arc<Watcher>>>> = OnceLock::new();
    W.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn error(kind: OpErrorKind, message: String) -> Reply {
    Reply::Error(OpError::new(kind, message))
}

async fn reply(stream: &Stream, r: Reply) {
    if let Err(e) = stream.send_ctl(&r).await {
        eprintln!("hearth-guest: reply lost: {e}");
    }
}

/// Drops watchers nobody asked for [`IDLE`].
fn sweep(all: &mut HashMap<String, Arc<Watcher>>) {
    all.retain(|_, w| {
        let keep = w.kept().asked.elapsed() < IDLE;
        if !keep {
            w.task.abort();
        }
        keep
    });
}

pub async fn handle_start(stream: Stream, path: String, recursive: bool, entries: bool) {
    let r = match start(&path, recursive, entries) {
        Ok(id) => Reply::Watcher { id },
        Err(r) => r,
    };
    reply(&stream, r).await;
}

fn start(path: &str, recursive: bool, entries: bool) -> Result<String, Reply> {
    let root = PathBuf::from(path);
    match std::fs::metadata(&root) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(error(
                OpErrorKind::NotADirectory,
                format!("{path} is not a directory"),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(error(
                OpErrorKind::NotFound,
                format!("{path} does not exist"),
            ))
        }
        Err(e) => return Err(error(OpErrorKind::Io, format!("{path}: {e}"))),
    }
    let mut all = watchers();
    sweep(&mut all);
    if all.len() >= MAX_WATCHERS {
        return Err(error(
            OpErrorKind::BadRequest,
            format!("at most {MAX_WATCHERS} watchers at once: stop one first"),
        ));
    }
    let io_err = |e: io::Error| error(OpErrorKind::Io, format!("watch {path}: {e}"));
    // SAFETY: inotify_init1 takes flags only.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    if fd < 0 {
        return Err(io_err(io::Error::last_os_error()));
    }
    // SAFETY: a descriptor we just made and own alone.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut dirs = Dirs {
        fd: std::os::fd::AsRawFd::as_raw_fd(&fd),
        root: root.clone(),
        by_wd: HashMap::new(),
        recursive,
        entries,
    };
    dirs.add(&root).map_err(io_err)?;
    let io = sys::FdIo::new(fd).map_err(io_err)?;
    let id = new_id();
    let watcher = Arc::new_cyclic(|me: &std::sync::Weak<Watcher>| {
        let me = me.clone();
        Watcher {
            kept: Mutex::new(Kept {
                events: VecDeque::new(),
                lost: false,
                asked: Instant::now(),
            }),
            task: tokio::spawn(read_events(io, dirs, me)),
        }
    });
    all.insert(id.clone(), watcher);
    Ok(id)
}

pub async fn handle_events(stream: Stream, id: String) {
    let found = watchers().get(&id).cloned();
    let r = match found {
        None => error(OpErrorKind::NotFound, format!("no watcher {id}")),
        Some(w) => {
            let mut k = w.kept();
            k.asked = Instant::now();
            Reply::WatchEvents {
                events: k.events.drain(..).collect(),
                lost: std::mem::take(&mut k.lost),
            }
        }
    };
    reply(&stream, r).await;
}

pub async fn handle_stop(stream: Stream, id: String) {
    let r = match watchers().remove(&id) {
        Some(w) => {
            w.task.abort();
            Reply::Ok
        }
        None => error(OpErrorKind::NotFound, format!("no watcher {id}")),
    };
    reply(&stream, r).await;
}

/// The watched directories of one watcher.
struct Dirs {
    fd: i32,
    root: PathBuf,
    /// Watch descriptor → the directory, relative to the root.
    by_wd: HashMap<i32, PathBuf>,
    recursive: bool,
    /// Events carry their entry's stat.
    entries: bool,
}

impl Dirs {
    /// Watches `dir` and, recursive, the directories under it (up to
    /// [`MAX_DIRS`]; what is past it goes unwatched).
    fn add(&mut self, dir: &Path) -> io::Result<()> {
        let mut todo = vec![dir.to_owned()];
        while let Some(d) = todo.pop() {
            if self.by_wd.len() >= MAX_DIRS {
                break;
            }
            let c = CString::new(d.as_os_str().as_encoded_bytes())
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
            // SAFETY: a valid descriptor and a NUL-terminated path.
            let wd = unsafe { libc::inotify_add_watch(self.fd, c.as_ptr(), MASK) };
            if wd < 0 {
                let e = io::Error::last_os_error();
                if d == self.root {
                    return Err(e);
                }
                continue; // gone meanwhile, or not a directory after all
            }
            let rel = d.strip_prefix(&self.root).unwrap_or(&d).to_owned();
            self.by_wd.insert(wd, rel);
            if self.recursive {
                if let Ok(entries) = std::fs::read_dir(&d) {
                    for e in entries.flatten() {
                        if e.file_type().is_ok_and(|t| t.is_dir()) {
                            todo.push(e.path());
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

fn kind_of(mask: u32) -> Option<WatchKind> {
    if mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0 {
        Some(WatchKind::Create)
    } else if mask & libc::IN_MOVED_FROM != 0 {
        Some(WatchKind::Rename)
    } else if mask & libc::IN_DELETE != 0 {
        Some(WatchKind::Remove)
    } else if mask & libc::IN_MODIFY != 0 {
        Some(WatchKind::Write)
    } else if mask & libc::IN_ATTRIB != 0 {
        Some(WatchKind::Chmod)
    } else {
        None
    }
}

/// The events a watcher keeps for one inotify event: Hearth's own
/// temporary files of a write are not shown; their rename over the file is
/// the write it is (a `Create` first when it makes the file). `renames`
/// holds the cookies of temporary files moved away, until their other half.
fn seen(rel: &Path, mask: u32, cookie: u32, renames: &mut HashMap<u32, bool>) -> Vec<WatchEvent> {
    let name = rel.to_string_lossy().into_owned();
    if let Some(new) = crate::files::written_by_rename(&name) {
        if mask & libc::IN_MOVED_FROM != 0 {
            // Bounded: halves never matched are few; forget them all at once.
            if renames.len() >= 1024 {
                renames.clear();
            }
            renames.insert(cookie, new);
        }
        return Vec::new();
    }
    let event = |kind| WatchEvent {
        name: name.clone(),
        kind,
        entry: None,
    };
    if mask & libc::IN_MOVED_TO != 0 {
        if let Some(new) = renames.remove(&cookie) {
            let mut out = Vec::new();
            if new {
                out.push(event(WatchKind::Create));
            }
            out.push(event(WatchKind::Write));
            return out;
        }
    }
    kind_of(mask).map(event).into_iter().collect()
}

/// Reads the watcher's inotify events into what it keeps, until it is
/// dropped (its task aborted) or its directory goes away.
async fn read_events(io: sys::FdIo, mut dirs: Dirs, me: std::sync::Weak<Watcher>) {
    let mut buf = vec![0u8; 64 << 10];
    let mut renames = HashMap::new();
    loop {
        let mut rb = ReadBuf::new(&mut buf);
        let read = std::future::poll_fn(|cx| io.poll_read_bytes(cx, &mut rb)).await;
        let n = match read {
            Ok(()) => rb.filled().len(),
            Err(e) => {
                eprintln!("hearth-guest: a watcher stopped reading: {e}");
                return;
            }
        };
        if n == 0 {
            return;
        }
        let Some(w) = me.upgrade() else { return };
        let mut off = 0;
        while off + 16 <= n {
            let int = |at: usize| u32::from_ne_bytes(buf[at..at + 4].try_into().unwrap_or([0; 4]));
            let (wd, mask, cookie, len) = (
                int(off) as i32,
                int(off + 4),
                int(off + 8),
                int(off + 12) as usize,
            );
            let name_bytes = &buf[off + 16..(off + 16 + len).min(n)];
            off += 16 + len;
            let name_end = name_bytes
                .iter()
                .position(|&b| b == 0)
                .unwrap_or(name_bytes.len());
            let name = String::from_utf8_lossy(&name_bytes[..name_end]).into_owned();
            if mask & libc::IN_Q_OVERFLOW != 0 {
                w.kept().lost = true;
                continue;
            }
            let Some(dir) = dirs.by_wd.get(&wd).cloned() else {
                continue;
            };
            if mask & libc::IN_IGNORED != 0 {
                dirs.by_wd.remove(&wd);
                continue;
            }
            let rel = dir.join(&name);
            if dirs.recursive
                && mask & libc::IN_ISDIR != 0
                && mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0
            {
                let full = dirs.root.join(&rel);
                if let Err(e) = dirs.add(&full) {
                    eprintln!("hearth-guest: cannot watch {}: {e}", full.display());
                }
            }
            let mut events = seen(&rel, mask, cookie, &mut renames);
            if dirs.entries {
                let path = dirs.root.join(&rel);
                for e in &mut events {
                    if !matches!(e.kind, WatchKind::Remove | WatchKind::Rename) {
                        e.entry = crate::files::stat_path(&path).map(Box::new);
                    }
                }
            }
            let mut k = w.kept();
            for e in events {
                if k.events.len() >= MAX_EVENTS {
                    k.events.pop_front();
                    k.lost = true;
                }
                k.events.push_back(e);
            }
        }
    }
}

fn new_id() -> String {
    let mut bytes = [0u8; 12];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        if let Err(e) = f.read_exact(&mut bytes) {
            eprintln!("hearth-guest: urandom: {e}");
        }
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_map_to_kinds() {
        assert_eq!(
            kind_of(libc::IN_CREATE | libc::IN_ISDIR),
            Some(WatchKind::Create)
        );
        assert_eq!(kind_of(libc::IN_MOVED_TO), Some(WatchKind::Create));
        assert_eq!(kind_of(libc::IN_MOVED_FROM), Some(WatchKind::Rename));
        assert_eq!(kind_of(libc::IN_DELETE), Some(WatchKind::Remove));
        assert_eq!(kind_of(libc::IN_MODIFY), Some(WatchKind::Write));
        assert_eq!(kind_of(libc::IN_ATTRIB), Some(WatchKind::Chmod));
        assert_eq!(kind_of(libc::IN_IGNORED), None);
    }

    #[tokio::test]
    async fn a_recursive_watcher_sees_changes_in_new_directories() {
        let dir = std::env::temp_dir().join(format!("hearth-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let id = start(dir.to_str().unwrap(), true, false).ok().unwrap();
        let w = watchers().get(&id).cloned().unwrap();
        std::fs::create_dir(dir.join("sub")).unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        std::fs::write(dir.join("sub/f"), b"x").unwrap();
        std::fs::rename(dir.join("sub/f"), dir.join("sub/g")).unwrap();
        std::fs::remove_file(dir.join("sub/g")).unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let seen: Vec<(String, WatchKind)> = w
            .kept()
            .events
            .drain(..)
            .map(|e| (e.name, e.kind))
            .collect();
        let want = [
            ("sub", WatchKind::Create),
            ("sub/f", WatchKind::Create),
            ("sub/f", WatchKind::Write),
            ("sub/f", WatchKind::Rename),
            ("sub/g", WatchKind::Create),
            ("sub/g", WatchKind::Remove),
        ];
        for (name, kind) in want {
            assert!(
                seen.iter().any(|(n, k)| n == name && *k == kind),
                "{name} {kind:?} in {seen:?}"
            );
        }
        watchers().remove(&id).unwrap().task.abort();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A write through the file API (a temporary file renamed over the
    /// name) is seen as the write it is: Create and Write of a new file,
    /// Write of one replaced; the temporary name never shows.
    #[tokio::test]
    async fn a_write_by_rename_is_seen_as_a_write_of_the_file() {
        let dir = std::env::temp_dir().join(format!("hearth-watch-tmp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let id = start(dir.to_str().unwrap(), false, true).ok().unwrap();
        let w = watchers().get(&id).cloned().unwrap();
        for (new, n) in [(true, 1), (false, 2)] {
            let tmp = dir.join(crate::files::temp_name("f.txt", new, n));
            std::fs::write(&tmp, b"x").unwrap();
            std::fs::rename(&tmp, dir.join("f.txt")).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let events: Vec<WatchEvent> = w.kept().events.drain(..).collect();
        // Each with its entry (a watcher started with entries).
        assert!(
            events
                .iter()
                .all(|e| e.entry.as_ref().is_some_and(|s| s.size == 1)),
            "{events:?}"
        );
        let seen: Vec<(String, WatchKind)> = events.into_iter().map(|e| (e.name, e.kind)).collect();
        let f = |k| ("f.txt".to_owned(), k);
        assert_eq!(
            seen,
            [
                f(WatchKind::Create),
                f(WatchKind::Write),
                f(WatchKind::Write)
            ]
        );
        watchers().remove(&id).unwrap().task.abort();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
