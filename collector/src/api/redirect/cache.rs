//! The redirect server's short memory of the INVITEs it answered (RFC 3261
//! §17.2.3 matching by the top `Via`): a retransmission gets the same bytes
//! again without a new selection, and a CANCEL finds its INVITE (§9.2).
//! Sans-IO, so the stateless server keeps no transaction and no timer.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::time::Duration;

use bytes::Bytes;
use msr_shared::sip::{self, Request};
use tokio::time::Instant;

/// How long an answered INVITE is remembered: 64 × T1 = 32 s, the longest
/// a client retransmits it (RFC 3261 §17.1.1.2 Timer B) and so the longest
/// a retransmission or a CANCEL can come.
pub const REMEMBER: Duration = Duration::from_secs(32);

/// The most INVITEs remembered at once; past it the oldest are forgotten
/// (a retransmission of a forgotten one is selected again and, its
/// Call-ID being a live leg, gets the same Contact).
pub const MAX_REMEMBERED: usize = 16_384;

/// An INVITE's identity for retransmissions and CANCEL (RFC 3261
/// §17.2.3): the top `Via`'s branch and sent-by. A branch without RFC
/// 3261's magic cookie (or none: an RFC 2543 client, RFC 4475 §3.4.1)
/// says nothing of the transaction, so then the identity is RFC 2543's:
/// the Request-URI, the `To` and `From` tags, the Call-ID, the CSeq
/// number and the whole top `Via` — all the same in a retransmission and
/// in the CANCEL of the INVITE. `None` without a top `Via`.
pub fn transaction_key(req: &Request) -> Option<String> {
    let top = sip::top_via(&req.headers)?;
    if let Some(branch) = sip::param(top, "branch").filter(|b| b.starts_with(MAGIC_COOKIE)) {
        let sent_by = sip::via_sent_by(top);
        let mut key = String::with_capacity(branch.len() + 1 + sent_by.len());
        key.push_str(&branch);
        key.push(' ');
        key.push_str(sent_by);
        return Some(key);
    }
    let tag = |name| {
        sip::header(&req.headers, name)
            .and_then(|v| sip::param(v, "tag"))
            .unwrap_or_default()
    };
    let call_id = sip::header(&req.headers, "Call-ID").unwrap_or_default();
    let cseq = sip::cseq(&req.headers).map_or(0, |(n, _)| n);
    Some(format!(
        "rfc2543 {} {} {} {call_id} {cseq} {top}",
        req.uri,
        tag("To"),
        tag("From"),
    ))
}

/// The start of every branch RFC 3261 clients make (§8.1.1.7).
const MAGIC_COOKIE: &str = "z9hG4bK";

/// What to do with an INVITE ([`InviteCache::on_invite`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnInvite {
    /// A new one: decide and select.
    New,
    /// A retransmission of one answered: send these bytes again.
    Resend(Bytes),
    /// A retransmission of one still being selected: its answer will come.
    Absorb,
}

/// What to answer a CANCEL ([`InviteCache::on_cancel`], RFC 3261 §9.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnCancel {
    /// `200` to the CANCEL; the INVITE's final response stands.
    Answered,
    /// `200` to the CANCEL; the INVITE gets `487` when its selection ends.
    Terminate,
    /// `481`: no INVITE matches.
    NoMatch,
}

/// One remembered INVITE: its key and state, in a slot of the ring that
/// is reused (key and answer buffers included) once the ring is full.
#[derive(Debug)]
struct Slot {
    /// Which INVITE this slot holds now (its sequence number).
    seq: u64,
    /// The key's hash, by which the index finds the slot.
    hash: u64,
    /// When the INVITE was first seen.
    at: Instant,
    key: String,
    state: State,
    /// The final response, as sent (`State::Answered`).
    answer: Vec<u8>,
}

/// Where a remembered INVITE is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Its selection is running; `cancelled` once a CANCEL came.
    Pending { cancelled: bool },
    /// Answered: its final response is the slot's `answer`.
    Answered,
}

/// The INVITEs answered lately (module docs). Sans-IO: the caller passes
/// the time. The INVITEs are kept in the order they came, in a ring of at
/// most [`MAX_REMEMBERED`] slots whose buffers are reused, and found by
/// their key's hash (foldhash, seeded per process, as keys are the peers'
/// Via values); a slot's key is compared before it is taken for the
/// INVITE's. Forgetting the oldest reads its slot's hash, not its key.
/// A slot keeps its buffers once used: at most `MAX_REMEMBERED` keys and
/// answers (about 8 MiB for 16,384 INVITEs).
#[derive(Debug, Default)]
pub struct InviteCache {
    hasher: foldhash::fast::RandomState,
    /// Slot of sequence number `n`: `ring[n % MAX_REMEMBERED]`.
    ring: Vec<Slot>,
    /// Key hash → sequence number of the slot holding it.
    index: HashMap<u64, u64, foldhash::fast::FixedState>,
    /// Sequence number of the oldest remembered INVITE.
    oldest: u64,
    /// Sequence number the next INVITE gets.
    next: u64,
}

