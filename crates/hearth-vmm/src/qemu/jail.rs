//! A jailed QEMU ([`crate::JailSpec`]).
//!
//! **What the VMM gets.** It runs as the jail's uid and gid (no
//! supplementary groups), with every capability set empty (effective,
//! permitted, inheritable, ambient and bounding), `no_new_privs`, and
//! QEMU's own seccomp filter (`-sandbox`, always on). It has its own mount,
//! PID, IPC and UTS namespaces, and the VM's network namespace (or a new
//! empty one without a NIC). Its root is a small read-only tmpfs holding
//! only what it needs, each at the same absolute path as outside, so the
//! argument vector is the same as without a jail:
//! - read-only: `/usr`, `/lib*`, `/bin`, `/sbin` as present (symlinks are
//!   recreated as symlinks), `/etc/ld.so.cache`, the kernel, the initrd,
//!   read-only disks and every qcow2 backing file;
//! - read-write: the run directory, the memory file (the file only, never
//!   its directory: QEMU creates memory files world-readable, so a shared
//!   `/dev/shm` would show other VMs' RAM), writable disks, NBD sockets
//!   outside the run directory, `/dev/null`, `/dev/zero`, `/dev/urandom`
//!   and `/dev/kvm` under KVM;
//! - `/proc` of its own PID namespace.
//!
//! It runs in cgroups `hearth/<vm id>` with the spec's limits
//! ([`super::cgroup`]); they are removed once QEMU has exited.
//!
//! **Ownership.** Before the spawn the backend chowns to the jail user what
//! QEMU creates or writes: the run directory and its entries, the memory
//! file (created here for a cold boot), writable disk files and NBD
//! sockets. What QEMU only reads must already be readable by that user:
//! otherwise the spawn fails with [`VmmError::InvalidSpec`] saying which
//! file. A private restore's memory file is opened read-write by QEMU 7.2
//! (and never written): it must be readable and writable by the jail user
//! already, since chowning a shared snapshot to one VM would lock out the
//! others.
//!
//! **The spawn.** A PID namespace applies only to children of the process
//! that creates it, so the spawn has two processes ([`super::sys`]): the
//! forked child (*intermediate*) sets its parent-death signal, enters the
//! network namespace and the cgroups, unshares the PID namespace and forks
//! again. The grandchild, PID 1 of the new namespace, sets its own
//! parent-death signal, builds its root, `pivot_root`s, mounts `/proc`,
//! drops privileges and execs QEMU. The intermediate reports the
//! grandchild's PID on a pipe, waits for it and exits with its status (or
//! its signal), so the reaper task and `VmInstance::pid` keep their meaning;
//! killing the intermediate kills QEMU through its parent-death signal.
//! The backend kills QEMU itself through a pidfd, so QEMU is always reaped
//! by the intermediate. `qemu.pid` and [`super::QemuInstance::vmm_pid`]
//! hold QEMU's own PID (whose `/proc/PID/cmdline` names the VM). A step
//! that fails between fork and exec reports its name and errno on the same
//! pipe: the spawn fails with [`VmmError::Jail`] naming it.

use std::collections::HashSet;
use std::ffi::CString;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use hearth_types::VmId;

use super::cgroup::{Cgroups, CGROUP_ROOT};
use super::cmdline::Start;
use super::sys::{self, ChildJail, ChildMount};
use crate::{Accel, DiskSource, JailSpec, RestoreMemory, VmSpec, VmmError};

/// The jail's root directory inside the run directory.
pub const JAIL_DIR: &str = "jail";
/// System directories the VMM reads its binary, libraries and firmware from.
const SYSTEM_DIRS: &[&str] = &["/usr", "/lib", "/lib64", "/bin", "/sbin"];
/// Extra read-only system files.
const SYSTEM_FILES: &[&str] = &["/etc/ld.so.cache"];
/// Device nodes every VMM may use.
const DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/urandom"];

/// One path the jail shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A host file or directory, bound at the same path.
    Bind {
        path: PathBuf,
        dir: bool,
        read_only: bool,
    },
    /// A top-level symlink (e.g. `/lib -> usr/lib`), recreated.
    Symlink { path: PathBuf, target: PathBuf },
}

/// The jail's root: `root` is where the tmpfs goes, `steps` what to do in
/// it, in order (paths under `root`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountPlan {
    pub root: PathBuf,
    pub steps: Vec<MountStep>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountStep {
    Mkdir(PathBuf),
    Touch(PathBuf),
    Symlink { target: PathBuf, link: PathBuf },
    Bind { src: PathBuf, dst: PathBuf },
    ReadOnly(PathBuf),
}

