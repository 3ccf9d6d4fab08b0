//! The SUBSCRIBEs a [`Subscriber`] sends (initial, refresh, `Expires: 0`)
//! and their final responses or failures (RFC 6665 §4.1.2, §4.1.2.1):
//! grants, refusals with their backoff, `423` with its `Min-Expires`.

use super::*;

impl Subscriber {
    /// Queues a SUBSCRIBE in `dialog` (bumping its CSeq in the stored dialog)
    /// and returns its id; `None` when no request could be built from the
    /// dialog's target (not queued).
    pub(super) fn send(
        &mut self,
        now: Instant,
        msr: &MsrName,
        mut dialog: Dialog,
        kind: Kind,
        expires: u32,
    ) -> Option<RequestId> {
        dialog.cseq += 1;
        if let Some(d) = self.subs.get_mut(msr).and_then(|s| s.dialog.as_mut()) {
            if d.call_id == dialog.call_id {
                d.cseq = dialog.cseq;
                d.peer = sip::uri_socket_addr(&dialog.remote_target);
            }
        }
        let to = match &dialog.remote_tag {
            Some(t) => format!("<{}>;tag={t}", dialog.remote_uri),
            None => format!("<{}>", dialog.remote_uri),
        };
        let headers = vec![
            (
                "From",
                format!("<{}>;tag={}", self.config.local_uri, dialog.local_tag),
            ),
            ("To", to),
            ("Call-ID", dialog.call_id.clone()),
            ("CSeq", format!("{} SUBSCRIBE", dialog.cseq)),
            ("Contact", format!("<{}>", self.config.contact)),
            ("Event", EVENT.to_owned()),
            ("Accept", CONTENT_TYPE.to_owned()),
            ("Expires", expires.to_string()),
        ];
        let id = RequestId(self.next_id);
        self.next_id += 1;
        match sip::request(
            Method::Subscribe,
            &dialog.remote_target,
            headers,
            Vec::new(),
        ) {
            Ok(request) => {
                self.pending.insert(
                    id,
                    PendingRequest {
                        msr: msr.clone(),
                        call_id: dialog.call_id.clone(),
                        kind,
                        requested: expires,
                        awaited: false,
                    },
                );
                self.transmits.push_back(Transmit {
                    id,
                    msr: msr.clone(),
                    call_id: dialog.call_id,
                    request,
                });
                Some(id)
            }
            Err(_) => {
                // The registrar only keeps parseable contact URIs, so this is
                // a target learnt from a peer's Contact: treat it as a failure.
                if kind != Kind::Unsubscribe {
                    self.fail(now, msr, &dialog.call_id, RetryCause::BadTarget);
                }
                None
            }
        }
    }

    /// The final response to the request sent as `id`.
    pub fn handle_response(&mut self, now: Instant, id: RequestId, response: &Response) {
        let Some(p) = self.pending.remove(&id) else {
            return;
        };
        if p.kind == Kind::Unsubscribe {
            // Refused (481, or any other failure): no final NOTIFY follows.
            if !(200..300).contains(&response.status_code.code()) {
                self.forget_ended(&p.call_id);
            }
            return;
        }
        let msr = p.msr.clone();
        self.on_response(now, p, response);
        self.touched(&msr);
    }

    pub(super) fn on_response(&mut self, now: Instant, p: PendingRequest, response: &Response) {
        if p.kind == Kind::Unsubscribe {
            return;
        }
        let Some(sub) = self.subs.get_mut(&p.msr) else {
            return;
        };
        let Some(dialog) = sub.dialog.as_mut().filter(|d| d.call_id == p.call_id) else {
            return;
        };
        let code = response.status_code.code();
        if (200..300).contains(&code) {
            let granted = sip::expires(&response.headers).unwrap_or(p.requested);
            if granted == 0 {
                let call_id = p.call_id.clone();
                self.fail(now, &p.msr, &call_id, RetryCause::GrantedZero);
                return;
            }
            if dialog.remote_tag.is_none() {
                dialog.remote_tag = sip::header(&response.headers, "To").and_then(sip::tag);
            }
            if let Some(contact) = sip::header(&response.headers, "Contact") {
                dialog.remote_target = sip::addr_uri(contact).to_owned();
            }
            sub.expires = granted;
            sub.expires_at = Some(now + Duration::from_secs(u64::from(granted)));
            sub.refresh_at = Some(now + refresh_delay(granted));
            sub.backoff.reset();
            let call_id = dialog.call_id.clone();
            let event = if p.kind == Kind::Initial {
                sub.state = SubscriptionState::Active;
                SubscriberEvent::Active {
                    msr: p.msr.clone(),
                    call_id,
                    contact: sub
                        .target
                        .as_ref()
                        .map(|t| t.name.to_string())
                        .unwrap_or_default(),
                    expires: granted,
                }
            } else {
                SubscriberEvent::Refreshed {
                    msr: p.msr.clone(),
                    call_id,
                    expires: granted,
                }
            };
            self.events.push_back(event);
            return;
        }
        if code == 423 {
            let min =
                sip::header(&response.headers, "Min-Expires").and_then(|v| v.parse::<u32>().ok());
            if let Some(min) = min.filter(|m| *m > p.requested) {
                sub.expires_floor = min;
                match p.kind {
                    Kind::Initial => self.start(now, &p.msr),
                    _ => {
                        let dialog = dialog.clone();
                        let expires = self.requested_expires(&p.msr);
                        self.send(now, &p.msr, dialog, Kind::Refresh, expires);
                    }
                }
                return;
            }
        }
        self.fail(now, &p.msr, &p.call_id, RetryCause::Status(code));
    }

    /// The request sent as `id` ended without a final response (a timeout,
    /// or a transport failure): handled like a `408`.
    pub fn handle_failure(&mut self, now: Instant, id: RequestId, cause: RetryCause) {
        let Some(p) = self.pending.remove(&id) else {
            return;
        };
        if p.kind == Kind::Unsubscribe {
            // Never reached the notifier (or no answer): no final NOTIFY.
            self.forget_ended(&p.call_id);
            return;
        }
        let current = self
            .subs
            .get(&p.msr)
            .and_then(|s| s.dialog.as_ref())
            .is_some_and(|d| d.call_id == p.call_id);
        if current {
            self.fail(now, &p.msr, &p.call_id, cause);
            self.touched(&p.msr);
        }
    }

    /// Drops the dialog and schedules a new one after the backoff.
    pub(super) fn fail(&mut self, now: Instant, msr: &MsrName, call_id: &str, cause: RetryCause) {
        self.drop_dialog(msr);
        let Some(sub) = self.subs.get_mut(msr) else {
            return;
        };
        sub.state = SubscriptionState::Failed;
        sub.expires_at = None;
        sub.refresh_at = None;
        let delay = sub.backoff.next_delay();
        sub.retry_at = Some(now + delay);
        self.events.push_back(SubscriberEvent::Retrying {
            msr: msr.clone(),
            call_id: call_id.to_owned(),
            cause,
            delay,
        });
    }
}
