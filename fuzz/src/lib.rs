//! The fuzz targets' harnesses: each takes the fuzzer's bytes and feeds them
//! through the daemons' own parsers and sans-IO cores, the path a datagram,
//! a file or a control line takes in the running daemon. A panic anywhere
//! is the fuzzer's crash.
//!
//! The SIP harnesses take up to [`MAX_MESSAGES`] messages per input,
//! separated by a NUL byte, so that a sequence (a refresh after a NOTIFY, a
//! REGISTER after a challenge) reaches the state the first one left. Before
//! parsing, the placeholders below are replaced by the live dialog's values,
//! which the harness learns from the cores; the checked-in seeds use them
//! so that mutated NOTIFYs and responses hit the live dialog instead of
//! being refused at the first Call-ID comparison.
//!
//! * `@@CALLID@@` — collector: the subscription's Call-ID; agent: the
//!   registration's Call-ID.
//! * `@@FTAG@@` — collector: the subscription's From tag.
//! * `@@CSEQ@@` — agent: the CSeq of the REGISTER in flight.
//! * `@@NCSEQ@@` — agent: the CSeq of the last NOTIFY sent.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use msr_shared::sip::{self, Method, Request, SipMessage};
use tokio::time::Instant;

/// The most SIP messages one input is split into.
pub const MAX_MESSAGES: usize = 6;

/// Where the harnesses pretend datagrams come from (the agent of the seed
/// captures, `tests/it/front_ends.rs`).
const PEER: &str = "127.0.0.1:5071";

/// The collector's example config (`config-examples/collector.toml`).
const COLLECTOR_TOML: &str = include_str!("../../config-examples/collector.toml");
/// The agent's loopback example config.
const AGENT_XML: &str = include_str!("../../config-examples/msr-loopback.xml");

fn peer() -> SocketAddr {
    PEER.parse()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 5071)))
}

/// Where message `i` of an input comes from: the peer, except every eighth
/// from a stranger (SPEC §4: the agent refuses its SUBSCRIBEs, the
/// collector its NOTIFYs), so both paths are fuzzed.
fn source(i: usize) -> Option<SocketAddr> {
    if i % 8 == 7 {
        Some(SocketAddr::from(([192, 0, 2, 66], 5071)))
    } else {
        Some(peer())
    }
}

/// Splits an input into at most [`MAX_MESSAGES`] messages.
fn messages(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    data.split(|&b| b == 0).take(MAX_MESSAGES)
}

/// Replaces each `(placeholder, value)` in `msg`.
fn substitute(msg: &[u8], pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut out = msg.to_vec();
    for (from, to) in pairs {
        let from = from.as_bytes();
        if from.is_empty() || !out.windows(from.len()).any(|w| w == from) {
            continue;
        }
        let mut next = Vec::with_capacity(out.len());
        let mut i = 0;
        while i < out.len() {
            if out[i..].starts_with(from) {
                next.extend_from_slice(to.as_bytes());
                i += from.len();
            } else {
                next.push(out[i]);
                i += 1;
            }
        }
        out = next;
    }
    out
}

/// What a daemon's socket does with a datagram before its core sees it:
/// `wire::decode` (parse, check, stamp `received`/`rport` on the top Via),
/// and for what it refuses the raw answer (`wire::refused`).
fn parse(datagram: &[u8]) -> Option<SipMessage> {
    match sip::wire::decode(datagram, peer()) {
        Ok(message) => Some(message),
        Err(_) => {
            let _ = sip::wire::refused(datagram, "OPTIONS");
            None
        }
    }
}

/// The NOTIFY body (SPEC §4): decode, and what decodes encodes back to the
/// same report.
pub fn notify_body(data: &[u8]) {
    if let Ok(report) = msr_shared::event_package::LoadReport::decode(data) {
        let again = msr_shared::event_package::LoadReport::decode(report.encode().as_bytes());
        assert_eq!(
            again.as_ref(),
            Ok(&report),
            "notify body does not round-trip"
        );
    }
}

