//! Call legs (SPEC §9): which MSR and contact anchors each live leg, so a
//! leg selected again gets the same answer (stickiness), a release ends it
//! (idempotently), a lost release cannot leak (a maximum leg duration), an
//! operator sees each MSR's live legs (drain), and a conference knows the
//! MSR that hosts it (admission, [`crate::select`]).
//!
//! A leg is keyed by its SIP Call-ID and an optional `leg` label that tells
//! two legs of one Call-ID apart. A release names the Call-ID and, with a
//! label, one leg; without one, every leg of the Call-ID (a BYE ends the
//! call). Releasing what is not live ends nothing and says so: no count
//! ever goes below zero. Such a release may have overtaken its own select
//! (sent on another connection, or a CANCEL racing its INVITE), so its key
//! is remembered for [`EARLY_RELEASE_MEMORY`] and a select for it in that
//! time places nothing (SPEC §9); at most [`MAX_EARLY_RELEASES`] keys are
//! kept, the oldest forgotten first, so a client releasing random keys
//! cannot exhaust memory.
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

/// How long a release that found no live leg is remembered (SPEC §9): a
/// select for that leg within it places nothing.
pub const EARLY_RELEASE_MEMORY: Duration = Duration::from_secs(32);

/// The most early releases remembered at once (a few MiB); beyond it the
/// oldest is forgotten.
pub const MAX_EARLY_RELEASES: usize = 65_536;

/// At most one report of expired legs per interval (SPEC §9): a lost
/// release is worth a line, a core that never releases must not write one
/// per leg.
pub const EXPIRY_REPORT_INTERVAL: Duration = Duration::from_secs(60);

/// Legs that expired without a release since the last report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiryReport {
    /// How many.
    pub count: u64,
    /// The Call-ID of the first of them, for the operator to look up.
    pub sample_call_id: String,
}

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

/// A live leg, as [`LegTable::list`] shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListedLeg<'a> {
    /// The SIP Call-ID.
    pub call_id: &'a str,
    /// The leg label, if any.
    pub leg: Option<&'a str>,
    /// The MSR anchoring it.
    pub msr: &'a str,
    /// The contact it was given.
    pub contact: &'a str,
    /// Its conference, if any.
    pub conference: Option<&'a str>,
    /// Time since it was placed.
    pub age: Duration,
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

/// A remembered early release of one Call-ID: its label (`None`: every
/// leg) and when it arrived.
type EarlyRelease = (Option<Box<str>>, Instant);

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
    /// Releases that found no live leg (module docs): Call-ID → (label,
    /// when), a label of `None` standing for every leg of the Call-ID (as
    /// the release did). Keyed by Call-ID so a select looks it up without
    /// allocating.
    early: HashMap<Box<str>, Vec<EarlyRelease>>,
    /// `(when, Call-ID)` of each entry of `early`, oldest first.
    early_order: VecDeque<(Instant, Box<str>)>,
    early_len: usize,
    /// Expired legs not reported yet, and the first one's Call-ID.
    expired_unreported: u64,
    expired_sample: Option<Box<str>>,
    /// When expiries were last reported.
    expiry_reported_at: Option<Instant>,
}

