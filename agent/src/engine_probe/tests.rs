use std::time::Duration;

use msr_shared::event_package::EngineState;
use msr_shared::sip::{self, Method};
use tokio::time::Instant;

use super::*;

fn sip_config() -> ProbeConfig {
    ProbeConfig {
        method: ProbeMethod::SipOptions {
            target: "127.0.0.1:5070".parse().expect("addr"),
            transport: ProbeTransport::Udp,
            local_uri: "sip:msr-agent@127.0.0.1:5071".into(),
        },
        interval: DEFAULT_INTERVAL,
        timeout: DEFAULT_TIMEOUT,
        misses: DEFAULT_MISSES,
    }
}

fn ng_config() -> ProbeConfig {
    ProbeConfig {
        method: ProbeMethod::NgStatistics {
            target: "127.0.0.1:2223".parse().expect("addr"),
        },
        ..sip_config()
    }
}

/// Runs the probe's timers up to `now` and returns the OPTIONS sent.
fn step(probe: &mut EngineProbe, now: Instant) -> Vec<ProbeTransmit> {
    while let Some(due) = probe.poll_timeout().filter(|t| *t <= now) {
        probe.handle_timeout(due);
    }
    std::iter::from_fn(|| probe.poll_transmit()).collect()
}

fn changes(probe: &mut EngineProbe) -> Vec<(EngineState, EngineState)> {
    std::iter::from_fn(|| probe.poll_change())
        .map(|c| (c.from, c.to))
        .collect()
}

#[test]
fn the_first_options_goes_at_once_and_any_final_response_means_up() {
    let t0 = Instant::now();
    let mut probe = EngineProbe::new(sip_config(), t0);
    assert_eq!(probe.state(), EngineState::Unchecked);
    assert_eq!(probe.poll_timeout(), Some(t0));
    let sent = step(&mut probe, t0);
    assert_eq!(sent.len(), 1);
    let options = &sent[0].request;
    assert_eq!(options.method, Method::Options);
    assert_eq!(options.uri.to_string(), "sip:127.0.0.1:5070");
    assert_eq!(
        sip::header(&options.headers, "CSeq"),
        Some("1 OPTIONS"),
        "an out-of-dialog request"
    );
    // The timeout of the probe in flight.
    assert_eq!(probe.poll_timeout(), Some(t0 + DEFAULT_TIMEOUT));
    // A 405 is an answer: a SIP stack is there.
    probe.handle_response(t0 + Duration::from_millis(3), sent[0].id);
    assert_eq!(probe.state(), EngineState::Up);
    assert_eq!(
        changes(&mut probe),
        vec![(EngineState::Unchecked, EngineState::Up)]
    );
    // The next one an interval later.
    assert_eq!(
        probe.poll_timeout(),
        Some(t0 + Duration::from_millis(3) + DEFAULT_INTERVAL)
    );
}

#[test]
fn a_dead_engine_is_down_within_interval_plus_misses_timeouts() {
    let t0 = Instant::now();
    let mut probe = EngineProbe::new(sip_config(), t0);
    let first = step(&mut probe, t0);
    probe.handle_response(t0, first[0].id);
    changes(&mut probe);
    // The engine dies now: the probe at 2 s goes unanswered.
    let at_2 = step(&mut probe, t0 + Duration::from_secs(2));
    assert_eq!(at_2.len(), 1);
    // Missed at 3 s: asked again at once, still up after one miss.
    let at_3 = step(&mut probe, t0 + Duration::from_secs(3));
    assert_eq!(at_3.len(), 1, "a miss is followed by a probe at once");
    assert_eq!(probe.state(), EngineState::Up);
    assert_eq!(probe.misses(), 1);
    // Missed again at 4 s: down.
    step(&mut probe, t0 + Duration::from_secs(4));
    assert_eq!(probe.state(), EngineState::Down);
    let down = probe.poll_change().expect("a change");
    assert_eq!(
        (down.from, down.to, down.misses),
        (EngineState::Up, EngineState::Down, 2)
    );
    assert!(down.reason.is_some_and(|r| r.contains("1000 ms")));
    // While down it probes at the normal pace, not at once.
    assert_eq!(probe.poll_timeout(), Some(t0 + Duration::from_secs(6)));
    // A late answer to an old probe changes nothing.
    probe.handle_response(t0 + Duration::from_secs(5), at_2[0].id);
    assert_eq!(probe.state(), EngineState::Down);
    // The next probe is answered: up again at once.
    let at_6 = step(&mut probe, t0 + Duration::from_secs(6));
    assert_eq!(at_6.len(), 1);
    probe.handle_response(t0 + Duration::from_secs(6), at_6[0].id);
    assert_eq!(probe.state(), EngineState::Up);
    assert_eq!(
        changes(&mut probe),
        vec![(EngineState::Down, EngineState::Up)]
    );
}

