//! The collector's shell: the sockets, the timer, the files and the etcd
//! link around the sans-IO [`Collector`], and nothing else.
//!
//! [`start`] takes the operator store's lock, loads the configuration,
//! binds every socket, builds the core and spawns:
//!
//! * the SIP readers (`ingest::read_udp`, and `ingest::accept_streams`
//!   with TCP or TLS), which admit, parse and queue messages for the loop;
//! * the SIP writer (`ingest::write`), which sends what the core emits;
//! * the control socket and HTTP servers, which send control requests to
//!   the loop;
//! * with etcd, its task ([`crate::operator::store::etcd`]);
//! * the loop (`Shell::run`, in `shell.rs`): it feeds the core each input with the
//!   time, sleeps until the core's next deadline, and carries out the
//!   core's effects — answers, commits (the file store's save, or a
//!   command to the etcd task) and the saves of the bindings, which run on
//!   a blocking thread so the loop goes on while the disk works.
//!
//! The runtime has a worker per core, so the readers' parsing and the
//! writer's sends run beside the loop, which owns every fact. HTTP has
//! threads of its own, one per core, and an accepting thread that hands
//! them the connections in turn (`serve_http_on_threads`). The loop has a
//! thread of its own (`collector-core`), and
//! the control socket's connections run on it: each of their requests is
//! one selection, and handing it to another thread and its answer back
//! cost more CPU, and more time, than the rest of the request
//! (BENCHMARKS.md, "The redirect on the core's thread"). The loop itself
//! serves the redirect server's socket (`RedirectServer`): an INVITE's
//! selection is a call into the core, its 302 sent before the loop sleeps
//! again. The price: a control answer is encoded on that thread too (a
//! `resource list` of 10,000 MSRs, a few milliseconds, about what the core
//! spends building its rows). HTTP stays off it: `/metrics` encodes far
//! more, and the HTTP port's peers are not the local operator's.
//!
//! Shutdown: `Expires: 0` for every subscription, at most
//! [`SHUTDOWN_GRACE`] waiting for the answers and for the final NOTIFYs
//! that follow them (and answering whatever else arrives), the bindings
//! saved, then the control socket removed and the store's lock released.

mod environment;
mod ingest;
mod shell;
#[cfg(test)]
mod tests;
pub mod tls;

pub mod cli;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::api::control as admin;
use crate::api::metrics::Metrics;
use crate::api::redirect::{RedirectContext, RedirectServer};
use crate::config::{CollectorConfig, StoreBackend};
use crate::core::{Backend, Collector, Start};
use crate::error::CollectorError;
use crate::operator::cluster::Cluster;
use crate::operator::store::etcd::{self, EtcdEvent, EtcdLink, Member};
use crate::operator::store::Store;
use crate::operator::OperatorConfig;
use crate::sip::admission::AdmissionConfig;
use msr_shared::time::{unix_millis, unix_secs};

pub use environment::{check_environment, environment_problems};
pub use ingest::IngestStats;
use shell::Shell;

/// Longest wait at shutdown for the answers to the final `Expires: 0`
/// SUBSCRIBEs and for the final NOTIFYs that follow them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// At shutdown, how long the messages still queued for the writer may
/// take when [`SHUTDOWN_GRACE`] is already over.
const REPLY_FLUSH: Duration = Duration::from_millis(100);

/// Ports tried for `listen = "…:0"` with TCP on, until one is free for
/// both transports.
const PORT_ZERO_ATTEMPTS: u32 = 16;

/// Binds UDP on `listen` and, with `tcp`, TCP on the UDP socket's port.
/// With port 0 the kernel picks a port free for UDP that TCP may already
/// use (another socket's ephemeral port): then another one is picked.
async fn bind_udp_and_tcp(
    listen: SocketAddr,
    tcp: bool,
) -> Result<
    (
        std::net::UdpSocket,
        SocketAddr,
        Option<tokio::net::TcpListener>,
    ),
    (&'static str, SocketAddr, std::io::Error),
> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        let udp = msr_shared::sip::std_udp_socket(listen).map_err(|e| ("udp", listen, e))?;
        let addr = udp.local_addr().map_err(|e| ("udp", listen, e))?;
        if !tcp {
            return Ok((udp, addr, None));
        }
        match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => return Ok((udp, addr, Some(listener))),
            Err(e)
                if listen.port() == 0
                    && e.kind() == std::io::ErrorKind::AddrInUse
                    && attempts < PORT_ZERO_ATTEMPTS => {}
            Err(e) => return Err(("tcp", addr, e)),
        }
    }
}

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
    /// A reloaded configuration, already validated, to apply (SPEC §13:
    /// `SIGHUP`): what can change live does, what needs a restart is named
    /// in a warning.
    pub reload: mpsc::UnboundedSender<CollectorConfig>,
    /// Ends when the collector has shut down.
    pub join: JoinHandle<Result<(), CollectorError>>,
}

