//! Call legs (SPEC §9): which MSR and contact anchors each live leg, so a
//! leg selected again gets the same answer (stickiness), a release ends it
//! (idempotently), a lost release cannot leak (a maximum leg duration), an
//! operator sees each MSR's live legs (drain), and a conference knows the
//! MSR that hosts it (admission, [`crate::select`]).
//!
//! A leg is keyed by its SIP Call-ID and an optional `leg` label that tells
//! two legs of one Call-ID apart. A release names the Call-ID and, with a
//! label, one leg; without one, every leg of the Call-ID (a BYE ends the
//! call). Releasing what is not live does nothing and says so: no count
//! ever goes below zero, and nothing is kept of it.
//!
//! Legs are runtime state: they are not saved, so a restarted collector
//! starts with none (releases of the legs it forgot are harmless, and the
//! counts start again from zero).
//!
//! Cost and memory (a carrier core holds up to a million live legs):
//!
//! * legs live in a slab (`Vec` of slots, freed slots reused); the Call-ID
//!   index is a `hashbrown::HashTable` of slot numbers (4 bytes an entry)
//!   hashing the Call-ID kept in the slot, so the key is stored once; legs
//!   of one Call-ID are chained through their slots;
//! * MSR, contact and conference names are interned (one copy each, with a
//!   live-leg count), legs hold their numbers;
//! * every leg lives for the same maximum duration from its creation, so
//!   expiries are in creation order: a FIFO of `(deadline, slot,
//!   generation)` replaces an ordered set ([`LegTable::poll_timeout`] is
//!   O(1), [`LegTable::handle_timeout`] visits only due legs; a slot's
//!   generation tells a released leg's stale entry apart).
//!
//! Architecture invariant: no I/O, no clock, no task; `now` is always given.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use hashbrown::HashTable;
use tokio::time::Instant;

/// The maximum leg duration when the config sets none (SPEC §9: 4 h).
pub const DEFAULT_MAX_DURATION: Duration = Duration::from_secs(4 * 3600);

/// The most live legs the table holds (about 600 MiB at the measured 145
/// bytes a leg): beyond it a new leg is refused, so a client that never
/// releases cannot exhaust memory.
pub const MAX_LIVE_LEGS: usize = 4_000_000;

/// The longest Call-ID accepted, bytes (real ones are tens of bytes).
pub const MAX_CALL_ID_LEN: usize = 256;

/// The longest leg label or conference id accepted, bytes.
pub const MAX_LABEL_LEN: usize = 128;

/// Why a Call-ID, leg label or conference id is refused: empty, too long,
/// or holding whitespace or control characters (a Call-ID is a SIP `word`,
/// RFC 3261 §25.1; none of these is ever shown raw in a table or a log).
pub fn key_problem(value: &str, max: usize) -> Option<String> {
    if value.is_empty() {
        return Some("is empty".to_owned());
    }
    if value.len() > max {
        return Some(format!("is {} bytes, at most {max}", value.len()));
    }
    value
        .chars()
        .find(|c| c.is_control() || c.is_whitespace())
        .map(|c| {
            format!(
                "holds U+{:04X} (no whitespace or control characters)",
                u32::from(c)
            )
        })
}

/// What identifies a leg: the Call-ID the core uses for it and, when one
/// Call-ID carries two legs, a label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LegKey<'a> {
    /// The SIP Call-ID.
    pub call_id: &'a str,
    /// The leg label (`None`: the Call-ID's only or unnamed leg).
    pub leg: Option<&'a str>,
}

/// A live leg, as [`LegTable::get`] shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveLeg<'a> {
    /// The MSR anchoring it.
    pub msr: &'a str,
    /// The contact it was given.
    pub contact: &'a str,
    /// Its conference, if any.
    pub conference: Option<&'a str>,
    /// When it expires unless released.
    pub expires_at: Instant,
}

/// What [`LegTable::bind`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// A new leg.
    New,
    /// A live leg moved to another MSR or contact (its own was gone).
    Reanchored,
    /// A live leg kept its MSR and contact.
    Unchanged,
}

/// Interned names with a live-leg count each; a name whose count falls to
/// zero is forgotten (its number is reused).
#[derive(Debug, Default)]
struct Names {
    ids: HashMap<Box<str>, u32>,
    slots: Vec<Option<(Box<str>, u32)>>,
    free: Vec<u32>,
}

