//! The MSR's XML config as the agent reads it (SPEC §2).
//!
//! The agent reads the media server's own config file unchanged. Only the
//! elements and attributes listed in SPEC §2 are used; everything else belongs
//! to the media engine and is ignored without error. Agent-only settings come
//! from the optional, strictly checked `<agent …/>` element.
//!
//! Reading happens in two steps:
//!
//! 1. a `quick_xml::Reader` pass checks that the file is well formed (root
//!    `<config>`, every element closed, no duplicated sections) and reports
//!    the `line:column` of the first problem; the same pass collects the
//!    attribute names of `<agent>` for the strict check, and the attributes
//!    of `<codec>`, whose names (the engine's codecs) no fixed struct lists;
//! 2. serde deserializes the raw structs in `xml` (every attribute an
//!    `Option<String>`), and `validate` converts them into the typed
//!    [`AgentConfig`], naming element, attribute, value and the accepted
//!    values on every error.
//!
//! Invariant: an [`AgentConfig`] only exists if every value in it satisfies
//! the constraints documented on its fields.
//!
//! Hot reload lives in [`mod@watch`] ([`watch()`]).

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use msr_shared::media::{Codec, CodecList, Kind};

/// The default high-water mark, percent of `load` (SPEC §4: 80 %): at or
/// above it every change of `calls` is notified.
pub const DEFAULT_HIGH_WATER: u8 = 80;

mod error;
mod validate;
pub mod watch;
mod xml;

#[cfg(test)]
mod tests;

pub use error::{ConfigError, PortSetting, Position, ValueProblem};
pub use watch::{watch, WatchGuard};

/// Default registration expiry in seconds (SPEC §3), used when
/// `<agent register-expires>` is absent.
pub const DEFAULT_REGISTER_EXPIRES: u32 = 300;
/// Default upper bound in seconds for a granted SUBSCRIBE expiry (SPEC §4).
pub const DEFAULT_MAX_SUBSCRIPTION_EXPIRES: u32 = 3600;
/// Default minimum interval between two NOTIFYs of one subscription, in
/// milliseconds (SPEC §4: at most one per second).
pub const DEFAULT_NOTIFY_MIN_INTERVAL_MS: u64 = 1000;
/// Default minimum interval between two NOTIFYs of one subscription near
/// the top (`load` at or above the high-water mark), in milliseconds (SPEC
/// §4, §10): near the top every call counts, and with several core hosts
/// each learns the others' calls only from the reports: with 30 s calls a
/// report 250 ms apart still left three and ten core hosts well above the
/// pooled limit (BALANCING.md, "Reports near the top").
pub const DEFAULT_NOTIFY_TOP_INTERVAL_MS: u64 = 50;
/// Default load sampling interval in milliseconds (SPEC §2).
pub const DEFAULT_SAMPLE_INTERVAL_MS: u64 = 1000;
/// Default time between two probes of the media engine, milliseconds
/// (SPEC §14: every few seconds).
pub const DEFAULT_ENGINE_PROBE_INTERVAL_MS: u64 = 2000;
/// Default time a probe of the media engine may go unanswered, milliseconds.
pub const DEFAULT_ENGINE_PROBE_TIMEOUT_MS: u64 = 1000;
/// Default probes missed in a row that make the engine `down`: with the
/// interval and timeout above, a dead engine is seen within about 4 s.
pub const DEFAULT_ENGINE_PROBE_MISSES: u32 = 2;

