//! An in-memory two-party harness in virtual time (quinn-proto's test
//! `Pair`): one MSR agent's sans-IO cores — its [`Notifier`] and the
//! [`Registration`] of its one account — and one real collector core, the
//! product's [`Collector`] with its registrar, subscriber, health monitor,
//! load table, legs and operator configuration, joined by a simulated UDP
//! link, with a clock that jumps from one deadline to the next.
//!
//! Every message is the SIP message the cores build. The agent's are sent
//! as its endpoint sends them (a top `Via` with a fresh branch and
//! `rport`, `Max-Forwards: 70`); the collector's are the bytes its core
//! emits, retransmissions included. Each is printed to text and parsed back
//! at the receiving side (with `received`/`rport` stamped on the `Via`, as
//! the real transports do). Nothing touches a socket or the wall clock:
//! the harness holds `now` and hands it to every core.
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
//! * **Link** ([`Pair::set_link`]): each datagram meets a [`Fate`] chosen
//!   by a test-supplied function: delivered after [`PairConfig::latency`]
//!   (the default), delayed further, or dropped. The collector's core
//!   retransmits its own requests (RFC 3261 Timer E), and the link judges
//!   each retransmission as it judges any datagram
//!   ([`Packet::retransmission`]), so a predicate that drops a request
//!   drops its retransmissions too.
//! * **The agent's client transactions** (rsipstack's in the agent, RFC
//!   3261 §17.1.2): an agent request dropped by the link stands for its
//!   loss with every retransmission; one that gets no final response within
//!   [`TIMER_F`] (64 × T1) ends with a locally generated `408`, handed to
//!   the sender; [`Fate::Fail`] is its endpoint's transport failure at
//!   once. A response that arrives after its transaction ended is ignored.
//! * **The agent's server transactions**: a retransmitted request of the
//!   collector is answered with the response the agent gave the first time
//!   (rsipstack's cache), not handed to the notifier again.
//! * **Sources**: the agent takes a SUBSCRIBE's source from the socket
//!   ([`COLLECTOR_ADDR`]); the collector a REGISTER's and a NOTIFY's
//!   ([`AGENT_ADDR`], which the agent's `Via` names as well).
//! * **The agent's shell and glue** (`agent/src/shell.rs`, `Agent` in
//!   `agent/src/core/`, re-implemented here over the two cores): the load sampler, every
//!   [`PairConfig::sample_interval`], feeds [`Pair::set_calls`]'s value to
//!   `Notifier::on_sample`; SIGTERM ([`Pair::stop_agent`]) is its two-step
//!   shutdown: the `deactivated` NOTIFYs, waited for until answered (at
//!   most `FINAL_NOTIFY_GRACE`), then `Expires: 0`, waited for at most
//!   [`SHUTDOWN_GRACE`]; a NOTIFY its registrar answers `481` REGISTERs
//!   again at once (`Notifier::poll_forgotten`); `kill -9` ([`Pair::kill_agent`]) drops the cores
//!   with nothing sent; a restart ([`Pair::start_agent`]) builds new cores
//!   (a new Call-ID, no dialogs).
//! * **The collector's shell** (`collector/src/daemon/`): a disk that
//!   writes at once — every bindings save and every commit the core asks
//!   for succeeds at the instant it is asked — and control requests
//!   ([`Pair::ask`]) answered through the core's effects;
//!   [`Pair::restart_collector`] is its `kill -9` and restart, with the
//!   bindings last saved or none. Everything else, the glue between the
//!   collector's cores included, is the product's.
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
use msr_collector::core::{AdminId, Backend, Collector, Effect, Event, Inbound, Route, Start};
use msr_collector::model::health::HealthEvent;
use msr_collector::operator::cluster::Cluster;
use msr_collector::operator::store::etcd::Member;
use msr_collector::operator::OperatorConfig;
use msr_collector::sip::registrar::RegistrarEvent;
use msr_collector::sip::subscriber::SubscriberEvent;
use msr_shared::admin::{Request as AdminRequest, Response as AdminResponse, ResponseData};
use msr_shared::event_package::LoadReport;
use msr_shared::sip::wire::{self, Carrier};
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
}

/// What the link does with one message (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Delivered after [`PairConfig::latency`].
    Deliver,
    /// Delivered after the latency plus this.
    Delay(Duration),
    /// Lost. For an agent's request, with every retransmission: the agent
    /// sees Timer F.
    Drop,
    /// The agent's endpoint reports a transport failure at once (an agent
    /// request only; anything else is a drop: the collector's UDP sends
    /// report nothing).
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
    /// A retransmission by the collector's transaction layer of a request
    /// it sent before (same branch).
    pub retransmission: bool,
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

