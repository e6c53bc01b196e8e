//! Secrets at rest: values the control plane keeps in the database (the
//! download-link key, later workspace secrets) are sealed with
//! XChaCha20-Poly1305 under a master key that is never in the database.
//!
//! The master key is 32 random bytes in a file (`hearth up`:
//! `<data>/master.key`, mode 0600, created on first start; a fleet gives
//! every control plane the same file). A sealed value is
//! `hs1:` + base64url(nonce ‖ ciphertext ‖ tag); the secret's name is the
//! associated data, so a sealed value moved to another name fails to open.
//! Opening under the wrong master key fails closed.

use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};

const PREFIX: &str = "hs1:";
const NONCE: usize = 24;

/// Why a master key or a sealed value could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error(transparent)]
    KeyFile(#[from] hearth_fence::keyfile::KeyFileError),
    #[error("secret {name} is not sealed")]
    NotSealed { name: String },
    #[error("secret {name} cannot be opened with this master key (wrong key or damaged value)")]
    Open { name: String },
    #[error("no randomness: {0}")]
    Random(String),
}

/// What the master key's file is called in errors.
const MASTER_KEY_FILE: &str = "master key file";

/// The key that seals secrets at rest.
#[derive(Clone)]
pub struct MasterKey([u8; 32]);

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey(..)")
    }
}

/// `n` random bytes from the OS.
pub(crate) fn random<const N: usize>() -> Result<[u8; N], SecretError> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| SecretError::Random(e.to_string()))?;
    Ok(b)
}

impl MasterKey {
    /// A fresh key held only in memory (tests; a process whose sealed
    /// values need not outlive it).
    pub fn ephemeral() -> Self {
        // getrandom failing means the OS has no entropy source at all; fall
        // back to uuid's generator rather than panic.
        random::<32>().map(Self).unwrap_or_else(|_| {
            let mut b = [0u8; 32];
            b[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
            b[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
            Self(b)
        })
    }

    /// The key in `path`, created (0600, exclusively) when absent. A key
    /// file others can read is refused.
    pub fn load_or_create(path: &Path) -> Result<Self, SecretError> {
        use hearth_fence::keyfile::{self, Size};
        let bytes = keyfile::load_or_create(MASTER_KEY_FILE, path, Size::Exactly(32), || {
            random::<32>()
                .map(|k| keyfile::Zeroizing::new(k.to_vec()))
                .map_err(std::io::Error::other)
        })?;
        let key: [u8; 32] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| SecretError::Random("the key file's length changed".into()))?;
        Ok(Self(key))
    }

    fn cipher(&self) -> XChaCha20Poly1305 {
        XChaCha20Poly1305::new((&self.0).into())
    }

    /// Seals `plain` as the secret called `name`.
    pub fn seal(&self, name: &str, plain: &[u8]) -> Result<String, SecretError> {
        let nonce = random::<NONCE>()?;
        let sealed = self
            .cipher()
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: plain,
                    aad: name.as_bytes(),
                },
            )
            .map_err(|_| SecretError::Random("seal failed".into()))?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        Ok(format!("{PREFIX}{}", B64.encode(out)))
    }

    /// Opens what [`MasterKey::seal`] sealed as `name`.
    pub fn open(&self, name: &str, sealed: &str) -> Result<Vec<u8>, SecretError> {
        let body = sealed
            .strip_prefix(PREFIX)
            .ok_or_else(|| SecretError::NotSealed { name: name.into() })?;
        let bytes = B64
            .decode(body)
            .map_err(|_| SecretError::Open { name: name.into() })?;
        if bytes.len() < NONCE {
            return Err(SecretError::Open { name: name.into() });
        }
        let (nonce, ct) = bytes.split_at(NONCE);
        self.cipher()
            .decrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: ct,
                    aad: name.as_bytes(),
                },
            )
            .map_err(|_| SecretError::Open { name: name.into() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_only_under_their_key_and_name() {
        let k = MasterKey::ephemeral();
        let s = k.seal("links", b"top secret").unwrap();
        assert!(s.starts_with(PREFIX) && !s.contains("top secret"));
        assert_eq!(k.open("links", &s).unwrap(), b"top secret");
        assert!(matches!(
            MasterKey::ephemeral().open("links", &s),
            Err(SecretError::Open { .. })
        ));
        assert!(matches!(k.open("other", &s), Err(SecretError::Open { .. })));
        assert!(matches!(
            k.open("links", "abcd"),
            Err(SecretError::NotSealed { .. })
        ));
        assert!(matches!(
            k.open("links", "hs1:AAAA"),
            Err(SecretError::Open { .. })
        ));
        // Two seals of one value differ (fresh nonce).
        assert_ne!(
            k.seal("links", b"x").unwrap(),
            k.seal("links", b"x").unwrap()
        );
    }

    #[test]
    fn key_files_are_created_private_and_reloaded() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("hearth-mk-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("master.key");
        let a = MasterKey::load_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let b = MasterKey::load_or_create(&path).unwrap();
        assert_eq!(a.0, b.0);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            MasterKey::load_or_create(&path),
            Err(SecretError::KeyFile(
                hearth_fence::keyfile::KeyFileError::Mode { .. }
            ))
        ));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, b"short").unwrap();
        assert!(matches!(
            MasterKey::load_or_create(&path),
            Err(SecretError::KeyFile(
                hearth_fence::keyfile::KeyFileError::Length { len: 5, .. }
            ))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
