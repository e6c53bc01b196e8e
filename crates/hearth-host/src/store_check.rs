//! The host's periodic check of its object store.
//!
//! A host in a fleet registers only once its store proves usable
//! ([`Host::probe_store`]: write, read back and delete
//! `health/<who>`). A store can fail later (credentials revoked, a
//! bucket policy changed, the endpoint gone): a host that cannot reach it
//! cannot fetch an image's chunks, commit or flush a disk, so it must stop
//! taking sandboxes until the store answers again. [`check_periodically`]
//! runs the same probe every [`StoreCheck::every`], each bounded by
//! [`StoreCheck::timeout`] (the object store's own retries would otherwise
//! keep one probe going for minutes), one at a time; the last result is
//! [`Host::store_health`], which the host reports with every lease renewal
//! (`hearth_hostapi::fleet::RenewLease::store`) and in its status. A change
//! wakes whoever watches it ([`Host::watch_store_health`]): the lease loop
//! renews at once, so placement learns of a failure, or of a recovery,
//! without waiting for the next renewal.
//!
//! Three small requests every 10 s is noise next to what a host's disks
//! send; a failing store is not probed faster.

use std::sync::{Arc, Weak};
use std::time::Duration;

use hearth_hostapi::fleet::StoreHealth;
use hearth_types::error_chain;
use tokio::sync::watch;

use crate::host::Host;

/// The longest failure reason kept (it travels with each lease renewal).
const MAX_ERROR_LEN: usize = 512;

/// How often, and within what time, a host checks its store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreCheck {
    /// Between the start of one check and the next.
    pub every: Duration,
    /// A check that has not finished by then failed.
    pub timeout: Duration,
}

impl Default for StoreCheck {
    fn default() -> Self {
        Self {
            every: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
        }
    }
}

/// The last check's result, shared by the checker and its readers.
pub(crate) struct HealthCell(watch::Sender<StoreHealth>);

impl HealthCell {
    pub(crate) fn new() -> Self {
        Self(watch::channel(StoreHealth::Ok).0)
    }
}

impl Host {
    /// Probes the store once within `timeout` ([`Host::probe_store`]),
    /// records the result as [`Host::store_health`] and returns it. The
    /// first failure after a success is logged as an error, the recovery
    /// once as info.
    pub async fn check_store(&self, who: &str, timeout: Duration) -> StoreHealth {
        let now = match tokio::time::timeout(timeout, self.probe_store(who)).await {
            Ok(Ok(())) => StoreHealth::Ok,
            Ok(Err(e)) => StoreHealth::Failing {
                error: truncate(error_chain(&e)),
            },
            Err(_) => StoreHealth::Failing {
                error: format!("the store did not answer a check within {timeout:?}"),
            },
        };
        // Watchers wake only when the answer flips (a new reason for the
        // same failure is kept, and reported with the next renewal).
        let mut before = StoreHealth::Ok;
        self.store_health.0.send_if_modified(|h| {
            before = std::mem::replace(h, now.clone());
            before.is_ok() != now.is_ok()
        });
        match (&before, &now) {
            (StoreHealth::Ok, StoreHealth::Failing { error }) => tracing::error!(
                %error,
                "the store failed its check: this host takes no new sandboxes until it answers"
            ),
            (StoreHealth::Failing { .. }, StoreHealth::Ok) => {
                tracing::info!("the store answers again: this host takes sandboxes again")
            }
            (StoreHealth::Failing { .. }, StoreHealth::Failing { error }) => {
                tracing::debug!(%error, "the store still fails its check")
            }
            (StoreHealth::Ok, StoreHealth::Ok) => {}
        }
        now
    }

    /// The last store check's result ([`StoreHealth::Ok`] before any).
    pub fn store_health(&self) -> StoreHealth {
        self.store_health.0.borrow().clone()
    }

    /// Wakes when [`Host::store_health`] flips between ok and failing.
    pub fn watch_store_health(&self) -> watch::Receiver<StoreHealth> {
        self.store_health.0.subscribe()
    }
}

/// Checks `host`'s store every `check.every` ([`Host::check_store`], the
/// first check at once) until the host is dropped.
pub async fn check_periodically(host: Weak<Host>, who: String, check: StoreCheck) {
    let mut tick = tokio::time::interval(check.every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(host) = host.upgrade() else { return };
        host.check_store(&who, check.timeout).await;
    }
}

/// Starts [`check_periodically`] on the current runtime.
pub fn spawn_checks(host: &Arc<Host>, who: String, check: StoreCheck) {
    tokio::spawn(check_periodically(Arc::downgrade(host), who, check));
}

fn truncate(mut s: String) -> String {
    if s.len() > MAX_ERROR_LEN {
        let mut end = MAX_ERROR_LEN;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::truncate;

    #[test]
    fn long_reasons_are_cut_on_a_char_boundary() {
        assert_eq!(truncate("short".into()), "short");
        let long = "é".repeat(400);
        let cut = truncate(long);
        assert!(cut.len() <= super::MAX_ERROR_LEN + '…'.len_utf8());
        assert!(cut.ends_with('…'));
    }
}
