//! Interop with a standard registrar: a real Kamailio (registrar + usrloc,
//! `tests/kamailio/registrar.cfg`) stores the agent's REGISTER unchanged,
//! the media engine's addresses included (SPEC §3: Contact URI parameters),
//! and `ul.dump` shows them; the agent's shutdown unregisters. And the
//! shipped `config-examples/kamailio/kamailio.cfg` end to end (SPEC §11),
//! both its paths: SIPp callers → Kamailio → the collector (path A: its
//! redirect server's 302; path B: `GET /v1/select`) → three SIPp UAS
//! standing in for the media engines of three real agents → BYE →
//! `event_route[dialog:end]` → `POST /v1/release`; and a refusal (no MSR
//! can take the call) reaching the caller as 480/503 with its `Reason`.

use std::collections::BTreeMap;
use std::time::Duration;

use msr_shared::admin::HealthState;
use system_tests::kamailio::Kamailio;
use system_tests::system::{live_row, AccountSpec, Agent, AgentSpec, Collector, CollectorOpts};
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
/// installed Kamailio, every path: `kamailio -c` loads every module each
/// names (http_client, dialog, uac_redirect for path A, json for path B,
/// rtpengine, db_text and avpops for path C…) and parses every route.
#[test]
fn the_shipped_kamailio_config_passes_kamailio_c() {
    let cfg = system_tests::example("kamailio/kamailio.cfg");
    for flags in [
        &[][..],
        &["-A", "WITH_HTTP_SELECT"][..],
        &["-A", "WITH_RTPENGINE"][..],
    ] {
        let out = std::process::Command::new("kamailio")
            .arg("-c")
            .args(flags)
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
            "kamailio -c {flags:?} -f {}:\n{text}",
            cfg.display()
        );
    }
}

/// How the shipped config asks the collector (its header comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ask {
    /// Path A: `t_relay` to the redirect server, `get_redirects` of its 302.
    Redirect,
    /// Path B (`-A WITH_HTTP_SELECT`): `http_client_query` of
    /// `GET /v1/select`, `json_get_string` of its `engine_uri`.
    Http,
}

/// The three MSRs and their agents' loads: weights 90 : 60 : 30 (§7).
const LOADS: [(&str, u32); 3] = [("msr_1", 10), ("msr_2", 40), ("msr_3", 70)];

/// What a [`Parking`] runs besides its defaults.
#[derive(Default)]
struct Setup {
    /// The SIPp scenario (in `tests/sipp/`) of an MSR's engine;
    /// `engine_uas.xml` for those not named.
    engines: BTreeMap<&'static str, &'static str>,
    /// Appended to the collector's config (TOML sections).
    collector: &'static str,
    /// More `#!define`s of the shipped config, e.g. `ENGINE_TIMEOUT`.
    defines: Vec<(&'static str, String)>,
    /// The `<codec>` attributes of an MSR's agent config (SPEC §15); none
    /// for those not named.
    codecs: BTreeMap<&'static str, &'static str>,
}

/// The system the shipped config is tested in: a collector with its HTTP
/// API and redirect server, three real agents at [`LOADS`], each with a
/// SIPp UAS (`tests/sipp/engine_uas.xml`, or the one [`Setup`] names) on
/// its engine port standing in for its media engine, and Kamailio running
/// `config-examples/kamailio/kamailio.cfg` as it is, only its defines set.
/// Fields drop in order: Kamailio first, the directory last.
struct Parking {
    kamailio: Kamailio,
    /// Kept running (sending loads) until the test ends.
    _agents: Vec<Agent>,
    engines: BTreeMap<&'static str, SippBackground>,
    collector: Collector,
    http_port: u16,
    dir: tempfile::TempDir,
}

impl Parking {
    async fn start(ask: Ask) -> Parking {
        Self::start_with(ask, &Setup::default()).await
    }

