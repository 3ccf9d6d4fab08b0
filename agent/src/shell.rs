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
//!   rtpengine over its ng port ([`NgClient`]) and the sample is taken
//!   when the exchange ends, with its answer;
//! * a datagram from rtpengine's ng port (a connected UDP socket of the
//!   agent's own, so only that address is heard);
//! * a config reload from [`crate::config::watch()`];
//! * the end of a resolution of the registrars' host names (below);
//! * shutdown (the `CancellationToken`).
//!
//! After every event each core's transmit queue is flushed into the endpoint.
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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use msr_shared::engine::{EngineAddresses, EngineTransport};
use msr_shared::sip::{SipEndpoint, SipEvent};
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::config::{self, Account, AgentConfig, ConfigError, Transports};
use crate::error::AgentError;
use crate::load::rtpengine::{Answer, AskOutcome, NgClient};
use crate::load::{EngineSessions, LoadSampler, Sample};
use crate::notifier::{Notifier, NotifierConfig, SubscriptionId};
use crate::registration::{Registration, RegistrationConfig, RegistrationState};

/// How long shutdown waits for the unregisters to be answered (after up to
/// [`FINAL_NOTIFY_GRACE`](crate::notifier::FINAL_NOTIFY_GRACE) for the
/// final NOTIFYs).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// The longest a registrar's host name may take to resolve.
pub(crate) const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// What one resolution of the registrars' host names found: per name, its
/// addresses or why there are none.
type Resolution = Vec<(String, Result<BTreeSet<IpAddr>, String>)>;

/// An account's identity across reloads: `(msr_name, realm URI)`.
type AccountKey = (String, String);

/// Who sent the request with a given id.
#[derive(Debug, Clone)]
enum Origin {
    Register(AccountKey),
    /// A NOTIFY: its subscription and CSeq number.
    Notify(SubscriptionId, u32),
}

