use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::sip::{self, Method};

fn request(branch: &str, sent_by: &str, method: Method, cseq: &str) -> Request {
    sip::request(
        method,
        "sip:msr_1@10.0.0.2:5070",
        vec![
            ("Via", format!("SIP/2.0/UDP {sent_by};branch={branch}")),
            ("From", "<sip:collector@10.0.0.1>;tag=a".to_owned()),
            ("To", "<sip:msr_1@10.0.0.2>".to_owned()),
            ("Call-ID", "k@test".to_owned()),
            ("CSeq", cseq.to_owned()),
        ],
        Vec::new(),
    )
    .expect("request")
}

fn options(branch: &str) -> Request {
    request(branch, "10.0.0.1:5060", Method::Options, "1 OPTIONS")
}

fn new_key(table: &mut ServerTransactions, now: Instant, r: &Request) -> ServerKey {
    match table.handle_request(now, r) {
        Some(Received::New(key)) => key,
        other => panic!("a new transaction expected, got {other:?}"),
    }
}

#[test]
fn a_retransmission_before_the_answer_is_absorbed_and_after_it_answered_again() {
    let t0 = Instant::now();
    let mut table = ServerTransactions::new();
    let key = new_key(&mut table, t0, &options("z9hG4bK1"));
    assert_eq!(
        table.handle_request(t0, &options("z9hG4bK1")),
        Some(Received::Absorbed)
    );
    let answer = Bytes::from_static(b"SIP/2.0 200 OK\r\n\r\n");
    table.handle_response(t0, &key, answer.clone(), true, false);
    let later = t0 + TIMER_J - Duration::from_millis(1);
    table.handle_timeout(later);
    assert_eq!(
        table.handle_request(later, &options("z9hG4bK1")),
        Some(Received::Answer(answer))
    );
    // Timer J: the transaction is gone, the same branch is new again.
    assert_eq!(table.poll_timeout(), Some(t0 + TIMER_J));
    table.handle_timeout(t0 + TIMER_J);
    assert!(table.is_empty());
    new_key(&mut table, t0 + TIMER_J, &options("z9hG4bK1"));
}

#[test]
fn over_a_stream_the_answered_transaction_is_forgotten_at_once() {
    let t0 = Instant::now();
    let mut table = ServerTransactions::new();
    let key = new_key(&mut table, t0, &options("z9hG4bK1"));
    table.handle_response(t0, &key, Bytes::from_static(b"x"), true, true);
    assert!(table.is_empty());
    assert_eq!(table.poll_timeout(), None);
}

#[test]
fn a_provisional_answer_is_repeated_until_the_final_one() {
    let t0 = Instant::now();
    let mut table = ServerTransactions::new();
    let key = new_key(&mut table, t0, &options("z9hG4bK1"));
    let trying = Bytes::from_static(b"SIP/2.0 100 Trying\r\n\r\n");
    table.handle_response(t0, &key, trying.clone(), false, false);
    assert_eq!(
        table.handle_request(t0, &options("z9hG4bK1")),
        Some(Received::Answer(trying))
    );
    let ok = Bytes::from_static(b"SIP/2.0 200 OK\r\n\r\n");
    table.handle_response(t0, &key, ok.clone(), true, false);
    assert_eq!(
        table.handle_request(t0, &options("z9hG4bK1")),
        Some(Received::Answer(ok))
    );
    assert_eq!(table.len(), 1);
}

#[test]
fn the_branch_sent_by_and_method_each_make_another_transaction() {
    let t0 = Instant::now();
    let mut table = ServerTransactions::new();
    new_key(&mut table, t0, &options("z9hG4bK1"));
    new_key(&mut table, t0, &options("z9hG4bK2"));
    new_key(
        &mut table,
        t0,
        &request("z9hG4bK1", "10.0.0.9:5060", Method::Options, "1 OPTIONS"),
    );
    new_key(
        &mut table,
        t0,
        &request("z9hG4bK1", "10.0.0.1:5060", Method::Notify, "1 NOTIFY"),
    );
    assert_eq!(table.len(), 4);
}

#[test]
fn an_rfc_2543_branch_is_matched_by_the_request_and_not_dropped() {
    let t0 = Instant::now();
    let mut table = ServerTransactions::new();
    let key = new_key(&mut table, t0, &options("old1"));
    assert!(key.to_string().starts_with("2543 "), "{key}");
    assert_eq!(
        table.handle_request(t0, &options("old1")),
        Some(Received::Absorbed)
    );
    // The next CSeq is another transaction.
    new_key(
        &mut table,
        t0,
        &request("old1", "10.0.0.1:5060", Method::Options, "2 OPTIONS"),
    );
    // No branch at all is the same rule.
    let bare = sip::request(
        Method::Options,
        "sip:msr_1@10.0.0.2",
        vec![
            ("Via", "SIP/2.0/UDP 10.0.0.1:5060".to_owned()),
            ("Call-ID", "b@test".to_owned()),
            ("CSeq", "1 OPTIONS".to_owned()),
        ],
        Vec::new(),
    )
    .expect("request");
    new_key(&mut table, t0, &bare);
}

#[test]
fn a_request_never_answered_is_forgotten_at_timer_f() {
    let t0 = Instant::now();
    let mut table = ServerTransactions::new();
    new_key(&mut table, t0, &options("z9hG4bK1"));
    table.handle_timeout(t0 + TIMER_F);
    assert!(table.is_empty());
}

#[test]
fn a_request_without_via_or_cseq_has_no_transaction() {
    let t0 = Instant::now();
    let mut table = ServerTransactions::new();
    let no_via = sip::request(
        Method::Options,
        "sip:msr_1@10.0.0.2",
        vec![("CSeq", "1 OPTIONS".to_owned())],
        Vec::new(),
    )
    .expect("request");
    assert_eq!(table.handle_request(t0, &no_via), None);
    assert!(table.is_empty());
}

#[test]
fn an_abandoned_request_is_new_again_but_an_answered_one_is_kept() {
    let t0 = Instant::now();
    let mut table = ServerTransactions::new();
    let key = new_key(&mut table, t0, &options("z9hG4bK1"));
    table.abandon(&key);
    assert!(table.is_empty());
    let key = new_key(&mut table, t0, &options("z9hG4bK1"));
    table.handle_response(t0, &key, Bytes::from_static(b"x"), true, false);
    table.abandon(&key);
    assert_eq!(table.len(), 1);
}

/// A client's retransmissions are answered, but no more of them than a
/// client sends within Timer F: past that a request drawn again (a forged
/// source's, a reflection) is absorbed, whatever its source, until Timer J.
#[test]
fn retransmissions_are_answered_at_most_as_often_as_a_client_sends_them() {
    let t0 = Instant::now();
    let mut table = ServerTransactions::new();
    let key = new_key(&mut table, t0, &options("z9hG4bKcap"));
    let answer = Bytes::from_static(b"SIP/2.0 200 OK\r\n\r\n");
    table.handle_response(t0, &key, answer.clone(), true, false);
    for _ in 0..MAX_RETRANSMISSION_ANSWERS {
        assert_eq!(
            table.handle_request(t0, &options("z9hG4bKcap")),
            Some(Received::Answer(answer.clone()))
        );
    }
    for _ in 0..1000 {
        assert_eq!(
            table.handle_request(t0, &options("z9hG4bKcap")),
            Some(Received::Absorbed)
        );
    }
    table.handle_timeout(t0 + TIMER_J);
    new_key(&mut table, t0 + TIMER_J, &options("z9hG4bKcap"));
}