/// The validated agent configuration (SPEC §2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentConfig {
    /// `<general>`: logging, capacity and load reporting.
    pub general: General,
    /// `<transport>`: the media engine's SIP address (where a core sends
    /// the INVITE that parks a leg on this MSR, SPEC §3). The agent binds
    /// the same `bind-addr` on its own port ([`AgentSettings::sip_port`]).
    pub transport: TransportConfig,
    /// `<pbyte>/<mcc>`: the media engine's media-control address, reported
    /// to the core with each REGISTER (SPEC §3); `None` without the element.
    pub mcc: Option<SocketAddr>,
    /// `<media>`: the RTP port range used to count media sessions.
    pub media: MediaConfig,
    /// `<accounts>/<dynamic>`: one registration per element, in file order.
    /// May be empty (no `<accounts>` element). No two accounts share both
    /// `msr_name` and realm URI.
    pub accounts: Vec<Account>,
    /// `<agent>`: agent-only settings; defaults when the element is absent.
    pub agent: AgentSettings,
    /// `<codec>`: what media the MSR takes, in its priority order
    /// ([`codec_list`]), reported in every NOTIFY as `codecs:` (SPEC §4,
    /// §15); `None` without the element: not known, no `codecs:` line.
    pub codecs: Option<CodecList>,
    /// What loads but is likely a mistake: no `<dynamic>` account (the
    /// agent registers nowhere), a codec name in another case (names are
    /// matched exactly, as the engine reads them), or every codec off.
    /// Said by `--check-config`, logged at start and at a reload.
    pub warnings: Vec<String>,
}

impl AgentConfig {
    /// This config with the agent's SIP port set to `port` (`--sip-port`),
    /// checked as `<agent sip-port>` is ([`ConfigError::PortCollision`]);
    /// `origin` names the file in the error.
    ///
    /// # Errors
    /// [`ConfigError::PortCollision`].
    pub fn with_sip_port(mut self, port: u16, origin: &Path) -> Result<Self, ConfigError> {
        self.agent.sip_port = port;
        validate::check_sip_port(&self, origin, PortSetting::Flag)?;
        Ok(self)
    }

    /// This config with its NOTIFY and sampling intervals divided by
    /// `scale` (`--time-scale`, [`AgentSettings::time_scale`]).
    pub fn with_time_scale(mut self, scale: u32) -> Self {
        self.agent.time_scale = scale.max(1);
        self
    }
}

impl AgentConfig {
    /// `<codec>` as logged and shown: the `codecs:` line's value
    /// (`pcma,pcmu,h264`, `none`), or `not reported` without the element
    /// (SPEC §4).
    pub fn codecs_shown(&self) -> String {
        self.codecs
            .map_or_else(|| "not reported".to_owned(), |c| c.to_string())
    }

    /// The MSRs of the accounts whose realm is `sips:`: registered over
    /// TLS, with the client certificate when there is one.
    pub fn tls_msrs(&self) -> impl Iterator<Item = &str> {
        self.accounts
            .iter()
            .filter(|a| a.realm.is_sips())
            .map(|a| a.msr_name.as_str())
    }

    /// Where the `rtpengine` calls source asks (`<pbyte><mcc>`; an
    /// unspecified `bind-addr`, rtpengine listening on every address, is
    /// asked on loopback); `None` for the other sources.
    pub fn ng_address(&self) -> Option<SocketAddr> {
        if self.agent.calls_source != CallsSource::Rtpengine {
            return None;
        }
        let mcc = self.mcc?;
        let ip = match mcc.ip() {
            IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        Some(SocketAddr::new(ip, mcc.port()))
    }
}

/// The hosts that may SUBSCRIBE to the agent and receive its NOTIFYs
/// (SPEC §4), as the config names them ([`AgentConfig::subscriber_hosts`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubscriberHosts {
    /// Realm hosts written as IP addresses, and `<agent allow-subscribers>`;
    /// canonical ([`IpAddr::to_canonical`]).
    pub addresses: BTreeSet<IpAddr>,
    /// Realm hosts written as names, to be resolved.
    pub names: BTreeSet<String>,
}

impl AgentConfig {
    /// The registrars — the hosts of the `<dynamic realm>` URIs — and
    /// `<agent allow-subscribers>`: who may SUBSCRIBE (SPEC §4).
    pub fn subscriber_hosts(&self) -> SubscriberHosts {
        let mut hosts = SubscriberHosts::default();
        for account in &self.accounts {
            let host = &account.realm.host;
            let bare = host
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(host);
            match bare.parse::<IpAddr>() {
                Ok(ip) => {
                    hosts.addresses.insert(ip.to_canonical());
                }
                Err(_) => {
                    hosts.names.insert(host.clone());
                }
            }
        }
        hosts.addresses.extend(
            self.agent
                .allow_subscribers
                .iter()
                .map(|ip| ip.to_canonical()),
        );
        hosts
    }
}

