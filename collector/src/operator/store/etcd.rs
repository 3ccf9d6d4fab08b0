//! The etcd backend of the operator store (SPEC §12): one task owns the
//! etcd client and talks to the shell over two channels of typed messages.
//!
//! Keys, under `[store] prefix` (`P`):
//!
//! * `P operator`: the whole operator configuration (SPEC §6), in the store's
//!   private JSON format ([`OperatorConfig::encode`]). Its `mod_revision` is
//!   the revision a change is made against: a change is a transaction that
//!   writes the key only if its `mod_revision` is still the one the change
//!   was computed from (compare-and-swap), so two collectors changing the
//!   configuration at the same time cannot lose one of the changes: the
//!   later one is refused ([`CommitError::Conflict`]).
//! * `P members/NODE`: one per live collector, attached to a lease the task
//!   keeps alive; a collector that stops without revoking it (kill -9, host
//!   down) leaves the list when the lease expires (`[store] lease_ttl_secs`).
//!
//! The task, in a loop: connect, read both (one range read: the revision it
//! returns is where the watch starts, so nothing in between is missed), send
//! [`EtcdEvent::Config`] and [`EtcdEvent::Members`], put the membership key,
//! then watch the prefix and answer [`EtcdCommand::Commit`]s until an
//! error; then [`EtcdEvent::Unavailable`], a capped backoff
//! ([`RECONNECT_BASE`] to [`RECONNECT_CAP`]) and again. Each reconnection
//! reads the configuration anew, so changes made elsewhere meanwhile are
//! caught up. Every configuration read from etcd is also written to the
//! local cache (`[state] path`), which a collector starts from when etcd is
//! unreachable at its start.
//!
//! Architecture invariant: the shell never waits on etcd; the task never
//! touches the shell's state. Outage logs are rate-limited: one line when
//! etcd becomes unreachable, then at most one per [`OUTAGE_LOG_INTERVAL`].

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::operator::{DecodeError, OperatorConfig};

/// First wait before reconnecting after etcd failed.
pub const RECONNECT_BASE: Duration = Duration::from_millis(200);
/// Longest wait between two connection attempts.
pub const RECONNECT_CAP: Duration = Duration::from_secs(5);
/// At most one "still unreachable" log line per this interval.
pub const OUTAGE_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// The name of the configuration key under the prefix.
pub const OPERATOR_KEY: &str = "operator";
/// The folder of the membership keys under the prefix.
pub const MEMBERS_DIR: &str = "members/";

/// The keys under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// The keys under `prefix` (ends in `/`, as the config checks).
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
        }
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `P operator`.
    pub fn operator(&self) -> String {
        format!("{}{OPERATOR_KEY}", self.prefix)
    }

    /// `P members/`.
    pub fn members(&self) -> String {
        format!("{}{MEMBERS_DIR}", self.prefix)
    }

    /// `P members/NODE`.
    pub fn member(&self, node: &str) -> String {
        format!("{}{node}", self.members())
    }
}

/// A live collector as its membership key holds it (private format of this
/// module, like the configuration's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// `node` of its config.
    pub node: String,
    /// Its bound SIP address.
    pub sip: String,
    /// Unix time (seconds) of its start.
    pub started_unix: i64,
}

/// From the shell to the etcd task.
#[derive(Debug)]
pub enum EtcdCommand {
    /// Write `config` if the configuration key's `mod_revision` is still
    /// `expected` (`None`: the key must not exist).
    Commit {
        /// Given back in the answer.
        ticket: u64,
        /// The configuration to write.
        config: Box<OperatorConfig>,
        /// The revision the change was made against.
        expected: Option<i64>,
    },
}

/// From the etcd task to the shell, in the order things happened.
#[derive(Debug)]
pub enum EtcdEvent {
    /// etcd answered: changes are accepted again.
    Connected,
    /// etcd cannot be reached: changes are refused until [`EtcdEvent::Connected`].
    Unavailable {
        /// The last error.
        reason: String,
        /// Since when (the first failure of this outage).
        since: SystemTime,
    },
    /// The configuration stored in etcd, at start, after a reconnection and
    /// after every change (ours included).
    Config {
        /// The decoded configuration (empty when the key does not exist).
        config: Box<OperatorConfig>,
        /// The key's `mod_revision`; `None` when it does not exist.
        mod_revision: Option<i64>,
        /// The etcd revision this state is as of (orders the events).
        revision: i64,
    },
    /// The live collectors, after every change of the list.
    Members(Vec<Member>),
    /// A [`EtcdCommand::Commit`] was written at `revision`.
    Committed {
        /// The command's ticket.
        ticket: u64,
        /// The new `mod_revision` of the configuration key.
        revision: i64,
    },
    /// A [`EtcdCommand::Commit`] was not written.
    Refused {
        /// The command's ticket.
        ticket: u64,
        /// Why.
        error: CommitError,
    },
}

