//! An in-memory two-party harness in virtual time (quinn-proto's test
//! `Pair`): one MSR agent's sans-IO cores — its [`Notifier`] and the
//! [`Registration`] of its one account — and one collector's — its
//! [`Registrar`] and [`Subscriber`] — joined by a simulated UDP link, with a
//! clock that jumps from one deadline to the next.
//!
//! Every message is the SIP message the cores build, sent as the daemons'
//! endpoint sends it (a top `Via` with a fresh branch and `rport`,
//! `Max-Forwards: 70`), printed to text and parsed back by rsipstack at the
//! receiving side (with `received`/`rport` stamped on the `Via`, as the
//! real transport does). Nothing touches a socket or the wall clock: the
//! harness holds `now` and hands it to every core.
//!
//! Driving ([`Pair::advance`]): at each step the clock jumps to the
//! earliest of every party's `poll_timeout()`, the agent's next load
//! sample and the next message or transaction timer due, then everything
//! due at that instant runs until the parties are idle (every queue
//! drained, nothing due). [`Pair::run_for`] and [`Pair::run_until`] bound
//! a run in virtual time, so a test that asserts that nothing happened
//! asserts it about every event up to that instant — not about how long a
//! process happened to sleep.
//!
//! What the shells and the transport add, modelled here explicitly:
//!
//! * **Link** ([`Pair::set_link`]): each message, request or response,
//!   meets a [`Fate`] chosen by a test-supplied function: delivered after
//!   [`PairConfig::latency`] (the default), delayed further, dropped, or
//!   failed at the sender. A *drop* stands for the loss of the message and
//!   of every retransmission of it (a peer that is unreachable or down); a
//!   single lost datagram that a retransmission repairs is a *delay*.
//! * **Client transactions** (rsipstack's, RFC 3261 §17.1.2): a request
//!   that gets no final response within [`TIMER_F`] (64 × T1) ends with a
//!   locally generated `408`, handed to the sender's `handle_response` —
//!   what `SipEndpoint` reports for Timer F. [`Fate::Fail`] is the
//!   endpoint's `SipEvent::Failed` (a send error): the sender's
//!   `handle_failure` at once. A response that arrives after its
//!   transaction ended is ignored, as the transaction layer does.
//! * **Sources**: the agent takes a SUBSCRIBE's source from the socket
//!   ([`COLLECTOR_ADDR`]); the collector takes a REGISTER's and a NOTIFY's
//!   from the datagram too ([`AGENT_ADDR`], which the agent's `Via` names
//!   as well, so `received`/`rport` agree).
//! * **The agent's shell** (`agent/src/shell.rs`): the load sampler, every
//!   [`PairConfig::sample_interval`], feeds [`Pair::set_calls`]'s value to
//!   `Notifier::on_sample`; SIGTERM ([`Pair::stop_agent`]) is its two-step
//!   shutdown: the `deactivated` NOTIFYs, waited for until answered (at
//!   most `FINAL_NOTIFY_GRACE`), then `Expires: 0`, waited for at most
//!   [`SHUTDOWN_GRACE`]; `kill -9` ([`Pair::kill_agent`]) drops the cores
//!   with nothing sent; a restart ([`Pair::start_agent`]) builds new cores
//!   (a new Call-ID, no dialogs).
//! * **The collector's shell** (`collector/src/shell.rs`, `settle`): each
//!   registrar event hands the MSR's registered contacts to the
//!   subscriber, a re-registration with a new Call-ID first restarts the
//!   subscription ([`CollectorSide::settle`]; the calls whose signatures
//!   follow the collector's shapes are in [`adapter`]).
//!
//! Not modelled: the collector's health keepalives (OPTIONS), its load
//! table and selection, the operator's settings, account changes by a
//! reload of the agent, and the collector's own restart and shutdown —
//! the system tests in `tests/it/` run those with the real binaries.
//!
//! Addresses are fixed: the collector is [`COLLECTOR_ADDR`], the agent
//! [`AGENT_ADDR`], on different hosts so that the agent's subscriber-host
//! check and the collector's NOTIFY-source check both see real values.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use msr_agent::config::LoadSensor;
use msr_agent::load::{compute_load, Sample};
use msr_agent::notifier::{Notifier, NotifierConfig, SubscriptionId};
use msr_agent::registration::{Registration, RegistrationConfig, RegistrationState};
use msr_agent::SHUTDOWN_GRACE;
use msr_collector::registrar::{Registrar, RegistrarEvent};
use msr_collector::subscriber::{Subscriber, SubscriberConfig, SubscriberEvent};
use msr_shared::event_package::LoadReport;
use msr_shared::sip::{self, Method, Request, Response, SipMessage, StatusCode};
use msr_shared::subscription::SubscriptionState;
use tokio::time::Instant;

