//! rtpengine as the media engine (SPEC §2, §3, §11), end to end with real
//! processes: three rtpengine daemons on loopback, each with its agent
//! (`calls-source="rtpengine"`, `<pbyte><mcc>` = its ng address), a
//! collector, Kamailio running the shipped config's path C
//! (`-A WITH_RTPENGINE`), SIPp callers and a SIPp callee that send RTP
//! (`tests/sipp/rtp_caller_uac.xml`, `rtp_callee_uas.xml`) through the
//! rtpengine the collector chose.
//!
//! What is checked is what an operator would look at: rtpengine's own
//! `statistics`, `list` and per-call `query`, `msrctl resource list`
//! (the agents' reported calls, the live legs, the media-control
//! address), the collector's sticky answer for each live Call-ID and its
//! `/metrics`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use msr_shared::admin::ResourceInfo;
use system_tests::kamailio::Kamailio;
use system_tests::rtpengine::Rtpengine;
use system_tests::system::{Agent, Collector};
use system_tests::{
    free_udp_port, run_sipp_in, sipp_scenario, sipp_total, wait_for, SippBackground,
};

use crate::failover::health_of;
use crate::front_ends::{http, sample, scrape};
use crate::kamailio::{check_refusals, core_failures, placed, received_finals, Refusal};

/// The MSRs and their `max-calls`.
const MSRS: [(&str, u32); 3] = [("rtpe_1", 20), ("rtpe_2", 40), ("rtpe_3", 60)];

/// The RTP ports of one test: its rtpengines' ranges, the first port of
/// its callee and of each of its caller runs (SIPp gives call N the port
/// `-mp` + 4 (N − 1), `[auto_media_port]`). Every RTP port of these tests
/// is in 28000–32767 or 61000–64999: outside the kernel's ephemeral ports
/// (32768–60999, Linux's default `ip_local_port_range`, where other tests'
/// sockets come from), above the ranges other tests bind (the agent
/// tests' 24000–27999, the quickstart's 20000–22999), and each test's
/// apart from the others', since they run at once. A call takes four
/// ports of its rtpengine.
struct Ports {
    engines: [(u16, u16); 3],
    callee: u16,
    callers: [u16; 3],
}

/// 220 calls, at most about 30 at once on one rtpengine.
const RELAY_PORTS: Ports = Ports {
    engines: [(28000, 28399), (28400, 28799), (28800, 29199)],
    callee: 29200,
    callers: [30100, 30300, 30450],
};

/// 20 calls with RTP.
const OUTAGE_PORTS: Ports = Ports {
    engines: [(31100, 31299), (31300, 31499), (31500, 31699)],
    callee: 31700,
    callers: [31900, 32000, 32100],
};

/// 54 calls, about 15 at once on one rtpengine.
const FAILOVER_PORTS: Ports = Ports {
    engines: [(61000, 61399), (61400, 61799), (61800, 62199)],
    callee: 62200,
    callers: [62500, 62600, 62900],
};

/// 63 calls, about 15 at once on one rtpengine.
const DRAIN_PORTS: Ports = Ports {
    engines: [(63000, 63399), (63400, 63799), (63800, 64199)],
    callee: 64200,
    callers: [64500, 64700, 65000],
};

/// The agent config of an rtpengine host: its ng address as `<transport>`
/// and `<pbyte><mcc>`, the `rtpengine` calls source, `load-sensor="calls"`
/// (the shares below are of sessions, not of the CPU the relays use), and
/// the `engine-probe…` attributes `probe`. With `off` a silent rtpengine is reported
/// full, which the first tests rely on; with `ng` (SPEC §14) it keeps its
/// last count and is reported `engine: down`, as the failover and drain
/// tests want: what a deployment runs (`auto` picks `ng` with rtpengine).
fn agent_xml(msr: &str, max_calls: u32, rtpengine: &Rtpengine, realm: &str, probe: &str) -> String {
    let (ip, port) = (rtpengine.ng.ip(), rtpengine.ng.port());
    let (min, max) = rtpengine.ports;
    format!(
        r#"<?xml version="1.0" encoding="utf-8"?>
<config date="00:00:00 01.01.2026">
    <general max-calls="{max_calls}" load-sensor="calls" load-delta="5" />
    <transport bind-addr="{ip}" port="{port}" transport="udp" />
    <media port-start="{min}" port-range="{range}" />
    <accounts>
        <dynamic msr_name="{msr}" realm="{realm}" auth_name="msr" auth_password="msr-secret" />
    </accounts>
    <pbyte>
        <mcc bind-addr="{ip}" port="{port}" />
    </pbyte>
    <agent calls-source="rtpengine" {probe} sip-port="0" register-expires="60" sample-interval-ms="200" />
</config>
"#,
        range = u32::from(max) - u32::from(min) + 1,
    )
}

/// The rtpengine table of the Kamailio config (`RTPENGINE_DB`, db_text):
/// one set per rtpengine.
fn rtpengine_db(dir: &std::path::Path, engines: &[&Rtpengine]) -> String {
    let db = dir.join("rtpengine-db");
    std::fs::create_dir_all(&db).expect("db dir");
    std::fs::write(
        db.join("version"),
        "table_name(string) table_version(int)\nrtpengine:1\n",
    )
    .expect("version table");
    let mut rows =
        String::from("id(int,auto) setid(int) url(string) weight(int) disabled(int) stamp(int)\n");
    for (i, e) in engines.iter().enumerate() {
        let url = format!("udp:{}", e.ng).replace(':', "\\:");
        rows.push_str(&format!("{id}:{id}:{url}:1:0:0\n", id = i + 1));
    }
    std::fs::write(db.join("rtpengine"), rows).expect("rtpengine table");
    format!("text://{}", db.display())
}

