//! The agent's error type (thiserror, lowercase messages).

use msr_shared::sip::EndpointError;

use crate::config::ConfigError;

/// Why the agent could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// The config could not be loaded (see [`ConfigError`]).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The SIP endpoint could not be set up (SPEC §2 `<transport>`).
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// An `<agent tls-…>` file cannot be used.
    #[error("<agent tls-…> {0}")]
    Tls(#[from] msr_shared::sip::TlsFileError),
    /// The SIP endpoint stopped while the agent was running.
    #[error("sip endpoint on {addr} stopped unexpectedly")]
    EndpointClosed {
        /// The endpoint's bound address.
        addr: std::net::SocketAddr,
    },
    /// The agent task panicked or was aborted.
    #[error("agent task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}
