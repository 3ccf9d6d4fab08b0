//! `msr-sim`: a discrete-event simulator of media-server balancing (SPEC
//! §10) that runs the product's own code, not a model of it:
//!
//! * each of G core hosts has its own collector state — a
//!   [`LoadTable`], a [`LegTable`] and the operator configuration — and
//!   picks an MSR with [`msr_collector::select::select`] under the policy
//!   [`msr_collector::api::handler::effective_policy`] gives it (so the `pooled`
//!   fallback to `ecss` is the collector's own); placements and releases
//!   reach the estimate through the same `note_placed` / `release_at` /
//!   `note_ended` calls the control protocol makes;
//! * each MSR is a simulated agent whose NOTIFYs to each core host follow
//!   [`msr_agent::notifier::NotifyGate`] (load-delta, 100 % edges,
//!   high-water, one per second, coalescing), delivered after a delay;
//! * Poisson arrivals spread evenly over the core hosts, exponential or
//!   deterministic holding times, all in virtual time (a [`BinaryHeap`] of
//!   events); seeded, so every run is reproducible.
//!
//! A leg placed on an MSR that is in fact full is lost there (the MSR
//! refuses the INVITE); a refusal by selection is lost too. Blocking is
//! measured with batch means after a warm-up, and compared with the pooled
//! Erlang-B limit (one server group of the summed capacity).
//!
//! Validation policies (no product code, [`Policy::Oracle`],
//! [`Policy::RoundRobin`], and one MSR) check the event loop and the
//! estimators against closed forms ([`validate`]).
//!
//! Comparison policies (no product code either; they are *not* policies
//! of the product, only what SPEC §10 measures the product against):
//! [`Policy::WebSip`], [`Policy::CallLoad`], [`Policy::LeastReported`] and
//! [`Policy::TwoChoices`], each a few lines in [`choose`] over the core
//! host's own view ([`Seen`]): the last `calls` each MSR reported to it,
//! the legs it placed since, and the calls it placed that have not ended.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use msr_agent::notifier::{NotifyGate, NotifyRule, Reported, Verdict};
use msr_collector::api::handler::effective_policy;
use msr_collector::config::{SelectionConfig, SelectionPolicy};
use msr_collector::model::legs::{LegKey, LegTable, DEFAULT_MAX_DURATION};
use msr_collector::model::load_table::{Change, LoadTable, Placement};
use msr_collector::operator::OperatorConfig;
use msr_collector::select::{self, Admission, Query};
use msr_collector::sip::registrar::Binding;
use msr_shared::event_package::LoadReport;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

/// What the simulator can fail on (the product's configuration calls).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The operator configuration refused a scenario value.
    #[error("scenario: {0}")]
    Operator(#[from] msr_collector::operator::OperatorError),
    /// A scenario that cannot run.
    #[error("scenario: {0}")]
    Scenario(String),
    /// A plot could not be drawn or written.
    #[error("plot: {0}")]
    Plot(String),
}

/// How each core host chooses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The collector's `pooled` policy (SPEC §10), with its `ecss` fallback.
    Pooled,
    /// The collector's `ecss` draw (SPEC §7).
    Ecss,
    /// Validation: the least occupied MSR by its true occupancy (a
    /// perfectly informed, perfectly pooled selector).
    Oracle,
    /// Validation: MSRs in turn, whatever their load (per core host).
    RoundRobin,
    /// Comparison (not a product policy): the Web-SIP update of the §7
    /// draw. The load of an MSR is its last report plus this host's
    /// placements on it since that report (ends are not counted), as a
    /// percentage of `max-calls`; then the §7 draw, weights
    /// `(100 − load) × coefficient`; refused when every weight is 0.
    WebSip,
    /// Comparison (not a product policy): a dispatcher's call-load rule.
    /// Each host counts the calls it placed on each MSR and has not seen
    /// end (its own placements and ends, no reports) and takes the MSR
    /// with the fewest, the first in list order on a tie, skipping MSRs
    /// whose count reached their `max-calls` (the dispatcher's maxload);
    /// refused when every MSR is skipped.
    CallLoad,
    /// Comparison (not a product policy): the lowest last-reported load
    /// (the `load` of the last NOTIFY, no estimate between reports), ties
    /// at random; never refuses.
    LeastReported,
    /// Comparison (not a product policy): power of two choices, two
    /// distinct MSRs at random, the one with the lower last-reported load
    /// (a tie at random); never refuses.
    TwoChoices,
    /// Comparison (not a product policy): `pooled` with SPEC §10's
    /// capacity taken literally, `max-calls` × performance coefficient. It
    /// reads the product's own estimate inputs (the collector's
    /// [`LoadTable`]: last `calls`, placements minus ends since the report
    /// less the flight) and admits as `pooled` does (last reported load
    /// below 100); only the divisor differs. Ties at random; refused when
    /// every MSR reports 100. Shows why the product divides by `max-calls`
    /// alone (BALANCING.md, "The capacity in the estimate").
    PooledLiteral,
}

