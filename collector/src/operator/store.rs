//! The embedded store of the operator configuration (SPEC §6): one JSON file.
//!
//! A save writes `<file>.tmp` in the same directory, fsyncs it, renames it
//! over the file and fsyncs the directory, so after a crash the file holds
//! either the previous or the new configuration, never a mix: a change that
//! was acknowledged (saved before the reply) survives. A leftover temp file
//! from a crash is ignored when loading and overwritten by the next save.
//!
//! One collector per store: a running collector holds an exclusive advisory
//! lock ([`Store::lock`], `flock(2)` through [`File::try_lock`]) on the lock
//! file beside the store, `<file>.lock`, for as long as it runs, and a second
//! collector on the same store refuses to start. Two collectors saving the
//! same file would each overwrite the other's acknowledged changes. The lock
//! file is created when missing and never deleted: deleting it would let a
//! collector lock a new file while another still holds the old one. The
//! kernel releases the lock when the holder exits, however it exits.
//!
//! With `[store] backend = "etcd"` (SPEC §12) the configuration lives in
//! etcd ([`etcd`]) and this file is its local cached copy, written by the
//! etcd task and read at start when etcd is unreachable.
//!
//! Architecture invariant: the file format is private to the collector
//! ([`crate::operator`]); nothing else reads it (the etcd backend stores
//! the same text under its configuration key).

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use msr_shared::fs::cannot_create_in;

use crate::operator::{DecodeError, OperatorConfig};

pub mod etcd;
pub mod migrate;

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
    /// Another collector holds the store's lock: it runs on the same store.
    #[error(
        "operator store {path} is in use: another collector holds the lock on {lock} \
         (stop that collector, or give this one another [state] path)"
    )]
    Locked {
        /// The store file.
        path: PathBuf,
        /// The lock file.
        lock: PathBuf,
    },
    /// The lock file could not be opened, created or locked.
    #[error("cannot lock operator store {path} with {lock}: {source}")]
    LockFile {
        /// The store file.
        path: PathBuf,
        /// The lock file.
        lock: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The saved bindings (beside the store) could not be read or written.
    #[error("saved bindings {path}: {source}")]
    Bindings {
        /// The bindings file (or its temp file).
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The store's directory is missing, or this process cannot create
    /// files in it (a save writes a temp file there).
    #[error("operator store {path}: directory {dir}: {source}")]
    Directory {
        /// The store file.
        path: PathBuf,
        /// Its directory.
        dir: PathBuf,
        /// Why the directory cannot be used.
        source: io::Error,
    },
}

/// The exclusive lock of a [`Store`], held until dropped: closing the lock
/// file releases it (see the module docs).
#[derive(Debug)]
#[must_use = "the lock is released when this is dropped"]
pub struct StoreLock {
    /// The lock file, locked; only held, never read.
    _file: File,
    /// Its path.
    path: PathBuf,
}

impl StoreLock {
    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
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
        self.sibling(".tmp")
    }

    /// The lock file beside the store file: `<file>.lock`.
    pub fn lock_path(&self) -> PathBuf {
        self.sibling(".lock")
    }

    /// The registrar's saved bindings beside the store file:
    /// `<file>.bindings` (runtime state, not operator configuration: kept
    /// apart so that neither overwrites the other).
    pub fn bindings_path(&self) -> PathBuf {
        self.sibling(".bindings")
    }

    /// The saved bindings' text; `None` when there is no file.
    ///
    /// # Errors
    /// [`StoreError::Bindings`] when the file exists but cannot be read.
    pub fn load_bindings(&self) -> Result<Option<String>, StoreError> {
        let path = self.bindings_path();
        match read_regular(&path) {
            Ok(text) => Ok(Some(text)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(StoreError::Bindings { path, source }),
        }
    }

    /// Replaces the saved bindings atomically (temp file, rename), without
    /// fsync: they must survive the collector's crash (the page cache
    /// does), not the host's; after a power loss a torn file is reported
    /// and the MSRs register again. Cheap enough for the loop (a few
    /// hundred kilobytes for 1,000 MSRs, at most once a second).
    ///
    /// # Errors
    /// [`StoreError::Bindings`]; the previous file is then left unchanged.
    pub fn save_bindings(&self, text: &str) -> Result<(), StoreError> {
        let path = self.bindings_path();
        let mut temp = path.clone().into_os_string();
        temp.push(".tmp");
        let temp = PathBuf::from(temp);
        // SPEC §3: on disk before its 200, whatever crashes afterwards.
        write_replacing(&temp, &path, text.as_bytes())
            .map_err(|(path, source)| StoreError::Bindings { path, source })
    }

    /// The directory of the store file.
    pub fn dir(&self) -> PathBuf {
        match self.path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
            _ => PathBuf::from("."),
        }
    }

    fn sibling(&self, suffix: &str) -> PathBuf {
        let mut name = self
            .path
            .file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_default();
        name.push(suffix);
        self.path.with_file_name(name)
    }

    /// Takes the store's exclusive lock, creating the lock file if it is
    /// missing, and holds it until the returned [`StoreLock`] is dropped.
    /// Does not wait: a lock held elsewhere is an error at once.
    ///
    /// # Errors
    /// [`StoreError::Locked`] when another collector (another open of the
    /// lock file, in this process or another) holds it;
    /// [`StoreError::LockFile`] when the lock file cannot be opened or locked.
    pub fn lock(&self) -> Result<StoreLock, StoreError> {
        let lock = self.lock_path();
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o640)
            .open(&lock)
            .map_err(|source| StoreError::LockFile {
                path: self.path.clone(),
                lock: lock.clone(),
                source,
            })?;
        self.try_lock(&file, &lock)?;
        Ok(StoreLock {
            _file: file,
            path: lock,
        })
    }

    /// Checks that [`lock`](Self::lock) would succeed now, without creating
    /// the lock file: an existing one is locked and released at once; a
    /// missing one is held by nobody.
    ///
    /// # Errors
    /// As [`lock`](Self::lock).
    pub fn check_unlocked(&self) -> Result<(), StoreError> {
        let lock = self.lock_path();
        let file = match OpenOptions::new().write(true).open(&lock) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(source) => {
                return Err(StoreError::LockFile {
                    path: self.path.clone(),
                    lock,
                    source,
                })
            }
        };
        // Dropping `file` closes it, which releases the lock.
        self.try_lock(&file, &lock)
    }

    fn try_lock(&self, file: &File, lock: &Path) -> Result<(), StoreError> {
        match file.try_lock() {
            Ok(()) => Ok(()),
            Err(TryLockError::WouldBlock) => Err(StoreError::Locked {
                path: self.path.clone(),
                lock: lock.to_owned(),
            }),
            Err(TryLockError::Error(source)) => Err(StoreError::LockFile {
                path: self.path.clone(),
                lock: lock.to_owned(),
                source,
            }),
        }
    }

    /// Checks that a save could create its temp file: the store's directory
    /// exists, is a directory, and this process may create files in it
    /// (`faccessat(2)` for write and search permission with the effective
    /// ids, so the kernel judges owner, group, ACLs, capabilities and
    /// read-only mounts as it will for the save). Creates nothing.
    ///
    /// # Errors
    /// [`StoreError::Directory`] with the reason.
    pub fn check_dir(&self) -> Result<(), StoreError> {
        let dir = self.dir();
        let fail = |source: io::Error| StoreError::Directory {
            path: self.path.clone(),
            dir: dir.clone(),
            source,
        };
        let meta = fs::metadata(&dir).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                fail(io::Error::new(io::ErrorKind::NotFound, "does not exist"))
            } else {
                fail(e)
            }
        })?;
        if !meta.is_dir() {
            return Err(fail(io::Error::new(
                io::ErrorKind::NotADirectory,
                "not a directory",
            )));
        }
        match cannot_create_in(&dir) {
            Some(e) => Err(fail(e)),
            None => Ok(()),
        }
    }

    /// Loads the configuration; a missing file is an empty configuration.
    ///
    /// # Errors
    /// [`StoreError::Read`], [`StoreError::Corrupt`] (both name the file).
    pub fn load(&self) -> Result<OperatorConfig, StoreError> {
        let text = match read_regular(&self.path) {
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
        let mut text = config.encode();
        text.push('\n');
        write_replacing(&self.temp_path(), &self.path, text.as_bytes())
            .map_err(|(path, source)| StoreError::Write { path, source })
    }
}

