//! The registration client (RFC 3261 §10.2, SPEC §3): one [`Registration`]
//! per `<dynamic>` account.
//!
//! Sans-IO (quinn-proto's shape): the core reads no clock and
//! owns no socket. The shell feeds it [`Registration::handle_response`],
//! [`Registration::handle_failure`] and [`Registration::handle_timeout`] with
//! the current instant, sends whatever [`Registration::poll_transmit`] yields
//! and sleeps until [`Registration::poll_timeout`].
//!
//! Policy:
//!
//! * one Call-ID and one From tag per account per run; the CSeq grows by one
//!   for every REGISTER (credentials retry, 423 retry, refresh, unregister);
//! * 401/407 → a retry with `Authorization`/`Proxy-Authorization` computed
//!   ([`msr_shared::sip::digest`]) from the challenge's digest realm, nonce,
//!   `algorithm` (MD5 or SHA-256) and `qop=auth`, `nc` in 8 hex digits. The
//!   challenge is cached and reused (nc + 1) on refreshes. A new challenge
//!   with the nonce just answered and without `stale=true` means the
//!   credentials are wrong: the attempt fails. A challenge with a new nonce
//!   (or `stale=true`) to a REGISTER that carried credentials is answered
//!   at most [`MAX_CHALLENGES_TO_CREDENTIALS`] time per attempt; the next
//!   one fails the attempt (a registrar answering every REGISTER with a
//!   fresh nonce gets at most three per attempt, attempts spaced by the
//!   backoff, and one warn line each);
//! * 423 → a retry with the `Min-Expires` of the response;
//! * 2xx → registered for the granted expiry (the `expires` parameter of our
//!   own `Contact` in the response, else the `Expires` header, else what was
//!   requested). The refresh is sent [`refresh_delay`] after the response:
//!   45 s (Timer F + 13 s) before expiry where the expiry allows it, so a
//!   refresh lost until Timer F is retried before the binding lapses; a
//!   quarter of the expiry for short ones (the rule: `msr_shared::refresh`,
//!   shared with the collector's SUBSCRIBE refresh). `registration confirmed` is logged at
//!   info when the account becomes registered (first success, first after a
//!   failure or a lapse) and at debug for a routine refresh;
//! * anything else (408 from Timer F, 5xx, a transport failure, wrong
//!   credentials…) → [`RegistrationState::Failed`] and a new attempt after a
//!   capped exponential backoff ([`BACKOFF_BASE`] doubling up to
//!   [`BACKOFF_CAP`]), reset by the next success.
//!
//! Responses are matched on CSeq: a response to anything but the latest
//! REGISTER is ignored.

use std::collections::VecDeque;
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use msr_shared::backoff::Backoff;
use msr_shared::engine::EngineAddresses;
use msr_shared::refresh::refresh_delay;
use msr_shared::sip::digest::{self, Algorithm};
use msr_shared::sip::{self, Method, Request, Response};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::config::Account;

#[cfg(test)]
mod tests;

/// First retry delay after a failed registration attempt.
pub const BACKOFF_BASE: Duration = Duration::from_secs(1);
/// Longest delay between two failed registration attempts.
pub const BACKOFF_CAP: Duration = Duration::from_secs(60);
/// How many challenges answering a REGISTER that carried credentials one
/// attempt answers (a new nonce, or `stale=true`). A registrar that keeps
/// challenging fresh credentials is not helped by more: the attempt fails
/// and the next waits the backoff.
pub const MAX_CHALLENGES_TO_CREDENTIALS: u32 = 1;

/// The `User-Agent` the agent sends (SPEC §3: name and version).
pub fn user_agent() -> String {
    format!("msr-agent/{}", env!("CARGO_PKG_VERSION"))
}

/// What the registration client needs to know about one account and the
/// agent's endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistrationConfig {
    /// The account (SPEC §2 `<dynamic>`).
    pub account: Account,
    /// The address put in the Contact (the endpoint's `bind-addr`).
    pub contact_addr: IpAddr,
    /// The endpoint's bound port.
    pub contact_port: u16,
    /// Name of the host interface that owns `contact_addr` (`lo` on
    /// loopback), the Contact's `iface` parameter (SPEC §3).
    pub iface: String,
    /// The media engine's addresses, carried as Contact URI parameters
    /// ([`msr_shared::engine`]); `None` when `<transport port>` is 0 (no
    /// engine to report).
    pub engine: Option<EngineAddresses>,
    /// Requested expiry in seconds (`<agent register-expires>`).
    pub expires: u32,
}

