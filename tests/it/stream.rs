//! SIP over TCP (RFC 3261 §18.3): on a stream the peer finds the end of
//! each message by its `Content-Length` alone. A client on one connection
//! to the real collector sends requests pipelined in one write, trickled a
//! few bytes at a time and a keepalive between them; it reads every
//! response by its length, and its REGISTER binds as over UDP. A real agent
//! with a `;transport=tcp` realm registers and reports over one TCP
//! connection.

use std::net::SocketAddr;
use std::time::Duration;

use msr_shared::sip::digest::{self, Challenge};
use msr_shared::sip::wire::{self, Frame, StreamFramer};
use msr_shared::sip::{SipMessage, StatusCode};
use system_tests::system::{live_row, AccountSpec, Agent, AgentSpec, Collector, CollectorOpts};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LIMIT: Duration = Duration::from_secs(10);

fn options(local: SocketAddr, cseq: u32) -> String {
    format!(
        "OPTIONS sip:127.0.0.1 SIP/2.0\r\n\
         Via: SIP/2.0/TCP {local};branch=z9hG4bK-o{cseq}\r\n\
         From: <sip:probe@127.0.0.1>;tag=p1\r\n\
         To: <sip:127.0.0.1>\r\n\
         Call-ID: options-over-tcp\r\n\
         CSeq: {cseq} OPTIONS\r\n\
         Max-Forwards: 70\r\n\
         Content-Length: 0\r\n\r\n"
    )
}

fn register(local: SocketAddr, cseq: u32, authorization: Option<&str>) -> String {
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    format!(
        "REGISTER sip:127.0.0.1 SIP/2.0\r\n\
         Via: SIP/2.0/TCP {local};branch=z9hG4bK-r{cseq}\r\n\
         From: <sip:msr_1@127.0.0.1>;tag=r1\r\n\
         To: <sip:msr_1@127.0.0.1>\r\n\
         Call-ID: register-over-tcp\r\n\
         CSeq: {cseq} REGISTER\r\n\
         Contact: <sip:msr_1@{local};transport=tcp>\r\n\
         Expires: 60\r\n\
         {auth}\
         Max-Forwards: 70\r\n\
         Content-Length: 0\r\n\r\n"
    )
}

/// One client connection: what it reads is framed as the collector frames
/// what it reads.
struct Client {
    stream: TcpStream,
    framer: StreamFramer,
    /// Requests the collector sent on this connection, as read.
    requests: Vec<String>,
}

/// A collector that listens on TCP too.
async fn tcp_collector(dir: &std::path::Path) -> Collector {
    let opts = CollectorOpts {
        tcp: true,
        ..CollectorOpts::default()
    };
    Collector::start(dir, "core1", &opts).await
}

impl Client {
    /// A connection to the collector's SIP port, and its local address.
    async fn connect(port: u16) -> (Self, SocketAddr) {
        let stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("the collector listens on tcp on its SIP port");
        let local = stream.local_addr().expect("local address");
        let client = Self {
            stream,
            framer: StreamFramer::new(),
            requests: Vec::new(),
        };
        (client, local)
    }

    /// The next `n` responses, each checked to carry the `Content-Length`
    /// of its body; requests read on the way are kept in `requests`.
    async fn read(&mut self, n: usize) -> Vec<(StatusCode, String, Vec<(String, String)>)> {
        let mut out = Vec::new();
        self.read_until(|c, bytes| {
            if bytes.starts_with(b"SIP/2.0 ") {
                out.push(response_of(bytes));
            } else {
                c.requests.push(String::from_utf8_lossy(bytes).into_owned());
            }
            out.len() >= n
        })
        .await;
        out
    }

    /// The next request the collector sends on this connection.
    async fn next_request(&mut self) -> String {
        if self.requests.is_empty() {
            self.read_until(|c, bytes| {
                assert!(!bytes.starts_with(b"SIP/2.0 "), "a request, not a response");
                c.requests.push(String::from_utf8_lossy(bytes).into_owned());
                true
            })
            .await;
        }
        self.requests.remove(0)
    }

    /// Reads messages into `take` until it says done.
    async fn read_until(&mut self, mut take: impl FnMut(&mut Self, &[u8]) -> bool) {
        let mut buf = vec![0u8; 4096];
        loop {
            match self
                .framer
                .next_frame()
                .expect("the collector's stream is SIP")
            {
                Some(Frame::Message(bytes)) => {
                    if take(self, &bytes) {
                        return;
                    }
                }
                Some(Frame::Ping) => {}
                None => {
                    let read = tokio::time::timeout(LIMIT, self.stream.read(&mut buf))
                        .await
                        .expect("a response within 10 s")
                        .expect("read");
                    assert!(read > 0, "the collector closed the connection");
                    self.framer.push(&buf[..read]);
                }
            }
        }
    }
}

