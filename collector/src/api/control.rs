//! The control socket (SPEC §8): [`serve`] runs the Unix-socket server —
//! one task per connection, one JSON request per line, one JSON response
//! per line. It owns no state; each request goes to the collector's main
//! loop as an [`AdminCommand`], which the core answers
//! ([`Collector::handle_admin_from`](crate::core::Collector::handle_admin_from)),
//! but a `select` that changes nothing, answered from the loop's copy
//! ([`crate::api::read_only`]) without a trip through the loop.
//! At most [`MAX_CONNECTIONS`] connections are served at once, at most
//! [`MAX_CONNECTIONS_PER_CLIENT`] per user id of the connecting process
//! (peer credentials) with [`RESERVED_CONNECTIONS`] kept for root and the
//! collector's user ([`quota`]), and one that sends no complete request
//! line for [`IDLE_TIMEOUT`] is closed.

pub mod quota;

#[cfg(test)]
mod tests;

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use msr_shared::admin::{ErrorCode, Request, Response};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, Notify, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::api::read_only::ReadOnly;
use crate::core::admin::Origin;
use quota::{Client, ConnectionQuota, QuotaPolicy};

/// Longest accepted request line, in bytes, not counting its newline: a
/// line of exactly this many bytes is read; one byte more is refused and
/// the connection closed.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// Mode of the control socket: owner and group may connect.
pub const SOCKET_MODE: u32 = 0o660;

/// One request from a control connection, with the channel for its answer.
#[derive(Debug)]
pub struct AdminCommand {
    /// The parsed request.
    pub request: Request,
    /// Where the main loop sends the response.
    pub reply: oneshot::Sender<Response>,
    /// Who asked: the log names them with each change (SPEC §16).
    pub origin: Origin,
}

/// Binds the control socket at `path` and sets its mode to 0660. A stale
/// socket file (nobody listening) is removed first; a live one, or a path
/// that is not a socket, is an error.
///
/// # Errors
/// `AddrInUse` when another collector listens there; `AlreadyExists` when
/// the path is not a socket; other I/O errors from bind/chmod.
pub fn bind_control_socket(path: &Path) -> io::Result<UnixListener> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "control socket {} is in use by a running collector",
                        path.display()
                    ),
                ));
            }
            std::fs::remove_file(path)?;
        }
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))?;
    tracing::debug!(path = %path.display(), "control socket listening");
    Ok(listener)
}

/// The most control connections served at once; one more is answered
/// with an `unavailable` error line and closed, so idle clients cannot use
/// up the collector's file descriptors. Only live connections count: a
/// connection's slot is free again as soon as it is closed.
pub const MAX_CONNECTIONS: usize = 256;

/// The most control connections one user id holds at once (the client's
/// peer credentials): a local client holding them all cannot lock msrctl
/// out.
pub const MAX_CONNECTIONS_PER_CLIENT: usize = 64;

/// Of [`MAX_CONNECTIONS`], the places only root and the collector's own
/// user (the socket's owner) may take: msrctl run by them is served however
/// many other users hold connections.
pub const RESERVED_CONNECTIONS: usize = 16;

/// How long a control connection may go without sending a complete request
/// line: 60 s. The timer starts when the connection is accepted and again
/// after each response; when it runs out the connection gets an
/// `unavailable` error line and is closed. Writing one response is bounded
/// by the same time (a client that does not read its answers is closed).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The limits [`serve_with`] applies; [`serve`] uses the default
/// ([`MAX_CONNECTIONS`], [`MAX_CONNECTIONS_PER_CLIENT`],
/// [`RESERVED_CONNECTIONS`], [`IDLE_TIMEOUT`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// Connections served at once.
    pub max_connections: usize,
    /// Connections served at once per user id.
    pub per_client: usize,
    /// Places kept for root and the socket's owner.
    pub reserved: usize,
    /// Longest wait for a complete request line, and for writing one
    /// response line.
    pub idle_timeout: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            max_connections: MAX_CONNECTIONS,
            per_client: MAX_CONNECTIONS_PER_CLIENT,
            reserved: RESERVED_CONNECTIONS,
            idle_timeout: IDLE_TIMEOUT,
        }
    }
}

/// Serves control connections until `shutdown` is cancelled: one task per
/// connection; each request line becomes an [`AdminCommand`] on `tx`.
/// Applies the default [`ServeLimits`].
pub async fn serve(
    listener: UnixListener,
    tx: mpsc::Sender<AdminCommand>,
    read_only: ReadOnly,
    shutdown: CancellationToken,
) {
    serve_with(listener, tx, read_only, shutdown, ServeLimits::default()).await;
}

