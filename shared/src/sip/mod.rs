//! SIP helpers over rsipstack's message model.
//!
//! rsipstack (`rsipstack::sip`) is the only SIP message model in the
//! codebase; this module adds what both daemons need on top of it:
//!
//! * string-level header access that never panics on peer input
//!   ([`header`], [`param`], [`tag`], [`cseq`], [`expires`]);
//! * the RFC 6665 §8.2.3 `Subscription-State` header ([`SubscriptionStateHeader`]);
//! * message construction for the sans-IO cores ([`request`], [`response`]);
//! * [`transaction`], the non-INVITE client and server transactions,
//!   sans-IO;
//! * [`SipEndpoint`], the async adapter between a daemon's event loop and
//!   the network over those transactions (the only I/O in this crate).

pub mod digest;
mod endpoint;
pub mod transaction;
pub mod wire;

pub use endpoint::{
    std_udp_socket, udp_socket, EndpointError, ServerTransaction, SipEndpoint, SipEvent, TlsClient,
    TlsFileError, MAX_DATAGRAM, OVERSIZED_LOG_INTERVAL,
};
pub use rsipstack::sip::{Header, Headers, Method, Request, Response, SipMessage, StatusCode, Uri};

use std::fmt;

/// The marks RFC 3261 §25.1 allows in a `token` besides ASCII letters and
/// digits.
pub const TOKEN_MARKS: &str = "-.!%*_+`'~";

/// Whether `c` is an RFC 3261 §25.1 `token` character.
pub fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || TOKEN_MARKS.contains(c)
}

/// Longest MSR name (`<dynamic msr_name>`, the user part of the AOR),
/// bytes. The agent refuses a longer one in its config; the collector's
/// registrar answers a REGISTER with a longer one 400.
pub const MAX_MSR_NAME_LEN: usize = 128;

/// Whether `name` is an MSR name (SPEC §2-3): a non-empty RFC 3261 `token`
/// (§25.1; the user part of the AOR) of at most [`MAX_MSR_NAME_LEN`] bytes.
/// The agent's config check is this; the collector's `NameKind::Msr`
/// explains a refusal in detail and is held to this by a test.
pub fn is_msr_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_MSR_NAME_LEN && name.chars().all(is_token_char)
}

/// The value of the first header called `name` (case-insensitive; compact
/// forms are expanded by the parser), or `None`.
pub fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|h| h.name().eq_ignore_ascii_case(name))
        .map(|h| h.value().trim())
}

/// The values of every header called `name`, in order.
pub fn header_all<'a>(headers: &'a Headers, name: &str) -> Vec<&'a str> {
    headers
        .iter()
        .filter(|h| h.name().eq_ignore_ascii_case(name))
        .map(|h| h.value().trim())
        .collect()
}

/// The top `Via` value: the first value of the first `Via` header (values
/// are separated by commas outside quotes, RFC 3261 §7.3.1).
pub fn top_via(headers: &Headers) -> Option<&str> {
    let via = header(headers, "Via")?;
    Some(parts_outside_quotes(via, ',').next().unwrap_or(via))
}

/// The sent-by of a `Via` value (`SIP/2.0/UDP host:port;branch=…` →
/// `host:port`, RFC 3261 §20.42); empty when it has none. The grammar lets
/// LWS surround the protocol's slashes (`SLASH = SWS "/" SWS`, §25.1:
/// `SIP / 2.0 / UDP`, RFC 4475 §3.1.1.1), so the sent-by is what follows
/// the transport after the last slash.
pub fn via_sent_by(via: &str) -> &str {
    let head = via.split(';').next().unwrap_or("");
    let Some((_, after)) = head.rsplit_once('/') else {
        return "";
    };
    after
        .trim_start()
        .split_once(char::is_whitespace)
        .map_or("", |(_, sent_by)| sent_by.trim())
}

/// The IP of a sent-by or `host[:port]` (an IPv6 reference in brackets),
/// `None` when the host is a name.
pub fn host_ip(host_port: &str) -> Option<std::net::IpAddr> {
    if let Some(rest) = host_port.strip_prefix('[') {
        let (ip, _) = rest.split_once(']')?;
        return ip
            .parse()
            .ok()
            .map(|ip: std::net::IpAddr| ip.to_canonical());
    }
    let host = host_port
        .rsplit_once(':')
        .map_or(host_port, |(host, _)| host);
    host.trim()
        .parse()
        .ok()
        .map(|ip: std::net::IpAddr| ip.to_canonical())
}

