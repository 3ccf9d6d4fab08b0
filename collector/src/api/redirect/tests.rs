use bytes::Bytes;
use msr_shared::admin::Selection;
use msr_shared::admin::{ErrorBody, SelectQuery, SelectionRule};
use tokio::time::Instant;

use super::server::text_head_then_body;
use super::*;
use msr_shared::sip::wire::response_target;

fn invite(uri: &str, extra: &str) -> Request {
    Request::try_from(invite_text(uri, extra).as_str()).expect("valid invite")
}

fn invite_text(uri: &str, extra: &str) -> String {
    format!(
        "INVITE {uri} SIP/2.0\r\n\
         Via: SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bK-1\r\n\
         Max-Forwards: 70\r\n\
         From: <sip:alice@127.0.0.1>;tag=f1\r\n\
         To: <sip:park@127.0.0.1>\r\n\
         Call-ID: call-1@core\r\n\
         CSeq: 1 INVITE\r\n\
         {extra}Content-Length: 0\r\n\r\n"
    )
}

fn ctx() -> RedirectContext {
    RedirectContext {
        own: vec!["127.0.0.1:5062".parse().expect("addr")],
        allow: vec!["127.0.0.1/32".parse().expect("net")],
    }
}

#[test]
fn only_the_allowed_softswitch_hosts_are_served() {
    let c = RedirectContext {
        allow: vec![
            "127.0.0.1/32".parse().expect("net"),
            "10.1.0.0/16".parse().expect("net"),
        ],
        ..ctx()
    };
    for (src, allowed) in [
        ("127.0.0.1:5060", true),
        ("10.1.2.3:5060", true),
        ("127.0.1.7:5060", false),
        ("10.2.0.1:5060", false),
        ("[::ffff:127.0.0.1]:5060", true),
    ] {
        assert_eq!(c.allows(src.parse().expect("addr")), allowed, "{src}");
    }
}

fn selection(engine: Option<&str>) -> AdminResponse {
    AdminResponse::Ok(ResponseData::Selected(Selection {
        msr: "msr_1".into(),
        contact: "lo@msr_1".into(),
        uri: "sip:msr_1@127.0.0.1:5041".into(),
        engine_uri: engine.map(str::to_owned),
        mcc: None,
        media_bridge: false,
        distance: msr_shared::admin::Distance::Finite(0.0),
        draw: 1.0,
        total: 2.0,
        rule: SelectionRule::Draw,
        leg: None,
        explain: None,
    }))
}

fn header<'a>(r: &'a Response, name: &str) -> Option<&'a str> {
    sip::header(&r.headers, name)
}

#[test]
fn uri_parameters_come_first_then_headers_then_defaults() {
    let req = invite(
        "sip:park@127.0.0.1:5062;zone=z1;msr=msr_9",
        "X-MSR-Zone: z2\r\nX-MSR-Site: s2\r\nX-MSR-Leg: b\r\n",
    );
    let Decision::Select(AdminRequest::Select(SelectQuery {
        zone,
        site,
        msr,
        call_id,
        leg,
        conference,
        ..
    })) = decide(&req)
    else {
        panic!("a select")
    };
    assert_eq!((zone.as_str(), site.as_str()), ("z1", "s2"));
    assert_eq!(msr.as_deref(), Some("msr_9"));
    assert_eq!(call_id.as_deref(), Some("call-1@core"));
    assert_eq!(leg.as_deref(), Some("b"));
    assert_eq!(conference, None);

    let Decision::Select(AdminRequest::Select(SelectQuery { zone, site, .. })) =
        decide(&invite("sip:park@127.0.0.1:5062", ""))
    else {
        panic!("a select")
    };
    // Left to the core, which reads its `[defaults]` as they are then.
    assert_eq!((zone.as_str(), site.as_str()), ("", ""));
}