/// [`serve`] with the given limits.
pub async fn serve_with(
    listener: UnixListener,
    tx: mpsc::Sender<AdminCommand>,
    read_only: ReadOnly,
    shutdown: CancellationToken,
    limits: ServeLimits,
) {
    // Each connection task holds its place until it ends, so the count is
    // of live connections whether or not its task has been reaped yet.
    let places = Places::new(
        QuotaPolicy {
            total: limits.max_connections,
            per_client: limits.per_client,
            reserved: limits.reserved,
        },
        socket_owner(&listener),
    );
    let mut connections = JoinSet::new();
    loop {
        // The set keeps finished tasks until they are joined.
        while connections.try_join_next().is_some() {}
        tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let peer = stream.peer_cred().ok();
                    match places.admit(peer.map(|p| p.uid())).await {
                        Ok(place) => {
                            let origin = Origin::Control { uid: peer.map(|p| p.uid()) };
                            let task = connection(stream, (tx.clone(), read_only.clone()), shutdown.clone(), limits.idle_timeout, origin);
                            connections.spawn(async move {
                                task.await;
                                drop(place);
                            });
                        }
                        Err(refusal) => refuse(stream, peer, refusal, limits),
                    }
                }
                Err(error) => {
                    tracing::warn!(cause = %error, "control socket accept failed");
                    // Avoids a hot loop on persistent errors such as EMFILE.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
    connections.shutdown().await;
}

/// How long a connection past the limit waits for a place before it is
/// refused: 100 ms. Connections whose clients have closed them keep their
/// place until their task has seen the end of the stream; under a flood of
/// connect(); close() those tasks may not have run yet.
const ADMIT_GRACE: Duration = Duration::from_millis(100);

/// A place for a new connection: at once if one is free, else the first
/// freed within [`ADMIT_GRACE`].
pub(crate) async fn admit(permits: &Arc<Semaphore>) -> Option<tokio::sync::OwnedSemaphorePermit> {
    if let Ok(permit) = Arc::clone(permits).try_acquire_owned() {
        return Some(permit);
    }
    tokio::time::timeout(ADMIT_GRACE, Arc::clone(permits).acquire_owned())
        .await
        .ok()?
        .ok()
}

/// The user id owning the control socket (the collector's user: it bound
/// it), if it can be read.
fn socket_owner(listener: &UnixListener) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let addr = listener.local_addr().ok()?;
    Some(std::fs::metadata(addr.as_pathname()?).ok()?.uid())
}

/// The places of the control connections ([`ConnectionQuota`]), shared by
/// the accept loop and the connection tasks that give them back.
#[derive(Debug, Clone)]
struct Places {
    quota: Arc<Mutex<ConnectionQuota>>,
    /// Woken whenever a place is given back.
    freed: Arc<Notify>,
}

/// A connection's place, given back when dropped.
#[derive(Debug)]
struct Place {
    places: Places,
    client: Client,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.places.lock().release(self.client);
        self.places.freed.notify_waiters();
    }
}

impl Places {
    fn new(policy: QuotaPolicy, owner: Option<u32>) -> Self {
        Self {
            quota: Arc::new(Mutex::new(ConnectionQuota::new(policy, owner))),
            freed: Arc::new(Notify::new()),
        }
    }

    /// The quota. Its methods do not panic, so a poisoned lock (a panic
    /// elsewhere while it was held) still guards consistent counts.
    fn lock(&self) -> std::sync::MutexGuard<'_, ConnectionQuota> {
        self.quota
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn try_admit(&self, client: Client) -> Result<Place, quota::Refusal> {
        self.lock().admit(client)?;
        Ok(Place {
            places: self.clone(),
            client,
        })
    }

    /// A place for a connection of `client`: at once if the quota allows,
    /// else when a place given back within [`ADMIT_GRACE`] makes it allow.
    /// The accept loop waits here, so a client refused after a wait is
    /// refused without one for a while ([`ConnectionQuota::may_wait`]): a
    /// client connecting in a loop past its share cannot hold the loop up.
    async fn admit(&self, client: Client) -> Result<Place, quota::Refusal> {
        let deadline = tokio::time::Instant::now() + ADMIT_GRACE;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before the check, so a place given back between
            // the check and the wait is not missed.
            freed.as_mut().enable();
            let now = tokio::time::Instant::now();
            match self.try_admit(client) {
                Ok(place) => return Ok(place),
                Err(refusal) if now >= deadline || !self.may_wait(client, now) => {
                    self.waited_in_vain(client, now);
                    return Err(refusal);
                }
                Err(_) => {}
            }
            let _ = tokio::time::timeout_at(deadline, freed).await;
        }
    }

    fn may_wait(&self, client: Client, now: tokio::time::Instant) -> bool {
        self.lock().may_wait(client, now)
    }

    fn waited_in_vain(&self, client: Client, now: tokio::time::Instant) {
        self.lock().waited_in_vain(client, now);
    }
}

/// Answers a connection the quota refused with an `unavailable` line and
/// closes it. The warning is rate limited (target
/// [`msr_shared::logging::NETWORK`]): a client may connect in a loop.
fn refuse(
    stream: UnixStream,
    peer: Option<tokio::net::unix::UCred>,
    refusal: quota::Refusal,
    limits: ServeLimits,
) {
    tracing::warn!(
        target: msr_shared::logging::NETWORK,
        uid = peer.map(|p| p.uid()),
        pid = peer.and_then(|p| p.pid()),
        reason = %refusal,
        "control connection refused"
    );
    let line = response_line(&Response::error(
        ErrorCode::Unavailable,
        refusal.to_string(),
    ));
    tokio::spawn(async move {
        let mut stream = stream;
        let _ = tokio::time::timeout(limits.idle_timeout, stream.write_all(line.as_bytes())).await;
    });
}

