//! The releases that found no live leg (SPEC §9): such a release may have
//! overtaken its own select, so its key is remembered for
//! [`EARLY_RELEASE_MEMORY`] and a select for it in that time places
//! nothing. At most [`MAX_EARLY_RELEASES`] are kept, the oldest forgotten
//! first, so a client releasing random keys cannot exhaust memory.

use tokio::time::Instant;

use super::{LegKey, LegTable, EARLY_RELEASE_MEMORY, MAX_EARLY_RELEASES};

impl LegTable {
    /// When leg `key` was released before it was placed, if that was less
    /// than [`EARLY_RELEASE_MEMORY`] before `now` (SPEC §9: a select for it
    /// places nothing). A release without a label covers every leg of its
    /// Call-ID.
    pub fn released_early(&self, now: Instant, key: LegKey<'_>) -> Option<Instant> {
        self.early
            .get(key.call_id)?
            .iter()
            .filter(|(label, _)| label.is_none() || label.as_deref() == key.leg)
            .map(|&(_, at)| at)
            .find(|&at| now < at + EARLY_RELEASE_MEMORY)
    }

    /// Early releases remembered (some possibly past their time, until the
    /// next release or timeout forgets them), for tests.
    pub fn early_releases(&self) -> usize {
        self.early_len
    }

    /// Remembers a release that ended nothing; a repeated one keeps its
    /// first time (so each key is queued once and the queue stays bounded).
    pub(super) fn remember_early(&mut self, now: Instant, call_id: &str, leg: Option<&str>) {
        self.forget_early(now);
        if let Some(labels) = self.early.get(call_id) {
            if labels.iter().any(|(label, _)| label.as_deref() == leg) {
                return;
            }
        }
        while self.early_len >= MAX_EARLY_RELEASES {
            if !self.forget_oldest_early() {
                break;
            }
        }
        self.early
            .entry(call_id.into())
            .or_default()
            .push((leg.map(Into::into), now));
        self.early_order.push_back((now, call_id.into()));
        self.early_len += 1;
    }

    /// Forgets the early releases whose memory ended at `now`.
    pub(super) fn forget_early(&mut self, now: Instant) {
        while self
            .early_order
            .front()
            .is_some_and(|&(at, _)| now >= at + EARLY_RELEASE_MEMORY)
        {
            self.forget_oldest_early();
        }
    }

    /// Forgets the oldest early release; false when none is left.
    pub(super) fn forget_oldest_early(&mut self) -> bool {
        let Some((at, call_id)) = self.early_order.pop_front() else {
            return false;
        };
        if let Some(labels) = self.early.get_mut(&call_id) {
            // The oldest of this Call-ID's labels is the first queued.
            if let Some(i) = labels.iter().position(|&(_, t)| t == at) {
                labels.remove(i);
                self.early_len = self.early_len.saturating_sub(1);
            }
            if labels.is_empty() {
                self.early.remove(&call_id);
            }
        }
        true
    }
}
