use super::*;

#[test]
fn erlang_b_and_takacs_match_known_values() {
    // Erlang-B(10, 10) = 0.2146; Takács with k = 1 (Poisson) is Erlang-B.
    assert!((erlang_b(10.0, 10) - 0.214_582).abs() < 1e-5);
    let b = takacs_round_robin(8.0, 1, 1.0, 10);
    assert!((b - erlang_b(8.0, 10)).abs() < 1e-9, "{b}");
    // Smoother arrivals (k = 3) block less than Poisson at the same rate.
    assert!(takacs_round_robin(24.0, 3, 3.0, 10) < erlang_b(8.0, 10));
}

#[test]
fn spread_is_max_minus_min_occupancy_in_points() {
    assert_eq!(spread_pp(&[5, 10, 20], &[20, 20, 20]), 75.0);
    // Relative to each MSR's own capacity: 10 of 20 and 50 of 100 are level.
    assert_eq!(spread_pp(&[10, 50], &[20, 100]), 0.0);
    assert_eq!(spread_pp(&[7], &[10]), 0.0);
    assert_eq!(spread_pp(&[], &[]), 0.0);
}

#[test]
fn the_three_validations_hold_within_their_confidence_intervals() -> Result<(), SimError> {
    for check in validate(60_000, 11)? {
        assert!(
            check.passed(),
            "{}: simulated {} ± {}, exact {}",
            check.name,
            check.outcome.blocking,
            check.outcome.half_width,
            check.exact
        );
    }
    Ok(())
}

#[test]
fn runs_are_reproducible_and_notify_at_most_once_a_second() -> Result<(), SimError> {
    let mut s = Scenario::a(0.9);
    s.calls = 20_000;
    s.core_hosts = 3;
    let a = run(&s)?;
    assert_eq!(a, run(&s)?);
    assert!(a.max_notify_per_sec_per_subscription <= 1.0, "{a:?}");
    Ok(())
}

#[test]
fn pooled_falls_back_to_ecss_when_the_core_never_releases() -> Result<(), SimError> {
    let mut s = Scenario::a(0.9);
    s.calls = 20_000;
    s.releases = false;
    let pooled = run(&s)?;
    s.policy = Policy::Ecss;
    let ecss = run(&s)?;
    // The same draws from the same seed: the collector's fallback is ecss.
    assert_eq!(pooled.blocking, ecss.blocking);
    Ok(())
}

#[test]
fn comparison_policies_run_reproducibly_within_the_notify_bound() -> Result<(), SimError> {
    for policy in [
        Policy::WebSip,
        Policy::CallLoad,
        Policy::LeastReported,
        Policy::TwoChoices,
    ] {
        let mut s = Scenario::b(0.85);
        s.calls = 10_000;
        s.core_hosts = 3;
        s.policy = policy;
        let a = run(&s)?;
        assert_eq!(a, run(&s)?, "{}", policy.name());
        assert!(a.max_notify_per_sec_per_subscription <= 1.0, "{a:?}");
        assert!((0.0..=1.0).contains(&a.blocking), "{a:?}");
    }
    Ok(())
}

#[test]
fn web_sip_without_ends_refuses_what_pooled_places() -> Result<(), SimError> {
    // Counting placements and no ends only grows the estimate between
    // reports: at 90 %, with reports only on load-delta moves (the
    // high-water rule off), the draw runs out of weight and refuses.
    let mut s = Scenario::a(0.9);
    s.calls = 20_000;
    s.high_water = 101;
    s.policy = Policy::WebSip;
    let web_sip = run(&s)?;
    s.policy = Policy::Pooled;
    let pooled = run(&s)?;
    assert!(
        web_sip.blocking > 10.0 * pooled.blocking.max(web_sip.pooled_erlang_b),
        "{web_sip:?} {pooled:?}"
    );
    assert!(web_sip.refused_share > 0.9, "{web_sip:?}");
    Ok(())
}

#[test]
fn rows_survive_the_csv_and_draw() -> Result<(), SimError> {
    let mut rows = Vec::new();
    for policy in [Policy::Pooled, Policy::Ecss, Policy::TwoChoices] {
        for g in [1, 3] {
            let mut s = Scenario::a(0.9);
            s.calls = 2_000;
            s.core_hosts = g;
            s.policy = policy;
            let o = run(&s)?;
            rows.push(report::Row::new(
                "A 90 %".into(),
                report::variant(&s),
                &s,
                o,
            ));
        }
    }
    let back = report::parse_csv(&report::csv(&rows))?;
    assert_eq!(back.len(), rows.len());
    for (a, b) in rows.iter().zip(&back) {
        assert_eq!(
            (a.policy, a.core_hosts, &a.variant),
            (b.policy, b.core_hosts, &b.variant)
        );
        assert!((a.outcome.spread_pp - b.outcome.spread_pp).abs() < 1e-9);
    }
    assert!(report::markdown(&rows).contains("| two-choices | 3 |"));
    let dir = std::env::temp_dir().join(format!("msr-sim-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| SimError::Plot(e.to_string()))?;
    let written = plot::draw(&rows, Some(&rows), &dir)?;
    assert_eq!(written.len(), 3);
    for path in &written {
        let bytes = std::fs::read(path).map_err(|e| SimError::Plot(e.to_string()))?;
        assert!(bytes.starts_with(b"\x89PNG"), "{}", path.display());
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[test]
fn the_literal_capacity_of_spec_10_loses_calls_where_pooled_loses_none() -> Result<(), SimError> {
    // Scenario B's coefficients grow with the sizes: dividing by max-calls
    // × coefficient ranks a full 400-session MSR before a quarter-full
    // 100-session one (BALANCING.md, "The capacity in the estimate").
    let mut s = Scenario::b(0.85);
    s.calls = 30_000;
    let pooled = run(&s)?;
    s.policy = Policy::PooledLiteral;
    let literal = run(&s)?;
    assert_eq!(pooled.blocking, 0.0, "{pooled:?}");
    assert!(literal.blocking > 0.05, "{literal:?}");
    assert!(literal.spread_pp > 5.0 * pooled.spread_pp, "{literal:?}");
    Ok(())
}

/// Issue 24, defect b: the window end is queued at the gate's exact end,
/// so a held change is always due when its window ends.
#[test]
fn every_window_end_finds_its_held_change_due() -> Result<(), SimError> {
    for core_hosts in [1, 3] {
        let mut s = Scenario::a(0.9);
        s.calls = 50_000;
        s.core_hosts = core_hosts;
        let outcome = run(&s)?;
        assert_eq!(
            outcome.early_window_ends, 0,
            "G = {core_hosts}: {outcome:?}"
        );
    }
    Ok(())
}

/// SPEC §10: in overload the pooled policy refuses rather than send a leg
/// to an MSR it believes full; with one core host its estimate is exact.
#[test]
fn pooled_in_overload_refuses_instead_of_sending_to_full_msrs() -> Result<(), SimError> {
    let mut s = Scenario::a(1.2);
    s.calls = 50_000;
    let outcome = run(&s)?;
    assert!(outcome.full_share < 0.05, "{outcome:?}");
    assert!(outcome.refused_share > 0.9, "{outcome:?}");
    Ok(())
}
