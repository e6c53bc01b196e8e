//! Reconcile: the control plane's view of each sandbox made to agree
//! with what its host reports (boots and stops no replica recorded, VMs
//! lost or unhealthy, VMs nobody owns), and the graceful stop of all.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hearth_db::{SandboxStatus, StatusExtra, Timestamp};
use hearth_hostapi::{ChangeCursor, HostApi, VmChanges, VmState};
use hearth_types::{HostId, VmId};

use crate::domain::state::Move;
use crate::service::vm_id;
use crate::Control;

/// How long reconciliation waits for a host's list of VMs.
const RECONCILE_LIST_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a host is reconciled whole, between passes that look only at
/// what changed on it: the whole pass also finds what no VM change shows
/// (a stop whose replica died between the host's answer and its record).
const FULL_PASS_EVERY: Duration = Duration::from_secs(30);

/// Where this replica is in each host's change feed, and when it last
/// reconciled the host whole.
#[derive(Default)]
pub(crate) struct Feeds(std::sync::Mutex<std::collections::HashMap<HostId, Feed>>);

#[derive(Clone, Copy)]
struct Feed {
    cursor: ChangeCursor,
    whole_at: Instant,
}

impl Feeds {
    /// The cursor to ask `host` with: `None` (the whole list) when this
    /// replica has none or its last whole pass is [`FULL_PASS_EVERY`] old.
    fn since(&self, host: HostId, whole: bool) -> Option<ChangeCursor> {
        let feeds = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match feeds.get(&host) {
            Some(f) if !whole && f.whole_at.elapsed() < FULL_PASS_EVERY => Some(f.cursor),
            _ => None,
        }
    }

    /// Records where a pass that read `changes` leaves the feed, once the
    /// pass has acted on them.
    fn advance(&self, host: HostId, changes: &VmChanges) {
        let mut feeds = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match changes.cursor {
            Some(cursor) => {
                let whole_at = match feeds.get(&host) {
                    Some(f) if !changes.complete => f.whole_at,
                    _ => Instant::now(),
                };
                feeds.insert(host, Feed { cursor, whole_at });
            }
            None => {
                feeds.remove(&host);
            }
        }
    }

    /// Forgets `host`'s cursor: the next pass reads it whole (a pass that
    /// could not act on everything it was told).
    fn reset(&self, host: HostId) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&host);
    }
}

impl Control {
    /// Graceful shutdown of this process's hosts: every running sandbox is
    /// stopped and recorded as such (its disk is kept).
    pub async fn stop_all(&self) {
        for host_id in self.hosts.keys() {
            let rows = match self.db.sandboxes_on_host(*host_id).await {
                Ok(rows) => rows,
                Err(e) => {
                    tracing::error!(host = %host_id, error = %e, "cannot list the host's sandboxes to stop them; their VMs stop with the host agent and come back from their last commit");
                    continue;
                }
            };
            let stops = rows
                .iter()
                .filter(|r| r.status == SandboxStatus::Ready)
                .map(|r| self.stop_row(r, Some("the server shut down")));
            futures_util::future::join_all(stops).await;
        }
    }

    /// Brings the database in line with what this process's in-process
    /// hosts run (`after_restart`: this process just started them). Every
    /// replica does this for its own hosts; remote hosts are the reaper
    /// leader's ([`Self::reconcile_remote`]).
    pub async fn reconcile(&self, after_restart: bool) {
        let own: Vec<(HostId, Arc<dyn HostApi>)> =
            self.hosts.iter().map(|(id, h)| (*id, h.clone())).collect();
        self.reconcile_hosts(&own, after_restart).await;
    }

