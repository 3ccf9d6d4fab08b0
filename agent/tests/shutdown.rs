//! The agent's shutdown order (SPEC §3, §4) against an in-process stand-in
//! for the collector: one `SipEndpoint` that is both the registrar and the
//! subscriber, as the collector is.
//!
//! A registrar that handles the `Expires: 0` REGISTER before the final
//! `deactivated` NOTIFY ends the subscription and answers the NOTIFY 481.
//! So the agent must send the final NOTIFYs first, wait until they are
//! answered (at most `FINAL_NOTIFY_GRACE`), and only then unregister.
//!
//! These tests run over loopback UDP in real time: the agent's shell and
//! `SipEndpoint`'s transactions are what is under test.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use msr_agent::notifier::FINAL_NOTIFY_GRACE;
use msr_agent::{AgentHandle, SHUTDOWN_GRACE};
use msr_shared::event_package::{CONTENT_TYPE, EVENT};
use msr_shared::sip::{
    self, Method, Request, ServerTransaction, SipEndpoint, SipEvent, StatusCode, SubState,
    SubscriptionStateHeader, TerminationReason,
};
use tokio::time::{sleep_until, timeout, Instant};
use tokio_util::sync::CancellationToken;

/// Upper bound for any single step of the setup.
const STEP: Duration = Duration::from_secs(10);

fn config_xml(realm: SocketAddr) -> String {
    format!(
        r#"<?xml version="1.0" encoding="utf-8"?>
<config>
    <general max-calls="100" load-sensor="calls" load-delta="5"/>
    <transport bind-addr="127.0.0.1" port="0" transport="udp"/>
    <media port-start="20000" port-range="1000"/>
    <accounts><dynamic msr_name="msr_1" realm="sip:{realm}" auth_name="msr" auth_password="secret" dtmf_mode="rfc"/></accounts>
    <agent register-expires="60" calls-source="fixed:7" sample-interval-ms="200"/>
</config>
"#
    )
}

/// The collector stand-in.
struct Collector {
    endpoint: SipEndpoint,
    _cancel: CancellationToken,
    next_id: u64,
}

/// What the stand-in saw after the agent was told to stop.
#[derive(Debug, Default)]
struct Seen {
    /// When the final NOTIFY arrived.
    final_notify: Option<Instant>,
    /// When the stand-in answered it.
    final_answered: Option<Instant>,
    /// When the `Expires: 0` REGISTER arrived.
    unregister: Option<Instant>,
}

fn is_unregister(r: &Request) -> bool {
    r.method == Method::Register && sip::expires(&r.headers) == Some(0)
}

fn substate(r: &Request) -> Option<SubscriptionStateHeader> {
    sip::header(&r.headers, "Subscription-State").and_then(SubscriptionStateHeader::parse)
}

impl Collector {
    async fn bind() -> Collector {
        let cancel = CancellationToken::new();
        let endpoint = SipEndpoint::bind(
            "127.0.0.1:0".parse().expect("addr"),
            false,
            "test-collector",
            "NOTIFY",
            cancel.clone(),
        )
        .await
        .expect("bind the collector stand-in");
        Collector {
            endpoint,
            _cancel: cancel,
            next_id: 1,
        }
    }

    async fn recv(&mut self) -> SipEvent {
        self.endpoint.recv().await.expect("endpoint open")
    }

    /// Answers the agent's first REGISTER with 200 (no challenge).
    async fn accept_registration(&mut self) {
        loop {
            if let SipEvent::Request(tx) = self.recv().await {
                let request = tx.request().clone();
                let mut response = sip::response(&request, StatusCode::OK, Some("reg"));
                if request.method == Method::Register {
                    assert_ne!(sip::expires(&request.headers), Some(0));
                    sip::push_header(&mut response.headers, "Expires", "60");
                    tx.respond(response).await;
                    return;
                }
                tx.respond(response).await;
            }
        }
    }

    /// Subscribes to msr_1 at `agent`; returns once the SUBSCRIBE got its
    /// 200 and the first NOTIFY (active) was answered.
    async fn subscribe(&mut self, agent: SocketAddr) {
        let me = self.endpoint.local_addr();
        let target = format!("sip:msr_1@{agent}");
        let request = sip::request(
            Method::Subscribe,
            &target,
            vec![
                ("From", format!("<sip:core@{me}>;tag=sub")),
                ("To", format!("<{target}>")),
                ("Call-ID", format!("{}@test", sip::random_token())),
                ("CSeq", "1 SUBSCRIBE".to_owned()),
                ("Contact", format!("<sip:core@{me}>")),
                ("Event", EVENT.to_owned()),
                ("Accept", CONTENT_TYPE.to_owned()),
                ("Expires", "60".to_owned()),
            ],
            Vec::new(),
        )
        .expect("subscribe");
        let id = self.next_id;
        self.next_id += 1;
        self.endpoint.send_request(id, request).expect("send");
        let (mut answered, mut notified) = (false, false);
        while !(answered && notified) {
            match self.recv().await {
                SipEvent::Response { id: got, response } if got == id => {
                    assert_eq!(response.status_code, StatusCode::OK);
                    answered = true;
                }
                SipEvent::Request(tx) => {
                    let request = tx.request().clone();
                    if request.method == Method::Notify {
                        let state = substate(&request).expect("subscription-state");
                        assert_eq!(state.state, SubState::Active);
                        notified = true;
                    }
                    tx.respond(sip::response(&request, StatusCode::OK, None))
                        .await;
                }
                other => panic!("unexpected event while subscribing: {other:?}"),
            }
        }
    }

