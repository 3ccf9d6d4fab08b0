//! SIP messages to and from bytes for a daemon that owns its sockets: the
//! decoding of one datagram or framed stream message, the stamping of
//! where it came from, where a response goes, and the encoding with a
//! correct `Content-Length`.
//!
//! * [`decode`] parses with rsipstack's parser and, for a request, records
//!   the real source in its top `Via` as `received`/`rport` (RFC 3261
//!   §18.2.1, RFC 3581 §4), so that a response built from the request
//!   carries them and [`response_target`] finds the way back.
//! * [`encode_request`] and [`encode_response`] set `Content-Length` from
//!   the body on every message (mandatory on stream transports, RFC 3261
//!   §18.3, §20.14; harmless and customary on UDP).
//!
//! Architecture invariant: no I/O, no clock.

use std::fmt::Write as _;
use std::net::SocketAddr;

use bytes::{Buf, Bytes};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Request, Response, SipMessage};

/// Why bytes are not a SIP message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Nothing but whitespace: a keepalive (RFC 5626 §3.5.1 CRLF ping), not
    /// an error to report.
    #[error("keepalive")]
    Keepalive,
    /// The parser refused it.
    #[error("not a sip message: {reason}")]
    Malformed {
        /// The parser's words.
        reason: String,
    },
    /// A request without a top `Via` to answer through.
    #[error("request without a valid via")]
    NoVia,
    /// The body is shorter than the `Content-Length` says: the datagram
    /// ended early (RFC 3261 §18.3: an error; the message is not used).
    #[error("content-length {declared} but a body of {body} bytes")]
    Truncated {
        /// What `Content-Length` says.
        declared: usize,
        /// The bytes after the head.
        body: usize,
    },
}

/// Parses one message that arrived from `source`; a request's top `Via`
/// gets `received`/`rport` ([`stamp_received`]), over a datagram or a
/// stream alike (RFC 3261 §18.2.1, RFC 3581 §4).
///
/// # Errors
/// [`DecodeError`].
pub fn decode(bytes: &[u8], source: SocketAddr) -> Result<SipMessage, DecodeError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(DecodeError::Keepalive);
    }
    check_body_length(bytes)?;
    check_method_case(bytes)?;
    let mut message = SipMessage::try_from(bytes).map_err(|e| DecodeError::Malformed {
        reason: e.to_string(),
    })?;
    if let SipMessage::Request(request) = &mut message {
        stamp_received(&mut request.headers, source)?;
    }
    Ok(message)
}

/// Records where a request came from in its top `Via` (RFC 3261
/// §18.2.1, RFC 3581 §4): `received=IP` when the sent-by is not the
/// source's IP or when `rport` was asked, and `rport=PORT` when asked.
/// Nothing is rewritten when neither applies — the common case, a peer
/// sending from the address it names. A `received` or filled `rport` the
/// sender wrote itself is replaced by what the socket saw. An IPv6
/// `received` is written bare (`received = IPv6address`, §25.1).
///
/// # Errors
/// [`DecodeError::NoVia`]: the request has no `Via` with a sent-by.
pub fn stamp_received(headers: &mut super::Headers, source: SocketAddr) -> Result<(), DecodeError> {
    let Some(via) = headers.iter_mut().find_map(|h| match h {
        super::Header::Via(via) => Some(via),
        _ => None,
    }) else {
        return Err(DecodeError::NoVia);
    };
    let value = via.value();
    let top = super::parts_outside_quotes(value, ',')
        .next()
        .unwrap_or(value);
    let sent_by = super::via_sent_by(top);
    if sent_by.is_empty() {
        return Err(DecodeError::NoVia);
    }
    let rport = via_has_param(top, "rport");
    let same_host = super::host_ip(sent_by).is_some_and(|ip| ip == source.ip().to_canonical());
    if !rport && same_host && !via_has_param(top, "received") {
        return Ok(());
    }
    // The top value without the parameters the socket's view replaces.
    let base = top.split(';').next().unwrap_or(top).trim_end();
    let mut stamped = String::with_capacity(value.len() + 48);
    stamped.push_str(base);
    for part in super::parts_outside_quotes(top, ';').skip(1) {
        let name = part.split('=').next().unwrap_or("").trim();
        if name.eq_ignore_ascii_case("received") || name.eq_ignore_ascii_case("rport") {
            continue;
        }
        stamped.push(';');
        stamped.push_str(part.trim());
    }
    let ip = source.ip().to_canonical();
    // Written in place: every request from an RFC 3581 peer passes here.
    if rport || !same_host {
        let _ = write!(stamped, ";received={ip}");
    }
    if rport {
        let _ = write!(stamped, ";rport={}", source.port());
    }
    // What follows the top value: `top` is trimmed and empty values before
    // it are skipped (`Via: , SIP/2.0/UDP h`), so it need not start the
    // header's value; it ends where its bytes end within `value`.
    let top_end = top.as_ptr() as usize - value.as_ptr() as usize + top.len();
    stamped.push_str(value.get(top_end..).unwrap_or(""));
    *via = stamped.into();
    Ok(())
}

