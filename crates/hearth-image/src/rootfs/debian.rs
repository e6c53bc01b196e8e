//! The `default` image: Debian minbase from debootstrap, plus user `user`.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::process::Command;

use super::{chown_ids, make_dir, write_file};
use crate::{cache, command, ImageConfig, ImageError, Progress, Unit};

/// debootstrap variant.
pub(super) const VARIANT: &str = "minbase";
/// Packages added to minbase (their dependencies, never their
/// recommendations): what agents and their commands reach for. `python` is
/// python-is-python3; `pip install` works without flags (see
/// [`allow_pip_install`]); `rg` is ripgrep; `ip` and `ss` are iproute2;
/// `rclone` and `fuse3` make bucket mounts (S3, GCS) in the guest; `node`
/// and boto3 are what the SDKs' examples run in a sandbox (npm comes from
/// its own registry package: see `npm.rs`; `buildah`, for the Dockerfile
/// builds of LangSmith's SDK, is installed after: see [`finish`]).
pub(super) const INCLUDE: [&str; 19] = [
    "bash",
    "sudo",
    "coreutils",
    "procps",
    "ca-certificates",
    "python3",
    "python-is-python3",
    "python3-pip",
    "python3-venv",
    "git",
    "curl",
    "jq",
    "ripgrep",
    "unzip",
    "iproute2",
    "rclone",
    "fuse3",
    "nodejs",
    "python3-boto3",
];

/// Runs debootstrap into `tree` and applies Hearth's changes with `extra`
/// packages; returns the mirror used.
pub(super) fn populate(
    cfg: &ImageConfig,
    tree: &Path,
    extra: &[&str],
    p: &dyn Progress,
) -> Result<String, ImageError> {
    let mirror = bootstrap(cfg, tree, p)?;
    finish(tree, extra, p)?;
    Ok(mirror)
}

/// Runs debootstrap into `tree` (the part every Debian image shares, and
/// most of a build's time); returns the mirror used.
pub(super) fn bootstrap(
    cfg: &ImageConfig,
    tree: &Path,
    p: &dyn Progress,
) -> Result<String, ImageError> {
    let mirror = cfg.resolved_mirror();
    let what = format!("debootstrap {} from {mirror}", cfg.suite);
    p.measure(&what, Unit::Steps, None);
    let mut phases = Phases::default();
    let result = command::run_streaming(
        Command::new("debootstrap")
            .arg(format!("--variant={VARIANT}"))
            .arg(format!("--include={}", INCLUDE.join(",")))
            .arg(&cfg.suite)
            .arg(tree)
            .arg(&mirror),
        |line| {
            let shown = phases.line(line);
            if let Some(msg) = &shown {
                p.advance(phases.done, phases.total(), &format!("debootstrap: {msg}"));
            } else if phases.last_counted {
                p.advance(phases.done, phases.total(), "");
            }
        },
    );
    // debootstrap mounts proc/sys in the target; never let mkfs copy them.
    cache::unmount_below(tree)?;
    result?;
    Ok(mirror)
}

/// Copies a bootstrapped tree (owners, modes, times, links, extended
/// attributes) into the empty directory `to`, so a second image can be
/// finished from it without a second debootstrap.
pub(super) fn copy_tree(from: &Path, to: &Path) -> Result<(), ImageError> {
    command::run(
        Command::new("cp")
            .args(["-a", "--"])
            .arg(from.join("."))
            .arg(to),
    )
    .map(|_| ())
}

/// Applies Hearth's changes to a bootstrapped `tree`: the `extra` packages,
/// npm, user `user` (with passwordless sudo), and what a sandbox must not inherit from the build.
pub(super) fn finish(tree: &Path, extra: &[&str], p: &dyn Progress) -> Result<(), ImageError> {
    // buildah through apt (a debootstrap `--include` of it fails to
    // configure golang-github-containers-common), with the commands that
    // make it answer as BuildKit and Docker.
    let mut packages = vec![super::buildkit::PACKAGE];
    packages.extend_from_slice(extra);
    install_extra(tree, &packages, p)?;
    super::buildkit::install(tree)?;
    super::npm::install(tree, p)?;

    add_user(tree)?;
    // E2B's base template's `user` may run anything as root, without a
    // password (the VM is the boundary, not the user).
    let sudoers = tree.join("etc/sudoers.d");
    make_dir(&sudoers, 0o755)?;
    write_file(
        &sudoers.join("hearth-user"),
        "user ALL=(ALL:ALL) NOPASSWD: ALL\n",
        0o440,
    )?;
    write_file(&tree.join("etc/hostname"), "hearth\n", 0o644)?;
    // The machine's own name resolves locally (sudo looks it up; the guest
    // agent renames the line with the sandbox's identity).
    write_file(
        &tree.join("etc/hosts"),
        "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\thearth\n",
        0o644,
    )?;
    // debootstrap copies the build host's resolver config, which means
    // nothing inside a sandbox; the guest side configures its own.
    cache::remove_all(&tree.join("etc/resolv.conf"))?;
    allow_pip_install(tree)?;
    shrink(tree)
}

