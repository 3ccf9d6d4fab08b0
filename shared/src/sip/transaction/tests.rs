use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::sip::{self, Method, SipMessage, StatusCode};

const LOCAL: &str = "10.0.0.1:5060";
const PEER: &str = "10.0.0.2:5070";

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("addr")
}

fn options(cseq: u32) -> Request {
    sip::request(
        Method::Options,
        "sip:msr_1@10.0.0.2:5070",
        vec![
            ("From", "<sip:collector@10.0.0.1:5060>;tag=a".to_owned()),
            ("To", "<sip:msr_1@10.0.0.2:5070>".to_owned()),
            ("Call-ID", format!("k{cseq}@test")),
            ("CSeq", format!("{cseq} OPTIONS")),
        ],
        Vec::new(),
    )
    .expect("request")
}

fn layer() -> ClientTransactions<u32> {
    ClientTransactions::new(addr(LOCAL), "test/1")
}

/// The request as the peer parses it from the datagram.
fn received(d: &Datagram) -> Request {
    match SipMessage::try_from(d.bytes.as_ref()).expect("parse") {
        SipMessage::Request(r) => r,
        SipMessage::Response(_) => panic!("a request"),
    }
}

fn answer(d: &Datagram, status: StatusCode) -> Response {
    sip::response(&received(d), status, Some("t"))
}

fn drain(l: &mut ClientTransactions<u32>) -> Vec<Datagram> {
    std::iter::from_fn(|| l.poll_transmit()).collect()
}

#[test]
fn a_request_leaves_with_via_branch_rport_and_content_length() {
    let t0 = Instant::now();
    let mut l = layer();
    l.send(t0, 1, addr(PEER), options(1)).expect("send");
    let sent = drain(&mut l);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].to, addr(PEER));
    let text = String::from_utf8_lossy(&sent[0].bytes).to_string();
    let req = received(&sent[0]);
    let via = sip::header(&req.headers, "Via").expect("via");
    assert!(
        via.starts_with("SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bK"),
        "{via}"
    );
    assert!(via.ends_with(";rport"), "{via}");
    assert_eq!(sip::header(&req.headers, "Max-Forwards"), Some("70"));
    assert_eq!(sip::header(&req.headers, "User-Agent"), Some("test/1"));
    assert!(text.contains("Content-Length: 0\r\n"), "{text}");
    assert_eq!(l.len(), 1);
}

/// RFC 3261 §17.1.2.2: Timer E starts at T1 and doubles up to T2; Timer F
/// ends the transaction at 64 × T1 with no final response.
#[test]
fn retransmissions_double_to_t2_and_timer_f_ends_the_transaction() {
    let t0 = Instant::now();
    let mut l = layer();
    l.send(t0, 7, addr(PEER), options(1)).expect("send");
    let first = drain(&mut l).remove(0);
    let mut at = Vec::new();
    while let Some(next) = l.poll_timeout() {
        l.handle_timeout(next);
        for d in drain(&mut l) {
            assert_eq!(d, first, "a retransmission is the same bytes");
            at.push(next.duration_since(t0));
        }
        if let Some((id, outcome, retransmissions)) = l.poll_outcome_counted() {
            assert_eq!((id, outcome, retransmissions), (7, Outcome::TimedOut, 10));
            assert_eq!(next.duration_since(t0), TIMER_F);
            break;
        }
    }
    let ms: Vec<u64> = at.iter().map(|d| d.as_millis() as u64).collect();
    assert_eq!(
        ms,
        [500, 1500, 3500, 7500, 11500, 15500, 19500, 23500, 27500, 31500]
    );
    assert!(l.is_empty());
    assert_eq!(l.retransmissions(), 10);
}

#[test]
fn a_request_its_user_encodes_gets_the_via_and_runs_in_a_transaction() {
    let t0 = Instant::now();
    let mut l = layer();
    l.send_encoded(t0, 5, addr(PEER), Link::Udp, "OPTIONS", |via| {
        let text = format!(
            "OPTIONS sip:msr_1@10.0.0.2:5070 SIP/2.0\r\nVia: {via}\r\nMax-Forwards: 70\r\n\
             From: <sip:collector@10.0.0.1:5060>;tag=a\r\nTo: <sip:msr_1@10.0.0.2:5070>\r\n\
             Call-ID: e@test\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n"
        );
        bytes::Bytes::from(text)
    })
    .expect("send");
    assert_eq!(
        l.send_encoded(t0, 5, addr(PEER), Link::Udp, "OPTIONS", |_| {
            bytes::Bytes::new()
        }),
        Err(SendError::Duplicate)
    );
    let sent = drain(&mut l).remove(0);
    let via = sip::header(&received(&sent).headers, "Via")
        .expect("via")
        .to_owned();
    assert!(
        via.starts_with("SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bK"),
        "{via}"
    );
    l.handle_timeout(t0 + T1);
    assert_eq!(
        drain(&mut l),
        std::slice::from_ref(&sent),
        "retransmitted as encoded"
    );
    let (id, _, retransmissions) = l
        .handle_response_counted(t0 + 2 * T1, answer(&sent, StatusCode::OK))
        .expect("matched by its branch");
    assert_eq!((id, retransmissions), (5, 1));
    assert!(l.is_empty());
}

#[test]
fn a_final_response_tells_how_often_its_request_was_retransmitted() {
    let t0 = Instant::now();
    let mut l = layer();
    l.send(t0, 4, addr(PEER), options(1)).expect("send");
    let sent = drain(&mut l).remove(0);
    l.handle_timeout(t0 + T1);
    l.handle_timeout(t0 + 3 * T1);
    assert_eq!(drain(&mut l).len(), 2);
    let (id, response, retransmissions) = l
        .handle_response_counted(t0 + 4 * T1, answer(&sent, StatusCode::OK))
        .expect("matched");
    assert_eq!(
        (id, response.status_code.code(), retransmissions),
        (4, 200, 2)
    );
}

