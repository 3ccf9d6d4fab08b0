use super::*;

#[test]
fn error_codes_map_to_fitting_statuses() {
    for (code, status) in [
        (ErrorCode::BadRequest, 400),
        (ErrorCode::InvalidValue, 400),
        (ErrorCode::UnknownSite, 400),
        (ErrorCode::Conflict, 409),
        (ErrorCode::SiteInUse, 409),
        (ErrorCode::MsrNotFound, 503),
        (ErrorCode::MsrOverloaded, 503),
        (ErrorCode::MsrUnhealthy, 503),
        (ErrorCode::Unavailable, 503),
        (ErrorCode::StoreUnavailable, 503),
        (ErrorCode::StoreFailed, 500),
    ] {
        assert_eq!(status_of(code).as_u16(), status, "{code}");
    }
}

#[test]
fn a_select_query_becomes_the_select_op() {
    let request = select_request(Some(
        "zone=default&site=local&msr=msr_2&call_id=a%40b&leg=1&conference=room&random=5&explain=true",
    ))
    .expect("valid");
    assert_eq!(
        request,
        Request::Select(SelectQuery {
            msr: Some("msr_2".into()),
            random: Some(5.0),
            explain: true,
            call_id: Some("a@b".into()),
            leg: Some("1".into()),
            conference: Some("room".into()),
            ..SelectQuery::new("default", "local")
        })
    );
}

/// SPEC §15: `codecs=pcma,g729,h264` names the offer's codecs.
#[test]
fn the_offers_codecs_are_a_comma_separated_list() {
    let request =
        select_request(Some("zone=default&site=local&codecs=pcma,%20g729,,h264")).expect("valid");
    assert_eq!(
        request,
        Request::Select(SelectQuery {
            codecs: vec!["pcma".into(), "g729".into(), "h264".into()],
            ..SelectQuery::new("default", "local")
        })
    );
    assert_eq!(status_of(ErrorCode::NoCapableMsr).as_u16(), 409);
}

#[test]
fn bad_select_queries_are_refused_with_the_reason() {
    for (query, needle) in [
        (Some("zone=a&site=b&colour=red"), "unknown field `colour`"),
        (Some("zone=a&site=b&zone=c"), "duplicate field `zone`"),
        (
            Some("zone=a&site=b&random=x"),
            "random=x: expected a finite number",
        ),
        (
            Some("zone=a&site=b&random=inf"),
            "random=inf: expected a finite number",
        ),
        (
            Some("zone=a&site=b&explain=maybe"),
            "explain=maybe: expected true or false",
        ),
        (Some("zone=a&site=b&leg=1"), "need call_id"),
        (Some("%zz=%%&&"), "invalid query string"),
        (Some("zone=%ff%fe&site=b"), "not UTF-8"),
        (Some("zone=a&site=b&call_id=c%c3"), "not UTF-8"),
    ] {
        let message = select_request(query).expect_err("refused");
        assert!(message.contains(needle), "{query:?}: {message}");
    }
}

/// Issue 44: a number that does not parse names its parameter and the
/// value, not serde's bare "invalid digit found in string".
#[test]
fn bad_legs_queries_name_the_parameter_and_the_value() {
    assert_eq!(
        legs_request(Some("msr=msr_1&older_than=60&limit=5")),
        Ok(Request::LegList {
            msr: Some("msr_1".into()),
            older_than_secs: Some(60),
            limit: Some(5),
        })
    );
    for (query, message) in [
        (
            "older_than=1h",
            "invalid query string: older_than=1h: expected seconds, a whole number 0 or more",
        ),
        (
            "limit=-1",
            "invalid query string: limit=-1: expected a whole number of legs, 1 to 10000",
        ),
        (
            "limit=99999999999",
            "invalid query string: limit=99999999999: expected a whole number of legs, 1 to 10000",
        ),
    ] {
        assert_eq!(
            legs_request(Some(query)),
            Err(message.to_owned()),
            "{query}"
        );
    }
    let unknown = legs_request(Some("colour=red")).expect_err("unknown");
    assert!(unknown.contains("unknown field `colour`"), "{unknown}");
}

#[test]
fn the_bearer_scheme_is_case_insensitive() {
    assert_eq!(bearer_credentials("Bearer abc"), Some("abc"));
    assert_eq!(bearer_credentials("bearer abc"), Some("abc"));
    assert_eq!(bearer_credentials("BEARER abc"), Some("abc"));
    assert_eq!(bearer_credentials("Basic abc"), None);
    assert_eq!(bearer_credentials("Bearerabc"), None);
}

/// A server on a free loopback port with `limits`, whose routes get no
/// answer from any shell (the tests use routes that need none).
async fn limited_server(limits: ServeLimits) -> (SocketAddr, CancellationToken) {
    let listener = bind("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = mpsc::channel(1);
    // Held open (never read) by the server task, so the channel stays up.
    let router = router(
        tx,
        Published::default(),
        Arc::new(Metrics::new()),
        Arc::new(crate::daemon::IngestStats::default()),
        None,
    );
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let _rx = rx;
        serve_with(listener, router, stop, limits).await;
    });
    (addr, shutdown)
}

/// Reads until the peer closes, at most `bound`; the bytes read, or `None`
/// when the connection was still open at the bound.
async fn read_to_close(stream: &mut tokio::net::TcpStream, bound: Duration) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    match tokio::time::timeout(bound, stream.read_to_end(&mut out)).await {
        Ok(Ok(_)) => Some(out),
        // A reset is a close too.
        Ok(Err(_)) => Some(out),
        Err(_) => None,
    }
}

