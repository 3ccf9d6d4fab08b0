//! [`Agent`]: the agent's cores and the glue between them, sans-IO
//! (quinn-proto's `Endpoint` shape, as the collector's `Collector`).
//!
//! It holds one [`Registration`] per account (and the removed accounts'
//! while their unregister is in flight), the [`Notifier`], the
//! [`EngineProbe`] and the [`Drain`], and decides what one core's outcome
//! means for the others:
//!
//! * every request it sends gets an id ([`Transmit::id`]); the final
//!   response or failure of that id goes back to the core that sent it
//!   (`Origin`);
//! * SPEC §3: a registrar that answers a NOTIFY `481` may have lost the
//!   binding: that account REGISTERs again at once (`glue.rs`); so does an
//!   account whose registrar's connection closed (RFC 5626 §4.4);
//! * SPEC §14: each change of the engine's state is logged once and told
//!   to every subscription; every sample's `calls` feeds the drain, and a
//!   drain that is over with `exit-when-empty` asks the shell to stop
//!   ([`Event::ExitWhenDrained`]);
//! * SPEC §2 hot reload: accounts added, changed and removed, the probe and
//!   the notifier reconfigured (`reload.rs`).
//!
//! Inputs: [`handle_request`](Agent::handle_request),
//! [`handle_response`](Agent::handle_response),
//! [`handle_failure`](Agent::handle_failure),
//! [`handle_closed`](Agent::handle_closed),
//! [`handle_sample`](Agent::handle_sample), the ng exchange's outcome
//! ([`handle_ng_answer`](Agent::handle_ng_answer),
//! [`handle_ng_miss`](Agent::handle_ng_miss)),
//! [`handle_resolved`](Agent::handle_resolved),
//! [`handle_control`](Agent::handle_control),
//! [`handle_timeout`](Agent::handle_timeout),
//! [`reconfigure`](Agent::reconfigure) and [`shutdown`](Agent::shutdown).
//! Outputs: [`poll_transmit`](Agent::poll_transmit),
//! [`poll_timeout`](Agent::poll_timeout) and
//! [`poll_event`](Agent::poll_event).
//!
//! Shutdown, in two phases so that a registrar never sees an unregister
//! before the final NOTIFY of a subscription it holds (it would end the
//! subscription and answer that NOTIFY 481):
//!
//! 1. the final `deactivated` NOTIFYs, then until each is answered (any
//!    final response, a transaction timeout or a transport failure), at most
//!    [`FINAL_NOTIFY_GRACE`](crate::notifier::FINAL_NOTIFY_GRACE);
//! 2. the `Expires: 0` REGISTERs for every account, then until each is
//!    answered, at most [`SHUTDOWN_GRACE`].
//!
//! Then [`Event::Stopped`]. The whole shutdown thus takes at most
//! `FINAL_NOTIFY_GRACE + SHUTDOWN_GRACE` (4 s), within `main.rs`'s exit
//! deadline.
//!
//! Architecture Invariant: no I/O, no clock, no task; `now` is always
//! given.

mod glue;
mod reload;
mod subscribers;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use msr_shared::engine::{EngineAddresses, EngineTransport};
use msr_shared::event_package::{EngineState, Service};
use msr_shared::sip::{Request, Response};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::config::{Account, AgentConfig, EngineProbeMode, Transports};
use crate::control::{ControlAnswer, ControlRequest};
use crate::drain::{Drain, WhenDrained};
use crate::engine_probe::{EngineProbe, ProbeConfig, ProbeId, ProbeMethod, ProbeTransport};
use crate::load::Sample;
use crate::notifier::{Notifier, SubscriptionId};
use crate::registration::{Registration, RegistrationConfig};
pub use subscribers::Resolution;
use subscribers::{notifier_config, registrar_addrs};

/// How long shutdown waits for the unregisters to be answered (after up to
/// [`FINAL_NOTIFY_GRACE`](crate::notifier::FINAL_NOTIFY_GRACE) for the
/// final NOTIFYs).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// An account's identity across reloads: `(msr_name, realm URI)`.
type AccountKey = (String, String);