    async fn start_with(ask: Ask, setup: &Setup) -> Parking {
        let dir = tempfile::tempdir().expect("tempdir");
        // The §7 draw, whose shares follow the weights: the `pooled`
        // default (SPEC §10) ranks by estimated occupancy instead, and with
        // these fixed `file:` loads and short calls it keeps choosing the
        // emptiest MSR.
        let extra = format!(
            "[http]\nlisten = \"127.0.0.1:0\"\n[redirect]\nlisten = \"127.0.0.1:0\"\n\
             [selection]\npolicy = \"ecss\"\n{}",
            setup.collector
        );
        let collector =
            Collector::start_with(dir.path(), "core1", &CollectorOpts::default(), &extra).await;
        let http_port = collector.http_port.expect("the http port announced");
        let redirect_port = collector
            .redirect_port
            .expect("the redirect port announced");
        let mut engines = BTreeMap::new();
        let mut agents = Vec::new();
        for (msr, calls) in LOADS {
            // The MSR's media engine: a SIPp UAS on the agent's transport
            // port.
            let engine_port = free_udp_port();
            let args: Vec<String> = [
                "-sf",
                &sipp_scenario(setup.engines.get(msr).copied().unwrap_or("engine_uas.xml"))
                    .display()
                    .to_string(),
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
                codecs: setup.codecs.get(msr).map(|c| (*c).to_owned()),
                ..AgentSpec::default()
            };
            agents.push(Agent::start(dir.path(), msr, &spec, calls));
        }
        collector
            .wait_rows(Duration::from_secs(15), |rows| {
                LOADS
                    .iter()
                    .all(|(msr, load)| live_row(rows, msr, u8::try_from(*load).ok()).is_some())
                    .then_some(())
            })
            .await
            .expect("three MSRs live with their loads");
        let flags: &[&str] = match ask {
            Ask::Redirect => &[],
            Ask::Http => &["WITH_HTTP_SELECT"],
        };
        let mut defines = vec![
            ("REDIRECT", format!("sip:127.0.0.1:{redirect_port}")),
            ("HTTP_API", format!("http://127.0.0.1:{http_port}")),
        ];
        defines.extend(setup.defines.iter().cloned());
        let kamailio = Kamailio::start_file(
            dir.path(),
            &system_tests::example("kamailio/kamailio.cfg"),
            &defines,
            flags,
        )
        .await;
        Parking {
            kamailio,
            _agents: agents,
            engines,
            collector,
            http_port,
            dir,
        }
    }

    /// `msrctl msr set MSR KEY VALUE` for every MSR.
    fn set_all(&self, key: &str, value: &str) {
        for (msr, _) in LOADS {
            let (ok, out, err) = self.collector.msrctl(&["msr", "set", msr, key, value]);
            assert!(ok, "msr set {msr} {key} {value}: {out}{err}");
        }
    }

    /// Runs `calls` calls of `tests/sipp/caller_uac.xml` (INVITE, 200,
    /// ACK, `hold_ms`, then BYE along the Record-Route) at 50/s through
    /// Kamailio, with `extra` SIPp arguments; every call must succeed.
    async fn calls(&self, calls: u32, hold_ms: u32, extra: &[&str]) {
        let hold = hold_ms.to_string();
        let mut args = vec!["-d", &hold];
        args.extend_from_slice(extra);
        let out = caller(self.kamailio.port, "caller_uac.xml", calls, &args).await;
        assert_eq!(
            sipp_total(&out, "Successful call"),
            Some(u64::from(calls)),
            "{out}"
        );
    }

    /// Runs `calls` calls of `tests/sipp/caller_refused_uac.xml` (INVITE,
    /// then a 480 or 503 whose `Reason` names a cause, ACK) through
    /// Kamailio; every call must be refused so. Returns the final
    /// responses the caller received, from SIPp's message trace.
    async fn refused(&self, calls: u32, name: &str) -> Vec<Refusal> {
        let trace = self.dir.path().join(format!("{name}-messages.log"));
        let trace_arg = trace.display().to_string();
        let out = caller(
            self.kamailio.port,
            "caller_refused_uac.xml",
            calls,
            &["-trace_msg", "-message_file", &trace_arg],
        )
        .await;
        assert_eq!(
            sipp_total(&out, "Successful call"),
            Some(u64::from(calls)),
            "{out}"
        );
        let text = std::fs::read_to_string(&trace)
            .unwrap_or_else(|e| panic!("sipp message trace {}: {e}", trace.display()));
        received_finals(&text)
    }

    /// Polls `/metrics` until every MSR has zero live legs and `released`
    /// legs were released in all; returns the scrape.
    async fn all_released(&self, released: u32) -> prometheus_parse::Scrape {
        let port = self.http_port;
        wait_for(Duration::from_secs(15), || async move {
            let m = scrape(port).await;
            let zero = LOADS.iter().all(|(msr, _)| {
                sample(&m, "msr_collector_msr_live_legs", &[("msr", msr)]) == Some(0.0)
            });
            let done =
                sample(&m, "msr_collector_released_legs_total", &[]) == Some(f64::from(released));
            (zero && done).then_some(m)
        })
        .await
        .unwrap_or_else(|| {
            panic!(
                "legs not released after the BYEs:\n{}",
                self.kamailio.log_text()
            )
        })
    }

