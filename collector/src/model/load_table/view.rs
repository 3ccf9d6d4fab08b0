//! What readers see of the table: the rows of the control protocol's lists
//! at a given `now`, and [`ZoneView`], the slice of one zone that
//! selection scans (the zone index's invariant is the parent module's).

use super::*;
use msr_shared::event_package::Service;

/// One row of the table as seen at a given `now` (SPEC §5).
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceRow {
    /// The collector holding the row.
    pub node: String,
    /// Contact name `{iface}@{msr}`.
    pub contact: ContactName,
    /// MSR name.
    pub msr: MsrName,
    /// Contact URI.
    pub uri: String,
    /// The media engine's addresses (SPEC §3), if reported.
    pub engine: Option<EngineAddresses>,
    /// Performance coefficient of the MSR.
    pub performance_coefficient: f64,
    /// Admin active flag of the MSR.
    pub active: bool,
    /// The contact's zone.
    pub zone: ZoneName,
    /// The contact's site.
    pub site: SiteName,
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
    pub contact: &'a ContactName,
    /// MSR name.
    pub msr: &'a MsrName,
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
    pub msr: MsrName,
    /// At least one contact is registered at `now`.
    pub registered: bool,
    /// Operator settings in effect.
    pub settings: MsrSettings,
    /// `Healthy` when a registered contact is, else the health of the
    /// first registered contact by name, with since when; `None` without a
    /// registered contact.
    pub health: Option<(Health, Option<(Instant, i64)>)>,
}

impl LoadTable {
    /// Whether `msr` has a contact in the table: it registered, and its
    /// binding has not ended. An MSR that only has operator settings has
    /// none.
    pub fn has_contacts(&self, msr: &str) -> bool {
        self.msrs
            .get(msr)
            .is_some_and(|entry| !entry.contacts.is_empty())
    }

    /// Whether `contact` (`lo@msr_1`) is in the table: registered, its
    /// binding not ended.
    pub fn has_contact(&self, contact: &str) -> bool {
        self.contacts.contains_key(contact)
    }

    /// Whether any contact in the table currently carries `site`.
    pub fn site_in_use(&self, site: &str) -> bool {
        self.contacts.values().any(|c| c.site == site)
    }

    /// What a drain (SPEC §14) reads of `msr`: whether its agent reports
    /// it draining (its last report says `service: draining`, or a
    /// contact's health is `draining`), and the calls of its last report;
    /// `None` for an MSR not in the table. The report counts on its own:
    /// an agent leaving after its drain ends its subscription first, and
    /// its health turns `unreachable` before its binding goes.
    pub fn drain_inputs(&self, msr: &str) -> Option<(bool, Option<u32>)> {
        let entry = self.msrs.get(msr)?;
        let reported = entry
            .load
            .as_ref()
            .is_some_and(|(report, _)| report.service == Service::Draining);
        let draining = reported
            || entry.contacts.iter().any(|c| {
                self.contacts
                    .get(c)
                    .is_some_and(|c| c.health == Health::Draining)
            });
        Some((
            draining,
            entry.load.as_ref().map(|(report, _)| report.calls),
        ))
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
            engine: m.engine.as_deref().copied(),
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
                    engine: m.engine.as_deref().copied(),
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

    /// The zones that hold at least one contact, sorted (for a refusal
    /// that names a zone without any).
    pub fn zone_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .by_zone
            .iter()
            .filter(|(_, members)| !members.is_empty())
            .map(|(zone, _)| zone.as_str())
            .collect();
        names.sort_unstable();
        names
    }

    /// The index entry of `zone` (empty if no contact is in it).
    pub(super) fn zone_members(&self, zone: &str) -> &[ZoneMember] {
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

impl EstimateInputs {
    /// Of an MSR's selection values.
    pub(super) fn of(s: &MsrSelection) -> Self {
        EstimateInputs {
            calls: s.calls,
            max_calls: s.max_calls,
            estimate: s.estimate,
            performance_coefficient: s.performance_coefficient,
        }
    }

    /// The estimated occupancy with `core_hosts` core hosts (SPEC §10):
    /// the estimated sessions ([`crate::model::estimate`]) over the MSR's
    /// `max-calls`; infinite without a report or with no capacity, so such
    /// an MSR ranks last. The one definition, for the scan and the index.
    #[inline]
    pub fn occupancy(&self, core_hosts: u32) -> f64 {
        if self.calls.is_none() {
            return f64::INFINITY;
        }
        // The capacity is the MSR's own `max-calls`: the coefficient is not
        // multiplied in again (`select` module docs, "Capacity").
        let capacity = f64::from(self.max_calls);
        if capacity <= 0.0 {
            return f64::INFINITY;
        }
        self.estimate.sessions(core_hosts) / capacity
    }

    /// The occupancy of the last report's `calls` and this collector's
    /// placements without a leg since, G times: the estimate of `pooled`'s
    /// fallback while the core releases no legs (whose count then only
    /// grows). Infinite as [`EstimateInputs::occupancy`].
    #[inline]
    pub fn reported_occupancy(&self, core_hosts: u32) -> f64 {
        let Some(calls) = self.calls else {
            return f64::INFINITY;
        };
        let capacity = f64::from(self.max_calls);
        if capacity <= 0.0 {
            return f64::INFINITY;
        }
        let unfollowed = f64::from(core_hosts.max(1)) * f64::from(self.estimate.unfollowed);
        (f64::from(calls) + unfollowed) / capacity
    }
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
    pub(super) members: &'a [ZoneMember],
    /// The table's site numbers.
    pub(super) sites: &'a SiteNames,
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
pub struct DistanceColumn(pub(super) Vec<f64>);

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

    /// The MSR of the member at `position`.
    pub fn msr_at(&self, position: usize) -> Option<&'a str> {
        self.members.get(position).map(|m| m.msr.as_str())
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
    pub fn has_unhealthy_alternative(
        &self,
        now: Instant,
        distances: &DistanceColumn,
        needs: CodecSet,
    ) -> bool {
        self.members.iter().any(|m| {
            now < m.expires_at
                && m.msr_selection.active
                && m.health != Health::Healthy
                && m.lacks(needs).is_none()
                && distances.0.get(m.site).is_some_and(|d| d.is_finite())
        })
    }

    /// What the member at `position` lacks for a leg offering `needs`
    /// (SPEC §15); `None`: it can take the leg (or did not say what it
    /// takes, or the position is out of range).
    #[inline]
    pub fn lacks(&self, position: usize, needs: CodecSet) -> Option<Lack> {
        self.members.get(position)?.lacks(needs)
    }

    /// The codecs the member at `position`'s MSR reported (SPEC §15).
    pub fn codecs(&self, position: usize) -> Option<CodecSet> {
        self.members.get(position)?.msr_selection.codecs.reported()
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
        self.members
            .get(position)
            .map(|m| EstimateInputs::of(&m.msr_selection))
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
