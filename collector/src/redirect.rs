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
//! * [`serve`] owns the second [`SipEndpoint`] and sends each `select` to
//!   the shell's one handler over the control socket's channel.
//!
//! The leg's inputs, first match wins: a Request-URI parameter (`zone`,
//! `site`, `msr` — the other leg's MSR —, `leg`, `conference`), then a
//! header (`X-MSR-Zone`, `X-MSR-Site`, `X-MSR-Other`, `X-MSR-Leg`,
//! `X-MSR-Conference`), then for zone and site the collector's
//! `[defaults]`. The Call-ID is the leg's `call_id`, so a retransmitted (or
//! re-sent) INVITE finds the live leg and gets the same Contact (SPEC §9
//! stickiness); rsipstack's server transaction also answers retransmissions
//! from its cache.
//!
//! ACK to the 302 is absorbed by the INVITE server transaction (RFC 3261
//! §17.2.1); a stray ACK is dropped. A CANCEL gets `200` (the INVITE has
//! its final response already, so the CANCEL has no effect, §9.2). OPTIONS
//! gets `200` with `Allow`; any other method `405`.

use std::net::SocketAddr;
use std::sync::Arc;

use msr_shared::admin::{
    ErrorCode, Request as AdminRequest, Response as AdminResponse, ResponseData,
};
use msr_shared::sip::{self, Method, Request, Response, SipEndpoint, SipEvent, StatusCode};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::admin::AdminCommand;
use crate::metrics::Metrics;

/// The methods the redirect server answers (its `Allow`).
pub const ALLOW: &str = "INVITE, ACK, CANCEL, OPTIONS";

/// What the redirect decision needs besides the INVITE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedirectContext {
    /// Addresses a 302 must never point at: the redirect server's own and
    /// the collector's SIP socket.
    pub own: Vec<SocketAddr>,
    /// `[defaults] zone`, for an INVITE that names none.
    pub default_zone: String,
    /// `[defaults] site`, for an INVITE that names none.
    pub default_site: String,
}

/// What to do with an INVITE.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Send this final response now.
    Reply(Box<Response>),
    /// Ask the shell this `select`, then [`answer`].
    Select(AdminRequest),
}

/// Reads the leg's inputs from `invite` (module docs).
pub fn decide(invite: &Request, ctx: &RedirectContext) -> Decision {
    let bad = |text: &str| {
        Decision::Reply(Box::new(refusal(
            invite,
            StatusCode::BadRequest,
            "bad_request",
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
                "too_many_hops",
                "max-forwards is 0",
            )))
        }
        Some(Err(_)) => return bad("max-forwards is not a number"),
        _ => {}
    }
    let Some(call_id) = sip::call_id(&invite.headers).filter(|c| !c.trim().is_empty()) else {
        return bad("no call-id");
    };
    let uri = invite.uri.to_string();
    let params = uri_params(&uri);
    let pick = |name: &str, header: &str| -> Option<String> {
        params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
            .or_else(|| sip::header(&invite.headers, header).map(|v| v.trim().to_owned()))
            .filter(|v| !v.is_empty())
    };
    let zone = pick("zone", "X-MSR-Zone").unwrap_or_else(|| ctx.default_zone.clone());
    let site = pick("site", "X-MSR-Site").unwrap_or_else(|| ctx.default_site.clone());
    Decision::Select(AdminRequest::Select {
        zone,
        site,
        msr: pick("msr", "X-MSR-Other"),
        random: None,
        explain: false,
        call_id: Some(call_id.trim().to_owned()),
        leg: pick("leg", "X-MSR-Leg"),
        conference: pick("conference", "X-MSR-Conference"),
    })
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
                    "loop_detected",
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
            "unavailable",
            &format!("unexpected answer {other:?}"),
        ),
        AdminResponse::Err(body) => {
            let status = match body.code {
                ErrorCode::MsrNotFound => StatusCode::TemporarilyUnavailable,
                ErrorCode::BadRequest | ErrorCode::InvalidValue | ErrorCode::UnknownSite => {
                    StatusCode::BadRequest
                }
                _ => StatusCode::ServiceUnavailable,
            };
            refusal(invite, status, &body.code.to_string(), &body.message)
        }
    }
}

