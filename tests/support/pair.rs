//! An in-memory two-party harness in virtual time (quinn-proto's test
//! `Pair`, which holds two real endpoints): the product's agent core, an
//! [`Agent`] built from the agent's XML config ([`agent_xml`], read by its
//! own parser), and the product's collector core, a [`Collector`] with its
//! registrar, subscriber, health monitor, load table, legs and operator
//! configuration, joined by a simulated UDP link, with a clock that jumps
//! from one deadline to the next.
//!
//! The glue of each side is its core's: on the agent's, which core a
//! response goes to, the 481 rule (SPEC §3), the engine's state and the
//! drain (SPEC §14) and the shutdown's two phases are `Agent`'s
//! (`agent/src/core/`); on the collector's, `Collector`'s. Every message is
//! the bytes a side's transaction layer emits, parsed back at the other
//! side by [`wire::decode`] (which stamps a request's `Via` with
//! `received`/`rport`, as both daemons' transports do). Nothing touches a
//! socket or the wall clock: the harness holds `now` and hands it to every
//! core.
//!
//! Driving ([`Pair::advance`]): at each step the clock jumps to the
//! earliest of every deadline (both cores' `poll_timeout()`, the agent's
//! transactions', its next load sample, the next message due), then
//! everything due at that instant runs until the parties are idle (every
//! queue drained, nothing due). [`Pair::run_for`] and [`Pair::run_until`]
//! bound a run in virtual time, so a test that asserts that nothing
//! happened asserts it about every event up to that instant — not about
//! how long a process happened to sleep.
//!
//! What the shells and the transport add, modelled here:
//!
//! * **Link** ([`Pair::set_link`]): each datagram meets a [`Fate`] chosen
//!   by a test-supplied function: delivered after [`PairConfig::latency`]
//!   (the default), delayed further, or dropped. Both sides retransmit
//!   their requests (RFC 3261 Timer E), and the link judges each
//!   retransmission as it judges any datagram ([`Packet::retransmission`]):
//!   a predicate that drops a request by what it says drops its
//!   retransmissions too; one that drops by time may let a later one
//!   through, as a real link would.
//! * **The agent's endpoint** (`SipEndpoint`, `shared/src/sip/endpoint.rs`)
//!   is an async task that owns sockets, which no virtual clock can drive;
//!   its part is re-driven here over the same sans-IO tables it holds —
//!   [`ClientTransactions`] for the agent's requests (the top `Via`,
//!   `User-Agent`, Timer E, Timer F ending one unanswered with a local
//!   `408`, responses matched by branch, late ones dropped) and
//!   [`ServerTransactions`] for the collector's (a retransmission answered
//!   with the first response, never shown to the core twice). Still the
//!   harness's own: UDP only (no stream connections, so no
//!   `Agent::handle_closed`), every datagram to the one peer whatever
//!   address the request names (no lookup), no overload shedding, and
//!   [`Fate::Fail`], the endpoint's report of a request that failed at
//!   the transport.
//! * **Sources**: the agent takes a SUBSCRIBE's source from the socket
//!   ([`COLLECTOR_ADDR`]); the collector a REGISTER's and a NOTIFY's
//!   ([`AGENT_ADDR`], which the agent's `Via` names as well).
//! * **The agent's shell** (`agent/src/shell.rs`): the load sampler, every
//!   `Agent::sample_interval`, feeds [`Pair::set_calls`]'s value to
//!   `Agent::handle_sample` until a shutdown begins; SIGTERM
//!   ([`Pair::stop_agent`]) is `Agent::shutdown`, as is the core's
//!   `ExitWhenDrained`, and the agent is gone at its `Stopped` event; a config reload ([`Pair::reconfigure_agent`]) is
//!   the XML written again, parsed and handed to `Agent::reconfigure`;
//!   `kill -9` ([`Pair::kill_agent`]) drops the core and its transactions
//!   with nothing sent; a restart ([`Pair::start_agent`]) builds a new
//!   `Agent` (a new Call-ID, no dialogs) with empty transaction tables.
//! * **The collector's shell** (`collector/src/daemon/`): a disk that
//!   writes at once — every bindings save and every commit the core asks
//!   for succeeds at the instant it is asked — and control requests
//!   ([`Pair::ask`]) answered through the core's effects;
//!   [`Pair::restart_collector`] is its `kill -9` and restart, with the
//!   bindings last saved or none.
//!
//! Addresses are fixed: the collector is [`COLLECTOR_ADDR`], the agent
//! [`AGENT_ADDR`], on different hosts so that the agent's subscriber-host
//! check and the collector's NOTIFY-source check both see real values.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use msr_agent::config::{AgentConfig, LoadSensor};
use msr_agent::core::{Agent, Event as AgentEvent, Identity, Transmit};
use msr_agent::load::{compute_load, Sample};
use msr_agent::notifier::SubscriptionInfo;
use msr_agent::registration::{self, RegistrationState};
use msr_collector::core::{AdminId, Backend, Collector, Effect, Event, Inbound, Route, Start};
use msr_collector::model::health::HealthEvent;
use msr_collector::operator::cluster::Cluster;
use msr_collector::operator::store::etcd::Member;
use msr_collector::operator::OperatorConfig;
use msr_collector::sip::registrar::RegistrarEvent;
use msr_collector::sip::subscriber::SubscriberEvent;
use msr_shared::admin::{Request as AdminRequest, Response as AdminResponse, ResponseData};
use msr_shared::event_package::LoadReport;
use msr_shared::sip::transaction::server::{Received, ServerTransactions};
use msr_shared::sip::transaction::{ClientTransactions, Outcome};
use msr_shared::sip::wire;
use msr_shared::sip::{self, Method, Request, SipMessage, StatusCode};
use msr_shared::subscription::SubscriptionState;
use tokio::time::Instant;

