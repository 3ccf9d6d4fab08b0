use super::*;

#[test]
fn a_client_key_that_is_not_the_certificates_is_refused_when_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, text: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path
    };
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let ca = rcgen::CertificateParams::new(vec!["ca".to_owned()])
        .expect("params")
        .self_signed(&ca_key)
        .expect("ca");
    let key = rcgen::KeyPair::generate().expect("key");
    let other = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["msr_1".to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("cert");
    let ca_path = write("ca.pem", ca.pem());
    let cert_path = write("cert.pem", cert.pem());
    let key_path = write("key.pem", key.serialize_pem());
    let other_path = write("other.pem", other.serialize_pem());
    assert!(TlsClient::read(&ca_path, Some((&cert_path, &key_path))).is_ok());
    let e = TlsClient::read(&ca_path, Some((&cert_path, &other_path))).expect_err("another key");
    assert_eq!(e.path, other_path);
    assert!(e.reason.contains("does not go with the certificate"), "{e}");
}

fn options(i: usize, from: SocketAddr) -> String {
    format!(
        "OPTIONS sip:collector@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP {from};branch=z9hG4bKshed{i}\r\n\
         From: <sip:probe@{from}>;tag=p{i}\r\nTo: <sip:collector@127.0.0.1>\r\nCall-ID: shed-{i}@test\r\n\
         CSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
    )
}

/// An endpoint on an ephemeral loopback port and a peer socket to send
/// to it from, with the peer's address.
/// An endpoint on an ephemeral UDP port that also listens on TCP on the
/// same port: another process may hold that TCP port, so a few ports are
/// tried.
async fn bind_with_tcp(cancel: &CancellationToken) -> SipEndpoint {
    let addr: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    for _ in 0..20 {
        match SipEndpoint::bind(addr, true, "test", "OPTIONS", cancel.clone()).await {
            Ok(endpoint) => return endpoint,
            Err(EndpointError::Bind {
                transport: "tcp", ..
            }) => continue,
            Err(e) => panic!("bind: {e}"),
        }
    }
    panic!("no port free on both UDP and TCP")
}

async fn endpoint_and_peer() -> (
    CancellationToken,
    SipEndpoint,
    tokio::net::UdpSocket,
    SocketAddr,
) {
    let cancel = CancellationToken::new();
    let addr: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let endpoint = SipEndpoint::bind(addr, false, "test", "OPTIONS", cancel.clone())
        .await
        .expect("bind");
    let peer = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("peer");
    let from = peer.local_addr().expect("peer addr");
    (cancel, endpoint, peer, from)
}

#[tokio::test]
async fn a_backlog_beyond_the_bound_is_answered_503_oldest_first() {
    let (cancel, mut endpoint, peer, from) = endpoint_and_peer().await;
    endpoint.set_max_backlog(4);
    assert_eq!(endpoint.max_backlog(), 4);
    for i in 0..20 {
        peer.send_to(options(i, from).as_bytes(), endpoint.local_addr())
            .await
            .expect("send");
    }
    // Let the endpoint queue all 20 without the loop taking any.
    let deadline = Instant::now() + Duration::from_secs(5);
    while endpoint.incoming.len() < 20 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(endpoint.incoming.len(), 20);

    // The loop gets the 4 newest; the 16 oldest were answered 503.
    let mut served = Vec::new();
    for _ in 0..4 {
        let Some(SipEvent::Request(tx)) = endpoint.recv().await else {
            panic!("request expected")
        };
        served.push(
            super::super::call_id(&tx.request().headers)
                .unwrap_or_default()
                .to_owned(),
        );
    }
    assert_eq!(
        served,
        [
            "shed-16@test",
            "shed-17@test",
            "shed-18@test",
            "shed-19@test"
        ]
    );
    assert_eq!(endpoint.shed_total(), 16);

    let mut buf = vec![0u8; 4096];
    let mut shed = Vec::new();
    while shed.len() < 16 {
        let (n, _) = tokio::time::timeout(Duration::from_secs(5), peer.recv_from(&mut buf))
            .await
            .expect("503 in time")
            .expect("recv");
        let text = String::from_utf8_lossy(&buf[..n]).to_string();
        assert!(text.starts_with("SIP/2.0 503"), "{text}");
        assert!(text.contains("Retry-After: 1"), "{text}");
        shed.push(text);
    }
    assert!(shed
        .iter()
        .all(|t| !t.contains("shed-16@") && !t.contains("shed-19@")));
    cancel.cancel();
}

