//! Accepting commands: every check, in order, and the state behind the
//! stateful ones (nonces, epoch, generations).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use ed25519_dalek::Signature;

use crate::header::{self, Decoded};
use crate::key::KeyId;
use crate::nonce::{NonceCache, NonceError};
use crate::refusal::Refusal;
use crate::ring::KeyRing;

/// How a [`Verifier`] is set up.
#[derive(Debug, Clone)]
pub struct VerifierConfig {
    /// Who this verifier is: its host id, or
    /// [`CONTROL_AUDIENCE`](crate::CONTROL_AUDIENCE).
    pub audience: String,
    /// The current lease epoch (see [`Verifier::set_epoch`]).
    pub epoch: u64,
    /// The longest `expires_at - issued_at` accepted. It also bounds how
    /// long a nonce must be remembered.
    pub max_lifetime: Duration,
    /// How far the signer's clock may be ahead of (for `issued_at`) or
    /// behind (for `expires_at`) this one.
    pub clock_skew: Duration,
    /// The most nonces remembered at once (unexpired accepted commands);
    /// beyond it commands are refused `nonce_cache_full`.
    pub nonce_capacity: usize,
}

impl VerifierConfig {
    /// Defaults: epoch 0, 5-minute maximum lifetime, 30 s of clock skew,
    /// 131 072 nonces (≈ 400 commands/s sustained at the maximum lifetime;
    /// a few MiB).
    pub fn new(audience: impl Into<String>) -> Self {
        Self {
            audience: audience.into(),
            epoch: 0,
            max_lifetime: Duration::from_secs(300),
            clock_skew: Duration::from_secs(30),
            nonce_capacity: 1 << 17,
        }
    }
}

/// What an accepted command established.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub subject: Option<String>,
    pub generation: u64,
    /// The key that signed it. The verifier authenticates the key; the
    /// caller authorizes what that key may do (e.g. the control plane
    /// checks that a host's key signed that host's own registration).
    pub key_id: KeyId,
    /// base64url, as in the header.
    pub nonce: String,
    pub expires_at_ms: u64,
}

