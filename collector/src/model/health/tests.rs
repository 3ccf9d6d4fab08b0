//! The health monitor in virtual time: every instant is `t0 + d`, the
//! monitor is woken at its own `poll_timeout`, and nothing sleeps.

use super::*;
use msr_shared::event_package::{EngineState, Service};
use msr_shared::sip::TerminationReason;

const SECOND: Duration = Duration::from_secs(1);

/// How a simulated agent answers keepalives.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Agent {
    /// 200 at once.
    Answers,
    /// Nothing (a SIGSTOPped or killed agent).
    Silent,
    /// This status at once.
    Status(u16),
    /// Answers every other keepalive (the first not).
    Alternate,
    /// The transaction fails (transport error).
    Fails,
}

struct Harness {
    monitor: HealthMonitor,
    now: Instant,
    t0: Instant,
    agent: Agent,
    probes: Vec<(Duration, String)>,
    changes: Vec<HealthChange>,
    suppressed: Vec<(String, u32, Health)>,
}

impl Harness {
    fn new(config: HealthConfig) -> Self {
        let t0 = Instant::now();
        Self {
            monitor: HealthMonitor::new(config, "sip:collector@127.0.0.1:5060".into()),
            now: t0,
            t0,
            agent: Agent::Answers,
            probes: Vec::new(),
            changes: Vec::new(),
            suppressed: Vec::new(),
        }
    }

    fn register(&mut self, contact: &str) {
        let msr = contact
            .split_once('@')
            .map_or(contact, |(_, m)| m)
            .to_owned();
        let uri = format!("sip:{msr}@127.0.0.1:5070");
        self.monitor.contact_registered(
            self.now,
            &ContactName::test(contact),
            &MsrName::test(&msr),
            &uri,
        );
        self.drain();
    }

    fn report(&mut self, msr: &str) {
        self.monitor
            .report_received(self.now, msr, EngineState::Unchecked, Service::Active);
        self.drain();
    }

    fn subscription(&mut self, msr: &str, status: SubscriptionState, expires: u32) {
        self.monitor
            .subscription_changed(self.now, msr, &status, expires);
        self.drain();
    }

    /// Answers the probes sent as the agent does, and records events.
    fn drain(&mut self) {
        loop {
            let mut answered = false;
            while let Some(probe) = self.monitor.poll_transmit() {
                assert_eq!(probe.request.method, Method::Options);
                self.probes
                    .push((self.now - self.t0, probe.contact.to_string()));
                match self.agent {
                    Agent::Answers => {
                        self.monitor
                            .handle_response(self.now, probe.id, &StatusCode::OK);
                        answered = true;
                    }
                    Agent::Status(code) => {
                        self.monitor
                            .handle_response(self.now, probe.id, &StatusCode::from(code));
                        answered = true;
                    }
                    Agent::Fails => {
                        self.monitor.handle_failure(self.now, probe.id);
                        answered = true;
                    }
                    Agent::Alternate => {
                        if self.probes.len().is_multiple_of(2) {
                            self.monitor
                                .handle_response(self.now, probe.id, &StatusCode::OK);
                            answered = true;
                        }
                    }
                    Agent::Silent => {}
                }
            }
            while let Some(event) = self.monitor.poll_event() {
                match event {
                    HealthEvent::Changed(c) => self.changes.push(c),
                    HealthEvent::Suppressed {
                        contact,
                        count,
                        health,
                    } => self.suppressed.push((contact.to_string(), count, health)),
                    HealthEvent::CoreFailure { .. } => {}
                }
            }
            if !answered {
                break;
            }
        }
    }

    /// Wakes the monitor at each of its deadlines up to `t0 + until`.
    fn run_until(&mut self, until: Duration) {
        let end = self.t0 + until;
        while let Some(at) = self.monitor.poll_timeout() {
            if at > end {
                break;
            }
            assert!(at >= self.now, "deadline in the past");
            self.now = at;
            self.monitor.handle_timeout(at);
            self.drain();
        }
        self.now = end;
    }

    fn health(&self, contact: &str) -> Option<Health> {
        self.monitor.health(contact).map(|(h, _)| h)
    }

