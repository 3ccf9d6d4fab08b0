//! `calls`: a balancing check end to end (SPEC §10): Poisson calls placed
//! and released over the control socket while every MSR's `file:` calls
//! source follows the calls it holds; blocking and occupancy spread as
//! `msr-sim` defines them.
//!
//! With G collectors (`--socket` given G times, one per core host) each
//! arrival goes to one of them drawn at random, as `msr-sim` spreads its
//! arrivals over the core hosts, and its release to the same one. One
//! driver for all G keeps each MSR's true session count, which is what its
//! calls file must hold; each collector still learns of the others' calls
//! only from the agents' NOTIFYs.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::process::percentile;

use crate::CallsArgs;
use anyhow::{bail, Context};
use msr_shared::admin::RegistrationStatus;
use msr_shared::admin::{ErrorCode, Request, Response, ResponseData, SelectQuery};
use msr_shared::subscription::SubscriptionState;
use system_tests::system::try_write_atomic;
use system_tests::AdminClient;

/// `NAME=PATH` of `--msr`.
pub(crate) fn parse_msr_file(text: &str) -> Result<(String, PathBuf), String> {
    match text.split_once('=') {
        Some((name, path)) if !name.is_empty() && !path.is_empty() => {
            Ok((name.to_owned(), PathBuf::from(path)))
        }
        _ => Err(format!("expected NAME=PATH, got `{text}`")),
    }
}

/// A call in progress: when it ends, its Call-ID number, which MSR holds
/// it, and which collector placed it (its release goes there).
pub(crate) type Live = Reverse<(Instant, u64, usize, usize)>;

/// Draws the collector of each arrival. Its own generator, so the arrivals
/// and holding times of a seed are the same whatever G is (with G = 1 it
/// draws nothing).
pub(crate) struct CollectorDraw {
    rng: rand::rngs::StdRng,
    count: usize,
}

impl CollectorDraw {
    pub(crate) fn new(seed: u64, count: usize) -> Self {
        use rand::SeedableRng;
        // A fixed offset keeps this stream apart from the arrivals' (seed).
        Self {
            rng: rand::rngs::StdRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15),
            count: count.max(1),
        }
    }

    pub(crate) fn next(&mut self) -> usize {
        use rand::Rng;
        if self.count == 1 {
            0
        } else {
            self.rng.gen_range(0..self.count)
        }
    }
}

/// The MSRs' `max-calls` as every collector reports them: the same in
/// each, or an error naming the first collector that differs.
pub(crate) fn agreed_capacities(per_collector: &[Vec<u32>]) -> Result<Vec<u32>, String> {
    let Some((first, rest)) = per_collector.split_first() else {
        return Err("no collector".to_owned());
    };
    match rest.iter().position(|c| c != first) {
        None => Ok(first.clone()),
        Some(i) => Err(format!(
            "collector {} reports max-calls {:?}, collector 1 {first:?}",
            i + 2,
            rest[i]
        )),
    }
}

/// NOTIFY/s over all subscriptions and on the busiest one, from each
/// subscription's NOTIFY count before and after `secs` seconds.
pub(crate) fn notify_rates(before: &[u64], after: &[u64], secs: f64) -> (f64, f64) {
    if secs <= 0.0 {
        return (0.0, 0.0);
    }
    let deltas: Vec<u64> = after
        .iter()
        .zip(before)
        .map(|(a, b)| a.saturating_sub(*b))
        .collect();
    (
        deltas.iter().sum::<u64>() as f64 / secs,
        deltas.iter().copied().max().unwrap_or(0) as f64 / secs,
    )
}

