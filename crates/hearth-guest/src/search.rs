//! Filesystem search for `Glob` and `Grep`: one walk inside the guest
//! instead of a round trip per directory.
//!
//! Walks are depth-first in name order, never follow symlinks, stay out of
//! `/proc` and `/sys` unless the search starts there, and are bounded three
//! ways: the caller's match limit, a deadline and a budget of visited
//! entries. Hitting any bound answers what was found with `truncated`.
//! The walk runs on a blocking thread; the results go out in batches that
//! each fit one frame.

use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use glob::{MatchOptions, Pattern};
use hearth_guest_proto::{
    GlobMatch, GrepMatch, OpError, OpErrorKind, Reply, Stream, GREP_MAX_LINE, SEARCH_MAX_LIMIT,
};

use crate::files::resolve;

/// How long one search may walk.
const DEADLINE: Duration = Duration::from_secs(20);
/// Entries one search may visit.
const VISIT_BUDGET: u64 = 1_000_000;
/// Bytes of one line that are searched; the rest of a longer line is skipped.
const MAX_LINE_SCAN: u64 = 1 << 20;
/// Serialized size of one reply batch (a frame holds 64 KiB).
const BATCH_BYTES: usize = 48 * 1024;

const OPTIONS: MatchOptions = MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: false,
};

fn bad_request(message: String) -> OpError {
    OpError::new(OpErrorKind::BadRequest, message)
}

fn compile(pattern: &str) -> Result<Pattern, OpError> {
    if pattern.is_empty() {
        return Err(bad_request("glob pattern is empty".into()));
    }
    Pattern::new(pattern).map_err(|e| bad_request(format!("invalid glob pattern {pattern:?}: {e}")))
}

/// How deep a pattern can reach: its segment count, or unbounded with `**`.
fn max_depth(pattern: &str) -> usize {
    if pattern.contains("**") {
        usize::MAX
    } else {
        pattern.split('/').filter(|s| !s.is_empty()).count()
    }
}

/// The bounds shared by every search.
struct Budget {
    deadline: Instant,
    visits: u64,
}

impl Budget {
    fn new() -> Self {
        Self {
            deadline: Instant::now() + DEADLINE,
            visits: 0,
        }
    }
    /// Counts one visited entry; false once a bound is hit.
    fn visit(&mut self) -> bool {
        self.visits += 1;
        self.visits <= VISIT_BUDGET
            && (!self.visits.is_multiple_of(256) || Instant::now() < self.deadline)
    }
}

/// One entry met by [`walk`]: its path, its path relative to the root, and
/// its metadata (not following symlinks).
struct Entry<'a> {
    path: &'a Path,
    rel: &'a str,
    meta: &'a fs::Metadata,
}

/// Visits everything under `root` (not `root` itself) down to `depth`
/// levels, in name order; `visit` returns false to stop. Returns false when
/// the budget ran out.
fn walk(
    root: &Path,
    depth: usize,
    budget: &mut Budget,
    visit: &mut dyn FnMut(Entry<'_>) -> bool,
) -> bool {
    let pseudo =
        |p: &Path| (p == Path::new("/proc") || p == Path::new("/sys")) && !root.starts_with(p);
    // A stack of directories still being read: (dir, rel, sorted entries left).
    let mut stack: Vec<(String, std::vec::IntoIter<(String, PathBuf)>)> = Vec::new();
    let children = |dir: &Path| -> std::vec::IntoIter<(String, PathBuf)> {
        let mut v: Vec<(String, PathBuf)> = match fs::read_dir(dir) {
            Ok(rd) => rd
                .filter_map(Result::ok)
                .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
                .collect(),
            Err(_) => Vec::new(), // unreadable directories are skipped, as find does
        };
        v.sort();
        v.into_iter()
    };
    stack.push((String::new(), children(root)));
    while let Some((rel_dir, iter)) = stack.last_mut() {
        let Some((name, path)) = iter.next() else {
            stack.pop();
            continue;
        };
        if !budget.visit() {
            return false;
        }
        let rel = if rel_dir.is_empty() {
            name
        } else {
            format!("{rel_dir}/{name}")
        };
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue; // vanished meanwhile
        };
        if !visit(Entry {
            path: &path,
            rel: &rel,
            meta: &meta,
        }) {
            return true;
        }
        if meta.is_dir() && stack.len() < depth && !pseudo(&path) {
            let next = children(&path);
            stack.push((rel, next));
        }
    }
    true
}