/// Whether one `Via` value has the parameter `name` (with a value or
/// without), read without allocating: every request passes here.
fn via_has_param(via: &str, name: &str) -> bool {
    super::parts_outside_quotes(via, ';').skip(1).any(|part| {
        part.split('=')
            .next()
            .unwrap_or("")
            .trim()
            .eq_ignore_ascii_case(name)
    })
}

/// Where a response to a request from `source` goes over UDP (RFC 3261
/// §18.2.2, RFC 3581 §4): the source address when the top `Via` asked for
/// `rport`; else the source's IP (the `received` address, or the sent-by's
/// when the two agree) at the `Via`'s sent-by port, 5060 when it names
/// none. `headers` are the request's or its response's (which carries the
/// request's `Via`s), stamped or not. A `maddr` is not followed: a
/// stateless answer to a datagram whose source may be forged goes to no
/// host it did not come from.
pub fn response_target(headers: &super::Headers, source: SocketAddr) -> SocketAddr {
    let Some(top) = super::top_via(headers) else {
        return source;
    };
    if via_has_param(top, "rport") {
        return source;
    }
    let port = super::host_port(super::via_sent_by(top)).unwrap_or(5060);
    SocketAddr::new(source.ip(), port)
}

/// RFC 3261 §18.3: a message whose body ends before its `Content-Length`
/// says is an error, and a `Content-Length` that is no number (`-1`, one
/// past `usize`) is malformed. The parser takes both, so they are checked
/// here; bytes past the declared length are the parser's to drop. A
/// message without the empty line that ends its head is left to the
/// parser.
fn check_body_length(bytes: &[u8]) -> Result<(), DecodeError> {
    let Some(head_end) = memchr::memmem::find(bytes, PING) else {
        return Ok(());
    };
    let declared = content_length(&bytes[..head_end]).map_err(|e| DecodeError::Malformed {
        reason: e.to_string(),
    })?;
    let body = bytes.len() - head_end - PING.len();
    if declared > body {
        return Err(DecodeError::Truncated { declared, body });
    }
    Ok(())
}

/// RFC 3261 §7.1: method names are case-sensitive, so `invite` is an
/// extension method, not `INVITE`; the parser reads a method in any case,
/// so a request line whose method is another case of a known one is
/// refused here (and answered by [`not_implemented`]). Only the first
/// token is read: a response's `SIP/2.0` and every known method are
/// upper case.
///
/// # Errors
/// [`DecodeError::Malformed`] for such a request.
pub fn check_method_case(bytes: &[u8]) -> Result<(), DecodeError> {
    let start = bytes
        .iter()
        .position(|b| !matches!(b, b'\r' | b'\n'))
        .unwrap_or(bytes.len());
    let token = bytes
        .get(start..)
        .unwrap_or_default()
        .split(|b| *b == b' ')
        .next()
        .unwrap_or_default();
    if !token.iter().any(u8::is_ascii_lowercase) {
        return Ok(());
    }
    match std::str::from_utf8(token).map(str::parse::<super::Method>) {
        Ok(Ok(known)) => Err(DecodeError::Malformed {
            reason: format!("method {known} written in another case (methods are case-sensitive)"),
        }),
        _ => Ok(()),
    }
}

/// A method this layer knows, as RFC 3261 writes it: the parser's
/// reading of `token` when it is in that case (all known methods are
/// upper case, [`check_method_case`]).
fn known_method(token: &str) -> Option<super::Method> {
    if token.bytes().any(|b| b.is_ascii_lowercase()) {
        return None;
    }
    token.parse().ok()
}

