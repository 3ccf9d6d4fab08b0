//! Refused REGISTERs, and the rate limit of their log lines.
//!
//! The registrar reports every REGISTER it refuses for what it carried —
//! wrong credentials or an MSR name the account may not register (`403`),
//! a malformed request (`400`) — as a [`Refusal`]. A challenge (`401`, also
//! with `stale=true`) is the normal first step of digest authentication and
//! is not a refusal.
//!
//! Anyone can send REGISTERs, so the lines are limited ([`RefusalLimiter`]):
//!
//! * per key — the digest username, else the MSR name (the AOR's user
//!   part), else the source address — at most one line per [`WINDOW`]: the
//!   first refusal is reported at once, the later ones in the window are
//!   counted, and when the window ends the latest of them is reported with
//!   `suppressed` = how many others it stands for (then a new window starts);
//! * at most [`MAX_KEYS`] keys are tracked; a new key beyond that evicts
//!   the one tracked longest (its pending count is reported first);
//! * across all keys at most [`MAX_LINES_PER_WINDOW`] lines per [`WINDOW`]
//!   (fixed windows): refusals beyond that are only counted, and reported as
//!   one [`RefusalLog::Unlogged`] when the window ends. So a flood with a new
//!   username in every request still yields a bounded number of lines.
//!
//! Every refusal is accounted for exactly once: as a line, in a line's
//! `suppressed`, or in an `Unlogged` count.
//!
//! Text taken from the request (username, MSR name, parse details) is cut
//! to [`MAX_FIELD_CHARS`] characters with control characters escaped, so a
//! line cannot be forged or blown up by what an attacker sends.
//!
//! Sans-IO like the registrar: `now` is always given.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use msr_shared::sip::StatusCode;
use tokio::time::Instant;

/// The rate-limit window: per key, and for the global line budget.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Most keys (usernames / MSR names / sources) tracked at once.
pub const MAX_KEYS: usize = 1_000;
/// Most [`RefusalLog::Refused`] lines per [`WINDOW`], over all keys.
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
            RefusalReason::Malformed(d) => RefusalReason::Malformed(printable(&d)),
            other => other,
        };
        Self {
            msr: msr.map(printable),
            auth_name: auth_name.map(printable),
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

/// What to log about refused REGISTERs (see [`Registrar::poll_refusal`](super::Registrar::poll_refusal)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefusalLog {
    /// Log this refusal (at warn).
    Refused(Refusal),
    /// This many refusals were not logged (nor counted in a line's
    /// `suppressed`) because the line budget of the window was spent.
    Unlogged {
        /// How many.
        count: u64,
    },
}

/// A tracked key: what it holds back (its window's start is in
/// `RefusalLimiter::order`).
#[derive(Debug, Default)]
struct Entry {
    /// Refusals held back since then.
    suppressed: u64,
    /// The latest of them.
    latest: Option<Refusal>,
}

/// The rate limit of refusal lines (see the module doc).
#[derive(Debug, Default)]
pub(super) struct RefusalLimiter {
    keys: HashMap<String, Entry>,
    /// `(since, key)` of every entry of `keys`, oldest first: `since` is
    /// when the key's window started (its first refusal, or its last
    /// line); it never decreases along the queue, as `now` never does.
    order: VecDeque<(Instant, String)>,
    /// Start of the current global window, once a line was attempted in it.
    global_since: Option<Instant>,
    /// Lines given out in the current global window.
    lines: u32,
    /// Refusals dropped in the current global window.
    unlogged: u64,
    out: VecDeque<RefusalLog>,
}

impl RefusalLimiter {
    /// Counts a refusal at `now`: reported at once when its key has no
    /// open window, else held back.
    pub(super) fn record(&mut self, now: Instant, refusal: Refusal) {
        self.advance(now);
        let key = refusal.key();
        if let Some(entry) = self.keys.get_mut(&key) {
            entry.suppressed += 1;
            entry.latest = Some(refusal);
            return;
        }
        if self.keys.len() >= MAX_KEYS {
            if let Some((_, oldest)) = self.order.pop_front() {
                if let Some(entry) = self.keys.remove(&oldest) {
                    self.flush(now, entry);
                }
            }
        }
        self.emit(now, refusal);
        self.keys.insert(key.clone(), Entry::default());
        self.order.push_back((now, key));
    }

    /// Closes the windows that ended at or before `now`: a key's held-back
    /// refusals are reported (its latest, with the count of the others),
    /// a quiet key is forgotten, and the global count of dropped refusals
    /// is reported.
    pub(super) fn advance(&mut self, now: Instant) {
        if self.global_since.is_some_and(|s| now >= s + WINDOW) {
            self.close_global_window();
        }
        while self.order.front().is_some_and(|(s, _)| now >= *s + WINDOW) {
            let Some((_, key)) = self.order.pop_front() else {
                break;
            };
            let Some(entry) = self.keys.remove(&key) else {
                continue;
            };
            if entry.suppressed > 0 {
                // The line starts the key's next window.
                self.flush(now, entry);
                self.keys.insert(key.clone(), Entry::default());
                self.order.push_back((now, key));
            }
        }
    }

