//! The config file as written: serde structs with the file's names, types
//! and defaults, before any value is checked (`validate` turns them into
//! the typed [`super::CollectorConfig`]).

use std::path::PathBuf;

use serde::Deserialize;

use super::{SelectionPolicy, DEFAULT_RELEASE_WINDOW};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default = "default_node")]
    pub(super) node: String,
    #[serde(default)]
    pub(super) sip: RawSip,
    #[serde(default)]
    pub(super) accounts: Vec<RawAccount>,
    #[serde(default)]
    pub(super) defaults: RawDefaults,
    #[serde(default)]
    pub(super) subscription: RawSubscription,
    #[serde(default)]
    pub(super) health: RawHealth,
    #[serde(default)]
    pub(super) control: RawControl,
    #[serde(default)]
    pub(super) state: RawState,
    #[serde(default)]
    pub(super) store: RawStore,
    #[serde(default)]
    pub(super) cluster: RawCluster,
    #[serde(default)]
    pub(super) legs: RawLegs,
    #[serde(default)]
    pub(super) http: RawHttp,
    pub(super) redirect: Option<RawRedirect>,
    #[serde(default)]
    pub(super) selection: RawSelection,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHttp {
    #[serde(default = "default_http_listen")]
    pub(super) listen: String,
    pub(super) token: Option<String>,
}

impl Default for RawHttp {
    fn default() -> Self {
        Self {
            listen: default_http_listen(),
            token: None,
        }
    }
}

/// `[http] listen = "off"`: no HTTP listener.
pub const HTTP_OFF: &str = "off";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRedirect {
    pub(super) listen: String,
    pub(super) allow: Option<Vec<String>>,
    pub(super) transports: Option<Vec<String>>,
    pub(super) tls_listen: Option<String>,
}

