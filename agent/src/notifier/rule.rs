//! When a load update is worth a NOTIFY (SPEC §4), as a pure value: the one
//! rule the [`Notifier`](super::Notifier) applies per subscription, public
//! so that `msr-sim` drives its simulated agents with exactly this code.
//!
//! A NOTIFY is worth sending when, since the last one of the subscription:
//!
//! * `load` moved by at least `load-delta` points;
//! * `load` reached 100 or fell below it (both edges: selection excludes a
//!   full MSR);
//! * `calls` fell to 0 (a drain waits for it, SPEC §14);
//! * `calls` changed while `load` is at or above the high-water mark, or
//!   was at the last NOTIFY (so the step back below the mark is reported
//!   too): near the top every call counts, because the collector's estimate
//!   of an MSR's sessions starts from the reported `calls` (SPEC §10).
//!
//! However many of these happen, at most one NOTIFY per `min_interval` per
//! subscription, or per the shorter `top_interval` when the change is near
//! the top (`load` at or above the high-water mark, now or at the last
//! NOTIFY): with several core hosts each one learns the others' placements
//! only from the reports, and near the top a report a second old is what
//! sends calls to an MSR that is in fact full (SPEC §10). A change inside
//! the window is held, and re-evaluated against the latest sample when the
//! window ends ([`NotifyGate`]).
//!
//! Architecture invariant: no clock and no I/O; `now` is always given.

use std::time::Duration;

use tokio::time::Instant;

pub use crate::config::DEFAULT_HIGH_WATER;

/// The thresholds of SPEC §4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotifyRule {
    /// `<general load-delta>`: points of `load` movement worth a NOTIFY
    /// (0 is read as 1: every move).
    pub load_delta: u8,
    /// `<agent notify-high-water>`: at or above this `load`, every change
    /// of `calls` is worth a NOTIFY (101 or more: never).
    pub high_water: u8,
    /// `<agent notify-min-interval-ms>`: the shortest gap between two
    /// NOTIFYs of one subscription.
    pub min_interval: Duration,
    /// `<agent notify-top-interval-ms>`: the shortest gap when the change
    /// is near the top (never longer than `min_interval`).
    pub top_interval: Duration,
}

/// What a NOTIFY reported: the fields the rule compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reported {
    /// `load`, percent.
    pub load: u8,
    /// `calls`.
    pub calls: u32,
}

impl NotifyRule {
    /// Whether `latest` differs enough from `last` (the last NOTIFY's
    /// values, `None` before the first) to be worth a NOTIFY.
    pub fn worth_notifying(&self, last: Option<Reported>, latest: Reported) -> bool {
        let Some(last) = last else {
            return true;
        };
        let delta = last.load.abs_diff(latest.load) >= self.load_delta.max(1);
        let full_edge = (last.load >= 100) != (latest.load >= 100);
        // An MSR that has just emptied is reported whatever its size: a
        // drain waits for the engine's calls to reach 0 (SPEC §14), and a
        // few calls on a large MSR move `load` by less than a point.
        let emptied = last.calls > 0 && latest.calls == 0;
        delta
            || full_edge
            || emptied
            || (self.near_top(Some(last), latest) && last.calls != latest.calls)
    }

    /// Whether `latest`, or the last NOTIFY's `last`, is at or above the
    /// high-water mark.
    fn near_top(&self, last: Option<Reported>, latest: Reported) -> bool {
        latest.load >= self.high_water || last.is_some_and(|l| l.load >= self.high_water)
    }

    /// How long the agent waits between two load samples after one of
    /// `load`: near the top as often as a NOTIFY may leave, so a change
    /// waits no longer for its sample than for its window.
    pub fn sample_interval(&self, sample_interval: Duration, load: u8) -> Duration {
        if load >= self.high_water {
            sample_interval.min(self.top_interval)
        } else {
            sample_interval
        }
    }

    /// The shortest gap after the last NOTIFY (`last`) before one carrying
    /// `latest` may leave.
    pub fn gap(&self, last: Option<Reported>, latest: Reported) -> Duration {
        if self.near_top(last, latest) {
            self.top_interval.min(self.min_interval)
        } else {
            self.min_interval
        }
    }
}

/// What to do with the latest sample on one subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Send a NOTIFY now (then call [`NotifyGate::sent`]).
    Send,
    /// Worth a NOTIFY, but inside the window: evaluate again at this time.
    HoldUntil(Instant),
    /// Nothing worth reporting.
    Nothing,
}

/// The per-subscription state of the rule: the last NOTIFY (when, what)
/// and, when a change waits, the end of its window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NotifyGate {
    last_at: Option<Instant>,
    last: Option<Reported>,
    held: Option<Instant>,
}

impl NotifyGate {
    /// The verdict on `latest` at `now`; remembers a held change.
    pub fn evaluate(&mut self, rule: &NotifyRule, now: Instant, latest: Reported) -> Verdict {
        if !rule.worth_notifying(self.last, latest) {
            self.held = None;
            return Verdict::Nothing;
        }
        // The window's end depends on `latest`: a change that reaches the
        // top may leave sooner than one held before it.
        let end = self.last_at.map(|t| t + rule.gap(self.last, latest));
        match end {
            Some(end) if now < end => {
                self.held = Some(end);
                Verdict::HoldUntil(end)
            }
            _ => Verdict::Send,
        }
    }

    /// Records a NOTIFY carrying `reported` sent at `now` (any NOTIFY:
    /// those answering a SUBSCRIBE open a window too).
    pub fn sent(&mut self, now: Instant, reported: Reported) {
        self.last_at = Some(now);
        self.last = Some(reported);
        self.held = None;
    }

    /// The end of the window when a change is held in it.
    pub fn held_until(&self) -> Option<Instant> {
        self.held
    }

    /// Whether a change is held and its window is over at `now`.
    pub fn due(&self, now: Instant) -> bool {
        self.held.is_some_and(|end| now >= end)
    }
}
