//! What the real daemons write to their logs when strangers send them bad
//! datagrams: every value escaped (no raw control character reaches the
//! log), and a burst gives a bounded number of lines plus the count of the
//! others (SPEC §12; `msr_shared::logging`).

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::time::Duration;

use system_tests::system::{Agent, AgentSpec, Collector, CollectorOpts};
use system_tests::{addr, wait_for};

const LIMIT: Duration = Duration::from_secs(15);

/// The Call-ID of the input: an ANSI colour sequence.
const ESC_CALL_ID: &str = "ESCTEST\u{1b}[31mRED";

/// The same, as the log must show it.
const ESC_ESCAPED: &str = "ESCTEST\\u{1b}[31mRED";

/// The raw bytes of a log (colour sequences left in: none may be there).
fn raw_log(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_default()
}

fn lines(path: &Path) -> usize {
    raw_log(path).split(|b| *b == b'\n').count() - 1
}

/// A request from `from` to `to` with `call_id` (no body).
fn request(method: &str, from: SocketAddr, to: SocketAddr, call_id: &str, n: u32) -> Vec<u8> {
    format!(
        "{method} sip:msr@{to} SIP/2.0\r\nVia: SIP/2.0/UDP {from};branch=z9hG4bKlog{n}\r\n\
         From: <sip:msr_1@{from}>;tag=stranger{n}\r\nTo: <sip:collector@{to}>;tag=unknown\r\n\
         Call-ID: {call_id}\r\nCSeq: {n} {method}\r\nMax-Forwards: 70\r\n\
         Contact: <sip:msr_1@{from}>\r\nEvent: eltex-call-count\r\nExpires: 60\r\n\
         Subscription-State: active;expires=60\r\nContent-Length: 0\r\n\r\n"
    )
    .into_bytes()
}

/// Sends the burst to `to`: 1,000 requests without a From tag
/// (RFC 3261 §8.1.1.3 makes it mandatory), 1,000 datagrams of garbage, and
/// 1,000 `method` requests from a stranger, each with its own Call-ID.
/// Returns once the daemon answered one more `method` sent after them all
/// (so it has read the burst).
fn burst(to: SocketAddr, method: &str) {
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let from = socket.local_addr().expect("addr");
    for n in 0..1_000u32 {
        let untagged = String::from_utf8(request(
            "OPTIONS",
            from,
            to,
            &format!("untagged-{n}"),
            n + 1,
        ))
        .expect("utf-8")
        .replace(&format!(";tag=stranger{}", n + 1), "");
        let _ = socket.send_to(untagged.as_bytes(), to);
        let garbage = format!("\u{1b}[2J garbage {n} \0\r\n\r\n");
        let _ = socket.send_to(garbage.as_bytes(), to);
        let _ = socket.send_to(&request(method, from, to, &format!("flood-{n}"), n + 1), to);
    }
    // From another address: the burst's own has used its admission.
    let last = UdpSocket::bind("127.0.0.2:0").expect("bind");
    let from = last.local_addr().expect("addr");
    // Again until answered: the agent answers strangers at a bounded rate,
    // which the burst has used up for a moment.
    last.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("read timeout");
    let deadline = std::time::Instant::now() + LIMIT;
    let mut buf = [0u8; 4096];
    loop {
        last.send_to(&request(method, from, to, "last", 1), to)
            .expect("send");
        if last.recv_from(&mut buf).is_ok() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no answer after the burst"
        );
    }
}

