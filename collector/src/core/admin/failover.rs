//! Failover within call setup (SPEC §14): a core that could not place a
//! leg on the MSR it was given asks again for the same leg with `failed`
//! (the MSRs that failed it) and `failure` (why the last one did).
//!
//! * The failure of the MSR the leg is bound to, when it is the last of
//!   `failed`, counts against that MSR's health
//!   ([`HealthMonitor::core_failure`]) once: a repeated request
//!   finds the leg already moved, and is answered where it is now. A
//!   `load-limit` or `503` from an MSR whose last report put it near the
//!   top is the MSR full and counts nothing
//!   ([`FailureCause::near_top`](crate::model::health::FailureCause::near_top)).
//! * The leg moves to the next choice of the same policy among the MSRs
//!   that did not fail it (re-anchored: the failed MSR's estimate loses
//!   it, the new one's gains it).
//! * A leg that used its attempts (`[selection] failover_attempts`
//!   MSRs in all) or that no MSR is left for is released and refused
//!   `msr_unavailable`, the failures listed.
//! * `failed` for a Call-ID that has no live leg places it anew, avoiding
//!   the failed MSRs, and counts nothing (no leg of this collector failed).

use msr_shared::admin::{ErrorCode, Response};
use tokio::time::Instant;

use crate::model::health::{FailureCause, HealthMonitor};
use crate::model::legs::{LegKey, LegTable};
use crate::model::load_table::LoadTable;
use crate::operator::names::{self, NameKind};

/// A failover request, checked.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Failover {
    /// The MSRs that failed the leg, in the order given, no repeats.
    pub(super) failed: Vec<String>,
    /// Why the last of them failed.
    pub(super) cause: FailureCause,
}

/// Checks `failed` and `failure` of a select; `Ok(None)` for a first
/// attempt (no `failed`).
///
/// # Errors
/// The code and message of the answer to send: `bad_request` for `failed` without `call_id` or
/// `failure` without `failed`, `invalid_value` for a malformed MSR name or
/// an unknown failure.
pub(super) fn check(
    failed: Vec<String>,
    failure: Option<&str>,
    names_a_leg: bool,
) -> Result<Option<Failover>, (ErrorCode, String)> {
    if failed.is_empty() {
        return match failure {
            Some(_) => Err((
                ErrorCode::BadRequest,
                "failure says why the last of failed failed: it needs failed".into(),
            )),
            None => Ok(None),
        };
    }
    if !names_a_leg {
        return Err((
            ErrorCode::BadRequest,
            "failed moves a leg: it needs call_id".into(),
        ));
    }
    let mut unique: Vec<String> = Vec::with_capacity(failed.len());
    for msr in failed {
        if let Err(error) = names::check(NameKind::Msr, &msr) {
            return Err((ErrorCode::InvalidValue, format!("failed: {error}")));
        }
        if !unique.contains(&msr) {
            unique.push(msr);
        }
    }
    let cause = match failure {
        None => FailureCause::EngineError,
        Some(text) => FailureCause::parse(text).ok_or_else(|| {
            (
                ErrorCode::InvalidValue,
                format!(
                    "failure `{}`: expected timeout, a SIP status 300-699 (503), error or load-limit",
                    msr_shared::logging::printable(text, 32)
                ),
            )
        })?,
    };
    Ok(Some(Failover {
        failed: unique,
        cause,
    }))
}

/// Counts the failure against the MSR `key` is bound to, when it is the
/// last of the failed ones (`failure` says why that one failed; an
/// earlier one failed for a reason not given, and a leg bound elsewhere
/// moved on another collector); then, when the leg used its `attempts`,
/// releases it and returns the refusal.
pub(super) fn apply(
    failover: &Failover,
    key: LegKey<'_>,
    attempts: u32,
    legs: &mut LegTable,
    table: &mut LoadTable,
    health: &mut HealthMonitor,
    now: Instant,
) -> Option<Response> {
    let bound = legs.get(now, key).map(|l| l.msr.to_owned());
    if let Some(msr) = bound
        .as_deref()
        .filter(|m| failover.failed.last().is_some_and(|f| f == m))
    {
        health.core_failure_given_report(now, msr, failover.cause, table);
    }
    let used = u32::try_from(failover.failed.len()).unwrap_or(u32::MAX);
    if used < attempts {
        return None;
    }
    release(legs, table, key, now);
    Some(refusal(
        failover,
        key,
        &format!("it used its {attempts} attempts"),
    ))
}

/// Ends `key` where it is: no MSR is left for it. The release is
/// remembered as the core's would be, so a late copy of an earlier
/// failover of the same leg places nothing (`leg_released`) instead of a
/// leg no one will release.
pub(super) fn release(legs: &mut LegTable, table: &mut LoadTable, key: LegKey<'_>, now: Instant) {
    if legs.release_at(now, key.call_id, key.leg, |msr| table.note_ended(msr, now)) > 0 {
        legs.note_core_release(now, key.call_id, key.leg);
    }
}

/// The `msr_unavailable` answer for `key`, `why` no MSR is left.
pub(super) fn refusal(failover: &Failover, key: LegKey<'_>, why: &str) -> Response {
    let failures = failover.failed.join(", ");
    Response::error(
        ErrorCode::MsrUnavailable,
        format!(
            "no msr left for leg {}: {why}; failed: {failures} (the last: {})",
            super::leg_name(key),
            failover.cause
        ),
    )
}
