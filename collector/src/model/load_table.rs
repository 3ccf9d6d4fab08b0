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
//! `check_index` (tests only) checks the invariant member by member.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use msr_shared::event_package::LoadReport;
use tokio::time::Instant;

use crate::model::estimate::{Estimate, SinceReport, DEFAULT_NOTIFY_FLIGHT_TIME};
use crate::model::health::Health;
use crate::operator::topology::SiteDistances;
use crate::operator::{MsrSettings, OperatorConfig};
use crate::sip::registrar::Binding;
use msr_shared::engine::EngineAddresses;

/// Where a contact is filed when the operator set no zone or site for it:
/// the collector's `[defaults]` (SPEC §6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Zone of a contact without an override.
    pub zone: String,
    /// Site of a contact without an override.
    pub site: String,
}

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
    MsrUnregistered(&'a str),
    /// A NOTIFY carried the MSR's load (SPEC §4), received at `at`;
    /// `report.load` above 100 is read as 100.
    LoadReported {
        /// The MSR.
        msr: &'a str,
        /// The report.
        report: LoadReport,
        /// When it arrived.
        at: Instant,
    },
    /// The subscription to the MSR changed; of it the table reads only the
    /// granted (or, while pending, requested) expiry, which bounds staleness.
    SubscriptionChanged {
        /// The MSR.
        msr: &'a str,
        /// `Expires`, seconds.
        expires_secs: u32,
    },
    /// The health monitor set a contact's health (SPEC §5) at `since`
    /// (`now` of the change and its Unix seconds).
    HealthChanged {
        /// The contact.
        contact: &'a str,
        /// Its health.
        health: Health,
        /// Since when.
        since: (Instant, i64),
    },
    /// The operator configuration changed (zones, sites, MSR settings).
    OperatorChanged,
}

/// One row of the table as seen at a given `now` (SPEC §5).
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceRow {
    /// The collector holding the row.
    pub node: String,
    /// Contact name `{iface}@{msr}`.
    pub contact: String,
    /// MSR name.
    pub msr: String,
    /// Contact URI.
    pub uri: String,
    /// The media engine's addresses (SPEC §3), if reported.
    pub engine: Option<EngineAddresses>,
    /// Performance coefficient of the MSR.
    pub performance_coefficient: f64,
    /// Admin active flag of the MSR.
    pub active: bool,
    /// The contact's zone.
    pub zone: String,
    /// The contact's site.
    pub site: String,
    /// `now` is before the registration's expiry.
    pub registered: bool,
    /// Time left until the registration lapses (zero once lapsed).
    pub expires_in: Duration,
    /// The MSR's last load report.
    pub load: Option<LoadReport>,
    /// Age of the last load report.
    pub report_age: Option<Duration>,
    /// The last report is older than the subscription's expiry.
    pub stale: bool,
    /// The contact's health (SPEC §5).
    pub health: Health,
    /// Since when (`now` and Unix seconds), once the monitor has set it.
    pub health_since: Option<(Instant, i64)>,
}

/// A contact that selection may use (SPEC §7 step 1), as borrowed from the table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate<'a> {
    /// Contact name.
    pub contact: &'a str,
    /// MSR name.
    pub msr: &'a str,
    /// Contact URI.
    pub uri: &'a str,
    /// The media engine's addresses, if reported.
    pub engine: Option<EngineAddresses>,
    /// The contact's site.
    pub site: &'a str,
    /// The MSR's last reported load in percent, if any.
    pub load: Option<u8>,
    /// The last report is stale.
    pub stale: bool,
    /// Performance coefficient of the MSR.
    pub performance_coefficient: f64,
    /// Load limit of the MSR, percent (SPEC §9).
    pub load_limit: u8,
}

/// A registered contact ([`LoadTable::live_contact`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LiveContact<'a> {
    /// Its MSR.
    pub msr: &'a str,
    /// Its URI (the agent's).
    pub uri: &'a str,
    /// The media engine's addresses, if reported.
    pub engine: Option<EngineAddresses>,
    /// Its site.
    pub site: &'a str,
}

/// Per-MSR state about an MSR summary (for `subscription list`, `msr list`).
#[derive(Debug, Clone, PartialEq)]
pub struct MsrView {
    /// MSR name.
    pub msr: String,
    /// At least one contact is registered at `now`.
    pub registered: bool,
    /// Operator settings in effect.
    pub settings: MsrSettings,
    /// `Healthy` when a registered contact is, else the health of the
    /// first registered contact by name, with since when; `None` without a
    /// registered contact.
    pub health: Option<(Health, Option<(Instant, i64)>)>,
}

