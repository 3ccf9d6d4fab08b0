//! The SIP redirect server (SPEC §11; RFC 3261 §8.3 "Redirect Servers").
//!
//! Sans-IO core, thin shell:
//!
//! * [`decide`] reads an INVITE and either answers it at once (`400`
//!   malformed, `483` Max-Forwards exhausted) or names the `select` request
//!   of the control protocol to ask;
//! * [`answer`] turns the selection's answer into the final response:
//!   `302 Moved Temporarily` with `Contact: <engine_uri>` (the registered
//!   contact URI only when the agent reported no engine address), or a
//!   refusal `480`/`503`/`400` with `Reason: SIP ;cause=…;text="<code>"`
//!   (RFC 3326), or `482 Loop Detected` rather than a 302 pointing back at
//!   this collector;
//! * [`InviteCache`] remembers the INVITEs answered lately, by their top
//!   `Via` (branch and sent-by, RFC 3261 §17.2.3), so a retransmission gets
//!   the same bytes again without a new selection, and a CANCEL finds its
//!   INVITE;
//! * [`RedirectServer`] owns the redirect server's UDP socket; the
//!   collector's loop serves it and asks the core each `select` directly.
//!
//! The server is stateless in RFC 3261 §8.3's sense: it keeps no
//! transaction (no Timer G retransmissions of the 302, no timers at all).
//! A redirect server may: its final response is retransmitted when the
//! client retransmits the INVITE (the client's Timer A runs until it sees
//! a final response), which is what the cache answers. This is also what
//! Kamailio's `sl_send_reply` does, at a fraction of a transaction's cost.
//!
//! The leg's inputs, first match wins: a Request-URI parameter (`zone`,
//! `site`, `msr` — the other leg's MSR —, `leg`, `conference`), then a
//! header (`X-MSR-Zone`, `X-MSR-Site`, `X-MSR-Other`, `X-MSR-Leg`,
//! `X-MSR-Conference`), then for zone and site the collector's
//! `[defaults]` as they are at the selection (the core reads them, so a
//! reload applies here at once). The leg's needs (SPEC §15) are the codecs of the INVITE's
//! SDP offer ([`sdp::offer`]); an offer no MSR of the zone takes gets `488
//! Not Acceptable Here` with `Reason: …;text="no_capable_msr"` and `Warning:
//! 305` naming what was missing, an SDP that does not parse a `400` naming
//! its line. Failover (SPEC §14): a core that could not place the leg
//! on the MSR a 302 named sends the INVITE again (same Call-ID) with
//! `X-MSR-Failed: msr_1` (the MSRs that failed it, comma-separated or one
//! header each, in the order tried) and `X-MSR-Failure: 503` (why the last
//! one did: `timeout`, a status, `error`, `load-limit`); the 302 then names
//! the next MSR, or the refusal is a 503 with `Reason: …;text="msr_unavailable"`
//! listing the failures. The Call-ID is the leg's `call_id`, so a retransmitted (or
//! re-sent) INVITE finds the live leg and gets the same Contact (SPEC §9
//! stickiness) even once the cache has forgotten it.
//!
//! ACK (to a 302 or a refusal, or stray) is absorbed: an ACK for a non-2xx
//! final response ends the client's transaction and needs no answer
//! (§17.1.1.3). CANCEL (§9.2): for an INVITE already answered, `200` to the
//! CANCEL only (the final response stands); for one whose selection is
//! still running, `200` to the CANCEL, then `487 Request Terminated` to the
//! INVITE and the leg the selection bound released; with no matching
//! INVITE, `481 Call/Transaction Does Not Exist`. OPTIONS gets `200` with
//! `Allow`; any other method `405`; an extension method, which the SIP
//! parser refuses, `501` with `Allow` ([`wire::not_implemented`], RFC 3261
//! §8.2.1).
//!
//! [`wire::not_implemented`]: msr_shared::sip::wire::not_implemented

use std::net::SocketAddr;

use msr_shared::admin::{
    ErrorCode, Request as AdminRequest, Response as AdminResponse, ResponseData, SelectQuery,
};
use msr_shared::media::sdp::{self, SdpError};
use msr_shared::media::CodecSet;
use msr_shared::sip::{self, Method, Request, Response, StatusCode};

/// The methods the redirect server answers (its `Allow`).
pub const ALLOW: &str = "INVITE, ACK, CANCEL, OPTIONS";

