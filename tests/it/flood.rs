//! A stranger's flood costs the collector what admission allows and no
//! more (SPEC §3–§5): `msr-loadgen flood` sends unauthenticated REGISTERs,
//! OPTIONS, INVITEs (some to the redirect server) and garbage, a new
//! branch and Call-ID each, from 200 loopback addresses (127.0.1.x), while
//! three real agents report. No MSR leaves `healthy`, a load change
//! reaches the table (within 2 s on a quiet host; the test allows for its
//! own polling and load), the collector's memory stays bounded, and
//! the drops are counted and logged. CI runs a short, smaller flood; the
//! recorded runs (BENCHMARKS.md) are 50,000 datagrams/s for 60 s, from 200
//! sources and from one, set by `MSR_FLOOD_RATE`, `MSR_FLOOD_SECONDS` and
//! `MSR_FLOOD_SOURCES` (defaults 20,000, 10 and 200).

use std::process::Command;
use std::time::{Duration, Instant};

use msr_shared::admin::{HealthState, Request, SelectQuery};
use system_tests::system::{live_row, AccountSpec, Agent, AgentSpec, Collector};
use system_tests::{bin_path, AdminClient};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// A recorded run's setting from the environment, else CI's.
fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A selection for a leg in the default zone and site.
fn select() -> Request {
    Request::Select(SelectQuery::new("default", "local"))
}

/// The 99th percentile of `samples`.
fn p99(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() * 99 / 100]
}

/// `VmHWM` (peak resident memory) of `pid`, KiB.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_strangers_leaves_the_msrs_healthy_and_memory_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (collector, redirect) = Collector::start_with_redirect(dir.path(), "core1").await;
    let agents: Vec<Agent> = (1..=3)
        .map(|i| {
            let msr = format!("msr_{i}");
            let spec = AgentSpec {
                accounts: vec![AccountSpec::new(&msr, &collector)],
                register_expires: 300,
                ..AgentSpec::default()
            };
            Agent::start(dir.path(), &msr, &spec, 10 * i)
        })
        .collect();
    collector
        .wait_rows(secs(15), |rows| {
            (1..=3)
                .all(|i| {
                    live_row(rows, &format!("msr_{i}"), Some(10 * i as u8))
                        .is_some_and(|r| r.health == HealthState::Healthy)
                })
                .then_some(())
        })
        .await
        .expect("three MSRs live and healthy");
    let pid = collector.child.as_ref().expect("running").pid();
    let mut client = AdminClient::connect(&collector.socket)
        .await
        .expect("control socket");
    // Selection's round trip at rest: enough samples that the 99th
    // percentile is not simply the slowest one.
    let mut idle = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let answer = client.call(&select()).await;
        assert!(answer.is_ok(), "select at rest: {answer:?}");
        idle.push(t.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let idle_p99 = p99(&mut idle);

    // The flood, beside this test's checks.
    let rate = setting("MSR_FLOOD_RATE", 20_000);
    let seconds = setting("MSR_FLOOD_SECONDS", 10);
    let sources = setting("MSR_FLOOD_SOURCES", 200);
    let mut flood = system_tests::ChildGuard::spawn(Command::new(bin_path("msr-loadgen")).args([
        "flood",
        "--collector",
        &format!("127.0.0.1:{}", collector.port),
        "--redirect",
        &format!("127.0.0.1:{redirect}"),
        "--rate",
        &rate.to_string(),
        "--duration",
        &seconds.to_string(),
        "--sources",
        &sources.to_string(),
    ]))
    .expect("start msr-loadgen flood");

    let started = Instant::now();
    let mut changed = None;
    let mut seen = None;
    let mut not_healthy = Vec::new();
    let mut selections = Vec::new();
    while started.elapsed() < secs(seconds) {
        let rows = collector.rows().await.expect("rows during the flood");
        for r in rows.iter().filter(|r| r.health != HealthState::Healthy) {
            not_healthy.push((started.elapsed(), r.msr.clone(), r.health));
        }
        // The select's round trip alone, as at rest.
        let t = Instant::now();
        let answer = client.call(&select()).await;
        assert!(answer.is_ok(), "select during the flood: {answer:?}");
        selections.push(t.elapsed());
        if changed.is_none() && started.elapsed() >= secs(3) {
            agents[0].set_calls(40);
            changed = Some(Instant::now());
        }
        if let (Some(at), None) = (changed, seen) {
            if live_row(&rows, "msr_1", Some(40)).is_some() {
                seen = Some(at.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = flood.child.wait().expect("flood exits");
    assert!(status.success(), "{status}");
    assert!(
        not_healthy.is_empty(),
        "not healthy during the flood: {not_healthy:?}"
    );
    let seen = match seen {
        Some(s) => s,
        None => {
            let at = changed.expect("changed");
            collector
                .wait_rows(secs(2).saturating_sub(at.elapsed()), |rows| {
                    live_row(rows, "msr_1", Some(40)).map(|_| ())
                })
                .await
                .expect("the load change reached the table");
            at.elapsed()
        }
    };
    // SPEC §4's bound is 2 s (a sampling interval, the one-per-second
    // rule, the flight). The test's own observation adds its polling and
    // the host's load (this binary runs other system tests beside it), so
    // it asserts only that the flood does not starve the report; the 2 s
    // figure is the recorded run's (BENCHMARKS.md).
    assert!(seen <= secs(5), "load change seen after {seen:?}");
    let count = selections.len();
    let flood_p99 = p99(&mut selections);
    let peak = peak_rss_kib(pid).expect("the collector's VmHWM");
    eprintln!(
        "flood {rate}/s × {seconds} s from {sources} source(s): load change seen after {seen:?}; \
         {count} selections, p99 round trip {flood_p99:?} (at rest {idle_p99:?}); collector peak RSS {} MiB",
        peak / 1024
    );
    assert!(peak < 250 * 1024, "peak RSS {} MiB", peak / 1024);
    let log = collector.log_text();
    assert!(
        log.contains("dropped unread"),
        "the admission drops are logged:\n{log}"
    );
}