impl Policy {
    /// The name used on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Pooled => "pooled",
            Policy::Ecss => "ecss",
            Policy::Oracle => "oracle",
            Policy::RoundRobin => "round-robin",
            Policy::WebSip => "web-sip",
            Policy::CallLoad => "call-load",
            Policy::LeastReported => "least-reported",
            Policy::TwoChoices => "two-choices",
            Policy::PooledLiteral => "pooled-literal",
        }
    }

    /// Every policy, validation ones included, in table order.
    pub const ALL: [Policy; 9] = [
        Policy::Pooled,
        Policy::Ecss,
        Policy::WebSip,
        Policy::CallLoad,
        Policy::LeastReported,
        Policy::TwoChoices,
        Policy::Oracle,
        Policy::RoundRobin,
        Policy::PooledLiteral,
    ];

    /// The product's policies and the comparison ones (SPEC §10's table).
    pub const COMPARED: [Policy; 6] = [
        Policy::Pooled,
        Policy::Ecss,
        Policy::WebSip,
        Policy::CallLoad,
        Policy::LeastReported,
        Policy::TwoChoices,
    ];

    /// The policy named `name` ([`Policy::name`]).
    pub fn from_name(name: &str) -> Option<Policy> {
        Policy::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// Holding-time distribution.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Holding {
    /// Exponential with this mean.
    Exponential(Duration),
    /// Always this long.
    Deterministic(Duration),
}

impl Holding {
    fn mean_secs(self) -> f64 {
        match self {
            Holding::Exponential(d) | Holding::Deterministic(d) => d.as_secs_f64(),
        }
    }

    fn sample(self, rng: &mut StdRng) -> f64 {
        match self {
            Holding::Exponential(d) => exponential(rng, 1.0 / d.as_secs_f64()),
            Holding::Deterministic(d) => d.as_secs_f64(),
        }
    }
}

/// One simulation.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// Sessions of each MSR (its `max-calls`).
    pub capacities: Vec<u32>,
    /// Performance coefficient of each MSR.
    pub coefficients: Vec<f64>,
    /// Offered traffic as a fraction of the summed capacity.
    pub offered: f64,
    /// G, the number of core hosts.
    pub core_hosts: u32,
    /// Holding times.
    pub holding: Holding,
    /// NOTIFY flight time.
    pub report_delay: Duration,
    /// `<general load-delta>`.
    pub load_delta: u8,
    /// `<agent notify-high-water>` (101: off).
    pub high_water: u8,
    /// The policy of every core host.
    pub policy: Policy,
    /// Whether the core releases legs at call end (SPEC §9).
    pub releases: bool,
    /// Calls measured (after the warm-up).
    pub calls: u64,
    /// Batches for the confidence interval.
    pub batches: u32,
    /// RNG seed.
    pub seed: u64,
}

impl Scenario {
    /// Scenario A: 10 MSRs × 100 sessions, coefficients 1.
    pub fn a(offered: f64) -> Self {
        Self::with(vec![100; 10], vec![1.0; 10], offered)
    }