fn check_dir(path: &str) -> Result<PathBuf, OpError> {
    let root = resolve(path)?;
    let meta = fs::metadata(&root).map_err(|e| OpError::from_io(&e, path))?;
    if !meta.is_dir() {
        return Err(OpError::new(
            OpErrorKind::NotADirectory,
            format!("{path} is not a directory"),
        ));
    }
    Ok(root)
}

/// Runs a glob search; (matches, truncated).
pub fn glob_blocking(
    path: &str,
    pattern: &str,
    limit: u32,
) -> Result<(Vec<GlobMatch>, bool), OpError> {
    let limit = limit.clamp(1, SEARCH_MAX_LIMIT) as usize;
    let root = check_dir(path)?;
    let pat = compile(pattern.trim_start_matches("./"))?;
    let mut found = Vec::new();
    let mut truncated = false;
    let mut budget = Budget::new();
    let complete = walk(&root, max_depth(pattern), &mut budget, &mut |e| {
        if !pat.matches_with(e.rel, OPTIONS) {
            return true;
        }
        if found.len() == limit {
            truncated = true;
            return false;
        }
        found.push(GlobMatch {
            path: e.path.to_string_lossy().into_owned(),
            is_dir: e.meta.is_dir(),
            size: e.meta.len(),
            mtime: e.meta.mtime(),
        });
        true
    });
    Ok((found, truncated || !complete))
}

/// Runs a literal grep; (matches, truncated).
pub fn grep_blocking(
    path: &str,
    pattern: &str,
    glob: Option<&str>,
    limit: u32,
) -> Result<(Vec<GrepMatch>, bool), OpError> {
    if pattern.is_empty() {
        return Err(bad_request("search text is empty".into()));
    }
    let limit = limit.clamp(1, SEARCH_MAX_LIMIT) as usize;
    let filter = match glob {
        Some(g) => Some((
            compile(g.trim_start_matches("./"))?,
            g.contains('/') || g.contains("**"),
        )),
        None => None,
    };
    let root = resolve(path)?;
    let meta = fs::metadata(&root).map_err(|e| OpError::from_io(&e, path))?;
    let finder = memchr::memmem::Finder::new(pattern.as_bytes());
    let mut found = Vec::new();
    let mut budget = Budget::new();
    let mut full = false;
    if !meta.is_dir() {
        full = grep_file(&root, &finder, limit, &mut found, budget.deadline);
        return Ok((found, full || Instant::now() >= budget.deadline));
    }
    let deadline = budget.deadline;
    let complete = walk(&root, usize::MAX, &mut budget, &mut |e| {
        if !e.meta.is_file() {
            return true;
        }
        if let Some((pat, whole)) = &filter {
            let subject = if *whole {
                e.rel
            } else {
                e.rel.rsplit('/').next().unwrap_or(e.rel)
            };
            if !pat.matches_with(subject, OPTIONS) {
                return true;
            }
        }
        full = grep_file(e.path, &finder, limit, &mut found, deadline);
        !full && Instant::now() < deadline
    });
    let late = Instant::now() >= deadline;
    Ok((found, full || late || !complete))
}

