//! The NOTIFYs a [`Subscriber`] receives (RFC 6665 §4.1.3, SPEC §4): the
//! dialog they belong to, their source, retransmissions, the state they
//! carry and the load report in their body.

use super::*;

impl Subscriber {
    /// Handles a NOTIFY received at `now` from `source` (the address it
    /// came from, as the socket saw it; `unix_now`: the wall clock in
    /// seconds, shown by `subscription list`) and returns the answer:
    /// `200`; `481` outside a dialog we created and `403` from another
    /// address than the dialog's peer (nothing changes, module docs); `489`
    /// for another event package; `400` for a missing `Subscription-State`
    /// or an unreadable body (the last good load stays).
    pub fn handle_notify(
        &mut self,
        now: Instant,
        unix_now: i64,
        source: Option<SocketAddr>,
        req: &Request,
    ) -> Response {
        let respond = |status| sip::response(req, status, None);
        let call_id = sip::call_id(&req.headers).unwrap_or_default();
        let to_tag = sip::header(&req.headers, "To").and_then(sip::tag);
        let from_tag = sip::header(&req.headers, "From").and_then(sip::tag);
        let (Some(to_tag), Some(from_tag)) = (to_tag, from_tag) else {
            return respond(StatusCode::CallTransactionDoesNotExist);
        };
        let Some(msr) = self.dialogs.get(call_id).cloned() else {
            return self.on_ended_notify(req, source, call_id, &to_tag, &from_tag);
        };
        let dialog = self
            .subs
            .get(&msr)
            .and_then(|s| s.dialog.as_ref())
            .filter(|d| {
                d.call_id == call_id
                    && d.local_tag == to_tag
                    && d.remote_tag.as_ref().is_none_or(|r| *r == from_tag)
            });
        let Some(dialog) = dialog else {
            return respond(StatusCode::CallTransactionDoesNotExist);
        };
        if !from_peer(dialog.peer, source) {
            return respond(StatusCode::Forbidden);
        }
        let response = self.on_notify(now, unix_now, req, &msr, from_tag);
        self.touched(&msr);
        response
    }

    /// [`handle_notify`](Self::handle_notify) for a NOTIFY outside every
    /// live dialog: `200` in a dialog we ended (module docs), which is
    /// forgotten once its `terminated` NOTIFY is in; else `481`. Nothing
    /// else changes.
    pub(super) fn on_ended_notify(
        &mut self,
        req: &Request,
        source: Option<SocketAddr>,
        call_id: &str,
        to_tag: &str,
        from_tag: &str,
    ) -> Response {
        let respond = |status| sip::response(req, status, None);
        let ended = self
            .ended
            .get(call_id)
            .filter(|e| e.local_tag == to_tag && e.remote_tag == from_tag);
        let Some(ended) = ended else {
            return respond(StatusCode::CallTransactionDoesNotExist);
        };
        if !from_peer(ended.peer, source) {
            return respond(StatusCode::Forbidden);
        }
        if sip::event_package(&req.headers).as_deref() != Some(EVENT) {
            let mut resp = respond(StatusCode::BadEvent);
            sip::push_header(&mut resp.headers, "Allow-Events", EVENT);
            return resp;
        }
        let Some(state) = sip::header(&req.headers, "Subscription-State")
            .and_then(SubscriptionStateHeader::parse)
        else {
            return respond(StatusCode::BadRequest);
        };
        // An `active` one was sent before the notifier saw the unsubscribe;
        // the `terminated` one is the last.
        if state.state == SubState::Terminated {
            self.forget_ended(call_id);
        }
        respond(StatusCode::OK)
    }

