//! Read-only selections off the core's thread (SPEC §7, §11): a copy of
//! what a selection without a leg reads — the load table (the selection
//! index), the topology and the `[selection]` settings — which the loop
//! publishes, so a front end answers such a `select` on its own thread
//! without a round trip through the loop.
//!
//! A selection answered here changes nothing: it names no leg (no
//! `call_id`), so it binds none, and its policy is the `ecss` draw
//! ([`super::admin::effective_policy`] without a leg). Under `pooled`
//! that draw counts the session it sends to an MSR near its top
//! ([`select::Policy::EcssUnfollowed`]): such a choice the copy leaves to
//! the core (which draws again, from the same state but for what the copy
//! lags). Far from the top nothing is counted and the copy answers; its
//! placements there go unrecorded in the zone's overload window, which so
//! sees near-top placements and refusals only: it errs towards overload
//! while front ends draw leg-less legs below the top, which only ever
//! keeps the headroom. Anything
//! else — a leg, a failover, an offer's codecs, `explain`, a fixed draw, a
//! name the rules refuse — and every refusal is asked of the core, which
//! stays the one owner of the state and the one place refusals are
//! counted, logged and worded.
//!
//! Freshness ([`Pacer`], [`Published`]): while front ends read copies, the
//! loop publishes a new one when it has handled input, at most every
//! `max(MIN_INTERVAL, COST_FACTOR × the last copy's cost)`, so copying
//! costs the loop at most one part in `COST_FACTOR` of its time (a copy
//! of 1,000 MSRs takes about 0.3 ms: one every 6.6 ms); at once after an
//! operator change (here, or another collector's through etcd), and
//! before the answer to any request that shows state (the lists): what an
//! operator saw or changed, the next read-only selection sees. Loads come from reports a second old or more
//! (SPEC §4), so a copy some milliseconds old draws as the core would.
//! While nobody reads, no copy is made and the last is marked behind, so
//! the next reader asks the core (and so asks for copies again).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use msr_shared::admin::{Request, SelectQuery, Selection};
use rand::Rng;
use tokio::time::Instant;

use super::admin::{effective_policy, leg_place, selection_of};
use crate::config::SelectionConfig;
use crate::model::load_table::LoadTable;
use crate::model::overload::OverloadWatch;
use crate::operator::topology::Topology;
use crate::select::{self, Admission, Query};

/// The shortest time between two copies.
pub const MIN_INTERVAL: Duration = Duration::from_millis(2);

/// Copies are spaced by this many times what the last one cost.
pub const COST_FACTOR: u32 = 20;

/// What a selection without a leg reads, as the core had it when it was
/// copied (module docs).
#[derive(Debug, Clone)]
pub struct Snapshot {
    table: LoadTable,
    topology: Topology,
    selection: SelectionConfig,
    /// G, and which zones are in overload (SPEC §10).
    core_hosts: u32,
    overload: OverloadWatch,
    /// When the core last released a leg: whether the estimate may count
    /// this collector's legs ([`effective_policy`]).
    last_release: Option<Instant>,
}

impl Snapshot {
    pub(super) fn new(
        table: LoadTable,
        topology: Topology,
        selection: SelectionConfig,
        (core_hosts, overload, last_release): (u32, OverloadWatch, Option<Instant>),
    ) -> Self {
        Self {
            table,
            topology,
            selection,
            core_hosts,
            overload,
            last_release,
        }
    }

    /// The answer to `request` at `now` when it is read-only and an MSR is
    /// chosen; `None` when the core must answer it (module docs).
    pub fn select<R: Rng + ?Sized>(
        &self,
        request: &SelectQuery,
        now: Instant,
        rng: &mut R,
    ) -> Option<Selection> {
        if !read_only(request) {
            return None;
        }
        let SelectQuery {
            zone, site, msr, ..
        } = request;
        // The core's defaults and name rules: a name they refuse gets the
        // core's error.
        let (zone, site) =
            leg_place(&self.table, zone.clone(), site.clone(), msr.as_deref()).ok()?;
        let policy = effective_policy(
            &self.selection,
            false,
            self.last_release,
            now,
            self.core_hosts,
        )
        .in_zone(&zone, &self.overload, rng);
        let query = Query {
            zone,
            site,
            msr: msr.clone(),
            admission: Admission::Plain,
            policy,
            now,
            failed: Vec::new(),
            needs: msr_shared::media::CodecSet::EMPTY,
        };
        let choice = select::select(&self.table, &self.topology, &query, rng).ok()?;
        // A choice the core would count is the core's (module docs).
        if matches!(policy, select::Policy::EcssUnfollowed { .. })
            && self.table.is_near_top(&choice.msr)
        {
            return None;
        }
        Some(selection_of(choice, None, None))
    }
}