/// What `calls` measured (printed, and written as JSON with `--json`).
#[derive(Debug, Default, serde::Serialize)]
pub(crate) struct CallsSummary {
    pub(crate) msrs: usize,
    pub(crate) sessions: u32,
    pub(crate) erlangs: f64,
    pub(crate) holding_mean_secs: f64,
    pub(crate) seed: u64,
    /// G: the collectors (core hosts) the calls were spread over.
    pub(crate) collectors: usize,
    pub(crate) measured_secs: f64,
    /// Calls arriving in the measured phase.
    pub(crate) offered: u64,
    /// Of those, placed on an MSR with a free session.
    pub(crate) accepted: u64,
    /// Refused by selection, by error code.
    pub(crate) refused: BTreeMap<String, u64>,
    /// Refusals (warm-up included) while every MSR was in fact full.
    pub(crate) refused_when_full: u64,
    /// Refusals (warm-up included) while some MSR had a free session.
    pub(crate) refused_with_room: u64,
    /// Selections (a failover's included) that named an MSR that was in
    /// fact full (its INVITE would fail).
    pub(crate) sent_to_full: u64,
    /// Calls lost at a full MSR: the last MSR they could try was full.
    pub(crate) lost_at_full: u64,
    /// The MSRs one call may be given in all (--failover-attempts).
    pub(crate) failover_attempts: u32,
    /// Selections naming an MSR not given with --msr.
    pub(crate) unknown_msr: u64,
    pub(crate) blocking: f64,
    pub(crate) blocking_half_width: f64,
    pub(crate) pooled_erlang_b: f64,
    pub(crate) times_pooled: f64,
    /// Time average of max − min occupancy between the MSRs, points.
    pub(crate) spread_pp: f64,
    pub(crate) notify_per_sec: f64,
    pub(crate) max_notify_per_sec_per_subscription: f64,
    /// Calls placed on each MSR (warm-up included).
    pub(crate) placed: BTreeMap<String, u64>,
    /// Releases that did not end exactly one live leg.
    pub(crate) release_anomalies: u64,
    /// Live legs `msr list` shows on these MSRs after every release, summed
    /// over the collectors.
    pub(crate) live_legs_after: u64,
    /// How late events (arrivals and call ends) were handled after their
    /// scheduled time, ms: median, 99th percentile, most.
    pub(crate) lag_p50_ms: f64,
    pub(crate) lag_p99_ms: f64,
    pub(crate) max_lag_ms: f64,
}

pub(crate) fn exponential_secs(rng: &mut rand::rngs::StdRng, rate: f64) -> f64 {
    use rand::Rng;
    // 1 − U is in (0, 1]: never ln 0.
    -(1.0 - rng.gen::<f64>()).ln() / rate
}

/// Declares `site` (an existing one is fine).
pub(crate) async fn declare_site(admin: &mut AdminClient, site: &str) -> anyhow::Result<()> {
    match admin
        .call(&Request::SiteDeclare {
            name: site.to_owned(),
        })
        .await?
    {
        Response::Ok(_) => println!("declared site `{site}`"),
        Response::Err(e) if e.code == ErrorCode::SiteExists => {
            println!("site `{site}` already declared")
        }
        Response::Err(e) => bail!("site declare: {}: {}", e.code, e.message),
    }
    Ok(())
}

/// NOTIFYs each of `names` has sent on its current subscription.
pub(crate) async fn notify_counts(
    admin: &mut AdminClient,
    names: &[String],
) -> anyhow::Result<Vec<u64>> {
    let rows = match admin.call(&Request::SubscriptionList {}).await? {
        Response::Ok(ResponseData::Subscriptions { rows }) => rows,
        other => bail!("subscription list: unexpected answer {other:?}"),
    };
    Ok(names
        .iter()
        .map(|n| {
            rows.iter()
                .filter(|r| &r.msr == n)
                .map(|r| r.notify_count)
                .sum()
        })
        .collect())
}

/// NOTIFY counts of every subscription: each collector's, one per MSR,
/// collector after collector.
async fn all_notify_counts(
    admins: &mut [AdminClient],
    names: &[String],
) -> anyhow::Result<Vec<u64>> {
    let mut counts = Vec::with_capacity(admins.len() * names.len());
    for admin in admins {
        counts.extend(notify_counts(admin, names).await?);
    }
    Ok(counts)
}

