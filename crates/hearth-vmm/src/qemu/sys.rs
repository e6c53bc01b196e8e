//! The raw system calls of the QEMU backend's spawn and devices: the TAP
//! device of a NIC, descriptor inheritance, pidfds, and the steps of a
//! jailed spawn that run between fork and exec
//! ([`jail_pre_exec`]).
//!
//! Code that runs in a forked child of a multi-threaded process may only
//! make async-signal-safe calls: no allocation, no locks. Everything such
//! code touches (C strings, descriptors) is prepared before the fork, and its
//! errors are raw OS codes.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

/// `TUNSETIFF`: `_IOW('T', 202, int)`.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;

/// Opens the TAP device `tap` of the network namespace `netns` and returns
/// its descriptor (close-on-exec). The namespace switch happens on a
/// short-lived thread of its own, so no thread of the caller (nor of any
/// pool) ever changes namespace.
pub fn open_tap(netns: &Path, tap: &str) -> io::Result<OwnedFd> {
    let netns: PathBuf = netns.to_owned();
    let tap = tap.to_owned();
    let thread = std::thread::Builder::new()
        .name("hearth-open-tap".to_owned())
        .spawn(move || open_tap_here(&netns, &tap))?;
    thread
        .join()
        .map_err(|_| io::Error::other("the thread opening the tap panicked"))?
}

/// [`open_tap`] on the current thread, which it moves into `netns` for good.
fn open_tap_here(netns: &Path, tap: &str) -> io::Result<OwnedFd> {
    let ns = File::open(netns)?;
    // SAFETY: setns takes a valid open descriptor (`ns` lives until the end
    // of this function) and a flag; it only changes this thread's network
    // namespace, and this thread exits right after.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let tun = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")?;
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let name = tap.as_bytes();
    if name.len() >= req.ifr_name.len() || name.contains(&0) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    for (dst, src) in req.ifr_name.iter_mut().zip(name) {
        *dst = *src as libc::c_char;
    }
    // No IFF_VNET_HDR: QEMU probes the descriptor and works without it.
    req.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF reads (and may write back) one `struct ifreq`,
    // which `req` is, for the lifetime of the call; `tun` is open.
    if unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETIFF as _, &mut req) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(OwnedFd::from(tun))
}

/// Clears `FD_CLOEXEC` on `fd`, so that the program the (forked) caller
/// execs inherits it. Async-signal-safe.
pub fn inherit_fd(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl with F_GETFD/F_SETFD only reads and writes the
    // descriptor's flags; an invalid fd is reported as EBADF.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFD);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Sets `PR_SET_PDEATHSIG=SIGKILL` in the forked child and checks that the
/// parent is still `parent` (if it died before the prctl, no signal would
/// ever come). Async-signal-safe.
pub fn die_with_parent(parent: u32) -> io::Result<()> {
    set_pdeathsig()?;
    // SAFETY: getppid has no preconditions and cannot fail.
    let ppid = unsafe { libc::getppid() };
    if u32::try_from(ppid).ok() != Some(parent) {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    Ok(())
}

fn set_pdeathsig() -> io::Result<()> {
    // SAFETY: prctl(PR_SET_PDEATHSIG, sig) reads only its integer arguments.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A pidfd for `pid` (`pidfd_open`): signals sent through it can only
/// reach that process, never a later one with a recycled PID.
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor
    // or -1; nothing else is touched.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel just returned this descriptor, and nothing else
    // owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sends SIGKILL to the process behind `pidfd`.
pub fn pidfd_kill(pidfd: &OwnedFd) -> io::Result<()> {
    // SAFETY: pidfd_send_signal takes a valid descriptor (borrowed for the
    // call), a signal number, a null siginfo (allowed) and flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A pipe, both ends close-on-exec: `(read, write)`.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into the two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned these descriptors; nothing else owns
    // them.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A C string of `path`, for calls made after fork.
pub fn cstring(path: &Path) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))
}

/// What a jailed spawn's child processes report on the report pipe: 12-byte
/// records `[kind u32][a u32][b i32]`, native endian.
pub const REPORT_PID: u32 = 1;
/// `a` = the failed step ([`JailStep`] or `MOUNT_STEP_BASE + i`), `b` = errno.
pub const REPORT_ERR: u32 = 2;
/// Step numbers from here on are the child plan's mount steps, by index.
pub const MOUNT_STEP_BASE: u32 = 1000;

/// The fixed steps of a jailed spawn, as reported on failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum JailStep {
    DeathSignal = 1,
    JoinNetns,
    UnshareNet,
    JoinCgroup,
    UnsharePid,
    Fork,
    UnshareMountIpcUts,
    PrivateMounts,
    MountRoot,
    RemountReadOnly,
    PivotRoot,
    MountProc,
    DropBoundingSet,
    ClearAmbient,
    SetGroups,
    SetGid,
    SetUid,
    ClearCapabilities,
    NoNewPrivs,
    InheritFd,
}