/// The system: Kamailio first in the drop order, the directory last.
struct Relays {
    kamailio: Kamailio,
    callee: SippBackground,
    agents: BTreeMap<&'static str, Agent>,
    engines: BTreeMap<&'static str, Rtpengine>,
    collector: Collector,
    http_port: u16,
    callee_port: u16,
    dir: tempfile::TempDir,
}

impl Relays {
    /// The system with each agent's engine probe off.
    async fn start(ports: &Ports) -> Relays {
        Self::start_with(ports, r#"engine-probe="off""#).await
    }

    /// The system, each agent with the `engine-probe…` attributes `probe`.
    async fn start_with(ports: &Ports, probe: &str) -> Relays {
        let dir = tempfile::tempdir().expect("tempdir");
        // One second of PCMA silence, which both SIPps loop as their RTP.
        std::fs::write(dir.path().join("audio.pcma"), [0xd5_u8; 8000]).expect("audio");
        let (collector, http_port) = Collector::start_with_http(dir.path(), "core1").await;
        let mut engines = BTreeMap::new();
        let mut agents = BTreeMap::new();
        for ((msr, max_calls), range) in MSRS.into_iter().zip(ports.engines) {
            let engine = Rtpengine::start(dir.path(), &format!("{msr}-rtpengine"), range).await;
            let xml = agent_xml(msr, max_calls, &engine, &collector.realm(), probe);
            agents.insert(msr, Agent::start_xml(dir.path(), msr, &xml));
            engines.insert(msr, engine);
        }
        // Registered, subscribed, reporting rtpengine's count (0), with
        // the ng address as the media-control address (SPEC §3).
        collector
            .wait_rows(Duration::from_secs(15), |rows| {
                engines
                    .iter()
                    .all(|(msr, e)| {
                        row(rows, msr).is_some_and(|r| {
                            r.calls == Some(0)
                                && r.load == Some(0)
                                && r.mcc.as_deref() == Some(e.ng.to_string().as_str())
                        })
                    })
                    .then_some(())
            })
            .await
            .expect("three rtpengine MSRs live, reporting 0 calls, mcc = the ng address");
        let callee_port = free_udp_port();
        let callee = SippBackground::start_in(
            dir.path(),
            &strings(&[
                "-sf",
                &sipp_scenario("rtp_callee_uas.xml").display().to_string(),
                "-i",
                "127.0.0.1",
                "-p",
                &callee_port.to_string(),
                "-mp",
                &ports.callee.to_string(),
            ]),
            &dir.path().join("callee.log"),
        )
        .expect("start the sipp callee");
        let refs: Vec<&Rtpengine> = engines.values().collect();
        let db = rtpengine_db(dir.path(), &refs);
        let kamailio = Kamailio::start_file(
            dir.path(),
            &system_tests::example("kamailio/kamailio.cfg"),
            &[
                ("HTTP_API", format!("http://127.0.0.1:{http_port}")),
                ("RTPENGINE_DB", db),
            ],
            &["WITH_RTPENGINE"],
        )
        .await;
        Relays {
            kamailio,
            callee,
            agents,
            engines,
            collector,
            http_port,
            callee_port,
            dir,
        }
    }

    /// Runs `calls` calls of `rtp_caller_uac.xml` to the callee through
    /// Kamailio, `rate` per second, each holding `hold_ms` with RTP both
    /// ways, its RTP ports from `media_port` on; every call must succeed.
    fn calls(
        &self,
        calls: u32,
        rate: u32,
        hold_ms: u32,
        media_port: u16,
    ) -> impl std::future::Future<Output = ()> + 'static {
        self.calls_to(
            "rtp_caller_uac.xml",
            self.callee_port,
            calls,
            rate,
            hold_ms,
            media_port,
        )
    }

