//! The collector's own configuration file (TOML).
//!
//! [`load`] reads a file and [`parse`] does the work: the text is
//! deserialised into raw structs (serde, `deny_unknown_fields`, named
//! defaults) and then converted into the validated [`CollectorConfig`], so
//! that later code never sees an invalid value. Every error names the file,
//! the key, the value and what is accepted.
//!
//! ```toml
//! node = "core1@localhost"
//!
//! [sip]
//! listen = "127.0.0.1:5060"
//! transports = ["udp"]
//! realm = "msr.local"
//!
//! [[accounts]]
//! auth_name = "msr"
//! password = "msr-secret"
//! ```
//!
//! The operator's configuration (zones, sites, distances, coefficients,
//! per-MSR subscription expiry; SPEC §6) is not here: it lives in the store
//! at `[state] path` and is changed with `msrctl`.

use std::collections::BTreeSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::names::{self, CharName, NameKind};

/// The default config file path (also `msr-collector --config`'s default).
pub const DEFAULT_CONFIG_PATH: &str = "/etc/msr-collector/collector.toml";

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{origin}: cannot read: {source}")]
    Read {
        /// The file path.
        origin: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The text is not valid TOML, or a key is unknown or has the wrong type.
    #[error("{origin}:{line}:{column}: {message}")]
    Syntax {
        /// The file path (or `<string>`).
        origin: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The TOML parser's message, lowercased first letter.
        message: String,
    },
    /// The file is not UTF-8 text (TOML v1.0.0 "Spec": a TOML file must be
    /// a valid UTF-8 encoded Unicode document).
    #[error("{origin}:{line}:{column}: byte 0x{byte:02x} is not valid utf-8 (the file must be utf-8 text)")]
    Encoding {
        /// The file path.
        origin: String,
        /// 1-based line of the first invalid byte.
        line: usize,
        /// 1-based column (in characters) of the first invalid byte.
        column: usize,
        /// That byte.
        byte: u8,
    },
    /// A value is well-formed TOML but not acceptable.
    #[error("{}: `{key}` = {value}: expected {expected}", with_position(origin, *position))]
    Invalid {
        /// The file path (or `<string>`).
        origin: String,
        /// Line and column (1-based) of the value, when it is written in
        /// the text (not for a missing key).
        position: Option<(usize, usize)>,
        /// The dotted key, e.g. `sip.transports`.
        key: String,
        /// The offending value as written (TOML syntax).
        value: String,
        /// What is accepted.
        expected: String,
    },
}

/// A SIP transport the collector listens on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Transport {
    /// UDP (always bound: every request leaves from the UDP socket).
    Udp,
    /// TCP listener on the same address and port.
    Tcp,
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
        })
    }
}

/// A digest algorithm offered in the registrar's challenge (RFC 7616 §3.3,
/// RFC 8760). Each one is offered in its own `WWW-Authenticate` header, in
/// the configured order (the client uses the first one it supports).
pub use msr_shared::sip::digest::Algorithm as DigestAlgorithm;

/// The validated collector configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectorConfig {
    /// The collector's node name, shown in the `Node` column (SPEC §5).
    pub node: String,
    /// SIP endpoint and registrar settings.
    pub sip: SipConfig,
    /// Credentials MSR accounts authenticate with (RFC 3261 §22).
    pub accounts: Vec<Account>,
    /// Zone and site given to contacts the operator has not placed (SPEC §6).
    pub defaults: Defaults,
    /// Load subscription defaults (SPEC §4).
    pub subscription: SubscriptionDefaults,
    /// MSR health: keepalive and grace (SPEC §5).
    pub health: HealthConfig,
    /// Where `msrctl` connects (SPEC §8).
    pub control_socket: PathBuf,
    /// Where the operator configuration is stored (SPEC §6); with the etcd
    /// backend, the local cached copy a collector starts from when etcd is
    /// unreachable (SPEC §12).
    pub state_path: PathBuf,
    /// `[store]`: the file store (default) or etcd (SPEC §12).
    pub store: StoreBackend,
    /// `[cluster]`: what the collector assumes of the cluster when the
    /// store cannot tell (SPEC §10, §12).
    pub cluster: ClusterConfig,
    /// `[legs]`: call legs (SPEC §9).
    pub legs: LegsConfig,
    /// `[selection]`: the policy (SPEC §7, §10).
    pub selection: SelectionConfig,
    /// `[http]`: the HTTP API and `/metrics` (SPEC §11): on at
    /// `127.0.0.1:8080` when the section is absent; `None` only for
    /// `listen = "off"`.
    pub http: Option<HttpConfig>,
    /// `[redirect]`: the SIP redirect server (SPEC §11); `None` when the
    /// section is absent.
    pub redirect: Option<RedirectConfig>,
}

/// `[http]`: the HTTP API (SPEC §11).
#[derive(Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// The TCP address to listen on (default `127.0.0.1:8080`); port 0
    /// picks a free port.
    pub listen: SocketAddr,
    /// The bearer token every request must carry (`Authorization: Bearer
    /// …`); required for a non-loopback `listen`.
    pub token: Option<String>,
}

impl fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpConfig")
            .field("listen", &self.listen)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// `[redirect]`: the SIP redirect server (SPEC §11).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedirectConfig {
    /// The UDP address of the redirect server, e.g. `127.0.0.1:5062`
    /// (not the registrar's `[sip] listen`); port 0 picks a free port.
    pub listen: SocketAddr,
}

/// `[selection] policy`: how a plain leg's MSR is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelectionPolicy {
    /// SPEC §7 exactly: the draw weighted by free load × coefficient.
    Ecss,
    /// SPEC §10: the lowest estimated occupancy; the default. A leg it
    /// cannot follow to its end (no `call_id`), or any leg while the core
    /// releases none, is drawn as with `ecss`.
    Pooled,
}