impl Names {
    /// The number of `name`, counting one more leg on it.
    fn acquire(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            if let Some(Some((_, n))) = self.slots.get_mut(id as usize) {
                *n += 1;
            }
            return id;
        }
        let boxed: Box<str> = name.into();
        let entry = Some((boxed.clone(), 1));
        let id = match self.free.pop() {
            Some(id) => {
                self.slots[id as usize] = entry;
                id
            }
            None => {
                self.slots.push(entry);
                u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX)
            }
        };
        self.ids.insert(boxed, id);
        id
    }

    /// One leg fewer on `id`; never below zero.
    fn release(&mut self, id: u32) {
        let Some(slot) = self.slots.get_mut(id as usize) else {
            return;
        };
        let gone = match slot {
            Some((_, n)) => {
                *n = n.saturating_sub(1);
                *n == 0
            }
            None => false,
        };
        if gone {
            if let Some((name, _)) = slot.take() {
                self.ids.remove(&name);
                self.free.push(id);
            }
        }
    }

    fn name(&self, id: u32) -> &str {
        match self.slots.get(id as usize) {
            Some(Some((name, _))) => name,
            _ => "",
        }
    }

    fn count(&self, name: &str) -> u32 {
        self.ids
            .get(name)
            .and_then(|&id| self.slots.get(id as usize))
            .and_then(|s| s.as_ref())
            .map_or(0, |(_, n)| *n)
    }

    fn counts(&self) -> impl Iterator<Item = (&str, u32)> + '_ {
        self.slots.iter().flatten().map(|(n, c)| (&**n, *c))
    }
}

/// One slab slot: a live leg, or free.
#[derive(Debug)]
struct Slot {
    /// Bumped each time the slot is freed, so a FIFO entry of an earlier
    /// leg in this slot is recognised as stale.
    generation: u32,
    leg: Option<LegEntry>,
}

#[derive(Debug)]
struct LegEntry {
    call_id: Box<str>,
    label: Option<Box<str>>,
    msr: u32,
    contact: u32,
    conference: Option<u32>,
    expires_at: Instant,
    /// The next leg of the same Call-ID (`u32::MAX`: none).
    next: u32,
}

const NONE: u32 = u32::MAX;

/// The live legs (module docs).
#[derive(Debug)]
pub struct LegTable {
    max_duration: Duration,
    hasher: RandomState,
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Call-ID → the slot of its first leg.
    index: HashTable<u32>,
    expiries: VecDeque<(Instant, u32, u32)>,
    msrs: Names,
    contacts: Names,
    conferences: Names,
    /// Conference number → (MSR number, legs of the conference on it).
    hosts: HashMap<u32, Vec<(u32, u32)>>,
    live: usize,
    /// When a release last ended a live leg: whether the core reports leg
    /// ends at all (SPEC §10's policy needs them).
    last_release: Option<Instant>,
}

impl LegTable {
    /// An empty table whose legs live at most `max_duration`.
    pub fn new(max_duration: Duration) -> Self {
        Self {
            max_duration,
            hasher: RandomState::new(),
            slots: Vec::new(),
            free: Vec::new(),
            index: HashTable::new(),
            expiries: VecDeque::new(),
            msrs: Names::default(),
            contacts: Names::default(),
            conferences: Names::default(),
            hosts: HashMap::new(),
            live: 0,
            last_release: None,
        }
    }

    /// The number of live legs.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether no leg is live.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// The live leg `key`, if any (a leg past its expiry that
    /// [`handle_timeout`](Self::handle_timeout) has not removed yet counts
    /// as gone).
    pub fn get(&self, now: Instant, key: LegKey<'_>) -> Option<LiveLeg<'_>> {
        let slot = self.find(key)?;
        let e = self.entry(slot)?;
        (now < e.expires_at).then(|| LiveLeg {
            msr: self.msrs.name(e.msr),
            contact: self.contacts.name(e.contact),
            conference: e.conference.map(|c| self.conferences.name(c)),
            expires_at: e.expires_at,
        })
    }

    /// Binds leg `key` to `msr`'s `contact`: a new leg (expiring
    /// `max_duration` from `now`), or a live one moved there (it keeps its
    /// expiry and conference).
    pub fn bind(
        &mut self,
        now: Instant,
        key: LegKey<'_>,
        msr: &str,
        contact: &str,
        conference: Option<&str>,
    ) -> Bound {
        if let Some(slot) = self.find(key) {
            let live = self.entry(slot).is_some_and(|e| now < e.expires_at);
            if live {
                let (old_msr, old_contact, conf) = match self.entry(slot) {
                    Some(e) => (e.msr, e.contact, e.conference),
                    None => return Bound::Unchanged,
                };
                if self.msrs.name(old_msr) == msr && self.contacts.name(old_contact) == contact {
                    return Bound::Unchanged;
                }
                let new_msr = self.msrs.acquire(msr);
                let new_contact = self.contacts.acquire(contact);
                if let Some(c) = conf {
                    self.host_remove(c, old_msr);
                    self.host_add(c, new_msr);
                }
                self.msrs.release(old_msr);
                self.contacts.release(old_contact);
                if let Some(e) = self.entry_mut(slot) {
                    e.msr = new_msr;
                    e.contact = new_contact;
                }
                return Bound::Reanchored;
            }
            // Expired but not yet collected: it ends now, a new leg follows.
            self.remove_slot(slot);
        }
        self.insert(now, key, msr, contact, conference);
        Bound::New
    }

    /// Ends leg `call_id`/`leg`, or with `leg` `None` every leg of
    /// `call_id`; returns how many live legs ended (0: none was live, which
    /// is harmless).
    pub fn release(&mut self, call_id: &str, leg: Option<&str>) -> usize {
        self.release_each(call_id, leg, |_| {})
    }

    /// Like [`release`](Self::release) at `now`, telling `on_end` the MSR
    /// of each leg that ended (SPEC §10's estimate counts them) and
    /// remembering `now` as the last release when one did.
    pub fn release_at(
        &mut self,
        now: Instant,
        call_id: &str,
        leg: Option<&str>,
        on_end: impl FnMut(&str),
    ) -> usize {
        let ended = self.release_each(call_id, leg, on_end);
        if ended > 0 {
            self.last_release = Some(now);
        }
        ended
    }

    /// When a release last ended a live leg (`None`: never since start).
    pub fn last_release(&self) -> Option<Instant> {
        self.last_release
    }

    fn release_each(
        &mut self,
        call_id: &str,
        leg: Option<&str>,
        mut on_end: impl FnMut(&str),
    ) -> usize {
        let mut ended = 0;
        loop {
            let slot = match leg {
                Some(_) => self.find(LegKey { call_id, leg }),
                None => self.head(call_id),
            };
            let Some(slot) = slot else {
                break;
            };
            if let Some(e) = self.entry(slot) {
                on_end(self.msrs.name(e.msr));
            }
            self.remove_slot(slot);
            ended += 1;
            if leg.is_some() {
                break;
            }
        }
        ended
    }

    /// Removes every leg whose maximum duration is over at `now`.
    pub fn handle_timeout(&mut self, now: Instant) -> usize {
        let mut expired = 0;
        while let Some(&(at, slot, generation)) = self.expiries.front() {
            if at > now {
                break;
            }
            self.expiries.pop_front();
            let current = self
                .slots
                .get(slot as usize)
                .is_some_and(|s| s.generation == generation && s.leg.is_some());
            if current {
                self.remove_slot(slot);
                expired += 1;
            }
        }
        expired
    }

    /// The earliest expiry still queued (possibly of a leg released since:
    /// then [`handle_timeout`](Self::handle_timeout) just drops it), O(1).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.expiries.front().map(|(at, _, _)| *at)
    }