/// The collector's core and what happened to it.
#[derive(Debug)]
pub struct CollectorSide {
    /// The product's collector core.
    pub core: Collector,
    /// Every registrar event, with its time since the start.
    pub registrar_events: Vec<(Duration, RegistrarEvent)>,
    /// Every subscriber event, with its time since the start.
    pub events: Vec<(Duration, SubscriberEvent)>,
    /// Every health event, with its time since the start.
    pub health_events: Vec<(Duration, HealthEvent)>,
    answers: HashMap<AdminId, AdminResponse>,
    next_admin: u64,
    /// The bindings as last written to the (simulated) disk.
    saved_bindings: Option<String>,
    /// Which run of the collector this is (a restart counts up).
    pub incarnation: u64,
}

/// Who sent an agent request and what to tell when its transaction ends.
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
}

#[derive(Debug)]
struct ClientTransaction {
    origin: Origin,
    /// The request as sent (for the local 408).
    request: Request,
}

#[derive(Debug)]
enum Due {
    /// An agent request's text arrives at the collector.
    Request { txn: u64, text: String },
    /// The collector's response to an agent request arrives at the agent.
    Response { txn: u64, text: String },
    /// Timer F of an agent transaction.
    TimerF(u64),
    /// The agent's endpoint reports the request failed.
    Failed(u64),
    /// A collector request's text arrives at the agent.
    ToAgent { text: String },
    /// The agent's answer to a collector request arrives at the collector.
    ToCollector { text: String },
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
    /// The agent transaction of each branch the agent sent.
    txn_of_branch: HashMap<String, u64>,
    next_txn: u64,
    /// The agent's server transactions: its answer to each collector
    /// request's branch, for the retransmissions.
    agent_answers: HashMap<String, Option<String>>,
    /// Branches of collector requests already sent once.
    collector_branches: BTreeSet<String>,
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
        let collector = CollectorSide::new(&config, start);
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
            txn_of_branch: HashMap::new(),
            next_txn: 1,
            agent_answers: HashMap::new(),
            collector_branches: BTreeSet::new(),
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
            notify_top_interval: Duration::from_millis(parsed.agent.notify_top_interval_ms),
            max_expires: parsed.agent.max_subscription_expires,
            contact_host_port: AGENT_ADDR.to_string(),
            accounts: parsed.accounts.iter().map(|a| a.msr_name.clone()).collect(),
            subscribers: BTreeSet::from([COLLECTOR_ADDR.ip()]),
            registrars: BTreeSet::from([COLLECTOR_ADDR]),
            // No `codecs:` line, as before SPEC §15, whatever the
            // generated config's `<codec>` says: the pair tests see the
            // NOTIFYs they always saw; one that needs codecs sets them
            // with `reconfigure_agent`.
            codecs: None,
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

