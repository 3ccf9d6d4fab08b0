use std::path::Path;

use super::*;
use crate::operator::store::StoreError;

/// A loopback config with the control socket and the store at the
/// given paths.
fn config(socket: &Path, state: &Path) -> CollectorConfig {
    config_with(socket, state, "")
}

/// [`config`] with `more` (TOML tables) at its end.
fn config_with(socket: &Path, state: &Path, more: &str) -> CollectorConfig {
    let text = format!(
        "node = \"core1@test\"\n[sip]\nlisten = \"127.0.0.1:0\"\nrealm = \"msr.local\"\n\
         [[accounts]]\nauth_name = \"msr\"\npassword = \"msr-secret\"\n\
         [control]\nsocket = \"{}\"\n[state]\npath = \"{}\"\n\
         [http]\nlisten = \"off\"\n{more}",
        socket.display(),
        state.display()
    );
    crate::config::parse(&text, "test").expect("test config")
}

async fn stop(handle: CollectorHandle, shutdown: &CancellationToken) {
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), handle.join)
        .await
        .expect("stops in time")
        .expect("join")
        .expect("clean stop");
}

/// Two collectors on one store would each overwrite the other's
/// acknowledged changes: the second refuses to start, naming the lock
/// file, and leaves the first one's control socket alone; once the
/// first has stopped, it starts.
#[tokio::test]
async fn a_second_collector_on_the_same_store_refuses_to_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state.json");
    let a = config(&dir.path().join("a.sock"), &state);
    let b = config(&dir.path().join("b.sock"), &state);
    let shutdown_a = CancellationToken::new();
    let handle_a = start(a, shutdown_a.clone()).await.expect("a starts");

    let err = start(b.clone(), CancellationToken::new())
        .await
        .expect_err("b must not start on a's store");
    let lock = dir.path().join("state.json.lock");
    assert!(
        matches!(&err, CollectorError::Store(StoreError::Locked { lock: l, .. }) if *l == lock),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&lock.display().to_string()) && text.contains("another collector holds"),
        "{text}"
    );
    assert!(!dir.path().join("b.sock").exists(), "b bound nothing");
    assert!(handle_a.control_socket.exists(), "a's socket untouched");
    // `--check-config` for b checks the config on this live host (the
    // held lock is only a note there, from `Store::check_unlocked`).
    check_environment(&b).expect("b's config checks out beside a");
    assert!(matches!(
        Store::new(dir.path().join("state.json")).check_unlocked(),
        Err(StoreError::Locked { .. })
    ));

    stop(handle_a, &shutdown_a).await;
    assert!(lock.exists(), "the lock file is never deleted");
    check_environment(&b).expect("free once a has stopped");
    let shutdown_b = CancellationToken::new();
    let handle_b = start(b, shutdown_b.clone()).await.expect("b starts now");
    stop(handle_b, &shutdown_b).await;
}

/// `[state] path` in a missing directory fails the check, not the
/// start's first write of `state.json.tmp`.
#[test]
fn check_refuses_a_store_in_a_missing_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("no-such-dir");
    let c = config(&dir.path().join("c.sock"), &missing.join("state.json"));
    let err = check_environment(&c).expect_err("missing store directory");
    assert!(
        matches!(err, CollectorError::Store(StoreError::Directory { .. })),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&format!("directory {}: does not exist", missing.display())),
        "{text}"
    );
    assert!(!missing.exists(), "the check creates nothing");
}

#[tokio::test]
async fn start_refuses_a_store_in_a_missing_directory_before_binding() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("c.sock");
    let c = config(&socket, &dir.path().join("no-such-dir").join("state.json"));
    let err = start(c, CancellationToken::new())
        .await
        .expect_err("missing store directory");
    assert!(
        matches!(err, CollectorError::Store(StoreError::Directory { .. })),
        "{err:?}"
    );
    assert!(!socket.exists());
}

/// An HTTP or redirect address another process holds is an error that
/// names it, not a panic (the loop's runtime is dropped on that path),
/// and the control socket bound before it is removed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_http_or_redirect_port_is_an_error_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("c.sock");
    let state = dir.path().join("state.json");
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("bind tcp");
    let held = tcp.local_addr().expect("addr");
    let mut c = config(&socket, &state);
    c.http = Some(crate::config::HttpConfig {
        listen: held,
        token: None,
    });
    let err = start(c, CancellationToken::new())
        .await
        .expect_err("the http port is taken");
    assert!(
        matches!(&err, CollectorError::Http { addr, .. } if *addr == held),
        "{err:?}"
    );
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind udp");
    let held = udp.local_addr().expect("addr");
    let c = config_with(
        &socket,
        &state,
        &format!("[redirect]\nlisten = \"{held}\"\n"),
    );
    let err = start(c, CancellationToken::new())
        .await
        .expect_err("the redirect port is taken");
    assert!(
        matches!(&err, CollectorError::Redirect { addr, .. } if *addr == held),
        "{err:?}"
    );
    assert!(err.to_string().contains(&held.to_string()), "{err}");
}

/// A regular file or a directory at `[control] socket` fails the check,
/// not the start's bind. A socket left by a previous run is fine: the
/// start replaces it.
#[test]
fn check_refuses_a_control_socket_path_that_is_not_a_socket() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state.json");
    let file = dir.path().join("file.sock");
    std::fs::write(&file, "").expect("write");
    let subdir = dir.path().join("dir.sock");
    std::fs::create_dir(&subdir).expect("mkdir");
    for (path, what) in [(&file, "a regular file"), (&subdir, "a directory")] {
        let err = check_environment(&config(path, &state)).expect_err("not a socket");
        let CollectorError::ControlSocketPath { path: p, reason } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(p, path);
        assert_eq!(
            reason,
            &format!("the path exists and is {what}, not a socket")
        );
        assert!(err.to_string().starts_with("[control] socket "), "{err}");
    }
    let left = dir.path().join("left.sock");
    drop(std::os::unix::net::UnixListener::bind(&left).expect("bind"));
    assert!(left.exists());
    check_environment(&config(&left, &state)).expect("a stale socket is replaced at start");
    check_environment(&config(&dir.path().join("new.sock"), &state)).expect("no file yet");
}
