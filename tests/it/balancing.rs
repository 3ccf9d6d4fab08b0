//! The balancing check end to end (SPEC §10), short enough for CI: a real
//! collector, four real agents whose `file:` calls sources `msr-loadgen
//! calls` keeps equal to the calls it placed on them, and 500 calls placed
//! and released through the control socket at a moderate load (50 % of 4 ×
//! 20 sessions, holding 2 s). What a user checks: every call landed on a
//! registered MSR, each MSR took its share, nothing was refused or sent to
//! a full MSR (`msr-sim` loses none of 300,000 calls in this setup), and no
//! leg is live once every call is released. The long run at 90 % and its
//! figures are a benchmark (`scripts/bench-balancing-e2e.sh`, BALANCING.md).

use std::time::Duration;

use msr_shared::admin::{Request, ResponseData};
use system_tests::bin_path;
use system_tests::system::{live_row, AccountSpec, Agent, AgentSpec, Collector, CollectorOpts};

const MSRS: [&str; 4] = ["msr_1", "msr_2", "msr_3", "msr_4"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_placed_and_released_at_moderate_load_all_land_and_leave_no_leg() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = CollectorOpts {
        subscription_expires: 120,
        ..CollectorOpts::default()
    };
    let collector = Collector::start(dir.path(), "core1", &opts).await;
    let agents: Vec<Agent> = MSRS
        .iter()
        .enumerate()
        .map(|(i, msr)| {
            let spec = AgentSpec {
                accounts: vec![AccountSpec::new(msr, &collector)],
                // One call is 5 points of 20: every change of `calls` is
                // reported (SPEC §4), so the idle pool at the end is seen.
                // With 10 a last step from 1 call to 0 moves 5 points and
                // is, rightly, not reported before the next refresh.
                load_delta: 5,
                max_calls: 20,
                register_expires: 60,
                sample_interval_ms: 100,
                engine_port: 5090 + 2 * u16::try_from(i).unwrap_or(0),
                ..AgentSpec::default()
            };
            Agent::start(dir.path(), msr, &spec, 0)
        })
        .collect();
    collector
        .wait_rows(Duration::from_secs(20), |rows| {
            MSRS.iter()
                .all(|msr| live_row(rows, msr, Some(0)).is_some())
                .then_some(())
        })
        .await
        .expect("four MSRs live at 0 calls");

    let summary = dir.path().join("summary.json");
    let mut driver = tokio::process::Command::new(bin_path("msr-loadgen"));
    driver
        .arg("calls")
        .arg("--socket")
        .arg(&collector.socket)
        .args(["--offered", "50", "--holding-ms", "2000", "--warmup", "4"])
        .args(["--duration", "120", "--calls", "500", "--seed", "7"])
        .arg("--json")
        .arg(&summary)
        .kill_on_drop(true);
    for agent in &agents {
        driver
            .arg("--msr")
            .arg(format!("{}={}", agent.name, agent.calls.display()));
    }
    let out = tokio::time::timeout(Duration::from_secs(180), driver.output())
        .await
        .expect("the driver ends (500 calls at 20 a second)")
        .expect("run msr-loadgen");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "msr-loadgen calls failed:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&summary).expect("summary written");
    let s: serde_json::Value = serde_json::from_str(&text).expect("summary is JSON");
    let count = |key: &str| s[key].as_u64().unwrap_or(u64::MAX);

    assert_eq!(count("offered"), 500, "{stdout}");
    assert_eq!(count("unknown_msr"), 0, "every call on a registered MSR");
    assert_eq!(
        s["refused"].as_object().map(serde_json::Map::len),
        Some(0),
        "nothing refused at 50 %: {stdout}"
    );
    assert_eq!(count("refused_with_room"), 0, "{stdout}");
    assert_eq!(count("sent_to_full"), 0, "no call on a full MSR: {stdout}");
    assert_eq!(count("accepted"), 500, "{stdout}");
    let placed = s["placed"].as_object().expect("placed per MSR");
    for msr in MSRS {
        // 40 Erlangs over four MSRs of 20: each holds about 10 at a time.
        let n = placed.get(msr).and_then(serde_json::Value::as_u64);
        assert!(
            n.is_some_and(|n| n >= 50),
            "{msr} took its share: {placed:?}"
        );
    }
    assert_eq!(count("release_anomalies"), 0, "every release ended one leg");
    assert_eq!(count("live_legs_after"), 0, "{stdout}");
    // As the operator reads it.
    match collector.ok(&Request::MsrList {}).await {
        ResponseData::Msrs { msrs } => {
            assert!(msrs.iter().all(|m| m.live_legs == 0), "{msrs:?}");
            assert_eq!(msrs.len(), MSRS.len());
        }
        other => panic!("{other:?}"),
    }
    // And the agents report the idle pool again (a bound for a loaded CI
    // machine: the agents sample, then coalesce, under 20 other tests).
    collector
        .wait_rows(Duration::from_secs(30), |rows| {
            MSRS.iter()
                .all(|msr| live_row(rows, msr, Some(0)).is_some())
                .then_some(())
        })
        .await
        .expect("every MSR back at 0 calls");
}
