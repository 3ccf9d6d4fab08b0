use super::auth::MAX_NONCES;
use super::*;
use msr_shared::sip::digest;
use msr_shared::sip::transaction::server::TIMER_J;
use rsipstack::dialog::authenticate::compute_digest;
use rsipstack::sip::headers::auth::{Algorithm, AuthQop};
use rsipstack::sip::Method;

use crate::config::parse;

const REALM: &str = "msr.local";

fn registrar() -> Registrar {
    let c = parse(
        "[sip]\nrealm = \"msr.local\"\nnonce_ttl_secs = 300\n[[accounts]]\nauth_name = \"msr\"\npassword = \"msr-secret\"\n",
        "t",
    )
    .expect("config");
    Registrar::new(&c.sip, &c.accounts)
}

struct Reg<'a> {
    msr: &'a str,
    /// `reg-{msr}` unless set (a restarted agent has another).
    call_id: Option<&'a str>,
    contacts: Vec<String>,
    expires: Option<&'a str>,
    cseq: u32,
    auth: Option<String>,
    /// The top `Via` branch; a new one for each build unless set (the
    /// same one makes a retransmission).
    branch: Option<String>,
}

/// CSeq numbers that grow across every REGISTER the tests build, as one
/// agent's do (RFC 3261 §10.2: one Call-ID, increasing CSeq), so a test's
/// later REGISTER is never taken for an old one.
fn next_cseq() -> u32 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    NEXT.fetch_add(16, std::sync::atomic::Ordering::Relaxed)
}

impl<'a> Reg<'a> {
    fn new(msr: &'a str) -> Self {
        Reg {
            msr,
            call_id: None,
            contacts: vec![format!("<sip:{msr}@127.0.0.1:5070>;iface=lo")],
            expires: Some("60"),
            cseq: next_cseq(),
            auth: None,
            branch: None,
        }
    }

    fn build(&self) -> Request {
        let mut t = format!(
            "REGISTER sip:127.0.0.1:5060 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5070;branch={}\r\n\
             From: <sip:{m}@127.0.0.1:5060>;tag=f1\r\nTo: <sip:{m}@127.0.0.1:5060>\r\nCall-ID: {call_id}\r\n\
             CSeq: {} REGISTER\r\nUser-Agent: msr-agent/0.1.0\r\n",
            self.branch
                .clone()
                .unwrap_or_else(|| format!("z9hG4bK{}", next_cseq())),
            self.cseq,
            m = self.msr,
            call_id = self
                .call_id
                .map_or_else(|| format!("reg-{}", self.msr), str::to_owned),
        );
        for c in &self.contacts {
            t.push_str(&format!("Contact: {c}\r\n"));
        }
        if let Some(e) = self.expires {
            t.push_str(&format!("Expires: {e}\r\n"));
        }
        if let Some(a) = &self.auth {
            t.push_str(&format!("Authorization: {a}\r\n"));
        }
        t.push_str("Content-Length: 0\r\n\r\n");
        Request::try_from(t.as_str()).expect("valid request")
    }
}

fn challenges(resp: &Response) -> Vec<String> {
    sip::header_all(&resp.headers, "WWW-Authenticate")
        .into_iter()
        .map(str::to_owned)
        .collect()
}

fn nonce_of(challenge: &str) -> String {
    digest::digest_param(challenge, "nonce").expect("nonce")
}

fn authorization(
    user: &str,
    password: &str,
    nonce: &str,
    algorithm: Algorithm,
    token: &str,
) -> String {
    let uri = "sip:127.0.0.1:5060";
    let qop = AuthQop::Auth {
        cnonce: "c0ffee".into(),
        nc: 1,
    };
    let response = compute_digest(
        user,
        password,
        REALM,
        nonce,
        &Method::Register,
        uri,
        algorithm,
        Some(&qop),
    );
    format!(
        "Digest username=\"{user}\", realm=\"{REALM}\", nonce=\"{nonce}\", uri=\"{uri}\", response=\"{response}\", \
         algorithm={token}, qop=auth, nc=00000001, cnonce=\"c0ffee\""
    )
}

/// Sends `reg` unauthenticated, answers the MD5 challenge, returns the final response.
fn register(r: &mut Registrar, now: Instant, mut reg: Reg<'_>) -> Response {
    let first = r.handle_register(now, &reg.build(), None);
    assert_eq!(first.status_code, StatusCode::Unauthorized);
    let nonce = nonce_of(&challenges(&first)[0]);
    reg.cseq += 1;
    reg.auth = Some(authorization(
        "msr",
        "msr-secret",
        &nonce,
        Algorithm::Md5,
        "MD5",
    ));
    r.handle_register(now, &reg.build(), None)
}

fn events(r: &mut Registrar) -> Vec<RegistrarEvent> {
    std::iter::from_fn(|| r.poll_event()).collect()
}

#[test]
fn challenge_offers_sha256_then_md5_with_qop_auth() {
    let mut r = registrar();
    let resp = r.handle_register(Instant::now(), &Reg::new("msr_1").build(), None);
    assert_eq!(resp.status_code, StatusCode::Unauthorized);
    let c = challenges(&resp);
    assert_eq!(c.len(), 2);
    assert!(
        c[0].contains("algorithm=SHA-256") && c[1].contains("algorithm=MD5"),
        "{c:?}"
    );
    for h in &c {
        assert!(
            h.contains("realm=\"msr.local\"") && h.contains("qop=\"auth\"") && !h.contains("stale"),
            "{h}"
        );
    }
    assert!(r.bindings().next().is_none());
}

#[test]
fn md5_registration_adds_a_named_contact_with_version() {
    let mut r = registrar();
    let now = Instant::now();
    let resp = register(&mut r, now, Reg::new("msr_1"));
    assert_eq!(resp.status_code, StatusCode::OK);
    let contacts = sip::header_all(&resp.headers, "Contact");
    assert_eq!(
        contacts,
        vec!["<sip:msr_1@127.0.0.1:5070>;iface=lo;expires=60"]
    );
    let ev = events(&mut r);
    assert_eq!(ev.len(), 1);
    let RegistrarEvent::BindingAdded(b) = &ev[0] else {
        panic!("{ev:?}")
    };
    assert_eq!(b.contact, "lo@msr_1");
    assert_eq!(b.msr, "msr_1");
    assert_eq!(b.uri, "sip:msr_1@127.0.0.1:5070");
    assert_eq!(b.version.as_deref(), Some("0.1.0"));
    assert_eq!(b.expires_at, now + Duration::from_secs(60));
    assert_eq!(r.poll_timeout(), Some(now + Duration::from_secs(60)));
}

#[test]
fn sha256_registration_is_accepted() {
    let mut r = registrar();
    let now = Instant::now();
    let mut reg = Reg::new("msr_1");
    let nonce = nonce_of(&challenges(&r.handle_register(now, &reg.build(), None))[0]);
    reg.auth = Some(authorization(
        "msr",
        "msr-secret",
        &nonce,
        Algorithm::Sha256,
        "SHA-256",
    ));
    assert_eq!(
        r.handle_register(now, &reg.build(), None).status_code,
        StatusCode::OK
    );
}

