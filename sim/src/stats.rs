//! The closed forms and the statistics the simulator is measured with
//! (SPEC §10): Erlang-B for Poisson arrivals at one server group, Takács'
//! GI/M/C/C for round robin's Erlang interarrivals, batch means with a
//! Student t interval, and the spread of occupancy between MSRs.

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

/// Student t quantile 0.995 (two-sided 99 %) for `df` degrees of freedom.
pub(crate) fn t_995(df: u32) -> f64 {
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

/// The momentary spread of occupancy between MSRs: max − min of `busy[m]
/// / capacities[m]`, in percentage points (0 for fewer than two MSRs).
/// [`Outcome::spread_pp`](crate::Outcome::spread_pp) is its time average; `msr-loadgen calls`
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