/// The answer to a request the parser (or [`decode`]'s checks) refused,
/// built from its raw head (RFC 3261 §8.2; SPEC §16), or `None` when the
/// bytes are no request a response can be built for (§8.1.1: a request
/// without `Via`, `From`, `To`, `Call-ID` or `CSeq` is malformed and is
/// dropped as such). Every port answers these through here:
///
/// * an unknown `token` method on a well-formed request line (RFC 3261
///   §7.1, §25.1): `501 Not Implemented` (§8.2.1) with `Allow: allow`
///   (§21.5.2); RFC 4475 §3.1.1.2 intmeth, §3.1.1.5 esc02;
/// * a known method whose `Content-Length` is no number (RFC 4475
///   §3.1.2.3, a negative one) or larger than the body that came
///   (§3.1.2.2; RFC 3261 §18.3): `400 Bad Request`;
/// * any other request line or head the parser refused — LWS inside the
///   Request-URI or between the line's elements (RFC 4475 §3.1.2.8-9), a
///   display name of non-token characters (§3.1.2.15), a `CSeq` past
///   2^31 (§3.1.2.4, RFC 3261 §8.1.1.5): `400 Bad Request`; a version
///   other than `SIP/2.0` there: `505` (§8.2.2... §21.5.7).
///
/// A `CSeq` whose method is not the request's makes any of them `400`
/// (§8.1.1.5; RFC 4475 §3.1.2.18 mismatch02). The response copies the
/// request's `Via`s, `From`, `To`, `Call-ID` and `CSeq` from the raw head,
/// long or compact names in any case (§7.3.1, §7.3.3), and tags the `To`
/// as every stateless answer is ([`sip::stateless_tag`](super::stateless_tag),
/// §8.2.7); encode it with [`encode_response`] (`Content-Length: 0`).
pub fn refused(bytes: &[u8], allow: &str) -> Option<Response> {
    if let Some((rest, line_end, method)) = request_line(bytes) {
        if known_method(method).is_none() {
            check_body_length(bytes).ok()?;
            let mut response =
                raw_answer(rest, line_end, method, super::StatusCode::NotImplemented)?;
            if response.status_code == super::StatusCode::NotImplemented {
                super::push_header(&mut response.headers, "Allow", allow);
            }
            return Some(response);
        }
        if check_body_length(bytes).is_err() {
            return raw_answer(rest, line_end, method, super::StatusCode::BadRequest);
        }
    }
    let (rest, line_end, method, version) = loose_request_line(bytes)?;
    let status = if version.eq_ignore_ascii_case("SIP/2.0") {
        super::StatusCode::BadRequest
    } else {
        super::StatusCode::from(505)
    };
    raw_answer(rest, line_end, method, status)
}

/// The request line of `bytes` (§7.5: CRLFs before it are skipped): the
/// rest from it, where the line ends, and its method, when it is
/// `token SP absolute-URI SP SIP/2.0`.
fn request_line(bytes: &[u8]) -> Option<(&[u8], usize, &str)> {
    let start = bytes.iter().position(|b| !matches!(b, b'\r' | b'\n'))?;
    let rest = bytes.get(start..)?;
    let line_end = rest.iter().position(|b| *b == b'\n').unwrap_or(rest.len());
    let first = std::str::from_utf8(rest.get(..line_end)?).ok()?;
    let method = token_method(first.strip_suffix('\r').unwrap_or(first))?;
    Some((rest, line_end, method))
}

/// A request line the parser may have refused (§7.1 asks single SPs, a
/// Request-URI without LWS): a `token` method, whitespace, anything, and
/// a `SIP/` version last. The rest from it, where it ends, the method and
/// the version.
fn loose_request_line(bytes: &[u8]) -> Option<(&[u8], usize, &str, &str)> {
    let start = bytes.iter().position(|b| !matches!(b, b'\r' | b'\n'))?;
    let rest = bytes.get(start..)?;
    let line_end = rest.iter().position(|b| *b == b'\n').unwrap_or(rest.len());
    let line = std::str::from_utf8(rest.get(..line_end)?).ok()?.trim_end();
    let (method, tail) = line.split_once([' ', '\t'])?;
    let version = tail.rsplit([' ', '\t']).next()?;
    let token = !method.is_empty() && method.chars().all(super::is_token_char);
    let versioned = version
        .get(..4)
        .is_some_and(|p| p.eq_ignore_ascii_case("SIP/"));
    (token && versioned && tail.len() > version.len()).then_some((rest, line_end, method, version))
}

