//! [`SipEndpoint`]: the async adapter between a daemon's event loop and
//! the network, over the project's own transaction layer (RFC 3261 §17).
//!
//! The daemons' protocol cores are sans-IO: they turn events into requests
//! and responses. This adapter is where those messages meet the network:
//!
//! * [`SipEndpoint::send_request`] runs a client transaction
//!   ([`ClientTransactions`]: Timer E retransmissions over UDP, Timer F)
//!   and reports its final response, or its failure, as one [`SipEvent`]
//!   carrying the caller's request id;
//! * incoming requests arrive as [`SipEvent::Request`] holding the server
//!   transaction ([`ServerTransactions`]), which the loop answers with
//!   [`ServerTransaction::respond`]; a retransmitted request is answered
//!   from the table, never shown twice.
//!
//! One task owns the sockets and both tables; the handles talk to it over
//! channels.
//!
//! Every request and response leaves from the one UDP socket bound to the
//! configured address (SPEC §4: one address for peers behind symmetric NAT),
//! except a request to a `sips:` (or `transport=tls`/`tcp`) URI: it goes
//! over a stream connection to the URI's host (RFC 3261 §18.1.1), TLS
//! checked with the [`TlsClient`] set on the endpoint (§26), opened once
//! per remote and kept; requests the peer sends back over that connection
//! are served like any other and answered on it (§18.2.2). With `tcp` set
//! the endpoint also listens on TCP on its UDP port.
//! A request the parser refuses for its method (an extension method, or a
//! `CSeq` naming another method, RFC 4475 §3.1.1.2 and §3.1.2.18) is
//! answered from its raw head, `501` with the endpoint's `Allow` or `400`
//! ([`wire::not_implemented`]), and one whose `Content-Length` is no number
//! or longer than its body `400` ([`wire::bad_length`]), as the
//! collector's ports answer them (SPEC §16); anything else the parser
//! refuses is dropped.
//!
//! Each incoming request carries the address it came from
//! ([`ServerTransaction::source`]): the datagram's source for UDP, the
//! peer of the connection for a stream — never a header the peer wrote.
//! Both daemons decide on it who may ask what (SPEC §4).
//!
//! Oversized datagrams: every datagram is read whole (up to 65,535 bytes,
//! RFC 768); one over [`MAX_DATAGRAM`] is dropped, counted
//! ([`SipEndpoint::oversized_total`]) and logged at warn at most once per
//! [`OVERSIZED_LOG_INTERVAL`] with the count since the last line.
//!
//! Overload: new requests wait for the loop in a queue. When more than
//! [`SipEndpoint::max_backlog`] are waiting as the loop asks for the next
//! one, [`SipEndpoint::recv`] answers the oldest waiting ones itself with
//! `503 Service Unavailable` and `Retry-After: 1` until the backlog is
//! back at the bound, so a loop that falls behind serves recent requests,
//! not ones their senders gave up on long ago, and the queue cannot grow
//! for ever; and a request that finds [`MAX_WAITING`] waiting (a loop
//! that does not ask for a while) is dropped at once. Shedding is logged
//! at warn, at most once per 5 s. The answers
//! sent before anyone looked at who asked (the `503`s, and the raw `501`
//! and `400`) are at most [`RAW_ANSWERS_PER_SEC`] each; past it the request
//! is dropped, so a flood from forged sources gets no flood back.
//!
//! Streams: at most [`MAX_STREAMS`] connections; one more is closed at
//! once, and one a peer opened is closed after [`ACCEPTED_IDLE`] without a
//! byte from it. A connection's messages wait for the task in one queue of
//! [`STREAM_EVENTS`] shared by all connections; when it is full a
//! connection's reader waits, reading no further, and the waiting readers
//! take their turns in order: a peer that sends faster than the endpoint
//! serves slows itself, not the registrar's connection. What is written
//! to a connection waits in a queue of [`wire::STREAM_WRITE_QUEUE`]; a
//! peer that reads nothing fills it and is closed ([`wire::queue_on`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rsipstack::sip::{Host, Method, Request, Response, SipMessage, StatusCode};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::logging::{log_datagram, WIRE};
use crate::token_bucket::TokenBucket;

use super::transaction::server::{Received, ServerKey, ServerTransactions};
use super::transaction::{ClientTransactions, Link, Outcome, StreamTransport, TIMER_F};
use super::wire::{self, DecodeError, Frame, StreamFramer};

/// Default bound on incoming requests waiting for the loop (see the module
/// docs): about 0.4 s of traffic at 5000 requests/s.
pub(crate) const DEFAULT_MAX_BACKLOG: usize = 2048;

/// The most requests waiting for the loop at all: past
/// [`DEFAULT_MAX_BACKLOG`] the oldest are shed when the loop asks, and
/// past this one a new request is dropped at once, so a loop that does not
/// ask for a while holds a bounded queue whatever arrives.
pub(crate) const MAX_WAITING: usize = 4 * DEFAULT_MAX_BACKLOG;

/// `Retry-After` of a `503` sent when shedding, seconds.
pub(crate) const SHED_RETRY_AFTER_SECS: u32 = 1;

