use std::net::SocketAddr;

use super::*;
use crate::sip::{self, StatusCode};

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("addr")
}

fn options(via: &str) -> String {
    format!(
        "OPTIONS sip:collector@10.0.0.1 SIP/2.0\r\nVia: {via}\r\n\
         From: <sip:probe@10.0.0.2>;tag=p\r\nTo: <sip:collector@10.0.0.1>\r\nCall-ID: c@test\r\n\
         CSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
    )
}

fn request(text: &str, source: &str) -> Request {
    match decode(text.as_bytes(), addr(source)).expect("decode") {
        SipMessage::Request(r) => r,
        SipMessage::Response(_) => panic!("request"),
    }
}

/// RFC 3261 §18.2.1-2 and RFC 3581 §4, one rule for every port: `received`
/// when the sent-by is not the source's IP or `rport` was asked, `rport`
/// filled when asked; the answer goes to the source when `rport` was asked,
/// else to the source's IP at the Via's port (5060 when none).
#[test]
fn a_response_goes_back_as_the_via_and_the_source_say() {
    let with_rport = request(
        &options("SIP/2.0/UDP 10.0.0.2:5070;branch=z9hG4bKa;rport"),
        "192.0.2.9:40000",
    );
    let via = sip::header(&with_rport.headers, "Via").expect("via");
    assert!(via.contains("received=192.0.2.9"), "{via}");
    assert!(via.contains("rport=40000"), "{via}");
    assert_eq!(
        response_target(&with_rport.headers, addr("192.0.2.9:40000")),
        addr("192.0.2.9:40000")
    );
    // Without rport: the source's IP, the Via's port.
    let without = request(
        &options("SIP/2.0/UDP 10.0.0.2:5070;branch=z9hG4bKb"),
        "192.0.2.9:40000",
    );
    let via = sip::header(&without.headers, "Via").expect("via");
    assert!(via.contains("received=192.0.2.9"), "{via}");
    assert!(!via.contains("rport"), "{via}");
    assert_eq!(
        response_target(&without.headers, addr("192.0.2.9:40000")),
        addr("192.0.2.9:5070")
    );
    // The sent-by is the source: nothing is written; no port means 5060.
    let same = request(
        &options("SIP/2.0/UDP 10.0.0.2;branch=z9hG4bKc"),
        "10.0.0.2:5060",
    );
    assert_eq!(
        sip::header(&same.headers, "Via"),
        Some("SIP/2.0/UDP 10.0.0.2;branch=z9hG4bKc")
    );
    assert_eq!(
        response_target(&same.headers, addr("10.0.0.2:6000")),
        addr("10.0.0.2:5060")
    );
    // A received the sender wrote itself is replaced; the other Vias stay.
    let forged = request(
        &options("SIP/2.0/UDP 10.0.0.2:5070;received=198.51.100.1;branch=z9hG4bKd;rport=1, SIP/2.0/UDP 10.0.0.3"),
        "192.0.2.9:40000",
    );
    let via = sip::header(&forged.headers, "Via").expect("via");
    assert_eq!(
        via,
        "SIP/2.0/UDP 10.0.0.2:5070;branch=z9hG4bKd;received=192.0.2.9;rport=40000, SIP/2.0/UDP 10.0.0.3"
    );
    // LWS around the protocol's slashes (RFC 4475 §3.1.1.1 wsinv).
    let spaced = request(
        &options("SIP  /   2.0 /  UDP 10.0.0.2:5070;branch=z9hG4bKe"),
        "10.0.0.2:5070",
    );
    assert_eq!(
        sip::via_sent_by(sip::top_via(&spaced.headers).expect("via")),
        "10.0.0.2:5070"
    );
    assert_eq!(
        response_target(&spaced.headers, addr("10.0.0.2:5070")),
        addr("10.0.0.2:5070")
    );
    // A response built from the request carries the stamped Via.
    let response = sip::response(&with_rport, StatusCode::OK, Some("t"));
    let text = String::from_utf8_lossy(&encode_response(response, "")).to_string();
    assert!(text.contains("received=192.0.2.9"), "{text}");
}