    /// When `contact` first took `health` after `after`.
    fn first_change_to(&self, contact: &str, health: Health, after: Duration) -> Option<Duration> {
        self.changes
            .iter()
            .filter(|c| c.contact == contact && c.to == health && c.from.is_some())
            .map(|c| c.at - self.t0)
            .find(|at| *at >= after)
    }
}

/// A healthy, reporting, answering contact.
fn healthy() -> Harness {
    let mut h = Harness::new(HealthConfig::default());
    h.register("lo@msr_1");
    h.report("msr_1");
    h.subscription("msr_1", SubscriptionState::Active, 60);
    h
}

#[tokio::test(start_paused = true)]
async fn an_answering_reporting_contact_stays_healthy_and_is_probed_every_interval() {
    let mut h = healthy();
    // Reports keep coming (the collector refreshes 45 s before a 60 s grant lapses).
    for step in 1..=4 {
        h.run_until(Duration::from_secs(step * 40));
        h.report("msr_1");
    }
    h.run_until(Duration::from_secs(160));
    assert_eq!(h.health("lo@msr_1"), Some(Health::Healthy));
    assert_eq!(h.changes.len(), 1, "only the first health: {:?}", h.changes);
    assert_eq!(h.changes[0].cause, Cause::Registered);
    let gaps: Vec<Duration> = h.probes.windows(2).map(|w| w[1].0 - w[0].0).collect();
    assert!(gaps.iter().all(|g| *g == 5 * SECOND), "{gaps:?}");
    assert!(
        h.probes[0].0 < 5 * SECOND,
        "first probe within one interval"
    );
}

#[tokio::test(start_paused = true)]
async fn a_silent_agent_is_unreachable_after_two_misses_within_nine_seconds() {
    let mut h = healthy();
    h.run_until(Duration::from_secs(20));
    let last_answered = h.probes.last().map(|p| p.0).expect("probed");
    h.agent = Agent::Silent;
    h.run_until(Duration::from_secs(60));
    let at = h
        .first_change_to("lo@msr_1", Health::Unreachable, last_answered)
        .expect("unreachable");
    // Next probe one interval later, then two timeouts (the second probe
    // goes at once after the first miss).
    assert_eq!(at - last_answered, 5 * SECOND + 2 * 2 * SECOND);
    let change = h.changes.last().expect("change");
    assert_eq!(change.cause, Cause::KeepaliveMissed);
    assert!(change.log);
    // Still probed, once per interval, to see it come back.
    let after: Vec<Duration> = h.probes.iter().map(|p| p.0).filter(|t| *t > at).collect();
    assert!(
        after.windows(2).all(|w| w[1] - w[0] == 5 * SECOND),
        "{after:?}"
    );
    assert_eq!(h.monitor.probes_in_flight(), 1);
}

/// When the next keepalive to `lo@msr_1` goes, from `t0`.
fn next_probe(h: &Harness) -> Duration {
    h.monitor
        .contacts
        .get("lo@msr_1")
        .expect("contact")
        .next_probe
        - h.t0
}

