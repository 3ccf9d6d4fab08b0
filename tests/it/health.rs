//! MSR health (SPEC §5) with the real binaries and the collector's default
//! health settings (keepalive every 5 s, 2 s timeout, 2 misses, 2 s grace):
//! a killed or stopped agent stops getting legs, comes back after its
//! first fresh NOTIFY, and selection keeps its pace while one MSR is
//! black-holed. Each test waits for observable conditions with bounded
//! polling; the bounds are generous (the targets are in RELIABILITY.md),
//! and the figures are printed for the record.

use std::process::Command;
use std::time::{Duration, Instant};

use msr_shared::admin::{HealthState, Request, ResourceInfo, Response, ResponseData, SelectQuery};
use msr_shared::subscription::SubscriptionState;
use system_tests::system::{live_row, AccountSpec, Agent, AgentSpec, Collector, CollectorOpts};
use system_tests::AdminClient;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// The SPEC defaults: subscription 60 s; a registration that outlives the
/// test (300 s, the agent's default), so only health takes an MSR out.
fn opts() -> CollectorOpts {
    CollectorOpts {
        subscription_expires: 60,
        ..CollectorOpts::default()
    }
}

fn spec(msr: &str, c: &Collector) -> AgentSpec {
    AgentSpec {
        accounts: vec![AccountSpec::new(msr, c)],
        register_expires: 300,
        ..AgentSpec::default()
    }
}

