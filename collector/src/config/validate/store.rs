//! `[store]`: where the operator configuration lives, the file beside
//! `[state]` or an etcd cluster, and every key of the etcd client (its
//! endpoints, prefix, lease, timeouts, credentials and TLS) checked before
//! the daemon dials it.

use std::time::Duration;

use super::super::raw::RawStore;
use super::super::*;
use super::{invalid_in, quoted};
use crate::operator::names;

/// `[store]`: `backend = "file"` takes no other key (a stray etcd key is a
/// mistake the operator should hear about); `backend = "etcd"` needs
/// `endpoints` and checks every key.
pub(super) fn validate_store(raw: RawStore, origin: &str) -> Result<StoreBackend, ConfigError> {
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
