use super::stream::*;
use super::*;

/// A connection from 127.0.0.1.
fn entry(streams: &Streams, id: u64, at: Instant) -> (Admitted, CancellationToken) {
    entry_from(streams, id, [127, 0, 0, 1], at)
}

fn entry_from(
    streams: &Streams,
    id: u64,
    peer: [u8; 4],
    at: Instant,
) -> (Admitted, CancellationToken) {
    let (tx, _rx) = mpsc::channel(STREAM_WRITE_QUEUE);
    let close = CancellationToken::new();
    (
        streams.admit(StreamId(id), peer.into(), tx, close.clone(), at),
        close,
    )
}

#[test]
fn stalled_handshakes_give_their_slots_to_newer_ones() {
    let handshakes = Handshakes::default();
    let tokens: Vec<CancellationToken> = (0..=MAX_HANDSHAKES as u64)
        .map(|id| {
            let close = CancellationToken::new();
            handshakes.start(StreamId(id), close.clone());
            close
        })
        .collect();
    assert!(tokens[0].is_cancelled(), "the oldest is given up");
    assert!(tokens[1..].iter().all(|t| !t.is_cancelled()));
    assert_eq!(handshakes.len(), MAX_HANDSHAKES);
    handshakes.end(StreamId(5));
    assert_eq!(handshakes.len(), MAX_HANDSHAKES - 1);
}

#[test]
fn a_peer_that_does_not_read_is_closed_when_its_queue_is_full() {
    let streams = Streams::default();
    let (tx, _rx) = mpsc::channel(STREAM_WRITE_QUEUE);
    let close = CancellationToken::new();
    streams.admit(
        StreamId(1),
        [127, 0, 0, 1].into(),
        tx,
        close.clone(),
        Instant::now(),
    );
    for _ in 0..STREAM_WRITE_QUEUE {
        assert!(streams.send(StreamId(1), Bytes::from_static(b"\r\n")));
    }
    assert!(!close.is_cancelled());
    assert!(!streams.send(StreamId(1), Bytes::from_static(b"\r\n")));
    assert!(close.is_cancelled(), "the connection is closed, not queued");
    assert!(
        !streams.send(StreamId(2), Bytes::new()),
        "no such connection"
    );
}

#[test]
fn a_full_table_gives_a_new_connection_the_slot_of_the_quietest_or_refuses_it() {
    let streams = Streams::default();
    let t0 = Instant::now();
    let mut closes = Vec::new();
    for id in 0..MAX_STREAMS as u64 {
        let (admitted, close) = entry(&streams, id, t0);
        assert_eq!(admitted, Admitted::Yes);
        closes.push(close);
    }
    // Connection 7 sent a message later than the rest; none is quiet
    // for EVICT_AFTER yet: refused (all from the newcomer's address).
    streams.touch(StreamId(7), t0 + Duration::from_secs(20));
    let (admitted, _) = entry(&streams, 5000, t0 + EVICT_AFTER - Duration::from_secs(1));
    assert_eq!(admitted, Admitted::Refused);
    // Later every other one has been quiet long enough: the quietest
    // is closed and its slot taken, never the one that spoke.
    let later = t0 + EVICT_AFTER + Duration::from_secs(1);
    for id in 5001..5001 + MAX_STREAMS as u64 - 1 {
        let (admitted, _) = entry(&streams, id, later);
        assert_eq!(admitted, Admitted::Evicted);
    }
    assert!(!closes[7].is_cancelled(), "the connection that spoke stays");
    assert_eq!(
        closes.iter().filter(|c| c.is_cancelled()).count(),
        MAX_STREAMS - 1
    );
    // Now every slot is young: the next one is refused.
    let (admitted, _) = entry(&streams, 9999, later);
    assert_eq!(admitted, Admitted::Refused);
}

