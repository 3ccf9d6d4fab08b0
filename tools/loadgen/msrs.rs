//! The fake MSRs of `notify`: each MSR's REGISTER with its digest answer
//! (`sip::digest`), its subscription dialog, its NOTIFYs and the counters;
//! and the links they send on (UDP sockets, or held TCP/TLS connections).
//!
//! Their requests run in the product's client transactions
//! (`sip::transaction`, RFC 3261 §17.1.2: Timer E over UDP, Timer F), one
//! `ClientTransactions` per local socket or connection, since it stamps
//! one `Via` sent-by per instance and a response comes back where its
//! request left. Retransmitted SUBSCRIBEs are told from new ones by the
//! product's server transactions (§17.2.2) and answered again.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{DigestChoice, Transport, USER_AGENT};
use anyhow::Context;
use bytes::Bytes;
use msr_shared::event_package::{LoadReport, CONTENT_TYPE, EVENT};
use msr_shared::sip::digest::{self, Algorithm, Challenge};
use msr_shared::sip::transaction::server::{Received, ServerTransactions};
use msr_shared::sip::transaction::{ClientTransactions, Link, Outcome, StreamTransport, TIMER_F};
use msr_shared::sip::{self, Method, SipMessage, StatusCode};
use tokio::net::UdpSocket;
use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Register,
    Notify,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Setup,
    Measured,
    Drain,
}

/// A client transaction's id: what its end is counted against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Txn {
    kind: Kind,
    msr: usize,
    /// REGISTER: its CSeq; NOTIFY: the MSR's NOTIFY count, which no later
    /// dialog of the MSR repeats (a dialog's CSeq starts again).
    seq: u64,
    sent_at: Instant,
    /// Sent in the measured phase.
    measured: bool,
}

pub(crate) struct Dialog {
    pub(crate) call_id: String,
    /// Our tag (the To-tag of our 200).
    pub(crate) local_tag: String,
    /// The SUBSCRIBE's `From` value (URI and the collector's tag): our NOTIFY's `To`.
    pub(crate) remote_from: String,
    /// Our NOTIFY's `From`: the SUBSCRIBE's `To` URI with our tag.
    pub(crate) from: String,
    /// Where NOTIFYs go (the SUBSCRIBE's Contact URI).
    pub(crate) remote_target: String,
    pub(crate) cseq: u32,
    pub(crate) expires: u32,
    pub(crate) granted_at: Instant,
    /// The first NOTIFY of the dialog was answered 200.
    pub(crate) confirmed: bool,
}

pub(crate) struct Msr {
    pub(crate) name: String,
    pub(crate) sock: usize,
    /// `<sip:name@local>`, local being its socket's or connection's
    /// address: the Contact of its REGISTERs, NOTIFYs and answers.
    pub(crate) contact: String,
    pub(crate) reg_call_id: String,
    pub(crate) reg_from_tag: String,
    pub(crate) reg_cseq: u32,
    pub(crate) reg_expires: u32,
    pub(crate) registered: bool,
    pub(crate) reg_failed: Option<u16>,
    pub(crate) dialog: Option<Dialog>,
    /// Dialogs the collector created for this MSR.
    pub(crate) dialogs: u32,
    pub(crate) notify_seq: u64,
    pub(crate) last_load_sent: Option<u8>,
    /// NOTIFYs of this MSR without a final answer yet.
    pub(crate) in_flight: u32,
}

impl Msr {
    /// MSR `name` on socket or connection `sock`, its Contact `contact`,
    /// not yet registered, registering for `reg_expires` seconds.
    pub(crate) fn new(name: String, sock: usize, contact: String, reg_expires: u32) -> Self {
        Self {
            name,
            sock,
            contact,
            reg_call_id: format!("{}@msr-loadgen", sip::random_token()),
            reg_from_tag: sip::random_token(),
            reg_cseq: 0,
            reg_expires,
            registered: false,
            reg_failed: None,
            dialog: None,
            dialogs: 0,
            notify_seq: 0,
            last_load_sent: None,
            in_flight: 0,
        }
    }
}

