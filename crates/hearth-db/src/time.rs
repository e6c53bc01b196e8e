//! Timestamps: stored as unix milliseconds (BIGINT), shown as RFC 3339.
//!
//! The public API returns ISO-8601 strings; the database stores plain
//! integers so that both backends compare and sort them the same way and
//! deadline arithmetic (`stopped_at + delete_after_stop`) stays in SQL.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point in time, in milliseconds since the unix epoch (UTC).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(i64);

impl Timestamp {
    pub const fn from_unix_ms(ms: i64) -> Self {
        Self(ms)
    }

    pub const fn unix_ms(self) -> i64 {
        self.0
    }

    /// The wall clock now. A clock before 1970 reads as the epoch.
    pub fn now() -> Self {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        Self(ms)
    }

    /// This time plus `d`, saturating.
    pub fn plus(self, d: Duration) -> Self {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        Self(self.0.saturating_add(ms))
    }

    /// This time minus `d`, saturating.
    pub fn minus(self, d: Duration) -> Self {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        Self(self.0.saturating_sub(ms))
    }

    /// RFC 3339 in UTC with milliseconds, e.g. `2026-05-13T09:30:00.250Z`.
    pub fn to_rfc3339(self) -> String {
        self.to_string()
    }

    /// An RFC 3339 time with any offset (`2026-05-13T11:30:00.250+02:00`,
    /// `…Z`), to the millisecond (rounded down); None if it is not one.
    pub fn parse_rfc3339(s: &str) -> Option<Self> {
        let t =
            time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
        let ms = t.unix_timestamp_nanos().div_euclid(1_000_000);
        i64::try_from(ms).ok().map(Self)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MS_PER_DAY: i64 = 86_400_000;
        let days = self.0.div_euclid(MS_PER_DAY);
        let ms_of_day = self.0.rem_euclid(MS_PER_DAY);
        let (y, m, d) = civil_from_days(days);
        let secs = ms_of_day / 1000;
        write!(
            f,
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
            secs / 3600,
            secs / 60 % 60,
            secs % 60,
            ms_of_day % 1000
        )
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({self})")
    }
}

/// The proleptic Gregorian date `days` days after 1970-01-01.
///
/// Works in 400-year eras (146097 days each), counting years from March 1
/// so the leap day falls at the end of a year; then shifts back to
/// January-based months.
pub(crate) fn civil_from_days(days: i64) -> (i64, u32, u32) {
    const DAYS_PER_ERA: i64 = 146_097;
    // Day 0 of the shifted calendar is 0000-03-01, 719468 days before the epoch.
    let z = days + 719_468;
    let era = z.div_euclid(DAYS_PER_ERA);
    let day_of_era = z.rem_euclid(DAYS_PER_ERA); // 0..=146096
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365; // 0..=399
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100); // 0..=365
    let shifted_month = (5 * day_of_year + 2) / 153; // 0 = March .. 11 = February
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    // Both are small by construction (1..=31, 1..=12).
    (year, day_as_u32(month), day_as_u32(day))
}

fn day_as_u32(v: i64) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(ms: i64) -> String {
        Timestamp::from_unix_ms(ms).to_rfc3339()
    }

    #[test]
    fn formats_known_instants() {
        assert_eq!(ts(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(ts(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(ts(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(ts(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(ts(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
        assert_eq!(ts(-62_135_596_800_000), "0001-01-01T00:00:00.000Z");
    }

    /// Days since 1970-01-01 counted the slow, obvious way.
    fn naive_days(y: i64, m: u32, d: u32) -> i64 {
        let leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        let year_len = |y: i64| if leap(y) { 366 } else { 365 };
        let mut days = 0i64;
        if y >= 1970 {
            for yy in 1970..y {
                days += year_len(yy);
            }
        } else {
            for yy in y..1970 {
                days -= year_len(yy);
            }
        }
        let month_len = [
            31,
            if leap(y) { 29 } else { 28 },
            31,
            30,
            31,
            30,
            31,
            31,
            30,
            31,
            30,
            31,
        ];
        for len in &month_len[..(m - 1) as usize] {
            days += len;
        }
        days + i64::from(d) - 1
    }

    #[test]
    fn civil_from_days_agrees_with_naive_counting() {
        for y in [
            1, 1600, 1899, 1900, 1969, 1970, 1999, 2000, 2024, 2100, 2400, 9999,
        ] {
            for m in 1..=12u32 {
                for d in [1u32, 15, 28] {
                    assert_eq!(
                        civil_from_days(naive_days(y, m, d)),
                        (y, m, d),
                        "{y}-{m}-{d}"
                    );
                }
            }
        }
        // Every day across a few leap cycles, both sides of the epoch.
        let start = naive_days(1896, 1, 1);
        let mut prev = civil_from_days(start - 1);
        for day in start..naive_days(2105, 1, 1) {
            let cur = civil_from_days(day);
            let next_expected = if cur.2 == 1 {
                assert!(cur.1 == prev.1 % 12 + 1, "month rolls over at {cur:?}");
                true
            } else {
                assert_eq!((cur.0, cur.1, cur.2), (prev.0, prev.1, prev.2 + 1));
                false
            };
            if next_expected && cur.1 == 1 {
                assert_eq!(cur.0, prev.0 + 1);
            }
            prev = cur;
        }
    }

    #[test]
    fn rfc3339_is_read_at_any_offset_to_the_millisecond() {
        let z = Timestamp::parse_rfc3339("2026-05-13T09:30:00.250Z").unwrap();
        assert_eq!(z.to_rfc3339(), "2026-05-13T09:30:00.250Z");
        // Python's isoformat(): microseconds and an offset.
        let p = Timestamp::parse_rfc3339("2026-05-13T11:30:00.250999+02:00").unwrap();
        assert_eq!(p, z);
        for bad in [
            "",
            "yesterday",
            "2026-05-13",
            "2026-05-13T09:30:00",
            "2026-13-01T00:00:00Z",
        ] {
            assert_eq!(Timestamp::parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn arithmetic_saturates() {
        let t = Timestamp::from_unix_ms(1000);
        assert_eq!(t.plus(Duration::from_secs(1)).unix_ms(), 2000);
        assert_eq!(t.minus(Duration::from_millis(500)).unix_ms(), 500);
        assert_eq!(
            Timestamp::from_unix_ms(i64::MAX)
                .plus(Duration::MAX)
                .unix_ms(),
            i64::MAX
        );
    }
}