impl MountStep {
    pub fn describe(&self) -> String {
        match self {
            Self::Mkdir(p) => format!("create directory {}", p.display()),
            Self::Touch(p) => format!("create mount point {}", p.display()),
            Self::Symlink { link, .. } => format!("create symlink {}", link.display()),
            Self::Bind { src, .. } => format!("bind-mount {}", src.display()),
            Self::ReadOnly(p) => format!("make {} read-only", p.display()),
        }
    }
}

/// Builds the mount plan for `entries` under `root`. An entry inside an
/// earlier directory entry or symlink is visible already: it is skipped
/// when that gives it the access it needs, bound over (without creating a
/// mount point) when it needs less, and refused when it needs more.
pub fn plan_mounts(root: &Path, entries: &[Entry]) -> Result<MountPlan, String> {
    let mut steps = Vec::new();
    let mut read_only = Vec::new();
    let mut made: HashSet<PathBuf> = HashSet::new();
    // (path, read_only, is a symlink) of what is visible so far as a tree.
    let mut covering: Vec<(PathBuf, bool, bool)> = Vec::new();
    let under = |p: &Path| root.join(p.strip_prefix("/").unwrap_or(p));
    for e in entries {
        let path = match e {
            Entry::Bind { path, .. } | Entry::Symlink { path, .. } => path,
        };
        let normal = path.is_absolute()
            && path
                .components()
                .skip(1)
                .all(|c| matches!(c, Component::Normal(_)));
        if !normal || path == Path::new("/") {
            return Err(format!("{} is not a normal absolute path", path.display()));
        }
        let cover = covering
            .iter()
            .find(|(c, _, _)| path.starts_with(c) && path != c);
        let dst = under(path);
        match (e, cover) {
            (Entry::Symlink { target, .. }, None) => {
                mkdirs(root, path.parent(), &mut steps, &mut made);
                steps.push(MountStep::Symlink {
                    target: target.clone(),
                    link: dst,
                });
                covering.push((path.clone(), true, true));
            }
            (Entry::Symlink { .. }, Some(_)) => {}
            (
                Entry::Bind {
                    read_only: ro, dir, ..
                },
                None,
            ) => {
                mkdirs(root, path.parent(), &mut steps, &mut made);
                if *dir {
                    mkdirs(root, Some(path), &mut steps, &mut made);
                } else {
                    steps.push(MountStep::Touch(dst.clone()));
                }
                steps.push(MountStep::Bind {
                    src: path.clone(),
                    dst: dst.clone(),
                });
                if *ro {
                    read_only.push(MountStep::ReadOnly(dst));
                }
                if *dir {
                    covering.push((path.clone(), *ro, false));
                }
            }
            (Entry::Bind { read_only: ro, .. }, Some((c, cover_ro, symlink))) => {
                if *ro && (*cover_ro || *symlink) {
                    continue; // visible, read-only already
                }
                if !*ro && (*cover_ro || *symlink) {
                    return Err(format!(
                        "{} must be writable but lies under the read-only {}",
                        path.display(),
                        c.display()
                    ));
                }
                if !*ro {
                    continue; // visible and writable already
                }
                // Read-only inside a writable directory: bind over itself.
                steps.push(MountStep::Bind {
                    src: path.clone(),
                    dst: dst.clone(),
                });
                read_only.push(MountStep::ReadOnly(dst));
            }
        }
    }
    mkdirs(root, Some(Path::new("/proc")), &mut steps, &mut made);
    steps.extend(read_only);
    Ok(MountPlan {
        root: root.to_owned(),
        steps,
    })
}

/// Steps creating `dir` and its ancestors under `root`.
fn mkdirs(
    root: &Path,
    dir: Option<&Path>,
    steps: &mut Vec<MountStep>,
    made: &mut HashSet<PathBuf>,
) {
    let Some(dir) = dir else { return };
    let mut at = root.to_owned();
    for c in dir.components().skip(1) {
        at.push(c);
        if made.insert(at.clone()) {
            steps.push(MountStep::Mkdir(at.clone()));
        }
    }
}

/// What a jailed spawn needs: the child's plan, the parent's end of the
/// report pipe, the cgroups to remove afterwards, and the program to exec.
#[derive(Debug)]
pub struct Prepared {
    pub child: ChildJail,
    pub report: OwnedFd,
    pub cgroups: Cgroups,
    pub plan: MountPlan,
    pub program: PathBuf,
}