#[test]
fn an_exhausted_max_forwards_gets_483_and_a_bad_one_400() {
    let req = invite("sip:park@127.0.0.1:5062", "")
        .to_string()
        .replace("Max-Forwards: 70", "Max-Forwards: 0");
    let req = Request::try_from(req.as_str()).expect("valid");
    let Decision::Reply(response) = decide(&req) else {
        panic!("a reply")
    };
    assert_eq!(response.status_code.code(), 483);
    let req = invite("sip:park@127.0.0.1:5062", "")
        .to_string()
        .replace("Max-Forwards: 70", "Max-Forwards: many");
    let req = Request::try_from(req.as_str()).expect("valid");
    let Decision::Reply(response) = decide(&req) else {
        panic!("a reply")
    };
    assert_eq!(response.status_code.code(), 400);
}

#[test]
fn a_selection_becomes_a_302_to_the_engine_or_the_contact() {
    let req = invite("sip:park@127.0.0.1:5062", "");
    let response = answer(&req, &selection(Some("sip:127.0.0.1:5090")), &ctx());
    assert_eq!(response.status_code.code(), 302);
    assert_eq!(header(&response, "Contact"), Some("<sip:127.0.0.1:5090>"));
    assert_eq!(header(&response, "X-MSR"), Some("msr_1"));
    let to = header(&response, "To").expect("to");
    assert!(to.contains(";tag="), "{to}");
    // The same INVITE again: the same answer, tag included.
    assert_eq!(
        answer(&req, &selection(Some("sip:127.0.0.1:5090")), &ctx()).to_string(),
        response.to_string()
    );
    let fallback = answer(&req, &selection(None), &ctx());
    assert_eq!(
        header(&fallback, "Contact"),
        Some("<sip:msr_1@127.0.0.1:5041>")
    );
}

#[test]
fn a_302_never_points_back_at_the_collector() {
    let req = invite("sip:park@127.0.0.1:5062", "");
    let response = answer(
        &req,
        &selection(Some("sip:127.0.0.1:5062;transport=udp")),
        &ctx(),
    );
    assert_eq!(response.status_code.code(), 482);
}

#[test]
fn refusals_carry_a_reason_naming_the_cause() {
    let req = invite("sip:park@127.0.0.1:5062", "");
    for (code, status) in [
        (ErrorCode::MsrNotFound, 480),
        (ErrorCode::MsrOverloaded, 503),
        (ErrorCode::MsrUnhealthy, 503),
        (ErrorCode::UnknownSite, 400),
        (ErrorCode::Unavailable, 503),
    ] {
        let refused = AdminResponse::Err(ErrorBody {
            code,
            message: "a \"quoted\" message".into(),
            explain: None,
        });
        let response = answer(&req, &refused, &ctx());
        assert_eq!(response.status_code.code(), status, "{code}");
        assert_eq!(
            header(&response, "Reason"),
            Some(format!("SIP ;cause={status};text=\"{code}\"").as_str())
        );
        assert_eq!(
            header(&response, "Warning"),
            Some("399 msr-collector \"a 'quoted' message\"")
        );
    }
}

#[test]
fn other_methods_as_a_redirect_server_answers_them() {
    let req = invite("sip:park@127.0.0.1:5062", "");
    let text = req.to_string();
    let cancel = Request::try_from(
        text.replace("INVITE sip", "CANCEL sip")
            .replace("1 INVITE", "1 CANCEL")
            .as_str(),
    )
    .expect("cancel");
    // A CANCEL shares its INVITE's branch (RFC 3261 §9.1): the same key.
    assert_eq!(transaction_key(&cancel), transaction_key(&req));
    assert_eq!(
        transaction_key(&req).as_deref(),
        Some("z9hG4bK-1 127.0.0.1:5070")
    );
    let ack = Request::try_from(
        text.replace("INVITE sip", "ACK sip")
            .replace("1 INVITE", "1 ACK")
            .as_str(),
    )
    .expect("ack");
    assert!(other_method(&ack).is_none());
    let bye = Request::try_from(
        text.replace("INVITE sip", "BYE sip")
            .replace("1 INVITE", "2 BYE")
            .as_str(),
    )
    .expect("bye");
    let response = other_method(&bye).expect("an answer");
    assert_eq!(response.status_code.code(), 405);
    assert_eq!(header(&response, "Allow"), Some(ALLOW));
}

