use std::io;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use msr_shared::admin::{ErrorBody, ResponseData};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::*;

#[tokio::test]
async fn socket_round_trip_and_bad_lines() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("control.sock");
    // A stale socket file from a previous run is replaced.
    drop(std::os::unix::net::UnixListener::bind(&path).expect("stale"));
    let listener = bind_control_socket(&path).expect("bind");
    let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode, SOCKET_MODE);
    assert_eq!(
        bind_control_socket(&path).expect_err("in use").kind(),
        io::ErrorKind::AddrInUse
    );

    let (tx, mut rx) = mpsc::channel::<AdminCommand>(8);
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(serve(listener, tx, no_copy(), shutdown.clone()));
    // A stand-in main loop: answers every request with the site list.
    let main_loop = tokio::spawn(async move {
        while let Some(command) = rx.recv().await {
            let data = match command.request {
                Request::SiteList {} => ResponseData::Sites {
                    sites: vec!["local".into()],
                },
                other => ResponseData::Sites {
                    sites: vec![format!("{other:?}")],
                },
            };
            let _ = command.reply.send(Response::Ok(data));
        }
    });

    let stream = UnixStream::connect(&path).await.expect("connect");
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    write
        .write_all(b"not json\n{\"op\":\"reboot\"}\n\n{\"op\":\"site_list\"}\n")
        .await
        .expect("write");
    let mut responses = Vec::new();
    for _ in 0..3 {
        let line = lines.next_line().await.expect("read").expect("line");
        responses.push(serde_json::from_str::<Response>(&line).expect("json"));
    }
    let [first, second, third] = <[Response; 3]>::try_from(responses).expect("three");
    assert!(matches!(
        first,
        Response::Err(ErrorBody {
            code: ErrorCode::BadRequest,
            ..
        })
    ));
    assert!(matches!(
        second,
        Response::Err(ErrorBody {
            code: ErrorCode::BadRequest,
            ..
        })
    ));
    assert_eq!(
        third,
        Response::Ok(ResponseData::Sites {
            sites: vec!["local".into()]
        })
    );

    shutdown.cancel();
    server.await.expect("server");
    main_loop.await.expect("main loop");
}

#[test]
fn bind_refuses_a_regular_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("control.sock");
    std::fs::write(&path, "x").expect("write");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let result = rt.block_on(async { bind_control_socket(&path).map(drop) });
    assert_eq!(
        result.expect_err("not a socket").kind(),
        io::ErrorKind::AlreadyExists
    );
}

#[tokio::test]
async fn connections_past_the_limit_get_an_error_line_and_are_closed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("control.sock");
    let listener = bind_control_socket(&path).expect("bind");
    let (tx, _rx) = mpsc::channel::<AdminCommand>(8);
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(serve(listener, tx, no_copy(), shutdown.clone()));
    let mut idle = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        idle.push(UnixStream::connect(&path).await.expect("connect"));
    }
    // The server accepts in order: the first 256 are being served when it
    // accepts this one.
    let extra = UnixStream::connect(&path).await.expect("connect");
    let mut lines = BufReader::new(extra).lines();
    let line = lines
        .next_line()
        .await
        .expect("read")
        .expect("an error line");
    let response: Response = serde_json::from_str(&line).expect("json");
    assert!(
        matches!(
            response,
            Response::Err(ErrorBody {
                code: ErrorCode::Unavailable,
                ..
            })
        ),
        "{line}"
    );
    assert_eq!(lines.next_line().await.expect("read"), None, "then closed");
    drop(idle);
    shutdown.cancel();
    server.await.expect("server");
}

