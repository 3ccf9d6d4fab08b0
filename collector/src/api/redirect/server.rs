//! The redirect server's shell: its UDP socket and stream connections,
//! the selections it asks the core, and where each response goes (RFC
//! 3261 §18.2.2, RFC 3581 §4). The decisions it sends are the parent
//! module's, the memory of answered INVITEs [`InviteCache`]'s.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use msr_shared::admin::{
    ErrorCode, Request as AdminRequest, Response as AdminResponse, ResponseData, SelectQuery,
};
use msr_shared::sip::wire;
use msr_shared::sip::{self, Method, Request, Response, SipMessage, StatusCode};
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{
    answer, decide, other_method, refusal, tag_of, transaction_key, Decision, InviteCache,
    OnCancel, OnInvite, RedirectContext,
};
use crate::api::metrics::Metrics;
use crate::core::{AdminId, Inbound, Route, StreamId};

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

/// A new INVITE's `select`, to ask the core ([`RedirectServer::admit`]).
pub struct Ask {
    /// The control protocol's `select` for the leg.
    pub request: AdminRequest,
    pending: Pending,
}

/// A leg the redirect server bound and nobody will release: its INVITE
/// was cancelled (487), or its 302 could not be sent or names this server
/// (482). The loop releases it as the control protocol's `release` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    /// The leg's `call_id`.
    pub call_id: String,
    /// The leg's `leg`.
    pub leg: Option<String>,
}

/// The most INVITEs whose selection is pending at once; past it a new
/// INVITE gets `503` at once (a flood must not queue without bound, nor
/// delay the answers to those already asked).
pub const MAX_SELECTING: usize = 1024;

/// The most datagrams read in one go before the loop looks at its other
/// inputs: under load one wake-up serves many datagrams (the cost of a
/// wake-up is of the order of a datagram's), yet nothing else waits
/// behind an unbounded burst.
const BATCH: usize = 64;

/// The redirect server, owned by the collector's loop (`daemon::shell`)
/// on the core's thread: the loop reads the socket when it is readable
/// ([`RedirectServer::on_readable`]), asks the core each new INVITE's
/// `select` directly ([`RedirectServer::admit`]) and hands its answer back
/// ([`RedirectServer::answered`]), which sends the final response at once:
/// no channel, no task, no wake-up between an INVITE and its 302. The
/// server alone owns the [`InviteCache`] and sends every response.
pub struct RedirectServer {
    server: Server,
    /// The selections asked and not yet answered, by their control id.
    pending: HashMap<AdminId, Pending>,
    buf: Vec<u8>,
}

impl RedirectServer {
    /// The server on `socket` (registered with the core thread's runtime);
    /// `sender` is the same socket (a `try_clone`, non-blocking), which
    /// answers are written to directly: a datagram that finds the send
    /// buffer full is lost like any other, and the client's retransmitted
    /// INVITE gets the cached answer (RFC 3261 §17.1.1.2 Timer A).
    pub fn new(
        socket: UdpSocket,
        sender: std::net::UdpSocket,
        reply: Option<StreamReply>,
        ctx: RedirectContext,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            server: Server {
                socket,
                sender,
                reply,
                ctx,
                metrics,
                cache: InviteCache::default(),
                unparsed: 0,
                strangers: 0,
            },
            pending: HashMap::new(),
            buf: vec![0u8; 65_536],
        }
    }

    /// Waits until the socket has a datagram to read.
    ///
    /// # Errors
    /// The socket's, which the loop logs and waits again.
    pub async fn readable(&self) -> std::io::Result<()> {
        self.server.socket.readable().await
    }

    /// Reads and serves up to `BATCH` (64) datagrams; each new INVITE that
    /// needs a selection goes to `asks`. Whether the batch was full: the
    /// socket may have more (a flood), so the caller yields before the
    /// next.
    pub fn on_readable(&mut self, now: Instant, asks: &mut Vec<Ask>) -> bool {
        let mut buf = std::mem::take(&mut self.buf);
        let mut full = true;
        for _ in 0..BATCH {
            match self.server.socket.try_recv_from(&mut buf) {
                Ok((_, src)) if !self.server.ctx.allows(src) => self.server.stranger(src),
                Ok((len, src)) => {
                    let packet = buf.get(..len).unwrap_or_default();
                    if let Some(ask) = self.server.on_datagram(now, packet, src) {
                        asks.push(ask);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    full = false;
                    break;
                }
                // ICMP port unreachable from an earlier send shows up here
                // on Linux; nothing to do but go on.
                Err(e) => debug!(cause = %e, "redirect socket receive error"),
            }
        }
        self.buf = buf;
        full
    }

    /// Serves a batch of messages from the stream connections; each new
    /// INVITE that needs a selection goes to `asks`.
    pub fn on_streams(&mut self, now: Instant, batch: Vec<Inbound>, asks: &mut Vec<Ask>) {
        for inbound in batch {
            let Route::Stream(id, _) = inbound.route else {
                continue;
            };
            if !self.server.ctx.allows(inbound.source) {
                self.server.stranger(inbound.source);
                continue;
            }
            let SipMessage::Request(req) = inbound.message else {
                continue;
            };
            if let Some(ask) = self.server.on_request(now, req, Dest::Stream(id)) {
                asks.push(ask);
            }
        }
    }

    /// Takes `ask` as control request `id` and returns the `select` to
    /// give the core; `None` when [`MAX_SELECTING`] are pending already,
    /// in which case the INVITE was answered `503`.
    pub fn admit(&mut self, id: AdminId, ask: Ask) -> Option<AdminRequest> {
        if self.pending.len() >= MAX_SELECTING {
            self.server.shed(ask.pending);
            return None;
        }
        self.pending.insert(id, ask.pending);
        Some(ask.request)
    }

    /// Whether control request `id` is one of this server's selections.
    pub fn is_pending(&self, id: AdminId) -> bool {
        self.pending.contains_key(&id)
    }

    /// The core answered selection `id`: its INVITE's final response goes
    /// out now. The leg to release, if the INVITE got no usable 302.
    pub fn answered(&mut self, id: AdminId, selection: &AdminResponse) -> Option<Release> {
        let pending = self.pending.remove(&id)?;
        self.server.finish_selection(pending, selection)
    }
}

