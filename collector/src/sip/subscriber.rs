//! The subscriber side of the `eltex-call-count` event package (SPEC §4,
//! RFC 6665 §4.1).
//!
//! [`Subscriber`] is sans-IO. The shell tells it which contacts each MSR has
//! registered ([`Subscriber::contacts_changed`], which borrows the
//! registrar's [`Binding`]s and keeps of them only the contact names and
//! the URI it subscribes to), feeds it the final
//! responses to the requests it asked to send ([`Subscriber::handle_response`],
//! [`Subscriber::handle_failure`]) and the NOTIFYs that arrive
//! ([`Subscriber::handle_notify`], which returns the answer), wakes it at
//! [`Subscriber::poll_timeout`], and drains [`Subscriber::poll_transmit`]
//! (requests to send) and [`Subscriber::poll_event`] (what happened).
//!
//! One subscription per registered MSR, sent to one of its registered
//! contacts (the first by contact name) and moved to another when that one
//! goes. Per subscription:
//!
//! ```text
//!            contacts registered
//! (none) ───────────────────────────▶ Pending ──2xx──▶ Active ──refresh 2xx──▶ Active
//!                                      │  ▲              │ NOTIFY terminated
//!          4xx/5xx/408/481, expiry     │  │ retry_at     ▼
//!          ───────────▶ Failed ────────┘  └──────── Terminated(reason)
//!                                                    (rejected/noresource/invariant:
//!                                                     no retry until a contact registers anew)
//! ```
//!
//! Refresh timing: an in-dialog refresh is sent [`refresh_delay`] after
//! the grant of `E` seconds — 45 s before expiry where `E` allows it, so
//! that a refresh lost until its Timer F is retried before the grant lapses
//! (the rule and its table: `msr_shared::refresh`). Retries after a refusal or failure wait a capped
//! exponential backoff of 1 s doubling to 60 s; a `423` is retried at once
//! with its `Min-Expires`; a `terminated` NOTIFY with a retryable reason
//! resubscribes at once (after `retry-after` when given).
//!
//! Ending a subscription (RFC 6665 §4.1.2.3, §4.4.1): when we send
//! `Expires: 0` (the MSR unregistered, or [`Subscriber::shutdown`]) the
//! notifier answers it and then sends a final NOTIFY with
//! `Subscription-State: terminated`. The subscription is gone by then, so
//! its dialog is kept apart as an *ended* dialog until that NOTIFY arrives,
//! the unsubscribe fails (a non-2xx answer or no answer: no NOTIFY will
//! follow), or [`FINAL_NOTIFY_WAIT`] passes, whichever is first. A NOTIFY in
//! an ended dialog is answered `200` and changes nothing: no load, no
//! counters, no new SUBSCRIBE. Ended dialogs are kept in their own index
//! and deadline set, so they cost O(log n) each and never outlive their
//! deadline.
//!
//! NOTIFY source (SPEC §4): each dialog records the address its last
//! SUBSCRIBE was sent to (the target URI's IP address and port). A NOTIFY
//! in that dialog from any other address — a spoofer who learnt or guessed
//! the Call-ID and tags — is answered `403` before anything is looked at:
//! not its CSeq, not its body, so a higher-CSeq forgery can neither report
//! a load nor make the genuine NOTIFYs that follow look out of order. The
//! same holds for a dialog we ended. A target named by a host name (the
//! agent always registers an IP address, SPEC §3) has no recorded address
//! and is not checked.
//!
//! NOTIFY ordering (RFC 3261 §12.2.2): each dialog remembers the CSeq of
//! the last NOTIFY it accepted. The collector answers statelessly (RFC
//! 3261 §8.2.7), so a retransmission reaches the subscriber: one of the
//! last [`RECENT_NOTIFIES`] NOTIFYs accepted (same CSeq and top `Via`
//! branch) is answered `200` again without any change. Any other NOTIFY
//! with a CSeq not above the last is out of order and is answered `500`
//! without touching the load or the counters.
//!
//! Cost per event (what the collector's loop needs at thousands of NOTIFY/s):
//!
//! * a NOTIFY finds its dialog through a `Call-ID` → MSR index, then checks
//!   the tags: O(1) + O(log n);
//! * deadlines (retry, expiry, refresh) are kept in an ordered set of
//!   `(instant, msr)`, one entry per subscription with a deadline, kept in
//!   sync after each change: [`Subscriber::poll_timeout`] reads its first
//!   entry and [`Subscriber::handle_timeout`] visits only the due ones;
//! * the MSRs whose subscription state or granted expiry changed are
//!   collected in a dirty set drained by [`Subscriber::poll_view_change`],
//!   so the glue pushes only those to the health monitor and the load
//!   table: a NOTIFY that only brings a load (and counts) adds nothing.
//!
//! Architecture invariant: no I/O, no clock, no task; `now` is always given.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use msr_shared::backoff::Backoff;
use msr_shared::event_package::{LoadReport, CONTENT_TYPE, EVENT};
use msr_shared::refresh::refresh_delay;
use msr_shared::sip::{
    self, Method, Request, Response, StatusCode, SubState, SubscriptionStateHeader,
    TerminationReason,
};
use tokio::time::Instant;