/// `<general>` (SPEC §2). The element is required.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct General {
    /// `log-level`, media-engine verbosity (0–255), if given.
    pub log_level: Option<u8>,
    /// `max-calls` (required): capacity of the MSR in media sessions, > 0.
    pub max_calls: u32,
    /// `load-sensor` (required): which figure is reported as `load`.
    pub load_sensor: LoadSensor,
    /// `load-delta`: NOTIFY when `load` moved by at least this many
    /// percentage points since the last NOTIFY (SPEC §4); 1..=100,
    /// [`DEFAULT_LOAD_DELTA`] when absent.
    pub load_delta: u8,
}

/// Default `load-delta` in percentage points when the attribute is absent
/// (the value of the seed config).
pub const DEFAULT_LOAD_DELTA: u8 = 10;

/// `<general load-sensor>` (SPEC §2): which figure is reported as `load`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LoadSensor {
    /// `cpu`: host CPU utilisation in percent over the last sampling window.
    Cpu,
    /// `calls`: 100 × media sessions / `max-calls`.
    Calls,
    /// `media`: the larger of `cpu` and `calls`.
    Media,
}

impl LoadSensor {
    /// The accepted attribute values, in the order error messages list them.
    pub const ACCEPTED: &'static [&'static str] = &["cpu", "calls", "media"];

    /// The attribute value naming this sensor.
    pub fn as_str(self) -> &'static str {
        match self {
            LoadSensor::Cpu => "cpu",
            LoadSensor::Calls => "calls",
            LoadSensor::Media => "media",
        }
    }
}

impl std::fmt::Display for LoadSensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `<transport>` (SPEC §2): the media engine's SIP socket. The element is
/// required.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportConfig {
    /// `bind-addr` (required): the engine's IPv4 or IPv6 address; the
    /// agent binds its own SIP socket on it too.
    pub bind_addr: IpAddr,
    /// `port` (required): the engine's SIP port. The agent never binds it.
    pub port: u16,
    /// `transport`: `udp` when absent.
    pub transport: Transports,
}

/// `<transport transport>` (SPEC §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transports {
    /// `udp`
    Udp,
    /// `tcp`
    Tcp,
    /// `udp+tcp`
    UdpTcp,
}

impl Transports {
    /// The accepted attribute values, in the order error messages list them.
    pub const ACCEPTED: &'static [&'static str] = &["udp", "tcp", "udp+tcp"];

    /// The attribute value naming this transport set.
    pub fn as_str(self) -> &'static str {
        match self {
            Transports::Udp => "udp",
            Transports::Tcp => "tcp",
            Transports::UdpTcp => "udp+tcp",
        }
    }

    /// Whether UDP is enabled.
    pub fn udp(self) -> bool {
        matches!(self, Transports::Udp | Transports::UdpTcp)
    }

    /// Whether TCP is enabled.
    pub fn tcp(self) -> bool {
        matches!(self, Transports::Tcp | Transports::UdpTcp)
    }
}

impl std::fmt::Display for Transports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `<media>` (SPEC §2): the RTP port range, and the video encoder's frame
/// size. The element is required.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MediaConfig {
    /// `port-start` (required): first RTP port.
    pub port_start: u16,
    /// `port-range` (required): number of ports, > 0, and
    /// `port_start + port_range <= 65536`. The range is
    /// `[port_start, port_start + port_range)`.
    pub port_range: u16,
    /// `video-enc-width`: the width in pixels of the video the engine
    /// encodes, > 0, if given. Shown (`--check-config`, the reload log),
    /// not reported to the core: selection matches codecs, not frame
    /// sizes (SPEC §15), and any MSR that takes a video codec takes the
    /// leg whatever size the engine encodes.
    pub video_enc_width: Option<u32>,
    /// `video-enc-height`: the height in pixels of that video, > 0, if
    /// given; shown, not reported, as `video_enc_width`.
    pub video_enc_height: Option<u32>,
}

