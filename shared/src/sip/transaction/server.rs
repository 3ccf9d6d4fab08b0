//! Non-INVITE server transactions (RFC 3261 §17.2.2), sans-IO: the table
//! that tells a new request from a retransmission of one already received,
//! and answers a retransmission with the response already sent.
//!
//! ```text
//!   request ──▶ Trying ──final response──▶ Completed ──Timer J──▶ forgotten
//!                 │  retransmission: absorbed      retransmission: the
//!                 │                                response again
//!                 └─ no response within TIMER_F ──▶ forgotten
//! ```
//!
//! A request is matched to its transaction by the top `Via`'s branch and
//! sent-by and the `CSeq` method (§17.2.3); a branch without RFC 3261's
//! `z9hG4bK` cookie comes from an RFC 2543 element and is matched by the
//! Request-URI, the tags, `Call-ID`, `CSeq` and the whole top `Via`
//! instead (§17.2.3's fallback). Over a stream nothing is retransmitted, so
//! Timer J is 0: the transaction is forgotten when answered.
//!
//! A transaction its user drops unanswered is forgotten
//! ([`ServerTransactions::abandon`]); one it neither answers nor drops is
//! forgotten at [`TIMER_F`], when its client has given up (§17.1.2.2), so
//! the table cannot grow for ever.
//!
//! Architecture invariant: no I/O, no clock, no task; `now` is always given.

use std::collections::{BTreeSet, HashMap};

use bytes::Bytes;
use tokio::time::Instant;

use super::{Request, TIMER_F};

/// RFC 3261 Timer J over UDP (64 × T1): how long a completed transaction
/// answers retransmissions of its request.
pub const TIMER_J: std::time::Duration = TIMER_F;

/// The most retransmissions of one request a transaction answers: a
/// non-INVITE client over UDP sends at most ten within Timer F (Timer E
/// from T1, doubling to T2, §17.1.2.2), one more for room. A
/// retransmission is answered without the user seeing it, so without a cap
/// one answered request let anyone (a forged source included) draw its
/// response again and again, past every rate the user keeps for strangers:
/// a reflector that multiplies the bytes sent to its victim.
pub const MAX_RETRANSMISSION_ANSWERS: u8 = 11;

/// RFC 3261 §17.1.1.3's branch cookie: a branch that starts with it is
/// unique to its transaction.
const MAGIC_COOKIE: &str = "z9hG4bK";

/// What identifies a server transaction (module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServerKey(String);

impl ServerKey {
    /// The key of `request`'s transaction; `None` when it has no top
    /// `Via` or `CSeq` to build one from.
    pub fn of(request: &Request) -> Option<Self> {
        let via = crate::sip::top_via(&request.headers)?;
        let (number, method) = crate::sip::cseq(&request.headers)?;
        let method = method.to_ascii_uppercase();
        let sent_by = crate::sip::via_sent_by(via).to_ascii_lowercase();
        match crate::sip::param(via, "branch") {
            Some(branch) if branch.starts_with(MAGIC_COOKIE) => {
                Some(Self(format!("{branch} {sent_by} {method}")))
            }
            _ => {
                let tag = |name: &str| {
                    crate::sip::header(&request.headers, name)
                        .and_then(crate::sip::tag)
                        .unwrap_or_default()
                };
                let call_id = crate::sip::call_id(&request.headers).unwrap_or("");
                Some(Self(format!(
                    "2543 {} {} {} {call_id} {number} {method} {via}",
                    request.uri,
                    tag("From"),
                    tag("To"),
                )))
            }
        }
    }
}

impl std::fmt::Display for ServerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a received request is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// The first of its transaction: for the user to answer.
    New(ServerKey),
    /// A retransmission of a request not answered yet: dropped (§17.2.2,
    /// Trying).
    Absorbed,
    /// A retransmission of a request already answered: the last response
    /// goes again (§17.2.2, Proceeding and Completed), at most
    /// [`MAX_RETRANSMISSION_ANSWERS`] times, then absorbed.
    Answer(Bytes),
}

#[derive(Debug)]
struct Entry {
    /// The last response sent, encoded.
    response: Option<Bytes>,
    /// When the entry is forgotten.
    expires: Instant,
    /// Retransmissions answered ([`MAX_RETRANSMISSION_ANSWERS`]).
    answered: u8,
}

/// The non-INVITE server transactions (module docs).
#[derive(Debug, Default)]
pub struct ServerTransactions {
    entries: HashMap<ServerKey, Entry>,
    timers: BTreeSet<(Instant, ServerKey)>,
}

impl ServerTransactions {
    /// No transaction.
    pub fn new() -> Self {
        Self::default()
    }

    /// A request arrived: whether it starts a transaction; `None` when it
    /// has no key ([`ServerKey::of`]), a request no response can be built
    /// for either.
    pub fn handle_request(&mut self, now: Instant, request: &Request) -> Option<Received> {
        let key = ServerKey::of(request)?;
        if let Some(entry) = self.entries.get_mut(&key) {
            return Some(match &entry.response {
                Some(bytes) if entry.answered < MAX_RETRANSMISSION_ANSWERS => {
                    entry.answered += 1;
                    Received::Answer(bytes.clone())
                }
                _ => Received::Absorbed,
            });
        }
        self.file(key.clone(), None, now + TIMER_F);
        Some(Received::New(key))
    }

    /// The response `bytes` was sent in transaction `key`. A final one
    /// (`final_response`) completes it: kept for Timer J over UDP,
    /// forgotten at once over a stream (`reliable`); a provisional one is
    /// sent again to retransmissions until the final one.
    pub fn handle_response(
        &mut self,
        now: Instant,
        key: &ServerKey,
        bytes: Bytes,
        final_response: bool,
        reliable: bool,
    ) {
        let Some(entry) = self.entries.get(key) else {
            return;
        };
        let answered = entry.answered;
        let expires = match (final_response, reliable) {
            (true, true) => {
                self.remove(key);
                return;
            }
            (true, false) => now + TIMER_J,
            (false, _) => entry.expires,
        };
        self.remove(key);
        self.file(key.clone(), Some(bytes), expires);
        if let Some(entry) = self.entries.get_mut(key) {
            entry.answered = answered;
        }
    }

    /// The user drops transaction `key` without answering it: forgotten
    /// while unanswered, so a retransmission of its request is new again
    /// and the user decides anew (a request it chose to ignore, as a
    /// stranger's beyond a rate, is not absorbed for [`TIMER_F`]).
    pub fn abandon(&mut self, key: &ServerKey) {
        if self.entries.get(key).is_some_and(|e| e.response.is_none()) {
            self.remove(key);
        }
    }

    fn file(&mut self, key: ServerKey, response: Option<Bytes>, expires: Instant) {
        self.timers.insert((expires, key.clone()));
        self.entries.insert(
            key,
            Entry {
                response,
                expires,
                answered: 0,
            },
        );
    }

    fn remove(&mut self, key: &ServerKey) {
        if let Some(entry) = self.entries.remove(key) {
            self.timers.remove(&(entry.expires, key.clone()));
        }
    }

    /// Forgets the transactions whose time is up.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some((at, _)) = self.timers.first() {
            if *at > now {
                break;
            }
            if let Some((_, key)) = self.timers.pop_first() {
                self.entries.remove(&key);
            }
        }
    }

    /// When the next transaction is forgotten.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.first().map(|(at, _)| *at)
    }

    /// Transactions held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests;
