//! Key material: a signer's [`KeyPair`] (kept in a 0600 seed file), the
//! [`PublicKey`] others verify with, and the short [`KeyId`] naming it.

use std::fmt;
use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};
use zeroize::Zeroizing;

use crate::keyfile::{self, KeyFileError, Size};

/// Length of a [`KeyId`] in hex characters (8 bytes of BLAKE3).
const KEY_ID_HEX: usize = 16;

/// The system random source failed (getrandom).
#[derive(Debug, thiserror::Error)]
#[error("the system random source failed: {0}")]
pub struct RandomError(getrandom::Error);

/// `N` random bytes from the OS.
pub(crate) fn random<const N: usize>() -> Result<[u8; N], RandomError> {
    let mut out = [0u8; N];
    getrandom::fill(&mut out).map_err(RandomError)?;
    Ok(out)
}

/// Failures of loading, creating or decoding key material.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(transparent)]
    File(#[from] KeyFileError),
    #[error(transparent)]
    Random(#[from] RandomError),
    #[error("public key is not valid {0}")]
    Encoding(&'static str),
    #[error("public key is {len} bytes, not 32")]
    PublicKeyLength { len: usize },
    #[error("public key is not a usable ed25519 point")]
    InvalidPoint,
}

/// A key's short, stable id: the first 16 hex characters of the BLAKE3 hash
/// of its public key. It travels in every command so the verifier can pick
/// the key without trying each one; it is derived, never chosen, so a ring
/// cannot hold one key under another's id.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct KeyId(String);

impl KeyId {
    /// The id of the Ed25519 public key `bytes`.
    pub fn of(bytes: &[u8; 32]) -> Self {
        let hex = blake3::hash(bytes).to_hex();
        Self(hex[..KEY_ID_HEX].to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for KeyId {
    type Error = &'static str;

    /// Accepts exactly 16 lowercase hex characters (the form [`KeyId::of`]
    /// makes), so an id from the wire is always short and printable.
    fn try_from(s: String) -> Result<Self, Self::Error> {
        let ok = s.len() == KEY_ID_HEX
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if ok {
            Ok(Self(s))
        } else {
            Err("a key id is 16 lowercase hex characters")
        }
    }
}

impl std::str::FromStr for KeyId {
    type Err = &'static str;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::try_from(s.to_string())
    }
}

impl From<KeyId> for String {
    fn from(id: KeyId) -> String {
        id.0
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({})", self.0)
    }
}

/// An Ed25519 public key with its [`KeyId`]: what a verifier's
/// [`KeyRing`](crate::KeyRing) holds and what a host registers with the
/// control plane. Stored as base64url (or hex); serde uses base64url.
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    id: KeyId,
    key: VerifyingKey,
}

impl PublicKey {
    /// Decodes 32 bytes, refusing points that are not on the curve and
    /// small-order ("weak") keys, under which a signature proves nothing.
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<Self, KeyError> {
        let key = VerifyingKey::from_bytes(bytes).map_err(|_| KeyError::InvalidPoint)?;
        if key.is_weak() {
            return Err(KeyError::InvalidPoint);
        }
        Ok(Self::from_verifying(key))
    }

    fn from_verifying(key: VerifyingKey) -> Self {
        Self {
            id: KeyId::of(key.as_bytes()),
            key,
        }
    }

    fn from_slice(bytes: &[u8]) -> Result<Self, KeyError> {
        let arr: &[u8; 32] = bytes
            .try_into()
            .map_err(|_| KeyError::PublicKeyLength { len: bytes.len() })?;
        Self::from_bytes(arr)
    }

    pub fn id(&self) -> &KeyId {
        &self.id
    }

    pub fn bytes(&self) -> [u8; 32] {
        self.key.to_bytes()
    }

    pub(crate) fn verifying_key(&self) -> &VerifyingKey {
        &self.key
    }

    pub fn to_hex(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::with_capacity(64);
        for b in self.key.as_bytes() {
            let _infallible = write!(s, "{b:02x}");
        }
        s
    }

    pub fn from_hex(s: &str) -> Result<Self, KeyError> {
        if s.len() != 64 || !s.is_ascii() {
            return Err(KeyError::Encoding("hex"));
        }
        let mut out = [0u8; 32];
        for (i, pair) in s.as_bytes().chunks_exact(2).enumerate() {
            let pair = std::str::from_utf8(pair).map_err(|_| KeyError::Encoding("hex"))?;
            out[i] = u8::from_str_radix(pair, 16).map_err(|_| KeyError::Encoding("hex"))?;
        }
        Self::from_bytes(&out)
    }

    /// base64url without padding (43 characters).
    pub fn to_base64(&self) -> String {
        B64.encode(self.key.as_bytes())
    }

    pub fn from_base64(s: &str) -> Result<Self, KeyError> {
        if s.len() > 64 {
            return Err(KeyError::Encoding("base64url"));
        }
        let bytes = B64.decode(s).map_err(|_| KeyError::Encoding("base64url"))?;
        Self::from_slice(&bytes)
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({}, {})", self.id, self.to_base64())
    }
}

impl serde::Serialize for PublicKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_base64())
    }
}

impl<'de> serde::Deserialize<'de> for PublicKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::from_base64(&s).map_err(serde::de::Error::custom)
    }
}

