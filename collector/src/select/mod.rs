//! Media-server selection (SPEC §7), exactly:
//!
//! 1. Candidates: contacts that are registered, active, healthy (SPEC §5)
//!    and in the leg's zone.
//! 2. If an MSR was given and at least one candidate belongs to it, keep only
//!    its contacts; otherwise keep all and report that a media bridge between
//!    the two MSRs is needed.
//! 3. Rank by the distance between the leg's site and the contact's site; drop
//!    infinity; keep only the contacts at the minimum distance.
//! 4. Keep one contact per MSR (the first by contact name).
//! 5. Weight = (100 − load) × performance coefficient; intervals
//!    `[bottom, bottom + weight)` in MSR-name order; draw uniformly in
//!    `[0, total)`; take the MSR whose interval holds the draw.
//! 6. Nothing left → `msr_not_found`; every weight zero → `msr_overloaded`;
//!    an undeclared leg site → `unknown_site`.
//!
//! Admission (SPEC §9), between steps 4 and 5, by the leg's [`Admission`]:
//!
//! * a plain leg: MSRs at or above their load limit are dropped (with the
//!   default limit of 100 % this is §7 exactly: such an MSR's weight is 0);
//! * a leg of a conference that has live legs: the MSR hosting it, if it is
//!   still a candidate and below the existing-conference threshold (a
//!   fraction of its load limit), without a draw;
//! * otherwise (a new conference, or its host over the threshold or gone):
//!   the MSRs below the new-conference threshold, and among them the first
//!   in the conference's own preference order (rendezvous hashing of the
//!   conference id over the MSR names, [`rendezvous_score`]), so every
//!   collector of a cluster puts one conference on the same MSR;
//! * nothing admitted → `msr_overloaded`, and the explanation names the rule.
//!
//! The fallback of SPEC §5 when no healthy candidate is left but unhealthy
//! ones are (registered, active, at a finite distance): the leg is refused
//! with `msr_unhealthy`, never placed on an unhealthy MSR. An unhealthy MSR
//! is most often dead or cut off; a leg placed there fails only when its
//! INVITE times out (RFC 3261 Timer B, 32 s), while a refusal at once lets
//! the core take its own fallback (another cluster, an announcement), and
//! the distinct cause tells the operator that MSRs exist but are failing.
//!
//! Choices this module makes where the SPEC is silent: an MSR with no load
//! report yet counts as load 0 (it was just subscribed; the first NOTIFY
//! follows at once); a stale report is used as it is (and flagged in
//! [`Explanation`]); a contact whose site is not declared is at infinite
//! distance.
//!
//! # The `pooled` policy (SPEC §10)
//!
//! With [`Policy::Pooled`] a plain leg is not drawn: after steps 1–4 and
//! admission, each admitted MSR's sessions are estimated as this
//! collector's own live legs on it (known exactly, SPEC §9) plus the other
//! G − 1 core hosts' part, taken from the last report's `calls` at its
//! sample time and moved since as this collector's own legs moved
//! ([`crate::model::estimate`] gives the model), and the MSR with the
//! lowest estimated occupancy `estimate / max-calls` is taken, ties at
//! random (uniformly, one draw per tie).
//!
//! Capacity. SPEC §10 names the capacity `max-calls` × performance
//! coefficient. In §7 the coefficient turns a percentage of free load into
//! an absolute size; `max-calls` already is the absolute size, so
//! multiplying by the coefficient as well counts an MSR's size twice: in
//! scenario B of BALANCING.md (MSRs of 100 to 400 sessions, coefficients 1
//! to 4) the big MSRs then still rank first when full (400 / 1600 < 26 /
//! 100) and about 12 % of the calls are lost at G = 1 and 3 where this
//! policy loses none (`msr-sim run --scenario b --offered 85 --policy
//! pooled-literal`, BALANCING.md "The capacity in the estimate"). The capacity
//! is therefore `max-calls` alone; the coefficient acts through §7 (and
//! the `ecss` fallback), and an operator who wants an MSR to take less sets
//! its load limit. An MSR without a report yet ranks
//! last (its capacity is unknown; it gets a leg only when every admitted
//! MSR is unreported, e.g. just after a restart).
//!
//! The estimate also admits (SPEC §10): a plain leg goes only to an MSR
//! whose estimated occupancy is below its load limit, so an MSR that
//! reported 100 % but on which this collector released legs since is
//! selectable again, and when every candidate is at or over capacity by
//! the estimate the leg is refused `msr_overloaded` (SPEC §7 step 6, §10)
//! rather than sent to an MSR believed full: the core fails fast instead
//! of learning it from the MSR one round trip later. With G = 1 the
//! estimate is this collector's own count and nearly exact; with G > 1 its
//! error is the other hosts' movement since the last report, which the
//! agent keeps short near the top (it reports every change of `calls`
//! above its high-water mark, SPEC §4). An MSR without a report is
//! admitted on its reported load as in §7 (0) and ranks last.
//! Conference legs keep their §9 rules under either policy.
//!
//! Which policy a query uses is the caller's decision (the collector falls
//! back to [`Policy::Ecss`] when the core does not release legs,
//! `admin::effective_policy`).
//!
//! Architecture invariant: pure. No clock (`now` is part of [`Query`]), no
//! socket, no RNG of its own (the caller passes one, or a fixed draw).