#[tokio::test(start_paused = true)]
async fn one_miss_is_not_enough() {
    let mut h = healthy();
    h.run_until(Duration::from_secs(10));
    h.agent = Agent::Silent;
    // The next probe goes unanswered; the one sent at its miss is answered.
    let next = next_probe(&h);
    h.run_until(next + 2 * SECOND - Duration::from_millis(1));
    h.agent = Agent::Answers;
    h.run_until(Duration::from_secs(60));
    assert_eq!(h.health("lo@msr_1"), Some(Health::Healthy));
    assert_eq!(h.changes.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn error_statuses_and_transport_failures_are_misses() {
    for agent in [
        Agent::Status(500),
        Agent::Status(403),
        Agent::Status(404),
        Agent::Status(408),
        Agent::Status(302),
        Agent::Fails,
    ] {
        let mut h = healthy();
        h.agent = agent;
        h.run_until(Duration::from_secs(10));
        assert_eq!(h.health("lo@msr_1"), Some(Health::Unreachable), "{agent:?}");
    }
    // A provisional-looking or other 2xx is an answer.
    let mut h = healthy();
    h.agent = Agent::Status(202);
    h.run_until(Duration::from_secs(30));
    assert_eq!(h.health("lo@msr_1"), Some(Health::Healthy));
}

#[tokio::test(start_paused = true)]
async fn an_answer_after_the_timeout_is_ignored() {
    let mut h = healthy();
    h.agent = Agent::Silent;
    let first = next_probe(&h);
    h.run_until(first);
    // The id of the probe in flight; it times out, then is answered late.
    let id = *h.monitor.in_flight.keys().next().expect("in flight");
    h.run_until(first + 2 * SECOND);
    h.monitor.handle_response(h.now, id, &StatusCode::OK);
    h.drain();
    let c = h.monitor.contacts.get("lo@msr_1").expect("contact");
    assert_eq!(c.misses, 1);
    assert_eq!(c.good_streak, 0);
}

#[tokio::test(start_paused = true)]
async fn recovery_needs_two_good_signals_in_a_row_and_the_first_probes_at_once() {
    let mut h = healthy();
    h.agent = Agent::Silent;
    h.run_until(Duration::from_secs(30));
    assert_eq!(h.health("lo@msr_1"), Some(Health::Unreachable));
    let probes_before = h.probes.len();
    // The agent resumes: its first fresh NOTIFY is one good signal, and
    // sends a keepalive at once, whose answer is the second.
    h.agent = Agent::Answers;
    h.report("msr_1");
    assert_eq!(h.probes.len(), probes_before + 1, "probed at once");
    assert_eq!(h.health("lo@msr_1"), Some(Health::Healthy));
    let back = h.changes.last().expect("change");
    assert_eq!((back.to, back.cause), (Health::Healthy, Cause::Recovered));
    assert_eq!(back.at, h.now, "healthy at the NOTIFY's instant");
}

#[tokio::test(start_paused = true)]
async fn a_contact_answering_every_other_probe_does_not_flap_back() {
    let mut h = healthy();
    // A long subscription: the report stays fresh for the whole run.
    h.subscription("msr_1", SubscriptionState::Active, 3600);
    h.agent = Agent::Silent;
    h.run_until(Duration::from_secs(30));
    assert_eq!(h.health("lo@msr_1"), Some(Health::Unreachable));
    // One answered probe, one missed, for ten minutes.
    h.agent = Agent::Alternate;
    h.run_until(Duration::from_secs(630));
    assert!(h.probes.len() > 100);
    let recovered = h
        .changes
        .iter()
        .filter(|c| c.to == Health::Healthy && c.from.is_some())
        .count();
    assert_eq!(recovered, 0, "{:?}", h.changes);
}

#[tokio::test(start_paused = true)]
async fn a_contact_that_never_reports_is_unreported_after_the_grace() {
    let mut h = Harness::new(HealthConfig::default());
    h.register("lo@msr_1");
    h.run_until(Duration::from_millis(1999));
    assert_eq!(h.health("lo@msr_1"), Some(Health::Healthy));
    h.run_until(Duration::from_secs(10));
    assert_eq!(
        h.first_change_to("lo@msr_1", Health::Unreported, Duration::ZERO),
        Some(Duration::from_secs(2))
    );
    // Keepalives keep being answered; a report then brings it back at
    // once (the answered keepalives were good signals in a row).
    h.report("msr_1");
    assert_eq!(h.health("lo@msr_1"), Some(Health::Healthy));
}

#[tokio::test(start_paused = true)]
async fn a_report_older_than_the_expiry_is_stale_and_a_fresh_one_recovers() {
    let mut h = healthy();
    h.subscription("msr_1", SubscriptionState::Active, 30);
    h.run_until(Duration::from_secs(30));
    assert_eq!(h.health("lo@msr_1"), Some(Health::Healthy));
    h.run_until(Duration::from_secs(31));
    let at = h
        .first_change_to("lo@msr_1", Health::Stale, Duration::ZERO)
        .expect("stale");
    assert!(at > Duration::from_secs(30) && at <= Duration::from_millis(30_001));
    h.report("msr_1");
    assert_eq!(h.health("lo@msr_1"), Some(Health::Healthy));
}

#[tokio::test(start_paused = true)]
async fn a_failed_subscription_is_unreachable_until_two_good_signals() {
    let mut h = healthy();
    h.run_until(Duration::from_secs(3));
    h.subscription("msr_1", SubscriptionState::Failed, 60);
    assert_eq!(h.health("lo@msr_1"), Some(Health::Unreachable));
    assert_eq!(
        h.changes.last().map(|c| c.cause),
        Some(Cause::SubscriptionFailed)
    );
    // Re-subscribing: pending, then the NOTIFY of the new dialog.
    h.subscription("msr_1", SubscriptionState::Pending, 60);
    assert_eq!(h.health("lo@msr_1"), Some(Health::Unreachable));
    h.subscription("msr_1", SubscriptionState::Active, 60);
    h.report("msr_1");
    assert_eq!(h.health("lo@msr_1"), Some(Health::Healthy));
}

#[tokio::test(start_paused = true)]
async fn keepalives_stop_with_the_binding() {
    let mut h = healthy();
    h.agent = Agent::Silent;
    let first = next_probe(&h);
    h.run_until(first + SECOND);
    assert_eq!(h.monitor.probes_in_flight(), 1);
    let id = *h.monitor.in_flight.keys().next().expect("in flight");
    h.monitor.contact_removed(h.now, "lo@msr_1");
    assert_eq!(h.monitor.probes_in_flight(), 0);
    assert_eq!(h.monitor.poll_timeout(), None);
    assert!(h.health("lo@msr_1").is_none());
    let sent = h.probes.len();
    h.run_until(Duration::from_secs(120));
    assert_eq!(h.probes.len(), sent);
    // The answer of the forgotten probe changes nothing.
    h.monitor.handle_response(h.now, id, &StatusCode::OK);
    h.monitor.handle_failure(h.now, id);
    h.drain();
    assert!(h.monitor.msrs.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_new_uri_forgets_the_old_misses_and_probes_at_once() {
    let mut h = healthy();
    h.agent = Agent::Silent;
    h.run_until(Duration::from_secs(30));
    assert_eq!(h.health("lo@msr_1"), Some(Health::Unreachable));
    // The agent restarted on another port.
    h.agent = Agent::Answers;
    let sent = h.probes.len();
    h.monitor.contact_registered(
        h.now,
        &ContactName::test("lo@msr_1"),
        &MsrName::test("msr_1"),
        "sip:msr_1@127.0.0.1:5099",
    );
    h.drain();
    assert_eq!(h.probes.len(), sent + 1);
    // One good signal: not yet healthy; its first NOTIFY is the second.
    assert_eq!(h.health("lo@msr_1"), Some(Health::Unreachable));
    h.report("msr_1");
    assert_eq!(h.health("lo@msr_1"), Some(Health::Healthy));
}

#[tokio::test(start_paused = true)]
async fn flapping_is_logged_at_most_four_times_a_minute_then_counted() {
    let mut h = healthy();
    // Silent → unreachable, then a report and an answer → healthy, and so
    // on, ten times within one minute.
    for _ in 0..10 {
        h.agent = Agent::Silent;
        let at = h.now - h.t0;
        h.run_until(at + 4 * SECOND + SECOND / 2);
        h.subscription("msr_1", SubscriptionState::Failed, 60);
        h.agent = Agent::Answers;
        h.subscription("msr_1", SubscriptionState::Active, 60);
        h.report("msr_1");
    }
    let changes: Vec<HealthChange> = h
        .changes
        .iter()
        .filter(|c| c.from.is_some())
        .cloned()
        .collect();
    assert!(changes.len() >= 10, "{changes:?}");
    let logged = changes.iter().filter(|c| c.log).count();
    assert_eq!(logged, LOGGED_CHANGES_PER_WINDOW as usize);
    assert!(h.suppressed.is_empty());
    // The window closes: one line with the count and the health then.
    h.run_until(Duration::from_secs(120));
    assert_eq!(
        h.suppressed,
        vec![(
            "lo@msr_1".to_owned(),
            u32::try_from(changes.len()).expect("small") - LOGGED_CHANGES_PER_WINDOW,
            Health::Healthy
        )]
    );
}

#[tokio::test(start_paused = true)]
async fn first_probes_of_a_thousand_contacts_are_spread_over_the_interval() {
    let mut h = Harness::new(HealthConfig::default());
    for i in 0..1000 {
        h.register(&format!("lo@msr_{i}"));
    }
    h.run_until(Duration::from_millis(4999));
    assert_eq!(h.probes.len(), 1000);
    let mut per_second = [0_u32; 5];
    for (at, _) in &h.probes {
        per_second[usize::try_from(at.as_secs()).expect("small")] += 1;
    }
    assert!(
        per_second.iter().all(|n| (150..=250).contains(n)),
        "{per_second:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_refresh_keeps_the_health_and_a_moved_contact_starts_again() {
    let mut h = healthy();
    h.agent = Agent::Silent;
    h.run_until(Duration::from_secs(30));
    h.register("lo@msr_1");
    assert_eq!(h.health("lo@msr_1"), Some(Health::Unreachable));
    h.monitor.contact_registered(
        h.now,
        &ContactName::test("lo@msr_1"),
        &MsrName::test("msr_2"),
        "sip:msr_2@127.0.0.1:5070",
    );
    h.drain();
    assert_eq!(h.health("lo@msr_1"), Some(Health::Healthy));
    assert!(!h.monitor.msrs.contains_key("msr_1"));
}

/// A keepalive counted as missed is given up on, so that its transaction
/// stops: toward a silent agent at most one keepalive is ever in flight.
#[tokio::test(start_paused = true)]
async fn toward_a_silent_agent_every_missed_keepalive_is_abandoned_before_the_next() {
    let mut h = healthy();
    h.run_until(Duration::from_secs(10));
    while h.monitor.poll_abandoned().is_some() {}
    h.agent = Agent::Silent;
    let mut sent = Vec::new();
    let mut abandoned = Vec::new();
    let end = h.t0 + Duration::from_secs(120);
    while let Some(at) = h.monitor.poll_timeout().filter(|at| *at <= end) {
        h.now = at;
        h.monitor.handle_timeout(at);
        while let Some(id) = h.monitor.poll_abandoned() {
            abandoned.push(id);
        }
        while let Some(probe) = h.monitor.poll_transmit() {
            // The one before it was given up on first.
            assert_eq!(sent.len(), abandoned.len(), "one in flight at a time");
            sent.push(probe.id);
        }
        while h.monitor.poll_event().is_some() {}
        assert!(h.monitor.probes_in_flight() <= 1);
    }
    assert!(sent.len() >= 20, "probed every interval: {}", sent.len());
    assert_eq!(&abandoned[..], &sent[..abandoned.len()]);
}

/// RFC 6665 §4.1.3: after `rejected` or `noresource` no report comes until
/// the MSR registers again: the contact is unreachable at once, not
/// healthy until its last report goes stale; `timeout` is transient.
#[tokio::test(start_paused = true)]
async fn a_subscription_ended_for_good_makes_the_contact_unreachable() {
    for (reason, expected) in [
        (TerminationReason::Rejected, Health::Unreachable),
        (TerminationReason::Noresource, Health::Unreachable),
        (TerminationReason::Timeout, Health::Healthy),
        (TerminationReason::Deactivated, Health::Healthy),
    ] {
        let mut h = healthy();
        h.run_until(Duration::from_secs(3));
        h.subscription(
            "msr_1",
            SubscriptionState::Terminated(Some(reason.clone())),
            60,
        );
        assert_eq!(h.health("lo@msr_1"), Some(expected), "{reason}");
        if expected == Health::Unreachable {
            let change = h.changes.last().expect("change");
            assert_eq!(change.cause, Cause::SubscriptionEnded);
            // A new subscription that reports brings it back.
            h.subscription("msr_1", SubscriptionState::Active, 60);
            h.report("msr_1");
            h.run_until(Duration::from_secs(20));
            assert_eq!(h.health("lo@msr_1"), Some(Health::Healthy), "{reason}");
        }
    }
}

#[test]
fn options_request_is_an_out_of_dialog_options() {
    let request = options_request("sip:msr_1@127.0.0.1:5070", "sip:collector@127.0.0.1:5060")
        .expect("request");
    assert_eq!(request.method, Method::Options);
    assert_eq!(request.uri.to_string(), "sip:msr_1@127.0.0.1:5070");
    let to = sip::header(&request.headers, "To").expect("to");
    assert!(sip::tag(to).is_none());
    assert!(sip::header(&request.headers, "From")
        .and_then(sip::tag)
        .is_some());
    assert_eq!(sip::cseq(&request.headers), Some((1, "OPTIONS".to_owned())));
}

impl Harness {
    fn report_engine(&mut self, msr: &str, engine: EngineState, service: Service) {
        self.monitor.report_received(self.now, msr, engine, service);
        self.drain();
    }

    fn failure(&mut self, msr: &str, cause: FailureCause) -> bool {
        let tripped = self.monitor.core_failure(self.now, msr, cause);
        self.drain();
        tripped
    }
}

#[tokio::test(start_paused = true)]
async fn an_engine_reported_down_is_engine_down_at_once_and_healthy_after_it_is_reported_up() {
    let mut h = healthy();
    h.run_until(Duration::from_secs(7));
    h.report_engine("msr_1", EngineState::Down, Service::Active);
    assert_eq!(h.health("lo@msr_1"), Some(Health::EngineDown));
    let change = h.changes.last().expect("change");
    assert_eq!(change.cause, Cause::EngineReportedDown);
    // The agent keeps answering: its keepalives do not bring it back.
    h.run_until(Duration::from_secs(40));
    assert_eq!(h.health("lo@msr_1"), Some(Health::EngineDown));
    // Reported up: the report and the keepalive it sends at once.
    h.report_engine("msr_1", EngineState::Up, Service::Active);
    assert_eq!(h.health("lo@msr_1"), Some(Health::Healthy));
    assert_eq!(h.changes.last().expect("change").cause, Cause::Recovered);
}

#[tokio::test(start_paused = true)]
async fn the_first_timeout_trips_three_errors_in_ten_seconds_trip_and_a_busy_counts_nothing() {
    let mut h = healthy();
    h.run_until(Duration::from_secs(1));
    for _ in 0..10 {
        assert!(!h.failure("msr_1", FailureCause::NotTheMsr(486)));
    }
    assert!(!h.failure("msr_1", FailureCause::ServerError(503)));
    h.run_until(Duration::from_secs(12));
    assert!(!h.failure("msr_1", FailureCause::ServerError(503)));
    assert!(!h.failure("msr_1", FailureCause::LoadLimit));
    assert_eq!(
        h.health("lo@msr_1"),
        Some(Health::Healthy),
        "the first 503 left the window"
    );
    assert!(h.failure("msr_1", FailureCause::EngineError));
    assert_eq!(h.health("lo@msr_1"), Some(Health::EngineDown));
    assert_eq!(h.changes.last().expect("change").cause, Cause::CoreErrors);

    let mut h = healthy();
    h.run_until(Duration::from_secs(1));
    assert!(h.failure("msr_1", FailureCause::Timeout));
    assert_eq!(h.health("lo@msr_1"), Some(Health::EngineDown));
    assert_eq!(h.changes.last().expect("change").cause, Cause::CoreTimeouts);
    assert!(!h.failure("msr_1", FailureCause::Timeout), "already out");
}

#[tokio::test(start_paused = true)]
async fn a_tripped_msr_stays_out_for_its_hold_and_a_second_trip_soon_after_doubles_it() {
    let mut h = healthy();
    h.run_until(Duration::from_secs(1));
    assert!(h.failure("msr_1", FailureCause::Timeout));
    let tripped = h.now - h.t0;
    let mut step = 1;
    while h.health("lo@msr_1") != Some(Health::Healthy) && step < 40 {
        step += 1;
        h.run_until(Duration::from_secs(step));
    }
    let back = h
        .first_change_to("lo@msr_1", Health::Healthy, tripped)
        .expect("back after the hold");
    // The hold (10 s), then the keepalives' two good signals (5 s apart).
    assert!(back - tripped >= 10 * SECOND, "{back:?}");
    assert!(back - tripped <= 20 * SECOND, "{back:?}");
    // Tripped again right after its return: the hold doubles.
    assert!(h.failure("msr_1", FailureCause::Timeout));
    let again = h.now - h.t0;
    assert_eq!(
        h.monitor.tripped_until("msr_1").map(|at| at - h.t0),
        Some(again + 20 * SECOND)
    );
    h.run_until(again + 19 * SECOND);
    assert_eq!(h.health("lo@msr_1"), Some(Health::EngineDown));
    // An engine reported down and up again ends the trip at once.
    h.report_engine("msr_1", EngineState::Down, Service::Active);
    h.report_engine("msr_1", EngineState::Up, Service::Active);
    assert_eq!(h.monitor.tripped_until("msr_1"), None);
    assert_eq!(h.health("lo@msr_1"), Some(Health::Healthy));
}

#[tokio::test(start_paused = true)]
async fn a_draining_msr_is_draining_until_it_reports_active() {
    let mut h = healthy();
    h.run_until(Duration::from_secs(3));
    h.report_engine("msr_1", EngineState::Up, Service::Draining);
    assert_eq!(h.health("lo@msr_1"), Some(Health::Draining));
    h.run_until(Duration::from_secs(30));
    assert_eq!(h.health("lo@msr_1"), Some(Health::Draining));
    h.report_engine("msr_1", EngineState::Up, Service::Active);
    assert_eq!(h.health("lo@msr_1"), Some(Health::Healthy));
}

#[test]
fn failure_causes_are_read_from_their_wire_spellings() {
    assert_eq!(FailureCause::parse("timeout"), Some(FailureCause::Timeout));
    assert_eq!(FailureCause::parse("408"), Some(FailureCause::Timeout));
    assert_eq!(
        FailureCause::parse("503"),
        Some(FailureCause::ServerError(503))
    );
    assert_eq!(
        FailureCause::parse("486"),
        Some(FailureCause::NotTheMsr(486))
    );
    assert_eq!(
        FailureCause::parse("load-limit"),
        Some(FailureCause::LoadLimit)
    );
    assert_eq!(
        FailureCause::parse("error"),
        Some(FailureCause::EngineError)
    );
    for bad in ["", "200", "999", "soon", "5033"] {
        assert_eq!(FailureCause::parse(bad), None, "{bad}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_load_limit_or_503_near_the_top_is_the_msr_full() {
    for (cause, calls, max, expected) in [
        (
            FailureCause::LoadLimit,
            80,
            100,
            FailureCause::FullNearTop(0),
        ),
        (FailureCause::LoadLimit, 79, 100, FailureCause::LoadLimit),
        (
            FailureCause::ServerError(503),
            20,
            20,
            FailureCause::FullNearTop(503),
        ),
        (
            FailureCause::ServerError(500),
            20,
            20,
            FailureCause::ServerError(500),
        ),
        (FailureCause::Timeout, 20, 20, FailureCause::Timeout),
        (FailureCause::EngineError, 20, 20, FailureCause::EngineError),
        // No capacity reported: nothing is near the top.
        (FailureCause::LoadLimit, 0, 0, FailureCause::LoadLimit),
    ] {
        assert_eq!(
            cause.near_top(calls, max),
            expected,
            "{cause} at {calls}/{max}"
        );
    }
    assert_eq!(FailureCause::FullNearTop(0).to_string(), "load-limit");
    assert_eq!(FailureCause::FullNearTop(503).to_string(), "503");
    assert_eq!(FailureCause::FullNearTop(0).label(), "full_near_top");
    let mut h = healthy();
    for _ in 0..5 {
        assert!(!h.failure("msr_1", FailureCause::FullNearTop(0)));
    }
    assert_eq!(h.health("lo@msr_1"), Some(Health::Healthy));
}