#[test]
fn uri_parameters_are_percent_decoded() {
    assert_eq!(
        uri_params("sip:p@h;zone=a%20b;site=x;lr?X=1"),
        vec![
            ("zone".to_owned(), "a b".to_owned()),
            ("site".to_owned(), "x".to_owned()),
            ("lr".to_owned(), String::new()),
        ]
    );
    assert_eq!(percent_decode("100%"), "100%");
    assert_eq!(percent_decode("%4"), "%4");
}

#[test]
fn the_cache_resends_an_answer_absorbs_a_retransmission_in_flight_and_matches_cancels() {
    let t0 = Instant::now();
    let mut cache = InviteCache::default();
    assert_eq!(cache.on_cancel(t0, "b1 h:1"), OnCancel::NoMatch);
    assert_eq!(cache.on_invite(t0, "b1 h:1"), OnInvite::New);
    // Retransmitted while its selection runs: the answer will come.
    assert_eq!(cache.on_invite(t0, "b1 h:1"), OnInvite::Absorb);
    let bytes = Bytes::from_static(b"SIP/2.0 302 Moved Temporarily");
    assert!(cache.answered("b1 h:1", &bytes));
    assert_eq!(
        cache.on_invite(t0, "b1 h:1"),
        OnInvite::Resend(bytes.clone())
    );
    // §9.2: a CANCEL after the final response changes nothing.
    assert_eq!(cache.on_cancel(t0, "b1 h:1"), OnCancel::Answered);
    assert_eq!(cache.on_invite(t0, "b1 h:1"), OnInvite::Resend(bytes));
    // One cancelled while selecting: its answer is refused once (the
    // caller sends 487 and records that).
    assert_eq!(cache.on_invite(t0, "b2 h:1"), OnInvite::New);
    assert_eq!(cache.on_cancel(t0, "b2 h:1"), OnCancel::Terminate);
    let ok = Bytes::from_static(b"302");
    assert!(!cache.answered("b2 h:1", &ok));
    let terminated = Bytes::from_static(b"487");
    assert!(cache.answered("b2 h:1", &terminated));
    assert_eq!(cache.on_invite(t0, "b2 h:1"), OnInvite::Resend(terminated));
    // Forgotten after Timer B's 32 s: a CANCEL then matches nothing.
    let later = t0 + REMEMBER;
    assert_eq!(cache.on_cancel(later, "b1 h:1"), OnCancel::NoMatch);
    assert!(cache.is_empty());
}

#[test]
fn the_cache_is_bounded_oldest_first() {
    let t0 = Instant::now();
    let mut cache = InviteCache::default();
    for i in 0..=MAX_REMEMBERED {
        assert_eq!(cache.on_invite(t0, &format!("b{i}")), OnInvite::New);
    }
    assert_eq!(cache.len(), MAX_REMEMBERED);
    assert_eq!(cache.on_cancel(t0, "b0"), OnCancel::NoMatch);
    assert_eq!(cache.on_cancel(t0, "b1"), OnCancel::Terminate);
}

