use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;

use super::bencode::{self, Value};
use super::*;

fn target() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 2223))
}

fn client() -> NgClient {
    NgClient::new(target(), "t".to_owned())
}

/// An rtpengine `statistics` answer to `cookie` with `own` sessions of its
/// own and `foreign` held for a peer (the shape of rtpengine 10.5's).
fn statistics(cookie: &[u8], own: i64, foreign: i64) -> Vec<u8> {
    let current = Value::Dict(vec![
        (b"sessionsown".to_vec(), Value::Int(own)),
        (b"sessionsforeign".to_vec(), Value::Int(foreign)),
        (b"sessionstotal".to_vec(), Value::Int(own + foreign)),
    ]);
    let total = Value::Dict(vec![(b"uptime".to_vec(), Value::text("18"))]);
    let body = Value::Dict(vec![
        (
            b"statistics".to_vec(),
            Value::Dict(vec![
                (b"currentstatistics".to_vec(), current),
                (b"totalstatistics".to_vec(), total),
            ]),
        ),
        (b"result".to_vec(), Value::text("ok")),
    ]);
    with_cookie(cookie, &body)
}

fn with_cookie(cookie: &[u8], body: &Value) -> Vec<u8> {
    let mut out = cookie.to_vec();
    out.push(b' ');
    bencode::encode(body, &mut out);
    out
}

/// The cookie and command of a request the client sent.
fn sent(datagram: &[u8]) -> (Vec<u8>, String) {
    let (cookie, body) = split_cookie(datagram).expect("cookie");
    let v = bencode::decode(body).expect("bencode");
    let command = v
        .get("command")
        .and_then(Value::as_str)
        .expect("command")
        .to_owned();
    (cookie.to_vec(), command)
}

#[test]
fn an_answered_statistics_request_is_the_samples_session_count() {
    let t0 = Instant::now();
    let mut c = client();
    assert_eq!(c.ask(t0), AskOutcome::Asking);
    let datagram = c.poll_transmit().expect("a request");
    assert_eq!(c.poll_transmit(), None);
    let (cookie, command) = sent(&datagram);
    assert_eq!(command, "statistics");
    assert_eq!(c.poll_timeout(), Some(t0 + RETRANSMIT_AFTER));
    // sessionsown, not sessionstotal: foreign sessions are relayed by a peer.
    let answer = c.handle_datagram(t0 + Duration::from_millis(1), &statistics(&cookie, 7, 5));
    assert_eq!(answer, Some(Answer::Sessions(7)));
    assert!(!c.in_flight());
    assert_eq!(c.poll_timeout(), None);
}

#[test]
fn each_request_has_a_new_cookie_that_starts_with_the_prefix() {
    let t0 = Instant::now();
    let mut c = NgClient::new(target(), "msr-agent-1a2b".to_owned());
    let mut cookies = Vec::new();
    for i in 0..3 {
        let now = t0 + Duration::from_secs(i);
        c.ask(now);
        let (cookie, _) = sent(&c.poll_transmit().expect("request"));
        assert!(cookie.starts_with(b"msr-agent-1a2b_"), "{cookie:?}");
        assert_eq!(
            c.handle_datagram(now, &statistics(&cookie, 0, 0)),
            Some(Answer::Sessions(0))
        );
        cookies.push(cookie);
    }
    cookies.dedup();
    assert_eq!(cookies.len(), 3);
}

#[test]
fn a_lost_datagram_is_sent_again_with_the_same_cookie() {
    let t0 = Instant::now();
    let mut c = client();
    c.ask(t0);
    let first = c.poll_transmit().expect("request");
    // Not yet due.
    assert_eq!(c.handle_timeout(t0 + RETRANSMIT_AFTER / 2), None);
    assert_eq!(c.poll_transmit(), None);
    assert_eq!(c.handle_timeout(t0 + RETRANSMIT_AFTER), None);
    let second = c.poll_transmit().expect("retransmission");
    assert_eq!(first, second, "same cookie, same request");
    assert_eq!(c.poll_timeout(), Some(t0 + 2 * RETRANSMIT_AFTER));
    // A tick while it is in flight asks nothing new.
    assert_eq!(c.ask(t0 + RETRANSMIT_AFTER), AskOutcome::Asking);
    assert_eq!(c.poll_transmit(), None);
    let (cookie, _) = sent(&second);
    assert_eq!(
        c.handle_datagram(t0 + RETRANSMIT_AFTER, &statistics(&cookie, 3, 0)),
        Some(Answer::Sessions(3))
    );
}

