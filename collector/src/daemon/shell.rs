//! The collector's loop (the parent module's docs): [`Shell`] owns the
//! sans-IO core and the shell's ends of every channel, feeds the core each
//! input with the time, sleeps until its next deadline, carries out its
//! effects (answers, commits to the file store or the etcd task, saves of
//! the bindings on a blocking thread), applies a reload (SPEC §13) and, at
//! shutdown, drains the subscriptions within [`SHUTDOWN_GRACE`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use msr_shared::admin::{Request, Response};
use msr_shared::time::unix_millis;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::{ingest, tls, SHUTDOWN_GRACE};
use crate::api::control::AdminCommand;
use crate::api::metrics::Metrics;
use crate::api::redirect::{Ask, RedirectServer, Release};
use crate::config::CollectorConfig;
use crate::core::admin::Origin;
use crate::core::snapshot::{changes_the_copy, Pacer, Published, Step};
use crate::core::{AdminId, Collector, CommitFailure, Effect, Transmit};
use crate::operator::store::etcd::{CommitError, EtcdCommand, EtcdEvent, EtcdLink};
use crate::operator::store::{Store, StoreError};

/// The most inputs of one kind served in one wake-up of the loop.
const LOOP_BATCH: usize = 64;

/// When the redirect server's socket is readable; never, without one.
async fn redirect_readable(redirect: Option<&RedirectServer>) {
    match redirect {
        Some(server) => {
            if let Err(e) = server.readable().await {
                debug!(cause = %e, "redirect socket not readable");
            }
        }
        None => std::future::pending().await,
    }
}

