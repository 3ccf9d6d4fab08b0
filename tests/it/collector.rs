//! System tests of msr-collector (SPEC §3, §4, §5, §8): the collector runs
//! in-process (`msr_collector::start`) on 127.0.0.1 with an ephemeral port,
//! a temporary control socket and state file; SIPp plays the MSR (one
//! instance registers, one answers the SUBSCRIBE and sends the NOTIFY), and
//! the test reads the load table through the control socket.

use std::net::UdpSocket;
use std::path::Path;
use std::time::Duration;

use msr_collector::CollectorHandle;
use msr_shared::admin::RegistrationStatus;
use msr_shared::admin::{
    ErrorCode, ExplainOutcome, HealthState, Request, ResourceInfo, Response, ResponseData,
    SelectQuery,
};
use msr_shared::subscription::SubscriptionState;
use system_tests::{
    bin_path, example, example_collector_in, free_udp_port, init_tracing, run_sipp, sipp_scenario,
    wait_for, wait_udp_bound, AdminClient,
};
use tokio_util::sync::CancellationToken;

const LIMIT: Duration = Duration::from_secs(20);

/// Starts a collector on 127.0.0.1:0. SIPp 3.6 only computes MD5 digests
/// and reads the first challenge, so MD5 alone is offered.
async fn collector(dir: &Path, shutdown: &CancellationToken) -> CollectorHandle {
    let text = format!(
        r#"node = "core1@test"
[sip]
listen = "127.0.0.1:0"
realm = "msr.local"
digest_algorithms = ["MD5"]
[[accounts]]
auth_name = "msr"
password = "msr-secret"
[control]
socket = "{}"
[state]
path = "{}"
[http]
listen = "off"
"#,
        dir.join("control.sock").display(),
        dir.join("state.json").display()
    );
    let config = msr_collector::config::parse(&text, "test").expect("test config");
    msr_collector::start(config, shutdown.clone())
        .await
        .expect("collector starts")
}

async fn rows(client: &mut AdminClient) -> Vec<ResourceInfo> {
    match client
        .call(&Request::ResourceList { active_only: false })
        .await
        .expect("resource list")
    {
        Response::Ok(ResponseData::Resources { rows }) => rows,
        other => panic!("unexpected {other:?}"),
    }
}

/// Reads the table every 20 ms until `check` accepts it, for at most [`LIMIT`].
async fn poll_rows<T>(
    client: &mut AdminClient,
    check: impl Fn(&[ResourceInfo]) -> Option<T>,
) -> Option<T> {
    // `wait_for` awaits each check before it starts the next, so the lock
    // is never contended: it only lends the client to one check at a time.
    let client = tokio::sync::Mutex::new(client);
    let (client, check) = (&client, &check);
    wait_for(LIMIT, || async move {
        let mut client = client.lock().await;
        check(&rows(&mut client).await)
    })
    .await
}

fn register_args(collector: std::net::SocketAddr, contact_port: u16, expires: u32) -> Vec<String> {
    [
        collector.to_string(),
        "-sf".into(),
        sipp_scenario("collector_register_uac.xml")
            .display()
            .to_string(),
        "-i".into(),
        "127.0.0.1".into(),
        "-p".into(),
        free_udp_port().to_string(),
        "-s".into(),
        "msr_1".into(),
        "-key".into(),
        "contact_port".into(),
        contact_port.to_string(),
        "-key".into(),
        "expires".into(),
        expires.to_string(),
        "-m".into(),
        "1".into(),
        "-timeout".into(),
        "10s".into(),
        "-timeout_error".into(),
    ]
    .into_iter()
    .collect()
}