/// Whether `request` is a selection a copy may answer: it names no leg and
/// asks for nothing but the draw (module docs). Only such a selection asks
/// the loop for copies ([`Published::current`]): one the core answers
/// anyway must not have the loop copy for nobody.
pub fn read_only(request: &SelectQuery) -> bool {
    let SelectQuery {
        zone: _,
        site: _,
        msr: _,
        random,
        explain,
        call_id,
        leg,
        conference,
        failed,
        failure,
        codecs,
    } = request;
    call_id.is_none()
        && leg.is_none()
        && conference.is_none()
        && failed.is_empty()
        && failure.is_none()
        && codecs.is_empty()
        && !explain
        && random.is_none()
}

/// Whether the core's answer to `request` may change what a copy holds:
/// a selection a copy may not answer (a leg's placement moves the
/// estimate, a failover the health) or a release. A select a copy could have answered
/// (it found the copy behind) changes nothing the copy holds — counting it
/// would keep the copy behind while such selects queue — and an operator
/// change reaches the state when it is committed, not when asked.
pub fn changes_the_copy(request: &Request) -> bool {
    match request {
        Request::Select(query) => !read_only(query),
        Request::Release { .. } => true,
        _ => false,
    }
}

/// Where the loop publishes its copies and the front ends read the last.
///
/// Copies are made on demand: the loop copies only while someone reads
/// (a read since the last copy). When it skips a copy it marks the last
/// one behind, and a reader that finds it so asks the core instead (and
/// so asks for a copy): no selection is ever drawn from a copy the loop
/// knows to be out of date past its pacing, and a collector nobody asks
/// that way spends nothing on copies.
#[derive(Debug, Clone, Default)]
pub struct Published(Arc<Shared>);

#[derive(Debug, Default)]
struct Shared {
    copy: RwLock<Option<Arc<Snapshot>>>,
    /// A front end read since the last copy.
    wanted: AtomicBool,
    /// The loop's state moved past the copy and no copy was made.
    behind: AtomicBool,
}

impl Published {
    /// The copy to draw from; `None` when there is none or the loop marked
    /// it behind (then the core answers). Asks the loop for copies.
    pub fn current(&self) -> Option<Arc<Snapshot>> {
        if !self.0.wanted.load(Ordering::Relaxed) {
            self.0.wanted.store(true, Ordering::Relaxed);
        }
        if self.0.behind.load(Ordering::Acquire) {
            return None;
        }
        self.0.copy.read().ok().and_then(|s| s.clone())
    }

    /// Whether a front end read since the last copy.
    pub fn wanted(&self) -> bool {
        self.0.wanted.load(Ordering::Relaxed)
    }

    /// Makes `snapshot` the one the front ends read.
    pub fn publish(&self, snapshot: Snapshot) {
        if let Ok(mut slot) = self.0.copy.write() {
            *slot = Some(Arc::new(snapshot));
        }
        self.0.wanted.store(false, Ordering::Relaxed);
        self.0.behind.store(false, Ordering::Release);
    }

    /// The loop's state moved on and no one reads: the copy stays, marked
    /// behind, until the next is made.
    pub fn mark_behind(&self) {
        self.0.behind.store(true, Ordering::Release);
    }
}

/// What the loop does with the copy after handling input ([`Pacer::step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing now: the copy is current, or a reader waits for the next,
    /// which is not due yet (the loop wakes for it at [`Pacer::due`]).
    Wait,
    /// Make a copy and publish it.
    Copy,
    /// Nobody read since the last copy, which the loop's state moved past:
    /// mark it behind ([`Published::mark_behind`]).
    Behind,
}

/// When the loop publishes the next copy (module docs). Sans-IO: the
/// caller passes the time and what the last copy cost.
#[derive(Debug, Clone, Default)]
pub struct Pacer {
    /// The core handled input since the last copy.
    dirty: bool,
    /// When the last copy was made, and how long it took.
    last: Option<(Instant, Duration)>,
}

impl Pacer {
    /// The core handled input: the copy may be behind it.
    pub fn touched(&mut self) {
        self.dirty = true;
    }

    /// When the next copy is due, seen at `now`; `None` while the last
    /// one is current.
    pub fn due(&self, now: Instant) -> Option<Instant> {
        if !self.dirty {
            return None;
        }
        match self.last {
            None => Some(now),
            Some((at, cost)) => Some(at + MIN_INTERVAL.max(cost * COST_FACTOR)),
        }
    }

    /// Whether a copy is to be made at `now`: it is due, or `force` (an
    /// operator change, an answer that shows state) while behind.
    pub fn wants(&self, now: Instant, force: bool) -> bool {
        self.dirty && (force || self.due(now).is_some_and(|at| at <= now))
    }

