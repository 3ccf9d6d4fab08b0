//! MSR contact health (SPEC §5): `healthy`, `unreported`, `unreachable`,
//! `stale`, judged from the load subscription's state, the age of the last
//! report and an OPTIONS keepalive (RFC 3261 §11) to each registered contact.
//!
//! [`HealthMonitor`] is sans-IO. The shell tells it which contacts are
//! registered ([`HealthMonitor::contact_registered`],
//! [`HealthMonitor::contact_removed`]), what the subscriber saw
//! ([`HealthMonitor::report_received`], [`HealthMonitor::subscription_changed`]),
//! and the final responses to the keepalives it asked to send
//! ([`HealthMonitor::handle_response`], [`HealthMonitor::handle_failure`]);
//! it wakes it at [`HealthMonitor::poll_timeout`] and drains
//! [`HealthMonitor::poll_transmit`] (OPTIONS to send) and
//! [`HealthMonitor::poll_event`] (health changes, for the load table and
//! the log).
//!
//! Health is its own axis: the operator's `active` flag and registration
//! status are kept elsewhere and never read here (a contact is here exactly
//! while it is registered).
//!
//! What a contact's condition is at `now`, first match wins:
//!
//! ```text
//! subscription failed or ended for good (rejected, noresource),
//!   or `misses` keepalives in a row missed                    ─▶ unreachable
//! the agent reports its media engine down (`engine: down`),
//!   or the failures cores reported tripped the MSR (SPEC §14)  ─▶ engine_down
//! the agent reports the MSR draining (`service: draining`)    ─▶ draining
//! no load report yet, `unreported_grace` after registering   ─▶ unreported
//! last report older than the subscription's expiry           ─▶ stale
//! otherwise (including a new contact inside the grace)        ─▶ healthy
//! ```
//!
//! The published health follows the condition at once towards any unhealthy
//! state. Back to `healthy` it moves only after two good signals in a row
//! (an answered keepalive, an accepted load report) with no bad one (a
//! missed keepalive, a failed subscription) between, so a contact that
//! answers every other probe does not flap. A good signal while unhealthy
//! probes at once, so the second one follows within a round trip: a
//! restarted agent is healthy again right after its first fresh NOTIFY.
//!
//! Keepalive timing per contact:
//!
//! ```text
//!   idle ──interval──▶ probe in flight ──2xx within timeout──▶ idle (misses = 0)
//!                           │ no answer within timeout, non-2xx, transport failure
//!                           ▼
//!                      miss: misses += 1 ── misses < N ──▶ probe again at once
//!                                         └─ misses ≥ N ──▶ unreachable, probe every interval
//! ```
//!
//! With the defaults (5 s, 2 s, 2 misses) a contact that stops answering
//! is `unreachable` within 5 + 2 × 2 = 9 s. A keepalive answered after its
//! timeout is ignored (its transaction id is forgotten at the miss). The
//! first probe of a new contact goes at a phase within the interval drawn
//! from a hash of its name, so a thousand contacts that registered at once
//! are probed evenly, not in one burst.
//!
//! The failures a core reports (SPEC §14, [`HealthMonitor::core_failure`])
//! trip an MSR when `[health] failure_timeouts` timeouts or
//! `failure_errors` errors fall within `failure_window_secs` (a 486, a 603
//! or another answer about the caller counts nothing). A tripped MSR stays
//! out for its hold (`failure_hold_secs`); after it, the next good signal
//! (an answered keepalive, a report whose engine is not down) brings it
//! back; an agent reporting its engine up again after down brings it back
//! at once. Tripping again within a hold of its return doubles the hold
//! (up to [`MAX_FAILURE_HOLD`]): an engine that answers its probe but fails
//! every call does not flap.
//!
//! Log lines: each change is an event with `log` set, except that at most
//! [`LOGGED_CHANGES_PER_WINDOW`] changes per contact are logged per
//! [`LOG_WINDOW`]; the rest are counted, and when the window closes an
//! [`HealthEvent::Suppressed`] names the count and the health then.
//!
//! Architecture invariant: no I/O, no clock, no task; `now` is always given.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::time::Duration;

use msr_shared::sip::{self, Method, Request, StatusCode};
use msr_shared::subscription::SubscriptionState;
use rsipstack::sip::StatusCodeKind;
use tokio::time::Instant;

use crate::config::DEFAULT_SUBSCRIPTION_EXPIRES_SECS;
use crate::config::{FailureLimits, HealthConfig, MAX_FAILURE_HOLD};
use crate::operator::names::{ContactName, MsrName};
use msr_shared::event_package::{EngineState, Service};

/// Good signals in a row that bring an unhealthy contact back (SPEC §5).
pub const RECOVERY_SIGNALS: u32 = 2;

