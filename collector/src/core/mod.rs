//! [`Collector`]: the whole collector as one sans-IO state machine, after
//! quinn-proto's `Endpoint`.
//!
//! It owns every protocol core and the facts between them — the registrar
//! ([`Registrar`]), the subscriber ([`Subscriber`]), the health monitor
//! ([`HealthMonitor`]), the load table ([`LoadTable`], the selection
//! index), the call legs ([`LegTable`]), the operator configuration
//! ([`OperatorConfig`]) with its commit queue, the cluster view
//! ([`Cluster`]), the client transactions of its own requests
//! ([`ClientTransactions`]) and the RNG of the draws — and the glue that
//! fans one core's changes out to the others.
//!
//! Inputs, each with the time: SIP messages ([`Collector::handle_message`]),
//! control requests ([`Collector::handle_admin`]), the store's answers
//! ([`Collector::handle_committed`], [`Collector::handle_etcd`],
//! [`Collector::handle_bindings_saved`]) and timeouts
//! ([`Collector::handle_timeout`] at [`Collector::poll_timeout`]).
//! Outputs: datagrams and stream messages to send
//! ([`Collector::poll_transmit`]) and [`Effect`]s for the shell — an answer
//! to a control request, a change to commit, the bindings to save.
//!
//! SIP: the collector is a stateless UAS (RFC 3261 §8.2.7). Each request is
//! answered at once from what the cores decide; a retransmission is
//! answered again without a second effect, because the cores recognise it
//! (the registrar by the binding's Call-ID, CSeq and branch; the
//! subscriber by the dialog's last NOTIFY). Nothing is kept per request,
//! so a flood costs no memory beyond what it changes. Its own SUBSCRIBEs
//! and keepalives run in [`ClientTransactions`] (RFC 3261 §17.1.2).
//!
//! Durability (SPEC §3): a `200` to a REGISTER leaves only once every
//! binding change made so far is saved. The core asks for a save
//! ([`Effect::SaveBindings`], one at a time; changes that arrive while one
//! is written share the next) and holds those `200`s until
//! [`Collector::handle_bindings_saved`] says it is on disk.
//!
//! Architecture invariant: no I/O, no clock, no task, no global RNG: the
//! caller gives `now` and the wall clock ([`Collector::set_wall_clock`]),
//! and the RNG is seeded at construction. It logs through `tracing`.

mod commits;
mod flows;
mod glue;
pub mod log;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use msr_shared::admin::{Request, Response};
pub use msr_shared::sip::transaction::StreamTransport;
use msr_shared::sip::transaction::{ClientTransactions, Link, Outcome, SendError};
use msr_shared::sip::{self, wire, Method, SipMessage, StatusCode};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::api::handler;
use crate::api::metrics::Metrics;
use crate::config::CollectorConfig;
use crate::model::health::HealthEvent;
use crate::model::health::{HealthMonitor, ProbeId};
use crate::model::legs::LegTable;
use crate::model::load_table::{LoadTable, Placement};
use crate::operator::cluster::Cluster;
use crate::operator::OperatorConfig;
use crate::sip::registrar::{saved, RefusalLog, Registrar, RegistrarEvent};
use crate::sip::subscriber::{self, Subscriber, SubscriberConfig, SubscriberEvent};

pub use commits::{Backend, CommitFailure, Ticket};

/// The `User-Agent`/`Server` of the collector.
pub const USER_AGENT: &str = concat!("msr-collector/", env!("CARGO_PKG_VERSION"));

/// Identifies a control request ([`Collector::handle_admin`]); its answer
/// is an [`Effect::Answer`] with the same id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AdminId(pub u64);

/// Identifies a stream connection (TCP or TLS) a request came on: its
/// response goes back over it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u64);

/// Which client transaction a response belongs to: a SUBSCRIBE of the
/// subscriber or a keepalive of the health monitor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestId {
    /// A SUBSCRIBE (initial, refresh, unsubscribe).
    Subscribe(subscriber::RequestId),
    /// An OPTIONS keepalive.
    Keepalive(ProbeId),
}