/// `n`'s place in the ring.
fn place(n: u64) -> usize {
    // MAX_REMEMBERED fits a u64 and the remainder is below it.
    usize::try_from(n % MAX_REMEMBERED as u64).unwrap_or(0)
}

impl InviteCache {
    /// An INVITE with `key` arrived at `now`.
    pub fn on_invite(&mut self, now: Instant, key: &str) -> OnInvite {
        self.expire(now);
        let hash = self.hasher.hash_one(key);
        if let Some(slot) = self.slot_mut(hash, key) {
            return match slot.state {
                State::Answered => OnInvite::Resend(Bytes::copy_from_slice(&slot.answer)),
                State::Pending { .. } => OnInvite::Absorb,
            };
        }
        // Another key of the same hash (one in 2^64 per pair): this one is
        // answered unremembered; its retransmissions are selected again
        // and, the Call-ID being a live leg, get the same Contact.
        if self.index.contains_key(&hash) {
            return OnInvite::New;
        }
        while self.len() >= MAX_REMEMBERED {
            self.forget_oldest();
        }
        let seq = self.next;
        self.next += 1;
        let at = place(seq);
        let state = State::Pending { cancelled: false };
        match self.ring.get_mut(at) {
            Some(slot) => {
                slot.seq = seq;
                slot.hash = hash;
                slot.at = now;
                slot.key.clear();
                slot.key.push_str(key);
                slot.state = state;
                slot.answer.clear();
            }
            None => self.ring.push(Slot {
                seq,
                hash,
                at: now,
                key: key.to_owned(),
                state,
                answer: Vec::new(),
            }),
        }
        self.index.insert(hash, seq);
        OnInvite::New
    }

    /// The INVITE with `key` was answered with `bytes`. `false` when a
    /// CANCEL came first: then the caller answers `487` instead (and
    /// records that with `answered` again, which then returns `true`).
    pub fn answered(&mut self, key: &str, bytes: &[u8]) -> bool {
        let hash = self.hasher.hash_one(key);
        match self.slot_mut(hash, key) {
            Some(slot) if slot.state == (State::Pending { cancelled: true }) => {
                // The 487 is recorded next; until then retransmissions wait.
                slot.state = State::Pending { cancelled: false };
                false
            }
            Some(slot) => {
                slot.state = State::Answered;
                slot.answer.clear();
                slot.answer.extend_from_slice(bytes);
                true
            }
            // Forgotten while selecting (the bound): nothing to remember.
            None => true,
        }
    }

    /// A CANCEL for the INVITE with `key` arrived at `now`.
    pub fn on_cancel(&mut self, now: Instant, key: &str) -> OnCancel {
        self.expire(now);
        let hash = self.hasher.hash_one(key);
        match self.slot_mut(hash, key) {
            Some(Slot {
                state: State::Answered,
                ..
            }) => OnCancel::Answered,
            Some(slot) => {
                slot.state = State::Pending { cancelled: true };
                OnCancel::Terminate
            }
            None => OnCancel::NoMatch,
        }
    }

    /// INVITEs remembered now.
    pub fn len(&self) -> usize {
        usize::try_from(self.next - self.oldest).unwrap_or(usize::MAX)
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.next == self.oldest
    }

    /// The slot remembering `key` (of `hash`).
    fn slot_mut(&mut self, hash: u64, key: &str) -> Option<&mut Slot> {
        let seq = *self.index.get(&hash)?;
        self.ring
            .get_mut(place(seq))
            .filter(|slot| slot.seq == seq && slot.key == key)
    }

    fn expire(&mut self, now: Instant) {
        while let Some(slot) = self.oldest_slot() {
            if now.duration_since(slot.at) < REMEMBER {
                break;
            }
            self.forget_oldest();
        }
    }

    fn oldest_slot(&self) -> Option<&Slot> {
        if self.is_empty() {
            return None;
        }
        self.ring.get(place(self.oldest))
    }

    fn forget_oldest(&mut self) {
        if self.is_empty() {
            return;
        }
        if let Some(slot) = self.ring.get(place(self.oldest)) {
            if self.index.get(&slot.hash) == Some(&self.oldest) {
                self.index.remove(&slot.hash);
            }
        }
        self.oldest += 1;
    }
}
