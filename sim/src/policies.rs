//! Which MSR a core host picks for a new call under each [`Policy`]: the
//! product's own selection ([`msr_collector::select::select`] under
//! [`effective_policy`]) for `pooled` and `ecss`, and for the validation and
//! comparison policies a few lines each over what the host has seen
//! ([`Seen`](crate::event_loop::Seen)) — they are not policies of the product, only what SPEC §10
//! measures it against.

use msr_collector::config::SelectionConfig;
use msr_collector::core::admin::effective_policy;
use msr_collector::operator::OperatorConfig;
use msr_collector::select::{self, Admission, Query, Refusal};
use msr_shared::media::CodecSet;
use rand::rngs::StdRng;
use rand::Rng;
use tokio::time::Instant;

use crate::event_loop::Host;
use crate::{Policy, Scenario};

/// Why a core host got no MSR for a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// `no_capable_msr` (SPEC §15): MSRs exist, none takes the offer.
    NoCapableMsr,
    /// `msr_overloaded` (SPEC §7 step 6, §10): the MSRs that take it are
    /// full; also every refusal of a comparison policy.
    MsrOverloaded,
    /// Any other cause of the product's selection.
    Other,
}

/// The MSR core host `host` chooses for a new call whose offer is `needs`
/// (empty: no need named), not one of `failed` (the MSRs that refused the
/// call, SPEC §14), or why it got none.
#[allow(clippy::too_many_arguments)]
pub(crate) fn choose(
    scenario: &Scenario,
    selection: &SelectionConfig,
    host: &mut Host,
    operator: &OperatorConfig,
    busy: &[u32],
    needs: CodecSet,
    failed: &[usize],
    now: Instant,
    rng: &mut StdRng,
) -> Result<usize, Refused> {
    match scenario.policy {
        Policy::Pooled | Policy::Ecss => {
            // What the collector does for a select with a call_id (or
            // without). In overload `pooled` keeps a headroom, as the
            // collector's core does (`admin::prepare`).
            if host.table.poll_timeout().is_some_and(|at| at <= now) {
                host.table.handle_timeout(now);
            }
            let policy = effective_policy(
                selection,
                scenario.call_ids,
                host.legs.last_release(),
                now,
                scenario.core_hosts,
            )
            .in_zone("default", &host.overload, rng);
            let query = Query {
                zone: "default".into(),
                site: "local".into(),
                msr: None,
                admission: Admission::Plain,
                policy,
                failed: failed.iter().map(|m| format!("msr_{m}")).collect(),
                // SPEC §15: the call's offer, so step 1 keeps only the MSRs
                // that take it, exactly as for a leg that names its codecs.
                needs,
                now,
            };
            let outcome = select::select(&host.table, operator.topology(), &query, rng);
            select::note_outcome(&mut host.overload, &query, &outcome);
            select::note_unfollowed(&mut host.table, &query, &outcome);
            let choice = outcome.map_err(|refusal| match refusal {
                Refusal::NoCapableMsr { .. } => Refused::NoCapableMsr,
                Refusal::MsrOverloaded => Refused::MsrOverloaded,
                _ => Refused::Other,
            })?;
            choice
                .msr
                .strip_prefix("msr_")
                .and_then(|i| i.parse::<usize>().ok())
                .ok_or(Refused::Other)
        }
        // The comparison policies know no failover: they are what a
        // dispatcher without SPEC §14 would do.
        _ => comparison(scenario, host, busy, now, rng).ok_or(Refused::MsrOverloaded),
    }
}

