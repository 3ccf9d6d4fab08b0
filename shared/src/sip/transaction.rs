//! Non-INVITE client transactions (RFC 3261 §17.1.2), sans-IO: over UDP
//! with their retransmissions, or over a stream connection ([`Link`]),
//! where the transport is reliable and only Timer F runs (§17.1.2.2).
//!
//! [`ClientTransactions`] is the transaction layer of a daemon that speaks
//! SIP statelessly on its server side (RFC 3261 §8.2.7) and needs only a
//! few client transactions of its own: the collector's SUBSCRIBEs and its
//! OPTIONS keepalives. It stamps each request with a top `Via` (the local
//! address, a fresh `z9hG4bK` branch, `rport`), keeps its bytes for the
//! retransmissions, and matches responses by branch and `CSeq` method
//! (§17.1.3).
//!
//! ```text
//!            send ──▶ Trying ──1xx──▶ Proceeding
//!                       │ Timer E: retransmit, E = min(2E, T2)
//!                       │           (Proceeding: every T2)
//!     final response ───┼──────────────────────────▶ reported, forgotten
//!     timeout (Timer F) ┴──────────────────────────▶ reported as TimedOut
//! ```
//!
//! A transaction is forgotten at its final response: the Completed state's
//! only job over UDP is to absorb retransmitted final responses (Timer K),
//! and a response that matches no transaction is dropped all the same.
//! [`ClientTransactions::cancel`] forgets one whose answer its user no
//! longer waits for (a keepalive counted as missed), so nothing more is
//! retransmitted toward a peer that does not answer.
//!
//! A user that writes its requests' bytes itself hands them over with
//! [`send_encoded`](ClientTransactions::send_encoded), which gives it the
//! `Via` to write first. [`handle_response_counted`](ClientTransactions::handle_response_counted)
//! and [`poll_outcome_counted`](ClientTransactions::poll_outcome_counted)
//! also tell how many times the request was retransmitted before its
//! transaction ended: what a user that measures its peer's losses counts
//! (msr-loadgen's NOTIFYs retransmitted at least once).
//!
//! Cost: one hash map entry and one ordered-set entry per transaction in
//! flight, holding the request's bytes; each retransmission is a copy of
//! a reference-counted buffer.
//!
//! Architecture invariant: no I/O, no clock, no task; `now` is always given.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::Hash;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::{Request, Response};

pub mod server;

/// RFC 3261 T1, the round-trip estimate: the first retransmission interval.
pub const T1: Duration = Duration::from_millis(500);
/// RFC 3261 T2: the longest retransmission interval of a non-INVITE request.
pub const T2: Duration = Duration::from_secs(4);
/// RFC 3261 Timer F (64 × T1): a transaction without a final response by
/// then has timed out.
pub const TIMER_F: Duration = Duration::from_secs(32);

/// One message to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    /// Where to.
    pub to: SocketAddr,
    /// The encoded message.
    pub bytes: Bytes,
    /// The link it goes over.
    pub link: Link,
}

/// How a request travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// A UDP datagram from this endpoint's address, retransmitted on
    /// Timer E.
    Udp,
    /// A stream connection to the peer (RFC 3261 §18.1.1): sent once,
    /// `Via` naming `transport` and `sent_by`.
    Stream {
        /// `TCP` or `TLS` in the `Via`.
        transport: StreamTransport,
        /// The `Via` sent-by: the listening address of that transport.
        sent_by: SocketAddr,
    },
}

/// A stream transport as `Via` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamTransport {
    /// `SIP/2.0/TCP`.
    Tcp,
    /// `SIP/2.0/TLS`.
    Tls,
}

impl std::fmt::Display for StreamTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StreamTransport::Tcp => "tcp",
            StreamTransport::Tls => "tls",
        })
    }
}

/// How a transaction ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Its final response (status ≥ 200).
    Response(Response),
    /// No final response within its timeout (RFC 3261 Timer F; RFC 3261
    /// §8.1.3.1 treats it as a `408`).
    TimedOut,
}

