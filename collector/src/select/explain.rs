//! What [`super::explain()`] reports (SPEC §7): every contact of the zone
//! with the step that dropped it or the weight it kept, the interval table
//! and the rule that decided, so that an operator can replay a selection.
//! The steps themselves are [`super::steps`]'; this is what they leave
//! behind for a reader.

use std::fmt;

use super::steps::{weight, Steps};
use super::{Choice, Query, Refusal, Rule};
use crate::model::health::Health;
use crate::model::load_table::{DistanceColumn, ZoneView};
use msr_shared::media::Lack;

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
    /// Step 1: its engine is down, or cores' failures took it out (SPEC §14).
    EngineDown,
    /// Step 1: the MSR is draining (SPEC §14).
    Draining,
    /// Step 1: the core reported that this MSR failed this leg (SPEC §14).
    Failed,
    /// Step 1: the MSR does not take the leg's offer (SPEC §15): what it
    /// lacks.
    Incapable(Lack),
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
            Health::EngineDown => Some(CandidateOutcome::EngineDown),
            Health::Draining => Some(CandidateOutcome::Draining),
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
            CandidateOutcome::EngineDown => Health::EngineDown.as_str(),
            CandidateOutcome::Draining => Health::Draining.as_str(),
            CandidateOutcome::Failed => "failed",
            CandidateOutcome::Incapable(_) => "incapable",
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
    /// The step-5 weight of a contact that stays a candidate
    /// ([`CandidateOutcome::Kept`]); a dropped one has none, its outcome
    /// says why (issue 44).
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

/// What became of a step-1 candidate of MSR `msr` at `position` and
/// `distance`, given the outcome of steps 2–4: `preferred` (the MSR kept by
/// step 2, if any), the minimum distance and the positions kept by step 4
/// (ascending). A kept contact is [`CandidateOutcome::Kept`] here; the
/// caller tells a full one by its weight.
pub(super) fn outcome_of(
    msr: &str,
    position: usize,
    distance: f64,
    steps: &Steps<'_>,
) -> CandidateOutcome {
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
/// with a positive one (SPEC §7; step 1's reasons first: inactive,
/// unregistered, unhealthy).
pub(super) fn explain_member(
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
    } else if query.has_failed(status.msr) {
        CandidateOutcome::Failed
    } else if let Some(lack) = view.lacks(position, query.needs) {
        CandidateOutcome::Incapable(lack)
    } else {
        match outcome_of(status.msr, position, distance, steps) {
            CandidateOutcome::Kept => {
                let (_, w) = weight(view.weight_inputs(position));
                if w > 0.0 {
                    weight_of = Some(w);
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