/// The redirect server's state (module docs of [`RedirectServer`]).
struct Server {
    socket: UdpSocket,
    sender: std::net::UdpSocket,
    reply: Option<StreamReply>,
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
    fn on_datagram(&mut self, now: Instant, packet: &[u8], src: SocketAddr) -> Option<Ask> {
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
        // header after a bad byte, and with them the leg's inputs. A body
        // is the payload's own (an SDP `s=` in Latin-1 under `a=charset`,
        // RFC 4566 §6): its other bytes are read as `?`, which the codecs
        // (ASCII) never are, so the call is served.
        let ascii_body;
        let packet = match std::str::from_utf8(packet) {
            Ok(_) => packet,
            Err(_) => match text_head_then_body(packet) {
                Some(cleaned) => {
                    ascii_body = cleaned;
                    &ascii_body[..]
                }
                None => {
                    self.not_sip(src, "not utf-8");
                    return None;
                }
            },
        };
        let parsed = wire::check_method_case(packet)
            .map_err(|e| e.to_string())
            .and_then(|()| SipMessage::try_from(packet).map_err(|e| e.to_string()));
        let mut req = match parsed {
            Ok(SipMessage::Request(req)) => req,
            // A response to a server that sends no requests: ignored.
            Ok(SipMessage::Response(_)) => return None,
            Err(e) => {
                // RFC 3261 §8.2, RFC 4475: what the parser refuses is
                // answered from the raw head where a response can be
                // built (an extension method 501, a Content-Length that
                // is no number or longer than the datagram 400 — one the
                // parser takes is refused by `request_refusal` below — a
                // malformed line or head 400), looked for only here, off
                // the path of every well-formed INVITE.
                match wire::refused(packet, super::ALLOW) {
                    Some(response) => {
                        let dest = wire::response_target(&response.headers, src);
                        self.send(
                            &wire::encode_response(response, crate::core::USER_AGENT),
                            Dest::Udp(dest),
                        );
                    }
                    None => self.not_sip(src, &e),
                }
                return None;
            }
        };
        let dest = wire::response_target(&req.headers, src);
        if let Err(e) = wire::stamp_received(&mut req.headers, src) {
            self.not_sip(src, &e.to_string());
            return None;
        }
        self.on_request(now, req, Dest::Udp(dest))
    }