/// The window of the log rate limit.
pub const LOG_WINDOW: Duration = Duration::from_secs(60);

/// Changes of one contact logged per [`LOG_WINDOW`].
pub const LOGGED_CHANGES_PER_WINDOW: u32 = 4;

/// Identifies a keepalive the monitor asked to send: its final response
/// comes back with it ([`HealthMonitor::handle_response`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProbeId(u64);

/// The health of one MSR contact (SPEC §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Health {
    /// Subscribed, reporting, answering; selection may use it.
    Healthy,
    /// Registered, no load report yet, past the grace.
    Unreported,
    /// The subscription failed or the keepalive went unanswered.
    Unreachable,
    /// The last report is older than the subscription's expiry.
    Stale,
    /// The agent answers, but the media engine beside it does not (its
    /// report says so), or the failures cores reported tripped the MSR
    /// (SPEC §14). Live legs stay; no new ones.
    EngineDown,
    /// The MSR asked for no new legs (`msr-agent drain`, SPEC §14). Live
    /// legs stay.
    Draining,
}

impl Health {
    /// `healthy`, `unreported`, `unreachable`, `stale`, `engine_down` or
    /// `draining`.
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Healthy => "healthy",
            Health::Unreported => "unreported",
            Health::Unreachable => "unreachable",
            Health::Stale => "stale",
            Health::EngineDown => "engine_down",
            Health::Draining => "draining",
        }
    }
}

/// A failure a core reported for a leg it could not place on the MSR it
/// was given (SPEC §14), as the control protocol, HTTP and the redirect
/// spell it (`failure=`): `timeout`, a SIP status (`503`), `error` or
/// `load-limit` (rtpengine's answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureCause {
    /// No answer from the engine, or a 408.
    Timeout,
    /// A 5xx from the engine.
    ServerError(u16),
    /// rtpengine answered an error.
    EngineError,
    /// rtpengine answered that it is at its load limit.
    LoadLimit,
    /// Another final answer (a 486, a 603, a 404…): about the caller or
    /// the callee, not the MSR; it moves the leg but counts nothing.
    NotTheMsr(u16),
    /// A `load-limit` or a `503` from an MSR whose last report put it near
    /// the top ([`FailureCause::near_top`]): the MSR full, as it said. It
    /// moves the leg and counts nothing (the code: 503, or 0 for
    /// `load-limit`).
    FullNearTop(u16),
}

/// The reported share of its `max-calls` (percent) at or above which an
/// MSR's `load-limit` or `503` is taken as the MSR full, not failing: the
/// agent's default high-water mark (SPEC §4), above which it reports every
/// change of `calls`.
pub const NEAR_TOP_PERCENT: u32 = 80;

/// Whether a report of `calls` of `max_calls` is at or above
/// [`NEAR_TOP_PERCENT`].
pub fn near_top(calls: u32, max_calls: u32) -> bool {
    max_calls > 0 && u64::from(calls) * 100 >= u64::from(NEAR_TOP_PERCENT) * u64::from(max_calls)
}

/// The two counts a failure may go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FailureClass {
    Timeout,
    Error,
}

impl FailureCause {
    /// Reads a wire spelling; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "timeout" | "408" => Some(Self::Timeout),
            "error" => Some(Self::EngineError),
            "load-limit" | "load_limit" => Some(Self::LoadLimit),
            digits => match digits.parse::<u16>() {
                Ok(code @ 500..=599) => Some(Self::ServerError(code)),
                Ok(code @ 300..=699) => Some(Self::NotTheMsr(code)),
                _ => None,
            },
        }
    }

    /// The `cause` label of `/metrics` and the log: `timeout`, `5xx`,
    /// `engine_error`, `load_limit`, `full_near_top` or `not_the_msr`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::ServerError(_) => "5xx",
            Self::EngineError => "engine_error",
            Self::LoadLimit => "load_limit",
            Self::FullNearTop(_) => "full_near_top",
            Self::NotTheMsr(_) => "not_the_msr",
        }
    }

    /// This failure of an MSR whose last report said `calls` of
    /// `max_calls`: a `load-limit` or a `503` at or above
    /// [`NEAR_TOP_PERCENT`] is [`FailureCause::FullNearTop`]. With several
    /// core hosts (SPEC §10) one host learns the others' calls only from
    /// the reports, so near the top a leg now and then reaches an MSR that
    /// just filled; counted as errors, those races took full MSRs out of
    /// selection for whole holds and the pool lost their room as their
    /// calls ended (BALANCING.md, "Failover"). An MSR that says it is full
    /// far below the top still counts: its engine's limit is not the one
    /// it reports.
    pub fn near_top(self, calls: u32, max_calls: u32) -> Self {
        let near = near_top(calls, max_calls);
        match self {
            Self::LoadLimit if near => Self::FullNearTop(0),
            Self::ServerError(503) if near => Self::FullNearTop(503),
            other => other,
        }
    }

    fn class(self) -> Option<FailureClass> {
        match self {
            Self::Timeout => Some(FailureClass::Timeout),
            Self::ServerError(_) | Self::EngineError | Self::LoadLimit => Some(FailureClass::Error),
            Self::NotTheMsr(_) | Self::FullNearTop(_) => None,
        }
    }
}

