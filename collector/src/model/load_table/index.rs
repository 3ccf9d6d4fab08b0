//! The selection index (issue 46): per zone and contact site, the MSRs a
//! plain leg can go to there, kept by both policies' keys, so that the
//! common selection — a plain leg with nothing failed and no offer named,
//! SPEC §7 steps 1–5 with §9's load limit and §10's ranking — costs
//! O(log n) instead of a scan of the zone.
//!
//! A *tier* is the zone's members at one contact site. Its *units* are
//! the MSRs with a contact there that passes the timeless part of step 1
//! (active, healthy), each by its first such contact by name: what step 4
//! keeps of that MSR when the site is the nearest. Each unit holds one
//! leaf of a sum-and-minimum tree:
//!
//! * the `ecss` weight `(100 − load) × coefficient` (SPEC §7 step 5), 0
//!   when the MSR is at or over its load limit (§9 drops it), so a draw in
//!   `[0, total)` descends to a unit in O(log n);
//! * the `pooled` key, the estimated occupancy (SPEC §10) with G core
//!   hosts, or no key when the estimate does not admit the MSR, so the
//!   least occupied and the number tied at it are at the root, and the
//!   r-th tied unit is one descent away.
//!
//! A unit's leaf changes only on an event about its MSR (a report, a
//! placement, an end, a setting), which re-keys its few units; a unit
//! comes or goes on a binding, health or setting change. The registration
//! expiry is the one input that moves with `now` alone: each zone keeps the
//! earliest expiry of its indexed contacts, and the index answers only
//! before it (the scan, which judges every contact at `now`, answers
//! after, until the registrar removes the lapsed binding).
//!
//! Internal sums are recomputed from their two children on every change,
//! never adjusted by differences, so no rounding accumulates however long
//! the table lives.
//!
//! What the index leaves to the scan: a leg with a failed list, an offer,
//! a conference, a named MSR that has a candidate, a nearest distance
//! shared by several sites when an MSR of the zone has units at more than
//! one site (step 4 would have to compare them), a zone with a lapsed
//! contact, and a `pooled` query whose G is not the index's.

use std::collections::BTreeSet;

use super::*;

/// A unit's place in its tier's tree.
type Slot = u32;

/// The most sites one nearest distance may have for the index to answer;
/// past it the scan does (an operator's topology rarely has more than a
/// handful of sites at one distance from a leg's).
const MAX_NEAREST_SITES: usize = 8;

/// The weight of SPEC §7 step 5: `(100 − load) × coefficient`, a missing
/// report counting as load 0. Returns the load used (percent) and the
/// weight. The one definition, for the scan and the index alike.
#[inline]
pub fn draw_weight(load: Option<u8>, performance_coefficient: f64) -> (u8, f64) {
    let load = load.unwrap_or(0).min(100);
    (load, f64::from(100 - load) * performance_coefficient)
}

/// The load, percent, that SPEC §9's load limit is held against for a
/// plain leg: under `pooled` (`occupancy` given) the estimated occupancy
/// when it is known (SPEC §10: legs released since a report of 100 % leave
/// room, an MSR full by the estimate takes none), else the reported load
/// (0 without a report).
#[inline]
pub fn admission_load(occupancy: Option<f64>, load: Option<u8>) -> f64 {
    match occupancy {
        Some(occupancy) if occupancy.is_finite() => occupancy * 100.0,
        _ => f64::from(load.unwrap_or(0).min(100)),
    }
}

/// One node of a tier's tree: over the leaves below it, the sum of the
/// `ecss` weights, the least `pooled` key and how many leaves have it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Node {
    sum: f64,
    min: f64,
    ties: u32,
}

/// A free slot: no weight, no key.
const EMPTY: Node = Node {
    sum: 0.0,
    min: f64::INFINITY,
    ties: 0,
};

