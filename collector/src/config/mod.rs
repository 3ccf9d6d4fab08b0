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

use msr_shared::present::format_number;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod positions;
mod raw;
mod validate;

use positions::{beyond_toml, line_col, locate, out_of_type, with_position, wrong_type};
use raw::*;
pub use raw::{
    DEFAULT_ETCD_PREFIX, DEFAULT_LEASE_TTL_SECS, DEFAULT_REQUEST_TIMEOUT_MS,
    DEFAULT_SUBSCRIPTION_EXPIRES_SECS, HTTP_OFF,
};
use validate::validate;

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
    /// The file is larger than [`MAX_CONFIG_BYTES`].
    #[error(
        "{origin}: the file has more than {limit} bytes, more than a collector config needs \
         (is this the right file?)"
    )]
    TooLarge {
        /// The file path.
        origin: String,
        /// [`MAX_CONFIG_BYTES`].
        limit: usize,
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
    /// TLS listener ([`SipTls::listen`], RFC 3261 §26).
    Tls,
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
            Transport::Tls => "tls",
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
    pub defaults: crate::operator::Placement,
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

/// The settings of `new` that differ from `running` and take a restart
/// to apply (SPEC §13 reload): what the process bound or opened at start.
/// Everything else applies live ([`crate::core::Collector::reconfigure`]).
pub fn restart_needed(running: &CollectorConfig, new: &CollectorConfig) -> Vec<&'static str> {
    let mut keys = Vec::new();
    let mut differs = |changed: bool, key: &'static str| {
        if changed {
            keys.push(key);
        }
    };
    differs(running.node != new.node, "node");
    differs(running.sip.listen != new.sip.listen, "sip.listen");
    differs(
        running.sip.transports != new.sip.transports,
        "sip.transports",
    );
    differs(
        running.sip.tls.as_ref().map(|t| t.listen) != new.sip.tls.as_ref().map(|t| t.listen),
        "sip.tls",
    );
    differs(
        running.control_socket != new.control_socket,
        "control.socket",
    );
    differs(running.state_path != new.state_path, "state.path");
    differs(running.store != new.store, "store");
    differs(running.http != new.http, "http");
    differs(running.redirect != new.redirect, "redirect");
    keys
}

/// The settings a reload applies live that differ between `running` and
/// `new`, each as `(table, from, to)` for the log (SPEC §16); accounts are
/// shown without their passwords.
pub fn reload_changes(
    running: &CollectorConfig,
    new: &CollectorConfig,
) -> Vec<(&'static str, String, String)> {
    let mut out = Vec::new();
    let mut differs = |key: &'static str, from: String, to: String| {
        if from != to {
            out.push((key, from, to));
        }
    };
    let secs = |d: Duration| d.as_secs().to_string();
    let ms = |d: Duration| d.as_millis().to_string();
    // One line per key, named as in the file (SPEC §16: "each value it
    // changed"), the values as the file writes them.
    let (a, b) = (running, new);
    differs(
        "defaults.zone",
        a.defaults.zone.to_string(),
        b.defaults.zone.to_string(),
    );
    differs(
        "defaults.site",
        a.defaults.site.to_string(),
        b.defaults.site.to_string(),
    );
    differs(
        "subscription.event",
        a.subscription.event.clone(),
        b.subscription.event.clone(),
    );
    differs(
        "subscription.expires",
        a.subscription.expires.to_string(),
        b.subscription.expires.to_string(),
    );
    let (h, k) = (&a.health, &b.health);
    differs(
        "health.keepalive_interval_secs",
        secs(h.keepalive_interval),
        secs(k.keepalive_interval),
    );
    differs(
        "health.keepalive_timeout_ms",
        ms(h.keepalive_timeout),
        ms(k.keepalive_timeout),
    );
    differs(
        "health.keepalive_misses",
        h.keepalive_misses.to_string(),
        k.keepalive_misses.to_string(),
    );
    differs(
        "health.unreported_grace_ms",
        ms(h.unreported_grace),
        ms(k.unreported_grace),
    );
    differs(
        "health.failure_timeouts",
        h.failures.timeouts.to_string(),
        k.failures.timeouts.to_string(),
    );
    differs(
        "health.failure_errors",
        h.failures.errors.to_string(),
        k.failures.errors.to_string(),
    );
    differs(
        "health.failure_window_secs",
        secs(h.failures.window),
        secs(k.failures.window),
    );
    differs(
        "health.failure_hold_secs",
        secs(h.failures.hold),
        secs(k.failures.hold),
    );
    differs(
        "legs.max_duration_secs",
        secs(a.legs.max_duration),
        secs(b.legs.max_duration),
    );
    // Thresholds are percent in the file.
    let percent = |f: f64| format_number(f * 100.0);
    differs(
        "legs.existing_conference_threshold",
        percent(a.legs.existing_conference_threshold),
        percent(b.legs.existing_conference_threshold),
    );
    differs(
        "legs.new_conference_threshold",
        percent(a.legs.new_conference_threshold),
        percent(b.legs.new_conference_threshold),
    );
    let (x, y) = (&a.selection, &b.selection);
    differs(
        "selection.policy",
        x.policy.name().to_owned(),
        y.policy.name().to_owned(),
    );
    differs(
        "selection.notify_flight_time_ms",
        ms(x.notify_flight_time),
        ms(y.notify_flight_time),
    );
    differs(
        "selection.release_window_secs",
        secs(x.release_window),
        secs(y.release_window),
    );
    differs(
        "selection.failover_attempts",
        x.failover_attempts.to_string(),
        y.failover_attempts.to_string(),
    );
    differs(
        "cluster.core_hosts",
        a.cluster.core_hosts.to_string(),
        b.cluster.core_hosts.to_string(),
    );
    // Accounts by name; a password is never logged, only that it changed.
    let names = |c: &CollectorConfig| {
        c.accounts
            .iter()
            .map(|acc| acc.auth_name.clone())
            .collect::<Vec<_>>()
            .join(",")
    };
    differs("accounts", names(a), names(b));
    let changed_passwords: Vec<&str> = b
        .accounts
        .iter()
        .filter(|nb| {
            a.accounts.iter().any(|na| {
                na.auth_name == nb.auth_name && (na.password != nb.password || na.msrs != nb.msrs)
            })
        })
        .map(|acc| acc.auth_name.as_str())
        .collect();
    if !changed_passwords.is_empty() {
        out.push((
            "accounts.password_or_msrs",
            "-".to_owned(),
            format!("changed for {}", changed_passwords.join(",")),
        ));
    }
    out
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
    /// `allow`: the softswitch hosts (addresses or networks) whose INVITEs
    /// are served; anything else is dropped unread, since each INVITE
    /// places a leg. Default: the listen address's own host.
    pub allow: Vec<ipnet::IpNet>,
    /// `transports = ["udp", "tcp"]`: INVITEs over TCP too, on the same
    /// address and port (RFC 3261 §18: a proxy may send over either).
    pub tcp: bool,
    /// `transports` with `"tls"`: INVITEs over TLS on `tls_listen`, with
    /// `[sip.tls]`'s certificate (and its `client_ca`, when set).
    pub tls_listen: Option<SocketAddr>,
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
    /// `failover_attempts`: the MSRs one leg may be given in all, the
    /// first and those after each failure its core reports (SPEC §14);
    /// default 3.
    pub failover_attempts: u32,
}