#[derive(Default, Debug, Clone)]
pub(crate) struct Counters {
    pub(crate) register_sent: u64,
    pub(crate) register_retx: u64,
    pub(crate) register_401: u64,
    pub(crate) register_423: u64,
    pub(crate) register_ok: u64,
    pub(crate) register_other: BTreeMap<u16, u64>,
    pub(crate) subscribe_initial: u64,
    pub(crate) subscribe_refresh: u64,
    pub(crate) subscribe_unsubscribe: u64,
    pub(crate) subscribe_retransmitted: u64,
    pub(crate) subscribe_rejected: u64,
    pub(crate) other_requests: u64,
    /// OPTIONS keepalives from the collector (SPEC §5), answered 200.
    pub(crate) options_answered: u64,
    pub(crate) parse_errors: u64,
    pub(crate) stray_responses: u64,
}

#[derive(Default, Debug, Clone)]
pub(crate) struct NotifyCounters {
    pub(crate) sent: u64,
    pub(crate) ok: u64,
    pub(crate) non_ok: BTreeMap<u16, u64>,
    /// NOTIFYs retransmitted at least once (counted when they end).
    pub(crate) retransmitted: u64,
    /// Retransmissions in all (counted when their NOTIFY ends).
    pub(crate) retransmissions: u64,
    /// Given up at Timer F, or unanswered when the run ended.
    pub(crate) lost: u64,
    /// Answers to a transaction already answered or given up (late).
    pub(crate) late_answers: u64,
    pub(crate) coalesced: u64,
    /// Send time → final answer, µs.
    pub(crate) latency_us: Vec<u64>,
    pub(crate) last_answer: Option<Instant>,
}

pub(crate) struct State {
    pub(crate) collector: SocketAddr,
    pub(crate) transport: Transport,
    pub(crate) local_addrs: Vec<SocketAddr>,
    pub(crate) auth_name: String,
    pub(crate) password: String,
    pub(crate) digest: DigestChoice,
    pub(crate) max_sub_expires: u32,
    pub(crate) msrs: Vec<Msr>,
    /// The client transactions of each local socket or connection (by
    /// index, as `local_addrs`).
    transactions: Vec<ClientTransactions<Txn>>,
    /// The SUBSCRIBEs received, to answer a retransmission again.
    subscribes: ServerTransactions,
    pub(crate) phase: Phase,
    pub(crate) c: Counters,
    pub(crate) setup: NotifyCounters,
    pub(crate) measured: NotifyCounters,
}

/// What to send: from which socket or connection (index), to where.
pub(crate) type Out = Vec<(usize, SocketAddr, Bytes)>;

/// The load MSR `i` reports in its `seq`-th NOTIFY: varies every time.
pub(crate) fn load_for(i: usize, seq: u64) -> u8 {
    ((seq.wrapping_mul(37) + (i as u64).wrapping_mul(11)) % 101) as u8
}

/// What MSR `name` reports at `load`: the agent's body, its other figures
/// following the load.
pub(crate) fn report(name: &str, load: u8) -> LoadReport {
    LoadReport {
        msr: name.to_owned(),
        load,
        cpu: load / 2,
        calls: u32::from(load) * 80,
        max_calls: 8192,
        ..LoadReport::default()
    }
}

/// The answer to a request in a dialog this MSR does not have (RFC 3261
/// §12.2.2).
fn no_dialog(r: &sip::Request) -> sip::Response {
    sip::response(r, StatusCode::CallTransactionDoesNotExist, None)
}

