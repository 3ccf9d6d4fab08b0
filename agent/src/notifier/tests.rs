use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use msr_shared::event_package::{LoadReport, EVENT};
use msr_shared::sip::{
    self, Method, Request, Response, StatusCode, SubState, SubscriptionStateHeader,
};
use tokio::time::Instant;

use super::*;
use crate::load::Sample;
use crate::test_log::Captured;

const MS: fn(u64) -> Duration = Duration::from_millis;

/// Where the collector's requests come from: a subscriber host.
const COLLECTOR: Option<SocketAddr> = Some(SocketAddr::new(
    IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
    5060,
));

/// The address of collector `i` (`i` = 0: [`COLLECTOR`]).
fn registrar(i: u16) -> Option<SocketAddr> {
    Some(SocketAddr::from(([127, 0, 0, 1], 5060 + i)))
}

fn config() -> NotifierConfig {
    NotifierConfig {
        load_delta: 10,
        high_water: DEFAULT_HIGH_WATER,
        notify_min_interval: MS(1000),
        // The tests of the one-per-second window near the top; the top
        // interval has its own test.
        notify_top_interval: MS(1000),
        max_expires: 3600,
        contact_host_port: "127.0.0.1:5070".into(),
        accounts: BTreeSet::from(["msr_1".to_owned()]),
        subscribers: BTreeSet::from([IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)]),
        // A collector at 127.0.0.1:5060, and more on the next ports
        // (several collectors, one host: `registrar(i)`).
        registrars: (0..100)
            .map(|i| SocketAddr::from(([127, 0, 0, 1], 5060 + i)))
            .collect(),
        codecs: None,
    }
}

fn sample(load: u8) -> Sample {
    Sample {
        load,
        cpu: 5,
        calls: u32::from(load),
        max_calls: 100,
    }
}

fn subscribe(
    call_id: &str,
    to_tag: Option<&str>,
    cseq: u32,
    expires: Option<u32>,
    event: &str,
) -> Request {
    subscribe_to("msr_1", call_id, to_tag, cseq, expires, event)
}

/// [`subscribe`] for the MSR `msr`.
fn subscribe_to(
    msr: &str,
    call_id: &str,
    to_tag: Option<&str>,
    cseq: u32,
    expires: Option<u32>,
    event: &str,
) -> Request {
    let to = match to_tag {
        Some(t) => format!("<sip:{msr}@127.0.0.1:5070>;tag={t}"),
        None => format!("<sip:{msr}@127.0.0.1:5070>"),
    };
    let mut headers = vec![
        (
            "Via",
            "SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bK1".to_owned(),
        ),
        ("From", "<sip:collector@127.0.0.1:5060>;tag=sub1".to_owned()),
        ("To", to),
        ("Call-ID", call_id.to_owned()),
        ("CSeq", format!("{cseq} SUBSCRIBE")),
        ("Contact", "<sip:collector@127.0.0.1:5060>".to_owned()),
        ("Event", event.to_owned()),
        ("Accept", "application/x-eltex-call-count".to_owned()),
    ];
    if let Some(e) = expires {
        headers.push(("Expires", e.to_string()));
    }
    sip::request(
        Method::Subscribe,
        &format!("sip:{msr}@127.0.0.1:5070"),
        headers,
        Vec::new(),
    )
    .expect("request")
}

fn h<'a>(headers: &'a msr_shared::sip::Headers, name: &str) -> &'a str {
    sip::header(headers, name).unwrap_or_default()
}

fn state(n: &NotifyTransmit) -> SubscriptionStateHeader {
    SubscriptionStateHeader::parse(h(&n.request.headers, "Subscription-State"))
        .expect("subscription-state")
}

fn body(n: &NotifyTransmit) -> LoadReport {
    LoadReport::decode(&n.request.body).expect("body")
}

fn drain(n: &mut Notifier) -> Vec<NotifyTransmit> {
    std::iter::from_fn(|| n.poll_transmit()).collect()
}

/// A notifier with one subscription created at `t0` (initial NOTIFY drained).
fn subscribed(expires: u32) -> (Notifier, Instant, Response) {
    subscribed_with(config(), expires)
}

/// [`subscribed`] with this config.
fn subscribed_with(config: NotifierConfig, expires: u32) -> (Notifier, Instant, Response) {
    let t0 = Instant::now();
    let mut n = Notifier::new(config, sample(30));
    let resp = n
        .handle_request(
            t0,
            COLLECTOR,
            &subscribe("c1", None, 1, Some(expires), EVENT),
        )
        .expect("response");
    assert_eq!(drain(&mut n).len(), 1);
    (n, t0, resp)
}

#[test]
fn subscribe_gets_200_dialog_and_immediate_notify() {
    let t0 = Instant::now();
    let mut n = Notifier::new(config(), sample(37));
    let resp = n
        .handle_request(t0, COLLECTOR, &subscribe("c1", None, 1, Some(7200), EVENT))
        .expect("response");
    assert_eq!(resp.status_code, StatusCode::OK);
    assert_eq!(
        h(&resp.headers, "Expires"),
        "3600",
        "capped at max-subscription-expires"
    );
    let to_tag = sip::tag(h(&resp.headers, "To")).expect("to-tag");
    assert!(h(&resp.headers, "Contact").contains("127.0.0.1:5070"));

    let sent = drain(&mut n);
    assert_eq!(sent.len(), 1);
    let notify = &sent[0];
    let r = &notify.request;
    assert_eq!(r.method, Method::Notify);
    assert_eq!(
        r.uri.to_string(),
        "sip:collector@127.0.0.1:5060",
        "sent to the subscriber's contact"
    );
    assert_eq!(h(&r.headers, "Call-ID"), "c1");
    assert_eq!(sip::tag(h(&r.headers, "From")), Some(to_tag));
    assert_eq!(sip::tag(h(&r.headers, "To")).as_deref(), Some("sub1"));
    assert_eq!(h(&r.headers, "CSeq"), "1 NOTIFY");
    assert_eq!(h(&r.headers, "Event"), EVENT);
    assert_eq!(h(&r.headers, "Content-Type"), CONTENT_TYPE);
    assert!(!h(&r.headers, "Contact").is_empty());
    assert_eq!(state(notify), SubscriptionStateHeader::active(3600));
    assert_eq!(
        body(notify),
        LoadReport {
            msr: "msr_1".into(),
            load: 37,
            cpu: 5,
            calls: 37,
            max_calls: 100,
            ..LoadReport::default()
        }
    );
}

#[test]
fn refresh_gets_200_and_notify_with_new_expiry() {
    let (mut n, t0, resp) = subscribed(60);
    let tag = sip::tag(h(&resp.headers, "To")).expect("tag");
    let t1 = t0 + Duration::from_secs(40);
    let resp = n
        .handle_request(
            t1,
            COLLECTOR,
            &subscribe("c1", Some(&tag), 2, Some(60), EVENT),
        )
        .expect("response");
    assert_eq!(resp.status_code, StatusCode::OK);
    assert_eq!(h(&resp.headers, "Expires"), "60");
    let sent = drain(&mut n);
    assert_eq!(sent.len(), 1);
    assert_eq!(state(&sent[0]), SubscriptionStateHeader::active(60));
    assert_eq!(h(&sent[0].request.headers, "CSeq"), "2 NOTIFY");
    // Not expired at t0 + 60 s (refreshed), expired at t1 + 60 s.
    n.handle_timeout(t0 + Duration::from_secs(61));
    assert!(drain(&mut n).is_empty());
    assert_eq!(n.poll_timeout(), Some(t1 + Duration::from_secs(60)));
    n.handle_timeout(t1 + Duration::from_secs(60));
    let sent = drain(&mut n);
    assert_eq!(sent.len(), 1);
    let st = state(&sent[0]);
    assert_eq!(st.state, SubState::Terminated);
    assert_eq!(st.reason, Some(TerminationReason::Timeout));
    assert!(n.subscriptions().is_empty());
}

