//! The control socket's I/O (the wire form is [`crate::control`]): a Unix
//! listener whose connections each carry one request line to the loop
//! and its answer back. The drain state itself is the loop's
//! ([`crate::drain::Drain`]).
//!
//! The socket is created at start; a socket file already there is taken
//! over only when nothing answers on it (a stale socket of a killed
//! agent), never from a running agent, and a file that is not a socket is
//! never removed. A socket that cannot be had is logged, and the
//! agent runs without one: a drain is a convenience, not a reason to stop
//! reporting load.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::control::{ControlRequest, MAX_LINE};

/// How long a client may take to send its request line.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// A request for the loop and where its answer line goes.
pub(super) struct ControlCommand {
    pub(super) request: ControlRequest,
    pub(super) reply: oneshot::Sender<String>,
}

/// The listening socket: its task stops and its file is removed on drop.
pub(super) struct ControlSocket {
    path: PathBuf,
    task: JoinHandle<()>,
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Listens at `path`; `None` (logged) when it cannot.
pub(super) fn listen(path: &Path) -> Option<(mpsc::Receiver<ControlCommand>, ControlSocket)> {
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        warn!(socket = %path.display(), "another msr-agent answers on the control socket: this one runs without (see --control-socket)");
        return None;
    }
    // Nothing answers: a stale socket of an agent that was killed is
    // removed. Anything else at the path (a config file named by mistake
    // in --control-socket) is the operator's and stays.
    match std::fs::symlink_metadata(path) {
        Ok(meta) if std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()) => {
            let _ = std::fs::remove_file(path);
        }
        Ok(_) => {
            warn!(socket = %path.display(), "the control socket's path is taken by a file that is not a socket: this agent runs without one (see --control-socket)");
            return None;
        }
        Err(_) => {}
    }
    let listener = match UnixListener::bind(path) {
        Ok(l) => l,
        Err(e) => {
            warn!(socket = %path.display(), error = %e, "cannot listen on the control socket: msr-agent drain, undrain and status will not reach this agent (see --control-socket)");
            return None;
        }
    };
    {
        use std::os::unix::fs::PermissionsExt as _;
        // The agent's user and group (and root) may drain it.
        if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)) {
            warn!(socket = %path.display(), error = %e, "cannot set the control socket's mode");
        }
    }
    info!(socket = %path.display(), "control socket listening on {}", path.display());
    let (tx, rx) = mpsc::channel(16);
    let task = tokio::spawn(accept(listener, tx));
    Some((
        rx,
        ControlSocket {
            path: path.to_path_buf(),
            task,
        },
    ))
}

async fn accept(listener: UnixListener, commands: mpsc::Sender<ControlCommand>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(serve(stream, commands.clone()));
            }
            Err(e) => {
                warn!(error = %e, "control socket accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn serve(stream: UnixStream, commands: mpsc::Sender<ControlCommand>) {
    let (read, mut write) = stream.into_split();
    let mut bytes = Vec::new();
    let mut reader = BufReader::new(read.take(MAX_LINE as u64));
    let read = tokio::time::timeout(REQUEST_TIMEOUT, reader.read_until(b'\n', &mut bytes)).await;
    let answer = match read {
        // Bytes that are not UTF-8 are refused like any unknown request:
        // the client learns what is accepted rather than seeing the
        // connection close without a word.
        Ok(Ok(_)) => match ControlRequest::parse(&String::from_utf8_lossy(&bytes)) {
            Ok(request) => {
                let (reply, answer) = oneshot::channel();
                if commands
                    .send(ControlCommand { request, reply })
                    .await
                    .is_err()
                {
                    "error shutting down".to_owned()
                } else {
                    answer
                        .await
                        .unwrap_or_else(|_| "error shutting down".to_owned())
                }
            }
            Err(refused) => refused,
        },
        Ok(Err(e)) => {
            debug!(error = %e, "control connection failed");
            return;
        }
        Err(_) => "error no request line within 5 s".to_owned(),
    };
    let _ = write.write_all(format!("{answer}\n").as_bytes()).await;
    let _ = write.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_file_that_is_not_a_socket_is_left_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("agent.xml");
        std::fs::write(&path, "<config/>").expect("write");
        assert!(listen(&path).is_none());
        assert_eq!(
            std::fs::read_to_string(&path).ok().as_deref(),
            Some("<config/>")
        );
    }

    #[tokio::test]
    async fn a_stale_socket_is_taken_over_and_bytes_not_utf8_get_an_answer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("control.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).expect("bind"));
        let Some((_commands, _guard)) = listen(&path) else {
            panic!("the stale socket was not taken over");
        };
        let mut stream = UnixStream::connect(&path).await.expect("connect");
        stream.write_all(b"\xff\xfe\n").await.expect("write");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.expect("read");
        assert!(answer.starts_with("error unknown request"), "{answer:?}");
    }
}