/// The name of the interface owning `addr` (`lo` on loopback); `None` when
/// no interface has it (or `addr` is unspecified).
pub fn interface_name(addr: IpAddr) -> Option<String> {
    let interfaces = match if_addrs::get_if_addrs() {
        Ok(i) => i,
        Err(e) => {
            warn!(error = %e, "cannot list network interfaces");
            return None;
        }
    };
    interfaces
        .into_iter()
        .find(|i| i.ip() == addr)
        .map(|i| i.name)
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

fn host_port(addr: IpAddr, port: u16) -> String {
    SocketAddr::new(addr, port).to_string()
}

/// The `rtpengine` calls source's I/O: its sans-IO client and the UDP
/// socket, connected to the ng address, it talks through.
struct NgLink {
    client: NgClient,
    socket: tokio::net::UdpSocket,
}

/// The largest ng answer read: rtpengine's `statistics` answer is about
/// 8 KB (it grows by a few hundred bytes per proxy that talks to it).
const NG_MAX_DATAGRAM: usize = 65_535;

impl NgLink {
    /// A link to the ng address of `config`'s `rtpengine` source; `None`
    /// for another source, or (logged) when no socket can be had.
    fn for_config(config: &AgentConfig) -> Option<NgLink> {
        let target = config.ng_address()?;
        let local: SocketAddr = match target {
            SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
            SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        let socket = std::net::UdpSocket::bind(local)
            .and_then(|s| s.connect(target).map(|()| s))
            .and_then(|s| s.set_nonblocking(true).map(|()| s))
            .and_then(tokio::net::UdpSocket::from_std);
        match socket {
            Ok(socket) => {
                info!(ng = %target, "calls from rtpengine's ng port {target}");
                let prefix = format!("msr-agent-{:08x}", rand::random::<u32>());
                Some(NgLink {
                    client: NgClient::new(target, prefix),
                    socket,
                })
            }
            Err(e) => {
                error!(ng = %target, error = %e, "cannot open a socket to rtpengine's ng port: the msr is reported full");
                None
            }
        }
    }

    /// One whole exchange, outside the loop (before the first sample):
    /// at most [`TRIES`](crate::load::rtpengine::TRIES) sends
    /// [`RETRANSMIT_AFTER`](crate::load::rtpengine::RETRANSMIT_AFTER)
    /// apart.
    async fn exchange(&mut self) -> EngineSessions {
        let mut buf = vec![0_u8; NG_MAX_DATAGRAM];
        self.client.ask(Instant::now());
        loop {
            let mut answer = None;
            while let Some(datagram) = self.client.poll_transmit() {
                if let Err(e) = self.socket.send(&datagram).await {
                    answer = self
                        .client
                        .handle_send_error(Instant::now(), &e.to_string());
                }
            }
            if answer.is_none() {
                let Some(deadline) = self.client.poll_timeout() else {
                    return EngineSessions::Unavailable;
                };
                answer = tokio::select! {
                    received = self.socket.recv(&mut buf) => match received {
                        Ok(n) => self.client.handle_datagram(Instant::now(), buf.get(..n).unwrap_or_default()),
                        Err(e) => self.client.handle_send_error(Instant::now(), &e.to_string()),
                    },
                    () = sleep_until(deadline) => self.client.handle_timeout(Instant::now()),
                };
            }
            match answer {
                Some(Answer::Sessions(n)) => return EngineSessions::Known(n),
                Some(Answer::Failed(_)) => return EngineSessions::Unavailable,
                None => {}
            }
        }
    }
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
}

fn account_key(a: &Account) -> AccountKey {
    (a.msr_name.clone(), a.realm.uri.clone())
}

fn notifier_config(
    config: &AgentConfig,
    contact: &str,
    resolved: &BTreeMap<String, BTreeSet<IpAddr>>,
) -> NotifierConfig {
    NotifierConfig {
        subscribers: subscribers(config, resolved),
        registrars: config
            .accounts
            .iter()
            .flat_map(|a| registrar_addrs(a, resolved))
            .collect(),
        load_delta: config.general.load_delta,
        high_water: config.agent.notify_high_water,
        notify_min_interval: Duration::from_millis(config.agent.notify_min_interval_ms),
        max_expires: config.agent.max_subscription_expires,
        contact_host_port: contact.to_owned(),
        accounts: config
            .accounts
            .iter()
            .map(|a| a.msr_name.clone())
            .collect::<BTreeSet<_>>(),
    }
}

/// The subscriber hosts of `config`: its addresses, and the addresses
/// `resolved` holds for its names.
fn subscribers(
    config: &AgentConfig,
    resolved: &BTreeMap<String, BTreeSet<IpAddr>>,
) -> BTreeSet<IpAddr> {
    let hosts = config.subscriber_hosts();
    let mut all = hosts.addresses;
    for name in &hosts.names {
        all.extend(resolved.get(name).into_iter().flatten());
    }
    all
}

/// The SIP addresses of `account`'s registrar: its realm URI's address (or
/// the addresses its host name resolved to) at the URI's port, 5060 when
/// it has none (RFC 3263 §4.2 for a URI without port).
fn registrar_addrs(
    account: &Account,
    resolved: &BTreeMap<String, BTreeSet<IpAddr>>,
) -> Vec<std::net::SocketAddr> {
    let realm = &account.realm;
    let port = realm.port_or_default();
    let bare = realm
        .host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(&realm.host);
    let ips: Vec<IpAddr> = match bare.parse::<IpAddr>() {
        Ok(ip) => vec![ip.to_canonical()],
        Err(_) => resolved
            .get(&realm.host)
            .into_iter()
            .flatten()
            .copied()
            .collect(),
    };
    ips.into_iter()
        .map(|ip| std::net::SocketAddr::new(ip, port))
        .collect()
}

/// Resolves `names`, each within [`RESOLVE_TIMEOUT`].
async fn resolve(names: BTreeSet<String>) -> Resolution {
    let mut out = Vec::new();
    for name in names {
        let lookup = tokio::net::lookup_host((name.as_str(), 5060));
        let found = match tokio::time::timeout(RESOLVE_TIMEOUT, lookup).await {
            Ok(Ok(addrs)) => Ok(addrs.map(|a| a.ip().to_canonical()).collect()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer in {} s", RESOLVE_TIMEOUT.as_secs())),
        };
        out.push((name, found));
    }
    out
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
        if let Some(link) = ng.as_mut() {
            // The first report carries rtpengine's answer too, not "full"
            // for want of one.
            sampler.set_engine_sessions(link.exchange().await);
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
        }
    }

    /// Starts resolving the registrars' host names; `None` when the config
    /// names none.
    fn start_resolving(&self) -> Option<JoinHandle<Resolution>> {
        let names = self.config.subscriber_hosts().names;
        (!names.is_empty()).then(|| tokio::spawn(resolve(names)))
    }

    /// Takes in what a resolution found and tells the notifier.
    fn resolved(&mut self, found: Resolution) {
        for (name, addrs) in found {
            match addrs {
                Ok(addrs) => {
                    info!(registrar = %name, addresses = ?addrs, "registrar host resolved");
                    self.resolved.insert(name, addrs);
                }
                Err(e) => {
                    let kept = self.resolved.get(&name).map_or(0, BTreeSet::len);
                    warn!(registrar = %name, error = %e, kept, "cannot resolve registrar host, keeping its last addresses");
                }
            }
        }
        let contact = host_port(self.contact_addr, self.endpoint.local_addr().port());
        let config = notifier_config(&self.config, &contact, &self.resolved);
        self.notifier.set_subscribers(config.subscribers);
        self.notifier.set_registrars(config.registrars);
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
        let mut ticker = new_ticker(self.config.agent.sample_interval_ms);
        let mut sampling: Option<JoinHandle<(LoadSampler, Sample)>> = None;
        let mut resolving = self.start_resolving();
        let mut ng_buf = vec![0_u8; NG_MAX_DATAGRAM];

        let result = loop {
            self.flush();
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
                            AskOutcome::Backoff => self.engine_ready = Some(EngineSessions::Unavailable),
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
                            self.notifier.on_sample(Instant::now(), sample);
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
                            let interval = config.agent.sample_interval_ms;
                            if interval != self.config.agent.sample_interval_ms {
                                ticker = new_ticker(interval);
                            }
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
            }
        };
        if let Some(task) = resolving {
            task.abort();
        }
        self.graceful_shutdown().await;
        result
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.registrations
            .values()
            .filter_map(Registration::poll_timeout)
            .chain(self.notifier.poll_timeout())
            .chain(self.ng.as_ref().and_then(|l| l.client.poll_timeout()))
            .min()
    }

    fn handle_timeout(&mut self, now: Instant) {
        for reg in self.registrations.values_mut() {
            reg.handle_timeout(now);
        }
        self.notifier.handle_timeout(now);
        let answer = self.ng.as_mut().and_then(|l| l.client.handle_timeout(now));
        self.ng_answered(answer);
    }

    /// The ng exchange of a tick ended: its answer is the next sample's.
    fn ng_answered(&mut self, answer: Option<Answer>) {
        match answer {
            Some(Answer::Sessions(n)) => self.engine_ready = Some(EngineSessions::Known(n)),
            Some(Answer::Failed(_)) => self.engine_ready = Some(EngineSessions::Unavailable),
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

    /// Hands every queued request to the endpoint, and the ng client's
    /// datagram to its socket.
    fn flush(&mut self) {
        self.reregister_forgotten(Instant::now());
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
                    }
                }
            }
        }
    }

    /// Reads the `<agent tls-…>` files of `config` again: connections
    /// opened from now on use them; files that cannot be used leave the
    /// running ones (and the reload's other changes go on).
    fn reload_tls(&mut self, config: &AgentConfig) {
        let Some(tls) = &config.agent.tls else {
            warn!("<agent tls-ca> removed: tls connections keep the files read before");
            return;
        };
        match tls.read() {
            Ok(client) => {
                self.endpoint.set_tls_client(&client);
                info!("<agent tls-…> files read again: new tls connections use them");
                for warning in tls.warnings(config.tls_msrs()) {
                    warn!("{warning}");
                }
            }
            Err(error) => warn!(
                attribute = tls.attribute_of(&error.path),
                %error,
                "<agent tls-…> files not reloaded; the running ones stay"
            ),
        }
    }

    /// Applies a new, valid config (SPEC §2 hot reload).
    fn reload(&mut self, now: Instant, config: AgentConfig) {
        if config.transport != self.config.transport {
            let show =
                |t: &config::TransportConfig| format!("{} {}:{}", t.transport, t.bind_addr, t.port);
            warn!(
                old = %show(&self.config.transport),
                new = %show(&config.transport),
                "transport change ignored until restart"
            );
        }
        let old: HashMap<AccountKey, Account> = self
            .config
            .accounts
            .iter()
            .map(|a| (account_key(a), a.clone()))
            .collect();
        let new: HashMap<AccountKey, Account> = config
            .accounts
            .iter()
            .map(|a| (account_key(a), a.clone()))
            .collect();
        if config.mcc != self.config.mcc || config.agent.sip_port != self.config.agent.sip_port {
            warn!("<pbyte><mcc> or <agent sip-port> change ignored until restart");
        }
        if config.agent.tls != self.config.agent.tls {
            self.reload_tls(&config);
        }
        // What was bound and reported at start stays until a restart.
        let mut config = config;
        config.transport = self.config.transport.clone();
        config.mcc = self.config.mcc;
        config.agent.sip_port = self.config.agent.sip_port;
        self.config = config;
        for (key, account) in &old {
            match new.get(key) {
                None => {
                    if let Some(mut reg) = self.registrations.remove(key) {
                        info!(msr = %account.msr_name, realm = %account.realm, "account removed, unregistering");
                        reg.unregister(now);
                        self.retiring.push(reg);
                    }
                }
                Some(updated) if updated != account => {
                    info!(msr = %account.msr_name, realm = %account.realm, "account changed, registering again");
                    self.add_account(now, updated);
                }
                Some(_) => {}
            }
        }
        for (key, account) in &new {
            if !old.contains_key(key) {
                info!(msr = %account.msr_name, realm = %account.realm, "account added");
                self.add_account(now, account);
            }
        }
        let expires = self.config.agent.register_expires;
        for reg in self.registrations.values_mut() {
            reg.set_expires(expires);
        }
        if let Some(sampler) = self.sampler.as_mut() {
            sampler.reconfigure(&self.config.media, &self.config.general, &self.config.agent);
        }
        let target = self.config.ng_address();
        if self.ng.as_ref().map(|l| l.client.target()) != target {
            self.ng = NgLink::for_config(&self.config);
        }
        // Names no longer in the config are forgotten; new ones are
        // resolved by the caller, and allowed once they are.
        let names = self.config.subscriber_hosts().names;
        self.resolved.retain(|name, _| names.contains(name));
        let contact = host_port(self.contact_addr, self.endpoint.local_addr().port());
        self.notifier
            .reconfigure(now, notifier_config(&self.config, &contact, &self.resolved));
        info!(
            accounts = self.config.accounts.len(),
            load_delta = self.config.general.load_delta,
            "config reloaded"
        );
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

fn new_ticker(ms: u64) -> tokio::time::Interval {
    let period = Duration::from_millis(ms.max(1));
    let mut t = tokio::time::interval_at(Instant::now() + period, period);
    t.set_missed_tick_behavior(MissedTickBehavior::Delay);
    t
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400)
}