use crate::system::{self, AccountSpec, AgentSpec};

pub use msr_shared::sip::transaction::{T1, TIMER_F};

/// The collector's SIP address (its `[sip] listen`).
pub const COLLECTOR_ADDR: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 5060);
/// The agent's SIP address (`bind-addr`, `sip-port`).
pub const AGENT_ADDR: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)), 5070);
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

/// What the link does with one message (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Delivered after [`PairConfig::latency`].
    Deliver,
    /// Delivered after the latency plus this.
    Delay(Duration),
    /// Lost (this copy only: a retransmission is judged anew).
    Drop,
    /// The agent's endpoint reports the request's transaction failed at
    /// once, as it does when a stream connection fails (an agent request
    /// only; anything else is a drop: a UDP send reports nothing).
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
    /// A retransmission by the sender's transaction layer of a request it
    /// sent before (same branch).
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
    /// The host of the account's `realm`: the collector's address by
    /// default; another stands for a collector the agent reaches at an
    /// address it does not send from (a NAT, a virtual address), whose
    /// SUBSCRIBEs the agent refuses unless `allow_subscribers` lists it
    /// (SPEC §4). Every datagram reaches the collector all the same.
    pub realm_host: IpAddr,
    /// `<agent allow-subscribers>`.
    pub allow_subscribers: Vec<IpAddr>,
    /// The `<codec …/>` attributes (SPEC §15), e.g. `pcma="1" pcmu="2"`;
    /// `None` writes no `<codec>`: no `codecs:` line in the NOTIFYs.
    pub codecs: Option<String>,
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
            realm_host: COLLECTOR_ADDR.ip(),
            allow_subscribers: Vec::new(),
            codecs: None,
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

/// The running agent: its core, and what its shell and endpoint keep
/// (module docs).
#[derive(Debug)]
pub struct AgentSide {
    /// The product's agent core.
    pub core: Agent,
    /// The endpoint's client transactions, by the core's request id.
    client: ClientTransactions<u64>,
    /// The requests in flight, for the local `408` at Timer F (as the
    /// endpoint keeps them).
    requests: HashMap<u64, Request>,
    /// The endpoint's server transactions.
    server: ServerTransactions,
    /// The sampler's next tick; `None` once a shutdown began.
    next_sample: Option<Instant>,
    /// The sampler's period as last set.
    period: Duration,
}