/// RFC 3261 §20.35: every response names the software that answered,
/// once, and the body stays last.
#[test]
fn every_encoded_response_names_its_server_once() {
    let req = request(
        &options("SIP/2.0/UDP 10.0.0.2:5070;branch=z9hG4bKa"),
        "10.0.0.2:5070",
    );
    let mut response = sip::response(&req, StatusCode::OK, None);
    response.body = b"hello".to_vec();
    let text =
        String::from_utf8_lossy(&encode_response(response.clone(), "msr-test/1.0")).into_owned();
    assert!(
        text.contains("\r\nServer: msr-test/1.0\r\nContent-Length: 5\r\n"),
        "{text}"
    );
    assert!(text.ends_with("\r\n\r\nhello"), "{text}");
    sip::push_header(&mut response.headers, "Server", "other/2");
    let text = String::from_utf8_lossy(&encode_response(response, "msr-test/1.0")).into_owned();
    assert_eq!(text.matches("Server:").count(), 1, "{text}");
    assert!(text.contains("Server: other/2\r\n"), "{text}");
}

#[test]
fn every_encoded_message_carries_its_content_length() {
    let req = request(
        &options("SIP/2.0/UDP 10.0.0.2:5070;branch=z9hG4bKa"),
        "10.0.0.2:5070",
    );
    let mut response = sip::response(&req, StatusCode::OK, None);
    response.body = b"hello".to_vec();
    let text = String::from_utf8_lossy(&encode_response(response, "")).to_string();
    assert!(text.contains("Content-Length: 5\r\n"), "{text}");
    assert!(text.ends_with("\r\n\r\nhello"), "{text}");
    assert_eq!(text.matches("Content-Length").count(), 1, "{text}");
    let mut req = req;
    req.body = b"abc".to_vec();
    let text = String::from_utf8_lossy(&encode_request(req)).to_string();
    assert!(text.contains("Content-Length: 3\r\n"), "{text}");
}

#[test]
fn whitespace_is_a_keepalive_and_garbage_is_malformed() {
    let from = addr("10.0.0.2:5070");
    assert_eq!(decode(b"\r\n\r\n", from), Err(DecodeError::Keepalive));
    assert!(matches!(
        decode(b"\x00\xffnot sip", from),
        Err(DecodeError::Malformed { .. })
    ));
}

#[test]
fn a_body_shorter_than_its_content_length_or_a_length_that_is_no_number_is_refused() {
    let from = addr("10.0.0.2:5070");
    let request = |length: &str, body: &str| {
        format!(
            "NOTIFY sip:c@10.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.2:5070;branch=z9hG4bKcl\r\n\
             From: <sip:m@10.0.0.2>;tag=a\r\nTo: <sip:c@10.0.0.1>;tag=b\r\nCall-ID: cl\r\n\
             CSeq: 2 NOTIFY\r\nContent-Length: {length}\r\n\r\n{body}"
        )
    };
    assert_eq!(
        decode(request("5000", "").as_bytes(), from),
        Err(DecodeError::Truncated {
            declared: 5000,
            body: 0
        })
    );
    assert_eq!(
        decode(request("5", "abcd").as_bytes(), from),
        Err(DecodeError::Truncated {
            declared: 5,
            body: 4
        })
    );
    for length in ["-1", "1180591620717411303424", "x"] {
        assert!(
            matches!(
                decode(request(length, "").as_bytes(), from),
                Err(DecodeError::Malformed { .. })
            ),
            "{length}"
        );
    }
    for (length, body) in [("4", "abcd"), ("0", ""), ("2", "abcd")] {
        assert!(
            decode(request(length, body).as_bytes(), from).is_ok(),
            "{length} {body}"
        );
    }
}

proptest::proptest! {
    /// Bytes from the network never make the decoder panic.
    #[test]
    fn decoding_random_bytes_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
        let _ = decode(&bytes, addr("10.0.0.2:5070"));
    }

    /// Nor the 501 builder, on random bytes alone or after a request line
    /// that qualifies.
    #[test]
    fn answering_random_bytes_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
        let _ = refused(&bytes, "OPTIONS");
        let mut head = b"FOO sip:x SIP/2.0\r\n".to_vec();
        head.extend_from_slice(&bytes);
        let _ = refused(&head, "OPTIONS");
    }
}

