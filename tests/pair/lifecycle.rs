//! The timing of the agent ⇄ collector lifecycle (SPEC §3, §4) in virtual
//! time: registration and its refresh, subscription refresh and expiry,
//! coalescing and load-delta, 481 and refusals with their backoff, a
//! killed, restarted and stopped agent. Each test runs minutes of protocol
//! time in milliseconds; "nothing was sent" means nothing up to that
//! virtual instant, with every deadline before it run.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use msr_agent::notifier::FINAL_NOTIFY_GRACE;
use msr_agent::registration::RegistrationState;
use msr_agent::SHUTDOWN_GRACE;
use msr_collector::sip::registrar::{RegistrarEvent, RemovalCause};
use msr_collector::sip::subscriber::{RetryCause, SubscriberEvent, RETRY_CAP};
use msr_shared::refresh::refresh_delay;
use msr_shared::sip::Method;
use msr_shared::subscription::SubscriptionState;
use system_tests::pair::{
    notify_state, Fate, Packet, Pair, PairConfig, Party, COLLECTOR_ADDR, T1, TIMER_F,
};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

/// SPEC §4 as the lifecycle system tests check it: a load change ≥
/// load-delta reaches the collector within 2 s (a 200 ms sampler, at most
/// one NOTIFY a second).
const LOAD_CHANGE_LIMIT: Duration = Duration::from_secs(2);

/// A realm host that is not the collector's sending address.
const REALM_ELSEWHERE: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 9));

/// A pair with the agent registered, subscribed and its first report in.
fn live(config: PairConfig, calls: u32) -> Pair {
    let mut p = Pair::new(config, calls);
    let load = p.load_of(calls);
    let seen = p.run_until(secs(1), |p| (p.last_load() == Some(load)).then_some(()));
    assert!(seen.is_some(), "not live within 1 s:\n{}", p.dump());
    assert_eq!(p.subscription_status(), Some(SubscriptionState::Active));
    p
}

/// The answer the peer sent to `request` (same Call-ID and CSeq).
fn answer<'a>(p: &'a Pair, request: &Packet) -> Option<&'a Packet> {
    p.trace.iter().find(|r| {
        r.from != request.from
            && r.status().is_some()
            && r.call_id() == request.call_id()
            && r.header("CSeq") == request.header("CSeq")
    })
}

/// The subscriber's events matching `pred`, with their times.
fn events(p: &Pair, pred: impl Fn(&SubscriberEvent) -> bool) -> Vec<(Duration, SubscriberEvent)> {
    p.collector
        .events
        .iter()
        .filter(|(_, e)| pred(e))
        .cloned()
        .collect()
}

fn is_in_dialog(p: &Packet) -> bool {
    p.header("To").is_some_and(|to| to.contains("tag="))
}

/// The times between consecutive packets.
fn gaps(packets: &[&Packet]) -> Vec<Duration> {
    packets.windows(2).map(|w| w[1].at - w[0].at).collect()
}

/// The backoff the subscriber and the registration both use (1 s doubling
/// to 60 s), for `n` failures.
fn backoff(n: usize) -> Vec<Duration> {
    (0..n)
        .map(|i| secs(1u64 << i.min(6)).min(RETRY_CAP))
        .collect()
}

#[test]
fn registers_with_digest_then_is_subscribed_and_reports_at_once() {
    let p = live(PairConfig::default(), 10);
    let registers = p.requests(Party::Agent, Method::Register);
    assert_eq!(registers.len(), 2, "{}", p.dump());
    assert!(registers[0].header("Authorization").is_none());
    assert!(registers[1].header("Authorization").is_some());
    assert_eq!(answer(&p, registers[0]).and_then(Packet::status), Some(401));
    assert_eq!(answer(&p, registers[1]).and_then(Packet::status), Some(200));
    // RFC 3261 §10.2: one Call-ID, CSeq growing.
    assert_eq!(registers[0].call_id(), registers[1].call_id());
    assert_eq!(registers[0].header("CSeq"), Some("1 REGISTER"));
    assert_eq!(registers[1].header("CSeq"), Some("2 REGISTER"));
    // Subscribed at the instant the binding exists; the NOTIFY follows the 200.
    let registered = answer(&p, registers[1]).map(|a| a.at);
    let subscribes = p.requests(Party::Collector, Method::Subscribe);
    assert_eq!(subscribes.len(), 1);
    assert_eq!(Some(subscribes[0].at), registered);
    let notifies = p.requests(Party::Agent, Method::Notify);
    assert_eq!(notifies.len(), 1);
    assert!(notify_state(notifies[0], "active;expires=60"));
    assert!(
        p.elapsed() <= ms(10),
        "four round trips of 1 ms: {:?}",
        p.elapsed()
    );
}

