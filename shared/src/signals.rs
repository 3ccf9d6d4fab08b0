//! The daemons' signal handling: SIGTERM and SIGINT stop them gracefully;
//! SIGHUP, which would otherwise kill them without their shutdown sequence
//! (no final NOTIFYs, no `Expires: 0`), never stops them: the daemon says
//! what it does instead (the agent reopens its own log file; the collector
//! re-reads its TOML, SPEC §13).

use tracing::{info, warn};

/// Waits for SIGTERM or SIGINT and returns its name. Each SIGHUP calls
/// `on_hup` and logs what it returns: what the daemon did at info (nothing
/// when it is empty: `on_hup` said it already), why it could not (a broken
/// file: the operator must look) at warn.
///
/// # Errors
/// When the signal handlers cannot be installed.
pub async fn shutdown_signal(
    mut on_hup: impl FnMut() -> Result<String, String>,
) -> std::io::Result<&'static str> {
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
                match on_hup() {
                    Ok(done) if done.is_empty() => {}
                    Ok(done) => info!("SIGHUP: {done}"),
                    // A reload that failed: at error, as the agent logs its own.
                    Err(failed) => tracing::error!("SIGHUP: {failed}"),
                }
            }
        }
    }
}