/// The MSR a validation or comparison policy picks, `None` on a refusal.
/// They know no codecs: `msr-sim` runs capability classes only with the
/// product's policies.
fn comparison(
    scenario: &Scenario,
    host: &mut Host,
    busy: &[u32],
    now: Instant,
    rng: &mut StdRng,
) -> Option<usize> {
    let n = busy.len();
    match scenario.policy {
        Policy::Pooled | Policy::Ecss => None,
        Policy::PooledLiteral => {
            let view = host.table.zone("default");
            let g = scenario.core_hosts.max(1);
            let mut candidates = Vec::with_capacity(view.len());
            for position in 0..view.len() {
                let (load, _) = view.weight_inputs(position);
                if load.is_some_and(|l| l >= 100) {
                    continue;
                }
                let Some(inputs) = view.estimate_inputs(position) else {
                    continue;
                };
                let capacity = f64::from(inputs.max_calls) * inputs.performance_coefficient;
                let occupancy = match inputs.calls {
                    Some(_) if capacity > 0.0 => inputs.estimate.sessions(g) / capacity,
                    _ => f64::INFINITY,
                };
                candidates.push((position, occupancy));
            }
            let position = lowest_ties_at_random(candidates, rng)?;
            view.status(position, now)?
                .msr
                .strip_prefix("msr_")
                .and_then(|i| i.parse::<usize>().ok())
        }
        Policy::Oracle => {
            let occupancy = |m: usize| f64::from(busy[m]) / f64::from(scenario.capacities[m]);
            let best = (0..n)
                .filter(|&m| busy[m] < scenario.capacities[m])
                .min_by(|&a, &b| occupancy(a).total_cmp(&occupancy(b)))?;
            Some(best)
        }
        Policy::RoundRobin => {
            let m = host.next_rr % n;
            host.next_rr = host.next_rr.wrapping_add(1);
            Some(m)
        }
        Policy::WebSip => {
            let seen = &host.seen;
            let weights: Vec<f64> = (0..n)
                .map(|m| {
                    let calls = seen.reported[m].unwrap_or(0) + seen.placed_since[m];
                    let load = percent(calls, scenario.capacities[m]);
                    f64::from(100 - load) * scenario.coefficients[m]
                })
                .collect();
            let total: f64 = weights.iter().sum();
            if total <= 0.0 {
                return None;
            }
            let mut value = rng.gen_range(0.0..total);
            for (m, &w) in weights.iter().enumerate() {
                if value < w {
                    return Some(m);
                }
                value -= w;
            }
            weights.iter().rposition(|&w| w > 0.0)
        }
        Policy::CallLoad => (0..n)
            .filter(|&m| host.seen.active[m] < scenario.capacities[m])
            // min_by_key keeps the first of equal keys: list order.
            .min_by_key(|&m| host.seen.active[m]),
        Policy::LeastReported => {
            let reported =
                |m: usize| percent(host.seen.reported[m].unwrap_or(0), scenario.capacities[m]);
            lowest_ties_at_random((0..n).map(|m| (m, reported(m))), rng)
        }
        Policy::TwoChoices => {
            if n == 1 {
                return Some(0);
            }
            let a = rng.gen_range(0..n);
            // A second, distinct MSR, uniformly.
            let b = (a + rng.gen_range(1..n)) % n;
            let load =
                |m: usize| percent(host.seen.reported[m].unwrap_or(0), scenario.capacities[m]);
            Some(match load(a).cmp(&load(b)) {
                std::cmp::Ordering::Less => a,
                std::cmp::Ordering::Greater => b,
                std::cmp::Ordering::Equal => {
                    if rng.gen::<bool>() {
                        a
                    } else {
                        b
                    }
                }
            })
        }
    }
}

/// The item of the lowest key, ties at random (reservoir sampling: the
/// k-th equal one replaces the choice with probability 1/k, the same draws
/// as `collector::select`'s pooled pick); `None` when there is none.
pub(crate) fn lowest_ties_at_random<K: PartialOrd>(
    items: impl IntoIterator<Item = (usize, K)>,
    rng: &mut StdRng,
) -> Option<usize> {
    let mut best: Option<(usize, K)> = None;
    let mut ties = 0_u32;
    for (item, key) in items {
        match &best {
            Some((_, b)) if key > *b => {}
            Some((_, b)) if key == *b => {
                ties += 1;
                if rng.gen_range(0..ties) == 0 {
                    best = Some((item, key));
                }
            }
            _ => {
                best = Some((item, key));
                ties = 1;
            }
        }
    }
    best.map(|(item, _)| item)
}

/// `calls` as the agent's load percentage of `capacity` (SPEC §4), capped
/// at 100.
pub(crate) fn percent(calls: u32, capacity: u32) -> u8 {
    u8::try_from((u64::from(calls) * 100 / u64::from(capacity.max(1))).min(100)).unwrap_or(100)
}
