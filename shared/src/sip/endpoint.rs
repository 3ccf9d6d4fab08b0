//! [`SipEndpoint`]: the async adapter between a daemon's event loop and
//! rsipstack's transaction layer (RFC 3261 §17).
//!
//! The daemons' protocol cores are sans-IO: they turn events into requests
//! and responses. This adapter is where those messages meet the network:
//!
//! * [`SipEndpoint::send_request`] runs a client transaction (retransmission
//!   and Timer F are rsipstack's) and reports its final response, or its
//!   failure, as one [`SipEvent`] carrying the caller's request id;
//! * incoming requests arrive as [`SipEvent::Request`] holding the server
//!   transaction, which the loop answers with [`ServerTransaction::respond`].
//!
//! Every request and response leaves from the one UDP socket bound to the
//! configured address (SPEC §4: one address for peers behind symmetric NAT),
//! except a request to a `sips:` URI: it goes over a TLS connection
//! (RFC 3261 §26) checked with the [`TlsClient`] set on the endpoint, and
//! requests the peer sends back over that connection are served like any
//! other.
//! A request the parser refuses for its method (an extension method, or a
//! `CSeq` naming another method, RFC 4475 §3.1.1.2 and §3.1.2.18) is
//! answered from its raw head on the socket, `501` with the endpoint's
//! `Allow` or `400` ([`wire::not_implemented`], as the collector's ports
//! answer it, SPEC §16); any other datagram the parser refuses is dropped
//! by rsipstack before it reaches this adapter.
//!
//! Each incoming request carries the address it came from
//! ([`ServerTransaction::source`]): the datagram's source for UDP, the
//! peer of the connection for TCP — never a header the peer wrote. Both
//! daemons decide on it who may ask what (SPEC §4).
//!
//! Oversized datagrams: rsipstack reads UDP into a fixed 8,192-byte buffer
//! (`MAX_UDP_BUF_SIZE`, not configurable), so a larger datagram would reach
//! its parser truncated. The socket is wrapped ([`SizedUdpSocket`]): every
//! datagram is read whole (up to 65,535 bytes, RFC 768), and one that does
//! not fit rsipstack's buffer is dropped, counted
//! ([`SipEndpoint::oversized_total`]) and logged at warn at most once per
//! [`OVERSIZED_LOG_INTERVAL`] with the count since the last line.
//!
//! Overload: rsipstack queues new server transactions without bound. When
//! more than [`SipEndpoint::max_backlog`] requests are waiting as the loop
//! asks for the next one, [`SipEndpoint::recv`] answers the oldest waiting
//! ones itself with `503 Service Unavailable` and `Retry-After: 1` until the backlog is back at the bound, so a
//! loop that falls behind serves recent requests, not ones their senders
//! gave up on long ago, and the queue cannot grow for ever. Shedding is
//! logged at warn, at most once per 5 s.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rsipstack::sip::{Header, Method, Request, Response, SipMessage, StatusCode, StatusCodeKind};
use rsipstack::transaction::key::{TransactionKey, TransactionRole};
use rsipstack::transaction::{Endpoint, EndpointBuilder, Transaction};
use rsipstack::transport::udp::UdpConnection;
use rsipstack::transport::{SipConnection, TcpListenerConnection, TransportLayer};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::wire;

/// Default bound on incoming requests waiting for the loop (see the module
/// docs): about 0.4 s of traffic at 5000 requests/s.
pub(crate) const DEFAULT_MAX_BACKLOG: usize = 2048;

/// `Retry-After` of a `503` sent when shedding, seconds.
pub(crate) const SHED_RETRY_AFTER_SECS: u32 = 1;

/// At most one warning about shed requests per this interval.
pub(crate) const SHED_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// The largest datagram rsipstack's UDP reader takes (its fixed buffer,
/// `rsipstack::transport::connection::MAX_UDP_BUF_SIZE`).
pub const MAX_DATAGRAM: usize = rsipstack::transport::connection::MAX_UDP_BUF_SIZE;