/// A final response with `Reason: SIP ;cause=<status>;text="<code>"`
/// (RFC 3326) and `Warning: 399` carrying `message` (RFC 3261 §20.43).
fn refusal(invite: &Request, status: StatusCode, code: &str, message: &str) -> Response {
    let cause = status.code();
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
    sip::push_header(
        &mut response.headers,
        "Warning",
        format!("399 msr-collector \"{text}\""),
    );
    response
}

/// A To-tag made from the dialog's Call-ID and From tag: the same INVITE
/// always gets the same tag (a deterministic core reads no RNG).
fn tag_of(invite: &Request) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let from_tag = sip::header(&invite.headers, "From").and_then(sip::tag);
    for part in [
        sip::call_id(&invite.headers).unwrap_or(""),
        from_tag.as_deref().unwrap_or(""),
    ] {
        for b in part.bytes().chain(std::iter::once(0)) {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}

/// The parameters of a SIP URI (`sip:user@host;a=b;c?headers`), lowercase
/// names, values %-decoded (RFC 3261 §19.1.1).
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

/// Answers a non-INVITE request (module docs); `None` for ACK (no answer).
pub fn other_method(req: &Request) -> Option<Response> {
    let tag = Some(tag_of(req));
    match req.method {
        Method::Ack => None,
        Method::Cancel | Method::Options => {
            let mut response = sip::response(req, StatusCode::OK, tag.as_deref());
            sip::push_header(&mut response.headers, "Allow", ALLOW);
            Some(response)
        }
        _ => {
            let mut response = sip::response(req, StatusCode::MethodNotAllowed, tag.as_deref());
            sip::push_header(&mut response.headers, "Allow", ALLOW);
            Some(response)
        }
    }
}

/// Runs the redirect server on `endpoint` until `shutdown`: every INVITE's
/// `select` goes to the shell over `tx`; answers are sent from tasks, so
/// one slow answer never holds up the next INVITE.
pub async fn serve(
    mut endpoint: SipEndpoint,
    tx: mpsc::Sender<AdminCommand>,
    ctx: RedirectContext,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let ctx = Arc::new(ctx);
    let mut tasks = JoinSet::new();
    loop {
        while tasks.try_join_next().is_some() {}
        let event = tokio::select! {
            () = shutdown.cancelled() => break,
            event = endpoint.recv() => event,
        };
        let Some(event) = event else { break };
        let SipEvent::Request(server_tx) = event else {
            continue;
        };
        let req = server_tx.request();
        if req.method != Method::Invite {
            if let Some(response) = other_method(req) {
                tasks.spawn(server_tx.respond(response));
            }
            continue;
        }
        let (tx, ctx, metrics) = (tx.clone(), Arc::clone(&ctx), Arc::clone(&metrics));
        tasks.spawn(async move {
            let invite = server_tx.request();
            let response = match decide(invite, &ctx) {
                Decision::Reply(response) => *response,
                Decision::Select(request) => {
                    let (reply, wait) = oneshot::channel();
                    let selection = if tx.send(AdminCommand { request, reply }).await.is_err() {
                        AdminResponse::error(ErrorCode::Unavailable, "collector is shutting down")
                    } else {
                        wait.await.unwrap_or_else(|_| {
                            AdminResponse::error(
                                ErrorCode::Unavailable,
                                "collector dropped the request",
                            )
                        })
                    };
                    answer(invite, &selection, &ctx)
                }
            };
            let status = response.status_code.code();
            metrics.redirect(status);
            debug!(
                call_id = sip::call_id(&invite.headers).unwrap_or(""),
                status, "redirect answered"
            );
            server_tx.respond(response).await;
        });
    }
    tasks.shutdown().await;
    endpoint.shutdown();
    info!("redirect server stopped");
}

#[cfg(test)]
mod tests;
