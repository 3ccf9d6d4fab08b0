//! The SIP sockets: the UDP reader with its admission, the TCP and TLS
//! listeners with their framing, and the writer of everything the core
//! sends.
//!
//! The reader runs beside the core's loop, on another worker thread: it
//! reads datagrams in batches, classes each one before any work is done on
//! it ([`Admission`]: a registered contact's traffic first, strangers and
//! unauthenticated REGISTERs within their rate, the rest dropped
//! unparsed), parses what it admits and hands the loop whole batches on
//! two bounded queues, the known contacts' and the others'. A full queue
//! means the loop is behind: the batch is dropped there, counted and
//! logged (rate-limited), so that the loop always works on recent
//! requests at its full rate and memory stays bounded; the senders
//! retransmit (RFC 3261 Timer E), and stateless answers make a
//! retransmission cost no more than the original.
//!
//! Every datagram the collector sends leaves from the one UDP socket (SPEC
//! §4: one address for peers behind symmetric NAT), from the writer task.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use msr_shared::logging::WIRE;
use msr_shared::sip::wire::{self, Carrier, DecodeError, Frame, StreamFramer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::core::{Inbound, Route, StreamId, StreamTransport, Transmit};
use crate::sip::admission::{Admission, AdmissionConfig, Class};

/// Datagrams read in one wake-up of the reader: one batch for the loop.
pub(super) const BATCH: usize = 64;

/// Known contacts' messages the loop may have waiting: about a tenth of a
/// second of its work at its ceiling, so that whatever is queued is
/// answered well inside T1 (500 ms) and never causes the retransmission
/// it would then also have to answer.
pub(super) const KNOWN_QUEUE: usize = 4_096;

/// Other messages (strangers within their rate, TCP) the loop may have
/// waiting.
pub(super) const OTHER_QUEUE: usize = 512;

/// At most one warning about dropped datagrams per this interval.
const DROP_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// The largest UDP payload (RFC 768's 16-bit length less the headers).
const UDP_MAX_PAYLOAD: usize = 65_535;

/// Stream connections (TCP and TLS together) served at once.
const MAX_STREAMS: usize = 1_024;

/// A TLS handshake must be over within this long (RFC 3261 §26.3.1
/// leaves it to the implementation): a peer that stalls it holds a slot.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(10);

/// A TCP connection that sends nothing for this long is closed.
const STREAM_IDLE: Duration = Duration::from_secs(300);

/// A message begun on a TCP connection must be whole within this long, or
/// the connection is closed: a peer that trickles a head a byte at a time
/// holds a connection slot without ever sending a request (slowloris).
const MESSAGE_DEADLINE: Duration = Duration::from_secs(10);

/// When every connection slot is taken, a new connection takes the slot of
/// the one that has gone longest without a whole message, if that is at
/// least this long; otherwise the new one is refused.
const EVICT_AFTER: Duration = Duration::from_secs(30);

/// After the peer's half-close (EOF), the connection is kept for writing
/// this long, so the answers to its last requests still reach it.
const STREAM_LINGER: Duration = Duration::from_secs(2);

/// Messages queued for one connection's writer at most. A peer that stops
/// reading (its receive window full) while it keeps sending requests or
/// CRLF pings would otherwise grow the queue without bound: when it is
/// full the connection is closed (the peer is not reading what it is
/// answered; RFC 5626 §4.4.1 has it reconnect). The collector's messages
/// are under 2 KiB, so each connection holds at most about 128 KiB.
const STREAM_WRITE_QUEUE: usize = 64;

/// The registered contacts' addresses, as the loop last published them.
#[derive(Debug, Clone, Default)]
pub(super) struct KnownSources {
    inner: Arc<RwLock<(u64, Arc<HashSet<SocketAddr>>)>>,
}

impl KnownSources {
    /// Publishes the set as of `generation`.
    pub(super) fn publish(&self, generation: u64, set: HashSet<SocketAddr>) {
        if let Ok(mut guard) = self.inner.write() {
            *guard = (generation, Arc::new(set));
        }
    }

    /// The set, when newer than `seen`.
    fn newer_than(&self, seen: u64) -> Option<(u64, Arc<HashSet<SocketAddr>>)> {
        let guard = self.inner.read().ok()?;
        (guard.0 != seen).then(|| (guard.0, Arc::clone(&guard.1)))
    }
}

/// What the ingest counts, for logs and `/metrics`.
#[derive(Debug, Default)]
pub struct IngestStats {
    /// Datagrams dropped by admission.
    pub refused: AtomicU64,
    /// Messages dropped because the loop's queue was full.
    pub shed: AtomicU64,
    /// Datagrams that were no SIP message.
    pub malformed: AtomicU64,
    /// Datagrams larger than a UDP payload can be (never, but counted).
    pub oversized: AtomicU64,
}

/// One queue between the readers and the loop: batches, bounded by the
/// messages they hold (a batch of one datagram counts one).
pub(super) struct Queue {
    rx: mpsc::UnboundedReceiver<Vec<Inbound>>,
    held: Arc<AtomicUsize>,
    /// Told each time the loop takes a batch: stream readers waiting for
    /// room go on.
    freed: Arc<Notify>,
}

impl Queue {
    /// The next batch (cancel-safe).
    pub(super) async fn recv(&mut self) -> Option<Vec<Inbound>> {
        let batch = self.rx.recv().await?;
        self.held.fetch_sub(batch.len(), Ordering::Relaxed);
        self.freed.notify_waiters();
        Some(batch)
    }

    /// The next batch if one waits.
    pub(super) fn try_recv(&mut self) -> Option<Vec<Inbound>> {
        let batch = self.rx.try_recv().ok()?;
        self.held.fetch_sub(batch.len(), Ordering::Relaxed);
        self.freed.notify_waiters();
        Some(batch)
    }
}

/// The loop's side of the ingest.
pub(super) struct Queues {
    pub(super) known: Queue,
    pub(super) other: Queue,
}

struct Sender {
    tx: mpsc::UnboundedSender<Vec<Inbound>>,
    held: Arc<AtomicUsize>,
    limit: usize,
    freed: Arc<Notify>,
}

struct Senders {
    known: Sender,
    other: Sender,
}

fn queue(limit: usize) -> (Sender, Queue) {
    let (tx, rx) = mpsc::unbounded_channel();
    let held = Arc::new(AtomicUsize::new(0));
    let freed = Arc::new(Notify::new());
    (
        Sender {
            tx,
            held: Arc::clone(&held),
            limit,
            freed: Arc::clone(&freed),
        },
        Queue { rx, held, freed },
    )
}

/// The queues between the readers and the loop.
pub(super) fn queues() -> (Queues, SendersHandle) {
    let (known_tx, known) = queue(KNOWN_QUEUE);
    let (other_tx, other) = queue(OTHER_QUEUE);
    let senders = SendersHandle(Arc::new(Senders {
        known: known_tx,
        other: other_tx,
    }));
    (Queues { known, other }, senders)
}

/// A reader's way to the loop.
#[derive(Clone)]
pub(super) struct SendersHandle(Arc<Senders>);

impl SendersHandle {
    /// How many more messages the loop's queue takes now.
    fn room(&self, known: bool) -> usize {
        let queue = if known { &self.0.known } else { &self.0.other };
        queue
            .limit
            .saturating_sub(queue.held.load(Ordering::Relaxed))
    }

    /// Hands a batch to the loop; what does not fit in a full queue is
    /// dropped (module docs).
    fn send(&self, known: bool, mut batch: Vec<Inbound>, stats: &IngestStats) {
        let queue = if known { &self.0.known } else { &self.0.other };
        let room = queue
            .limit
            .saturating_sub(queue.held.load(Ordering::Relaxed));
        if batch.len() > room {
            let shed = batch.len() - room;
            batch.truncate(room);
            stats.shed.fetch_add(shed as u64, Ordering::Relaxed);
        }
        if batch.is_empty() {
            return;
        }
        let n = batch.len();
        queue.held.fetch_add(n, Ordering::Relaxed);
        if queue.tx.send(batch).is_err() {
            queue.held.fetch_sub(n, Ordering::Relaxed);
        }
    }

    /// Hands a stream's batch to the loop once its queue has room for it,
    /// however long that takes: over a stream nothing is sent again (RFC
    /// 3261 §17.1.2.2: no Timer E), so a message shed would be lost for
    /// good, while a reader that waits stops reading its connection and
    /// TCP's flow control slows that peer alone. `false` when `close`
    /// ended the wait.
    async fn send_when_room(
        &self,
        known: bool,
        batch: Vec<Inbound>,
        close: &CancellationToken,
    ) -> bool {
        if batch.is_empty() {
            return true;
        }
        let queue = if known { &self.0.known } else { &self.0.other };
        loop {
            let freed = queue.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let held = queue.held.load(Ordering::Relaxed);
            // An empty queue takes any batch: one larger than the limit
            // must not wait forever.
            if held == 0 || held + batch.len() <= queue.limit {
                let n = batch.len();
                queue.held.fetch_add(n, Ordering::Relaxed);
                if queue.tx.send(batch).is_err() {
                    queue.held.fetch_sub(n, Ordering::Relaxed);
                }
                return true;
            }
            tokio::select! {
                () = close.cancelled() => return false,
                () = freed => {}
            }
        }
    }
}

/// Where a stream connection's messages go. A full queue makes the
/// connection's reader wait ([`SendersHandle::send_when_room`]): nothing
/// that arrived over a stream is dropped.
#[derive(Clone)]
pub(super) enum Sink {
    /// To the core's loop: a registered contact's messages to the known
    /// queue, everyone else's to the other one, as over UDP.
    Core(SendersHandle, KnownSources),
    /// To another server's loop (the redirect server).
    Queue(mpsc::Sender<Vec<Inbound>>),
}

impl Sink {
    /// Hands `batch` on, waiting for room; `false` when `close` ended the
    /// wait (the connection is being closed).
    async fn deliver(&self, batch: Vec<Inbound>, close: &CancellationToken) -> bool {
        match self {
            Sink::Core(to_loop, known) => {
                let set = known.newer_than(u64::MAX).map(|(_, set)| set);
                let (known_part, other): (Vec<_>, Vec<_>) = batch
                    .into_iter()
                    .partition(|m| set.as_ref().is_some_and(|s| s.contains(&m.source)));
                to_loop.send_when_room(true, known_part, close).await
                    && to_loop.send_when_room(false, other, close).await
            }
            Sink::Queue(tx) => {
                if batch.is_empty() {
                    return true;
                }
                tokio::select! {
                    () = close.cancelled() => false,
                    sent = tx.send(batch) => sent.is_ok(),
                }
            }
        }
    }
}

/// A rate limit for the reader's warnings.
struct DropLog {
    last: Option<Instant>,
    refused: u64,
    shed: u64,
    malformed: u64,
}

impl DropLog {
    fn maybe_log(&mut self, now: Instant, stats: &IngestStats) {
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < DROP_LOG_INTERVAL)
        {
            return;
        }
        let refused = stats.refused.load(Ordering::Relaxed);
        let shed = stats.shed.load(Ordering::Relaxed);
        let malformed = stats.malformed.load(Ordering::Relaxed);
        let (dr, ds, dm) = (
            refused - self.refused,
            shed - self.shed,
            malformed - self.malformed,
        );
        if dr + ds + dm == 0 {
            return;
        }
        if dr > 0 {
            warn!(
                dropped = dr,
                dropped_total = refused,
                "sip datagrams over the admission limits dropped unread (unknown sources or unauthenticated registers)"
            );
        }
        if ds > 0 {
            warn!(
                dropped = ds,
                dropped_total = shed,
                "overloaded: sip messages dropped, the loop's queue was full"
            );
        }
        if dm > 0 {
            info!(
                dropped = dm,
                dropped_total = malformed,
                "datagrams that are no sip message dropped"
            );
        }
        (self.refused, self.shed, self.malformed) = (refused, shed, malformed);
        self.last = Some(now);
    }
}