/// At most one warning about shed requests per this interval.
pub(crate) const SHED_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// The largest datagram taken: RFC 3261 §18.1.1 keeps a request over UDP
/// under the path MTU (1,300 bytes without congestion control), and none
/// the daemons serve comes near this; a larger one is a mistake or an
/// attack, not worth parsing.
pub const MAX_DATAGRAM: usize = 8_192;

/// At most one warning about oversized datagrams per this interval.
pub const OVERSIZED_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// The largest UDP payload (RFC 768's 16-bit length less the headers).
const UDP_MAX_PAYLOAD: usize = 65_535;

/// A TCP or TLS connection not open (TCP connect, and the handshake) within
/// this is given up: a server that never answers the SYN or the
/// ClientHello must not hold a registration forever. It fails with this
/// cause and the request is tried again as any failed one.
const CONNECT_DEADLINE: Duration = Duration::from_secs(10);

/// How long a closing connection may take to say so to its peer.
const CLOSE_DEADLINE: Duration = Duration::from_secs(1);

/// Bytes read from a stream connection at a time.
const STREAM_READ: usize = 16 * 1024;

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
        /// The OS error.
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
    /// that times out (Timer F) is reported as a locally generated 408
    /// (RFC 3261 §8.1.3.1).
    Response {
        /// The id given to [`SipEndpoint::send_request`].
        id: u64,
        /// The final response (status ≥ 200).
        response: Response,
    },
    /// The request with this id ended without any final response: its
    /// connection could not be opened, or it could not be sent at all.
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

/// A stream connection: its transport and its peer.
type StreamKey = (StreamTransport, SocketAddr);

/// Where a response goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// A datagram to this address ([`wire::response_target`]).
    Udp(SocketAddr),
    /// The connection the request came on (RFC 3261 §18.2.2).
    Stream(StreamKey),
}

impl Route {
    fn reliable(self) -> bool {
        matches!(self, Route::Stream(_))
    }
}

/// What the handles ask of the endpoint's task.
enum Command {
    /// Start a client transaction for `request` to `to`, over `stream`
    /// when set (the TLS server name with it).
    Send {
        id: u64,
        request: Request,
        to: SocketAddr,
        stream: Option<(StreamTransport, ServerName<'static>)>,
    },
    /// Send `response` in server transaction `key`.
    Respond {
        key: ServerKey,
        route: Route,
        response: Response,
    },
    /// Server transaction `key` was dropped unanswered.
    Abandon(ServerKey),
    /// Check TLS connections opened from now on with this.
    SetTls(Arc<rustls::ClientConfig>),
}

/// An incoming request and the server transaction that answers it.
/// Dropped unanswered, the request is ignored: its retransmission comes
/// to the loop again.
pub struct ServerTransaction {
    request: Request,
    source: SocketAddr,
    key: ServerKey,
    route: Route,
    commands: mpsc::UnboundedSender<Command>,
    answered: bool,
}

impl std::fmt::Debug for ServerTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTransaction")
            .field("key", &self.key)
            .field("source", &self.source)
            .finish()
    }
}

impl ServerTransaction {
    /// The address the request came from: the UDP datagram's source or the
    /// stream's peer, as the socket saw it (not `Via`, which the sender
    /// writes). Always known; an `Option` for the callers that also serve
    /// requests without one.
    pub fn source(&self) -> Option<SocketAddr> {
        Some(self.source)
    }

    /// The request.
    pub fn request(&self) -> &Request {
        &self.request
    }

    /// Sends the final response (retransmissions of the request are then
    /// answered from the transaction table).
    pub async fn respond(self, response: Response) {
        self.send_response(response);
    }

    /// [`respond`](Self::respond) without a future: the endpoint's task
    /// sends it.
    fn send_response(mut self, response: Response) {
        self.answered = true;
        let command = Command::Respond {
            key: self.key.clone(),
            route: self.route,
            response,
        };
        if self.commands.send(command).is_err() {
            debug!("response not sent: the endpoint has shut down");
        }
    }
}

impl Drop for ServerTransaction {
    fn drop(&mut self) {
        if !self.answered {
            let _ = self.commands.send(Command::Abandon(self.key.clone()));
        }
    }
}