/// A SIP byte stream (TCP, RFC 3261 §18.3) as the collector's stream
/// reader frames it: the first byte sets the size of each read (1–64), the
/// rest is the stream. Cut into reads or pushed whole, the stream must give
/// the same messages and keepalives, fail the same way, and never hold
/// more than one message's worth.
pub fn sip_stream(data: &[u8]) {
    use msr_shared::sip::wire::{Frame, StreamFramer, MAX_STREAM_MESSAGE};
    let Some((&cut, stream)) = data.split_first() else {
        return;
    };
    let frames_of = |pieces: &mut dyn Iterator<Item = &[u8]>| -> (Vec<Frame>, bool) {
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
            assert!(framer.pending() <= MAX_STREAM_MESSAGE + 64, "held too much");
        }
        (frames, false)
    };
    let whole = frames_of(&mut std::iter::once(stream));
    let cut_up = frames_of(&mut stream.chunks(usize::from(cut % 64) + 1));
    assert_eq!(whole, cut_up, "framing depends on how the stream is cut");
}

/// The agent's XML config (SPEC §2), as `--check-config` and hot reload
/// read it.
pub fn agent_config(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = msr_agent::config::parse(text, Path::new("fuzz.xml"));
    }
}

/// The collector's TOML config.
pub fn collector_config(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = msr_collector::config::parse(text, "fuzz.toml");
    }
}

/// The stored operator configuration (SPEC §6): decode; what decodes
/// encodes back to the same configuration.
pub fn operator_store(data: &[u8]) {
    use msr_collector::operator::OperatorConfig;
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(config) = OperatorConfig::decode(text) {
            let again = OperatorConfig::decode(&config.encode());
            assert_eq!(
                again.as_ref(),
                Ok(&config),
                "operator store does not round-trip"
            );
        }
    }
}

fn collector_example() -> &'static msr_collector::CollectorConfig {
    static CONFIG: OnceLock<msr_collector::CollectorConfig> = OnceLock::new();
    CONFIG.get_or_init(|| {
        #[allow(clippy::expect_used)] // the checked-in example, parsed by a test
        msr_collector::config::parse(COLLECTOR_TOML, "collector.toml").expect("example config")
    })
}

fn agent_example() -> &'static msr_agent::AgentConfig {
    static CONFIG: OnceLock<msr_agent::AgentConfig> = OnceLock::new();
    CONFIG.get_or_init(|| {
        #[allow(clippy::expect_used)] // the checked-in example, parsed by a test
        msr_agent::config::parse(AGENT_XML, Path::new("msr-loopback.xml")).expect("example config")
    })
}

/// An empty collector's admin state: the control handler's context.
struct AdminRig {
    operator: msr_collector::operator::OperatorConfig,
    table: msr_collector::model::load_table::LoadTable,
    registrar: msr_collector::sip::registrar::Registrar,
    subscriber: msr_collector::sip::subscriber::Subscriber,
    defaults: msr_collector::core::admin::Defaults,
    rng: rand::rngs::StdRng,
    legs: msr_collector::model::legs::LegTable,
    health: msr_collector::model::health::HealthMonitor,
    absences: msr_collector::model::absent::Absences,
    overload: msr_collector::model::overload::OverloadWatch,
}

impl AdminRig {
    fn new() -> Self {
        use rand::SeedableRng;
        let config = collector_example();
        let defaults = msr_collector::core::admin::Defaults::default();
        let local = "sip:collector@127.0.0.1:5060".to_owned();
        Self {
            operator: msr_collector::operator::OperatorConfig::new(),
            table: msr_collector::model::load_table::LoadTable::new(
                config.node.clone(),
                config.defaults.clone(),
            ),
            registrar: msr_collector::sip::registrar::Registrar::new(&config.sip, &config.accounts),
            subscriber: msr_collector::sip::subscriber::Subscriber::new(
                msr_collector::sip::subscriber::SubscriberConfig {
                    local_uri: local.clone(),
                    contact: local.clone(),
                    default_expires: config.subscription.expires,
                },
            ),
            health: msr_collector::model::health::HealthMonitor::new(config.health, local),
            absences: msr_collector::model::absent::Absences::default(),
            overload: msr_collector::model::overload::OverloadWatch::default(),
            defaults,
            rng: rand::rngs::StdRng::seed_from_u64(1),
            legs: msr_collector::model::legs::LegTable::new(config.legs.max_duration),
        }
    }

