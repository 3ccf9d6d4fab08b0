//! The live load table (SPEC §5): the selection index over the registered
//! MSR contacts, and the owner of the MSRs' load reports.
//!
//! Each fact has one owner, and the table is told of changes to them as
//! typed [`Change`] events through [`LoadTable::apply`], one path for all:
//! bindings by the [`Registrar`](crate::sip::registrar::Registrar) (the table
//! borrows the [`Binding`] and keeps only what selection reads: its URI,
//! engine addresses and expiry), the subscription's granted expiry by the
//! [`Subscriber`](crate::sip::subscriber::Subscriber) (the rest of the
//! subscription's state stays there), each contact's health by the
//! [`HealthMonitor`](crate::model::health::HealthMonitor), zones, sites and MSR
//! settings by the [`OperatorConfig`]. Load reports (NOTIFY bodies) are kept
//! here, with this collector's placements since the last one (SPEC §10).
//! Selection reads the index through [`LoadTable::zone`]; the control
//! protocol's lists join [`LoadTable::rows`] with the owners' own records.
//!
//! Load is per MSR (one NOTIFY per MSR) and shown on each of its contacts.
//! Registration status, the admin active flag, staleness and health are
//! separate fields; staleness and registration status are computed from the
//! `now` a reader passes, never stored.
//!
//! Architecture invariant: no I/O and no clock; times come from the caller as
//! `tokio::time::Instant`.
//!
//! # The zone index
//!
//! `contacts` (where each contact is filed) and `msrs` (per-MSR state) are
//! kept with `by_zone`, which holds what selection reads so that it reads one
//! contiguous slice per query, with no string-keyed lookup per candidate.
//! The index members are the table's only copy of a binding's URI, engine
//! and expiry. Invariant, restored by every change before it returns:
//!
//! * `by_zone[z]` holds exactly one `ZoneMember` per contact of `contacts`
//!   whose zone is `z`, sorted by (MSR name, contact name) — so each MSR's
//!   contacts are adjacent, by contact name, and selection's step 4 (one
//!   contact per MSR, the first by name) needs no sort; no zone maps to an
//!   empty list;
//! * a member's `msr_start` is true exactly when it is first in its list or
//!   its predecessor belongs to another MSR, so a scan tells MSRs apart
//!   without comparing names;
//! * each member carries its contact's `ContactEntry` (MSR, site, health)
//!   and its MSR's `MsrSelection`: the contact part is rewritten by a
//!   binding change, the MSR-level part by `refresh_msr` after a binding
//!   change, a load report, a placement, and a subscription change that
//!   moves the granted expiry (it bounds staleness); an operator change
//!   refiles the members whose zone moved, renumbers those whose site moved
//!   and refreshes the MSRs whose settings changed; removals drop members.
//!
//! Contact sites are numbered (`SiteNames`) so that selection compares
//! integers, not strings: per query, [`ZoneView::distances`]
//! maps the few sites at a finite distance from the leg's site to a dense
//! table indexed by site number. Numbers are only ever added, so the list
//! may name sites no contact carries any more (at most the collector's
//! default site and every site the operator declared since the start, a
//! number the topology caps); it never lacks one that a member refers to.
//!
//! Beside it the table keeps the selection index (`index.rs`): per zone
//! and contact site, the MSRs a plain leg can take there in trees by the
//! `ecss` weight and the `pooled` occupancy, re-keyed by the same changes
//! (one MSR per report, placement or end) and derived from `by_zone` alone.
//!
//! `check_index` (tests only) checks the invariant member by member, and
//! the selection index against one rebuilt from `by_zone`.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ops::Bound;
use std::time::Duration;

use msr_shared::event_package::LoadReport;
use msr_shared::media::{CodecSet, Lack};
use tokio::time::Instant;

use crate::model::estimate::{
    Estimate, SinceReport, DEFAULT_NOTIFY_FLIGHT_TIME, UNFOLLOWED_HORIZON,
};
use crate::model::health::{near_top, FailureCause, Health};
use crate::operator::names::{ContactName, MsrName, SiteName, ZoneName};
use crate::operator::topology::SiteDistances;
use crate::operator::{MsrSettings, OperatorConfig};
use crate::sip::registrar::Binding;
use msr_shared::engine::EngineAddresses;

/// The oldest sample a report's `sample-age-ms` is taken to mean (SPEC
/// §10): the agent's longest `sample-interval-ms`.
const MAX_SAMPLE_AGE: Duration = Duration::from_secs(60);

pub use crate::operator::Placement;