/// A NOTIFY from a stranger: unknown Call-ID and tags. Returns the status
/// line of the answer.
fn stray_notify(collector: std::net::SocketAddr) -> String {
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
    socket
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let local = socket.local_addr().expect("addr");
    let body = "msr: msr_1\nload: 99\ncpu: 99\ncalls: 1\nmax-calls: 1\n";
    let msg = format!(
        "NOTIFY sip:collector@{collector} SIP/2.0\r\nVia: SIP/2.0/UDP {local};branch=z9hG4bKstray{}\r\n\
         From: <sip:msr_1@{local}>;tag=stranger\r\nTo: <sip:collector@{collector}>;tag=unknown\r\n\
         Call-ID: stray-{}@elsewhere\r\nCSeq: 1 NOTIFY\r\nMax-Forwards: 70\r\nEvent: eltex-call-count\r\n\
         Subscription-State: active;expires=60\r\nContent-Type: application/x-eltex-call-count\r\n\
         Content-Length: {}\r\n\r\n{body}",
        std::process::id(),
        std::process::id(),
        body.len()
    );
    socket.send_to(msg.as_bytes(), collector).expect("send");
    let mut buf = [0u8; 4096];
    let (n, _) = socket
        .recv_from(&mut buf)
        .expect("an answer to the stray notify");
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sipp_msr_registers_reports_load_and_unregisters() {
    init_tracing();
    let dir = tempfile::tempdir().expect("tempdir");
    let shutdown = CancellationToken::new();
    let handle = collector(dir.path(), &shutdown).await;
    let mut client = AdminClient::connect_retry(&handle.control_socket, LIMIT)
        .await
        .expect("control socket");

    // The MSR's notifier: answers the collector's SUBSCRIBE, sends load 42,
    // then expects the unsubscribe.
    let notifier_port = free_udp_port();
    let notifier_args: Vec<String> = vec![
        "-sf".into(),
        sipp_scenario("collector_notifier_uas.xml")
            .display()
            .to_string(),
        "-i".into(),
        "127.0.0.1".into(),
        "-p".into(),
        notifier_port.to_string(),
        "-s".into(),
        "msr_1".into(),
        "-key".into(),
        "load".into(),
        "42".into(),
        "-m".into(),
        "1".into(),
        "-timeout".into(),
        "15s".into(),
        "-timeout_error".into(),
    ];
    let notifier = tokio::spawn(async move { run_sipp(&notifier_args, LIMIT).await });
    assert!(
        wait_udp_bound(notifier_port, LIMIT).await,
        "sipp notifier did not bind 127.0.0.1:{notifier_port}"
    );

    let (code, out) = run_sipp(&register_args(handle.sip_addr, notifier_port, 60), LIMIT)
        .await
        .expect("sipp");
    assert_eq!(code, 0, "registration failed:\n{out}");

    let row = poll_rows(&mut client, |rows| {
        rows.iter().find(|r| r.load == Some(42)).cloned()
    })
    .await
    .expect("the load from the NOTIFY reaches the table");
    assert_eq!(row.contact, "lo@msr_1");
    assert_eq!(row.msr, "msr_1");
    assert_eq!(row.node, "core1@test");
    assert_eq!(row.version.as_deref(), Some("9.9.9"));
    assert_eq!(row.status, RegistrationStatus::Registered);
    assert_eq!(row.subscription, Some(SubscriptionState::Active));
    assert_eq!(
        (row.cpu, row.calls, row.max_calls),
        (Some(21), Some(303), Some(8192))
    );
    assert!(!row.stale);
    match client
        .call(&Request::SubscriptionList {})
        .await
        .expect("subscription list")
    {
        Response::Ok(ResponseData::Subscriptions { rows }) => {
            assert_eq!(rows.len(), 1);
            assert_eq!(
                (
                    rows[0].expires_secs,
                    rows[0].notify_count,
                    rows[0].status.clone()
                ),
                (60, 1, Some(SubscriptionState::Active))
            );
            assert_eq!(rows[0].event_id.len(), 16);
            assert!(rows[0].last_notify_unix.is_some());
        }
        other => panic!("unexpected {other:?}"),
    }

    // A NOTIFY outside any dialog the collector created: 481, no change.
    let addr = handle.sip_addr;
    let status = tokio::task::spawn_blocking(move || stray_notify(addr))
        .await
        .expect("stray");
    assert!(status.starts_with("SIP/2.0 481"), "{status}");
    let after = rows(&mut client).await;
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].load, Some(42));

    // Unregister: the rows go and the collector ends the subscription.
    let (code, out) = run_sipp(&register_args(handle.sip_addr, notifier_port, 0), LIMIT)
        .await
        .expect("sipp");
    assert_eq!(code, 0, "unregistration failed:\n{out}");
    let gone = poll_rows(&mut client, |rows| rows.is_empty().then_some(())).await;
    assert!(gone.is_some(), "rows removed after Expires: 0");
    let (code, out) = notifier.await.expect("join").expect("sipp notifier");
    assert_eq!(
        code, 0,
        "notifier scenario (subscribe, notify, unsubscribe) failed:\n{out}"
    );

    shutdown.cancel();
    let result = tokio::time::timeout(LIMIT, handle.join)
        .await
        .expect("stops in time")
        .expect("join");
    assert!(result.is_ok(), "{result:?}");
    assert!(
        !handle.control_socket.exists(),
        "control socket removed at shutdown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_refused_and_registers_nothing() {
    init_tracing();
    let dir = tempfile::tempdir().expect("tempdir");
    let shutdown = CancellationToken::new();
    let handle = collector(dir.path(), &shutdown).await;
    let scenario = std::fs::read_to_string(sipp_scenario("collector_register_uac.xml"))
        .expect("scenario")
        .replace("password=msr-secret", "password=wrong")
        .replace("<recv response=\"200\"/>", "<recv response=\"403\"/>");
    let path = dir.path().join("wrong_password.xml");
    std::fs::write(&path, scenario).expect("write scenario");
    let mut args = register_args(handle.sip_addr, free_udp_port(), 60);
    args[2] = path.display().to_string();
    let (code, out) = run_sipp(&args, LIMIT).await.expect("sipp");
    assert_eq!(code, 0, "expected 403:\n{out}");
    let mut client = AdminClient::connect_retry(&handle.control_socket, LIMIT)
        .await
        .expect("control socket");
    assert!(rows(&mut client).await.is_empty());
    shutdown.cancel();
    let _ = tokio::time::timeout(LIMIT, handle.join)
        .await
        .expect("stops in time");
}