/// A control server on a fresh socket with a stand-in main loop that
/// answers every request with the site list `["local"]`.
struct Server {
    path: std::path::PathBuf,
    shutdown: CancellationToken,
    server: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(limits: Option<ServeLimits>) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("control.sock");
        let listener = bind_control_socket(&path).expect("bind");
        let (tx, mut rx) = mpsc::channel::<AdminCommand>(8);
        let shutdown = CancellationToken::new();
        let server = match limits {
            Some(limits) => tokio::spawn(serve_with(
                listener,
                tx,
                no_copy(),
                shutdown.clone(),
                limits,
            )),
            None => tokio::spawn(serve(listener, tx, no_copy(), shutdown.clone())),
        };
        tokio::spawn(async move {
            while let Some(command) = rx.recv().await {
                let _ = command.reply.send(Response::Ok(ResponseData::Sites {
                    sites: vec!["local".into()],
                }));
            }
        });
        Self {
            path,
            shutdown,
            server,
            _dir: dir,
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.server.await.expect("server");
    }
}

/// Writes `bytes` and reads one response line (`None` at end of stream).
async fn exchange(
    write: &mut tokio::net::unix::OwnedWriteHalf,
    lines: &mut tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>,
    bytes: &[u8],
) -> Option<Response> {
    write.write_all(bytes).await.expect("write");
    let line = tokio::time::timeout(Duration::from_secs(5), lines.next_line())
        .await
        .expect("an answer within 5 s")
        .expect("read")?;
    Some(serde_json::from_str(&line).expect("json"))
}

fn split(
    stream: UnixStream,
) -> (
    tokio::net::unix::OwnedWriteHalf,
    tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>,
) {
    let (read, write) = stream.into_split();
    (write, BufReader::new(read).lines())
}

fn is_sites(response: Option<&Response>) -> bool {
    matches!(response, Some(Response::Ok(ResponseData::Sites { .. })))
}

fn error_code(response: Option<&Response>) -> Option<ErrorCode> {
    match response {
        Some(Response::Err(error)) => Some(error.code),
        _ => None,
    }
}

/// Connects; while the listen backlog is full (the flood is faster than the
/// server accepts), a non-blocking connect fails with `EAGAIN`: retries.
async fn connect_when_backlog_allows(path: &std::path::Path) -> UnixStream {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match UnixStream::connect(path).await {
            Ok(stream) => return stream,
            Err(error)
                if error.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Err(error) => panic!("connect: {error}"),
        }
    }
}

