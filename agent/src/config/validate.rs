//! Conversion of the raw XML structs into the typed [`AgentConfig`]
//!. Every error names the element, the attribute, the value
//! and the accepted values (SPEC §2).

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use msr_shared::media::{Codec, CodecList};

use super::xml::{
    RawAccounts, RawAgent, RawConfig, RawDynamic, RawGeneral, RawMcc, RawMedia, RawTransport, Scan,
};
use super::{
    codec_list, Account, AgentConfig, AgentSettings, AgentTls, CallsSource, ConfigError,
    EngineProbeMode, General, LoadSensor, MediaConfig, PortSetting, Realm, TransportConfig,
    Transports, ValueProblem, DEFAULT_LOAD_DELTA,
};

/// Builds errors for one file.
struct Ctx<'a> {
    path: &'a Path,
}

impl Ctx<'_> {
    fn invalid(
        &self,
        element: &'static str,
        attribute: &'static str,
        value: &str,
        problem: ValueProblem,
        accepted: &'static str,
    ) -> ConfigError {
        ConfigError::InvalidValue {
            path: self.path.to_path_buf(),
            element,
            attribute,
            value: value.to_owned(),
            problem,
            accepted,
        }
    }

    fn missing_attr(&self, element: &'static str, attribute: &'static str) -> ConfigError {
        ConfigError::MissingAttribute {
            path: self.path.to_path_buf(),
            element,
            attribute,
        }
    }

    fn missing_elem(&self, element: &'static str) -> ConfigError {
        ConfigError::MissingElement {
            path: self.path.to_path_buf(),
            element,
        }
    }

    fn required<'v>(
        &self,
        value: &'v Option<String>,
        element: &'static str,
        attribute: &'static str,
    ) -> Result<&'v str, ConfigError> {
        value
            .as_deref()
            .ok_or_else(|| self.missing_attr(element, attribute))
    }

    /// Parses a decimal unsigned integer in `min..=max` (no sign).
    fn int<T>(
        &self,
        value: &str,
        element: &'static str,
        attribute: &'static str,
        min: T,
        max: T,
    ) -> Result<T, ConfigError>
    where
        T: FromStr + PartialOrd + Copy + Into<u64>,
    {
        let trimmed = value.trim();
        let parsed = if !trimmed.is_empty() && trimmed.bytes().all(|b| b.is_ascii_digit()) {
            trimmed.parse::<T>().ok()
        } else {
            None
        };
        match parsed {
            Some(n) if n >= min && n <= max => Ok(n),
            _ => Err(ConfigError::BadInteger {
                path: self.path.to_path_buf(),
                element,
                attribute,
                value: value.to_owned(),
                min: min.into(),
                max: max.into(),
            }),
        }
    }
}

