use super::*;

fn parse(text: &str) -> Request {
    Request::try_from(text.replace('\n', "\r\n").as_str()).expect("valid request")
}

const SUB: &str = "SUBSCRIBE sip:msr_1@127.0.0.1:5070 SIP/2.0
Via: SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bK1
From: <sip:collector@127.0.0.1>;tag=abc
To: \"MSR\" <sip:msr_1@127.0.0.1:5070>
Call-ID: c1@host
CSeq: 7 SUBSCRIBE
Event: eltex-call-count;id=4
Expires: 60
Content-Length: 0

";

#[test]
fn reads_headers() {
    let r = parse(SUB);
    assert_eq!(call_id(&r.headers), Some("c1@host"));
    assert_eq!(cseq(&r.headers), Some((7, "SUBSCRIBE".into())));
    assert_eq!(expires(&r.headers), Some(60));
    assert_eq!(
        event_package(&r.headers).as_deref(),
        Some("eltex-call-count")
    );
    let from = header(&r.headers, "from").expect("from");
    assert_eq!(tag(from).as_deref(), Some("abc"));
    assert_eq!(tag(header(&r.headers, "To").expect("to")), None);
    assert_eq!(addr_uri(from), "sip:collector@127.0.0.1");
    assert_eq!(uri_user("sip:msr_1@127.0.0.1:5070"), Some("msr_1"));
}

#[test]
fn builds_a_response_with_to_tag() {
    let r = parse(SUB);
    let resp = response(&r, StatusCode::OK, Some("t1"));
    let to = header(&resp.headers, "To").expect("to");
    assert_eq!(tag(to).as_deref(), Some("t1"));
    assert_eq!(call_id(&resp.headers), Some("c1@host"));
    let text = String::from_utf8(resp.to_bytes()).expect("utf8");
    assert!(text.starts_with("SIP/2.0 200 OK\r\n"), "{text}");
}

#[test]
fn subscription_state_roundtrip() {
    let s =
        SubscriptionStateHeader::parse("terminated;reason=timeout;retry-after=5").expect("parse");
    assert_eq!(s.state, SubState::Terminated);
    assert_eq!(s.reason, Some(TerminationReason::Timeout));
    assert_eq!(s.retry_after, Some(5));
    assert_eq!(
        SubscriptionStateHeader::active(42).to_string(),
        "active;expires=42"
    );
    assert_eq!(
        SubscriptionStateHeader::terminated(TerminationReason::Noresource).to_string(),
        "terminated;reason=noresource"
    );
    assert!(SubscriptionStateHeader::parse("bogus").is_none());
    assert!(!TerminationReason::Rejected.may_retry());
    assert!(TerminationReason::Deactivated.may_retry());
}

#[test]
fn params_of_contact() {
    let p = params("<sip:msr_1@127.0.0.1:5070>;iface=lo;expires=30");
    assert_eq!(p[0], ("iface".into(), Some("lo".into())));
    assert_eq!(
        param("<sip:a@b;transport=udp>;expires=30", "expires").as_deref(),
        Some("30")
    );
    assert_eq!(param("<sip:a@b;transport=udp>", "transport"), None);
}

#[test]
fn the_address_a_numeric_uri_names() {
    let addr = |s: &str| s.parse::<std::net::SocketAddr>().ok();
    assert_eq!(
        uri_socket_addr("sip:collector@127.0.0.1:5060"),
        addr("127.0.0.1:5060")
    );
    assert_eq!(uri_socket_addr("sip:10.0.0.5"), addr("10.0.0.5:5060"));
    assert_eq!(uri_socket_addr("sips:10.0.0.5"), addr("10.0.0.5:5061"));
    assert_eq!(
        uri_socket_addr("sip:m@[2001:db8::1]:5070;transport=udp"),
        addr("[2001:db8::1]:5070")
    );
    assert_eq!(
        uri_socket_addr("sip:m@[::ffff:192.0.2.1]:5070"),
        addr("192.0.2.1:5070"),
        "a v4-mapped address is its IPv4 address"
    );
    assert_eq!(uri_socket_addr("sip:collector@core.example:5060"), None);
    assert_eq!(uri_socket_addr("not a uri"), None);
}