/// At most one warning about oversized datagrams per this interval.
pub const OVERSIZED_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// The largest UDP payload (RFC 768's 16-bit length less the headers).
const UDP_MAX_PAYLOAD: usize = 65_535;

/// A TCP or TLS connection not open (TCP connect, and the handshake) within
/// this is given up: a server that never answers the SYN or the
/// ClientHello must not hold a registration forever. It fails with this
/// cause and the request is tried again as any failed one.
const CONNECT_DEADLINE: Duration = Duration::from_secs(10);

/// Failure to set up or use the endpoint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointError {
    /// The UDP (or TCP) socket could not be bound.
    #[error("cannot bind sip {transport} socket on {addr}: {reason}")]
    Bind {
        /// `udp` or `tcp`.
        transport: &'static str,
        /// The requested address.
        addr: SocketAddr,
        /// The OS or stack error.
        reason: String,
    },
    /// The request could not be turned into a transaction.
    #[error("cannot send {method} request: {reason}")]
    Request {
        /// The request method.
        method: String,
        /// Why.
        reason: String,
    },
}

/// One event from the SIP side of a daemon.
#[derive(Debug)]
pub enum SipEvent {
    /// A new request (a new server transaction) to answer. Boxed: the
    /// transaction is large and most events are responses.
    Request(Box<ServerTransaction>),
    /// The final response to the request sent with this id. A transaction
    /// that times out (Timer F) is reported as a locally generated 408.
    Response {
        /// The id given to [`SipEndpoint::send_request`].
        id: u64,
        /// The final response (status ≥ 200).
        response: Response,
    },
    /// The request with this id ended without any final response
    /// (transport failure).
    Failed {
        /// The id given to [`SipEndpoint::send_request`].
        id: u64,
        /// What went wrong.
        reason: String,
    },
    /// A stream connection (TCP, TLS) to `remote` closed: a registrar
    /// reached over it can no longer reach this endpoint back until a new
    /// one is opened (RFC 5626 §4.4's flow recovery).
    Closed {
        /// The peer of the connection.
        remote: SocketAddr,
    },
}

/// Tells the loop of stream connections that closed.
struct ClosedWatch {
    events: mpsc::UnboundedSender<SipEvent>,
}

#[async_trait::async_trait]
impl rsipstack::transaction::endpoint::TransportEventInspector for ClosedWatch {
    async fn handle(
        &self,
        event: rsipstack::transport::TransportEvent,
    ) -> Option<rsipstack::transport::TransportEvent> {
        if let rsipstack::transport::TransportEvent::Closed(connection) = &event {
            if connection.is_reliable() {
                let remote = connection
                    .get_remote_addr()
                    .and_then(|a| a.get_socketaddr().ok());
                if let Some(remote) = remote {
                    let _ = self.events.send(SipEvent::Closed { remote });
                }
            }
        }
        Some(event)
    }
}

/// An incoming request and the server transaction that answers it.
pub struct ServerTransaction {
    tx: Transaction,
    source: Option<SocketAddr>,
}

impl std::fmt::Debug for ServerTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTransaction")
            .field("key", &self.tx.key)
            .field("source", &self.source)
            .finish()
    }
}

impl ServerTransaction {
    fn new(tx: Transaction) -> Self {
        // rsipstack gives each server transaction the connection the request
        // came on; for UDP that is a per-datagram copy whose remote is the
        // datagram's source.
        let source = tx
            .connection
            .as_ref()
            .and_then(|c| c.get_remote_addr())
            .and_then(|a| a.get_socketaddr().ok());
        Self { tx, source }
    }

    /// The address the request came from: the UDP datagram's source or the
    /// TCP peer, as the socket saw it (not `Via`, which the sender writes).
    /// `None` only if the transport did not report one.
    pub fn source(&self) -> Option<SocketAddr> {
        self.source
    }

    /// The request.
    pub fn request(&self) -> &Request {
        &self.tx.original
    }

    /// Sends the final response (retransmissions of the request are then
    /// answered by rsipstack from its cache).
    pub async fn respond(mut self, response: Response) {
        let status = response.status_code.clone();
        if let Err(e) = self.tx.respond(response).await {
            warn!(key = %self.tx.key, %status, error = %e, "cannot send response");
        }
    }
}

