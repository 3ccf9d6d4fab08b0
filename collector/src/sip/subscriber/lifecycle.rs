//! Where a [`Subscriber`]'s subscriptions go and when they start and end:
//! the MSR's registered contacts as the registrar holds them (SPEC §3, §4),
//! an agent that restarted, and our `Expires: 0` with the ended dialogs
//! kept for their final NOTIFY (RFC 6665 §4.1.2.3, §4.4.1; the parent
//! module's docs), shutdown's included.

use super::*;

impl Subscriber {
    /// The registered contacts of `msr` are now `bindings` (none: the MSR
    /// has no registered contact left), as the registrar holds them.
    ///
    /// * First contacts: subscribe.
    /// * No contacts left: end the subscription (`Expires: 0`).
    /// * The subscribed contact went away: subscribe anew to another one.
    /// * A contact that was not registered before lifts the no-retry state
    ///   left by `rejected`/`noresource`/`invariant`.
    pub fn contacts_changed<'b>(
        &mut self,
        now: Instant,
        msr: &str,
        bindings: impl IntoIterator<Item = &'b Binding>,
    ) {
        let mut contacts: Vec<&Binding> = bindings.into_iter().collect();
        contacts.sort_by(|a, b| a.contact.cmp(&b.contact));
        contacts.dedup_by(|a, b| a.contact == b.contact);
        let Some(first) = contacts.first().copied() else {
            if let Some((msr, sub)) = self.subs.remove_entry(msr) {
                self.forget(&msr, Some(&sub));
                let call_id = sub.dialog.as_ref().map(|d| d.call_id.clone());
                if let Some(dialog) = sub.dialog {
                    self.unsubscribe(now, &msr, dialog, false);
                }
                self.events
                    .push_back(SubscriberEvent::Ended { msr, call_id });
            }
            return;
        };
        // The bindings' own name: validated by the registrar.
        let msr = &first.msr;
        let names = || contacts.iter().map(|c| c.contact.clone()).collect();
        let Some(sub) = self.subs.get_mut(msr) else {
            let sub = Subscription::new(names(), Target::of(first));
            self.subs.insert(msr.clone(), sub);
            self.start(now, msr);
            self.touched(msr);
            return;
        };
        if contacts
            .iter()
            .any(|c| sub.contacts.binary_search(&c.contact).is_err())
        {
            sub.blocked = false;
        }
        // A refresh changes nothing here: no allocation then.
        if !sub.contacts.iter().eq(contacts.iter().map(|c| &c.contact)) {
            sub.contacts = names();
        }
        if !sub.first.is(first) {
            sub.first = Target::of(first);
        }
        let target_gone = sub
            .target
            .as_ref()
            .is_some_and(|t| !contacts.iter().any(|c| t.is(c)));
        if target_gone {
            // The contact the dialog is with is gone: nothing to unsubscribe from.
            sub.backoff.reset();
            self.drop_dialog(msr);
            self.start(now, msr);
        } else if sub.dialog.is_none() && sub.retry_at.is_none() && !sub.blocked {
            self.start(now, msr);
        }
        self.touched(msr);
    }

    /// `contact` of `msr` registered again with a new Call-ID: the agent
    /// restarted (SPEC §3) and forgot every dialog it had. A dialog with
    /// that contact is dead: it is dropped without an unsubscribe (nobody
    /// would answer it) and a new one starts at once, as it does when the
    /// subscription has no live dialog (a retry waiting out its backoff
    /// after the agent died); the no-retry state of `rejected`/`noresource`
    /// is lifted, as for a contact that registers anew. A dialog with
    /// another contact of the MSR is left alone.
    pub fn contact_restarted(&mut self, now: Instant, msr: &str, contact: &str) {
        // The subscription's own key (a shared name, no allocation).
        let Some(msr) = self.subs.get_key_value(msr).map(|(key, _)| key.clone()) else {
            return;
        };
        let msr = &msr;
        let Some(sub) = self.subs.get_mut(msr) else {
            return;
        };
        sub.blocked = false;
        let with_it = sub.target.as_ref().is_some_and(|t| t.name == contact);
        if with_it || sub.dialog.is_none() {
            sub.backoff.reset();
            self.drop_dialog(msr);
            self.start(now, msr);
        }
        self.touched(msr);
    }

    /// Ends `dialog` (no longer a subscription's) with `Expires: 0` and keeps
    /// it as an ended dialog for its final NOTIFY; returns the request's id.
    /// A dialog without the notifier's tag (no answer yet) gets nothing.
    pub(super) fn unsubscribe(
        &mut self,
        now: Instant,
        msr: &MsrName,
        dialog: Dialog,
        awaited: bool,
    ) -> Option<RequestId> {
        let remote_tag = dialog.remote_tag.clone()?;
        let call_id = dialog.call_id.clone();
        let local_tag = dialog.local_tag.clone();
        let peer = sip::uri_socket_addr(&dialog.remote_target);
        // `send` stores the CSeq only in live subscriptions; the dialog is sent as-is.
        let id = self.send(now, msr, dialog, Kind::Unsubscribe, 0)?;
        if let Some(p) = self.pending.get_mut(&id) {
            p.awaited = awaited;
        }
        let deadline = now + FINAL_NOTIFY_WAIT;
        self.forget_ended(&call_id);
        self.ended_timers.insert((deadline, call_id.clone()));
        self.ended.insert(
            call_id,
            EndedDialog {
                local_tag,
                remote_tag,
                peer,
                deadline,
                awaited,
            },
        );
        Some(id)
    }

    /// Drops the ended dialog `call_id` and its deadline, if it is known.
    pub(super) fn forget_ended(&mut self, call_id: &str) {
        if let Some(e) = self.ended.remove(call_id) {
            self.ended_timers.remove(&(e.deadline, call_id.to_owned()));
        }
    }

    /// Begins a new dialog with the first registered contact of `msr`.
    pub(super) fn start(&mut self, now: Instant, msr: &MsrName) {
        let expires = self.requested_expires(msr);
        let Some(sub) = self.subs.get_mut(msr) else {
            return;
        };
        let target = sub.first.clone();
        let dialog = Dialog {
            call_id: format!("{}@msr-collector", sip::random_token()),
            local_tag: sip::random_token(),
            remote_tag: None,
            remote_target: target.uri.clone(),
            remote_uri: target.uri.clone(),
            peer: sip::uri_socket_addr(&target.uri),
            cseq: 0,
            remote_cseq: None,
            recent: VecDeque::new(),
        };
        sub.target = Some(target);
        if let Some(old) = sub.dialog.replace(dialog.clone()) {
            self.unindex_dialog(&old.call_id, msr);
        }
        self.dialogs.insert(dialog.call_id.clone(), msr.clone());
        let Some(sub) = self.subs.get_mut(msr) else {
            return;
        };
        sub.state = SubscriptionState::Pending;
        sub.expires = expires;
        sub.expires_at = None;
        sub.refresh_at = None;
        sub.retry_at = None;
        sub.notify_count = 0;
        sub.event_id = sip::random_token();
        self.send(now, msr, dialog, Kind::Initial, expires);
    }

    pub(super) fn requested_expires(&self, msr: &MsrName) -> u32 {
        let configured = self
            .overrides
            .get(msr)
            .copied()
            .unwrap_or(self.config.default_expires);
        let floor = self.subs.get(msr).map_or(0, |s| s.expires_floor);
        configured.max(floor)
    }

    /// Ends every subscription with `Expires: 0` (shutdown) and returns how
    /// many unsubscribes were queued; their answers are awaited via
    /// [`awaited_unsubscribes`](Self::awaited_unsubscribes), and the final
    /// NOTIFYs that follow them via
    /// [`awaited_final_notifies`](Self::awaited_final_notifies). A
    /// subscription whose dialog is not established (no answer yet) gets
    /// none.
    pub fn shutdown(&mut self, now: Instant) -> usize {
        let subs = std::mem::take(&mut self.subs);
        self.timers.clear();
        self.dialogs.clear();
        self.dirty.clear();
        let mut sent = 0;
        for (msr, sub) in subs {
            if let Some(dialog) = sub.dialog {
                if self.unsubscribe(now, &msr, dialog, true).is_some() {
                    sent += 1;
                }
            }
        }
        sent
    }

    /// The unsubscribes queued by [`shutdown`](Self::shutdown) that have no
    /// final response (nor failure) yet: at most what it returned.
    ///
    /// An unsubscribe sent earlier, when an MSR unregistered, is not
    /// counted: its subscription is already gone, its answer changes
    /// nothing, and the MSR has usually stopped (its transaction would only
    /// end at Timer F, 32 s later).
    pub fn awaited_unsubscribes(&self) -> usize {
        self.pending.values().filter(|p| p.awaited).count()
    }

    /// The dialogs ended by [`shutdown`](Self::shutdown) whose final NOTIFY
    /// has not arrived, while their unsubscribe is unanswered or was
    /// accepted (a refused or failed one expects no NOTIFY): at most what
    /// it returned. Like [`awaited_unsubscribes`](Self::awaited_unsubscribes),
    /// dialogs ended earlier are not counted.
    pub fn awaited_final_notifies(&self) -> usize {
        self.ended.values().filter(|e| e.awaited).count()
    }
}