/// Runs the collector until `shutdown` is cancelled (then ends the
/// subscriptions and removes the control socket).
///
/// # Errors
/// As [`start`].
pub async fn run(
    config: CollectorConfig,
    shutdown: CancellationToken,
) -> Result<(), CollectorError> {
    let handle = start(config, shutdown).await?;
    handle.join.await.map_err(|e| CollectorError::Task {
        reason: e.to_string(),
    })?
}

/// Takes the operator store's lock, loads the operator configuration, binds
/// the SIP sockets and the control socket, and spawns the collector's
/// tasks; the loop holds the lock until it has stopped. `[sip] listen` may
/// use port 0.
///
/// The lock is taken before anything else is bound, so a second collector
/// on the same store stops there, without touching the first one's control
/// socket.
///
/// # Errors
/// [`CollectorError::Store`] (with [`StoreError::Locked`](crate::operator::store::StoreError::Locked)
/// when another collector runs on the same store), [`CollectorError::Sip`],
/// [`CollectorError::ControlSocket`] or [`CollectorError::ControlSocketPath`]
/// when a resource cannot be had.
pub async fn start(
    config: CollectorConfig,
    shutdown: CancellationToken,
) -> Result<CollectorHandle, CollectorError> {
    let store = Store::new(config.state_path.clone());
    store.check_dir()?;
    environment::check_control_socket(&config.control_socket)?;
    let lock = store.lock()?;
    debug!(lock = %lock.path().display(), "operator store locked");
    let mut operator = match config.store {
        StoreBackend::File => store.load()?,
        // Read from etcd once the SIP address (part of the membership key) is bound.
        StoreBackend::Etcd(_) => OperatorConfig::new(),
    };
    // The default site, declared before anything is served (with etcd:
    // once etcd is reachable, the core declares it).
    if config.store == StoreBackend::File {
        if let Some(next) = operator.with_default_site(&config.defaults.site) {
            store.save(&next)?;
            operator = next;
        }
    }
    let bind_error =
        |transport: &'static str, addr: SocketAddr, source: std::io::Error| CollectorError::Sip {
            transport,
            addr,
            source,
        };
    let (udp, sip_addr, tcp) = bind_udp_and_tcp(config.sip.listen, config.sip.tcp())
        .await
        .map_err(|(transport, addr, e)| bind_error(transport, addr, e))?;
    // The reader has the socket on a thread of its own; the writer sends
    // on a clone of it (the same socket, so every datagram leaves from the
    // one address, SPEC §4).
    let reader_socket = udp
        .try_clone()
        .map_err(|e| bind_error("udp", sip_addr, e))?;
    let udp =
        Arc::new(tokio::net::UdpSocket::from_std(udp).map_err(|e| bind_error("udp", sip_addr, e))?);
    info!(addr = %sip_addr, "listening on udp {sip_addr}");
    if tcp.is_some() {
        info!(addr = %sip_addr, "listening on tcp {sip_addr}");
    }
    let tls = match &config.sip.tls {
        Some(settings) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls::server_config(settings)?);
            for warning in tls::validity_warnings(settings) {
                warn!("{warning}");
            }
            let listener = tokio::net::TcpListener::bind(settings.listen)
                .await
                .map_err(|e| bind_error("tls", settings.listen, e))?;
            let addr = listener
                .local_addr()
                .map_err(|e| bind_error("tls", settings.listen, e))?;
            info!(
                %addr,
                mutual = settings.client_ca.is_some(),
                "listening on tls {addr}"
            );
            Some((listener, addr, Arc::new(std::sync::RwLock::new(acceptor))))
        }
        None => None,
    };
    // The core's own thread and runtime (`run_on_thread`); the control
    // socket and the redirect server run there too (module docs).
    let core_runtime = CoreRuntime(Some(
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| CollectorError::Task {
                reason: format!("cannot build the collector's loop runtime: {e}"),
            })?,
    ));
    let control_socket = config.control_socket.clone();
    let listener = {
        let _core = core_runtime.enter();
        admin::bind_control_socket(&control_socket)
    }
    .map_err(|source| CollectorError::ControlSocket {
        path: control_socket.clone(),
        source,
    })?;
    info!(path = %control_socket.display(), "control socket on {}", control_socket.display());
    let (admin_tx, admin_rx) = mpsc::channel(1024);
    // The read-only selections' copy of the core (`core::snapshot`): the
    // loop writes it, the HTTP API and the control socket read it.
    let published = crate::core::snapshot::Published::default();
    let admin_stop = CancellationToken::new();
    let metrics = Arc::new(Metrics::new());
    let stats = Arc::new(IngestStats::default());
    // SPEC §11: the HTTP API sends its requests over the control socket's
    // channel, to the core; the redirect server is served by the
    // loop itself.
    let http_addr = match &config.http {
        Some(http) => {
            let error = |source| CollectorError::Http {
                addr: http.listen,
                source,
            };
            let listener = crate::api::http::bind(http.listen).await.map_err(error)?;
            let addr = listener.local_addr().map_err(error)?;
            info!(%addr, "listening on http {addr}");
            let router = crate::api::http::router(
                admin_tx.clone(),
                published.clone(),
                Arc::clone(&metrics),
                Arc::clone(&stats),
                http.token.clone(),
            );
            serve_http_on_threads(listener, router, &shutdown).map_err(error)?;
            Some(addr)
        }
        None => None,
    };
    let (redirect_addr, redirect) = match &config.redirect {
        Some(redirect) => {
            let error = |source| CollectorError::Redirect {
                addr: redirect.listen,
                source,
            };
            let (socket, addr, tcp) = bind_udp_and_tcp(redirect.listen, redirect.tcp)
                .await
                .map_err(|(_, _, e)| error(e))?;
            socket.set_nonblocking(true).map_err(error)?;
            let sender = socket.try_clone().map_err(error)?;
            let socket = {
                let _core = core_runtime.enter();
                tokio::net::UdpSocket::from_std(socket).map_err(error)?
            };
            info!(%addr, "redirect server listening on udp {addr}");
            let tls_listener = match (redirect.tls_listen, &tls) {
                (Some(at), Some((_, _, acceptor))) => {
                    let error = |source| CollectorError::Redirect { addr: at, source };
                    let listener = tokio::net::TcpListener::bind(at).await.map_err(error)?;
                    let bound = listener.local_addr().map_err(error)?;
                    info!(addr = %bound, "redirect server listening on tls {bound}");
                    Some((listener, Arc::clone(acceptor)))
                }
                _ => None,
            };
            let streams = if tcp.is_some() || tls_listener.is_some() {
                let (tx, messages) = mpsc::channel(ingest::OTHER_QUEUE);
                let streams = ingest::Streams::default();
                if let Some(listener) = tcp {
                    info!(%addr, "redirect server listening on tcp {addr}");
                    tokio::spawn(ingest::accept_streams(
                        listener,
                        ingest::Opening::Tcp,
                        ingest::Sink::Queue(tx.clone()),
                        streams.clone(),
                        shutdown.clone(),
                    ));
                }
                if let Some((listener, acceptor)) = tls_listener {
                    tokio::spawn(ingest::accept_streams(
                        listener,
                        ingest::Opening::Tls(acceptor),
                        ingest::Sink::Queue(tx),
                        streams.clone(),
                        shutdown.clone(),
                    ));
                }
                let reply: crate::api::redirect::StreamReply =
                    Arc::new(move |id, bytes| streams.send(id, bytes));
                Some(crate::api::redirect::StreamSide { messages, reply })
            } else {
                None
            };
            let ctx = RedirectContext {
                own: vec![addr, sip_addr],
                allow: redirect.allow.clone(),
            };
            let (messages, reply) = match streams {
                Some(side) => (Some(side.messages), Some(side.reply)),
                None => (None, None),
            };
            let server = RedirectServer::new(socket, sender, reply, ctx, Arc::clone(&metrics));
            (Some(addr), Some((server, messages)))
        }
        None => (None, None),
    };
    let read_only = crate::api::read_only::ReadOnly {
        published: published.clone(),
        metrics: Arc::clone(&metrics),
    };
    core_runtime.spawn(admin::serve(
        listener,
        admin_tx,
        read_only,
        admin_stop.clone(),
    ));

    let this = Member {
        node: config.node.clone(),
        sip: sip_addr.to_string(),
        started_unix: unix_secs(SystemTime::now()),
    };
    let (backend, cluster, etcd, etcd_join) = match &config.store {
        StoreBackend::File => (
            Backend::File,
            Cluster::file(
                this,
                store.path().display().to_string(),
                config.cluster.core_hosts,
            ),
            None,
            None,
        ),
        StoreBackend::Etcd(etcd_config) => {
            let mut cluster = Cluster::etcd(
                this.clone(),
                etcd_config.endpoints.join(","),
                etcd_config.prefix.clone(),
                config.cluster.core_hosts,
                std::time::SystemTime::now(),
            );
            let (mut link, join) =
                etcd::spawn(etcd_config.clone(), this, store.clone(), shutdown.clone());
            operator = first_configuration(etcd_config, &mut link, &mut cluster, &store).await?;
            (Backend::Etcd, cluster, Some(link), Some(join))
        }
    };
    let now = Instant::now();
    let mut core = Collector::new(
        &config,
        Start {
            local: sip_addr,
            operator,
            cluster,
            backend,
            seed: rand::random(),
            now,
            unix_ms: unix_millis(SystemTime::now()),
        },
    );
    match store.load_bindings() {
        Ok(Some(text)) => core.restore_bindings(now, &text),
        Ok(None) => {}
        Err(error) => warn!(%error, "cannot read the saved bindings, starting without them"),
    }

    let io_stop = CancellationToken::new();
    let known = ingest::KnownSources::default();
    let (queues, to_loop) = ingest::queues();
    let (closed_tx, closed_rx) = mpsc::unbounded_channel();
    let streams = ingest::Streams::new(closed_tx);
    core.set_stream_listeners(
        tcp.as_ref().map(|_| sip_addr),
        tls.as_ref().map(|(_, addr, _)| *addr),
    );
    let (egress, from_loop) = mpsc::unbounded_channel();
    spawn_thread("sip-ingest", {
        let (to_loop, egress, known, stats, stop) = (
            to_loop.clone(),
            egress.clone(),
            known.clone(),
            Arc::clone(&stats),
            io_stop.clone(),
        );
        move || async move {
            match tokio::net::UdpSocket::from_std(reader_socket) {
                Ok(socket) => {
                    ingest::read_udp(
                        Arc::new(socket),
                        to_loop,
                        egress,
                        known,
                        AdmissionConfig::default(),
                        stats,
                        stop,
                    )
                    .await
                }
                Err(e) => warn!(error = %e, "sip udp reader cannot start"),
            }
        }
    })
    .map_err(|e| bind_error("udp", sip_addr, e))?;
    if let Some(listener) = tcp {
        tokio::spawn(ingest::accept_streams(
            listener,
            ingest::Opening::Tcp,
            ingest::Sink::Core(to_loop.clone(), known.clone()),
            streams.clone(),
            io_stop.clone(),
        ));
    }
    let tls_acceptor = match tls {
        Some((listener, _, acceptor)) => {
            tokio::spawn(ingest::accept_streams(
                listener,
                ingest::Opening::Tls(Arc::clone(&acceptor)),
                ingest::Sink::Core(to_loop, known.clone()),
                streams.clone(),
                io_stop.clone(),
            ));
            Some(acceptor)
        }
        None => None,
    };
    let writer = tokio::spawn(ingest::write(udp, streams, from_loop));
    let (saved_tx, saved_rx) = mpsc::unbounded_channel();
    let (reload, reload_rx) = mpsc::unbounded_channel();
    let (redirect, redirect_streams) = match redirect {
        Some((server, messages)) => (Some(server), messages),
        None => (None, None),
    };
    let mut shell = Shell {
        started: config.clone(),
        running: config.clone(),
        reload_rx,
        core,
        store,
        etcd,
        admin_rx,
        replies: HashMap::new(),
        next_admin: 0,
        queues,
        egress,
        saved_tx,
        saved_rx,
        known,
        known_generation: u64::MAX,
        metrics,
        closed_rx,
        tls_acceptor,
        redirect,
        redirect_streams,
        asks: Vec::new(),
        published,
        pacer: crate::core::snapshot::Pacer::default(),
    };
    let socket_path = control_socket.clone();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let core_loop = async move {
        shell.run(&shutdown).await;
        io_stop.cancel();
        admin_stop.cancel();
        // The writer ends once the loop's and the reader's senders are
        // gone (the reader stops with `io_stop`) and its queue is sent
        // (bounded).
        drop(shell);
        if tokio::time::timeout(REPLY_FLUSH, writer).await.is_err() {
            warn!("answers to sip requests not sent before shutdown");
        }
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
        let _ = done_tx.send(());
    };
    run_on_thread(core_runtime.into_inner(), "collector-core", move || {
        core_loop
    })
    .map_err(|e| CollectorError::Task {
        reason: format!("cannot start the collector's loop: {e}"),
    })?;
    let join = tokio::spawn(async move {
        done_rx.await.map_err(|_| CollectorError::Task {
            reason: "the collector's loop ended without stopping cleanly".to_owned(),
        })
    });
    Ok(CollectorHandle {
        sip_addr,
        control_socket,
        http_addr,
        redirect_addr,
        reload,
        join,
    })
}

