//! Refused selections in the log (SPEC §16: refusals say why): every
//! refusal is counted in `/metrics`; its line is rate limited per error
//! code by `msr_shared::log_limit` — one line per code per [`WINDOW`] with
//! how many it stands for, at most [`MAX_LINES_PER_WINDOW`] lines in all —
//! so a core retrying a refused call in a loop yields a bounded log that
//! still accounts for every refusal.

use std::time::Duration;

use msr_shared::admin::{ErrorBody, ErrorCode};
use msr_shared::log_limit::{LimitPolicy, Limited, LimitedLine, LineLimiter};
use msr_shared::logging::printable;

/// The rate-limit window.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Most lines per [`WINDOW`] over all codes.
pub const MAX_LINES_PER_WINDOW: u32 = 100;
/// Longest message kept, in characters (it may quote names a core sent).
const MAX_MESSAGE_CHARS: usize = 300;

/// One refused selection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectionRefusal {
    /// The refusal's code.
    pub code: ErrorCode,
    /// Its message, cut and escaped.
    pub message: String,
    /// Refusals of the same code this line stands for.
    pub suppressed: u64,
}

impl SelectionRefusal {
    /// The line for a refused selection's answer.
    pub fn new(body: &ErrorBody) -> Self {
        Self {
            code: body.code,
            message: printable(&body.message, MAX_MESSAGE_CHARS),
            suppressed: 0,
        }
    }
}

impl Limited for SelectionRefusal {
    fn key(&self) -> String {
        self.code.as_str().to_owned()
    }
    fn set_suppressed(&mut self, suppressed: u64) {
        self.suppressed = suppressed;
    }
    fn suppressed(&self) -> u64 {
        self.suppressed
    }
}

/// What to log of refused selections.
pub type SelectionRefusalLog = LimitedLine<SelectionRefusal>;

/// A limiter for refused selections' lines.
pub fn limiter() -> LineLimiter<SelectionRefusal> {
    LineLimiter::new(LimitPolicy {
        window: WINDOW,
        max_keys: 64,
        max_lines: MAX_LINES_PER_WINDOW,
    })
}
