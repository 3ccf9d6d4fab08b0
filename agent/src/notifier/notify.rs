//! The NOTIFYs (RFC 6665 §4.2.2, SPEC §4): when a load update is worth one
//! ([`NotifyRule`] through each subscription's [`NotifyGate`]), the
//! `active` and `terminated` ones, and how a subscription leaves (its
//! final NOTIFY tracked until answered, or dropped without one).

use msr_shared::sip::{SubscriptionStateHeader, TerminationReason};
use tokio::time::Instant;
use tracing::info;

use super::*;

impl Notifier {
    pub(super) fn contact(&self) -> String {
        format!("<sip:{}>", self.config.contact_host_port)
    }

    /// The rule of SPEC §4 from the config.
    pub(super) fn rule(&self) -> NotifyRule {
        NotifyRule {
            load_delta: self.config.load_delta,
            high_water: self.config.high_water,
            min_interval: self.config.notify_min_interval,
            top_interval: self.config.notify_top_interval,
        }
    }

    /// Sends the latest sample now, holds it for the end of the window, or
    /// clears a held change that no longer matters ([`NotifyGate`]).
    pub(super) fn evaluate(&mut self, now: Instant, id: SubscriptionId) {
        let rule = self.rule();
        let latest = reported(&self.latest);
        let Some(sub) = self.subs.get_mut(&id) else {
            return;
        };
        if sub.gate.evaluate(&rule, now, latest) == Verdict::Send {
            self.send_active(now, id);
        }
    }

    pub(super) fn send_active(&mut self, now: Instant, id: SubscriptionId) {
        let Some(sub) = self.subs.get(&id) else {
            return;
        };
        let remaining = sub.expires_at.saturating_duration_since(now);
        // Round up so a subscriber never sees 0 while the subscription lives.
        let remaining = u32::try_from(remaining.as_millis().div_ceil(1000)).unwrap_or(u32::MAX);
        self.send_notify(now, id, SubscriptionStateHeader::active(remaining));
    }

    pub(super) fn terminate(
        &mut self,
        now: Instant,
        id: SubscriptionId,
        reason: TerminationReason,
    ) {
        if let Some(sub) = self.subs.get(&id) {
            if sub.from_registrar {
                info!(subscription = %id, msr = %sub.msr, call_id = %sub.call_id, %reason, "subscription terminated");
            } else {
                info!(target: msr_shared::logging::NETWORK, subscription = %id, msr = %sub.msr, call_id = %sub.call_id, %reason, "subscription terminated");
            }
        }
        self.send_notify(now, id, SubscriptionStateHeader::terminated(reason));
        // `send_notify` removes the subscription when the NOTIFY cannot be
        // built; then there is nothing to wait for.
        if let Some(sub) = self.subs.get(&id) {
            self.finals.insert(id, sub.local_cseq);
        }
        self.remove(id);
    }

    pub(super) fn drop_subscription(&mut self, id: SubscriptionId, reason: &str) {
        if let Some(sub) = self.subs.get(&id) {
            if sub.from_registrar {
                info!(subscription = %id, msr = %sub.msr, call_id = %sub.call_id, %reason, "subscription dropped");
            } else {
                info!(target: msr_shared::logging::NETWORK, subscription = %id, msr = %sub.msr, call_id = %sub.call_id, %reason, "subscription dropped");
            }
            self.remove(id);
        }
    }

    fn remove(&mut self, id: SubscriptionId) {
        if let Some(sub) = self.subs.remove(&id) {
            self.dialogs
                .remove(&(sub.call_id, sub.local_tag, sub.remote_tag));
        }
    }

    fn send_notify(&mut self, now: Instant, id: SubscriptionId, state: SubscriptionStateHeader) {
        let contact = self.contact();
        let latest = self.latest;
        let Some(sub) = self.subs.get_mut(&id) else {
            return;
        };
        sub.local_cseq += 1;
        let body = LoadReport {
            msr: sub.msr.clone(),
            load: latest.load,
            cpu: latest.cpu,
            calls: latest.calls,
            max_calls: latest.max_calls,
            engine: self.engine,
            service: self.service,
            codecs: self.config.codecs,
            // How old the sample is (SPEC §10): the collector dates the
            // `calls` it carries by it.
            sample_age_ms: self.latest_at.map(|at| {
                u32::try_from(now.saturating_duration_since(at).as_millis()).unwrap_or(u32::MAX)
            }),
        }
        .encode()
        .into_bytes();
        let headers = vec![
            ("From", format!("{};tag={}", sub.local_uri, sub.local_tag)),
            ("To", sub.remote.clone()),
            ("Call-ID", sub.call_id.clone()),
            ("CSeq", format!("{} NOTIFY", sub.local_cseq)),
            ("Contact", contact),
            ("Event", sub.event.clone()),
            ("Subscription-State", state.to_string()),
            ("User-Agent", crate::registration::user_agent()),
        ];
        match sip::request(Method::Notify, &sub.remote_target, headers, Vec::new()) {
            Ok(mut request) => {
                let Request {
                    headers,
                    body: slot,
                    ..
                } = &mut request;
                sip::set_body(headers, slot, CONTENT_TYPE, body);
                sub.gate.sent(now, reported(&latest));
                sub.notify_count += 1;
                debug!(subscription = %id, state = %state, load = latest.load, "notify");
                self.transmit.push_back(NotifyTransmit {
                    subscription: id,
                    cseq: sub.local_cseq,
                    request,
                });
            }
            Err(e) => {
                warn!(subscription = %id, target = %sub.remote_target, error = %e, "cannot build notify, dropping subscription");
                self.remove(id);
            }
        }
    }
}
