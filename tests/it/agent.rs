//! System tests of msr-agent (SPEC §3, §4): the agent runs in-process
//! (`msr_agent::start`) on 127.0.0.1; SIPp plays the registrar and the
//! subscriber, and an in-process `SipEndpoint` subscriber checks what SIPp
//! cannot easily (calls counted from bound RTP sockets, hot reload,
//! shutdown, robustness against garbage datagrams). Who may subscribe is
//! tested with the real binaries (a foreign host's SUBSCRIBEs, then the
//! real collector's).

use std::collections::VecDeque;
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::time::Duration;

use msr_agent::AgentHandle;
use msr_shared::event_package::{LoadReport, CONTENT_TYPE, EVENT};
use msr_shared::sip::{
    self, Method, Response, SipEndpoint, SipEvent, StatusCode, SubState, SubscriptionStateHeader,
};
use system_tests::{free_udp_port, init_tracing, run_sipp, sipp_scenario, wait_udp_bound};
use tokio_util::sync::CancellationToken;

const LIMIT: Duration = Duration::from_secs(30);

/// The knobs of a test config.
struct Cfg {
    /// The registrar's port (`realm`); a port nobody listens on when the
    /// test is not about registration.
    realm_port: u16,
    /// The registrar's host (`realm`): the only host that may subscribe.
    realm_host: &'static str,
    port_start: u16,
    port_range: u16,
    calls_source: &'static str,
    load_delta: u8,
    sample_ms: u64,
}

impl Default for Cfg {
    fn default() -> Self {
        Self {
            realm_port: free_udp_port(),
            realm_host: "127.0.0.1",
            port_start: 20000,
            port_range: 1000,
            calls_source: "fixed:7",
            load_delta: 5,
            sample_ms: 200,
        }
    }
}

fn config_xml(c: &Cfg) -> String {
    let accounts = format!(
        r#"<accounts><dynamic msr_name="msr_1" realm="sip:{}:{}" auth_name="msr" auth_password="msr-secret" dtmf_mode="rfc"/></accounts>"#,
        c.realm_host, c.realm_port
    );
    format!(
        r#"<?xml version="1.0" encoding="utf-8"?>
<config date="00:00:00 01.01.2025">
    <general log-level="3" max-calls="100" load-sensor="calls" load-delta="{delta}"/>
    <transport bind-addr="127.0.0.1" port="0" transport="udp"/>
    <media port-start="{ps}" port-range="{pr}"/>
    <codec pcma="1"/>
    {accounts}
    <agent register-expires="60" max-subscription-expires="3600" calls-source="{src}" notify-min-interval-ms="1000" sample-interval-ms="{sample}"/>
</config>
"#,
        delta = c.load_delta,
        ps = c.port_start,
        pr = c.port_range,
        src = c.calls_source,
        sample = c.sample_ms,
    )
}

pub(crate) struct Agent {
    pub(crate) handle: AgentHandle,
    pub(crate) shutdown: CancellationToken,
}

impl Agent {
    pub(crate) async fn start(text: &str) -> Agent {
        init_tracing();
        let config =
            msr_agent::config::parse(text, Path::new("test.xml")).expect("valid test config");
        let shutdown = CancellationToken::new();
        let handle = msr_agent::start(config, None, shutdown.clone())
            .await
            .expect("agent starts");
        Agent { handle, shutdown }
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.handle.local_addr
    }

    pub(crate) async fn stop(self) {
        self.shutdown.cancel();
        let result = tokio::time::timeout(Duration::from_secs(5), self.handle.join)
            .await
            .expect("agent stops within 5 s")
            .expect("agent task");
        result.expect("agent ends cleanly");
    }
}

/// An in-process eltex-call-count subscriber on its own endpoint.
pub(crate) struct Subscriber {
    endpoint: SipEndpoint,
    _cancel: CancellationToken,
    notifies: VecDeque<(SubscriptionStateHeader, LoadReport, sip::Request)>,
    responses: VecDeque<(u64, Response)>,
    next_id: u64,
    call_id: String,
    from_tag: String,
    to_tag: Option<String>,
    cseq: u32,
}