/// A SIP endpoint bound to one address: rsipstack's transport and
/// transaction layers plus a channel of [`SipEvent`]s.
pub struct SipEndpoint {
    endpoint: Endpoint,
    incoming: rsipstack::transaction::TransactionReceiver,
    events_tx: mpsc::UnboundedSender<SipEvent>,
    events_rx: mpsc::UnboundedReceiver<SipEvent>,
    local_addr: SocketAddr,
    user_agent: String,
    cancel: CancellationToken,
    max_backlog: usize,
    /// Requests shed since the last warning.
    shed_unlogged: u64,
    /// Requests shed in all.
    shed_total: u64,
    last_shed_log: Option<Instant>,
    /// Datagrams too large for rsipstack's buffer, dropped.
    oversized: Arc<AtomicU64>,
}

/// A UDP socket that reads every datagram whole and drops, counts and logs
/// (rate-limited) those larger than the caller's buffer, instead of handing
/// rsipstack a truncated message (module docs).
struct SizedUdpSocket {
    socket: tokio::net::UdpSocket,
    /// One reader (rsipstack's UDP serve loop) uses it at a time.
    buf: tokio::sync::Mutex<Vec<u8>>,
    oversized: Arc<AtomicU64>,
    log: std::sync::Mutex<OversizedLog>,
    /// The methods the endpoint's user serves, for the `Allow` of a `501`.
    allow: &'static str,
}

#[derive(Default)]
struct OversizedLog {
    last: Option<Instant>,
    unlogged: u64,
}

impl SizedUdpSocket {
    fn note_oversized(&self, len: usize, from: SocketAddr) {
        let total = self.oversized.fetch_add(1, Ordering::Relaxed) + 1;
        let Ok(mut log) = self.log.lock() else {
            return;
        };
        log.unlogged += 1;
        let now = Instant::now();
        if log
            .last
            .is_none_or(|t| now.duration_since(t) >= OVERSIZED_LOG_INTERVAL)
        {
            warn!(
                len,
                src = %from,
                max = MAX_DATAGRAM,
                dropped = log.unlogged,
                dropped_total = total,
                "udp datagram too large for the sip stack, dropped"
            );
            log.unlogged = 0;
            log.last = Some(now);
        }
    }
}

/// The answer to a datagram the parser refuses for its method
/// ([`wire::not_implemented`]); `None` for anything the parser reads, and
/// for every other refusal (rsipstack drops those). The parse is the one
/// rsipstack makes next; the agent's port sees a few requests a second.
fn refused_method_answer(datagram: &[u8], allow: &str) -> Option<Response> {
    if SipMessage::try_from(datagram).is_ok() {
        return None;
    }
    wire::not_implemented(datagram, allow)
}

#[async_trait::async_trait]
impl rsipstack::platform::net::UdpSocket for SizedUdpSocket {
    async fn recv_from(&self, out: &mut [u8]) -> rsipstack::Result<(usize, SocketAddr)> {
        let mut buf = self.buf.lock().await;
        loop {
            let (len, from) = self.socket.recv_from(&mut buf).await?;
            if len > out.len() {
                self.note_oversized(len, from);
                continue;
            }
            if let Some(answer) = refused_method_answer(&buf[..len], self.allow) {
                // Sent to the source, as every answer of this socket (RFC
                // 3581 §4); a lost answer is the sender's retransmission.
                debug!(src = %from, status = %answer.status_code, "sip request the parser refused answered");
                if let Err(e) = self
                    .socket
                    .send_to(&wire::encode_response(answer), from)
                    .await
                {
                    debug!(dst = %from, error = %e, "cannot answer a refused request");
                }
                continue;
            }
            out[..len].copy_from_slice(&buf[..len]);
            return Ok((len, from));
        }
    }

    async fn send_to(&self, buf: &[u8], addr: SocketAddr) -> rsipstack::Result<usize> {
        Ok(self.socket.send_to(buf, addr).await?)
    }

