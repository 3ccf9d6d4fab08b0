//! The `eltex-call-count` notifier (RFC 6665, SPEC §4).
//!
//! Sans-IO: [`Notifier::handle_request`] answers every
//! incoming request at once and queues NOTIFYs, [`Notifier::on_sample`] feeds
//! load samples, [`Notifier::handle_timeout`] expires subscriptions and
//! flushes coalesced updates; the shell sends what
//! [`Notifier::poll_transmit`] yields and sleeps until
//! [`Notifier::poll_timeout`]. No clock, no socket.
//!
//! Policy (SPEC §4):
//!
//! * a SUBSCRIBE is taken only from a subscriber host
//!   ([`NotifierConfig::subscribers`]: the registrars, i.e. the hosts of the
//!   `<dynamic realm>` URIs, plus `<agent allow-subscribers>`), judged by
//!   the request's real source address, and only with a `Contact` that
//!   names such a host by IP address. Anything else gets `403 Forbidden`
//!   before any state is touched: no slot is taken and no NOTIFY is sent,
//!   so the agent cannot be made to send NOTIFYs at a stranger (reflection)
//!   and strangers cannot fill its [`MAX_SUBSCRIPTIONS`] slots (RFC 6665
//!   §6.1, §6.3; SPEC §4). The refusals are logged at warn with target
//!   [`NETWORK`](msr_shared::logging::NETWORK): a stranger can cause them,
//!   so they are rate limited with a suppressed count;
//! * slots: a SUBSCRIBE from a registrar's own address
//!   ([`NotifierConfig::registrars`], the socket a collector registers and
//!   subscribes from) always gets one; from one subscriber address there is
//!   at most one subscription per MSR, a new dialog replacing the old one
//!   (its subscriber restarted and forgot it); other addresses share
//!   [`MAX_SUBSCRIPTIONS`], at most [`SUBSCRIPTIONS_PER_HOST_PER_ACCOUNT`]
//!   per account from one host. So no source, not even another process on
//!   a registrar's host, can take the slots a collector needs; their
//!   subscription lines are rate limited (target `network`);
//! * a NOTIFY a registrar answers `481` makes the shell REGISTER that
//!   account again at once ([`Notifier::poll_forgotten`], SPEC §3);
//! * SUBSCRIBE for `Event: eltex-call-count` → 200 with the granted
//!   `Expires` = min(requested, `max-subscription-expires`) (60 s when the
//!   request has no `Expires`), a new dialog (our To-tag), then at once a
//!   NOTIFY `active;expires=<remaining>`. Any non-zero expiry is granted
//!   (whole seconds: 1 s is the shortest there is, so no request is too
//!   brief and the notifier never answers `423`). `Expires: 0` → 200 and a
//!   final NOTIFY `terminated;reason=timeout`;
//! * a refresh (in-dialog SUBSCRIBE) → 200 and a NOTIFY at once;
//! * the NOTIFYs that RFC 6665 requires after a SUBSCRIBE and the final
//!   `terminated` ones are sent immediately; load updates are rate limited:
//!   a NOTIFY when `load` moved by ≥ `load-delta` since the last NOTIFY of
//!   that subscription, crossed the 100 edge, or when `calls` changed at or
//!   above the high-water mark ([`rule`]), at most one per
//!   `notify-min-interval-ms` (near the top, one per
//!   `notify-top-interval-ms`: with several core hosts the reports are how
//!   each learns the others' calls, SPEC §10). A change inside the window is held and
//!   re-evaluated against the latest sample when the window ends (so three
//!   changes in one second give one NOTIFY carrying the latest);
//! * every NOTIFY carries the engine's state and the MSR's service (SPEC
//!   §14: `engine: up|down|unchecked`, `service: draining`); a change of
//!   either ([`Notifier::set_engine`], [`Notifier::set_service`]) goes to
//!   every subscription at once, outside the one-per-second limit, as the
//!   100 edge would if it were not held: it takes the MSR out of selection
//!   or puts it back;
//! * every NOTIFY carries `sample-age-ms`, how long ago its sample was
//!   taken, by which the collector dates the report's `calls` (SPEC §10);
//! * every NOTIFY carries the MSR's codecs when the config has `<codec>`
//!   (`codecs: pcma,pcmu,h264`, SPEC §4, §15); a reload that changes them
//!   ([`Notifier::reconfigure`]) goes to every subscription at once the
//!   same way, since it changes which legs the MSR may be given;
//! * expiry → `terminated;reason=timeout`; [`Notifier::shutdown`] →
//!   `deactivated`; account removed ([`Notifier::set_accounts`]) →
//!   `noresource`;
//! * another event → 489 with `Allow-Events`; a request in an unknown dialog
//!   → 481; a SUBSCRIBE without Call-ID, From tag, CSeq or Contact → 400; a
//!   SUBSCRIBE for an MSR name that is not one of our accounts → 404;
//! * a NOTIFY answered 481, 408 or another response that ends the usage
//!   ([`ends_subscription`]), or lost (transport failure), drops the
//!   subscription (RFC 6665 §4.2.2): it is removed, its slot freed, and no
//!   further NOTIFY goes out; other errors are logged only;
//! * every final (`terminated`) NOTIFY is tracked until it is answered or
//!   fails ([`Notifier::finals_in_flight`]). After [`Notifier::shutdown`]
//!   the shell waits for them, at most [`FINAL_NOTIFY_GRACE`], before it
//!   unregisters: a registrar that handles the unregister first ends the
//!   subscription and answers the `deactivated` NOTIFY 481.
//!
//! Route sets (`Record-Route`) are not supported: NOTIFYs go straight to the
//! subscriber's Contact, which is how the collector subscribes.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use msr_shared::event_package::{EngineState, LoadReport, Service, CONTENT_TYPE};
use msr_shared::media::CodecList;
use msr_shared::sip::{self, Method, Request, Response, TerminationReason};
use msr_shared::token_bucket::TokenBucket;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::load::Sample;