    /// Stops each engine's UAS: each must have answered exactly the calls
    /// the collector gave its MSR (`m`'s selections of it).
    fn check_engines(&mut self, m: &prometheus_parse::Scrape) {
        for (msr, uas) in &mut self.engines {
            let screen = uas.finish(Duration::from_secs(10));
            assert_eq!(
                sipp_total(&screen, "Successful call").unwrap_or(0),
                u64::from(new_legs(m, msr)),
                "{msr}'s engine: {screen}"
            );
        }
    }
}

/// Runs `sipp` with `scenario` as a caller of `calls` calls at 50/s to
/// Kamailio on `port`, plus `extra` arguments; it must exit 0 (every call
/// went through the scenario). Returns its output.
async fn caller(port: u16, scenario: &str, calls: u32, extra: &[&str]) -> String {
    let (code, out) = run_caller(port, scenario, calls, 50, extra).await;
    assert_eq!(code, 0, "sipp {scenario} through kamailio: {out}");
    out
}

/// Runs `sipp` with `scenario` as a caller of `calls` calls at `rate` per
/// second to Kamailio on `port`, plus `extra` arguments. Returns its exit
/// code (0 when every call went through the scenario) and output.
async fn run_caller(
    port: u16,
    scenario: &str,
    calls: u32,
    rate: u32,
    extra: &[&str],
) -> (i32, String) {
    let mut args: Vec<String> = [
        "-sf",
        &sipp_scenario(scenario).display().to_string(),
        "-i",
        "127.0.0.1",
        "-p",
        &free_udp_port().to_string(),
        "-m",
        &calls.to_string(),
        "-r",
        &rate.to_string(),
        "-timeout",
        "60s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args.push(format!("127.0.0.1:{port}"));
    run_sipp(&args, Duration::from_secs(90))
        .await
        .expect("sipp uac")
}

/// A final response a caller received: its call's Call-ID, its status and
/// the values of its `Reason` and `Warning` headers (empty when absent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) call_id: String,
    pub(crate) status: u16,
    pub(crate) reason: String,
    pub(crate) warning: String,
}

/// The final (≥ 300) responses in a SIPp `-trace_msg` file, one per call
/// (a retransmission, sent again before the ACK arrived, counts once).
pub(crate) fn received_finals(trace: &str) -> Vec<Refusal> {
    let mut by_call: BTreeMap<String, Refusal> = BTreeMap::new();
    for chunk in trace.split("message received").skip(1) {
        // `… [N] bytes :`, a blank line, then the message up to the next
        // trace entry's dashes.
        let Some((_, message)) = chunk.split_once(":\n") else {
            continue;
        };
        let status = message
            .lines()
            .find(|l| !l.trim().is_empty())
            .and_then(|l| l.strip_prefix("SIP/2.0 "))
            .and_then(|l| l.get(..3))
            .and_then(|code| code.parse::<u16>().ok());
        let Some(status) = status.filter(|s| *s >= 300) else {
            continue;
        };
        let header = |name: &str| {
            message
                .lines()
                .find_map(|l| {
                    let (n, v) = l.split_once(':')?;
                    n.trim()
                        .eq_ignore_ascii_case(name)
                        .then(|| v.trim().to_owned())
                })
                .unwrap_or_default()
        };
        let call_id = header("Call-ID");
        by_call.entry(call_id.clone()).or_insert(Refusal {
            call_id,
            status,
            reason: header("Reason"),
            warning: header("Warning"),
        });
    }
    by_call.into_values().collect()
}

fn new_legs(m: &prometheus_parse::Scrape, msr: &str) -> u32 {
    sample(
        m,
        "msr_collector_msr_selections_total",
        &[("msr", msr), ("leg", "new")],
    )
    .map_or(0, |v| v as u32)
}

/// Each MSR's new legs in `m`, less those in `before` (an earlier scrape's
/// [`check_shares`]; empty for none).
fn legs_since(
    m: &prometheus_parse::Scrape,
    before: &BTreeMap<&'static str, u32>,
) -> BTreeMap<&'static str, u32> {
    LOADS
        .iter()
        .map(|(msr, _)| {
            let earlier = before.get(msr).copied().unwrap_or(0);
            (*msr, new_legs(m, msr) - earlier)
        })
        .collect()
}

/// Checks that the `calls` new legs since `before` follow `weights` (the
/// §7 draw: each call an independent draw, so an MSR of weight share p
/// gets a binomial(calls, p) count) within 4 standard deviations,
/// sqrt(p (1 - p) / calls) of the share: a correct draw fails it once in
/// about 16,000 checks, and at 800 calls the bound is 5 to 7 points. An
/// MSR not in `weights` (inactive) gets none. Returns the counts by MSR,
/// `before` included.
fn check_shares(
    m: &prometheus_parse::Scrape,
    before: &BTreeMap<&'static str, u32>,
    calls: u32,
    weights: &[(&str, f64)],
) -> BTreeMap<&'static str, u32> {
    let legs = legs_since(m, before);
    assert_eq!(legs.values().sum::<u32>(), calls, "{legs:?}");
    for (msr, got) in &legs {
        if !weights.iter().any(|(w, _)| w == msr) {
            assert_eq!(*got, 0, "{msr} has no weight: {legs:?}");
        }
    }
    let total: f64 = weights.iter().map(|(_, w)| w).sum();
    let n = f64::from(calls);
    for (msr, weight) in weights {
        let p = weight / total;
        let share = f64::from(legs[msr]) / n;
        let sigma = (p * (1.0 - p) / n).sqrt();
        assert!(
            (share - p).abs() <= 4.0 * sigma,
            "{msr} share {share:.4}, expected {p:.4} ± {:.4} (4σ of {calls} draws, weights {weights:?}): {legs:?}",
            4.0 * sigma
        );
    }
    LOADS
        .iter()
        .map(|(msr, _)| (*msr, new_legs(m, msr)))
        .collect()
}

/// The §7 weights of [`LOADS`]: 100 - load.
const WEIGHTS: [(&str, f64); 3] = [("msr_1", 90.0), ("msr_2", 60.0), ("msr_3", 30.0)];