    /// Carries out `request` as the shell does, a change made current
    /// without storing it.
    fn run(&mut self, request: msr_shared::admin::Request) -> msr_shared::admin::Response {
        use msr_collector::core::admin::{self as admin, AdminContext, Outcome};
        let mut ctx = AdminContext {
            operator: &mut self.operator,
            table: &mut self.table,
            registrar: &self.registrar,
            subscriber: &self.subscriber,
            defaults: &self.defaults,
            rng: &mut self.rng,
            legs: &mut self.legs,
            health: &mut self.health,
            absences: &mut self.absences,
            overload: &mut self.overload,
            core_hosts: 1,
        };
        match admin::prepare(request, &mut ctx, Instant::now()) {
            Outcome::Answer(response) => response,
            Outcome::Change { next, response } => {
                *ctx.operator = *next;
                response
            }
        }
    }
}

/// One control-protocol line (SPEC §8), as a control connection reads it,
/// carried out twice (a client that repeats itself) by the admin handler
/// against an empty collector (a change is made current, not stored).
pub fn control_line(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(request) = serde_json::from_str::<msr_shared::admin::Request>(text.trim()) else {
        return;
    };
    let mut rig = AdminRig::new();
    for request in [request.clone(), request] {
        let _ = serde_json::to_string(&rig.run(request));
    }
}

/// SIP datagrams received by the collector's redirect server (SPEC §11):
/// an INVITE is decided, its `select` carried out against an empty
/// collector and answered; any other method answered as the server does.
pub fn sip_redirect(data: &[u8]) {
    use msr_collector::api::redirect::{self, Decision, RedirectContext};
    let ctx = RedirectContext {
        own: vec![SocketAddr::from(([127, 0, 0, 1], 5080))],
        allow: Vec::new(),
    };
    let mut rig = AdminRig::new();
    for raw in messages(data) {
        let Some(SipMessage::Request(req)) = parse(raw) else {
            continue;
        };
        let response = if req.method == Method::Invite {
            match redirect::decide(&req) {
                Decision::Reply(response) => Some(*response),
                Decision::Select(select) => {
                    let answer = rig.run(select);
                    Some(redirect::answer(&req, &answer, &ctx))
                }
            }
        } else {
            redirect::other_method(&req)
        };
        if let Some(response) = response {
            let _ = msr_shared::sip::wire::encode_response(response, "msr-fuzz");
        }
    }
}

/// SIP datagrams received by the collector's core — the product's
/// [`msr_collector::core::Collector`], glue and all — decoded as its
/// transport decodes them, with a live dialog to `msr_1` (restored from a
/// saved binding, whose first SUBSCRIBE the agent accepts); every eighth
/// from a stranger. Saves and commits succeed at once; time moves 7 s a
/// message, so refreshes, keepalives, retransmissions and timeouts run.
pub fn sip_collector(data: &[u8]) {
    use msr_collector::core::{Backend, Collector, Inbound, Route, Start};
    use msr_collector::operator::cluster::Cluster;
    use msr_collector::operator::store::etcd::Member;
    use msr_shared::sip::wire;

    let config = collector_example();
    let mut now = Instant::now();
    let local = SocketAddr::from(([127, 0, 0, 1], 5060));
    let this = Member {
        node: config.node.clone(),
        sip: local.to_string(),
        started_unix: 1_700_000_000,
    };
    let mut core = Collector::new(
        config,
        Start {
            local,
            operator: msr_collector::operator::OperatorConfig::new(),
            cluster: Cluster::file(this, "fuzz.json".into(), 1),
            backend: Backend::File,
            seed: 1,
            now,
            unix_ms: 1_700_000_000_000,
        },
    );
    let saved = r#"{"format":"msr-collector bindings","version":2,"bindings":[{"msr":"msr_1","contact":"lo@msr_1","uri":"sip:msr_1@127.0.0.1:5071;engine=127.0.0.1:5070;engine-transport=udp","version":null,"expires_unix_ms":1700003600000,"call_id":"fuzz","cseq":1,"source":"127.0.0.1:5071"}]}"#;
    core.restore_bindings(now, saved);
    let mut call_id = String::new();
    let mut from_tag = String::new();
    let drain = |core: &mut Collector, now: Instant, first: &mut Option<SipMessage>| {
        while let Some(t) = core.poll_transmit() {
            if first.is_none() {
                if let Ok(m @ SipMessage::Request(_)) = SipMessage::try_from(t.bytes.as_ref()) {
                    *first = Some(m);
                }
            }
        }
        while let Some(effect) = core.poll_effect() {
            match effect {
                msr_collector::core::Effect::Commit { ticket, .. } => {
                    core.handle_committed(now, ticket, Ok(()))
                }
                msr_collector::core::Effect::SaveBindings { generation, .. } => {
                    core.handle_bindings_saved(now, generation, Ok(()))
                }
                msr_collector::core::Effect::Answer { .. } => {}
            }
        }
        while core.poll_event().is_some() {}
        while core.poll_count().is_some() {}
    };
    let mut first = None;
    drain(&mut core, now, &mut first);
    if let Some(SipMessage::Request(subscribe)) = first {
        call_id = sip::call_id(&subscribe.headers)
            .unwrap_or_default()
            .to_owned();
        from_tag = sip::header(&subscribe.headers, "From")
            .and_then(sip::tag)
            .unwrap_or_default();
        // The agent's 200 establishes the dialog (RFC 6665 §4.1.2.1).
        let mut ok = sip::response(&subscribe, sip::StatusCode::OK, Some("msrtag"));
        sip::push_header(&mut ok.headers, "Expires", "60");
        if let Ok(message) = wire::decode(&wire::encode_response(ok, "msr-fuzz"), peer()) {
            core.handle_message(
                now,
                Inbound {
                    route: Route::Udp(peer()),
                    source: peer(),
                    message,
                    peer_certificate: None,
                },
            );
        }
    }
    let pairs = [
        ("@@CALLID@@", call_id.as_str()),
        ("@@FTAG@@", from_tag.as_str()),
    ];
    for (i, raw) in messages(data).enumerate() {
        let source = source(i).unwrap_or_else(peer);
        if let Ok(message) = wire::decode(&substitute(raw, &pairs), source) {
            core.handle_message(
                now,
                Inbound {
                    route: Route::Udp(source),
                    source,
                    message,
                    peer_certificate: None,
                },
            );
        }
        let mut ignore = Some(SipMessage::Response(sip::Response::default()));
        drain(&mut core, now, &mut ignore);
        now += Duration::from_secs(7);
        core.handle_timeout(now);
        drain(&mut core, now, &mut ignore);
    }
}

