//! Whether a zone is in overload, as this collector's own `pooled`
//! selections show it (SPEC §10: in overload the policy refuses rather
//! than send a leg to an MSR it has good reason to think full).
//!
//! With several core hosts (G > 1) every collector reads the same report
//! of an MSR, and near the top each sends its next leg into the room the
//! report shows: in overload that herding sends a leg in seven onto a full
//! MSR (BALANCING.md, "Overload"). Keeping a few sessions of every MSR
//! free for the other hosts cures it, but kept always it refuses at 90 %
//! offered the calls that had room: near the top of a 90 % load the pool
//! looks, for a report's length, exactly as in overload. What tells the
//! two apart is how long it lasts: at 90 % a refusal is rare and comes in
//! short bursts; in overload a sixth or more of the selections are refused,
//! for as long as the overload lasts.
//!
//! So each zone keeps the outcome of its last [`WINDOW`] `pooled`
//! selections; at [`ENTER`] refusals among them the zone is in overload
//! and `pooled` keeps [`headroom`] sessions of each MSR free, at most one
//! in [`HEADROOM_SHARE`] ([`headroom_of`]; `select`, "Overload"); it
//! leaves at [`LEAVE`] or fewer. The window counts
//! selections, not seconds, so it needs no time constant: a run with its
//! holding times compressed sees the same (BALANCING.md, end to end).
//!
//! Architecture invariant: no clock and no I/O.

use std::collections::HashMap;

/// How many of a zone's latest `pooled` selections are looked at.
pub const WINDOW: u16 = 256;

/// Refusals among the last [`WINDOW`] selections that put a zone in
/// overload: 5 %, a blocking the pooled limit of a pool of a few hundred
/// sessions reaches only past about 105 % offered.
pub const ENTER: u16 = 13;

/// Refusals at or below which a zone leaves overload (2 %): apart from
/// [`ENTER`] so that a zone near the edge does not flap.
pub const LEAVE: u16 = 5;

/// The sessions of each MSR that `pooled` keeps free in overload with
/// `core_hosts` core hosts: half of the other hosts' number, rounded up
/// (none with one host, whose estimate is exact), and at most a share of
/// each MSR ([`headroom_of`]). In msr-sim at 120 % offered it cut the legs
/// sent to full MSRs from 10.5–15 % to 1.7 % (G = 3) and from 15–26 % to
/// 3.7–4.8 % (G = 10; BALANCING.md, "Overload").
pub fn headroom(core_hosts: u32) -> u32 {
    core_hosts.saturating_sub(1).div_ceil(2)
}

/// The sessions an MSR of `max_calls` keeps free of a zone's `headroom`:
/// at most one in [`HEADROOM_SHARE`] of its sessions (none below 40), so
/// that the headroom does not itself hold a zone in overload: a headroom
/// of a tenth of the capacity turned 95 % offered into 105 %, whose
/// refusals kept the zone in overload (msr-sim, G = 10, 10 × 50 sessions:
/// 3.9 × the pooled limit; with "at least one session", 10 × 5 and 10 × 10
/// at 85 % blocked 3.7 × and 1.9 ×).
pub fn headroom_of(headroom: u32, max_calls: u32) -> u32 {
    headroom.min(max_calls / HEADROOM_SHARE)
}

/// One session in this many at most is kept free (2.5 %).
pub const HEADROOM_SHARE: u32 = 40;

/// The overload state of every zone that has had a `pooled` selection.
#[derive(Debug, Default, Clone)]
pub struct OverloadWatch {
    zones: HashMap<Box<str>, Window>,
    /// Changes not yet taken ([`OverloadWatch::take_changes`]).
    changes: Vec<(Box<str>, Change)>,
}

/// One zone's last [`WINDOW`] outcomes, one bit each (1: refused).
#[derive(Debug, Default, Clone)]
struct Window {
    bits: [u128; 2],
    /// Where the next outcome goes.
    next: u16,
    /// Outcomes recorded, up to [`WINDOW`].
    seen: u16,
    refused: u16,
    overloaded: bool,
}

/// A zone's change of state, for the log and the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The zone entered overload.
    Entered,
    /// The zone left it.
    Left,
}

impl OverloadWatch {
    /// The sessions `pooled` keeps free on each MSR of `zone` now.
    pub fn headroom(&self, zone: &str, core_hosts: u32) -> u32 {
        if core_hosts <= 1 {
            return 0;
        }
        match self.zones.get(zone) {
            Some(w) if w.overloaded => headroom(core_hosts),
            _ => 0,
        }
    }

    /// Whether `zone` is in overload.
    pub fn is_overloaded(&self, zone: &str) -> bool {
        self.zones.get(zone).is_some_and(|w| w.overloaded)
    }

