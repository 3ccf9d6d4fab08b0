//! The collector's one async loop: it owns the SIP endpoint and every piece
//! of state, and feeds the sans-IO cores ([`Registrar`], [`Subscriber`])
//! and the admin handler ([`admin::prepare`], then its commit), and the health monitor
//! ([`HealthMonitor`]), whose keepalives it sends and whose health changes
//! it copies into the load table and logs.
//!
//! One `tokio::select!` waits for, in turn: shutdown, a SIP event
//! ([`SipEndpoint::recv`]), an admin command (from [`admin::serve`]), and
//! the earliest deadline of the cores. Answers to SIP requests are sent from
//! spawned tasks, so the loop never awaits SIP I/O while answering admin.
//!
//! Shutdown: `Expires: 0` for every active subscription, at most
//! [`SHUTDOWN_GRACE`] waiting for the answers to those and for the final
//! NOTIFYs (`terminated`) that follow them, answered 200 (and only those:
//! not for an unsubscribe sent earlier for an MSR that unregistered), then
//! the control socket is removed and the operator store's lock released.
//!
//! With `[store] backend = "etcd"` (SPEC §12) a separate task owns the etcd
//! client ([`crate::store::etcd`]); the loop sends it the changes to commit
//! and receives, as [`EtcdEvent`]s, the configuration as etcd holds it, the
//! commits' outcomes, the member list and whether etcd is reachable. A
//! configuration from etcd is made current through [`Shell::install`], the
//! same path as a change made here. One change at a time is in flight to
//! etcd; changes arriving meanwhile wait, queries are answered at once.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use msr_shared::admin::{ErrorCode, Request, Response, ResponseData};
use msr_shared::sip::{self, Method, SipEndpoint, SipEvent, StatusCode};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::admin::{self, AdminCommand, AdminContext, Outcome};
use crate::cluster::{Cluster, StoreStatus};
use crate::config::{CollectorConfig, StoreBackend};
use crate::error::CollectorError;
use crate::health::{HealthEvent, HealthMonitor};
use crate::legs::LegTable;
use crate::load_table::{Change, LoadTable, Placement};
use crate::metrics::Metrics;
use crate::operator::OperatorConfig;
use crate::redirect::RedirectContext;
use crate::registrar::{
    saved, RefusalLog, Registrar, RegistrarEvent, RemovalCause, REFUSAL_WINDOW,
};
use crate::store::etcd::{self, CommitError, EtcdCommand, EtcdEvent, EtcdLink, Member};
use crate::store::Store;
use crate::subscriber::{Subscriber, SubscriberConfig, SubscriberEvent};
use msr_shared::fs::cannot_create_in;

/// Longest wait at shutdown for the answers to the final `Expires: 0`
/// SUBSCRIBEs and for the final NOTIFYs that follow them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// At shutdown, how long answers to SIP requests still being sent may take
/// when [`SHUTDOWN_GRACE`] is already over.
const REPLY_FLUSH: Duration = Duration::from_millis(100);

/// The most control commands served in one wake-up of the loop.
const ADMIN_BATCH: usize = 64;

/// The shortest time between two saves of the bindings: a kill -9 loses
/// at most the changes of this last interval (those MSRs come back with
/// their next REGISTER), and 1,000 MSRs refreshing cost one write a second.
pub const BINDINGS_SAVE_INTERVAL: Duration = Duration::from_secs(1);

/// The `User-Agent`/`Server` of the collector.
const USER_AGENT: &str = concat!("msr-collector/", env!("CARGO_PKG_VERSION"));

/// A running collector (see [`start`]).
#[derive(Debug)]
pub struct CollectorHandle {
    /// The bound SIP (UDP) address.
    pub sip_addr: SocketAddr,
    /// The control socket path.
    pub control_socket: PathBuf,
    /// The bound HTTP address (`[http]`), if configured.
    pub http_addr: Option<SocketAddr>,
    /// The bound redirect server address (`[redirect]`), if configured.
    pub redirect_addr: Option<SocketAddr>,
    /// Ends when the collector has shut down.
    pub join: JoinHandle<Result<(), CollectorError>>,
}

/// Runs the collector until `shutdown` is cancelled (then ends the
/// subscriptions and removes the control socket).
///
/// # Errors
/// As [`start`]; [`CollectorError::EndpointClosed`] if the SIP endpoint
/// stops on its own.
pub async fn run(
    config: CollectorConfig,
    shutdown: CancellationToken,
) -> Result<(), CollectorError> {
    let handle = start(config, shutdown).await?;
    handle.join.await.map_err(|e| CollectorError::Task {
        reason: e.to_string(),
    })?
}

/// The checks `--check-config` adds to the config file's own validation,
/// for what the collector needs from the host at start:
///
/// * the operator store's directory exists and this process may create
///   files in it ([`Store::check_dir`]);
/// * (not here: whether another collector holds the store's lock, which
///   `--check-config` reports as a note, [`Store::check_unlocked`], and
///   [`start`] refuses);
/// * the store is readable and valid (a missing file is an empty store);
/// * the control socket's directory exists and this process may create the
///   socket in it, its path fits a Unix socket address (107 bytes), and
///   nothing but a socket (one a previous run left, which the start
///   replaces) is at that path.
///
/// # Errors
/// [`CollectorError::Store`] or [`CollectorError::ControlSocketPath`].
pub fn check_environment(config: &CollectorConfig) -> Result<(), CollectorError> {
    let store = Store::new(config.state_path.clone());
    store.check_dir()?;
    store.load()?;
    if let StoreBackend::Etcd(etcd) = &config.store {
        // etcd itself may be down while the host is fine (the collector
        // then starts from its cached copy); the TLS files must be there.
        if let Some(tls) = &etcd.tls {
            let files = std::iter::once(&tls.ca)
                .chain(tls.identity.iter().flat_map(|(cert, key)| [cert, key]));
            for path in files {
                std::fs::File::open(path).map_err(|source| CollectorError::TlsFile {
                    path: path.clone(),
                    source,
                })?;
            }
        }
    }
    check_control_socket(&config.control_socket)
}