/// The port of a sent-by or `host[:port]`, `None` when it names none.
pub fn host_port(host_port: &str) -> Option<u16> {
    let tail = match host_port.strip_prefix('[') {
        Some(rest) => rest.split_once(']')?.1,
        None => host_port,
    };
    tail.rsplit_once(':')?.1.trim().parse().ok()
}

/// Appends `name: value` to `headers`.
pub fn push_header(headers: &mut Headers, name: &str, value: impl Into<String>) {
    headers.push(rsipstack::sip::headers::make_header(name, value.into()));
}

/// Replaces every `name` header with a single `name: value`.
pub fn set_header(headers: &mut Headers, name: &str, value: impl Into<String>) {
    headers.retain(|h| !h.name().eq_ignore_ascii_case(name));
    push_header(headers, name, value);
}

/// Splits `value` at `sep` outside quoted strings (RFC 3261 §25.1, with
/// `\"` escapes) and `<…>`; each part trimmed, empty parts left out. The
/// one splitter for header lists (`Contact: a, b`), header parameters
/// (`;`) and auth parameters (`,`, RFC 7616 §3.3).
pub fn split_outside_quotes(value: &str, sep: char) -> Vec<&str> {
    parts_outside_quotes(value, sep).collect()
}

/// [`split_outside_quotes`] as an iterator, for a reader that stops at the
/// part it looks for and need not collect the rest. `sep` is ASCII (`,`
/// or `;`): the scan reads bytes, which no UTF-8 continuation byte can
/// mistake for it or for a quote or angle bracket (every request's `Via`
/// passes here).
pub fn parts_outside_quotes(value: &str, sep: char) -> impl Iterator<Item = &str> {
    debug_assert!(sep.is_ascii(), "an ASCII separator");
    let sep = u8::try_from(sep).unwrap_or(b',');
    let mut rest = Some(value);
    std::iter::from_fn(move || loop {
        let current = rest?;
        let (mut quoted, mut escaped, mut angle) = (false, false, false);
        let mut end = None;
        // Most values hold no quote or angle bracket (a Via, a CSeq): the
        // separator is then found by `str::find` (memchr), not a byte at
        // a time.
        let plain = !current.bytes().any(|b| b == b'"' || b == b'<');
        let scan = if plain {
            end = current.find(char::from(sep));
            &[][..]
        } else {
            current.as_bytes()
        };
        for (i, &b) in scan.iter().enumerate() {
            if escaped {
                escaped = false;
                continue;
            }
            match b {
                b'\\' if quoted => escaped = true,
                b'"' => quoted = !quoted,
                b'<' if !quoted => angle = true,
                b'>' if !quoted => angle = false,
                b if b == sep && !quoted && !angle => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let part = match end {
            Some(i) => {
                rest = current.get(i + 1..);
                current.get(..i).unwrap_or("").trim()
            }
            None => {
                rest = None;
                current.trim()
            }
        };
        if !part.is_empty() {
            return Some(part);
        }
    })
}

/// The value of a quoted string without its quotes and escapes
/// (`"a\"b"` → `a"b`); any other value trimmed as it is.
pub fn unquote(value: &str) -> String {
    let v = value.trim();
    match v.strip_prefix('"').and_then(|rest| rest.strip_suffix('"')) {
        Some(inner) => {
            let mut out = String::with_capacity(inner.len());
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                if c == '\\' {
                    if let Some(next) = chars.next() {
                        out.push(next);
                    }
                } else {
                    out.push(c);
                }
            }
            out
        }
        None => v.trim_matches('"').to_owned(),
    }
}

/// One `name[=value]` parameter: the name lowercased, the value unquoted.
pub fn name_value(part: &str) -> (String, Option<String>) {
    match part.split_once('=') {
        Some((k, v)) => (k.trim().to_ascii_lowercase(), Some(unquote(v))),
        None => (part.trim().to_ascii_lowercase(), None),
    }
}

/// The header parameters of a header value: the `;`-separated parts after
/// the name-addr (outside `<…>` and quotes), as `(name, value)` with names
/// lowercased and values unquoted.
pub fn params(value: &str) -> Vec<(String, Option<String>)> {
    parts_outside_quotes(params_tail(value), ';')
        .map(name_value)
        .collect()
}

/// The part of a header value that holds its parameters: after the
/// name-addr's `>`, else from the first `;`.
fn params_tail(value: &str) -> &str {
    match value.rfind('>') {
        Some(i) => &value[i + 1..],
        None => match value.find(';') {
            Some(i) => &value[i..],
            None => "",
        },
    }
}

/// The value of header parameter `name` in a header value (see [`params`]):
/// the first parameter of that name, `None` when it has no value. Read in
/// place (every request's branch and tags pass here): only the value found
/// is copied.
pub fn param(value: &str, name: &str) -> Option<String> {
    parts_outside_quotes(params_tail(value), ';')
        .find(|part| {
            part.split_once('=')
                .map_or(*part, |(k, _)| k)
                .trim()
                .eq_ignore_ascii_case(name)
        })
        .and_then(|part| part.split_once('=').map(|(_, v)| unquote(v)))
}

/// The `tag` parameter of a `From`/`To` value (RFC 3261 §19.3).
pub fn tag(value: &str) -> Option<String> {
    param(value, "tag").filter(|t| !t.is_empty())
}

/// The URI inside a name-addr (`"x" <sip:a@b>;p=1` → `sip:a@b`), or the
/// addr-spec up to its header parameters.
pub fn addr_uri(value: &str) -> &str {
    if let (Some(start), Some(end)) = (value.find('<'), value.rfind('>')) {
        if start < end {
            return value[start + 1..end].trim();
        }
    }
    value.split(';').next().unwrap_or(value).trim()
}

/// The user part of a SIP URI (`sip:msr_1@host:5060` → `msr_1`).
pub fn uri_user(uri: &str) -> Option<&str> {
    let rest = uri.split_once(':').map(|(_, r)| r)?;
    let (user, _) = rest.split_once('@')?;
    let user = user.split(':').next().unwrap_or(user);
    (!user.is_empty()).then_some(user)
}

/// The connection a request to `uri` must go over (RFC 3261 §19.1.2,
/// §18.1.1): TLS for `sips:` or `transport=tls`, TCP for `transport=tcp`;
/// `None` for UDP.
pub fn stream_transport(uri: &str) -> Option<rsipstack::sip::Transport> {
    let lower = uri.to_ascii_lowercase();
    let params = lower.split('?').next().unwrap_or("");
    let transport = params
        .split(';')
        .skip(1)
        .find_map(|p| p.strip_prefix("transport="));
    if lower.starts_with("sips:") || transport == Some("tls") {
        Some(rsipstack::sip::Transport::Tls)
    } else if transport == Some("tcp") {
        Some(rsipstack::sip::Transport::Tcp)
    } else {
        None
    }
}

/// Where a request to `uri` goes when the URI's host is an IP address:
/// that address (canonical: an IPv4-mapped IPv6 address as IPv4) and the
/// URI's port, else 5060 (5061 for `sips:`) — RFC 3263 §4.2 uses no DNS for
/// a numeric host. `None` for a host name or a URI that does not parse.
pub fn uri_socket_addr(uri: &str) -> Option<std::net::SocketAddr> {
    let parsed = Uri::try_from(uri).ok()?;
    let rsipstack::sip::Host::IpAddr(ip) = parsed.host_with_port.host else {
        return None;
    };
    let default = if parsed.scheme == Some(rsipstack::sip::Scheme::Sips) {
        5061
    } else {
        5060
    };
    let port = parsed.host_with_port.port.map_or(default, |p| p.value());
    Some(std::net::SocketAddr::new(ip.to_canonical(), port))
}

/// `Call-ID` of a message.
pub fn call_id(headers: &Headers) -> Option<&str> {
    header(headers, "Call-ID").filter(|v| !v.is_empty())
}

/// `CSeq` as `(number, method)`.
pub fn cseq(headers: &Headers) -> Option<(u32, String)> {
    let v = header(headers, "CSeq")?;
    let mut it = v.split_whitespace();
    let n = it.next()?.parse().ok()?;
    let m = it.next()?.to_ascii_uppercase();
    Some((n, m))
}

/// Why a request that parsed must still not be acted upon
/// ([`request_refusal`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRefusal {
    /// The status to answer.
    pub status: StatusCode,
    /// For the log and the answer's reason text.
    pub why: &'static str,
    /// The `Require` option-tags this UAS does not support, for a `420`'s
    /// `Unsupported` (RFC 3261 §8.2.2.3).
    pub unsupported: Option<String>,
}

