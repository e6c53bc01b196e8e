//! The `busybox` image: the host's busybox-static and a symlink per applet.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use super::{chown_ids, make_dir, set_mode, write_file};
use crate::{command, elf, ImageError};

/// Where Debian's busybox-static installs the binary.
const HOST_BUSYBOX: &str = "/bin/busybox";

/// The host's busybox, checked to be a static binary.
pub(super) fn host_busybox() -> Result<PathBuf, ImageError> {
    let path = PathBuf::from(HOST_BUSYBOX);
    if !path.is_file() {
        return Err(ImageError::MissingHostFile {
            what: "busybox",
            path,
            hint: "install the busybox-static package",
        });
    }
    elf::require_static(&path)?;
    Ok(path)
}

/// Fills `tree` with the busybox image.
pub(super) fn populate(tree: &Path) -> Result<(), ImageError> {
    let src = host_busybox()?;
    for (dir, mode) in [
        ("bin", 0o755),
        ("sbin", 0o755),
        ("usr/bin", 0o755),
        ("usr/sbin", 0o755),
        ("etc", 0o755),
        ("proc", 0o555),
        ("sys", 0o555),
        ("dev", 0o755),
        ("run", 0o755),
        ("tmp", 0o1777),
        ("var/tmp", 0o1777),
        ("root", 0o700),
        ("home", 0o755),
        ("home/user", 0o755),
    ] {
        make_dir(&tree.join(dir), mode)?;
    }
    chown_ids(&tree.join("home/user"), 1000, 1000)?;

    let bin = tree.join("bin/busybox");
    fs::copy(&src, &bin).map_err(|e| ImageError::io("copy to", &bin, e))?;
    set_mode(&bin, 0o755)?;

    let list = command::run_stdout(Command::new(&src).arg("--list-full"))?;
    let mut applets: Vec<&str> = list
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    applets.push("bin/sh");
    for applet in applets {
        let rel = Path::new(applet);
        let plain = rel.components().all(|c| matches!(c, Component::Normal(_)));
        if !plain {
            return Err(ImageError::UnexpectedOutput {
                command: format!("{} --list-full", src.display()),
                reason: format!("applet path {applet:?} is not a plain relative path"),
            });
        }
        let link = tree.join(rel);
        if fs::symlink_metadata(&link).is_ok() {
            continue; // bin/busybox itself, or listed twice
        }
        if let Some(parent) = link.parent() {
            if !parent.is_dir() {
                make_dir(parent, 0o755)?;
            }
        }
        symlink("/bin/busybox", &link).map_err(|e| ImageError::io("create symlink", &link, e))?;
    }

    // busybox has no `bash` applet; LangSmith's default shell is /bin/bash,
    // so it is a wrapper around busybox's POSIX shell.
    write_file(
        &tree.join("bin/bash"),
        "#!/bin/sh\nexec /bin/sh \"$@\"\n",
        0o755,
    )?;

    let etc = tree.join("etc");
    write_file(
        &etc.join("passwd"),
        "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n",
        0o644,
    )?;
    write_file(&etc.join("group"), "root:x:0:\nuser:x:1000:\n", 0o644)?;
    write_file(&etc.join("hostname"), "hearth\n", 0o644)?;
    Ok(())
}
