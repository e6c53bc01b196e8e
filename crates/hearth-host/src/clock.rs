//! Keeping each guest's wall clock on the host's (issue 16, finding 8).
//!
//! A guest's clock is set from the host's at every handshake (a boot, a
//! start, a resume from saved memory or a snapshot: each goes through
//! `Host::attach`), when a paused VM resumes (its clock stood still while
//! the VMM was stopped), and every [`crate::HostConfig::clock_interval`]
//! while it runs. A running guest hardly drifts (its `tsc` clocksource
//! ticks with the host's TSC: about 50 µs in two minutes, measured under
//! TCG), but anything that stops its VMM, or a root user's `date -s`,
//! leaves it off until the next sync.
//! How one sync measures and steps is in [`hearth_hostapi::clock`].
//! A sync tries until its reading shows the clock right (a guest slow to
//! answer hides an offset in its round trip) or [`SYNC_DEADLINE`] passes;
//! one that never settles is logged and the VM goes on: the periodic sync
//! then comes sooner.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use crate::guest::GuestClient;
use crate::vm::{Vm, VmState};

/// How long one sync goes on trying before it gives up until the next
/// occasion. A guest just resumed on a loaded host (a pool member claimed
/// while others boot) can take seconds to answer; its clock, stood still
/// while it was paused, is then off by as much.
pub const SYNC_DEADLINE: Duration = Duration::from_secs(30);
/// The longest one attempt may take: four or five requests; a guest too
/// busy to answer them in this long is not one whose clock we can measure.
const ATTEMPT_DEADLINE: Duration = Duration::from_secs(10);
/// After a sync that did not settle, the periodic one comes this soon.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(5);

/// Sets the guest's clock to the host's; `why` names the occasion in the
/// log. Attempts go on, with growing pauses between them, until one
/// shows the clock on the host's ([`hearth_hostapi::clock::ClockSync::settled`])
/// or [`SYNC_DEADLINE`] passes; `true` if one did. A step is logged at
/// info (after a boot the clock is always off by something), a sync that
/// never settled at warn.
pub async fn sync(vm: &Vm, guest: &GuestClient, why: &'static str) -> bool {
    let _one_at_a_time = vm.clock.lock().await;
    let started = Instant::now();
    let mut pause = Duration::from_millis(50);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        if attempt(vm, guest, why).await {
            return true;
        }
        if guest.mux().is_closed() || started.elapsed() + pause >= SYNC_DEADLINE {
            tracing::warn!(
                vm = %vm.id,
                why,
                attempts,
                "the guest's clock could not be set within {SYNC_DEADLINE:?}; the next sync tries again"
            );
            return false;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

/// One attempt of [`sync`]: whether it settled the clock.
async fn attempt(vm: &Vm, guest: &GuestClient, why: &'static str) -> bool {
    let id = vm.id;
    match tokio::time::timeout(ATTEMPT_DEADLINE, guest.sync_clock()).await {
        Ok(Ok(Some(s))) => {
            match s.step_ns {
                Some(step_ns) => tracing::info!(
                    vm = %id,
                    why,
                    offset_ms = s.offset_ns as f64 / 1e6,
                    step_ms = step_ns as f64 / 1e6,
                    after_ms = s.after_ns.map(|ns| ns as f64 / 1e6),
                    round_trip_ms = s.round_trip.as_secs_f64() * 1e3,
                    "stepped the guest's clock onto the host's"
                ),
                None => tracing::debug!(
                    vm = %id,
                    why,
                    offset_ms = s.offset_ns as f64 / 1e6,
                    round_trip_ms = s.round_trip.as_secs_f64() * 1e3,
                    settled = s.settled(),
                    "no step: the guest's clock is on time or the reading too imprecise to tell"
                ),
            }
            s.settled()
        }
        Ok(Ok(None)) => {
            tracing::debug!(
                vm = %id,
                protocol = guest.protocol_version,
                "guest agent too old to be told the time (it took the hello's)"
            );
            true
        }
        Ok(Err(e)) => {
            tracing::warn!(vm = %id, why, error = %e, "cannot set the guest's clock");
            false
        }
        Err(_) => {
            tracing::warn!(
                vm = %id,
                why,
                "cannot set the guest's clock: no answer within {ATTEMPT_DEADLINE:?}"
            );
            false
        }
    }
}

/// Syncs the guest's clock every `interval` while the VM is ready; never
/// returns (a lost channel is for the VM's watcher to notice).
pub async fn keep(vm: &Vm, guest: &GuestClient, interval: Duration) -> Infallible {
    if interval.is_zero() {
        return std::future::pending().await;
    }
    let mut wait = interval;
    loop {
        tokio::time::sleep(wait).await;
        if vm.state() == VmState::Ready && !guest.mux().is_closed() {
            let settled = sync(vm, guest, "periodic").await;
            wait = if settled {
                interval
            } else {
                interval.min(RETRY_AFTER_FAILURE)
            };
        }
    }
}
