//! The `rtpengine` calls source (SPEC §2, §11): the session count of a
//! running rtpengine, read over its ng control protocol.
//!
//! The ng protocol is what a SIP proxy drives rtpengine with (Kamailio's
//! `rtpengine` module): a datagram is a cookie, a space and a bencoded
//! dictionary ([`bencode`]); the answer repeats the cookie. Its
//! `statistics` command answers `currentstatistics.sessionsown`, the calls
//! this rtpengine relays itself (not those it only holds for a peer through
//! redis, `sessionsforeign`): the figure rtpengine compares with its own
//! `max-sessions`, and the one reported as `calls`. The ng port is always
//! there where rtpengine is driven by a proxy, and it is the address the
//! agent reports as the media-control address (`<pbyte><mcc>`, SPEC §3),
//! so what the agent reads and what the core is told name one socket;
//! the CLI port (`listen-cli`) is optional and answers text meant for
//! people.
//!
//! Sans-IO, as the registration and notifier cores: [`NgClient`] reads no
//! clock and owns no socket. Each sampling tick the shell calls
//! [`NgClient::ask`], sends what [`NgClient::poll_transmit`] yields, feeds
//! answers to [`NgClient::handle_datagram`] and sleeps until
//! [`NgClient::poll_timeout`]; the [`Answer`] that ends the exchange is the
//! calls figure of that sample. Every figure is the answer to that tick's
//! own request, so a figure is never older than one exchange: when
//! rtpengine does not answer, the sample says so ([`Answer::Failed`]) and
//! the last good count is not reported again as if it were current.
//!
//! A request unanswered for [`RETRANSMIT_AFTER`] is sent again with the same
//! cookie (rtpengine answers a repeated cookie from its cache), at most
//! [`TRIES`] times in all; then the exchange fails, and no request is sent
//! before a capped exponential backoff ([`BACKOFF_BASE`] doubling up to
//! [`BACKOFF_CAP`], `msr_shared::backoff`) has passed: ticks inside it are
//! answered [`AskOutcome::Backoff`]. A good answer resets the backoff.
//!
//! ```text
//!   Idle ──ask──▶ Asking ──answer──▶ Idle
//!                   │ no answer after TRIES, an error, an unreadable answer
//!                   ▼
//!                 Down ──ask at or after retry_at──▶ Asking
//! ```

pub mod bencode;

#[cfg(test)]
mod tests;

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use msr_shared::backoff::Backoff;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use self::bencode::Value;

/// How long an ng request waits for its answer before it is sent again.
/// rtpengine answers `statistics` in about a millisecond; Kamailio's
/// module waits 1 s (`rtpengine_tout_ms`) for an `offer`, which does far
/// more work.
pub const RETRANSMIT_AFTER: Duration = Duration::from_millis(250);
/// Sends of one request (the first and the retransmissions) before the
/// exchange fails: a lost datagram is not an absent rtpengine.
pub const TRIES: u32 = 3;
/// The first wait after a failed exchange.
pub const BACKOFF_BASE: Duration = Duration::from_secs(1);
/// The longest wait between two failed exchanges.
pub const BACKOFF_CAP: Duration = Duration::from_secs(30);

/// How one exchange ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// rtpengine relays this many sessions of its own.
    Sessions(u32),
    /// It did not answer, or answered no count.
    Failed(NgError),
}

/// What [`NgClient::ask`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AskOutcome {
    /// A request is queued (or one is already in flight): its [`Answer`]
    /// follows.
    Asking,
    /// The last exchange failed and its backoff has not passed: nothing is
    /// asked, the engine counts as unavailable for this sample.
    Backoff,
}

/// Why an exchange brought no session count.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NgError {
    /// No answer to any of the [`TRIES`] sends.
    #[error("no answer to {tries} statistics requests {} ms apart", RETRANSMIT_AFTER.as_millis())]
    NoAnswer {
        /// How many were sent.
        tries: u32,
    },
    /// The datagram could not be sent (e.g. the connected socket got
    /// ICMP port unreachable: nothing listens on the ng port).
    #[error("cannot send: {reason}")]
    Send {
        /// The socket's error.
        reason: String,
    },
    /// rtpengine answered `result: error`.
    #[error("rtpengine refused the statistics request: {reason}")]
    Refused {
        /// Its `error-reason`.
        reason: String,
    },
    /// The answer carries our cookie but not a statistics reply.
    #[error("unreadable answer: {detail}")]
    Unreadable {
        /// What is wrong with it.
        detail: String,
    },
}