use crate::system::{self, AccountSpec, AgentSpec};

/// The collector's SIP address (its `[sip] listen`).
pub const COLLECTOR_ADDR: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 5060);
/// The agent's SIP address (`bind-addr`, `sip-port`).
pub const AGENT_ADDR: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)), 5070);
/// Timer F (RFC 3261 §17.1.2.2): 64 × T1 with T1 = 500 ms; a client
/// transaction without a final response by then ends with a local 408.
pub const TIMER_F: Duration = Duration::from_secs(32);
/// The unix time at the harness's start (the collector shows it as the
/// time of the last NOTIFY).
const UNIX_START: i64 = 1_700_000_000;
/// Steps at one instant before the harness declares a livelock (a core
/// whose deadline stays in the past without anything happening).
const MAX_STEPS_PER_INSTANT: usize = 10_000;

/// The two sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Party {
    /// The MSR agent.
    Agent,
    /// The collector.
    Collector,
}

impl Party {
    fn addr(self) -> SocketAddr {
        match self {
            Party::Agent => AGENT_ADDR,
            Party::Collector => COLLECTOR_ADDR,
        }
    }

    fn peer(self) -> Party {
        match self {
            Party::Agent => Party::Collector,
            Party::Collector => Party::Agent,
        }
    }
}

/// What the link does with one message (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Delivered after [`PairConfig::latency`].
    Deliver,
    /// Delivered after the latency plus this.
    Delay(Duration),
    /// Lost with every retransmission: a request's sender sees Timer F.
    Drop,
    /// The sender's endpoint reports a transport failure at once (a
    /// request only; for a response it is a drop).
    Fail,
}

/// One message as the link sees it.
#[derive(Debug, Clone)]
pub struct Packet {
    /// When it was sent, since the start.
    pub at: Duration,
    /// Who sent it.
    pub from: Party,
    /// The message as it left the sender's endpoint.
    pub message: SipMessage,
    /// What the link did with it.
    pub fate: Fate,
}

impl Packet {
    /// The request's method (`None` for a response).
    pub fn method(&self) -> Option<&Method> {
        match &self.message {
            SipMessage::Request(r) => Some(&r.method),
            SipMessage::Response(_) => None,
        }
    }

    /// Whether this is a request with `method` sent by `from`.
    pub fn is(&self, from: Party, method: Method) -> bool {
        self.from == from && self.method() == Some(&method)
    }

    /// The response's status code (`None` for a request).
    pub fn status(&self) -> Option<u16> {
        match &self.message {
            SipMessage::Response(r) => Some(r.status_code.code()),
            SipMessage::Request(_) => None,
        }
    }

    /// The method a response answers (its `CSeq`), or a request's own.
    pub fn cseq_method(&self) -> Option<String> {
        sip::cseq(self.headers()).map(|(_, m)| m)
    }

    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        sip::header(self.headers(), name)
    }

    /// The `Call-ID`.
    pub fn call_id(&self) -> &str {
        sip::call_id(self.headers()).unwrap_or_default()
    }

    fn headers(&self) -> &sip::Headers {
        match &self.message {
            SipMessage::Request(r) => &r.headers,
            SipMessage::Response(r) => &r.headers,
        }
    }
}

impl fmt::Display for Packet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match &self.message {
            SipMessage::Request(r) => format!("{} {}", r.method, r.uri),
            SipMessage::Response(r) => format!(
                "{} ({})",
                r.status_code.code(),
                self.cseq_method().unwrap_or_default()
            ),
        };
        write!(
            f,
            "{:>9.3}s {:?} {what} call-id={} {:?}",
            self.at.as_secs_f64(),
            self.from,
            self.call_id(),
            self.fate
        )?;
        for name in ["Expires", "Subscription-State"] {
            if let Some(v) = self.header(name) {
                write!(f, " {name}: {v}")?;
            }
        }
        Ok(())
    }
}

/// The knobs of a pair, with the daemons' defaults except where a test
/// suite wants short periods.
#[derive(Debug, Clone)]
pub struct PairConfig {
    /// The agent's one account (`msr_name`).
    pub msr: String,
    /// `<agent register-expires>`.
    pub register_expires: u32,
    /// `<general load-delta>`.
    pub load_delta: u8,
    /// `<agent notify-high-water>`.
    pub high_water: u8,
    /// `<agent notify-min-interval-ms>`.
    pub notify_min_interval: Duration,
    /// `<agent max-subscription-expires>`.
    pub max_subscription_expires: u32,
    /// `<agent sample-interval-ms>`.
    pub sample_interval: Duration,
    /// `<general max-calls>`.
    pub max_calls: u32,
    /// The agent's `auth_password` (the collector's is `msr-secret`).
    pub password: String,
    /// The collector's `[subscription] expires`.
    pub subscription_expires: u32,
    /// The collector's `[sip] min_expires`.
    pub min_expires: u32,
    /// One-way delay of every delivered message.
    pub latency: Duration,
}