/// Where a message goes, or came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// A datagram from (or to) this address, through the SIP socket.
    Udp(SocketAddr),
    /// A stream connection, and what it carries.
    Stream(StreamId, StreamTransport),
}

/// A SIP message that arrived.
#[derive(Debug)]
pub struct Inbound {
    /// Where it came on: its response goes back there.
    pub route: Route,
    /// The peer's address as the socket saw it (never a header).
    pub source: SocketAddr,
    /// The message, decoded with [`wire::decode`].
    pub message: SipMessage,
    /// Over TLS, the peer's certificate (DER) when it presented one.
    pub peer_certificate: Option<Arc<[u8]>>,
}

/// A message to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// Where to.
    pub route: Route,
    /// The encoded message.
    pub bytes: Bytes,
}

/// What the shell is to do besides sending messages.
#[derive(Debug)]
pub enum Effect {
    /// Send this answer to control request `id`.
    Answer {
        /// The request.
        id: AdminId,
        /// Its answer (boxed: most effects are small, an answer can be a
        /// whole table).
        response: Box<Response>,
    },
    /// Store `config` (the file store, or etcd if the configuration key's
    /// `mod_revision` is still `expected`), then call
    /// [`Collector::handle_committed`] (file) or hand etcd's answer to
    /// [`Collector::handle_etcd`].
    Commit {
        /// Given back with the outcome.
        ticket: Ticket,
        /// The configuration to store.
        config: Box<OperatorConfig>,
        /// The revision the change was made against (etcd).
        expected: Option<i64>,
    },
    /// Write these bindings (durably: fsync) and call
    /// [`Collector::handle_bindings_saved`] with `generation`.
    SaveBindings {
        /// Given back once written.
        generation: u64,
        /// The encoded bindings ([`saved::encode`]).
        text: String,
    },
}

/// What happened, once the core has applied it: for the log
/// ([`log::log`]) and for tests that follow the protocol.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A binding was added, refreshed, restarted or removed.
    Registrar(RegistrarEvent),
    /// A subscription changed, or a load report came in.
    Subscriber(SubscriberEvent),
    /// A contact's health changed.
    Health(HealthEvent),
    /// A refused REGISTER (or a count of them) the rate limit lets through.
    Refusal(RefusalLog),
    /// A SUBSCRIBE could not be sent (its target is no IP address).
    SubscribeNotSent {
        /// The MSR.
        msr: String,
        /// The dialog's Call-ID.
        call_id: String,
        /// Why.
        cause: String,
    },
    /// Legs reached their maximum duration without a release (SPEC §9),
    /// reported at most once per [`crate::model::legs::EXPIRY_REPORT_INTERVAL`]
    /// so a core that never releases cannot flood the log.
    LegsExpired {
        /// How many since the last report.
        count: u64,
        /// The Call-ID of one of them.
        sample_call_id: String,
        /// Legs still live.
        live: usize,
    },
}

/// The bindings' way to the disk (module docs, "Durability").
#[derive(Debug, Default)]
struct BindingSaves {
    /// Bumped by every binding change; what a save covers.
    changed: u64,
    /// The newest generation on disk.
    saved: u64,
    /// The generation being written, if a save is in flight.
    writing: Option<u64>,
    /// `200`s to REGISTERs, each waiting for this generation.
    held: VecDeque<(u64, Transmit)>,
    /// Bindings read from the disk are being applied: nothing to save.
    restoring: bool,
}

impl BindingSaves {
    fn dirty(&self) -> bool {
        self.changed > self.saved
    }
}