#[test]
fn expiry_sends_terminated_timeout_at_the_right_instant() {
    let (mut n, t0, _) = subscribed(30);
    assert_eq!(n.poll_timeout(), Some(t0 + Duration::from_secs(30)));
    n.handle_timeout(t0 + Duration::from_secs(30) - MS(1));
    assert!(drain(&mut n).is_empty());
    n.handle_timeout(t0 + Duration::from_secs(30));
    let sent = drain(&mut n);
    assert_eq!(sent.len(), 1);
    assert_eq!(
        state(&sent[0]),
        SubscriptionStateHeader::terminated(TerminationReason::Timeout)
    );
    assert_eq!(n.poll_timeout(), None);
}

#[test]
fn expires_zero_ends_with_timeout() {
    let (mut n, t0, resp) = subscribed(60);
    let tag = sip::tag(h(&resp.headers, "To")).expect("tag");
    let resp = n
        .handle_request(
            t0,
            COLLECTOR,
            &subscribe("c1", Some(&tag), 2, Some(0), EVENT),
        )
        .expect("response");
    assert_eq!(resp.status_code, StatusCode::OK);
    assert_eq!(h(&resp.headers, "Expires"), "0");
    let sent = drain(&mut n);
    assert_eq!(sent.len(), 1);
    assert_eq!(
        state(&sent[0]),
        SubscriptionStateHeader::terminated(TerminationReason::Timeout)
    );
    assert!(n.subscriptions().is_empty());
    // The dialog is gone: a further request in it gets 481.
    let resp = n
        .handle_request(
            t0,
            COLLECTOR,
            &subscribe("c1", Some(&tag), 3, Some(60), EVENT),
        )
        .expect("response");
    assert_eq!(resp.status_code, StatusCode::CallTransactionDoesNotExist);
}

#[test]
fn initial_expires_zero_is_a_fetch() {
    let t0 = Instant::now();
    let mut n = Notifier::new(config(), sample(30));
    let resp = n
        .handle_request(t0, COLLECTOR, &subscribe("c1", None, 1, Some(0), EVENT))
        .expect("response");
    assert_eq!(resp.status_code, StatusCode::OK);
    let sent = drain(&mut n);
    assert_eq!(sent.len(), 1);
    assert_eq!(
        state(&sent[0]),
        SubscriptionStateHeader::terminated(TerminationReason::Timeout)
    );
    assert_eq!(body(&sent[0]).load, 30);
}

#[test]
fn rejections() {
    let t0 = Instant::now();
    let mut n = Notifier::new(config(), sample(30));
    let resp = n
        .handle_request(
            t0,
            COLLECTOR,
            &subscribe("c1", None, 1, Some(60), "presence"),
        )
        .expect("response");
    assert_eq!(resp.status_code, StatusCode::BadEvent);
    assert_eq!(h(&resp.headers, "Allow-Events"), EVENT);

    let resp = n
        .handle_request(
            t0,
            COLLECTOR,
            &subscribe("c2", Some("nope"), 1, Some(60), EVENT),
        )
        .expect("response");
    assert_eq!(resp.status_code, StatusCode::CallTransactionDoesNotExist);

    let mut no_call_id = subscribe("c3", None, 1, Some(60), EVENT);
    no_call_id
        .headers
        .retain(|h| !h.name().eq_ignore_ascii_case("Call-ID"));
    let resp = n
        .handle_request(t0, COLLECTOR, &no_call_id)
        .expect("response");
    assert_eq!(resp.status_code, StatusCode::BadRequest);

    let mut no_from_tag = subscribe("c4", None, 1, Some(60), EVENT);
    sip::set_header(
        &mut no_from_tag.headers,
        "From",
        "<sip:collector@127.0.0.1:5060>",
    );
    let resp = n
        .handle_request(t0, COLLECTOR, &no_from_tag)
        .expect("response");
    assert_eq!(resp.status_code, StatusCode::BadRequest);

    let mut bad_expires = subscribe("c5", None, 1, None, EVENT);
    sip::push_header(&mut bad_expires.headers, "Expires", "soon");
    let resp = n
        .handle_request(t0, COLLECTOR, &bad_expires)
        .expect("response");
    assert_eq!(resp.status_code, StatusCode::BadRequest);

    let mut other_msr = subscribe("c6", None, 1, Some(60), EVENT);
    other_msr.uri = sip::Uri::try_from("sip:msr_9@127.0.0.1:5070").expect("uri");
    let resp = n
        .handle_request(t0, COLLECTOR, &other_msr)
        .expect("response");
    assert_eq!(resp.status_code, StatusCode::NotFound);

    assert!(drain(&mut n).is_empty());
    assert!(n.subscriptions().is_empty());
}

#[test]
fn a_one_second_subscription_is_granted() {
    // Whole seconds: 1 is the shortest non-zero expiry, and it is granted
    // (nothing is too brief, so the notifier has no 423 to send).
    let t0 = Instant::now();
    let mut n = Notifier::new(config(), sample(30));
    let resp = n
        .handle_request(t0, COLLECTOR, &subscribe("c1", None, 1, Some(1), EVENT))
        .expect("response");
    assert_eq!(resp.status_code, StatusCode::OK);
    assert_eq!(h(&resp.headers, "Expires"), "1");
}

#[test]
fn load_delta_threshold() {
    let (mut n, t0, _) = subscribed(600);
    // Last sent: 30. Moves below delta (10) are not reported.
    n.on_sample(t0 + MS(2000), sample(39));
    assert!(drain(&mut n).is_empty());
    n.on_sample(t0 + MS(3000), sample(21));
    assert!(drain(&mut n).is_empty());
    n.on_sample(t0 + MS(4000), sample(40));
    let sent = drain(&mut n);
    assert_eq!(sent.len(), 1);
    assert_eq!(body(&sent[0]).load, 40);
    assert_eq!(state(&sent[0]).expires, Some(596));
    // Measured from the last NOTIFY sent (40), not from the last sample.
    n.on_sample(t0 + MS(5000), sample(45));
    n.on_sample(t0 + MS(6000), sample(49));
    assert!(drain(&mut n).is_empty());
    n.on_sample(t0 + MS(7000), sample(50));
    assert_eq!(drain(&mut n).len(), 1);
}

#[test]
fn changes_within_a_second_are_coalesced_into_the_latest() {
    let (mut n, t0, _) = subscribed(600);
    // The initial NOTIFY at t0 opens a window until t0 + 1 s.
    n.on_sample(t0 + MS(200), sample(50));
    n.on_sample(t0 + MS(500), sample(70));
    n.on_sample(t0 + MS(800), sample(90));
    assert!(drain(&mut n).is_empty(), "held until the window ends");
    assert_eq!(n.poll_timeout(), Some(t0 + MS(1000)));
    n.handle_timeout(t0 + MS(1000));
    let sent = drain(&mut n);
    assert_eq!(sent.len(), 1);
    assert_eq!(body(&sent[0]).load, 90);
    // The next change inside the new window waits again.
    n.on_sample(t0 + MS(1100), sample(60));
    assert!(drain(&mut n).is_empty());
    n.handle_timeout(t0 + MS(2000));
    assert_eq!(body(&drain(&mut n)[0]).load, 60);
}

