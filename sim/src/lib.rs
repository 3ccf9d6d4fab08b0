//! `msr-sim`: a discrete-event simulator of media-server balancing (SPEC
//! §10) that runs the product's own code, not a model of it:
//!
//! * each of G core hosts has its own collector state — a
//!   [`LoadTable`](msr_collector::model::load_table::LoadTable), a
//!   [`LegTable`](msr_collector::model::legs::LegTable) and the operator
//!   configuration — and picks an MSR with
//!   [`msr_collector::select::select`] under the policy
//!   [`msr_collector::core::admin::effective_policy`] gives it (so the `pooled`
//!   fallback to `ecss` is the collector's own); placements and releases
//!   reach the estimate through the same `note_placed` / `release_at` /
//!   `note_ended` calls the control protocol makes;
//! * each MSR is a simulated agent whose NOTIFYs to each core host follow
//!   [`msr_agent::notifier::NotifyGate`] (load-delta, 100 % edges,
//!   high-water, one per second, coalescing), delivered after a delay;
//! * Poisson arrivals spread evenly over the core hosts, exponential or
//!   deterministic holding times, all in virtual time (a
//!   [`BinaryHeap`](std::collections::BinaryHeap) of events); seeded, so every run is reproducible.
//!
//! A leg placed on an MSR that is in fact full is lost there (the MSR
//! refuses the INVITE), unless the core fails over (SPEC §14,
//! [`Scenario::failover_attempts`]): then it is selected again without
//! that MSR, up to the attempts. A refusal by selection is lost too. Blocking is
//! measured with batch means after a warm-up, and compared with the pooled
//! Erlang-B limit (one server group of the summed capacity).
//!
//! Capability classes (SPEC §15, [`Capabilities`], `msr-sim run
//! --video-msrs N --video-share P`): some MSRs report `codecs:
//! pcma,pcmu,h264` in their NOTIFYs, the others `pcma,pcmu`; each call
//! offers `pcma,h264` or `pcma`, and its select names that offer
//! (`Query::needs`), so the product's step 1 keeps only the MSRs that take
//! it. Each class's blocking is measured beside its own pooled Erlang-B
//! limit ([`Classes`]).
//!
//! Validation policies (no product code, [`Policy::Oracle`],
//! [`Policy::RoundRobin`], and one MSR) check the event loop and the
//! estimators against closed forms ([`validate`]).
//!
//! Comparison policies (no product code either; they are *not* policies
//! of the product, only what SPEC §10 measures the product against):
//! [`Policy::WebSip`], [`Policy::CallLoad`], [`Policy::LeastReported`] and
//! [`Policy::TwoChoices`], each a few lines in
//! `policies::choose` over the core host's own view
//! (`event_loop::Seen`): the last `calls` each MSR reported to it,
//! the legs it placed since, and the calls it placed that have not ended.

mod event_loop;
mod policies;
mod stats;
mod validation;

pub use event_loop::run;
pub use stats::{batch_means, erlang_b, spread_pp, takacs_round_robin};
pub use validation::{validate, Check};

use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;

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
    /// [`LoadTable`](msr_collector::model::load_table::LoadTable): last
    /// `calls`, placements minus ends since the report less the flight) and admits as `pooled` does (last reported load
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

/// Capability classes (SPEC §15): which MSRs take video and which calls
/// offer it, so that blocking covers a mixed pool. Without them (the
/// default) no agent reports codecs and no call names a need, as before
/// §15.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Capabilities {
    /// The first this many MSRs of the scenario (`msr_0`, `msr_1`, …)
    /// report `codecs: pcma,pcmu,h264`, the others `codecs: pcma,pcmu`.
    pub video_msrs: usize,
    /// The share of calls (0 to 1) whose offer is `pcma,h264`; the others
    /// offer `pcma` alone.
    pub video_share: f64,
}

