//! The control socket's client side: one request line out, one answer line
//! back, within [`super::REPLY_TIMEOUT`] and at most
//! [`super::MAX_REPLY_BYTES`], every failure a [`TransportError`] that says
//! which step failed so that `msrctl` exits `unreachable` with a reason.

use std::path::{Path, PathBuf};
use std::time::Duration;

use msr_shared::admin::{Request, Response};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use super::{MAX_REPLY_BYTES, REPLY_TIMEOUT};

/// Why the collector could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// Connecting to the socket failed.
    #[error(
        "cannot connect to {path}: {source} (is msr-collector running? \
         give its [control] socket with --socket PATH or MSRCTL_SOCKET)"
    )]
    Connect {
        /// Socket path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The path exists but is not a socket.
    #[error(
        "{path} is {what}, not a socket (give the collector's [control] socket \
         with --socket PATH or MSRCTL_SOCKET)"
    )]
    NotASocket {
        /// The path given.
        path: PathBuf,
        /// What it is: `a directory`, `a regular file`, ….
        what: &'static str,
    },
    /// Sending or receiving failed.
    #[error("lost the collector at {path}: {source}")]
    Io {
        /// Socket path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The complete answer did not arrive in time.
    #[error("no answer from the collector at {path} within {limit}")]
    NoAnswer {
        /// Socket path.
        path: PathBuf,
        /// The time allowed, as text (`10 s`).
        limit: String,
    },
    /// The answer was longer than [`MAX_REPLY_BYTES`].
    #[error("the answer from the collector at {path} is longer than {limit} bytes")]
    TooLong {
        /// Socket path.
        path: PathBuf,
        /// The most msrctl reads, bytes.
        limit: usize,
    },
    /// The answer was not a response line.
    #[error("bad answer from the collector at {path}: {reason}")]
    BadAnswer {
        /// Socket path.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// msrctl could not set up its I/O.
    #[error("cannot start msrctl's i/o: {source}")]
    Runtime {
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Sends one request and reads its response, all within [`REPLY_TIMEOUT`].
///
/// Blocking: it runs its own single-threaded tokio runtime.
///
/// # Errors
/// [`TransportError`].
///
/// # Panics
/// When called from async code (inside a tokio runtime).
pub fn call(socket: &Path, request: &Request) -> Result<Response, TransportError> {
    call_within(socket, request, REPLY_TIMEOUT)
}

/// [`call`] with `limit` for the whole exchange (connect, send, the complete
/// answer) instead of [`REPLY_TIMEOUT`].
///
/// # Errors
/// [`TransportError`]; [`TransportError::NoAnswer`] when `limit` runs out.
pub fn call_within(
    socket: &Path,
    request: &Request,
    limit: Duration,
) -> Result<Response, TransportError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|source| TransportError::Runtime { source })?;
    runtime.block_on(async {
        tokio::time::timeout(limit, exchange(socket, request))
            .await
            .unwrap_or_else(|_| {
                Err(TransportError::NoAnswer {
                    path: socket.to_owned(),
                    limit: crate::api::control::describe_duration(limit),
                })
            })
    })
}

/// What is at `path` when connecting to it failed: a clearer error when it
/// exists and is not a socket.
fn connect_error(path: &Path, source: std::io::Error) -> TransportError {
    let what = std::fs::metadata(path)
        .ok()
        .and_then(|meta| crate::api::control::not_a_socket(meta.file_type()));
    match what {
        Some(what) => TransportError::NotASocket {
            path: path.to_owned(),
            what,
        },
        None => TransportError::Connect {
            path: path.to_owned(),
            source,
        },
    }
}

/// Connects to `socket`. While its listen backlog is full (the collector
/// is slower to accept than clients connect), a non-blocking connect fails
/// with `EAGAIN`: retried every 10 ms, until the caller's deadline.
async fn connect(socket: &Path) -> Result<UnixStream, TransportError> {
    loop {
        match UnixStream::connect(socket).await {
            Ok(stream) => return Ok(stream),
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(error) => return Err(connect_error(socket, error)),
        }
    }
}

async fn exchange(socket: &Path, request: &Request) -> Result<Response, TransportError> {
    let io = |source| TransportError::Io {
        path: socket.to_owned(),
        source,
    };
    let bad = |reason: String| TransportError::BadAnswer {
        path: socket.to_owned(),
        reason,
    };
    let mut stream = connect(socket).await?;
    let mut line = serde_json::to_string(request).map_err(|e| bad(e.to_string()))?;
    line.push('\n');
    // A collector that refuses the connection (too many connections)
    // answers at once and closes: the send may fail, but its answer is
    // still there to read.
    let sent = stream.write_all(line.as_bytes()).await;
    let mut answer = Vec::new();
    let most = u64::try_from(MAX_REPLY_BYTES).unwrap_or(u64::MAX) + 1;
    let read = BufReader::new(stream)
        .take(most)
        .read_until(b'\n', &mut answer)
        .await;
    let cut_short = read.is_err();
    if answer.is_empty() {
        sent.map_err(io)?;
        read.map_err(io)?;
    }
    let content = match answer.strip_suffix(b"\n") {
        Some(content) => content,
        None if answer.is_empty() => {
            return Err(bad("connection closed without a response".into()));
        }
        // Cut short: a partial answer is not one.
        None if cut_short => {
            return Err(bad("connection lost in the middle of the response".into()));
        }
        None if answer.len() > MAX_REPLY_BYTES => {
            return Err(TransportError::TooLong {
                path: socket.to_owned(),
                limit: MAX_REPLY_BYTES,
            });
        }
        None => &answer,
    };
    serde_json::from_slice(content).map_err(|e| bad(e.to_string()))
}
