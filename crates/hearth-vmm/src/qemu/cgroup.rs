//! The cgroups of a jailed QEMU: CPU quota, memory limit and pids limit,
//! under `hearth/<vm id>` in either cgroup layout.
//!
//! - **v1** (separate hierarchies, e.g. `/sys/fs/cgroup/{cpu,memory,pids}`):
//!   `cpu.cfs_period_us` and `cpu.cfs_quota_us`, `memory.limit_in_bytes`
//!   (and `memory.memsw.limit_in_bytes`, the same value, when swap
//!   accounting exists), `pids.max`.
//! - **v2** (unified: `<root>/cgroup.controllers` exists): `+cpu +memory
//!   +pids` enabled in the parents' `cgroup.subtree_control`, then
//!   `cpu.max`, `memory.max`, `memory.swap.max` (0: the limit holds for RAM
//!   and swap together, as memsw does in v1) and `pids.max`.
//!
//! The process joins by writing to each group's `cgroup.procs`; the
//! descriptors are opened here, before the fork, and written in the child
//! ([`super::sys`]). The directories are removed once QEMU has exited.
//!
//! Everything takes the cgroup root as a parameter, so both layouts are
//! unit-tested against a temporary directory tree (v2 cannot be exercised
//! on a v1 host).

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hearth_types::VmId;

use crate::Limits;

/// Where cgroup file systems are mounted.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// CPU quota period: 100 ms.
pub const CPU_PERIOD_US: u64 = 100_000;
/// How long [`Cgroups::remove`] retries a busy group (the last process may
/// still be exiting).
const REMOVE_WAIT: Duration = Duration::from_secs(5);

/// A failed cgroup operation, with the file it was about.
#[derive(Debug, thiserror::Error)]
#[error("{what} {path}")]
pub struct CgroupError {
    pub what: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

fn err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> CgroupError {
    let path = path.to_owned();
    move |source| CgroupError { what, path, source }
}

/// The VM's cgroup directories, created and limited, not yet joined.
#[derive(Debug)]
pub struct Cgroups {
    /// One directory per hierarchy (one in v2), leaf last in each.
    dirs: Vec<PathBuf>,
}

impl Cgroups {
    /// Creates `hearth/<vm>` under `root` in each hierarchy the limits need
    /// and writes the limits.
    pub fn create(root: &Path, vm: VmId, limits: &Limits) -> Result<Self, CgroupError> {
        let rel = Path::new("hearth").join(vm.to_string());
        let quota = u64::from(limits.cpu.0) * (CPU_PERIOD_US / 1000);
        let mem = limits.memory_max.bytes().to_string();
        let pids = limits.pids_max.to_string();
        let mut made = Self { dirs: Vec::new() };
        if root.join("cgroup.controllers").exists() {
            // v2: controllers must be enabled top-down.
            let parent = root.join("hearth");
            std::fs::create_dir_all(&parent).map_err(err("create", &parent))?;
            for dir in [root, parent.as_path()] {
                let control = dir.join("cgroup.subtree_control");
                std::fs::write(&control, "+cpu +memory +pids").map_err(err("write", &control))?;
            }
            let dir = root.join(&rel);
            make_leaf(&dir, &mut made)?;
            write(&dir, "cpu.max", &format!("{quota} {CPU_PERIOD_US}"))?;
            write(&dir, "memory.max", &mem)?;
            if dir.join("memory.swap.max").exists() {
                write(&dir, "memory.swap.max", "0")?;
            }
            write(&dir, "pids.max", &pids)?;
        } else {
            let cpu = root.join("cpu").join(&rel);
            make_leaf(&cpu, &mut made)?;
            write(&cpu, "cpu.cfs_period_us", &CPU_PERIOD_US.to_string())?;
            write(&cpu, "cpu.cfs_quota_us", &quota.to_string())?;
            let memory = root.join("memory").join(&rel);
            make_leaf(&memory, &mut made)?;
            write(&memory, "memory.limit_in_bytes", &mem)?;
            if memory.join("memory.memsw.limit_in_bytes").exists() {
                write(&memory, "memory.memsw.limit_in_bytes", &mem)?;
            }
            let pids_dir = root.join("pids").join(&rel);
            make_leaf(&pids_dir, &mut made)?;
            write(&pids_dir, "pids.max", &pids)?;
        }
        Ok(made)
    }

    /// The leaf directories (one per hierarchy).
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Each leaf's `cgroup.procs`, open for writing: a process joins all
    /// groups by writing `0` to each.
    pub fn open_procs(&self) -> Result<Vec<File>, CgroupError> {
        self.dirs
            .iter()
            .map(|d| {
                let p = d.join("cgroup.procs");
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&p)
                    .map_err(err("open", &p))
            })
            .collect()
    }

    /// Removes the leaf directories, waiting while they are busy (the last
    /// process of the group may still be exiting).
    pub async fn remove(&self) -> Result<(), CgroupError> {
        remove_dirs(&self.dirs).await
    }
}