impl RequestRefusal {
    fn new(status: u16, why: &'static str) -> Self {
        Self {
            status: StatusCode::from(status),
            why,
            unsupported: None,
        }
    }

    /// Adds what the status asks beside it to a response built for it:
    /// a `420`'s `Unsupported` (RFC 3261 §8.2.2.3, §20.40).
    pub fn complete(&self, response: &mut Response) {
        if let Some(tags) = &self.unsupported {
            push_header(&mut response.headers, "Unsupported", tags.clone());
        }
    }

    /// The stateless answer to `req`: [`response`] with this status and
    /// [`stateless_tag`], [`completed`](Self::complete), and the reason in
    /// a `Warning: 399` (RFC 3261 §20.43) from `server` (its product name,
    /// `msr-agent/0.2.0` → `msr-agent`), so the sender learns which check
    /// failed.
    pub fn response(&self, req: &Request, server: &str) -> Response {
        let mut response = response(req, self.status.clone(), Some(&stateless_tag(&req.headers)));
        self.complete(&mut response);
        let agent = server.split('/').next().unwrap_or(server);
        push_header(
            &mut response.headers,
            "Warning",
            format!("399 {agent} \"{}\"", self.why),
        );
        response
    }
}

/// Why a request that parsed must still not be acted upon, as RFC 3261 §8.2
/// orders a UAS's checks and RFC 4475 tests them; `None` for a request to
/// serve. In order:
///
/// * `505` for a SIP version other than 2.0 (§8.2.2 ... §21.5.7, RFC 4475
///   §3.1.2.16);
/// * `400` for a request a response cannot be matched to: no `Via`,
///   `From`, `To`, `Call-ID` or `CSeq` (§8.1.1, RFC 4475 §3.3.1), one of
///   those (or `Max-Forwards`, `Content-Type`) more than once (§7.3.1,
///   RFC 4475 §3.3.8), a `Via` value that is no `via-parm` (§20.42, RFC
///   4475 §3.1.2.1), an unterminated quoted display name (§25.1, RFC 4475
///   §3.1.2.6), a `CSeq` whose method is not the request line's (§8.1.1.5,
///   RFC 4475 §3.1.2.17) or whose number is not below 2^31 (§8.1.1.5, RFC
///   4475 §3.1.2.4), a Request-URI with headers (§19.1.5, RFC 4475
///   §3.1.2.11), more than one `Content-Length` (RFC 4475 §3.3.9) or one
///   that is no number or longer than the body (§18.3, RFC 4475
///   §3.1.2.2-3);
/// * for a method in the port's `allow` only — another gets the port's
///   `405` or `501` first (§8.2.1) — `416` for a Request-URI scheme other
///   than `sip`, `sips` and `tel` (§8.2.2.1, RFC 4475 §3.3.2-3), then `420`
///   with the option-tags for a `Require` (§8.2.2.3, RFC 4475 §3.3.5):
///   these servers support no extension a request may require;
///   `Proxy-Require` is a proxy's and is ignored.
pub fn request_refusal(req: &Request, allow: &str) -> Option<RequestRefusal> {
    if req.version != rsipstack::sip::Version::V2 {
        return Some(RequestRefusal::new(505, "sip version not supported"));
    }
    // Every request passes here (60,000 NOTIFYs a second): one pass over
    // the headers, counting, with no allocation.
    let mut counts = [0_u8; 7];
    let mut require: Option<&str> = None;
    let (mut cseq, mut lengths, mut length) = ("", 0_usize, None);
    for h in req.headers.iter() {
        // The parser has already told long and compact names apart
        // (§7.3.3): the variant is the header.
        let single = match h {
            Header::From(_) => 0,
            Header::To(_) => 1,
            Header::CallId(value) => {
                // Call-ID = word ["@" word] (§25.1): not empty.
                if value.value().trim().is_empty() {
                    return Some(RequestRefusal::new(400, "an empty call-id"));
                }
                2
            }
            Header::CSeq(value) => {
                cseq = value.value();
                3
            }
            Header::MaxForwards(value) => {
                // Max-Forwards = 1*DIGIT (§20.22).
                if value.value().trim().parse::<u32>().is_err() {
                    return Some(RequestRefusal::new(400, "a max-forwards that is no number"));
                }
                4
            }
            Header::ContentType(_) => 5,
            Header::Via(via) => {
                // An empty value (`Via: , SIP/2.0/UDP h`) is no via-parm
                // either; the splitter leaves empty parts out.
                let value = via.value().trim();
                if value.starts_with(',')
                    || value.ends_with(',')
                    || !parts_outside_quotes(value, ',').all(|v| wire::via_shape(v.trim()))
                {
                    return Some(RequestRefusal::new(400, "a via that is no via-parm"));
                }
                6
            }
            Header::ContentLength(value) => {
                lengths += 1;
                length = Some(value.value());
                continue;
            }
            Header::Require(tags) => {
                if !tags.value().trim().is_empty() {
                    require = Some(tags.value().trim());
                }
                continue;
            }
            _ => continue,
        };
        if single < 2 && !balanced_quotes(h.value()) {
            return Some(RequestRefusal::new(400, "an unterminated quoted string"));
        }
        if let Some(count) = counts.get_mut(single) {
            *count = count.saturating_add(1);
        }
    }
    if counts[..4].iter().chain([&counts[6]]).any(|c| *c == 0) {
        return Some(RequestRefusal::new(
            400,
            "a via, from, to, call-id or cseq is missing",
        ));
    }
    if counts[..6].iter().any(|c| *c > 1) {
        return Some(RequestRefusal::new(
            400,
            "a header that appears once appears more than once",
        ));
    }
    // The CSeq's number is below 2^31 (§8.1.1.5, RFC 4475 §3.1.2.4
    // scalar02); its method is compared as a parsed `Method`.
    let mut cseq = cseq.split_whitespace();
    let in_range = cseq
        .next()
        .and_then(|n| n.parse::<u32>().ok())
        .is_some_and(|n| n < 1 << 31);
    if !in_range {
        return Some(RequestRefusal::new(
            400,
            "a cseq number that is not below 2^31",
        ));
    }
    // CSeq = 1*DIGIT LWS Method (§20.16): the method is not optional.
    let Some(method) = cseq.next() else {
        return Some(RequestRefusal::new(400, "a cseq without a method"));
    };
    // Method names are case-sensitive (RFC 3261 §7.1) and every known
    // one is upper case: a lower-case letter is another method.
    if method.parse::<Method>().ok() != Some(req.method)
        || method.bytes().any(|b| b.is_ascii_lowercase())
    {
        return Some(RequestRefusal::new(
            400,
            "the cseq method is not the request's",
        ));
    }
    if !req.uri.headers.is_empty() {
        return Some(RequestRefusal::new(400, "a request-uri with headers"));
    }
    if lengths > 1 {
        return Some(RequestRefusal::new(400, "more than one content-length"));
    }
    // RFC 3261 §18.3, RFC 4475 §3.1.2.2-3: a Content-Length that is no
    // number, or longer than the body that came, is a 400. `wire::decode`
    // checks the raw bytes first; a request parsed elsewhere is checked
    // here too.
    if let Some(value) = length {
        match length_value(value) {
            Some(length) if length <= req.body.len() => {}
            Some(_) => {
                return Some(RequestRefusal::new(
                    400,
                    "content-length is longer than the body",
                ))
            }
            None => return Some(RequestRefusal::new(400, "content-length is not a number")),
        }
    }
    let served = allow
        .split(',')
        .any(|m| m.trim().parse::<Method>().ok() == Some(req.method));
    if !served {
        return None;
    }
    let supported = match &req.uri.scheme {
        Some(rsipstack::sip::Scheme::Sip | rsipstack::sip::Scheme::Sips) => true,
        Some(rsipstack::sip::Scheme::Other(other)) => other.eq_ignore_ascii_case("tel"),
        None => false,
    };
    if !supported {
        return Some(RequestRefusal::new(416, "unsupported uri scheme"));
    }
    if let Some(tags) = require.filter(|_| !matches!(req.method, Method::Ack | Method::Cancel)) {
        return Some(RequestRefusal {
            unsupported: Some(tags.to_owned()),
            ..RequestRefusal::new(420, "a required extension is not supported")
        });
    }
    None
}

