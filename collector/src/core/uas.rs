//! SIP in: the collector as a stateless UAS (RFC 3261 §8.2.7). A request
//! is answered at once from what the cores decide — REGISTERs by the
//! registrar, NOTIFYs by the subscriber, OPTIONS with `Allow` — after the
//! `[sip.tls]` checks of who may register and report; a response ends one
//! of the collector's own client transactions (RFC 3261 §17.1.2), whose
//! requests leave from here too, over the flow their contact registered on.

use std::net::SocketAddr;
use std::time::Duration;

use msr_shared::sip::transaction::{Link, Outcome, StreamTransport};
use msr_shared::sip::{self, wire, Method, SipMessage, StatusCode};
use tokio::time::Instant;
use tracing::info;

use super::bindings::HeldAnswer;
use super::{Collector, Count, Inbound, RequestId, Route, Transmit};
use crate::sip::not_sent::NotSent;
use crate::sip::subscriber::RetryCause;

impl Collector {
    /// A SIP message arrived at `now`.
    pub fn handle_message(&mut self, now: Instant, inbound: Inbound) {
        match inbound.message {
            SipMessage::Request(request) => {
                let certificate = inbound.peer_certificate.as_deref();
                self.on_request(now, inbound.route, inbound.source, certificate, &request)
            }
            SipMessage::Response(response) => {
                if let Some((id, response)) = self.transactions.handle_response(now, response) {
                    self.on_outcome(now, id, Outcome::Response(response));
                }
            }
        }
        self.settle(now);
    }

    /// Answers one request (module docs: statelessly).
    fn on_request(
        &mut self,
        now: Instant,
        route: Route,
        source: SocketAddr,
        certificate: Option<&[u8]>,
        req: &sip::Request,
    ) {
        // SPEC §16: a request the daemons must not act on (RFC 4475).
        if let Some(refusal) = sip::request_refusal(req, ALLOW) {
            if req.method != Method::Ack {
                info!(target: msr_shared::logging::NETWORK, %source, status = %refusal.status, why = refusal.why, "request refused");
                let response = refusal.response(req, super::USER_AGENT);
                let transmit = self.response_to(route, source, req, response);
                self.transmits.push_back(transmit);
            }
            return;
        }
        let over_tls = matches!(route, Route::Stream(_, StreamTransport::Tls));
        let msr =
            || sip::header(&req.headers, "To").and_then(|to| sip::uri_user(sip::addr_uri(to)));
        let response = match req.method {
            Method::Register | Method::Notify if self.require_tls && !over_tls => {
                // `[sip.tls] require`: an MSR's registration and its load
                // reports are taken over TLS only.
                info!(
                    target: msr_shared::logging::NETWORK,
                    method = %req.method,
                    %source,
                    "request refused: sip.tls.require takes registrations and notifies over tls only"
                );
                sip::response(
                    req,
                    StatusCode::Forbidden,
                    Some(&sip::stateless_tag(&req.headers)),
                )
            }
            Method::Register
                if self.mutual_tls
                    && over_tls
                    && !msr().is_some_and(|msr| {
                        certificate.is_some_and(|der| msr_shared::certificate::names(der, msr))
                    }) =>
            {
                // Mutual TLS: the handshake proved the certificate chains
                // to the agents' CA; it must also be this MSR's.
                info!(
                    target: msr_shared::logging::NETWORK,
                    msr = msr().map(|m| m.escape_debug().to_string()),
                    %source,
                    "register refused: the client certificate does not name this msr"
                );
                sip::response(
                    req,
                    StatusCode::Forbidden,
                    Some(&sip::stateless_tag(&req.headers)),
                )
            }
            Method::Register => {
                let response = self.registrar.handle_register(now, req, Some(source));
                self.counts
                    .push_back(Count::Register(response.status_code.code()));
                if response.status_code == StatusCode::OK {
                    self.flows.registered(route, req);
                }
                // A 200 waits for the disk when this REGISTER changed a
                // binding (the settle that follows counts the change: the
                // next generation) or an earlier change is not saved yet.
                let waits_for = if self.registrar.has_events() {
                    Some(self.bindings.changed + 1)
                } else {
                    self.bindings.dirty().then_some(self.bindings.changed)
                };
                if let Some(generation) =
                    waits_for.filter(|_| response.status_code == StatusCode::OK)
                {
                    let route = self.route_to(route, source, req);
                    self.bindings.held.push_back((
                        generation,
                        HeldAnswer {
                            route,
                            request: req.clone(),
                            response,
                        },
                    ));
                    return;
                }
                response
            }
            Method::Notify => {
                let unix = self.unix_secs(now);
                let sender = self.flows.sender(route, source);
                let response = self.subscriber.handle_notify(now, unix, Some(sender), req);
                self.counts.push_back(Count::Notify {
                    accepted: response.status_code == StatusCode::OK,
                });
                // The final NOTIFY of a dialog this collector forgot (an
                // agent ends the subscription a restarted collector
                // replaced, RFC 6665 §4.2.2) is answered 481 as the RFC
                // says, and is no refusal worth a line: one per MSR at
                // every restart.
                let forgotten_final = response.status_code
                    == StatusCode::CallTransactionDoesNotExist
                    && sip::header(&req.headers, "Subscription-State")
                        .and_then(sip::SubscriptionStateHeader::parse)
                        .is_some_and(|s| s.state == sip::SubState::Terminated);
                if forgotten_final {
                    tracing::debug!(
                        call_id = sip::call_id(&req.headers).map(tracing::field::display),
                        %source,
                        "final notify of a dialog this collector does not know answered 481"
                    );
                } else if response.status_code != StatusCode::OK {
                    // Anyone can send NOTIFYs: rate limited
                    // (msr_shared::logging::FloodLimit).
                    info!(
                        target: msr_shared::logging::NETWORK,
                        call_id = sip::call_id(&req.headers).map(tracing::field::display),
                        status = %response.status_code,
                        %source,
                        "notify refused"
                    );
                }
                response
            }
            Method::Options => sip::options_answer(
                req,
                &sip::stateless_tag(&req.headers),
                ALLOW,
                msr_shared::event_package::CONTENT_TYPE,
            ),
            Method::Ack => return,
            _ => allow(sip::response(
                req,
                StatusCode::MethodNotAllowed,
                Some(&sip::stateless_tag(&req.headers)),
            )),
        };
        let transmit = self.response_to(route, source, req, response);
        self.transmits.push_back(transmit);
    }

