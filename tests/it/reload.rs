//! SPEC §13 reload: `SIGHUP` re-reads the collector's TOML. What can change
//! live does (here `[defaults] zone`: the contacts without an override
//! move, and the redirect server places an INVITE that names no zone in
//! the new one), what needs a restart is named in a warning (`[sip] listen`), and
//! a file that does not validate changes nothing.

use std::time::Duration;

use system_tests::system::{live_row, AccountSpec, Agent, AgentSpec, Collector};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

async fn wait_log(collector: &Collector, needle: &str) {
    assert!(
        collector.wait_log(0, &[needle], secs(10)).await,
        "no `{needle}` in\n{}",
        collector.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_what_it_can_names_what_needs_a_restart_and_refuses_a_bad_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (collector, redirect_port) = Collector::start_with_redirect(dir.path(), "core1").await;
    let spec = AgentSpec {
        accounts: vec![AccountSpec::new("msr_1", &collector)],
        ..AgentSpec::default()
    };
    let _agent = Agent::start(dir.path(), "msr_1", &spec, 10);
    collector
        .wait_rows(secs(15), |rows| {
            live_row(rows, "msr_1", Some(10)).map(|_| ())
        })
        .await
        .expect("msr_1 live");
    let original = std::fs::read_to_string(&collector.config).expect("config");

    // A live change: [defaults] zone.
    let zoned = original.replace("zone = \"default\"", "zone = \"east\"");
    assert_ne!(zoned, original);
    std::fs::write(&collector.config, &zoned).expect("write");
    collector.hup();
    wait_log(&collector, "configuration reloaded").await;
    // Each value the reload changed is on record (SPEC §16).
    wait_log(
        &collector,
        "reload changed key=\"defaults.zone\" from=default to=east",
    )
    .await;
    collector
        .wait_rows(secs(5), |rows| {
            rows.iter()
                .any(|r| r.msr == "msr_1" && r.zone == "east")
                .then_some(())
        })
        .await
        .expect("msr_1's contact moved to the new default zone");
    // The redirect server reads `[defaults]` from the core: an INVITE that
    // names no zone is placed in `east`, where msr_1 now is.
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = socket.local_addr().expect("addr").port();
    let invite = format!(
        "INVITE sip:park@127.0.0.1:{redirect_port} SIP/2.0\r\n\
         Via: SIP/2.0/UDP 127.0.0.1:{port};branch=z9hG4bK-reload-1\r\n\
         Max-Forwards: 70\r\n\
         From: <sip:alice@127.0.0.1>;tag=f1\r\n\
         To: <sip:park@127.0.0.1>\r\n\
         Call-ID: reload-1@core\r\n\
         CSeq: 1 INVITE\r\n\
         Content-Length: 0\r\n\r\n"
    );
    let answer = crate::front_ends::exchange(&socket, redirect_port, &invite).await;
    assert!(
        answer.starts_with("SIP/2.0 302 ") && answer.contains("X-MSR: msr_1"),
        "{answer}"
    );

    // A change that needs a restart: named, and the rest still applies.
    let moved = zoned
        .replace(&format!("127.0.0.1:{}", collector.port), "127.0.0.1:1")
        .replace("zone = \"east\"", "zone = \"west\"");
    std::fs::write(&collector.config, &moved).expect("write");
    collector.hup();
    wait_log(&collector, "restart_needed=sip.listen").await;
    collector
        .wait_rows(secs(5), |rows| {
            rows.iter()
                .any(|r| r.msr == "msr_1" && r.zone == "west")
                .then_some(())
        })
        .await
        .expect("the live part of that reload applied");

    // A file that does not validate changes nothing.
    std::fs::write(
        &collector.config,
        zoned.replace("[defaults]", "[defaults\n"),
    )
    .expect("write");
    collector.hup();
    wait_log(&collector, "config reload failed").await;
    let rows = collector.rows().await.expect("rows");
    assert!(
        rows.iter().any(|r| r.msr == "msr_1" && r.zone == "west"),
        "{rows:?}"
    );
    let (ok, out, err) = collector.msrctl(&["select", "--zone", "west", "--site", "local"]);
    assert!(ok, "{out}{err}");
    // A default site that is not declared is refused (SPEC §16): the
    // contacts stay where legs reach them.
    std::fs::write(
        &collector.config,
        moved.replace("site = \"local\"", "site = \"nowhere\""),
    )
    .expect("write");
    collector.hup();
    wait_log(
        &collector,
        "config reload refused: [defaults] site is not declared",
    )
    .await;
    let (ok, out, err) = collector.msrctl(&["select", "--zone", "west", "--site", "local"]);
    assert!(ok, "{out}{err}");
    assert!(collector.child.is_some(), "still running");
}