/// Validates the raw config; `scan` carries what the well-formedness pass
/// collected (the attribute names of `<agent>`).
pub(super) fn validate(
    raw: RawConfig,
    scan: &Scan,
    origin: &Path,
) -> Result<AgentConfig, ConfigError> {
    let cx = Ctx { path: origin };
    let general = general(
        &cx,
        raw.general
            .as_ref()
            .ok_or_else(|| cx.missing_elem("general"))?,
    )?;
    let transport = transport(
        &cx,
        raw.transport
            .as_ref()
            .ok_or_else(|| cx.missing_elem("transport"))?,
    )?;
    let media = media(
        &cx,
        raw.media.as_ref().ok_or_else(|| cx.missing_elem("media"))?,
    )?;
    let accounts = match &raw.accounts {
        Some(a) => accounts(&cx, a)?,
        None => Vec::new(),
    };
    let codecs = scan
        .codec
        .as_deref()
        .map(|attributes| codecs(&cx, attributes))
        .transpose()?;
    let mut warnings = Vec::new();
    if accounts.is_empty() {
        // A misspelt element (`<Dynamic>`, `<dinamic>`) is the engine's to
        // the reader, skipped like its other elements.
        warnings.push(
            "<accounts>: no <dynamic> account (element names are case-sensitive): this agent registers with no collector, so no core host learns of this MSR"
                .to_owned(),
        );
    }
    warnings.extend(
        scan.codec
            .as_deref()
            .map(|attributes| codec_warnings(attributes, codecs.as_ref()))
            .unwrap_or_default(),
    );
    for (name, at) in &scan.agent_attributes {
        if !AgentSettings::ACCEPTED_ATTRIBUTES.contains(&name.as_str()) {
            return Err(ConfigError::UnknownAttribute {
                path: origin.to_path_buf(),
                at: *at,
                attribute: name.clone(),
                accepted: AgentSettings::ACCEPTED_ATTRIBUTES.join(", "),
            });
        }
    }
    let mcc = match raw.pbyte.as_ref().and_then(|p| p.mcc.as_ref()) {
        Some(m) => Some(mcc(&cx, m)?),
        None => None,
    };
    let mut agent = match &raw.agent {
        Some(a) => agent(&cx, a)?,
        None => AgentSettings::default(),
    };
    let explicit = raw.agent.as_ref().and_then(|a| a.sip_port.as_deref());
    agent.sip_port = match explicit {
        Some(v) => cx.int::<u16>(v, "agent", "sip-port", 0, u16::MAX)?,
        None => default_sip_port(&cx, transport.port)?,
    };
    if agent.calls_source == CallsSource::Rtpengine && mcc.is_none() {
        return Err(cx.invalid(
            "agent",
            "calls-source",
            "rtpengine",
            ValueProblem::Detail(
                "rtpengine is asked at its ng port, <pbyte><mcc bind-addr port>, which this file lacks",
            ),
            "proc, file:/path, fixed:N, or rtpengine with <pbyte><mcc> set to rtpengine's listen-ng address",
        ));
    }
    if agent.engine_probe == EngineProbeMode::Ng && agent.calls_source != CallsSource::Rtpengine {
        return Err(cx.invalid(
            "agent",
            "engine-probe",
            "ng",
            ValueProblem::Detail(
                "the ng probe is the rtpengine calls source's exchange, and calls-source is not rtpengine",
            ),
            "auto, sip, off, or ng with calls-source=\"rtpengine\"",
        ));
    }
    if agent.engine_probe == EngineProbeMode::Sip && transport.port == 0 {
        return Err(cx.invalid(
            "agent",
            "engine-probe",
            "sip",
            ValueProblem::Detail(
                "the sip probe asks <transport port>, which is 0 (no engine port)",
            ),
            "auto, ng, off, or sip with a <transport port> above 0",
        ));
    }
    if let (Some(sips), None) = (accounts.iter().find(|a| a.realm.is_sips()), &agent.tls) {
        return Err(cx.invalid(
            "dynamic",
            "realm",
            &sips.realm.uri,
            ValueProblem::Detail("a sips: realm is reached over tls, and <agent tls-ca> is missing"),
            "a sips: realm with <agent tls-ca=\"/path/ca.pem\"> (the CA of the registrar's certificate), or a sip: realm",
        ));
    }
    let config = AgentConfig {
        general,
        transport,
        mcc,
        media,
        accounts,
        agent,
        codecs,
        warnings,
    };
    check_sip_port(&config, origin, PortSetting::Config)?;
    Ok(config)
}

/// The agent's SIP port when `<agent sip-port>` is not given: the engine's
/// port + 1 (SPEC §2), or 0 (ephemeral) when the engine's port is 0.
fn default_sip_port(cx: &Ctx<'_>, engine_port: u16) -> Result<u16, ConfigError> {
    match engine_port {
        0 => Ok(0),
        u16::MAX => Err(ConfigError::PortCollision {
            path: cx.path.to_path_buf(),
            setting: PortSetting::Config,
            sip_port: u16::MAX,
            engine: format!(
                "<transport port=\"{}\"> (no port above it is left for the default)",
                u16::MAX
            ),
        }),
        p => Ok(p + 1),
    }
}