/// The collector (module docs).
pub struct Collector {
    local: SocketAddr,
    registrar: Registrar,
    subscriber: Subscriber,
    health: HealthMonitor,
    table: LoadTable,
    operator: OperatorConfig,
    legs: LegTable,
    cluster: Cluster,
    defaults: handler::Defaults,
    rng: StdRng,
    metrics: Arc<Metrics>,
    transactions: ClientTransactions<RequestId>,
    flows: flows::Flows,
    /// `[sip.tls] require`: REGISTER and NOTIFY over TLS only.
    require_tls: bool,
    /// `[sip.tls] client_ca`: a REGISTER over TLS must come with a client
    /// certificate that names its MSR.
    mutual_tls: bool,
    commits: commits::Commits,
    bindings: BindingSaves,
    transmits: VecDeque<Transmit>,
    effects: VecDeque<Effect>,
    events: VecDeque<Event>,
    /// The wall clock at an instant: the Unix time of any `now` is read
    /// from it (shown in tables, written in saved bindings).
    wall: (Instant, i64),
    /// [`Collector::shutdown`] was called.
    stopping: bool,
}

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collector")
            .field("local", &self.local)
            .field("transactions", &self.transactions.len())
            .field("stopping", &self.stopping)
            .finish_non_exhaustive()
    }
}

/// What [`Collector::new`] starts from.
#[derive(Debug)]
pub struct Start {
    /// The bound SIP address (`[sip] listen` with its port).
    pub local: SocketAddr,
    /// The operator configuration as stored.
    pub operator: OperatorConfig,
    /// The cluster view (file store or etcd).
    pub cluster: Cluster,
    /// Where changes are committed.
    pub backend: Backend,
    /// The counters `/metrics` shows.
    pub metrics: Arc<Metrics>,
    /// The seed of the draws' RNG.
    pub seed: u64,
    /// The time of the start and the wall clock then (Unix milliseconds).
    pub now: Instant,
    /// The Unix time of `now`, milliseconds.
    pub unix_ms: i64,
}

impl Collector {
    /// A collector with no binding, configured by `config`, starting from
    /// `start`.
    pub fn new(config: &CollectorConfig, start: Start) -> Self {
        let local_uri = format!("sip:collector@{}", start.local);
        let mut table = LoadTable::new(
            config.node.clone(),
            Placement {
                zone: config.defaults.zone.clone(),
                site: config.defaults.site.clone(),
            },
        );
        table.set_notify_flight_time(config.selection.notify_flight_time);
        let mut subscriber = Subscriber::new(SubscriberConfig {
            local_uri: local_uri.clone(),
            contact: local_uri.clone(),
            default_expires: config.subscription.expires,
        });
        for (msr, expires) in start
            .operator
            .subscription_expires_changes(&OperatorConfig::new())
        {
            subscriber.set_expires_override(msr, expires);
        }
        Self {
            local: start.local,
            registrar: Registrar::new(&config.sip, &config.accounts),
            subscriber,
            health: HealthMonitor::new(config.health, local_uri),
            table,
            operator: start.operator,
            legs: LegTable::new(config.legs.max_duration),
            cluster: start.cluster,
            defaults: handler::Defaults {
                zone: config.defaults.zone.clone(),
                site: config.defaults.site.clone(),
                subscription_expires_secs: config.subscription.expires,
                existing_conference_threshold: config.legs.existing_conference_threshold,
                new_conference_threshold: config.legs.new_conference_threshold,
                selection: config.selection,
            },
            rng: StdRng::seed_from_u64(start.seed),
            metrics: start.metrics,
            transactions: ClientTransactions::new(start.local, USER_AGENT),
            flows: flows::Flows::default(),
            require_tls: config.sip.tls.as_ref().is_some_and(|t| t.require),
            mutual_tls: config
                .sip
                .tls
                .as_ref()
                .is_some_and(|t| t.client_ca.is_some()),
            commits: commits::Commits::new(start.backend),
            bindings: BindingSaves::default(),
            transmits: VecDeque::new(),
            effects: VecDeque::new(),
            events: VecDeque::new(),
            wall: (start.now, start.unix_ms),
            stopping: false,
        }
    }