/// Past the bound the ring's slots are reused: each remembered INVITE
/// keeps its own answer, the forgotten ones match nothing, and after Timer
/// B's 32 s the whole memory is empty and fills again.
#[test]
fn the_cache_reuses_its_slots_without_mixing_answers() {
    let t0 = Instant::now();
    let mut cache = InviteCache::default();
    let total = 2 * MAX_REMEMBERED + 5;
    for i in 0..total {
        let key = format!("z9hG4bK-{i} 10.0.0.1:5060");
        assert_eq!(cache.on_invite(t0, &key), OnInvite::New);
        assert!(cache.answered(&key, format!("302 for {i}").as_bytes()));
    }
    assert_eq!(cache.len(), MAX_REMEMBERED);
    for i in [0, total - MAX_REMEMBERED - 1] {
        let key = format!("z9hG4bK-{i} 10.0.0.1:5060");
        assert_eq!(cache.on_cancel(t0, &key), OnCancel::NoMatch, "{key}");
    }
    for i in [total - MAX_REMEMBERED, total - 2, total - 1] {
        let key = format!("z9hG4bK-{i} 10.0.0.1:5060");
        assert_eq!(
            cache.on_invite(t0, &key),
            OnInvite::Resend(Bytes::from(format!("302 for {i}"))),
            "{key}"
        );
    }
    let later = t0 + REMEMBER;
    assert_eq!(cache.on_invite(later, "again 10.0.0.1:5060"), OnInvite::New);
    assert_eq!(cache.len(), 1);
    assert_eq!(
        cache.on_invite(later, "again 10.0.0.1:5060"),
        OnInvite::Absorb
    );
}

#[test]
fn responses_go_to_the_source_with_rport_else_to_the_via_port() {
    let src: SocketAddr = "10.0.0.9:40000".parse().expect("addr");
    let with = |via: &str| {
        let text = invite("sip:park@127.0.0.1:5062", "")
            .to_string()
            .replace("SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bK-1", via);
        response_target(
            &Request::try_from(text.as_str()).expect("invite").headers,
            src,
        )
    };
    assert_eq!(
        with("SIP/2.0/UDP 10.0.0.1:5070;rport;branch=z9hG4bK-1"),
        src
    );
    assert_eq!(
        with("SIP/2.0/UDP 10.0.0.1:5070;branch=z9hG4bK-1"),
        "10.0.0.9:5070".parse().expect("addr")
    );
    assert_eq!(
        with("SIP/2.0/UDP core.example;branch=z9hG4bK-1"),
        "10.0.0.9:5060".parse().expect("addr")
    );
    assert_eq!(
        with("SIP/2.0/UDP 10.0.0.1:5070;x=\"a,b\";rport;branch=z9hG4bK-1"),
        src
    );
    // Its branch is found past the quoted comma too (no 400 "no via
    // branch").
    let quoted = invite_text("sip:park@127.0.0.1:5062", "").replace(
        "SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bK-1",
        "SIP/2.0/UDP 127.0.0.1:5070;x=\"a,b\";branch=z9hG4bK-q",
    );
    let req = Request::try_from(quoted.as_str()).expect("invite");
    assert_eq!(
        transaction_key(&req).as_deref(),
        Some("z9hG4bK-q 127.0.0.1:5070")
    );
    // The 501 to an extension method (RFC 3261 §8.2.1) goes the same way:
    // it carries the request's Via.
    let foo = invite_text("sip:park@127.0.0.1:5062", "")
        .replace("INVITE sip", "FOO sip")
        .replace("1 INVITE", "1 FOO");
    let response = msr_shared::sip::wire::refused(foo.as_bytes(), ALLOW).expect("a 501");
    assert_eq!(response.status_code.code(), 501);
    assert_eq!(header(&response, "Allow"), Some(ALLOW));
    assert_eq!(
        response_target(&response.headers, src),
        "10.0.0.9:5070".parse().expect("addr")
    );
}

#[test]
fn an_invite_without_to_from_or_an_invite_cseq_gets_400() {
    let full = invite_text("sip:park@127.0.0.1", "");
    for (without, edit, needle) in [
        ("To", "To: <sip:park@127.0.0.1>\r\n", "no to header"),
        (
            "From",
            "From: <sip:alice@127.0.0.1>;tag=f1\r\n",
            "no from header",
        ),
        ("CSeq", "CSeq: 1 INVITE\r\n", "no cseq"),
    ] {
        let text = full.replace(edit, "");
        let req = Request::try_from(text.as_str()).expect("parses");
        match decide(&req) {
            Decision::Reply(r) => {
                assert_eq!(r.status_code, StatusCode::BadRequest, "without {without}");
                assert!(
                    header(&r, "Warning").is_some_and(|w| w.contains(needle)),
                    "without {without}: {:?}",
                    header(&r, "Warning")
                );
            }
            other => panic!("without {without}: {other:?}"),
        }
    }
    let text = full.replace("CSeq: 1 INVITE", "CSeq: 1 BYE");
    let req = Request::try_from(text.as_str()).expect("parses");
    assert!(matches!(decide(&req), Decision::Reply(r) if r.status_code == StatusCode::BadRequest));
    assert!(matches!(
        decide(&Request::try_from(full.as_str()).expect("parses")),
        Decision::Select(_)
    ));
}