impl Subscriber {
    pub(crate) async fn new() -> Subscriber {
        let cancel = CancellationToken::new();
        let endpoint = SipEndpoint::bind(
            "127.0.0.1:0".parse().expect("addr"),
            false,
            "test-subscriber",
            "NOTIFY",
            cancel.clone(),
        )
        .await
        .expect("bind subscriber");
        Subscriber {
            endpoint,
            _cancel: cancel,
            notifies: VecDeque::new(),
            responses: VecDeque::new(),
            next_id: 1,
            call_id: format!("{}@test", sip::random_token()),
            from_tag: sip::random_token(),
            to_tag: None,
            cseq: 0,
        }
    }

    /// Sends a SUBSCRIBE (in the dialog once established) and returns the
    /// final response.
    pub(crate) async fn subscribe(&mut self, agent: SocketAddr, expires: u32) -> Response {
        self.cseq += 1;
        let me = self.endpoint.local_addr();
        let target = format!("sip:msr_1@{agent}");
        let to = match &self.to_tag {
            Some(t) => format!("<{target}>;tag={t}"),
            None => format!("<{target}>"),
        };
        let request = sip::request(
            Method::Subscribe,
            &target,
            vec![
                (
                    "From",
                    format!("<sip:collector@{me}>;tag={}", self.from_tag),
                ),
                ("To", to),
                ("Call-ID", self.call_id.clone()),
                ("CSeq", format!("{} SUBSCRIBE", self.cseq)),
                ("Contact", format!("<sip:collector@{me}>")),
                ("Event", EVENT.to_owned()),
                ("Accept", CONTENT_TYPE.to_owned()),
                ("Expires", expires.to_string()),
                ("Content-Length", "0".to_owned()),
            ],
            Vec::new(),
        )
        .expect("subscribe");
        let id = self.next_id;
        self.next_id += 1;
        self.endpoint
            .send_request(id, request)
            .expect("send subscribe");
        let response = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Some(pos) = self.responses.iter().position(|(i, _)| *i == id) {
                    return self.responses.remove(pos).map(|(_, r)| r);
                }
                self.pump().await;
            }
        })
        .await
        .expect("subscribe answered within 10 s")
        .expect("response");
        if response.status_code == StatusCode::OK && self.to_tag.is_none() {
            self.to_tag = sip::header(&response.headers, "To").and_then(sip::tag);
        }
        response
    }

    /// Handles one endpoint event: NOTIFYs are answered 200 and queued.
    async fn pump(&mut self) {
        match self.endpoint.recv().await {
            Some(SipEvent::Request(tx)) => {
                let request = tx.request().clone();
                let response = sip::response(&request, StatusCode::OK, None);
                tx.respond(response).await;
                if request.method == Method::Notify {
                    let state = sip::header(&request.headers, "Subscription-State")
                        .and_then(SubscriptionStateHeader::parse)
                        .expect("subscription-state");
                    let report = LoadReport::decode(&request.body).expect("notify body");
                    self.notifies.push_back((state, report, request));
                }
            }
            Some(SipEvent::Response { id, response }) => self.responses.push_back((id, response)),
            Some(SipEvent::Failed { id, reason }) => panic!("request {id} failed: {reason}"),
            // UDP only here: no connection closes.
            Some(SipEvent::Closed { .. }) => {}
            None => panic!("subscriber endpoint closed"),
        }
    }

    /// The next NOTIFY matching `pred`, skipping others, within `limit`.
    pub(crate) async fn notify_where(
        &mut self,
        limit: Duration,
        pred: impl Fn(&SubscriptionStateHeader, &LoadReport) -> bool,
    ) -> Option<(SubscriptionStateHeader, LoadReport)> {
        tokio::time::timeout(limit, async {
            loop {
                while let Some((s, r, _)) = self.notifies.pop_front() {
                    if pred(&s, &r) {
                        return (s, r);
                    }
                }
                self.pump().await;
            }
        })
        .await
        .ok()
    }
}

