//! Just enough ELF64 parsing to tell a static executable from a dynamic one.
//!
//! A binary is static when it has no `PT_INTERP` program header, i.e. the
//! kernel runs it without a dynamic loader. That is what `/init` in the
//! initramfs and `/bin/busybox` in the busybox image need: neither has a
//! `/lib` to load from. (glibc's static-pie, which Rust produces with
//! `+crt-static`, has `PT_DYNAMIC` but no `PT_INTERP` and counts as static.)
//!
//! The parser reads only the header and the program header table, checks
//! every offset against the file length with checked arithmetic, and never
//! trusts a count or size from the file.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::ImageError;

const ELF_MAGIC: [u8; 4] = [0x7f, b'E', b'L', b'F'];
const ELFCLASS64: u8 = 2;
const ELFDATA2LSB: u8 = 1;
const ELFDATA2MSB: u8 = 2;
const ET_EXEC: u16 = 2;
const ET_DYN: u16 = 3;
const EM_X86_64: u16 = 62;
const PT_INTERP: u32 = 3;
/// `e_phnum` value meaning "the real count is elsewhere"; never valid here.
const PN_XNUM: u16 = 0xffff;
const EHDR_SIZE: usize = 64;
const PHDR_MIN_SIZE: u16 = 56;
/// Upper bound on the program header table we are willing to read.
const MAX_PHDR_TABLE: u64 = 1 << 20;
/// Upper bound on the interpreter path we are willing to read.
const MAX_INTERP: u64 = 4096;

/// How an executable is linked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Linkage {
    /// No `PT_INTERP`: runs without a dynamic loader.
    Static,
    /// Needs the dynamic loader at this path.
    Dynamic {
        /// The `PT_INTERP` contents, e.g. `/lib64/ld-linux-x86-64.so.2`.
        interpreter: String,
    },
}

/// Reads the linkage of the ELF64 x86-64 executable at `path`.
pub fn linkage(path: &Path) -> Result<Linkage, ImageError> {
    let file = File::open(path).map_err(|e| ImageError::io("open", path, e))?;
    let len = file
        .metadata()
        .map_err(|e| ImageError::io("stat", path, e))?
        .len();
    let bad = |reason: &str| ImageError::BadElf {
        path: path.to_path_buf(),
        reason: reason.to_owned(),
    };
    let read_at = |buf: &mut [u8], off: u64| {
        file.read_exact_at(buf, off)
            .map_err(|e| ImageError::io("read", path, e))
    };

    if len < EHDR_SIZE as u64 {
        return Err(bad("too short for an ELF64 header"));
    }
    let mut ehdr = [0u8; EHDR_SIZE];
    read_at(&mut ehdr, 0)?;
    if ehdr[..4] != ELF_MAGIC {
        return Err(bad("no ELF magic"));
    }
    if ehdr[4] != ELFCLASS64 {
        return Err(bad("not a 64-bit ELF"));
    }
    let big_endian = match ehdr[5] {
        ELFDATA2LSB => false,
        ELFDATA2MSB => true,
        _ => return Err(bad("unknown byte order")),
    };
    let r = Reader { big_endian };
    let e_type = r.u16(&ehdr[16..18]);
    if e_type != ET_EXEC && e_type != ET_DYN {
        return Err(bad("not an executable (e_type is neither EXEC nor DYN)"));
    }
    if r.u16(&ehdr[18..20]) != EM_X86_64 {
        return Err(bad("not an x86-64 binary"));
    }
    let phoff = r.u64(&ehdr[32..40]);
    let phentsize = r.u16(&ehdr[54..56]);
    let phnum = r.u16(&ehdr[56..58]);
    if phnum == PN_XNUM {
        return Err(bad("extended program header count is not supported"));
    }
    if phnum == 0 {
        return Err(bad("no program headers"));
    }
    if phentsize < PHDR_MIN_SIZE {
        return Err(bad("program header entries are too small"));
    }
    let table_len = u64::from(phentsize) * u64::from(phnum);
    let table_end = phoff
        .checked_add(table_len)
        .ok_or_else(|| bad("program header table offset overflows"))?;
    if table_end > len || table_len > MAX_PHDR_TABLE {
        return Err(bad("program header table lies outside the file"));
    }
    // Both bounded by MAX_PHDR_TABLE above, so the casts cannot truncate.
    let mut table = vec![0u8; table_len as usize];
    read_at(&mut table, phoff)?;

    for entry in table.chunks_exact(usize::from(phentsize)) {
        if r.u32(&entry[0..4]) != PT_INTERP {
            continue;
        }
        let offset = r.u64(&entry[8..16]);
        let size = r.u64(&entry[32..40]);
        let end = offset
            .checked_add(size)
            .ok_or_else(|| bad("PT_INTERP offset overflows"))?;
        if end > len || size > MAX_INTERP {
            return Err(bad("PT_INTERP lies outside the file"));
        }
        let mut interp = vec![0u8; size as usize];
        read_at(&mut interp, offset)?;
        let text = interp.split(|&b| b == 0).next().unwrap_or_default();
        return Ok(Linkage::Dynamic {
            interpreter: String::from_utf8_lossy(text).into_owned(),
        });
    }
    Ok(Linkage::Static)
}

