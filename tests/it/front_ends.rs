//! The softswitch-facing front ends (SPEC §11) against the real collector
//! and real agents whose loads are real readings: the HTTP API answers
//! what the control socket answers (200 legs selected and released over
//! HTTP, shares following the weights, an inactive MSR getting none, every
//! count back at zero), bad input gets 400/404 with a JSON error, and
//! `/metrics` parses as Prometheus text with counts that match; the SIP
//! redirect server answers SIPp's INVITEs with 302 to the chosen engine,
//! one leg per Call-ID.

use std::collections::BTreeMap;
use std::time::Duration;

use msr_shared::admin::{Request, ResponseData};
use system_tests::system::{live_row, AccountSpec, Agent, AgentSpec, Collector, CollectorOpts};
use system_tests::{free_udp_port, run_sipp, sipp_scenario};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One HTTP/1.1 exchange (`Connection: close`): the status and the body.
pub(crate) async fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect http");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("read");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not json ({e}): {body}"))
}

/// The value of one sample in a parsed exposition.
pub(crate) fn sample(
    scrape: &prometheus_parse::Scrape,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<f64> {
    scrape.samples.iter().find_map(|s| {
        let matches = s.metric == name
            && labels
                .iter()
                .all(|(k, v)| s.labels.get(k).is_some_and(|x| x == *v));
        match (&s.value, matches) {
            (
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v),
                true,
            ) => Some(*v),
            _ => None,
        }
    })
}

/// `GET /metrics`, checked by Prometheus's own linter (`promtool check
/// metrics`, Debian's `prometheus` package) and parsed with
/// `prometheus-parse`.
pub(crate) async fn scrape(port: u16) -> prometheus_parse::Scrape {
    let (status, body) = http(port, "GET", "/metrics", "", "").await;
    assert_eq!(status, 200, "{body}");
    promtool_check(&body);
    let lines = body.lines().map(|l| Ok(l.to_owned()));
    prometheus_parse::Scrape::parse(lines)
        .unwrap_or_else(|e| panic!("unparsable /metrics ({e}):\n{body}"))
}

/// `promtool check metrics` with `body` on stdin must succeed with no
/// complaint (it parses the Prometheus text format and lints names, types
/// and help texts).
pub(crate) fn promtool_check(body: &str) {
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run promtool (scripts/deps.sh installs it): {e}"));
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(body.as_bytes()).expect("promtool stdin");
    }
    let out = child.wait_with_output().expect("promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.trim().is_empty(),
        "promtool check metrics: {text}\n{body}"
    );
}

