//! Reconcile: the control plane's view of each sandbox made to agree
//! with what its host reports (boots and stops no replica recorded, VMs
//! lost or unhealthy, VMs nobody owns), and the graceful stop of all.

use std::sync::Arc;
use std::time::Duration;

use hearth_db::{SandboxStatus, StatusExtra, Timestamp};
use hearth_hostapi::{HostApi, VmState};
use hearth_types::{HostId, VmId};

use crate::domain::state::Move;
use crate::service::vm_id;
use crate::Control;

/// What a boot task is asked to do.
/// How long reconciliation waits for a host's list of VMs.
const RECONCILE_LIST_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// removed.
    pub(crate) async fn reconcile_hosts(
        &self,
        hosts: &[(HostId, Arc<dyn HostApi>)],
        after_restart: bool,
    ) {
        for (host_id, host) in hosts {
            // VMs first, then rows: a VM is only ever created after its row,
            // so a VM missing from the later row query really has no sandbox.
            let vms = match tokio::time::timeout(RECONCILE_LIST_TIMEOUT, host.list_vms()).await {
                Ok(Ok(vms)) => vms,
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
            let rows = match self.db.sandbox_briefs_on_host(*host_id).await {
                Ok(rows) => rows,
                Err(e) => {
                    tracing::error!(host = %host_id, error = %e, "cannot list the host's sandboxes to stop them; their VMs stop with the host agent and come back from their last commit");
                    continue;
                }
            };
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
                    let Some(now) = ask_again(host.as_ref(), vm_id(row.id), row.generation).await
                    else {
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
                                tracing::warn!(sandbox = %row.id, error = %e, "cannot read a sandbox whose stop its host finished; the next pass retries")
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
                    continue;
                }
            };
            // A ready member whose VM died (or vanished) is replaced: the
            // next tend of its pool boots another. So is a warming one
            // after this process restarted its hosts: no boot of it is in
            // flight any more.
            for m in members
                .iter()
                .filter(|m| after_restart || m.status == hearth_db::MemberStatus::Ready)
            {
                let member = |v: &hearth_hostapi::VmRecord| v.pooled && v.state == VmState::Paused;
                if by_id.get(&vm_id(m.id)).is_some_and(|v| member(v)) {
                    continue;
                }
                // Listed before the member's row was read: a member that
                // finished warming in between is asked about again.
                match ask_again(host.as_ref(), vm_id(m.id), m.generation).await {
                    Some(Some(v)) if member(&v) => {}
                    Some(Some(_)) => {
                        self.remove_member(m, "its VM is no longer a paused member")
                            .await
                    }
                    Some(None) => self.remove_member(m, "its VM is gone").await,
                    None => {}
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
                    Ok(s) if s.host_id == Some(*host_id) => continue,
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
                        continue;
                    }
                };
                if let Err(e) = done {
                    tracing::warn!(vm = %rec.id, error = %e, "cannot clean up a vm with no sandbox here");
                }
            }
        }
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
