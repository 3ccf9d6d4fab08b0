//! What this collector knows of one MSR's sessions between its load
//! reports (SPEC §10): its own live legs there, exactly, and the legs it
//! placed there and the legs of it that ended (released, SPEC §9) since
//! the last report's sample, each with its time.
//!
//! # The model
//!
//! An MSR's sessions are this collector's own live legs on it plus the
//! other core hosts' (G − 1 of them, SPEC §10). This collector knows its
//! own part exactly at every moment: it placed and released every one of
//! its legs (SPEC §9). It learns the others' part only from a report: a
//! report's `calls` is the MSR at its sample time `s`, one NOTIFY flight
//! before it arrived, so the others had `calls − own(s)` then (never
//! below 0: the NOTIFY can be older than the flight assumes). Since `s`
//! the other hosts are assumed to have placed and released like this one
//! (the same share of the arrivals, the same holding times), so
//!
//! ```text
//! estimate(now) = own(now) + max(0, calls − own(s)) + (G − 1) × (own(now) − own(s))
//! ```
//!
//! With G = 1 that is `own(now)` whenever the report is exact: no error
//! between reports at all. It is never below `own(now)`: an MSR on which
//! this collector released legs since a report of 100 % is estimated below
//! capacity again.
//!
//! Which events a report covers: the agent sends a NOTIFY on the change
//! that triggers it (SPEC §4), so the placement or end at exactly `s` is
//! in its `calls`. [`SinceReport::report`] therefore drops every event at
//! or before `s`, its trigger included, and keeps only the later ones.
//!
//! An expired leg (a lost release, SPEC §9) is not an end since the last
//! report (the MSR's own reports stopped counting the call long ago): it
//! leaves `own` and records no event ([`SinceReport::expired`]).
//!
//! # Placements without a leg
//!
//! A selection that names no call (the `ecss` fallback, SPEC §10) binds no
//! leg, so its end is never known. It is still a session the MSR is about
//! to take, and near the top that is what sends the next legs of every
//! host onto an MSR that just filled. Such a placement counts until a
//! report's sample covers it or [`UNFOLLOWED_HORIZON`] has passed
//! ([`SinceReport::unfollowed`]), and the other hosts are assumed to have
//! placed as many meanwhile:
//!
//! ```text
//! estimate(now) = … + G × unfollowed
//! ```
//!
//! The load table notes them only for an MSR whose last report is near
//! its top, where the agent reports every change of `calls` within its
//! top interval (SPEC §4), so a report clears them long before the
//! horizon; the horizon only bounds one that never became a call.
//!
//! One owner: the load table keeps one [`SinceReport`] per MSR beside its
//! report and copies its [`Estimate`] into the selection index; nothing
//! else counts placements for the estimate.
//!
//! Architecture invariant: no clock and no I/O; every time is given.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// The NOTIFY flight time assumed when the config sets none (SPEC §10:
/// a report is compensated for it): a LAN NOTIFY with its retransmission
/// timer unused is well under it.
pub const DEFAULT_NOTIFY_FLIGHT_TIME: Duration = Duration::from_millis(20);

/// How long a placement without a leg counts when no report covers it
/// (module docs): the agent's minimum NOTIFY gap (SPEC §4), within which
/// an MSR near its top reports every change of `calls`.
pub const UNFOLLOWED_HORIZON: Duration = Duration::from_secs(1);

/// The parts of an MSR's estimate that do not depend on G (module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Estimate {
    /// This collector's live legs on the MSR now, `own(now)`.
    pub own: i32,
    /// The other hosts' sessions at the last report's sample,
    /// `max(0, calls − own(s))`; 0 before a report.
    pub others: i32,
    /// `own(now) − own(s)`: this collector's placements minus ends since
    /// that sample.
    pub net: i32,
    /// Placements without a leg since that sample, within
    /// [`UNFOLLOWED_HORIZON`] (module docs).
    pub unfollowed: i32,
}

impl Estimate {
    /// The estimated sessions with `core_hosts` core hosts (G, at least 1),
    /// never below this collector's own live legs.
    pub fn sessions(&self, core_hosts: u32) -> f64 {
        let g = core_hosts.max(1);
        let others_since = f64::from(g - 1) * f64::from(self.net);
        let unfollowed = f64::from(g) * f64::from(self.unfollowed);
        let estimate = f64::from(self.own) + f64::from(self.others) + others_since + unfollowed;
        estimate.max(f64::from(self.own)).max(0.0)
    }
}

