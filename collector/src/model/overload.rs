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
//! in [`HEADROOM_SHARE`] ([`Headroom::of`]; `select`, "Overload"); it
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
/// each MSR ([`Headroom::of`]). In msr-sim at 120 % offered it cut the legs
/// sent to full MSRs from 10.5–15 % to 1.7 % (G = 3) and from 15–26 % to
/// 3.7–4.8 % (G = 10; BALANCING.md, "Overload").
pub fn headroom(core_hosts: u32) -> u32 {
    core_hosts.saturating_sub(1).div_ceil(2)
}

/// What `pooled` keeps free on each MSR of a zone for one selection: the
/// zone's [`headroom`] in sessions (0 outside overload) and the
/// selection's own draw, which decides for each MSR of fewer than
/// [`HEADROOM_SHARE`] sessions whether it keeps one ([`Headroom::of`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Headroom {
    /// Sessions kept free on an MSR large enough: [`headroom`] of G in
    /// overload, else 0.
    pub sessions: u32,
    /// One uniform draw per selection (0 when `sessions` is 0).
    pub draw: u64,
}

impl Headroom {
    /// Nothing kept free: no overload, or one core host.
    pub const NONE: Headroom = Headroom {
        sessions: 0,
        draw: 0,
    };

    /// The zone's `sessions` for a selection that drew `draw`.
    pub fn drawn(sessions: u32, draw: u64) -> Headroom {
        Headroom {
            sessions,
            draw: if sessions > 0 { draw } else { 0 },
        }
    }

    /// Whether anything is kept free (the zone is in overload).
    pub fn keeps(self) -> bool {
        self.sessions > 0
    }

    /// The sessions the MSR at `position` of the zone, of `max_calls`,
    /// keeps free: at most one in [`HEADROOM_SHARE`] of its sessions, so
    /// that the headroom does not itself hold a zone in overload (a
    /// headroom of a tenth of the capacity turned 95 % offered into 105 %,
    /// whose refusals kept the zone in overload: msr-sim, G = 10, 10 × 50
    /// sessions, 3.9 × the pooled limit). An MSR of fewer sessions keeps
    /// one with the probability `max_calls` / [`HEADROOM_SHARE`], so one
    /// in 40 on average: kept always, one session of a small MSR is a
    /// large share of it (10 × 20 sessions, G = 3: blocking +15 % at 120 %
    /// offered; 10 × 5 at 85 %: 3.7 × the pooled limit), kept never,
    /// three collectors herd onto the room every report of it shows (6.5 %
    /// of selections sent to full MSRs at 120 %; with the draw 3.5 %, for
    /// 3 % more blocking; BALANCING.md, "Small MSRs in overload"). The
    /// draw is the selection's, mixed with `position`: one selection reads
    /// an MSR alike however often it looks, and the MSRs independently.
    pub fn of(self, max_calls: u32, position: usize) -> u32 {
        let whole = max_calls / HEADROOM_SHARE;
        if whole >= 1 || self.sessions == 0 {
            return self.sessions.min(whole);
        }
        let position = u64::try_from(position).unwrap_or(u64::MAX);
        let mixed = mix(self.draw ^ position.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        u32::from(mixed % u64::from(HEADROOM_SHARE) < u64::from(max_calls))
    }
}

/// splitmix64's finalizer: spreads a draw and a position over all bits.
fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// One session in this many at most is kept free (2.5 %), on average for
/// an MSR of fewer sessions ([`Headroom::of`]).
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
        let h = |sessions| Headroom::drawn(sessions, 7);
        assert_eq!(Headroom::NONE.of(100, 0), 0);
        assert_eq!(Headroom::NONE.of(20, 0), 0);
        assert_eq!(h(5).of(50, 0), 1);
        assert_eq!(h(5).of(100, 0), 2);
        assert_eq!(h(5).of(400, 0), 5);
        assert_eq!(h(1).of(400, 0), 1);
        assert!(!Headroom::drawn(0, 7).keeps());
        assert_eq!(Headroom::drawn(0, 7), Headroom::NONE);
    }

    #[test]
    fn a_small_msr_keeps_one_session_in_forty_on_average() {
        // Draws as a selection makes them: one per selection, each MSR
        // (its position) read alike within it.
        let mut draw = 0x1234_5678_u64;
        let mut kept = [0_u32; 4];
        let sizes = [1, 10, 20, 39];
        let selections = 40_000;
        for _ in 0..selections {
            draw = mix(draw.wrapping_add(1));
            let h = Headroom::drawn(1, draw);
            for (i, &size) in sizes.iter().enumerate() {
                let once = h.of(size, i);
                assert_eq!(once, h.of(size, i), "one selection reads alike");
                kept[i] += once;
            }
        }
        for (i, &size) in sizes.iter().enumerate() {
            let expected = f64::from(selections) * f64::from(size) / 40.0;
            let seen = f64::from(kept[i]);
            // Four standard deviations of the binomial count.
            let sd = (expected * (1.0 - f64::from(size) / 40.0)).sqrt();
            assert!(
                (seen - expected).abs() <= 4.0 * sd + 1.0,
                "{size} sessions kept one {seen} times of {selections}, expected {expected}"
            );
        }
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
