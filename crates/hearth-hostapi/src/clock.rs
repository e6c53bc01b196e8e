//! A guest's wall clock is its host's (protocol version 3,
//! `Request::Clock`).
//!
//! The host reads its own clock, asks the guest for its clock, and times
//! the round trip. If the two clocks agree, the guest read its clock
//! somewhere in that round trip; taking its middle as the host's time of
//! the guest's reading, the offset (guest − host) is known to within half
//! the round trip, whatever the two legs took. The host takes
//! [`SAMPLES`] such readings, keeps the one with the shortest round trip,
//! and when the offset is larger than [`STEP_THRESHOLD`] plus that
//! uncertainty, steps the guest's clock by its opposite. The step is
//! relative (the guest's kernel adds it to the clock as it then stands),
//! so the time the step request spends in transit changes nothing; its
//! answer is one more reading, which shows what is left.
//!
//! A time taken when the VM was configured, or when the first hello was
//! written, is stale by the whole boot (4–6 s under TCG: issue 16,
//! finding 8); a reading is only ever compared with host times taken
//! around its own round trip.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Readings per sync; the one with the shortest round trip is used.
pub const SAMPLES: usize = 4;

/// A guest clock off by less than this (beyond what the measurement
/// cannot tell) is left alone: every step moves the guest's time, maybe
/// backwards, under running programs.
pub const STEP_THRESHOLD: Duration = Duration::from_millis(10);

/// A reading less precise than this cannot show that a clock is right: a
/// guest just resumed on a loaded host may take seconds to answer, and a
/// clock seconds off then hides in the round trip. A sync whose best
/// reading is this uncertain, with nothing it could step, is not settled
/// ([`ClockSync::settled`]) and is tried again.
pub const MAX_UNCERTAINTY: Duration = Duration::from_millis(100);

/// One reading of the guest's clock, taken during a round trip that began
/// at `sent_ns` on the host's clock and lasted `round_trip`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// The host's `CLOCK_REALTIME` (Unix ns) when the request left.
    pub sent_ns: u64,
    /// From sending to the answer, on the host's monotonic clock (a step of
    /// the host's own clock meanwhile cannot make it negative).
    pub round_trip: Duration,
    /// The guest's `CLOCK_REALTIME` (Unix ns) in its answer.
    pub guest_ns: u64,
}

impl Sample {
    /// The guest's clock minus the host's, in ns, saturating at the
    /// bounds of `i64` (±292 years).
    pub fn offset_ns(&self) -> i64 {
        let half = (self.round_trip / 2).as_nanos() as i128;
        let host_mid = i128::from(self.sent_ns) + half;
        let offset = i128::from(self.guest_ns) - host_mid;
        offset.clamp(i64::MIN.into(), i64::MAX.into()) as i64
    }

    /// How far the true offset may be from [`Sample::offset_ns`].
    pub fn uncertainty(&self) -> Duration {
        self.round_trip / 2
    }
}

/// The reading with the shortest round trip (the most precise one).
pub fn best(samples: &[Sample]) -> Option<Sample> {
    samples.iter().min_by_key(|s| s.round_trip).copied()
}

/// The step (ns, to add to the guest's clock) that puts it on the
/// host's, or `None` when it is within `threshold` beyond the reading's
/// uncertainty.
pub fn step_for(sample: &Sample, threshold: Duration) -> Option<i64> {
    let offset = sample.offset_ns();
    let tolerance = threshold.saturating_add(sample.uncertainty());
    let tolerance = i64::try_from(tolerance.as_nanos()).unwrap_or(i64::MAX);
    (offset.unsigned_abs() > tolerance.unsigned_abs()).then(|| offset.saturating_neg())
}

/// What a sync found and did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockSync {
    /// The guest's clock minus the host's before the sync (ns), from the
    /// most precise reading.
    pub offset_ns: i64,
    /// That reading's round trip.
    pub round_trip: Duration,
    /// The step applied to the guest's clock (ns), if any.
    pub step_ns: Option<i64>,
    /// The offset the step's own answer shows (ns), if stepped.
    pub after_ns: Option<i64>,
}

impl ClockSync {
    /// Whether the guest's clock is known to be on the host's after this
    /// sync, within [`STEP_THRESHOLD`] plus [`MAX_UNCERTAINTY`]: a step
    /// whose own answer shows it there, or a reading precise enough to
    /// show that no step was needed.
    pub fn settled(&self) -> bool {
        let bound = STEP_THRESHOLD.saturating_add(MAX_UNCERTAINTY).as_nanos();
        match (self.step_ns, self.after_ns) {
            (Some(_), Some(after)) => u128::from(after.unsigned_abs()) <= bound,
            (Some(_), None) => false,
            (None, _) => self.round_trip / 2 <= MAX_UNCERTAINTY,
        }
    }
}