/// Why a request could not be sent.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum SendError {
    /// The request has no `CSeq` (the transaction key needs its method).
    #[error("the request has no cseq")]
    NoCSeq,
    /// A transaction with this id is in flight already.
    #[error("a transaction with this id is in flight")]
    Duplicate,
}

#[derive(Debug)]
struct Entry<Id> {
    id: Id,
    to: SocketAddr,
    bytes: Bytes,
    link: Link,
    /// The `CSeq` method, which a response must carry too (§17.1.3).
    method: String,
    /// The next retransmission interval (Timer E).
    interval: Duration,
    /// Retransmissions sent so far.
    retransmissions: u32,
    retransmit_at: Instant,
    give_up_at: Instant,
    /// The deadline it is filed under in `timers`.
    armed: Instant,
}

impl<Id> Entry<Id> {
    fn deadline(&self) -> Instant {
        self.retransmit_at.min(self.give_up_at)
    }
}

/// The client transactions in flight (module docs).
#[derive(Debug)]
pub struct ClientTransactions<Id> {
    /// The `Via` sent-by: this endpoint's address.
    sent_by: SocketAddr,
    user_agent: String,
    by_branch: HashMap<String, Entry<Id>>,
    by_id: HashMap<Id, String>,
    timers: BTreeSet<(Instant, String)>,
    transmits: VecDeque<Datagram>,
    outcomes: VecDeque<(Id, Outcome, u32)>,
    retransmissions: u64,
}

impl<Id: Clone + Eq + Hash> ClientTransactions<Id> {
    /// No transaction in flight; requests leave with `Via: SIP/2.0/UDP
    /// {sent_by}` and `User-Agent: {user_agent}` (unless they carry one).
    pub fn new(sent_by: SocketAddr, user_agent: &str) -> Self {
        Self {
            sent_by,
            user_agent: user_agent.to_owned(),
            by_branch: HashMap::new(),
            by_id: HashMap::new(),
            timers: BTreeSet::new(),
            transmits: VecDeque::new(),
            outcomes: VecDeque::new(),
            retransmissions: 0,
        }
    }

    /// Sends `request` to `to` in a new transaction that times out at
    /// [`TIMER_F`]; see [`send_with_timeout`](Self::send_with_timeout).
    ///
    /// # Errors
    /// As [`send_with_timeout`](Self::send_with_timeout).
    pub fn send(
        &mut self,
        now: Instant,
        id: Id,
        to: SocketAddr,
        request: Request,
    ) -> Result<(), SendError> {
        self.send_with_timeout(now, id, to, request, TIMER_F)
    }

    /// Sends `request` to `to` over UDP in a new transaction `id`; see
    /// [`send_on`](Self::send_on).
    ///
    /// # Errors
    /// As [`send_on`](Self::send_on).
    pub fn send_with_timeout(
        &mut self,
        now: Instant,
        id: Id,
        to: SocketAddr,
        request: Request,
        timeout: Duration,
    ) -> Result<(), SendError> {
        self.send_on(now, id, to, request, timeout, Link::Udp)
    }

    /// Sends `request` to `to` over `link` in a new transaction `id` that
    /// gives up after `timeout` (at most [`TIMER_F`]): adds the top `Via`,
    /// `Max-Forwards: 70` and `User-Agent` when absent, queues the first
    /// transmission ([`poll_transmit`](Self::poll_transmit)) and
    /// retransmits it (over UDP) until a final response or the timeout,
    /// whose outcome [`poll_outcome`](Self::poll_outcome) reports.
    ///
    /// # Errors
    /// [`SendError::NoCSeq`]; [`SendError::Duplicate`] when `id` is in
    /// flight.
    pub fn send_on(
        &mut self,
        now: Instant,
        id: Id,
        to: SocketAddr,
        mut request: Request,
        timeout: Duration,
        link: Link,
    ) -> Result<(), SendError> {
        if self.by_id.contains_key(&id) {
            return Err(SendError::Duplicate);
        }
        let (_, method) = super::cseq(&request.headers).ok_or(SendError::NoCSeq)?;
        let branch = self.new_branch();
        request
            .headers
            .push_front(rsipstack::sip::headers::make_header(
                "Via",
                via(link, self.sent_by, &branch),
            ));
        if super::header(&request.headers, "Max-Forwards").is_none() {
            super::push_header(&mut request.headers, "Max-Forwards", "70");
        }
        if super::header(&request.headers, "User-Agent").is_none() {
            super::push_header(&mut request.headers, "User-Agent", self.user_agent.clone());
        }
        let bytes = super::wire::encode_request(request);
        self.start(now, id, to, bytes, method, branch, timeout, link);
        Ok(())
    }