impl Default for PairConfig {
    fn default() -> Self {
        Self {
            msr: "msr_1".into(),
            register_expires: 60,
            load_delta: 5,
            high_water: msr_agent::notifier::DEFAULT_HIGH_WATER,
            notify_min_interval: Duration::from_millis(1000),
            max_subscription_expires: 3600,
            sample_interval: Duration::from_millis(200),
            max_calls: 100,
            password: "msr-secret".into(),
            subscription_expires: 60,
            min_expires: 2,
            latency: Duration::from_millis(1),
        }
    }
}

/// The agent's shell state around its cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AgentPhase {
    Running,
    /// SIGTERM step 1: waiting for the final NOTIFYs.
    Finals,
    /// SIGTERM step 2: waiting for the unregister, at most until then.
    Unregistering(Instant),
}

/// The agent's cores and what its shell keeps.
#[derive(Debug)]
pub struct AgentSide {
    /// The notifier core.
    pub notifier: Notifier,
    /// The registration client of the account.
    pub registration: Registration,
    /// The notifier's config as last applied ([`Pair::reconfigure_agent`]).
    pub notifier_config: NotifierConfig,
    /// Which run of the agent this is (a restart counts up); requests of
    /// an earlier run get no answer.
    incarnation: u64,
    phase: AgentPhase,
    next_sample: Instant,
}

/// The collector's cores and what happened to them.
#[derive(Debug)]
pub struct CollectorSide {
    /// The registrar core.
    pub registrar: Registrar,
    /// The subscriber core.
    pub subscriber: Subscriber,
    /// Every registrar event, with its time since the start.
    pub registrar_events: Vec<(Duration, RegistrarEvent)>,
    /// Every subscriber event, with its time since the start.
    pub events: Vec<(Duration, SubscriberEvent)>,
}

/// Who sent a request and what to tell when its transaction ends.
#[derive(Debug, Clone)]
enum Origin {
    /// A REGISTER of the agent run `incarnation`.
    Register { incarnation: u64 },
    /// A NOTIFY of the agent run `incarnation`.
    Notify {
        incarnation: u64,
        subscription: SubscriptionId,
        cseq: u32,
    },
    /// A SUBSCRIBE with the subscriber's request id.
    Subscribe(u64),
}

#[derive(Debug)]
struct ClientTransaction {
    origin: Origin,
    /// The request as sent (for the local 408).
    request: Request,
}

#[derive(Debug)]
enum Due {
    /// A request's text arrives at the peer of its transaction's sender.
    Request { txn: u64, to: Party, text: String },
    /// A response's text arrives back at the transaction's sender.
    Response { txn: u64, text: String },
    /// Timer F of a transaction.
    TimerF(u64),
    /// The endpoint reports the request failed.
    Failed(u64),
}

/// The link's policy: a [`Fate`] for each message.
type Link = Box<dyn FnMut(&Packet) -> Fate>;

/// Two parties, a link and a clock (module docs).
pub struct Pair {
    /// The configuration the pair was built with.
    pub config: PairConfig,
    start: Instant,
    now: Instant,
    /// The agent; `None` while it is not running.
    pub agent: Option<AgentSide>,
    /// The collector.
    pub collector: CollectorSide,
    /// What the agent's load sampler reads.
    calls: u32,
    incarnations: u64,
    link: Link,
    /// Every message sent, in order.
    pub trace: Vec<Packet>,
    txns: HashMap<u64, ClientTransaction>,
    next_txn: u64,
    queue: BTreeMap<(Instant, u64), Due>,
    next_seq: u64,
}

impl fmt::Debug for Pair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pair")
            .field("elapsed", &self.elapsed())
            .field("agent", &self.agent)
            .field("collector", &self.collector)
            .finish_non_exhaustive()
    }
}

impl Pair {
    /// A collector and an agent holding `calls` calls; the agent starts at
    /// once (its first REGISTER is due now). Nothing has run yet.
    pub fn new(config: PairConfig, calls: u32) -> Pair {
        let start = Instant::now();
        let collector = CollectorSide::new(&config);
        let mut pair = Pair {
            config,
            start,
            now: start,
            agent: None,
            collector,
            calls,
            incarnations: 0,
            link: Box::new(|_| Fate::Deliver),
            trace: Vec::new(),
            txns: HashMap::new(),
            next_txn: 1,
            queue: BTreeMap::new(),
            next_seq: 0,
        };
        pair.start_agent();
        pair
    }