#[test]
fn a_held_change_that_reverted_is_not_sent() {
    let (mut n, t0, _) = subscribed(600);
    n.on_sample(t0 + MS(200), sample(60));
    n.on_sample(t0 + MS(400), sample(31));
    n.handle_timeout(t0 + MS(1000));
    assert!(drain(&mut n).is_empty());
    assert_eq!(n.poll_timeout(), Some(t0 + Duration::from_secs(600)));
}

#[test]
fn the_100_edge_is_always_reported() {
    let mut cfg = config();
    cfg.load_delta = 50;
    // The high-water rule off, so that only the edges count here.
    cfg.high_water = 101;
    let t0 = Instant::now();
    let mut n = Notifier::new(cfg, sample(98));
    n.handle_request(t0, COLLECTOR, &subscribe("c1", None, 1, Some(600), EVENT))
        .expect("response");
    drain(&mut n);
    n.on_sample(t0 + MS(1500), sample(100));
    let sent = drain(&mut n);
    assert_eq!(
        sent.len(),
        1,
        "reaching 100 is reported although delta is 50"
    );
    assert_eq!(body(&sent[0]).load, 100);
    n.on_sample(t0 + MS(3000), sample(99));
    let sent = drain(&mut n);
    assert_eq!(sent.len(), 1, "falling below 100 is reported");
    assert_eq!(body(&sent[0]).load, 99);
    n.on_sample(t0 + MS(4500), sample(97));
    assert!(drain(&mut n).is_empty());
}

#[test]
fn shutdown_deactivates_every_subscription() {
    let t0 = Instant::now();
    let mut n = Notifier::new(config(), sample(30));
    for i in 0..5 {
        let resp = n
            .handle_request(
                t0,
                registrar(i),
                &subscribe(&format!("c{i}"), None, 1, Some(60), EVENT),
            )
            .expect("response");
        assert_eq!(resp.status_code, StatusCode::OK);
    }
    assert_eq!(drain(&mut n).len(), 5);
    n.shutdown(t0 + MS(10));
    let sent = drain(&mut n);
    assert_eq!(sent.len(), 5);
    for s in &sent {
        assert_eq!(
            state(s),
            SubscriptionStateHeader::terminated(TerminationReason::Deactivated)
        );
        assert_eq!(h(&s.request.headers, "CSeq"), "2 NOTIFY");
    }
    assert!(n.subscriptions().is_empty());
    let resp = n
        .handle_request(t0, COLLECTOR, &subscribe("late", None, 1, Some(60), EVENT))
        .expect("response");
    assert_eq!(resp.status_code, StatusCode::ServiceUnavailable);
}

/// Five subscriptions, one NOTIFY each drained; the notifier at `t0`.
fn five_subscriptions() -> (Notifier, Instant, Vec<NotifyTransmit>) {
    let t0 = Instant::now();
    let mut n = Notifier::new(config(), sample(30));
    for i in 0..5 {
        n.handle_request(
            t0,
            registrar(i),
            &subscribe(&format!("c{i}"), None, 1, Some(60), EVENT),
        )
        .expect("response");
    }
    let initial = drain(&mut n);
    assert_eq!(initial.len(), 5);
    (n, t0, initial)
}

fn reply(t: &NotifyTransmit, code: u16) -> Response {
    sip::response(&t.request, StatusCode::from(code), None)
}

#[test]
fn shutdown_waits_for_every_final_notify_to_be_answered() {
    let (mut n, t0, initial) = five_subscriptions();
    assert_eq!(n.finals_in_flight(), 0);
    let t1 = t0 + MS(10);
    n.shutdown(t1);
    let finals = drain(&mut n);
    assert_eq!(finals.len(), 5);
    assert_eq!(n.finals_in_flight(), 5);
    assert_eq!(n.poll_timeout(), Some(t1 + FINAL_NOTIFY_GRACE));

    // The answer to an earlier NOTIFY of the same subscription (still in
    // flight at shutdown) is not the answer to its final one.
    n.handle_notify_response(t1, initial[0].subscription, &reply(&initial[0], 200));
    n.handle_notify_failure(t1, initial[1].subscription, initial[1].cseq, "lost");
    assert_eq!(n.finals_in_flight(), 5);

    // Any final outcome counts: 200, an error (481 from a subscriber that
    // forgot the dialog), the transaction layer's 408, a transport failure.
    n.handle_notify_response(t1, finals[0].subscription, &reply(&finals[0], 200));
    n.handle_notify_response(t1, finals[1].subscription, &reply(&finals[1], 481));
    n.handle_notify_response(t1, finals[2].subscription, &reply(&finals[2], 408));
    n.handle_notify_failure(t1, finals[3].subscription, finals[3].cseq, "unreachable");
    assert_eq!(n.finals_in_flight(), 1);
    n.handle_notify_response(t1, finals[4].subscription, &reply(&finals[4], 500));
    assert_eq!(n.finals_in_flight(), 0);
    assert_eq!(n.poll_timeout(), None, "nothing left to wait for");
}

#[test]
fn unanswered_final_notifies_are_waited_for_at_most_the_grace_period() {
    let (mut n, t0, _) = five_subscriptions();
    n.shutdown(t0);
    let finals = drain(&mut n);
    n.handle_notify_response(t0, finals[0].subscription, &reply(&finals[0], 200));
    assert_eq!(n.finals_in_flight(), 4);
    let end = t0 + FINAL_NOTIFY_GRACE;
    assert_eq!(n.poll_timeout(), Some(end));
    n.handle_timeout(end - MS(1));
    assert_eq!(n.finals_in_flight(), 4, "still waiting 1 ms before the end");
    n.handle_timeout(end);
    assert_eq!(n.finals_in_flight(), 0, "the wait is over");
    assert_eq!(n.poll_timeout(), None);
    // A late answer changes nothing.
    n.handle_notify_response(end, finals[1].subscription, &reply(&finals[1], 200));
    assert_eq!(n.finals_in_flight(), 0);
}

#[test]
fn shutdown_without_subscriptions_has_nothing_to_wait_for() {
    let t0 = Instant::now();
    let mut n = Notifier::new(config(), sample(30));
    n.shutdown(t0);
    assert!(drain(&mut n).is_empty());
    assert_eq!(n.finals_in_flight(), 0);
    assert_eq!(n.poll_timeout(), None);
}

#[test]
fn other_final_notifies_are_tracked_too() {
    // Expiry (timeout) and a removed account (noresource) end subscriptions
    // with final NOTIFYs as well; they count until answered.
    let (mut n, t0, _) = subscribed(60);
    n.handle_timeout(t0 + MS(60_000));
    let sent = drain(&mut n);
    assert_eq!(
        state(&sent[0]),
        SubscriptionStateHeader::terminated(TerminationReason::Timeout)
    );
    assert_eq!(n.finals_in_flight(), 1);
    assert_eq!(n.poll_timeout(), None, "no deadline before shutdown");
    n.handle_notify_response(t0 + MS(60_010), sent[0].subscription, &reply(&sent[0], 200));
    assert_eq!(n.finals_in_flight(), 0);
}