use msr_shared::subscription::SubscriptionState;

use crate::operator::names::{ContactName, MsrName};
use crate::sip::not_sent::NotSent;
use crate::sip::registrar::Binding;

/// First retry delay after a failed SUBSCRIBE.
pub const RETRY_BASE: Duration = Duration::from_secs(1);
/// Longest retry delay after repeated failures.
pub const RETRY_CAP: Duration = Duration::from_secs(60);
/// How long a dialog ended by our `Expires: 0` stays known for its final
/// NOTIFY: Timer F (64 × T1), by which the unsubscribe's own transaction
/// has ended.
pub const FINAL_NOTIFY_WAIT: Duration = Duration::from_secs(32);

/// The subscriber's own identity and defaults.
#[derive(Debug, Clone)]
pub struct SubscriberConfig {
    /// Our `From` URI, e.g. `sip:collector@127.0.0.1:5060`.
    pub local_uri: String,
    /// Our `Contact` URI (where NOTIFYs are sent), e.g. `sip:collector@127.0.0.1:5060`.
    pub contact: String,
    /// `Expires` requested unless the operator set one for the MSR, seconds.
    pub default_expires: u32,
}

/// A registered contact of an MSR a subscription goes (or went) to, as
/// taken from its [`Binding`].
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    /// Contact name `{iface}@{msr}`.
    name: ContactName,
    /// Contact URI.
    uri: String,
}

impl Target {
    fn of(binding: &Binding) -> Self {
        Self {
            name: binding.contact.clone(),
            uri: binding.uri.clone(),
        }
    }

    fn is(&self, binding: &Binding) -> bool {
        self.name == binding.contact && self.uri == binding.uri
    }
}

/// The state of the subscription to one MSR, as the subscriber (its one
/// owner) shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct SubscriptionView {
    /// Subscription state.
    pub status: SubscriptionState,
    /// Granted (or requested, while pending) `Expires`, seconds; a load report
    /// older than this is stale.
    pub expires_secs: u32,
    /// NOTIFYs received on the current subscription.
    pub notify_count: u64,
    /// Unix time of the last NOTIFY, seconds.
    pub last_notify_unix: Option<i64>,
    /// Event id of the subscription (e.g. derived from the dialog).
    pub event_id: String,
}

/// Identifies a SUBSCRIBE the subscriber asked to send: its final response
/// comes back with it ([`Subscriber::handle_response`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(u64);

/// A request to send in a client transaction, whose final response (or
/// failure) is handed back with the same `id`.
#[derive(Debug, Clone)]
pub struct Transmit {
    /// Correlates the final response.
    pub id: RequestId,
    /// The MSR the request is for.
    pub msr: MsrName,
    /// Its Call-ID.
    pub call_id: String,
    /// The SUBSCRIBE (without `Via`; the endpoint adds it).
    pub request: Request,
}

/// Why a subscription is tried again ([`SubscriberEvent::Retrying`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryCause {
    /// The SUBSCRIBE got this final non-2xx status (`481`, `503`, …).
    Status(u16),
    /// No final response: the client transaction timed out (RFC 3261
    /// §8.1.3.1 reads that as a `408`).
    TimedOut,
    /// The SUBSCRIBE could not be sent.
    NotSent(NotSent),
    /// The subscription expired without a refresh answered.
    Expired,
    /// The notifier granted `Expires: 0` to a SUBSCRIBE that asked for
    /// more.
    GrantedZero,
    /// The dialog's target (a peer's `Contact`) is no SIP URI.
    BadTarget,
}

impl std::fmt::Display for RetryCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RetryCause::Status(code) => write!(f, "{code}"),
            RetryCause::TimedOut => f.write_str("408"),
            RetryCause::NotSent(reason) => write!(f, "not sent: {reason}"),
            RetryCause::Expired => f.write_str("expired"),
            RetryCause::GrantedZero => f.write_str("granted expires 0"),
            RetryCause::BadTarget => f.write_str("bad target uri"),
        }
    }
}

