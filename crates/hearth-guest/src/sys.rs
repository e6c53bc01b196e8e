//! The few raw system calls the guest agent needs, each wrapped once.
//! Most of this crate's `unsafe` lives here; the rest sits beside the one
//! use it serves (`exec.rs`, `watch.rs`), as docs/architecture/invariants.md
//! lists.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Reads at most `max` bytes from `fd` into the spare capacity of `buf`
/// (reserving it first), without zero-filling it: under emulation every pass
/// over a payload is a large share of a transfer's cost. Returns the number
/// of bytes read; 0 is end of file.
pub fn read_into(fd: &impl AsRawFd, buf: &mut bytes::BytesMut, max: usize) -> io::Result<usize> {
    buf.reserve(max);
    let spare = buf.spare_capacity_mut();
    let want = spare.len().min(max);
    // SAFETY: `spare` is valid for writes of `want` bytes; read(2) writes at
    // most that many and reports how many it wrote, which are then
    // initialized and may be exposed with set_len.
    let n = unsafe { libc::read(fd.as_raw_fd(), spare.as_mut_ptr().cast(), want) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    // SAFETY: the first `n` spare bytes were just initialized by read(2).
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

fn cstr(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in string"))
}

pub fn mount(
    src: &str,
    target: &str,
    fstype: &str,
    flags: libc::c_ulong,
    data: &str,
) -> io::Result<()> {
    let (src, target, fstype, data) = (cstr(src)?, cstr(target)?, cstr(fstype)?, cstr(data)?);
    // SAFETY: all pointers are valid NUL-terminated strings that outlive the call.
    check(unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    })
    .map(drop)
}

pub fn umount_detach(target: &str) -> io::Result<()> {
    let target = cstr(target)?;
    // SAFETY: valid NUL-terminated path.
    check(unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) }).map(drop)
}

pub fn chroot_here() -> io::Result<()> {
    let dot = cstr(".")?;
    // SAFETY: valid NUL-terminated path.
    check(unsafe { libc::chroot(dot.as_ptr()) }).map(drop)
}

/// Loads a kernel module from an open file. `EEXIST` (already loaded or
/// built in) is success.
pub fn finit_module(file: &std::fs::File) -> io::Result<()> {
    let empty = cstr("")?;
    // SAFETY: finit_module takes an fd, a NUL-terminated parameter string and flags.
    let ret = unsafe { libc::syscall(libc::SYS_finit_module, file.as_raw_fd(), empty.as_ptr(), 0) };
    if ret < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EEXIST) {
            return Ok(());
        }
        return Err(e);
    }
    Ok(())
}

pub fn power_off() -> ! {
    // SAFETY: sync and reboot have no memory-safety preconditions.
    unsafe {
        libc::sync();
        libc::reboot(libc::RB_POWER_OFF);
    }
    // reboot only returns on failure; there is nothing left to do.
    std::process::exit(1)
}

pub fn sync() {
    // SAFETY: no preconditions.
    unsafe { libc::sync() }
}

/// Sets the wall clock (CLOCK_REALTIME) to `ms` Unix milliseconds.
pub fn set_realtime_ms(ms: u64) -> io::Result<()> {
    let ts = libc::timespec {
        tv_sec: (ms / 1000) as libc::time_t,
        tv_nsec: ((ms % 1000) * 1_000_000) as libc::c_long,
    };
    // SAFETY: `ts` is a valid timespec that outlives the call.
    check(unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) }).map(drop)
}

/// Steps the wall clock (CLOCK_REALTIME) by `secs` seconds plus `micros`
/// microseconds (`0 <= micros < 1e6`; a negative step has negative
/// `secs`), atomically: the kernel adds it to the clock as it stands, so
/// the time between a caller's reading and this call is not lost. (Not
/// `ADJ_NANO`: it would also switch the kernel's NTP status to
/// nanoseconds for every later `adjtimex` caller in the guest.)
pub fn step_realtime(secs: i64, micros: i64) -> io::Result<()> {
    // SAFETY: timex is plain data; all-zero is a valid value.
    let mut tx: libc::timex = unsafe { std::mem::zeroed() };
    tx.modes = libc::ADJ_SETOFFSET;
    tx.time.tv_sec = secs as libc::time_t;
    tx.time.tv_usec = micros as libc::suseconds_t;
    // SAFETY: `tx` is a valid timex that outlives the call.
    check(unsafe { libc::clock_adjtime(libc::CLOCK_REALTIME, &mut tx) }).map(drop)
}