/// The real agent against the real collector with the default challenge
/// (SHA-256 first, then MD5): it registers, is subscribed, its load (7 of
/// 100 calls → 7 %) shows, and its shutdown removes the rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_agent_registers_and_reports_load() {
    init_tracing();
    let dir = tempfile::tempdir().expect("tempdir");
    let shutdown = CancellationToken::new();
    let text = format!(
        "node = \"core1@test\"\n[sip]\nlisten = \"127.0.0.1:0\"\nrealm = \"msr.local\"\n\
         [[accounts]]\nauth_name = \"msr\"\npassword = \"msr-secret\"\n[control]\nsocket = \"{}\"\n[state]\npath = \"{}\"\n[http]\nlisten = \"off\"\n",
        dir.path().join("control.sock").display(),
        dir.path().join("state.json").display()
    );
    let config = msr_collector::config::parse(&text, "test").expect("test config");
    assert_eq!(
        config.sip.digest_algorithms[0],
        msr_collector::config::DigestAlgorithm::Sha256
    );
    let handle = msr_collector::start(config, shutdown.clone())
        .await
        .expect("collector starts");
    let xml = format!(
        r#"<?xml version="1.0" encoding="utf-8"?>
<config date="00:00:00 01.01.2025">
    <general log-level="3" max-calls="100" load-sensor="calls" load-delta="5"/>
    <transport bind-addr="127.0.0.1" port="5090" transport="udp+tcp"/>
    <media port-start="20000" port-range="1000"/>
    <accounts><dynamic msr_name="msr_7" realm="sip:{}" auth_name="msr" auth_password="msr-secret" dtmf_mode="rfc"/></accounts>
    <pbyte><mcc bind-addr="127.0.0.1" port="5700"/></pbyte>
    <agent sip-port="0" register-expires="60" max-subscription-expires="3600" calls-source="fixed:7" notify-min-interval-ms="1000" sample-interval-ms="200"/>
</config>
"#,
        handle.sip_addr
    );
    let agent_config =
        msr_agent::config::parse(&xml, Path::new("agent.xml")).expect("agent config");
    let agent_shutdown = CancellationToken::new();
    let agent = msr_agent::start(agent_config, None, agent_shutdown.clone())
        .await
        .expect("agent starts");
    let mut client = AdminClient::connect_retry(&handle.control_socket, LIMIT)
        .await
        .expect("control socket");
    let row = poll_rows(&mut client, |rows| {
        rows.iter()
            .find(|r| {
                r.msr == "msr_7"
                    && r.load.is_some()
                    && r.subscription == Some(SubscriptionState::Active)
            })
            .cloned()
    })
    .await
    .expect("the agent's load reaches the table");
    assert_eq!(row.contact, "lo@msr_7");
    assert_eq!(row.load, Some(7));
    assert_eq!(row.subscription, Some(SubscriptionState::Active));
    assert_eq!(row.version.as_deref(), Some(env!("CARGO_PKG_VERSION")));
    // SPEC §3: the media engine's addresses came with the REGISTER, and a
    // selection answers them: the core parks the leg on the engine, not on
    // the agent.
    assert_eq!(row.engine_uri.as_deref(), Some("sip:127.0.0.1:5090"));
    assert_eq!(row.mcc.as_deref(), Some("127.0.0.1:5700"));
    let selected = client
        .call(&Request::Select(SelectQuery::new("default", "local")))
        .await
        .expect("select");
    match selected {
        msr_shared::admin::Response::Ok(msr_shared::admin::ResponseData::Selected(s)) => {
            assert_eq!(s.engine_uri.as_deref(), Some("sip:127.0.0.1:5090"));
            assert_eq!(s.mcc.as_deref(), Some("127.0.0.1:5700"));
            assert_eq!(
                s.uri,
                format!(
                    "sip:msr_7@{}{}",
                    agent.local_addr,
                    ";engine=127.0.0.1:5090;engine-transport=udp+tcp;mcc=127.0.0.1:5700"
                )
            );
        }
        other => panic!("{other:?}"),
    }

    agent_shutdown.cancel();
    let _ = tokio::time::timeout(LIMIT, agent.join)
        .await
        .expect("agent stops in time");
    let gone = poll_rows(&mut client, |rows| rows.is_empty().then_some(())).await;
    assert!(gone.is_some(), "agent shutdown unregisters");
    shutdown.cancel();
    let _ = tokio::time::timeout(LIMIT, handle.join)
        .await
        .expect("collector stops in time");
}