    /// Reports everything held back, as if every window ended now
    /// (shutdown), and forgets every key.
    pub(super) fn finish(&mut self, now: Instant) {
        while let Some((_, key)) = self.order.pop_front() {
            if let Some(entry) = self.keys.remove(&key) {
                self.flush(now, entry);
            }
        }
        self.close_global_window();
    }

    /// Ends the global window: reports the refusals it dropped, if any, and
    /// starts counting lines afresh.
    fn close_global_window(&mut self) {
        if self.unlogged > 0 {
            self.out.push_back(RefusalLog::Unlogged {
                count: self.unlogged,
            });
        }
        self.global_since = None;
        self.lines = 0;
        self.unlogged = 0;
    }

    /// When [`advance`](Self::advance) has work: the end of the oldest
    /// key's window, or of the global window when refusals were dropped.
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        let key = self.order.front().map(|(s, _)| *s + WINDOW);
        let global = self
            .global_since
            .filter(|_| self.unlogged > 0)
            .map(|s| s + WINDOW);
        key.into_iter().chain(global).min()
    }

    /// The next thing to log.
    pub(super) fn poll(&mut self) -> Option<RefusalLog> {
        self.out.pop_front()
    }

    /// Reports what `entry` held back, if anything.
    fn flush(&mut self, now: Instant, entry: Entry) {
        if let Some(mut latest) = entry.latest.filter(|_| entry.suppressed > 0) {
            latest.suppressed = entry.suppressed - 1;
            self.emit(now, latest);
        }
    }

    /// Gives `refusal` a line if the global budget allows, else counts it
    /// (and those it stands for) as dropped.
    fn emit(&mut self, now: Instant, refusal: Refusal) {
        if self.global_since.is_none() {
            self.global_since = Some(now);
        }
        if self.lines < MAX_LINES_PER_WINDOW {
            self.lines += 1;
            self.out.push_back(RefusalLog::Refused(refusal));
        } else {
            self.unlogged += 1 + refusal.suppressed;
        }
    }

    /// Keys tracked (for tests).
    #[cfg(test)]
    pub(super) fn tracked(&self) -> usize {
        assert_eq!(self.keys.len(), self.order.len(), "order out of step");
        self.keys.len()
    }
}

