//! Minting commands.

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;

use crate::header::{CommandHeader, NONCE_LEN, VERSION};
use crate::key::{random, KeyId, KeyPair, RandomError};

/// Signs commands with one key; each command is valid for `ttl` from when
/// it is signed. The ttl must not exceed the verifier's maximum lifetime
/// (5 minutes by default), or every command is refused `lifetime_too_long`.
#[derive(Debug, Clone)]
pub struct Signer {
    key: KeyPair,
    ttl: Duration,
}

impl Signer {
    pub fn new(key: KeyPair, ttl: Duration) -> Self {
        Self { key, ttl }
    }

    pub fn key(&self) -> &KeyPair {
        &self.key
    }

    pub fn key_id(&self) -> &KeyId {
        self.key.id()
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// A signed command: the value of the [`HEADER_NAME`](crate::HEADER_NAME)
    /// header for a request `action` (see [`action`](crate::action)) with
    /// `body`, for `audience` at its lease `epoch`, acting on `subject` at
    /// placement `generation` (`None` and 0 for host-wide commands).
    /// Fails only when the OS cannot supply a nonce.
    pub fn sign(
        &self,
        audience: &str,
        epoch: u64,
        subject: Option<&str>,
        generation: u64,
        action: &str,
        body: &[u8],
    ) -> Result<String, RandomError> {
        let header = self.header(audience, epoch, subject, generation, action, body)?;
        Ok(self.seal(&header))
    }

    /// The header [`Signer::sign`] would sign now, with a fresh nonce: to
    /// inspect or adjust before [`Signer::seal`] (tests, tools).
    pub fn header(
        &self,
        audience: &str,
        epoch: u64,
        subject: Option<&str>,
        generation: u64,
        action: &str,
        body: &[u8],
    ) -> Result<CommandHeader, RandomError> {
        let nonce: [u8; NONCE_LEN] = random()?;
        let issued_at_ms = crate::now_ms();
        let ttl_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        Ok(CommandHeader {
            v: VERSION,
            key_id: self.key.id().clone(),
            audience: audience.to_string(),
            audience_epoch: epoch,
            subject: subject.map(str::to_string),
            generation,
            action: action.to_string(),
            body: crate::body_hash(body),
            nonce: B64.encode(nonce),
            issued_at_ms,
            expires_at_ms: issued_at_ms.saturating_add(ttl_ms),
        })
    }

    /// Signs `header` as it is (its `key_id` should be this signer's).
    pub fn seal(&self, header: &CommandHeader) -> String {
        header.seal(&self.key)
    }
}