#[test]
fn no_answer_after_every_try_fails_and_backs_off_then_recovers() {
    let t0 = Instant::now();
    let mut c = client();
    c.ask(t0);
    let mut now;
    let mut sends = 0;
    let answer = loop {
        if c.poll_transmit().is_some() {
            sends += 1;
        }
        now = c.poll_timeout().expect("a deadline while asking");
        if let Some(a) = c.handle_timeout(now) {
            break a;
        }
    };
    assert_eq!(sends, TRIES);
    assert_eq!(answer, Answer::Failed(NgError::NoAnswer { tries: TRIES }));
    assert_eq!(now, t0 + RETRANSMIT_AFTER * TRIES);
    assert_eq!(c.poll_timeout(), None, "nothing to time while down");
    // Ticks inside the backoff ask nothing.
    assert_eq!(c.ask(now), AskOutcome::Backoff);
    assert_eq!(
        c.ask(now + BACKOFF_BASE - Duration::from_millis(1)),
        AskOutcome::Backoff
    );
    assert_eq!(c.poll_transmit(), None);
    // The first tick after it asks again; a second failure doubles it.
    let retry = now + BACKOFF_BASE;
    assert_eq!(c.ask(retry), AskOutcome::Asking);
    let request = c.poll_transmit().expect("retry");
    assert_eq!(
        c.handle_send_error(retry, "connection refused"),
        Some(Answer::Failed(NgError::Send {
            reason: "connection refused".to_owned()
        }))
    );
    assert_eq!(c.ask(retry + BACKOFF_BASE), AskOutcome::Backoff);
    assert_eq!(c.ask(retry + 2 * BACKOFF_BASE), AskOutcome::Asking);
    let (cookie, _) = sent(&c.poll_transmit().expect("second retry"));
    assert_ne!(sent(&request).0, cookie, "a new exchange, a new cookie");
    let back = retry + 2 * BACKOFF_BASE;
    assert_eq!(
        c.handle_datagram(back, &statistics(&cookie, 12, 0)),
        Some(Answer::Sessions(12))
    );
    // A good answer resets the backoff: the next failure waits the base.
    c.ask(back + Duration::from_secs(1));
    c.poll_transmit();
    let failed = back + Duration::from_secs(1) + RETRANSMIT_AFTER * TRIES;
    let mut at = back + Duration::from_secs(1);
    while c.in_flight() {
        at = c.poll_timeout().expect("deadline");
        c.handle_timeout(at);
    }
    assert_eq!(at, failed);
    assert_eq!(c.ask(failed + BACKOFF_BASE), AskOutcome::Asking);
}

#[test]
fn the_backoff_doubles_up_to_its_cap() {
    let mut c = client();
    let mut now = Instant::now();
    let mut waits = Vec::new();
    for _ in 0..8 {
        assert_eq!(c.ask(now), AskOutcome::Asking);
        c.poll_transmit();
        c.handle_send_error(now, "refused");
        // The first tick (every 250 ms) that may ask again.
        let failed = now;
        while c.ask(now) == AskOutcome::Backoff {
            now += Duration::from_millis(250);
        }
        waits.push((now - failed).as_secs());
        c.poll_transmit();
        c.handle_send_error(now, "refused");
        while c.ask(now) == AskOutcome::Backoff {
            now += Duration::from_millis(250);
        }
    }
    // Two failures per round: 1, 2 | 4, 8 | 16, 30 | 30, 30 …
    assert_eq!(waits, vec![1, 4, 16, 30, 30, 30, 30, 30]);
}