/// The control socket checks of [`check_environment`].
fn check_control_socket(path: &Path) -> Result<(), CollectorError> {
    let bad = |reason: String| CollectorError::ControlSocketPath {
        path: path.to_owned(),
        reason,
    };
    if path.as_os_str().len() > 107 {
        return Err(bad(format!(
            "the path is {} bytes, a unix socket path holds at most 107",
            path.as_os_str().len()
        )));
    }
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        return Err(bad(format!("directory {} does not exist", dir.display())));
    }
    if let Some(e) = cannot_create_in(&dir) {
        return Err(bad(format!("directory {}: {e}", dir.display())));
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) => {
            if let Some(what) = admin::not_a_socket(meta.file_type()) {
                return Err(bad(format!("the path exists and is {what}, not a socket")));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(bad(format!("cannot inspect the path: {e}"))),
    }
    Ok(())
}

/// Takes the operator store's lock, loads the operator configuration, binds
/// the SIP endpoint and the control socket, and spawns the collector loop,
/// which holds the lock until it has stopped. `[sip] listen` may use port 0.
///
/// The lock is taken before anything else is bound, so a second collector
/// on the same store stops there, without touching the first one's control
/// socket.
///
/// # Errors
/// [`CollectorError::Store`] (with [`StoreError::Locked`](crate::store::StoreError::Locked)
/// when another collector runs on the same store), [`CollectorError::Sip`],
/// [`CollectorError::ControlSocket`] or [`CollectorError::ControlSocketPath`]
/// when a resource cannot be had.
pub async fn start(
    config: CollectorConfig,
    shutdown: CancellationToken,
) -> Result<CollectorHandle, CollectorError> {
    let store = Store::new(config.state_path.clone());
    store.check_dir()?;
    check_control_socket(&config.control_socket)?;
    let lock = store.lock()?;
    debug!(lock = %lock.path().display(), "operator store locked");
    let mut operator = match config.store {
        StoreBackend::File => store.load()?,
        // Read from etcd once the SIP address (part of the membership key) is bound.
        StoreBackend::Etcd(_) => OperatorConfig::new(),
    };
    // The site new contacts get must exist, or every leg at it is refused
    // with `unknown_site` until an operator declares it (with etcd: once
    // etcd is reachable, see `Shell::declare_default_site`).
    if config.store == StoreBackend::File && !operator.topology().contains(&config.defaults.site) {
        match operator.declare_site(&config.defaults.site) {
            Ok(()) => {
                store.save(&operator)?;
                info!(site = %config.defaults.site, "declared the default site");
            }
            // Only the site cap can refuse it (the config checked the name):
            // legs at the default site get `unknown_site` until it is declared.
            Err(error) => tracing::warn!(
                site = %config.defaults.site,
                %error,
                "cannot declare the default site; new contacts' legs get unknown_site until it is"
            ),
        }
    }
    // Not a child of `shutdown`: the final `Expires: 0` SUBSCRIBEs go out
    // after it is cancelled; the endpoint stops when the shell drops it.
    let endpoint = SipEndpoint::bind(
        config.sip.listen,
        config.sip.tcp(),
        USER_AGENT,
        CancellationToken::new(),
    )
    .await?;
    let sip_addr = endpoint.local_addr();
    info!(addr = %sip_addr, "listening on udp {sip_addr}");
    if config.sip.tcp() {
        info!(addr = %sip_addr, "listening on tcp {sip_addr}");
    }
    let control_socket = config.control_socket.clone();
    let listener = admin::bind_control_socket(&control_socket).map_err(|source| {
        CollectorError::ControlSocket {
            path: control_socket.clone(),
            source,
        }
    })?;
    info!(path = %control_socket.display(), "control socket on {}", control_socket.display());
    let (admin_tx, admin_rx) = mpsc::channel(64);
    let admin_stop = CancellationToken::new();
    let metrics = Arc::new(Metrics::new());
    // SPEC §11: the HTTP API and the redirect server send their requests
    // over the control socket's channel, to the one handler below.
    let http_addr = match &config.http {
        Some(http) => {
            let listener =
                crate::http::bind(http.listen)
                    .await
                    .map_err(|source| CollectorError::Http {
                        addr: http.listen,
                        source,
                    })?;
            let addr = listener
                .local_addr()
                .map_err(|source| CollectorError::Http {
                    addr: http.listen,
                    source,
                })?;
            info!(%addr, "listening on http {addr}");
            let router =
                crate::http::router(admin_tx.clone(), Arc::clone(&metrics), http.token.clone());
            tokio::spawn(crate::http::serve(listener, router, shutdown.clone()));
            Some(addr)
        }
        None => None,
    };
    let redirect_addr = match &config.redirect {
        Some(redirect) => {
            let bind_error = |source| CollectorError::Redirect {
                addr: redirect.listen,
                source,
            };
            let socket = msr_shared::sip::udp_socket(redirect.listen).map_err(bind_error)?;
            let addr = socket.local_addr().map_err(bind_error)?;
            info!(%addr, "redirect server listening on udp {addr}");
            let ctx = RedirectContext {
                own: vec![addr, sip_addr],
                default_zone: config.defaults.zone.clone(),
                default_site: config.defaults.site.clone(),
            };
            tokio::spawn(crate::redirect::serve(
                socket,
                admin_tx.clone(),
                ctx,
                Arc::clone(&metrics),
                shutdown.clone(),
            ));
            Some(addr)
        }
        None => None,
    };
    tokio::spawn(admin::serve(listener, admin_tx, admin_stop.clone()));

    let this = Member {
        node: config.node.clone(),
        sip: sip_addr.to_string(),
        started_unix: admin::unix_secs(SystemTime::now()),
    };
    let (backend, cluster, etcd_join) = match &config.store {
        StoreBackend::File => (
            Backend::File,
            Cluster::file(
                this,
                store.path().display().to_string(),
                config.cluster.core_hosts,
            ),
            None,
        ),
        StoreBackend::Etcd(etcd_config) => {
            let mut cluster = Cluster::etcd(
                this.clone(),
                etcd_config.endpoints.join(","),
                etcd_config.prefix.clone(),
                config.cluster.core_hosts,
            );
            let (mut link, join) =
                etcd::spawn(etcd_config.clone(), this, store.clone(), shutdown.clone());
            operator = first_configuration(etcd_config, &mut link, &mut cluster, &store).await?;
            (
                Backend::Etcd(Box::new(EtcdState {
                    link,
                    next_ticket: 0,
                    in_flight: None,
                    queued: VecDeque::new(),
                    default_site_tried: None,
                })),
                cluster,
                Some(join),
            )
        }
    };
    let local = format!("sip:collector@{sip_addr}");
    let mut table = LoadTable::new(
        config.node.clone(),
        Placement {
            zone: config.defaults.zone.clone(),
            site: config.defaults.site.clone(),
        },
    );
    table.set_notify_flight_time(config.selection.notify_flight_time);
    let mut subscriber = Subscriber::new(SubscriberConfig {
        local_uri: local.clone(),
        contact: local,
        default_expires: config.subscription.expires,
    });
    for (msr, expires) in operator.subscription_expires_changes(&OperatorConfig::new()) {
        subscriber.set_expires_override(msr, expires);
    }
    let mut shell = Shell {
        registrar: Registrar::new(&config.sip, &config.accounts),
        health: HealthMonitor::new(config.health, format!("sip:collector@{sip_addr}")),
        subscriber,
        table,
        operator,
        store,
        admin_defaults: admin::Defaults {
            zone: config.defaults.zone.clone(),
            site: config.defaults.site.clone(),
            subscription_expires_secs: config.subscription.expires,
            existing_conference_threshold: config.legs.existing_conference_threshold,
            new_conference_threshold: config.legs.new_conference_threshold,
            selection: config.selection,
        },
        legs: LegTable::new(config.legs.max_duration),
        rng: StdRng::from_entropy(),
        endpoint,
        admin_rx,
        replies: JoinSet::new(),
        bindings_save_at: None,
        bindings_saved_at: None,
        backend,
        cluster,
        metrics,
    };
    shell.restore_bindings(Instant::now());
    let socket_path = control_socket.clone();
    let join = tokio::spawn(async move {
        let result = shell.run(shutdown).await;
        admin_stop.cancel();
        if let Some(join) = etcd_join {
            // The task revokes the membership lease at shutdown (bounded).
            if tokio::time::timeout(Duration::from_secs(2), join)
                .await
                .is_err()
            {
                warn!("etcd task did not stop in time");
            }
        }
        match std::fs::remove_file(&socket_path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                warn!(path = %socket_path.display(), cause = %e, "cannot remove control socket")
            }
        }
        info!("collector stopped");
        // Only now may another collector take the store.
        drop(lock);
        result
    });
    Ok(CollectorHandle {
        sip_addr,
        control_socket,
        http_addr,
        redirect_addr,
        join,
    })
}

