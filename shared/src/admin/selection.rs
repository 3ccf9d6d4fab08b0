//! A selection's answer (SPEC §7, §9, §10): the MSR, the rule that chose it, and with `explain` every candidate and the interval table.

use serde::{Deserialize, Serialize};

use super::*;

/// Which rule chose the MSR (SPEC §7, §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SelectionRule {
    /// The §7 weighted draw.
    Draw,
    /// The MSR hosting the conference, below the existing-conference threshold.
    ExistingConference,
    /// The conference's preferred MSR below the new-conference threshold.
    NewConference,
    /// The leg's MSR again (a live leg).
    Sticky,
    /// The lowest estimated occupancy (SPEC §10, the `pooled` policy).
    Pooled,
}

/// The result of a selection (SPEC §7).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Selection {
    /// The chosen MSR.
    pub msr: String,
    /// The chosen contact `{iface}@{msr}`.
    pub contact: String,
    /// Its contact URI: the agent's address (where the collector
    /// subscribes), not where a leg goes.
    pub uri: String,
    /// The media engine's SIP URI: where the core sends the INVITE that
    /// parks the leg (SPEC §3, §7); absent when the MSR's agent reported
    /// none (then only `uri` is known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_uri: Option<String>,
    /// The engine's media-control address `host:port`, if reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcc: Option<String>,
    /// The given MSR had no candidate: a media bridge between the two MSRs
    /// is needed.
    pub media_bridge: bool,
    /// The distance from the leg's site to the contact's site: finite for
    /// a choice (§7 step 3); `infinity` only for a sticky leg (§9) whose
    /// MSR the operator has since put out of reach.
    pub distance: Distance,
    /// The draw, in `[0, total)`.
    pub draw: f64,
    /// The sum of the weights.
    pub total: f64,
    /// The rule that chose it.
    #[serde(default = "default_rule")]
    pub rule: SelectionRule,
    /// With a `call_id`: what became of the leg.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leg: Option<LegOutcome>,
    /// How the choice was made, when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explain: Option<Box<Explain>>,
}

/// How a selection was made: every step of SPEC §7.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Explain {
    /// The leg's zone.
    pub zone: String,
    /// The leg's site.
    pub site: String,
    /// The MSR given for the other leg.
    pub msr: Option<String>,
    /// Step 2: the given MSR had no candidate.
    pub media_bridge: bool,
    /// Every contact of the zone, with the step that dropped it or its
    /// weight.
    pub candidates: Vec<ExplainCandidate>,
    /// Step 3: the minimum finite distance, if any.
    pub min_distance: Option<Distance>,
    /// Step 5: the interval table, in order.
    pub intervals: Vec<Interval>,
    /// Step 5: the sum of the weights.
    pub total: f64,
    /// Step 5: the draw, when one was made.
    pub draw: Option<f64>,
    /// The rule that decided (§7 draw or a §9 conference rule).
    #[serde(default = "default_rule")]
    pub rule: SelectionRule,
    /// The threshold that rule held the MSRs to, percent of each one's
    /// load limit (conference rules).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<f64>,
    /// The leg's offer (SPEC §15), when it named one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub codecs: Vec<String>,
}

fn default_rule() -> SelectionRule {
    SelectionRule::Draw
}

/// A candidate contact and the step at which it was dropped, if it was.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExplainCandidate {
    /// Contact name.
    pub contact: String,
    /// MSR name.
    pub msr: String,
    /// The contact's site.
    pub site: String,
    /// Distance from the leg's site.
    pub distance: Distance,
    /// The contact's health (SPEC §5).
    pub health: HealthState,
    /// What became of it.
    pub outcome: ExplainOutcome,
    /// Step 5 weight, only for [`ExplainOutcome::Kept`]: a contact left
    /// out (full, over its load limit, not preferred, …) has none, its
    /// outcome says why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<f64>,
    /// For [`ExplainOutcome::Incapable`]: what its MSR lacks of the leg's
    /// offer (`video (h264)`, `audio (g729)`, `t38`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lacks: Option<String>,
}

/// What became of one contact of the zone in a selection (SPEC §7).
///
/// On the wire: the snake-case name (`kept`, `full`, `inactive`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExplainOutcome {
    /// In the interval table with a positive weight.
    Kept,
    /// Kept by steps 1–4, but its weight is 0 (load 100 or no capacity
    /// left): no interval.
    Full,
    /// Step 1: the operator set its MSR inactive.
    Inactive,
    /// Step 1: its registration lapsed.
    Unregistered,
    /// Step 1: unhealthy, no load report yet past the grace (§5).
    Unreported,
    /// Step 1: unhealthy, its subscription failed or the keepalive went
    /// unanswered (§5).
    Unreachable,
    /// Step 1: unhealthy, its last report is older than the
    /// subscription's expiry (§5).
    Stale,
    /// Step 1: unhealthy, its media engine is down or cores' failures
    /// took it out (§14).
    EngineDown,
    /// Step 1: the MSR is draining (§14).
    Draining,
    /// Step 1: the core reported that this MSR failed this leg (§14).
    Failed,
    /// Step 1: its MSR does not take the leg's offer (§15; `lacks` says
    /// what).
    Incapable,
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
    /// Admission (§9): admitted, but the conference rule chose another MSR.
    NotPreferred,
}

impl ExplainOutcome {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ExplainOutcome::Kept => "kept",
            ExplainOutcome::Full => "full",
            ExplainOutcome::Inactive => "inactive",
            ExplainOutcome::Unregistered => "unregistered",
            ExplainOutcome::Unreported => "unreported",
            ExplainOutcome::Unreachable => "unreachable",
            ExplainOutcome::Stale => "stale",
            ExplainOutcome::EngineDown => "engine_down",
            ExplainOutcome::Draining => "draining",
            ExplainOutcome::Failed => "failed",
            ExplainOutcome::Incapable => "incapable",
            ExplainOutcome::OtherMsr => "other_msr",
            ExplainOutcome::InfiniteDistance => "infinite_distance",
            ExplainOutcome::OverLoadLimit => "over_load_limit",
            ExplainOutcome::OverThreshold => "over_threshold",
            ExplainOutcome::NotPreferred => "not_preferred",
            ExplainOutcome::Farther => "farther",
            ExplainOutcome::DuplicateMsr => "duplicate_msr",
        }
    }
}

/// One row of the interval table (SPEC §7 step 5): an MSR with a positive
/// weight (a full one is listed among the candidates, not here).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// MSR name.
    pub msr: String,
    /// The contact kept for it.
    pub contact: String,
    /// Load in percent used for the weight (0 when no report yet).
    pub load: u8,
    /// Whether a load report exists.
    pub reported: bool,
    /// The report is stale.
    pub stale: bool,
    /// Performance coefficient.
    pub performance_coefficient: f64,
    /// `(100 − load) × performance_coefficient`.
    pub weight: f64,
    /// Lower bound (inclusive).
    pub bottom: f64,
    /// Upper bound (exclusive), `bottom + weight`.
    pub top: f64,
}