/// Connections that were closed free their slot. The server counted
/// finished-but-unreaped connection tasks (it reaped at most one per turn
/// of its loop), so clients doing connect(); close() in a loop locked out
/// msrctl although at most a few were connected.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn closed_connections_do_not_count_toward_the_limit() {
    let server = Server::start(None);
    // The flood runs on threads of its own, like clients in other
    // processes: a blocking connect waits while the backlog is full.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cycles = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let flood: Vec<_> = (0..3)
        .map(|_| {
            let path = server.path.clone();
            let stop = Arc::clone(&stop);
            let cycles = Arc::clone(&cycles);
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Ok(stream) = std::os::unix::net::UnixStream::connect(&path) {
                        drop(stream);
                        cycles.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    // Legitimate clients, one attempt each, while the flood goes on.
    let mut refused = 0;
    for _ in 0..20 {
        let stream = connect_when_backlog_allows(&server.path).await;
        let (mut write, mut lines) = split(stream);
        let response = exchange(&mut write, &mut lines, b"{\"op\":\"site_list\"}\n").await;
        if !is_sites(response.as_ref()) {
            refused += 1;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for thread in flood {
        thread.join().expect("flood thread");
    }
    let cycles = cycles.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        cycles > MAX_CONNECTIONS,
        "only {cycles} connect/close cycles"
    );
    assert_eq!(
        refused, 0,
        "of 20 clients, during {cycles} connect/close cycles"
    );
    server.stop().await;
}

#[tokio::test]
async fn idle_connections_are_closed_busy_ones_are_not() {
    let limits = ServeLimits {
        max_connections: 2,
        idle_timeout: Duration::from_millis(300),
        ..ServeLimits::default()
    };
    let server = Server::start(Some(limits));
    // Two idle clients fill the limit; a third is refused for now.
    let (_idle_write, mut idle) = split(UnixStream::connect(&server.path).await.expect("connect"));
    let (mut busy_write, mut busy) =
        split(UnixStream::connect(&server.path).await.expect("connect"));
    let (_w, mut third) = split(UnixStream::connect(&server.path).await.expect("connect"));
    let refused = third.next_line().await.expect("read");
    assert!(
        refused
            .as_deref()
            .is_some_and(|l| l.contains("too many control connections")),
        "{refused:?}"
    );
    // The busy client sends a request every 100 ms for 1 s, three times the
    // timeout: it is served throughout.
    let started = Instant::now();
    for _ in 0..10 {
        let response = exchange(&mut busy_write, &mut busy, b"{\"op\":\"site_list\"}\n").await;
        assert!(is_sites(response.as_ref()), "{response:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The idle one got an `unavailable` line after 300 ms and was closed.
    let line = idle.next_line().await.expect("read").expect("a line");
    let response: Response = serde_json::from_str(&line).expect("json");
    assert_eq!(
        error_code(Some(&response)),
        Some(ErrorCode::Unavailable),
        "{line}"
    );
    assert!(
        line.contains("no complete request line within 300 ms"),
        "{line}"
    );
    assert_eq!(idle.next_line().await.expect("read"), None, "then closed");
    assert!(started.elapsed() >= Duration::from_millis(900));
    // Its slot is free again.
    let (mut write, mut lines) = split(UnixStream::connect(&server.path).await.expect("connect"));
    let response = exchange(&mut write, &mut lines, b"{\"op\":\"site_list\"}\n").await;
    assert!(is_sites(response.as_ref()), "{response:?}");
    drop((write, lines, busy_write, busy));
    // Half a line is not a request: a client dripping one never completes
    // one and is closed too.
    let (mut drip_write, mut drip) =
        split(UnixStream::connect(&server.path).await.expect("connect"));
    let before = Instant::now();
    for byte in b"{\"op\":\"si" {
        if drip_write.write_all(&[*byte]).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let line = tokio::time::timeout(Duration::from_secs(5), drip.next_line())
        .await
        .expect("closed within 5 s")
        .expect("read")
        .unwrap_or_default();
    assert!(line.contains("no complete request line"), "{line}");
    assert!(before.elapsed() < Duration::from_secs(2));
    server.stop().await;
}

#[tokio::test]
async fn the_default_idle_timeout_is_a_minute() {
    assert_eq!(IDLE_TIMEOUT, Duration::from_secs(60));
    assert_eq!(ServeLimits::default().idle_timeout, IDLE_TIMEOUT);
    assert_eq!(ServeLimits::default().max_connections, MAX_CONNECTIONS);
}

/// A client (here root, the only user a test has) holding its share of the
/// control connections gets a one-line refusal for the next; what it gives
/// back can be taken again. (Which users the quota tells apart:
/// `quota::tests`.)
#[tokio::test]
async fn a_client_holding_its_share_gets_a_refusal_line() {
    let limits = ServeLimits {
        per_client: 3,
        ..ServeLimits::default()
    };
    let server = Server::start(Some(limits));
    let mut held = Vec::new();
    for _ in 0..3 {
        let (mut write, mut lines) =
            split(UnixStream::connect(&server.path).await.expect("connect"));
        let response = exchange(&mut write, &mut lines, b"{\"op\":\"site_list\"}\n").await;
        assert!(is_sites(response.as_ref()), "{response:?}");
        held.push((write, lines));
    }
    let (_w, mut fourth) = split(UnixStream::connect(&server.path).await.expect("connect"));
    let line = fourth.next_line().await.expect("read").expect("a line");
    let uid = std::fs::metadata(&server.path)
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .expect("socket");
    assert!(
        line.contains(&format!(
            "too many control connections from uid {uid} (at most 3 per user)"
        )),
        "{line}"
    );
    assert_eq!(fourth.next_line().await.expect("read"), None, "then closed");
    held.pop();
    let (mut write, mut lines) = split(UnixStream::connect(&server.path).await.expect("connect"));
    let response = exchange(&mut write, &mut lines, b"{\"op\":\"site_list\"}\n").await;
    assert!(is_sites(response.as_ref()), "{response:?}");
    server.stop().await;
}

#[tokio::test]
async fn invalid_utf8_is_a_bad_request_and_the_connection_stays_open() {
    let server = Server::start(None);
    let (mut write, mut lines) = split(UnixStream::connect(&server.path).await.expect("connect"));
    let response = exchange(
        &mut write,
        &mut lines,
        b"{\"op\":\"site_declare\",\"name\":\"bad\xff\xfeutf\"}\n",
    )
    .await;
    let Some(Response::Err(error)) = &response else {
        panic!("{response:?}")
    };
    assert_eq!(error.code, ErrorCode::BadRequest);
    assert_eq!(
        error.message,
        "invalid request: not valid utf-8 (at byte 32)"
    );
    let response = exchange(&mut write, &mut lines, b"{\"op\":\"site_list\"}\n").await;
    assert!(is_sites(response.as_ref()), "{response:?}");
    server.stop().await;
}

#[tokio::test]
async fn a_line_of_exactly_the_limit_is_read() {
    let server = Server::start(None);
    let (mut write, mut lines) = split(UnixStream::connect(&server.path).await.expect("connect"));
    // A request padded with spaces to exactly MAX_LINE_BYTES, then `\n`.
    let request = b"{\"op\":\"site_list\"}";
    let mut line = request.to_vec();
    line.resize(MAX_LINE_BYTES, b' ');
    line.push(b'\n');
    let response = exchange(&mut write, &mut lines, &line).await;
    assert!(is_sites(response.as_ref()), "{response:?}");
    // And `\r\n` endings still work at that length.
    let mut crlf = request.to_vec();
    crlf.resize(MAX_LINE_BYTES - 1, b' ');
    crlf.extend_from_slice(b"\r\n");
    let response = exchange(&mut write, &mut lines, &crlf).await;
    assert!(is_sites(response.as_ref()), "{response:?}");
    // One byte more is refused, and the connection closed.
    let mut long = request.to_vec();
    long.resize(MAX_LINE_BYTES + 1, b' ');
    long.push(b'\n');
    let response = exchange(&mut write, &mut lines, &long).await;
    let Some(Response::Err(error)) = &response else {
        panic!("{response:?}")
    };
    assert_eq!(error.code, ErrorCode::BadRequest);
    assert_eq!(error.message, "request line longer than 65536 bytes");
    assert_eq!(lines.next_line().await.expect("read"), None, "then closed");
    server.stop().await;
}

#[tokio::test]
async fn unknown_fields_and_bad_distances_are_explained() {
    let server = Server::start(None);
    let (mut write, mut lines) = split(UnixStream::connect(&server.path).await.expect("connect"));
    for (line, want) in [
        (
            "{\"op\":\"msr_list\",\"x\":1}\n",
            "invalid request: unknown field `x`",
        ),
        (
            "{\"op\":\"site_distance\",\"a\":\"a\",\"b\":\"b\",\"distance\":null}\n",
            "invalid request: distance: expected a number >= 0 or \"infinity\", not null",
        ),
        (
            "{\"op\":\"site_distance\",\"a\":\"a\",\"b\":\"b\",\"distance\":true}\n",
            "invalid request: distance: expected a number >= 0 or \"infinity\", not true",
        ),
    ] {
        let response = exchange(&mut write, &mut lines, line.as_bytes()).await;
        let Some(Response::Err(error)) = &response else {
            panic!("{line}: {response:?}")
        };
        assert_eq!(error.code, ErrorCode::BadRequest, "{line}");
        assert!(error.message.starts_with(want), "{line}: {}", error.message);
    }
    server.stop().await;
}

/// No copy published: every request goes to the loop (here, the test).
fn no_copy() -> ReadOnly {
    ReadOnly {
        published: crate::core::snapshot::Published::default(),
        metrics: std::sync::Arc::new(crate::api::metrics::Metrics::new()),
    }
}