    /// [`calls`](Self::calls) of `scenario` to the callee on
    /// `callee_port`.
    fn calls_to(
        &self,
        scenario: &str,
        callee_port: u16,
        calls: u32,
        rate: u32,
        hold_ms: u32,
        media_port: u16,
    ) -> impl std::future::Future<Output = ()> + 'static {
        let args = strings(&[
            "-sf",
            &sipp_scenario(scenario).display().to_string(),
            "-i",
            "127.0.0.1",
            "-p",
            &free_udp_port().to_string(),
            "-mp",
            &media_port.to_string(),
            "-m",
            &calls.to_string(),
            "-r",
            &rate.to_string(),
            "-d",
            &hold_ms.to_string(),
            "-timeout",
            "80s",
            "-rsa",
            &format!("127.0.0.1:{}", self.kamailio.port),
            &format!("127.0.0.1:{callee_port}"),
        ]);
        let dir = self.dir.path().to_owned();
        async move {
            let (code, out) = run_sipp_in(&dir, &args, Duration::from_secs(90))
                .await
                .expect("sipp caller");
            assert_eq!(code, 0, "sipp caller through kamailio: {out}");
            assert_eq!(
                sipp_total(&out, "Successful call"),
                Some(u64::from(calls)),
                "{out}"
            );
        }
    }

    /// Runs `calls` calls of `caller_refused_uac.xml` through Kamailio:
    /// each must be refused with a `Reason`; returns the final responses
    /// from SIPp's message trace.
    async fn refused(&self, calls: u32, name: &str) -> Vec<Refusal> {
        let trace = self.dir.path().join(format!("{name}-messages.log"));
        let args = strings(&[
            "-sf",
            &sipp_scenario("caller_refused_uac.xml")
                .display()
                .to_string(),
            "-i",
            "127.0.0.1",
            "-p",
            &free_udp_port().to_string(),
            "-m",
            &calls.to_string(),
            "-r",
            "50",
            "-timeout",
            "30s",
            "-trace_msg",
            "-message_file",
            &trace.display().to_string(),
            "-rsa",
            &format!("127.0.0.1:{}", self.kamailio.port),
            &format!("127.0.0.1:{}", self.callee_port),
        ]);
        let (code, out) = run_sipp_in(self.dir.path(), &args, Duration::from_secs(60))
            .await
            .expect("sipp caller");
        assert_eq!(code, 0, "sipp refused caller: {out}");
        let text = std::fs::read_to_string(&trace)
            .unwrap_or_else(|e| panic!("sipp message trace {}: {e}", trace.display()));
        received_finals(&text)
    }

    /// Waits until `msr`'s row shows `load` and `calls`.
    async fn wait_report(&self, msr: &str, load: u8, calls: u32) {
        let seen = self
            .collector
            .wait_rows(Duration::from_secs(15), |rows| {
                row(rows, msr)
                    .filter(|r| r.load == Some(load) && r.calls == Some(calls))
                    .map(|_| ())
            })
            .await;
        assert!(
            seen.is_some(),
            "{msr} never reported load {load} calls {calls}: {:?}\n{}",
            self.collector
                .rows()
                .await
                .and_then(|rows| row(&rows, msr).cloned()),
            self.agents[msr].log_text()
        );
    }

    /// Each rtpengine's Call-IDs, from its own `list`.
    fn calls_by_engine(&self) -> BTreeMap<&'static str, BTreeSet<String>> {
        self.engines
            .iter()
            .map(|(msr, e)| {
                let ids = e.call_ids().unwrap_or_else(|err| panic!("{msr}: {err}"));
                (*msr, ids.into_iter().collect())
            })
            .collect()
    }

    /// Each rtpengine's `(sessionsown, managedsessions)`.
    fn sessions(&self) -> BTreeMap<&'static str, (u64, u64)> {
        self.engines
            .iter()
            .map(|(msr, e)| {
                (
                    *msr,
                    e.sessions().unwrap_or_else(|err| panic!("{msr}: {err}")),
                )
            })
            .collect()
    }

    /// Waits until every agent reports its rtpengine's `sessionsown` as
    /// `calls` (`msrctl resource list`), and every MSR's live legs are
    /// those sessions; returns the sessions.
    async fn reports_follow_sessions(&self, what: &str) -> BTreeMap<&'static str, u64> {
        let agreed = wait_for(Duration::from_secs(15), || async {
            let rows = self.collector.rows().await?;
            let sessions = self.sessions();
            sessions
                .iter()
                .all(|(msr, (own, _))| {
                    row(&rows, msr).is_some_and(|r| {
                        r.calls.map(u64::from) == Some(*own) && u64::from(r.live_legs) == *own
                    })
                })
                .then(|| sessions.iter().map(|(m, (own, _))| (*m, *own)).collect())
        })
        .await;
        agreed.unwrap_or_else(|| {
            panic!(
                "{what}: reported calls and live legs never matched rtpengine's sessions {:?}:\n{}",
                self.sessions(),
                self.kamailio.log_text()
            )
        })
    }

    /// The collector's answer for the live leg `call_id`: sticky, its MSR
    /// and media-control address.
    async fn sticky_choice(&self, call_id: &str) -> (String, String) {
        let path = format!(
            "/v1/select?zone=default&site=local&call_id={}",
            urlencode(call_id)
        );
        let (status, body) = http(self.http_port, "GET", &path, "", "").await;
        assert_eq!(status, 200, "{call_id}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert_eq!(v["leg"], "sticky", "{call_id} is a live leg: {body}");
        (
            v["msr"].as_str().unwrap_or_default().to_owned(),
            v["mcc"].as_str().unwrap_or_default().to_owned(),
        )
    }
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn row<'a>(rows: &'a [ResourceInfo], msr: &str) -> Option<&'a ResourceInfo> {
    rows.iter().find(|r| r.msr == msr)
}

fn new_legs(m: &prometheus_parse::Scrape, msr: &str) -> u64 {
    sample(
        m,
        "msr_collector_msr_selections_total",
        &[("msr", msr), ("leg", "new")],
    )
    .map_or(0, |v| v as u64)
}

