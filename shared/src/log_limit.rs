//! Rate limit of log lines that anyone on the network can cause (refused
//! REGISTERs and NOTIFYs, the SIP stack's complaints about a datagram), so
//! a flood of bad datagrams yields a bounded number of lines and every one
//! of them is still accounted for.
//!
//! Lines are grouped by a key ([`Limited::key`]: a username, a source, a
//! call site…):
//!
//! * per key at most one line per [`LimitPolicy::window`]: the first is
//!   given out at once, the later ones in the window are counted, and when
//!   the window ends the latest of them is given out with
//!   [`Limited::set_suppressed`] = how many others it stands for (then a
//!   new window starts);
//! * at most [`LimitPolicy::max_keys`] keys are tracked; a new key beyond
//!   that evicts the one tracked longest (its pending count is given out
//!   first);
//! * across all keys at most [`LimitPolicy::max_lines`] lines per window
//!   (fixed windows): lines beyond that are only counted, and given out as
//!   one [`LimitedLine::Unlogged`] when the window ends.
//!
//! Every line recorded is accounted for exactly once: given out, in a
//! line's `suppressed`, or in an `Unlogged` count.
//!
//! Sans-IO: `now` is always given.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

/// The bounds of a [`LineLimiter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitPolicy {
    /// The window, per key and for the global line budget.
    pub window: Duration,
    /// Most keys tracked at once.
    pub max_keys: usize,
    /// Most lines given out per window, over all keys.
    pub max_lines: u32,
}

impl Default for LimitPolicy {
    /// One line per key per 60 s, 1,000 keys, 100 lines per 60 s.
    fn default() -> Self {
        Self {
            window: Duration::from_secs(60),
            max_keys: 1_000,
            max_lines: 100,
        }
    }
}

/// A line the limiter can hold back and count.
pub trait Limited {
    /// What lines are grouped by.
    fn key(&self) -> String;
    /// Sets how many held-back lines this one stands for.
    fn set_suppressed(&mut self, suppressed: u64);
    /// How many held-back lines this one stands for.
    fn suppressed(&self) -> u64;
}

/// What to log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitedLine<T> {
    /// Log this line (with its `suppressed` count).
    Line(T),
    /// This many lines were not logged (nor counted in a line's
    /// `suppressed`) because the window's line budget was spent.
    Unlogged {
        /// How many.
        count: u64,
    },
}

/// A tracked key: what it holds back (its window's start is in
/// `LineLimiter::order`).
#[derive(Debug)]
struct Entry<T> {
    /// Lines held back since then.
    suppressed: u64,
    /// The latest of them.
    latest: Option<T>,
}

impl<T> Default for Entry<T> {
    fn default() -> Self {
        Self {
            suppressed: 0,
            latest: None,
        }
    }
}

/// The rate limit of one kind of line (see the module doc).
#[derive(Debug)]
pub struct LineLimiter<T> {
    policy: LimitPolicy,
    keys: HashMap<String, Entry<T>>,
    /// `(since, key)` of every entry of `keys`, oldest first: `since` is
    /// when the key's window started (its first refusal, or its last
    /// line); it never decreases along the queue, as `now` never does.
    order: VecDeque<(Instant, String)>,
    /// Start of the current global window, once a line was attempted in it.
    global_since: Option<Instant>,
    /// Lines given out in the current global window.
    lines: u32,
    /// Lines dropped in the current global window.
    unlogged: u64,
    out: VecDeque<LimitedLine<T>>,
}

impl<T: Limited> LineLimiter<T> {
    /// A limiter with nothing tracked.
    pub fn new(policy: LimitPolicy) -> Self {
        Self {
            policy,
            keys: HashMap::new(),
            order: VecDeque::new(),
            global_since: None,
            lines: 0,
            unlogged: 0,
            out: VecDeque::new(),
        }
    }

    /// Counts a line at `now`: given out at once when its key has no open
    /// window (and the global budget allows), else held back. Returns
    /// whether it was given out at once.
    pub fn record(&mut self, now: Instant, line: T) -> bool {
        self.advance(now);
        let key = line.key();
        if let Some(entry) = self.keys.get_mut(&key) {
            entry.suppressed += 1;
            entry.latest = Some(line);
            return false;
        }
        if self.keys.len() >= self.policy.max_keys {
            if let Some((_, oldest)) = self.order.pop_front() {
                if let Some(entry) = self.keys.remove(&oldest) {
                    self.flush(now, entry);
                }
            }
        }
        let given = self.emit(now, line);
        self.keys.insert(key.clone(), Entry::default());
        self.order.push_back((now, key));
        given
    }

