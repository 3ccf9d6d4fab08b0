//! The UAS side of the notifier (RFC 6665 §4.2.1, SPEC §4): every incoming
//! request answered at once — a SUBSCRIBE judged first by who sent it and
//! where its NOTIFYs would go (403 before any state is touched), then
//! given a slot and a dialog, refreshed or ended; OPTIONS with `Allow`,
//! anything else 405 or 481 — and the NOTIFYs RFC 6665 requires after a
//! SUBSCRIBE queued at once.

use std::net::{IpAddr, SocketAddr};

use msr_shared::event_package::{CONTENT_TYPE, EVENT};
use msr_shared::sip::{self, Method, Request, Response, StatusCode, TerminationReason};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::*;

impl Notifier {
    /// Answers an incoming request from `source` (the address it came
    /// from, as the socket saw it; `None` if the transport did not say);
    /// `None` for ACK (never answered).
    pub fn handle_request(
        &mut self,
        now: Instant,
        source: Option<SocketAddr>,
        request: &Request,
    ) -> Option<Response> {
        let stranger = source.is_some_and(|s| !self.is_subscriber(s.ip()));
        if stranger
            && request.method != Method::Ack
            && !self
                .strangers
                .take(now, STRANGER_ANSWERS_PER_SEC, STRANGER_ANSWER_BURST)
        {
            warn!(
                target: msr_shared::logging::NETWORK,
                source = %source.map_or_else(|| "unknown".to_owned(), |s| s.to_string()),
                method = %request.method,
                "request from a host that may not subscribe dropped unanswered: over {STRANGER_ANSWERS_PER_SEC} answers/s"
            );
            return None;
        }
        // SPEC §16: a request no daemon may act on (RFC 3261 §8.2, the
        // cases RFC 4475 tests), answered as the collector's ports answer.
        if let Some(refusal) = sip::request_refusal(request, super::ALLOW) {
            if request.method == Method::Ack {
                return None;
            }
            debug!(
                target: msr_shared::logging::NETWORK,
                source = %source.map_or_else(|| "unknown".to_owned(), |s| s.to_string()),
                status = %refusal.status,
                why = refusal.why,
                "request refused"
            );
            return Some(finish(
                refusal.response(request, &crate::registration::user_agent()),
            ));
        }
        match request.method {
            Method::Ack => None,
            Method::Subscribe => Some(match self.refusal(source, request) {
                Some(why) => {
                    warn!(
                        target: msr_shared::logging::NETWORK,
                        source = %source.map_or_else(|| "unknown".to_owned(), |s| s.to_string()),
                        reason = why,
                        "subscribe refused: not a subscriber host"
                    );
                    finish(sip::response(
                        request,
                        StatusCode::Forbidden,
                        Some(&sip::random_token()),
                    ))
                }
                None => self.handle_subscribe(now, source, request),
            }),
            Method::Options => {
                let tag = sip::stateless_tag(&request.headers);
                let mut r = sip::options_answer(request, &tag, super::ALLOW, CONTENT_TYPE);
                sip::push_header(&mut r.headers, "Allow-Events", EVENT);
                Some(finish(r))
            }
            // RFC 3261 §9.2: a CANCEL matching no transaction is a 481;
            // this UAS runs no INVITE, so none matches.
            Method::Cancel => Some(finish(sip::response(
                request,
                StatusCode::CallTransactionDoesNotExist,
                Some(&sip::random_token()),
            ))),
            _ => {
                let to_tag = sip::header(&request.headers, "To").and_then(sip::tag);
                let status = match to_tag {
                    Some(local) => {
                        let known = dialog_key(request, &local)
                            .is_some_and(|k| self.dialogs.contains_key(&k));
                        if known {
                            StatusCode::MethodNotAllowed
                        } else {
                            StatusCode::CallTransactionDoesNotExist
                        }
                    }
                    None => StatusCode::MethodNotAllowed,
                };
                let mut r = sip::response(request, status.clone(), Some(&sip::random_token()));
                if status == StatusCode::MethodNotAllowed {
                    sip::push_header(&mut r.headers, "Allow", super::ALLOW);
                }
                Some(finish(r))
            }
        }
    }

    /// Whether `ip` is a subscriber host ([`NotifierConfig::subscribers`]).
    pub(super) fn is_subscriber(&self, ip: IpAddr) -> bool {
        self.config.subscribers.contains(&ip.to_canonical())
    }