    /// Serves one request whose answers go to `dest`; a new INVITE that
    /// needs a selection is returned with the `select` to ask.
    fn on_request(&mut self, now: Instant, req: Request, dest: Dest) -> Option<Ask> {
        // SPEC §16: a request no server may act on (RFC 4475).
        if let Some(refused) = msr_shared::sip::request_refusal(&req, super::ALLOW) {
            if req.method != Method::Ack {
                let mut response = refusal(
                    &req,
                    refused.status.clone(),
                    ErrorCode::BadRequest,
                    refused.why,
                );
                refused.complete(&mut response);
                if req.method == Method::Invite {
                    self.metrics.redirect(refused.status.code());
                }
                self.send(
                    &wire::encode_response(response, crate::core::USER_AGENT),
                    dest,
                );
            }
            return None;
        }
        match req.method {
            Method::Invite => {
                let Some(key) = transaction_key(&req) else {
                    let response = refusal(
                        &req,
                        StatusCode::BadRequest,
                        ErrorCode::BadRequest,
                        "no via",
                    );
                    self.metrics.redirect(response.status_code.code());
                    self.send(
                        &wire::encode_response(response, crate::core::USER_AGENT),
                        dest,
                    );
                    return None;
                };
                match self.cache.on_invite(now, &key) {
                    OnInvite::Resend(bytes) => {
                        self.send(&bytes, dest);
                    }
                    OnInvite::Absorb => {}
                    OnInvite::New => match decide(&req) {
                        Decision::Reply(response) => {
                            let done = Done {
                                key,
                                dest,
                                invite: Box::new(req),
                                response: *response,
                                leg: None,
                            };
                            // A reply decided without a selection binds no
                            // leg: nothing to release.
                            let _ = self.finish(done);
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
                            return Some(Ask { request, pending });
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
                self.send(
                    &wire::encode_response(response, crate::core::USER_AGENT),
                    dest,
                );
            }
            _ => {
                if let Some(response) = other_method(&req) {
                    self.send(
                        &wire::encode_response(response, crate::core::USER_AGENT),
                        dest,
                    );
                }
            }
        }
        None
    }

    /// A pending INVITE's selection came back: answer it.
    fn finish_selection(&mut self, pending: Pending, selection: &AdminResponse) -> Option<Release> {
        let Pending {
            key,
            dest,
            invite,
            leg,
        } = pending;
        let leg = leg.filter(|_| matches!(selection, AdminResponse::Ok(ResponseData::Selected(_))));
        let response = answer(&invite, selection, &self.ctx);
        self.finish(Done {
            key,
            dest,
            invite,
            response,
            leg,
        })
    }

    /// Sends an INVITE's final response and remembers it; a cancelled one
    /// gets `487` instead and its leg is to be released (RFC 3261 §9.2).
    fn finish(&mut self, done: Done) -> Option<Release> {
        let Done {
            key,
            dest,
            invite,
            response,
            leg,
        } = done;
        let mut status = response.status_code.code();
        let mut bytes = wire::encode_response(response, crate::core::USER_AGENT);
        if !self.cache.answered(&key, &bytes) {
            let terminated = sip::response(
                &invite,
                StatusCode::RequestTerminated,
                Some(&tag_of(&invite)),
            );
            status = terminated.status_code.code();
            bytes = wire::encode_response(terminated, crate::core::USER_AGENT);
            self.cache.answered(&key, &bytes);
        }
        self.metrics.redirect(status);
        debug!(
            call_id = sip::call_id(&invite.headers).unwrap_or(""),
            status, "redirect answered"
        );
        let sent = self.send(&bytes, dest);
        // The leg stays bound only when its 302 went out: after a 487
        // (cancelled, RFC 3261 §9.2), a 482 (the chosen engine is this
        // server) or a send that failed, the caller has no Contact to use
        // and nobody would release it.
        if status != StatusCode::MovedTemporarily.code() || !sent {
            return leg.map(|(call_id, leg)| Release { call_id, leg });
        }
        None
    }

    /// An INVITE past [`MAX_SELECTING`]: `503` now, remembered for its
    /// retransmissions.
    fn shed(&mut self, pending: Pending) {
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
        // No selection ran: no leg to release.
        let _ = self.finish(Done {
            key,
            dest,
            invite,
            response,
            leg: None,
        });
    }

    /// A datagram that is not a SIP message: dropped, counted, and logged
    /// at most once per 1,024.
    fn not_sip(&mut self, src: SocketAddr, cause: &str) {
        // The first of each 1,024 is logged at INFO: a peer that sends
        // what is not SIP hears nothing, and its operator must be able to
        // find out why.
        self.unparsed += 1;
        if self.unparsed % 1024 == 1 {
            info!(target: msr_shared::logging::NETWORK, %src, cause, dropped = self.unparsed, "redirect server dropped a datagram that is not sip");
        }
    }

    /// Whether `bytes` went out. A failure is logged with the network
    /// target, so a flood of them is rate limited.
    fn send(&self, bytes: &[u8], dest: Dest) -> bool {
        let sent = match dest {
            Dest::Udp(addr) => self.sender.send_to(bytes, addr).map(|_| ()),
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

/// `packet` with every byte of its body (after the blank line ending its
/// head) that is not ASCII read as `?`, when its head is UTF-8; `None`
/// when the head is not (not SIP). The length is unchanged, so
/// `Content-Length` still holds.
pub(super) fn text_head_then_body(packet: &[u8]) -> Option<Vec<u8>> {
    let end = packet
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| at + 4)
        .or_else(|| {
            packet
                .windows(2)
                .position(|w| w == b"\n\n")
                .map(|at| at + 2)
        })?;
    std::str::from_utf8(&packet[..end]).ok()?;
    Some(
        packet
            .iter()
            .enumerate()
            .map(|(i, &b)| if i >= end && !b.is_ascii() { b'?' } else { b })
            .collect(),
    )
}
