//! `msrctl msr drain NAME [--wait [--timeout SECS]]` (SPEC §14): the MSR
//! gets no new legs (`active false`); with `--wait` its progress is shown
//! until the collector reports it `drained` (no leg of this collector and
//! no call of its engine left).

use std::path::Path;
use std::time::{Duration, Instant};

use msr_shared::admin::{DrainState, MsrInfo, Request, Response, ResponseData};

use super::{call, EXIT_REFUSED, EXIT_UNREACHABLE};

/// How often the progress is asked for.
const POLL: Duration = Duration::from_secs(1);

/// The progress line while the collector does not answer.
const UNREACHABLE: &str = "(collector unreachable)";

/// Runs the drain of `msr`; returns the exit code.
pub(super) fn run(socket: &Path, msr: &str, wait: bool, timeout: Option<Duration>) -> i32 {
    // An MSR the collector never heard of would be "drained" at once: a
    // typo must not read as success.
    match info(socket, msr) {
        Ok(Some(m)) if super::render::settings_only(&m) => {
            eprintln!(
                "error: msr `{msr}` is not registered (only settings are kept for the name): \
                 nothing to drain; `msrctl msr set {msr} active false` keeps it out of \
                 selection when it registers"
            );
            return EXIT_REFUSED;
        }
        Ok(Some(_)) => {}
        Ok(None) => {
            eprintln!("error: no msr `{msr}` is known to this collector (see msrctl msr list)");
            return EXIT_REFUSED;
        }
        Err((code, message)) => {
            eprintln!("error: {message}");
            return code;
        }
    }
    let request = Request::MsrSetActive {
        msr: msr.to_owned(),
        active: false,
    };
    match call(socket, &request) {
        Ok(Response::Ok(_)) => {}
        Ok(Response::Err(body)) => {
            eprintln!("error: {}: {}", body.code.as_str(), body.message);
            return EXIT_REFUSED;
        }
        Err(error) => {
            eprintln!("error: {error}");
            return EXIT_UNREACHABLE;
        }
    }
    if !wait {
        let _ = super::put(&format!(
            "{msr}: draining (no new legs); `msrctl msr drain {msr} --wait` shows when it is empty\n"
        ));
        return 0;
    }
    let started = Instant::now();
    let mut last = String::new();
    loop {
        let info = match info(socket, msr) {
            Ok(Some(info)) => info,
            // The collector restarts (a package upgrade, kill -9): the
            // drain is in its store, so the wait goes on until it answers
            // again, or until --timeout.
            Err((EXIT_UNREACHABLE, message)) => {
                if let Some(limit) = timeout.filter(|limit| started.elapsed() >= *limit) {
                    eprintln!(
                        "error: {msr} is not drained after {} s and the collector does not answer",
                        limit.as_secs()
                    );
                    return EXIT_UNREACHABLE;
                }
                if last != UNREACHABLE {
                    eprintln!("{msr}: the collector does not answer ({message}); waiting for it");
                    last = UNREACHABLE.to_owned();
                }
                std::thread::sleep(POLL);
                continue;
            }
            // Gone from the collector's view: nothing is left on it.
            Ok(None) => {
                let _ = super::put(&format!(
                    "{msr}: drained (no longer known to the collector)\n"
                ));
                return 0;
            }
            Err((code, message)) => {
                eprintln!("error: {message}");
                return code;
            }
        };
        let line = progress(&info);
        if info.drain == Some(DrainState::Drained) {
            let _ = super::put(&format!("{line}\n"));
            return 0;
        }
        if !info.active {
            if line != last {
                eprintln!("{line}");
                last = line;
            }
        } else {
            eprintln!("error: {msr} was set active again: the drain was called off");
            return EXIT_REFUSED;
        }
        if let Some(limit) = timeout {
            if started.elapsed() >= limit {
                eprintln!(
                    "error: {msr} is not drained after {} s: {last}",
                    limit.as_secs()
                );
                return EXIT_REFUSED;
            }
        }
        std::thread::sleep(POLL);
    }
}

/// Checks, before `msrctl msr undrain NAME`, that the collector knows
/// `msr`: like a drain, an undrain of a typo must not read as success.
/// `Err` is the exit code, the error printed.
pub(super) fn check_known(socket: &Path, msr: &str) -> Result<(), i32> {
    let known = info(socket, msr).map_err(|(code, message)| {
        eprintln!("error: {message}");
        code
    })?;
    match known {
        Some(_) => Ok(()),
        None => {
            eprintln!("error: no msr `{msr}` is known to this collector (see msrctl msr list)");
            Err(EXIT_REFUSED)
        }
    }
}

/// `msr`'s row of `msr list`, `None` when the collector does not list it;
/// the exit code and the message when it cannot be had.
fn info(socket: &Path, msr: &str) -> Result<Option<MsrInfo>, (i32, String)> {
    match call(socket, &Request::MsrList {}) {
        Ok(Response::Ok(ResponseData::Msrs { msrs })) => {
            Ok(msrs.into_iter().find(|m| m.name == msr))
        }
        Ok(Response::Ok(other)) => Err((
            EXIT_UNREACHABLE,
            format!("unexpected answer to msr list: {other:?}"),
        )),
        Ok(Response::Err(body)) => Err((
            EXIT_REFUSED,
            format!("{}: {}", body.code.as_str(), body.message),
        )),
        Err(error) => Err((EXIT_UNREACHABLE, error.to_string())),
    }
}

/// One line of progress: `msr_1: draining, 3 live legs, engine 4 calls,
/// oldest leg 83 s`.
fn progress(info: &MsrInfo) -> String {
    let state = info.drain.map_or("in service", DrainState::as_str);
    let calls = info.engine_calls.map_or_else(
        || "no engine report".to_owned(),
        |c| format!("engine {c} calls"),
    );
    let oldest = info
        .oldest_leg_secs
        .map(|s| format!(", oldest leg {s} s"))
        .unwrap_or_default();
    format!(
        "{}: {state}, {} live legs, {calls}{oldest}",
        info.name, info.live_legs
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_reads_as_a_sentence() {
        let info = MsrInfo {
            name: "msr_1".into(),
            performance_coefficient: 1.0,
            active: false,
            registered: true,
            load_limit: 100,
            live_legs: 3,
            oldest_leg_secs: Some(83),
            health: None,
            health_since_unix: None,
            engine_calls: Some(4),
            gone_since_unix: None,
            gone_cause: None,
            gone_while_serving: false,
            drain: Some(DrainState::Draining),
        };
        assert_eq!(
            progress(&info),
            "msr_1: draining, 3 live legs, engine 4 calls, oldest leg 83 s"
        );
    }
}