async fn next_request(endpoint: &mut SipEndpoint) -> Box<ServerTransaction> {
    let event = tokio::time::timeout(Duration::from_secs(5), endpoint.recv())
        .await
        .expect("request in time");
    match event {
        Some(SipEvent::Request(tx)) => tx,
        other => panic!("request expected, got {other:?}"),
    }
}

#[tokio::test]
async fn a_request_carries_the_datagram_source_not_its_via() {
    let (cancel, mut endpoint, peer, from) = endpoint_and_peer().await;
    // The Via names another host: the source is what the socket saw.
    let lie: SocketAddr = "192.0.2.7:5060".parse().expect("addr");
    peer.send_to(options(1, lie).as_bytes(), endpoint.local_addr())
        .await
        .expect("send");
    let tx = next_request(&mut endpoint).await;
    assert_eq!(tx.source(), Some(from));
    cancel.cancel();
}

#[tokio::test]
async fn a_datagram_over_max_datagram_is_dropped_and_counted() {
    let (cancel, mut endpoint, peer, from) = endpoint_and_peer().await;
    // A valid OPTIONS padded past MAX_DATAGRAM with a long header.
    let big = options(1, from).replacen(
        "Max-Forwards: 70\r\n",
        &format!("Max-Forwards: 70\r\nX-Pad: {}\r\n", "a".repeat(9_000)),
        1,
    );
    assert!(big.len() > MAX_DATAGRAM);
    peer.send_to(big.as_bytes(), endpoint.local_addr())
        .await
        .expect("send");
    // A datagram of exactly MAX_DATAGRAM still goes through.
    let small = options(2, from);
    let fit = small.replacen(
        "Max-Forwards: 70\r\n",
        &format!(
            "Max-Forwards: 70\r\nX-Pad: {}\r\n",
            "b".repeat(MAX_DATAGRAM - small.len() - "X-Pad: \r\n".len())
        ),
        1,
    );
    assert_eq!(fit.len(), MAX_DATAGRAM);
    peer.send_to(fit.as_bytes(), endpoint.local_addr())
        .await
        .expect("send");
    let tx = next_request(&mut endpoint).await;
    assert_eq!(
        super::super::call_id(&tx.request().headers),
        Some("shed-2@test")
    );
    assert_eq!(endpoint.oversized_total(), 1);
    cancel.cancel();
}

/// Issue 44: a certificate refused at the handshake is said once, with
/// its dates in UTC, not as rustls's raw Unix seconds.
#[test]
fn a_refused_certificate_reads_with_utc_dates() {
    use rustls::pki_types::UnixTime;
    let at = |secs: u64| UnixTime::since_unix_epoch(Duration::from_secs(secs));
    let handshake = |certificate: rustls::CertificateError| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(certificate),
        )
    };
    let expired = handshake(rustls::CertificateError::ExpiredContext {
        time: at(1_764_979_200),
        not_after: at(1_735_689_600),
    });
    assert_eq!(
        connect_failure(&expired),
        "the peer's certificate expired on 2025-01-01T00:00:00Z (checked at 2025-12-06T00:00:00Z)"
    );
    let early = handshake(rustls::CertificateError::NotValidYetContext {
        time: at(1_735_689_600),
        not_before: at(1_764_979_200),
    });
    assert_eq!(
        connect_failure(&early),
        "the peer's certificate is not valid before 2025-12-06T00:00:00Z (checked at 2025-01-01T00:00:00Z)"
    );
    // Any other error as the OS says it.
    let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    assert_eq!(connect_failure(&refused), refused.to_string());
}