/// Lifecycle test 1's refresh: across many periods the same dialog stays
/// active, every refresh leaves before the grant lapses and is followed by
/// a NOTIFY; the registration is refreshed the same way.
#[test]
fn subscription_and_registration_are_refreshed_before_they_expire() {
    let config = PairConfig {
        subscription_expires: 4,
        register_expires: 6,
        ..PairConfig::default()
    };
    let mut p = live(config, 10);
    p.run_for(secs(120));

    let subscribes = p.requests(Party::Collector, Method::Subscribe);
    let dialog = subscribes[0].call_id().to_owned();
    assert!(
        subscribes.iter().all(|s| s.call_id() == dialog),
        "one dialog: {}",
        p.dump()
    );
    // refresh_delay(4) = 1 s after each grant (a quarter), 2 ms round trip.
    assert!(subscribes.len() >= 100, "{} subscribes", subscribes.len());
    for gap in gaps(&subscribes) {
        assert!(
            gap >= refresh_delay(4) && gap <= refresh_delay(4) + ms(2),
            "refresh {gap:?} after the previous one"
        );
    }
    // A NOTIFY after every refresh (RFC 6665 §4.2.1.1), none terminated.
    let notifies = p.requests(Party::Agent, Method::Notify);
    assert_eq!(notifies.len(), subscribes.len());
    assert!(notifies.iter().all(|n| notify_state(n, "active")));
    assert!(events(&p, |e| matches!(e, SubscriberEvent::Retrying { .. })).is_empty());
    assert_eq!(p.subscription_status(), Some(SubscriptionState::Active));

    // The registration: every 6 s grant refreshed after refresh_delay(6),
    // never lapsing, one Call-ID.
    let registers = p.requests(Party::Agent, Method::Register);
    let refreshes: Vec<&Packet> = registers[1..].to_vec();
    assert!(refreshes
        .iter()
        .all(|r| r.call_id() == registers[0].call_id()));
    for gap in gaps(&refreshes) {
        assert!(
            gap >= refresh_delay(6) && gap <= refresh_delay(6) + ms(2),
            "{gap:?}"
        );
    }
    assert!(p
        .collector
        .registrar_events
        .iter()
        .all(|(_, e)| !matches!(e, RegistrarEvent::BindingRemoved { .. })));
}