impl RegistrationConfig {
    /// The Contact URI: `sip:{msr_name}@{bind-addr}:{agent port}` and the
    /// engine's parameters (SPEC §3); `sips:` toward a `sips:` realm
    /// (RFC 3261 §19.1.2: the registrar reaches it over the TLS
    /// connection of the REGISTER), `;transport=tcp` toward a TCP one
    /// (over the TCP connection of the REGISTER).
    pub fn contact_uri(&self) -> String {
        let addr = std::net::SocketAddr::new(self.contact_addr, self.contact_port);
        format!(
            "{}:{}@{addr}{}{}",
            self.scheme(),
            self.account.msr_name,
            if self.account.realm.is_tcp() {
                ";transport=tcp"
            } else {
                ""
            },
            self.engine.map(|e| e.uri_params()).unwrap_or_default()
        )
    }

    /// `sips` for a `sips:` realm, else `sip`.
    fn scheme(&self) -> &'static str {
        if self.account.realm.is_sips() {
            "sips"
        } else {
            "sip"
        }
    }

    /// The address of record: `sip:{msr_name}@{realm host[:port]}`
    /// (`sips:` for a `sips:` realm).
    pub fn aor(&self) -> String {
        format!(
            "{}:{}@{}",
            self.scheme(),
            self.account.msr_name,
            self.account.realm.host_port()
        )
    }
}

/// Registration state, for logs and tests.
///
/// ```text
/// Unregistered ──start──► Registering ──2xx──► Registered ──refresh──► Registering
///                              │ 4xx/5xx/408/timeout        ▲
///                              ▼                            │
///                            Failed ───backoff elapsed──────┘ (via Registering)
/// any ──unregister──► Unregistering ──final response──► Unregistered
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistrationState {
    /// No binding, nothing in flight.
    Unregistered,
    /// A REGISTER is in flight (first attempt, credentials retry or refresh).
    Registering,
    /// The registrar holds our binding.
    Registered,
    /// The last attempt failed; a retry is scheduled.
    Failed,
    /// The `Expires: 0` REGISTER is in flight.
    Unregistering,
}

impl fmt::Display for RegistrationState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Unregistered => "unregistered",
            Self::Registering => "registering",
            Self::Registered => "registered",
            Self::Failed => "failed",
            Self::Unregistering => "unregistering",
        })
    }
}

/// The cached digest challenge (RFC 3261 §22.4) and how often it was used.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Challenge {
    /// `true` for 407 (`Proxy-Authorization`), `false` for 401.
    proxy: bool,
    digest: digest::Challenge,
    /// Nonce count of the last use.
    nc: u32,
}

/// The sans-IO registration client of one account (see the module docs).
#[derive(Debug)]
pub struct Registration {
    config: RegistrationConfig,
    call_id: String,
    from_tag: String,
    cseq: u32,
    state: RegistrationState,
    /// The expiry currently asked for (raised by a 423).
    requested: u32,
    /// The CSeq of the request in flight, if any.
    in_flight: Option<u32>,
    /// Whether the request in flight is the unregister.
    unregistering: bool,
    /// Set once the unregister has completed (or failed): nothing more is sent.
    finished: bool,
    /// The cached challenge, used for every REGISTER until replaced.
    challenge: Option<Challenge>,
    /// Whether the request in flight carried credentials for `challenge`.
    sent_credentials: bool,
    /// Challenges to credentialed REGISTERs answered in this attempt
    /// (see [`MAX_CHALLENGES_TO_CREDENTIALS`]).
    challenged_credentials: u32,
    /// When to send the next REGISTER (refresh or retry).
    next_attempt: Option<Instant>,
    /// When the current binding lapses, if registered.
    expires_at: Option<Instant>,
    backoff: Backoff,
    transmit: VecDeque<Request>,
}

impl Registration {
    /// A client that sends its first REGISTER at `now`.
    pub fn new(config: RegistrationConfig, now: Instant) -> Self {
        let requested = config.expires;
        Self {
            config,
            call_id: format!("{}@msr-agent", sip::random_token()),
            from_tag: sip::random_token(),
            cseq: 0,
            state: RegistrationState::Unregistered,
            requested,
            in_flight: None,
            unregistering: false,
            finished: false,
            challenge: None,
            sent_credentials: false,
            challenged_credentials: 0,
            next_attempt: Some(now),
            expires_at: None,
            backoff: Backoff::new(BACKOFF_BASE, BACKOFF_CAP),
            transmit: VecDeque::new(),
        }
    }

