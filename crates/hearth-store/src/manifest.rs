//! Generations: the manifest type and its binary encoding.
//!
//! A manifest object (`volumes/<volume>/<seq:016x>`) is
//!
//! ```text
//! clear header:  "HMAN" | version u8 = 1 | scope_len u8 | scope
//! sealed:        nonce[24] | XChaCha20-Poly1305(body), AAD = header | volume | seq (u64 BE)
//! body:          volume_len u8 | volume | seq u64 | parent_flag u8 | parent u64
//!                | fence u64 | size u64 | chunk_size u32 | created_at_ms u64
//!                | meta_count u32 | { key_len u32 | key | value_len u32 | value }*
//!                | scope_count u16 | { scope_len u8 | scope }*
//!                | entry_count u64 | { index u64 | scope_index u16 | hash[32] }*
//! ```
//!
//! All integers big-endian. Entries are strictly increasing by index, so a
//! 160k-entry manifest is 6.7 MB and decodes in one pass. The scope in the
//! clear header says whose data key opens the body; binding volume and seq
//! into the AAD means a manifest copied to another name does not open.
//! Every length is checked before use: manifests are untrusted bytes.

use std::collections::BTreeMap;

use crate::id::{ScopeId, VolumeId};

/// Smallest allowed chunk size.
pub const MIN_CHUNK_SIZE: u32 = 4 << 10;
/// Largest allowed chunk size.
pub const MAX_CHUNK_SIZE: u32 = 16 << 20;
/// The chunk size used when nothing else is asked for.
pub const DEFAULT_CHUNK_SIZE: u32 = 64 << 10;

pub(crate) const MAGIC: &[u8; 4] = b"HMAN";
pub(crate) const VERSION: u8 = 1;
/// One chunk table entry: index u64, scope index u16, hash.
const ENTRY_LEN: usize = 8 + 2 + 32;
const MAX_META_ENTRIES: u32 = 4096;

/// A reference to one stored chunk: its key scope and content address.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChunkRef {
    pub scope: ScopeId,
    pub hash: [u8; 32],
}

impl ChunkRef {
    /// The address as 64 hex digits.
    pub fn hex(&self) -> String {
        crate::crypto::hex(&self.hash)
    }
}

/// One immutable generation of a volume.
///
/// Every chunk's plaintext is exactly `chunk_size` bytes (the tail of the
/// last one, beyond `size`, is zero); an index absent from `chunks` is an
/// all-zero chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    pub volume: VolumeId,
    pub seq: u64,
    pub parent: Option<u64>,
    /// The placement generation of the writer that committed it.
    pub fence: u64,
    /// Whose key seals this manifest and takes new chunks.
    pub scope: ScopeId,
    /// Bytes of the device.
    pub size: u64,
    pub chunk_size: u32,
    pub created_at_ms: u64,
    pub meta: BTreeMap<String, String>,
    /// Chunk index → chunk.
    pub chunks: BTreeMap<u64, ChunkRef>,
}

impl Manifest {
    /// Number of chunk slots of the device (the last may be partial).
    pub fn chunk_count(&self) -> u64 {
        chunk_count(self.size, self.chunk_size)
    }
}

/// What a writer proposes to commit; the store assigns seq and timestamp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestDraft {
    pub scope: ScopeId,
    /// The generation this one was built on (`None` for a new volume).
    pub parent: Option<u64>,
    /// The caller's placement generation.
    pub fence: u64,
    pub size: u64,
    pub chunk_size: u32,
    pub meta: BTreeMap<String, String>,
    pub chunks: BTreeMap<u64, ChunkRef>,
}

pub(crate) fn chunk_count(size: u64, chunk_size: u32) -> u64 {
    size.div_ceil(u64::from(chunk_size.max(1)))
}

/// Checks a chunk size: a power of two in 4 KiB..=16 MiB.
pub fn check_chunk_size(chunk_size: u32) -> Result<(), String> {
    if !(MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&chunk_size) || !chunk_size.is_power_of_two() {
        return Err(format!(
            "chunk size {chunk_size} is not a power of two in 4 KiB..=16 MiB"
        ));
    }
    Ok(())
}

/// Checks the shape of a manifest (shared by commit and decode).
pub(crate) fn check_shape(
    size: u64,
    chunk_size: u32,
    chunks: &BTreeMap<u64, ChunkRef>,
) -> Result<(), String> {
    check_chunk_size(chunk_size)?;
    let count = chunk_count(size, chunk_size);
    if let Some((&last, _)) = chunks.last_key_value() {
        if last >= count {
            return Err(format!(
                "chunk index {last} beyond the device ({count} chunks of {chunk_size} bytes)"
            ));
        }
    }
    Ok(())
}

/// The clear header of a manifest object.
pub(crate) fn header(scope: &ScopeId) -> Vec<u8> {
    sealed_header(MAGIC, scope)
}