/// The largest store or bindings file read: far above what 256 sites or
/// thousands of bindings take, so a hostile file (a symlink to
/// `/dev/zero`) cannot exhaust memory.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// Reads a store file that must be a regular file of at most
/// [`MAX_FILE_BYTES`]: a FIFO would block the loop for good, a device
/// would never end.
fn read_regular(path: &Path) -> io::Result<String> {
    use std::io::Read;
    let meta = fs::metadata(path)?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} bytes, more than the {MAX_FILE_BYTES} read", meta.len()),
        ));
    }
    let mut text = String::new();
    File::open(path)?
        .take(MAX_FILE_BYTES)
        .read_to_string(&mut text)?;
    Ok(text)
}

/// Writes `bytes` to `temp` (mode 0640), fsyncs it, renames it over `path`
/// and fsyncs the directory, so a reader finds the old or the new content,
/// never a mix, and the new one survives a crash of the host; the error
/// names the file it is about.
fn write_replacing(temp: &Path, path: &Path, bytes: &[u8]) -> Result<(), (PathBuf, io::Error)> {
    let at = |p: &Path| {
        let p = p.to_owned();
        move |e| (p, e)
    };
    // A fresh file: whatever is at the temp path (a leftover of a crash, or
    // a symlink planted there) is removed, never written through.
    match fs::remove_file(temp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err((temp.to_owned(), e)),
        _ => {}
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o640)
        .open(temp)
        .map_err(at(temp))?;
    file.write_all(bytes).map_err(at(temp))?;
    file.sync_all().map_err(at(temp))?;
    drop(file);
    fs::rename(temp, path).map_err(at(path))?;
    let dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
        _ => PathBuf::from("."),
    };
    File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(at(&dir))?;
    Ok(())
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

    /// A FIFO at the bindings path would block the loop for good, a link
    /// to a device would be read without end: both are refused at once.
    #[test]
    fn only_a_regular_file_of_bounded_size_is_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::new(dir.path().join("state.json"));
        let fifo = store.bindings_path();
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(made.success());
        let err = store.load_bindings().expect_err("a fifo");
        assert!(err.to_string().contains("not a regular file"), "{err}");
        std::fs::remove_file(&fifo).expect("rm");
        std::os::unix::fs::symlink("/dev/zero", store.path()).expect("symlink");
        let err = store.load().expect_err("a device");
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }

    /// A symlink planted at the temp path is replaced, not written through.
    #[test]
    fn a_symlink_at_the_temp_path_is_not_followed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::new(dir.path().join("state.json"));
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep").expect("write");
        let mut temp = store.bindings_path().into_os_string();
        temp.push(".tmp");
        std::os::unix::fs::symlink(&victim, &temp).expect("symlink");
        store.save_bindings("{}").expect("save");
        assert_eq!(std::fs::read_to_string(&victim).expect("read"), "keep");
        assert_eq!(store.load_bindings().expect("load").as_deref(), Some("{}"));
        std::os::unix::fs::symlink(&victim, store.temp_path()).expect("symlink");
        store.save(&sample()).expect("save");
        assert_eq!(std::fs::read_to_string(&victim).expect("read"), "keep");
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

    #[test]
    fn a_second_lock_on_the_same_store_is_refused_naming_the_lock_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("operator.json");
        let first = Store::new(&path).lock().expect("first lock");
        let lock = dir.path().join("operator.json.lock");
        assert_eq!(first.path(), lock);
        assert!(lock.exists(), "the lock file is created");
        // Another open of the lock file (as another collector would make).
        let err = Store::new(&path).lock().expect_err("second lock");
        let StoreError::Locked { path: p, lock: l } = &err else {
            panic!("{err:?}")
        };
        assert_eq!((p, l), (&path, &lock));
        let text = err.to_string();
        assert!(
            text.contains(&lock.display().to_string()) && text.contains("another collector holds"),
            "{text}"
        );
        assert!(matches!(
            Store::new(&path).check_unlocked(),
            Err(StoreError::Locked { .. })
        ));
        // Released when dropped; the lock file stays.
        drop(first);
        assert!(lock.exists(), "the lock file is never deleted");
        Store::new(&path).check_unlocked().expect("free again");
        let _again = Store::new(&path).lock().expect("lock again");
    }

    #[test]
    fn checking_the_lock_creates_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::new(dir.path().join("operator.json"));
        store.check_unlocked().expect("no lock file: free");
        assert!(!store.lock_path().exists());
        let held = store.lock().expect("lock");
        assert!(matches!(
            store.check_unlocked(),
            Err(StoreError::Locked { .. })
        ));
        drop(held);
        store.check_unlocked().expect("released");
    }

    #[test]
    fn lock_in_a_missing_directory_is_an_error_naming_the_lock_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::new(dir.path().join("missing-dir").join("operator.json"));
        let err = store.lock().expect_err("no directory");
        assert!(matches!(err, StoreError::LockFile { .. }), "{err:?}");
        assert!(
            err.to_string()
                .contains(&store.lock_path().display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn check_dir_refuses_a_missing_directory_and_a_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        Store::new(dir.path().join("operator.json"))
            .check_dir()
            .expect("tempdir is writable");
        let missing = dir.path().join("no-such-dir");
        let err = Store::new(missing.join("operator.json"))
            .check_dir()
            .expect_err("missing");
        assert!(matches!(err, StoreError::Directory { .. }), "{err:?}");
        assert!(
            err.to_string()
                .contains(&format!("directory {}: does not exist", missing.display())),
            "{err}"
        );
        let file = dir.path().join("a-file");
        fs::write(&file, "").expect("write");
        let err = Store::new(file.join("operator.json"))
            .check_dir()
            .expect_err("a file is no directory");
        assert!(err.to_string().contains("not a directory"), "{err}");
    }

    #[test]
    fn check_dir_refuses_a_directory_this_process_cannot_write() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let ro = dir.path().join("read-only");
        fs::create_dir(&ro).expect("mkdir");
        fs::set_permissions(&ro, fs::Permissions::from_mode(0o555)).expect("chmod");
        let store = Store::new(ro.join("operator.json"));
        let result = store.check_dir();
        // Root (CAP_DAC_OVERRIDE) may write anyway: then the check must agree.
        let writable = fs::write(ro.join("probe"), "").is_ok();
        assert_eq!(result.is_ok(), writable, "{result:?}");
        if !writable {
            let err = result.expect_err("read-only");
            assert!(matches!(err, StoreError::Directory { .. }), "{err:?}");
            assert!(store.save(&sample()).is_err());
        }
        fs::set_permissions(&ro, fs::Permissions::from_mode(0o755)).expect("chmod back");
    }
}