    /// The configuration this client was built from.
    pub fn config(&self) -> &RegistrationConfig {
        &self.config
    }

    /// The current state.
    pub fn state(&self) -> RegistrationState {
        self.state
    }

    /// Whether a REGISTER waits for its final response.
    pub fn in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// The Call-ID shared by every REGISTER of this run.
    #[cfg(test)]
    pub(crate) fn call_id(&self) -> &str {
        &self.call_id
    }

    /// When the current binding lapses, if registered.
    #[cfg(test)]
    pub(crate) fn expires_at(&self) -> Option<Instant> {
        self.expires_at
    }

    /// REGISTERs again now (a refresh, same Call-ID, next CSeq) unless one
    /// is in flight or the account is unregistering: its registrar answered
    /// a NOTIFY of this account `481` and may have lost the binding (SPEC
    /// §3). A retry waiting out its backoff goes now too.
    pub fn register_now(&mut self, now: Instant) {
        if self.finished || self.unregistering || self.in_flight.is_some() {
            return;
        }
        self.next_attempt = Some(now);
    }

    /// Changes the expiry requested from the next REGISTER on (hot reload).
    pub fn set_expires(&mut self, expires: u32) {
        self.config.expires = expires;
        self.requested = expires;
    }

    /// Whether the client has nothing more to do: the unregister was answered
    /// (or failed).
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// The next REGISTER to send, if any.
    pub fn poll_transmit(&mut self) -> Option<Request> {
        self.transmit.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.finished {
            return None;
        }
        if self.in_flight.is_some() {
            // RFC 3261 §10.2: no new REGISTER while one is in flight; the
            // binding may still lapse at the registrar meanwhile.
            return self
                .expires_at
                .filter(|_| self.state == RegistrationState::Registered);
        }
        self.next_attempt
    }

