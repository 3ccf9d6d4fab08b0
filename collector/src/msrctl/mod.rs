//! `msrctl`, the admin CLI (SPEC §8): parses a command, sends one
//! [`Request`](msr_shared::admin::Request) line to the collector's control socket, prints the response as
//! a box table (or JSON with `--json`).
//!
//! The seed's ECSS slash paths are accepted as aliases:
//! `msrctl system/media/site/declare NAME` is `msrctl site declare NAME`,
//! `system/media/msr/subscription/list` is `subscription list`.
//!
//! Exit codes: 0 done; 1 the collector refused the request; 2 usage error;
//! 3 cannot reach the collector (connect, send or receive failed, no
//! complete answer within [`REPLY_TIMEOUT`]) or it answered `unavailable`
//! (shutting down, too many connections).

pub mod render;

mod cli;
mod drain;
mod transport;

pub use cli::{
    rewrite_aliases, Cli, ClusterCommand, Command, LegCommand, MsrCommand, MsrProperty,
    ResourceCommand, ResourceProperty, SelectArgs, SiteCommand, SubscriptionCommand,
    SubscriptionProperty,
};
pub use transport::{call, call_within, TransportError};

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use msr_shared::admin::{ErrorCode, Response};

/// Default control socket path.
pub const DEFAULT_SOCKET: &str = "/run/msr-collector/control.sock";

/// The environment variable naming the control socket when `--socket` is
/// not given; unset or empty means [`DEFAULT_SOCKET`].
pub const SOCKET_ENV: &str = "MSRCTL_SOCKET";

/// Exit code: the collector refused the request.
pub const EXIT_REFUSED: i32 = 1;
/// Exit code: bad command line.
pub const EXIT_USAGE: i32 = 2;
/// Exit code: the collector could not be reached.
pub const EXIT_UNREACHABLE: i32 = 3;

/// The longest msrctl waits for the whole exchange with the collector
/// (connect, send the request, read the complete answer): 10 s.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest answer msrctl reads, in bytes (64 MiB, newline not counted).
pub const MAX_REPLY_BYTES: usize = 64 * 1024 * 1024;

impl Cli {
    /// The control socket to use: `--socket`, else [`SOCKET_ENV`] from the
    /// environment, else [`DEFAULT_SOCKET`].
    pub fn socket_path(&self) -> PathBuf {
        resolve_socket(self.socket.as_deref(), std::env::var_os(SOCKET_ENV))
    }
}

/// The control socket to use: `flag` (`--socket`) if given, else `env` (the
/// value of [`SOCKET_ENV`]) unless it is unset or empty, else
/// [`DEFAULT_SOCKET`].
pub fn resolve_socket(flag: Option<&Path>, env: Option<OsString>) -> PathBuf {
    match (flag, env) {
        (Some(path), _) => path.to_owned(),
        (None, Some(value)) if !value.is_empty() => PathBuf::from(value),
        (None, _) => PathBuf::from(DEFAULT_SOCKET),
    }
}

/// What `msrctl` prints and its exit code, computed from a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// Text for stdout.
    pub stdout: String,
    /// Text for stderr.
    pub stderr: String,
    /// Process exit code.
    pub code: i32,
}

/// Turns a response into output (pure).
pub fn output(command: &Command, json: bool, response: &Response) -> Output {
    match response {
        Response::Ok(data) => {
            let stdout = if json {
                let mut text = serde_json::to_string_pretty(data).unwrap_or_default();
                text.push('\n');
                text
            } else {
                let view = match command {
                    Command::Resource(ResourceCommand::List { filter, wide }) => {
                        render::ResourceView {
                            active_only: filter.is_some(),
                            wide: *wide,
                        }
                    }
                    _ => render::ResourceView::default(),
                };
                let text = render::response(data, view);
                match command {
                    // The answer is the list without it: say what happened.
                    Command::Msr(MsrCommand::Forget { name }) => format!(
                        "Forgot msr {}: its row is gone until it registers again.\n{text}",
                        msr_shared::logging::printable(name, 64)
                    ),
                    _ => text,
                }
            };
            Output {
                stdout,
                stderr: String::new(),
                code: 0,
            }
        }
        Response::Err(body) => {
            let (mut message, explain) = render::error(body);
            if json {
                // The protocol's error object, without the explanation
                // (which goes to stdout).
                message =
                    serde_json::json!({ "code": body.code, "message": body.message }).to_string();
            }
            let stdout = if json {
                body.explain
                    .as_ref()
                    .and_then(|e| serde_json::to_string_pretty(e).ok())
                    .map(|text| text + "\n")
                    .unwrap_or_default()
            } else {
                explain.unwrap_or_default()
            };
            // `unavailable`: the collector is shutting down or has too many
            // connections; it cannot be reached for now.
            let code = if body.code == ErrorCode::Unavailable {
                EXIT_UNREACHABLE
            } else {
                EXIT_REFUSED
            };
            Output {
                stdout,
                stderr: message + "\n",
                code,
            }
        }
    }
}

/// Runs `msrctl` with these arguments (program name first); returns the exit
/// code.
pub fn run(args: Vec<OsString>) -> i32 {
    let cli = match Cli::try_parse_from(rewrite_aliases(args)) {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return if error.use_stderr() { EXIT_USAGE } else { 0 };
        }
    };
    if let Command::Msr(MsrCommand::Drain {
        name,
        wait,
        timeout,
    }) = &cli.command
    {
        return drain::run(
            &cli.socket_path(),
            name,
            *wait,
            timeout.map(Duration::from_secs),
        );
    }
    if let Command::Msr(MsrCommand::Undrain { name }) = &cli.command {
        if let Err(code) = drain::check_known(&cli.socket_path(), name) {
            return code;
        }
    }
    let request = cli.command.to_request();
    let response = match call(&cli.socket_path(), &request) {
        Ok(response) => response,
        Err(error) => {
            eprintln!("error: {error}");
            return EXIT_UNREACHABLE;
        }
    };
    let out = output(&cli.command, cli.json, &response);
    let written = put(&out.stdout);
    {
        use std::io::Write as _;
        let _ = std::io::stderr().lock().write_all(out.stderr.as_bytes());
    }
    match written {
        Ok(()) => out.code,
        Err(error) => {
            eprintln!("error: cannot write the answer to stdout: {error}");
            out.code.max(1)
        }
    }
}

/// Writes `text` to stdout. A reader that went away (`msrctl msr list |
/// head -1`) is no reason to panic, nor an error: the rest is dropped, and
/// the exit status still says how the request went. Any other failure (a
/// full disk under `--json > file`) is: a script must not take the answer
/// it never saved for a success.
fn put(text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests;