/// The shipped Kamailio config with real traffic (SPEC §11), path A:
/// 1,000 calls at 50/s — 800 with three MSRs at loads 10 / 40 / 70 %
/// (weights 90 : 60 : 30), then 199 with `msr_3` set inactive (and
/// Call-IDs holding `"`, `\` and `'`), then one held 2 s.
/// Each call is redirected by the collector (302 to the chosen MSR's
/// engine), answered by that engine's SIPp UAS (its count equals the
/// collector's selections of the MSR), the shares follow the weights
/// (within 4σ of the binomial, [`check_shares`]), the inactive MSR gets
/// none, the held call is a live leg while its dialog is up, and after the
/// BYEs Kamailio's `dialog:end` has released every leg: zero live legs,
/// and `/metrics` counts 1,000 redirects, selections and releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kamailio_parks_calls_on_the_chosen_engines_and_releases_them_at_bye() {
    let mut p = Parking::start(Ask::Redirect).await;

    const FIRST: u32 = 800;
    p.calls(FIRST, 0, &[]).await;
    let m = p.all_released(FIRST).await;
    let first = check_shares(&m, &BTreeMap::new(), FIRST, &WEIGHTS);

    let (ok, out, err) = p
        .collector
        .msrctl(&["msr", "set", "msr_3", "active", "false"]);
    assert!(ok, "{out}{err}");
    // Call-IDs holding `"`, `\` and `'` (legal, RFC 3261 §25.1): the
    // config's release still names the leg in valid JSON.
    const SECOND: u32 = 199;
    p.calls(SECOND, 0, &["-cid_str", r#"q"u\o'te-%u-%p@%s"#])
        .await;
    let m = p.all_released(FIRST + SECOND).await;
    assert_eq!(
        new_legs(&m, "msr_3"),
        first["msr_3"],
        "an inactive msr gets no call"
    );
    check_shares(&m, &first, SECOND, &WEIGHTS[..2]);

    // The leg lives as long as the call, not as long as the redirect: one
    // call held 2 s is a live leg while Kamailio's dialog is confirmed
    // (state 4), and is released at its BYE.
    let held = p.calls(1, 2000, &[]);
    let during = async {
        wait_for(Duration::from_secs(10), || async {
            p.kamailio
                .rpc(&["dlg.list"])
                .filter(|d| d.contains("state: 4"))?;
            let m = scrape(p.http_port).await;
            Some(
                LOADS
                    .iter()
                    .filter_map(|(msr, _)| {
                        sample(&m, "msr_collector_msr_live_legs", &[("msr", msr)])
                    })
                    .sum::<f64>(),
            )
        })
        .await
    };
    let ((), during) = tokio::join!(held, during);
    assert_eq!(during, Some(1.0), "one live leg while the call is up");
    const HELD: u32 = 1;
    let m = p.all_released(FIRST + SECOND + HELD).await;

    // Each engine answered exactly the calls the collector gave its MSR.
    p.check_engines(&m);
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
}

/// Asserts that each of `finals` is `status` with
/// `Reason: SIP ;cause=<status>;text="<code>"`, and that there are `calls`.
pub(crate) fn check_refusals(finals: &[Refusal], calls: u32, status: u16, code: &str) {
    assert_eq!(finals.len(), calls as usize, "{finals:?}");
    let reason = format!("SIP ;cause={status};text=\"{code}\"");
    for f in finals {
        assert_eq!(
            (f.status, f.reason.as_str()),
            (status, reason.as_str()),
            "{f:?}"
        );
    }
}

/// No MSR can take the call, through the shipped config's path A: with
/// every MSR inactive, 20 callers get the redirect server's `480` with
/// `Reason: SIP ;cause=480;text="msr_not_found"`; with every MSR active
/// again but its load limit (5 %) under its load, 20 more get `503` with
/// `text="msr_overloaded"`. Kamailio's `failure_route[PARK]` relays each
/// refusal unchanged (the collector's `Warning: 399` with the refusal's
/// message arrives too), no engine sees a call, no leg is left live or
/// released, and `/metrics` counts the refusals by status and cause. Then,
/// the collector stopped, 5 callers get the config's own `503` with
/// `text="collector_unreachable"` once its 2 s for the redirect server
/// have passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kamailio_relays_the_collectors_refusal_to_the_caller_unchanged() {
    let mut p = Parking::start(Ask::Redirect).await;
    const CALLS: u32 = 20;

    p.set_all("active", "false");
    let finals = p.refused(CALLS, "inactive").await;
    check_refusals(&finals, CALLS, 480, "msr_not_found");
    for f in &finals {
        assert!(
            f.warning.starts_with(
                "399 msr-collector \"no registered active msr in zone `default` at a finite distance from site `local`"
            ),
            "{f:?}"
        );
    }

    p.set_all("active", "true");
    p.set_all("load_limit", "5");
    let finals = p.refused(CALLS, "overloaded").await;
    check_refusals(&finals, CALLS, 503, "msr_overloaded");
    for f in &finals {
        assert!(
            f.warning.starts_with("399 msr-collector \"")
                && f.warning.contains("is at or above its load limit"),
            "{f:?}"
        );
    }

    let m = p.all_released(0).await;
    p.check_engines(&m);
    let count = |name: &str, labels: &[(&str, &str)]| sample(&m, name, labels);
    let calls = Some(f64::from(CALLS));
    assert_eq!(
        count(
            "msr_collector_redirect_responses_total",
            &[("status", "480")]
        ),
        calls
    );
    assert_eq!(
        count(
            "msr_collector_redirect_responses_total",
            &[("status", "503")]
        ),
        calls
    );
    assert_eq!(
        count(
            "msr_collector_selections_total",
            &[("outcome", "msr_not_found")]
        ),
        calls
    );
    assert_eq!(
        count(
            "msr_collector_selections_total",
            &[("outcome", "msr_overloaded")]
        ),
        calls
    );
    assert_eq!(
        count("msr_collector_selections_total", &[("outcome", "selected")]).unwrap_or(0.0),
        0.0
    );

    // The collector gone: its redirect server does not answer within the
    // config's 2 s, and the caller gets 503 `collector_unreachable`.
    assert!(p.collector.terminate().is_some_and(|s| s.success()));
    let finals = p.refused(5, "down").await;
    check_refusals(&finals, 5, 503, "collector_unreachable");
}