impl fmt::Display for FailureCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ServerError(code) | Self::NotTheMsr(code) | Self::FullNearTop(code @ 1..) => {
                write!(f, "{code}")
            }
            Self::FullNearTop(_) => f.write_str("load-limit"),
            Self::Timeout => f.write_str("timeout"),
            Self::EngineError => f.write_str("error"),
            Self::LoadLimit => f.write_str("load-limit"),
        }
    }
}

impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a contact's health changed, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// It registered (the first health of a contact).
    Registered,
    /// `keepalive_misses` keepalives in a row went unanswered.
    KeepaliveMissed,
    /// The load subscription failed.
    SubscriptionFailed,
    /// The notifier ended the load subscription for good
    /// (`terminated;reason=rejected` or `noresource`, RFC 6665 §4.1.3): no
    /// report comes until the MSR registers again.
    SubscriptionEnded,
    /// The grace passed without a load report.
    NoReport,
    /// The last report grew older than the subscription's expiry.
    ReportAged,
    /// Two good signals in a row.
    Recovered,
    /// The agent reports its media engine down (SPEC §14).
    EngineReportedDown,
    /// Cores reported `failure_timeouts` timeouts within the window.
    CoreTimeouts,
    /// Cores reported `failure_errors` errors within the window.
    CoreErrors,
    /// The agent reports the MSR draining.
    Draining,
}

impl Cause {
    /// Snake-case name for log fields.
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Registered => "registered",
            Cause::KeepaliveMissed => "keepalive_missed",
            Cause::SubscriptionFailed => "subscription_failed",
            Cause::SubscriptionEnded => "subscription_ended",
            Cause::NoReport => "no_report",
            Cause::ReportAged => "report_aged",
            Cause::Recovered => "recovered",
            Cause::EngineReportedDown => "engine_reported_down",
            Cause::CoreTimeouts => "core_timeouts",
            Cause::CoreErrors => "core_errors",
            Cause::Draining => "draining",
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A contact's health changed (or was first set).
#[derive(Debug, Clone, PartialEq)]
pub struct HealthChange {
    /// Contact name `{iface}@{msr}`.
    pub contact: ContactName,
    /// MSR name.
    pub msr: MsrName,
    /// The health before; `None` for a new contact.
    pub from: Option<Health>,
    /// The health now.
    pub to: Health,
    /// When it changed.
    pub at: Instant,
    /// Why.
    pub cause: Cause,
    /// Whether the rate limit lets this change be logged.
    pub log: bool,
}

/// What the monitor reports.
#[derive(Debug, Clone, PartialEq)]
pub enum HealthEvent {
    /// A contact's health changed.
    Changed(HealthChange),
    /// The rate-limit window of a contact closed with `count` changes not
    /// logged; `health` is its health now.
    Suppressed {
        /// Contact name.
        contact: ContactName,
        /// Changes not logged in the window.
        count: u32,
        /// The health at the window's end.
        health: Health,
    },
    /// A core reported a failure of `msr` (SPEC §14); `tripped` when it
    /// took the MSR out of selection.
    CoreFailure {
        /// The MSR.
        msr: MsrName,
        /// What the core saw.
        cause: FailureCause,
        /// Whether this failure tripped the MSR.
        tripped: bool,
    },
}

/// An OPTIONS to send in a client transaction that gives up after
/// `keepalive_timeout`, whose final response (or failure) is handed back
/// with the same `id`.
#[derive(Debug, Clone)]
pub struct Probe {
    /// Correlates the final response.
    pub id: ProbeId,
    /// The contact probed.
    pub contact: ContactName,
    /// The OPTIONS (without `Via`; the endpoint adds it).
    pub request: Request,
}

/// Per-MSR inputs: the subscription and the last report.
#[derive(Debug, Clone)]
struct MsrState {
    contacts: BTreeSet<ContactName>,
    subscription_failed: bool,
    /// The notifier ended the subscription without a retry.
    subscription_ended: bool,
    last_report: Option<Instant>,
    /// A report older than this is stale: the subscription's expiry.
    stale_after: Duration,
    /// The last report said `engine: down`.
    engine_down: bool,
    /// The last report said `service: draining`.
    draining: bool,
    /// Failures cores reported within the window, oldest first.
    failures: VecDeque<(Instant, FailureClass)>,
    /// Tripped by the cores' failures: why, and until when at least.
    tripped: Option<Trip>,
    /// When it last came back from a trip, and the hold it had.
    returned: Option<(Instant, Duration)>,
}

/// An MSR out of selection for the failures cores reported.
#[derive(Debug, Clone, Copy)]
struct Trip {
    cause: Cause,
    until: Instant,
    hold: Duration,
}

impl MsrState {
    fn new() -> Self {
        Self {
            contacts: BTreeSet::new(),
            subscription_failed: false,
            subscription_ended: false,
            last_report: None,
            stale_after: Duration::from_secs(u64::from(DEFAULT_SUBSCRIPTION_EXPIRES_SECS)),
            engine_down: false,
            draining: false,
            failures: VecDeque::new(),
            tripped: None,
            returned: None,
        }
    }

