//! The `pooled` policy (SPEC §10): each MSR ranked by its estimated
//! occupancy, the least occupied taken, ties drawn.

use super::*;
use crate::model::load_table::EstimateInputs;
use msr_shared::media::CodecSet;

/// The estimated occupancy of the MSR at `position` (SPEC §10, module
/// docs): its estimated sessions ([`crate::model::estimate`]) over its
/// `max-calls`; infinite without a report or with no capacity, so such an
/// MSR ranks last.
#[inline]
pub(super) fn estimated_occupancy(view: &ZoneView<'_>, position: usize, core_hosts: u32) -> f64 {
    view.estimate_inputs(position)
        .map_or(f64::INFINITY, |inputs| inputs.occupancy(core_hosts))
}

/// The occupancy admission holds against the load limit (module docs of
/// `select`, "Overload"): the estimate with `headroom` sessions added, but
/// never all the room below `load_limit` (percent): an idle MSR, however
/// small, still takes a leg, or its refusals would hold the zone in
/// overload whatever the load.
#[inline]
pub(super) fn admitted_occupancy(
    view: &ZoneView<'_>,
    position: usize,
    core_hosts: u32,
    headroom: Headroom,
    load_limit: u8,
) -> f64 {
    held_occupancy(view, position, headroom, load_limit, |inputs| {
        inputs.occupancy(core_hosts)
    })
}

/// [`admitted_occupancy`] of the occupancy `occupancy` reads from the
/// MSR's estimate inputs.
#[inline]
pub(super) fn held_occupancy(
    view: &ZoneView<'_>,
    position: usize,
    headroom: Headroom,
    load_limit: u8,
    occupancy: impl Fn(&EstimateInputs) -> f64,
) -> f64 {
    view.estimate_inputs(position)
        .map_or(f64::INFINITY, |inputs| {
            let room = (u64::from(inputs.max_calls) * u64::from(load_limit))
                .div_ceil(100)
                .saturating_sub(1);
            let kept = headroom.of(inputs.max_calls, position);
            let kept = u32::try_from(room).map_or(kept, |room| kept.min(room));
            occupancy(&inputs) + f64::from(kept) / f64::from(inputs.max_calls.max(1))
        })
}

/// How far one kind of media a leg does not use moves an MSR down the
/// ranking: past any occupancy an admitted MSR can have.
const SPARE_KIND_TIER: f64 = 1e6;

/// The index into `kept` of the lowest estimated occupancy; ties at
/// random (uniformly: one draw among the tied, in `kept`'s order, however
/// many tie: the draw the selection index makes, so the two send a leg to
/// the same MSR whenever they list the tied ones alike), or the first of
/// them with a fixed draw.
///
/// A leg with an offer (SPEC §15) goes first to the admitted MSRs that
/// spend the fewest kinds of media it does not use
/// ([`CodecSet::spare_kinds`]): an audio call goes to a video MSR only when
/// no audio-only MSR has room, so the video MSRs keep their room for the
/// calls only they can take. Ranking every MSR by occupancy alone filled
/// the video MSRs with audio calls: video calls were refused 20 × as often
/// as audio ones and the pool blocked at 1.9 × its limit (BALANCING.md,
/// "Capability classes"). A leg without an offer is ranked as before.
pub(super) fn pooled_pick<R: Rng + ?Sized>(
    view: &ZoneView<'_>,
    kept: &[usize],
    core_hosts: u32,
    needs: CodecSet,
    draw: &mut Draw<'_, R>,
) -> Option<usize> {
    let rank = |position: usize| {
        let mut occupancy = estimated_occupancy(view, position, core_hosts);
        if !needs.is_empty() {
            // A tier per kind of media spent (an occupancy below a load
            // limit is at most 1); an MSR without a report stays last.
            let spare = view
                .codecs(position)
                .map_or(0, |takes| takes.spare_kinds(needs));
            occupancy += f64::from(spare) * SPARE_KIND_TIER;
        }
        occupancy
    };
    // The least and the first index that has it.
    let mut least: Option<(usize, f64)> = None;
    let mut ties = 0_u32;
    for (i, &position) in kept.iter().enumerate() {
        let occupancy = rank(position);
        match least {
            Some((_, l)) if occupancy > l => {}
            Some((_, l)) if occupancy == l => ties += 1,
            _ => {
                least = Some((i, occupancy));
                ties = 1;
            }
        }
    }
    let (first, least) = least?;
    let mut r = match draw {
        Draw::Random(rng) if ties > 1 => rng.gen_range(0..ties),
        _ => 0,
    };
    for (i, &position) in kept.iter().enumerate() {
        if rank(position) == least {
            if r == 0 {
                return Some(i);
            }
            r -= 1;
        }
    }
    Some(first)
}
