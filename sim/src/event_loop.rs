//! The discrete-event loop of one run: arrivals, departures, the end of
//! each subscription's rate-limit window and the delivery of NOTIFYs, as
//! a [`BinaryHeap`] of events in integer nanoseconds of virtual time, each
//! core host with its own collector state ([`Host`]) and each MSR with one
//! [`NotifyGate`] per core host.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use msr_agent::notifier::{NotifyGate, NotifyRule, Reported, Verdict};
use msr_collector::config::{HealthConfig, SelectionConfig, SelectionPolicy};
use msr_collector::model::health::{Cause, FailureCause, HealthEvent, HealthMonitor};
use msr_collector::model::legs::{LegKey, LegTable, DEFAULT_MAX_DURATION};
use msr_collector::model::load_table::{Change, LoadTable, Placement};
use msr_collector::operator::names::{ContactName, MsrName, NameError};
use msr_collector::operator::OperatorConfig;
use msr_collector::sip::registrar::Binding;
use msr_shared::event_package::{EngineState, LoadReport, Service};
use msr_shared::media::{CodecList, CodecSet};
use msr_shared::subscription::SubscriptionState;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::policies::{choose, percent, Refused};
use crate::stats::{batch_means, erlang_b, spread_pp};
use crate::{
    exponential, Capabilities, ClassOutcome, Classes, Outcome, Policy, Scenario, SimError,
};

/// Index of the audio-only class in the per-class counters.
const AUDIO: usize = 0;
/// Index of the video class.
const VIDEO: usize = 1;

/// The pooled Erlang-B limit of each class of calls (SPEC §10's pooled
/// limit, taken per class of SPEC §15), `[audio-only, video]`, and the
/// video MSRs' summed capacity.
///
/// * Video calls can go only to the video MSRs: their limit is Erlang-B of
///   the video traffic on the video MSRs' summed capacity — what they
///   would block if those MSRs were one server group kept for them. No
///   policy that admits audio calls there can do better; the gap to it is
///   what audio calls on the video MSRs cost video calls.
/// * Audio-only calls can use every MSR, and they share the video MSRs
///   with the video calls: their server group is the whole pool, and
///   their limit is the overall pooled limit, Erlang-B of all the traffic
///   on the summed capacity — what every call blocks when the pool works
///   as one group. It is a reference, not a strict bound: a selection
///   that refused video calls early would leave audio calls more room
///   (the strict bound, Erlang-B of the audio traffic alone on the whole
///   pool, is vanishingly small at any useful load and says nothing).
pub(crate) fn class_limits(scenario: &Scenario, capabilities: Capabilities) -> ([f64; 2], u32) {
    let video_capacity: u32 = scenario
        .capacities
        .iter()
        .take(capabilities.video_msrs)
        .sum();
    let erlangs = scenario.erlangs();
    (
        [
            erlang_b(erlangs, scenario.capacities.iter().sum()),
            erlang_b(erlangs * capabilities.video_share, video_capacity),
        ],
        video_capacity,
    )
}

/// What each MSR reports it takes and what each class of calls offers
/// (SPEC §15), for a scenario with capability classes.
struct Media {
    capabilities: Capabilities,
    /// The `codecs:` line of each MSR's NOTIFYs.
    reports: Vec<CodecList>,
    /// The same as sets, to tell whether an MSR takes a call's offer.
    takes: Vec<CodecSet>,
    /// The offer of each class, `[AUDIO]` and `[VIDEO]`.
    offers: [CodecSet; 2],
}