/// An INVITE with `extra` headers and `body`.
fn invite_with(extra: &str, body: &str) -> Request {
    let text = format!(
        "INVITE sip:park@127.0.0.1 SIP/2.0\r\n\
         Via: SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bK1\r\n\
         From: <sip:a@127.0.0.1>;tag=1\r\nTo: <sip:park@127.0.0.1>\r\n\
         Call-ID: b1@host\r\nCSeq: 1 INVITE\r\n{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    Request::try_from(text.as_str()).expect("valid invite")
}

#[test]
fn a_body_of_a_type_not_read_is_unsupported_unless_optional() {
    let reads = ["application/sdp", "multipart/*"];
    let sdp = "v=0\r\n";
    for (extra, body, refused) in [
        ("", "", false),
        ("Content-Type: application/sdp\r\n", sdp, false),
        (
            "Content-Type: Application/SDP; charset=utf-8\r\n",
            sdp,
            false,
        ),
        (
            "Content-Type: multipart/mixed;boundary=x\r\n",
            "--x--",
            false,
        ),
        // No Content-Type: the caller recognises the body itself.
        ("", sdp, false),
        // RFC 4475 §3.3.6.
        (
            "Content-Type: application/unknownformat\r\n",
            "<audio/>",
            true,
        ),
        (
            "Content-Type: application/isup\r\nContent-Disposition: signal;handling=optional\r\n",
            "x",
            false,
        ),
        (
            "Content-Type: application/isup\r\nContent-Disposition: signal;handling=required\r\n",
            "x",
            true,
        ),
        // An empty body has no type to read.
        ("Content-Type: application/unknownformat\r\n", "", false),
    ] {
        assert_eq!(
            unsupported_body(&invite_with(extra, body), &reads),
            refused,
            "{extra:?} {body:?}"
        );
    }
}

#[test]
fn a_body_in_an_encoding_other_than_identity_is_unsupported() {
    let sdp = "v=0\r\n";
    for (extra, body, refused) in [
        ("", sdp, false),
        ("Content-Encoding: identity\r\n", sdp, false),
        ("Content-Encoding: gzip\r\n", sdp, true),
        ("e: gzip\r\n", sdp, true),
        ("Content-Encoding: identity, GZIP\r\n", sdp, true),
        // Nothing is encoded without a body.
        ("Content-Encoding: gzip\r\n", "", false),
    ] {
        assert_eq!(
            unsupported_encoding(&invite_with(extra, body)),
            refused,
            "{extra:?} {body:?}"
        );
    }
}

#[test]
fn an_accept_that_rules_out_the_answer_s_type_is_unacceptable() {
    for (extra, refused) in [
        ("", false),
        ("Accept: application/sdp\r\n", false),
        ("Accept: text/plain, Application/SDP;level=1\r\n", false),
        ("Accept: application/*\r\n", false),
        ("Accept: */*\r\n", false),
        ("Accept: text/plain\r\nAccept: application/sdp\r\n", false),
        ("Accept: \r\n", false),
        // RFC 4475 §3.3.15.
        ("Accept: text/nobodyKnowsThis\r\n", true),
        ("Accept: application/sdp;q=0, text/plain\r\n", true),
        ("Accept: text/*\r\n", true),
        // RFC 9110 §12.5.1 (RFC 3261 §20.1): the most specific range that
        // covers the type decides.
        ("Accept: application/sdp;q=0, */*\r\n", true),
        ("Accept: application/sdp;q=0, application/*\r\n", true),
        ("Accept: */*\r\nAccept: application/sdp;q=0\r\n", true),
        ("Accept: */*;q=0, application/sdp\r\n", false),
        (
            "Accept: application/*;q=0, application/sdp;q=0.1\r\n",
            false,
        ),
        ("Accept: */*;q=0, application/*\r\n", false),
    ] {
        assert_eq!(
            unacceptable(&invite_with(extra, ""), "application/sdp"),
            refused,
            "{extra:?}"
        );
    }
}

proptest::proptest! {
    /// `param` reads in place what `params` collects: the same value for
    /// any header value and name, quotes, escapes and brackets included.
    #[test]
    fn param_reads_what_params_collects(
        value in "[a-zA-Z0-9;=<>\" \\\\,@:.]{0,40}",
        name in "[a-zA-Z]{1,3}",
    ) {
        let collected = params(&value)
            .into_iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(&name))
            .and_then(|(_, v)| v);
        proptest::prop_assert_eq!(param(&value, &name), collected);
    }
}

