//! The agent's own log file (SPEC §2: `<agent log-file>` or `--log-file`;
//! never the engine's `<general log-path log-name>`): opening it for the
//! daemon behind a writer that SIGHUP reopens after logrotate moved it
//! ([`LogFile::open_reopening`]), and checking it for `--check-config`
//! without creating it ([`LogFile::check`]). Both report the same
//! [`LogFileError`].
//!
//! Creating a file needs write and search permission on its directory;
//! [`LogFile::check`] asks the kernel for exactly that (`faccessat(2)` with
//! the effective ids) instead of creating anything.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use msr_shared::fs::cannot_create_in;

use crate::config::AgentSettings;

#[cfg(test)]
mod tests;

/// The log file cannot be opened for append (for [`LogFile::check`]: could
/// not be).
#[derive(Debug, thiserror::Error)]
#[error("{}: cannot open log file: {source}", path.display())]
pub struct LogFileError {
    /// The log file.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub source: io::Error,
}

/// The agent's own log file (`<agent log-file>` or `--log-file`). The media
/// engine's `<general log-path log-name>` is the engine's, never this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogFile {
    path: PathBuf,
}

impl LogFile {
    /// The log file at `path`.
    pub fn new(path: impl Into<PathBuf>) -> LogFile {
        LogFile { path: path.into() }
    }

    /// The log file `settings` name, if any (otherwise the agent logs to
    /// stderr).
    pub fn from_config(settings: &AgentSettings) -> Option<LogFile> {
        settings.log_file.clone().map(LogFile::new)
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the file for append, creating it when missing. The daemon does
    /// this before it logs there, so that a bad path stops the start with a
    /// clear error instead of losing every log line.
    ///
    /// # Errors
    /// [`LogFileError`] with the OS error.
    pub fn open(&self) -> Result<File, LogFileError> {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(|source| LogFileError {
                path: self.path.clone(),
                source,
            })
    }

    /// Opens the file ([`open`](Self::open)) behind a writer that can
    /// reopen it: after logrotate has moved the file away, SIGHUP makes the
    /// daemon call [`ReopeningFile::reopen`] and the next lines go to a new
    /// file at the same path.
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn open_reopening(&self) -> Result<ReopeningFile, LogFileError> {
        let file = self.open()?;
        Ok(ReopeningFile {
            log: self.clone(),
            file: Arc::new(Mutex::new(file)),
        })
    }

    /// Checks that [`open`](Self::open) would succeed, without creating the
    /// file: an existing file is opened for append (without creating) and
    /// closed; for a missing one its directory must exist and be writable
    /// by this process (module docs).
    ///
    /// # Errors
    /// [`LogFileError`]: the OS error of the open or of reading the
    /// directory, or why the directory will not take a new file.
    pub fn check(&self) -> Result<(), LogFileError> {
        let path = self.path.clone();
        let fail = |source: io::Error| LogFileError {
            path: path.clone(),
            source,
        };
        match OpenOptions::new().append(true).open(&path) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(fail(e)),
        }
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let meta = std::fs::metadata(&dir).map_err(fail)?;
        if !meta.is_dir() {
            return Err(fail(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{} is not a directory", dir.display()),
            )));
        }
        if let Some(error) = cannot_create_in(&dir) {
            return Err(fail(io::Error::new(
                error.kind(),
                format!("directory {}: {error}", dir.display()),
            )));
        }
        Ok(())
    }
}

/// A log file writer whose file can be reopened at the same path
/// ([`LogFile::open_reopening`]); clones share the file.
#[derive(Debug, Clone)]
pub struct ReopeningFile {
    log: LogFile,
    file: Arc<Mutex<File>>,
}

impl ReopeningFile {
    /// Opens the path anew (creating the file) and writes there from now on;
    /// on error the old file stays in use.
    ///
    /// # Errors
    /// [`LogFileError`] when the path cannot be opened.
    pub fn reopen(&self) -> Result<(), LogFileError> {
        let fresh = self.log.open()?;
        *self.file.lock().unwrap_or_else(PoisonError::into_inner) = fresh;
        Ok(())
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        self.log.path()
    }
}

impl io::Write for ReopeningFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .flush()
    }
}