/// `[selection] failover_attempts` when unset.
pub const DEFAULT_FAILOVER_ATTEMPTS: u32 = 3;

impl Default for SelectionConfig {
    fn default() -> Self {
        Self {
            policy: SelectionPolicy::Pooled,
            notify_flight_time: crate::model::estimate::DEFAULT_NOTIFY_FLIGHT_TIME,
            release_window: DEFAULT_RELEASE_WINDOW,
            failover_attempts: DEFAULT_FAILOVER_ATTEMPTS,
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
    /// `[sip.tls]`: present exactly when [`Transport::Tls`] is among the
    /// transports.
    pub tls: Option<SipTls>,
}

impl SipConfig {
    /// Whether a TCP listener is configured besides UDP.
    pub fn tcp(&self) -> bool {
        self.transports.contains(&Transport::Tcp)
    }
}

/// `[sip.tls]`: SIP over TLS (RFC 3261 §26, SPEC §4). The files are read
/// when the collector starts and on every reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SipTls {
    /// The TLS listener's address (the `sips:` Contact of the collector's
    /// SUBSCRIBEs over TLS); port 0 picks a free port.
    pub listen: SocketAddr,
    /// The collector's certificate chain (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// Mutual TLS: when set, a TLS peer must present a client certificate
    /// that chains to one of these CAs (PEM), or the handshake fails.
    pub client_ca: Option<PathBuf>,
    /// Whether REGISTER and NOTIFY are taken over TLS only; over UDP or
    /// TCP they are answered `403`.
    pub require: bool,
}

/// The TLS port when `[sip.tls] listen` is not given (RFC 3261 §26.2.2,
/// as 5060 is for UDP and TCP).
pub const DEFAULT_TLS_PORT: u16 = 5061;

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
    /// What the failures a core reports (SPEC §14) take to put an MSR
    /// out of selection.
    pub failures: FailureLimits,
}

/// `[health] failure_*`: when the failures cores report against an MSR
/// take it out of selection (SPEC §14), and for how long at least.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureLimits {
    /// Timeouts (no answer from the engine, a 408) within `window` that
    /// trip the MSR; default 1: an engine that lets a call time out is
    /// taken as down at once.
    pub timeouts: u32,
    /// Errors (a 5xx, an rtpengine error or load-limit answer) within
    /// `window` that trip it; default 3.
    pub errors: u32,
    /// The window the counts are taken over; default 10 s.
    pub window: Duration,
    /// The least time a tripped MSR stays out; it doubles each time the
    /// MSR trips again within this much of its return (up to
    /// [`MAX_FAILURE_HOLD`]), so an engine that fails every call does not
    /// flap back into selection. Default 10 s.
    pub hold: Duration,
}

