//! A minimal writer for the newc ("070701") cpio format the kernel unpacks
//! as an initramfs.
//!
//! Each entry is a 110-byte ASCII header (the magic and 13 eight-digit hex
//! fields), the NUL-terminated name padded so header + name is a multiple of
//! 4, then the data padded to a multiple of 4. The archive ends with an entry
//! named `TRAILER!!!`. Every entry gets mtime 0, uid/gid 0 and an inode
//! number counted from 1, so the same inputs always give the same bytes.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use crate::ImageError;

const MAGIC: &str = "070701";
const TRAILER: &str = "TRAILER!!!";
const S_IFDIR: u32 = 0o040_000;
const S_IFREG: u32 = 0o100_000;
const S_IFCHR: u32 = 0o020_000;
const PERM_MASK: u32 = 0o7777;

/// Writes a newc archive to `out`, entry by entry.
pub(crate) struct CpioWriter<W: Write> {
    out: W,
    /// Where `out` goes, for error messages.
    path: PathBuf,
    next_ino: u32,
    offset: u64,
}

/// The fields of one header that vary between entries.
struct Header<'a> {
    name: &'a str,
    mode: u32,
    nlink: u32,
    size: u32,
    rdev: (u32, u32),
}

impl<W: Write> CpioWriter<W> {
    /// Starts an archive; `path` only labels I/O errors.
    pub(crate) fn new(out: W, path: &Path) -> Self {
        CpioWriter {
            out,
            path: path.to_path_buf(),
            next_ino: 1,
            offset: 0,
        }
    }

    /// Adds a directory.
    pub(crate) fn dir(&mut self, name: &str, perm: u32) -> Result<(), ImageError> {
        check_name(name)?;
        self.header(&Header {
            name,
            mode: S_IFDIR | (perm & PERM_MASK),
            nlink: 2,
            size: 0,
            rdev: (0, 0),
        })
    }

    /// Adds a character device node.
    pub(crate) fn char_device(
        &mut self,
        name: &str,
        perm: u32,
        major: u32,
        minor: u32,
    ) -> Result<(), ImageError> {
        check_name(name)?;
        self.header(&Header {
            name,
            mode: S_IFCHR | (perm & PERM_MASK),
            nlink: 1,
            size: 0,
            rdev: (major, minor),
        })
    }

    /// Adds a regular file whose `size` bytes come from `data`.
    pub(crate) fn file(
        &mut self,
        name: &str,
        perm: u32,
        size: u64,
        data: impl Read,
    ) -> Result<(), ImageError> {
        check_name(name)?;
        let size32 = u32::try_from(size).map_err(|_| ImageError::Cpio {
            name: name.to_owned(),
            reason: format!("{size} bytes is more than newc's 4 GiB limit"),
        })?;
        self.header(&Header {
            name,
            mode: S_IFREG | (perm & PERM_MASK),
            nlink: 1,
            size: size32,
            rdev: (0, 0),
        })?;
        let copied = io::copy(&mut data.take(size), &mut self.out)
            .map_err(|e| ImageError::io("write", &self.path, e))?;
        if copied != size {
            return Err(ImageError::Cpio {
                name: name.to_owned(),
                reason: format!("source gave {copied} bytes, expected {size}"),
            });
        }
        self.offset += copied;
        self.pad()
    }

    /// Writes the trailer and returns the output.
    pub(crate) fn finish(mut self) -> Result<W, ImageError> {
        // The trailer has inode 0 and nlink 1 by convention.
        self.next_ino = 0;
        self.header(&Header {
            name: TRAILER,
            mode: 0,
            nlink: 1,
            size: 0,
            rdev: (0, 0),
        })?;
        self.out
            .flush()
            .map_err(|e| ImageError::io("flush", &self.path, e))?;
        Ok(self.out)
    }

    fn header(&mut self, h: &Header<'_>) -> Result<(), ImageError> {
        let namesize = h.name.len() + 1;
        let ino = self.next_ino;
        if self.next_ino != 0 {
            self.next_ino += 1;
        }
        let fields = [
            ino,
            h.mode,
            0, // uid
            0, // gid
            h.nlink,
            0, // mtime
            h.size,
            0, // devmajor
            0, // devminor
            h.rdev.0,
            h.rdev.1,
            namesize as u32,
            0, // check
        ];
        let mut buf = String::with_capacity(110 + namesize + 3);
        buf.push_str(MAGIC);
        for f in fields {
            buf.push_str(&format!("{f:08x}"));
        }
        buf.push_str(h.name);
        buf.push('\0');
        self.write(buf.as_bytes())?;
        self.pad()
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), ImageError> {
        self.out
            .write_all(bytes)
            .map_err(|e| ImageError::io("write", &self.path, e))?;
        self.offset += bytes.len() as u64;
        Ok(())
    }