/// Why access is wanted, for [`check_access`].
#[derive(Debug, Clone, Copy)]
enum Want {
    Read,
    ReadWrite,
}

/// Whether the uid/gid may open `meta` as `want` by its mode bits.
fn allowed(meta: &std::fs::Metadata, jail: &JailSpec, want: Want) -> bool {
    let bits = match want {
        Want::Read => 0o4,
        Want::ReadWrite => 0o6,
    };
    let mode = meta.mode();
    let class = if meta.uid() == jail.uid {
        mode >> 6
    } else if meta.gid() == jail.gid {
        mode >> 3
    } else {
        mode
    };
    class & bits == bits
}

fn check_access(
    vm: VmId,
    jail: &JailSpec,
    what: &str,
    path: &Path,
    want: Want,
) -> Result<(), VmmError> {
    let meta = std::fs::metadata(path).map_err(|source| VmmError::Jail {
        vm,
        step: format!("stat {what} {}", path.display()),
        source,
    })?;
    if allowed(&meta, jail, want) {
        return Ok(());
    }
    let need = match want {
        Want::Read => "readable",
        Want::ReadWrite => "readable and writable",
    };
    Err(VmmError::InvalidSpec {
        vm,
        reason: format!(
            "{what} {} (mode {:04o}, owner {}:{}) is not {need} by the jail user {}:{}; make it world-readable (0644)",
            path.display(),
            meta.mode() & 0o7777,
            meta.uid(),
            meta.gid(),
            jail.uid,
            jail.gid
        ),
    })
}

/// Creates the VM's memory file for QEMU (the stale one is gone), owned by
/// the jail's user, so QEMU needs no write access to the directory.
fn new_memory_file(
    vm: VmId,
    jail: &JailSpec,
    spec: &VmSpec,
    entries: &mut Vec<Entry>,
) -> Result<(), VmmError> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&spec.mem_path)
        .map_err(|source| VmmError::Jail {
            vm,
            step: format!("create memory file {}", spec.mem_path.display()),
            source,
        })?;
    chown(vm, jail, &spec.mem_path)?;
    entries.push(Entry::Bind {
        path: spec.mem_path.clone(),
        dir: false,
        read_only: false,
    });
    Ok(())
}

fn chown(vm: VmId, jail: &JailSpec, path: &Path) -> Result<(), VmmError> {
    std::os::unix::fs::lchown(path, Some(jail.uid), Some(jail.gid)).map_err(|source| {
        VmmError::Jail {
            vm,
            step: format!("chown {} to the jail user", path.display()),
            source,
        }
    })
}

/// The backing files of a qcow2 image (`qemu-img info --backing-chain`).
async fn backing_chain(vm: VmId, image: &Path) -> Result<Vec<PathBuf>, VmmError> {
    let step = || format!("read the backing chain of {}", image.display());
    let out = tokio::process::Command::new("qemu-img")
        .args(["info", "--backing-chain", "--output=json", "-U"])
        .arg(image)
        .output()
        .await
        .map_err(|source| VmmError::Jail {
            vm,
            step: step(),
            source,
        })?;
    if !out.status.success() {
        return Err(VmmError::Jail {
            vm,
            step: step(),
            source: io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_owned()),
        });
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| VmmError::Jail {
        vm,
        step: step(),
        source: io::Error::other(e),
    })?;
    Ok(v.as_array()
        .map(|a| {
            a.iter()
                .skip(1)
                .filter_map(|i| i.get("filename").and_then(serde_json::Value::as_str))
                .map(PathBuf::from)
                .collect()
        })
        .unwrap_or_default())
}

/// Finds `binary` on `PATH` if it is a bare name.
fn resolve_binary(binary: &Path) -> Option<PathBuf> {
    if binary.components().count() > 1 {
        return Some(binary.to_owned());
    }
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|d| d.join(binary))
        .find(|p| p.is_file())
}