    fn local_addr(&self) -> rsipstack::Result<SocketAddr> {
        Ok(self.socket.local_addr()?)
    }
}

/// The receive buffer asked of the kernel for the UDP socket (it grants at
/// most `net.core.rmem_max`). A collector that resubscribes to 1,000 MSRs
/// at once gets 1,000 answers and 1,000 first NOTIFYs in a few
/// milliseconds; the kernel's default (about 200 KiB, some 100 datagrams
/// at its per-datagram accounting) drops most of them, and each costs a
/// retransmission (500 ms, then 1 s, 2 s: RFC 3261 T1 doubling).
pub(super) const UDP_RECV_BUFFER: usize = 4 << 20;

/// A non-blocking UDP socket bound on `addr`, without address or port
/// reuse, with the larger receive buffer (`UDP_RECV_BUFFER`, 4 MiB).
///
/// Also for a daemon's stateless UDP sockets (the collector's redirect
/// server), so every SIP socket gets the same receive buffer.
pub fn udp_socket(addr: SocketAddr) -> std::io::Result<tokio::net::UdpSocket> {
    tokio::net::UdpSocket::from_std(std_udp_socket(addr)?)
}

/// [`udp_socket`] before it is handed to a tokio runtime (non-blocking):
/// for a daemon that reads and writes the same socket from threads with
/// runtimes of their own (`try_clone`).
pub fn std_udp_socket(addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let domain = if addr.is_ipv6() {
        Domain::IPV6
    } else {
        Domain::IPV4
    };
    let socket = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_nonblocking(true)?;
    // Best effort: a smaller buffer (a host's rmem_max) still works.
    if let Err(e) = socket.set_recv_buffer_size(UDP_RECV_BUFFER) {
        tracing::debug!(error = %e, "cannot enlarge the udp receive buffer");
    }
    // Each datagram sent is charged to the sender until the receiver has
    // read it: a burst of answers to a slow reader must not stall the
    // writer at the kernel's default (about 200 KiB).
    if let Err(e) = socket.set_send_buffer_size(UDP_RECV_BUFFER) {
        tracing::debug!(error = %e, "cannot enlarge the udp send buffer");
    }
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// Why a TCP or TLS connection could not be opened, for the log: a
/// certificate the handshake refused in [`crate::certificate::refusal`]'s
/// words (rsipstack passes rustls's error on inside an I/O error);
/// anything else as rsipstack says it.
fn connect_failure(error: &rsipstack::Error) -> String {
    if let rsipstack::Error::IoError(io) = error {
        let tls = io
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>());
        if let Some(rustls::Error::InvalidCertificate(certificate)) = tls {
            return crate::certificate::refusal(certificate);
        }
    }
    error.to_string()
}

/// What TLS client connections are checked with (RFC 3261 §26.3.1): the
/// CAs a server's certificate must chain to — its name must be the
/// URI's host — and, for a server that asks, a client identity. PEM
/// contents, checked when read.
#[derive(Clone)]
pub struct TlsClient {
    ca: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsClient")
            .field("identity", &self.identity.is_some())
            .finish_non_exhaustive()
    }
}

/// A TLS file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct TlsFileError {
    /// The file.
    pub path: std::path::PathBuf,
    /// What is wrong with it.
    pub reason: String,
}

