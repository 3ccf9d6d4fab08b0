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
use std::time::Duration;

use hashbrown::HashTable;
use tokio::time::Instant;

use crate::operator::names::{ContactName, MsrName};

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
    /// The Call-ID hash (foldhash, seeded per process, as the redirect's
    /// INVITE memory: the Call-IDs are the peers').
    hasher: foldhash::fast::RandomState,
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
    /// The core's releases of live legs, for a failover they overtook.
    recent: recent::RecentReleases,
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
            hasher: foldhash::fast::RandomState::default(),
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
            recent: recent::RecentReleases::default(),
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
        msr: &MsrName,
        contact: &ContactName,
        conference: Option<&str>,
    ) -> Bound {
        if let Some(slot) = self.find(key) {
            let live = self.entry(slot).is_some_and(|e| now < e.expires_at);
            if live {
                let (old_msr, old_contact, conf) = match self.entry(slot) {
                    Some(e) => (e.msr, e.contact, e.conference),
                    None => return Bound::Unchanged,
                };
                if self.msrs.name(old_msr) == msr.as_str()
                    && self.contacts.name(old_contact) == contact.as_str()
                {
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
        self.forget_recent(now);
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
}

mod early;
mod names;
mod recent;
pub use recent::MAX_RECENT_RELEASES;
mod slab;
use names::Names;

#[cfg(test)]
mod tests;
