//! The flush journal: what a writer made durable since its volume's last
//! generation.
//!
//! A generation maps the whole device; writing one for every guest `fsync`
//! would cost a manifest of the whole disk per flush. A flush instead
//! uploads the chunks written since the previous flush and appends a
//! **journal record** naming only them, on top of the head generation it
//! was built on (its *base*):
//!
//! ```text
//! journal/<volume>/<base:016x>/<n:016x>
//!
//! clear header:  "HJNL" | version u8 = 1 | scope_len u8 | scope
//! sealed:        nonce[24] | XChaCha20-Poly1305(body),
//!                AAD = "hearth journal v1" | header | volume | base u64 | n u64
//! body:          volume_len u8 | volume | base u64 | n u64 | fence u64
//!                | size u64 | chunk_size u32
//!                | entry_count u64 | { index u64 | kind u8 | hash[32] if kind = 1 }*
//! ```
//!
//! Kind 1: the chunk now holds the content with that address in the
//! record's scope; kind 0: the chunk is zeros. Entries are strictly
//! increasing by index. Records are created with `PutMode::Create`, `n`
//! counting from 0 per base, by the one writer holding the volume's
//! placement; record `n` applies on top of the base and records `0..n`.
//!
//! **Folding.** [`Store::claim`] (every open of a volume by a host) writes
//! generation `base + 1` holding the head plus its records, replayed in
//! order while they are contiguous from 0 and carry the head's fence, then
//! deletes them. So a volume is always opened on a generation with an empty
//! journal, and a record at a base older than the head is garbage: its
//! writer was either folded already or fenced (a zombie host appending
//! after another host claimed the volume writes at a base nobody replays).
//! [`Store::gc`] deletes such records and keeps every chunk that any
//! remaining record names.

use std::collections::BTreeMap;

use futures_util::TryStreamExt;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStoreExt, PutMode, PutPayload};

use crate::error::StoreError;
use crate::id::{ScopeId, VolumeId};
use crate::manifest::{self, ChunkRef, Reader};
use crate::store::{backend, get_bounded, parse_seq, Store};

const MAGIC: &[u8; 4] = b"HJNL";
const AAD_PREFIX: &[u8] = b"hearth journal v1";
/// A record naming every chunk of a 1 TiB device at 64 KiB chunks is
/// 700 MB; a record is only what one flush wrote, so far less.
const MAX_RECORD_OBJECT: u64 = 1 << 30;

/// One flush's worth of chunks, on top of generation `base`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalRecord {
    pub volume: VolumeId,
    /// The generation this record applies on top of.
    pub base: u64,
    /// Position among the records of `base`, from 0.
    pub n: u64,
    /// The writer's placement fence (the base's: see the module docs).
    pub fence: u64,
    /// Scope of the chunks the entries name (the writer's).
    pub scope: ScopeId,
    /// Device size after this record (a disk only grows).
    pub size: u64,
    pub chunk_size: u32,
    /// Chunk index → the address of its new content in `scope`, or `None`
    /// for zeros.
    pub entries: BTreeMap<u64, Option<[u8; 32]>>,
}

impl JournalRecord {
    /// Applies this record to a chunk map.
    pub fn apply(&self, chunks: &mut BTreeMap<u64, ChunkRef>) {
        for (&i, e) in &self.entries {
            match e {
                Some(hash) => chunks.insert(
                    i,
                    ChunkRef {
                        scope: self.scope.clone(),
                        hash: *hash,
                    },
                ),
                None => chunks.remove(&i),
            };
        }
    }
}

pub(crate) fn journal_prefix(volume: &VolumeId) -> ObjPath {
    ObjPath::from(format!("journal/{volume}"))
}

fn base_prefix(volume: &VolumeId, base: u64) -> ObjPath {
    ObjPath::from(format!("journal/{volume}/{base:016x}"))
}

fn record_path(volume: &VolumeId, base: u64, n: u64) -> ObjPath {
    ObjPath::from(format!("journal/{volume}/{base:016x}/{n:016x}"))
}

/// `journal/<volume>/<base>/<n>` → its parts.
pub(crate) fn parse_record_path(p: &ObjPath) -> Option<(VolumeId, u64, u64)> {
    let parts: Vec<_> = p.parts().collect();
    if parts.len() != 4 || parts[0].as_ref() != "journal" {
        return None;
    }
    Some((
        VolumeId::new(parts[1].as_ref()).ok()?,
        parse_seq(parts[2].as_ref())?,
        parse_seq(parts[3].as_ref())?,
    ))
}

fn aad(header: &[u8], volume: &VolumeId, base: u64, n: u64) -> Vec<u8> {
    let mut a = AAD_PREFIX.to_vec();
    a.extend_from_slice(header);
    a.extend_from_slice(volume.as_str().as_bytes());
    a.extend_from_slice(&base.to_be_bytes());
    a.extend_from_slice(&n.to_be_bytes());
    a
}