use msr_shared::admin::ErrorCode;
use msr_shared::engine::EngineAddresses;
use std::fmt;

use msr_shared::present::format_number;
use rand::Rng;
use tokio::time::Instant;

use crate::model::health::Health;
use crate::model::load_table::{Candidate, DistanceColumn, LoadTable, Scanned, ZoneView};
use crate::operator::topology::Topology;

/// One selection request: the leg's zone and site, and the MSR chosen for
/// the other leg of the call, if any.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    /// The leg's zone (SPEC §6); selection never crosses zones.
    pub zone: String,
    /// The leg's site; must be declared.
    pub site: String,
    /// The MSR already anchoring the other leg.
    pub msr: Option<String>,
    /// What the leg is held to beyond §7 (SPEC §9).
    pub admission: Admission,
    /// How the admitted MSRs of a plain leg are ranked (SPEC §7, §10).
    pub policy: Policy,
    /// The time at which registrations and staleness are judged.
    pub now: Instant,
}

/// How a plain leg's MSR is chosen among the admitted ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// SPEC §7 step 5: the draw weighted by `(100 − load) × coefficient`.
    Ecss,
    /// SPEC §10: the lowest estimated occupancy (module docs).
    Pooled {
        /// G, the number of core hosts placing legs on these MSRs (≥ 1).
        core_hosts: u32,
    },
}

impl Policy {
    /// `ecss` or `pooled`, as in the config file.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Ecss => "ecss",
            Policy::Pooled { .. } => "pooled",
        }
    }
}

/// What a leg is held to beyond §7 (SPEC §9, module docs).
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// A plain leg (no conference): each MSR's load limit.
    Plain,
    /// A leg of a conference.
    Conference(ConferenceAdmission),
}

/// A conference leg's admission (SPEC §9).
#[derive(Debug, Clone, PartialEq)]
pub struct ConferenceAdmission {
    /// The conference (or space) id.
    pub id: String,
    /// The MSR hosting its live legs; `None` for a new conference.
    pub host: Option<String>,
    /// The host takes the leg below this fraction of its load limit (0.8).
    pub existing_threshold: f64,
    /// Any MSR takes a new conference below this fraction (0.5).
    pub new_threshold: f64,
}

/// Which rule chose the MSR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// §7 step 5: the weighted draw.
    Draw,
    /// §9: the conference's host, below the existing-conference threshold.
    ExistingConference,
    /// §9: the first in the conference's preference order below the
    /// new-conference threshold.
    NewConference,
    /// §10: the lowest estimated occupancy (`pooled` policy).
    Pooled,
}