/// The body types an INVITE's offer is read from ([`offer_codecs`]).
const BODY_TYPES: [&str; 2] = ["application/sdp", "multipart/*"];

/// The `Accept` of a `415` (RFC 3261 §8.2.3): [`BODY_TYPES`] as a header.
const ACCEPT: &str = "application/sdp, multipart/mixed";

/// What the redirect decision needs besides the INVITE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedirectContext {
    /// Addresses a 302 must never point at: the redirect server's own and
    /// the collector's SIP socket.
    pub own: Vec<SocketAddr>,
    /// `[redirect] allow`: whose datagrams are read at all (each INVITE
    /// places a leg, so a stranger's flood must cost nothing).
    pub allow: Vec<ipnet::IpNet>,
}

impl RedirectContext {
    /// Whether a datagram from `src` may be served.
    pub fn allows(&self, src: SocketAddr) -> bool {
        let ip = src.ip().to_canonical();
        self.allow.iter().any(|net| net.contains(&ip))
    }
}

/// What to do with an INVITE.
// One lives on the stack per INVITE and is moved once, into the select:
// boxing the request would add an allocation per INVITE for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Send this final response now.
    Reply(Box<Response>),
    /// Ask the shell this `select`, then [`answer`].
    Select(AdminRequest),
}

/// Reads the leg's inputs from `invite` (module docs).
pub fn decide(invite: &Request) -> Decision {
    let bad = |text: &str| {
        Decision::Reply(Box::new(refusal(
            invite,
            StatusCode::BadRequest,
            ErrorCode::BadRequest,
            text,
        )))
    };
    // RFC 3261 §8.2.2 / §16.3 step 3: a request that has used up its hops
    // is not acted upon.
    match sip::header(&invite.headers, "Max-Forwards").map(|v| v.trim().parse::<u32>()) {
        Some(Ok(0)) => {
            return Decision::Reply(Box::new(refusal(
                invite,
                StatusCode::TooManyHops,
                RefusalText::TooManyHops,
                "max-forwards is 0",
            )))
        }
        Some(Err(_)) => return bad("max-forwards is not a number"),
        _ => {}
    }
    let Some(call_id) = sip::call_id(&invite.headers).filter(|c| !c.trim().is_empty()) else {
        return bad("no call-id");
    };
    // RFC 3261 §8.1.1: To, From and CSeq are mandatory, and an INVITE's
    // CSeq names INVITE (§8.2.2 leaves such a request to a 400).
    for name in ["To", "From"] {
        if sip::header(&invite.headers, name).is_none() {
            return bad(&format!("no {} header", name.to_ascii_lowercase()));
        }
    }
    match sip::cseq(&invite.headers) {
        Some((_, method)) if method == "INVITE" => {}
        Some(_) => return bad("the cseq method is not invite"),
        None => return bad("no cseq"),
    }
    // Most INVITEs carry their inputs in headers, or none: only the URI's
    // parameters are written out (`;zone=a;site=b`), and only when it has
    // some.
    let params = if invite.uri.params.is_empty() {
        Vec::new()
    } else {
        let mut text = String::new();
        for param in &invite.uri.params {
            // Writing to a String does not fail.
            let _ = std::fmt::Write::write_fmt(&mut text, format_args!("{param}"));
        }
        uri_params(&text)
    };
    let pick = |name: &str, header: &str| -> Option<String> {
        params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
            .or_else(|| sip::header(&invite.headers, header).map(|v| v.trim().to_owned()))
            .filter(|v| !v.is_empty())
    };
    // RFC 3261 §8.2.3 (RFC 4475 §3.3.6, §3.3.15): a body this server does
    // not read or cannot decode, or an Accept that rules out the SDP the
    // MSR will answer.
    if sip::unsupported_body(invite, &BODY_TYPES) {
        let mut response = refusal(
            invite,
            StatusCode::UnsupportedMediaType,
            ErrorCode::BadRequest,
            "the body is neither application/sdp nor multipart, and not optional",
        );
        sip::push_header(&mut response.headers, "Accept", ACCEPT);
        return Decision::Reply(Box::new(response));
    }
    if sip::unsupported_encoding(invite) {
        let mut response = refusal(
            invite,
            StatusCode::UnsupportedMediaType,
            ErrorCode::BadRequest,
            "the body is content-encoded, and this server decodes no encoding",
        );
        sip::push_header(&mut response.headers, "Accept-Encoding", "identity");
        return Decision::Reply(Box::new(response));
    }
    if sip::unacceptable(invite, "application/sdp") {
        return Decision::Reply(Box::new(refusal(
            invite,
            StatusCode::NotAcceptable,
            ErrorCode::BadRequest,
            "accept rules out application/sdp, which the msr answers with",
        )));
    }
    // SPEC §15: the offer's codecs are the leg's needs.
    let codecs = match offer_codecs(invite) {
        Ok(codecs) => codecs,
        Err(error) => return bad(&error.to_string()),
    };
    // A zone or site the INVITE does not name is left empty: the core
    // reads its `[defaults]` then, so a reload changes it here too.
    let zone = pick("zone", "X-MSR-Zone").unwrap_or_default();
    let site = pick("site", "X-MSR-Site").unwrap_or_default();
    Decision::Select(AdminRequest::Select(SelectQuery {
        msr: pick("msr", "X-MSR-Other"),
        call_id: Some(call_id.trim().to_owned()),
        leg: pick("leg", "X-MSR-Leg"),
        conference: pick("conference", "X-MSR-Conference"),
        failed: sip::header_all(&invite.headers, "X-MSR-Failed")
            .into_iter()
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .map(str::to_owned)
            .collect(),
        failure: pick("failure", "X-MSR-Failure"),
        codecs: codecs.iter().map(|c| c.name().to_owned()).collect(),
        ..SelectQuery::new(zone, site)
    }))
}