/// Checks what a record may say about its device.
fn check_shape(
    size: u64,
    chunk_size: u32,
    entries: &BTreeMap<u64, Option<[u8; 32]>>,
) -> Result<(), String> {
    manifest::check_chunk_size(chunk_size)?;
    let count = manifest::chunk_count(size, chunk_size);
    if let Some((&last, _)) = entries.last_key_value() {
        if last >= count {
            return Err(format!(
                "chunk index {last} beyond the device ({count} chunks of {chunk_size} bytes)"
            ));
        }
    }
    Ok(())
}

pub(crate) fn encode_body(r: &JournalRecord) -> Vec<u8> {
    let mut b = Vec::with_capacity(64 + r.entries.len() * 41);
    b.push(r.volume.as_str().len() as u8);
    b.extend_from_slice(r.volume.as_str().as_bytes());
    for v in [r.base, r.n, r.fence, r.size] {
        b.extend_from_slice(&v.to_be_bytes());
    }
    b.extend_from_slice(&r.chunk_size.to_be_bytes());
    b.extend_from_slice(&(r.entries.len() as u64).to_be_bytes());
    for (i, e) in &r.entries {
        b.extend_from_slice(&i.to_be_bytes());
        match e {
            Some(hash) => {
                b.push(1);
                b.extend_from_slice(hash);
            }
            None => b.push(0),
        }
    }
    b
}

/// Decodes a record body (untrusted bytes); `scope` is the sealing scope.
pub(crate) fn decode_body(body: &[u8], scope: &ScopeId) -> Result<JournalRecord, String> {
    let mut r = Reader::new(body);
    let volume = VolumeId::new(r.name()?).map_err(|e| e.to_string())?;
    let base = r.u64()?;
    let n = r.u64()?;
    let fence = r.u64()?;
    let size = r.u64()?;
    let chunk_size = r.u32()?;
    manifest::check_chunk_size(chunk_size)?;
    let count = r.u64()?;
    let slots = manifest::chunk_count(size, chunk_size);
    if count > slots || count > r.remaining() as u64 / 9 {
        return Err(format!("{count} entries for a device of {slots} chunks"));
    }
    let mut entries = BTreeMap::new();
    let mut prev: Option<u64> = None;
    for _ in 0..count {
        let i = r.u64()?;
        if i >= slots || prev.is_some_and(|p| i <= p) {
            return Err(format!("chunk index {i} out of order or beyond the device"));
        }
        prev = Some(i);
        let e = match r.u8()? {
            0 => None,
            1 => Some(r.take(32)?.try_into().map_err(|_| "short hash")?),
            k => return Err(format!("unknown entry kind {k}")),
        };
        entries.insert(i, e);
    }
    if r.remaining() != 0 {
        return Err(format!("{} bytes after the entries", r.remaining()));
    }
    Ok(JournalRecord {
        volume,
        base,
        n,
        fence,
        scope: scope.clone(),
        size,
        chunk_size,
        entries,
    })
}