/// Reads the UDP socket until `cancel` (module docs).
pub(super) async fn read_udp(
    socket: Arc<UdpSocket>,
    to_loop: SendersHandle,
    known: KnownSources,
    admission: AdmissionConfig,
    stats: Arc<IngestStats>,
    cancel: CancellationToken,
) {
    let mut admission = Admission::new(admission, Instant::now());
    let mut seen = u64::MAX;
    let mut buf = vec![0u8; UDP_MAX_PAYLOAD];
    let mut log = DropLog {
        last: None,
        refused: 0,
        shed: 0,
        malformed: 0,
    };
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            ready = socket.readable() => if let Err(e) = ready {
                warn!(error = %e, "sip udp socket unusable");
                return;
            },
        }
        let now = Instant::now();
        if let Some((generation, set)) = known.newer_than(seen) {
            seen = generation;
            admission.set_known((*set).clone());
        }
        let mut known_batch = Vec::new();
        let mut other_batch = Vec::new();
        // Past its ceiling the loop's queue is full: what it can't take is
        // shed before it is decoded, so overload costs a receive per
        // datagram and the capacity goes to messages that will be answered
        // (SPEC §3: graceful overload, no retransmission storm).
        let (room_known, room_other) = (to_loop.room(true), to_loop.room(false));
        for _ in 0..BATCH {
            let (len, from) = match socket.try_recv_from(&mut buf) {
                Ok(v) => v,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    // ICMP errors surface here on Linux (ECONNREFUSED): not fatal.
                    debug!(error = %e, "sip udp receive error");
                    break;
                }
            };
            let datagram = &buf[..len];
            let class = admission.classify(now, from, datagram);
            if class == Class::Dropped {
                stats.refused.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let full = if class == Class::Known {
                known_batch.len() >= room_known
            } else {
                other_batch.len() >= room_other
            };
            if full {
                stats.shed.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if tracing::enabled!(target: WIRE, tracing::Level::INFO) {
                log_datagram("udp received", from, datagram);
            }
            match wire::decode(datagram, from, Carrier::Udp) {
                Ok(message) => {
                    let inbound = Inbound {
                        route: Route::Udp(from),
                        source: from,
                        message,
                        peer_certificate: None,
                    };
                    if class == Class::Known {
                        known_batch.push(inbound);
                    } else {
                        other_batch.push(inbound);
                    }
                }
                Err(DecodeError::Keepalive) => {}
                Err(e) => {
                    stats.malformed.fetch_add(1, Ordering::Relaxed);
                    debug!(src = %from, error = %e, "sip datagram dropped");
                }
            }
        }
        to_loop.send(true, known_batch, &stats);
        to_loop.send(false, other_batch, &stats);
        log.maybe_log(now, &stats);
    }
}