    /// The zones in overload.
    pub fn overloaded(&self) -> impl Iterator<Item = &str> {
        self.zones
            .iter()
            .filter(|(_, w)| w.overloaded)
            .map(|(zone, _)| &**zone)
    }

    /// Records a `pooled` selection in `zone`: placed, or `refused`
    /// (`msr_overloaded`). Only zones that have candidates get here, so the
    /// map holds the operator's zones and no name a request made up.
    pub fn record(&mut self, zone: &str, refused: bool) -> Option<Change> {
        let window = match self.zones.get_mut(zone) {
            Some(w) => w,
            None => self.zones.entry(zone.into()).or_default(),
        };
        let change = window.record(refused);
        if let Some(change) = change {
            self.changes.push((zone.into(), change));
        }
        change
    }

    /// Forgets `zone`'s outcomes (one core host: its estimate is exact,
    /// nothing is kept free); a zone in overload leaves it.
    pub fn forget(&mut self, zone: &str) -> Option<Change> {
        let window = self.zones.remove(zone)?;
        if !window.overloaded {
            return None;
        }
        self.changes.push((zone.into(), Change::Left));
        Some(Change::Left)
    }

    /// The changes since the last call, oldest first (for the log).
    pub fn take_changes(&mut self) -> Vec<(Box<str>, Change)> {
        std::mem::take(&mut self.changes)
    }
}

impl Window {
    fn record(&mut self, refused: bool) -> Option<Change> {
        let (word, bit) = (usize::from(self.next / 128), u32::from(self.next % 128));
        let mask = 1_u128 << bit;
        if self.seen == WINDOW && self.bits[word] & mask != 0 {
            self.refused -= 1;
        }
        if refused {
            self.bits[word] |= mask;
            self.refused += 1;
        } else {
            self.bits[word] &= !mask;
        }
        self.next = (self.next + 1) % WINDOW;
        self.seen = (self.seen + 1).min(WINDOW);
        if !self.overloaded && self.refused >= ENTER {
            self.overloaded = true;
            return Some(Change::Entered);
        }
        if self.overloaded && self.refused <= LEAVE {
            self.overloaded = false;
            return Some(Change::Left);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headroom_is_half_a_session_per_other_host_rounded_up() {
        assert_eq!(headroom(0), 0);
        assert_eq!(headroom(1), 0);
        assert_eq!(headroom(2), 1);
        assert_eq!(headroom(3), 1);
        assert_eq!(headroom(10), 5);
    }

    #[test]
    fn an_msr_keeps_at_most_one_session_in_forty() {
        assert_eq!(headroom_of(0, 100), 0);
        assert_eq!(headroom_of(1, 39), 0, "none below 40 sessions");
        assert_eq!(headroom_of(5, 50), 1);
        assert_eq!(headroom_of(5, 100), 2);
        assert_eq!(headroom_of(5, 400), 5);
    }

    #[test]
    fn a_zone_enters_at_five_percent_and_leaves_at_two() {
        let mut w = OverloadWatch::default();
        for _ in 0..300 {
            assert_eq!(w.record("z", false), None);
        }
        // 12 refusals in the window: not yet.
        for _ in 0..12 {
            assert_eq!(w.record("z", true), None);
        }
        assert_eq!(w.headroom("z", 3), 0);
        assert_eq!(w.record("z", true), Some(Change::Entered));
        assert!(w.is_overloaded("z"));
        assert_eq!(w.headroom("z", 3), 1);
        assert_eq!(w.headroom("z", 10), 5);
        assert_eq!(w.headroom("z", 1), 0, "one host's estimate is exact");
        assert_eq!(w.headroom("other", 3), 0);
        // The refusals age out of the window as placements follow: it
        // leaves once 5 or fewer are left.
        let mut left_after = None;
        for i in 0..WINDOW {
            if w.record("z", false) == Some(Change::Left) {
                left_after = Some(i);
                break;
            }
        }
        // 13 refusals, the first 8 of them age out after 256 − 13 + 8
        // placements.
        assert_eq!(left_after, Some(WINDOW - 13 + 8 - 1));
        assert!(!w.is_overloaded("z"));
        assert_eq!(w.overloaded().count(), 0);
    }

    #[test]
    fn a_steady_overload_stays_and_rare_bursts_do_not_enter() {
        let mut w = OverloadWatch::default();
        // One refusal in six (120 % offered): in, and stays.
        let mut entered = 0;
        for i in 0..10_000 {
            if w.record("z", i % 6 == 0) == Some(Change::Entered) {
                entered += 1;
            }
        }
        assert_eq!(entered, 1);
        assert!(w.is_overloaded("z"));
        // Bursts of 10 refusals every 1,000 selections: never in.
        let mut w = OverloadWatch::default();
        for i in 0..100_000 {
            assert_eq!(w.record("z", i % 1000 < 10), None);
        }
    }
}