/// A datagram on its way.
#[derive(Debug)]
enum Due {
    /// From the agent to the collector.
    ToCollector(Vec<u8>),
    /// From the collector to the agent.
    ToAgent(Vec<u8>),
}

/// The link's policy: a [`Fate`] for each message.
type Link = Box<dyn FnMut(&Packet) -> Fate>;

/// Two parties, a link and a clock (module docs).
pub struct Pair {
    /// The configuration the pair was built with (and the agent's part as
    /// last reloaded).
    pub config: PairConfig,
    start: Instant,
    now: Instant,
    /// The agent; `None` while it is not running.
    pub agent: Option<AgentSide>,
    /// The collector.
    pub collector: CollectorSide,
    /// What the agent's load sampler reads.
    calls: u32,
    link: Link,
    /// Every message sent, in order.
    pub trace: Vec<Packet>,
    /// The branches of the requests sent so far, either side's: a branch
    /// seen again is a retransmission.
    branches: HashSet<String>,
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
            link: Box::new(|_| Fate::Deliver),
            trace: Vec::new(),
            branches: HashSet::new(),
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
    /// [`stop_agent`](Self::stop_agent) finished): a new core from the
    /// config, a new Call-ID, no dialogs, no transactions; its first
    /// REGISTER is due now.
    pub fn start_agent(&mut self) {
        assert!(self.agent.is_none(), "the agent is running");
        let identity = Identity {
            contact_addr: AGENT_ADDR.ip(),
            contact_port: AGENT_ADDR.port(),
            iface: "lo".into(),
        };
        let core = Agent::new(self.now, self.agent_config(), identity, self.sample());
        let period = core.sample_interval();
        self.agent = Some(AgentSide {
            core,
            client: ClientTransactions::new(AGENT_ADDR, &registration::user_agent()),
            requests: HashMap::new(),
            server: ServerTransactions::new(),
            next_sample: Some(self.now + period),
            period,
        });
    }

    /// The agent's config as its parser reads [`agent_xml`].
    fn agent_config(&self) -> AgentConfig {
        let xml = agent_xml(&self.config);
        msr_agent::config::parse(&xml, Path::new("pair.xml"))
            .unwrap_or_else(|e| panic!("the harness's agent config: {e}\n{xml}"))
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
            .retain(|_, due| !matches!(due, Due::ToCollector(_)));
        self.settle();
    }

    /// `kill -9`: the agent's core and transactions are gone, nothing more
    /// is sent or answered until [`start_agent`](Self::start_agent).
    pub fn kill_agent(&mut self) {
        self.agent = None;
    }

    /// SIGTERM: the agent's graceful shutdown (`Agent::shutdown`) begins
    /// now; the agent is gone ([`agent_running`](Self::agent_running)
    /// false) once it is over.
    pub fn stop_agent(&mut self) {
        if let Some(agent) = self.agent.as_mut() {
            agent.core.shutdown(self.now);
            agent.next_sample = None;
        }
        self.settle();
    }

    /// Whether the agent runs (not killed, not stopped).
    pub fn agent_running(&self) -> bool {
        self.agent.is_some()
    }

    /// A config reload of the agent: `change` applied to the agent's part
    /// of the config, the XML written again, parsed and handed to
    /// `Agent::reconfigure` (the collector's part is not reloaded). A
    /// later [`start_agent`](Self::start_agent) reads the changed config.
    pub fn reconfigure_agent(&mut self, change: impl FnOnce(&mut PairConfig)) {
        change(&mut self.config);
        let config = self.agent_config();
        if let Some(agent) = self.agent.as_mut() {
            agent.core.reconfigure(self.now, config);
        }
        self.settle();
    }

    /// The agent's registration state, if it runs.
    pub fn registration_state(&self) -> Option<RegistrationState> {
        let agent = self.agent.as_ref()?;
        agent.core.registrations().next().map(|r| r.state())
    }

