//! Media-server selection (SPEC §7), exactly:
//!
//! 1. Candidates: contacts that are registered, active, and in the leg's zone.
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
//! Choices this module makes where the SPEC is silent: an MSR with no load
//! report yet counts as load 0 (it was just subscribed; the first NOTIFY
//! follows at once); a stale report is used as it is (and flagged in
//! [`Explanation`]); a contact whose site is not declared is at infinite
//! distance.
//!
//! Architecture invariant: pure. No clock (`now` is part of [`Query`]), no
//! socket, no RNG of its own (the caller passes one, or a fixed draw).

use std::collections::BTreeMap;
use std::fmt;

use rand::Rng;
use tokio::time::Instant;

use crate::load_table::{Candidate, LoadTable};
use crate::topology::Topology;

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
    /// The time at which registrations and staleness are judged.
    pub now: Instant,
}

/// The chosen contact.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// MSR name.
    pub msr: String,
    /// Contact name `{iface}@{msr}`.
    pub contact: String,
    /// Contact URI.
    pub uri: String,
    /// An MSR was given but had no candidate: the two legs need a media
    /// bridge between their MSRs.
    pub media_bridge: bool,
    /// Distance from the leg's site to the contact's site.
    pub distance: f64,
    /// The draw, in `[0, total)`.
    pub draw: f64,
    /// Sum of the weights.
    pub total: f64,
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
}

impl Refusal {
    /// The release cause: `msr_not_found`, `msr_overloaded`, `unknown_site`.
    pub fn cause(self) -> &'static str {
        match self {
            Refusal::MsrNotFound => "msr_not_found",
            Refusal::MsrOverloaded => "msr_overloaded",
            Refusal::UnknownSite => "unknown_site",
        }
    }
}

/// A fixed draw outside `[0, total)`.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("draw {draw} is outside [0, {total})")]
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

/// At which step a candidate left the selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CandidateOutcome {
    /// It is in the interval table.
    Kept,
    /// Step 2: another MSR was given and has candidates.
    OtherMsr,
    /// Step 3: infinite distance.
    InfiniteDistance,
    /// Step 3: farther than the minimum distance.
    Farther,
    /// Step 4: its MSR already has a contact earlier by name.
    DuplicateMsr,
}

impl CandidateOutcome {
    /// Snake-case name: `kept`, `other_msr`, `infinite_distance`, `farther`,
    /// `duplicate_msr`.
    pub fn as_str(self) -> &'static str {
        match self {
            CandidateOutcome::Kept => "kept",
            CandidateOutcome::OtherMsr => "other_msr",
            CandidateOutcome::InfiniteDistance => "infinite_distance",
            CandidateOutcome::Farther => "farther",
            CandidateOutcome::DuplicateMsr => "duplicate_msr",
        }
    }
}

impl fmt::Display for CandidateOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A step-1 candidate and what became of it.
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
    /// The step that dropped it, or [`CandidateOutcome::Kept`].
    pub outcome: CandidateOutcome,
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
    /// Step 1 candidates, by contact name, with their fate.
    pub candidates: Vec<ExplainedCandidate>,
    /// Step 3: the minimum finite distance.
    pub min_distance: Option<f64>,
    /// Step 5: the interval table.
    pub intervals: Vec<IntervalRow>,
    /// Step 5: the sum of the weights.
    pub total: f64,
    /// Step 5: the draw, when one was made.
    pub draw: Option<f64>,
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
    match run(table, topology, query, Draw::Random(rng), false) {
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
    run(table, topology, query, draw, true)
}