impl MediaConfig {
    /// `1280x720`, `1280x?` or `none`: the video frame size as shown.
    pub fn video_enc_size(&self) -> String {
        let side = |v: Option<u32>| v.map_or_else(|| "?".to_owned(), |v| v.to_string());
        match (self.video_enc_width, self.video_enc_height) {
            (None, None) => "none".to_owned(),
            (w, h) => format!("{}x{}", side(w), side(h)),
        }
    }

    /// One past the last port of the range, as `u32` (≤ 65536).
    pub fn port_end(&self) -> u32 {
        u32::from(self.port_start) + u32::from(self.port_range)
    }

    /// Whether `port` lies in `[port_start, port_start + port_range)`.
    pub fn contains(&self, port: u16) -> bool {
        port >= self.port_start && u32::from(port) < self.port_end()
    }
}

/// The MSR's codecs in its priority order, from the priorities the
/// `<codec>` element gives them (SPEC §2: `0` = off, otherwise its
/// priority, the lowest number first). The attributes that name no codec
/// of [`CODECS`](msr_shared::media::CODECS) — `tel-event-pt`, the
/// telephone-event payload type, and whatever the engine knows that this
/// code does not — never get here: they are not codecs.
///
/// Tie rule: a priority ranks a codec among those of its own kind of
/// media. The seed numbers audio `1`–`3`, video `1`–`2` and T.38 `1`, as
/// an SDP answer picks one codec per `m=` line; so the list is the audio
/// codecs by priority, then video, then image ([`Kind::ALL`]), and equal
/// numbers within one kind keep the order of `CODECS`. The seed's
/// `<codec>` gives `pcma,pcmu,g722,h264,h263-1998,t38`. Selection reads
/// the list as a set (SPEC §15); the order is for people.
pub fn codec_list(priorities: impl IntoIterator<Item = (Codec, u32)>) -> CodecList {
    let mut on: Vec<(usize, u32, Codec)> = priorities
        .into_iter()
        .filter(|&(_, priority)| priority != 0)
        .map(|(codec, priority)| {
            let kind = Kind::ALL
                .iter()
                .position(|k| *k == codec.kind())
                .unwrap_or(Kind::ALL.len());
            (kind, priority, codec)
        })
        .collect();
    // `Codec` orders by its place in `CODECS`: the last key breaks ties.
    on.sort_unstable();
    CodecList::new(on.into_iter().map(|(_, _, codec)| codec))
}

/// One `<accounts>/<dynamic>` element (SPEC §2, §3): one registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// `msr_name` (required): non-empty, RFC 3261 `token` characters only.
    pub msr_name: String,
    /// `realm` (required): the registrar's SIP URI.
    pub realm: Realm,
    /// `auth_name` (required, may be empty): digest user name.
    pub auth_name: String,
    /// `auth_password` (required, may be empty): digest password.
    pub auth_password: String,
    /// `dtmf_mode`, passed through as written (e.g. `rfc+inband+info`).
    pub dtmf_mode: Option<String>,
}

/// The `realm` attribute of an account: the registrar's address as a SIP URI
/// (SPEC §3). It is not the digest realm, which comes from the challenge.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Realm {
    /// The URI as written, e.g. `sip:192.168.2.21:5000`.
    pub uri: String,
    /// The host part as written in the URI; an IPv6 reference keeps its
    /// brackets (`[::1]`), so `host[:port]` can be formatted directly.
    pub host: String,
    /// The port, if the URI carries one.
    pub port: Option<u16>,
}

impl Realm {
    /// Whether the URI scheme is `sips`: the registrar is reached over TLS.
    pub fn is_sips(&self) -> bool {
        self.uri
            .get(..5)
            .is_some_and(|s| s.eq_ignore_ascii_case("sips:"))
    }