/// A stateless `status` to the request whose head starts at `rest` (its
/// request line ends at `line_end`, its method is `method`): the `Via`s,
/// `From`, `To`, `Call-ID` and `CSeq` copied from the raw head.
fn raw_answer(
    rest: &[u8],
    line_end: usize,
    method: &str,
    status: super::StatusCode,
) -> Option<Response> {
    let head_end = memchr::memmem::find(rest, PING).unwrap_or(rest.len());
    let head = std::str::from_utf8(rest.get(line_end..head_end)?).ok()?;
    let lines = head
        .split('\n')
        .skip(1)
        .map(|l| l.strip_suffix('\r').unwrap_or(l));
    let mut vias = Vec::new();
    let mut single: [Option<String>; 4] = Default::default();
    // Where a folded line (§7.3.1) goes: the copied header above it.
    let mut last: Option<&mut String> = None;
    for line in lines {
        if bare_control(line) {
            return None;
        }
        if line.starts_with([' ', '\t']) {
            if let Some(value) = last.as_deref_mut() {
                value.push(' ');
                value.push_str(line.trim());
            }
            continue;
        }
        last = None;
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim().to_owned();
        match copied_header(name.trim()) {
            Some(Copied::Via) => {
                vias.push(value);
                last = vias.last_mut();
            }
            Some(Copied::Single(i)) => {
                let slot = single.get_mut(i)?;
                if slot.is_some() {
                    // §7.3.1: these appear once.
                    return None;
                }
                last = Some(slot.insert(value));
            }
            None => {}
        }
    }
    let [Some(from), Some(to), Some(call_id), Some(cseq)] = single else {
        return None;
    };
    if vias.is_empty() || [&from, &to, &call_id].iter().any(|v| v.is_empty()) {
        return None;
    }
    // The answer goes back along these Vias (§8.2.6.2): each value must
    // read as one, and more than a request can have gathered is no
    // request's.
    if vias.iter().any(|v| v.trim().is_empty()) {
        return None;
    }
    let values = vias
        .iter()
        .flat_map(|v| super::parts_outside_quotes(v, ','))
        .map(str::trim);
    let mut count = 0_usize;
    for value in values {
        count += 1;
        if count > MAX_RAW_VIAS || !via_shape(value) {
            return None;
        }
    }
    let mut cseq_parts = cseq.split_whitespace();
    let number = cseq_parts.next().unwrap_or("");
    let cseq_method = cseq_parts.next();
    if number.is_empty()
        || !number.bytes().all(|b| b.is_ascii_digit())
        || cseq_method.is_none()
        || cseq_parts.next().is_some()
    {
        return None;
    }
    // §8.1.1.5: a CSeq past 2^31, or one that names another method, is a
    // 400, whatever the caller would have answered.
    let in_range = number.parse::<u32>().is_ok_and(|n| n < 1 << 31);
    let status = if cseq_method == Some(method) && in_range {
        status
    } else {
        super::StatusCode::BadRequest
    };
    let mut headers = super::Headers::default();
    for via in vias {
        super::push_header(&mut headers, "Via", via);
    }
    for (name, value) in COPIED.iter().zip([from, to, call_id, cseq]) {
        super::push_header(&mut headers, name, value);
    }
    let tag = super::stateless_tag(&headers);
    let response = super::response_to_headers(&headers, status, Some(&tag));
    // A stateless answer to a datagram whose source may be forged grows it
    // by no more than its own lines (status, tag, Allow, length): compact
    // names expanded and folded lines joined would otherwise let a sender
    // multiply its traffic toward a victim.
    if encode_response(response.clone(), "").len() > rest.len() + MAX_RAW_GROWTH {
        return None;
    }
    Some(response)
}

/// How many bytes a raw-head answer may add to the request it answers:
/// its status line, To tag, `Allow`, `Content-Length` and the daemon's
/// `Server`, with room.
const MAX_RAW_GROWTH: usize = 256;

/// The most `Via` values a raw-head answer copies: a request that crossed
/// more proxies than a `Max-Forwards` of 70 allows is none a UAS serves.
const MAX_RAW_VIAS: usize = 70;

