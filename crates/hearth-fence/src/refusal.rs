//! Why a command was refused: one variant, and one stable reason string,
//! per check.

use crate::key::KeyId;

/// A refused command. [`Refusal::reason`] is a stable snake_case string for
/// logs and metrics; `Display` gives the details.
///
/// Strings in a variant come either from a signature-checked header or
/// from this side; nothing an unauthenticated sender chose is echoed
/// (a [`KeyId`] from the wire is 16 hex characters by construction).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("malformed command: {what}")]
    Malformed { what: &'static str },
    #[error("command header version {version} is not supported")]
    UnsupportedVersion { version: u64 },
    #[error("command signed by unknown key {key_id}")]
    UnknownKey { key_id: KeyId },
    #[error("command signed by key {key_id}, retired at {not_after_ms} ms")]
    RetiredKey { key_id: KeyId, not_after_ms: u64 },
    #[error("command signature does not verify under key {key_id}")]
    BadSignature { key_id: KeyId },
    #[error("command is for {audience:?}, not for {expected:?}")]
    WrongAudience { audience: String, expected: String },
    #[error("command is for epoch {epoch}, the current epoch is {current}")]
    StaleEpoch { epoch: u64, current: u64 },
    #[error("command was signed for {signed:?}, not for {received:?}")]
    WrongAction { signed: String, received: String },
    #[error("request body does not match the command's body digest")]
    BodyMismatch,
    #[error("command issued at {issued_at_ms} ms, beyond now ({now_ms} ms) plus clock skew")]
    NotYetValid { issued_at_ms: u64, now_ms: u64 },
    #[error("command expired at {expires_at_ms} ms (now {now_ms} ms, after clock skew)")]
    Expired { expires_at_ms: u64, now_ms: u64 },
    #[error("command lifetime of {lifetime_ms} ms exceeds the maximum of {max_ms} ms")]
    LifetimeTooLong { lifetime_ms: u64, max_ms: u64 },
    #[error("command nonce {nonce} was already used")]
    Replayed { nonce: String },
    #[error("nonce cache is full ({capacity} unexpired commands)")]
    NonceCacheFull { capacity: usize },
    #[error("command for {subject} is at generation {generation}, older than the held {held}")]
    StaleGeneration {
        subject: String,
        generation: u64,
        held: u64,
    },
}

impl Refusal {
    /// Every reason: for metrics that pre-register a counter per reason,
    /// and for tests.
    pub const REASONS: [&'static str; 15] = [
        "malformed",
        "unsupported_version",
        "unknown_key",
        "retired_key",
        "bad_signature",
        "wrong_audience",
        "stale_epoch",
        "wrong_action",
        "body_mismatch",
        "not_yet_valid",
        "expired",
        "lifetime_too_long",
        "replayed",
        "nonce_cache_full",
        "stale_generation",
    ];

    /// The stable snake_case name of the check that failed.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Malformed { .. } => "malformed",
            Refusal::UnsupportedVersion { .. } => "unsupported_version",
            Refusal::UnknownKey { .. } => "unknown_key",
            Refusal::RetiredKey { .. } => "retired_key",
            Refusal::BadSignature { .. } => "bad_signature",
            Refusal::WrongAudience { .. } => "wrong_audience",
            Refusal::StaleEpoch { .. } => "stale_epoch",
            Refusal::WrongAction { .. } => "wrong_action",
            Refusal::BodyMismatch => "body_mismatch",
            Refusal::NotYetValid { .. } => "not_yet_valid",
            Refusal::Expired { .. } => "expired",
            Refusal::LifetimeTooLong { .. } => "lifetime_too_long",
            Refusal::Replayed { .. } => "replayed",
            Refusal::NonceCacheFull { .. } => "nonce_cache_full",
            Refusal::StaleGeneration { .. } => "stale_generation",
        }
    }
}