/// Installs `extra` packages with the tree's own apt, in a chroot (its
/// maintainer scripts ordered by dpkg, which a long debootstrap
/// `--include` is not: python3-zmq failed to configure there).
fn install_extra(tree: &Path, extra: &[&str], p: &dyn Progress) -> Result<(), ImageError> {
    p.step(&format!("apt-get install {}", extra.join(" ")));
    command::run(
        Command::new("mount")
            .args(["-t", "proc", "proc"])
            .arg(tree.join("proc")),
    )?;
    let apt = |args: &[&str]| {
        command::run(
            Command::new("chroot")
                .arg(tree)
                .arg("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )
        .map(|_| ())
    };
    let result = apt(&["update", "-q"]).and_then(|()| {
        let mut args = vec!["install", "-y", "-q", "--no-install-recommends"];
        args.extend_from_slice(extra);
        apt(&args)
    });
    cache::unmount_below(tree)?;
    result
}

/// Turns debootstrap's `I:` lines into a few progress lines and a count:
/// phase lines ("Resolving dependencies…", "Configuring the base system…")
/// pass through, the hundreds of per-package lines ("Retrieving libc6
/// 2.36-9", "Validating …", "Extracting bash...") collapse into one line per
/// phase and count as steps.
///
/// The steps: every package is retrieved, unpacked and configured, and the
/// required ones are also extracted first, so a build takes about 3 × N + R
/// steps for N packages of which R are required. N is known once retrieval
/// ends (until then the total is unknown), R once extraction ends (until
/// then it is taken to be N).
#[derive(Debug, Default)]
struct Phases {
    /// The per-package phase being collapsed, if any.
    current: Option<String>,
    /// Per-package lines seen so far.
    done: u64,
    /// Packages retrieved, once retrieval has ended.
    packages: Option<u64>,
    /// Packages extracted, once extraction has ended.
    required: Option<u64>,
    retrieved: u64,
    extracted: u64,
    /// The line just handled was a counted per-package line.
    last_counted: bool,
}

impl Phases {
    /// Handles one line of output; returns the progress line to show, if any.
    fn line(&mut self, line: &str) -> Option<String> {
        self.last_counted = false;
        let info = line.strip_prefix("I: ")?.trim();
        let words: Vec<&str> = info.split_whitespace().collect();
        let (&verb, rest) = words.split_first()?;
        if verb == "Validating" {
            return None; // always follows its "Retrieving" line
        }
        let lower = info.to_ascii_lowercase();
        let per_package = matches!(
            verb,
            "Retrieving" | "Extracting" | "Unpacking" | "Configuring"
        ) && (1..=2).contains(&rest.len())
            && !lower.contains("packages")
            && !lower.contains("release");
        if !per_package {
            self.current = None;
            return Some(info.to_owned());
        }
        self.done += 1;
        self.last_counted = true;
        match verb {
            "Retrieving" => self.retrieved += 1,
            "Extracting" => self.extracted += 1,
            _ => {}
        }
        if verb != "Retrieving" && self.packages.is_none() {
            self.packages = Some(self.retrieved);
        }
        if verb != "Retrieving" && verb != "Extracting" && self.required.is_none() {
            self.required = Some(self.extracted);
        }
        let phase = format!("{} packages", verb.to_ascii_lowercase());
        if self.current.as_deref() == Some(phase.as_str()) {
            return None;
        }
        self.current = Some(phase.clone());
        Some(phase)
    }

    /// The expected number of steps, once it can be estimated.
    fn total(&self) -> Option<u64> {
        let n = self.packages?;
        let r = self.required.unwrap_or(n);
        Some((3 * n + r).max(self.done))
    }
}

/// Adds `user` (1000:1000, /home/user, bash) unless it exists.
fn add_user(tree: &Path) -> Result<(), ImageError> {
    let etc = tree.join("etc");
    let passwd = etc.join("passwd");
    let existing = fs::read_to_string(&passwd).map_err(|e| ImageError::io("read", &passwd, e))?;
    if existing.lines().any(|l| l.starts_with("user:")) {
        return Ok(());
    }
    append(&passwd, "user:x:1000:1000:user:/home/user:/bin/bash\n")?;
    append(&etc.join("group"), "user:x:1000:\n")?;
    // No password (locked); no last-change day, so nothing depends on the
    // build date.
    append(&etc.join("shadow"), "user:!::0:99999:7:::\n")?;
    let gshadow = etc.join("gshadow");
    if gshadow.exists() {
        append(&gshadow, "user:!::\n")?;
    }

    let home = tree.join("home/user");
    make_dir(&home, 0o755)?;
    let skel = etc.join("skel");
    if let Ok(entries) = fs::read_dir(&skel) {
        for entry in entries.filter_map(Result::ok) {
            let is_file = entry.file_type().is_ok_and(|t| t.is_file());
            if !is_file {
                continue;
            }
            let dst = home.join(entry.file_name());
            fs::copy(entry.path(), &dst).map_err(|e| ImageError::io("copy to", &dst, e))?;
            chown_ids(&dst, 1000, 1000)?;
        }
    }
    chown_ids(&home, 1000, 1000)
}

fn append(path: &Path, line: &str) -> Result<(), ImageError> {
    let mut f = OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(|e| ImageError::io("open", path, e))?;
    f.write_all(line.as_bytes())
        .map_err(|e| ImageError::io("append to", path, e))
}

/// Makes `pip install` work without flags. Debian 12 marks its Python
/// `EXTERNALLY-MANAGED` (PEP 668), so pip refuses to install outside a venv;
/// a sandbox is disposable and its Python belongs to whoever runs in it, so
/// the marker goes. pip.conf silences the warnings about running as root
/// and about pip's own version (the check would also need the network).
fn allow_pip_install(tree: &Path) -> Result<(), ImageError> {
    let lib = tree.join("usr/lib");
    let entries = fs::read_dir(&lib).map_err(|e| ImageError::io("read directory", &lib, e))?;
    for entry in entries.filter_map(Result::ok) {
        if entry.file_name().to_string_lossy().starts_with("python3") {
            cache::remove_all(&entry.path().join("EXTERNALLY-MANAGED"))?;
        }
    }
    write_file(
        &tree.join("etc/pip.conf"),
        "[global]\ndisable-pip-version-check = true\n\n[install]\nroot-user-action = ignore\n",
        0o644,
    )
}

/// Removes apt's package lists and caches (apt-get update restores them).
fn shrink(tree: &Path) -> Result<(), ImageError> {
    let lists = tree.join("var/lib/apt/lists");
    remove_children(&lists, |name, is_dir| !(is_dir && name == "partial"))?;
    remove_children(&lists.join("partial"), |_, _| true)?;
    remove_children(&tree.join("var/cache/apt"), |name, is_dir| {
        !is_dir && name.ends_with(".bin")
    })?;
    remove_children(&tree.join("var/cache/apt/archives"), |name, is_dir| {
        !is_dir && name.ends_with(".deb")
    })?;
    remove_children(&tree.join("var/cache/apt/archives/partial"), |_, _| true)?;
    Ok(())
}

/// Removes the entries of `dir` for which `pick(name, is_dir)` holds; a
/// missing `dir` is fine.
fn remove_children(dir: &Path, pick: impl Fn(&str, bool) -> bool) -> Result<(), ImageError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ImageError::io("read directory", dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| ImageError::io("read directory", dir, e))?;
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if pick(&entry.file_name().to_string_lossy(), is_dir) {
            cache::remove_all(&entry.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debootstrap_output_collapses_into_phases() {
        let log = "\
I: Retrieving InRelease
I: Checking Release signature
I: Retrieving Packages
I: Validating Packages
I: Resolving dependencies of required packages...
W: something odd
I: Retrieving adduser 3.134
I: Validating adduser 3.134
I: Retrieving apt 2.6.1
I: Validating apt 2.6.1
I: Chosen extractor for .deb packages: dpkg-deb
I: Extracting adduser...
I: Extracting apt...
I: Unpacking required packages...
I: Unpacking base-files...
I: Unpacking bash...
I: Configuring required packages...
I: Configuring base-files...
I: Unpacking the base system...
I: Base system installed successfully.
";
        let mut phases = Phases::default();
        let shown: Vec<String> = log.lines().filter_map(|l| phases.line(l)).collect();
        assert_eq!(
            shown,
            [
                "Retrieving InRelease",
                "Checking Release signature",
                "Retrieving Packages",
                "Resolving dependencies of required packages...",
                "retrieving packages",
                "Chosen extractor for .deb packages: dpkg-deb",
                "extracting packages",
                "Unpacking required packages...",
                "unpacking packages",
                "Configuring required packages...",
                "configuring packages",
                "Unpacking the base system...",
                "Base system installed successfully.",
            ]
        );
        // 2 retrieved, 2 extracted, 2 unpacked, 1 configured; 3 × 2 + 2 expected.
        assert_eq!(phases.done, 7);
        assert_eq!((phases.packages, phases.required), (Some(2), Some(2)));
        assert_eq!(phases.total(), Some(8));
    }
}