pub fn sethostname(name: &str) -> io::Result<()> {
    // SAFETY: pointer and length describe a valid byte slice.
    check(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) }).map(drop)
}

/// Brings the loopback interface up, so guest programs can use 127.0.0.1.
pub fn loopback_up() -> io::Result<()> {
    link_up("lo")
}

/// An `AF_INET` datagram socket for interface ioctls.
fn inet_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket() has no memory preconditions; the fd is owned below.
    let fd =
        check(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fd is a fresh, valid descriptor that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An `ifreq` naming `name` (at most 15 bytes), the rest zero.
fn ifreq(name: &str) -> io::Result<libc::ifreq> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad interface name {name:?}"),
        ));
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
        *dst = *src as libc::c_char;
    }
    Ok(req)
}

/// A `sockaddr` holding an IPv4 address (port 0).
fn sockaddr_v4(addr: std::net::Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(addr.octets()),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size on Linux, and any
    // bit pattern is a valid sockaddr.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

/// Sets `IFF_UP` on the interface `name`.
pub fn link_up(name: &str) -> io::Result<()> {
    let sock = inet_socket()?;
    let mut req = ifreq(name)?;
    // SAFETY: SIOCGIFFLAGS reads into the ifreq we pass, which is valid for writes.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) })?;
    // SAFETY: the kernel filled ifru_flags in the union for SIOCGIFFLAGS.
    unsafe { req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
    // SAFETY: SIOCSIFFLAGS reads the ifreq we pass.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) })?;
    Ok(())
}

/// Gives the interface `name` the address `addr/prefix`.
pub fn set_ipv4(name: &str, addr: std::net::Ipv4Addr, prefix: u8) -> io::Result<()> {
    if prefix > 32 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("prefix /{prefix} is longer than 32"),
        ));
    }
    let sock = inet_socket()?;
    let mut req = ifreq(name)?;
    req.ifr_ifru.ifru_addr = sockaddr_v4(addr);
    // SAFETY: SIOCSIFADDR reads the ifreq we pass.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFADDR, &req) })?;
    let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
    let mut req = ifreq(name)?;
    req.ifr_ifru.ifru_netmask = sockaddr_v4(std::net::Ipv4Addr::from(mask));
    // SAFETY: SIOCSIFNETMASK reads the ifreq we pass.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFNETMASK, &req) })?;
    Ok(())
}

/// Adds the default route through `gateway`; one already there is fine.
pub fn add_default_route(gateway: std::net::Ipv4Addr) -> io::Result<()> {
    let sock = inet_socket()?;
    // SAFETY: rtentry is plain old data; all-zero is a valid value.
    let mut rt: libc::rtentry = unsafe { std::mem::zeroed() };
    rt.rt_dst = sockaddr_v4(std::net::Ipv4Addr::UNSPECIFIED);
    rt.rt_genmask = sockaddr_v4(std::net::Ipv4Addr::UNSPECIFIED);
    rt.rt_gateway = sockaddr_v4(gateway);
    rt.rt_flags = libc::RTF_UP | libc::RTF_GATEWAY;
    // SAFETY: SIOCADDRT reads the rtentry we pass, which outlives the call.
    match check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCADDRT, &rt) }) {
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
        r => r.map(drop),
    }
}

pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds is a valid array of two ints.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 returned two fresh descriptors that we now own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Opens a pseudo-terminal pair of the given size: (master, slave).
pub fn openpty(rows: u16, cols: u16) -> io::Result<(OwnedFd, OwnedFd)> {
    let (mut master, mut slave) = (0 as RawFd, 0 as RawFd);
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: out-pointers are valid; name and termios may be null.
    check(unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &ws,
        )
    })?;
    // SAFETY: openpty returned two fresh descriptors that we now own.
    let pair = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    for fd in [&pair.0, &pair.1] {
        // SAFETY: setting FD_CLOEXEC on a valid descriptor.
        check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) })?;
    }
    Ok(pair)
}

pub fn set_winsize(fd: RawFd, rows: u16, cols: u16) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize from a valid pointer.
    check(unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &ws) }).map(drop)
}

/// Signals a whole process group.
pub fn kill_group(pgid: u32, signal: i32) {
    // SAFETY: kill has no memory preconditions; a negative pid names a group.
    unsafe {
        libc::kill(-(pgid as libc::pid_t), signal);
    }
}

/// The descriptor a long command's script is on in its shell (see
/// [`memfd_script`]).
pub const SCRIPT_FD: RawFd = 3;