#[tokio::test]
async fn a_method_the_parser_refuses_is_answered_from_the_raw_head() {
    let (cancel, endpoint, peer, from) = endpoint_and_peer().await;
    let mut buf = vec![0u8; 4096];
    for (method, cseq, status) in [
        // RFC 4475 §3.1.1.2: an extension method is valid; §3.1.2.18: a
        // CSeq that names another method is not.
        ("NEWMETHOD", "NEWMETHOD", "SIP/2.0 501"),
        ("NEWMETHOD", "INVITE", "SIP/2.0 400"),
    ] {
        let request = format!(
            "{method} sip:agent@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP {from};branch=z9hG4bKraw\r\n\
             From: <sip:core@{from}>;tag=c1\r\nTo: <sip:agent@127.0.0.1>\r\nCall-ID: raw@test\r\n\
             CSeq: 8 {cseq}\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
        );
        peer.send_to(request.as_bytes(), endpoint.local_addr())
            .await
            .expect("send");
        let (n, _) = tokio::time::timeout(Duration::from_secs(5), peer.recv_from(&mut buf))
            .await
            .expect("an answer in time")
            .expect("recv");
        let text = String::from_utf8_lossy(&buf[..n]).to_string();
        assert!(text.starts_with(status), "{text}");
        assert!(text.contains("Call-ID: raw@test"), "{text}");
        if status.ends_with("501") {
            assert!(text.contains("Allow: OPTIONS"), "{text}");
        }
    }
    cancel.cancel();
}

async fn next_event(endpoint: &mut SipEndpoint) -> SipEvent {
    tokio::time::timeout(Duration::from_secs(5), endpoint.recv())
        .await
        .expect("an event in time")
        .expect("endpoint open")
}

async fn datagram(peer: &tokio::net::UdpSocket) -> String {
    let mut buf = vec![0u8; 8192];
    let (n, _) = tokio::time::timeout(Duration::from_secs(5), peer.recv_from(&mut buf))
        .await
        .expect("a datagram in time")
        .expect("recv");
    String::from_utf8_lossy(&buf[..n]).to_string()
}

/// A TCP listener on an ephemeral loopback port, and its address.
async fn tcp_listener() -> (tokio::net::TcpListener, SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("listen");
    let addr = listener.local_addr().expect("addr");
    (listener, addr)
}

fn ok_to(request: &str) -> String {
    let head: Vec<&str> = request
        .split("\r\n")
        .filter(|l| {
            ["Via:", "From:", "To:", "Call-ID:", "CSeq:"]
                .iter()
                .any(|h| l.starts_with(h))
        })
        .collect();
    format!(
        "SIP/2.0 200 OK\r\n{}\r\nContent-Length: 0\r\n\r\n",
        head.join("\r\n")
    )
}

fn options_to(target: &str) -> Request {
    super::super::request(
        Method::Options,
        target,
        vec![
            ("From", "<sip:agent@127.0.0.1>;tag=a".to_owned()),
            ("To", format!("<{target}>")),
            ("Call-ID", "out@test".to_owned()),
            ("CSeq", "1 OPTIONS".to_owned()),
        ],
        Vec::new(),
    )
    .expect("request")
}

#[tokio::test]
async fn a_retransmitted_request_gets_the_same_answer_and_is_not_served_twice() {
    let (cancel, mut endpoint, peer, from) = endpoint_and_peer().await;
    peer.send_to(options(1, from).as_bytes(), endpoint.local_addr())
        .await
        .expect("send");
    let tx = next_request(&mut endpoint).await;
    // Before the answer the retransmission is absorbed.
    peer.send_to(options(1, from).as_bytes(), endpoint.local_addr())
        .await
        .expect("send");
    let response = super::super::response(tx.request(), StatusCode::OK, Some("t1"));
    tx.respond(response).await;
    let first = datagram(&peer).await;
    assert!(first.starts_with("SIP/2.0 200"), "{first}");
    peer.send_to(options(1, from).as_bytes(), endpoint.local_addr())
        .await
        .expect("send");
    assert_eq!(datagram(&peer).await, first);
    // Nothing more reached the loop.
    let more = tokio::time::timeout(Duration::from_millis(200), endpoint.recv()).await;
    assert!(more.is_err(), "{more:?}");
    cancel.cancel();
}