    /// Why a SUBSCRIBE from `source` must be refused with 403, if it must:
    /// it did not come from a subscriber host, or its `Contact` (where the
    /// NOTIFYs would go) is not one. Decided before anything else, so a
    /// refused request changes nothing.
    fn refusal(&self, source: Option<SocketAddr>, request: &Request) -> Option<&'static str> {
        if !source.is_some_and(|s| self.is_subscriber(s.ip())) {
            return Some("source");
        }
        // No Contact: the 400 below. An in-dialog SUBSCRIBE without one
        // keeps the dialog's target, which passed this check.
        let contact = sip::header(&request.headers, "Contact").map(sip::addr_uri)?;
        match sip::uri_socket_addr(contact) {
            Some(target) if self.is_subscriber(target.ip()) => None,
            _ => Some("contact"),
        }
    }

    fn handle_subscribe(
        &mut self,
        now: Instant,
        source: Option<SocketAddr>,
        request: &Request,
    ) -> Response {
        let h = &request.headers;
        let reject = |status: StatusCode, why: &str| {
            debug!(%status, reason = why, "subscribe rejected");
            finish(sip::response(request, status, Some(&sip::random_token())))
        };
        let from = sip::header(h, "From");
        let remote_tag = from.and_then(sip::tag);
        let (Some(call_id), Some(from), Some(remote_tag), Some(to), Some((cseq, _))) = (
            sip::call_id(h),
            from,
            remote_tag,
            sip::header(h, "To"),
            sip::cseq(h),
        ) else {
            return reject(
                StatusCode::BadRequest,
                "missing call-id, from tag, to or cseq",
            );
        };
        let requested = match sip::header(h, "Expires") {
            None => None,
            Some(v) => match v.parse::<u32>() {
                Ok(e) => Some(e),
                Err(_) => return reject(StatusCode::BadRequest, "malformed expires"),
            },
        };
        if sip::event_package(h).as_deref() != Some(EVENT) {
            let mut r = sip::response(request, StatusCode::BadEvent, Some(&sip::random_token()));
            sip::push_header(&mut r.headers, "Allow-Events", EVENT);
            return finish(r);
        }
        if let Some(accept) = sip::header(h, "Accept") {
            let ok = accept.split(',').any(|t| {
                let t = t
                    .split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase();
                t == CONTENT_TYPE || t == "*/*" || t == "application/*"
            });
            if !ok {
                let mut r = sip::response(
                    request,
                    StatusCode::NotAcceptable,
                    Some(&sip::random_token()),
                );
                sip::push_header(&mut r.headers, "Accept", CONTENT_TYPE);
                return finish(r);
            }
        }
        let granted = requested
            .unwrap_or(DEFAULT_EXPIRES)
            .min(self.config.max_expires);

        if let Some(local_tag) = sip::tag(to) {
            // A refresh (or an unsubscribe) inside an existing dialog.
            let key = (call_id.to_owned(), local_tag.clone(), remote_tag.clone());
            let Some(&id) = self.dialogs.get(&key) else {
                return reject(StatusCode::CallTransactionDoesNotExist, "unknown dialog");
            };
            if let Some(sub) = self.subs.get_mut(&id) {
                if cseq <= sub.remote_cseq {
                    return reject(StatusCode::ServerInternalError, "cseq out of order");
                }
                sub.remote_cseq = cseq;
                if let Some(target) = sip::header(h, "Contact").map(sip::addr_uri) {
                    if !target.is_empty() {
                        sub.remote_target = target.to_owned();
                    }
                }
            }
            let response = self.ok(request, None, granted);
            if granted == 0 {
                info!(subscription = %id, "subscription ended by subscriber");
                self.terminate(now, id, TerminationReason::Timeout);
            } else if let Some(sub) = self.subs.get_mut(&id) {
                sub.expires_at = now + secs(granted);
                debug!(subscription = %id, msr = %sub.msr, expires = granted, "subscription refreshed");
                self.send_active(now, id);
            }
            return response;
        }

        if self.shut_down {
            return reject(StatusCode::ServiceUnavailable, "shutting down");
        }
        let Some(target) = sip::header(h, "Contact")
            .map(sip::addr_uri)
            .filter(|t| !t.is_empty())
        else {
            return reject(StatusCode::BadRequest, "missing contact");
        };
        let msr = match sip::uri_user(&request.uri.to_string()) {
            Some(user) if self.config.accounts.contains(user) => user.to_owned(),
            None if self.config.accounts.len() == 1 => self
                .config
                .accounts
                .iter()
                .next()
                .cloned()
                .unwrap_or_default(),
            _ => return reject(StatusCode::NotFound, "unknown msr"),
        };
        let source = source.map(|s| SocketAddr::new(s.ip().to_canonical(), s.port()));
        let from_registrar = source.is_some_and(|s| self.config.registrars.contains(&s));
        // Slots (module docs): one subscription per subscriber address and
        // MSR — a new dialog from the same address replaces the old one,
        // which its subscriber forgot (a restarted collector) — and the
        // subscriptions of other addresses held to a share of their own.
        let replaced = self
            .subs
            .values()
            .find(|s| s.source == source && s.msr == msr)
            .map(|s| s.id);
        // RFC 6665 §4.2.2: the old dialog is told it ended. `deactivated`
        // (§4.1.3: moved, retry at once) is what happened; a subscriber
        // that forgot the dialog answers 481, one that did not is already
        // subscribed anew.
        if let Some(old) = replaced {
            // Any peer on an allowed host can replace its own subscription
            // at will: its line is rate limited, as "subscription created".
            if from_registrar {
                info!(
                    subscription = %old,
                    msr = %msr,
                    "subscription replaced by a new subscription from the same address"
                );
            } else {
                info!(
                    target: msr_shared::logging::NETWORK,
                    subscription = %old,
                    msr = %msr,
                    "subscription replaced by a new subscription from the same address"
                );
            }
            self.terminate(now, old, TerminationReason::Deactivated);
        }
        if !from_registrar {
            let host = source.map(|s| s.ip());
            let others = self.subs.values().filter(|s| !s.from_registrar);
            let (all, same_host) = others.fold((0, 0), |(all, same), s| {
                (
                    all + 1,
                    same + usize::from(s.source.map(|a| a.ip()) == host),
                )
            });
            let per_host = self.config.accounts.len().max(1) * SUBSCRIPTIONS_PER_HOST_PER_ACCOUNT;
            if all >= MAX_SUBSCRIPTIONS || same_host >= per_host {
                // More than a core host needs: a misbehaving or hostile
                // peer, and each subscription costs NOTIFY traffic towards
                // whatever Contact it named. A registrar never meets this.
                warn!(
                    target: msr_shared::logging::NETWORK,
                    limit = if all >= MAX_SUBSCRIPTIONS { MAX_SUBSCRIPTIONS } else { per_host },
                    from = %from,
                    source = %source.map_or_else(|| "unknown".to_owned(), |s| s.to_string()),
                    "subscription refused: too many subscriptions"
                );
                let mut r = sip::response(request, StatusCode::ServiceUnavailable, None);
                sip::push_header(&mut r.headers, "Retry-After", "60");
                return finish(r);
            }
        }
        let local_tag = sip::random_token();
        let id = SubscriptionId(self.next_id);
        self.next_id += 1;
        let sub = Subscription {
            id,
            msr: msr.clone(),
            call_id: call_id.to_owned(),
            local_tag: local_tag.clone(),
            remote_tag: remote_tag.clone(),
            local_uri: to.to_owned(),
            remote: from.to_owned(),
            remote_target: target.to_owned(),
            event: sip::header(h, "Event").unwrap_or(EVENT).to_owned(),
            local_cseq: 0,
            remote_cseq: cseq,
            expires_at: now + secs(granted),
            gate: NotifyGate::default(),
            notify_count: 0,
            source,
            from_registrar,
        };
        self.dialogs
            .insert((call_id.to_owned(), local_tag.clone(), remote_tag), id);
        self.subs.insert(id, sub);
        let response = self.ok(request, Some(&local_tag), granted);
        if granted == 0 {
            // A fetch (RFC 6665 §4.4.3): one final NOTIFY.
            self.terminate(now, id, TerminationReason::Timeout);
        } else {
            if from_registrar {
                info!(subscription = %id, %msr, call_id, subscriber = %target, expires = granted, "subscription created");
            } else {
                // Anyone on an allowed host can cause it: rate limited.
                info!(target: msr_shared::logging::NETWORK, subscription = %id, %msr, call_id, subscriber = %target, expires = granted, "subscription created");
            }
            self.send_active(now, id);
        }
        response
    }

    fn ok(&self, request: &Request, to_tag: Option<&str>, granted: u32) -> Response {
        let mut r = sip::response(request, StatusCode::OK, to_tag);
        sip::push_header(&mut r.headers, "Expires", granted.to_string());
        sip::push_header(&mut r.headers, "Contact", self.contact());
        finish(r)
    }
}