/// Fails with [`ImageError::NotStatic`] unless `path` is a static ELF64
/// x86-64 executable.
pub fn require_static(path: &Path) -> Result<(), ImageError> {
    match linkage(path)? {
        Linkage::Static => Ok(()),
        Linkage::Dynamic { interpreter } => Err(ImageError::NotStatic {
            path: path.to_path_buf(),
            interpreter,
        }),
    }
}

/// Fixed-size integer decoding in the file's byte order. Callers pass slices
/// of exactly the right length (they come from fixed ranges above).
struct Reader {
    big_endian: bool,
}

impl Reader {
    fn u16(&self, b: &[u8]) -> u16 {
        let a = [b[0], b[1]];
        if self.big_endian {
            u16::from_be_bytes(a)
        } else {
            u16::from_le_bytes(a)
        }
    }

    fn u32(&self, b: &[u8]) -> u32 {
        let a = [b[0], b[1], b[2], b[3]];
        if self.big_endian {
            u32::from_be_bytes(a)
        } else {
            u32::from_le_bytes(a)
        }
    }

    fn u64(&self, b: &[u8]) -> u64 {
        let a = [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]];
        if self.big_endian {
            u64::from_be_bytes(a)
        } else {
            u64::from_le_bytes(a)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn scratch(name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("hearth-elf-{}-{name}", std::process::id()));
        let mut f = File::create(&path).unwrap();
        f.write_all(bytes).unwrap();
        path
    }

    #[test]
    fn dynamic_binary_is_not_static() {
        match linkage(Path::new("/bin/ls")).unwrap() {
            Linkage::Dynamic { interpreter } => {
                assert!(interpreter.contains("ld-linux"), "{interpreter}")
            }
            Linkage::Static => panic!("/bin/ls reported static"),
        }
        assert!(matches!(
            require_static(Path::new("/bin/ls")),
            Err(ImageError::NotStatic { .. })
        ));
    }

    #[test]
    fn busybox_static_is_static() {
        assert_eq!(linkage(Path::new("/bin/busybox")).unwrap(), Linkage::Static);
        require_static(Path::new("/bin/busybox")).unwrap();
    }

    #[test]
    fn garbage_is_rejected_not_panicking() {
        let short = scratch("short", b"\x7fELF");
        assert!(matches!(linkage(&short), Err(ImageError::BadElf { .. })));
        let text = scratch("text", &[b'#'; 200]);
        assert!(matches!(linkage(&text), Err(ImageError::BadElf { .. })));

        // A valid-looking header whose program header table points far
        // beyond the end of the file.
        let mut hdr = vec![0u8; 64];
        hdr[..4].copy_from_slice(&ELF_MAGIC);
        hdr[4] = ELFCLASS64;
        hdr[5] = ELFDATA2LSB;
        hdr[16..18].copy_from_slice(&ET_EXEC.to_le_bytes());
        hdr[18..20].copy_from_slice(&EM_X86_64.to_le_bytes());
        hdr[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        hdr[54..56].copy_from_slice(&56u16.to_le_bytes());
        hdr[56..58].copy_from_slice(&3u16.to_le_bytes());
        let wild = scratch("wild", &hdr);
        assert!(matches!(linkage(&wild), Err(ImageError::BadElf { .. })));

        // Same header with an in-bounds, empty (all PT_NULL) table: static.
        hdr[32..40].copy_from_slice(&64u64.to_le_bytes());
        hdr.extend_from_slice(&[0u8; 56 * 3]);
        let empty = scratch("empty", &hdr);
        assert_eq!(linkage(&empty).unwrap(), Linkage::Static);

        for p in [short, text, wild, empty] {
            let _ = std::fs::remove_file(p);
        }
    }
}
