//! The leg table's storage: the slab of slots (freed slots reused, a
//! generation bumped at each free so a stale FIFO entry is told apart), the
//! Call-ID index of slot numbers hashing the Call-ID kept in the slot, the
//! chain of one Call-ID's legs through their slots, and the per-conference
//! count of legs on each MSR that [`LegTable::conference_host`] reads. The
//! cost and memory notes are the parent module's.

use std::hash::BuildHasher;

use tokio::time::Instant;

use super::{LegEntry, LegKey, LegTable, Slot, NONE};

impl LegTable {
    pub(super) fn hash(&self, call_id: &str) -> u64 {
        self.hasher.hash_one(call_id)
    }

    pub(super) fn entry(&self, slot: u32) -> Option<&LegEntry> {
        self.slots.get(slot as usize).and_then(|s| s.leg.as_ref())
    }

    pub(super) fn entry_mut(&mut self, slot: u32) -> Option<&mut LegEntry> {
        self.slots
            .get_mut(slot as usize)
            .and_then(|s| s.leg.as_mut())
    }

    /// The slot of the first leg of `call_id`.
    pub(super) fn head(&self, call_id: &str) -> Option<u32> {
        let slots = &self.slots;
        self.index
            .find(self.hash(call_id), |&s| {
                slots
                    .get(s as usize)
                    .and_then(|s| s.leg.as_ref())
                    .is_some_and(|e| &*e.call_id == call_id)
            })
            .copied()
    }

    pub(super) fn find(&self, key: LegKey<'_>) -> Option<u32> {
        let mut slot = self.head(key.call_id)?;
        loop {
            let e = self.entry(slot)?;
            if e.label.as_deref() == key.leg {
                return Some(slot);
            }
            if e.next == NONE {
                return None;
            }
            slot = e.next;
        }
    }

    pub(super) fn insert(
        &mut self,
        now: Instant,
        key: LegKey<'_>,
        msr: &str,
        contact: &str,
        conference: Option<&str>,
    ) {
        let msr = self.msrs.acquire(msr);
        let contact = self.contacts.acquire(contact);
        let conference = conference.map(|c| self.conferences.acquire(c));
        if let Some(c) = conference {
            self.host_add(c, msr);
        }
        let expires_at = now + self.max_duration;
        let head = self.head(key.call_id);
        let entry = LegEntry {
            call_id: key.call_id.into(),
            label: key.leg.map(Into::into),
            msr,
            contact,
            conference,
            expires_at,
            // A new leg goes first in its Call-ID's chain.
            next: head.unwrap_or(NONE),
        };
        let slot = match self.free.pop() {
            Some(s) => {
                if let Some(slot) = self.slots.get_mut(s as usize) {
                    slot.leg = Some(entry);
                }
                s
            }
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    leg: Some(entry),
                });
                u32::try_from(self.slots.len() - 1).unwrap_or(NONE)
            }
        };
        let hash = self.hash(key.call_id);
        match head {
            Some(old) => {
                // The index now points at the new head.
                if let Some(entry) = self.index.find_mut(hash, |&s| s == old) {
                    *entry = slot;
                }
            }
            None => {
                let slots = &self.slots;
                let hasher = &self.hasher;
                self.index.insert_unique(hash, slot, |&s| {
                    slots
                        .get(s as usize)
                        .and_then(|s| s.leg.as_ref())
                        .map_or(0, |e| hasher.hash_one(&*e.call_id))
                });
            }
        }
        let generation = self.slots.get(slot as usize).map_or(0, |s| s.generation);
        self.expiries.push_back((expires_at, slot, generation));
        self.live += 1;
    }

    /// Removes the leg in `slot`: out of its Call-ID's chain and the index,
    /// its counts released, the slot freed.
    pub(super) fn remove_slot(&mut self, slot: u32) {
        let Some(entry) = self.slots.get_mut(slot as usize).and_then(|s| {
            s.generation = s.generation.wrapping_add(1);
            s.leg.take()
        }) else {
            return;
        };
        let hash = self.hash(&entry.call_id);
        // Unlink from the chain: the index holds the head, legs hold `next`.
        let head = self
            .index
            .find(hash, |&s| s == slot)
            .copied()
            .or_else(|| self.head(&entry.call_id));
        if head == Some(slot) {
            if let Ok(e) = self.index.find_entry(hash, |&s| s == slot) {
                if entry.next == NONE {
                    e.remove();
                } else {
                    *e.into_mut() = entry.next;
                }
            }
        } else if let Some(mut prev) = head {
            while let Some(e) = self.entry(prev) {
                if e.next == slot {
                    break;
                }
                if e.next == NONE {
                    break;
                }
                prev = e.next;
            }
            if let Some(p) = self.entry_mut(prev) {
                if p.next == slot {
                    p.next = entry.next;
                }
            }
        }
        if let Some(c) = entry.conference {
            self.host_remove(c, entry.msr);
            self.conferences.release(c);
        }
        self.msrs.release(entry.msr);
        self.contacts.release(entry.contact);
        self.free.push(slot);
        self.live = self.live.saturating_sub(1);
        // A released leg leaves its FIFO entry behind until its deadline;
        // at a high leg rate those would outnumber the live legs by far
        // (four hours of releases). Compacting when they are twice the live
        // legs keeps the FIFO O(live) at O(1) amortised cost.
        if self.expiries.len() > 2 * self.live + 1024 {
            let slots = &self.slots;
            self.expiries.retain(|&(_, s, generation)| {
                slots
                    .get(s as usize)
                    .is_some_and(|slot| slot.generation == generation && slot.leg.is_some())
            });
        }
    }

    /// Entries in the expiry FIFO (live legs and not yet compacted
    /// released ones), for tests and benchmarks.
    pub fn queued_expiries(&self) -> usize {
        self.expiries.len()
    }

    pub(super) fn host_add(&mut self, conference: u32, msr: u32) {
        let hosts = self.hosts.entry(conference).or_default();
        match hosts.iter_mut().find(|(m, _)| *m == msr) {
            Some((_, n)) => *n += 1,
            None => hosts.push((msr, 1)),
        }
    }

    pub(super) fn host_remove(&mut self, conference: u32, msr: u32) {
        if let Some(hosts) = self.hosts.get_mut(&conference) {
            if let Some(i) = hosts.iter().position(|(m, _)| *m == msr) {
                hosts[i].1 = hosts[i].1.saturating_sub(1);
                if hosts[i].1 == 0 {
                    hosts.remove(i);
                }
            }
            if hosts.is_empty() {
                self.hosts.remove(&conference);
            }
        }
    }
}