#[test]
fn a_content_length_is_digits_only() {
    for (value, length) in [
        ("0", Some(0)),
        (" 42 ", Some(42)),
        ("0000000000000000000000000000000000000005", Some(5)),
        ("+5", None),
        ("-0", None),
        ("5a", None),
        ("", None),
        ("99999999999999999999999999", None),
    ] {
        assert_eq!(length_value(value), length, "{value:?}");
    }
}

/// RFC 3261 §8.1.1.5, §7.1: a CSeq naming another method, in another
/// case included, is a 400; the same method in the same case passes.
#[test]
fn a_cseq_method_in_another_case_is_another_method() {
    let with_cseq = |cseq: &str| {
        parse(&format!(
            "OPTIONS sip:x@127.0.0.1 SIP/2.0\nVia: SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bK-c\n\
             From: <sip:a@127.0.0.1>;tag=f\nTo: <sip:x@127.0.0.1>\nCall-ID: c@test\n\
             CSeq: {cseq}\nContent-Length: 0\n\n"
        ))
    };
    assert_eq!(request_refusal(&with_cseq("1 OPTIONS"), ALLOW), None);
    for cseq in ["1 options", "1 Options", "1 INVITE"] {
        assert_eq!(
            request_refusal(&with_cseq(cseq), ALLOW).map(|r| r.status),
            Some(StatusCode::BadRequest),
            "{cseq}"
        );
    }
}

