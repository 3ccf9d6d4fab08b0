//! When a load update is worth a NOTIFY (SPEC §4), as a pure value: the one
//! rule the [`Notifier`](super::Notifier) applies per subscription, public
//! so that `msr-sim` drives its simulated agents with exactly this code.
//!
//! A NOTIFY is worth sending when, since the last one of the subscription:
//!
//! * `load` moved by at least `load-delta` points;
//! * `load` reached 100 or fell below it (both edges: selection excludes a
//!   full MSR);
//! * `calls` changed while `load` is at or above the high-water mark, or
//!   was at the last NOTIFY (so the step back below the mark is reported
//!   too): near the top every call counts, because the collector's estimate
//!   of an MSR's sessions starts from the reported `calls` (SPEC §10).
//!
//! However many of these happen, at most one NOTIFY per `min_interval` per
//! subscription: a change inside the window is held, and re-evaluated
//! against the latest sample when the window ends ([`NotifyGate`]).
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
        let near_top = latest.load >= self.high_water || last.load >= self.high_water;
        delta || full_edge || (near_top && last.calls != latest.calls)
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
/// and whether a change waits for the end of the window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NotifyGate {
    last_at: Option<Instant>,
    last: Option<Reported>,
    pending: bool,
}

impl NotifyGate {
    /// The verdict on `latest` at `now`; remembers a held change.
    pub fn evaluate(&mut self, rule: &NotifyRule, now: Instant, latest: Reported) -> Verdict {
        if !rule.worth_notifying(self.last, latest) {
            self.pending = false;
            return Verdict::Nothing;
        }
        match self.window_end(rule) {
            Some(end) if now < end => {
                self.pending = true;
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
        self.pending = false;
    }

    /// When the current window ends (`None` before the first NOTIFY).
    pub fn window_end(&self, rule: &NotifyRule) -> Option<Instant> {
        self.last_at.map(|t| t + rule.min_interval)
    }

    /// The end of the window when a change is held in it.
    pub fn held_until(&self, rule: &NotifyRule) -> Option<Instant> {
        if self.pending {
            self.window_end(rule)
        } else {
            None
        }
    }

    /// Whether a change is held and its window is over at `now`.
    pub fn due(&self, rule: &NotifyRule, now: Instant) -> bool {
        self.pending && self.window_end(rule).is_none_or(|w| now >= w)
    }
}