fn message(body: &str) -> String {
    format!(
        "NOTIFY sip:c@10.0.0.1 SIP/2.0\r\nVia: SIP/2.0/TCP 10.0.0.2;branch=z9hG4bKa\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[test]
fn a_stream_is_split_at_each_content_length_whatever_the_chunks() {
    let stream = format!(
        "{}\r\n\r\n{}{}",
        message("load: 1"),
        message(""),
        message("x")
    );
    for chunk in [1, 3, 7, 50, stream.len()] {
        let mut framer = StreamFramer::new();
        let mut frames = Vec::new();
        for piece in stream.as_bytes().chunks(chunk) {
            framer.push(piece);
            while let Some(frame) = framer.next_frame().expect("frame") {
                frames.push(frame);
            }
        }
        assert_eq!(
            frames,
            [
                Frame::Message(Bytes::from(message("load: 1"))),
                Frame::Ping,
                Frame::Message(Bytes::from(message(""))),
                Frame::Message(Bytes::from(message("x"))),
            ],
            "chunks of {chunk}"
        );
        assert_eq!(framer.pending(), 0);
    }
}

#[test]
fn a_compact_length_counts_and_a_missing_one_is_zero() {
    let mut framer = StreamFramer::new();
    framer.push(b"OPTIONS sip:x SIP/2.0\r\nl: 2\r\n\r\nabOPTIONS sip:y SIP/2.0\r\n\r\n");
    assert_eq!(
        framer.next_frame().expect("first"),
        Some(Frame::Message(Bytes::from_static(
            b"OPTIONS sip:x SIP/2.0\r\nl: 2\r\n\r\nab"
        )))
    );
    assert_eq!(
        framer.next_frame().expect("second"),
        Some(Frame::Message(Bytes::from_static(
            b"OPTIONS sip:y SIP/2.0\r\n\r\n"
        )))
    );
}

#[test]
fn an_oversized_or_unreadable_length_ends_the_stream() {
    let mut framer = StreamFramer::new();
    framer.push(b"OPTIONS sip:x SIP/2.0\r\nContent-Length: 999999\r\n\r\n");
    assert_eq!(framer.next_frame(), Err(FrameError::TooLong));
    let mut framer = StreamFramer::new();
    framer.push(b"OPTIONS sip:x SIP/2.0\r\nContent-Length: lots\r\n\r\n");
    assert_eq!(
        framer.next_frame(),
        Err(FrameError::BadLength("lots".into()))
    );
    let mut framer = StreamFramer::new();
    framer.push(&vec![b'a'; MAX_STREAM_MESSAGE + 1]);
    assert_eq!(framer.next_frame(), Err(FrameError::TooLong));
}

proptest::proptest! {
    /// Whatever the bytes and however they are cut, the framer never
    /// panics and never holds more than one message's worth.
    #[test]
    fn framing_random_bytes_never_panics(
        bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..2000),
        cut in 1usize..64,
    ) {
        let mut framer = StreamFramer::new();
        'outer: for piece in bytes.chunks(cut) {
            framer.push(piece);
            loop {
                match framer.next_frame() {
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(_) => break 'outer,
                }
            }
            proptest::prop_assert!(framer.pending() <= MAX_STREAM_MESSAGE + 64);
        }
    }
}

/// Every frame `framer` yields from `pieces`, and whether it ended in an
/// error.
fn frames_of<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> (Vec<Frame>, bool) {
    let mut framer = StreamFramer::new();
    let mut frames = Vec::new();
    for piece in pieces {
        framer.push(piece);
        loop {
            match framer.next_frame() {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => break,
                Err(_) => return (frames, true),
            }
        }
    }
    (frames, false)
}