/// Whether every quoted string in `value` ends (`quoted-string`, RFC 3261
/// §25.1, with its quoted-pairs).
fn balanced_quotes(value: &str) -> bool {
    let mut quoted = false;
    let mut escaped = false;
    for c in value.chars() {
        match (quoted, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (_, false, '"') => quoted = !quoted,
            _ => {}
        }
    }
    !quoted
}

/// A media type or an `Accept` range without its parameters, in lower
/// case: `Application/SDP; charset=utf-8` → `application/sdp`.
fn media_type(value: &str) -> String {
    value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// Whether the media type `media` falls in `range` (`*/*`, `type/*` or a
/// type; RFC 3261 §20.1, as HTTP's `Accept`).
fn in_range(range: &str, media: &str) -> bool {
    match range.strip_suffix("/*") {
        Some("*") => true,
        Some(kind) => media
            .split_once('/')
            .is_some_and(|(k, _)| k.eq_ignore_ascii_case(kind)),
        None => range.eq_ignore_ascii_case(media),
    }
}

/// RFC 3261 §8.2.3 (RFC 4475 §3.3.6): whether a request's body is of a
/// type its UAS does not read (`reads`: types or `type/*` ranges) and
/// may not be ignored. Such a request gets `415 Unsupported Media Type`
/// with an `Accept` that lists what is read. A body whose
/// `Content-Disposition` says `handling=optional` (§20.11; RFC 3204 asks
/// it of an ISUP body) is ignored instead, and a body without a
/// `Content-Type` is left to the caller, who may recognise it.
pub fn unsupported_body(req: &Request, reads: &[&str]) -> bool {
    if req.body.is_empty() {
        return false;
    }
    let Some(content_type) = header(&req.headers, "Content-Type") else {
        return false;
    };
    let media = media_type(content_type);
    if reads.iter().any(|range| in_range(range, &media)) {
        return false;
    }
    !header(&req.headers, "Content-Disposition")
        .and_then(|d| param(d, "handling"))
        .is_some_and(|h| h.eq_ignore_ascii_case("optional"))
}

/// RFC 3261 §8.2.3 and §20.12: whether a request's body comes in a
/// `Content-Encoding` other than `identity`, which a UAS that decodes none
/// (as this project's) does not understand. Such a request gets `415
/// Unsupported Media Type` with `Accept-Encoding: identity`. The header's
/// compact form `e` counts (§7.3.3); without a body there is nothing
/// encoded.
pub fn unsupported_encoding(req: &Request) -> bool {
    if req.body.is_empty() {
        return false;
    }
    req.headers
        .iter()
        .filter(|h| {
            h.name().eq_ignore_ascii_case("Content-Encoding") || h.name().eq_ignore_ascii_case("e")
        })
        .flat_map(|h| split_outside_quotes(h.value(), ','))
        .map(str::trim)
        .any(|coding| !coding.is_empty() && !coding.eq_ignore_ascii_case("identity"))
}

/// RFC 3261 §8.2.3, §21.4.7 (RFC 4475 §3.3.15): whether the request's
/// `Accept` rules out `answers`, the type of body the call's answer will
/// carry (the most specific range that covers it decides; at `q=0` it
/// refuses). Such a request gets
/// `406 Not Acceptable`. Without `Accept`, `application/sdp` is assumed
/// (§20.1); an `Accept` with no range at all is read the same way, since
/// refusing a call for an empty header would help no one.
pub fn unacceptable(req: &Request, answers: &str) -> bool {
    let ranges: Vec<&str> = header_all(&req.headers, "Accept")
        .into_iter()
        .flat_map(|value| split_outside_quotes(value, ','))
        .map(str::trim)
        .filter(|range| !range.is_empty())
        .collect();
    if ranges.is_empty() {
        return false;
    }
    // RFC 3261 §20.1 reads `Accept` as HTTP does (RFC 9110 §12.5.1): of
    // the ranges that cover the type, the most specific decides, so
    // `application/sdp;q=0, */*` refuses SDP. Ranges as specific as that
    // one all count: the type is acceptable if any of them allows it.
    let specificity = |media: &str| match media.strip_suffix("/*") {
        Some("*") => 0,
        Some(_) => 1,
        None => 2,
    };
    let covering: Vec<(u8, bool)> = ranges
        .iter()
        .filter_map(|range| {
            let media = media_type(range);
            in_range(&media, answers).then(|| {
                let refused = param(range, "q")
                    .and_then(|q| q.trim().parse::<f64>().ok())
                    .is_some_and(|q| q <= 0.0);
                (specificity(&media), refused)
            })
        })
        .collect();
    let Some(most) = covering.iter().map(|(s, _)| *s).max() else {
        return true;
    };
    covering
        .iter()
        .filter(|(s, _)| *s == most)
        .all(|(_, refused)| *refused)
}

/// A `Content-Length` value (RFC 3261 §20.14: `1*DIGIT`, white space
/// around it allowed): digits only, so `+5` or `-0` is no length, as Rust's
/// own number parser would read them.
pub fn length_value(value: &str) -> Option<usize> {
    let value = value.trim();
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

/// The `Expires` header in seconds, if present and numeric.
pub fn expires(headers: &Headers) -> Option<u32> {
    header(headers, "Expires")?.parse().ok()
}

/// The event package of an `Event` header value, without parameters
/// (`eltex-call-count;id=1` → `eltex-call-count`).
pub fn event_package(headers: &Headers) -> Option<String> {
    header(headers, "Event").map(|v| {
        v.split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase()
    })
}

/// The substate value of a `Subscription-State` header (RFC 6665 §8.2.3):
/// what a notifier says in one NOTIFY. Where the subscriber's own
/// subscription stands is [`crate::subscription::SubscriptionState`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubState {
    /// The subscription has been accepted.
    Active,
    /// Accepted pending authorization (not used by this package).
    Pending,
    /// The subscription is over; see the reason.
    Terminated,
}

/// `Subscription-State` reason for `terminated` (RFC 6665 §4.1.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TerminationReason {
    /// Resubscribe at once.
    Deactivated,
    /// Resubscribe after `retry-after` if given, else at once.
    Probation,
    /// Do not resubscribe.
    Rejected,
    /// The subscription expired (or was ended with `Expires: 0`).
    Timeout,
    /// Do not resubscribe until told otherwise.
    Giveup,
    /// The resource no longer exists: do not resubscribe.
    Noresource,
    /// The resource cannot be subscribed: do not resubscribe.
    Invariant,
    /// Any other token.
    Other(String),
}

