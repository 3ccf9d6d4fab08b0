//! The `pooled` policy (SPEC §10): each MSR ranked by its estimated
//! occupancy, the least occupied taken, ties drawn.

use super::*;

/// The estimated occupancy of the MSR at `position` (SPEC §10, module
/// docs): its estimated sessions ([`crate::model::estimate`]) over its
/// `max-calls`; infinite without a report or with no capacity, so such an
/// MSR ranks last.
#[inline]
pub(super) fn estimated_occupancy(view: &ZoneView<'_>, position: usize, core_hosts: u32) -> f64 {
    let Some(inputs) = view.estimate_inputs(position) else {
        return f64::INFINITY;
    };
    if inputs.calls.is_none() {
        return f64::INFINITY;
    }
    // The capacity is the MSR's own `max-calls`: the coefficient is not
    // multiplied in again (module docs, "Capacity").
    let capacity = f64::from(inputs.max_calls);
    if capacity <= 0.0 {
        return f64::INFINITY;
    }
    inputs.estimate.sessions(core_hosts) / capacity
}

/// The index into `kept` of the lowest estimated occupancy; ties at
/// random (reservoir sampling: the k-th equal one replaces the choice with
/// probability 1/k), or the first of them with a fixed draw.
pub(super) fn pooled_pick<R: Rng + ?Sized>(
    view: &ZoneView<'_>,
    kept: &[usize],
    core_hosts: u32,
    draw: &mut Draw<'_, R>,
) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    let mut ties = 0_u32;
    for (i, &position) in kept.iter().enumerate() {
        let occupancy = estimated_occupancy(view, position, core_hosts);
        match best {
            Some((_, b)) if occupancy > b => {}
            Some((_, b)) if occupancy == b => {
                ties += 1;
                if let Draw::Random(rng) = draw {
                    if rng.gen_range(0..ties) == 0 {
                        best = Some((i, occupancy));
                    }
                }
            }
            _ => {
                best = Some((i, occupancy));
                ties = 1;
            }
        }
    }
    best.map(|(i, _)| i)
}
