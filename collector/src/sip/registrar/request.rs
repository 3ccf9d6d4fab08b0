//! What a REGISTER says (RFC 3261 §10.3, SPEC §3): its structure, its
//! contacts with their names, expiries and engine parameters, and the
//! agent version in its `User-Agent`; and why a malformed one is answered
//! `400`. Parsing only: what the bindings become is the parent module's.

use msr_shared::engine::{EngineAddresses, EngineParamError};
use msr_shared::sip::{self, Request, Response, StatusCode};

use super::Registrar;
use crate::operator::names::{ContactName, MsrName, NameError, NameProblem};

/// Registration lifetime used when a REGISTER gives no `Expires` at all
/// (RFC 3261 §10.3 step 7 lets the registrar choose), seconds, before capping.
const DEFAULT_EXPIRES: u32 = 3600;

/// What was wrong with a REGISTER (answered `400`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum Malformed {
    #[error("no user part in the to uri")]
    NoToUser,
    #[error("missing call-id or cseq")]
    NoCallId,
    #[error("no contact header")]
    NoContact,
    #[error("bad expires value `{0}`")]
    BadExpires(String),
    #[error("bad contact `{0}`")]
    BadContact(String),
    /// A contact at an address nothing can be sent to (SPEC §3: the
    /// collector subscribes there).
    #[error("contact `{contact}` names {why}: nothing can be sent there")]
    UnreachableContact {
        /// The contact, escaped and cut as [`Malformed::BadContact`]'s.
        contact: String,
        /// What is wrong with its address.
        why: &'static str,
    },
    #[error("contact `*` needs expires 0 and no other contact")]
    BadWildcard,
    /// More contacts than one MSR may have.
    #[error("{0} contacts, at most {MAX_CONTACTS_PER_MSR} per msr")]
    TooManyContacts(usize),
    /// The media engine's addresses in a contact URI are wrong (SPEC §3).
    #[error("{0}")]
    BadEngine(EngineParamError),
    /// RFC 3261 §10.3 step 7: same Call-ID as the binding, CSeq not above
    /// the binding's: the update is aborted.
    #[error("cseq {got} not above the binding's {last}")]
    OldCSeq {
        /// The request's CSeq number.
        got: u32,
        /// The binding's.
        last: u32,
    },
    /// The `To` user or a contact's interface breaks the name rules.
    #[error("bad {field}: {problem}")]
    BadName {
        /// `msr name` (the `To` user), `iface` or `contact host:port`.
        field: &'static str,
        /// The rule broken.
        problem: NameProblem,
    },
}

/// One contact of a REGISTER, parsed.
#[derive(Debug)]
pub(super) struct ContactSpec {
    pub(super) name: ContactName,
    pub(super) uri: String,
    pub(super) engine: Option<EngineAddresses>,
    pub(super) expires: u32,
}

pub(super) enum ContactsSpec {
    Wildcard,
    List(Vec<ContactSpec>),
}

impl Registrar {
    pub(super) fn check_structure(
        &self,
        req: &Request,
    ) -> Result<(MsrName, String, u32), Malformed> {
        let to = sip::header(&req.headers, "To").ok_or(Malformed::NoToUser)?;
        let user = sip::uri_user(sip::addr_uri(to)).ok_or(Malformed::NoToUser)?;
        let msr = MsrName::new(user).map_err(|e| bad_name("msr name", &e))?;
        let call_id = sip::call_id(&req.headers)
            .ok_or(Malformed::NoCallId)?
            .to_owned();
        let (cseq, _) = sip::cseq(&req.headers).ok_or(Malformed::NoCallId)?;
        if let Some(e) = sip::header(&req.headers, "Expires") {
            if e.parse::<u32>().is_err() {
                return Err(Malformed::BadExpires(e.to_owned()));
            }
        }
        Ok((msr, call_id, cseq))
    }
}

/// A name in `field` that breaks its rules.
fn bad_name(field: &'static str, error: &NameError) -> Malformed {
    Malformed::BadName {
        field,
        // Both parts are checked before the contact name is formed, so a
        // problem is always named; `@` is the one character that could be
        // missing.
        problem: error
            .problem()
            .cloned()
            .unwrap_or(NameProblem::Char { ch: '@' }),
    }
}

pub(super) fn bad_request(req: &Request, to_tag: &str, why: &dyn std::fmt::Display) -> Response {
    let mut resp = sip::response(req, StatusCode::BadRequest, Some(to_tag));
    sip::push_header(&mut resp.headers, "Warning", warning(&why.to_string()));
    resp
}

/// A `Warning: 399` value (RFC 3261 §20.43) carrying `text`, which the
/// agent logs with the refusal: quotes and control characters replaced.
pub(super) fn warning(text: &str) -> String {
    let text: String = text
        .chars()
        .take(200)
        .map(|c| {
            if c == '"' || c == '\\' || c.is_control() {
                '\''
            } else {
                c
            }
        })
        .collect();
    format!("399 msr-collector \"{text}\"")
}