proptest::proptest! {
    /// How a stream is cut into reads changes nothing: the same messages
    /// and keepalives come out, and a stream that is not SIP fails either
    /// way, after the same messages.
    #[test]
    fn framing_does_not_depend_on_how_the_stream_is_cut(
        parts in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::strategy::Strategy::prop_map("[a-z:; ]{0,40}", |body| message(&body)),
                proptest::strategy::Just("\r\n\r\n".to_owned()),
                proptest::strategy::Just("\r\n".to_owned()),
                proptest::strategy::Just("\n".to_owned()),
                "[ -~\r\n]{0,30}",
            ],
            0..8,
        ),
        cut in 1usize..40,
    ) {
        let stream = parts.concat();
        let whole = frames_of([stream.as_bytes()]);
        let cut_up = frames_of(stream.as_bytes().chunks(cut));
        proptest::prop_assert_eq!(whole, cut_up);
    }
}

#[test]
fn blank_lines_and_pings_come_out_the_same_however_the_stream_is_cut() {
    // A ping is CRLFCRLF wherever it starts: after a stray LF too, and
    // whether or not a read ended inside the run (a fuzzer's finding).
    let stream = b"\n\r\n\r\n\n\n\n\n\r\n\r\n\r\n\r\nOPTIONS sip:x SIP/2.0\r\nl: 0\r\n\r\n\n\r\n\r";
    let whole = frames_of([&stream[..]]);
    assert_eq!(whole.0.iter().filter(|f| **f == Frame::Ping).count(), 3);
    for cut in 1..stream.len() {
        assert_eq!(
            frames_of(stream.chunks(cut)),
            whole,
            "cut every {cut} bytes"
        );
    }
}

