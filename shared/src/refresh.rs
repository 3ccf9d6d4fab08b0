//! When a registration (RFC 3261 §10.2.4) or a subscription (RFC 6665
//! §4.1.2.1) granted for `E` seconds is refreshed: one rule for the agent's
//! REGISTER and the collector's SUBSCRIBE.
//!
//! A refresh is a non-INVITE transaction: over UDP its copies go at 0, 0.5,
//! 1.5, 3.5, 7.5 … s and it gives up at Timer F (64 × T1 = 32 s, RFC 3261
//! §17.1.2.2) with a local `408`, after which the caller retries. For that
//! retry to go out (and be retransmitted a few times) before the grant
//! lapses, the refresh is sent [`REFRESH_LEAD`] = Timer F + [`RETRY_SLACK`]
//! before expiry, which the default 60 s subscription allows. Where `E` is
//! shorter, the refresh goes at a quarter of `E` (at most four refreshes
//! per grant, the lead then three quarters of `E`), and never sooner than
//! 1 s after the grant.
//!
//! | `E`    | refresh after | before expiry |
//! |--------|---------------|---------------|
//! | 3600 s | 3555 s        | 45 s          |
//! | 120 s  | 75 s          | 45 s          |
//! | 60 s   | 15 s          | 45 s          |
//! | 30 s   | 7.5 s         | 22.5 s        |
//! | 2 s    | 1 s           | 1 s           |

use std::time::Duration;

/// RFC 3261 Timer F (64 × T1, T1 = 500 ms): when a non-INVITE client
/// transaction gives up.
pub const TIMER_F: Duration = Duration::from_secs(32);
/// Time left after a refresh's Timer F for the retry (1 s of backoff, then
/// its copies at 0, 0.5, 1.5, 3.5, 7.5 and 11.5 s) before the grant lapses.
pub const RETRY_SLACK: Duration = Duration::from_secs(13);
/// How long before expiry a refresh is sent when `E` allows it.
pub const REFRESH_LEAD: Duration = Duration::from_secs(TIMER_F.as_secs() + RETRY_SLACK.as_secs());
/// The earliest a refresh is sent after the grant.
pub const MIN_REFRESH_DELAY: Duration = Duration::from_secs(1);

/// How long after a grant of `expires` seconds the refresh is sent:
/// `max(E − REFRESH_LEAD, E / 4, 1 s)` (module doc).
pub fn refresh_delay(expires: u32) -> Duration {
    let e = Duration::from_secs(u64::from(expires));
    e.saturating_sub(REFRESH_LEAD)
        .max(e / 4)
        .max(MIN_REFRESH_DELAY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_of_the_module_doc() {
        let secs = Duration::from_secs;
        assert_eq!(refresh_delay(3600), secs(3555));
        assert_eq!(refresh_delay(120), secs(75));
        assert_eq!(refresh_delay(60), secs(15));
        assert_eq!(refresh_delay(30), Duration::from_millis(7_500));
        assert_eq!(refresh_delay(2), secs(1));
        assert_eq!(refresh_delay(0), secs(1));
    }

    /// Where `E` allows it, a refresh that times out (Timer F) is retried
    /// and the retry's own copies go before expiry (from `E` = 60 s on);
    /// every refresh goes before expiry.
    #[test]
    fn a_refresh_that_times_out_is_retried_before_expiry() {
        for e in 1..=7200u32 {
            let expiry = Duration::from_secs(u64::from(e));
            let refresh = refresh_delay(e);
            assert!(refresh < expiry || e <= 1, "E = {e}");
            if e >= 60 {
                assert!(refresh + TIMER_F + RETRY_SLACK <= expiry, "E = {e}");
            }
        }
    }
}