/// The agent's SIP address, from its `listening on udp` line.
async fn agent_addr(agent: &Agent) -> SocketAddr {
    wait_for(LIMIT, || async {
        let text = agent.log_text();
        let line = text.lines().find(|l| l.contains("listening on udp "))?;
        let a = addr(
            line.split("listening on udp ")
                .nth(1)?
                .split_whitespace()
                .next()?,
        );
        (a.port() != 0).then_some(a)
    })
    .await
    .unwrap_or_else(|| panic!("agent did not log its address\n{}", agent.log_text()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_id_with_escape_sequences_is_logged_escaped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut collector = Collector::start(dir.path(), "c", &CollectorOpts::default()).await;
    let to = SocketAddr::from(([127, 0, 0, 1], collector.port));
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let from = socket.local_addr().expect("addr");
    socket
        .send_to(&request("NOTIFY", from, to, ESC_CALL_ID, 1), to)
        .expect("send");
    // A REGISTER with it, and with the escape in its user name, that the
    // registrar refuses (no such account).
    let register = String::from_utf8(request("REGISTER", from, to, ESC_CALL_ID, 2))
        .expect("utf-8")
        .replace(
            "\r\nContent-Length",
            "\r\nAuthorization: Digest username=\"\u{1b}[2Jmsr\", realm=\"msr.local\", \
             nonce=\"x\", uri=\"sip:msr.local\", response=\"00\"\r\nContent-Length",
        );
    socket.send_to(register.as_bytes(), to).expect("send");
    let logged = wait_for(LIMIT, || async {
        let text = collector.log_text();
        (text.contains("notify refused") && text.contains("registration refused")).then_some(())
    })
    .await;
    assert!(
        logged.is_some(),
        "no refusal logged\n{}",
        collector.log_text()
    );
    collector.terminate();
    let raw = raw_log(&collector.log);
    assert!(!raw.contains(&0x1b), "a raw ESC in the collector's log");
    let text = String::from_utf8_lossy(&raw);
    assert!(text.contains(ESC_ESCAPED), "{text}");
    assert!(text.contains("\\u{1b}[2Jmsr"), "{text}");

    // The agent: a SUBSCRIBE with that Call-ID from a host that is none of
    // its registrars (refused, and logged).
    let mut agent = Agent::start(dir.path(), "a", &AgentSpec::default(), 0);
    let to = agent_addr(&agent).await;
    socket
        .send_to(&request("SUBSCRIBE", from, to, ESC_CALL_ID, 1), to)
        .expect("send");
    socket.set_read_timeout(Some(LIMIT)).expect("read timeout");
    let mut buf = [0u8; 4096];
    let (n, _) = socket
        .recv_from(&mut buf)
        .expect("an answer to the SUBSCRIBE");
    assert!(buf[..n].starts_with(b"SIP/2.0 "), "{:?}", &buf[..n]);
    agent.terminate();
    let raw = raw_log(&agent.log);
    assert!(!raw.contains(&0x1b), "a raw ESC in the agent's log");
    let text = String::from_utf8_lossy(&raw);
    assert!(
        !text.contains("ESCTEST") || text.contains(ESC_ESCAPED),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_bad_datagrams_gives_a_bounded_number_of_log_lines() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut collector = Collector::start(dir.path(), "c", &CollectorOpts::default()).await;
    let before = lines(&collector.log);
    burst(SocketAddr::from(([127, 0, 0, 1], collector.port)), "NOTIFY");
    // Stopping logs what the limit still held back.
    let status = collector.terminate();
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    check_bounded("collector", &collector.log, before);

    let mut agent = Agent::start(dir.path(), "a", &AgentSpec::default(), 0);
    let to = agent_addr(&agent).await;
    let before = lines(&agent.log);
    burst(to, "SUBSCRIBE");
    let status = agent.terminate();
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    check_bounded("agent", &agent.log, before);
}

/// 2,000 bad datagrams gave at most a few dozen lines, and the daemon
/// logged how many it held back.
fn check_bounded(who: &str, log: &Path, before: usize) {
    let raw = raw_log(log);
    let text = String::from_utf8_lossy(&raw);
    let after = lines(log) - before;
    eprintln!("{who}: {after} log lines for the burst\n{text}");
    assert!(
        after <= 30,
        "{who}: {after} lines for 2,000 bad datagrams\n{text}"
    );
    assert!(
        text.contains("log lines suppressed"),
        "{who}: no suppressed count\n{text}"
    );
    assert!(!raw.contains(&0x1b), "{who}: a raw ESC in the log");
}

/// SPEC §13 (issue 44: refusals say why): an agent whose credentials the
/// collector refuses logs the collector's reason, not a bare `403
/// Forbidden`; the collector's log names which credential it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_registration_says_why_on_both_sides() {
    let dir = tempfile::tempdir().expect("tempdir");
    let collector = Collector::start(dir.path(), "core1", &CollectorOpts::default()).await;
    let spec = AgentSpec {
        accounts: vec![system_tests::system::AccountSpec::new("msr_1", &collector)],
        auth_password: "not-the-secret".into(),
        ..AgentSpec::default()
    };
    let agent = Agent::start(dir.path(), "msr_1", &spec, 10);
    assert!(
        system_tests::system::wait_log_lines(
            &agent.log,
            0,
            &["registration failed", "403 Forbidden (credentials refused"],
            Duration::from_secs(15),
        )
        .await,
        "{}",
        String::from_utf8_lossy(&raw_log(&agent.log))
    );
    assert!(
        collector
            .wait_log(0, &["wrong_password"], Duration::from_secs(5))
            .await,
        "{}",
        collector.log_text()
    );
}