/// Status, `CSeq` and headers of a response, asserting that its
/// `Content-Length` is there and is its body's length.
fn response_of(bytes: &[u8]) -> (StatusCode, String, Vec<(String, String)>) {
    let text = String::from_utf8_lossy(bytes);
    let (head, body) = text.split_once("\r\n\r\n").expect("a head");
    let headers: Vec<(String, String)> = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length = headers
        .iter()
        .find(|(n, _)| n == "content-length" || n == "l")
        .map(|(_, v)| v.clone());
    assert_eq!(
        length,
        Some(body.len().to_string()),
        "Content-Length on a stream (RFC 3261 §20.14):\n{text}"
    );
    let peer = SocketAddr::from(([127, 0, 0, 1], 0));
    let Ok(SipMessage::Response(response)) = wire::decode(bytes, peer) else {
        panic!("not a response:\n{text}");
    };
    let cseq = headers
        .iter()
        .find(|(n, _)| n == "cseq")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    (response.status_code, cseq, headers)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tcp_every_response_is_framed_by_its_length_and_a_register_binds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let collector = tcp_collector(dir.path()).await;
    let (mut client, local) = Client::connect(collector.port).await;

    // Two requests in one write: two responses, in order.
    let pipelined = format!("{}{}", options(local, 1), register(local, 1, None));
    client
        .stream
        .write_all(pipelined.as_bytes())
        .await
        .expect("write");
    let answers = client.read(2).await;
    assert_eq!(
        (answers[0].0.clone(), answers[0].1.as_str()),
        (StatusCode::OK, "1 OPTIONS")
    );
    assert_eq!(
        (answers[1].0.clone(), answers[1].1.as_str()),
        (StatusCode::Unauthorized, "1 REGISTER")
    );
    let challenge = header(&answers[1].2, "www-authenticate")
        .and_then(Challenge::parse)
        .expect("a digest challenge");

    // An extension method the parser refuses is answered on the
    // connection as over UDP: 501 with Allow (RFC 3261 §8.2.1).
    let foo = options(local, 1)
        .replace("OPTIONS sip:", "FOO sip:")
        .replace("1 OPTIONS", "1 FOO");
    client
        .stream
        .write_all(foo.as_bytes())
        .await
        .expect("write");
    let answers = client.read(1).await;
    assert_eq!(
        (answers[0].0.clone(), answers[0].1.as_str()),
        (StatusCode::NotImplemented, "1 FOO")
    );
    assert!(header(&answers[0].2, "allow").is_some_and(|a| a.contains("REGISTER")));

    // RFC 5626 §3.5.1: a double CRLF is answered with one CRLF, and the
    // connection goes on.
    client.stream.write_all(b"\r\n\r\n").await.expect("ping");
    let mut pong = [0u8; 2];
    tokio::time::timeout(LIMIT, client.stream.read_exact(&mut pong))
        .await
        .expect("a pong within 10 s")
        .expect("read");
    assert_eq!(&pong, b"\r\n");

    // The authorized REGISTER, seven bytes per write.
    let authorization = digest::authorization(
        &challenge,
        "msr",
        "msr-secret",
        "REGISTER",
        "sip:127.0.0.1",
        1,
        "tcp-cnonce",
    );
    let request = register(local, 2, Some(&authorization));
    for piece in request.as_bytes().chunks(7) {
        client.stream.write_all(piece).await.expect("write");
        client.stream.flush().await.expect("flush");
    }
    let answers = client.read(1).await;
    let (status, cseq, headers) = &answers[0];
    assert_eq!(
        (status.clone(), cseq.as_str()),
        (StatusCode::OK, "2 REGISTER")
    );
    let contact = header(headers, "contact").unwrap_or_default();
    assert!(
        contact.contains(&format!("{local}")) && contact.contains("expires="),
        "the binding in the 200: {contact}"
    );
    // As the operator sees it.
    let row = collector
        .wait_rows(LIMIT, |rows| {
            rows.iter().find(|r| r.msr == "msr_1").cloned()
        })
        .await
        .expect("msr_1 is in the resource list");
    assert!(row.uri.contains("transport=tcp"), "{row:?}");
    // RFC 5923: the collector's SUBSCRIBE comes back over this connection,
    // its Via and Contact naming TCP, so the NOTIFYs can follow it.
    let subscribe = client.next_request().await;
    assert!(subscribe.starts_with("SUBSCRIBE "), "{subscribe}");
    assert!(subscribe.contains("\r\nVia: SIP/2.0/TCP "), "{subscribe}");
    assert!(subscribe.contains(";transport=tcp>"), "{subscribe}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_then_a_half_close_is_answered_and_a_message_that_never_ends_is_cut_off() {
    let dir = tempfile::tempdir().expect("tempdir");
    let collector = tcp_collector(dir.path()).await;

    // A client that sends its request and shuts its sending side (RFC
    // 3261 §18.3: the response comes back on the same connection).
    let (mut client, local) = Client::connect(collector.port).await;
    client
        .stream
        .write_all(options(local, 1).as_bytes())
        .await
        .expect("write");
    client.stream.shutdown().await.expect("half-close");
    let answers = client.read(1).await;
    assert_eq!(
        (answers[0].0.clone(), answers[0].1.as_str()),
        (StatusCode::OK, "1 OPTIONS")
    );

    // A head that stops arriving: the collector closes the connection
    // (its deadline for a whole message is 10 s), so such peers cannot
    // hold its connection slots.
    let mut stream = TcpStream::connect(("127.0.0.1", collector.port))
        .await
        .expect("connect");
    stream
        .write_all(b"OPTIONS sip:127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/TCP 127.0.0.1:1")
        .await
        .expect("write");
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut buf))
        .await
        .expect("the connection is closed within 30 s");
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "closed, nothing answered: {read:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_pings_and_never_reads_is_disconnected_not_queued_for() {
    let dir = tempfile::tempdir().expect("tempdir");
    let collector = tcp_collector(dir.path()).await;
    // A small receive window: the collector's answers back up at once.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let mut stream = socket
        .connect(SocketAddr::from(([127, 0, 0, 1], collector.port)))
        .await
        .expect("connect");
    // RFC 5626 keepalive pings, each answered with a CRLF the peer never
    // reads: the collector closes the connection when its queue for it
    // is full instead of holding the answers (it held gigabytes).
    let pings = b"\r\n\r\n".repeat(16 * 1024);
    let closed = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if stream.write_all(&pings).await.is_err() {
                return;
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the collector closes a connection that does not read within 60 s"
    );
    // It still serves everyone else.
    let (mut client, local) = Client::connect(collector.port).await;
    client
        .stream
        .write_all(options(local, 1).as_bytes())
        .await
        .expect("write");
    assert_eq!(client.read(1).await[0].0, StatusCode::OK);
}

