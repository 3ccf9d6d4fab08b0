//! The core's releases of live legs (SPEC §14): a failover request for a
//! leg the core released a moment before (the release sent on one
//! connection, the failover on another; a CANCEL racing the engine's
//! failure) must not place the leg anew, or nothing would release it
//! before its maximum duration (SPEC §9). Each such release is
//! remembered for [`EARLY_RELEASE_MEMORY`] as a 64-bit hash of its key,
//! so that remembering costs no allocation on every release; at most
//! [`MAX_RECENT_RELEASES`] are kept, the oldest forgotten first.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher as _;

use tokio::time::Instant;

use super::{LegKey, LegTable, EARLY_RELEASE_MEMORY};

/// The most recent releases remembered at once (a few MiB): 32 s of
/// releases at 4000 a second.
pub const MAX_RECENT_RELEASES: usize = 131_072;

/// The remembered releases: key hash → when, and the order they came in.
#[derive(Debug, Default)]
pub(super) struct RecentReleases {
    /// Keyed by a hash already: not hashed again with a seed.
    at: HashMap<u64, Instant, foldhash::fast::FixedState>,
    order: VecDeque<(Instant, u64)>,
}

impl LegTable {
    fn release_hash(&self, call_id: &str, leg: Option<&str>) -> u64 {
        self.hasher.hash_one((call_id, leg))
    }

    /// Remembers that the core released leg `call_id`/`leg` (with `leg`
    /// `None`, every leg of `call_id`) while it was live.
    pub fn note_core_release(&mut self, now: Instant, call_id: &str, leg: Option<&str>) {
        self.forget_recent(now);
        while self.recent.order.len() >= MAX_RECENT_RELEASES {
            self.forget_oldest_recent();
        }
        let hash = self.release_hash(call_id, leg);
        self.recent.at.insert(hash, now);
        self.recent.order.push_back((now, hash));
    }

    /// When the core released leg `key`, or every leg of its Call-ID,
    /// while it was live, if that was less than [`EARLY_RELEASE_MEMORY`]
    /// before `now`.
    pub fn released_by_core(&self, now: Instant, key: LegKey<'_>) -> Option<Instant> {
        let at = |leg: Option<&str>| {
            let hash = self.release_hash(key.call_id, leg);
            self.recent.at.get(&hash).copied()
        };
        let this_leg = key.leg.and_then(|label| at(Some(label)));
        this_leg
            .into_iter()
            .chain(at(None))
            .find(|&when| now < when + EARLY_RELEASE_MEMORY)
    }

    /// Forgets the releases whose memory ended at `now`.
    pub(super) fn forget_recent(&mut self, now: Instant) {
        while self
            .recent
            .order
            .front()
            .is_some_and(|&(at, _)| now >= at + EARLY_RELEASE_MEMORY)
        {
            self.forget_oldest_recent();
        }
    }

    fn forget_oldest_recent(&mut self) {
        if let Some((at, hash)) = self.recent.order.pop_front() {
            // A key released again since keeps its later time.
            if self.recent.at.get(&hash) == Some(&at) {
                self.recent.at.remove(&hash);
            }
        }
    }
}
