//! The host autoscaler, run by the one control-plane replica that holds
//! the `autoscaler` lease in the database (each reaper pass renews or
//! takes it). The rule is `hearth_fleet::Autoscaler` (LangSmith's:
//! `ceil(committed vCPU / (host vCPU × target)) + headroom`, clamped, up
//! at once, down one host per stabilization window); the action is a
//! `hearth_fleet::ScaleBackend` (a command hook, or a Kubernetes
//! Deployment's `scale`).

use std::sync::Arc;
use std::time::Duration;

use hearth_db::{HostState, Timestamp};
use hearth_fleet::{Action, AutoscalePolicy, Autoscaler, ScaleBackend, Signal};
use tokio::sync::Mutex;

use crate::Control;

/// The autoscaler's name among leader leases.
const LEASE: &str = "autoscaler";

/// What the control plane scales its host pool with.
#[derive(Clone)]
pub struct AutoscaleSetup {
    pub policy: AutoscalePolicy,
    pub backend: Arc<dyn ScaleBackend>,
}

impl std::fmt::Debug for AutoscaleSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AutoscaleSetup")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// The leader's state: the rule's memory, and the last decision (for
/// `/metrics`).
pub(crate) struct AutoscaleState {
    scaler: Mutex<Option<Autoscaler>>,
    pub(crate) last: std::sync::Mutex<Option<hearth_fleet::Decision>>,
}

impl AutoscaleState {
    pub(crate) fn new() -> Self {
        Self {
            scaler: Mutex::new(None),
            last: std::sync::Mutex::new(None),
        }
    }
}

impl Control {
    /// One autoscaler tick at `now`, when this replica is (or becomes) the
    /// leader. A replica that loses the lease forgets the rule's state: a
    /// new leader holds for one window before removing a host.
    pub(crate) async fn autoscale(&self, now: Timestamp) {
        let Some(setup) = &self.cfg.autoscale else {
            return;
        };
        let ttl = crate::reap::leader_ttl(self.cfg.reaper_interval);
        let state = &self.autoscale_state;
        let leader = match self
            .db
            .acquire_leadership(LEASE, &self.replica, ttl, now)
            .await
        {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "autoscaler: cannot take or renew the leader lease");
                None
            }
        };
        let mut scaler = state.scaler.lock().await;
        if leader.is_none() {
            *scaler = None;
            return;
        }
        let scaler = scaler.get_or_insert_with(|| Autoscaler::new(setup.policy));
        let hosts = match self.db.list_hosts().await {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(error = %e, "autoscaler: cannot read the host registry");
                return;
            }
        };
        // Without the load the rule would see an empty fleet and scale down.
        let loads = match self.db.host_load().await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "autoscaler: cannot read the hosts' committed load");
                return;
            }
        };
        let live: Vec<_> = hosts
            .iter()
            .filter(|h| h.state == HostState::Ready && h.lease_expires_at > now)
            .collect();
        let committed: u64 = loads.iter().map(|l| u64::from(l.cpu.0)).sum();
        // A live host whose store fails takes no placements (see
        // `place_committed`): it counts as no room.
        let unplaceable = live.iter().filter(|h| h.store_error.is_some()).count();
        let signal = (!live.is_empty() || committed > 0).then_some(Signal {
            committed_millicpu: committed,
            ready_hosts: live.len() as u32,
            unplaceable_hosts: unplaceable as u32,
        });
        let current = match setup.backend.replicas().await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "autoscaler: cannot read the replica count");
                return;
            }
        };
        let at = Duration::from_millis(now.unix_ms().max(0) as u64);
        let decision = scaler.decide(at, current, signal);
        if decision.action != Action::Hold && decision.desired != current {
            tracing::info!(
                current,
                desired = decision.desired,
                action = %decision.action,
                reason = %decision.reason,
                "autoscaler: scaling the host pool"
            );
            if let Err(e) = setup.backend.scale(decision.desired).await {
                tracing::warn!(error = %e, desired = decision.desired, "autoscaler: scaling failed");
            }
        } else {
            tracing::debug!(current, reason = %decision.reason, "autoscaler: holding");
        }
        if let Ok(mut last) = state.last.lock() {
            *last = Some(decision);
        }
    }
}