impl Rule {
    /// Snake-case name: `draw`, `existing_conference`, `new_conference`.
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::Draw => "draw",
            Rule::ExistingConference => "existing_conference",
            Rule::NewConference => "new_conference",
            Rule::Pooled => "pooled",
        }
    }
}

/// The conference's preference for `msr` (rendezvous, "highest random
/// weight" hashing): FNV-1a over the conference id, a separator and the MSR
/// name. Specified here, not taken from a hasher that may change between
/// builds, so that every collector of a cluster ranks MSRs alike.
pub fn rendezvous_score(conference: &str, msr: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    for byte in conference.bytes().chain([0xff]).chain(msr.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(PRIME);
    }
    // FNV's last bytes mix poorly into the high bits: finish like
    // splitmix64 so close names still spread.
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^ (hash >> 33)
}

/// The chosen contact.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// MSR name.
    pub msr: String,
    /// Contact name `{iface}@{msr}`.
    pub contact: String,
    /// Contact URI (the agent's).
    pub uri: String,
    /// The media engine's addresses: where the core parks the leg (SPEC §3).
    pub engine: Option<EngineAddresses>,
    /// An MSR was given but had no candidate: the two legs need a media
    /// bridge between their MSRs.
    pub media_bridge: bool,
    /// Distance from the leg's site to the contact's site.
    pub distance: f64,
    /// The draw, in `[0, total)`.
    pub draw: f64,
    /// Sum of the weights.
    pub total: f64,
    /// The rule that chose it.
    pub rule: Rule,
}

impl Choice {
    /// The choice of candidate `c` (the strings copied once, here) by
    /// `rule`, with the draw and total it was made with (0 without a draw).
    fn of(
        c: &Candidate<'_>,
        media_bridge: bool,
        min_distance: Option<f64>,
        (draw, total): (f64, f64),
        rule: Rule,
    ) -> Choice {
        Choice {
            msr: c.msr.to_owned(),
            contact: c.contact.to_owned(),
            uri: c.uri.to_owned(),
            engine: c.engine,
            media_bridge,
            distance: min_distance.unwrap_or(0.0),
            draw,
            total,
            rule,
        }
    }
}

/// Why a leg gets no MSR (SPEC §7 step 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No candidate is left after steps 1–4.
    #[error("msr not found")]
    MsrNotFound,
    /// Every remaining MSR is at 100 % load.
    #[error("msr overloaded")]
    MsrOverloaded,
    /// The leg's site is not declared.
    #[error("unknown site")]
    UnknownSite,
    /// No healthy candidate is left, but registered, active contacts at a
    /// finite distance are, all unhealthy (the SPEC §5 fallback: refuse).
    #[error("msr unhealthy")]
    MsrUnhealthy,
}

impl Refusal {
    /// The refusal's cause as every front end names it (SPEC §7):
    /// `msr_not_found`, `msr_overloaded`, `unknown_site`, `msr_unhealthy`.
    pub fn code(self) -> ErrorCode {
        match self {
            Refusal::MsrNotFound => ErrorCode::MsrNotFound,
            Refusal::MsrOverloaded => ErrorCode::MsrOverloaded,
            Refusal::UnknownSite => ErrorCode::UnknownSite,
            Refusal::MsrUnhealthy => ErrorCode::MsrUnhealthy,
        }
    }
}

/// A fixed draw outside `[0, total)`.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("draw {} is outside [0, {})", format_number(*draw), format_number(*total))]
pub struct DrawOutOfRange {
    /// The requested draw.
    pub draw: f64,
    /// The total of the interval table.
    pub total: f64,
}

/// Where the draw of step 5 comes from.
#[derive(Debug)]
pub enum Draw<'r, R: ?Sized> {
    /// Uniform in `[0, total)` from this generator.
    Random(&'r mut R),
    /// This value (must be in `[0, total)`); reproduces a draw.
    Fixed(f64),
}

