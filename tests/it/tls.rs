//! SIP over TLS between agent and collector (SPEC §4, RFC 3261 §26), with
//! the real binaries and certificates made for the test: an agent
//! registers to a `sips:` realm over mutual TLS, the collector subscribes
//! over that connection and the load reports come back over it; a wrong
//! CA, a missing client certificate, a client certificate that names
//! another MSR, an expired server certificate and a registration over UDP
//! when TLS is required each change nothing and say why in a log line;
//! 200 MSRs on held TLS and TCP connections report without a loss.

use std::time::Duration;

use msr_shared::admin::RegistrationStatus;
use system_tests::pki::{Pki, ServerCert};
use system_tests::system::{live_row, AccountSpec, Agent, AgentSpec, Collector, CollectorOpts};

const LIMIT: Duration = Duration::from_secs(20);

fn tls_opts() -> CollectorOpts {
    CollectorOpts {
        tls: true,
        ..CollectorOpts::default()
    }
}

/// A collector on TLS and TCP with `pki`'s valid server certificate, and
/// `extra` TOML after its `[sip.tls]`.
async fn tls_and_tcp_collector(dir: &std::path::Path, pki: &Pki, extra: &str) -> Collector {
    let opts = CollectorOpts {
        tcp: true,
        ..tls_opts()
    };
    let toml = format!(
        "{}\n{extra}",
        pki.collector_toml(ServerCert::Valid, false, false)
    );
    Collector::start_with(dir, "core1", &opts, &toml).await
}

fn spec(msr: &str, realm: String, attributes: String) -> AgentSpec {
    AgentSpec {
        accounts: vec![AccountSpec {
            msr: msr.to_owned(),
            realm,
        }],
        agent_attributes: attributes,
        register_expires: 30,
        ..AgentSpec::default()
    }
}