impl Capabilities {
    /// What a video MSR takes, in its priority order.
    pub const VIDEO_MSR: &'static str = "pcma,pcmu,h264";
    /// What any other MSR takes.
    pub const AUDIO_MSR: &'static str = "pcma,pcmu";
    /// A video call's offer.
    pub const VIDEO_OFFER: &'static str = "pcma,h264";
    /// An audio-only call's offer.
    pub const AUDIO_OFFER: &'static str = "pcma";
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
    /// `<agent notify-min-interval-ms>`.
    pub min_interval: Duration,
    /// `<agent notify-top-interval-ms>`.
    pub top_interval: Duration,
    /// `<agent sample-interval-ms>`: the agent sees a change of `calls` at
    /// its next sample, every this often (near the top every
    /// `top_interval` when shorter, `NotifyRule::sample_interval`); zero:
    /// at once.
    pub sample_interval: Duration,
    /// Whether the agent's NOTIFY carries `sample-age-ms` (SPEC §10).
    pub sample_age: bool,
    /// The policy of every core host.
    pub policy: Policy,
    /// Whether the core releases legs at call end (SPEC §9).
    pub releases: bool,
    /// Whether the core names each call (`call_id`, SPEC §9). Without, no
    /// leg is bound and `pooled` selects by its `ecss` fallback, counting
    /// its own placements near the top (SPEC §10).
    pub call_ids: bool,
    /// Calls measured (after the warm-up).
    pub calls: u64,
    /// Batches for the confidence interval.
    pub batches: u32,
    /// RNG seed.
    pub seed: u64,
    /// Capability classes (SPEC §15); `None`: every MSR takes every call.
    pub capabilities: Option<Capabilities>,
    /// The MSRs one call may be given in all (SPEC §14, `[selection]
    /// failover_attempts`): a call an MSR refuses is selected again with
    /// that MSR named failed. 1: no failover, the call is lost at the
    /// first MSR that refuses it. Only the product's policies fail over.
    pub failover_attempts: u32,
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
            min_interval: Duration::from_millis(msr_agent::config::DEFAULT_NOTIFY_MIN_INTERVAL_MS),
            top_interval: Duration::from_millis(msr_agent::config::DEFAULT_NOTIFY_TOP_INTERVAL_MS),
            sample_interval: Duration::from_millis(msr_agent::config::DEFAULT_SAMPLE_INTERVAL_MS),
            sample_age: true,
            policy: Policy::Pooled,
            releases: true,
            call_ids: true,
            calls: 200_000,
            batches: 20,
            seed: 1,
            capabilities: None,
            failover_attempts: 1,
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
    /// Each capability class's figures, when the scenario has classes.
    pub classes: Option<Classes>,
    /// Times the failures the core reported with its failovers (SPEC §14)
    /// took an MSR out of selection on a core host (the collector's own
    /// `HealthMonitor`, its default limits).
    pub core_failure_trips: u64,
    /// Health changes of any other cause than registration, recovery and
    /// those trips: a part of the collector the simulation does not feed
    /// (expected 0).
    pub other_health_changes: u64,
    /// Times a core host's zone entered overload (SPEC §10: `pooled` then
    /// keeps a headroom; `msr_collector::model::overload`).
    pub overload_entries: u64,
}

/// The figures of each class of calls (SPEC §15), measured over the same
/// calls and batches as the overall blocking.
#[derive(Debug, Clone, PartialEq)]
pub struct Classes {
    /// Calls offering `pcma` alone.
    pub audio: ClassOutcome,
    /// Calls offering `pcma,h264`.
    pub video: ClassOutcome,
    /// The scenario's classes.
    pub capabilities: Capabilities,
    /// Sessions of the MSRs that take video.
    pub video_capacity: u32,
}

/// What one class of calls met.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassOutcome {
    /// Measured calls of this class.
    pub calls: u64,
    /// Blocked fraction (mean of the batch means).
    pub blocking: f64,
    /// Half-width of its 99 % confidence interval.
    pub half_width: f64,
    /// Offered traffic of this class, Erlangs.
    pub erlangs: f64,
    /// The class's pooled Erlang-B limit (`event_loop::class_limits` says
    /// why): for audio-only calls Erlang-B of all the traffic on the
    /// summed capacity, for video calls Erlang-B of the video traffic on
    /// the video MSRs' summed capacity.
    pub limit: f64,
    /// Refused by selection with `no_capable_msr`: no MSR takes the offer.
    pub no_capable_msr: u64,
    /// Refused by selection with `msr_overloaded`: MSRs take it, all full.
    pub msr_overloaded: u64,
    /// Refused by selection for any other cause (none expected: every MSR
    /// is registered, healthy and at the leg's site).
    pub other_refusals: u64,
    /// Sent to an MSR that was in fact full (lost there).
    pub lost_full: u64,
    /// Sent to an MSR that does not take the offer (lost there: the MSR
    /// refuses it, SIP 488). Selection never does this once the MSR's
    /// first report has arrived; expected 0.
    pub misplaced: u64,
}

impl ClassOutcome {
    /// Blocking over the class's limit, with the 99 % interval's ends
    /// over it; NaN when the limit is 0.
    pub fn times_limit(&self) -> (f64, f64, f64) {
        if self.limit > 0.0 {
            (
                self.blocking / self.limit,
                (self.blocking - self.half_width).max(0.0) / self.limit,
                (self.blocking + self.half_width) / self.limit,
            )
        } else {
            (f64::NAN, f64::NAN, f64::NAN)
        }
    }
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

    /// The 99 % interval of the blocking over the pooled limit, `(low,
    /// high)`; NaN when the limit is 0.
    pub fn times_pooled_interval(&self) -> (f64, f64) {
        if self.pooled_erlang_b > 0.0 {
            (
                (self.blocking - self.half_width).max(0.0) / self.pooled_erlang_b,
                (self.blocking + self.half_width) / self.pooled_erlang_b,
            )
        } else {
            (f64::NAN, f64::NAN)
        }
    }
}

fn exponential(rng: &mut StdRng, rate: f64) -> f64 {
    // 1 − U is in (0, 1]: never ln 0.
    -(1.0 - rng.gen::<f64>()).ln() / rate
}

pub mod plot;
pub mod report;

#[cfg(test)]
mod tests;
