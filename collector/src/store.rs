//! The embedded store of the operator configuration (SPEC §6): one JSON file.
//!
//! A save writes `<file>.tmp` in the same directory, fsyncs it, renames it
//! over the file and fsyncs the directory, so after a crash the file holds
//! either the previous or the new configuration, never a mix: a change that
//! was acknowledged (saved before the reply) survives. A leftover temp file
//! from a crash is ignored when loading and overwritten by the next save.
//!
//! Architecture invariant: the file format is private to the collector
//! ([`crate::operator`]); nothing else reads it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::operator::{DecodeError, OperatorConfig};

/// Why the store could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The file exists but could not be read.
    #[error("cannot read operator store {path}: {source}")]
    Read {
        /// The store file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The file is not a valid operator configuration.
    #[error("operator store {path} is corrupt: {source}")]
    Corrupt {
        /// The store file.
        path: PathBuf,
        /// What is wrong with it.
        source: DecodeError,
    },
    /// The new configuration could not be written durably; the previous one
    /// is still in place.
    #[error("cannot write operator store {path}: {source}")]
    Write {
        /// The file being written (the temp file or the directory).
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
}

/// The operator configuration store: one JSON file.
#[derive(Debug, Clone)]
pub struct Store {
    /// The store file.
    path: PathBuf,
}

impl Store {
    /// A store kept in `path` (the directory must exist).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// The store file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The temp file a save writes before renaming it over the store file.
    pub fn temp_path(&self) -> PathBuf {
        let mut name = self
            .path
            .file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_default();
        name.push(".tmp");
        self.path.with_file_name(name)
    }

    /// Loads the configuration; a missing file is an empty configuration.
    ///
    /// # Errors
    /// [`StoreError::Read`], [`StoreError::Corrupt`] (both name the file).
    pub fn load(&self) -> Result<OperatorConfig, StoreError> {
        let text = match fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(OperatorConfig::new()),
            Err(source) => {
                return Err(StoreError::Read {
                    path: self.path.clone(),
                    source,
                })
            }
        };
        OperatorConfig::decode(&text).map_err(|source| StoreError::Corrupt {
            path: self.path.clone(),
            source,
        })
    }

    /// Saves the configuration atomically and durably: temp file, fsync,
    /// rename, fsync of the directory. Blocking; takes a few milliseconds.
    ///
    /// # Errors
    /// [`StoreError::Write`]; the previous file is then left unchanged.
    pub fn save(&self, config: &OperatorConfig) -> Result<(), StoreError> {
        let temp = self.temp_path();
        let write_err = |path: &Path| {
            let path = path.to_owned();
            move |source| StoreError::Write { path, source }
        };
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o640)
            .open(&temp)
            .map_err(write_err(&temp))?;
        file.write_all(config.encode().as_bytes())
            .map_err(write_err(&temp))?;
        file.write_all(b"\n").map_err(write_err(&temp))?;
        file.sync_all().map_err(write_err(&temp))?;
        drop(file);
        fs::rename(&temp, &self.path).map_err(write_err(&self.path))?;
        let dir = match self.path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
            _ => PathBuf::from("."),
        };
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(write_err(&dir))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> OperatorConfig {
        let mut config = OperatorConfig::new();
        config.declare_site("local").expect("declare");
        config.declare_site("remote").expect("declare");
        config
            .set_distance("local", "remote", 64.0)
            .expect("distance");
        config
            .set_performance_coefficient("msr_1", 2.0)
            .expect("coefficient");
        config
    }

    #[test]
    fn missing_file_is_empty_config() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::new(dir.path().join("operator.json"));
        assert_eq!(store.load().expect("load"), OperatorConfig::new());
    }

    #[test]
    fn save_then_load_is_identical() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::new(dir.path().join("operator.json"));
        let config = sample();
        store.save(&config).expect("save");
        assert_eq!(store.load().expect("load"), config);
        assert!(!store.temp_path().exists());
    }

    #[test]
    fn torn_temp_file_leaves_previous_state() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::new(dir.path().join("operator.json"));
        let config = sample();
        store.save(&config).expect("save");
        // A crash before the rename leaves half a temp file behind.
        let full = config.encode();
        fs::write(store.temp_path(), &full[..full.len() / 2]).expect("write torn");
        assert_eq!(store.load().expect("load"), config);
        // The next save overwrites the leftover.
        let mut next = config.clone();
        next.set_active("msr_2", false).expect("set");
        store.save(&next).expect("save");
        assert_eq!(store.load().expect("load"), next);
    }

    #[test]
    fn corrupt_file_names_the_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("operator.json");
        fs::write(&path, "{ not json").expect("write");
        let err = Store::new(&path).load().expect_err("corrupt");
        assert!(matches!(err, StoreError::Corrupt { .. }));
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn failed_save_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::new(dir.path().join("missing-dir").join("operator.json"));
        assert!(matches!(
            store.save(&sample()),
            Err(StoreError::Write { .. })
        ));
    }
}
