//! `Agent` in virtual time: `now` is a `tokio::time::Instant` the test
//! moves by hand; requests and their answers pass through the test.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use msr_shared::event_package::{EngineState, LoadReport, EVENT};
use msr_shared::sip::{self, Method, Request, StatusCode};
use tokio::time::Instant;

use super::*;
use crate::config;

/// The collector: the registrar of `msr_1` and `msr_2`, and their
/// subscriber.
const COLLECTOR: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 5060);

/// `engine_probe`: the `<agent engine-probe>` attribute.
fn agent(engine_probe: &str) -> (Agent, Instant) {
    let xml = format!(
        r#"<?xml version="1.0" encoding="utf-8"?>
<config>
    <general max-calls="100" load-sensor="calls" load-delta="5"/>
    <transport bind-addr="127.0.0.1" port="5080" transport="udp"/>
    <media port-start="20000" port-range="1000"/>
    <accounts>
        <dynamic msr_name="msr_1" realm="sip:127.0.0.1:5060" auth_name="msr" auth_password="secret"/>
        <dynamic msr_name="msr_2" realm="sip:127.0.0.1:5060" auth_name="msr" auth_password="secret"/>
    </accounts>
    <agent register-expires="300" calls-source="fixed:7" engine-probe="{engine_probe}" engine-probe-misses="1"/>
</config>
"#
    );
    let config = config::parse(&xml, Path::new("test.xml")).expect("config");
    let identity = Identity {
        contact_addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
        contact_port: 5070,
        iface: "lo".into(),
    };
    let sample = Sample {
        load: 7,
        cpu: 1,
        calls: 7,
        max_calls: 100,
    };
    let t0 = Instant::now();
    (Agent::new(t0, config, identity, sample), t0)
}

fn transmits(agent: &mut Agent) -> Vec<Transmit> {
    std::iter::from_fn(|| agent.poll_transmit()).collect()
}

fn header<'a>(r: &'a Request, name: &str) -> &'a str {
    sip::header(&r.headers, name).unwrap_or_default()
}

fn ok(request: &Request, code: u16) -> Response {
    sip::response(request, StatusCode::from(code), Some("collector"))
}

/// The REGISTERs due at `now`, answered 200: both accounts registered.
fn register_all(agent: &mut Agent, now: Instant) {
    agent.handle_timeout(now);
    let registers: Vec<Transmit> = transmits(agent)
        .into_iter()
        .filter(|t| t.request.method == Method::Register)
        .collect();
    assert_eq!(registers.len(), 2);
    for t in registers {
        agent.handle_response(now, t.id, &ok(&t.request, 200));
    }
}

/// The collector's SUBSCRIBE for `msr`; its initial NOTIFY is returned.
fn subscribe(agent: &mut Agent, now: Instant, msr: &str) -> Transmit {
    let request = sip::request(
        Method::Subscribe,
        &format!("sip:{msr}@127.0.0.1:5070"),
        vec![
            (
                "Via",
                format!("SIP/2.0/UDP {COLLECTOR};branch=z9hG4bK{msr}"),
            ),
            ("From", format!("<sip:collector@{COLLECTOR}>;tag=sub-{msr}")),
            ("To", format!("<sip:{msr}@127.0.0.1:5070>")),
            ("Call-ID", format!("sub-{msr}")),
            ("CSeq", "1 SUBSCRIBE".to_owned()),
            ("Contact", format!("<sip:collector@{COLLECTOR}>")),
            ("Event", EVENT.to_owned()),
            ("Accept", "application/x-eltex-call-count".to_owned()),
            ("Expires", "600".to_owned()),
        ],
        Vec::new(),
    )
    .expect("subscribe");
    let response = agent
        .handle_request(now, Some(COLLECTOR), &request)
        .expect("answered");
    assert_eq!(response.status_code.code(), 200);
    let mut out = transmits(agent);
    assert_eq!(out.len(), 1, "one initial NOTIFY");
    out.remove(0)
}

/// Both accounts registered, `msr_1` subscribed and its first NOTIFY
/// answered.
fn subscribed() -> (Agent, Instant) {
    let (mut agent, t0) = agent("off");
    register_all(&mut agent, t0);
    let notify = subscribe(&mut agent, t0, "msr_1");
    agent.handle_response(t0, notify.id, &ok(&notify.request, 200));
    (agent, t0)
}

fn report(t: &Transmit) -> LoadReport {
    LoadReport::decode(&t.request.body).expect("body")
}

/// SPEC §3: a NOTIFY answered 481 by a registrar makes that account (and
/// only it) REGISTER again at once.
#[test]
fn a_notify_answered_481_registers_that_account_again() {
    let (mut agent, t0) = agent("off");
    register_all(&mut agent, t0);
    let notify = subscribe(&mut agent, t0, "msr_1");
    let t1 = t0 + Duration::from_secs(1);
    agent.handle_response(t1, notify.id, &ok(&notify.request, 481));
    assert!(agent.poll_timeout().is_some_and(|d| d <= t1));
    agent.handle_timeout(t1);
    let out = transmits(&mut agent);
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].request.method, Method::Register);
    assert!(header(&out[0].request, "To").contains("msr_1@"));
}

