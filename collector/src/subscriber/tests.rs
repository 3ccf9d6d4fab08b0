use super::*;
use crate::load_table::{ContactBinding, LoadTable};
use crate::operator::OperatorConfig;

const BODY: &str = "msr: msr_1\nload: 37\ncpu: 21\ncalls: 303\nmax-calls: 8192\n";

fn subscriber() -> Subscriber {
    Subscriber::new(SubscriberConfig {
        local_uri: "sip:collector@127.0.0.1:5060".into(),
        contact: "sip:collector@127.0.0.1:5060".into(),
        default_expires: 60,
    })
}

fn lo() -> Target {
    Target { name: "lo@msr_1".into(), uri: "sip:msr_1@127.0.0.1:5070".into() }
}

fn eth() -> Target {
    Target { name: "eth0@msr_1".into(), uri: "sip:msr_1@10.0.0.1:5070".into() }
}

fn transmits(s: &mut Subscriber) -> Vec<Transmit> {
    std::iter::from_fn(|| s.poll_transmit()).collect()
}

fn events(s: &mut Subscriber) -> Vec<SubscriberEvent> {
    std::iter::from_fn(|| s.poll_event()).collect()
}

fn one(s: &mut Subscriber) -> Transmit {
    let mut t = transmits(s);
    assert_eq!(t.len(), 1, "{t:?}");
    t.remove(0)
}

fn h<'a>(t: &'a Transmit, name: &str) -> &'a str {
    sip::header(&t.request.headers, name).unwrap_or_else(|| panic!("no {name}"))
}

fn answer(t: &Transmit, status: StatusCode, expires: Option<u32>) -> Response {
    let mut r = sip::response(&t.request, status, Some("agent-tag"));
    if let Some(e) = expires {
        sip::push_header(&mut r.headers, "Expires", e.to_string());
    }
    sip::push_header(&mut r.headers, "Contact", "<sip:msr_1@127.0.0.1:5070>");
    r
}

/// A NOTIFY from the agent in the dialog of SUBSCRIBE `t`.
fn notify(t: &Transmit, call_id: &str, from_tag: &str, state: &str, body: &str) -> Request {
    let to = h(t, "From");
    let from = format!("{};tag={from_tag}", sip::addr_uri(h(t, "To")));
    let text = format!(
        "NOTIFY sip:collector@127.0.0.1:5060 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bKn{}\r\n\
         From: <{from}\r\nTo: {to}\r\nCall-ID: {call_id}\r\nCSeq: 1 NOTIFY\r\nEvent: eltex-call-count\r\n\
         Subscription-State: {state}\r\nContent-Type: application/x-eltex-call-count\r\nContent-Length: {}\r\n\r\n{body}",
        sip::random_token(),
        body.len()
    )
    .replacen(&format!("From: <{from}"), &format!("From: <{}>;tag={from_tag}", sip::addr_uri(h(t, "To"))), 1);
    Request::try_from(text.as_str()).expect("notify parses")
}

/// Registers `lo`, answers the first SUBSCRIBE with 200 (expires 60).
fn active(s: &mut Subscriber, now: Instant) -> Transmit {
    s.contacts_changed(now, "msr_1", vec![lo()]);
    let t = one(s);
    s.handle_response(now, t.id, &answer(&t, StatusCode::OK, Some(60)));
    events(s);
    t
}

#[test]
fn registration_triggers_the_first_subscribe() {
    let mut s = subscriber();
    let now = Instant::now();
    s.contacts_changed(now, "msr_1", vec![lo()]);
    let t = one(&mut s);
    assert_eq!(t.request.method, Method::Subscribe);
    assert_eq!(t.request.uri.to_string(), "sip:msr_1@127.0.0.1:5070");
    assert_eq!(h(&t, "Event"), "eltex-call-count");
    assert_eq!(h(&t, "Accept"), "application/x-eltex-call-count");
    assert_eq!(h(&t, "Expires"), "60");
    assert_eq!(h(&t, "Contact"), "<sip:collector@127.0.0.1:5060>");
    assert_eq!(h(&t, "CSeq"), "1 SUBSCRIBE");
    assert!(sip::tag(h(&t, "From")).is_some());
    assert!(sip::tag(h(&t, "To")).is_none());
    assert_eq!(s.view("msr_1").expect("view").status, SubscriptionStatus::Pending);
    assert_eq!(s.view("msr_1").expect("view").event_id.len(), 16);
    // A refresh of the same registration sends nothing new.
    s.contacts_changed(now, "msr_1", vec![lo()]);
    assert!(transmits(&mut s).is_empty());
}