enum State {
    /// No request in flight.
    Idle,
    /// A request in flight: its cookie, its datagram and how often it was
    /// sent.
    Asking {
        cookie: String,
        datagram: Vec<u8>,
        sent: u32,
        retransmit_at: Instant,
    },
    /// The last exchange failed: nothing is asked before `retry_at`.
    Down { retry_at: Instant },
}

/// The ng client of one rtpengine (module docs).
pub struct NgClient {
    /// The ng address, for logs.
    target: SocketAddr,
    /// Makes this run's cookies unlike another run's (rtpengine keeps the
    /// answers of recent cookies and would answer a restarted agent's first
    /// request from that cache).
    cookie_prefix: String,
    next_cookie: u64,
    state: State,
    transmit: Option<Vec<u8>>,
    backoff: Backoff,
    /// Since when the engine has been failing, for the log line of its
    /// return.
    down_since: Option<Instant>,
}

impl fmt::Debug for NgClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NgClient")
            .field("target", &self.target)
            .field("in_flight", &self.in_flight())
            .field("down", &self.down_since.is_some())
            .finish()
    }
}

impl NgClient {
    /// A client of the rtpengine at `target`; `cookie_prefix` (a random
    /// token from the shell) starts every cookie.
    pub fn new(target: SocketAddr, cookie_prefix: String) -> Self {
        Self {
            target,
            cookie_prefix,
            next_cookie: 1,
            state: State::Idle,
            transmit: None,
            backoff: Backoff::new(BACKOFF_BASE, BACKOFF_CAP),
            down_since: None,
        }
    }

    /// The ng address.
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// Whether a request is in flight.
    pub fn in_flight(&self) -> bool {
        matches!(self.state, State::Asking { .. })
    }

    /// Starts an exchange for this sample (module docs).
    pub fn ask(&mut self, now: Instant) -> AskOutcome {
        match self.state {
            State::Asking { .. } => return AskOutcome::Asking,
            State::Down { retry_at } if now < retry_at => return AskOutcome::Backoff,
            State::Down { .. } | State::Idle => {}
        }
        let cookie = format!("{}_{}", self.cookie_prefix, self.next_cookie);
        self.next_cookie += 1;
        let datagram = request(&cookie, "statistics");
        self.transmit = Some(datagram.clone());
        self.state = State::Asking {
            cookie,
            datagram,
            sent: 1,
            retransmit_at: now + RETRANSMIT_AFTER,
        };
        AskOutcome::Asking
    }

