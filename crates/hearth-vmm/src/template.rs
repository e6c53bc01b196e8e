//! A snapshot's RAM that many VMs map copy-on-write and none can change.
//!
//! QEMU 7.2 maps a private (`share=off`) memory file read-write: it opens
//! the file `O_RDWR`, so every VMM sharing one would be able to rewrite the
//! pages its siblings have not written yet, and when a guest reports free
//! pages it punches holes (`fallocate(PUNCH_HOLE)`) in the file itself,
//! zeroing them under every other VM. A [`MemoryTemplate`] is a memfd
//! sealed with `F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`:
//! the kernel refuses every write, truncation and hole to anyone holding it,
//! while private mappings stay writable (each VM's writes are its own
//! anonymous copies). A restore maps it by `/proc/self/fd/N` from a
//! descriptor its VMM inherits ([`crate::RestoreMemory::Template`]); the
//! jail mounts a `/proc` of its own.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use hearth_types::ByteSize;

/// Sealed guest RAM (see the module).
#[derive(Debug)]
pub struct MemoryTemplate {
    fd: OwnedFd,
    size: ByteSize,
}

impl MemoryTemplate {
    /// Copies the data of the RAM file at `path` (holes and pages of zeros
    /// stay holes) into a new memfd and seals it.
    pub fn from_file(path: &Path) -> io::Result<Self> {
        let from = File::open(path)?;
        let len = from.metadata()?.len();
        // SAFETY: a NUL-terminated name and flags; the result is checked.
        let raw = unsafe {
            libc::memfd_create(
                c"hearth-template".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: memfd_create returned a new descriptor nobody else owns.
        let to = unsafe { File::from_raw_fd(raw) };
        to.set_len(len)?;
        copy_nonzero(&from, &to, len)?;
        let seals =
            libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
        // SAFETY: fcntl on a descriptor we own, with an integer argument.
        if unsafe { libc::fcntl(to.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            fd: OwnedFd::from(to),
            size: ByteSize(len),
        })
    }

    /// The guest RAM's size: a restore's memory must be exactly this.
    pub fn size(&self) -> ByteSize {
        self.size
    }

    /// The descriptor a restoring VMM inherits (and maps by
    /// `/proc/self/fd/N`).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// A handle to read or try to change it (tests show the seals hold).
    pub fn file(&self) -> io::Result<File> {
        Ok(File::from(self.fd.try_clone()?))
    }
}

/// Copies the data of `from` (`len` bytes) to the same offsets of `to`,
/// skipping holes (`SEEK_DATA`/`SEEK_HOLE`): a 2 GiB guest that used 200
/// MiB costs 200 MiB. `to` must already be `len` long. Returns the bytes
/// copied.
pub fn copy_data(from: &File, to: &File, len: u64) -> io::Result<u64> {
    for_each_extent(from, len, |data, hole| {
        let mut copied = 0u64;
        let mut off_in = data as i64;
        let mut off_out = data as i64;
        let hole = hole as i64;
        while off_in < hole {
            let want = usize::try_from(hole - off_in)
                .unwrap_or(usize::MAX)
                .min(1 << 30);
            // SAFETY: both descriptors are open files the caller owns; the
            // offsets are valid pointers to i64 that the kernel advances.
            let n = unsafe {
                libc::copy_file_range(
                    from.as_raw_fd(),
                    &mut off_in,
                    to.as_raw_fd(),
                    &mut off_out,
                    want,
                    0,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EXDEV | libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)
                ) {
                    // Across filesystems (tmpfs to the data disk, a file to
                    // a memfd) on kernels that refuse it: through a buffer.
                    copied += copy_range(from, to, off_in as u64, (hole - off_in) as u64, false)?;
                    off_in = hole;
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the file shrank while being copied",
                ));
            }
            copied += n as u64;
        }
        Ok(copied)
    })
}