impl TerminationReason {
    fn parse(s: &str) -> Self {
        match s.to_ascii_lowercase().as_str() {
            "deactivated" => Self::Deactivated,
            "probation" => Self::Probation,
            "rejected" => Self::Rejected,
            "timeout" => Self::Timeout,
            "giveup" => Self::Giveup,
            "noresource" => Self::Noresource,
            "invariant" => Self::Invariant,
            other => Self::Other(other.to_owned()),
        }
    }

    /// Whether RFC 6665 §4.1.3 lets the subscriber try again.
    pub fn may_retry(&self) -> bool {
        !matches!(self, Self::Rejected | Self::Noresource | Self::Invariant)
    }
}

impl fmt::Display for TerminationReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Deactivated => "deactivated",
            Self::Probation => "probation",
            Self::Rejected => "rejected",
            Self::Timeout => "timeout",
            Self::Giveup => "giveup",
            Self::Noresource => "noresource",
            Self::Invariant => "invariant",
            Self::Other(s) => s,
        })
    }
}

/// The `Subscription-State` header (RFC 6665 §8.2.3):
/// `active;expires=60`, `terminated;reason=timeout;retry-after=5`.
///
/// Not to be confused with [`crate::subscription::SubscriptionState`], the
/// subscriber's view of its subscription, which a header moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionStateHeader {
    /// The substate.
    pub state: SubState,
    /// Remaining subscription duration, seconds.
    pub expires: Option<u32>,
    /// Why it terminated.
    pub reason: Option<TerminationReason>,
    /// Seconds the subscriber should wait before retrying.
    pub retry_after: Option<u32>,
}