/// `s` cut to [`MAX_FIELD_CHARS`] characters (`…` marks a cut) with control
/// characters escaped.
fn printable(s: &str) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i == MAX_FIELD_CHARS {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(auth_name: &str) -> Refusal {
        Refusal::new(
            Some("msr_1"),
            Some(auth_name),
            RefusalReason::WrongPassword,
            StatusCode::Forbidden,
            None,
        )
    }

    fn drain(l: &mut RefusalLimiter) -> Vec<RefusalLog> {
        std::iter::from_fn(|| l.poll()).collect()
    }

    /// Refusals accounted for by `logs`.
    fn accounted(logs: &[RefusalLog]) -> u64 {
        logs.iter()
            .map(|l| match l {
                RefusalLog::Refused(r) => 1 + r.suppressed,
                RefusalLog::Unlogged { count } => *count,
            })
            .sum()
    }

    #[test]
    fn one_line_per_key_per_window_with_the_count_of_the_others() {
        let mut l = RefusalLimiter::default();
        let t0 = Instant::now();
        l.record(t0, refusal("msr"));
        assert_eq!(drain(&mut l), vec![RefusalLog::Refused(refusal("msr"))]);
        for s in 1..=4 {
            l.record(t0 + Duration::from_secs(s), refusal("msr"));
        }
        assert!(drain(&mut l).is_empty());
        assert_eq!(l.poll_timeout(), Some(t0 + WINDOW));
        l.advance(t0 + WINDOW - Duration::from_millis(1));
        assert!(drain(&mut l).is_empty());
        // The window ends: the latest refusal stands for the three others.
        l.advance(t0 + WINDOW);
        let mut expected = refusal("msr");
        expected.suppressed = 3;
        assert_eq!(drain(&mut l), vec![RefusalLog::Refused(expected)]);
        // A new window started at that line: the next refusal is held back.
        let t1 = t0 + WINDOW;
        assert_eq!(l.poll_timeout(), Some(t1 + WINDOW));
        l.record(t1 + Duration::from_secs(30), refusal("msr"));
        assert!(drain(&mut l).is_empty());
        l.advance(t1 + WINDOW);
        assert_eq!(drain(&mut l), vec![RefusalLog::Refused(refusal("msr"))]);
        // A quiet window: the key is forgotten, nothing is logged.
        l.advance(t1 + WINDOW * 2);
        assert!(drain(&mut l).is_empty());
        assert_eq!((l.tracked(), l.poll_timeout()), (0, None));
        // And the next refusal is reported at once again.
        l.record(t1 + WINDOW * 3, refusal("msr"));
        assert_eq!(drain(&mut l).len(), 1);
    }

    #[test]
    fn finish_reports_what_is_held_back() {
        let mut l = RefusalLimiter::default();
        let t0 = Instant::now();
        let mut logs = Vec::new();
        for i in 0..300u64 {
            l.record(t0, refusal(&format!("k{}", i % 150)));
        }
        logs.extend(drain(&mut l));
        l.finish(t0 + Duration::from_secs(1));
        logs.extend(drain(&mut l));
        assert_eq!(accounted(&logs), 300);
        assert!(matches!(logs.last(), Some(RefusalLog::Unlogged { .. })));
        assert_eq!((l.tracked(), l.poll_timeout()), (0, None));
    }

    #[test]
    fn keys_are_independent() {
        let mut l = RefusalLimiter::default();
        let t0 = Instant::now();
        l.record(t0, refusal("a"));
        l.record(t0, refusal("b"));
        l.record(t0, refusal("a"));
        assert_eq!(
            drain(&mut l),
            vec![
                RefusalLog::Refused(refusal("a")),
                RefusalLog::Refused(refusal("b"))
            ]
        );
    }

    #[test]
    fn at_most_max_keys_the_oldest_evicted_with_its_count() {
        let mut l = RefusalLimiter::default();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut logs = Vec::new();
        l.record(t0, refusal("k0"));
        l.record(t0, refusal("k0"));
        for i in 1..MAX_KEYS {
            l.record(t0 + ms(1), refusal(&format!("k{i}")));
        }
        assert_eq!(l.tracked(), MAX_KEYS);
        logs.extend(drain(&mut l));
        assert_eq!(logs[0], RefusalLog::Refused(refusal("k0")));
        // One more key evicts k0, the oldest; what it held back is counted
        // (in the dropped count here: the window's line budget is spent).
        l.record(t0 + ms(2), refusal("new"));
        assert_eq!(l.tracked(), MAX_KEYS);
        // k0 is new again (and evicts k1).
        l.record(t0 + ms(3), refusal("k0"));
        assert_eq!(l.tracked(), MAX_KEYS);
        l.advance(t0 + WINDOW * 3);
        logs.extend(drain(&mut l));
        assert_eq!(accounted(&logs), 2 + (MAX_KEYS as u64 - 1) + 2);
        assert!(
            matches!(logs.last(), Some(RefusalLog::Unlogged { count }) if *count == MAX_KEYS as u64 + 3 - u64::from(MAX_LINES_PER_WINDOW)),
            "{:?}",
            logs.last()
        );
        assert_eq!((l.tracked(), l.poll_timeout()), (0, None));
    }

    #[test]
    fn a_flood_of_new_keys_gets_a_bounded_number_of_lines_and_every_refusal_counted() {
        let mut l = RefusalLimiter::default();
        let t0 = Instant::now();
        let total = 50_000u64;
        let mut logs = Vec::new();
        for i in 0..total {
            // 50,000 refusals over 5 minutes, a new username each time.
            let now = t0 + Duration::from_millis(i * 6);
            l.record(now, refusal(&format!("attacker{i}")));
            logs.extend(drain(&mut l));
            assert!(l.tracked() <= MAX_KEYS);
        }
        l.advance(t0 + WINDOW * 10);
        logs.extend(drain(&mut l));
        let lines = logs
            .iter()
            .filter(|l| matches!(l, RefusalLog::Refused(_)))
            .count();
        let unlogged = logs.len() - lines;
        // Five windows: at most the budget of lines and one count each.
        assert!(lines <= 5 * MAX_LINES_PER_WINDOW as usize, "{lines}");
        assert!(unlogged <= 5, "{unlogged}");
        assert_eq!(accounted(&logs), total);
        assert_eq!((l.tracked(), l.poll_timeout()), (0, None));
    }

    #[test]
    fn a_flood_on_one_key_is_one_line_per_window() {
        let mut l = RefusalLimiter::default();
        let t0 = Instant::now();
        let mut logs = Vec::new();
        for i in 0..10_000u64 {
            l.record(t0 + Duration::from_millis(i * 30), refusal("msr"));
            logs.extend(drain(&mut l));
        }
        l.advance(t0 + WINDOW * 10);
        logs.extend(drain(&mut l));
        // 300 s: the first line, then one per window.
        assert!(logs.len() <= 6, "{logs:?}");
        assert_eq!(accounted(&logs), 10_000);
    }

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