#[test]
fn a_head_trickled_a_byte_at_a_time_is_searched_once() {
    // 60 KB of header lines, one byte per read: the framer must not search
    // the whole head again after every byte (that is quadratic: about
    // 1.8 G comparisons here, seconds of CPU per connection).
    let mut head = String::from("OPTIONS sip:x SIP/2.0\r\n");
    while head.len() < 60_000 {
        head.push_str("X-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
    }
    let text = format!("{head}Content-Length: 2\r\n\r\nok");
    let mut framer = StreamFramer::new();
    let mut frames = Vec::new();
    for byte in text.as_bytes() {
        framer.push(std::slice::from_ref(byte));
        if let Some(frame) = framer.next_frame().expect("a message") {
            frames.push(frame);
        }
        if framer.message_len.is_none() {
            assert_eq!(framer.scanned, framer.pending(), "searched up to here");
        }
    }
    assert_eq!(frames, [Frame::Message(Bytes::from(text))]);
}

/// A request with `method`, the given header lines and no body.
fn extension(method: &str, headers: &str) -> String {
    format!("{method} sip:x@127.0.0.1 SIP/2.0\r\n{headers}Content-Length: 0\r\n\r\n")
}

const FULL: &str = "Via: SIP/2.0/UDP 10.0.0.2:5070;branch=z9hG4bK-1;rport\r\n\
    Via: SIP/2.0/UDP 10.0.0.3:5060;branch=z9hG4bK-0\r\n\
    Max-Forwards: 70\r\n\
    From: <sip:probe@10.0.0.2>;tag=p1\r\n\
    To: <sip:x@127.0.0.1>\r\n\
    Call-ID: ext@test\r\n\
    CSeq: 7 FOO\r\n";

const ALLOW: &str = "REGISTER, NOTIFY, OPTIONS";

fn answer(text: &str) -> Option<String> {
    refused(text.as_bytes(), ALLOW)
        .map(|r| String::from_utf8_lossy(&encode_response(r, "")).into_owned())
}

/// RFC 3261 §8.2.1: an extension method the parser refuses is answered
/// `501` with the request's Via, From, To, Call-ID and CSeq (§8.2.6.2), a
/// To tag that is the same for a retransmission (§8.2.7), `Allow` and no
/// body; nothing else of the request is copied.
#[test]
fn an_extension_method_is_answered_501_with_its_headers_copied() {
    let text = extension("FOO", FULL);
    assert!(
        matches!(
            decode(text.as_bytes(), addr("10.0.0.2:5070")),
            Err(DecodeError::Malformed { .. })
        ),
        "the parser refuses FOO"
    );
    let answer = answer(&text).expect("a 501");
    let lines: Vec<&str> = answer.split("\r\n").collect();
    assert_eq!(lines[0], "SIP/2.0 501 Not Implemented", "{answer}");
    let response = refused(text.as_bytes(), ALLOW).expect("a 501");
    let tag = sip::header(&response.headers, "To")
        .and_then(sip::tag)
        .expect("a To tag");
    for line in [
        "Via: SIP/2.0/UDP 10.0.0.2:5070;branch=z9hG4bK-1;rport",
        "Via: SIP/2.0/UDP 10.0.0.3:5060;branch=z9hG4bK-0",
        "From: <sip:probe@10.0.0.2>;tag=p1",
        &format!("To: <sip:x@127.0.0.1>;tag={tag}"),
        "Call-ID: ext@test",
        "CSeq: 7 FOO",
        "Allow: REGISTER, NOTIFY, OPTIONS",
        "Content-Length: 0",
    ] {
        assert!(lines.contains(&line), "{line:?} in {answer}");
    }
    let via_at = |v: &str| lines.iter().position(|l| l.contains(v));
    assert!(via_at("z9hG4bK-1") < via_at("z9hG4bK-0"), "Vias in order");
    assert!(!answer.contains("Max-Forwards"), "{answer}");
    assert!(answer.ends_with("\r\n\r\n"), "no body: {answer}");
    assert_eq!(
        self::answer(&text).as_deref(),
        Some(answer.as_str()),
        "a retransmission gets the same bytes"
    );
    // A To that has a tag keeps it.
    let tagged = extension(
        "FOO",
        &FULL.replace("To: <sip:x@127.0.0.1>", "To: <sip:x@127.0.0.1>;tag=t9"),
    );
    let tagged = self::answer(&tagged).expect("a 501");
    assert!(
        tagged.contains("\r\nTo: <sip:x@127.0.0.1>;tag=t9\r\n"),
        "{tagged}"
    );
}

/// RFC 3261 §7.3.3, §7.3.1: compact names in any case, space before the
/// colon and a folded line are read; the answer uses the long names.
#[test]
fn compact_header_names_are_read() {
    let text = extension(
        "FOO",
        "v: SIP/2.0/UDP 10.0.0.2:5070\r\n ;branch=z9hG4bK-c\r\n\
         F : <sip:probe@10.0.0.2>;tag=p1\r\n\
         t:<sip:x@127.0.0.1>\r\n\
         i: compact@test\r\n\
         cseq: 1 FOO\r\n",
    );
    let answer = answer(&text).expect("a 501");
    for line in [
        "\r\nVia: SIP/2.0/UDP 10.0.0.2:5070 ;branch=z9hG4bK-c\r\n",
        "\r\nFrom: <sip:probe@10.0.0.2>;tag=p1\r\n",
        "\r\nTo: <sip:x@127.0.0.1>;tag=",
        "\r\nCall-ID: compact@test\r\n",
        "\r\nCSeq: 1 FOO\r\n",
    ] {
        assert!(answer.contains(line), "{line:?} in {answer}");
    }
}

/// RFC 3261 §8.1.1: without a header a response needs, the request is
/// malformed, not answered.
#[test]
fn a_request_missing_a_header_a_response_needs_is_not_answered() {
    for name in ["Via", "From", "To", "Call-ID", "CSeq"] {
        let headers: String = FULL
            .split_inclusive("\r\n")
            .filter(|l| !l.starts_with(&format!("{name}:")))
            .collect();
        assert_eq!(answer(&extension("FOO", &headers)), None, "without {name}");
    }
    let empty_call_id = FULL.replace("Call-ID: ext@test", "Call-ID: ");
    assert_eq!(answer(&extension("FOO", &empty_call_id)), None);
    let twice = format!("{FULL}Call-ID: other@test\r\n");
    assert_eq!(answer(&extension("FOO", &twice)), None, "two Call-IDs");
    // §8.1.1.5 (RFC 4475 §3.1.2.18 mismatch02): a CSeq that names another
    // method is answered 400, without `Allow`.
    let other = FULL.replace("CSeq: 7 FOO", "CSeq: 7 OPTIONS");
    let refused = answer(&extension("FOO", &other)).expect("a 400");
    assert!(refused.starts_with("SIP/2.0 400 "), "{refused}");
    assert!(!refused.contains("Allow:"), "{refused}");
    let no_number = FULL.replace("CSeq: 7 FOO", "CSeq: x FOO");
    assert_eq!(answer(&extension("FOO", &no_number)), None);
    // §18.3: a body shorter than its Content-Length.
    let short = extension("FOO", FULL).replace("Content-Length: 0", "Content-Length: 50");
    assert_eq!(answer(&short), None);
    // A CR inside a copied value would end our header early.
    let cr = FULL.replace("Call-ID: ext@test", "Call-ID: ext\r@test");
    assert_eq!(answer(&extension("FOO", &cr)), None);
}

/// What the parser refused is answered by its request line: `501` for a
/// well-formed line with an unknown token method; `400` for a line that
/// starts with a token method, ends with `SIP/2.0` and is malformed between
/// (RFC 4475 §3.1.2.8-9), or a known method the parser refused; `505` for
/// another version; nothing for a garbage line or a response's status line.
#[test]
fn what_the_parser_refused_is_answered_by_its_request_line() {
    for (first, expected) in [
        ("FOO sip:x@127.0.0.1 SIP/2.0", Some(501)),
        ("FO(O sip:x@127.0.0.1 SIP/2.0", None),
        ("FOO  sip:x@127.0.0.1 SIP/2.0", Some(400)),
        ("FOO sip:x@127.0.0.1 SIP/2.0 more", None),
        ("FOO sip:x@127.0.0.1", None),
        ("FOO noscheme SIP/2.0", Some(400)),
        ("FOO 1sip:x SIP/2.0", Some(400)),
        ("FOO sip: SIP/2.0", Some(400)),
        ("FOO sip:x@127.0.0.1 SIP/3.0", Some(505)),
        ("FOO sip:x@127.0.0.1\tSIP/2.0", Some(400)),
        ("INVITE sip:user@example.com; lr SIP/2.0", Some(400)),
        (" FOO sip:x@127.0.0.1 SIP/2.0", None),
        ("\u{e9}T\u{e9} sip:x@127.0.0.1 SIP/2.0", None),
        ("SIP/2.0 200 OK", None),
        ("SIP/2.0 501 Not Implemented", None),
        ("OPTIONS sip:x@127.0.0.1 SIP/2.0", Some(400)),
        ("", None),
    ] {
        let text = format!("{first}\r\n{FULL}Content-Length: 0\r\n\r\n");
        let status = refused(text.as_bytes(), ALLOW).map(|r| r.status_code.code());
        assert_eq!(status, expected, "{first:?}");
    }
    assert_eq!(answer("garbage"), None);
    assert_eq!(refused(b"\xff\xfe\r\n\r\n", ALLOW).map(|_| ()), None);
    assert_eq!(refused(b"", ALLOW).map(|_| ()), None);
}

/// Methods are case-sensitive tokens (RFC 3261 §7.1): `foo` is one, and
/// CRLFs before the request line are skipped (§7.5).
#[test]
fn a_lowercase_extension_method_is_answered() {
    let text = extension("foo", &FULL.replace("CSeq: 7 FOO", "CSeq: 7 foo"));
    let answer = answer(&format!("\r\n{text}")).expect("a 501");
    assert!(answer.starts_with("SIP/2.0 501 "), "{answer}");
    assert!(answer.contains("\r\nCSeq: 7 foo\r\n"), "{answer}");
    let marks = extension("X-Ext.1!", &FULL.replace("CSeq: 7 FOO", "CSeq: 7 X-Ext.1!"));
    assert!(self::answer(&marks).is_some(), "token marks");
}

/// The encoder writes what rsip's `to_bytes` writes, byte for byte: every
/// RFC 4475 message that parses, as a request and as its responses.
#[test]
fn the_encoder_writes_what_rsip_writes() {
    // What rsip writes for `response` once its Content-Length is set.
    let rsip_bytes = |response: &Response| {
        let mut expected = response.clone();
        let len = expected.body.len().to_string();
        crate::sip::set_header(&mut expected.headers, "Content-Length", len);
        expected.to_bytes()
    };
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/torture");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("torture dir") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "dat") {
            continue;
        }
        let bytes = std::fs::read(&path).expect("message");
        let Ok(message) = SipMessage::try_from(bytes.as_slice()) else {
            continue;
        };
        let mut responses = Vec::new();
        match message {
            SipMessage::Request(mut request) => {
                for status in [200_u16, 302, 400, 503] {
                    let mut response =
                        crate::sip::response(&request, StatusCode::from(status), Some("t1"));
                    crate::sip::push_header(&mut response.headers, "Warning", "399 x \"y\"");
                    response.body = b"v=0\r\n".to_vec();
                    responses.push(response);
                }
                let len = request.body.len().to_string();
                crate::sip::set_header(&mut request.headers, "Content-Length", len);
                assert_eq!(
                    encode_request(request.clone()).as_ref(),
                    request.to_bytes().as_slice(),
                    "{}",
                    path.display()
                );
            }
            SipMessage::Response(response) => responses.push(response),
        }
        for response in responses {
            let expected = rsip_bytes(&response);
            assert_eq!(
                encode_response(response, "").as_ref(),
                expected.as_slice(),
                "{}",
                path.display()
            );
        }
        checked += 1;
    }
    assert!(checked > 30, "{checked} messages");
}

