//! From [`super::raw::RawConfig`] to [`super::CollectorConfig`]: every value
//! checked for its meaning; an error names the key, the value and what is
//! accepted (its position is added by [`super::parse`]).
//!
//! The listeners and accounts (`[sip]`, `[[accounts]]`, `[redirect]`) are
//! checked in [`sip`], the operator configuration's store in [`store`].

use std::net::SocketAddr;
use std::time::Duration;

use super::raw::{RawConfig, RawHealth, RawHttp, RawLegs, RawSelection, HTTP_OFF};
use super::*;
use crate::operator::names::{NameError, NameKind, SiteName, ZoneName};
use crate::operator::Placement;

mod sip;
mod store;

use sip::{validate_accounts, validate_redirect, validate_sip};
use store::validate_store;

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
    let refused = |key: &str, kind: NameKind, value: &str, e: NameError| {
        let problem = e
            .problem()
            .map_or_else(|| e.to_string(), ToString::to_string);
        invalid(
            key,
            quoted(value),
            &format!("a {kind} name of {} ({problem})", kind.accepted()),
        )
    };
    let (zone, site) = (&raw.defaults.zone, &raw.defaults.site);
    let defaults = Placement {
        zone: ZoneName::new(zone).map_err(|e| refused("defaults.zone", NameKind::Zone, zone, e))?,
        site: SiteName::new(site).map_err(|e| refused("defaults.site", NameKind::Site, site, e))?,
    };
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
    check_listeners(&sip, http.as_ref(), redirect.as_ref(), &invalid)?;
    let selection = validate_selection(&raw.selection, &invalid)?;
    Ok(CollectorConfig {
        http,
        redirect,
        node: raw.node,
        sip,
        accounts,
        defaults,
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

/// Two listeners of one protocol on one port of overlapping addresses (the
/// same, or one of them unspecified) cannot both bind: the start would
/// fail at the second. Said here, so `--check-config` names both keys;
/// port 0 (the system picks) never clashes.
fn check_listeners(
    sip: &SipConfig,
    http: Option<&HttpConfig>,
    redirect: Option<&RedirectConfig>,
    invalid: Invalid<'_>,
) -> Result<(), ConfigError> {
    let mut listeners: Vec<(&str, &str, SocketAddr)> = vec![("sip.listen", "udp", sip.listen)];
    if sip.tcp() {
        listeners.push(("sip.listen", "tcp", sip.listen));
    }
    if let Some(tls) = &sip.tls {
        listeners.push(("sip.tls.listen", "tcp", tls.listen));
    }
    if let Some(http) = http {
        listeners.push(("http.listen", "tcp", http.listen));
    }
    if let Some(redirect) = redirect {
        listeners.push(("redirect.listen", "udp", redirect.listen));
        if redirect.tcp {
            listeners.push(("redirect.listen", "tcp", redirect.listen));
        }
        if let Some(at) = redirect.tls_listen {
            listeners.push(("redirect.tls_listen", "tcp", at));
        }
    }
    for (i, (key, proto, addr)) in listeners.iter().enumerate() {
        let clash = listeners[..i].iter().find(|(_, other_proto, other)| {
            other_proto == proto
                && addr.port() != 0
                && other.port() == addr.port()
                && (other.ip() == addr.ip()
                    || other.ip().is_unspecified()
                    || addr.ip().is_unspecified())
        });
        if let Some((other_key, _, other)) = clash {
            return Err(invalid(
                key,
                quoted(&addr.to_string()),
                &format!("a {proto} port no other listener of this file takes ({other_key} = \"{other}\" has it)"),
            ));
        }
    }
    Ok(())
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
    if !(1..=10).contains(&raw.failover_attempts) {
        return Err(invalid(
            "selection.failover_attempts",
            raw.failover_attempts.to_string(),
            "1 to 10",
        ));
    }
    Ok(SelectionConfig {
        policy,
        notify_flight_time: Duration::from_millis(raw.notify_flight_time_ms),
        release_window: Duration::from_secs(raw.release_window_secs),
        failover_attempts: raw.failover_attempts,
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
    let counts = [
        ("health.failure_timeouts", raw.failure_timeouts),
        ("health.failure_errors", raw.failure_errors),
    ];
    for (key, value) in counts {
        if !(1..=1000).contains(&value) {
            return Err(invalid(key, value.to_string(), "1 to 1000"));
        }
    }
    let spans = [
        ("health.failure_window_secs", raw.failure_window_secs),
        ("health.failure_hold_secs", raw.failure_hold_secs),
    ];
    for (key, value) in spans {
        if !(1..=3600).contains(&value) {
            return Err(invalid(key, value.to_string(), "seconds, 1 to 3600"));
        }
    }
    Ok(HealthConfig {
        keepalive_interval: Duration::from_secs(raw.keepalive_interval_secs),
        keepalive_timeout: Duration::from_millis(raw.keepalive_timeout_ms),
        keepalive_misses: raw.keepalive_misses,
        unreported_grace: Duration::from_millis(raw.unreported_grace_ms),
        failures: super::FailureLimits {
            timeouts: raw.failure_timeouts,
            errors: raw.failure_errors,
            window: Duration::from_secs(raw.failure_window_secs),
            hold: Duration::from_secs(raw.failure_hold_secs),
        },
    })
}