/// One TCP connection as the acceptor and the writer see it.
#[derive(Debug)]
struct StreamEntry {
    /// The peer's address: a full table takes slots from the address
    /// holding the most.
    peer: std::net::IpAddr,
    tx: mpsc::Sender<Bytes>,
    /// When its last whole message arrived (or it was accepted).
    last_message: Instant,
    /// Closes it (eviction).
    close: CancellationToken,
}

/// The stream connections' writers, by id.
#[derive(Debug, Clone, Default)]
pub(super) struct Streams {
    inner: Arc<Mutex<HashMap<StreamId, StreamEntry>>>,
    /// The last id handed out: one sequence for every listener that shares
    /// this table (TCP and TLS), so that no two live connections share an
    /// id, here or in the core's flows.
    last_id: Arc<AtomicU64>,
    /// Told each connection that closed (the core forgets its flows).
    closed: Option<mpsc::UnboundedSender<StreamId>>,
    /// Connections refused and evicted since the last line about them,
    /// and when that was.
    limit_log: Arc<Mutex<(Option<Instant>, u64, u64)>>,
}

impl Streams {
    /// No connection yet; each one that closes is sent to `closed`.
    pub(super) fn new(closed: mpsc::UnboundedSender<StreamId>) -> Self {
        Self {
            inner: Arc::default(),
            last_id: Arc::default(),
            closed: Some(closed),
            limit_log: Arc::default(),
        }
    }

