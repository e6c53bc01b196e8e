//! The uncompressed kernel inside a bzImage, which QEMU's `microvm` boots
//! directly through its PVH entry point: the guest then spends no time
//! decompressing itself (about 0.25 s of emulated CPU per boot under TCG
//! for Debian's cloud kernel, whose 14 MB payload is 53 MB of LZ4;
//! `docs/benchmarks.md`).
//!
//! Only what that kernel needs is read: the boot protocol header's payload
//! fields (protocol 2.08+), an LZ4 payload in the legacy frame format the
//! kernel's build writes (`lz4 -l`: blocks of up to 8 MiB, each after its
//! compressed length, then the uncompressed size appended by the build),
//! and an x86-64 ELF with a `Xen` note of type 18
//! (`XEN_ELFNOTE_PHYS32_ENTRY`), without which QEMU cannot boot it. Any
//! other payload is an error the caller reports before booting the bzImage
//! as before. Every length read from the file is checked against it, and
//! the output is bounded.

/// The legacy LZ4 frame's magic number (and a block length that restarts a
/// frame).
const LZ4_LEGACY_MAGIC: u32 = 0x184C_2102;
/// Largest uncompressed block of the legacy format.
const LZ4_LEGACY_BLOCK: usize = 8 << 20;
/// No kernel image is larger than this.
const MAX_VMLINUX: usize = 512 << 20;
/// `XEN_ELFNOTE_PHYS32_ENTRY`: the 32-bit PVH entry point.
const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;
const PT_NOTE: u32 = 4;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        b.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// The kernel ELF inside `bzimage`, checked to have a PVH entry point; or
/// why it cannot be had.
pub(crate) fn extract(bzimage: &[u8]) -> Result<Vec<u8>, String> {
    let payload = payload(bzimage)?;
    let elf = unlz4_legacy(payload)?;
    if !has_pvh_entry(&elf) {
        return Err("the uncompressed kernel has no PVH entry note".to_owned());
    }
    Ok(elf)
}

/// The compressed payload a bzImage's header points at.
fn payload(b: &[u8]) -> Result<&[u8], String> {
    if b.get(0x202..0x206) != Some(b"HdrS") {
        return Err("not a bzImage (no HdrS header)".to_owned());
    }
    let version = u16_at(b, 0x206).unwrap_or(0);
    if version < 0x0208 {
        return Err(format!(
            "boot protocol {version:#06x} has no payload fields"
        ));
    }
    let setup_sects = match b.get(0x1f1).copied().unwrap_or(0) {
        0 => 4,
        n => usize::from(n),
    };
    let (Some(offset), Some(len)) = (u32_at(b, 0x248), u32_at(b, 0x24c)) else {
        return Err("truncated header".to_owned());
    };
    let start = (setup_sects + 1) * 512 + offset as usize;
    start
        .checked_add(len as usize)
        .and_then(|end| b.get(start..end))
        .ok_or_else(|| "the payload lies outside the file".to_owned())
}

/// Decodes the legacy LZ4 frame format, checking the total against the
/// size the kernel's build appends.
fn unlz4_legacy(p: &[u8]) -> Result<Vec<u8>, String> {
    if u32_at(p, 0) != Some(LZ4_LEGACY_MAGIC) {
        return Err(format!(
            "the payload is not LZ4 (starts {:02x?}); only LZ4 kernels are unpacked",
            &p[..p.len().min(4)]
        ));
    }
    let mut out = Vec::new();
    let mut block = vec![0u8; LZ4_LEGACY_BLOCK];
    let mut at = 4;
    // The last 4 bytes are the appended uncompressed size, not a block.
    while at + 4 < p.len() {
        let len = u32_at(p, at).unwrap_or(0);
        at += 4;
        if len == LZ4_LEGACY_MAGIC {
            continue;
        }
        let src = at
            .checked_add(len as usize)
            .and_then(|end| p.get(at..end))
            .ok_or_else(|| format!("an LZ4 block at {at} overruns the payload"))?;
        let n = lz4_flex::block::decompress_into(src, &mut block)
            .map_err(|e| format!("an LZ4 block at {at}: {e}"))?;
        if out.len() + n > MAX_VMLINUX {
            return Err(format!("more than {MAX_VMLINUX} bytes uncompressed"));
        }
        out.extend_from_slice(&block[..n]);
        at += len as usize;
    }
    let want = u32_at(p, p.len().saturating_sub(4)).unwrap_or(0) as usize;
    if out.len() != want {
        return Err(format!(
            "{} bytes uncompressed, but the kernel's build says {want}",
            out.len()
        ));
    }
    Ok(out)
}

/// Whether `elf` is a little-endian x86-64 ELF64 with a `Xen` note of type
/// [`XEN_ELFNOTE_PHYS32_ENTRY`] in a `PT_NOTE` segment.
fn has_pvh_entry(elf: &[u8]) -> bool {
    if elf.get(..4) != Some(b"\x7fELF") || elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        return false;
    }
    if u16_at(elf, 18) != Some(62) {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) =
        (u64_at(elf, 0x20), u16_at(elf, 0x36), u16_at(elf, 0x38))
    else {
        return false;
    };
    (0..usize::from(phnum)).any(|i| {
        let Some(ph) = usize::try_from(phoff)
            .ok()
            .and_then(|o| o.checked_add(i * usize::from(phentsize)))
        else {
            return false;
        };
        if u32_at(elf, ph) != Some(PT_NOTE) {
            return false;
        }
        let (Some(off), Some(size)) = (u64_at(elf, ph + 8), u64_at(elf, ph + 32)) else {
            return false;
        };
        let notes = usize::try_from(off).ok().and_then(|o| {
            let end = o.checked_add(usize::try_from(size).ok()?)?;
            elf.get(o..end)
        });
        notes.is_some_and(has_xen_entry_note)
    })
}