/// At which step a contact of the zone left the selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CandidateOutcome {
    /// It is in the interval table, with a positive weight.
    Kept,
    /// Kept by steps 1–4, but its weight is 0: no interval.
    Full,
    /// Step 1: its MSR is inactive.
    Inactive,
    /// Step 1: not registered.
    Unregistered,
    /// Step 1: registered, no load report yet, past the grace (SPEC §5).
    Unreported,
    /// Step 1: the subscription failed or the keepalive went unanswered.
    Unreachable,
    /// Step 1: the last report is older than the subscription's expiry.
    Stale,
    /// Step 2: another MSR was given and has candidates.
    OtherMsr,
    /// Step 3: infinite distance.
    InfiniteDistance,
    /// Step 3: farther than the minimum distance.
    Farther,
    /// Step 4: its MSR already has a contact earlier by name.
    DuplicateMsr,
    /// Admission (§9): at or above its MSR's load limit.
    OverLoadLimit,
    /// Admission (§9): at or above the conference threshold that applied.
    OverThreshold,
    /// Admission (§9): below the threshold, but the conference rule chose
    /// another MSR.
    NotPreferred,
}

impl CandidateOutcome {
    /// Step 1's outcome for a contact whose health is `health`; `None`
    /// when it is healthy, which drops no contact.
    pub fn unhealthy(health: Health) -> Option<CandidateOutcome> {
        match health {
            Health::Healthy => None,
            Health::Unreported => Some(CandidateOutcome::Unreported),
            Health::Unreachable => Some(CandidateOutcome::Unreachable),
            Health::Stale => Some(CandidateOutcome::Stale),
        }
    }

    /// Snake-case name: `kept`, `full`, `inactive`, `unregistered`, the
    /// health (`unreported`, `unreachable`, `stale`), `other_msr`,
    /// `infinite_distance`, `farther`, `duplicate_msr`.
    pub fn as_str(self) -> &'static str {
        match self {
            CandidateOutcome::Kept => "kept",
            CandidateOutcome::Full => "full",
            CandidateOutcome::Inactive => "inactive",
            CandidateOutcome::Unregistered => "unregistered",
            CandidateOutcome::Unreported => Health::Unreported.as_str(),
            CandidateOutcome::Unreachable => Health::Unreachable.as_str(),
            CandidateOutcome::Stale => Health::Stale.as_str(),
            CandidateOutcome::OtherMsr => "other_msr",
            CandidateOutcome::InfiniteDistance => "infinite_distance",
            CandidateOutcome::Farther => "farther",
            CandidateOutcome::DuplicateMsr => "duplicate_msr",
            CandidateOutcome::OverLoadLimit => "over_load_limit",
            CandidateOutcome::OverThreshold => "over_threshold",
            CandidateOutcome::NotPreferred => "not_preferred",
        }
    }
}

impl fmt::Display for CandidateOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A contact of the zone and what became of it.
#[derive(Debug, Clone, PartialEq)]
pub struct ExplainedCandidate {
    /// Contact name.
    pub contact: String,
    /// MSR name.
    pub msr: String,
    /// The contact's site.
    pub site: String,
    /// Distance from the leg's site (infinite when unset or undeclared).
    pub distance: f64,
    /// Its health (SPEC §5).
    pub health: Health,
    /// The step that dropped it, or [`CandidateOutcome::Kept`] /
    /// [`CandidateOutcome::Full`].
    pub outcome: CandidateOutcome,
    /// The step-5 weight of a kept or full contact.
    pub weight: Option<f64>,
}