/// A collector with `[http]` and `[redirect]`, and three agents at loads
/// 10 / 40 / 70 %, each with its own engine port.
pub(crate) async fn system(
    dir: &std::path::Path,
) -> (Collector, Vec<Agent>, u16, u16, BTreeMap<String, u16>) {
    let extra = "[http]\nlisten = \"127.0.0.1:0\"\n[redirect]\nlisten = \"127.0.0.1:0\"\n";
    let collector = Collector::start_with(dir, "core1", &CollectorOpts::default(), extra).await;
    let http_port = collector.http_port.expect("the http port announced");
    let redirect_port = collector
        .redirect_port
        .expect("the redirect port announced");
    let loads = [("msr_1", 10), ("msr_2", 40), ("msr_3", 70)];
    let mut engines = BTreeMap::new();
    let agents = loads
        .iter()
        .map(|(msr, calls)| {
            let engine_port = free_udp_port();
            engines.insert((*msr).to_owned(), engine_port);
            let spec = AgentSpec {
                accounts: vec![AccountSpec::new(msr, &collector)],
                engine_port,
                ..AgentSpec::default()
            };
            Agent::start(dir, msr, &spec, *calls)
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
    (collector, agents, http_port, redirect_port, engines)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_api_selects_releases_and_counts_as_the_control_socket_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (collector, _agents, port, _, engines) = system(dir.path()).await;

    let (status, body) = http(port, "GET", "/health", "", "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["healthy_msrs"], 3, "{body}");
    // The operator store's state rides along (SPEC §12).
    assert_eq!(json(&body)["store"]["backend"], "file", "{body}");

    // msr_3 inactive: it gets no leg; the others share 90 : 60.
    let (ok, out, err) = collector.msrctl(&["msr", "set", "msr_3", "active", "false"]);
    assert!(ok, "{out}{err}");
    const CALLS: u32 = 200;
    let mut picks: BTreeMap<String, u32> = BTreeMap::new();
    for n in 0..CALLS {
        let (status, body) = http(
            port,
            "GET",
            &format!("/v1/select?zone=default&site=local&call_id=call-{n}%40core"),
            "",
            "",
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let answer = json(&body);
        let msr = answer["msr"].as_str().expect("msr").to_owned();
        assert_eq!(answer["leg"], "new", "{body}");
        assert_eq!(
            answer["engine_uri"].as_str(),
            Some(format!("sip:127.0.0.1:{}", engines[&msr]).as_str()),
            "{body}"
        );
        *picks.entry(msr).or_default() += 1;
    }
    assert_eq!(
        picks.get("msr_3"),
        None,
        "an inactive msr gets no leg: {picks:?}"
    );
    let share = f64::from(picks.get("msr_1").copied().unwrap_or(0)) / f64::from(CALLS);
    assert!(
        (share - 0.6).abs() < 0.12,
        "msr_1 share {share} (weights 90 : 60): {picks:?}"
    );
    // Sticky: the same Call-ID again gets the same MSR.
    let (_, body) = http(
        port,
        "GET",
        "/v1/select?zone=default&site=local&call_id=call-0%40core",
        "",
        "",
    )
    .await;
    assert_eq!(json(&body)["leg"], "sticky", "{body}");

    let metrics = scrape(port).await;
    for (msr, n) in &picks {
        assert_eq!(
            sample(&metrics, "msr_collector_msr_live_legs", &[("msr", msr)]),
            Some(f64::from(*n))
        );
        assert_eq!(
            sample(
                &metrics,
                "msr_collector_msr_selections_total",
                &[("msr", msr), ("leg", "new")]
            ),
            Some(f64::from(*n))
        );
    }
    assert_eq!(
        sample(
            &metrics,
            "msr_collector_selections_total",
            &[("outcome", "selected")]
        ),
        Some(f64::from(CALLS + 1))
    );
    assert_eq!(
        sample(
            &metrics,
            "msr_collector_msr_load_percent",
            &[("msr", "msr_2")]
        ),
        Some(40.0)
    );
    assert_eq!(
        sample(&metrics, "msr_collector_msr_active", &[("msr", "msr_3")]),
        Some(0.0)
    );
    assert!(sample(
        &metrics,
        "msr_collector_notifies_total",
        &[("outcome", "accepted")]
    )
    .is_some_and(|n| n >= 3.0));
    assert!(sample(
        &metrics,
        "msr_collector_registers_total",
        &[("status", "200")]
    )
    .is_some_and(|n| n >= 3.0));

    for n in 0..CALLS {
        let (status, body) = http(
            port,
            "POST",
            "/v1/release",
            "Content-Type: application/json\r\n",
            &format!("{{\"call_id\":\"call-{n}@core\"}}"),
        )
        .await;
        assert_eq!(
            (status, json(&body)["released"].as_u64()),
            (200, Some(1)),
            "{body}"
        );
    }
    let (status, body) = http(
        port,
        "POST",
        "/v1/release",
        "",
        "{\"call_id\":\"call-0@core\"}",
    )
    .await;
    assert_eq!(
        (status, json(&body)["released"].as_u64()),
        (200, Some(0)),
        "a repeated release is harmless"
    );
    let metrics = scrape(port).await;
    for msr in ["msr_1", "msr_2", "msr_3"] {
        assert_eq!(
            sample(&metrics, "msr_collector_msr_live_legs", &[("msr", msr)]),
            Some(0.0),
            "{msr}"
        );
    }
    assert_eq!(
        sample(&metrics, "msr_collector_released_legs_total", &[]),
        Some(f64::from(CALLS))
    );
    match collector.ok(&Request::MsrList {}).await {
        ResponseData::Msrs { msrs } => assert!(msrs.iter().all(|m| m.live_legs == 0), "{msrs:?}"),
        other => panic!("{other:?}"),
    }
    let (_, body) = http(port, "GET", "/v1/resources", "", "").await;
    assert_eq!(
        json(&body)["rows"].as_array().map(Vec::len),
        Some(3),
        "{body}"
    );

    // A select that names no leg places nothing and is drawn on the HTTP
    // thread from the copy the loop publishes (SPEC §11, settled): the
    // change above is in it, and it is counted as the loop counts.
    const LEGLESS: u32 = 100;
    for _ in 0..LEGLESS {
        let (status, body) = http(port, "GET", "/v1/select?zone=default&site=local", "", "").await;
        assert_eq!(status, 200, "{body}");
        let answer = json(&body);
        assert_ne!(
            answer["msr"], "msr_3",
            "an inactive msr is drawn by no one: {body}"
        );
        assert!(answer["leg"].is_null(), "{body}");
    }
    let metrics = scrape(port).await;
    assert_eq!(
        sample(
            &metrics,
            "msr_collector_selections_total",
            &[("outcome", "selected")]
        ),
        Some(f64::from(CALLS + 1 + LEGLESS))
    );
    assert_eq!(
        sample(&metrics, "msr_collector_msr_live_legs", &[("msr", "msr_1")]),
        Some(0.0),
        "a select without a leg places none"
    );

    // Bad input: 400/404/405 with {"code","message"}, never a panic.
    let long = "x".repeat(100 * 1024);
    for (method, path, body, status, code) in [
        (
            "GET",
            "/v1/select?zone=default&site=local&colour=red",
            "",
            400,
            "bad_request",
        ),
        (
            "GET",
            "/v1/select?zone=default&site=local&random=lots",
            "",
            400,
            "bad_request",
        ),
        (
            "GET",
            "/v1/select?zone=default&site=nowhere",
            "",
            400,
            "unknown_site",
        ),
        (
            "GET",
            "/v1/select?zone=elsewhere&site=local",
            "",
            503,
            "msr_not_found",
        ),
        ("POST", "/v1/release", "{\"call\":1}", 400, "bad_request"),
        ("POST", "/v1/release", "not json", 400, "bad_request"),
        ("POST", "/v1/release", "[\"c1\"]", 400, "bad_request"),
        (
            "GET",
            "/v1/select?zone=%ff%fe&site=local",
            "",
            400,
            "bad_request",
        ),
        ("POST", "/v1/release", long.as_str(), 400, "bad_request"),
        ("GET", "/v2/anything", "", 404, "not_found"),
        ("DELETE", "/v1/select", "", 405, "method_not_allowed"),
        // Routes that take no parameters refuse a query string.
        ("GET", "/v1/resources?x=1", "", 400, "bad_request"),
        ("GET", "/health?x=1", "", 400, "bad_request"),
        ("GET", "/metrics?x=1", "", 400, "bad_request"),
    ] {
        let (got, text) = http(port, method, path, "", body).await;
        let answer = json(&text);
        assert_eq!(
            (got, answer["code"].as_str()),
            (status, Some(code)),
            "{method} {path}: {text}"
        );
        assert!(
            answer["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{text}"
        );
    }
    // No zone or site: the collector's `[defaults]` (zone `default`, site
    // `local`), where the three MSRs are.
    let (got, text) = http(port, "GET", "/v1/select", "", "").await;
    assert_eq!(
        (got, json(&text)["kind"].as_str()),
        (200, Some("selected")),
        "{text}"
    );
    // A HEAD changes nothing: as a GET, this select would place a leg.
    let (got, _) = http(
        port,
        "HEAD",
        "/v1/select?zone=default&site=local&call_id=head-1@core",
        "",
        "",
    )
    .await;
    assert_eq!(got, 405, "HEAD /v1/select");
    let (got, body) = http(
        port,
        "POST",
        "/v1/release",
        "",
        "{\"call_id\":\"head-1@core\"}",
    )
    .await;
    assert_eq!(
        (got, json(&body)["released"].as_u64()),
        (200, Some(0)),
        "{body}"
    );
    // A select with a malformed zone is refused as such, not "no MSR".
    let (got, body) = http(port, "GET", "/v1/select?zone=a+b&site=local", "", "").await;
    assert_eq!(
        (got, json(&body)["code"].as_str()),
        (400, Some("invalid_value")),
        "{body}"
    );
    let metrics = scrape(port).await;
    assert_eq!(
        sample(
            &metrics,
            "msr_collector_selections_total",
            &[("outcome", "msr_not_found")]
        ),
        Some(1.0)
    );
    // Prometheus asks for OpenMetrics and gets it (counter families named
    // without `_total`, `# EOF` last); without that Accept the text format
    // above, which promtool checked.
    let (status, om) = http(
        port,
        "GET",
        "/metrics",
        "Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n",
        "",
    )
    .await;
    assert_eq!(status, 200, "{om}");
    assert!(
        om.ends_with("# EOF\n") && om.contains("# TYPE msr_collector_selections counter\n"),
        "{om}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redirect_server_answers_302_to_the_chosen_engine_one_leg_per_call_id() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (collector, _agents, http_port, redirect_port, _) = system(dir.path()).await;
    const CALLS: u32 = 100;
    let args: Vec<String> = [
        "-sf",
        &sipp_scenario("redirect_uac.xml").display().to_string(),
        "-i",
        "127.0.0.1",
        "-p",
        &free_udp_port().to_string(),
        "-m",
        &CALLS.to_string(),
        "-r",
        "50",
        "-timeout",
        "30s",
        &format!("127.0.0.1:{redirect_port}"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (code, out) = run_sipp(&args, Duration::from_secs(60))
        .await
        .expect("sipp");
    assert_eq!(code, 0, "sipp: {out}");
    let legs: u32 = match collector.ok(&Request::MsrList {}).await {
        ResponseData::Msrs { msrs } => msrs.iter().map(|m| m.live_legs).sum(),
        other => panic!("{other:?}"),
    };
    assert_eq!(legs, CALLS, "one live leg per Call-ID");
    let metrics = scrape(http_port).await;
    assert_eq!(
        sample(
            &metrics,
            "msr_collector_redirect_responses_total",
            &[("status", "302")]
        ),
        Some(f64::from(CALLS))
    );
}

/// Sends `text` to the redirect server from `socket` and returns the next
/// datagram it answers (at most 10 s).
pub(crate) async fn exchange(socket: &tokio::net::UdpSocket, to: u16, text: &str) -> String {
    socket
        .send_to(text.as_bytes(), ("127.0.0.1", to))
        .await
        .expect("send");
    let mut buf = vec![0u8; 65_536];
    let (n, _) = tokio::time::timeout(Duration::from_secs(10), socket.recv_from(&mut buf))
        .await
        .expect("an answer within 10 s")
        .expect("recv");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// RFC 3261 §17.2.1/§9.2 for a stateless redirect server: a retransmitted
/// INVITE gets the same 302 again (the same bytes), a CANCEL for the
/// answered INVITE gets 200 and changes nothing, one matching no INVITE
/// gets 481, and the ACK is absorbed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redirect_server_resends_its_302_and_answers_cancel_as_rfc_3261_says() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (collector, _agents, _http_port, redirect_port, _) = system(dir.path()).await;
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = socket.local_addr().expect("addr").port();
    let message = |method: &str, branch: &str| {
        format!(
            "{method} sip:park@127.0.0.1:{redirect_port} SIP/2.0\r\n\
             Via: SIP/2.0/UDP 127.0.0.1:{port};branch={branch}\r\n\
             Max-Forwards: 70\r\n\
             From: <sip:alice@127.0.0.1>;tag=f1\r\n\
             To: <sip:park@127.0.0.1>\r\n\
             Call-ID: cancel-test@core\r\n\
             CSeq: 1 {method}\r\n\
             Content-Length: 0\r\n\r\n"
        )
    };
    let invite = message("INVITE", "z9hG4bK-cancel-1");
    let first = exchange(&socket, redirect_port, &invite).await;
    assert!(first.starts_with("SIP/2.0 302 "), "{first}");
    let again = exchange(&socket, redirect_port, &invite).await;
    assert_eq!(again, first, "a retransmission gets the same bytes");
    let cancel = exchange(
        &socket,
        redirect_port,
        &message("CANCEL", "z9hG4bK-cancel-1"),
    )
    .await;
    assert!(cancel.starts_with("SIP/2.0 200 "), "{cancel}");
    assert!(cancel.contains("CSeq: 1 CANCEL"), "{cancel}");
    // The ACK of the 302 gets nothing; the next answer is the 481 to a
    // CANCEL whose branch matches no INVITE.
    socket
        .send_to(
            message("ACK", "z9hG4bK-cancel-1").as_bytes(),
            ("127.0.0.1", redirect_port),
        )
        .await
        .expect("send ack");
    let stray = exchange(&socket, redirect_port, &message("CANCEL", "z9hG4bK-none")).await;
    assert!(stray.starts_with("SIP/2.0 481 "), "{stray}");
    // One selection for the INVITE and its retransmission; the CANCEL
    // released nothing.
    let legs: u32 = match collector.ok(&Request::MsrList {}).await {
        ResponseData::Msrs { msrs } => msrs.iter().map(|m| m.live_legs).sum(),
        other => panic!("{other:?}"),
    };
    assert_eq!(legs, 1);
    // RFC 3261 §18.2.2: without `rport` in the Via the answer goes to the
    // Via's sent-by port, not to the datagram's source port.
    let via_socket = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let via_port = via_socket.local_addr().expect("addr").port();
    let options = message("OPTIONS", "z9hG4bK-via-port").replace(
        &format!("127.0.0.1:{port};"),
        &format!("127.0.0.1:{via_port};"),
    );
    socket
        .send_to(options.as_bytes(), ("127.0.0.1", redirect_port))
        .await
        .expect("send options");
    let mut buf = vec![0u8; 65_536];
    let (n, _) = tokio::time::timeout(Duration::from_secs(10), via_socket.recv_from(&mut buf))
        .await
        .expect("the answer on the Via's port within 10 s")
        .expect("recv");
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(answer.starts_with("SIP/2.0 200 "), "{answer}");
}

/// A collector whose redirect server listens on a port of its choosing,
/// with `section` added to `[redirect]`, and that port.
async fn with_redirect(dir: &std::path::Path, section: &str) -> (Collector, u16) {
    let extra = format!("[redirect]\nlisten = \"127.0.0.1:0\"\n{section}");
    let collector = Collector::start_with(dir, "core1", &CollectorOpts::default(), &extra).await;
    let redirect_port = collector.redirect_port.expect("the redirect port");
    (collector, redirect_port)
}

/// RFC 3261 §8.2.1: a request with a method neither SIP listener knows
/// (`FOO`, which the SIP parser refuses) is answered `501 Not Implemented`
/// with the listener's `Allow`, on the collector's SIP port and on the
/// redirect server's; one without a Call-ID stays unanswered (malformed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_method_gets_501_with_allow_on_both_sip_listeners() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (collector, redirect_port) = with_redirect(dir.path(), "").await;
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = socket.local_addr().expect("addr").port();
    for (to, allow) in [
        (collector.port, "REGISTER, NOTIFY, OPTIONS"),
        (redirect_port, "INVITE, ACK, CANCEL, OPTIONS"),
    ] {
        let foo = |call_id: &str| {
            format!(
                "FOO sip:x@127.0.0.1:{to} SIP/2.0\r\n\
                 v: SIP/2.0/UDP 127.0.0.1:{port};branch=z9hG4bK-foo-{to};rport\r\n\
                 Max-Forwards: 70\r\n\
                 From: <sip:probe@127.0.0.1>;tag=f1\r\n\
                 To: <sip:x@127.0.0.1>\r\n\
                 {call_id}\
                 CSeq: 1 FOO\r\n\
                 Content-Length: 0\r\n\r\n"
            )
        };
        // Without a Call-ID it is dropped: the next answer is the 501 to
        // the FOO that follows it.
        socket
            .send_to(foo("").as_bytes(), ("127.0.0.1", to))
            .await
            .expect("send");
        let call_id = format!("foo-{to}@test");
        let answer = exchange(&socket, to, &foo(&format!("Call-ID: {call_id}\r\n"))).await;
        assert!(
            answer.starts_with("SIP/2.0 501 Not Implemented\r\n"),
            "port {to}: {answer}"
        );
        for line in [
            format!("Allow: {allow}"),
            format!("Call-ID: {call_id}"),
            "CSeq: 1 FOO".to_owned(),
            "From: <sip:probe@127.0.0.1>;tag=f1".to_owned(),
            "Content-Length: 0".to_owned(),
        ] {
            assert!(
                answer.contains(&format!("\r\n{line}\r\n")),
                "port {to}: {line:?} in {answer}"
            );
        }
        assert!(
            answer.contains("\r\nTo: <sip:x@127.0.0.1>;tag="),
            "port {to}: {answer}"
        );
    }
}

/// `[redirect] transports = ["udp", "tcp"]`: an INVITE over TCP gets its
/// 302 back on the same connection, framed by its `Content-Length` (RFC
/// 3261 §18.3), and a CANCEL on it finds the answered INVITE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redirect_server_answers_over_tcp_on_the_same_connection() {
    use msr_shared::sip::wire::{Frame, StreamFramer};
    let dir = tempfile::tempdir().expect("tempdir");
    let (collector, redirect_port) =
        with_redirect(dir.path(), "transports = [\"udp\", \"tcp\"]\n").await;
    let spec = AgentSpec {
        accounts: vec![AccountSpec::new("msr_1", &collector)],
        engine_port: free_udp_port(),
        ..AgentSpec::default()
    };
    let _agent = Agent::start(dir.path(), "msr_1", &spec, 10);
    collector
        .wait_rows(Duration::from_secs(15), |rows| {
            live_row(rows, "msr_1", Some(10)).map(|_| ())
        })
        .await
        .expect("msr_1 live");
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", redirect_port))
        .await
        .expect("the redirect server listens on tcp on its port");
    let local = stream.local_addr().expect("addr");
    let message = |method: &str| {
        format!(
            "{method} sip:park@127.0.0.1:{redirect_port} SIP/2.0\r\n\
             Via: SIP/2.0/TCP {local};branch=z9hG4bK-tcp-1\r\n\
             Max-Forwards: 70\r\n\
             From: <sip:alice@127.0.0.1>;tag=f1\r\n\
             To: <sip:park@127.0.0.1>\r\n\
             Call-ID: redirect-over-tcp@core\r\n\
             CSeq: 1 {method}\r\n\
             Content-Length: 0\r\n\r\n"
        )
    };
    let mut framer = StreamFramer::new();
    let mut buf = vec![0u8; 4096];
    let mut next = async |stream: &mut tokio::net::TcpStream, framer: &mut StreamFramer| loop {
        if let Some(Frame::Message(bytes)) = framer.next_frame().expect("sip") {
            return String::from_utf8_lossy(&bytes).into_owned();
        }
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
            .await
            .expect("an answer within 10 s")
            .expect("read");
        assert!(n > 0, "the redirect server closed the connection");
        framer.push(&buf[..n]);
    };
    stream
        .write_all(message("INVITE").as_bytes())
        .await
        .expect("write");
    let answer = next(&mut stream, &mut framer).await;
    assert!(answer.starts_with("SIP/2.0 302 "), "{answer}");
    assert!(answer.contains("Content-Length: 0\r\n"), "{answer}");
    stream
        .write_all(message("CANCEL").as_bytes())
        .await
        .expect("write");
    let cancel = next(&mut stream, &mut framer).await;
    assert!(
        cancel.starts_with("SIP/2.0 200 ") && cancel.contains("CSeq: 1 CANCEL"),
        "{cancel}"
    );
    let legs: u32 = match collector.ok(&Request::MsrList {}).await {
        ResponseData::Msrs { msrs } => msrs.iter().map(|m| m.live_legs).sum(),
        other => panic!("{other:?}"),
    };
    assert_eq!(legs, 1, "one leg, placed by the INVITE over tcp");
}