/// 220 calls through Kamailio's path C and three real rtpengines, media
/// both ways (SPEC §11):
///
/// 1. 40 short calls (500 ms), so that the core has released legs and
///    the `pooled` policy (SPEC §10) applies;
/// 2. 30 calls held 25 s: once they are up, each rtpengine relays its
///    share of them by capacity (max-calls 20 / 40 / 60: 5 / 10 / 15,
///    within 2), each live Call-ID is on exactly one rtpengine, the one
///    whose ng address the collector answers for it (sticky), its RTP
///    flows both ways through that rtpengine (`query`), and each agent
///    reports its rtpengine's own session count;
/// 3. `rtpe_3` drained (`msr set rtpe_3 active false`), 150 short calls:
///    none on `rtpe_3`, whose held calls stay live and keep relaying;
/// 4. after the BYEs: no session on any rtpengine, no live leg, the
///    agents report 0 calls, every leg released, and each rtpengine
///    relayed exactly the calls the collector gave its MSR.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rtpengines_relay_each_call_on_the_collectors_choice_and_drain() {
    let r = Relays::start(&RELAY_PORTS).await;
    let [warm_media, held_media, more_media] = RELAY_PORTS.callers;

    // 1. Warm-up: legs placed and released.
    const WARM: u64 = 40;
    r.calls(WARM as u32, 40, 500, warm_media).await;
    r.reports_follow_sessions("after the warm-up").await;

    // 2. Held calls.
    const HELD: u64 = 30;
    let held = tokio::spawn(r.calls(HELD as u32, 30, 25_000, held_media));
    let up = wait_for(Duration::from_secs(20), || async {
        let total: u64 = r.sessions().values().map(|(own, _)| own).sum();
        (total == HELD).then_some(())
    })
    .await;
    assert!(up.is_some(), "30 held calls up: {:?}", r.sessions());
    let shares = r.reports_follow_sessions("held calls").await;
    // pooled: the lowest occupancy relative to max-calls, so at 30 of 120
    // each is a quarter full.
    for (msr, max_calls) in MSRS {
        let expected = HELD * u64::from(max_calls) / 120;
        let got = shares[msr];
        assert!(
            got.abs_diff(expected) <= 2,
            "{msr} relays {got} of the held calls, expected {expected} ± 2 (max-calls 20/40/60): {shares:?}"
        );
    }
    let held_calls = r.calls_by_engine();
    let all: BTreeSet<&String> = held_calls.values().flatten().collect();
    assert_eq!(
        all.len() as u64,
        HELD,
        "each call on one rtpengine: {held_calls:?}"
    );
    for (msr, ids) in &held_calls {
        let ng = r.engines[msr].ng.to_string();
        for id in ids {
            assert_eq!(
                r.sticky_choice(id).await,
                ((*msr).to_owned(), ng.clone()),
                "{id} relayed by {msr}'s rtpengine"
            );
        }
    }
    // RTP both ways through the chosen rtpengine: each party of each call
    // has sent it packets.
    let flowing = wait_for(Duration::from_secs(10), || async {
        held_calls
            .iter()
            .all(|(msr, ids)| {
                ids.iter().all(|id| {
                    let parties = r.engines[msr].rtp_packets(id).unwrap_or_default();
                    parties.len() == 2 && parties.iter().all(|(_, packets)| *packets > 0)
                })
            })
            .then_some(())
    })
    .await;
    assert!(flowing.is_some(), "rtp both ways of every held call");
    let drained_before: Vec<(String, i64)> = held_calls["rtpe_3"]
        .iter()
        .flat_map(|id| r.engines["rtpe_3"].rtp_packets(id).unwrap_or_default())
        .collect();

    // 3. Drain rtpe_3 and place more calls.
    let (ok, out, err) = r
        .collector
        .msrctl(&["msr", "set", "rtpe_3", "active", "false"]);
    assert!(ok, "{out}{err}");
    let before = scrape(r.http_port).await;
    const MORE: u64 = 150;
    r.calls(MORE as u32, 40, 300, more_media).await;
    let after = scrape(r.http_port).await;
    assert_eq!(
        new_legs(&after, "rtpe_3"),
        new_legs(&before, "rtpe_3"),
        "a drained msr gets no new call"
    );
    assert_eq!(
        ["rtpe_1", "rtpe_2"]
            .iter()
            .map(|m| new_legs(&after, m) - new_legs(&before, m))
            .sum::<u64>(),
        MORE
    );
    let now = r.calls_by_engine();
    assert_eq!(
        now["rtpe_3"], held_calls["rtpe_3"],
        "the drained rtpengine keeps its live calls and takes no new one"
    );
    let rows = r.collector.rows().await.expect("resource list");
    assert_eq!(
        row(&rows, "rtpe_3").map(|r| u64::from(r.live_legs)),
        Some(held_calls["rtpe_3"].len() as u64),
        "its live legs stay"
    );
    let drained_after: Vec<(String, i64)> = held_calls["rtpe_3"]
        .iter()
        .flat_map(|id| r.engines["rtpe_3"].rtp_packets(id).unwrap_or_default())
        .collect();
    assert_eq!(drained_after.len(), drained_before.len());
    for ((tag, old), (_, new)) in drained_before.iter().zip(&drained_after) {
        assert!(
            new > old,
            "{tag}: its media still flows ({old} → {new} packets)"
        );
    }

    // 4. The held calls end with their BYEs.
    held.await.expect("held calls");
    let ended = wait_for(Duration::from_secs(15), || async {
        let sessions = r.sessions();
        let lists = r.calls_by_engine();
        (sessions.values().all(|(own, _)| *own == 0) && lists.values().all(BTreeSet::is_empty))
            .then_some(sessions)
    })
    .await
    .unwrap_or_else(|| panic!("sessions left after the BYEs: {:?}", r.calls_by_engine()));
    let zero = r.reports_follow_sessions("after the BYEs").await;
    assert!(zero.values().all(|n| *n == 0), "{zero:?}");
    let total = WARM + HELD + MORE;
    let m = wait_for(Duration::from_secs(10), || async {
        let m = scrape(r.http_port).await;
        (sample(&m, "msr_collector_released_legs_total", &[]) == Some(total as f64)).then_some(m)
    })
    .await
    .unwrap_or_else(|| panic!("not every leg released:\n{}", r.kamailio.log_text()));
    // Each rtpengine relayed exactly the calls the collector gave its MSR.
    for (msr, (_, managed)) in &ended {
        assert_eq!(
            *managed,
            new_legs(&m, msr),
            "{msr}: calls relayed vs chosen"
        );
    }
    assert_eq!(
        ended.values().map(|(_, managed)| managed).sum::<u64>(),
        total
    );
    let mut callee = r.callee;
    let screen = callee.finish(Duration::from_secs(10));
    assert_eq!(
        sipp_total(&screen, "Successful call"),
        Some(total),
        "{screen}"
    );
}

