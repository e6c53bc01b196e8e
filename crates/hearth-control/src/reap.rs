//! The reapers: what the control plane does on its own, every
//! `reaper_interval`, in every replica ([`Control::run_reapers`]).
//!
//! Several replicas share one database, so each duty is either this
//! process's or the fleet's:
//!
//! | duty | whose | why |
//! |---|---|---|
//! | renew the leases of this process's in-process hosts | process | only this process runs them; another replica renewing them would hide this one's death |
//! | refresh this replica's control key (`seen_at`) | process | it says *this* replica still signs |
//! | reconcile this process's in-process hosts | process | only this process can command them |
//! | stop idle sandboxes, delete those past `delete_after_stop` | fleet | two replicas would stop or delete twice |
//! | fail stuck boots (`provisioning` past `stale_provisioning`) | fleet | |
//! | finish deletes left `deleting` (past `orphan_after`) | fleet | the replica that began them died |
//! | fail snapshot builds whose builder stopped its heartbeat | fleet | |
//! | tend warm pools: remove members that must go, boot new ones up to each pool's size (`pools.rs`) | fleet | two replicas would both fill a pool |
//! | fail over hosts whose lease expired | fleet | |
//! | reconcile remote hosts | fleet | every replica reaches them; one is enough |
//! | the host autoscaler | fleet | its own lease, `autoscaler` (it keeps state while it leads) |
//! | the store's garbage collection | fleet | its own lease, `gc`, one run per interval (see `gc.rs`) |
//!
//! Fleet duties run only in the replica holding the `reaper` row of
//! `leader_leases` ([`hearth_db::Db::acquire_leadership`], the one
//! election mechanism, shared with the autoscaler): each pass takes or
//! renews it for [`leader_ttl`], and acts only while less than two thirds
//! of that has passed since, by its own monotonic clock, so a pass that
//! runs long stops before another replica may take over. Work left for
//! the next pass is found again (every duty is a query for rows in some
//! state, and every write is fenced on the status and generation it saw),
//! so a change of leader loses nothing and repeats nothing that matters.
//!
//! **Work that survives its replica.** A replica accepts a boot, stop,
//! capture or delete and finishes it in a task of its own; if it dies, the
//! row is left in flight. The leader's reaper finishes or fails each kind,
//! idempotently:
//!
//! | left in | noticed when | the reaper |
//! |---|---|---|
//! | `provisioning` (a boot) the host ended | the host reports the VM ready or failed at the row's generation (reconcile) | marks it `ready`, or `failed` with the host's reason (the booting replica, if alive after all, sees its own outcome recorded and keeps the VM) |
//! | `provisioning` (a boot) whose replica died | its boot stopped stamping it ([`BUILD_HEARTBEAT`]) for `orphan_after` | marks it `failed`; its next start boots it again |
//! | `provisioning` (a boot) never stamped | not updated for `stale_provisioning` | marks it `failed` |
//! | `ready` with the VM `stopped` (a stop) | the host's VM list, in reconcile | marks it `stopped` and records saved memory the VM reports |
//! | `deleting` (a delete) | not updated for `orphan_after` | deletes its VM again (a VM already gone is fine) and removes the row |
//! | snapshot `building` (a capture or import) | its heartbeat ([`BUILD_HEARTBEAT`]) stopped for `orphan_after` | marks it `failed`, releasing its reserved memory |
//! | template build `building` | its heartbeat ([`BUILD_HEARTBEAT`]) stopped for `orphan_after` | marks it `error`, saying its replica went away (its builder sandbox has a lifetime of its own) |
//!
//! Sandboxes placed on another replica's in-process host are skipped: only
//! that process can command its host (replicas of a fleet run without one,
//! `hearth up --no-local-host`; a single `hearth up` always leads).
//!
//! Every error is logged with its cause where it is handled; a failed
//! duty is retried by the next pass.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use hearth_db::{StatusExtra, Timestamp};
use hearth_types::HostId;
use tokio::time::Instant;

