//! Capped exponential backoff (RFC 6665 §4.1.2.4 leaves the retry policy to
//! the subscriber; RFC 3261 §10.2 to the registering UA). Pure: the caller
//! supplies the clock and schedules the retry.

use std::time::Duration;

/// Capped exponential backoff: `base × 2^(failures−1)`, at most `cap`.
///
/// Shape: `next_delay()` after the 1st failure returns `base`, then `2×base`,
/// `4×base` … up to `cap`; `reset()` after a success starts over.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    failures: u32,
}

impl Backoff {
    /// A backoff starting at `base` and never exceeding `cap`.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap: cap.max(base),
            failures: 0,
        }
    }

    /// Records one more failure and returns how long to wait before retrying.
    pub fn next_delay(&mut self) -> Duration {
        let shift = self.failures.min(20);
        self.failures = self.failures.saturating_add(1);
        self.base.saturating_mul(1u32 << shift).min(self.cap)
    }

    /// Number of consecutive failures recorded since the last [`reset`](Self::reset).
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Forgets past failures (call after a success).
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_then_caps_then_resets() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));
        let d: Vec<u64> = (0..5).map(|_| b.next_delay().as_secs()).collect();
        assert_eq!(d, vec![1, 2, 4, 5, 5]);
        assert_eq!(b.failures(), 5);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_secs(1));
    }

    #[test]
    fn many_failures_do_not_overflow() {
        let mut b = Backoff::new(Duration::from_millis(500), Duration::from_secs(60));
        for _ in 0..1000 {
            assert!(b.next_delay() <= Duration::from_secs(60));
        }
    }
}