/// The next batch from the redirect server's stream connections; never,
/// without them.
async fn redirect_batch(
    messages: &mut Option<mpsc::Receiver<Vec<crate::core::Inbound>>>,
) -> Option<Vec<crate::core::Inbound>> {
    match messages {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// The next event of the etcd task; never, with the file store.
async fn etcd_event(link: &mut Option<EtcdLink>) -> Option<EtcdEvent> {
    match link {
        None => std::future::pending().await,
        Some(link) => link.events.recv().await,
    }
}

/// The loop's state: the core and the shell's ends of every channel.
pub(super) struct Shell {
    /// The configuration the process started with: what a reload's
    /// restart-needing settings are compared with.
    pub(super) started: CollectorConfig,
    /// The configuration in force (the start's, then each reload's): what
    /// a reload logs its changes against.
    pub(super) running: CollectorConfig,
    pub(super) reload_rx: mpsc::UnboundedReceiver<CollectorConfig>,
    pub(super) core: Collector,
    pub(super) store: Store,
    pub(super) etcd: Option<EtcdLink>,
    pub(super) admin_rx: mpsc::Receiver<AdminCommand>,
    /// Where each control request's answer goes, and whether the answer
    /// shows or changed state (not a `select` or `release`): then the
    /// read-only selections' copy is brought up to date before it leaves.
    pub(super) replies: HashMap<AdminId, (oneshot::Sender<Response>, bool)>,
    pub(super) next_admin: u64,
    pub(super) queues: ingest::Queues,
    pub(super) egress: mpsc::UnboundedSender<Vec<Transmit>>,
    pub(super) saved_tx: mpsc::UnboundedSender<(u64, Result<(), StoreError>)>,
    pub(super) saved_rx: mpsc::UnboundedReceiver<(u64, Result<(), StoreError>)>,
    pub(super) known: ingest::KnownSources,
    pub(super) known_generation: u64,
    pub(super) metrics: Arc<Metrics>,
    /// Stream connections that closed.
    pub(super) closed_rx: mpsc::UnboundedReceiver<crate::core::StreamId>,
    /// The TLS listener's acceptor, replaced when a reload reads new
    /// certificate files.
    pub(super) tls_acceptor: Option<Arc<std::sync::RwLock<tokio_rustls::TlsAcceptor>>>,
    /// The SIP redirect server (`[redirect]`), served on this loop: each
    /// INVITE's selection is asked of the core directly.
    pub(super) redirect: Option<RedirectServer>,
    /// Messages from the redirect server's stream connections.
    pub(super) redirect_streams: Option<mpsc::Receiver<Vec<crate::core::Inbound>>>,
    /// The redirect server's new selections of one wake-up (kept for its
    /// capacity).
    pub(super) asks: Vec<Ask>,
    /// Where the copy the front ends' read-only selections read goes
    /// ([`crate::core::snapshot`]), and when the next is due.
    pub(super) published: Published,
    pub(super) pacer: Pacer,
}

impl Shell {
    /// The time, given to the core with the wall clock.
    fn now(&mut self) -> Instant {
        let now = Instant::now();
        self.core
            .set_wall_clock(now, unix_millis(SystemTime::now()));
        now
    }

    pub(super) async fn run(&mut self, shutdown: &CancellationToken) {
        loop {
            self.drive();
            self.publish(false);
            let deadline = self.core.poll_timeout();
            // A copy is due only while someone reads them.
            let copy_due = if self.published.wanted() {
                self.pacer.due(Instant::now())
            } else {
                None
            };
            let wake = match (deadline, copy_due) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let sleep = async move {
                match wake {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => break,
                Some(batch) = self.queues.known.recv() => self.on_batch(batch, true),
                Some(batch) = self.queues.other.recv() => self.on_batch(batch, false),
                Some(command) = self.admin_rx.recv() => {
                    // It says itself whether it changed anything.
                    self.on_admin(command);
                    continue;
                }
                () = redirect_readable(self.redirect.as_ref()) => {
                    if self.on_redirect(None) {
                        // The control socket's connections run on this
                        // thread too: a socket that stays readable (the
                        // redirect's, under a flood; its readiness spends
                        // none of tokio's budget) must not keep the loop
                        // from yielding to them and to the I/O driver.
                        tokio::task::yield_now().await;
                    }
                }
                Some(batch) = redirect_batch(&mut self.redirect_streams) => {
                    self.on_redirect(Some(batch));
                }
                Some(event) = etcd_event(&mut self.etcd) => {
                    let now = self.now();
                    self.core.handle_etcd(now, event);
                    // Another collector's operator change reaches the
                    // read-only selections at once, as a local one does
                    // (SPEC §11, `core::snapshot`).
                    self.drive();
                    self.pacer.touched();
                    self.publish(true);
                }
                Some((generation, result)) = self.saved_rx.recv() => {
                    let now = self.now();
                    self.core.handle_bindings_saved(now, generation, result);
                }
                Some(config) = self.reload_rx.recv() => self.on_reload(&config),
                Some(id) = self.closed_rx.recv() => self.core.handle_stream_closed(id),
                () = sleep => {
                    // The wake may be the copy's alone.
                    let now = self.now();
                    if deadline.is_some_and(|at| at <= now) {
                        self.core.handle_timeout(now);
                        self.pacer.touched();
                    }
                    continue;
                }
            }
            self.pacer.touched();
        }
        self.drain().await;
    }

    /// Publishes a copy for the read-only selections when one is due, or
    /// at once with `force` while the last is behind (module docs of
    /// [`crate::core::snapshot`]).
    fn publish(&mut self, force: bool) {
        let started = Instant::now();
        match self.pacer.step(started, force, self.published.wanted()) {
            Step::Wait => {}
            Step::Behind => self.published.mark_behind(),
            Step::Copy => {
                self.published.publish(self.core.snapshot());
                self.pacer.published(started, started.elapsed());
            }
        }
    }

    /// A reloaded configuration (SPEC §13).
    fn on_reload(&mut self, config: &CollectorConfig) {
        // SPEC §16: a default site that is not declared would put every
        // new contact where no leg can reach it.
        if !self.core.site_declared(&config.defaults.site) {
            error!(
                refused_site = %config.defaults.site,
                running_site = %self.running.defaults.site,
                "config reload refused: [defaults] site is not declared (msrctl site declare it first); the running configuration stays"
            );
            return;
        }
        for (key, from, to) in crate::config::reload_changes(&self.running, config) {
            info!(key, from = %from, to = %to, "reload changed");
        }
        self.running = config.clone();
        let now = self.now();
        self.core.reconfigure(now, config);
        self.reload_certificates(config);
        let pending = crate::config::restart_needed(&self.started, config);
        if pending.is_empty() {
            info!("configuration reloaded");
        } else {
            warn!(
                restart_needed = %pending.join(","),
                "configuration reloaded; these settings differ from the running ones and take effect at the next restart"
            );
        }
    }

    /// Reads the `[sip.tls]` files again: new connections get the new
    /// certificate, client CA and `require`; files that cannot be used
    /// leave the running ones, all three.
    fn reload_certificates(&mut self, config: &CollectorConfig) {
        let (Some(acceptor), Some(settings)) = (&self.tls_acceptor, &config.sip.tls) else {
            return;
        };
        // A certificate that can't be used now would turn a working
        // listener into one every handshake fails on.
        if let Some(reason) =
            msr_shared::certificate::unusable_now(&settings.cert, SystemTime::now())
        {
            warn!(
                path = %settings.cert.display(),
                %reason,
                "sip tls files not reloaded; the running certificate stays"
            );
            return;
        }
        match tls::server_config(settings) {
            Ok(server) => {
                if let Ok(mut running) = acceptor.write() {
                    *running = tokio_rustls::TlsAcceptor::from(server);
                    self.core
                        .set_tls_policy(settings.require, settings.client_ca.is_some());
                    info!(
                        require = settings.require,
                        mutual = settings.client_ca.is_some(),
                        "sip tls certificate files read again"
                    );
                    for warning in tls::validity_warnings(settings) {
                        warn!("{warning}");
                    }
                }
            }
            Err(error) => {
                warn!(%error, "sip tls files not reloaded; the running certificate stays")
            }
        }
    }

    /// One batch from the ingest, and up to [`LOOP_BATCH`] more of the same
    /// queue that are already waiting.
    fn on_batch(&mut self, batch: Vec<crate::core::Inbound>, known: bool) {
        let now = self.now();
        for inbound in batch {
            self.core.handle_message(now, inbound);
        }
        for _ in 1..LOOP_BATCH {
            let queue = if known {
                &mut self.queues.known
            } else {
                &mut self.queues.other
            };
            let Some(batch) = queue.try_recv() else {
                break;
            };
            for inbound in batch {
                self.core.handle_message(now, inbound);
            }
        }
        if self.core.poll_timeout().is_some_and(|at| at <= now) {
            self.core.handle_timeout(now);
        }
    }

    /// The control requests waiting, at most [`LOOP_BATCH`].
    fn on_admin(&mut self, first: AdminCommand) {
        let mut next = Some(first);
        let mut served = 0;
        while let Some(command) = next.take() {
            let now = self.now();
            self.next_admin += 1;
            let id = AdminId(self.next_admin);
            let select = matches!(command.request, Request::Select(_));
            let shows_state = !select && !matches!(command.request, Request::Release { .. });
            let changes = changes_the_copy(&command.request);
            self.replies.insert(id, (command.reply, shows_state));
            self.core
                .handle_admin_from(now, id, command.request, command.origin);
            // A selection or release may have changed what a list
            // answered later in this batch shows.
            if changes {
                self.pacer.touched();
            }
            if select {
                self.metrics.selection_duration(now.elapsed().as_secs_f64());
            }
            // A change's commit is carried out before the next request.
            self.drive();
            served += 1;
            if served < LOOP_BATCH {
                next = self.admin_rx.try_recv().ok();
            }
        }
    }

    /// The redirect server's datagrams (`batch` is `None`) or a batch of
    /// its stream messages: each new INVITE's `select` is asked of the
    /// core here, and its answer, an [`Effect::Answer`], sends the final
    /// response as [`drive`](Self::drive) carries it out.
    ///
    /// Whether the socket had more to read than one batch (a flood).
    fn on_redirect(&mut self, batch: Option<Vec<crate::core::Inbound>>) -> bool {
        // One clock read for the batch: the cache's and the core's time.
        let now = self.now();
        let Some(server) = self.redirect.as_mut() else {
            return false;
        };
        let mut asks = std::mem::take(&mut self.asks);
        let full = match batch {
            None => server.on_readable(now, &mut asks),
            Some(batch) => {
                server.on_streams(now, batch, &mut asks);
                false
            }
        };
        if asks.is_empty() {
            self.asks = asks;
            return full;
        }
        for ask in asks.drain(..) {
            self.next_admin += 1;
            let id = AdminId(self.next_admin);
            let Some(request) = self.redirect.as_mut().and_then(|r| r.admit(id, ask)) else {
                continue;
            };
            let started = Instant::now();
            self.core
                .handle_admin_from(now, id, request, Origin::Redirect);
            self.metrics
                .selection_duration(started.elapsed().as_secs_f64());
        }
        self.asks = asks;
        // Selections change no stored setting: their answers, and the
        // final responses they send, go out together.
        self.drive();
        full
    }

    /// Carries out what the core produced: messages to the writer, known
    /// sources to the readers, effects.
    fn drive(&mut self) {
        loop {
            let mut out = Vec::new();
            while let Some(t) = self.core.poll_transmit() {
                out.push(t);
            }
            if !out.is_empty() && self.egress.send(out).is_err() {
                debug!("sip writer gone");
            }
            while let Some(count) = self.core.poll_count() {
                self.metrics.count(&count);
            }
            if let Some(event) = self.core.poll_event() {
                crate::core::log::log(Instant::now(), &event);
                continue;
            }
            let Some(effect) = self.core.poll_effect() else {
                break;
            };
            self.on_effect(effect);
        }
        let generation = self.core.bindings_generation();
        if generation != self.known_generation {
            self.known_generation = generation;
            self.known
                .publish(generation, self.core.known_sources().collect());
        }
    }

    fn on_effect(&mut self, effect: Effect) {
        match effect {
            Effect::Answer { id, response } => {
                if let Some(server) = self.redirect.as_mut().filter(|r| r.is_pending(id)) {
                    if let Some(Release { call_id, leg }) = server.answered(id, &response) {
                        // Nobody has the leg's Contact: released as the
                        // control protocol's `release` does, its answer
                        // wanted by no one.
                        self.next_admin += 1;
                        let id = AdminId(self.next_admin);
                        let now = self.now();
                        self.core.handle_admin_from(
                            now,
                            id,
                            Request::Release { call_id, leg },
                            Origin::Redirect,
                        );
                    }
                } else if let Some((reply, shows_state)) = self.replies.remove(&id) {
                    if shows_state {
                        self.publish(true);
                    }
                    if reply.send(*response).is_err() {
                        debug!("control client went away before the answer");
                    }
                }
            }
            Effect::Commit {
                ticket,
                config,
                expected,
            } => match &mut self.etcd {
                None => {
                    let result = self.store.save(&config).map_err(CommitFailure::File);
                    let now = self.now();
                    self.core.handle_committed(now, ticket, result);
                    self.pacer.touched();
                }
                Some(link) => {
                    let command = EtcdCommand::Commit {
                        ticket: ticket.0,
                        config,
                        expected,
                    };
                    if let Err(error) = link.commands.try_send(command) {
                        let error = CommitError::Unavailable {
                            reason: format!("the etcd task does not take commands: {error}"),
                        };
                        let now = self.now();
                        self.core.handle_etcd(
                            now,
                            EtcdEvent::Refused {
                                ticket: ticket.0,
                                error,
                            },
                        );
                    }
                }
            },
            Effect::SaveBindings { generation, text } => {
                let store = self.store.clone();
                let done = self.saved_tx.clone();
                tokio::task::spawn_blocking(move || {
                    let result = store.save_bindings(&text);
                    let _ = done.send((generation, result));
                });
            }
        }
    }

    /// Ends every subscription and waits (bounded) for the answers to these
    /// unsubscribes and for the final NOTIFYs that follow them, answering
    /// every SIP request that arrives meanwhile; then logs what the rate
    /// limits hold back and saves the bindings (the MSRs stay registered:
    /// the next collector resumes them).
    async fn drain(&mut self) {
        let now = self.now();
        let sent = self.core.shutdown(now);
        let deadline = now + SHUTDOWN_GRACE;
        loop {
            self.drive();
            if self.core.is_drained() {
                break;
            }
            let timeout = self
                .core
                .poll_timeout()
                .map_or(deadline, |t| t.min(deadline));
            tokio::select! {
                () = tokio::time::sleep_until(timeout) => {
                    if Instant::now() >= deadline {
                        let (unanswered, final_notifies) = self.core.awaited();
                        if unanswered > 0 {
                            warn!(unanswered, final_notifies, subscriptions = sent, "unsubscribe answers not received in time");
                        } else {
                            warn!(final_notifies, subscriptions = sent, "final notifies not received in time");
                        }
                        break;
                    }
                    let now = self.now();
                    self.core.handle_timeout(now);
                }
                Some(batch) = self.queues.known.recv() => self.on_batch(batch, true),
                Some(batch) = self.queues.other.recv() => self.on_batch(batch, false),
                Some((generation, result)) = self.saved_rx.recv() => {
                    let now = self.now();
                    self.core.handle_bindings_saved(now, generation, result);
                }
            }
        }
        let now = self.now();
        self.core.flush_logs(now);
        if let Err(error) = self.store.save_bindings(&self.core.bindings_text(now)) {
            warn!(%error, "cannot save the bindings");
        }
        self.drive();
    }
}