/// Whether `msr` is in the table as registered.
async fn registered(collector: &Collector, msr: &str) -> bool {
    collector.rows().await.is_some_and(|rows| {
        rows.iter()
            .any(|r| r.msr == msr && r.status == RegistrationStatus::Registered)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_reports_over_mutual_tls_and_a_peer_without_the_right_certificate_changes_nothing()
{
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::create(dir.path());
    let collector = Collector::start_with(
        dir.path(),
        "core1",
        &tls_opts(),
        &pki.collector_toml(ServerCert::Valid, true, true),
    )
    .await;
    let realm = collector.tls_realm();

    // The agent with the CA and its client certificate: registered,
    // subscribed and reporting, all over its one TLS connection.
    let good = Agent::start(
        dir.path(),
        "good",
        &spec(
            "msr_tls",
            realm.clone(),
            pki.agent_attributes(&pki.ca, true),
        ),
        10,
    );
    let row = collector
        .wait_rows(LIMIT, |rows| {
            live_row(rows, "msr_tls", Some(10)).map(|r| r.uri.clone())
        })
        .await
        .unwrap_or_else(|| panic!("msr_tls live over tls:\n{}", good.log_text()));
    assert!(row.starts_with("sips:msr_tls@"), "a sips: contact: {row}");
    good.set_calls(60);
    collector
        .wait_rows(LIMIT, |rows| {
            live_row(rows, "msr_tls", Some(60)).map(|_| ())
        })
        .await
        .expect("a load change arrives over the tls connection");

    // An agent that trusts another CA refuses the collector's certificate.
    let wrong_ca = Agent::start(
        dir.path(),
        "wrong-ca",
        &spec(
            "msr_wrong_ca",
            realm.clone(),
            pki.agent_attributes(&pki.other_ca, true),
        ),
        10,
    );
    // An agent without a client certificate: the collector refuses the
    // handshake.
    let anonymous = Agent::start(
        dir.path(),
        "anonymous",
        &spec(
            "msr_anonymous",
            realm.clone(),
            pki.agent_attributes(&pki.ca, false),
        ),
        10,
    );
    // An agent with msr_tls's certificate that registers another MSR:
    // the certificate does not name it, 403.
    let impostor = Agent::start(
        dir.path(),
        "impostor",
        &spec(
            "msr_other",
            realm.clone(),
            pki.agent_attributes(&pki.ca, true),
        ),
        10,
    );
    // An agent over UDP while the collector takes registrations over TLS
    // only: 403.
    let clear = Agent::start(
        dir.path(),
        "clear",
        &spec("msr_clear", collector.realm(), String::new()),
        10,
    );
    // Each says why. With TLS 1.3 the client learns that its missing
    // certificate was refused only from the server's alert, after its
    // REGISTER left: the stream logs the alert, and the REGISTER fails
    // when the connection closes, well before Timer F (32 s; LIMIT is
    // less).
    for (agent, why) in [
        (
            &wrong_ca,
            "the peer's certificate is not issued by a trusted CA (UnknownIssuer)",
        ),
        (&anonymous, "CertificateRequired"),
        (
            &anonymous,
            "the registrar closed the tls connection before answering",
        ),
        (&clear, "403 Forbidden"),
        (&impostor, "403 Forbidden"),
    ] {
        assert!(
            agent.wait_log(0, &[why], LIMIT).await,
            "{}: `{why}` is logged:\n{}",
            agent.name,
            agent.log_text()
        );
    }
    let log = collector.log_text();
    assert!(
        log.contains("sip tls connection refused"),
        "the collector logs the refused handshake:\n{log}"
    );
    assert!(
        log.contains("sip.tls.require"),
        "the collector logs the registration refused over udp:\n{log}"
    );
    assert!(
        log.contains("register refused: the client certificate does not name this msr"),
        "the collector logs the certificate that names another msr:\n{log}"
    );
    for msr in ["msr_wrong_ca", "msr_anonymous", "msr_clear", "msr_other"] {
        assert!(
            !registered(&collector, msr).await,
            "{msr} is not registered"
        );
    }
    assert!(
        live_row(&collector.rows().await.expect("rows"), "msr_tls", Some(60)).is_some(),
        "the good agent is untouched"
    );
}

/// The agent checks the collector's certificate (RFC 5922 §7.2): an
/// expired one, and one for another host's name, are refused with the
/// reason in the log, and nothing registers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_or_wrong_name_server_certificate_is_refused_by_the_agent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::create(dir.path());
    for (server, name, why) in [
        (ServerCert::Expired, "expired", "expired"),
        (ServerCert::WrongName, "wrong_name", "not valid for name"),
    ] {
        let collector = Collector::start_with(
            dir.path(),
            &format!("core-{name}"),
            &tls_opts(),
            &pki.collector_toml(server, false, false),
        )
        .await;
        let msr = format!("msr_{name}");
        let agent = Agent::start(
            dir.path(),
            &format!("agent-{name}"),
            &spec(
                &msr,
                collector.tls_realm(),
                pki.agent_attributes(&pki.ca, false),
            ),
            10,
        );
        assert!(
            agent.wait_log(0, &["registration failed"], LIMIT).await,
            "a failed registration is logged:\n{}",
            agent.log_text()
        );
        let log = agent.log_text().to_ascii_lowercase();
        assert!(log.contains(why), "the agent says why ({why}):\n{log}");
        // Issue 44: the dates in UTC, said once, not rustls's Unix seconds.
        assert!(!log.contains("(unix)"), "{log}");
        if server == ServerCert::Expired {
            assert!(
                log.contains("the peer's certificate expired on ")
                    && log.contains("z (checked at "),
                "{log}"
            );
        }
        assert!(!registered(&collector, &msr).await);
    }
}

/// `client_ca` added by a reload: the name check comes on with the
/// handshake's demand for a client certificate, so an agent that shows
/// another MSR's certificate is refused from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_adds_client_ca_turns_the_name_check_on_with_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::create(dir.path());
    let collector = Collector::start_with(
        dir.path(),
        "core1",
        &tls_opts(),
        &pki.collector_toml(ServerCert::Valid, false, false),
    )
    .await;
    let realm = collector.tls_realm();
    // Without client_ca the collector asks for no client certificate.
    let before = Agent::start(
        dir.path(),
        "before",
        &spec(
            "msr_before",
            realm.clone(),
            pki.agent_attributes(&pki.ca, true),
        ),
        10,
    );
    collector
        .wait_rows(LIMIT, |rows| {
            live_row(rows, "msr_before", Some(10)).map(|_| ())
        })
        .await
        .unwrap_or_else(|| panic!("msr_before live:\n{}", before.log_text()));

    let text = std::fs::read_to_string(&collector.config).expect("config");
    let mutual = text.replace(
        "[sip.tls]\n",
        &format!("[sip.tls]\nclient_ca = \"{}\"\n", pki.ca.display()),
    );
    assert_ne!(text, mutual);
    std::fs::write(&collector.config, mutual).expect("write");
    collector.hup();
    let reloaded = system_tests::wait_for(LIMIT, || {
        let log = collector.log_text();
        async move {
            log.lines()
                .any(|l| {
                    l.contains("sip tls certificate files read again") && l.contains("mutual=true")
                })
                .then_some(())
        }
    })
    .await;
    assert!(reloaded.is_some(), "{}", collector.log_text());

    // msr_tls's certificate, registering another MSR: refused now.
    let impostor = Agent::start(
        dir.path(),
        "impostor",
        &spec(
            "msr_other",
            realm.clone(),
            pki.agent_attributes(&pki.ca, true),
        ),
        10,
    );
    let good = Agent::start(
        dir.path(),
        "good",
        &spec("msr_tls", realm, pki.agent_attributes(&pki.ca, true)),
        10,
    );
    collector
        .wait_rows(LIMIT, |rows| {
            live_row(rows, "msr_tls", Some(10)).map(|_| ())
        })
        .await
        .unwrap_or_else(|| panic!("msr_tls live over mutual tls:\n{}", good.log_text()));
    assert!(
        impostor.wait_log(0, &["403 Forbidden"], LIMIT).await,
        "{}",
        impostor.log_text()
    );
    assert!(!registered(&collector, "msr_other").await);
}

/// Connections that never begin their handshake, more than the collector
/// has connection slots: they take turns in the handshake slots and the
/// MSR's connection still gets through at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_handshakes_do_not_lock_an_msr_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::create(dir.path());
    let collector = Collector::start_with(
        dir.path(),
        "core1",
        &tls_opts(),
        &pki.collector_toml(ServerCert::Valid, true, false),
    )
    .await;
    let port = collector.tls_port.expect("tls port");
    let mut stalled = Vec::new();
    for _ in 0..1_100 {
        if let Ok(stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            stalled.push(stream);
        }
    }
    assert!(
        collector
            .wait_log(0, &["handshake given up: newer ones took its slot"], LIMIT)
            .await,
        "{}",
        collector.log_text()
    );
    let agent = Agent::start(
        dir.path(),
        "agent",
        &spec(
            "msr_tls",
            collector.tls_realm(),
            pki.agent_attributes(&pki.ca, true),
        ),
        10,
    );
    collector
        .wait_rows(LIMIT, |rows| {
            live_row(rows, "msr_tls", Some(10)).map(|_| ())
        })
        .await
        .unwrap_or_else(|| panic!("msr_tls live:\n{}", agent.log_text()));
    drop(stalled);
}