#[tokio::test]
async fn a_slowloris_is_closed_and_the_connection_bound_refuses_then_frees() {
    use tokio::io::AsyncWriteExt;
    let limits = ServeLimits {
        max_connections: 2,
        header_timeout: Duration::from_millis(300),
    };
    let (addr, shutdown) = limited_server(limits).await;
    // Two clients take both places: one sends half a request head a byte at
    // a time, the other nothing at all.
    let mut slow = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut idle = tokio::net::TcpStream::connect(addr).await.expect("connect");
    for b in b"GET /nowhere HTTP/1.1\r\nHo" {
        slow.write_all(&[*b]).await.expect("write");
    }
    // A third is past the bound: 503 and closed, whatever it asks.
    let mut third = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let answer = read_to_close(&mut third, Duration::from_secs(10))
        .await
        .expect("the refused connection is closed");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
    assert!(
        answer.contains("too many http connections (at most 2)"),
        "{answer}"
    );
    // The header timeout closes both holders.
    for stream in [&mut slow, &mut idle] {
        let rest = read_to_close(stream, Duration::from_secs(10))
            .await
            .expect("closed by the header timeout");
        assert!(!String::from_utf8_lossy(&rest).contains(" 200 "));
    }
    // Their places are free again: a whole request is served.
    let served = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let mut next = tokio::net::TcpStream::connect(addr).await.expect("connect");
            next.write_all(b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await
                .expect("write");
            let answer = read_to_close(&mut next, Duration::from_secs(10))
                .await
                .expect("answered and closed");
            let answer = String::from_utf8_lossy(&answer).into_owned();
            // The closed holders' tasks may not have ended yet (their permits
            // are freed when they do): a 503 then is the bound, still right.
            if !answer.starts_with("HTTP/1.1 503 ") {
                break answer;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("a place frees within 10 s");
    assert!(served.starts_with("HTTP/1.1 404 "), "{served}");
    assert!(served.contains("no such route"), "{served}");
    shutdown.cancel();
}

/// A client that shuts its sending side right after its request still
/// gets the answer: the request is carried out either way (a select may
/// place a leg), so dropping the answer would hide what was done.
#[tokio::test]
async fn a_request_from_a_half_closed_client_is_answered() {
    use tokio::io::AsyncWriteExt;
    let (addr, shutdown) = limited_server(ServeLimits::default()).await;
    let mut client = tokio::net::TcpStream::connect(addr).await.expect("connect");
    client
        .write_all(b"GET /v1/resources HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    client.shutdown().await.expect("half-close");
    // No shell answers here: the route's answer is its timeout's 503, a
    // wait long enough for the server to see the client's side closed.
    let answer = read_to_close(&mut client, ANSWER_TIMEOUT * 3)
        .await
        .expect("answered and closed");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
    shutdown.cancel();
}

/// One request to a server with `token`; its status line.
async fn status_line(token: Option<&str>, request: &[u8]) -> String {
    use tokio::io::AsyncWriteExt;
    let listener = bind("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = mpsc::channel(1);
    let router = router(
        tx,
        Published::default(),
        Arc::new(Metrics::new()),
        Arc::default(),
        token.map(str::to_owned),
    );
    let stop = CancellationToken::new();
    let server = stop.clone();
    tokio::spawn(async move {
        let _rx = rx;
        serve(listener, router, server).await;
    });
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("write");
    let answer = read_to_close(&mut stream, Duration::from_secs(10))
        .await
        .expect("answered and closed");
    stop.cancel();
    String::from_utf8_lossy(&answer)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// With `[http] token`, the token is checked before anything else, on
/// every route and on none (one layer): a stranger learns nothing, not
/// even which routes exist.
#[tokio::test]
async fn the_token_is_checked_before_the_route() {
    let token = "0123456789abcdef";
    let ask = |path: &str, auth: &str| {
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n").into_bytes()
    };
    for path in [
        "/nowhere",
        "/health",
        "/v1/select?zone=z&site=s",
        "/metrics",
    ] {
        let status = status_line(Some(token), &ask(path, "")).await;
        assert!(status.starts_with("HTTP/1.1 401 "), "{path}: {status}");
        let wrong = status_line(
            Some(token),
            &ask(path, "Authorization: Bearer 0123456789abcdeX\r\n"),
        )
        .await;
        assert!(wrong.starts_with("HTTP/1.1 401 "), "{path}: {wrong}");
    }
    let right = format!("Authorization: bearer {token}\r\n");
    let status = status_line(Some(token), &ask("/nowhere", &right)).await;
    assert!(status.starts_with("HTTP/1.1 404 "), "{status}");
    let status = status_line(None, &ask("/nowhere", "")).await;
    assert!(status.starts_with("HTTP/1.1 404 "), "{status}");
}

#[tokio::test]
async fn a_request_head_over_the_bound_is_refused_and_closed() {
    use tokio::io::AsyncWriteExt;
    let (addr, shutdown) = limited_server(ServeLimits::default()).await;
    let mut client = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let filler = "a".repeat(MAX_HEAD_BYTES);
    let head = format!("GET /health HTTP/1.1\r\nHost: x\r\nX-Filler: {filler}\r\n\r\n");
    // The server may close while the rest is still being written.
    let _ = client.write_all(head.as_bytes()).await;
    let answer = read_to_close(&mut client, Duration::from_secs(10))
        .await
        .expect("closed after the refusal");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
    shutdown.cancel();
}