impl State {
    /// No MSR registered yet; they send from `local_addrs`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        collector: SocketAddr,
        transport: Transport,
        local_addrs: Vec<SocketAddr>,
        auth_name: String,
        password: String,
        digest: DigestChoice,
        max_sub_expires: u32,
        msrs: Vec<Msr>,
    ) -> Self {
        let transactions = local_addrs
            .iter()
            .map(|local| ClientTransactions::new(*local, USER_AGENT))
            .collect();
        Self {
            collector,
            transport,
            local_addrs,
            auth_name,
            password,
            digest,
            max_sub_expires,
            msrs,
            transactions,
            subscribes: ServerTransactions::new(),
            phase: Phase::Setup,
            c: Counters::default(),
            setup: NotifyCounters::default(),
            measured: NotifyCounters::default(),
        }
    }

    pub(crate) fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn counters(&mut self, measured: bool) -> &mut NotifyCounters {
        if measured {
            &mut self.measured
        } else {
            &mut self.setup
        }
    }

    /// How requests leave socket or connection `sock`.
    fn link(&self, sock: usize) -> Link {
        let transport = match self.transport {
            Transport::Udp => return Link::Udp,
            Transport::Tcp => StreamTransport::Tcp,
            Transport::Tls => StreamTransport::Tls,
        };
        Link::Stream {
            transport,
            sent_by: self.local_addrs[sock],
        }
    }

    /// Starts transaction `txn` with `request` from `sock` to the
    /// collector; whether it started (its id is new, its request has a
    /// `CSeq`: both hold by construction).
    fn start(
        &mut self,
        txn: Txn,
        sock: usize,
        request: sip::Request,
        now: Instant,
        out: &mut Out,
    ) -> bool {
        let (to, link) = (self.collector, self.link(sock));
        let Some(t) = self.transactions.get_mut(sock) else {
            return false;
        };
        if t.send_on(now, txn, to, request, TIMER_F, link).is_err() {
            return false;
        }
        while let Some(d) = t.poll_transmit() {
            out.push((sock, d.to, d.bytes));
        }
        true
    }

    /// Sends REGISTER for MSR `i` (first attempt, or the retry answering
    /// `challenge` in `Authorization`, or `Proxy-Authorization` after a
    /// 407) and records it.
    pub(crate) fn send_register(
        &mut self,
        i: usize,
        challenge: Option<(Challenge, &str)>,
        now: Instant,
        out: &mut Out,
    ) {
        let collector = self.collector;
        let ruri = self.transport.uri(None, collector);
        let m = &mut self.msrs[i];
        m.reg_cseq += 1;
        let request = sip::request(
            Method::Register,
            &ruri,
            vec![
                (
                    "From",
                    format!("<sip:{}@{collector}>;tag={}", m.name, m.reg_from_tag),
                ),
                ("To", format!("<sip:{}@{collector}>", m.name)),
                ("Call-ID", m.reg_call_id.clone()),
                ("CSeq", format!("{} REGISTER", m.reg_cseq)),
                ("Contact", format!("{};iface=lo", m.contact)),
                ("Expires", m.reg_expires.to_string()),
            ],
            Vec::new(),
        );
        // The collector's address as a URI always parses.
        let Ok(mut request) = request else {
            m.reg_failed = Some(400);
            return;
        };
        if let Some((challenge, header)) = challenge {
            // The digest's uri is the Request-URI as it is written (RFC
            // 3261 §22.4).
            let value = digest::authorization(
                &challenge,
                &self.auth_name,
                &self.password,
                "REGISTER",
                &request.uri.to_string(),
                1,
                &sip::random_token(),
            );
            sip::push_header(&mut request.headers, header, value);
        }
        let txn = Txn {
            kind: Kind::Register,
            msr: i,
            seq: u64::from(m.reg_cseq),
            sent_at: now,
            measured: false,
        };
        let sock = m.sock;
        if self.start(txn, sock, request, now, out) {
            self.c.register_sent += 1;
        }
    }

    /// Sends the next NOTIFY of MSR `i`'s dialog; `false` without a dialog.
    pub(crate) fn send_notify(&mut self, i: usize, now: Instant, out: &mut Out) -> bool {
        let measured = self.phase == Phase::Measured;
        let sock = self.msrs[i].sock;
        let (to, link) = (self.collector, self.link(sock));
        let m = &mut self.msrs[i];
        let Some(d) = m.dialog.as_mut() else {
            return false;
        };
        m.notify_seq += 1;
        let load = load_for(i, m.notify_seq);
        d.cseq += 1;
        let remaining =
            u64::from(d.expires).saturating_sub(now.duration_since(d.granted_at).as_secs());
        let body = report(&m.name, load).encode();
        let txn = Txn {
            kind: Kind::Notify,
            msr: i,
            seq: m.notify_seq,
            sent_at: now,
            measured,
        };
        // Written as text, not built as a message and encoded: this is
        // the hot path whose rate is measured, and building each NOTIFY as
        // a message and encoding it costs several µs more.
        let encode = |via: &str| {
            Bytes::from(format!(
                "NOTIFY {target} SIP/2.0\r\n\
                 Via: {via}\r\n\
                 Max-Forwards: 70\r\n\
                 From: {from}\r\n\
                 To: {to}\r\n\
                 Call-ID: {call_id}\r\n\
                 CSeq: {cseq} NOTIFY\r\n\
                 Contact: {contact}\r\n\
                 Event: {EVENT}\r\n\
                 Subscription-State: active;expires={remaining}\r\n\
                 User-Agent: {USER_AGENT}\r\n\
                 Content-Type: {CONTENT_TYPE}\r\n\
                 Content-Length: {len}\r\n\r\n{body}",
                target = d.remote_target,
                from = d.from,
                to = d.remote_from,
                call_id = d.call_id,
                cseq = d.cseq,
                contact = m.contact,
                len = body.len(),
            ))
        };
        let Some(t) = self.transactions.get_mut(sock) else {
            return false;
        };
        if t.send_encoded(now, txn, to, link, "NOTIFY", encode)
            .is_err()
        {
            return false;
        }
        while let Some(d) = t.poll_transmit() {
            out.push((sock, d.to, d.bytes));
        }
        let m = &mut self.msrs[i];
        m.last_load_sent = Some(load);
        m.in_flight += 1;
        self.counters(measured).sent += 1;
        true
    }

    pub(crate) fn on_datagram(
        &mut self,
        data: &[u8],
        from: SocketAddr,
        sock: usize,
        out: &mut Out,
    ) {
        let now = Instant::now();
        match SipMessage::try_from(data) {
            Ok(SipMessage::Response(r)) => self.on_response(r, sock, now, out),
            Ok(SipMessage::Request(r)) => self.on_request(&r, from, sock, now, out),
            Err(_) => self.c.parse_errors += 1,
        }
    }

    /// A response came on `sock`, where its request left.
    pub(crate) fn on_response(
        &mut self,
        r: sip::Response,
        sock: usize,
        now: Instant,
        out: &mut Out,
    ) {
        let provisional = r.status_code.code() < 200;
        let Some(t) = self.transactions.get_mut(sock) else {
            return;
        };
        match t.handle_response_counted(now, r) {
            Some((txn, r, retransmissions)) => {
                self.ended(txn, Outcome::Response(r), retransmissions, now, out)
            }
            // A provisional response only slows the retransmissions.
            None if provisional => {}
            None => {
                // A retransmitted request answered twice, or answered
                // after Timer F.
                self.c.stray_responses += 1;
                self.setup.late_answers += 1;
            }
        }
    }

    /// Transaction `txn` ended with `outcome` after `retransmissions`.
    fn ended(
        &mut self,
        txn: Txn,
        outcome: Outcome,
        retransmissions: u32,
        now: Instant,
        out: &mut Out,
    ) {
        let retransmissions = u64::from(retransmissions);
        match txn.kind {
            Kind::Register => {
                self.c.register_retx += retransmissions;
                match outcome {
                    Outcome::Response(r) => self.on_register_response(txn.msr, &r, now, out),
                    Outcome::TimedOut => self.msrs[txn.msr].reg_failed = Some(408),
                }
            }
            Kind::Notify => {
                let m = &mut self.msrs[txn.msr];
                m.in_flight = m.in_flight.saturating_sub(1);
                let code = match &outcome {
                    Outcome::Response(r) => Some(r.status_code.code()),
                    Outcome::TimedOut => None,
                };
                if code == Some(200) {
                    if let (Some(d), Outcome::Response(r)) = (m.dialog.as_mut(), &outcome) {
                        if sip::call_id(&r.headers) == Some(d.call_id.as_str()) {
                            d.confirmed = true;
                        }
                    }
                }
                let c = self.counters(txn.measured);
                c.retransmissions += retransmissions;
                if retransmissions > 0 {
                    c.retransmitted += 1;
                }
                match code {
                    None => c.lost += 1,
                    Some(code) => {
                        if code == 200 {
                            c.ok += 1;
                        } else {
                            *c.non_ok.entry(code).or_default() += 1;
                        }
                        c.latency_us
                            .push(now.duration_since(txn.sent_at).as_micros() as u64);
                        c.last_answer = Some(now);
                    }
                }
            }
        }
    }

    pub(crate) fn on_register_response(
        &mut self,
        i: usize,
        r: &sip::Response,
        now: Instant,
        out: &mut Out,
    ) {
        let code = r.status_code.code();
        match code {
            200..=299 => {
                self.c.register_ok += 1;
                self.msrs[i].registered = true;
            }
            401 | 407 if self.msrs[i].reg_cseq < 6 => {
                self.c.register_401 += 1;
                // RFC 3261 §22.3: a proxy's challenge is answered in
                // Proxy-Authorization.
                let (challenges, answer) = if code == 401 {
                    ("WWW-Authenticate", "Authorization")
                } else {
                    ("Proxy-Authenticate", "Proxy-Authorization")
                };
                match self.challenge(&sip::header_all(&r.headers, challenges)) {
                    Some(ch) => self.send_register(i, Some((ch, answer)), now, out),
                    None => self.msrs[i].reg_failed = Some(code),
                }
            }
            423 if self.msrs[i].reg_cseq < 6 => {
                self.c.register_423 += 1;
                match sip::header(&r.headers, "Min-Expires").and_then(|v| v.parse::<u32>().ok()) {
                    Some(min) => {
                        self.msrs[i].reg_expires = min;
                        self.send_register(i, None, now, out);
                    }
                    None => self.msrs[i].reg_failed = Some(code),
                }
            }
            _ => {
                *self.c.register_other.entry(code).or_default() += 1;
                self.msrs[i].reg_failed = Some(code);
            }
        }
    }

    /// The first of `challenges` this run answers (`--digest`).
    fn challenge(&self, challenges: &[&str]) -> Option<Challenge> {
        challenges
            .iter()
            .filter_map(|value| Challenge::parse(value))
            .find(|ch| match self.digest {
                DigestChoice::First => true,
                DigestChoice::Md5 => ch.algorithm == Algorithm::Md5,
                DigestChoice::Sha256 => ch.algorithm == Algorithm::Sha256,
            })
    }

    pub(crate) fn on_request(
        &mut self,
        r: &sip::Request,
        from: SocketAddr,
        sock: usize,
        now: Instant,
        out: &mut Out,
    ) {
        match r.method {
            // An ACK is never answered (RFC 3261 §17.2.1); none is expected.
            Method::Ack => {}
            Method::Subscribe => self.on_subscribe(r, from, sock, now, out),
            _ => {
                self.c.other_requests += 1;
                let status = if r.method == Method::Options {
                    self.c.options_answered += 1;
                    StatusCode::OK
                } else {
                    StatusCode::MethodNotAllowed
                };
                let tag = sip::random_token();
                let response = sip::response(r, status, Some(&tag));
                out.push((sock, from, sip::wire::encode_response(response, USER_AGENT)));
            }
        }
    }

    /// A SUBSCRIBE: a retransmission gets the answer already sent (RFC
    /// 3261 §17.2.2), a new one its answer (and the dialog's first NOTIFY).
    fn on_subscribe(
        &mut self,
        r: &sip::Request,
        from: SocketAddr,
        sock: usize,
        now: Instant,
        out: &mut Out,
    ) {
        let key = match self.subscribes.handle_request(now, r) {
            Some(Received::New(key)) => key,
            Some(Received::Answer(bytes)) => {
                self.c.subscribe_retransmitted += 1;
                out.push((sock, from, bytes));
                return;
            }
            // Not reached: every SUBSCRIBE is answered as it arrives.
            Some(Received::Absorbed) => {
                self.c.subscribe_retransmitted += 1;
                return;
            }
            // No Via or CSeq: no response can be built.
            None => {
                self.c.parse_errors += 1;
                return;
            }
        };
        let (response, first_notify) = self.answer_subscribe(r, now);
        let bytes = sip::wire::encode_response(response, USER_AGENT);
        let reliable = self.transport.is_stream();
        self.subscribes
            .handle_response(now, &key, bytes.clone(), true, reliable);
        out.push((sock, from, bytes));
        if let Some(i) = first_notify {
            self.send_notify(i, now, out);
        }
    }

    /// The answer to a new SUBSCRIBE, and the MSR whose dialog it created
    /// (its first NOTIFY is due, RFC 6665 §4.2.2).
    fn answer_subscribe(
        &mut self,
        r: &sip::Request,
        now: Instant,
    ) -> (sip::Response, Option<usize>) {
        let user = sip::uri_user(&r.uri.to_string())
            .map(str::to_owned)
            .unwrap_or_default();
        let index = user
            .strip_prefix("msr_lg_")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|i| *i < self.msrs.len());
        let new_tag = sip::random_token();
        let Some(i) = index else {
            self.c.subscribe_rejected += 1;
            return (sip::response(r, StatusCode::NotFound, Some(&new_tag)), None);
        };
        if sip::event_package(&r.headers).as_deref() != Some(EVENT) {
            self.c.subscribe_rejected += 1;
            let mut response = sip::response(r, StatusCode::BadEvent, Some(&new_tag));
            sip::push_header(&mut response.headers, "Allow-Events", EVENT);
            return (response, None);
        }
        let call_id = sip::call_id(&r.headers).unwrap_or_default().to_owned();
        let to = sip::header(&r.headers, "To").unwrap_or_default().to_owned();
        let requested = sip::expires(&r.headers).unwrap_or(60);
        let granted = requested.min(self.max_sub_expires);
        let contact = self.msrs[i].contact.clone();
        let remote_target = sip::header(&r.headers, "Contact")
            .map(|c| sip::addr_uri(c).to_owned())
            .unwrap_or_else(|| format!("sip:{}", self.collector));
        let m = &mut self.msrs[i];
        let same_dialog = m.dialog.as_ref().is_some_and(|d| d.call_id == call_id);
        let mut first_notify = None;
        let our_tag = match (sip::tag(&to), same_dialog) {
            (None, _) => {
                self.c.subscribe_initial += 1;
                m.dialogs += 1;
                m.dialog = Some(Dialog {
                    call_id,
                    local_tag: new_tag.clone(),
                    remote_from: sip::header(&r.headers, "From")
                        .unwrap_or_default()
                        .to_owned(),
                    from: format!("<{}>;tag={new_tag}", sip::addr_uri(&to)),
                    remote_target,
                    cseq: 0,
                    expires: granted,
                    granted_at: now,
                    confirmed: false,
                });
                first_notify = (granted > 0).then_some(i);
                new_tag
            }
            (Some(t), true) => match m.dialog.as_mut().filter(|d| d.local_tag == t) {
                Some(d) if granted == 0 => {
                    self.c.subscribe_unsubscribe += 1;
                    let tag = d.local_tag.clone();
                    m.dialog = None;
                    tag
                }
                Some(d) => {
                    self.c.subscribe_refresh += 1;
                    d.expires = granted;
                    d.granted_at = now;
                    d.local_tag.clone()
                }
                None => {
                    self.c.subscribe_rejected += 1;
                    return (no_dialog(r), None);
                }
            },
            (Some(_), false) => {
                self.c.subscribe_rejected += 1;
                return (no_dialog(r), None);
            }
        };
        let mut response = sip::response(r, StatusCode::OK, Some(&our_tag));
        sip::push_header(&mut response.headers, "Expires", granted.to_string());
        sip::push_header(&mut response.headers, "Contact", contact);
        (response, first_notify)
    }

    /// Retransmits what is due (Timer E) and gives up what has waited for
    /// Timer F; forgets the SUBSCRIBEs answered long enough ago (Timer J).
    pub(crate) fn handle_timeout(&mut self, now: Instant, out: &mut Out) {
        self.subscribes.handle_timeout(now);
        for sock in 0..self.transactions.len() {
            let t = &mut self.transactions[sock];
            if t.poll_timeout().is_none_or(|at| at > now) {
                continue;
            }
            t.handle_timeout(now);
            while let Some(d) = t.poll_transmit() {
                out.push((sock, d.to, d.bytes));
            }
            let ended: Vec<_> = std::iter::from_fn(|| t.poll_outcome_counted()).collect();
            for (txn, outcome, retransmissions) in ended {
                self.ended(txn, outcome, retransmissions, now, out);
            }
        }
    }

    /// The run is over: every transaction still in flight is given up, as
    /// at its Timer F (each ends at most [`TIMER_F`] after it started).
    pub(crate) fn give_up(&mut self, now: Instant) {
        self.handle_timeout(now + TIMER_F, &mut Vec::new());
    }

    /// NOTIFYs without a final answer.
    pub(crate) fn notifies_in_flight(&self) -> u64 {
        self.msrs.iter().map(|m| u64::from(m.in_flight)).sum()
    }
}

