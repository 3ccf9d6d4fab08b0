//! Call legs (SPEC §9) against the real collector and real agents whose
//! loads are real readings: 1,000 legs selected and released leave every
//! MSR at zero live legs; a drained MSR keeps its live legs, takes no new
//! one, and reaches zero as they are released.

use std::collections::BTreeMap;
use std::time::Duration;

use msr_shared::admin::{LegOutcome, Request, ResponseData, SelectQuery, Selection};
use system_tests::system::{live_row, AccountSpec, Agent, AgentSpec, Collector, CollectorOpts};
use system_tests::AdminClient;

fn select(call_id: &str) -> Request {
    Request::Select(SelectQuery {
        call_id: Some(call_id.into()),
        ..SelectQuery::new("default", "local")
    })
}

fn release(call_id: &str) -> Request {
    Request::Release {
        call_id: call_id.into(),
        leg: None,
    }
}

async fn selected(client: &mut AdminClient, request: &Request) -> Selection {
    match client.call(request).await {
        Ok(msr_shared::admin::Response::Ok(ResponseData::Selected(s))) => s,
        other => panic!("{request:?} → {other:?}"),
    }
}

async fn released(client: &mut AdminClient, request: &Request) -> u32 {
    match client.call(request).await {
        Ok(msr_shared::admin::Response::Ok(ResponseData::Released(r))) => r.released,
        other => panic!("{request:?} → {other:?}"),
    }
}

