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
//! * [`serve`] owns the redirect server's UDP socket and sends each
//!   `select` to the shell's one handler over the control socket's channel.
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
//! `[defaults]`. The Call-ID is the leg's `call_id`, so a retransmitted (or
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
//! `Allow`; any other method `405`.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use msr_shared::admin::{
    ErrorCode, Request as AdminRequest, Response as AdminResponse, ResponseData, SelectQuery,
};
use msr_shared::sip::wire;
use msr_shared::sip::{self, Method, Request, Response, SipMessage, StatusCode};
use rsipstack::transport::SipConnection;
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::api::handler::AdminCommand;
use crate::api::metrics::Metrics;
use crate::core::{Inbound, Route, StreamId};

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
    Decision::Select(AdminRequest::Select(SelectQuery {
        msr: pick("msr", "X-MSR-Other"),
        call_id: Some(call_id.trim().to_owned()),
        leg: pick("leg", "X-MSR-Leg"),
        conference: pick("conference", "X-MSR-Conference"),
        ..SelectQuery::new(zone, site)
    }))
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

/// Answers a request other than INVITE and CANCEL (module docs); `None`
/// for ACK (no answer).
pub fn other_method(req: &Request) -> Option<Response> {
    let tag = Some(tag_of(req));
    match req.method {
        Method::Ack => None,
        Method::Options => {
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

/// How long an answered INVITE is remembered: 64 × T1 = 32 s, the longest
/// a client retransmits it (RFC 3261 §17.1.1.2 Timer B) and so the longest
/// a retransmission or a CANCEL can come.
pub const REMEMBER: Duration = Duration::from_secs(32);

/// The most INVITEs remembered at once; past it the oldest are forgotten
/// (a retransmission of a forgotten one is selected again and, its
/// Call-ID being a live leg, gets the same Contact).
pub const MAX_REMEMBERED: usize = 16_384;

/// An INVITE's identity for retransmissions and CANCEL (RFC 3261
/// §17.2.3): the top `Via`'s branch and sent-by.
pub fn transaction_key(req: &Request) -> Option<String> {
    let via = sip::header(&req.headers, "Via")?;
    let top = via.split(',').next().unwrap_or(via);
    let branch = sip::param(top, "branch").filter(|b| !b.is_empty())?;
    let sent_by = top
        .split(';')
        .next()
        .and_then(|p| p.split_whitespace().nth(1))
        .unwrap_or("");
    Some(format!("{branch} {sent_by}"))
}

/// Where an INVITE is in this server's short memory.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// Its selection is running; `cancelled` once a CANCEL came.
    Pending { cancelled: bool },
    /// Its final response, as sent.
    Answered(Bytes),
}

/// What to do with an INVITE ([`InviteCache::on_invite`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnInvite {
    /// A new one: decide and select.
    New,
    /// A retransmission of one answered: send these bytes again.
    Resend(Bytes),
    /// A retransmission of one still being selected: its answer will come.
    Absorb,
}

/// What to answer a CANCEL ([`InviteCache::on_cancel`], RFC 3261 §9.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnCancel {
    /// `200` to the CANCEL; the INVITE's final response stands.
    Answered,
    /// `200` to the CANCEL; the INVITE gets `487` when its selection ends.
    Terminate,
    /// `481`: no INVITE matches.
    NoMatch,
}

/// The INVITEs answered lately (module docs). Sans-IO: the caller passes
/// the time.
#[derive(Debug, Default)]
pub struct InviteCache {
    entries: HashMap<String, Entry>,
    /// Keys by the time they were first seen, for expiry and the bound.
    order: VecDeque<(Instant, String)>,
}

impl InviteCache {
    /// An INVITE with `key` arrived at `now`.
    pub fn on_invite(&mut self, now: Instant, key: &str) -> OnInvite {
        self.expire(now);
        match self.entries.get(key) {
            Some(Entry::Answered(bytes)) => OnInvite::Resend(bytes.clone()),
            Some(Entry::Pending { .. }) => OnInvite::Absorb,
            None => {
                while self.order.len() >= MAX_REMEMBERED {
                    self.forget_oldest();
                }
                self.entries
                    .insert(key.to_owned(), Entry::Pending { cancelled: false });
                self.order.push_back((now, key.to_owned()));
                OnInvite::New
            }
        }
    }

