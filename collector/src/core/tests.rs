//! The core's glue in virtual time: SIP text in, SIP text and effects out,
//! every instant `t0 + d`, nothing sleeps. The two-party harness
//! (`tests/support/pair.rs`) drives the same core against the agent's.

use std::net::SocketAddr;
use std::time::Duration;

use msr_shared::admin::{ErrorCode, Request, Response, ResponseData};
use msr_shared::sip::wire;
use msr_shared::sip::{self, SipMessage, StatusCode};
use rsipstack::dialog::authenticate::compute_digest;
use rsipstack::sip::headers::auth::{Algorithm, AuthQop};
use tokio::time::Instant;

use super::*;
use crate::operator::cluster::Cluster;
use crate::operator::names::{SiteName, ZoneName};
use crate::operator::store::etcd::Member;

const LOCAL: &str = "10.0.0.1:5060";
const AGENT: &str = "10.0.0.2:5071";
const REALM: &str = "msr.local";

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("addr")
}

fn config() -> CollectorConfig {
    crate::config::parse(
        "node = \"core1@test\"\n[sip]\nlisten = \"10.0.0.1:5060\"\nrealm = \"msr.local\"\n\
         [[accounts]]\nauth_name = \"msr\"\npassword = \"msr-secret\"\n[http]\nlisten = \"off\"\n",
        "test",
    )
    .expect("config")
}

struct Harness {
    core: Collector,
    t0: Instant,
    now: Instant,
    sent: Vec<Transmit>,
    effects: Vec<Effect>,
    cseq: u32,
    next_admin: u64,
}

impl Harness {
    fn new() -> Self {
        Self::with_backend(Backend::File)
    }

    fn with_backend(backend: Backend) -> Self {
        let t0 = Instant::now();
        let mut operator = OperatorConfig::new();
        operator.declare_site("local").expect("site");
        let this = Member {
            node: "core1@test".into(),
            sip: LOCAL.into(),
            started_unix: 1_700_000_000,
        };
        let cluster = match backend {
            Backend::File => Cluster::file(this, "state.json".into(), 1),
            Backend::Etcd => Cluster::etcd(
                this,
                "127.0.0.1:2379".into(),
                "/msr".into(),
                1,
                std::time::SystemTime::now(),
            ),
        };
        let core = Collector::new(
            &config(),
            Start {
                local: addr(LOCAL),
                operator,
                cluster,
                backend,
                seed: 7,
                now: t0,
                unix_ms: 1_700_000_000_000,
            },
        );
        Self {
            core,
            t0,
            now: t0,
            sent: Vec::new(),
            effects: Vec::new(),
            cseq: 0,
            next_admin: 0,
        }
    }

    fn drain(&mut self) {
        while let Some(t) = self.core.poll_transmit() {
            self.sent.push(t);
        }
        while let Some(e) = self.core.poll_effect() {
            self.effects.push(e);
        }
    }

    fn deliver(&mut self, text: &str, from: &str) {
        let source = addr(from);
        let message = wire::decode(text.as_bytes(), source).expect("decode");
        self.core.handle_message(
            self.now,
            Inbound {
                route: Route::Udp(source),
                source,
                message,
                peer_certificate: None,
            },
        );
        self.drain();
    }

    fn advance(&mut self, d: Duration) {
        let end = self.now + d;
        while let Some(at) = self.core.poll_timeout().filter(|at| *at <= end) {
            self.now = at.max(self.now);
            self.core.handle_timeout(self.now);
            self.drain();
        }
        self.now = end;
    }

    /// The sent messages parsed, taken.
    fn take_sent(&mut self) -> Vec<(Route, SipMessage)> {
        std::mem::take(&mut self.sent)
            .into_iter()
            .map(|t| {
                let m = SipMessage::try_from(t.bytes.as_ref()).expect("parse what was sent");
                (t.route, m)
            })
            .collect()
    }

    fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    fn register_text(&mut self, branch: &str, auth: Option<&str>) -> String {
        self.cseq += 1;
        let mut t = format!(
            "REGISTER sip:10.0.0.1:5060 SIP/2.0\r\nVia: SIP/2.0/UDP {AGENT};branch={branch};rport\r\n\
             From: <sip:msr_1@10.0.0.1:5060>;tag=f1\r\nTo: <sip:msr_1@10.0.0.1:5060>\r\nCall-ID: reg-msr_1\r\n\
             CSeq: {} REGISTER\r\nUser-Agent: msr-agent/0.1.0\r\n\
             Contact: <sip:msr_1@10.0.0.2:5071>;iface=lo\r\nExpires: 60\r\n",
            self.cseq
        );
        if let Some(a) = auth {
            t.push_str(&format!("Authorization: {a}\r\n"));
        }
        t.push_str("Content-Length: 0\r\n\r\n");
        t
    }

    /// Registers `msr_1` with digest; returns the authenticated REGISTER's
    /// text (to retransmit it).
    fn register(&mut self) -> String {
        let first = self.register_text("z9hG4bKr1", None);
        self.deliver(&first, AGENT);
        let challenge = self
            .take_sent()
            .into_iter()
            .find_map(|(_, m)| match m {
                SipMessage::Response(r) if r.status_code == StatusCode::Unauthorized => Some(r),
                _ => None,
            })
            .expect("a challenge");
        let www = sip::header(&challenge.headers, "WWW-Authenticate").expect("www-authenticate");
        let nonce = msr_shared::sip::digest::digest_param(www, "nonce").expect("nonce");
        let algorithm =
            msr_shared::sip::digest::digest_param(www, "algorithm").unwrap_or_else(|| "MD5".into());
        let (alg, token) = if algorithm.eq_ignore_ascii_case("SHA-256") {
            (Algorithm::Sha256, "SHA-256")
        } else {
            (Algorithm::Md5, "MD5")
        };
        let uri = "sip:10.0.0.1:5060";
        let qop = AuthQop::Auth {
            cnonce: "c0ffee".into(),
            nc: 1,
        };
        let response = compute_digest(
            "msr",
            "msr-secret",
            REALM,
            &nonce,
            &rsipstack::sip::Method::Register,
            uri,
            alg,
            Some(&qop),
        );
        let auth = format!(
            "Digest username=\"msr\", realm=\"{REALM}\", nonce=\"{nonce}\", uri=\"{uri}\", response=\"{response}\", \
             algorithm={token}, qop=auth, nc=00000001, cnonce=\"c0ffee\""
        );
        let text = self.register_text("z9hG4bKr2", Some(&auth));
        self.deliver(&text, AGENT);
        text
    }

    fn admin(&mut self, request: Request) -> AdminId {
        self.next_admin += 1;
        let id = AdminId(self.next_admin);
        self.core.handle_admin(self.now, id, request);
        self.drain();
        id
    }

    fn answer_of(&mut self, id: AdminId) -> Option<Response> {
        let effects = self.take_effects();
        let mut found = None;
        for e in effects {
            match e {
                Effect::Answer { id: i, response } if i == id => found = Some(*response),
                other => self.effects.push(other),
            }
        }
        found
    }
}

fn status_of(sent: &[(Route, SipMessage)]) -> Vec<u16> {
    sent.iter()
        .filter_map(|(_, m)| match m {
            SipMessage::Response(r) => Some(r.status_code.code()),
            SipMessage::Request(_) => None,
        })
        .collect()
}

fn save_generation(effects: &[Effect]) -> Option<u64> {
    effects.iter().find_map(|e| match e {
        Effect::SaveBindings { generation, .. } => Some(*generation),
        _ => None,
    })
}

/// SPEC §3: a binding is on disk before its 200. The core asks for the
/// save and holds the 200 until it is written; meanwhile it subscribes.
#[test]
fn a_register_is_answered_only_once_its_binding_is_saved() {
    let mut h = Harness::new();
    h.register();
    let sent = h.take_sent();
    assert!(status_of(&sent).is_empty(), "no 200 yet: {sent:?}");
    assert!(
        sent.iter().any(
            |(route, m)| matches!(m, SipMessage::Request(r) if r.method == sip::Method::Subscribe)
                && *route == Route::Udp(addr(AGENT))
        ),
        "the subscription starts at once: {sent:?}"
    );
    let effects = h.take_effects();
    let generation = save_generation(&effects).expect("a save");
    h.core.handle_bindings_saved(h.now, generation, Ok(()));
    h.drain();
    let sent = h.take_sent();
    assert_eq!(status_of(&sent), [200]);
    assert_eq!(sent[0].0, Route::Udp(addr(AGENT)), "back to the source");
    assert!(h.take_effects().is_empty(), "nothing more to save");
}