/// A registrar that accepts the connection and never answers the
/// ClientHello: the agent gives the connection up with that cause instead
/// of waiting forever, and tries again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registrar_that_never_finishes_the_handshake_is_given_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::create(dir.path());
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = silent.local_addr().expect("addr").port();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            open.push(stream);
        }
    });
    let agent = Agent::start(
        dir.path(),
        "agent",
        &spec(
            "msr_tls",
            format!("sips:127.0.0.1:{port}"),
            pki.agent_attributes(&pki.ca, true),
        ),
        10,
    );
    assert!(
        agent
            .wait_log(0, &["not established within 10 s"], Duration::from_secs(40))
            .await,
        "{}",
        agent.log_text()
    );
    held.abort();
}

/// A collector killed with `kill -9` and started again: the agent sees its
/// TLS connection close and REGISTERs again over a new one at once, so the
/// collector, which can't reach a `sips:` contact by itself, has it
/// subscribed and reporting again within seconds, not at the refresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_collector_restart_an_agent_over_tls_is_back_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::create(dir.path());
    let mut collector = Collector::start_with(
        dir.path(),
        "core1",
        &tls_opts(),
        &pki.collector_toml(ServerCert::Valid, true, false),
    )
    .await;
    let mut long = spec(
        "msr_tls",
        collector.tls_realm(),
        pki.agent_attributes(&pki.ca, true),
    );
    // The refresh is far away: only the closed connection brings it back.
    long.register_expires = 300;
    let agent = Agent::start(dir.path(), "agent", &long, 10);
    collector
        .wait_rows(LIMIT, |rows| {
            live_row(rows, "msr_tls", Some(10)).map(|_| ())
        })
        .await
        .unwrap_or_else(|| panic!("msr_tls live over tls:\n{}", agent.log_text()));
    collector.kill9();
    collector.spawn().await;
    let restarted = std::time::Instant::now();
    agent.set_calls(30);
    collector
        .wait_rows(LIMIT, |rows| {
            live_row(rows, "msr_tls", Some(30)).map(|_| ())
        })
        .await
        .unwrap_or_else(|| {
            panic!(
                "msr_tls back after the restart:\n{}\n{}",
                agent.log_text(),
                collector.log_text()
            )
        });
    println!(
        "msr_tls reporting again {:.2} s after the collector's restart",
        restarted.elapsed().as_secs_f64()
    );
    // The close brought it back: noticed while registered, or, when the
    // kill came before the 200 left (it waits for the bindings' save,
    // the SUBSCRIBE does not), as the REGISTER in flight failing at once.
    assert!(
        agent.log_count(&["the connection to the registrar closed: registering again"])
            + agent.log_count(&["the registrar closed the tls connection before answering"])
            >= 1,
        "{}",
        agent.log_text()
    );
}