/// The longest a tripped MSR's hold grows to.
pub const MAX_FAILURE_HOLD: Duration = Duration::from_secs(300);

impl Default for FailureLimits {
    fn default() -> Self {
        Self {
            timeouts: 1,
            errors: 3,
            window: Duration::from_secs(10),
            hold: Duration::from_secs(10),
        }
    }
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            keepalive_interval: Duration::from_secs(default_keepalive_interval()),
            keepalive_timeout: Duration::from_millis(default_keepalive_timeout()),
            keepalive_misses: default_keepalive_misses(),
            unreported_grace: Duration::from_millis(default_unreported_grace()),
            failures: FailureLimits::default(),
        }
    }
}

/// The largest config file read: the collector's is kilobytes (its
/// accounts, a line or two each, make the most of it); a file this large
/// is not one, and reading it (SIGHUP re-reads whatever is at the path)
/// must not stall the host.
pub const MAX_CONFIG_BYTES: usize = 4 * 1024 * 1024;

/// Reads and validates the config file at `path`.
///
/// # Errors
/// [`ConfigError::Read`] when the file cannot be read, [`ConfigError::TooLarge`]
/// past [`MAX_CONFIG_BYTES`] (only that much is read), otherwise as [`parse`].
pub fn load(path: &Path) -> Result<CollectorConfig, ConfigError> {
    let origin = path.display().to_string();
    let bytes = msr_shared::fs::read_at_most(path, MAX_CONFIG_BYTES).map_err(|source| {
        ConfigError::Read {
            origin: origin.clone(),
            source,
        }
    })?;
    if bytes.len() > MAX_CONFIG_BYTES {
        return Err(ConfigError::TooLarge {
            origin,
            limit: MAX_CONFIG_BYTES,
        });
    }
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
        if let Some(span) = e.span() {
            if let Some(outside) = out_of_type(text, span.start, message) {
                let expected = key_range(text, span, &outside.key, outside.max)
                    .unwrap_or_else(|| outside.type_range());
                return ConfigError::Invalid {
                    origin: origin.to_owned(),
                    position: Some((line, column)),
                    key: outside.key,
                    value: outside.value,
                    expected,
                };
            }
            if let Some(beyond) = beyond_toml(text, span.start, message) {
                // The key's range as for any number outside its type: the
                // file read again with the nearest number TOML can write
                // in the value's place, which the key's own checks (or its
                // type's) then refuse, naming what it accepts.
                let end = span.start + beyond.value.len();
                let expected = text
                    .get(..span.start)
                    .zip(text.get(end..))
                    .map(|(before, after)| format!("{before}{}{after}", beyond.nearest()))
                    .and_then(|patched| match parse(&patched, origin) {
                        Err(ConfigError::Invalid { key, expected, .. }) if key == beyond.key => {
                            Some(expected)
                        }
                        _ => None,
                    })
                    .unwrap_or_else(|| beyond.toml_range());
                return ConfigError::Invalid {
                    origin: origin.to_owned(),
                    position: Some((line, column)),
                    key: beyond.key,
                    value: beyond.value,
                    expected,
                };
            }
            if let Some(wrong) = wrong_type(text, span.clone(), message) {
                // A number key says its own range, as above.
                let expected = wrong
                    .max
                    .and_then(|max| key_range(text, span, &wrong.key, max))
                    .map_or(wrong.expected, |range| format!("a whole number, {range}"));
                return ConfigError::Invalid {
                    origin: origin.to_owned(),
                    position: Some((line, column)),
                    key: wrong.key,
                    value: wrong.value,
                    expected,
                };
            }
        }
        ConfigError::Syntax {
            origin: origin.to_owned(),
            line,
            column,
            message: message.to_owned(),
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

/// The range of the dotted `key` whose value at `span` is outside its
/// type, or of the wrong type, as its own check states it: the file is
/// validated again with `max`, the type's largest value, in its place, and the
/// key's range check, where there is one, refuses that and says what the
/// key accepts. `None` when nothing but the type bounds the key, or
/// another error comes first. The ranges stay in one place, the checks
/// of `validate`.
fn key_range(text: &str, span: std::ops::Range<usize>, key: &str, max: u64) -> Option<String> {
    let patched = format!(
        "{}{}{}",
        text.get(..span.start)?,
        max,
        text.get(span.end..)?
    );
    let raw: RawConfig = toml::from_str(&patched).ok()?;
    match validate(raw, "") {
        Err(ConfigError::Invalid {
            key: refused,
            expected,
            ..
        }) if refused == key => Some(expected),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