/// RFC 3261 §18.2.1 over IPv6: `received` is the bare address
/// (`received = IPv6address`, §25.1), and the answer goes to the source.
#[test]
fn an_ipv6_source_is_stamped_bare_and_answered_there() {
    let text = options("SIP/2.0/UDP [2001:db8::9]:5060;branch=z9hG4bK6;rport");
    let source = addr("[2001:db8::7]:40000");
    let Ok(SipMessage::Request(request)) = decode(text.as_bytes(), source) else {
        panic!("a request")
    };
    let via = crate::sip::header(&request.headers, "Via").expect("via");
    assert!(via.contains("received=2001:db8::7"), "{via}");
    assert!(!via.contains('['.to_string().repeat(2).as_str()), "{via}");
    assert_eq!(response_target(&request.headers, source), source);
}

/// A top `Via` value after an empty one (`Via: , SIP/2.0/UDP …`) is
/// stamped in place: the rest of the header is what follows it, not bytes
/// counted from the header's start (which duplicated its last bytes, or
/// panicked in a multi-byte character, killing the port's reader).
#[test]
fn a_top_via_after_an_empty_value_is_stamped_without_panic() {
    let source = addr("10.0.0.9:7777");
    for (via, rest) in [
        (",SIP/2.0/UDP h\u{e9}", ""),
        (" , SIP/2.0/UDP somehost:1;branch=z9hG4bKx;rport", ""),
        (
            ",SIP/2.0/UDP h;branch=z9hG4bK\u{e9} , SIP/2.0/UDP b\u{e9}",
            " , SIP/2.0/UDP b\u{e9}",
        ),
    ] {
        let text = options(via);
        let Ok(SipMessage::Request(request)) = decode(text.as_bytes(), source) else {
            panic!("a request: {via:?}")
        };
        let stamped = crate::sip::header(&request.headers, "Via").expect("via");
        assert!(stamped.starts_with("SIP/2.0/UDP "), "{stamped}");
        assert!(
            stamped.ends_with(&format!("received=10.0.0.9{}", rest))
                || stamped.ends_with(&format!("rport=7777{}", rest)),
            "{via:?} -> {stamped}"
        );
    }
}