/// The MSRs' `max-calls`, once every one is live and reports 0 calls.
pub(crate) async fn wait_idle_pool(
    admin: &mut AdminClient,
    names: &[String],
    limit: Duration,
) -> anyhow::Result<Vec<u32>> {
    let deadline = Instant::now() + limit;
    loop {
        if let Response::Ok(ResponseData::Resources { rows }) = admin
            .call(&Request::ResourceList { active_only: false })
            .await?
        {
            let capacities: Option<Vec<u32>> = names
                .iter()
                .map(|n| {
                    rows.iter()
                        .find(|r| {
                            &r.msr == n
                                && r.status == RegistrationStatus::Registered
                                && r.subscription == Some(SubscriptionState::Active)
                                && r.calls == Some(0)
                        })
                        .and_then(|r| r.max_calls)
                        .filter(|&c| c > 0)
                })
                .collect();
            if let Some(c) = capacities {
                return Ok(c);
            }
        }
        if Instant::now() >= deadline {
            bail!(
                "not every MSR of {names:?} was registered, subscribed and reporting 0 calls within {} s",
                limit.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Places and releases calls as a core would (SPEC §9), at offered load A
/// with Poisson arrivals and exponential holding times, keeping each
/// MSR's `file:` calls source equal to the calls it holds.
pub(crate) async fn calls(args: CallsArgs) -> anyhow::Result<()> {
    use rand::SeedableRng;
    let names: Vec<String> = args.msrs.iter().map(|(n, _)| n.clone()).collect();
    let files: Vec<PathBuf> = args.msrs.iter().map(|(_, p)| p.clone()).collect();
    let index: HashMap<&str, usize> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    if index.len() != names.len() {
        bail!("an MSR is named twice in --msr");
    }
    if args.no_call_id && args.failover_attempts > 1 {
        bail!(
            "--no-call-id with --failover-attempts {}: failover moves a leg (SPEC §14), a select without a call_id names no failed MSRs",
            args.failover_attempts
        );
    }
    if args.holding_ms == 0 {
        bail!("--holding-ms must be positive");
    }
    if args.sockets.is_empty() {
        bail!("no --socket");
    }
    let mut admins = Vec::with_capacity(args.sockets.len());
    for socket in &args.sockets {
        let mut admin = AdminClient::connect_retry(socket, Duration::from_secs(5))
            .await
            .with_context(|| format!("connect to {}", socket.display()))?;
        // Each collector has its own operator store here (no etcd).
        if args.place.declare_site {
            declare_site(&mut admin, &args.place.site).await?;
        }
        admins.push(admin);
    }
    for file in &files {
        try_write_atomic(file, "0\n")?;
    }
    let mut per_collector = Vec::with_capacity(admins.len());
    for admin in &mut admins {
        per_collector
            .push(wait_idle_pool(admin, &names, Duration::from_secs(args.setup_timeout)).await?);
    }
    let capacities = agreed_capacities(&per_collector).map_err(anyhow::Error::msg)?;
    let total: u32 = capacities.iter().sum();
    let erlangs = args
        .erlangs
        .unwrap_or(args.offered / 100.0 * f64::from(total));
    let holding = args.holding_ms as f64 / 1000.0;
    let lambda = erlangs / holding;
    if !(lambda.is_finite() && lambda > 0.0) {
        bail!("the offered load must be positive");
    }
    println!(
        "msr-loadgen calls: {} collector(s), {} MSRs, {total} sessions (max-calls {capacities:?}), offered {erlangs:.1} E \
         ({:.0} % of them), holding mean {holding:.2} s, {:.1} calls/s, warm-up {} s, measured {} s{}",
        admins.len(),
        names.len(),
        100.0 * erlangs / f64::from(total),
        lambda,
        args.warmup,
        args.duration,
        args.calls
            .map(|c| format!(" or {c} calls"))
            .unwrap_or_default()
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let mut draw = CollectorDraw::new(args.seed, admins.len());
    // A failover names the MSRs that refused the call so far; a full MSR
    // answers at its load limit (SPEC §14).
    let select = |call_id: &str, failed: &[String]| {
        Request::Select(SelectQuery {
            call_id: (!args.no_call_id).then(|| call_id.to_owned()),
            failed: failed.to_vec(),
            failure: (!failed.is_empty()).then(|| "load-limit".to_owned()),
            ..SelectQuery::new(args.place.zone.clone(), args.place.site.clone())
        })
    };
    let attempts = args.failover_attempts.max(1) as usize;
    let release = |call_id: String| Request::Release { call_id, leg: None };
    let call_id = |n: u64| format!("e2e-{}-{n}@loadgen", args.seed);

    let n = names.len();
    let mut s = CallsSummary {
        msrs: n,
        sessions: total,
        erlangs,
        holding_mean_secs: holding,
        seed: args.seed,
        collectors: admins.len(),
        failover_attempts: args.failover_attempts,
        ..CallsSummary::default()
    };
    let mut busy = vec![0_u32; n];
    let mut placed = vec![0_u64; n];
    let mut live: BinaryHeap<Live> = BinaryHeap::new();
    let start = Instant::now();
    let measure_from = start + Duration::from_secs(args.warmup);
    let arrivals_end = measure_from + Duration::from_secs(args.duration);
    const BATCHES: usize = 10;
    let (mut batch_blocked, mut batch_offered) = (vec![0_u64; BATCHES], vec![0_u64; BATCHES]);
    let mut notify_before: Option<(Instant, Vec<u64>)> = None;
    // The spread integral over [measure_from, end of arrivals].
    let (mut spread_integral, mut last_change) = (0.0_f64, start);
    let measured_end: Instant;
    let mut advance = |busy: &[u32], now: Instant, integral: &mut f64| {
        let from = last_change.max(measure_from);
        let to = now.min(arrivals_end);
        if to > from {
            *integral +=
                to.duration_since(from).as_secs_f64() * msr_sim::spread_pp(busy, &capacities);
        }
        last_change = now;
    };
    let mut next_arrival = start + Duration::from_secs_f64(exponential_secs(&mut rng, lambda));
    let mut arrivals = 0_u64;
    let mut lags_us: Vec<u64> = Vec::new();
    loop {
        let limit_reached = args.calls.is_some_and(|c| s.offered >= c);
        let arriving = next_arrival < arrivals_end && !limit_reached;
        if !arriving {
            measured_end = Instant::now().min(arrivals_end);
            break;
        }
        let departure = live.peek().map(|Reverse((at, _, _, _))| *at);
        let is_arrival = departure.is_none_or(|d| next_arrival <= d);
        let due = if is_arrival {
            next_arrival
        } else {
            departure.unwrap_or(next_arrival)
        };
        tokio::time::sleep_until(due.into()).await;
        let now = Instant::now();
        lags_us.push(now.duration_since(due).as_micros() as u64);
        if notify_before.is_none() && now >= measure_from {
            notify_before = Some((now, all_notify_counts(&mut admins, &names).await?));
        }
        if !is_arrival {
            let Some(Reverse((_, no, m, h))) = live.pop() else {
                continue;
            };
            advance(&busy, now, &mut spread_integral);
            busy[m] -= 1;
            try_write_atomic(&files[m], &format!("{}\n", busy[m]))?;
            if !args.no_call_id {
                match admins[h].call(&release(call_id(no))).await? {
                    Response::Ok(ResponseData::Released(r)) if r.released == 1 => {}
                    _ => s.release_anomalies += 1,
                }
            }
            continue;
        }
        arrivals += 1;
        next_arrival += Duration::from_secs_f64(exponential_secs(&mut rng, lambda));
        let measured = due >= measure_from;
        let batch = ((due.saturating_duration_since(measure_from).as_secs_f64()
            / args.duration.max(1) as f64
            * BATCHES as f64) as usize)
            .min(BATCHES - 1);
        if measured {
            s.offered += 1;
            batch_offered[batch] += 1;
        }
        let id = call_id(arrivals);
        let h = draw.next();
        let admin = &mut admins[h];
        let mut failed: Vec<String> = Vec::new();
        let mut answer = admin.call(&select(&id, &failed)).await?;
        // A call an MSR refuses because it is full is asked for again with
        // that MSR failed, up to --failover-attempts MSRs in all; the
        // collector moves the leg (SPEC §14).
        while let Response::Ok(ResponseData::Selected(sel)) = &answer {
            let full = index
                .get(sel.msr.as_str())
                .is_some_and(|&m| busy[m] >= capacities[m]);
            if !full {
                break;
            }
            if measured {
                s.sent_to_full += 1;
            }
            failed.push(sel.msr.clone());
            if failed.len() >= attempts {
                break;
            }
            answer = admin.call(&select(&id, &failed)).await?;
        }
        match answer {
            Response::Ok(ResponseData::Selected(sel)) => {
                let Some(&m) = index.get(sel.msr.as_str()) else {
                    s.unknown_msr += 1;
                    if !args.no_call_id {
                        admin.call(&release(id)).await?;
                    }
                    continue;
                };
                if busy[m] >= capacities[m] {
                    // The last MSR it may try refuses the INVITE too; the
                    // core releases the leg.
                    if measured {
                        s.lost_at_full += 1;
                        batch_blocked[batch] += 1;
                    }
                    if !args.no_call_id {
                        admin.call(&release(id)).await?;
                    }
                    continue;
                }
                advance(&busy, now, &mut spread_integral);
                busy[m] += 1;
                placed[m] += 1;
                try_write_atomic(&files[m], &format!("{}\n", busy[m]))?;
                if measured {
                    s.accepted += 1;
                }
                let hold = Duration::from_secs_f64(exponential_secs(&mut rng, 1.0 / holding));
                live.push(Reverse((now + hold, arrivals, m, h)));
            }
            Response::Ok(other) => bail!("select: unexpected answer {other:?}"),
            Response::Err(e) => {
                if busy.iter().zip(&capacities).all(|(b, c)| b >= c) {
                    s.refused_when_full += 1;
                } else {
                    s.refused_with_room += 1;
                }
                if measured {
                    *s.refused.entry(e.code.to_string()).or_default() += 1;
                    batch_blocked[batch] += 1;
                }
            }
        }
    }
    advance(&busy, measured_end, &mut spread_integral);
    let notify_after = all_notify_counts(&mut admins, &names).await?;
    // End every call still up at once: the run is bounded.
    while let Some(Reverse((_, no, m, h))) = live.pop() {
        busy[m] -= 1;
        try_write_atomic(&files[m], &format!("{}\n", busy[m]))?;
        if args.no_call_id {
            continue;
        }
        match admins[h].call(&release(call_id(no))).await? {
            Response::Ok(ResponseData::Released(r)) if r.released == 1 => {}
            _ => s.release_anomalies += 1,
        }
    }
    for admin in &mut admins {
        s.live_legs_after += match admin.call(&Request::MsrList {}).await? {
            Response::Ok(ResponseData::Msrs { msrs }) => msrs
                .iter()
                .filter(|m| index.contains_key(m.name.as_str()))
                .map(|m| u64::from(m.live_legs))
                .sum::<u64>(),
            other => bail!("msr list: unexpected answer {other:?}"),
        };
    }
    let measured_secs = measured_end
        .saturating_duration_since(measure_from)
        .as_secs_f64();
    s.measured_secs = measured_secs;
    (s.blocking, s.blocking_half_width) = msr_sim::batch_means(&batch_blocked, &batch_offered);
    s.pooled_erlang_b = msr_sim::erlang_b(erlangs, total);
    s.times_pooled = s.blocking / s.pooled_erlang_b;
    if measured_secs > 0.0 {
        s.spread_pp = spread_integral / measured_secs;
        if let Some((at, before)) = &notify_before {
            let secs = measured_end.saturating_duration_since(*at).as_secs_f64();
            (s.notify_per_sec, s.max_notify_per_sec_per_subscription) =
                notify_rates(before, &notify_after, secs);
        }
    }
    s.placed = names.iter().cloned().zip(placed).collect();
    lags_us.sort_unstable();
    let ms = |us: u64| us as f64 / 1000.0;
    s.lag_p50_ms = ms(percentile(&lags_us, 50.0));
    s.lag_p99_ms = ms(percentile(&lags_us, 99.0));
    s.max_lag_ms = ms(lags_us.last().copied().unwrap_or(0));
    print_calls_summary(&s);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&s)?)
            .with_context(|| format!("write {}", path.display()))?;
    }
    Ok(())
}

pub(crate) fn print_calls_summary(s: &CallsSummary) {
    let refused: u64 = s.refused.values().sum();
    println!();
    println!("═══ msr-loadgen calls summary ═══");
    println!(
        "measured        {:.0} s, {} calls offered, {} accepted, over {} collector(s)",
        s.measured_secs, s.offered, s.accepted, s.collectors
    );
    println!(
        "blocking        {:.2e} ± {:.1e} (99 % CI, 10 batch means): refused by selection {refused} {:?}, \
         lost at a full MSR {}",
        s.blocking, s.blocking_half_width, s.refused, s.lost_at_full
    );
    println!(
        "sent to full    {} selections named an MSR that was full (failover: {} MSRs a call at most)",
        s.sent_to_full, s.failover_attempts
    );
    println!(
        "pooled limit    Erlang-B({:.1}, {}) = {:.2e}, × pooled {:.2}",
        s.erlangs, s.sessions, s.pooled_erlang_b, s.times_pooled
    );
    println!(
        "refusals        {} while every MSR was full, {} while one had room (warm-up included)",
        s.refused_when_full, s.refused_with_room
    );
    println!(
        "spread          {:.1} pp (time average of max − min occupancy, msr-sim's definition)",
        s.spread_pp
    );
    println!(
        "NOTIFY/s        {:.2} in all, {:.2} on the busiest subscription",
        s.notify_per_sec, s.max_notify_per_sec_per_subscription
    );
    println!("placed          {:?}", s.placed);
    println!(
        "after release   {} live legs, {} release anomalies, {} selections of an unknown MSR",
        s.live_legs_after, s.release_anomalies, s.unknown_msr
    );
    println!(
        "driver lag      median {:.1} ms, p99 {:.1} ms, max {:.1} ms (event handled after its time)",
        s.lag_p50_ms, s.lag_p99_ms, s.max_lag_ms
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_msr_is_name_equals_path() {
        assert_eq!(
            parse_msr_file("msr_1=/run/msr_1.calls"),
            Ok(("msr_1".to_owned(), PathBuf::from("/run/msr_1.calls")))
        );
        for bad in ["msr_1", "=/run/x", "msr_1=", ""] {
            assert!(parse_msr_file(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn one_collector_draws_nothing_and_three_share_the_calls() {
        let mut one = CollectorDraw::new(1, 1);
        assert!((0..1000).all(|_| one.next() == 0));
        let mut three = CollectorDraw::new(1, 3);
        let mut counts = [0_u32; 3];
        for _ in 0..30_000 {
            counts[three.next()] += 1;
        }
        // Each about 10,000; 5 standard deviations (about 82 each) apart at most.
        assert!(
            counts.iter().all(|&c| (9_600..=10_400).contains(&c)),
            "{counts:?}"
        );
        // The same seed draws the same collectors.
        let (mut a, mut b) = (CollectorDraw::new(7, 3), CollectorDraw::new(7, 3));
        assert!((0..100).all(|_| a.next() == b.next()));
    }

    #[test]
    fn the_collectors_must_agree_on_the_capacities() {
        assert_eq!(agreed_capacities(&[vec![20, 30]]), Ok(vec![20, 30]));
        assert_eq!(
            agreed_capacities(&[vec![20, 30], vec![20, 30], vec![20, 30]]),
            Ok(vec![20, 30])
        );
        assert_eq!(
            agreed_capacities(&[vec![20, 30], vec![20, 30], vec![20, 31]]),
            Err("collector 3 reports max-calls [20, 31], collector 1 [20, 30]".to_owned())
        );
        assert!(agreed_capacities(&[]).is_err());
    }

    #[test]
    fn notify_rates_sum_every_subscription_and_find_the_busiest() {
        // Two collectors × two MSRs, over 10 s.
        let before = [10, 20, 5, 0];
        let after = [20, 25, 14, 3];
        assert_eq!(notify_rates(&before, &after, 10.0), (2.7, 1.0));
        // A count that went down (a new subscription) counts as none.
        assert_eq!(notify_rates(&[9], &[4], 1.0), (0.0, 0.0));
        assert_eq!(notify_rates(&before, &after, 0.0), (0.0, 0.0));
    }
}
