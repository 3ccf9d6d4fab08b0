//! Unix times of a [`SystemTime`]: what the wire and the saved files carry;
//! and [`UtcDateTime`], how people are shown them. Pure conversions;
//! reading the clock is the caller's.

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch (negative before it).
pub fn unix_secs(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// Milliseconds since the Unix epoch (negative before it).
pub fn unix_millis(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

/// A Unix time as a UTC calendar date and time of day (proleptic
/// Gregorian calendar), for people: the tables of msrctl and the texts of
/// errors show times this way, never as raw Unix seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtcDateTime {
    /// The year (e.g. 2026).
    pub year: i64,
    /// The month, 1 to 12.
    pub month: i64,
    /// The day of the month, 1 to 31.
    pub day: i64,
    /// The hour, 0 to 23.
    pub hour: i64,
    /// The minute, 0 to 59.
    pub minute: i64,
    /// The second, 0 to 59.
    pub second: i64,
}

impl UtcDateTime {
    /// The UTC date and time of `unix` seconds since the epoch.
    pub fn from_unix(unix: i64) -> Self {
        let days = unix.div_euclid(86_400);
        let secs = unix.rem_euclid(86_400);
        // Civil-from-days (H. Hinnant), proleptic Gregorian calendar.
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        UtcDateTime {
            year: yoe + era * 400 + i64::from(month <= 2),
            month,
            day,
            hour: secs / 3600,
            minute: secs % 3600 / 60,
            second: secs % 60,
        }
    }
}

/// RFC 3339 in UTC, e.g. `2026-12-06T04:01:20Z`.
impl std::fmt::Display for UtcDateTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn times_before_and_after_the_epoch() {
        let after = UNIX_EPOCH + Duration::from_millis(1_500);
        let before = UNIX_EPOCH - Duration::from_millis(1_500);
        assert_eq!((unix_secs(after), unix_millis(after)), (1, 1_500));
        assert_eq!((unix_secs(before), unix_millis(before)), (-1, -1_500));
    }

    #[test]
    fn unix_times_read_as_utc_dates() {
        assert_eq!(
            UtcDateTime::from_unix(0).to_string(),
            "1970-01-01T00:00:00Z"
        );
        assert_eq!(
            UtcDateTime::from_unix(1_557_875_794).to_string(),
            "2019-05-14T23:16:34Z"
        );
        // A leap day, and a time before the epoch.
        assert_eq!(
            UtcDateTime::from_unix(951_782_400).to_string(),
            "2000-02-29T00:00:00Z"
        );
        assert_eq!(
            UtcDateTime::from_unix(-1).to_string(),
            "1969-12-31T23:59:59Z"
        );
    }
}
