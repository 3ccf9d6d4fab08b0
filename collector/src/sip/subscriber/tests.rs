use super::*;
use crate::model::load_table::{Change, LoadTable, Placement};
use crate::operator::OperatorConfig;
use std::collections::{BTreeSet, HashMap};

/// Where `lo`'s agent sends its NOTIFYs from: the address subscribed to.
const AGENT: Option<SocketAddr> = Some(SocketAddr::new(
    std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
    5070,
));

const BODY: &str = "msr: msr_1\nload: 37\ncpu: 21\ncalls: 303\nmax-calls: 8192\n";

fn subscriber() -> Subscriber {
    Subscriber::new(SubscriberConfig {
        local_uri: "sip:collector@127.0.0.1:5060".into(),
        contact: "sip:collector@127.0.0.1:5060".into(),
        default_expires: 60,
    })
}

/// A binding of contact `name` of `msr` at `uri`, as the registrar holds it.
fn binding(name: &str, msr: &str, uri: &str) -> Binding {
    Binding::test(name, msr, uri, Instant::now() + Duration::from_secs(3600))
}

fn lo() -> Binding {
    binding("lo@msr_1", "msr_1", "sip:msr_1@127.0.0.1:5070")
}

fn eth() -> Binding {
    binding("eth0@msr_1", "msr_1", "sip:msr_1@10.0.0.1:5070")
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
    s.contacts_changed(now, "msr_1", [&lo()]);
    let t = one(s);
    s.handle_response(now, t.id, &answer(&t, StatusCode::OK, Some(60)));
    events(s);
    t
}

#[test]
fn registration_triggers_the_first_subscribe() {
    let mut s = subscriber();
    let now = Instant::now();
    s.contacts_changed(now, "msr_1", [&lo()]);
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
    assert_eq!(
        s.view("msr_1").expect("view").status,
        SubscriptionState::Pending
    );
    assert_eq!(s.view("msr_1").expect("view").event_id.len(), 16);
    // A refresh of the same registration sends nothing new.
    s.contacts_changed(now, "msr_1", [&lo()]);
    assert!(transmits(&mut s).is_empty());
}

#[test]
fn grant_then_refresh_in_dialog_forty_five_seconds_before_expiry() {
    let mut s = subscriber();
    let t0 = Instant::now();
    let first = active(&mut s, t0);
    let v = s.view("msr_1").expect("view");
    assert_eq!((v.status, v.expires_secs), (SubscriptionState::Active, 60));
    assert_eq!(s.poll_timeout(), Some(t0 + Duration::from_secs(15)));
    s.handle_timeout(t0 + Duration::from_secs(14));
    assert!(transmits(&mut s).is_empty());
    s.handle_timeout(t0 + Duration::from_secs(15));
    let r = one(&mut s);
    assert_eq!(h(&r, "Call-ID"), h(&first, "Call-ID"));
    assert_eq!(sip::tag(h(&r, "To")).as_deref(), Some("agent-tag"));
    assert_eq!(h(&r, "CSeq"), "2 SUBSCRIBE");
    let t1 = t0 + Duration::from_secs(15);
    s.handle_response(t1, r.id, &answer(&r, StatusCode::OK, Some(30)));
    assert!(matches!(
        &events(&mut s)[..],
        [SubscriberEvent::Refreshed { expires: 30, .. }]
    ));
    assert_eq!(s.poll_timeout(), Some(t1 + Duration::from_millis(7_500)));
}

/// A refresh whose every copy is lost ends in a local 408 at Timer F; the
/// subscriber's retry must still go out before the grant lapses, for every
/// `E` that leaves room for it (here 60, 120 and 3600 s), and a very short
/// `E` still refreshes before expiry.
#[test]
fn a_refresh_lost_until_timer_f_is_retried_before_expiry() {
    use msr_shared::refresh::TIMER_F;
    for e in [60u32, 120, 3600] {
        let mut s = subscriber();
        let t0 = Instant::now();
        s.contacts_changed(t0, "msr_1", [&lo()]);
        let t = one(&mut s);
        s.handle_response(t0, t.id, &answer(&t, StatusCode::OK, Some(e)));
        events(&mut s);
        let expiry = t0 + Duration::from_secs(u64::from(e));
        let refresh_at = s.poll_timeout().expect("refresh scheduled");
        s.handle_timeout(refresh_at);
        let refresh = one(&mut s);
        assert_eq!(h(&refresh, "Call-ID"), h(&t, "Call-ID"), "E = {e}");
        // Every copy lost: the transaction layer reports Timer F.
        let gave_up = refresh_at + TIMER_F;
        s.handle_failure(gave_up, refresh.id, RetryCause::TimedOut);
        let retry_at = s.poll_timeout().expect("retry scheduled");
        s.handle_timeout(retry_at);
        let retry = one(&mut s);
        assert_eq!(retry.request.method, Method::Subscribe, "E = {e}");
        // The retry and its first four retransmissions (7.5 s) go before
        // the old grant lapses.
        assert!(
            retry_at + Duration::from_millis(7_500) <= expiry,
            "E = {e}: retry {:?} after the grant, expiry {e} s",
            retry_at - t0
        );
    }
    // A very short grant: refreshed before it lapses (at a quarter of it).
    let mut s = subscriber();
    let t0 = Instant::now();
    s.contacts_changed(t0, "msr_1", [&lo()]);
    let t = one(&mut s);
    s.handle_response(t0, t.id, &answer(&t, StatusCode::OK, Some(8)));
    events(&mut s);
    assert_eq!(s.poll_timeout(), Some(t0 + Duration::from_secs(2)));
}

#[test]
fn notify_in_dialog_updates_load_and_counters() {
    let mut s = subscriber();
    let now = Instant::now();
    let t = active(&mut s, now);
    let n = notify(&t, h(&t, "Call-ID"), "agent-tag", "active;expires=60", BODY);
    let resp = s.handle_notify(now, 1_700_000_000, AGENT, &n);
    assert_eq!(resp.status_code, StatusCode::OK);
    let ev = events(&mut s);
    let [SubscriberEvent::Load { msr, report, at }] = &ev[..] else {
        panic!("{ev:?}")
    };
    assert_eq!((msr.as_str(), report.load, *at), ("msr_1", 37, now));
    let v = s.view("msr_1").expect("view");
    assert_eq!(
        (v.notify_count, v.last_notify_unix),
        (1, Some(1_700_000_000))
    );
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
        assert_eq!(
            s.handle_notify(now, 1, AGENT, &n).status_code,
            StatusCode::CallTransactionDoesNotExist
        );
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
    assert_eq!(
        s.handle_notify(now, 1, AGENT, &bad).status_code,
        StatusCode::BadRequest
    );
    assert!(events(&mut s).is_empty());
    assert_eq!(s.view("msr_1").expect("view").notify_count, 0);
}

