//! Interop with a standard registrar: a real Kamailio (registrar + usrloc,
//! `tests/kamailio/registrar.cfg`) stores the agent's REGISTER unchanged,
//! the media engine's addresses included (SPEC §3: Contact URI parameters),
//! and `ul.dump` shows them; the agent's shutdown unregisters. And the
//! shipped `config-examples/kamailio/kamailio.cfg` end to end (SPEC §11):
//! SIPp callers → Kamailio → the collector's redirect server → three SIPp
//! UAS standing in for the media engines of three real agents → BYE →
//! `event_route[dialog:end]` → `POST /v1/release`.

use std::collections::BTreeMap;
use std::time::Duration;

use system_tests::kamailio::Kamailio;
use system_tests::system::{
    free_tcp_port, live_row, AccountSpec, Agent, AgentSpec, Collector, CollectorOpts,
};
use system_tests::{free_udp_port, run_sipp, sipp_scenario, sipp_total, wait_for, SippBackground};

use crate::front_ends::{sample, scrape};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kamailio_stores_the_engines_addresses_with_the_binding() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kamailio = Kamailio::start(dir.path(), "registrar.cfg").await;
    let spec = AgentSpec {
        accounts: vec![AccountSpec {
            msr: "msr_1".into(),
            realm: kamailio.realm(),
        }],
        register_expires: 60,
        engine_port: 5090,
        ..AgentSpec::default()
    };
    let mut agent = Agent::start(dir.path(), "msr_1", &spec, 10);
    let dump = wait_for(Duration::from_secs(10), || async {
        kamailio
            .rpc(&["ul.dump"])
            .filter(|d| d.contains("AoR: msr_1"))
    })
    .await
    .unwrap_or_else(|| panic!("no msr_1 in kamailio's ul.dump:\n{}", agent.log_text()));
    let address = dump
        .lines()
        .find_map(|l| l.trim().strip_prefix("Address: "))
        .unwrap_or_else(|| panic!("no Address in {dump}"));
    assert!(
        address.starts_with("sip:msr_1@127.0.0.1:")
            && address.ends_with(";engine=127.0.0.1:5090;engine-transport=udp;mcc=127.0.0.1:5091"),
        "{dump}"
    );
    assert!(dump.contains("User-Agent: msr-agent/"), "{dump}");

    assert!(agent.terminate().is_some_and(|s| s.success()));
    let gone = wait_for(Duration::from_secs(10), || async {
        kamailio
            .rpc(&["ul.dump"])
            .filter(|d| !d.contains("AoR: msr_1"))
    })
    .await;
    assert!(gone.is_some(), "the agent's shutdown unregisters");
}