    /// Sends over `link` to `to` a request its user encodes, in a new
    /// transaction `id` that times out at [`TIMER_F`]: `encode` gets the
    /// top `Via` value (sent-by, a fresh branch, `rport`) and returns the
    /// whole message with that `Via` first, `Max-Forwards`,
    /// `Content-Length` and all; `method` is its `CSeq` method. Otherwise
    /// as [`send_on`](Self::send_on). For a load generator, whose cost per
    /// request is part of what it measures.
    ///
    /// # Errors
    /// [`SendError::Duplicate`] when `id` is in flight.
    pub fn send_encoded(
        &mut self,
        now: Instant,
        id: Id,
        to: SocketAddr,
        link: Link,
        method: &str,
        encode: impl FnOnce(&str) -> Bytes,
    ) -> Result<(), SendError> {
        if self.by_id.contains_key(&id) {
            return Err(SendError::Duplicate);
        }
        let branch = self.new_branch();
        let bytes = encode(&via(link, self.sent_by, &branch));
        self.start(now, id, to, bytes, method.to_owned(), branch, TIMER_F, link);
        Ok(())
    }

    /// A `z9hG4bK` branch no transaction in flight has (RFC 3261 §8.1.1.7).
    fn new_branch(&self) -> String {
        loop {
            let branch = format!("z9hG4bK{}", super::random_token());
            if !self.by_branch.contains_key(&branch) {
                return branch;
            }
        }
    }

    /// Queues the first transmission of `bytes` and files the transaction.
    #[allow(clippy::too_many_arguments)]
    fn start(
        &mut self,
        now: Instant,
        id: Id,
        to: SocketAddr,
        bytes: Bytes,
        method: String,
        branch: String,
        timeout: Duration,
        link: Link,
    ) {
        let timeout = timeout.min(TIMER_F);
        // §17.1.2.2: over a reliable transport Timer E does not run.
        let retransmit_at = match link {
            Link::Udp => now + T1,
            Link::Stream { .. } => now + timeout,
        };
        let entry = Entry {
            id: id.clone(),
            to,
            bytes: bytes.clone(),
            link,
            method,
            interval: T1,
            retransmissions: 0,
            retransmit_at,
            give_up_at: now + timeout,
            armed: now,
        };
        self.transmits.push_back(Datagram { to, bytes, link });
        self.by_id.insert(id, branch.clone());
        self.file(branch, entry);
    }

    /// Files `entry` under its next deadline.
    fn file(&mut self, branch: String, mut entry: Entry<Id>) {
        entry.armed = entry.deadline();
        self.timers.insert((entry.armed, branch.clone()));
        self.by_branch.insert(branch, entry);
    }

    fn remove(&mut self, branch: &str) -> Option<Entry<Id>> {
        let entry = self.by_branch.remove(branch)?;
        self.timers.remove(&(entry.armed, branch.to_owned()));
        self.by_id.remove(&entry.id);
        Some(entry)
    }

    /// Forgets transaction `id` without an outcome: nothing more is
    /// retransmitted and a late answer is dropped. Whether it was in
    /// flight.
    pub fn cancel(&mut self, id: &Id) -> bool {
        match self.by_id.get(id).cloned() {
            Some(branch) => self.remove(&branch).is_some(),
            None => false,
        }
    }

