//! Rows of results: Markdown for BALANCING.md, CSV for `msr-sim plot`, and
//! several rows simulated at once (each row's own seed, so the result does
//! not depend on the number of threads).

use std::sync::Mutex;
use std::time::Duration;

use crate::{run, ClassOutcome, Classes, Holding, Outcome, Policy, Scenario, SimError};

/// One simulated row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Scenario and offered load, e.g. `A 90 %`.
    pub scenario: String,
    /// What differs from the required setup (`-` when nothing).
    pub variant: String,
    /// The policy.
    pub policy: Policy,
    /// G.
    pub core_hosts: u32,
    /// What was measured.
    pub outcome: Outcome,
}

impl Row {
    /// A row for `scenario` simulated as `s`.
    pub fn new(scenario: String, variant: String, s: &Scenario, outcome: Outcome) -> Self {
        Self {
            scenario,
            variant,
            policy: s.policy,
            core_hosts: s.core_hosts,
            outcome,
        }
    }
}

/// What differs in `s` from the required setup of SPEC §10 (holding 120 s
/// exponential, NOTIFY delay 20 ms, `load-delta` 10, high water 80, legs
/// released), `-` when nothing.
pub fn variant(s: &Scenario) -> String {
    let mut parts = Vec::new();
    match s.holding {
        Holding::Exponential(d) if d == Duration::from_secs(120) => {}
        Holding::Exponential(d) => parts.push(format!("holding {} s", d.as_secs())),
        Holding::Deterministic(d) => {
            parts.push(format!("holding {} s deterministic", d.as_secs()));
        }
    }
    if s.report_delay != Duration::from_millis(20) {
        parts.push(format!("delay {} ms", s.report_delay.as_millis()));
    }
    if s.load_delta != 10 {
        parts.push(format!("load-delta {}", s.load_delta));
    }
    if s.high_water != msr_agent::notifier::DEFAULT_HIGH_WATER {
        parts.push(format!("high water {}", s.high_water));
    }
    if s.min_interval != Duration::from_millis(msr_agent::config::DEFAULT_NOTIFY_MIN_INTERVAL_MS) {
        parts.push(format!("min interval {} ms", s.min_interval.as_millis()));
    }
    if s.top_interval != Duration::from_millis(msr_agent::config::DEFAULT_NOTIFY_TOP_INTERVAL_MS) {
        parts.push(format!("top interval {} ms", s.top_interval.as_millis()));
    }
    if s.sample_interval != Duration::from_millis(msr_agent::config::DEFAULT_SAMPLE_INTERVAL_MS) {
        parts.push(format!("sample {} ms", s.sample_interval.as_millis()));
    }
    if !s.sample_age {
        parts.push("no sample age".to_owned());
    }
    if !s.releases {
        parts.push("no releases".to_owned());
    }
    if !s.call_ids {
        parts.push("no call-id".to_owned());
    }
    if s.seed != 1 {
        parts.push(format!("seed {}", s.seed));
    }
    if s.failover_attempts > 1 {
        parts.push(format!("failover {} attempts", s.failover_attempts));
    }
    if let Some(c) = s.capabilities {
        parts.push(format!(
            "video: {} MSRs, {} % of calls",
            c.video_msrs,
            c.video_share * 100.0
        ));
    }
    if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join(", ")
    }
}

const HEADER: &str = "| scenario | variant | policy | G | calls | blocking ± 99 % CI | pooled Erlang-B | × pooled | refused by selection | sent to a full MSR | spread (pp) | NOTIFY/s | max NOTIFY/s per subscription |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|";

/// The rows as a Markdown table.
pub fn markdown(rows: &[Row]) -> String {
    let mut out = HEADER.to_owned();
    for r in rows {
        let o = &r.outcome;
        out.push_str(&format!(
            "\n| {} | {} | {} | {} | {} | {:.2e} ± {:.1e} | {:.2e} | {:.1} | {:.0} % | {:.2} % | {:.1} | {:.2} | {:.2} |",
            r.scenario,
            r.variant,
            r.policy.name(),
            r.core_hosts,
            o.calls,
            o.blocking,
            o.half_width,
            o.pooled_erlang_b,
            o.times_pooled(),
            o.refused_share * 100.0,
            o.full_share * 100.0,
            o.spread_pp,
            o.notify_per_sec,
            o.max_notify_per_sec_per_subscription,
        ));
    }
    out
}

