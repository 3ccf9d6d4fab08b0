//! The validations of SPEC §10: the event loop and the estimators run
//! with policies whose blocking has a closed form, so that a wrong
//! simulator shows up as a closed form outside its confidence interval
//! before any product policy is measured with it.

use crate::stats::{erlang_b, takacs_round_robin};
use crate::{run, Outcome, Policy, Scenario, SimError};

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