    /// Whether the registrar is reached over TCP: a `sip:` URI with
    /// `;transport=tcp` (RFC 3261 §19.1.1).
    pub fn is_tcp(&self) -> bool {
        !self.is_sips() && realm_transport(&self.uri).is_some_and(|t| t.eq_ignore_ascii_case("tcp"))
    }

    /// Whether the registrar is reached over a connection (TCP or TLS):
    /// it reaches this agent back over that connection only (RFC 5626
    /// §4.4), so the agent registers again when it closes.
    pub fn is_stream(&self) -> bool {
        self.is_sips() || self.is_tcp()
    }

    /// The port the registrar listens on: the URI's, else 5061 for `sips:`
    /// and 5060 otherwise (RFC 3263 §4.2).
    pub fn port_or_default(&self) -> u16 {
        self.port
            .unwrap_or(if self.is_sips() { 5061 } else { 5060 })
    }

    /// `host[:port]` as used in To/From of a REGISTER (SPEC §3).
    pub fn host_port(&self) -> String {
        match self.port {
            Some(p) => format!("{}:{}", self.host, p),
            None => self.host.clone(),
        }
    }
}

/// The value of the `transport` URI parameter of `uri`, if it has one.
pub(crate) fn realm_transport(uri: &str) -> Option<&str> {
    let params = uri.split('?').next().unwrap_or("");
    params.split(';').skip(1).find_map(|p| {
        let (name, value) = p.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("transport")
            .then(|| value.trim())
    })
}

impl std::fmt::Display for Realm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.uri)
    }
}

/// `<agent …/>` (SPEC §2): agent-only settings. The element is optional;
/// unknown attributes are an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSettings {
    /// `register-expires`: requested registration expiry in seconds, > 0;
    /// default [`DEFAULT_REGISTER_EXPIRES`] (SPEC §3).
    pub register_expires: u32,
    /// `max-subscription-expires`: the largest SUBSCRIBE expiry granted, in
    /// seconds, > 0; default [`DEFAULT_MAX_SUBSCRIPTION_EXPIRES`] (SPEC §4).
    pub max_subscription_expires: u32,
    /// `calls-source`: where media sessions are counted (SPEC §2).
    pub calls_source: CallsSource,
    /// `notify-min-interval-ms` (1000 to 3600000): minimum milliseconds between two NOTIFYs of
    /// one subscription; default [`DEFAULT_NOTIFY_MIN_INTERVAL_MS`] (SPEC §4).
    pub notify_min_interval_ms: u64,
    /// `notify-top-interval-ms` (20 to 3600000): the same when `load` is at or
    /// above `notify-high-water` (or was at the last NOTIFY), and how often the
    /// agent samples then; never longer than `notify-min-interval-ms`;
    /// default [`DEFAULT_NOTIFY_TOP_INTERVAL_MS`] (SPEC §4, §10).
    pub notify_top_interval_ms: u64,
    /// `notify-high-water` (1 to 101): at or above this `load`, percent,
    /// every change of `calls` is notified (still at most one NOTIFY per
    /// `notify-min-interval-ms`); default
    /// [`DEFAULT_HIGH_WATER`] (SPEC §4,
    /// §10). 101 turns the rule off.
    pub notify_high_water: u8,
    /// `sample-interval-ms` (100 to 60000): milliseconds between two load samples;
    /// default [`DEFAULT_SAMPLE_INTERVAL_MS`]. It is also the CPU sampling
    /// window.
    pub sample_interval_ms: u64,
    /// `node-name`: non-empty name of this node, if given.
    pub node_name: Option<String>,
    /// `sip-port` (or `--sip-port`): the agent's own SIP port on
    /// `<transport bind-addr>`. Default: the `<transport>` port + 1 (0, an
    /// ephemeral port, when that port is 0). Never the engine's port, its
    /// media-control port or a port of the RTP range ([`ConfigError::PortCollision`]).
    pub sip_port: u16,
    /// `log-file` (or `--log-file`): the agent's own log file, reopened on
    /// SIGHUP (for logrotate); `None`: standard error (the journal under
    /// systemd). The engine's `<general log-path log-name>` is never used.
    pub log_file: Option<PathBuf>,
    /// `allow-subscribers`: addresses allowed to SUBSCRIBE (and to receive
    /// NOTIFYs) besides the registrars, i.e. the hosts of the `<dynamic
    /// realm>` URIs (SPEC §4); IP addresses separated by spaces or commas.
    /// Default: none.
    pub allow_subscribers: Vec<IpAddr>,
    /// `tls-ca`, `tls-cert`, `tls-key`: SIP over TLS to `sips:` realms
    /// (SPEC §4); required when a realm is `sips:`.
    pub tls: Option<AgentTls>,
    /// `engine-probe`: how the media engine's own liveness is checked
    /// (SPEC §14); default [`EngineProbeMode::Auto`].
    pub engine_probe: EngineProbeMode,
    /// `engine-probe-interval-ms` (500 to 60000): time between two SIP
    /// probes; default 2000.
    pub engine_probe_interval_ms: u64,
    /// `engine-probe-timeout-ms` (100 to 10000, at most the interval): how
    /// long a SIP probe may go unanswered; default 1000.
    pub engine_probe_timeout_ms: u64,
    /// `engine-probe-misses` (1 to 10): probes missed in a row that make
    /// the engine `down`; default 2.
    pub engine_probe_misses: u32,
    /// `--time-scale` (benchmarks only, 1 to 1000, never from the file):
    /// the NOTIFY and sampling intervals above are divided by it, so that a
    /// run whose calls are held N times shorter sees its reports as often,
    /// per call, as the real system does (BALANCING.md, the end-to-end
    /// runs). Default 1.
    pub time_scale: u32,
}

