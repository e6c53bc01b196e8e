//! hearth-store: block-device images as **generations** on object storage.
//!
//! A volume (a VM root disk, a guest memory file) is a chain of immutable
//! [`Manifest`]s, each mapping fixed-size chunk indices to [`ChunkRef`]s
//! (key scope + content address). Chunks are encrypted, content-addressed
//! and deduplicated within a [`ScopeId`]; a [`Store`] reads and writes them
//! through `object_store` (a local directory or S3) with a disposable,
//! size-bounded local cache.
//!
//! # Object layout
//!
//! ```text
//! keys/<scope>                      "HKEY" | v1 | kek id | scope check[32] | Kek::wrap(data key)
//! chunks/<scope>/<hex[0..2]>/<hex>  "HCHK" | v1 | nonce[24] | XChaCha20-Poly1305(plaintext)
//! volumes/<volume>/<seq:016x>       "HMAN" | v1 | scope | nonce[24] | sealed body (see manifest.rs)
//! journal/<volume>/<base>/<n>       "HJNL" | v1 | scope | nonce[24] | sealed record (see journal.rs)
//! shared/<scope>                    a mark: other volumes may name the scope's chunks (see sweep.rs)
//! ```
//!
//! - A scope's 32-byte random data key is wrapped by a [`Kek`] (the KMS
//!   seam; [`KeyFileKek`] derives one from the host's master key file).
//!   Subkeys are derived from it with BLAKE3's KDF: the chunk address key
//!   (`blake3::keyed_hash(derive_key("hearth chunk id v1", data key),
//!   plaintext)`, so equal plaintexts dedup within a scope and addresses
//!   say nothing across scopes), the chunk AEAD key and the manifest AEAD
//!   key. A wrong KEK is [`StoreError::WrongKey`], never garbage.
//! - A chunk's AAD is its scope and address, and reading checks both the
//!   tag and that the plaintext hashes to the address; anything else is
//!   [`StoreError::Corrupt`]. The cache holds the same encrypted objects
//!   and is verified the same way (a bad entry is dropped and refetched).
//! - Manifests are self-describing: the sealing scope is in a clear
//!   header, so the object store plus the KEK read any generation.
//!
//! # Commits and fencing
//!
//! Manifests are created with `PutMode::Create` (`If-None-Match: *` on S3),
//! so two writers can never both create seq N. A draft names its `parent`
//! and its writer's placement `fence`: a head with a higher fence is
//! [`StoreError::Fenced`], a head that is not the parent is
//! [`StoreError::Conflict`]. [`Store::claim`] lets a host taking a volume
//! over write a generation at its new fence, after which a zombie writer
//! with the old fence can never commit.
//!
//! # Why GC is safe against concurrent commits
//!
//! [`Store::gc`] (1) prunes old generations (never a head), (2) lists
//! chunks with their last-modified times, (3) lists and reads every
//! remaining manifest, (4) deletes only chunks referenced by none of them
//! AND older than `grace`, re-reading each one's age just before deleting.
//!
//! A commit uploads its chunks before creating its manifest, and
//! [`Store::put_chunk`] always re-PUTs (refreshing the object's age) unless
//! this very instance PUT it less than grace/2 ago. Take a manifest M that
//! GC's step 3 did not see (created after it) referencing chunk C:
//! - if C came from M's parent P, P was the head when M was built and
//!   heads are never pruned, so P (or a later generation naming C) was
//!   seen in step 3 — unless P itself was deleted by `delete_volume`, which
//!   is the caller's business;
//! - if the writer put C, it did so shortly before M. If that PUT preceded
//!   step 2, C was listed with an age below grace (provided a writer
//!   commits within grace/2 of its puts) and is kept. If it came after
//!   step 2, the re-check of C's age just before its deletion sees the
//!   fresh PUT and keeps it.
//!
//! **Flush journals** follow the same rule: a record is created after the
//! chunks it names are put, and GC reads every record (step 3) before the
//! manifests, so a record folded into a generation meanwhile is found in
//! one or the other, and one appended after step 2 names young chunks.
//! GC deletes a record only when a newer generation of its volume
//! superseded it (its base is older than the head it listed), or — for a
//! volume with no generation in its listing — once the record is older
//! than grace: that volume may have been created after the listing, with
//! its first flush already in the journal (deleting it lost that flush).
//!
//! **Many writers, one store (a fleet).** Nothing above depends on who
//! writes: each volume has one writer at a time (fenced manifests), and
//! GC reasons only about objects and their ages, so hosts committing
//! concurrently to one store are as safe as one host. Other writers'
//! operations keep the same order: `copy_volume` marks scopes shared and
//! creates its manifest from one it read (naming chunks a kept generation
//! names); the per-writer sweep (`sweep.rs`) deletes only chunks of an
//! unshared scope of its own volume. Two GC runs at once are safe too
//! (each deletion is of an unreferenced chunk older than grace, and a
//! manifest another run pruned is skipped), only wasteful, so a fleet runs
//! one at a time under the `gc` leader lease (see `hearth-control`'s
//! `gc.rs`). A chunk GC deletes is forgotten as recently put by its own
//! instance, so a writer sharing that instance uploads it again.
//!
//! What the argument assumes: a writer commits (or flushes) within grace/2
//! of putting a chunk it names (an upload that takes longer than that
//! needs a longer grace); clocks of GC's host and the object store agree
//! to well within grace (ages are measured against GC's clock); and the
//! remaining window is a re-PUT landing between GC's re-check and its
//! DELETE of that same chunk (one round trip), of a chunk that was already
//! unreferenced and older than grace. GC aborts on any manifest it cannot
//! read rather than guess. `tests/local.rs` races three writers (commits,
//! flushes, new volumes, snapshot copies, content reused from garbage)
//! against GC run again and again with a 2 s grace, then reads back every
//! generation GC kept, chunk by chunk.
//!
//! # Cache
//!
//! `<cache_dir>/<scope>/<hash hex>`, mode 0700, bounded by
//! `cache_max_bytes` (least recently used by mtime, touched on hit). It may
//! be deleted whenever nothing runs.

mod backend;
mod cache;
mod crypto;
mod error;
mod gc;
mod id;
pub mod journal;
mod kek;
mod manifest;
mod probe;
mod store;
pub mod sweep;

pub use error::StoreError;
pub use gc::{GcOptions, GcReport};
pub use id::{ScopeId, VolumeId, MAX_NAME_LEN};
pub use journal::JournalRecord;
pub use kek::{Kek, KeyFileKek};
pub use manifest::{
    check_chunk_size, ChunkRef, Manifest, ManifestDraft, DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE,
    MIN_CHUNK_SIZE,
};
pub use store::{Store, StoreConfig, StoreStats, CONCURRENCY, DEFAULT_GC_GRACE};
