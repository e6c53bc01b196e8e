//! The bounded memory of used nonces.

use std::collections::{BTreeSet, HashSet};

use crate::header::NONCE_LEN;

type Nonce = [u8; NONCE_LEN];

/// Nonces of accepted commands, each kept until `forget_at_ms` (the last
/// instant its command could still pass the expiry check), pruned lazily on
/// insert. Bounded: when full of unexpired nonces it refuses new ones
/// rather than forget one early, since forgetting would reopen a replay.
#[derive(Debug)]
pub(crate) struct NonceCache {
    capacity: usize,
    seen: HashSet<Nonce>,
    /// The same nonces ordered by when they may be forgotten.
    by_expiry: BTreeSet<(u64, Nonce)>,
    /// The latest `forget_at_ms` of any nonce forgotten so far. A command
    /// whose window ends at or before it may have had its nonce forgotten
    /// (only possible when the clock went backwards), so it is refused.
    forgotten_until_ms: u64,
}

/// Why a nonce was not recorded.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum NonceError {
    Replayed,
    /// Its window ends before nonces already forgotten (clock went back).
    Forgotten,
    Full,
}

impl NonceCache {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            seen: HashSet::new(),
            by_expiry: BTreeSet::new(),
            forgotten_until_ms: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Forgets the nonces whose commands have expired by `now_ms`.
    fn prune(&mut self, now_ms: u64) {
        while let Some(&(forget_at, nonce)) = self.by_expiry.first() {
            if forget_at >= now_ms {
                break;
            }
            self.by_expiry.pop_first();
            self.seen.remove(&nonce);
            self.forgotten_until_ms = self.forgotten_until_ms.max(forget_at);
        }
    }

    /// Checks that `nonce` can be recorded until `forget_at_ms`, without
    /// recording it (the caller has other checks to make first).
    pub fn check(
        &mut self,
        nonce: &Nonce,
        forget_at_ms: u64,
        now_ms: u64,
    ) -> Result<(), NonceError> {
        self.prune(now_ms);
        if self.seen.contains(nonce) {
            return Err(NonceError::Replayed);
        }
        if forget_at_ms <= self.forgotten_until_ms {
            return Err(NonceError::Forgotten);
        }
        if self.seen.len() >= self.capacity {
            return Err(NonceError::Full);
        }
        Ok(())
    }

    /// Records a nonce [`NonceCache::check`] just passed.
    pub fn insert(&mut self, nonce: Nonce, forget_at_ms: u64) {
        if self.seen.insert(nonce) {
            self.by_expiry.insert((forget_at_ms, nonce));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replays_are_caught_until_expiry_then_forgotten() {
        let mut c = NonceCache::new(2);
        let a = [1; NONCE_LEN];
        c.check(&a, 100, 0).unwrap();
        c.insert(a, 100);
        assert_eq!(c.check(&a, 100, 50), Err(NonceError::Replayed));
        assert_eq!(c.check(&a, 100, 100), Err(NonceError::Replayed));
        // At 101 its command is expired: forgotten, and the watermark
        // refuses it even if the clock goes back.
        c.check(&[2; NONCE_LEN], 200, 101).unwrap();
        assert_eq!(c.len(), 0);
        assert_eq!(c.check(&a, 100, 50), Err(NonceError::Forgotten));
    }

    #[test]
    fn full_cache_refuses_until_pruned() {
        let mut c = NonceCache::new(2);
        for (i, at) in [(1u8, 10u64), (2, 20)] {
            c.check(&[i; NONCE_LEN], at, 0).unwrap();
            c.insert([i; NONCE_LEN], at);
        }
        assert_eq!(c.check(&[3; NONCE_LEN], 30, 5), Err(NonceError::Full));
        // The first expires at 10: room for one.
        c.check(&[3; NONCE_LEN], 30, 11).unwrap();
        assert_eq!(c.len(), 1);
    }
}