fn account_key(a: &Account) -> AccountKey {
    (a.msr_name.clone(), a.realm.uri.clone())
}

/// Who sent the request with a given id.
#[derive(Debug, Clone)]
enum Origin {
    Register(AccountKey),
    /// A NOTIFY: its subscription and CSeq number.
    Notify(SubscriptionId, u32),
    /// An OPTIONS of the engine probe (SPEC §14).
    Probe(ProbeId),
}

/// A request to send; its final response or failure comes back with `id`
/// ([`Agent::handle_response`], [`Agent::handle_failure`]).
#[derive(Debug)]
pub struct Transmit {
    /// The id to pass to `SipEndpoint::send_request`.
    pub id: u64,
    /// The request (Via and Max-Forwards are the endpoint's).
    pub request: Request,
}

/// How a request the agent sent ended.
#[derive(Debug, Clone, Copy)]
enum Outcome<'a> {
    /// Its final response (a locally generated 408 for Timer F included).
    Response(&'a Response),
    /// No final response at all: the transport failed, for this reason.
    Failure(&'a str),
}

/// What the shell must act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Drained with `exit-when-empty` (SPEC §14): the shell stops as on
    /// SIGTERM, calling [`Agent::shutdown`].
    ExitWhenDrained,
    /// The shutdown is over (both phases): the shell stops the endpoint.
    Stopped,
}

/// Where the agent stands between start and stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    /// Shutdown's phase 1: the final NOTIFYs are in flight.
    FinalNotifies,
    /// Shutdown's phase 2: the unregisters, answered before the deadline.
    Unregistering {
        deadline: Instant,
    },
    Stopped,
}

/// Where the agent can be reached and what it reports of itself: the
/// shell finds these out at start (interfaces, the bound port).
#[derive(Debug, Clone)]
pub struct Identity {
    /// The address put in Contacts (SPEC §3).
    pub contact_addr: IpAddr,
    /// The agent's own SIP port (`<agent sip-port>`, as bound).
    pub contact_port: u16,
    /// The interface owning `contact_addr` (`iface=` of the Contact).
    pub iface: String,
}

/// The agent's state machine (see the module docs).
#[derive(Debug)]
pub struct Agent {
    config: AgentConfig,
    identity: Identity,
    registrations: HashMap<AccountKey, Registration>,
    /// Removed accounts whose unregister is still in flight.
    retiring: Vec<Registration>,
    notifier: Notifier,
    /// The requests sent and not yet answered, by id.
    requests: HashMap<u64, Origin>,
    next_request_id: u64,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
    /// The registrars' host names and their last resolved addresses.
    resolved: BTreeMap<String, BTreeSet<IpAddr>>,
    /// The media engine's liveness probe, `None` when it is off.
    probe: Option<EngineProbe>,
    /// The MSR-side drain (SPEC §14); it outlives config reloads.
    drain: Drain,
    /// [`Event::ExitWhenDrained`] was given.
    exit_asked: bool,
    phase: Phase,
}

impl Agent {
    /// The agent of `config` at `now`, with its first sample: every
    /// account REGISTERs at once.
    pub fn new(now: Instant, config: AgentConfig, identity: Identity, initial: Sample) -> Self {
        let contact = host_port(identity.contact_addr, identity.contact_port);
        let resolved = BTreeMap::new();
        let notifier = Notifier::new(notifier_config(&config, &contact, &resolved), initial);
        let probe = probe_config(&config, identity.contact_addr, identity.contact_port)
            .map(|c| EngineProbe::new(c, now));
        if probe.is_none() {
            info!(
                engine_probe = %config.agent.engine_probe,
                "the media engine is not probed: notifies say engine: unchecked"
            );
        }
        let mut agent = Self {
            config,
            identity,
            registrations: HashMap::new(),
            retiring: Vec::new(),
            notifier,
            requests: HashMap::new(),
            next_request_id: 1,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            resolved,
            probe,
            drain: Drain::new(now, initial.calls),
            exit_asked: false,
            phase: Phase::Running,
        };
        for account in agent.config.accounts.clone() {
            agent.add_account(now, &account);
        }
        agent
    }

