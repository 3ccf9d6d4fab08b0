//! The etcd requests the task and `msr-collector store migrate` both make,
//! each one round trip or one transaction: connect (with the `[store]`
//! credentials and TLS), read the configuration and the member list at one
//! revision, and write the configuration, as a compare-and-swap against the
//! revision a change was computed from or (for a migration) outright.

use std::collections::BTreeMap;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, TlsOptions, Txn,
    TxnOp, TxnOpResponse,
};
use tracing::warn;

use super::{EtcdError, Keys, Member};
use crate::config::EtcdConfig;
use crate::operator::OperatorConfig;

/// Connects to etcd as `[store]` says (endpoints, user, TLS, timeouts).
///
/// # Errors
/// [`EtcdError::TlsFile`], [`EtcdError::Client`], [`EtcdError::Timeout`].
pub async fn connect(config: &EtcdConfig) -> Result<Client, EtcdError> {
    let mut options = ConnectOptions::new()
        .with_timeout(config.request_timeout)
        .with_connect_timeout(config.request_timeout)
        // HTTP/2 pings find a dead etcd on an idle watch stream.
        .with_keep_alive(Duration::from_secs(1), config.request_timeout)
        .with_keep_alive_while_idle(true);
    if let Some((user, password)) = &config.user {
        options = options.with_user(user.clone(), password.clone());
    }
    if let Some(tls) = &config.tls {
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|source| EtcdError::TlsFile {
                path: path.to_owned(),
                source,
            })
        };
        let mut tls_options =
            TlsOptions::new().ca_certificate(Certificate::from_pem(read(&tls.ca)?));
        if let Some((cert, key)) = &tls.identity {
            tls_options = tls_options.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        options = options.with_tls(tls_options);
    }
    let endpoints = config.endpoints.join(",");
    match tokio::time::timeout(
        config.request_timeout,
        Client::connect(&config.endpoints, Some(options)),
    )
    .await
    {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(source)) => Err(EtcdError::Client { endpoints, source }),
        Err(_) => Err(EtcdError::Timeout {
            endpoints,
            timeout: config.request_timeout,
        }),
    }
}

/// What one range read of the prefix found.
#[derive(Debug)]
pub struct Snapshot {
    /// The configuration (empty when the key does not exist).
    pub config: OperatorConfig,
    /// The configuration key's `mod_revision`.
    pub mod_revision: Option<i64>,
    /// The number of keys under the prefix besides the membership keys.
    pub other_keys: usize,
    /// The live members.
    pub members: BTreeMap<String, Member>,
    /// The etcd revision of the read.
    pub revision: i64,
}

/// Reads everything under the prefix at one revision.
///
/// # Errors
/// [`EtcdError::Client`]; [`EtcdError::Corrupt`] when the configuration key
/// does not decode.
pub async fn read_snapshot(
    client: &mut Client,
    keys: &Keys,
    endpoints: &str,
) -> Result<Snapshot, EtcdError> {
    let response = client
        .get(keys.prefix(), Some(GetOptions::new().with_prefix()))
        .await
        .map_err(|source| EtcdError::Client {
            endpoints: endpoints.to_owned(),
            source,
        })?;
    let revision = response.header().map_or(0, |h| h.revision());
    let operator_key = keys.operator();
    let members_dir = keys.members();
    let mut snapshot = Snapshot {
        config: OperatorConfig::new(),
        mod_revision: None,
        other_keys: 0,
        members: BTreeMap::new(),
        revision,
    };
    for kv in response.kvs() {
        let key = String::from_utf8_lossy(kv.key());
        if key == operator_key {
            snapshot.config = decode_config(&operator_key, kv.value())?;
            snapshot.mod_revision = Some(kv.mod_revision());
            snapshot.other_keys += 1;
        } else if let Some(node) = key.strip_prefix(members_dir.as_str()) {
            if let Some(member) = decode_member(node, kv.value()) {
                snapshot.members.insert(node.to_owned(), member);
            }
        } else {
            snapshot.other_keys += 1;
        }
    }
    Ok(snapshot)
}

pub(super) fn decode_config(key: &str, value: &[u8]) -> Result<OperatorConfig, EtcdError> {
    let text = String::from_utf8_lossy(value);
    OperatorConfig::decode(&text).map_err(|source| EtcdError::Corrupt {
        key: key.to_owned(),
        source,
    })
}

pub(super) fn decode_member(node: &str, value: &[u8]) -> Option<Member> {
    match serde_json::from_slice::<Member>(value) {
        Ok(member) => Some(member),
        Err(error) => {
            warn!(node, %error, "unreadable membership key ignored");
            None
        }
    }
}

/// Writes `config` if the configuration key's `mod_revision` is `expected`
/// (`None`: absent; with `force`, whatever it holds). Returns the new
/// `mod_revision`, or the one found when the compare failed.
///
/// # Errors
/// [`EtcdError::Client`].
pub async fn write_config(
    client: &mut Client,
    keys: &Keys,
    endpoints: &str,
    config: &OperatorConfig,
    expected: Option<i64>,
) -> Result<Result<i64, Option<i64>>, EtcdError> {
    let key = keys.operator();
    let compare = match expected {
        Some(revision) => Compare::mod_revision(key.clone(), CompareOp::Equal, revision),
        None => Compare::version(key.clone(), CompareOp::Equal, 0),
    };
    let txn = Txn::new()
        .when([compare])
        .and_then([TxnOp::put(key.clone(), config.encode(), None)])
        .or_else([TxnOp::get(key, None)]);
    let response = client.txn(txn).await.map_err(|source| EtcdError::Client {
        endpoints: endpoints.to_owned(),
        source,
    })?;
    if response.succeeded() {
        return Ok(Ok(response.header().map_or(0, |h| h.revision())));
    }
    let found = response.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(get) => Some(get.kvs().first().map(|kv| kv.mod_revision())),
        _ => None,
    });
    Ok(Err(found.flatten()))
}

/// Writes `config` whatever the key holds (`store migrate --force`).
///
/// # Errors
/// [`EtcdError::Client`].
pub async fn overwrite_config(
    client: &mut Client,
    keys: &Keys,
    endpoints: &str,
    config: &OperatorConfig,
) -> Result<i64, EtcdError> {
    let response = client
        .put(keys.operator(), config.encode(), None)
        .await
        .map_err(|source| EtcdError::Client {
            endpoints: endpoints.to_owned(),
            source,
        })?;
    Ok(response.header().map_or(0, |h| h.revision()))
}