    /// Virtual time since the start.
    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// The current virtual instant.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Sets the link's policy (module docs); the default delivers all.
    pub fn set_link(&mut self, link: impl FnMut(&Packet) -> Fate + 'static) {
        self.link = Box::new(link);
    }

    /// The media engine now has `calls` calls; the agent's sampler reads
    /// it at its next tick.
    pub fn set_calls(&mut self, calls: u32) {
        self.calls = calls;
    }

    /// The agent's `load` for `calls` (the `calls` load sensor).
    pub fn load_of(&self, calls: u32) -> u8 {
        compute_load(LoadSensor::Calls, 0, calls, self.config.max_calls)
    }

    /// Starts the agent (again, after [`kill_agent`](Self::kill_agent) or
    /// [`stop_agent`](Self::stop_agent) finished): new cores, a new
    /// Call-ID, no dialogs; its first REGISTER is due now.
    pub fn start_agent(&mut self) {
        assert!(self.agent.is_none(), "the agent is running");
        self.incarnations += 1;
        let xml = agent_xml(&self.config);
        let parsed = msr_agent::config::parse(&xml, Path::new("pair.xml"))
            .unwrap_or_else(|e| panic!("the harness's agent config: {e}\n{xml}"));
        let account = parsed
            .accounts
            .first()
            .cloned()
            .unwrap_or_else(|| panic!("the harness's agent config has an account"));
        let registration = Registration::new(
            RegistrationConfig {
                account,
                contact_addr: AGENT_ADDR.ip(),
                contact_port: AGENT_ADDR.port(),
                iface: "lo".into(),
                engine: None,
                expires: parsed.agent.register_expires,
            },
            self.now,
        );
        let notifier_config = NotifierConfig {
            load_delta: parsed.general.load_delta,
            high_water: parsed.agent.notify_high_water,
            notify_min_interval: Duration::from_millis(parsed.agent.notify_min_interval_ms),
            max_expires: parsed.agent.max_subscription_expires,
            contact_host_port: AGENT_ADDR.to_string(),
            accounts: parsed.accounts.iter().map(|a| a.msr_name.clone()).collect(),
            subscribers: BTreeSet::from([COLLECTOR_ADDR.ip()]),
        };
        let notifier = Notifier::new(notifier_config.clone(), self.sample());
        self.agent = Some(AgentSide {
            notifier,
            registration,
            notifier_config,
            incarnation: self.incarnations,
            phase: AgentPhase::Running,
            next_sample: self.now + self.config.sample_interval,
        });
    }

    /// `kill -9`: the agent's cores are gone, nothing more is sent or
    /// answered until [`start_agent`](Self::start_agent).
    pub fn kill_agent(&mut self) {
        self.agent = None;
    }

    /// SIGTERM: the agent's graceful shutdown (module docs) begins now;
    /// the agent is gone ([`agent_running`](Self::agent_running) false)
    /// once it is over.
    pub fn stop_agent(&mut self) {
        if let Some(agent) = self.agent.as_mut() {
            agent.notifier.shutdown(self.now);
            agent.phase = AgentPhase::Finals;
        }
        self.settle();
    }

    /// Whether the agent runs (not killed, not stopped).
    pub fn agent_running(&self) -> bool {
        self.agent.is_some()
    }

    /// Applies `change` to the agent's notifier config, as a config reload
    /// does (`Notifier::reconfigure`).
    pub fn reconfigure_agent(&mut self, change: impl FnOnce(&mut NotifierConfig)) {
        if let Some(agent) = self.agent.as_mut() {
            change(&mut agent.notifier_config);
            agent
                .notifier
                .reconfigure(self.now, agent.notifier_config.clone());
        }
        self.settle();
    }

    /// The agent's registration state, if it runs.
    pub fn registration_state(&self) -> Option<RegistrationState> {
        self.agent.as_ref().map(|a| a.registration.state())
    }

    /// Whether the collector holds a binding of the MSR.
    pub fn is_registered(&self) -> bool {
        self.collector.registrar.is_registered(&self.config.msr)
    }

    /// The collector's subscription state of the MSR (`subscription
    /// list`'s `status`); `None` without a subscription.
    pub fn subscription_status(&self) -> Option<SubscriptionState> {
        adapter::status(&self.collector.subscriber, &self.config.msr)
    }

    /// Every load report the collector took in, with its time.
    pub fn loads(&self) -> Vec<(Duration, LoadReport)> {
        self.collector
            .events
            .iter()
            .filter_map(|(at, e)| match e {
                SubscriberEvent::Load { report, .. } => Some((*at, report.clone())),
                _ => None,
            })
            .collect()
    }