impl JailStep {
    const ALL: [JailStep; 20] = [
        Self::DeathSignal,
        Self::JoinNetns,
        Self::UnshareNet,
        Self::JoinCgroup,
        Self::UnsharePid,
        Self::Fork,
        Self::UnshareMountIpcUts,
        Self::PrivateMounts,
        Self::MountRoot,
        Self::RemountReadOnly,
        Self::PivotRoot,
        Self::MountProc,
        Self::DropBoundingSet,
        Self::ClearAmbient,
        Self::SetGroups,
        Self::SetGid,
        Self::SetUid,
        Self::ClearCapabilities,
        Self::NoNewPrivs,
        Self::InheritFd,
    ];

    pub fn from_code(code: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|s| *s as u32 == code)
    }

    pub fn describe(self) -> &'static str {
        match self {
            Self::DeathSignal => "set the parent-death signal",
            Self::JoinNetns => "enter the vm's network namespace",
            Self::UnshareNet => "create an empty network namespace",
            Self::JoinCgroup => "join the vm's cgroups",
            Self::UnsharePid => "create a pid namespace",
            Self::Fork => "fork the vmm process",
            Self::UnshareMountIpcUts => "create mount, ipc and uts namespaces",
            Self::PrivateMounts => "make mounts private",
            Self::MountRoot => "mount the jail's tmpfs root",
            Self::RemountReadOnly => "remount a bind mount read-only",
            Self::PivotRoot => "pivot_root into the jail",
            Self::MountProc => "mount /proc",
            Self::DropBoundingSet => "drop the capability bounding set",
            Self::ClearAmbient => "clear ambient capabilities",
            Self::SetGroups => "clear supplementary groups",
            Self::SetGid => "set the jail gid",
            Self::SetUid => "set the jail uid",
            Self::ClearCapabilities => "clear capabilities",
            Self::NoNewPrivs => "set no_new_privs",
            Self::InheritFd => "pass a descriptor (tap, memory template)",
        }
    }
}

/// One step of building the jail's root, with paths already under the new
/// root (before `pivot_root`).
#[derive(Debug)]
pub enum ChildMount {
    Mkdir(CString),
    /// An empty file to bind a file onto.
    Touch(CString),
    Symlink {
        target: CString,
        link: CString,
    },
    Bind {
        src: CString,
        dst: CString,
    },
    /// Remount a bind read-only (after every bind is in place).
    ReadOnly(CString),
}