/// The shutdown's order: the final NOTIFYs first, the unregisters only
/// once they are answered, then `Stopped` once those are.
#[test]
fn final_notifies_are_answered_before_the_unregisters_go() {
    let (mut agent, t0) = subscribed();

    let t1 = t0 + Duration::from_secs(1);
    agent.shutdown(t1);
    let finals = transmits(&mut agent);
    assert_eq!(finals.len(), 1, "{finals:?}");
    assert_eq!(finals[0].request.method, Method::Notify);
    assert!(header(&finals[0].request, "Subscription-State").starts_with("terminated"));
    assert_eq!(agent.poll_event(), None);

    agent.handle_response(t1, finals[0].id, &ok(&finals[0].request, 200));
    let unregisters = transmits(&mut agent);
    assert_eq!(unregisters.len(), 2, "{unregisters:?}");
    for t in &unregisters {
        assert_eq!(t.request.method, Method::Register);
        assert_eq!(header(&t.request, "Expires"), "0");
    }
    for t in &unregisters {
        assert_eq!(agent.poll_event(), None);
        agent.handle_response(t1, t.id, &ok(&t.request, 200));
    }
    assert_eq!(agent.poll_event(), Some(Event::Stopped));
}

/// An unanswered final NOTIFY holds the unregisters back at most
/// `FINAL_NOTIFY_GRACE`; unanswered unregisters hold the stop at most
/// `SHUTDOWN_GRACE`.
#[test]
fn the_shutdown_waits_are_bounded() {
    let (mut agent, t0) = subscribed();
    agent.shutdown(t0);
    assert_eq!(transmits(&mut agent).len(), 1);
    let t1 = t0 + crate::notifier::FINAL_NOTIFY_GRACE;
    assert_eq!(agent.poll_timeout(), Some(t1));
    agent.handle_timeout(t1);
    assert_eq!(transmits(&mut agent).len(), 2, "the unregisters");
    assert_eq!(agent.poll_timeout(), Some(t1 + SHUTDOWN_GRACE));
    agent.handle_timeout(t1 + SHUTDOWN_GRACE);
    assert_eq!(agent.poll_event(), Some(Event::Stopped));
}

/// Each response goes to the core whose request it answers: the probe's
/// OPTIONS answered brings the engine up, and leaves the REGISTERs in
/// flight (nothing is sent again).
#[test]
fn a_response_goes_to_the_core_that_sent_the_request() {
    let (mut agent, t0) = agent("sip");
    agent.handle_timeout(t0);
    let out = transmits(&mut agent);
    let options: Vec<&Transmit> = out
        .iter()
        .filter(|t| t.request.method == Method::Options)
        .collect();
    assert_eq!(options.len(), 1, "{out:?}");
    assert_eq!(out.len(), 3, "two REGISTERs and the probe");
    agent.handle_response(t0, options[0].id, &ok(&options[0].request, 200));
    let status = agent.handle_control(t0, ControlRequest::Status);
    assert_eq!(status.engine, EngineState::Up);
    assert!(transmits(&mut agent).is_empty());

    // The REGISTERs' answers reach the registrations: none is retried.
    for t in out.iter().filter(|t| t.request.method == Method::Register) {
        agent.handle_response(t0, t.id, &ok(&t.request, 200));
    }
    assert!(
        agent
            .registrations
            .values()
            .all(|r| !r.in_flight()
                && r.state() == crate::registration::RegistrationState::Registered)
    );
    // An id answered twice, or never sent, is nobody's.
    let first = &out[0];
    agent.handle_response(t0, first.id, &ok(&first.request, 500));
    agent.handle_failure(t0, 999, "unknown");
    assert!(agent
        .registrations
        .values()
        .all(|r| r.state() == crate::registration::RegistrationState::Registered));
}

/// SPEC §14: the engine going down is told to every subscription at once.
#[test]
fn engine_down_is_told_to_every_subscription() {
    let (mut agent, t0) = agent("sip");
    agent.handle_timeout(t0);
    let out = transmits(&mut agent);
    for t in out.iter().filter(|t| t.request.method == Method::Register) {
        agent.handle_response(t0, t.id, &ok(&t.request, 200));
    }
    let Some(probe) = out.iter().find(|t| t.request.method == Method::Options) else {
        panic!("no probe in {out:?}");
    };
    agent.handle_response(t0, probe.id, &ok(&probe.request, 200));
    for msr in ["msr_1", "msr_2"] {
        let notify = subscribe(&mut agent, t0, msr);
        assert_eq!(report(&notify).engine, EngineState::Up);
        agent.handle_response(t0, notify.id, &ok(&notify.request, 200));
    }

    // The next probe fails at the transport: one miss is down here.
    let Some(next) = agent.poll_timeout() else {
        panic!("no next probe");
    };
    agent.handle_timeout(next);
    let out = transmits(&mut agent);
    let Some(probe) = out.iter().find(|t| t.request.method == Method::Options) else {
        panic!("no second probe in {out:?}");
    };
    agent.handle_failure(next, probe.id, "connection refused");
    let notifies = transmits(&mut agent);
    assert_eq!(notifies.len(), 2, "{notifies:?}");
    let mut told: Vec<String> = notifies
        .iter()
        .map(|t| {
            assert_eq!(t.request.method, Method::Notify);
            assert_eq!(report(t).engine, EngineState::Down);
            report(t).msr
        })
        .collect();
    told.sort();
    assert_eq!(told, ["msr_1", "msr_2"]);
}

/// SPEC §14: drained with `exit-when-empty`, the agent asks the shell to
/// stop, once, after the `drained` line's state is reached.
#[test]
fn drained_with_exit_when_empty_asks_to_stop() {
    let (mut agent, t0) = agent("off");
    agent.handle_control(t0, ControlRequest::Drain(WhenDrained::Exit));
    let empty = Sample {
        load: 0,
        cpu: 1,
        calls: 0,
        max_calls: 100,
    };
    agent.handle_sample(t0, empty);
    assert_eq!(agent.poll_event(), None);
    let t1 = t0 + crate::drain::EMPTY_FOR;
    agent.handle_timeout(t1);
    assert_eq!(agent.poll_event(), Some(Event::ExitWhenDrained));
    agent.handle_timeout(t1 + Duration::from_secs(1));
    assert_eq!(agent.poll_event(), None);
}