/// `<agent engine-probe>` (SPEC §14): how the agent checks that the media
/// engine it sits beside still answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EngineProbeMode {
    /// `auto` (default): `ng` with the `rtpengine` calls source, `sip`
    /// when `<transport port>` is not 0, else `off`.
    #[default]
    Auto,
    /// `sip`: an OPTIONS to `<transport>`; any final response is alive.
    Sip,
    /// `ng`: the `rtpengine` source's statistics exchange (requires that
    /// source).
    Ng,
    /// `off`: not probed; every NOTIFY says `engine: unchecked`.
    Off,
}

impl EngineProbeMode {
    /// The accepted attribute values, in the order error messages list them.
    pub const ACCEPTED: &'static [&'static str] = &["auto", "sip", "ng", "off"];

    /// The attribute value naming this mode.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineProbeMode::Auto => "auto",
            EngineProbeMode::Sip => "sip",
            EngineProbeMode::Ng => "ng",
            EngineProbeMode::Off => "off",
        }
    }
}

impl std::fmt::Display for EngineProbeMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl AgentConfig {
    /// The engine probe in force, `auto` resolved (never
    /// [`EngineProbeMode::Auto`]).
    pub fn engine_probe(&self) -> EngineProbeMode {
        match self.agent.engine_probe {
            EngineProbeMode::Auto if self.agent.calls_source == CallsSource::Rtpengine => {
                EngineProbeMode::Ng
            }
            EngineProbeMode::Auto if self.transport.port != 0 => EngineProbeMode::Sip,
            EngineProbeMode::Auto => EngineProbeMode::Off,
            mode => mode,
        }
    }
}

/// `<agent tls-ca tls-cert tls-key>`: how the agent's TLS connections to
/// its registrars are checked and, for mutual TLS, who it says it is. The
/// files are read when the endpoint starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentTls {
    /// `tls-ca`: the CAs (PEM) the registrar's certificate must chain
    /// to; its name must match the realm's host.
    pub ca: PathBuf,
    /// `tls-cert` and `tls-key`: the agent's client certificate chain and
    /// its private key (PEM), for a registrar that asks for one.
    pub identity: Option<(PathBuf, PathBuf)>,
}