    /// `kill -9` of the collector and its restart at once: a new core
    /// that reads back the bindings last saved (`with_bindings`) or none
    /// (a lost disk), and whatever was on its way to the old one is lost
    /// with it. Its events so far stay recorded.
    pub fn restart_collector(&mut self, with_bindings: bool) {
        let old = std::mem::replace(
            &mut self.collector,
            CollectorSide::new(&self.config, self.start),
        );
        self.collector.registrar_events = old.registrar_events;
        self.collector.events = old.events;
        self.collector.health_events = old.health_events;
        self.collector.incarnation = old.incarnation + 1;
        self.collector.saved_bindings = old.saved_bindings.clone();
        let now = self.now;
        if with_bindings {
            if let Some(text) = &old.saved_bindings {
                self.collector.core.restore_bindings(now, text);
            }
        }
        // The old process's datagrams die with it.
        self.queue
            .retain(|_, due| !matches!(due, Due::Request { .. } | Due::ToCollector { .. }));
        self.txn_of_branch.clear();
        self.settle();
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

    /// Whether the collector holds a binding of the MSR (as its last
    /// registrar event says).
    pub fn is_registered(&self) -> bool {
        self.collector
            .registrar_events
            .iter()
            .rev()
            .find(|(_, e)| match e {
                RegistrarEvent::BindingRemoved { binding, .. } => binding.msr == self.config.msr,
                RegistrarEvent::BindingAdded(b)
                | RegistrarEvent::BindingRefreshed(b)
                | RegistrarEvent::BindingRestarted(b) => b.msr == self.config.msr,
            })
            .is_some_and(|(_, e)| !matches!(e, RegistrarEvent::BindingRemoved { .. }))
    }

    /// The collector's subscription state of the MSR, as `subscription
    /// list` shows it; `None` without a subscription.
    pub fn subscription_status(&mut self) -> Option<SubscriptionState> {
        let msr = self.config.msr.clone();
        match self.ask(AdminRequest::SubscriptionList {}) {
            AdminResponse::Ok(ResponseData::Subscriptions { rows }) => rows
                .into_iter()
                .find(|r| r.msr == msr)
                .and_then(|r| r.status),
            other => panic!("subscription list answered {other:?}"),
        }
    }

    /// Asks the collector a control request at the current instant (as
    /// msrctl does, through the core) and returns its answer.
    pub fn ask(&mut self, request: AdminRequest) -> AdminResponse {
        let id = self.collector.next_id();
        self.collector.core.handle_admin(self.now, id, request);
        self.settle();
        self.collector
            .answers
            .remove(&id)
            .unwrap_or_else(|| panic!("no answer to control request {id:?}"))
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

    /// The requests with `method` sent by `from`, each once: the
    /// collector's retransmissions left out ([`sent`](Self::sent) has all).
    pub fn requests(&self, from: Party, method: Method) -> Vec<&Packet> {
        self.sent(|p| p.is(from, method) && !p.retransmission)
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
        [queued, agent, self.collector.core.poll_timeout()]
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
        mut check: impl FnMut(&mut Pair) -> Option<T>,
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
        if due(self.collector.core.poll_timeout(), now) {
            self.collector.core.handle_timeout(now);
            busy = true;
        }
        busy
    }

    fn handle_due(&mut self, due: Due) {
        let now = self.now;
        match due {
            Due::Request { txn, text } => {
                let message = wire::decode(text.as_bytes(), AGENT_ADDR, Carrier::Udp)
                    .unwrap_or_else(|e| {
                        panic!("the collector cannot read the agent's ({e}):\n{text}")
                    });
                if let Some(branch) = top_branch(&message) {
                    self.txn_of_branch.insert(branch, txn);
                }
                self.collector.core.handle_message(
                    now,
                    Inbound {
                        route: Route::Udp(AGENT_ADDR),
                        source: AGENT_ADDR,
                        message,
                        peer_certificate: None,
                    },
                );
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
            Due::ToAgent { text } => {
                let request = parse_request(&text, COLLECTOR_ADDR);
                let branch = top_branch(&SipMessage::Request(request.clone()));
                // A retransmission: the agent's transaction layer answers
                // it from its cache; the notifier never sees it.
                if let Some(cached) = branch.as_ref().and_then(|b| self.agent_answers.get(b)) {
                    if let Some(text) = cached.clone() {
                        self.send_to_collector(text);
                    }
                    return;
                }
                let response = self.agent.as_mut().and_then(|a| {
                    a.notifier
                        .handle_request(now, Some(COLLECTOR_ADDR), &request)
                });
                let text = response.map(|r| r.to_string());
                if let Some(branch) = branch {
                    self.agent_answers.insert(branch, text.clone());
                }
                if let Some(text) = text {
                    self.send_to_collector(text);
                }
            }
            Due::ToCollector { text } => {
                let message = wire::decode(text.as_bytes(), AGENT_ADDR, Carrier::Udp)
                    .unwrap_or_else(|e| {
                        panic!("the collector cannot read the agent's ({e}):\n{text}")
                    });
                self.collector.core.handle_message(
                    now,
                    Inbound {
                        route: Route::Udp(AGENT_ADDR),
                        source: AGENT_ADDR,
                        message,
                        peer_certificate: None,
                    },
                );
            }
        }
    }

    /// The agent's answer to a collector request, through the link.
    fn send_to_collector(&mut self, text: String) {
        let message = SipMessage::Response(parse_response(&text));
        let at = match self.judge(Party::Agent, message, false) {
            Fate::Deliver => self.now + self.config.latency,
            Fate::Delay(d) => self.now + self.config.latency + d,
            Fate::Drop | Fate::Fail => return,
        };
        self.schedule(at, Due::ToCollector { text });
    }

    /// Hands the end of an agent client transaction to the core that sent
    /// it: a final response (a local 408 included) or a transport failure.
    fn complete(&mut self, origin: Origin, outcome: Result<&Response, &str>) {
        let now = self.now;
        match origin {
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
                // The agent shell's glue (SPEC §3): its registrar answered
                // a NOTIFY 481, so the account REGISTERs again at once.
                while let Some((_, registrar)) = agent.notifier.poll_forgotten() {
                    if registrar == COLLECTOR_ADDR {
                        agent.registration.register_now(self.now);
                    }
                }
                if due(agent.registration.poll_timeout(), self.now) {
                    agent.registration.handle_timeout(self.now);
                }
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
            let sent = self.collector.settle(self.now, elapsed);
            if out.is_empty() && sent.is_empty() {
                return;
            }
            for (from, origin, request) in out {
                self.send_request(from, origin, request);
            }
            for message in sent {
                self.send_from_collector(message);
            }
        }
    }

    /// A message the collector's core emitted, through the link: a request
    /// of its own (to the agent's server side) or its answer to one of the
    /// agent's requests (to that transaction).
    fn send_from_collector(&mut self, message: SipMessage) {
        let text = message.to_string();
        let request = matches!(message, SipMessage::Request(_));
        let branch = top_branch(&message).unwrap_or_default();
        let (retransmission, txn) = if request {
            (!self.collector_branches.insert(branch), None)
        } else {
            let txn = self.txn_of_branch.get(&branch).copied();
            (
                false,
                Some(txn.unwrap_or_else(|| {
                    panic!("the collector answered a request the agent never sent:\n{text}")
                })),
            )
        };
        let at = match self.judge(Party::Collector, message, retransmission) {
            Fate::Deliver => self.now + self.config.latency,
            Fate::Delay(d) => self.now + self.config.latency + d,
            Fate::Drop | Fate::Fail => return,
        };
        match txn {
            None => self.schedule(at, Due::ToAgent { text }),
            Some(txn) => self.schedule(at, Due::Response { txn, text }),
        }
    }

    /// Sends an agent request as its endpoint does (module docs) through
    /// the link.
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
        let fate = self.judge(from, SipMessage::Request(request.clone()), false);
        self.txns.insert(txn, ClientTransaction { origin, request });
        self.schedule(self.now + TIMER_F, Due::TimerF(txn));
        match fate {
            Fate::Deliver => {
                self.schedule(self.now + self.config.latency, Due::Request { txn, text })
            }
            Fate::Delay(d) => self.schedule(
                self.now + self.config.latency + d,
                Due::Request { txn, text },
            ),
            Fate::Drop => {}
            Fate::Fail => self.schedule(self.now, Due::Failed(txn)),
        }
    }

    /// The link's verdict on a message, recorded in the trace.
    fn judge(&mut self, from: Party, message: SipMessage, retransmission: bool) -> Fate {
        let mut packet = Packet {
            at: self.elapsed(),
            from,
            message,
            fate: Fate::Deliver,
            retransmission,
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
    fn new(config: &PairConfig, start: Instant) -> CollectorSide {
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
        let mut operator = OperatorConfig::new();
        operator
            .declare_site(&parsed.defaults.site)
            .unwrap_or_else(|e| panic!("the default site: {e}"));
        let this = Member {
            node: parsed.node.clone(),
            sip: COLLECTOR_ADDR.to_string(),
            started_unix: UNIX_START,
        };
        let core = Collector::new(
            &parsed,
            Start {
                local: COLLECTOR_ADDR,
                operator,
                cluster: Cluster::file(this, "/nonexistent/pair.json".into(), 1),
                backend: Backend::File,
                metrics: std::sync::Arc::new(msr_collector::api::metrics::Metrics::new()),
                seed: 1,
                now: start,
                unix_ms: UNIX_START * 1000,
            },
        );
        CollectorSide {
            core,
            registrar_events: Vec::new(),
            events: Vec::new(),
            health_events: Vec::new(),
            answers: HashMap::new(),
            next_admin: 0,
            saved_bindings: None,
            incarnation: 1,
        }
    }

    fn next_id(&mut self) -> AdminId {
        self.next_admin += 1;
        AdminId(self.next_admin)
    }

    /// The shell's part (module docs): the core's messages (returned, to
    /// send), its effects carried out at once, its events recorded.
    fn settle(&mut self, now: Instant, elapsed: Duration) -> Vec<SipMessage> {
        let mut out = Vec::new();
        loop {
            let mut busy = false;
            while let Some(t) = self.core.poll_transmit() {
                busy = true;
                let message = SipMessage::try_from(t.bytes.as_ref()).unwrap_or_else(|e| {
                    panic!(
                        "the collector sent what it cannot parse ({e}):\n{}",
                        String::from_utf8_lossy(&t.bytes)
                    )
                });
                out.push(message);
            }
            while let Some(effect) = self.core.poll_effect() {
                busy = true;
                match effect {
                    Effect::Answer { id, response } => {
                        self.answers.insert(id, *response);
                    }
                    Effect::Commit { ticket, .. } => {
                        self.core.handle_committed(now, ticket, Ok(()))
                    }
                    Effect::SaveBindings { generation, text } => {
                        self.saved_bindings = Some(text);
                        self.core.handle_bindings_saved(now, generation, Ok(()))
                    }
                }
            }
            while let Some(event) = self.core.poll_event() {
                match event {
                    Event::Registrar(e) => self.registrar_events.push((elapsed, e)),
                    Event::Subscriber(e) => self.events.push((elapsed, e)),
                    Event::Health(e) => self.health_events.push((elapsed, e)),
                    _ => {}
                }
            }
            if !busy {
                return out;
            }
        }
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

/// The top `Via` branch of a message.
fn top_branch(message: &SipMessage) -> Option<String> {
    let headers = match message {
        SipMessage::Request(r) => &r.headers,
        SipMessage::Response(r) => &r.headers,
    };
    sip::header(headers, "Via").and_then(|v| sip::param(v, "branch"))
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