impl SelectionPolicy {
    /// `ecss` or `pooled`.
    pub fn name(self) -> &'static str {
        match self {
            SelectionPolicy::Ecss => "ecss",
            SelectionPolicy::Pooled => "pooled",
        }
    }
}

/// `[selection]`: the policy and the inputs of its estimate (SPEC §10).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SelectionConfig {
    /// `policy`: `pooled` (default) or `ecss`.
    pub policy: SelectionPolicy,
    /// `notify_flight_time_ms`: how much older than its arrival a load
    /// report is taken to be (its NOTIFY's flight; default 20 ms).
    pub notify_flight_time: Duration,
    /// `release_window_secs`: `pooled` applies while a leg release was seen
    /// within this long (default 60 s); otherwise the core is taken not to
    /// report leg ends and legs are drawn as with `ecss`.
    pub release_window: Duration,
}

impl Default for SelectionConfig {
    fn default() -> Self {
        Self {
            policy: SelectionPolicy::Pooled,
            notify_flight_time: crate::estimate::DEFAULT_NOTIFY_FLIGHT_TIME,
            release_window: DEFAULT_RELEASE_WINDOW,
        }
    }
}

/// `[selection] release_window_secs` when unset.
pub const DEFAULT_RELEASE_WINDOW: Duration = Duration::from_secs(60);

/// `[legs]`: call legs and their admission (SPEC §9).
#[derive(Debug, Clone, PartialEq)]
pub struct LegsConfig {
    /// The longest a leg lives without a release (a lost release cannot
    /// leak): default 4 h.
    pub max_duration: Duration,
    /// A conference's host takes its legs below this fraction of its load
    /// limit (default 0.8).
    pub existing_conference_threshold: f64,
    /// An MSR takes a new conference below this fraction of its load limit
    /// (default 0.5).
    pub new_conference_threshold: f64,
}

/// `[store]`: where the operator configuration lives (SPEC §6, §12).
#[derive(Debug, Clone, PartialEq)]
pub enum StoreBackend {
    /// The JSON file at `[state] path`, for a single core host.
    File,
    /// etcd, shared by every collector of the cluster.
    Etcd(EtcdConfig),
}

impl StoreBackend {
    /// `file` or `etcd`, as in the config file.
    pub fn name(&self) -> &'static str {
        match self {
            StoreBackend::File => "file",
            StoreBackend::Etcd(_) => "etcd",
        }
    }
}

/// `[store]` with `backend = "etcd"`.
#[derive(Clone, PartialEq)]
pub struct EtcdConfig {
    /// `http://host:port` or `https://host:port`, at least one.
    pub endpoints: Vec<String>,
    /// The key prefix, ending in `/`: the configuration is the key
    /// `<prefix>operator`, the members are `<prefix>members/<node>`.
    pub prefix: String,
    /// The membership lease's time to live: a collector that stops without
    /// revoking it (kill -9, host down) leaves the member list after this.
    pub lease_ttl: Duration,
    /// How long one etcd request may take before etcd counts as unreachable.
    pub request_timeout: Duration,
    /// etcd authentication (user, password), both or neither.
    pub user: Option<(String, String)>,
    /// TLS towards etcd (for `https://` endpoints).
    pub tls: Option<EtcdTls>,
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("lease_ttl", &self.lease_ttl)
            .field("request_timeout", &self.request_timeout)
            .field(
                "user",
                &self.user.as_ref().map(|(user, _)| (user, "<redacted>")),
            )
            .field("tls", &self.tls)
            .finish()
    }
}

/// `[store.tls]`: PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTls {
    /// The CA that signed etcd's server certificate.
    pub ca: PathBuf,
    /// A client certificate and its key, when etcd asks for one.
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// `[cluster]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// G, the number of core hosts (SPEC §10), when the store does not
    /// count them: with the file store, and with etcd before the first
    /// member list arrived.
    pub core_hosts: u32,
}

/// `[sip]`: the endpoint and the registrar (SPEC §3).
#[derive(Debug, Clone, PartialEq)]
pub struct SipConfig {
    /// The UDP (and TCP) address to bind; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Transports; always contains [`Transport::Udp`].
    pub transports: Vec<Transport>,
    /// The digest realm of challenges (RFC 3261 §22.1).
    pub realm: String,
    /// How long a nonce is accepted; a REGISTER with an older one gets a
    /// new challenge with `stale=true` (RFC 7616 §3.3).
    pub nonce_ttl: Duration,
    /// Shortest registration accepted, seconds; shorter gets `423` with
    /// `Min-Expires` (RFC 3261 §10.3 step 7).
    pub min_expires: u32,
    /// Longest registration granted, seconds; longer is cut to this.
    pub max_expires: u32,
    /// Algorithms offered in challenges, in order.
    pub digest_algorithms: Vec<DigestAlgorithm>,
}

impl SipConfig {
    /// Whether a TCP listener is configured besides UDP.
    pub fn tcp(&self) -> bool {
        self.transports.contains(&Transport::Tcp)
    }
}

/// One `[[accounts]]` entry.
#[derive(Clone, PartialEq, Eq)]
pub struct Account {
    /// Digest user name (`auth_name` in the MSR's `<dynamic>`).
    pub auth_name: String,
    /// Digest password (`auth_password` in the MSR's `<dynamic>`).
    pub password: String,
    /// The MSR names (AOR users) this account may register; empty = any.
    pub msrs: Vec<String>,
}

impl fmt::Debug for Account {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Account")
            .field("auth_name", &self.auth_name)
            .field("password", &"<redacted>")
            .field("msrs", &self.msrs)
            .finish()
    }
}