/// A stateless UAS answers a retransmission again (RFC 3261 §8.2.7): the
/// same REGISTER (Call-ID, CSeq, branch) gets the same 200 and changes
/// nothing; while the first save is being written, its 200 waits too.
#[test]
fn a_retransmitted_register_is_answered_again_and_changes_nothing() {
    let mut h = Harness::new();
    let text = h.register();
    h.take_sent();
    let generation = save_generation(&h.take_effects()).expect("save");
    h.deliver(&text, AGENT);
    assert!(
        status_of(&h.take_sent()).is_empty(),
        "waits for the save in flight"
    );
    assert!(
        save_generation(&h.take_effects()).is_none(),
        "no second save"
    );
    h.core.handle_bindings_saved(h.now, generation, Ok(()));
    h.drain();
    assert_eq!(status_of(&h.take_sent()), [200, 200]);
    // Once saved, a retransmission is answered at once.
    h.deliver(&text, AGENT);
    assert_eq!(status_of(&h.take_sent()), [200]);
    assert!(h.take_effects().is_empty());
}

/// A save that failed, as the store reports it.
fn disk_full() -> crate::operator::store::StoreError {
    crate::operator::store::StoreError::Bindings {
        path: "operator.json.bindings".into(),
        source: std::io::Error::other("disk full"),
    }
}

#[test]
fn a_binding_that_cannot_be_saved_is_answered_500_with_retry_after() {
    let mut h = Harness::new();
    h.register();
    h.take_sent();
    let generation = save_generation(&h.take_effects()).expect("save");
    h.core
        .handle_bindings_saved(h.now, generation, Err(disk_full()));
    h.drain();
    let sent = h.take_sent();
    assert_eq!(status_of(&sent), [500]);
    let SipMessage::Response(r) = &sent[0].1 else {
        panic!("response")
    };
    assert_eq!(sip::header(&r.headers, "Retry-After"), Some("5"));
    // A 500 built from the REGISTER, not the 200 edited: no binding
    // listed, and the To tag the 200 would have had (RFC 3261 §8.2.7).
    assert_eq!(sip::header(&r.headers, "Contact"), None);
    assert!(sip::header(&r.headers, "To").is_some_and(|to| to.contains(";tag=")));
    assert!(sip::header(&r.headers, "Warning").is_some_and(|w| w.contains("not be saved")));
    assert_eq!(r.status_code.text(), "Server Internal Error");
}

/// The subscription to a new binding, its first NOTIFY and a
/// retransmission of it: the load is in the table once.
#[test]
fn a_notify_in_the_dialog_reports_the_load_and_its_retransmission_is_absorbed() {
    let mut h = Harness::new();
    h.register();
    let generation = save_generation(&h.take_effects()).expect("save");
    h.core.handle_bindings_saved(h.now, generation, Ok(()));
    h.drain();
    let subscribe = h
        .take_sent()
        .into_iter()
        .find_map(|(_, m)| match m {
            SipMessage::Request(r) if r.method == sip::Method::Subscribe => Some(r),
            _ => None,
        })
        .expect("subscribe");
    // The agent accepts it.
    let mut ok = sip::response(&subscribe, StatusCode::OK, Some("agenttag"));
    sip::push_header(&mut ok.headers, "Expires", "60");
    sip::push_header(&mut ok.headers, "Contact", "<sip:msr_1@10.0.0.2:5071>");
    let ok = String::from_utf8_lossy(&wire::encode_response(ok, USER_AGENT)).to_string();
    h.deliver(&ok, AGENT);
    let call_id = sip::call_id(&subscribe.headers)
        .expect("call-id")
        .to_owned();
    let from = sip::header(&subscribe.headers, "From").expect("from");
    let local_tag = sip::tag(from).expect("tag");
    let body = "msr: msr_1\nload: 37\ncpu: 21\ncalls: 303\nmax-calls: 8192\n";
    let notify = format!(
        "NOTIFY sip:collector@10.0.0.1:5060 SIP/2.0\r\nVia: SIP/2.0/UDP {AGENT};branch=z9hG4bKn1;rport\r\n\
         From: <sip:msr_1@10.0.0.2:5071>;tag=agenttag\r\nTo: <sip:collector@10.0.0.1:5060>;tag={local_tag}\r\n\
         Call-ID: {call_id}\r\nCSeq: 1 NOTIFY\r\nEvent: eltex-call-count\r\n\
         Subscription-State: active;expires=60\r\nContent-Type: application/x-eltex-call-count\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    h.deliver(&notify, AGENT);
    h.deliver(&notify, AGENT);
    assert_eq!(status_of(&h.take_sent()), [200, 200]);
    let id = h.admin(Request::ResourceList { active_only: false });
    let Some(Response::Ok(ResponseData::Resources { rows })) = h.answer_of(id) else {
        panic!("resources")
    };
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].load, Some(37));
    let id = h.admin(Request::SubscriptionList {});
    let Some(Response::Ok(ResponseData::Subscriptions { rows: subs })) = h.answer_of(id) else {
        panic!("subscriptions")
    };
    assert_eq!(subs[0].notify_count, 1, "the retransmission is not counted");
    // A NOTIFY from another address in that dialog is refused (SPEC §4).
    let spoof = notify.replace("CSeq: 1 NOTIFY", "CSeq: 2 NOTIFY");
    h.deliver(&spoof, "10.0.0.66:5071");
    assert_eq!(status_of(&h.take_sent()), [403]);
}