    /// Ends a trip: the MSR may be selected again once its contacts
    /// have their good signals.
    fn end_trip(&mut self, now: Instant) {
        if let Some(trip) = self.tripped.take() {
            self.returned = Some((now, trip.hold));
        }
    }
}

/// The cause a trip is logged with, if `failures` within `limits` trip.
fn trips(failures: &VecDeque<(Instant, FailureClass)>, limits: &FailureLimits) -> Option<Cause> {
    let timeouts = failures
        .iter()
        .filter(|(_, c)| *c == FailureClass::Timeout)
        .count();
    let errors = failures.len() - timeouts;
    if u32::try_from(timeouts).unwrap_or(u32::MAX) >= limits.timeouts {
        Some(Cause::CoreTimeouts)
    } else if u32::try_from(errors).unwrap_or(u32::MAX) >= limits.errors {
        Some(Cause::CoreErrors)
    } else {
        None
    }
}

/// The log rate limit of one contact.
#[derive(Debug, Clone, Copy)]
struct LogWindow {
    start: Instant,
    logged: u32,
    suppressed: u32,
}

#[derive(Debug, Clone)]
struct ContactState {
    msr: MsrName,
    uri: String,
    health: Health,
    since: Instant,
    registered_at: Instant,
    misses: u32,
    /// `misses` reached the limit and no keepalive was answered since.
    keepalive_down: bool,
    /// Good signals since the last bad one.
    good_streak: u32,
    /// The keepalive in flight: its id and when it counts as missed.
    in_flight: Option<(ProbeId, Instant)>,
    /// When the next keepalive goes (while none is in flight).
    next_probe: Instant,
    /// The deadline under which it is filed in `HealthMonitor::timers`.
    armed: Option<Instant>,
    log: LogWindow,
}

/// The health of every registered MSR contact (module docs).
#[derive(Debug)]
pub struct HealthMonitor {
    config: HealthConfig,
    /// Our `From`/`Contact` URI.
    local_uri: String,
    contacts: BTreeMap<ContactName, ContactState>,
    msrs: HashMap<MsrName, MsrState>,
    /// Keepalive id → contact.
    in_flight: HashMap<ProbeId, ContactName>,
    /// Keepalives given up on before their answer (counted as missed,
    /// replaced, or their contact gone), for the transaction layer to
    /// stop: at most one keepalive per contact is ever in flight.
    abandoned: VecDeque<ProbeId>,
    next_id: u64,
    /// `(deadline, contact)` of every contact; mirrors `ContactState::armed`.
    timers: BTreeSet<(Instant, ContactName)>,
    transmits: VecDeque<Probe>,
    events: VecDeque<HealthEvent>,
}

/// A phase in `[0, interval)` from the contact's name (FNV-1a), so first
/// probes are spread evenly and the same in every run.
fn phase(contact: &str, interval: Duration) -> Duration {
    let hash = contact.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let millis = u64::try_from(interval.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    Duration::from_millis(hash % millis)
}

impl HealthMonitor {
    /// A monitor with no contacts; `local_uri` is the collector's SIP URI
    /// (`From` and `Contact` of the keepalives).
    pub fn new(config: HealthConfig, local_uri: String) -> Self {
        Self {
            config,
            local_uri,
            contacts: BTreeMap::new(),
            msrs: HashMap::new(),
            in_flight: HashMap::new(),
            abandoned: VecDeque::new(),
            next_id: 0,
            timers: BTreeSet::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// The health of `contact` and since when, if it is registered.
    pub fn health(&self, contact: &str) -> Option<(Health, Instant)> {
        self.contacts.get(contact).map(|c| (c.health, c.since))
    }

    /// Takes a reloaded `[health]`: intervals, timeout, misses and grace
    /// apply from each contact's next keepalive and evaluation on.
    pub fn set_config(&mut self, config: HealthConfig) {
        self.config = config;
    }

    /// How long a keepalive may go unanswered: its transaction's timeout.
    pub fn keepalive_timeout(&self) -> Duration {
        self.config.keepalive_timeout
    }

    /// Number of keepalives in flight.
    pub fn probes_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// `contact` of `msr` is registered at `uri` (a new binding or a
    /// refresh). A new contact starts `healthy` inside its grace; a refresh
    /// keeps its health. A new URI (the agent restarted on another port)
    /// forgets the misses of the old one and is probed at once.
    pub fn contact_registered(
        &mut self,
        now: Instant,
        contact: &ContactName,
        msr: &MsrName,
        uri: &str,
    ) {
        if let Some(c) = self.contacts.get_mut(contact) {
            if c.msr != *msr {
                // Moved to another MSR: start again under the new one.
                self.contact_removed(now, contact);
            } else {
                if c.uri != uri {
                    c.uri = uri.to_owned();
                    c.misses = 0;
                    c.keepalive_down = false;
                    if let Some((id, _)) = c.in_flight.take() {
                        self.in_flight.remove(&id);
                        self.abandoned.push_back(id);
                    }
                    c.next_probe = now;
                }
                self.evaluate(now, contact);
                return;
            }
        }
        let msr_state = self.msrs.entry(msr.clone()).or_insert_with(MsrState::new);
        msr_state.contacts.insert(contact.clone());
        self.contacts.insert(
            contact.clone(),
            ContactState {
                msr: msr.clone(),
                uri: uri.to_owned(),
                health: Health::Healthy,
                since: now,
                registered_at: now,
                misses: 0,
                keepalive_down: false,
                good_streak: 0,
                in_flight: None,
                next_probe: now + phase(contact, self.config.keepalive_interval),
                armed: None,
                log: LogWindow {
                    start: now,
                    logged: 0,
                    suppressed: 0,
                },
            },
        );
        self.events.push_back(HealthEvent::Changed(HealthChange {
            contact: contact.clone(),
            msr: msr.clone(),
            from: None,
            to: Health::Healthy,
            at: now,
            cause: Cause::Registered,
            log: false,
        }));
        self.evaluate(now, contact);
    }

    /// `contact` is no longer registered: its keepalive stops with it.
    pub fn contact_removed(&mut self, _now: Instant, contact: &str) {
        let Some((name, c)) = self.contacts.remove_entry(contact) else {
            return;
        };
        if let Some(at) = c.armed {
            self.timers.remove(&(at, name));
        }
        if let Some((id, _)) = c.in_flight {
            self.in_flight.remove(&id);
            self.abandoned.push_back(id);
        }
        if let Some(m) = self.msrs.get_mut(&c.msr) {
            m.contacts.remove(contact);
            if m.contacts.is_empty() {
                self.msrs.remove(&c.msr);
            }
        }
    }

    /// The subscriber accepted a load report from `msr` (a good signal for
    /// each of its contacts) saying its engine is `engine` and its service
    /// `service` (SPEC §14).
    pub fn report_received(
        &mut self,
        now: Instant,
        msr: &str,
        engine: EngineState,
        service: Service,
    ) {
        let Some(m) = self.msrs.get_mut(msr) else {
            return;
        };
        m.last_report = Some(now);
        let down = engine == EngineState::Down;
        if m.engine_down && !down {
            // The agent saw its engine answer again: whatever the cores
            // reported against it was that engine's outage.
            m.end_trip(now);
        }
        m.engine_down = down;
        m.draining = service == Service::Draining;
        // Thousands of reports a second: the set is lent out for the loop
        // (nothing it calls reads an MSR's contacts), not copied.
        let contacts = std::mem::take(&mut m.contacts);
        for contact in &contacts {
            // While unhealthy, the keepalive goes at once: its answer is
            // the second good signal (a keepalive answer itself waits for
            // the interval, or an answering contact would be probed in a
            // loop).
            // A keepalive still in flight was sent while the contact was
            // silent: it is replaced, not waited for.
            if let Some(c) = self.contacts.get_mut(contact) {
                if c.health != Health::Healthy && c.good_streak.saturating_add(1) < RECOVERY_SIGNALS
                {
                    if let Some((id, _)) = c.in_flight.take() {
                        self.in_flight.remove(&id);
                        self.abandoned.push_back(id);
                    }
                    c.next_probe = now;
                }
            }
            self.good_signal(now, contact);
        }
        if let Some(m) = self.msrs.get_mut(msr) {
            m.contacts = contacts;
        }
    }

    /// [`HealthMonitor::core_failure`] with `cause` as `msr`'s last load
    /// report in `table` explains it: a full MSR near the top says so and
    /// is not failing ([`FailureCause::near_top`]). What the collector's
    /// failover and msr-sim both call. Returns whether it tripped the MSR.
    pub fn core_failure_given_report(
        &mut self,
        now: Instant,
        msr: &str,
        cause: FailureCause,
        table: &crate::model::load_table::LoadTable,
    ) -> bool {
        self.core_failure(now, msr, table.failure_given_report(msr, cause))
    }

    /// A core could not place a leg on `msr` for `cause` (SPEC §14).
    /// Returns whether this failure tripped the MSR. A failure that is not
    /// the MSR's, or of an MSR not registered, counts nothing; one while
    /// tripped adds nothing (the MSR is already out).
    pub fn core_failure(&mut self, now: Instant, msr: &str, cause: FailureCause) -> bool {
        let limits = self.config.failures;
        let Some((name, m)) = self.msrs.get_key_value(msr) else {
            return false;
        };
        let msr = name.clone();
        let mut event = HealthEvent::CoreFailure {
            msr: msr.clone(),
            cause,
            tripped: false,
        };
        let (Some(class), None) = (cause.class(), m.tripped) else {
            self.events.push_back(event);
            return false;
        };
        let Some(m) = self.msrs.get_mut(&msr) else {
            return false;
        };
        while m
            .failures
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= limits.window)
        {
            m.failures.pop_front();
        }
        m.failures.push_back((now, class));
        let Some(why) = trips(&m.failures, &limits) else {
            self.events.push_back(event);
            return false;
        };
        m.failures.clear();
        let hold = match m.returned {
            Some((back, last)) if now < back + last => (last * 2).min(MAX_FAILURE_HOLD),
            _ => limits.hold,
        };
        m.tripped = Some(Trip {
            cause: why,
            until: now + hold,
            hold,
        });
        if let HealthEvent::CoreFailure { tripped, .. } = &mut event {
            *tripped = true;
        }
        self.events.push_back(event);
        for contact in m.contacts.clone() {
            if let Some(c) = self.contacts.get_mut(&contact) {
                c.good_streak = 0;
            }
            self.evaluate(now, &contact);
        }
        true
    }

    /// Whether the failures cores reported keep `msr` out of selection
    /// at `now`, and until when at least.
    pub fn tripped_until(&self, msr: &str) -> Option<Instant> {
        self.msrs.get(msr)?.tripped.map(|t| t.until)
    }

    /// The subscription to `msr` is now `status`, granted (or requested)
    /// for `expires_secs`. `failed` is a bad signal for each contact.
    pub fn subscription_changed(
        &mut self,
        now: Instant,
        msr: &str,
        status: &SubscriptionState,
        expires_secs: u32,
    ) {
        let Some(m) = self.msrs.get_mut(msr) else {
            return;
        };
        let failed = *status == SubscriptionState::Failed;
        let ended = matches!(status, SubscriptionState::Terminated(reason)
            if reason.as_ref().is_some_and(|r| !r.may_retry()));
        let newly_failed = (failed && !m.subscription_failed) || (ended && !m.subscription_ended);
        m.subscription_failed = failed;
        m.subscription_ended = ended;
        let secs = if expires_secs > 0 {
            expires_secs
        } else {
            DEFAULT_SUBSCRIPTION_EXPIRES_SECS
        };
        m.stale_after = Duration::from_secs(u64::from(secs));
        for contact in m.contacts.clone() {
            if newly_failed {
                if let Some(c) = self.contacts.get_mut(&contact) {
                    c.good_streak = 0;
                }
            }
            self.evaluate(now, &contact);
        }
    }

    /// The final response to keepalive `id`: a 2xx is a good signal; any
    /// other status is a miss (RFC 3261 §11.2 lets a UA answer OPTIONS as
    /// it would an INVITE, but an agent that answers 4xx–6xx is not
    /// serving). An answer after the keepalive's timeout is ignored.
    pub fn handle_response(&mut self, now: Instant, id: ProbeId, status: &StatusCode) {
        let Some(contact) = self.in_flight.remove(&id) else {
            return;
        };
        if let Some(c) = self.contacts.get_mut(&contact) {
            c.in_flight = None;
        }
        if status.kind() == StatusCodeKind::Successful {
            if let Some(c) = self.contacts.get_mut(&contact) {
                c.misses = 0;
                c.keepalive_down = false;
            }
            self.good_signal(now, &contact);
        } else {
            self.miss(now, &contact);
        }
    }

    /// Keepalive `id` ended without a final response (a transport
    /// failure): a miss.
    pub fn handle_failure(&mut self, now: Instant, id: ProbeId) {
        let Some(contact) = self.in_flight.remove(&id) else {
            return;
        };
        if let Some(c) = self.contacts.get_mut(&contact) {
            c.in_flight = None;
        }
        self.miss(now, &contact);
    }

    /// The earliest instant [`HealthMonitor::handle_timeout`] has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.first().map(|(at, _)| *at)
    }

    /// Does what is due at `now`: missed keepalives, keepalives to send,
    /// graces and report ages that ran out, log windows that closed.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some((at, contact)) = self.timers.first().cloned() {
            if at > now {
                break;
            }
            self.timers.remove(&(at, contact.clone()));
            if let Some(c) = self.contacts.get_mut(&contact) {
                c.armed = None;
            }
            self.evaluate(now, &contact);
        }
    }