/// Like [`copy_data`], but pages of zeros are not copied either (they stay
/// holes): a RAM file a migration stream was loaded into is allocated
/// whole, mostly zeros.
pub fn copy_nonzero(from: &File, to: &File, len: u64) -> io::Result<u64> {
    for_each_extent(from, len, |data, hole| {
        copy_range(from, to, data, hole - data, true)
    })
}

/// Calls `copy(start, end)` for each extent of data of `file`'s first
/// `len` bytes, in order; returns the sum of what it returned.
fn for_each_extent(
    file: &File,
    len: u64,
    mut copy: impl FnMut(u64, u64) -> io::Result<u64>,
) -> io::Result<u64> {
    let mut copied = 0u64;
    for range in hearth_types::extents::data_extents(file, len)? {
        copied += copy(range.start, range.end)?;
    }
    Ok(copied)
}

/// Copies `len` bytes at `offset` from one file to the same offset of
/// another, through a buffer; with `skip_zeros`, 4 KiB pages of zeros are
/// left out (holes in a new file). Returns the bytes written.
fn copy_range(from: &File, to: &File, offset: u64, len: u64, skip_zeros: bool) -> io::Result<u64> {
    use std::os::unix::fs::FileExt;
    const PAGE: usize = 4096;
    let mut buf = vec![0u8; 1 << 20];
    let (mut done, mut written) = (0, 0);
    while done < len {
        let n = (len - done).min(buf.len() as u64) as usize;
        let at = offset + done;
        from.read_exact_at(&mut buf[..n], at)?;
        if !skip_zeros {
            to.write_all_at(&buf[..n], at)?;
            written += n as u64;
        } else {
            // Runs of pages with data, each written at once. A comparison
            // of slices is a memcmp, fast in any build.
            static ZEROS: [u8; PAGE] = [0; PAGE];
            let page_end = |i: usize| (i + PAGE).min(n);
            let zero = |buf: &[u8], i: usize| buf[i..page_end(i)] == ZEROS[..page_end(i) - i];
            let mut i = 0;
            while i < n {
                if zero(&buf, i) {
                    i = page_end(i);
                    continue;
                }
                let mut j = page_end(i);
                while j < n && !zero(&buf, j) {
                    j = page_end(j);
                }
                to.write_all_at(&buf[i..j], at + i as u64)?;
                written += (j - i) as u64;
                i = j;
            }
        }
        done += n as u64;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn a_template_keeps_its_data_and_refuses_every_change() {
        let dir = std::env::temp_dir().join(format!("hearth-template-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("ram");
        let f = File::create(&src).unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all_at(&[7u8; 8192], 4096).unwrap();
        f.write_all_at(&[9u8; 4096], 32 << 20).unwrap();
        // Zeros written (as a stream's load leaves them) are not data.
        f.write_all_at(&vec![0u8; 8 << 20], 40 << 20).unwrap();
        drop(f);
        let t = MemoryTemplate::from_file(&src).unwrap();
        assert_eq!(t.size(), ByteSize(64 << 20));
        let file = t.file().unwrap();
        let mut page = [0u8; 4096];
        file.read_exact_at(&mut page, 4096).unwrap();
        assert_eq!(page, [7u8; 4096]);
        file.read_exact_at(&mut page, 32 << 20).unwrap();
        assert_eq!(page, [9u8; 4096]);
        // Only the data was copied: the rest are holes.
        use std::os::unix::fs::MetadataExt;
        assert!(file.metadata().unwrap().blocks() * 512 < 4 << 20);
        // No write, no hole, no new size, no fewer seals.
        assert!(file.write_all_at(b"x", 0).is_err());
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: fallocate on a descriptor we own, plain integers.
        assert!(unsafe { libc::fallocate(file.as_raw_fd(), punch, 4096, 4096) } < 0);
        assert!(file.set_len(1 << 20).is_err());
        // SAFETY: fcntl on a descriptor we own.
        assert!(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, 0) } < 0);
        file.read_exact_at(&mut page, 4096).unwrap();
        assert_eq!(page, [7u8; 4096]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