/// Checks, chowns and plans everything for a jailed spawn of `spec`. Runs
/// after the stale files of the run directory are gone.
pub async fn prepare(
    spec: &VmSpec,
    jail: &JailSpec,
    start: Start<'_>,
    accel: Accel,
    binary: &Path,
    inherit: &[std::os::fd::RawFd],
) -> Result<Prepared, VmmError> {
    let vm = spec.id;
    let invalid = |reason: String| VmmError::InvalidSpec { vm, reason };
    if jail.uid == 0 || jail.gid == 0 {
        return Err(invalid("a jail's uid and gid must not be 0".to_owned()));
    }
    let program = resolve_binary(binary).ok_or_else(|| {
        invalid(format!(
            "qemu binary {} not found on PATH",
            binary.display()
        ))
    })?;
    let io_err = |step: String| move |source: io::Error| VmmError::Jail { vm, step, source };

    // Read-only inputs must be readable by the jail user as they are.
    check_access(vm, jail, "kernel", &spec.kernel, Want::Read)?;
    check_access(vm, jail, "initrd", &spec.initrd, Want::Read)?;

    let mut entries: Vec<Entry> = Vec::new();
    for dir in SYSTEM_DIRS {
        let p = Path::new(dir);
        match std::fs::symlink_metadata(p) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(p).map_err(io_err(format!("read link {dir}")))?;
                entries.push(Entry::Symlink {
                    path: p.to_owned(),
                    target,
                });
            }
            Ok(m) if m.is_dir() => entries.push(Entry::Bind {
                path: p.to_owned(),
                dir: true,
                read_only: true,
            }),
            _ => {}
        }
    }
    for file in SYSTEM_FILES {
        if Path::new(file).is_file() {
            entries.push(Entry::Bind {
                path: file.into(),
                dir: false,
                read_only: true,
            });
        }
    }
    entries.push(Entry::Bind {
        path: program.clone(),
        dir: false,
        read_only: true,
    });
    let mut devices: Vec<&str> = DEVICES.to_vec();
    if accel == Accel::Kvm {
        devices.push("/dev/kvm");
    }
    for dev in devices {
        entries.push(Entry::Bind {
            path: dev.into(),
            dir: false,
            read_only: false,
        });
    }
    entries.push(Entry::Bind {
        path: spec.run_dir.clone(),
        dir: true,
        read_only: false,
    });
    entries.push(Entry::Bind {
        path: spec.kernel.clone(),
        dir: false,
        read_only: true,
    });
    entries.push(Entry::Bind {
        path: spec.initrd.clone(),
        dir: false,
        read_only: true,
    });

    // The run directory and what is in it: QEMU creates its sockets and
    // console log there (a restore appends to the log).
    let jail_root = spec.run_dir.join(JAIL_DIR);
    match std::fs::create_dir(&jail_root) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
            return Err(io_err(format!("create {}", jail_root.display()))(e))
        }
        _ => {}
    }
    chown(vm, jail, &spec.run_dir)?;
    let listing = std::fs::read_dir(&spec.run_dir)
        .map_err(io_err(format!("list {}", spec.run_dir.display())))?;
    for entry in listing.flatten() {
        if entry.path() != jail_root {
            chown(vm, jail, &entry.path())?;
        }
    }

    // Guest RAM.
    match start {
        Start::Restore(from) => match &from.memory {
            RestoreMemory::File(memory) | RestoreMemory::Private(memory) => {
                if from.memory.is_private() {
                    // Shared with other VMs: it must already be theirs to map.
                    check_access(vm, jail, "snapshot memory file", memory, Want::ReadWrite)?;
                } else {
                    chown(vm, jail, memory)?;
                }
                entries.push(Entry::Bind {
                    path: memory.clone(),
                    dir: false,
                    read_only: false,
                });
            }
            // Anonymous memory, or a template the VMM inherits as a
            // descriptor: no file.
            RestoreMemory::InState | RestoreMemory::Template(_) => {}
            // A new file, as for a cold boot's.
            RestoreMemory::Unpack(_) => new_memory_file(vm, jail, spec, &mut entries)?,
        },
        // Anonymous memory: no file.
        Start::Cold if !spec.memory_file => {}
        Start::Cold => new_memory_file(vm, jail, spec, &mut entries)?,
    }

    for disk in &spec.disks {
        match &disk.source {
            DiskSource::File { path, format } => {
                if disk.read_only {
                    check_access(vm, jail, "disk", path, Want::Read)?;
                } else {
                    chown(vm, jail, path)?;
                }
                entries.push(Entry::Bind {
                    path: path.clone(),
                    dir: false,
                    read_only: disk.read_only,
                });
                if *format == crate::DiskFormat::Qcow2 {
                    for backing in backing_chain(vm, path).await? {
                        check_access(vm, jail, "backing file", &backing, Want::Read)?;
                        entries.push(Entry::Bind {
                            path: backing,
                            dir: false,
                            read_only: true,
                        });
                    }
                }
            }
            DiskSource::Nbd { socket, .. } => {
                chown(vm, jail, socket)?;
                entries.push(Entry::Bind {
                    path: socket.clone(),
                    dir: false,
                    read_only: false,
                });
            }
        }
    }

    let plan = plan_mounts(&jail_root, &entries).map_err(invalid)?;
    let cgroups =
        Cgroups::create(Path::new(CGROUP_ROOT), vm, &jail.limits).map_err(|e| VmmError::Jail {
            vm,
            step: format!("create cgroups: {e}"),
            source: e.source,
        })?;
    let child = child_plan(vm, spec, jail, &plan, &cgroups, inherit);
    let child = match child {
        Ok(c) => c,
        Err(e) => {
            let _ = super::cgroup::remove_dirs(cgroups.dirs()).await;
            return Err(e);
        }
    };
    Ok(Prepared {
        report: child.1,
        child: child.0,
        cgroups,
        plan,
        program,
    })
}