impl Node {
    /// The leaf of an MSR whose selection values are `s`, with `core_hosts`
    /// core hosts (module docs).
    fn leaf(s: &MsrSelection, core_hosts: u32) -> Node {
        let limit = f64::from(s.load_limit);
        let (load, weight) = draw_weight(s.load, s.performance_coefficient);
        let sum = if f64::from(load) < limit { weight } else { 0.0 };
        let occupancy = EstimateInputs::of(s).occupancy(core_hosts);
        let admitted = admission_load(Some(occupancy), s.load) < limit;
        Node {
            sum,
            min: if admitted { occupancy } else { f64::INFINITY },
            ties: u32::from(admitted),
        }
    }

    fn join(a: Node, b: Node) -> Node {
        let (min, ties) = if a.min < b.min {
            (a.min, a.ties)
        } else if b.min < a.min {
            (b.min, b.ties)
        } else {
            (a.min, a.ties + b.ties)
        };
        Node {
            sum: a.sum + b.sum,
            min,
            ties,
        }
    }
}

/// A complete binary tree over a tier's slots: leaves at `cap..2 × cap`,
/// node `i`'s children at `2i` and `2i + 1`, the root at 1.
#[derive(Debug, Clone)]
struct Tree {
    nodes: Vec<Node>,
}

impl Default for Tree {
    fn default() -> Self {
        Tree {
            nodes: vec![EMPTY; 2],
        }
    }
}

impl Tree {
    fn cap(&self) -> usize {
        self.nodes.len() / 2
    }

    fn root(&self) -> Node {
        self.nodes.get(1).copied().unwrap_or(EMPTY)
    }

    /// Sets the leaf of `slot`, growing the tree to hold it, and the nodes
    /// above it.
    fn set(&mut self, slot: Slot, leaf: Node) {
        let slot = slot as usize;
        if slot >= self.cap() {
            self.grow(slot + 1);
        }
        let mut i = self.cap() + slot;
        self.nodes[i] = leaf;
        while i > 1 {
            i /= 2;
            self.nodes[i] = Node::join(self.nodes[2 * i], self.nodes[2 * i + 1]);
        }
    }

    /// Doubles the capacity until `slots` fit, keeping the leaves.
    fn grow(&mut self, slots: usize) {
        let old = self.cap();
        let cap = slots.next_power_of_two().max(1);
        let mut nodes = vec![EMPTY; 2 * cap];
        nodes[cap..cap + old].copy_from_slice(&self.nodes[old..2 * old]);
        for i in (1..cap).rev() {
            nodes[i] = Node::join(nodes[2 * i], nodes[2 * i + 1]);
        }
        self.nodes = nodes;
    }

    /// The slot whose interval holds `value` in `[0, root sum)`, intervals
    /// laid out in slot order; always a slot of positive weight (rounding
    /// can leave `value` a hair above a subtree's sum: the last positive
    /// interval takes it, as in the scan's `pick`).
    fn weighted(&self, mut value: f64) -> Slot {
        let cap = self.cap();
        let mut i = 1;
        while i < cap {
            let (left, right) = (self.nodes[2 * i], self.nodes[2 * i + 1]);
            if value < left.sum || right.sum <= 0.0 {
                i *= 2;
            } else {
                value -= left.sum;
                i = 2 * i + 1;
            }
        }
        Slot::try_from(i - cap).unwrap_or(Slot::MAX)
    }

    /// The `r`-th slot (from 0, in slot order) whose key is the root's least.
    fn tied(&self, mut r: u32) -> Slot {
        let cap = self.cap();
        let min = self.root().min;
        let mut i = 1;
        while i < cap {
            let left = self.nodes[2 * i];
            if left.ties > 0 && left.min == min {
                if r < left.ties {
                    i *= 2;
                    continue;
                }
                r -= left.ties;
            }
            i = 2 * i + 1;
        }
        Slot::try_from(i - cap).unwrap_or(Slot::MAX)
    }
}

/// An MSR in a tier: its first active, healthy contact at the tier's site.
#[derive(Debug, Clone, PartialEq)]
struct Unit {
    msr: MsrName,
    contact: ContactName,
}