/// One row of the interval table (step 5).
#[derive(Debug, Clone, PartialEq)]
pub struct IntervalRow {
    /// MSR name.
    pub msr: String,
    /// The contact kept for it (step 4).
    pub contact: String,
    /// Contact URI.
    pub uri: String,
    /// Load used, percent (0 when no report yet).
    pub load: u8,
    /// A load report exists.
    pub reported: bool,
    /// The report is stale (used as it is).
    pub stale: bool,
    /// Performance coefficient.
    pub performance_coefficient: f64,
    /// `(100 − load) × performance_coefficient`.
    pub weight: f64,
    /// Inclusive lower bound.
    pub bottom: f64,
    /// Exclusive upper bound.
    pub top: f64,
}

/// Every step of one selection, and its outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Explanation {
    /// Step 2: an MSR was given and had no candidate.
    pub media_bridge: bool,
    /// Every contact of the zone, by contact name, with its fate.
    pub candidates: Vec<ExplainedCandidate>,
    /// Step 3: the minimum finite distance.
    pub min_distance: Option<f64>,
    /// Step 5: the interval table (MSRs with a positive weight).
    pub intervals: Vec<IntervalRow>,
    /// Step 5: the sum of the weights.
    pub total: f64,
    /// Step 5: the draw, when one was made.
    pub draw: Option<f64>,
    /// The rule that decided (or, on a refusal, the one nothing passed).
    pub rule: Rule,
    /// The threshold that rule held the MSRs to, percent of each one's load
    /// limit (`None` for the draw: the load limit itself).
    pub threshold: Option<f64>,
    /// The choice or the refusal.
    pub outcome: Result<Choice, Refusal>,
}

/// Selects an MSR contact for a leg (SPEC §7) with a draw from `rng`.
///
/// # Errors
/// [`Refusal`] with the §7 cause.
pub fn select<R: Rng + ?Sized>(
    table: &LoadTable,
    topology: &Topology,
    query: &Query,
    rng: &mut R,
) -> Result<Choice, Refusal> {
    match run(table, topology, query, Draw::Random(rng), Detail::Choice) {
        Ok(explanation) => explanation.outcome,
        // A random draw is always in range; this arm is never taken.
        Err(_) => Err(Refusal::MsrNotFound),
    }
}

/// Like [`select`], returning every step: candidates and their fate,
/// distances, the interval table and the draw.
///
/// # Errors
/// [`DrawOutOfRange`] when a fixed draw is outside `[0, total)` (only
/// checked when there is an interval table to draw from).
pub fn explain<R: Rng + ?Sized>(
    table: &LoadTable,
    topology: &Topology,
    query: &Query,
    draw: Draw<'_, R>,
) -> Result<Explanation, DrawOutOfRange> {
    run(table, topology, query, draw, Detail::Explanation)
}

/// The contacts at the minimum finite distance seen so far, one per MSR
/// (the first by contact name), in index order (MSR name, then contact
/// name): steps 3 and 4, folded over one [`ZoneView::scan`].
///
/// The scan yields candidates by MSR name, then contact name, so the
/// contacts kept at the current minimum are a subsequence of that order: a
/// candidate at the minimum whose MSR is the last kept one's is a later
/// contact of that MSR, and step 4 drops it.
#[derive(Debug)]
struct Nearest {
    /// The minimum finite distance seen so far.
    distance: Option<f64>,
    /// The contacts at that distance, one per MSR: (position, MSR group).
    kept: Vec<(usize, u32)>,
}

impl Nearest {
    fn new() -> Self {
        Self {
            distance: None,
            kept: Vec::new(),
        }
    }

    /// Offers a scanned candidate. The minimum is folded with `f64::min` in
    /// scan order, exactly as a `reduce(f64::min)` over all finite distances
    /// would be, and the kept contacts are those whose distance `==` it, the
    /// first of each MSR; a new minimum restarts the list.
    #[inline]
    fn offer(&mut self, scanned: Scanned) {
        let Scanned {
            position,
            distance,
            msr_group,
        } = scanned;
        if distance.is_infinite() {
            return;
        }
        match self.distance {
            Some(min) if distance > min => {}
            Some(min) if distance == min => {
                // Step 4: a later contact of the last kept MSR.
                if self.kept.last().is_some_and(|(_, g)| *g == msr_group) {
                    return;
                }
                self.kept.push((position, msr_group));
            }
            _ => {
                self.distance = Some(self.distance.map_or(distance, |min| min.min(distance)));
                self.kept.clear();
                self.kept.push((position, msr_group));
            }
        }
    }
}