    /// The response to `req`, addressed the way it came.
    fn response_to(
        &self,
        route: Route,
        source: SocketAddr,
        req: &sip::Request,
        response: sip::Response,
    ) -> Transmit {
        Transmit {
            route: self.route_to(route, source, req),
            bytes: wire::encode_response(response, super::USER_AGENT),
        }
    }

    /// Where a response to `req`, which came on `route` from `source`,
    /// goes.
    fn route_to(&self, route: Route, source: SocketAddr, req: &sip::Request) -> Route {
        match route {
            Route::Udp(_) => Route::Udp(wire::response_target(&req.headers, source)),
            stream => stream,
        }
    }

    /// A client transaction ended.
    pub(super) fn on_outcome(&mut self, now: Instant, id: RequestId, outcome: Outcome) {
        match (id, outcome) {
            (RequestId::Subscribe(id), Outcome::Response(response)) => {
                self.subscriber.handle_response(now, id, &response)
            }
            // RFC 3261 §8.1.3.1: a timeout is a 408.
            (RequestId::Subscribe(id), Outcome::TimedOut) => {
                self.subscriber
                    .handle_failure(now, id, RetryCause::TimedOut)
            }
            (RequestId::Keepalive(id), Outcome::Response(response)) => {
                self.health.handle_response(now, id, &response.status_code)
            }
            (RequestId::Keepalive(id), Outcome::TimedOut) => self.health.handle_failure(now, id),
        }
    }

    /// Sends `request` to the contact URI it is addressed to in a client
    /// transaction; `Err` when that URI names no IP address and port, or
    /// the request has no CSeq.
    pub(super) fn send_request(
        &mut self,
        now: Instant,
        id: RequestId,
        request: sip::Request,
        timeout: Option<Duration>,
    ) -> Result<(), NotSent> {
        let target = request.uri.to_string();
        let to = sip::uri_socket_addr(&target).ok_or_else(|| NotSent::NotAnAddress {
            target: request.uri.to_string(),
        })?;
        let (link, contact) = self.flows.link(&target, to)?;
        let mut request = request;
        if link != Link::Udp && sip::header(&request.headers, "Contact").is_some() {
            // The NOTIFYs come back on the transport the SUBSCRIBE left on
            // (flows' module docs): the Contact names that listener.
            sip::set_header(&mut request.headers, "Contact", format!("<{contact}>"));
        }
        let timeout = timeout.unwrap_or(msr_shared::sip::transaction::TIMER_F);
        self.transactions
            .send_on(now, id, to, request, timeout, link)
            .map_err(NotSent::from)
    }
}

/// The methods the collector's SIP listener serves: the `Allow` of its
/// answers to OPTIONS, to methods it does not serve and to extension
/// methods (RFC 3261 §11.2, §21.4.6, §21.5.2).
pub const ALLOW: &str = "REGISTER, NOTIFY, OPTIONS";

/// `Allow` of the collector's answers to OPTIONS and to methods it does
/// not serve (RFC 3261 §11.2, §21.4.6).
fn allow(mut response: sip::Response) -> sip::Response {
    sip::push_header(&mut response.headers, "Allow", ALLOW);
    response
}