/// Waits for the etcd task's first word at start: the configuration as
/// etcd holds it, or (etcd unreachable, or silent for longer than two
/// request timeouts) the local cached copy at `[state] path` (SPEC §12).
async fn first_configuration(
    config: &crate::config::EtcdConfig,
    link: &mut EtcdLink,
    cluster: &mut Cluster,
    cache: &Store,
) -> Result<OperatorConfig, CollectorError> {
    let limit = config.request_timeout * 2 + Duration::from_millis(500);
    let reason = match tokio::time::timeout(limit, link.events.recv()).await {
        Ok(Some(EtcdEvent::Config {
            config,
            mod_revision,
            revision,
        })) => {
            cluster.observe(revision, mod_revision);
            return Ok(*config);
        }
        Ok(Some(EtcdEvent::Unavailable { reason, since })) => {
            cluster.unavailable(since, reason.clone());
            reason
        }
        Ok(Some(other)) => format!("unexpected first event {other:?}"),
        Ok(None) => "the etcd task stopped".to_owned(),
        Err(_) => format!("no answer within {} ms", limit.as_millis()),
    };
    let operator = cache.load()?;
    cluster.started_from_cache(cache.path().display().to_string());
    warn!(
        cache = %cache.path().display(),
        %reason,
        "etcd unreachable at start: starting from the local cached copy of the operator configuration"
    );
    Ok(operator)
}

/// Where changes are committed.
enum Backend {
    /// The file store: saved in the loop (a few milliseconds, fsync).
    File,
    /// etcd, through its task.
    Etcd(Box<EtcdState>),
}

/// The loop's side of the etcd backend.
struct EtcdState {
    link: EtcdLink,
    next_ticket: u64,
    /// The change sent to the task and not answered yet.
    in_flight: Option<Pending>,
    /// Changes that arrived while one was in flight, in order.
    queued: VecDeque<AdminCommand>,
    /// The revision at which the default site was last declared (or tried).
    default_site_tried: Option<i64>,
}

/// A change waiting for etcd's answer.
struct Pending {
    ticket: u64,
    next: OperatorConfig,
    /// The answer and where it goes; `None` for the collector's own change
    /// (declaring the default site).
    answer: Option<(Response, tokio::sync::oneshot::Sender<Response>)>,
}

/// The next event of the etcd task; never, with the file store.
async fn etcd_event(backend: &mut Backend) -> Option<EtcdEvent> {
    match backend {
        Backend::File => std::future::pending().await,
        Backend::Etcd(state) => state.link.events.recv().await,
    }
}

struct Shell {
    registrar: Registrar,
    subscriber: Subscriber,
    health: HealthMonitor,
    table: LoadTable,
    operator: OperatorConfig,
    store: Store,
    admin_defaults: admin::Defaults,
    rng: StdRng,
    /// The live call legs (SPEC §9): runtime state, not saved.
    legs: LegTable,
    endpoint: SipEndpoint,
    admin_rx: mpsc::Receiver<AdminCommand>,
    /// The tasks sending answers to SIP requests; reaped as they finish,
    /// and waited for (bounded) before the endpoint stops at shutdown.
    replies: JoinSet<()>,
    /// When the changed bindings are saved next ([`BINDINGS_SAVE_INTERVAL`]);
    /// `None`: nothing unsaved.
    bindings_save_at: Option<Instant>,
    /// When they were last saved.
    bindings_saved_at: Option<Instant>,
    /// Where changes are committed.
    backend: Backend,
    /// The store's state and the core hosts (SPEC §12).
    cluster: Cluster,
    /// Counters for `GET /metrics` (SPEC §11), shared with the HTTP task.
    metrics: Arc<Metrics>,
}