    /// [`handle_notify`](Self::handle_notify) for a NOTIFY known to be in
    /// the dialog of `msr`'s subscription.
    pub(super) fn on_notify(
        &mut self,
        now: Instant,
        unix_now: i64,
        req: &Request,
        msr: &MsrName,
        from_tag: String,
    ) -> Response {
        let respond = |status| sip::response(req, status, None);
        if sip::event_package(&req.headers).as_deref() != Some(EVENT) {
            let mut resp = respond(StatusCode::BadEvent);
            sip::push_header(&mut resp.headers, "Allow-Events", EVENT);
            return resp;
        }
        let Some((cseq, _)) = sip::cseq(&req.headers) else {
            return respond(StatusCode::BadRequest);
        };
        let branch = sip::header(&req.headers, "Via").and_then(|v| sip::param(v, "branch"));
        let Some(sub) = self.subs.get_mut(msr) else {
            return respond(StatusCode::CallTransactionDoesNotExist);
        };
        let Some(dialog) = sub.dialog.as_mut() else {
            return respond(StatusCode::CallTransactionDoesNotExist);
        };
        // A retransmission of a NOTIFY already applied: its answer again,
        // as a server transaction would give it (RFC 3261 §8.2.7).
        let branch = branch.as_deref().map(branch_hash);
        if let Some(branch) = branch {
            if dialog
                .recent
                .iter()
                .any(|(c, b)| *c == cseq && *b == branch)
            {
                return respond(StatusCode::OK);
            }
        }
        // RFC 3261 §12.2.2: a CSeq not above the last accepted one is out of order.
        if dialog.remote_cseq.is_some_and(|last| cseq <= last) {
            return respond(StatusCode::ServerInternalError);
        }
        let Some(state) = sip::header(&req.headers, "Subscription-State")
            .and_then(SubscriptionStateHeader::parse)
        else {
            return respond(StatusCode::BadRequest);
        };
        let report = if req.body.iter().all(u8::is_ascii_whitespace) {
            None
        } else {
            match LoadReport::decode(&req.body) {
                Ok(r) => Some(r),
                Err(_) => return respond(StatusCode::BadRequest),
            }
        };
        dialog.remote_cseq = Some(cseq);
        if let Some(branch) = branch {
            if dialog.recent.len() == RECENT_NOTIFIES {
                dialog.recent.pop_front();
            }
            dialog.recent.push_back((cseq, branch));
        }
        // RFC 6665 §4.1.2.4: a NOTIFY may arrive before the 2xx; it fixes the dialog.
        if dialog.remote_tag.is_none() {
            dialog.remote_tag = Some(from_tag);
        }
        if let Some(contact) = sip::header(&req.headers, "Contact") {
            dialog.remote_target = sip::addr_uri(contact).to_owned();
        }
        let call_id = dialog.call_id.clone();
        sub.notify_count += 1;
        sub.last_notify_unix = Some(unix_now);
        if let Some(report) = report {
            self.events.push_back(SubscriberEvent::Load {
                msr: msr.clone(),
                report,
                at: now,
            });
        }
        match state.state {
            SubState::Active | SubState::Pending => {
                if let Some(e) = state.expires {
                    let at = now + Duration::from_secs(u64::from(e));
                    if sub.expires_at.is_none_or(|old| at < old)
                        && sub.state == SubscriptionState::Active
                    {
                        sub.expires_at = Some(at);
                        let refresh = now + refresh_delay(e);
                        sub.refresh_at = Some(sub.refresh_at.map_or(refresh, |r| r.min(refresh)));
                    }
                }
            }
            SubState::Terminated => {
                let reason = state.reason;
                sub.expires_at = None;
                sub.refresh_at = None;
                sub.state = SubscriptionState::Terminated(reason.clone());
                let retry_at = if reason.as_ref().is_none_or(|r| r.may_retry()) {
                    let wait = Duration::from_secs(u64::from(state.retry_after.unwrap_or(0)));
                    Some(now + wait)
                } else {
                    sub.blocked = true;
                    None
                };
                sub.retry_at = retry_at;
                self.drop_dialog(msr);
                self.events.push_back(SubscriberEvent::Terminated {
                    msr: msr.clone(),
                    call_id,
                    reason,
                    retry_at,
                });
            }
        }
        respond(StatusCode::OK)
    }
}
