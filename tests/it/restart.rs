//! No gap across restarts (SPEC §3): a collector killed with `kill -9`
//! resumes a subscription to every saved, unexpired binding at once,
//! without waiting for the MSRs' next REGISTER; an agent killed and
//! restarted (a new Call-ID) is subscribed anew at once, not after the dead
//! dialog's refresh fails. The bounds are generous; the figures are in
//! RELIABILITY.md.

use std::time::{Duration, Instant};

use msr_shared::admin::{Request, ResponseData, SelectQuery};
use system_tests::system::{live_row, AccountSpec, Agent, AgentSpec, Collector, CollectorOpts};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Agents that register for 300 s refresh after 270 s: nothing in these
/// tests comes back through a REGISTER refresh.
fn long_registration(msr: &str, collector: &Collector) -> AgentSpec {
    AgentSpec {
        accounts: vec![AccountSpec::new(msr, collector)],
        register_expires: 300,
        ..AgentSpec::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_collector_resumes_every_subscription_without_a_register() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut collector = Collector::start(dir.path(), "core1", &CollectorOpts::default()).await;
    let agents: Vec<Agent> = (1..=3)
        .map(|i| {
            let msr = format!("msr_{i}");
            Agent::start(
                dir.path(),
                &msr,
                &long_registration(&msr, &collector),
                10 * i,
            )
        })
        .collect();
    let all_live = |rows: &[msr_shared::admin::ResourceInfo], loads: [u8; 3]| {
        (1..=3).all(|i| live_row(rows, &format!("msr_{i}"), Some(loads[i - 1])).is_some())
    };
    collector
        .wait_rows(secs(15), |rows| all_live(rows, [10, 20, 30]).then_some(()))
        .await
        .expect("three MSRs live");
    // Each binding is on disk before its 200 (SPEC §3): the file holds
    // all three once the MSRs are live.
    let saved = {
        let mut path = collector.state.clone().into_os_string();
        path.push(".bindings");
        std::path::PathBuf::from(path)
    };
    system_tests::wait_for(secs(5), || {
        let saved = saved.clone();
        async move {
            let text = std::fs::read_to_string(&saved).ok()?;
            (1..=3)
                .all(|i| text.contains(&format!("\"lo@msr_{i}\"")))
                .then_some(())
        }
    })
    .await
    .expect("every binding saved");
    assert!((1..=3)
        .all(|i| std::fs::read_to_string(&saved)
            .is_ok_and(|t| t.contains(&format!("\"lo@msr_{i}\"")))));
    // The subscription starts with the binding, before its 200 (which
    // waits for the disk): count the REGISTERs once each agent has its 200.
    let confirmed = system_tests::wait_for(secs(5), || {
        let all = agents
            .iter()
            .all(|a| a.log_count(&["registration confirmed"]) > 0);
        async move { all.then_some(()) }
    })
    .await;
    confirmed.expect("every agent registered");
    let registers_before: Vec<usize> = agents
        .iter()
        .map(|a| a.log_count(&["registration confirmed"]))
        .collect();

    collector.kill9();
    // From the start of the new process: what an operator's restart costs.
    let restarted = Instant::now();
    collector.spawn().await;
    let rows = collector
        .wait_rows(secs(10), |rows| {
            all_live(rows, [10, 20, 30]).then(|| rows.to_vec())
        })
        .await
        .unwrap_or_else(|| panic!("not every MSR back within 10 s of the restart"));
    eprintln!(
        "every MSR selectable again {:?} after the collector restart",
        restarted.elapsed()
    );
    // The new subscriptions carry the next change.
    agents[0].set_calls(15);
    collector
        .wait_rows(secs(10), |rows| {
            live_row(rows, "msr_1", Some(15)).map(|_| ())
        })
        .await
        .expect("a load change after the restart is reported");
    let registers_after: Vec<usize> = agents
        .iter()
        .map(|a| a.log_count(&["registration confirmed"]))
        .collect();
    assert_eq!(
        registers_before, registers_after,
        "the table came back without a new REGISTER"
    );
    assert!(
        collector.log_text().contains("bindings restored"),
        "{}",
        collector.log_text()
    );
    // The engine's addresses came back with the bindings.
    for r in &rows {
        assert!(
            r.engine_uri
                .as_deref()
                .is_some_and(|u| u.starts_with("sip:127.0.0.1:")),
            "{r:?}"
        );
    }
    match collector
        .ok(&Request::Select(SelectQuery {
            msr: Some("msr_2".into()),
            ..SelectQuery::new("default", "local")
        }))
        .await
    {
        ResponseData::Selected(s) => assert_eq!(s.msr, "msr_2"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_is_subscribed_anew_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A 60 s subscription: its refresh (15 s) would find the dead dialog
    // far too late.
    let opts = CollectorOpts {
        subscription_expires: 60,
        ..CollectorOpts::default()
    };
    let collector = Collector::start(dir.path(), "core1", &opts).await;
    let mut agent = Agent::start(
        dir.path(),
        "msr_1",
        &long_registration("msr_1", &collector),
        10,
    );
    collector
        .wait_rows(secs(15), |rows| {
            live_row(rows, "msr_1", Some(10)).map(|_| ())
        })
        .await
        .expect("msr_1 live");
    let first_event = collector
        .subscriptions()
        .await
        .and_then(|s| s.into_iter().find(|s| s.msr == "msr_1"))
        .map(|s| s.event_id)
        .expect("a subscription");

    agent.kill9();
    agent.set_calls(40);
    let restarted = Instant::now();
    agent.spawn();
    collector
        .wait_rows(secs(10), |rows| {
            live_row(rows, "msr_1", Some(40)).map(|_| ())
        })
        .await
        .unwrap_or_else(|| panic!("restarted agent's load not shown within 10 s"));
    eprintln!(
        "restarted agent's fresh load shown {:?} after its start",
        restarted.elapsed()
    );
    let subs = collector.subscriptions().await.unwrap_or_default();
    let sub = subs
        .iter()
        .find(|s| s.msr == "msr_1")
        .expect("subscription");
    assert_ne!(sub.event_id, first_event, "a new dialog: {sub:?}");
    assert!(
        collector
            .log_text()
            .contains("binding restarted (new call-id), subscribing anew"),
        "{}",
        collector.log_text()
    );
}

/// A bindings file that is torn (a crash of the host mid-write) or from
/// another version is reported and ignored: the collector starts, and the
/// MSRs come back with their next REGISTER.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_bindings_file_is_reported_and_ignored() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut collector = Collector::start(dir.path(), "core1", &CollectorOpts::default()).await;
    let mut saved = collector.state.clone().into_os_string();
    saved.push(".bindings");
    collector.kill9();
    for (text, what) in [
        (
            r#"{"format":"msr-collector bindings","version":1,"bindings":[{"msr":"#,
            "torn",
        ),
        (
            r#"{"format":"msr-collector bindings","version":99,"bindings":[]}"#,
            "version 99",
        ),
    ] {
        std::fs::write(&saved, text).expect("write bindings");
        collector.spawn().await;
        let log = collector.log_text();
        assert!(
            log.contains("saved bindings ignored, the msrs register again"),
            "{what}: {log}"
        );
        let spec = AgentSpec {
            accounts: vec![AccountSpec::new("msr_1", &collector)],
            ..AgentSpec::default()
        };
        let _agent = Agent::start(dir.path(), "msr_1", &spec, 10);
        collector
            .wait_rows(secs(15), |rows| {
                live_row(rows, "msr_1", Some(10)).map(|_| ())
            })
            .await
            .unwrap_or_else(|| panic!("{what}: msr_1 does not register"));
        collector.kill9();
    }
}

/// SPEC §3: a binding is on disk before its 200, so a collector killed the
/// instant the agent has its 200 still has the binding when it restarts,
/// and the MSR is live again from it, without a REGISTER.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_killed_right_after_a_200_keeps_that_binding() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut collector = Collector::start(dir.path(), "core1", &CollectorOpts::default()).await;
    let agent = Agent::start(
        dir.path(),
        "msr_1",
        &long_registration("msr_1", &collector),
        10,
    );
    // The agent logs its 200 as it reads it; kill the collector then.
    let confirmed = system_tests::wait_for(secs(10), || {
        let n = agent.log_count(&["registration confirmed"]);
        async move { (n > 0).then_some(()) }
    })
    .await;
    collector.kill9();
    confirmed.expect("registered");
    let registers = agent.log_count(&["registration confirmed"]);
    let restarted = Instant::now();
    collector.spawn().await;
    collector
        .wait_rows(secs(10), |rows| {
            live_row(rows, "msr_1", Some(10)).map(|_| ())
        })
        .await
        .unwrap_or_else(|| {
            panic!(
                "msr_1 not back from the saved binding\n{}",
                collector.log_text()
            )
        });
    eprintln!(
        "msr_1 selectable again {:?} after the restart",
        restarted.elapsed()
    );
    assert_eq!(
        agent.log_count(&["registration confirmed"]),
        registers,
        "back without a new REGISTER"
    );
}