/// Serves the HTTP API (SPEC §11) on [`http_threads`] threads of its own,
/// each with a current-thread runtime; a thread of its own accepts, within
/// the connection bound, and hands the connections to them in turn. A
/// select that names no leg is drawn on the thread that read it
/// ([`crate::api::read_only`]), so the HTTP path is mostly CPU: on the
/// multi-thread runtime its workers spent a quarter of their time waking
/// and parking each other. On threads of their own 4 keep-alive clients
/// got 6 % more selects a second on a quiet host and 30 % more on a busy
/// one, and a single client 13–15 % fewer (BENCHMARKS.md, "HTTP on
/// threads of its own").
fn serve_http_on_threads(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    shutdown: &CancellationToken,
) -> std::io::Result<()> {
    use crate::api::http::{serve_handed, serve_handing, ServeLimits};
    let limits = ServeLimits::default();
    let mut servers = Vec::new();
    for i in 0..http_threads() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        servers.push(tx);
        let (router, shutdown) = (router.clone(), shutdown.clone());
        spawn_thread(&format!("http-{i}"), move || {
            serve_handed(rx, router, shutdown, limits)
        })?;
    }
    let socket = listener.into_std()?;
    let shutdown = shutdown.clone();
    spawn_thread("http-accept", move || async move {
        match tokio::net::TcpListener::from_std(socket) {
            Ok(listener) => serve_handing(listener, router, shutdown, limits, servers).await,
            Err(e) => tracing::error!(cause = %e, "the http listener cannot be served"),
        }
    })
}