    /// The `load` of the last report the collector took in.
    pub fn last_load(&self) -> Option<u8> {
        self.loads().last().map(|(_, r)| r.load)
    }

    /// The messages sent so far matching `pred`.
    pub fn sent(&self, pred: impl Fn(&Packet) -> bool) -> Vec<&Packet> {
        self.trace.iter().filter(|p| pred(p)).collect()
    }

    /// The requests with `method` sent by `from`.
    pub fn requests(&self, from: Party, method: Method) -> Vec<&Packet> {
        self.sent(|p| p.is(from, method))
    }

    /// The trace as text, one message a line (for failure messages).
    pub fn dump(&self) -> String {
        let mut out = String::new();
        for p in &self.trace {
            out.push_str(&p.to_string());
            out.push('\n');
        }
        out
    }

    /// The earliest instant anything is due: a message or transaction
    /// timer, a core's `poll_timeout`, the agent's next sample or the end
    /// of its shutdown wait.
    pub fn next_deadline(&self) -> Option<Instant> {
        let queued = self.queue.keys().next().map(|(at, _)| *at);
        let agent = self.agent.as_ref().and_then(AgentSide::poll_timeout);
        [
            queued,
            agent,
            self.collector.registrar.poll_timeout(),
            self.collector.subscriber.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Jumps to the next deadline and runs everything due then until the
    /// parties are idle; `false` when nothing at all is due.
    pub fn advance(&mut self) -> bool {
        let Some(at) = self.next_deadline() else {
            return false;
        };
        self.now = self.now.max(at);
        self.run_now();
        true
    }

    /// Runs every deadline up to `elapsed() + d`, then sets the clock there.
    pub fn run_for(&mut self, d: Duration) {
        let until = self.now + d;
        while self.next_deadline().is_some_and(|at| at <= until) {
            self.advance();
        }
        self.now = until;
        self.run_now();
    }

    /// Runs deadline by deadline until `check` returns `Some` (checked
    /// first, and after every step), at most `limit` of virtual time; the
    /// clock stays where `check` first held (or at the limit).
    pub fn run_until<T>(
        &mut self,
        limit: Duration,
        mut check: impl FnMut(&Pair) -> Option<T>,
    ) -> Option<T> {
        let until = self.now + limit;
        self.run_now();
        loop {
            if let Some(v) = check(self) {
                return Some(v);
            }
            match self.next_deadline() {
                Some(at) if at <= until => {
                    self.advance();
                }
                _ => {
                    self.now = until;
                    self.run_now();
                    return check(self);
                }
            }
        }
    }

    /// The agent's current sample (what its sampler reads).
    fn sample(&self) -> Sample {
        Sample {
            load: self.load_of(self.calls),
            cpu: 0,
            calls: self.calls,
            max_calls: self.config.max_calls,
        }
    }

    /// Runs everything due at `now` until idle.
    fn run_now(&mut self) {
        for _ in 0..MAX_STEPS_PER_INSTANT {
            self.settle();
            if !self.step() {
                return;
            }
        }
        panic!(
            "livelock at {:?}: still busy after {MAX_STEPS_PER_INSTANT} steps\n{}",
            self.elapsed(),
            self.dump()
        );
    }

    /// One thing due at `now`: a queued message or timer, else the cores'
    /// timers; `false` when nothing is due.
    fn step(&mut self) -> bool {
        let now = self.now;
        if let Some(entry) = self.queue.first_entry() {
            if entry.key().0 <= now {
                let item = entry.remove();
                self.handle_due(item);
                return true;
            }
        }
        let sample = self.sample();
        let mut busy = false;
        if let Some(agent) = self.agent.as_mut() {
            busy |= agent.handle_timeout(now, sample, self.config.sample_interval);
        }
        let c = &mut self.collector;
        if due(c.registrar.poll_timeout(), now) {
            c.registrar.handle_timeout(now);
            busy = true;
        }
        if due(c.subscriber.poll_timeout(), now) {
            c.subscriber.handle_timeout(now);
            busy = true;
        }
        busy
    }

    fn handle_due(&mut self, due: Due) {
        let now = self.now;
        match due {
            Due::Request { txn, to, text } => {
                let request = parse_request(&text, to.peer().addr());
                let response = match to {
                    Party::Agent => self.agent.as_mut().and_then(|a| {
                        a.notifier
                            .handle_request(now, Some(COLLECTOR_ADDR), &request)
                    }),
                    Party::Collector => Some(self.collector.answer(now, &request, self.start)),
                };
                if let Some(response) = response {
                    self.send_response(to, txn, response);
                }
            }
            Due::Response { txn, text } => {
                if let Some(t) = self.txns.remove(&txn) {
                    let response = parse_response(&text);
                    self.complete(t.origin, Ok(&response));
                }
            }
            Due::TimerF(txn) => {
                if let Some(t) = self.txns.remove(&txn) {
                    let timeout = sip::response(&t.request, StatusCode::RequestTimeout, None);
                    self.complete(t.origin, Ok(&timeout));
                }
            }
            Due::Failed(txn) => {
                if let Some(t) = self.txns.remove(&txn) {
                    self.complete(t.origin, Err("transport failure"));
                }
            }
        }
    }

    /// Hands the end of a client transaction to the core that sent it: a
    /// final response (a local 408 included) or a transport failure.
    fn complete(&mut self, origin: Origin, outcome: Result<&Response, &str>) {
        let now = self.now;
        match origin {
            Origin::Subscribe(id) => {
                let s = &mut self.collector.subscriber;
                match outcome {
                    Ok(r) => s.handle_response(now, id, r),
                    Err(why) => s.handle_failure(now, id, why),
                }
            }
            Origin::Register { incarnation } => {
                if let Some(a) = self.agent_run(incarnation) {
                    match outcome {
                        Ok(r) => a.registration.handle_response(now, r),
                        Err(why) => a.registration.handle_failure(now, why),
                    }
                }
            }
            Origin::Notify {
                incarnation,
                subscription,
                cseq,
            } => {
                if let Some(a) = self.agent_run(incarnation) {
                    match outcome {
                        Ok(r) => a.notifier.handle_notify_response(now, subscription, r),
                        Err(why) => a
                            .notifier
                            .handle_notify_failure(now, subscription, cseq, why),
                    }
                }
            }
        }
    }

    /// The agent, if it is the run `incarnation`.
    fn agent_run(&mut self, incarnation: u64) -> Option<&mut AgentSide> {
        self.agent.as_mut().filter(|a| a.incarnation == incarnation)
    }

    /// Takes what the cores queued — requests to send, the shells'
    /// reactions to events — until nothing is left.
    fn settle(&mut self) {
        loop {
            let mut out: Vec<(Party, Origin, Request)> = Vec::new();
            if self
                .agent
                .as_mut()
                .is_some_and(|a| a.shutdown_over(self.now))
            {
                self.agent = None;
            }
            if let Some(agent) = self.agent.as_mut() {
                let incarnation = agent.incarnation;
                while let Some(r) = agent.registration.poll_transmit() {
                    out.push((Party::Agent, Origin::Register { incarnation }, r));
                }
                while let Some(t) = agent.notifier.poll_transmit() {
                    let origin = Origin::Notify {
                        incarnation,
                        subscription: t.subscription,
                        cseq: t.cseq,
                    };
                    out.push((Party::Agent, origin, t.request));
                }
            }
            let elapsed = self.elapsed();
            for t in self.collector.settle(self.now, elapsed) {
                out.push((Party::Collector, Origin::Subscribe(t.id), t.request));
            }
            if out.is_empty() {
                return;
            }
            for (from, origin, request) in out {
                self.send_request(from, origin, request);
            }
        }
    }

    /// Sends a request as the endpoint does (module docs) through the link.
    fn send_request(&mut self, from: Party, origin: Origin, mut request: Request) {
        let via = format!(
            "SIP/2.0/UDP {};branch=z9hG4bK{};rport",
            from.addr(),
            sip::random_token()
        );
        request.headers.push_front(sip::Header::Via(via.into()));
        if sip::header(&request.headers, "Max-Forwards").is_none() {
            sip::push_header(&mut request.headers, "Max-Forwards", "70");
        }
        let txn = self.next_txn;
        self.next_txn += 1;
        let text = request.to_string();
        let fate = self.judge(from, SipMessage::Request(request.clone()));
        self.txns.insert(txn, ClientTransaction { origin, request });
        self.schedule(self.now + TIMER_F, Due::TimerF(txn));
        let to = from.peer();
        match fate {
            Fate::Deliver => self.schedule(
                self.now + self.config.latency,
                Due::Request { txn, to, text },
            ),
            Fate::Delay(d) => self.schedule(
                self.now + self.config.latency + d,
                Due::Request { txn, to, text },
            ),
            Fate::Drop => {}
            Fate::Fail => self.schedule(self.now, Due::Failed(txn)),
        }
    }

    /// Sends `from`'s answer to the request of transaction `txn`.
    fn send_response(&mut self, from: Party, txn: u64, response: Response) {
        let text = response.to_string();
        let at = match self.judge(from, SipMessage::Response(response)) {
            Fate::Deliver => self.now + self.config.latency,
            Fate::Delay(d) => self.now + self.config.latency + d,
            Fate::Drop | Fate::Fail => return,
        };
        self.schedule(at, Due::Response { txn, text });
    }

    /// The link's verdict on a message, recorded in the trace.
    fn judge(&mut self, from: Party, message: SipMessage) -> Fate {
        let mut packet = Packet {
            at: self.elapsed(),
            from,
            message,
            fate: Fate::Deliver,
        };
        packet.fate = (self.link)(&packet);
        let fate = packet.fate;
        self.trace.push(packet);
        fate
    }

    fn schedule(&mut self, at: Instant, due: Due) {
        self.next_seq += 1;
        self.queue.insert((at, self.next_seq), due);
    }
}

impl AgentSide {
    /// The earliest deadline of the agent's shell and cores in its phase:
    /// while running, the registration's, the notifier's and the next
    /// sample; in shutdown step 1 the notifier's only; in step 2 the end of
    /// the wait.
    fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            AgentPhase::Running => [
                self.registration.poll_timeout(),
                self.notifier.poll_timeout(),
                Some(self.next_sample),
            ]
            .into_iter()
            .flatten()
            .min(),
            AgentPhase::Finals => self.notifier.poll_timeout(),
            AgentPhase::Unregistering(deadline) => Some(deadline),
        }
    }

