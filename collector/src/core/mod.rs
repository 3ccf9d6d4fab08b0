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

pub mod admin;
mod bindings;
mod commits;
mod counts;
mod flows;
mod glue;
pub mod log;
pub mod refusals;
pub mod routine;
pub mod snapshot;
mod uas;

#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use msr_shared::admin::{Request, Response};
pub use msr_shared::sip::transaction::StreamTransport;
use msr_shared::sip::transaction::{ClientTransactions, Link};
use msr_shared::sip::{self, SipMessage};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::time::Instant;
use tracing::info;

use crate::config::CollectorConfig;
use crate::model::health::HealthEvent;
use crate::model::health::{HealthMonitor, ProbeId};
use crate::model::legs::LegTable;
use crate::model::load_table::LoadTable;
use crate::operator::cluster::Cluster;
use crate::operator::OperatorConfig;
use crate::sip::registrar::{RefusalLog, Registrar, RegistrarEvent};
use crate::sip::subscriber::{self, Subscriber, SubscriberConfig, SubscriberEvent};
use admin::Origin;

use bindings::BindingSaves;
pub use commits::{Backend, CommitFailure, Ticket};
pub use counts::Count;
pub use uas::ALLOW;

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
    /// The message, decoded with [`wire::decode`](msr_shared::sip::wire::decode).
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
        /// The encoded bindings ([`saved::encode`](crate::sip::registrar::saved::encode)).
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
        msr: crate::operator::names::MsrName,
        /// The dialog's Call-ID.
        call_id: String,
        /// Why.
        cause: crate::sip::not_sent::NotSent,
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
    /// An MSR started draining, was drained, or returned (SPEC §14).
    Drain(crate::model::drain::DrainEvent),
    /// A refused selection, or a count of those not logged (SPEC §16).
    SelectionRefused(refusals::SelectionRefusalLog),
    /// The routine subscription refreshes of the last
    /// [`routine::SUMMARY_INTERVAL`] (each one is at DEBUG).
    SubscriptionsRefreshed(routine::RefreshSummary),
    /// A zone entered or left overload (SPEC §10): `pooled` keeps
    /// `headroom` sessions of each MSR free while it is in.
    ZoneOverload {
        /// The zone.
        zone: Box<str>,
        /// Entered or left.
        change: crate::model::overload::Change,
        /// The sessions kept free on each MSR while in overload.
        headroom: u32,
    },
    /// An MSR lost its last binding (SPEC §14: it stays on record).
    MsrGone {
        /// The MSR.
        msr: crate::operator::names::MsrName,
        /// Lapsed, or unregistered.
        cause: crate::sip::registrar::RemovalCause,
        /// It was in service when it went (reporting, not drained).
        serving: bool,
    },
    /// A gone MSR registered again, after `after`.
    MsrBack {
        /// The MSR.
        msr: crate::operator::names::MsrName,
        /// How long it was gone.
        after: std::time::Duration,
    },
    /// The operator configuration changed: who changed it, and each value
    /// with its old and new value (SPEC §16).
    OperatorChanged {
        /// Who made the change.
        by: Origin,
        /// Every value that changed.
        changes: Vec<crate::operator::diff::ValueChange>,
    },
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
    /// The MSRs being drained (SPEC §14).
    drains: crate::model::drain::DrainWatch,
    /// The MSRs that were registered and are gone (SPEC §14).
    absences: crate::model::absent::Absences,
    /// The zones in overload (SPEC §10).
    overload: crate::model::overload::OverloadWatch,
    /// The rate limit of refused selections' log lines (SPEC §16).
    selection_refusals: msr_shared::log_limit::LineLimiter<refusals::SelectionRefusal>,
    /// Routine subscription refreshes, summed up in the log (SPEC §16).
    refreshes: routine::RefreshCounter,
    cluster: Cluster,
    defaults: admin::Defaults,
    rng: StdRng,
    /// The increments for `/metrics` the shell has not taken yet.
    counts: VecDeque<Count>,
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
        let mut table = LoadTable::new(config.node.clone(), config.defaults.clone());
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
        // The drains in the store go on across a restart (SPEC §14).
        let mut drains = crate::model::drain::DrainWatch::default();
        for (msr, settings) in start.operator.configured_msrs() {
            if let (false, Ok(name)) = (settings.active, crate::operator::names::MsrName::new(msr))
            {
                drains.watch(&name);
            }
        }
        Self {
            local: start.local,
            registrar: Registrar::new(&config.sip, &config.accounts),
            subscriber,
            health: HealthMonitor::new(config.health, local_uri),
            table,
            operator: start.operator,
            legs: LegTable::new(config.legs.max_duration),
            drains,
            absences: crate::model::absent::Absences::default(),
            overload: crate::model::overload::OverloadWatch::default(),
            selection_refusals: refusals::limiter(),
            refreshes: routine::RefreshCounter::default(),
            cluster: start.cluster,
            defaults: admin::Defaults {
                subscription_expires_secs: config.subscription.expires,
                existing_conference_threshold: config.legs.existing_conference_threshold,
                new_conference_threshold: config.legs.new_conference_threshold,
                selection: config.selection,
            },
            rng: StdRng::seed_from_u64(start.seed),
            counts: VecDeque::new(),
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

    /// Whether `site` is declared in the operator configuration in force.
    pub fn site_declared(&self, site: &str) -> bool {
        self.operator.topology().contains(site)
    }

    /// A copy of what a selection without a leg reads, for the front ends
    /// to answer such selections on their own threads ([`snapshot`]).
    pub fn snapshot(&self) -> snapshot::Snapshot {
        snapshot::Snapshot::new(
            self.table.clone(),
            self.operator.topology().clone(),
            self.defaults.selection,
            (
                self.cluster.core_hosts(),
                self.overload.clone(),
                self.legs.last_release(),
            ),
        )
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
        self.table
            .set_defaults(&self.operator, config.defaults.clone());
        self.table
            .set_notify_flight_time(config.selection.notify_flight_time);
        self.legs.set_max_duration(config.legs.max_duration);
        self.cluster
            .set_fallback_core_hosts(config.cluster.core_hosts);
        self.defaults = admin::Defaults {
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

    /// Does what is due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.transactions.handle_timeout(now);
        while let Some((id, outcome)) = self.transactions.poll_outcome() {
            self.on_outcome(now, id, outcome);
        }
        self.registrar.handle_timeout(now);
        self.subscriber.handle_timeout(now);
        self.health.handle_timeout(now);
        self.selection_refusals.advance(now);
        self.table.handle_timeout(now);
        if let Some(summary) = self.refreshes.poll(now) {
            self.events
                .push_back(Event::SubscriptionsRefreshed(summary));
        }
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
            self.selection_refusals.poll_timeout(),
            self.refreshes.poll_timeout(),
            self.table.poll_timeout(),
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

    /// A control request (SPEC §8), from msrctl, HTTP or the redirect
    /// server; its answer comes as an [`Effect::Answer`].
    pub fn handle_admin(&mut self, now: Instant, id: AdminId, request: Request) {
        self.handle_admin_from(now, id, request, Origin::Control { uid: None });
    }

    /// [`handle_admin`](Self::handle_admin) for a request from `origin`,
    /// whom the log names with the change it makes (SPEC §16).
    pub fn handle_admin_from(
        &mut self,
        now: Instant,
        id: AdminId,
        request: Request,
        origin: Origin,
    ) {
        self.on_admin(now, id, request, origin);
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
}