#[test]
fn grant_then_refresh_in_dialog_at_eighty_percent() {
    let mut s = subscriber();
    let t0 = Instant::now();
    let first = active(&mut s, t0);
    let v = s.view("msr_1").expect("view");
    assert_eq!((v.status, v.expires_secs), (SubscriptionStatus::Active, 60));
    assert_eq!(s.poll_timeout(), Some(t0 + Duration::from_secs(48)));
    s.handle_timeout(t0 + Duration::from_secs(47));
    assert!(transmits(&mut s).is_empty());
    s.handle_timeout(t0 + Duration::from_secs(48));
    let r = one(&mut s);
    assert_eq!(h(&r, "Call-ID"), h(&first, "Call-ID"));
    assert_eq!(sip::tag(h(&r, "To")).as_deref(), Some("agent-tag"));
    assert_eq!(h(&r, "CSeq"), "2 SUBSCRIBE");
    let t1 = t0 + Duration::from_secs(48);
    s.handle_response(t1, r.id, &answer(&r, StatusCode::OK, Some(30)));
    assert!(matches!(&events(&mut s)[..], [SubscriberEvent::Refreshed { expires: 30, .. }]));
    assert_eq!(s.poll_timeout(), Some(t1 + Duration::from_secs(24)));
}

#[test]
fn refresh_delay_rule() {
    assert_eq!(refresh_delay(60), Duration::from_secs(48));
    assert_eq!(refresh_delay(20), Duration::from_secs(15));
    assert_eq!(refresh_delay(10), Duration::from_secs(5));
    assert_eq!(refresh_delay(4), Duration::from_secs(2));
}

#[test]
fn notify_in_dialog_updates_load_and_counters() {
    let mut s = subscriber();
    let now = Instant::now();
    let t = active(&mut s, now);
    let n = notify(&t, h(&t, "Call-ID"), "agent-tag", "active;expires=60", BODY);
    let resp = s.handle_notify(now, 1_700_000_000, &n);
    assert_eq!(resp.status_code, StatusCode::OK);
    let ev = events(&mut s);
    let [SubscriberEvent::Load { msr, report, at }] = &ev[..] else { panic!("{ev:?}") };
    assert_eq!((msr.as_str(), report.load, *at), ("msr_1", 37, now));
    let v = s.view("msr_1").expect("view");
    assert_eq!((v.notify_count, v.last_notify_unix), (1, Some(1_700_000_000)));
}

#[test]
fn notify_outside_our_dialogs_gets_481_and_changes_nothing() {
    let mut s = subscriber();
    let now = Instant::now();
    let t = active(&mut s, now);
    for n in [
        notify(&t, "unknown@elsewhere", "agent-tag", "active", BODY),
        notify(&t, h(&t, "Call-ID"), "another-tag", "active", BODY),
    ] {
        assert_eq!(s.handle_notify(now, 1, &n).status_code, StatusCode::CallTransactionDoesNotExist);
    }
    assert!(events(&mut s).is_empty());
    assert_eq!(s.view("msr_1").expect("view").notify_count, 0);
}

#[test]
fn unreadable_body_gets_400_and_keeps_the_last_load() {
    let mut s = subscriber();
    let now = Instant::now();
    let t = active(&mut s, now);
    let bad = notify(&t, h(&t, "Call-ID"), "agent-tag", "active", "load: lots\n");
    assert_eq!(s.handle_notify(now, 1, &bad).status_code, StatusCode::BadRequest);
    assert!(events(&mut s).is_empty());
    assert_eq!(s.view("msr_1").expect("view").notify_count, 0);
}

#[test]
fn a_notify_racing_ahead_of_the_200_is_accepted() {
    let mut s = subscriber();
    let now = Instant::now();
    s.contacts_changed(now, "msr_1", vec![lo()]);
    let t = one(&mut s);
    let n = notify(&t, h(&t, "Call-ID"), "agent-tag", "active;expires=60", BODY);
    assert_eq!(s.handle_notify(now, 1, &n).status_code, StatusCode::OK);
    s.handle_response(now, t.id, &answer(&t, StatusCode::OK, Some(60)));
    let ev = events(&mut s);
    assert!(matches!(&ev[..], [SubscriberEvent::Load { .. }, SubscriberEvent::Active { .. }]), "{ev:?}");
}