/// `[redirect] transports` with `"tls"`: a softswitch that trusts the
/// collector's CA sends its INVITE over TLS and gets the 302 back on that
/// connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redirect_server_answers_an_invite_over_tls() {
    use msr_shared::sip::wire::{Frame, StreamFramer};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::create(dir.path());
    let extra = format!(
        "{}[redirect]\nlisten = \"127.0.0.1:0\"\ntransports = [\"udp\", \"tls\"]\ntls_listen = \"127.0.0.1:0\"\n",
        pki.collector_toml(ServerCert::Valid, false, false)
    );
    let collector = Collector::start_with(dir.path(), "core1", &tls_opts(), &extra).await;
    let agent = Agent::start(
        dir.path(),
        "agent",
        &spec(
            "msr_tls",
            collector.tls_realm(),
            pki.agent_attributes(&pki.ca, false),
        ),
        10,
    );
    collector
        .wait_rows(LIMIT, |rows| {
            live_row(rows, "msr_tls", Some(10)).map(|_| ())
        })
        .await
        .unwrap_or_else(|| panic!("msr_tls live:\n{}", agent.log_text()));
    let needle = "redirect server listening on tls ";
    let port: u16 = collector
        .log_text()
        .lines()
        .find_map(|l| {
            l.split(needle)
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse::<std::net::SocketAddr>()
                .ok()
        })
        .map(|a| a.port())
        .expect("the redirect server's tls port announced");

    let connector = system_tests::pki::connector(&pki.ca).expect("tls client");
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let local = tcp.local_addr().expect("addr");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    let mut stream = connector.connect(name, tcp).await.expect("tls handshake");
    let invite = format!(
        "INVITE sip:park@127.0.0.1:{port} SIP/2.0\r\n\
         Via: SIP/2.0/TLS {local};branch=z9hG4bK-tls-1\r\n\
         Max-Forwards: 70\r\n\
         From: <sips:alice@127.0.0.1>;tag=f1\r\n\
         To: <sips:park@127.0.0.1>\r\n\
         Call-ID: redirect-over-tls@core\r\n\
         CSeq: 1 INVITE\r\n\
         Content-Length: 0\r\n\r\n"
    );
    stream.write_all(invite.as_bytes()).await.expect("write");
    stream.flush().await.expect("flush");
    let mut framer = StreamFramer::new();
    let mut buf = vec![0u8; 4096];
    let answer = loop {
        if let Some(Frame::Message(bytes)) = framer.next_frame().expect("sip") {
            break String::from_utf8_lossy(&bytes).into_owned();
        }
        let n = tokio::time::timeout(LIMIT, stream.read(&mut buf))
            .await
            .expect("an answer in time")
            .expect("read");
        assert!(n > 0, "closed");
        framer.push(&buf[..n]);
    };
    assert!(answer.starts_with("SIP/2.0 302 "), "{answer}");
}

/// Many MSRs on held connections, as `msr-loadgen notify` plays them
/// (BENCHMARKS.md measures it at scale): 200 MSRs each register on a TLS
/// connection of its own, are subscribed over it and report; every NOTIFY
/// is answered 200 and every row shows the last load sent. Then the same
/// MSRs over TCP, each moving its binding to its new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_msrs_report_over_held_tls_and_tcp_connections() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::create(dir.path());
    let collector = tls_and_tcp_collector(dir.path(), &pki, "").await;
    let tls = collector.tls_port.expect("the collector listens on tls");
    for (transport, port) in [("tls", tls), ("tcp", collector.port)] {
        let ca = pki.ca.to_string_lossy();
        let stdout = collector
            .loadgen_notify(port, 1000, &["--transport", transport, "--tls-ca", &ca])
            .await;
        assert!(
            stdout.contains(&format!("200 {} connections", transport.to_uppercase())),
            "each MSR on a connection of its own:\n{stdout}"
        );
    }
}