/// What happened to a subscription, for logs and the load table.
#[derive(Debug, Clone, PartialEq)]
pub enum SubscriberEvent {
    /// A new dialog was established (2xx to the initial SUBSCRIBE).
    Active {
        /// MSR name.
        msr: MsrName,
        /// Dialog Call-ID.
        call_id: String,
        /// The contact subscribed to (empty when none is known).
        contact: String,
        /// Granted duration, seconds.
        expires: u32,
    },
    /// A refresh was accepted.
    Refreshed {
        /// MSR name.
        msr: MsrName,
        /// Dialog Call-ID.
        call_id: String,
        /// Granted duration, seconds.
        expires: u32,
    },
    /// A NOTIFY carried a load report.
    Load {
        /// MSR name.
        msr: MsrName,
        /// The report.
        report: LoadReport,
        /// When it arrived.
        at: Instant,
    },
    /// The notifier ended the subscription (`Subscription-State: terminated`).
    Terminated {
        /// MSR name.
        msr: MsrName,
        /// Dialog Call-ID.
        call_id: String,
        /// The `reason` parameter, if it had one.
        reason: Option<TerminationReason>,
        /// When a new subscription is attempted; `None`: not until the MSR
        /// registers again.
        retry_at: Option<Instant>,
    },
    /// A SUBSCRIBE failed or the subscription expired; a new dialog follows.
    Retrying {
        /// MSR name.
        msr: MsrName,
        /// The failed dialog's Call-ID.
        call_id: String,
        /// Why.
        cause: RetryCause,
        /// Wait before the new SUBSCRIBE.
        delay: Duration,
    },
    /// The subscription was ended by us (`Expires: 0`) or dropped because
    /// the MSR has no registered contact left.
    Ended {
        /// MSR name.
        msr: MsrName,
        /// Call-ID of the dialog that ended; `None` when there was none at
        /// the time (before the first SUBSCRIBE, or between a terminated or
        /// failed dialog and the next).
        call_id: Option<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Initial,
    Refresh,
    Unsubscribe,
}

#[derive(Debug, Clone)]
struct PendingRequest {
    msr: MsrName,
    call_id: String,
    kind: Kind,
    requested: u32,
    /// An unsubscribe sent by [`Subscriber::shutdown`], whose answer the
    /// shell waits for ([`Subscriber::awaited_unsubscribes`]).
    awaited: bool,
}

#[derive(Debug, Clone)]
struct Dialog {
    call_id: String,
    local_tag: String,
    /// The notifier's tag; `None` until the 2xx (or an early NOTIFY) arrives.
    remote_tag: Option<String>,
    /// Request-URI of in-dialog requests (the notifier's Contact).
    remote_target: String,
    /// `To` URI (the contact subscribed to).
    remote_uri: String,
    /// Where the last SUBSCRIBE of this dialog was sent
    /// ([`sip::uri_socket_addr`] of its target): the only source its
    /// NOTIFYs are taken from. `None` for a target named by a host name.
    peer: Option<SocketAddr>,
    cseq: u32,
    /// CSeq of the last NOTIFY accepted in this dialog (RFC 3261 §12.2.2:
    /// the remote sequence number); `None` before the first.
    remote_cseq: Option<u32>,
    /// `(CSeq, top Via branch)` of the last [`RECENT_NOTIFIES`] NOTIFYs
    /// accepted, newest last: a retransmission of one of them is answered
    /// `200` again and changes nothing (module docs).
    recent: VecDeque<(u32, u64)>,
}

/// NOTIFYs per dialog whose retransmissions are recognised: a notifier
/// that sends its next NOTIFY before the last one's `200` arrives (the
/// `200` was lost) retransmits the older one after the newer was taken.
/// The agent sends at most one a second, so this spans half a minute;
/// each is kept as its CSeq and a hash of its branch (12 bytes).
pub const RECENT_NOTIFIES: usize = 32;

/// The hash a dialog keeps of a NOTIFY's branch (FNV-1a): enough to tell
/// a retransmission from another NOTIFY with the same CSeq, which only the
/// dialog's peer can send anyway.
fn branch_hash(branch: &str) -> u64 {
    branch.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A dialog we ended with `Expires: 0`, kept for its final NOTIFY (module
/// docs).
#[derive(Debug, Clone)]
struct EndedDialog {
    local_tag: String,
    remote_tag: String,
    /// [`Dialog::peer`] of the dialog.
    peer: Option<SocketAddr>,
    /// When it is forgotten if no final NOTIFY came.
    deadline: Instant,
    /// Ended by [`Subscriber::shutdown`], whose wait includes its NOTIFY
    /// ([`Subscriber::awaited_final_notifies`]).
    awaited: bool,
}

#[derive(Debug)]
struct Subscription {
    /// Names of the MSR's registered contacts, sorted: to tell a contact
    /// that registers anew (which lifts `blocked`).
    contacts: Vec<ContactName>,
    /// The first registered contact by name: where a new dialog goes.
    first: Target,
    /// The contact the current (or last) dialog went to.
    target: Option<Target>,
    dialog: Option<Dialog>,
    state: SubscriptionState,
    /// `Min-Expires` learnt from a 423: never request less.
    expires_floor: u32,
    /// Last requested or granted duration, seconds.
    expires: u32,
    expires_at: Option<Instant>,
    refresh_at: Option<Instant>,
    retry_at: Option<Instant>,
    backoff: Backoff,
    notify_count: u64,
    last_notify_unix: Option<i64>,
    event_id: String,
    /// After `rejected`/`noresource`/`invariant`: no retry until a contact
    /// registers anew.
    blocked: bool,
    /// The deadline under which this subscription is filed in
    /// `Subscriber::timers`, if any.
    armed: Option<Instant>,
    /// The state and expiry last handed out by
    /// [`Subscriber::poll_view_change`]: only a change of these makes the
    /// subscription dirty (a NOTIFY that only counts does not).
    published: Option<(SubscriptionState, u32)>,
}

impl Subscription {
    fn new(contacts: Vec<ContactName>, first: Target) -> Self {
        Self {
            contacts,
            first,
            target: None,
            dialog: None,
            state: SubscriptionState::Pending,
            expires_floor: 0,
            expires: 0,
            expires_at: None,
            refresh_at: None,
            retry_at: None,
            backoff: Backoff::new(RETRY_BASE, RETRY_CAP),
            notify_count: 0,
            last_notify_unix: None,
            event_id: sip::random_token(),
            blocked: false,
            armed: None,
            published: None,
        }
    }

    /// When [`Subscriber::handle_timeout`] has work for this subscription.
    fn next_deadline(&self) -> Option<Instant> {
        let retry = self.retry_at.filter(|_| !self.blocked);
        [retry, self.expires_at, self.refresh_at]
            .into_iter()
            .flatten()
            .min()
    }

    fn view(&self) -> SubscriptionView {
        SubscriptionView {
            status: self.state.clone(),
            expires_secs: self.expires,
            notify_count: self.notify_count,
            last_notify_unix: self.last_notify_unix,
            event_id: self.event_id.clone(),
        }
    }
}

/// The subscriber: one subscription per MSR with registered contacts.
#[derive(Debug)]
pub struct Subscriber {
    config: SubscriberConfig,
    subs: BTreeMap<MsrName, Subscription>,
    /// Operator overrides of the requested `Expires` (`subscription set`).
    overrides: HashMap<MsrName, u32>,
    pending: HashMap<RequestId, PendingRequest>,
    next_id: u64,
    transmits: VecDeque<Transmit>,
    events: VecDeque<SubscriberEvent>,
    /// Call-ID → MSR of every live dialog (the tags are checked on use).
    dialogs: HashMap<String, MsrName>,
    /// `(deadline, msr)` for every subscription with a deadline; mirrors
    /// `Subscription::armed`.
    timers: BTreeSet<(Instant, MsrName)>,
    /// MSRs whose view may have changed since the last
    /// [`poll_view_change`](Subscriber::poll_view_change).
    dirty: BTreeSet<MsrName>,
    /// Call-ID → dialog ended by our `Expires: 0`, until its final NOTIFY.
    ended: HashMap<String, EndedDialog>,
    /// `(deadline, call_id)` of every ended dialog; mirrors `ended`.
    ended_timers: BTreeSet<(Instant, String)>,
}

impl Subscriber {
    /// A subscriber with no subscriptions.
    pub fn new(config: SubscriberConfig) -> Self {
        Self {
            config,
            subs: BTreeMap::new(),
            overrides: HashMap::new(),
            pending: HashMap::new(),
            next_id: 1,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            dialogs: HashMap::new(),
            timers: BTreeSet::new(),
            dirty: BTreeSet::new(),
            ended: HashMap::new(),
            ended_timers: BTreeSet::new(),
        }
    }

    /// Brings the indexes in line with the subscription to `msr` after a
    /// change: its timer entry, its dialog entry, and the dirty set. Every
    /// public method that changes a subscription ends with this.
    fn touched(&mut self, msr: &MsrName) {
        let Some(sub) = self.subs.get_mut(msr) else {
            self.forget(msr, None);
            return;
        };
        let next = sub.next_deadline();
        if sub.armed != next {
            if let Some(old) = sub.armed.take() {
                self.timers.remove(&(old, msr.clone()));
            }
            if let Some(at) = next {
                self.timers.insert((at, msr.clone()));
            }
            sub.armed = next;
        }
        if let Some(d) = &sub.dialog {
            if self.dialogs.get(&d.call_id).is_none_or(|m| m != msr) {
                self.dialogs.insert(d.call_id.clone(), msr.clone());
            }
        }
        let published = sub
            .published
            .as_ref()
            .is_some_and(|(state, expires)| *state == sub.state && *expires == sub.expires);
        if !published {
            self.dirty.insert(msr.clone());
        }
    }

    /// Drops the timer and dialog entries of a removed subscription (`sub`:
    /// what it was, if known).
    fn forget(&mut self, msr: &MsrName, sub: Option<&Subscription>) {
        if let Some(sub) = sub {
            if let Some(at) = sub.armed {
                self.timers.remove(&(at, msr.clone()));
            }
            if let Some(d) = &sub.dialog {
                self.unindex_dialog(&d.call_id, msr);
            }
        }
        self.dirty.remove(msr);
    }

    /// Removes the dialog index entry of `call_id` if it is `msr`'s.
    fn unindex_dialog(&mut self, call_id: &str, msr: &MsrName) {
        if self.dialogs.get(call_id).is_some_and(|m| m == msr) {
            self.dialogs.remove(call_id);
        }
    }

    /// Clears the dialog of `msr`'s subscription (and its index entry).
    fn drop_dialog(&mut self, msr: &MsrName) {
        if let Some(d) = self.subs.get_mut(msr).and_then(|s| s.dialog.take()) {
            self.unindex_dialog(&d.call_id, msr);
        }
    }

    /// Sets the `Expires` requested without an operator override (a
    /// reloaded `[subscription] expires`), from the next refresh or new
    /// subscription on.
    pub fn set_default_expires(&mut self, expires: u32) {
        self.config.default_expires = expires;
    }

    /// Sets (or clears) the operator's `Expires` for `msr`; it is requested
    /// from the next refresh or new subscription on.
    pub fn set_expires_override(&mut self, msr: &MsrName, expires: Option<u32>) {
        match expires {
            Some(e) => self.overrides.insert(msr.clone(), e),
            None => self.overrides.remove(msr),
        };
    }

    /// The next request to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<SubscriberEvent> {
        self.events.pop_front()
    }

    /// The next subscription whose view may have changed since it was last
    /// returned here, with its current view. A subscription that went away
    /// is not reported (the shell removes the MSR from the table when its
    /// registration goes).
    pub fn poll_view_change(&mut self) -> Option<(MsrName, SubscriptionView)> {
        while let Some(msr) = self.dirty.pop_first() {
            if let Some(sub) = self.subs.get_mut(&msr) {
                sub.published = Some((sub.state.clone(), sub.expires));
                let view = sub.view();
                return Some((msr, view));
            }
        }
        None
    }

    /// The state of the subscription to `msr`.
    pub fn view(&self, msr: &str) -> Option<SubscriptionView> {
        self.subs.get(msr).map(Subscription::view)
    }

    /// How many dialogs ended by our `Expires: 0` are kept for their final
    /// NOTIFY (module docs).
    #[cfg(test)]
    pub(crate) fn ended_dialogs(&self) -> usize {
        self.ended.len()
    }
}

/// Whether a NOTIFY from `source` may be taken in a dialog whose peer is
/// `peer` (module docs): the same IP address, compared canonically (an
/// IPv4-mapped IPv6 source is its IPv4 address), and port; anything from a
/// dialog without a recorded peer.
fn from_peer(peer: Option<SocketAddr>, source: Option<SocketAddr>) -> bool {
    let Some(peer) = peer else {
        return true;
    };
    source.is_some_and(|s| s.ip().to_canonical() == peer.ip() && s.port() == peer.port())
}

mod lifecycle;
mod notify;
mod requests;
mod timers;

#[cfg(test)]
mod tests;