/// Why a change was not written to etcd.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CommitError {
    /// Another collector changed the configuration first.
    #[error(
        "conflict: the operator configuration changed on another collector \
         (revision {}, this change was made against revision {}); nothing changed: \
         look at the new state and run the command again",
        describe(*found),
        describe(*expected)
    )]
    Conflict {
        /// The revision the change was made against.
        expected: Option<i64>,
        /// The revision etcd holds now.
        found: Option<i64>,
    },
    /// etcd did not answer.
    #[error(
        "etcd is unreachable ({reason}): changes are refused; \
         selection goes on with the last configuration seen"
    )]
    Unavailable {
        /// The client's error.
        reason: String,
    },
}

fn describe(revision: Option<i64>) -> String {
    revision.map_or_else(
        || "none (no configuration yet)".to_owned(),
        |r| r.to_string(),
    )
}

/// Why the etcd client failed (one connection attempt, or a session).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EtcdError {
    /// The client reported an error (connection, timeout, refusal),
    /// written for a person ([`plain`]), not as the gRPC stack's debug text.
    #[error("etcd {endpoints}: {}", plain(source))]
    Client {
        /// The configured endpoints, comma-separated.
        endpoints: String,
        /// The client's error.
        source: etcd_client::Error,
    },
    /// A TLS file could not be read.
    #[error("[store.tls] {path}: {source}")]
    TlsFile {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The watch or the lease keep-alive stream ended.
    #[error("etcd {endpoints}: {what}")]
    Stream {
        /// The configured endpoints, comma-separated.
        endpoints: String,
        /// What ended.
        what: &'static str,
    },
    /// The configuration stored in etcd is not valid.
    #[error("etcd key {key} is not a valid operator configuration: {source}")]
    Corrupt {
        /// The key.
        key: String,
        /// What is wrong with it.
        source: DecodeError,
    },
    /// A request took longer than `[store] request_timeout_ms`.
    #[error("etcd {endpoints}: no answer within {} ms", timeout.as_millis())]
    Timeout {
        /// The configured endpoints, comma-separated.
        endpoints: String,
        /// The limit.
        timeout: Duration,
    },
}

/// `error` for a person: the gRPC status's meaning and message and the
/// innermost causes (e.g. `the service is currently unavailable: tcp
/// connect error: Connection refused (os error 111)`), without the
/// transport's debug dump, and a hint for the usual causes.
pub fn plain(error: &etcd_client::Error) -> String {
    use std::error::Error as _;
    let mut parts: Vec<String> = Vec::new();
    let mut source: Option<&(dyn std::error::Error + 'static)> = match error {
        etcd_client::Error::GRpcStatus(status) => {
            let meaning = status.code().description();
            let mut chars = meaning.chars();
            let meaning = match chars.next() {
                Some(first) => first.to_lowercase().chain(chars).collect(),
                None => String::new(),
            };
            parts.push(meaning);
            parts.push(status.message().to_owned());
            status.source()
        }
        etcd_client::Error::TransportError(e) => Some(e),
        etcd_client::Error::IoError(e) => Some(e),
        other => return other.to_string(),
    };
    while let Some(cause) = source {
        parts.push(cause.to_string());
        source = cause.source();
    }
    plain_parts(parts)
}

/// The parts of [`plain`], joined: empty, generic ("transport error") and
/// repeated ones left out, a hint added for a refused connection, a failed
/// name lookup or a refused login.
fn plain_parts(parts: Vec<String>) -> String {
    let mut kept: Vec<String> = Vec::new();
    for part in parts {
        let part = part.trim().to_owned();
        if part.is_empty() || part == "transport error" || kept.contains(&part) {
            continue;
        }
        kept.push(part);
    }
    let text = kept.join(": ");
    let lower = text.to_ascii_lowercase();
    let hint = if lower.contains("connection refused") {
        "; is etcd running there, and is that its client URL ([store] endpoints)?"
    } else if lower.contains("dns error") || lower.contains("failed to lookup address") {
        "; the host name of [store] endpoints does not resolve"
    } else if lower.contains("authentication failed") || lower.contains("invalid auth token") {
        "; check [store] user and password"
    } else {
        ""
    };
    format!("{text}{hint}")
}

mod requests;
mod task;
pub use requests::{connect, overwrite_config, read_snapshot, write_config, Snapshot};
use requests::{decode_config, decode_member};
pub use task::{spawn, EtcdLink};

#[cfg(test)]
mod tests;
