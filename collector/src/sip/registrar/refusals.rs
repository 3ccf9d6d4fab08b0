//! Refused REGISTERs, and the rate limit of their log lines.
//!
//! The registrar reports every REGISTER it refuses for what it carried —
//! wrong credentials or an MSR name the account may not register (`403`),
//! a malformed request (`400`) — as a [`Refusal`]. A challenge (`401`, also
//! with `stale=true`) is the normal first step of digest authentication and
//! is not a refusal.
//!
//! Anyone can send REGISTERs, so the lines are limited by
//! `msr_shared::log_limit` ([`RefusalLimiter`]), keyed by the digest
//! username, else the MSR name (the AOR's user part), else the source
//! address: one line per key per [`WINDOW`] with a `suppressed` count, at
//! most [`MAX_KEYS`] keys, at most [`MAX_LINES_PER_WINDOW`] lines per window
//! in all and [`RefusalLog::Unlogged`] counting the rest. So a flood with a
//! new username in every request still yields a bounded number of lines.
//!
//! Text taken from the request (username, MSR name, parse details) is cut
//! to [`MAX_FIELD_CHARS`] characters with control characters escaped, so a
//! line cannot be forged or blown up by what an attacker sends.
//!
//! Sans-IO like the registrar: `now` is always given.

use std::net::SocketAddr;
use std::time::Duration;

use msr_shared::log_limit::{LimitPolicy, Limited, LimitedLine, LineLimiter};
use msr_shared::logging::printable;
use msr_shared::sip::StatusCode;

/// The rate-limit window: per key, and for the global line budget.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Most keys (usernames / MSR names / sources) tracked at once.
pub const MAX_KEYS: usize = 1_000;
/// Most [`RefusalLog::Line`] lines per [`WINDOW`], over all keys.
pub const MAX_LINES_PER_WINDOW: u32 = 100;
/// Longest text taken from a request into a refusal, in characters.
pub const MAX_FIELD_CHARS: usize = 64;

/// Why a REGISTER was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefusalReason {
    /// The digest username is no `[[accounts]] auth_name` (`403`).
    UnknownAuthName,
    /// The digest response does not match the account's password (`403`).
    WrongPassword,
    /// The account's `msrs` list does not hold the MSR name (`403`).
    MsrNotAllowed,
    /// The request could not be used (`400`); what was wrong.
    Malformed(String),
}

impl RefusalReason {
    /// The detail of a [`Malformed`](Self::Malformed) refusal.
    pub fn detail(&self) -> Option<&str> {
        match self {
            RefusalReason::Malformed(d) => Some(d),
            _ => None,
        }
    }
}

impl std::fmt::Display for RefusalReason {
    /// One token, as logged in `reason=`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RefusalReason::UnknownAuthName => "unknown_auth_name",
            RefusalReason::WrongPassword => "wrong_password",
            RefusalReason::MsrNotAllowed => "msr_not_allowed",
            RefusalReason::Malformed(_) => "malformed",
        })
    }
}

/// One refused REGISTER, as logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The MSR name (the user part of the `To` URI), when there was one.
    pub msr: Option<String>,
    /// The digest username (`auth_name`), when credentials were sent.
    pub auth_name: Option<String>,
    /// Why.
    pub reason: RefusalReason,
    /// The status sent (`403` or `400`).
    pub status: StatusCode,
    /// Where the REGISTER came from, when the shell knows it.
    pub source: Option<SocketAddr>,
    /// How many other refusals of the same key since its previous line
    /// this line stands for (not logged one by one).
    pub suppressed: u64,
}

impl Refusal {
    /// A refusal with its request-supplied text made safe to log.
    pub(super) fn new(
        msr: Option<&str>,
        auth_name: Option<&str>,
        reason: RefusalReason,
        status: StatusCode,
        source: Option<SocketAddr>,
    ) -> Self {
        let reason = match reason {
            RefusalReason::Malformed(d) => RefusalReason::Malformed(printable(&d, MAX_FIELD_CHARS)),
            other => other,
        };
        Self {
            msr: msr.map(|m| printable(m, MAX_FIELD_CHARS)),
            auth_name: auth_name.map(|a| printable(a, MAX_FIELD_CHARS)),
            reason,
            status,
            source,
            suppressed: 0,
        }
    }

    /// The rate-limit key: the username, else the MSR name, else the
    /// source address.
    fn key(&self) -> String {
        match (&self.auth_name, &self.msr, self.source) {
            (Some(a), _, _) => format!("auth_name:{a}"),
            (None, Some(m), _) => format!("msr:{m}"),
            (None, None, Some(s)) => format!("source:{}", s.ip()),
            (None, None, None) => String::new(),
        }
    }
}

/// What to log about refused REGISTERs (see [`Registrar::poll_refusal`](super::Registrar::poll_refusal)):
/// a [`Refusal`] (at warn), or how many refusals were not logged.
pub type RefusalLog = LimitedLine<Refusal>;

/// The rate limit of refusal lines (module doc).
pub(super) type RefusalLimiter = LineLimiter<Refusal>;

/// The bounds of the refusal lines.
pub(super) const POLICY: LimitPolicy = LimitPolicy {
    window: WINDOW,
    max_keys: MAX_KEYS,
    max_lines: MAX_LINES_PER_WINDOW,
};

impl Limited for Refusal {
    fn key(&self) -> String {
        Refusal::key(self)
    }
    fn set_suppressed(&mut self, suppressed: u64) {
        self.suppressed = suppressed;
    }
    fn suppressed(&self) -> u64 {
        self.suppressed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_text_is_cut_and_escaped() {
        let long = "x".repeat(500);
        let r = Refusal::new(
            Some("msr\u{1b}[31m\nfake line"),
            Some(&long),
            RefusalReason::Malformed("bad\r\n".into()),
            StatusCode::BadRequest,
            None,
        );
        assert_eq!(r.msr.as_deref(), Some("msr\\u{1b}[31m\\nfake line"));
        assert_eq!(
            r.auth_name.as_deref().map(|a| a.chars().count()),
            Some(MAX_FIELD_CHARS + 1)
        );
        assert_eq!(r.reason.detail(), Some("bad\\r\\n"));
        assert_eq!(r.reason.to_string(), "malformed");
    }
}