fn invite_with_body(content_type: Option<&str>, body: &str) -> Request {
    let content_type = content_type.map_or(String::new(), |t| format!("Content-Type: {t}\r\n"));
    let text = format!(
        "INVITE sip:park@127.0.0.1:5062 SIP/2.0\r\n\
         Via: SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bK-1\r\n\
         Max-Forwards: 70\r\n\
         From: <sip:alice@127.0.0.1>;tag=f1\r\n\
         To: <sip:park@127.0.0.1>\r\n\
         Call-ID: call-1@core\r\n\
         CSeq: 1 INVITE\r\n\
         {content_type}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    Request::try_from(text.as_str()).expect("valid invite")
}

fn codecs_asked(decision: Decision) -> Vec<String> {
    match decision {
        Decision::Select(AdminRequest::Select(q)) => q.codecs,
        other => panic!("{other:?}"),
    }
}

/// SPEC §15: the redirect server reads the leg's needs from the INVITE's
/// SDP offer: static payload types by RFC 3551, dynamic ones by rtpmap,
/// `m=image … t38`; no body, or a multipart body without SDP, needs
/// nothing.
#[test]
fn the_offer_in_the_invite_is_the_legs_needs() {
    let sdp = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n\
               m=audio 6000 RTP/AVP 18 0 101\r\na=rtpmap:101 telephone-event/8000\r\n\
               m=video 6002 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\n\
               m=image 6004 udptl t38\r\n";
    let asked = codecs_asked(decide(&invite_with_body(Some("application/sdp"), sdp)));
    assert_eq!(asked, ["pcmu", "g729", "h264", "t38"]);
    let bare = codecs_asked(decide(&invite_with_body(
        None,
        "v=0\r\nm=audio 1 RTP/AVP 8\r\n",
    )));
    assert_eq!(bare, ["pcma"]);
    assert!(codecs_asked(decide(&invite("sip:park@127.0.0.1:5062", ""))).is_empty());
    let other = invite_with_body(
        Some("multipart/mixed;boundary=b1"),
        "--b1\r\nContent-Type: text/plain\r\n\r\nm=video 1 RTP/AVP 34\r\n--b1--\r\n",
    );
    assert!(codecs_asked(decide(&other)).is_empty());
    // SIP-T: the SDP part of a multipart body (RFC 3204) is the offer.
    let sip_t = invite_with_body(
        Some("multipart/mixed;boundary=b1"),
        "--b1\r\nContent-Type: application/sdp\r\n\r\nv=0\r\nm=audio 1 RTP/AVP 8\r\nm=video 2 RTP/AVP 120\r\na=rtpmap:120 H265/90000\r\n\r\n--b1\r\nContent-Type: application/isup\r\n\r\nx\r\n--b1--\r\n",
    );
    assert_eq!(codecs_asked(decide(&sip_t)), ["pcma", "h265"]);
}

/// An SDP that does not parse is answered 400 naming what is wrong, never
/// a leg placed unchecked; an offer nobody takes is answered 488 with
/// `Reason` and a `Warning: 305` naming what is missing (RFC 3261
/// §21.4.26, §20.43).
#[test]
fn a_bad_sdp_gets_400_and_an_offer_nobody_takes_488() {
    let bad = invite_with_body(Some("application/sdp"), "v=0\r\nm=audio x RTP/AVP 0\r\n");
    let Decision::Reply(response) = decide(&bad) else {
        panic!("a bad sdp is answered at once");
    };
    assert_eq!(response.status_code.code(), 400);
    assert!(
        header(&response, "Warning").is_some_and(|w| w.contains("sdp line 2: bad media line")),
        "{:?}",
        header(&response, "Warning")
    );
    let req = invite("sip:park@127.0.0.1:5062", "");
    let refused = AdminResponse::Err(ErrorBody {
        code: ErrorCode::NoCapableMsr,
        message:
            "no msr in zone `default` at a finite distance from site `local` takes video (h264)"
                .into(),
        explain: None,
    });
    let response = answer(&req, &refused, &ctx());
    assert_eq!(response.status_code.code(), 488);
    assert_eq!(
        header(&response, "Reason"),
        Some("SIP ;cause=488;text=\"no_capable_msr\"")
    );
    assert!(header(&response, "Warning")
        .is_some_and(|w| w.starts_with("305 msr-collector ") && w.contains("video (h264)")));
}

/// An SDP with a Latin-1 `s=` (RFC 4566 `a=charset`) is served: the head
/// must be UTF-8, the body's other bytes read as `?` (same length, so the
/// Content-Length holds); a head that is not UTF-8 is not SIP.
#[test]
fn a_body_that_is_not_utf8_is_read_with_its_other_bytes_as_question_marks() {
    let sdp = b"v=0\r\ns=Caf\xe9\r\nm=audio 1 RTP/AVP 8\r\n";
    let mut packet = invite_text(
        "sip:park@127.0.0.1:5062",
        "Content-Type: application/sdp\r\n",
    )
    .replace(
        "Content-Length: 0",
        &format!("Content-Length: {}", sdp.len()),
    )
    .into_bytes();
    packet.extend_from_slice(sdp);
    let cleaned = text_head_then_body(&packet).expect("a text head");
    assert_eq!(cleaned.len(), packet.len());
    let req = Request::try_from(std::str::from_utf8(&cleaned).expect("utf-8")).expect("parses");
    assert_eq!(codecs_asked(decide(&req)), ["pcma"]);
    let mut bad_head = packet.clone();
    bad_head[3] = 0xff;
    assert_eq!(text_head_then_body(&bad_head), None);
}

/// RFC 3261 §8.2.3 with RFC 4475's INVITEs: a body this server does not
/// read gets `415` with `Accept` (§3.3.6 invut), unless it is optional
/// (an ISUP body, RFC 3204); an `Accept` without `application/sdp` gets
/// `406` (§3.3.15 sdp01). Neither places a leg.
#[test]
fn an_unknown_body_gets_415_with_accept_and_an_accept_without_sdp_406() {
    let unknown = invite_with_body(
        Some("application/unknownformat"),
        "<audio>\r\n <pcmu port=\"443\"/>\r\n</audio>\r\n",
    );
    let Decision::Reply(response) = decide(&unknown) else {
        panic!("answered at once")
    };
    assert_eq!(response.status_code.code(), 415);
    assert_eq!(
        header(&response, "Accept"),
        Some("application/sdp, multipart/mixed")
    );
    let optional = invite(
        "sip:park@127.0.0.1:5062",
        "Content-Disposition: signal;handling=optional\r\n",
    )
    .to_string()
    .replace(
        "Content-Length: 0\r\n\r\n",
        "Content-Type: application/isup\r\nContent-Length: 4\r\n\r\nisup",
    );
    let optional = Request::try_from(optional.as_str()).expect("valid");
    assert_eq!(optional.body, b"isup");
    assert!(matches!(decide(&optional), Decision::Select(_)));
    let Decision::Reply(response) = decide(&invite(
        "sip:park@127.0.0.1:5062",
        "Accept: text/nobodyKnowsThis\r\n",
    )) else {
        panic!("answered at once")
    };
    assert_eq!(response.status_code.code(), 406);
    assert!(matches!(
        decide(&invite(
            "sip:park@127.0.0.1:5062",
            "Accept: application/sdp\r\n"
        )),
        Decision::Select(_)
    ));
}

/// RFC 3261 §8.2.3: an SDP body in an encoding this server does not
/// decode gets `415` with `Accept-Encoding`, and places no leg.
#[test]
fn an_encoded_body_gets_415_with_accept_encoding() {
    let gzip = invite("sip:park@127.0.0.1:5062", "Content-Encoding: gzip\r\n")
        .to_string()
        .replace(
            "Content-Length: 0\r\n\r\n",
            "Content-Type: application/sdp\r\nContent-Length: 4\r\n\r\n\x1f\x08ab",
        );
    let gzip = Request::try_from(gzip.as_str()).expect("valid");
    let Decision::Reply(response) = decide(&gzip) else {
        panic!("answered at once")
    };
    assert_eq!(response.status_code.code(), 415);
    assert_eq!(header(&response, "Accept-Encoding"), Some("identity"));
}

/// The Via is rewritten only when its sent-by is not the source's IP or
/// it asks for `rport` (or carries a `received` of its own): RFC 3261
/// §18.2.1, RFC 3581 §4.
#[test]
fn a_via_is_stamped_unless_it_names_its_source_and_asks_nothing() {
    let headers = |via: &str| {
        invite_text("sip:park@127.0.0.1", "").replace(
            "Via: SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bK-1",
            &format!("Via: {via}"),
        )
    };
    let src: SocketAddr = "127.0.0.1:5070".parse().expect("addr");
    for (via, stamp) in [
        ("SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bK-1", false),
        ("SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bK-1;rport", true),
        (
            "SIP/2.0/UDP 127.0.0.1:5070;received=10.0.0.1;branch=z9hG4bK-1",
            true,
        ),
        ("SIP/2.0/UDP 127.0.0.1:5071;branch=z9hG4bK-1", false),
        ("SIP/2.0/UDP 127.0.0.1;branch=z9hG4bK-1", false),
        ("SIP/2.0/UDP host.example;branch=z9hG4bK-1", true),
        // A quoted parameter value may hold a comma (RFC 3261 §25.1
        // gen-value): it does not end the top Via value.
        (
            "SIP/2.0/UDP 127.0.0.1:5070;x=\"a,b\";rport;branch=z9hG4bK-1",
            true,
        ),
    ] {
        let mut req = Request::try_from(headers(via).as_str()).expect("valid");
        msr_shared::sip::wire::stamp_received(&mut req.headers, src).expect("a via");
        assert_eq!(
            msr_shared::sip::header(&req.headers, "Via") != Some(via),
            stamp,
            "{via}"
        );
    }
}

/// An RFC 2543 client's INVITE (no branch, or one without RFC 3261's
/// cookie; RFC 4475 §3.4.1) is matched as RFC 3261 §17.2.3 says: its
/// retransmission and its CANCEL share its identity, another request of
/// the call does not.
#[test]
fn an_rfc_2543_invite_is_matched_by_its_call_id_tags_cseq_and_via() {
    for via in [
        "SIP/2.0/UDP 127.0.0.1:5070",
        "SIP/2.0/UDP 127.0.0.1:5070;branch=1",
    ] {
        let text = invite_text("sip:park@127.0.0.1:5062", "")
            .replace("SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bK-1", via);
        let req = Request::try_from(text.as_str()).expect("invite");
        let key = transaction_key(&req).expect("a key without a branch");
        let again = Request::try_from(text.as_str()).expect("invite");
        assert_eq!(transaction_key(&again).as_ref(), Some(&key), "{via}");
        let cancel = Request::try_from(
            text.replace("INVITE sip", "CANCEL sip")
                .replace("1 INVITE", "1 CANCEL")
                .as_str(),
        )
        .expect("cancel");
        assert_eq!(transaction_key(&cancel).as_ref(), Some(&key), "{via}");
        let next = Request::try_from(text.replace("1 INVITE", "2 INVITE").as_str()).expect("next");
        assert_ne!(transaction_key(&next).as_ref(), Some(&key), "{via}");
    }
}
