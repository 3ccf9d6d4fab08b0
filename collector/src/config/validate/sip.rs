//! `[sip]`, `[sip.tls]`, `[[accounts]]` and `[redirect]`: the tables that
//! shape what the collector listens on and whom it answers, checked
//! together because `[redirect]` must not take the registrar's address
//! and may only serve TLS with the certificate of `[sip.tls]`.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use super::super::raw::{RawAccount, RawRedirect, RawSip};
use super::super::*;
use super::{quoted, Invalid};
use crate::operator::names::{self, CharName, NameKind};

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

/// `[sip]`: a specific listen address (the Contact MSRs send NOTIFYs to),
/// udp among the transports, a realm that fits a quoted string, the
/// expiry bounds in order, known digest algorithms.
pub(super) fn validate_sip(raw: &RawSip, invalid: Invalid<'_>) -> Result<SipConfig, ConfigError> {
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
pub(super) fn validate_accounts(
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
pub(super) fn validate_redirect(
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
