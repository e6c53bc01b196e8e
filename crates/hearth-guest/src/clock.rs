//! The guest's wall clock is the host's. From protocol version 3 the host
//! reads it with `Request::Clock` between two readings of its own and
//! steps it by the offset it measured (after every handshake, after a
//! resume from pause, and periodically); this module answers those
//! requests. Older hosts only send their time in the hello, which
//! [`from_hello`] applies as before.

use hearth_guest_proto::{OpError, OpErrorKind, Reply};

use crate::sys;

const MICROS_PER_SEC: i64 = 1_000_000;

/// `CLOCK_REALTIME` in Unix nanoseconds (0 before 1970).
pub fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Splits a step into whole seconds (rounded down) and the microseconds
/// in `0..1e6` that the kernel's `ADJ_SETOFFSET` wants (the nanoseconds
/// below a microsecond are dropped).
fn split_step(step_ns: i64) -> (i64, i64) {
    let micros = step_ns.div_euclid(1000);
    (
        micros.div_euclid(MICROS_PER_SEC),
        micros.rem_euclid(MICROS_PER_SEC),
    )
}

/// Answers `Request::Clock`: steps the clock by `step_ns` (unless 0), then
/// reads it.
pub fn handle(step_ns: i64) -> Reply {
    if step_ns != 0 {
        let (secs, micros) = split_step(step_ns);
        if let Err(e) = sys::step_realtime(secs, micros) {
            return Reply::Error(OpError::new(
                OpErrorKind::Io,
                format!("step the clock by {step_ns} ns: {e}"),
            ));
        }
    }
    Reply::Clock {
        realtime_ns: realtime_ns(),
    }
}

/// A host older than protocol version 3 sends only its time in the hello:
/// set the clock from it when they differ by more than a second (after a
/// resume from saved memory the guest's clock is as old as the save).
pub fn from_hello(host_ms: u64) {
    let now = realtime_ns() / 1_000_000;
    if now.abs_diff(host_ms) > 1000 {
        match sys::set_realtime_ms(host_ms) {
            Ok(()) => eprintln!(
                "hearth-guest: clock set from the host's hello ({} ms off)",
                now.abs_diff(host_ms)
            ),
            Err(e) => eprintln!("hearth-guest: cannot set the clock: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_split_into_whole_seconds_and_positive_microseconds() {
        assert_eq!(split_step(0), (0, 0));
        assert_eq!(split_step(999), (0, 0));
        assert_eq!(split_step(1_000), (0, 1));
        assert_eq!(split_step(5_100_000_000), (5, 100_000));
        // Back 5.1 s: six seconds back, 0.9 s forward.
        assert_eq!(split_step(-5_100_000_000), (-6, 900_000));
        assert_eq!(split_step(-1_000), (-1, 999_999));
        assert_eq!(split_step(-1_000_000_000), (-1, 0));
        for step in [i64::MIN, i64::MAX, -1, 1, -123_456_789_012] {
            let (s, u) = split_step(step);
            assert!((0..MICROS_PER_SEC).contains(&u), "{step}");
            let back = i128::from(s) * 1_000_000_000 + i128::from(u) * 1000;
            // Within the microsecond dropped, toward the past.
            let lost = i128::from(step) - back;
            assert!((0..1000).contains(&lost), "{step}: {lost}");
        }
    }
}