    /// Sends the due refresh or retry; a binding whose refresh is still
    /// unanswered when it expires is no longer registered (RFC 3261
    /// §10.2.4: the registrar has dropped it), which is logged at warn.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.finished {
            return;
        }
        if self.in_flight.is_some() {
            if self.state == RegistrationState::Registered
                && self.expires_at.is_some_and(|e| now >= e)
            {
                self.expires_at = None;
                warn!(
                    msr = %self.config.account.msr_name,
                    realm = %self.config.account.realm,
                    "registration lapsed: the registrar has not answered its refresh (retransmitted until RFC 3261 Timer F, 32 s)"
                );
                self.set_state(RegistrationState::Registering);
            }
            return;
        }
        if let Some(at) = self.next_attempt {
            if now >= at {
                self.next_attempt = None;
                if self.expires_at.is_some_and(|e| now >= e) {
                    self.expires_at = None;
                }
                self.challenged_credentials = 0;
                self.send(now);
            }
        }
    }

    /// Starts the unregister (`Expires: 0`, RFC 3261 §10.2.2): at shutdown or
    /// when the account is removed from the config. A request still in
    /// flight is abandoned (its response will not match the CSeq).
    pub fn unregister(&mut self, now: Instant) {
        if self.finished || self.unregistering {
            return;
        }
        self.unregistering = true;
        self.next_attempt = None;
        self.set_state(RegistrationState::Unregistering);
        self.push_register(now);
    }

    /// A final response to one of our REGISTERs (a locally generated 408 for
    /// a transaction timeout included).
    pub fn handle_response(&mut self, now: Instant, response: &Response) {
        let Some((cseq, method)) = sip::cseq(&response.headers) else {
            return;
        };
        if method != "REGISTER"
            || self.in_flight != Some(cseq)
            || sip::call_id(&response.headers) != Some(self.call_id.as_str())
        {
            return;
        }
        self.in_flight = None;
        let code = response.status_code.code();
        match code {
            200..=299 => self.on_success(now, response),
            401 | 407 => self.on_challenge(now, response, code == 407),
            423 => self.on_too_brief(now, response),
            // The registrar's Warning says why (RFC 3261 §20.43; the
            // collector names the refused credentials or MSR).
            _ => {
                let mut reason = response.status_code.to_string();
                if let Some(text) =
                    sip::header(&response.headers, "Warning").and_then(Self::warn_text)
                {
                    reason = format!("{reason} ({})", msr_shared::logging::printable(text, 200));
                }
                self.on_failure(now, &reason)
            }
        }
    }

    /// The REGISTER in flight ended without any response (transport error).
    pub fn handle_failure(&mut self, now: Instant, reason: &str) {
        if self.in_flight.is_none() {
            return;
        }
        self.in_flight = None;
        self.on_failure(now, reason);
    }

    fn on_success(&mut self, now: Instant, response: &Response) {
        self.backoff.reset();
        self.challenged_credentials = 0;
        if self.unregistering {
            self.finish();
            return;
        }
        let granted = self.granted_expires(response);
        if granted == 0 {
            self.on_failure(now, "registrar granted expires 0");
            return;
        }
        self.expires_at = Some(now + Duration::from_secs(u64::from(granted)));
        self.next_attempt = Some(now + refresh_delay(granted));
        if self.state == RegistrationState::Registered {
            // A routine refresh: every few tens of seconds per account.
            debug!(
                msr = %self.config.account.msr_name,
                realm = %self.config.account.realm,
                expires = granted,
                "registration confirmed"
            );
        } else {
            // The account becomes registered: the first time in this run
            // (an account whose config changed gets a new client), or again
            // after a failure or a lapse.
            self.set_state(RegistrationState::Registered);
            info!(
                msr = %self.config.account.msr_name,
                realm = %self.config.account.realm,
                expires = granted,
                "registration confirmed"
            );
        }
    }

    fn on_challenge(&mut self, now: Instant, response: &Response, proxy: bool) {
        let name = if proxy {
            "Proxy-Authenticate"
        } else {
            "WWW-Authenticate"
        };
        let challenge = sip::header_all(&response.headers, name)
            .into_iter()
            .filter_map(digest::Challenge::parse)
            // Prefer SHA-256 when the registrar offers both (RFC 7616 §3.7).
            .min_by_key(|c| u8::from(c.algorithm != Algorithm::Sha256));
        let Some(challenge) = challenge else {
            self.on_failure(now, "challenge without a usable digest");
            return;
        };
        if self.sent_credentials {
            let repeated = self
                .challenge
                .as_ref()
                .is_some_and(|c| c.digest.nonce == challenge.nonce && c.proxy == proxy);
            if repeated && !challenge.stale {
                self.challenge = None;
                self.on_failure(now, "credentials rejected");
                return;
            }
            // A new nonce (or `stale=true`) for credentials just sent: the
            // old nonce may have expired, so answer it — once. A registrar
            // that challenges every answer afresh would otherwise get a
            // REGISTER per round trip for ever.
            if self.challenged_credentials >= MAX_CHALLENGES_TO_CREDENTIALS {
                self.challenge = None;
                self.on_failure(now, "registrar challenged fresh credentials again");
                return;
            }
            self.challenged_credentials += 1;
        }
        self.challenge = Some(Challenge {
            proxy,
            digest: challenge,
            nc: 0,
        });
        self.push_register(now);
    }

    fn on_too_brief(&mut self, now: Instant, response: &Response) {
        let min = sip::header(&response.headers, "Min-Expires").and_then(|v| v.parse::<u32>().ok());
        match min {
            Some(min) if min > self.requested && !self.unregistering => {
                info!(
                    msr = %self.config.account.msr_name,
                    requested = self.requested,
                    min_expires = min,
                    "interval too brief, retrying with min-expires"
                );
                self.requested = min;
                self.push_register(now);
            }
            _ => self.on_failure(now, "423 without a usable min-expires"),
        }
    }

    fn on_failure(&mut self, now: Instant, reason: &str) {
        if self.unregistering {
            warn!(msr = %self.config.account.msr_name, realm = %self.config.account.realm, %reason, "unregister failed");
            self.finish();
            return;
        }
        let delay = self.backoff.next_delay();
        self.next_attempt = Some(now + delay);
        warn!(
            msr = %self.config.account.msr_name,
            realm = %self.config.account.realm,
            %reason,
            retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            "registration failed"
        );
        self.set_state(RegistrationState::Failed);
    }

    fn finish(&mut self) {
        self.finished = true;
        self.expires_at = None;
        self.next_attempt = None;
        self.set_state(RegistrationState::Unregistered);
    }

    fn send(&mut self, now: Instant) {
        if !matches!(self.state, RegistrationState::Registered) || self.expires_at.is_none() {
            self.set_state(RegistrationState::Registering);
        }
        self.push_register(now);
    }

    fn set_state(&mut self, to: RegistrationState) {
        if self.state != to {
            info!(
                msr = %self.config.account.msr_name,
                realm = %self.config.account.realm,
                from = %self.state,
                to = %to,
                "registration state changed"
            );
            self.state = to;
        }
    }

    /// The text of a `Warning` value (`399 host "text"`, RFC 3261 §20.43).
    fn warn_text(value: &str) -> Option<&str> {
        let start = value.find('"')? + 1;
        let end = value.rfind('"')?;
        value.get(start..end).filter(|t| !t.is_empty())
    }

    /// The granted expiry of a 2xx: our Contact's `expires`, else `Expires`,
    /// else what we asked for (RFC 3261 §10.2.4).
    fn granted_expires(&self, response: &Response) -> u32 {
        let ours = self.config.contact_uri();
        for value in sip::header_all(&response.headers, "Contact") {
            for contact in sip::split_outside_quotes(value, ',') {
                if same_contact(sip::addr_uri(contact), &ours) {
                    if let Some(e) = sip::param(contact, "expires").and_then(|e| e.parse().ok()) {
                        return e;
                    }
                }
            }
        }
        sip::expires(&response.headers).unwrap_or(self.requested)
    }

    /// Queues a REGISTER with the next CSeq (and credentials when a
    /// challenge is cached).
    fn push_register(&mut self, now: Instant) {
        self.cseq = self.cseq.wrapping_add(1).max(1);
        let expires = if self.unregistering {
            0
        } else {
            self.requested
        };
        let account = &self.config.account;
        let aor = self.config.aor();
        let mut headers = vec![
            ("From", format!("<{aor}>;tag={}", self.from_tag)),
            ("To", format!("<{aor}>")),
            ("Call-ID", self.call_id.clone()),
            ("CSeq", format!("{} REGISTER", self.cseq)),
            (
                "Contact",
                format!(
                    "<{}>;iface={}",
                    self.config.contact_uri(),
                    self.config.iface
                ),
            ),
            ("Expires", expires.to_string()),
            ("User-Agent", user_agent()),
        ];
        let request = match sip::request(
            Method::Register,
            &account.realm.uri,
            Vec::new(),
            Vec::new(),
        ) {
            Ok(r) => r,
            Err(e) => {
                // The config validated the URI, so this is not expected; do
                // not spin: fail and back off.
                warn!(msr = %account.msr_name, realm = %account.realm, error = %e, "cannot build register");
                self.in_flight = None;
                let delay = self.backoff.next_delay();
                self.next_attempt = Some(now + delay);
                return;
            }
        };
        let uri = request.uri.to_string();
        self.sent_credentials = false;
        if let Some(ch) = self.challenge.as_mut() {
            // `nc` is 8 hex digits (RFC 7616 §3.4): after 2^32 − 1 uses
            // of one nonce, go without credentials for a fresh challenge.
            match ch.nc.checked_add(1) {
                None => self.challenge = None,
                Some(nc) => {
                    ch.nc = nc;
                    let name = if ch.proxy {
                        "Proxy-Authorization"
                    } else {
                        "Authorization"
                    };
                    headers.push((
                        name,
                        digest::authorization(
                            &ch.digest,
                            &account.auth_name,
                            &account.auth_password,
                            "REGISTER",
                            &uri,
                            nc,
                            &sip::random_token(),
                        ),
                    ));
                    self.sent_credentials = true;
                }
            }
        }
        let mut request = request;
        for (name, value) in headers {
            sip::push_header(&mut request.headers, name, value);
        }
        sip::push_header(&mut request.headers, "Content-Length", "0");
        self.in_flight = Some(self.cseq);
        self.transmit.push_back(request);
    }
}

/// Whether two SIP URIs name the same contact (scheme, user, host, port;
/// case-insensitive host, parameters ignored).
fn same_contact(a: &str, b: &str) -> bool {
    fn key(u: &str) -> String {
        u.split(';').next().unwrap_or(u).trim().to_ascii_lowercase()
    }
    key(a) == key(b)
}