    /// What the loop does with the copy at `now`, `wanted` saying whether
    /// a front end read since the last copy ([`Published::wanted`]).
    ///
    /// A copy nobody read is marked behind as soon as the loop moves past
    /// it, due or not: the loop sleeps until its next input then (no copy
    /// is due while nobody reads), and a reader wakes nothing, so a copy
    /// left unmarked until it was due would be read, stale, for as long as
    /// the loop had no other input.
    pub fn step(&self, now: Instant, force: bool, wanted: bool) -> Step {
        if !self.dirty {
            return Step::Wait;
        }
        if !wanted {
            return Step::Behind;
        }
        if self.wants(now, force) {
            Step::Copy
        } else {
            Step::Wait
        }
    }

    /// A copy was made at `at`, taking `cost`.
    pub fn published(&mut self, at: Instant, cost: Duration) {
        self.dirty = false;
        self.last = Some((at, cost));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_made_only_after_input_and_spaced_by_its_cost() {
        let start = Instant::now();
        let mut pacer = Pacer::default();
        // Nothing handled: nothing to copy, even when forced.
        assert_eq!(pacer.due(start), None);
        assert!(!pacer.wants(start, true));
        pacer.touched();
        assert_eq!(pacer.due(start), Some(start));
        assert!(pacer.wants(start, false));
        // A cheap copy: the next after MIN_INTERVAL.
        pacer.published(start, Duration::from_micros(5));
        assert_eq!(pacer.due(start), None);
        pacer.touched();
        assert_eq!(pacer.due(start), Some(start + MIN_INTERVAL));
        assert!(!pacer.wants(start + Duration::from_millis(1), false));
        assert!(pacer.wants(start + MIN_INTERVAL, false));
        // Forced (an operator change, a list's answer): at once.
        assert!(pacer.wants(start + Duration::from_millis(1), true));
        // A dear copy: spaced by COST_FACTOR times its cost.
        pacer.published(start, Duration::from_millis(1));
        pacer.touched();
        assert_eq!(
            pacer.due(start),
            Some(start + Duration::from_millis(u64::from(COST_FACTOR)))
        );
    }

    /// A change the loop handles before the next copy is due, with no read
    /// since the last copy, marks the copy behind at once: the loop does
    /// not wake for a copy nobody asked for, and a reader that comes later
    /// does not wake it either, so a copy left unmarked would be read,
    /// stale, until the loop happens to have other input.
    #[test]
    fn only_placements_failovers_and_releases_change_the_copy() {
        let plain = SelectQuery::new("default", "local");
        assert!(!changes_the_copy(&Request::Select(plain.clone())));
        let leg = SelectQuery {
            call_id: Some("c1".into()),
            ..plain.clone()
        };
        assert!(changes_the_copy(&Request::Select(leg)));
        let explain = SelectQuery {
            explain: true,
            ..plain
        };
        assert!(changes_the_copy(&Request::Select(explain)));
        assert!(changes_the_copy(&Request::Release {
            call_id: "c1".into(),
            leg: None
        }));
        assert!(!changes_the_copy(&Request::ResourceList {
            active_only: false
        }));
    }

    #[test]
    fn a_change_before_the_next_copy_is_due_marks_an_unread_copy_behind() {
        let start = Instant::now();
        let mut pacer = Pacer::default();
        pacer.touched();
        assert_eq!(pacer.step(start, false, true), Step::Copy);
        pacer.published(start, Duration::from_micros(5));
        assert_eq!(pacer.step(start, false, false), Step::Wait);
        // An MSR's report, a health check, a reload 1 ms after the copy.
        let soon = start + Duration::from_millis(1);
        pacer.touched();
        assert_eq!(pacer.step(soon, false, false), Step::Behind);
        // Read since the copy: the next copy comes when due.
        assert_eq!(pacer.step(soon, false, true), Step::Wait);
        assert_eq!(pacer.step(start + MIN_INTERVAL, false, true), Step::Copy);
        assert_eq!(pacer.step(soon, true, true), Step::Copy);
        assert_eq!(pacer.step(soon, true, false), Step::Behind);
    }

    #[test]
    fn the_front_ends_read_the_last_copy_unless_it_is_behind() {
        let published = Published::default();
        assert!(!published.wanted());
        assert!(published.current().is_none());
        // The read asked for a copy.
        assert!(published.wanted());
        let table = LoadTable::new("core1".into(), crate::operator::Placement::default());
        published.publish(Snapshot::new(
            table,
            Topology::default(),
            SelectionConfig::default(),
            (1, OverloadWatch::default(), None),
        ));
        assert!(!published.wanted());
        let first = published.current().expect("published");
        assert!(published.wanted());
        published.publish((*first).clone());
        let second = published.current().expect("published");
        assert!(!Arc::ptr_eq(&first, &second));
        // Behind: the core answers until the next copy.
        published.mark_behind();
        assert!(published.current().is_none());
        published.publish((*second).clone());
        assert!(published.current().is_some());
    }
}
