//! Key-encryption keys: the seam to a KMS.

use chacha20poly1305::{KeyInit, XChaCha20Poly1305};

use crate::crypto::{self, NONCE_LEN};
use crate::error::StoreError;

/// Wraps and unwraps scope data keys. A KMS-backed implementation lives
/// behind this trait; [`KeyFileKek`] is the default.
///
/// `unwrap` must fail (with [`StoreError::KekRejected`]) rather than return
/// a wrong key: the store maps that to [`StoreError::WrongKey`] naming the
/// scope.
pub trait Kek: Send + Sync {
    /// A stable, non-secret identifier, recorded beside each wrapped key so
    /// that a store opened with another KEK fails early and clearly.
    fn id(&self) -> &str;
    /// Wraps a data key.
    fn wrap(&self, data_key: &[u8; 32]) -> Result<Vec<u8>, StoreError>;
    /// Unwraps what [`Kek::wrap`] produced.
    fn unwrap(&self, wrapped: &[u8]) -> Result<[u8; 32], StoreError>;
}

/// A KEK derived from a 32-byte master key file (`<data>/master.key`).
/// Wrapped keys are `nonce(24) || XChaCha20-Poly1305(data key)`.
pub struct KeyFileKek {
    id: String,
    aead: XChaCha20Poly1305,
}

const WRAP_AAD: &[u8] = b"hearth store wrapped data key v1";

impl KeyFileKek {
    /// Derives the KEK from the master key.
    pub fn from_master(master: [u8; 32]) -> Self {
        let key = blake3::derive_key("hearth store kek v1", &master);
        // The id identifies the key without revealing anything usable.
        let fingerprint = blake3::derive_key("hearth store kek id v1", &master);
        let id = format!("keyfile:{}", &crypto::hex(&fingerprint)[..16]);
        Self {
            id,
            aead: XChaCha20Poly1305::new((&key).into()),
        }
    }
}

impl Kek for KeyFileKek {
    fn id(&self) -> &str {
        &self.id
    }

    fn wrap(&self, data_key: &[u8; 32]) -> Result<Vec<u8>, StoreError> {
        let (nonce, ct) = crypto::seal(&self.aead, data_key, WRAP_AAD);
        let mut out = Vec::with_capacity(NONCE_LEN + ct.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&ct);
        Ok(out)
    }

    fn unwrap(&self, wrapped: &[u8]) -> Result<[u8; 32], StoreError> {
        let rejected = || StoreError::KekRejected {
            kek: self.id.clone(),
        };
        if wrapped.len() < NONCE_LEN {
            return Err(rejected());
        }
        let (nonce, ct) = wrapped.split_at(NONCE_LEN);
        let key = crypto::open(&self.aead, nonce, ct, WRAP_AAD).ok_or_else(rejected)?;
        key.try_into().map_err(|_| rejected())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_unwrap_and_wrong_kek() {
        let a = KeyFileKek::from_master([1; 32]);
        let b = KeyFileKek::from_master([2; 32]);
        assert_ne!(a.id(), b.id());
        let w = a.wrap(&[7; 32]).unwrap();
        assert_eq!(a.unwrap(&w).unwrap(), [7; 32]);
        assert!(matches!(b.unwrap(&w), Err(StoreError::KekRejected { .. })));
        assert!(a.unwrap(&w[..10]).is_err());
    }
}