#[test]
fn wrong_password_or_unknown_user_gets_403_and_registers_nothing() {
    let mut r = registrar();
    let now = Instant::now();
    for (user, password) in [("msr", "wrong"), ("nobody", "msr-secret")] {
        let mut reg = Reg::new("msr_1");
        let nonce = nonce_of(&challenges(&r.handle_register(now, &reg.build(), None))[1]);
        reg.auth = Some(authorization(user, password, &nonce, Algorithm::Md5, "MD5"));
        assert_eq!(
            r.handle_register(now, &reg.build(), None).status_code,
            StatusCode::Forbidden
        );
    }
    assert!(r.bindings().next().is_none());
    assert!(events(&mut r).is_empty());
}

#[test]
fn an_expired_nonce_gets_a_stale_challenge() {
    let mut r = registrar();
    let t0 = Instant::now();
    let mut reg = Reg::new("msr_1");
    let nonce = nonce_of(&challenges(&r.handle_register(t0, &reg.build(), None))[1]);
    reg.auth = Some(authorization(
        "msr",
        "msr-secret",
        &nonce,
        Algorithm::Md5,
        "MD5",
    ));
    // Still valid just before the TTL …
    assert_eq!(
        r.handle_register(t0 + Duration::from_secs(299), &reg.build(), None)
            .status_code,
        StatusCode::OK
    );
    // … stale after it, and also long after it was forgotten.
    for later in [301, 5000] {
        let resp = r.handle_register(t0 + Duration::from_secs(later), &reg.build(), None);
        assert_eq!(resp.status_code, StatusCode::Unauthorized);
        assert!(
            challenges(&resp).iter().all(|c| c.contains("stale=true")),
            "{later}"
        );
    }
}

#[test]
fn too_brief_gets_423_and_long_is_capped() {
    let mut r = registrar();
    let now = Instant::now();
    let mut reg = Reg::new("msr_1");
    reg.expires = Some("5");
    let resp = register(&mut r, now, reg);
    assert_eq!(resp.status_code, StatusCode::IntervalTooBrief);
    assert_eq!(sip::header(&resp.headers, "Min-Expires"), Some("10"));
    assert!(r.bindings().next().is_none());

    let mut reg = Reg::new("msr_1");
    reg.expires = Some("7200");
    let resp = register(&mut r, now, reg);
    assert_eq!(resp.status_code, StatusCode::OK);
    assert!(sip::header(&resp.headers, "Contact")
        .expect("contact")
        .ends_with(";expires=3600"));
}

#[test]
fn two_interfaces_then_expires_zero_then_wildcard() {
    let mut r = registrar();
    let now = Instant::now();
    let mut reg = Reg::new("msr_1");
    reg.contacts = vec![
        "<sip:msr_1@127.0.0.1:5070>;iface=lo".into(),
        "<sip:msr_1@10.0.0.1:5070>;iface=bond1.2".into(),
    ];
    assert_eq!(register(&mut r, now, reg).status_code, StatusCode::OK);
    let names: Vec<&str> = r
        .contacts_of("msr_1")
        .iter()
        .map(|b| b.contact.as_str())
        .collect();
    assert_eq!(names, vec!["bond1.2@msr_1", "lo@msr_1"]);
    events(&mut r);

    let mut reg = Reg::new("msr_1");
    reg.contacts = vec!["<sip:msr_1@10.0.0.1:5070>;iface=bond1.2;expires=0".into()];
    let resp = register(&mut r, now, reg);
    assert_eq!(resp.status_code, StatusCode::OK);
    assert_eq!(sip::header_all(&resp.headers, "Contact").len(), 1);
    assert!(
        matches!(&events(&mut r)[..], [RegistrarEvent::BindingRemoved { cause: RemovalCause::Unregistered, binding }] if binding.contact == "bond1.2@msr_1")
    );

    let mut reg = Reg::new("msr_1");
    reg.contacts = vec!["*".into()];
    reg.expires = Some("0");
    assert_eq!(register(&mut r, now, reg).status_code, StatusCode::OK);
    assert!(!r.is_registered("msr_1"));
    assert_eq!(events(&mut r).len(), 1);
    r.check_expiries();
    assert_eq!(r.poll_timeout(), None);
}

#[test]
fn refresh_is_reported_and_lapse_removes_the_binding() {
    let mut r = registrar();
    let t0 = Instant::now();
    register(&mut r, t0, Reg::new("msr_1"));
    let t1 = t0 + Duration::from_secs(30);
    register(&mut r, t1, Reg::new("msr_1"));
    let ev = events(&mut r);
    assert!(
        matches!(ev[1], RegistrarEvent::BindingRefreshed(_)),
        "{ev:?}"
    );
    r.handle_timeout(t1 + Duration::from_secs(59));
    assert!(r.is_registered("msr_1"));
    r.handle_timeout(t1 + Duration::from_secs(60));
    assert!(!r.is_registered("msr_1"));
    assert!(matches!(
        &events(&mut r)[..],
        [RegistrarEvent::BindingRemoved {
            cause: RemovalCause::Lapsed,
            ..
        }]
    ));
    assert_eq!(r.poll_timeout(), None);
}

/// RFC 3261 §10.2.3: a REGISTER without Contact asks for the bindings.
/// It is challenged like any other first (RFC 4475 §3.3.7 regaut01: an
/// `Authorization` of an unknown scheme is no credential), then answered
/// 200 with the bindings, which it leaves as they are.
#[test]
fn a_register_without_contact_is_challenged_then_lists_the_bindings() {
    let mut r = registrar();
    let now = Instant::now();
    register(&mut r, now, Reg::new("msr_1"));
    events(&mut r);
    let mut query = Reg::new("msr_1");
    query.contacts.clear();
    let mut unknown_scheme = query.build();
    sip::push_header(
        &mut unknown_scheme.headers,
        "Authorization",
        "NoOneKnowsThisScheme opaque-data=here",
    );
    assert_eq!(
        r.handle_register(now, &unknown_scheme, None).status_code,
        StatusCode::Unauthorized
    );
    let answer = register(&mut r, now, query);
    assert_eq!(answer.status_code, StatusCode::OK);
    let contacts = sip::header_all(&answer.headers, "Contact");
    assert_eq!(contacts.len(), 1, "{contacts:?}");
    assert!(contacts[0].contains("expires=60"), "{contacts:?}");
    assert!(events(&mut r).is_empty(), "a query changes nothing");
    assert!(r.is_registered("msr_1"));
}