    /// Reconciles the remote hosts with a live lease (the reaper leader's
    /// duty: one replica is enough, and a restart of one replica says
    /// nothing about them).
    pub(crate) async fn reconcile_remote(&self) {
        match self.remote_hosts().await {
            Ok(remote) => self.reconcile_hosts(&remote, false).await,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list remote hosts to reconcile them; the next pass retries")
            }
        }
    }

    /// Brings the database in line with what `hosts` run: a sandbox
    /// recorded as running whose VM is gone is marked, one whose stop the
    /// host finished is recorded stopped, and a VM with no sandbox is
    /// removed. Each host is asked only for what changed on it since this
    /// replica's last pass ([`HostApi::vm_changes`]), and only those VMs'
    /// rows are read; every [`FULL_PASS_EVERY`] (and after a restart) the
    /// host is read whole.
    pub(crate) async fn reconcile_hosts(
        &self,
        hosts: &[(HostId, Arc<dyn HostApi>)],
        after_restart: bool,
    ) {
        for (host_id, host) in hosts {
            // VMs first, then rows: a VM is only ever created after its row,
            // so a VM missing from the later row query really has no sandbox.
            let since = self.feeds.since(*host_id, after_restart);
            let changes =
                match tokio::time::timeout(RECONCILE_LIST_TIMEOUT, host.vm_changes(since)).await {
                    Ok(Ok(changes)) => changes,
                    Err(_) => {
                        tracing::warn!(host = %host_id, "the host did not list its VMs in time");
                        continue;
                    }
                    Ok(Err(e)) if e.kind == hearth_hostapi::ErrorKind::Unavailable => {
                        tracing::debug!(host = %host_id, error = %e, "cannot list the host's VMs");
                        continue;
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(host = %host_id, error = %e, "cannot list the host's VMs");
                        continue;
                    }
                };
            if self
                .reconcile_host(*host_id, host.as_ref(), &changes, after_restart)
                .await
            {
                self.feeds.advance(*host_id, &changes);
            } else {
                self.feeds.reset(*host_id);
            }
        }
    }

    /// One host's pass over `changes` (the whole list, or what changed);
    /// `false` when some of it could not be acted on, so the next pass
    /// reads the host whole.
    async fn reconcile_host(
        &self,
        host_id: HostId,
        host: &dyn HostApi,
        changes: &VmChanges,
        after_restart: bool,
    ) -> bool {
        let host_id = &host_id;
        let vms = &changes.changed;
        // The rows of the VMs that changed or went away, or every row on
        // the host.
        let among: Option<Vec<hearth_types::SandboxId>> = (!changes.complete).then(|| {
            vms.iter()
                .map(|v| v.id)
                .chain(changes.gone.iter().copied())
                .map(|id| hearth_types::SandboxId::from_uuid(id.as_uuid()))
                .collect()
        });
        if among.as_ref().is_some_and(Vec::is_empty) {
            self.metrics.reconciled(false, 0);
            return true;
        }
        let rows = match &among {
            None => self.db.sandbox_briefs_on_host(*host_id).await,
            Some(ids) => self.db.sandbox_briefs_among(*host_id, ids).await,
        };
        let rows = match rows {
            Ok(rows) => {
                self.metrics.reconciled(changes.complete, rows.len());
                rows
            }
            Err(e) => {
                tracing::error!(host = %host_id, error = %e, "cannot read the host's sandboxes to reconcile them; the next pass retries");
                return false;
            }
        };
        let touched: Option<std::collections::HashSet<VmId>> = among
            .as_ref()
            .map(|ids| ids.iter().map(|id| vm_id(*id)).collect());
        // Whether everything seen was acted on (or needs nothing): what was
        // not is looked at again by the next pass, which reads the host
        // whole.
        let mut settled = true;
        {
            // By id: a host may hold thousands.
            let by_id: std::collections::HashMap<VmId, &hearth_hostapi::VmRecord> =
                vms.iter().map(|v| (v.id, v)).collect();
            for row in &rows {
                let listed = by_id.get(&vm_id(row.id)).copied();
                let running = matches!(
                    listed.map(|v| v.state),
                    Some(VmState::Ready | VmState::Paused)
                );
                // The rows were read after the VMs: a boot that ended in
                // between shows a ready row beside its VM still booting
                // (or not yet created). A ready sandbox whose VM looks
                // stopped or gone is asked about again, after its row was
                // read, before it is recorded stopped or failed.
                let asked;
                let vm = if row.status == SandboxStatus::Ready && !running {
                    let Some(now) = ask_again(host, vm_id(row.id), row.generation).await else {
                        settled = false;
                        continue;
                    };
                    asked = now;
                    asked.as_ref()
                } else {
                    listed
                };
                let running = matches!(vm.map(|v| v.state), Some(VmState::Ready | VmState::Paused));
                match row.status {
                    SandboxStatus::Ready if running => {
                        // A guest that misses liveness pings is unhealthy
                        // before it is failed: say so while it lasts.
                        let unhealthy = vm
                            .and_then(|v| v.reason.clone())
                            .filter(|r| r.starts_with("unhealthy"));
                        let shown = row
                            .status_message
                            .as_deref()
                            .filter(|m| m.starts_with("unhealthy"));
                        if unhealthy.as_deref() != shown {
                            let extra = StatusExtra {
                                expect_generation: Some(row.generation),
                                ..StatusExtra::default()
                            };
                            if let Err(e) = self
                                .apply_move(row.id, Move::HealthNoted, unhealthy.as_deref(), extra)
                                .await
                            {
                                tracing::debug!(sandbox = %row.id, error = %e, "health not recorded");
                                settled = false;
                            }
                        }
                    }
                    // A stop the host finished (or is finishing) whose
                    // replica did not record it: recorded here.
                    SandboxStatus::Ready
                        if matches!(vm.map(|v| v.state), Some(VmState::Stopping)) => {}
                    SandboxStatus::Ready
                        if matches!(vm.map(|v| v.state), Some(VmState::Stopped)) =>
                    {
                        // The whole row, for the rare sandbox that needs it.
                        match self.db.get_sandbox_by_id(row.id).await {
                            Ok(full) if full.generation == row.generation => {
                                self.finish_stop(&full, vm.and_then(|v| v.saved.as_ref()))
                                    .await
                            }
                            Ok(_) => {}
                            Err(e) => {
                                tracing::warn!(sandbox = %row.id, error = %e, "cannot read a sandbox whose stop its host finished; the next pass retries");
                                settled = false;
                            }
                        }
                    }
                    SandboxStatus::Ready if !running => {
                        // Host loss: memory is gone, the disk is kept; the
                        // next start or data-plane request cold boots it.
                        let (m, msg) = if after_restart {
                            (
                                Move::HostRestarted,
                                "the host restarted; the sandbox will cold boot from its disk",
                            )
                        } else {
                            (Move::VmLost, "the sandbox's VM stopped unexpectedly")
                        };
                        let extra = StatusExtra {
                            stopped_at: Some(Some(Timestamp::now())),
                            expect_generation: Some(row.generation),
                            ..StatusExtra::default()
                        };
                        let reason = vm
                            .and_then(|v| v.reason.clone())
                            .map(|r| format!("{msg}: {r}"))
                            .unwrap_or_else(|| msg.to_owned());
                        let set = self.apply_move(row.id, m, Some(&reason), extra).await;
                        settled &= set.is_ok();
                        crate::error::log_status_error(row.id, "reconciled with its host", set);
                        self.bump(row.id);
                    }
                    // The boot ended on its host but nobody recorded it:
                    // the replica that drove it died (or is about to record
                    // it; `finish_boot` takes this as its own outcome). Any
                    // replica records it, so it is never left provisioning.
                    SandboxStatus::Provisioning
                        if vm.is_some_and(|v| {
                            v.fence == row.generation
                                && matches!(v.state, VmState::Ready | VmState::Failed)
                        }) =>
                    {
                        let (m, reason) = match vm {
                            Some(v) if v.state == VmState::Failed => (
                                Move::BootFailed,
                                Some(v.reason.clone().unwrap_or_else(|| "the boot failed".into())),
                            ),
                            _ => (Move::Booted, None),
                        };
                        let extra = StatusExtra {
                            expect_generation: Some(row.generation),
                            ..StatusExtra::default()
                        };
                        let set = self.apply_move(row.id, m, reason.as_deref(), extra).await;
                        settled &= set.is_ok();
                        if set.is_ok() {
                            tracing::info!(sandbox = %row.id, host = %host_id, status = m.to().as_str(), "recorded a boot its host ended (the replica that drove it did not)");
                        }
                        crate::error::log_status_error(row.id, "recorded from its host", set);
                        self.bump(row.id);
                    }
                    SandboxStatus::Provisioning if after_restart => {
                        let extra = StatusExtra {
                            expect_generation: Some(row.generation),
                            ..StatusExtra::default()
                        };
                        let set = self
                            .apply_move(
                                row.id,
                                Move::BootFailed,
                                Some("the host restarted during boot"),
                                extra,
                            )
                            .await;
                        crate::error::log_status_error(row.id, "failed after a host restart", set);
                        self.bump(row.id);
                    }
                    _ => {}
                }
            }
            // VMs the database does not know (or has deleted) go away; a
            // VM whose sandbox now runs on another host (it failed over,
            // or moved at a start) is only forgotten here: its disk in the
            // store is the other host's now.
            // Warm pools' members have no sandbox yet (read after the
            // VMs too: a member's row is made before its VM).
            let members: Vec<hearth_db::MemberRow> = match self.db.list_members().await {
                Ok(m) => m.into_iter().filter(|m| m.host_id == *host_id).collect(),
                Err(e) => {
                    tracing::warn!(host = %host_id, error = %e, "cannot list pool members; leaving the host's unknown VMs for the next pass");
                    return false;
                }
            };
            // A ready member whose VM died (or vanished) is replaced: the
            // next tend of its pool boots another. So is a warming one
            // after this process restarted its hosts: no boot of it is in
            // flight any more.
            for m in members.iter().filter(|m| {
                (after_restart || m.status == hearth_db::MemberStatus::Ready)
                    && touched.as_ref().is_none_or(|t| t.contains(&vm_id(m.id)))
            }) {
                let member = |v: &hearth_hostapi::VmRecord| v.pooled && v.state == VmState::Paused;
                if by_id.get(&vm_id(m.id)).is_some_and(|v| member(v)) {
                    continue;
                }
                // Listed before the member's row was read: a member that
                // finished warming in between is asked about again.
                match ask_again(host, vm_id(m.id), m.generation).await {
                    Some(Some(v)) if member(&v) => {}
                    Some(Some(_)) => {
                        self.remove_member(m, "its VM is no longer a paused member")
                            .await
                    }
                    Some(None) => self.remove_member(m, "its VM is gone").await,
                    None => settled = false,
                }
            }
            let members: std::collections::HashSet<VmId> =
                members.iter().map(|m| vm_id(m.id)).collect();
            let known: std::collections::HashSet<VmId> = rows.iter().map(|r| vm_id(r.id)).collect();
            for rec in vms.iter() {
                let known = known.contains(&rec.id);
                if known || members.contains(&rec.id) {
                    continue;
                }
                let sandbox = self
                    .db
                    .get_sandbox_by_id(hearth_types::SandboxId::from_uuid(rec.id.as_uuid()))
                    .await;
                let done = match sandbox {
                    // Placed here since the rows were read (a pool member
                    // claimed meanwhile): the next pass sees it.
                    Ok(s) if s.host_id == Some(*host_id) => {
                        settled = false;
                        continue;
                    }
                    Ok(_) => {
                        tracing::info!(vm = %rec.id, "forgetting a vm whose sandbox moved to another host");
                        host.forget_vm(rec.id, rec.fence).await
                    }
                    Err(hearth_db::DbError::NotFound { .. }) => {
                        tracing::info!(vm = %rec.id, "removing a vm with no sandbox");
                        host.delete_vm(rec.id, rec.fence).await
                    }
                    // Never removed on a database error: it may be a live
                    // sandbox's.
                    Err(e) => {
                        tracing::warn!(vm = %rec.id, error = %e, "cannot tell whether a vm unknown here has a sandbox; the next pass looks");
                        settled = false;
                        continue;
                    }
                };
                if let Err(e) = done {
                    tracing::warn!(vm = %rec.id, error = %e, "cannot clean up a vm with no sandbox here");
                    settled = false;
                }
            }
        }
        settled
    }
}

/// A VM's record read again during reconcile (its listing is older than
/// the rows read after it): `Some(None)` when the host has no such VM,
/// `None` when the host could not say (logged; the next pass looks).
async fn ask_again(
    host: &dyn HostApi,
    id: VmId,
    fence: u64,
) -> Option<Option<hearth_hostapi::VmRecord>> {
    match host.get_vm(id, fence).await {
        Ok(now) => Some(Some(now)),
        Err(e) if e.is_not_found() => Some(None),
        Err(e) => {
            tracing::debug!(vm = %id, error = %e, "cannot read a VM again; the next pass looks");
            None
        }
    }
}
