//! Unix times of a [`SystemTime`]: what the wire and the saved files carry.
//! Pure conversions; reading the clock is the caller's.

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
}