/// How many threads serve HTTP: one per core, at most [`MAX_HTTP_THREADS`].
fn http_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().clamp(1, MAX_HTTP_THREADS))
}

/// The most HTTP threads: past a few, a front end's requests wait on the
/// loop, not on their thread.
const MAX_HTTP_THREADS: usize = 4;

/// Runs the future `make` builds on a thread of its own, with a
/// current-thread runtime: the loop and the SIP reader each get a core's
/// worth of scheduling, instead of sharing a worker and waking each other
/// through it. The thread's runtime also drives the I/O the future
/// registers.
fn spawn_thread<F, Fut>(name: &str, make: F) -> std::io::Result<()>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    run_on_thread(runtime, name, make)
}

/// Runs the future `make` builds on `runtime` (a current-thread one, with
/// whatever was spawned on it already) on a thread of its own.
/// The core thread's runtime until [`run_on_thread`] takes it. An error
/// of [`start`] before then (a port already taken) drops it in an async
/// context, where dropping a runtime would block, which tokio refuses with
/// a panic: it is shut down in the background instead, so the error
/// reaches the operator.
struct CoreRuntime(Option<tokio::runtime::Runtime>);

impl CoreRuntime {
    fn into_inner(mut self) -> tokio::runtime::Runtime {
        self.0
            .take()
            .expect("the runtime is taken only here, which consumes the guard")
    }
}

impl std::ops::Deref for CoreRuntime {
    type Target = tokio::runtime::Runtime;

    fn deref(&self) -> &tokio::runtime::Runtime {
        self.0
            .as_ref()
            .expect("the runtime is taken only by into_inner, which consumes the guard")
    }
}

impl Drop for CoreRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

fn run_on_thread<F, Fut>(
    runtime: tokio::runtime::Runtime,
    name: &str,
    make: F,
) -> std::io::Result<()>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || runtime.block_on(make()))?;
    Ok(())
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