fn run<R: Rng + ?Sized>(
    table: &LoadTable,
    topology: &Topology,
    query: &Query,
    draw: Draw<'_, R>,
    record: bool,
) -> Result<Explanation, DrawOutOfRange> {
    let mut explanation = Explanation {
        media_bridge: false,
        candidates: Vec::new(),
        min_distance: None,
        intervals: Vec::new(),
        total: 0.0,
        draw: None,
        outcome: Err(Refusal::UnknownSite),
    };
    if !topology.contains(&query.site) {
        return Ok(explanation);
    }

    // Step 1.
    let candidates: Vec<Candidate<'_>> = table.candidates_in_zone(&query.zone, query.now).collect();
    let mut outcomes = vec![CandidateOutcome::Kept; candidates.len()];

    // Step 2.
    if let Some(preferred) = query.msr.as_deref() {
        if candidates.iter().any(|c| c.msr == preferred) {
            for (c, outcome) in candidates.iter().zip(&mut outcomes) {
                if c.msr != preferred {
                    *outcome = CandidateOutcome::OtherMsr;
                }
            }
        } else {
            explanation.media_bridge = true;
        }
    }

    // Step 3.
    let distances: Vec<f64> = candidates
        .iter()
        .map(|c| {
            topology
                .distance(&query.site, c.site)
                .unwrap_or(f64::INFINITY)
        })
        .collect();
    let min_distance = candidates
        .iter()
        .zip(&outcomes)
        .zip(&distances)
        .filter(|((_, outcome), d)| **outcome == CandidateOutcome::Kept && d.is_finite())
        .map(|(_, d)| *d)
        .reduce(f64::min);
    for (outcome, d) in outcomes.iter_mut().zip(&distances) {
        if *outcome != CandidateOutcome::Kept {
            continue;
        }
        if d.is_infinite() {
            *outcome = CandidateOutcome::InfiniteDistance;
        } else if Some(*d) != min_distance {
            *outcome = CandidateOutcome::Farther;
        }
    }

    // Step 4: candidates come sorted by contact name, so the first seen wins;
    // the map orders the interval table by MSR name.
    let mut per_msr: BTreeMap<&str, usize> = BTreeMap::new();
    for (index, (c, outcome)) in candidates.iter().zip(&mut outcomes).enumerate() {
        if *outcome != CandidateOutcome::Kept {
            continue;
        }
        if per_msr.contains_key(c.msr) {
            *outcome = CandidateOutcome::DuplicateMsr;
        } else {
            per_msr.insert(c.msr, index);
        }
    }

    // Step 5.
    let mut total = 0.0_f64;
    let mut intervals = Vec::with_capacity(per_msr.len());
    for index in per_msr.values() {
        let c = &candidates[*index];
        let load = c.load.unwrap_or(0).min(100);
        let weight = f64::from(100 - load) * c.performance_coefficient;
        intervals.push(IntervalRow {
            msr: c.msr.to_owned(),
            contact: c.contact.to_owned(),
            uri: c.uri.to_owned(),
            load,
            reported: c.load.is_some(),
            stale: c.stale,
            performance_coefficient: c.performance_coefficient,
            weight,
            bottom: total,
            top: total + weight,
        });
        total += weight;
    }
    explanation.min_distance = min_distance;
    explanation.total = total;
    if record {
        explanation.candidates = candidates
            .iter()
            .zip(&outcomes)
            .zip(&distances)
            .map(|((c, outcome), d)| ExplainedCandidate {
                contact: c.contact.to_owned(),
                msr: c.msr.to_owned(),
                site: c.site.to_owned(),
                distance: *d,
                outcome: *outcome,
            })
            .collect();
    }

    // Step 6, then the draw.
    explanation.outcome = if intervals.is_empty() {
        Err(Refusal::MsrNotFound)
    } else if total <= 0.0 {
        Err(Refusal::MsrOverloaded)
    } else {
        let value = match draw {
            Draw::Random(rng) => rng.gen_range(0.0..total),
            Draw::Fixed(value) if (0.0..total).contains(&value) => value,
            Draw::Fixed(value) => return Err(DrawOutOfRange { draw: value, total }),
        };
        explanation.draw = Some(value);
        let picked = intervals
            .iter()
            .find(|row| row.weight > 0.0 && value >= row.bottom && value < row.top)
            // Rounding can leave `value` a hair above the last top.
            .or_else(|| intervals.iter().rev().find(|row| row.weight > 0.0));
        match picked {
            Some(row) => Ok(Choice {
                msr: row.msr.clone(),
                contact: row.contact.clone(),
                uri: row.uri.clone(),
                media_bridge: explanation.media_bridge,
                distance: min_distance.unwrap_or(0.0),
                draw: value,
                total,
            }),
            None => Err(Refusal::MsrOverloaded),
        }
    };
    if record {
        explanation.intervals = intervals;
    }
    Ok(explanation)
}

#[cfg(test)]
mod tests;