/// The shipped Kamailio configuration (SPEC §11) is valid for the
/// installed Kamailio: `kamailio -c` loads every module it names
/// (http_client, dialog, uac_redirect…) and parses every route.
#[test]
fn the_shipped_kamailio_config_passes_kamailio_c() {
    let cfg = system_tests::example("kamailio/kamailio.cfg");
    let out = std::process::Command::new("kamailio")
        .arg("-c")
        .arg("-f")
        .arg(&cfg)
        .output()
        .unwrap_or_else(|e| panic!("cannot run kamailio (is it installed?): {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("config file ok"),
        "kamailio -c -f {}:\n{text}",
        cfg.display()
    );
}

/// Runs `calls` calls of `tests/sipp/caller_uac.xml` (INVITE, 200, ACK,
/// `hold_ms`, then BYE along the Record-Route) at 50/s through Kamailio on
/// `kamailio_port`; every call must succeed.
async fn calls_through(kamailio_port: u16, calls: u32, hold_ms: u32) {
    let args: Vec<String> = [
        "-sf",
        &sipp_scenario("caller_uac.xml").display().to_string(),
        "-i",
        "127.0.0.1",
        "-p",
        &free_udp_port().to_string(),
        "-m",
        &calls.to_string(),
        "-r",
        "50",
        "-d",
        &hold_ms.to_string(),
        "-timeout",
        "60s",
        &format!("127.0.0.1:{kamailio_port}"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (code, out) = run_sipp(&args, Duration::from_secs(90))
        .await
        .expect("sipp uac");
    assert_eq!(code, 0, "sipp uac through kamailio: {out}");
    assert_eq!(
        sipp_total(&out, "Successful call"),
        Some(u64::from(calls)),
        "{out}"
    );
}

/// Polls `/metrics` until every MSR has zero live legs and `released`
/// legs were released in all; returns the scrape.
async fn all_released(http_port: u16, released: u32) -> Option<prometheus_parse::Scrape> {
    wait_for(Duration::from_secs(15), || async move {
        let m = scrape(http_port).await;
        let zero = ["msr_1", "msr_2", "msr_3"]
            .iter()
            .all(|msr| sample(&m, "msr_collector_msr_live_legs", &[("msr", msr)]) == Some(0.0));
        let done =
            sample(&m, "msr_collector_released_legs_total", &[]) == Some(f64::from(released));
        (zero && done).then_some(m)
    })
    .await
}

fn new_legs(m: &prometheus_parse::Scrape, msr: &str) -> u32 {
    sample(
        m,
        "msr_collector_msr_selections_total",
        &[("msr", msr), ("leg", "new")],
    )
    .map_or(0, |v| v as u32)
}

/// The shipped Kamailio config with real traffic (SPEC §11): 261 calls —
/// 200 at 50/s with three MSRs at loads 10 / 40 / 70 % (weights 90 : 60 :
/// 30), then 60 with `msr_3` set inactive, then one held 2 s. Each call is
/// redirected by the collector (302 to the chosen MSR's engine), answered
/// by that engine's SIPp UAS (its count equals the collector's selections
/// of the MSR), the shares follow the weights, the inactive MSR gets none,
/// the held call is a live leg while its dialog is up, and after the BYEs
/// Kamailio's `dialog:end` has released every leg: zero live legs, and
/// `/metrics` counts 261 redirects, selections and releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kamailio_parks_calls_on_the_chosen_engines_and_releases_them_at_bye() {
    let dir = tempfile::tempdir().expect("tempdir");
    let http_port = free_tcp_port();
    let redirect_port = free_udp_port();
    // The §7 draw, whose shares follow the weights: the `pooled` default
    // (SPEC §10) ranks by estimated occupancy instead, and with these fixed
    // `file:` loads and short calls it keeps choosing the emptiest MSR.
    let extra = format!(
        "[http]\nlisten = \"127.0.0.1:{http_port}\"\n[redirect]\nlisten = \"127.0.0.1:{redirect_port}\"\n\
         [selection]\npolicy = \"ecss\"\n"
    );
    let collector =
        Collector::start_with(dir.path(), "core1", &CollectorOpts::default(), &extra).await;
    let loads = [("msr_1", 10u32), ("msr_2", 40), ("msr_3", 70)];
    let mut engines: BTreeMap<&str, SippBackground> = BTreeMap::new();
    let mut agents = Vec::new();
    for (msr, calls) in loads {
        // The MSR's media engine: a SIPp UAS on the agent's transport port.
        let engine_port = free_udp_port();
        let args: Vec<String> = [
            "-sf",
            &sipp_scenario("engine_uas.xml").display().to_string(),
            "-i",
            "127.0.0.1",
            "-p",
            &engine_port.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let uas = SippBackground::start(&args, &dir.path().join(format!("{msr}-engine.log")))
            .expect("start sipp uas");
        engines.insert(msr, uas);
        let spec = AgentSpec {
            accounts: vec![AccountSpec::new(msr, &collector)],
            engine_port,
            ..AgentSpec::default()
        };
        agents.push(Agent::start(dir.path(), msr, &spec, calls));
    }
    collector
        .wait_rows(Duration::from_secs(15), |rows| {
            loads
                .iter()
                .all(|(msr, load)| live_row(rows, msr, u8::try_from(*load).ok()).is_some())
                .then_some(())
        })
        .await
        .expect("three MSRs live with their loads");
    let kamailio = Kamailio::start_file(
        dir.path(),
        &system_tests::example("kamailio/kamailio.cfg"),
        &[
            ("REDIRECT", format!("sip:127.0.0.1:{redirect_port}")),
            ("HTTP_API", format!("http://127.0.0.1:{http_port}")),
        ],
    )
    .await;

    const FIRST: u32 = 200;
    calls_through(kamailio.port, FIRST, 0).await;
    let m = all_released(http_port, FIRST)
        .await
        .unwrap_or_else(|| panic!("legs not released after the BYEs:\n{}", kamailio.log_text()));
    let first: BTreeMap<&str, u32> = loads
        .iter()
        .map(|(msr, _)| (*msr, new_legs(&m, msr)))
        .collect();
    assert_eq!(first.values().sum::<u32>(), FIRST, "{first:?}");
    for (msr, weight) in [("msr_1", 90.0), ("msr_2", 60.0), ("msr_3", 30.0)] {
        let share = f64::from(first[msr]) / f64::from(FIRST);
        assert!(
            (share - weight / 180.0).abs() < 0.12,
            "{msr} share {share} (weights 90 : 60 : 30): {first:?}"
        );
    }

    let (ok, out, err) = collector.msrctl(&["msr", "set", "msr_3", "active", "false"]);
    assert!(ok, "{out}{err}");
    const SECOND: u32 = 60;
    calls_through(kamailio.port, SECOND, 0).await;
    let m = all_released(http_port, FIRST + SECOND)
        .await
        .unwrap_or_else(|| panic!("legs not released after the BYEs:\n{}", kamailio.log_text()));
    assert_eq!(
        new_legs(&m, "msr_3"),
        first["msr_3"],
        "an inactive msr gets no call"
    );

    // The leg lives as long as the call, not as long as the redirect: one
    // call held 2 s is a live leg while Kamailio's dialog is confirmed
    // (state 4), and is released at its BYE.
    let port = kamailio.port;
    let held = tokio::spawn(async move { calls_through(port, 1, 2000).await });
    let during = wait_for(Duration::from_secs(10), || async {
        kamailio
            .rpc(&["dlg.list"])
            .filter(|d| d.contains("state: 4"))?;
        let m = scrape(http_port).await;
        Some(
            ["msr_1", "msr_2", "msr_3"]
                .iter()
                .filter_map(|msr| sample(&m, "msr_collector_msr_live_legs", &[("msr", msr)]))
                .sum::<f64>(),
        )
    })
    .await;
    assert_eq!(during, Some(1.0), "one live leg while the call is up");
    held.await.expect("held call");
    const HELD: u32 = 1;
    let m = all_released(http_port, FIRST + SECOND + HELD)
        .await
        .unwrap_or_else(|| panic!("held leg not released at its BYE:\n{}", kamailio.log_text()));

    // Each engine answered exactly the calls the collector gave its MSR.
    for (msr, uas) in &mut engines {
        let screen = uas.finish(Duration::from_secs(10));
        assert_eq!(
            sipp_total(&screen, "Successful call"),
            Some(u64::from(new_legs(&m, msr))),
            "{msr}'s engine: {screen}"
        );
    }
    let total = f64::from(FIRST + SECOND + HELD);
    assert_eq!(
        sample(
            &m,
            "msr_collector_redirect_responses_total",
            &[("status", "302")]
        ),
        Some(total)
    );
    assert_eq!(
        sample(
            &m,
            "msr_collector_selections_total",
            &[("outcome", "selected")]
        ),
        Some(total)
    );
    assert_eq!(
        sample(&m, "msr_collector_released_legs_total", &[]),
        Some(total)
    );
    drop(kamailio);
    drop(agents);
}