    /// Scenario B: MSRs of 100, 100, 200, 200, 400, 400 sessions,
    /// coefficients 1, 1, 2, 2, 4, 4.
    pub fn b(offered: f64) -> Self {
        Self::with(
            vec![100, 100, 200, 200, 400, 400],
            vec![1.0, 1.0, 2.0, 2.0, 4.0, 4.0],
            offered,
        )
    }

    /// `msrs` MSRs of `sessions` sessions each, coefficients 1 (scenario
    /// A's shape at another size, e.g. the end-to-end check's 10 × 20).
    pub fn uniform(msrs: usize, sessions: u32, offered: f64) -> Self {
        Self::with(vec![sessions; msrs], vec![1.0; msrs], offered)
    }

    fn with(capacities: Vec<u32>, coefficients: Vec<f64>, offered: f64) -> Self {
        Self {
            capacities,
            coefficients,
            offered,
            core_hosts: 1,
            holding: Holding::Exponential(Duration::from_secs(120)),
            report_delay: Duration::from_millis(20),
            load_delta: 10,
            high_water: msr_agent::notifier::DEFAULT_HIGH_WATER,
            policy: Policy::Pooled,
            releases: true,
            calls: 200_000,
            batches: 20,
            seed: 1,
        }
    }

    /// The offered traffic in Erlangs.
    pub fn erlangs(&self) -> f64 {
        self.offered * f64::from(self.capacities.iter().sum::<u32>())
    }
}

/// What a run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Calls measured.
    pub calls: u64,
    /// Blocked fraction (mean of the batch means).
    pub blocking: f64,
    /// Half-width of its 99 % confidence interval (batch means, Student t).
    pub half_width: f64,
    /// Erlang-B of the offered traffic on the summed capacity.
    pub pooled_erlang_b: f64,
    /// Of the blocked calls, the share refused by selection (the rest were
    /// sent to an MSR that was full).
    pub refused_share: f64,
    /// Time average of the momentary spread of occupancy between MSRs
    /// (max − min, percentage points).
    pub spread_pp: f64,
    /// NOTIFYs per second, all subscriptions.
    pub notify_per_sec: f64,
    /// NOTIFYs per second per subscription (MSR × core host), the most of
    /// any subscription.
    pub max_notify_per_sec_per_subscription: f64,
    /// Simulated seconds measured.
    pub simulated_secs: f64,
    /// Of the measured calls a core host sent to an MSR (not refused), the
    /// share that found it actually full: what refusing in overload (SPEC
    /// §10) is meant to keep small.
    pub full_share: f64,
    /// Window ends that found their held change not yet due (should be 0:
    /// an event is queued at the window's exact end, issue 24 defect b).
    pub early_window_ends: u64,
}

impl Outcome {
    /// Blocking over the pooled Erlang-B limit.
    pub fn times_pooled(&self) -> f64 {
        if self.pooled_erlang_b > 0.0 {
            self.blocking / self.pooled_erlang_b
        } else {
            f64::NAN
        }
    }
}

/// Erlang-B blocking of `erlangs` offered to `servers` (the stable
/// recursion B(0) = 1, B(n) = A·B(n−1) / (n + A·B(n−1))).
pub fn erlang_b(erlangs: f64, servers: u32) -> f64 {
    let mut b = 1.0;
    for n in 1..=servers {
        b = erlangs * b / (f64::from(n) + erlangs * b);
    }
    b
}

/// Takács' blocking of a GI/M/c/c queue whose interarrival times are
/// Erlang-`k` with rate `stage_rate` per stage (what each of `k` MSRs sees
/// under round robin of a Poisson stream of that rate), with service rate
/// `mu`: 1/B = Σ_{j=0}^{c} C(c, j) Π_{i=1}^{j} (1 − φ(iμ)) / φ(iμ), φ the
/// interarrival Laplace–Stieltjes transform (λ / (λ + s))^k.
pub fn takacs_round_robin(stage_rate: f64, k: u32, mu: f64, c: u32) -> f64 {
    let phi = |s: f64| (stage_rate / (stage_rate + s)).powi(i32::try_from(k).unwrap_or(i32::MAX));
    let mut sum = 1.0;
    let mut product = 1.0;
    let mut binom = 1.0;
    for j in 1..=c {
        let p = phi(f64::from(j) * mu);
        product *= (1.0 - p) / p;
        binom *= f64::from(c - j + 1) / f64::from(j);
        sum += binom * product;
    }
    1.0 / sum
}