/// Everything the children of a jailed spawn need, prepared before the
/// fork so that they allocate nothing.
#[derive(Debug)]
pub struct ChildJail {
    /// PID of the spawning process, for the parent-death check.
    pub parent: u32,
    /// The VM's network namespace; `None`: a new empty one.
    pub netns: Option<OwnedFd>,
    /// `cgroup.procs` of each of the VM's cgroups, open for writing.
    pub cgroup_procs: Vec<OwnedFd>,
    /// Write end of the report pipe (close-on-exec).
    pub report: OwnedFd,
    /// A pipe whose write end only the intermediate process keeps: the VMM
    /// sees it hang up if the intermediate died before the VMM set its
    /// parent-death signal.
    pub alive_read: OwnedFd,
    pub alive_write: OwnedFd,
    /// The jail's root directory (a tmpfs is mounted on it).
    pub root: CString,
    pub mounts: Vec<ChildMount>,
    pub uid: u32,
    pub gid: u32,
    /// Descriptors QEMU inherits (a NIC's TAP, a memory template).
    pub inherit: Vec<RawFd>,
}

const TMPFS: &std::ffi::CStr = c"tmpfs";
const TMPFS_OPTS: &std::ffi::CStr = c"mode=0755,size=1m";
const PROC: &std::ffi::CStr = c"proc";
const PROC_DIR: &std::ffi::CStr = c"/proc";
const SLASH: &std::ffi::CStr = c"/";
const DOT: &std::ffi::CStr = c".";
const JAIL_NAME: &std::ffi::CStr = c"hearth-jail";

/// Writes one report record; errors are ignored (the spawn fails anyway).
fn report(fd: RawFd, kind: u32, a: u32, b: i32) {
    let mut rec = [0u8; 12];
    rec[..4].copy_from_slice(&kind.to_ne_bytes());
    rec[4..8].copy_from_slice(&a.to_ne_bytes());
    rec[8..].copy_from_slice(&b.to_ne_bytes());
    // SAFETY: write reads 12 bytes from a live stack buffer.
    unsafe {
        libc::write(fd, rec.as_ptr().cast(), rec.len());
    }
}

/// `Err` of the last OS error, reported as step `step` first.
fn fail(fd: RawFd, step: u32) -> io::Error {
    let err = io::Error::last_os_error();
    report(fd, REPORT_ERR, step, err.raw_os_error().unwrap_or(0));
    err
}

fn check(rc: libc::c_int, fd: RawFd, step: JailStep) -> io::Result<()> {
    if rc < 0 {
        return Err(fail(fd, step as u32));
    }
    Ok(())
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_VERSION_3: u32 = 0x2008_0522;

/// The `pre_exec` of a jailed spawn. See [`super::jail`] for the design.
///
/// In the forked child (the *intermediate*): parent-death signal, network
/// namespace, cgroups, a new PID namespace, then a second fork. The
/// intermediate never returns: it reports the VMM's PID, waits for it and
/// exits as it did. The grandchild (PID 1 of the new namespace, the VMM)
/// builds its root, drops every privilege and returns `Ok`, and the caller
/// execs QEMU. Async-signal-safe throughout: it only makes system calls on
/// data prepared before the fork.
pub fn jail_pre_exec(j: &ChildJail) -> io::Result<()> {
    let rep = j.report.as_raw_fd();
    if let Err(e) = die_with_parent(j.parent) {
        report(
            rep,
            REPORT_ERR,
            JailStep::DeathSignal as u32,
            e.raw_os_error().unwrap_or(0),
        );
        return Err(e);
    }
    // SAFETY: (whole block) plain system calls on descriptors this struct
    // owns and on NUL-terminated strings it owns; no allocation, no locks,
    // so they are safe between fork and exec of a multi-threaded parent.
    unsafe {
        match &j.netns {
            Some(ns) => check(
                libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET),
                rep,
                JailStep::JoinNetns,
            )?,
            None => check(libc::unshare(libc::CLONE_NEWNET), rep, JailStep::UnshareNet)?,
        }
        for procs in &j.cgroup_procs {
            let zero = b"0";
            if libc::write(procs.as_raw_fd(), zero.as_ptr().cast(), zero.len()) < 0 {
                return Err(fail(rep, JailStep::JoinCgroup as u32));
            }
        }
        check(libc::unshare(libc::CLONE_NEWPID), rep, JailStep::UnsharePid)?;
        let pid = libc::fork();
        if pid < 0 {
            return Err(fail(rep, JailStep::Fork as u32));
        }
        if pid > 0 {
            intermediate(j, pid)
        }
    }
    vmm_child(j)
}