#[tokio::test(start_paused = true)]
async fn no_notify_within_expiry_makes_the_row_stale() {
    let mut s = subscriber();
    let mut table = LoadTable::new("core1@localhost".into());
    let operator = OperatorConfig::new();
    let t0 = Instant::now();
    table.upsert_contact(
        ContactBinding {
            contact: "lo@msr_1".into(),
            msr: "msr_1".into(),
            uri: lo().uri,
            version: Some("0.1.0".into()),
            expires_at: t0 + Duration::from_secs(3600),
        },
        &operator,
        "default",
        "local",
    );
    let t = active(&mut s, t0);
    s.handle_notify(t0, 1, &notify(&t, h(&t, "Call-ID"), "agent-tag", "active;expires=60", BODY));
    for ev in events(&mut s) {
        if let SubscriberEvent::Load { msr, report, at } = ev {
            table.set_load(&msr, report, at);
        }
    }
    for (msr, view) in s.views() {
        table.set_subscription(&msr, view);
    }
    tokio::time::advance(Duration::from_secs(59)).await;
    assert!(!table.rows(Instant::now())[0].stale);
    tokio::time::advance(Duration::from_secs(2)).await;
    let row = &table.rows(Instant::now())[0];
    assert!(row.stale, "{row:?}");
    assert_eq!(row.load.as_ref().map(|r| r.load), Some(37));
}

#[test]
fn terminated_timeout_resubscribes_at_once_with_a_new_dialog() {
    let mut s = subscriber();
    let now = Instant::now();
    let t = active(&mut s, now);
    let n = notify(&t, h(&t, "Call-ID"), "agent-tag", "terminated;reason=timeout", "");
    assert_eq!(s.handle_notify(now, 1, &n).status_code, StatusCode::OK);
    assert!(matches!(&events(&mut s)[..], [SubscriberEvent::Terminated { retry_at: Some(at), .. }] if *at == now));
    assert_eq!(s.poll_timeout(), Some(now));
    s.handle_timeout(now);
    let again = one(&mut s);
    assert_ne!(h(&again, "Call-ID"), h(&t, "Call-ID"));
    assert!(sip::tag(h(&again, "To")).is_none());
}

#[test]
fn terminated_probation_honours_retry_after() {
    let mut s = subscriber();
    let now = Instant::now();
    let t = active(&mut s, now);
    let n = notify(&t, h(&t, "Call-ID"), "agent-tag", "terminated;reason=probation;retry-after=30", "");
    s.handle_notify(now, 1, &n);
    assert_eq!(s.poll_timeout(), Some(now + Duration::from_secs(30)));
    s.handle_timeout(now + Duration::from_secs(29));
    assert!(transmits(&mut s).is_empty());
    s.handle_timeout(now + Duration::from_secs(30));
    assert_eq!(transmits(&mut s).len(), 1);
}

#[test]
fn terminated_noresource_waits_for_a_new_registration() {
    let mut s = subscriber();
    let now = Instant::now();
    let t = active(&mut s, now);
    let n = notify(&t, h(&t, "Call-ID"), "agent-tag", "terminated;reason=noresource", "");
    s.handle_notify(now, 1, &n);
    assert!(matches!(&events(&mut s)[..], [SubscriberEvent::Terminated { retry_at: None, .. }]));
    assert_eq!(s.poll_timeout(), None);
    assert_eq!(s.view("msr_1").expect("view").status, SubscriptionStatus::Terminated("noresource".into()));
    s.contacts_changed(now, "msr_1", vec![lo()]);
    assert!(transmits(&mut s).is_empty(), "a registration refresh is not a new registration");
    s.contacts_changed(now, "msr_1", vec![lo(), eth()]);
    assert_eq!(transmits(&mut s).len(), 1);
}

#[test]
fn refused_and_481_and_timeouts_back_off_then_reset() {
    let mut s = subscriber();
    let t0 = Instant::now();
    s.contacts_changed(t0, "msr_1", vec![lo()]);
    let mut now = t0;
    let mut delays = Vec::new();
    for status in [StatusCode::ServiceUnavailable, StatusCode::RequestTimeout, StatusCode::Forbidden] {
        let t = one(&mut s);
        s.handle_response(now, t.id, &answer(&t, status, None));
        let ev = events(&mut s);
        let [SubscriberEvent::Retrying { delay, .. }] = &ev[..] else { panic!("{ev:?}") };
        delays.push(delay.as_secs());
        assert_eq!(s.view("msr_1").expect("view").status, SubscriptionStatus::Failed);
        now += *delay;
        s.handle_timeout(now);
    }
    // A transport failure counts too.
    let t = one(&mut s);
    s.handle_failure(now, t.id, "timeout");
    let ev = events(&mut s);
    assert!(matches!(&ev[..], [SubscriberEvent::Retrying { delay, .. }] if delay.as_secs() == 8));
    assert_eq!(delays, vec![1, 2, 4]);
    now += Duration::from_secs(8);
    s.handle_timeout(now);
    let t = one(&mut s);
    s.handle_response(now, t.id, &answer(&t, StatusCode::OK, Some(60)));
    events(&mut s);
    // 481 to a refresh: a new dialog after a reset backoff (1 s).
    s.handle_timeout(now + Duration::from_secs(48));
    let r = one(&mut s);
    s.handle_response(now, r.id, &answer(&r, StatusCode::CallTransactionDoesNotExist, None));
    let ev = events(&mut s);
    assert!(matches!(&ev[..], [SubscriberEvent::Retrying { delay, cause, .. }] if delay.as_secs() == 1 && cause == "481"), "{ev:?}");
    s.handle_timeout(now + Duration::from_secs(1));
    let fresh = one(&mut s);
    assert_ne!(h(&fresh, "Call-ID"), h(&t, "Call-ID"));
}