/// Refuses an agent SIP port that is one of the media engine's: its SIP
/// port, its media-control port on the same address, or a port of its RTP
/// range (where the agent's socket would also be counted as a media
/// session). Port 0 (ephemeral) collides with nothing.
pub(super) fn check_sip_port(
    config: &AgentConfig,
    origin: &Path,
    setting: PortSetting,
) -> Result<(), ConfigError> {
    let sip_port = config.agent.sip_port;
    if sip_port == 0 {
        return Ok(());
    }
    let collision = |engine: String| ConfigError::PortCollision {
        path: origin.to_path_buf(),
        setting,
        sip_port,
        engine,
    };
    if sip_port == config.transport.port {
        return Err(collision(format!("<transport port=\"{sip_port}\">")));
    }
    if let Some(mcc) = config.mcc {
        let bind = config.transport.bind_addr;
        let same_host = mcc.ip() == bind || mcc.ip().is_unspecified() || bind.is_unspecified();
        if mcc.port() == sip_port && same_host {
            return Err(collision(format!(
                "<pbyte><mcc bind-addr=\"{}\" port=\"{sip_port}\">",
                mcc.ip()
            )));
        }
    }
    if config.media.contains(sip_port) {
        return Err(collision(format!(
            "<media port-start=\"{}\" port-range=\"{}\"> (RTP ports {}..{})",
            config.media.port_start,
            config.media.port_range,
            config.media.port_start,
            config.media.port_end()
        )));
    }
    Ok(())
}

fn mcc(cx: &Ctx<'_>, raw: &RawMcc) -> Result<SocketAddr, ConfigError> {
    const E: &str = "mcc";
    let addr_text = cx.required(&raw.bind_addr, E, "bind-addr")?;
    let ip = IpAddr::from_str(addr_text.trim()).map_err(|_| {
        cx.invalid(
            E,
            "bind-addr",
            addr_text,
            ValueProblem::Bad,
            "an ipv4 or ipv6 address",
        )
    })?;
    let port = cx.int::<u16>(cx.required(&raw.port, E, "port")?, E, "port", 1, u16::MAX)?;
    Ok(SocketAddr::new(ip, port))
}

fn general(cx: &Ctx<'_>, raw: &RawGeneral) -> Result<General, ConfigError> {
    const E: &str = "general";
    let log_level = raw
        .log_level
        .as_deref()
        .map(|v| cx.int::<u8>(v, E, "log-level", 0, u8::MAX))
        .transpose()?;
    let max_calls = cx.int::<u32>(
        cx.required(&raw.max_calls, E, "max-calls")?,
        E,
        "max-calls",
        1,
        u32::MAX,
    )?;
    let sensor_text = cx.required(&raw.load_sensor, E, "load-sensor")?;
    let load_sensor = match sensor_text {
        "cpu" => LoadSensor::Cpu,
        "calls" => LoadSensor::Calls,
        "media" => LoadSensor::Media,
        other => {
            return Err(cx.invalid(
                E,
                "load-sensor",
                other,
                ValueProblem::Unknown,
                "cpu, calls, media",
            ));
        }
    };
    let load_delta = match raw.load_delta.as_deref() {
        None => DEFAULT_LOAD_DELTA,
        Some(v) => cx.int::<u8>(v, E, "load-delta", 1, 100)?,
    };
    Ok(General {
        log_level,
        max_calls,
        load_sensor,
        load_delta,
    })
}

fn transport(cx: &Ctx<'_>, raw: &RawTransport) -> Result<TransportConfig, ConfigError> {
    const E: &str = "transport";
    let addr_text = cx.required(&raw.bind_addr, E, "bind-addr")?;
    let bind_addr = IpAddr::from_str(addr_text.trim()).map_err(|_| {
        cx.invalid(
            E,
            "bind-addr",
            addr_text,
            ValueProblem::Bad,
            "an ipv4 or ipv6 address",
        )
    })?;
    let port = cx.int::<u16>(cx.required(&raw.port, E, "port")?, E, "port", 0, u16::MAX)?;
    let transport = match raw.transport.as_deref() {
        None | Some("udp") => Transports::Udp,
        Some("tcp") => Transports::Tcp,
        Some("udp+tcp") => Transports::UdpTcp,
        Some(other) => {
            return Err(cx.invalid(
                E,
                "transport",
                other,
                ValueProblem::Unknown,
                "udp, tcp, udp+tcp",
            ));
        }
    };
    Ok(TransportConfig {
        bind_addr,
        port,
        transport,
    })
}