/// Where a contact is filed in the index, and its health.
#[derive(Debug, Clone, PartialEq)]
struct ContactEntry {
    /// Its MSR.
    msr: String,
    /// Effective zone (override or default).
    zone: String,
    /// Effective site (override or default).
    site: String,
    /// Health, as the monitor last set it (`Healthy` until then: a new
    /// contact is inside its grace).
    health: Health,
    /// When it took that health (`now`, Unix seconds).
    health_since: Option<(Instant, i64)>,
}

#[derive(Debug, Clone, Default)]
struct MsrEntry {
    /// Contacts of this MSR present in the table.
    contacts: BTreeSet<String>,
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
}

impl MsrSelection {
    /// The last report is older than the subscription's expiry at `now`.
    #[inline]
    fn is_stale(&self, now: Instant) -> bool {
        self.stale_after.is_some_and(|limit| now > limit)
    }
}

/// Number of a site in [`SiteNames`].
type SiteId = usize;

/// The sites contacts carry, numbered in order of first use.
#[derive(Debug, Clone, Default)]
struct SiteNames {
    /// Name by number.
    names: Vec<String>,
    /// Number by name.
    ids: HashMap<String, SiteId>,
}

impl SiteNames {
    /// The number of `site`, allocated on first use.
    fn intern(&mut self, site: &str) -> SiteId {
        if let Some(id) = self.ids.get(site) {
            return *id;
        }
        let id = self.names.len();
        self.names.push(site.to_owned());
        self.ids.insert(site.to_owned(), id);
        id
    }

    /// The name of site `id` (empty if unknown, which the invariant rules out).
    #[inline]
    fn name(&self, id: SiteId) -> &str {
        self.names.get(id).map_or("", String::as_str)
    }
}