/// The shipped config's path B (`-A WITH_HTTP_SELECT`): Kamailio asks
/// `GET /v1/select?zone=&site=&call_id=` over `http_client`, reads the
/// answer's `engine_uri` with the json module and relays the INVITE there.
/// 150 calls at 50/s with three MSRs at loads 10 / 40 / 70 %: each lands
/// on the engine of the MSR the collector chose (each engine's count
/// equals the collector's selections of its MSR), the shares follow the
/// weights 90 : 60 : 30, no redirect server is asked, and after the BYEs
/// `dialog:end` has released every leg (zero live legs, 150 released).
/// Then, every MSR inactive, 10 callers get the config's own `503` with
/// `Reason: SIP ;cause=503;text="http_503"` (http_client keeps no body of
/// a 5xx answer, so the config knows the status, not the code), and the
/// collector counts 10 `msr_not_found` refusals. Then, the collector
/// stopped, 5 callers get `503` with `text="collector_unreachable"`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kamailio_parks_calls_through_the_http_api_and_releases_them_at_bye() {
    let mut p = Parking::start(Ask::Http).await;

    const CALLS: u32 = 150;
    p.calls(CALLS, 0, &[]).await;
    let m = p.all_released(CALLS).await;
    check_shares(&m, &BTreeMap::new(), CALLS, &WEIGHTS);

    const REFUSED: u32 = 10;
    p.set_all("active", "false");
    let finals = p.refused(REFUSED, "inactive").await;
    check_refusals(&finals, REFUSED, 503, "http_503");

    let m = p.all_released(CALLS).await;
    p.check_engines(&m);
    assert_eq!(
        sample(
            &m,
            "msr_collector_selections_total",
            &[("outcome", "selected")]
        ),
        Some(f64::from(CALLS))
    );
    assert_eq!(
        sample(
            &m,
            "msr_collector_selections_total",
            &[("outcome", "msr_not_found")]
        ),
        Some(f64::from(REFUSED))
    );
    assert_eq!(
        sample(
            &m,
            "msr_collector_redirect_responses_total",
            &[("status", "302")]
        )
        .unwrap_or(0.0),
        0.0,
        "path B asks no redirect server"
    );

    // The collector gone: the HTTP query fails, the caller gets 503
    // `collector_unreachable`.
    assert!(p.collector.terminate().is_some_and(|s| s.success()));
    let finals = p.refused(5, "down").await;
    check_refusals(&finals, 5, 503, "collector_unreachable");
}