impl Shell {
    async fn run(mut self, shutdown: CancellationToken) -> Result<(), CollectorError> {
        loop {
            self.settle(Instant::now());
            while self.replies.try_join_next().is_some() {}
            let deadline = [
                self.registrar.poll_timeout(),
                self.subscriber.poll_timeout(),
                self.bindings_save_at,
                self.legs.poll_timeout(),
                self.health.poll_timeout(),
            ]
            .into_iter()
            .flatten()
            .min();
            let sleep = async move {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => break,
                event = self.endpoint.recv() => match event {
                    Some(event) => self.on_sip(event),
                    None => return Err(CollectorError::EndpointClosed),
                },
                Some(command) = self.admin_rx.recv() => {
                    // Under load one wake-up serves the commands already
                    // queued (the redirect server's and HTTP's selections),
                    // a bounded batch; a change ends it, so what a change
                    // set off settles before the next command.
                    let mut next = Some(command);
                    let mut served = 0;
                    while let Some(command) = next.take() {
                        let mutation = command.request.is_mutation();
                        self.on_admin(command);
                        served += 1;
                        if !mutation && served < ADMIN_BATCH {
                            next = self.admin_rx.try_recv().ok();
                        }
                    }
                }
                Some(event) = etcd_event(&mut self.backend) => self.on_etcd(event),
                () = sleep => {
                    let now = Instant::now();
                    self.registrar.handle_timeout(now);
                    self.subscriber.handle_timeout(now);
                    self.health.handle_timeout(now);
                    let expired = self.legs.handle_timeout(now);
                    if expired > 0 {
                        info!(legs = expired, live = self.legs.len(), "legs expired without a release");
                    }
                    if self.bindings_save_at.is_some_and(|at| at <= now) {
                        self.save_bindings(now);
                    }
                }
            }
        }
        self.drain().await;
        Ok(())
    }