impl Media {
    fn new(scenario: &Scenario) -> Result<Option<Media>, SimError> {
        let Some(capabilities) = scenario.capabilities else {
            return Ok(None);
        };
        let n = scenario.capacities.len();
        if capabilities.video_msrs > n {
            return Err(SimError::Scenario(format!(
                "{} video msrs of {n}",
                capabilities.video_msrs
            )));
        }
        if !(0.0..=1.0).contains(&capabilities.video_share) {
            return Err(SimError::Scenario(format!(
                "video share {} is not between 0 and 1",
                capabilities.video_share
            )));
        }
        if !matches!(scenario.policy, Policy::Pooled | Policy::Ecss) {
            return Err(SimError::Scenario(format!(
                "capability classes need the product's selection (pooled, ecss): {} knows no codecs",
                scenario.policy.name()
            )));
        }
        let codecs = |list: &str| -> Result<CodecSet, SimError> {
            list.parse()
                .map_err(|e: msr_shared::media::UnknownCodec| SimError::Scenario(e.to_string()))
        };
        let video = CodecList::new(codecs(Capabilities::VIDEO_MSR)?.iter());
        let audio = CodecList::new(codecs(Capabilities::AUDIO_MSR)?.iter());
        let reports: Vec<CodecList> = (0..n)
            .map(|m| {
                if m < capabilities.video_msrs {
                    video
                } else {
                    audio
                }
            })
            .collect();
        Ok(Some(Media {
            capabilities,
            takes: reports.iter().map(CodecList::set).collect(),
            reports,
            offers: [
                codecs(Capabilities::AUDIO_OFFER)?,
                codecs(Capabilities::VIDEO_OFFER)?,
            ],
        }))
    }
}

/// One class's counters over the measured calls.
#[derive(Default)]
struct ClassCount {
    batch_blocked: Vec<u64>,
    batch_offered: Vec<u64>,
    no_capable_msr: u64,
    msr_overloaded: u64,
    other_refusals: u64,
    lost_full: u64,
    misplaced: u64,
}

