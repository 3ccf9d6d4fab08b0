//! Why one of the collector's own requests (a SUBSCRIBE, an OPTIONS
//! keepalive) could not be handed to a client transaction: the subscriber
//! retries with it ([`RetryCause::NotSent`](super::subscriber::RetryCause::NotSent)),
//! the log names it.

use std::net::SocketAddr;

use msr_shared::sip::transaction::SendError;

/// Why a request was not sent (module docs).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotSent {
    /// The Request-URI (the peer's `Contact`) names no IP address and port:
    /// the collector resolves no names for its requests.
    #[error("target {target} is not an ip address and port")]
    NotAnAddress {
        /// The Request-URI.
        target: String,
    },
    /// A `sips:` contact goes over TLS or not at all (RFC 3261 §26.2.2),
    /// and no TLS connection from it is open.
    #[error("no tls connection from {to} to send over (it registers a sips: contact)")]
    NoTlsConnection {
        /// The contact's address.
        to: SocketAddr,
    },
    /// A `transport=tcp` contact goes over TCP (RFC 3261 §19.1.1), and no
    /// TCP connection from it is open.
    #[error("no tcp connection from {to} to send over (it registers a transport=tcp contact)")]
    NoTcpConnection {
        /// The contact's address.
        to: SocketAddr,
    },
    /// The transaction layer refused the request.
    #[error(transparent)]
    Transaction(#[from] SendError),
}
