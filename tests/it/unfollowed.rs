//! Selections without a call_id near an MSR's top (SPEC §10, "selections
//! without a leg"; interfaces.md, "Call legs") against a real collector
//! and real agents at 9 calls of 10: each select counts its session until
//! a report covers it or for at most a second, over HTTP and the control
//! socket alike (the front ends' copy leaves such a choice to the loop),
//! the refusal says why in one line, the MSRs come back once selects stop
//! with nothing else happening, and `--explain` counts nothing.

use std::time::{Duration, Instant};

use system_tests::system::{live_row, AccountSpec, Agent, AgentSpec, Collector};

use crate::front_ends::http;

const MSRS: [&str; 2] = ["msr_1", "msr_2"];
const REFUSAL: &str = "every msr in zone `default` nearest to site `local` is at or above its load limit by its last report and the selections without a call_id sent to it since";

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not json ({e}): {body}"))
}

/// A select without a call_id over HTTP: the MSR, or the refusal's code
/// and message.
async fn http_select(port: u16) -> Result<String, (String, String)> {
    let (status, body) = http(port, "GET", "/v1/select?zone=default&site=local", "", "").await;
    let answer = json(&body);
    match status {
        200 => Ok(answer["msr"].as_str().expect("msr").to_owned()),
        _ => Err((
            answer["code"].as_str().unwrap_or_default().to_owned(),
            answer["message"].as_str().unwrap_or_default().to_owned(),
        )),
    }
}

/// The same through msrctl (the control socket).
fn msrctl_select(collector: &Collector) -> Result<String, String> {
    let (ok, out, err) = collector.msrctl(&["select", "--json"]);
    if ok {
        Ok(json(&out)["msr"].as_str().expect("msr").to_owned())
    } else {
        Err(format!("{out}{err}"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selects_without_a_call_id_fill_the_top_then_free_it_within_a_second() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (collector, port) = Collector::start_with_http(dir.path(), "core1").await;
    let _agents: Vec<Agent> = MSRS
        .iter()
        .enumerate()
        .map(|(i, msr)| {
            let spec = AgentSpec {
                accounts: vec![AccountSpec::new(msr, &collector)],
                max_calls: 10,
                sample_interval_ms: 100,
                engine_port: 5290 + 2 * u16::try_from(i).unwrap_or(0),
                ..AgentSpec::default()
            };
            Agent::start(dir.path(), msr, &spec, 9)
        })
        .collect();
    collector
        .wait_rows(Duration::from_secs(20), |rows| {
            MSRS.iter()
                .all(|msr| live_row(rows, msr, Some(90)).is_some())
                .then_some(())
        })
        .await
        .expect("two MSRs live at 9 of 10");

    for round in 0..2 {
        // One session each fills them (9 + 1 of 10, G = 1), whichever
        // front end asked; nothing else changes meanwhile (the calls
        // files stay at 9, so no report covers them).
        let first = http_select(port).await.expect("http: room on both");
        let second = msrctl_select(&collector).expect("msrctl: room on the other");
        assert_ne!(first, second, "round {round}: the first one is full");
        let last_counted = Instant::now();
        let refused = http_select(port).await;
        assert_eq!(
            refused,
            Err(("msr_overloaded".to_owned(), REFUSAL.to_owned())),
            "round {round}"
        );
        let refused = msrctl_select(&collector).expect_err("msrctl: both full");
        assert!(
            refused.contains("msr_overloaded") && refused.contains(REFUSAL),
            "{refused}"
        );
        // The loop has nothing to do but forget them: at most a second.
        let freed = loop {
            if msrctl_select(&collector).is_ok() {
                break last_counted.elapsed();
            }
            assert!(
                last_counted.elapsed() < Duration::from_secs(3),
                "round {round}: still refused after 3 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(
            freed >= Duration::from_millis(900),
            "round {round}: {freed:?}"
        );
        // What that select counted goes too.
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }

    // `--explain` asks why and counts nothing: both still take one.
    for _ in 0..5 {
        let (ok, out, err) = collector.msrctl(&["select", "--explain"]);
        assert!(ok, "{out}{err}");
    }
    let a = msrctl_select(&collector).expect("room after explains");
    let b = http_select(port).await.expect("room on the other");
    assert_ne!(a, b);
}