/// `msr-collector --check-config`, as an operator runs it before a deploy:
/// the loopback example is ok; a config whose control socket directory is
/// missing on this host is reported with the file, the key and the path.
#[test]
fn check_config_names_the_file_and_what_the_host_lacks() {
    let ok = std::process::Command::new(bin_path("msr-collector"))
        .arg("--config")
        .arg(example("collector.toml"))
        .arg("--check-config")
        .output()
        .expect("run msr-collector");
    assert!(ok.status.success(), "{ok:?}");
    assert!(String::from_utf8_lossy(&ok.stdout)
        .contains("collector.toml: ok, msr-collector would start on this host"));

    let dir = tempfile::tempdir().expect("tempdir");
    let text = std::fs::read_to_string(example("collector.toml")).expect("example");
    let missing = dir.path().join("no-such-dir").join("control.sock");
    let text = text
        .replace(
            "/tmp/msr-collector.sock",
            missing.to_str().expect("utf-8 path"),
        )
        .replace(
            "/tmp/msr-collector-state.json",
            dir.path()
                .join("no-store-dir")
                .join("state.json")
                .to_str()
                .expect("utf-8 path"),
        );
    let config = dir.path().join("collector.toml");
    std::fs::write(&config, text).expect("write config");
    let out = std::process::Command::new(bin_path("msr-collector"))
        .arg("--config")
        .arg(&config)
        .arg("--check-config")
        .output()
        .expect("run msr-collector");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    // Both reasons at once: one run of the check names all it finds.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{}: msr-collector would not start on this host (2 reasons):\n  error: ",
            config.display()
        )) && stderr.contains("[control] socket")
            && stderr.contains("no-such-dir does not exist")
            && stderr.contains("no-store-dir: does not exist"),
        "{stderr}"
    );
}