    /// Takes a reloaded configuration (SPEC §13, `SIGHUP`): what can change
    /// live does — accounts and the registrar's limits, the default
    /// subscription expiry, health, `[defaults]` (contacts without an
    /// operator override move), selection, legs, `[cluster] core_hosts` —
    /// from now on; bindings, subscriptions, legs and the operator's
    /// settings stay. What needs a restart is the shell's to name
    /// ([`crate::config::restart_needed`]).
    pub fn reconfigure(&mut self, now: Instant, config: &CollectorConfig) {
        self.registrar.reconfigure(&config.sip, &config.accounts);
        self.subscriber
            .set_default_expires(config.subscription.expires);
        self.health.set_config(config.health);
        self.table.set_defaults(
            &self.operator,
            Placement {
                zone: config.defaults.zone.clone(),
                site: config.defaults.site.clone(),
            },
        );
        self.table
            .set_notify_flight_time(config.selection.notify_flight_time);
        self.legs.set_max_duration(config.legs.max_duration);
        self.cluster
            .set_fallback_core_hosts(config.cluster.core_hosts);
        self.defaults = handler::Defaults {
            zone: config.defaults.zone.clone(),
            site: config.defaults.site.clone(),
            subscription_expires_secs: config.subscription.expires,
            existing_conference_threshold: config.legs.existing_conference_threshold,
            new_conference_threshold: config.legs.new_conference_threshold,
            selection: config.selection,
        };
        self.settle(now);
    }

    /// Sets the wall clock: `unix_ms` is the Unix time of `now`. The shell
    /// calls it before each input, so a step of the system clock shows at
    /// once.
    pub fn set_wall_clock(&mut self, now: Instant, unix_ms: i64) {
        self.wall = (now, unix_ms);
    }

    /// The Unix time of `now`, milliseconds.
    fn unix_ms(&self, now: Instant) -> i64 {
        let (at, unix) = self.wall;
        let delta = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        if now >= at {
            unix.saturating_add(delta(now - at))
        } else {
            unix.saturating_sub(delta(at - now))
        }
    }

    /// The Unix time of `now`, seconds.
    fn unix_secs(&self, now: Instant) -> i64 {
        self.unix_ms(now).div_euclid(1000)
    }

    /// Takes back the bindings a previous run saved (SPEC §3: resume every
    /// subscription at once). Text that this build cannot read is logged
    /// and ignored: the MSRs register again at their next refresh.
    pub fn restore_bindings(&mut self, now: Instant, text: &str) {
        match saved::decode(text, now, self.unix_ms(now)) {
            Ok(bindings) => {
                info!(bindings = bindings.len(), "bindings restored");
                self.registrar.restore(now, bindings);
                // What was read needs no save.
                self.bindings.restoring = true;
                self.settle(now);
                self.bindings.restoring = false;
                self.bindings.saved = self.bindings.changed;
            }
            Err(error) => warn!(%error, "saved bindings ignored, the msrs register again"),
        }
    }

    /// A SIP message arrived at `now`.
    pub fn handle_message(&mut self, now: Instant, inbound: Inbound) {
        match inbound.message {
            SipMessage::Request(request) => {
                let certificate = inbound.peer_certificate.as_deref();
                self.on_request(now, inbound.route, inbound.source, certificate, &request)
            }
            SipMessage::Response(response) => {
                if let Some((id, response)) = self.transactions.handle_response(now, response) {
                    self.on_outcome(now, id, Outcome::Response(response));
                }
            }
        }
        self.settle(now);
    }