    /// The config in force (what was bound at start kept, see
    /// [`reconfigure`](Self::reconfigure)).
    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    /// The notifier (for the shell's sampling interval and tests).
    pub fn notifier(&self) -> &Notifier {
        &self.notifier
    }

    /// The accounts' registration clients, in no order (for tests that
    /// look at a registration's state; the removed accounts' still
    /// unregistering are not among them).
    pub fn registrations(&self) -> impl Iterator<Item = &Registration> {
        self.registrations.values()
    }

    /// The wait for the next load sample (SPEC §2, §4): near the top the
    /// agent samples as often as it may notify.
    pub fn sample_interval(&self) -> Duration {
        self.notifier
            .sample_interval(self.config.agent.sample_interval())
    }

    /// Whether the engine probe counts the ng exchanges (SPEC §14,
    /// `engine-probe="ng"`).
    pub fn probes_by_ng(&self) -> bool {
        self.probe.as_ref().is_some_and(is_ng)
    }

    fn registration_config(&self, account: &Account) -> RegistrationConfig {
        RegistrationConfig {
            account: account.clone(),
            contact_addr: self.identity.contact_addr,
            contact_port: self.identity.contact_port,
            iface: self.identity.iface.clone(),
            engine: engine_addresses(&self.config, self.identity.contact_addr),
            expires: self.config.agent.register_expires,
        }
    }

    fn add_account(&mut self, now: Instant, account: &Account) {
        let reg = Registration::new(self.registration_config(account), now);
        self.registrations.insert(account_key(account), reg);
    }

    fn find_registration(&mut self, key: &AccountKey) -> Option<&mut Registration> {
        if self.registrations.contains_key(key) {
            return self.registrations.get_mut(key);
        }
        self.retiring.iter_mut().find(|r| {
            let a = &r.config().account;
            a.msr_name == key.0 && a.realm.uri == key.1
        })
    }

    /// Answers an incoming request from `source` (as the transport saw
    /// it); `None` for one never answered (ACK).
    pub fn handle_request(
        &mut self,
        now: Instant,
        source: Option<SocketAddr>,
        request: &Request,
    ) -> Option<Response> {
        let response = self.notifier.handle_request(now, source, request);
        self.after_sip(now);
        response
    }

    /// The final response to the request sent with `id`: to the core that
    /// sent it.
    pub fn handle_response(&mut self, now: Instant, id: u64, response: &Response) {
        self.handle_outcome(now, id, Outcome::Response(response));
    }

    /// The request sent with `id` got no final response at all (its
    /// connection failed, or it could not be sent): to the core that sent
    /// it.
    pub fn handle_failure(&mut self, now: Instant, id: u64, reason: &str) {
        self.handle_outcome(now, id, Outcome::Failure(reason));
    }

    /// How the request sent with `id` ended, to the core that sent it.
    fn handle_outcome(&mut self, now: Instant, id: u64, outcome: Outcome<'_>) {
        match (self.requests.remove(&id), outcome) {
            (Some(Origin::Register(key)), outcome) => {
                if let Some(reg) = self.find_registration(&key) {
                    match outcome {
                        Outcome::Response(response) => reg.handle_response(now, response),
                        Outcome::Failure(reason) => reg.handle_failure(now, reason),
                    }
                }
            }
            (Some(Origin::Notify(sub, _)), Outcome::Response(response)) => {
                self.notifier.handle_notify_response(now, sub, response)
            }
            (Some(Origin::Notify(sub, cseq)), Outcome::Failure(reason)) => {
                self.notifier.handle_notify_failure(now, sub, cseq, reason)
            }
            (Some(Origin::Probe(probe_id)), outcome) => {
                if let Some(probe) = self.probe.as_mut() {
                    match outcome {
                        Outcome::Response(_) => probe.handle_response(now, probe_id),
                        Outcome::Failure(reason) => probe.handle_failure(now, probe_id, reason),
                    }
                }
            }
            (None, Outcome::Response(_)) => debug!(id, "response to an unknown request"),
            (None, Outcome::Failure(_)) => debug!(id, "failure of an unknown request"),
        }
        self.after_sip(now);
    }