/// What [`child_setup`] does between fork and exec.
#[derive(Clone, Copy, Debug, Default)]
pub struct ChildSetup {
    /// The slave of a PTY is on fd 0 and becomes the controlling terminal.
    pub pty: bool,
    /// A script descriptor (from [`memfd_script`]) to place on
    /// [`SCRIPT_FD`], inherited across exec.
    pub script: Option<RawFd>,
    /// Raise the soft stack limit to at least this many bytes, so that
    /// exec accepts large arguments and environments (Linux allows a
    /// quarter of the stack limit for them, at most 6 MiB).
    pub min_stack: Option<u64>,
}

/// Called in the child between fork and exec: new session, the PTY as
/// controlling terminal, the script descriptor, the stack limit.
pub fn child_setup(setup: ChildSetup) -> io::Result<()> {
    // SAFETY: setsid and ioctl are async-signal-safe and touch no Rust state.
    check(unsafe { libc::setsid() })?;
    if setup.pty {
        // SAFETY: as above; fd 0 is the pty slave.
        check(unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) })?;
    }
    if let Some(fd) = setup.script {
        // SAFETY: dup2 is async-signal-safe; `fd` is open in the child (it
        // was open in the parent at fork and is only closed at exec), and
        // is never SCRIPT_FD itself (memfd_script puts it at 10 or above),
        // so the copy on SCRIPT_FD is made without close-on-exec.
        check(unsafe { libc::dup2(fd, SCRIPT_FD) })?;
    }
    if let Some(want) = setup.min_stack {
        // SAFETY: rlimit is plain old data; all-zero is a valid value.
        let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
        // SAFETY: getrlimit/setrlimit are async-signal-safe and read or
        // write only the rlimit we pass.
        check(unsafe { libc::getrlimit(libc::RLIMIT_STACK, &mut lim) })?;
        if lim.rlim_cur != libc::RLIM_INFINITY && lim.rlim_cur < want {
            lim.rlim_cur = if lim.rlim_max == libc::RLIM_INFINITY {
                want
            } else {
                want.min(lim.rlim_max)
            };
            // SAFETY: as above.
            check(unsafe { libc::setrlimit(libc::RLIMIT_STACK, &lim) })?;
        }
    }
    Ok(())
}

/// A sealed, read-only in-memory file holding `contents`, on a descriptor
/// numbered 10 or above (close-on-exec; [`child_setup`] puts a copy on
/// [`SCRIPT_FD`]). A command too long for one argument is run as a
/// script read from it.
pub fn memfd_script(contents: &[u8]) -> io::Result<OwnedFd> {
    use std::io::Write;
    let name = cstr("hearth-command")?;
    // SAFETY: a valid NUL-terminated name and flags; the fd is owned below.
    let fd = check(unsafe {
        libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
    })?;
    // SAFETY: memfd_create returned a fresh descriptor that we own.
    let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut file = std::fs::File::from(memfd);
    file.write_all(contents)?;
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: F_ADD_SEALS on a valid memfd created with MFD_ALLOW_SEALING.
    check(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
    // SAFETY: F_DUPFD_CLOEXEC on a valid descriptor returns a fresh one
    // (numbered 10 or above), owned below; the original closes with `file`.
    let high = check(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) })?;
    // SAFETY: fresh descriptor from fcntl that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(high) })
}

/// One reaped child: its pid and wait status.
pub fn wait_any() -> Option<(u32, i32)> {
    let mut status = 0;
    // SAFETY: status is a valid out-pointer.
    let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
    if pid > 0 {
        Some((pid as u32, status))
    } else {
        None
    }
}

/// (exit code as a shell reports it, signal) from a wait status.
pub fn decode_status(status: i32) -> (i32, Option<i32>) {
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        (128 + sig, Some(sig))
    } else {
        (libc::WEXITSTATUS(status), None)
    }
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on a valid descriptor.
    let flags = check(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    // SAFETY: as above.
    check(unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) }).map(drop)
}

/// Clears `O_NONBLOCK` on an open file (opened non-blocking so that
/// opening could not block).
pub fn clear_nonblocking(fd: &impl AsRawFd) -> io::Result<()> {
    let fd = fd.as_raw_fd();
    // SAFETY: F_GETFL/F_SETFL on a valid descriptor.
    let flags = check(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    // SAFETY: as above.
    check(unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) }).map(drop)
}

/// Async reads and writes on any pollable descriptor (pipe, pty master,
/// virtio port).
pub struct FdIo {
    fd: AsyncFd<OwnedFd>,
}