/// The agent registers over TLS with a real Kamailio registrar (its `tls`
/// module, Debian's `kamailio-tls-modules`): it checks Kamailio's
/// certificate against its `tls-ca`, Kamailio stores the `sips:` contact
/// with the engine's addresses, and the agent's shutdown unregisters over
/// the same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kamailio_takes_the_agents_register_over_tls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = system_tests::pki::Pki::create(dir.path());
    let tls_port = system_tests::system::free_tcp_port();
    let tls_cfg = dir.path().join("tls.cfg");
    std::fs::write(
        &tls_cfg,
        format!(
            "[server:default]\nmethod = TLSv1.2+\ncertificate = {}\nprivate_key = {}\n\
             verify_certificate = no\nrequire_certificate = no\n\n\
             [client:default]\nverify_certificate = no\nrequire_certificate = no\n",
            pki.server.0.display(),
            pki.server.1.display()
        ),
    )
    .expect("write tls.cfg");
    let kamailio = Kamailio::start_with(
        dir.path(),
        "registrar-tls.cfg",
        &[
            ("TLS_ADDRESS", format!("127.0.0.1:{tls_port}")),
            ("TLS_CONFIG", tls_cfg.display().to_string()),
        ],
    )
    .await;
    let spec = AgentSpec {
        accounts: vec![AccountSpec {
            msr: "msr_1".into(),
            realm: format!("sips:127.0.0.1:{tls_port}"),
        }],
        register_expires: 60,
        engine_port: 5090,
        agent_attributes: pki.agent_attributes(&pki.ca, false),
        ..AgentSpec::default()
    };
    let mut agent = Agent::start(dir.path(), "msr_1", &spec, 10);
    let dump = wait_for(Duration::from_secs(10), || async {
        kamailio
            .rpc(&["ul.dump"])
            .filter(|d| d.contains("AoR: msr_1"))
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "no msr_1 in kamailio's ul.dump:\n{}\n{}",
            agent.log_text(),
            kamailio.log_text()
        )
    });
    assert!(
        dump.contains("Address: sips:msr_1@127.0.0.1:")
            && dump.contains(";engine=127.0.0.1:5090;engine-transport=udp;mcc=127.0.0.1:5091"),
        "{dump}"
    );
    assert!(
        kamailio.log_text().contains("REGISTER over tls"),
        "{}",
        kamailio.log_text()
    );
    assert!(agent.terminate().is_some_and(|s| s.success()));
    let gone = wait_for(Duration::from_secs(10), || async {
        kamailio
            .rpc(&["ul.dump"])
            .filter(|d| !d.contains("AoR: msr_1"))
    })
    .await;
    assert!(gone.is_some(), "the agent's shutdown unregisters over tls");
}

/// Legs the collector placed on `msr` in `m`: new ones and those moved
/// there by a failover (re-anchored).
pub(crate) fn placed(m: &prometheus_parse::Scrape, msr: &str) -> u64 {
    ["new", "reanchored"]
        .iter()
        .filter_map(|leg| {
            sample(
                m,
                "msr_collector_msr_selections_total",
                &[("msr", msr), ("leg", leg)],
            )
        })
        .sum::<f64>() as u64
}

/// Failures cores reported against `msr` for `cause` in `m` (SPEC §14).
pub(crate) fn core_failures(m: &prometheus_parse::Scrape, msr: &str, cause: &str) -> u64 {
    sample(
        m,
        "msr_collector_core_failures_total",
        &[("msr", msr), ("cause", cause)],
    )
    .map_or(0, |v| v as u64)
}