/// A SIP endpoint bound to one address: a task that owns its sockets and
/// transactions, and a channel of [`SipEvent`]s.
pub struct SipEndpoint {
    commands: mpsc::UnboundedSender<Command>,
    /// Requests waiting for the loop (the backlog).
    incoming: mpsc::Receiver<Box<ServerTransaction>>,
    events_tx: mpsc::UnboundedSender<SipEvent>,
    events_rx: mpsc::UnboundedReceiver<SipEvent>,
    local_addr: SocketAddr,
    cancel: CancellationToken,
    max_backlog: usize,
    /// The `503`s of the shed requests ([`RAW_ANSWERS_PER_SEC`]).
    shed_answers: TokenBucket,
    /// Requests shed since the last warning.
    shed_unlogged: u64,
    /// Requests shed in all.
    shed_total: u64,
    last_shed_log: Option<Instant>,
    /// Datagrams over [`MAX_DATAGRAM`], dropped.
    oversized: Arc<AtomicU64>,
    /// Requests dropped because [`MAX_WAITING`] were waiting.
    dropped: Arc<AtomicU64>,
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
/// words (tokio-rustls passes rustls's error on inside an I/O error);
/// anything else as the OS or rustls says it.
fn connect_failure(error: &std::io::Error) -> String {
    let tls = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    if let Some(rustls::Error::InvalidCertificate(certificate)) = tls {
        return crate::certificate::refusal(certificate);
    }
    error.to_string()
}

/// What TLS client connections are checked with (RFC 3261 §26.3.1): the
/// CAs a server's certificate must chain to — its name must be the
/// URI's host — and, for a server that asks, a client identity: the
/// rustls client configuration built from the PEM files, checked when
/// read.
#[derive(Clone)]
pub struct TlsClient {
    config: Arc<rustls::ClientConfig>,
    /// Whether it has a client identity.
    identity: bool,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsClient")
            .field("identity", &self.identity)
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
        let has_identity = identity.is_some();
        let builder = || {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map(|b| b.with_root_certificates(roots.clone()))
        };
        let config = match identity {
            None => builder()
                .map(|b| b.with_no_client_auth())
                .map_err(|e| TlsFileError {
                    path: ca.to_owned(),
                    reason: e.to_string(),
                })?,
            Some((cert, key)) => {
                let chain = certificates(cert)?;
                let key_pem = read(key)?;
                let key_der =
                    PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsFileError {
                        path: key.to_owned(),
                        reason: format!("no pem private key in it ({e})"),
                    })?;
                let chain_der = CertificateDer::pem_slice_iter(&chain)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| TlsFileError {
                        path: cert.to_owned(),
                        reason: format!("not a pem certificate file ({e})"),
                    })?;
                // The key must be the certificate's: else every handshake
                // fails, far from the file's name.
                builder()
                    .and_then(|b| b.with_client_auth_cert(chain_der, key_der))
                    .map_err(|e| TlsFileError {
                        path: key.to_owned(),
                        reason: format!(
                            "does not go with the certificate in {} ({e})",
                            cert.display()
                        ),
                    })?
            }
        };
        Ok(Self {
            config: Arc::new(config),
            identity: has_identity,
        })
    }
}

impl SipEndpoint {
    /// Sets what TLS client connections opened from now on are checked
    /// with.
    pub fn set_tls_client(&self, tls: &TlsClient) {
        let _ = self.commands.send(Command::SetTls(Arc::clone(&tls.config)));
    }