fn media(cx: &Ctx<'_>, raw: &RawMedia) -> Result<MediaConfig, ConfigError> {
    const E: &str = "media";
    let port_start = cx.int::<u16>(
        cx.required(&raw.port_start, E, "port-start")?,
        E,
        "port-start",
        0,
        u16::MAX,
    )?;
    let range_text = cx.required(&raw.port_range, E, "port-range")?;
    let max_range = u16::try_from(65536 - u32::from(port_start)).unwrap_or(u16::MAX);
    let port_range = cx.int::<u16>(range_text, E, "port-range", 1, max_range)?;
    let positive = |value: &Option<String>, attribute: &'static str| {
        value
            .as_deref()
            .map(|v| cx.int::<u32>(v, E, attribute, 1, u32::MAX))
            .transpose()
    };
    Ok(MediaConfig {
        port_start,
        port_range,
        video_enc_width: positive(&raw.video_enc_width, "video-enc-width")?,
        video_enc_height: positive(&raw.video_enc_height, "video-enc-height")?,
    })
}

/// `<codec>` attributes of the engine's own that are no codec.
const ENGINE_CODEC_ATTRIBUTES: [&str; 1] = ["tel-event-pt"];

/// What in `<codec>` loads but is likely a mistake (see
/// [`AgentConfig::warnings`]): an operator's `PCMA="1"` would
/// otherwise turn the MSR away from every leg that names an offer,
/// without a word.
fn codec_warnings(attributes: &[(String, String)], list: Option<&CodecList>) -> Vec<String> {
    let mut warnings: Vec<String> = attributes
        .iter()
        .filter_map(|(name, value)| {
            let codec = Codec::from_name(name).filter(|c| c.name() != name)?;
            Some(format!(
                "<codec {}=\"{}\">: not read, codec names are lower case ({}): the MSR reports it off",
                msr_shared::logging::printable(name, 40),
                msr_shared::logging::printable(value, 40),
                codec.name()
            ))
        })
        .collect();
    // A typo of a known codec (`opsu`, `pmca`: one letter off or two
    // swapped) is, to the reader, an attribute of the engine's, skipped
    // without a word; a codec this code does not know at all is the
    // engine's to read and is left alone.
    for (name, value) in attributes {
        if Codec::from_name(name).is_some() || ENGINE_CODEC_ATTRIBUTES.contains(&name.as_str()) {
            continue;
        }
        let lower = name.to_ascii_lowercase();
        let near = msr_shared::media::CODECS
            .iter()
            .map(|c| c.name)
            .find(|known| known.len() > 2 && strsim::damerau_levenshtein(&lower, known) == 1);
        if let Some(known) = near {
            warnings.push(format!(
                "<codec {}=\"{}\">: not a codec this agent knows (did you mean {known}?): the MSR does not report it",
                msr_shared::logging::printable(name, 40),
                msr_shared::logging::printable(value, 40),
            ));
        }
    }
    if list.is_some_and(CodecList::is_empty) {
        warnings.push(
            "<codec>: every codec is off (codecs: none): no leg that names an offer is placed on this MSR"
                .to_owned(),
        );
    }
    warnings
}

/// `<codec>` (SPEC §2, §15): every attribute that names a codec of
/// [`CODECS`](msr_shared::media::CODECS) is its priority, a non-negative
/// integer (`0`: off); the others (`tel-event-pt`, codecs this code does
/// not know) are the engine's and skipped, as any attribute the agent does
/// not read. Names are matched exactly, as the engine's XML reader does.
fn codecs(cx: &Ctx<'_>, attributes: &[(String, String)]) -> Result<CodecList, ConfigError> {
    let mut priorities = Vec::new();
    for (name, value) in attributes {
        let Some(codec) = Codec::from_name(name).filter(|c| c.name() == name) else {
            continue;
        };
        let priority = cx.int::<u32>(value, "codec", codec.name(), 0, u32::MAX)?;
        priorities.push((codec, priority));
    }
    Ok(codec_list(priorities))
}