impl TlsClient {
    /// Reads the CA file and, when given, the client certificate chain
    /// and its key.
    ///
    /// # Errors
    /// [`TlsFileError`] naming the file that cannot be read or holds no
    /// certificate (or key).
    pub fn read(
        ca: &std::path::Path,
        identity: Option<(&std::path::Path, &std::path::Path)>,
    ) -> Result<Self, TlsFileError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|e| TlsFileError {
                path: path.to_owned(),
                reason: e.to_string(),
            })
        };
        // The files as PEM, each certificate in them checked to be X.509.
        let certificates = |path: &std::path::Path| -> Result<Vec<u8>, TlsFileError> {
            let error = |reason: String| TlsFileError {
                path: path.to_owned(),
                reason,
            };
            crate::certificate::read_pem_certificates(path).map_err(error)?;
            read(path)
        };
        let ca_pem = certificates(ca)?;
        // Each must do as a trust anchor, or the agent can't check its
        // registrar at all.
        let mut roots = rustls::RootCertStore::empty();
        for der in CertificateDer::pem_slice_iter(&ca_pem).flatten() {
            if let Err(e) = roots.add(der) {
                return Err(TlsFileError {
                    path: ca.to_owned(),
                    reason: format!("a certificate in it can't be a CA ({e})"),
                });
            }
        }
        let ca = ca_pem;
        let identity = match identity {
            None => None,
            Some((cert, key)) => {
                let chain = certificates(cert)?;
                let key_pem = read(key)?;
                let key_der =
                    PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsFileError {
                        path: key.to_owned(),
                        reason: format!("no pem private key in it ({e})"),
                    })?;
                // The key must be the certificate's: else every handshake
                // fails, far from the file's name.
                let chain_der = CertificateDer::pem_slice_iter(&chain)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| TlsFileError {
                        path: cert.to_owned(),
                        reason: format!("not a pem certificate file ({e})"),
                    })?;
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .and_then(|b| {
                        b.with_root_certificates(rustls::RootCertStore::empty())
                            .with_client_auth_cert(chain_der, key_der)
                    })
                    .map_err(|e| TlsFileError {
                        path: key.to_owned(),
                        reason: format!(
                            "does not go with the certificate in {} ({e})",
                            cert.display()
                        ),
                    })?;
                Some((chain, key_pem))
            }
        };
        Ok(Self { ca, identity })
    }
}

impl SipEndpoint {
    /// Sets what TLS client connections opened from now on are checked
    /// with.
    pub fn set_tls_client(&self, tls: &TlsClient) {
        let (client_cert, client_key) = match &tls.identity {
            Some((cert, key)) => (Some(cert.clone()), Some(key.clone())),
            None => (None, None),
        };
        self.endpoint
            .inner
            .transport_layer
            .set_tls_config(rsipstack::transport::tls::TlsConfig {
                ca_certs: Some(tls.ca.clone()),
                client_cert,
                client_key,
                ..Default::default()
            });
    }

    /// Binds UDP on `addr` (port 0 picks one; see [`local_addr`](Self::local_addr))
    /// and, when `tcp` is set, a TCP listener on the same address and port,
    /// answering a request of a method the parser does not know `501` with
    /// `Allow: allow` (module docs),
    /// and starts rsipstack's transport and timer tasks. They stop when
    /// `cancel` is cancelled or the endpoint is dropped.
    ///
    /// # Errors
    /// [`EndpointError::Bind`] when a socket cannot be bound.
    pub async fn bind(
        addr: SocketAddr,
        tcp: bool,
        user_agent: &str,
        allow: &'static str,
        cancel: CancellationToken,
    ) -> Result<Self, EndpointError> {
        let cancel = cancel.child_token();
        let transport_layer = TransportLayer::new(cancel.clone());
        let bind_err = |reason: String| EndpointError::Bind {
            transport: "udp",
            addr,
            reason,
        };
        let socket = udp_socket(addr).map_err(|e| bind_err(e.to_string()))?;
        let oversized = Arc::new(AtomicU64::new(0));
        let socket = SizedUdpSocket {
            socket,
            buf: tokio::sync::Mutex::new(vec![0; UDP_MAX_PAYLOAD]),
            oversized: Arc::clone(&oversized),
            log: std::sync::Mutex::new(OversizedLog::default()),
            allow,
        };
        let udp = UdpConnection::from_socket(Arc::new(socket), None, Some(cancel.child_token()))
            .await
            .map_err(|e| bind_err(e.to_string()))?;
        let local_addr = udp
            .get_addr()
            .get_socketaddr()
            .map_err(|e| EndpointError::Bind {
                transport: "udp",
                addr,
                reason: e.to_string(),
            })?;
        transport_layer.add_transport(udp.into());
        if tcp {
            let tcp_addr = SocketAddr::new(addr.ip(), local_addr.port());
            let listener = TcpListenerConnection::new(tcp_addr, None)
                .await
                .map_err(|e| EndpointError::Bind {
                    transport: "tcp",
                    addr: tcp_addr,
                    reason: e.to_string(),
                })?;
            transport_layer.add_transport(SipConnection::from(listener));
        }
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let endpoint = EndpointBuilder::new()
            .with_user_agent(user_agent)
            .with_transport_layer(transport_layer)
            .with_cancel_token(cancel.clone())
            .with_transport_inspector(Box::new(ClosedWatch {
                events: events_tx.clone(),
            }))
            .build();
        let incoming = endpoint
            .incoming_transactions()
            .map_err(|e| EndpointError::Bind {
                transport: "udp",
                addr,
                reason: e.to_string(),
            })?;
        let inner = endpoint.inner.clone();
        tokio::spawn(async move {
            if let Err(e) = inner.serve().await {
                warn!(error = %e, "sip endpoint stopped");
            }
        });
        Ok(Self {
            endpoint,
            incoming,
            events_tx,
            events_rx,
            local_addr,
            user_agent: user_agent.to_owned(),
            cancel,
            max_backlog: DEFAULT_MAX_BACKLOG,
            shed_unlogged: 0,
            shed_total: 0,
            last_shed_log: None,
            oversized,
        })
    }