    /// The agent's subscriptions, if it runs.
    pub fn agent_subscriptions(&self) -> Option<Vec<SubscriptionInfo>> {
        self.agent
            .as_ref()
            .map(|a| a.core.notifier().subscriptions())
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
    /// retransmissions left out ([`sent`](Self::sent) has all).
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

    /// The earliest instant anything is due: a message, a core's or the
    /// agent's transactions' `poll_timeout`, the agent's next sample.
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

    /// One thing due at `now`: a datagram arriving, else the timers of
    /// both sides; `false` when nothing is due.
    fn step(&mut self) -> bool {
        let now = self.now;
        if let Some(entry) = self.queue.first_entry() {
            if entry.key().0 <= now {
                match entry.remove() {
                    Due::ToCollector(bytes) => self.collector.receive(now, &bytes),
                    Due::ToAgent(bytes) => {
                        let answer = self.agent.as_mut().and_then(|a| a.receive(now, &bytes));
                        if let Some(answer) = answer {
                            self.send(Party::Agent, answer);
                        }
                    }
                }
                return true;
            }
        }
        let sample = self.sample();
        let mut busy = false;
        if let Some(agent) = self.agent.as_mut() {
            busy |= agent.handle_timeout(now, sample);
        }
        if due(self.collector.core.poll_timeout(), now) {
            self.collector.core.handle_timeout(now);
            busy = true;
        }
        busy
    }

    /// Takes what both sides queued — datagrams to send, the shells'
    /// reactions to events — until nothing is left.
    fn settle(&mut self) {
        loop {
            let mut out = Vec::new();
            if let Some(agent) = self.agent.as_mut() {
                if agent.flush(self.now, &mut out) == Flushed::Stopped {
                    self.agent = None;
                }
            }
            let elapsed = self.elapsed();
            let sent = self.collector.settle(self.now, elapsed);
            if out.is_empty() && sent.is_empty() {
                return;
            }
            for bytes in out {
                self.send(Party::Agent, bytes);
            }
            for bytes in sent {
                self.send(Party::Collector, bytes);
            }
        }
    }

    /// A datagram `from` a side, through the link.
    fn send(&mut self, from: Party, bytes: Vec<u8>) {
        let message = SipMessage::try_from(bytes.as_slice()).unwrap_or_else(|e| {
            panic!(
                "the {from:?} sent what it cannot parse ({e}):\n{}",
                String::from_utf8_lossy(&bytes)
            )
        });
        let request = matches!(message, SipMessage::Request(_));
        let retransmission = request
            && !self
                .branches
                .insert(top_branch(&message).unwrap_or_default());
        let mut packet = Packet {
            at: self.elapsed(),
            from,
            message,
            fate: Fate::Deliver,
            retransmission,
        };
        packet.fate = (self.link)(&packet);
        let fate = packet.fate;
        let key = (
            packet.call_id().to_owned(),
            packet.header("CSeq").map(str::to_owned),
        );
        self.trace.push(packet);
        let at = match fate {
            Fate::Deliver => self.now + self.config.latency,
            Fate::Delay(d) => self.now + self.config.latency + d,
            Fate::Drop => return,
            Fate::Fail => {
                if let (Party::Agent, true, Some(agent)) = (from, request, self.agent.as_mut()) {
                    agent.fail(self.now, &key.0, key.1.as_deref());
                }
                return;
            }
        };
        let due = match from {
            Party::Agent => Due::ToCollector(bytes),
            Party::Collector => Due::ToAgent(bytes),
        };
        self.next_seq += 1;
        self.queue.insert((at, self.next_seq), due);
    }
}

/// Whether the agent is still running after a flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flushed {
    Running,
    /// Its shutdown is over (`Stopped`): the shell stops the endpoint.
    Stopped,
}