impl FdIo {
    pub fn new(fd: OwnedFd) -> io::Result<Self> {
        set_nonblocking(fd.as_raw_fd())?;
        // SAFETY: OwnedFd keeps the descriptor open and unchanged for as
        // long as the AsyncFd owns it.
        let fd = unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)?;
        Ok(Self { fd })
    }

    pub fn raw(&self) -> RawFd {
        self.fd.get_ref().as_raw_fd()
    }

    fn read_raw(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: buf is valid for writes of buf.len() bytes.
        let n = unsafe { libc::read(self.raw(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            // A pty master reports EIO once the slave side is gone: that is EOF.
            if e.raw_os_error() == Some(libc::EIO) {
                return Ok(0);
            }
            Err(e)
        } else {
            Ok(n as usize)
        }
    }

    fn write_raw(&self, buf: &[u8]) -> io::Result<usize> {
        // SAFETY: buf is valid for reads of buf.len() bytes.
        let n = unsafe { libc::write(self.raw(), buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    pub fn poll_read_bytes(
        &self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|_| self.read_raw(unfilled)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }

    pub fn poll_write_bytes(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.fd.poll_write_ready(cx))?;
            match guard.try_io(|_| self.write_raw(buf)) {
                Ok(r) => return Poll::Ready(r),
                Err(_would_block) => continue,
            }
        }
    }
}

/// A shared [`FdIo`] usable as a tokio reader or writer from several tasks.
#[derive(Clone)]
pub struct SharedFd(pub std::sync::Arc<FdIo>);

impl AsyncRead for SharedFd {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.0.poll_read_bytes(cx, buf)
    }
}

impl AsyncWrite for SharedFd {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.0.poll_write_bytes(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Grows the ext4 filesystem mounted at `/` to fill its block device
/// (online resize; a no-op when it already does). The host makes a disk
/// larger than the image when a sandbox asks for more capacity.
pub fn grow_root_fs(device: &str) -> io::Result<u64> {
    // _IOR(0x12, 114, u64) and _IOW('f', 16, u64).
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    const EXT4_IOC_RESIZE_FS: libc::c_ulong = 0x4008_6610;
    let dev = std::fs::File::open(device)?;
    let mut bytes: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the valid pointer.
    check(unsafe { libc::ioctl(dev.as_raw_fd(), BLKGETSIZE64, &mut bytes) })?;
    let root = std::fs::File::open("/")?;
    // SAFETY: statvfs is plain old data; zeroed is valid, fstatvfs fills it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatvfs writes into the valid statvfs we pass.
    check(unsafe { libc::fstatvfs(root.as_raw_fd(), &mut st) })?;
    let block = st.f_frsize.max(1);
    let mut blocks: u64 = bytes / block;
    // SAFETY: EXT4_IOC_RESIZE_FS reads one u64 from the valid pointer.
    check(unsafe { libc::ioctl(root.as_raw_fd(), EXT4_IOC_RESIZE_FS, &mut blocks) })?;
    Ok(blocks * block)
}

/// `RNDADDENTROPY`: `_IOW('R', 0x03, int[2])`.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
/// `RNDRESEEDCRNG`: `_IO('R', 0x07)` (Linux 4.17).
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;

/// Mixes `bytes` into the kernel's entropy pool, credited in full, then
/// reseeds the CRNG from it at once, through `/dev/urandom` (CAP_SYS_ADMIN).
pub fn add_entropy_and_reseed(bytes: &[u8]) -> io::Result<()> {
    let dev = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/urandom")?;
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    // as u32 words: the buffer is 4-byte aligned as the kernel reads it.
    let words = bytes.len().div_ceil(4);
    let mut info = vec![0u32; 2 + words];
    let len = i32::try_from(bytes.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "too much entropy"))?;
    info[0] = (len * 8) as u32;
    info[1] = len as u32;
    for (i, chunk) in bytes.chunks(4).enumerate() {
        let mut w = [0u8; 4];
        w[..chunk.len()].copy_from_slice(chunk);
        info[2 + i] = u32::from_ne_bytes(w);
    }
    // SAFETY: `info` is a valid rand_pool_info of `len` buffer bytes that
    // outlives the call; the kernel only reads it.
    check(unsafe { libc::ioctl(dev.as_raw_fd(), RNDADDENTROPY as _, info.as_ptr()) })?;
    // SAFETY: an ioctl without argument on an open descriptor.
    check(unsafe { libc::ioctl(dev.as_raw_fd(), RNDRESEEDCRNG as _) }).map(drop)
}

/// Bind-mounts the file `src` over the file `target`.
pub fn bind_file(src: &str, target: &str) -> io::Result<()> {
    mount(src, target, "", libc::MS_BIND, "")
}

/// Makes the calling thread's filesystem identity `uid`:`gid` with no other
/// group, and checks it took. Raw system calls: Linux keeps these
/// credentials per thread, where libc's wrappers of `setgroups` change
/// every thread of the process.
pub fn become_fs(uid: u32, gid: u32) -> io::Result<()> {
    let groups = [gid as libc::gid_t];
    // SAFETY: system calls on this thread's credentials; `groups` outlives
    // the call, and the kernel only reads it.
    if unsafe { libc::syscall(libc::SYS_setgroups, 1usize, groups.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above; setfsuid/setfsgid take an id and answer the
    // previous one (an invalid id, -1, changes nothing).
    let (now_uid, now_gid) = unsafe {
        libc::syscall(libc::SYS_setfsgid, gid as libc::c_long);
        libc::syscall(libc::SYS_setfsuid, uid as libc::c_long);
        (
            libc::syscall(libc::SYS_setfsuid, -1 as libc::c_long) as u32,
            libc::syscall(libc::SYS_setfsgid, -1 as libc::c_long) as u32,
        )
    };
    if now_uid != uid || now_gid != gid {
        return Err(io::Error::other(format!(
            "cannot act as {uid}:{gid} (the thread is {now_uid}:{now_gid})"
        )));
    }
    Ok(())
}

fn c_path(path: &std::path::Path) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// The names of `path`'s extended attributes (not following a link).
pub fn xattr_names(path: &std::path::Path) -> io::Result<Vec<String>> {
    let p = c_path(path)?;
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: `buf` is writable for its length; `p` is NUL-terminated.
        let n = unsafe { libc::llistxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            buf.truncate(n as usize);
            break;
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) || buf.len() >= 1 << 16 {
            return Err(e);
        }
        buf.resize(buf.len() * 4, 0);
    }
    Ok(buf
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .filter_map(|n| std::str::from_utf8(n).ok().map(str::to_owned))
        .collect())
}

/// One extended attribute of `path` (not following a link); `None` when
/// it has none of that name.
pub fn xattr_get(path: &std::path::Path, name: &str) -> io::Result<Option<Vec<u8>>> {
    let p = c_path(path)?;
    let n = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: `buf` is writable for its length; both names are
    // NUL-terminated.
    let got =
        unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if got < 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ENODATA) {
            Ok(None)
        } else {
            Err(e)
        };
    }
    buf.truncate(got as usize);
    Ok(Some(buf))
}

/// Sets an extended attribute of the open file `f`.
pub fn xattr_set(f: &std::fs::File, name: &str, value: &[u8]) -> io::Result<()> {
    let n = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `value` is readable for its length; `n` is NUL-terminated;
    // `f` is an open descriptor.
    check(unsafe {
        libc::fsetxattr(
            f.as_raw_fd(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    /// Finding 8: a command too long for one argument reaches its shell as
    /// a script on SCRIPT_FD, and the child's stack limit is raised for a
    /// large environment; the client's stdin stays free.
    #[test]
    fn finding8_script_fd_and_stack_limit_reach_the_child() {
        let script = format!("# {}\nulimit -s\ncat\n", "x".repeat(300 * 1024));
        let fd = memfd_script(script.as_bytes()).unwrap();
        assert!(fd.as_raw_fd() >= 10);
        let setup = ChildSetup {
            pty: false,
            script: Some(fd.as_raw_fd()),
            min_stack: Some(64 << 20),
        };
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.arg(format!("/proc/self/fd/{SCRIPT_FD}"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        // SAFETY: child_setup makes only async-signal-safe calls.
        unsafe {
            cmd.pre_exec(move || child_setup(setup));
        }
        let mut child = cmd.spawn().unwrap();
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(b"from stdin\n").unwrap();
        }
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let mut lines = text.lines();
        let stack = lines.next().unwrap_or_default();
        assert!(
            stack == "unlimited" || stack.parse::<u64>().is_ok_and(|kib| kib >= 65536),
            "{text}"
        );
        assert_eq!(lines.next(), Some("from stdin"), "{text}");
        assert!(out.status.success());
        // The memfd is sealed: the script cannot be changed behind the shell.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .unwrap();
        use std::io::Write;
        assert!(f.write_all(b"rm -rf /").is_err());
    }
}
