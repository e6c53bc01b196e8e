//! Turning a directory tree into an ext4 image with `mkfs.ext4 -d`, as
//! deterministically as e2fsprogs allows.
//!
//! Fixed: the UUID and directory hash seed (per image), the label, root
//! ownership, block and inode size, and every timestamp mke2fs invents
//! (`E2FSPROGS_FAKE_TIME`; note that 0 means "unset" to e2fsprogs). `mke2fs -d`
//! copies atime and ctime from the source tree, and ctime cannot be set on the
//! host, so afterwards `debugfs -w` rewrites atime, ctime and crtime (and,
//! when asked, mtime) of every copied path to the same fixed instant.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::fs::{self, File};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use crate::{command, ImageError};

/// The instant all normalized timestamps get: 2023-01-01T00:00:00Z. Not 0,
/// which e2fsprogs ignores, and not before 1980, which zip-based tools
/// (Python wheels) reject.
pub(crate) const FIXED_EPOCH: u64 = 1_672_531_200;

/// Filesystem label of every root image.
pub const ROOTFS_LABEL: &str = "hearthroot";

/// How the timestamps of copied files end up in the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Times {
    /// atime, ctime and crtime fixed; mtime kept from the source (package
    /// mtimes carry meaning).
    KeepMtime,
    /// Every timestamp fixed (trees whose mtimes are just build time).
    AllFixed,
}

/// Creates `img` (sparse, `size` bytes, a multiple of 4 KiB) holding `tree`.
pub(crate) fn make_image(
    tree: &Path,
    img: &Path,
    size: u64,
    uuid: &str,
    times: Times,
) -> Result<(), ImageError> {
    let file = File::create(img).map_err(|e| ImageError::io("create", img, e))?;
    file.set_len(size)
        .map_err(|e| ImageError::io("size", img, e))?;
    drop(file);
    command::run(
        Command::new("mkfs.ext4")
            .args([
                "-q",
                "-F",
                "-b",
                "4096",
                "-I",
                "256",
                "-L",
                ROOTFS_LABEL,
                "-U",
                uuid,
            ])
            .arg("-E")
            .arg(format!(
                "root_owner=0:0,hash_seed={uuid},assume_storage_prezeroed=1"
            ))
            .arg("-d")
            .arg(tree)
            .arg(img)
            .arg(format!("{}k", size / 1024))
            .env("E2FSPROGS_FAKE_TIME", FIXED_EPOCH.to_string()),
    )?;
    normalize_times(tree, img, times)
}

/// Rewrites the timestamps of every path of `tree` inside `img`.
fn normalize_times(tree: &Path, img: &Path, times: Times) -> Result<(), ImageError> {
    let mut fields = vec!["atime", "ctime", "crtime"];
    if times == Times::AllFixed {
        fields.push("mtime");
    }
    let mut script = String::new();
    let mut add = |path: &str| {
        for field in &fields {
            // Writing to a String cannot fail.
            let _ = writeln!(script, "sif \"{path}\" {field} @{FIXED_EPOCH}");
        }
    };
    add("/");
    let mut stack = vec![tree.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = fs::read_dir(&dir).map_err(|e| ImageError::io("read directory", &dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| ImageError::io("read directory", &dir, e))?;
            let path = entry.path();
            let Ok(rel) = path.strip_prefix(tree) else {
                continue;
            };
            let Some(rel) = rel.to_str() else {
                // Not UTF-8: cannot be named in a debugfs script.
                continue;
            };
            // debugfs's parser has no escapes inside quotes.
            if !rel.contains(['"', '\n', '\\']) {
                add(&format!("/{rel}"));
            }
            let ty = entry
                .file_type()
                .map_err(|e| ImageError::io("stat", &path, e))?;
            if ty.is_dir() {
                stack.push(path);
            }
        }
    }
    let script_path = img.with_extension("debugfs");
    fs::write(&script_path, script).map_err(|e| ImageError::io("write", &script_path, e))?;
    let mut cmd = Command::new("debugfs");
    cmd.arg("-w")
        .arg("-f")
        .arg(&script_path)
        .arg(img)
        // Closing the filesystem stamps the superblock's write time.
        .env("E2FSPROGS_FAKE_TIME", FIXED_EPOCH.to_string());
    let command_line = command::describe(&cmd);
    let output = command::run(&mut cmd)?;
    let _ = fs::remove_file(&script_path);
    // debugfs exits 0 even when a request fails; its complaints go to stderr
    // after the version banner.
    let stderr = String::from_utf8_lossy(&output.stderr);
    let complaints: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("debugfs "))
        .collect();
    if complaints.is_empty() {
        Ok(())
    } else {
        Err(ImageError::CommandFailed {
            command: command_line,
            status: "requests failed".to_owned(),
            stderr_tail: command::tail(complaints.join("\n").as_bytes()),
        })
    }
}

/// Disk space used by `tree` (allocated blocks, hard links counted once).
pub(crate) fn disk_usage(tree: &Path) -> Result<u64, ImageError> {
    let mut seen = HashSet::new();
    let mut total = 0u64;
    let mut stack = vec![tree.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = fs::read_dir(&dir).map_err(|e| ImageError::io("read directory", &dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| ImageError::io("read directory", &dir, e))?;
            let path = entry.path();
            let meta = fs::symlink_metadata(&path).map_err(|e| ImageError::io("stat", &path, e))?;
            if meta.nlink() > 1 && !meta.is_dir() && !seen.insert((meta.dev(), meta.ino())) {
                continue;
            }
            total += meta.blocks() * 512;
            if meta.is_dir() {
                stack.push(path);
            }
        }
    }
    Ok(total)
}