/// Where the MSRs' messages leave: UDP sockets shared by the MSRs, or one
/// connection per MSR (its writer task's queue).
pub(crate) enum Links {
    Udp(Vec<Arc<UdpSocket>>),
    Stream(Vec<tokio::sync::mpsc::UnboundedSender<Bytes>>),
}

impl Links {
    pub(crate) async fn flush(&self, out: Out) {
        for (sock, to, bytes) in out {
            match self {
                // A full socket buffer shows up as a retransmission later.
                Links::Udp(socks) => {
                    let _ = socks[sock].send_to(&bytes, to).await;
                }
                // A closed connection shows up as a NOTIFY lost at Timer F.
                Links::Stream(queues) => {
                    let _ = queues[sock].send(bytes);
                }
            }
        }
    }
}

/// A connection to the collector: plain TCP, or TLS over it.
pub(crate) trait Connection:
    tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static
{
}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> Connection for T {}

/// Opens `n` connections to `collector` (TLS verified by `ca` when given),
/// at most 32 handshakes at a time: the collector bounds its own
/// concurrent handshakes, and a flood of them is not what is measured.
pub(crate) async fn connect_all(
    collector: SocketAddr,
    n: usize,
    ca: Option<&std::path::Path>,
) -> anyhow::Result<Vec<(SocketAddr, Box<dyn Connection>)>> {
    let connector = ca.map(system_tests::pki::connector).transpose()?;
    let name = rustls::pki_types::ServerName::IpAddress(collector.ip().into());
    let gate = Arc::new(tokio::sync::Semaphore::new(32));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let (gate, connector, name) = (gate.clone(), connector.clone(), name.clone());
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await?;
            let tcp = tokio::net::TcpStream::connect(collector)
                .await
                .with_context(|| format!("connect to {collector}"))?;
            tcp.set_nodelay(true)?;
            let local = tcp.local_addr()?;
            let stream: Box<dyn Connection> = match connector {
                Some(c) => Box::new(
                    c.connect(name, tcp)
                        .await
                        .with_context(|| format!("tls handshake with {collector}"))?,
                ),
                None => Box::new(tcp),
            };
            anyhow::Ok((i, local, stream))
        });
    }
    let mut out: Vec<Option<(SocketAddr, Box<dyn Connection>)>> = (0..n).map(|_| None).collect();
    while let Some(done) = tasks.join_next().await {
        let (i, local, stream) = done??;
        out[i] = Some((local, stream));
    }
    Ok(out.into_iter().flatten().collect())
}

