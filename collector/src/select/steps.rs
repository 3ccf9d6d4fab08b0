//! The steps of one selection (SPEC §7 steps 1–6, with §9's admission
//! between steps 4 and 5 and §10's ranking in place of the draw), shared by
//! [`super::select()`] and [`super::explain()`]: one pass over the zone's index
//! for steps 1–4, then admission, the weights, and the draw or the rule's
//! choice. [`Detail`] keeps the hot path of [`super::select()`] from writing
//! down what only an explanation shows.

use rand::Rng;

use super::*;
use crate::model::load_table::{DistanceColumn, LoadTable, Scanned, ZoneView};
use crate::operator::topology::Topology;

/// The contacts at the minimum finite distance seen so far, one per MSR
/// (the first by contact name), in index order (MSR name, then contact
/// name): steps 3 and 4, folded over one [`ZoneView::scan`].
///
/// The scan yields candidates by MSR name, then contact name, so the
/// contacts kept at the current minimum are a subsequence of that order: a
/// candidate at the minimum whose MSR is the last kept one's is a later
/// contact of that MSR, and step 4 drops it.
#[derive(Debug)]
pub(super) struct Nearest {
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
            ..
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

/// The weight of step 5 from a load and a performance coefficient:
/// `(100 − load) × coefficient`, a missing report counting as load 0.
/// Returns the load used (percent) and the weight.
pub(super) fn weight((load, performance_coefficient): (Option<u8>, f64)) -> (u8, f64) {
    draw_weight(load, performance_coefficient)
}

/// Steps 1–4 of one selection.
#[derive(Debug)]
pub(super) struct Steps<'q> {
    /// Step 2: the MSR whose contacts alone are kept, if any.
    pub(super) preferred: Option<&'q str>,
    /// Step 2: an MSR was given and had no candidate.
    pub(super) media_bridge: bool,
    /// Step 3: the minimum finite distance.
    pub(super) min_distance: Option<f64>,
    /// Step 4: one contact per MSR, positions in the zone's index
    /// (ascending, so in MSR-name order).
    pub(super) kept: Vec<usize>,
    /// Step 1 (SPEC §15): candidates at a finite distance were left out
    /// only because they lack what the offer needs; the union of the codecs
    /// they take.
    pub(super) incapable: Option<CodecSet>,
}

/// Steps 1–4 for a leg whose site is at `distances`: with a given MSR, two
/// binary searches find its contacts and only they are scanned; otherwise
/// (or when it has no candidate) one pass over the zone.
pub(super) fn steps_1_to_4<'q>(
    view: &ZoneView<'_>,
    distances: &DistanceColumn,
    query: &'q Query,
) -> Steps<'q> {
    // Step 1 also drops the MSRs that failed this leg (SPEC §14).
    let not_failed = |s: &Scanned| {
        query.failed.is_empty() || !view.msr_at(s.position).is_some_and(|m| query.has_failed(m))
    };
    // And those that do not take the offer (SPEC §15), noting what the
    // ones at a finite distance take, for the refusal's cause.
    let mut incapable: Option<CodecSet> = None;
    let mut nearest_in = |positions: std::ops::Range<usize>| {
        let mut nearest = Nearest::new();
        for scanned in view
            .scan(positions, query.now, distances)
            .filter(not_failed)
        {
            // Only a candidate `offer` would keep needs the check: one at a
            // finite distance no farther than the nearest kept so far (a
            // refusal for the offer needs no capable one at all, so the
            // union of what the others take is complete when it is read).
            if !query.needs.is_empty()
                && scanned.distance.is_finite()
                && nearest.distance.is_none_or(|min| scanned.distance <= min)
                && view.lacks(scanned.position, query.needs).is_some()
            {
                let takes = view.codecs(scanned.position).unwrap_or_default();
                incapable = Some(incapable.map_or(takes, |all| all.union(takes)));
                continue;
            }
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
                .any(|s| not_failed(&s) && view.lacks(s.position, query.needs).is_none()) =>
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
        incapable,
    }
}

/// How much of a selection [`run`] writes down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Detail {
    /// The choice only ([`select`], the hot path): [`run`] allocates only
    /// the short list of nearest contacts, their weights and the choice's
    /// strings.
    Choice,
    /// Every candidate with its outcome and the interval table
    /// ([`explain`](fn@super::explain)).
    Explanation,
}

/// One implementation for [`select`] and [`explain`](fn@super::explain).
pub(super) fn run<R: Rng + ?Sized>(
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
    let host_incapable = conference_host_incapable(&view, query);
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
        (Policy::Pooled { core_hosts, .. }, Rule::Draw) if !kept.is_empty() => {
            pooled_pick(&view, &kept, core_hosts, query.needs, &mut draw)
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
                // A contact admission or a conference rule leaves out shows
                // why, not the weight it would have had.
                match (admission, chosen) {
                    (Some(outcome), _) => {
                        c.outcome = outcome;
                        c.weight = None;
                    }
                    (None, Some(p)) if c.outcome == CandidateOutcome::Kept && p != position => {
                        c.outcome = CandidateOutcome::NotPreferred;
                        c.weight = None;
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
                    msr: c.msr.to_string(),
                    contact: c.contact.to_string(),
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

    // A conference whose host lacks the offer: the existing-conference rule
    // decided (the leg goes to its host or nowhere), so no other MSR is
    // shown as kept, and there is no interval table.
    if host_incapable.is_some() {
        explanation.rule = Rule::ExistingConference;
        explanation.threshold = None;
        explanation.intervals.clear();
        explanation.total = 0.0;
        for c in &mut explanation.candidates {
            if matches!(c.outcome, CandidateOutcome::Kept | CandidateOutcome::Full) {
                c.outcome = CandidateOutcome::NotPreferred;
                c.weight = None;
            }
        }
    }
    // Step 6, then the draw (or the conference rule's choice).
    explanation.outcome = if let Some(refusal) = host_incapable {
        Err(refusal)
    } else if kept.is_empty() && !nearest {
        if view.has_unhealthy_alternative(query.now, &distances, query.needs) {
            Err(Refusal::MsrUnhealthy)
        } else if let Some(takes) = steps.incapable {
            Err(Refusal::NoCapableMsr {
                lack: takes.lacks(query.needs),
                needs: query.needs,
                conference_host: false,
            })
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

/// A conference leg whose host (registered, in the zone) does not take its
/// offer is refused rather than split from the conference (module docs,
/// SPEC §15).
fn conference_host_incapable(view: &ZoneView<'_>, query: &Query) -> Option<Refusal> {
    if query.needs.is_empty() {
        return None;
    }
    let Admission::Conference(conference) = &query.admission else {
        return None;
    };
    let host = conference.host.as_deref()?;
    let lack = view
        .msr_range(host)
        .find_map(|position| view.lacks(position, query.needs))?;
    Some(Refusal::NoCapableMsr {
        lack: Some(lack),
        needs: query.needs,
        conference_host: true,
    })
}

/// The index of the interval `[bottom, top)` (bottoms and tops summed from
/// `weights` in order) that holds `value`, skipping empty intervals;
/// rounding can leave `value` a hair above the last top, so the last
/// non-empty interval takes it then. `None` when every weight is zero.
pub(super) fn pick(weights: &[f64], value: f64) -> Option<usize> {
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