/// RFC 4475 §3.1.1.2 (intmeth): control characters escaped as quoted-pairs
/// in a quoted display name are valid, and the request is answered; a bare
/// one is not.
#[test]
fn a_quoted_pair_control_character_is_copied_a_bare_one_is_not() {
    let escaped = FULL.replace(
        "To: <sip:x@127.0.0.1>",
        "To: \"BEL:\\\u{7} NUL:\\\u{0} DEL:\\\u{7f}\" <sip:x@127.0.0.1>",
    );
    let answered = answer(&extension("FOO", &escaped)).expect("a 501");
    assert!(answered.starts_with("SIP/2.0 501 "), "{answered}");
    let bare = FULL.replace("To: <sip:x@127.0.0.1>", "To: \u{7}<sip:x@127.0.0.1>");
    assert_eq!(answer(&extension("FOO", &bare)), None);
}

/// The answer goes back along the request's Vias: a request whose Via is
/// no Via (garbage, empty, a parameter where the sent-by goes) or that
/// carries more than 70 is not answered, nor is one whose answer would
/// grow it by more than its own lines (compact names expanded toward a
/// forged source).
#[test]
fn a_raw_answer_copies_only_vias_and_is_never_larger_than_the_request() {
    for via in [
        "Via: garbage\r\n",
        "Via:\r\n",
        "Via: SIP/2.0/UDP\r\n",
        "Via: SIP/2.0/UDP ;branch=z9hG4bK-1\r\n",
        "Via: SIP/2.0 10.0.0.2\r\n",
        "Via: SIP/2.0/UDP 10.0.0.2, junk\r\n",
    ] {
        let text = extension(
            "FOO",
            &FULL.replace("Via: SIP/2.0/UDP 10.0.0.3:5060;branch=z9hG4bK-0\r\n", via),
        );
        assert_eq!(answer(&text), None, "{via:?}");
    }
    let many = "Via: SIP/2.0/UDP 10.0.0.9:5060;branch=z9hG4bK-m\r\n".repeat(70);
    assert!(answer(&extension("FOO", &format!("{many}{FULL}"))).is_none());
    let compact = format!(
        "FOO sip:a@b SIP/2.0\r\n{}f:<sip:x@y>;tag=1\r\nt:<sip:a@b>\r\ni:c\r\nCSeq:1 FOO\r\nl:0\r\n\r\n",
        "v:SIP/2.0/UDP h\r\n".repeat(69)
    );
    assert_eq!(
        answer(&compact),
        None,
        "an answer 207 bytes and more longer"
    );
    // The same Vias in full names are answered.
    let full = compact.replace("v:", "Via: ");
    let answered = answer(&full).expect("a 501");
    assert!(answered.len() <= full.len() + 256, "{answered}");
}

