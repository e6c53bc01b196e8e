//! The public keys a verifier trusts.

use std::collections::HashMap;

use crate::key::{KeyId, PublicKey};

/// The keys a [`Verifier`](crate::Verifier) accepts commands from, by
/// [`KeyId`], each with an optional retirement time.
///
/// Rotation: add the new key, keep the old one while commands signed with
/// it may still be in flight, then retire it ([`KeyRing::retire`]); from
/// then on its commands are refused `retired_key` (a distinct reason from
/// `unknown_key`, so a signer still using an old key is easy to spot).
/// A ring is a plain value: build it, then hand it to
/// [`Verifier::set_keys`](crate::Verifier::set_keys) to swap it in whole.
#[derive(Debug, Clone, Default)]
pub struct KeyRing {
    keys: HashMap<KeyId, RingKey>,
}

/// One trusted key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingKey {
    pub key: PublicKey,
    /// Commands are refused once the verifier's clock is past this
    /// (ms since the Unix epoch); `None`: never retired.
    pub not_after_ms: Option<u64>,
}

impl KeyRing {
    pub fn new() -> Self {
        Self::default()
    }

    /// Builder form of [`KeyRing::insert`].
    pub fn with(mut self, key: PublicKey, not_after_ms: Option<u64>) -> Self {
        self.insert(key, not_after_ms);
        self
    }

    /// Adds (or replaces) `key`.
    pub fn insert(&mut self, key: PublicKey, not_after_ms: Option<u64>) {
        self.keys
            .insert(key.id().clone(), RingKey { key, not_after_ms });
    }

    /// Retires `id` after `not_after_ms`; false when it is not in the ring.
    /// `retire(id, 0)` retires it at once.
    pub fn retire(&mut self, id: &KeyId, not_after_ms: u64) -> bool {
        match self.keys.get_mut(id) {
            Some(k) => {
                k.not_after_ms = Some(not_after_ms);
                true
            }
            None => false,
        }
    }

    /// Drops `id` altogether (its commands become `unknown_key`).
    pub fn remove(&mut self, id: &KeyId) -> Option<RingKey> {
        self.keys.remove(id)
    }

    pub fn get(&self, id: &KeyId) -> Option<&RingKey> {
        self.keys.get(id)
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &RingKey> {
        self.keys.values()
    }
}
