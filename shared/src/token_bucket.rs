//! A token bucket: at most `burst` at once, refilled at `rate` per second.
//! The one rate limit of what strangers may cost (the collector's
//! admission of datagrams, the agent's answers to hosts that may not
//! subscribe). Sans-IO: `now` is always given.

use tokio::time::Instant;

/// A bucket that starts full (module docs).
#[derive(Debug, Clone, Copy)]
pub struct TokenBucket {
    tokens: f64,
    /// When `tokens` was last brought up to date; `None` before the first
    /// take, while the bucket is full.
    at: Option<Instant>,
}

impl TokenBucket {
    /// A full bucket of `burst` tokens.
    pub fn full(burst: f64) -> Self {
        Self {
            tokens: burst,
            at: None,
        }
    }

    /// When a token was last asked for, if ever.
    pub fn last_used(&self) -> Option<Instant> {
        self.at
    }

    /// Refills at `rate` per second up to `burst`, then takes one token if
    /// there is one.
    pub fn take(&mut self, now: Instant, rate: f64, burst: f64) -> bool {
        if let Some(at) = self.at {
            let elapsed = now.saturating_duration_since(at).as_secs_f64();
            self.tokens = (self.tokens + elapsed * rate).min(burst);
        }
        self.at = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_burst_then_the_rate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::full(3.0);
        let taken = (0..10).filter(|_| bucket.take(start, 2.0, 3.0)).count();
        assert_eq!(taken, 3);
        // Two tokens a second: one more after half a second.
        let later = start + Duration::from_millis(500);
        assert!(bucket.take(later, 2.0, 3.0));
        assert!(!bucket.take(later, 2.0, 3.0));
        // Never more than the burst, however long it rested.
        let much_later = later + Duration::from_secs(3600);
        let taken = (0..10)
            .filter(|_| bucket.take(much_later, 2.0, 3.0))
            .count();
        assert_eq!(taken, 3);
    }
}