    /// The INVITE with `key` was answered with `bytes`. `false` when a
    /// CANCEL came first: then the caller answers `487` instead (and
    /// records that with `answered` again, which then returns `true`).
    pub fn answered(&mut self, key: &str, bytes: Bytes) -> bool {
        match self.entries.get_mut(key) {
            Some(entry) if *entry == (Entry::Pending { cancelled: true }) => {
                // The 487 is recorded next; until then retransmissions wait.
                *entry = Entry::Pending { cancelled: false };
                false
            }
            Some(entry) => {
                *entry = Entry::Answered(bytes);
                true
            }
            // Forgotten while selecting (the bound): nothing to remember.
            None => true,
        }
    }

    /// A CANCEL for the INVITE with `key` arrived at `now`.
    pub fn on_cancel(&mut self, now: Instant, key: &str) -> OnCancel {
        self.expire(now);
        match self.entries.get_mut(key) {
            Some(Entry::Answered(_)) => OnCancel::Answered,
            Some(Entry::Pending { cancelled }) => {
                *cancelled = true;
                OnCancel::Terminate
            }
            None => OnCancel::NoMatch,
        }
    }

    /// INVITEs remembered now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn expire(&mut self, now: Instant) {
        while let Some((at, _)) = self.order.front() {
            if now.duration_since(*at) < REMEMBER {
                break;
            }
            self.forget_oldest();
        }
    }

    fn forget_oldest(&mut self) {
        if let Some((_, key)) = self.order.pop_front() {
            self.entries.remove(&key);
        }
    }
}

/// Where the response to a request from `src` goes (RFC 3261 §18.2.2 for
/// UDP, RFC 3581 §4): the source address when the top `Via` asked for
/// `rport`, else the source IP (the `received` address) and the `Via`'s
/// sent-by port (5060 when it has none).
fn response_destination(req: &Request, src: SocketAddr) -> SocketAddr {
    let Some(via) = sip::header(&req.headers, "Via") else {
        return src;
    };
    let top = via.split(',').next().unwrap_or(via);
    if sip::params(top).iter().any(|(k, _)| k == "rport") {
        return src;
    }
    let sent_by = top
        .split(';')
        .next()
        .and_then(|p| p.split_whitespace().nth(1))
        .unwrap_or("");
    let port = sent_by
        .rsplit_once(':')
        .filter(|(host, _)| !host.ends_with(':') && (!host.contains(':') || host.ends_with(']')))
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or(5060);
    SocketAddr::new(src.ip(), port)
}

/// A selection finished: the INVITE's key, where to answer, the answer and
/// the leg the selection bound (to release if the INVITE was cancelled).
struct Done {
    key: String,
    dest: Dest,
    invite: Box<Request>,
    response: Response,
    leg: Option<(String, Option<String>)>,
}

/// Where a response goes: a datagram to the address the request's `Via`
/// names (RFC 3261 §18.2.2), or back on the connection it came on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dest {
    Udp(SocketAddr),
    Stream(StreamId),
}

impl std::fmt::Display for Dest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dest::Udp(addr) => write!(f, "udp {addr}"),
            Dest::Stream(id) => write!(f, "tcp connection {}", id.0),
        }
    }
}

/// Writes a response on a stream connection; `false` when it is gone.
pub type StreamReply = Arc<dyn Fn(StreamId, Bytes) -> bool + Send + Sync>;

/// The redirect server's stream connections (`[redirect] transports` with
/// `"tcp"`): their messages, read and framed by the collector's stream
/// ingest, and the way back.
pub struct StreamSide {
    /// Batches of messages from the connections.
    pub messages: mpsc::Receiver<Vec<Inbound>>,
    /// Writes a response on its connection.
    pub reply: StreamReply,
}

/// An INVITE waiting for its selection, and the leg the selection binds
/// (its `call_id` and `leg`).
struct Pending {
    key: String,
    dest: Dest,
    invite: Box<Request>,
    leg: Option<(String, Option<String>)>,
}