/// The intermediate process: reports the VMM's PID, then mirrors its end.
/// Never returns.
fn intermediate(j: &ChildJail, pid: libc::pid_t) -> ! {
    let rep = j.report.as_raw_fd();
    let keep_a = rep.min(j.alive_write.as_raw_fd());
    let keep_b = rep.max(j.alive_write.as_raw_fd());
    // SAFETY: system calls on integers and on stack buffers; closing every
    // other descriptor (std's exec-status pipe among them, which would
    // otherwise keep the parent's spawn waiting for this process) is what
    // this process wants, and it never touches them again.
    unsafe {
        libc::close_range(3, (keep_a - 1) as libc::c_uint, 0);
        libc::close_range(
            (keep_a + 1) as libc::c_uint,
            (keep_b - 1) as libc::c_uint,
            0,
        );
        libc::close_range((keep_b + 1) as libc::c_uint, libc::c_uint::MAX, 0);
        report(rep, REPORT_PID, pid as u32, 0);
        libc::close(rep);
        libc::prctl(libc::PR_SET_NAME, JAIL_NAME.as_ptr(), 0, 0, 0);
        let mut status = 0;
        loop {
            let r = libc::waitpid(pid, &mut status, 0);
            if r == pid {
                break;
            }
            if r < 0 && *libc::__errno_location() != libc::EINTR {
                libc::_exit(127);
            }
        }
        if libc::WIFEXITED(status) {
            libc::_exit(libc::WEXITSTATUS(status));
        }
        let sig = libc::WTERMSIG(status);
        // End the same way, so the host sees QEMU's own signal.
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::kill(libc::getpid(), sig);
        libc::_exit(128 + sig)
    }
}