#[test]
fn malformed_registers_get_400_never_a_panic() {
    let mut r = registrar();
    let now = Instant::now();
    let mut bad_expires = Reg::new("msr_1");
    bad_expires.expires = Some("soon");
    let mut bad_contact = Reg::new("msr_1");
    bad_contact.contacts = vec!["<mailto:x@y>".into()];
    let mut bad_wildcard = Reg::new("msr_1");
    bad_wildcard.contacts = vec!["*".into()];
    assert_eq!(
        r.handle_register(now, &bad_expires.build(), None)
            .status_code,
        StatusCode::BadRequest
    );
    for reg in [bad_contact, bad_wildcard] {
        assert_eq!(
            register(&mut r, now, reg).status_code,
            StatusCode::BadRequest
        );
    }
    let no_user = Request::try_from(
        "REGISTER sip:127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 1.2.3.4;branch=z9hG4bKx\r\nFrom: <sip:127.0.0.1>;tag=1\r\n\
         To: <sip:127.0.0.1>\r\nCall-ID: x\r\nCSeq: 1 REGISTER\r\nContact: <sip:a@1.2.3.4>\r\nContent-Length: 0\r\n\r\n",
    )
    .expect("parse");
    assert_eq!(
        r.handle_register(now, &no_user, None).status_code,
        StatusCode::BadRequest
    );
    let mut garbage_auth = Reg::new("msr_1");
    garbage_auth.auth = Some("Digest realm=\"msr.local\", junk".into());
    assert_eq!(
        r.handle_register(now, &garbage_auth.build(), None)
            .status_code,
        StatusCode::BadRequest
    );
    assert!(r.bindings().next().is_none());
}

/// A contact at an address nothing can be sent to is refused: the
/// collector would subscribe and send keepalives there (SPEC §3), and
/// the accounts are shared by every MSR.
#[test]
fn a_contact_at_an_unusable_address_gets_400_naming_it() {
    let mut r = registrar();
    let now = Instant::now();
    for (contact, why) in [
        ("<sip:msr_1@0.0.0.0:5060>", "the unspecified address"),
        ("<sip:msr_1@224.0.0.1:1234>", "a multicast address"),
        ("<sip:msr_1@255.255.255.255:5060>", "the broadcast address"),
        ("<sip:msr_1@127.0.0.1:0>", "port 0"),
        ("<sip:msr_1@[::]:5060>", "the unspecified address"),
        ("<sip:msr_1@[ff02::1]:5060>", "a multicast address"),
    ] {
        let mut reg = Reg::new("msr_1");
        reg.contacts = vec![contact.into()];
        let resp = register(&mut r, now, reg);
        assert_eq!(resp.status_code, StatusCode::BadRequest, "{contact}");
        let text = warning_of(&resp).unwrap_or_default();
        assert!(text.contains(why), "{contact}: {text}");
    }
    assert!(r.bindings().next().is_none());
    // A usable address, and a name, register.
    for contact in ["<sip:msr_1@127.0.0.1:5060>", "<sip:msr_1@media.local:5060>"] {
        let mut reg = Reg::new("msr_1");
        reg.contacts = vec![contact.into()];
        assert_eq!(
            register(&mut r, now, reg).status_code,
            StatusCode::OK,
            "{contact}"
        );
    }
}

#[test]
fn version_parsing() {
    assert_eq!(agent_version("msr-agent/0.1.0").as_deref(), Some("0.1.0"));
    assert_eq!(
        agent_version("msr-agent/1.2 (linux)").as_deref(),
        Some("1.2")
    );
    assert_eq!(agent_version("sipp"), None);
}

#[test]
fn poll_timeout_with_many_bindings_returns_the_earliest_and_only_due_ones_lapse() {
    let mut r = registrar();
    let t0 = Instant::now();
    let names: Vec<String> = (0..40).map(|i| format!("msr_{i:02}")).collect();
    // Registered in reverse name order, expiries 60..=99 s in a scrambled order.
    for (i, msr) in names.iter().enumerate().rev() {
        let mut reg = Reg::new(msr);
        let secs = (60 + (i * 17) % 40).to_string();
        reg.expires = Some(&secs);
        if i % 4 == 0 {
            reg.contacts
                .push(format!("<sip:{msr}@10.0.0.1:5070>;iface=eth0"));
        }
        assert_eq!(register(&mut r, t0, reg).status_code, StatusCode::OK);
        r.check_expiries();
    }
    events(&mut r);
    assert_eq!(r.poll_timeout(), r.bindings().map(|b| b.expires_at).min());
    assert_eq!(r.poll_timeout(), Some(t0 + Duration::from_secs(60)));

    // Refresh one (moves its expiry), unregister one contact, rename one.
    let t1 = t0 + Duration::from_secs(10);
    assert_eq!(
        register(&mut r, t1, Reg::new("msr_00")).status_code,
        StatusCode::OK
    );
    r.check_expiries();
    let mut off = Reg::new("msr_04");
    off.contacts = vec!["<sip:msr_04@10.0.0.1:5070>;iface=eth0;expires=0".into()];
    assert_eq!(register(&mut r, t1, off).status_code, StatusCode::OK);
    r.check_expiries();
    let mut renamed = Reg::new("msr_08");
    renamed.contacts = vec!["<sip:msr_08@127.0.0.1:5070>;iface=lo2".into()];
    assert_eq!(register(&mut r, t1, renamed).status_code, StatusCode::OK);
    r.check_expiries();
    events(&mut r);

    // Step through every deadline: each lapses exactly the bindings due then.
    while let Some(at) = r.poll_timeout() {
        let due: Vec<ContactName> = r
            .bindings()
            .filter(|b| b.expires_at <= at)
            .map(|b| b.contact.clone())
            .collect();
        assert!(!due.is_empty());
        r.handle_timeout(at);
        let lapsed: Vec<ContactName> = events(&mut r)
            .into_iter()
            .map(|e| match e {
                RegistrarEvent::BindingRemoved {
                    binding,
                    cause: RemovalCause::Lapsed,
                } => binding.contact,
                other => panic!("{other:?}"),
            })
            .collect();
        let (mut due, mut lapsed) = (due, lapsed);
        due.sort();
        lapsed.sort();
        assert_eq!(lapsed, due);
        r.check_expiries();
        assert!(r.bindings().all(|b| b.expires_at > at));
    }
    assert_eq!(r.bindings().count(), 0);
    assert!(names.iter().all(|m| !r.is_registered(m)));
}

/// An MD5 `Authorization` with a given nonce count and digest uri.
fn authorization_with(nonce: &str, nc: u8, uri: &str) -> String {
    let qop = AuthQop::Auth {
        cnonce: "c0ffee".into(),
        nc,
    };
    let response = compute_digest(
        "msr",
        "msr-secret",
        REALM,
        nonce,
        &Method::Register,
        uri,
        Algorithm::Md5,
        Some(&qop),
    );
    format!(
        "Digest username=\"msr\", realm=\"{REALM}\", nonce=\"{nonce}\", uri=\"{uri}\", response=\"{response}\", \
         algorithm=MD5, qop=auth, nc={nc:08}, cnonce=\"c0ffee\""
    )
}

