//! The daemons' signal handling: SIGTERM and SIGINT stop them gracefully;
//! SIGHUP, which would otherwise kill them without their shutdown sequence
//! (no final NOTIFYs, no `Expires: 0`), is logged and ignored — the agent
//! reloads its config when the file changes, the collector needs a restart.

use tracing::{info, warn};

/// Waits for SIGTERM or SIGINT and returns its name. SIGHUP is ignored with
/// an info line naming `on_hup` (what the daemon does instead).
///
/// # Errors
/// When the signal handlers cannot be installed.
pub async fn shutdown_signal(on_hup: &str) -> std::io::Result<&'static str> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    loop {
        tokio::select! {
            _ = term.recv() => return Ok("SIGTERM"),
            _ = int.recv() => return Ok("SIGINT"),
            got = hup.recv() => {
                if got.is_none() {
                    warn!("sighup handler closed");
                    std::future::pending::<()>().await;
                }
                info!("SIGHUP ignored: {on_hup}");
            }
        }
    }
}
