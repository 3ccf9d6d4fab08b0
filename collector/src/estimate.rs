//! What changed on one MSR since its last load report, as this collector
//! saw it (SPEC §10): the legs it placed there and the legs on it that
//! ended (released, SPEC §9), each with its time.
//!
//! The `pooled` policy estimates an MSR's sessions as the `calls` of its
//! last report plus G × [`SinceReport::net`] (G core hosts, each assumed to
//! place and release like this one). A report describes the MSR as it was
//! when the agent sent it, one NOTIFY flight before it arrived; the events
//! older than that are already in its `calls` and are dropped
//! ([`SinceReport::report`]), the newer ones are not and stay.
//!
//! One owner: the load table keeps one [`SinceReport`] per MSR beside its
//! report and copies [`SinceReport::net`] into the selection index; nothing
//! else counts placements for the estimate. A leg's expiry (a lost release)
//! is not an end here: the MSR's own report already shows the call gone.
//!
//! Architecture invariant: no clock and no I/O; every time is given.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// The NOTIFY flight time assumed when the config sets none (SPEC §10:
/// a report is compensated for it): a LAN NOTIFY with its retransmission
/// timer unused is well under it.
pub const DEFAULT_NOTIFY_FLIGHT_TIME: Duration = Duration::from_millis(20);

/// The placements and ends on one MSR not yet covered by a report.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SinceReport {
    /// `(when, +1 placed | −1 ended)`, in time order (times never go back:
    /// the caller's `now`).
    events: VecDeque<(Instant, i8)>,
    /// The sum of `events`.
    net: i32,
}

impl SinceReport {
    /// A leg placed on the MSR at `at`.
    pub fn placed(&mut self, at: Instant) {
        self.push(at, 1);
    }

    /// A leg on the MSR ended (released) at `at`.
    pub fn ended(&mut self, at: Instant) {
        self.push(at, -1);
    }

    /// A report arrived at `at` after a flight of `flight`: the events
    /// before `at − flight` are in its `calls`, so they are dropped.
    pub fn report(&mut self, at: Instant, flight: Duration) {
        let covered = at.checked_sub(flight).unwrap_or(at);
        while let Some(&(when, delta)) = self.events.front() {
            if when >= covered {
                break;
            }
            self.net -= i32::from(delta);
            self.events.pop_front();
        }
    }

    /// Legs placed minus legs ended since the last report.
    pub fn net(&self) -> i32 {
        self.net
    }

    fn push(&mut self, at: Instant, delta: i8) {
        // A caller's clock never goes back; should one, the event is kept
        // in order by taking the last time, so `report` stays a prefix cut.
        let at = self.events.back().map_or(at, |&(last, _)| at.max(last));
        self.events.push_back((at, delta));
        self.net += i32::from(delta);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn events_older_than_the_report_minus_its_flight_are_dropped() {
        let t0 = Instant::now();
        let mut s = SinceReport::default();
        s.placed(t0);
        s.placed(t0 + MS(100));
        s.ended(t0 + MS(190));
        s.placed(t0 + MS(195));
        assert_eq!(s.net(), 2);
        // Sent at t0 + 180 ms, arrived 20 ms later: the first two are in it.
        s.report(t0 + MS(200), MS(20));
        assert_eq!(s.net(), 0, "the end and the last placement remain");
        s.report(t0 + MS(300), MS(20));
        assert_eq!(s.net(), 0);
        assert!(s.events.is_empty());
    }

    #[test]
    fn ends_without_placements_since_the_report_make_it_negative() {
        let t0 = Instant::now();
        let mut s = SinceReport::default();
        s.report(t0, MS(20));
        s.ended(t0 + MS(1));
        s.ended(t0 + MS(2));
        assert_eq!(s.net(), -2);
    }
}