#[test]
fn a_replayed_nonce_count_is_challenged_and_a_higher_one_accepted() {
    let mut r = registrar();
    let now = Instant::now();
    let mut reg = Reg::new("msr_1");
    let nonce = nonce_of(&challenges(&r.handle_register(now, &reg.build(), None))[1]);
    reg.auth = Some(authorization_with(&nonce, 1, "sip:127.0.0.1:5060"));
    assert_eq!(
        r.handle_register(now, &reg.build(), None).status_code,
        StatusCode::OK
    );
    // The same credentials again (a captured REGISTER replayed, here for
    // another AOR): a fresh challenge, nothing registered.
    let mut replay = Reg::new("msr_evil");
    replay.auth = reg.auth.clone();
    let resp = r.handle_register(now, &replay.build(), None);
    assert_eq!(resp.status_code, StatusCode::Unauthorized);
    assert!(challenges(&resp).iter().all(|c| c.contains("stale=true")));
    assert!(!r.is_registered("msr_evil"));
    // The agent's refresh: same nonce, next count.
    reg.cseq += 1;
    reg.auth = Some(authorization_with(&nonce, 2, "sip:127.0.0.1:5060"));
    assert_eq!(
        r.handle_register(now, &reg.build(), None).status_code,
        StatusCode::OK
    );
}

#[test]
fn a_digest_uri_other_than_the_request_uri_is_a_bad_request() {
    let mut r = registrar();
    let now = Instant::now();
    let mut reg = Reg::new("msr_1");
    let nonce = nonce_of(&challenges(&r.handle_register(now, &reg.build(), None))[1]);
    reg.auth = Some(authorization_with(&nonce, 1, "sip:evil.example"));
    assert_eq!(
        r.handle_register(now, &reg.build(), None).status_code,
        StatusCode::BadRequest
    );
    assert!(!r.is_registered("msr_1"));
}

#[test]
fn an_unsupported_algorithm_is_challenged_again() {
    let mut r = registrar();
    let now = Instant::now();
    let mut reg = Reg::new("msr_1");
    let nonce = nonce_of(&challenges(&r.handle_register(now, &reg.build(), None))[1]);
    reg.auth = Some(
        authorization_with(&nonce, 1, "sip:127.0.0.1:5060")
            .replace("algorithm=MD5", "algorithm=SHA-512"),
    );
    let resp = r.handle_register(now, &reg.build(), None);
    assert_eq!(resp.status_code, StatusCode::Unauthorized);
    assert!(challenges(&resp).iter().all(|c| !c.contains("stale=true")));
}

#[test]
fn an_account_limited_to_some_msrs_cannot_register_others() {
    let c = parse(
        "[sip]\nrealm = \"msr.local\"\n[[accounts]]\nauth_name = \"msr\"\npassword = \"msr-secret\"\nmsrs = [\"msr_1\"]\n",
        "t",
    )
    .expect("config");
    let mut r = Registrar::new(&c.sip, &c.accounts);
    let now = Instant::now();
    assert_eq!(
        register(&mut r, now, Reg::new("msr_1")).status_code,
        StatusCode::OK
    );
    assert_eq!(
        register(&mut r, now, Reg::new("msr_2")).status_code,
        StatusCode::Forbidden
    );
    assert!(!r.is_registered("msr_2"));
}

#[test]
fn nonces_are_bounded_and_forgotten_oldest_first() {
    let mut r = registrar();
    let t0 = Instant::now();
    let first = nonce_of(&challenges(&r.handle_register(t0, &Reg::new("msr_1").build(), None))[1]);
    for i in 0..MAX_NONCES {
        let _ = r.handle_register(
            t0 + Duration::from_millis(i as u64 % 1000),
            &Reg::new("msr_x").build(),
            None,
        );
    }
    assert_eq!(r.nonces.len(), MAX_NONCES);
    assert!(
        !r.nonces.contains_key(&first),
        "the oldest nonce was evicted"
    );
    // Two TTLs later every nonce is purged by the next request.
    let _ = r.handle_register(
        t0 + Duration::from_secs(601),
        &Reg::new("msr_1").build(),
        None,
    );
    assert_eq!(r.nonces.len(), 1);
    assert_eq!(r.nonce_order.len(), 1);
}

fn refusals(r: &mut Registrar) -> Vec<RefusalLog> {
    std::iter::from_fn(|| r.poll_refusal()).collect()
}

/// A REGISTER for `msr` answering a fresh challenge with `user`/`password`.
fn refused(r: &mut Registrar, now: Instant, msr: &str, user: &str, password: &str) -> Response {
    let mut reg = Reg::new(msr);
    let nonce = nonce_of(&challenges(&r.handle_register(now, &reg.build(), None))[1]);
    reg.cseq += 1;
    reg.auth = Some(authorization(user, password, &nonce, Algorithm::Md5, "MD5"));
    let source = "192.0.2.7:5070".parse().ok();
    r.handle_register(now, &reg.build(), source)
}

fn expected(msr: &str, user: &str, reason: RefusalReason, status: StatusCode) -> Refusal {
    Refusal {
        msr: Some(msr.into()),
        auth_name: Some(user.into()),
        reason,
        status,
        source: "192.0.2.7:5070".parse().ok(),
        suppressed: 0,
    }
}

#[test]
fn refused_credentials_and_msr_names_are_reported_with_what_an_operator_needs() {
    let c = parse(
        "[sip]\nrealm = \"msr.local\"\n[[accounts]]\nauth_name = \"msr\"\npassword = \"msr-secret\"\nmsrs = [\"msr_1\"]\n",
        "t",
    )
    .expect("config");
    let mut r = Registrar::new(&c.sip, &c.accounts);
    let now = Instant::now();
    let cases = [
        ("msr_1", "msr", "wrong", RefusalReason::WrongPassword),
        (
            "msr_1",
            "nobody",
            "msr-secret",
            RefusalReason::UnknownAuthName,
        ),
        ("msr_2", "msr2", "x", RefusalReason::UnknownAuthName),
    ];
    for (msr, user, password, reason) in cases {
        let resp = refused(&mut r, now, msr, user, password);
        assert_eq!(resp.status_code, StatusCode::Forbidden);
        assert_eq!(
            refusals(&mut r),
            vec![RefusalLog::Line(expected(
                msr,
                user,
                reason,
                StatusCode::Forbidden
            ))]
        );
    }
    // The right password for an MSR the account may not register (a
    // window later: the username `msr` was just reported).
    r.handle_timeout(now + REFUSAL_WINDOW);
    assert!(refusals(&mut r).is_empty());
    let now = now + REFUSAL_WINDOW;
    assert_eq!(
        register(&mut r, now, Reg::new("msr_9")).status_code,
        StatusCode::Forbidden
    );
    let logs = refusals(&mut r);
    assert_eq!(
        logs,
        vec![{
            let mut e = expected(
                "msr_9",
                "msr",
                RefusalReason::MsrNotAllowed,
                StatusCode::Forbidden,
            );
            e.source = None;
            RefusalLog::Line(e)
        }]
    );
}