#[test]
fn backoff_is_capped_at_sixty_seconds() {
    let mut s = subscriber();
    let mut now = Instant::now();
    s.contacts_changed(now, "msr_1", vec![lo()]);
    let mut last = Duration::ZERO;
    for _ in 0..10 {
        let t = one(&mut s);
        s.handle_failure(now, t.id, "no route");
        let ev = events(&mut s);
        let [SubscriberEvent::Retrying { delay, .. }] = &ev[..] else { panic!("{ev:?}") };
        last = *delay;
        now += *delay;
        s.handle_timeout(now);
    }
    assert_eq!(last, RETRY_CAP);
}

#[test]
fn interval_too_brief_is_retried_with_min_expires() {
    let mut s = subscriber();
    let now = Instant::now();
    s.set_expires_override("msr_1", Some(5));
    s.contacts_changed(now, "msr_1", vec![lo()]);
    let t = one(&mut s);
    assert_eq!(h(&t, "Expires"), "5");
    let mut r = sip::response(&t.request, StatusCode::IntervalTooBrief, Some("x"));
    sip::push_header(&mut r.headers, "Min-Expires", "30");
    s.handle_response(now, t.id, &r);
    let again = one(&mut s);
    assert_eq!(h(&again, "Expires"), "30");
}

#[test]
fn operator_expires_applies_at_the_next_refresh() {
    let mut s = subscriber();
    let now = Instant::now();
    let t = active(&mut s, now);
    assert_eq!(h(&t, "Expires"), "60");
    s.set_expires_override("msr_1", Some(30));
    s.handle_timeout(now + Duration::from_secs(48));
    assert_eq!(h(&one(&mut s), "Expires"), "30");
}

#[test]
fn unregistration_ends_the_dialog_with_expires_zero() {
    let mut s = subscriber();
    let now = Instant::now();
    let t = active(&mut s, now);
    s.contacts_changed(now, "msr_1", vec![]);
    let u = one(&mut s);
    assert_eq!(h(&u, "Expires"), "0");
    assert_eq!(h(&u, "Call-ID"), h(&t, "Call-ID"));
    assert_eq!(sip::tag(h(&u, "To")).as_deref(), Some("agent-tag"));
    assert!(matches!(&events(&mut s)[..], [SubscriberEvent::Ended { .. }]));
    assert!(s.view("msr_1").is_none());
    assert_eq!(s.poll_timeout(), None);
    // A late NOTIFY in the ended dialog gets 481.
    let n = notify(&t, h(&t, "Call-ID"), "agent-tag", "terminated;reason=timeout", "");
    assert_eq!(s.handle_notify(now, 1, &n).status_code, StatusCode::CallTransactionDoesNotExist);
}

#[test]
fn the_subscription_moves_when_its_contact_goes() {
    let mut s = subscriber();
    let now = Instant::now();
    s.contacts_changed(now, "msr_1", vec![lo(), eth()]);
    let t = one(&mut s);
    assert_eq!(t.request.uri.to_string(), eth().uri, "first contact by name");
    s.handle_response(now, t.id, &answer(&t, StatusCode::OK, Some(60)));
    s.contacts_changed(now, "msr_1", vec![lo()]);
    let moved = one(&mut s);
    assert_eq!(moved.request.uri.to_string(), lo().uri);
    assert_ne!(h(&moved, "Call-ID"), h(&t, "Call-ID"));
}

#[test]
fn shutdown_unsubscribes_every_active_dialog() {
    let mut s = subscriber();
    let now = Instant::now();
    active(&mut s, now);
    assert_eq!(s.shutdown(now), 1);
    let u = one(&mut s);
    assert_eq!(h(&u, "Expires"), "0");
    assert_eq!(s.pending_unsubscribes(), 1);
    s.handle_response(now, u.id, &answer(&u, StatusCode::OK, Some(0)));
    assert_eq!(s.pending_unsubscribes(), 0);
}

#[test]
fn unanswered_expiry_starts_a_new_dialog() {
    let mut s = subscriber();
    let now = Instant::now();
    active(&mut s, now);
    s.handle_timeout(now + Duration::from_secs(48));
    let _refresh_never_answered = one(&mut s);
    s.handle_timeout(now + Duration::from_secs(60));
    assert!(matches!(&events(&mut s)[..], [SubscriberEvent::Retrying { cause, .. }] if cause == "expired"));
}
