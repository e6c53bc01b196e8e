//! The store's garbage collection, once per fleet.
//!
//! **Who can collect.** GC needs the store's credentials and its key
//! (`hearth_store::Store::gc`); hosts hold both — the in-process host of
//! `hearth up`, and every `hearth host serve` — while control-plane
//! replicas of a fleet (`hearth up --no-local-host`) hold neither. So the
//! control plane holds the *schedule* and a host does the work: the
//! replica that wins the `gc` leader lease asks one live host per store to
//! collect ([`hearth_hostapi::HostApi::collect_garbage`], a signed
//! command to a remote host). Hosts share a store by the URL they report
//! (an S3 bucket; `hearth up`'s in-process host reports its own as
//! remote hosts do, so one run covers them all); a local-directory store
//! (`file:`), or a host that reports none, is taken to be that host's own,
//! and collected through it.
//!
//! **Once per interval, whichever replica.** The `gc` lease is the right
//! to this interval's run: a replica asks for it under a holder name of
//! its own made fresh for each attempt, with the interval as its TTL, so
//! it is granted only once the previous run's lease has expired — at most
//! one run per interval across the fleet, on a schedule kept in the
//! database (a replica's restart neither skips nor repeats a run). A pass
//! that could find no host gives the lease back, so the next pass tries
//! again.
//!
//! **Safe beside commits.** Hosts keep committing and flushing while GC
//! runs; the argument (and what it assumes) is in `hearth-store`'s crate
//! documentation. Two runs at once would be safe too, only wasteful.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hearth_db::{HostState, Timestamp};
use hearth_hostapi::HostApi;
use hearth_types::HostId;

use crate::Control;

/// GC's name among leader leases.
pub(crate) const GC_LEASE: &str = "gc";

/// How often `hearth up` collects its store's garbage.
pub const GC_INTERVAL: Duration = Duration::from_secs(3600);

impl Control {
    /// Starts this interval's garbage collection when no replica has run it
    /// yet: on one host per store, in the background.
    pub(crate) async fn collect_garbage(&self, now: Timestamp) {
        let Some(interval) = self.cfg.gc_interval else {
            return;
        };
        let holder = format!("{}#{}", self.replica, now.unix_ms());
        match self
            .db
            .acquire_leadership(GC_LEASE, &holder, interval, now)
            .await
        {
            Ok(Some(_)) => {}
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "gc: cannot take the leader lease; the next pass retries");
                return;
            }
        }
        let targets = match self.gc_targets(now).await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "gc: cannot read the host registry; the next pass retries");
                Vec::new()
            }
        };
        if targets.is_empty() {
            if let Err(e) = self.db.release_leadership(GC_LEASE, &holder).await {
                tracing::warn!(error = %e, "gc: cannot give the lease back; the next run waits for the interval");
            }
            return;
        }
        for (store, host_id, host) in targets {
            tokio::spawn(async move {
                tracing::info!(%store, host = %host_id, "gc: collecting the store's garbage");
                match host.collect_garbage().await {
                    Ok(r) => tracing::info!(
                        %store,
                        host = %host_id,
                        manifests = r.manifests_deleted,
                        journal_records = r.journal_records_deleted,
                        chunks = r.chunks_deleted,
                        bytes = r.bytes_deleted,
                        kept = r.chunks_kept,
                        "gc: store garbage collected"
                    ),
                    Err(e) => {
                        tracing::warn!(%store, host = %host_id, error = %e, "gc: the store's garbage collection failed; the next interval retries")
                    }
                }
            });
        }
    }

    /// One live host per store this replica can command: this process's
    /// in-process hosts and remote hosts with a live lease, ready ones
    /// first, by id.
    async fn gc_targets(
        &self,
        now: Timestamp,
    ) -> Result<Vec<(String, HostId, Arc<dyn HostApi>)>, hearth_db::DbError> {
        let mut rows = self.db.list_hosts().await?;
        rows.retain(|h| h.state != HostState::Down && h.lease_expires_at > now);
        rows.sort_by_key(|h| (h.state != HostState::Ready, h.id));
        let mut by_store: BTreeMap<String, (HostId, Arc<dyn HostApi>)> = BTreeMap::new();
        for row in rows {
            let store = if row.store_url.is_empty() || row.store_url.starts_with("file:") {
                format!("host {}", row.id)
            } else {
                row.store_url.clone()
            };
            if by_store.contains_key(&store) {
                continue;
            }
            let host = match self.hosts.get(&row.id) {
                Some(h) => h.clone(),
                None if crate::fleet::is_remote(&row) => match self.host(row.id).await {
                    Some(h) => h,
                    None => continue,
                },
                // Another process's in-process host.
                None => continue,
            };
            by_store.insert(store, (row.id, host));
        }
        Ok(by_store
            .into_iter()
            .map(|(store, (id, host))| (store, id, host))
            .collect())
    }
}