/// RFC 3261 §8.2 in the order a UAS checks, with RFC 4475's cases: what
/// a response cannot be matched to (400), an unknown Request-URI scheme
/// (416), a required extension (420 with `Unsupported`).
#[test]
fn a_request_is_refused_as_rfc_3261_orders_the_checks() {
    const OPTIONS: &str =
        "OPTIONS sip:x@127.0.0.1 SIP/2.0\nVia: SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bK-c\n\
        From: <sip:a@127.0.0.1>;tag=f\nTo: <sip:x@127.0.0.1>\nCall-ID: c@test\n\
        CSeq: 1 OPTIONS\nMax-Forwards: 70\n";
    let with =
        |edit: &dyn Fn(&str) -> String| parse(&format!("{}Content-Length: 0\n\n", edit(OPTIONS)));
    assert_eq!(request_refusal(&with(&|t| t.to_owned()), ALLOW), None);
    let status = |edit: &dyn Fn(&str) -> String| {
        request_refusal(&with(edit), ALLOW).map(|r| r.status.code())
    };
    // §8.1.1 (RFC 4475 §3.3.1 insuf): a header every request needs.
    for name in ["Call-ID", "From", "To"] {
        let without = move |t: &str| {
            t.lines()
                .filter(|l| !l.starts_with(&format!("{name}:")))
                .map(|l| format!("{l}\n"))
                .collect::<String>()
        };
        assert_eq!(status(&without), Some(400), "without {name}");
    }
    // The grammar's minimum (§20.16 CSeq's method, §25.1 a Call-ID's
    // word, §20.22 Max-Forwards' digits), each a 400 naming it.
    for (from, to, why) in [
        ("CSeq: 1 OPTIONS", "CSeq: 1", "a cseq without a method"),
        ("Call-ID: c@test", "Call-ID: ", "an empty call-id"),
        (
            "Max-Forwards: 70",
            "Max-Forwards: abc",
            "a max-forwards that is no number",
        ),
    ] {
        let request = with(&|t| t.replace(from, to));
        let refusal = request_refusal(&request, ALLOW).expect(why);
        assert_eq!((refusal.status.code(), refusal.why), (400, why));
        let response = refusal.response(&request, "msr-test/1");
        assert_eq!(
            header(&response.headers, "Warning"),
            Some(format!("399 msr-test \"{why}\"").as_str())
        );
    }
    // §7.3.1 (RFC 4475 §3.3.8 multi01): one that appears once, twice.
    for twice in [
        "Call-ID: d@test\n",
        "To: <sip:y@127.0.0.1>\n",
        "CSeq: 2 OPTIONS\n",
        "Max-Forwards: 5\n",
        "f: <sip:b@127.0.0.1>;tag=g\n",
    ] {
        assert_eq!(status(&|t| format!("{t}{twice}")), Some(400), "{twice}");
    }
    // RFC 4475 §3.1.2.4 scalar02.
    assert_eq!(
        status(&|t| t.replace("CSeq: 1 OPTIONS", "CSeq: 36893488147419103232 OPTIONS")),
        Some(400)
    );
    assert_eq!(
        status(&|t| t.replace("CSeq: 1 OPTIONS", "CSeq: 2147483648 OPTIONS")),
        Some(400)
    );
    // An empty Via value first or last.
    assert_eq!(
        status(&|t| t.replace("Via: SIP/2.0/UDP", "Via: , SIP/2.0/UDP")),
        Some(400)
    );
    assert_eq!(
        status(&|t| t.replace("z9hG4bK-c\n", "z9hG4bK-c,\n")),
        Some(400)
    );
    // RFC 4475 §3.1.2.1 badinv01, §3.1.2.6 quotbal.
    assert_eq!(
        status(&|t| format!("{t}Via: SIP/2.0/UDP 192.0.2.15;;,;,,\n")),
        Some(400)
    );
    assert_eq!(
        status(&|t| t.replace(
            "To: <sip:x@127.0.0.1>",
            "To: \"Mr. J. User <sip:x@127.0.0.1>"
        )),
        Some(400)
    );
    assert_eq!(
        status(&|t| t.replace(
            "To: <sip:x@127.0.0.1>",
            "To: \"Mr. \\\"J\\\" User\" <sip:x@127.0.0.1>"
        )),
        None,
        "a quoted-pair quote is no end"
    );
    // LWS around the Via's slashes is valid (RFC 4475 §3.1.1.1 wsinv).
    assert_eq!(
        status(&|t| t.replace(
            "SIP/2.0/UDP 127.0.0.1:5070",
            "SIP  /  2.0 / UDP 127.0.0.1:5070"
        )),
        None
    );
    // §19.1.5 (RFC 4475 §3.1.2.11 escruri).
    assert_eq!(
        status(&|t| t.replace(
            "OPTIONS sip:x@127.0.0.1 ",
            "OPTIONS sip:x@127.0.0.1?Route=%3Csip:e%3E "
        )),
        Some(400)
    );
    // §8.2.2.1 (RFC 4475 §3.3.2 unkscm, §3.3.3 novelsc); tel is taken.
    for uri in [
        "nobodyKnowsThisScheme:totallyopaquecontent",
        "soap.beep://192.0.2.103:3002",
    ] {
        assert_eq!(
            status(&|t| t.replace("OPTIONS sip:x@127.0.0.1 ", &format!("OPTIONS {uri} "))),
            Some(416),
            "{uri}"
        );
    }
    assert_eq!(
        status(&|t| t.replace("OPTIONS sip:x@127.0.0.1 ", "OPTIONS tel:+15551234567 ")),
        None
    );
    // §8.2.2.3 (RFC 4475 §3.3.5 bext01): Require is refused with what it
    // named; Proxy-Require is a proxy's.
    let require = |t: &str| {
        format!("{t}Require: nothingSupportsThis, nothingSupportsThisEither\nProxy-Require: noProxiesSupportThis\n")
    };
    let refusal = request_refusal(&with(&require), ALLOW).expect("a 420");
    assert_eq!(refusal.status.code(), 420);
    let response = refusal.response(&with(&|t| t.to_owned()), "msr-test/1");
    assert_eq!(
        header(&response.headers, "Unsupported"),
        Some("nothingSupportsThis, nothingSupportsThisEither")
    );
    assert_eq!(
        status(&|t| format!("{t}Proxy-Require: noProxiesSupportThis\n")),
        None
    );
    // §8.2.1 first: a method the port does not serve is its 405, not a
    // 420 or 416; what makes a request malformed is a 400 whatever it is.
    assert_eq!(request_refusal(&with(&require), "INVITE, ACK"), None);
    let unkscm = |t: &str| {
        t.replace(
            "OPTIONS sip:x@127.0.0.1 ",
            "OPTIONS nobodyKnowsThisScheme:x ",
        )
    };
    assert_eq!(request_refusal(&with(&unkscm), "INVITE, ACK"), None);
    let twice = |t: &str| format!("{t}Call-ID: d@test\n");
    assert_eq!(
        request_refusal(&with(&twice), "INVITE, ACK").map(|r| r.status.code()),
        Some(400)
    );
}

/// A port's `Allow` in the tests: OPTIONS is served.
const ALLOW: &str = "REGISTER, NOTIFY, OPTIONS";