    /// The bound UDP address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Sends `request` in a new client transaction: adds the top `Via`
    /// (this endpoint's address, a fresh branch, `rport`), `Max-Forwards: 70`
    /// and `User-Agent` when absent. The final response arrives later as
    /// [`SipEvent::Response`] (or [`SipEvent::Failed`]) with `id`.
    ///
    /// # Errors
    /// [`EndpointError::Request`] when the request lacks what a transaction
    /// key needs (a `CSeq`, a `Call-ID`).
    pub fn send_request(&self, id: u64, mut request: Request) -> Result<(), EndpointError> {
        let method = request.method.to_string();
        let err = |reason: String| EndpointError::Request {
            method: method.clone(),
            reason,
        };
        // The Via names the transport the request leaves on (RFC 3261
        // §18.1.1): TLS for a sips: target, TCP for transport=tcp.
        let stream = super::stream_transport(&request.uri.to_string());
        let over = stream.map(|transport| rsipstack::transport::SipAddr {
            r#type: Some(transport),
            addr: self.local_addr.into(),
        });
        let via = self
            .endpoint
            .inner
            .get_via(over.clone(), None)
            .map_err(|e| err(e.to_string()))?;
        request.headers.push_front(Header::from(via));
        if super::header(&request.headers, "Max-Forwards").is_none() {
            super::push_header(&mut request.headers, "Max-Forwards", "70");
        }
        if super::header(&request.headers, "User-Agent").is_none() {
            super::push_header(&mut request.headers, "User-Agent", self.user_agent.clone());
        }
        let key = TransactionKey::from_request(&request, TransactionRole::Client)
            .map_err(|e| err(e.to_string()))?;
        // Over TCP and TLS the connection is opened (or an open one found)
        // here, so that a connect or a handshake that fails (refused; a
        // certificate not trusted, expired, for another name) ends the
        // request at once with its cause; rsipstack would retry it
        // silently until Timer F.
        let stream_target = match stream {
            Some(transport) => {
                // The URI's conversion leaves the transport unset (UDP):
                // the target is the stream the URI names, never anything else.
                let mut target = rsipstack::transport::SipAddr::try_from(&request.uri)
                    .map_err(|e| err(e.to_string()))?;
                target.r#type = Some(transport);
                Some(target)
            }
            None => None,
        };
        let inner = self.endpoint.inner.clone();
        let events = self.events_tx.clone();
        let cancel = self.cancel.clone();
        tokio::spawn(async move {
            let run = async {
                let connection = match stream_target {
                    Some(target) => {
                        // The target names its transport (`TLS 192.0.2.1:5061`).
                        let lookup = inner.transport_layer.lookup(&target, Some(&key));
                        match tokio::time::timeout(CONNECT_DEADLINE, lookup).await {
                            Ok(Ok((connection, _))) => Some(connection),
                            Ok(Err(e)) => {
                                return SipEvent::Failed {
                                    id,
                                    reason: format!(
                                        "connection to {target} failed: {}",
                                        connect_failure(&e)
                                    ),
                                }
                            }
                            Err(_) => {
                                return SipEvent::Failed {
                                    id,
                                    reason: format!(
                                    "connection to {target} failed: not established within {} s",
                                    CONNECT_DEADLINE.as_secs()
                                ),
                                }
                            }
                        }
                    }
                    None => None,
                };
                let mut tx = Transaction::new_client(key, request, inner, connection);
                if let Err(e) = tx.send().await {
                    return SipEvent::Failed {
                        id,
                        reason: e.to_string(),
                    };
                }
                while let Some(msg) = tx.receive().await {
                    if let SipMessage::Response(response) = msg {
                        if response.status_code.kind() != StatusCodeKind::Provisional {
                            return SipEvent::Response { id, response };
                        }
                    }
                }
                SipEvent::Failed {
                    id,
                    reason: "transaction ended without a final response".into(),
                }
            };
            tokio::select! {
                event = run => { let _ = events.send(event); }
                () = cancel.cancelled() => { debug!(id, "client transaction abandoned at shutdown"); }
            }
        });
        Ok(())
    }