/// Appends the matching lines of one file; true once `limit` is exceeded
/// (a further match exists). Unreadable and binary files are skipped.
fn grep_file(
    path: &Path,
    finder: &memchr::memmem::Finder<'_>,
    limit: usize,
    found: &mut Vec<GrepMatch>,
    deadline: Instant,
) -> bool {
    let Ok(f) = fs::File::open(path) else {
        return false;
    };
    let mut r = BufReader::with_capacity(64 * 1024, f);
    match r.fill_buf() {
        Ok(head) if memchr::memchr(0, &head[..head.len().min(8192)]).is_some() => return false,
        Ok(_) => {}
        Err(_) => return false,
    }
    let mut line = Vec::new();
    let mut number = 0u64;
    loop {
        line.clear();
        let n = match (&mut r).take(MAX_LINE_SCAN).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return false,
            Ok(n) => n,
        };
        number += 1;
        if n as u64 == MAX_LINE_SCAN && line.last() != Some(&b'\n') {
            // An overlong line: search its head, skip the rest of it.
            let _ = r.skip_until(b'\n');
        }
        if number.is_multiple_of(4096) && Instant::now() >= deadline {
            return false;
        }
        if finder.find(&line).is_none() {
            continue;
        }
        if found.len() == limit {
            return true;
        }
        found.push(GrepMatch {
            path: path.to_string_lossy().into_owned(),
            line: number,
            text: line_text(&line),
        });
    }
}

/// A line without its line ending, at most [`GREP_MAX_LINE`] bytes of
/// (lossy) UTF-8, cut at a character boundary.
fn line_text(line: &[u8]) -> String {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut text = String::from_utf8_lossy(line).into_owned();
    if text.len() > GREP_MAX_LINE {
        let mut cut = GREP_MAX_LINE;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    text
}

/// Sends results in frame-sized batches, then `Searched`.
async fn send_batches<T: serde::Serialize>(
    stream: &Stream,
    items: Vec<T>,
    truncated: bool,
    wrap: fn(Vec<T>) -> Reply,
) {
    let mut batch = Vec::new();
    let mut bytes = 0;
    for item in items {
        let size = serde_json::to_vec(&item).map_or(0, |v| v.len()) + 1;
        if bytes + size > BATCH_BYTES && !batch.is_empty() {
            if stream
                .send_ctl(&wrap(std::mem::take(&mut batch)))
                .await
                .is_err()
            {
                return;
            }
            bytes = 0;
        }
        bytes += size;
        batch.push(item);
    }
    if !batch.is_empty() && stream.send_ctl(&wrap(batch)).await.is_err() {
        return;
    }
    let _ = stream.send_ctl(&Reply::Searched { truncated }).await;
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, OpError> + Send + 'static,
) -> Result<T, OpError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(OpError::new(OpErrorKind::Io, format!("search failed: {e}"))))
}

pub async fn glob(stream: Stream, path: String, pattern: String, limit: u32) {
    match blocking(move || glob_blocking(&path, &pattern, limit)).await {
        Ok((found, truncated)) => {
            send_batches(&stream, found, truncated, |matches| Reply::GlobMatches {
                matches,
            })
            .await
        }
        Err(e) => {
            let _ = stream.send_ctl(&Reply::Error(e)).await;
        }
    }
}

