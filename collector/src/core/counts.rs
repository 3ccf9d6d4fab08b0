//! What the core counts for `/metrics` (SPEC §11): each [`Count`] is one
//! increment of a counter, queued as it happens and taken by the shell
//! ([`Collector::poll_count`]), which adds it to the Prometheus counters
//! (`Metrics::count`, in `api/metrics.rs`). The core holds no metrics
//! registry: the exposition's names and labels are the front end's.

use msr_shared::admin::{ErrorCode, LegOutcome, Response, ResponseData};

use crate::model::health::FailureCause;
use crate::operator::names::MsrName;

use super::Collector;

/// One increment (module docs).
#[derive(Debug, Clone, PartialEq)]
pub enum Count {
    /// A selection answered with `msr`; `leg` is what it did with the
    /// call's leg (`None` without a call_id).
    Selected {
        /// The MSR chosen.
        msr: String,
        /// New, re-anchored or sticky.
        leg: Option<LegOutcome>,
    },
    /// A selection refused with this code.
    Refused(ErrorCode),
    /// One release ended this many legs.
    Released(u32),
    /// A REGISTER answered with this status code.
    Register(u16),
    /// A NOTIFY answered 200 (`accepted`) or with an error.
    Notify {
        /// Answered 200.
        accepted: bool,
    },
    /// A zone entered overload (SPEC §10, [`crate::model::overload`]).
    ZoneOverload,
    /// A core reported that `msr` failed a leg (SPEC §14).
    CoreFailure {
        /// The MSR.
        msr: MsrName,
        /// Why.
        cause: FailureCause,
    },
}

/// What a control request counts as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Counted {
    Selection,
    Release,
    Not,
}

impl Collector {
    /// The next increment for `/metrics` ([`Count`]); the shell takes them
    /// after each input, as it takes transmits, effects and events.
    pub fn poll_count(&mut self) -> Option<Count> {
        self.counts.pop_front()
    }

    /// Counts a selection (outcome and MSR) or a release. The selection's
    /// latency is the shell's to measure: the core reads no clock.
    pub(super) fn count_answer(&mut self, kind: Counted, response: &Response) {
        let count = match (kind, response) {
            (Counted::Selection, Response::Ok(ResponseData::Selected(s))) => Count::Selected {
                msr: s.msr.clone(),
                leg: s.leg,
            },
            (Counted::Selection, Response::Err(e)) => Count::Refused(e.code),
            (Counted::Release, Response::Ok(ResponseData::Released(r))) => {
                Count::Released(r.released)
            }
            _ => return,
        };
        self.counts.push_back(count);
    }
}