fn response_line(response: &Response) -> String {
    let mut line = serde_json::to_string(response).unwrap_or_else(|_| {
        r#"{"ok":false,"error":{"code":"unavailable","message":"response could not be encoded"}}"#.to_owned()
    });
    line.push('\n');
    line
}

/// What a path that should be the control socket is instead, for error
/// messages: `None` for a socket, else `a directory`, `a regular file`,
/// `a symbolic link` or `a special file`.
pub(crate) fn not_a_socket(kind: std::fs::FileType) -> Option<&'static str> {
    if kind.is_socket() {
        None
    } else if kind.is_dir() {
        Some("a directory")
    } else if kind.is_file() {
        Some("a regular file")
    } else if kind.is_symlink() {
        Some("a symbolic link")
    } else {
        Some("a special file")
    }
}

/// `60 s`, or `250 ms` for a duration that is not whole seconds.
pub(crate) fn describe_duration(duration: Duration) -> String {
    if duration.subsec_nanos() == 0 {
        format!("{} s", duration.as_secs())
    } else {
        format!("{} ms", duration.as_millis())
    }
}

/// Writes one response line, within `limit`; `false` when the connection
/// should be closed (write failed or timed out).
async fn send(write: &mut OwnedWriteHalf, response: &Response, limit: Duration) -> bool {
    let line = response_line(response);
    matches!(
        tokio::time::timeout(limit, write.write_all(line.as_bytes())).await,
        Ok(Ok(()))
    )
}

/// What one read of a request line gave.
enum Line<'a> {
    /// The line's content, without its newline.
    Request(&'a [u8]),
    /// More than [`MAX_LINE_BYTES`] without a newline.
    TooLong,
}

/// Splits what `read_until` gave, reading at most `MAX_LINE_BYTES + 1`
/// bytes: the content of a line ends before its newline; a last line may
/// end at end of file instead.
fn split_line(buf: &[u8]) -> Line<'_> {
    match buf.strip_suffix(b"\n") {
        Some(content) => Line::Request(content),
        None if buf.len() > MAX_LINE_BYTES => Line::TooLong,
        None => Line::Request(buf),
    }
}

async fn connection(
    stream: UnixStream,
    (tx, read_only): (mpsc::Sender<AdminCommand>, ReadOnly),
    shutdown: CancellationToken,
    idle_timeout: Duration,
    origin: Origin,
) {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut buf = Vec::new();
    // The content of a line plus its newline.
    let limit = u64::try_from(MAX_LINE_BYTES).unwrap_or(u64::MAX) + 1;
    loop {
        buf.clear();
        let mut limited = (&mut reader).take(limit);
        let read = tokio::select! {
            () = shutdown.cancelled() => return,
            read = tokio::time::timeout(idle_timeout, limited.read_until(b'\n', &mut buf)) => read,
        };
        match read {
            Err(_) => {
                tracing::debug!(
                    idle_timeout = %describe_duration(idle_timeout),
                    "control connection idle, closing"
                );
                let response = Response::error(
                    ErrorCode::Unavailable,
                    format!(
                        "no complete request line within {}: connection closed",
                        describe_duration(idle_timeout)
                    ),
                );
                send(&mut write, &response, idle_timeout).await;
                return;
            }
            Ok(Ok(0)) => return,
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                tracing::debug!(cause = %error, "control connection read failed");
                return;
            }
        }
        let content = match split_line(&buf) {
            Line::Request(content) => content,
            Line::TooLong => {
                let response = Response::error(
                    ErrorCode::BadRequest,
                    format!("request line longer than {MAX_LINE_BYTES} bytes"),
                );
                send(&mut write, &response, idle_timeout).await;
                return;
            }
        };
        let response = match std::str::from_utf8(content) {
            Err(error) => Response::error(
                ErrorCode::BadRequest,
                format!(
                    "invalid request: not valid utf-8 (at byte {})",
                    error.valid_up_to()
                ),
            ),
            Ok(text) if text.trim().is_empty() => continue,
            Ok(text) => match serde_json::from_str::<Request>(text.trim()) {
                Err(error) => {
                    Response::error(ErrorCode::BadRequest, format!("invalid request: {error}"))
                }
                Ok(request) => {
                    if let Some(response) = read_only.answer(&request) {
                        response
                    } else {
                        let (reply, answer) = oneshot::channel();
                        let command = AdminCommand {
                            request,
                            reply,
                            origin,
                        };
                        if tx.send(command).await.is_err() {
                            Response::error(ErrorCode::Unavailable, "collector is shutting down")
                        } else {
                            answer.await.unwrap_or_else(|_| {
                                Response::error(
                                    ErrorCode::Unavailable,
                                    "collector dropped the request",
                                )
                            })
                        }
                    }
                }
            },
        };
        if !send(&mut write, &response, idle_timeout).await {
            return;
        }
    }
}
