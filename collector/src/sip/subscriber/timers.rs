//! A [`Subscriber`]'s deadlines: the refreshes, retries and expiries due
//! (RFC 6665 §4.1.2.1, SPEC §4) and the ended dialogs whose final NOTIFY
//! did not come in [`FINAL_NOTIFY_WAIT`]. The ordered deadline sets keep
//! the wake-up O(1) and visit only the due entries (the parent module's
//! cost notes).

use super::*;

impl Subscriber {
    /// Sends due refreshes and retries; treats an unrefreshed expiry as a
    /// failure (new dialog).
    pub fn handle_timeout(&mut self, now: Instant) {
        // Only the due subscriptions; each is handled once per call (one
        // that is still due afterwards shows in `poll_timeout` at once).
        let mut due = Vec::new();
        while let Some((at, _)) = self.timers.first() {
            if *at > now {
                break;
            }
            let Some((_, msr)) = self.timers.pop_first() else {
                break;
            };
            if let Some(sub) = self.subs.get_mut(&msr) {
                sub.armed = None;
            }
            due.push(msr);
        }
        for msr in due {
            self.timeout_one(now, &msr);
            self.touched(&msr);
        }
        // Ended dialogs whose final NOTIFY did not come in time.
        while let Some((at, _)) = self.ended_timers.first() {
            if *at > now {
                break;
            }
            if let Some((_, call_id)) = self.ended_timers.pop_first() {
                self.ended.remove(&call_id);
            }
        }
    }

    fn timeout_one(&mut self, now: Instant, msr: &MsrName) {
        let Some(sub) = self.subs.get_mut(msr) else {
            return;
        };
        if sub.retry_at.is_some_and(|t| t <= now) {
            sub.retry_at = None;
            if !sub.blocked {
                self.start(now, msr);
            }
            return;
        }
        if sub.expires_at.is_some_and(|t| t <= now) {
            let call_id = sub
                .dialog
                .as_ref()
                .map(|d| d.call_id.clone())
                .unwrap_or_default();
            self.fail(now, msr, &call_id, RetryCause::Expired);
            return;
        }
        if sub.refresh_at.is_some_and(|t| t <= now) {
            sub.refresh_at = None;
            if let Some(dialog) = sub.dialog.clone() {
                let expires = self.requested_expires(msr);
                self.send(now, msr, dialog, Kind::Refresh, expires);
            }
        }
    }

    /// The next instant [`handle_timeout`](Self::handle_timeout) has work:
    /// the first entry of the deadline sets, O(1).
    pub fn poll_timeout(&self) -> Option<Instant> {
        let subs = self.timers.first().map(|(at, _)| *at);
        let ended = self.ended_timers.first().map(|(at, _)| *at);
        subs.into_iter().chain(ended).min()
    }

    /// [`poll_timeout`](Self::poll_timeout) computed by a full scan, to
    /// check the deadline set against.
    #[cfg(test)]
    pub(super) fn scan_timeout(&self) -> Option<Instant> {
        self.subs
            .values()
            .filter_map(Subscription::next_deadline)
            .chain(self.ended.values().map(|e| e.deadline))
            .min()
    }
}