    /// Pads the archive to a multiple of 4 bytes.
    fn pad(&mut self) -> Result<(), ImageError> {
        let n = (4 - (self.offset % 4) as usize) % 4;
        self.write(&[0u8; 3][..n])
    }
}

/// Member names are relative ("hearth/modules/00-virtio.ko"), non-empty and
/// free of NUL and `..` so the kernel unpacks them where we mean.
fn check_name(name: &str) -> Result<(), ImageError> {
    let reason = if name.is_empty() {
        Some("empty name")
    } else if name.starts_with('/') {
        Some("name must be relative")
    } else if name.contains('\0') {
        Some("name contains NUL")
    } else if name
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        Some("name has an empty, '.' or '..' component")
    } else if name == TRAILER {
        Some("name is the trailer marker")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(ImageError::Cpio {
            name: name.to_owned(),
            reason: reason.to_owned(),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// One parsed entry: name, mode, rdev major/minor, data.
    type Entry = (String, u32, u32, u32, Vec<u8>);

    /// An independent, strict newc reader for the round trip.
    fn parse(mut bytes: &[u8]) -> Vec<Entry> {
        let mut out = Vec::new();
        let mut pos = 0usize;
        loop {
            assert_eq!(pos % 4, 0);
            assert_eq!(&bytes[..6], b"070701");
            let field = |i: usize| {
                let s = std::str::from_utf8(&bytes[6 + 8 * i..14 + 8 * i]).unwrap();
                u32::from_str_radix(s, 16).unwrap()
            };
            let (mode, uid, gid, mtime, size) = (field(1), field(2), field(3), field(5), field(6));
            let (rmaj, rmin, namesize) = (field(9), field(10), field(11) as usize);
            assert_eq!((uid, gid, mtime), (0, 0, 0));
            let name = std::str::from_utf8(&bytes[110..110 + namesize - 1])
                .unwrap()
                .to_owned();
            assert_eq!(bytes[110 + namesize - 1], 0);
            let data_start = (110 + namesize).div_ceil(4) * 4;
            let data_end = data_start + size as usize;
            let next = data_end.div_ceil(4) * 4;
            let data = bytes[data_start..data_end].to_vec();
            assert!(bytes[data_end..next].iter().all(|&b| b == 0));
            bytes = &bytes[next..];
            pos += next;
            if name == TRAILER {
                assert!(bytes.is_empty(), "bytes after trailer");
                return out;
            }
            out.push((name, mode, rmaj, rmin, data));
        }
    }

    fn sample() -> Vec<u8> {
        let mut w = CpioWriter::new(Vec::new(), Path::new("mem"));
        w.dir("dev", 0o755).unwrap();
        w.char_device("dev/console", 0o600, 5, 1).unwrap();
        w.dir("hearth", 0o755).unwrap();
        w.file("init", 0o755, 5, &b"hello"[..]).unwrap();
        w.file("hearth/empty", 0o644, 0, &b""[..]).unwrap();
        w.file("hearth/abc", 0o644, 3, &b"abcdef"[..]).unwrap();
        w.finish().unwrap()
    }

    #[test]
    fn round_trips() {
        let entries = parse(&sample());
        let names: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "dev",
                "dev/console",
                "hearth",
                "init",
                "hearth/empty",
                "hearth/abc"
            ]
        );
        assert_eq!(entries[0].1, 0o040_755);
        assert_eq!(
            (entries[1].1, entries[1].2, entries[1].3),
            (0o020_600, 5, 1)
        );
        assert_eq!(
            (entries[3].1, entries[3].4.as_slice()),
            (0o100_755, &b"hello"[..])
        );
        assert!(entries[4].4.is_empty());
        assert_eq!(entries[5].4, b"abc");
    }

    #[test]
    fn is_deterministic() {
        assert_eq!(sample(), sample());
    }

    #[test]
    fn system_cpio_lists_it() {
        let mut child = Command::new("cpio")
            .args(["-t", "-v", "--quiet"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("cpio is installed");
        child.stdin.take().unwrap().write_all(&sample()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let listing = String::from_utf8(out.stdout).unwrap();
        let lines: Vec<&str> = listing.lines().collect();
        assert_eq!(lines.len(), 6, "{listing}");
        assert!(
            lines[1].starts_with("crw-------")
                && lines[1].contains("5,")
                && lines[1].ends_with("dev/console")
        );
        assert!(lines[3].starts_with("-rwxr-xr-x") && lines[3].ends_with("init"));
    }

    #[test]
    fn rejects_bad_names_and_short_sources() {
        let mut w = CpioWriter::new(Vec::new(), Path::new("mem"));
        for bad in ["", "/init", "a/../b", "a//b", "TRAILER!!!"] {
            assert!(
                matches!(w.dir(bad, 0o755), Err(ImageError::Cpio { .. })),
                "{bad:?}"
            );
        }
        assert!(matches!(
            w.file("short", 0o644, 10, &b"abc"[..]),
            Err(ImageError::Cpio { .. })
        ));
    }
}