    /// Answers one request (module docs: statelessly).
    fn on_request(
        &mut self,
        now: Instant,
        route: Route,
        source: SocketAddr,
        certificate: Option<&[u8]>,
        req: &sip::Request,
    ) {
        let over_tls = matches!(route, Route::Stream(_, StreamTransport::Tls));
        let msr =
            || sip::header(&req.headers, "To").and_then(|to| sip::uri_user(sip::addr_uri(to)));
        let response = match req.method {
            Method::Register | Method::Notify if self.require_tls && !over_tls => {
                // `[sip.tls] require`: an MSR's registration and its load
                // reports are taken over TLS only.
                info!(
                    target: msr_shared::logging::NETWORK,
                    method = %req.method,
                    %source,
                    "request refused: sip.tls.require takes registrations and notifies over tls only"
                );
                sip::response(req, StatusCode::Forbidden, Some(&sip::random_token()))
            }
            Method::Register
                if self.mutual_tls
                    && over_tls
                    && !msr().is_some_and(|msr| {
                        certificate.is_some_and(|der| msr_shared::certificate::names(der, msr))
                    }) =>
            {
                // Mutual TLS: the handshake proved the certificate chains
                // to the agents' CA; it must also be this MSR's.
                info!(
                    target: msr_shared::logging::NETWORK,
                    msr = msr().map(|m| m.escape_debug().to_string()),
                    %source,
                    "register refused: the client certificate does not name this msr"
                );
                sip::response(req, StatusCode::Forbidden, Some(&sip::random_token()))
            }
            Method::Register => {
                let response = self.registrar.handle_register(now, req, Some(source));
                self.metrics.register(response.status_code.code());
                if response.status_code == StatusCode::OK {
                    self.flows.registered(route, req);
                }
                // A 200 waits for the disk when this REGISTER changed a
                // binding (the settle that follows counts the change: the
                // next generation) or an earlier change is not saved yet.
                let waits_for = if self.registrar.has_events() {
                    Some(self.bindings.changed + 1)
                } else {
                    self.bindings.dirty().then_some(self.bindings.changed)
                };
                if let Some(generation) =
                    waits_for.filter(|_| response.status_code == StatusCode::OK)
                {
                    let transmit = self.response_to(route, source, req, response);
                    self.bindings.held.push_back((generation, transmit));
                    return;
                }
                response
            }
            Method::Notify => {
                let unix = self.unix_secs(now);
                let sender = self.flows.sender(route, source);
                let response = self.subscriber.handle_notify(now, unix, Some(sender), req);
                self.metrics.notify(response.status_code == StatusCode::OK);
                if response.status_code != StatusCode::OK {
                    // Anyone can send NOTIFYs: rate limited
                    // (msr_shared::logging::FloodLimit).
                    info!(
                        target: msr_shared::logging::NETWORK,
                        call_id = sip::call_id(&req.headers).map(tracing::field::display),
                        status = %response.status_code,
                        %source,
                        "notify refused"
                    );
                }
                response
            }
            Method::Options => allow(sip::response(
                req,
                StatusCode::OK,
                Some(&sip::random_token()),
            )),
            Method::Ack => return,
            _ => allow(sip::response(
                req,
                StatusCode::MethodNotAllowed,
                Some(&sip::random_token()),
            )),
        };
        let transmit = self.response_to(route, source, req, response);
        self.transmits.push_back(transmit);
    }

    /// The response to `req`, addressed the way it came.
    fn response_to(
        &self,
        route: Route,
        source: SocketAddr,
        req: &sip::Request,
        response: sip::Response,
    ) -> Transmit {
        let route = match route {
            Route::Udp(_) => Route::Udp(wire::response_target(req, source)),
            stream => stream,
        };
        Transmit {
            route,
            bytes: wire::encode_response(response),
        }
    }

    /// A client transaction ended.
    fn on_outcome(&mut self, now: Instant, id: RequestId, outcome: Outcome) {
        match (id, outcome) {
            (RequestId::Subscribe(id), Outcome::Response(response)) => {
                self.subscriber.handle_response(now, id, &response)
            }
            // RFC 3261 §8.1.3.1: a timeout is a 408.
            (RequestId::Subscribe(id), Outcome::TimedOut) => {
                self.subscriber.handle_failure(now, id, "408")
            }
            (RequestId::Keepalive(id), Outcome::Response(response)) => {
                self.health.handle_response(now, id, &response.status_code)
            }
            (RequestId::Keepalive(id), Outcome::TimedOut) => self.health.handle_failure(now, id),
        }
    }

    /// Sends `request` to the contact URI it is addressed to in a client
    /// transaction; `Err` when that URI names no IP address and port, or
    /// the request has no CSeq.
    fn send_request(
        &mut self,
        now: Instant,
        id: RequestId,
        request: sip::Request,
        timeout: Option<Duration>,
    ) -> Result<(), String> {
        let target = request.uri.to_string();
        let to = sip::uri_socket_addr(&target)
            .ok_or_else(|| format!("target {} is not an ip address and port", request.uri))?;
        let (link, contact) = self.flows.link(&target, to)?;
        let mut request = request;
        if link != Link::Udp && sip::header(&request.headers, "Contact").is_some() {
            // The NOTIFYs come back on the transport the SUBSCRIBE left on
            // (flows' module docs): the Contact names that listener.
            sip::set_header(&mut request.headers, "Contact", format!("<{contact}>"));
        }
        let timeout = timeout.unwrap_or(msr_shared::sip::transaction::TIMER_F);
        self.transactions
            .send_on(now, id, to, request, timeout, link)
            .map_err(|e: SendError| e.to_string())
    }