    /// The bound on waiting incoming requests (see the module docs).
    pub fn max_backlog(&self) -> usize {
        self.max_backlog
    }

    /// Sets the bound on waiting incoming requests (at least 1).
    pub fn set_max_backlog(&mut self, max: usize) {
        self.max_backlog = max.max(1);
    }

    /// UDP datagrams dropped because they exceed [`MAX_DATAGRAM`] (module
    /// docs).
    pub fn oversized_total(&self) -> u64 {
        self.oversized.load(Ordering::Relaxed)
    }

    /// Incoming requests answered `503` because of the backlog bound.
    pub fn shed_total(&self) -> u64 {
        self.shed_total
    }

    /// The next event. Cancel-safe (use it in `tokio::select!`). `None`
    /// when the endpoint has shut down. Sheds the oldest waiting requests
    /// beyond [`max_backlog`](Self::max_backlog) first (module docs).
    pub async fn recv(&mut self) -> Option<SipEvent> {
        self.shed_backlog();
        tokio::select! {
            biased;
            ev = self.events_rx.recv() => ev,
            tx = self.incoming.recv() => tx.map(|tx| SipEvent::Request(Box::new(ServerTransaction::new(tx)))),
        }
    }

    /// Answers `503` to the oldest waiting requests while more than
    /// `max_backlog` wait. Never awaits: the answers are sent from tasks.
    fn shed_backlog(&mut self) {
        let mut shed = 0u64;
        while self.incoming.len() > self.max_backlog {
            let Ok(tx) = self.incoming.try_recv() else {
                break;
            };
            if tx.original.method == Method::Ack {
                continue;
            }
            let tag = super::random_token();
            let mut response =
                super::response(&tx.original, StatusCode::ServiceUnavailable, Some(&tag));
            super::push_header(
                &mut response.headers,
                "Retry-After",
                SHED_RETRY_AFTER_SECS.to_string(),
            );
            tokio::spawn(ServerTransaction::new(tx).respond(response));
            shed += 1;
        }
        if shed == 0 {
            return;
        }
        self.shed_total += shed;
        self.shed_unlogged += shed;
        let now = Instant::now();
        if self
            .last_shed_log
            .is_none_or(|t| now.duration_since(t) >= SHED_LOG_INTERVAL)
        {
            warn!(
                shed = self.shed_unlogged,
                shed_total = self.shed_total,
                max_backlog = self.max_backlog,
                "overloaded: answered 503 to the oldest waiting requests"
            );
            self.shed_unlogged = 0;
            self.last_shed_log = Some(now);
        }
    }

    /// Stops the transport and timer tasks.
    pub fn shutdown(&self) {
        self.cancel.cancel();
    }
}

impl Drop for SipEndpoint {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

#[cfg(test)]
mod tests;
