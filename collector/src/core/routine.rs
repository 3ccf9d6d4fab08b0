//! Routine subscription refreshes in the log (SPEC §16, "logs an operator
//! can scan"): each one is at DEBUG (every MSR's subscription is refreshed
//! every `expires`/4 s: 67 lines a second with 1,000 MSRs at INFO), and
//! every [`SUMMARY_INTERVAL`] one INFO line says how many there were and
//! for how many MSRs, so the log still shows that they go on.

use std::collections::HashSet;
use std::time::Duration;

use tokio::time::Instant;

use crate::operator::names::MsrName;

/// How often the refreshes are summed up in one line.
pub const SUMMARY_INTERVAL: Duration = Duration::from_secs(600);

/// One summary line's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefreshSummary {
    /// Refreshes since the last line.
    pub refreshes: u64,
    /// Distinct MSRs they were for.
    pub msrs: usize,
    /// The window they were counted over, seconds.
    pub window_secs: u64,
}

/// Counts refreshes between two summary lines (sans-IO: `now` is given).
#[derive(Debug, Default)]
pub struct RefreshCounter {
    /// When the current window started (its first refresh).
    since: Option<Instant>,
    refreshes: u64,
    msrs: HashSet<MsrName>,
}

impl RefreshCounter {
    /// A refresh of `msr`'s subscription at `now`.
    pub fn note(&mut self, now: Instant, msr: &MsrName) {
        self.since.get_or_insert(now);
        self.refreshes += 1;
        if !self.msrs.contains(msr) {
            self.msrs.insert(msr.clone());
        }
    }

    /// When the current window's line is due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.since.map(|since| since + SUMMARY_INTERVAL)
    }

    /// The line due at `now`, if any; the next window starts with the next
    /// refresh.
    pub fn poll(&mut self, now: Instant) -> Option<RefreshSummary> {
        let since = self.since?;
        if now < since + SUMMARY_INTERVAL {
            return None;
        }
        let summary = RefreshSummary {
            refreshes: self.refreshes,
            msrs: self.msrs.len(),
            window_secs: now.saturating_duration_since(since).as_secs(),
        };
        *self = RefreshCounter::default();
        Some(summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_counts_refreshes_and_msrs() {
        let t0 = Instant::now();
        let mut c = RefreshCounter::default();
        assert_eq!(c.poll_timeout(), None);
        let (a, b) = (MsrName::test("msr_a"), MsrName::test("msr_b"));
        c.note(t0, &a);
        c.note(t0 + Duration::from_secs(15), &a);
        c.note(t0 + Duration::from_secs(20), &b);
        assert_eq!(c.poll_timeout(), Some(t0 + SUMMARY_INTERVAL));
        assert_eq!(c.poll(t0 + Duration::from_secs(599)), None);
        assert_eq!(
            c.poll(t0 + SUMMARY_INTERVAL),
            Some(RefreshSummary {
                refreshes: 3,
                msrs: 2,
                window_secs: 600
            })
        );
        // Nothing since: no line, no wake-up.
        assert_eq!(c.poll_timeout(), None);
        assert_eq!(c.poll(t0 + 2 * SUMMARY_INTERVAL), None);
    }
}
