//! Nothing vanishes (SPEC §14): an MSR that was registered and lost its
//! last binding (it lapsed, or unregistered) stays on record, with when
//! and why and whether it was serving, until it registers again or the
//! operator forgets it (`msrctl msr forget`). The load table lets go of a
//! gone MSR's rows (selection must not see them); this is what the lists,
//! `/metrics` and the `MsrGone` alert show instead.
//!
//! Architecture invariant: no I/O, no clock, no task.

use std::collections::BTreeMap;

use tokio::time::Instant;

use crate::operator::names::MsrName;
use crate::sip::registrar::RemovalCause;

/// Why and since when an MSR is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Absence {
    /// When its last binding went.
    pub since: Instant,
    /// The same, Unix seconds.
    pub since_unix: i64,
    /// Lapsed, or unregistered.
    pub cause: RemovalCause,
    /// It was in service then (it had reported its load and was not
    /// drained): an MSR that was serving is gone (the alert).
    pub serving: bool,
}

/// The MSRs that are gone (module docs).
#[derive(Debug, Default)]
pub struct Absences {
    gone: BTreeMap<MsrName, Absence>,
}

impl Absences {
    /// `msr` lost its last binding.
    pub fn gone(&mut self, msr: &MsrName, absence: Absence) {
        self.gone.insert(msr.clone(), absence);
    }

    /// `msr` registered again: its absence ends (returned, for the log).
    pub fn returned(&mut self, msr: &str) -> Option<Absence> {
        self.gone.remove(msr)
    }

    /// The operator forgets `msr`; `false` when it is not gone.
    pub fn forget(&mut self, msr: &str) -> bool {
        self.gone.remove(msr).is_some()
    }

    /// The absence of `msr`, if it is gone.
    pub fn get(&self, msr: &str) -> Option<&Absence> {
        self.gone.get(msr)
    }

    /// Every gone MSR, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&MsrName, &Absence)> {
        self.gone.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gone_msr_stays_until_it_returns_or_is_forgotten() {
        let mut absences = Absences::default();
        let msr = MsrName::test("msr_1");
        let absence = Absence {
            since: Instant::now(),
            since_unix: 1_700_000_000,
            cause: RemovalCause::Lapsed,
            serving: true,
        };
        absences.gone(&msr, absence);
        assert_eq!(absences.get("msr_1"), Some(&absence));
        assert_eq!(absences.returned("msr_1"), Some(absence));
        assert_eq!(absences.get("msr_1"), None);
        absences.gone(&msr, absence);
        assert!(absences.forget("msr_1"));
        assert!(!absences.forget("msr_1"));
        assert_eq!(absences.iter().count(), 0);
    }
}
