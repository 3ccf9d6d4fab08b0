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
//! Step 1 also keeps only the MSRs that take the leg's offer (SPEC §15,
//! [`Query::needs`]): for each kind of media offered, one of its codecs;
//! an MSR that did not report its codecs takes anything (an older agent,
//! or a config without `<codec>`: as before §15). When step-1 candidates
//! are left but none takes the offer, the leg is refused `no_capable_msr`
//! (not `msr_not_found`: the MSRs exist, the offer is what no one takes).
//! A conference leg whose host does not take its offer is refused the
//! same way rather than put on another MSR: splitting a conference needs
//! a media bridge the core did not ask for.
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
//! Overload. With G > 1 every collector reads the same report, and in
//! overload each sends its next leg into the room the report shows: at
//! 120 % offered one leg in seven went to an MSR in fact full. While a
//! zone's own recent selections show overload
//! ([`crate::model::overload`]), `pooled` admits an MSR only while its
//! estimate plus a headroom of half a session per other host
//! (`Policy::Pooled`'s `headroom`; at most one session in 40 of the MSR,
//! and an MSR of fewer sessions keeps one for a share of the selections,
//! its sessions / 40, by the selection's own draw: [`Headroom::of`]) is
//! below its load limit; at other times the headroom is 0, so a 90 % load
//! is admitted as before.
//!
//! # A selection without a leg
//!
//! A selection that names no call (no `call_id`) binds no leg, so the
//! collector never learns its end and cannot rank by the estimate: under
//! `pooled` it falls back to §7's draw ([`Policy::EcssUnfollowed`];
//! configured `ecss` stays [`Policy::Ecss`], the seed's draw exactly).
//! Its start is still known, though, and near the top that is what
//! matters: between two reports every such selection reads the same room,
//! and in overload a leg in six went onto an MSR that the collector had
//! itself just filled (BALANCING.md, "Overload"). So a session it sends
//! to an MSR near its top counts in that MSR's estimate, G times, until a
//! report covers it ([`crate::model::estimate`], "Placements without a
//! leg"), and admission holds each MSR to the larger of its reported load
//! and that estimate (with the overload headroom, which these selections
//! also record; the legs count in it only while the core releases them,
//! as for `pooled`, or the last report's `calls` stands for them): an MSR
//! the estimate finds full is not drawn, and when none is left the leg is
//! refused `msr_overloaded`. The weights of the
//! draw stay §7's. Not knowing the ends, the estimate errs on the full
//! side until the next report; but such a leg cannot fail over (SPEC §14
//! moves a leg, and there is none), so a leg sent to a full MSR is lost,
//! and the refusal costs less: at 90 % offered (msr-sim, scenario A,
//! holding 30 s, G = 1) the draw alone lost 6.7 × the pooled limit, held
//! to the estimate 2.3 × (BALANCING.md, "Selections without a leg").

//! # The index
//!
//! [`select`] answers a plain leg with nothing failed and no offer through
//! the load table's selection index (`indexed.rs`,
//! [`LoadTable::indexed_zone`]) in O(log n) of the zone's MSRs: the same
//! contacts kept and admitted, the draw over the same weights (laid out in
//! the index's order, not by MSR name) and the least occupied with ties
//! drawn uniformly in one draw, so the same distribution as the scan.
//! Every other selection, and [`explain`], scans the zone (`steps.rs`).
//!
//! Which policy a query uses is the caller's decision (the collector falls
//! back to [`Policy::Ecss`] when the core does not release legs,
//! `admin::effective_policy`).
//!
//! Architecture invariant: pure. No clock (`now` is part of [`Query`]), no
//! socket, no RNG of its own (the caller passes one, or a fixed draw).

use msr_shared::admin::ErrorCode;
use msr_shared::engine::EngineAddresses;
use msr_shared::media::{CodecSet, Lack};

use msr_shared::present::format_number;
use rand::Rng;
use tokio::time::Instant;

use crate::model::load_table::{admission_load, draw_weight, Candidate, LoadTable, ZoneView};
pub use crate::model::overload::Headroom;
use crate::model::overload::OverloadWatch;
use crate::operator::names::{ContactName, MsrName};
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
    /// MSRs the core reported failed this leg (SPEC §14): not candidates
    /// (step 1). Empty for every first attempt, so the hot path does not
    /// look at it.
    pub failed: Vec<String>,
    /// The codecs the leg's offer carries (SPEC §15): only MSRs that take
    /// one of each offered kind are candidates (step 1). Empty: no need,
    /// selected as before §15.
    pub needs: CodecSet,
}

impl Query {
    /// Whether the core reported that `msr` failed this leg.
    pub fn has_failed(&self, msr: &str) -> bool {
        self.failed.iter().any(|f| f == msr)
    }
}

/// How a plain leg's MSR is chosen among the admitted ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// SPEC §7 step 5: the draw weighted by `(100 − load) × coefficient`.
    Ecss,
    /// The `ecss` fallback of `pooled` for a selection that names no leg
    /// (SPEC §10; module docs, "A selection without a leg"): §7's draw,
    /// with admission holding each MSR to its last report plus this
    /// collector's placements without a leg since, G times, and in
    /// overload the headroom.
    EcssUnfollowed {
        /// G, the number of core hosts placing legs on these MSRs (≥ 1).
        core_hosts: u32,
        /// Sessions of each MSR kept free for the other hosts, as for
        /// [`Policy::Pooled`].
        headroom: Headroom,
        /// Whether this collector's legs count in the estimate too: only
        /// while the core releases them, as for [`Policy::Pooled`].
        /// Without releases their count only grows (a core that never
        /// releases would soon have every MSR "full" by legs long ended),
        /// so the estimate is the last report's `calls` and the
        /// placements without a leg since.
        legs: bool,
    },
    /// SPEC §10: the lowest estimated occupancy (module docs).
    Pooled {
        /// G, the number of core hosts placing legs on these MSRs (≥ 1).
        core_hosts: u32,
        /// Sessions of each MSR kept free for the other hosts: none, or in
        /// overload ([`crate::model::overload`]) half a session per other
        /// host (module docs, "Overload").
        headroom: Headroom,
    },
}