fn accounts(cx: &Ctx<'_>, raw: &RawAccounts) -> Result<Vec<Account>, ConfigError> {
    let mut out: Vec<Account> = Vec::new();
    let mut seen: HashSet<(String, String)> = HashSet::new();
    for d in raw.dynamic() {
        let account = account(cx, d)?;
        if !seen.insert((account.msr_name.clone(), account.realm.uri.clone())) {
            return Err(ConfigError::DuplicateAccount {
                path: cx.path.to_path_buf(),
                msr_name: account.msr_name,
                realm: account.realm.uri,
            });
        }
        out.push(account);
    }
    Ok(out)
}

fn account(cx: &Ctx<'_>, raw: &RawDynamic) -> Result<Account, ConfigError> {
    const E: &str = "dynamic";
    let msr_name = cx.required(&raw.msr_name, E, "msr_name")?;
    if !msr_shared::sip::is_msr_name(msr_name) {
        let problem = if msr_name.is_empty() {
            ValueProblem::Empty
        } else {
            ValueProblem::Bad
        };
        return Err(cx.invalid(
            E,
            "msr_name",
            msr_name,
            problem,
            "a sip token of 1 to 128 bytes (letters, digits and -.!%*_+`'~)",
        ));
    }
    let realm_text = cx.required(&raw.realm, E, "realm")?;
    let realm = parse_realm(realm_text).map_err(|problem| {
        cx.invalid(
            E,
            "realm",
            realm_text,
            ValueProblem::Detail(problem),
            "a sip: or sips: uri with a host, e.g. sip:192.0.2.1:5060",
        )
    })?;
    let auth_name = cx.required(&raw.auth_name, E, "auth_name")?.to_owned();
    let auth_password = cx
        .required(&raw.auth_password, E, "auth_password")?
        .to_owned();
    Ok(Account {
        msr_name: msr_name.to_owned(),
        realm,
        auth_name,
        auth_password,
        dtmf_mode: raw.dtmf_mode.clone(),
    })
}

/// Parses `sip:[user@]host[:port][;params][?headers]` (RFC 3261 §19.1.1);
/// the error is a short lowercase problem description.
pub(super) fn parse_realm(uri: &str) -> Result<Realm, &'static str> {
    let (scheme, rest) = uri.split_once(':').ok_or("realm is not a sip uri")?;
    if !scheme.eq_ignore_ascii_case("sip") && !scheme.eq_ignore_ascii_case("sips") {
        return Err("realm is not a sip uri");
    }
    // Strip parameters and headers, then user info.
    let hostport = rest.split([';', '?']).next().unwrap_or("");
    let hostport = hostport.rsplit_once('@').map_or(hostport, |(_, hp)| hp);
    let (host, port_text) = if let Some(v6) = hostport.strip_prefix('[') {
        let (inner, after) = v6.split_once(']').ok_or("realm has a bad ipv6 host")?;
        if inner.parse::<std::net::Ipv6Addr>().is_err() {
            return Err("realm has a bad ipv6 host");
        }
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or("realm has a bad port")?),
        };
        (&hostport[..inner.len() + 2], port)
    } else {
        match hostport.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        return Err("realm has no host");
    }
    if !host.starts_with('[')
        && !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
    {
        return Err("realm has a bad host");
    }
    let port = match port_text {
        None => None,
        Some(p) => {
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err("realm has a bad port");
            }
            match p.parse::<u16>() {
                Ok(n) if n > 0 => Some(n),
                _ => return Err("realm has a bad port"),
            }
        }
    };
    let sips = scheme.eq_ignore_ascii_case("sips");
    match super::realm_transport(uri) {
        None => {}
        Some(t) if t.eq_ignore_ascii_case("tcp") => {}
        Some(t) if t.eq_ignore_ascii_case("udp") && !sips => {}
        Some(t) if t.eq_ignore_ascii_case("udp") => {
            return Err("a sips: realm is reached over tls, not transport=udp")
        }
        Some(t) if t.eq_ignore_ascii_case("tls") => {
            return Err("realm has transport=tls: write a sips: realm for tls")
        }
        Some(_) => return Err("realm has an unknown transport (udp or tcp)"),
    }
    Ok(Realm {
        uri: uri.to_owned(),
        host: host.to_owned(),
        port,
    })
}