#[test]
fn a_final_response_ends_the_transaction_and_a_late_one_is_dropped() {
    let t0 = Instant::now();
    let mut l = layer();
    l.send(t0, 3, addr(PEER), options(1)).expect("send");
    let sent = drain(&mut l).remove(0);
    let ok = answer(&sent, StatusCode::OK);
    let (id, response) = l.handle_response(t0, ok.clone()).expect("matched");
    assert_eq!(id, 3);
    assert_eq!(response.status_code, StatusCode::OK);
    assert!(l.is_empty());
    assert_eq!(l.poll_timeout(), None, "nothing left to retransmit");
    assert!(
        l.handle_response(t0, ok).is_none(),
        "a retransmitted 200 finds nothing"
    );
}

#[test]
fn a_provisional_response_slows_retransmissions_to_t2() {
    let t0 = Instant::now();
    let mut l = layer();
    l.send(t0, 1, addr(PEER), options(1)).expect("send");
    let sent = drain(&mut l).remove(0);
    assert!(l
        .handle_response(t0, answer(&sent, StatusCode::Trying))
        .is_none());
    assert_eq!(l.poll_timeout(), Some(t0 + T2));
    l.handle_timeout(t0 + T2);
    assert_eq!(drain(&mut l).len(), 1);
    assert_eq!(l.poll_timeout(), Some(t0 + T2 * 2));
}

/// §17.1.3: a response matches by branch and by the CSeq method.
#[test]
fn a_response_with_another_branch_or_method_matches_nothing() {
    let t0 = Instant::now();
    let mut l = layer();
    l.send(t0, 1, addr(PEER), options(1)).expect("send");
    let sent = drain(&mut l).remove(0);
    let mut other_branch = answer(&sent, StatusCode::OK);
    sip::set_header(
        &mut other_branch.headers,
        "Via",
        "SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bKother",
    );
    assert!(l.handle_response(t0, other_branch).is_none());
    let mut other_method = answer(&sent, StatusCode::OK);
    sip::set_header(&mut other_method.headers, "CSeq", "1 SUBSCRIBE");
    assert!(l.handle_response(t0, other_method).is_none());
    let mut no_via = answer(&sent, StatusCode::OK);
    no_via
        .headers
        .retain(|h| !h.name().eq_ignore_ascii_case("Via"));
    assert!(l.handle_response(t0, no_via).is_none());
    assert_eq!(l.len(), 1);
}

/// A keepalive given up on (its own timeout, or cancelled by its user)
/// sends nothing more toward the peer.
#[test]
fn a_short_timeout_and_cancel_stop_the_retransmissions() {
    let t0 = Instant::now();
    let mut l = layer();
    l.send_with_timeout(t0, 1, addr(PEER), options(1), Duration::from_secs(2))
        .expect("send");
    l.send(t0, 2, addr(PEER), options(2)).expect("send");
    drain(&mut l);
    assert!(l.cancel(&2));
    assert!(!l.cancel(&2));
    let mut sent = 0;
    while let Some(next) = l.poll_timeout() {
        l.handle_timeout(next);
        sent += drain(&mut l).len();
    }
    // 0.5 s and 1.5 s, then the 2 s timeout.
    assert_eq!(sent, 2);
    assert_eq!(l.poll_outcome(), Some((1, Outcome::TimedOut)));
    assert_eq!(l.poll_outcome(), None, "a cancelled one has no outcome");
}

#[test]
fn the_same_id_twice_and_a_request_without_cseq_are_refused() {
    let t0 = Instant::now();
    let mut l = layer();
    l.send(t0, 1, addr(PEER), options(1)).expect("send");
    assert_eq!(
        l.send(t0, 1, addr(PEER), options(2)),
        Err(SendError::Duplicate)
    );
    let mut bad = options(3);
    bad.headers
        .retain(|h| !h.name().eq_ignore_ascii_case("CSeq"));
    assert_eq!(l.send(t0, 2, addr(PEER), bad), Err(SendError::NoCSeq));
    assert_eq!(l.len(), 1);
}

/// §17.1.2.2: over a stream connection the request is sent once, its
/// `Via` names the stream's transport and address, and Timer F alone
/// ends it.
#[test]
fn over_a_stream_a_request_is_sent_once_and_times_out_at_timer_f() {
    let t0 = Instant::now();
    let mut l = layer();
    let link = Link::Stream {
        transport: StreamTransport::Tls,
        sent_by: addr("10.0.0.1:5061"),
    };
    l.send_on(t0, 3, addr(PEER), options(1), TIMER_F, link)
        .expect("send");
    let sent = drain(&mut l);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].link, link);
    let req = received(&sent[0]);
    let via = sip::header(&req.headers, "Via").expect("via");
    assert!(
        via.starts_with("SIP/2.0/TLS 10.0.0.1:5061;branch=z9hG4bK"),
        "{via}"
    );
    let mut now = t0;
    while let Some(at) = l.poll_timeout() {
        now = at;
        l.handle_timeout(now);
        assert!(drain(&mut l).is_empty(), "no retransmission at {now:?}");
    }
    assert_eq!(now, t0 + TIMER_F);
    assert_eq!(l.poll_outcome(), Some((3, Outcome::TimedOut)));
    assert_eq!(l.retransmissions(), 0);
}