/// The clear header of a sealed object (a manifest, a journal record):
/// `magic | version | scope_len | scope`.
pub(crate) fn sealed_header(magic: &[u8; 4], scope: &ScopeId) -> Vec<u8> {
    let mut h = Vec::with_capacity(6 + scope.as_str().len());
    h.extend_from_slice(magic);
    h.push(VERSION);
    h.push(scope.as_str().len() as u8);
    h.extend_from_slice(scope.as_str().as_bytes());
    h
}

/// Additional data binding a manifest to its place.
pub(crate) fn aad(header: &[u8], volume: &VolumeId, seq: u64) -> Vec<u8> {
    let mut a = header.to_vec();
    a.extend_from_slice(volume.as_str().as_bytes());
    a.extend_from_slice(&seq.to_be_bytes());
    a
}

/// A manifest object split at its fields.
pub(crate) struct SealedManifest<'a> {
    /// The clear header (part of the AAD).
    pub(crate) header: &'a [u8],
    /// The scope whose key seals the body.
    pub(crate) scope: ScopeId,
    pub(crate) nonce: &'a [u8],
    pub(crate) ciphertext: &'a [u8],
}

/// Splits a manifest object into its clear header, nonce and ciphertext.
pub(crate) fn split_object(obj: &[u8]) -> Result<SealedManifest<'_>, String> {
    split_sealed(MAGIC, obj)
}

/// Splits a sealed object with `magic` (see [`sealed_header`]).
pub(crate) fn split_sealed<'a>(
    magic: &[u8; 4],
    obj: &'a [u8],
) -> Result<SealedManifest<'a>, String> {
    let mut r = Reader::new(obj);
    if r.take(4)? != magic {
        return Err("bad magic".into());
    }
    let version = r.u8()?;
    if version != VERSION {
        return Err(format!("unknown version {version}"));
    }
    let scope = r.name()?;
    let scope = ScopeId::new(scope).map_err(|e| e.to_string())?;
    let header_len = r.pos;
    let nonce = r.take(crate::crypto::NONCE_LEN)?;
    let ct = r.rest();
    Ok(SealedManifest {
        header: &obj[..header_len],
        scope,
        nonce,
        ciphertext: ct,
    })
}

/// Encodes a manifest body.
pub(crate) fn encode_body(m: &Manifest) -> Vec<u8> {
    // Scope table: the manifest's own scope first, then others in order.
    let mut scopes: Vec<&ScopeId> = vec![&m.scope];
    let mut scope_index: BTreeMap<&ScopeId, u16> = BTreeMap::from([(&m.scope, 0)]);
    for c in m.chunks.values() {
        if !scope_index.contains_key(&c.scope) {
            scope_index.insert(&c.scope, scopes.len() as u16);
            scopes.push(&c.scope);
        }
    }
    let mut b = Vec::with_capacity(128 + m.chunks.len() * ENTRY_LEN);
    b.push(m.volume.as_str().len() as u8);
    b.extend_from_slice(m.volume.as_str().as_bytes());
    b.extend_from_slice(&m.seq.to_be_bytes());
    b.push(u8::from(m.parent.is_some()));
    b.extend_from_slice(&m.parent.unwrap_or(0).to_be_bytes());
    b.extend_from_slice(&m.fence.to_be_bytes());
    b.extend_from_slice(&m.size.to_be_bytes());
    b.extend_from_slice(&m.chunk_size.to_be_bytes());
    b.extend_from_slice(&m.created_at_ms.to_be_bytes());
    b.extend_from_slice(&(m.meta.len() as u32).to_be_bytes());
    for (k, v) in &m.meta {
        b.extend_from_slice(&(k.len() as u32).to_be_bytes());
        b.extend_from_slice(k.as_bytes());
        b.extend_from_slice(&(v.len() as u32).to_be_bytes());
        b.extend_from_slice(v.as_bytes());
    }
    b.extend_from_slice(&(scopes.len() as u16).to_be_bytes());
    for s in &scopes {
        b.push(s.as_str().len() as u8);
        b.extend_from_slice(s.as_str().as_bytes());
    }
    b.extend_from_slice(&(m.chunks.len() as u64).to_be_bytes());
    for (index, c) in &m.chunks {
        b.extend_from_slice(&index.to_be_bytes());
        b.extend_from_slice(&scope_index[&c.scope].to_be_bytes());
        b.extend_from_slice(&c.hash);
    }
    b
}

