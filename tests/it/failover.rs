//! Failover within call setup and drain to completion (SPEC §14) against
//! the real collector and real agents: a core that reports the MSR it was
//! given as failed (over HTTP, the control socket, the redirect server)
//! gets the next one, the failures count against the MSR (the first
//! timeout takes it out of selection: `engine_down`), the attempts are
//! bounded and the leg is gone when none is left; `msrctl msr drain
//! --wait` returns once the last leg and engine call on the MSR ended.

use std::time::Duration;

use msr_shared::admin::{Request, ResponseData};
use system_tests::{bin_path, wait_for};

use crate::front_ends::{http, system};

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not json ({e}): {body}"))
}

/// `GET /v1/select` for call `call_id` with `extra` query parameters.
async fn select(port: u16, call_id: &str, extra: &str) -> (u16, serde_json::Value) {
    let path = format!("/v1/select?zone=default&site=local&call_id={call_id}{extra}");
    let (status, body) = http(port, "GET", &path, "", "").await;
    (status, json(&body))
}

/// The health of `msr`'s contact as `resource list --json` shows it.
pub(crate) fn health_of(collector: &system_tests::system::Collector, msr: &str) -> Option<String> {
    let rows = collector.msrctl_json(&["resource", "list"]);
    rows["rows"]
        .as_array()?
        .iter()
        .find(|r| r["msr"] == msr)
        .and_then(|r| r["health"].as_str().map(str::to_owned))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_msr_is_replaced_counted_against_and_the_attempts_are_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (collector, _agents, port, redirect_port, _) = system(dir.path()).await;

    let (status, first) = select(port, "f1", "").await;
    assert_eq!(status, 200, "{first}");
    let a = first["msr"].as_str().expect("msr").to_owned();
    // The engine answered 503: the next MSR, the leg re-anchored there.
    let (status, second) = select(port, "f1", &format!("&failed={a}&failure=503")).await;
    assert_eq!(status, 200, "{second}");
    let b = second["msr"].as_str().expect("msr").to_owned();
    assert_ne!(a, b);
    assert_eq!(second["leg"], "reanchored", "{second}");
    // The core asks again (its retransmission): same MSR, counted once.
    let (_, again) = select(port, "f1", &format!("&failed={a}&failure=503")).await;
    assert_eq!(
        (again["msr"].as_str(), again["leg"].as_str()),
        (Some(b.as_str()), Some("sticky"))
    );
    assert_eq!(health_of(&collector, &a).as_deref(), Some("healthy"));
    // The second MSR timed out: the first timeout takes it out at once.
    let (status, third) = select(port, "f1", &format!("&failed={a},{b}&failure=timeout")).await;
    assert_eq!(status, 200, "{third}");
    let c = third["msr"].as_str().expect("msr").to_owned();
    assert!(c != a && c != b, "{third}");
    let out = wait_for(Duration::from_secs(1), || {
        let health = health_of(&collector, &b);
        async move { (health.as_deref() == Some("engine_down")).then_some(()) }
    })
    .await;
    assert!(
        out.is_some(),
        "{b} out of selection: {:?}",
        health_of(&collector, &b)
    );
    for n in 0..30 {
        let (_, s) = select(port, &format!("after-{n}"), "").await;
        assert_ne!(
            s["msr"],
            b.as_str(),
            "an MSR out of selection gets no new leg"
        );
    }
    // The third failed too: three attempts used, refused, the leg gone.
    let (status, refused) = select(port, "f1", &format!("&failed={a},{b},{c}&failure=500")).await;
    assert_eq!(status, 503, "{refused}");
    assert_eq!(refused["code"], "msr_unavailable", "{refused}");
    let message = refused["message"].as_str().unwrap_or_default();
    assert!(message.contains(&a) && message.contains(&c), "{message}");
    // The refusal is in the log with its code and why (SPEC §16).
    assert!(
        collector
            .wait_log(
                0,
                &[
                    "selection refused",
                    "code=\"msr_unavailable\"",
                    "reason=",
                    "attempts"
                ],
                Duration::from_secs(5)
            )
            .await,
        "{}",
        collector.log_text()
    );
    let legs = collector.msrctl_json(&["leg", "list"]);
    let listed = legs["rows"].as_array().cloned().expect("leg list rows");
    assert!(listed.iter().all(|l| l["call_id"] != "f1"), "{legs}");
    // The core released a live leg and its failover came after (another
    // connection): nothing is placed, and the counts stay exact.
    let (_, placed) = select(port, "f3", "").await;
    let on = placed["msr"].as_str().expect("msr").to_owned();
    let (status, _) = http(
        port,
        "POST",
        "/v1/release",
        "Content-Type: application/json\r\n",
        "{\"call_id\":\"f3\"}",
    )
    .await;
    assert_eq!(status, 200);
    let (status, late) = select(port, "f3", &format!("&failed={on}&failure=503")).await;
    assert_eq!(
        (status, late["code"].as_str()),
        (409, Some("leg_released")),
        "{late}"
    );
    let legs = collector.msrctl_json(&["leg", "list"]);
    let rows = legs["rows"].as_array().cloned().expect("leg list rows");
    assert!(rows.iter().all(|l| l["call_id"] != "f3"), "{legs}");
    let msrs = collector.msrctl_json(&["msr", "list"]);
    let on_msrs: u64 = msrs["msrs"]
        .as_array()
        .expect("msr list")
        .iter()
        .map(|m| m["live_legs"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(Some(on_msrs), legs["total"].as_u64(), "{msrs}\n{legs}");
    // Bad input gets a clear error.
    let (status, bad) = select(port, "f2", "&failed=msr_1&failure=soon").await;
    assert_eq!(
        (status, bad["code"].as_str()),
        (400, Some("invalid_value")),
        "{bad}"
    );

    // The redirect server: the INVITE again with X-MSR-Failed.
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let local = socket.local_addr().expect("addr");
    let invite = |branch: &str, failed: Option<&str>| {
        let extra = failed
            .map(|f| format!("X-MSR-Failed: {f}\r\nX-MSR-Failure: 503\r\n"))
            .unwrap_or_default();
        format!(
            "INVITE sip:callee@127.0.0.1:{redirect_port} SIP/2.0\r\n\
             Via: SIP/2.0/UDP {local};branch=z9hG4bK{branch}\r\n\
             Max-Forwards: 70\r\nFrom: <sip:caller@127.0.0.1>;tag=1\r\n\
             To: <sip:callee@127.0.0.1>\r\nCall-ID: redirect-failover-1\r\n\
             CSeq: 1 INVITE\r\nContact: <sip:caller@{local}>\r\n{extra}Content-Length: 0\r\n\r\n"
        )
    };
    let ask = |text: String| {
        let socket = &socket;
        async move {
            socket
                .send_to(text.as_bytes(), ("127.0.0.1", redirect_port))
                .await
                .expect("send");
            let mut buf = vec![0_u8; 65_535];
            let (n, _) = tokio::time::timeout(Duration::from_secs(5), socket.recv_from(&mut buf))
                .await
                .expect("an answer within 5 s")
                .expect("recv");
            String::from_utf8_lossy(&buf[..n]).into_owned()
        }
    };
    let header = |response: &str, name: &str| {
        response.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    };
    let first = ask(invite("r1", None)).await;
    assert!(first.starts_with("SIP/2.0 302"), "{first}");
    let was = header(&first, "X-MSR").expect("X-MSR");
    let next = ask(invite("r2", Some(&was))).await;
    assert!(next.starts_with("SIP/2.0 302"), "{next}");
    let now_on = header(&next, "X-MSR").expect("X-MSR");
    assert_ne!(was, now_on, "{next}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msrctl_drain_wait_returns_when_the_last_leg_and_engine_call_ended() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut collector, agents, port, _, _) = system(dir.path()).await;
    // Five legs on msr_1.
    let mut on_msr_1 = Vec::new();
    let mut n = 0;
    while on_msr_1.len() < 5 {
        let call = format!("d-{n}");
        n += 1;
        let (_, s) = select(port, &call, "").await;
        if s["msr"] == "msr_1" {
            on_msr_1.push(call);
        } else {
            collector
                .ok(&Request::Release {
                    call_id: call,
                    leg: None,
                })
                .await;
        }
    }
    // An unknown MSR is refused, not "drained".
    let (ok, _, err) = collector.msrctl(&["msr", "drain", "msr_9", "--wait"]);
    assert!(!ok && err.contains("msr_9"), "{err}");
    let (ok, _, err) = collector.msrctl(&["msr", "undrain", "msr_9"]);
    assert!(!ok && err.contains("no msr `msr_9`"), "{err}");
    // A reader that goes away before the answer is printed (`msrctl msr
    // list | head -1`) makes no panic.
    let piped = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "(sleep 0.5; '{}' --socket '{}' msr list) | true",
            bin_path("msrctl").display(),
            collector.socket.display()
        ))
        .output()
        .expect("sh");
    let err = String::from_utf8_lossy(&piped.stderr);
    assert!(!err.contains("panicked"), "{err}");

    let mut drain = std::process::Command::new(bin_path("msrctl"))
        .arg("--socket")
        .arg(&collector.socket)
        .args(["msr", "drain", "msr_1", "--wait", "--timeout", "60"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("msrctl");
    // Draining: no new legs there; the live ones stay.
    let draining = wait_for(Duration::from_secs(5), || async {
        match collector.ok(&Request::MsrList {}).await {
            ResponseData::Msrs { msrs } => msrs
                .iter()
                .any(|m| m.name == "msr_1" && !m.active)
                .then_some(()),
            _ => None,
        }
    })
    .await;
    assert!(draining.is_some());
    for n in 0..30 {
        let (_, s) = select(port, &format!("new-{n}"), "").await;
        assert_ne!(s["msr"], "msr_1");
    }
    let list = collector.msrctl_json(&["msr", "list"]);
    let row = list["msrs"]
        .as_array()
        .and_then(|a| a.iter().find(|m| m["name"] == "msr_1"))
        .cloned()
        .expect("msr_1");
    assert_eq!(
        (row["drain"].as_str(), row["live_legs"].as_u64()),
        (Some("draining"), Some(5)),
        "{row}"
    );
    for call in &on_msr_1 {
        collector
            .ok(&Request::Release {
                call_id: call.clone(),
                leg: None,
            })
            .await;
    }
    // The legs are gone, but the engine still reports calls: not drained.
    assert!(
        drain.try_wait().expect("wait").is_none(),
        "msrctl returned early"
    );
    // The collector restarts meanwhile: the drain is in its store, and
    // msrctl waits for it to answer again.
    collector.kill9();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    collector.spawn().await;
    assert!(
        drain.try_wait().expect("wait").is_none(),
        "msrctl gave up during the restart"
    );
    agents[0].set_calls(0);
    let status = wait_for(Duration::from_secs(20), || {
        let status = drain.try_wait().expect("wait");
        async move { status }
    })
    .await
    .expect("msrctl drain --wait returned");
    let out = drain.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("msr_1: drained"), "{stdout}");
    assert!(
        collector
            .wait_log(0, &["msr drained", "msr_1"], Duration::from_secs(5))
            .await,
        "the collector logs the drain's end"
    );
    let (ok, _, err) = collector.msrctl(&["msr", "undrain", "msr_1"]);
    assert!(ok, "{err}");
    // Both changes are on record, with who made them (SPEC §16).
    for (from, to) in [("true", "false"), ("false", "true")] {
        assert!(
            collector
                .wait_log(
                    0,
                    &[
                        "operator change",
                        "control socket uid",
                        "msr msr_1 active",
                        &format!("from={from}"),
                        &format!("to={to}"),
                    ],
                    Duration::from_secs(5)
                )
                .await,
            "the change {from} -> {to} is logged:\n{}",
            collector.log_text()
        );
    }
}

/// The agent's own probe of its engine (SPEC §14) reaches the collector:
/// an engine that stops answering is `engine_down` in `resource list`
/// within 5 s with no call in flight, gets no new leg while its agent
/// keeps answering, and is `healthy` again once the engine answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_stops_answering_its_agent_is_out_of_selection_within_5_s() {
    use system_tests::system::{live_row, AccountSpec, Agent, AgentSpec, Collector, CollectorOpts};
    let dir = tempfile::tempdir().expect("tempdir");
    let collector = Collector::start(dir.path(), "core1", &CollectorOpts::default()).await;
    let mut engines = Vec::new();
    let mut agents = Vec::new();
    for msr in ["msr_1", "msr_2"] {
        let engine_port = system_tests::free_udp_port();
        engines.push((
            engine_port,
            Some(crate::engine::Engine::start(engine_port).await),
        ));
        let spec = AgentSpec {
            accounts: vec![AccountSpec::new(msr, &collector)],
            engine_port,
            agent_attributes: r#"engine-probe="sip" engine-probe-interval-ms="1000" engine-probe-timeout-ms="500""#.into(),
            ..AgentSpec::default()
        };
        agents.push(Agent::start(dir.path(), msr, &spec, 10));
    }
    collector
        .wait_rows(Duration::from_secs(15), |rows| {
            ["msr_1", "msr_2"]
                .iter()
                .all(|msr| live_row(rows, msr, Some(10)).is_some())
                .then_some(())
        })
        .await
        .expect("both MSRs healthy with their engines up");
    let stopped = std::time::Instant::now();
    if let Some(engine) = engines[0].1.take() {
        engine.stop();
    }
    let down = wait_for(Duration::from_secs(5), || {
        let health = health_of(&collector, "msr_1");
        async move { (health.as_deref() == Some("engine_down")).then_some(()) }
    })
    .await;
    assert!(
        down.is_some(),
        "msr_1 engine_down within 5 s: {:?}",
        health_of(&collector, "msr_1")
    );
    eprintln!("engine_down after {:?}", stopped.elapsed());
    let mut client = system_tests::AdminClient::connect(&collector.socket)
        .await
        .expect("control socket");
    for n in 0..20 {
        let request = Request::Select(msr_shared::admin::SelectQuery {
            call_id: Some(format!("e-{n}")),
            ..msr_shared::admin::SelectQuery::new("default", "local")
        });
        match client.call(&request).await {
            Ok(msr_shared::admin::Response::Ok(ResponseData::Selected(s))) => {
                assert_eq!(s.msr, "msr_2", "no new leg on an MSR whose engine is down");
            }
            other => panic!("{other:?}"),
        }
    }
    engines[0].1 = Some(crate::engine::Engine::start(engines[0].0).await);
    let back = wait_for(Duration::from_secs(10), || {
        let health = health_of(&collector, "msr_1");
        async move { (health.as_deref() == Some("healthy")).then_some(()) }
    })
    .await;
    assert!(
        back.is_some(),
        "msr_1 healthy again: {:?}",
        health_of(&collector, "msr_1")
    );
    for (_, engine) in engines {
        if let Some(engine) = engine {
            engine.stop();
        }
    }
}

/// Nothing vanishes (SPEC §14): an MSR killed while serving stays in `msr
/// list` once its registration lapsed, `gone (lapsed)`, with
/// `msr_collector_msr_gone` at 1, until it registers again; a gone MSR the
/// operator forgets leaves the list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_msr_that_dies_stays_listed_as_gone_until_it_returns_or_is_forgotten() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (collector, mut agents, port, _, _) = system(dir.path()).await;
    let row = |name: &str| {
        let list = collector.msrctl_json(&["msr", "list"]);
        list["msrs"]
            .as_array()
            .and_then(|a| a.iter().find(|m| m["name"] == name).cloned())
    };
    agents[0].kill9();
    // The harness's agents register for 6 s: the binding lapses soon.
    let gone = wait_for(Duration::from_secs(20), || {
        let r = row("msr_1");
        async move { r.filter(|r| r["gone_cause"] == "lapsed") }
    })
    .await
    .expect("msr_1 listed as gone once its registration lapsed");
    assert_eq!(gone["registered"], false, "{gone}");
    assert_eq!(gone["gone_while_serving"], true, "{gone}");
    assert!(gone["gone_since_unix"].as_i64().is_some(), "{gone}");
    let (_, table, _) = collector.msrctl(&["msr", "list"]);
    assert!(table.contains("gone (lapsed)"), "{table}");
    let scrape = crate::front_ends::scrape(port).await;
    assert_eq!(
        crate::front_ends::sample(&scrape, "msr_collector_msr_gone", &[("msr", "msr_1")]),
        Some(1.0)
    );
    assert!(
        collector
            .wait_log(0, &["msr gone", "msr_1", "lapsed"], Duration::from_secs(5))
            .await
    );
    // It registers again: no longer gone.
    agents[0].spawn();
    let back = wait_for(Duration::from_secs(15), || {
        let r = row("msr_1");
        async move { r.filter(|r| r["registered"] == true && r.get("gone_cause").is_none()) }
    })
    .await;
    assert!(back.is_some(), "{:?}", row("msr_1"));
    // Gone again, then forgotten by the operator.
    agents[1].kill9();
    let gone = wait_for(Duration::from_secs(20), || {
        let r = row("msr_2");
        async move { r.filter(|r| r["gone_cause"] == "lapsed") }
    })
    .await;
    assert!(gone.is_some(), "{:?}", row("msr_2"));
    let (ok, _, err) = collector.msrctl(&["msr", "forget", "msr_3"]);
    assert!(!ok && err.contains("not gone"), "{err}");
    let (ok, out, err) = collector.msrctl(&["msr", "forget", "msr_2"]);
    assert!(ok, "{out}{err}");
    assert!(
        collector
            .wait_log(
                0,
                &["operator change", "msr msr_2", "to=forgotten"],
                Duration::from_secs(5)
            )
            .await
    );
    assert!(row("msr_2").is_none(), "{:?}", row("msr_2"));
}
