//! Keeping each guest's wall clock on the host's (issue 16, finding 8).
//!
//! A guest's clock is set from the host's at every handshake (a boot, a
//! start, a resume from saved memory or a snapshot: each goes through
//! `Host::attach`), when a paused VM resumes (its clock stood still while
//! the VMM was stopped), and every [`crate::HostConfig::clock_interval`]
//! while it runs. A running guest on a quiet host hardly drifts (its `tsc`
//! clocksource ticks with the host's TSC: about 50 µs in two minutes,
//! measured under TCG), but under TCG on a loaded host a guest's clock was
//! seen to fall 5 s behind in 37 s and 15 s in a minute (CI, 2 cores, a
//! dozen VMs booting), and anything that stops its VMM, or a root user's
//! `date -s`, leaves it off until the next sync. So the periodic sync
//! adapts ([`next_wait`]): the first comes [`FIRST_WAIT`] after the
//! handshake, and each step measures how fast the clock drifts, which sets
//! the next wait so the drift stays within [`DRIFT_TARGET`] (from 1 s up to
//! the configured interval; a sync that stepped nothing doubles the wait).
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
/// The first periodic sync after the loop starts (the drift is unknown).
pub const FIRST_WAIT: Duration = Duration::from_secs(5);
/// How far the periodic sync lets a drifting clock get before it steps it.
pub const DRIFT_TARGET: Duration = Duration::from_millis(50);
/// The shortest wait between periodic syncs, however fast the drift.
pub const MIN_WAIT: Duration = Duration::from_secs(1);

/// What one [`sync`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Synced {
    /// An attempt showed the clock on the host's.
    pub settled: bool,
    /// The steps it made, in ns (their sum).
    pub stepped_ns: i64,
}

/// The wait before the next periodic sync, after `synced` found the drift
/// of the `since_last` that had passed since the one before (`last_wait`
/// was the wait before it): a clock that drifted is synced again before
/// it can drift [`DRIFT_TARGET`] at the rate seen, within [`MIN_WAIT`] and
/// `interval`; one that did not waits twice as long as before, up to
/// `interval`; a sync that did not settle is retried soon.
pub fn next_wait(
    interval: Duration,
    last_wait: Duration,
    since_last: Duration,
    synced: Synced,
) -> Duration {
    let floor = MIN_WAIT.min(interval);
    if !synced.settled {
        return interval.min(RETRY_AFTER_FAILURE);
    }
    let stepped = u128::from(synced.stepped_ns.unsigned_abs());
    if stepped <= hearth_hostapi::clock::STEP_THRESHOLD.as_nanos() {
        return last_wait.saturating_mul(2).clamp(floor, interval);
    }
    let target = DRIFT_TARGET.as_nanos();
    let wait_ns = since_last.as_nanos().saturating_mul(target) / stepped;
    Duration::from_nanos(u64::try_from(wait_ns).unwrap_or(u64::MAX)).clamp(floor, interval)
}

/// Sets the guest's clock to the host's; `why` names the occasion in the
/// log. Attempts go on, with growing pauses between them, until one
/// shows the clock on the host's ([`hearth_hostapi::clock::ClockSync::settled`])
/// or [`SYNC_DEADLINE`] passes; what it did. A step is logged at
/// info (after a boot the clock is always off by something), a sync that
/// never settled at warn.
pub async fn sync(vm: &Vm, guest: &GuestClient, why: &'static str) -> Synced {
    let _one_at_a_time = vm.clock.lock().await;
    let started = Instant::now();
    let mut pause = Duration::from_millis(50);
    let mut attempts = 0u32;
    let mut done = Synced::default();
    loop {
        attempts += 1;
        let (settled, step) = attempt(vm, guest, why).await;
        done.stepped_ns = done.stepped_ns.saturating_add(step.unwrap_or(0));
        if settled {
            done.settled = true;
            return done;
        }
        if guest.mux().is_closed() || started.elapsed() + pause >= SYNC_DEADLINE {
            tracing::warn!(
                vm = %vm.id,
                why,
                attempts,
                "the guest's clock could not be set within {SYNC_DEADLINE:?}; the next sync tries again"
            );
            return done;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

/// One attempt of [`sync`]: whether it settled the clock, and its step.
async fn attempt(vm: &Vm, guest: &GuestClient, why: &'static str) -> (bool, Option<i64>) {
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
            (s.settled(), s.step_ns)
        }
        Ok(Ok(None)) => {
            tracing::debug!(
                vm = %id,
                protocol = guest.protocol_version,
                "guest agent too old to be told the time (it took the hello's)"
            );
            (true, None)
        }
        Ok(Err(e)) => {
            tracing::warn!(vm = %id, why, error = %e, "cannot set the guest's clock");
            (false, None)
        }
        Err(_) => {
            tracing::warn!(
                vm = %id,
                why,
                "cannot set the guest's clock: no answer within {ATTEMPT_DEADLINE:?}"
            );
            (false, None)
        }
    }
}

/// Syncs the guest's clock every `interval` while the VM is ready; never
/// returns (a lost channel is for the VM's watcher to notice).
pub async fn keep(vm: &Vm, guest: &GuestClient, interval: Duration) -> Infallible {
    if interval.is_zero() {
        return std::future::pending().await;
    }
    let mut wait = FIRST_WAIT.min(interval);
    let mut last = Instant::now();
    loop {
        tokio::time::sleep(wait).await;
        if vm.state() == VmState::Ready && !guest.mux().is_closed() {
            let synced = sync(vm, guest, "periodic").await;
            wait = next_wait(interval, wait, last.elapsed(), synced);
            last = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn synced(stepped_ms: i64) -> Synced {
        Synced {
            settled: true,
            stepped_ns: stepped_ms * 1_000_000,
        }
    }

    #[test]
    fn the_wait_follows_the_drift_seen() {
        let interval = 60 * S;
        // On time: the wait doubles, up to the interval.
        assert_eq!(next_wait(interval, 5 * S, 5 * S, synced(0)), 10 * S);
        assert_eq!(next_wait(interval, 40 * S, 40 * S, synced(3)), interval);
        // 100 ms in 5 s: 50 ms comes in 2.5 s.
        assert_eq!(
            next_wait(interval, 5 * S, 5 * S, synced(-100)),
            Duration::from_millis(2500)
        );
        // 50 µs a minute (a quiet host): below the step threshold.
        assert_eq!(next_wait(interval, 60 * S, 60 * S, synced(0)), interval);
        // CI's 5 s in 37 s: as often as allowed.
        assert_eq!(next_wait(interval, 37 * S, 37 * S, synced(5000)), MIN_WAIT);
        // 20 ms in 60 s: every 2.5 min, capped at the interval.
        assert_eq!(next_wait(interval, 60 * S, 60 * S, synced(20)), interval);
        // Not settled: soon.
        let failed = Synced::default();
        assert_eq!(
            next_wait(interval, 60 * S, 60 * S, failed),
            RETRY_AFTER_FAILURE
        );
        // An interval below the floor is the floor and the ceiling.
        let short = Duration::from_millis(200);
        assert_eq!(next_wait(short, short, short, synced(5000)), short);
        assert_eq!(next_wait(short, short, short, synced(0)), short);
    }
}