/// Decodes a manifest body; `scope` is the scope named by the clear header.
pub(crate) fn decode_body(body: &[u8], scope: &ScopeId) -> Result<Manifest, String> {
    let mut r = Reader::new(body);
    let volume = VolumeId::new(r.name()?).map_err(|e| e.to_string())?;
    let seq = r.u64()?;
    let has_parent = r.u8()?;
    let parent = r.u64()?;
    let parent = match has_parent {
        0 => None,
        1 => Some(parent),
        _ => return Err("bad parent flag".into()),
    };
    let fence = r.u64()?;
    let size = r.u64()?;
    let chunk_size = r.u32()?;
    check_chunk_size(chunk_size)?;
    let created_at_ms = r.u64()?;
    let meta_count = r.u32()?;
    if meta_count > MAX_META_ENTRIES {
        return Err(format!("{meta_count} meta entries"));
    }
    let mut meta = BTreeMap::new();
    for _ in 0..meta_count {
        let k = r.string()?;
        let v = r.string()?;
        meta.insert(k, v);
    }
    let scope_count = r.u16()?;
    let mut scopes = Vec::with_capacity(usize::from(scope_count).min(r.remaining()));
    for _ in 0..scope_count {
        scopes.push(ScopeId::new(r.name()?).map_err(|e| e.to_string())?);
    }
    if scopes.first() != Some(scope) {
        return Err("scope table does not start with the sealing scope".into());
    }
    let entries = r.u64()?;
    let slots = chunk_count(size, chunk_size);
    if entries > slots {
        return Err(format!("{entries} entries for a device of {slots} chunks"));
    }
    let need = entries
        .checked_mul(ENTRY_LEN as u64)
        .ok_or("entry count overflows")?;
    if need != r.remaining() as u64 {
        return Err(format!(
            "{entries} entries need {need} bytes, {} present",
            r.remaining()
        ));
    }
    let mut chunks = BTreeMap::new();
    let mut prev: Option<u64> = None;
    for _ in 0..entries {
        let index = r.u64()?;
        let si = r.u16()?;
        let hash: [u8; 32] = r.take(32)?.try_into().map_err(|_| "short hash")?;
        if index >= slots || prev.is_some_and(|p| index <= p) {
            return Err(format!(
                "chunk index {index} out of order or beyond the device"
            ));
        }
        prev = Some(index);
        let scope = scopes
            .get(usize::from(si))
            .ok_or_else(|| format!("scope index {si} out of range"))?
            .clone();
        chunks.insert(index, ChunkRef { scope, hash });
    }
    Ok(Manifest {
        volume,
        seq,
        parent,
        fence,
        scope: scope.clone(),
        size,
        chunk_size,
        created_at_ms,
        meta,
        chunks,
    })
}

/// A bounds-checked cursor over untrusted bytes.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pub(crate) pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.remaining() {
            return Err("truncated".into());
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub(crate) fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }

    pub(crate) fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, String> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, String> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_be_bytes(a))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_be_bytes(a))
    }

    /// A u8-length-prefixed UTF-8 name.
    pub(crate) fn name(&mut self) -> Result<&'a str, String> {
        let n = usize::from(self.u8()?);
        std::str::from_utf8(self.take(n)?).map_err(|_| "name is not UTF-8".into())
    }

    /// A u32-length-prefixed UTF-8 string.
    pub(crate) fn string(&mut self) -> Result<String, String> {
        let n = self.u32()? as usize;
        let s = std::str::from_utf8(self.take(n)?).map_err(|_| "meta is not UTF-8")?;
        Ok(s.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(entries: u64) -> Manifest {
        let a = ScopeId::new("a").unwrap();
        let b = ScopeId::new("base").unwrap();
        Manifest {
            volume: VolumeId::new("vol").unwrap(),
            seq: 3,
            parent: Some(2),
            fence: 9,
            scope: a.clone(),
            size: 10 << 20,
            chunk_size: 64 << 10,
            created_at_ms: 123,
            meta: BTreeMap::from([("kind".into(), "rootfs".into())]),
            chunks: (0..entries)
                .map(|i| {
                    let scope = if i % 2 == 0 { a.clone() } else { b.clone() };
                    (
                        i * 2,
                        ChunkRef {
                            scope,
                            hash: [i as u8; 32],
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn body_round_trip() {
        let m = sample(50);
        let body = encode_body(&m);
        assert_eq!(decode_body(&body, &m.scope).unwrap(), m);
    }

    #[test]
    fn hostile_bodies_are_errors_not_panics() {
        let m = sample(50);
        let body = encode_body(&m);
        // Every truncation.
        for n in 0..body.len() {
            assert!(decode_body(&body[..n], &m.scope).is_err(), "len {n}");
        }
        // A huge entry count.
        let count_at = body.len() - 50 * ENTRY_LEN - 8;
        let mut huge = body.clone();
        huge[count_at..count_at + 8].copy_from_slice(&u64::MAX.to_be_bytes());
        assert!(decode_body(&huge, &m.scope).is_err());
        // Every single-byte corruption decodes or errors, never panics.
        for i in 0..body.len() {
            let mut b = body.clone();
            b[i] ^= 0xff;
            let _ = decode_body(&b, &m.scope);
        }
        // Garbage objects.
        for obj in [&b""[..], b"HMAN", b"HMAN\x01\xff", b"XXXX\x01\x01a"] {
            assert!(split_object(obj).is_err());
        }
    }

    #[test]
    fn chunk_size_rules() {
        assert!(check_chunk_size(4096).is_ok());
        assert!(check_chunk_size(16 << 20).is_ok());
        for bad in [0, 2048, 4097, 32 << 20, 96 << 10] {
            assert!(check_chunk_size(bad).is_err(), "{bad}");
        }
    }
}