/// The child's side of the plan, all strings and descriptors ready.
fn child_plan(
    vm: VmId,
    spec: &VmSpec,
    jail: &JailSpec,
    plan: &MountPlan,
    cgroups: &Cgroups,
    inherit: &[std::os::fd::RawFd],
) -> Result<(ChildJail, OwnedFd), VmmError> {
    let io_err = |step: &str| {
        let step = step.to_owned();
        move |source: io::Error| VmmError::Jail { vm, step, source }
    };
    let c = |p: &Path| -> Result<CString, VmmError> {
        sys::cstring(p).map_err(io_err(&format!("path {}", p.display())))
    };
    let mounts = plan
        .steps
        .iter()
        .map(|s| {
            Ok(match s {
                MountStep::Mkdir(p) => ChildMount::Mkdir(c(p)?),
                MountStep::Touch(p) => ChildMount::Touch(c(p)?),
                MountStep::Symlink { target, link } => ChildMount::Symlink {
                    target: c(target)?,
                    link: c(link)?,
                },
                MountStep::Bind { src, dst } => ChildMount::Bind {
                    src: c(src)?,
                    dst: c(dst)?,
                },
                MountStep::ReadOnly(p) => ChildMount::ReadOnly(c(p)?),
            })
        })
        .collect::<Result<Vec<_>, VmmError>>()?;
    let netns = match &spec.net {
        Some(net) => Some(OwnedFd::from(
            std::fs::File::open(&net.netns)
                .map_err(io_err(&format!("open netns {}", net.netns.display())))?,
        )),
        None => None,
    };
    let cgroup_procs = cgroups
        .open_procs()
        .map_err(|e| VmmError::Jail {
            vm,
            step: format!("open {}", e.path.display()),
            source: e.source,
        })?
        .into_iter()
        .map(OwnedFd::from)
        .collect();
    let (report_read, report) = sys::pipe().map_err(io_err("create the report pipe"))?;
    let (alive_read, alive_write) = sys::pipe().map_err(io_err("create the liveness pipe"))?;
    Ok((
        ChildJail {
            parent: std::process::id(),
            netns,
            cgroup_procs,
            report,
            alive_read,
            alive_write,
            root: c(&plan.root)?,
            mounts,
            uid: jail.uid,
            gid: jail.gid,
            inherit: inherit.to_vec(),
        },
        report_read,
    ))
}

/// What the children reported: QEMU's PID, or the step that failed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub vmm_pid: Option<u32>,
    pub failed: Option<(u32, i32)>,
}

/// Reads the report pipe to its end (every writer has exec'd or exited).
pub async fn read_report(fd: OwnedFd) -> io::Result<Report> {
    let bytes = tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut f = std::fs::File::from(fd);
        let mut buf = Vec::new();
        f.read_to_end(&mut buf).map(|_| buf)
    })
    .await
    .map_err(io::Error::other)??;
    let mut report = Report::default();
    for rec in bytes.chunks_exact(12) {
        let word = |i: usize| [rec[i], rec[i + 1], rec[i + 2], rec[i + 3]];
        let kind = u32::from_ne_bytes(word(0));
        let a = u32::from_ne_bytes(word(4));
        let b = i32::from_ne_bytes(word(8));
        match kind {
            sys::REPORT_PID => report.vmm_pid = Some(a),
            sys::REPORT_ERR => report.failed = report.failed.or(Some((a, b))),
            _ => {}
        }
    }
    Ok(report)
}