#[test]
fn removed_account_ends_with_noresource_and_new_delta_applies_at_once() {
    let (mut n, t0, _) = subscribed(600);
    let mut cfg = config();
    cfg.load_delta = 2;
    n.on_sample(t0 + MS(2000), sample(33));
    assert!(drain(&mut n).is_empty());
    n.reconfigure(t0 + MS(2500), cfg.clone());
    let sent = drain(&mut n);
    assert_eq!(
        sent.len(),
        1,
        "the held 3-point move is worth a NOTIFY with delta 2"
    );
    assert_eq!(body(&sent[0]).load, 33);

    // The account goes, and with it its realm: the registrar's host is no
    // longer a subscriber host, yet its subscription ends with a NOTIFY.
    cfg.accounts = BTreeSet::new();
    cfg.subscribers = BTreeSet::new();
    n.reconfigure(t0 + MS(3000), cfg);
    let sent = drain(&mut n);
    assert_eq!(sent.len(), 1);
    assert_eq!(
        state(&sent[0]),
        SubscriptionStateHeader::terminated(TerminationReason::Noresource)
    );
    assert!(n.subscriptions().is_empty());
}

#[test]
fn notify_answered_481_or_lost_drops_the_subscription() {
    let t0 = Instant::now();
    let mut n = Notifier::new(config(), sample(30));
    n.handle_request(t0, COLLECTOR, &subscribe("a", None, 1, Some(60), EVENT))
        .expect("response");
    n.handle_request(t0, COLLECTOR, &subscribe("b", None, 1, Some(60), EVENT))
        .expect("response");
    n.handle_request(t0, COLLECTOR, &subscribe("c", None, 1, Some(60), EVENT))
        .expect("response");
    let sent = drain(&mut n);
    let reply =
        |t: &NotifyTransmit, code: u16| sip::response(&t.request, StatusCode::from(code), None);
    n.handle_notify_response(t0, sent[0].subscription, &reply(&sent[0], 481));
    n.handle_notify_failure(t0, sent[1].subscription, sent[1].cseq, "timeout");
    n.handle_notify_response(t0, sent[2].subscription, &reply(&sent[2], 200));
    let left: Vec<String> = n.subscriptions().into_iter().map(|s| s.call_id).collect();
    assert_eq!(left, vec!["c".to_owned()]);
}

#[test]
fn many_subscribers_each_get_their_own_dialog() {
    let t0 = Instant::now();
    let mut n = Notifier::new(config(), sample(30));
    let mut tags = BTreeSet::new();
    for i in 0..50 {
        let resp = n
            .handle_request(
                t0,
                registrar(i),
                &subscribe(&format!("c{i}"), None, 1, Some(60), EVENT),
            )
            .expect("response");
        tags.insert(sip::tag(h(&resp.headers, "To")).expect("tag"));
    }
    assert_eq!(tags.len(), 50);
    assert_eq!(drain(&mut n).len(), 50);
    n.on_sample(t0 + MS(1000), sample(80));
    assert_eq!(drain(&mut n).len(), 50);
}

#[test]
fn other_requests() {
    let t0 = Instant::now();
    let mut n = Notifier::new(config(), sample(30));
    let opt = with_method(subscribe("o", None, 1, None, EVENT), Method::Options);
    assert_eq!(
        n.handle_request(t0, COLLECTOR, &opt).map(|r| r.status_code),
        Some(StatusCode::OK)
    );
    let bye = with_method(subscribe("o", Some("x"), 2, None, EVENT), Method::Bye);
    assert_eq!(
        n.handle_request(t0, COLLECTOR, &bye).map(|r| r.status_code),
        Some(StatusCode::CallTransactionDoesNotExist)
    );
    let msg = with_method(subscribe("o", None, 3, None, EVENT), Method::Message);
    assert_eq!(
        n.handle_request(t0, COLLECTOR, &msg).map(|r| r.status_code),
        Some(StatusCode::MethodNotAllowed)
    );
    // RFC 3261 §9.2: no INVITE runs here, so no CANCEL matches.
    let cancel = with_method(subscribe("o", None, 4, None, EVENT), Method::Cancel);
    assert_eq!(
        n.handle_request(t0, COLLECTOR, &cancel)
            .map(|r| r.status_code),
        Some(StatusCode::CallTransactionDoesNotExist)
    );
}

/// Slots (SPEC §4, module docs): other processes on the registrar's host
/// get a few subscriptions, never the registrar's own: the collector,
/// subscribing from the address it registers on, always gets its slot,
/// and its new dialog replaces the one it forgot when it restarted.
#[test]
fn no_other_source_can_lock_the_registrar_out_of_its_slot() {
    let t0 = Instant::now();
    let mut n = Notifier::new(config(), sample(30));
    let mut statuses = Vec::new();
    for i in 0..8u16 {
        let r = subscribe(&format!("other{i}"), None, 1, Some(60), EVENT);
        let resp = n
            .handle_request(t0, from(&format!("127.0.0.1:{}", 40_000 + i)), &r)
            .expect("response");
        statuses.push(resp.status_code.code());
    }
    assert_eq!(statuses, [200, 200, 200, 200, 503, 503, 503, 503]);
    drain(&mut n);
    // The same other address again: its new dialog replaces its old one,
    // which is told so (RFC 6665 §4.2.2) before the new one's first NOTIFY.
    let again = n
        .handle_request(
            t0,
            from("127.0.0.1:40000"),
            &subscribe("other0b", None, 1, Some(60), EVENT),
        )
        .expect("response");
    assert_eq!(again.status_code, StatusCode::OK);
    assert_eq!(n.subscriptions().len(), 4);
    let sent: Vec<(String, String)> = drain(&mut n)
        .iter()
        .map(|t| {
            (
                h(&t.request.headers, "Call-ID").to_owned(),
                h(&t.request.headers, "Subscription-State").to_owned(),
            )
        })
        .collect();
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(sent[0].0, "other0");
    assert_eq!(sent[0].1, "terminated;reason=deactivated");
    assert_eq!(sent[1].0, "other0b");
    assert!(sent[1].1.starts_with("active;expires="), "{sent:?}");
    // The registrar: accepted however full the others' share is, and a
    // restarted one (a new dialog) replaces its dialog instead of taking
    // a second slot.
    for i in 0..3 {
        let r = subscribe(&format!("collector{i}"), None, 1, Some(60), EVENT);
        let resp = n.handle_request(t0, COLLECTOR, &r).expect("response");
        assert_eq!(resp.status_code, StatusCode::OK);
    }
    assert_eq!(n.subscriptions().len(), 5);
}