/// Accepts each valid command once; see the crate docs for the checks.
/// `&self` methods, safe to share between threads (`Arc<Verifier>`).
#[derive(Debug)]
pub struct Verifier {
    audience: String,
    max_lifetime_ms: u64,
    skew_ms: u64,
    /// Swapped whole by [`Verifier::set_keys`]; a verification clones the
    /// `Arc` and checks its signature without holding any lock.
    keys: RwLock<Arc<KeyRing>>,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    epoch: u64,
    nonces: NonceCache,
    /// Per subject, the highest generation accepted or held.
    generations: HashMap<String, u64>,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Verifier {
    pub fn new(config: VerifierConfig, keys: KeyRing) -> Self {
        Self {
            audience: config.audience,
            max_lifetime_ms: millis(config.max_lifetime),
            skew_ms: millis(config.clock_skew),
            keys: RwLock::new(Arc::new(keys)),
            state: Mutex::new(State {
                epoch: config.epoch,
                nonces: NonceCache::new(config.nonce_capacity),
                generations: HashMap::new(),
            }),
        }
    }

    pub fn audience(&self) -> &str {
        &self.audience
    }

    /// Replaces the trusted keys (the host refreshes them from the control
    /// plane). Commands being verified finish against the ring they started
    /// with.
    pub fn set_keys(&self, keys: KeyRing) {
        *self.keys.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(keys);
    }

    pub fn keys(&self) -> Arc<KeyRing> {
        Arc::clone(&self.keys.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Sets the current lease epoch: from now on only commands minted for
    /// exactly this epoch are accepted.
    pub fn set_epoch(&self, epoch: u64) {
        self.state().epoch = epoch;
    }

    pub fn epoch(&self) -> u64 {
        self.state().epoch
    }

    /// Raises the generation held for `subject` to at least `generation`
    /// (never lowers it; a host learns a VM's placement generation when it
    /// is placed there). Returns the generation now held.
    pub fn hold(&self, subject: &str, generation: u64) -> u64 {
        let mut state = self.state();
        let held = state.generations.entry(subject.to_string()).or_insert(0);
        *held = (*held).max(generation);
        *held
    }

    /// Forgets `subject`'s generation (the VM is gone from here). Until
    /// its commands expire, an older-generation command for it could then
    /// be accepted again: release only subjects that are gone for good, or
    /// hold their generation instead.
    pub fn release(&self, subject: &str) -> Option<u64> {
        self.state().generations.remove(subject)
    }

    /// Ends every generation held: each subject's becomes one more, so
    /// only a newer placement (the control plane bumps the generation at
    /// every placement) is accepted for it. A host that fenced itself
    /// calls this: whatever it held may have been placed elsewhere since,
    /// and commands minted for those placements must stay refused.
    pub fn end_generations(&self) {
        for held in self.state().generations.values_mut() {
            *held = held.saturating_add(1);
        }
    }

    pub fn held(&self, subject: &str) -> Option<u64> {
        self.state().generations.get(subject).copied()
    }

    /// Nonces currently remembered.
    pub fn nonces_held(&self) -> usize {
        self.state().nonces.len()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding it, and every update leaves the
        // state consistent, so a poisoned lock is still good.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Verifies `token` (a [`HEADER_NAME`](crate::HEADER_NAME) header value)
    /// for the request actually received, `action` (see
    /// [`action`](crate::action)) with `body`, at `now_ms`. On success the
    /// nonce is spent and the subject's generation may have advanced; a
    /// refusal changes nothing and is logged once, here, at warn level
    /// with its reason.
    pub fn verify(
        &self,
        token: &str,
        action: &str,
        body: &[u8],
        now_ms: u64,
    ) -> Result<Verified, Refusal> {
        let keys = self.keys();
        self.verify_with(token, action, body, now_ms, &keys)
    }

    /// [`Verifier::verify`] against `keys` instead of the verifier's own
    /// ring: a control plane checks each host's commands against that
    /// host's keys only, while nonces and generations stay in one place.
    pub fn verify_with(
        &self,
        token: &str,
        action: &str,
        body: &[u8],
        now_ms: u64,
        keys: &KeyRing,
    ) -> Result<Verified, Refusal> {
        let decoded = match header::decode(token) {
            Ok(d) => d,
            Err(refusal) => {
                tracing::warn!(
                    reason = refusal.reason(),
                    token_len = token.len(),
                    "refused command: {refusal}"
                );
                return Err(refusal);
            }
        };
        let result = self.check(&decoded, action, body, now_ms, keys);
        if let Err(refusal) = &result {
            let h = &decoded.header;
            tracing::warn!(
                reason = refusal.reason(),
                key_id = %h.key_id,
                audience = %h.audience,
                subject = h.subject.as_deref().unwrap_or("-"),
                generation = h.generation,
                action,
                "refused command: {refusal}"
            );
        }
        result
    }

    fn check(
        &self,
        decoded: &Decoded,
        action: &str,
        body: &[u8],
        now_ms: u64,
        keys: &KeyRing,
    ) -> Result<Verified, Refusal> {
        let h = &decoded.header;

        // Who signed it, and is the signature theirs? Nothing below reads a
        // header field before this, and nothing is recorded before every
        // check has passed, so unsigned garbage cannot touch any state.
        let ring_key = keys.get(&h.key_id).ok_or_else(|| Refusal::UnknownKey {
            key_id: h.key_id.clone(),
        })?;
        let signature = Signature::from_bytes(&decoded.signature);
        ring_key
            .key
            .verifying_key()
            // Strict: also refuses small-order R and non-canonical S.
            .verify_strict(&header::signed_message(&decoded.json), &signature)
            .map_err(|_| Refusal::BadSignature {
                key_id: h.key_id.clone(),
            })?;
        // Checked after the signature, so `retired_key` in a log means the
        // old key really signed it (a signer not yet rotated), not that
        // someone wrote its id on garbage.
        if let Some(not_after_ms) = ring_key.not_after_ms {
            if now_ms > not_after_ms {
                return Err(Refusal::RetiredKey {
                    key_id: h.key_id.clone(),
                    not_after_ms,
                });
            }
        }

        // Signed nonsense is still nonsense.
        match &h.subject {
            None if h.generation != 0 => {
                return Err(Refusal::Malformed {
                    what: "host-wide command with a generation",
                })
            }
            Some(s) if s.is_empty() => {
                return Err(Refusal::Malformed {
                    what: "empty subject",
                })
            }
            _ => {}
        }

        // Is it meant for this request, here?
        if h.audience != self.audience {
            return Err(Refusal::WrongAudience {
                audience: h.audience.clone(),
                expected: self.audience.clone(),
            });
        }
        if h.action != action {
            return Err(Refusal::WrongAction {
                signed: h.action.clone(),
                received: action.to_string(),
            });
        }
        if h.body != crate::body_hash(body) {
            return Err(Refusal::BodyMismatch);
        }

        // Is it valid now?
        if h.issued_at_ms > now_ms.saturating_add(self.skew_ms) {
            return Err(Refusal::NotYetValid {
                issued_at_ms: h.issued_at_ms,
                now_ms,
            });
        }
        // The last instant it is accepted, and so how long its nonce must
        // be remembered.
        let forget_at_ms = h.expires_at_ms.saturating_add(self.skew_ms);
        if now_ms > forget_at_ms {
            return Err(Refusal::Expired {
                expires_at_ms: h.expires_at_ms,
                now_ms,
            });
        }
        let lifetime_ms =
            h.expires_at_ms
                .checked_sub(h.issued_at_ms)
                .ok_or(Refusal::Malformed {
                    what: "expires before it is issued",
                })?;
        if lifetime_ms > self.max_lifetime_ms {
            return Err(Refusal::LifetimeTooLong {
                lifetime_ms,
                max_ms: self.max_lifetime_ms,
            });
        }

        // The stateful checks, then the commit, under one lock so two
        // copies of a command racing each other cannot both pass.
        let mut state = self.state();
        if h.audience_epoch != state.epoch {
            return Err(Refusal::StaleEpoch {
                epoch: h.audience_epoch,
                current: state.epoch,
            });
        }
        let nonce_check = state.nonces.check(&decoded.nonce, forget_at_ms, now_ms);
        match nonce_check {
            Err(NonceError::Replayed) => {
                return Err(Refusal::Replayed {
                    nonce: h.nonce.clone(),
                })
            }
            Err(NonceError::Forgotten) => {
                return Err(Refusal::Expired {
                    expires_at_ms: h.expires_at_ms,
                    now_ms,
                })
            }
            Err(NonceError::Full) | Ok(()) => {}
        }
        if let Some(subject) = &h.subject {
            if let Some(&held) = state.generations.get(subject) {
                if h.generation < held {
                    return Err(Refusal::StaleGeneration {
                        subject: subject.clone(),
                        generation: h.generation,
                        held,
                    });
                }
            }
        }
        if nonce_check == Err(NonceError::Full) {
            return Err(Refusal::NonceCacheFull {
                capacity: state.nonces.capacity(),
            });
        }

        // Accepted: spend the nonce, and advance the subject's generation
        // when the command is from a newer placement (generation > held).
        state.nonces.insert(decoded.nonce, forget_at_ms);
        if let Some(subject) = &h.subject {
            let held = state.generations.entry(subject.clone()).or_insert(0);
            *held = (*held).max(h.generation);
        }
        drop(state);
        Ok(Verified {
            subject: h.subject.clone(),
            generation: h.generation,
            key_id: h.key_id.clone(),
            nonce: h.nonce.clone(),
            expires_at_ms: h.expires_at_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KeyPair, Signer};

    /// Collects the `reason` field of every event.
    struct Capture(Arc<Mutex<Vec<String>>>);

    struct ReasonVisitor<'a>(&'a mut Option<String>);

    impl tracing::field::Visit for ReasonVisitor<'_> {
        fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
            if field.name() == "reason" {
                *self.0 = Some(value.to_string());
            }
        }
        fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
    }

    impl tracing::Subscriber for Capture {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            let mut reason = None;
            event.record(&mut ReasonVisitor(&mut reason));
            let level = *event.metadata().level();
            assert_eq!(level, tracing::Level::WARN);
            self.0.lock().unwrap().push(reason.unwrap_or_default());
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    #[test]
    fn each_refusal_is_logged_once_with_its_reason_and_acceptance_is_not() {
        let key = KeyPair::from_seed(&[5; 32]);
        let verifier = Verifier::new(
            VerifierConfig::new("host-a"),
            KeyRing::new().with(key.public(), None),
        );
        let signer = Signer::new(key, Duration::from_secs(60));
        let token = signer
            .sign("host-a", 0, Some("vm"), 1, "POST /x", b"")
            .unwrap();
        let now = crate::now_ms();
        let logs = Arc::new(Mutex::new(Vec::new()));
        tracing::subscriber::with_default(Capture(Arc::clone(&logs)), || {
            verifier.verify(&token, "POST /x", b"", now).unwrap();
            let r = verifier.verify(&token, "POST /x", b"", now).unwrap_err();
            assert_eq!(r.reason(), "replayed");
            let r = verifier.verify("garbage", "POST /x", b"", now).unwrap_err();
            assert_eq!(r.reason(), "malformed");
        });
        assert_eq!(*logs.lock().unwrap(), ["replayed", "malformed"]);
    }
}
