use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use msr_shared::sip::{self, Request, Response, StatusCode};
use rsipstack::dialog::authenticate::compute_digest;
use rsipstack::sip::headers::auth::{Algorithm as RsipAlgorithm, AuthQop};
use tokio::time::Instant;

use super::*;
use crate::config::{Account, Realm};
use crate::test_log::Captured;

fn config() -> RegistrationConfig {
    RegistrationConfig {
        account: Account {
            msr_name: "msr_1".into(),
            realm: Realm {
                uri: "sip:192.168.2.21:5000".into(),
                host: "192.168.2.21".into(),
                port: Some(5000),
            },
            auth_name: "alice".into(),
            auth_password: "secret".into(),
            dtmf_mode: None,
        },
        contact_addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
        contact_port: 5070,
        iface: "lo".into(),
        engine: Some(msr_shared::engine::EngineAddresses {
            sip: "127.0.0.1:5060".parse().expect("addr"),
            transport: msr_shared::engine::EngineTransport::Udp,
            mcc: Some("127.0.0.1:5700".parse().expect("addr")),
        }),
        expires: 300,
    }
}

fn h<'a>(r: &'a Request, name: &str) -> &'a str {
    sip::header(&r.headers, name).unwrap_or_default()
}

fn reply(req: &Request, code: u16, extra: &[(&str, &str)]) -> Response {
    let mut r = sip::response(req, StatusCode::from(code), Some("srv"));
    for (n, v) in extra {
        sip::push_header(&mut r.headers, n, *v);
    }
    r
}

fn start() -> (Registration, Instant, Request) {
    let t0 = Instant::now();
    let mut reg = Registration::new(config(), t0);
    assert_eq!(reg.poll_timeout(), Some(t0));
    reg.handle_timeout(t0);
    let req = reg.poll_transmit().expect("first register");
    (reg, t0, req)
}