    /// A response arrived: the id of its transaction and the response
    /// when it is final (the transaction is then forgotten). A provisional
    /// response slows the retransmissions to every T2 (§17.1.2.2); a
    /// response that matches no transaction in flight is dropped
    /// (§17.1.3).
    pub fn handle_response(&mut self, now: Instant, response: Response) -> Option<(Id, Response)> {
        self.handle_response_counted(now, response)
            .map(|(id, response, _)| (id, response))
    }

    /// As [`handle_response`](Self::handle_response), with how many
    /// times the request was retransmitted (Timer E) before its final
    /// response.
    pub fn handle_response_counted(
        &mut self,
        now: Instant,
        response: Response,
    ) -> Option<(Id, Response, u32)> {
        let via = super::header(&response.headers, "Via")?;
        let branch = super::param(via, "branch")?;
        let (_, method) = super::cseq(&response.headers)?;
        let entry = self.by_branch.get(&branch)?;
        if !entry.method.eq_ignore_ascii_case(&method) {
            return None;
        }
        if response.status_code.code() < 200 {
            if let Some(mut entry) = self.by_branch.remove(&branch) {
                self.timers.remove(&(entry.armed, branch.clone()));
                entry.interval = T2;
                if entry.link == Link::Udp {
                    entry.retransmit_at = entry.retransmit_at.max(now + T2);
                }
                self.file(branch, entry);
            }
            return None;
        }
        let entry = self.remove(&branch)?;
        Some((entry.id, response, entry.retransmissions))
    }

    /// Retransmits what is due and times out what has waited too long.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some((at, _)) = self.timers.first() {
            if *at > now {
                break;
            }
            let Some((_, branch)) = self.timers.pop_first() else {
                break;
            };
            let Some(mut entry) = self.by_branch.remove(&branch) else {
                continue;
            };
            if entry.give_up_at <= now {
                self.by_id.remove(&entry.id);
                self.outcomes
                    .push_back((entry.id, Outcome::TimedOut, entry.retransmissions));
                continue;
            }
            self.transmits.push_back(Datagram {
                to: entry.to,
                bytes: entry.bytes.clone(),
                link: entry.link,
            });
            self.retransmissions += 1;
            entry.retransmissions += 1;
            entry.interval = (entry.interval * 2).min(T2);
            entry.retransmit_at = now + entry.interval;
            self.file(branch, entry);
        }
    }

    /// The earliest retransmission or timeout.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.first().map(|(at, _)| *at)
    }

    /// The next datagram to send.
    pub fn poll_transmit(&mut self) -> Option<Datagram> {
        self.transmits.pop_front()
    }

    /// The next transaction that ended without a final response.
    pub fn poll_outcome(&mut self) -> Option<(Id, Outcome)> {
        self.poll_outcome_counted()
            .map(|(id, outcome, _)| (id, outcome))
    }

    /// As [`poll_outcome`](Self::poll_outcome), with how many times the
    /// request was retransmitted (Timer E) before it timed out.
    pub fn poll_outcome_counted(&mut self) -> Option<(Id, Outcome, u32)> {
        self.outcomes.pop_front()
    }

    /// Transactions in flight.
    pub fn len(&self) -> usize {
        self.by_branch.len()
    }

    /// Whether none is in flight.
    pub fn is_empty(&self) -> bool {
        self.by_branch.is_empty()
    }

    /// Whether transaction `id` is in flight.
    pub fn contains(&self, id: &Id) -> bool {
        self.by_id.contains_key(id)
    }

    /// Retransmissions sent since the start.
    pub fn retransmissions(&self) -> u64 {
        self.retransmissions
    }
}

/// The top `Via` of a request over `link` (`sent_by` over UDP).
fn via(link: Link, sent_by: SocketAddr, branch: &str) -> String {
    match link {
        Link::Udp => format!("SIP/2.0/UDP {sent_by};branch={branch};rport"),
        Link::Stream { transport, sent_by } => {
            let name = match transport {
                StreamTransport::Tcp => "TCP",
                StreamTransport::Tls => "TLS",
            };
            format!("SIP/2.0/{name} {sent_by};branch={branch};rport")
        }
    }
}

#[cfg(test)]
mod tests;