/// The host's `CLOCK_REALTIME` in Unix ns.
pub(crate) fn host_now() -> (u64, Instant) {
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    (wall, Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const T: u64 = 1_790_000_000_000 * MS;

    fn sample(guest_ns: u64, round_trip_ms: u64) -> Sample {
        Sample {
            sent_ns: T,
            round_trip: Duration::from_millis(round_trip_ms),
            guest_ns,
        }
    }

    #[test]
    fn the_offset_is_measured_from_the_middle_of_the_round_trip() {
        // The guest read T + 2 ms in a 4 ms round trip: on time.
        assert_eq!(sample(T + 2 * MS, 4).offset_ns(), 0);
        // Finding 8: a guest 5.9 s behind.
        let behind = sample(T + 2 * MS - 5_900 * MS, 4);
        assert_eq!(behind.offset_ns(), -5_900_000_000);
        assert_eq!(behind.uncertainty(), Duration::from_millis(2));
        // Ahead, and absurdly far off either way: saturates, no overflow.
        assert_eq!(sample(T + 3_002 * MS, 4).offset_ns(), 3_000_000_000);
        assert_eq!(sample(u64::MAX, 0).offset_ns(), i64::MAX);
        let past = Sample {
            sent_ns: u64::MAX,
            round_trip: Duration::ZERO,
            guest_ns: 0,
        };
        assert_eq!(past.offset_ns(), i64::MIN);
    }

    #[test]
    fn the_shortest_round_trip_wins() {
        let samples = [sample(T, 9), sample(T + MS, 2), sample(T, 3)];
        assert_eq!(best(&samples), Some(samples[1]));
        assert_eq!(best(&[]), None);
    }

    #[test]
    fn a_clock_is_stepped_only_past_the_threshold_and_the_uncertainty() {
        let threshold = Duration::from_millis(10);
        // 5.9 s behind: stepped forward by exactly that.
        let s = sample(T + 2 * MS - 5_900 * MS, 4);
        assert_eq!(step_for(&s, threshold), Some(5_900_000_000));
        // 50 ms ahead: stepped back.
        let s = sample(T + 52 * MS, 4);
        assert_eq!(step_for(&s, threshold), Some(-50_000_000));
        // 11 ms off, known to 2 ms: left alone; known to 0.5 ms: stepped.
        let s = sample(T + 13 * MS, 4);
        assert_eq!(step_for(&s, threshold), None);
        let s = Sample {
            round_trip: Duration::from_millis(1),
            guest_ns: T + MS / 2 + 11 * MS,
            ..s
        };
        assert_eq!(step_for(&s, threshold), Some(-11_000_000));
        // On time, or a reading too imprecise to tell: left alone.
        assert_eq!(step_for(&sample(T + 2 * MS, 4), threshold), None);
        assert_eq!(step_for(&sample(T + 900 * MS, 1000), threshold), None);
        // The extreme offset is negated without overflow.
        let s = Sample {
            sent_ns: u64::MAX,
            round_trip: Duration::ZERO,
            guest_ns: 0,
        };
        assert_eq!(step_for(&s, threshold), Some(i64::MAX));
    }

    #[test]
    fn a_sync_is_settled_only_when_it_shows_the_clock_on_time() {
        let sync = |round_trip_ms, step_ns, after_ns| ClockSync {
            offset_ns: -6_000_000_000,
            round_trip: Duration::from_millis(round_trip_ms),
            step_ns,
            after_ns,
        };
        // Stepped, and the step's answer shows it on time (or near).
        assert!(sync(4, Some(6_000_000_000), Some(1_000_000)).settled());
        assert!(sync(4, Some(6_000_000_000), Some(-110_000_000)).settled());
        // Stepped, but the answer shows it still off (the step's own
        // answer was slow, or the guest did not step): not settled.
        assert!(!sync(4, Some(6_000_000_000), Some(-111_000_000)).settled());
        assert!(!sync(4, Some(6_000_000_000), None).settled());
        // Nothing to step: settled only if the reading could have shown a
        // large offset. A clock 6 s off hides in a 12.5 s round trip.
        assert!(sync(200, None, None).settled());
        assert!(!sync(201, None, None).settled());
        assert!(!sync(12_500, None, None).settled());
    }
}