/// A refresh lost with all its retransmissions: Timer F ends it 13 s
/// before the grant lapses (refresh 45 s ahead, SPEC §4), the collector
/// starts a new dialog at once after its 1 s backoff, which replaces the
/// old one at the agent.
#[test]
fn a_lost_refresh_is_replaced_by_a_new_dialog_before_the_grant_lapses() {
    let mut p = live(PairConfig::default(), 10);
    let granted_at = p.elapsed();
    // Every in-dialog SUBSCRIBE is lost from now on; new dialogs get through.
    p.set_link(|pk| {
        if pk.is(Party::Collector, Method::Subscribe) && is_in_dialog(pk) {
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    p.run_for(secs(70));

    let subscribes = p.requests(Party::Collector, Method::Subscribe);
    let first = subscribes[0].call_id().to_owned();
    // The agent's grant: its 200 to the first SUBSCRIBE.
    let granted_at = answer(&p, subscribes[0]).map_or(granted_at, |a| a.at);
    let refresh = subscribes[1];
    assert_eq!(refresh.call_id(), first);
    assert_eq!(refresh.fate, Fate::Drop);
    let refresh_at = refresh.at;
    assert!(refresh_at - granted_at <= refresh_delay(60) + ms(2));
    let retrying = events(&p, |e| matches!(e, SubscriberEvent::Retrying { .. }));
    let (at, SubscriberEvent::Retrying { cause, delay, .. }) = &retrying[0] else {
        unreachable!()
    };
    assert_eq!((cause, *delay), (&RetryCause::TimedOut, secs(1)));
    assert_eq!(*at, refresh_at + TIMER_F);
    let second = subscribes[2];
    assert_ne!(second.call_id(), first, "a new dialog");
    assert_eq!(second.at, refresh_at + TIMER_F + secs(1));
    assert!(
        second.at < granted_at + secs(60),
        "the new dialog starts before the old grant lapses"
    );

    // The new dialog comes from the same collector address: it replaces
    // the old one at the agent (its subscriber forgot it), so no NOTIFY is
    // sent in the old dialog after it, not even a `timeout` at its lapse.
    let late: Vec<&Packet> = p
        .requests(Party::Agent, Method::Notify)
        .into_iter()
        .filter(|n| n.call_id() == first && n.at > second.at + ms(2))
        .collect();
    assert!(late.is_empty(), "{late:?}\n{}", p.dump());
    assert_eq!(p.subscription_status(), Some(SubscriptionState::Active));
    assert_eq!(p.agent_subscriptions().map(|s| s.len()), Some(1));
}

/// SPEC §4: changes inside one second are coalesced into one NOTIFY that
/// carries the latest, sent when the second is over.
#[test]
fn load_changes_within_a_second_are_coalesced_into_the_latest() {
    let mut p = live(PairConfig::default(), 10);
    p.run_for(secs(2));
    let t0 = p.elapsed();
    p.set_calls(30);
    let first = p
        .run_until(secs(1), |p| {
            p.loads()
                .iter()
                .find(|(_, r)| r.load == 30)
                .map(|(at, _)| *at)
        })
        .unwrap_or_else(|| panic!("30 not reported:\n{}", p.dump()));
    for calls in [40, 50, 60] {
        p.run_for(ms(250));
        p.set_calls(calls);
    }
    p.run_for(secs(3));
    let loads: Vec<u8> = p.loads().iter().map(|(_, r)| r.load).collect();
    assert_eq!(loads, [10, 30, 60], "{}", p.dump());
    let (at, _) = p.loads()[2].clone();
    let notify_30 = p.requests(Party::Agent, Method::Notify)[1].at;
    assert_eq!(
        at - notify_30,
        ms(1000) + ms(1),
        "sent when the window ends"
    );
    assert!(first - t0 <= LOAD_CHANGE_LIMIT, "{:?}", first - t0);
}

/// Lifecycle tests 1, 5, extra: a change of at least load-delta reaches
/// the collector within [`LOAD_CHANGE_LIMIT`] whatever its phase against
/// the sampler and the rate limit.
#[test]
fn a_load_change_reaches_the_collector_within_two_seconds() {
    let mut p = live(PairConfig::default(), 10);
    let mut calls = 10;
    let mut worst = Duration::ZERO;
    for step in 0..40u64 {
        // Changes at every phase of the 200 ms sampler and the 1 s window.
        p.run_for(ms(37 * step % 1100));
        calls = if calls == 10 { 30 } else { 10 };
        p.set_calls(calls);
        let t0 = p.elapsed();
        let load = p.load_of(calls);
        let took = p
            .run_until(LOAD_CHANGE_LIMIT, |p| {
                (p.last_load() == Some(load)).then(|| p.elapsed() - t0)
            })
            .unwrap_or_else(|| panic!("load {load} not within 2 s:\n{}", p.dump()));
        worst = worst.max(took);
    }
    // The sampler's period plus the rate limit plus the flight.
    assert!(worst <= ms(200) + ms(1000) + ms(1), "worst {worst:?}");
}

/// Lifecycle test 4 (was a 2.5 s wall-clock sleep): below load-delta
/// nothing is notified, however long; lowering load-delta by a reload
/// reports the same move at once.
#[test]
fn a_move_below_load_delta_is_notified_only_once_the_delta_is_lowered() {
    let config = PairConfig {
        load_delta: 20,
        subscription_expires: 120,
        ..PairConfig::default()
    };
    let mut p = live(config, 10);
    p.set_calls(18);
    // Up to just before the first refresh (75 s: its NOTIFY carries the
    // current load whatever the delta).
    let refresh = refresh_delay(120);
    p.run_for(refresh - p.elapsed() - ms(10));
    assert_eq!(p.loads().len(), 1, "below load-delta 20:\n{}", p.dump());
    assert_eq!(p.last_load(), Some(10));

    let t0 = p.elapsed();
    p.reconfigure_agent(|c| c.load_delta = 5);
    let took = p.run_until(secs(1), |p| {
        (p.last_load() == Some(18)).then(|| p.elapsed() - t0)
    });
    assert_eq!(took, Some(ms(1)), "reported when the reload applies");
}

/// Lifecycle "extra" (SPEC §4): reaching 100 and leaving it are reported
/// at once even below load-delta; with the high-water mark at 100 nothing
/// else below it is.
#[test]
fn reaching_and_leaving_full_are_reported_despite_load_delta() {
    let config = PairConfig {
        load_delta: 20,
        high_water: 100,
        ..PairConfig::default()
    };
    let mut p = live(config, 90);
    p.run_for(secs(2));
    p.set_calls(95);
    p.run_for(secs(5));
    assert_eq!(p.last_load(), Some(90), "5 points below delta 20");
    for calls in [100, 99] {
        p.set_calls(calls);
        let t0 = p.elapsed();
        let took = p.run_until(LOAD_CHANGE_LIMIT, |p| {
            (p.last_load() == Some(calls as u8)).then(|| p.elapsed() - t0)
        });
        assert!(
            took.is_some_and(|t| t <= ms(1201)),
            "edge at {calls}: {took:?}\n{}",
            p.dump()
        );
        p.run_for(secs(2));
    }
    let loads: Vec<u8> = p.loads().iter().map(|(_, r)| r.load).collect();
    assert_eq!(loads, [90, 100, 99]);
}

/// A NOTIFY lost with its retransmissions ends the subscription at the
/// agent (Timer F's 408, RFC 6665 §4.2.2); the collector's next refresh
/// gets 481 and a new dialog follows after the 1 s backoff, reporting the
/// current load.
#[test]
fn a_481_to_a_refresh_starts_a_new_subscription() {
    let mut p = live(PairConfig::default(), 10);
    p.run_for(secs(2));
    let lost_from = p.elapsed();
    // The first change's NOTIFY, and each of its retransmissions (Timer
    // E: they leave after the first second too).
    let mut lost: Option<String> = None;
    p.set_link(move |pk| {
        let first_change = pk.is(Party::Agent, Method::Notify)
            && !pk.retransmission
            && pk.at >= lost_from
            && pk.at < lost_from + secs(1);
        if first_change && lost.is_none() {
            lost = pk.header("CSeq").map(str::to_owned);
        }
        if pk.is(Party::Agent, Method::Notify)
            && lost.is_some()
            && pk.header("CSeq") == lost.as_deref()
        {
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    p.set_calls(30);
    p.run_for(secs(80));

    let lost = p
        .requests(Party::Agent, Method::Notify)
        .into_iter()
        .find(|n| n.fate == Fate::Drop)
        .map(|n| n.at)
        .unwrap_or_else(|| panic!("no notify lost:\n{}", p.dump()));
    let subscribes = p.requests(Party::Collector, Method::Subscribe);
    let refused = subscribes
        .iter()
        .find(|s| answer(&p, s).and_then(Packet::status) == Some(481))
        .unwrap_or_else(|| panic!("no 481:\n{}", p.dump()));
    assert!(
        refused.at > lost + TIMER_F,
        "the agent dropped the subscription at Timer F"
    );
    let retrying = events(&p, |e| matches!(e, SubscriberEvent::Retrying { .. }));
    assert_eq!(retrying.len(), 1, "{retrying:?}");
    let SubscriberEvent::Retrying { cause, delay, .. } = &retrying[0].1 else {
        unreachable!()
    };
    assert_eq!((cause, *delay), (&RetryCause::Status(481), secs(1)));
    let next = subscribes
        .iter()
        .find(|s| s.at > refused.at)
        .unwrap_or_else(|| panic!("no new subscribe:\n{}", p.dump()));
    assert_ne!(next.call_id(), refused.call_id());
    assert!(!is_in_dialog(next));
    assert_eq!(next.at, refused.at + ms(2) + secs(1));
    assert_eq!(p.last_load(), Some(30));
    assert_eq!(p.subscription_status(), Some(SubscriptionState::Active));
}

/// SUBSCRIBEs refused (403: the agent does not take the collector as a
/// subscriber host) are retried after 1, 2, 4 … s, capped at 60 s; once
/// allowed, the next retry succeeds and the backoff starts over.
#[test]
fn refused_subscriptions_back_off_exponentially_up_to_a_minute() {
    // The agent registers at an address the collector does not send
    // from, so the collector is not one of its subscriber hosts (SPEC §4).
    let config = PairConfig {
        realm_host: REALM_ELSEWHERE,
        ..PairConfig::default()
    };
    let mut p = Pair::new(config, 10);
    p.run_for(secs(250));
    let subscribes = p.requests(Party::Collector, Method::Subscribe);
    assert!(subscribes
        .iter()
        .all(|s| answer(&p, s).and_then(Packet::status) == Some(403)));
    let waits: Vec<Duration> = gaps(&subscribes).iter().map(|g| *g - ms(2)).collect();
    assert_eq!(waits, backoff(waits.len()), "{}", p.dump());
    assert!(waits.len() >= 8, "{waits:?}");
    assert_eq!(p.subscription_status(), Some(SubscriptionState::Failed));

    p.reconfigure_agent(|c| c.allow_subscribers.push(COLLECTOR_ADDR.ip()));
    let live = p.run_until(RETRY_CAP + secs(1), |p| p.last_load());
    assert_eq!(live, Some(10), "{}", p.dump());
    assert_eq!(p.subscription_status(), Some(SubscriptionState::Active));
}

/// REGISTERs refused (403: a wrong password) are retried after 1, 2, 4 … s,
/// capped at 60 s.
#[test]
fn refused_registrations_back_off_exponentially_up_to_a_minute() {
    let config = PairConfig {
        password: "wrong".into(),
        ..PairConfig::default()
    };
    let mut p = Pair::new(config, 10);
    p.run_for(secs(250));
    let registers = p.requests(Party::Agent, Method::Register);
    // The first attempt is challenged; the later ones reuse the challenge
    // (RFC 3261 §22.4), so each is one credentialed REGISTER and its 403.
    assert!(registers[0].header("Authorization").is_none());
    assert_eq!(answer(&p, registers[0]).and_then(Packet::status), Some(401));
    let attempts: Vec<&Packet> = registers[1..].to_vec();
    assert!(attempts.iter().all(|r| r.header("Authorization").is_some()
        && answer(&p, r).and_then(Packet::status) == Some(403)));
    let waits: Vec<Duration> = gaps(&attempts).iter().map(|g| *g - ms(2)).collect();
    assert_eq!(waits, backoff(waits.len()));
    assert!(waits.len() >= 8, "{waits:?}");
    assert_eq!(p.registration_state(), Some(RegistrationState::Failed));
    assert!(!p.is_registered());
    assert!(p.requests(Party::Collector, Method::Subscribe).is_empty());
}

/// A registrar that never answers: Timer F's 408 fails the attempt, the
/// next follows the backoff; once the link is back the attempt in flight
/// gets through with its next retransmission (Timer E).
#[test]
fn an_unreachable_registrar_is_retried_after_timer_f() {
    let mut p = Pair::new(PairConfig::default(), 10);
    p.set_link(|pk| {
        if pk.is(Party::Agent, Method::Register) {
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    // Two attempts timed out, the third just sent.
    p.run_for(TIMER_F * 2 + secs(3));
    let registers = p.requests(Party::Agent, Method::Register);
    assert_eq!(registers.len(), 3, "{}", p.dump());
    assert_eq!(registers[1].at - registers[0].at, TIMER_F + secs(1));
    assert_eq!(registers[2].at - registers[1].at, TIMER_F + secs(2));
    assert_eq!(registers[2].at, p.elapsed());
    // Its first retransmission, T1 later, is challenged; the credentialed
    // REGISTER follows the 401.
    p.set_link(|_| Fate::Deliver);
    let live = p.run_until(secs(1), |p| p.last_load());
    assert_eq!(live, Some(10), "{}", p.dump());
    let registers = p.requests(Party::Agent, Method::Register);
    assert_eq!(registers.len(), 4, "{}", p.dump());
    assert!(registers[3].header("Authorization").is_some());
    assert_eq!(registers[3].at - registers[2].at, T1 + ms(2));
}

/// Lifecycle test 2's timing: an MSR killed with `kill -9` lapses exactly
/// when its last granted registration runs out (its subscription failing
/// meanwhile), its subscription ends with it; restarted, it registers and
/// reports again at once.
#[test]
fn a_killed_msr_lapses_with_its_registration_and_comes_back_at_once() {
    let config = PairConfig {
        subscription_expires: 2,
        register_expires: 8,
        ..PairConfig::default()
    };
    let mut p = live(config, 10);
    p.run_for(secs(5));
    let killed = p.elapsed();
    p.kill_agent();
    let last_grant = p
        .requests(Party::Agent, Method::Register)
        .last()
        .and_then(|r| answer(&p, r))
        .map(|a| a.at)
        .unwrap_or_else(|| panic!("no register answered:\n{}", p.dump()));
    let lapsed = p.run_until(secs(10), |p| {
        p.collector
            .registrar_events
            .iter()
            .find_map(|(at, e)| match e {
                RegistrarEvent::BindingRemoved {
                    cause: RemovalCause::Lapsed,
                    ..
                } => Some(*at),
                _ => None,
            })
    });
    assert_eq!(lapsed, Some(last_grant + secs(8)), "{}", p.dump());
    assert!(lapsed.is_some_and(|l| l - killed <= secs(8)));
    // The subscription failed before (its 2 s grant ran out unrefreshed) …
    let expired = events(
        &p,
        |e| matches!(e, SubscriberEvent::Retrying { cause, .. } if *cause == RetryCause::Expired),
    );
    assert!(!expired.is_empty(), "{:?}", p.collector.events);
    assert!(expired[0].0 <= killed + secs(2));
    // … and ends with the binding.
    let ended = events(&p, |e| matches!(e, SubscriberEvent::Ended { .. }));
    assert_eq!(ended.first().map(|(at, _)| Some(*at)), Some(lapsed));
    assert_eq!(p.subscription_status(), None);

    p.set_calls(20);
    p.start_agent();
    let back = p.run_until(secs(1), |p| {
        (p.last_load() == Some(20)).then(|| p.elapsed())
    });
    assert!(
        back.is_some_and(|b| b - lapsed.unwrap_or_default() <= ms(10)),
        "{back:?}\n{}",
        p.dump()
    );
}

/// SPEC §3: an agent restarted (new Call-ID) before its binding lapsed is
/// subscribed anew at once, the dead dialog dropped without waiting for
/// its refresh to fail.
#[test]
fn a_restarted_agent_is_subscribed_anew_at_once() {
    let mut p = live(PairConfig::default(), 10);
    p.run_for(secs(3));
    let old = p.requests(Party::Collector, Method::Subscribe)[0]
        .call_id()
        .to_owned();
    p.kill_agent();
    p.set_calls(40);
    p.start_agent();
    let back = p.run_until(secs(1), |p| {
        (p.last_load() == Some(40)).then(|| p.elapsed())
    });
    assert!(back.is_some(), "{}", p.dump());
    let restarted = p
        .collector
        .registrar_events
        .iter()
        .find(|(_, e)| matches!(e, RegistrarEvent::BindingRestarted(_)))
        .map(|(at, _)| *at)
        .unwrap_or_else(|| panic!("no restart seen:\n{}", p.dump()));
    let subscribes = p.requests(Party::Collector, Method::Subscribe);
    let new = subscribes.last().copied().unwrap_or_else(|| unreachable!());
    assert_ne!(new.call_id(), old);
    assert_eq!(
        new.at, restarted,
        "subscribed at the instant of the restart"
    );
    assert_eq!(subscribes.len(), 2, "no refresh of the dead dialog");
}

/// Lifecycle test 1's SIGTERM: the `deactivated` NOTIFY leaves first and
/// is answered 200 before the `Expires: 0` REGISTER; the binding goes,
/// the subscription ends, and the agent is done long before its grace.
#[test]
fn sigterm_deactivates_before_unregistering_and_the_subscription_ends() {
    let mut p = live(PairConfig::default(), 10);
    p.run_for(secs(3));
    let t0 = p.elapsed();
    p.stop_agent();
    let stopped = p.run_until(FINAL_NOTIFY_GRACE + SHUTDOWN_GRACE, |p| {
        (!p.agent_running()).then(|| p.elapsed())
    });
    let stopped = stopped.unwrap_or_else(|| panic!("agent still running:\n{}", p.dump()));
    assert!(
        stopped - t0 <= ms(10),
        "no wait in vain: {:?}",
        stopped - t0
    );

    let deactivated = p
        .requests(Party::Agent, Method::Notify)
        .into_iter()
        .find(|n| notify_state(n, "terminated;reason=deactivated"))
        .unwrap_or_else(|| panic!("no deactivated notify:\n{}", p.dump()));
    let answered = answer(&p, deactivated).unwrap_or_else(|| panic!("{}", p.dump()));
    assert_eq!(answered.status(), Some(200));
    let unregister = p
        .requests(Party::Agent, Method::Register)
        .into_iter()
        .find(|r| r.header("Expires") == Some("0"))
        .unwrap_or_else(|| panic!("no unregister:\n{}", p.dump()));
    assert!(unregister.at >= answered.at, "{}", p.dump());
    assert!(p.collector.registrar_events.iter().any(|(_, e)| matches!(
        e,
        RegistrarEvent::BindingRemoved {
            cause: RemovalCause::Unregistered,
            ..
        }
    )));
    assert!(!p.is_registered());
    assert_eq!(p.subscription_status(), None);
    // Every NOTIFY was taken (none refused by the collector).
    for n in p.requests(Party::Agent, Method::Notify) {
        assert_eq!(answer(&p, n).and_then(Packet::status), Some(200), "{n}");
    }
}

/// Lifecycle "final NOTIFYs" (was a SIGSTOP over UDP): the agent's
/// refreshes are lost, its binding lapses, the collector unsubscribes;
/// the agent answers and sends its final NOTIFY, which the collector
/// answers 200 although the subscription is gone (RFC 6665 §4.4.1).
#[test]
fn the_final_notify_after_an_unsubscribe_is_answered_200() {
    let config = PairConfig {
        register_expires: 6,
        ..PairConfig::default()
    };
    let mut p = live(config, 10);
    p.set_link(|pk| {
        if pk.is(Party::Agent, Method::Register) {
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    let gone = p.run_until(secs(10), |p| (!p.is_registered()).then(|| p.elapsed()));
    assert!(gone.is_some(), "{}", p.dump());
    p.run_for(secs(1));
    let unsubscribe = p
        .requests(Party::Collector, Method::Subscribe)
        .into_iter()
        .find(|s| s.header("Expires") == Some("0"))
        .unwrap_or_else(|| panic!("no unsubscribe:\n{}", p.dump()));
    assert_eq!(answer(&p, unsubscribe).and_then(Packet::status), Some(200));
    let last = p
        .requests(Party::Agent, Method::Notify)
        .into_iter()
        .find(|n| n.call_id() == unsubscribe.call_id() && notify_state(n, "terminated"))
        .unwrap_or_else(|| panic!("no final notify:\n{}", p.dump()));
    assert_eq!(answer(&p, last).and_then(Packet::status), Some(200));
    for n in p.requests(Party::Agent, Method::Notify) {
        assert_eq!(answer(&p, n).and_then(Packet::status), Some(200), "{n}");
    }
}

/// SPEC §4: the agent grants at most `max-subscription-expires`; the
/// collector refreshes on the grant, not on what it asked for.
#[test]
fn a_shortened_grant_is_refreshed_on_its_own_period() {
    let config = PairConfig {
        max_subscription_expires: 10,
        ..PairConfig::default()
    };
    let mut p = live(config, 10);
    p.run_for(secs(60));
    let subscribes = p.requests(Party::Collector, Method::Subscribe);
    assert!(subscribes.iter().all(|s| s.header("Expires") == Some("60")));
    let granted = answer(&p, subscribes[0]).and_then(|a| a.header("Expires").map(str::to_owned));
    assert_eq!(granted.as_deref(), Some("10"));
    for gap in gaps(&subscribes) {
        assert!(
            gap >= refresh_delay(10) && gap <= refresh_delay(10) + ms(2),
            "{gap:?}"
        );
    }
    assert!(subscribes
        .iter()
        .all(|s| s.call_id() == subscribes[0].call_id()));
    assert!(events(&p, |e| matches!(e, SubscriberEvent::Retrying { .. })).is_empty());
}

/// RFC 6665 §4.1.2.4: the first NOTIFY may overtake the 200 to the
/// SUBSCRIBE; the collector takes it (it fixes the dialog) and the late
/// 200 then confirms the same dialog.
#[test]
fn a_notify_overtaking_the_200_is_taken() {
    let mut p = Pair::new(PairConfig::default(), 10);
    p.set_link(|pk| {
        let ok_to_subscribe =
            pk.from == Party::Agent && pk.cseq_method().as_deref() == Some("SUBSCRIBE");
        if ok_to_subscribe {
            Fate::Delay(ms(50))
        } else {
            Fate::Deliver
        }
    });
    let load = p.run_until(secs(1), |p| p.last_load());
    assert_eq!(load, Some(10), "{}", p.dump());
    assert_eq!(p.subscription_status(), Some(SubscriptionState::Pending));
    p.run_for(ms(100));
    assert_eq!(p.subscription_status(), Some(SubscriptionState::Active));
    let notify = p.requests(Party::Agent, Method::Notify)[0].at;
    let ok = p
        .sent(|pk| pk.from == Party::Agent && pk.status() == Some(200))
        .first()
        .map(|a| a.at);
    assert!(
        ok.is_some_and(|ok| ok <= notify),
        "sent first, arrived last"
    );
    p.run_for(secs(30));
    assert_eq!(
        p.requests(Party::Collector, Method::Subscribe).len(),
        2,
        "one dialog, refreshed"
    );
}

/// A lossy, reordering link for five minutes (seeded, so every run is the
/// same): a fifth of the datagrams lost (each retransmission judged anew),
/// the rest delayed up to 2 s. Once the link is clean again the pair settles
/// within one backoff cap plus Timer F and a registration period: the MSR
/// registered, one live subscription at each end, the current load shown.
#[test]
fn after_a_lossy_link_heals_the_pair_settles() {
    use rand::{Rng, SeedableRng};
    let mut worst = Duration::ZERO;
    for seed in 0..40u64 {
        let config = PairConfig {
            subscription_expires: 30,
            register_expires: 30,
            ..PairConfig::default()
        };
        let mut p = Pair::new(config, 10);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        p.set_link(move |_| match rng.gen_range(0..10) {
            0 | 1 => Fate::Drop,
            2..=5 => Fate::Delay(ms(rng.gen_range(0..2000))),
            _ => Fate::Deliver,
        });
        for step in 0..30u32 {
            p.set_calls(10 + (step * 7) % 60);
            p.run_for(secs(10));
        }
        p.set_link(|_| Fate::Deliver);
        p.set_calls(42);
        let limit = RETRY_CAP + TIMER_F + secs(30) + secs(60);
        let healed = p.elapsed();
        let settled = p.run_until(limit, |p| {
            let notifier = p.agent_subscriptions().map(|s| s.len());
            (p.is_registered()
                && p.subscription_status() == Some(SubscriptionState::Active)
                && p.last_load() == Some(42)
                && notifier == Some(1))
            .then(|| p.elapsed() - healed)
        });
        worst = worst.max(settled.unwrap_or(limit));
        assert!(
            settled.is_some(),
            "seed {seed}: not settled {limit:?} after the link healed: registered {}, subscription {:?}, load {:?}, agent subscriptions {:?}\n{}",
            p.is_registered(),
            p.subscription_status(),
            p.last_load(),
            p.agent_subscriptions(),
            p.dump()
        );
    }
    eprintln!("settled at most {worst:?} after the link healed (40 seeds)");
}

/// The collector's own client transactions (RFC 3261 §17.1.2): a
/// SUBSCRIBE whose first copy is lost is retransmitted after T1 and taken
/// by the agent; a lost 200 to it makes the agent answer the
/// retransmission from its cache, and the collector takes that answer.
#[test]
fn a_lost_subscribe_or_its_lost_answer_is_repaired_by_a_retransmission() {
    let mut p = Pair::new(PairConfig::default(), 10);
    p.set_link(|pk| {
        let first_subscribe = pk.is(Party::Collector, Method::Subscribe) && !pk.retransmission;
        if first_subscribe {
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    let live = p.run_until(secs(5), |p| p.last_load());
    assert_eq!(live, Some(10), "{}", p.dump());
    let subscribe = p.requests(Party::Collector, Method::Subscribe)[0].clone();
    let copies = p.sent(|pk| {
        pk.is(Party::Collector, Method::Subscribe) && pk.call_id() == subscribe.call_id()
    });
    assert_eq!(copies.len(), 2, "{}", p.dump());
    assert_eq!(copies[1].at - copies[0].at, ms(500), "T1");
    assert_eq!(p.subscription_status(), Some(SubscriptionState::Active));
    assert!(events(&p, |e| matches!(e, SubscriberEvent::Retrying { .. })).is_empty());

    // Now the agent's first answer to the next (refresh) is lost.
    let mut lost = false;
    p.set_link(move |pk| {
        if pk.from == Party::Agent
            && pk.status() == Some(200)
            && pk.cseq_method().as_deref() == Some("SUBSCRIBE")
            && !lost
        {
            lost = true;
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    p.run_for(secs(30));
    let refresh = p.requests(Party::Collector, Method::Subscribe)[1].clone();
    assert_eq!(
        refresh.call_id(),
        subscribe.call_id(),
        "an in-dialog refresh"
    );
    let answers = p.sent(|pk| {
        pk.from == Party::Agent
            && pk.status() == Some(200)
            && pk.call_id() == refresh.call_id()
            && pk.header("CSeq") == refresh.header("CSeq")
    });
    assert_eq!(answers.len(), 2, "the cached 200 again:\n{}", p.dump());
    assert_eq!(p.subscription_status(), Some(SubscriptionState::Active));
    assert!(events(&p, |e| matches!(e, SubscriberEvent::Retrying { .. })).is_empty());
}

/// SPEC §3: the bindings are saved before their 200, so a collector killed
/// and restarted resumes the subscription from them within 2 s, without
/// waiting for the MSR's next REGISTER; the old dialog's NOTIFYs get 481,
/// and the agent's subscription is the new one. The agent ends the old
/// dialog it replaced with a final NOTIFY (RFC 6665 §4.2.2), which the
/// restarted collector does not know and answers 481.
#[test]
fn a_restarted_collector_resumes_from_its_saved_bindings_within_two_seconds() {
    let mut p = live(PairConfig::default(), 10);
    p.run_for(secs(5));
    let restarted = p.elapsed();
    p.set_calls(30);
    p.restart_collector(true);
    let back = p.run_until(secs(5), |p| {
        p.loads()
            .iter()
            .any(|(at, r)| *at >= restarted && r.load == p.load_of(30))
            .then(|| p.elapsed())
    });
    let back = back.unwrap_or_else(|| panic!("not back:\n{}", p.dump()));
    assert!(
        back - restarted <= secs(2),
        "{:?}\n{}",
        back - restarted,
        p.dump()
    );
    assert_eq!(p.subscription_status(), Some(SubscriptionState::Active));
    assert!(p.is_registered());
    let finals: Vec<String> = p
        .requests(Party::Agent, Method::Notify)
        .into_iter()
        .filter(|n| n.at >= restarted)
        .filter(|n| {
            n.header("Subscription-State")
                .is_some_and(|s| s.starts_with("terminated;reason=deactivated"))
        })
        .map(|n| n.call_id().to_owned())
        .collect();
    assert_eq!(finals.len(), 1, "one final notify:\n{}", p.dump());
    assert!(
        !p.sent(|pk| pk.from == Party::Collector
            && pk.status() == Some(481)
            && pk.call_id() == finals[0])
            .is_empty(),
        "the final notify answered 481:\n{}",
        p.dump()
    );
    p.run_for(secs(120));
    assert_eq!(
        p.agent_subscriptions().map(|s| s.len()),
        Some(1),
        "the old subscription is gone at the agent:\n{}",
        p.dump()
    );
}

/// SPEC §3: a collector that lost its bindings answers the agent's next
/// NOTIFY 481; the agent REGISTERs again at once, and is subscribed and
/// reporting within 2 s of that answer.
#[test]
fn a_collector_that_lost_its_bindings_has_the_msr_back_at_its_next_notify() {
    let mut p = live(PairConfig::default(), 10);
    p.run_for(secs(5));
    p.restart_collector(false);
    let lost = p.elapsed();
    assert!(p.subscription_status().is_none());
    p.set_calls(40);
    let refused = p
        .run_until(secs(3), |p| {
            p.sent(|pk| pk.from == Party::Collector && pk.status() == Some(481) && pk.at >= lost)
                .first()
                .map(|pk| pk.at)
        })
        .unwrap_or_else(|| panic!("no 481:\n{}", p.dump()));
    let back = p
        .run_until(secs(5), |p| {
            p.loads()
                .iter()
                .find(|(at, r)| *at >= lost && r.load == p.load_of(40))
                .map(|(at, _)| *at)
        })
        .unwrap_or_else(|| panic!("not back:\n{}", p.dump()));
    assert!(
        back - refused <= secs(2),
        "{:?}\n{}",
        back - refused,
        p.dump()
    );
    let register = p
        .requests(Party::Agent, Method::Register)
        .into_iter()
        .find(|r| r.at >= refused)
        .unwrap_or_else(|| panic!("no register after the 481:\n{}", p.dump()));
    assert!(
        register.at - refused <= ms(10),
        "at once: {:?}",
        register.at - refused
    );
    assert_eq!(p.subscription_status(), Some(SubscriptionState::Active));
}