/// `[defaults]`: the zone and site of a contact until the operator sets them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Defaults {
    /// Zone label.
    pub zone: String,
    /// Site name.
    pub site: String,
}

/// `[subscription]`: the load subscription (SPEC §4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionDefaults {
    /// Event package; only `eltex-call-count`.
    pub event: String,
    /// `Expires` requested in SUBSCRIBE, seconds, unless the operator set
    /// one for the MSR (`subscription set`).
    pub expires: u32,
}

/// `[health]`: how MSR contacts are judged healthy (SPEC §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthConfig {
    /// Time between two OPTIONS keepalives to one contact.
    pub keepalive_interval: Duration,
    /// How long a keepalive may go unanswered before it counts as a miss;
    /// at most the interval. A miss is probed again at once, so
    /// `keepalive_misses` misses in a row take about
    /// `interval + misses × timeout`.
    pub keepalive_timeout: Duration,
    /// Misses in a row that make a contact `unreachable`.
    pub keepalive_misses: u32,
    /// How long a new contact may go without a load report before it is
    /// `unreported`.
    pub unreported_grace: Duration,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            keepalive_interval: Duration::from_secs(default_keepalive_interval()),
            keepalive_timeout: Duration::from_millis(default_keepalive_timeout()),
            keepalive_misses: default_keepalive_misses(),
            unreported_grace: Duration::from_millis(default_unreported_grace()),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default = "default_node")]
    node: String,
    #[serde(default)]
    sip: RawSip,
    #[serde(default)]
    accounts: Vec<RawAccount>,
    #[serde(default)]
    defaults: RawDefaults,
    #[serde(default)]
    subscription: RawSubscription,
    #[serde(default)]
    health: RawHealth,
    #[serde(default)]
    control: RawControl,
    #[serde(default)]
    state: RawState,
    #[serde(default)]
    store: RawStore,
    #[serde(default)]
    cluster: RawCluster,
    #[serde(default)]
    legs: RawLegs,
    #[serde(default)]
    http: RawHttp,
    redirect: Option<RawRedirect>,
    #[serde(default)]
    selection: RawSelection,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    #[serde(default = "default_http_listen")]
    listen: String,
    token: Option<String>,
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
struct RawRedirect {
    listen: String,
}

