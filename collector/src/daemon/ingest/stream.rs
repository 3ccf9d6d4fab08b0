//! The TCP and TLS side (RFC 3261 §18.3, §26): the listeners, the table of
//! live connections with its limits, each connection's reader (framing,
//! deadlines, waiting for room in the core's queue) and writer.

use super::*;

/// One TCP connection as the acceptor and the writer see it.
#[derive(Debug)]
pub(super) struct StreamEntry {
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
pub(in crate::daemon) struct Streams {
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
    pub(in crate::daemon) fn new(closed: mpsc::UnboundedSender<StreamId>) -> Self {
        Self {
            inner: Arc::default(),
            last_id: Arc::default(),
            closed: Some(closed),
            limit_log: Arc::default(),
        }
    }

    /// An id no connection of this table had before.
    pub(super) fn next_id(&self) -> StreamId {
        StreamId(self.last_id.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// [`Self::admit`], with a rate-limited line when the table is full.
    pub(super) fn admit_logged(
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
    pub(super) fn admit(
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

    pub(super) fn touch(&self, id: StreamId, now: Instant) {
        if let Ok(mut m) = self.inner.lock() {
            if let Some(e) = m.get_mut(&id) {
                e.last_message = now;
            }
        }
    }

    pub(super) fn remove(&self, id: StreamId) {
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
    pub(in crate::daemon) fn send(&self, id: StreamId, bytes: Bytes) -> bool {
        let entry = self
            .inner
            .lock()
            .ok()
            .and_then(|m| m.get(&id).map(|e| (e.tx.clone(), e.close.clone())));
        entry.is_some_and(|(tx, close)| queue_on(&tx, &close, bytes))
    }
}

/// What [`Streams::admit`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admitted {
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
pub(in crate::daemon) enum Opening {
    /// Plain TCP.
    Tcp,
    /// TLS (RFC 3261 §26).
    Tls(Arc<RwLock<tokio_rustls::TlsAcceptor>>),
}

impl Opening {
    pub(super) fn transport(&self) -> StreamTransport {
        match self {
            Opening::Tcp => StreamTransport::Tcp,
            Opening::Tls(_) => StreamTransport::Tls,
        }
    }
}

/// Accepts connections until `cancel`; each is read by its own task
/// ([`serve_stream`]), after its TLS handshake when `opening` says so.
pub(in crate::daemon) async fn accept_streams(
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
pub(super) const MAX_HANDSHAKES: usize = 128;

/// The TLS handshakes in progress on a listener, oldest first.
#[derive(Debug, Clone, Default)]
pub(super) struct Handshakes {
    inner: Arc<Mutex<VecDeque<(StreamId, CancellationToken)>>>,
}

impl Handshakes {
    /// Counts a new handshake, giving up the oldest when there are
    /// [`MAX_HANDSHAKES`].
    pub(super) fn start(&self, id: StreamId, close: CancellationToken) {
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
    pub(super) fn end(&self, id: StreamId) {
        if let Ok(mut q) = self.inner.lock() {
            q.retain(|(other, _)| *other != id);
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.inner.lock().map_or(0, |q| q.len())
    }
}

/// At most one line per this interval about refused TLS handshakes.
pub(super) const TLS_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// Logs a failed TLS handshake, rate-limited: the first one of an
/// interval with its peer and cause, then a count.
pub(super) fn tls_refused(peer: SocketAddr, reason: &str) {
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
pub(super) struct StreamIo {
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
pub(super) async fn serve_stream<S>(
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
                Ok(Some(Frame::Message(bytes))) => match wire::decode(&bytes, peer) {
                    Ok(message) => batch.push(Inbound {
                        route: Route::Stream(id, transport),
                        source: peer,
                        message,
                        peer_certificate: peer_certificate.clone(),
                    }),
                    // What the parser refused is answered on the
                    // connection as over UDP (`wire::refused`).
                    Err(e) => match wire::refused(&bytes, to_loop.allow()) {
                        Some(response) => {
                            let answer = wire::encode_response(response, crate::core::USER_AGENT);
                            if !queue_on(&tx, &close, answer) {
                                to_loop.deliver(batch, &close).await;
                                break 'read;
                            }
                        }
                        None => debug!(%peer, error = %e, "sip tcp message dropped"),
                    },
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