#[test]
fn a_transport_failure_is_a_miss_and_a_fresh_engine_goes_down_without_having_been_up() {
    let t0 = Instant::now();
    let mut probe = EngineProbe::new(sip_config(), t0);
    let first = step(&mut probe, t0);
    probe.handle_failure(t0, first[0].id, "connection refused");
    assert_eq!(probe.misses(), 1);
    let again = step(&mut probe, t0);
    assert_eq!(again.len(), 1);
    probe.handle_failure(t0, again[0].id, "connection refused");
    assert_eq!(probe.state(), EngineState::Down);
    let change = probe.poll_change().expect("a change");
    assert_eq!(change.from, EngineState::Unchecked);
    assert_eq!(change.reason.as_deref(), Some("connection refused"));
    // A failure of a probe no longer in flight changes nothing.
    probe.handle_failure(t0, first[0].id, "late");
    assert_eq!(probe.misses(), 2);
}

#[test]
fn one_miss_between_answers_does_not_flap() {
    let t0 = Instant::now();
    let mut probe = EngineProbe::new(sip_config(), t0);
    let first = step(&mut probe, t0);
    probe.handle_response(t0, first[0].id);
    step(&mut probe, t0 + Duration::from_secs(2));
    let retry = step(&mut probe, t0 + Duration::from_secs(3));
    probe.handle_response(t0 + Duration::from_secs(3), retry[0].id);
    assert_eq!(probe.misses(), 0);
    assert_eq!(
        changes(&mut probe),
        vec![(EngineState::Unchecked, EngineState::Up)]
    );
}

#[test]
fn the_ng_probe_counts_the_exchanges_the_shell_reports() {
    let t0 = Instant::now();
    let mut probe = EngineProbe::new(ng_config(), t0);
    assert_eq!(probe.poll_timeout(), None, "the sampling tick drives it");
    probe.handle_timeout(t0);
    assert!(probe.poll_transmit().is_none());
    probe.handle_answer(t0);
    assert_eq!(probe.state(), EngineState::Up);
    probe.handle_miss(t0 + Duration::from_secs(1), "no answer");
    assert_eq!(probe.state(), EngineState::Up);
    probe.handle_miss(t0 + Duration::from_secs(2), "no answer");
    assert_eq!(probe.state(), EngineState::Down);
    probe.handle_answer(t0 + Duration::from_secs(3));
    assert_eq!(
        changes(&mut probe),
        vec![
            (EngineState::Unchecked, EngineState::Up),
            (EngineState::Up, EngineState::Down),
            (EngineState::Down, EngineState::Up)
        ]
    );
}

#[test]
fn a_reload_keeps_the_state_of_the_same_method_and_starts_over_for_another() {
    let t0 = Instant::now();
    let mut probe = EngineProbe::new(sip_config(), t0);
    let first = step(&mut probe, t0);
    probe.handle_response(t0, first[0].id);
    changes(&mut probe);
    probe.reconfigure(
        t0,
        ProbeConfig {
            misses: 3,
            ..sip_config()
        },
    );
    assert_eq!(probe.state(), EngineState::Up);
    assert_eq!(probe.config().misses, 3);
    probe.reconfigure(t0, ng_config());
    assert_eq!(probe.state(), EngineState::Unchecked);
    assert_eq!(
        changes(&mut probe),
        vec![(EngineState::Up, EngineState::Unchecked)]
    );
}