/// One contact as selection reads it: an entry of the zone index (see the
/// module docs for the invariant tying it to `contacts` and `msrs`).
#[derive(Debug, Clone, PartialEq)]
struct ZoneMember {
    /// Contact name (the second sort key of the zone's list).
    contact: String,
    /// When the registration lapses.
    expires_at: Instant,
    /// MSR-level values.
    msr_selection: MsrSelection,
    /// MSR name (the first sort key of the zone's list).
    msr: String,
    /// The first member of its MSR in the zone's list (the previous member,
    /// if any, is another MSR's): lets a scan tell MSRs apart without
    /// comparing names. Stamped by `stamp_msr_starts`.
    msr_start: bool,
    /// The contact's site, numbered in the table's `SiteNames`.
    site: SiteId,
    /// Contact URI.
    uri: String,
    /// The media engine's addresses (what the answer carries).
    engine: Option<EngineAddresses>,
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
            engine: binding.engine,
            health,
        }
    }

    /// Whether it passes SPEC §7 step 1 at `now`: registered, active and
    /// healthy (the zone is the index's key).
    #[inline]
    fn passes_step_1(&self, now: Instant) -> bool {
        now < self.expires_at && self.msr_selection.active && self.health == Health::Healthy
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
            engine: self.engine,
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
    by_zone: &mut HashMap<String, Vec<ZoneMember>>,
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
fn file_member(by_zone: &mut HashMap<String, Vec<ZoneMember>>, zone: &str, member: ZoneMember) {
    let members = match by_zone.get_mut(zone) {
        Some(members) => members,
        None => by_zone.entry(zone.to_owned()).or_default(),
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
    contacts: BTreeMap<String, ContactEntry>,
    /// Zone → what selection needs of each contact in it, sorted by MSR
    /// name, then contact name; derived from `contacts` and `msrs` (see the module docs).
    by_zone: HashMap<String, Vec<ZoneMember>>,
    /// Numbers of the sites the zone index refers to.
    sites: SiteNames,
    /// Per-MSR state by MSR name.
    msrs: BTreeMap<String, MsrEntry>,
    /// How long a NOTIFY is assumed to fly (SPEC §10's compensation).
    notify_flight_time: Duration,
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
        }
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
            self.refresh_msr(msr);
        }
    }

    /// A leg of this collector on `msr` was released at `at` (SPEC §10).
    pub fn note_ended(&mut self, msr: &str, at: Instant) {
        if let Some(entry) = self.msrs.get_mut(msr) {
            entry.since_report.ended(at);
            self.refresh_msr(msr);
        }
    }

    /// A leg of this collector on `msr` expired (a lost release, SPEC §9):
    /// the call is long gone from the MSR, so it leaves this collector's
    /// own count without being an end since the last report.
    pub fn note_expired(&mut self, msr: &str) {
        if let Some(entry) = self.msrs.get_mut(msr) {
            entry.since_report.expired();
            self.refresh_msr(msr);
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
    fn file(&mut self, zone: &str, member: ZoneMember) {
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
    /// contacts. Call after any change to the MSR's [`MsrEntry`].
    fn refresh_msr(&mut self, msr: &str) {
        let Some(entry) = self.msrs.get(msr) else {
            return;
        };
        let selection = entry.selection();
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
            .to_owned();
        let site = operator
            .contact_site(&binding.contact, &self.defaults.site)
            .to_owned();
        // A refresh keeps the health the monitor set.
        let (mut health, mut health_since) = (Health::Healthy, None);
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
        }
    }

    /// Removes an MSR: every contact, its load and its subscription state.
    fn remove_msr(&mut self, msr: &str) {
        if let Some(entry) = self.msrs.remove(msr) {
            for contact in &entry.contacts {
                if let Some(old) = self.contacts.remove(contact) {
                    self.unindex(contact, &old.msr, &old.zone);
                }
            }
        }
    }

    /// Records a load report received at `at`.
    fn set_load(&mut self, msr: &str, report: LoadReport, at: Instant) {
        let flight = self.notify_flight_time;
        let entry = self.msr_entry(msr);
        entry.since_report.report(at, flight, report.calls);
        entry.load = Some((report, at));
        self.refresh_msr(msr);
    }

    /// Records the granted expiry of the subscription to an MSR. It matters
    /// to selection only when it changes (it bounds staleness), so the zone
    /// index is touched only then: the shell reports every NOTIFY's
    /// subscription change (the counters move), which must stay cheap.
    fn set_subscription(&mut self, msr: &str, expires_secs: u32) {
        let entry = self.msr_entry(msr);
        if entry.expires_secs != Some(expires_secs) {
            let before = entry.selection();
            entry.expires_secs = Some(expires_secs);
            if entry.selection() != before {
                self.refresh_msr(msr);
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
    }

    /// The MSR's entry, created empty if absent.
    fn msr_entry(&mut self, msr: &str) -> &mut MsrEntry {
        self.msrs.entry(msr.to_owned()).or_default()
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
            let (zone_moved, site_moved) = (entry.zone != zone, entry.site != site);
            if !zone_moved && !site_moved {
                continue;
            }
            if site_moved {
                entry.site = site.to_owned();
            }
            let site = sites.intern(site);
            if zone_moved {
                let old = std::mem::replace(&mut entry.zone, zone.to_owned());
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
    }

    /// Whether any contact in the table currently carries `site`.
    pub fn site_in_use(&self, site: &str) -> bool {
        self.contacts.values().any(|c| c.site == site)
    }

    /// The contact, if it is still there at `now` for the legs it anchors:
    /// registered and not unreachable (SPEC §9: a leg keeps its MSR and
    /// contact unless that MSR is gone). An inactive, stale or unreported
    /// contact keeps its live legs (a drain lets calls finish).
    pub fn live_contact(&self, contact: &str, now: Instant) -> Option<LiveContact<'_>> {
        let c = self.contacts.get(contact)?;
        let m = self.member(contact)?;
        let there = now < m.expires_at && c.health != Health::Unreachable;
        there.then(|| LiveContact {
            msr: &m.msr,
            uri: &m.uri,
            engine: m.engine,
            site: &c.site,
        })
    }

    /// The rows as seen at `now`, sorted by MSR then contact.
    pub fn rows(&self, now: Instant) -> Vec<ResourceRow> {
        let mut rows = Vec::with_capacity(self.contacts.len());
        for (msr, entry) in &self.msrs {
            for contact in &entry.contacts {
                let (Some(c), Some(m)) = (self.contacts.get(contact), self.member(contact)) else {
                    continue;
                };
                rows.push(ResourceRow {
                    node: self.node.clone(),
                    contact: contact.clone(),
                    msr: msr.clone(),
                    uri: m.uri.clone(),
                    engine: m.engine,
                    performance_coefficient: entry.settings.performance_coefficient,
                    active: entry.settings.active,
                    zone: c.zone.clone(),
                    site: c.site.clone(),
                    registered: now < m.expires_at,
                    expires_in: m.expires_at.saturating_duration_since(now),
                    load: entry.load.as_ref().map(|(report, _)| report.clone()),
                    report_age: entry
                        .load
                        .as_ref()
                        .map(|(_, at)| now.saturating_duration_since(*at)),
                    stale: entry.is_stale(now),
                    health: c.health,
                    health_since: c.health_since,
                });
            }
        }
        rows
    }

    /// Per-MSR summaries at `now`, sorted by MSR name.
    pub fn msrs(&self, now: Instant) -> Vec<MsrView> {
        self.msrs
            .iter()
            .map(|(msr, entry)| {
                let registered: Vec<&ContactEntry> = entry
                    .contacts
                    .iter()
                    .filter(|c| self.member(c).is_some_and(|m| now < m.expires_at))
                    .filter_map(|c| self.contacts.get(c))
                    .collect();
                let health = registered
                    .iter()
                    .find(|c| c.health == Health::Healthy)
                    .or(registered.first())
                    .map(|c| (c.health, c.health_since));
                MsrView {
                    msr: msr.clone(),
                    registered: !registered.is_empty(),
                    settings: entry.settings.clone(),
                    health,
                }
            })
            .collect()
    }

    /// Contacts selection may use (SPEC §7 step 1): in `zone`, registered at
    /// `now`, and of an active MSR; sorted by MSR name, then contact name
    /// (each MSR's contacts adjacent, by contact name). Reads only the
    /// zone's index entry: one hash lookup, then a slice scan. Selection
    /// itself reads the zone through [`LoadTable::zone`]; this plain form is
    /// what the tests (and selection's reference copy) check it against.
    #[cfg(test)]
    pub(crate) fn candidates_in_zone<'a>(
        &'a self,
        zone: &str,
        now: Instant,
    ) -> impl Iterator<Item = Candidate<'a>> + 'a {
        self.zone_members(zone)
            .iter()
            .filter_map(move |member| member.candidate(&self.sites, now))
    }

    /// Selection's view of `zone`'s index (SPEC §7 steps 1–4); empty if no
    /// contact is in the zone. One hash lookup; everything after it reads
    /// the zone's contiguous member list by position.
    pub fn zone(&self, zone: &str) -> ZoneView<'_> {
        ZoneView {
            members: self.zone_members(zone),
            sites: &self.sites,
        }
    }

    /// The index entry of `zone` (empty if no contact is in it).
    fn zone_members(&self, zone: &str) -> &[ZoneMember] {
        self.by_zone.get(zone).map_or(&[], Vec::as_slice)
    }
}

/// The inputs of the `pooled` estimate of one MSR (SPEC §10).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EstimateInputs {
    /// `calls` of the last report (`None` before one).
    pub calls: Option<u32>,
    /// `max-calls` of the last report (0 before one).
    pub max_calls: u32,
    /// This collector's own live legs and the other hosts' sessions at
    /// that report (SPEC §10, [`crate::model::estimate`]).
    pub estimate: Estimate,
    /// The operator's performance coefficient.
    pub performance_coefficient: f64,
}

