//! What the collector needs from the host before it starts, checked by
//! `--check-config` and again by [`super::start`].

use std::path::{Path, PathBuf};

use msr_shared::fs::cannot_create_in;

use crate::api::control as admin;
use crate::config::{CollectorConfig, StoreBackend};
use crate::error::CollectorError;
use crate::operator::store::Store;

/// The checks `--check-config` adds to the config file's own validation,
/// for what the collector needs from the host at start:
///
/// * the operator store's directory exists and this process may create
///   files in it ([`Store::check_dir`]);
/// * (not here: whether another collector holds the store's lock, which
///   `--check-config` reports as a note, [`Store::check_unlocked`], and
///   [`crate::daemon::start`] refuses);
/// * the store is readable and valid (a missing file is an empty store);
/// * the `[sip.tls]` certificate, key and client CA are PEM files that
///   make a TLS server configuration ([`super::tls::server_config`]);
/// * the control socket's directory exists and this process may create the
///   socket in it, its path fits a Unix socket address (107 bytes), and
///   nothing but a socket (one a previous run left, which the start
///   replaces) is at that path.
///
/// # Errors
/// The first of [`environment_problems`].
pub fn check_environment(config: &CollectorConfig) -> Result<(), CollectorError> {
    environment_problems(config)
        .into_iter()
        .next()
        .map_or(Ok(()), Err)
}

/// Every problem [`check_environment`] looks for, so that `--check-config`
/// names them all at once: [`CollectorError::Store`],
/// [`CollectorError::TlsFile`], [`CollectorError::SipTls`],
/// [`CollectorError::ControlSocketPath`].
pub fn environment_problems(config: &CollectorConfig) -> Vec<CollectorError> {
    let mut problems = Vec::new();
    let store = Store::new(config.state_path.clone());
    // A store whose directory is missing has nothing to load.
    if let Err(e) = store.check_dir().and_then(|()| store.load().map(drop)) {
        problems.push(e.into());
    }
    if let StoreBackend::Etcd(etcd) = &config.store {
        // etcd itself may be down while the host is fine (the collector
        // then starts from its cached copy); the TLS files must be there.
        if let Some(tls) = &etcd.tls {
            let files = std::iter::once(&tls.ca)
                .chain(tls.identity.iter().flat_map(|(cert, key)| [cert, key]));
            for path in files {
                if let Err(source) = std::fs::File::open(path) {
                    problems.push(CollectorError::TlsFile {
                        path: path.clone(),
                        source,
                    });
                }
            }
        }
    }
    if let Some(tls) = &config.sip.tls {
        if let Err(e) = super::tls::server_config(tls) {
            problems.push(e.into());
        }
    }
    if let Err(e) = check_control_socket(&config.control_socket) {
        problems.push(e);
    }
    problems
}

/// The control socket checks of [`check_environment`].
pub(super) fn check_control_socket(path: &Path) -> Result<(), CollectorError> {
    let bad = |reason: String| CollectorError::ControlSocketPath {
        path: path.to_owned(),
        reason,
    };
    if path.as_os_str().len() > 107 {
        return Err(bad(format!(
            "the path is {} bytes, a unix socket path holds at most 107",
            path.as_os_str().len()
        )));
    }
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        return Err(bad(format!("directory {} does not exist", dir.display())));
    }
    if let Some(e) = cannot_create_in(&dir) {
        return Err(bad(format!("directory {}: {e}", dir.display())));
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) => {
            if let Some(what) = admin::not_a_socket(meta.file_type()) {
                return Err(bad(format!("the path exists and is {what}, not a socket")));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(bad(format!("cannot inspect the path: {e}"))),
    }
    Ok(())
}