#[test]
fn subscriptions_of_other_hosts_are_capped_in_all_with_retry_after() {
    let t0 = Instant::now();
    let mut c = config();
    c.subscribers
        .extend((0..=255u8).map(|i| IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 1, i))));
    let mut n = Notifier::new(c, sample(30));
    let mut accepted = 0;
    'hosts: for host in 0..=255u8 {
        for port in 0..SUBSCRIPTIONS_PER_HOST_PER_ACCOUNT as u16 {
            let mut r = subscribe(&format!("c{host}-{port}"), None, 1, Some(60), EVENT);
            sip::set_header(
                &mut r.headers,
                "Contact",
                format!("<sip:collector@127.0.1.{host}:5060>"),
            );
            let source = from(&format!("127.0.1.{host}:{}", 6000 + port));
            let resp = n.handle_request(t0, source, &r).expect("response");
            if resp.status_code != StatusCode::OK {
                assert_eq!(resp.status_code, StatusCode::ServiceUnavailable);
                assert_eq!(h(&resp.headers, "Retry-After"), "60");
                break 'hosts;
            }
            accepted += 1;
        }
    }
    assert_eq!(accepted, MAX_SUBSCRIPTIONS);
    drain(&mut n);
    // The registrar is not counted among them.
    let resp = n
        .handle_request(
            t0,
            COLLECTOR,
            &subscribe("registrar", None, 1, Some(60), EVENT),
        )
        .expect("response");
    assert_eq!(resp.status_code, StatusCode::OK);
}

/// SPEC §3: a registrar that answers a NOTIFY 481 may have lost the
/// binding: the notifier names the account and the registrar; a 481 from
/// another subscriber does not.
#[test]
fn a_481_from_the_registrar_asks_for_a_new_register() {
    let t0 = Instant::now();
    let mut n = Notifier::new(config(), sample(30));
    n.handle_request(t0, COLLECTOR, &subscribe("c1", None, 1, Some(600), EVENT))
        .expect("response");
    let notify = drain(&mut n).remove(0);
    let response = sip::response(
        &notify.request,
        StatusCode::CallTransactionDoesNotExist,
        None,
    );
    n.handle_notify_response(t0, notify.subscription, &response);
    assert_eq!(
        n.poll_forgotten(),
        Some(("msr_1".to_owned(), SocketAddr::from(([127, 0, 0, 1], 5060))))
    );
    assert!(n.subscriptions().is_empty());
    // From another address on that host: no new REGISTER.
    let r = subscribe("other", None, 1, Some(60), EVENT);
    n.handle_request(t0, from("127.0.0.1:40000"), &r)
        .expect("response");
    let sent = drain(&mut n);
    let response = sip::response(
        &sent[0].request,
        StatusCode::CallTransactionDoesNotExist,
        None,
    );
    n.handle_notify_response(t0, sent[0].subscription, &response);
    assert_eq!(n.poll_forgotten(), None);
}

fn sample_calls(load: u8, calls: u32) -> Sample {
    Sample {
        load,
        cpu: 5,
        calls,
        max_calls: 1000,
    }
}

#[test]
fn every_change_of_calls_at_or_above_the_high_water_mark_is_notified() {
    let (mut n, t0, _) = subscribed(600);
    // Last sent: load 30. At 85 % (a move ≥ load-delta) the first NOTIFY.
    n.on_sample(t0 + MS(2000), sample_calls(85, 850));
    assert_eq!(body(&drain(&mut n)[0]).calls, 850);
    // One call more, load unchanged: near the top every call counts.
    n.on_sample(t0 + MS(3000), sample_calls(85, 851));
    let sent = drain(&mut n);
    assert_eq!(sent.len(), 1);
    assert_eq!(body(&sent[0]).calls, 851);
    // No change of calls: nothing.
    n.on_sample(t0 + MS(4000), sample_calls(85, 851));
    assert!(drain(&mut n).is_empty());
    // The step back below the mark is reported (the last NOTIFY was above).
    n.on_sample(t0 + MS(5000), sample_calls(79, 799));
    assert_eq!(body(&drain(&mut n)[0]).load, 79);
    // Below the mark, a change of calls within load-delta is not.
    n.on_sample(t0 + MS(6000), sample_calls(78, 780));
    assert!(drain(&mut n).is_empty());
}

/// SPEC §4, §10: near the top a NOTIFY may follow the last one after
/// `notify-top-interval-ms`, and the agent samples that often; below the
/// mark the one-per-`notify-min-interval-ms` window holds. Each NOTIFY says
/// how old its sample is.
#[test]
fn near_the_top_notifies_follow_each_other_after_the_top_interval() {
    let mut cfg = config();
    cfg.notify_top_interval = MS(100);
    let (mut n, t0, _) = subscribed_with(cfg, 600);
    let configured = MS(1000);
    assert_eq!(n.sample_interval(configured), configured);
    n.on_sample(t0 + MS(2000), sample_calls(90, 900));
    let first = drain(&mut n);
    assert_eq!(first.len(), 1);
    assert_eq!(body(&first[0]).sample_age_ms, Some(0));
    // Near the top: sampled every 100 ms, and notified as often.
    assert_eq!(n.sample_interval(configured), MS(100));
    n.on_sample(t0 + MS(2050), sample_calls(90, 901));
    assert!(drain(&mut n).is_empty(), "inside the 100 ms gap: held");
    assert_eq!(n.poll_timeout(), Some(t0 + MS(2100)));
    n.handle_timeout(t0 + MS(2100));
    let held = drain(&mut n);
    assert_eq!(held.len(), 1);
    assert_eq!(body(&held[0]).calls, 901);
    assert_eq!(body(&held[0]).sample_age_ms, Some(50));
    // Falling below the mark is reported after the short gap too (the
    // last NOTIFY was near the top); after it, the second-long window.
    n.on_sample(t0 + MS(2200), sample_calls(70, 700));
    assert_eq!(body(&drain(&mut n)[0]).load, 70);
    assert_eq!(n.sample_interval(configured), configured);
    n.on_sample(t0 + MS(2400), sample_calls(50, 500));
    assert!(drain(&mut n).is_empty());
    assert_eq!(n.poll_timeout(), Some(t0 + MS(3200)));
}

/// SPEC §14: a drain waits for the engine's calls to reach 0; on a large
/// MSR the last few calls ending move `load` by less than a point, so the
/// empty MSR is reported as an edge of its own.
#[test]
fn an_msr_that_empties_is_notified_whatever_its_load_did() {
    let (mut n, t0, _) = subscribed(600);
    n.on_sample(t0 + MS(2000), sample_calls(0, 5));
    assert_eq!(drain(&mut n).len(), 1, "from 30 % to 0 %: load-delta");
    n.on_sample(t0 + MS(3000), sample_calls(0, 3));
    assert!(
        drain(&mut n).is_empty(),
        "5 to 3 calls at 0 %: within load-delta"
    );
    n.on_sample(t0 + MS(4000), sample_calls(0, 0));
    let sent = drain(&mut n);
    assert_eq!(sent.len(), 1);
    assert_eq!(body(&sent[0]).calls, 0);
}

#[test]
fn high_water_changes_are_still_at_most_one_per_second_and_coalesced() {
    let (mut n, t0, _) = subscribed(600);
    n.on_sample(t0 + MS(2000), sample_calls(90, 900));
    assert_eq!(drain(&mut n).len(), 1);
    // Three changes inside the window: held, then one NOTIFY with the latest.
    n.on_sample(t0 + MS(2100), sample_calls(90, 901));
    n.on_sample(t0 + MS(2500), sample_calls(90, 902));
    n.on_sample(t0 + MS(2900), sample_calls(90, 903));
    assert!(drain(&mut n).is_empty());
    assert_eq!(n.poll_timeout(), Some(t0 + MS(3000)));
    n.handle_timeout(t0 + MS(3000));
    let sent = drain(&mut n);
    assert_eq!(sent.len(), 1);
    assert_eq!(body(&sent[0]).calls, 903);
    // A change that reverted inside the window is not sent.
    n.on_sample(t0 + MS(3200), sample_calls(90, 904));
    n.on_sample(t0 + MS(3400), sample_calls(90, 903));
    n.handle_timeout(t0 + MS(4000));
    assert!(drain(&mut n).is_empty());
}