/// The codecs of the INVITE's SDP offer (SPEC §15): an `application/sdp`
/// body, a body without `Content-Type` that starts with `v=`, or the SDP
/// part of a multipart body (SIP-T: [`sdp::sdp_of`]). No body (a late
/// offer, RFC 3261 §13.2.1), a multipart body without SDP, or one
/// `Content-Disposition` makes optional, needs nothing: the offer then
/// comes in the ACK, after the MSR is chosen. Any other body was refused
/// `415` first ([`decide`]).
fn offer_codecs(invite: &Request) -> Result<CodecSet, SdpError> {
    if invite.body.is_empty() {
        return Ok(CodecSet::EMPTY);
    }
    match sdp::sdp_of(sip::header(&invite.headers, "Content-Type"), &invite.body) {
        Some(sdp) => sdp::offer(sdp),
        None => Ok(CodecSet::EMPTY),
    }
}

/// The final response to `invite` for the selection's `answer`.
pub fn answer(invite: &Request, answer: &AdminResponse, ctx: &RedirectContext) -> Response {
    match answer {
        AdminResponse::Ok(ResponseData::Selected(selection)) => {
            let target = selection.engine_uri.as_deref().unwrap_or(&selection.uri);
            if points_at(target, &ctx.own) {
                return refusal(
                    invite,
                    StatusCode::LoopDetected,
                    RefusalText::LoopDetected,
                    "the chosen msr's address is this collector's",
                );
            }
            let mut response =
                sip::response(invite, StatusCode::MovedTemporarily, Some(&tag_of(invite)));
            sip::push_header(&mut response.headers, "Contact", format!("<{target}>"));
            sip::push_header(&mut response.headers, "X-MSR", selection.msr.clone());
            sip::push_header(
                &mut response.headers,
                "X-MSR-Contact",
                selection.contact.clone(),
            );
            response
        }
        AdminResponse::Ok(other) => refusal(
            invite,
            StatusCode::ServerInternalError,
            ErrorCode::Unavailable,
            &format!("unexpected answer {other:?}"),
        ),
        AdminResponse::Err(body) => {
            let status = match body.code {
                ErrorCode::MsrNotFound => StatusCode::TemporarilyUnavailable,
                // The call was released (a CANCEL or BYE) before this
                // INVITE was selected for (SPEC §9).
                ErrorCode::LegReleased => StatusCode::RequestTerminated,
                ErrorCode::BadRequest | ErrorCode::InvalidValue | ErrorCode::UnknownSite => {
                    StatusCode::BadRequest
                }
                // RFC 3261 §21.4.26: the offer is what no MSR takes.
                ErrorCode::NoCapableMsr => StatusCode::NotAcceptableHere,
                _ => StatusCode::ServiceUnavailable,
            };
            refusal(invite, status, body.code, &body.message)
        }
    }
}

