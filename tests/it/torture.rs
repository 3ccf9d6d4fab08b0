//! RFC 4475's torture messages (tests/torture/, byte for byte from the RFC's
//! archive) against every SIP port of the running system: the collector's,
//! its redirect server's and an agent's (SPEC §16). Nothing a peer sends
//! stops a daemon, and every port answers every message as RFC 3261 and
//! RFC 4475 say (`EXPECTED`: one row per message, one status per port),
//! naming itself in `Server`. The table of what each port answered is
//! printed for the record.

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

/// Sends `bytes` to `port` from a fresh socket; the first answer within
/// `wait`, or `None`. A request gets a Via of this socket on top (with
/// `rport`, RFC 3581), so that its answer comes here rather than to the
/// RFC's example hosts; `badbranch` and `inv2543`, whose Via is the point
/// (a branch without the RFC 3261 cookie, or none: RFC 2543 matching,
/// §17.2.3), keep their Via with this socket as the sent-by and no
/// `rport`, so the answer comes here by the Via's port (RFC 3261
/// §18.2.2).
async fn ask(port: u16, name: &str, bytes: &[u8], wait: Duration) -> Option<String> {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.ok()?;
    let local = socket.local_addr().ok()?;
    let is_response = bytes.starts_with(b"SIP/");
    let datagram = match bytes.iter().position(|b| *b == b'\n') {
        _ if name == "badbranch" => String::from_utf8_lossy(bytes)
            .replace("SIP/2.0/UDP 192.0.2.1;", &format!("SIP/2.0/UDP {local};"))
            .into_bytes(),
        _ if name == "inv2543" => String::from_utf8_lossy(bytes)
            .replace(
                "SIP/2.0/UDP iftgw.example.com\r\n",
                &format!("SIP/2.0/UDP {local}\r\n"),
            )
            .into_bytes(),
        Some(end) if !is_response => {
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
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// What each port answers each message (RFC 3261 §8.2's order: the
/// method, then the headers, then the body; RFC 4475's expectations),
/// `-` for nothing: a response to no request of ours, or a message with
/// no request line or no `Via` to answer along. The collector serves
/// REGISTER (401 first), NOTIFY and OPTIONS; the redirect INVITE, ACK,
/// CANCEL and OPTIONS; the agent SUBSCRIBE and OPTIONS (481 to a
/// SUBSCRIBE or INVITE in a dialog it does not have), 405 to the rest.
/// Where RFC 4475 lets a server be liberal and serve (§3.1.2.7 ltgtruri,
/// §3.1.2.10 trws, §3.1.2.12 baddate, §3.1.2.14 badaspec), these do.
const EXPECTED: &str = "\
    wsinv 405 302 481 | intmeth 501 501 501 | esc01 405 302 405 | escnull 401 405 405 | \
    esc02 501 501 501 | lwsdisp 200 200 200 | longreq 405 302 405 | dblreq 401 405 405 | \
    semiuri 200 200 200 | transports 200 200 200 | mpart01 405 405 405 | unreason - - - | \
    noreason - - - | badinv01 400 400 400 | clerr 400 400 400 | ncl 400 400 400 | \
    scalar02 400 400 400 | scalarlg - - - | quotbal 400 400 400 | ltgtruri 405 302 405 | \
    lwsruri 400 400 400 | lwsstart 400 400 400 | trws 200 200 200 | escruri 400 400 400 | \
    baddate 405 302 405 | regbadct 401 405 405 | badaspec 200 200 200 | baddn 400 400 400 | \
    badvers 505 505 505 | mismatch01 400 400 400 | mismatch02 400 400 400 | bigcode - - - | \
    badbranch 200 200 200 | insuf 400 400 400 | unkscm 416 416 416 | novelsc 416 416 416 | \
    unksm2 400 405 405 | bext01 420 420 420 | invut 405 415 405 | regaut01 401 405 405 | \
    multi01 400 400 400 | mcl01 400 400 400 | bcast - - - | zeromf 200 200 200 | \
    cparam01 401 405 405 | cparam02 401 405 405 | regescrt 401 405 405 | sdp01 405 406 405 | \
    inv2543 405 302 405 | test - - -";

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
    let status_of = |answer: &Option<String>| {
        answer
            .as_deref()
            .and_then(|a| a.split(' ').nth(1))
            .unwrap_or("-")
            .to_owned()
    };
    let mut table = String::new();
    for (name, _) in messages() {
        table.push_str(&format!("{name:<11}"));
        for (label, _) in ports {
            let a = status_of(answers.get(&(name.clone(), label)).unwrap_or(&None));
            table.push_str(&format!(" {label}: {a:<4}"));
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
    // SPEC §16: every message, every port, as RFC 3261 and RFC 4475 say.
    let expected: Vec<(&str, Vec<&str>)> = EXPECTED
        .split('|')
        .map(|row| {
            let mut words = row.split_whitespace();
            (words.next().unwrap_or(""), words.collect())
        })
        .collect();
    assert_eq!(expected.len(), messages().len(), "one row per message");
    let mut wrong = Vec::new();
    for (name, statuses) in &expected {
        for ((label, _), want) in ports.iter().zip(statuses) {
            let answer = answers.get(&(name.to_string(), *label)).unwrap_or(&None);
            let got = status_of(answer);
            if got != *want {
                wrong.push(format!("{name} on {label}: {got}, expected {want}"));
            }
            // RFC 3261 §20.35: every answer names the software.
            let server = if *label == "agent" {
                "msr-agent/"
            } else {
                "msr-collector/"
            };
            if let Some(text) = answer {
                if !text.contains(&format!("\r\nServer: {server}")) {
                    wrong.push(format!("{name} on {label}: no Server: {server}"));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}\n{table}", wrong.join("\n"));
    // Method names are case-sensitive (RFC 3261 §7.1): `options` is an
    // extension method, answered 501 as `FOO` is, never served as OPTIONS.
    let lower = "options sip:x@127.0.0.1 SIP/2.0\r\nMax-Forwards: 70\r\n\
        From: <sip:probe@127.0.0.1>;tag=c1\r\nTo: <sip:x@127.0.0.1>\r\n\
        Call-ID: caseless@torture\r\nCSeq: 1 options\r\nContent-Length: 0\r\n\r\n";
    for (label, port) in ports {
        let answer = ask(port, "caseless", lower.as_bytes(), Duration::from_secs(2)).await;
        assert_eq!(
            answer.as_deref().and_then(|a| a.lines().next()),
            Some("SIP/2.0 501 Not Implemented"),
            "options on {label}"
        );
    }
}