#[test]
fn challenges_stale_nonces_and_successes_are_not_refusals() {
    let mut r = registrar();
    let t0 = Instant::now();
    // Plain challenge, then success.
    assert_eq!(
        register(&mut r, t0, Reg::new("msr_1")).status_code,
        StatusCode::OK
    );
    // A stale nonce, a replayed count, an algorithm not offered: challenges.
    let mut reg = Reg::new("msr_1");
    let nonce = nonce_of(&challenges(&r.handle_register(t0, &reg.build(), None))[1]);
    reg.auth = Some(authorization_with(&nonce, 1, "sip:127.0.0.1:5060"));
    assert_eq!(
        r.handle_register(t0, &reg.build(), None).status_code,
        StatusCode::OK
    );
    assert_eq!(
        r.handle_register(t0, &reg.build(), None).status_code,
        StatusCode::Unauthorized
    );
    let late = t0 + Duration::from_secs(400);
    reg.auth = Some(authorization_with(&nonce, 2, "sip:127.0.0.1:5060"));
    assert_eq!(
        r.handle_register(late, &reg.build(), None).status_code,
        StatusCode::Unauthorized
    );
    reg.auth = Some(
        authorization_with(&nonce, 3, "sip:127.0.0.1:5060")
            .replace("algorithm=MD5", "algorithm=SHA-512"),
    );
    assert_eq!(
        r.handle_register(late, &reg.build(), None).status_code,
        StatusCode::Unauthorized
    );
    // 423 is negotiated (the agent retries with Min-Expires): not a refusal.
    let mut brief = Reg::new("msr_1");
    brief.expires = Some("5");
    assert_eq!(
        register(&mut r, late, brief).status_code,
        StatusCode::IntervalTooBrief
    );
    assert!(refusals(&mut r).is_empty());
    // Only the binding's expiry is a deadline.
    assert_eq!(r.poll_timeout(), Some(t0 + Duration::from_secs(60)));
}

#[test]
fn malformed_registers_are_reported_with_the_detail() {
    let mut r = registrar();
    let now = Instant::now();
    let mut bad_expires = Reg::new("msr_1");
    bad_expires.expires = Some("soon");
    assert_eq!(
        r.handle_register(now, &bad_expires.build(), None)
            .status_code,
        StatusCode::BadRequest
    );
    let mut other_uri = Reg::new("msr_2");
    let nonce = nonce_of(&challenges(&r.handle_register(now, &other_uri.build(), None))[1]);
    other_uri.auth = Some(authorization_with(&nonce, 1, "sip:evil.example"));
    assert_eq!(
        r.handle_register(now, &other_uri.build(), None).status_code,
        StatusCode::BadRequest
    );
    let logs = refusals(&mut r);
    let [RefusalLog::Line(a), RefusalLog::Line(b)] = &logs[..] else {
        panic!("{logs:?}")
    };
    assert_eq!(
        (a.msr.as_deref(), a.auth_name.as_deref(), a.reason.detail()),
        (Some("msr_1"), None, Some("bad expires value `soon`"))
    );
    assert_eq!(a.status, StatusCode::BadRequest);
    assert_eq!(
        (b.msr.as_deref(), b.auth_name.as_deref(), b.reason.detail()),
        (
            Some("msr_2"),
            Some("msr"),
            Some("digest uri does not match the request-uri")
        )
    );
}

/// An agent with a wrong password retrying, and an attacker with a new
/// username in every REGISTER: a bounded number of lines, on test time.
#[test]
fn refusal_lines_are_rate_limited_on_the_given_time() {
    let mut r = registrar();
    let t0 = Instant::now();
    for s in 0..10 {
        refused(&mut r, t0 + Duration::from_secs(s), "msr_1", "msr", "wrong");
    }
    assert_eq!(refusals(&mut r).len(), 1);
    assert_eq!(r.poll_timeout(), Some(t0 + REFUSAL_WINDOW));
    r.handle_timeout(t0 + REFUSAL_WINDOW);
    let logs = refusals(&mut r);
    assert!(
        matches!(&logs[..], [RefusalLog::Line(x)] if x.suppressed == 8 && x.reason == RefusalReason::WrongPassword),
        "{logs:?}"
    );
    // A quiet window later the key is forgotten and nothing is pending.
    r.handle_timeout(t0 + REFUSAL_WINDOW * 2);
    assert!(refusals(&mut r).is_empty());
    assert_eq!(r.poll_timeout(), None);

    let t1 = t0 + REFUSAL_WINDOW * 3;
    let total = 3_000u64;
    let mut lines = 0;
    let mut counted = 0;
    for i in 0..total {
        refused(&mut r, t1, "msr_1", &format!("guess{i}"), "x");
        for log in refusals(&mut r) {
            match log {
                RefusalLog::Line(x) => {
                    lines += 1;
                    counted += 1 + x.suppressed;
                }
                RefusalLog::Unlogged { count } => counted += count,
            }
        }
    }
    assert_eq!(lines, u64::from(MAX_REFUSAL_LINES_PER_WINDOW));
    r.handle_timeout(t1 + REFUSAL_WINDOW);
    let logs = refusals(&mut r);
    assert_eq!(
        logs,
        vec![RefusalLog::Unlogged {
            count: total - u64::from(MAX_REFUSAL_LINES_PER_WINDOW)
        }]
    );
    counted += total - u64::from(MAX_REFUSAL_LINES_PER_WINDOW);
    assert_eq!(counted, total);
    assert_eq!(r.poll_timeout(), None);
    assert!(r.bindings().next().is_none());
}

