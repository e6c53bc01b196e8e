//! AEAD sealing, chunk addresses and the per-scope key schedule.
//!
//! One 32-byte random data key per scope; everything used is derived from
//! it with BLAKE3's KDF so that the chunk-address key (which leaks equality
//! of plaintexts) is never the encryption key.

use chacha20poly1305::aead::{Aead, Payload};
use chacha20poly1305::{KeyInit, XChaCha20Poly1305, XNonce};

/// XChaCha20-Poly1305 nonce length.
pub(crate) const NONCE_LEN: usize = 24;
/// Poly1305 tag length.
pub(crate) const TAG_LEN: usize = 16;

/// The keys of one scope, derived from its data key.
pub(crate) struct ScopeKeys {
    /// Keyed-hash key for chunk addresses.
    id_key: [u8; 32],
    chunk_aead: XChaCha20Poly1305,
    manifest_aead: XChaCha20Poly1305,
}

impl ScopeKeys {
    pub(crate) fn derive(data_key: &[u8; 32]) -> Self {
        let chunk_key = blake3::derive_key("hearth chunk key v1", data_key);
        let manifest_key = blake3::derive_key("hearth manifest key v1", data_key);
        Self {
            id_key: blake3::derive_key("hearth chunk id v1", data_key),
            chunk_aead: XChaCha20Poly1305::new((&chunk_key).into()),
            manifest_aead: XChaCha20Poly1305::new((&manifest_key).into()),
        }
    }

    /// The content address of a chunk in this scope.
    pub(crate) fn chunk_id(&self, plaintext: &[u8]) -> [u8; 32] {
        *blake3::keyed_hash(&self.id_key, plaintext).as_bytes()
    }

    pub(crate) fn seal_chunk(&self, plaintext: &[u8], aad: &[u8]) -> ([u8; NONCE_LEN], Vec<u8>) {
        seal(&self.chunk_aead, plaintext, aad)
    }

    pub(crate) fn open_chunk(&self, nonce: &[u8], ct: &[u8], aad: &[u8]) -> Option<Vec<u8>> {
        open(&self.chunk_aead, nonce, ct, aad)
    }

    pub(crate) fn seal_manifest(&self, plaintext: &[u8], aad: &[u8]) -> ([u8; NONCE_LEN], Vec<u8>) {
        seal(&self.manifest_aead, plaintext, aad)
    }

    pub(crate) fn open_manifest(&self, nonce: &[u8], ct: &[u8], aad: &[u8]) -> Option<Vec<u8>> {
        open(&self.manifest_aead, nonce, ct, aad)
    }
}

/// A fresh random nonce (or key).
pub(crate) fn random<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    // The OS RNG failing is not recoverable and not something to paper
    // over with a weaker source.
    #[allow(clippy::expect_used)]
    getrandom::fill(&mut out).expect("OS random number generator failed");
    out
}

pub(crate) fn seal(aead: &XChaCha20Poly1305, msg: &[u8], aad: &[u8]) -> ([u8; NONCE_LEN], Vec<u8>) {
    let nonce = random::<NONCE_LEN>();
    // Encryption only fails for messages beyond 256 GiB.
    #[allow(clippy::expect_used)]
    let ct = aead
        .encrypt(XNonce::from_slice(&nonce), Payload { msg, aad })
        .expect("xchacha20poly1305 encrypt");
    (nonce, ct)
}

pub(crate) fn open(
    aead: &XChaCha20Poly1305,
    nonce: &[u8],
    ct: &[u8],
    aad: &[u8],
) -> Option<Vec<u8>> {
    if nonce.len() != NONCE_LEN || ct.len() < TAG_LEN {
        return None;
    }
    aead.decrypt(XNonce::from_slice(nonce), Payload { msg: ct, aad })
        .ok()
}

/// Lower-case hex of a 32-byte hash.
pub(crate) fn hex(hash: &[u8; 32]) -> String {
    blake3::Hash::from_bytes(*hash).to_hex().to_string()
}

/// Parses 64 hex digits.
pub(crate) fn parse_hex(s: &str) -> Option<[u8; 32]> {
    blake3::Hash::from_hex(s).ok().map(|h| *h.as_bytes())
}