#[test]
fn a_notify_racing_ahead_of_the_200_is_accepted() {
    let mut s = subscriber();
    let now = Instant::now();
    s.contacts_changed(now, "msr_1", [&lo()]);
    let t = one(&mut s);
    let n = notify(&t, h(&t, "Call-ID"), "agent-tag", "active;expires=60", BODY);
    assert_eq!(
        s.handle_notify(now, 1, AGENT, &n).status_code,
        StatusCode::OK
    );
    s.handle_response(now, t.id, &answer(&t, StatusCode::OK, Some(60)));
    let ev = events(&mut s);
    assert!(
        matches!(
            &ev[..],
            [SubscriberEvent::Load { .. }, SubscriberEvent::Active { .. }]
        ),
        "{ev:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn no_notify_within_expiry_makes_the_row_stale() {
    let mut s = subscriber();
    let defaults = Placement::new("default", "local").expect("a test's placement");
    let mut table = LoadTable::new("core1@localhost".into(), defaults);
    let operator = OperatorConfig::new();
    let t0 = Instant::now();
    table.apply(&operator, Change::BindingChanged(&lo()));
    let t = active(&mut s, t0);
    s.handle_notify(
        t0,
        1,
        AGENT,
        &notify(&t, h(&t, "Call-ID"), "agent-tag", "active;expires=60", BODY),
    );
    for ev in events(&mut s) {
        if let SubscriberEvent::Load { msr, report, at } = ev {
            let change = Change::LoadReported {
                msr: &msr,
                report,
                at,
            };
            table.apply(&operator, change);
        }
    }
    while let Some((msr, view)) = s.poll_view_change() {
        let change = Change::SubscriptionChanged {
            msr: &msr,
            expires_secs: view.expires_secs,
        };
        table.apply(&operator, change);
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
    let n = notify(
        &t,
        h(&t, "Call-ID"),
        "agent-tag",
        "terminated;reason=timeout",
        "",
    );
    assert_eq!(
        s.handle_notify(now, 1, AGENT, &n).status_code,
        StatusCode::OK
    );
    assert!(
        matches!(&events(&mut s)[..], [SubscriberEvent::Terminated { retry_at: Some(at), .. }] if *at == now)
    );
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
    let n = notify(
        &t,
        h(&t, "Call-ID"),
        "agent-tag",
        "terminated;reason=probation;retry-after=30",
        "",
    );
    s.handle_notify(now, 1, AGENT, &n);
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
    let n = notify(
        &t,
        h(&t, "Call-ID"),
        "agent-tag",
        "terminated;reason=noresource",
        "",
    );
    s.handle_notify(now, 1, AGENT, &n);
    assert!(matches!(
        &events(&mut s)[..],
        [SubscriberEvent::Terminated { retry_at: None, .. }]
    ));
    assert_eq!(s.poll_timeout(), None);
    assert_eq!(
        s.view("msr_1").expect("view").status,
        SubscriptionState::Terminated(Some(TerminationReason::Noresource))
    );
    s.contacts_changed(now, "msr_1", [&lo()]);
    assert!(
        transmits(&mut s).is_empty(),
        "a registration refresh is not a new registration"
    );
    s.contacts_changed(now, "msr_1", [&lo(), &eth()]);
    assert_eq!(transmits(&mut s).len(), 1);
}

#[test]
fn refused_and_481_and_timeouts_back_off_then_reset() {
    let mut s = subscriber();
    let t0 = Instant::now();
    s.contacts_changed(t0, "msr_1", [&lo()]);
    let mut now = t0;
    let mut delays = Vec::new();
    for status in [
        StatusCode::ServiceUnavailable,
        StatusCode::RequestTimeout,
        StatusCode::Forbidden,
    ] {
        let t = one(&mut s);
        s.handle_response(now, t.id, &answer(&t, status, None));
        let ev = events(&mut s);
        let [SubscriberEvent::Retrying { delay, .. }] = &ev[..] else {
            panic!("{ev:?}")
        };
        delays.push(delay.as_secs());
        assert_eq!(
            s.view("msr_1").expect("view").status,
            SubscriptionState::Failed
        );
        now += *delay;
        s.handle_timeout(now);
    }
    // A transport failure counts too.
    let t = one(&mut s);
    s.handle_failure(now, t.id, RetryCause::TimedOut);
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
    s.handle_response(
        now,
        r.id,
        &answer(&r, StatusCode::CallTransactionDoesNotExist, None),
    );
    let ev = events(&mut s);
    assert!(
        matches!(&ev[..], [SubscriberEvent::Retrying { delay, cause, .. }] if delay.as_secs() == 1 && *cause == RetryCause::Status(481)),
        "{ev:?}"
    );
    s.handle_timeout(now + Duration::from_secs(1));
    let fresh = one(&mut s);
    assert_ne!(h(&fresh, "Call-ID"), h(&t, "Call-ID"));
}

#[test]
fn backoff_is_capped_at_sixty_seconds() {
    let mut s = subscriber();
    let mut now = Instant::now();
    s.contacts_changed(now, "msr_1", [&lo()]);
    let mut last = Duration::ZERO;
    for _ in 0..10 {
        let t = one(&mut s);
        s.handle_failure(
            now,
            t.id,
            RetryCause::NotSent(crate::sip::not_sent::NotSent::NoTlsConnection {
                to: "127.0.0.2:5071".parse().expect("addr"),
            }),
        );
        let ev = events(&mut s);
        let [SubscriberEvent::Retrying { delay, .. }] = &ev[..] else {
            panic!("{ev:?}")
        };
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
    s.set_expires_override(&MsrName::test("msr_1"), Some(5));
    s.contacts_changed(now, "msr_1", [&lo()]);
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
    s.set_expires_override(&MsrName::test("msr_1"), Some(30));
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
    assert!(matches!(
        &events(&mut s)[..],
        [SubscriberEvent::Ended { .. }]
    ));
    assert!(s.view("msr_1").is_none());
    // Only the wait for the ended dialog's final NOTIFY is left.
    assert_eq!(s.poll_timeout(), Some(now + FINAL_NOTIFY_WAIT));
    // That NOTIFY gets 200 (RFC 6665 §4.1.2.3), and then the dialog is gone.
    let n = notify(
        &t,
        h(&t, "Call-ID"),
        "agent-tag",
        "terminated;reason=timeout",
        "",
    );
    assert_eq!(
        s.handle_notify(now, 1, AGENT, &n).status_code,
        StatusCode::OK
    );
    assert_eq!(s.poll_timeout(), None);
    assert_eq!(
        s.handle_notify(now, 1, AGENT, &n).status_code,
        StatusCode::CallTransactionDoesNotExist
    );
}

/// RFC 6665 §4.1.2.3, §4.4.1: the notifier answers our `Expires: 0` and
/// then sends a final NOTIFY `terminated`. It gets 200 (not 481), and
/// changes nothing: no load, no new SUBSCRIBE, no event, no view.
#[test]
fn the_final_notify_after_an_unregistration_is_answered_200_and_changes_nothing() {
    let mut s = subscriber();
    let now = Instant::now();
    let t = active(&mut s, now);
    let call_id = h(&t, "Call-ID").to_owned();
    s.contacts_changed(now, "msr_1", vec![]);
    let u = one(&mut s);
    assert_eq!(h(&u, "Expires"), "0");
    events(&mut s);
    while s.poll_view_change().is_some() {}
    assert_eq!(s.ended_dialogs(), 1);
    check_indexes(&s);
    let later = now + Duration::from_millis(5);
    s.handle_response(later, u.id, &answer(&u, StatusCode::OK, Some(0)));
    // A NOTIFY the notifier sent before it saw the unsubscribe: 200, kept.
    let racing = notify(&t, &call_id, "agent-tag", "active;expires=50", BODY);
    assert_eq!(
        s.handle_notify(later, 1, AGENT, &racing).status_code,
        StatusCode::OK
    );
    assert_eq!(s.ended_dialogs(), 1);
    // The final one: 200, and the dialog is forgotten.
    let last = notify(&t, &call_id, "agent-tag", "terminated;reason=timeout", "");
    assert_eq!(
        s.handle_notify(later, 1, AGENT, &last).status_code,
        StatusCode::OK
    );
    assert_eq!(s.ended_dialogs(), 0);
    assert!(events(&mut s).is_empty(), "no load, no restart");
    assert!(transmits(&mut s).is_empty(), "nothing sent");
    assert!(s.poll_view_change().is_none());
    assert!(s.view("msr_1").is_none());
    assert_eq!(s.poll_timeout(), None);
    check_indexes(&s);
}

/// Only the dialog itself is answered: other tags, and another event
/// package, get what they get in a live dialog.
#[test]
fn an_ended_dialog_checks_tags_and_event() {
    let mut s = subscriber();
    let now = Instant::now();
    let t = active(&mut s, now);
    let call_id = h(&t, "Call-ID").to_owned();
    s.contacts_changed(now, "msr_1", vec![]);
    one(&mut s);
    events(&mut s);
    let stranger = notify(&t, &call_id, "another-tag", "terminated", "");
    assert_eq!(
        s.handle_notify(now, 1, AGENT, &stranger).status_code,
        StatusCode::CallTransactionDoesNotExist
    );
    let text = format!("{}", notify(&t, &call_id, "agent-tag", "terminated", ""))
        .replace("Event: eltex-call-count", "Event: presence");
    let other = Request::try_from(text.as_str()).expect("parses");
    let resp = s.handle_notify(now, 1, AGENT, &other);
    assert_eq!(resp.status_code, StatusCode::BadEvent);
    assert_eq!(
        sip::header(&resp.headers, "Allow-Events"),
        Some("eltex-call-count")
    );
    assert_eq!(
        s.ended_dialogs(),
        1,
        "still waiting for its own final NOTIFY"
    );
    assert!(events(&mut s).is_empty());
}

/// Bounded memory: an ended dialog whose final NOTIFY never comes is
/// forgotten at its deadline, [`FINAL_NOTIFY_WAIT`] after the unsubscribe.
#[test]
fn ended_dialogs_are_forgotten_at_their_deadline() {
    let mut s = subscriber();
    let t0 = Instant::now();
    let mut firsts = Vec::new();
    for i in 0..100u64 {
        let msr = format!("msr_{i:03}");
        let at = t0 + Duration::from_millis(i);
        s.contacts_changed(at, &msr, [&target(&msr)]);
        let t = one(&mut s);
        s.handle_response(at, t.id, &answer(&t, StatusCode::OK, Some(60)));
        firsts.push(t);
    }
    for i in 0..100u64 {
        let msr = format!("msr_{i:03}");
        s.contacts_changed(t0 + Duration::from_millis(i), &msr, vec![]);
        let u = one(&mut s);
        s.handle_response(t0, u.id, &answer(&u, StatusCode::OK, Some(0)));
    }
    events(&mut s);
    assert_eq!(s.ended_dialogs(), 100);
    check_indexes(&s);
    assert_eq!(s.poll_timeout(), Some(t0 + FINAL_NOTIFY_WAIT));
    s.handle_timeout(t0 + FINAL_NOTIFY_WAIT + Duration::from_millis(49));
    assert_eq!(s.ended_dialogs(), 50);
    check_indexes(&s);
    s.handle_timeout(t0 + FINAL_NOTIFY_WAIT + Duration::from_millis(99));
    assert_eq!(s.ended_dialogs(), 0);
    assert_eq!(s.poll_timeout(), None);
    assert!(events(&mut s).is_empty() && transmits(&mut s).is_empty());
    // A final NOTIFY after the deadline: 481, as for any unknown dialog.
    let late = notify(
        &firsts[99],
        h(&firsts[99], "Call-ID"),
        "agent-tag",
        "terminated;reason=timeout",
        "",
    );
    assert_eq!(
        s.handle_notify(t0 + secs(40), 1, AGENT, &late).status_code,
        StatusCode::CallTransactionDoesNotExist
    );
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// An unsubscribe that is refused or never answered brings no final
/// NOTIFY: its dialog is forgotten at once.
#[test]
fn a_refused_or_failed_unsubscribe_forgets_the_dialog_at_once() {
    for refused in [true, false] {
        let mut s = subscriber();
        let now = Instant::now();
        active(&mut s, now);
        s.contacts_changed(now, "msr_1", vec![]);
        let u = one(&mut s);
        assert_eq!(s.ended_dialogs(), 1);
        if refused {
            s.handle_response(
                now,
                u.id,
                &answer(&u, StatusCode::CallTransactionDoesNotExist, None),
            );
        } else {
            s.handle_failure(now, u.id, RetryCause::TimedOut);
        }
        assert_eq!(s.ended_dialogs(), 0, "refused: {refused}");
        assert_eq!(s.poll_timeout(), None);
        check_indexes(&s);
    }
}

/// The MSR registers again while its old dialog waits for its final
/// NOTIFY: that NOTIFY ends only the old dialog; the new subscription goes
/// on untouched.
#[test]
fn a_final_notify_of_an_old_dialog_leaves_the_new_subscription_alone() {
    let mut s = subscriber();
    let now = Instant::now();
    let old = active(&mut s, now);
    s.contacts_changed(now, "msr_1", vec![]);
    one(&mut s);
    s.contacts_changed(now, "msr_1", [&lo()]);
    let new = one(&mut s);
    assert_ne!(h(&new, "Call-ID"), h(&old, "Call-ID"));
    events(&mut s);
    let last = notify(
        &old,
        h(&old, "Call-ID"),
        "agent-tag",
        "terminated;reason=noresource",
        "",
    );
    assert_eq!(
        s.handle_notify(now, 1, AGENT, &last).status_code,
        StatusCode::OK
    );
    assert!(events(&mut s).is_empty());
    assert!(transmits(&mut s).is_empty());
    assert_eq!(
        s.view("msr_1").expect("view").status,
        SubscriptionState::Pending
    );
    // The new dialog still works, and `noresource` of the old one did not
    // block it.
    s.handle_response(now, new.id, &answer(&new, StatusCode::OK, Some(60)));
    assert_eq!(
        s.view("msr_1").expect("view").status,
        SubscriptionState::Active
    );
    check_indexes(&s);
}

#[test]
fn the_subscription_moves_when_its_contact_goes() {
    let mut s = subscriber();
    let now = Instant::now();
    s.contacts_changed(now, "msr_1", [&lo(), &eth()]);
    let t = one(&mut s);
    assert_eq!(
        t.request.uri.to_string(),
        eth().uri,
        "first contact by name"
    );
    s.handle_response(now, t.id, &answer(&t, StatusCode::OK, Some(60)));
    s.contacts_changed(now, "msr_1", [&lo()]);
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
    assert_eq!(s.awaited_unsubscribes(), 1);
    s.handle_response(now, u.id, &answer(&u, StatusCode::OK, Some(0)));
    assert_eq!(s.awaited_unsubscribes(), 0);
}

/// At shutdown the wait covers the final NOTIFYs too: each is answered 200
/// (not 481) and then no longer awaited. An unsubscribe refused or failed
/// brings none, so none is awaited for it.
#[test]
fn shutdown_awaits_and_answers_the_final_notifies() {
    let mut s = subscriber();
    let now = Instant::now();
    let mut dialogs = Vec::new();
    for msr in ["msr_1", "msr_2", "msr_3"] {
        s.contacts_changed(now, msr, [&target(msr)]);
        let t = one(&mut s);
        s.handle_response(now, t.id, &answer(&t, StatusCode::OK, Some(60)));
        dialogs.push(t);
    }
    events(&mut s);
    assert_eq!(s.shutdown(now), 3);
    let u = transmits(&mut s);
    assert_eq!(u.len(), 3);
    assert_eq!(
        (s.awaited_unsubscribes(), s.awaited_final_notifies()),
        (3, 3)
    );
    // msr_1: 200, then its final NOTIFY.
    s.handle_response(now, u[0].id, &answer(&u[0], StatusCode::OK, Some(0)));
    assert_eq!(
        (s.awaited_unsubscribes(), s.awaited_final_notifies()),
        (2, 3)
    );
    let last = notify(
        &dialogs[0],
        h(&dialogs[0], "Call-ID"),
        "agent-tag",
        "terminated;reason=timeout",
        "",
    );
    assert_eq!(
        s.handle_notify(now, 1, AGENT, &last).status_code,
        StatusCode::OK
    );
    assert_eq!(
        (s.awaited_unsubscribes(), s.awaited_final_notifies()),
        (2, 2)
    );
    // msr_2: the final NOTIFY overtakes the 200.
    let last = notify(
        &dialogs[1],
        h(&dialogs[1], "Call-ID"),
        "agent-tag",
        "terminated;reason=timeout",
        "",
    );
    assert_eq!(
        s.handle_notify(now, 1, AGENT, &last).status_code,
        StatusCode::OK
    );
    s.handle_response(now, u[1].id, &answer(&u[1], StatusCode::OK, Some(0)));
    assert_eq!(
        (s.awaited_unsubscribes(), s.awaited_final_notifies()),
        (1, 1)
    );
    // msr_3: no answer at all.
    s.handle_failure(now, u[2].id, RetryCause::TimedOut);
    assert_eq!(
        (s.awaited_unsubscribes(), s.awaited_final_notifies()),
        (0, 0)
    );
    assert!(events(&mut s).is_empty());
    assert!(transmits(&mut s).is_empty());
}

/// Dialogs ended before the shutdown (their MSR unregistered) are still
/// answered, but the shutdown does not wait for them.
#[test]
fn shutdown_does_not_await_final_notifies_of_earlier_unsubscribes() {
    let mut s = subscriber();
    let now = Instant::now();
    let t = active(&mut s, now);
    s.contacts_changed(now, "msr_1", vec![]);
    one(&mut s);
    assert_eq!(s.shutdown(now), 0);
    assert_eq!(
        (s.awaited_unsubscribes(), s.awaited_final_notifies()),
        (0, 0)
    );
    let last = notify(
        &t,
        h(&t, "Call-ID"),
        "agent-tag",
        "terminated;reason=timeout",
        "",
    );
    assert_eq!(
        s.handle_notify(now, 1, AGENT, &last).status_code,
        StatusCode::OK
    );
}

/// The user's case: every MSR had unregistered (its unsubscribe left
/// unanswered, the agent gone) when the collector shut down. Shutdown sends
/// nothing and awaits nothing: the counts agree.
#[test]
fn shutdown_awaits_only_the_unsubscribes_it_sent() {
    let mut s = subscriber();
    let now = Instant::now();
    let t = active(&mut s, now);
    s.contacts_changed(now, "msr_1", vec![]);
    let earlier = one(&mut s);
    assert_eq!(h(&earlier, "Expires"), "0");
    assert!(matches!(
        &events(&mut s)[..],
        [SubscriberEvent::Ended { call_id: Some(c), .. }] if c == h(&t, "Call-ID")
    ));
    assert_eq!(s.shutdown(now), 0);
    assert!(transmits(&mut s).is_empty());
    assert_eq!(s.awaited_unsubscribes(), 0);

    // With one MSR still subscribed: one sent, one awaited; the answer to
    // the earlier unsubscribe does not count for it.
    let mut s = subscriber();
    active(&mut s, now);
    s.contacts_changed(now, "msr_1", vec![]);
    let earlier = one(&mut s);
    s.contacts_changed(now, "msr_2", [&target("msr_2")]);
    let t2 = one(&mut s);
    s.handle_response(now, t2.id, &answer(&t2, StatusCode::OK, Some(60)));
    assert_eq!(s.shutdown(now), 1);
    let u = one(&mut s);
    assert_eq!(
        (h(&u, "Expires"), h(&u, "Call-ID")),
        ("0", h(&t2, "Call-ID"))
    );
    assert_eq!(s.awaited_unsubscribes(), 1);
    s.handle_response(now, earlier.id, &answer(&earlier, StatusCode::OK, Some(0)));
    assert_eq!(s.awaited_unsubscribes(), 1);
    s.handle_failure(now, u.id, RetryCause::TimedOut);
    assert_eq!(s.awaited_unsubscribes(), 0);
}

/// A dialog whose target cannot make a request gets no unsubscribe, and
/// shutdown does not count it as sent.
#[test]
fn shutdown_counts_only_the_unsubscribes_queued() {
    let mut s = subscriber();
    let now = Instant::now();
    s.contacts_changed(now, "msr_1", [&lo()]);
    let t = one(&mut s);
    let mut ok = answer(&t, StatusCode::OK, Some(60));
    sip::set_header(&mut ok.headers, "Contact", "<sip:msr_1@127.0.0.1:99999>");
    s.handle_response(now, t.id, &ok);
    assert_eq!(s.shutdown(now), 0);
    assert!(transmits(&mut s).is_empty());
    assert_eq!(s.awaited_unsubscribes(), 0);
}

/// `Ended` carries the Call-ID of the open dialog, and none between a
/// terminated dialog and the next.
#[test]
fn ended_names_the_dialog_only_when_one_is_open() {
    let mut s = subscriber();
    let now = Instant::now();
    let t = active(&mut s, now);
    let n = notify(
        &t,
        h(&t, "Call-ID"),
        "agent-tag",
        "terminated;reason=noresource",
        "",
    );
    assert_eq!(
        s.handle_notify(now, 1, AGENT, &n).status_code,
        StatusCode::OK
    );
    events(&mut s);
    s.contacts_changed(now, "msr_1", vec![]);
    assert!(transmits(&mut s).is_empty());
    assert!(matches!(
        &events(&mut s)[..],
        [SubscriberEvent::Ended { call_id: None, .. }]
    ));
    // A pending initial SUBSCRIBE is a dialog being set up: it is named.
    s.contacts_changed(now, "msr_1", [&lo()]);
    let t = one(&mut s);
    s.contacts_changed(now, "msr_1", vec![]);
    assert!(matches!(
        &events(&mut s)[..],
        [SubscriberEvent::Ended { call_id: Some(c), .. }] if c == h(&t, "Call-ID")
    ));
}

#[test]
fn unanswered_expiry_starts_a_new_dialog() {
    let mut s = subscriber();
    let now = Instant::now();
    active(&mut s, now);
    s.handle_timeout(now + Duration::from_secs(48));
    let _refresh_never_answered = one(&mut s);
    s.handle_timeout(now + Duration::from_secs(60));
    assert!(
        matches!(&events(&mut s)[..], [SubscriberEvent::Retrying { cause, .. }] if *cause == RetryCause::Expired)
    );
}

fn target(msr: &str) -> Binding {
    binding(
        &format!("lo@{msr}"),
        msr,
        &format!("sip:{msr}@127.0.0.1:5070"),
    )
}

fn body(msr: &str, load: u8) -> String {
    format!("msr: {msr}\nload: {load}\ncpu: 1\ncalls: 1\nmax-calls: 100\n")
}

/// A NOTIFY (active) in the dialog of SUBSCRIBE `t` with the given CSeq and Via branch.
fn notify_seq(t: &Transmit, cseq: u32, branch: &str, body: &str) -> Request {
    let text = format!(
        "NOTIFY sip:collector@127.0.0.1:5060 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bK{branch}\r\n\
         From: <{}>;tag=agent-tag\r\nTo: {}\r\nCall-ID: {}\r\nCSeq: {cseq} NOTIFY\r\nEvent: eltex-call-count\r\n\
         Subscription-State: active;expires=60\r\nContent-Type: application/x-eltex-call-count\r\n\
         Content-Length: {}\r\n\r\n{body}",
        sip::addr_uri(h(t, "To")),
        h(t, "From"),
        h(t, "Call-ID"),
        body.len()
    );
    Request::try_from(text.as_str()).expect("notify parses")
}

fn loads(s: &mut Subscriber) -> Vec<u8> {
    events(s)
        .into_iter()
        .filter_map(|e| match e {
            SubscriberEvent::Load { report, .. } => Some(report.load),
            _ => None,
        })
        .collect()
}

/// Panics unless the deadline set and the dialog index match the subscriptions.
fn check_indexes(s: &Subscriber) {
    assert_eq!(
        s.poll_timeout(),
        s.scan_timeout(),
        "deadline set out of date"
    );
    let armed: BTreeSet<(Instant, MsrName)> = s
        .subs
        .iter()
        .filter_map(|(m, sub)| sub.next_deadline().map(|t| (t, m.clone())))
        .collect();
    assert_eq!(s.timers, armed, "deadline set out of date");
    let dialogs: HashMap<String, MsrName> = s
        .subs
        .iter()
        .filter_map(|(m, sub)| sub.dialog.as_ref().map(|d| (d.call_id.clone(), m.clone())))
        .collect();
    assert_eq!(s.dialogs, dialogs, "dialog index out of date");
    let ended: BTreeSet<(Instant, String)> = s
        .ended
        .iter()
        .map(|(c, e)| (e.deadline, c.clone()))
        .collect();
    assert_eq!(s.ended_timers, ended, "ended-dialog deadlines out of date");
    assert!(
        s.ended.keys().all(|c| !s.dialogs.contains_key(c)),
        "a dialog both live and ended"
    );
}

#[test]
fn a_notify_with_an_old_cseq_leaves_the_load_unchanged() {
    let mut s = subscriber();
    let now = Instant::now();
    let t = active(&mut s, now);
    let ok = |s: &mut Subscriber, n: &Request| s.handle_notify(now, 1, AGENT, n).status_code;
    assert_eq!(
        ok(&mut s, &notify_seq(&t, 5, "a", &body("msr_1", 40))),
        StatusCode::OK
    );
    assert_eq!(loads(&mut s), [40]);
    // Lower CSeq: out of order (RFC 3261 §12.2.2), 500, nothing changes.
    assert_eq!(
        ok(&mut s, &notify_seq(&t, 4, "b", &body("msr_1", 90))),
        StatusCode::ServerInternalError
    );
    assert!(events(&mut s).is_empty());
    assert_eq!(s.view("msr_1").expect("view").notify_count, 1);
    // The same NOTIFY again (same CSeq and branch): a retransmission, 200, nothing changes.
    assert_eq!(
        ok(&mut s, &notify_seq(&t, 5, "a", &body("msr_1", 40))),
        StatusCode::OK
    );
    assert!(events(&mut s).is_empty());
    assert_eq!(s.view("msr_1").expect("view").notify_count, 1);
    // The same CSeq in another transaction: out of order too.
    assert_eq!(
        ok(&mut s, &notify_seq(&t, 5, "c", &body("msr_1", 70))),
        StatusCode::ServerInternalError
    );
    assert!(events(&mut s).is_empty());
    // A higher CSeq is applied, gaps allowed.
    assert_eq!(
        ok(&mut s, &notify_seq(&t, 9, "d", &body("msr_1", 55))),
        StatusCode::OK
    );
    assert_eq!(loads(&mut s), [55]);
    assert_eq!(s.view("msr_1").expect("view").notify_count, 2);
    // A refused NOTIFY (bad body) does not advance the sequence.
    assert_eq!(
        ok(&mut s, &notify_seq(&t, 10, "e", "load: lots\n")),
        StatusCode::BadRequest
    );
    assert_eq!(
        ok(&mut s, &notify_seq(&t, 10, "f", &body("msr_1", 60))),
        StatusCode::OK
    );
    assert_eq!(loads(&mut s), [60]);
    // A retransmission of an older NOTIFY taken before a newer one (its
    // 200 was lost, the notifier sent the next meanwhile): 200 again,
    // nothing changes; the collector answers statelessly.
    assert_eq!(
        ok(&mut s, &notify_seq(&t, 9, "d", &body("msr_1", 55))),
        StatusCode::OK
    );
    assert!(events(&mut s).is_empty());
    assert_eq!(s.view("msr_1").expect("view").notify_count, 3);
    // Once RECENT_NOTIFIES newer ones were taken, it is out of order.
    for cseq in 11..11 + RECENT_NOTIFIES as u32 {
        let branch = format!("g{cseq}");
        assert_eq!(
            ok(&mut s, &notify_seq(&t, cseq, &branch, &body("msr_1", 61))),
            StatusCode::OK
        );
    }
    assert_eq!(
        ok(&mut s, &notify_seq(&t, 9, "d", &body("msr_1", 55))),
        StatusCode::ServerInternalError
    );
}

#[test]
fn a_new_dialog_starts_a_new_cseq_sequence() {
    let mut s = subscriber();
    let now = Instant::now();
    let t = active(&mut s, now);
    s.handle_notify(now, 1, AGENT, &notify_seq(&t, 7, "a", &body("msr_1", 10)));
    let n = notify(
        &t,
        h(&t, "Call-ID"),
        "agent-tag",
        "terminated;reason=timeout",
        "",
    );
    // `notify` sends CSeq 1: below 7, so refused; the dialog stays.
    assert_eq!(
        s.handle_notify(now, 1, AGENT, &n).status_code,
        StatusCode::ServerInternalError
    );
    events(&mut s);
    s.handle_timeout(now + Duration::from_secs(48));
    let refresh = one(&mut s);
    assert_eq!(h(&refresh, "Call-ID"), h(&t, "Call-ID"));
    // The old dialog ends; the new one accepts CSeq 1 again.
    let end = notify_seq(&t, 8, "b", "")
        .to_string()
        .replace("active;expires=60", "terminated;reason=timeout");
    let end = Request::try_from(end.as_str()).expect("parses");
    assert_eq!(
        s.handle_notify(now, 1, AGENT, &end).status_code,
        StatusCode::OK
    );
    s.handle_timeout(now + Duration::from_secs(48));
    let t2 = one(&mut s);
    assert_ne!(h(&t2, "Call-ID"), h(&t, "Call-ID"));
    s.handle_response(now, t2.id, &answer(&t2, StatusCode::OK, Some(60)));
    events(&mut s);
    assert_eq!(
        s.handle_notify(now, 1, AGENT, &notify_seq(&t2, 1, "c", &body("msr_1", 20)))
            .status_code,
        StatusCode::OK
    );
    assert_eq!(loads(&mut s), [20]);
    // The old dialog is gone from the index.
    assert_eq!(
        s.handle_notify(now, 1, AGENT, &notify_seq(&t, 9, "d", &body("msr_1", 99)))
            .status_code,
        StatusCode::CallTransactionDoesNotExist
    );
    check_indexes(&s);
}

#[test]
fn poll_timeout_with_many_subscriptions_returns_the_earliest() {
    let mut s = subscriber();
    let t0 = Instant::now();
    let n = 100;
    let mut subs = Vec::new();
    // Subscribe in reverse order, each granted at a different time, so
    // neither name nor insertion order is the deadline order.
    for i in (0..n).rev() {
        let msr = format!("msr_{i:03}");
        let at = t0 + Duration::from_millis(10 * i as u64);
        s.contacts_changed(at, &msr, [&target(&msr)]);
        let t = one(&mut s);
        s.handle_response(
            at,
            t.id,
            &answer(&t, StatusCode::OK, Some(60 + (i % 7) as u32 * 10)),
        );
        check_indexes(&s);
        subs.push((msr, t, at));
    }
    events(&mut s);
    let earliest = subs.iter().map(|(_, _, at)| *at + refresh_delay(60)).min();
    assert_eq!(s.poll_timeout(), earliest);
    assert_eq!(s.poll_timeout(), Some(t0 + Duration::from_secs(15)));

    // Only what is due is touched: at the earliest deadline, one refresh.
    let first = s.poll_timeout().expect("deadline");
    s.handle_timeout(first);
    let sent = transmits(&mut s);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].msr, "msr_000");
    check_indexes(&s);
    assert!(s.poll_timeout().is_some_and(|t| t > first));

    // Churn: terminate some, fail some, unregister some, re-register one.
    for (i, (msr, t, at)) in subs.iter().enumerate() {
        match i % 5 {
            0 => {
                let n = notify(
                    t,
                    h(t, "Call-ID"),
                    "agent-tag",
                    "terminated;reason=probation;retry-after=5",
                    "",
                );
                s.handle_notify(*at, 1, AGENT, &n);
            }
            1 => s.contacts_changed(*at, msr, Vec::new()),
            2 => {
                let n = notify(
                    t,
                    h(t, "Call-ID"),
                    "agent-tag",
                    "terminated;reason=noresource",
                    "",
                );
                s.handle_notify(*at, 1, AGENT, &n);
            }
            _ => {}
        }
        check_indexes(&s);
    }
    s.contacts_changed(t0, "msr_001", [&target("msr_001")]);
    check_indexes(&s);
    // Run every deadline for 20 minutes of test time; the set stays exact.
    let end = t0 + Duration::from_secs(1200);
    let mut steps = 0;
    while let Some(at) = s.poll_timeout().filter(|t| *t <= end) {
        s.handle_timeout(at);
        for t in transmits(&mut s) {
            if steps % 3 == 0 {
                s.handle_failure(at, t.id, RetryCause::TimedOut);
            } else {
                s.handle_response(at, t.id, &answer(&t, StatusCode::OK, Some(60)));
            }
        }
        events(&mut s);
        check_indexes(&s);
        steps += 1;
    }
    assert!(steps > 50, "{steps}");
    let sent = s.shutdown(end);
    check_indexes(&s);
    // Only the waits for the final NOTIFYs of the unsubscribes are left.
    assert_eq!(
        s.poll_timeout(),
        (sent > 0).then_some(end + FINAL_NOTIFY_WAIT)
    );
    s.handle_timeout(end + FINAL_NOTIFY_WAIT);
    assert_eq!(s.poll_timeout(), None);
    assert_eq!(s.ended_dialogs(), 0);
    check_indexes(&s);
}

#[test]
fn only_changed_subscriptions_are_reported() {
    let mut s = subscriber();
    let now = Instant::now();
    let mut dialogs = Vec::new();
    for msr in ["msr_1", "msr_2", "msr_3"] {
        s.contacts_changed(now, msr, [&target(msr)]);
        let t = one(&mut s);
        s.handle_response(now, t.id, &answer(&t, StatusCode::OK, Some(60)));
        dialogs.push(t);
    }
    let first: Vec<MsrName> = std::iter::from_fn(|| s.poll_view_change())
        .map(|(m, _)| m)
        .collect();
    assert_eq!(first, ["msr_1", "msr_2", "msr_3"]);
    assert!(s.poll_view_change().is_none(), "nothing changed since");

    // A NOTIFY that only brings a load changes neither the state nor the
    // expiry: nothing to report (the counts are read from the view).
    let n = notify_seq(&dialogs[1], 1, "x", &body("msr_2", 12));
    assert_eq!(
        s.handle_notify(now, 1_700_000_000, AGENT, &n).status_code,
        StatusCode::OK
    );
    assert!(s.poll_view_change().is_none());
    let view = s.view("msr_2").expect("view");
    assert_eq!(
        (view.notify_count, view.last_notify_unix),
        (1, Some(1_700_000_000))
    );
    // A refresh granting another expiry is reported.
    s.handle_timeout(now + Duration::from_secs(16));
    let refreshes: Vec<Transmit> = std::iter::from_fn(|| s.poll_transmit()).collect();
    let refresh = refreshes
        .iter()
        .find(|t| t.msr == "msr_2")
        .expect("msr_2's refresh");
    s.handle_response(
        now + Duration::from_secs(16),
        refresh.id,
        &answer(refresh, StatusCode::OK, Some(30)),
    );
    let changed: Vec<_> = std::iter::from_fn(|| s.poll_view_change()).collect();
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert_eq!(
        (changed[0].0.as_str(), changed[0].1.expires_secs),
        ("msr_2", 30)
    );
    for t in refreshes.iter().filter(|t| t.msr != "msr_2") {
        s.handle_response(
            now + Duration::from_secs(16),
            t.id,
            &answer(t, StatusCode::OK, Some(60)),
        );
    }
    while s.poll_view_change().is_some() {}

    // A NOTIFY refused as out of order may be reported, but with the view unchanged.
    s.handle_notify(
        now,
        1,
        AGENT,
        &notify_seq(&dialogs[1], 1, "y", &body("msr_2", 99)),
    );
    for (msr, view) in std::iter::from_fn(|| s.poll_view_change()) {
        assert_eq!(msr, "msr_2");
        assert_eq!(view.notify_count, 1);
    }
    // A removed subscription is not reported.
    s.contacts_changed(now, "msr_3", Vec::new());
    assert!(s.poll_view_change().is_none());
    // Unknown dialogs change nothing.
    let stray = notify(
        &dialogs[0],
        "unknown@elsewhere",
        "agent-tag",
        "active",
        BODY,
    );
    s.handle_notify(now, 1, AGENT, &stray);
    assert!(s.poll_view_change().is_none());
}

/// SPEC §3: a REGISTER with a new Call-ID means the agent restarted and
/// forgot its dialogs. The dead dialog is dropped (no unsubscribe nobody
/// would answer) and a new SUBSCRIBE with a new Call-ID leaves at once,
/// also when the subscription was waiting out a backoff.
#[test]
fn a_restarted_contact_is_subscribed_anew_at_once() {
    let mut s = subscriber();
    let t0 = Instant::now();
    let first = active(&mut s, t0);
    s.contact_restarted(t0 + secs(3), "msr_1", "lo@msr_1");
    let again = one(&mut s);
    assert_ne!(h(&again, "Call-ID"), h(&first, "Call-ID"));
    assert!(sip::tag(h(&again, "To")).is_none(), "a new dialog");
    assert_eq!(h(&again, "Expires"), "60");
    assert_eq!(
        s.view("msr_1").expect("view").status,
        SubscriptionState::Pending
    );
    // A NOTIFY of the dead dialog is not ours any more.
    let old = notify(
        &first,
        h(&first, "Call-ID"),
        "agent-tag",
        "active;expires=50",
        BODY,
    );
    assert_eq!(
        s.handle_notify(t0 + secs(3), 0, AGENT, &old).status_code,
        StatusCode::CallTransactionDoesNotExist
    );

    // Refused while the agent was down: the retry waits out a backoff…
    s.handle_response(
        t0 + secs(3),
        again.id,
        &answer(&again, StatusCode::ServiceUnavailable, None),
    );
    assert!(transmits(&mut s).is_empty());
    assert!(s.poll_timeout().is_some_and(|at| at > t0 + secs(3)));
    // …unless the agent registers anew: then at once.
    s.contact_restarted(t0 + secs(4), "msr_1", "lo@msr_1");
    assert_eq!(one(&mut s).request.method, Method::Subscribe);
    // Another MSR's restart, or an unknown one, changes nothing here.
    s.contact_restarted(t0 + secs(4), "msr_9", "lo@msr_9");
    assert!(transmits(&mut s).is_empty());
}

fn source(addr: &str) -> Option<SocketAddr> {
    Some(addr.parse().expect("socket address"))
}

fn with_cseq(mut n: Request, cseq: u32) -> Request {
    sip::set_header(&mut n.headers, "CSeq", format!("{cseq} NOTIFY"));
    n
}

const FORGED: &str = "msr: msr_1\nload: 79\ncpu: 21\ncalls: 303\nmax-calls: 8192\n";

/// SPEC §4: a NOTIFY with the live dialog's Call-ID and both tags from
/// another address than the one subscribed to gets 403 before its CSeq or
/// body are looked at: no load, no counter, and a higher CSeq does not
/// poison the dialog — the genuine NOTIFYs that follow are taken.
#[test]
fn a_notify_from_a_foreign_source_gets_403_and_does_not_poison_the_dialog() {
    let mut s = subscriber();
    let now = Instant::now();
    let t = active(&mut s, now);
    let call_id = h(&t, "Call-ID").to_owned();
    let forged = with_cseq(
        notify(&t, &call_id, "agent-tag", "active;expires=60", FORGED),
        9,
    );
    for from in [
        source("192.0.2.66:5070"),
        source("127.0.0.1:5071"),
        source("127.0.0.2:5070"),
        None,
    ] {
        assert_eq!(
            s.handle_notify(now, 1, from, &forged).status_code,
            StatusCode::Forbidden,
            "{from:?}"
        );
    }
    // Not even a terminated one ends it.
    let forged_end = with_cseq(
        notify(&t, &call_id, "agent-tag", "terminated;reason=rejected", ""),
        10,
    );
    assert_eq!(
        s.handle_notify(now, 1, source("192.0.2.66:5070"), &forged_end)
            .status_code,
        StatusCode::Forbidden
    );
    assert!(events(&mut s).is_empty());
    let v = s.view("msr_1").expect("view");
    assert_eq!((v.status, v.notify_count), (SubscriptionState::Active, 0));
    // The genuine NOTIFYs, CSeq 2 and 3, below the forged 9 and 10.
    for (cseq, from) in [(2, AGENT), (3, source("[::ffff:127.0.0.1]:5070"))] {
        let genuine = with_cseq(
            notify(&t, &call_id, "agent-tag", "active;expires=60", BODY),
            cseq,
        );
        assert_eq!(
            s.handle_notify(now, 1, from, &genuine).status_code,
            StatusCode::OK,
            "CSeq {cseq} from {from:?}"
        );
    }
    let loads: Vec<u8> = events(&mut s)
        .into_iter()
        .filter_map(|e| match e {
            SubscriberEvent::Load { report, .. } => Some(report.load),
            _ => None,
        })
        .collect();
    assert_eq!(loads, [37, 37]);
    assert_eq!(s.view("msr_1").expect("view").notify_count, 2);
}

/// Before the 2xx, a foreign NOTIFY cannot fix the dialog's remote tag
/// (RFC 6665 §4.1.2.4 lets the first NOTIFY do so).
#[test]
fn a_foreign_notify_ahead_of_the_200_does_not_fix_the_dialog() {
    let mut s = subscriber();
    let now = Instant::now();
    s.contacts_changed(now, "msr_1", [&lo()]);
    let t = one(&mut s);
    let call_id = h(&t, "Call-ID").to_owned();
    let forged = notify(&t, &call_id, "evil-tag", "active;expires=60", FORGED);
    assert_eq!(
        s.handle_notify(now, 1, source("192.0.2.66:5070"), &forged)
            .status_code,
        StatusCode::Forbidden
    );
    let genuine = notify(&t, &call_id, "agent-tag", "active;expires=60", BODY);
    assert_eq!(
        s.handle_notify(now, 1, AGENT, &genuine).status_code,
        StatusCode::OK
    );
}

/// A dialog we ended keeps its peer: a foreign `terminated` NOTIFY gets 403
/// and does not make it forget the dialog before the real one comes.
#[test]
fn a_foreign_final_notify_in_an_ended_dialog_gets_403() {
    let mut s = subscriber();
    let now = Instant::now();
    let t = active(&mut s, now);
    let call_id = h(&t, "Call-ID").to_owned();
    s.contacts_changed(now, "msr_1", vec![]);
    let u = one(&mut s);
    s.handle_response(now, u.id, &answer(&u, StatusCode::OK, Some(0)));
    events(&mut s);
    let last = notify(&t, &call_id, "agent-tag", "terminated;reason=timeout", "");
    assert_eq!(
        s.handle_notify(now, 1, source("192.0.2.66:5070"), &last)
            .status_code,
        StatusCode::Forbidden
    );
    assert_eq!(s.ended_dialogs(), 1);
    assert_eq!(
        s.handle_notify(now, 1, AGENT, &last).status_code,
        StatusCode::OK
    );
    assert_eq!(s.ended_dialogs(), 0);
}