/// Waits (real time, bounded) until `done` holds.
async fn until(what: &str, done: impl Fn() -> bool) {
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(std::time::Instant::now() < give_up, "gave up on {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_full_queue_sheds_datagrams_before_decoding_them() {
    let socket = Arc::new(UdpSocket::bind("127.0.0.1:0").await.expect("bind"));
    let to = socket.local_addr().expect("address");
    let peer = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind peer");
    let (mut queues, to_loop) = queues();
    let known = KnownSources::default();
    known.publish(1, HashSet::from([peer.local_addr().expect("peer address")]));
    let stats = Arc::new(IngestStats::default());
    let cancel = CancellationToken::new();
    let (egress, _from_reader) = mpsc::unbounded_channel();
    let reader = tokio::spawn(read_udp(
        socket,
        to_loop,
        egress,
        known,
        AdmissionConfig::default(),
        Arc::clone(&stats),
        cancel.clone(),
    ));
    let options = |n: usize| {
        format!(
            "OPTIONS sip:core@{to} SIP/2.0\r\nVia: SIP/2.0/UDP {peer};branch=z9hG4bK{n}\r\n\
             From: <sip:msr@{peer}>;tag=1\r\nTo: <sip:core@{to}>\r\nCall-ID: c{n}\r\n\
             CSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n",
            peer = peer.local_addr().expect("peer address")
        )
    };
    // The loop takes nothing: the known queue fills, the rest is shed.
    let held = || queues.known.held.load(Ordering::Relaxed);
    let mut sent = 0;
    while held() < KNOWN_QUEUE {
        for _ in 0..64 {
            peer.send_to(options(sent).as_bytes(), to).expect("send");
            sent += 1;
        }
        let before = sent;
        until("the reader to take a burst", || {
            held() + stats.shed.load(Ordering::Relaxed) as usize >= before
        })
        .await;
    }
    assert_eq!(held(), KNOWN_QUEUE);
    let shed = stats.shed.load(Ordering::Relaxed);
    // Garbage now is shed, not found malformed: it was never decoded.
    for _ in 0..10 {
        peer.send_to(b"\x00 not sip", to).expect("send");
    }
    until("the garbage to be shed", || {
        stats.shed.load(Ordering::Relaxed) == shed + 10
    })
    .await;
    assert_eq!(stats.malformed.load(Ordering::Relaxed), 0);
    // Once the loop takes a batch, the next datagram is decoded again.
    let batch = queues.known.try_recv().expect("a batch");
    assert!(!batch.is_empty());
    peer.send_to(b"\x00 not sip", to).expect("send");
    until("garbage to be found malformed", || {
        stats.malformed.load(Ordering::Relaxed) == 1
    })
    .await;
    cancel.cancel();
    reader.await.expect("reader ends");
}

/// One decoded OPTIONS from `source` over stream `id`.
fn inbound(source: SocketAddr, id: u64) -> Inbound {
    let text = format!(
        "OPTIONS sip:core@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/TCP {source};branch=z9hG4bK{id}\r\n\
         From: <sip:msr@{source}>;tag=1\r\nTo: <sip:core@127.0.0.1>\r\nCall-ID: s{id}\r\n\
         CSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n"
    );
    Inbound {
        route: Route::Stream(StreamId(id), StreamTransport::Tcp),
        source,
        message: wire::decode(text.as_bytes(), source).expect("an OPTIONS"),
        peer_certificate: None,
    }
}

#[tokio::test]
async fn a_stream_waits_for_room_and_a_known_contact_goes_to_its_own_queue() {
    let (mut queues, to_loop) = queues();
    let msr: SocketAddr = "127.0.0.1:40001".parse().expect("address");
    let stranger: SocketAddr = "127.0.1.7:40002".parse().expect("address");
    let known = KnownSources::default();
    known.publish(1, HashSet::from([msr]));
    let sink = Sink::Core(to_loop, known);
    let close = CancellationToken::new();
    // The stranger fills the other queue.
    let full: Vec<_> = (0..OTHER_QUEUE as u64)
        .map(|i| inbound(stranger, i))
        .collect();
    assert!(sink.deliver(full, &close).await);
    // Its next message waits: nothing is dropped, the reader is held.
    let waiting = tokio::spawn({
        let (sink, close) = (sink.clone(), close.clone());
        async move { sink.deliver(vec![inbound(stranger, 9_999)], &close).await }
    });
    // The MSR's message goes past it, to the known queue.
    assert!(sink.deliver(vec![inbound(msr, 1)], &close).await);
    let from_msr = queues.known.recv().await.expect("the msr's batch");
    assert_eq!(from_msr[0].source, msr);
    tokio::task::yield_now().await;
    assert!(
        !waiting.is_finished(),
        "the stranger's reader waits for room"
    );
    // The loop takes a batch: the waiting one goes in, whole.
    let first = queues
        .other
        .recv()
        .await
        .expect("the stranger's first batch");
    assert_eq!(first.len(), OTHER_QUEUE);
    assert!(waiting.await.expect("the reader"));
    let next = queues.other.recv().await.expect("the waiting batch");
    assert_eq!(next.len(), 1);
    // A connection being closed stops waiting.
    let full: Vec<_> = (0..OTHER_QUEUE as u64)
        .map(|i| inbound(stranger, i))
        .collect();
    assert!(sink.deliver(full, &close).await);
    let waiting = tokio::spawn({
        let (sink, close) = (sink.clone(), close.clone());
        async move { sink.deliver(vec![inbound(stranger, 1)], &close).await }
    });
    close.cancel();
    assert!(!waiting.await.expect("the reader"), "closed while waiting");
}

#[test]
fn a_full_table_takes_a_slot_from_the_address_that_holds_the_most() {
    let streams = Streams::default();
    let t0 = Instant::now();
    // One address holds all but one slot, talking all the time; an MSR
    // holds the last one.
    let mut flood = Vec::new();
    for id in 0..MAX_STREAMS as u64 - 1 {
        let (admitted, close) = entry_from(&streams, id, [127, 0, 1, 7], t0);
        assert_eq!(admitted, Admitted::Yes);
        flood.push(close);
    }
    let (_, msr) = entry_from(&streams, 5000, [127, 0, 0, 2], t0);
    // A newcomer from a third address gets in: the flooding address gives
    // up its quietest connection, never the MSR's.
    streams.touch(StreamId(0), t0 + Duration::from_secs(1));
    let (admitted, _) = entry_from(&streams, 6000, [127, 0, 0, 3], t0 + Duration::from_secs(2));
    assert_eq!(admitted, Admitted::Evicted);
    assert!(!msr.is_cancelled());
    assert!(!flood[0].is_cancelled(), "the one that spoke last stays");
    assert_eq!(
        flood.iter().filter(|c| c.is_cancelled()).count(),
        1,
        "one of the flood's quietest goes"
    );
    // The flooding address itself gets no slot from the others.
    let (admitted, _) = entry_from(&streams, 7000, [127, 0, 1, 7], t0 + Duration::from_secs(3));
    assert_eq!(admitted, Admitted::Refused);
}

/// RFC 3261 §8.2.1: a stranger's extension method is answered `501` to
/// its source, within the admission a stranger has: past its burst it
/// gets nothing, as with any other request; one missing a header a
/// response needs is malformed.
#[tokio::test]
async fn an_extension_method_is_answered_501_within_the_admission() {
    let socket = Arc::new(UdpSocket::bind("127.0.0.1:0").await.expect("bind"));
    let to = socket.local_addr().expect("address");
    let peer = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind peer");
    let from = peer.local_addr().expect("peer address");
    let (_queues, to_loop) = queues();
    let (egress, mut answers) = mpsc::unbounded_channel();
    let stats = Arc::new(IngestStats::default());
    let cancel = CancellationToken::new();
    let admission = AdmissionConfig {
        per_source_rate: 1e-6,
        per_source_burst: 3.0,
        ..AdmissionConfig::default()
    };
    let reader = tokio::spawn(read_udp(
        socket,
        to_loop,
        egress,
        KnownSources::default(),
        admission,
        Arc::clone(&stats),
        cancel.clone(),
    ));
    let foo = |call_id: &str| {
        format!(
            "FOO sip:core@{to} SIP/2.0\r\nVia: SIP/2.0/UDP {from};branch=z9hG4bK1\r\n\
             From: <sip:x@{from}>;tag=1\r\nTo: <sip:core@{to}>\r\n{call_id}\
             CSeq: 1 FOO\r\nContent-Length: 0\r\n\r\n"
        )
    };
    peer.send_to(foo("").as_bytes(), to).expect("send");
    until("the one without a Call-ID to be malformed", || {
        stats.malformed.load(Ordering::Relaxed) == 1
    })
    .await;
    for _ in 0..5 {
        peer.send_to(foo("Call-ID: c1\r\n").as_bytes(), to)
            .expect("send");
    }
    until("the rest to be refused", || {
        stats.refused.load(Ordering::Relaxed) == 3
    })
    .await;
    let mut sent = Vec::new();
    while sent.len() < 2 {
        let batch = tokio::time::timeout(Duration::from_secs(10), answers.recv())
            .await
            .expect("answers within 10 s")
            .expect("a batch");
        sent.extend(batch);
    }
    cancel.cancel();
    reader.await.expect("reader ends");
    assert!(answers.try_recv().is_err(), "two answers, no more");
    assert_eq!(stats.malformed.load(Ordering::Relaxed), 1);
    for t in sent {
        assert_eq!(t.route, Route::Udp(from));
        let text = String::from_utf8_lossy(&t.bytes);
        assert!(
            text.starts_with("SIP/2.0 501 Not Implemented\r\n"),
            "{text}"
        );
        assert!(
            text.contains("\r\nAllow: REGISTER, NOTIFY, OPTIONS\r\n"),
            "{text}"
        );
        assert!(text.contains("\r\nCall-ID: c1\r\n"), "{text}");
    }
}