fn exponential(rng: &mut StdRng, rate: f64) -> f64 {
    // 1 − U is in (0, 1]: never ln 0.
    -(1.0 - rng.gen::<f64>()).ln() / rate
}

/// Student t quantile 0.995 (two-sided 99 %) for `df` degrees of freedom.
fn t_995(df: u32) -> f64 {
    match df {
        0 => f64::INFINITY,
        1 => 63.657,
        2 => 9.925,
        3 => 5.841,
        4 => 4.604,
        5..=9 => 3.25,
        10..=19 => 2.861,
        20..=29 => 2.756,
        30..=59 => 2.660,
        _ => 2.576,
    }
}

/// Blocking as the mean of the batch blocking ratios and the half-width of
/// its 99 % confidence interval (Student t over the batch means), from each
/// batch's blocked and offered calls; batches with no call are left out.
/// `msr-loadgen calls` reports the real system's blocking the same way.
pub fn batch_means(blocked: &[u64], offered: &[u64]) -> (f64, f64) {
    let means: Vec<f64> = blocked
        .iter()
        .zip(offered)
        .filter(|(_, &o)| o > 0)
        .map(|(&b, &o)| b as f64 / o as f64)
        .collect();
    let k = means.len().max(1) as f64;
    let mean = means.iter().sum::<f64>() / k;
    let var = means.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (k - 1.0).max(1.0);
    let df = u32::try_from(means.len().saturating_sub(1)).unwrap_or(u32::MAX);
    (mean, t_995(df) * (var / k).sqrt())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// The next call arrives.
    Arrival,
    /// Call `id` on MSR `msr`, placed by core host `host`, ends.
    Departure { id: u64, host: u32, msr: u32 },
    /// The rate-limit window of MSR `msr`'s subscription from `host` ends.
    WindowEnd { msr: u32, host: u32 },
    /// A NOTIFY of MSR `msr` (calls `calls`) reaches `host`.
    Notify { msr: u32, host: u32, calls: u32 },
}

/// One core host: the collector's state.
struct Host {
    table: LoadTable,
    legs: LegTable,
    next_rr: usize,
    seen: Seen,
}

