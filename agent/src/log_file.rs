//! The agent's log file (SPEC §2 `<general log-path log-name>`): where it
//! is, opening it for the daemon ([`LogFile::open`]) and checking it for
//! `--check-config` without creating it ([`LogFile::check`]). Both report
//! the same [`LogFileError`].
//!
//! Creating a file needs write and search permission on its directory;
//! [`LogFile::check`] asks the kernel for exactly that (`faccessat(2)` with
//! the effective ids) instead of creating anything.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::PathBuf;

use msr_shared::fs::cannot_create_in;

use crate::config::General;

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

/// The log file the config names: `<log-path>/<log-name>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogFile {
    /// `log-path`: the directory.
    pub dir: PathBuf,
    /// `log-name`: the file name. With `log-rotate` the appender writes to
    /// this name with a date suffix.
    pub name: String,
}

impl LogFile {
    /// The log file of `general`, when both `log-path` and `log-name` are
    /// set (otherwise the agent logs to stderr).
    pub fn from_config(general: &General) -> Option<LogFile> {
        match (&general.log_path, &general.log_name) {
            (Some(dir), Some(name)) => Some(LogFile {
                dir: dir.clone(),
                name: name.clone(),
            }),
            _ => None,
        }
    }

    /// `dir/name`.
    pub fn path(&self) -> PathBuf {
        self.dir.join(&self.name)
    }

    /// Opens the file for append, creating it when missing. The daemon does
    /// this before it logs there, so that a bad path stops the start with a
    /// clear error instead of losing every log line.
    ///
    /// # Errors
    /// [`LogFileError`] with the OS error.
    pub fn open(&self) -> Result<File, LogFileError> {
        let path = self.path();
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|source| LogFileError { path, source })
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
        let path = self.path();
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