    /// Live legs on `msr`.
    pub fn on_msr(&self, msr: &str) -> u32 {
        self.msrs.count(msr)
    }

    /// Live legs on `contact`.
    pub fn on_contact(&self, contact: &str) -> u32 {
        self.contacts.count(contact)
    }

    /// Every MSR with live legs, and their number.
    pub fn per_msr(&self) -> impl Iterator<Item = (&str, u32)> + '_ {
        self.msrs.counts()
    }

    /// The MSR hosting `conference`: the one with most of its live legs
    /// (the first to get them on a tie); `None` for a conference without
    /// live legs (a new one).
    pub fn conference_host(&self, conference: &str) -> Option<&str> {
        let id = *self.conferences.ids.get(conference)?;
        let hosts = self.hosts.get(&id)?;
        let mut best: Option<(u32, u32)> = None;
        for &(msr, n) in hosts {
            if best.is_none_or(|(_, b)| n > b) {
                best = Some((msr, n));
            }
        }
        best.map(|(msr, _)| self.msrs.name(msr))
    }

    /// Bytes the table holds per live leg, measured from its allocations
    /// (slab, index, FIFO, interned names), for the benchmarks.
    pub fn heap_bytes(&self) -> usize {
        let slot = std::mem::size_of::<Slot>() * self.slots.capacity();
        let index = self.index.capacity() * (std::mem::size_of::<u32>() + 1);
        let fifo = self.expiries.capacity() * std::mem::size_of::<(Instant, u32, u32)>();
        let keys: usize = self
            .slots
            .iter()
            .filter_map(|s| s.leg.as_ref())
            .map(|e| e.call_id.len() + e.label.as_ref().map_or(0, |l| l.len()))
            .sum();
        slot + index + fifo + keys
    }

    fn hash(&self, call_id: &str) -> u64 {
        self.hasher.hash_one(call_id)
    }

    fn entry(&self, slot: u32) -> Option<&LegEntry> {
        self.slots.get(slot as usize).and_then(|s| s.leg.as_ref())
    }

    fn entry_mut(&mut self, slot: u32) -> Option<&mut LegEntry> {
        self.slots
            .get_mut(slot as usize)
            .and_then(|s| s.leg.as_mut())
    }

    /// The slot of the first leg of `call_id`.
    fn head(&self, call_id: &str) -> Option<u32> {
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

    fn find(&self, key: LegKey<'_>) -> Option<u32> {
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

    fn insert(
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
    fn remove_slot(&mut self, slot: u32) {
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

    fn host_add(&mut self, conference: u32, msr: u32) {
        let hosts = self.hosts.entry(conference).or_default();
        match hosts.iter_mut().find(|(m, _)| *m == msr) {
            Some((_, n)) => *n += 1,
            None => hosts.push((msr, 1)),
        }
    }

    fn host_remove(&mut self, conference: u32, msr: u32) {
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

#[cfg(test)]
mod tests;