/// Walks the notes of one `PT_NOTE` segment.
fn has_xen_entry_note(mut notes: &[u8]) -> bool {
    let align4 = |n: usize| n.div_ceil(4) * 4;
    while notes.len() >= 12 {
        let (Some(namesz), Some(descsz), Some(kind)) =
            (u32_at(notes, 0), u32_at(notes, 4), u32_at(notes, 8))
        else {
            return false;
        };
        let name_end = 12 + align4(namesz as usize);
        let Some(next) = name_end.checked_add(align4(descsz as usize)) else {
            return false;
        };
        if notes.get(12..12 + namesz as usize) == Some(b"Xen\0") && kind == XEN_ELFNOTE_PHYS32_ENTRY
        {
            return true;
        }
        match notes.get(next..) {
            Some(rest) => notes = rest,
            None => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bzimage_with(payload: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; 5 * 512];
        b[0x1f1] = 4;
        b[0x202..0x206].copy_from_slice(b"HdrS");
        b[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
        b[0x248..0x24c].copy_from_slice(&16u32.to_le_bytes());
        b[0x24c..0x250].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        b.extend_from_slice(&[0u8; 16]);
        b.extend_from_slice(payload);
        b
    }

    fn legacy_lz4(data: &[u8]) -> Vec<u8> {
        let mut p = LZ4_LEGACY_MAGIC.to_le_bytes().to_vec();
        for chunk in data.chunks(LZ4_LEGACY_BLOCK) {
            let c = lz4_flex::block::compress(chunk);
            p.extend_from_slice(&(c.len() as u32).to_le_bytes());
            p.extend_from_slice(&c);
        }
        p.extend_from_slice(&(data.len() as u32).to_le_bytes());
        p
    }

    /// A minimal ELF64 with one PT_NOTE segment holding `note`.
    fn elf_with_note(name: &[u8], kind: u32) -> Vec<u8> {
        let mut e = vec![0u8; 64 + 56];
        e[..4].copy_from_slice(b"\x7fELF");
        e[4] = 2;
        e[5] = 1;
        e[18..20].copy_from_slice(&62u16.to_le_bytes());
        e[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        e[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        e[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        let mut note = Vec::new();
        note.extend_from_slice(&(name.len() as u32).to_le_bytes());
        note.extend_from_slice(&8u32.to_le_bytes());
        note.extend_from_slice(&kind.to_le_bytes());
        note.extend_from_slice(name);
        note.resize(12 + name.len().div_ceil(4) * 4 + 8, 0);
        let off = e.len() as u64;
        e[64..68].copy_from_slice(&PT_NOTE.to_le_bytes());
        e[64 + 8..64 + 16].copy_from_slice(&off.to_le_bytes());
        e[64 + 32..64 + 40].copy_from_slice(&(note.len() as u64).to_le_bytes());
        e.extend_from_slice(&note);
        // Bulk, so the payload has more than one block.
        e.resize(e.len() + LZ4_LEGACY_BLOCK + 1000, 0x90);
        e
    }

    #[test]
    fn a_pvh_kernel_comes_out_whole() {
        let elf = elf_with_note(b"Xen\0", XEN_ELFNOTE_PHYS32_ENTRY);
        let got = extract(&bzimage_with(&legacy_lz4(&elf))).unwrap();
        assert_eq!(got, elf);
    }

    #[test]
    fn anything_else_is_refused_with_a_reason() {
        let no_pvh = elf_with_note(b"Xen\0", 5);
        let err = extract(&bzimage_with(&legacy_lz4(&no_pvh))).unwrap_err();
        assert!(err.contains("PVH"), "{err}");

        let gzip = [0x1f, 0x8b, 0x08, 0, 1, 2, 3, 4];
        let err = extract(&bzimage_with(&gzip)).unwrap_err();
        assert!(err.contains("not LZ4"), "{err}");

        let elf = elf_with_note(b"Xen\0", XEN_ELFNOTE_PHYS32_ENTRY);
        let mut lz = legacy_lz4(&elf);
        let n = lz.len();
        lz[n - 4..].copy_from_slice(&7u32.to_le_bytes());
        let err = extract(&bzimage_with(&lz)).unwrap_err();
        assert!(err.contains("says 7"), "{err}");

        // Truncated in the middle of a block, and a header pointing past
        // the end: errors, never a panic.
        let cut = &lz[..n / 2];
        assert!(extract(&bzimage_with(cut)).is_err());
        let mut past = bzimage_with(&lz);
        past[0x24c..0x250].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(extract(&past).unwrap_err().contains("outside"));
        assert!(extract(b"MZ not a kernel").is_err());
    }
}