pub(super) fn parse_contacts(req: &Request, msr: &MsrName) -> Result<ContactsSpec, Malformed> {
    let header_expires = match sip::header(&req.headers, "Expires") {
        Some(v) => Some(
            v.parse::<u32>()
                .map_err(|_| Malformed::BadExpires(v.to_owned()))?,
        ),
        None => None,
    };
    let values: Vec<&str> = sip::header_all(&req.headers, "Contact")
        .into_iter()
        .flat_map(|v| sip::split_outside_quotes(v, ','))
        .map(str::trim)
        .collect();
    if values.is_empty() {
        return Err(Malformed::NoContact);
    }
    if values.contains(&"*") {
        return if values.len() == 1 && header_expires == Some(0) {
            Ok(ContactsSpec::Wildcard)
        } else {
            Err(Malformed::BadWildcard)
        };
    }
    if values.len() > MAX_CONTACTS_PER_MSR {
        return Err(Malformed::TooManyContacts(values.len()));
    }
    let mut list = Vec::new();
    for v in values {
        let uri = sip::addr_uri(v);
        let valid = (uri.starts_with("sip:") || uri.starts_with("sips:"))
            && uri.len() <= MAX_CONTACT_URI_LEN
            && !uri.chars().any(|c| c.is_control() || c.is_whitespace())
            && rsipstack::sip::Uri::try_from(uri).is_ok();
        if !valid {
            return Err(Malformed::BadContact(shown(v)));
        }
        if let Some(why) = unusable_address(host_port(uri)) {
            return Err(Malformed::UnreachableContact {
                contact: shown(v),
                why,
            });
        }
        let expires = match sip::param(v, "expires") {
            Some(e) => e
                .parse::<u32>()
                .map_err(|_| Malformed::BadExpires(e.clone()))?,
            None => header_expires.unwrap_or(DEFAULT_EXPIRES),
        };
        let (iface, field) = match sip::param(v, "iface").filter(|i| !i.is_empty()) {
            Some(iface) => (iface, "iface"),
            None => (host_port(uri).to_owned(), "contact host:port"),
        };
        let name = ContactName::of(&iface, msr).map_err(|e| bad_name(field, &e))?;
        let engine = EngineAddresses::from_uri(uri).map_err(Malformed::BadEngine)?;
        list.push(ContactSpec {
            name,
            uri: uri.to_owned(),
            engine,
            expires,
        });
    }
    Ok(ContactsSpec::List(list))
}

/// A contact as a refusal shows it (the 400's `Warning` and the log):
/// escaped and cut, never raw.
fn shown(contact: &str) -> String {
    contact
        .chars()
        .take(80)
        .collect::<String>()
        .escape_debug()
        .to_string()
}

/// The `host[:port]` of a SIP URI (`sip:user@host:port;params`).
fn host_port(uri: &str) -> &str {
    let rest = uri.split_once(':').map_or(uri, |(_, r)| r);
    let host = rest.split_once('@').map_or(rest, |(_, h)| h);
    host.split([';', '?']).next().unwrap_or(host)
}

/// Why a contact's `host[:port]` can receive nothing, when it is an IP
/// address: the unspecified address, a multicast or broadcast one, or
/// port 0. A name is left to the resolver.
fn unusable_address(host_port: &str) -> Option<&'static str> {
    let (host, port) = match host_port.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((host, rest)) => (host, rest.strip_prefix(':')),
            None => return None,
        },
        None => match host_port.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        },
    };
    if port == Some("0") {
        return Some("port 0");
    }
    match host.parse::<std::net::IpAddr>().ok()? {
        ip if ip.is_unspecified() => Some("the unspecified address"),
        ip if ip.is_multicast() => Some("a multicast address"),
        std::net::IpAddr::V4(v4) if v4.is_broadcast() => Some("the broadcast address"),
        _ => None,
    }
}

/// The version in a `User-Agent` value: the text after the first `/` of
/// its first product token (`msr-agent/0.1.0 (linux)` → `0.1.0`).
pub(super) fn agent_version(user_agent: &str) -> Option<String> {
    let product = user_agent.split_whitespace().next()?;
    let (_, version) = product.split_once('/')?;
    // A version is shown in tables and logs: a SIP token of at most 64
    // bytes (RFC 3261 §20.41 product-version), or nothing.
    let ok = !version.is_empty()
        && version.len() <= MAX_VERSION_LEN
        && version.chars().all(sip::is_token_char);
    ok.then(|| version.to_owned())
}

/// The longest agent version kept from a `User-Agent`, bytes.
const MAX_VERSION_LEN: usize = 64;

/// The longest contact URI accepted, bytes: the agent's is under 200 with
/// every engine parameter; a longer one only bloats the 200 OK that lists
/// every contact (over UDP, RFC 3261 §18.1.1).
pub const MAX_CONTACT_URI_LEN: usize = 512;

/// The most contacts one MSR may register (one per interface).
pub const MAX_CONTACTS_PER_MSR: usize = 16;