/// The rows of `msr-sim hosts` (SPEC §10 with G core hosts), one table per
/// scenario, in the order given; `msrs[i]` is row i's number of MSRs, for
/// the NOTIFYs per MSR.
pub fn hosts_markdown(rows: &[Row], msrs: &[usize]) -> String {
    let mut out = String::new();
    let mut scenario: Option<&str> = None;
    for (r, &n) in rows.iter().zip(msrs) {
        if scenario != Some(r.scenario.as_str()) {
            scenario = Some(&r.scenario);
            if !out.is_empty() {
                out.push_str("\n\n");
            }
            out.push_str(&format!(
                "{}, pooled Erlang-B {:.2e}\n\n| G | holding, seed | calls | blocking ± 99 % CI | × pooled [99 % interval] | refused by selection (of blocked) | selections sent to a full MSR | NOTIFY/s per MSR (all its subscriptions) | max NOTIFY/s per subscription |\n|---|---|---|---|---|---|---|---|---|",
                r.scenario, r.outcome.pooled_erlang_b
            ));
        }
        let o = &r.outcome;
        let (low, high) = o.times_pooled_interval();
        let times = if o.blocking > 0.0 && o.pooled_erlang_b * o.calls as f64 >= 1.0 {
            format!("{:.2} [{:.2}–{:.2}]", o.times_pooled(), low, high)
        } else {
            format!("– ({} lost)", (o.blocking * o.calls as f64).round())
        };
        out.push_str(&format!(
            "\n| {} | {} | {} | {:.2e} ± {:.1e} | {} | {:.0} % | {:.3} % | {:.2} | {:.2} |",
            r.core_hosts,
            r.variant,
            o.calls,
            o.blocking,
            o.half_width,
            times,
            o.refused_share * 100.0,
            o.full_share * 100.0,
            o.notify_per_sec / n.max(1) as f64,
            o.max_notify_per_sec_per_subscription,
        ));
    }
    out
}

const CLASS_HEADER: &str = "| scenario | class | offer | MSRs that take it | calls | blocking ± 99 % CI | class limit | × limit (99 % CI) | refused msr_overloaded | refused no_capable_msr | sent to a full MSR | sent to an MSR lacking a codec |\n|---|---|---|---|---|---|---|---|---|---|---|---|";

/// The capability classes' figures (SPEC §15) of the rows that have them,
/// as a Markdown table followed by the line that says which limit each
/// class is compared with; empty when no row has classes.
pub fn classes_markdown(rows: &[Row]) -> String {
    let with: Vec<(&Row, &Classes)> = rows
        .iter()
        .filter_map(|r| r.outcome.classes.as_ref().map(|c| (r, c)))
        .collect();
    let Some((_, first)) = with.first() else {
        return String::new();
    };
    let mut out = CLASS_HEADER.to_owned();
    for (r, c) in &with {
        let n = c.capabilities.video_msrs;
        for (name, offer, msrs, o) in [
            (
                "audio-only",
                crate::Capabilities::AUDIO_OFFER,
                "all".to_owned(),
                &c.audio,
            ),
            (
                "video",
                crate::Capabilities::VIDEO_OFFER,
                format!("{n} ({} sessions)", c.video_capacity),
                &c.video,
            ),
        ] {
            out.push_str(&format!(
                "\n| {} | {name} | {offer} | {msrs} | {} | {:.2e} ± {:.1e} | {:.2e} | {} | {} | {} | {} | {} |",
                r.scenario,
                o.calls,
                o.blocking,
                o.half_width,
                o.limit,
                times_limit(o),
                o.msr_overloaded + o.other_refusals,
                o.no_capable_msr,
                o.lost_full,
                o.misplaced,
            ));
        }
    }
    let c = first;
    out.push_str(&format!(
        "\n\nClass limits (SPEC §15 classes, §10's pooled limit): video calls, Erlang-B({:.1} E of video traffic, {} sessions of the {} MSRs that take h264) — they can use only those MSRs, and no selection that lets audio calls on them does better; audio-only calls, Erlang-B({:.1} E of all traffic, the summed capacity) — they can use every MSR but share the video MSRs with video calls, so the whole pool's limit is theirs (a reference, not a strict bound: refusing video calls earlier would leave them more room).",
        c.video.erlangs,
        c.video_capacity,
        c.capabilities.video_msrs,
        c.audio.erlangs + c.video.erlangs,
    ));
    out
}

/// `ratio [low, high]` of a class's blocking over its limit, the bounds
/// from the 99 % interval; `-` when the limit is 0.
fn times_limit(o: &ClassOutcome) -> String {
    let (ratio, low, high) = o.times_limit();
    if !ratio.is_finite() {
        return "-".to_owned();
    }
    // Tiny limits (the video class on many sessions) give huge ratios.
    let f = |x: f64| {
        if x >= 1000.0 {
            format!("{x:.2e}")
        } else {
            format!("{x:.2}")
        }
    };
    format!("{} [{}, {}]", f(ratio), f(low), f(high))
}

