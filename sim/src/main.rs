//! `msr-sim`: see the library docs. `msr-sim validate` checks the
//! simulator against closed forms and exits 1 when one is outside its
//! confidence interval; `msr-sim run` simulates one row; `msr-sim table`
//! the required rows of SPEC §10 for every compared policy, and the
//! no-release rows; `msr-sim sensitivity` the holding-time and report-delay
//! rows; `msr-sim hosts` SPEC §10's rows with one, three and ten core
//! hosts under the product's policy; `msr-sim plot` draws the PNGs from
//! their CSV files.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use msr_sim::report::{self, Row};
use msr_sim::{run, validate, Capabilities, Holding, Policy, Scenario};

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
    /// The product's default (SPEC §10).
    Pooled,
    /// The product's §7 draw.
    Ecss,
    /// Comparison: the Web-SIP update (placements since the report, no ends).
    WebSip,
    /// Comparison: a dispatcher's call-load rule (own placements and ends).
    CallLoad,
    /// Comparison: the lowest last-reported load.
    LeastReported,
    /// Comparison: power of two choices on the last reports.
    TwoChoices,
    /// Comparison: pooled with SPEC §10's capacity literally, max-calls × coefficient.
    PooledLiteral,
    /// Validation: the perfectly informed least-occupied MSR.
    Oracle,
    /// Validation: MSRs in turn.
    RoundRobin,
}

impl PolicyArg {
    fn policy(self) -> Policy {
        match self {
            PolicyArg::Pooled => Policy::Pooled,
            PolicyArg::Ecss => Policy::Ecss,
            PolicyArg::WebSip => Policy::WebSip,
            PolicyArg::CallLoad => Policy::CallLoad,
            PolicyArg::LeastReported => Policy::LeastReported,
            PolicyArg::TwoChoices => Policy::TwoChoices,
            PolicyArg::PooledLiteral => Policy::PooledLiteral,
            PolicyArg::Oracle => Policy::Oracle,
            PolicyArg::RoundRobin => Policy::RoundRobin,
        }
    }
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
        /// Instead of --scenario: this many MSRs of --sessions sessions
        /// each, coefficients 1 (e.g. the end-to-end check's 10 × 20).
        #[arg(long)]
        msrs: Option<usize>,
        /// Sessions (`max-calls`) of each of --msrs.
        #[arg(long, default_value_t = 100, requires = "msrs")]
        sessions: u32,
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
        /// The agent's `notify-min-interval-ms`.
        #[arg(long, default_value_t = msr_agent::config::DEFAULT_NOTIFY_MIN_INTERVAL_MS)]
        min_interval_ms: u64,
        /// The agent's `notify-top-interval-ms`: the gap between two
        /// NOTIFYs of a subscription near the top.
        #[arg(long, default_value_t = msr_agent::config::DEFAULT_NOTIFY_TOP_INTERVAL_MS)]
        top_interval_ms: u64,
        /// The agent's `sample-interval-ms` (0: every change is seen at
        /// once).
        #[arg(long, default_value_t = msr_agent::config::DEFAULT_SAMPLE_INTERVAL_MS)]
        sample_interval_ms: u64,
        /// The agent's NOTIFY without `sample-age-ms` (an agent before it).
        #[arg(long)]
        no_sample_age: bool,
        /// The core never releases legs.
        #[arg(long)]
        no_releases: bool,
        /// The core names no call (no `call_id`): no leg is bound, and
        /// under `--policy pooled` every selection is its `ecss` fallback,
        /// which counts its own placements near the top (SPEC §10). With
        /// `--policy ecss` nothing is counted: the seed's draw as
        /// configured. Policies pooled and ecss only, and only with
        /// `--failover-attempts 1` (a selection without a `call_id`
        /// cannot name a failed MSR, SPEC §14).
        #[arg(long)]
        no_call_id: bool,
        /// The MSRs one call may be given in all (SPEC §14, the
        /// collector's `[selection] failover_attempts`, whose default in
        /// the collector is 3; here the default is 1): a
        /// call an MSR refuses (full) is selected again with that MSR
        /// named failed, as the shipped Kamailio configuration does. 1: no
        /// failover, a call sent to a full MSR is lost. Policies pooled
        /// and ecss only.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10))]
        failover_attempts: u32,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Capability classes (SPEC §15), with --video-share: the first N
        /// MSRs (msr_0 …) report `codecs: pcma,pcmu,h264`, the others
        /// `codecs: pcma,pcmu`. Each call's select names its offer, so
        /// the product's selection keeps only the MSRs that take it: a
        /// video call goes only to a video MSR, refused msr_overloaded when
        /// they are full and no_capable_msr when N is 0. The output adds
        /// each class's blocking beside its pooled Erlang-B limit. E.g.
        /// `--video-msrs 3 --video-share 20`. Policies pooled and ecss only.
        #[arg(long, requires = "video_share", value_name = "N")]
        video_msrs: Option<usize>,
        /// Percent of calls that offer `pcma,h264` (video calls); the
        /// others offer `pcma` (audio-only calls). With --video-msrs.
        #[arg(long, requires = "video_msrs", value_name = "PERCENT", value_parser = percent)]
        video_share: Option<f64>,
    },
    /// The required rows (A 80 %, A 90 %, B 85 %; G = 1, 3) for every
    /// compared policy, then A 90 % with no leg ever released (pooled, ecss).
    Table {
        #[arg(long, default_value_t = 200_000)]
        calls: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Rows simulated at once (threads).
        #[arg(long, default_value_t = 1)]
        jobs: usize,
        /// Also write the rows here as CSV (for `msr-sim plot`).
        #[arg(long)]
        csv: Option<PathBuf>,
    },
    /// SPEC §10's rows under the product's policy (`pooled`, the core
    /// failing over up to 3 MSRs a call, SPEC §14): A 90 %, A 80 % and
    /// B 85 % with G = 1, 3 and 10 core hosts, holding 120 s and 30 s,
    /// seeds 1 and 2; one table per scenario, with each row's 99 %
    /// interval over the pooled limit and the NOTIFYs it costs.
    Hosts {
        /// Calls per A 90 % row.
        #[arg(long, default_value_t = 40_000_000)]
        calls: u64,
        /// Calls per A 80 % and B 85 % row (their pooled limits, about
        /// 1e-12 and 3e-10, are below what any run can show).
        #[arg(long, default_value_t = 5_000_000)]
        light_calls: u64,
        /// Rows simulated at once (threads).
        #[arg(long, default_value_t = 1)]
        jobs: usize,
        /// Also write the rows here as CSV (for `msr-sim plot --hosts`).
        #[arg(long)]
        csv: Option<PathBuf>,
    },
    /// A 90 %, G = 1 and 3, pooled and ecss: holding 30 s and 600 s, and a
    /// report delay of 500 ms.
    Sensitivity {
        #[arg(long, default_value_t = 200_000)]
        calls: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long, default_value_t = 1)]
        jobs: usize,
        #[arg(long)]
        csv: Option<PathBuf>,
    },
    /// Draws the PNGs from the CSV files of `table` and `sensitivity`.
    Plot {
        /// The CSV of `msr-sim table`.
        #[arg(long)]
        table: PathBuf,
        /// The CSV of `msr-sim sensitivity` (optional).
        #[arg(long)]
        sensitivity: Option<PathBuf>,
        /// The CSV of `msr-sim hosts` (optional): draws `hosts.png`.
        #[arg(long)]
        hosts: Option<PathBuf>,
        /// Where the PNGs go.
        #[arg(long, default_value = "docs/balancing")]
        out: PathBuf,
    },
}