/// This collector's legs on one MSR and the events not yet in a report.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SinceReport {
    /// `(when, +1 placed | −1 ended)`, in time order (times never go back:
    /// the caller's `now`), all after the last report's sample.
    events: VecDeque<(Instant, i8)>,
    /// The sum of `events`.
    net: i32,
    /// This collector's live legs on the MSR.
    own: i32,
    /// The other hosts' sessions at the last report's sample.
    others: i32,
    /// When each placement without a leg since that sample was made, in
    /// time order (module docs).
    unfollowed: VecDeque<Instant>,
}

impl SinceReport {
    /// A leg placed on the MSR at `at`.
    pub fn placed(&mut self, at: Instant) {
        self.own = self.own.saturating_add(1);
        self.push(at, 1);
    }

    /// A leg on the MSR ended (released) at `at`. An end with no live leg
    /// counted (the MSR's entry was rebuilt meanwhile) changes nothing: no
    /// count goes below zero (SPEC §9).
    pub fn ended(&mut self, at: Instant) {
        if self.own > 0 {
            self.own -= 1;
            self.push(at, -1);
        }
    }

    /// A leg of this collector on the MSR expired (a lost release, SPEC
    /// §9): it leaves `own`, and no event is recorded, since the MSR's
    /// reports have not counted it for long (module docs).
    pub fn expired(&mut self) {
        self.own = (self.own - 1).max(0);
    }

    /// A selection without a leg sent a session to the MSR at `at`
    /// (module docs).
    pub fn unfollowed(&mut self, at: Instant) {
        let at = self.unfollowed.back().map_or(at, |&last| at.max(last));
        self.unfollowed.push_back(at);
    }

    /// Forgets the placements without a leg made at or before `cutoff`;
    /// how many were forgotten.
    pub fn forget_unfollowed(&mut self, cutoff: Instant) -> usize {
        let before = self.unfollowed.len();
        while self.unfollowed.front().is_some_and(|&at| at <= cutoff) {
            self.unfollowed.pop_front();
        }
        before - self.unfollowed.len()
    }

    /// A report of `calls` arrived at `at` after a flight of `flight`: the
    /// events up to and including its sample time `at − flight` (its
    /// trigger among them) are in its `calls`, so they are dropped.
    pub fn report(&mut self, at: Instant, flight: Duration, calls: u32) {
        let sample = at.checked_sub(flight).unwrap_or(at);
        self.forget_unfollowed(sample);
        while let Some(&(when, delta)) = self.events.front() {
            if when > sample {
                break;
            }
            self.net -= i32::from(delta);
            self.events.pop_front();
        }
        let own_at_sample = self.own - self.net;
        let calls = i32::try_from(calls).unwrap_or(i32::MAX);
        self.others = calls.saturating_sub(own_at_sample).max(0);
    }

    /// Legs placed minus legs ended since the last report's sample.
    pub fn net(&self) -> i32 {
        self.net
    }