    /// The next keepalive to send.
    pub fn poll_transmit(&mut self) -> Option<Probe> {
        self.transmits.pop_front()
    }

    /// The next health event.
    pub fn poll_event(&mut self) -> Option<HealthEvent> {
        self.events.pop_front()
    }

    /// The next keepalive given up on before its answer: its transaction
    /// is to be stopped (its answer, if any, is ignored here anyway).
    pub fn poll_abandoned(&mut self) -> Option<ProbeId> {
        self.abandoned.pop_front()
    }

    /// A good signal for `contact`: counts towards recovery. While its
    /// MSR's engine is reported down, or its trip's hold runs, it counts
    /// nothing; the first one after the hold ends the trip.
    fn good_signal(&mut self, now: Instant, contact: &ContactName) {
        let Some(c) = self.contacts.get_mut(contact) else {
            return;
        };
        if let Some(m) = self.msrs.get_mut(&c.msr) {
            if m.engine_down || m.tripped.is_some_and(|t| now < t.until) {
                c.good_streak = 0;
                self.evaluate(now, contact);
                return;
            }
            if m.tripped.is_some() {
                m.end_trip(now);
            }
        }
        c.good_streak = c.good_streak.saturating_add(1);
        self.evaluate(now, contact);
    }

    /// A missed keepalive: a bad signal; below the limit the contact is
    /// probed again at once.
    fn miss(&mut self, now: Instant, contact: &ContactName) {
        let limit = self.config.keepalive_misses;
        let interval = self.config.keepalive_interval;
        let Some(c) = self.contacts.get_mut(contact) else {
            return;
        };
        c.misses = c.misses.saturating_add(1);
        c.good_streak = 0;
        if c.misses >= limit {
            c.keepalive_down = true;
            c.next_probe = c.next_probe.max(now).min(now + interval);
        } else {
            c.next_probe = now;
        }
        self.evaluate(now, contact);
    }