/// The units of one zone at one site, and their tree.
#[derive(Debug, Clone, Default)]
struct Tier {
    /// By slot; `None` for a free slot.
    units: Vec<Option<Unit>>,
    /// Free slots, reused first.
    free: Vec<Slot>,
    /// Units in `units`.
    live: usize,
    tree: Tree,
}

impl Tier {
    fn insert(&mut self, unit: Unit, leaf: Node) -> Slot {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.units.push(None);
                Slot::try_from(self.units.len() - 1).unwrap_or(Slot::MAX)
            }
        };
        if let Some(place) = self.units.get_mut(slot as usize) {
            *place = Some(unit);
        }
        self.live += 1;
        self.tree.set(slot, leaf);
        slot
    }

    fn remove(&mut self, slot: Slot) {
        if let Some(place) = self.units.get_mut(slot as usize) {
            if place.take().is_some() {
                self.live -= 1;
                self.free.push(slot);
                self.tree.set(slot, EMPTY);
            }
        }
    }

    fn unit(&self, slot: Slot) -> Option<&Unit> {
        self.units.get(slot as usize)?.as_ref()
    }
}

/// One MSR's units in a zone.
#[derive(Debug, Clone, PartialEq)]
struct MsrUnits {
    /// `(site, slot)` of each unit.
    units: Vec<(SiteId, Slot)>,
    /// The earliest registration expiry of its indexed contacts.
    expires: Instant,
}

/// The index of one zone.
#[derive(Debug, Clone, Default)]
pub(super) struct ZoneIndex {
    /// By site number.
    tiers: Vec<Tier>,
    /// The MSRs with a unit, and where.
    msrs: HashMap<MsrName, MsrUnits>,
    /// `(expiry, MSR)` of each MSR in `msrs`: the first is when the index
    /// stops answering (module docs).
    expiries: BTreeSet<(Instant, MsrName)>,
    /// MSRs with units at more than one site.
    multi_site: usize,
}

impl ZoneIndex {
    /// Recomputes `msr`'s units from `members` (the zone's list, already
    /// changed), re-keying those that stay.
    fn sync(&mut self, members: &[ZoneMember], msr: &MsrName, core_hosts: u32) {
        let start = members.partition_point(|m| m.msr.as_str() < msr.as_str());
        let end = start + members[start..].partition_point(|m| m.msr == *msr);
        // The first active, healthy contact per site, by contact name.
        let mut wanted: Vec<(SiteId, &ZoneMember)> = Vec::new();
        let mut expires: Option<Instant> = None;
        for m in &members[start..end] {
            if !(m.msr_selection.active && m.health == Health::Healthy) {
                continue;
            }
            expires = Some(expires.map_or(m.expires_at, |e| e.min(m.expires_at)));
            if !wanted.iter().any(|(site, _)| *site == m.site) {
                wanted.push((m.site, m));
            }
        }
        // A report, a placement or an end: the same units, re-keyed in place.
        if let Some(old) = self.msrs.get(msr) {
            let same = Some(old.expires) == expires
                && old.units.len() == wanted.len()
                && old.units.iter().zip(&wanted).all(|((a, _), (b, _))| a == b);
            if same {
                for (&(site, slot), (_, member)) in old.units.iter().zip(&wanted) {
                    if let Some(tier) = self.tiers.get_mut(site) {
                        if let Some(Some(unit)) = tier.units.get_mut(slot as usize) {
                            if unit.contact != member.contact {
                                unit.contact = member.contact.clone();
                            }
                        }
                        tier.tree
                            .set(slot, Node::leaf(&member.msr_selection, core_hosts));
                    }
                }
                return;
            }
        }
        let old = self.msrs.remove(msr);
        if let Some(old) = &old {
            self.expiries.remove(&(old.expires, msr.clone()));
            if old.units.len() > 1 {
                self.multi_site -= 1;
            }
            // Units at sites it no longer has.
            for &(site, slot) in &old.units {
                if !wanted.iter().any(|(s, _)| *s == site) {
                    if let Some(tier) = self.tiers.get_mut(site) {
                        tier.remove(slot);
                    }
                }
            }
        }
        let Some(expires) = expires else {
            return;
        };
        let mut units = Vec::with_capacity(wanted.len());
        for (site, member) in wanted {
            if self.tiers.len() <= site {
                self.tiers.resize_with(site + 1, Tier::default);
            }
            let tier = &mut self.tiers[site];
            let leaf = Node::leaf(&member.msr_selection, core_hosts);
            let kept = old
                .as_ref()
                .and_then(|o| o.units.iter().find(|(s, _)| *s == site))
                .map(|&(_, slot)| slot);
            let slot = match kept {
                Some(slot) => {
                    if let Some(Some(unit)) = tier.units.get_mut(slot as usize) {
                        if unit.contact != member.contact {
                            unit.contact = member.contact.clone();
                        }
                    }
                    tier.tree.set(slot, leaf);
                    slot
                }
                None => tier.insert(
                    Unit {
                        msr: msr.clone(),
                        contact: member.contact.clone(),
                    },
                    leaf,
                ),
            };
            units.push((site, slot));
        }
        if units.len() > 1 {
            self.multi_site += 1;
        }
        self.expiries.insert((expires, msr.clone()));
        self.msrs.insert(msr.clone(), MsrUnits { units, expires });
    }