    /// After the agent was told to stop: holds the answer to the final
    /// NOTIFY for `hold` (for ever when `None`), answers everything else at
    /// once, and returns when the unregister has come and (with `hold`)
    /// the held answer was sent, or after `limit`.
    async fn watch_shutdown(&mut self, hold: Option<Duration>, limit: Duration) -> Seen {
        let end = Instant::now() + limit;
        let mut seen = Seen::default();
        let mut held: Option<(Box<ServerTransaction>, Instant)> = None;
        while seen.unregister.is_none() || (hold.is_some() && seen.final_answered.is_none()) {
            let release = held.as_ref().map(|(_, at)| *at);
            tokio::select! {
                () = sleep_until(end) => break,
                () = sleep_until(release.unwrap_or(end)), if release.is_some() => {
                    if let Some((tx, _)) = held.take() {
                        let request = tx.request().clone();
                        tx.respond(sip::response(&request, StatusCode::OK, None)).await;
                        seen.final_answered = Some(Instant::now());
                    }
                }
                event = self.endpoint.recv() => {
                    let Some(SipEvent::Request(tx)) = event else { continue };
                    let now = Instant::now();
                    let request = tx.request().clone();
                    let terminated = request.method == Method::Notify
                        && substate(&request).is_some_and(|s| {
                            s.state == SubState::Terminated
                                && s.reason == Some(TerminationReason::Deactivated)
                        });
                    if terminated && seen.final_notify.is_none() {
                        seen.final_notify = Some(now);
                        // Hold the answer; a held transaction for ever when
                        // `hold` is `None` (released at `end`).
                        held = Some((tx, now + hold.unwrap_or(limit * 2)));
                        continue;
                    }
                    if is_unregister(&request) {
                        seen.unregister = Some(now);
                    }
                    let mut response = sip::response(&request, StatusCode::OK, Some("x"));
                    if request.method == Method::Register {
                        sip::push_header(&mut response.headers, "Expires", "0");
                    }
                    tx.respond(response).await;
                }
            }
        }
        seen
    }
}

/// The agent registered with `collector` and subscribed to by it.
async fn agent_registered_and_subscribed(
    collector: &mut Collector,
) -> (AgentHandle, CancellationToken) {
    let text = config_xml(collector.endpoint.local_addr());
    let config = msr_agent::config::parse(&text, Path::new("test.xml")).expect("valid config");
    let shutdown = CancellationToken::new();
    let agent = msr_agent::start(config, None, shutdown.clone())
        .await
        .expect("agent starts");
    timeout(STEP, collector.accept_registration())
        .await
        .expect("agent registers");
    timeout(STEP, collector.subscribe(agent.local_addr))
        .await
        .expect("subscription set up");
    (agent, shutdown)
}

async fn join(agent: AgentHandle, limit: Duration) {
    let result = timeout(limit, agent.join)
        .await
        .expect("agent stops in time")
        .expect("agent task");
    result.expect("agent ends cleanly");
}

/// The unregister leaves only after the final NOTIFY is answered: the
/// stand-in holds its answer for 600 ms (longer than the NOTIFY's first
/// retransmission interval) and no REGISTER `Expires: 0` may come meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn final_notify_is_answered_before_the_unregister_leaves() {
    let mut collector = Collector::bind().await;
    let (agent, shutdown) = agent_registered_and_subscribed(&mut collector).await;

    let hold = Duration::from_millis(600);
    shutdown.cancel();
    let seen = collector
        .watch_shutdown(Some(hold), FINAL_NOTIFY_GRACE + SHUTDOWN_GRACE)
        .await;
    let final_notify = seen.final_notify.expect("final deactivated notify");
    let answered = seen.final_answered.expect("final notify answered");
    let unregister = seen.unregister.expect("unregister");
    assert!(
        answered >= final_notify + hold,
        "the answer was held: {seen:?}"
    );
    assert!(
        unregister >= answered,
        "the unregister came only after the final notify was answered: {seen:?}"
    );
    join(agent, SHUTDOWN_GRACE + Duration::from_secs(1)).await;
}

/// A final NOTIFY that is never answered holds the unregister back at most
/// `FINAL_NOTIFY_GRACE`; the whole shutdown stays within
/// `FINAL_NOTIFY_GRACE + SHUTDOWN_GRACE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_final_notify_delays_the_unregister_at_most_the_grace_period() {
    let mut collector = Collector::bind().await;
    let (agent, shutdown) = agent_registered_and_subscribed(&mut collector).await;

    let stopped = Instant::now();
    shutdown.cancel();
    let seen = collector
        .watch_shutdown(None, FINAL_NOTIFY_GRACE + SHUTDOWN_GRACE)
        .await;
    assert!(seen.final_notify.is_some(), "final notify sent: {seen:?}");
    assert!(seen.final_answered.is_none());
    let unregister = seen.unregister.expect("unregister after the grace period");
    let waited = unregister - stopped;
    assert!(
        waited >= FINAL_NOTIFY_GRACE - Duration::from_millis(50)
            && waited < FINAL_NOTIFY_GRACE + Duration::from_secs(1),
        "unregister {waited:?} after the stop"
    );
    join(agent, SHUTDOWN_GRACE + Duration::from_secs(1)).await;
}