    /// An id no connection of this table had before.
    fn next_id(&self) -> StreamId {
        StreamId(self.last_id.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// [`Self::admit`], with a rate-limited line when the table is full.
    fn admit_logged(
        &self,
        id: StreamId,
        peer: std::net::IpAddr,
        tx: mpsc::Sender<Bytes>,
        close: CancellationToken,
        transport: StreamTransport,
    ) -> Admitted {
        let now = Instant::now();
        let admitted = self.admit(id, peer, tx, close, now);
        if admitted == Admitted::Yes {
            return admitted;
        }
        let Ok(mut log) = self.limit_log.lock() else {
            return admitted;
        };
        match admitted {
            Admitted::Refused => log.1 += 1,
            _ => log.2 += 1,
        }
        if log
            .0
            .is_none_or(|at| now.duration_since(at) >= DROP_LOG_INTERVAL)
        {
            warn!(
                target: msr_shared::logging::NETWORK,
                max = MAX_STREAMS,
                refused = log.1,
                evicted = log.2,
                %transport,
                "sip stream connections at their limit: new ones refused, or given the slot of the quietest"
            );
            *log = (Some(now), 0, 0);
        }
        admitted
    }

    /// Registers a new connection, making room when every slot is taken
    /// ([`EVICT_AFTER`]); [`Admitted::Refused`] when there is none to make.
    fn admit(
        &self,
        id: StreamId,
        peer: std::net::IpAddr,
        tx: mpsc::Sender<Bytes>,
        close: CancellationToken,
        now: Instant,
    ) -> Admitted {
        let Ok(mut m) = self.inner.lock() else {
            return Admitted::Refused;
        };
        let mut evicted = false;
        if m.len() >= MAX_STREAMS {
            let quietest = m
                .iter()
                .min_by_key(|(_, e)| e.last_message)
                .filter(|(_, e)| now.duration_since(e.last_message) >= EVICT_AFTER)
                .map(|(id, _)| *id);
            // Else the address holding the most connections gives up its
            // quietest one to a newcomer from another address: one source
            // can't keep every other one out by talking now and then.
            let from_heaviest = || {
                let mut held: HashMap<std::net::IpAddr, usize> = HashMap::new();
                for e in m.values() {
                    *held.entry(e.peer).or_default() += 1;
                }
                let (heaviest, count) = held.into_iter().max_by_key(|&(_, n)| n)?;
                (heaviest != peer && count > 1).then_some(())?;
                m.iter()
                    .filter(|(_, e)| e.peer == heaviest)
                    .min_by_key(|(_, e)| e.last_message)
                    .map(|(id, _)| *id)
            };
            let Some(old) = quietest.or_else(from_heaviest) else {
                return Admitted::Refused;
            };
            if let Some(e) = m.remove(&old) {
                e.close.cancel();
                if let Some(closed) = &self.closed {
                    let _ = closed.send(old);
                }
            }
            evicted = true;
        }
        m.insert(
            id,
            StreamEntry {
                peer,
                tx,
                last_message: now,
                close,
            },
        );
        if evicted {
            Admitted::Evicted
        } else {
            Admitted::Yes
        }
    }

    fn touch(&self, id: StreamId, now: Instant) {
        if let Ok(mut m) = self.inner.lock() {
            if let Some(e) = m.get_mut(&id) {
                e.last_message = now;
            }
        }
    }

    fn remove(&self, id: StreamId) {
        let removed = self
            .inner
            .lock()
            .ok()
            .and_then(|mut m| m.remove(&id))
            .is_some();
        if let (true, Some(closed)) = (removed, &self.closed) {
            let _ = closed.send(id);
        }
    }

    /// Queues `bytes` on connection `id`; `false` when it is gone, or
    /// when its queue is full and it is closed for that
    /// ([`STREAM_WRITE_QUEUE`]).
    pub(super) fn send(&self, id: StreamId, bytes: Bytes) -> bool {
        let entry = self
            .inner
            .lock()
            .ok()
            .and_then(|m| m.get(&id).map(|e| (e.tx.clone(), e.close.clone())));
        entry.is_some_and(|(tx, close)| queue_on(&tx, &close, bytes))
    }
}

/// Queues `bytes` for a connection's writer, closing the connection when
/// its queue is full (a peer that does not read; [`STREAM_WRITE_QUEUE`]).
fn queue_on(tx: &mpsc::Sender<Bytes>, close: &CancellationToken, bytes: Bytes) -> bool {
    match tx.try_send(bytes) {
        Ok(()) => true,
        Err(mpsc::error::TrySendError::Full(_)) => {
            debug!(
                target: msr_shared::logging::NETWORK,
                queued = STREAM_WRITE_QUEUE,
                "sip stream connection closed: the peer does not read what it is sent"
            );
            close.cancel();
            false
        }
        Err(mpsc::error::TrySendError::Closed(_)) => false,
    }
}

/// What [`Streams::admit`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admitted {
    Yes,
    /// Yes, in the slot of the quietest connection, now closed.
    Evicted,
    /// Every slot is busy.
    Refused,
}

/// How a listener's connections are opened: as they are (TCP), or
/// through a TLS handshake with the acceptor of the moment (it is
/// replaced when the certificate files are reloaded).
#[derive(Clone)]
pub(super) enum Opening {
    /// Plain TCP.
    Tcp,
    /// TLS (RFC 3261 §26).
    Tls(Arc<RwLock<tokio_rustls::TlsAcceptor>>),
}

impl Opening {
    fn transport(&self) -> StreamTransport {
        match self {
            Opening::Tcp => StreamTransport::Tcp,
            Opening::Tls(_) => StreamTransport::Tls,
        }
    }
}

/// Accepts connections until `cancel`; each is read by its own task
/// ([`serve_stream`]), after its TLS handshake when `opening` says so.
pub(super) async fn accept_streams(
    listener: TcpListener,
    opening: Opening,
    to_loop: Sink,
    streams: Streams,
    cancel: CancellationToken,
) {
    let transport = opening.transport();
    let handshakes = Handshakes::default();
    loop {
        let accepted = tokio::select! {
            () = cancel.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(v) => v,
            Err(e) => {
                debug!(error = %e, %transport, "sip stream accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let id = streams.next_id();
        let (tx, rx) = mpsc::channel::<Bytes>(STREAM_WRITE_QUEUE);
        let close = cancel.child_token();
        let io = StreamIo {
            id,
            transport,
            tx,
            rx,
            close,
        };
        match &opening {
            Opening::Tcp => {
                if streams.admit_logged(id, peer.ip(), io.tx.clone(), io.close.clone(), transport)
                    == Admitted::Refused
                {
                    // Dropping the stream closes it.
                    continue;
                }
                tokio::spawn(serve_stream(
                    stream,
                    peer,
                    None,
                    io,
                    to_loop.clone(),
                    streams.clone(),
                ));
            }
            Opening::Tls(acceptor) => {
                let Ok(acceptor) = acceptor.read().map(|a| a.clone()) else {
                    continue;
                };
                // A handshake holds a slot of its own, not a connection's:
                // peers that open connections and never finish them take
                // the oldest handshake's slot, never an MSR's connection.
                handshakes.start(id, io.close.clone());
                let (to_loop, streams, handshakes, shutdown) = (
                    to_loop.clone(),
                    streams.clone(),
                    handshakes.clone(),
                    cancel.clone(),
                );
                tokio::spawn(async move {
                    let handshake =
                        tokio::time::timeout(HANDSHAKE_DEADLINE, acceptor.accept(stream));
                    let done = tokio::select! {
                        () = io.close.cancelled() => Err("handshake given up: newer ones took its slot".to_owned()),
                        done = handshake => match done {
                            Ok(Ok(tls)) => Ok(tls),
                            Ok(Err(e)) => Err(e.to_string()),
                            Err(_) => Err("handshake not finished in time".to_owned()),
                        },
                    };
                    handshakes.end(id);
                    let tls = match done {
                        Ok(tls) => tls,
                        Err(reason) => {
                            // A peer without the right certificate: nothing
                            // of it reaches the core (SPEC §4).
                            if !shutdown.is_cancelled() {
                                tls_refused(peer, &reason);
                            }
                            return;
                        }
                    };
                    if streams.admit_logged(
                        id,
                        peer.ip(),
                        io.tx.clone(),
                        io.close.clone(),
                        transport,
                    ) == Admitted::Refused
                    {
                        return;
                    }
                    let certificate = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|chain| chain.first())
                        .map(|c| Arc::<[u8]>::from(c.as_ref()));
                    serve_stream(tls, peer, certificate, io, to_loop, streams).await;
                });
            }
        }
    }
}

/// TLS handshakes in progress on one listener at most.
const MAX_HANDSHAKES: usize = 128;

/// The TLS handshakes in progress on a listener, oldest first.
#[derive(Debug, Clone, Default)]
struct Handshakes {
    inner: Arc<Mutex<VecDeque<(StreamId, CancellationToken)>>>,
}

impl Handshakes {
    /// Counts a new handshake, giving up the oldest when there are
    /// [`MAX_HANDSHAKES`].
    fn start(&self, id: StreamId, close: CancellationToken) {
        let Ok(mut q) = self.inner.lock() else {
            return;
        };
        while q.len() >= MAX_HANDSHAKES {
            if let Some((_, oldest)) = q.pop_front() {
                oldest.cancel();
            }
        }
        q.push_back((id, close));
    }

    /// Handshake `id` is over (done, failed or given up).
    fn end(&self, id: StreamId) {
        if let Ok(mut q) = self.inner.lock() {
            q.retain(|(other, _)| *other != id);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().map_or(0, |q| q.len())
    }
}

/// At most one line per this interval about refused TLS handshakes.
const TLS_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// Logs a failed TLS handshake, rate-limited: the first one of an
/// interval with its peer and cause, then a count.
fn tls_refused(peer: SocketAddr, reason: &str) {
    static LOG: Mutex<(Option<std::time::Instant>, u64)> = Mutex::new((None, 0));
    let Ok(mut log) = LOG.lock() else {
        return;
    };
    log.1 += 1;
    let now = std::time::Instant::now();
    if log
        .0
        .is_some_and(|at| now.duration_since(at) < TLS_LOG_INTERVAL)
    {
        return;
    }
    warn!(
        target: msr_shared::logging::NETWORK,
        %peer,
        cause = %reason.escape_debug(),
        refused = log.1,
        "sip tls connection refused: the handshake failed"
    );
    *log = (Some(now), 0);
}

/// A connection's id and transport, its writer queue and its closing
/// token.
struct StreamIo {
    id: StreamId,
    transport: StreamTransport,
    tx: mpsc::Sender<Bytes>,
    rx: mpsc::Receiver<Bytes>,
    close: CancellationToken,
}

/// Reads one TCP connection's messages (RFC 3261 §18.3 framing) into the
/// loop's queue and writes what the core answers on it.
///
/// It is closed when it is idle for [`STREAM_IDLE`], when a message takes
/// longer than [`MESSAGE_DEADLINE`] to arrive whole, when it is not SIP,
/// or when it is evicted; after the peer's EOF it stays open for writing
/// until [`STREAM_LINGER`] after the last message it sent.
async fn serve_stream<S>(
    stream: S,
    peer: SocketAddr,
    peer_certificate: Option<Arc<[u8]>>,
    io: StreamIo,
    to_loop: Sink,
    streams: Streams,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
{
    let StreamIo {
        id,
        transport,
        tx,
        mut rx,
        close,
    } = io;
    let carrier = match transport {
        StreamTransport::Tcp => Carrier::Tcp,
        StreamTransport::Tls => Carrier::Tls,
    };
    let (mut read, mut write) = tokio::io::split(stream);
    let writer_close = close.clone();
    let writer = tokio::spawn(async move {
        loop {
            let bytes = tokio::select! {
                () = writer_close.cancelled() => break,
                bytes = rx.recv() => match bytes {
                    Some(bytes) => bytes,
                    None => break,
                },
            };
            // TLS buffers a record until flushed. A peer that stops
            // reading blocks the write: closing the connection ends it.
            let written = async {
                write.write_all(&bytes).await?;
                write.flush().await
            };
            let ok = tokio::select! {
                () = writer_close.cancelled() => false,
                done = written => done.is_ok(),
            };
            if !ok {
                break;
            }
        }
    });
    let mut framer = StreamFramer::new();
    let mut buf = vec![0u8; 16 * 1024];
    // When the message the framer holds part of began to arrive.
    let mut partial_since: Option<Instant> = None;
    // When the last message went to the loop: its answer may be pending.
    let mut last_forwarded: Option<Instant> = None;
    let mut eof = false;
    'read: loop {
        let wait = partial_since.map_or(STREAM_IDLE, |since| {
            MESSAGE_DEADLINE.saturating_sub(since.elapsed())
        });
        let n = tokio::select! {
            () = close.cancelled() => break,
            read = tokio::time::timeout(wait, read.read(&mut buf)) => match read {
                Ok(Ok(0)) => {
                    eof = true;
                    break;
                }
                Ok(Err(_)) => break,
                Err(_) => {
                    if partial_since.is_some() {
                        debug!(%peer, "sip tcp connection closed: message not whole in time");
                    }
                    break;
                }
                Ok(Ok(n)) => n,
            },
        };
        framer.push(&buf[..n]);
        let mut batch = Vec::new();
        loop {
            match framer.next_frame() {
                Ok(Some(Frame::Message(bytes))) => match wire::decode(&bytes, peer, carrier) {
                    Ok(message) => batch.push(Inbound {
                        route: Route::Stream(id, transport),
                        source: peer,
                        message,
                        peer_certificate: peer_certificate.clone(),
                    }),
                    Err(e) => debug!(%peer, error = %e, "sip tcp message dropped"),
                },
                // RFC 5626 §3.5.1: a CRLF answers the ping.
                Ok(Some(Frame::Ping)) => {
                    if !queue_on(&tx, &close, Bytes::from_static(b"\r\n")) {
                        to_loop.deliver(batch, &close).await;
                        break 'read;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    debug!(%peer, error = %e, "sip tcp connection closed");
                    to_loop.deliver(batch, &close).await;
                    break 'read;
                }
            }
        }
        let now = Instant::now();
        if !batch.is_empty() {
            streams.touch(id, now);
            last_forwarded = Some(now);
        }
        partial_since = match (framer.in_message(), partial_since) {
            (false, _) => None,
            (true, Some(since)) if batch.is_empty() => Some(since),
            (true, _) => Some(now),
        };
        if !to_loop.deliver(batch, &close).await {
            break;
        }
    }
    if let Some(at) = last_forwarded.filter(|_| eof) {
        // A peer may half-close after its last request (RFC 3261 §18.3
        // sends the response on the connection the request came on): the
        // loop's answer still goes back on this one.
        tokio::select! {
            () = close.cancelled() => {}
            () = tokio::time::sleep_until(at + STREAM_LINGER) => {}
        }
    }
    streams.remove(id);
    drop(tx);
    let _ = writer.await;
}

/// Sends what the core emits, in order, until the loop drops its sender.
pub(super) async fn write(
    socket: Arc<UdpSocket>,
    streams: Streams,
    mut from_loop: mpsc::UnboundedReceiver<Vec<Transmit>>,
) {
    let mut failures = 0u64;
    let mut last_log: Option<Instant> = None;
    while let Some(batch) = from_loop.recv().await {
        for t in batch {
            if tracing::enabled!(target: WIRE, tracing::Level::INFO) {
                if let Route::Udp(to) = t.route {
                    log_datagram("udp send", to, &t.bytes);
                }
            }
            let sent = match t.route {
                Route::Udp(to) => socket.send_to(&t.bytes, to).await.is_ok(),
                Route::Stream(id, _) => streams.send(id, t.bytes),
            };
            if !sent {
                failures += 1;
                let now = Instant::now();
                if last_log.is_none_or(|at| now.duration_since(at) >= DROP_LOG_INTERVAL) {
                    info!(
                        target: msr_shared::logging::NETWORK,
                        failures,
                        "sip messages could not be sent"
                    );
                    last_log = Some(now);
                }
            }
        }
    }
}

/// One datagram at target [`WIRE`] (`msr_shared::logging`): its peer,
/// length, `CSeq` and text.
fn log_datagram(what: &'static str, peer: SocketAddr, bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    let cseq = text
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case("cseq")
                .then(|| value.trim())
        })
        .unwrap_or_default();
    if what == "udp send" {
        info!(target: WIRE, len = bytes.len(), dst = %peer, cseq = %cseq, raw_message = ?text, "{what}");
    } else {
        info!(target: WIRE, len = bytes.len(), src = %peer, cseq = %cseq, raw_message = ?text, "{what}");
    }
}

#[cfg(test)]
mod tests;