/// The shipped config fails over (SPEC §14) with real processes: 300 calls
/// at 10/s, each held 500 ms, through Kamailio (path `ask`) to three MSRs
/// at loads 10 / 40 / 70 % whose engines are SIPp UASs: `msr_2`'s answers
/// 503 to every INVITE (`tests/sipp/engine_503_uas.xml`), and `msr_1`'s
/// (the busiest) is killed after 100 calls, its agent left running. The
/// collector's hold outlasts the run (`failure_hold_secs`): with its engine
/// probe off, nothing else brings a tripped MSR back, so each failed MSR
/// is seen to stay out.
///
/// * Every call completes but those the dead engine held when it died
///   (answered, then its BYE unanswered): every INVITE that reached a dead
///   or failing engine went on to another.
/// * The dead engine got no INVITE once its first timeout was reported
///   (the first timeout trips an MSR): the calls relayed to it after it
///   died are those placed before that report, each reported as a
///   timeout.
/// * The 503 engine got the 3 INVITEs that trip an MSR (3 errors within
///   10 s), plus at most the few placed while the third 503 was on its
///   way, each reported as a 5xx; both MSRs end `engine_down`.
/// * After the BYEs, and the failures' releases, no leg is live.
async fn kamailio_fails_over(ask: Ask) {
    const CALLS: u32 = 300;
    const RATE: u32 = 10;
    const KILL_AFTER: u64 = 100;
    let setup = Setup {
        engines: BTreeMap::from([("msr_2", "engine_503_uas.xml")]),
        collector: "[health]\nfailure_hold_secs = 600\n",
        // A loopback engine answers within a millisecond: 1 s of silence
        // is death, and keeps the calls placed on it after it died few.
        defines: vec![("ENGINE_TIMEOUT", "1000".into())],
        ..Setup::default()
    };
    let mut p = Parking::start_with(ask, &setup).await;
    let http_port = p.http_port;
    let calls = run_caller(
        p.kamailio.port,
        "caller_uac.xml",
        CALLS,
        RATE,
        &["-d", "500"],
    );
    let engines = &mut p.engines;
    let kill = async move {
        wait_for(Duration::from_secs(30), || async move {
            let m = scrape(http_port).await;
            let all: u64 = LOADS.iter().map(|(msr, _)| placed(&m, msr)).sum();
            (all >= KILL_AFTER).then_some(())
        })
        .await
        .expect("100 calls placed");
        let m = scrape(http_port).await;
        let in_flight =
            sample(&m, "msr_collector_msr_live_legs", &[("msr", "msr_1")]).map_or(0, |v| v as u64);
        let before_kill = placed(&m, "msr_1");
        if let Some(engine) = engines.get_mut("msr_1") {
            engine.kill9();
        }
        // The legs placed between the two scrapes may have reached the
        // engine alive or dead: they count either way below.
        let after_kill = placed(&scrape(http_port).await, "msr_1");
        let at_first_failure = wait_for(Duration::from_secs(10), || async move {
            let m = scrape(http_port).await;
            (core_failures(&m, "msr_1", "timeout") > 0).then(|| placed(&m, "msr_1"))
        })
        .await
        .expect("the dead engine's first timeout reported");
        (in_flight, before_kill..=after_kill, at_first_failure)
    };
    let ((code, out), (in_flight, at_kill, at_first_failure)) = tokio::join!(calls, kill);
    let racing = at_kill.end() - at_kill.start();

    let succeeded = sipp_total(&out, "Successful call").unwrap_or(0);
    let failed = sipp_total(&out, "Failed call").unwrap_or(0);
    eprintln!(
        "{ask:?}: {succeeded} calls succeeded, {failed} failed (sipp exit {code}); \
         msr_1 held {in_flight} legs when its engine died"
    );
    assert_eq!(succeeded + failed, u64::from(CALLS), "{out}");
    assert!(
        failed <= in_flight + racing,
        "{failed} calls failed; the dead engine held {in_flight} (+ {racing} placed as it died): {out}"
    );

    // No leg left once the BYEs (and the failures' releases) are through.
    let legs = wait_for(Duration::from_secs(30), || async {
        let listed = p.collector.msrctl_json(&["leg", "list"]);
        (listed["total"] == 0).then_some(listed)
    })
    .await;
    assert!(
        legs.is_some(),
        "legs left live: {}",
        p.collector.msrctl_json(&["leg", "list"])
    );

    let m = scrape(http_port).await;
    let dead_after = placed(&m, "msr_1") - at_kill.end();
    let dead_timeouts = core_failures(&m, "msr_1", "timeout");
    eprintln!(
        "{ask:?}: the dead engine got {dead_after} INVITEs after it died (+ {racing} placed as it \
         died), all before its first timeout was reported; {dead_timeouts} timeouts reported"
    );
    assert_eq!(
        placed(&m, "msr_1"),
        at_first_failure,
        "no call placed on msr_1 once its first timeout was reported"
    );
    assert!(
        dead_timeouts >= dead_after && dead_timeouts <= dead_after + racing + in_flight,
        "each INVITE relayed to the dead engine timed out and was reported: \
         {dead_timeouts} timeouts, {dead_after} INVITEs after its death (+ {racing} as it died), \
         {in_flight} in flight"
    );

    let failing = p
        .engines
        .get_mut("msr_2")
        .map(|uas| uas.finish(Duration::from_secs(10)))
        .unwrap_or_default();
    let refused = sipp_total(&failing, "Successful call").unwrap_or(0);
    eprintln!("{ask:?}: the 503 engine got {refused} INVITEs");
    assert_eq!(refused, core_failures(&m, "msr_2", "5xx"), "{failing}");
    assert!(
        (3..=5).contains(&refused),
        "the 503 engine got {refused} INVITEs: {failing}"
    );
    assert_eq!(placed(&m, "msr_2"), refused);

    let rows = p.collector.rows().await.expect("resource list");
    for (msr, health) in [
        ("msr_1", HealthState::EngineDown),
        ("msr_2", HealthState::EngineDown),
        ("msr_3", HealthState::Healthy),
    ] {
        assert!(
            rows.iter().any(|r| r.msr == msr && r.health == health),
            "{msr} is not {health:?}: {rows:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kamailio_fails_over_through_the_redirect_server() {
    kamailio_fails_over(Ask::Redirect).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kamailio_fails_over_through_the_http_api() {
    kamailio_fails_over(Ask::Http).await;
}

/// When every MSR fails a call, the caller gets the collector's refusal
/// (SPEC §14), on both SIP paths: three MSRs whose engines answer 503 to
/// every INVITE, 3 callers. Each INVITE is tried on each engine in turn
/// (the collector excludes the MSRs that failed it, up to its 3
/// attempts), then refused `503` with
/// `Reason: SIP ;cause=503;text="msr_unavailable"`; each engine got the 3
/// INVITEs, and no leg is left live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kamailio_refuses_a_call_every_msr_failed_with_msr_unavailable() {
    const CALLS: u32 = 3;
    for ask in [Ask::Redirect, Ask::Http] {
        let setup = Setup {
            engines: LOADS
                .iter()
                .map(|(msr, _)| (*msr, "engine_503_uas.xml"))
                .collect(),
            ..Setup::default()
        };
        let mut p = Parking::start_with(ask, &setup).await;
        let finals = p.refused(CALLS, "exhausted").await;
        check_refusals(&finals, CALLS, 503, "msr_unavailable");
        let m = scrape(p.http_port).await;
        for (msr, uas) in &mut p.engines {
            let screen = uas.finish(Duration::from_secs(10));
            assert_eq!(
                sipp_total(&screen, "Successful call"),
                Some(u64::from(CALLS)),
                "{ask:?}: {msr}'s engine: {screen}"
            );
            assert_eq!(core_failures(&m, msr, "5xx"), u64::from(CALLS), "{ask:?}");
        }
        let listed = p.collector.msrctl_json(&["leg", "list"]);
        assert_eq!(listed["total"], 0, "{ask:?}: {listed}");
    }
}

/// `tests/sipp/{template}` with its SDP's audio line replaced by `media`
/// and every `480` by `status` (for the refused caller), written into the
/// test's directory; returns its path.
fn offering(
    dir: &std::path::Path,
    template: &str,
    name: &str,
    media: &str,
    status: &str,
) -> String {
    let path = sipp_scenario(template);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let audio = "m=audio [media_port] RTP/AVP 8\na=rtpmap:8 PCMA/8000\n";
    assert!(text.contains(audio), "{template} offers PCMA alone");
    let text = text.replace(audio, media).replace("480", status);
    let out = dir.join(format!("{name}.xml"));
    std::fs::write(&out, text).expect("write scenario");
    out.display().to_string()
}

/// SPEC §15 end to end with the shipped config's path A: each MSR's agent
/// reports the codecs of its `<codec>` element, Kamailio relays each
/// caller's INVITE to the redirect server, which reads the SDP offer: over
/// 300 calls, audio-only, video, G.729 and T.38 offers each land only on
/// MSRs that take them, and an offer nobody takes gets `488` with its
/// cause and a `Warning` naming what is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kamailio_parks_each_offer_only_on_an_msr_that_takes_it() {
    let setup = Setup {
        codecs: BTreeMap::from([
            ("msr_1", r#"pcma="1" pcmu="2" g729="0" h264="0" t38="0""#),
            (
                "msr_2",
                r#"pcma="1" pcmu="2" g729="3" h264="1" tel-event-pt="101""#,
            ),
            ("msr_3", r#"pcma="1" t38="1""#),
        ]),
        ..Setup::default()
    };
    let mut p = Parking::start_with(Ask::Redirect, &setup).await;
    p.collector
        .wait_rows(Duration::from_secs(15), |rows| {
            (rows.iter().filter(|r| r.codecs.is_some()).count() == 3).then_some(())
        })
        .await
        .expect("every agent reported its codecs");
    let dir = p.dir.path().to_owned();
    let offers = [
        (
            "pcmu",
            "m=audio [media_port] RTP/AVP 0 101\na=rtpmap:101 telephone-event/8000\n",
            &["msr_1", "msr_2"][..],
        ),
        (
            "video",
            "m=audio [media_port] RTP/AVP 8\nm=video [media_port+2] RTP/AVP 96\na=rtpmap:96 H264/90000\n",
            &["msr_2"][..],
        ),
        (
            "g729",
            "m=audio [media_port] RTP/AVP 18\na=rtpmap:18 G729/8000\n",
            &["msr_2"][..],
        ),
        ("t38", "m=image [media_port] udptl t38\n", &["msr_3"][..]),
    ];
    const EACH: u32 = 75;
    let mut before = scrape(p.http_port).await;
    let mut total = 0;
    for (name, media, takers) in offers {
        let scenario = offering(&dir, "caller_uac.xml", name, media, "480");
        let out = caller(p.kamailio.port, &scenario, EACH, &["-d", "0"]).await;
        assert_eq!(
            sipp_total(&out, "Successful call"),
            Some(u64::from(EACH)),
            "{out}"
        );
        total += EACH;
        let m = p.all_released(total).await;
        for (msr, _) in LOADS {
            let got = new_legs(&m, msr) - new_legs(&before, msr);
            if takers.contains(&msr) {
                if takers.len() == 1 {
                    assert_eq!(got, EACH, "{name}: every call on {msr}");
                }
            } else {
                assert_eq!(got, 0, "{name}: {msr} does not take it");
            }
        }
        before = m;
    }
    // Nobody takes VP8: 488, the cause, and what is missing.
    let scenario = offering(
        &dir,
        "caller_refused_uac.xml",
        "vp8",
        "m=audio [media_port] RTP/AVP 8\nm=video [media_port+2] RTP/AVP 97\na=rtpmap:97 VP8/90000\n",
        "488",
    );
    let trace = dir.join("vp8-messages.log");
    let trace_arg = trace.display().to_string();
    let out = caller(
        p.kamailio.port,
        &scenario,
        5,
        &["-trace_msg", "-message_file", &trace_arg],
    )
    .await;
    assert_eq!(sipp_total(&out, "Successful call"), Some(5), "{out}");
    let finals = received_finals(&std::fs::read_to_string(&trace).expect("trace"));
    check_refusals(&finals, 5, 488, "no_capable_msr");
    assert!(
        finals
            .iter()
            .all(|f| f.warning.starts_with("305 ") && f.warning.contains("video (vp8)")),
        "{finals:?}"
    );
    let m = scrape(p.http_port).await;
    assert_eq!(
        sample(
            &m,
            "msr_collector_selections_total",
            &[("outcome", "no_capable_msr")]
        ),
        Some(5.0)
    );
    p.check_engines(&m);
}