    /// Whether every indexed contact is still registered at `now`.
    fn valid_at(&self, now: Instant) -> bool {
        self.expiries.first().is_none_or(|(first, _)| now < *first)
    }
}

/// The selection index of every zone (module docs).
#[derive(Debug, Clone)]
pub(super) struct SelectionIndex {
    zones: HashMap<ZoneName, ZoneIndex>,
    /// G of the `pooled` keys.
    core_hosts: u32,
}

impl Default for SelectionIndex {
    fn default() -> Self {
        Self {
            zones: HashMap::new(),
            core_hosts: 1,
        }
    }
}

impl SelectionIndex {
    /// Recomputes `msr`'s units in `zone`, whose list is `members` (empty
    /// when the zone has none any more).
    pub(super) fn sync(&mut self, zone: &ZoneName, members: &[ZoneMember], msr: &MsrName) {
        let core_hosts = self.core_hosts;
        match self.zones.get_mut(zone) {
            Some(index) => {
                index.sync(members, msr, core_hosts);
                if index.msrs.is_empty() {
                    self.zones.remove(zone);
                }
            }
            None => {
                let mut index = ZoneIndex::default();
                index.sync(members, msr, core_hosts);
                if !index.msrs.is_empty() {
                    self.zones.insert(zone.clone(), index);
                }
            }
        }
    }

    /// Re-keys `msr`'s units in `zone` for its new selection values `s`
    /// (a change that leaves its units where they are).
    pub(super) fn rekey(&mut self, zone: &str, msr: &str, s: &MsrSelection) {
        let Some(ZoneIndex { tiers, msrs, .. }) = self.zones.get_mut(zone) else {
            return;
        };
        let Some(units) = msrs.get(msr) else {
            return;
        };
        let leaf = Node::leaf(s, self.core_hosts);
        for &(site, slot) in &units.units {
            if let Some(tier) = tiers.get_mut(site) {
                tier.tree.set(slot, leaf);
            }
        }
    }

    /// The index of every zone rebuilt from `by_zone`.
    pub(super) fn rebuild(&mut self, by_zone: &HashMap<ZoneName, Vec<ZoneMember>>) {
        self.zones.clear();
        for (zone, members) in by_zone {
            let mut index = ZoneIndex::default();
            for (i, m) in members.iter().enumerate() {
                if m.msr_start || i == 0 {
                    index.sync(members, &m.msr, self.core_hosts);
                }
            }
            if !index.msrs.is_empty() {
                self.zones.insert(zone.clone(), index);
            }
        }
    }