    /// Runs what is due at `now`; whether anything was.
    fn handle_timeout(&mut self, now: Instant, sample: Sample, interval: Duration) -> bool {
        let mut busy = false;
        match self.phase {
            AgentPhase::Running => {
                if due(self.registration.poll_timeout(), now) {
                    self.registration.handle_timeout(now);
                    busy = true;
                }
                if due(self.notifier.poll_timeout(), now) {
                    self.notifier.handle_timeout(now);
                    busy = true;
                }
                if self.next_sample <= now {
                    self.notifier.on_sample(now, sample);
                    self.next_sample = now + interval;
                    busy = true;
                }
            }
            AgentPhase::Finals => {
                if due(self.notifier.poll_timeout(), now) {
                    self.notifier.handle_timeout(now);
                    busy = true;
                }
            }
            // `shutdown_over` ends the wait.
            AgentPhase::Unregistering(_) => {}
        }
        busy
    }

    /// Moves the shutdown along (module docs); `true` once the agent has
    /// stopped.
    fn shutdown_over(&mut self, now: Instant) -> bool {
        match self.phase {
            AgentPhase::Running => false,
            AgentPhase::Finals => {
                if self.notifier.finals_in_flight() == 0 {
                    self.registration.unregister(now);
                    self.phase = AgentPhase::Unregistering(now + SHUTDOWN_GRACE);
                }
                false
            }
            AgentPhase::Unregistering(deadline) => {
                self.registration.is_finished() || now >= deadline
            }
        }
    }
}

