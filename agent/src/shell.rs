//! The agent's async shell: the one task that owns the
//! [`SipEndpoint`] and drives the sans-IO cores.
//!
//! One `tokio::select!` loop over a closed set of events:
//!
//! * a SIP event (incoming request → [`Notifier::handle_request`]; final
//!   response or failure of a request we sent → the core that sent it, found
//!   through the request id);
//! * the earliest core deadline (`sleep_until(min(poll_timeout))`);
//! * the sampling tick (the [`LoadSampler`] runs in `spawn_blocking`, it reads
//!   `/proc`); with the `rtpengine` calls source the tick first asks
//!   rtpengine over its ng port ([`NgClient`](crate::load::rtpengine::NgClient)) and the sample is taken
//!   when the exchange ends, with its answer;
//! * a datagram from rtpengine's ng port (a connected UDP socket of the
//!   agent's own, so only that address is heard);
//! * a config reload from [`crate::config::watch()`];
//! * a request on the control socket (`msr-agent drain`, [`crate::control`]);
//! * the end of a resolution of the registrars' host names (below);
//! * shutdown (the `CancellationToken`).
//!
//! After every event each core's transmit queue is flushed into the endpoint.
//!
//! The engine probe ([`EngineProbe`], SPEC §14) sends its OPTIONS through
//! the same endpoint (a request id whose [`Origin`] is the probe), or, with
//! the `rtpengine` source, counts each ng exchange of the sampling tick.
//! Each change of the engine's state is logged once and handed to the
//! notifier, which tells every subscription at once. The drain
//! ([`Drain`]) is fed every sample's `calls`; once drained with
//! `exit-when-empty`, the loop ends as on SIGTERM (the shutdown below) and
//! the agent exits 0.
//!
//! Shutdown, in two steps so that a registrar never sees an unregister
//! before the final NOTIFY of a subscription it holds (it would end the
//! subscription and answer that NOTIFY 481):
//!
//! 1. the final `deactivated` NOTIFYs, then until each is answered (any
//!    final response, a transaction timeout or a transport failure), at most
//!    [`FINAL_NOTIFY_GRACE`](crate::notifier::FINAL_NOTIFY_GRACE);
//! 2. the `Expires: 0` REGISTERs for every account, then until each is
//!    answered, at most [`SHUTDOWN_GRACE`].
//!
//! The whole shutdown thus takes at most `FINAL_NOTIFY_GRACE +
//! SHUTDOWN_GRACE` (4 s), within `main.rs`'s exit deadline.
//!
//! Who may SUBSCRIBE (SPEC §4): the realm hosts written as IP addresses and
//! `<agent allow-subscribers>` are known at once; realm hosts written as
//! names are resolved at start and after each config reload, in a task (at
//! most [`RESOLVE_TIMEOUT`] per name), never per request. Until a name is
//! resolved its registrar cannot subscribe; a name that fails to resolve
//! keeps the addresses it had (logged at warn).
//!
//! Architecture Invariant: only this module (and `lib.rs`) touches the
//! clock, sockets and tasks; the cores receive `now` as an argument.

mod control;
mod ng;
mod reload;
mod subscribers;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use msr_shared::engine::{EngineAddresses, EngineTransport};
use msr_shared::event_package::EngineState;
use msr_shared::sip::{SipEndpoint, SipEvent};
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::config::{self, Account, AgentConfig, ConfigError, EngineProbeMode, Transports};
use crate::control::{ControlAnswer, ControlRequest};
use crate::drain::{Drain, WhenDrained};
use crate::engine_probe::{EngineProbe, ProbeConfig, ProbeId, ProbeMethod, ProbeTransport};
use crate::error::AgentError;
use crate::load::rtpengine::{Answer, AskOutcome};
use crate::load::{EngineSessions, LoadSampler, Sample};
use crate::notifier::{Notifier, SubscriptionId};
use crate::registration::{Registration, RegistrationConfig, RegistrationState};
use ng::{NgLink, NG_MAX_DATAGRAM};
use subscribers::{notifier_config, registrar_addrs};

/// How long shutdown waits for the unregisters to be answered (after up to
/// [`FINAL_NOTIFY_GRACE`](crate::notifier::FINAL_NOTIFY_GRACE) for the
/// final NOTIFYs).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// The longest a registrar's host name may take to resolve.
pub(crate) const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// An account's identity across reloads: `(msr_name, realm URI)`.
type AccountKey = (String, String);