    /// Re-keys every unit for `core_hosts` core hosts.
    pub(super) fn set_core_hosts(
        &mut self,
        core_hosts: u32,
        by_zone: &HashMap<ZoneName, Vec<ZoneMember>>,
    ) {
        let core_hosts = core_hosts.max(1);
        if core_hosts != self.core_hosts {
            self.core_hosts = core_hosts;
            self.rebuild(by_zone);
        }
    }

    /// Panics unless the index is what a rebuild from `by_zone` gives:
    /// the same units at the same sites with the same leaves, every tree
    /// node the join of its children, and the zone's expiries and counts.
    #[cfg(test)]
    pub(super) fn check(&self, by_zone: &HashMap<ZoneName, Vec<ZoneMember>>) {
        let mut fresh = SelectionIndex {
            zones: HashMap::new(),
            core_hosts: self.core_hosts,
        };
        fresh.rebuild(by_zone);
        assert_eq!(
            self.zones.keys().collect::<BTreeSet<_>>(),
            fresh.zones.keys().collect::<BTreeSet<_>>(),
            "indexed zones"
        );
        for (zone, index) in &self.zones {
            let want = &fresh.zones[zone];
            assert_eq!(index.canonical(), want.canonical(), "zone {zone}");
            assert_eq!(index.expiries, want.expiries, "zone {zone}");
            assert_eq!(index.multi_site, want.multi_site, "zone {zone}");
            for tier in &index.tiers {
                let cap = tier.tree.cap();
                assert!(tier.units.len() <= cap);
                for i in 1..cap {
                    let joined = Node::join(tier.tree.nodes[2 * i], tier.tree.nodes[2 * i + 1]);
                    assert_eq!(tier.tree.nodes[i], joined, "zone {zone}: node {i}");
                }
                for (slot, unit) in tier.units.iter().enumerate() {
                    if unit.is_none() {
                        assert_eq!(tier.tree.nodes[cap + slot], EMPTY);
                    }
                }
                let live = tier.units.iter().filter(|u| u.is_some()).count();
                assert_eq!(tier.live, live);
                assert_eq!(tier.free.len(), tier.units.len() - live);
            }
        }
    }
}

impl ZoneIndex {
    /// Every unit of the zone as `(MSR, site, contact, leaf)`, sorted: what
    /// must not depend on the order the changes came in.
    #[cfg(test)]
    fn canonical(&self) -> Vec<(String, SiteId, String, Node)> {
        let mut all = Vec::new();
        for (msr, units) in &self.msrs {
            for &(site, slot) in &units.units {
                let tier = &self.tiers[site];
                let unit = tier.unit(slot).expect("an indexed unit");
                assert_eq!(&unit.msr, msr);
                let leaf = tier.tree.nodes[tier.tree.cap() + slot as usize];
                all.push((msr.to_string(), site, unit.contact.to_string(), leaf));
            }
        }
        all.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        all
    }
}

/// The tiers at the minimum distance from a leg's site, as the index
/// answers for a plain leg with nothing failed and no offer
/// ([`IndexedZone::nearest`]): the contacts SPEC §7 steps 1–4 keep, one
/// per MSR, each with its §9 admission and both policies' keys.
#[derive(Debug, Clone)]
pub struct NearestTiers<'a> {
    tiers: [Option<&'a Tier>; MAX_NEAREST_SITES],
    /// The minimum distance.
    distance: f64,
    /// G of the `pooled` keys.
    core_hosts: u32,
    /// The zone (for the chosen unit's position and candidate).
    view: ZoneView<'a>,
}

impl<'a> NearestTiers<'a> {
    fn each(&self) -> impl Iterator<Item = &'a Tier> + '_ {
        self.tiers.iter().map_while(|t| *t)
    }

    /// The minimum distance (SPEC §7 step 3).
    pub fn distance(&self) -> f64 {
        self.distance
    }

    /// G of the `pooled` keys: a `pooled` query with another G is not the
    /// index's to answer.
    pub fn core_hosts(&self) -> u32 {
        self.core_hosts
    }