fn sipp_args(scenario: &str, port: u16, remote: Option<SocketAddr>) -> Vec<String> {
    let mut args = Vec::new();
    if let Some(r) = remote {
        args.push(r.to_string());
    }
    args.extend(
        [
            "-sf",
            &sipp_scenario(scenario).to_string_lossy(),
            "-i",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-m",
            "1",
            "-timeout",
            "20s",
            "-timeout_error",
            "-s",
            "msr_1",
        ]
        .map(str::to_owned),
    );
    args
}

/// (a) SIPp as registrar: 401 digest challenge, verified retry, 200, then
/// the `Expires: 0` unregister at shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_registers_with_digest_and_unregisters_at_shutdown() {
    let dir = tempfile::tempdir().expect("tempdir");
    let messages = dir.path().join("sipp-messages.log");
    let sipp_port = free_udp_port();
    let mut args = sipp_args("agent_register_uas.xml", sipp_port, None);
    // SIPp's message trace: what it sent, as it sent it.
    args.extend([
        "-trace_msg".into(),
        "-message_file".into(),
        messages.display().to_string(),
    ]);
    let sipp = tokio::spawn(async move { run_sipp(&args, LIMIT).await });
    assert!(
        wait_udp_bound(sipp_port, Duration::from_secs(10)).await,
        "sipp did not bind 127.0.0.1:{sipp_port}"
    );
    let agent = Agent::start(&config_xml(&Cfg {
        realm_port: sipp_port,
        ..Cfg::default()
    }))
    .await;
    // The unregister only once SIPp has accepted the credentials.
    let accepted = system_tests::wait_for(Duration::from_secs(10), || {
        let sent = std::fs::read_to_string(&messages).unwrap_or_default();
        async move { sent.contains("SIP/2.0 200 OK").then_some(()) }
    })
    .await;
    assert!(accepted.is_some(), "sipp never accepted the register");
    agent.stop().await;
    let (code, out) = sipp.await.expect("sipp task").expect("sipp ran");
    assert_eq!(code, 0, "sipp registrar scenario failed:\n{out}");
}

/// (b) + (d) SIPp as subscriber: 200, NOTIFY with `load:`, then
/// `Expires: 0` → 200 and NOTIFY `terminated;reason=timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sipp_subscribes_gets_notify_and_unsubscribes() {
    let agent = Agent::start(&config_xml(&Cfg::default())).await;
    let args = sipp_args(
        "agent_subscribe_uac.xml",
        free_udp_port(),
        Some(agent.addr()),
    );
    let (code, out) = run_sipp(&args, LIMIT).await.expect("sipp ran");
    assert_eq!(code, 0, "sipp subscriber scenario failed:\n{out}");
    agent.stop().await;
}

/// (c) Another event package → 489 with `Allow-Events`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_event_gets_489() {
    let agent = Agent::start(&config_xml(&Cfg::default())).await;
    let args = sipp_args(
        "agent_bad_event_uac.xml",
        free_udp_port(),
        Some(agent.addr()),
    );
    let (code, out) = run_sipp(&args, LIMIT).await.expect("sipp ran");
    assert_eq!(code, 0, "sipp bad-event scenario failed:\n{out}");
    agent.stop().await;
}

/// Binds UDP sockets on `n` even ports of `[start, start + range)`.
fn bind_even_ports(start: u16, range: u16, n: usize) -> Vec<UdpSocket> {
    (start..start + range)
        .filter(|p| p % 2 == 0)
        .filter_map(|p| UdpSocket::bind(("127.0.0.1", p)).ok())
        .take(n)
        .collect()
}