/// The most INVITEs whose selection is pending at once; past it a new
/// INVITE gets `503` at once (a flood must not queue without bound, nor
/// delay the answers to those already asked).
pub const MAX_SELECTING: usize = 1024;

/// The most datagrams read in one go before the loop looks at finished
/// selections again: under load one wake-up serves many datagrams (the
/// cost of a wake-up is of the order of a datagram's), yet answers never
/// wait behind an unbounded burst.
const BATCH: usize = 64;

/// Runs the redirect server on `socket` until `shutdown`. The loop alone
/// owns the [`InviteCache`] and sends every response; each INVITE's
/// `select` goes to the shell over `tx` and is awaited among the loop's
/// pending selections, so one slow answer never holds up the next INVITE.
pub async fn serve(
    socket: UdpSocket,
    streams: Option<StreamSide>,
    tx: mpsc::Sender<AdminCommand>,
    ctx: RedirectContext,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let (mut stream_messages, reply) = match streams {
        Some(side) => (Some(side.messages), Some(side.reply)),
        None => (None, None),
    };
    let mut server = Server {
        socket,
        reply,
        tx,
        ctx,
        metrics,
        cache: InviteCache::default(),
        unparsed: 0,
        strangers: 0,
    };
    let mut selecting = FuturesUnordered::new();
    let mut buf = vec![0u8; 65_536];
    loop {
        tokio::select! {
            // Answers first: they free their places among the pending.
            biased;
            () = shutdown.cancelled() => break,
            Some((pending, selection)) = selecting.next(), if !selecting.is_empty() => {
                server.finish_selection(pending, selection).await;
            }
            Some(batch) = next_batch(&mut stream_messages) => {
                for inbound in batch {
                    let Route::Stream(id, _) = inbound.route else {
                        continue;
                    };
                    if !server.ctx.allows(inbound.source) {
                        server.stranger(inbound.source);
                        continue;
                    }
                    let SipMessage::Request(req) = inbound.message else {
                        continue;
                    };
                    if let Some((pending, request)) = server.on_request(req, Dest::Stream(id)).await {
                        if selecting.len() < MAX_SELECTING {
                            selecting.push(select(server.tx.clone(), pending, request));
                        } else {
                            server.shed(pending).await;
                        }
                    }
                }
            }
            received = server.socket.recv_from(&mut buf) => {
                let mut received = received;
                for _ in 0..BATCH {
                    match received {
                        Ok((_, src)) if !server.ctx.allows(src) => server.stranger(src),
                        Ok((len, src)) => {
                            if let Some((pending, request)) = server.on_datagram(buf.get(..len).unwrap_or_default(), src).await {
                                if selecting.len() < MAX_SELECTING {
                                    selecting.push(select(server.tx.clone(), pending, request));
                                } else {
                                    server.shed(pending).await;
                                }
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        // ICMP port unreachable from an earlier send shows
                        // up here on Linux; nothing to do but go on.
                        Err(e) => debug!(cause = %e, "redirect socket receive error"),
                    }
                    received = server.socket.try_recv_from(&mut buf);
                }
            }
        }
    }
    info!("redirect server stopped");
}

/// The next batch from the stream connections; never, without them.
async fn next_batch(messages: &mut Option<mpsc::Receiver<Vec<Inbound>>>) -> Option<Vec<Inbound>> {
    match messages {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Asks the shell the pending INVITE's `select` and builds its answer.
async fn select(
    tx: mpsc::Sender<AdminCommand>,
    pending: Pending,
    request: AdminRequest,
) -> (Pending, AdminResponse) {
    let (reply, wait) = oneshot::channel();
    let command = AdminCommand { request, reply };
    let selection = if tx.send(command).await.is_err() {
        AdminResponse::error(ErrorCode::Unavailable, "collector is shutting down")
    } else {
        wait.await.unwrap_or_else(|_| {
            AdminResponse::error(ErrorCode::Unavailable, "collector dropped the request")
        })
    };
    (pending, selection)
}

/// The redirect server's state, owned by [`serve`]'s loop.
struct Server {
    socket: UdpSocket,
    reply: Option<StreamReply>,
    tx: mpsc::Sender<AdminCommand>,
    ctx: RedirectContext,
    metrics: Arc<Metrics>,
    cache: InviteCache,
    unparsed: u64,
    /// Datagrams from hosts `[redirect] allow` does not name.
    strangers: u64,
}

impl Server {
    /// A datagram from a host `[redirect] allow` does not name: dropped
    /// unread and counted (the log line is rate limited).
    fn stranger(&mut self, src: SocketAddr) {
        self.strangers += 1;
        info!(
            target: msr_shared::logging::NETWORK,
            %src,
            dropped_total = self.strangers,
            "redirect: datagram from a host [redirect] allow does not name, dropped"
        );
    }

    /// Serves one datagram from `src`; a new INVITE that needs a selection
    /// is returned with the `select` to ask.
    async fn on_datagram(
        &mut self,
        packet: &[u8],
        src: SocketAddr,
    ) -> Option<(Pending, AdminRequest)> {
        // Keep-alives (RFC 5626 §3.5.1 CRLF) and empty datagrams.
        if packet.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        // §17.1.1.3: the ACK of a non-2xx final response needs no answer,
        // and this server sends no other final response; method names are
        // case-sensitive (§7.1), so the first four bytes tell, unparsed.
        if packet.starts_with(b"ACK ") {
            return None;
        }
        // SIP is UTF-8 text (RFC 3261 §7.3.1); the parser would drop every
        // header after a bad byte, and with them the leg's inputs.
        if std::str::from_utf8(packet).is_err() {
            self.not_sip(src, "not utf-8");
            return None;
        }
        // Where the answer goes is read from the Via as it came (§18.2.2):
        // the `received`/`rport` the stack adds below would hide a Via
        // without `rport`.
        let mut dest = src;
        let req = match SipMessage::try_from(packet).and_then(|m| {
            if let SipMessage::Request(req) = &m {
                dest = response_destination(req, src);
            }
            SipConnection::update_msg_received(m, src, rsipstack::sip::Transport::Udp)
                .map_err(|e| rsipstack::sip::Error::Unexpected(e.to_string()))
        }) {
            Ok(SipMessage::Request(req)) => req,
            // A response to a server that sends no requests: ignored.
            Ok(SipMessage::Response(_)) => return None,
            Err(e) => {
                self.not_sip(src, &e.to_string());
                return None;
            }
        };
        self.on_request(req, Dest::Udp(dest)).await
    }

    /// Serves one request whose answers go to `dest`; a new INVITE that
    /// needs a selection is returned with the `select` to ask.
    async fn on_request(&mut self, req: Request, dest: Dest) -> Option<(Pending, AdminRequest)> {
        let now = Instant::now();
        match req.method {
            Method::Invite => {
                let Some(key) = transaction_key(&req) else {
                    let response = refusal(
                        &req,
                        StatusCode::BadRequest,
                        ErrorCode::BadRequest,
                        "no via branch",
                    );
                    self.send(&wire::encode_response(response), dest).await;
                    return None;
                };
                match self.cache.on_invite(now, &key) {
                    OnInvite::Resend(bytes) => {
                        self.send(&bytes, dest).await;
                    }
                    OnInvite::Absorb => {}
                    OnInvite::New => match decide(&req, &self.ctx) {
                        Decision::Reply(response) => {
                            let done = Done {
                                key,
                                dest,
                                invite: Box::new(req),
                                response: *response,
                                leg: None,
                            };
                            self.finish(done).await;
                        }
                        Decision::Select(request) => {
                            let leg = match &request {
                                AdminRequest::Select(SelectQuery {
                                    call_id: Some(c),
                                    leg,
                                    ..
                                }) => Some((c.clone(), leg.clone())),
                                _ => None,
                            };
                            let pending = Pending {
                                key,
                                dest,
                                invite: Box::new(req),
                                leg,
                            };
                            return Some((pending, request));
                        }
                    },
                }
            }
            Method::Ack => {}
            Method::Cancel => {
                let on = transaction_key(&req)
                    .map_or(OnCancel::NoMatch, |key| self.cache.on_cancel(now, &key));
                let status = match on {
                    OnCancel::Answered | OnCancel::Terminate => StatusCode::OK,
                    OnCancel::NoMatch => StatusCode::CallTransactionDoesNotExist,
                };
                let response = sip::response(&req, status, Some(&tag_of(&req)));
                self.send(&wire::encode_response(response), dest).await;
            }
            _ => {
                if let Some(response) = other_method(&req) {
                    self.send(&wire::encode_response(response), dest).await;
                }
            }
        }
        None
    }

    /// A pending INVITE's selection came back: answer it.
    async fn finish_selection(&mut self, pending: Pending, selection: AdminResponse) {
        let Pending {
            key,
            dest,
            invite,
            leg,
        } = pending;
        let leg = leg.filter(|_| matches!(selection, AdminResponse::Ok(ResponseData::Selected(_))));
        let response = answer(&invite, &selection, &self.ctx);
        self.finish(Done {
            key,
            dest,
            invite,
            response,
            leg,
        })
        .await;
    }

    /// Sends an INVITE's final response and remembers it; a cancelled one
    /// gets `487` instead and its leg is released (RFC 3261 §9.2).
    async fn finish(&mut self, done: Done) {
        let Done {
            key,
            dest,
            invite,
            response,
            leg,
        } = done;
        let mut status = response.status_code.code();
        let mut bytes = wire::encode_response(response);
        if !self.cache.answered(&key, bytes.clone()) {
            let terminated = sip::response(
                &invite,
                StatusCode::RequestTerminated,
                Some(&tag_of(&invite)),
            );
            status = terminated.status_code.code();
            bytes = wire::encode_response(terminated);
            self.cache.answered(&key, bytes.clone());
        }
        self.metrics.redirect(status);
        debug!(
            call_id = sip::call_id(&invite.headers).unwrap_or(""),
            status, "redirect answered"
        );
        let sent = self.send(&bytes, dest).await;
        // The leg stays bound only when its 302 went out: after a 487
        // (cancelled, RFC 3261 §9.2), a 482 (the chosen engine is this
        // server) or a send that failed, the caller has no Contact to use
        // and nobody would release it.
        if status != StatusCode::MovedTemporarily.code() || !sent {
            if let Some((call_id, leg)) = leg {
                self.release(call_id, leg);
            }
        }
    }

    /// An INVITE past [`MAX_SELECTING`]: `503` now, remembered for its
    /// retransmissions.
    async fn shed(&mut self, pending: Pending) {
        let Pending {
            key, dest, invite, ..
        } = pending;
        let mut response = refusal(
            &invite,
            StatusCode::ServiceUnavailable,
            ErrorCode::Unavailable,
            "too many selections pending",
        );
        sip::push_header(&mut response.headers, "Retry-After", "1");
        self.finish(Done {
            key,
            dest,
            invite,
            response,
            leg: None,
        })
        .await;
    }

    /// Releases a leg a selection bound, as the control protocol's
    /// `release` does (from a task: the shell's queue may be full).
    fn release(&self, call_id: String, leg: Option<String>) {
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let (reply, _) = oneshot::channel();
            let _ = tx
                .send(AdminCommand {
                    request: AdminRequest::Release { call_id, leg },
                    reply,
                })
                .await;
        });
    }

    /// A datagram that is not a SIP message: dropped, counted, and logged
    /// at most once per 1,024.
    fn not_sip(&mut self, src: SocketAddr, cause: &str) {
        self.unparsed += 1;
        if self.unparsed % 1024 == 1 {
            debug!(%src, cause, dropped = self.unparsed, "redirect server dropped a datagram that is not sip");
        }
    }

    /// Whether `bytes` went out. A failure is logged with the network
    /// target, so a flood of them is rate limited.
    async fn send(&self, bytes: &[u8], dest: Dest) -> bool {
        let sent = match dest {
            Dest::Udp(addr) => self.socket.send_to(bytes, addr).await.map(|_| ()),
            Dest::Stream(id) => match &self.reply {
                Some(reply) if reply(id, Bytes::copy_from_slice(bytes)) => Ok(()),
                _ => Err(std::io::Error::new(
                    std::io::ErrorKind::NotConnected,
                    "the connection closed",
                )),
            },
        };
        match sent {
            Ok(()) => true,
            Err(e) => {
                warn!(target: msr_shared::logging::NETWORK, %dest, cause = %e, "redirect server cannot send");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests;
