//! `msr-sim`: see the library docs. `msr-sim validate` checks the
//! simulator against closed forms and exits 1 when one is outside its
//! confidence interval; `msr-sim run` simulates one row; `msr-sim table`
//! the required rows of SPEC §10 as a Markdown table.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};
use msr_sim::{run, validate, Holding, Outcome, Policy, Scenario};

#[derive(Parser)]
#[command(
    name = "msr-sim",
    version,
    about = "Balancing simulator driving the collector's own selection code (SPEC §10)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Which {
    /// 10 MSRs × 100 sessions.
    A,
    /// MSRs of 100, 100, 200, 200, 400, 400 sessions, coefficients 1, 1, 2, 2, 4, 4.
    B,
}

#[derive(Clone, Copy, ValueEnum)]
enum PolicyArg {
    Pooled,
    Ecss,
    Oracle,
    RoundRobin,
}

#[derive(Subcommand)]
enum Command {
    /// The three validations (one MSR, perfectly pooled oracle, round robin).
    Validate {
        /// Calls per validation.
        #[arg(long, default_value_t = 200_000)]
        calls: u64,
        #[arg(long, default_value_t = 11)]
        seed: u64,
    },
    /// One scenario.
    Run {
        #[arg(long, value_enum, default_value_t = Which::A)]
        scenario: Which,
        /// Offered traffic, percent of the summed capacity.
        #[arg(long, default_value_t = 90.0)]
        offered: f64,
        #[arg(long, value_enum, default_value_t = PolicyArg::Pooled)]
        policy: PolicyArg,
        /// G, core hosts.
        #[arg(long, default_value_t = 1)]
        hosts: u32,
        #[arg(long, default_value_t = 200_000)]
        calls: u64,
        /// Mean holding time, seconds.
        #[arg(long, default_value_t = 120)]
        holding: u64,
        /// NOTIFY delay, ms.
        #[arg(long, default_value_t = 20)]
        delay_ms: u64,
        #[arg(long, default_value_t = 10)]
        load_delta: u8,
        /// 101: the high-water rule off.
        #[arg(long, default_value_t = 80)]
        high_water: u8,
        /// The core never releases legs.
        #[arg(long)]
        no_releases: bool,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// The required rows (A 80 %, A 90 %, B 85 %; G = 1, 3) for pooled and ecss.
    Table {
        #[arg(long, default_value_t = 200_000)]
        calls: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

fn row(label: &str, policy: Policy, g: u32, o: &Outcome) -> String {
    format!(
        "| {label} | {} | {g} | {} | {:.2e} ± {:.1e} | {:.2e} | {:.1} | {:.0} % | {:.1} | {:.2} | {:.2} |",
        policy.name(),
        o.calls,
        o.blocking,
        o.half_width,
        o.pooled_erlang_b,
        o.times_pooled(),
        o.refused_share * 100.0,
        o.spread_pp,
        o.notify_per_sec,
        o.max_notify_per_sec_per_subscription,
    )
}

const HEADER: &str = "| scenario | policy | G | calls | blocking ± 99 % CI | pooled Erlang-B | × pooled | refused by selection | spread (pp) | NOTIFY/s | max NOTIFY/s per subscription |\n|---|---|---|---|---|---|---|---|---|---|---|";

fn main() -> Result<ExitCode> {
    match Cli::parse().command {
        Command::Validate { calls, seed } => {
            let mut ok = true;
            for check in validate(calls, seed)? {
                let passed = check.passed();
                ok &= passed;
                println!(
                    "{}: simulated {:.5} ± {:.5} (99 % CI, {} calls), exact {:.5}: {}",
                    check.name,
                    check.outcome.blocking,
                    check.outcome.half_width,
                    check.outcome.calls,
                    check.exact,
                    if passed { "ok" } else { "OUTSIDE" }
                );
            }
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Run {
            scenario,
            offered,
            policy,
            hosts,
            calls,
            holding,
            delay_ms,
            load_delta,
            high_water,
            no_releases,
            seed,
        } => {
            let mut s = match scenario {
                Which::A => Scenario::a(offered / 100.0),
                Which::B => Scenario::b(offered / 100.0),
            };
            s.policy = match policy {
                PolicyArg::Pooled => Policy::Pooled,
                PolicyArg::Ecss => Policy::Ecss,
                PolicyArg::Oracle => Policy::Oracle,
                PolicyArg::RoundRobin => Policy::RoundRobin,
            };
            s.core_hosts = hosts;
            s.calls = calls;
            s.holding = Holding::Exponential(Duration::from_secs(holding));
            s.report_delay = Duration::from_millis(delay_ms);
            s.load_delta = load_delta;
            s.high_water = high_water;
            s.releases = !no_releases;
            s.seed = seed;
            let o = run(&s)?;
            let label = format!(
                "{} {offered} %",
                match scenario {
                    Which::A => "A",
                    Which::B => "B",
                }
            );
            println!("{HEADER}\n{}", row(&label, s.policy, hosts, &o));
            Ok(ExitCode::SUCCESS)
        }
        Command::Table { calls, seed } => {
            println!("{HEADER}");
            for (label, base) in [
                ("A 80 %", Scenario::a(0.8)),
                ("A 90 %", Scenario::a(0.9)),
                ("B 85 %", Scenario::b(0.85)),
            ] {
                for g in [1, 3] {
                    for policy in [Policy::Pooled, Policy::Ecss] {
                        let mut s = base.clone();
                        s.core_hosts = g;
                        s.policy = policy;
                        s.calls = calls;
                        s.seed = seed;
                        println!("{}", row(label, policy, g, &run(&s)?));
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