fn agent(cx: &Ctx<'_>, raw: &RawAgent) -> Result<AgentSettings, ConfigError> {
    const E: &str = "agent";
    let d = AgentSettings::default();
    let register_expires = match raw.register_expires.as_deref() {
        None => d.register_expires,
        Some(v) => cx.int::<u32>(v, E, "register-expires", 1, u32::MAX)?,
    };
    let max_subscription_expires = match raw.max_subscription_expires.as_deref() {
        None => d.max_subscription_expires,
        Some(v) => cx.int::<u32>(v, E, "max-subscription-expires", 1, u32::MAX)?,
    };
    let notify_min_interval_ms = match raw.notify_min_interval_ms.as_deref() {
        None => d.notify_min_interval_ms,
        Some(v) => cx.int::<u64>(v, E, "notify-min-interval-ms", 1000, 3_600_000)?,
    };
    let notify_top_interval_ms = match raw.notify_top_interval_ms.as_deref() {
        None => d.notify_top_interval_ms,
        Some(v) => cx.int::<u64>(v, E, "notify-top-interval-ms", 20, 3_600_000)?,
    };
    // 101 is above any load: the high-water rule off (SPEC §4).
    let notify_high_water = match raw.notify_high_water.as_deref() {
        None => d.notify_high_water,
        Some(v) => cx.int::<u8>(v, E, "notify-high-water", 1, 101)?,
    };
    let sample_interval_ms = match raw.sample_interval_ms.as_deref() {
        None => d.sample_interval_ms,
        Some(v) => cx.int::<u64>(v, E, "sample-interval-ms", 100, 60_000)?,
    };
    let engine_probe = match raw.engine_probe.as_deref() {
        None => d.engine_probe,
        Some("auto") => EngineProbeMode::Auto,
        Some("sip") => EngineProbeMode::Sip,
        Some("ng") => EngineProbeMode::Ng,
        Some("off") => EngineProbeMode::Off,
        Some(other) => {
            return Err(cx.invalid(
                E,
                "engine-probe",
                other,
                ValueProblem::Unknown,
                "auto, sip, ng, off",
            ))
        }
    };
    let engine_probe_interval_ms = match raw.engine_probe_interval_ms.as_deref() {
        None => d.engine_probe_interval_ms,
        Some(v) => cx.int::<u64>(v, E, "engine-probe-interval-ms", 500, 60_000)?,
    };
    // Below Timer F (32 s): the probe's own timeout must end it first.
    let engine_probe_timeout_ms = match raw.engine_probe_timeout_ms.as_deref() {
        None => d.engine_probe_timeout_ms.min(engine_probe_interval_ms),
        Some(v) => cx.int::<u64>(v, E, "engine-probe-timeout-ms", 100, 10_000)?,
    };
    if engine_probe_timeout_ms > engine_probe_interval_ms {
        return Err(cx.invalid(
            E,
            "engine-probe-timeout-ms",
            &engine_probe_timeout_ms.to_string(),
            ValueProblem::Detail("longer than engine-probe-interval-ms"),
            "100 to 10000 ms, at most engine-probe-interval-ms (default 2000)",
        ));
    }
    let engine_probe_misses = match raw.engine_probe_misses.as_deref() {
        None => d.engine_probe_misses,
        Some(v) => cx.int::<u32>(v, E, "engine-probe-misses", 1, 10)?,
    };
    let calls_source = match raw.calls_source.as_deref() {
        None => d.calls_source,
        Some(v) => parse_calls_source(v)
            .ok_or_else(|| cx.invalid(E, "calls-source", v, ValueProblem::Bad, CALLS_SOURCES))?,
    };
    let node_name = match raw.node_name.as_deref() {
        None => None,
        Some(v) if v.trim().is_empty() => {
            return Err(cx.invalid(E, "node-name", v, ValueProblem::Empty, "a non-empty name"));
        }
        Some(v) => Some(v.to_owned()),
    };
    let log_file = match raw.log_file.as_deref() {
        None => None,
        Some(v) if v.trim().is_empty() || v.ends_with('/') => {
            return Err(cx.invalid(
                E,
                "log-file",
                v,
                ValueProblem::Bad,
                "the path of a file, e.g. /var/log/msr-agent/msr-agent.log",
            ));
        }
        Some(v) => Some(PathBuf::from(v)),
    };
    let mut allow_subscribers = Vec::new();
    if let Some(v) = raw.allow_subscribers.as_deref() {
        for item in v.split([' ', ',', '\t', '\n']).filter(|i| !i.is_empty()) {
            // `[::1]` as in a URI, or bare.
            let bare = item
                .strip_prefix('[')
                .and_then(|i| i.strip_suffix(']'))
                .unwrap_or(item);
            let ip = bare.parse::<IpAddr>().map_err(|_| {
                cx.invalid(
                    E,
                    "allow-subscribers",
                    item,
                    ValueProblem::Detail("not an IP address"),
                    "IP addresses separated by spaces or commas, e.g. \"10.0.0.5 10.0.0.6\"",
                )
            })?;
            if !allow_subscribers.contains(&ip) {
                allow_subscribers.push(ip);
            }
        }
    }
    let path = |key: &'static str, v: &Option<String>| -> Result<Option<PathBuf>, ConfigError> {
        match v.as_deref() {
            None => Ok(None),
            Some(v) if v.trim().is_empty() || v.ends_with('/') => Err(cx.invalid(
                E,
                key,
                v,
                ValueProblem::Bad,
                "the path of a pem file, e.g. /etc/msr-agent/tls/ca.pem",
            )),
            Some(v) => Ok(Some(PathBuf::from(v))),
        }
    };
    let ca = path("tls-ca", &raw.tls_ca)?;
    let identity = match (
        path("tls-cert", &raw.tls_cert)?,
        path("tls-key", &raw.tls_key)?,
    ) {
        (None, None) => None,
        (Some(cert), Some(key)) => Some((cert, key)),
        (Some(cert), None) => {
            return Err(cx.invalid(
                E,
                "tls-cert",
                &cert.display().to_string(),
                ValueProblem::Detail("tls-key is missing"),
                "tls-cert and tls-key together, or neither",
            ))
        }
        (None, Some(key)) => {
            return Err(cx.invalid(
                E,
                "tls-key",
                &key.display().to_string(),
                ValueProblem::Detail("tls-cert is missing"),
                "tls-cert and tls-key together, or neither",
            ))
        }
    };
    let tls = match (ca, identity) {
        (Some(ca), identity) => Some(AgentTls { ca, identity }),
        (None, None) => None,
        (None, Some((cert, _))) => {
            return Err(cx.invalid(
                E,
                "tls-cert",
                &cert.display().to_string(),
                ValueProblem::Detail("tls-ca is missing"),
                "tls-ca beside tls-cert and tls-key (the registrar's certificate is checked)",
            ))
        }
    };
    Ok(AgentSettings {
        register_expires,
        max_subscription_expires,
        calls_source,
        notify_min_interval_ms,
        notify_top_interval_ms,
        notify_high_water,
        sample_interval_ms,
        node_name,
        // Resolved by `validate` once `<transport>` is known.
        sip_port: d.sip_port,
        log_file,
        allow_subscribers,
        tls,
        engine_probe,
        engine_probe_interval_ms,
        engine_probe_timeout_ms,
        engine_probe_misses,
        time_scale: d.time_scale,
    })
}

/// The accepted `<agent calls-source>` values, as error messages list them.
const CALLS_SOURCES: &str = "proc, file:/path, fixed:N, rtpengine (its ng port at <pbyte><mcc>)";

/// `proc` | `file:/path` | `fixed:N` | `rtpengine`
pub(super) fn parse_calls_source(v: &str) -> Option<CallsSource> {
    if v == "proc" {
        return Some(CallsSource::ProcNetUdp);
    }
    if v == "rtpengine" {
        return Some(CallsSource::Rtpengine);
    }
    if let Some(p) = v.strip_prefix("file:") {
        return (!p.is_empty()).then(|| CallsSource::File(PathBuf::from(p)));
    }
    if let Some(n) = v.strip_prefix("fixed:") {
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        return n.parse().ok().map(CallsSource::Fixed);
    }
    None
}