/// What became of a step-1 candidate of MSR `msr` at `position` and
/// `distance`, given the outcome of steps 2–4: `preferred` (the MSR kept by
/// step 2, if any), the minimum distance and the positions kept by step 4
/// (ascending). A kept contact is [`CandidateOutcome::Kept`] here; the
/// caller tells a full one by its weight.
fn outcome_of(msr: &str, position: usize, distance: f64, steps: &Steps<'_>) -> CandidateOutcome {
    if steps.preferred.is_some_and(|given| msr != given) {
        CandidateOutcome::OtherMsr
    } else if distance.is_infinite() {
        CandidateOutcome::InfiniteDistance
    } else if Some(distance) != steps.min_distance {
        CandidateOutcome::Farther
    } else if steps.kept.binary_search(&position).is_ok() {
        CandidateOutcome::Kept
    } else {
        CandidateOutcome::DuplicateMsr
    }
}

/// What became of the contact at `position`, and its weight when kept
/// (SPEC §7; step 1's reasons first: inactive, unregistered, unhealthy).
fn explain_member(
    view: &ZoneView<'_>,
    position: usize,
    distances: &DistanceColumn,
    query: &Query,
    steps: &Steps<'_>,
) -> Option<ExplainedCandidate> {
    let status = view.status(position, query.now)?;
    let distance = view.distance(position, distances);
    let mut weight_of = None;
    let outcome = if !status.active {
        CandidateOutcome::Inactive
    } else if !status.registered {
        CandidateOutcome::Unregistered
    } else if let Some(unhealthy) = CandidateOutcome::unhealthy(status.health) {
        unhealthy
    } else {
        match outcome_of(status.msr, position, distance, steps) {
            CandidateOutcome::Kept => {
                let (_, w) = weight(view.weight_inputs(position));
                weight_of = Some(w);
                if w > 0.0 {
                    CandidateOutcome::Kept
                } else {
                    CandidateOutcome::Full
                }
            }
            other => other,
        }
    };
    Some(ExplainedCandidate {
        contact: status.contact.to_owned(),
        msr: status.msr.to_owned(),
        site: status.site.to_owned(),
        distance,
        health: status.health,
        outcome,
        weight: weight_of,
    })
}

/// The weight of step 5 from a load and a performance coefficient:
/// `(100 − load) × coefficient`, a missing report counting as load 0.
/// Returns the load used (percent) and the weight.
fn weight((load, performance_coefficient): (Option<u8>, f64)) -> (u8, f64) {
    let load = load.unwrap_or(0).min(100);
    (load, f64::from(100 - load) * performance_coefficient)
}

/// Steps 1–4 of one selection.
#[derive(Debug)]
struct Steps<'q> {
    /// Step 2: the MSR whose contacts alone are kept, if any.
    preferred: Option<&'q str>,
    /// Step 2: an MSR was given and had no candidate.
    media_bridge: bool,
    /// Step 3: the minimum finite distance.
    min_distance: Option<f64>,
    /// Step 4: one contact per MSR, positions in the zone's index
    /// (ascending, so in MSR-name order).
    kept: Vec<usize>,
}