/// Live legs per MSR, from `msr list` as an operator reads it.
async fn live_legs(collector: &Collector) -> BTreeMap<String, u32> {
    match collector.ok(&Request::MsrList {}).await {
        ResponseData::Msrs { msrs } => msrs.into_iter().map(|m| (m.name, m.live_legs)).collect(),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_legs_selected_and_released_leave_every_count_at_zero_and_a_drain_empties() {
    let dir = tempfile::tempdir().expect("tempdir");
    let collector = Collector::start(dir.path(), "core1", &CollectorOpts::default()).await;
    let loads = [("msr_1", 10), ("msr_2", 40), ("msr_3", 70)];
    let _agents: Vec<Agent> = loads
        .iter()
        .map(|(msr, calls)| {
            let spec = AgentSpec {
                accounts: vec![AccountSpec::new(msr, &collector)],
                ..AgentSpec::default()
            };
            Agent::start(dir.path(), msr, &spec, *calls)
        })
        .collect();
    collector
        .wait_rows(Duration::from_secs(15), |rows| {
            loads
                .iter()
                .all(|(msr, load)| live_row(rows, msr, u8::try_from(*load).ok()).is_some())
                .then_some(())
        })
        .await
        .expect("three MSRs live with their loads");

    let mut client = AdminClient::connect(&collector.socket)
        .await
        .expect("control socket");
    let mut picks: BTreeMap<String, u32> = BTreeMap::new();
    for n in 0..1000 {
        let s = selected(&mut client, &select(&format!("call-{n}"))).await;
        assert_eq!(s.leg, Some(LegOutcome::New));
        *picks.entry(s.msr).or_default() += 1;
    }
    // Shares follow the weights 90 / 60 / 30 (out of 180).
    assert_eq!(
        live_legs(&collector).await,
        picks,
        "msr list counts every live leg"
    );
    let share = |msr: &str| f64::from(picks.get(msr).copied().unwrap_or(0)) / 1000.0;
    assert!((share("msr_1") - 0.5).abs() < 0.07, "{picks:?}");
    assert!((share("msr_3") - 1.0 / 6.0).abs() < 0.07, "{picks:?}");
    // Selected again, each leg keeps its MSR.
    for n in (0..1000).step_by(50) {
        let again = selected(&mut client, &select(&format!("call-{n}"))).await;
        assert_eq!(again.leg, Some(LegOutcome::Sticky));
    }
    for n in 0..1000 {
        assert_eq!(
            released(&mut client, &release(&format!("call-{n}"))).await,
            1
        );
    }
    // A repeated release is harmless, and nothing goes below zero.
    assert_eq!(released(&mut client, &release("call-0")).await, 0);
    let counts = live_legs(&collector).await;
    assert!(counts.values().all(|&n| n == 0), "{counts:?}");

    // Drain msr_1 with 30 live legs on it.
    let mut on_msr_1 = Vec::new();
    let mut n = 0;
    while on_msr_1.len() < 30 {
        let call = format!("drain-{n}");
        n += 1;
        if selected(&mut client, &select(&call)).await.msr == "msr_1" {
            on_msr_1.push(call);
        } else {
            released(&mut client, &release(&call)).await;
        }
    }
    let (ok, out, err) = collector.msrctl(&["msr", "set", "msr_1", "active", "false"]);
    assert!(ok, "{out}{err}");
    for n in 0..200 {
        let s = selected(&mut client, &select(&format!("after-{n}"))).await;
        assert_ne!(s.msr, "msr_1", "a drained MSR takes no new leg");
        released(&mut client, &release(&format!("after-{n}"))).await;
    }
    // Its live legs stay, and stay sticky.
    assert_eq!(live_legs(&collector).await.get("msr_1"), Some(&30));
    let again = selected(&mut client, &select(&on_msr_1[0])).await;
    assert_eq!(
        (again.msr.as_str(), again.leg),
        ("msr_1", Some(LegOutcome::Sticky))
    );
    // msrctl shows the operator when the drained MSR is empty.
    for call in &on_msr_1 {
        released(&mut client, &release(call)).await;
    }
    let table = collector.msrctl_json(&["msr", "list"]);
    let msr_1 = table["msrs"]
        .as_array()
        .and_then(|a| a.iter().find(|m| m["name"] == "msr_1"))
        .cloned()
        .expect("msr_1 listed");
    assert_eq!(
        (msr_1["active"].as_bool(), msr_1["live_legs"].as_u64()),
        (Some(false), Some(0)),
        "{table}"
    );
    let (ok, out, _) = collector.msrctl(&["release", "--call-id", "never-placed"]);
    assert!(ok && out.contains("no live leg"), "{out}");
}

/// `leg list` over msrctl and HTTP (SPEC §9): legs placed are listed with
/// their MSR, filtered by MSR, gone once released; a select after its own
/// release places nothing (`leg_released`, HTTP 409).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leg_list_shows_filters_and_forgets_released_legs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (collector, _agents, http_port, _, _) = crate::front_ends::system(dir.path()).await;
    let mut client = AdminClient::connect(&collector.socket)
        .await
        .expect("control socket");
    for (call, other) in [("a", "msr_1"), ("b", "msr_1"), ("c", "msr_2")] {
        let request = Request::Select(SelectQuery {
            msr: Some(other.into()),
            call_id: Some(call.into()),
            ..SelectQuery::new("default", "local")
        });
        assert_eq!(selected(&mut client, &request).await.msr, other);
    }
    let listed = collector.msrctl_json(&["leg", "list"]);
    assert_eq!(listed["total"], 3, "{listed}");
    let (ok, out, err) = collector.msrctl(&["leg", "list", "--msr", "msr_1"]);
    assert!(
        ok && out.contains("2 live legs") && !out.contains("│ c "),
        "{out}{err}"
    );
    let (status, body) =
        crate::front_ends::http(http_port, "GET", "/v1/legs?msr=msr_2&older_than=0", "", "").await;
    let value: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(
        (status, &value["total"]),
        (200, &serde_json::json!(1)),
        "{body}"
    );
    assert_eq!(value["rows"][0]["call_id"], "c", "{body}");
    let (status, _) = crate::front_ends::http(http_port, "GET", "/v1/legs?limit=0", "", "").await;
    assert_eq!(status, 400);

    assert_eq!(released(&mut client, &release("a")).await, 1);
    let listed = collector.msrctl_json(&["leg", "list"]);
    assert_eq!(listed["total"], 2, "{listed}");
    assert!(
        listed["rows"]
            .as_array()
            .is_some_and(|rows| rows.iter().all(|r| r["call_id"] != "a")),
        "{listed}"
    );

    // A release that overtakes its select.
    assert_eq!(released(&mut client, &release("early")).await, 0);
    let (status, body) = crate::front_ends::http(
        http_port,
        "GET",
        "/v1/select?zone=default&site=local&call_id=early",
        "",
        "",
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("leg_released"), "{body}");
    assert_eq!(collector.msrctl_json(&["leg", "list"])["total"], 2);
}

/// Selects and releases of the same calls racing over separate control
/// connections (SPEC §9): a release may reach the collector before its
/// select, and then the select places nothing (`leg_released`) however
/// the two interleave. At the end the live legs are exactly the calls that
/// were never released, and every count agrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selects_and_releases_racing_over_separate_connections_leave_exactly_the_unreleased_legs() {
    const RACED: usize = 300;
    const KEPT: usize = 60;
    let dir = tempfile::tempdir().expect("tempdir");
    let collector = Collector::start(dir.path(), "core1", &CollectorOpts::default()).await;
    let _agents: Vec<Agent> = ["msr_1", "msr_2"]
        .into_iter()
        .map(|msr| {
            let spec = AgentSpec {
                accounts: vec![AccountSpec::new(msr, &collector)],
                ..AgentSpec::default()
            };
            Agent::start(dir.path(), msr, &spec, 10)
        })
        .collect();
    collector
        .wait_rows(Duration::from_secs(15), |rows| {
            ["msr_1", "msr_2"]
                .iter()
                .all(|msr| live_row(rows, msr, Some(10)).is_some())
                .then_some(())
        })
        .await
        .expect("two MSRs live");

    let connect = || AdminClient::connect(&collector.socket);
    // Two pairs of connections, each pair one selecting and one releasing
    // the same calls in the same order, so that they overtake each other;
    // a fifth connection places the calls that are never released.
    let raced = |pair: usize, n: usize| format!("race-{pair}-{n}");
    let mut tasks = Vec::new();
    for pair in 0..2 {
        let mut selecting = connect().await.expect("control socket");
        tasks.push(tokio::spawn(async move {
            let (mut placed, mut refused) = (0_u32, 0_u32);
            for n in 0..RACED {
                match selecting.call(&select(&raced(pair, n))).await {
                    Ok(msr_shared::admin::Response::Ok(ResponseData::Selected(_))) => placed += 1,
                    Ok(msr_shared::admin::Response::Err(e))
                        if e.code == msr_shared::admin::ErrorCode::LegReleased =>
                    {
                        refused += 1
                    }
                    other => panic!("select {} → {other:?}", raced(pair, n)),
                }
            }
            (placed, refused)
        }));
        let mut releasing = connect().await.expect("control socket");
        tasks.push(tokio::spawn(async move {
            let mut ended = 0_u32;
            for n in 0..RACED {
                ended += released(&mut releasing, &release(&raced(pair, n))).await;
            }
            (ended, 0)
        }));
    }
    let mut keeping = connect().await.expect("control socket");
    let kept = tokio::spawn(async move {
        for n in 0..KEPT {
            selected(&mut keeping, &select(&format!("kept-{n}"))).await;
        }
    });
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.expect("a racing connection"));
    }
    kept.await.expect("the keeping connection");
    // Per pair: every select was placed (and its release ended it) or
    // refused because its release came first.
    for pair in 0..2 {
        let (placed, refused) = outcomes[2 * pair];
        let (ended, _) = outcomes[2 * pair + 1];
        eprintln!("pair {pair}: {placed} selects placed, {refused} overtaken by their release");
        assert_eq!(
            (placed + refused, ended),
            (RACED as u32, placed),
            "pair {pair}: {placed} placed, {refused} refused as released, {ended} ended"
        );
    }

    let listed = collector.msrctl_json(&["leg", "list", "--limit", "1000"]);
    let mut live: Vec<String> = listed["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .filter_map(|r| r["call_id"].as_str().map(String::from))
        .collect();
    live.sort();
    let mut expected: Vec<String> = (0..KEPT).map(|n| format!("kept-{n}")).collect();
    expected.sort();
    assert_eq!(live, expected, "{listed}");
    assert_eq!(listed["total"], KEPT, "{listed}");
    let counts = live_legs(&collector).await;
    assert_eq!(counts.values().sum::<u32>(), KEPT as u32, "{counts:?}");
}