/// An rtpengine that stops answering, and refusals (SPEC §2, §11): with
/// every MSR inactive, 10 callers get Kamailio's `503` with
/// `Reason: SIP ;cause=503;text="http_503"` (the collector refused them
/// `msr_not_found`) and no rtpengine sees a call. One rtpengine stopped:
/// its agent says so in its log and reports it full (load 100, calls =
/// max-calls, not its last count), and 20 calls go to the two others;
/// started again on the same port, it is reported empty again after the
/// backoff. 10 calls with a late offer (no SDP in the INVITE) are relayed,
/// RTP both ways, by the rtpengine the collector chose. All three stopped: every agent reports full, and 10 callers
/// get `503` (the collector refused them `msr_overloaded`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_rtpengine_is_reported_full_and_refusals_reach_the_caller() {
    let mut r = Relays::start(&OUTAGE_PORTS).await;
    const REFUSED: u32 = 10;
    for (msr, _) in MSRS {
        let (ok, out, err) = r.collector.msrctl(&["msr", "set", msr, "active", "false"]);
        assert!(ok, "{out}{err}");
    }
    let finals = r.refused(REFUSED, "inactive").await;
    check_refusals(&finals, REFUSED, 503, "http_503");
    let m = scrape(r.http_port).await;
    assert_eq!(
        sample(
            &m,
            "msr_collector_selections_total",
            &[("outcome", "msr_not_found")]
        ),
        Some(f64::from(REFUSED))
    );
    assert!(
        r.sessions().values().all(|s| *s == (0, 0)),
        "no rtpengine saw a refused call: {:?}",
        r.sessions()
    );
    for (msr, _) in MSRS {
        let (ok, out, err) = r.collector.msrctl(&["msr", "set", msr, "active", "true"]);
        assert!(ok, "{out}{err}");
    }

    // rtpe_1 stops: reported full, its last count (0) is not reported.
    r.engines.get_mut("rtpe_1").expect("rtpe_1").stop();
    r.wait_report("rtpe_1", 100, 20).await;
    assert!(
        r.agents["rtpe_1"]
            .log_text()
            .contains("rtpengine does not answer its ng port"),
        "{}",
        r.agents["rtpe_1"].log_text()
    );
    const CALLS: u64 = 20;
    r.calls(CALLS as u32, 40, 300, OUTAGE_PORTS.callers[0])
        .await;
    let m = scrape(r.http_port).await;
    assert_eq!(new_legs(&m, "rtpe_1"), 0, "no call for a silent rtpengine");
    assert_eq!(new_legs(&m, "rtpe_2") + new_legs(&m, "rtpe_3"), CALLS);

    // Back on the same ng port: reported as it is once the backoff lets
    // the agent ask again.
    r.engines.get_mut("rtpe_1").expect("rtpe_1").spawn().await;
    r.wait_report("rtpe_1", 0, 0).await;
    assert!(r.agents["rtpe_1"]
        .log_text()
        .contains("rtpengine answers again"));

    // A late offer (an INVITE without SDP, RFC 3264 §4): the offer in the
    // callee's 200 and the answer in the ACK go to the chosen rtpengine,
    // and the media flows both ways through it.
    let late_port = free_udp_port();
    let mut late_callee = SippBackground::start_in(
        r.dir.path(),
        &strings(&[
            "-sf",
            &sipp_scenario("rtp_late_callee_uas.xml")
                .display()
                .to_string(),
            "-i",
            "127.0.0.1",
            "-p",
            &late_port.to_string(),
            "-mp",
            &OUTAGE_PORTS.callers[2].to_string(),
        ]),
        &r.dir.path().join("late-callee.log"),
    )
    .expect("start the late-offer callee");
    const LATE: usize = 10;
    let late = tokio::spawn(r.calls_to(
        "rtp_late_caller_uac.xml",
        late_port,
        LATE as u32,
        20,
        4000,
        OUTAGE_PORTS.callers[1],
    ));
    let flowing = wait_for(Duration::from_secs(20), || async {
        let calls = r.calls_by_engine();
        let all: Vec<(&str, &String)> = calls
            .iter()
            .flat_map(|(msr, ids)| ids.iter().map(move |id| (*msr, id)))
            .collect();
        let both_ways = all.iter().all(|(msr, id)| {
            let parties = r.engines[msr].rtp_packets(id).unwrap_or_default();
            parties.len() == 2 && parties.iter().all(|(_, packets)| *packets > 0)
        });
        (all.len() == LATE && both_ways).then_some(calls)
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "late-offer calls with rtp both ways: {:?}",
            r.calls_by_engine()
        )
    });
    for (msr, ids) in &flowing {
        for id in ids {
            assert_eq!(
                r.sticky_choice(id).await,
                ((*msr).to_owned(), r.engines[msr].ng.to_string()),
                "{id} relayed by {msr}'s rtpengine"
            );
        }
    }
    late.await.expect("late-offer calls");
    let screen = late_callee.finish(Duration::from_secs(10));
    assert_eq!(
        sipp_total(&screen, "Successful call"),
        Some(LATE as u64),
        "{screen}"
    );

    // Every rtpengine silent: every MSR full, the calls refused.
    for engine in r.engines.values_mut() {
        engine.stop();
    }
    for (msr, max_calls) in MSRS {
        r.wait_report(msr, 100, max_calls).await;
    }
    let finals = r.refused(REFUSED, "silent").await;
    check_refusals(&finals, REFUSED, 503, "http_503");
    let m = scrape(r.http_port).await;
    assert_eq!(
        sample(
            &m,
            "msr_collector_selections_total",
            &[("outcome", "msr_overloaded")]
        ),
        Some(f64::from(REFUSED))
    );
}