/// `--check-config` checks that the listen addresses are this host's
/// (SPEC §13): a `[redirect] listen` on another host's address is a reason
/// not to start (exit 1), named with its key.
#[test]
fn check_config_refuses_a_listen_address_that_is_not_this_hosts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = example_collector_in(dir.path());
    let config = dir.path().join("collector.toml");
    // RFC 5737 TEST-NET-1: no host has it.
    std::fs::write(
        &config,
        format!("{text}\n[redirect]\nlisten = \"192.0.2.10:5062\"\n"),
    )
    .expect("write config");
    let out = std::process::Command::new(bin_path("msr-collector"))
        .arg("--config")
        .arg(&config)
        .arg("--check-config")
        .output()
        .expect("run msr-collector");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{}: msr-collector would not start on this host (1 reason):\n  error: [redirect] listen = \"192.0.2.10:5062\": 192.0.2.10 is not an address of this host\n",
            config.display()
        )),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "{out:?}");
}

/// SPEC §16: `--check-config` refuses a `[defaults] site` the operator
/// store does not declare (a reload would be refused), naming the sites it
/// does declare; an empty store (a first start, which declares it) passes.
#[test]
fn check_config_refuses_a_default_site_the_store_does_not_declare() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state.json");
    let text = example_collector_in(dir.path()).replace("site = \"local\"", "site = \"nowhere\"");
    let config = dir.path().join("collector.toml");
    std::fs::write(&config, text).expect("write config");
    let check = || {
        std::process::Command::new(bin_path("msr-collector"))
            .arg("--config")
            .arg(&config)
            .arg("--check-config")
            .output()
            .expect("run msr-collector")
    };
    let out = check();
    assert_eq!(out.status.code(), Some(0), "an empty store: {out:?}");
    let mut operator = msr_collector::operator::OperatorConfig::new();
    operator.declare_site("local").expect("declare");
    msr_collector::operator::store::Store::new(state.clone())
        .save(&operator)
        .expect("save store");
    let out = check();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("[defaults] site \"nowhere\" is not declared in the operator store")
            && stderr.contains("(declared: local)")
            && stderr.contains("msrctl site declare nowhere"),
        "{stderr}"
    );
}

/// SPEC §5: an MSR that registers and never reports (nothing answers at
/// its contact: no SUBSCRIBE answer, no NOTIFY, no keepalive answer) is
/// `unreported` after the 2 s grace, then `unreachable`; selection refuses
/// with `msr_unhealthy` rather than place a leg on it, and `--explain`
/// names the state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_msr_that_never_reports_gets_no_selection_after_the_grace() {
    init_tracing();
    let dir = tempfile::tempdir().expect("tempdir");
    let shutdown = CancellationToken::new();
    let handle = collector(dir.path(), &shutdown).await;
    let mut client = AdminClient::connect_retry(&handle.control_socket, LIMIT)
        .await
        .expect("control socket");
    // A contact port nothing listens on.
    let silent_port = free_udp_port();
    let (code, out) = run_sipp(&register_args(handle.sip_addr, silent_port, 300), LIMIT)
        .await
        .expect("sipp");
    assert_eq!(code, 0, "registration failed:\n{out}");
    let registered = std::time::Instant::now();
    let select = Request::Select(SelectQuery {
        explain: true,
        ..SelectQuery::new("default", "local")
    });
    let unreported = poll_rows(&mut client, |rows| {
        rows.iter()
            .find(|r| r.msr == "msr_1" && r.health == HealthState::Unreported)
            .cloned()
    })
    .await
    .expect("unreported after the grace");
    let after = registered.elapsed();
    assert!(after >= Duration::from_millis(1500), "{after:?}");
    assert_eq!(unreported.status, RegistrationStatus::Registered);
    match client.call(&select).await.expect("select") {
        Response::Err(body) => {
            assert_eq!(body.code, ErrorCode::MsrUnhealthy, "{body:?}");
            let explain = body.explain.expect("explain");
            assert_eq!(explain.candidates.len(), 1);
            assert_eq!(explain.candidates[0].outcome, ExplainOutcome::Unreported);
        }
        other => panic!("selected an msr that never reported: {other:?}"),
    }
    // The keepalives go unanswered too: unreachable within a few intervals.
    let unreachable = poll_rows(&mut client, |rows| {
        rows.iter()
            .find(|r| r.msr == "msr_1" && r.health == HealthState::Unreachable)
            .cloned()
    })
    .await;
    assert!(
        unreachable.is_some(),
        "unreachable once the keepalives are missed"
    );
    eprintln!(
        "never-reporting msr: unreported {after:?} after registering, unreachable {:?}",
        registered.elapsed()
    );
    // Unregistering stops the keepalives with the binding.
    let (code, out) = run_sipp(&register_args(handle.sip_addr, silent_port, 0), LIMIT)
        .await
        .expect("sipp");
    assert_eq!(code, 0, "unregistration failed:\n{out}");
    let gone = poll_rows(&mut client, |rows| rows.is_empty().then_some(())).await;
    assert!(gone.is_some());
    shutdown.cancel();
    let _ = tokio::time::timeout(LIMIT, handle.join).await;
}