impl SubscriptionStateHeader {
    /// `active;expires=N`.
    pub fn active(expires: u32) -> Self {
        Self {
            state: SubState::Active,
            expires: Some(expires),
            reason: None,
            retry_after: None,
        }
    }

    /// `terminated;reason=R`.
    pub fn terminated(reason: TerminationReason) -> Self {
        Self {
            state: SubState::Terminated,
            expires: None,
            reason: Some(reason),
            retry_after: None,
        }
    }

    /// Parses a header value; `None` when the substate is missing or unknown.
    pub fn parse(value: &str) -> Option<Self> {
        let mut parts = value.split(';');
        let state = match parts.next()?.trim().to_ascii_lowercase().as_str() {
            "active" => SubState::Active,
            "pending" => SubState::Pending,
            "terminated" => SubState::Terminated,
            _ => return None,
        };
        let mut out = Self {
            state,
            expires: None,
            reason: None,
            retry_after: None,
        };
        for p in parts {
            let (k, v) = name_value(p);
            let v = v.unwrap_or_default();
            match k.as_str() {
                "expires" => out.expires = v.parse().ok(),
                "reason" => out.reason = Some(TerminationReason::parse(&v)),
                "retry-after" => out.retry_after = v.parse().ok(),
                _ => {}
            }
        }
        Some(out)
    }
}