impl ClassCount {
    fn outcome(&self, erlangs: f64, limit: f64) -> ClassOutcome {
        let (blocking, half_width) = batch_means(&self.batch_blocked, &self.batch_offered);
        ClassOutcome {
            calls: self.batch_offered.iter().sum(),
            blocking,
            half_width,
            erlangs,
            limit,
            no_capable_msr: self.no_capable_msr,
            msr_overloaded: self.msr_overloaded,
            other_refusals: self.other_refusals,
            lost_full: self.lost_full,
            misplaced: self.misplaced,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// The next call arrives.
    Arrival,
    /// Call `id` on MSR `msr`, placed by core host `host`, ends.
    Departure { id: u64, host: u32, msr: u32 },
    /// The rate-limit window of MSR `msr`'s subscription from `host` ends.
    WindowEnd { msr: u32, host: u32 },
    /// MSR `msr`'s agent samples its `calls` (its next sample after a
    /// change, `Scenario::sample_interval`).
    Sample { msr: u32 },
    /// A NOTIFY of MSR `msr` (calls `calls`) reaches `host`.
    /// `age_ms`: its `sample-age-ms` (`None`: not reported).
    Notify {
        msr: u32,
        host: u32,
        calls: u32,
        age_ms: Option<u32>,
    },
}

/// One core host: the collector's state.
pub(crate) struct Host {
    pub(crate) table: LoadTable,
    pub(crate) legs: LegTable,
    pub(crate) next_rr: usize,
    pub(crate) seen: Seen,
    /// The collector's health monitor: the core's failures (SPEC §14)
    /// trip an MSR out of selection, as in the collector.
    pub(crate) health: HealthMonitor,
    /// Whether the zone is in overload, from the host's own selections
    /// (SPEC §10), as in the collector.
    pub(crate) overload: msr_collector::model::overload::OverloadWatch,
}

/// What the hosts' health monitors did over the measured calls.
#[derive(Debug, Default)]
struct HealthCount {
    /// MSRs the core's failures took out of selection.
    trips: u64,
    /// Health changes of another cause (a gap in the model: expected 0).
    other: u64,
}

impl Host {
    /// Drives the host's health monitor to `now` as the collector's core
    /// does (`core::glue`): what is due runs, every keepalive is answered
    /// 200 at once (the simulated agents never stop answering), and each
    /// change of a contact's health reaches the load table.
    fn drive_health(
        &mut self,
        operator: &OperatorConfig,
        now: Instant,
        count: Option<&mut HealthCount>,
    ) {
        if self.health.poll_timeout().is_some_and(|at| at <= now) {
            self.health.handle_timeout(now);
        }
        while let Some(probe) = self.health.poll_transmit() {
            self.health
                .handle_response(now, probe.id, &msr_shared::sip::StatusCode::OK);
        }
        while self.health.poll_abandoned().is_some() {}
        let mut count = count;
        while let Some(event) = self.health.poll_event() {
            if let HealthEvent::Changed(change) = &event {
                if let Some(count) = count.as_deref_mut() {
                    match change.cause {
                        Cause::CoreErrors | Cause::CoreTimeouts => count.trips += 1,
                        Cause::Registered | Cause::Recovered => {}
                        _ => count.other += 1,
                    }
                }
                self.table.apply(
                    operator,
                    Change::HealthChanged {
                        contact: &change.contact,
                        health: change.to,
                        since: (change.at, 0),
                    },
                );
            }
        }
    }
}

/// What a comparison policy knows on one core host, per MSR (the
/// product's policies read the [`LoadTable`] instead).
#[derive(Debug, Clone, Default)]
pub(crate) struct Seen {
    /// `calls` of the last NOTIFY that reached this host (`None`: none yet).
    pub(crate) reported: Vec<Option<u32>>,
    /// Legs this host placed since that NOTIFY arrived.
    pub(crate) placed_since: Vec<u32>,
    /// Calls this host placed that it has not seen end.
    pub(crate) active: Vec<u32>,
}

/// Runs `scenario`.
///
/// # Errors
/// [`SimError`] when the scenario cannot be set up.
pub fn run(scenario: &Scenario) -> Result<Outcome, SimError> {
    let n = scenario.capacities.len();
    if n == 0 || scenario.coefficients.len() != n || scenario.core_hosts == 0 {
        return Err(SimError::Scenario(
            "one coefficient per msr, at least one msr and one core host".into(),
        ));
    }
    let name_error = |e: NameError| SimError::Scenario(e.to_string());
    let names: Vec<MsrName> = (0..n)
        .map(|i| MsrName::new(&format!("msr_{i}")))
        .collect::<Result<_, _>>()
        .map_err(name_error)?;
    let contacts: Vec<ContactName> = names
        .iter()
        .map(|m| ContactName::of("lo", m))
        .collect::<Result<_, _>>()
        .map_err(name_error)?;
    let media = Media::new(scenario)?;
    if scenario.failover_attempts > 1 && !matches!(scenario.policy, Policy::Pooled | Policy::Ecss) {
        return Err(SimError::Scenario(format!(
            "failover needs the product's selection (pooled, ecss): {} knows no failed MSRs",
            scenario.policy.name()
        )));
    }
    // The comparison policies have no selection without a leg: pooled-literal
    // would silently lose the placements its estimate reads (they are
    // noted with the leg), the others would ignore the flag.
    if !scenario.call_ids && !matches!(scenario.policy, Policy::Pooled | Policy::Ecss) {
        return Err(SimError::Scenario(format!(
            "a select without a call_id is the product's selection (pooled, ecss): {} has none",
            scenario.policy.name()
        )));
    }
    if scenario.failover_attempts > 1 && !scenario.call_ids {
        return Err(SimError::Scenario(
            "failover moves a leg (SPEC §14): a select without a call_id names no failed MSRs"
                .to_owned(),
        ));
    }
    let base = Instant::now();
    // Event times are integer nanoseconds since `base`, exactly as the
    // product's `Instant`s differ: a time that went through f64 seconds
    // could land a nanosecond before the gate's window end, and the held
    // change would then wait for the next change (issue 24, defect b).
    let at = |t_ns: u64| base + Duration::from_nanos(t_ns);
    let delay_ns = u64::try_from(scenario.report_delay.as_nanos()).unwrap_or(u64::MAX);
    let mut operator = OperatorConfig::new();
    operator.declare_site(&Placement::default().site)?;
    for (name, &coefficient) in names.iter().zip(&scenario.coefficients) {
        operator.set_performance_coefficient(name, coefficient)?;
    }
    let selection = SelectionConfig {
        policy: match scenario.policy {
            Policy::Ecss => SelectionPolicy::Ecss,
            _ => SelectionPolicy::Pooled,
        },
        ..SelectionConfig::default()
    };
    let mut hosts: Vec<Host> = (0..scenario.core_hosts)
        .map(|h| {
            let defaults = Placement::default();
            let mut table = LoadTable::new(format!("core{h}"), defaults);
            table.set_notify_flight_time(scenario.report_delay);
            // As the collector's core tells its table G (SPEC §12).
            table.set_core_hosts(scenario.core_hosts);
            for (m, name) in names.iter().enumerate() {
                let binding = Binding {
                    msr: name.clone(),
                    contact: contacts[m].clone(),
                    uri: format!("sip:{name}@127.0.0.1:5040"),
                    engine: None,
                    version: None,
                    // Registered for the whole run.
                    expires_at: base + Duration::from_secs(100 * 365 * 86_400),
                    call_id: format!("sim-{name}"),
                    cseq: 1,
                    branch: None,
                    source: None,
                };
                table.apply(&operator, Change::BindingChanged(&binding));
            }
            let mut health =
                HealthMonitor::new(HealthConfig::default(), format!("sip:core{h}@127.0.0.1"));
            for (m, name) in names.iter().enumerate() {
                health.contact_registered(base, &contacts[m], name, "sip:127.0.0.1:5040");
                // The simulated agents send no refresh NOTIFYs: a report
                // never ages out of the run (SPEC §5's staleness is not
                // modelled).
                health.subscription_changed(
                    base,
                    name.as_str(),
                    &SubscriptionState::Active,
                    u32::MAX,
                );
            }
            Host {
                table,
                // Legs live for the run: a core that releases nothing must
                // not get its legs expired for it.
                legs: LegTable::new(
                    DEFAULT_MAX_DURATION.max(Duration::from_secs(100 * 365 * 86_400)),
                ),
                health,
                overload: Default::default(),
                next_rr: 0,
                seen: Seen {
                    reported: vec![None; n],
                    placed_since: vec![0; n],
                    active: vec![0; n],
                },
            }
        })
        .collect();
    let rule = NotifyRule {
        load_delta: scenario.load_delta,
        high_water: scenario.high_water,
        min_interval: scenario.min_interval,
        top_interval: scenario.top_interval,
    };
    let g = scenario.core_hosts as usize;
    // gates[msr * G + host]; `window_queued`, the end of the WindowEnd
    // queued, avoids a second one unless a change near the top moved the
    // held change's window end earlier (NotifyRule::gap).
    let mut gates = vec![NotifyGate::default(); n * g];
    let mut window_queued: Vec<Option<u64>> = vec![None; n * g];
    let mut notifies = vec![0_u64; n * g];
    let mut busy = vec![0_u32; n];
    // What each agent saw at its last sample, when, and whether a sample
    // is queued. Each agent's sample clock has its own phase, drawn from
    // its own generator so the other draws are the sequence they were.
    let sample_ns = u64::try_from(scenario.sample_interval.as_nanos()).unwrap_or(u64::MAX);
    let mut sampled = vec![0_u32; n];
    let mut phase_rng = StdRng::seed_from_u64(scenario.seed ^ 0x5A4D_97E5);
    let mut last_sample_ns: Vec<u64> = (0..n)
        .map(|_| {
            if sample_ns == 0 {
                0
            } else {
                phase_rng.gen_range(0..sample_ns)
            }
        })
        .collect();
    let mut sample_queued = vec![false; n];
    // The agent's `sample-age-ms` for a NOTIFY sent at `t_ns` (SPEC §10).
    let age_ms = |t_ns: u64, sampled_ns: u64| {
        (sample_ns > 0 && scenario.sample_age)
            .then(|| u32::try_from(t_ns.saturating_sub(sampled_ns) / 1_000_000).unwrap_or(u32::MAX))
    };
    let mut rng = StdRng::seed_from_u64(scenario.seed);
    let erlangs = scenario.erlangs();
    let lambda = erlangs / scenario.holding.mean_secs();
    // Warm-up: a tenth of the measured calls, at least five holding times.
    let warmup = (scenario.calls / 10).max((lambda * 5.0 * scenario.holding.mean_secs()) as u64);
    let total_calls = warmup + scenario.calls;
    let batches = u64::from(scenario.batches.max(2));
    let batch_size = (scenario.calls / batches).max(1);
    let mut batch_blocked = vec![0_u64; batches as usize];
    let mut batch_offered = vec![0_u64; batches as usize];
    let (mut refused, mut lost_full, mut misplaced) = (0_u64, 0_u64, 0_u64);
    // Selections that named an MSR (a failover's included), and those of
    // them that found it full.
    let (mut selections_sent, mut selections_full) = (0_u64, 0_u64);
    let mut health_count = HealthCount::default();
    let mut overload_entries = 0_u64;
    let attempts = scenario.failover_attempts.max(1) as usize;
    let mut classes: [ClassCount; 2] = std::array::from_fn(|_| ClassCount {
        batch_blocked: vec![0; batches as usize],
        batch_offered: vec![0; batches as usize],
        ..ClassCount::default()
    });
    // The class of each call is drawn from its own generator, so the
    // arrival, holding and selection draws are the same sequence as
    // without classes (and a run without them draws nothing more).
    let mut class_rng = StdRng::seed_from_u64(scenario.seed ^ 0x5EC1_5C1A_5535);
    let mut queue: BinaryHeap<Reverse<(u64, u64, Event)>> = BinaryHeap::new();
    let mut seq = 0_u64;
    // A sampled duration in seconds, rounded to whole nanoseconds.
    let ns = |secs: f64| (secs * 1e9).round() as u64;
    let mut push = |queue: &mut BinaryHeap<_>, t_ns: u64, e: Event| {
        seq += 1;
        queue.push(Reverse((t_ns, seq, e)));
    };
    // Every agent reports at once to every host (the NOTIFY after SUBSCRIBE).
    for m in 0..n {
        for h in 0..g {
            gates[m * g + h].sent(at(0), Reported { load: 0, calls: 0 });
            push(
                &mut queue,
                delay_ns,
                Event::Notify {
                    msr: m as u32,
                    host: h as u32,
                    calls: 0,
                    age_ms: None,
                },
            );
        }
    }
    push(
        &mut queue,
        ns(exponential(&mut rng, lambda)),
        Event::Arrival,
    );
    let mut arrivals = 0_u64;
    let mut measure_from = None::<f64>;
    let mut last_t = 0.0_f64;
    let mut spread_integral = 0.0_f64;
    let mut notify_from = vec![0_u64; n * g];
    while let Some(Reverse((t_ns, _, event))) = queue.pop() {
        let t = t_ns as f64 / 1e9;
        if measure_from.is_some() {
            spread_integral += (t - last_t) * spread_pp(&busy, &scenario.capacities);
        }
        last_t = t;
        let now = at(t_ns);
        // The MSRs whose `calls` changed at this event.
        let mut changed: Option<usize> = None;
        // The MSR whose agent sampled at this event.
        let mut seen: Option<usize> = None;
        match event {
            Event::Arrival => {
                arrivals += 1;
                if arrivals > total_calls {
                    break;
                }
                if arrivals == warmup + 1 {
                    measure_from = Some(t);
                    notify_from.clone_from(&notifies);
                }
                push(
                    &mut queue,
                    t_ns.saturating_add(ns(exponential(&mut rng, lambda))),
                    Event::Arrival,
                );
                let h = rng.gen_range(0..g);
                let id = arrivals;
                // SPEC §15: the call's class and the offer it names.
                let (class, needs) = match &media {
                    Some(media) => {
                        let class = if class_rng.gen::<f64>() < media.capabilities.video_share {
                            VIDEO
                        } else {
                            AUDIO
                        };
                        (class, media.offers[class])
                    }
                    None => (AUDIO, CodecSet::EMPTY),
                };
                let measured = arrivals > warmup;
                let batch =
                    ((arrivals.saturating_sub(warmup + 1)) / batch_size).min(batches - 1) as usize;
                if measured {
                    batch_offered[batch] += 1;
                    classes[class].batch_offered[batch] += 1;
                }
                // An MSR refuses (SIP 488) an offer it does not take; only
                // possible before its first report reached the host (an
                // MSR that reported no codecs takes anything, SPEC §15).
                let takes = |m: usize| {
                    media
                        .as_ref()
                        .is_none_or(|media| media.takes[m].lacks(needs).is_none())
                };
                // The core's failover (SPEC §14): an MSR that refuses the
                // leg (full, or lacking a codec) is named in `failed` and the
                // same host asks again, up to `failover_attempts` MSRs in
                // all. The leg the product bound to the refusing MSR moves
                // away at the same instant, so that MSR's estimate gains and
                // loses it at once: nothing to note.
                hosts[h].drive_health(&operator, now, measured.then_some(&mut health_count));
                let mut failed: Vec<usize> = Vec::new();
                let chosen = loop {
                    let chosen = choose(
                        scenario,
                        &selection,
                        &mut hosts[h],
                        &operator,
                        &busy,
                        needs,
                        &failed,
                        now,
                        &mut rng,
                    );
                    let Ok(m) = chosen else { break chosen };
                    let fits = busy[m] < scenario.capacities[m] && takes(m);
                    if measured {
                        selections_sent += 1;
                        if !fits && takes(m) {
                            selections_full += 1;
                        }
                    }
                    if !fits && attempts > 1 {
                        // The core reports the failure with its failover
                        // (SPEC §14): a full MSR answers at its load limit.
                        let host = &mut hosts[h];
                        host.health.core_failure_given_report(
                            now,
                            names[m].as_str(),
                            FailureCause::LoadLimit,
                            &host.table,
                        );
                        host.drive_health(&operator, now, measured.then_some(&mut health_count));
                    }
                    if fits || failed.len() + 1 >= attempts {
                        break chosen;
                    }
                    failed.push(m);
                };
                // What the host's selections said of overload (SPEC §10),
                // as the collector logs it.
                for (_, change) in hosts[h].overload.take_changes() {
                    if measured && change == msr_collector::model::overload::Change::Entered {
                        overload_entries += 1;
                    }
                }
                match chosen {
                    Ok(m) if busy[m] < scenario.capacities[m] && takes(m) => {
                        busy[m] += 1;
                        changed = Some(m);
                        let call_id = id.to_string();
                        let host = &mut hosts[h];
                        if scenario.call_ids {
                            host.legs.bind(
                                now,
                                LegKey {
                                    call_id: &call_id,
                                    leg: None,
                                },
                                &names[m],
                                &contacts[m],
                                None,
                            );
                            host.table.note_placed(&names[m], now);
                        }
                        // A comparison policy counts the legs that the MSR
                        // took (one it refused is no placement).
                        host.seen.placed_since[m] += 1;
                        host.seen.active[m] += 1;
                        let hold = scenario.holding.sample(&mut rng);
                        push(
                            &mut queue,
                            t_ns.saturating_add(ns(hold)),
                            Event::Departure {
                                id,
                                host: h as u32,
                                msr: m as u32,
                            },
                        );
                    }
                    Ok(m) => {
                        if measured {
                            batch_blocked[batch] += 1;
                            let count = &mut classes[class];
                            count.batch_blocked[batch] += 1;
                            if takes(m) {
                                lost_full += 1;
                                count.lost_full += 1;
                            } else {
                                misplaced += 1;
                                count.misplaced += 1;
                            }
                        }
                    }
                    Err(cause) => {
                        if measured {
                            batch_blocked[batch] += 1;
                            refused += 1;
                            let count = &mut classes[class];
                            count.batch_blocked[batch] += 1;
                            match cause {
                                Refused::NoCapableMsr => count.no_capable_msr += 1,
                                Refused::MsrOverloaded => count.msr_overloaded += 1,
                                Refused::Other => count.other_refusals += 1,
                            }
                        }
                    }
                }
            }
            Event::Departure { id, host, msr } => {
                let m = msr as usize;
                busy[m] = busy[m].saturating_sub(1);
                changed = Some(m);
                let host = &mut hosts[host as usize];
                // A dispatcher sees the call's end (BYE) whatever the core
                // tells the collector.
                host.seen.active[m] = host.seen.active[m].saturating_sub(1);
                let call_id = id.to_string();
                if scenario.releases {
                    let table = &mut host.table;
                    host.legs
                        .release_at(now, &call_id, None, |msr| table.note_ended(msr, now));
                }
            }
            Event::WindowEnd { msr, host } => {
                let i = msr as usize * g + host as usize;
                if window_queued[i] != Some(t_ns) {
                    // Superseded by an earlier end that already fired.
                    continue;
                }
                window_queued[i] = None;
                if let Some(end) = gates[i].held_until().filter(|&end| now < end) {
                    // The held change's window moved later (it fell back
                    // below the top, NotifyRule::gap): wait for its end.
                    let end = u64::try_from(end.saturating_duration_since(base).as_nanos())
                        .unwrap_or(u64::MAX);
                    window_queued[i] = Some(end);
                    push(&mut queue, end, Event::WindowEnd { msr, host });
                    continue;
                }
                if gates[i].due(now) {
                    let m = msr as usize;
                    let latest = Reported {
                        load: percent(sampled[m], scenario.capacities[m]),
                        calls: sampled[m],
                    };
                    if gates[i].evaluate(&rule, now, latest) == Verdict::Send {
                        gates[i].sent(now, latest);
                        notifies[i] += 1;
                        push(
                            &mut queue,
                            t_ns.saturating_add(delay_ns),
                            Event::Notify {
                                msr,
                                host,
                                calls: latest.calls,
                                age_ms: age_ms(t_ns, last_sample_ns[m]),
                            },
                        );
                    }
                }
            }
            Event::Sample { msr } => {
                let m = msr as usize;
                sample_queued[m] = false;
                last_sample_ns[m] = t_ns;
                seen = Some(m);
            }
            Event::Notify {
                msr,
                host,
                calls,
                age_ms,
            } => {
                let m = msr as usize;
                let cap = scenario.capacities[m];
                let report = LoadReport {
                    msr: names[m].to_string(),
                    load: percent(calls, cap),
                    cpu: 0,
                    calls,
                    max_calls: cap,
                    // SPEC §15: what the MSR takes, in every NOTIFY.
                    codecs: media.as_ref().map(|media| media.reports[m]),
                    sample_age_ms: age_ms,
                    ..LoadReport::default()
                };
                let host = &mut hosts[host as usize];
                let change = Change::LoadReported {
                    msr: &names[m],
                    report,
                    at: now,
                };
                host.table.apply(&operator, change);
                // A report is a good signal (SPEC §5): after a trip's hold
                // it brings the MSR back.
                host.health.report_received(
                    now,
                    names[m].as_str(),
                    EngineState::Unchecked,
                    Service::Active,
                );
                let measured = measure_from.is_some();
                host.drive_health(&operator, now, measured.then_some(&mut health_count));
                host.seen.reported[m] = Some(calls);
                host.seen.placed_since[m] = 0;
            }
        }
        if let Some(m) = changed {
            if sample_ns == 0 {
                seen = Some(m);
            } else if !sample_queued[m] {
                // The agent's next sample on its clock: its period follows
                // its last sample's load (NotifyRule::sample_interval).
                let period = rule.sample_interval(
                    scenario.sample_interval,
                    percent(sampled[m], scenario.capacities[m]),
                );
                let period = u64::try_from(period.as_nanos()).unwrap_or(u64::MAX).max(1);
                let since = t_ns.saturating_sub(last_sample_ns[m]);
                let next = last_sample_ns[m].saturating_add((since / period + 1) * period);
                sample_queued[m] = true;
                push(&mut queue, next, Event::Sample { msr: m as u32 });
            }
        }
        if let Some(m) = seen {
            sampled[m] = busy[m];
            let latest = Reported {
                load: percent(sampled[m], scenario.capacities[m]),
                calls: sampled[m],
            };
            for h in 0..g {
                let i = m * g + h;
                match gates[i].evaluate(&rule, now, latest) {
                    Verdict::Send => {
                        gates[i].sent(now, latest);
                        notifies[i] += 1;
                        push(
                            &mut queue,
                            t_ns.saturating_add(delay_ns),
                            Event::Notify {
                                msr: m as u32,
                                host: h as u32,
                                calls: latest.calls,
                                age_ms: age_ms(t_ns, last_sample_ns[m]),
                            },
                        );
                    }
                    Verdict::HoldUntil(end) => {
                        let end = u64::try_from(end.saturating_duration_since(base).as_nanos())
                            .unwrap_or(u64::MAX);
                        if window_queued[i].is_some_and(|queued| queued <= end) {
                            continue;
                        }
                        window_queued[i] = Some(end);
                        push(
                            &mut queue,
                            end,
                            Event::WindowEnd {
                                msr: m as u32,
                                host: h as u32,
                            },
                        );
                    }
                    _ => {}
                }
            }
        }
    }
    let start = measure_from.unwrap_or(0.0);
    let elapsed = (last_t - start).max(f64::MIN_POSITIVE);
    let (mean, half_width) = batch_means(&batch_blocked, &batch_offered);
    let blocked = refused + lost_full + misplaced;
    let measured_notifies: Vec<u64> = notifies
        .iter()
        .zip(&notify_from)
        .map(|(a, b)| a - b)
        .collect();
    Ok(Outcome {
        calls: scenario.calls,
        blocking: mean,
        half_width,
        pooled_erlang_b: erlang_b(erlangs, scenario.capacities.iter().sum()),
        refused_share: if blocked > 0 {
            refused as f64 / blocked as f64
        } else {
            0.0
        },
        spread_pp: spread_integral / elapsed,
        notify_per_sec: measured_notifies.iter().sum::<u64>() as f64 / elapsed,
        max_notify_per_sec_per_subscription: measured_notifies.iter().copied().max().unwrap_or(0)
            as f64
            / elapsed,
        simulated_secs: elapsed,
        core_failure_trips: health_count.trips,
        overload_entries,
        other_health_changes: health_count.other,
        full_share: if selections_sent > 0 {
            selections_full as f64 / selections_sent as f64
        } else {
            0.0
        },
        classes: media.map(|media| {
            let (limits, video_capacity) = class_limits(scenario, media.capabilities);
            let share = media.capabilities.video_share;
            Classes {
                audio: classes[AUDIO].outcome(erlangs * (1.0 - share), limits[AUDIO]),
                video: classes[VIDEO].outcome(erlangs * share, limits[VIDEO]),
                capabilities: media.capabilities,
                video_capacity,
            }
        }),
    })
}