/// An agent whose realm is `sip:…;transport=tcp` registers a
/// `;transport=tcp` contact over TCP, the collector subscribes over that
/// connection and the NOTIFYs come back on it; killed with `kill -9`, the
/// restarted collector has it reporting again as soon as the agent sees
/// the connection close and registers again, not at the refresh (300 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_over_tcp_reports_on_its_connection_and_is_back_at_once_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut collector = tcp_collector(dir.path()).await;
    let spec = AgentSpec {
        accounts: vec![AccountSpec {
            msr: "msr_tcp".to_owned(),
            realm: format!("{};transport=tcp", collector.realm()),
        }],
        register_expires: 300,
        ..AgentSpec::default()
    };
    let agent = Agent::start(dir.path(), "agent", &spec, 10);
    let row = collector
        .wait_rows(LIMIT, |rows| {
            live_row(rows, "msr_tcp", Some(10)).map(|r| r.uri.clone())
        })
        .await
        .unwrap_or_else(|| panic!("msr_tcp live over tcp:\n{}", agent.log_text()));
    assert!(row.contains(";transport=tcp"), "a tcp contact: {row}");
    agent.set_calls(40);
    collector
        .wait_rows(LIMIT, |rows| {
            live_row(rows, "msr_tcp", Some(40)).map(|_| ())
        })
        .await
        .unwrap_or_else(|| panic!("a load change over tcp:\n{}", agent.log_text()));
    collector.kill9();
    collector.spawn().await;
    agent.set_calls(70);
    collector
        .wait_rows(LIMIT, |rows| {
            live_row(rows, "msr_tcp", Some(70)).map(|_| ())
        })
        .await
        .unwrap_or_else(|| {
            panic!(
                "msr_tcp back after the restart:\n{}\n{}",
                agent.log_text(),
                collector.log_text()
            )
        });
    assert!(
        agent.log_count(&["the connection to the registrar closed: registering again"]) >= 1,
        "{}",
        agent.log_text()
    );
}