    /// Binds UDP on `addr` (port 0 picks one; see [`local_addr`](Self::local_addr))
    /// and, when `tcp` is set, a TCP listener on the same address and port,
    /// answering a request of a method the parser does not know `501` with
    /// `Allow: allow` (module docs), and starts the endpoint's task. It
    /// stops when `cancel` is cancelled or the endpoint is dropped.
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
        let bind_err = |transport, addr, e: std::io::Error| EndpointError::Bind {
            transport,
            addr,
            reason: e.to_string(),
        };
        let udp = udp_socket(addr).map_err(|e| bind_err("udp", addr, e))?;
        let local_addr = udp.local_addr().map_err(|e| bind_err("udp", addr, e))?;
        let listener = if tcp {
            let tcp_addr = SocketAddr::new(addr.ip(), local_addr.port());
            let listener = TcpListener::bind(tcp_addr)
                .await
                .map_err(|e| bind_err("tcp", tcp_addr, e))?;
            Some(listener)
        } else {
            None
        };
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let (incoming_tx, incoming) = mpsc::channel(MAX_WAITING);
        let (streams_tx, streams_rx) = mpsc::channel(STREAM_EVENTS);
        let oversized = Arc::new(AtomicU64::new(0));
        let dropped = Arc::new(AtomicU64::new(0));
        let task = Task {
            udp: Arc::new(udp),
            local_addr,
            allow,
            client: ClientTransactions::new(local_addr, user_agent),
            server_header: user_agent.to_owned(),
            server: ServerTransactions::new(),
            requests: HashMap::new(),
            streams: HashMap::new(),
            connecting: HashMap::new(),
            tls: None,
            streams_tx,
            events: events_tx.clone(),
            incoming: incoming_tx,
            commands: commands.clone(),
            oversized: Arc::clone(&oversized),
            dropped: Arc::clone(&dropped),
            oversized_log: OversizedLog::default(),
            raw_answers: TokenBucket::full(RAW_ANSWERS_PER_SEC),
            cancel: cancel.clone(),
        };
        tokio::spawn(task.run(commands_rx, streams_rx, listener));
        Ok(Self {
            commands,
            incoming,
            events_tx,
            events_rx,
            local_addr,
            cancel,
            max_backlog: DEFAULT_MAX_BACKLOG,
            shed_answers: TokenBucket::full(RAW_ANSWERS_PER_SEC),
            shed_unlogged: 0,
            shed_total: 0,
            last_shed_log: None,
            oversized,
            dropped,
        })
    }

    /// The bound UDP address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Sends `request` in a new client transaction: adds the top `Via`
    /// (this endpoint's address, a fresh branch, `rport`), `Max-Forwards: 70`
    /// and `User-Agent` when absent. The request goes to the Request-URI's
    /// host (RFC 3263 §4.2: its port, else 5060, 5061 for `sips:`; a host
    /// name is looked up). The final response arrives later as
    /// [`SipEvent::Response`] (or [`SipEvent::Failed`]) with `id`.
    ///
    /// # Errors
    /// [`EndpointError::Request`] when the request lacks what a transaction
    /// key needs (a `CSeq`, a `Call-ID`).
    pub fn send_request(&self, id: u64, request: Request) -> Result<(), EndpointError> {
        let err = |reason: &str| EndpointError::Request {
            method: request.method.to_string(),
            reason: reason.to_owned(),
        };
        if super::cseq(&request.headers).is_none() {
            return Err(err("no cseq"));
        }
        if super::call_id(&request.headers).is_none() {
            return Err(err("no call-id"));
        }
        let uri = request.uri.to_string();
        // The transport the request leaves on (RFC 3261 §18.1.1): TLS for
        // a sips: target, TCP for transport=tcp.
        let stream = super::stream_transport(&uri).map(|t| match t {
            rsipstack::sip::Transport::Tls => StreamTransport::Tls,
            _ => StreamTransport::Tcp,
        });
        let host = request.uri.host_with_port.host.clone();
        // The name a TLS server's certificate must hold (RFC 5922 §7.2).
        let stream = match stream {
            None => None,
            Some(transport) => {
                let name = match &host {
                    Host::IpAddr(ip) => ServerName::IpAddress((*ip).into()),
                    Host::Domain(domain) => ServerName::try_from(domain.to_string())
                        .map_err(|_| err("the request-uri's host is no host name"))?,
                };
                Some((transport, name))
            }
        };
        if let Some(to) = super::uri_socket_addr(&uri) {
            let _ = self.commands.send(Command::Send {
                id,
                request,
                to,
                stream,
            });
            return Ok(());
        }
        // A host name: looked up off the loop (RFC 3263 §4.2 without SRV).
        let port = request.uri.host_with_port.port.map_or(
            if uri.to_ascii_lowercase().starts_with("sips:") {
                5061
            } else {
                5060
            },
            |p| p.value(),
        );
        let commands = self.commands.clone();
        let events = self.events_tx.clone();
        let cancel = self.cancel.clone();
        tokio::spawn(async move {
            let lookup = tokio::net::lookup_host((host.to_string(), port));
            let found = tokio::select! {
                found = lookup => found,
                () = cancel.cancelled() => return,
            };
            match found.map(|mut addrs| addrs.next()) {
                Ok(Some(to)) => {
                    let _ = commands.send(Command::Send {
                        id,
                        request,
                        to,
                        stream,
                    });
                }
                Ok(None) => {
                    let reason = format!("{host} has no address");
                    let _ = events.send(SipEvent::Failed { id, reason });
                }
                Err(e) => {
                    let reason = format!("cannot look up {host}: {e}");
                    let _ = events.send(SipEvent::Failed { id, reason });
                }
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

    /// Incoming requests shed because of the backlog bound: answered
    /// `503` (within a rate) or dropped, the ones that found the queue
    /// full included (module docs, "Overload").
    pub fn shed_total(&self) -> u64 {
        self.shed_total + self.dropped.load(Ordering::Relaxed)
    }

    /// The next event. Cancel-safe (use it in `tokio::select!`). `None`
    /// when the endpoint has shut down. Sheds the oldest waiting requests
    /// beyond [`max_backlog`](Self::max_backlog) first (module docs).
    pub async fn recv(&mut self) -> Option<SipEvent> {
        self.shed_backlog();
        tokio::select! {
            biased;
            ev = self.events_rx.recv() => ev,
            tx = self.incoming.recv() => tx.map(SipEvent::Request),
        }
    }

    /// Answers `503` to the oldest waiting requests while more than
    /// `max_backlog` wait. Never awaits: the endpoint's task sends the
    /// answers.
    fn shed_backlog(&mut self) {
        let mut shed = 0u64;
        let now = Instant::now();
        while self.incoming.len() > self.max_backlog {
            let Ok(tx) = self.incoming.try_recv() else {
                break;
            };
            shed += 1;
            // Dropped unanswered past the rate (RAW_ANSWERS_PER_SEC): a
            // flood gets no flood of 503s back.
            if !self
                .shed_answers
                .take(now, RAW_ANSWERS_PER_SEC, RAW_ANSWERS_PER_SEC)
            {
                continue;
            }
            let tag = super::random_token();
            let mut response =
                super::response(&tx.request, StatusCode::ServiceUnavailable, Some(&tag));
            super::push_header(
                &mut response.headers,
                "Retry-After",
                SHED_RETRY_AFTER_SECS.to_string(),
            );
            tx.send_response(response);
        }
        if shed == 0 {
            return;
        }
        self.shed_total += shed;
        self.shed_unlogged += shed;
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

    /// Stops the endpoint's task and its connections.
    pub fn shutdown(&self) {
        self.cancel.cancel();
    }
}

impl Drop for SipEndpoint {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// A byte stream a connection runs over: TCP, or TLS over TCP.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// The way to a connection's task: its writer's queue (at most
/// [`wire::STREAM_WRITE_QUEUE`] messages, [`wire::queue_on`]) and the
/// token that closes it.
struct Writer {
    tx: mpsc::Sender<Bytes>,
    close: CancellationToken,
}

impl Writer {
    fn new() -> (Self, mpsc::Receiver<Bytes>) {
        let (tx, rx) = mpsc::channel(wire::STREAM_WRITE_QUEUE);
        let close = CancellationToken::new();
        (Self { tx, close }, rx)
    }
}

/// What a connection's task tells the endpoint's task.
enum StreamEvent {
    /// The connection to `key` is open; bytes for it go to `writer`.
    Connected { key: StreamKey, writer: Writer },
    /// The connection to `key` could not be opened.
    ConnectFailed { key: StreamKey, reason: String },
    /// One whole message arrived on `key`.
    Message { key: StreamKey, bytes: Bytes },
    /// The connection to `key` closed.
    Closed { key: StreamKey },
}

#[derive(Default)]
struct OversizedLog {
    last: Option<Instant>,
    unlogged: u64,
}

/// The endpoint's task: the sockets, the connections and both transaction
/// tables (module docs).
struct Task {
    udp: Arc<UdpSocket>,
    local_addr: SocketAddr,
    /// The methods the endpoint's user serves, for the `Allow` of a `501`.
    allow: &'static str,
    client: ClientTransactions<u64>,
    /// Every response's `Server` (the requests' `User-Agent`).
    server_header: String,
    server: ServerTransactions,
    /// The requests in flight, for the `408` of one that times out.
    requests: HashMap<u64, Request>,
    /// The open connections: where their bytes go.
    streams: HashMap<StreamKey, Writer>,
    /// The requests waiting for a connection being opened.
    connecting: HashMap<StreamKey, Vec<(u64, Request)>>,
    tls: Option<Arc<rustls::ClientConfig>>,
    streams_tx: mpsc::Sender<StreamEvent>,
    events: mpsc::UnboundedSender<SipEvent>,
    incoming: mpsc::Sender<Box<ServerTransaction>>,
    /// For the server transactions' answers.
    commands: mpsc::UnboundedSender<Command>,
    oversized: Arc<AtomicU64>,
    /// Requests dropped because [`MAX_WAITING`] were waiting.
    dropped: Arc<AtomicU64>,
    oversized_log: OversizedLog,
    /// The answers to requests the parser refused ([`RAW_ANSWERS_PER_SEC`]).
    raw_answers: TokenBucket,
    cancel: CancellationToken,
}

impl Task {
    async fn run(
        mut self,
        mut commands: mpsc::UnboundedReceiver<Command>,
        mut streams: mpsc::Receiver<StreamEvent>,
        listener: Option<TcpListener>,
    ) {
        let udp = Arc::clone(&self.udp);
        let mut buf = vec![0u8; UDP_MAX_PAYLOAD];
        let cancel = self.cancel.clone();
        let mut accept_paused_until: Option<Instant> = None;
        loop {
            let deadline = match (self.client.poll_timeout(), self.server.poll_timeout()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let far = Instant::now() + Duration::from_secs(3600);
            let accepting = accept_paused_until.is_none_or(|until| Instant::now() >= until);
            let deadline = match (deadline, accept_paused_until.filter(|_| !accepting)) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            tokio::select! {
                () = cancel.cancelled() => break,
                read = udp.recv_from(&mut buf) => match read {
                    Ok((len, from)) => self.on_datagram(&buf[..len], from).await,
                    // An ICMP error of an earlier datagram, on some OSes.
                    Err(e) => debug!(error = %e, "udp receive failed"),
                },
                Some(command) = commands.recv() => self.on_command(command).await,
                Some(event) = streams.recv() => self.on_stream(event).await,
                accepted = accept(listener.as_ref()), if accepting => match accepted {
                    Ok((stream, peer)) => {
                        accept_paused_until = None;
                        self.accepted(stream, peer);
                    }
                    // Out of descriptors (EMFILE) and the like: the
                    // listener stays ready, so accepting again at once
                    // would spin; the rest of the loop goes on meanwhile.
                    Err(e) => {
                        warn!(error = %e, pause_ms = ACCEPT_PAUSE.as_millis(), "tcp accept failed; accepting again after a pause");
                        accept_paused_until = Some(Instant::now() + ACCEPT_PAUSE);
                    }
                },
                () = tokio::time::sleep_until(deadline.unwrap_or(far)), if deadline.is_some() => {
                    let now = Instant::now();
                    self.client.handle_timeout(now);
                    self.server.handle_timeout(now);
                }
            }
            self.flush().await;
        }
        debug!("sip endpoint stopped");
    }

    async fn on_datagram(&mut self, datagram: &[u8], from: SocketAddr) {
        if datagram.len() > MAX_DATAGRAM {
            self.note_oversized(datagram.len(), from);
            return;
        }
        if tracing::enabled!(target: WIRE, tracing::Level::INFO) {
            log_datagram("udp received", from, datagram);
        }
        match wire::decode(datagram, from) {
            Ok(SipMessage::Request(request)) => {
                let route = Route::Udp(wire::response_target(&request.headers, from));
                self.on_request(request, from, route).await;
            }
            Ok(SipMessage::Response(response)) => self.on_response(response),
            Err(e) => self.refused(datagram, from, Route::Udp(from), e).await,
        }
    }

    /// A message the decoder refused: a request of a method the parser
    /// does not know, or with a bad `Content-Length`, answered from its
    /// raw head (module docs; sent to the source over UDP, RFC 3581 §4);
    /// anything else dropped.
    async fn refused(&mut self, bytes: &[u8], from: SocketAddr, route: Route, error: DecodeError) {
        if error == DecodeError::Keepalive {
            return;
        }
        match wire::refused(bytes, self.allow) {
            // Whoever sends them, at most RAW_ANSWERS_PER_SEC: an answer
            // to a forged source is a reflection.
            Some(_)
                if !self.raw_answers.take(
                    Instant::now(),
                    RAW_ANSWERS_PER_SEC,
                    RAW_ANSWERS_PER_SEC,
                ) =>
            {
                debug!(target: crate::logging::NETWORK, src = %from, "sip request the parser refused dropped: over the answers' rate");
            }
            Some(answer) => {
                debug!(src = %from, status = %answer.status_code, "sip request the parser refused answered");
                self.transmit(route, wire::encode_response(answer, &self.server_header))
                    .await;
            }
            None => debug!(src = %from, %error, "sip message dropped"),
        }
    }

    fn note_oversized(&mut self, len: usize, from: SocketAddr) {
        let total = self.oversized.fetch_add(1, Ordering::Relaxed) + 1;
        let log = &mut self.oversized_log;
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

    /// A request: a new one goes to the loop, a retransmission is answered
    /// from its transaction (RFC 3261 §17.2.2). An `ACK` has no
    /// non-INVITE transaction and this endpoint serves no INVITE: dropped.
    async fn on_request(&mut self, request: Request, source: SocketAddr, route: Route) {
        if request.method == Method::Ack {
            debug!(src = %source, "ack dropped");
            return;
        }
        match self.server.handle_request(Instant::now(), &request) {
            Some(Received::New(key)) => {
                let tx = ServerTransaction {
                    request,
                    source,
                    key,
                    route,
                    commands: self.commands.clone(),
                    answered: false,
                };
                // A loop far behind: the queue stays bounded, the
                // request is dropped (its transaction forgotten, so a
                // retransmission is a new chance).
                if self.incoming.try_send(Box::new(tx)).is_err() {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                    debug!(target: crate::logging::NETWORK, src = %source, "request dropped: the loop has {MAX_WAITING} waiting");
                }
            }
            Some(Received::Answer(bytes)) => self.transmit(route, bytes).await,
            Some(Received::Absorbed) => {}
            // No transaction can hold it (its CSeq is past what §8.1.1.5
            // allows, RFC 4475 §3.1.2.4): answered statelessly when a
            // response can be built, as the collector's ports answer it.
            None => match super::request_refusal(&request, self.allow) {
                Some(refusal) => {
                    let response = refusal.response(&request, &self.server_header);
                    let bytes = wire::encode_response(response, &self.server_header);
                    self.transmit(route, bytes).await;
                }
                None => debug!(src = %source, "request without via or cseq dropped"),
            },
        }
    }

    fn on_response(&mut self, response: Response) {
        if let Some((id, response)) = self.client.handle_response(Instant::now(), response) {
            self.requests.remove(&id);
            let _ = self.events.send(SipEvent::Response { id, response });
        }
    }

    async fn on_command(&mut self, command: Command) {
        match command {
            Command::Send {
                id,
                request,
                to,
                stream,
            } => match stream {
                None => self.start(id, request, to, Link::Udp),
                Some((transport, name)) => {
                    self.send_over_stream(id, request, (transport, to), name)
                }
            },
            Command::Respond {
                key,
                route,
                response,
            } => {
                let final_response = response.status_code.code() >= 200;
                let bytes = wire::encode_response(response, &self.server_header);
                self.server.handle_response(
                    Instant::now(),
                    &key,
                    bytes.clone(),
                    final_response,
                    route.reliable(),
                );
                self.transmit(route, bytes).await;
            }
            Command::Abandon(key) => self.server.abandon(&key),
            Command::SetTls(config) => self.tls = Some(config),
        }
    }

    /// Starts the client transaction `id`; a request that cannot be sent
    /// fails at once.
    fn start(&mut self, id: u64, request: Request, to: SocketAddr, link: Link) {
        let sent = self
            .client
            .send_on(Instant::now(), id, to, request.clone(), TIMER_F, link);
        match sent {
            Ok(()) => {
                self.requests.insert(id, request);
            }
            Err(e) => {
                let reason = e.to_string();
                let _ = self.events.send(SipEvent::Failed { id, reason });
            }
        }
    }

    /// Sends over the open connection to `key`, or opens one first. The
    /// connect and the handshake are waited for here, so one that fails
    /// (refused; a certificate not trusted, expired, for another name)
    /// ends the request at once with its cause.
    fn send_over_stream(
        &mut self,
        id: u64,
        request: Request,
        key: StreamKey,
        name: ServerName<'static>,
    ) {
        if self.streams.contains_key(&key) {
            self.start_on_stream(id, request, key);
            return;
        }
        let waiting = self.connecting.entry(key).or_default();
        waiting.push((id, request));
        if waiting.len() > 1 {
            return;
        }
        let tls = match key.0 {
            StreamTransport::Tcp => None,
            StreamTransport::Tls => match &self.tls {
                Some(config) => Some((Arc::clone(config), name)),
                None => {
                    self.connect_failed(key, "no tls client configured".to_owned());
                    return;
                }
            },
        };
        let events = self.streams_tx.clone();
        let cancel = self.cancel.clone();
        tokio::spawn(async move {
            let opened = tokio::select! {
                opened = tokio::time::timeout(CONNECT_DEADLINE, connect(key.1, tls)) => opened,
                () = cancel.cancelled() => return,
            };
            let io = match opened {
                Ok(Ok(io)) => io,
                Ok(Err(e)) => {
                    let reason = connect_failure(&e);
                    let _ = events
                        .send(StreamEvent::ConnectFailed { key, reason })
                        .await;
                    return;
                }
                Err(_) => {
                    let reason = format!("not established within {} s", CONNECT_DEADLINE.as_secs());
                    let _ = events
                        .send(StreamEvent::ConnectFailed { key, reason })
                        .await;
                    return;
                }
            };
            let (writer, writes) = Writer::new();
            let close = writer.close.clone();
            let _ = events.send(StreamEvent::Connected { key, writer }).await;
            serve_connection(io, key, writes, close, events, cancel, None).await;
        });
    }

    fn start_on_stream(&mut self, id: u64, request: Request, key: StreamKey) {
        let link = Link::Stream {
            transport: key.0,
            sent_by: self.local_addr,
        };
        self.start(id, request, key.1, link);
    }

    fn connect_failed(&mut self, key: StreamKey, reason: String) {
        let (transport, remote) = key;
        for (id, _) in self.connecting.remove(&key).unwrap_or_default() {
            let reason = format!("connection to {transport} {remote} failed: {reason}");
            let _ = self.events.send(SipEvent::Failed { id, reason });
        }
    }

    /// A TCP connection a peer opened: served like one opened here.
    fn accepted(&mut self, stream: TcpStream, peer: SocketAddr) {
        // The agent's peers are its few collectors: a host that opens more
        // connections than they could is refused (the stream dropped,
        // closing it) rather than given a task and a buffer each.
        if self.streams.len() >= MAX_STREAMS {
            warn!(target: crate::logging::NETWORK, %peer, max = MAX_STREAMS, "tcp connection refused: too many connections open");
            return;
        }
        let key = (StreamTransport::Tcp, peer);
        let (writer, writes) = Writer::new();
        let close = writer.close.clone();
        self.streams.insert(key, writer);
        let events = self.streams_tx.clone();
        let cancel = self.cancel.clone();
        tokio::spawn(serve_connection(
            Box::new(stream),
            key,
            writes,
            close,
            events,
            cancel,
            Some(ACCEPTED_IDLE),
        ));
    }

    async fn on_stream(&mut self, event: StreamEvent) {
        match event {
            StreamEvent::Connected { key, writer } => {
                self.streams.insert(key, writer);
                for (id, request) in self.connecting.remove(&key).unwrap_or_default() {
                    self.start_on_stream(id, request, key);
                }
            }
            StreamEvent::ConnectFailed { key, reason } => self.connect_failed(key, reason),
            StreamEvent::Message { key, bytes } => match wire::decode(&bytes, key.1) {
                Ok(SipMessage::Request(request)) => {
                    self.on_request(request, key.1, Route::Stream(key)).await;
                }
                Ok(SipMessage::Response(response)) => self.on_response(response),
                Err(e) => self.refused(&bytes, key.1, Route::Stream(key), e).await,
            },
            StreamEvent::Closed { key } => {
                // Requests in flight over it end at Timer F, as over a
                // connection that stays open but silent.
                if self.streams.remove(&key).is_some() {
                    let _ = self.events.send(SipEvent::Closed { remote: key.1 });
                }
            }
        }
    }

    /// Sends `bytes` on `route`. A lost datagram is the peer's
    /// retransmission to repair; a response for a connection that closed
    /// is lost with it (its client's transaction times out).
    async fn transmit(&mut self, route: Route, bytes: Bytes) {
        match route {
            Route::Udp(to) => {
                if tracing::enabled!(target: WIRE, tracing::Level::INFO) {
                    log_datagram("udp send", to, &bytes);
                }
                if let Err(e) = self.udp.send_to(&bytes, to).await {
                    debug!(dst = %to, error = %e, "cannot send a sip datagram");
                }
            }
            Route::Stream(key) => {
                let sent = self
                    .streams
                    .get(&key)
                    .is_some_and(|writer| wire::queue_on(&writer.tx, &writer.close, bytes));
                if !sent {
                    debug!(dst = %key.1, transport = %key.0, "connection closed, sip message not sent");
                }
            }
        }
    }

    /// Sends what the client transactions queued and reports the ones
    /// that timed out.
    async fn flush(&mut self) {
        while let Some(datagram) = self.client.poll_transmit() {
            let route = match datagram.link {
                Link::Udp => Route::Udp(datagram.to),
                Link::Stream { transport, .. } => Route::Stream((transport, datagram.to)),
            };
            self.transmit(route, datagram.bytes).await;
        }
        while let Some((id, outcome)) = self.client.poll_outcome() {
            let request = self.requests.remove(&id);
            let response = match (outcome, request) {
                (Outcome::Response(response), _) => response,
                (Outcome::TimedOut, Some(request)) => {
                    super::response(&request, StatusCode::RequestTimeout, None)
                }
                (Outcome::TimedOut, None) => continue,
            };
            let _ = self.events.send(SipEvent::Response { id, response });
        }
    }
}

/// Connection events (messages above all) waiting for the endpoint's task
/// at most: past it a connection's reader waits for room, so a peer that
/// sends faster than the endpoint serves is read no further meanwhile,
/// and the other connections take their turns (tokio's channel serves
/// waiting senders in order) instead of queueing behind its backlog.
const STREAM_EVENTS: usize = 256;

/// The most answers a second to requests the parser refused (501, 400),
/// and to requests shed from the backlog (503): these are sent before
/// anyone has looked at who asked, so a flood from forged sources must
/// not make the agent a reflector. A real peer never needs them.
const RAW_ANSWERS_PER_SEC: f64 = 20.0;

/// How long a connection a peer opened may stay silent: a collector on
/// it refreshes its subscription and sends its keepalives well within
/// this, while idle connections from anyone else would hold the
/// [`MAX_STREAMS`] places for ever. The agent's own connections (to its
/// registrars) are not timed out: it keeps them for their requests.
const ACCEPTED_IDLE: Duration = Duration::from_secs(120);

/// How long accepting pauses after an accept error.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// The most stream connections open at once, accepted and opened.
const MAX_STREAMS: usize = 256;

/// The next connection on `listener`; never, without one.
async fn accept(listener: Option<&TcpListener>) -> std::io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(listener) => listener.accept().await,
        None => std::future::pending().await,
    }
}

/// Opens a TCP connection to `remote`, with a TLS handshake over it when
/// `tls` is set (checked with its config for its server name, RFC 5922
/// §7.2).
async fn connect(
    remote: SocketAddr,
    tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
) -> std::io::Result<Box<dyn Io>> {
    let tcp = TcpStream::connect(remote).await?;
    // SIP messages are small and each must leave at once.
    let _ = tcp.set_nodelay(true);
    match tls {
        None => Ok(Box::new(tcp)),
        Some((config, name)) => {
            let connector = tokio_rustls::TlsConnector::from(config);
            Ok(Box::new(connector.connect(name, tcp).await?))
        }
    }
}

/// Reads messages from a connection and writes what the endpoint's task
/// gives it, until either side closes it (RFC 3261 §18.3 framing,
/// [`StreamFramer`]); a keepalive is answered with one CRLF (RFC 5626
/// §3.5.1). Why it closed is logged: a TLS peer that refuses this end's
/// certificate says so only in an alert read here.
async fn serve_connection(
    io: Box<dyn Io>,
    key: StreamKey,
    mut writes: mpsc::Receiver<Bytes>,
    close: CancellationToken,
    events: mpsc::Sender<StreamEvent>,
    cancel: CancellationToken,
    idle: Option<Duration>,
) {
    let (transport, remote) = key;
    let (mut reader, mut writer) = tokio::io::split(io);
    let mut framer = StreamFramer::new();
    let mut buf = vec![0u8; STREAM_READ];
    // Without a limit the timer is never polled: its deadline is moot.
    let limit = idle.unwrap_or(Duration::from_secs(3600));
    let mut quiet_until = Instant::now() + limit;
    let error = loop {
        let bytes = tokio::select! {
            () = cancel.cancelled() => break None,
            () = close.cancelled() => break Some("the peer does not read what it is sent".to_owned()),
            () = tokio::time::sleep_until(quiet_until), if idle.is_some() => {
                break Some(format!("nothing received for {} s", limit.as_secs()));
            }
            read = reader.read(&mut buf) => match read {
                Ok(0) => break None,
                Ok(len) => {
                    quiet_until = Instant::now() + limit;
                    framer.push(&buf[..len]);
                    match frames(&mut framer, key, &events).await {
                        Ok(0) => continue,
                        Ok(pings) => Bytes::from(b"\r\n".repeat(pings)),
                        Err(e) => break Some(e.to_string()),
                    }
                }
                Err(e) => break Some(e.to_string()),
            },
            bytes = writes.recv() => match bytes {
                Some(bytes) => bytes,
                None => break None,
            },
        };
        // A peer that reads nothing blocks the write: its queue fills
        // meanwhile, and the close that follows ends the write too.
        let written = tokio::select! {
            written = writer.write_all(&bytes) => written,
            () = close.cancelled() => break Some("the peer does not read what it is sent".to_owned()),
            () = cancel.cancelled() => break None,
        };
        if let Err(e) = written {
            break Some(e.to_string());
        }
    };
    match error {
        Some(error) => {
            warn!(target: crate::logging::NETWORK, %remote, %transport, %error, "sip connection closed")
        }
        None => debug!(%remote, %transport, "sip connection closed"),
    }
    // A close_notify (TLS) and a FIN, unless the peer reads nothing more.
    let _ = tokio::time::timeout(CLOSE_DEADLINE, writer.shutdown()).await;
    let _ = events.send(StreamEvent::Closed { key }).await;
}

/// Hands every whole message in `framer` to the endpoint's task; the
/// keepalives found, to answer.
async fn frames(
    framer: &mut StreamFramer,
    key: StreamKey,
    events: &mpsc::Sender<StreamEvent>,
) -> Result<usize, wire::FrameError> {
    let mut pings = 0;
    while let Some(frame) = framer.next_frame()? {
        match frame {
            // Waits for room (module docs, "Streams").
            Frame::Message(bytes) => {
                let _ = events.send(StreamEvent::Message { key, bytes }).await;
            }
            Frame::Ping => pings += 1,
        }
    }
    Ok(pings)
}

#[cfg(test)]
mod tests;