/// What the adversarial tester registered: each is refused with `400` and
/// the rule broken, registers nothing, and is reported for the log.
#[test]
fn names_the_operator_would_refuse_get_400_with_the_rule() {
    let now = Instant::now();
    let long_msr = "m".repeat(140);
    let mut r = registrar();
    // Refused before any challenge: the To user is no msr name.
    let resp = r.handle_register(now, &Reg::new(&long_msr).build(), None);
    assert_eq!(resp.status_code, StatusCode::BadRequest);
    assert_eq!(
        warning_of(&resp).as_deref(),
        Some("Bad Request (bad msr name: 140 bytes, more than 128)")
    );
    let logs = refusals(&mut r);
    let [RefusalLog::Line(refusal)] = &logs[..] else {
        panic!("{logs:?}")
    };
    assert_eq!(
        refusal.reason.detail(),
        Some("bad msr name: 140 bytes, more than 128")
    );
    let long_iface = format!("<sip:evil3@127.0.0.1:5070>;iface={}", "i".repeat(150));
    let cases = [
        ("evil3", long_iface, "bad iface: 150 bytes, more than 64"),
        (
            "evil4",
            "<sip:evil4@127.0.0.1:5070>;iface=\"a b\"".to_owned(),
            "bad iface: character U+0020 (whitespace) is not allowed",
        ),
        (
            "evil5",
            "<sip:evil5@127.0.0.1:5070>;iface=x@y".to_owned(),
            "bad iface: character `@` (U+0040) is not allowed",
        ),
        (
            "evil6",
            "<sip:evil6@127.0.0.1:5070>;iface=a\u{200B}b".to_owned(),
            "bad iface: character U+200B (invisible) is not allowed",
        ),
    ];
    for (msr, contact, detail) in cases {
        let mut r = registrar();
        let mut reg = Reg::new(msr);
        reg.contacts = vec![contact.clone()];
        let resp = register(&mut r, now, reg);
        assert_eq!(resp.status_code, StatusCode::BadRequest, "{contact}");
        assert_eq!(
            warning_of(&resp),
            Some(format!("Bad Request ({detail})")),
            "{contact}"
        );
        assert!(r.bindings().next().is_none(), "{contact}");
        assert!(events(&mut r).is_empty(), "{contact}");
        let logs = refusals(&mut r);
        let [RefusalLog::Line(refusal)] = &logs[..] else {
            panic!("{logs:?}")
        };
        assert_eq!(
            (refusal.msr.as_deref(), refusal.reason.detail()),
            (Some(msr), Some(detail))
        );
        assert_eq!(refusal.status, StatusCode::BadRequest);
    }
}

/// Whatever registers can be named by the operator: its MSR and contact
/// names pass the operator's rules.
#[test]
fn every_registered_name_is_one_the_operator_accepts() {
    let mut r = registrar();
    let now = Instant::now();
    let longest_msr = "m".repeat(crate::operator::names::MAX_MSR_NAME_LEN);
    let longest_iface = "i".repeat(crate::operator::names::MAX_INTERFACE_NAME_LEN);
    let mut reg = Reg::new(&longest_msr);
    reg.contacts = vec![
        format!("<sip:{longest_msr}@127.0.0.1:5070>;iface={longest_iface}"),
        format!("<sip:{longest_msr}@127.0.0.1:5071>;iface=bond1.2"),
        format!("<sip:{longest_msr}@127.0.0.1:5072>;iface=eth0:1"),
        format!("<sip:{longest_msr}@127.0.0.1:5073>"),
        format!("<sip:{longest_msr}@[::1]:5074>"),
        "<sip:127.0.0.1:5075>".to_owned(),
    ];
    assert_eq!(register(&mut r, now, reg).status_code, StatusCode::OK);
    let contacts: Vec<ContactName> = r.bindings().map(|b| b.contact.clone()).collect();
    assert_eq!(contacts.len(), 6, "{contacts:?}");
    assert!(contacts
        .iter()
        .any(|c| *c == format!("127.0.0.1:5075@{longest_msr}")));
    assert!(contacts
        .iter()
        .any(|c| *c == format!("[::1]:5074@{longest_msr}")));
    let mut operator = crate::operator::OperatorConfig::new();
    operator
        .set_active(&longest_msr, false)
        .expect("msr name accepted");
    for contact in &contacts {
        operator
            .set_contact_zone(contact, "rtk")
            .unwrap_or_else(|e| panic!("{contact}: {e}"));
    }
}

/// SPEC §3: the REGISTER carries the media engine's addresses as Contact
/// URI parameters; the binding keeps them (and the URI as sent).
#[test]
fn the_engines_addresses_are_kept_with_the_binding() {
    let mut r = registrar();
    let mut reg = Reg::new("msr_1");
    reg.contacts = vec![
        "<sip:msr_1@192.168.2.21:5041;engine=192.168.2.21:5040;engine-transport=udp+tcp;mcc=192.168.2.21:5700>;iface=bond1.2".into(),
    ];
    assert_eq!(
        register(&mut r, Instant::now(), reg).status_code,
        StatusCode::OK
    );
    let b = r.contacts_of("msr_1")[0].clone();
    let engine = b.engine.expect("engine addresses");
    assert_eq!(engine.sip_uri(), "sip:192.168.2.21:5040");
    assert_eq!(engine.mcc, Some("192.168.2.21:5700".parse().expect("addr")));
    assert!(b.uri.ends_with(";mcc=192.168.2.21:5700"), "{}", b.uri);
    assert_eq!(b.contact, "bond1.2@msr_1");

    // A bad value is a 400 naming it, and changes nothing.
    let mut reg = Reg::new("msr_2");
    reg.contacts = vec!["<sip:msr_2@10.0.0.2:5041;engine=media.local:5040>;iface=eth0".into()];
    let resp = register(&mut r, Instant::now(), reg);
    assert_eq!(resp.status_code, StatusCode::BadRequest);
    assert!(
        warning_of(&resp)
            .as_deref()
            .is_some_and(|w| w.contains("engine='media.local:5040' is not an ip address and port")),
        "{:?}",
        warning_of(&resp)
    );
    assert!(!r.is_registered("msr_2"));
}

/// RFC 3261 §10.3 step 7: with the binding's Call-ID, a REGISTER whose
/// CSeq is not above the binding's changes nothing — not a same-CSeq
/// rewrite of the expiry, not a lower-CSeq `Expires: 0`.
#[test]
fn a_register_with_an_old_cseq_changes_nothing() {
    let mut r = registrar();
    let t0 = Instant::now();
    let mut reg = Reg::new("msr_1");
    reg.cseq = 9; // authenticated as 10
    assert_eq!(register(&mut r, t0, reg).status_code, StatusCode::OK);
    let before = r.contacts_of("msr_1")[0].clone();
    assert_eq!(before.cseq, 10);
    events(&mut r);
    for (cseq, expires) in [(9, "3600"), (7, "0")] {
        let mut reg = Reg::new("msr_1");
        reg.cseq = cseq; // sent as cseq + 1 with credentials
        reg.expires = Some(expires);
        let resp = register(&mut r, t0 + Duration::from_secs(1), reg);
        assert_eq!(
            resp.status_code,
            StatusCode::BadRequest,
            "cseq {}",
            cseq + 1
        );
        assert!(
            warning_of(&resp)
                .as_deref()
                .is_some_and(|w| w.contains("not above the binding's 10")),
            "{:?}",
            warning_of(&resp)
        );
        assert_eq!(r.contacts_of("msr_1"), vec![&before]);
        assert!(events(&mut r).is_empty());
    }
    // A higher CSeq is taken.
    let mut reg = Reg::new("msr_1");
    reg.cseq = 11;
    assert_eq!(register(&mut r, t0, reg).status_code, StatusCode::OK);
    assert_eq!(r.contacts_of("msr_1")[0].cseq, 12);
}