    /// The next datagram to send to the ng address.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        self.transmit.take()
    }

    /// When [`handle_timeout`](Self::handle_timeout) is due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::Asking { retransmit_at, .. } => Some(retransmit_at),
            State::Idle | State::Down { .. } => None,
        }
    }

    /// Retransmits, or fails the exchange after [`TRIES`] sends.
    pub fn handle_timeout(&mut self, now: Instant) -> Option<Answer> {
        let State::Asking {
            datagram,
            sent,
            retransmit_at,
            ..
        } = &mut self.state
        else {
            return None;
        };
        if now < *retransmit_at {
            return None;
        }
        if *sent >= TRIES {
            let tries = *sent;
            return Some(self.fail(now, NgError::NoAnswer { tries }));
        }
        *sent += 1;
        *retransmit_at = now + RETRANSMIT_AFTER;
        self.transmit = Some(datagram.clone());
        None
    }

    /// The socket could not send the request: the exchange fails at once.
    pub fn handle_send_error(&mut self, now: Instant, reason: &str) -> Option<Answer> {
        if !self.in_flight() {
            return None;
        }
        self.transmit = None;
        Some(self.fail(
            now,
            NgError::Send {
                reason: reason.to_owned(),
            },
        ))
    }

    /// A datagram from the ng address. An answer to another cookie (a late
    /// answer to an exchange already given up) is ignored; an answer to
    /// ours ends the exchange.
    pub fn handle_datagram(&mut self, now: Instant, datagram: &[u8]) -> Option<Answer> {
        let State::Asking { cookie, .. } = &self.state else {
            debug!(ng = %self.target, bytes = datagram.len(), "rtpengine datagram outside an exchange ignored");
            return None;
        };
        let Some((got, body)) = split_cookie(datagram) else {
            debug!(ng = %self.target, bytes = datagram.len(), "rtpengine datagram without a cookie ignored");
            return None;
        };
        if got != cookie.as_bytes() {
            debug!(ng = %self.target, "rtpengine answer to an earlier request ignored");
            return None;
        }
        Some(match sessions_own(body) {
            Ok(n) => self.succeed(now, n),
            Err(e) => self.fail(now, e),
        })
    }

    fn succeed(&mut self, now: Instant, sessions: u32) -> Answer {
        self.state = State::Idle;
        self.backoff.reset();
        if let Some(since) = self.down_since.take() {
            info!(
                ng = %self.target,
                sessions,
                down_secs = now.saturating_duration_since(since).as_secs(),
                "rtpengine answers again"
            );
        }
        Answer::Sessions(sessions)
    }

    fn fail(&mut self, now: Instant, error: NgError) -> Answer {
        let wait = self.backoff.next_delay();
        self.state = State::Down {
            retry_at: now + wait,
        };
        if self.down_since.is_none() {
            self.down_since = Some(now);
            warn!(
                ng = %self.target,
                %error,
                retry_in_ms = wait.as_millis() as u64,
                "rtpengine does not answer its ng port: with the ng engine probe the notifies keep its last count and say engine: down, with engine-probe=\"off\" the msr is reported full (load 100), until it answers"
            );
        } else {
            debug!(
                ng = %self.target,
                %error,
                failures = self.backoff.failures(),
                retry_in_ms = wait.as_millis() as u64,
                "rtpengine still does not answer"
            );
        }
        Answer::Failed(error)
    }
}

/// The datagram of an ng request: `cookie`, a space, `{"command": command}`.
pub fn request(cookie: &str, command: &str) -> Vec<u8> {
    request_with(cookie, command, Vec::new())
}

/// The datagram of an ng request whose dictionary holds `command` and
/// `fields`.
pub fn request_with(cookie: &str, command: &str, fields: Vec<(Vec<u8>, Value)>) -> Vec<u8> {
    let mut pairs = vec![(b"command".to_vec(), Value::text(command))];
    pairs.extend(fields);
    let mut out = Vec::with_capacity(cookie.len() + 32);
    out.extend_from_slice(cookie.as_bytes());
    out.push(b' ');
    bencode::encode(&Value::Dict(pairs), &mut out);
    out
}

/// The cookie and the body of an ng datagram.
pub fn split_cookie(datagram: &[u8]) -> Option<(&[u8], &[u8])> {
    let space = datagram.iter().position(|&b| b == b' ')?;
    Some((&datagram[..space], &datagram[space + 1..]))
}

/// Decodes the body of an ng answer: the dictionary when its `result` is
/// `ok` (or `pong`), else why not.
///
/// # Errors
/// [`NgError::Refused`] for `result: error`, [`NgError::Unreadable`] for
/// anything that is not an ng answer.
pub fn answer(body: &[u8]) -> Result<Value, NgError> {
    let unreadable = |detail: String| NgError::Unreadable { detail };
    let value = bencode::decode(body).map_err(|e| unreadable(e.to_string()))?;
    match value.get("result").and_then(Value::as_str) {
        Some("ok" | "pong") => Ok(value),
        Some("error") => Err(NgError::Refused {
            reason: value
                .get("error-reason")
                .and_then(Value::as_str)
                .unwrap_or("no error-reason")
                .to_owned(),
        }),
        Some(other) => Err(unreadable(format!("result {other:?}"))),
        None => Err(unreadable("no result".to_owned())),
    }
}

/// `statistics.currentstatistics.sessionsown` of a `statistics` answer.
fn sessions_own(body: &[u8]) -> Result<u32, NgError> {
    let value = answer(body)?;
    let own = value
        .get("statistics")
        .and_then(|s| s.get("currentstatistics"))
        .and_then(|c| c.get("sessionsown"))
        .ok_or_else(|| NgError::Unreadable {
            detail: "no statistics.currentstatistics.sessionsown".to_owned(),
        })?;
    own.as_int()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| NgError::Unreadable {
            detail: format!("sessionsown {own:?} is not a count"),
        })
}
