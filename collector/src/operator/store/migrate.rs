//! `msr-collector store migrate --to etcd` (SPEC §12): moves the file store
//! at `[state] path` into etcd at `[store] prefix`, once.
//!
//! The write is a transaction that succeeds only while the configuration
//! key does not exist, so a prefix that already holds a configuration (a
//! cluster already running on etcd, or an earlier migration) is never
//! overwritten by accident; `--force` overwrites it.

use std::path::PathBuf;

use crate::config::{CollectorConfig, StoreBackend};
use crate::operator::store::etcd::{self, EtcdError, Keys};
use crate::operator::store::{Store, StoreError};

/// What was moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migrated {
    /// The file read.
    pub from: PathBuf,
    /// Endpoints, comma-separated.
    pub endpoints: String,
    /// The key written.
    pub key: String,
    /// The etcd revision of the write.
    pub revision: i64,
    /// Sites, MSR settings and contact settings moved.
    pub counts: (usize, usize, usize),
}

/// Why the migration did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MigrateError {
    /// The config does not name etcd as the backend.
    #[error("[store] backend is \"file\": set backend = \"etcd\" with its endpoints in the config, then migrate")]
    NotEtcd,
    /// There is no file store to move.
    #[error("nothing to migrate: the file store {path} does not exist")]
    NoFile {
        /// `[state] path`.
        path: PathBuf,
    },
    /// The file store could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// etcd refused or could not be reached.
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    /// The prefix already holds a configuration.
    #[error(
        "etcd prefix {prefix} is not empty: {key} holds an operator configuration \
         (revision {revision}, {sites} site(s)); nothing written (--force overwrites it)"
    )]
    NotEmpty {
        /// The prefix.
        prefix: String,
        /// The configuration key.
        key: String,
        /// Its `mod_revision`.
        revision: i64,
        /// Its number of sites.
        sites: usize,
    },
}

/// Moves the file store into etcd (see the module docs).
///
/// # Errors
/// [`MigrateError`].
pub async fn migrate(config: &CollectorConfig, force: bool) -> Result<Migrated, MigrateError> {
    let StoreBackend::Etcd(etcd_config) = &config.store else {
        return Err(MigrateError::NotEtcd);
    };
    let store = Store::new(config.state_path.clone());
    if !store.path().exists() {
        return Err(MigrateError::NoFile {
            path: store.path().to_owned(),
        });
    }
    let operator = store.load()?;
    let keys = Keys::new(&etcd_config.prefix);
    let endpoints = etcd_config.endpoints.join(",");
    let mut client = etcd::connect(etcd_config).await?;
    let revision = if force {
        etcd::overwrite_config(&mut client, &keys, &endpoints, &operator).await?
    } else {
        match etcd::write_config(&mut client, &keys, &endpoints, &operator, None).await? {
            Ok(revision) => revision,
            Err(found) => {
                let sites = etcd::read_snapshot(&mut client, &keys, &endpoints)
                    .await
                    .map(|s| s.config.topology().sites().count())
                    .unwrap_or(0);
                return Err(MigrateError::NotEmpty {
                    prefix: keys.prefix().to_owned(),
                    key: keys.operator(),
                    revision: found.unwrap_or(0),
                    sites,
                });
            }
        }
    };
    Ok(Migrated {
        from: store.path().to_owned(),
        endpoints,
        key: keys.operator(),
        revision,
        counts: (
            operator.topology().sites().count(),
            operator.configured_msrs().count(),
            operator.configured_contacts().count(),
        ),
    })
}