#[test]
fn a_high_water_mark_of_101_turns_the_rule_off() {
    let mut cfg = config();
    cfg.high_water = 101;
    let rule = NotifyRule {
        load_delta: cfg.load_delta,
        high_water: cfg.high_water,
        min_interval: cfg.notify_min_interval,
        top_interval: cfg.notify_top_interval,
    };
    let last = Some(Reported {
        load: 95,
        calls: 950,
    });
    assert!(!rule.worth_notifying(
        last,
        Reported {
            load: 95,
            calls: 951
        }
    ));
    let on = NotifyRule {
        high_water: DEFAULT_HIGH_WATER,
        ..rule
    };
    assert!(on.worth_notifying(
        last,
        Reported {
            load: 95,
            calls: 951
        }
    ));
}

/// RFC 6665 §4.2.2: each response that ends the usage drops the
/// subscription (its slot is free, no NOTIFY follows); the others keep it
/// and the next load change is notified.
#[test]
fn notify_error_responses_end_the_subscription_as_rfc_6665_says() {
    let ending = [
        404, 405, 408, 410, 416, 480, 481, 482, 483, 484, 485, 489, 501, 604,
    ];
    let keeping = [200, 202, 302, 400, 401, 403, 407, 486, 491, 500, 503, 600];
    for code in ending.into_iter().chain(keeping) {
        let (mut n, t0, _) = subscribed(60);
        // A second collector's subscription, answered 200: it must be
        // untouched.
        n.handle_request(
            t0,
            registrar(1),
            &subscribe("other", None, 1, Some(60), EVENT),
        )
        .expect("response");
        let first = drain(&mut n);
        assert_eq!(first.len(), 1);
        n.handle_notify_response(t0, first[0].subscription, &reply(&first[0], 200));
        // The subscription "c1": its next NOTIFY is answered `code`.
        n.on_sample(t0 + MS(1000), sample(90));
        let sent = drain(&mut n);
        assert_eq!(sent.len(), 2, "{code}");
        let c1 = sent
            .iter()
            .find(|t| h(&t.request.headers, "Call-ID") == "c1")
            .expect("c1 notified");
        n.handle_notify_response(t0 + MS(1000), c1.subscription, &reply(c1, code));
        let ended = ending.contains(&code);
        assert_eq!(ends_subscription(code), ended, "{code}");
        let left: Vec<String> = n.subscriptions().into_iter().map(|s| s.call_id).collect();
        let expected: Vec<&str> = if ended {
            vec!["other"]
        } else {
            vec!["c1", "other"]
        };
        assert_eq!(left, expected, "{code}");
        n.on_sample(t0 + MS(2000), sample(30));
        let later: Vec<String> = drain(&mut n)
            .iter()
            .map(|t| h(&t.request.headers, "Call-ID").to_owned())
            .collect();
        assert_eq!(later, expected, "{code}: who is still notified");
    }
}

fn from(addr: &str) -> Option<SocketAddr> {
    Some(addr.parse().expect("socket address"))
}

fn with_contact(mut r: Request, contact: &str) -> Request {
    sip::set_header(&mut r.headers, "Contact", contact);
    r
}

/// RFC 6665 §6.1, §6.3, SPEC §4: a stranger's SUBSCRIBEs get 403 and
/// change nothing — no slot, no NOTIFY — so they can neither reflect
/// NOTIFYs at a victim nor lock the collector out by filling the slots.
#[test]
fn subscribes_from_a_foreign_source_get_403_and_take_no_slot() {
    let t0 = Instant::now();
    let mut n = Notifier::new(config(), sample(30));
    // At the rate strangers are answered at, so each gets its 403.
    let mut at = t0;
    for i in 0..MAX_SUBSCRIPTIONS {
        at += Duration::from_millis(50);
        // Its Contact names the collector: the victim of a reflection.
        let r = subscribe(&format!("evil{i}"), None, 1, Some(3600), EVENT);
        let resp = n
            .handle_request(at, from("192.0.2.66:5060"), &r)
            .expect("response");
        assert_eq!(resp.status_code, StatusCode::Forbidden);
    }
    assert!(drain(&mut n).is_empty(), "no NOTIFY to anyone");
    assert!(n.subscriptions().is_empty());
    assert_eq!(n.poll_timeout(), None);
    // Without a known source, too.
    let resp = n
        .handle_request(t0, None, &subscribe("nosrc", None, 1, Some(60), EVENT))
        .expect("response");
    assert_eq!(resp.status_code, StatusCode::Forbidden);
    // The collector still gets its subscription.
    let resp = n
        .handle_request(t0, COLLECTOR, &subscribe("c1", None, 1, Some(60), EVENT))
        .expect("response");
    assert_eq!(resp.status_code, StatusCode::OK);
    assert_eq!(drain(&mut n).len(), 1);
}

#[test]
fn a_contact_outside_the_subscriber_hosts_gets_403() {
    let t0 = Instant::now();
    let mut n = Notifier::new(config(), sample(30));
    for contact in [
        "<sip:victim@192.0.2.66:5060>",
        "<sip:victim@victim.example:5060>",
        "<sip:collector@[::1]:5060>",
    ] {
        let r = with_contact(subscribe("c1", None, 1, Some(60), EVENT), contact);
        let resp = n.handle_request(t0, COLLECTOR, &r).expect("response");
        assert_eq!(resp.status_code, StatusCode::Forbidden, "{contact}");
    }
    assert!(drain(&mut n).is_empty());
    assert!(n.subscriptions().is_empty());
    // A v4-mapped IPv6 source or contact is its IPv4 address.
    let r = with_contact(
        subscribe("c2", None, 1, Some(60), EVENT),
        "<sip:collector@[::ffff:127.0.0.1]:5060>",
    );
    let resp = n
        .handle_request(t0, from("[::ffff:127.0.0.1]:5060"), &r)
        .expect("response");
    assert_eq!(resp.status_code, StatusCode::OK);
    let sent = drain(&mut n);
    assert_eq!(sent.len(), 1);
}

#[test]
fn a_foreign_refresh_gets_403_and_leaves_the_dialog_as_it_was() {
    let (mut n, t0, resp) = subscribed(60);
    let tag = sip::tag(h(&resp.headers, "To")).expect("to-tag");
    // In the dialog, a higher CSeq, and a Contact to redirect the NOTIFYs.
    let r = with_contact(
        subscribe("c1", Some(&tag), 9, Some(0), EVENT),
        "<sip:victim@192.0.2.66:5060>",
    );
    let resp = n
        .handle_request(t0, from("192.0.2.66:5060"), &r)
        .expect("response");
    assert_eq!(resp.status_code, StatusCode::Forbidden);
    // The same from the collector's host, but redirecting elsewhere.
    let resp = n.handle_request(t0, COLLECTOR, &r).expect("response");
    assert_eq!(resp.status_code, StatusCode::Forbidden);
    assert!(drain(&mut n).is_empty());
    assert_eq!(n.subscriptions().len(), 1, "not ended");
    // The collector's own refresh, CSeq 2, is still in order.
    let resp = n
        .handle_request(
            t0,
            COLLECTOR,
            &subscribe("c1", Some(&tag), 2, Some(60), EVENT),
        )
        .expect("response");
    assert_eq!(resp.status_code, StatusCode::OK);
    let sent = drain(&mut n);
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0].request.uri.to_string(),
        "sip:collector@127.0.0.1:5060"
    );
}