/// SPEC §3: a REGISTER with a new Call-ID for a registered contact is a
/// restarted MSR, whatever its CSeq: reported as such, so the subscriber
/// starts anew at once.
#[test]
fn a_new_call_id_is_a_restarted_msr() {
    let mut r = registrar();
    let t0 = Instant::now();
    assert_eq!(
        register(&mut r, t0, Reg::new("msr_1")).status_code,
        StatusCode::OK
    );
    events(&mut r);
    let mut reg = Reg::new("msr_1");
    reg.call_id = Some("after-restart");
    reg.cseq = 1;
    assert_eq!(register(&mut r, t0, reg).status_code, StatusCode::OK);
    let ev = events(&mut r);
    assert!(
        matches!(&ev[..], [RegistrarEvent::BindingRestarted(b)] if b.call_id == "after-restart" && b.cseq == 2),
        "{ev:?}"
    );
    // Its refreshes are plain refreshes again.
    let mut reg = Reg::new("msr_1");
    reg.call_id = Some("after-restart");
    reg.cseq = 3;
    register(&mut r, t0, reg);
    assert!(matches!(
        &events(&mut r)[..],
        [RegistrarEvent::BindingRefreshed(_)]
    ));
    r.check_expiries();
}

/// SPEC §3: bindings survive a restart of the collector. Saved with their
/// expiries as Unix times, read back at a later wall-clock time: each
/// lapses when it would have, a lapsed one is left out, and the restored
/// ones are reported as added (subscribed at once).
#[test]
fn saved_bindings_come_back_with_their_expiry() {
    let mut r = registrar();
    let t0 = Instant::now();
    let mut reg = Reg::new("msr_1");
    reg.contacts = vec![
        "<sip:msr_1@127.0.0.1:5071;engine=127.0.0.1:5070;engine-transport=udp;mcc=127.0.0.1:5700>;iface=lo".into(),
    ];
    register(&mut r, t0, reg);
    let mut short = Reg::new("msr_2");
    short.expires = Some("20");
    register(&mut r, t0, short);
    let text = saved::encode(r.bindings(), t0, 1_000_000);

    // 10 s of wall clock later, in a new process (another Instant base).
    let t1 = t0 + Duration::from_secs(1000);
    let restored = saved::decode(&text, t1, 1_010_000).expect("decodes");
    assert_eq!(restored.len(), 2);
    let one = restored.iter().find(|b| b.msr == "msr_1").expect("msr_1");
    assert_eq!(one.expires_at, t1 + Duration::from_secs(50));
    assert_eq!(one.engine, r.contacts_of("msr_1")[0].engine);
    assert_eq!(one.call_id, "reg-msr_1");
    // 25 s later msr_2 (20 s) has lapsed.
    let later = saved::decode(&text, t1, 1_025_000).expect("decodes");
    assert_eq!(
        later.iter().map(|b| b.msr.as_str()).collect::<Vec<_>>(),
        ["msr_1"]
    );

    let mut fresh = registrar();
    fresh.restore(t1, restored);
    let ev = events(&mut fresh);
    assert_eq!(ev.len(), 2);
    assert!(ev
        .iter()
        .all(|e| matches!(e, RegistrarEvent::BindingAdded(_))));
    assert_eq!(fresh.poll_timeout(), Some(t1 + Duration::from_secs(10)));
    fresh.check_expiries();
    // The MSR's next refresh (same Call-ID, higher CSeq) is a refresh.
    assert_eq!(
        register(&mut fresh, t1, Reg::new("msr_1")).status_code,
        StatusCode::OK
    );
    assert!(matches!(
        &events(&mut fresh)[..],
        [RegistrarEvent::BindingRefreshed(_)]
    ));
}

/// A torn file, another version, or an entry that breaks the REGISTER
/// rules is an error naming what is wrong, never a panic.
#[test]
fn bad_saved_bindings_are_refused_with_the_reason() {
    let t0 = Instant::now();
    let good = r#"{"format":"msr-collector bindings","version":1,"bindings":[{"msr":"msr_1","contact":"lo@msr_1","uri":"sip:msr_1@127.0.0.1:5071","version":null,"expires_unix_ms":2000,"call_id":"c","cseq":2,"source":null}]}"#;
    assert_eq!(saved::decode(good, t0, 1000).expect("good").len(), 1);
    // Version 2 adds the branch of the last REGISTER.
    let v2 = good
        .replace("\"version\":1", "\"version\":2")
        .replace("\"cseq\":2,", "\"cseq\":2,\"branch\":\"z9hG4bKb\",");
    let read = saved::decode(&v2, t0, 1000).expect("version 2");
    assert_eq!(read[0].branch.as_deref(), Some("z9hG4bKb"));
    let cases = [
        (&good[..good.len() / 2], "not a bindings file"),
        (
            &good.replace("\"version\":1", "\"version\":3")[..],
            "this collector reads \"msr-collector bindings\" versions 1 to 2",
        ),
        (
            &good.replace("\"msr\":\"msr_1\"", "\"msr\":\"msr 1\"")[..],
            "binding 0 (\"lo@msr_1\"): bad msr name",
        ),
        (
            &good.replace("lo@msr_1", "lo@msr_9")[..],
            "contact of another msr than \"msr_1\"",
        ),
        (
            &good.replace(
                "sip:msr_1@127.0.0.1:5071",
                "sip:msr_1@127.0.0.1:5071;engine=x",
            )[..],
            "is not an ip address and port",
        ),
    ];
    for (text, expected) in cases {
        let err = saved::decode(text, t0, 1000)
            .expect_err(expected)
            .to_string();
        assert!(err.contains(expected), "{err}");
    }
    for garbage in ["", "null", "[]", "{}", "\u{0}"] {
        assert!(saved::decode(garbage, t0, 0).is_err());
    }
    // An expiry far in the future is cut to the registrar's max_expires.
    let far = good.replace("2000", "9223372036854775807");
    let mut r = registrar();
    r.restore(t0, saved::decode(&far, t0, 1000).expect("decodes"));
    let max = Duration::from_secs(u64::from(r.max_expires));
    assert_eq!(r.poll_timeout(), Some(t0 + max));
}

/// What a REGISTER carries ends up in tables and logs: a contact URI with
/// control characters or over the length limit, or more contacts than one
/// MSR may have, is a 400; a User-Agent version that is not a token is
/// dropped, not kept raw.
#[test]
fn hostile_contacts_and_versions_are_refused_or_dropped() {
    let mut r = registrar();
    let now = Instant::now();
    let mut reg = Reg::new("msr_1");
    reg.contacts = vec![format!(
        "<sip:msr_1@127.0.0.1:5071;x={}>;iface=lo",
        "a".repeat(600)
    )];
    assert_eq!(
        register(&mut r, now, reg).status_code,
        StatusCode::BadRequest
    );
    let mut reg = Reg::new("msr_1");
    reg.contacts = (0..17)
        .map(|i| format!("<sip:msr_1@10.0.0.{i}:5071>;iface=eth{i}"))
        .collect();
    let resp = register(&mut r, now, reg);
    assert_eq!(resp.status_code, StatusCode::BadRequest);
    assert!(
        warning_of(&resp)
            .as_deref()
            .is_some_and(|w| w.contains("17 contacts, at most 16")),
        "{:?}",
        warning_of(&resp)
    );
    assert!(!r.is_registered("msr_1"));
    assert_eq!(agent_version("x/\u{1b}[2Jevil"), None);
    assert_eq!(
        agent_version("msr-agent/0.1.0 (linux)").as_deref(),
        Some("0.1.0")
    );
}