    /// Closes the windows that ended at or before `now`: a key's held-back
    /// refusals are reported (its latest, with the count of the others),
    /// a quiet key is forgotten, and the global count of dropped refusals
    /// is reported.
    pub fn advance(&mut self, now: Instant) {
        if self
            .global_since
            .is_some_and(|s| now >= s + self.policy.window)
        {
            self.close_global_window();
        }
        while self
            .order
            .front()
            .is_some_and(|(s, _)| now >= *s + self.policy.window)
        {
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
    pub fn finish(&mut self, now: Instant) {
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
            self.out.push_back(LimitedLine::Unlogged {
                count: self.unlogged,
            });
        }
        self.global_since = None;
        self.lines = 0;
        self.unlogged = 0;
    }

    /// When [`advance`](Self::advance) has work: the end of the oldest
    /// key's window, or of the global window when refusals were dropped.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let key = self.order.front().map(|(s, _)| *s + self.policy.window);
        let global = self
            .global_since
            .filter(|_| self.unlogged > 0)
            .map(|s| s + self.policy.window);
        key.into_iter().chain(global).min()
    }

    /// The next thing to log.
    pub fn poll(&mut self) -> Option<LimitedLine<T>> {
        self.out.pop_front()
    }

    /// Reports what `entry` held back, if anything.
    fn flush(&mut self, now: Instant, entry: Entry<T>) {
        if let Some(mut latest) = entry.latest.filter(|_| entry.suppressed > 0) {
            latest.set_suppressed(entry.suppressed - 1);
            self.emit(now, latest);
        }
    }

    /// Gives `line` out if the global budget allows, else counts it (and
    /// those it stands for) as dropped. Returns whether it was given out.
    fn emit(&mut self, now: Instant, line: T) -> bool {
        if self.global_since.is_none() {
            self.global_since = Some(now);
        }
        if self.lines < self.policy.max_lines {
            self.lines += 1;
            self.out.push_back(LimitedLine::Line(line));
            true
        } else {
            self.unlogged += 1 + line.suppressed();
            false
        }
    }

    /// Keys tracked (for tests).
    #[cfg(test)]
    fn tracked(&self) -> usize {
        assert_eq!(self.keys.len(), self.order.len(), "order out of step");
        self.keys.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(60);
    const MAX_KEYS: usize = 1_000;
    const MAX_LINES_PER_WINDOW: u32 = 100;

    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Refusal {
        auth_name: String,
        suppressed: u64,
    }

    impl Limited for Refusal {
        fn key(&self) -> String {
            self.auth_name.clone()
        }
        fn set_suppressed(&mut self, suppressed: u64) {
            self.suppressed = suppressed;
        }
        fn suppressed(&self) -> u64 {
            self.suppressed
        }
    }

    type RefusalLog = LimitedLine<Refusal>;

    fn limiter() -> LineLimiter<Refusal> {
        LineLimiter::new(LimitPolicy::default())
    }

    fn refusal(auth_name: &str) -> Refusal {
        Refusal {
            auth_name: auth_name.to_owned(),
            suppressed: 0,
        }
    }

    fn drain(l: &mut LineLimiter<Refusal>) -> Vec<RefusalLog> {
        std::iter::from_fn(|| l.poll()).collect()
    }

    /// Refusals accounted for by `logs`.
    fn accounted(logs: &[RefusalLog]) -> u64 {
        logs.iter()
            .map(|l| match l {
                RefusalLog::Line(r) => 1 + r.suppressed,
                RefusalLog::Unlogged { count } => *count,
            })
            .sum()
    }

    #[test]
    fn one_line_per_key_per_window_with_the_count_of_the_others() {
        let mut l = limiter();
        let t0 = Instant::now();
        l.record(t0, refusal("msr"));
        assert_eq!(drain(&mut l), vec![RefusalLog::Line(refusal("msr"))]);
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
        assert_eq!(drain(&mut l), vec![RefusalLog::Line(expected)]);
        // A new window started at that line: the next refusal is held back.
        let t1 = t0 + WINDOW;
        assert_eq!(l.poll_timeout(), Some(t1 + WINDOW));
        l.record(t1 + Duration::from_secs(30), refusal("msr"));
        assert!(drain(&mut l).is_empty());
        l.advance(t1 + WINDOW);
        assert_eq!(drain(&mut l), vec![RefusalLog::Line(refusal("msr"))]);
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
        let mut l = limiter();
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
        let mut l = limiter();
        let t0 = Instant::now();
        l.record(t0, refusal("a"));
        l.record(t0, refusal("b"));
        l.record(t0, refusal("a"));
        assert_eq!(
            drain(&mut l),
            vec![
                RefusalLog::Line(refusal("a")),
                RefusalLog::Line(refusal("b"))
            ]
        );
    }

    #[test]
    fn at_most_max_keys_the_oldest_evicted_with_its_count() {
        let mut l = limiter();
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
        assert_eq!(logs[0], RefusalLog::Line(refusal("k0")));
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
        let mut l = limiter();
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
            .filter(|l| matches!(l, RefusalLog::Line(_)))
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
        let mut l = limiter();
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
}