/// The `text` of a refusal's `Reason`: the selection's error code, or one
/// of the two refusals only the redirect server makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RefusalText {
    Selection(ErrorCode),
    /// 483: `Max-Forwards: 0` (RFC 3261 §16.3).
    TooManyHops,
    /// 482: the chosen MSR's address is this collector's own.
    LoopDetected,
}

impl RefusalText {
    fn as_str(self) -> &'static str {
        match self {
            RefusalText::Selection(code) => code.as_str(),
            RefusalText::TooManyHops => "too_many_hops",
            RefusalText::LoopDetected => "loop_detected",
        }
    }
}

impl From<ErrorCode> for RefusalText {
    fn from(code: ErrorCode) -> Self {
        RefusalText::Selection(code)
    }
}

/// A final response with `Reason: SIP ;cause=<status>;text="<code>"`
/// (RFC 3326) and `Warning: 399` carrying `message` (RFC 3261 §20.43).
fn refusal(
    invite: &Request,
    status: StatusCode,
    code: impl Into<RefusalText>,
    message: &str,
) -> Response {
    let cause = status.code();
    let code = code.into().as_str();
    let mut response = sip::response(invite, status, Some(&tag_of(invite)));
    sip::push_header(
        &mut response.headers,
        "Reason",
        format!("SIP ;cause={cause};text=\"{code}\""),
    );
    let text: String = message
        .chars()
        .map(|c| {
            if c == '"' || c == '\\' || c.is_control() {
                '\''
            } else {
                c
            }
        })
        .collect();
    // RFC 3261 §20.43: 305 "Incompatible media format" names what a 488's
    // offer lacked; 399 ("miscellaneous") carries every other reason.
    let warn_code = if cause == 488 { 305 } else { 399 };
    sip::push_header(
        &mut response.headers,
        "Warning",
        format!("{warn_code} msr-collector \"{text}\""),
    );
    response
}

/// A To-tag made from the dialog's Call-ID and From tag: the same INVITE
/// always gets the same tag (a deterministic core reads no RNG).
fn tag_of(invite: &Request) -> String {
    sip::stateless_tag(&invite.headers)
}

/// The parameters of a SIP URI (`sip:user@host;a=b;c?headers`, or its
/// parameters alone, `;a=b;c`), lowercase names, values %-decoded (RFC
/// 3261 §19.1.1).
fn uri_params(uri: &str) -> Vec<(String, String)> {
    let without_headers = uri.split('?').next().unwrap_or(uri);
    without_headers
        .split(';')
        .skip(1)
        .filter_map(|p| {
            let (name, value) = p.split_once('=').unwrap_or((p, ""));
            let name = name.trim();
            (!name.is_empty()).then(|| (name.to_ascii_lowercase(), percent_decode(value.trim())))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether the SIP URI `target` names one of `own` (`host:port`, a missing
/// port read as 5060).
fn points_at(target: &str, own: &[SocketAddr]) -> bool {
    let rest = target
        .strip_prefix("sips:")
        .or_else(|| target.strip_prefix("sip:"))
        .unwrap_or(target);
    let hostport = rest.split([';', '?']).next().unwrap_or(rest);
    let hostport = hostport.rsplit('@').next().unwrap_or(hostport);
    let addr = hostport.parse::<SocketAddr>().ok().or_else(|| {
        hostport
            .parse::<std::net::IpAddr>()
            .ok()
            .map(|ip| SocketAddr::new(ip, 5060))
    });
    addr.is_some_and(|a| own.contains(&a))
}

/// Answers a request other than INVITE and CANCEL (module docs); `None`
/// for ACK (no answer).
pub fn other_method(req: &Request) -> Option<Response> {
    let tag = Some(tag_of(req));
    match req.method {
        Method::Ack => None,
        Method::Options => Some(sip::options_answer(
            req,
            &tag_of(req),
            ALLOW,
            "application/sdp",
        )),
        _ => {
            let mut response = sip::response(req, StatusCode::MethodNotAllowed, tag.as_deref());
            sip::push_header(&mut response.headers, "Allow", ALLOW);
            Some(response)
        }
    }
}

mod cache;
mod server;
pub use cache::*;
pub use server::*;

#[cfg(test)]
mod tests;