    /// Ends every subscription and waits (bounded) for the answers to
    /// these unsubscribes and for the final NOTIFYs that follow them, and
    /// no others ([`Subscriber::awaited_unsubscribes`],
    /// [`Subscriber::awaited_final_notifies`]), answering every SIP request
    /// that arrives meanwhile; then logs the registration refusals the rate
    /// limit still holds back.
    async fn drain(&mut self) {
        let now = Instant::now();
        let sent = self.subscriber.shutdown(now);
        info!(subscriptions = sent, "shutting down: ending subscriptions");
        self.send_transmits(now);
        let deadline = Instant::now() + SHUTDOWN_GRACE;
        while self.subscriber.awaited_unsubscribes() > 0
            || self.subscriber.awaited_final_notifies() > 0
        {
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {
                    let unanswered = self.subscriber.awaited_unsubscribes();
                    let final_notifies = self.subscriber.awaited_final_notifies();
                    if unanswered > 0 {
                        warn!(
                            unanswered,
                            final_notifies,
                            subscriptions = sent,
                            "unsubscribe answers not received in time"
                        );
                    } else {
                        warn!(
                            final_notifies,
                            subscriptions = sent,
                            "final notifies not received in time"
                        );
                    }
                    break;
                }
                event = self.endpoint.recv() => match event {
                    Some(event) => self.on_sip(event),
                    None => break,
                },
            }
        }
        // The answers just given (the last final NOTIFY's 200 among them)
        // leave before the endpoint stops.
        let flush_until = deadline.max(Instant::now() + REPLY_FLUSH);
        let replies = &mut self.replies;
        let flushed = tokio::time::timeout_at(flush_until, async {
            while replies.join_next().await.is_some() {}
        })
        .await;
        if flushed.is_err() {
            warn!(
                unsent = self.replies.len(),
                "answers to sip requests not sent before shutdown"
            );
        }
        // What the refusal rate limit still holds back.
        self.registrar.flush_refusals(Instant::now());
        self.log_refusals();
        // The MSRs stay registered: the next collector resumes them.
        self.save_bindings(Instant::now());
        self.endpoint.shutdown();
    }

    fn on_sip(&mut self, event: SipEvent) {
        let now = Instant::now();
        match event {
            SipEvent::Request(tx) => {
                let req = tx.request();
                let response = match req.method {
                    Method::Register => {
                        let response = self.registrar.handle_register(now, req, source_of(req));
                        self.metrics.register(response.status_code.code());
                        response
                    }
                    Method::Notify => {
                        let unix_now = admin::unix_secs(SystemTime::now());
                        let response =
                            self.subscriber
                                .handle_notify(now, unix_now, tx.source(), req);
                        self.metrics.notify(response.status_code == StatusCode::OK);
                        if response.status_code != StatusCode::OK {
                            // Anyone can send NOTIFYs: rate limited
                            // (msr_shared::logging::FloodLimit).
                            info!(
                                target: msr_shared::logging::NETWORK,
                                call_id = sip::call_id(&req.headers).map(tracing::field::display),
                                status = %response.status_code,
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
                self.replies.spawn(tx.respond(response));
            }
            SipEvent::Response { id, response } if HealthMonitor::owns(id) => {
                self.health.handle_response(now, id, &response.status_code)
            }
            SipEvent::Failed { id, .. } if HealthMonitor::owns(id) => {
                self.health.handle_failure(now, id)
            }
            SipEvent::Response { id, response } => {
                self.subscriber.handle_response(now, id, &response)
            }
            SipEvent::Failed { id, reason } => self.subscriber.handle_failure(now, id, &reason),
        }
    }

    fn on_admin(&mut self, command: AdminCommand) {
        let now = Instant::now();
        if matches!(command.request, Request::ClusterList {}) {
            answer(
                command.reply,
                Response::Ok(ResponseData::Cluster(self.cluster.view())),
            );
            return;
        }
        if command.request.is_mutation() {
            if let Backend::Etcd(state) = &mut self.backend {
                if state.in_flight.is_some() {
                    state.queued.push_back(command);
                    return;
                }
                if let StoreStatus::Unavailable { reason, .. } = self.cluster.status() {
                    let error = CommitError::Unavailable {
                        reason: reason.clone(),
                    };
                    answer(command.reply, commit_refusal(&error));
                    return;
                }
            }
        }
        let mut ctx = AdminContext {
            operator: &mut self.operator,
            table: &mut self.table,
            registrar: &self.registrar,
            subscriber: &self.subscriber,
            defaults: &self.admin_defaults,
            rng: &mut self.rng,
            legs: &mut self.legs,
            core_hosts: self.cluster.core_hosts(),
        };
        let kind = match &command.request {
            Request::Select { .. } => Counted::Selection,
            Request::Release { .. } => Counted::Release,
            _ => Counted::Not,
        };
        let outcome = admin::prepare(command.request, &mut ctx, now);
        if let Outcome::Answer(response) = &outcome {
            self.count(kind, response, now);
        }
        match outcome {
            Outcome::Answer(response) => answer(command.reply, response),
            Outcome::Change { next, response } => {
                self.commit(*next, Some((response, command.reply)))
            }
        }
    }

    /// Counts a selection (outcome, MSR, time since `started`) or a
    /// release for `/metrics`.
    fn count(&self, kind: Counted, response: &Response, started: Instant) {
        match (kind, response) {
            (Counted::Selection, Response::Ok(ResponseData::Selected(s))) => {
                let leg = match s.leg {
                    None => "none",
                    Some(msr_shared::admin::LegOutcome::New) => "new",
                    Some(msr_shared::admin::LegOutcome::Sticky) => "sticky",
                    Some(msr_shared::admin::LegOutcome::Reanchored) => "reanchored",
                };
                self.metrics
                    .selected(&s.msr, leg, started.elapsed().as_secs_f64());
            }
            (Counted::Selection, Response::Err(e)) => self
                .metrics
                .refused(&e.code.to_string(), started.elapsed().as_secs_f64()),
            (Counted::Release, Response::Ok(ResponseData::Released(r))) => {
                self.metrics.released(r.released)
            }
            _ => {}
        }
    }

    /// Stores a change, then makes it current and answers; or answers why
    /// not. With etcd the answer comes with the task's [`EtcdEvent`].
    fn commit(
        &mut self,
        next: OperatorConfig,
        answer_to: Option<(Response, tokio::sync::oneshot::Sender<Response>)>,
    ) {
        match &mut self.backend {
            Backend::File => {
                let response = match self.store.save(&next) {
                    Ok(()) => {
                        self.install(next);
                        answer_to.as_ref().map(|(response, _)| response.clone())
                    }
                    Err(error) => {
                        tracing::error!(cause = %error, "operator change not saved");
                        Some(admin::store_failed(&error))
                    }
                };
                if let (Some((_, reply)), Some(response)) = (answer_to, response) {
                    answer(reply, response);
                }
            }
            Backend::Etcd(state) => {
                state.next_ticket += 1;
                let ticket = state.next_ticket;
                let command = EtcdCommand::Commit {
                    ticket,
                    config: Box::new(next.clone()),
                    expected: self.cluster.mod_revision(),
                };
                if let Err(error) = state.link.commands.try_send(command) {
                    let error = CommitError::Unavailable {
                        reason: format!("the etcd task does not take commands: {error}"),
                    };
                    if let Some((_, reply)) = answer_to {
                        answer(reply, commit_refusal(&error));
                    }
                    return;
                }
                state.in_flight = Some(Pending {
                    ticket,
                    next,
                    answer: answer_to,
                });
            }
        }
    }

    /// Makes `next` the current operator configuration: the one path for a
    /// change made here and one made on another collector (SPEC §12).
    ///
    /// An override reaches the subscriber only here, and only for the MSRs
    /// whose `Expires` setting the change touched.
    fn install(&mut self, next: OperatorConfig) {
        let previous = std::mem::replace(&mut self.operator, next);
        self.table.apply(&self.operator, Change::OperatorChanged);
        for (msr, expires) in self.operator.subscription_expires_changes(&previous) {
            self.subscriber.set_expires_override(msr, expires);
        }
    }

    fn on_etcd(&mut self, event: EtcdEvent) {
        match event {
            EtcdEvent::Connected => {
                self.cluster.connected();
                self.declare_default_site();
            }
            EtcdEvent::Unavailable { reason, since } => self.cluster.unavailable(since, reason),
            EtcdEvent::Config {
                config,
                mod_revision,
                revision,
            } => {
                if self.cluster.observe(revision, mod_revision) && *config != self.operator {
                    info!(revision, "operator configuration changed in etcd");
                    self.install(*config);
                }
                self.declare_default_site();
            }
            EtcdEvent::Members(members) => {
                let before = self.cluster.core_hosts();
                self.cluster.set_members(members);
                let now = self.cluster.core_hosts();
                if before != now {
                    info!(core_hosts = now, "cluster membership changed");
                }
            }
            EtcdEvent::Committed { ticket, revision } => {
                if let Some(pending) = self.take_pending(ticket) {
                    // Newer than what the watch already gave: ours is current.
                    if self.cluster.observe(revision, Some(revision)) {
                        self.install(pending.next);
                    }
                    if let Some((response, reply)) = pending.answer {
                        answer(reply, response);
                    }
                }
                self.run_queued();
            }
            EtcdEvent::Refused { ticket, error } => {
                if let Some(pending) = self.take_pending(ticket) {
                    info!(%error, "operator change refused by etcd");
                    if let Some((_, reply)) = pending.answer {
                        answer(reply, commit_refusal(&error));
                    }
                }
                self.run_queued();
            }
        }
    }

    fn take_pending(&mut self, ticket: u64) -> Option<Pending> {
        let Backend::Etcd(state) = &mut self.backend else {
            return None;
        };
        match &state.in_flight {
            Some(pending) if pending.ticket == ticket => state.in_flight.take(),
            _ => None,
        }
    }

    /// Carries out the changes that waited for the one in flight, in order,
    /// until one is in flight again.
    fn run_queued(&mut self) {
        loop {
            let Backend::Etcd(state) = &mut self.backend else {
                return;
            };
            if state.in_flight.is_some() {
                return;
            }
            let Some(command) = state.queued.pop_front() else {
                self.declare_default_site();
                return;
            };
            self.on_admin(command);
        }
    }

    /// With etcd: declares `[defaults] site` when the shared configuration
    /// lacks it, once per revision (a conflict brings a newer revision,
    /// which may have it).
    fn declare_default_site(&mut self) {
        let seen = self.cluster.seen();
        let Backend::Etcd(state) = &mut self.backend else {
            return;
        };
        if state.in_flight.is_some()
            || !state.queued.is_empty()
            || *self.cluster.status() != StoreStatus::Connected
            || state.default_site_tried == Some(seen)
            || self.operator.topology().contains(&self.admin_defaults.site)
        {
            return;
        }
        state.default_site_tried = Some(seen);
        let mut next = self.operator.clone();
        match next.declare_site(&self.admin_defaults.site) {
            Ok(()) => {
                info!(site = %self.admin_defaults.site, "declared the default site");
                self.commit(next, None);
            }
            Err(error) => warn!(
                site = %self.admin_defaults.site,
                %error,
                "cannot declare the default site; new contacts' legs get unknown_site until it is"
            ),
        }
    }

    /// Applies what the cores produced: table updates, logs, requests to send.
    fn settle(&mut self, now: Instant) {
        while let Some(event) = self.registrar.poll_event() {
            self.bindings_changed(now);
            let msr = match event {
                RegistrarEvent::BindingAdded(b) => self.on_binding(now, b, Registered::Added),
                RegistrarEvent::BindingRefreshed(b) => {
                    self.on_binding(now, b, Registered::Refreshed)
                }
                RegistrarEvent::BindingRestarted(b) => {
                    self.on_binding(now, b, Registered::Restarted)
                }
                RegistrarEvent::BindingRemoved { binding, cause } => {
                    match cause {
                        RemovalCause::Lapsed => {
                            info!(msr = %binding.msr, contact = %binding.contact, "binding lapsed")
                        }
                        RemovalCause::Unregistered => {
                            info!(msr = %binding.msr, contact = %binding.contact, "binding removed")
                        }
                    }
                    self.health.contact_removed(now, &binding.contact);
                    self.table
                        .apply(&self.operator, Change::BindingRemoved(&binding));
                    if !self.registrar.is_registered(&binding.msr) {
                        self.table
                            .apply(&self.operator, Change::MsrUnregistered(&binding.msr));
                    }
                    binding.msr
                }
            };
            self.subscriber
                .contacts_changed(now, &msr, self.registrar.contacts_of(&msr));
        }
        self.send_transmits(now);
        while let Some(event) = self.subscriber.poll_event() {
            match event {
                SubscriberEvent::Active {
                    msr,
                    call_id,
                    contact,
                    expires,
                } => {
                    info!(%msr, %contact, %call_id, expires, "subscription active")
                }
                SubscriberEvent::Refreshed {
                    msr,
                    call_id,
                    expires,
                } => {
                    info!(%msr, %call_id, expires, "subscription refreshed")
                }
                SubscriberEvent::Load { msr, report, at } => {
                    debug!(%msr, load = report.load, cpu = report.cpu, calls = report.calls, "load report");
                    self.health.report_received(at, &msr);
                    let change = Change::LoadReported {
                        msr: &msr,
                        report,
                        at,
                    };
                    self.table.apply(&self.operator, change);
                }
                SubscriberEvent::Terminated {
                    msr,
                    call_id,
                    reason,
                    retry_at,
                } => {
                    let reason = reason.as_ref().map(tracing::field::display);
                    match retry_at.map(|t| t.saturating_duration_since(now)) {
                        Some(wait) => {
                            info!(%msr, %call_id, reason, retry_in_ms = wait.as_millis() as u64, "subscription terminated")
                        }
                        None => {
                            info!(%msr, %call_id, reason, "subscription terminated, not retrying")
                        }
                    }
                }
                SubscriberEvent::Retrying {
                    msr,
                    call_id,
                    cause,
                    delay,
                } => {
                    info!(%msr, %call_id, %cause, ?delay, "subscription retrying")
                }
                SubscriberEvent::Ended { msr, call_id } => {
                    // No `call_id` field when no dialog was open.
                    info!(%msr, call_id = call_id.as_deref().map(tracing::field::display), "subscription ended")
                }
            }
        }
        self.log_refusals();
        // Only the subscriptions that changed: O(changes), not O(MSRs), per event.
        while let Some((msr, view)) = self.subscriber.poll_view_change() {
            self.health
                .subscription_changed(now, &msr, &view.status, view.expires_secs);
            let change = Change::SubscriptionChanged {
                msr: &msr,
                expires_secs: view.expires_secs,
            };
            self.table.apply(&self.operator, change);
        }
        self.apply_health(now);
    }

    /// Sends the keepalives the health monitor asks for, and copies its
    /// changes into the load table and the log (SPEC §5).
    fn apply_health(&mut self, now: Instant) {
        while let Some(probe) = self.health.poll_transmit() {
            if let Err(e) = self.endpoint.send_request(probe.id, probe.request) {
                debug!(contact = %probe.contact, cause = %e, "cannot send keepalive");
                self.health.handle_failure(now, probe.id);
            }
        }
        let unix_now = admin::unix_secs(SystemTime::now());
        while let Some(event) = self.health.poll_event() {
            match event {
                HealthEvent::Changed(change) => {
                    let age = now.saturating_duration_since(change.at).as_secs();
                    let unix = unix_now.saturating_sub(i64::try_from(age).unwrap_or(0));
                    let health = Change::HealthChanged {
                        contact: &change.contact,
                        health: change.to,
                        since: (change.at, unix),
                    };
                    self.table.apply(&self.operator, health);
                    match change.from {
                        Some(from) if change.log => info!(
                            msr = %change.msr,
                            contact = %change.contact,
                            from = %from,
                            to = %change.to,
                            cause = %change.cause,
                            "health changed"
                        ),
                        _ => debug!(
                            msr = %change.msr,
                            contact = %change.contact,
                            to = %change.to,
                            cause = %change.cause,
                            "health set"
                        ),
                    }
                }
                HealthEvent::Suppressed {
                    contact,
                    count,
                    health,
                } => info!(
                    %contact,
                    count,
                    %health,
                    window_secs = crate::health::LOG_WINDOW.as_secs(),
                    "health changes not logged individually"
                ),
            }
            // A keepalive failing at once may have queued another probe.
            while let Some(probe) = self.health.poll_transmit() {
                if let Err(e) = self.endpoint.send_request(probe.id, probe.request) {
                    debug!(contact = %probe.contact, cause = %e, "cannot send keepalive");
                    self.health.handle_failure(now, probe.id);
                }
            }
        }
    }

    /// Takes back the bindings saved by the previous run (SPEC §3: resume
    /// every subscription at once). A file that cannot be read or was not
    /// written by this build is reported and ignored: the MSRs register
    /// again at their next refresh.
    fn restore_bindings(&mut self, now: Instant) {
        let path = self.store.bindings_path();
        let text = match self.store.load_bindings() {
            Ok(Some(text)) => text,
            Ok(None) => return,
            Err(error) => {
                warn!(%error, "cannot read the saved bindings, starting without them");
                return;
            }
        };
        match saved::decode(&text, now, unix_millis(SystemTime::now())) {
            Ok(bindings) => {
                info!(path = %path.display(), bindings = bindings.len(), "bindings restored");
                self.registrar.restore(now, bindings);
            }
            Err(error) => warn!(
                path = %path.display(),
                %error,
                "saved bindings ignored, the msrs register again"
            ),
        }
    }

    /// The bindings changed: save them within [`BINDINGS_SAVE_INTERVAL`].
    fn bindings_changed(&mut self, now: Instant) {
        if self.bindings_save_at.is_none() {
            let next = self
                .bindings_saved_at
                .map_or(now, |last| last + BINDINGS_SAVE_INTERVAL);
            self.bindings_save_at = Some(next.max(now));
        }
    }

    /// Saves every binding now; a failure is logged (the collector runs on,
    /// a restart would then wait for the MSRs' REGISTERs).
    fn save_bindings(&mut self, now: Instant) {
        self.bindings_save_at = None;
        self.bindings_saved_at = Some(now);
        let text = saved::encode(
            self.registrar.bindings(),
            now,
            unix_millis(SystemTime::now()),
        );
        if let Err(error) = self.store.save_bindings(&text) {
            warn!(%error, "cannot save the bindings");
        }
    }

    /// A binding added, refreshed, or registered anew with a new Call-ID
    /// (SPEC §3: the MSR restarted, subscribe anew at once): to the health
    /// monitor and the table, logged; returns the MSR.
    fn on_binding(
        &mut self,
        now: Instant,
        b: crate::registrar::Binding,
        how: Registered,
    ) -> String {
        let msr = b.msr.clone();
        match how {
            Registered::Restarted => {
                info!(msr = %b.msr, contact = %b.contact, call_id = %b.call_id, "binding restarted (new call-id), subscribing anew")
            }
            Registered::Refreshed => {
                debug!(msr = %b.msr, contact = %b.contact, "binding refreshed")
            }
            Registered::Added => info!(
                msr = %b.msr,
                contact = %b.contact,
                uri = %b.uri,
                engine = b.engine.map(|e| e.sip_uri()).as_deref().map(tracing::field::display),
                mcc = b.engine.and_then(|e| e.mcc).map(tracing::field::display),
                version = b.version.as_deref().unwrap_or("unknown"),
                "binding added"
            ),
        }
        self.health
            .contact_registered(now, &b.contact, &b.msr, &b.uri);
        self.table.apply(&self.operator, Change::BindingChanged(&b));
        if how == Registered::Restarted {
            self.subscriber.contact_restarted(now, &msr, &b.contact);
        }
        msr
    }

    /// Logs the refused REGISTERs the registrar's rate limit lets through.
    fn log_refusals(&mut self) {
        while let Some(log) = self.registrar.poll_refusal() {
            match log {
                RefusalLog::Line(r) => warn!(
                    msr = r.msr.as_deref().map(tracing::field::display),
                    auth_name = r.auth_name.as_deref().map(tracing::field::display),
                    reason = %r.reason,
                    detail = r.reason.detail(),
                    status = %r.status,
                    source = r.source.map(tracing::field::display),
                    suppressed = r.suppressed,
                    "registration refused"
                ),
                // Over MAX_REFUSAL_LINES_PER_WINDOW lines in the window.
                RefusalLog::Unlogged { count } => warn!(
                    count,
                    window_secs = REFUSAL_WINDOW.as_secs(),
                    "registration refusals not logged individually"
                ),
            }
        }
    }

    fn send_transmits(&mut self, now: Instant) {
        while let Some(t) = self.subscriber.poll_transmit() {
            debug!(msr = %t.msr, call_id = %t.call_id, "sending subscribe");
            if let Err(e) = self.endpoint.send_request(t.id, t.request) {
                warn!(msr = %t.msr, call_id = %t.call_id, cause = %e, "cannot send subscribe");
                self.subscriber.handle_failure(now, t.id, &e.to_string());
            }
        }
    }
}

/// Sends an answer to a control connection.
fn answer(reply: tokio::sync::oneshot::Sender<Response>, response: Response) {
    if reply.send(response).is_err() {
        debug!("admin client went away before the answer");
    }
}

/// The answer to a change etcd did not take.
fn commit_refusal(error: &CommitError) -> Response {
    let code = match error {
        CommitError::Conflict { .. } => ErrorCode::Conflict,
        _ => ErrorCode::StoreUnavailable,
    };
    Response::error(code, error.to_string())
}

/// Milliseconds since the Unix epoch (negative before it).
fn unix_millis(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

/// What an admin request counts as in the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Counted {
    Selection,
    Release,
    Not,
}

/// What the registrar's event said of a binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Registered {
    /// A contact that was not registered.
    Added,
    /// A refresh (same Call-ID).
    Refreshed,
    /// A new Call-ID: the MSR restarted.
    Restarted,
}

/// Where a request came from, as the transport recorded it in the top
/// `Via` (`received`/`rport` when the sent-by differs from the source,
/// RFC 3261 §18.2.1, RFC 3581); `None` for a host name.
fn source_of(req: &sip::Request) -> Option<SocketAddr> {
    use rsipstack::sip::prelude::HeadersExt;
    let via = req.via_header().ok()?;
    let (_, target) = rsipstack::transport::SipConnection::parse_target_from_via(via).ok()?;
    SocketAddr::try_from(target).ok()
}

fn allow(mut response: msr_shared::sip::Response) -> msr_shared::sip::Response {
    sip::push_header(&mut response.headers, "Allow", "REGISTER, NOTIFY, OPTIONS");
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;

    /// A loopback config with the control socket and the store at the
    /// given paths.
    fn config(socket: &Path, state: &Path) -> CollectorConfig {
        let text = format!(
            "node = \"core1@test\"\n[sip]\nlisten = \"127.0.0.1:0\"\nrealm = \"msr.local\"\n\
             [[accounts]]\nauth_name = \"msr\"\npassword = \"msr-secret\"\n\
             [control]\nsocket = \"{}\"\n[state]\npath = \"{}\"\n\
             [http]\nlisten = \"off\"\n",
            socket.display(),
            state.display()
        );
        crate::config::parse(&text, "test").expect("test config")
    }

    async fn stop(handle: CollectorHandle, shutdown: &CancellationToken) {
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), handle.join)
            .await
            .expect("stops in time")
            .expect("join")
            .expect("clean stop");
    }

    /// Two collectors on one store would each overwrite the other's
    /// acknowledged changes: the second refuses to start, naming the lock
    /// file, and leaves the first one's control socket alone; once the
    /// first has stopped, it starts.
    #[tokio::test]
    async fn a_second_collector_on_the_same_store_refuses_to_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state.json");
        let a = config(&dir.path().join("a.sock"), &state);
        let b = config(&dir.path().join("b.sock"), &state);
        let shutdown_a = CancellationToken::new();
        let handle_a = start(a, shutdown_a.clone()).await.expect("a starts");

        let err = start(b.clone(), CancellationToken::new())
            .await
            .expect_err("b must not start on a's store");
        let lock = dir.path().join("state.json.lock");
        assert!(
            matches!(&err, CollectorError::Store(StoreError::Locked { lock: l, .. }) if *l == lock),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains(&lock.display().to_string()) && text.contains("another collector holds"),
            "{text}"
        );
        assert!(!dir.path().join("b.sock").exists(), "b bound nothing");
        assert!(handle_a.control_socket.exists(), "a's socket untouched");
        // `--check-config` for b checks the config on this live host (the
        // held lock is only a note there, from `Store::check_unlocked`).
        check_environment(&b).expect("b's config checks out beside a");
        assert!(matches!(
            Store::new(dir.path().join("state.json")).check_unlocked(),
            Err(StoreError::Locked { .. })
        ));

        stop(handle_a, &shutdown_a).await;
        assert!(lock.exists(), "the lock file is never deleted");
        check_environment(&b).expect("free once a has stopped");
        let shutdown_b = CancellationToken::new();
        let handle_b = start(b, shutdown_b.clone()).await.expect("b starts now");
        stop(handle_b, &shutdown_b).await;
    }

    /// `[state] path` in a missing directory fails the check, not the
    /// start's first write of `state.json.tmp`.
    #[test]
    fn check_refuses_a_store_in_a_missing_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("no-such-dir");
        let c = config(&dir.path().join("c.sock"), &missing.join("state.json"));
        let err = check_environment(&c).expect_err("missing store directory");
        assert!(
            matches!(err, CollectorError::Store(StoreError::Directory { .. })),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains(&format!("directory {}: does not exist", missing.display())),
            "{text}"
        );
        assert!(!missing.exists(), "the check creates nothing");
    }

    #[tokio::test]
    async fn start_refuses_a_store_in_a_missing_directory_before_binding() {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("c.sock");
        let c = config(&socket, &dir.path().join("no-such-dir").join("state.json"));
        let err = start(c, CancellationToken::new())
            .await
            .expect_err("missing store directory");
        assert!(
            matches!(err, CollectorError::Store(StoreError::Directory { .. })),
            "{err:?}"
        );
        assert!(!socket.exists());
    }

    /// A regular file or a directory at `[control] socket` fails the check,
    /// not the start's bind. A socket left by a previous run is fine: the
    /// start replaces it.
    #[test]
    fn check_refuses_a_control_socket_path_that_is_not_a_socket() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state.json");
        let file = dir.path().join("file.sock");
        std::fs::write(&file, "").expect("write");
        let subdir = dir.path().join("dir.sock");
        std::fs::create_dir(&subdir).expect("mkdir");
        for (path, what) in [(&file, "a regular file"), (&subdir, "a directory")] {
            let err = check_environment(&config(path, &state)).expect_err("not a socket");
            let CollectorError::ControlSocketPath { path: p, reason } = &err else {
                panic!("{err:?}")
            };
            assert_eq!(p, path);
            assert_eq!(
                reason,
                &format!("the path exists and is {what}, not a socket")
            );
            assert!(err.to_string().starts_with("[control] socket "), "{err}");
        }
        let left = dir.path().join("left.sock");
        drop(std::os::unix::net::UnixListener::bind(&left).expect("bind"));
        assert!(left.exists());
        check_environment(&config(&left, &state)).expect("a stale socket is replaced at start");
        check_environment(&config(&dir.path().join("new.sock"), &state)).expect("no file yet");
    }
}
