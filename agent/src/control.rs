//! The agent's control socket (SPEC §14's MSR-side drain): a Unix stream
//! socket on which `msr-agent drain`, `undrain` and `status` talk to the
//! running agent. One request line, one answer line, then the connection
//! closes:
//!
//! ```text
//! → drain exit-when-empty
//! ← ok service=draining engine=up calls=3 drained=no exit-when-empty=yes
//! → frobnicate
//! ← error unknown request "frobnicate" (accepted: drain, drain exit-when-empty, undrain, status)
//! ```
//!
//! This module is the wire form (both sides) and the command line's
//! blocking client ([`ask`]); the daemon's listener lives in the shell,
//! the drain state in [`crate::drain`].

use std::fmt;
use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use msr_shared::event_package::{EngineState, Service};

use crate::drain::WhenDrained;

/// Where the agent listens when `--control-socket` is not given: under the
/// systemd unit's `RuntimeDirectory=msr-agent`.
pub const DEFAULT_CONTROL_SOCKET: &str = "/run/msr-agent/control.sock";

/// The longest request or answer line read.
pub const MAX_LINE: usize = 512;

/// How long the client waits for the agent's answer.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// A request to the running agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlRequest {
    /// Take no new legs; `Exit`: exit once the engine is empty.
    Drain(WhenDrained),
    /// New legs welcome again.
    Undrain,
    /// The drain's state, the engine's sessions.
    Status,
}

impl ControlRequest {
    const ACCEPTED: &'static str = "drain, drain exit-when-empty, undrain, status";

    /// Reads a request line.
    ///
    /// # Errors
    /// The answer line to send back for an unknown request.
    pub fn parse(line: &str) -> Result<Self, String> {
        match line.split_whitespace().collect::<Vec<_>>().as_slice() {
            ["drain"] => Ok(ControlRequest::Drain(WhenDrained::Stay)),
            ["drain", "exit-when-empty"] => Ok(ControlRequest::Drain(WhenDrained::Exit)),
            ["undrain"] => Ok(ControlRequest::Undrain),
            ["status"] => Ok(ControlRequest::Status),
            _ => Err(format!(
                "error unknown request {:?} (accepted: {})",
                line.trim(),
                Self::ACCEPTED
            )),
        }
    }
}

impl fmt::Display for ControlRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlRequest::Drain(WhenDrained::Stay) => f.write_str("drain"),
            ControlRequest::Drain(WhenDrained::Exit) => f.write_str("drain exit-when-empty"),
            ControlRequest::Undrain => f.write_str("undrain"),
            ControlRequest::Status => f.write_str("status"),
        }
    }
}

/// The agent's answer to every request: where it stands after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlAnswer {
    /// `active` or `draining`.
    pub service: Service,
    /// What the engine probe sees.
    pub engine: EngineState,
    /// The engine's sessions at the last sample.
    pub calls: u32,
    /// Draining, and the engine has been empty for
    /// [`EMPTY_FOR`](crate::drain::EMPTY_FOR).
    pub drained: bool,
    /// What happens once drained.
    pub when_drained: WhenDrained,
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

impl fmt::Display for ControlAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ok service={} engine={} calls={} drained={} exit-when-empty={}",
            self.service,
            self.engine,
            self.calls,
            yes_no(self.drained),
            yes_no(self.when_drained == WhenDrained::Exit)
        )
    }
}