#[test]
fn the_subscriber_hosts_can_change_and_a_removed_one_gets_no_more_notifies() {
    let t0 = Instant::now();
    let mut n = Notifier::new(config(), sample(30));
    let other: IpAddr = "192.0.2.10".parse().expect("ip");
    let resp = n
        .handle_request(t0, COLLECTOR, &subscribe("c1", None, 1, Some(60), EVENT))
        .expect("response");
    assert_eq!(resp.status_code, StatusCode::OK);
    // The other host is not allowed yet…
    let r = with_contact(
        subscribe("c2", None, 1, Some(60), EVENT),
        "<sip:collector@192.0.2.10:5060>",
    );
    let refused = n
        .handle_request(t0, from("192.0.2.10:5060"), &r)
        .expect("response");
    assert_eq!(refused.status_code, StatusCode::Forbidden);
    // …then it is (a resolved registrar name, or the allow-list), given
    // as a v4-mapped address.
    n.set_subscribers(BTreeSet::from([
        IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        IpAddr::V6(std::net::Ipv4Addr::new(192, 0, 2, 10).to_ipv6_mapped()),
    ]));
    let resp = n
        .handle_request(t0, from("192.0.2.10:5060"), &r)
        .expect("response");
    assert_eq!(resp.status_code, StatusCode::OK);
    assert_eq!(drain(&mut n).len(), 2);
    // Loopback leaves the set: its subscription ends without a NOTIFY.
    n.set_subscribers(BTreeSet::from([other]));
    assert!(drain(&mut n).is_empty());
    let left: Vec<String> = n.subscriptions().into_iter().map(|s| s.call_id).collect();
    assert_eq!(left, ["c2"]);
    n.on_sample(t0 + MS(1000), sample(90));
    let sent = drain(&mut n);
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0].request.uri.to_string(),
        "sip:collector@192.0.2.10:5060"
    );
}

/// A stranger's flood gets a bounded number of answers back (a forged
/// source would aim them at a victim); the subscriber hosts' requests are
/// always answered.
#[test]
fn answers_to_strangers_are_bounded_and_subscribers_are_always_answered() {
    let t0 = Instant::now();
    let mut n = Notifier::new(config(), sample(30));
    let answered = |n: &mut Notifier, at: Instant, count: usize| {
        (0..count)
            .filter(|i| {
                let r = subscribe(&format!("flood{i}"), None, 1, Some(60), EVENT);
                n.handle_request(at, from("192.0.2.66:5060"), &r).is_some()
            })
            .count()
    };
    assert_eq!(answered(&mut n, t0, 500), STRANGER_ANSWER_BURST as usize);
    // The collector, in the middle of the flood.
    let resp = n
        .handle_request(t0, COLLECTOR, &subscribe("c1", None, 1, Some(60), EVENT))
        .expect("the collector is answered");
    assert_eq!(resp.status_code, StatusCode::OK);
    let later = t0 + Duration::from_secs(1);
    assert_eq!(
        answered(&mut n, later, 500),
        STRANGER_ANSWERS_PER_SEC as usize
    );
    assert_eq!(n.subscriptions().len(), 1);
}

/// SPEC §14: a change of the engine's state or of the service goes to
/// every subscription at once, inside the one-per-second window too, and
/// every later NOTIFY carries it.
#[test]
fn engine_and_service_changes_go_to_every_subscription_at_once() {
    use msr_shared::event_package::{EngineState, Service};
    let (mut n, t0, _) = subscribed(600);
    let other = n
        .handle_request(
            t0,
            registrar(1),
            &subscribe("c2", None, 1, Some(600), EVENT),
        )
        .expect("response");
    assert_eq!(other.status_code, StatusCode::OK);
    let first = drain(&mut n);
    assert_eq!(first.len(), 1);
    assert_eq!(body(&first[0]).engine, EngineState::Unchecked);
    // Inside the window of both subscriptions' first NOTIFY.
    let t = t0 + MS(10);
    n.set_engine(t, EngineState::Down);
    let sent = drain(&mut n);
    assert_eq!(sent.len(), 2, "every subscription, at once");
    for notify in &sent {
        let report = body(notify);
        assert_eq!(
            (report.engine, report.service),
            (EngineState::Down, Service::Active)
        );
        assert_eq!(state(notify).state, SubState::Active);
    }
    assert!(String::from_utf8_lossy(&sent[0].request.body).contains("engine: down\n"));
    // The same state again is no change.
    n.set_engine(t + MS(10), EngineState::Down);
    assert!(drain(&mut n).is_empty());
    n.set_service(t + MS(20), Service::Draining);
    let sent = drain(&mut n);
    assert_eq!(sent.len(), 2);
    assert!(sent
        .iter()
        .all(|s| body(s).service == Service::Draining && body(s).engine == EngineState::Down));
    // A load change after that carries both too.
    n.on_sample(t0 + MS(2000), sample(90));
    let sent = drain(&mut n);
    assert_eq!(sent.len(), 2);
    assert!(sent
        .iter()
        .all(|s| body(s).service == Service::Draining && body(s).load == 90));
    assert_eq!(n.reported_state(), (EngineState::Down, Service::Draining));
}

fn codecs(list: &str) -> Option<CodecList> {
    Some(CodecList::parse_lenient(list))
}

fn body_text(n: &NotifyTransmit) -> String {
    String::from_utf8_lossy(&n.request.body).into_owned()
}

/// SPEC §4, §15: with `<codec>` every NOTIFY carries `codecs:` in the
/// config's order; without it there is no such line.
#[test]
fn every_notify_carries_the_codecs_of_the_config() {
    let t0 = Instant::now();
    let mut n = Notifier::new(
        NotifierConfig {
            codecs: codecs("pcma,pcmu,g722,h264,h263-1998,t38"),
            ..config()
        },
        sample(30),
    );
    n.handle_request(t0, COLLECTOR, &subscribe("c1", None, 1, Some(60), EVENT))
        .expect("response");
    n.on_sample(t0 + MS(1000), sample(50));
    let sent = drain(&mut n);
    assert_eq!(sent.len(), 2, "the first NOTIFY and a load update");
    for notify in &sent {
        assert!(
            body_text(notify).contains("\ncodecs: pcma,pcmu,g722,h264,h263-1998,t38\n"),
            "{}",
            body_text(notify)
        );
        assert_eq!(
            body(notify).codecs,
            codecs("pcma,pcmu,g722,h264,h263-1998,t38")
        );
    }
    // Every codec off: `none`, which is not "not known".
    let (mut n, t0, _) = subscribed(60);
    n.reconfigure(
        t0 + MS(10),
        NotifierConfig {
            codecs: codecs("none"),
            ..config()
        },
    );
    let sent = drain(&mut n);
    assert_eq!(sent.len(), 1);
    assert!(body_text(&sent[0]).ends_with("codecs: none\n"));
    // No `<codec>`: the line is left out, as before §15.
    let (mut n, t0, _) = subscribed(60);
    n.on_sample(t0 + MS(1000), sample(50));
    let sent = drain(&mut n);
    assert_eq!(sent.len(), 1);
    assert!(!body_text(&sent[0]).contains("codecs"));
    assert_eq!(body(&sent[0]).codecs, None);
}