    /// Does what is due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.transactions.handle_timeout(now);
        while let Some((id, outcome)) = self.transactions.poll_outcome() {
            self.on_outcome(now, id, outcome);
        }
        self.registrar.handle_timeout(now);
        self.subscriber.handle_timeout(now);
        self.health.handle_timeout(now);
        let table = &mut self.table;
        self.legs
            .handle_timeout_with(now, |msr| table.note_expired(msr));
        if let Some(report) = self.legs.poll_expiry_report(now) {
            self.events.push_back(Event::LegsExpired {
                count: report.count,
                sample_call_id: report.sample_call_id,
                live: self.legs.len(),
            });
        }
        self.settle(now);
    }

    /// The earliest instant [`handle_timeout`](Self::handle_timeout) has
    /// work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [
            self.transactions.poll_timeout(),
            self.registrar.poll_timeout(),
            self.subscriber.poll_timeout(),
            self.legs.poll_timeout(),
            self.health.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The next message to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        if let Some(t) = self.transmits.pop_front() {
            return Some(t);
        }
        while let Some(d) = self.transactions.poll_transmit() {
            let route = match d.link {
                Link::Udp => Route::Udp(d.to),
                // Gone since: the transaction times out (Timer F).
                Link::Stream { .. } => match self.flows.route(d.to) {
                    Some(route) => route,
                    None => continue,
                },
            };
            return Some(Transmit {
                route,
                bytes: d.bytes,
            });
        }
        None
    }

    /// The shell bound these stream listeners (flows' module docs).
    pub fn set_stream_listeners(&mut self, tcp: Option<SocketAddr>, tls: Option<SocketAddr>) {
        self.flows.set_listeners(tcp, tls);
    }

    /// `[sip.tls]`'s `require` and whether it has a `client_ca` (mutual
    /// TLS): the shell sets them with the TLS acceptor they go with, at
    /// start and on each reload whose certificate files could be read, so
    /// the name check is on exactly when the handshake asks for a client
    /// certificate.
    pub fn set_tls_policy(&mut self, require: bool, mutual: bool) {
        self.require_tls = require;
        self.mutual_tls = mutual;
    }

    /// Stream connection `id` closed: the collector's requests to the
    /// contacts registered over it wait for their next registration.
    pub fn handle_stream_closed(&mut self, id: StreamId) {
        self.flows.closed(id);
    }

    /// The next effect for the shell.
    pub fn poll_effect(&mut self) -> Option<Effect> {
        self.effects.pop_front()
    }

    /// The next thing that happened ([`Event`]).
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The bindings of save `generation` are on disk (`Ok`), or could not
    /// be written (`Err`, the reason): the `200`s that waited for them
    /// leave, or — not saved — become `500`s, so that the MSRs try again
    /// (their binding stays in memory: subscriptions go on).
    pub fn handle_bindings_saved(
        &mut self,
        now: Instant,
        generation: u64,
        result: Result<(), String>,
    ) {
        if self.bindings.writing == Some(generation) {
            self.bindings.writing = None;
        }
        match result {
            Ok(()) => self.bindings.saved = self.bindings.saved.max(generation),
            Err(error) => {
                tracing::error!(%error, "cannot save the bindings");
            }
        }
        while let Some((waits_for, _)) = self.bindings.held.front() {
            if *waits_for > generation {
                break;
            }
            let Some((_, transmit)) = self.bindings.held.pop_front() else {
                break;
            };
            if self.bindings.saved >= generation {
                self.transmits.push_back(transmit);
            } else {
                debug!("register answered 500: its binding was not saved");
                self.transmits.push_back(unsaved(transmit));
            }
        }
        self.request_save(now);
    }

    /// Asks for a save of the bindings when some are unsaved and none is
    /// being written.
    fn request_save(&mut self, now: Instant) {
        if !self.bindings.dirty() || self.bindings.writing.is_some() || self.bindings.restoring {
            return;
        }
        let generation = self.bindings.changed;
        self.bindings.writing = Some(generation);
        let text = saved::encode(self.registrar.bindings(), now, self.unix_ms(now));
        self.effects
            .push_back(Effect::SaveBindings { generation, text });
    }

    /// The bindings now, for the final save at shutdown.
    pub fn bindings_text(&self, now: Instant) -> String {
        saved::encode(self.registrar.bindings(), now, self.unix_ms(now))
    }

    /// A control request (SPEC §8), from msrctl, HTTP or the redirect
    /// server; its answer comes as an [`Effect::Answer`].
    pub fn handle_admin(&mut self, now: Instant, id: AdminId, request: Request) {
        self.on_admin(now, id, request);
        self.settle(now);
    }

    /// Begins the shutdown: `Expires: 0` for every subscription (the MSRs
    /// stay registered: the next collector resumes them). Returns how many
    /// unsubscribes went out; [`is_drained`](Self::is_drained) says when
    /// their answers and final NOTIFYs are in.
    pub fn shutdown(&mut self, now: Instant) -> usize {
        self.stopping = true;
        let sent = self.subscriber.shutdown(now);
        info!(subscriptions = sent, "shutting down: ending subscriptions");
        self.settle(now);
        sent
    }

    /// Whether every unsubscribe of [`shutdown`](Self::shutdown) is
    /// answered and every final NOTIFY that follows one is in.
    pub fn is_drained(&self) -> bool {
        self.subscriber.awaited_unsubscribes() == 0 && self.subscriber.awaited_final_notifies() == 0
    }

    /// What is still awaited at shutdown: unsubscribes, final NOTIFYs.
    pub fn awaited(&self) -> (usize, usize) {
        (
            self.subscriber.awaited_unsubscribes(),
            self.subscriber.awaited_final_notifies(),
        )
    }

    /// Releases what the registration refusals' rate limit still holds
    /// back (at shutdown), as [`Event::Refusal`]s.
    pub fn flush_logs(&mut self, now: Instant) {
        self.registrar.flush_refusals(now);
        self.settle(now);
    }

    /// The addresses of the registered contacts: the sources whose
    /// requests the ingest serves first (SPEC §4 flood admission).
    pub fn known_sources(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.registrar.bindings().filter_map(|b| {
            b.source
                .or_else(|| sip::uri_socket_addr(sip::addr_uri(&b.uri)))
        })
    }

    /// Bumped by every change of the bindings: when the known sources
    /// ([`known_sources`](Self::known_sources)) may have changed.
    pub fn bindings_generation(&self) -> u64 {
        self.bindings.changed
    }

    /// The number of client transactions in flight.
    pub fn transactions_in_flight(&self) -> usize {
        self.transactions.len()
    }
}

/// `Allow` of the collector's answers to OPTIONS and to methods it does
/// not serve (RFC 3261 §11.2, §21.4.6).
fn allow(mut response: sip::Response) -> sip::Response {
    sip::push_header(&mut response.headers, "Allow", "REGISTER, NOTIFY, OPTIONS");
    response
}

/// A held `200` turned into `500 Server Internal Error` with
/// `Retry-After`, for a binding that could not be saved (the status line
/// is rewritten; every header stays).
fn unsaved(transmit: Transmit) -> Transmit {
    let text = String::from_utf8_lossy(&transmit.bytes);
    let Some(rest) = text.split_once("\r\n").map(|(_, rest)| rest) else {
        return transmit;
    };
    let rest = rest.replacen("\r\n\r\n", "\r\nRetry-After: 5\r\n\r\n", 1);
    Transmit {
        route: transmit.route,
        bytes: Bytes::from(format!("SIP/2.0 500 Bindings Not Saved\r\n{rest}")),
    }
}