impl Store {
    /// Appends `record` to its volume's journal. A record already at that
    /// place is [`StoreError::JournalExists`] (this writer's own earlier
    /// attempt whose answer was lost: write the next one).
    pub async fn append_journal(&self, record: &JournalRecord) -> Result<(), StoreError> {
        let volume = &record.volume;
        check_shape(record.size, record.chunk_size, &record.entries).map_err(|reason| {
            StoreError::InvalidDraft {
                volume: volume.clone(),
                reason,
            }
        })?;
        let keys = self.scope_keys(&record.scope, true).await?;
        let h = manifest::sealed_header(MAGIC, &record.scope);
        let (nonce, ct) = keys.seal_manifest(
            &encode_body(record),
            &aad(&h, volume, record.base, record.n),
        );
        let mut obj = h;
        obj.extend_from_slice(&nonce);
        obj.extend_from_slice(&ct);
        let put = self
            .inner
            .os
            .put_opts(
                &record_path(volume, record.base, record.n),
                PutPayload::from(obj),
                PutMode::Create.into(),
            )
            .await;
        match put {
            Ok(_) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. }) => Err(StoreError::JournalExists {
                volume: volume.clone(),
                base: record.base,
                n: record.n,
            }),
            Err(e) => Err(backend(format!(
                "append journal record {} on generation {} of volume {volume}",
                record.n, record.base
            ))(e)),
        }
    }

    /// The positions of the records on generation `base`, ascending.
    async fn journal_positions(
        &self,
        volume: &VolumeId,
        base: u64,
    ) -> Result<Vec<u64>, StoreError> {
        let metas: Vec<_> = self
            .inner
            .os
            .list(Some(&base_prefix(volume, base)))
            .try_collect()
            .await
            .map_err(backend(format!("list the journal of volume {volume}")))?;
        let mut ns: Vec<u64> = metas
            .iter()
            .filter_map(|m| parse_record_path(&m.location))
            .filter(|(v, b, _)| v == volume && *b == base)
            .map(|(_, _, n)| n)
            .collect();
        ns.sort_unstable();
        Ok(ns)
    }

    /// One record.
    pub async fn journal_record(
        &self,
        volume: &VolumeId,
        base: u64,
        n: u64,
    ) -> Result<Option<JournalRecord>, StoreError> {
        let what = format!("journal record {n} on generation {base} of volume {volume}");
        let Some(obj) = get_bounded(
            &*self.inner.os,
            &record_path(volume, base, n),
            MAX_RECORD_OBJECT,
            &what,
        )
        .await?
        else {
            return Ok(None);
        };
        let corrupt = |reason: String| StoreError::CorruptManifest {
            volume: volume.clone(),
            seq: base,
            reason: format!("journal record {n}: {reason}"),
        };
        let sealed = manifest::split_sealed(MAGIC, &obj).map_err(corrupt)?;
        let keys = self.scope_keys(&sealed.scope, false).await?;
        let body = keys
            .open_manifest(
                sealed.nonce,
                sealed.ciphertext,
                &aad(sealed.header, volume, base, n),
            )
            .ok_or_else(|| corrupt("does not authenticate".into()))?;
        let rec = decode_body(&body, &sealed.scope).map_err(corrupt)?;
        if &rec.volume != volume || rec.base != base || rec.n != n {
            return Err(corrupt("names another place".into()));
        }
        Ok(Some(rec))
    }

    /// The records that apply on top of generation `base` at `fence`: those
    /// contiguous from 0 and written at that fence (see the module docs).
    pub async fn journal(
        &self,
        volume: &VolumeId,
        base: u64,
        fence: u64,
    ) -> Result<Vec<JournalRecord>, StoreError> {
        let mut out = Vec::new();
        for (expect, n) in self
            .journal_positions(volume, base)
            .await?
            .into_iter()
            .enumerate()
        {
            if n != expect as u64 {
                tracing::warn!(%volume, base, missing = expect, "journal has a gap; later records are not replayed");
                break;
            }
            let Some(rec) = self.journal_record(volume, base, n).await? else {
                break;
            };
            if rec.fence != fence {
                tracing::warn!(%volume, base, n, fence = rec.fence, head_fence = fence, "journal record from another placement; not replayed");
                break;
            }
            out.push(rec);
        }
        Ok(out)
    }

    /// Deletes the records on generation `base` (after a generation that
    /// holds them was committed). Returns how many were deleted.
    pub async fn delete_journal(&self, volume: &VolumeId, base: u64) -> Result<usize, StoreError> {
        let ns = self.journal_positions(volume, base).await?;
        for &n in &ns {
            self.delete_record(volume, base, n).await?;
        }
        Ok(ns.len())
    }

    pub(crate) async fn delete_record(
        &self,
        volume: &VolumeId,
        base: u64,
        n: u64,
    ) -> Result<(), StoreError> {
        match self.inner.os.delete(&record_path(volume, base, n)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(backend(format!(
                "delete journal record {n} on generation {base} of volume {volume}"
            ))(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> JournalRecord {
        JournalRecord {
            volume: VolumeId::new("vm-1").unwrap(),
            base: 7,
            n: 2,
            fence: 4,
            scope: ScopeId::new("vm-1").unwrap(),
            size: 10 << 20,
            chunk_size: 64 << 10,
            entries: BTreeMap::from([(0, Some([1; 32])), (3, None), (159, Some([9; 32]))]),
        }
    }

    #[test]
    fn body_round_trip() {
        let r = sample();
        assert_eq!(decode_body(&encode_body(&r), &r.scope).unwrap(), r);
    }

    #[test]
    fn hostile_bodies_are_errors_not_panics() {
        let r = sample();
        let body = encode_body(&r);
        for n in 0..body.len() {
            assert!(decode_body(&body[..n], &r.scope).is_err(), "len {n}");
        }
        for i in 0..body.len() {
            for x in [0x00, 0x01, 0x80, 0xff] {
                let mut b = body.clone();
                b[i] ^= x;
                let _ = decode_body(&b, &r.scope);
            }
        }
        let mut trailing = body.clone();
        trailing.push(0);
        assert!(decode_body(&trailing, &r.scope).is_err());
    }

    #[test]
    fn apply_sets_and_zeroes_chunks() {
        let r = sample();
        let other = ScopeId::new("images").unwrap();
        let mut chunks = BTreeMap::from([
            (
                3,
                ChunkRef {
                    scope: other.clone(),
                    hash: [5; 32],
                },
            ),
            (
                4,
                ChunkRef {
                    scope: other.clone(),
                    hash: [6; 32],
                },
            ),
        ]);
        r.apply(&mut chunks);
        assert_eq!(chunks.len(), 3);
        assert_eq!(chunks[&0].scope, r.scope);
        assert!(!chunks.contains_key(&3));
        assert_eq!(chunks[&4].scope, other);
    }

    #[test]
    fn record_paths_parse_back() {
        let v = VolumeId::new("vm-1").unwrap();
        assert_eq!(
            parse_record_path(&record_path(&v, 7, 2)),
            Some((v.clone(), 7, 2))
        );
        assert_eq!(parse_record_path(&base_prefix(&v, 7)), None);
    }
}