    /// A stream connection to `remote` closed (see `glue.rs`).
    pub fn handle_closed(&mut self, now: Instant, remote: SocketAddr) {
        self.reregister_over(now, remote);
        self.after_sip(now);
    }

    /// A new load sample: to the notifier and the drain.
    pub fn handle_sample(&mut self, now: Instant, sample: Sample) {
        self.notifier.on_sample(now, sample);
        self.drain.on_calls(now, sample.calls);
        self.glue(now);
    }

    /// An ng exchange ended with rtpengine's answer: with the ng probe, a
    /// probe answered (SPEC §14).
    pub fn handle_ng_answer(&mut self, now: Instant) {
        if let Some(probe) = self.probe.as_mut().filter(|p| is_ng(p)) {
            probe.handle_answer(now);
        }
        self.glue(now);
    }

    /// An ng exchange ended (or was not tried) without an answer: with
    /// the ng probe, a miss for `reason` (SPEC §14).
    pub fn handle_ng_miss(&mut self, now: Instant, reason: &str) {
        if let Some(probe) = self.probe.as_mut().filter(|p| is_ng(p)) {
            probe.handle_miss(now, reason);
        }
        self.glue(now);
    }

    /// When [`handle_timeout`](Self::handle_timeout) must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Running => self
                .registrations
                .values()
                .filter_map(Registration::poll_timeout)
                .chain(self.notifier.poll_timeout())
                .chain(self.probe.as_ref().and_then(EngineProbe::poll_timeout))
                .chain(self.drain.poll_timeout())
                .min(),
            // Only the wait for the final NOTIFYs runs now.
            Phase::FinalNotifies => self.notifier.poll_timeout(),
            Phase::Unregistering { deadline } => Some(deadline),
            Phase::Stopped => None,
        }
    }

    /// Runs every core's timers due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.phase {
            Phase::Running => {
                for reg in self.registrations.values_mut() {
                    reg.handle_timeout(now);
                }
                self.notifier.handle_timeout(now);
                if let Some(probe) = self.probe.as_mut() {
                    probe.handle_timeout(now);
                }
            }
            Phase::FinalNotifies => self.notifier.handle_timeout(now),
            Phase::Unregistering { deadline } if now >= deadline => {
                warn!("shutdown grace period over, some unregisters unanswered");
                self.stop();
            }
            Phase::Unregistering { .. } | Phase::Stopped => {}
        }
        self.glue(now);
    }

    /// The next request to send. Its id is remembered until its final
    /// response or failure comes back.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        if self.transmits.is_empty() {
            self.collect_transmits();
        }
        self.transmits.pop_front()
    }

    fn collect_transmits(&mut self) {
        let mut out = Vec::new();
        for (key, reg) in &mut self.registrations {
            while let Some(request) = reg.poll_transmit() {
                out.push((Origin::Register(key.clone()), request));
            }
        }
        for reg in &mut self.retiring {
            let key = account_key(&reg.config().account);
            while let Some(request) = reg.poll_transmit() {
                out.push((Origin::Register(key.clone()), request));
            }
        }
        while let Some(t) = self.notifier.poll_transmit() {
            out.push((Origin::Notify(t.subscription, t.cseq), t.request));
        }
        if let Some(probe) = self.probe.as_mut() {
            while let Some(t) = probe.poll_transmit() {
                out.push((Origin::Probe(t.id), t.request));
            }
        }
        for (origin, request) in out {
            let id = self.next_request_id;
            self.next_request_id += 1;
            self.requests.insert(id, origin);
            self.transmits.push_back(Transmit { id, request });
        }
    }

    /// The next event for the shell.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// A request on the control socket (SPEC §14's MSR-side drain).
    pub fn handle_control(&mut self, now: Instant, request: ControlRequest) -> ControlAnswer {
        match request {
            ControlRequest::Drain(when) => {
                if self.drain.service() != Service::Draining {
                    info!(
                        exit_when_empty = when == WhenDrained::Exit,
                        calls = self.drain.status(now).calls,
                        "drain: no new legs from now on, the live ones stay"
                    );
                }
                self.drain.drain(when);
            }
            ControlRequest::Undrain => {
                if self.drain.service() == Service::Draining {
                    info!("undrain: new legs welcome again");
                }
                self.drain.undrain();
            }
            ControlRequest::Status => {}
        }
        self.notifier.set_service(now, self.drain.service());
        self.glue(now);
        let status = self.drain.status(now);
        ControlAnswer {
            service: status.service,
            engine: self
                .probe
                .as_ref()
                .map_or(EngineState::Unchecked, EngineProbe::state),
            calls: status.calls,
            drained: status.drained,
            when_drained: status.when_drained,
        }
    }

    /// Starts the two-phase shutdown of the module docs: the final
    /// NOTIFYs now, the unregisters once they are answered.
    pub fn shutdown(&mut self, now: Instant) {
        if self.phase != Phase::Running {
            return;
        }
        info!("shutting down");
        self.notifier.shutdown(now);
        self.phase = Phase::FinalNotifies;
        self.glue(now);
    }

    fn stop(&mut self) {
        self.phase = Phase::Stopped;
        self.events.push_back(Event::Stopped);
    }

    /// After a SIP event: a removed account whose unregister is over is
    /// forgotten; then the glue.
    fn after_sip(&mut self, now: Instant) {
        self.retiring.retain(|r| !r.is_finished());
        self.glue(now);
    }
}