/// What a comparison policy knows on one core host, per MSR (the
/// product's policies read the [`LoadTable`] instead).
#[derive(Debug, Clone, Default)]
struct Seen {
    /// `calls` of the last NOTIFY that reached this host (`None`: none yet).
    reported: Vec<Option<u32>>,
    /// Legs this host placed since that NOTIFY arrived.
    placed_since: Vec<u32>,
    /// Calls this host placed that it has not seen end.
    active: Vec<u32>,
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
    let names: Vec<String> = (0..n).map(|i| format!("msr_{i}")).collect();
    let contacts: Vec<String> = names.iter().map(|m| format!("lo@{m}")).collect();
    let base = Instant::now();
    // Event times are integer nanoseconds since `base`, exactly as the
    // product's `Instant`s differ: a time that went through f64 seconds
    // could land a nanosecond before the gate's window end, and the held
    // change would then wait for the next change (issue 24, defect b).
    let at = |t_ns: u64| base + Duration::from_nanos(t_ns);
    let delay_ns = u64::try_from(scenario.report_delay.as_nanos()).unwrap_or(u64::MAX);
    let mut operator = OperatorConfig::new();
    operator.declare_site("local")?;
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
            let defaults = Placement {
                zone: "default".into(),
                site: "local".into(),
            };
            let mut table = LoadTable::new(format!("core{h}"), defaults);
            table.set_notify_flight_time(scenario.report_delay);
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
            Host {
                table,
                // Legs live for the run: a core that releases nothing must
                // not get its legs expired for it.
                legs: LegTable::new(
                    DEFAULT_MAX_DURATION.max(Duration::from_secs(100 * 365 * 86_400)),
                ),
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
        min_interval: Duration::from_secs(1),
    };
    let g = scenario.core_hosts as usize;
    // gates[msr * G + host]; `window_queued` avoids a second WindowEnd.
    let mut gates = vec![NotifyGate::default(); n * g];
    let mut window_queued = vec![false; n * g];
    let mut notifies = vec![0_u64; n * g];
    let mut busy = vec![0_u32; n];
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
    let (mut refused, mut lost_full) = (0_u64, 0_u64);
    let mut early_window_ends = 0_u64;
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
                let chosen = choose(
                    scenario,
                    &selection,
                    &mut hosts[h],
                    &operator,
                    &busy,
                    now,
                    &mut rng,
                );
                let measured = arrivals > warmup;
                let batch =
                    ((arrivals.saturating_sub(warmup + 1)) / batch_size).min(batches - 1) as usize;
                if measured {
                    batch_offered[batch] += 1;
                }
                match chosen {
                    Some(m) if busy[m] < scenario.capacities[m] => {
                        busy[m] += 1;
                        changed = Some(m);
                        let call_id = id.to_string();
                        let host = &mut hosts[h];
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
                    Some(_) => {
                        if measured {
                            batch_blocked[batch] += 1;
                            lost_full += 1;
                        }
                    }
                    None => {
                        if measured {
                            batch_blocked[batch] += 1;
                            refused += 1;
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
                window_queued[i] = false;
                if gates[i].held_until(&rule).is_some_and(|end| now < end) {
                    early_window_ends += 1;
                }
                if gates[i].due(&rule, now) {
                    let m = msr as usize;
                    let latest = Reported {
                        load: percent(busy[m], scenario.capacities[m]),
                        calls: busy[m],
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
                            },
                        );
                    }
                }
            }
            Event::Notify { msr, host, calls } => {
                let m = msr as usize;
                let cap = scenario.capacities[m];
                let report = LoadReport {
                    msr: names[m].clone(),
                    load: percent(calls, cap),
                    cpu: 0,
                    calls,
                    max_calls: cap,
                };
                let host = &mut hosts[host as usize];
                let change = Change::LoadReported {
                    msr: &names[m],
                    report,
                    at: now,
                };
                host.table.apply(&operator, change);
                host.seen.reported[m] = Some(calls);
                host.seen.placed_since[m] = 0;
            }
        }
        if let Some(m) = changed {
            let latest = Reported {
                load: percent(busy[m], scenario.capacities[m]),
                calls: busy[m],
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
                            },
                        );
                    }
                    Verdict::HoldUntil(end) if !window_queued[i] => {
                        window_queued[i] = true;
                        let end = u64::try_from(end.saturating_duration_since(base).as_nanos())
                            .unwrap_or(u64::MAX);
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
    let blocked = refused + lost_full;
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
        full_share: {
            let offered: u64 = batch_offered.iter().sum();
            let sent = offered.saturating_sub(refused);
            if sent > 0 {
                lost_full as f64 / sent as f64
            } else {
                0.0
            }
        },
        early_window_ends,
    })
}