    /// The sum of the `ecss` weights of the admitted MSRs (SPEC §7 step
    /// 5, §9).
    pub fn total_weight(&self) -> f64 {
        self.each()
            .fold(0.0, |total, tier| total + tier.tree.root().sum)
    }

    /// The position in the zone's view of the contact whose interval holds
    /// `value` in `[0, total_weight())`; `None` should the index and the
    /// zone's list disagree, which the index's invariant rules out.
    pub fn weighted(&self, mut value: f64) -> Option<usize> {
        let mut last = None;
        for tier in self.each() {
            let sum = tier.tree.root().sum;
            if sum <= 0.0 {
                continue;
            }
            if value < sum {
                return self.position(tier, tier.tree.weighted(value));
            }
            value -= sum;
            last = Some(tier);
        }
        // Rounding past the last interval: the last one takes it.
        let tier = last?;
        self.position(tier, tier.tree.weighted(tier.tree.root().sum))
    }

    /// The least estimated occupancy among the admitted MSRs (SPEC §10)
    /// and how many have it; `(∞, 0)` when none is admitted.
    pub fn least_occupied(&self) -> (f64, u32) {
        let mut best = (f64::INFINITY, 0_u32);
        for tier in self.each() {
            let root = tier.tree.root();
            if root.ties == 0 {
                continue;
            }
            if root.min < best.0 || best.1 == 0 {
                best = (root.min, root.ties);
            } else if root.min == best.0 {
                best.1 += root.ties;
            }
        }
        best
    }

    /// The position of the `r`-th (from 0) of the MSRs tied at the least
    /// estimated occupancy.
    pub fn tied(&self, mut r: u32) -> Option<usize> {
        let (min, _) = self.least_occupied();
        for tier in self.each() {
            let root = tier.tree.root();
            if root.ties == 0 || root.min != min {
                continue;
            }
            if r < root.ties {
                return self.position(tier, tier.tree.tied(r));
            }
            r -= root.ties;
        }
        None
    }

    /// Every unit of these tiers as `(position, ecss weight, pooled key)`
    /// by position, the key `None` when the estimate does not admit it.
    #[cfg(test)]
    pub(crate) fn units(&self) -> Vec<(usize, f64, Option<f64>)> {
        let mut all = Vec::new();
        for tier in self.each() {
            let cap = tier.tree.cap();
            for (slot, unit) in tier.units.iter().enumerate() {
                let Some(unit) = unit else { continue };
                let leaf = tier.tree.nodes[cap + slot];
                let position =
                    member_position(self.view.members, &unit.msr, &unit.contact).expect("indexed");
                all.push((position, leaf.sum, (leaf.ties > 0).then_some(leaf.min)));
            }
        }
        all.sort_by_key(|u| u.0);
        all
    }

    /// The zone's view, in which [`NearestTiers::weighted`] and
    /// [`NearestTiers::tied`] give positions.
    pub fn view(&self) -> &ZoneView<'a> {
        &self.view
    }

    fn position(&self, tier: &Tier, slot: Slot) -> Option<usize> {
        let unit = tier.unit(slot)?;
        member_position(self.view.members, &unit.msr, &unit.contact).ok()
    }
}

/// A zone whose index answers at a given `now` ([`LoadTable::indexed_zone`]).
#[derive(Debug, Clone)]
pub struct IndexedZone<'a> {
    index: &'a ZoneIndex,
    /// The zone's members.
    members: &'a [ZoneMember],
    /// The table's site numbers.
    sites: &'a SiteNames,
    core_hosts: u32,
    media_bridge: bool,
}