mod notify;
pub mod rule;
mod subscribe;
#[cfg(test)]
mod tests;

pub use rule::{NotifyGate, NotifyRule, Reported, Verdict, DEFAULT_HIGH_WATER};

/// The most subscriptions from sources that are not a registrar's address
/// the notifier keeps at once; a new SUBSCRIBE past it gets `503 Service
/// Unavailable` with `Retry-After: 60`. A cluster has one subscription per
/// core host and MSR name, from the registrars' own addresses, which are
/// not counted here.
pub const MAX_SUBSCRIPTIONS: usize = 256;

/// The methods the agent's port serves (RFC 3261 §20.5), in the `Allow` of
/// its `405` and `501` answers.
pub const ALLOW: &str = "SUBSCRIBE, OPTIONS";

/// Subscriptions one host that is not a registrar's address may hold, per
/// account: room for a few collectors behind one address, no more.
pub const SUBSCRIPTIONS_PER_HOST_PER_ACCOUNT: usize = 4;

/// The expiry granted when a SUBSCRIBE carries no `Expires` (SPEC §4's
/// default subscription length).
pub const DEFAULT_EXPIRES: u32 = 60;
/// How long after [`Notifier::shutdown`] the final NOTIFYs may stay
/// unanswered: past it [`Notifier::handle_timeout`] stops waiting for them
/// (a subscriber that is gone must not hold up the shutdown).
pub const FINAL_NOTIFY_GRACE: Duration = Duration::from_secs(2);