fn signal(agent: &Agent, name: &str) {
    let pid = agent.child.as_ref().map(|c| c.pid()).expect("running");
    let status = Command::new("kill")
        .args([name, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {name} {pid}");
}

fn health_of(rows: &[ResourceInfo], msr: &str) -> Option<HealthState> {
    rows.iter().find(|r| r.msr == msr).map(|r| r.health)
}

async fn select_msr(client: &mut AdminClient) -> Result<String, String> {
    let request = Request::Select(SelectQuery::new("default", "local"));
    match client.call(&request).await {
        Ok(Response::Ok(ResponseData::Selected(s))) => Ok(s.msr),
        other => Err(format!("{other:?}")),
    }
}

/// Selects until `n` selections in a row did not pick `msr` (the draw
/// gives a live MSR its share within a few dozen), for at most `limit`;
/// returns the time of the last selection that did pick it.
async fn until_not_selected(
    client: &mut AdminClient,
    msr: &str,
    n: usize,
    limit: Duration,
) -> Option<Instant> {
    let deadline = Instant::now() + limit;
    let mut last_pick = Instant::now();
    let mut streak = 0;
    while Instant::now() < deadline {
        match select_msr(client).await {
            Ok(m) if m == msr => {
                last_pick = Instant::now();
                streak = 0;
            }
            Ok(_) => streak += 1,
            Err(e) => panic!("select refused: {e}"),
        }
        if streak >= n {
            return Some(last_pick);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

/// Selects until `msr` is picked, for at most `limit`.
async fn until_selected(client: &mut AdminClient, msr: &str, limit: Duration) -> Option<Instant> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if select_msr(client).await.is_ok_and(|m| m == msr) {
            return Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    None
}

/// `pct` percentile of sorted latencies.
fn percentile(sorted: &[Duration], pct: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((pct / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// 200 selections/s for `length`; returns (p50, p99, MSRs picked).
async fn paced_selections(
    client: &mut AdminClient,
    length: Duration,
) -> (Duration, Duration, Vec<String>) {
    let mut ticker = tokio::time::interval(Duration::from_millis(5));
    let end = Instant::now() + length;
    let mut latencies = Vec::new();
    let mut picked = Vec::new();
    while Instant::now() < end {
        ticker.tick().await;
        let start = Instant::now();
        let msr = select_msr(client).await.expect("selection answered");
        latencies.push(start.elapsed());
        picked.push(msr);
    }
    latencies.sort();
    (
        percentile(&latencies, 50.0),
        percentile(&latencies, 99.0),
        picked,
    )
}

/// kill -9, SIGSTOP and SIGCONT of agents among four, with 200
/// selections/s measured while one is black-holed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_and_stopped_msrs_stop_getting_legs_and_come_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(dir.path(), "core1", &opts()).await;
    let names = ["msr_1", "msr_2", "msr_3", "msr_4"];
    let mut agents: Vec<Agent> = names
        .iter()
        .map(|m| Agent::start(dir.path(), m, &spec(m, &c), 10))
        .collect();
    c.wait_rows(secs(15), |rows| {
        names
            .iter()
            .all(|m| live_row(rows, m, Some(10)).is_some_and(|r| r.health == HealthState::Healthy))
            .then_some(())
    })
    .await
    .expect("four MSRs live and healthy");
    let mut client = AdminClient::connect(&c.socket).await.expect("control");
    let (base_p50, base_p99, _) = paced_selections(&mut client, secs(5)).await;
    eprintln!("200 selections/s, all healthy: p50 {base_p50:?}, p99 {base_p99:?}");

    // kill -9 of msr_1.
    agents[0].kill9();
    let killed = Instant::now();
    let last = until_not_selected(&mut client, "msr_1", 300, secs(30))
        .await
        .expect("killed msr_1 still selected 30 s later");
    let rows = c.rows().await.unwrap_or_default();
    assert_eq!(health_of(&rows, "msr_1"), Some(HealthState::Unreachable));
    eprintln!(
        "kill -9: last selected {:?} after the kill",
        last.saturating_duration_since(killed)
    );
    assert!(last.saturating_duration_since(killed) < secs(20));

    // SIGSTOP of msr_2: black-holed (registered, silent).
    signal(&agents[1], "-STOP");
    let stopped = Instant::now();
    let last = until_not_selected(&mut client, "msr_2", 300, secs(30))
        .await
        .expect("stopped msr_2 still selected 30 s later");
    eprintln!(
        "SIGSTOP: last selected {:?} after the stop",
        last.saturating_duration_since(stopped)
    );
    assert!(last.saturating_duration_since(stopped) < secs(20));
    let rows = c.rows().await.unwrap_or_default();
    assert_eq!(health_of(&rows, "msr_2"), Some(HealthState::Unreachable));
    assert_eq!(
        rows.iter()
            .find(|r| r.msr == "msr_2")
            .map(|r| r.status.as_str()),
        Some("registered")
    );

    // While msr_2 is black-holed: 200 selections/s keep their latency and
    // never pick it; the other MSRs' NOTIFYs are still answered (a load
    // change reaches the table).
    let (p50, p99, picked) = paced_selections(&mut client, secs(10)).await;
    eprintln!(
        "200 selections/s, msr_2 black-holed: p50 {p50:?}, p99 {p99:?} over {}",
        picked.len()
    );
    assert!(picked.len() > 500, "{}", picked.len());
    assert!(picked.iter().all(|m| m == "msr_3" || m == "msr_4"));
    agents[2].set_calls(30);
    let seen = c
        .wait_rows(secs(10), |rows| {
            live_row(rows, "msr_3", Some(30)).map(|_| ())
        })
        .await;
    assert!(
        seen.is_some(),
        "msr_3's NOTIFY answered while msr_2 is stopped"
    );

    // SIGCONT: selected again soon after its first fresh NOTIFY.
    let before = c
        .subscriptions()
        .await
        .unwrap_or_default()
        .into_iter()
        .find(|s| s.msr == "msr_2")
        .map(|s| (s.event_id, s.notify_count));
    agents[1].set_calls(20);
    signal(&agents[1], "-CONT");
    let resumed = Instant::now();
    let notified = c
        .wait_subs(secs(30), |subs| {
            subs.iter()
                .find(|s| s.msr == "msr_2")
                .filter(|s| Some((s.event_id.clone(), s.notify_count)) != before)
                .map(|_| Instant::now())
        })
        .await
        .expect("a fresh NOTIFY from msr_2 after SIGCONT");
    let selected = until_selected(&mut client, "msr_2", secs(20))
        .await
        .expect("msr_2 selected again after SIGCONT");
    eprintln!(
        "SIGCONT: first fresh NOTIFY seen {:?} after, selected {:?} after that NOTIFY",
        notified.saturating_duration_since(resumed),
        selected.saturating_duration_since(notified)
    );
    assert!(selected.saturating_duration_since(notified) < secs(10));

    // Restart of the killed msr_1: selected again after its first NOTIFY.
    agents[0].spawn();
    let restarted = Instant::now();
    let reported = c
        .wait_rows(secs(30), |rows| {
            rows.iter()
                .find(|r| {
                    r.msr == "msr_1"
                        && r.report_age_secs == Some(0)
                        && r.subscription == Some(SubscriptionState::Active)
                })
                .map(|_| Instant::now())
        })
        .await
        .expect("restarted msr_1 reports");
    let selected = until_selected(&mut client, "msr_1", secs(20))
        .await
        .expect("restarted msr_1 selected again");
    eprintln!(
        "restart: reporting {:?} after the start, selected {:?} after that",
        reported.saturating_duration_since(restarted),
        selected.saturating_duration_since(reported)
    );
    assert!(selected.saturating_duration_since(reported) < secs(10));
    let log = c.log_text();
    assert!(
        log.lines().any(|l| l.contains("health changed")
            && l.contains("msr_1")
            && l.contains("to=unreachable")),
        "health change logged"
    );
    // `msrctl --json msr list` shows health and since when.
    let list = c.msrctl_json(&["msr", "list"]);
    let msr_1 = list["msrs"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["name"] == "msr_1"))
        .cloned()
        .expect("msr_1 listed");
    assert_eq!(msr_1["health"], "healthy", "{msr_1}");
    assert!(msr_1["health_since_unix"].as_i64().is_some(), "{msr_1}");
}