/// (e) Calls counted from bound RTP sockets rise in the next NOTIFY; at
/// shutdown the subscription ends with `deactivated`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bound_rtp_sockets_raise_calls_and_shutdown_deactivates() {
    // A range below the ephemeral ports, distinct per process.
    let port_start = 24000 + (std::process::id() % 200) as u16 * 20;
    let cfg = Cfg {
        port_start,
        port_range: 20,
        calls_source: "proc",
        load_delta: 1,
        ..Cfg::default()
    };
    let agent = Agent::start(&config_xml(&cfg)).await;
    let mut sub = Subscriber::new().await;
    let resp = sub.subscribe(agent.addr(), 60).await;
    assert_eq!(resp.status_code, StatusCode::OK);
    let (state, first) = sub
        .notify_where(Duration::from_secs(5), |_, _| true)
        .await
        .expect("initial notify");
    assert_eq!(state.state, SubState::Active);
    assert_eq!(first.msr, "msr_1");

    let sockets = bind_even_ports(port_start, 20, 3);
    assert_eq!(sockets.len(), 3, "could not bind test rtp sockets");
    let (_, report) = sub
        .notify_where(Duration::from_secs(10), |_, r| r.calls >= first.calls + 3)
        .await
        .expect("a notify with the new calls");
    assert!(report.load >= 3, "load follows calls: {report:?}");
    assert_eq!(report.max_calls, 100);

    agent.shutdown.cancel();
    let (state, _) = sub
        .notify_where(Duration::from_secs(5), |s, _| {
            s.state == SubState::Terminated
        })
        .await
        .expect("final notify at shutdown");
    assert_eq!(state.reason, Some(sip::TerminationReason::Deactivated));
    let result = tokio::time::timeout(Duration::from_secs(5), agent.handle.join)
        .await
        .expect("agent stops within 5 s")
        .expect("agent task");
    assert!(result.is_ok());
    drop(sockets);
}

/// (f) Garbage datagrams never crash the agent; it still answers a valid
/// SUBSCRIBE afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_datagrams_do_not_hurt() {
    let agent = Agent::start(&config_xml(&Cfg::default())).await;
    let to = agent.addr();
    let sock = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let valid_head = |extra: &str| {
        format!(
            "SUBSCRIBE sip:msr_1@{to} SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bK{}\r\nFrom: <sip:x@127.0.0.1>;tag=1\r\nTo: <sip:msr_1@{to}>\r\n{extra}CSeq: 1 SUBSCRIBE\r\nContact: <sip:x@127.0.0.1:9>\r\nEvent: eltex-call-count\r\nExpires: 60\r\n",
            sip::random_token()
        )
    };
    let mut noise = vec![0u8; 1500];
    for (i, b) in noise.iter_mut().enumerate() {
        *b = (i * 7919 % 251) as u8;
    }
    let datagrams: Vec<Vec<u8>> = vec![
        Vec::new(),
        noise,
        b"SUBSCRIBE sip:msr_1@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:9;bra".to_vec(),
        vec![b'A'; 65_000],
        format!("{}Content-Length: 0\r\n\r\n", valid_head("")).into_bytes(),
        format!(
            "{}Call-ID: cl@test\r\nContent-Length: 500\r\n\r\nshort",
            valid_head("")
        )
        .into_bytes(),
        format!(
            "{}Call-ID: neg@test\r\nContent-Length: -3\r\n\r\n",
            valid_head("")
        )
        .into_bytes(),
        b"SIP/2.0 200 OK\r\n\r\n".to_vec(),
        b"\r\n\r\n".to_vec(),
    ];
    for d in &datagrams {
        let _ = sock.send_to(d, to);
    }
    // 70 KB cannot be one UDP datagram; the send fails locally, which is fine.
    let _ = sock.send_to(&vec![b'B'; 70_000], to);

    let mut sub = Subscriber::new().await;
    let resp = sub.subscribe(to, 60).await;
    assert_eq!(resp.status_code, StatusCode::OK);
    assert!(!agent.handle.join.is_finished());
    agent.stop().await;
}