/// What the notifier needs from the config (SPEC §2, §4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotifierConfig {
    /// `<general load-delta>`: percentage points of `load` movement that
    /// trigger a NOTIFY.
    pub load_delta: u8,
    /// `<agent notify-high-water>`: at or above this `load` every change of
    /// `calls` is worth a NOTIFY (SPEC §4, [`rule`]).
    pub high_water: u8,
    /// `<agent notify-min-interval-ms>`: minimum time between two NOTIFYs
    /// of one subscription (final ones and those answering a SUBSCRIBE
    /// excepted).
    pub notify_min_interval: Duration,
    /// `<agent notify-top-interval-ms>`: the same near the top (`load` at
    /// or above `high_water`, [`rule`]).
    pub notify_top_interval: Duration,
    /// `<agent max-subscription-expires>`: the longest expiry granted, seconds.
    pub max_expires: u32,
    /// `host:port` of the agent's endpoint, used in `Contact`.
    pub contact_host_port: String,
    /// The MSR names subscriptions may be for (`msr_name` of the accounts).
    pub accounts: BTreeSet<String>,
    /// The hosts that may SUBSCRIBE and receive NOTIFYs (SPEC §4): the
    /// registrars' addresses and `<agent allow-subscribers>`, canonical
    /// ([`IpAddr::to_canonical`]: an IPv4-mapped IPv6 address as IPv4).
    pub subscribers: BTreeSet<IpAddr>,
    /// The registrars' own SIP addresses (each `<dynamic realm>` URI's
    /// address and port): a collector subscribes from the socket it
    /// registers on (SPEC §4), so a SUBSCRIBE from one of these is a
    /// registrar's and always gets its slot (module docs, "Slots").
    pub registrars: BTreeSet<SocketAddr>,
    /// `<codec>`: what the MSR's media takes, in its priority order, sent
    /// in every NOTIFY as `codecs:` (SPEC §4, §15); `None`: not known, the
    /// line is left out and the collector takes the MSR as able to take
    /// anything, as before §15.
    pub codecs: Option<CodecList>,
}

/// Requests from hosts that are not subscribers (SPEC §4) answered per
/// second, over all of them: a stranger's flood, or one with a forged
/// source address, gets at most this many 403s (and 405s, 481s) back; the
/// rest are dropped unanswered, as RFC 3261 §18.3 lets a server drop what
/// it will not serve. A subscriber host's requests are always answered.
pub const STRANGER_ANSWERS_PER_SEC: f64 = 20.0;

/// How many such answers may go at once, after a quiet spell.
pub const STRANGER_ANSWER_BURST: f64 = 50.0;

/// Identifies one subscription for the shell (request id ↔ subscription).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubscriptionId(pub u64);

impl fmt::Display for SubscriptionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A NOTIFY to send, with the subscription it belongs to.
#[derive(Debug)]
pub struct NotifyTransmit {
    /// The subscription; pass it back with the response or failure.
    pub subscription: SubscriptionId,
    /// The NOTIFY's CSeq number; pass it back with a failure (a response
    /// carries its own).
    pub cseq: u32,
    /// The request (Via and Max-Forwards are the endpoint's).
    pub request: Request,
}

/// A read-only view of one subscription (for tests and logs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionInfo {
    /// The id.
    pub id: SubscriptionId,
    /// The MSR name the subscription is for.
    pub msr: String,
    /// The dialog's Call-ID.
    pub call_id: String,
    /// When it expires.
    pub expires_at: Instant,
    /// NOTIFYs sent so far.
    pub notify_count: u64,
}

#[derive(Debug)]
struct Subscription {
    id: SubscriptionId,
    msr: String,
    call_id: String,
    local_tag: String,
    remote_tag: String,
    /// The SUBSCRIBE's To value without tag: our side of the dialog.
    local_uri: String,
    /// The SUBSCRIBE's From value, tag included.
    remote: String,
    /// The subscriber's Contact URI (remote target, RFC 3261 §12.1.1).
    remote_target: String,
    /// The `Event` value as received (keeps an `id` parameter).
    event: String,
    local_cseq: u32,
    remote_cseq: u32,
    expires_at: Instant,
    /// The last NOTIFY and a change held for the end of the window (SPEC §4).
    gate: NotifyGate,
    notify_count: u64,
    /// Where the SUBSCRIBE that made it came from (canonical).
    source: Option<SocketAddr>,
    /// `source` is one of [`NotifierConfig::registrars`].
    from_registrar: bool,
}

type DialogKey = (String, String, String);