use crate::domain::state::Move;
use crate::Control;

/// The reapers' name among leader leases.
pub(crate) const REAPER_LEASE: &str = "reaper";

/// How often a snapshot build says it is alive (`orphan_after` must be
/// several times this).
pub(crate) const BUILD_HEARTBEAT: Duration = Duration::from_secs(10);

/// How long a leader lease taken by a reaper pass lasts: three passes,
/// and at least 5 s.
pub(crate) fn leader_ttl(interval: Duration) -> Duration {
    (interval * 3).max(Duration::from_secs(5))
}

/// What one reaper pass did (tests and logs read it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReapReport {
    /// This replica held the `reaper` lease and ran the fleet's duties.
    pub leader: bool,
    /// Idle sandboxes stopped.
    pub idle_stopped: u32,
    /// Sandboxes deleted after `delete_after_stop`.
    pub expired_deleted: u32,
    /// Boots failed for being stuck.
    pub boots_failed: u32,
    /// Deletes a vanished replica left `deleting`, finished.
    pub deletes_finished: u32,
    /// Snapshot builds whose builder went away, failed.
    pub builds_failed: u32,
    /// Sandboxes past their deadline (E2B's `timeout`), deleted or paused.
    pub deadlines_expired: u32,
}

/// Deadlines acted on per reaper pass (the rest wait for the next).
const DEADLINES_PER_PASS: u32 = 200;

/// The fleet's duties may run until this instant of this pass.
struct Leading {
    until: Instant,
}

impl Leading {
    /// Still safely the leader; logs once when the pass ran out of time.
    fn holds(&self) -> bool {
        let ok = Instant::now() < self.until;
        if !ok {
            tracing::info!("reaper: this pass outlived two thirds of its leader lease; the rest waits for the next pass");
        }
        ok
    }
}