pub async fn grep(stream: Stream, path: String, pattern: String, glob: Option<String>, limit: u32) {
    match blocking(move || grep_blocking(&path, &pattern, glob.as_deref(), limit)).await {
        Ok((found, truncated)) => {
            send_batches(&stream, found, truncated, |matches| Reply::GrepMatches {
                matches,
            })
            .await
        }
        Err(e) => {
            let _ = stream.send_ctl(&Reply::Error(e)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> PathBuf {
        let root = std::env::temp_dir().join(format!(
            "hearth-search-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        for (p, body) in [
            ("a.py", "import os\nprint('needle')\n"),
            ("b.txt", "no match here\n"),
            ("src/c.py", "x = 1\r\nneedle = 2\r\n"),
            ("src/deep/d.py", "needle needle\n"),
            ("src/deep/e.bin", "needle\0binary\n"),
            (".hidden/f.py", "needle\n"),
        ] {
            let path = root.join(p);
            fs::create_dir_all(path.parent().unwrap_or(&root)).ok();
            fs::write(&path, body).ok();
        }
        root
    }

    fn rels(root: &Path, paths: impl IntoIterator<Item = String>) -> Vec<String> {
        let prefix = format!("{}/", root.display());
        paths
            .into_iter()
            .map(|p| p.strip_prefix(&prefix).unwrap_or(&p).to_owned())
            .collect()
    }

    #[test]
    fn glob_matches_segments_and_recursion() {
        let root = tree();
        let r = root.to_string_lossy().into_owned();
        let names = |pat: &str| {
            let (m, t) = glob_blocking(&r, pat, 100).unwrap_or_default();
            assert!(!t, "{pat}");
            rels(&root, m.into_iter().map(|m| m.path))
        };
        assert_eq!(names("*"), [".hidden", "a.py", "b.txt", "src"]);
        assert_eq!(names("*.py"), ["a.py"]);
        assert_eq!(
            names("**/*.py"),
            [".hidden/f.py", "a.py", "src/c.py", "src/deep/d.py"]
        );
        assert_eq!(names("src/*"), ["src/c.py", "src/deep"]);
        assert_eq!(names("src/**/?.py"), ["src/c.py", "src/deep/d.py"]);
        assert_eq!(names("[ab].*"), ["a.py", "b.txt"]);
        let (m, _) = glob_blocking(&r, "src", 10).unwrap_or_default();
        assert!(m.len() == 1 && m[0].is_dir);
        let (m, t) = glob_blocking(&r, "**", 2).unwrap_or_default();
        assert!(m.len() == 2 && t, "limit truncates");
        assert!(glob_blocking(&r, "a**", 10).is_err(), "invalid pattern");
        let missing = glob_blocking(&format!("{r}/nope"), "*", 10);
        assert!(matches!(missing, Err(e) if e.kind == OpErrorKind::NotFound));
        let file = glob_blocking(&format!("{r}/a.py"), "*", 10);
        assert!(matches!(file, Err(e) if e.kind == OpErrorKind::NotADirectory));
        fs::remove_dir_all(&root).ok();
    }

    #[test]
    fn grep_finds_literal_lines_and_skips_binary() {
        let root = tree();
        let r = root.to_string_lossy().into_owned();
        let hits = |glob: Option<&str>, limit| {
            let (m, t) = grep_blocking(&r, "needle", glob, limit).unwrap_or_default();
            let v: Vec<(String, u64, String)> =
                m.into_iter().map(|m| (m.path, m.line, m.text)).collect();
            let paths = rels(&root, v.iter().map(|x| x.0.clone()));
            (
                paths
                    .into_iter()
                    .zip(v)
                    .map(|(p, (_, l, t))| (p, l, t))
                    .collect::<Vec<_>>(),
                t,
            )
        };
        let (all, t) = hits(None, 100);
        assert!(!t);
        assert_eq!(
            all,
            [
                (".hidden/f.py".into(), 1, "needle".into()),
                ("a.py".into(), 2, "print('needle')".into()),
                ("src/c.py".into(), 2, "needle = 2".into()),
                ("src/deep/d.py".into(), 1, "needle needle".into()),
            ]
        );
        // A bare glob matches base names at any depth; with a slash, paths.
        assert_eq!(hits(Some("*.py"), 100).0.len(), 4);
        assert_eq!(hits(Some("src/*.py"), 100).0.len(), 1);
        assert_eq!(hits(Some("*.txt"), 100).0.len(), 0);
        let (two, t) = hits(None, 2);
        assert!(two.len() == 2 && t, "limit truncates");
        // A file as the root searches that file.
        let (m, _) = grep_blocking(&format!("{r}/src/c.py"), "x =", None, 10).unwrap_or_default();
        assert_eq!(m.len(), 1);
        assert!(grep_blocking(&r, "", None, 10).is_err(), "empty text");
        fs::remove_dir_all(&root).ok();
    }

    #[test]
    fn long_lines_are_cut_at_a_char_boundary() {
        let line = "é".repeat(GREP_MAX_LINE);
        let text = line_text(format!("{line}\r\n").as_bytes());
        assert!(text.len() <= GREP_MAX_LINE && text.chars().all(|c| c == 'é'));
    }
}