/// The media engine's addresses as the core can reach them (SPEC §3): an
/// unspecified `bind-addr` is reported as the contact address. `None` for
/// `<transport port="0">`: no engine port to report.
fn engine_addresses(config: &AgentConfig, contact_addr: IpAddr) -> Option<EngineAddresses> {
    if config.transport.port == 0 {
        return None;
    }
    let reachable = |ip: IpAddr| {
        if ip.is_unspecified() {
            contact_addr
        } else {
            ip
        }
    };
    Some(EngineAddresses {
        sip: SocketAddr::new(reachable(config.transport.bind_addr), config.transport.port),
        transport: match config.transport.transport {
            Transports::Udp => EngineTransport::Udp,
            Transports::Tcp => EngineTransport::Tcp,
            Transports::UdpTcp => EngineTransport::UdpTcp,
        },
        mcc: config
            .mcc
            .map(|m| SocketAddr::new(reachable(m.ip()), m.port())),
    })
}

/// The engine probe for `config` (SPEC §14, `<agent engine-probe>`);
/// `None` when it is off (or, for `sip`, no engine port is known).
fn probe_config(config: &AgentConfig, contact_addr: IpAddr, sip_port: u16) -> Option<ProbeConfig> {
    let method = match config.engine_probe() {
        EngineProbeMode::Off | EngineProbeMode::Auto => return None,
        EngineProbeMode::Ng => ProbeMethod::NgStatistics {
            target: config.ng_address()?,
        },
        EngineProbeMode::Sip => ProbeMethod::SipOptions {
            target: engine_addresses(config, contact_addr)?.sip,
            transport: match config.transport.transport {
                Transports::Tcp => ProbeTransport::Tcp,
                Transports::Udp | Transports::UdpTcp => ProbeTransport::Udp,
            },
            local_uri: format!("sip:msr-agent@{}", host_port(contact_addr, sip_port)),
        },
    };
    Some(ProbeConfig {
        method,
        interval: Duration::from_millis(config.agent.engine_probe_interval_ms),
        timeout: Duration::from_millis(config.agent.engine_probe_timeout_ms),
        misses: config.agent.engine_probe_misses,
    })
}

fn host_port(addr: IpAddr, port: u16) -> String {
    SocketAddr::new(addr, port).to_string()
}

fn is_ng(probe: &EngineProbe) -> bool {
    matches!(probe.config().method, ProbeMethod::NgStatistics { .. })
}