    /// What the estimate reads (module docs).
    pub fn estimate(&self) -> Estimate {
        Estimate {
            own: self.own,
            others: self.others,
            net: self.net,
            unfollowed: i32::try_from(self.unfollowed.len()).unwrap_or(i32::MAX),
        }
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

    /// A placement without a leg counts G times until a report's sample
    /// covers it or the horizon passes (module docs).
    #[test]
    fn a_placement_without_a_leg_counts_until_a_report_or_the_horizon() {
        let t0 = Instant::now();
        let mut s = SinceReport::default();
        s.report(t0, MS(20), 90);
        s.unfollowed(t0 + MS(10));
        s.unfollowed(t0 + MS(50));
        assert_eq!(s.estimate().unfollowed, 2);
        assert_eq!(s.estimate().sessions(1), 92.0);
        assert_eq!(s.estimate().sessions(3), 96.0);
        // Sampled at t0 + 30 ms: the first is in its 91.
        s.report(t0 + MS(50), MS(20), 91);
        assert_eq!(s.estimate().sessions(3), 94.0);
        // The second never showed in a report: gone after the horizon.
        assert_eq!(s.forget_unfollowed(t0 + MS(49)), 0);
        assert_eq!(s.forget_unfollowed(t0 + MS(50)), 1);
        assert_eq!(s.estimate().sessions(3), 91.0);
        assert_eq!(s.net(), 0, "no leg, no event");
    }

    #[test]
    fn events_up_to_the_report_sample_are_dropped() {
        let t0 = Instant::now();
        let mut s = SinceReport::default();
        s.placed(t0);
        s.placed(t0 + MS(100));
        s.ended(t0 + MS(190));
        s.placed(t0 + MS(195));
        assert_eq!(s.net(), 2);
        // Sent at t0 + 180 ms, arrived 20 ms later: the first two are in it.
        s.report(t0 + MS(200), MS(20), 2);
        assert_eq!(s.net(), 0, "the end and the last placement remain");
        assert_eq!(s.estimate().sessions(1), 2.0);
        s.report(t0 + MS(300), MS(20), 2);
        assert_eq!(s.net(), 0);
        assert!(s.events.is_empty());
    }

    /// Defect (a) of issue 24: the placement that triggers a NOTIFY is in
    /// that NOTIFY's `calls` and must not be counted again.
    #[test]
    fn the_trigger_of_a_report_is_counted_once() {
        let t0 = Instant::now();
        let mut s = SinceReport::default();
        // Sample at t0 + 100 ms, the instant of the second placement.
        s.placed(t0);
        s.placed(t0 + MS(100));
        s.report(t0 + MS(120), MS(20), 2);
        assert_eq!(s.net(), 0);
        assert_eq!(s.estimate().sessions(1), 2.0);
        assert_eq!(s.estimate().sessions(3), 2.0);
    }

    #[test]
    fn others_come_from_the_report_and_own_is_exact() {
        let t0 = Instant::now();
        let mut s = SinceReport::default();
        for i in 0..10 {
            s.placed(t0 + MS(i));
        }
        // 30 sessions at the sample: 20 are the other hosts'.
        s.report(t0 + MS(40), MS(20), 30);
        assert_eq!(s.estimate().others, 20);
        s.placed(t0 + MS(50));
        s.ended(t0 + MS(51));
        s.ended(t0 + MS(52));
        // Own 9, others 20 + (G − 1) × (−1).
        assert_eq!(s.estimate().sessions(1), 29.0);
        assert_eq!(s.estimate().sessions(3), 27.0);
    }

    #[test]
    fn an_expired_leg_leaves_own_and_is_no_end_since_the_report() {
        let t0 = Instant::now();
        let mut s = SinceReport::default();
        for i in 0..3 {
            s.placed(t0 + MS(i));
        }
        // The MSR reports 2: one of the three legs' calls is long gone.
        s.report(t0 + MS(100), MS(20), 2);
        s.expired();
        assert_eq!(s.estimate().own, 2);
        assert_eq!(s.estimate().net, 0);
        assert_eq!(s.estimate().sessions(1), 2.0);
    }

    #[test]
    fn a_full_report_and_later_releases_leave_room() {
        let t0 = Instant::now();
        let mut s = SinceReport::default();
        for i in 0..100 {
            s.placed(t0 + MS(i));
        }
        s.report(t0 + MS(200), MS(20), 100);
        s.ended(t0 + MS(300));
        assert_eq!(s.estimate().sessions(1), 99.0);
        // The other hosts had none at the sample: their part can't go
        // below zero, so the estimate is this collector's own 99.
        assert_eq!(s.estimate().sessions(3), 99.0);
    }

    #[test]
    fn ends_never_take_the_estimate_below_own_or_zero() {
        let t0 = Instant::now();
        let mut s = SinceReport::default();
        s.report(t0, MS(20), 0);
        s.ended(t0 + MS(1));
        assert_eq!(s.net(), 0, "an end with no own leg changes nothing");
        s.placed(t0 + MS(2));
        s.report(t0 + MS(30), MS(20), 0);
        assert_eq!(s.estimate().others, 0);
        assert_eq!(s.estimate().sessions(3), 1.0);
    }
}