pub(super) fn default_http_listen() -> String {
    "127.0.0.1:8080".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSelection {
    #[serde(default = "default_policy")]
    pub(super) policy: String,
    #[serde(default = "default_flight_ms")]
    pub(super) notify_flight_time_ms: u64,
    #[serde(default = "default_release_window_secs")]
    pub(super) release_window_secs: u64,
    #[serde(default = "default_failover_attempts")]
    pub(super) failover_attempts: u32,
}

impl Default for RawSelection {
    fn default() -> Self {
        Self {
            policy: default_policy(),
            notify_flight_time_ms: default_flight_ms(),
            release_window_secs: default_release_window_secs(),
            failover_attempts: default_failover_attempts(),
        }
    }
}

pub(super) fn default_failover_attempts() -> u32 {
    super::DEFAULT_FAILOVER_ATTEMPTS
}

pub(super) fn default_policy() -> String {
    SelectionPolicy::Pooled.name().to_owned()
}

pub(super) fn default_flight_ms() -> u64 {
    u64::try_from(crate::model::estimate::DEFAULT_NOTIFY_FLIGHT_TIME.as_millis()).unwrap_or(20)
}

pub(super) fn default_release_window_secs() -> u64 {
    DEFAULT_RELEASE_WINDOW.as_secs()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLegs {
    #[serde(default = "default_max_leg_secs")]
    pub(super) max_duration_secs: u64,
    #[serde(default = "default_existing_threshold")]
    pub(super) existing_conference_threshold: u32,
    #[serde(default = "default_new_threshold")]
    pub(super) new_conference_threshold: u32,
}

impl Default for RawLegs {
    fn default() -> Self {
        Self {
            max_duration_secs: default_max_leg_secs(),
            existing_conference_threshold: default_existing_threshold(),
            new_conference_threshold: default_new_threshold(),
        }
    }
}

pub(super) fn default_max_leg_secs() -> u64 {
    crate::model::legs::DEFAULT_MAX_DURATION.as_secs()
}

pub(super) fn default_existing_threshold() -> u32 {
    80
}

pub(super) fn default_new_threshold() -> u32 {
    50
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    #[serde(default = "default_backend")]
    pub(super) backend: String,
    pub(super) endpoints: Option<Vec<String>>,
    pub(super) prefix: Option<String>,
    pub(super) lease_ttl_secs: Option<u64>,
    pub(super) request_timeout_ms: Option<u64>,
    pub(super) user: Option<String>,
    pub(super) password: Option<String>,
    pub(super) tls: Option<RawTls>,
}

impl Default for RawStore {
    fn default() -> Self {
        Self {
            backend: default_backend(),
            endpoints: None,
            prefix: None,
            lease_ttl_secs: None,
            request_timeout_ms: None,
            user: None,
            password: None,
            tls: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    pub(super) ca: Option<PathBuf>,
    pub(super) cert: Option<PathBuf>,
    pub(super) key: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCluster {
    #[serde(default = "default_core_hosts")]
    pub(super) core_hosts: u32,
}

impl Default for RawCluster {
    fn default() -> Self {
        Self {
            core_hosts: default_core_hosts(),
        }
    }
}

pub(super) fn default_backend() -> String {
    "file".into()
}
pub(super) fn default_core_hosts() -> u32 {
    1
}

/// The etcd prefix when `[store] prefix` is not given.
pub const DEFAULT_ETCD_PREFIX: &str = "/msr-collector/";
/// The membership lease TTL when `[store] lease_ttl_secs` is not given.
pub const DEFAULT_LEASE_TTL_SECS: u64 = 10;
/// The etcd request timeout when `[store] request_timeout_ms` is not given.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 2000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSip {
    #[serde(default = "default_listen")]
    pub(super) listen: String,
    #[serde(default = "default_transports")]
    pub(super) transports: Vec<String>,
    #[serde(default = "default_realm")]
    pub(super) realm: String,
    #[serde(default = "default_nonce_ttl")]
    pub(super) nonce_ttl_secs: u64,
    #[serde(default = "default_min_expires")]
    pub(super) min_expires: u32,
    #[serde(default = "default_max_expires")]
    pub(super) max_expires: u32,
    #[serde(default = "default_digest_algorithms")]
    pub(super) digest_algorithms: Vec<String>,
    pub(super) tls: Option<RawSipTls>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSipTls {
    pub(super) listen: Option<String>,
    pub(super) cert: Option<PathBuf>,
    pub(super) key: Option<PathBuf>,
    pub(super) client_ca: Option<PathBuf>,
    #[serde(default)]
    pub(super) require: bool,
}

impl Default for RawSip {
    fn default() -> Self {
        Self {
            listen: default_listen(),
            transports: default_transports(),
            realm: default_realm(),
            nonce_ttl_secs: default_nonce_ttl(),
            min_expires: default_min_expires(),
            max_expires: default_max_expires(),
            digest_algorithms: default_digest_algorithms(),
            tls: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAccount {
    pub(super) auth_name: String,
    pub(super) password: String,
    #[serde(default)]
    pub(super) msrs: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDefaults {
    #[serde(default = "default_zone")]
    pub(super) zone: String,
    #[serde(default = "default_site")]
    pub(super) site: String,
}

impl Default for RawDefaults {
    fn default() -> Self {
        Self {
            zone: default_zone(),
            site: default_site(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSubscription {
    #[serde(default = "default_event")]
    pub(super) event: String,
    #[serde(default = "default_subscription_expires")]
    pub(super) expires: u32,
}

impl Default for RawSubscription {
    fn default() -> Self {
        Self {
            event: default_event(),
            expires: default_subscription_expires(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHealth {
    #[serde(default = "default_keepalive_interval")]
    pub(super) keepalive_interval_secs: u64,
    #[serde(default = "default_keepalive_timeout")]
    pub(super) keepalive_timeout_ms: u64,
    #[serde(default = "default_keepalive_misses")]
    pub(super) keepalive_misses: u32,
    #[serde(default = "default_unreported_grace")]
    pub(super) unreported_grace_ms: u64,
    #[serde(default = "default_failure_timeouts")]
    pub(super) failure_timeouts: u32,
    #[serde(default = "default_failure_errors")]
    pub(super) failure_errors: u32,
    #[serde(default = "default_failure_window")]
    pub(super) failure_window_secs: u64,
    #[serde(default = "default_failure_hold")]
    pub(super) failure_hold_secs: u64,
}

impl Default for RawHealth {
    fn default() -> Self {
        Self {
            keepalive_interval_secs: default_keepalive_interval(),
            keepalive_timeout_ms: default_keepalive_timeout(),
            keepalive_misses: default_keepalive_misses(),
            unreported_grace_ms: default_unreported_grace(),
            failure_timeouts: default_failure_timeouts(),
            failure_errors: default_failure_errors(),
            failure_window_secs: default_failure_window(),
            failure_hold_secs: default_failure_hold(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawControl {
    #[serde(default = "default_socket")]
    pub(super) socket: PathBuf,
}

impl Default for RawControl {
    fn default() -> Self {
        Self {
            socket: default_socket(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawState {
    #[serde(default = "default_state_path")]
    pub(super) path: PathBuf,
}

impl Default for RawState {
    fn default() -> Self {
        Self {
            path: default_state_path(),
        }
    }
}

pub(super) fn default_node() -> String {
    "core1@localhost".into()
}
pub(super) fn default_listen() -> String {
    "127.0.0.1:5060".into()
}
pub(super) fn default_transports() -> Vec<String> {
    vec!["udp".into()]
}
pub(super) fn default_realm() -> String {
    "msr.local".into()
}
pub(super) fn default_nonce_ttl() -> u64 {
    300
}
pub(super) fn default_min_expires() -> u32 {
    10
}
pub(super) fn default_max_expires() -> u32 {
    3600
}
pub(super) fn default_digest_algorithms() -> Vec<String> {
    vec!["SHA-256".into(), "MD5".into()]
}
pub(super) fn default_zone() -> String {
    crate::operator::DEFAULT_ZONE.into()
}
pub(super) fn default_site() -> String {
    crate::operator::DEFAULT_SITE.into()
}
pub(super) fn default_event() -> String {
    msr_shared::event_package::EVENT.into()
}
/// SPEC §4: `Expires: 60` unless set (`[subscription] expires`).
pub const DEFAULT_SUBSCRIPTION_EXPIRES_SECS: u32 = 60;

pub(super) fn default_subscription_expires() -> u32 {
    DEFAULT_SUBSCRIPTION_EXPIRES_SECS
}
/// SPEC §5: an OPTIONS every 5 s.
pub(super) fn default_keepalive_interval() -> u64 {
    5
}
/// Four retransmissions' worth of RFC 3261 T1 (500 ms): with the default
/// interval and misses, a silent contact is `unreachable` within
/// 5 + 2 × 2 = 9 s, inside SPEC §5's 10 s.
pub(super) fn default_keepalive_timeout() -> u64 {
    2000
}
/// SPEC §14: the first timeout.
pub(super) fn default_failure_timeouts() -> u32 {
    super::FailureLimits::default().timeouts
}
/// SPEC §14: three errors.
pub(super) fn default_failure_errors() -> u32 {
    super::FailureLimits::default().errors
}
/// SPEC §14: within 10 s.
pub(super) fn default_failure_window() -> u64 {
    super::FailureLimits::default().window.as_secs()
}
/// At least 10 s out of selection after a trip.
pub(super) fn default_failure_hold() -> u64 {
    super::FailureLimits::default().hold.as_secs()
}
/// SPEC §5: two misses in a row.
pub(super) fn default_keepalive_misses() -> u32 {
    2
}
/// SPEC §5: a short grace, 2 s.
pub(super) fn default_unreported_grace() -> u64 {
    2000
}
pub(super) fn default_socket() -> PathBuf {
    PathBuf::from("/run/msr-collector/control.sock")
}
pub(super) fn default_state_path() -> PathBuf {
    PathBuf::from("/var/lib/msr-collector/operator.json")
}