/// A signing key and its id. The secret is wiped on drop; `Debug` shows only
/// the id.
#[derive(Clone)]
pub struct KeyPair {
    signing: SigningKey,
    public: PublicKey,
}

impl KeyPair {
    /// A new key from the OS random source.
    pub fn generate() -> Result<Self, KeyError> {
        let seed = Zeroizing::new(random::<32>()?);
        Ok(Self::from_seed(&seed))
    }

    /// The key whose 32-byte Ed25519 seed is `seed` (deterministic: tests,
    /// benchmarks, keys held elsewhere).
    pub fn from_seed(seed: &[u8; 32]) -> Self {
        let signing = SigningKey::from_bytes(seed);
        let public = PublicKey::from_verifying(signing.verifying_key());
        Self { signing, public }
    }

    /// Loads the key whose seed is in `path`, or creates one there.
    ///
    /// A new file is written whole under a temporary name (mode 0600,
    /// synced) and hard-linked into place, so no reader ever sees a partial
    /// key and two processes racing to create it agree on one key. An
    /// existing file must be a regular file of exactly 32 bytes that neither
    /// group nor others can access: a key others could read is refused
    /// rather than used, since anyone holding it can mint commands.
    pub fn load_or_create(path: &Path) -> Result<Self, KeyError> {
        let seed = keyfile::load_or_create(WHAT, path, Size::Exactly(32), || {
            let key = Self::generate().map_err(std::io::Error::other)?;
            Ok(Zeroizing::new(key.signing.to_bytes().to_vec()))
        })?;
        Self::from_file_bytes(&seed)
    }

    /// Loads an existing key file (see [`KeyPair::load_or_create`]).
    pub fn load(path: &Path) -> Result<Self, KeyError> {
        let seed = keyfile::read(WHAT, path, Size::Exactly(32))?;
        Self::from_file_bytes(&seed)
    }

    fn from_file_bytes(bytes: &[u8]) -> Result<Self, KeyError> {
        let seed: Zeroizing<[u8; 32]> = Zeroizing::new(
            bytes
                .try_into()
                .map_err(|_| KeyError::Encoding("seed: not 32 bytes"))?,
        );
        Ok(Self::from_seed(&seed))
    }

    pub fn id(&self) -> &KeyId {
        &self.public.id
    }

    pub fn public(&self) -> PublicKey {
        self.public.clone()
    }

    pub(crate) fn sign(&self, msg: &[u8]) -> [u8; 64] {
        self.signing.sign(msg).to_bytes()
    }
}

impl fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyPair({})", self.public.id)
    }
}

/// What a signing key's file is called in errors.
const WHAT: &str = "key file";

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn scratch() -> PathBuf {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "hearth-fence-key-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn key_file_is_created_0600_and_reloads_to_the_same_key() {
        let dir = scratch();
        let path = dir.join("fence.key");
        let a = KeyPair::load_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 32);
        let b = KeyPair::load_or_create(&path).unwrap();
        assert_eq!(a.id(), b.id());
        assert_eq!(a.public(), b.public());
        // Only the key file is left behind (no temporary).
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn key_file_readable_by_others_is_refused() {
        let dir = scratch();
        let path = dir.join("fence.key");
        KeyPair::load_or_create(&path).unwrap();
        for mode in [0o644, 0o640, 0o604, 0o660] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = KeyPair::load_or_create(&path).unwrap_err();
            assert!(
                matches!(err, KeyError::File(KeyFileError::Mode { mode: m, .. }) if m == mode),
                "{err}"
            );
            assert!(err.to_string().contains("group or others"), "{err}");
        }
        // 0400 is fine: only the owner can read it.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
        KeyPair::load(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn key_file_of_the_wrong_size_or_kind_is_refused() {
        let dir = scratch();
        let path = dir.join("fence.key");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .unwrap();
        f.write_all(b"short").unwrap();
        assert!(matches!(
            KeyPair::load_or_create(&path),
            Err(KeyError::File(KeyFileError::Length { len: 5, .. }))
        ));
        assert!(matches!(
            KeyPair::load(&dir),
            Err(KeyError::File(KeyFileError::NotAFile { .. }))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn public_key_encodings_round_trip() {
        let key = KeyPair::from_seed(&[7; 32]);
        let public = key.public();
        assert_eq!(public.id().as_str().len(), 16);
        assert_eq!(PublicKey::from_hex(&public.to_hex()).unwrap(), public);
        assert_eq!(PublicKey::from_base64(&public.to_base64()).unwrap(), public);
        let json = serde_json::to_string(&public).unwrap();
        assert_eq!(serde_json::from_str::<PublicKey>(&json).unwrap(), public);
        assert_eq!(*public.id(), KeyId::of(&public.bytes()));
        assert!(PublicKey::from_hex("zz").is_err());
        assert!(PublicKey::from_base64("AAAA").is_err());
        // The identity point is small-order: refused.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        assert!(matches!(
            PublicKey::from_bytes(&identity),
            Err(KeyError::InvalidPoint)
        ));
        assert!("0123456789abcdef".parse::<KeyId>().is_ok());
        assert!("0123456789ABCDEF".parse::<KeyId>().is_err());
        assert!("0123".parse::<KeyId>().is_err());
    }
}
