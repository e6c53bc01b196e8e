//! Every raw system call of the QEMU backend, and so every `unsafe` block of
//! it: the TAP device of a NIC, descriptor inheritance, pidfds, and the
//! steps of a jailed spawn that run between fork and exec
//! ([`jail_pre_exec`]).
//!
//! Code that runs in a forked child of a multi-threaded process may only
//! make async-signal-safe calls: no allocation, no locks. Everything such
//! code touches (C strings, descriptors) is prepared before the fork, and its
//! errors are raw OS codes.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
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