impl CollectorSide {
    fn new(config: &PairConfig) -> CollectorSide {
        let toml = format!(
            r#"node = "core1@pair"
[sip]
listen = "{COLLECTOR_ADDR}"
realm = "msr.local"
min_expires = {min}
[[accounts]]
auth_name = "msr"
password = "msr-secret"
[subscription]
expires = {sub}
[control]
socket = "/nonexistent/pair.sock"
[state]
path = "/nonexistent/pair.json"
[http]
listen = "off"
"#,
            min = config.min_expires,
            sub = config.subscription_expires,
        );
        let parsed = msr_collector::config::parse(&toml, "pair")
            .unwrap_or_else(|e| panic!("the harness's collector config: {e}\n{toml}"));
        let local = format!("sip:collector@{COLLECTOR_ADDR}");
        CollectorSide {
            registrar: Registrar::new(&parsed.sip, &parsed.accounts),
            subscriber: Subscriber::new(SubscriberConfig {
                local_uri: local.clone(),
                contact: local,
                default_expires: parsed.subscription.expires,
            }),
            registrar_events: Vec::new(),
            events: Vec::new(),
        }
    }

    /// Answers a request as the collector's shell does (REGISTER to the
    /// registrar, NOTIFY to the subscriber, OPTIONS 200, others 405).
    fn answer(&mut self, now: Instant, request: &Request, start: Instant) -> Response {
        match request.method {
            Method::Register => self
                .registrar
                .handle_register(now, request, Some(AGENT_ADDR)),
            Method::Notify => {
                let unix = UNIX_START + i64::try_from((now - start).as_secs()).unwrap_or(0);
                self.subscriber
                    .handle_notify(now, unix, Some(AGENT_ADDR), request)
            }
            Method::Options => sip::response(request, StatusCode::OK, None),
            _ => sip::response(request, StatusCode::MethodNotAllowed, None),
        }
    }