/// One change at a time goes to the store; the next waits; each is
/// answered only when stored, and a failed save answers an error and
/// changes nothing.
#[test]
fn changes_are_committed_one_at_a_time_and_answered_once_stored() {
    let mut h = Harness::new();
    let a = h.admin(Request::SiteDeclare { name: "a".into() });
    let b = h.admin(Request::SiteDeclare { name: "b".into() });
    let commits: Vec<Ticket> = h
        .take_effects()
        .into_iter()
        .filter_map(|e| match e {
            Effect::Commit { ticket, .. } => Some(ticket),
            _ => None,
        })
        .collect();
    assert_eq!(commits.len(), 1, "b waits for a");
    h.core.handle_committed(h.now, commits[0], Ok(()));
    h.drain();
    assert!(matches!(h.answer_of(a), Some(Response::Ok(_))));
    let second = h
        .take_effects()
        .into_iter()
        .find_map(|e| match e {
            Effect::Commit { ticket, .. } => Some(ticket),
            _ => None,
        })
        .expect("b's commit");
    let failure = CommitFailure::File(crate::operator::store::StoreError::Write {
        path: "state.json".into(),
        source: std::io::Error::other("disk full"),
    });
    h.core.handle_committed(h.now, second, Err(failure));
    h.drain();
    let Some(Response::Err(e)) = h.answer_of(b) else {
        panic!("b refused")
    };
    assert_eq!(e.code, ErrorCode::StoreFailed);
    let id = h.admin(Request::SiteList {});
    let Some(Response::Ok(ResponseData::Sites { sites })) = h.answer_of(id) else {
        panic!("sites")
    };
    assert!(sites.contains(&"a".to_owned()) && !sites.contains(&"b".to_owned()));
}

/// With etcd unreachable a change is refused at once (SPEC §12).
#[test]
fn with_etcd_unreachable_a_change_is_refused_at_once() {
    let mut h = Harness::with_backend(Backend::Etcd);
    h.core.handle_etcd(
        h.now,
        crate::operator::store::etcd::EtcdEvent::Unavailable {
            reason: "connection refused".into(),
            since: std::time::SystemTime::UNIX_EPOCH,
        },
    );
    h.drain();
    let id = h.admin(Request::SiteDeclare { name: "a".into() });
    let Some(Response::Err(e)) = h.answer_of(id) else {
        panic!("refused")
    };
    assert_eq!(e.code, ErrorCode::StoreUnavailable);
    assert!(h
        .take_effects()
        .iter()
        .all(|e| !matches!(e, Effect::Commit { .. })));
}

