//! The collector's one async loop: it owns the SIP endpoint and every piece
//! of state, and feeds the sans-IO cores ([`Registrar`], [`Subscriber`])
//! and the admin handler ([`admin::handle`]), and the health monitor
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

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use msr_shared::sip::{self, Method, SipEndpoint, SipEvent, StatusCode};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::admin::{self, AdminCommand, AdminContext};
use crate::config::CollectorConfig;
use crate::error::CollectorError;
use crate::health::{HealthEvent, HealthMonitor};
use crate::load_table::{ContactBinding, LoadTable};
use crate::operator::OperatorConfig;
use crate::registrar::{RefusalLog, Registrar, RegistrarEvent, RemovalCause, REFUSAL_WINDOW};
use crate::store::Store;
use crate::subscriber::{Subscriber, SubscriberConfig, SubscriberEvent, Target};
use msr_shared::fs::cannot_create_in;

/// Longest wait at shutdown for the answers to the final `Expires: 0`
/// SUBSCRIBEs and for the final NOTIFYs that follow them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// At shutdown, how long answers to SIP requests still being sent may take
/// when [`SHUTDOWN_GRACE`] is already over.
const REPLY_FLUSH: Duration = Duration::from_millis(100);

/// The `User-Agent`/`Server` of the collector.
const USER_AGENT: &str = concat!("msr-collector/", env!("CARGO_PKG_VERSION"));

/// A running collector (see [`start`]).
#[derive(Debug)]
pub struct CollectorHandle {
    /// The bound SIP (UDP) address.
    pub sip_addr: SocketAddr,
    /// The control socket path.
    pub control_socket: PathBuf,
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
    let mut operator = store.load()?;
    // The site new contacts get must exist, or every leg at it is refused
    // with `unknown_site` until an operator declares it.
    if !operator.topology().contains(&config.defaults.site) {
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
    tokio::spawn(admin::serve(listener, admin_tx, admin_stop.clone()));

    let local = format!("sip:collector@{sip_addr}");
    let mut table = LoadTable::new(config.node.clone());
    table.apply_operator(&operator, &config.defaults.zone, &config.defaults.site);
    let mut subscriber = Subscriber::new(SubscriberConfig {
        local_uri: local.clone(),
        contact: local,
        default_expires: config.subscription.expires,
    });
    for (msr, settings) in operator.configured_msrs() {
        subscriber.set_expires_override(msr, settings.subscription_expires);
    }
    let shell = Shell {
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
        },
        rng: StdRng::from_entropy(),
        endpoint,
        admin_rx,
        replies: JoinSet::new(),
    };
    let socket_path = control_socket.clone();
    let join = tokio::spawn(async move {
        let result = shell.run(shutdown).await;
        admin_stop.cancel();
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
        join,
    })
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
    endpoint: SipEndpoint,
    admin_rx: mpsc::Receiver<AdminCommand>,
    /// The tasks sending answers to SIP requests; reaped as they finish,
    /// and waited for (bounded) before the endpoint stops at shutdown.
    replies: JoinSet<()>,
}

impl Shell {
    async fn run(mut self, shutdown: CancellationToken) -> Result<(), CollectorError> {
        loop {
            self.settle(Instant::now());
            while self.replies.try_join_next().is_some() {}
            let deadline = [
                self.registrar.poll_timeout(),
                self.subscriber.poll_timeout(),
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
                Some(command) = self.admin_rx.recv() => self.on_admin(command),
                () = sleep => {
                    let now = Instant::now();
                    self.registrar.handle_timeout(now);
                    self.subscriber.handle_timeout(now);
                    self.health.handle_timeout(now);
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
        self.endpoint.shutdown();
    }

    fn on_sip(&mut self, event: SipEvent) {
        let now = Instant::now();
        match event {
            SipEvent::Request(tx) => {
                let req = tx.request();
                let response = match req.method {
                    Method::Register => self.registrar.handle_register(now, req, source_of(req)),
                    Method::Notify => {
                        let unix_now = admin::unix_secs(SystemTime::now());
                        let response = self.subscriber.handle_notify(now, unix_now, req);
                        if response.status_code != StatusCode::OK {
                            info!(
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
        let mut ctx = AdminContext {
            operator: &mut self.operator,
            table: &mut self.table,
            store: &self.store,
            defaults: &self.admin_defaults,
            rng: &mut self.rng,
        };
        let response = admin::handle(command.request, &mut ctx, now);
        for (msr, settings) in self.operator.configured_msrs() {
            self.subscriber
                .set_expires_override(msr, settings.subscription_expires);
        }
        if command.reply.send(response).is_err() {
            debug!("admin client went away before the answer");
        }
    }

    /// Applies what the cores produced: table updates, logs, requests to send.
    fn settle(&mut self, now: Instant) {
        let zone = self.admin_defaults.zone.clone();
        let site = self.admin_defaults.site.clone();
        while let Some(event) = self.registrar.poll_event() {
            let msr = match event {
                RegistrarEvent::BindingAdded(b) | RegistrarEvent::BindingRefreshed(b) => {
                    let msr = b.msr.clone();
                    if self.table.contains_contact(&b.contact) {
                        debug!(msr = %b.msr, contact = %b.contact, "binding refreshed");
                    } else {
                        info!(msr = %b.msr, contact = %b.contact, uri = %b.uri, version = b.version.as_deref().unwrap_or("unknown"), "binding added");
                    }
                    self.health
                        .contact_registered(now, &b.contact, &b.msr, &b.uri);
                    self.table.upsert_contact(
                        ContactBinding {
                            contact: b.contact,
                            msr: b.msr,
                            uri: b.uri,
                            version: b.version,
                            expires_at: b.expires_at,
                        },
                        &self.operator,
                        &zone,
                        &site,
                    );
                    msr
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
                    self.table.remove_contact(&binding.contact);
                    if !self.registrar.is_registered(&binding.msr) {
                        self.table.remove_msr(&binding.msr);
                    }
                    binding.msr
                }
            };
            let targets = self
                .registrar
                .contacts_of(&msr)
                .into_iter()
                .map(|b| Target {
                    name: b.contact.clone(),
                    uri: b.uri.clone(),
                })
                .collect();
            self.subscriber.contacts_changed(now, &msr, targets);
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
                    self.table.set_load(&msr, report, at);
                }
                SubscriberEvent::Terminated {
                    msr,
                    call_id,
                    reason,
                    retry_at,
                } => match retry_at.map(|t| t.saturating_duration_since(now)) {
                    Some(wait) => {
                        info!(%msr, %call_id, %reason, retry_in_ms = wait.as_millis() as u64, "subscription terminated")
                    }
                    None => info!(%msr, %call_id, %reason, "subscription terminated, not retrying"),
                },
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
            self.table.set_subscription(&msr, view);
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
                    self.table
                        .set_health(&change.contact, change.to, (change.at, unix));
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

    /// Logs the refused REGISTERs the registrar's rate limit lets through.
    fn log_refusals(&mut self) {
        while let Some(log) = self.registrar.poll_refusal() {
            match log {
                RefusalLog::Refused(r) => warn!(
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
             [control]\nsocket = \"{}\"\n[state]\npath = \"{}\"\n",
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

    /// `[state] path` in a missing directory used to pass the check, and the
    /// start then failed writing `state.json.tmp`.
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

    /// A regular file or a directory at `[control] socket` used to pass the
    /// check, and the start then failed to bind. A socket left by a previous
    /// run is fine: the start replaces it.
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