    /// The collector shell's `settle`: registrar events to the subscriber,
    /// then the subscriber's requests (returned, to send) and events
    /// (recorded).
    fn settle(&mut self, now: Instant, elapsed: Duration) -> Vec<adapter::Transmit> {
        while let Some(event) = self.registrar.poll_event() {
            let msr = match &event {
                RegistrarEvent::BindingAdded(b) | RegistrarEvent::BindingRefreshed(b) => {
                    b.msr.clone()
                }
                RegistrarEvent::BindingRestarted(b) => {
                    self.subscriber.contact_restarted(now, &b.msr, &b.contact);
                    b.msr.clone()
                }
                RegistrarEvent::BindingRemoved { binding, .. } => binding.msr.clone(),
            };
            self.registrar_events.push((elapsed, event));
            adapter::contacts_changed(&self.registrar, &mut self.subscriber, now, &msr);
        }
        let mut out = Vec::new();
        while let Some(t) = self.subscriber.poll_transmit() {
            out.push(t);
        }
        while let Some(e) = self.subscriber.poll_event() {
            self.events.push((elapsed, e));
        }
        out
    }
}

/// The calls into the collector's cores whose shapes the collector's
/// owners are reshaping, in one place.
pub mod adapter {
    use msr_collector::registrar::Registrar;
    use msr_collector::subscriber::Subscriber;
    use msr_shared::subscription::SubscriptionState;
    use tokio::time::Instant;

    pub use msr_collector::subscriber::Transmit;

    /// Tells the subscriber the registered contacts of `msr`.
    pub fn contacts_changed(
        registrar: &Registrar,
        subscriber: &mut Subscriber,
        now: Instant,
        msr: &str,
    ) {
        subscriber.contacts_changed(now, msr, registrar.contacts_of(msr));
    }

    /// The subscription state of `msr`.
    pub fn status(subscriber: &Subscriber, msr: &str) -> Option<SubscriptionState> {
        subscriber.view(msr).map(|v| v.status)
    }
}

/// The agent's XML config for the pair, written as every system test's
/// ([`system::agent_xml`]) and read by the agent's own parser. Its
/// addresses are not used: the pair's are [`AGENT_ADDR`] and
/// [`COLLECTOR_ADDR`].
fn agent_xml(c: &PairConfig) -> String {
    let spec = AgentSpec {
        accounts: vec![AccountSpec {
            msr: c.msr.clone(),
            realm: format!("sip:{COLLECTOR_ADDR}"),
        }],
        load_delta: c.load_delta,
        max_calls: c.max_calls,
        register_expires: c.register_expires,
        max_subscription_expires: c.max_subscription_expires,
        sample_interval_ms: u64::try_from(c.sample_interval.as_millis()).unwrap_or(u64::MAX),
        notify_min_interval_ms: u64::try_from(c.notify_min_interval.as_millis())
            .unwrap_or(u64::MAX),
        sip_port: AGENT_ADDR.port(),
        notify_high_water: c.high_water,
        auth_password: c.password.clone(),
        ..AgentSpec::default()
    };
    system::agent_xml(&spec, Path::new("/nonexistent/pair.calls"))
}

/// Whether a core's deadline is due at `now`.
fn due(deadline: Option<Instant>, now: Instant) -> bool {
    deadline.is_some_and(|t| t <= now)
}

/// Parses a request as the receiving transport does, with the source
/// stamped on its `Via`.
fn parse_request(text: &str, source: SocketAddr) -> Request {
    let message = SipMessage::try_from(text)
        .unwrap_or_else(|e| panic!("a core sent a request rsipstack cannot parse ({e}):\n{text}"));
    let stamped = rsipstack::transport::SipConnection::update_msg_received(
        message,
        source,
        rsipstack::sip::Transport::Udp,
    )
    .unwrap_or_else(|e| panic!("cannot stamp the via ({e}):\n{text}"));
    match stamped {
        SipMessage::Request(r) => r,
        SipMessage::Response(_) => panic!("a request parsed as a response:\n{text}"),
    }
}

fn parse_response(text: &str) -> Response {
    match SipMessage::try_from(text) {
        Ok(SipMessage::Response(r)) => r,
        Ok(SipMessage::Request(_)) => panic!("a response parsed as a request:\n{text}"),
        Err(e) => panic!("a core sent a response rsipstack cannot parse ({e}):\n{text}"),
    }
}

/// Whether a NOTIFY's `Subscription-State` begins with `state`.
pub fn notify_state(p: &Packet, state: &str) -> bool {
    p.method() == Some(&Method::Notify)
        && p.header("Subscription-State")
            .is_some_and(|s| s.starts_with(state))
}