#[test]
fn answers_that_are_not_ours_or_not_a_count_are_told_apart() {
    let t0 = Instant::now();
    let mut c = client();
    c.ask(t0);
    let (cookie, _) = sent(&c.poll_transmit().expect("request"));
    // Another cookie (a late answer to an abandoned request), no cookie:
    // ignored, the exchange goes on.
    assert_eq!(c.handle_datagram(t0, &statistics(b"t_999", 5, 0)), None);
    assert_eq!(c.handle_datagram(t0, b"garbage-without-a-space"), None);
    assert!(c.in_flight());
    // Our cookie, but an error.
    let refused = Value::Dict(vec![
        (b"result".to_vec(), Value::text("error")),
        (
            b"error-reason".to_vec(),
            Value::text("Unrecognized command"),
        ),
    ]);
    assert_eq!(
        c.handle_datagram(t0, &with_cookie(&cookie, &refused)),
        Some(Answer::Failed(NgError::Refused {
            reason: "Unrecognized command".to_owned()
        }))
    );
    assert_eq!(
        c.handle_datagram(t0, &statistics(&cookie, 1, 0)),
        None,
        "down: nothing in flight"
    );

    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            b"not bencode".to_vec(),
            "unreadable answer: bencode: no value starts here at byte 0",
        ),
        (
            with_cookie(
                b"X",
                &Value::Dict(vec![(b"result".to_vec(), Value::text("ok"))]),
            ),
            "unreadable answer: no statistics.currentstatistics.sessionsown",
        ),
        (
            statistics(b"X", -1, 0),
            "unreadable answer: sessionsown Int(-1) is not a count",
        ),
        (
            statistics(b"X", i64::from(u32::MAX) + 1, 0),
            "unreadable answer: sessionsown Int(4294967296) is not a count",
        ),
        (
            with_cookie(
                b"X",
                &Value::Dict(vec![(b"result".to_vec(), Value::text("load limit"))]),
            ),
            "unreadable answer: result \"load limit\"",
        ),
        (
            with_cookie(b"X", &Value::Dict(vec![])),
            "unreadable answer: no result",
        ),
    ];
    let mut now = t0;
    for (answer, message) in cases {
        now += BACKOFF_CAP;
        assert_eq!(c.ask(now), AskOutcome::Asking);
        let (cookie, _) = sent(&c.poll_transmit().expect("request"));
        let answer = if answer.starts_with(b"X ") {
            [cookie.as_slice(), &answer[1..]].concat()
        } else {
            [cookie.as_slice(), b" ", answer.as_slice()].concat()
        };
        match c.handle_datagram(now, &answer) {
            Some(Answer::Failed(e)) => assert_eq!(e.to_string(), message),
            other => panic!("{message}: {other:?}"),
        }
    }
}

#[test]
fn outside_an_exchange_nothing_happens() {
    let t0 = Instant::now();
    let mut c = client();
    assert_eq!(c.handle_timeout(t0), None);
    assert_eq!(c.handle_send_error(t0, "x"), None);
    assert_eq!(c.handle_datagram(t0, &statistics(b"t_1", 1, 0)), None);
    assert_eq!(c.poll_transmit(), None);
    assert_eq!(c.target(), target());
}

#[test]
fn requests_are_what_rtpengine_documents() {
    assert_eq!(request("5323_1", "ping"), b"5323_1 d7:command4:pinge");
    assert_eq!(
        request_with(
            "c",
            "query",
            vec![(b"call-id".to_vec(), Value::text("a@b"))]
        ),
        b"c d7:call-id3:a@b7:command5:querye"
    );
    assert_eq!(
        split_cookie(b"c d6:result4:ponge"),
        Some((&b"c"[..], &b"d6:result4:ponge"[..]))
    );
    assert!(answer(b"d6:result4:ponge").is_ok());
}

proptest::proptest! {
    /// Whatever comes back with our cookie ends the exchange, and never
    /// panics; bytes without it leave the exchange going.
    #[test]
    fn any_answer_is_taken_without_panicking(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
        let t0 = Instant::now();
        let mut c = client();
        c.ask(t0);
        let (cookie, _) = sent(&c.poll_transmit().expect("request"));
        let _ = c.handle_datagram(t0, &body);
        if c.in_flight() {
            let answer = [cookie.as_slice(), b" ", body.as_slice()].concat();
            proptest::prop_assert!(c.handle_datagram(t0, &answer).is_some());
            proptest::prop_assert!(!c.in_flight());
        }
    }
}