/// The sans-IO notifier (see the module docs).
#[derive(Debug)]
pub struct Notifier {
    config: NotifierConfig,
    /// The answers left for requests from hosts that may not subscribe
    /// ([`STRANGER_ANSWERS_PER_SEC`]).
    strangers: TokenBucket,
    latest: Sample,
    /// When `latest` was taken (`None`: the initial one, never sampled).
    latest_at: Option<Instant>,
    /// What the engine probe last saw (SPEC §14).
    engine: EngineState,
    /// Whether the MSR takes new legs (SPEC §14, `msr-agent drain`).
    service: Service,
    subs: HashMap<SubscriptionId, Subscription>,
    dialogs: HashMap<DialogKey, SubscriptionId>,
    next_id: u64,
    transmit: VecDeque<NotifyTransmit>,
    shut_down: bool,
    /// Final NOTIFYs sent and not answered yet: subscription → CSeq. The
    /// subscription itself is already gone.
    finals: HashMap<SubscriptionId, u32>,
    /// Set by [`Notifier::shutdown`]: when waiting for `finals` ends.
    finals_deadline: Option<Instant>,
    /// Registrars that answered a NOTIFY `481`: `(account, registrar
    /// address)`, for the shell to REGISTER that account again at once
    /// (SPEC §3: the registrar may have lost the binding).
    forgotten: VecDeque<(String, SocketAddr)>,
}

impl Notifier {
    /// A notifier reporting `initial` until the first [`on_sample`](Self::on_sample).
    pub fn new(config: NotifierConfig, initial: Sample) -> Self {
        Self {
            strangers: TokenBucket::full(STRANGER_ANSWER_BURST),
            config,
            latest: initial,
            latest_at: None,
            engine: EngineState::Unchecked,
            service: Service::Active,
            subs: HashMap::new(),
            dialogs: HashMap::new(),
            next_id: 1,
            transmit: VecDeque::new(),
            shut_down: false,
            finals: HashMap::new(),
            finals_deadline: None,
            forgotten: VecDeque::new(),
        }
    }

    /// The active subscriptions, ordered by id.
    pub fn subscriptions(&self) -> Vec<SubscriptionInfo> {
        let mut out: Vec<_> = self
            .subs
            .values()
            .map(|s| SubscriptionInfo {
                id: s.id,
                msr: s.msr.clone(),
                call_id: s.call_id.clone(),
                expires_at: s.expires_at,
                notify_count: s.notify_count,
            })
            .collect();
        out.sort_by_key(|s| s.id);
        out
    }