#[tokio::test]
async fn a_request_sent_over_udp_reports_its_final_response() {
    let (cancel, mut endpoint, peer, from) = endpoint_and_peer().await;
    endpoint
        .send_request(7, options_to(&format!("sip:msr@{from}")))
        .expect("send");
    let request = datagram(&peer).await;
    assert!(request.starts_with("OPTIONS sip:msr@"), "{request}");
    let via = format!("Via: SIP/2.0/UDP {};branch=z9hG4bK", endpoint.local_addr());
    assert!(request.contains(&via), "{request}");
    assert!(request.contains("User-Agent: test"), "{request}");
    peer.send_to(ok_to(&request).as_bytes(), endpoint.local_addr())
        .await
        .expect("send");
    match next_event(&mut endpoint).await {
        SipEvent::Response { id: 7, response } => assert_eq!(response.status_code, StatusCode::OK),
        other => panic!("the response expected, got {other:?}"),
    }
    cancel.cancel();
}

#[tokio::test]
async fn a_request_without_cseq_is_refused_at_once() {
    let (cancel, endpoint, _peer, from) = endpoint_and_peer().await;
    let mut request = options_to(&format!("sip:msr@{from}"));
    request
        .headers
        .retain(|h| !h.name().eq_ignore_ascii_case("CSeq"));
    assert!(matches!(
        endpoint.send_request(1, request),
        Err(EndpointError::Request { .. })
    ));
    cancel.cancel();
}

#[tokio::test]
async fn over_tcp_requests_go_both_ways_on_one_connection_and_its_close_is_told() {
    let (cancel, mut endpoint, _peer, _from) = endpoint_and_peer().await;
    let (listener, remote) = tcp_listener().await;
    endpoint
        .send_request(
            3,
            options_to(&format!("sip:registrar@{remote};transport=tcp")),
        )
        .expect("send");
    let (mut stream, _) = tokio::time::timeout(Duration::from_secs(5), listener.accept())
        .await
        .expect("connect in time")
        .expect("accept");
    let mut framer = wire::StreamFramer::new();
    let mut read = async |stream: &mut tokio::net::TcpStream| loop {
        if let Some(wire::Frame::Message(bytes)) = framer.next_frame().expect("frame") {
            return String::from_utf8_lossy(&bytes).to_string();
        }
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
            .await
            .expect("read in time")
            .expect("read");
        assert!(n > 0, "closed");
        framer.push(&buf[..n]);
    };
    let request = read(&mut stream).await;
    assert!(request.contains("Via: SIP/2.0/TCP "), "{request}");
    stream
        .write_all(ok_to(&request).as_bytes())
        .await
        .expect("write");
    match next_event(&mut endpoint).await {
        SipEvent::Response { id: 3, response } => assert_eq!(response.status_code, StatusCode::OK),
        other => panic!("the response expected, got {other:?}"),
    }
    // The peer's own request on that connection, answered on it.
    let back = options(9, remote).replace("SIP/2.0/UDP", "SIP/2.0/TCP");
    stream.write_all(back.as_bytes()).await.expect("write");
    let tx = next_request(&mut endpoint).await;
    assert_eq!(tx.source(), Some(remote));
    let response = super::super::response(tx.request(), StatusCode::OK, Some("t"));
    tx.respond(response).await;
    let answer = read(&mut stream).await;
    assert!(answer.starts_with("SIP/2.0 200"), "{answer}");
    assert!(answer.contains("Call-ID: shed-9@test"), "{answer}");
    drop(stream);
    match next_event(&mut endpoint).await {
        SipEvent::Closed { remote: closed } => assert_eq!(closed, remote),
        other => panic!("closed expected, got {other:?}"),
    }
    cancel.cancel();
}