/// The name of a failed step.
pub fn describe_step(plan: &MountPlan, step: u32) -> String {
    if let Some(s) = sys::JailStep::from_code(step) {
        return s.describe().to_owned();
    }
    step.checked_sub(sys::MOUNT_STEP_BASE)
        .and_then(|i| plan.steps.get(i as usize))
        .map(MountStep::describe)
        .unwrap_or_else(|| format!("step {step}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bind(p: &str, dir: bool, ro: bool) -> Entry {
        Entry::Bind {
            path: p.into(),
            dir,
            read_only: ro,
        }
    }

    #[test]
    fn plan_creates_mount_points_binds_and_read_only_remounts_last() {
        let entries = [
            Entry::Symlink {
                path: "/lib".into(),
                target: "usr/lib".into(),
            },
            bind("/usr", true, true),
            bind("/dev/null", false, false),
            bind("/run/h/vm1", true, false),
            bind("/k/vmlinuz", false, true),
            // Visible through /usr or /lib already: skipped.
            bind("/usr/share/k/initrd", false, true),
            bind("/lib/k/initrd2", false, true),
            // Writable inside the writable run dir: skipped; read-only
            // inside it: bound over itself.
            bind("/run/h/vm1/disk.img", false, false),
            bind("/run/h/vm1/ro.img", false, true),
        ];
        let plan = plan_mounts(Path::new("/J"), &entries).expect("plan");
        let s = |x: &str| PathBuf::from(x);
        use MountStep::*;
        assert_eq!(
            plan.steps,
            vec![
                Symlink {
                    target: s("usr/lib"),
                    link: s("/J/lib")
                },
                Mkdir(s("/J/usr")),
                Bind {
                    src: s("/usr"),
                    dst: s("/J/usr")
                },
                Mkdir(s("/J/dev")),
                Touch(s("/J/dev/null")),
                Bind {
                    src: s("/dev/null"),
                    dst: s("/J/dev/null")
                },
                Mkdir(s("/J/run")),
                Mkdir(s("/J/run/h")),
                Mkdir(s("/J/run/h/vm1")),
                Bind {
                    src: s("/run/h/vm1"),
                    dst: s("/J/run/h/vm1")
                },
                Mkdir(s("/J/k")),
                Touch(s("/J/k/vmlinuz")),
                Bind {
                    src: s("/k/vmlinuz"),
                    dst: s("/J/k/vmlinuz")
                },
                Bind {
                    src: s("/run/h/vm1/ro.img"),
                    dst: s("/J/run/h/vm1/ro.img")
                },
                Mkdir(s("/J/proc")),
                ReadOnly(s("/J/usr")),
                ReadOnly(s("/J/k/vmlinuz")),
                ReadOnly(s("/J/run/h/vm1/ro.img")),
            ]
        );
    }

    #[test]
    fn plan_refuses_writable_paths_under_read_only_ones_and_odd_paths() {
        let under_usr = [bind("/usr", true, true), bind("/usr/x/mem", false, false)];
        assert!(plan_mounts(Path::new("/J"), &under_usr).is_err());
        for odd in ["relative", "/a/../b", "/"] {
            assert!(
                plan_mounts(Path::new("/J"), &[bind(odd, false, true)]).is_err(),
                "{odd}"
            );
        }
    }

    #[test]
    fn access_follows_the_owner_group_other_classes() {
        let dir = std::env::temp_dir().join(format!("hearth-jail-access-{}", VmId::new()));
        std::fs::create_dir_all(&dir).ok();
        let f = dir.join("f");
        std::fs::write(&f, b"x").ok();
        let jail = JailSpec {
            uid: 4242,
            gid: 4242,
            limits: crate::Limits {
                cpu: hearth_types::MilliCpu(1000),
                memory_max: hearth_types::ByteSize::mib(256),
                pids_max: 64,
            },
        };
        use std::os::unix::fs::PermissionsExt;
        let mode = |m: u32| std::fs::set_permissions(&f, std::fs::Permissions::from_mode(m)).ok();
        let meta = || std::fs::metadata(&f).expect("stat");
        mode(0o600);
        // Owned by the test's user, not the jail's: only "other" counts.
        assert!(!allowed(&meta(), &jail, Want::Read));
        mode(0o644);
        assert!(allowed(&meta(), &jail, Want::Read));
        assert!(!allowed(&meta(), &jail, Want::ReadWrite));
        mode(0o666);
        assert!(allowed(&meta(), &jail, Want::ReadWrite));
        std::fs::remove_dir_all(&dir).ok();
    }
}