fn default_http_listen() -> String {
    "127.0.0.1:8080".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSelection {
    #[serde(default = "default_policy")]
    policy: String,
    #[serde(default = "default_flight_ms")]
    notify_flight_time_ms: u64,
    #[serde(default = "default_release_window_secs")]
    release_window_secs: u64,
}

impl Default for RawSelection {
    fn default() -> Self {
        Self {
            policy: default_policy(),
            notify_flight_time_ms: default_flight_ms(),
            release_window_secs: default_release_window_secs(),
        }
    }
}

fn default_policy() -> String {
    SelectionPolicy::Pooled.name().to_owned()
}

fn default_flight_ms() -> u64 {
    u64::try_from(crate::estimate::DEFAULT_NOTIFY_FLIGHT_TIME.as_millis()).unwrap_or(20)
}

fn default_release_window_secs() -> u64 {
    DEFAULT_RELEASE_WINDOW.as_secs()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLegs {
    #[serde(default = "default_max_leg_secs")]
    max_duration_secs: u64,
    #[serde(default = "default_existing_threshold")]
    existing_conference_threshold: u32,
    #[serde(default = "default_new_threshold")]
    new_conference_threshold: u32,
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

fn default_max_leg_secs() -> u64 {
    crate::legs::DEFAULT_MAX_DURATION.as_secs()
}

fn default_existing_threshold() -> u32 {
    80
}

fn default_new_threshold() -> u32 {
    50
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    #[serde(default = "default_backend")]
    backend: String,
    endpoints: Option<Vec<String>>,
    prefix: Option<String>,
    lease_ttl_secs: Option<u64>,
    request_timeout_ms: Option<u64>,
    user: Option<String>,
    password: Option<String>,
    tls: Option<RawTls>,
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
struct RawTls {
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCluster {
    #[serde(default = "default_core_hosts")]
    core_hosts: u32,
}

impl Default for RawCluster {
    fn default() -> Self {
        Self {
            core_hosts: default_core_hosts(),
        }
    }
}

fn default_backend() -> String {
    "file".into()
}
fn default_core_hosts() -> u32 {
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
struct RawSip {
    #[serde(default = "default_listen")]
    listen: String,
    #[serde(default = "default_transports")]
    transports: Vec<String>,
    #[serde(default = "default_realm")]
    realm: String,
    #[serde(default = "default_nonce_ttl")]
    nonce_ttl_secs: u64,
    #[serde(default = "default_min_expires")]
    min_expires: u32,
    #[serde(default = "default_max_expires")]
    max_expires: u32,
    #[serde(default = "default_digest_algorithms")]
    digest_algorithms: Vec<String>,
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
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAccount {
    auth_name: String,
    password: String,
    #[serde(default)]
    msrs: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDefaults {
    #[serde(default = "default_zone")]
    zone: String,
    #[serde(default = "default_site")]
    site: String,
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
struct RawSubscription {
    #[serde(default = "default_event")]
    event: String,
    #[serde(default = "default_subscription_expires")]
    expires: u32,
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
struct RawHealth {
    #[serde(default = "default_keepalive_interval")]
    keepalive_interval_secs: u64,
    #[serde(default = "default_keepalive_timeout")]
    keepalive_timeout_ms: u64,
    #[serde(default = "default_keepalive_misses")]
    keepalive_misses: u32,
    #[serde(default = "default_unreported_grace")]
    unreported_grace_ms: u64,
}

impl Default for RawHealth {
    fn default() -> Self {
        Self {
            keepalive_interval_secs: default_keepalive_interval(),
            keepalive_timeout_ms: default_keepalive_timeout(),
            keepalive_misses: default_keepalive_misses(),
            unreported_grace_ms: default_unreported_grace(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawControl {
    #[serde(default = "default_socket")]
    socket: PathBuf,
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
struct RawState {
    #[serde(default = "default_state_path")]
    path: PathBuf,
}

impl Default for RawState {
    fn default() -> Self {
        Self {
            path: default_state_path(),
        }
    }
}

fn default_node() -> String {
    "core1@localhost".into()
}
fn default_listen() -> String {
    "127.0.0.1:5060".into()
}
fn default_transports() -> Vec<String> {
    vec!["udp".into()]
}
fn default_realm() -> String {
    "msr.local".into()
}
fn default_nonce_ttl() -> u64 {
    300
}
fn default_min_expires() -> u32 {
    10
}
fn default_max_expires() -> u32 {
    3600
}
fn default_digest_algorithms() -> Vec<String> {
    vec!["SHA-256".into(), "MD5".into()]
}
fn default_zone() -> String {
    "default".into()
}
fn default_site() -> String {
    "local".into()
}
fn default_event() -> String {
    msr_shared::event_package::EVENT.into()
}
fn default_subscription_expires() -> u32 {
    60
}
/// SPEC §5: an OPTIONS every 5 s.
fn default_keepalive_interval() -> u64 {
    5
}
/// Four retransmissions' worth of RFC 3261 T1 (500 ms): with the default
/// interval and misses, a silent contact is `unreachable` within
/// 5 + 2 × 2 = 9 s, inside SPEC §5's 10 s.
fn default_keepalive_timeout() -> u64 {
    2000
}
/// SPEC §5: two misses in a row.
fn default_keepalive_misses() -> u32 {
    2
}
/// SPEC §5: a short grace, 2 s.
fn default_unreported_grace() -> u64 {
    2000
}
fn default_socket() -> PathBuf {
    PathBuf::from("/run/msr-collector/control.sock")
}
fn default_state_path() -> PathBuf {
    PathBuf::from("/var/lib/msr-collector/operator.json")
}

/// Reads and validates the config file at `path`.
///
/// # Errors
/// [`ConfigError::Read`] when the file cannot be read, otherwise as [`parse`].
pub fn load(path: &Path) -> Result<CollectorConfig, ConfigError> {
    let origin = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| ConfigError::Read {
        origin: origin.clone(),
        source,
    })?;
    let text = std::str::from_utf8(&bytes).map_err(|e| {
        let valid = e.valid_up_to();
        // The prefix up to the error is valid UTF-8 by definition.
        let before = std::str::from_utf8(&bytes[..valid]).unwrap_or_default();
        let (line, column) = line_col(before, valid);
        ConfigError::Encoding {
            origin: origin.clone(),
            line,
            column,
            byte: bytes.get(valid).copied().unwrap_or_default(),
        }
    })?;
    parse(text, &origin)
}

/// `origin:line:column`, or `origin` alone without a position.
fn with_position(origin: &str, position: Option<(usize, usize)>) -> String {
    match position {
        Some((line, column)) => format!("{origin}:{line}:{column}"),
        None => origin.to_owned(),
    }
}

/// Parses and validates config text; `origin` names it in errors (a path,
/// or `<string>`).
///
/// # Errors
/// [`ConfigError::Syntax`] for broken TOML, unknown keys and wrong types;
/// [`ConfigError::Invalid`] for values out of range.
pub fn parse(text: &str, origin: &str) -> Result<CollectorConfig, ConfigError> {
    let raw: RawConfig = toml::from_str(text).map_err(|e| {
        let (line, column) = e
            .span()
            .map(|span| line_col(text, span.start))
            .unwrap_or((1, 1));
        let message = e.message().trim();
        let message = e
            .span()
            .and_then(|span| out_of_type_range(text, span.start, message))
            .unwrap_or_else(|| message.to_owned());
        ConfigError::Syntax {
            origin: origin.to_owned(),
            line,
            column,
            message,
        }
    })?;
    validate(raw, origin).map_err(|e| match e {
        ConfigError::Invalid {
            origin,
            position: None,
            key,
            value,
            expected,
        } => ConfigError::Invalid {
            origin,
            position: locate(text, &key),
            key,
            value,
            expected,
        },
        e => e,
    })
}

/// For the TOML parser's `invalid value: integer `N`, expected u32` (a
/// number outside its field's type) at `offset`: the message naming the
/// key as written and the range the type accepts, e.g. `[health]
/// keepalive_misses = -1: accepted 0..=4294967295` (the value is then
/// range-checked for its meaning; [`ConfigError::Invalid`] says how).
fn out_of_type_range(text: &str, offset: usize, message: &str) -> Option<String> {
    let rest = message.strip_prefix("invalid value: integer `")?;
    let (value, ty) = rest.split_once("`, expected ")?;
    let range = match ty {
        "u8" => format!("0..={}", u8::MAX),
        "u16" => format!("0..={}", u16::MAX),
        "u32" => format!("0..={}", u32::MAX),
        "u64" => format!("0..={}", u64::MAX),
        "usize" => format!("0..={}", usize::MAX),
        "i32" => format!("{}..={}", i32::MIN, i32::MAX),
        _ => return None,
    };
    let start = text.get(..offset)?.rfind('\n').map_or(0, |i| i + 1);
    let line = text.get(start..)?.lines().next()?;
    let key = line.split_once('=')?.0.trim();
    let table = text
        .get(..start)?
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))
        .map(|header| format!("{header} "))
        .unwrap_or_default();
    Some(format!("{table}{key} = {value}: accepted {range}"))
}

/// Where the value of the dotted `key` of a validation error is written
/// (`health.keepalive_misses`, `accounts[1].auth_name`,
/// `store.endpoints[0]`), as line and column of the value: the key's line
/// under its table's header (the n-th `[[accounts]]` for `accounts[n]`).
/// `None` when it is not written there (a missing key, a dotted or inline
/// table).
fn locate(text: &str, key: &str) -> Option<(usize, usize)> {
    let (table, name) = match key.rsplit_once('.') {
        Some((table, name)) => (Some(table), name),
        None => (None, key),
    };
    let name = name.split('[').next().unwrap_or(name);
    // `accounts[1]` is the second `[[accounts]]`.
    let (table, nth) = match table.and_then(|t| t.strip_suffix(']')?.split_once('[')) {
        Some((t, n)) => (Some(t), n.parse::<usize>().ok()?),
        None => (table, 0),
    };
    let mut current: Option<&str> = None;
    let mut seen = 0usize;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            let header = trimmed.split('#').next().unwrap_or(trimmed).trim();
            let inner = header.trim_start_matches('[').trim_end_matches(']').trim();
            if Some(inner) == table {
                seen += 1;
            }
            current = Some(inner);
            continue;
        }
        if current != table || seen != nth + usize::from(table.is_some()) {
            continue;
        }
        let Some((k, _)) = trimmed.split_once('=') else {
            continue;
        };
        if k.trim() == name {
            let eq = line.find('=')?;
            let value_start = eq + 1 + (line[eq + 1..].len() - line[eq + 1..].trim_start().len());
            return Some((i + 1, line[..value_start].chars().count() + 1));
        }
    }
    None
}

/// What keeps `realm` from being written inside the quoted string of a
/// `WWW-Authenticate` header (RFC 3261 §25.1 `quoted-string`), if anything:
/// it must be non-empty, without `"` or `\`, and of printable characters
/// (no control, format or invisible characters, no whitespace but the
/// space), so that it cannot end the string or the header.
fn realm_problem(realm: &str) -> Option<String> {
    if realm.is_empty() {
        return Some("it is empty".into());
    }
    realm
        .chars()
        .find(|&c| {
            c == '"'
                || c == '\\'
                || c.is_control()
                || names::is_invisible(c)
                || (c.is_whitespace() && c != ' ')
        })
        .map(|c| format!("character {} is not allowed", CharName(c)))
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

fn validate(raw: RawConfig, origin: &str) -> Result<CollectorConfig, ConfigError> {
    let invalid = |key: &str, value: String, expected: &str| ConfigError::Invalid {
        origin: origin.to_owned(),
        position: None,
        key: key.to_owned(),
        value,
        expected: expected.to_owned(),
    };
    let quoted = |s: &str| format!("{s:?}");

    if raw.node.trim().is_empty() || raw.node.chars().any(char::is_whitespace) {
        return Err(invalid(
            "node",
            quoted(&raw.node),
            "a non-empty name without spaces, e.g. \"core1@localhost\"",
        ));
    }
    let listen: SocketAddr = raw.sip.listen.parse().map_err(|_| {
        invalid(
            "sip.listen",
            quoted(&raw.sip.listen),
            "an ip:port socket address, e.g. \"127.0.0.1:5060\"",
        )
    })?;
    if listen.ip().is_unspecified() {
        // The address goes into the Contact of every SUBSCRIBE: MSRs send
        // their NOTIFYs there, so it must be one they can reach.
        return Err(invalid(
            "sip.listen",
            quoted(&raw.sip.listen),
            "a specific ip:port (it is the Contact MSRs send NOTIFYs to), not 0.0.0.0 or [::]",
        ));
    }
    let mut transports = BTreeSet::new();
    for t in &raw.sip.transports {
        match t.to_ascii_lowercase().as_str() {
            "udp" => transports.insert(Transport::Udp),
            "tcp" => transports.insert(Transport::Tcp),
            _ => return Err(invalid("sip.transports", quoted(t), "\"udp\" or \"tcp\"")),
        };
    }
    if !transports.contains(&Transport::Udp) {
        return Err(invalid(
            "sip.transports",
            format!("{:?}", raw.sip.transports),
            "a list containing \"udp\" (requests are sent over udp), optionally \"tcp\"",
        ));
    }
    let realm = raw.sip.realm.trim_matches(' ');
    if let Some(problem) = realm_problem(realm) {
        return Err(invalid(
            "sip.realm",
            quoted(&raw.sip.realm),
            &format!(
                "a non-empty digest realm of printable characters without `\"` or `\\`, \
                 e.g. \"msr.local\" ({problem})"
            ),
        ));
    }
    if raw.sip.nonce_ttl_secs == 0 || raw.sip.nonce_ttl_secs > 86_400 {
        return Err(invalid(
            "sip.nonce_ttl_secs",
            raw.sip.nonce_ttl_secs.to_string(),
            "seconds, 1 to 86400",
        ));
    }
    if raw.sip.min_expires == 0 {
        return Err(invalid(
            "sip.min_expires",
            raw.sip.min_expires.to_string(),
            "seconds, at least 1",
        ));
    }
    if raw.sip.max_expires < raw.sip.min_expires {
        return Err(invalid(
            "sip.max_expires",
            raw.sip.max_expires.to_string(),
            &format!(
                "seconds, at least sip.min_expires ({})",
                raw.sip.min_expires
            ),
        ));
    }
    let mut digest_algorithms = Vec::new();
    for a in &raw.sip.digest_algorithms {
        let Some(alg) = DigestAlgorithm::parse(a) else {
            return Err(invalid(
                "sip.digest_algorithms",
                quoted(a),
                "\"SHA-256\" or \"MD5\"",
            ));
        };
        if !digest_algorithms.contains(&alg) {
            digest_algorithms.push(alg);
        }
    }
    if digest_algorithms.is_empty() {
        return Err(invalid(
            "sip.digest_algorithms",
            "[]".into(),
            "at least one of \"SHA-256\", \"MD5\"",
        ));
    }
    let mut accounts: Vec<Account> = Vec::new();
    for (i, a) in raw.accounts.iter().enumerate() {
        if a.auth_name.is_empty()
            || a.auth_name.contains(['"', '\\'])
            || a.auth_name.chars().any(char::is_whitespace)
        {
            return Err(invalid(
                &format!("accounts[{i}].auth_name"),
                quoted(&a.auth_name),
                "a non-empty user name without spaces or quotes",
            ));
        }
        if accounts.iter().any(|b| b.auth_name == a.auth_name) {
            return Err(invalid(
                &format!("accounts[{i}].auth_name"),
                quoted(&a.auth_name),
                "a name not used by another account",
            ));
        }
        if a.password.is_empty() {
            return Err(invalid(
                &format!("accounts[{i}].password"),
                "\"\"".into(),
                "a non-empty password (auth_password of the MSR's <dynamic>)",
            ));
        }
        for (j, msr) in a.msrs.iter().enumerate() {
            if let Some(problem) = names::problem(NameKind::Msr, msr) {
                return Err(invalid(
                    &format!("accounts[{i}].msrs[{j}]"),
                    quoted(msr),
                    &format!("an msr name of {} ({problem})", NameKind::Msr.accepted()),
                ));
            }
        }
        accounts.push(Account {
            auth_name: a.auth_name.clone(),
            password: a.password.clone(),
            msrs: a.msrs.clone(),
        });
    }
    for (key, kind, value) in [
        ("defaults.zone", NameKind::Zone, &raw.defaults.zone),
        ("defaults.site", NameKind::Site, &raw.defaults.site),
    ] {
        if let Some(problem) = names::problem(kind, value) {
            return Err(invalid(
                key,
                quoted(value),
                &format!("a {kind} name of {} ({problem})", kind.accepted()),
            ));
        }
    }
    if raw.subscription.event != msr_shared::event_package::EVENT {
        return Err(invalid(
            "subscription.event",
            quoted(&raw.subscription.event),
            "\"eltex-call-count\"",
        ));
    }
    if raw.subscription.expires == 0 || raw.subscription.expires > 86_400 {
        return Err(invalid(
            "subscription.expires",
            raw.subscription.expires.to_string(),
            "seconds, 1 to 86400",
        ));
    }
    let health = validate_health(&raw.health, &invalid)?;
    if raw.control.socket.as_os_str().is_empty() {
        return Err(invalid(
            "control.socket",
            "\"\"".into(),
            "a path for the unix control socket",
        ));
    }
    if raw.state.path.as_os_str().is_empty() {
        return Err(invalid(
            "state.path",
            "\"\"".into(),
            "a path for the operator configuration file",
        ));
    }
    let store = validate_store(raw.store, origin)?;
    if raw.cluster.core_hosts == 0 || raw.cluster.core_hosts > 1024 {
        return Err(invalid(
            "cluster.core_hosts",
            raw.cluster.core_hosts.to_string(),
            "the number of core hosts, 1 to 1024",
        ));
    }
    if !(1..=7 * 86_400).contains(&raw.legs.max_duration_secs) {
        return Err(invalid(
            "legs.max_duration_secs",
            raw.legs.max_duration_secs.to_string(),
            "seconds, 1 to 604800 (7 days)",
        ));
    }
    for (key, value) in [
        (
            "legs.existing_conference_threshold",
            raw.legs.existing_conference_threshold,
        ),
        (
            "legs.new_conference_threshold",
            raw.legs.new_conference_threshold,
        ),
    ] {
        if !(1..=100).contains(&value) {
            return Err(invalid(
                key,
                value.to_string(),
                "percent of an msr's load limit, 1 to 100",
            ));
        }
    }
    let http = validate_http(raw.http, origin)?;
    let redirect = match raw.redirect {
        None => None,
        Some(r) => {
            let addr: SocketAddr = r.listen.parse().map_err(|_| {
                invalid(
                    "redirect.listen",
                    quoted(&r.listen),
                    "an ip:port socket address, e.g. \"127.0.0.1:5062\"",
                )
            })?;
            if addr.ip().is_unspecified() {
                return Err(invalid(
                    "redirect.listen",
                    quoted(&r.listen),
                    "a specific ip:port (a 302 must never point back at it), not 0.0.0.0 or [::]",
                ));
            }
            if addr.port() != 0 && addr == listen {
                return Err(invalid(
                    "redirect.listen",
                    quoted(&r.listen),
                    "an address other than sip.listen (the registrar's socket)",
                ));
            }
            Some(RedirectConfig { listen: addr })
        }
    };
    let policy = match raw.selection.policy.as_str() {
        "pooled" => SelectionPolicy::Pooled,
        "ecss" => SelectionPolicy::Ecss,
        other => {
            return Err(invalid(
                "selection.policy",
                format!("\"{other}\""),
                "\"pooled\" or \"ecss\"",
            ))
        }
    };
    if raw.selection.notify_flight_time_ms > 10_000 {
        return Err(invalid(
            "selection.notify_flight_time_ms",
            raw.selection.notify_flight_time_ms.to_string(),
            "milliseconds, 0 to 10000",
        ));
    }
    if !(1..=86_400).contains(&raw.selection.release_window_secs) {
        return Err(invalid(
            "selection.release_window_secs",
            raw.selection.release_window_secs.to_string(),
            "seconds, 1 to 86400",
        ));
    }
    Ok(CollectorConfig {
        http,
        redirect,
        node: raw.node,
        sip: SipConfig {
            listen,
            transports: transports.into_iter().collect(),
            realm: realm.to_owned(),
            nonce_ttl: Duration::from_secs(raw.sip.nonce_ttl_secs),
            min_expires: raw.sip.min_expires,
            max_expires: raw.sip.max_expires,
            digest_algorithms,
        },
        accounts,
        defaults: Defaults {
            zone: raw.defaults.zone,
            site: raw.defaults.site,
        },
        subscription: SubscriptionDefaults {
            event: raw.subscription.event,
            expires: raw.subscription.expires,
        },
        health,
        control_socket: raw.control.socket,
        state_path: raw.state.path,
        store,
        cluster: ClusterConfig {
            core_hosts: raw.cluster.core_hosts,
        },
        legs: LegsConfig {
            max_duration: Duration::from_secs(raw.legs.max_duration_secs),
            existing_conference_threshold: f64::from(raw.legs.existing_conference_threshold)
                / 100.0,
            new_conference_threshold: f64::from(raw.legs.new_conference_threshold) / 100.0,
        },
        selection: SelectionConfig {
            policy,
            notify_flight_time: Duration::from_millis(raw.selection.notify_flight_time_ms),
            release_window: Duration::from_secs(raw.selection.release_window_secs),
        },
    })
}

/// `[http]`: on at `127.0.0.1:8080` unless `listen = "off"` (SPEC §11);
/// a loopback `listen` may go without a token; any other address needs one
/// (SPEC §11: loopback by default), and a token is printable ASCII without
/// spaces, 16–256 bytes (RFC 6750 §2.1 `b64token`).
fn validate_http(raw: RawHttp, origin: &str) -> Result<Option<HttpConfig>, ConfigError> {
    let invalid = |key: &str, value: String, expected: &str| ConfigError::Invalid {
        origin: origin.to_owned(),
        position: None,
        key: key.to_owned(),
        value,
        expected: expected.to_owned(),
    };
    if raw.listen == HTTP_OFF {
        if raw.token.is_some() {
            return Err(invalid(
                "http.token",
                "(hidden)".into(),
                "no token with listen = \"off\" (there is no listener to guard)",
            ));
        }
        return Ok(None);
    }
    let listen: SocketAddr = raw.listen.parse().map_err(|_| {
        invalid(
            "http.listen",
            format!("{:?}", raw.listen),
            "an ip:port socket address, e.g. \"127.0.0.1:8080\", or \"off\"",
        )
    })?;
    if let Some(token) = &raw.token {
        let b64token = |c: char| c.is_ascii_alphanumeric() || "-._~+/=".contains(c);
        if !(16..=256).contains(&token.len()) || !token.chars().all(b64token) {
            return Err(invalid(
                "http.token",
                "(hidden)".into(),
                "16 to 256 characters of A-Z a-z 0-9 - . _ ~ + / = (an RFC 6750 bearer token)",
            ));
        }
    }
    if !listen.ip().is_loopback() && raw.token.is_none() {
        return Err(invalid(
            "http.listen",
            format!("{:?}", raw.listen),
            "a loopback address (127.0.0.1, [::1]) unless http.token is set: \
             the api changes call state and shows the msrs",
        ));
    }
    Ok(Some(HttpConfig {
        listen,
        token: raw.token,
    }))
}

/// `[store]`: `backend = "file"` takes no other key (a stray etcd key is a
/// mistake the operator should hear about); `backend = "etcd"` needs
/// `endpoints` and checks every key.
fn validate_store(raw: RawStore, origin: &str) -> Result<StoreBackend, ConfigError> {
    let invalid = |key: &str, value: String, expected: &str| ConfigError::Invalid {
        origin: origin.to_owned(),
        position: None,
        key: key.to_owned(),
        value,
        expected: expected.to_owned(),
    };
    let quoted = |s: &str| format!("{s:?}");
    match raw.backend.as_str() {
        "file" => {
            let stray = [
                ("store.endpoints", raw.endpoints.is_some()),
                ("store.prefix", raw.prefix.is_some()),
                ("store.lease_ttl_secs", raw.lease_ttl_secs.is_some()),
                ("store.request_timeout_ms", raw.request_timeout_ms.is_some()),
                ("store.user", raw.user.is_some()),
                ("store.password", raw.password.is_some()),
                ("store.tls", raw.tls.is_some()),
            ];
            if let Some((key, _)) = stray.iter().find(|(_, set)| *set) {
                return Err(invalid(
                    "store.backend",
                    quoted("file"),
                    &format!(
                        "\"etcd\" when `{key}` is set (the file store uses [state] path only)"
                    ),
                ));
            }
            return Ok(StoreBackend::File);
        }
        "etcd" => {}
        other => {
            return Err(invalid(
                "store.backend",
                quoted(other),
                "\"file\" or \"etcd\"",
            ))
        }
    }
    let endpoints = raw.endpoints.unwrap_or_default();
    if endpoints.is_empty() {
        return Err(invalid(
            "store.endpoints",
            "[]".into(),
            "at least one etcd endpoint, e.g. [\"http://127.0.0.1:2379\"]",
        ));
    }
    let mut https = None;
    for (i, endpoint) in endpoints.iter().enumerate() {
        let (scheme, rest) = match endpoint.split_once("://") {
            Some((scheme @ ("http" | "https"), rest)) => (scheme, rest),
            _ => ("", ""),
        };
        let port_ok = rest.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
        });
        if scheme.is_empty() || !port_ok || rest.contains(['/', '?', '#', '@', ' ']) {
            return Err(invalid(
                &format!("store.endpoints[{i}]"),
                quoted(endpoint),
                "an etcd client url `http://host:port` or `https://host:port`, e.g. \"http://127.0.0.1:2379\"",
            ));
        }
        let this = scheme == "https";
        if *https.get_or_insert(this) != this {
            return Err(invalid(
                &format!("store.endpoints[{i}]"),
                quoted(endpoint),
                "the same scheme as the other endpoints (all http:// or all https://)",
            ));
        }
    }
    let https = https.unwrap_or(false);
    let prefix = raw.prefix.unwrap_or_else(|| DEFAULT_ETCD_PREFIX.to_owned());
    if prefix.is_empty()
        || !prefix.ends_with('/')
        || prefix
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || names::is_invisible(c))
    {
        return Err(invalid(
            "store.prefix",
            quoted(&prefix),
            "a key prefix ending in `/` without spaces or control characters, e.g. \"/msr-collector/\"",
        ));
    }
    let ttl = raw.lease_ttl_secs.unwrap_or(DEFAULT_LEASE_TTL_SECS);
    if !(2..=300).contains(&ttl) {
        return Err(invalid(
            "store.lease_ttl_secs",
            ttl.to_string(),
            "seconds, 2 to 300 (how long a stopped collector stays in the member list)",
        ));
    }
    let timeout = raw.request_timeout_ms.unwrap_or(DEFAULT_REQUEST_TIMEOUT_MS);
    if !(100..=60_000).contains(&timeout) {
        return Err(invalid(
            "store.request_timeout_ms",
            timeout.to_string(),
            "milliseconds, 100 to 60000",
        ));
    }
    let user = match (raw.user, raw.password) {
        (None, None) => None,
        (Some(user), Some(password)) => {
            if user.is_empty() || user.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(invalid(
                    "store.user",
                    quoted(&user),
                    "a non-empty etcd user name without spaces",
                ));
            }
            if password.is_empty() {
                return Err(invalid(
                    "store.password",
                    "\"\"".into(),
                    "a non-empty password",
                ));
            }
            Some((user, password))
        }
        (Some(user), None) => {
            return Err(invalid(
                "store.user",
                quoted(&user),
                "`store.password` beside it (both or neither)",
            ))
        }
        (None, Some(_)) => {
            return Err(invalid(
                "store.password",
                "\"<redacted>\"".into(),
                "`store.user` beside it (both or neither)",
            ))
        }
    };
    let tls = match raw.tls {
        None if https => {
            return Err(invalid(
                "store.tls",
                "(missing)".into(),
                "a [store.tls] table with `ca` for https:// endpoints",
            ))
        }
        None => None,
        Some(_) if !https => {
            return Err(invalid(
                "store.endpoints",
                format!("{endpoints:?}"),
                "https:// endpoints when [store.tls] is set",
            ))
        }
        Some(tls) => {
            let Some(ca) = tls.ca.filter(|p| !p.as_os_str().is_empty()) else {
                return Err(invalid(
                    "store.tls.ca",
                    "(missing)".into(),
                    "the path of the pem file of the ca that signed etcd's certificate",
                ));
            };
            let identity = match (tls.cert, tls.key) {
                (None, None) => None,
                (Some(cert), Some(key)) => Some((cert, key)),
                (Some(cert), None) => {
                    return Err(invalid(
                        "store.tls.cert",
                        quoted(&cert.display().to_string()),
                        "`store.tls.key` beside it (both or neither)",
                    ))
                }
                (None, Some(key)) => {
                    return Err(invalid(
                        "store.tls.key",
                        quoted(&key.display().to_string()),
                        "`store.tls.cert` beside it (both or neither)",
                    ))
                }
            };
            Some(EtcdTls { ca, identity })
        }
    };
    Ok(StoreBackend::Etcd(EtcdConfig {
        endpoints,
        prefix,
        lease_ttl: Duration::from_secs(ttl),
        request_timeout: Duration::from_millis(timeout),
        user,
        tls,
    }))
}

/// The `[health]` values, each within its range, the timeout within the
/// interval.
fn validate_health(
    raw: &RawHealth,
    invalid: &dyn Fn(&str, String, &str) -> ConfigError,
) -> Result<HealthConfig, ConfigError> {
    if !(1..=3600).contains(&raw.keepalive_interval_secs) {
        return Err(invalid(
            "health.keepalive_interval_secs",
            raw.keepalive_interval_secs.to_string(),
            "seconds, 1 to 3600",
        ));
    }
    let interval_ms = raw.keepalive_interval_secs * 1000;
    if !(100..=interval_ms).contains(&raw.keepalive_timeout_ms) {
        return Err(invalid(
            "health.keepalive_timeout_ms",
            raw.keepalive_timeout_ms.to_string(),
            &format!("milliseconds, 100 to {interval_ms} (health.keepalive_interval_secs × 1000)"),
        ));
    }
    if !(1..=100).contains(&raw.keepalive_misses) {
        return Err(invalid(
            "health.keepalive_misses",
            raw.keepalive_misses.to_string(),
            "1 to 100",
        ));
    }
    if raw.unreported_grace_ms > 600_000 {
        return Err(invalid(
            "health.unreported_grace_ms",
            raw.unreported_grace_ms.to_string(),
            "milliseconds, 0 to 600000",
        ));
    }
    Ok(HealthConfig {
        keepalive_interval: Duration::from_secs(raw.keepalive_interval_secs),
        keepalive_timeout: Duration::from_millis(raw.keepalive_timeout_ms),
        keepalive_misses: raw.keepalive_misses,
        unreported_grace: Duration::from_millis(raw.unreported_grace_ms),
    })
}

#[cfg(test)]
mod tests;
