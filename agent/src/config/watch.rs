//! Hot reload of the MSR config (SPEC §2: a config that turns bad while the
//! agent runs is reported and the agent keeps running on the last good one).
//!
//! The watcher observes the file's *parent directory* and filters on the file
//! name, so editors that write a new file and rename it over the old one are
//! followed (a watch on the file itself would die with the old inode).
//! Events are debounced for [`DEBOUNCE`]; after a quiet period the file is
//! re-read with [`load`] and the result is sent on the channel. What to do
//! with an `Err` is the receiver's business (the daemon logs it and keeps the
//! last good config).
//!
//! A dedicated thread does the debouncing, so [`watch()`] needs no tokio
//! runtime. Dropping the [`WatchGuard`] stops the watcher and the thread;
//! so does dropping the receiver (at the next change).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use notify::event::{AccessKind, AccessMode};
use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::{load, AgentConfig, ConfigError};

/// Quiet period after the last file event before the file is re-read.
pub const DEBOUNCE: Duration = Duration::from_millis(200);

/// Capacity of the result channel; a slow receiver delays re-reads, it
/// never loses the latest one.
const CHANNEL_CAPACITY: usize = 8;

/// Keeps the watch alive; drop it to stop watching.
#[derive(Debug)]
pub struct WatchGuard {
    _watcher: Option<RecommendedWatcher>,
}

/// Watches `path` for changes and sends the re-parsed config after each
/// (debounced) change.
///
/// If the watcher cannot be set up (e.g. the inotify limit is reached or the
/// directory does not exist), the receiver yields one
/// `Err(ConfigError::Watch { .. })` and then closes; the daemon keeps its
/// current config.
pub fn watch(path: PathBuf) -> (mpsc::Receiver<Result<AgentConfig, ConfigError>>, WatchGuard) {
    let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
    match start(&path, tx.clone()) {
        Ok(watcher) => (
            rx,
            WatchGuard {
                _watcher: Some(watcher),
            },
        ),
        Err(reason) => {
            tracing::warn!(path = %path.display(), %reason, "cannot watch config");
            // The channel is fresh, so there is room for one message.
            let _ = tx.try_send(Err(ConfigError::Watch { path, reason }));
            (rx, WatchGuard { _watcher: None })
        }
    }
}

fn start(
    path: &Path,
    tx: mpsc::Sender<Result<AgentConfig, ConfigError>>,
) -> Result<RecommendedWatcher, String> {
    let file_name: OsString = path
        .file_name()
        .ok_or_else(|| "path has no file name".to_owned())?
        .to_owned();
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };

    let (raw_tx, raw_rx) = std_mpsc::channel::<()>();
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<Event>| match res {
        Ok(event) => {
            if is_relevant(&event, &file_name) {
                // The thread is gone only when the guard is being dropped.
                let _ = raw_tx.send(());
            }
        }
        Err(e) => tracing::warn!(error = %e, "config watcher error"),
    })
    .map_err(|e| e.to_string())?;
    watcher
        .watch(&dir, RecursiveMode::NonRecursive)
        .map_err(|e| format!("{}: {e}", dir.display()))?;

    let path = path.to_path_buf();
    std::thread::Builder::new()
        .name("config-watch".to_owned())
        .spawn(move || debounce_loop(&path, &raw_rx, &tx))
        .map_err(|e| e.to_string())?;
    Ok(watcher)
}

/// Waits for an event, then for [`DEBOUNCE`] of quiet, then re-reads.
/// Ends when the watcher (sender side) or the receiver is dropped.
fn debounce_loop(
    path: &Path,
    raw_rx: &std_mpsc::Receiver<()>,
    tx: &mpsc::Sender<Result<AgentConfig, ConfigError>>,
) {
    while raw_rx.recv().is_ok() {
        loop {
            match raw_rx.recv_timeout(DEBOUNCE) {
                Ok(()) => continue,
                Err(std_mpsc::RecvTimeoutError::Timeout) => break,
                Err(std_mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
        let result = load(path);
        match &result {
            Ok(_) => tracing::debug!(path = %path.display(), "config changed, reloaded"),
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "config changed, invalid")
            }
        }
        if tx.blocking_send(result).is_err() {
            return;
        }
    }
}

/// Whether `event` may have changed the file named `file_name`. Read accesses
/// (including our own re-read) are ignored, or every reload would trigger the
/// next one.
fn is_relevant(event: &Event, file_name: &OsString) -> bool {
    let kind_ok = match event.kind {
        EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_) | EventKind::Any => true,
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) | EventKind::Other => false,
    };
    kind_ok
        && event
            .paths
            .iter()
            .any(|p| p.file_name().is_some_and(|n| n == file_name.as_os_str()))
}