/// RFC 3261 §7.1: method names are case-sensitive. `invite` is no INVITE
/// but an extension method: refused by `decode` (the parser would read it
/// as INVITE) and answered `501` like any other; a response's status
/// line and the upper-case methods pass.
#[test]
fn a_known_method_in_another_case_is_an_extension_method() {
    let lower = extension("invite", &FULL.replace("CSeq: 7 FOO", "CSeq: 7 invite"));
    assert!(
        matches!(
            decode(lower.as_bytes(), addr("10.0.0.2:5070")),
            Err(DecodeError::Malformed { .. })
        ),
        "invite is refused"
    );
    let ours = answer(&lower).expect("a 501");
    assert!(
        ours.starts_with("SIP/2.0 501 Not Implemented\r\n"),
        "{ours}"
    );
    assert!(ours.contains("\r\nCSeq: 7 invite\r\n"), "{ours}");
    let mixed = extension("Register", &FULL.replace("CSeq: 7 FOO", "CSeq: 7 Register"));
    assert!(self::answer(&mixed).is_some_and(|a| a.starts_with("SIP/2.0 501 ")));
    let upper = extension("OPTIONS", &FULL.replace("CSeq: 7 FOO", "CSeq: 7 OPTIONS"));
    assert!(decode(upper.as_bytes(), addr("10.0.0.2:5070")).is_ok());
    assert!(
        answer(&upper).is_some_and(|a| a.starts_with("SIP/2.0 400 ")),
        "a known method the parser refused is malformed"
    );
    assert_eq!(check_method_case(b"SIP/2.0 200 OK\r\n\r\n"), Ok(()));
    assert_eq!(
        check_method_case(b"\r\nfoo sip:x SIP/2.0\r\n\r\n"),
        Ok(()),
        "unknown in any case is the parser's"
    );
}