/// SPEC §15 through §4: a reload that changes the codecs reaches every
/// subscription at once, inside the one-per-second window too, as an
/// engine state change does; one NOTIFY each, carrying the latest load as
/// well; a reload that leaves them as they were sends nothing.
#[test]
fn a_reload_that_changes_the_codecs_notifies_every_subscription_at_once() {
    let before = NotifierConfig {
        codecs: codecs("pcma,pcmu"),
        ..config()
    };
    let t0 = Instant::now();
    let mut n = Notifier::new(before.clone(), sample(30));
    for i in 0..5 {
        n.handle_request(
            t0,
            registrar(i),
            &subscribe(&format!("c{i}"), None, 1, Some(600), EVENT),
        )
        .expect("response");
    }
    let initial = drain(&mut n);
    assert_eq!(initial.len(), 5);
    assert!(initial
        .iter()
        .all(|s| body(s).codecs == codecs("pcma,pcmu")));

    // A load change inside the window is held...
    n.on_sample(t0 + MS(100), sample(45));
    assert!(drain(&mut n).is_empty());
    // ...and a reload with other codecs, still inside it, goes out now.
    let after = NotifierConfig {
        codecs: codecs("pcma,g722,h264"),
        ..before.clone()
    };
    let t = t0 + MS(200);
    n.reconfigure(t, after.clone());
    let sent = drain(&mut n);
    assert_eq!(sent.len(), 5, "every subscription, at once, once");
    let mut ids: Vec<SubscriptionId> = sent.iter().map(|s| s.subscription).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 5);
    for notify in &sent {
        assert_eq!(state(notify).state, SubState::Active);
        let report = body(notify);
        assert_eq!(report.codecs, codecs("pcma,g722,h264"));
        assert_eq!(report.load, 45, "the held change rides along");
    }
    // The held change went with it: nothing is left for the window's end.
    n.handle_timeout(t0 + MS(1000));
    n.handle_timeout(t + MS(1000));
    assert!(drain(&mut n).is_empty());

    // The same codecs again (another setting changed) are no change.
    n.reconfigure(
        t + MS(10),
        NotifierConfig {
            load_delta: 20,
            ..after.clone()
        },
    );
    assert!(drain(&mut n).is_empty());

    // `<codec>` removed: not known any more, said at once too.
    n.reconfigure(
        t + MS(20),
        NotifierConfig {
            codecs: None,
            ..after
        },
    );
    let sent = drain(&mut n);
    assert_eq!(sent.len(), 5);
    assert!(sent.iter().all(|s| !body_text(s).contains("codecs")));
}

/// A reload that changes the codecs and removes an account: that
/// account's subscription gets its final `noresource` NOTIFY only, the
/// others the new codecs.
#[test]
fn a_subscription_ended_by_the_same_reload_gets_only_its_final_notify() {
    let t0 = Instant::now();
    let mut cfg = NotifierConfig {
        accounts: BTreeSet::from(["msr_1".to_owned(), "msr_2".to_owned()]),
        codecs: codecs("pcma"),
        ..config()
    };
    let mut n = Notifier::new(cfg.clone(), sample(30));
    n.handle_request(
        t0,
        registrar(0),
        &subscribe("c1", None, 1, Some(600), EVENT),
    )
    .expect("response");
    n.handle_request(
        t0,
        registrar(1),
        &subscribe_to("msr_2", "c2", None, 1, Some(600), EVENT),
    )
    .expect("response");
    assert_eq!(drain(&mut n).len(), 2);
    cfg.accounts = BTreeSet::from(["msr_2".to_owned()]);
    cfg.codecs = codecs("pcma,h264");
    n.reconfigure(t0 + MS(10), cfg);
    let sent = drain(&mut n);
    assert_eq!(sent.len(), 2, "{sent:?}");
    let by_msr = |msr: &str| {
        sent.iter()
            .find(|s| body(s).msr == msr)
            .unwrap_or_else(|| panic!("a notify for {msr}"))
    };
    assert_eq!(
        state(by_msr("msr_1")),
        SubscriptionStateHeader::terminated(TerminationReason::Noresource)
    );
    assert_eq!(state(by_msr("msr_2")).state, SubState::Active);
    assert_eq!(body(by_msr("msr_2")).codecs, codecs("pcma,h264"));
}

/// SPEC §16: the agent's port answers what no daemon may act on as the
/// collector's ports do (RFC 3261 §8.2, RFC 4475 §3.1.2.16/17): 505 to
/// another SIP version, 400 to a CSeq method that is not the request's,
/// and subscribes nothing.
#[test]
fn requests_no_daemon_may_act_on_are_refused_before_any_state() {
    let t0 = Instant::now();
    let mut n = Notifier::new(config(), sample(30));
    let mut other_version = subscribe("v1", None, 1, Some(60), EVENT);
    other_version.version = rsipstack::sip::Version::V(7, 0);
    let resp = n
        .handle_request(t0, COLLECTOR, &other_version)
        .expect("response");
    assert_eq!(resp.status_code.code(), 505);
    let mut mismatch = with_method(subscribe("m1", None, 1, Some(60), EVENT), Method::Options);
    mismatch.method = Method::Subscribe;
    let resp = n
        .handle_request(t0, COLLECTOR, &mismatch)
        .expect("response");
    assert_eq!(resp.status_code, StatusCode::BadRequest);
    assert!(drain(&mut n).is_empty(), "nothing subscribed");
}

/// `req` as a request of `method`, its CSeq naming it (RFC 3261 §8.1.1.5).
fn with_method(mut req: Request, method: Method) -> Request {
    for header in req.headers.iter_mut() {
        if let msr_shared::sip::Header::CSeq(cseq) = header {
            let number = cseq
                .value()
                .split_whitespace()
                .next()
                .unwrap_or("1")
                .to_owned();
            *header = msr_shared::sip::Header::CSeq(format!("{number} {method}").into());
        }
    }
    req.method = method;
    req
}

/// A peer on an allowed host may replace its own subscription as often as
/// it likes: the line that says so goes to the rate-limited `network`
/// target, as "subscription created" does, and only the registrar's is
/// logged unlimited.
#[test]
fn a_replacement_by_another_source_is_logged_rate_limited() {
    let log = Captured::default();
    log.during(|| {
        let t0 = Instant::now();
        let mut n = Notifier::new(config(), sample(30));
        for (i, (source, call_id)) in [
            (from("127.0.0.1:40000"), "other"),
            (from("127.0.0.1:40000"), "other-b"),
            (COLLECTOR, "core"),
            (COLLECTOR, "core-b"),
        ]
        .into_iter()
        .enumerate()
        {
            let r = subscribe(call_id, None, 1, Some(60), EVENT);
            let resp = n.handle_request(t0, source, &r).expect("response");
            assert_eq!(resp.status_code, StatusCode::OK, "{i}");
        }
    });
    let text = log.text();
    let replaced: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("subscription replaced"))
        .collect();
    assert_eq!(replaced.len(), 2, "{text}");
    assert!(replaced[0].contains(" network: "), "{}", replaced[0]);
    assert!(!replaced[1].contains(" network: "), "{}", replaced[1]);
}
