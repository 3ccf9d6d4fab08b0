//! What `hello` and `cluster list` answer: the collector, its store and the core hosts.

use serde::{Deserialize, Serialize};

/// What a collector says to `hello`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// The protocol version it speaks ([`PROTOCOL_VERSION`](super::PROTOCOL_VERSION)).
    pub version: u32,
    /// Its software and version, e.g. `msr-collector 0.1.0`.
    pub software: String,
}

/// The cluster of core hosts as one collector sees it (SPEC §12).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterView {
    /// The collector that answered.
    pub node: String,
    /// Where the operator configuration lives and whether it is reachable.
    pub store: StoreView,
    /// The number of core hosts, G (SPEC §10): the live members with etcd,
    /// `[cluster] core_hosts` with the file store.
    pub core_hosts: u32,
    /// With etcd: G is `[cluster] core_hosts`, not a count of live
    /// members, because etcd has not been reached since this collector
    /// started.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub core_hosts_from_config: bool,
    /// The live core hosts, sorted by node name (with the file store: this
    /// collector only).
    pub members: Vec<ClusterMember>,
}

/// The operator store's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreView {
    /// Where the configuration lives.
    pub backend: StoreKind,
    /// Whether it can be reached.
    pub status: StoreState,
    /// With etcd: the endpoints and key prefix; with a file: its path.
    pub location: String,
    /// The etcd revision of the configuration in use (absent for the file
    /// store, and for a collector that started from its cached copy and has
    /// not reached etcd since).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// Unix time (seconds) since when etcd has been unreachable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable_since_unix: Option<i64>,
    /// Why etcd is unreachable (the last error), or where the configuration
    /// in use came from when it is the cached copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Where the operator configuration lives (SPEC §12). On the wire: `file`
/// or `etcd`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreKind {
    /// The collector's own file.
    File,
    /// etcd, shared by the cluster.
    Etcd,
}

impl StoreKind {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreKind::File => "file",
            StoreKind::Etcd => "etcd",
        }
    }
}

/// Whether the operator store can be reached (SPEC §12). On the wire:
/// `connected`, `unavailable` or `local`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreState {
    /// etcd answered last.
    Connected,
    /// etcd cannot be reached: changes are refused, selection goes on with
    /// the last configuration seen.
    Unavailable,
    /// The file store: always reachable.
    Local,
}

impl StoreState {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreState::Connected => "connected",
            StoreState::Unavailable => "unavailable",
            StoreState::Local => "local",
        }
    }
}

/// One live core host (a collector's membership key in etcd).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterMember {
    /// The collector's `node` name.
    pub node: String,
    /// Its SIP address (`[sip] listen`, as bound).
    pub sip: String,
    /// Unix time (seconds) when it started.
    pub started_unix: i64,
    /// Whether this is the collector that answered.
    pub this: bool,
}
