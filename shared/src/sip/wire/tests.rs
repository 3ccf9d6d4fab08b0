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
    match decode(text.as_bytes(), addr(source), Carrier::Udp).expect("decode") {
        SipMessage::Request(r) => r,
        SipMessage::Response(_) => panic!("request"),
    }
}

/// A response goes where the request came from (RFC 3581 §4, symmetric
/// response routing), and to the sent-by address when that is the source.
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
        response_target(&with_rport, addr("192.0.2.9:40000")),
        addr("192.0.2.9:40000")
    );
    let without = request(
        &options("SIP/2.0/UDP 10.0.0.2:5070;branch=z9hG4bKb"),
        "192.0.2.9:40000",
    );
    assert_eq!(
        response_target(&without, addr("192.0.2.9:40000")),
        addr("192.0.2.9:40000")
    );
    let same = request(
        &options("SIP/2.0/UDP 10.0.0.2;branch=z9hG4bKc"),
        "10.0.0.2:5060",
    );
    assert_eq!(
        response_target(&same, addr("10.0.0.2:5060")),
        addr("10.0.0.2:5060")
    );
    // A response built from the request carries the stamped Via.
    let response = sip::response(&with_rport, StatusCode::OK, Some("t"));
    let text = String::from_utf8_lossy(&encode_response(response)).to_string();
    assert!(text.contains("received=192.0.2.9"), "{text}");
}

#[test]
fn every_encoded_message_carries_its_content_length() {
    let req = request(
        &options("SIP/2.0/UDP 10.0.0.2:5070;branch=z9hG4bKa"),
        "10.0.0.2:5070",
    );
    let mut response = sip::response(&req, StatusCode::OK, None);
    response.body = b"hello".to_vec();
    let text = String::from_utf8_lossy(&encode_response(response)).to_string();
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
    assert_eq!(
        decode(b"\r\n\r\n", from, Carrier::Udp),
        Err(DecodeError::Keepalive)
    );
    assert!(matches!(
        decode(b"\x00\xffnot sip", from, Carrier::Udp),
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
        decode(request("5000", "").as_bytes(), from, Carrier::Udp),
        Err(DecodeError::Truncated {
            declared: 5000,
            body: 0
        })
    );
    assert_eq!(
        decode(request("5", "abcd").as_bytes(), from, Carrier::Udp),
        Err(DecodeError::Truncated {
            declared: 5,
            body: 4
        })
    );
    for length in ["-1", "1180591620717411303424", "x"] {
        assert!(
            matches!(
                decode(request(length, "").as_bytes(), from, Carrier::Udp),
                Err(DecodeError::Malformed { .. })
            ),
            "{length}"
        );
    }
    for (length, body) in [("4", "abcd"), ("0", ""), ("2", "abcd")] {
        assert!(
            decode(request(length, body).as_bytes(), from, Carrier::Udp).is_ok(),
            "{length} {body}"
        );
    }
}

proptest::proptest! {
    /// Bytes from the network never make the decoder panic.
    #[test]
    fn decoding_random_bytes_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
        let _ = decode(&bytes, addr("10.0.0.2:5070"), Carrier::Udp);
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