/// Legs the collector moved to `msr` in `m` after another MSR failed them
/// (SPEC §14).
fn reanchored(m: &prometheus_parse::Scrape, msr: &str) -> u64 {
    sample(
        m,
        "msr_collector_msr_selections_total",
        &[("msr", msr), ("leg", "reanchored")],
    )
    .map_or(0, |v| v as u64)
}

/// Waits until `msr`'s health in `msrctl resource list --json` is
/// `health`.
async fn wait_health(r: &Relays, msr: &str, health: &str) {
    let seen = wait_for(Duration::from_secs(10), || async {
        (health_of(&r.collector, msr).as_deref() == Some(health)).then_some(())
    })
    .await;
    assert!(
        seen.is_some(),
        "{msr} never {health}: {}\n{}",
        r.collector.msrctl_json(&["resource", "list"]),
        r.agents[msr].log_text()
    );
}

/// Waits until no leg is live (`msrctl leg list`).
async fn wait_no_leg(r: &Relays) {
    let none = wait_for(Duration::from_secs(20), || async {
        (r.collector.msrctl_json(&["leg", "list"])["total"] == 0).then_some(())
    })
    .await;
    assert!(
        none.is_some(),
        "legs left live: {}\n{}",
        r.collector.msrctl_json(&["leg", "list"]),
        r.kamailio.log_text()
    );
}