const CSV_HEADER: &str = "scenario,variant,policy,core_hosts,calls,blocking,half_width,pooled_erlang_b,refused_share,spread_pp,notify_per_sec,max_notify_per_sec_per_subscription,simulated_secs,full_share";

/// The rows as CSV (full precision; no field holds a comma).
pub fn csv(rows: &[Row]) -> String {
    let mut out = CSV_HEADER.to_owned();
    for r in rows {
        let o = &r.outcome;
        out.push_str(&format!(
            "\n{},{},{},{},{},{:e},{:e},{:e},{:e},{:e},{:e},{:e},{:e},{:e}",
            r.scenario,
            r.variant.replace(',', ";"),
            r.policy.name(),
            r.core_hosts,
            o.calls,
            o.blocking,
            o.half_width,
            o.pooled_erlang_b,
            o.refused_share,
            o.spread_pp,
            o.notify_per_sec,
            o.max_notify_per_sec_per_subscription,
            o.simulated_secs,
            o.full_share,
        ));
    }
    out.push('\n');
    out
}

/// Reads what [`csv`] wrote.
///
/// # Errors
/// [`SimError::Scenario`] on a line that is not such a row.
pub fn parse_csv(text: &str) -> Result<Vec<Row>, SimError> {
    let bad = |line: usize, what: &str| SimError::Scenario(format!("csv line {line}: {what}"));
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').collect();
        // 15: a file of an earlier version, with a column since dropped.
        if !(13..=15).contains(&f.len()) {
            return Err(bad(i + 1, "expected 13 to 15 fields"));
        }
        let num = |k: usize| -> Result<f64, SimError> {
            f[k].parse::<f64>().map_err(|_| bad(i + 1, f[k]))
        };
        let policy = Policy::from_name(f[2]).ok_or_else(|| bad(i + 1, f[2]))?;
        rows.push(Row {
            scenario: f[0].to_owned(),
            variant: f[1].to_owned(),
            policy,
            core_hosts: f[3].parse().map_err(|_| bad(i + 1, f[3]))?,
            outcome: Outcome {
                calls: f[4].parse().map_err(|_| bad(i + 1, f[4]))?,
                blocking: num(5)?,
                half_width: num(6)?,
                pooled_erlang_b: num(7)?,
                refused_share: num(8)?,
                spread_pp: num(9)?,
                notify_per_sec: num(10)?,
                max_notify_per_sec_per_subscription: num(11)?,
                simulated_secs: num(12)?,
                // Columns a file of an earlier version lacks read as 0.
                full_share: if f.len() > 13 { num(13)? } else { 0.0 },
                // The CSV holds the overall figures only.
                classes: None,
                core_failure_trips: 0,
                other_health_changes: 0,
                overload_entries: 0,
            },
        });
    }
    Ok(rows)
}

/// Simulates every `(scenario label, scenario)` on `jobs` threads; the
/// rows come back in the order given.
///
/// # Errors
/// The first [`SimError`] of a row.
pub fn run_all(specs: Vec<(String, Scenario)>, jobs: usize) -> Result<Vec<Row>, SimError> {
    let total = specs.len();
    let next = Mutex::new(0_usize);
    let results: Mutex<Vec<Option<Result<Row, SimError>>>> =
        Mutex::new((0..total).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..jobs.clamp(1, total.max(1)) {
            scope.spawn(|| loop {
                let i = {
                    let Ok(mut next) = next.lock() else { return };
                    let i = *next;
                    *next += 1;
                    i
                };
                let Some((label, s)) = specs.get(i) else {
                    return;
                };
                let row = run(s).map(|o| Row::new(label.clone(), variant(s), s, o));
                if let Ok(r) = &row {
                    eprintln!(
                        "{}/{total} {} {} {} G={}: {:.2e}",
                        i + 1,
                        r.scenario,
                        r.variant,
                        r.policy.name(),
                        r.core_hosts,
                        r.outcome.blocking
                    );
                }
                if let Ok(mut results) = results.lock() {
                    results[i] = Some(row);
                }
            });
        }
    });
    let results = results
        .into_inner()
        .map_err(|_| SimError::Scenario("a simulation thread panicked".into()))?;
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(SimError::Scenario("a row was not simulated".into()))))
        .collect()
}