impl LegTable {
    /// Legs placed from now on live at most `max_duration` (a reloaded
    /// `[legs] max_duration`); live ones keep theirs.
    pub fn set_max_duration(&mut self, max_duration: Duration) {
        self.max_duration = max_duration;
    }

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
            early: HashMap::new(),
            early_order: VecDeque::new(),
            early_len: 0,
            expired_unreported: 0,
            expired_sample: None,
            expiry_reported_at: None,
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
        } else {
            self.remember_early(now, call_id, leg);
        }
        ended
    }

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
    fn remember_early(&mut self, now: Instant, call_id: &str, leg: Option<&str>) {
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
    fn forget_early(&mut self, now: Instant) {
        while self
            .early_order
            .front()
            .is_some_and(|&(at, _)| now >= at + EARLY_RELEASE_MEMORY)
        {
            self.forget_oldest_early();
        }
    }

    /// Forgets the oldest early release; false when none is left.
    fn forget_oldest_early(&mut self) -> bool {
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
        self.handle_timeout_with(now, |_| {})
    }

    /// [`handle_timeout`](Self::handle_timeout), calling `on_expire` with
    /// each expired leg's MSR (its estimate no longer counts it, SPEC §10).
    pub fn handle_timeout_with(&mut self, now: Instant, mut on_expire: impl FnMut(&str)) -> usize {
        self.forget_early(now);
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
                if self.expired_sample.is_none() {
                    self.expired_sample = self.entry(slot).map(|e| e.call_id.clone());
                }
                if let Some(e) = self.entry(slot) {
                    on_expire(self.msrs.name(e.msr));
                }
                self.remove_slot(slot);
                expired += 1;
            }
        }
        self.expired_unreported += expired as u64;
        expired
    }

    /// The legs that expired since the last report, once
    /// [`EXPIRY_REPORT_INTERVAL`] has passed since it (the first expiry is
    /// reported at once).
    pub fn poll_expiry_report(&mut self, now: Instant) -> Option<ExpiryReport> {
        if self.expired_unreported == 0 || self.expiry_report_due().is_some_and(|at| now < at) {
            return None;
        }
        self.expiry_reported_at = Some(now);
        let count = std::mem::take(&mut self.expired_unreported);
        let sample_call_id = self
            .expired_sample
            .take()
            .map(String::from)
            .unwrap_or_default();
        Some(ExpiryReport {
            count,
            sample_call_id,
        })
    }

    /// When the next expiry report may be given.
    fn expiry_report_due(&self) -> Option<Instant> {
        self.expiry_reported_at
            .map(|at| at + EXPIRY_REPORT_INTERVAL)
    }

    /// The earliest expiry still queued (possibly of a leg released since:
    /// then [`handle_timeout`](Self::handle_timeout) just drops it), or
    /// when held-back expiries may be reported, O(1).
    pub fn poll_timeout(&self) -> Option<Instant> {
        let report = self
            .expiry_report_due()
            .filter(|_| self.expired_unreported > 0);
        let expiry = self.expiries.front().map(|(at, _, _)| *at);
        report.into_iter().chain(expiry).min()
    }

    /// Live legs on `msr`.
    pub fn on_msr(&self, msr: &str) -> u32 {
        self.msrs.count(msr)
    }

    /// Live legs on `contact`.
    pub fn on_contact(&self, contact: &str) -> u32 {
        self.contacts.count(contact)
    }

    /// The age of the oldest live leg of each MSR with live legs. A leg's
    /// expiry is fixed when it is bound, so its age is the maximum duration
    /// less the time it has left. One pass over the table, for a scrape of
    /// the metrics (SPEC §13: legs older than their expected duration).
    pub fn oldest_per_msr(&self, now: Instant) -> HashMap<&str, Duration> {
        let mut oldest: HashMap<&str, Duration> = HashMap::new();
        for entry in self.slots.iter().filter_map(|s| s.leg.as_ref()) {
            if now >= entry.expires_at {
                continue;
            }
            let age = self
                .max_duration
                .saturating_sub(entry.expires_at.saturating_duration_since(now));
            let slot = oldest.entry(self.msrs.name(entry.msr)).or_default();
            *slot = (*slot).max(age);
        }
        oldest
    }

    /// The live legs, oldest first (the expiry FIFO's order: every leg
    /// lives the same maximum duration from its creation), on `msr` only
    /// when given and at least `min_age` old, at most `limit` of them;
    /// with the number of all that match (SPEC §9 `leg list`). One pass
    /// over the FIFO.
    pub fn list(
        &self,
        now: Instant,
        msr: Option<&str>,
        min_age: Duration,
        limit: usize,
    ) -> (u64, Vec<ListedLeg<'_>>) {
        // An MSR without live legs has no number: nothing matches.
        let msr_id = match msr {
            Some(name) => match self.msrs.ids.get(name) {
                Some(&id) => Some(id),
                None => return (0, Vec::new()),
            },
            None => None,
        };
        let mut total = 0;
        let mut rows = Vec::new();
        for &(_, slot, generation) in &self.expiries {
            let Some(e) = self
                .slots
                .get(slot as usize)
                .filter(|s| s.generation == generation)
                .and_then(|s| s.leg.as_ref())
            else {
                continue;
            };
            if now >= e.expires_at || msr_id.is_some_and(|id| id != e.msr) {
                continue;
            }
            let age = self
                .max_duration
                .saturating_sub(e.expires_at.saturating_duration_since(now));
            if age < min_age {
                continue;
            }
            total += 1;
            if rows.len() < limit {
                rows.push(ListedLeg {
                    call_id: &e.call_id,
                    leg: e.label.as_deref(),
                    msr: self.msrs.name(e.msr),
                    contact: self.contacts.name(e.contact),
                    conference: e.conference.map(|c| self.conferences.name(c)),
                    age,
                });
            }
        }
        (total, rows)
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