#[tokio::test]
async fn a_connection_refused_fails_the_request_with_its_cause() {
    let (cancel, mut endpoint, _peer, _from) = endpoint_and_peer().await;
    // A port nothing listens on: bound, then closed.
    let (_, closed) = tcp_listener().await;
    endpoint
        .send_request(4, options_to(&format!("sip:r@{closed};transport=tcp")))
        .expect("send");
    match next_event(&mut endpoint).await {
        SipEvent::Failed { id: 4, reason } => {
            assert!(
                reason.starts_with(&format!("connection to tcp {closed} failed: ")),
                "{reason}"
            );
        }
        other => panic!("a failure expected, got {other:?}"),
    }
    // A sips: target without a TLS client set fails as plainly.
    endpoint
        .send_request(5, options_to(&format!("sips:r@{closed}")))
        .expect("send");
    match next_event(&mut endpoint).await {
        SipEvent::Failed { id: 5, reason } => {
            assert!(reason.contains("no tls client configured"), "{reason}");
        }
        other => panic!("a failure expected, got {other:?}"),
    }
    cancel.cancel();
}

#[tokio::test]
async fn the_tcp_listener_serves_a_request_on_the_udp_port() {
    let cancel = CancellationToken::new();
    let mut endpoint = bind_with_tcp(&cancel).await;
    let mut stream = tokio::net::TcpStream::connect(endpoint.local_addr())
        .await
        .expect("connect");
    let me = stream.local_addr().expect("addr");
    let request = options(1, me).replace("SIP/2.0/UDP", "SIP/2.0/TCP");
    stream.write_all(request.as_bytes()).await.expect("write");
    let tx = next_request(&mut endpoint).await;
    assert_eq!(tx.source(), Some(me));
    let response = super::super::response(tx.request(), StatusCode::OK, Some("t"));
    tx.respond(response).await;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
        .await
        .expect("read in time")
        .expect("read");
    let text = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(text.starts_with("SIP/2.0 200"), "{text}");
    cancel.cancel();
}

#[tokio::test]
async fn a_request_dropped_unanswered_comes_to_the_loop_again() {
    let (cancel, mut endpoint, peer, from) = endpoint_and_peer().await;
    for _ in 0..2 {
        peer.send_to(options(1, from).as_bytes(), endpoint.local_addr())
            .await
            .expect("send");
        let tx = next_request(&mut endpoint).await;
        drop(tx);
    }
    cancel.cancel();
}

/// A host that opens more connections than the agent's collectors could
/// is refused past `MAX_STREAMS`: the extra connection is closed at once,
/// the open ones stay.
#[tokio::test]
async fn connections_past_the_bound_are_closed() {
    let cancel = CancellationToken::new();
    let endpoint = bind_with_tcp(&cancel).await;
    let mut open = Vec::new();
    for _ in 0..super::MAX_STREAMS {
        open.push(
            tokio::net::TcpStream::connect(endpoint.local_addr())
                .await
                .expect("connect"),
        );
    }
    let mut extra = tokio::net::TcpStream::connect(endpoint.local_addr())
        .await
        .expect("connect");
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), extra.read(&mut buf))
        .await
        .expect("closed in time")
        .unwrap_or(0);
    assert_eq!(n, 0, "the connection past the bound is closed");
    let first = open.first_mut().expect("one");
    assert!(
        tokio::time::timeout(Duration::from_millis(200), first.read(&mut buf))
            .await
            .is_err(),
        "the first connection stays open"
    );
    cancel.cancel();
}