/// Steps 1–4 for a leg whose site is at `distances`: with a given MSR, two
/// binary searches find its contacts and only they are scanned; otherwise
/// (or when it has no candidate) one pass over the zone.
fn steps_1_to_4<'q>(
    view: &ZoneView<'_>,
    distances: &DistanceColumn,
    query: &'q Query,
) -> Steps<'q> {
    let nearest_in = |positions: std::ops::Range<usize>| {
        let mut nearest = Nearest::new();
        for scanned in view.scan(positions, query.now, distances) {
            nearest.offer(scanned);
        }
        nearest
    };
    let wanted = query.msr.as_deref();
    // Step 2: the given MSR wins if it has a step-1 candidate at all (at
    // any distance, infinite included).
    let own = wanted.map(|msr| (msr, view.msr_range(msr)));
    let (preferred, media_bridge, nearest) = match own {
        Some((msr, range))
            if view
                .scan(range.clone(), query.now, distances)
                .next()
                .is_some() =>
        {
            (Some(msr), false, nearest_in(range))
        }
        _ => (None, wanted.is_some(), nearest_in(0..view.len())),
    };
    Steps {
        preferred,
        media_bridge,
        min_distance: nearest.distance,
        kept: nearest
            .kept
            .into_iter()
            .map(|(position, _)| position)
            .collect(),
    }
}

/// How much of a selection [`run`] writes down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Detail {
    /// The choice only ([`select`], the hot path): [`run`] allocates only
    /// the short list of nearest contacts, their weights and the choice's
    /// strings.
    Choice,
    /// Every candidate with its outcome and the interval table
    /// ([`explain`]).
    Explanation,
}