impl ControlAnswer {
    /// Reads an answer line.
    ///
    /// # Errors
    /// [`ControlError::Refused`] for an `error …` line,
    /// [`ControlError::Garbled`] for anything not an answer.
    pub fn parse(line: &str) -> Result<Self, ControlError> {
        let line = line.trim();
        if let Some(text) = line.strip_prefix("error ") {
            return Err(ControlError::Refused(text.to_owned()));
        }
        let garbled = || ControlError::Garbled(line.to_owned());
        let fields = line.strip_prefix("ok ").ok_or_else(garbled)?;
        let mut answer = ControlAnswer {
            service: Service::Active,
            engine: EngineState::Unchecked,
            calls: 0,
            drained: false,
            when_drained: WhenDrained::Stay,
        };
        for field in fields.split_whitespace() {
            let (name, value) = field.split_once('=').ok_or_else(garbled)?;
            match (name, value) {
                ("service", "active") => answer.service = Service::Active,
                ("service", "draining") => answer.service = Service::Draining,
                ("engine", "up") => answer.engine = EngineState::Up,
                ("engine", "down") => answer.engine = EngineState::Down,
                ("engine", "unchecked") => answer.engine = EngineState::Unchecked,
                ("calls", n) => answer.calls = n.parse().map_err(|_| garbled())?,
                ("drained", v) => answer.drained = v == "yes",
                ("exit-when-empty", "yes") => answer.when_drained = WhenDrained::Exit,
                ("exit-when-empty", _) => answer.when_drained = WhenDrained::Stay,
                // Fields of a newer agent.
                _ => {}
            }
        }
        Ok(answer)
    }
}

/// Why a request to the running agent failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// Nothing listens at the socket: no agent runs, or it runs with
    /// another `--control-socket`.
    #[error(
        "no msr-agent answers at {}: {source} (is the agent running, with this --control-socket?)",
        path.display()
    )]
    NotRunning {
        /// The socket's path.
        path: PathBuf,
        /// The connect error.
        source: std::io::Error,
    },
    /// The connection broke or timed out.
    #[error("control socket {}: {source}", path.display())]
    Io {
        /// The socket's path.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// The agent refused the request (`error …`).
    #[error("the agent refused: {0}")]
    Refused(String),
    /// The answer is not one.
    #[error("the agent's answer is not understood: {0:?}")]
    Garbled(String),
}

impl ControlError {
    /// Whether the agent is (no longer) there.
    pub fn is_not_running(&self) -> bool {
        matches!(self, ControlError::NotRunning { .. })
    }
}

/// Sends `request` to the agent listening at `path` and reads its answer
/// (blocking, at most [`ANSWER_TIMEOUT`]).
///
/// # Errors
/// [`ControlError`].
pub fn ask(path: &Path, request: ControlRequest) -> Result<ControlAnswer, ControlError> {
    let stream = UnixStream::connect(path).map_err(|source| ControlError::NotRunning {
        path: path.to_path_buf(),
        source,
    })?;
    let io = |source| ControlError::Io {
        path: path.to_path_buf(),
        source,
    };
    stream.set_read_timeout(Some(ANSWER_TIMEOUT)).map_err(io)?;
    stream.set_write_timeout(Some(ANSWER_TIMEOUT)).map_err(io)?;
    (&stream)
        .write_all(format!("{request}\n").as_bytes())
        .map_err(io)?;
    let mut line = String::new();
    BufReader::new(std::io::Read::take(&stream, MAX_LINE as u64))
        .read_line(&mut line)
        .map_err(io)?;
    ControlAnswer::parse(&line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_answers_read_back_what_is_written() {
        for request in [
            ControlRequest::Drain(WhenDrained::Stay),
            ControlRequest::Drain(WhenDrained::Exit),
            ControlRequest::Undrain,
            ControlRequest::Status,
        ] {
            assert_eq!(ControlRequest::parse(&request.to_string()), Ok(request));
        }
        let refused = ControlRequest::parse("reboot").expect_err("unknown");
        assert!(
            refused.starts_with("error unknown request \"reboot\""),
            "{refused}"
        );
        let answer = ControlAnswer {
            service: Service::Draining,
            engine: EngineState::Down,
            calls: 12,
            drained: false,
            when_drained: WhenDrained::Exit,
        };
        let line = answer.to_string();
        assert_eq!(
            line,
            "ok service=draining engine=down calls=12 drained=no exit-when-empty=yes"
        );
        assert_eq!(ControlAnswer::parse(&line).ok(), Some(answer));
        assert!(matches!(
            ControlAnswer::parse("error shutting down"),
            Err(ControlError::Refused(t)) if t == "shutting down"
        ));
        assert!(matches!(
            ControlAnswer::parse("hello"),
            Err(ControlError::Garbled(_))
        ));
    }
}