/// A NOTIFY in the dialog of `subscribe` (the collector's SUBSCRIBE,
/// answered with To-tag `to_tag`), sent from `from`.
fn dialog_notify(
    subscribe: &msr_shared::sip::Request,
    to_tag: &str,
    from: std::net::SocketAddr,
    cseq: u32,
    load: u8,
) -> String {
    use msr_shared::sip;
    let h = |name| sip::header(&subscribe.headers, name).unwrap_or_default();
    let collector = sip::addr_uri(h("Contact"));
    let body = format!("msr: msr_1\nload: {load}\ncpu: 1\ncalls: {load}\nmax-calls: 100\n");
    format!(
        "NOTIFY {collector} SIP/2.0\r\nVia: SIP/2.0/UDP {from};branch=z9hG4bK{}\r\n\
         From: {};tag={to_tag}\r\nTo: {}\r\nCall-ID: {}\r\nCSeq: {cseq} NOTIFY\r\nMax-Forwards: 70\r\n\
         Contact: <sip:msr_1@{from}>\r\nEvent: eltex-call-count\r\nSubscription-State: active;expires=60\r\n\
         Content-Type: application/x-eltex-call-count\r\nContent-Length: {}\r\n\r\n{body}",
        sip::random_token(),
        h("To"),
        h("From"),
        h("Call-ID"),
        body.len()
    )
}

/// Reads one datagram on the MSR-side `socket` (within 10 s): a request —
/// the collector's SUBSCRIBE (also kept in `subscribes`), an OPTIONS
/// keepalive — is answered 200, a response is returned.
async fn serve(
    socket: &tokio::net::UdpSocket,
    subscribes: &mut Vec<msr_shared::sip::Request>,
) -> Option<msr_shared::sip::Response> {
    use msr_shared::sip::{self, SipMessage, StatusCode};
    let mut buf = vec![0u8; 65_535];
    let (n, from) = tokio::time::timeout(Duration::from_secs(10), socket.recv_from(&mut buf))
        .await
        .expect("a datagram within 10 s")
        .expect("recv");
    let text = String::from_utf8_lossy(&buf[..n]).to_string();
    let r = match SipMessage::try_from(text.as_str()).expect("sip message") {
        SipMessage::Response(r) => return Some(r),
        SipMessage::Request(r) => r,
    };
    let mut ok = sip::response(&r, StatusCode::OK, Some("msr-tag"));
    if r.method == sip::Method::Subscribe {
        sip::push_header(&mut ok.headers, "Expires", "60");
        let me = socket.local_addr().expect("addr");
        sip::push_header(&mut ok.headers, "Contact", format!("<sip:msr_1@{me}>"));
        subscribes.push(r);
    }
    sip::set_header(&mut ok.headers, "Content-Length", "0");
    socket
        .send_to(ok.to_string().as_bytes(), from)
        .await
        .expect("answer");
    None
}

/// The next SIP response on `socket`, answering requests meanwhile
/// ([`serve`]).
async fn next_response(
    socket: &tokio::net::UdpSocket,
    subscribes: &mut Vec<msr_shared::sip::Request>,
) -> msr_shared::sip::Response {
    loop {
        if let Some(r) = serve(socket, subscribes).await {
            return r;
        }
    }
}

/// `msrctl --json resource list`: the load of msr_1.
fn msrctl_load(socket: &Path) -> Option<u64> {
    let (ok, out, err) = system_tests::system::msrctl(socket, &["--json", "resource", "list"]);
    assert!(ok, "msrctl failed: {err}");
    let value: serde_json::Value = serde_json::from_str(&out).expect("json");
    let rows = value["rows"].as_array().cloned().unwrap_or_default();
    rows.iter()
        .find(|r| r["msr"] == "msr_1")
        .and_then(|r| r["load"].as_u64())
}