/// The `name=value` parameter of a Digest header value.
fn auth_param(value: &str, name: &str) -> Option<String> {
    let (_, params) = digest::auth_params(value)?;
    params.into_iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

#[test]
fn first_register_has_the_spec_headers() {
    let (reg, _, req) = start();
    assert_eq!(req.method, Method::Register);
    assert_eq!(req.uri.to_string(), "sip:192.168.2.21:5000");
    assert_eq!(sip::addr_uri(h(&req, "To")), "sip:msr_1@192.168.2.21:5000");
    assert_eq!(
        sip::addr_uri(h(&req, "From")),
        "sip:msr_1@192.168.2.21:5000"
    );
    assert!(sip::tag(h(&req, "From")).is_some());
    // SPEC §3: the agent's own address, the engine's as URI parameters.
    assert_eq!(
        h(&req, "Contact"),
        "<sip:msr_1@127.0.0.1:5070;engine=127.0.0.1:5060;engine-transport=udp;mcc=127.0.0.1:5700>;iface=lo"
    );
    assert_eq!(h(&req, "Expires"), "300");
    assert_eq!(h(&req, "CSeq"), "1 REGISTER");
    assert_eq!(h(&req, "Call-ID"), reg.call_id());
    assert!(h(&req, "User-Agent").starts_with("msr-agent/"));
    assert_eq!(reg.state(), RegistrationState::Registering);
    assert_eq!(
        reg.poll_timeout(),
        None,
        "no timer while the request is in flight"
    );
}

#[test]
fn digest_md5_retry_then_refresh_with_the_same_call_id() {
    let (mut reg, t0, req) = start();
    let challenge = r#"Digest realm="core.example", nonce="abc123", qop="auth,auth-int", algorithm=MD5, opaque="op""#;
    reg.handle_response(t0, &reply(&req, 401, &[("WWW-Authenticate", challenge)]));
    let retry = reg.poll_transmit().expect("retry with credentials");
    assert_eq!(h(&retry, "CSeq"), "2 REGISTER");
    assert_eq!(h(&retry, "Call-ID"), h(&req, "Call-ID"));
    assert_eq!(h(&retry, "From"), h(&req, "From"));
    let auth = h(&retry, "Authorization");
    assert_eq!(
        auth_param(auth, "realm").as_deref(),
        Some("core.example"),
        "digest realm from the challenge"
    );
    assert_eq!(auth_param(auth, "username").as_deref(), Some("alice"));
    assert_eq!(auth_param(auth, "qop").as_deref(), Some("auth"));
    assert_eq!(auth_param(auth, "nc").as_deref(), Some("00000001"));
    assert_eq!(auth_param(auth, "opaque").as_deref(), Some("op"));
    assert_eq!(auth_param(auth, "algorithm").as_deref(), Some("MD5"));
    let cnonce = auth_param(auth, "cnonce").expect("cnonce");
    let uri = auth_param(auth, "uri").expect("uri");
    let expected = compute_digest(
        "alice",
        "secret",
        "core.example",
        "abc123",
        &Method::Register,
        &uri,
        RsipAlgorithm::Md5,
        Some(&AuthQop::Auth { cnonce, nc: 1 }),
    );
    assert_eq!(auth_param(auth, "response"), Some(expected));

    let t1 = t0 + Duration::from_millis(20);
    reg.handle_response(t1, &reply(&retry, 200, &[("Expires", "60")]));
    assert_eq!(reg.state(), RegistrationState::Registered);
    assert_eq!(reg.expires_at(), Some(t1 + Duration::from_secs(60)));
    assert_eq!(reg.poll_timeout(), Some(t1 + Duration::from_secs(15)));

    reg.handle_timeout(t1 + Duration::from_secs(14));
    assert!(reg.poll_transmit().is_none(), "no refresh before its time");
    reg.handle_timeout(t1 + Duration::from_secs(15));
    let refresh = reg.poll_transmit().expect("refresh");
    assert_eq!(h(&refresh, "CSeq"), "3 REGISTER");
    assert_eq!(h(&refresh, "Call-ID"), h(&req, "Call-ID"));
    assert_eq!(
        auth_param(h(&refresh, "Authorization"), "nc").as_deref(),
        Some("00000002")
    );
    assert_eq!(
        reg.state(),
        RegistrationState::Registered,
        "refreshing keeps the binding"
    );
}

#[test]
fn sha256_challenge_is_answered_with_sha256() {
    let (mut reg, t0, req) = start();
    let challenge = r#"Digest realm="r", nonce="n1", qop="auth", algorithm=SHA-256"#;
    reg.handle_response(t0, &reply(&req, 407, &[("Proxy-Authenticate", challenge)]));
    let retry = reg.poll_transmit().expect("retry");
    let auth = h(&retry, "Proxy-Authorization");
    assert_eq!(auth_param(auth, "algorithm").as_deref(), Some("SHA-256"));
    let cnonce = auth_param(auth, "cnonce").expect("cnonce");
    let uri = auth_param(auth, "uri").expect("uri");
    let expected = compute_digest(
        "alice",
        "secret",
        "r",
        "n1",
        &Method::Register,
        &uri,
        RsipAlgorithm::Sha256,
        Some(&AuthQop::Auth { cnonce, nc: 1 }),
    );
    assert_eq!(auth_param(auth, "response"), Some(expected));
}

#[test]
fn second_challenge_with_the_same_nonce_fails_unless_stale() {
    let (mut reg, t0, req) = start();
    let ch = r#"Digest realm="r", nonce="n1", qop="auth""#;
    reg.handle_response(t0, &reply(&req, 401, &[("WWW-Authenticate", ch)]));
    let retry = reg.poll_transmit().expect("retry");
    // Stale: retry once more with the same nonce.
    let stale = r#"Digest realm="r", nonce="n1", qop="auth", stale=true"#;
    reg.handle_response(t0, &reply(&retry, 401, &[("WWW-Authenticate", stale)]));
    let retry2 = reg.poll_transmit().expect("stale retry");
    assert_eq!(h(&retry2, "CSeq"), "3 REGISTER");
    // Same nonce again, not stale: wrong credentials.
    reg.handle_response(t0, &reply(&retry2, 401, &[("WWW-Authenticate", ch)]));
    assert!(reg.poll_transmit().is_none());
    assert_eq!(reg.state(), RegistrationState::Failed);
    assert_eq!(reg.poll_timeout(), Some(t0 + BACKOFF_BASE));
}

#[test]
fn failures_back_off_exponentially_up_to_the_cap() {
    let (mut reg, mut now, mut req) = start();
    let mut delays = Vec::new();
    for _ in 0..9 {
        reg.handle_response(now, &reply(&req, 503, &[]));
        assert_eq!(reg.state(), RegistrationState::Failed);
        let next = reg.poll_timeout().expect("retry scheduled");
        delays.push((next - now).as_secs());
        reg.handle_timeout(next - Duration::from_millis(1));
        assert!(
            reg.poll_transmit().is_none(),
            "no retry before the backoff elapsed"
        );
        now = next;
        reg.handle_timeout(now);
        req = reg.poll_transmit().expect("retry");
        assert_eq!(reg.state(), RegistrationState::Registering);
    }
    assert_eq!(delays, vec![1, 2, 4, 8, 16, 32, 60, 60, 60]);
    // A success resets the backoff.
    reg.handle_response(now, &reply(&req, 200, &[]));
    assert_eq!(reg.state(), RegistrationState::Registered);
    assert_eq!(
        reg.expires_at(),
        Some(now + Duration::from_secs(300)),
        "requested expiry when none granted"
    );
    assert_eq!(reg.poll_timeout(), Some(now + Duration::from_secs(255)));
}

/// A refresh whose every copy is lost ends in a local 408 at Timer F; the
/// retry (after the 1 s backoff) and its first retransmissions still go
/// before the binding lapses, for expiries of 60, 120 and 3600 s.
#[test]
fn a_refresh_lost_until_timer_f_is_retried_before_expiry() {
    use msr_shared::refresh::TIMER_F;
    for e in [60u64, 120, 3600] {
        let (mut reg, t0, req) = start();
        reg.handle_response(t0, &reply(&req, 200, &[("Expires", &e.to_string())]));
        assert_eq!(reg.state(), RegistrationState::Registered);
        let expiry = t0 + Duration::from_secs(e);
        let refresh_at = reg.poll_timeout().expect("refresh scheduled");
        reg.handle_timeout(refresh_at);
        let refresh = reg.poll_transmit().expect("refresh");
        reg.handle_response(refresh_at + TIMER_F, &reply(&refresh, 408, &[]));
        let retry_at = reg.poll_timeout().expect("retry scheduled");
        reg.handle_timeout(retry_at);
        assert!(reg.poll_transmit().is_some(), "E = {e}: retry sent");
        assert!(
            retry_at + Duration::from_millis(7_500) <= expiry,
            "E = {e}: retry {:?} after the grant",
            retry_at - t0
        );
    }
}

#[test]
fn transport_failure_is_a_failure() {
    let (mut reg, t0, _) = start();
    reg.handle_failure(t0, "connection refused");
    assert_eq!(reg.state(), RegistrationState::Failed);
    assert_eq!(reg.poll_timeout(), Some(t0 + Duration::from_secs(1)));
}

#[test]
fn interval_too_brief_retries_with_min_expires() {
    let (mut reg, t0, req) = start();
    reg.handle_response(t0, &reply(&req, 423, &[("Min-Expires", "600")]));
    let retry = reg.poll_transmit().expect("retry");
    assert_eq!(h(&retry, "Expires"), "600");
    assert_eq!(h(&retry, "CSeq"), "2 REGISTER");
    // A 423 that does not raise the expiry is a failure, not a loop.
    reg.handle_response(t0, &reply(&retry, 423, &[("Min-Expires", "600")]));
    assert_eq!(reg.state(), RegistrationState::Failed);
}

#[test]
fn granted_expiry_prefers_our_contact_parameter() {
    let (mut reg, t0, req) = start();
    let contacts =
        "<sip:other@10.0.0.1:5060>;expires=10, <sip:msr_1@127.0.0.1:5070>;iface=lo;expires=120";
    reg.handle_response(
        t0,
        &reply(&req, 200, &[("Contact", contacts), ("Expires", "3600")]),
    );
    assert_eq!(reg.expires_at(), Some(t0 + Duration::from_secs(120)));
    assert_eq!(reg.poll_timeout(), Some(t0 + Duration::from_secs(75)));
}

#[test]
fn stale_responses_are_ignored() {
    let (mut reg, t0, req) = start();
    reg.handle_response(
        t0,
        &reply(
            &req,
            401,
            &[("WWW-Authenticate", r#"Digest realm="r", nonce="n""#)],
        ),
    );
    let _retry = reg.poll_transmit().expect("retry");
    // A late retransmission answer for CSeq 1 changes nothing.
    reg.handle_response(t0, &reply(&req, 500, &[]));
    assert_eq!(reg.state(), RegistrationState::Registering);
}

#[test]
fn unregister_sends_expires_zero_and_finishes() {
    let (mut reg, t0, req) = start();
    reg.handle_response(t0, &reply(&req, 200, &[("Expires", "60")]));
    reg.unregister(t0 + Duration::from_secs(5));
    let unreg = reg.poll_transmit().expect("unregister");
    assert_eq!(h(&unreg, "Expires"), "0");
    assert_eq!(h(&unreg, "CSeq"), "2 REGISTER");
    assert_eq!(h(&unreg, "Call-ID"), h(&req, "Call-ID"));
    assert_eq!(reg.state(), RegistrationState::Unregistering);
    assert!(!reg.is_finished());
    // Challenged: the credentials retry still says Expires: 0.
    reg.handle_response(
        t0,
        &reply(
            &unreg,
            401,
            &[("WWW-Authenticate", r#"Digest realm="r", nonce="n""#)],
        ),
    );
    let unreg2 = reg.poll_transmit().expect("unregister with credentials");
    assert_eq!(h(&unreg2, "Expires"), "0");
    reg.handle_response(t0, &reply(&unreg2, 200, &[]));
    assert!(reg.is_finished());
    assert_eq!(reg.state(), RegistrationState::Unregistered);
    assert_eq!(reg.poll_timeout(), None);
}

#[test]
fn refresh_delay_policy() {
    let secs = |s| Duration::from_secs(s);
    // 45 s (Timer F + 13 s) before expiry where the expiry allows it.
    assert_eq!(refresh_delay(60), secs(15));
    assert_eq!(refresh_delay(120), secs(75));
    assert_eq!(refresh_delay(300), secs(255));
    assert_eq!(refresh_delay(3600), secs(3555));
    assert_eq!(refresh_delay(30), Duration::from_millis(7_500));
    assert_eq!(refresh_delay(1), secs(1));
    assert_eq!(refresh_delay(0), secs(1));
}

#[test]
fn challenge_parsing() {
    let c = digest::Challenge::parse(r#"Digest realm="a, b", nonce="x", qop="auth-int""#)
        .expect("parsed");
    assert_eq!(c.realm, "a, b");
    assert_eq!(c.qop, Some(digest::Qop::AuthInt));
    assert!(digest::Challenge::parse(r#"Basic realm="x""#).is_none());
    assert!(
        digest::Challenge::parse(r#"Digest realm="x", nonce="n", algorithm=SHA-512-256"#).is_none()
    );
    assert!(digest::Challenge::parse(r#"Digest nonce="n""#).is_none());
}

/// The level of every `registration confirmed` line in `log`, in order.
fn confirmations(log: &Captured) -> Vec<&'static str> {
    log.text()
        .lines()
        .filter(|l| l.contains("registration confirmed"))
        .map(|l| {
            ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"]
                .into_iter()
                .find(|level| l.split_whitespace().any(|w| w == *level))
                .unwrap_or("?")
        })
        .collect()
}

/// `registration confirmed` is an info line when the account becomes
/// registered (first success, first after a failure) and a debug line for
/// routine refreshes, challenged ones included.
#[test]
fn only_the_first_confirmation_and_the_first_after_a_failure_are_info() {
    let log = Captured::default();
    log.during(|| {
        let (mut reg, t0, req) = start();
        reg.handle_response(t0, &reply(&req, 200, &[("Expires", "60")]));
        let mut now = t0;
        let mut refresh = |reg: &mut Registration, code: u16| {
            now = reg.poll_timeout().expect("a refresh is scheduled");
            reg.handle_timeout(now);
            let req = reg.poll_transmit().expect("refresh");
            reg.handle_response(now, &reply(&req, code, &[("Expires", "60")]));
        };
        refresh(&mut reg, 200);
        refresh(&mut reg, 200);
        // A refresh refused: the registration failed.
        refresh(&mut reg, 503);
        assert_eq!(reg.state(), RegistrationState::Failed);
        // The retry after the backoff succeeds: registered again.
        refresh(&mut reg, 200);
        assert_eq!(reg.state(), RegistrationState::Registered);
        refresh(&mut reg, 200);
    });
    assert_eq!(
        confirmations(&log),
        ["INFO", "DEBUG", "DEBUG", "INFO", "DEBUG"],
        "first, two refreshes, first after the failure, a refresh"
    );
}

#[test]
fn a_challenged_refresh_is_still_a_routine_confirmation() {
    let log = Captured::default();
    log.during(|| {
        let (mut reg, t0, req) = start();
        reg.handle_response(t0, &reply(&req, 200, &[("Expires", "60")]));
        let t1 = reg.poll_timeout().expect("refresh scheduled");
        reg.handle_timeout(t1);
        let refresh = reg.poll_transmit().expect("refresh");
        let challenge = r#"Digest realm="r", nonce="n1", qop="auth""#;
        reg.handle_response(
            t1,
            &reply(&refresh, 401, &[("WWW-Authenticate", challenge)]),
        );
        let retry = reg.poll_transmit().expect("refresh with credentials");
        assert_eq!(reg.state(), RegistrationState::Registered);
        reg.handle_response(t1, &reply(&retry, 200, &[("Expires", "60")]));
    });
    assert_eq!(confirmations(&log), ["INFO", "DEBUG"]);
}

/// A registrar answering every REGISTER with 401 and a fresh nonce (with or
/// without `stale=true`): per attempt the first challenge and one challenge
/// to credentials are answered, then the attempt fails and the next waits
/// the capped backoff. Over ten minutes of virtual time that is a few dozen
/// REGISTERs, not thousands per second.
#[test]
fn a_fresh_nonce_for_every_register_is_answered_once_then_backs_off() {
    for stale in [false, true] {
        let (mut reg, t0, mut req) = start();
        let mut now = t0;
        let mut sent = 1u32;
        let mut failures = Vec::new();
        let mut nonce = 0u32;
        let end = t0 + Duration::from_secs(600);
        while now < end {
            nonce += 1;
            let ch = format!(
                r#"Digest realm="r", nonce="n{nonce}", qop="auth"{}"#,
                if stale { ", stale=true" } else { "" }
            );
            reg.handle_response(now, &reply(&req, 401, &[("WWW-Authenticate", ch.as_str())]));
            if let Some(next) = reg.poll_transmit() {
                req = next;
                sent += 1;
                assert!(
                    sent < 1_000,
                    "stale={stale}: no backoff, {sent} REGISTERs at once"
                );
                continue;
            }
            assert_eq!(reg.state(), RegistrationState::Failed);
            let at = reg.poll_timeout().expect("retry scheduled");
            failures.push((at - now).as_secs());
            now = at;
            reg.handle_timeout(now);
            req = reg.poll_transmit().expect("next attempt");
            sent += 1;
        }
        assert_eq!(&failures[..7], [1, 2, 4, 8, 16, 32, 60], "stale={stale}");
        assert!(failures[7..].iter().all(|d| *d == 60));
        // At most three REGISTERs per attempt.
        assert!(
            sent <= 3 * (failures.len() as u32 + 1),
            "stale={stale}: {sent}"
        );
    }
}

/// A new nonce for credentials that were sent (the old nonce expired) is
/// answered: one retry, and a success resets the count.
#[test]
fn one_new_nonce_for_sent_credentials_is_answered() {
    let (mut reg, t0, req) = start();
    let ch1 = r#"Digest realm="r", nonce="n1", qop="auth""#;
    reg.handle_response(t0, &reply(&req, 401, &[("WWW-Authenticate", ch1)]));
    let retry = reg.poll_transmit().expect("credentials for n1");
    let ch2 = r#"Digest realm="r", nonce="n2", qop="auth""#;
    reg.handle_response(t0, &reply(&retry, 401, &[("WWW-Authenticate", ch2)]));
    let retry2 = reg.poll_transmit().expect("credentials for n2");
    assert_eq!(
        auth_param(h(&retry2, "Authorization"), "nonce").as_deref(),
        Some("n2")
    );
    reg.handle_response(t0, &reply(&retry2, 200, &[("Expires", "60")]));
    assert_eq!(reg.state(), RegistrationState::Registered);
    // The refresh's cached credentials meet a new nonce: answered again.
    let at = reg.poll_timeout().expect("refresh");
    reg.handle_timeout(at);
    let refresh = reg.poll_transmit().expect("refresh");
    let ch3 = r#"Digest realm="r", nonce="n3", qop="auth", stale=true"#;
    reg.handle_response(at, &reply(&refresh, 401, &[("WWW-Authenticate", ch3)]));
    assert!(reg.poll_transmit().is_some(), "one answer to the new nonce");
}

/// RFC 7616 §3.4: `nc` is 8 hex digits; the 10th use of a nonce is
/// `0000000a`, the 100th `00000064`, and each still verifies.
#[test]
fn nonce_count_is_hex_past_9_and_99() {
    let (mut reg, t0, req) = start();
    let ch = r#"Digest realm="r", nonce="n1", qop="auth""#;
    reg.handle_response(t0, &reply(&req, 401, &[("WWW-Authenticate", ch)]));
    let mut now = t0;
    let mut req = reg.poll_transmit().expect("retry");
    for use_ in 1..=120u32 {
        let auth = h(&req, "Authorization").to_owned();
        assert_eq!(
            auth_param(&auth, "nc"),
            Some(format!("{use_:08x}")),
            "use {use_}"
        );
        let creds = digest::Credentials::parse(&auth).expect("credentials");
        assert!(
            creds.verify(Algorithm::Md5, "secret", "REGISTER"),
            "use {use_}"
        );
        reg.handle_response(now, &reply(&req, 200, &[("Expires", "60")]));
        now = reg.poll_timeout().expect("refresh");
        reg.handle_timeout(now);
        req = reg.poll_transmit().expect("refresh");
    }
}

/// A refusal is logged with its status once: `reason=403 Forbidden`.
#[test]
fn a_refusal_is_logged_with_its_status_once() {
    let (mut reg, now, req) = start();
    let log = Captured::default();
    log.during(|| reg.handle_response(now, &reply(&req, 403, &[])));
    let text = log.text();
    assert!(
        text.contains("reason=403 Forbidden ") && !text.contains("403 403"),
        "{text}"
    );
}

/// A refresh still unanswered when the binding expires (a short expiry
/// beside Timer F, a registrar that went quiet): the account is no longer
/// registered (RFC 3261 §10.2.4), which is logged at warn, and no second
/// REGISTER goes while the first is in flight (§10.2). Its late 200 makes
/// the account registered again, confirmed at info.
#[test]
fn a_binding_that_expires_while_its_refresh_is_unanswered_is_no_longer_registered() {
    let log = Captured::default();
    log.during(|| {
        let (mut reg, t0, req) = start();
        reg.handle_response(t0, &reply(&req, 200, &[("Expires", "6")]));
        let refresh_at = reg.poll_timeout().expect("refresh scheduled");
        assert_eq!(refresh_at, t0 + Duration::from_millis(1_500));
        reg.handle_timeout(refresh_at);
        let refresh = reg.poll_transmit().expect("refresh");
        assert_eq!(
            reg.state(),
            RegistrationState::Registered,
            "a routine refresh"
        );
        let expiry = t0 + Duration::from_secs(6);
        assert_eq!(reg.poll_timeout(), Some(expiry), "woken at the expiry");
        reg.handle_timeout(expiry - Duration::from_millis(1));
        assert_eq!(reg.state(), RegistrationState::Registered);
        reg.handle_timeout(expiry);
        assert_eq!(reg.state(), RegistrationState::Registering);
        assert_eq!(reg.poll_timeout(), None, "nothing until the answer");
        assert!(
            reg.poll_transmit().is_none(),
            "no second REGISTER in flight"
        );
        reg.handle_response(
            expiry + Duration::from_secs(1),
            &reply(&refresh, 200, &[("Expires", "6")]),
        );
        assert_eq!(reg.state(), RegistrationState::Registered);
    });
    assert!(
        log.text()
            .lines()
            .any(|l| l.contains("WARN") && l.contains("registration lapsed")),
        "{}",
        log.text()
    );
    assert_eq!(confirmations(&log), ["INFO", "INFO"], "{}", log.text());
}