/// A change to one of the facts the table reads, as its owner reports it
/// (see the module docs); [`LoadTable::apply`] takes it.
#[derive(Debug, Clone)]
pub enum Change<'a> {
    /// The registrar added or refreshed a binding (SPEC §3).
    BindingChanged(&'a Binding),
    /// The registrar removed a binding (unregistered or lapsed).
    BindingRemoved(&'a Binding),
    /// The registrar holds no binding of the MSR any more: its load report
    /// goes with its last contact.
    MsrUnregistered(&'a MsrName),
    /// A NOTIFY carried the MSR's load (SPEC §4), received at `at`;
    /// `report.load` above 100 is read as 100.
    LoadReported {
        /// The MSR.
        msr: &'a MsrName,
        /// The report.
        report: LoadReport,
        /// When it arrived.
        at: Instant,
    },
    /// The subscription to the MSR changed; of it the table reads only the
    /// granted (or, while pending, requested) expiry, which bounds staleness.
    SubscriptionChanged {
        /// The MSR.
        msr: &'a MsrName,
        /// `Expires`, seconds.
        expires_secs: u32,
    },
    /// The health monitor set a contact's health (SPEC §5) at `since`
    /// (`now` of the change and its Unix seconds).
    HealthChanged {
        /// The contact.
        contact: &'a ContactName,
        /// Its health.
        health: Health,
        /// Since when.
        since: (Instant, i64),
    },
    /// The operator configuration changed (zones, sites, MSR settings).
    OperatorChanged,
}

/// Where a contact is filed in the index, and its health.
#[derive(Debug, Clone, PartialEq)]
struct ContactEntry {
    /// Its MSR.
    msr: MsrName,
    /// Effective zone (override or default).
    zone: ZoneName,
    /// Effective site (override or default).
    site: SiteName,
    /// Health, as the monitor last set it (`Healthy` until then: a new
    /// contact is inside its grace).
    health: Health,
    /// When it took that health (`now`, Unix seconds).
    health_since: Option<(Instant, i64)>,
}

#[derive(Debug, Clone, Default)]
struct MsrEntry {
    /// Contacts of this MSR present in the table.
    contacts: BTreeSet<ContactName>,
    /// Last report and when it arrived.
    load: Option<(LoadReport, Instant)>,
    /// The subscription's granted expiry, seconds, as the subscriber last
    /// reported it (`None`: no subscription state yet).
    expires_secs: Option<u32>,
    /// Operator settings in effect: selection's inputs, refiled from
    /// [`OperatorConfig`] at every operator change.
    settings: MsrSettings,
    /// This collector's placements and releases on the MSR not yet in a
    /// report (SPEC §10; the one owner of these counts).
    since_report: SinceReport,
}

impl MsrEntry {
    fn is_stale(&self, now: Instant) -> bool {
        self.selection().is_stale(now)
    }

    /// What selection needs of this MSR (copied into the zone index).
    fn selection(&self) -> MsrSelection {
        let limit = self
            .expires_secs
            .filter(|secs| *secs > 0)
            .unwrap_or(crate::config::DEFAULT_SUBSCRIPTION_EXPIRES_SECS);
        let limit = Duration::from_secs(u64::from(limit));
        MsrSelection {
            active: self.settings.active,
            performance_coefficient: self.settings.performance_coefficient,
            load_limit: self.settings.load_limit,
            load: self.load.as_ref().map(|(report, _)| report.load.min(100)),
            calls: self.load.as_ref().map(|(report, _)| report.calls),
            max_calls: self.load.as_ref().map_or(0, |(report, _)| report.max_calls),
            estimate: self.since_report.estimate(),
            // `now - at > limit` exactly when `now > at + limit`; a sum past
            // the end of time is never reached.
            stale_after: self.load.as_ref().and_then(|(_, at)| at.checked_add(limit)),
            codecs: Takes::of(self.load.as_ref().and_then(|(report, _)| report.codecs)),
        }
    }
}

/// The MSR-level values selection reads, derived from an [`MsrEntry`].
#[derive(Debug, Clone, Copy, PartialEq)]
struct MsrSelection {
    /// Admin active flag.
    active: bool,
    /// Performance coefficient.
    performance_coefficient: f64,
    /// Load limit, percent (SPEC §9).
    load_limit: u8,
    /// Last reported load, capped at 100.
    load: Option<u8>,
    /// Last reported `calls` (SPEC §10's estimate starts from it).
    calls: Option<u32>,
    /// Last reported `max-calls` (0 before a report).
    max_calls: u32,
    /// This collector's own legs and the others' at that report (SPEC
    /// §10, [`crate::model::estimate`]).
    estimate: Estimate,
    /// The last report is stale once `now` is past this: its arrival plus
    /// the subscription's expiry. `None`: no report, or never stale.
    stale_after: Option<Instant>,
    /// The codecs the MSR takes (SPEC §15), or that it did not say.
    codecs: Takes,
}

impl MsrSelection {
    /// The last report is older than the subscription's expiry at `now`.
    #[inline]
    fn is_stale(&self, now: Instant) -> bool {
        self.stale_after.is_some_and(|limit| now > limit)
    }
}

/// What an MSR takes (SPEC §15) in 8 bytes: the codec set, or every bit
/// set for "did not say" (an older agent, or no `<codec>`), which takes
/// anything. The zone index copies it into every member, which selection
/// scans: an `Option` would take 16.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Takes(u64);

impl Takes {
    const NOT_REPORTED: Takes = Takes(u64::MAX);

    fn of(list: Option<msr_shared::media::CodecList>) -> Takes {
        list.map_or(Takes::NOT_REPORTED, |l| Takes(l.set().bits()))
    }

    /// The reported set; `None` when the MSR did not say.
    #[inline]
    fn reported(self) -> Option<CodecSet> {
        (self != Takes::NOT_REPORTED).then(|| CodecSet::from_bits(self.0))
    }
}

/// Number of a site in [`SiteNames`].
type SiteId = usize;

/// The sites contacts carry, numbered in order of first use.
#[derive(Debug, Clone, Default)]
struct SiteNames {
    /// Name by number.
    names: Vec<SiteName>,
    /// Number by name.
    ids: HashMap<SiteName, SiteId>,
}

impl SiteNames {
    /// The number of `site`, allocated on first use.
    fn intern(&mut self, site: &SiteName) -> SiteId {
        if let Some(id) = self.ids.get(site) {
            return *id;
        }
        let id = self.names.len();
        self.names.push(site.clone());
        self.ids.insert(site.clone(), id);
        id
    }

    /// The name of site `id` (empty if unknown, which the invariant rules out).
    #[inline]
    fn name(&self, id: SiteId) -> &str {
        self.names.get(id).map_or("", SiteName::as_str)
    }
}

/// One contact as selection reads it: an entry of the zone index (see the
/// module docs for the invariant tying it to `contacts` and `msrs`).
#[derive(Debug, Clone, PartialEq)]
struct ZoneMember {
    /// Contact name (the second sort key of the zone's list).
    contact: ContactName,
    /// When the registration lapses.
    expires_at: Instant,
    /// MSR-level values.
    msr_selection: MsrSelection,
    /// MSR name (the first sort key of the zone's list).
    msr: MsrName,
    /// The first member of its MSR in the zone's list (the previous member,
    /// if any, is another MSR's): lets a scan tell MSRs apart without
    /// comparing names. Stamped by `stamp_msr_starts`.
    msr_start: bool,
    /// The contact's site, numbered in the table's `SiteNames`.
    site: SiteId,
    /// Contact URI.
    uri: String,
    /// The media engine's addresses (what the answer carries). Boxed: read
    /// only for the chosen candidate, while every selection scans the
    /// members, 68 bytes inline made each one a cache line longer.
    engine: Option<Box<EngineAddresses>>,
    /// The contact's health (SPEC §5 and §7 step 1).
    health: Health,
}

/// Every contact of a zone as explain reads it: the step-1 inputs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemberStatus<'a> {
    /// Contact name.
    pub contact: &'a str,
    /// MSR name.
    pub msr: &'a str,
    /// The contact's site.
    pub site: &'a str,
    /// Registered at `now`.
    pub registered: bool,
    /// The MSR's admin flag.
    pub active: bool,
    /// The contact's health.
    pub health: Health,
}

impl ZoneMember {
    /// The member for `binding` (whose site is numbered `site`, whose health
    /// is `health`) of MSR `msr`.
    fn new(binding: &Binding, site: SiteId, msr: &MsrEntry, health: Health) -> Self {
        Self {
            contact: binding.contact.clone(),
            expires_at: binding.expires_at,
            msr_selection: msr.selection(),
            msr: binding.msr.clone(),
            // Placeholder until the member is in its list.
            msr_start: true,
            site,
            uri: binding.uri.clone(),
            engine: binding.engine.map(Box::new),
            health,
        }
    }

    /// Whether it passes SPEC §7 step 1 at `now`: registered, active and
    /// healthy (the zone is the index's key).
    #[inline]
    fn passes_step_1(&self, now: Instant) -> bool {
        now < self.expires_at && self.msr_selection.active && self.health == Health::Healthy
    }

    /// What the member's MSR lacks for a leg offering `needs` (SPEC §15);
    /// `None`: it can take the leg, or it did not say what it takes.
    #[inline]
    fn lacks(&self, needs: CodecSet) -> Option<Lack> {
        if needs.is_empty() {
            return None;
        }
        self.msr_selection.codecs.reported()?.lacks(needs)
    }

    /// The candidate this member is at `now`, if it is one (SPEC §7 step 1:
    /// registered, active and healthy; the zone is the index's key).
    #[inline]
    fn candidate<'a>(&'a self, sites: &'a SiteNames, now: Instant) -> Option<Candidate<'a>> {
        let msr = &self.msr_selection;
        if !self.passes_step_1(now) {
            return None;
        }
        Some(Candidate {
            contact: &self.contact,
            msr: &self.msr,
            uri: &self.uri,
            engine: self.engine.as_deref().copied(),
            site: sites.name(self.site),
            load: msr.load,
            stale: msr.is_stale(now),
            performance_coefficient: msr.performance_coefficient,
            load_limit: msr.load_limit,
        })
    }
}

/// The sort key of a zone's member list: (MSR name, contact name).
#[inline]
fn member_key(member: &ZoneMember) -> (&str, &str) {
    (member.msr.as_str(), member.contact.as_str())
}

/// Position of `contact` of MSR `msr` in a zone's member list (sorted by
/// MSR name, then contact name).
fn member_position(members: &[ZoneMember], msr: &str, contact: &str) -> Result<usize, usize> {
    members.binary_search_by(|m| member_key(m).cmp(&(msr, contact)))
}

/// Removes the member of `contact` of MSR `msr` from the list of `zone`
/// (dropping the list once empty) and returns it.
fn take_member(
    by_zone: &mut HashMap<ZoneName, Vec<ZoneMember>>,
    zone: &str,
    msr: &str,
    contact: &str,
) -> Option<ZoneMember> {
    let members = by_zone.get_mut(zone)?;
    let removed = match member_position(members, msr, contact) {
        Ok(at) => {
            let member = members.remove(at);
            stamp_msr_starts(members, at..at + 1);
            Some(member)
        }
        Err(_) => None,
    };
    if members.is_empty() {
        by_zone.remove(zone);
    }
    removed
}

/// Puts `member` into the list of `zone`, in order, replacing the one of
/// its contact if there is one.
fn file_member(
    by_zone: &mut HashMap<ZoneName, Vec<ZoneMember>>,
    zone: &ZoneName,
    member: ZoneMember,
) {
    let members = match by_zone.get_mut(zone) {
        Some(members) => members,
        None => by_zone.entry(zone.clone()).or_default(),
    };
    let at = match member_position(members, &member.msr, &member.contact) {
        Ok(at) => {
            members[at] = member;
            at
        }
        Err(at) => {
            members.insert(at, member);
            at
        }
    };
    stamp_msr_starts(members, at..at + 2);
}

/// Recomputes `msr_start` of the members at `positions` (those past the end
/// are skipped). A member's flag depends only on its predecessor, so after
/// an insertion or replacement at `at` restamp `at..at + 2`, after a removal
/// at `at` restamp `at..at + 1`.
fn stamp_msr_starts(members: &mut [ZoneMember], positions: std::ops::Range<usize>) {
    for i in positions.start..positions.end.min(members.len()) {
        members[i].msr_start = i == 0 || members[i - 1].msr != members[i].msr;
    }
}

/// The live load table (SPEC §5).
#[derive(Debug, Clone)]
pub struct LoadTable {
    /// This collector's name, shown in the Node column.
    node: String,
    /// Zone and site of a contact the operator placed nowhere.
    defaults: Placement,
    /// Rows by contact name.
    contacts: BTreeMap<ContactName, ContactEntry>,
    /// Zone → what selection needs of each contact in it, sorted by MSR
    /// name, then contact name; derived from `contacts` and `msrs` (see the module docs).
    by_zone: HashMap<ZoneName, Vec<ZoneMember>>,
    /// Numbers of the sites the zone index refers to.
    sites: SiteNames,
    /// Per-MSR state by MSR name.
    msrs: BTreeMap<MsrName, MsrEntry>,
    /// How long a NOTIFY is assumed to fly (SPEC §10's compensation).
    notify_flight_time: Duration,
    /// Per zone and site, the MSRs a plain leg can take, by both
    /// policies' keys; derived from `by_zone` (`index.rs`).
    index: SelectionIndex,
    /// The placements without a leg still counted, oldest first, to
    /// forget each after [`UNFOLLOWED_HORIZON`] ([`LoadTable::note_unfollowed`]).
    unfollowed: VecDeque<(Instant, MsrName)>,
}

impl LoadTable {
    /// An empty table; `node` is this collector's name (Node column),
    /// `defaults` where a contact goes without an operator override.
    pub fn new(node: String, defaults: Placement) -> Self {
        Self {
            node,
            defaults,
            contacts: BTreeMap::new(),
            by_zone: HashMap::new(),
            sites: SiteNames::default(),
            msrs: BTreeMap::new(),
            notify_flight_time: DEFAULT_NOTIFY_FLIGHT_TIME,
            index: SelectionIndex::default(),
            unfollowed: VecDeque::new(),
        }
    }

    /// Sets G, the number of core hosts the `pooled` keys of the selection
    /// index are estimated with (SPEC §10, §12); a change re-keys every
    /// MSR. A `pooled` query with another G is answered by the scan.
    pub fn set_core_hosts(&mut self, core_hosts: u32) {
        self.index.set_core_hosts(core_hosts, &self.by_zone);
    }

    /// Recomputes `msr`'s units in the selection index of `zone`.
    fn sync_index(&mut self, zone: &ZoneName, msr: &MsrName) {
        let members = self.by_zone.get(zone).map_or(&[][..], Vec::as_slice);
        self.index.sync(zone, members, msr);
    }

    /// Sets the NOTIFY flight time a report is compensated for (SPEC §10,
    /// `[selection] notify_flight_time_ms`).
    pub fn set_notify_flight_time(&mut self, flight: Duration) {
        self.notify_flight_time = flight;
    }

    /// This collector placed a leg on `msr` at `at` (SPEC §10: counted
    /// until a report covers it). An MSR not in the table is ignored.
    pub fn note_placed(&mut self, msr: &str, at: Instant) {
        if let Some(entry) = self.msrs.get_mut(msr) {
            entry.since_report.placed(at);
            self.rekey_msr(msr);
        }
    }

    /// A leg of this collector on `msr` was released at `at` (SPEC §10).
    pub fn note_ended(&mut self, msr: &str, at: Instant) {
        if let Some(entry) = self.msrs.get_mut(msr) {
            entry.since_report.ended(at);
            self.rekey_msr(msr);
        }
    }

    /// A selection without a leg (the `ecss` fallback, SPEC §10) sent a
    /// session to `msr` at `at`: counted in its estimate (G times) until a
    /// report covers it or [`UNFOLLOWED_HORIZON`] passes, but only while
    /// the MSR's last report is near its top ([`LoadTable::is_near_top`]):
    /// below it one collector's placements between two reports cannot
    /// fill it, and its reports may be far apart (`load-delta`, SPEC §4).
    /// Whether it was counted.
    pub fn note_unfollowed(&mut self, msr: &str, at: Instant) -> bool {
        // One lookup for the key (queued below) and the entry.
        let bounds = (Bound::Included(msr), Bound::Included(msr));
        let Some((name, entry)) = self.msrs.range_mut::<str, _>(bounds).next() else {
            return false;
        };
        let near_top = entry
            .load
            .as_ref()
            .is_some_and(|(report, _)| near_top(report.calls, report.max_calls));
        if !near_top {
            return false;
        }
        entry.since_report.unfollowed(at);
        self.unfollowed.push_back((at, name.clone()));
        self.rekey_msr(msr);
        true
    }

    /// Whether `msr`'s last report has `calls` at or above
    /// [`NEAR_TOP_PERCENT`] of its `max-calls`: where its agent reports
    /// every change of `calls` (the high-water mark, SPEC §4) and where a
    /// leg can find it full.
    pub fn is_near_top(&self, msr: &str) -> bool {
        self.msrs
            .get(msr)
            .and_then(|m| m.load.as_ref())
            .is_some_and(|(report, _)| near_top(report.calls, report.max_calls))
    }

    /// When [`LoadTable::handle_timeout`] next has a placement without a
    /// leg to forget.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.unfollowed
            .front()
            .and_then(|(at, _)| at.checked_add(UNFOLLOWED_HORIZON))
    }

    /// Forgets the placements without a leg that no report covered within
    /// [`UNFOLLOWED_HORIZON`] (module docs of [`crate::model::estimate`]).
    pub fn handle_timeout(&mut self, now: Instant) {
        let Some(cutoff) = now.checked_sub(UNFOLLOWED_HORIZON) else {
            return;
        };
        while let Some((at, _)) = self.unfollowed.front() {
            if *at > cutoff {
                break;
            }
            let Some((_, msr)) = self.unfollowed.pop_front() else {
                break;
            };
            // A report may have covered it already: then nothing moves.
            let Some(entry) = self.msrs.get_mut(&msr) else {
                continue;
            };
            if entry.since_report.forget_unfollowed(cutoff) > 0 {
                self.rekey_msr(&msr);
            }
        }
    }

    /// A core's failure `cause` of `msr` (SPEC §14) as its last load
    /// report explains it: near the top a `load-limit` or `503` is the MSR
    /// full ([`FailureCause::near_top`]). Unchanged without a report.
    pub fn failure_given_report(&self, msr: &str, cause: FailureCause) -> FailureCause {
        match self.msrs.get(msr).and_then(|m| m.load.as_ref()) {
            Some((report, _)) => cause.near_top(report.calls, report.max_calls),
            None => cause,
        }
    }

    /// A leg of this collector on `msr` expired (a lost release, SPEC §9):
    /// the call is long gone from the MSR, so it leaves this collector's
    /// own count without being an end since the last report.
    pub fn note_expired(&mut self, msr: &str) {
        if let Some(entry) = self.msrs.get_mut(msr) {
            entry.since_report.expired();
            self.rekey_msr(msr);
        }
    }

    /// Number of contacts in the table.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.contacts.len()
    }

    /// Whether the table has no contact.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.contacts.is_empty()
    }

    /// Removes `contact`, indexed under MSR `msr`, from the index entry of
    /// `zone`; returns the member it held.
    fn unindex(&mut self, contact: &str, msr: &str, zone: &str) -> Option<ZoneMember> {
        take_member(&mut self.by_zone, zone, msr, contact)
    }

    /// Puts `member` into the list of `zone`, replacing the one of its
    /// contact if there is one.
    fn file(&mut self, zone: &ZoneName, member: ZoneMember) {
        file_member(&mut self.by_zone, zone, member);
    }

    /// The index member of `contact`, if the table has it.
    fn member(&self, contact: &str) -> Option<&ZoneMember> {
        let entry = self.contacts.get(contact)?;
        let members = self.by_zone.get(&entry.zone)?;
        let at = member_position(members, &entry.msr, contact).ok()?;
        members.get(at)
    }

    /// Copies the MSR-level values of `msr` into the index entries of its
    /// contacts and recomputes its units in the selection index. Call
    /// after any change to the MSR's [`MsrEntry`] that may move its units
    /// (its settings: active), else [`LoadTable::rekey_msr`].
    fn refresh_msr(&mut self, msr: &str) {
        self.copy_selection(msr, false);
        let Some((name, entry)) = self.msrs.get_key_value(msr) else {
            return;
        };
        // Then its units, once every member carries the new values.
        let mut last: Option<&ZoneName> = None;
        for contact in &entry.contacts {
            let Some(zone) = self.contacts.get(contact).map(|c| &c.zone) else {
                continue;
            };
            if last != Some(zone) {
                let members = self.by_zone.get(zone).map_or(&[][..], Vec::as_slice);
                self.index.sync(zone, members, name);
                last = Some(zone);
            }
        }
    }

    /// Like [`LoadTable::refresh_msr`] after a change that leaves the MSR's
    /// units where they are (a report, a placement, an end, the
    /// subscription's expiry): they are only re-keyed, which every NOTIFY
    /// and every leg pays.
    fn rekey_msr(&mut self, msr: &str) {
        self.copy_selection(msr, true);
    }

    /// Copies the MSR-level values of `msr` into the index entries of its
    /// contacts; with `rekey`, also into its units' keys.
    fn copy_selection(&mut self, msr: &str, rekey: bool) {
        let Some(entry) = self.msrs.get(msr) else {
            return;
        };
        let selection = entry.selection();
        let mut last: Option<&ZoneName> = None;
        for contact in &entry.contacts {
            let Some(zone) = self.contacts.get(contact).map(|c| &c.zone) else {
                continue;
            };
            let Some(members) = self.by_zone.get_mut(zone) else {
                continue;
            };
            if let Ok(at) = member_position(members, msr, contact) {
                members[at].msr_selection = selection;
            }
            if rekey && last != Some(zone) {
                self.index.rekey(zone, msr, &selection);
                last = Some(zone);
            }
        }
    }

    /// Takes one change from the owner of the fact it is about (see
    /// [`Change`]); `operator` is the current operator configuration.
    pub fn apply(&mut self, operator: &OperatorConfig, change: Change<'_>) {
        match change {
            Change::BindingChanged(binding) => self.upsert_contact(binding, operator),
            Change::BindingRemoved(binding) => self.remove_contact(&binding.contact),
            Change::MsrUnregistered(msr) => self.remove_msr(msr),
            Change::LoadReported { msr, report, at } => self.set_load(msr, report, at),
            Change::SubscriptionChanged { msr, expires_secs } => {
                self.set_subscription(msr, expires_secs)
            }
            Change::HealthChanged {
                contact,
                health,
                since,
            } => self.set_health(contact, health, since),
            Change::OperatorChanged => self.apply_operator(operator),
        }
    }

    /// A binding added or refreshed (SPEC §3); zone and site come from the
    /// operator's overrides, else the collector's defaults.
    fn upsert_contact(&mut self, binding: &Binding, operator: &OperatorConfig) {
        let zone = operator
            .contact_zone(&binding.contact, &self.defaults.zone)
            .clone();
        let site = operator
            .contact_site(&binding.contact, &self.defaults.site)
            .clone();
        // A refresh keeps the health the monitor set.
        let (mut health, mut health_since) = (Health::Healthy, None);
        let mut moved = None;
        if let Some(old) = self.contacts.get(&binding.contact) {
            (health, health_since) = (old.health, old.health_since);
            let (old_zone, old_msr) = (old.zone.clone(), old.msr.clone());
            // A refresh in the same zone and MSR replaces its member in
            // place; otherwise its position (or list) changes.
            if old_zone != zone || old_msr != binding.msr {
                self.unindex(&binding.contact, &old_msr, &old_zone);
            }
            if old_msr != binding.msr {
                if let Some(entry) = self.msrs.get_mut(&old_msr) {
                    entry.contacts.remove(&binding.contact);
                }
            }
            moved = (old_zone != zone || old_msr != binding.msr).then_some((old_zone, old_msr));
        }
        let site_id = self.sites.intern(&site);
        let entry = self.msrs.entry(binding.msr.clone()).or_default();
        entry.settings = operator.msr(&binding.msr);
        if !entry.contacts.contains(&binding.contact) {
            entry.contacts.insert(binding.contact.clone());
        }
        let member = ZoneMember::new(binding, site_id, entry, health);
        self.file(&zone, member);
        self.contacts.insert(
            binding.contact.clone(),
            ContactEntry {
                msr: binding.msr.clone(),
                zone,
                site,
                health,
                health_since,
            },
        );
        if let Some((old_zone, old_msr)) = moved {
            self.sync_index(&old_zone, &old_msr);
        }
        // The settings may have changed: the MSR's other contacts follow.
        self.refresh_msr(&binding.msr);
    }

    /// Removes a contact (unregistered or lapsed). The MSR's load and
    /// subscription state stay until its last contact goes
    /// ([`Change::MsrUnregistered`]).
    fn remove_contact(&mut self, contact: &str) {
        if let Some(old) = self.contacts.remove(contact) {
            self.unindex(contact, &old.msr, &old.zone);
            if let Some(entry) = self.msrs.get_mut(&old.msr) {
                entry.contacts.remove(contact);
            }
            self.sync_index(&old.zone, &old.msr);
        }
    }

    /// Removes an MSR: every contact, its load and its subscription state.
    fn remove_msr(&mut self, msr: &str) {
        if let Some(entry) = self.msrs.remove(msr) {
            let mut zones = Vec::new();
            for contact in &entry.contacts {
                if let Some(old) = self.contacts.remove(contact) {
                    self.unindex(contact, &old.msr, &old.zone);
                    zones.push((old.zone, old.msr));
                }
            }
            for (zone, msr) in zones {
                self.sync_index(&zone, &msr);
            }
        }
    }

    /// Records a load report received at `at`.
    fn set_load(&mut self, msr: &MsrName, report: LoadReport, at: Instant) {
        // The report's `calls` is the MSR at its sample: one flight and the
        // sample's age before it arrived (SPEC §10). An age beyond the
        // agent's longest sample interval is no sample's and is capped.
        let age =
            Duration::from_millis(u64::from(report.sample_age_ms.unwrap_or(0))).min(MAX_SAMPLE_AGE);
        let flight = self.notify_flight_time + age;
        let entry = self.msr_entry(msr);
        entry.since_report.report(at, flight, report.calls);
        entry.load = Some((report, at));
        self.rekey_msr(msr);
    }

    /// Records the granted expiry of the subscription to an MSR. It matters
    /// to selection only when it changes (it bounds staleness), so the zone
    /// index is touched only then: the shell reports every NOTIFY's
    /// subscription change (the counters move), which must stay cheap.
    fn set_subscription(&mut self, msr: &MsrName, expires_secs: u32) {
        let entry = self.msr_entry(msr);
        if entry.expires_secs != Some(expires_secs) {
            let before = entry.selection();
            entry.expires_secs = Some(expires_secs);
            if entry.selection() != before {
                self.rekey_msr(msr);
            }
        }
    }

    /// Records the health of `contact`; a contact not in the table is
    /// ignored.
    fn set_health(&mut self, contact: &str, health: Health, since: (Instant, i64)) {
        let Some(entry) = self.contacts.get_mut(contact) else {
            return;
        };
        entry.health = health;
        entry.health_since = Some(since);
        if let Some(members) = self.by_zone.get_mut(&entry.zone) {
            if let Ok(at) = member_position(members, &entry.msr, contact) {
                members[at].health = health;
            }
        }
        let (zone, msr) = (entry.zone.clone(), entry.msr.clone());
        self.sync_index(&zone, &msr);
    }

    /// The MSR's entry, created empty if absent.
    fn msr_entry(&mut self, msr: &MsrName) -> &mut MsrEntry {
        self.msrs.entry(msr.clone()).or_default()
    }

    /// The `[defaults]` zone and site: of a contact without an operator
    /// override, and of a select that names none. The load table is their
    /// one holder in the collector's state.
    pub fn placement(&self) -> &Placement {
        &self.defaults
    }

    /// New `[defaults]` (a reload): every contact without an operator
    /// override moves to the new zone and site.
    pub fn set_defaults(&mut self, operator: &OperatorConfig, defaults: Placement) {
        if self.defaults != defaults {
            self.defaults = defaults;
            self.apply_operator(operator);
        }
    }

    /// Re-reads every operator-owned value (zone, site, coefficient, active,
    /// load limit) from `operator`, and changes in the index only what
    /// differs: a contact whose zone moved is refiled, one whose site moved
    /// gets the site's number, an MSR whose settings changed is refreshed.
    /// Nothing is allocated for what stayed.
    fn apply_operator(&mut self, operator: &OperatorConfig) {
        let Self {
            contacts,
            by_zone,
            sites,
            defaults,
            ..
        } = self;
        for (name, entry) in contacts.iter_mut() {
            let zone = operator.contact_zone(name, &defaults.zone);
            let site = operator.contact_site(name, &defaults.site);
            let (zone_moved, site_moved) = (entry.zone != *zone, entry.site != *site);
            if !zone_moved && !site_moved {
                continue;
            }
            if site_moved {
                entry.site = site.clone();
            }
            let site = sites.intern(site);
            if zone_moved {
                let old = std::mem::replace(&mut entry.zone, zone.clone());
                if let Some(mut member) = take_member(by_zone, &old, &entry.msr, name) {
                    member.site = site;
                    file_member(by_zone, zone, member);
                }
            } else if let Some(members) = by_zone.get_mut(zone) {
                if let Ok(at) = member_position(members, &entry.msr, name) {
                    members[at].site = site;
                }
            }
        }
        let mut changed = Vec::new();
        for (name, entry) in &mut self.msrs {
            let settings = operator.msr(name);
            if entry.settings != settings {
                entry.settings = settings;
                changed.push(name.clone());
            }
        }
        for msr in changed {
            self.refresh_msr(&msr);
        }
        // Zones and sites may have moved under any MSR: rebuilt whole
        // (an operator change is rare; a NOTIFY or a leg re-keys one MSR).
        self.index.rebuild(&self.by_zone);
    }

    /// Panics unless the zone index keeps its invariant (module docs):
    /// every contact has exactly one member, in its zone's list, with its
    /// MSR, site, health and its MSR's current values; each list is sorted,
    /// non-empty and stamped.
    #[cfg(test)]
    pub(crate) fn check_index(&self) {
        let mut members = 0;
        for (zone, list) in &self.by_zone {
            assert!(!list.is_empty(), "empty list for zone {zone}");
            for (i, m) in list.iter().enumerate() {
                assert_eq!(m.msr_start, i == 0 || list[i - 1].msr != m.msr, "{m:?}");
                if i > 0 {
                    assert!(member_key(&list[i - 1]) < member_key(m), "unsorted {zone}");
                }
                let entry = self
                    .contacts
                    .get(&m.contact)
                    .expect("member of a known contact");
                assert_eq!((&entry.zone, &entry.msr), (zone, &m.msr), "{m:?}");
                assert_eq!(self.sites.name(m.site), entry.site, "{m:?}");
                assert_eq!(m.health, entry.health, "{m:?}");
                let msr = self.msrs.get(&m.msr).expect("member of a known msr");
                assert!(msr.contacts.contains(&m.contact), "{m:?}");
                assert_eq!(m.msr_selection, msr.selection(), "zone index out of date");
            }
            members += list.len();
        }
        assert_eq!(members, self.contacts.len(), "a contact without a member");
        let filed: usize = self.msrs.values().map(|m| m.contacts.len()).sum();
        assert_eq!(
            filed,
            self.contacts.len(),
            "a contact filed twice or not at all"
        );
        self.index.check(&self.by_zone);
    }
}

mod index;
mod view;
use index::SelectionIndex;
pub use index::{admission_load, draw_weight, IndexedZone, NearestTiers};
pub use view::*;

#[cfg(test)]
mod tests;