/// SIP datagrams received by the agent: requests into the notifier (with
/// one live subscription from the collector); responses to the REGISTER
/// in flight and to the last NOTIFY.
pub fn sip_agent(data: &[u8]) {
    use msr_agent::load::Sample;
    use msr_agent::notifier::{Notifier, NotifierConfig};
    use msr_agent::registration::{Registration, RegistrationConfig};

    let config = agent_example();
    let mut now = Instant::now();
    let Some(account) = config.accounts.first() else {
        return;
    };
    let mut notifier = Notifier::new(
        NotifierConfig {
            load_delta: config.general.load_delta,
            high_water: config.agent.notify_high_water,
            notify_min_interval: Duration::from_millis(config.agent.notify_min_interval_ms),
            notify_top_interval: Duration::from_millis(config.agent.notify_top_interval_ms),
            max_expires: config.agent.max_subscription_expires,
            contact_host_port: PEER.into(),
            accounts: config.accounts.iter().map(|a| a.msr_name.clone()).collect(),
            subscribers: config.subscriber_hosts().addresses,
            registrars: std::collections::BTreeSet::from([peer()]),
            codecs: config.codecs,
        },
        Sample {
            load: 10,
            cpu: 5,
            calls: 10,
            max_calls: config.general.max_calls,
        },
    );
    let mut registration = Registration::new(
        RegistrationConfig {
            account: account.clone(),
            contact_addr: peer().ip(),
            contact_port: peer().port(),
            iface: "lo".into(),
            engine: None,
            expires: config.agent.register_expires,
        },
        now,
    );
    if let Some(req) = parse(SETUP_SUBSCRIBE.as_bytes()).and_then(|m| match m {
        SipMessage::Request(r) => Some(r),
        SipMessage::Response(_) => None,
    }) {
        let _ = notifier.handle_request(now, Some(peer()), &req);
    }
    let mut seen = AgentSeen::default();
    seen.flush(&mut notifier, &mut registration);
    for (i, raw) in messages(data).enumerate() {
        let pairs = [
            ("@@CALLID@@", seen.reg_call_id.as_str()),
            ("@@CSEQ@@", seen.reg_cseq.as_str()),
            ("@@NCSEQ@@", seen.notify_cseq.as_str()),
        ];
        if let Some(msg) = parse(&substitute(raw, &pairs)) {
            match msg {
                SipMessage::Request(req) => {
                    if let Some(response) = notifier.handle_request(now, source(i), &req) {
                        let _ = response.to_string();
                    }
                }
                SipMessage::Response(response) => {
                    let method = sip::cseq(&response.headers).map(|(_, m)| m);
                    if method.as_deref() == Some("REGISTER") {
                        registration.handle_response(now, &response);
                    } else if let Some(sub) = seen.notify {
                        notifier.handle_notify_response(now, sub, &response);
                    }
                }
            }
        }
        now += Duration::from_secs(3);
        let load = u8::try_from(i * 17 % 101).unwrap_or(0);
        notifier.on_sample(
            now,
            Sample {
                load,
                cpu: load,
                calls: u32::from(load),
                max_calls: config.general.max_calls,
            },
        );
        registration.handle_timeout(now);
        notifier.handle_timeout(now);
        seen.flush(&mut notifier, &mut registration);
        let _ = notifier.subscriptions();
    }
}

