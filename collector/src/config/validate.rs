//! From [`super::raw::RawConfig`] to [`super::CollectorConfig`]: every value
//! checked for its meaning; an error names the key, the value and what is
//! accepted (its position is added by [`super::parse`]).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use super::raw::{
    RawAccount, RawConfig, RawHealth, RawHttp, RawLegs, RawRedirect, RawSelection, RawSip,
    RawStore, HTTP_OFF,
};
use super::*;
use crate::operator::names::{self, CharName, NameKind};

/// The [`ConfigError::Invalid`] of one key of the file `origin`, without
/// its position (found afterwards from the text).
fn invalid_in(origin: &str) -> impl Fn(&str, String, &str) -> ConfigError + '_ {
    move |key, value, expected| ConfigError::Invalid {
        origin: origin.to_owned(),
        position: None,
        key: key.to_owned(),
        value,
        expected: expected.to_owned(),
    }
}

/// A string value as the error shows it: quoted, escaped.
fn quoted(s: &str) -> String {
    format!("{s:?}")
}

/// What an error builder of [`invalid_in`] is, for the functions of one table.
type Invalid<'a> = &'a dyn Fn(&str, String, &str) -> ConfigError;

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

pub(super) fn validate(raw: RawConfig, origin: &str) -> Result<CollectorConfig, ConfigError> {
    let invalid = invalid_in(origin);

    if raw.node.trim().is_empty() || raw.node.chars().any(char::is_whitespace) {
        return Err(invalid(
            "node",
            quoted(&raw.node),
            "a non-empty name without spaces, e.g. \"core1@localhost\"",
        ));
    }
    let sip = validate_sip(&raw.sip, &invalid)?;
    let accounts = validate_accounts(&raw.accounts, &invalid)?;
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
    let legs = validate_legs(&raw.legs, &invalid)?;
    let http = validate_http(raw.http, origin)?;
    let redirect = validate_redirect(raw.redirect, &sip, &invalid)?;
    let selection = validate_selection(&raw.selection, &invalid)?;
    Ok(CollectorConfig {
        http,
        redirect,
        node: raw.node,
        sip,
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
        legs,
        selection,
    })
}