/// A peer that reads nothing of what it is sent: once its connection's
/// queue is full (the kernel's buffers full first) the connection is
/// closed and its close told, rather than the queue growing without bound.
#[tokio::test]
async fn a_connection_whose_peer_reads_nothing_is_closed_not_queued_for_ever() {
    let (cancel, mut endpoint, _peer, _from) = endpoint_and_peer().await;
    let (listener, remote) = tcp_listener().await;
    let target = format!("sip:registrar@{remote};transport=tcp");
    let body = vec![b'x'; 6_000];
    let mut stream = None;
    let mut closed = false;
    for id in 0..4_000u64 {
        let mut request = options_to(&target);
        request.body = body.clone();
        super::super::push_header(&mut request.headers, "Content-Type", "text/plain");
        endpoint.send_request(id, request).expect("send");
        if stream.is_none() {
            // Accepted, and never read.
            stream = Some(listener.accept().await.expect("accept").0);
        }
        if id % 20 == 19 {
            // Bursts well within the queue: only a peer that stops
            // reading fills it.
            tokio::time::sleep(Duration::from_millis(5)).await;
            while let Ok(Some(event)) =
                tokio::time::timeout(Duration::from_millis(1), endpoint.recv()).await
            {
                if matches!(event, SipEvent::Closed { remote: r } if r == remote) {
                    closed = true;
                }
            }
            if closed {
                break;
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !closed && Instant::now() < deadline {
        if let Ok(Some(SipEvent::Closed { remote: r })) =
            tokio::time::timeout(Duration::from_millis(100), endpoint.recv()).await
        {
            closed = r == remote;
        }
    }
    assert!(
        closed,
        "the connection to a peer that reads nothing is closed"
    );
    drop(stream);
    cancel.cancel();
}

/// A connection that sends faster than the loop serves holds a bounded
/// queue: while the loop does not ask, at most `MAX_WAITING` requests wait
/// (the rest is dropped, or not read), and another connection's request is
/// still served once the loop asks again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_connection_holds_a_bounded_queue_and_starves_no_other() {
    let cancel = CancellationToken::new();
    let mut endpoint = bind_with_tcp(&cancel).await;
    let mut flood = tokio::net::TcpStream::connect(endpoint.local_addr())
        .await
        .expect("connect");
    let flooder = flood.local_addr().expect("addr");
    let burst: String = (0..20_000)
        .map(|i| options(i, flooder).replace("SIP/2.0/UDP", "SIP/2.0/TCP"))
        .collect();
    let writer = tokio::spawn(async move {
        let _ = flood.write_all(burst.as_bytes()).await;
        flood
    });
    // The loop is busy elsewhere for a while.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        endpoint.incoming.len() <= super::MAX_WAITING,
        "{} waiting",
        endpoint.incoming.len()
    );
    let mut good = tokio::net::TcpStream::connect(endpoint.local_addr())
        .await
        .expect("connect");
    let me = good.local_addr().expect("addr");
    let request = options(99_999, me).replace("SIP/2.0/UDP", "SIP/2.0/TCP");
    good.write_all(request.as_bytes()).await.expect("write");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(
            Instant::now() < deadline,
            "the other connection's request served"
        );
        let tx = next_request(&mut endpoint).await;
        if tx.source() == Some(me) {
            break;
        }
    }
    cancel.cancel();
    drop(writer);
}

/// A connection a peer opened and keeps silent is closed after
/// `ACCEPTED_IDLE`, so idle connections cannot hold every place.
#[tokio::test(start_paused = true)]
async fn a_silent_accepted_connection_is_closed() {
    let cancel = CancellationToken::new();
    let endpoint = bind_with_tcp(&cancel).await;
    let mut silent = tokio::net::TcpStream::connect(endpoint.local_addr())
        .await
        .expect("connect");
    let started = Instant::now();
    let mut buf = [0u8; 16];
    let n = silent.read(&mut buf).await.unwrap_or(0);
    assert_eq!(n, 0, "closed");
    assert!(
        started.elapsed() >= super::ACCEPTED_IDLE,
        "{:?}",
        started.elapsed()
    );
    cancel.cancel();
}
