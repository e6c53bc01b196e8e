//! The one error type of the store.

use std::path::PathBuf;

use crate::id::{ScopeId, VolumeId};

/// Everything that can go wrong in the store. Messages name the volume,
/// scope or chunk involved; they never carry key material or URL secrets.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A scope or volume name outside `[A-Za-z0-9._-]{1,128}`.
    #[error("invalid {kind} name {value:?}: {reason}")]
    InvalidName {
        kind: &'static str,
        value: String,
        reason: &'static str,
    },
    /// The store URL could not be understood (the URL itself is not repeated:
    /// it may hold credentials).
    #[error("invalid store url: {reason}")]
    BadUrl { reason: String },
    /// Local file I/O (import/export files, key files, cache).
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The object store failed.
    #[error("object store: {op}")]
    Backend {
        op: String,
        #[source]
        source: object_store::Error,
    },
    /// A KEK could not unwrap bytes it was given (wrong KEK or tampered
    /// bytes). Returned by [`crate::Kek`] implementations; the store reports
    /// it as [`StoreError::WrongKey`] naming the scope.
    #[error("kek {kek} cannot unwrap this data key")]
    KekRejected { kek: String },
    /// The scope's data key is wrapped under another KEK, or does not unwrap.
    #[error("data key of scope {scope} does not unwrap with kek {kek} (wrong key?)")]
    WrongKey { scope: ScopeId, kek: String },
    /// A scope that has no data key in the store.
    #[error("scope {scope} has no data key in the store")]
    MissingKey { scope: ScopeId },
    /// The stored data key object is malformed.
    #[error("data key object of scope {scope} is malformed: {reason}")]
    CorruptKey {
        scope: ScopeId,
        reason: &'static str,
    },
    /// A chunk whose object fails authentication or whose content does not
    /// hash to its address. Never returned as data.
    #[error("chunk {chunk} of scope {scope} is corrupt")]
    Corrupt { scope: ScopeId, chunk: String },
    /// A chunk referenced but absent from the object store.
    #[error("chunk {chunk} of scope {scope} is missing")]
    MissingChunk { scope: ScopeId, chunk: String },
    /// A manifest that does not authenticate or decode.
    #[error("manifest {seq} of volume {volume} is corrupt: {reason}")]
    CorruptManifest {
        volume: VolumeId,
        seq: u64,
        reason: String,
    },
    /// No such generation.
    #[error("volume {volume} has no generation {seq}")]
    NoSuchGeneration { volume: VolumeId, seq: u64 },
    /// A commit or claim by a writer whose placement generation is older
    /// than the head's: another host owns the volume now.
    #[error("volume {volume} is fenced at {head_fence}; our fence {ours} is stale")]
    Fenced {
        volume: VolumeId,
        head_fence: u64,
        ours: u64,
    },
    /// A commit whose parent is not the head (somebody else committed).
    #[error("volume {volume}: commit on parent {parent:?} but the head is {head:?}")]
    Conflict {
        volume: VolumeId,
        parent: Option<u64>,
        head: Option<u64>,
    },
    /// A journal record already exists at that place (a write whose
    /// answer was lost landed after all).
    #[error("volume {volume}: journal record {n} on generation {base} already exists")]
    JournalExists { volume: VolumeId, base: u64, n: u64 },
    /// A draft that cannot become a manifest (bad chunk size, chunk beyond
    /// the device size, …).
    #[error("invalid generation for volume {volume}: {reason}")]
    InvalidDraft { volume: VolumeId, reason: String },
    /// The store answered, but does not give back what it was given.
    #[error("the store is not usable: {reason}")]
    Unusable { reason: String },
    /// A blocking task panicked or was cancelled.
    #[error("background task failed: {what}")]
    Task { what: &'static str },
}
