//! The collector daemon's error type.

use std::path::PathBuf;

use crate::config::ConfigError;
use crate::operator::store::StoreError;

/// Why the collector could not start or had to stop.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CollectorError {
    /// The configuration file is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The operator configuration store cannot be used: unreadable or
    /// corrupt, its directory missing or not writable, or locked by another
    /// collector running on it.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A SIP socket could not be bound.
    #[error("cannot bind sip {transport} socket on {addr}: {source}")]
    Sip {
        /// `udp` or `tcp`.
        transport: &'static str,
        /// The address.
        addr: std::net::SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The control socket could not be bound.
    #[error("cannot bind [control] socket {path}: {source}")]
    ControlSocket {
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The control socket path cannot be used (no such directory, a
    /// directory this process cannot create the socket in, too long, or
    /// something other than a socket already there).
    #[error("[control] socket {path}: {reason}")]
    ControlSocketPath {
        /// The socket path.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The `[http] listen` address could not be bound.
    #[error("cannot bind [http] listen {addr}: {source}")]
    Http {
        /// The address.
        addr: std::net::SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The `[redirect] listen` address could not be bound.
    #[error("cannot bind [redirect] listen {addr}: {source}")]
    Redirect {
        /// The address.
        addr: std::net::SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// A `[store.tls]` file cannot be opened.
    #[error("[store.tls] {path}: {source}")]
    TlsFile {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A `[sip.tls]` file cannot be read or used.
    #[error(transparent)]
    SipTls(#[from] crate::daemon::tls::TlsFileError),
    /// The collector task panicked or was aborted.
    #[error("collector task failed: {reason}")]
    Task {
        /// The join error.
        reason: String,
    },
}