/// A percentage between 0 and 100.
fn percent(value: &str) -> Result<f64, String> {
    let v: f64 = value
        .parse()
        .map_err(|_| format!("`{value}` is not a number"))?;
    if (0.0..=100.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not between 0 and 100"))
    }
}

fn scenario(which: Which, offered: f64) -> Scenario {
    match which {
        Which::A => Scenario::a(offered / 100.0),
        Which::B => Scenario::b(offered / 100.0),
    }
}

fn label(which: Which, offered: f64) -> String {
    let name = match which {
        Which::A => "A",
        Which::B => "B",
    };
    format!("{name} {offered} %")
}

fn print_and_save(rows: &[Row], csv: Option<&PathBuf>) -> Result<()> {
    println!("{}", report::markdown(rows));
    if let Some(path) = csv {
        std::fs::write(path, report::csv(rows))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

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
            scenario: which,
            msrs,
            sessions,
            offered,
            policy,
            hosts,
            calls,
            holding,
            delay_ms,
            load_delta,
            high_water,
            min_interval_ms,
            top_interval_ms,
            sample_interval_ms,
            no_sample_age,
            no_releases,
            no_call_id,
            failover_attempts,
            seed,
            video_msrs,
            video_share,
        } => {
            let (mut s, name) = match msrs {
                Some(n) => (
                    Scenario::uniform(n, sessions, offered / 100.0),
                    format!("{n} × {sessions} {offered} %"),
                ),
                None => (scenario(which, offered), label(which, offered)),
            };
            s.policy = policy.policy();
            s.core_hosts = hosts;
            s.calls = calls;
            s.holding = Holding::Exponential(Duration::from_secs(holding));
            s.report_delay = Duration::from_millis(delay_ms);
            s.load_delta = load_delta;
            s.high_water = high_water;
            s.min_interval = Duration::from_millis(min_interval_ms);
            s.top_interval = Duration::from_millis(top_interval_ms);
            s.sample_interval = Duration::from_millis(sample_interval_ms);
            s.sample_age = !no_sample_age;
            s.releases = !no_releases;
            s.call_ids = !no_call_id;
            s.failover_attempts = failover_attempts;
            s.seed = seed;
            // clap requires both or neither.
            if let (Some(video_msrs), Some(share)) = (video_msrs, video_share) {
                s.capabilities = Some(Capabilities {
                    video_msrs,
                    video_share: share / 100.0,
                });
            }
            let outcome = run(&s)?;
            let row = Row::new(name, report::variant(&s), &s, outcome);
            let rows = [row];
            println!("{}", report::markdown(&rows));
            let o = &rows[0].outcome;
            if s.failover_attempts > 1 || o.other_health_changes > 0 {
                println!(
                    "\nhealth: {} trips by the core's failures (SPEC §14), {} other changes",
                    o.core_failure_trips, o.other_health_changes
                );
            }
            if s.core_hosts > 1 {
                println!(
                    "overload: entered {} times (a core host's own selections; SPEC §10)",
                    o.overload_entries
                );
            }
            let classes = report::classes_markdown(&rows);
            if !classes.is_empty() {
                println!("\n{classes}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Table {
            calls,
            seed,
            jobs,
            csv,
        } => {
            let mut specs = Vec::new();
            for (which, offered) in [(Which::A, 80.0), (Which::A, 90.0), (Which::B, 85.0)] {
                for g in [1, 3] {
                    for policy in Policy::COMPARED {
                        let mut s = scenario(which, offered);
                        s.core_hosts = g;
                        s.policy = policy;
                        s.calls = calls;
                        s.seed = seed;
                        specs.push((label(which, offered), s));
                    }
                }
            }
            // SPEC §10: never worse than ecss when the core releases no leg.
            for g in [1, 3] {
                for policy in [Policy::Pooled, Policy::Ecss] {
                    let mut s = Scenario::a(0.9);
                    s.core_hosts = g;
                    s.policy = policy;
                    s.calls = calls;
                    s.seed = seed;
                    s.releases = false;
                    specs.push((label(Which::A, 90.0), s));
                }
            }
            let rows = report::run_all(specs, jobs)?;
            print_and_save(&rows, csv.as_ref())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Hosts {
            calls,
            light_calls,
            jobs,
            csv,
        } => {
            let mut specs = Vec::new();
            for (which, offered, calls) in [
                (Which::A, 90.0, calls),
                (Which::A, 80.0, light_calls),
                (Which::B, 85.0, light_calls),
            ] {
                for g in [1, 3, 10] {
                    for holding in [120, 30] {
                        for seed in [1, 2] {
                            let mut s = scenario(which, offered);
                            s.core_hosts = g;
                            s.calls = calls;
                            s.seed = seed;
                            s.failover_attempts = 3;
                            s.holding = Holding::Exponential(Duration::from_secs(holding));
                            specs.push((label(which, offered), s));
                        }
                    }
                }
            }
            let msrs: Vec<usize> = specs.iter().map(|(_, s)| s.capacities.len()).collect();
            let rows = report::run_all(specs, jobs)?;
            println!("{}", report::hosts_markdown(&rows, &msrs));
            if let Some(path) = csv {
                std::fs::write(&path, report::csv(&rows))
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Sensitivity {
            calls,
            seed,
            jobs,
            csv,
        } => {
            let mut specs = Vec::new();
            for (holding, delay_ms) in [(30, 20), (600, 20), (120, 500)] {
                for g in [1, 3] {
                    for policy in [Policy::Pooled, Policy::Ecss] {
                        let mut s = Scenario::a(0.9);
                        s.core_hosts = g;
                        s.policy = policy;
                        s.calls = calls;
                        s.seed = seed;
                        s.holding = Holding::Exponential(Duration::from_secs(holding));
                        s.report_delay = Duration::from_millis(delay_ms);
                        specs.push((label(Which::A, 90.0), s));
                    }
                }
            }
            let rows = report::run_all(specs, jobs)?;
            print_and_save(&rows, csv.as_ref())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Plot {
            table,
            sensitivity,
            hosts,
            out,
        } => {
            let read = |path: &PathBuf| -> Result<Vec<Row>> {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                Ok(report::parse_csv(&text)?)
            };
            let table = read(&table)?;
            let sensitivity = sensitivity.as_ref().map(read).transpose()?;
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            for path in msr_sim::plot::draw(&table, sensitivity.as_deref(), &out)? {
                println!("wrote {}", path.display());
            }
            if let Some(hosts) = hosts.as_ref().map(read).transpose()? {
                let path = msr_sim::plot::draw_hosts(&hosts, &out)?;
                println!("wrote {}", path.display());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