/// RFC 7616 §3.4: the nonce count is hex. The 10th and the 100th use of a
/// nonce (`0000000a`, `00000064`) are accepted, written by the agent's
/// client (the same `shared::sip::digest`), with no cap at 99.
#[test]
fn nonce_counts_past_9_and_99_are_accepted_in_hex() {
    let mut r = registrar();
    let now = Instant::now();
    let mut reg = Reg::new("msr_1");
    let challenge = challenges(&r.handle_register(now, &reg.build(), None))
        .into_iter()
        .find(|c| c.contains("algorithm=MD5"))
        .expect("md5 challenge");
    let ch = digest::Challenge::parse(&challenge).expect("parses");
    for nc in 1..=120u32 {
        reg.cseq += 1;
        reg.auth = Some(digest::authorization(
            &ch,
            "msr",
            "msr-secret",
            "REGISTER",
            "sip:127.0.0.1:5060",
            nc,
            "c0ffee",
        ));
        assert_eq!(
            r.handle_register(now, &reg.build(), None).status_code,
            StatusCode::OK,
            "nc {nc}"
        );
    }
}

/// The collector answers statelessly (RFC 3261 §8.2.7): a retransmitted
/// REGISTER (same Call-ID, CSeq and branch) gets its 200 again, with no
/// change and no second use of its nonce; the same CSeq with another
/// branch is a replay, refused as before.
#[test]
fn a_retransmitted_register_is_answered_200_again_and_changes_nothing() {
    let t0 = Instant::now();
    let mut r = registrar();
    let mut reg = Reg::new("msr_1");
    reg.branch = Some("z9hG4bKsame".into());
    let first = r.handle_register(t0, &reg.build(), None);
    let nonce = nonce_of(&challenges(&first)[0]);
    reg.cseq += 1;
    reg.auth = Some(authorization(
        "msr",
        "msr-secret",
        &nonce,
        Algorithm::Md5,
        "MD5",
    ));
    let ok = r.handle_register(t0, &reg.build(), None);
    assert_eq!(ok.status_code, StatusCode::OK);
    assert!(!events(&mut r).is_empty());
    let again = r.handle_register(t0, &reg.build(), None);
    assert_eq!(again.status_code, StatusCode::OK);
    assert_eq!(
        sip::header(&again.headers, "Contact"),
        sip::header(&ok.headers, "Contact")
    );
    // RFC 3261 §8.2.7: the same request gets the same To tag.
    assert_eq!(
        sip::header(&again.headers, "To"),
        sip::header(&ok.headers, "To")
    );
    assert!(sip::header(&ok.headers, "To").and_then(sip::tag).is_some());
    assert!(
        events(&mut r).is_empty(),
        "a retransmission changes nothing"
    );
    // Survives a restart: the branch is saved with the binding.
    let text = saved::encode(r.bindings(), t0, 1_000_000);
    let mut restarted = registrar();
    restarted.restore(t0, saved::decode(&text, t0, 1_000_000).expect("decode"));
    events(&mut restarted);
    let after = restarted.handle_register(t0, &reg.build(), None);
    assert_eq!(after.status_code, StatusCode::OK);
    assert!(events(&mut restarted).is_empty());
    // Another branch with the same CSeq is not a retransmission.
    reg.branch = Some("z9hG4bKother".into());
    let replay = r.handle_register(t0, &reg.build(), None);
    assert_ne!(replay.status_code, StatusCode::OK);
}

/// A 400's `Warning` text as `Bad Request (text)` (RFC 3261 §20.43: what
/// the agent logs).
fn warning_of(resp: &Response) -> Option<String> {
    let value = sip::header(&resp.headers, "Warning")?;
    let start = value.find('"')? + 1;
    let end = value.rfind('"')?;
    Some(format!("Bad Request ({})", value.get(start..end)?))
}

/// RFC 3261 §8.2.7: a retransmitted unauthenticated REGISTER (same Call-ID,
/// CSeq and branch) gets the 401 the first got, nonce included, while its
/// transaction lives (Timer J); another REGISTER, or the same one after
/// Timer J, gets a fresh nonce, and the first stays good.
#[test]
fn a_retransmitted_register_gets_the_same_challenge() {
    let t0 = Instant::now();
    let mut r = registrar();
    let mut reg = Reg::new("msr_1");
    reg.branch = Some("z9hG4bKchallenged".into());
    let first = r.handle_register(t0, &reg.build(), None);
    assert_eq!(first.status_code, StatusCode::Unauthorized);
    let again = r.handle_register(t0 + Duration::from_secs(1), &reg.build(), None);
    assert_eq!(challenges(&again), challenges(&first));
    assert_eq!(
        sip::header(&again.headers, "To"),
        sip::header(&first.headers, "To")
    );
    let nonce = nonce_of(&challenges(&first)[0]);

    let mut other = Reg::new("msr_1");
    other.branch = Some("z9hG4bKanother".into());
    let fresh = r.handle_register(t0, &other.build(), None);
    assert_ne!(nonce_of(&challenges(&fresh)[0]), nonce);

    let late = r.handle_register(t0 + TIMER_J, &reg.build(), None);
    assert_ne!(nonce_of(&challenges(&late)[0]), nonce);

    // The first nonce still authenticates.
    reg.cseq += 1;
    reg.auth = Some(authorization(
        "msr",
        "msr-secret",
        &nonce,
        Algorithm::Md5,
        "MD5",
    ));
    let ok = r.handle_register(t0 + TIMER_J, &reg.build(), None);
    assert_eq!(ok.status_code, StatusCode::OK);
}

/// What the registrar keeps of a challenged REGISTER to answer its
/// retransmissions is of a fixed size, whatever the Call-ID and branch a
/// stranger writes: MAX_NONCES of them held as written, 60 KB each, were
/// over a gigabyte. A retransmission still gets the first nonce.
#[test]
fn a_challenged_register_is_remembered_in_a_fixed_size() {
    let t0 = Instant::now();
    let mut r = registrar();
    let call_id = "c".repeat(30_000);
    let mut reg = Reg::new("msr_1");
    reg.call_id = Some(&call_id);
    reg.branch = Some(format!("z9hG4bK{}", "b".repeat(30_000)));
    let first = r.handle_register(t0, &reg.build(), None);
    assert_eq!(first.status_code, StatusCode::Unauthorized);
    let again = r.handle_register(t0 + Duration::from_secs(1), &reg.build(), None);
    assert_eq!(challenges(&again), challenges(&first));
    assert_eq!(r.challenged.len(), 1);
    assert!(r.challenged.keys().all(|k| k.len() <= 64));
}