/// The VMM process before exec: root, then privileges.
fn vmm_child(j: &ChildJail) -> io::Result<()> {
    let rep = j.report.as_raw_fd();
    // SAFETY: (whole block) system calls on descriptors and NUL-terminated
    // strings owned by `j`, and on stack values; no allocation, no locks.
    unsafe {
        libc::close(j.alive_write.as_raw_fd());
        check(
            set_pdeathsig().map_or(-1, |()| 0),
            rep,
            JailStep::DeathSignal,
        )?;

        check(
            libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS),
            rep,
            JailStep::UnshareMountIpcUts,
        )?;
        let none = std::ptr::null::<libc::c_char>();
        check(
            libc::mount(
                none,
                SLASH.as_ptr(),
                none,
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ),
            rep,
            JailStep::PrivateMounts,
        )?;
        check(
            libc::mount(
                TMPFS.as_ptr(),
                j.root.as_ptr(),
                TMPFS.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                TMPFS_OPTS.as_ptr().cast(),
            ),
            rep,
            JailStep::MountRoot,
        )?;
        // The jail's directories must be traversable by the jail user
        // whatever umask the host agent runs with (Hearth's is 077).
        let saved_umask = libc::umask(0o022);
        for (i, m) in j.mounts.iter().enumerate() {
            let step = MOUNT_STEP_BASE + i as u32;
            let rc = match m {
                ChildMount::Mkdir(p) => {
                    let rc = libc::mkdir(p.as_ptr(), 0o755);
                    if rc < 0 && *libc::__errno_location() == libc::EEXIST {
                        0
                    } else {
                        rc
                    }
                }
                ChildMount::Touch(p) => {
                    let fd = libc::open(
                        p.as_ptr(),
                        libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                        0o644,
                    );
                    if fd >= 0 {
                        libc::close(fd);
                    }
                    fd
                }
                ChildMount::Symlink { target, link } => {
                    libc::symlink(target.as_ptr(), link.as_ptr())
                }
                ChildMount::Bind { src, dst } => libc::mount(
                    src.as_ptr(),
                    dst.as_ptr(),
                    none,
                    libc::MS_BIND,
                    std::ptr::null(),
                ),
                ChildMount::ReadOnly(p) => libc::mount(
                    none,
                    p.as_ptr(),
                    none,
                    libc::MS_REMOUNT
                        | libc::MS_BIND
                        | libc::MS_RDONLY
                        | libc::MS_NOSUID
                        | libc::MS_NODEV,
                    std::ptr::null(),
                ),
            };
            if rc < 0 {
                return Err(fail(rep, step));
            }
        }
        libc::umask(saved_umask);
        check(libc::chdir(j.root.as_ptr()), rep, JailStep::PivotRoot)?;
        check(
            libc::syscall(libc::SYS_pivot_root, DOT.as_ptr(), DOT.as_ptr()) as libc::c_int,
            rep,
            JailStep::PivotRoot,
        )?;
        check(
            libc::umount2(DOT.as_ptr(), libc::MNT_DETACH),
            rep,
            JailStep::PivotRoot,
        )?;
        check(libc::chdir(SLASH.as_ptr()), rep, JailStep::PivotRoot)?;
        check(
            libc::mount(
                PROC.as_ptr(),
                PROC_DIR.as_ptr(),
                PROC.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            ),
            rep,
            JailStep::MountProc,
        )?;
        check(
            libc::mount(
                none,
                SLASH.as_ptr(),
                none,
                libc::MS_REMOUNT
                    | libc::MS_BIND
                    | libc::MS_RDONLY
                    | libc::MS_NOSUID
                    | libc::MS_NODEV,
                std::ptr::null(),
            ),
            rep,
            JailStep::RemountReadOnly,
        )?;

        // Privileges: bounding set first (needs CAP_SETPCAP), then ids
        // (which clear the effective, permitted and ambient sets), then the
        // inheritable set, then no_new_privs.
        let mut cap = 0;
        loop {
            if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 {
                if *libc::__errno_location() == libc::EINVAL && cap > 0 {
                    break; // past the last capability this kernel knows
                }
                return Err(fail(rep, JailStep::DropBoundingSet as u32));
            }
            cap += 1;
        }
        check(
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            ),
            rep,
            JailStep::ClearAmbient,
        )?;
        check(
            libc::setgroups(0, std::ptr::null()),
            rep,
            JailStep::SetGroups,
        )?;
        check(libc::setresgid(j.gid, j.gid, j.gid), rep, JailStep::SetGid)?;
        check(libc::setresuid(j.uid, j.uid, j.uid), rep, JailStep::SetUid)?;
        let header = CapHeader {
            version: CAP_VERSION_3,
            pid: 0,
        };
        let data = [CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        check(
            libc::syscall(libc::SYS_capset, &header, data.as_ptr()) as libc::c_int,
            rep,
            JailStep::ClearCapabilities,
        )?;
        check(
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0),
            rep,
            JailStep::NoNewPrivs,
        )?;
        // Changing the uid cleared the parent-death signal: set it again,
        // then make sure the intermediate is still there to deliver it.
        check(
            set_pdeathsig().map_or(-1, |()| 0),
            rep,
            JailStep::DeathSignal,
        )?;
        let mut pfd = libc::pollfd {
            fd: j.alive_read.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // The intermediate keeps the write end for its whole life: a hang-up
        // means it is already gone, and the signal set above never comes.
        if libc::poll(&mut pfd, 1, 0) > 0 && pfd.revents & libc::POLLHUP != 0 {
            libc::_exit(1);
        }
        libc::close(j.alive_read.as_raw_fd());
    }
    for &fd in &j.inherit {
        if let Err(e) = inherit_fd(fd) {
            report(
                rep,
                REPORT_ERR,
                JailStep::InheritFd as u32,
                e.raw_os_error().unwrap_or(0),
            );
            return Err(e);
        }
    }
    Ok(())
}