/// What the agent harness learnt from the cores' last transmits.
#[derive(Default)]
struct AgentSeen {
    /// The Call-ID of the registration's REGISTERs (one per run, RFC 3261 §10.2).
    reg_call_id: String,
    reg_cseq: String,
    notify: Option<msr_agent::notifier::SubscriptionId>,
    notify_cseq: String,
}

impl AgentSeen {
    fn flush(
        &mut self,
        notifier: &mut msr_agent::notifier::Notifier,
        registration: &mut msr_agent::registration::Registration,
    ) {
        while let Some(req) = registration.poll_transmit() {
            self.reg_cseq = cseq_number(&req);
            if let Some(call_id) = sip::call_id(&req.headers) {
                self.reg_call_id = call_id.to_owned();
            }
        }
        while let Some(t) = notifier.poll_transmit() {
            let _ = t.request.to_string();
            self.notify_cseq = t.cseq.to_string();
            self.notify = Some(t.subscription);
        }
    }
}

fn cseq_number(req: &Request) -> String {
    sip::cseq(&req.headers)
        .map(|(n, _)| n.to_string())
        .unwrap_or_default()
}

/// The collector's SUBSCRIBE from the seed capture: the live subscription
/// of the agent harness.
const SETUP_SUBSCRIBE: &str = "SUBSCRIBE sip:msr_1@127.0.0.1:5071 SIP/2.0\r\n\
Via: SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bKNpysWDjeT080;rport\r\n\
From: <sip:collector@127.0.0.1:5060>;tag=bbf4107de14a68b5\r\n\
To: <sip:msr_1@127.0.0.1:5071>\r\n\
Call-ID: aa1e44633013d8a2@msr-collector\r\n\
CSeq: 1 SUBSCRIBE\r\n\
Contact: <sip:collector@127.0.0.1:5060>\r\n\
Event: eltex-call-count\r\n\
Accept: application/x-eltex-call-count\r\n\
Expires: 60\r\n\
Max-Forwards: 70\r\n\
Content-Length: 0\r\n\r\n";

#[cfg(test)]
mod tests {
    use super::*;

    /// Every checked-in seed goes through its harness without a panic
    /// (what the fuzzer's first pass does), in a plain `cargo test`.
    #[test]
    fn seeds_pass_their_harness() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
        let targets: [(&str, fn(&[u8])); 8] = [
            ("sip_collector", sip_collector),
            ("sip_redirect", sip_redirect),
            ("sip_agent", sip_agent),
            ("notify_body", notify_body),
            ("agent_config", agent_config),
            ("collector_config", collector_config),
            ("control_line", control_line),
            ("operator_store", operator_store),
        ];
        for (name, target) in targets {
            let dir = root.join(name);
            let mut n = 0;
            for entry in
                std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            {
                let path = entry.expect("entry").path();
                target(&std::fs::read(&path).expect("seed"));
                n += 1;
            }
            assert!(n > 0, "{name}: no seeds");
        }
    }

    #[test]
    fn the_setup_dialog_is_live() {
        // The agent harness's SUBSCRIBE is accepted (otherwise every NOTIFY
        // response seed would miss).
        let msg = parse(SETUP_SUBSCRIBE.as_bytes()).expect("parses");
        assert!(matches!(msg, SipMessage::Request(_)));
        assert!(agent_example()
            .accounts
            .iter()
            .any(|a| a.msr_name == "msr_1"));
    }
}