impl AgentSide {
    /// The earliest deadline of the core, its transactions and the
    /// sampler.
    fn poll_timeout(&self) -> Option<Instant> {
        [
            self.core.poll_timeout(),
            self.client.poll_timeout(),
            self.server.poll_timeout(),
            self.next_sample,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Runs what is due at `now` (`sample` is what the sampler would
    /// read); whether anything was.
    fn handle_timeout(&mut self, now: Instant, sample: Sample) -> bool {
        let mut busy = false;
        if due(self.core.poll_timeout(), now) {
            self.core.handle_timeout(now);
            busy = true;
        }
        if due(self.client.poll_timeout(), now) {
            self.client.handle_timeout(now);
            busy = true;
        }
        if due(self.server.poll_timeout(), now) {
            self.server.handle_timeout(now);
            busy = true;
        }
        if due(self.next_sample, now) {
            self.core.handle_sample(now, sample);
            self.next_sample = Some(now + self.period);
            busy = true;
        }
        busy
    }

    /// A datagram from the collector, as the endpoint takes it: a response
    /// to its client transaction (a final one to the core), a request to
    /// its server transactions (a new one to the core). The answer to
    /// send back, if any.
    fn receive(&mut self, now: Instant, bytes: &[u8]) -> Option<Vec<u8>> {
        let message = wire::decode(bytes, COLLECTOR_ADDR).unwrap_or_else(|e| {
            panic!(
                "the agent cannot read the collector's ({e}):\n{}",
                String::from_utf8_lossy(bytes)
            )
        });
        let request = match message {
            SipMessage::Response(response) => {
                if let Some((id, response)) = self.client.handle_response(now, response) {
                    self.requests.remove(&id);
                    self.core.handle_response(now, id, &response);
                }
                return None;
            }
            SipMessage::Request(request) => request,
        };
        let key = match self.server.handle_request(now, &request)? {
            Received::New(key) => key,
            Received::Answer(bytes) => return Some(bytes.to_vec()),
            Received::Absorbed => return None,
        };
        let Some(response) = self
            .core
            .handle_request(now, Some(COLLECTOR_ADDR), &request)
        else {
            self.server.abandon(&key);
            return None;
        };
        let final_response = response.status_code.code() >= 200;
        let bytes = wire::encode_response(response, &msr_agent::registration::user_agent());
        self.server
            .handle_response(now, &key, bytes.clone(), final_response, false);
        Some(bytes.to_vec())
    }

    /// The shell's flush and the endpoint's: the core's requests into
    /// client transactions, their datagrams into `out`, the transactions
    /// that timed out back to the core as a local `408` (RFC 3261
    /// §8.1.3.1), the core's events acted on; until nothing is left.
    fn flush(&mut self, now: Instant, out: &mut Vec<Vec<u8>>) -> Flushed {
        loop {
            let mut busy = false;
            while let Some(transmit) = self.core.poll_transmit() {
                busy = true;
                self.start(now, transmit);
            }
            while let Some(datagram) = self.client.poll_transmit() {
                busy = true;
                out.push(datagram.bytes.to_vec());
            }
            while let Some((id, outcome)) = self.client.poll_outcome() {
                busy = true;
                let response = match (outcome, self.requests.remove(&id)) {
                    (Outcome::Response(response), _) => response,
                    (Outcome::TimedOut, Some(request)) => {
                        sip::response(&request, StatusCode::RequestTimeout, None)
                    }
                    (Outcome::TimedOut, None) => continue,
                };
                self.core.handle_response(now, id, &response);
            }
            while let Some(event) = self.core.poll_event() {
                busy = true;
                match event {
                    AgentEvent::Stopped => return Flushed::Stopped,
                    // The shell stops as on SIGTERM.
                    AgentEvent::ExitWhenDrained => {
                        self.core.shutdown(now);
                        self.next_sample = None;
                    }
                }
            }
            // The shell's ticker follows the core's interval (SPEC §4,
            // near the top), restarted from now when it changes.
            let period = self.core.sample_interval();
            if self.next_sample.is_some() && period != self.period {
                self.period = period;
                self.next_sample = Some(now + period);
            }
            if !busy {
                return Flushed::Running;
            }
        }
    }

    /// Starts the client transaction of a request of the core; one that
    /// cannot start fails at once (as `SipEndpoint::send_request` does).
    fn start(&mut self, now: Instant, transmit: Transmit) {
        let Transmit { id, request } = transmit;
        match self.client.send(now, id, COLLECTOR_ADDR, request.clone()) {
            Ok(()) => {
                self.requests.insert(id, request);
            }
            Err(e) => self.core.handle_failure(now, id, &e.to_string()),
        }
    }

    /// [`Fate::Fail`]: the transaction of the request with this `Call-ID`
    /// and `CSeq` fails at the transport.
    fn fail(&mut self, now: Instant, call_id: &str, cseq: Option<&str>) {
        let found = self.requests.iter().find(|(_, r)| {
            sip::call_id(&r.headers) == Some(call_id) && sip::header(&r.headers, "CSeq") == cseq
        });
        if let Some(id) = found.map(|(id, _)| *id) {
            self.requests.remove(&id);
            self.client.cancel(&id);
            self.core.handle_failure(now, id, "transport failure");
        }
    }
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

    /// A datagram from the agent, as the collector's UDP reader takes it.
    fn receive(&mut self, now: Instant, bytes: &[u8]) {
        let message = wire::decode(bytes, AGENT_ADDR).unwrap_or_else(|e| {
            panic!(
                "the collector cannot read the agent's ({e}):\n{}",
                String::from_utf8_lossy(bytes)
            )
        });
        self.core.handle_message(
            now,
            Inbound {
                route: Route::Udp(AGENT_ADDR),
                source: AGENT_ADDR,
                message,
                peer_certificate: None,
            },
        );
    }

    /// The shell's part (module docs): the core's datagrams (returned, to
    /// send), its effects carried out at once, its events recorded.
    fn settle(&mut self, now: Instant, elapsed: Duration) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        loop {
            let mut busy = false;
            while let Some(t) = self.core.poll_transmit() {
                busy = true;
                out.push(t.bytes.to_vec());
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
            // `/metrics` is the shell's; the pair reads events.
            while self.core.poll_count().is_some() {}
            if !busy {
                return out;
            }
        }
    }
}

/// The agent's XML config for the pair, written as every system test's
/// ([`system::agent_xml`]) and read by the agent's own parser; its
/// `<agent sip-port>` is [`AGENT_ADDR`]'s and its realm
/// [`PairConfig::realm_host`]. The engine's ports are reported in the
/// REGISTER's Contact; nothing is there, and its probe is off.
fn agent_xml(c: &PairConfig) -> String {
    let spec = AgentSpec {
        accounts: vec![AccountSpec {
            msr: c.msr.clone(),
            realm: format!(
                "sip:{}",
                SocketAddr::new(c.realm_host, COLLECTOR_ADDR.port())
            ),
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
        agent_attributes: if c.allow_subscribers.is_empty() {
            String::new()
        } else {
            let list: Vec<String> = c.allow_subscribers.iter().map(IpAddr::to_string).collect();
            format!(r#"allow-subscribers="{}""#, list.join(" "))
        },
        codecs: c.codecs.clone(),
        ..AgentSpec::default()
    };
    system::agent_xml(&spec, Path::new("/nonexistent/pair.calls"))
}

/// Whether a deadline is due at `now`.
fn due(deadline: Option<Instant>, now: Instant) -> bool {
    deadline.is_some_and(|t| t <= now)
}

/// The top `Via` branch of a message.
fn top_branch(message: &SipMessage) -> Option<String> {
    let headers = match message {
        SipMessage::Request(r) => &r.headers,
        SipMessage::Response(r) => &r.headers,
    };
    sip::header(headers, "Via").and_then(|v| sip::param(v, "branch"))
}

/// Whether a NOTIFY's `Subscription-State` begins with `state`.
pub fn notify_state(p: &Packet, state: &str) -> bool {
    p.method() == Some(&Method::Notify)
        && p.header("Subscription-State")
            .is_some_and(|s| s.starts_with(state))
}