impl Policy {
    /// `ecss` or `pooled`, as in the config file.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Ecss | Policy::EcssUnfollowed { .. } => "ecss",
            Policy::Pooled { .. } => "pooled",
        }
    }

    /// This policy for a leg of `zone`: `pooled` and its fallback with the
    /// headroom `watch` says the zone needs now (module docs, "Overload"),
    /// and in overload the selection's draw from `rng` for the MSRs too
    /// small to keep a whole session ([`Headroom::of`]). Outside overload
    /// nothing is drawn.
    pub fn in_zone<R: Rng + ?Sized>(
        self,
        zone: &str,
        watch: &OverloadWatch,
        rng: &mut R,
    ) -> Policy {
        let mut headroom = |core_hosts| match watch.headroom(zone, core_hosts) {
            0 => Headroom::NONE,
            sessions => Headroom::drawn(sessions, rng.gen()),
        };
        match self {
            Policy::Pooled { core_hosts, .. } => Policy::Pooled {
                core_hosts,
                headroom: headroom(core_hosts),
            },
            Policy::EcssUnfollowed {
                core_hosts, legs, ..
            } => Policy::EcssUnfollowed {
                core_hosts,
                headroom: headroom(core_hosts),
                legs,
            },
            Policy::Ecss => Policy::Ecss,
        }
    }

    /// G and the headroom admission holds an MSR's estimate to, for the
    /// policies whose admission reads the estimate.
    fn estimated(self) -> Option<(u32, Headroom)> {
        match self {
            Policy::Pooled {
                core_hosts,
                headroom,
            }
            | Policy::EcssUnfollowed {
                core_hosts,
                headroom,
                ..
            } => Some((core_hosts, headroom)),
            Policy::Ecss => None,
        }
    }
}

/// Counts the session a selection that names no leg sent to an MSR
/// (module docs, "A selection without a leg"): in `table`'s estimate of
/// that MSR, when `query` ran under [`Policy::EcssUnfollowed`] and chose
/// one. Whether it was counted (only near the MSR's top).
pub fn note_unfollowed(
    table: &mut LoadTable,
    query: &Query,
    outcome: &Result<Choice, Refusal>,
) -> bool {
    match (query.policy, outcome) {
        (Policy::EcssUnfollowed { .. }, Ok(choice)) => {
            table.note_unfollowed(&choice.msr, query.now)
        }
        _ => false,
    }
}

/// Records in `watch` what a plain leg's `pooled` selection (or its
/// fallback's) came to: placed or refused `msr_overloaded` (module docs,
/// "Overload"). Other outcomes and policies say nothing of overload, nor
/// does one core host's (no headroom to keep: its zone is neither in
/// overload nor logged so).
pub fn note_outcome(watch: &mut OverloadWatch, query: &Query, outcome: &Result<Choice, Refusal>) {
    let core_hosts = match (query.policy.estimated(), &query.admission) {
        (Some((core_hosts, _)), Admission::Plain) => core_hosts,
        _ => return,
    };
    if core_hosts <= 1 {
        watch.forget(&query.zone);
        return;
    }
    // A leg that names its other leg's MSR is held to that MSR alone
    // (step 2): its refusal says that one MSR is full, not the zone.
    if query.msr.is_some() {
        return;
    }
    match outcome {
        Ok(_) => {
            watch.record(&query.zone, false);
        }
        Err(Refusal::MsrOverloaded) => {
            watch.record(&query.zone, true);
        }
        Err(_) => {}
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
    pub msr: MsrName,
    /// Contact name `{iface}@{msr}`.
    pub contact: ContactName,
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
            msr: c.msr.clone(),
            contact: c.contact.clone(),
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
    /// Candidates are left after step 1 but none takes the leg's offer
    /// (SPEC §15); or the leg joins a conference whose host does not take
    /// it (`conference_host`: refused rather than split from it).
    #[error("no capable msr")]
    NoCapableMsr {
        /// What the offer needs that no candidate takes: the first kind
        /// none of them takes any offered codec of, or `None` when each
        /// kind is taken by some MSR but no MSR takes them all.
        lack: Option<Lack>,
        /// The leg's offer.
        needs: CodecSet,
        /// The conference's host was the one that lacked it.
        conference_host: bool,
    },
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
            Refusal::NoCapableMsr { .. } => ErrorCode::NoCapableMsr,
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
    if let Some(outcome) = select_indexed(table, topology, query, rng) {
        return outcome;
    }
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

mod admission;
mod explain;
mod indexed;
mod pooled;
mod steps;
use admission::*;
use explain::*;
pub use explain::{CandidateOutcome, ExplainedCandidate, Explanation, IntervalRow};
use indexed::*;
use pooled::*;
use steps::*;

#[cfg(test)]
mod tests;