/// Selection's read access to one zone of a [`LoadTable`] (SPEC §7 steps
/// 1–4), from [`LoadTable::zone`].
///
/// Members are addressed by *position* in the zone's index, which is sorted
/// by MSR name, then contact name: each MSR's contacts are adjacent, by
/// contact name. A position is valid only with the view it came from.
/// [`ZoneView::scan`] yields the step-1 candidates with their distance and
/// an MSR identity that costs no string comparison; selection reads the
/// strings ([`ZoneView::candidate`]) only of the contacts it keeps.
#[derive(Debug, Clone, Copy)]
pub struct ZoneView<'a> {
    /// The zone's members, sorted by (MSR name, contact name).
    members: &'a [ZoneMember],
    /// The table's site numbers.
    sites: &'a SiteNames,
}

/// One step-1 candidate found by [`ZoneView::scan`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scanned {
    /// Position in the zone's index.
    pub position: usize,
    /// Distance from the leg's site to the contact's site (infinite when
    /// unset, or when the contact's site is not declared).
    pub distance: f64,
    /// Equal for the contacts of one MSR within one scan, different for
    /// different MSRs, never decreasing along the scan.
    pub msr_group: u32,
}

/// The distance from one leg's site to every site of a [`LoadTable`], by
/// site number; from [`ZoneView::distances`].
#[derive(Debug, Clone, PartialEq)]
pub struct DistanceColumn(Vec<f64>);