impl AgentTls {
    /// The TLS client these files make (read now).
    ///
    /// # Errors
    /// A file that can't be read or used, named.
    pub fn read(&self) -> Result<msr_shared::sip::TlsClient, msr_shared::sip::TlsFileError> {
        let identity = self
            .identity
            .as_ref()
            .map(|(cert, key)| (cert.as_path(), key.as_path()));
        msr_shared::sip::TlsClient::read(&self.ca, identity)
    }

    /// The attribute that names `path`, for messages (`tls-ca`, …).
    pub fn attribute_of(&self, path: &Path) -> &'static str {
        match &self.identity {
            _ if path == self.ca => "tls-ca",
            Some((cert, _)) if path == cert => "tls-cert",
            Some((_, key)) if path == key => "tls-key",
            _ => "tls-…",
        }
    }

    /// What to renew or fix in these files now, though they load: a
    /// certificate expired, not valid yet or ending soon
    /// ([`msr_shared::certificate::validity_warnings`]), and a client
    /// certificate that does not name an MSR registered over TLS with it —
    /// a collector with mutual TLS refuses that MSR's REGISTER (SPEC §4).
    /// Said by `--check-config`, logged at start and at a reload; `now` is
    /// the wall clock, which the caller reads.
    pub fn warnings<'a>(
        &self,
        tls_msrs: impl IntoIterator<Item = &'a str>,
        now: std::time::SystemTime,
    ) -> Vec<String> {
        use msr_shared::certificate::{first_in_file, names, validity_warnings};
        let mut warnings = validity_warnings("<agent tls-ca>", &self.ca, now);
        let Some((cert, _)) = &self.identity else {
            return warnings;
        };
        warnings.extend(validity_warnings("<agent tls-cert>", cert, now));
        if let Some(leaf) = first_in_file(cert) {
            for msr in tls_msrs.into_iter().filter(|msr| !names(&leaf, msr)) {
                warnings.push(format!(
                    "<agent tls-cert> {}: the certificate does not name msr {msr:?} \
                     (a DNS subject alternative name): a collector with mutual tls \
                     refuses its REGISTER",
                    cert.display()
                ));
            }
        }
        warnings
    }
}

impl Default for AgentSettings {
    fn default() -> Self {
        AgentSettings {
            register_expires: DEFAULT_REGISTER_EXPIRES,
            max_subscription_expires: DEFAULT_MAX_SUBSCRIPTION_EXPIRES,
            calls_source: CallsSource::ProcNetUdp,
            notify_min_interval_ms: DEFAULT_NOTIFY_MIN_INTERVAL_MS,
            notify_top_interval_ms: DEFAULT_NOTIFY_TOP_INTERVAL_MS,
            notify_high_water: DEFAULT_HIGH_WATER,
            sample_interval_ms: DEFAULT_SAMPLE_INTERVAL_MS,
            node_name: None,
            sip_port: 0,
            log_file: None,
            allow_subscribers: Vec::new(),
            tls: None,
            engine_probe: EngineProbeMode::Auto,
            engine_probe_interval_ms: DEFAULT_ENGINE_PROBE_INTERVAL_MS,
            engine_probe_timeout_ms: DEFAULT_ENGINE_PROBE_TIMEOUT_MS,
            engine_probe_misses: DEFAULT_ENGINE_PROBE_MISSES,
            time_scale: 1,
        }
    }
}

impl AgentSettings {
    /// `notify-min-interval-ms` as a duration, divided by the time scale.
    pub fn notify_min_interval(&self) -> Duration {
        self.scaled(self.notify_min_interval_ms)
    }

    /// `notify-top-interval-ms` as a duration, divided by the time scale.
    pub fn notify_top_interval(&self) -> Duration {
        self.scaled(self.notify_top_interval_ms)
    }

    /// `sample-interval-ms` as a duration, divided by the time scale.
    pub fn sample_interval(&self) -> Duration {
        self.scaled(self.sample_interval_ms)
    }