/// Path C fails over (SPEC §14) with real rtpengines, each agent's ng
/// probe on: 12 calls held 15 s over the three relays (2 / 4 / 6 by
/// capacity), then `rtpe_3` hangs (SIGSTOP: its ng port takes every
/// offer and answers none) and 45 calls at 15/s follow, each held 1 s.
/// The hung relay, as roomy as the others then and gaining no leg, is the
/// `pooled` policy's next choice until the collector takes it out.
///
/// * Every call placed after the hang completes: each offer the hung
///   relay got (Kamailio's `rtpengine_offer` timed out, or the module had
///   set the relay aside after a timeout) was reported `failure=error`
///   and went on to the relay the collector answered next
///   (`leg: reanchored`).
/// * `rtpe_3` ends `engine_down` in `msrctl resource list --json`: its
///   agent's probe stopped getting answers, and 3 errors within 10 s
///   take an MSR out too; the offers it got are the few placed before
///   either reached the collector. The agents count 3 misses
///   (`engine-probe-misses`), so that their probe, about 5 s after the
///   hang, is not done before SIPp's first call on a busy host: with 2 it
///   is done in under 3 s, which a slow SIPp start has missed.
/// * The held calls, those on the hung relay too (their BYE's
///   `rtpengine_delete` fails and the BYE goes on), end with their BYEs:
///   no leg is left live, the relays still running hold no session, and
///   each relayed exactly the legs the collector placed on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offer_a_hung_rtpengine_does_not_take_fails_over_to_another() {
    let r = Relays::start_with(
        &FAILOVER_PORTS,
        r#"engine-probe="ng" engine-probe-misses="3""#,
    )
    .await;
    let [held_media, after_media, _] = FAILOVER_PORTS.callers;
    // Every relay selectable before the first call: on a busy host an
    // agent's first probe can come late, and a relay not yet healthy
    // would get none of the held calls.
    for (msr, _) in MSRS {
        wait_health(&r, msr, "healthy").await;
    }

    const HELD: u64 = 12;
    let held = tokio::spawn(r.calls(HELD as u32, 30, 15_000, held_media));
    let up = wait_for(Duration::from_secs(20), || async {
        let total: u64 = r.sessions().values().map(|(own, _)| own).sum();
        (total == HELD).then_some(())
    })
    .await;
    assert!(up.is_some(), "12 held calls up: {:?}", r.sessions());
    let shares = r.reports_follow_sessions("held calls").await;
    assert!(shares["rtpe_3"] > 0, "rtpe_3 holds calls: {shares:?}");

    // A relay the probe has set aside under the host's load would take no
    // offer either: it hangs as a selectable one.
    wait_health(&r, "rtpe_3", "healthy").await;
    let before = scrape(r.http_port).await;
    r.engines["rtpe_3"].freeze();
    let hung_at = Instant::now();
    const AFTER: u64 = 45;
    // Every one must succeed (`calls` checks SIPp's count).
    r.calls(AFTER as u32, 15, 1000, after_media).await;
    let health_then = health_of(&r.collector, "rtpe_3");

    let m = scrape(r.http_port).await;
    let offered = new_legs(&m, "rtpe_3") - new_legs(&before, "rtpe_3");
    let errors = core_failures(&m, "rtpe_3", "engine_error");
    let moved: u64 = ["rtpe_1", "rtpe_2"]
        .iter()
        .map(|msr| reanchored(&m, msr) - reanchored(&before, msr))
        .sum();
    eprintln!(
        "the hung rtpengine got {offered} offers after it hung: {errors} errors reported, \
         {moved} legs moved to another relay; {:?} later the calls were done, rtpe_3 {health_then:?}",
        hung_at.elapsed()
    );
    assert!(
        offered >= 1,
        "the hung relay, the pooled policy's next choice, got no offer:\n{}\n{}",
        r.agents["rtpe_3"].log_text(),
        r.kamailio.log_text()
    );
    assert_eq!(errors, offered, "each offer it got was reported an error");
    assert_eq!(moved, offered, "each of its legs went on to another relay");
    // Kamailio's two workers ask in turn, and each failure is counted
    // before its worker's next question: the third error, or the probe's
    // `engine: down` before it, takes it out, with at most the other
    // worker's offer under way.
    assert!(offered <= 4, "{offered} offers reached the hung relay");
    assert_eq!(
        ["rtpe_1", "rtpe_2"]
            .iter()
            .map(|msr| placed(&m, msr) - placed(&before, msr))
            .sum::<u64>(),
        AFTER,
        "the calls placed after the hang are on the running relays"
    );
    wait_health(&r, "rtpe_3", "engine_down").await;
    assert!(
        r.agents["rtpe_3"]
            .log_text()
            .contains("stopped answering its probe"),
        "{}",
        r.agents["rtpe_3"].log_text()
    );

    held.await.expect("held calls");
    wait_no_leg(&r).await;
    let ended = wait_for(Duration::from_secs(10), || async {
        let s: Vec<(u64, u64)> = ["rtpe_1", "rtpe_2"]
            .iter()
            .map(|msr| r.engines[msr].sessions().unwrap_or((u64::MAX, 0)))
            .collect();
        s.iter().all(|(own, _)| *own == 0).then_some(s)
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "sessions left after the BYEs: {:?} {:?}",
            r.engines["rtpe_1"].call_ids(),
            r.engines["rtpe_2"].call_ids()
        )
    });
    let m = scrape(r.http_port).await;
    for (msr, (_, managed)) in ["rtpe_1", "rtpe_2"].iter().zip(&ended) {
        assert_eq!(*managed, placed(&m, msr), "{msr}: calls relayed vs placed");
    }
    assert_eq!(
        health_of(&r.collector, "rtpe_3").as_deref(),
        Some("engine_down"),
        "a hung relay stays out"
    );
    let mut callee = r.callee;
    let screen = callee.finish(Duration::from_secs(10));
    assert_eq!(
        sipp_total(&screen, "Successful call"),
        Some(HELD + AFTER),
        "{screen}"
    );
}