/// TCP and TLS connections are numbered in one sequence (the core keeps
/// its flows by that number): a stranger's plain TCP connection, opened
/// after an MSR's TLS one, gets none of what the collector sends that MSR
/// (its answers, keepalives and SUBSCRIBEs stay on the TLS connection),
/// and the MSR stays healthy when the stranger leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_tcp_connection_never_receives_what_belongs_to_a_tls_one() {
    use tokio::io::AsyncReadExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::create(dir.path());
    let collector = tls_and_tcp_collector(
        dir.path(),
        &pki,
        "[health]\nkeepalive_interval_secs = 1\nkeepalive_timeout_ms = 500\n",
    )
    .await;
    let agent = Agent::start(
        dir.path(),
        "msr_s",
        &spec(
            "msr_s",
            collector.tls_realm(),
            pki.agent_attributes(&pki.ca, false),
        ),
        10,
    );
    collector
        .wait_rows(LIMIT, |rows| live_row(rows, "msr_s", Some(10)).map(|_| ()))
        .await
        .expect("msr_s live over TLS");

    // A few connections: whatever number the MSR's TLS connection got, one
    // of these would have had it too if the two listeners counted apart.
    let mut strangers = Vec::new();
    for _ in 0..8 {
        strangers.push(
            tokio::net::TcpStream::connect(("127.0.0.1", collector.port))
                .await
                .expect("a plain TCP connection"),
        );
    }
    // A report after the strangers connected: its 200 goes back over TLS.
    agent.set_calls(40);
    collector
        .wait_rows(LIMIT, |rows| live_row(rows, "msr_s", Some(40)).map(|_| ()))
        .await
        .expect("the new load reached the table");
    // Three keepalive intervals: OPTIONS to msr_s went out meanwhile, none
    // of them (nor the 200 to its NOTIFY) may arrive here.
    let read_until = tokio::time::Instant::now() + Duration::from_secs(3);
    let mut reads = tokio::task::JoinSet::new();
    for mut stranger in strangers {
        reads.spawn(async move {
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while let Ok(Ok(n)) = tokio::time::timeout_at(read_until, stranger.read(&mut buf)).await
            {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            got
        });
    }
    while let Some(got) = reads.join_next().await {
        let got = got.expect("a reader");
        assert!(
            got.is_empty(),
            "a stranger received: {}",
            String::from_utf8_lossy(&got)
        );
    }
    agent.set_calls(70);
    collector
        .wait_rows(LIMIT, |rows| {
            live_row(rows, "msr_s", Some(70))
                .filter(|r| r.health == msr_shared::admin::HealthState::Healthy)
                .map(|_| ())
        })
        .await
        .expect("msr_s healthy and reporting after the stranger left");
}

/// SPEC §13: `--check-config` refuses a `[sip.tls] cert` peers refuse at
/// every handshake (expired), and warns about one that does not name its
/// specific listen address, saying what it names instead; a valid one for
/// that address passes without a word about it.
#[test]
fn check_config_refuses_an_expired_server_certificate_and_names_a_wrong_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::create(dir.path());
    let text = system_tests::example_collector_in(dir.path())
        .replace("transports = [\"udp\"]", "transports = [\"udp\", \"tls\"]");
    let config = dir.path().join("collector.toml");
    let check = |server: ServerCert| {
        std::fs::write(
            &config,
            format!("{text}\n{}", pki.collector_toml(server, false, false)),
        )
        .expect("write config");
        let out = std::process::Command::new(system_tests::bin_path("msr-collector"))
            .arg("--config")
            .arg(&config)
            .arg("--check-config")
            .output()
            .expect("run msr-collector");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = check(ServerCert::Valid);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("[sip.tls] cert"), "{stderr}");
    let (code, stderr) = check(ServerCert::Expired);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("error: [sip.tls] cert") && stderr.contains("expired on"),
        "{stderr}"
    );
    let (code, stderr) = check(ServerCert::WrongName);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("does not name the listen address 127.0.0.1")
            && stderr.contains("(it names "),
        "{stderr}"
    );
}