impl LoadTable {
    /// The index of `zone` for a plain leg with nothing failed and no
    /// offer named, whose other leg is on `msr` (if any), at `now`: `None`
    /// when the index cannot answer exactly (module docs), and when `msr`
    /// has a candidate in the zone (SPEC §7 step 2 keeps its contacts
    /// alone: the scan of its few is the answer). Checked before anything
    /// else is looked up, so a leg the scan answers pays little for it.
    pub fn indexed_zone(
        &self,
        zone: &str,
        msr: Option<&str>,
        now: Instant,
    ) -> Option<IndexedZone<'_>> {
        let index = self.index.zones.get(zone)?;
        if !index.valid_at(now) {
            return None;
        }
        // Every active, healthy contact of the zone is registered at `now`
        // (the check above): an MSR with a candidate here has units.
        let media_bridge = match msr {
            Some(msr) if index.msrs.contains_key(msr) => return None,
            Some(_) => true,
            None => false,
        };
        Some(IndexedZone {
            index,
            members: self.zone_members(zone),
            sites: &self.sites,
            core_hosts: self.index.core_hosts,
            media_bridge,
        })
    }
}

impl<'a> IndexedZone<'a> {
    /// An MSR was given and has no candidate in the zone (SPEC §7 step 2).
    pub fn media_bridge(&self) -> bool {
        self.media_bridge
    }

    /// SPEC §7 steps 1–4 for a leg at the site `from` measures from: the
    /// tiers at the minimum finite distance. `None` when no contact of the
    /// zone is at a finite distance (the scan names the refusal), or when
    /// several sites are at it and the index cannot answer (module docs).
    pub fn nearest(&self, from: &SiteDistances<'_>) -> Option<NearestTiers<'a>> {
        let index = self.index;
        let mut nearest = NearestTiers {
            tiers: [None; MAX_NEAREST_SITES],
            distance: f64::INFINITY,
            core_hosts: self.core_hosts,
            view: ZoneView {
                members: self.members,
                sites: self.sites,
            },
        };
        let (mut count, mut overflow) = (0, false);
        for (site, distance) in from.finite() {
            let Some(tier) = self
                .sites
                .ids
                .get(site)
                .and_then(|id| index.tiers.get(*id))
                .filter(|tier| tier.live > 0)
            else {
                continue;
            };
            if distance < nearest.distance {
                nearest.distance = distance;
                nearest.tiers = [None; MAX_NEAREST_SITES];
                nearest.tiers[0] = Some(tier);
                (count, overflow) = (1, false);
            } else if distance == nearest.distance {
                match nearest.tiers.get_mut(count) {
                    Some(place) => {
                        *place = Some(tier);
                        count += 1;
                    }
                    None => overflow = true,
                }
            }
        }
        // Step 4 across sites compares an MSR's contacts at each: the
        // index keeps them apart, so it answers for several sites only
        // when no MSR of the zone has units at two.
        let answers = count == 1 || (count > 1 && !overflow && index.multi_site == 0);
        answers.then_some(nearest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(sum: f64, min: f64) -> Node {
        Node {
            sum,
            min,
            ties: u32::from(min.is_finite()),
        }
    }

    #[test]
    fn the_tree_draws_by_weight_and_finds_every_tie() {
        let mut tree = Tree::default();
        for (slot, (w, k)) in [
            (1.0, 0.5),
            (0.0, 0.2),
            (2.0, 0.2),
            (3.0, f64::INFINITY),
            (0.5, 0.2),
        ]
        .into_iter()
        .enumerate()
        {
            tree.set(slot as Slot, leaf(w, k));
        }
        assert_eq!(tree.root().sum, 6.5);
        assert_eq!((tree.root().min, tree.root().ties), (0.2, 3));
        assert_eq!(tree.weighted(0.0), 0);
        assert_eq!(tree.weighted(0.999), 0);
        assert_eq!(tree.weighted(1.0), 2, "the empty interval is skipped");
        assert_eq!(tree.weighted(3.0), 3);
        assert_eq!(tree.weighted(6.4), 4);
        assert_eq!(tree.weighted(6.5), 4, "past the end: the last one");
        assert_eq!([0, 1, 2].map(|r| tree.tied(r)), [1, 2, 4]);
        tree.set(2, EMPTY);
        assert_eq!((tree.root().sum, tree.root().ties), (4.5, 2));
        assert_eq!(tree.weighted(1.0), 3);
        assert_eq!([0, 1].map(|r| tree.tied(r)), [1, 4]);
    }
}