/// An rtpengine drained through its agent (SPEC §14:
/// `msr-agent --control-socket PATH drain --exit-when-empty --wait`)
/// while calls run, each agent's ng probe on: 18 calls held 12 s over the
/// three relays (3 / 6 / 9 by capacity), then `rtpe_3`'s agent drained.
///
/// * The collector shows `rtpe_3` `draining`, and 45 calls at 15/s all go
///   to the two others: rtpengine's own `list` of `rtpe_3` holds its held
///   calls and no other, and their RTP keeps flowing both ways through it
///   (`query`: more packets from each party).
/// * The agent runs on while its rtpengine has sessions; once the held
///   calls' BYEs have emptied it, and its `sessionsown` has been 0 for
///   2 s, it exits 0 and the waiting `drain` returns 0.
/// * `rtpe_3` relayed its held calls and nothing else; no leg is left
///   live, and every call succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rtpengine_drained_through_its_agent_keeps_its_calls_and_its_agent_exits_when_empty() {
    let mut r = Relays::start_with(&DRAIN_PORTS, r#"engine-probe="ng""#).await;
    let [held_media, more_media, _] = DRAIN_PORTS.callers;

    const HELD: u64 = 18;
    let held = tokio::spawn(r.calls(HELD as u32, 30, 12_000, held_media));
    let up = wait_for(Duration::from_secs(20), || async {
        let total: u64 = r.sessions().values().map(|(own, _)| own).sum();
        (total == HELD).then_some(())
    })
    .await;
    assert!(up.is_some(), "18 held calls up: {:?}", r.sessions());
    r.reports_follow_sessions("held calls").await;
    let kept = r.calls_by_engine()["rtpe_3"].clone();
    assert!(!kept.is_empty(), "rtpe_3 holds calls");
    let packets = |ids: &BTreeSet<String>| -> Vec<(String, i64)> {
        ids.iter()
            .flat_map(|id| r.engines["rtpe_3"].rtp_packets(id).unwrap_or_default())
            .collect()
    };
    let rtp_before = wait_for(Duration::from_secs(10), || async {
        let p = packets(&kept);
        (p.len() == 2 * kept.len() && p.iter().all(|(_, n)| *n > 0)).then_some(p)
    })
    .await
    .unwrap_or_else(|| panic!("rtp both ways of rtpe_3's calls: {:?}", packets(&kept)));

    // The drain, as a maintenance script runs it: it returns once the
    // agent has exited.
    let waiter = {
        let socket = r.agents["rtpe_3"].control_socket();
        std::thread::spawn(move || {
            std::process::Command::new(system_tests::bin_path("msr-agent"))
                .arg("--control-socket")
                .arg(socket)
                .args(["drain", "--exit-when-empty", "--wait", "--timeout", "60"])
                .output()
        })
    };
    wait_health(&r, "rtpe_3", "draining").await;

    let before = scrape(r.http_port).await;
    const MORE: u64 = 45;
    r.calls(MORE as u32, 15, 500, more_media).await;
    let after = scrape(r.http_port).await;
    assert_eq!(
        new_legs(&after, "rtpe_3"),
        new_legs(&before, "rtpe_3"),
        "a draining msr gets no new call"
    );
    assert_eq!(
        ["rtpe_1", "rtpe_2"]
            .iter()
            .map(|m| new_legs(&after, m) - new_legs(&before, m))
            .sum::<u64>(),
        MORE
    );
    assert_eq!(
        r.calls_by_engine()["rtpe_3"],
        kept,
        "the draining rtpengine keeps its calls and takes no new one"
    );
    let rtp_after = packets(&kept);
    assert_eq!(rtp_after.len(), rtp_before.len());
    for ((tag, old), (_, new)) in rtp_before.iter().zip(&rtp_after) {
        assert!(
            new > old,
            "{tag}: its media still flows ({old} → {new} packets)"
        );
    }
    let agent = r.agents.get_mut("rtpe_3").expect("rtpe_3's agent");
    assert!(agent.running(), "the agent waits for its calls to end");

    // The held calls end: rtpengine empties, the agent exits 2 s later.
    // Watched while their BYEs go, not after the callers have exited, so
    // that the moment it empties is seen within a poll.
    let engine = &r.engines["rtpe_3"];
    let empty = wait_for(Duration::from_secs(20), || {
        let exited = agent
            .child
            .as_mut()
            .and_then(|c| c.child.try_wait().ok().flatten());
        let own = engine.sessions().map(|(own, _)| own).ok();
        async move {
            assert!(
                exited.is_none(),
                "the agent exited before rtpengine was empty"
            );
            (own == Some(0)).then(std::time::Instant::now)
        }
    })
    .await
    .unwrap_or_else(|| panic!("rtpe_3 never emptied: {:?}", engine.call_ids()));
    held.await.expect("held calls");
    let status = wait_for(Duration::from_secs(10), || {
        let exited = agent
            .child
            .as_mut()
            .and_then(|c| c.child.try_wait().ok().flatten());
        async move { exited }
    })
    .await
    .unwrap_or_else(|| panic!("the drained agent did not exit:\n{}", agent.log_text()));
    let waited = empty.elapsed();
    eprintln!("the drained agent exited {waited:?} after its rtpengine emptied");
    assert_eq!(status.code(), Some(0), "{}", agent.log_text());
    assert!(
        waited >= Duration::from_millis(1800),
        "exited {waited:?} after the last session ended, not 2 s"
    );
    assert!(
        agent
            .log_text()
            .contains("drained: the media engine has had no session"),
        "{}",
        agent.log_text()
    );
    agent.child = None;
    let out = waiter
        .join()
        .expect("waiter thread")
        .expect("msr-agent drain --wait ran");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("drained: the agent has exited"), "{stdout}");
    // A planned stop after a drain is no outage (SPEC §14): the MSR is
    // listed gone, but not as gone while serving (no MsrGone).
    let gone = system_tests::wait_for(Duration::from_secs(10), || {
        let list = r.collector.msrctl_json(&["msr", "list"]);
        let row = list["msrs"]
            .as_array()
            .and_then(|a| a.iter().find(|m| m["name"] == "rtpe_3").cloned());
        async move { row.filter(|m| m.get("gone_cause").is_some()) }
    })
    .await
    .expect("rtpe_3 listed as gone once its agent unregistered");
    assert!(gone.get("gone_while_serving").is_none(), "{gone}");

    wait_no_leg(&r).await;
    let sessions = r.sessions();
    assert!(sessions.values().all(|(own, _)| *own == 0), "{sessions:?}");
    assert_eq!(
        sessions["rtpe_3"].1,
        kept.len() as u64,
        "rtpe_3 relayed its held calls and nothing else"
    );
    let mut callee = r.callee;
    let screen = callee.finish(Duration::from_secs(10));
    assert_eq!(
        sipp_total(&screen, "Successful call"),
        Some(HELD + MORE),
        "{screen}"
    );
}