impl fmt::Display for SubscriptionStateHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.state {
            SubState::Active => "active",
            SubState::Pending => "pending",
            SubState::Terminated => "terminated",
        })?;
        if let Some(r) = &self.reason {
            write!(f, ";reason={r}")?;
        }
        if let Some(e) = self.expires {
            write!(f, ";expires={e}")?;
        }
        if let Some(r) = self.retry_after {
            write!(f, ";retry-after={r}")?;
        }
        Ok(())
    }
}

/// Builds a request. `Via` and `Max-Forwards` are added by
/// [`SipEndpoint::send_request`]; `Content-Length` is computed on send.
///
/// # Errors
/// When `uri` is not a valid SIP URI.
pub fn request(
    method: Method,
    uri: &str,
    headers: Vec<(&str, String)>,
    body: Vec<u8>,
) -> Result<Request, rsipstack::sip::Error> {
    let uri = Uri::try_from(uri)?;
    let mut hs = Headers::default();
    for (name, value) in headers {
        push_header(&mut hs, name, value);
    }
    Ok(Request {
        method,
        uri,
        version: rsipstack::sip::Version::V2,
        headers: hs,
        body,
    })
}

/// The `200` to an OPTIONS (RFC 3261 §11.2): what the port takes —
/// `Allow`, `Accept` (the bodies it reads), `Accept-Encoding: identity`,
/// `Accept-Language: en` and an empty `Supported` (it supports no
/// extension) — so a capabilities probe reads the same shape from every
/// port.
pub fn options_answer(req: &Request, to_tag: &str, allow: &str, accept: &str) -> Response {
    let mut r = response(req, StatusCode::OK, Some(to_tag));
    for (name, value) in [
        ("Allow", allow),
        ("Accept", accept),
        ("Accept-Encoding", "identity"),
        ("Accept-Language", "en"),
        ("Supported", ""),
    ] {
        push_header(&mut r.headers, name, value);
    }
    r
}