/// Runs connection `idx`: writes what its queue gets, splits what it reads
/// into messages (RFC 3261 §18.3) and feeds them to the state; answers a
/// keepalive ping with a pong (RFC 5626 §3.5.1).
pub(crate) fn spawn_connection(
    idx: usize,
    peer: SocketAddr,
    stream: Box<dyn Connection>,
    mut queue: tokio::sync::mpsc::UnboundedReceiver<Bytes>,
    state: Arc<Mutex<State>>,
    links: Arc<Links>,
    stop: tokio_util::sync::CancellationToken,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut reader, mut writer) = tokio::io::split(stream);
    let writer_stop = stop.clone();
    tokio::spawn(async move {
        loop {
            let bytes = tokio::select! {
                () = writer_stop.cancelled() => break,
                b = queue.recv() => match b { Some(b) => b, None => break },
            };
            if writer.write_all(&bytes).await.is_err() {
                break;
            }
        }
    });
    tokio::spawn(async move {
        let mut framer = sip::wire::StreamFramer::new();
        let mut buf = vec![0u8; 65_536];
        loop {
            let n = tokio::select! {
                () = stop.cancelled() => break,
                r = reader.read(&mut buf) => match r { Ok(0) | Err(_) => break, Ok(n) => n },
            };
            framer.push(&buf[..n]);
            let mut out = Vec::new();
            loop {
                match framer.next_frame() {
                    Ok(Some(sip::wire::Frame::Message(m))) => {
                        State::lock(&state).on_datagram(&m, peer, idx, &mut out);
                    }
                    Ok(Some(sip::wire::Frame::Ping)) => {
                        out.push((idx, peer, Bytes::from_static(b"\r\n")));
                    }
                    Ok(None) => break,
                    Err(e) => {
                        eprintln!("connection {idx}: {e}; closing it");
                        return;
                    }
                }
            }
            links.flush(out).await;
        }
    });
}