/// Whether `value` has the shape of one `via-parm` (RFC 3261 §20.42,
/// §25.1): `SIP/2.0/transport` (LWS around the slashes allowed),
/// whitespace, then a sent-by before any parameter. Read this far only:
/// enough that a raw answer carries no Via that is not one, and that a
/// request with an empty or separator-only value is refused (RFC 4475
/// §3.1.2.1).
pub(crate) fn via_shape(value: &str) -> bool {
    let head = value.split(';').next().unwrap_or("");
    // `SLASH = SWS "/" SWS` (§25.1): `SIP / 2.0 / UDP` is a protocol too.
    let mut slashes = head.splitn(3, '/');
    let (Some(name), Some(version), Some(rest)) = (slashes.next(), slashes.next(), slashes.next())
    else {
        return false;
    };
    let Some((transport, sent_by)) = rest.trim_start().split_once(char::is_whitespace) else {
        return false;
    };
    let token = |t: &str| {
        !t.is_empty()
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-.!%*_+`'~".contains(&b))
    };
    name.trim().eq_ignore_ascii_case("SIP")
        && version.trim() == "2.0"
        && token(transport)
        && !sent_by.trim().is_empty()
}

/// Whether `line` has a control character other than HTAB outside a
/// quoted-pair of a quoted string (RFC 3261 §25.1: `quoted-pair = "\"
/// (%x00-09 / %x0B-0C / %x0E-7F)`, the one place a header may carry one,
/// RFC 4475 §3.1.1.2 intmeth): such a line is no header to copy.
fn bare_control(line: &str) -> bool {
    let (mut quoted, mut escaped) = (false, false);
    for c in line.chars() {
        if escaped {
            escaped = false;
            if matches!(c, '\r' | '\n') {
                return true;
            }
            continue;
        }
        match c {
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c.is_control() && c != '\t' => return true,
            _ => {}
        }
    }
    false
}

/// The single headers [`not_implemented`] copies besides `Via`, in order.
const COPIED: [&str; 4] = ["From", "To", "Call-ID", "CSeq"];

/// A header [`not_implemented`] copies.
enum Copied {
    Via,
    /// The index in [`COPIED`].
    Single(usize),
}

/// Which copied header `name` is, by its long or compact name (RFC 3261
/// §7.3.3; `CSeq` has no compact form).
fn copied_header(name: &str) -> Option<Copied> {
    let is = |long: &str, compact: &str| {
        name.eq_ignore_ascii_case(long)
            || (!compact.is_empty() && name.eq_ignore_ascii_case(compact))
    };
    if is("Via", "v") {
        return Some(Copied::Via);
    }
    [("From", "f"), ("To", "t"), ("Call-ID", "i"), ("CSeq", "")]
        .iter()
        .position(|(long, compact)| is(long, compact))
        .map(Copied::Single)
}

/// The method of `line` when it is a request line (RFC 3261 §7.1) whose
/// method is a `token` (§25.1), its Request-URI an absolute URI
/// (`scheme:rest`, §19.1.1, RFC 3986 §3.1) and its version `SIP/2.0`.
fn token_method(line: &str) -> Option<&str> {
    let mut parts = line.split(' ');
    let (method, uri, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !version.eq_ignore_ascii_case("SIP/2.0") {
        return None;
    }
    let token = !method.is_empty() && method.chars().all(super::is_token_char);
    if !token {
        return None;
    }
    let (scheme, rest) = uri.split_once(':')?;
    let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    let rest_ok = !rest.is_empty() && !rest.chars().any(|c| c.is_whitespace() || c.is_control());
    (scheme_ok && rest_ok).then_some(method)
}

/// The bytes of `request`, with `Content-Length` set from its body.
pub fn encode_request(mut request: Request) -> Bytes {
    let len = request.body.len().to_string();
    super::set_header(&mut request.headers, "Content-Length", len);
    Bytes::from(encode(
        format_args!("{} {} {}", request.method, request.uri, request.version),
        &request.headers,
        None,
        &request.body,
    ))
}

/// The bytes of `response`, with `Content-Length` set from its body and
/// `Server: {server}` (RFC 3261 §20.35) unless it names one: every
/// response a daemon sends says which software and version answered, as
/// its requests' `User-Agent` does — what an operator reads in a capture.
pub fn encode_response(mut response: Response, server: &str) -> Bytes {
    let len = response.body.len().to_string();
    super::set_header(&mut response.headers, "Content-Length", len);
    let named = response
        .headers
        .iter()
        .any(|h| matches!(h, super::Header::Server(_)));
    Bytes::from(encode(
        format_args!(
            "{} {} {}",
            response.version,
            response.status_code.code(),
            response.status_code.text()
        ),
        &response.headers,
        (!named && !server.is_empty()).then_some(("Server", server)),
        &response.body,
    ))
}

/// A message's bytes as rsip's `to_bytes` writes them (start line, each
/// header as `name: value`, a blank line, the body verbatim), written
/// into one buffer: `to_bytes` formats each header into a `String` of
/// its own and joins them, which cost a tenth of a redirect's CPU.
fn encode(
    start: std::fmt::Arguments<'_>,
    headers: &super::Headers,
    extra: Option<(&str, &str)>,
    body: &[u8],
) -> Vec<u8> {
    use std::io::Write;
    let size: usize = headers
        .iter()
        .map(|h| h.name().len() + h.value().len() + 4)
        .chain(extra.map(|(name, value)| name.len() + value.len() + 4))
        .sum();
    let mut out = Vec::with_capacity(64 + size + body.len());
    // Writing to a `Vec` cannot fail.
    let _ = out.write_fmt(start);
    out.extend_from_slice(b"\r\n");
    let line = |out: &mut Vec<u8>, name: &str, value: &str| {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    };
    // The extra header goes before `Content-Length`, which is last by
    // custom (where sngrep and Kamailio put `Server`).
    let mut extra = extra;
    for header in headers.iter() {
        if matches!(header, super::Header::ContentLength(_)) {
            if let Some((name, value)) = extra.take() {
                line(&mut out, name, value);
            }
        }
        line(&mut out, header.name(), header.value());
    }
    if let Some((name, value)) = extra {
        line(&mut out, name, value);
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

/// The largest message a stream may carry, head and body.
pub const MAX_STREAM_MESSAGE: usize = 64 * 1024;

/// A keepalive on a stream (RFC 5626 §3.5.1): a double CRLF, which is
/// also what ends a message's head.
const PING: &[u8] = b"\r\n\r\n";

/// Why a stream cannot be read on (the connection is closed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// A message (or its head) longer than [`MAX_STREAM_MESSAGE`].
    #[error("message over {MAX_STREAM_MESSAGE} bytes")]
    TooLong,
    /// A `Content-Length` that is no number.
    #[error("bad content-length {0:?}")]
    BadLength(String),
}

/// What [`StreamFramer::next_frame`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// One whole message: its head and body.
    Message(Bytes),
    /// A keepalive (RFC 5626 §3.5.1 double CRLF), to be answered with one
    /// CRLF.
    Ping,
}

/// Splits a SIP byte stream into messages (RFC 3261 §18.3): a message's
/// head ends at the first empty line and its body is `Content-Length`
/// bytes (0 when absent, which the RFC forbids on streams and which is the
/// only safe reading). CRLFs between messages are skipped; a double CRLF
/// on its own is a keepalive ping. Sans-IO: feed bytes with
/// [`push`](Self::push), take messages with [`next_frame`](Self::next_frame).
///
/// Each byte is examined once however the stream is cut: the search for a
/// head's end resumes where the last one stopped, and a head found stays
/// found while its body arrives, so that a peer trickling a message a byte
/// at a time costs what the message costs.
#[derive(Debug, Default)]
pub struct StreamFramer {
    buf: bytes::BytesMut,
    /// Bytes at the front of `buf` already searched for the head's end
    /// (its last three are searched again: an end may straddle two reads).
    scanned: usize,
    /// The whole length of the message at the front, once its head is in.
    message_len: Option<usize>,
}

impl StreamFramer {
    /// An empty framer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends bytes read from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes held that are not a whole message yet.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// Whether the bytes held are part of a message, not just blank lines
    /// that may become a keepalive: a stream server gives a message a
    /// deadline, and a bare CRLF (a pong, or a peer's own keepalive) must
    /// not start it.
    pub fn in_message(&self) -> bool {
        !self.buf.is_empty() && !PING.starts_with(&self.buf)
    }

    /// The next whole message, `Ok(None)` when more bytes are needed.
    ///
    /// # Errors
    /// [`FrameError`]: the stream is not SIP, or a message is too large;
    /// nothing more can be read from it.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        let total = match self.message_len {
            Some(total) => total,
            None => {
                if let Some(ping) = self.skip_blank_lines() {
                    return Ok(ping);
                }
                let Some(total) = self.find_head()? else {
                    return Ok(None);
                };
                total
            }
        };
        if self.buf.len() < total {
            self.message_len = Some(total);
            return Ok(None);
        }
        self.message_len = None;
        self.scanned = 0;
        Ok(Some(Frame::Message(self.buf.split_to(total).freeze())))
    }

    /// Drops the CRLFs before a message (RFC 3261 §7.5); `Some` when they
    /// are a whole keepalive (`Some(Some(Ping))`, RFC 5626 §3.5.1) or may
    /// be the start of one (`Some(None)`: wait for more).
    ///
    /// Each byte is decided by the four that start at it, never by where a
    /// read ended: a `CRLFCRLF` there is a ping, any other CR or LF is
    /// dropped alone. So `\n\r\n\r\n` is one dropped LF and a ping however
    /// the stream was cut.
    fn skip_blank_lines(&mut self) -> Option<Option<Frame>> {
        if self.scanned > 0 {
            // The front is part of a head already searched.
            return None;
        }
        while matches!(self.buf.first(), Some(b'\r' | b'\n')) {
            if self.buf.starts_with(PING) {
                self.buf.advance(PING.len());
                return Some(Some(Frame::Ping));
            }
            if PING.starts_with(&self.buf) {
                return Some(None);
            }
            self.buf.advance(1);
        }
        None
    }

    /// The whole length of the message whose head starts `buf`, once the
    /// head is in; resumes the search where the last call stopped.
    fn find_head(&mut self) -> Result<Option<usize>, FrameError> {
        let from = self.scanned.saturating_sub(3);
        let found = self.buf[from..]
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map(|at| from + at);
        let Some(head_end) = found else {
            self.scanned = self.buf.len();
            if self.buf.len() > MAX_STREAM_MESSAGE {
                return Err(FrameError::TooLong);
            }
            return Ok(None);
        };
        let body = content_length(&self.buf[..head_end])?;
        let total = head_end + 4 + body;
        if total > MAX_STREAM_MESSAGE {
            return Err(FrameError::TooLong);
        }
        Ok(Some(total))
    }
}

/// The `Content-Length` (or compact `l`) of a message head; 0 when absent.
fn content_length(head: &[u8]) -> Result<usize, FrameError> {
    // Every datagram and framed message passes here: bytes compared in
    // place, nothing decoded or allocated until the header is found.
    for line in head.split(|b| *b == b'\n').skip(1) {
        let Some(colon) = memchr::memchr(b':', line) else {
            continue;
        };
        let name = line[..colon].trim_ascii();
        if name.eq_ignore_ascii_case(b"content-length") || name.eq_ignore_ascii_case(b"l") {
            let value = String::from_utf8_lossy(&line[colon + 1..]);
            let value = value.trim();
            return super::length_value(value)
                .ok_or_else(|| FrameError::BadLength(value.chars().take(32).collect()));
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests;

/// Messages queued for one stream connection's writer at most. A peer that
/// stops reading (its receive window full) while it keeps sending would
/// otherwise grow the queue without bound: when it is full the connection
/// is closed (the peer is not reading what it is sent; RFC 5626 §4.4.1 has
/// it reconnect). The daemons' messages are under 2 KiB, so each
/// connection holds at most about 128 KiB.
pub const STREAM_WRITE_QUEUE: usize = 64;

/// Queues `bytes` for a stream connection's writer (a channel of
/// [`STREAM_WRITE_QUEUE`]), closing the connection (`close`) when its
/// queue is full; `false` when it is gone or was closed for that.
pub fn queue_on(tx: &mpsc::Sender<Bytes>, close: &CancellationToken, bytes: Bytes) -> bool {
    match tx.try_send(bytes) {
        Ok(()) => true,
        Err(mpsc::error::TrySendError::Full(_)) => {
            tracing::debug!(
                target: crate::logging::NETWORK,
                queued = STREAM_WRITE_QUEUE,
                "sip stream connection closed: the peer does not read what it is sent"
            );
            close.cancel();
            false
        }
        Err(mpsc::error::TrySendError::Closed(_)) => false,
    }
}
