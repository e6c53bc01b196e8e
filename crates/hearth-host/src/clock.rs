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
//! A failed sync is logged and the VM goes on: the next one tries again.

use std::convert::Infallible;
use std::time::Duration;

use crate::guest::GuestClient;
use crate::vm::{Vm, VmState};

/// Sets the guest's clock to the host's; `why` names the occasion in the
/// log. A step is logged at info (after a boot the clock is always off
/// by something), a failure at warn.
pub async fn sync(vm: &Vm, guest: &GuestClient, why: &'static str) {
    let id = vm.id;
    let _one_at_a_time = vm.clock.lock().await;
    // A sync is four or five requests; a guest too busy to answer them in
    // this long is not one whose clock we can measure well anyway.
    const DEADLINE: Duration = Duration::from_secs(10);
    match tokio::time::timeout(DEADLINE, guest.sync_clock()).await {
        Ok(Ok(Some(s))) => match s.step_ns {
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
                "guest clock on time"
            ),
        },
        Ok(Ok(None)) => tracing::debug!(
            vm = %id,
            protocol = guest.protocol_version,
            "guest agent too old to be told the time (it took the hello's)"
        ),
        Ok(Err(e)) => tracing::warn!(vm = %id, why, error = %e, "cannot set the guest's clock"),
        Err(_) => tracing::warn!(
            vm = %id,
            why,
            "cannot set the guest's clock: no answer within {DEADLINE:?}"
        ),
    }
}

/// Syncs the guest's clock every `interval` while the VM is ready; never
/// returns (a lost channel is for the VM's watcher to notice).
pub async fn keep(vm: &Vm, guest: &GuestClient, interval: Duration) -> Infallible {
    if interval.is_zero() {
        return std::future::pending().await;
    }
    loop {
        tokio::time::sleep(interval).await;
        if vm.state() == VmState::Ready && !guest.mux().is_closed() {
            sync(vm, guest, "periodic").await;
        }
    }
}