    /// The condition of `c` at `now` (module docs) and why.
    fn condition(&self, c: &ContactState, now: Instant) -> (Health, Cause) {
        let m = self.msrs.get(&c.msr);
        if c.keepalive_down {
            return (Health::Unreachable, Cause::KeepaliveMissed);
        }
        if m.is_some_and(|m| m.subscription_failed) {
            return (Health::Unreachable, Cause::SubscriptionFailed);
        }
        if m.is_some_and(|m| m.subscription_ended) {
            return (Health::Unreachable, Cause::SubscriptionEnded);
        }
        if m.is_some_and(|m| m.engine_down) {
            return (Health::EngineDown, Cause::EngineReportedDown);
        }
        if let Some(trip) = m.and_then(|m| m.tripped) {
            return (Health::EngineDown, trip.cause);
        }
        if m.is_some_and(|m| m.draining) {
            return (Health::Draining, Cause::Draining);
        }
        match m.and_then(|m| m.last_report.map(|at| (at, m.stale_after))) {
            None if now >= c.registered_at + self.config.unreported_grace => {
                (Health::Unreported, Cause::NoReport)
            }
            None => (Health::Healthy, Cause::Recovered),
            Some((at, limit)) if now > at + limit => (Health::Stale, Cause::ReportAged),
            Some(_) => (Health::Healthy, Cause::Recovered),
        }
    }