/// Removes what a jailed VMM of `vm` left under `root` when its host agent
/// died before cleaning up (the VMM died with it, so the groups are
/// empty): `hearth/<vm>` in the unified hierarchy and in every v1 one.
pub async fn remove_stale(root: &Path, vm: VmId) -> Result<(), CgroupError> {
    let rel = Path::new("hearth").join(vm.to_string());
    let mut dirs = vec![root.join(&rel)];
    if let Ok(entries) = std::fs::read_dir(root) {
        dirs.extend(entries.flatten().map(|e| e.path().join(&rel)));
    }
    dirs.retain(|d| d.is_dir());
    remove_dirs(&dirs).await
}

/// Removes cgroup directories (retrying while busy); absent ones are fine.
pub async fn remove_dirs(dirs: &[PathBuf]) -> Result<(), CgroupError> {
    let started = Instant::now();
    for dir in dirs {
        loop {
            match std::fs::remove_dir(dir) {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                Err(e)
                    if e.raw_os_error() == Some(libc::EBUSY) && started.elapsed() < REMOVE_WAIT =>
                {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(e) => return Err(err("remove", dir)(e)),
            }
        }
    }
    Ok(())
}

fn make_leaf(dir: &Path, made: &mut Cgroups) -> Result<(), CgroupError> {
    // A leftover group of an earlier run of the same VM is reused: its
    // limits are rewritten below.
    std::fs::create_dir_all(dir).map_err(err("create", dir))?;
    made.dirs.push(dir.to_owned());
    Ok(())
}

fn write(dir: &Path, file: &str, value: &str) -> Result<(), CgroupError> {
    let path = dir.join(file);
    std::fs::write(&path, value).map_err(err("write", &path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_types::{ByteSize, MilliCpu};

    fn limits() -> Limits {
        Limits {
            cpu: MilliCpu(1500),
            memory_max: ByteSize::mib(640),
            pids_max: 128,
        }
    }

    fn tmp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("hearth-cg-{name}-{}", VmId::new()));
        std::fs::create_dir_all(&dir).ok();
        dir
    }

    fn read(p: PathBuf) -> String {
        std::fs::read_to_string(&p).unwrap_or_else(|e| format!("unreadable {p:?}: {e}"))
    }

    #[tokio::test]
    async fn v2_enables_controllers_top_down_and_writes_limits() {
        let root = tmp("v2");
        std::fs::write(root.join("cgroup.controllers"), "cpu memory pids").ok();
        let vm = VmId::new();
        // A real kernel makes this file in every new group; a plain
        // directory tree does not, so the swap limit is written only when
        // the file is there.
        std::fs::create_dir_all(root.join("hearth").join(vm.to_string())).ok();
        std::fs::write(
            root.join("hearth")
                .join(vm.to_string())
                .join("memory.swap.max"),
            "max",
        )
        .ok();
        let cg = Cgroups::create(&root, vm, &limits()).expect("create");
        let leaf = root.join("hearth").join(vm.to_string());
        assert_eq!(cg.dirs(), std::slice::from_ref(&leaf));
        assert_eq!(
            read(root.join("cgroup.subtree_control")),
            "+cpu +memory +pids"
        );
        assert_eq!(
            read(root.join("hearth/cgroup.subtree_control")),
            "+cpu +memory +pids"
        );
        assert_eq!(read(leaf.join("cpu.max")), "150000 100000");
        assert_eq!(read(leaf.join("memory.max")), (640u64 << 20).to_string());
        assert_eq!(read(leaf.join("memory.swap.max")), "0");
        assert_eq!(read(leaf.join("pids.max")), "128");
        std::fs::remove_dir_all(&root).ok();
    }

    #[tokio::test]
    async fn v1_writes_each_hierarchy_and_memsw_only_when_present() {
        for memsw in [false, true] {
            let root = tmp("v1");
            let vm = VmId::new();
            let leaf = |h: &str| root.join(h).join("hearth").join(vm.to_string());
            if memsw {
                std::fs::create_dir_all(leaf("memory")).ok();
                std::fs::write(leaf("memory").join("memory.memsw.limit_in_bytes"), "").ok();
            }
            let cg = Cgroups::create(&root, vm, &limits()).expect("create");
            assert_eq!(cg.dirs(), [leaf("cpu"), leaf("memory"), leaf("pids")]);
            assert_eq!(read(leaf("cpu").join("cpu.cfs_period_us")), "100000");
            assert_eq!(read(leaf("cpu").join("cpu.cfs_quota_us")), "150000");
            let mem = (640u64 << 20).to_string();
            assert_eq!(read(leaf("memory").join("memory.limit_in_bytes")), mem);
            assert_eq!(
                leaf("memory").join("memory.memsw.limit_in_bytes").exists(),
                memsw
            );
            if memsw {
                assert_eq!(
                    read(leaf("memory").join("memory.memsw.limit_in_bytes")),
                    mem
                );
            }
            assert_eq!(read(leaf("pids").join("pids.max")), "128");
            std::fs::remove_dir_all(&root).ok();
        }
    }

    #[tokio::test]
    async fn removing_absent_groups_is_fine() {
        let root = tmp("rm");
        let dirs = vec![root.join("a"), root.join("b")];
        std::fs::create_dir_all(&dirs[0]).ok();
        remove_dirs(&dirs).await.expect("remove");
        assert!(!dirs[0].exists());
        std::fs::remove_dir_all(&root).ok();
    }
}
