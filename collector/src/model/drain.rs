//! Drain to completion (SPEC §14): an MSR that takes no new legs — the
//! operator set it inactive (`msrctl msr drain`), or its agent reports it
//! draining (`msr-agent drain`) — is `draining` while legs of this
//! collector or calls its engine reports are left on it, and `drained`
//! once both are 0.
//!
//! [`state`] is the one rule; [`DrainWatch`] remembers which MSRs are
//! being drained and which of them were drained already, so that the
//! moment an MSR becomes drained is reported once ([`DrainEvent`]), for
//! the log. The watch holds only the MSRs being drained (a handful), so
//! looking at them after every input costs nothing when none is.
//!
//! Architecture invariant: no I/O, no clock, no task.

use std::collections::BTreeMap;

use msr_shared::admin::DrainState;

use crate::operator::names::MsrName;

/// The drain state of an MSR that takes no new legs (`wants_drain`) with
/// `live_legs` legs of this collector on it and `engine_calls` calls in its
/// engine's last report (`None`: no report), `registered` or not; `None`
/// for an MSR in service.
///
/// A registered MSR without a report has calls not known to be 0: it has
/// just registered, or this collector just restarted with its bindings
/// and no legs (SPEC §9: legs are not saved). `drained` then would tell
/// an operator to stop an engine that may still carry calls (SPEC §14:
/// both counts 0), so it stays `draining` until a report says 0. An MSR
/// that is not registered reports nothing more: it is drained once this
/// collector's legs on it ended.
pub fn state(
    wants_drain: bool,
    live_legs: u32,
    engine_calls: Option<u32>,
    registered: bool,
) -> Option<DrainState> {
    if !wants_drain {
        return None;
    }
    let engine_empty = engine_calls.map_or(!registered, |calls| calls == 0);
    if live_legs == 0 && engine_empty {
        Some(DrainState::Drained)
    } else {
        Some(DrainState::Draining)
    }
}

/// A change the watch reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainEvent {
    /// `msr` takes no new legs; `live_legs` and `engine_calls` are left.
    Started {
        /// The MSR.
        msr: MsrName,
        /// This collector's live legs on it.
        live_legs: u32,
        /// Its engine's calls in the last report.
        engine_calls: Option<u32>,
    },
    /// The last leg and call on `msr` ended: it can be stopped.
    Drained {
        /// The MSR.
        msr: MsrName,
    },
    /// `msr` takes new legs again.
    Ended {
        /// The MSR.
        msr: MsrName,
    },
}

/// The MSRs being drained and whether each is drained yet (module docs).
#[derive(Debug, Default)]
pub struct DrainWatch {
    watched: BTreeMap<MsrName, Option<DrainState>>,
}

impl DrainWatch {
    /// Whether no MSR is being drained.
    pub fn is_empty(&self) -> bool {
        self.watched.is_empty()
    }

    /// `msr` may have started to drain: it is looked at from now on.
    pub fn watch(&mut self, msr: &MsrName) {
        self.watched.entry(msr.clone()).or_insert(None);
    }

    /// Looks at every watched MSR through `inputs` (whether it takes no new
    /// legs, its live legs, its engine's calls, whether it is registered;
    /// `None` when the collector knows nothing of it any more) and reports
    /// what changed.
    pub fn check(
        &mut self,
        mut inputs: impl FnMut(&str) -> Option<(bool, u32, Option<u32>, bool)>,
        mut report: impl FnMut(DrainEvent),
    ) {
        self.watched.retain(|msr, seen| {
            let Some((wants_drain, live_legs, engine_calls, registered)) = inputs(msr) else {
                return false;
            };
            let now = state(wants_drain, live_legs, engine_calls, registered);
            match (*seen, now) {
                (None, None) => return false,
                (Some(_), None) => {
                    report(DrainEvent::Ended { msr: msr.clone() });
                    return false;
                }
                (None, Some(_)) => report(DrainEvent::Started {
                    msr: msr.clone(),
                    live_legs,
                    engine_calls,
                }),
                (Some(before), Some(after)) if before == after => {}
                (Some(_), Some(_)) => {}
            }
            if now == Some(DrainState::Drained) && *seen != Some(DrainState::Drained) {
                report(DrainEvent::Drained { msr: msr.clone() });
            }
            *seen = now;
            true
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule() {
        assert_eq!(state(false, 0, Some(0), true), None);
        assert_eq!(state(true, 1, Some(0), true), Some(DrainState::Draining));
        assert_eq!(state(true, 0, Some(3), true), Some(DrainState::Draining));
        assert_eq!(state(true, 0, Some(0), true), Some(DrainState::Drained));
        // Registered, no report yet (a restarted collector): not known
        // to be empty.
        assert_eq!(state(true, 0, None, true), Some(DrainState::Draining));
        // Not registered: nothing more will be reported.
        assert_eq!(state(true, 0, None, false), Some(DrainState::Drained));
        assert_eq!(state(true, 1, None, false), Some(DrainState::Draining));
    }

    #[test]
    fn a_drain_is_reported_when_it_starts_when_it_is_drained_once_and_when_it_ends() {
        let mut watch = DrainWatch::default();
        let msr = MsrName::test("msr_1");
        let mut events = Vec::new();
        watch.watch(&msr);
        watch.check(|_| Some((true, 2, Some(5), true)), |e| events.push(e));
        watch.check(|_| Some((true, 0, Some(1), true)), |e| events.push(e));
        watch.check(|_| Some((true, 0, Some(0), true)), |e| events.push(e));
        watch.check(|_| Some((true, 0, Some(0), true)), |e| events.push(e));
        watch.check(|_| Some((false, 0, Some(0), true)), |e| events.push(e));
        assert_eq!(
            events,
            vec![
                DrainEvent::Started {
                    msr: msr.clone(),
                    live_legs: 2,
                    engine_calls: Some(5)
                },
                DrainEvent::Drained { msr: msr.clone() },
                DrainEvent::Ended { msr: msr.clone() },
            ]
        );
        assert!(watch.is_empty());
        // Watched, but in service: forgotten without a word.
        watch.watch(&msr);
        watch.check(|_| Some((false, 3, None, true)), |e| events.push(e));
        assert!(watch.is_empty());
        assert_eq!(events.len(), 3);
    }
}