/// Toward an agent that stopped answering, the keepalive retransmits only
/// its own transaction, which ends at the keepalive timeout: never more
/// than one in flight per contact.
#[test]
fn toward_a_silent_agent_one_keepalive_transaction_at_most() {
    let mut h = Harness::new();
    h.register();
    let generation = save_generation(&h.take_effects()).expect("save");
    h.core.handle_bindings_saved(h.now, generation, Ok(()));
    h.drain();
    h.take_sent();
    let mut peak = 0;
    for _ in 0..600 {
        h.advance(Duration::from_millis(100));
        let options = h
            .core
            .transactions
            .len()
            .saturating_sub(usize::from(h.core.subscriber.view("msr_1").is_some()));
        peak = peak.max(options);
    }
    assert!(peak <= 1, "keepalive transactions in flight: {peak}");
    let sent = h.take_sent();
    let options = sent
        .iter()
        .filter(|(_, m)| matches!(m, SipMessage::Request(r) if r.method == sip::Method::Options))
        .count();
    // 60 s: a probe every 5 s once unreachable, each sent with its
    // retransmissions inside its 2 s (at 0.5 and 1.5 s): about 3 a probe.
    assert!((20..=60).contains(&options), "{options} OPTIONS in 60 s");
    assert!(h.now - h.t0 >= Duration::from_secs(60));
}

/// A select that names no zone or site (the redirect server's, for an
/// INVITE without them; HTTP's without the parameters) is placed by the
/// `[defaults]` the core holds at that moment, so a reload applies to
/// every front end at once.
#[test]
fn a_select_without_zone_or_site_follows_the_defaults_a_reload_sets() {
    let mut h = Harness::new();
    let message = |h: &mut Harness| {
        let id = h.admin(Request::Select(msr_shared::admin::SelectQuery::new("", "")));
        match h.answer_of(id) {
            Some(Response::Err(body)) => body.message,
            other => panic!("a refusal: {other:?}"),
        }
    };
    let first = message(&mut h);
    assert!(first.contains("zone `default`"), "{first}");
    let mut reloaded = config();
    reloaded.defaults.zone = ZoneName::new("east").expect("zone");
    h.core.reconfigure(h.now, &reloaded);
    let second = message(&mut h);
    assert!(second.contains("zone `east`"), "{second}");
    reloaded.defaults.site = SiteName::new("far").expect("site");
    h.core.reconfigure(h.now, &reloaded);
    let third = message(&mut h);
    assert!(third.contains("site `far` is not declared"), "{third}");
}

#[test]
fn a_request_it_does_not_serve_gets_405_with_allow_and_options_200() {
    let mut h = Harness::new();
    let text = |method: &str| {
        format!(
            "{method} sip:collector@10.0.0.1:5060 SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bK{method}\r\n\
             From: <sip:x@192.0.2.1>;tag=x\r\nTo: <sip:collector@10.0.0.1>\r\nCall-ID: {method}@x\r\n\
             CSeq: 1 {method}\r\nContent-Length: 0\r\n\r\n"
        )
    };
    h.deliver(&text("INFO"), "192.0.2.1:5060");
    h.deliver(&text("OPTIONS"), "192.0.2.1:5060");
    h.deliver(&text("ACK"), "192.0.2.1:5060");
    let sent = h.take_sent();
    assert_eq!(status_of(&sent), [405, 200]);
    for (_, m) in &sent {
        let SipMessage::Response(r) = m else { panic!() };
        assert_eq!(
            sip::header(&r.headers, "Allow"),
            Some("REGISTER, NOTIFY, OPTIONS")
        );
    }
}

/// The saved bindings come back at a restart; what was read is not saved
/// again, and the subscription starts at once (SPEC §3).
#[test]
fn restored_bindings_are_subscribed_at_once_without_a_save() {
    let mut h = Harness::new();
    h.register();
    let generation = save_generation(&h.take_effects()).expect("save");
    h.core.handle_bindings_saved(h.now, generation, Ok(()));
    let text = h.core.bindings_text(h.now);
    let mut restarted = Harness::new();
    restarted.core.restore_bindings(restarted.now, &text);
    restarted.drain();
    assert!(restarted.take_effects().is_empty(), "nothing to save");
    let sent = restarted.take_sent();
    assert!(sent
        .iter()
        .any(|(_, m)| matches!(m, SipMessage::Request(r) if r.method == sip::Method::Subscribe)));
    assert_eq!(restarted.core.known_sources().count(), 1);
}