/// Builds a response to `req` (RFC 3261 §8.2.6.2): copies `Via`, `From`,
/// `To`, `Call-ID` and `CSeq`; adds `;tag=to_tag` to `To` when the request's
/// `To` has no tag and `to_tag` is given. `Content-Length` is set from the body.
pub fn response(req: &Request, status: StatusCode, to_tag: Option<&str>) -> Response {
    response_to_headers(&req.headers, status, to_tag)
}

/// [`response`] from the request's headers alone: for a request the parser
/// cannot hold as a [`Request`] (an extension method, [`wire::not_implemented`]).
pub fn response_to_headers(
    request_headers: &Headers,
    status: StatusCode,
    to_tag: Option<&str>,
) -> Response {
    let mut headers = Headers::default();
    for h in request_headers.iter() {
        match h {
            Header::Via(_) | Header::From(_) | Header::CallId(_) | Header::CSeq(_) => {
                headers.push(h.clone())
            }
            Header::To(to) => match to_tag {
                Some(t) if tag(to.value()).is_none() => {
                    push_header(&mut headers, "To", format!("{};tag={t}", to.value()))
                }
                _ => headers.push(h.clone()),
            },
            _ => {}
        }
    }
    Response {
        status_code: status,
        wire_reason: None,
        version: rsipstack::sip::Version::V2,
        headers,
        body: Vec::new(),
    }
}

/// Sets the body and its `Content-Type`/`Content-Length` on a response or request's headers.
pub fn set_body(headers: &mut Headers, body_slot: &mut Vec<u8>, content_type: &str, body: Vec<u8>) {
    set_header(headers, "Content-Type", content_type);
    set_header(headers, "Content-Length", body.len().to_string());
    *body_slot = body;
}

/// A To tag made from a request's Call-ID and From tag: a stateless UAS
/// must give the same request the same tag every time (RFC 3261 §8.2.7), so
/// a retransmission's answer matches the first; no RNG is read.
pub fn stateless_tag(request_headers: &Headers) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let from_tag = header(request_headers, "From").and_then(tag);
    for part in [
        call_id(request_headers).unwrap_or(""),
        from_tag.as_deref().unwrap_or(""),
    ] {
        for b in part.bytes().chain(std::iter::once(0)) {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}

/// A random token for tags, branches and Call-IDs (16 hex digits).
pub fn random_token() -> String {
    format!("{:016x}", rand::random::<u64>())
}

#[cfg(test)]
mod tests;