impl Control {
    /// Runs a reaper pass every interval, forever (and the deadline timer
    /// beside it).
    pub async fn run_reapers(self: Arc<Self>) {
        tokio::spawn(self.clone().run_deadlines());
        let mut tick = tokio::time::interval(self.cfg.reaper_interval);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    self.reap_once().await;
                }
                // A pool changed (created, resized, claimed from): its
                // members need not wait for the next pass.
                () = self.pools_changed.notified() => {
                    self.tend_pools_now().await;
                }
            }
        }
    }

    /// Acts on deadlines as they pass rather than at the next pass: sleeps
    /// until the earliest deadline (at most a reaper interval, and woken
    /// when this replica sets one), then, if this replica leads, expires
    /// what is due. A deadline another replica sets while this one leads
    /// waits at most an interval.
    async fn run_deadlines(self: Arc<Self>) {
        loop {
            let now = Timestamp::now();
            let wait = match self.db.earliest_deadline().await {
                Ok(Some(d)) => Duration::from_millis(
                    u64::try_from(d.expires_at.unix_ms() - now.unix_ms()).unwrap_or(0),
                )
                .min(self.cfg.reaper_interval),
                Ok(None) => self.cfg.reaper_interval,
                Err(e) => {
                    tracing::warn!(error = %e, "deadline timer: cannot read the next deadline");
                    self.cfg.reaper_interval
                }
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.deadlines_changed.notified() => continue,
            }
            let now = Timestamp::now();
            let Some(leading) = self.lead(now).await else {
                continue;
            };
            let foreign = match self.foreign_hosts().await {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!(error = %e, "deadline timer: cannot read the host registry");
                    continue;
                }
            };
            let ours =
                |row: &hearth_db::SandboxRow| row.host_id.is_none_or(|h| !foreign.contains(&h));
            let mut report = ReapReport::default();
            self.expire_deadlines(now, &leading, &mut report, &ours)
                .await;
            // Whatever could not be acted on waits for a pass, not a spin.
            if report.deadlines_expired == 0 {
                tokio::time::sleep(self.cfg.reaper_interval.min(Duration::from_secs(1))).await;
            }
        }
    }

    /// Tends the pools now if this replica leads (see `pools.rs`).
    pub async fn tend_pools_now(self: &Arc<Self>) {
        let now = Timestamp::now();
        if self.lead(now).await.is_none() {
            return;
        }
        match self.foreign_hosts().await {
            Ok(foreign) => self.tend_pools(now, &foreign).await,
            Err(e) => {
                tracing::warn!(error = %e, "pools: cannot read the host registry; the next pass retries")
            }
        }
    }

    pub async fn reap_once(self: &Arc<Self>) -> ReapReport {
        self.reap_at(Timestamp::now()).await
    }

    /// One reaper pass as if the clock read `now` (tests move time forward).
    pub async fn reap_at(self: &Arc<Self>, now: Timestamp) -> ReapReport {
        // This process's duties.
        for id in self.hosts.keys() {
            if let Err(e) = self
                .db
                .renew_host_lease(*id, now.plus(self.cfg.lease))
                .await
            {
                tracing::error!(host = %id, error = %e, "cannot renew this process's host lease; its placements may fail over");
            }
        }
        self.refresh_control_key(now).await;
        self.reconcile(false).await;

        // The fleet's.
        let mut report = ReapReport::default();
        if let Some(leading) = self.lead(now).await {
            report.leader = true;
            self.fleet_duties(now, &leading, &mut report).await;
        }
        self.autoscale(now).await;
        self.collect_garbage(now).await;
        report
    }

    /// Acts on deadlines passed at `now` (at most [`DEADLINES_PER_PASS`]):
    /// deletes the sandbox, or stops it with its memory saved and clears
    /// the deadline. A sandbox that cannot be acted on now (booting, or
    /// its host away) is retried at the next pass; one already gone takes
    /// its deadline with it.
    async fn expire_deadlines(
        self: &Arc<Self>,
        now: Timestamp,
        leading: &Leading,
        report: &mut ReapReport,
        ours: &(dyn Fn(&hearth_db::SandboxRow) -> bool + Sync),
    ) {
        // The timer or the pass is at it already: it sees these too.
        let Ok(_acting) = self.acting_on_deadlines.try_lock() else {
            return;
        };
        let due = match self.db.expired_deadlines(now, DEADLINES_PER_PASS).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list sandboxes past their deadline");
                return;
            }
        };
        for d in due {
            if !leading.holds() {
                return;
            }
            let row = match self.db.get_sandbox_by_id(d.sandbox_id).await {
                Ok(r) => r,
                Err(hearth_db::DbError::NotFound { .. }) => {
                    if let Err(e) = self.db.clear_deadline(d.sandbox_id).await {
                        tracing::warn!(sandbox = %d.sandbox_id, error = %e, "cannot clear a deleted sandbox's deadline");
                    }
                    continue;
                }
                Err(e) => {
                    tracing::warn!(sandbox = %d.sandbox_id, error = %e, "cannot read a sandbox past its deadline; the next pass retries");
                    continue;
                }
            };
            if !ours(&row) {
                continue;
            }
            let done = match d.on_expiry {
                hearth_db::OnExpiry::Delete => {
                    tracing::info!(sandbox = %row.id, "deleting a sandbox at its deadline");
                    self.delete_row(&row).await
                }
                hearth_db::OnExpiry::Pause => {
                    tracing::info!(sandbox = %row.id, "pausing a sandbox at its deadline");
                    match self.stop_row(&row, Some("paused at its timeout")).await {
                        // Only this deadline: a request that resumed the
                        // sandbox meanwhile gave it a new one.
                        Ok(_) => self
                            .db
                            .clear_deadline_at(row.id, d.expires_at)
                            .await
                            .map(drop)
                            .map_err(crate::domain::error::DomainError::from),
                        Err(e) => Err(e),
                    }
                }
            };
            match done {
                Ok(()) => report.deadlines_expired += 1,
                Err(e) => {
                    tracing::warn!(sandbox = %row.id, error = %e, "cannot act on a sandbox's deadline; the next pass retries")
                }
            }
        }
    }

    /// Takes or renews the `reaper` lease at `now`; `None` when another
    /// replica holds it (or the database cannot say: then nobody acts
    /// this pass rather than possibly two).
    async fn lead(&self, now: Timestamp) -> Option<Leading> {
        let ttl = leader_ttl(self.cfg.reaper_interval);
        let started = Instant::now();
        match self
            .db
            .acquire_leadership(REAPER_LEASE, &self.replica, ttl, now)
            .await
        {
            Ok(Some(_)) => Some(Leading {
                until: started + ttl * 2 / 3,
            }),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(error = %e, "reaper: cannot take or renew the leader lease; the fleet's reapers skip this pass");
                None
            }
        }
    }

    /// Gives up the `reaper` lease (a clean shutdown), so another replica
    /// takes over at its next pass rather than after the TTL. (The `gc`
    /// lease is an interval's run, not a leader's: it is kept.)
    pub async fn resign(&self) {
        if let Err(e) = self
            .db
            .release_leadership(REAPER_LEASE, &self.replica)
            .await
        {
            tracing::warn!(error = %e, "cannot release the reaper lease; another replica takes it when it expires");
        }
    }

    async fn fleet_duties(
        self: &Arc<Self>,
        now: Timestamp,
        leading: &Leading,
        report: &mut ReapReport,
    ) {
        // Hosts only another process can command: their sandboxes are not
        // this replica's to act on.
        let foreign = match self.foreign_hosts().await {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "reaper: cannot read the host registry; the fleet's reapers skip this pass");
                return;
            }
        };
        let ours = |row: &hearth_db::SandboxRow| {
            let ok = row.host_id.is_none_or(|h| !foreign.contains(&h));
            if !ok {
                tracing::debug!(sandbox = %row.id, "reaper: skipping a sandbox on another process's in-process host");
            }
            ok
        };

        match self.db.sandboxes_idle_since(now).await {
            Ok(idle) => {
                for row in idle.iter().filter(|r| ours(r)) {
                    if !leading.holds() {
                        return;
                    }
                    tracing::info!(sandbox = %row.id, "stopping idle sandbox");
                    match self
                        .stop_row(row, Some("stopped after its idle timeout"))
                        .await
                    {
                        Ok(_) => {
                            self.metrics.idle_stopped();
                            report.idle_stopped += 1;
                        }
                        Err(e) => {
                            tracing::warn!(sandbox = %row.id, error = %e, "cannot stop an idle sandbox; the next pass retries")
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot list idle sandboxes"),
        }

        match self.db.sandboxes_to_delete(now).await {
            Ok(expired) => {
                for row in expired.iter().filter(|r| ours(r)) {
                    if !leading.holds() {
                        return;
                    }
                    tracing::info!(sandbox = %row.id, "deleting sandbox stopped past delete_after_stop");
                    match self.delete_row(row).await {
                        Ok(()) => report.expired_deleted += 1,
                        Err(e) => {
                            tracing::warn!(sandbox = %row.id, error = %e, "cannot delete an expired sandbox; the next pass retries")
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot list sandboxes to delete"),
        }

        self.expire_deadlines(now, leading, report, &ours).await;

        match self
            .db
            .stale_provisioning(now.minus(self.cfg.stale_provisioning))
            .await
        {
            Ok(stuck) => {
                let stuck: Vec<_> = stuck.into_iter().filter(|r| ours(r)).collect();
                report.boots_failed += self
                    .fail_boots(&stuck, "boot did not finish in time", "a stuck boot")
                    .await;
            }
            Err(e) => tracing::warn!(error = %e, "cannot list stuck boots"),
        }

        match self
            .db
            .abandoned_boots(now.minus(self.cfg.orphan_after))
            .await
        {
            Ok(left) => {
                let left: Vec<_> = left.into_iter().filter(|r| ours(r)).collect();
                report.boots_failed += self
                    .fail_boots(
                        &left,
                        "its boot was abandoned: the control-plane replica driving it went away; start it again",
                        "an abandoned boot",
                    )
                    .await;
            }
            Err(e) => tracing::warn!(error = %e, "cannot list abandoned boots"),
        }

        match self
            .db
            .stale_deleting(now.minus(self.cfg.orphan_after))
            .await
        {
            Ok(left) => {
                for row in left.iter().filter(|r| ours(r)) {
                    if !leading.holds() {
                        return;
                    }
                    tracing::warn!(sandbox = %row.id, since = %row.updated_at.to_rfc3339(), "finishing a delete its replica left unfinished");
                    match self.delete_row(row).await {
                        Ok(()) => report.deletes_finished += 1,
                        Err(e) => {
                            tracing::warn!(sandbox = %row.id, error = %e, "cannot finish a delete; the next pass retries")
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot list deletes left unfinished"),
        }

        let before = now.minus(self.cfg.orphan_after);
        match self.db.stale_building_snapshots(before).await {
            Ok(left) => {
                for snap in left {
                    let message = "the control-plane replica building the snapshot went away; capture or build it again";
                    match self.db.fail_stale_build(snap.id, before, message).await {
                        Ok(true) => {
                            tracing::warn!(snapshot = %snap.id, "failed a snapshot build whose builder went away");
                            report.builds_failed += 1;
                        }
                        // Its builder refreshed or finished it meanwhile.
                        Ok(false) => {}
                        Err(e) => {
                            tracing::warn!(snapshot = %snap.id, error = %e, "cannot fail an abandoned snapshot build; the next pass retries")
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot list abandoned snapshot builds"),
        }
        match self.db.fail_orphaned_template_builds(before).await {
            Ok(0) => {}
            Ok(n) => {
                tracing::warn!(builds = n, "failed template builds whose replica went away");
                report.builds_failed += u32::try_from(n).unwrap_or(u32::MAX);
            }
            Err(e) => tracing::warn!(error = %e, "cannot fail abandoned template builds"),
        }

        if !leading.holds() {
            return;
        }
        self.tend_pools(now, &foreign).await;
        if !leading.holds() {
            return;
        }
        self.fail_over(now).await;
        if !leading.holds() {
            return;
        }
        self.reconcile_remote().await;
    }

    /// Fails each of `rows` (boots the reaper judged dead) with `message`,
    /// fenced on the generation and status it saw; how many it failed.
    async fn fail_boots(&self, rows: &[hearth_db::SandboxRow], message: &str, what: &str) -> u32 {
        let mut failed_n = 0;
        for row in rows {
            let extra = StatusExtra {
                expect_generation: Some(row.generation),
                ..Default::default()
            };
            let failed = self
                .apply_move(row.id, Move::BootFailed, Some(message), extra)
                .await;
            if failed.is_ok() {
                tracing::warn!(sandbox = %row.id, "failed {what}");
                failed_n += 1;
                self.bump(row.id);
            }
            crate::error::log_status_error(row.id, &format!("failed after {what}"), failed);
        }
        failed_n
    }

    /// Hosts registered as in-process by another process (an in-process
    /// host of a replica that is not this one).
    async fn foreign_hosts(&self) -> Result<HashSet<HostId>, hearth_db::DbError> {
        Ok(self
            .db
            .list_hosts()
            .await?
            .into_iter()
            .filter(|h| !crate::fleet::is_remote(h) && !self.hosts.contains_key(&h.id))
            .map(|h| h.id)
            .collect())
    }
}
