//! The SIP sockets: the UDP reader with its admission, the TCP and TLS
//! listeners with their framing, and the writer of everything the core
//! sends.
//!
//! The reader runs beside the core's loop, on another worker thread: it
//! reads datagrams in batches, classes each one before any work is done on
//! it ([`Admission`]: a registered contact's traffic first, strangers and
//! unauthenticated REGISTERs within their rate, the rest dropped
//! unparsed), parses what it admits and hands the loop whole batches on
//! two bounded queues, the known contacts' and the others' (a request with
//! an extension method, which the parser refuses, it answers `501` itself:
//! RFC 3261 §8.2.1, [`wire::refused`]). A full queue
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
use msr_shared::logging::{log_datagram, WIRE};
use msr_shared::sip::wire::{self, DecodeError, Frame, StreamFramer};
use msr_shared::sip::wire::{queue_on, STREAM_WRITE_QUEUE};
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
    /// The methods the server behind this sink serves: the `Allow` of the
    /// raw answer to what the parser refused on its connections.
    fn allow(&self) -> &'static str {
        match self {
            Sink::Core(..) => crate::core::ALLOW,
            Sink::Queue(_) => crate::api::redirect::ALLOW,
        }
    }

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

/// Reads the UDP socket until `cancel` (module docs). A request the
/// parser refuses for its extension method is answered `501` here,
/// through `egress` (the writer's queue), since the core holds no such
/// request ([`wire::refused`], RFC 3261 §8.2.1); it was admitted
/// like any other datagram, so a stranger's flood gets no more answers
/// than its admission allows any request.
pub(super) async fn read_udp(
    socket: Arc<UdpSocket>,
    to_loop: SendersHandle,
    egress: mpsc::UnboundedSender<Vec<Transmit>>,
    known: KnownSources,
    admission: AdmissionConfig,
    stats: Arc<IngestStats>,
    cancel: CancellationToken,
) {
    let mut admission = Admission::new(admission);
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
        let mut answers = Vec::new();
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
            match wire::decode(datagram, from) {
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
                Err(e) => match wire::refused(datagram, crate::core::ALLOW) {
                    Some(response) => {
                        debug!(src = %from, status = %response.status_code, "sip request the parser refused answered");
                        answers.push(Transmit {
                            route: Route::Udp(wire::response_target(&response.headers, from)),
                            bytes: wire::encode_response(response, crate::core::USER_AGENT),
                        });
                    }
                    None => {
                        stats.malformed.fetch_add(1, Ordering::Relaxed);
                        debug!(src = %from, error = %e, "sip datagram dropped");
                    }
                },
            }
        }
        to_loop.send(true, known_batch, &stats);
        to_loop.send(false, other_batch, &stats);
        if !answers.is_empty() {
            // The writer is gone only at shutdown, when no answer matters.
            let _ = egress.send(answers);
        }
        log.maybe_log(now, &stats);
    }
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

mod stream;
pub(super) use stream::{accept_streams, Opening, Streams};

#[cfg(test)]
mod tests;