/// One implementation for [`select`] and [`explain`].
fn run<R: Rng + ?Sized>(
    table: &LoadTable,
    topology: &Topology,
    query: &Query,
    mut draw: Draw<'_, R>,
    detail: Detail,
) -> Result<Explanation, DrawOutOfRange> {
    let mut explanation = Explanation {
        media_bridge: false,
        candidates: Vec::new(),
        min_distance: None,
        intervals: Vec::new(),
        total: 0.0,
        draw: None,
        rule: Rule::Draw,
        threshold: None,
        outcome: Err(Refusal::UnknownSite),
    };
    let Some(from) = topology.distances_from(&query.site) else {
        return Ok(explanation);
    };
    let view = table.zone(&query.zone);
    let distances = view.distances(&from);
    let steps = steps_1_to_4(&view, &distances, query);
    explanation.media_bridge = steps.media_bridge;
    let min_distance = steps.min_distance;
    let nearest = !steps.kept.is_empty();
    let Admitted {
        kept,
        dropped,
        rule,
        threshold,
        chosen,
    } = admit(&view, query, steps.kept.clone());
    // §10: the `pooled` policy ranks a plain leg's admitted MSRs instead of
    // the draw (module docs).
    let pooled = match (query.policy, rule) {
        (Policy::Pooled { core_hosts }, Rule::Draw) if !kept.is_empty() => {
            pooled_pick(&view, &kept, core_hosts, &mut draw)
        }
        _ => None,
    };
    let rule = if pooled.is_some() { Rule::Pooled } else { rule };
    explanation.rule = rule;
    explanation.threshold = threshold;

    // Step 5: the interval table, in MSR-name order.
    let weights: Vec<f64> = kept
        .iter()
        .map(|&position| weight(view.weight_inputs(position)).1)
        .collect();
    let total = weights.iter().fold(0.0_f64, |total, w| total + w);
    explanation.min_distance = min_distance;
    explanation.total = total;
    if detail == Detail::Explanation {
        let mut candidates: Vec<ExplainedCandidate> = (0..view.len())
            .filter_map(|position| {
                let mut c = explain_member(&view, position, &distances, query, &steps)?;
                // Admission's verdict on the nearest contacts (SPEC §9).
                let admission = dropped
                    .iter()
                    .find(|(p, _)| *p == position)
                    .map(|(_, o)| *o);
                match (admission, chosen) {
                    (Some(outcome), _) => c.outcome = outcome,
                    (None, Some(p)) if c.outcome == CandidateOutcome::Kept && p != position => {
                        c.outcome = CandidateOutcome::NotPreferred;
                    }
                    _ => {}
                }
                Some(c)
            })
            .collect();
        // The index yields them by MSR, then contact; explain lists them by
        // contact name (names are unique).
        candidates.sort_unstable_by(|a, b| a.contact.cmp(&b.contact));
        explanation.candidates = candidates;
        let mut bottom = 0.0_f64;
        // A full MSR (weight 0) has no interval: it is shown as `full` among
        // the candidates instead of as an empty `[b, b)`.
        explanation.intervals = kept
            .iter()
            // `pooled` draws nothing: no interval table.
            .filter(|_| pooled.is_none())
            .filter_map(|&position| view.candidate(position, query.now))
            .filter(|c| weight((c.load, c.performance_coefficient)).1 > 0.0)
            .map(|c| {
                let (load, weight) = weight((c.load, c.performance_coefficient));
                let row = IntervalRow {
                    msr: c.msr.to_owned(),
                    contact: c.contact.to_owned(),
                    uri: c.uri.to_owned(),
                    load,
                    reported: c.load.is_some(),
                    stale: c.stale,
                    performance_coefficient: c.performance_coefficient,
                    weight,
                    bottom,
                    top: bottom + weight,
                };
                bottom += weight;
                row
            })
            .collect();
    }

    // Step 6, then the draw (or the conference rule's choice).
    explanation.outcome = if kept.is_empty() && !nearest {
        if view.has_unhealthy_alternative(query.now, &distances) {
            Err(Refusal::MsrUnhealthy)
        } else {
            Err(Refusal::MsrNotFound)
        }
    } else if kept.is_empty() {
        // Candidates, but admission left none: every one is full for this leg.
        Err(Refusal::MsrOverloaded)
    } else if let Some(position) = chosen {
        match view.candidate(position, query.now) {
            Some(c) => Ok(Choice::of(
                &c,
                explanation.media_bridge,
                min_distance,
                (0.0, total),
                rule,
            )),
            None => Err(Refusal::MsrNotFound),
        }
    } else if let Some(i) = pooled {
        match view.candidate(kept[i], query.now) {
            Some(c) => Ok(Choice::of(
                &c,
                explanation.media_bridge,
                min_distance,
                (0.0, 0.0),
                Rule::Pooled,
            )),
            None => Err(Refusal::MsrNotFound),
        }
    } else if total <= 0.0 {
        Err(Refusal::MsrOverloaded)
    } else if !total.is_finite() {
        // Unreachable with validated coefficients (operator.rs bounds them);
        // a store written by hand must still never make the draw panic.
        Err(Refusal::MsrNotFound)
    } else {
        let value = match draw {
            Draw::Random(rng) => rng.gen_range(0.0..total),
            Draw::Fixed(value) if (0.0..total).contains(&value) => value,
            Draw::Fixed(value) => return Err(DrawOutOfRange { draw: value, total }),
        };
        explanation.draw = Some(value);
        match pick(&weights, value).and_then(|i| view.candidate(kept[i], query.now)) {
            Some(c) => Ok(Choice::of(
                &c,
                explanation.media_bridge,
                min_distance,
                (value, total),
                Rule::Draw,
            )),
            None => Err(Refusal::MsrOverloaded),
        }
    };
    Ok(explanation)
}

/// The index of the interval `[bottom, top)` (bottoms and tops summed from
/// `weights` in order) that holds `value`, skipping empty intervals;
/// rounding can leave `value` a hair above the last top, so the last
/// non-empty interval takes it then. `None` when every weight is zero.
fn pick(weights: &[f64], value: f64) -> Option<usize> {
    let mut bottom = 0.0_f64;
    let mut last = None;
    for (i, &weight) in weights.iter().enumerate() {
        let top = bottom + weight;
        if weight > 0.0 {
            if value >= bottom && value < top {
                return Some(i);
            }
            last = Some(i);
        }
        bottom += weight;
    }
    last
}

mod admission;
mod pooled;
use admission::*;
use pooled::*;

#[cfg(test)]
mod tests;
