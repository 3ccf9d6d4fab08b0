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