    fn scaled(&self, ms: u64) -> Duration {
        Duration::from_millis(ms) / self.time_scale.max(1)
    }
}

impl AgentSettings {
    /// The accepted attributes of `<agent>`, in the order error messages
    /// list them.
    pub const ACCEPTED_ATTRIBUTES: &'static [&'static str] = &[
        "register-expires",
        "max-subscription-expires",
        "calls-source",
        "notify-min-interval-ms",
        "notify-top-interval-ms",
        "notify-high-water",
        "sample-interval-ms",
        "node-name",
        "sip-port",
        "log-file",
        "allow-subscribers",
        "tls-ca",
        "tls-cert",
        "tls-key",
        "engine-probe",
        "engine-probe-interval-ms",
        "engine-probe-timeout-ms",
        "engine-probe-misses",
    ];
}

/// `<agent calls-source>` (SPEC §2): how media sessions are counted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CallsSource {
    /// `proc` (default): UDP sockets bound on even ports inside the RTP range,
    /// from `/proc/net/udp` and `/proc/net/udp6`.
    #[default]
    ProcNetUdp,
    /// `file:/path`: a file holding one integer (written by the media engine).
    File(PathBuf),
    /// `fixed:N`: a constant (tests, hosts without `/proc`).
    Fixed(u32),
    /// `rtpengine`: the sessions of the rtpengine whose ng control port is
    /// `<pbyte><mcc>` (required with this source), read over the ng
    /// protocol ([`crate::load::rtpengine`]; SPEC §11). The media-control
    /// address the agent reports is thus the port it reads the count from.
    Rtpengine,
}

impl std::fmt::Display for CallsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallsSource::ProcNetUdp => f.write_str("proc"),
            CallsSource::File(p) => write!(f, "file:{}", p.display()),
            CallsSource::Fixed(n) => write!(f, "fixed:{n}"),
            CallsSource::Rtpengine => f.write_str("rtpengine"),
        }
    }
}

/// The largest config file read: the media server's own config is a few
/// kilobytes; a file this large is not one, and reading or parsing it must
/// not stall a host (hot reload reads whatever is written to the path).
pub const MAX_CONFIG_BYTES: usize = 1024 * 1024;

/// The deepest element nesting accepted: the media server's config is four
/// levels deep (`<config><accounts><dynamic>`); the bound keeps the scan's
/// and the deserializer's work bounded by the depth, not the file.
pub const MAX_CONFIG_DEPTH: usize = 64;

/// Reads the config file at `path` and parses it with [`parse`]; messages
/// name `path` as given. At most [`MAX_CONFIG_BYTES`] are read.
pub fn load(path: &Path) -> Result<AgentConfig, ConfigError> {
    let bytes =
        msr_shared::fs::read_at_most(path, MAX_CONFIG_BYTES).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    if bytes.len() > MAX_CONFIG_BYTES {
        return Err(ConfigError::TooLarge {
            path: path.to_path_buf(),
            limit: MAX_CONFIG_BYTES,
        });
    }
    let text = match String::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            let offset = e.utf8_error().valid_up_to();
            let valid = String::from_utf8_lossy(&e.as_bytes()[..offset]).into_owned();
            return Err(ConfigError::Malformed {
                path: path.to_path_buf(),
                at: Position::from_offset(&valid, offset),
                reason: "invalid utf-8".to_owned(),
            });
        }
    };
    parse(&text, path)
}

/// Parses and validates config text; `origin` is the file name used in error
/// messages (SPEC §2).
pub fn parse(text: &str, origin: &Path) -> Result<AgentConfig, ConfigError> {
    if text.len() > MAX_CONFIG_BYTES {
        return Err(ConfigError::TooLarge {
            path: origin.to_path_buf(),
            limit: MAX_CONFIG_BYTES,
        });
    }
    // A leading BOM is legal XML but confuses nothing except positions.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let scan = xml::scan(text, origin)?;
    let raw = xml::deserialize(text, origin)?;
    validate::validate(raw, &scan, origin)
}
