//! msr-agent: the daemon on every media-server (MSR) host (SPEC §1–§4).
//!
//! It reads the MSR's XML config ([`config`]), samples the host's load
//! ([`load`]), registers each `<dynamic>` account with its core host
//! ([`registration`], RFC 3261 §10) and is the notifier of the
//! `eltex-call-count` event package ([`notifier`], RFC 6665).
//!
//! Codemap:
//!
//! * [`cli`] — the command line (`main.rs` parses it; `msr-dist` makes the
//!   man page and completions from it);
//! * [`config`] — XML → validated [`config::AgentConfig`], hot reload;
//! * [`load`] — CPU and media-session sampling, the `load` figure; the
//!   sans-IO ng client of the `rtpengine` calls source
//!   ([`load::rtpengine`]);
//! * [`log_file`] — the config's log file: opened by the daemon, checked
//!   (without creating it) by `--check-config`;
//! * [`registration`] — sans-IO REGISTER client, one per account;
//! * [`notifier`] — sans-IO RFC 6665 notifier;
//! * [`engine_probe`] — sans-IO liveness probe of the media engine (SPEC
//!   §14): SIP OPTIONS, or the ng exchange of the `rtpengine` source;
//! * [`drain`] — sans-IO MSR-side drain (SPEC §14): `service: draining`,
//!   and when the engine has been empty long enough;
//! * [`core`] — [`core::Agent`]: the cores above and their glue in one
//!   sans-IO state machine (which core a response goes to, the 481 rule,
//!   the engine's state told to every subscription, the drain, the
//!   shutdown's phases, the reload);
//! * `shell` — the one async loop owning the SIP endpoint, the sockets,
//!   the timers, the files and the tasks, driving [`core::Agent`];
//! * [`run`] / [`start`] — the entry points used by `main.rs` and tests.
//!
//! Architecture Invariant: [`core`], [`registration`], [`notifier`],
//! [`engine_probe`], [`drain`] and [`load::rtpengine::NgClient`] read no clock and own no socket; they get
//! `now` from the shell, which reads it once per step.

pub mod cli;
pub mod config;
pub mod control;
pub mod core;
pub mod drain;
pub mod engine_probe;
pub mod load;
pub mod log_file;

mod error;
pub mod notifier;
pub mod registration;
mod shell;
#[cfg(test)]
mod test_log;

use std::net::SocketAddr;
use std::path::PathBuf;

use msr_shared::sip::SipEndpoint;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use crate::config::AgentConfig;
pub use crate::core::SHUTDOWN_GRACE;
pub use crate::error::AgentError;
pub use crate::shell::interface_name;

/// A running agent (see [`start`]).
#[derive(Debug)]
pub struct AgentHandle {
    /// The agent's bound SIP (UDP) address (`<agent sip-port>`); with port
    /// 0 this is where the ephemeral port shows.
    pub local_addr: SocketAddr,
    /// The agent task; it ends after `shutdown` is cancelled, the final
    /// NOTIFYs are answered and then the unregisters are answered (at most
    /// [`notifier::FINAL_NOTIFY_GRACE`] + [`SHUTDOWN_GRACE`] later).
    pub join: JoinHandle<Result<(), AgentError>>,
}

/// Binds the SIP endpoint and spawns the agent task; returns once the
/// endpoint listens. `config_path`, when given, is watched for hot reload
/// (SPEC §2). Cancel `shutdown` to stop.
///
/// # Errors
/// [`AgentError::Endpoint`] when the socket cannot be bound,
/// [`AgentError::Tls`] when an `<agent tls-…>` file cannot be used.
pub async fn start(
    config: AgentConfig,
    config_path: Option<PathBuf>,
    shutdown: CancellationToken,
) -> Result<AgentHandle, AgentError> {
    start_with(config, config_path, None, shutdown).await
}

/// [`start`] with the control socket at `control_socket` (SPEC §14's
/// MSR-side drain, [`control`]); `None`: no control socket.
///
/// # Errors
/// Those of [`start`].
pub async fn start_with(
    config: AgentConfig,
    config_path: Option<PathBuf>,
    control_socket: Option<PathBuf>,
    shutdown: CancellationToken,
) -> Result<AgentHandle, AgentError> {
    // Our own port beside the engine's (SPEC §1): never `<transport port>`.
    let bind = SocketAddr::new(config.transport.bind_addr, config.agent.sip_port);
    let endpoint = SipEndpoint::bind(
        bind,
        config.transport.transport.tcp(),
        &registration::user_agent(),
        notifier::ALLOW,
        // Not a child of `shutdown`: the final NOTIFYs and unregisters go
        // out after it is cancelled; the shell stops the endpoint itself.
        CancellationToken::new(),
    )
    .await?;
    for warning in &config.warnings {
        warn!("{warning}");
    }
    if let Some(tls) = &config.agent.tls {
        endpoint.set_tls_client(&tls.read()?);
        for warning in tls.warnings(config.tls_msrs(), std::time::SystemTime::now()) {
            warn!("{warning}");
        }
    }
    let local_addr = endpoint.local_addr();
    info!(addr = %local_addr, "listening on udp {local_addr}");
    if config.transport.transport.tcp() {
        info!(addr = %local_addr, "listening on tcp {local_addr}");
    }
    let shell = shell::Shell::new(endpoint, config).await;
    let join = tokio::spawn(shell.run(config_path, control_socket, shutdown));
    Ok(AgentHandle { local_addr, join })
}

/// Runs the agent until `shutdown` is cancelled (see [`start`]).
///
/// # Errors
/// Those of [`start`], [`AgentError::EndpointClosed`] when the endpoint stops
/// on its own, [`AgentError::Task`] when the agent task panics.
pub async fn run(
    config: AgentConfig,
    config_path: Option<PathBuf>,
    control_socket: Option<PathBuf>,
    shutdown: CancellationToken,
) -> Result<(), AgentError> {
    let handle = start_with(config, config_path, control_socket, shutdown).await?;
    handle.join.await?
}