/// The MSR core host `host` chooses for a new call, `None` on a refusal.
fn choose(
    scenario: &Scenario,
    selection: &SelectionConfig,
    host: &mut Host,
    operator: &OperatorConfig,
    busy: &[u32],
    now: Instant,
    rng: &mut StdRng,
) -> Option<usize> {
    let n = busy.len();
    match scenario.policy {
        Policy::Pooled | Policy::Ecss => {
            // What the collector does for a select with a call_id.
            let policy = effective_policy(
                selection,
                true,
                host.legs.last_release(),
                now,
                scenario.core_hosts,
            );
            let query = Query {
                zone: "default".into(),
                site: "local".into(),
                msr: None,
                admission: Admission::Plain,
                policy,
                now,
            };
            let choice = select::select(&host.table, operator.topology(), &query, rng).ok()?;
            choice
                .msr
                .strip_prefix("msr_")
                .and_then(|i| i.parse::<usize>().ok())
        }
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

/// The momentary spread of occupancy between MSRs: max − min of `busy[m]
/// / capacities[m]`, in percentage points (0 for fewer than two MSRs).
/// [`Outcome::spread_pp`] is its time average; `msr-loadgen calls`
/// measures the real system with this same definition.
pub fn spread_pp(busy: &[u32], capacities: &[u32]) -> f64 {
    let (lo, hi) = busy
        .iter()
        .zip(capacities)
        .map(|(&b, &c)| f64::from(b) / f64::from(c.max(1)))
        .fold((f64::MAX, f64::MIN), |(lo, hi), o| (lo.min(o), hi.max(o)));
    if hi >= lo {
        (hi - lo) * 100.0
    } else {
        0.0
    }
}

/// The item of the lowest key, ties at random (reservoir sampling: the
/// k-th equal one replaces the choice with probability 1/k, the same draws
/// as `collector::select`'s pooled pick); `None` when there is none.
fn lowest_ties_at_random<K: PartialOrd>(
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
fn percent(calls: u32, capacity: u32) -> u8 {
    u8::try_from((u64::from(calls) * 100 / u64::from(capacity.max(1))).min(100)).unwrap_or(100)
}

/// One validation: what was measured against the closed form.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// What is checked.
    pub name: &'static str,
    /// The closed form.
    pub exact: f64,
    /// The simulation.
    pub outcome: Outcome,
}

impl Check {
    /// The closed form is inside the 99 % confidence interval.
    pub fn passed(&self) -> bool {
        (self.outcome.blocking - self.exact).abs() <= self.outcome.half_width
    }
}

/// The three validations of SPEC §10, with `calls` calls each: one MSR
/// with Poisson arrivals vs Erlang-B(A, C); the perfectly informed oracle
/// over scenario A vs Erlang-B(A, ΣC); round robin from one host over 3
/// MSRs × 10 sessions vs Takács' GI/M/C/C with Erlang-3 interarrivals.
///
/// # Errors
/// [`SimError`] when a scenario cannot be set up.
pub fn validate(calls: u64, seed: u64) -> Result<Vec<Check>, SimError> {
    let mut checks = Vec::new();
    // One MSR of 20 sessions at 15 Erlangs (B ≈ 4.6 %): the oracle over a
    // single MSR is "offer it every call".
    let mut one = Scenario::with(vec![20], vec![1.0], 0.75);
    one.policy = Policy::Oracle;
    one.calls = calls;
    one.seed = seed;
    checks.push(Check {
        name: "one MSR vs Erlang-B(A, C)",
        exact: erlang_b(one.erlangs(), 20),
        outcome: run(&one)?,
    });
    // The oracle over 4 MSRs of 10 sessions at 85 %: Erlang-B(34, 40).
    let mut oracle = Scenario::with(vec![10; 4], vec![1.0; 4], 0.85);
    oracle.policy = Policy::Oracle;
    oracle.calls = calls;
    oracle.seed = seed + 1;
    checks.push(Check {
        name: "perfectly informed vs Erlang-B(A, sum C)",
        exact: erlang_b(oracle.erlangs(), 40),
        outcome: run(&oracle)?,
    });
    // Round robin over 3 MSRs of 10 at 80 %.
    let mut rr = Scenario::with(vec![10; 3], vec![1.0; 3], 0.8);
    rr.policy = Policy::RoundRobin;
    rr.calls = calls;
    rr.seed = seed + 2;
    let lambda = rr.erlangs() / rr.holding.mean_secs();
    checks.push(Check {
        name: "round robin vs Takacs GI/M/C/C",
        exact: takacs_round_robin(lambda, 3, 1.0 / rr.holding.mean_secs(), 10),
        outcome: run(&rr)?,
    });
    Ok(checks)
}

pub mod plot;
pub mod report;

#[cfg(test)]
mod tests;