impl<'a> ZoneView<'a> {
    /// Number of contacts in the zone (registered or not).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the zone has no contact.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The positions of `msr`'s contacts (empty if it has none in the
    /// zone): two binary searches.
    pub fn msr_range(&self, msr: &str) -> std::ops::Range<usize> {
        let start = self.members.partition_point(|m| m.msr.as_str() < msr);
        let end = start + self.members[start..].partition_point(|m| m.msr == msr);
        start..end
    }

    /// The distance from the leg's site (`from`) to each site the table
    /// numbers: the few sites at a finite distance are resolved once, every
    /// other one is infinite.
    pub fn distances(&self, from: &SiteDistances<'_>) -> DistanceColumn {
        let mut column = vec![f64::INFINITY; self.sites.names.len()];
        for (site, distance) in from.finite() {
            if let Some(id) = self.sites.ids.get(site) {
                column[*id] = distance;
            }
        }
        DistanceColumn(column)
    }

    /// The step-1 candidates among the members at `positions` (a range of
    /// [`ZoneView::len`], e.g. a [`ZoneView::msr_range`]): registered at
    /// `now` and of an active MSR, in index order, each with its distance
    /// read from `distances` by site number.
    pub fn scan<'s>(
        &'s self,
        positions: std::ops::Range<usize>,
        now: Instant,
        distances: &'s DistanceColumn,
    ) -> impl Iterator<Item = Scanned> + 's {
        let first = positions.start;
        let members = self.members.get(positions).unwrap_or(&[]);
        let mut group = 0_u32;
        members
            .iter()
            .enumerate()
            .filter_map(move |(offset, member)| {
                if member.msr_start && offset > 0 {
                    group += 1;
                }
                if !member.passes_step_1(now) {
                    return None;
                }
                Some(Scanned {
                    position: first + offset,
                    distance: distances
                        .0
                        .get(member.site)
                        .copied()
                        .unwrap_or(f64::INFINITY),
                    msr_group: group,
                })
            })
    }

    /// The step-1 inputs of the member at `position` at `now`, whatever
    /// they are (for explain, which lists every contact of the zone).
    pub fn status(&self, position: usize, now: Instant) -> Option<MemberStatus<'a>> {
        let m = self.members.get(position)?;
        Some(MemberStatus {
            contact: &m.contact,
            msr: &m.msr,
            site: self.sites.name(m.site),
            registered: now < m.expires_at,
            active: m.msr_selection.active,
            health: m.health,
        })
    }

    /// The distance of the member at `position` from the leg's site
    /// (infinite for a position out of range).
    pub fn distance(&self, position: usize, distances: &DistanceColumn) -> f64 {
        self.members
            .get(position)
            .and_then(|m| distances.0.get(m.site).copied())
            .unwrap_or(f64::INFINITY)
    }

    /// Whether a member is registered and active at `now` but unhealthy,
    /// at a finite distance: what steps 1–3 would have kept if health were
    /// not asked for (the §5 fallback question).
    pub fn has_unhealthy_alternative(&self, now: Instant, distances: &DistanceColumn) -> bool {
        self.members.iter().any(|m| {
            now < m.expires_at
                && m.msr_selection.active
                && m.health != Health::Healthy
                && distances.0.get(m.site).is_some_and(|d| d.is_finite())
        })
    }

    /// The member at `position` as a [`Candidate`] at `now` (`None` if the
    /// position is out of range, the contact not registered at `now`, its
    /// MSR inactive or the contact unhealthy).
    pub fn candidate(&self, position: usize, now: Instant) -> Option<Candidate<'a>> {
        self.members.get(position)?.candidate(self.sites, now)
    }

    /// What the `pooled` policy's estimate reads of the member's MSR
    /// (SPEC §10); `None` for a position out of range.
    pub fn estimate_inputs(&self, position: usize) -> Option<EstimateInputs> {
        self.members.get(position).map(|m| {
            let s = &m.msr_selection;
            EstimateInputs {
                calls: s.calls,
                max_calls: s.max_calls,
                estimate: s.estimate,
                performance_coefficient: s.performance_coefficient,
            }
        })
    }

    /// The load (capped at 100; `None` before the first report) and the
    /// performance coefficient of the member's MSR: the inputs of the step-5
    /// weight. `(None, 1.0)` for a position out of range.
    pub fn weight_inputs(&self, position: usize) -> (Option<u8>, f64) {
        self.members.get(position).map_or((None, 1.0), |m| {
            (
                m.msr_selection.load,
                m.msr_selection.performance_coefficient,
            )
        })
    }
}

#[cfg(test)]
mod tests;
