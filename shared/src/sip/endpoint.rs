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
//! configured address (SPEC §4: one address for peers behind symmetric NAT).
//! Malformed datagrams are dropped by rsipstack's parser before they reach
//! this adapter.

use std::net::SocketAddr;

use rsipstack::sip::{Header, Request, Response, SipMessage, StatusCodeKind};
use rsipstack::transaction::key::{TransactionKey, TransactionRole};
use rsipstack::transaction::{Endpoint, EndpointBuilder, Transaction};
use rsipstack::transport::udp::UdpConnection;
use rsipstack::transport::{SipConnection, TcpListenerConnection, TransportLayer};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

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
    /// A new request (a new server transaction) to answer.
    Request(ServerTransaction),
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
}

/// An incoming request and the server transaction that answers it.
pub struct ServerTransaction {
    tx: Transaction,
}

impl std::fmt::Debug for ServerTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTransaction").field("key", &self.tx.key).finish()
    }
}

impl ServerTransaction {
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
}

impl SipEndpoint {
    /// Binds UDP on `addr` (port 0 picks one; see [`local_addr`](Self::local_addr))
    /// and, when `tcp` is set, a TCP listener on the same address and port,
    /// and starts rsipstack's transport and timer tasks. They stop when
    /// `cancel` is cancelled or the endpoint is dropped.
    ///
    /// # Errors
    /// [`EndpointError::Bind`] when a socket cannot be bound.
    pub async fn bind(
        addr: SocketAddr,
        tcp: bool,
        user_agent: &str,
        cancel: CancellationToken,
    ) -> Result<Self, EndpointError> {
        let cancel = cancel.child_token();
        let transport_layer = TransportLayer::new(cancel.clone());
        let udp = UdpConnection::create_connection(addr, None, Some(cancel.child_token()))
            .await
            .map_err(|e| EndpointError::Bind {
                transport: "udp",
                addr,
                reason: e.to_string(),
            })?;
        let local_addr = udp.get_addr().get_socketaddr().map_err(|e| EndpointError::Bind {
            transport: "udp",
            addr,
            reason: e.to_string(),
        })?;
        transport_layer.add_transport(udp.into());
        if tcp {
            let tcp_addr = SocketAddr::new(addr.ip(), local_addr.port());
            let listener = TcpListenerConnection::new(tcp_addr, None).await.map_err(|e| {
                EndpointError::Bind {
                    transport: "tcp",
                    addr: tcp_addr,
                    reason: e.to_string(),
                }
            })?;
            transport_layer.add_transport(SipConnection::from(listener));
        }
        let endpoint = EndpointBuilder::new()
            .with_user_agent(user_agent)
            .with_transport_layer(transport_layer)
            .with_cancel_token(cancel.clone())
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
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        Ok(Self {
            endpoint,
            incoming,
            events_tx,
            events_rx,
            local_addr,
            user_agent: user_agent.to_owned(),
            cancel,
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
        let via = self
            .endpoint
            .inner
            .get_via(None, None)
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
        let mut tx = Transaction::new_client(key, request, self.endpoint.inner.clone(), None);
        let events = self.events_tx.clone();
        let cancel = self.cancel.clone();
        tokio::spawn(async move {
            let run = async {
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

    /// The next event. Cancel-safe (use it in `tokio::select!`). `None`
    /// when the endpoint has shut down.
    pub async fn recv(&mut self) -> Option<SipEvent> {
        tokio::select! {
            biased;
            ev = self.events_rx.recv() => ev,
            tx = self.incoming.recv() => tx.map(|tx| SipEvent::Request(ServerTransaction { tx })),
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
