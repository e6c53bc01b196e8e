//! Signed, single-use, generation-fenced commands.
//!
//! Between Hearth's control plane and its host agents every instruction is
//! a *command*: an HTTP request carrying one [`HEADER_NAME`] header that
//! binds the request to a signer, a recipient, a lease epoch, a VM and its
//! placement generation, a time window and a nonce. A replayed, tampered,
//! expired, misdirected or stale command fails closed, with a distinct
//! [`Refusal::reason`]. Hosts sign what they send to the control plane
//! (register, lease renewal) the same way, with audience
//! [`CONTROL_AUDIENCE`].
//!
//! # Key types
//!
//! - [`KeyPair`]: an Ed25519 signing key and its [`KeyId`] (16 hex of the
//!   BLAKE3 of the public key), kept as a 32-byte seed in a 0600 file
//!   ([`KeyPair::load_or_create`]; a file group or others can read is
//!   refused). [`PublicKey`] is what others store (base64url or hex).
//! - [`Signer`]: a key and a ttl; [`Signer::sign`] gives the header value.
//! - [`KeyRing`]: the keys a verifier trusts, each optionally retired after
//!   a time (rotation), replaced whole at runtime ([`Verifier::set_keys`]).
//! - [`Verifier`]: its own audience and epoch, the nonces it has spent and
//!   the generations it holds; [`Verifier::verify`] gives a [`Verified`] or
//!   a [`Refusal`].
//!
//! # What is signed
//!
//! The header value is `base64url(json) "." base64url(signature)`, where
//! `json` is a [`CommandHeader`] and the Ed25519 signature covers
//! `b"hearth-command-v1\0" ++ json`: exactly the bytes that travel (the
//! verifier never re-serializes), with a domain prefix so a command
//! signature can never be confused with anything else the key signs. The
//! header holds:
//!
//! | field | checked against | refusal |
//! |---|---|---|
//! | `v` | 1 | `unsupported_version` |
//! | `key_id` | the [`KeyRing`] | `unknown_key`, `retired_key`, `bad_signature` |
//! | `audience` | the verifier's own host id (or `"control"`) | `wrong_audience` |
//! | `action` | the request's method and path ([`action`]) | `wrong_action` |
//! | `body` | BLAKE3 of the request body ([`body_hash`]) | `body_mismatch` |
//! | `issued_at_ms` | now + clock skew | `not_yet_valid` |
//! | `expires_at_ms` | now − clock skew; issued + max lifetime | `expired`, `lifetime_too_long` |
//! | `audience_epoch` | the verifier's current epoch | `stale_epoch` |
//! | `nonce` | the nonces already spent | `replayed`, `nonce_cache_full` |
//! | `subject`, `generation` | the generation held for the subject | `stale_generation` |
//!
//! Anything unparsable, over [`MAX_TOKEN_LEN`], with unknown fields or
//! nonsensical once signed (a generation without a subject, an empty
//! subject, expiring before issued) is `malformed`.
//!
//! # Why each check
//!
//! - **Signature first.** Only the version and key id are read before the
//!   signature is checked (a retired key's signature is checked too, so
//!   `retired_key` means that key really signed it), and nothing is recorded until every check has
//!   passed: unsigned garbage costs one signature check and changes no
//!   state (it cannot fill the nonce cache or move a generation).
//! - **Audience and action** stop a command minted for another host, or for
//!   another endpoint of the same host, from being redirected; **body**
//!   stops a stop command's body being swapped for another's. Together they
//!   pin the whole request. The caller still checks that
//!   [`Verified::subject`] is the VM the path names, and that the signing
//!   key ([`Verified::key_id`]) may act for the sender it claims to be.
//! - **Time window.** A command is accepted from `issued_at − skew` to
//!   `expires_at + skew`, and its lifetime is bounded (5 minutes by
//!   default), which bounds how long a leaked command is useful and how
//!   long its nonce must be remembered.
//! - **Nonce.** Each accepted command's 16 random bytes are remembered until
//!   its window closes, so it is accepted once. Replays are keyed on the
//!   signed nonce, not the token bytes, so a re-encoded or re-signed copy
//!   of a command is a replay too. The cache is bounded; when full of
//!   unexpired nonces it refuses (`nonce_cache_full`) rather than forget
//!   one early, which would reopen a replay. If the clock goes backwards,
//!   a command whose window ends before nonces already forgotten is
//!   refused `expired`, since its own nonce may have been among them.
//!
//! # Fencing: epochs and generations
//!
//! - **Epoch** (per audience). A host's lease epoch changes when it loses
//!   its lease and registers again. Commands carry the epoch they were
//!   minted for, and a host accepts only its current epoch
//!   ([`Verifier::set_epoch`]): anything the control plane sent to the
//!   host's previous life is refused `stale_epoch`, as is a command for a
//!   newer epoch than the host knows (another process may hold that lease).
//! - **Generation** (per subject). A VM's placement generation grows each
//!   time it is placed. The verifier holds, per subject, the highest
//!   generation it has accepted or been told ([`Verifier::hold`]); a
//!   command with an older generation is refused `stale_generation`, an
//!   equal one is accepted, and **an accepted command with a newer
//!   generation advances the held generation** (it is from a newer
//!   placement, which from then on fences every command of the older one).
//!   Advancing happens only after every other check passed, so only a
//!   validly signed, fresh, well-aimed command can move it.
//!
//! ```
//! use std::time::Duration;
//! use hearth_fence::*;
//!
//! let key = KeyPair::generate().unwrap();
//! let verifier = Verifier::new(
//!     VerifierConfig::new("host-1"),
//!     KeyRing::new().with(key.public(), None),
//! );
//! let signer = Signer::new(key, Duration::from_secs(60));
//! let action = action("POST", "/v1/vms/vm-7/stop");
//! let token = signer.sign("host-1", 0, Some("vm-7"), 3, &action, b"{}").unwrap();
//! let ok = verifier.verify(&token, &action, b"{}", now_ms()).unwrap();
//! assert_eq!((ok.subject.as_deref(), ok.generation), (Some("vm-7"), 3));
//! let again = verifier.verify(&token, &action, b"{}", now_ms()).unwrap_err();
//! assert_eq!(again.reason(), "replayed");
//! ```

mod header;
pub mod jwt;
mod key;
pub mod keyfile;
mod nonce;
mod refusal;
mod ring;
mod sign;
mod verify;

pub use header::{CommandHeader, MAX_TOKEN_LEN, NONCE_LEN, SIGNING_DOMAIN, VERSION};
pub use key::{KeyError, KeyId, KeyPair, PublicKey, RandomError};
pub use refusal::Refusal;
pub use ring::{KeyRing, RingKey};
pub use sign::Signer;
pub use verify::{Verified, Verifier, VerifierConfig};

/// The HTTP header carrying a command. Lowercase, as
/// `http::HeaderName::from_static` requires (header names are
/// case-insensitive on the wire).
pub const HEADER_NAME: &str = "hearth-command";

/// The audience of commands hosts send to the control plane.
pub const CONTROL_AUDIENCE: &str = "control";

/// A command's `action` for a request: `"{METHOD} {path}"`, e.g.
/// `POST /v1/vms/vm-7/stop`. Signer and verifier must build it from the
/// same parts (path with or without the query, as they agree) so that it
/// compares equal.
pub fn action(method: &str, path: &str) -> String {
    format!("{method} {path}")
}

/// A command's `body`: BLAKE3 of the request body, lowercase hex.
pub fn body_hash(body: &[u8]) -> String {
    blake3::hash(body).to_hex().to_string()
}

/// Milliseconds since the Unix epoch by the system clock (0 before it).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