    /// The next NOTIFY to send.
    pub fn poll_transmit(&mut self) -> Option<NotifyTransmit> {
        self.transmit.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) must be called next:
    /// the earliest expiry or end of a rate-limit window with a held change,
    /// and after [`shutdown`](Self::shutdown) the end of the wait for the
    /// final NOTIFYs while some are unanswered.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let finals = self.finals_deadline.filter(|_| !self.finals.is_empty());
        self.subs
            .values()
            .map(|s| {
                let window = s.gate.held_until();
                window.map_or(s.expires_at, |w| w.min(s.expires_at))
            })
            .chain(finals)
            .min()
    }

    /// How many final (`terminated`) NOTIFYs are sent and neither answered
    /// nor failed yet; 0 once [`handle_timeout`](Self::handle_timeout) has
    /// run [`FINAL_NOTIFY_GRACE`] after [`shutdown`](Self::shutdown).
    pub fn finals_in_flight(&self) -> usize {
        self.finals.len()
    }

    /// Expires subscriptions and sends held load changes whose window ended;
    /// after [`shutdown`](Self::shutdown), stops waiting for unanswered final
    /// NOTIFYs once [`FINAL_NOTIFY_GRACE`] is over.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self
            .finals_deadline
            .is_some_and(|d| now >= d && !self.finals.is_empty())
        {
            warn!(
                unanswered = self.finals.len(),
                "final notifies not answered in time, going on"
            );
            self.finals.clear();
        }
        let mut ids: Vec<SubscriptionId> = self.subs.keys().copied().collect();
        ids.sort();
        for id in ids {
            let Some(sub) = self.subs.get(&id) else {
                continue;
            };
            if now >= sub.expires_at {
                self.terminate(now, id, TerminationReason::Timeout);
                continue;
            }
            if sub.gate.due(now) {
                self.evaluate(now, id);
            }
        }
    }

    /// How long to wait for the next load sample, given the configured
    /// `sample-interval-ms`: shorter near the top ([`NotifyRule::sample_interval`]).
    pub fn sample_interval(&self, configured: Duration) -> Duration {
        self.rule().sample_interval(configured, self.latest.load)
    }

    /// A new load sample: NOTIFYs where `load` moved enough (see module docs).
    pub fn on_sample(&mut self, now: Instant, sample: Sample) {
        self.latest = sample;
        self.latest_at = Some(now);
        let mut ids: Vec<SubscriptionId> = self.subs.keys().copied().collect();
        ids.sort();
        for id in ids {
            self.evaluate(now, id);
        }
    }

    /// The engine probe saw a change (SPEC §14): every subscription gets a
    /// NOTIFY carrying it now, whatever the rate limit (module docs).
    pub fn set_engine(&mut self, now: Instant, engine: EngineState) {
        if self.engine != engine {
            self.engine = engine;
            self.notify_every_subscription(now);
        }
    }

    /// The MSR started or ended a drain (SPEC §14): every subscription
    /// gets a NOTIFY carrying it now, whatever the rate limit.
    pub fn set_service(&mut self, now: Instant, service: Service) {
        if self.service != service {
            self.service = service;
            self.notify_every_subscription(now);
        }
    }

    /// The engine state and service every NOTIFY carries.
    pub fn reported_state(&self) -> (EngineState, Service) {
        (self.engine, self.service)
    }

    fn notify_every_subscription(&mut self, now: Instant) {
        let mut ids: Vec<SubscriptionId> = self.subs.keys().copied().collect();
        ids.sort();
        for id in ids {
            self.send_active(now, id);
        }
    }

    /// Applies a reloaded config: a new `load-delta`, rate limit and maximum
    /// expiry apply at once (held changes are re-evaluated); subscriptions for
    /// MSR names no longer configured end with `noresource`; then those
    /// whose host is no longer a subscriber host are dropped
    /// ([`set_subscribers`](Self::set_subscribers)); new codecs go to every
    /// subscription left at once, whatever the rate limit, as an engine
    /// state change does ([`set_engine`](Self::set_engine)).
    pub fn reconfigure(&mut self, now: Instant, config: NotifierConfig) {
        let accounts = config.accounts.clone();
        let subscribers = config.subscribers.clone();
        let codecs_changed = config.codecs != self.config.codecs;
        self.config = config;
        // Accounts first: a subscription for a removed account gets its
        // `noresource` NOTIFY (SPEC §4) even when its registrar was that
        // account's alone and leaves the subscriber hosts with it.
        self.set_accounts(now, accounts);
        self.set_subscribers(subscribers);
        if codecs_changed {
            // Which legs the MSR may take changed (SPEC §15): every core
            // must know before it selects again, not a second later.
            self.notify_every_subscription(now);
        }
        // After a NOTIFY above this finds nothing new on that subscription:
        // one NOTIFY per subscription, carrying the latest sample too.
        let latest = self.latest;
        self.on_sample(now, latest);
    }

    /// Sets the subscriber hosts ([`NotifierConfig::subscribers`]); a
    /// subscription whose NOTIFYs go to a host no longer among them is
    /// dropped without a final NOTIFY (NOTIFYs go to subscriber hosts only).
    pub fn set_subscribers(&mut self, subscribers: BTreeSet<IpAddr>) {
        self.config.subscribers = subscribers
            .into_iter()
            .map(|ip| ip.to_canonical())
            .collect();
        let mut gone: Vec<SubscriptionId> = self
            .subs
            .values()
            .filter(|s| {
                !sip::uri_socket_addr(&s.remote_target).is_some_and(|t| self.is_subscriber(t.ip()))
            })
            .map(|s| s.id)
            .collect();
        gone.sort();
        for id in gone {
            self.drop_subscription(id, "subscriber host no longer allowed");
        }
    }

    /// Sets the registrars' addresses ([`NotifierConfig::registrars`]), as
    /// a registrar host name resolves anew.
    pub fn set_registrars(&mut self, registrars: BTreeSet<SocketAddr>) {
        self.config.registrars = registrars
            .into_iter()
            .map(|s| SocketAddr::new(s.ip().to_canonical(), s.port()))
            .collect();
    }

    /// Sets the MSR names that may be subscribed to; subscriptions for names
    /// no longer present end with `terminated;reason=noresource`.
    pub fn set_accounts(&mut self, now: Instant, accounts: BTreeSet<String>) {
        let mut gone: Vec<SubscriptionId> = self
            .subs
            .values()
            .filter(|s| !accounts.contains(&s.msr))
            .map(|s| s.id)
            .collect();
        gone.sort();
        self.config.accounts = accounts;
        for id in gone {
            self.terminate(now, id, TerminationReason::Noresource);
        }
    }

    /// Ends every subscription with `terminated;reason=deactivated`; new
    /// SUBSCRIBEs are refused with 503 from now on. The final NOTIFYs are
    /// waited for (see [`finals_in_flight`](Self::finals_in_flight)) until
    /// `now + FINAL_NOTIFY_GRACE`.
    pub fn shutdown(&mut self, now: Instant) {
        self.shut_down = true;
        self.finals_deadline = Some(now + FINAL_NOTIFY_GRACE);
        let mut ids: Vec<SubscriptionId> = self.subs.keys().copied().collect();
        ids.sort();
        for id in ids {
            self.terminate(now, id, TerminationReason::Deactivated);
        }
    }

    /// The final response to a NOTIFY of subscription `id` (a locally
    /// generated 408 for a transaction timeout included).
    pub fn handle_notify_response(
        &mut self,
        _now: Instant,
        id: SubscriptionId,
        response: &Response,
    ) {
        if let Some((cseq, _)) = sip::cseq(&response.headers) {
            self.final_answered(id, cseq);
        }
        let code = response.status_code.code();
        if (200..300).contains(&code) {
            return;
        }
        if code == 481 {
            if let Some(sub) = self.subs.get(&id).filter(|s| s.from_registrar) {
                if let Some(source) = sub.source {
                    self.forgotten.push_back((sub.msr.clone(), source));
                }
            }
        }
        if ends_subscription(code) {
            self.drop_subscription(id, &format!("notify answered {code}"));
        } else if self.subs.contains_key(&id) {
            warn!(subscription = %id, status = code, "notify refused");
        }
    }

    /// The next registrar that answered a NOTIFY of this account `481`
    /// (SPEC §3): `(account, registrar address)`.
    pub fn poll_forgotten(&mut self) -> Option<(String, SocketAddr)> {
        self.forgotten.pop_front()
    }

    /// The NOTIFY of subscription `id` with CSeq `cseq` got no response at
    /// all (transport failure).
    pub fn handle_notify_failure(
        &mut self,
        _now: Instant,
        id: SubscriptionId,
        cseq: u32,
        reason: &str,
    ) {
        self.final_answered(id, cseq);
        self.drop_subscription(id, reason);
    }

    /// The NOTIFY `(id, cseq)` is over; if it was a final one, it is no
    /// longer in flight.
    fn final_answered(&mut self, id: SubscriptionId, cseq: u32) {
        if self.finals.get(&id) == Some(&cseq) {
            self.finals.remove(&id);
        }
    }
}