/// `[sip]`: a specific listen address (the Contact MSRs send NOTIFYs to),
/// udp among the transports, a realm that fits a quoted string, the
/// expiry bounds in order, known digest algorithms.
fn validate_sip(raw: &RawSip, invalid: Invalid<'_>) -> Result<SipConfig, ConfigError> {
    let listen: SocketAddr = raw.listen.parse().map_err(|_| {
        invalid(
            "sip.listen",
            quoted(&raw.listen),
            "an ip:port socket address, e.g. \"127.0.0.1:5060\"",
        )
    })?;
    if listen.ip().is_unspecified() {
        // The address goes into the Contact of every SUBSCRIBE: MSRs send
        // their NOTIFYs there, so it must be one they can reach.
        return Err(invalid(
            "sip.listen",
            quoted(&raw.listen),
            "a specific ip:port (it is the Contact MSRs send NOTIFYs to), not 0.0.0.0 or [::]",
        ));
    }
    let mut transports = BTreeSet::new();
    for t in &raw.transports {
        match t.to_ascii_lowercase().as_str() {
            "udp" => transports.insert(Transport::Udp),
            "tcp" => transports.insert(Transport::Tcp),
            "tls" => transports.insert(Transport::Tls),
            _ => {
                return Err(invalid(
                    "sip.transports",
                    quoted(t),
                    "\"udp\", \"tcp\" or \"tls\"",
                ))
            }
        };
    }
    if !transports.contains(&Transport::Udp) {
        return Err(invalid(
            "sip.transports",
            format!("{:?}", raw.transports),
            "a list containing \"udp\" (keepalives to udp contacts leave from it), \
             optionally \"tcp\" and \"tls\"",
        ));
    }
    let tls = validate_sip_tls(raw, listen, transports.contains(&Transport::Tls), invalid)?;
    let realm = raw.realm.trim_matches(' ');
    if let Some(problem) = realm_problem(realm) {
        return Err(invalid(
            "sip.realm",
            quoted(&raw.realm),
            &format!(
                "a non-empty digest realm of printable characters without `\"` or `\\`, \
                 e.g. \"msr.local\" ({problem})"
            ),
        ));
    }
    if raw.nonce_ttl_secs == 0 || raw.nonce_ttl_secs > 86_400 {
        return Err(invalid(
            "sip.nonce_ttl_secs",
            raw.nonce_ttl_secs.to_string(),
            "seconds, 1 to 86400",
        ));
    }
    if raw.min_expires == 0 {
        return Err(invalid(
            "sip.min_expires",
            raw.min_expires.to_string(),
            "seconds, at least 1",
        ));
    }
    if raw.max_expires < raw.min_expires {
        return Err(invalid(
            "sip.max_expires",
            raw.max_expires.to_string(),
            &format!("seconds, at least sip.min_expires ({})", raw.min_expires),
        ));
    }
    let mut digest_algorithms = Vec::new();
    for a in &raw.digest_algorithms {
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
    Ok(SipConfig {
        listen,
        transports: transports.into_iter().collect(),
        realm: realm.to_owned(),
        nonce_ttl: Duration::from_secs(raw.nonce_ttl_secs),
        min_expires: raw.min_expires,
        max_expires: raw.max_expires,
        digest_algorithms,
        tls,
    })
}

/// `[sip.tls]`: there exactly when `"tls"` is a transport, with a
/// specific listen address and both `cert` and `key`.
fn validate_sip_tls(
    raw: &RawSip,
    sip_listen: SocketAddr,
    wanted: bool,
    invalid: Invalid<'_>,
) -> Result<Option<SipTls>, ConfigError> {
    let tls = match (&raw.tls, wanted) {
        (None, false) => return Ok(None),
        (None, true) => {
            return Err(invalid(
                "sip.tls",
                "(missing)".into(),
                "a [sip.tls] table with `cert` and `key` when sip.transports has \"tls\"",
            ))
        }
        (Some(_), false) => {
            return Err(invalid(
                "sip.transports",
                format!("{:?}", raw.transports),
                "a list containing \"tls\" when [sip.tls] is set",
            ))
        }
        (Some(tls), true) => tls,
    };
    let listen = match &tls.listen {
        None => {
            let port = if sip_listen.port() == 0 {
                0
            } else {
                DEFAULT_TLS_PORT
            };
            SocketAddr::new(sip_listen.ip(), port)
        }
        Some(text) => {
            let listen: SocketAddr = text.parse().map_err(|_| {
                invalid(
                    "sip.tls.listen",
                    quoted(text),
                    "an ip:port socket address, e.g. \"127.0.0.1:5061\"",
                )
            })?;
            if listen.ip().is_unspecified() {
                return Err(invalid(
                    "sip.tls.listen",
                    quoted(text),
                    "a specific ip:port (it is the sips: Contact MSRs send NOTIFYs to), \
                     not 0.0.0.0 or [::]",
                ));
            }
            listen
        }
    };
    let file = |key: &str, value: &Option<PathBuf>, what: &str| {
        value
            .clone()
            .filter(|p| !p.as_os_str().is_empty())
            .ok_or_else(|| invalid(key, "(missing)".into(), what))
    };
    Ok(Some(SipTls {
        listen,
        cert: file(
            "sip.tls.cert",
            &tls.cert,
            "the path of the collector's certificate chain (pem)",
        )?,
        key: file(
            "sip.tls.key",
            &tls.key,
            "the path of the collector's private key (pem)",
        )?,
        client_ca: tls.client_ca.clone().filter(|p| !p.as_os_str().is_empty()),
        require: tls.require,
    }))
}

/// `[[accounts]]`: unique user names that fit a digest header, non-empty
/// passwords, valid MSR names.
fn validate_accounts(
    raw: &[RawAccount],
    invalid: Invalid<'_>,
) -> Result<Vec<Account>, ConfigError> {
    let mut accounts: Vec<Account> = Vec::new();
    for (i, a) in raw.iter().enumerate() {
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
    Ok(accounts)
}

/// `[redirect]`: a specific address other than the registrar's, and who
/// may ask (default: the listen host).
fn validate_redirect(
    raw: Option<RawRedirect>,
    sip: &SipConfig,
    invalid: Invalid<'_>,
) -> Result<Option<RedirectConfig>, ConfigError> {
    let sip_listen = sip.listen;
    let redirect = match raw {
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
            if addr.port() != 0 && addr == sip_listen {
                return Err(invalid(
                    "redirect.listen",
                    quoted(&r.listen),
                    "an address other than sip.listen (the registrar's socket)",
                ));
            }
            let allow = match r.allow {
                None => vec![ipnet::IpNet::from(addr.ip())],
                Some(list) => {
                    let mut nets = Vec::with_capacity(list.len());
                    for item in &list {
                        let net = item
                            .parse::<ipnet::IpNet>()
                            .or_else(|_| item.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                            .map_err(|_| {
                                invalid(
                                    "redirect.allow",
                                    quoted(item),
                                    "ip addresses or networks of the softswitch, e.g. [\"127.0.0.1\", \"10.0.0.0/24\"]",
                                )
                            })?;
                        nets.push(net);
                    }
                    if nets.is_empty() {
                        return Err(invalid(
                            "redirect.allow",
                            "[]".to_owned(),
                            "at least one address or network (an empty list serves no one)",
                        ));
                    }
                    nets
                }
            };
            let (mut tcp, mut tls) = (false, false);
            for t in r.transports.iter().flatten() {
                match t.to_ascii_lowercase().as_str() {
                    "udp" => {}
                    "tcp" => tcp = true,
                    "tls" => tls = true,
                    _ => {
                        return Err(invalid(
                            "redirect.transports",
                            quoted(t),
                            "\"udp\" and optionally \"tcp\", \"tls\"",
                        ))
                    }
                }
            }
            let tls_listen = match (&r.tls_listen, tls) {
                (None, false) => None,
                (Some(text), false) => {
                    return Err(invalid(
                        "redirect.tls_listen",
                        quoted(text),
                        "no value unless redirect.transports has \"tls\"",
                    ))
                }
                (None, true) => {
                    return Err(invalid(
                        "redirect.tls_listen",
                        "(missing)".into(),
                        "the ip:port of the redirect server's tls listener when redirect.transports has \"tls\"",
                    ))
                }
                (Some(text), true) => {
                    let at: SocketAddr = text.parse().map_err(|_| {
                        invalid(
                            "redirect.tls_listen",
                            quoted(text),
                            "an ip:port socket address, e.g. \"127.0.0.1:5063\"",
                        )
                    })?;
                    if at.ip().is_unspecified() {
                        return Err(invalid(
                            "redirect.tls_listen",
                            quoted(text),
                            "a specific ip:port, not 0.0.0.0 or [::]",
                        ));
                    }
                    if sip.tls.is_none() {
                        return Err(invalid(
                            "redirect.transports",
                            quoted("tls"),
                            "\"tls\" only with a [sip.tls] table (its certificate is used)",
                        ));
                    }
                    Some(at)
                }
            };
            if r.transports
                .as_ref()
                .is_some_and(|ts| !ts.iter().any(|t| t.eq_ignore_ascii_case("udp")))
            {
                return Err(invalid(
                    "redirect.transports",
                    format!("{:?}", r.transports.unwrap_or_default()),
                    "a list containing \"udp\", optionally \"tcp\" and \"tls\"",
                ));
            }
            Some(RedirectConfig {
                listen: addr,
                allow,
                tcp,
                tls_listen,
            })
        }
    };
    Ok(redirect)
}

/// `[selection]`: the policy's name, the NOTIFY flight time and the
/// release window (SPEC §10).
fn validate_selection(
    raw: &RawSelection,
    invalid: Invalid<'_>,
) -> Result<SelectionConfig, ConfigError> {
    let policy = match raw.policy.as_str() {
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
    if raw.notify_flight_time_ms > 10_000 {
        return Err(invalid(
            "selection.notify_flight_time_ms",
            raw.notify_flight_time_ms.to_string(),
            "milliseconds, 0 to 10000",
        ));
    }
    if !(1..=86_400).contains(&raw.release_window_secs) {
        return Err(invalid(
            "selection.release_window_secs",
            raw.release_window_secs.to_string(),
            "seconds, 1 to 86400",
        ));
    }
    Ok(SelectionConfig {
        policy,
        notify_flight_time: Duration::from_millis(raw.notify_flight_time_ms),
        release_window: Duration::from_secs(raw.release_window_secs),
    })
}

/// `[legs]`: the maximum duration and the two conference thresholds
/// (SPEC §9).
fn validate_legs(raw: &RawLegs, invalid: Invalid<'_>) -> Result<LegsConfig, ConfigError> {
    if !(1..=7 * 86_400).contains(&raw.max_duration_secs) {
        return Err(invalid(
            "legs.max_duration_secs",
            raw.max_duration_secs.to_string(),
            "seconds, 1 to 604800 (7 days)",
        ));
    }
    for (key, value) in [
        (
            "legs.existing_conference_threshold",
            raw.existing_conference_threshold,
        ),
        (
            "legs.new_conference_threshold",
            raw.new_conference_threshold,
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
    Ok(LegsConfig {
        max_duration: Duration::from_secs(raw.max_duration_secs),
        existing_conference_threshold: f64::from(raw.existing_conference_threshold) / 100.0,
        new_conference_threshold: f64::from(raw.new_conference_threshold) / 100.0,
    })
}

/// `[http]`: on at `127.0.0.1:8080` unless `listen = "off"` (SPEC §11);
/// a loopback `listen` may go without a token; any other address needs one
/// (SPEC §11: loopback by default), and a token is printable ASCII without
/// spaces, 16–256 bytes (RFC 6750 §2.1 `b64token`).
fn validate_http(raw: RawHttp, origin: &str) -> Result<Option<HttpConfig>, ConfigError> {
    let invalid = invalid_in(origin);
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
    let invalid = invalid_in(origin);
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
fn validate_health(raw: &RawHealth, invalid: Invalid<'_>) -> Result<HealthConfig, ConfigError> {
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
