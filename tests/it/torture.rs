//! RFC 4475's torture messages (tests/torture/, byte for byte from the RFC's
//! archive) against every SIP port of the running system: the collector's,
//! its redirect server's and an agent's (SPEC §16). Nothing a peer sends
//! stops a daemon; on every port an unsupported SIP version gets 505, and
//! a start line whose method the CSeq contradicts, two Content-Lengths or
//! one that is no number or longer than the datagram get 400.
//! The table of what each port answered is printed for the record.

use std::collections::BTreeMap;
use std::time::Duration;

use system_tests::system::live_row;

use crate::front_ends::system;

/// `(name, bytes)` of every message, in the RFC's order.
fn messages() -> Vec<(String, Vec<u8>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("torture");
    let index = std::fs::read_to_string(dir.join("INDEX.tsv")).expect("INDEX.tsv");
    index
        .lines()
        .skip(1)
        .filter_map(|line| line.split('\t').next())
        .map(|name| {
            let bytes = std::fs::read(dir.join(format!("{name}.dat"))).expect("message");
            (name.to_owned(), bytes)
        })
        .collect()
}

/// Sends `bytes` to `port` from a fresh socket; the status line of the
/// first answer within `wait`, or `None`. A request gets a Via of this
/// socket on top (with `rport`, RFC 3581), so that its answer comes here
/// rather than to the RFC's example hosts; `badbranch`, whose Via is the
/// point (RFC 2543 matching), goes as it is (its answer goes to loopback,
/// port 5060, which nobody reads).
async fn ask(port: u16, name: &str, bytes: &[u8], wait: Duration) -> Option<String> {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.ok()?;
    let local = socket.local_addr().ok()?;
    let is_response = bytes.starts_with(b"SIP/");
    let datagram = match bytes.iter().position(|b| *b == b'\n') {
        Some(end) if !is_response && name != "badbranch" => {
            let via = format!("Via: SIP/2.0/UDP {local};branch=z9hG4bK-torture-{name};rport\r\n");
            let mut out = bytes[..=end].to_vec();
            out.extend_from_slice(via.as_bytes());
            out.extend_from_slice(&bytes[end + 1..]);
            out
        }
        _ => bytes.to_vec(),
    };
    socket.send_to(&datagram, ("127.0.0.1", port)).await.ok()?;
    let mut buf = vec![0_u8; 65_535];
    let (n, _) = tokio::time::timeout(wait, socket.recv_from(&mut buf))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    text.lines().next().map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sip_port_survives_rfc_4475_and_answers_what_rfc_3261_requires() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (collector, _agents, _, redirect_port, _) = system(dir.path()).await;
    let rows = collector.rows().await.expect("rows");
    let agent_port: u16 = rows
        .iter()
        .find(|r| r.msr == "msr_1")
        // `sip:msr_1@127.0.0.1:5071;engine=…;mcc=…:5700`: the port before
        // the parameters (the last `:` of the whole URI is the mcc's).
        .and_then(|r| {
            r.uri
                .split(';')
                .next()?
                .rsplit(':')
                .next()
                .map(str::to_owned)
        })
        .and_then(|p| p.trim_end_matches('>').parse().ok())
        .expect("msr_1's contact port");
    let ports = [
        ("collector", collector.port),
        ("redirect", redirect_port),
        ("agent", agent_port),
    ];
    let mut answers: BTreeMap<(String, &str), Option<String>> = BTreeMap::new();
    for (name, bytes) in messages() {
        for (label, port) in ports {
            let answer = ask(port, &name, &bytes, Duration::from_millis(300)).await;
            answers.insert((name.clone(), label), answer);
        }
    }
    let mut table = String::new();
    for (name, _) in messages() {
        table.push_str(&format!("{name:<11}"));
        for (label, _) in ports {
            let a = answers
                .get(&(name.clone(), label))
                .cloned()
                .flatten()
                .map(|l| l.split(' ').take(2).collect::<Vec<_>>().join(" "))
                .unwrap_or_else(|| "-".into());
            table.push_str(&format!(" {label}: {a:<14}"));
        }
        table.push('\n');
    }
    eprintln!("{table}");
    // Nothing stopped a daemon: the three MSRs are still live through
    // their agents, and the collector still answers.
    let still = collector
        .wait_rows(Duration::from_secs(10), |rows| {
            ["msr_1", "msr_2", "msr_3"]
                .iter()
                .all(|m| live_row(rows, m, None).is_some())
                .then_some(())
        })
        .await;
    assert!(still.is_some(), "every MSR still live:\n{table}");
    let (ok, out, err) = collector.msrctl(&["msr", "list"]);
    assert!(ok, "{out}{err}");
    // SPEC §16: 505 to an unsupported version; 400 to a CSeq method that
    // contradicts the start line, to two Content-Lengths and to one that is
    // no number or longer than the datagram — on every port, the agent's
    // `SipEndpoint` included.
    for (label, _) in &ports {
        let status = |name: &str| {
            answers
                .get(&(name.to_owned(), label))
                .cloned()
                .flatten()
                .and_then(|l| l.split(' ').nth(1).map(str::to_owned))
        };
        assert_eq!(
            status("badvers").as_deref(),
            Some("505"),
            "{label}:\n{table}"
        );
        assert_eq!(
            status("mismatch01").as_deref(),
            Some("400"),
            "{label}:\n{table}"
        );
        assert_eq!(status("mcl01").as_deref(), Some("400"), "{label}:\n{table}");
        assert_eq!(status("clerr").as_deref(), Some("400"), "{label}:\n{table}");
        assert_eq!(status("ncl").as_deref(), Some("400"), "{label}:\n{table}");
    }
    let status = |name: &str, label: &str| {
        answers
            .get(&(name.to_owned(), label))
            .cloned()
            .flatten()
            .and_then(|l| l.split(' ').nth(1).map(str::to_owned))
    };
    // The redirect server, a UAS for INVITE (RFC 3261 §8.2.3): a body it
    // does not read gets 415 (§3.3.6), an Accept without SDP 406
    // (§3.3.15); a valid INVITE without the magic cookie (§3.1.1.1) or
    // very long (§3.1.1.7) is served.
    for (name, expected) in [
        ("invut", "415"),
        ("sdp01", "406"),
        ("wsinv", "302"),
        ("longreq", "302"),
    ] {
        assert_eq!(
            status(name, "redirect").as_deref(),
            Some(expected),
            "{name}:\n{table}"
        );
    }
    // Every port answers from the raw head what the parser refuses: an
    // extension method with quoted-pair control characters in its To is
    // valid (§3.1.1.2, 501), an unknown method whose CSeq names another is
    // a 400 (§3.1.2.18).
    for label in ["collector", "redirect", "agent"] {
        for (name, expected) in [("intmeth", "501"), ("mismatch02", "400")] {
            assert_eq!(
                status(name, label).as_deref(),
                Some(expected),
                "{name} on {label}:\n{table}"
            );
        }
    }
    // Method names are case-sensitive (RFC 3261 §7.1): `options` is an
    // extension method, answered 501 as `FOO` is, never served as OPTIONS.
    let lower = "options sip:x@127.0.0.1 SIP/2.0\r\nMax-Forwards: 70\r\n\
        From: <sip:probe@127.0.0.1>;tag=c1\r\nTo: <sip:x@127.0.0.1>\r\n\
        Call-ID: caseless@torture\r\nCSeq: 1 options\r\nContent-Length: 0\r\n\r\n";
    for (label, port) in ports {
        let answer = ask(port, "caseless", lower.as_bytes(), Duration::from_secs(2)).await;
        assert_eq!(
            answer.as_deref(),
            Some("SIP/2.0 501 Not Implemented"),
            "options on {label}"
        );
    }
    // The registrar: an Authorization of an unknown scheme is no
    // credential, so the REGISTER is challenged (§3.3.7).
    assert_eq!(
        status("regaut01", "collector").as_deref(),
        Some("401"),
        "regaut01:\n{table}"
    );
}
