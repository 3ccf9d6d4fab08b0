//! The redirect server's short memory of the INVITEs it answered (RFC 3261
//! §17.2.3 matching by the top `Via`): a retransmission gets the same bytes
//! again without a new selection, and a CANCEL finds its INVITE (§9.2).
//! Sans-IO, so the stateless server keeps no transaction and no timer.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
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
/// §17.2.3): the top `Via`'s branch and sent-by.
pub fn transaction_key(req: &Request) -> Option<String> {
    let top = sip::top_via(&req.headers)?;
    let branch = sip::param(top, "branch").filter(|b| !b.is_empty())?;
    let sent_by = sip::via_sent_by(top);
    let mut key = String::with_capacity(branch.len() + 1 + sent_by.len());
    key.push_str(&branch);
    key.push(' ');
    key.push_str(sent_by);
    Some(key)
}

/// Where an INVITE is in this server's short memory.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// Its selection is running; `cancelled` once a CANCEL came.
    Pending { cancelled: bool },
    /// Its final response, as sent.
    Answered(Bytes),
}

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

/// The INVITEs answered lately (module docs). Sans-IO: the caller passes
/// the time. A key is stored once, shared by the map and the expiry
/// order; the map's hasher is seeded per process (foldhash), as keys are
/// the peers' Via values.
#[derive(Debug, Default)]
pub struct InviteCache {
    entries: HashMap<Arc<str>, Entry, foldhash::fast::RandomState>,
    /// Keys by the time they were first seen, for expiry and the bound.
    order: VecDeque<(Instant, Arc<str>)>,
}

impl InviteCache {
    /// An INVITE with `key` arrived at `now`.
    pub fn on_invite(&mut self, now: Instant, key: &str) -> OnInvite {
        self.expire(now);
        match self.entries.get(key) {
            Some(Entry::Answered(bytes)) => OnInvite::Resend(bytes.clone()),
            Some(Entry::Pending { .. }) => OnInvite::Absorb,
            None => {
                while self.order.len() >= MAX_REMEMBERED {
                    self.forget_oldest();
                }
                let key: Arc<str> = Arc::from(key);
                self.entries
                    .insert(Arc::clone(&key), Entry::Pending { cancelled: false });
                self.order.push_back((now, key));
                OnInvite::New
            }
        }
    }

    /// The INVITE with `key` was answered with `bytes`. `false` when a
    /// CANCEL came first: then the caller answers `487` instead (and
    /// records that with `answered` again, which then returns `true`).
    pub fn answered(&mut self, key: &str, bytes: Bytes) -> bool {
        match self.entries.get_mut(key) {
            Some(entry) if *entry == (Entry::Pending { cancelled: true }) => {
                // The 487 is recorded next; until then retransmissions wait.
                *entry = Entry::Pending { cancelled: false };
                false
            }
            Some(entry) => {
                *entry = Entry::Answered(bytes);
                true
            }
            // Forgotten while selecting (the bound): nothing to remember.
            None => true,
        }
    }

    /// A CANCEL for the INVITE with `key` arrived at `now`.
    pub fn on_cancel(&mut self, now: Instant, key: &str) -> OnCancel {
        self.expire(now);
        match self.entries.get_mut(key) {
            Some(Entry::Answered(_)) => OnCancel::Answered,
            Some(Entry::Pending { cancelled }) => {
                *cancelled = true;
                OnCancel::Terminate
            }
            None => OnCancel::NoMatch,
        }
    }

    /// INVITEs remembered now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn expire(&mut self, now: Instant) {
        while let Some((at, _)) = self.order.front() {
            if now.duration_since(*at) < REMEMBER {
                break;
            }
            self.forget_oldest();
        }
    }

    fn forget_oldest(&mut self) {
        if let Some((_, key)) = self.order.pop_front() {
            self.entries.remove(&key);
        }
    }
}