/// SPEC §4: a NOTIFY with the live dialog's Call-ID, both tags and a
/// higher CSeq, sent from another address than the one the collector
/// subscribed to, gets 403; the load msrctl shows does not move, and the
/// next genuine NOTIFY (with a lower CSeq than the forgery's) is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoofed_notify_gets_403_and_changes_nothing() {
    use msr_shared::sip::StatusCode;
    init_tracing();
    let dir = tempfile::tempdir().expect("tempdir");
    let shutdown = CancellationToken::new();
    let handle = collector(dir.path(), &shutdown).await;
    AdminClient::connect_retry(&handle.control_socket, LIMIT)
        .await
        .expect("control socket");
    // The MSR's notifier: this socket is its registered contact.
    let msr = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let msr_addr = msr.local_addr().expect("addr");
    let (code, out) = run_sipp(&register_args(handle.sip_addr, msr_addr.port(), 60), LIMIT)
        .await
        .expect("sipp");
    assert_eq!(code, 0, "registration failed:\n{out}");
    let mut subscribes = Vec::new();
    while subscribes.is_empty() {
        serve(&msr, &mut subscribes).await;
    }
    let subscribe = subscribes.remove(0);
    let collector_addr = handle.sip_addr;
    let genuine = |cseq, load| dialog_notify(&subscribe, "msr-tag", msr_addr, cseq, load);
    msr.send_to(genuine(1, 55).as_bytes(), collector_addr)
        .await
        .expect("send");
    let r = next_response(&msr, &mut subscribes).await;
    assert_eq!(r.status_code, StatusCode::OK);
    let socket = handle.control_socket.clone();
    let seen = system_tests::wait_for(LIMIT, || {
        let socket = socket.clone();
        async move { (msrctl_load(&socket) == Some(55)).then_some(()) }
    })
    .await;
    assert!(seen.is_some(), "the genuine load 55 shows");

    // The forgery: same dialog, CSeq 100, load 79, from another port.
    let spoofer = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let forged = dialog_notify(
        &subscribe,
        "msr-tag",
        spoofer.local_addr().expect("addr"),
        100,
        79,
    );
    spoofer
        .send_to(forged.as_bytes(), collector_addr)
        .await
        .expect("send");
    let r = next_response(&spoofer, &mut Vec::new()).await;
    assert_eq!(r.status_code, StatusCode::Forbidden);
    assert_eq!(
        msrctl_load(&handle.control_socket),
        Some(55),
        "load unchanged"
    );

    // The next genuine NOTIFY, CSeq 2 < 100: accepted.
    msr.send_to(genuine(2, 60).as_bytes(), collector_addr)
        .await
        .expect("send");
    let r = next_response(&msr, &mut subscribes).await;
    assert_eq!(r.status_code, StatusCode::OK, "the dialog is not poisoned");
    let seen = system_tests::wait_for(LIMIT, || {
        let socket = socket.clone();
        async move { (msrctl_load(&socket) == Some(60)).then_some(()) }
    })
    .await;
    assert!(seen.is_some(), "the genuine load 60 shows");

    shutdown.cancel();
    let _ = tokio::time::timeout(LIMIT, handle.join)
        .await
        .expect("stops in time");
}

/// NOTIFYs in bursts over UDP, as `msr-loadgen notify --batched` offers
/// them at a collector's ceiling (BENCHMARKS.md): 200 MSRs register and
/// are subscribed, then send 2,000 NOTIFYs a second in bursts of a
/// millisecond's worth (sendmmsg), for 3 s, without retransmitting. Each
/// is answered 200, none is lost, and every row shows its MSR's last
/// load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_notifies_over_udp_are_each_answered_and_the_last_load_shows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let collector = system_tests::system::Collector::start(
        dir.path(),
        "batched",
        &system_tests::system::CollectorOpts::default(),
    )
    .await;
    let stdout = collector
        .loadgen_notify(collector.port, 2000, &["--batched"])
        .await;
    assert!(stdout.contains("lost (no answer)          0"), "{stdout}");
}