/// Whether a final response to a NOTIFY ends its subscription (RFC 6665
/// §4.2.2): 481 (the subscriber has no such dialog), 408 (a locally
/// generated one for Timer F included) and the responses RFC 5057 §5.1
/// says destroy the usage — 404, 405, 410, 416, 480–485, 489, 501, 604.
/// Any other failure (a 500, a 503, a challenge…) is transient: the
/// subscription stays, and the subscriber's next refresh repairs it.
pub fn ends_subscription(code: u16) -> bool {
    matches!(
        code,
        404 | 405 | 408 | 410 | 416 | 480..=485 | 489 | 501 | 604
    )
}

/// The fields of a sample the rule compares.
fn reported(sample: &Sample) -> Reported {
    Reported {
        load: sample.load,
        calls: sample.calls,
    }
}

fn secs(s: u32) -> Duration {
    Duration::from_secs(u64::from(s))
}

fn dialog_key(request: &Request, local_tag: &str) -> Option<DialogKey> {
    let call_id = sip::call_id(&request.headers)?;
    let remote = sip::header(&request.headers, "From").and_then(sip::tag)?;
    Some((call_id.to_owned(), local_tag.to_owned(), remote))
}

/// Adds `Content-Length: 0` to a bodiless response.
fn finish(mut r: Response) -> Response {
    sip::set_header(&mut r.headers, "Content-Length", "0");
    r
}