    /// Brings `contact` up to date at `now`: a keepalive missed or due,
    /// its published health, its log window, and its timer.
    fn evaluate(&mut self, now: Instant, contact: &ContactName) {
        // A keepalive past its timeout is a miss (which re-evaluates).
        let overdue = self
            .contacts
            .get(contact)
            .and_then(|c| c.in_flight)
            .filter(|(_, deadline)| *deadline <= now);
        if let Some((id, _)) = overdue {
            self.in_flight.remove(&id);
            self.abandoned.push_back(id);
            if let Some(c) = self.contacts.get_mut(contact) {
                c.in_flight = None;
            }
            self.miss(now, contact);
            return;
        }
        let Some(c) = self.contacts.get(contact) else {
            return;
        };
        let (condition, cause) = self.condition(c, now);
        let change = if condition == Health::Healthy {
            (c.health != Health::Healthy && c.good_streak >= RECOVERY_SIGNALS)
                .then_some((Health::Healthy, Cause::Recovered))
        } else {
            (condition != c.health).then_some((condition, cause))
        };
        let grace_end = c.registered_at + self.config.unreported_grace;
        let stale_at = self
            .msrs
            .get(&c.msr)
            .and_then(|m| m.last_report.map(|at| at + m.stale_after));
        let Some(c) = self.contacts.get_mut(contact) else {
            return;
        };
        if let Some((to, cause)) = change {
            let from = c.health;
            c.health = to;
            c.since = now;
            if to != Health::Healthy {
                c.good_streak = 0;
            }
            let log = if now >= c.log.start + LOG_WINDOW {
                c.log = LogWindow {
                    start: now,
                    logged: 1,
                    suppressed: 0,
                };
                true
            } else if c.log.logged < LOGGED_CHANGES_PER_WINDOW {
                c.log.logged += 1;
                true
            } else {
                c.log.suppressed += 1;
                false
            };
            self.events.push_back(HealthEvent::Changed(HealthChange {
                contact: contact.clone(),
                msr: c.msr.clone(),
                from: Some(from),
                to,
                at: now,
                cause,
                log,
            }));
        }
        // The window closed with changes not logged: say how many.
        if c.log.suppressed > 0 && now >= c.log.start + LOG_WINDOW {
            self.events.push_back(HealthEvent::Suppressed {
                contact: contact.clone(),
                count: c.log.suppressed,
                health: c.health,
            });
            c.log = LogWindow {
                start: now,
                logged: 0,
                suppressed: 0,
            };
        }
        // A keepalive due goes now.
        if c.in_flight.is_none() && c.next_probe <= now {
            self.next_id += 1;
            let id = ProbeId(self.next_id);
            let request = options_request(&c.uri, &self.local_uri);
            match request {
                Some(request) => {
                    c.in_flight = Some((id, now + self.config.keepalive_timeout));
                    c.next_probe = now + self.config.keepalive_interval;
                    self.in_flight.insert(id, contact.clone());
                    self.transmits.push_back(Probe {
                        id,
                        contact: contact.clone(),
                        request,
                    });
                }
                // A contact URI that is no SIP URI (the registrar checked
                // it, so this is not expected) cannot be probed: a miss
                // every interval.
                None => {
                    c.next_probe = now + self.config.keepalive_interval;
                    self.miss(now, contact);
                    return;
                }
            }
        }
        // The next instant something may change for this contact.
        let mut next = match c.in_flight {
            Some((_, deadline)) => deadline,
            None => c.next_probe,
        };
        if self
            .msrs
            .get(&c.msr)
            .is_some_and(|m| m.last_report.is_none())
            && grace_end > now
        {
            next = next.min(grace_end);
        }
        if let Some(at) = stale_at.filter(|at| *at >= now) {
            // Stale once `now > at`: the first instant past it.
            next = next.min(at + Duration::from_millis(1));
        }
        if c.log.suppressed > 0 {
            next = next.min(c.log.start + LOG_WINDOW);
        }
        // A later deadline need not move the timer: when the earlier one
        // fires, evaluation finds nothing due and files the right one. A
        // report pushes the stale deadline back on every NOTIFY; this keeps
        // that from costing a timer update each time.
        if c.armed.is_none_or(|armed| next < armed || armed < now) {
            if let Some(old) = c.armed.take() {
                self.timers.remove(&(old, contact.clone()));
            }
            self.timers.insert((next, contact.clone()));
            c.armed = Some(next);
        }
    }
}

/// The keepalive to `uri`: an out-of-dialog OPTIONS (RFC 3261 §11.1) with
/// a fresh Call-ID, `Accept` of the load body; `None` when `uri` is not a
/// SIP URI.
fn options_request(uri: &str, local_uri: &str) -> Option<Request> {
    sip::request(
        Method::Options,
        uri,
        vec![
            ("From", format!("<{local_uri}>;tag={}", sip::random_token())),
            ("To", format!("<{uri}>")),
            (
                "Call-ID",
                format!("{}-{}", sip::random_token(), sip::random_token()),
            ),
            ("CSeq", "1 OPTIONS".to_owned()),
            ("Contact", format!("<{local_uri}>")),
            ("Accept", msr_shared::event_package::CONTENT_TYPE.to_owned()),
        ],
        Vec::new(),
    )
    .ok()
}

#[cfg(test)]
mod tests;