/// Hot reload (SPEC §2), with the real binary so that its log shows what
/// the watcher did: a broken file is read and refused (its `config reload
/// failed` line is waited for) and the last good config goes on;
/// removing the account ends its subscriptions with `noresource`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_reload_removed_account_ends_with_noresource() {
    use system_tests::system::{AccountSpec, Agent as AgentProcess, AgentSpec};
    let dir = tempfile::tempdir().expect("tempdir");
    let sip_port = free_udp_port();
    let mut spec = AgentSpec {
        // A registrar nobody runs: 127.0.0.1 may subscribe.
        accounts: vec![AccountSpec {
            msr: "msr_1".into(),
            realm: format!("sip:127.0.0.1:{}", free_udp_port()),
        }],
        sip_port,
        ..AgentSpec::default()
    };
    let mut agent = AgentProcess::start(dir.path(), "agent", &spec, 7);
    let addr: SocketAddr = ([127, 0, 0, 1], sip_port).into();
    let mut sub = Subscriber::new().await;
    assert_eq!(sub.subscribe(addr, 60).await.status_code, StatusCode::OK);

    // A broken file changes nothing. Written until the watcher reports it
    // (the watch may still be being set up when the first write lands).
    let before = agent.log_count(&["config reload failed"]);
    let refused = system_tests::wait_for(Duration::from_secs(10), || {
        agent.rewrite_raw("<config><general");
        let agent = &agent;
        async move {
            agent
                .wait_log(
                    before,
                    &["config reload failed"],
                    Duration::from_millis(500),
                )
                .await
                .then_some(())
        }
    })
    .await;
    assert!(
        refused.is_some(),
        "the broken config was never reported:\n{}",
        agent.log_text()
    );
    assert!(agent.running(), "the agent runs on");
    assert_eq!(
        sub.subscribe(addr, 60).await.status_code,
        StatusCode::OK,
        "refresh still works"
    );

    spec.accounts.clear();
    agent.rewrite(&spec);
    let (state, _) = sub
        .notify_where(Duration::from_secs(10), |s, _| {
            s.state == SubState::Terminated
        })
        .await
        .unwrap_or_else(|| {
            panic!(
                "no terminated notify after the reload:\n{}",
                agent.log_text()
            )
        });
    assert_eq!(state.reason, Some(sip::TerminationReason::Noresource));
    let status = agent.terminate().expect("agent exits on SIGTERM");
    assert!(status.success(), "{status}");
}

/// A SUBSCRIBE for `msr_1` at `agent` from `from`, whose NOTIFYs would go to
/// `contact` (the reflection victim).
fn foreign_subscribe(agent: SocketAddr, from: SocketAddr, contact: SocketAddr, i: usize) -> String {
    format!(
        "SUBSCRIBE sip:msr_1@{agent} SIP/2.0\r\nVia: SIP/2.0/UDP {from};branch=z9hG4bKevil{i}\r\n\
         From: <sip:evil@{from}>;tag=evil{i}\r\nTo: <sip:msr_1@{agent}>\r\nCall-ID: evil-{i}@elsewhere\r\n\
         CSeq: 1 SUBSCRIBE\r\nMax-Forwards: 70\r\nContact: <sip:victim@{contact}>\r\n\
         Event: eltex-call-count\r\nAccept: application/x-eltex-call-count\r\nExpires: 3600\r\n\
         Content-Length: 0\r\n\r\n"
    )
}

/// The status line of the next datagram on `socket`, `None` when none
/// came within its read timeout.
fn next_status(socket: &UdpSocket) -> Option<String> {
    let mut buf = [0u8; 8192];
    let (n, _) = socket.recv_from(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf[..n]).to_string();
    Some(text.lines().next().unwrap_or_default().to_owned())
}