/// Who sent the request with a given id.
#[derive(Debug, Clone)]
enum Origin {
    Register(AccountKey),
    /// A NOTIFY: its subscription and CSeq number.
    Notify(SubscriptionId, u32),
    /// An OPTIONS of the engine probe (SPEC §14).
    Probe(ProbeId),
}

/// The name of the interface owning `addr` (`lo` on loopback): the one
/// that has it, else the one whose network holds it (a loopback alias such
/// as 127.0.0.62, which Linux serves from `lo`'s 127.0.0.0/8 without an
/// address of its own); `None` when none does (or `addr` is unspecified).
pub fn interface_name(addr: IpAddr) -> Option<String> {
    let interfaces = match if_addrs::get_if_addrs() {
        Ok(i) => i,
        Err(e) => {
            warn!(error = %e, "cannot list network interfaces");
            return None;
        }
    };
    if let Some(exact) = interfaces.iter().find(|i| i.ip() == addr) {
        return Some(exact.name.clone());
    }
    interfaces
        .into_iter()
        .find(|i| network_holds(&i.addr, addr))
        .map(|i| i.name)
}

/// Whether the network of the interface address `on` (its address and
/// netmask) holds `addr`.
fn network_holds(on: &if_addrs::IfAddr, addr: IpAddr) -> bool {
    match (on, addr) {
        (if_addrs::IfAddr::V4(v4), IpAddr::V4(a)) => {
            let mask = u32::from(v4.netmask);
            mask != 0 && u32::from(v4.ip) & mask == u32::from(a) & mask
        }
        (if_addrs::IfAddr::V6(v6), IpAddr::V6(a)) => {
            let mask = u128::from(v6.netmask);
            mask != 0 && u128::from(v6.ip) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

/// The address put in Contacts: `bind-addr`, or for an unspecified
/// `bind-addr` the first non-loopback address of the host of the same
/// family (falling back to loopback).
fn contact_addr(bind: IpAddr) -> IpAddr {
    if !bind.is_unspecified() {
        return bind;
    }
    let found = if_addrs::get_if_addrs().ok().and_then(|list| {
        list.into_iter()
            .find(|i| !i.is_loopback() && i.ip().is_ipv4() == bind.is_ipv4())
            .map(|i| i.ip())
    });
    found.unwrap_or(match bind {
        IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
    })
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

/// The shell's state.
pub(crate) struct Shell {
    endpoint: SipEndpoint,
    config: AgentConfig,
    contact_addr: IpAddr,
    iface: String,
    registrations: HashMap<AccountKey, Registration>,
    /// Removed accounts whose unregister is still in flight.
    retiring: Vec<Registration>,
    notifier: Notifier,
    sampler: Option<LoadSampler>,
    /// The `rtpengine` calls source's link, `None` for the other sources.
    ng: Option<NgLink>,
    /// The engine's answer for a sample that is to be taken now: set when
    /// an ng exchange started by a tick ends, or at a tick inside the
    /// exchange's backoff.
    engine_ready: Option<EngineSessions>,
    requests: HashMap<u64, Origin>,
    next_request_id: u64,
    /// The registrars' host names and their last resolved addresses.
    resolved: BTreeMap<String, BTreeSet<IpAddr>>,
    /// The media engine's liveness probe, `None` when it is off.
    probe: Option<EngineProbe>,
    /// The MSR-side drain (SPEC §14); it outlives config reloads.
    drain: Drain,
}

fn account_key(a: &Account) -> AccountKey {
    (a.msr_name.clone(), a.realm.uri.clone())
}

impl Shell {
    /// Builds the shell around a bound endpoint and takes the first sample.
    pub(crate) async fn new(endpoint: SipEndpoint, config: AgentConfig) -> Self {
        let contact_addr = contact_addr(config.transport.bind_addr);
        let iface = interface_name(contact_addr).unwrap_or_else(|| {
            warn!(addr = %contact_addr, "no interface owns the contact address, using iface=unknown");
            "unknown".to_owned()
        });
        let mut sampler = LoadSampler::new(&config.media, &config.general, &config.agent);
        let mut ng = NgLink::for_config(&config);
        let now = Instant::now();
        let mut probe = probe_config(&config, contact_addr, endpoint.local_addr().port())
            .map(|c| EngineProbe::new(c, now));
        if let Some(link) = ng.as_mut() {
            // The first report carries rtpengine's answer too, not "full"
            // for want of one.
            let answer = link.exchange().await;
            if let Some(probe) = probe.as_mut().filter(|p| is_ng(p)) {
                match answer {
                    EngineSessions::Known(_) => probe.handle_answer(Instant::now()),
                    EngineSessions::Unavailable => {
                        probe.handle_miss(Instant::now(), "no answer to the ng statistics")
                    }
                }
            }
            sampler.set_engine_sessions(answer);
        }
        let (sampler, initial) = match tokio::task::spawn_blocking(move || {
            let s = sampler.sample();
            (sampler, s)
        })
        .await
        {
            Ok((sampler, s)) => (Some(sampler), s),
            Err(e) => {
                warn!(error = %e, "first load sample failed");
                let fresh = LoadSampler::new(&config.media, &config.general, &config.agent);
                (
                    Some(fresh),
                    Sample {
                        load: 0,
                        cpu: 0,
                        calls: 0,
                        max_calls: config.general.max_calls,
                    },
                )
            }
        };
        let contact = host_port(contact_addr, endpoint.local_addr().port());
        let resolved = BTreeMap::new();
        let notifier = Notifier::new(notifier_config(&config, &contact, &resolved), initial);
        let drain = Drain::new(Instant::now(), initial.calls);
        if probe.is_none() {
            info!(
                engine_probe = %config.agent.engine_probe,
                "the media engine is not probed: notifies say engine: unchecked"
            );
        }
        Self {
            endpoint,
            config,
            contact_addr,
            iface,
            registrations: HashMap::new(),
            retiring: Vec::new(),
            notifier,
            sampler,
            ng,
            engine_ready: None,
            requests: HashMap::new(),
            next_request_id: 1,
            resolved,
            probe,
            drain,
        }
    }

    fn registration_config(&self, account: &Account) -> RegistrationConfig {
        RegistrationConfig {
            account: account.clone(),
            contact_addr: self.contact_addr,
            contact_port: self.endpoint.local_addr().port(),
            iface: self.iface.clone(),
            engine: engine_addresses(&self.config, self.contact_addr),
            expires: self.config.agent.register_expires,
        }
    }

    fn add_account(&mut self, now: Instant, account: &Account) {
        let reg = Registration::new(self.registration_config(account), now);
        self.registrations.insert(account_key(account), reg);
    }

    /// Runs until `shutdown` is cancelled (then the graceful shutdown) or
    /// the endpoint stops.
    pub(crate) async fn run(
        mut self,
        config_path: Option<PathBuf>,
        control_socket: Option<PathBuf>,
        shutdown: CancellationToken,
    ) -> Result<(), AgentError> {
        let now = Instant::now();
        let accounts = self.config.accounts.clone();
        for account in &accounts {
            self.add_account(now, account);
        }
        let (mut reloads, _watch_guard) = match config_path {
            Some(path) => {
                let (rx, guard) = config::watch(path);
                (Some(rx), Some(guard))
            }
            None => (None, None),
        };
        let mut ticker_period = self.sample_interval();
        let mut ticker = new_ticker(ticker_period);
        let mut sampling: Option<JoinHandle<(LoadSampler, Sample)>> = None;
        let mut resolving = self.start_resolving();
        let mut ng_buf = vec![0_u8; NG_MAX_DATAGRAM];
        let (mut commands, control_guard) =
            match control_socket.as_deref().and_then(control::listen) {
                Some((rx, guard)) => (Some(rx), Some(guard)),
                None => (None, None),
            };

        let result = loop {
            self.flush();
            // Near the top the agent samples as often as it may notify
            // (SPEC §4, `notify-top-interval-ms`); a reload may change
            // either interval.
            let period = self.sample_interval();
            if period != ticker_period {
                ticker_period = period;
                ticker = new_ticker(period);
            }
            // Another event may wake the loop after the drain's deadline
            // but before its timer fires: the `drained` line is logged
            // here too, so it always comes before the exit it causes.
            let now = Instant::now();
            self.check_drained(now);
            if self.drain.should_exit(now) {
                info!("drained with exit-when-empty: the engine has no session, stopping");
                break Ok(());
            }
            if sampling.is_none() {
                if let Some(engine) = self.engine_ready.take() {
                    sampling = self.spawn_sample(Some(engine));
                }
            }
            let deadline = self.poll_timeout();
            tokio::select! {
                () = shutdown.cancelled() => break Ok(()),
                event = self.endpoint.recv() => match event {
                    Some(event) => self.on_sip_event(event).await,
                    None => break Err(AgentError::EndpointClosed { addr: self.endpoint.local_addr() }),
                },
                () = sleep_until(deadline.unwrap_or_else(far_future)), if deadline.is_some() => {
                    self.handle_timeout(Instant::now());
                }
                _ = ticker.tick(), if sampling.is_none() && self.engine_ready.is_none() => {
                    match self.ng.as_mut() {
                        None => sampling = self.spawn_sample(None),
                        // The previous exchange is still going (its
                        // retransmissions outlast a short interval): this
                        // tick is skipped, its answer will be the sample.
                        Some(link) if link.client.in_flight() => {}
                        Some(link) => match link.client.ask(Instant::now()) {
                            AskOutcome::Asking => {}
                            AskOutcome::Backoff => {
                                self.engine_ready = Some(EngineSessions::Unavailable);
                                // Not asked (backing off after failures):
                                // still no answer, for the probe too.
                                if let Some(probe) = self.probe.as_mut().filter(|p| is_ng(p)) {
                                    probe.handle_miss(Instant::now(), "rtpengine did not answer (backing off)");
                                }
                            }
                        },
                    }
                }
                received = async { match self.ng.as_ref() { Some(link) => link.socket.recv(&mut ng_buf).await, None => std::future::pending().await } }, if self.ng.is_some() => {
                    let now = Instant::now();
                    if let Some(link) = self.ng.as_mut() {
                        let answer = match received {
                            Ok(n) => link.client.handle_datagram(now, ng_buf.get(..n).unwrap_or_default()),
                            // ICMP port unreachable, reported on the
                            // connected socket: nothing listens there.
                            Err(e) => link.client.handle_send_error(now, &e.to_string()),
                        };
                        self.ng_answered(answer);
                    }
                }
                joined = async { match sampling.as_mut() { Some(h) => h.await, None => std::future::pending().await } }, if sampling.is_some() => {
                    sampling = None;
                    match joined {
                        Ok((sampler, sample)) => {
                            self.sampler = Some(sampler);
                            debug!(load = sample.load, cpu = sample.cpu, calls = sample.calls, "load sample");
                            let now = Instant::now();
                            self.notifier.on_sample(now, sample);
                            self.drain.on_calls(now, sample.calls);
                            self.check_drained(now);
                        }
                        Err(e) => {
                            error!(error = %e, "load sampler failed, restarting it");
                            self.sampler = Some(LoadSampler::new(&self.config.media, &self.config.general, &self.config.agent));
                        }
                    }
                }
                found = async { match resolving.as_mut() { Some(h) => h.await, None => std::future::pending().await } }, if resolving.is_some() => {
                    resolving = None;
                    match found {
                        Ok(found) => self.resolved(found),
                        Err(e) => warn!(error = %e, "registrar host resolution failed"),
                    }
                }
                reload = async { match reloads.as_mut() { Some(rx) => rx.recv().await, None => std::future::pending().await } }, if reloads.is_some() => {
                    match reload {
                        Some(Ok(config)) => {
                            self.reload(Instant::now(), config);
                            if self.ng.is_none() {
                                self.engine_ready = None;
                            }
                            if let Some(old) = resolving.take() {
                                old.abort();
                            }
                            resolving = self.start_resolving();
                        }
                        Some(Err(e)) => report_bad_config(&e),
                        None => reloads = None,
                    }
                }
                command = async { match commands.as_mut() { Some(rx) => rx.recv().await, None => std::future::pending().await } }, if commands.is_some() => {
                    match command {
                        Some(command) => {
                            let answer = self.on_control(Instant::now(), command.request);
                            let _ = command.reply.send(answer.to_string());
                        }
                        None => commands = None,
                    }
                }
            }
        };
        // Requests during the shutdown are answered `error shutting down`;
        // the socket itself goes once the agent is done (`--wait` sees it
        // go).
        drop(commands);
        if let Some(task) = resolving {
            task.abort();
        }
        self.graceful_shutdown().await;
        drop(control_guard);
        result
    }

    /// A request on the control socket (SPEC §14's MSR-side drain).
    fn on_control(&mut self, now: Instant, request: ControlRequest) -> ControlAnswer {
        match request {
            ControlRequest::Drain(when) => {
                if self.drain.service() != msr_shared::event_package::Service::Draining {
                    info!(
                        exit_when_empty = when == WhenDrained::Exit,
                        calls = self.drain.status(now).calls,
                        "drain: no new legs from now on, the live ones stay"
                    );
                }
                self.drain.drain(when);
            }
            ControlRequest::Undrain => {
                if self.drain.service() == msr_shared::event_package::Service::Draining {
                    info!("undrain: new legs welcome again");
                }
                self.drain.undrain();
            }
            ControlRequest::Status => {}
        }
        self.notifier.set_service(now, self.drain.service());
        self.check_drained(now);
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

    /// Logs the drain's end once.
    fn check_drained(&mut self, now: Instant) {
        if self.drain.take_newly_drained(now) {
            info!(
                empty_for_ms = crate::drain::EMPTY_FOR.as_millis(),
                "drained: the media engine has had no session for {} s",
                crate::drain::EMPTY_FOR.as_secs()
            );
        }
    }

    /// Hands the engine probe's changes to the notifier, logged once each
    /// (SPEC §14).
    fn apply_probe_changes(&mut self, now: Instant) {
        let Some(probe) = self.probe.as_mut() else {
            return;
        };
        let method = probe.config().method.clone();
        let target = method.target();
        while let Some(change) = probe.poll_change() {
            match change.to {
                EngineState::Down => warn!(
                    engine = %target,
                    misses = change.misses,
                    reason = change.reason.as_deref().unwrap_or(""),
                    "media engine at {target} stopped answering its probe ({method}, {} misses)",
                    change.misses
                ),
                EngineState::Up if change.from == EngineState::Down => info!(
                    engine = %target,
                    "media engine at {target} answers its probe again ({method})"
                ),
                EngineState::Up => info!(
                    engine = %target,
                    "media engine at {target} answers its probe ({method})"
                ),
                EngineState::Unchecked => info!(
                    engine = %target,
                    "media engine at {target}: its probe starts over ({method})"
                ),
            }
            self.notifier.set_engine(now, change.to);
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.registrations
            .values()
            .filter_map(Registration::poll_timeout)
            .chain(self.notifier.poll_timeout())
            .chain(self.ng.as_ref().and_then(|l| l.client.poll_timeout()))
            .chain(self.probe.as_ref().and_then(EngineProbe::poll_timeout))
            .chain(self.drain.poll_timeout())
            .min()
    }

    fn handle_timeout(&mut self, now: Instant) {
        for reg in self.registrations.values_mut() {
            reg.handle_timeout(now);
        }
        self.notifier.handle_timeout(now);
        let answer = self.ng.as_mut().and_then(|l| l.client.handle_timeout(now));
        self.ng_answered(answer);
        if let Some(probe) = self.probe.as_mut() {
            probe.handle_timeout(now);
        }
        self.check_drained(now);
    }

    /// The ng exchange of a tick ended: its answer is the next sample's.
    /// With the ng probe, the exchange's outcome is the probe's (SPEC §14).
    fn ng_answered(&mut self, answer: Option<Answer>) {
        let now = Instant::now();
        let probe = self.probe.as_mut().filter(|p| is_ng(p));
        match answer {
            Some(Answer::Sessions(n)) => {
                self.engine_ready = Some(EngineSessions::Known(n));
                if let Some(probe) = probe {
                    probe.handle_answer(now);
                }
            }
            Some(Answer::Failed(reason)) => {
                self.engine_ready = Some(EngineSessions::Unavailable);
                if let Some(probe) = probe {
                    probe.handle_miss(now, &reason.to_string());
                }
            }
            None => {}
        }
    }

    /// Takes a sample off the loop (the sampler reads `/proc`), with
    /// `engine` as the `rtpengine` source's count; `None` when the
    /// sampler is away.
    fn spawn_sample(
        &mut self,
        engine: Option<EngineSessions>,
    ) -> Option<JoinHandle<(LoadSampler, Sample)>> {
        let mut sampler = self.sampler.take()?;
        if let Some(engine) = engine {
            sampler.set_engine_sessions(engine);
        }
        Some(tokio::task::spawn_blocking(move || {
            let s = sampler.sample();
            (sampler, s)
        }))
    }

    /// SPEC §3: a registrar that answered a NOTIFY `481` may have lost the
    /// binding: that account REGISTERs again at once.
    fn reregister_forgotten(&mut self, now: Instant) {
        while let Some((msr, registrar)) = self.notifier.poll_forgotten() {
            let resolved = &self.resolved;
            for reg in self.registrations.values_mut() {
                let account = &reg.config().account;
                if account.msr_name == msr
                    && registrar_addrs(account, resolved).contains(&registrar)
                {
                    info!(%msr, %registrar, "the registrar forgot a subscription: registering again");
                    reg.register_now(now);
                }
            }
        }
    }

    /// A connection to `remote` closed: a registrar reached over it (a
    /// `sips:` realm, or `;transport=tcp`) can't reach this agent back — its SUBSCRIBEs and
    /// keepalives go over the connection the REGISTER came on — so those
    /// accounts REGISTER again at once, over a new connection (RFC 5626
    /// §4.4: a restarted collector gets every MSR back without waiting
    /// for the refresh).
    ///
    /// A REGISTER in flight over it fails at once rather than at Timer F
    /// (32 s): a TLS 1.3 server that refuses the client certificate (a
    /// collector with mutual TLS, none or the wrong one presented) does so
    /// after the client's handshake is over, by closing the connection.
    fn reregister_over(&mut self, now: Instant, remote: SocketAddr) {
        let resolved = &self.resolved;
        for reg in self.registrations.values_mut() {
            let account = &reg.config().account;
            if !account.realm.is_stream() || !registrar_addrs(account, resolved).contains(&remote) {
                continue;
            }
            if reg.in_flight() {
                let reason = if account.realm.is_sips() {
                    "the registrar closed the tls connection before answering \
                     (a registrar with mutual TLS does so when it takes no client \
                     certificate of this agent: see tls-cert and tls-key)"
                } else {
                    "the registrar closed the connection before answering"
                };
                reg.handle_failure(now, reason);
            } else if reg.state() == RegistrationState::Registered {
                info!(
                    msr = %account.msr_name,
                    registrar = %remote,
                    "the connection to the registrar closed: registering again"
                );
                reg.register_now(now);
            }
        }
    }

    async fn on_sip_event(&mut self, event: SipEvent) {
        let now = Instant::now();
        match event {
            SipEvent::Request(tx) => {
                let response = self.notifier.handle_request(now, tx.source(), tx.request());
                if let Some(response) = response {
                    tx.respond(response).await;
                }
            }
            SipEvent::Response { id, response } => match self.requests.remove(&id) {
                Some(Origin::Register(key)) => {
                    if let Some(reg) = self.find_registration(&key) {
                        reg.handle_response(now, &response);
                    }
                }
                Some(Origin::Notify(sub, _)) => {
                    self.notifier.handle_notify_response(now, sub, &response)
                }
                Some(Origin::Probe(probe_id)) => {
                    if let Some(probe) = self.probe.as_mut() {
                        probe.handle_response(now, probe_id);
                    }
                }
                None => debug!(id, "response to an unknown request"),
            },
            SipEvent::Failed { id, reason } => match self.requests.remove(&id) {
                Some(Origin::Register(key)) => {
                    if let Some(reg) = self.find_registration(&key) {
                        reg.handle_failure(now, &reason);
                    }
                }
                Some(Origin::Notify(sub, cseq)) => {
                    self.notifier.handle_notify_failure(now, sub, cseq, &reason)
                }
                Some(Origin::Probe(probe_id)) => {
                    if let Some(probe) = self.probe.as_mut() {
                        probe.handle_failure(now, probe_id, &reason);
                    }
                }
                None => debug!(id, "failure of an unknown request"),
            },
            SipEvent::Closed { remote } => self.reregister_over(now, remote),
        }
        self.retiring.retain(|r| !r.is_finished());
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

    /// The wait for the next load sample (SPEC §2, §4).
    fn sample_interval(&self) -> Duration {
        self.notifier
            .sample_interval(Duration::from_millis(self.config.agent.sample_interval_ms))
    }

    /// Hands every queued request to the endpoint, and the ng client's
    /// datagram to its socket.
    fn flush(&mut self) {
        self.reregister_forgotten(Instant::now());
        self.apply_probe_changes(Instant::now());
        if let Some(link) = self.ng.as_mut() {
            let now = Instant::now();
            let mut answer = None;
            while let Some(datagram) = link.client.poll_transmit() {
                // A datagram of tens of bytes on an idle socket: the send
                // buffer has room, so this never waits.
                if let Err(e) = link.socket.try_send(&datagram) {
                    answer = link.client.handle_send_error(now, &e.to_string());
                }
            }
            self.ng_answered(answer);
        }
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
        let now = Instant::now();
        for (origin, request) in out {
            let id = self.next_request_id;
            self.next_request_id += 1;
            match self.endpoint.send_request(id, request) {
                Ok(()) => {
                    self.requests.insert(id, origin);
                }
                Err(e) => {
                    warn!(error = %e, "cannot send request");
                    match origin {
                        Origin::Register(key) => {
                            if let Some(reg) = self.find_registration(&key) {
                                reg.handle_failure(now, &e.to_string());
                            }
                        }
                        Origin::Notify(sub, cseq) => {
                            self.notifier
                                .handle_notify_failure(now, sub, cseq, &e.to_string())
                        }
                        Origin::Probe(probe_id) => {
                            if let Some(probe) = self.probe.as_mut() {
                                probe.handle_failure(now, probe_id, &e.to_string());
                            }
                        }
                    }
                }
            }
        }
    }

    /// The two-step shutdown of the module docs.
    async fn graceful_shutdown(&mut self) {
        info!("shutting down");
        self.notifier.shutdown(Instant::now());
        // Step 1: the final NOTIFYs, answered before any unregister leaves.
        // The notifier bounds the wait (its deadline is `poll_timeout`).
        loop {
            self.flush();
            if self.notifier.finals_in_flight() == 0 {
                break;
            }
            let Some(deadline) = self.notifier.poll_timeout() else {
                break;
            };
            tokio::select! {
                () = sleep_until(deadline) => self.notifier.handle_timeout(Instant::now()),
                event = self.endpoint.recv() => match event {
                    Some(event) => self.on_sip_event(event).await,
                    None => {
                        self.endpoint.shutdown();
                        info!("stopped");
                        return;
                    }
                },
            }
        }
        // Step 2: the unregisters.
        let now = Instant::now();
        for reg in self.registrations.values_mut() {
            reg.unregister(now);
        }
        let deadline = now + SHUTDOWN_GRACE;
        loop {
            self.flush();
            let pending = self
                .registrations
                .values()
                .chain(self.retiring.iter())
                .any(|r| !r.is_finished());
            if !pending {
                break;
            }
            tokio::select! {
                () = sleep_until(deadline) => {
                    warn!("shutdown grace period over, some unregisters unanswered");
                    break;
                }
                event = self.endpoint.recv() => match event {
                    Some(event) => self.on_sip_event(event).await,
                    None => break,
                },
            }
        }
        self.endpoint.shutdown();
        info!("stopped");
    }
}

fn report_bad_config(e: &ConfigError) {
    error!(error = %e, "config reload failed, keeping the last good config");
}

fn new_ticker(period: Duration) -> tokio::time::Interval {
    let period = period.max(Duration::from_millis(1));
    let mut t = tokio::time::interval_at(Instant::now() + period, period);
    t.set_missed_tick_behavior(MissedTickBehavior::Delay);
    t
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400)
}

fn is_ng(probe: &EngineProbe) -> bool {
    matches!(probe.config().method, ProbeMethod::NgStatistics { .. })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `lo` owns 127.0.0.1 and, through its 127.0.0.0/8, every loopback
    /// alias (a contact on 127.0.0.62 is `lo@msr_1`, as the guides name
    /// it).
    #[test]
    fn a_loopback_alias_is_los() {
        let lo = interface_name(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)).expect("lo");
        assert_eq!(
            interface_name("127.0.0.62".parse().expect("ip")).as_deref(),
            Some(lo.as_str())
        );
    }

    #[test]
    fn a_network_holds_the_addresses_of_its_prefix_only() {
        let on = if_addrs::IfAddr::V4(if_addrs::Ifv4Addr {
            ip: "10.1.2.3".parse().expect("ip"),
            netmask: "255.255.255.0".parse().expect("mask"),
            prefixlen: 24,
            broadcast: None,
        });
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        assert!(network_holds(&on, ip("10.1.2.200")));
        assert!(!network_holds(&on, ip("10.1.3.1")));
        assert!(!network_holds(&on, ip("::1")));
    }
}
