//! Admission (SPEC §9): which of the kept candidates may take the leg —
//! the load limit, the conference thresholds and affinity — before a
//! policy picks among them.

use super::*;

/// The load admission holds the MSR at `position` (candidate `c`) to
/// against its load limit under a policy that reads the estimate: `pooled`
/// the estimated occupancy with `headroom` (the reported load without a
/// report), its fallback the larger of that and the reported load.
#[inline]
pub(super) fn estimated_load(
    view: &ZoneView<'_>,
    position: usize,
    policy: Policy,
    core_hosts: u32,
    headroom: Headroom,
    c: &Candidate<'_>,
) -> f64 {
    let occupancy = match policy {
        // The legs count only while the core releases them (`legs`).
        Policy::EcssUnfollowed { legs: false, .. } => {
            held_occupancy(view, position, headroom, c.load_limit, |inputs| {
                inputs.reported_occupancy(core_hosts)
            })
        }
        _ => admitted_occupancy(view, position, core_hosts, headroom, c.load_limit),
    };
    let load = admission_load(Some(occupancy), c.load);
    match policy {
        Policy::EcssUnfollowed { .. } => load.max(admission_load(None, c.load)),
        _ => load,
    }
}

/// What admission (module docs) made of the nearest contacts.
#[derive(Debug)]
pub(super) struct Admitted {
    /// The positions that may take the leg (ascending): the interval table.
    pub(super) kept: Vec<usize>,
    /// The positions admission dropped, and why.
    pub(super) dropped: Vec<(usize, CandidateOutcome)>,
    /// The rule that applies.
    pub(super) rule: Rule,
    /// Its threshold, percent of the load limit (conference rules).
    pub(super) threshold: Option<f64>,
    /// A conference rule's choice (no draw).
    pub(super) chosen: Option<usize>,
}

/// A nearest contact as admission sees it: position, MSR, load and load
/// limit (percent).
type Load<'a> = (usize, &'a str, f64, f64);

/// Admission between steps 4 and 5 (SPEC §9; module docs) over the
/// nearest contacts `kept`, one per MSR.
pub(super) fn admit(view: &ZoneView<'_>, query: &Query, kept: Vec<usize>) -> Admitted {
    let conference = match &query.admission {
        // The hot path: a filter in place, no list of loads.
        Admission::Plain => {
            let mut dropped = Vec::new();
            let mut kept = kept;
            kept.retain(|&p| {
                let Some(c) = view.candidate(p, query.now) else {
                    return false;
                };
                // §10: under `pooled` the estimate, not only the last
                // report, admits (`admission_load`); under its fallback
                // the larger of the two (module docs, "A selection
                // without a leg").
                let load = match query.policy.estimated() {
                    Some((core_hosts, headroom)) => {
                        estimated_load(view, p, query.policy, core_hosts, headroom, &c)
                    }
                    None => admission_load(None, c.load),
                };
                if load < f64::from(c.load_limit) {
                    return true;
                }
                // Full on the estimate alone: a headroom (overload) keeps
                // free sessions an MSR has, it does not fill it.
                let full = match query.policy.estimated() {
                    Some((core_hosts, headroom)) if headroom.keeps() => {
                        estimated_load(view, p, query.policy, core_hosts, Headroom::NONE, &c)
                    }
                    _ => load,
                };
                let outcome = if full >= 100.0 {
                    CandidateOutcome::Full
                } else {
                    CandidateOutcome::OverLoadLimit
                };
                dropped.push((p, outcome));
                false
            });
            return Admitted {
                kept,
                dropped,
                rule: Rule::Draw,
                threshold: None,
                chosen: None,
            };
        }
        Admission::Conference(c) => c,
    };
    // No report counts as load 0, as in §7.
    let loads: Vec<Load<'_>> = kept
        .iter()
        .filter_map(|&p| {
            let c = view.candidate(p, query.now)?;
            let load = f64::from(c.load.unwrap_or(0).min(100));
            Some((p, c.msr.as_str(), load, f64::from(c.load_limit)))
        })
        .collect();
    // Its host, while below the existing-conference threshold.
    let host = conference.host.as_deref().and_then(|host| {
        loads.iter().find(|(_, msr, load, limit)| {
            *msr == host && *load < conference.existing_threshold * limit
        })
    });
    if let Some(&(position, ..)) = host {
        return Admitted {
            kept,
            dropped: Vec::new(),
            rule: Rule::ExistingConference,
            threshold: Some(conference.existing_threshold * 100.0),
            chosen: Some(position),
        };
    }
    // A new conference (or its host over the threshold, or gone).
    let (eligible, over): (Vec<&Load<'_>>, Vec<&Load<'_>>) = loads
        .iter()
        .partition(|(_, _, load, limit)| *load < conference.new_threshold * limit);
    let chosen = eligible
        .iter()
        .max_by_key(|(_, msr, ..)| rendezvous_score(&conference.id, msr))
        .map(|(p, ..)| *p);
    Admitted {
        kept: eligible.iter().map(|(p, ..)| *p).collect(),
        dropped: over
            .iter()
            .map(|(p, ..)| (*p, CandidateOutcome::OverThreshold))
            .collect(),
        rule: Rule::NewConference,
        threshold: Some(conference.new_threshold * 100.0),
        chosen,
    }
}
