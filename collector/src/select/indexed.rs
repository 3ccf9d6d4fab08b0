//! The common selection through the load table's selection index
//! ([`LoadTable::indexed_zone`]): a plain leg with nothing failed and no
//! offer named, under either policy, in O(log n) of the zone's MSRs. It
//! gives what [`run`](super::steps::run) gives, in distribution: the
//! contacts steps 1–4 keep, §9's load limit, then §7's weighted draw (one
//! draw, over the same weights, laid out in the index's order instead of
//! by MSR name) or §10's least estimated occupancy with ties drawn
//! uniformly (one draw among the tied instead of one per tie). Whatever
//! the index does not answer is left to the scan (`None`).

use super::*;

/// The choice for `query` through the index; `None`: the scan answers.
pub(super) fn select_indexed<R: Rng + ?Sized>(
    table: &LoadTable,
    topology: &Topology,
    query: &Query,
    rng: &mut R,
) -> Option<Result<Choice, Refusal>> {
    let plain = matches!(query.admission, Admission::Plain);
    if !plain || !query.failed.is_empty() || !query.needs.is_empty() {
        return None;
    }
    let zone = table.indexed_zone(&query.zone, query.msr.as_deref(), query.now)?;
    // An undeclared site: the scan refuses it.
    let from = topology.distances_from(&query.site)?;
    let nearest = zone.nearest(&from)?;
    let distance = Some(nearest.distance());
    let (position, draws, rule) = match query.policy {
        Policy::Ecss | Policy::EcssUnfollowed { .. } => {
            let total = nearest.total_weight();
            // Step 6 as the scan orders it: nothing admitted or every
            // weight zero, then a total no draw can be made in.
            if total <= 0.0 {
                return Some(Err(Refusal::MsrOverloaded));
            }
            if !total.is_finite() {
                return Some(Err(Refusal::MsrNotFound));
            }
            let value = rng.gen_range(0.0..total);
            let position = nearest.weighted(value)?;
            // The fallback's admission reads the estimate, which the
            // index's weights do not: an MSR it finds full sends the leg
            // to the scan, whose draw leaves it out. Drawing again over
            // the rest keeps each admitted MSR's chance w / (the admitted
            // weights), as the scan's own draw.
            if let (Policy::EcssUnfollowed { .. }, Some((core_hosts, headroom))) =
                (query.policy, query.policy.estimated())
            {
                let c = nearest.view().candidate(position, query.now)?;
                let load = estimated_load(
                    nearest.view(),
                    position,
                    query.policy,
                    core_hosts,
                    headroom,
                    &c,
                );
                if load >= f64::from(c.load_limit) {
                    return None;
                }
            }
            (position, (value, total), Rule::Draw)
        }
        Policy::Pooled {
            core_hosts,
            headroom,
        } => {
            if core_hosts.max(1) != nearest.core_hosts() {
                return None;
            }
            let (_, ties) = nearest.least_occupied();
            if ties == 0 {
                return Some(Err(Refusal::MsrOverloaded));
            }
            let r = if ties > 1 { rng.gen_range(0..ties) } else { 0 };
            let position = nearest.tied(r)?;
            // In overload (a headroom), the least occupied admitted
            // without it may not be with it: then the scan holds each MSR
            // to its own limit.
            if headroom.keeps() {
                let c = nearest.view().candidate(position, query.now)?;
                let occupancy = admitted_occupancy(
                    nearest.view(),
                    position,
                    core_hosts,
                    headroom,
                    c.load_limit,
                );
                if admission_load(Some(occupancy), c.load) >= f64::from(c.load_limit) {
                    return None;
                }
            }
            (position, (0.0, 0.0), Rule::Pooled)
        }
    };
    let c = nearest.view().candidate(position, query.now)?;
    Some(Ok(Choice::of(
        &c,
        zone.media_bridge(),
        distance,
        draws,
        rule,
    )))
}