/// RFC 6665 §6.1, §6.3, SPEC §4, with the real binaries: 256 SUBSCRIBEs
/// from a host that is not the agent's registrar (127.0.0.2), each naming
/// itself as the NOTIFY target, get 403 (as many as strangers are answered)
/// and no NOTIFY; the registrar —
/// the real collector, started afterwards — still gets its subscription
/// (no slot was taken) and shows the load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_subscribes_get_403_and_leave_the_collector_its_subscription() {
    use system_tests::system::{
        live_row, AccountSpec, Agent as AgentProcess, AgentSpec, Collector, CollectorOpts,
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut collector = Collector::configure(dir.path(), "c", &CollectorOpts::default(), "");
    let sip_port = free_udp_port();
    let spec = AgentSpec {
        accounts: vec![AccountSpec::new("msr_1", &collector)],
        sip_port,
        ..AgentSpec::default()
    };
    let agent = AgentProcess::start(dir.path(), "msr_1", &spec, 42);
    let agent_addr: SocketAddr = ([127, 0, 0, 1], sip_port).into();
    let attacker = UdpSocket::bind("127.0.0.2:0").expect("bind 127.0.0.2");
    attacker
        .set_read_timeout(Some(Duration::from_millis(500)))
        .expect("timeout");
    let me = attacker.local_addr().expect("addr");
    // The first one until the agent is up and answers it.
    let first = system_tests::wait_for(Duration::from_secs(10), || async {
        attacker
            .send_to(
                foreign_subscribe(agent_addr, me, me, 0).as_bytes(),
                agent_addr,
            )
            .ok()?;
        next_status(&attacker)
    })
    .await
    .unwrap_or_else(|| panic!("the agent never answered\n{}", agent.log_text()));
    assert!(first.starts_with("SIP/2.0 403"), "{first}");
    // The rest at once: the agent answers strangers at a bounded rate
    // (a forged source would aim the answers at a victim), so some go
    // unanswered; every answer is a 403.
    for i in 1..256 {
        attacker
            .send_to(
                foreign_subscribe(agent_addr, me, me, i).as_bytes(),
                agent_addr,
            )
            .expect("send");
    }
    let mut answers = 0;
    while let Some(status) = next_status(&attacker) {
        assert!(status.starts_with("SIP/2.0 403"), "{status}");
        answers += 1;
    }
    assert!(answers >= 1, "no stranger was answered");
    collector.spawn().await;
    let row = collector
        .wait_rows(Duration::from_secs(20), |rows| {
            live_row(rows, "msr_1", Some(42)).cloned()
        })
        .await;
    assert!(
        row.is_some(),
        "the collector's subscription did not work\n{}\n{}",
        agent.log_text(),
        collector.log_text()
    );
    // Nothing but answers ever reached the would-be victim.
    attacker
        .set_read_timeout(Some(Duration::from_millis(1)))
        .expect("timeout");
    while let Some(line) = next_status(&attacker) {
        assert!(
            line.starts_with("SIP/2.0 403"),
            "sent to the victim: {line}"
        );
    }
    // 256 refusals, one line (rate limited: the others are counted in a
    // `log lines suppressed` line when the minute is over).
    assert_eq!(
        agent.log_count(&["subscribe refused", "source=127.0.0.2:"]),
        1,
        "{}",
        agent.log_text()
    );
}

/// A realm written as a host name: the agent resolves it (off its loop)
/// and then takes the registrar's SUBSCRIBE from the address it names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registrar_named_by_host_name_may_subscribe_once_resolved() {
    let agent = Agent::start(&config_xml(&Cfg {
        realm_host: "localhost",
        ..Cfg::default()
    }))
    .await;
    let mut sub = Subscriber::new().await;
    let mut last = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    // 403 until `localhost` is resolved, then 200.
    while tokio::time::Instant::now() < deadline {
        let status = sub.subscribe(agent.addr(), 60).await.status_code;
        if status == StatusCode::OK {
            last = Some(status);
            break;
        }
        assert_eq!(status, StatusCode::Forbidden);
        last = Some(status);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(last, Some(StatusCode::OK));
    assert!(sub
        .notify_where(Duration::from_secs(5), |s, _| s.state == SubState::Active)
        .await
        .is_some());
    agent.stop().await;
}
